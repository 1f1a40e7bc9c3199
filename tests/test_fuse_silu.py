"""fuse_silu: Mul(x, Sigmoid(x)) becomes one Silu, which joins the epilogue of the conv (im2col, pointwise,
depthwise) or Linear before it, or runs alone on the unary kernel; a gate Mul(y, Sigmoid(x)) and a Sigmoid with
another reader stay. Against onnxruntime in both storages with poisoned activations."""
import numpy as np
import pytest
from onnx import helper

from minirt import Session, ops
from minirt.graph import Node
from minirt.kernels import ACTIVATIONS, activate
from oracle import check_model, graph_after, make_model, rand


def swish(x, y, order=0, name="s"):
    """y = x * Sigmoid(x), the Mul's operands in either order."""
    ins = [x, f"{name}_g"][::-1 if order else 1]
    return [helper.make_node("Sigmoid", [x], [f"{name}_g"]), helper.make_node("Mul", ins, [y], name=f"{name}_mul")]


def conv_model(cout, cin, k, group=1, order=0):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", group=group, pads=[k // 2] * 4)]
    nodes += swish("c", "y", order)
    inits = {"w": rand(cout, cin // group, k, k, seed=1), "b": rand(cout, seed=2)}
    return make_model(nodes, {"x": (1, cin, 9, 11)}, ["y"], inits), {"x": rand(1, cin, 9, 11, seed=3, low=-4, high=4)}


@pytest.mark.parametrize("cout, cin, k, group, order, route", [(128, 16, 3, 1, 1, "im2col"),
                                                               (24, 16, 1, 1, 0, "linear"),
                                                               (16, 16, 3, 16, 1, "depthwise")])
def test_silu_joins_the_conv_epilogue(cout, cin, k, group, order, route):
    model, feeds = conv_model(cout, cin, k, group, order)
    g = graph_after(model, {"x": (1, cin, 9, 11)}, "fuse_activation")
    conv = [n for n in g.nodes if n.op == "Conv"]
    assert [n.op for n in g.nodes] == ["Conv"] and conv[0].attrs["_route"] == route
    assert conv[0].attrs["_act"] == "silu" and conv[0].outputs == ["y"]
    check_model(model, feeds)
    with Session(model, storage="buffer") as s:
        # (a 1x1 conv on the Linear route reads its NCHW graph input through one Transpose to channels-last)
        assert {d.op for d in s.plan.dispatches} <= {"Conv", "Transpose"}, [d.op for d in s.plan.dispatches]


def test_silu_joins_a_linear_and_runs_alone():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"])]
    nodes += swish("hb", "a", order=1, name="s1")
    nodes += [helper.make_node("Add", ["a", "x2"], ["r"])] + swish("r", "y", name="s2")
    model = make_model(nodes, {"x": (1, 6, 8), "x2": (1, 6, 12)}, ["y"],
                       {"w": rand(8, 12, seed=4), "b": rand(12, seed=5)}, opset=20)
    g = graph_after(model, {"x": (1, 6, 8), "x2": (1, 6, 12)}, "fuse_linear")
    assert [n.op for n in g.nodes] == ["Linear", "Silu"], [n.op for n in g.nodes]
    assert g.nodes[0].attrs["act"] == "silu"
    check_model(model, {"x": rand(1, 6, 8, seed=6, low=-3, high=3), "x2": rand(1, 6, 12, seed=7, low=-3, high=3)})


def test_gates_and_shared_sigmoids_stay():
    nodes = [helper.make_node("Sigmoid", ["x"], ["g"]), helper.make_node("Mul", ["z", "g"], ["gated"]),  # a gate
             helper.make_node("Sigmoid", ["z"], ["h"]), helper.make_node("Mul", ["z", "h"], ["s"]),
             helper.make_node("Add", ["h", "s"], ["hs"]),                          # the Sigmoid read twice
             helper.make_node("Add", ["gated", "hs"], ["y"])]
    model = make_model(nodes, {"x": (2, 8), "z": (2, 8)}, ["y"])
    g = graph_after(model, {"x": (2, 8), "z": (2, 8)}, "fuse_silu")
    assert sorted(n.op for n in g.nodes) == ["Add", "Add", "Mul", "Mul", "Sigmoid", "Sigmoid"]
    check_model(model, {"x": rand(2, 8, seed=8), "z": rand(2, 8, seed=9)})


def test_silu_reference_and_codes():
    node = Node("Silu", "n", ["x"], ["y"], {}, "minirt")
    op = ops.get("Silu", "minirt")
    assert op.code_for(node) == ACTIVATIONS["silu"].unary
    x = np.array([-np.inf, -100, -4, -0.5, 0, 0.5, 4, 100, np.inf, np.nan], np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x * (1 / (1 + np.exp(-x.astype(np.float64))))
    np.testing.assert_allclose(op.reference(node, x)[0], ref.astype(np.float32), rtol=1e-6, atol=1e-37)
    np.testing.assert_array_equal(np.asarray(activate(x, "silu"), np.float32), op.reference(node, x)[0])


def test_option_turns_it_off():
    model, _ = conv_model(24, 16, 1)
    g = graph_after(model, {"x": (1, 16, 9, 11)}, "fuse_activation", fuse_silu=False)
    assert [n.op for n in g.nodes] == ["Conv", "Sigmoid", "Mul"]
