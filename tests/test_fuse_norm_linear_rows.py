"""fuse_norm_linear_rows (minirt/planner/fuse_norm_linear_rows.py): on the plan, a LayerNorm read only by a
few-row Linear goes into that Linear (glsl/linear_rows.comp, LN). The plans themselves (which dispatches go, what the
fused one reads, where the pass must not apply), then values against onnxruntime with poisoned outputs: 1 to 8 rows
(one and two passes of the kernel's four-row statistics), K longer than a group's invocations, no LayerNorm bias, a
group shape whose size is not a power of two, rows far from zero, fp16, K split across groups and other layouts of
the kernel; the same bits on a second run."""
import numpy as np
import pytest
from onnx import helper

from minirt import Session
from oracle import compare, make_model, onnxruntime_run


def norm_linear(m, k, n, *, bias=True, act=False, residual=False, extra_reader=False, seed=0):
    """x [1, m, k] -> LayerNorm -> @ w + b (-> Gelu) (+ r); extra_reader: the LayerNorm's output is also a graph
    output. Returns (model, feeds)."""
    rng = np.random.default_rng(seed)
    ln_in = ["x", "gamma"] + (["beta"] if bias else [])
    nodes = [helper.make_node("LayerNormalization", ln_in, ["h"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["h", "w"], ["hw"]), helper.make_node("Add", ["hw", "b"], ["y0"])]
    cur, inputs = "y0", {"x": (1, m, k)}
    if act:
        nodes.append(helper.make_node("Gelu", [cur], ["y1"]))
        cur = "y1"
    if residual:
        nodes.append(helper.make_node("Add", [cur, "r"], ["y2"]))
        cur, inputs["r"] = "y2", (1, m, n)
    nodes.append(helper.make_node("Identity", [cur], ["y"]))
    consts = {"gamma": (1 + 0.3 * rng.standard_normal(k)).astype(np.float32),
              "w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
              "b": rng.standard_normal(n).astype(np.float32)}
    if bias:
        consts["beta"] = rng.standard_normal(k).astype(np.float32)
    model = make_model(nodes, inputs, ["y"] + (["h"] if extra_reader else []), consts, opset=20)
    return model, {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}


def plan_of(model, **options):
    from minirt.infer import prepare
    from minirt.loaders import load
    from minirt.planner import make_plan
    from minirt.session import get_device
    return make_plan(prepare(load(model)), get_device().profile, "buffer", options)


def test_the_layer_norm_dispatch_goes():
    model, _ = norm_linear(3, 64, 40)
    plan = plan_of(model)
    (d,) = plan.dispatches
    assert d.kernel == "linear_rows" and d.args[1][0] == "x" and d.info["ln"]
    assert d.spec[2:4] == (1, 1)                      # LN, LN_BIAS
    assert "h" not in plan.lifetimes                  # the LayerNorm's output is never allocated
    assert any("folded into this few-row Linear" in n for notes in plan.notes.values() for n in notes)
    off = plan_of(model, fuse_norm_linear_rows=False)
    assert [x.kernel for x in off.dispatches] == ["layer_norm_rows", "linear_rows"]
    assert off.dispatches[1].spec[2] == 0              # LN off


@pytest.mark.parametrize("why, kw", [("the output is read elsewhere", dict(extra_reader=True)),
                                     ("nine rows: the tiled GEMM", dict(m=9))])
def test_where_it_does_not_apply(why, kw):
    model, _ = norm_linear(kw.pop("m", 3), 64, 40, **kw)
    assert "layer_norm_rows" in [d.kernel for d in plan_of(model).dispatches], why


@pytest.mark.parametrize("m, k, n, kw", [
    (1, 384, 96, {}),                                   # a decoder step's row
    (5, 132, 37, dict(act=True, residual=True)),        # beams: two passes of four rows' statistics
    (8, 1540, 64, dict(bias=False)),                    # K beyond a group's 256 invocations; no LayerNorm bias
])
def test_matches_onnxruntime(m, k, n, kw):
    model, feeds = norm_linear(m, k, n, seed=m + k, **kw)
    ref = onnxruntime_run(model, feeds)[0]
    with Session(model, storage="buffer", options={"poison": True}) as s:
        assert [d.kernel for d in s.plan.dispatches] == ["linear_rows"]
        got = s.run(None, feeds)[0]
        again = s.run(None, feeds)[0]
    compare(got, ref, 1e-5, "fused LayerNorm + linear_rows")
    assert got.tobytes() == again.tobytes()


@pytest.mark.parametrize("m,opts", [
    (1, {"gemm_splitk": 3}),                              # K split across groups: each normalises the whole row
    (6, {"gemm_splitk": 2, "rows_columns": 4}),
    (4, {"rows_columns": 1, "local_size": (3, 5, 1)}),   # 15 invocations: the statistics' tree over no power of two
])
def test_layouts(m, opts):
    model, feeds = norm_linear(m, 260, 75, act=True, residual=True, seed=60 + m)
    with Session(model, storage="buffer", options={"poison": True, **opts}) as s:
        split = ["linear_reduce"] if "gemm_splitk" in opts else []
        assert [d.kernel for d in s.plan.dispatches] == ["linear_rows"] + split
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5, f"fused LayerNorm, {m} rows {opts}")


def float64_reference(model, x):
    from onnx import numpy_helper
    c = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    h = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * c["gamma"] + c.get("beta", 0.0)
    return h @ c["w"] + c["b"]


def test_odd_group_and_rows_far_from_zero():
    """A 24 x 8 group (192 invocations: the statistics' tree is not over a power of two) and rows about 1e4 with a
    spread of 1 (the two passes about the row's first element keep the variance), against float64: onnxruntime's
    float32 LayerNorm is off by 3e-4 of max |y| here, minirt's (fused or not) by 1e-7."""
    model, feeds = norm_linear(3, 260, 30, seed=9)
    feeds["x"] = (1e4 + feeds["x"]).astype(np.float32)
    ref = float64_reference(model, feeds["x"])
    with Session(model, storage="buffer", options={"poison": True, "local_size": (24, 8, 1),
                                                   "local_size_families": ("gemm",)}) as s:
        assert [d.local_size for d in s.plan.dispatches] == [(24, 8, 1)]
        compare(s.run(None, feeds)[0], ref, 1e-4, "24 x 8 group, offset rows")


def test_fp16():
    from minirt.session import get_device
    if not get_device().profile.storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    model, feeds = norm_linear(2, 128, 48, act=True, seed=4)
    ref = onnxruntime_run(model, feeds)[0]
    with Session(model, storage="buffer", precision="fp16", options={"poison": True}) as s:
        assert [d.kernel for d in s.plan.dispatches if d.op == "Linear"] == ["linear_rows_half"]
        assert "layer_norm_rows_half" not in [d.kernel for d in s.plan.dispatches]
        got = s.run(None, feeds)[0]
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert rel <= 2e-3, f"fp16: relative L2 {rel:.2e}"
