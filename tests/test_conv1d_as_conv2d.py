"""The conv1d -> conv2d rewrite, checked on the graph itself (no GPU), and its routing."""
import pytest
from onnx import helper

from minirt.options import Options
from minirt.infer import prepare
from minirt.loaders import load
from minirt.planner import conv1d_as_conv2d, conv_routing
from oracle import make_model, rand


def conv_graph(cin=80, cout=384, k=3, L=40, batch=1, group=1, dilation=1, stride=1, pads=(1, 1), shared=False,
               runtime_weight=False):
    """A prepared graph with one 1-D Conv named 'conv' (runtime_weight: its weight is no constant)."""
    w = rand(cout, cin // group, k, seed=3)
    attrs = dict(strides=[stride], pads=list(pads), dilations=[dilation], group=group)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", **attrs)]
    inits = {"w": w, "b": rand(cout, seed=4)}
    outputs = ["y"]
    if shared:
        nodes.append(helper.make_node("Conv", ["x", "w"], ["y2"], name="conv_b", **attrs))
        outputs.append("y2")
    g = prepare(load(make_model(nodes, {"x": (batch, cin, L)}, outputs, inits)))
    if runtime_weight:
        g.tensor("w").data = None   # as if a node computed it (Session refuses such a Conv at load)
    return g


def test_rewrite_fires_on_eligible_conv():
    g = conv1d_as_conv2d.rewrite(conv_graph(stride=2, pads=(1, 2)), Options())
    ops = [n.op for n in g.nodes]
    assert ops == ["Reshape", "Conv", "Reshape"]
    pre, conv, post = g.nodes
    assert g.tensor(conv.inputs[0]).shape == (1, 80, 1, 40)
    assert g.tensor(conv.inputs[1]).shape == (384, 80, 1, 3) and g.tensor(conv.inputs[1]).data.shape == (384, 80, 1, 3)
    assert conv.attrs["strides"] == [1, 2] and conv.attrs["pads"] == [0, 1, 0, 2] and conv.attrs["dilations"] == [1, 1]
    assert pre.outputs[0] == conv.inputs[0] and post.inputs[0] == conv.outputs[0] and post.outputs[0] == "y"
    assert g.tensor(post.inputs[1]).data.tolist() == [1, 384, 21]
    assert "conv1d rewrite: yes" in g.notes["conv"][0]
    conv_routing.annotate(g, Options())
    assert conv.attrs["_route"] == "im2col"


@pytest.mark.parametrize("kw,reason", [
    (dict(shared=True), "shared"), (dict(group=4), "groups"), (dict(cin=384, group=384), "groups"),
    (dict(dilation=2, pads=(2, 2)), "dilation"), (dict(k=1, pads=(0, 0)), "kernel size 1"),
    (dict(cout=64), "out_channels 64"), (dict(batch="n"), "symbolic"),
    (dict(runtime_weight=True), "run time")])
def test_rewrite_does_not_fire(kw, reason):
    g = conv_graph(**kw)
    before = [(n.op, list(n.inputs)) for n in g.nodes]
    g = conv1d_as_conv2d.rewrite(g, Options())
    assert [(n.op, list(n.inputs)) for n in g.nodes] == before
    assert all(len(g.tensor(n.inputs[0]).shape) == 3 for n in g.nodes if n.op == "Conv")
    assert any(reason in note for note in g.notes["conv"]), g.notes


def test_option_turns_rewrite_off():
    g = conv1d_as_conv2d.rewrite(conv_graph(), Options(conv1d_rewrite=False))
    assert [n.op for n in g.nodes] == ["Conv"]
    assert "off" in g.notes["conv"][0]


@pytest.mark.parametrize("kw,route", [
    (dict(), "direct"), (dict(cin=384, group=384), "depthwise"), (dict(k=1, pads=(0, 0)), "pointwise"),
    (dict(group=4), "direct"), (dict(cout=64), "direct")])
def test_routing_of_1d_convs_left_alone(kw, route):
    g = conv_routing.annotate(conv_graph(**kw), Options())
    assert g.nodes[-1].attrs["_route"] == route


def test_a_batch_is_rewritten_too():
    """A concrete batch of 3: the 2-D conv over [3, C, 1, L] (the im2col route runs it image by image)."""
    g = conv1d_as_conv2d.rewrite(conv_graph(batch=3), Options())
    (conv,) = [n for n in g.nodes if n.op == "Conv"]
    assert g.tensor(conv.inputs[0]).shape == (3, 80, 1, 40)
    assert [n.op for n in g.nodes] == ["Reshape", "Conv", "Reshape"]
