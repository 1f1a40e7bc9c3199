"""Weight-only int8 Linears (glsl/linear.comp and linear_rows.comp, variant w=i8; minirt/ops/int8_weight.py) and the
fold_dequantize_linear pass that gives them a QDQ model's weights. Kernels against a float64 numpy reference on the
dequantized weights (fresh random inputs, poisoned activations, fp32 and fp16, few rows and the tiled GEMM); the plan
holds the weight as int8 (a byte an element, plus its scales) and no float copy of it; the rewrite is checked on the
graph itself; onnxruntime's own quantizers' models against onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from minirt import Session
from minirt.errors import ModelError
from minirt.infer import prepare
from minirt.loaders import load
from minirt.options import Options
from minirt.planner import fold_dequantize_linear
from oracle import compare, make_model, onnxruntime_run


def qdq_linear(m, k, n, *, seed, dtype=np.int8, per_column=True, zero=False, act=False, residual=False,
               rows_dims=(1,)):
    """x [*rows_dims, m, k] @ DequantizeLinear(W q [k, n]) + b (then Gelu, + r): (model, feeds, float64 W)."""
    rng = np.random.default_rng(seed)
    lo, hi = (-127, 128) if dtype == np.int8 else (0, 256)
    q = rng.integers(lo, hi, size=(k, n)).astype(dtype)
    s = (rng.uniform(0.5, 2.0, size=n if per_column else 1) / (64 * np.sqrt(k))).astype(np.float32)
    inits = {"q": q, "s": s, "b": rng.standard_normal(n).astype(np.float32)}
    dq_in = ["q", "s"]
    zp = np.zeros(s.shape, dtype)
    if zero:
        zp = rng.integers(-20 if dtype == np.int8 else 100, 20 if dtype == np.int8 else 156, size=s.shape).astype(dtype)
        inits["z"] = zp
        dq_in.append("z")
    nodes = [helper.make_node("DequantizeLinear", dq_in, ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"])]
    cur, inputs = "hb", {"x": (*rows_dims, m, k)}
    if act:
        nodes.append(helper.make_node("Relu", [cur], ["ha"]))
        cur = "ha"
    if residual:
        nodes.append(helper.make_node("Add", [cur, "r"], ["y"]))
        inputs["r"] = (*rows_dims, m, n)
    else:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    model = make_model(nodes, inputs, ["y"], inits, opset=17)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}
    w = (q.astype(np.float64) - zp.astype(np.float64)) * s.astype(np.float64)
    return model, feeds, w, inits["b"]


def reference(feeds, w, b, act, residual):
    y = feeds["x"].astype(np.float64) @ w + b
    if act:
        y = np.maximum(y, 0)
    return y + feeds["r"] if residual else y


def int8_weights(plan):
    return {n: t for n, t in plan.tensors.items() if t.dtype == "int8"}


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("m,k,n,act,residual,kernel", [
    (1, 36, 37, False, False, "linear_rows"),      # a decoder step's one row; N not a multiple of 4
    (5, 132, 64, True, True, "linear_rows"),       # beams: activation and residual in the epilogue
    (20, 68, 45, True, True, "linear_t44"),        # the tiled GEMM: rows past the few-row kernel
])
def test_int8_linear_kernels(precision, m, k, n, act, residual, kernel):
    model, feeds, w, b = qdq_linear(m, k, n, seed=m * 7 + n, act=act, residual=residual)
    # coopmat off: on a device with tensor cores the 20-row case runs on linear_cm's w=i8 variant at fp16
    # (test_int8_on_the_tensor_core_gemm, emulated)
    with Session(model, storage="buffer", options={"poison": True, "precision": precision, "coopmat": "off"}) as s:
        lin = [d for d in s.plan.dispatches if d.op == "Linear"]
        assert len(lin) == 1 and lin[0].kernel.startswith(kernel) and "_i8" in lin[0].kernel, lin[0].kernel
        # the weight is int8 on the GPU, K rows of whole vec4 columns a byte each, and no float copy of it is planned
        (q,) = int8_weights(s.plan).values()
        assert q.nbytes == k * -(-n // 4) * 4 and q.role == "weight"
        assert not any(t.data is not None and t.numel >= k * n and t.dtype != "int8" for t in s.plan.tensors.values())
        got = s.run(None, feeds)[0]
    compare(got, reference(feeds, w, b, act, residual), 1e-5 if precision == "fp32" else 4e-3, f"{kernel} {precision}")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("m,opts", [
    (1, {"gemm_splitk": 3}),                           # K split across groups: the scale applied before the partials
    (2, {"rows_columns": 4, "local_size": (3, 5, 1)}),  # 16 columns a lane; a group that is no power of two
    (8, {"rows_columns": 1}),                          # the most rows, a column a lane
    (5, {"gemm_splitk": 2, "rows_columns": 2}),        # beams, split
    (1, {"n": 208}),                                   # 52 vec4 columns: 16-byte loads of 4 (VEC)
    (3, {"n": 208, "gemm_splitk": 2, "local_size": (3, 5, 1)}),
    (5, {"n": 208}),                                   # beams: 2 columns a lane, 8-byte loads of 2
])
def test_int8_rows_layouts(precision, m, opts):
    """The few-row kernel's layouts (rows_columns, gemm_splitk, group shapes, 16-byte loads) on int8 weights with zero
    points: 65 vec4 rows of K and 19 or 52 vec4 columns (neither whole groups nor whole splits), ReLU and the
    residual."""
    opts = dict(opts)
    n = opts.pop("n", 75)
    model, feeds, w, b = qdq_linear(m, 260, n, seed=40 + m, zero=True, act=True, residual=True)
    with Session(model, storage="buffer", options={"poison": True, "precision": precision, **opts}) as s:
        (d,) = [d for d in s.plan.dispatches if d.op == "Linear" and d.kernel.startswith("linear_rows")]
        assert "_i8" in d.kernel and d.info["splits"] == opts.get("gemm_splitk", 1)
        assert d.info["vec"] == (n == 208 and d.info["cv"] > 1)
        got = s.run(None, feeds)[0]
    compare(got, reference(feeds, w, b, True, True), 1e-5 if precision == "fp32" else 4e-3, f"{m} rows {opts}")


@pytest.mark.parametrize("dtype,per_column,zero", [(np.uint8, True, True), (np.int8, False, True),
                                                   (np.uint8, False, False)])
def test_zero_points_and_per_tensor_scales(dtype, per_column, zero):
    """uint8 weights (stored as int8 less 128, their zero point moved alike) and per-tensor scales, against
    onnxruntime and the float64 reference."""
    model, feeds, w, b = qdq_linear(3, 40, 24, seed=5, dtype=dtype, per_column=per_column, zero=zero)
    with Session(model, storage="buffer", options={"poison": True}) as s:
        assert int8_weights(s.plan)
        got = s.run(None, feeds)[0]
    compare(got, reference(feeds, w, b, False, False), 1e-5)
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5)


def test_gemm_trans_b():
    """Gemm(x, DequantizeLinear(W [N, K], axis 0), C) with alpha, beta and transB: the int8 weight transposed, alpha
    in the scales, beta in the bias."""
    rng = np.random.default_rng(11)
    k, n = 32, 20
    inits = {"q": rng.integers(-127, 128, size=(n, k)).astype(np.int8),
             "s": rng.uniform(0.001, 0.01, n).astype(np.float32), "c": rng.standard_normal(n).astype(np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0),
             helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)]
    model = make_model(nodes, {"x": (2, k)}, ["y"], inits)
    feeds = {"x": rng.standard_normal((2, k)).astype(np.float32)}
    with Session(model, storage="buffer", options={"poison": True}) as s:
        assert [d.kernel for d in s.plan.dispatches] == ["linear_rows_i8"]
        got = s.run(None, feeds)[0]
    w = inits["q"].astype(np.float64).T * inits["s"]
    compare(got, 0.5 * feeds["x"].astype(np.float64) @ w + 2.0 * inits["c"], 1e-5)


def _siblings(t, seed=2):
    """q, k, v projections of one input, each an int8 QDQ MatMul + bias."""
    rng = np.random.default_rng(seed)
    d = 16
    nodes, inits, outs, ws = [], {}, [], []
    for p in "qkv":
        q = rng.integers(-127, 128, size=(d, d)).astype(np.int8)
        s = rng.uniform(0.002, 0.02, d).astype(np.float32)
        inits.update({f"{p}q": q, f"{p}s": s, f"{p}b": rng.standard_normal(d).astype(np.float32)})
        nodes += [helper.make_node("DequantizeLinear", [f"{p}q", f"{p}s"], [f"{p}w"], axis=1),
                  helper.make_node("MatMul", ["x", f"{p}w"], [f"{p}h"], name=f"/attn/{p}_proj/MatMul"),
                  helper.make_node("Add", [f"{p}h", f"{p}b"], [p])]
        outs.append(p)
        ws.append((q.astype(np.float64) * s, inits[f"{p}b"]))
    model = make_model(nodes, {"x": (1, t, d)}, outs, inits)
    return model, {"x": rng.standard_normal((1, t, d)).astype(np.float32)}, ws


@pytest.mark.parametrize("t", [1, 16])
def test_merged_int8_siblings(t):
    """q, k and v with int8 weights merge into one int8 GEMM (their weights and column scales side by side)."""
    model, feeds, ws = _siblings(t)
    with Session(model, storage="buffer", options={"poison": True}) as s:
        lin = [d for d in s.plan.dispatches if d.op == "Linear"]
        assert len(lin) == 1 and "_i8" in lin[0].kernel
        (q,) = int8_weights(s.plan).values()
        assert q.nbytes == 16 * 48
        got = s.run(None, feeds)
    for g, (w, b) in zip(got, ws):
        compare(g, feeds["x"].astype(np.float64) @ w + b, 1e-5)


def _prepared(model):
    return prepare(load(model))


def test_rewrite_on_the_graph():
    """The pass replaces DequantizeLinear + MatMul by one Linear whose weight is the int8 constant itself, with the
    scales as its input 4; fuse_linear then takes the bias and residual into it."""
    model, _, _, _ = qdq_linear(2, 8, 12, seed=1, dtype=np.uint8, zero=True, residual=True)
    g = _prepared(model)
    assert [n.op for n in g.nodes][:2] == ["DequantizeLinear", "MatMul"]     # kept int8 at load, not folded
    g = fold_dequantize_linear.rewrite(g, Options.make({}))
    assert "DequantizeLinear" not in [n.op for n in g.nodes]
    (lin,) = [n for n in g.nodes if n.op == "Linear"]
    w, s, z = (g.tensor(lin.inputs[i]) for i in (1, 4, 5))
    assert w.data.dtype == np.int8 and w.data.shape == (8, 12) and s.data.shape == (12,) and z.data.shape == (12,)
    from minirt.planner import fuse_linear
    g = fuse_linear.rewrite(g, Options.make({}))
    (lin,) = [n for n in g.nodes if n.op == "Linear"]
    assert lin.inputs[2] == "b" and lin.inputs[3] == "r" and g.tensor(lin.inputs[1]).data.dtype == np.int8


def test_blocked_and_other_readers_fold_to_float():
    """A blocked DequantizeLinear (opset 21) has no per-column form: folded to float, with a note, and the result is
    still onnxruntime's."""
    rng = np.random.default_rng(4)
    k, n, blk = 16, 8, 8
    inits = {"q": rng.integers(-127, 128, size=(k, n)).astype(np.int8),
             "s": rng.uniform(0.01, 0.02, size=(k // blk, n)).astype(np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0, block_size=blk),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model(nodes, {"x": (1, 3, k)}, ["y"], inits, opset=21)
    g = fold_dequantize_linear.rewrite(_prepared(model), Options.make({}))
    assert [n.op for n in g.nodes] == ["MatMul"] and g.tensor(g.nodes[0].inputs[1]).data.dtype == np.float32
    assert any("folded to a float constant" in t for v in g.notes.values() for t in v)
    feeds = {"x": rng.standard_normal((1, 3, k)).astype(np.float32)}
    with Session(model, storage="buffer") as s:
        compare(s.run(None, feeds)[0], onnxruntime_run(model, feeds)[0], 1e-5)


def test_bad_quantization_parameters_name_the_tensor():
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, size=(8, 4)).astype(np.int8)
    bad_zero = make_model([helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], axis=1),
                           helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (1, 8)}, ["y"],
                          {"q": q, "s": np.ones(4, np.float32), "z": np.zeros(4, np.uint8)})
    with pytest.raises(ModelError, match="uint8 'z'"):
        Session(bad_zero)
    bad_scale = make_model([helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=1),
                            helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (1, 8)}, ["y"],
                           {"q": q, "s": np.ones(3, np.float32)})
    with pytest.raises(ModelError, match="scale 's'"):
        Session(bad_scale)


