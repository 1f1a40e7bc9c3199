"""fold_layer_norm: a LayerNorm read only by a Linear goes into that GEMM (NORM_A: the kernel normalises A's rows,
gamma and beta folded into W and b). Checked on the rewritten graph (folded constants against the float64 fold,
and where the pass must not fire), on the plan (NORM_A and eps reach both GEMM kernels; the Whisper-tiny plan loses
8 LayerNorm dispatches), and numerically with fresh inputs whose rows have their own mean offset and spread:
fp32 against onnxruntime (poisoned, ragged M, merged siblings' part-major output, GELU and residual epilogues), fp16
on the scalar half kernel and the emulated tensor-core kernel against a float64 numpy reference, and the 2-layer
Whisper encoder against onnxruntime."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minirt import Session, UnsupportedError
from minirt.device_profile import KNOWN_PROFILES
from minirt.graph import Graph, Node, Tensor
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.ops.gemm import CM_TILES, OUT_PARTS, OUT_ROWS, cm_shared_bytes
from minirt.planner import make_plan
from minirt.reference import run_graph
from oracle import check_model, compare, cosine, graph_after, make_model, onnxruntime_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import whisper_encoder as we  # noqa: E402

LAVAPIPE, H200 = KNOWN_PROFILES["lavapipe"], KNOWN_PROFILES["nvidia-h200"]
EPS = 1e-5
_erf = np.vectorize(math.erf, otypes=[np.float64])


def seed():
    return int(np.random.SeedSequence().entropy % 2**31)    # fresh inputs every run


def ln_model(t=37, k=64, n=48, parts=1, act=None, ln_bias=True, residual=False, batch=1, axis=-1, also=None,
             eps=EPS, wseed=0):
    """x [batch, t, k] -> LayerNorm(axis) -> `parts` projections MatMul + bias (+ act) (the first scaled by 0.125,
    as Whisper's q), (+ residual r when parts == 1). also: "neg" (a second reader of the LayerNorm's output),
    "output" (it is a graph output too), "residual" (the LayerNorm's output is a Linear's residual, not its A)."""
    rng = np.random.default_rng(wseed)
    h = helper.make_node
    init = {"gamma": (1 + 0.3 * rng.standard_normal(k)).astype(np.float32)}
    ln_in = ["x", "gamma"]
    if ln_bias:
        init["beta"] = (0.2 * rng.standard_normal(k)).astype(np.float32)
        ln_in.append("beta")
    nodes = [h("LayerNormalization", ln_in, ["ln"], axis=axis, epsilon=eps)]
    inputs, outputs = {"x": (batch, t, k)}, []
    src = "ln"
    if also == "residual":    # y = x2 @ w0 + b0 + ln: the LayerNorm's reader is a Linear, but not through A
        inputs["x2"] = (batch, t, k)
        src = "x2"
    for i in range(parts):
        init[f"w{i}"] = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
        init[f"b{i}"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
        nodes += [h("MatMul", [src, f"w{i}"], [f"m{i}"]), h("Add", [f"m{i}", f"b{i}"], [f"a{i}"])]
        cur = f"a{i}"
        if i == 0 and parts > 1:
            init["s"] = np.float32(0.125)
            nodes.append(h("Mul", [cur, "s"], ["q"]))
            cur = "q"
        if act:
            nodes.append(h(act, [cur], [f"g{i}"]))
            cur = f"g{i}"
        if residual or also == "residual":
            if residual:
                inputs["r"] = (batch, t, n)
            nodes.append(h("Add", [cur, "r" if residual else "ln"], [f"y{i}"]))
            cur = f"y{i}"
        outputs.append(cur)
    if also == "neg":
        nodes.append(h("Neg", ["ln"], ["neg"]))
        outputs.append("neg")
    if also == "output":
        outputs.append("ln")
    return make_model(nodes, inputs, outputs, init, opset=20)


def feeds_for(model, offset=50.0, seed_=None):
    """Random inputs; x's rows each get their own mean offset (up to +-offset) and spread, so a statistic
    computed in one pass or without the pivot would show."""
    rng = np.random.default_rng(seed() if seed_ is None else seed_)
    out = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        a = rng.standard_normal(shape)
        if v.name == "x":
            a = a * rng.uniform(0.3, 3.0, shape[:-1] + [1]) + rng.uniform(-offset, offset, shape[:-1] + [1])
        out[v.name] = a.astype(np.float32)
    return out


def shapes_of(model):
    return {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in model.graph.input}


def linears(g):
    return [n for n in g.nodes if n.op == "Linear"]


# -- the rewritten graph -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [dict(), dict(parts=3, act="Gelu"), dict(ln_bias=False, residual=True),
                                  dict(k=384, n=96, batch=2, t=5)])
def test_fold_on_the_graph(case):
    m = ln_model(**case)
    shapes = shapes_of(m)
    before = graph_after(m, shapes, "merge_siblings")
    g = graph_after(m, shapes, "fold_layer_norm")
    assert not any(n.op == "LayerNormalization" for n in g.nodes)
    (old,), (lin,) = linears(before), linears(g)
    assert lin.name == old.name and lin.inputs[0] == "x" and lin.inputs[3] == old.inputs[3]
    assert lin.attrs["norm_eps"] == pytest.approx(EPS, rel=1e-6)
    assert {k: v for k, v in lin.attrs.items() if k != "norm_eps"} == old.attrs
    # W' = diag(gamma) W and b' = b + beta @ W, in float64, stored float32, under new names
    gamma = before.tensor("gamma").data.astype(np.float64)
    beta = before.tensor("beta").data.astype(np.float64) if case.get("ln_bias", True) else np.zeros_like(gamma)
    w = before.tensor(old.inputs[1]).data.astype(np.float64)
    b = before.tensor(old.inputs[2]).data.astype(np.float64)
    assert lin.inputs[1] != old.inputs[1] and lin.inputs[2] != old.inputs[2]
    np.testing.assert_array_equal(g.tensor(lin.inputs[1]).data, (gamma[:, None] * w).astype(np.float32))
    np.testing.assert_array_equal(g.tensor(lin.inputs[2]).data, (b + beta @ w).astype(np.float32))
    assert g.tensor(lin.inputs[1]).data.dtype == np.float32 and g.tensor(lin.inputs[2]).data.dtype == np.float32
    assert any("folded LayerNormalization" in t for t in g.notes[lin.name])
    # the Linear's reference normalises: the rewritten graph still computes the model
    fd = feeds_for(m)
    got = run_graph(g, fd)
    for r, name in zip(onnxruntime_run(m, fd), g.outputs):
        compare(got[name], r, 1e-4, f"reference '{name}'")


def test_shared_weight_is_not_changed():
    """The LayerNorm's Linear and another one share W: the other keeps the original, unchanged."""
    h = helper.make_node
    rng = np.random.default_rng(1)
    k, n = 32, 16
    init = {"gamma": rng.uniform(0.5, 1.5, k).astype(np.float32), "beta": rng.standard_normal(k).astype(np.float32),
            "w": rng.standard_normal((k, n)).astype(np.float32)}
    w0 = init["w"].copy()
    nodes = [h("LayerNormalization", ["x", "gamma", "beta"], ["ln"], axis=-1),
             h("MatMul", ["ln", "w"], ["y0"]), h("MatMul", ["x2", "w"], ["y1"])]
    m = make_model(nodes, {"x": (1, 8, k), "x2": (1, 8, k)}, ["y0", "y1"], init, opset=20)
    g = graph_after(m, {"x": (1, 8, k), "x2": (1, 8, k)}, "fold_layer_norm")
    lin = {n.outputs[0]: n for n in linears(g)}
    assert "norm_eps" in lin["y0"].attrs and "norm_eps" not in lin["y1"].attrs
    assert lin["y1"].inputs[1] == "w" and lin["y0"].inputs[1] != "w"
    np.testing.assert_array_equal(g.tensor("w").data, w0)


