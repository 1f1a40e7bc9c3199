"""fuse_layer_norm on the graph and against onnxruntime (both storages, poisoned activations): LayerNorm spelt out as
ReduceMean chains becomes one AxisLayerNorm over a non-last axis (ConvNeXt's channels-first LayerNorm, rank 3 and 4,
channel counts that do not fill a texel) or one LayerNormalization over trailing axes; near misses stay."""
import numpy as np
import pytest
from onnx import helper

from oracle import check_model, graph_after, make_model, rand


def spelt_ln(shape, axes, square="Pow", scale=True, bias=True, opset=17, extra_reader=False, w_shape=None):
    """x -> u = ReduceMean(x, axes); d = x - u; v = ReduceMean(d^2, axes); y = d / sqrt(v + eps) [* w] [+ b]."""
    rank = len(shape)
    rm = (lambda i, o: helper.make_node("ReduceMean", [i, "axes"], [o], keepdims=1)) if opset >= 18 else \
        (lambda i, o: helper.make_node("ReduceMean", [i], [o], axes=list(axes), keepdims=1))
    nodes = [rm("x", "u"), helper.make_node("Sub", ["x", "u"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]) if square == "Pow" else
             helper.make_node("Mul", ["d", "d"], ["d2"]),
             rm("d2", "v"), helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"])]
    inits = {"two": np.array(2.0, np.float32), "eps": np.array(1e-6, np.float32)}
    if opset >= 18:
        inits["axes"] = np.array(axes, np.int64)
    aff = w_shape or [shape[a] if a in [x % rank for x in axes] else 1 for a in range(rank)][1:]
    cur = "n"
    if scale:
        nodes.append(helper.make_node("Mul", ["w", cur], ["m"]))
        inits["w"], cur = rand(*aff, seed=1, low=0.5, high=1.5), "m"
    if bias:
        nodes.append(helper.make_node("Add", [cur, "b"], ["y"]))
        inits["b"] = rand(*aff, seed=2)
    else:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    outs = ["y"]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["d"], ["z"]))
        outs.append("z")
    return make_model(nodes, {"x": list(shape)}, outs, inits, opset=opset)


@pytest.mark.parametrize("shape, square, scale, bias, opset", [
    ((1, 6, 5, 7), "Pow", True, True, 17),        # ConvNeXt's, TorchScript; 6 channels: a part texel
    ((2, 16, 3, 4), "Mul", True, True, 20),       # torch.export's axes input
    ((2, 9, 11), "Pow", False, True, 17),         # rank 3, no scale
    ((1, 8, 4, 4), "Pow", True, False, 18)])
def test_channels_layer_norm_becomes_one_axis_layer_norm(shape, square, scale, bias, opset):
    model = spelt_ln(shape, [1], square, scale, bias, opset)
    g = graph_after(model, {"x": shape}, "fuse_layer_norm")
    ops = [n.op for n in g.nodes if n.op != "Identity"]
    assert ops == ["AxisLayerNorm"] and g.nodes[0].attrs["axis"] == 1, ops
    check_model(model, {"x": rand(*shape, seed=3, low=-3, high=5)})


@pytest.mark.parametrize("axes", [[-1], [2, 3]])
def test_trailing_axes_become_layer_normalization(axes):
    shape = (1, 3, 5, 8)
    model = spelt_ln(shape, axes, "Mul")
    g = graph_after(model, {"x": shape}, "fuse_layer_norm")
    assert [n.op for n in g.nodes] == ["LayerNormalization"] and g.nodes[0].attrs["axis"] == 4 - len(axes)
    check_model(model, {"x": rand(*shape, seed=4, low=-3, high=5)})


@pytest.mark.parametrize("kw", [dict(extra_reader=True),                       # d read outside the pattern
                                dict(axes=[1, 2])])                            # two axes, not the trailing ones
def test_near_misses_stay(kw):
    shape = (1, 6, 5, 7)
    model = spelt_ln(shape, kw.pop("axes", [1]), **kw)
    g = graph_after(model, {"x": shape}, "fuse_layer_norm")
    assert "ReduceMean" in [n.op for n in g.nodes]
    check_model(model, {"x": rand(*shape, seed=5, low=-3, high=5)})


def test_a_scale_that_varies_along_another_axis_stays_a_mul():
    shape = (1, 6, 5, 7)
    model = spelt_ln(shape, [1], w_shape=[6, 5, 1])
    g = graph_after(model, {"x": shape}, "fuse_layer_norm")
    assert [n.op for n in g.nodes] == ["AxisLayerNorm", "Mul", "Add"]
    check_model(model, {"x": rand(*shape, seed=6, low=-3, high=5)})


def test_option_turns_it_off():
    model = spelt_ln((1, 6, 5, 7), [1])
    g = graph_after(model, {"x": (1, 6, 5, 7)}, "fuse_layer_norm", fuse_layer_norm=False)
    assert "ReduceMean" in [n.op for n in g.nodes]


def group_norm(shape, groups, back=True):
    """GroupNorm as torch's exporters write it: Reshape [0, G, -1] -> InstanceNormalization (ones, zeros) [-> Reshape
    back] -> Mul w [C, 1, ..] -> Add b."""
    c, unit = shape[1], [1] * (len(shape) - 2)
    nodes = [helper.make_node("Reshape", ["x", "grouped"], ["r"]),
             helper.make_node("InstanceNormalization", ["r", "ones", "zeros"], ["n"], epsilon=1e-5)]
    nodes += [helper.make_node("Reshape", ["n", "shape"], ["nb"])] if back else []
    nodes += [helper.make_node("Mul", ["nb" if back else "n", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])]
    inits = {"grouped": np.array([0, groups, -1], np.int64), "shape": np.array(shape, np.int64),
             "ones": np.ones(groups, np.float32), "zeros": np.zeros(groups, np.float32),
             "w": rand(c, *unit, seed=7, low=0.5, high=1.5), "b": rand(c, *unit, seed=8)}
    return make_model(nodes, {"x": list(shape)}, ["y"], inits)


@pytest.mark.parametrize("shape, back", [((1, 6, 5, 7), True), ((2, 16, 19), False)])
def test_group_norm_of_one_channel_a_group_is_one_instance_norm(shape, back):
    model = group_norm(shape, shape[1], back)
    g = graph_after(model, {"x": shape}, "fuse_layer_norm")
    assert [n.op for n in g.nodes] == ["InstanceNormalization"] and g.nodes[0].inputs[0] == "x"
    check_model(model, {"x": rand(*shape, seed=9, low=-3, high=5)})


def test_group_norm_of_several_channels_a_group_keeps_its_affine():
    model = group_norm((1, 6, 5, 7), 2)
    g = graph_after(model, {"x": (1, 6, 5, 7)}, "fuse_layer_norm")
    assert [n.op for n in g.nodes] == ["Reshape", "InstanceNormalization", "Reshape", "Mul", "Add"]
    check_model(model, {"x": rand(1, 6, 5, 7, seed=10, low=-3, high=5)})
