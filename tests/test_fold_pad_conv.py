"""fold_pad_conv on the graph and against onnxruntime (both storages, poisoned activations): a zero Pad of the
spatial axes before a Conv (TensorFlow's SAME padding as exporters write it) becomes the conv's asymmetric pads;
other Pads stay."""
import numpy as np
import pytest
from onnx import helper

from oracle import check_model, graph_after, make_model, rand


def pad_conv(shape, pads, axes=None, value=None, mode="constant", conv_pads=None, group=1, stride=2, extra=False,
             opset=17):
    rank = len(shape)
    cin = shape[1] + (pads[1] + pads[rank + 1] if axes is None else 0)     # a channel pad adds channels
    k = [3] * (rank - 2)
    ins = ["x", "pads"] + (["val"] if value is not None or axes is not None else []) + (["axes"] if axes else [])
    inits = {"pads": np.array(pads, np.int64), "w": rand(8 if group == 1 else cin, cin // group, *k, seed=1),
             "b": rand(8 if group == 1 else cin, seed=2)}
    if value is not None or axes is not None:
        inits["val"] = np.array(value or 0.0, np.float32)
    if axes:
        inits["axes"] = np.array(axes, np.int64)
    conv = dict(kernel_shape=k, strides=[stride] * (rank - 2), group=group)
    if conv_pads:
        conv["pads"] = conv_pads
    nodes = [helper.make_node("Pad", ins, ["p"], mode=mode), helper.make_node("Conv", ["p", "w", "b"], ["y"], **conv)]
    outs = ["y"]
    if extra:
        nodes.append(helper.make_node("Relu", ["p"], ["z"]))
        outs.append("z")
    return make_model(nodes, {"x": list(shape)}, outs, inits, opset=opset)


@pytest.mark.parametrize("shape, pads, axes, conv_pads, group, want", [
    ((1, 4, 8, 10), [0, 0, 0, 0, 0, 0, 1, 1], None, None, 4, [0, 0, 1, 1]),           # SAME, stride 2, depthwise
    ((1, 4, 9, 8), [0, 0, 1, 0, 0, 0, 1, 1], None, [1, 1, 1, 1], 1, [2, 1, 2, 2]),    # added to the conv's own
    ((1, 4, 8, 8), [0, 1, 1, 1], [2, 3], None, 1, [0, 1, 1, 1]),                       # opset 18's axes
    ((1, 4, 12), [0, 0, 1, 0, 0, 2], None, None, 1, [1, 2])])                          # 1-D
def test_zero_spatial_pad_folds_into_the_conv(shape, pads, axes, conv_pads, group, want):
    model = pad_conv(shape, pads, axes, conv_pads=conv_pads, group=group, opset=18 if axes else 17)
    g = graph_after(model, {"x": shape}, "fold_pad_conv")
    assert [n.op for n in g.nodes] == ["Conv"] and g.nodes[0].attrs["pads"] == want
    check_model(model, {"x": rand(*shape, seed=3)})


@pytest.mark.parametrize("kw", [dict(value=0.5), dict(mode="reflect"), dict(extra=True),
                                dict(pads=[0, 1, 0, 0, 0, 1, 0, 0])])          # pads the channels
def test_other_pads_stay(kw):
    shape = (1, 4, 8, 8)
    model = pad_conv(shape, kw.pop("pads", [0, 0, 1, 1, 0, 0, 1, 1]), **kw)
    g = graph_after(model, {"x": shape}, "fold_pad_conv")
    assert "Pad" in [n.op for n in g.nodes]
    check_model(model, {"x": rand(*shape, seed=4)})


def test_option_turns_it_off():
    model = pad_conv((1, 4, 8, 10), [0, 0, 0, 0, 0, 0, 1, 1], group=4)
    g = graph_after(model, {"x": (1, 4, 8, 10)}, "fold_pad_conv", fold_pad_conv=False)
    assert [n.op for n in g.nodes] == ["Pad", "Conv"]
