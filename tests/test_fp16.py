"""precision="fp16": 16-bit storage of weights and activations, fp32 arithmetic, float32 inputs and outputs.

The plan is checked on the plan itself (half kernels, float16 tensors; the float32 graph edges in
test_fp16_edges.py); the numbers against onnxruntime (fp32) with a tolerance fp16 storage allows, and the Whisper
encoder against minirt's own fp32 result with the targets of the fp16 issue (relative L2 <= 2e-3, cosine >= 0.9999)."""
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.errors import MinirtError, UnsupportedError
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.planner import make_plan
from minirt.plan import INTERMEDIATE, WEIGHT
from oracle import check_model, cosine, make_model, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402

FP16 = {"precision": "fp16"}
TOL = 1e-2     # max abs error relative to max |ref|: a few fp16 roundings along a chain


def seed():
    return int(np.random.SeedSequence().entropy % 2**31)    # fresh inputs every run


def _plan(model, shapes, profile="lavapipe", storage="buffer", **opts):
    g = prepare(bind_inputs(load(model), shapes))
    return make_plan(g, KNOWN_PROFILES[profile], storage, {**FP16, **opts})


def _small_whisper():
    return we.build_whisper_encoder("tiny", layers=1, n_frames=64, seed=3)


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_plan_runs_half_kernels_on_float16_tensors(storage):
    p = _plan(_small_whisper(), {"input_features": (1, 80, 64)}, storage=storage)
    assert p.precision == "fp16"
    # every kernel is a half variant; at the graph's edges it may read or write float32 (tests/test_fp16_edges.py)
    assert p.dispatches and all(d.kernel.endswith(("_half", "_half_in32", "_half_out32")) for d in p.dispatches)
    # float32 in GPU memory: the graph's input (and its views) and output, nothing else
    assert p.tensors["input_features"].dtype == "float32" and p.tensors[p.outputs[0]].dtype == "float32"
    assert {p.root(t.name) for t in p.tensors.values() if t.dtype == "float32"} == {"input_features", p.outputs[0]}
    for t in p.tensors.values():
        if t.role == WEIGHT:
            assert t.data.dtype == np.float16 and t.nbytes == t.data.nbytes


def test_fp32_plan_is_unchanged_by_the_option():
    m = _small_whisper()
    a = _plan(m, {"input_features": (1, 80, 64)}, precision="fp32")
    assert a.precision == "fp32" and not any(d.kernel.startswith("cast_") or "_half" in d.kernel
                                             for d in a.dispatches)
    assert all(t.dtype == "float32" for t in a.tensors.values())


def test_fp16_halves_activation_and_weight_bytes():
    m = _small_whisper()
    full = _plan(m, {"input_features": (1, 80, 64)}, precision="fp32")
    half = _plan(m, {"input_features": (1, 80, 64)})
    def total(p, role):
        return sum(t.nbytes for t in p.tensors.values() if t.role == role and not t.view_of)
    assert total(half, WEIGHT) * 2 == total(full, WEIGHT)
    assert total(half, INTERMEDIATE) < 0.6 * total(full, INTERMEDIATE)


def test_device_without_16bit_storage_refuses_fp16():
    with pytest.raises(UnsupportedError, match="16-bit storage.*powervr|PowerVR.*16-bit|storageBuffer16BitAccess"):
        _plan(_small_whisper(), {"input_features": (1, 80, 64)}, profile="powervr")


def test_unknown_precision_is_refused():
    with pytest.raises(MinirtError, match="precision must be one of fp32, fp16"):
        Session(_small_whisper(), precision="bf16")


# -- numbers, op by op, against onnxruntime -------------------------------------------------------------------
def _unary(op, **attrs):
    return make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": [2, 3, 5, 7]}, ["y"], opset=20)


