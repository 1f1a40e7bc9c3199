"""Fuzzing: mutated ONNX files (bytes and fields, inline and external data), mutated safetensors checkpoints
and weight files, absurd config.json values and bad inputs. Each case runs in a child process under a 3 GiB
address-space limit (tests/fuzz_worker.py) and must end in a correct result (onnxruntime's, where its weights stay
sane) or a MinirtError: never a crash, a hang, another exception type (MemoryError included), a leaked Vulkan
object or a file read outside the model's folder. Seeded (derandomized hypothesis), bounded for CI."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis.control import currently_in_test_context
from hypothesis import strategies as st
from onnx import TensorProto, numpy_helper
from safetensors.numpy import save_file

from oracle import rand, rich_model, small_model

HERE = Path(__file__).resolve().parent
LIMIT_MIB = 3072        # the import of numpy, onnx, onnxruntime and lavapipe is about 0.9 GiB of address space
CASE_TIMEOUT_S = 120    # a case that compiles new kernels cold on lavapipe takes seconds; minutes is a hang


class Worker:
    """One child running cases in turn; restarted after a case that killed it."""

    def __init__(self, root: Path):
        self.root, self.proc = root, None

    def _start(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, str(HERE / "fuzz_worker.py"), str(LIMIT_MIB), str(self.root)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
        assert self._line(CASE_TIMEOUT_S) == "ready\n", "the fuzz worker did not start"

    def _line(self, timeout) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else ""

    def run(self, timeout=CASE_TIMEOUT_S, **case) -> dict:
        """The worker's verdict on one case; a case's time limit starts once the child is up."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in case.items()}) + "\n")
        self.proc.stdin.flush()
        line = self._line(timeout)
        if not line:
            try:
                code = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                code = None
            self.close()
            return {"outcome": "hang" if code is None else f"crash (exit {code})"}
        return json.loads(line)

    def close(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc.stdin.close()
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory):
    """(worker, root): cases live in folders under root, beside a secret file no case may read."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "secret.bin").write_bytes(rand(4, 3, seed=1).tobytes())
    w = Worker(root)
    yield w, root
    w.close()


_count = [0]


def case_folder(root: Path) -> Path:
    _count[0] += 1
    d = root / f"case{_count[0]}"
    d.mkdir()
    return d


def clean(result: dict, what: str) -> None:
    """The verdict every case must get."""
    assert result["outcome"] in ("ran", "refused"), f"{what}: {result}"
    assert result["leaked"] == 0, f"{what}: {result['leaked']} Vulkan object(s) leaked"
    assert not result["outside"], f"{what}: read {result['outside']}, outside the model's folder"
    if result["outcome"] == "ran":
        assert result["mismatch"] is None, f"{what}: {result['mismatch']}"
    if currently_in_test_context():          # hypothesis's statistics (pytest --hypothesis-show-statistics)
        event("ran" if result["outcome"] == "ran" else f"refused: {result['error']}")


def _sane(model: onnx.ModelProto) -> bool:
    """Float initializers of ordinary size: outputs can then be held to onnxruntime's (a mutated weight of
    1e38 makes both runtimes overflow, each its own way)."""
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            return False
        a = numpy_helper.to_array(t)
        if np.issubdtype(a.dtype, np.floating) and not (np.isfinite(a).all() and np.abs(a).max(initial=0) < 1e3):
            return False
    return True


def _onnx_case(root, data: bytes, storage):
    d = case_folder(root)
    p = d / "m.onnx"
    p.write_bytes(data)
    try:
        oracle = str(p) if _sane(onnx.load_model_from_string(data)) else None
    except Exception:
        oracle = None
    return dict(folder=d, model=p, storage=storage, oracle=oracle)


SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
RICH = rich_model()
RICH_BYTES = RICH.SerializeToString()


# -- ONNX bytes --------------------------------------------------------------------------------------

@settings(max_examples=300, **SETTINGS)
@given(mutations=st.lists(st.tuples(st.integers(0, len(RICH_BYTES) - 1), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(RICH_BYTES) - 1)), storage=st.sampled_from(["buffer", "texture"]))
def test_mutated_onnx_bytes(fuzz, mutations, cut, storage):
    w, root = fuzz
    b = bytearray(RICH_BYTES)
    for pos, val in mutations:
        b[pos] = val
    clean(w.run(**_onnx_case(root, bytes(b if cut is None else b[:cut]), storage)), f"mutations {mutations} cut {cut}")


def _external(folder: Path, location: str | None, offset: str | None) -> bytes:
    """small_model with its weights in w.bin beside it (a symlink to the secret file beside them too); the first
    tensor's location and offset entries replaced when given."""
    m = small_model()
    blob = b""
    for i, t in enumerate(m.graph.initializer):
        raw = numpy_helper.to_array(t).tobytes()
        t.ClearField("float_data")
        t.raw_data = b""
        t.data_location = TensorProto.EXTERNAL
        entries = {"location": "w.bin", "offset": str(len(blob)), "length": str(len(raw))}
        if i == 0:
            entries.update({k: v for k, v in (("location", location), ("offset", offset)) if v is not None})
        for k, v in entries.items():
            t.external_data.add(key=k, value=v)
        blob += raw
    (folder / "w.bin").write_bytes(blob)
    os.symlink(folder.parent / "secret.bin", folder / "link.bin")
    return m.SerializeToString()


