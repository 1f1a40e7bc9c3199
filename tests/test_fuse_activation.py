"""fuse_activation on the graph: Relu/Gelu/HardSwish after an im2col/pointwise/depthwise conv joins its epilogue."""
import pytest
from onnx import helper

from minirt import Session
from minirt.infer import prepare
from minirt.loaders import load
from minirt.options import Options
from minirt.planner import conv1d_as_conv2d, conv_routing, fuse_activation, fuse_gelu
from oracle import check_model, make_model, rand


def _plan_graph(m):
    g = prepare(load(m))
    for fn in (conv1d_as_conv2d.rewrite, conv_routing.annotate, fuse_gelu.rewrite, fuse_activation.rewrite):
        g = fn(g, Options())
    return g


def whisper_front(act="Gelu", extra_reader=False, cout=384):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1]),
             helper.make_node(act, ["c"], ["y"], name="act")]
    outs = ["y"]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["z"]))
        outs.append("z")
    return make_model(nodes, {"x": (1, 80, 50)}, outs, {"w": rand(cout, 80, 3, low=-.1, high=.1), "b": rand(cout)},
                      opset=20)


@pytest.mark.parametrize("act,kind", [("Gelu", "gelu"), ("Relu", "relu")])
def test_activation_moves_into_rewritten_conv(act, kind):
    m = whisper_front(act)
    g = _plan_graph(m)
    assert [n.op for n in g.nodes] == ["Reshape", "Conv", "Reshape"]
    assert g.nodes[1].attrs["_act"] == kind and g.nodes[2].outputs == ["y"]
    check_model(m, {"x": rand(1, 80, 50, low=-3, high=3)})
    with Session(m) as s:
        assert all(d.op == "Conv" for d in s.plan.dispatches)


def test_not_fused_when_the_conv_output_has_another_reader():
    g = _plan_graph(whisper_front(extra_reader=True))
    assert "Gelu" in [n.op for n in g.nodes] and "_act" not in [n for n in g.nodes if n.op == "Conv"][0].attrs


def test_not_fused_into_direct_conv():
    g = _plan_graph(whisper_front(cout=64))
    assert [n.op for n in g.nodes] == ["Conv", "Gelu"]


@pytest.mark.parametrize("act, approximate, kind", [("Relu", None, "relu"), ("Gelu", "none", "gelu"),
                                                    ("Gelu", "tanh", "gelu_tanh"), ("HardSwish", None, "hard_swish")])
def test_every_activation_fuses_into_a_depthwise_conv(act, approximate, kind):
    """conv_dw applies glsl/activation.glslh's activate(), so it takes each activation, GELU's tanh form too."""
    extra = {"approximate": approximate} if approximate else {}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", group=16, pads=[1, 1, 1, 1]),
             helper.make_node(act, ["c"], ["y"], name="act", **extra)]
    m = make_model(nodes, {"x": (1, 16, 9, 13)}, ["y"], {"w": rand(16, 1, 3, 3, seed=1), "b": rand(16, seed=2)},
                   opset=20)
    g = _plan_graph(m)
    assert [n.op for n in g.nodes] == ["Conv"] and g.nodes[0].attrs["_act"] == kind
    check_model(m, {"x": rand(1, 16, 9, 13, seed=3, low=-3, high=3)})
