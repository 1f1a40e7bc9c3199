"""Tests for models/whisper_encoder.py, the synthetic Whisper encoder builder.

The float64 reference below is written independently from the initializers,
so a structural mistake in the builder (wrong transpose, missing bias, wrong
scale) shows up as a mismatch against onnxruntime, not just as a crash.
"""
import importlib.util
import math
import pathlib

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

_PATH = pathlib.Path(__file__).resolve().parents[1] / "models" / "whisper_encoder.py"
_spec = importlib.util.spec_from_file_location("whisper_encoder", _PATH)
we = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(we)

SMALL = dict(size="tiny", layers=1, n_frames=200)  # d 384, 6 heads, T 100


def run_ort(model_or_path, x):
    src = model_or_path if isinstance(model_or_path, str) else model_or_path.SerializeToString()
    sess = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
    return sess.run(None, {"input_features": x})[0]


def op_types(model):
    return {n.op_type for n in model.graph.node}


# -- float64 reference ------------------------------------------------------
_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def conv1d(x, w, b, stride):  # x [B, C, N], w [O, C, 3], pad 1
    n_out = (x.shape[2] - 1) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1)))
    cols = np.stack([xp[:, :, k:k + stride * (n_out - 1) + 1:stride] for k in range(3)], -1)
    return np.einsum("bctk,ock->bot", cols, w) + b[None, :, None]


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def reference(model, x, heads):
    p = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}

    def linear(h, scope, param, bias=True):
        y = h @ p[nodes[f"{scope}/MatMul"].input[1]]  # weight stored [in, out]
        return y + p[f"{param}.bias"] if bias else y

    def ln(h, name):
        return layer_norm(h, p[f"{name}.weight"], p[f"{name}.bias"])

    h = gelu(conv1d(x.astype(np.float64), p["conv1.weight"], p["conv1.bias"], 1))
    h = gelu(conv1d(h, p["conv2.weight"], p["conv2.bias"], 2))
    h = h.transpose(0, 2, 1) + p["embed_positions.weight"]
    B, T, d = h.shape
    hd = d // heads
    n_layers = sum(1 for k in p if k.endswith(".fc1.bias"))
    for i in range(n_layers):
        s, n = f"/layers.{i}/self_attn", f"layers.{i}.self_attn"
        a = ln(h, f"layers.{i}.self_attn_layer_norm")
        q = linear(a, f"{s}/q_proj", f"{n}.q_proj") * hd ** -0.5
        k = linear(a, f"{s}/k_proj", None, bias=False)
        v = linear(a, f"{s}/v_proj", f"{n}.v_proj")
        q, k, v = (t.reshape(B, T, heads, hd).transpose(0, 2, 1, 3) for t in (q, k, v))
        o = softmax(q @ k.transpose(0, 1, 3, 2)) @ v
        o = o.transpose(0, 2, 1, 3).reshape(B, T, d)
        h = h + linear(o, f"{s}/out_proj", f"{n}.out_proj")
        f = ln(h, f"layers.{i}.final_layer_norm")
        f = gelu(linear(f, f"/layers.{i}/fc1", f"layers.{i}.fc1"))
        h = h + linear(f, f"/layers.{i}/fc2", f"layers.{i}.fc2")
    return ln(h, "layer_norm")


# -- tests --------------------------------------------------------------------
@pytest.mark.parametrize("opset", [17, 20])
def test_tiny_checks_and_runs(opset):
    model = we.build_whisper_encoder("tiny", opset=opset)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == opset
    y = run_ort(model, we.sample_input())
    assert y.shape == (1, 1500, 384) and y.dtype == np.float32
    assert np.isfinite(y).all()


@pytest.mark.parametrize("opset", [17, 20])
def test_gelu_spelling(opset):
    ops = op_types(we.build_whisper_encoder(opset=opset, **SMALL))
    assert "LayerNormalization" in ops
    if opset == 17:
        assert "Erf" in ops and "Gelu" not in ops
    else:
        assert "Gelu" in ops and "Erf" not in ops


