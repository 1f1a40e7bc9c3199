"""Split (a gather copy per output) against onnxruntime in both storages: parts from the split input, the split
attribute, num_outputs (the last part smaller) or equal parts."""
import numpy as np
import pytest
from onnx import helper

from oracle import check_model, make_model, rand


@pytest.mark.parametrize("shape, axis, split, outputs, opset, num_outputs", [
    ((2, 6, 5), 1, [1, 3, 2], 3, 13, None), ((2, 6, 4), -1, None, 2, 17, None), ((7, 3), 0, None, 3, 18, 3),
    ((4, 5, 6), 2, [2, 4], 2, 11, None), ((1, 8, 3, 3), 1, [4, 4], 2, 13, None)])
def test_split_matches_onnxruntime(shape, axis, split, outputs, opset, num_outputs):
    outs = [f"y{i}" for i in range(outputs)]
    inits, names, attrs = {}, ["x"], {"axis": axis}
    if split is not None and opset >= 13:
        inits["s"] = np.array(split, np.int64)
        names.append("s")
    elif split is not None:
        attrs["split"] = split
    if num_outputs:
        attrs["num_outputs"] = num_outputs
    m = make_model([helper.make_node("Split", names, outs, **attrs)], {"x": shape}, outs, inits, opset=opset)
    check_model(m, {"x": rand(*shape)})