@pytest.mark.parametrize("why,case", [
    ("two readers", dict(also="neg")),
    ("graph output", dict(also="output")),
    ("not the A input", dict(also="residual", n=64)),
    ("not the last axis", dict(axis=-2)),
])
def test_does_not_fire(why, case):
    m = ln_model(**case)
    g = graph_after(m, shapes_of(m), "fold_layer_norm")
    assert sum(n.op == "LayerNormalization" for n in g.nodes) == 1, why
    assert not any("norm_eps" in n.attrs for n in linears(g)), why


@pytest.mark.parametrize("off", [False, "0", "false"])
def test_option_off(off):
    m = ln_model()
    g = graph_after(m, shapes_of(m), "fold_layer_norm", fold_layer_norm=off)
    assert [n.op for n in g.nodes] == ["LayerNormalization", "Linear"]
    assert not any("folded" in t for v in g.notes.values() for t in v)


@pytest.mark.parametrize("options,k,says", [({"_storage": "texture"}, 64, "texture storage"),
                                            ({"no_fast_gemm": True}, 64, "no_fast_gemm"),
                                            ({}, 30, "K = 30")])
def test_general_gemm_does_not_fold(options, k, says):
    """Where the Linear would not run on linear.comp / linear_cm (the kernels with NORM_A), the pass leaves it."""
    m = ln_model(k=k)
    g = graph_after(m, shapes_of(m), "fold_layer_norm", **options)
    assert [n.op for n in g.nodes] == ["LayerNormalization", "Linear"]
    assert any("not folded" in t and says in t for v in g.notes.values() for t in v), g.notes


