"""minirt.ray and device choice by UUID: parsing and matching against faked device lists, CUDA_VISIBLE_DEVICES and
NVML output (indices, UUIDs, the GPU- prefix, no match); lavapipe opened by its UUID; the Transcriber and Runner in
one process against WhisperModel and float64 numpy; and Ray Data pipelines on a local Ray cluster (two actors on
lavapipe): every clip gives one row, equal to a single process's transcript, also when an actor dies mid-batch.
The Ray tests are skipped when ray is not installed (pip install 'minirt[ray]')."""
from __future__ import annotations

import dataclasses
import json
import os
import wave
from pathlib import Path

import numpy as np
import pytest

from minirt import DeviceError, Session
from minirt.device_profile import DeviceProfile, format_uuid
from minirt.ray import Runner, Transcriber, assigned_device, parse_nvidia_smi
from minirt.vk.device import choose, parse_device
from oracle import make_model, rand

ROOT = Path(__file__).resolve().parents[1]
U0 = "5b3f0c2e-1d4a-4e8b-9c7d-0a1b2c3d4e5f"
U1 = "5b3f9999-aaaa-bbbb-cccc-ddddeeeeffff"
U2 = "0badc0de-0000-1111-2222-333344445555"


def fake_devices():
    """[(index, physical device, profile)] as physical_devices() gives them: two NVIDIA GPUs and lavapipe (no UUID)."""
    gpu = DeviceProfile(name="NVIDIA H200", vendor="nvidia", device_type="discrete")
    return [(0, None, dataclasses.replace(gpu, uuid=U0)), (1, None, dataclasses.replace(gpu, uuid=U1)),
            (2, None, DeviceProfile(name="llvmpipe", vendor="llvmpipe", device_type="cpu"))]


# -- parsing and matching ---------------------------------------------------------------------------------------------

def test_parse_device():
    assert parse_device(None) is None and parse_device("") is None and parse_device("  ") is None
    assert parse_device(3) == 3 and parse_device("3") == 3 and parse_device(" 12 ") == 12
    hex0 = U0.replace("-", "")
    for spec in (U0, U0.upper(), "GPU-" + U0, "gpu-" + U0.upper(), hex0, "GPU-" + hex0):
        assert parse_device(spec) == hex0, spec
    assert parse_device("GPU-5b3f") == "5b3f" and parse_device("5b3f0c2e") == "5b3f0c2e"
    assert parse_device("GPU-12") == "12"             # digits alone are an index; with the prefix, a UUID's start
    for bad in ("gpu", "GPU-", "cpu0", U0 + "00", "GPU-xyz", -1, 1.5, True, [0]):
        with pytest.raises(ValueError):
            parse_device(bad)
    with pytest.raises(ValueError, match="MIG"):
        parse_device("MIG-" + U0)
    assert format_uuid(bytes.fromhex(U0.replace("-", ""))) == U0 and format_uuid(bytes(16)) == ""


def test_choose_by_index_and_uuid(monkeypatch):
    devs = fake_devices()
    monkeypatch.delenv("MINIRT_DEVICE", raising=False)
    assert choose(devs)[0] == 0                                    # the best GPU, the first of equals
    for spec, index in ((1, 1), ("2", 2), (U1, 1), ("GPU-" + U1.upper(), 1), ("GPU-5b3f0", 0), ("5b3f9", 1)):
        assert choose(devs, spec)[0] == index, spec
    with pytest.raises(DeviceError, match="more than one") as e:
        choose(devs, "GPU-5b3f")                                    # both GPUs' UUIDs start so
    assert U0 in str(e.value) and U1 in str(e.value)
    with pytest.raises(DeviceError) as e:
        choose(devs, "GPU-" + U2)
    msg = str(e.value)                                              # names the spec, lists every device's UUID
    assert U2 in msg and "matches no Vulkan device" in msg and U0 in msg and U1 in msg and "llvmpipe: no UUID" in msg
    with pytest.raises(DeviceError, match="only devices 0..2 exist"):
        choose(devs, 7)
    monkeypatch.setenv("MINIRT_DEVICE", "GPU-" + U1)
    assert choose(devs)[0] == 1
    monkeypatch.setenv("MINIRT_DEVICE", "GPU-" + U2)
    with pytest.raises(DeviceError, match=f"MINIRT_DEVICE=GPU-{U2} matches no"):
        choose(devs)
    monkeypatch.setenv("MINIRT_DEVICE", "gpu")
    with pytest.raises(DeviceError, match="MINIRT_DEVICE=gpu is not a device index or UUID"):
        choose(devs)


