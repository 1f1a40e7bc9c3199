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