def test_lowering_refuses_a_fold_it_cannot_run():
    """A Linear carrying norm_eps in texture storage (which the pass never makes) is an error, not a silent
    unnormalised GEMM."""
    g = Graph(name="t")
    g.add_tensor(Tensor("x", (1, 8, 16), "float32"))
    g.inputs.append("x")
    g.const("w", np.ones((16, 8), np.float32))
    g.add_tensor(Tensor("y", (1, 8, 8), "float32"))
    g.outputs.append("y")
    g.nodes.append(Node("Linear", "lin", ["x", "w", "", ""], ["y"], {"act": "", "scale": 1.0, "norm_eps": EPS},
                        "minirt"))
    g = prepare(g)
    make_plan(g, LAVAPIPE, "buffer")      # fine in buffers
    with pytest.raises(UnsupportedError, match="norm_eps"):
        make_plan(g, LAVAPIPE, "texture")


# -- plans -------------------------------------------------------------------------------------------------------
def _plan(model, profile=LAVAPIPE, **options):
    return make_plan(prepare(bind_inputs(load(model), shapes_of(model))), profile, "buffer", options)


@pytest.mark.parametrize("precision,profile,kernel", [("fp32", LAVAPIPE, "linear_t"), ("fp16", LAVAPIPE, "linear_t"),
                                                      ("fp16", H200, "linear_cm_")])
@pytest.mark.parametrize("parts", [1, 3])
def test_plan_norm_a_reaches_the_kernel(precision, profile, kernel, parts):
    m = ln_model(parts=parts, act="Gelu", eps=1e-3)
    p = _plan(m, profile, precision=precision)
    assert not any(d.op == "LayerNormalization" for d in p.dispatches)
    (d,) = [d for d in p.dispatches if d.op == "Linear"]
    assert d.kernel.startswith(kernel), d.kernel
    assert d.spec == (OUT_PARTS if parts > 1 else OUT_ROWS, 2, 0, 1)    # gelu, no residual, NORM_A
    assert np.frombuffer(d.push[32:48], "<f4")[0] == pytest.approx(1e-3)
    assert d.reads[0] == "x" or d.reads[0].startswith("x@")              # the LayerNorm's input (fp16: its cast)
    off = _plan(m, profile, precision=precision, fold_layer_norm=False)
    gemm = next(d for d in off.dispatches if d.op == "Linear")
    assert len(gemm.spec) == 3 and len(off.dispatches) == len(p.dispatches) + 1


def _whisper_plan(**options):
    m = we.build_whisper_encoder("tiny", seed=2)
    return make_plan(prepare(bind_inputs(load(m), {"input_features": (1, 80, 3000)})), H200, "buffer", options)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_whisper_tiny_plan_has_8_fewer_layer_norms(precision):
    on, off = _whisper_plan(precision=precision), _whisper_plan(precision=precision, fold_layer_norm=False)
    count = [sum(d.op == "LayerNormalization" for d in p.dispatches) for p in (on, off)]
    assert count == [1, 9]                       # 4 layers x (self_attn_layer_norm, final_layer_norm); ln_post stays
    assert len(off.dispatches) - len(on.dispatches) == 8
    folded = [d.node.split("/")[-2] if d.node.endswith("MatMul") else d.node.split("/")[-1]
              for d in on.dispatches if d.op == "Linear" and d.spec[3:] == (1,)]
    assert folded == ["q_proj+k_proj+v_proj", "fc1"] * 4, folded


# -- numbers -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [
    dict(),                                             # M = 37: a ragged last row block
    dict(parts=3, act="Gelu"),                          # merged siblings: part-major output (OUT_MODE 2), GELU
    dict(t=70, k=36, n=20, residual=True),              # K = 36: a partial slice; N % 4 == 0, residual
    dict(batch=2, t=5, k=384, n=96, ln_bias=False),     # Whisper's K, M = 10 (one short block)
    dict(t=130, k=512, n=64, act="Relu"),               # K = 512 (Whisper base), M over two 64-row blocks
])
def test_matches_onnxruntime(case):
    m = ln_model(**case)
    check_model(m, feeds_for(m), storages=("buffer", "texture"))    # poisoned; buffer folded, texture not
    with Session(m, storage="buffer") as s:
        assert not any(d.op == "LayerNormalization" for d in s.plan.dispatches)


def test_forced_local_sizes():
    """The statistics split over however many invocations a group has per row (fewer than a row, or several)."""
    m = ln_model(t=70, k=64, parts=3, act="Gelu")
    fd = feeds_for(m)
    for local in ((4, 4, 1), (24, 12, 1), (8, 32, 1)):
        check_model(m, fd, storages=("buffer",), options={"local_size": local})