def test_the_gpu_ray_assigned():
    def nvml():
        return {0: "GPU-" + U0, 1: "GPU-" + U1}

    def assigned(environ, gpu_ids=(), nvml=nvml, resources=None):
        return assigned_device(environ.get("CUDA_VISIBLE_DEVICES", ""), list(gpu_ids), nvml=nvml,
                               resources=resources or {})

    assert parse_nvidia_smi(f"0, GPU-{U0}\n1, GPU-{U1}\n") == nvml()
    # CUDA_VISIBLE_DEVICES with UUIDs (a node started with them) is used as it is; NVML is not asked
    assert assigned({"CUDA_VISIBLE_DEVICES": f"GPU-{U1}"}, nvml=None) == "GPU-" + U1
    assert assigned({"CUDA_VISIBLE_DEVICES": f"{U1},{U0}"}, nvml=None) == "GPU-" + U1
    # indices go through NVML; the first GPU of several is the actor's
    assert assigned({"CUDA_VISIBLE_DEVICES": "1,0"}, ["1", "0"]) == "GPU-" + U1
    assert choose(fake_devices(), assigned({"CUDA_VISIBLE_DEVICES": "1"}, ["1"]))[0] == 1
    # a custom resource vk<N> names device N, before anything else
    assert assigned({"CUDA_VISIBLE_DEVICES": "1"}, ["1"], resources={"CPU": 1.0, "vk2": 1.0}) == 2
    assert assigned({}, resources={"vkx": 1.0, "gpu_vk1": 1.0}) is None
    # no GPU assigned: minirt's own default (None)
    assert assigned({}) is None and assigned({"CUDA_VISIBLE_DEVICES": ""}) is None
    assert assigned({"CUDA_VISIBLE_DEVICES": "-1"}) is None               # CUDA's "no GPU"
    with pytest.raises(DeviceError, match="without NVML .* custom resource"):
        assigned({"CUDA_VISIBLE_DEVICES": "1"}, ["1"], nvml=lambda: None)
    with pytest.raises(DeviceError, match="names GPU 5, but NVML lists 0: GPU-"):
        assigned({"CUDA_VISIBLE_DEVICES": "5"}, ["5"])
    with pytest.raises(DeviceError, match="set no CUDA_VISIBLE_DEVICES .* custom resource"):
        assigned({}, ["0"])                                          # a GPU of another vendor
    with pytest.raises(DeviceError, match="MIG instance"):
        assigned({"CUDA_VISIBLE_DEVICES": "MIG-" + U0}, ["0"])
    with pytest.raises(DeviceError, match=f"GPU-{U2}' matches no Vulkan device"):
        choose(fake_devices(), assigned({"CUDA_VISIBLE_DEVICES": f"GPU-{U2}"}, ["0"], nvml=None))


def small_model(dynamic):
    from onnx import helper
    return make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                      {"x": ["n" if dynamic else 3, 16]}, ["y"], {"w": rand(16, 8, seed=1)})


def reference(x):
    return np.maximum(np.asarray(x, np.float64) @ rand(16, 8, seed=1).astype(np.float64), 0)


