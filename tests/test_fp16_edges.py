"""precision="fp16" at the graph's edges: the caller's inputs and outputs are float32, activations float16.

A kernel that can read a float32 graph input (im2col's io=in32 variant in buffers; any kernel in textures, whose
sampler converts) or write a float32 graph output (the io=out32 variants of layer_norm, layer_norm_rows and linear)
does, with no cast dispatch; every other reader or writer still goes through cast_*_down / cast_*_up. Plans are
checked on the plan itself (fake device profiles, no GPU); numbers against onnxruntime (fp32) with poisoned
activations and fresh random inputs, in both storages."""
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.errors import InputError
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.planner import make_plan
from minirt.plan import OUTPUT, SCRATCH
from oracle import check_model, compare, make_model, onnxruntime_run, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402

FP16 = {"precision": "fp16"}
TOL = 1e-2     # as tests/test_fp16.py: max abs error relative to max |ref|


def seed():
    return int(np.random.SeedSequence().entropy % 2**31)    # fresh inputs every run


def _plan(model, shapes=None, profile="lavapipe", storage="buffer", precision="fp16"):
    g = load(model)
    g = prepare(bind_inputs(g, shapes) if shapes else g)
    return make_plan(g, KNOWN_PROFILES[profile], storage, {"precision": precision})


def _kernels(plan):
    return [d.kernel for d in plan.dispatches]


def _readers(plan, name):
    return [d.kernel for d in plan.dispatches if any(plan.root(r) == name for r in d.reads)]


def _writers(plan, name):
    return [d.kernel for d in plan.dispatches if any(plan.root(w) == name for w in d.writes)]


# -- the Whisper encoder: no casts at all ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def whisper_tiny():
    return we.build_whisper_encoder("tiny", seed=1)     # full size: [1, 80, 3000] -> [1, 1500, 384]


@pytest.mark.parametrize("profile, storage, first, last", [
    ("lavapipe", "buffer", "im2col_buffer_half_in32", "layer_norm_rows_half_out32"),
    ("lavapipe", "texture", "copy_texture_half", "layer_norm_texture_half_out32"),   # the conv1d reshape: a copy
    ("adreno-840", "buffer", "im2col_buffer_half_in32", "layer_norm_buffer_half_out32"),
    # GEMMs on linear_cm; the last fc2 splits K and its reduce pass does the final LayerNorm (fuse_reduce_layer_norm)
    ("nvidia-h200", "buffer", "im2col_buffer_half_in32", "linear_reduce_ln_half_out32")])
def test_whisper_plan_reads_and_writes_the_float32_edges_in_place(whisper_tiny, profile, storage, first, last):
    half = _plan(whisper_tiny, profile=profile, storage=storage)
    full = _plan(whisper_tiny, profile=profile, storage=storage, precision="fp32")
    assert not [k for k in _kernels(half) if k.startswith("cast_")]
    # the same dispatches, with the H200's work-group splits at both precisions: the attentions' keys (a combine pass
    # each: fp16's plain splits, fp32's stream splits), the GEMMs' K (a reduce pass each: conv2, the four fc2 and the
    # four out-projections, whose LayerNorms those passes take over)
    combines = [len([k for k in _kernels(p) if k.startswith("attention_combine")]) for p in (half, full)]
    reduces = [len([k for k in _kernels(p) if k.startswith("linear_reduce")]) for p in (half, full)]
    assert (combines, reduces) == (([4, 4], [9, 9]) if profile == "nvidia-h200" else ([0, 0], [0, 0]))
    assert len(half.dispatches) == len(full.dispatches)
    if (profile, storage) == ("lavapipe", "buffer"):
        # 35 with the two casts (conv_output_nlc took 2 more, conv_input_nlc conv2's im2col)
        assert len(half.dispatches) == 32
    (x,), (y,) = half.inputs, half.outputs
    # the input is bound as it is (float32) to its one reader; in buffers through the conv1d reshape's free view
    assert half.tensors[x].dtype == "float32" and _readers(half, x) == [first]
    assert half.dispatches[0].kernel == first
    # the output: float32, its own memory, written once, by the final LayerNorm (first written argument: io=out32)
    t = half.tensors[y]
    assert (t.dtype, t.role, t.view_of) == ("float32", OUTPUT, None)
    assert _writers(half, y) == [last] and half.dispatches[-1].kernel == last and half.dispatches[-1].writes[0] == y
    # and nothing else is float32 but scratch a kernel keeps in fp32 (split attention's partials)
    assert {half.root(t.name) for t in half.tensors.values() if t.dtype == "float32" and t.role != SCRATCH} == {x, y}


# -- op by op: which edges go without a cast ------------------------------------------------------------------
def _ln(shape):
    n = shape[-1]
    return make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], {"x": shape}, ["y"],
                      {"g": rand(n, seed=2), "b": rand(n, seed=3)}), {"x": rand(*shape, seed=seed(), low=-3, high=5)}


