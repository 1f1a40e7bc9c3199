import numpy as np
import pytest
from onnx import helper, numpy_helper

from minirt import Session, ops
from minirt.errors import UnsupportedError
from minirt.graph import Node
from oracle import check_model, make_model, onnxruntime_run, rand


def conv_model(xs, ws, bias=True, **attrs):
    """A one-Conv model with a constant weight (and bias); returns (model, feeds)."""
    w = rand(*ws, seed=1)
    inits = {"w": w}
    if bias:
        inits["b"] = rand(ws[0], seed=2)
    node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["y"], **attrs)
    return make_model([node], {"x": xs}, ["y"], inits), {"x": rand(*xs, seed=0)}


CASES_1D = {
    "80to64_k3_p1": ((1, 80, 50), (64, 80, 3), {"pads": [1, 1]}),
    "k3_s2": ((1, 6, 23), (7, 6, 3), {"strides": [2], "pads": [1, 1]}),
    "dilation2": ((1, 5, 21), (6, 5, 3), {"dilations": [2], "pads": [2, 1]}),
    "groups4": ((1, 8, 19), (12, 2, 3), {"group": 4, "pads": [1, 1]}),
    "depthwise": ((1, 6, 17), (6, 1, 5), {"group": 6, "pads": [2, 2]}),
    "k1": ((1, 7, 13), (9, 7, 1), {}),
    "no_bias": ((1, 5, 11), (6, 5, 3), {"_bias": False}),
    "batch2": ((2, 5, 14), (7, 5, 3), {"pads": [1, 1]}),
    "same_upper_s2": ((1, 4, 18), (5, 4, 4), {"auto_pad": "SAME_UPPER", "strides": [2]}),
    "same_lower": ((1, 4, 10), (3, 4, 4), {"auto_pad": "SAME_LOWER"}),
    "valid": ((1, 3, 9), (2, 3, 3), {"auto_pad": "VALID"}),
}

CASES_2D = {
    "3x3_s1_p1": ((1, 6, 9, 10), (8, 6, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3x3_s2": ((1, 4, 11, 9), (8, 4, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "1x1": ((1, 8, 5, 7), (12, 8, 1, 1), {}),
    "5x5_dilation2": ((1, 3, 14, 13), (4, 3, 5, 5), {"dilations": [2, 2], "pads": [4, 4, 4, 4]}),
    "groups2": ((1, 6, 7, 9), (10, 3, 3, 3), {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": ((1, 9, 8, 7), (9, 1, 3, 3), {"group": 9, "pads": [1, 1, 1, 1]}),
    "asym_pads": ((1, 4, 7, 8), (5, 4, 3, 3), {"pads": [0, 1, 2, 1]}),
    "batch2": ((2, 5, 6, 9), (6, 5, 3, 3), {"pads": [1, 1, 1, 1]}),
    "3to5": ((1, 3, 10, 11), (5, 3, 3, 3), {"pads": [1, 1, 1, 1], "strides": [1, 2]}),
    "same_upper_no_bias": ((1, 5, 7, 6), (3, 5, 2, 3), {"auto_pad": "SAME_UPPER", "_bias": False}),
    "same_lower_s2": ((1, 3, 9, 8), (4, 3, 4, 3), {"auto_pad": "SAME_LOWER", "strides": [2, 2]}),
}

WHISPER = {
    "conv1_80to384_L200": ((1, 80, 200), (384, 80, 3), {"pads": [1, 1]}),
    "conv2_384to384_s2_L200": ((1, 384, 200), (384, 384, 3), {"pads": [1, 1], "strides": [2]}),
}

ALL = {**{f"1d_{k}": v for k, v in CASES_1D.items()}, **{f"2d_{k}": v for k, v in CASES_2D.items()},
       **{f"whisper_{k}": v for k, v in WHISPER.items()}}


def _model(case):
    xs, ws, attrs = ALL[case]
    attrs = dict(attrs)
    return conv_model(xs, ws, attrs.pop("_bias", True), **attrs)


@pytest.mark.parametrize("case", list(ALL))
def test_conv(case):
    m, feeds = _model(case)
    check_model(m, feeds)


@pytest.mark.parametrize("case", list(ALL))
def test_numpy_reference_matches_onnxruntime(case):
    m, feeds = _model(case)
    ref = onnxruntime_run(m, feeds)[0]
    n = m.graph.node[0]
    node = Node("Conv", "c", list(n.input), list(n.output), {a.name: helper.get_attribute_value(a) for a in n.attribute})
    consts = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in m.graph.initializer}
    got = ops.OPS["Conv"].reference(node, feeds["x"].astype(np.float64), *[consts[i] for i in n.input[1:]])[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_runtime_weight_is_refused():
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv_rt")
    m = make_model([node], {"x": (1, 4, 9), "w": (3, 4, 3)}, ["y"])
    with pytest.raises(UnsupportedError, match=r"conv_rt.*weight 'w'.*constant"):
        Session(m, storage="buffer")


def test_3d_conv_is_refused():
    m, _ = conv_model((1, 2, 4, 5, 6), (3, 2, 3, 3, 3))
    m.graph.node[0].name = "conv3d"
    with pytest.raises(UnsupportedError, match=r"conv3d.*3-D convolution"):
        Session(m, storage="buffer")


def test_plan_declares_work():
    m, feeds = _model("1d_80to64_k3_p1")
    with Session(m, storage="buffer") as s:
        (d,) = s.plan.dispatches
    assert d.family == "conv" and d.flops == 2 * 64 * 50 * 80 * 3 and d.bytes > 0


@pytest.mark.parametrize("route", ["im2col", "pointwise"])
def test_forced_route_on_a_1d_conv(route):
    """Session(options={"conv_route": ...}) on a 1-D conv that conv1d_as_conv2d left as it is (< 128 output channels):
    the im2col kernel reads the [N, C, L] input as [N, C, 1, L] (it once read it with the wrong strides)."""
    k = 3 if route == "im2col" else 1
    w, b = rand(12, 8, k, seed=np.random.SeedSequence().entropy % 2**31), rand(12, seed=1)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[k // 2, k // 2], strides=[2 if k == 3 else 1])
    m = make_model([node], {"x": (1, 8, 23)}, ["y"], {"w": w, "b": b})
    x = rand(1, 8, 23, seed=np.random.SeedSequence().entropy % 2**31, low=-2, high=2)
    check_model(m, {"x": x}, storages=("buffer",), options={"conv_route": route})