def test_lavapipe_by_its_uuid():
    from minirt.session import get_device
    from minirt.vk.device import physical_devices
    devs = physical_devices()
    index, _, profile = choose(devs)
    if not profile.uuid:
        pytest.skip(f"{profile.name} reports no device UUID")
    x = rand(3, 16, seed=2)
    for spec in (profile.uuid, "GPU-" + profile.uuid.upper(), "GPU-" + profile.uuid[:13]):
        with Session(small_model(False), device=spec) as s:
            assert s.device is get_device(index) and s.device.profile.uuid == profile.uuid
            np.testing.assert_allclose(s.run(x), reference(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(DeviceError, match=f"matches no Vulkan device's UUID .*{profile.uuid}"):
        Session(small_model(False), device="GPU-" + ("f" if profile.uuid[0] != "f" else "e") * 32)


def test_runner_stacks_rows_of_a_dynamic_batch_and_runs_others_row_by_row():
    x = rand(5, 16, seed=3)
    r = Runner(small_model(True))
    assert r.stacked
    out = r({"x": x, "id": np.arange(5)})
    assert sorted(out) == ["id", "y"] and list(out["id"]) == list(range(5))
    np.testing.assert_allclose(out["y"], reference(x), rtol=1e-5, atol=1e-5)
    rows = [rand(3, 16, seed=10 + i) for i in range(2)]
    r = Runner(small_model(False), precision="fp32", options={"poison": True})
    assert not r.stacked
    out = r({"x": np.stack(rows)})
    assert out["y"].shape == (2, 3, 8)
    for y, x in zip(out["y"], rows):
        np.testing.assert_allclose(y, reference(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="needs a column 'x'; the batch has z"):
        r({"z": np.stack(rows)})


# -- Whisper: one process, then Ray ------------------------------------------------------------------------------------

# A Whisper of tiny's shape but narrow: 1500 audio positions (30 s windows), d_model 64; random weights. What it
# transcribes is noise, but the same noise in every process.
CFG = {"d_model": 4, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
       "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 1, "decoder_attention_heads": 1,
       "vocab_size": 1765}
# greedy, at most 12 tokens a window, no temperature fallback: a few decode steps per clip
OPTIONS = {"beam_size": 1, "temperature": 0.0, "max_new_tokens": 12, "condition_on_previous_text": False}
CLIPS = 4


def write_wav(path, samples):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """(model folder, [clip paths], {path: the single-process transcript row})."""
    from minirt.whisper.model import WhisperModel
    from minirt.whisper.synthetic import write_folder
    tmp = tmp_path_factory.mktemp("ray")
    folder = write_folder(tmp / "model", CFG, seed=0)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(CLIPS):
        t = np.arange(int(16000 * (0.5 + 0.25 * i))) / 16000
        samples = 0.3 * np.sin(2 * np.pi * (200 + 90 * i) * t) + 0.05 * rng.standard_normal(len(t))
        paths.append(str(tmp / f"clip{i}.wav"))
        write_wav(paths[-1], samples)
    model = WhisperModel(folder)
    want = {}
    for p in paths:
        segments, info = model.transcribe(p, **OPTIONS)
        segments = list(segments)
        want[p] = {"text": "".join(s.text for s in segments).strip(), "language": info.language,
                   "duration": info.duration,
                   "segments": [{"id": s.id, "start": s.start, "end": s.end, "text": s.text, "tokens": list(s.tokens)}
                                for s in segments]}
    return folder, paths, want, model


def as_row(r):
    return {"text": r["text"], "language": r["language"], "duration": float(r["duration"]),
            "segments": json.loads(r["segments"])}


def test_transcriber_in_one_process(corpus):
    """Paths, samples and a file's bytes give the transcript WhisperModel gives; other columns pass through."""
    from minirt.whisper.audio_input import load_audio
    folder, paths, want, model = corpus
    t = Transcriber(model, **OPTIONS)
    out = t({"audio": np.array(paths[:2]), "id": np.array([7, 8])})
    assert list(out["audio"]) == paths[:2] and list(out["id"]) == [7, 8]
    assert [as_row({k: v[i] for k, v in out.items()}) for i in range(2)] == [want[p] for p in paths[:2]]
    arrays = np.empty(2, dtype=object)
    arrays[0], arrays[1] = load_audio(paths[2]), load_audio(paths[3])
    out = t({"audio": arrays})
    assert "audio" not in out and [as_row({k: v[i] for k, v in out.items()}) for i in range(2)] == \
        [want[p] for p in paths[2:4]]
    out = t({"audio": np.array([Path(paths[0]).read_bytes()], dtype=object)})
    assert as_row({k: v[0] for k, v in out.items()}) == want[paths[0]]
    assert any(w["segments"] for w in want.values())        # something was decoded


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster of 4 logical CPUs, no GPUs and one device resource (vk0), its workers importing this
    checkout and the tests."""
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'minirt[ray]' (tools/setup.sh does)")
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_USAGE_STATS_ENABLED")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")] +
                                               ([saved["PYTHONPATH"]] if saved["PYTHONPATH"] else []))
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    try:
        ray.init(num_cpus=4, num_gpus=0, resources={"vk0": 1}, include_dashboard=False,
                 object_store_memory=96 << 20, log_to_driver=False, logging_level="ERROR")
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield ray
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class Reporting(Transcriber):
    """A Transcriber that adds the device it was given and the UUID of the Vulkan device its model runs on, and whose
    actor dies in the middle of a batch (after its first row) once in the whole cluster: the first to remove `flag`
    exits, after leaving `flag`.crashed behind."""

    def __init__(self, model, flag, **opts):
        super().__init__(model, **opts)
        self.flag = flag

    def transcribe(self, audio):
        row = super().transcribe(audio)
        try:
            os.unlink(self.flag)
        except FileNotFoundError:
            return row
        Path(self.flag + ".crashed").write_text(str(os.getpid()))
        os._exit(1)

    def __call__(self, batch):
        out = super().__call__(batch)
        out["vulkan_uuid"] = np.array([self.model.backend.program.device.profile.uuid] * len(out["text"]))
        out["device"] = np.array([self.device] * len(out["text"]))     # as assigned_device resolved it
        return out


class DeviceRunner(Runner):
    """A Runner that adds the device it was given."""

    def __call__(self, batch):
        out = super().__call__(batch)
        out["device"] = np.full(len(out["y"]), self.device)
        return out


def test_ray_data_pipelines(corpus, ray_cluster, tmp_path):
    """Transcriber: two actors, each told its GPU by UUID in CUDA_VISIBLE_DEVICES as Ray tells an actor on an NVIDIA
    node (here lavapipe's UUID, set through the actors' runtime environment: Ray sets nothing without GPUs), two clips
    a batch. One actor dies mid-batch; Ray restarts it and retries its batch (Ray Data's default for actor pools:
    max_restarts=-1, max_task_retries=-1). Every clip gives one row, the transcript one process gives.
    Runner: an actor given the custom resource vk0 runs on device 0, rows stacked into batches. (One test: one Ray
    cluster per test process.)"""
    ray = ray_cluster
    folder, paths, want, model = corpus
    uuid = model.backend.program.device.profile.uuid
    if not uuid:
        pytest.skip("the Vulkan device reports no UUID")
    flag = tmp_path / "crash"
    flag.write_text("")
    ds = ray.data.from_items([{"audio": p} for p in paths])
    ds = ds.map_batches(Reporting, fn_constructor_args=(str(folder),),
                        fn_constructor_kwargs={"flag": str(flag), **OPTIONS}, batch_size=2,
                        compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, num_gpus=0,
                        runtime_env={"env_vars": {"CUDA_VISIBLE_DEVICES": "GPU-" + uuid}})
    rows = ds.take_all()
    assert not flag.exists() and Path(str(flag) + ".crashed").exists()    # an actor did die
    assert sorted(r["audio"] for r in rows) == sorted(paths)               # each clip exactly once
    for r in rows:
        assert as_row(r) == want[r["audio"]], r["audio"]
    assert {r["vulkan_uuid"] for r in rows} == {uuid} and {r["device"] for r in rows} == {"GPU-" + uuid}
    # the custom-resource way (drivers without NVML): the actor given resource vk0 opens device 0
    xs = [rand(16, seed=20 + i) for i in range(6)]
    ds = ray.data.from_items([{"x": x, "id": i} for i, x in enumerate(xs)])
    ds = ds.map_batches(DeviceRunner, fn_constructor_args=(small_model(True).SerializeToString(),), batch_size=3,
                        compute=ray.data.ActorPoolStrategy(size=1), num_cpus=1, resources={"vk0": 1})
    rows = ds.take_all()
    assert sorted(r["id"] for r in rows) == list(range(6)) and {r["device"] for r in rows} == {0}
    for r in rows:
        np.testing.assert_allclose(r["y"], reference(xs[r["id"]]), rtol=1e-5, atol=1e-5)