def _conv2d():
    """A 3x3 conv with 128 output channels on a graph input: im2col + GEMM, the GEMM writing the graph output."""
    return make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])],
                      {"x": [1, 5, 9, 11]}, ["y"], {"w": rand(128, 5, 3, 3, seed=4), "b": rand(128, seed=5)}), \
        {"x": rand(1, 5, 9, 11, seed=seed())}


def _conv1d_gelu():
    """Whisper's first conv: rewritten to 2-D, so im2col reads a view of the input and the output is a view too."""
    return make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1], kernel_shape=[3]),
                       helper.make_node("Gelu", ["c"], ["y"])], {"x": [1, 8, 30]}, ["y"],
                      {"w": rand(128, 8, 3, seed=6), "b": rand(128, seed=7)}, opset=20), \
        {"x": rand(1, 8, 30, seed=seed())}


def _linear():
    return make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                      {"x": [1, 37, 32]}, ["y"], {"w": rand(32, 20, seed=8), "b": rand(20, seed=9)}), \
        {"x": rand(1, 37, 32, seed=seed())}


def _pointwise_conv1d():
    """A 1x1 conv on a rank-3 input: its GEMM (no in32 variant) reads a rank-4 view of the input, so a view of
    the input's float16 copy; it writes a rank-4 temporary that the output views, so the output takes a cast."""
    return make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[1])], {"x": [1, 6, 10]}, ["y"],
                      {"w": rand(7, 6, 1, seed=10), "b": rand(7, seed=11)}), {"x": rand(1, 6, 10, seed=seed())}


def _conv_and_relu():
    """One input, two readers: im2col reads it as float32, Relu (no such variant) a float16 copy."""
    m, feeds = _conv2d()
    m.graph.node.append(helper.make_node("Relu", ["x"], ["z"]))
    m.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    return m, feeds


def _output_read_again():
    """y is a graph output and Relu's input: its LayerNorm writes float16 for Relu, and a cast writes y."""
    m, feeds = _ln([2, 9, 64])
    m.graph.node.append(helper.make_node("Relu", ["y"], ["z"]))
    m.graph.output.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    return m, feeds


CASES = {   # model, {storage: kernels on lavapipe}
    "conv2d_im2col": (_conv2d, {
        "buffer": ["im2col_buffer_half_in32", "linear_t44_half_out32"],
        "texture": ["im2col_texture_half", "gemm_texture_scratch_half", "cast_texture_up"]}),
    "conv1d_as_2d_gelu": (_conv1d_gelu, {
        "buffer": ["im2col_buffer_half_in32", "linear_t44_half", "cast_buffer_up"],
        "texture": ["copy_texture_half", "im2col_texture_half", "gemm_texture_scratch_half", "copy_texture_half",
                    "cast_texture_up"]}),
    "layer_norm_rows": (lambda: _ln([2, 9, 64]), {
        "buffer": ["cast_buffer_down", "layer_norm_rows_half_out32"],
        "texture": ["layer_norm_texture_half_out32"]}),
    "layer_norm_odd": (lambda: _ln([2, 9, 13]), {
        "buffer": ["cast_buffer_down", "layer_norm_buffer_half_out32"],
        "texture": ["layer_norm_texture_half_out32"]}),
    "linear": (_linear, {
        "buffer": ["cast_buffer_down", "linear_t44_half_out32"],
        "texture": ["matmul_texture_const_half", "cast_texture_up"]}),
    "pointwise_conv1d": (_pointwise_conv1d, {
        "buffer": ["cast_buffer_down", "gemm_buffer_act_half", "cast_buffer_up"],
        "texture": ["copy_texture_half", "gemm_texture_act_half", "copy_texture_half", "cast_texture_up"]}),
    "two_readers": (_conv_and_relu, {
        "buffer": ["im2col_buffer_half_in32", "linear_t44_half_out32", "cast_buffer_down", "unary_buffer_half",
                   "cast_buffer_up"],
        "texture": ["im2col_texture_half", "gemm_texture_scratch_half", "unary_texture_half", "cast_texture_up",
                    "cast_texture_up"]}),
    "output_read_again": (_output_read_again, {
        "buffer": ["cast_buffer_down", "layer_norm_rows_half", "unary_buffer_half", "cast_buffer_up",
                   "cast_buffer_up"],
        "texture": ["layer_norm_texture_half", "unary_texture_half", "cast_texture_up", "cast_texture_up"]}),
}