LOCATIONS = ["../secret.bin", "link.bin", "/etc/hostname", "sub/../../secret.bin", "w.bin\x00x", "", ".", "w.bin/"]
OFFSETS = ["-4", "99999999999999999999", "12", "1e3", " 0", "0x0"]


@settings(max_examples=120, **SETTINGS)
@given(mutations=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), min_size=0, max_size=3),
       location=st.one_of(st.none(), st.sampled_from(LOCATIONS)),
       offset=st.one_of(st.none(), st.sampled_from(OFFSETS)))
def test_mutated_external_data(fuzz, mutations, location, offset):
    """The weights in a file beside the model: locations that leave the folder, offsets and lengths out of
    range or not numbers, and random byte changes to the model file."""
    w, root = fuzz
    d = case_folder(root)
    b = bytearray(_external(d, location, offset))
    for pos, val in mutations:
        b[pos % len(b)] = val
    p = d / "m.onnx"
    p.write_bytes(bytes(b))
    clean(w.run(folder=d, model=p), f"location {location!r} offset {offset!r} mutations {mutations}")


# -- ONNX fields -------------------------------------------------------------------------------------

OP_NAMES = sorted(__import__("minirt").ops.OPS)


def _mutate_fields(m, kind, a, b, v):
    """One structured change: an attribute, an integer constant (axes, shapes, indices), the input's dims,
    a node's wiring or op type, a dropped input, a float constant's length, the opset or IR version."""
    g = m.graph
    node = g.node[a % len(g.node)]
    if kind == 0 and node.attribute:
        at = node.attribute[b % len(node.attribute)]
        if at.type == onnx.AttributeProto.INT:
            at.i = v
        elif at.type == onnx.AttributeProto.INTS and len(at.ints):
            at.ints[b % len(at.ints)] = v
        elif at.type == onnx.AttributeProto.FLOAT:
            at.f = (0.0, -1.0, 1e30, float("nan"))[b % 4]
    elif kind == 1:
        ints = [t for t in g.initializer if t.data_type == TensorProto.INT64]
        t = ints[a % len(ints)]
        x = numpy_helper.to_array(t).copy()
        if x.size:
            x.reshape(-1)[b % x.size] = v
        t.CopyFrom(numpy_helper.from_array(x, t.name))
    elif kind == 2:
        dims = g.input[0].type.tensor_type.shape.dim
        dims[a % len(dims)].dim_value = max(v, 1)
    elif kind == 3 and node.input:
        names = [t.name for t in g.initializer] + [o for n in g.node for o in n.output] + ["x"]
        node.input[b % len(node.input)] = names[(a + b) % len(names)]
    elif kind == 4:
        node.op_type = OP_NAMES[b % len(OP_NAMES)]
    elif kind == 5 and node.input:
        del node.input[b % len(node.input)]
    elif kind == 6:
        fl = [t for t in g.initializer if t.data_type == TensorProto.FLOAT]
        t = fl[a % len(fl)]
        x = numpy_helper.to_array(t).reshape(-1)
        t.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(x[:1 + b % x.size]), t.name))
    elif kind == 7:
        t = g.initializer[a % len(g.initializer)]
        t.data_type = (TensorProto.INT64, TensorProto.BOOL, TensorProto.FLOAT16, TensorProto.DOUBLE,
                       TensorProto.STRING, TensorProto.UNDEFINED)[b % 6]
    elif kind == 8:
        if b % 2:
            m.opset_import[0].version = v % 40
        else:
            m.ir_version = v % 16