def test_shape_chains_feed_reshapes():
    model = we.build_whisper_encoder(opset=17, **SMALL)
    producer = {o: n for n in model.graph.node for o in n.output}
    chained = 0
    for n in model.graph.node:
        if n.op_type != "Reshape":
            continue
        concat = producer[n.input[1]]
        assert concat.op_type == "Concat"
        srcs = [producer[i] for i in concat.input]
        unsq = [s for s in srcs if s.op_type == "Unsqueeze"]
        assert all(len(u.input) == 2 for u in unsq)  # axes as an input (opset >= 13)
        assert all(producer[u.input[0]].op_type == "Gather" for u in unsq)
        assert all(producer[producer[u.input[0]].input[0]].op_type == "Shape" for u in unsq)
        assert any(s.op_type == "Constant" for s in srcs)
        chained += bool(unsq)
    assert chained == 4  # q, k, v head split + head merge in the one layer
    # the q scale is a Constant node (0.125 = 64**-0.5) applied after q_proj
    mul = next(n for n in model.graph.node if n.name == "/layers.0/self_attn/Mul")
    assert producer[mul.input[0]].name == "/layers.0/self_attn/q_proj/Add"
    scale = producer[mul.input[1]]
    assert scale.op_type == "Constant"
    assert numpy_helper.to_array(scale.attribute[0].t) == np.float32(0.125)
    # HF's k_proj has no bias
    assert "layers.0.self_attn.k_proj.bias" not in {t.name for t in model.graph.initializer}


@pytest.mark.parametrize("opset", [17, 20])
def test_matches_float64_reference(opset):
    model = we.build_whisper_encoder(opset=opset, **SMALL)
    x = we.sample_input(80, 200, seed=3)
    y = run_ort(model, x).astype(np.float64).ravel()
    r = reference(model, x, heads=6).ravel()
    cos = y @ r / (np.linalg.norm(y) * np.linalg.norm(r))
    assert cos >= 0.99999, cos
    assert np.abs(y - r).max() < 1e-3


def test_dynamic_batch():
    model = we.build_whisper_encoder(opset=20, dynamic_batch=True, **SMALL)
    onnx.checker.check_model(model)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x = np.concatenate([we.sample_input(80, 200, seed=1), we.sample_input(80, 200, seed=2)])
    y = run_ort(model, x)
    assert y.shape == (2, 100, 384)
    np.testing.assert_allclose(y[1:], run_ort(model, x[1:]), atol=1e-5)


def test_seeded_and_configurable():
    a = we.build_whisper_encoder(seed=5, **SMALL).SerializeToString()
    assert a == we.build_whisper_encoder(seed=5, **SMALL).SerializeToString()
    assert a != we.build_whisper_encoder(seed=6, **SMALL).SerializeToString()
    m = we.build_whisper_encoder("tiny", layers=2, d_model=128, heads=2, n_frames=64)
    assert run_ort(m, we.sample_input(80, 64)).shape == (1, 32, 128)
    v3 = we.build_whisper_encoder("large-v3", layers=1, n_frames=20)
    assert v3.graph.input[0].type.tensor_type.shape.dim[1].dim_value == 128
    # every bias is random and nonzero
    for t in v3.graph.initializer:
        if t.name.endswith(".bias"):
            assert np.all(numpy_helper.to_array(t) != 0), t.name


def test_external_data_roundtrip(tmp_path):
    model = we.build_whisper_encoder(opset=17, **SMALL)
    x = we.sample_input(80, 200)
    expected = run_ort(model, x)
    path = str(tmp_path / "enc.onnx")
    we.save(model, path, external_data=True)
    assert (tmp_path / "enc.data").stat().st_size > 1_000_000
    assert (tmp_path / "enc.onnx").stat().st_size < 200_000
    onnx.checker.check_model(path)
    np.testing.assert_array_equal(run_ort(path, x), expected)


def test_sample_input():
    x = we.sample_input()
    assert x.shape == (1, 80, 3000) and x.dtype == np.float32
    assert x.min() >= -1.0 and x.max() <= 1.5 and 0.2 < x.std() < 0.8
    np.testing.assert_array_equal(x, we.sample_input(seed=1))
    assert not np.array_equal(x, we.sample_input(seed=2))
    assert we.sample_input(128, 200, seed=0).shape == (1, 128, 200)


def test_cli(tmp_path):
    out, npy = tmp_path / "m.onnx", tmp_path / "in.npy"
    we.main(["--size", "tiny", "--opset", "20", "--layers", "1", "--n-frames", "200",
             "-o", str(out), "--sample-input", str(npy), "--check"])
    x = np.load(npy)
    assert x.shape == (1, 80, 200)
    assert run_ort(str(out), x).shape == (1, 100, 384)
