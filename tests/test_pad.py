"""Pad and Tile (glsl/copy.comp's padding copy) against onnxruntime in both storages: constant, reflect, edge and wrap
mode, pads as attributes (opset 2) or constant inputs, axes (opset 18), cropping; what minirt cannot run is refused."""
import numpy as np
import pytest
from onnx import helper

from minirt import Session, UnsupportedError
from oracle import check_model, make_model, rand


def pad_model(shape, pads, mode="constant", value=None, axes=None, opset=18, name="pad"):
    inits = {"pads": np.array(pads, np.int64)}
    names = ["x", "pads"]
    if value is not None or axes is not None:
        names.append("v" if value is not None else "")
        if value is not None:
            inits["v"] = np.float32(value)
    if axes is not None:
        names.append("axes")
        inits["axes"] = np.array(axes, np.int64)
    return make_model([helper.make_node("Pad", names, ["y"], name=name, mode=mode)], {"x": shape}, ["y"], inits,
                      opset=opset)


@pytest.mark.parametrize("shape, pads, mode, value, axes", [
    ((1, 3, 5, 6), [0, 0, 1, 2, 0, 0, 3, 1], "constant", 0.5, None),
    ((1, 3, 5, 6), [0, 1, 2, 1, 0, 2, 1, 3], "reflect", None, None),
    ((1, 3, 5, 6), [0, 0, 2, 0, 0, 0, 0, 3], "edge", None, None),
    ((2, 5, 7), [1, 3, 0, 2], "wrap", None, [0, -1]),
    ((2, 5, 7), [0, -1, -2, 0, 2, -3], "constant", -1.0, None),
    ((11,), [3, 4], "reflect", None, None)])
def test_pad_matches_onnxruntime(shape, pads, mode, value, axes):
    check_model(pad_model(shape, pads, mode, value, axes, opset=19 if mode == "wrap" else 18),
                {"x": rand(*shape, seed=2)})


def test_pads_as_attributes():
    m = make_model([helper.make_node("Pad", ["x"], ["y"], mode="edge", pads=[1, 0, 2, 3])], {"x": (4, 5)}, ["y"],
                   opset=2)
    check_model(m, {"x": rand(4, 5)})


def test_cropping_in_other_modes_is_refused_naming_the_node():
    with pytest.raises(UnsupportedError, match="Pad node 'pad': negative pads .* in mode 'reflect'"):
        Session(pad_model((3, 6), [0, -1, 0, 2], "reflect"))


@pytest.mark.parametrize("shape, repeats", [((2, 3, 5), [2, 1, 3]), ((1, 3, 2, 5), [2, 3, 1, 2]), ((7,), [3])])
def test_tile_matches_onnxruntime(shape, repeats):
    m = make_model([helper.make_node("Tile", ["x", "r"], ["y"])], {"x": shape}, ["y"],
                   {"r": np.array(repeats, np.int64)})
    check_model(m, {"x": rand(*shape, seed=3)})