CASES = {
    "add_broadcast": lambda: (make_model([helper.make_node("Add", ["x", "b"], ["y"])], {"x": [2, 3, 5, 7]}, ["y"],
                                         {"b": rand(5, 1, seed=1)}), {"x": rand(2, 3, 5, 7, seed=seed())}),
    "mul_two_inputs": lambda: (make_model([helper.make_node("Mul", ["x", "z"], ["y"])],
                                          {"x": [3, 6, 9], "z": [3, 6, 9]}, ["y"]),
                               {"x": rand(3, 6, 9, seed=seed()), "z": rand(3, 6, 9, seed=seed())}),
    "gelu": lambda: (_unary("Gelu"), {"x": rand(2, 3, 5, 7, seed=seed(), low=-4, high=4)}),
    "relu_tanh": lambda: (make_model([helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
                                     {"x": [2, 3, 5, 7]}, ["y"]), {"x": rand(2, 3, 5, 7, seed=seed())}),
    "transpose": lambda: (make_model([helper.make_node("Transpose", ["x"], ["y"], perm=[0, 2, 1])], {"x": [2, 9, 13]},
                                     ["y"]), {"x": rand(2, 9, 13, seed=seed())}),
    "concat": lambda: (make_model([helper.make_node("Concat", ["x", "z"], ["y"], axis=1)],
                                  {"x": [2, 3, 5], "z": [2, 4, 5]}, ["y"]),
                       {"x": rand(2, 3, 5, seed=seed()), "z": rand(2, 4, 5, seed=seed())}),
    "softmax": lambda: (make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": [3, 7, 33]}, ["y"]),
                        {"x": rand(3, 7, 33, seed=seed(), low=-8, high=8)}),
    "reduce_mean": lambda: (make_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[2], keepdims=1)],
                                       {"x": [2, 5, 11]}, ["y"], opset=17), {"x": rand(2, 5, 11, seed=seed())}),
    "layer_norm": lambda: (make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                                      {"x": [2, 9, 64]}, ["y"], {"g": rand(64, seed=2), "b": rand(64, seed=3)}),
                           {"x": rand(2, 9, 64, seed=seed(), low=-3, high=5)}),
    "layer_norm_odd": lambda: (make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)],
                                          {"x": [2, 9, 13]}, ["y"], {"g": rand(13, seed=2), "b": rand(13, seed=3)}),
                               {"x": rand(2, 9, 13, seed=seed())}),
    "matmul_const": lambda: (make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [2, 10, 36]}, ["y"],
                                        {"w": rand(36, 20, seed=4)}), {"x": rand(2, 10, 36, seed=seed())}),
    "matmul_two_inputs": lambda: (make_model([helper.make_node("MatMul", ["x", "z"], ["y"])],
                                             {"x": [2, 7, 12], "z": [2, 12, 9]}, ["y"]),
                                  {"x": rand(2, 7, 12, seed=seed()), "z": rand(2, 12, 9, seed=seed())}),
    "linear_gelu_residual": lambda: (make_model(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
         helper.make_node("Gelu", ["hb"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["o"]),
         helper.make_node("Add", ["o", "x"], ["y"])], {"x": [1, 37, 32]}, ["y"],
        {"w": rand(32, 64, seed=5), "b": rand(64, seed=6), "w2": rand(64, 32, seed=7)}, opset=20),
        {"x": rand(1, 37, 32, seed=seed())}),
    "conv1d_im2col_and_direct": lambda: (make_model(
        [helper.make_node("Conv", ["x", "w1", "b1"], ["h"], pads=[1, 1], kernel_shape=[3]),
         helper.make_node("Conv", ["h", "w2"], ["y"], pads=[1, 1], strides=[2], kernel_shape=[3])],
        {"x": [1, 8, 30]}, ["y"], {"w1": rand(64, 8, 3, seed=8), "b1": rand(64, seed=9), "w2": rand(5, 64, 3, seed=10)}),
        {"x": rand(1, 8, 30, seed=seed())}),
    "conv2d_depthwise_pointwise": lambda: (make_model(
        [helper.make_node("Conv", ["x", "wd"], ["h"], pads=[1, 1, 1, 1], group=6, kernel_shape=[3, 3]),
         helper.make_node("Conv", ["h", "wp", "bp"], ["y"], kernel_shape=[1, 1])],
        {"x": [1, 6, 9, 11]}, ["y"], {"wd": rand(6, 1, 3, 3, seed=11), "wp": rand(7, 6, 1, 1, seed=12),
                                      "bp": rand(7, seed=13)}), {"x": rand(1, 6, 9, 11, seed=seed())}),
}


@pytest.mark.parametrize("storage", ["buffer", "texture"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_op_matches_onnxruntime_at_fp16(case, storage):
    model, feeds = CASES[case]()
    check_model(model, feeds, storages=(storage,), tol=TOL, options=FP16)


def test_attention_at_fp16():
    from test_fuse_attention import attention_model, feeds
    model = attention_model(2, 21, 45, 3, 16, "torchscript")
    check_model(model, feeds(2, 21, 45, 48), tol=TOL, options=FP16)


# -- range: fp16 saturates, NaN and inf pass through ---------------------------------------------------------
def test_values_beyond_fp16_saturate_and_nan_inf_propagate():
    m = make_model([helper.make_node("Mul", ["x", "k"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                   {"x": [1, 8]}, ["y"], {"k": np.array(3e4, np.float32)})
    x = np.array([[4.0, 0.25, -1.0, 3.0, np.nan, np.inf, 1e-3, 0.5]], np.float32)
    for storage in ("buffer", "texture"):
        with Session(m, storage=storage, precision="fp16", options={"poison": True}) as s:
            y = s.run(x)
        assert y[0, 0] == 65504.0 and y[0, 3] == 65504.0, y     # 1.2e5 and 9e4 saturate instead of becoming inf
        assert y[0, 2] == 0.0 and np.isnan(y[0, 4]) and y[0, 5] == np.inf, y
        assert y[0, 1] == 7500.0 and y[0, 7] == 15000.0 and abs(y[0, 6] - 30.0) <= 0.1, y


# -- the Whisper encoder against minirt fp32 --------------------------------------------------------------------
@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_whisper_fp16_close_to_fp32(storage):
    model = we.build_whisper_encoder("tiny", layers=2, n_frames=200, seed=11)
    x = we.sample_input(n_frames=200, seed=seed())
    with Session(model, storage=storage) as s:
        ref = s.run(x)
    with Session(model, storage=storage, precision="fp16", options={"poison": True}) as s:
        y = s.run(x)
        assert s.precision == "fp16"
        again = s.run(x)
    assert y.dtype == np.float32 and y.shape == ref.shape and np.isfinite(y).all()
    rel = float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref))
    assert rel <= 2e-3, f"relative L2 {rel:.2e}"
    assert cosine(y, ref) >= 0.9999
    assert y.tobytes() == again.tobytes()


def test_cli_run_fp16(tmp_path):
    from click.testing import CliRunner
    from minirt.cli import main
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=64, seed=2)
    mp, xp = tmp_path / "m.onnx", tmp_path / "x.npy"
    mp.write_bytes(model.SerializeToString())
    np.save(xp, we.sample_input(n_frames=64, seed=seed()))
    r = CliRunner().invoke(main, ["run", str(mp), str(xp), "--precision", "fp16", "-q"])
    assert r.exit_code == 0, r.output
    assert "precision fp16" in r.output
    r = CliRunner().invoke(main, ["plan", str(mp), "--precision", "fp16"])
    assert r.exit_code == 0 and "im2col_buffer_half_in32" in r.output and "cast_" not in r.output, r.output