@settings(max_examples=200, **SETTINGS)
@given(changes=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 1 << 16), st.integers(0, 1 << 16),
                                  st.integers(-6, 9)), min_size=1, max_size=3),
       storage=st.sampled_from(["buffer", "texture"]))
def test_mutated_onnx_fields(fuzz, changes, storage):
    """Structured mutations get past the protobuf parser to shape inference, folding, the planner and the
    kernels."""
    w, root = fuzz
    m = onnx.ModelProto()
    m.CopyFrom(RICH)
    for change in changes:
        _mutate_fields(m, *change)
    clean(w.run(**_onnx_case(root, m.SerializeToString(), storage)), f"changes {changes}")


# -- safetensors -------------------------------------------------------------------------------------

def _weights_file(folder: Path) -> Path:
    p = folder / "w.safetensors"
    save_file({"w": rand(4, 3, seed=5), "b": rand(3, seed=6)}, str(p))
    return p


@settings(max_examples=80, **SETTINGS)
@given(mutations=st.lists(st.tuples(st.integers(0, 179), st.integers(0, 255)), min_size=1, max_size=3),
       cut=st.one_of(st.none(), st.integers(0, 179)))
def test_mutated_weights_file(fuzz, mutations, cut):
    """`weights=` a mutated safetensors file for an ONNX model."""
    w, root = fuzz
    d = case_folder(root)
    raw = bytearray(_weights_file(d).read_bytes())
    assert len(raw) == 180
    for pos, val in mutations:
        raw[pos] = val
    p = d / "w.safetensors"
    p.write_bytes(bytes(raw if cut is None else raw[:cut]))
    (d / "m.onnx").write_bytes(small_model().SerializeToString())
    clean(w.run(folder=d, model=d / "m.onnx", weights=p), f"mutations {mutations} cut {cut}")


