"""fuse_gelu on the graph: every spelling of the Erf GELU pattern becomes one Gelu; near misses stay."""
import math

import pytest
from onnx import helper

from minirt.options import Options
from minirt.infer import prepare
from minirt.loaders import load
from minirt.planner import fuse_gelu
from oracle import check_model, make_model, rand


def gelu_nodes(variant):
    c = lambda name, v: helper.make_node("Constant", [], [name], value_float=v)  # noqa: E731
    if variant == "torch":      # Div -> Erf -> Add -> Mul(x) -> Mul(0.5)
        return [c("s2", math.sqrt(2)), c("one", 1.0), c("half", 0.5), helper.make_node("Div", ["x", "s2"], ["d"]),
                helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
                helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    if variant == "half_first":  # (x * 0.5) * (1 + erf(x * 1/sqrt2))
        return [c("r2", 1 / math.sqrt(2)), c("one", 1.0), c("half", 0.5), helper.make_node("Mul", ["x", "r2"], ["d"]),
                helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["one", "e"], ["a"]),
                helper.make_node("Mul", ["half", "x"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    if variant == "wrong_constant":
        return [c("s2", 1.5), c("one", 1.0), c("half", 0.5), helper.make_node("Div", ["x", "s2"], ["d"]),
                helper.make_node("Erf", ["d"], ["e"]), helper.make_node("Add", ["e", "one"], ["a"]),
                helper.make_node("Mul", ["x", "a"], ["m"]), helper.make_node("Mul", ["m", "half"], ["y"])]
    raise ValueError(variant)


@pytest.mark.parametrize("variant", ["torch", "half_first"])
def test_pattern_becomes_one_gelu(variant):
    m = make_model(gelu_nodes(variant), {"x": (3, 17)}, ["y"])
    g = fuse_gelu.rewrite(prepare(load(m)), Options())
    assert [n.op for n in g.nodes] == ["Gelu"]
    assert g.nodes[0].inputs == ["x"] and g.nodes[0].outputs == ["y"]
    check_model(m, {"x": rand(3, 17, low=-4, high=4)})


def test_near_miss_is_left_alone():
    m = make_model(gelu_nodes("wrong_constant"), {"x": (3, 17)}, ["y"])
    g = fuse_gelu.rewrite(prepare(load(m)), Options())
    assert "Gelu" not in [n.op for n in g.nodes] and "Erf" in [n.op for n in g.nodes]


def test_intermediate_with_another_reader_blocks_fusion():
    nodes = gelu_nodes("torch") + [helper.make_node("Relu", ["e"], ["z"])]
    m = make_model(nodes, {"x": (3, 17)}, ["y", "z"])
    g = fuse_gelu.rewrite(prepare(load(m)), Options())
    assert "Erf" in [n.op for n in g.nodes]


def tanh_gelu_nodes(half_first=True, cubic=0.044715, extra_reader=False):
    """GPT-2's gelu_new as both exporters write it: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    c = lambda name, v: helper.make_node("Constant", [], [name], value_float=v)  # noqa: E731
    nodes = [c("three", 3.0), c("k", cubic), c("s", math.sqrt(2 / math.pi)), c("one", 1.0), c("half", 0.5),
             helper.make_node("Pow", ["x", "three"], ["p"]), helper.make_node("Mul", ["p", "k"], ["pk"]),
             helper.make_node("Add", ["x", "pk"], ["i"]), helper.make_node("Mul", ["i", "s"], ["is"]),
             helper.make_node("Tanh", ["is"], ["t"]), helper.make_node("Add", ["t", "one"], ["a"])]
    if half_first:      # (x * 0.5) * (1 + tanh)
        nodes += [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Mul", ["h", "a"], ["y"])]
    else:               # x * (1 + tanh) then * 0.5
        nodes += [helper.make_node("Mul", ["a", "x"], ["m"]), helper.make_node("Mul", ["half", "m"], ["y"])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["t"], ["z"]))
    return nodes


@pytest.mark.parametrize("half_first", [True, False])
def test_tanh_pattern_becomes_one_gelu(half_first):
    m = make_model(tanh_gelu_nodes(half_first), {"x": (3, 17)}, ["y"])
    g = fuse_gelu.rewrite(prepare(load(m)), Options())
    assert [n.op for n in g.nodes] == ["Gelu"] and g.nodes[0].attrs["approximate"] == "tanh"
    assert g.nodes[0].inputs == ["x"] and g.nodes[0].outputs == ["y"]
    check_model(m, {"x": rand(3, 17, low=-5, high=5)})


def test_tanh_near_misses_are_left_alone():
    for nodes, outs in ((tanh_gelu_nodes(cubic=0.05), ["y"]), (tanh_gelu_nodes(extra_reader=True), ["y", "z"])):
        m = make_model(nodes, {"x": (3, 17)}, outs)
        g = fuse_gelu.rewrite(prepare(load(m)), Options())
        assert "Gelu" not in [n.op for n in g.nodes] and "Tanh" in [n.op for n in g.nodes]