@pytest.mark.parametrize("storage", ["buffer", "texture"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_converts_at_the_edges_where_a_kernel_can(case, storage):
    build, kernels = CASES[case]
    model, _ = build()
    p = _plan(model, storage=storage)
    assert _kernels(p) == kernels[storage]
    for name in p.outputs:      # whoever writes them, the outputs the caller gets are float32 and written once
        assert p.tensors[name].dtype == "float32" and len(_writers(p, name)) == 1
    for x in p.inputs:          # a float32 input is read only by kernels that convert it; the others read a cast
        assert all(k.endswith("_in32") or k.startswith("cast_") or storage == "texture" for k in _readers(p, x))


@pytest.mark.parametrize("storage", ["buffer", "texture"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_edge_kernels_match_onnxruntime(case, storage):
    model, feeds = CASES[case][0]()
    check_model(model, feeds, storages=(storage,), tol=TOL, options=FP16)


def test_input_feeding_only_float16_kernels_keeps_its_cast():
    m = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": [3, 7, 33]}, ["y"])
    assert _kernels(_plan(m)) == ["cast_buffer_down", "softmax_buffer_half", "cast_buffer_up"]
    assert _kernels(_plan(m, storage="texture")) == ["softmax_texture_half", "cast_texture_up"]


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_outputs_written_as_float32_are_not_saturated(storage):
    """A LayerNorm whose scale and bias (60000, within fp16) take it past the fp16 range: written as float32 by the
    kernel, the output keeps its values, where a float16 result and a cast would have saturated them at 65504."""
    x = rand(2, 5, 16, seed=seed(), low=-2, high=2)
    big = np.full(16, 6e4, np.float32)
    m = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], {"x": [2, 5, 16]},
                   ["y"], {"g": big, "b": big})
    (ref,) = onnxruntime_run(m, {"x": x})
    assert ref.max() > 7e4       # every row has an element above its mean: 60000 * (1 + z) with z > 0.25
    with Session(m, storage=storage, precision="fp16", options={"poison": True}) as s:
        compare(s.run(x), ref, TOL, storage)


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_small_whisper_matches_onnxruntime(storage):
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=64, seed=3)
    check_model(model, {"input_features": we.sample_input(n_frames=64, seed=seed())}, storages=(storage,), tol=TOL,
                options=FP16)


# -- the executor's ways of binding inputs and outputs ---------------------------------------------------------
@pytest.mark.parametrize("direct", ["0", "1"])
def test_direct_io_zero_copy_and_failed_runs(monkeypatch, direct):
    """The float32 input read by im2col and the float32 output written by the GEMM, bound to the kernels in host
    memory (MINIRT_DIRECT_IO=1) or staged and returned zero-copy; results held across runs stay; a refused run
    leaves the Session usable. coopmat=False: the tensor-core GEMM has no float32-output variant (its output is cast)."""
    monkeypatch.setenv("MINIRT_DIRECT_IO", direct)
    model, _ = _conv2d()
    xs = [rand(1, 5, 9, 11, seed=seed()) for _ in range(3)]
    refs = [onnxruntime_run(model, {"x": x})[0] for x in xs]
    with Session(model, storage="buffer", precision="fp16", options={"poison": True, "coopmat": False}) as s:
        im2col, gemm = _kernels(s.plan)    # the GEMM's tile depends on the device (t44, or t44k32 on discrete GPUs)
        assert im2col == "im2col_buffer_half_in32" and gemm.startswith("linear_t44") and gemm.endswith("_half_out32")
        assert all(bool(ex.res.direct) == (direct == "1") for ex in s._execs.values())
        held = s.run(xs[0])
        with pytest.raises(InputError):
            s.run(xs[1][:, :4])
        with pytest.raises(InputError):
            s.run(xs[1].astype(np.float64))
        ys = [s.run(x) for x in xs[1:]]
        for y, ref in zip([held, *ys], refs):
            assert y.dtype == np.float32
            compare(y, ref, TOL)


def test_lowering_refuses_to_mix_a_float32_output_with_its_stand_in():
    """No op does this; were one to, a float32 output written in place and then read, or written again through the
    float16 stand-in, would be wrong on the GPU: lowering stops instead."""
    from minirt.planner.lower import LowerCtx
    g = prepare(load(_ln([2, 9, 64])[0]))
    ctx = LowerCtx(g, "buffer", KNOWN_PROFILES["lavapipe"], {}, "fp16")
    ctx.node = g.nodes[0]
    ctx.t("x")
    y = ctx.t("y")
    assert ctx.dispatch("layer_norm_rows", [("y", "w"), ("x", "r")], io="out32").kernel == "layer_norm_rows_half_out32"
    tmp = ctx.temp("tmp", y.shape)
    with pytest.raises(RuntimeError, match="read float32 graph output 'y'"):
        ctx.dispatch("unary_buffer", [(tmp.name, "w"), ("y", "r")])
    with pytest.raises(RuntimeError, match="'y' is written as float32 and then through a float16 stand-in"):
        ctx.dispatch("unary_buffer", [("y", "w"), (tmp.name, "r")])