def _checkpoint() -> tuple[bytes, dict]:
    """A one-layer Whisper encoder of width 64 as a Hugging Face checkpoint: (model.safetensors bytes, config)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("whisper_encoder", HERE.parent / "models" / "whisper_encoder.py")
    we = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(we)
    m = we.build_whisper_encoder(opset=20, seed=3, layers=1, d_model=64, heads=1, n_mels=8, n_frames=16)
    from safetensors.numpy import save
    data = save({k: np.ascontiguousarray(v) for k, v in we.hf_state_dict(m).items()})
    config = {"model_type": "whisper", "d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 1,
              "num_mel_bins": 8, "max_source_positions": 8, "encoder_ffn_dim": 256, "activation_function": "gelu"}
    return data, config


CHECKPOINT, CONFIG = _checkpoint()
HEADER = 8 + int.from_bytes(CHECKPOINT[:8], "little")
ABSURD = [0, -1, 1 << 40, 10 ** 30, 1.5, "64", None, [64], True, 1 << 20]


@settings(max_examples=100, **SETTINGS)
@given(mutations=st.lists(st.tuples(st.integers(0, HEADER - 1), st.integers(0, 255)), min_size=0, max_size=3),
       cut=st.one_of(st.none(), st.integers(0, len(CHECKPOINT) - 1)),
       config=st.one_of(st.none(), st.tuples(st.sampled_from(sorted(CONFIG)), st.sampled_from(ABSURD))),
       layer=st.one_of(st.none(), st.sampled_from([1, 7, 1000000, 10 ** 12])))
def test_mutated_whisper_checkpoint(fuzz, mutations, cut, config, layer):
    """A Whisper checkpoint folder: header bytes changed, the file cut short, one config.json value made absurd,
    a tensor renamed to a huge layer index."""
    w, root = fuzz
    d = case_folder(root)
    raw = bytearray(CHECKPOINT)
    if layer is not None:
        raw = _renamed(raw, b"model.encoder.layers.0.fc1.weight", f"model.encoder.layers.{layer}.fc1.weight".encode())
    for pos, val in mutations:
        raw[pos % len(raw)] = val
    (d / "model.safetensors").write_bytes(bytes(raw if cut is None else raw[:cut]))
    cfg = dict(CONFIG)
    if config is not None:
        cfg[config[0]] = config[1]
    (d / "config.json").write_text(json.dumps(cfg))
    clean(w.run(folder=d, model=d / "model.safetensors"), f"mutations {mutations} cut {cut} config {config} layer {layer}")


def _renamed(raw: bytearray, old: bytes, new: bytes) -> bytearray:
    """The checkpoint with one tensor renamed, its header rebuilt (the data unchanged)."""
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(bytes(raw[8:8 + n]))
    header[new.decode()] = header.pop(old.decode())
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return bytearray(len(h).to_bytes(8, "little") + h + bytes(raw[8 + n:]))


# -- inputs ------------------------------------------------------------------------------------------

BAD_FEEDS = [
    lambda: {"x": rand(2, 4, 6)},                                   # wrong rank
    lambda: {"x": rand(1, 4, 7)},                                   # wrong dim
    lambda: {"x": rand(1, 4, 6).astype(np.float64)},                # wider float
    lambda: {"x": np.arange(24, dtype=np.int64).reshape(1, 4, 6)},  # integers
    lambda: {"x": np.ones((1, 4, 6), bool)},
    lambda: {"x": rand(1, 4, 6).astype(np.float16)},
    lambda: {"y": rand(1, 4, 6)},                                   # unknown name
    lambda: {},                                                     # missing input
    lambda: {"x": rand(1, 4, 6), "z": rand(3)},                     # one too many
    lambda: {"x": np.full((1, 4, 6), np.nan, np.float32)},
    lambda: {"x": np.full((1, 4, 6), 3e38, np.float32)},
    lambda: {"x": rand(1, 4, 6)[:, :, ::2].repeat(2, axis=2)},      # a non-contiguous-derived array
    lambda: {"x": np.empty((1, 4, 0), np.float32)},
    lambda: {"x": rand(6, 4, 1).transpose(2, 1, 0)},                # a strided view
]


@pytest.mark.parametrize("which", range(len(BAD_FEEDS)))
@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_bad_inputs(fuzz, which, storage):
    """A bad input is refused (or, where it is valid, runs correctly) and the Session runs a good one after it."""
    w, root = fuzz
    d = case_folder(root)
    (d / "m.onnx").write_bytes(RICH_BYTES)
    np.savez(d / "feeds.npz", **BAD_FEEDS[which]())
    r = w.run(folder=d, model=d / "m.onnx", feeds=d / "feeds.npz", storage=storage, oracle=str(d / "m.onnx"))
    assert r["outcome"] == "ran", r       # the good run after the bad one
    clean(r, f"bad feeds #{which}")


@pytest.mark.parametrize("selftest,outcome", [("crash", "crash"), ("hang", "hang"), ("memory", "internal"),
                                              ("raise", "internal"), ("read", "ran")])
def test_the_harness_sees_what_it_must(fuzz, selftest, outcome):
    """The harness itself: a crash, a hang, a runaway allocation, an internal exception and a read outside the
    model's folder each show in the verdict, and the next case gets a working child."""
    w, root = fuzz
    d = case_folder(root)
    r = w.run(folder=d, selftest=selftest, timeout=3 if selftest == "hang" else 5)
    assert r["outcome"].startswith(outcome), r
    if selftest == "memory":
        assert r["error"] == "MemoryError", r
    if selftest == "read":
        assert r["outside"] == [str((root / "secret.bin").resolve())], r
    (d / "m.onnx").write_bytes(RICH_BYTES)
    clean(w.run(folder=d, model=d / "m.onnx", oracle=str(d / "m.onnx")), "a good case after the self-test")
