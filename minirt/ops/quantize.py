"""DequantizeLinear (ONNX): y = (x - x_zero_point) * x_scale, per tensor, per axis or blocked (opset 21's
block_size), of an int8 or uint8 constant: the weights of an onnxruntime QDQ model. Such a node is kept at load (not
folded to float) so that the planner's fold_dequantize_linear pass can give the MatMul or Gemm that reads it the int8
weight itself; every other one that pass folds into a float constant. A DequantizeLinear of a run-time tensor (an
activation's Q/DQ pair) is not supported."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError, UnsupportedError
from . import Op, attr, register

QUANT_DTYPES = ("int8", "uint8")


def dq_params(node, x_shape, scale, zero, source=""):
    """(scale, zero) of a DequantizeLinear broadcast to x's shape, as float arrays; a ModelError naming the tensor
    where the shapes or types do not fit."""
    x_shape = tuple(x_shape)
    scale = np.asarray(scale, np.float32)
    zero = None if zero is None else np.asarray(zero)
    rank = len(x_shape)
    axis = int(attr(node, "axis", 1))
    block = int(attr(node, "block_size", 0))
    if zero is not None and zero.shape != scale.shape:
        raise ModelError(f"{source}{node}: zero point '{node.inputs[2]}' {list(zero.shape)} does not match scale "
                         f"'{node.inputs[1]}' {list(scale.shape)}")
    if scale.size == 1 and block == 0:
        z = None if zero is None else np.float32(zero.reshape(-1)[0])
        return np.float32(scale.reshape(-1)[0]), z
    if not -rank <= axis < rank:
        raise ModelError(f"{source}{node}: axis {axis} is out of range for '{node.inputs[0]}' {list(x_shape)}")
    axis %= rank
    dim = x_shape[axis]
    if block:
        want = list(x_shape)
        want[axis] = -(-dim // block)
        if list(scale.shape) != want:
            raise ModelError(f"{source}{node}: scale '{node.inputs[1]}' {list(scale.shape)} does not fit blocks of "
                             f"{block} along axis {axis} of '{node.inputs[0]}' {list(x_shape)} (expected {want})")
        s = np.repeat(scale, block, axis=axis).take(range(dim), axis=axis)
        z = None if zero is None else np.repeat(zero, block, axis=axis).take(range(dim), axis=axis)
        return s, z
    if scale.ndim != 1 or scale.shape[0] != dim:
        raise ModelError(f"{source}{node}: scale '{node.inputs[1]}' {list(scale.shape)} is neither one value nor "
                         f"one per index of axis {axis} ({dim}) of '{node.inputs[0]}' {list(x_shape)}")
    shape = [1] * rank
    shape[axis] = dim
    return scale.reshape(shape), None if zero is None else zero.reshape(shape)


def dequantize(node, x, scale, zero=None, source=""):
    s, z = dq_params(node, np.shape(x), scale, zero, source)
    xf = np.asarray(x, np.float32)
    if z is not None:
        xf = xf - np.asarray(z, np.float32)
    return (xf * s).astype(np.float32)


@register
class DequantizeLinear(Op):
    name = "DequantizeLinear"
    limits = ("int8 / uint8 constants (weights: per tensor, per axis, blocked); into a MatMul or Gemm they stay int8 "
              "on the GPU (fold_dequantize_linear), elsewhere they fold to float")

    def infer(self, node, ins):
        return [(ins[0].shape, "float32")]

    def reference(self, node, x, scale, zero=None):
        return [dequantize(node, x, scale, zero)]

    def fold(self, node, ins):
        x = ins[0]
        if not all(t is None or t.is_const for t in ins):
            return None
        if x.data.dtype.name in QUANT_DTYPES:
            self.check_types(node, ins)
            return None      # the planner's fold_dequantize_linear decides: an int8 Linear weight, or a float constant
        return super().fold(node, ins)

    @staticmethod
    def check_types(node, ins):
        x, z = ins[0], ins[2] if len(ins) > 2 else None
        if z is not None and z.is_const and z.data.dtype != x.data.dtype:
            raise ModelError(f"{node}: zero point '{z.name}' is {z.data.dtype}, but '{x.name}' is {x.data.dtype}")
        dq_params(node, x.data.shape, ins[1].data, None if z is None else z.data)

    def check(self, node, ins):
        if not ins[0].is_const or not all(t is None or t.is_const for t in ins[1:]):
            return ("DequantizeLinear of a run-time tensor (an activation's quantize/dequantize pair) is not "
                    "supported; only constant (weight) inputs")
        return None

    def lower(self, node, ctx):
        raise UnsupportedError(f"{node}: a constant DequantizeLinear is folded by the planner "
                               f"(fold_dequantize_linear); it has no kernel")
