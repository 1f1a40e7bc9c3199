"""ConvTranspose (a GEMM into columns, glsl/col2im.comp's gather) against onnxruntime in both storages with poisoned
activations: strides (also past the kernel), pads, dilations, output_padding, output_shape, auto_pad, groups
(depthwise too), bias or none, 1-D and 2-D, batches; fp16; the same bits on every run; what cannot run is refused at
load."""
import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

from minirt import Session, UnsupportedError
from oracle import STORAGES, check_model, compare, make_model, rand


def model(x_shape, w_shape, bias=True, opset=17, **attrs):
    g = attrs.get("group", 1)
    inits = {"w": rand(*w_shape, seed=2)}
    if bias:
        inits["b"] = rand(w_shape[1] * g, seed=3)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"] if bias else ["x", "w"], ["y"], name="up", **attrs)
    return make_model([node], {"x": x_shape}, ["y"], inits, opset=opset)


CASES = [
    ((1, 8, 5, 6), (8, 4, 2, 2), True, dict(strides=[2, 2])),                                  # UNet's up-sampling
    ((2, 3, 5, 4), (3, 5, 3, 3), True, dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ((1, 3, 4, 5), (3, 2, 2, 3), True, dict(strides=[3, 4], pads=[1, 0, 0, 2], dilations=[1, 2],
                                           output_padding=[2, 1])),                            # stride > kernel
    ((1, 4, 5, 5), (4, 3, 3, 3), False, dict(group=2, strides=[2, 1], pads=[0, 1, 2, 0])),
    ((1, 6, 4, 5), (6, 1, 3, 3), True, dict(group=6, strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    ((2, 5, 7), (5, 3, 4), True, dict(strides=[3], pads=[2, 1], output_padding=[1])),              # 1-D
    ((1, 3, 4, 5), (3, 2, 3, 3), True, dict(strides=[2, 2], auto_pad="SAME_UPPER")),
    ((1, 3, 4, 5), (3, 2, 3, 3), True, dict(strides=[2, 2], auto_pad="SAME_LOWER", output_padding=[1, 1])),
    ((1, 3, 4, 5), (3, 2, 3, 2), True, dict(strides=[2, 2], auto_pad="VALID", output_padding=[1, 0])),
    ((1, 3, 4, 5), (3, 2, 3, 3), True, dict(strides=[2, 2], output_shape=[6, 12])),   # smaller, then larger
]


@pytest.mark.parametrize("x_shape, w_shape, bias, attrs", CASES, ids=lambda v: str(v) if isinstance(v, dict) else None)
def test_conv_transpose_matches_onnxruntime(x_shape, w_shape, bias, attrs):
    check_model(model(x_shape, w_shape, bias, **attrs), {"x": rand(*x_shape, seed=1)})


def test_fp16():
    check_model(model((1, 8, 5, 6), (8, 4, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                {"x": rand(1, 8, 5, 6, seed=4)}, tol=5e-3, options={"precision": "fp16"})


def test_same_past_the_kernel_pads_as_onnx_defines():
    """auto_pad SAME_* with a stride past the kernel's span: the output is input * stride, padded negatively as ONNX's
    reference does (onnxruntime gives the shorter full size instead)."""
    x = rand(1, 2, 4, 5, seed=5)
    for auto in ("SAME_UPPER", "SAME_LOWER"):
        m = model((1, 2, 4, 5), (2, 3, 2, 2), strides=[3, 3], auto_pad=auto)
        ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
        assert ref.shape == (1, 3, 12, 15)
        for storage in STORAGES:
            with Session(m, storage=storage, options={"poison": True}) as s:
                compare(s.run(x), ref, 1e-4, f"{auto} {storage}")


def test_same_bits_every_run():
    m = model((1, 8, 6, 6), (8, 8, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])
    x = rand(1, 8, 6, 6, seed=6)
    with Session(m, storage="buffer") as s:
        a, b = s.run(x), s.run(x)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("x_shape, w_shape, runtime_w, why", [
    ((1, 2, 3, 4, 5), (2, 2, 2, 2, 2), False, "3-D transposed convolution .* is not supported"),
    ((1, 2, 4, 5), (2, 2, 2, 2), True, "weight 'w' is computed at run time")])
def test_what_cannot_run_is_refused_naming_the_node(x_shape, w_shape, runtime_w, why):
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up")
    inputs = {"x": x_shape, **({"w": w_shape} if runtime_w else {})}
    m = make_model([node], inputs, ["y"], {} if runtime_w else {"w": rand(*w_shape, seed=1)})
    with pytest.raises(UnsupportedError, match=f"ConvTranspose node 'up': {why}"):
        Session(m)
