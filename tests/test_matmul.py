import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper

from minirt import Session, ops
from minirt.errors import UnsupportedError
from minirt.graph import Node
from oracle import check_model, compare, make_model, onnxruntime_run, rand


def shape_id(v):
    return "x".join(map(str, v)) or "scalar" if isinstance(v, tuple) else None


def matmul_model(sa, sb, const):
    """const: "b" (B an initializer: prepacked weights), "a" (A an initializer) or "" (both runtime)."""
    a, b = rand(*sa, seed=1), rand(*sb, seed=2)
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    inits = {"a": a} if const == "a" else {"b": b} if const == "b" else {}
    feeds = {k: v for k, v in {"a": a, "b": b}.items() if k not in inits}
    return make_model([node], {k: v.shape for k, v in feeds.items()}, ["y"], inits), feeds


@pytest.mark.parametrize("const", ["", "b", "a"], ids=["runtime", "constB", "constA"])
@pytest.mark.parametrize("sa,sb", [
    ((37, 19), (19, 23)),                    # nothing a multiple of 4
    ((8, 64), (64, 12)),                     # whole k blocks only
    ((1, 1), (1, 5)), ((6, 3), (3, 1)),      # K tail only; N = 1
    ((7,), (7, 5)), ((5, 7), (7,)), ((7,), (7,)),                         # 1-D operands
    ((9,), (2, 3, 9, 5)), ((2, 3, 5, 9), (9,)), ((3, 5, 9), (9,)),        # 1-D with batches
    ((2, 1, 5, 7), (3, 7, 6)), ((3, 5, 7), (3, 7, 6)), ((3, 5, 7), (1, 7, 6)),   # batched, broadcasting
    ((2, 3, 5, 7), (7, 6)), ((5, 7), (2, 3, 7, 6)), ((2, 1, 5, 7), (1, 3, 7, 6)),
    ((1, 6, 13, 8), (1, 6, 8, 13)), ((1, 6, 13, 13), (1, 6, 13, 8)),    # attention QK^T and AV
    ((2, 5, 13, 9), (2, 1, 9, 6)), ((1, 5, 13, 9), (5, 9, 6)),
], ids=shape_id)
def test_matmul(sa, sb, const):
    check_model(*matmul_model(sa, sb, const))


def test_whisper_like_linear():
    check_model(*matmul_model((1, 150, 384), (384, 1536), "b"))


C_SHAPES = [None, (), (11,), (1, 11), (9, 1), (9, 11)]


@pytest.mark.parametrize("trans_a,trans_b", list(itertools.product([0, 1], repeat=2)))
@pytest.mark.parametrize("c_shape", C_SHAPES, ids=lambda v: "noC" if v is None else "C" + shape_id(v))
@pytest.mark.parametrize("b_const,c_const", [(True, True), (False, False), (True, False)],
                         ids=["constBC", "runtimeBC", "constB"])
def test_gemm(trans_a, trans_b, c_shape, b_const, c_const):
    M, K, N = 9, 13, 11
    a = rand(*((K, M) if trans_a else (M, K)), seed=3)
    b = rand(*((N, K) if trans_b else (K, N)), seed=4)
    vals = {"a": a, "b": b}
    if c_shape is not None:
        vals["c"] = rand(*c_shape, seed=5)
    inits = {k: v for k, v in vals.items() if k == "b" and b_const or k == "c" and c_const}
    feeds = {k: v for k, v in vals.items() if k not in inits}
    node = helper.make_node("Gemm", list(vals), ["y"], transA=trans_a, transB=trans_b, alpha=0.75,
                            beta=1.0 if c_shape == (9, 11) else -1.5)
    check_model(make_model([node], {k: v.shape for k, v in feeds.items()}, ["y"], inits), feeds)


@pytest.mark.parametrize("alpha,beta", [(1.0, 1.0), (2.0, 0.0), (-0.5, 3.0)])
def test_gemm_alpha_beta(alpha, beta):
    a, b, c = rand(6, 10, seed=6), rand(10, 7, seed=7), rand(7, seed=8)
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=alpha, beta=beta)
    check_model(make_model([node], {"a": a.shape}, ["y"], {"b": b, "c": c}), {"a": a})


