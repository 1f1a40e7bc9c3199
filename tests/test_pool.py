"""MaxPool and AveragePool (glsl/pool.comp) against onnxruntime in both storages: pads, strides, dilations,
auto_pad, ceil_mode and count_include_pad, 1-D and 2-D, windows that overhang the input or are larger than it, windows
that hold no input element; the numpy reference on the same grid; what minirt cannot run is refused at load."""
import itertools

import numpy as np
import pytest
from onnx import helper

from minirt import Session, UnsupportedError
from minirt.loaders import load
from minirt.graph_reference import run_graph
from oracle import check_model, compare, make_model, onnxruntime_run, rand

CASES = [
    ("MaxPool", (1, 3, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("MaxPool", (1, 3, 9, 11), dict(kernel_shape=[3, 2], strides=[2, 3], ceil_mode=1)),
    ("MaxPool", (1, 3, 10, 9), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1], ceil_mode=1)),
    ("MaxPool", (1, 3, 9, 11), dict(kernel_shape=[2, 2], dilations=[2, 2], pads=[1, 0, 0, 1])),
    ("MaxPool", (1, 3, 9, 11), dict(kernel_shape=[4, 4], strides=[3, 3], auto_pad="SAME_LOWER")),
    ("MaxPool", (2, 3, 13), dict(kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)),
    ("AveragePool", (1, 3, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ("AveragePool", (1, 3, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], count_include_pad=1,
                                        ceil_mode=1)),
    ("AveragePool", (1, 3, 10, 11), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)),
    ("AveragePool", (1, 3, 9, 11), dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 1, 1, 1],
                                        count_include_pad=1)),
    ("AveragePool", (1, 3, 9, 11), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER",
                                        count_include_pad=1)),
    ("AveragePool", (2, 3, 13), dict(kernel_shape=[4], strides=[3], pads=[2, 1], count_include_pad=1)),
]


@pytest.mark.parametrize("op, shape, attrs", CASES, ids=lambda v: str(v) if isinstance(v, str) else None)
def test_pool_matches_onnxruntime(op, shape, attrs):
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": shape}, ["y"], opset=19)
    check_model(m, {"x": rand(*shape, seed=1)})


# Window geometries (input shape, kernel_shape, strides, dilations, pads) crossed below with ceil_mode and
# count_include_pad: windows larger than the input, windows that overhang its end (ceil_mode), pads on one side,
# dilated windows that hold no input element at all (onnxruntime: 0 for average, the lowest float for max).
GEOMETRIES = {
    "pooler": ((1, 6, 2, 2), [1280, 1280], [1280, 1280], [1, 1], [0, 0, 0, 0]),   # EfficientNet's AvgPool2d(1280)
    "kernel_past_input": ((1, 5, 3, 2), [5, 4], [5, 4], [1, 1], [1, 1, 1, 2]),
    "overhang": ((1, 5, 7, 6), [3, 2], [2, 3], [1, 1], [1, 0, 0, 1]),
    "overhang_dilated": ((1, 5, 6, 7), [2, 3], [3, 2], [2, 2], [1, 1, 0, 1]),
    "empty_windows": ((1, 5, 1, 6), [2, 3], [2, 1], [2, 3], [1, 2, 1, 1]),
    "one_row": ((2, 3, 11), [4], [3], [2], [2, 1]),
}


def _grid():
    for (name, geo), ceil in itertools.product(GEOMETRIES.items(), (0, 1)):
        shape, ks, strides, dil, pads = geo
        if name == "pooler" and not ceil:
            continue     # floor mode leaves no window (an output of size 0)
        base = dict(kernel_shape=ks, strides=strides, dilations=dil, pads=pads, ceil_mode=ceil)
        yield pytest.param("MaxPool", shape, base, id=f"MaxPool-{name}-ceil{ceil}")
        for cip in (0, 1):
            yield pytest.param("AveragePool", shape, {**base, "count_include_pad": cip},
                               id=f"AveragePool-{name}-ceil{ceil}-cip{cip}")


@pytest.mark.parametrize("op, shape, attrs", list(_grid()))
def test_pool_attribute_grid_matches_onnxruntime(op, shape, attrs):
    """Both storages (poisoned) and the numpy reference against onnxruntime."""
    m = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": shape}, ["y"], opset=19)
    x = rand(*shape, seed=2)
    ref = check_model(m, {"x": x})[0]
    compare(run_graph(load(m), {"x": x})["y"], ref, 1e-6, "numpy reference")


@pytest.mark.parametrize("opset", [17, 20])
def test_pooler_larger_than_its_input_at_the_exporters_opsets(opset):
    """nn.AvgPool2d(1280, ceil_mode=True) on a 2 x 2 map as torch exports it: one window, the mean of the 4 elements
    (count_include_pad counts neither the pads, which are 0, nor the window's part past the input)."""
    attrs = dict(kernel_shape=[1280, 1280], strides=[1280, 1280], ceil_mode=1, count_include_pad=1, pads=[0, 0, 0, 0])
    m = make_model([helper.make_node("AveragePool", ["x"], ["y"], **attrs)], {"x": (1, 9, 2, 2)}, ["y"], opset=opset)
    x = rand(1, 9, 2, 2, seed=3)
    ref = check_model(m, {"x": x}, tol=1e-6)[0]
    np.testing.assert_allclose(ref, x.mean(axis=(2, 3), keepdims=True), rtol=1e-6)


@pytest.mark.parametrize("op, shape, attrs, outputs, why", [
    ("MaxPool", (1, 2, 4, 5, 6), dict(kernel_shape=[2, 2, 2]), ["y"], "3-D pooling is not supported"),
    ("MaxPool", (1, 2, 5, 6), dict(kernel_shape=[2, 2]), ["y", "i"], "the Indices output is not supported"),
    ("AveragePool", (1, 2, 5, 6), dict(kernel_shape=[2, 2], ceil_mode=1, auto_pad="SAME_UPPER"), ["y"],
     "ceil_mode with auto_pad SAME_UPPER is not supported")])
def test_what_cannot_run_is_refused_naming_the_node(op, shape, attrs, outputs, why):
    m = make_model([helper.make_node(op, ["x"], outputs, name="pool", **attrs)], {"x": shape}, outputs, opset=19)
    with pytest.raises(UnsupportedError, match=f"{op} node 'pool': {why}"):
        Session(m)


def test_max_pool_skips_nan_as_onnxruntime_does():
    """A NaN among a window's elements is skipped (onnxruntime, ONNX's reference); a window of NaN alone gives NaN."""
    x = np.array([[[[np.nan, 1, np.nan, np.nan], [2, 3, np.nan, np.nan]]]], np.float32)
    m = make_model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {"x": x.shape},
                   ["y"])
    for storage in ("buffer", "texture"):
        with Session(m, storage=storage) as s:
            np.testing.assert_array_equal(s.run(x), [[[[3, np.nan]]]], err_msg=storage)
