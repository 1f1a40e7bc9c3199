import numpy as np
import pytest
from onnx import helper

from minirt import Session, UnsupportedError, ops
from oracle import check_model, make_model, onnxruntime_run, rand

BINARY = ["Add", "Sub", "Mul", "Div"]
SHAPES = [((2, 3, 5, 7), (5, 1)), ((7,), (3, 7)), ((1, 6, 1, 5), (2, 1, 3, 1)), ((3, 1, 9), ()), ((13,), (13,))]


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("sa,sb", SHAPES)
def test_binary_broadcasting(op, sa, sb):
    a, b = rand(*sa), rand(*sb, low=0.5, high=2.0)
    m = make_model([helper.make_node(op, ["a", "b"], ["y"])], {"a": sa, "b": sb}, ["y"])
    check_model(m, {"a": a, "b": b})


def test_pow_with_negative_base_and_integer_exponent():
    a = rand(3, 5, 6)
    b = np.array([2.0, 3.0, 0.0, 1.0, -1.0, 2.0], np.float32)
    m = make_model([helper.make_node("Pow", ["a", "b"], ["y"])], {"a": a.shape, "b": b.shape}, ["y"])
    check_model(m, {"a": a, "b": b})


@pytest.mark.parametrize("op,attrs,low,high", [
    ("Sqrt", {}, 0.0, 4.0), ("Erf", {}, -3, 3), ("Relu", {}, -2, 2), ("Sigmoid", {}, -8, 8),
    ("Tanh", {}, -20, 20), ("Gelu", {}, -6, 6), ("Gelu", {"approximate": "tanh"}, -30, 30),
    ("Neg", {}, -1, 1), ("Exp", {}, -3, 3), ("Abs", {}, -1, 1), ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.4}, -5, 5),
    ("HardSwish", {}, -5, 5), ("Log", {}, 0.01, 5), ("Reciprocal", {}, 0.1, 3)])
def test_unary(op, attrs, low, high):
    x = rand(2, 3, 5, 11, low=low, high=high)
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": x.shape}, ["y"], opset=20)
    check_model(m, {"x": x})


@pytest.mark.parametrize("opset, lo, hi", [(6, -0.5, 0.25), (13, 0.0, 6.0), (13, None, 0.5), (13, 0.7, 0.2)])
def test_clip(opset, lo, hi):
    """Bounds as attributes (opset 6) or constant inputs, one left out, and min > max (every value becomes max)."""
    if opset < 11:
        node, inits = helper.make_node("Clip", ["x"], ["y"], min=lo, max=hi), {}
    else:
        inits = {k: np.float32(v) for k, v in (("lo", lo), ("hi", hi)) if v is not None}
        node = helper.make_node("Clip", ["x", "lo" if lo is not None else "", "hi" if hi is not None else ""], ["y"])
    m = make_model([node], {"x": (3, 7)}, ["y"], inits, opset=opset)
    check_model(m, {"x": rand(3, 7, low=-8, high=8)})


def test_clip_bounds_computed_at_run_time_are_refused():
    m = make_model([helper.make_node("Clip", ["x", "lo"], ["y"], name="clip")], {"x": (3, 7), "lo": ()}, ["y"],
                   opset=13)
    with pytest.raises(UnsupportedError, match="Clip node 'clip': min \\('lo'\\) is computed at run time"):
        Session(m)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid", "Relu"])
def test_numpy_reference_matches_onnxruntime(op):
    a = rand(4, 6, low=0.1, high=2.0)
    b = rand(6, low=0.5, high=1.5)
    binary = issubclass(type(ops.OPS[op]), ops.elementwise.Binary)
    names = ["a", "b"] if binary else ["a"]
    node = helper.make_node(op, names, ["y"])
    m = make_model([node], {"a": a.shape, **({"b": b.shape} if binary else {})}, ["y"])
    feeds = {"a": a, **({"b": b} if binary else {})}
    ref = onnxruntime_run(m, feeds)[0]
    from minirt.graph import Node
    got = ops.OPS[op].reference(Node(op, "n", names, ["y"]), *feeds.values())[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