def test_plan_prepacks_weights_and_declares_cost():
    model, feeds = matmul_model((2, 37, 19), (19, 23), "b")
    with Session(model, storage="buffer") as s:
        (d,) = s.plan.dispatches
        w = s.plan.tensors[d.args[2][0]]
        assert d.family == "gemm" and d.kernel == "matmul_buffer_const"
        assert w.role == "weight" and w.data.size == 20 * 24      # K and N padded to 4
        assert d.flops == 2 * 2 * 37 * 23 * 19


def test_rank_5_is_refused_at_load():
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="deep_mm")
    m = make_model([node], {"a": (1, 2, 1, 3, 4), "b": (4, 5)}, ["y"])
    with pytest.raises(UnsupportedError, match="deep_mm"):
        Session(m, storage="buffer")


@pytest.mark.parametrize("sa,sb", [((5, 7), (7, 3)), ((7,), (7, 3)), ((5, 7), (7,)), ((2, 1, 5, 7), (3, 7, 6))],
                         ids=shape_id)
def test_matmul_reference_matches_onnxruntime(sa, sb):
    (model, feeds) = matmul_model(sa, sb, "")
    got = ops.OPS["MatMul"].reference(None, feeds["a"], feeds["b"])[0]
    np.testing.assert_allclose(got, onnxruntime_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_matmul_reference_int64():
    a, b = np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2)
    node = helper.make_node("MatMul", ["a", "b"], ["y"])
    g = helper.make_graph([node], "t", [helper.make_tensor_value_info(n, TensorProto.INT64, [None, None])
                                        for n in "ab"], [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    got = ops.OPS["MatMul"].reference(None, a, b)[0]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, onnxruntime_run(m, {"a": a, "b": b})[0])


@pytest.mark.parametrize("trans_a,trans_b,c_shape", [(0, 0, (4,)), (1, 1, (3, 1)), (1, 0, ()), (0, 1, None)])
def test_gemm_reference_matches_onnxruntime(trans_a, trans_b, c_shape):
    vals = {"a": rand(*((5, 3) if trans_a else (3, 5)), seed=9), "b": rand(*((4, 5) if trans_b else (5, 4)), seed=10)}
    if c_shape is not None:
        vals["c"] = rand(*c_shape, seed=11)
    attrs = dict(transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)
    model = make_model([helper.make_node("Gemm", list(vals), ["y"], **attrs)], {k: v.shape for k, v in vals.items()},
                       ["y"])
    got = ops.OPS["Gemm"].reference(Node("Gemm", "g", list(vals), ["y"], attrs), *vals.values())[0]
    np.testing.assert_allclose(got, onnxruntime_run(model, vals)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sa,sb,rows", [((2, 9, 7), (7, 6), 1), ((2, 3, 5, 7), (7, 6), 1), ((9, 7), (7, 6), 9)],
                         ids=shape_id)
def test_fused_bias(monkeypatch, sa, sb, rows):
    """The kernel's bias (for a planner that fuses MatMul + Add): out = a @ b + bias[min(m, rows - 1), n]."""
    from minirt.ops import matmul
    bias = rand(rows, sb[1], seed=12)

    def lower(node, ctx):
        b = ctx.graph.tensor(node.inputs[1]).data
        matmul.matmul_dispatch(ctx, ctx.t(node.outputs[0]), ctx.t(node.inputs[0]), b, bias=bias)

    monkeypatch.setattr(ops.OPS["MatMul"], "lower", lower)
    model, feeds = matmul_model(sa, sb, "b")
    ref = onnxruntime_run(model, feeds)[0] + bias
    for st in ("buffer", "texture"):
        with Session(model, storage=st, options={"poison": True, "fuse_linear": False}) as s:
            compare(s.run(None, feeds)[0], ref, what=st)
