"""Resize (taps computed at load, glsl/resize.comp) against onnxruntime in both storages with poisoned activations:
what exporters write for torch's nn.Upsample and F.interpolate (nearest; bilinear with and without align_corners),
every nearest_mode, the coordinate transformations, downscaling, sizes, axes, cubic, antialias, tf_crop_and_resize,
rank 3, the opset 11 and 13 signatures; fp16; what cannot run is refused at load."""
import numpy as np
import pytest
from onnx import helper

from minirt import Session, UnsupportedError
from oracle import check_model, make_model, rand


def model(x_shape, scales=None, sizes=None, roi=None, opset=19, name="rs", **attrs):
    inits, ins = {}, ["x", "", "", ""]
    if roi is not None:
        inits["roi"], ins[1] = np.array(roi, np.float32), "roi"
    if scales is not None:
        inits["scales"], ins[2] = np.array(scales, np.float32), "scales"
    if sizes is not None:
        inits["sizes"], ins[3] = np.array(sizes, np.int64), "sizes"
    if opset < 13 and sizes is not None:       # opset 11: roi and scales are required, empty when unused
        inits.setdefault("roi", np.zeros(0, np.float32))
        inits["scales"], ins[1], ins[2] = np.zeros(0, np.float32), "roi", "scales"
    while ins[-1] == "":
        ins.pop()
    return make_model([helper.make_node("Resize", ins, ["y"], name=name, **attrs)], {"x": x_shape}, ["y"], inits,
                      opset=opset)


NEAREST = dict(mode="nearest")
LINEAR = dict(mode="linear")
CASES = [
    # torch: nn.Upsample(scale_factor=2) / F.interpolate(mode="nearest"), opset 17
    ((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="asymmetric", nearest_mode="floor",
                        opset=17, **NEAREST)),
    # bilinear, align_corners=False and True
    ((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="pytorch_half_pixel", opset=17, **LINEAR)),
    ((1, 3, 5, 6), dict(scales=[1, 1, 2, 2], coordinate_transformation_mode="align_corners", opset=17, **LINEAR)),
    # downscaling with nearest, each nearest_mode
    ((1, 2, 9, 10), dict(scales=[1, 1, 0.5, 0.6], **NEAREST)),
    ((1, 2, 9, 10), dict(scales=[1, 1, 0.6, 0.5], nearest_mode="round_prefer_ceil", **NEAREST)),
    ((1, 2, 9, 10), dict(sizes=[1, 2, 4, 3], nearest_mode="ceil", coordinate_transformation_mode="align_corners",
                         **NEAREST)),
    ((1, 2, 5, 6), dict(sizes=[1, 2, 8, 13], nearest_mode="floor", coordinate_transformation_mode="half_pixel",
                        **NEAREST)),
    # align_corners onto and from a size of 1
    ((1, 2, 1, 6), dict(sizes=[1, 2, 3, 1], coordinate_transformation_mode="align_corners", **LINEAR)),
    ((1, 2, 5, 6), dict(sizes=[1, 2, 1, 4], coordinate_transformation_mode="pytorch_half_pixel", **LINEAR)),
    ((1, 2, 9, 10), dict(scales=[1, 1, 0.5, 0.75], coordinate_transformation_mode="half_pixel", **LINEAR)),
    ((1, 2, 5, 6), dict(scales=[1, 1, 1.5, 2.5], coordinate_transformation_mode="asymmetric", **LINEAR)),
    ((1, 2, 5, 6), dict(sizes=[7, 9], axes=[2, 3], keep_aspect_ratio_policy="not_larger", **LINEAR)),
    ((1, 2, 5, 6), dict(sizes=[1, 2, 7, 4], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5)),
    ((1, 2, 9, 10), dict(sizes=[1, 2, 4, 3], antialias=1, **LINEAR)),
    ((1, 2, 5, 6), dict(sizes=[1, 2, 4, 5], roi=[0, 0, 0.2, -0.1, 1, 1, 1.1, 0.9],
                        coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=2.5, **LINEAR)),
    ((2, 3, 7), dict(scales=[1, 1, 2.5], **LINEAR)),                                          # rank 3: over L
    ((1, 2, 5, 6), dict(sizes=[1, 2, 10, 12], opset=11, **LINEAR)),                           # opset 11 signature
    ((1, 2, 5, 6), dict(sizes=[1, 2, 10, 3], opset=13, **NEAREST)),
]


@pytest.mark.parametrize("shape, kw", CASES, ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_resize_matches_onnxruntime(shape, kw):
    check_model(model(shape, **kw), {"x": rand(*shape, seed=1)}, tol=1e-5)


def test_fp16():
    check_model(model((1, 3, 5, 6), scales=[1, 1, 2, 2], coordinate_transformation_mode="pytorch_half_pixel",
                      **LINEAR), {"x": rand(1, 3, 5, 6, seed=2)}, tol=2e-3, options={"precision": "fp16"})


def test_nearest_copies_exactly():
    x = rand(1, 3, 4, 5, seed=3)
    m = model((1, 3, 4, 5), scales=[1, 1, 2, 3], coordinate_transformation_mode="asymmetric", nearest_mode="floor",
              **NEAREST)
    for storage in ("buffer", "texture"):
        with Session(m, storage=storage, options={"poison": True}) as s:
            np.testing.assert_array_equal(s.run(x), x.repeat(2, axis=2).repeat(3, axis=3), err_msg=storage)


@pytest.mark.parametrize("shape, kw, inputs, why", [
    ((1, 2, 5, 6), dict(opset=10, mode="nearest"), None, "Resize before opset 11 is not supported"),
    ((1, 2, 5, 6), dict(scales=[1, 2, 2, 2]), None, "it resizes axis 1 of a rank-4 input"),
    ((1, 2, 3, 5, 6), dict(scales=[1, 1, 2, 2, 2]), None, "resizing a rank-5 tensor is not supported"),
    ((1, 2, 5, 6), dict(), "scales", "scales 'scales' is computed at run time")])
def test_what_cannot_run_is_refused_naming_the_node(shape, kw, inputs, why):
    if inputs:      # scales as a graph input
        m = make_model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="rs")],
                       {"x": shape, "scales": [4]}, ["y"], opset=19)
    elif kw.get("opset") == 10:
        m = make_model([helper.make_node("Resize", ["x", "scales"], ["y"], name="rs", mode="nearest")], {"x": shape},
                       ["y"], {"scales": np.array([1, 1, 2, 2], np.float32)}, opset=10)
    else:
        m = model(shape, **kw)
    with pytest.raises(UnsupportedError, match=f"Resize node 'rs': {why}"):
        Session(m)