def test_fold_close_to_unfolded():
    m = ln_model(t=70, k=384, n=96, parts=3)
    fd = feeds_for(m)
    outs = []
    for on in (True, False):
        with Session(m, storage="buffer", options={"fold_layer_norm": on, "poison": True}) as s:
            outs.append(s.run(None, fd))
    for a, b in zip(*outs):
        compare(a, b, 2e-5, "folded vs unfolded")


def _f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _gelu_reference64(model, fd):
    """ln_model(act="Gelu") in float64 numpy from x rounded to fp16, as the fp16 GEMM reads it."""
    init = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}
    x = _f16(fd["x"])
    mean = x.mean(-1, keepdims=True)
    ln = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + EPS) * init["gamma"] + init.get("beta", 0)
    outs = []
    for i in range(sum(k.startswith("w") for k in init)):
        y = ln @ init[f"w{i}"] + init[f"b{i}"]
        if i == 0 and "s" in init:
            y = y * init["s"]
        outs.append(0.5 * y * (1 + _erf(y / math.sqrt(2))))
    return outs


def _device_fp16(emulated):
    from minirt.session import get_device
    p = get_device().profile
    if not (p.storage16 and p.fp16):
        pytest.skip(f"{p.name}: no 16-bit storage buffers / shaderFloat16")
    if emulated and p.subgroup_size < 8:
        pytest.skip(f"{p.name}: subgroups of {p.subgroup_size} lanes (the emulation needs 8 or more)")


def _check_fp16(m, fd, want, **options):
    with Session(m, storage="buffer", precision="fp16", options={"poison": True, **options}) as s:
        (gemm,) = [d.kernel for d in s.plan.dispatches if d.op == "Linear"]
        assert gemm.startswith(want), gemm
        assert not any(d.op == "LayerNormalization" for d in s.plan.dispatches)
        outs = s.run(None, fd)
    for y, ref in zip(outs, _gelu_reference64(m, fd)):
        err = np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref)
        assert not np.isnan(y).any() and err <= 2e-3, f"{gemm}: relative L2 {err:.3g}"


@pytest.mark.parametrize("emulated", [False, True])
@pytest.mark.parametrize("t,parts", [(70, 3), (37, 1)])
def test_fp16_against_float64(emulated, t, parts):
    """fp16: the scalar half kernel (linear.comp) and the emulated tensor-core kernel (linear_cm.glslh), each with
    ragged M; the latter stages the normalised A as fp16."""
    _device_fp16(emulated)
    m = ln_model(t=t, k=64, n=48, parts=parts, act="Gelu")
    fd = feeds_for(m, offset=4.0)      # fp16 rounds x itself: a large offset would swamp its spread
    _check_fp16(m, fd, "linear_cm_emu_" if emulated else "linear_t", cm_emulate=emulated)


@pytest.mark.parametrize("tile", ["m16n64k64", "m32n32k64", "m64n64k32w8"])
def test_fp16_tensor_core_tiles(tile):
    """Other tiles on the emulated kernel (K = 96: a partial 64-deep slice): 16 to 64 rows for 4 or 8 subgroups, so
    (with lavapipe's 8 lanes) several invocations per row, one, or (the default 64-row tile, above) several rows
    per invocation."""
    _device_fp16(True)
    from minirt.session import get_device
    if cm_shared_bytes(tile) > get_device().profile.max_shared_memory:
        pytest.skip(f"{tile} needs more shared memory than this device has")
    m = ln_model(t=150, k=96, n=64, act="Gelu")
    _check_fp16(m, feeds_for(m, offset=4.0), f"linear_cm_emu_{tile}", cm_emulate=True, cm_tile=tile)


def test_every_tensor_core_tile_has_room_for_the_statistics():
    m = ln_model(act="Gelu")
    for tile in CM_TILES:
        (d,) = [d for d in _plan(m, H200, precision="fp16", cm_tile=tile).dispatches if d.op == "Linear"]
        assert d.kernel == f"linear_cm_{tile}_half" and d.spec[3] == 1


def test_whisper_2_layers_against_onnxruntime():
    model = we.build_whisper_encoder("tiny", layers=2, n_frames=200, seed=11)
    x = we.sample_input(n_frames=200, seed=seed())
    ref = onnxruntime_run(model, {"input_features": x})[0]
    with Session(model, storage="buffer", options={"poison": True}) as s:
        assert sum(d.op == "LayerNormalization" for d in s.plan.dispatches) == 1
        y = s.run(x)
    assert cosine(y, ref) >= 0.99999
    assert float(np.abs(y - ref).max()) <= 1e-3 * float(np.abs(ref).max())
