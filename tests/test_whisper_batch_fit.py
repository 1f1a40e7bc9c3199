"""A Whisper batch fitted to the device's limits (minirt.whisper.vulkan.fit_batch, plan_batch): on a profile whose
maxStorageBufferRange cannot hold the encoder's activations for the whole batch, bencode takes a chunk of the windows
a run and says so in the plan; one that cannot hold the batch's state holds fewer sequences; transcribe_batch under
such a limit gives the tokens of transcribe() file by file (the large-v3 shapes on the phone profiles:
tests/test_split_wide_tables.py)."""
import dataclasses

import numpy as np
import pytest

from test_whisper_batch import CFG, clips
from test_whisper_vulkan import N_AUDIO, N_MELS, small_whisper


def _profile(**limits):
    from minirt.device_profile import KNOWN_PROFILES
    return dataclasses.replace(KNOWN_PROFILES["lavapipe"], **limits)


def test_the_batch_plan_chunks_the_encoder_where_its_activations_do_not_fit():
    from minirt.planner.memory_plan import per_item
    from minirt.whisper.vulkan import plan_batch, plan_program
    w, cfg = small_whisper(max_target_positions=16)        # state of 24 audio and 16 text rows a sequence
    program = plan_program(w, cfg, _profile(), 2)
    big, window, _ = per_item(program["encode"], _profile())
    assert window == big.nbytes and big.shape[0] == 1
    profile = _profile(max_storage_buffer_range=3 * window + window // 2)
    plans = plan_batch(w, cfg, profile, 8, None, program)
    enc = plans["bencode"]
    assert enc.tensors["input_features"].shape == (3, N_MELS, 2 * N_AUDIO) and enc.params == ["row0"]
    assert enc.tensors["bcross_k.0"].shape == (8, N_AUDIO, 64) == plans["bstep8"].tensors["bcross_k.0"].shape
    # each key and value projection goes into the batch's state through a row copy at the chunk's first row
    writes = [d for d in enc.dispatches if d.kernel.startswith("copy_rows") and d.node.startswith("bcross_")]
    assert len(writes) == 4 and all(enc.root(d.args[0][0]).startswith("bcross_") for d in writes)
    note = " ".join(enc.notes["batch"])
    assert "on 3 of the batch's 8 windows" in note and "maxStorageBufferRange" in note and big.name in note
    assert max(t.nbytes for t in enc.tensors.values() if t.storage == "buffer") <= profile.max_storage_buffer_range
    # a chunk of 3 has the encoder entry points of 1 and 2 windows below it, writing at the chunk's row as it does
    assert [plans[f"bencode{k}"].tensors["input_features"].shape[0] for k in (1, 2)] == [1, 2]
    assert plans["bencode1"].params == ["row0"] and "bencode3" not in plans
    assert "bencode1, bencode2, beside bencode's 3" in note
    # within the limit the plan is the unchunked one, its note naming only the smaller encoder entry points
    whole = plan_batch(w, cfg, _profile(), 8, None, program)["bencode"]
    assert whole.tensors["input_features"].shape[0] == 8 and not whole.params
    assert whole.notes["batch"] == ["encoder entry points for fewer windows (a run takes the smallest that holds "
                                    "them): bencode1, bencode2, bencode4, beside bencode's 8; they share bencode's "
                                    "activation memory"]


def test_the_encoder_ladder_keeps_the_entry_points_with_bencodes_kernels():
    """On an H200's profile the planner splits the K of fp32 GEMMs that 1 or 2 windows leave too few work groups
    (bencode's 8 windows fill the GPU unsplit): a window's keys and values would round differently there, so those
    encoder entry points are not made and the note says so; at fp16 these shapes keep every one."""
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.whisper.vulkan import plan_batch
    w, cfg = small_whisper(max_target_positions=16)
    h200 = KNOWN_PROFILES["nvidia-h200"]
    plans = plan_batch(w, cfg, h200, 8, {"precision": "fp32"})
    assert sorted(k for k in plans if k.startswith("bencode")) == ["bencode", "bencode4"]
    note = " ".join(plans["bencode"].notes["batch"])
    assert "bencode4, beside bencode's 8" in note and "not made for 1, 2 windows" in note
    splits = {d.kernel for d in plans["bencode4"].dispatches if "reduce" in d.kernel}
    assert not splits
    plans = plan_batch(w, cfg, h200, 8, {"precision": "fp16"})
    assert sorted(k for k in plans if k.startswith("bencode")) == ["bencode", "bencode1", "bencode2", "bencode4"]


def test_the_batch_holds_fewer_sequences_where_their_state_does_not_fit():
    from minirt.whisper.vulkan import plan_batch, plan_program
    w, cfg = small_whisper()                # a sequence's self-attention cache [448, 64]: 112 KiB a tensor
    program = plan_program(w, cfg, _profile(), 2)
    plans = plan_batch(w, cfg, _profile(max_storage_buffer_range=5 * 448 * 64 * 4), 8, None, program)
    assert sorted(k for k in plans if k.startswith("bstep") and "_" not in k) == ["bstep1", "bstep2", "bstep4",
                                                                                   "bstep5"]
    assert plans["bstep5"].tensors["bself_k.0"].shape == (5, 448, 64)
    assert plans["bencode"].tensors["input_features"].shape[0] == 5
    assert "a batch of 5 sequences, not 8" in " ".join(plans["bencode"].notes["batch"])


@pytest.fixture()
def narrow_device(monkeypatch):
    """The real device, its profile's maxStorageBufferRange set by the test (the planner reads the profile)."""
    from minirt.session import get_device
    dev = get_device()

    def limit(nbytes):
        monkeypatch.setattr(dev, "profile", dataclasses.replace(dev.profile, max_storage_buffer_range=int(nbytes)))
    return limit


def test_transcribe_batch_in_encoder_chunks_equals_transcribe(tmp_path, narrow_device):
    """Four files (windows of several files in one batch) on a device whose range holds the encoder's activations
    for two windows: bencode runs two chunks a batch, and every file's tokens are transcribe()'s; `minirt plan
    --items` shows that plan and its note."""
    from minirt.planner.memory_plan import per_item
    from minirt.whisper import WhisperModel
    from minirt.whisper.synthetic import write_folder
    model = WhisperModel(write_folder(tmp_path / "model", CFG, seed=0), max_batch_items=4)
    _, window, _ = per_item(model.backend.plans["encode"], model.backend.program.device.profile)
    narrow_device(2.5 * window)
    audio = clips(4)
    options = dict(beam_size=1, temperature=0.0, max_new_tokens=20, condition_on_previous_text=False)
    got = model.transcribe_batch(audio, batch_size=4, **options)
    assert model.backend.plans["bencode"].tensors["input_features"].shape[0] == 2
    assert model.backend.max_items == 4
    want = [[s.tokens for s in model.transcribe(a, **options)[0]] for a in audio]
    assert [[s.tokens for s in segs] for segs, _ in got] == want and any(want)
    # `minirt plan` shows the batch's plans, fitted the same way, and says how
    from click.testing import CliRunner

    from minirt.cli import main
    r = CliRunner().invoke(main, ["plan", str(model.path), "--items", "4", "--entry", "bencode"])
    assert r.exit_code == 0, r.output
    assert "entry point bencode" in r.output and "input_features [2,80,3000]" in r.output
    assert "the encoder runs on 2 of the batch's 4 windows" in r.output and "maxStorageBufferRange" in r.output
    assert "encoder entry points for fewer windows (a run takes the smallest that holds them): bencode1, beside " \
           "bencode's 2" in r.output



@pytest.mark.long
def test_real_tiny_en_batch_of_16_equals_one_by_one(tmp_path):
    """The real tiny.en on 16 spoken clips through the Ray Transcriber (one Ray batch of 16 rows: transcribe_batch,
    whose encoder, on a device with 128 MiB ranges, runs in chunks): every clip's tokens are transcribe()'s.
    Minutes on lavapipe: skipped unless --long."""
    import json

    import real_whisper
    import speech_clips
    from test_ray import write_wav
    if not speech_clips.espeak_available():
        pytest.skip("espeak-ng is not installed (tools/setup.sh installs it)")
    try:
        folder = str(real_whisper.tiny_en_ct2_dir())
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    from minirt.ray import Transcriber
    paths = []
    for i in range(16):
        samples = speech_clips.clip(speech_clips.sentences(i, 1))
        paths.append(str(tmp_path / f"c{i}.wav"))
        write_wav(paths[-1], samples)
    options = dict(beam_size=1, temperature=0.0, condition_on_previous_text=False)
    t = Transcriber(folder, **options)
    out = t({"audio": np.array(paths)})
    want = [[s.tokens for s in t.model.transcribe(p, **options)[0]] for p in paths]
    assert [[s["tokens"] for s in json.loads(r)] for r in out["segments"]] == want
    assert all(want) and t.model.backend.max_items == 16
