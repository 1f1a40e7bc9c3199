"""MaxPool and AveragePool (glsl/pool.comp) against onnxruntime in both storages: pads, strides, dilations,
auto_pad, ceil_mode and count_include_pad, 1-D and 2-D; what minirt cannot run is refused at load."""
import numpy as np
import pytest
from onnx import helper

from minirt import Session, UnsupportedError
from oracle import check_model, make_model, rand

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