def _matmul_model(k=32, n=24, t=4, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    return make_model(nodes, {"x": (1, t, k)}, ["y"], {"w": w}, opset=17), rng


def test_onnxruntime_quantize_static_qdq(tmp_path):
    """quantize_static's QDQ format, weights only (per channel), as onnxruntime writes it: runs with int8 weights, as
    onnxruntime runs it."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    model, rng = _matmul_model()
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    src.write_bytes(model.SerializeToString())

    class Data(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": rng.standard_normal((1, 4, 32)).astype(np.float32)} for _ in range(2)])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(src), str(dst), Data(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                    extra_options={"ActivationSymmetric": True, "WeightSymmetric": True,
                                   "QDQOpTypePerChannelSupportToAxis": {"MatMul": 1}},
                    nodes_to_exclude=[])
    import onnx
    q = onnx.load(str(dst))
    # weight-only: drop the activations' Q/DQ pairs (minirt runs activations in float), keep the weight's
    keep = _weight_only(q)
    feeds = {"x": rng.standard_normal((1, 4, 32)).astype(np.float32)}
    with Session(keep.SerializeToString(), storage="buffer", options={"poison": True}) as s:
        assert int8_weights(s.plan)
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(keep, feeds)[0], 1e-5)


def _weight_only(model):
    """A QDQ model with the Q/DQ pairs of its activations bypassed (the weights' DequantizeLinear kept)."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    rename, nodes = {}, []
    for nd in g.node:
        if nd.op_type == "QuantizeLinear" and nd.input[0] not in inits:
            rename[nd.output[0]] = nd.input[0]
            continue
        if nd.op_type == "DequantizeLinear" and nd.input[0] in rename:
            rename[nd.output[0]] = rename[nd.input[0]]
            continue
        nodes.append(nd)
    for nd in nodes:
        for i, name in enumerate(nd.input):
            if name in rename:
                nd.input[i] = rename[name]
    del g.node[:]
    g.node.extend(nodes)
    for o in g.output:
        assert o.name not in rename
    return model



@pytest.mark.parametrize("m", [1, 12])
def test_quantize_weights_option(m):
    """Session option quantize_weights="int8": a float model's Linear weight quantized per column at planning, as
    minirt.quant.quantize_rows quantizes a row of W^T; against the float64 reference on those weights."""
    from minirt.quant import quantize_rows
    from oracle import linear_case
    model, feeds = linear_case(m, 24, 36, True, True, seed=m)
    inits = {i.name: np.asarray(__import__("onnx").numpy_helper.to_array(i)) for i in model.graph.initializer}
    with Session(model, storage="buffer", options={"poison": True, "quantize_weights": "int8"}) as s:
        (d,) = [d for d in s.plan.dispatches if d.op == "Linear"]
        assert "_i8" in d.kernel and int8_weights(s.plan)
        assert any("quantize_weights int8" in n for v in s.plan.notes.values() for n in v)
        got = s.run(None, feeds)[0]
    from minirt.kernels import activate
    wq = np.asarray(quantize_rows(inits["w"].T), np.float64).T
    ref = activate(feeds["x"].astype(np.float64) @ wq + inits["b"], "gelu") + feeds["r"]
    compare(got, ref, 1e-5)
    compare(got, onnxruntime_run(model, feeds)[0], 2e-2, "near the float model")


@pytest.mark.parametrize("t", [1, 16])
def test_quantize_weights_merges_siblings(t):
    """q, k and v quantized by the option still merge into one int8 GEMM."""
    from test_merge_siblings import qkv_feeds, qkv_model
    model, feeds = qkv_model(t=t), qkv_feeds(t=t)
    with Session(model, storage="buffer", options={"poison": True, "quantize_weights": "int8"}) as s:
        lin = [d for d in s.plan.dispatches if d.op == "Linear"]
        assert len(lin) == 1 and "_i8" in lin[0].kernel
        got = s.run(None, feeds)
    for out, r in zip(got, onnxruntime_run(model, feeds)):
        compare(out, r, 2e-2, "near the float model")


@pytest.mark.parametrize("splitk", [None, 2])
def test_int8_on_the_tensor_core_gemm(splitk):
    """At fp16, a GEMM of many rows with an int8 weight runs the tensor-core kernel's w=i8 variant (the weight
    dequantized into its fp16 stages; here the emulated kernel, coopmat=emulate), unsplit and with K split."""
    from minirt.session import get_device
    if get_device().profile.subgroup_size not in (8, 16, 32):
        pytest.skip("the emulated tensor-core kernel needs subgroups of 8, 16 or 32 lanes")
    model, feeds, w, b = qdq_linear(70, 64, 72, seed=9, act=True, residual=True)
    opts = {"poison": True, "precision": "fp16", "coopmat": "emulate", "cm_tile": "m64n64k32s1",
            **({"gemm_splitk": splitk} if splitk else {})}
    with Session(model, storage="buffer", options=opts) as s:
        kernels = [d.kernel for d in s.plan.dispatches if d.op == "Linear"]
        want = "linear_cm_emu_split_m64n64k32s1_i8_half" if splitk else "linear_cm_emu_m64n64k32s1_i8_half"
        assert want in kernels, kernels
        (q,) = int8_weights(s.plan).values()
        assert q.nbytes == 64 * 72
        got = s.run(None, feeds)[0]
    compare(got, reference(feeds, w, b, True, True), 4e-3, "tensor-core int8")
