"""DequantizeLinear (ONNX): y = (x - x_zero_point) * x_scale, per tensor, per axis or blocked (opset 21's
block_size), of an int8, uint8, int4 or uint4 constant: the weights of an onnxruntime QDQ model. Such a node is kept
at load (not folded to float) so that the planner's fold_dequantize_linear pass can give the MatMul, Gemm or Conv that
reads it the quantized weight itself; every other one that pass folds into a float constant.

QuantizeLinear (ONNX): y = saturate(round(x / y_scale) + y_zero_point), to int8 or uint8 (the zero point's type,
uint8 without one), rounding half to even. On constants it folds. On activations, a QuantizeLinear read only by
DequantizeLinears of the same scale and zero point (onnxruntime's quantize_static writes such a pair around each
quantized activation) is folded as the graph is prepared (minirt/qdq.py) into one QuantizeDequantize (minirt's own
op): the pair's float result, clamp(round(x / s), lo - z, hi - z) * s, computed in float32 as onnxruntime computes
each half, on the elementwise kernel. Other run-time quantize or dequantize nodes are refused, naming the node."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError, UnsupportedError
from . import Op, attr, register

QUANT_DTYPES = ("int8", "uint8", "int4", "uint4")
# the values each quantized type holds
QUANT_RANGE = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15), "int16": (-32768, 32767),
               "uint16": (0, 65535)}


def dq_params(node, x_shape, scale, zero, source=""):
    """(scale, zero) of a DequantizeLinear broadcast to x's shape, as float arrays; a ModelError naming the tensor
    where the shapes or types do not fit."""
    x_shape = tuple(x_shape)
    scale = np.asarray(scale, np.float32)
    zero = None if zero is None else np.asarray(zero)
    rank = len(x_shape)
    axis = int(attr(node, "axis", 1))
    block = int(attr(node, "block_size", 0))
    if zero is not None and zero.shape != scale.shape and not zero.size == scale.size == 1:
        raise ModelError(f"{source}{node}: zero point '{node.inputs[2]}' {list(zero.shape)} does not match scale "
                         f"'{node.inputs[1]}' {list(scale.shape)}")
    if not np.all(np.isfinite(scale)):
        raise ModelError(f"{source}{node}: scale '{node.inputs[1]}' holds values that are not finite")
    if block < 0:
        raise ModelError(f"{source}{node}: block_size {block} is negative")
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
    planner_folds = True      # of constants: its output is one once fold_dequantize_linear has run
    limits = ("of int8 / uint8 / int4 / uint4 constants (weights: per tensor, per axis, blocked): into a MatMul or "
              "Gemm they stay int8 (per column) or 4-bit (blocked along K) on the GPU, into a Conv (per output "
              "channel) int8 on its GEMM routes (fold_dequantize_linear), elsewhere they fold to float; of "
              "activations only as a pair after QuantizeLinear (minirt/qdq.py)")

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
            # a weight's rank (MatMul / Gemm, Conv): the planner's fold_dequantize_linear decides whether it stays
            # quantized; biases and norm scales fold to float now, for the ops that need them constant at load
            if x.data.ndim in (2, 3, 4):
                return None
        return super().fold(node, ins)

    @staticmethod
    def check_types(node, ins):
        x, z = ins[0], ins[2] if len(ins) > 2 else None
        if z is not None and z.is_const and z.data.dtype != x.data.dtype:
            raise ModelError(f"{node}: zero point '{z.name}' is {z.data.dtype}, but '{x.name}' is {x.data.dtype}")
        if z is not None and z.is_const:
            check_zero_range(node, z.name, z.data, x.data.dtype.name)
        dq_params(node, x.data.shape, ins[1].data, None if z is None else z.data)

    def check(self, node, ins):
        if not all(t is None or t.is_const for t in ins[1:]):
            return "scale and zero point must be constants"
        return None     # a run-time x: minirt/qdq.py takes it as the second half of a Q/DQ pair, or refuses it

    def lower(self, node, ctx):
        raise UnsupportedError(f"{node}: a DequantizeLinear has no kernel: of a constant it is folded by the planner "
                               f"(fold_dequantize_linear), of an activation it runs only as the second half of a "
                               f"QuantizeLinear -> DequantizeLinear pair (minirt/qdq.py)")


def check_zero_range(node, name, zero, dtype_name, source=""):
    """A ModelError naming zero point `name` where a value lies outside what type `dtype_name` holds."""
    lo, hi = QUANT_RANGE.get(dtype_name, (-np.inf, np.inf))
    z = np.asarray(zero, np.float64)
    bad = (z < lo) | (z > hi)
    if bad.any():
        raise ModelError(f"{source}{node}: zero point '{name}' holds {z[bad].reshape(-1)[0]:g}, outside {dtype_name}'s "
                         f"range {lo}..{hi}")


def q_params(node, ins, source=""):
    """(scale, zero, type name) of a QuantizeLinear's constant scale and zero point (per tensor or per axis, as
    dq_params broadcasts them for shape `ins[0].shape`)."""
    z = ins[2] if len(ins) > 2 else None
    qtype = "uint8" if z is None else z.data.dtype.name
    if qtype not in ("int8", "uint8"):
        raise UnsupportedError(f"{source}{node}: quantizes to {qtype}; minirt quantizes activations to int8 or uint8")
    if int(attr(node, "saturate", 1)) != 1 or attr(node, "output_dtype", 0):
        raise UnsupportedError(f"{source}{node}: attributes saturate 0 / output_dtype are not supported")
    shape = ins[0].shape if ins[0].shape is not None else np.shape(ins[0].data)
    s, zz = dq_params(node, shape, ins[1].data, None if z is None else z.data, source)
    if np.any(np.asarray(s) == 0):
        raise ModelError(f"{source}{node}: scale '{node.inputs[1]}' holds a zero; it divides")
    return s, zz, qtype


def quantize(x, s, z, qtype):
    """ONNX QuantizeLinear: saturate(round_half_even(x / s) + z) in float32, as onnxruntime computes it."""
    lo, hi = QUANT_RANGE[qtype]
    xf = np.asarray(x, np.float32)
    with np.errstate(all="ignore"):
        q = np.rint(xf / np.asarray(s, np.float32)) + (0 if z is None else np.asarray(z, np.float32))
    return np.clip(q, lo, hi).astype(qtype)


@register
class QuantizeLinear(Op):
    name = "QuantizeLinear"
    limits = ("constants fold; on activations only as a pair with DequantizeLinear of the same per-tensor scale and "
              "zero point (minirt/qdq.py); to int8 or uint8")

    def infer(self, node, ins):
        z = ins[2] if len(ins) > 2 else None
        return [(ins[0].shape, "uint8" if z is None else (z.dtype or "uint8"))]

    def reference(self, node, x, scale, zero=None):
        from ..graph import Tensor
        ts = [Tensor("x", data=x), Tensor("s", data=scale), None if zero is None else Tensor("z", data=zero)]
        s, z, qtype = q_params(node, ts)
        return [quantize(x, s, z, qtype)]

    def check(self, node, ins):
        if not all(t is None or t.is_const for t in ins[1:]):
            return "scale and zero point must be constants"
        return None

    def lower(self, node, ctx):
        raise UnsupportedError(f"{node}: QuantizeLinear of a run-time tensor runs only as the first half of a "
                               f"QuantizeLinear -> DequantizeLinear pair of one per-tensor scale and zero point "
                               f"(minirt/qdq.py); minirt keeps activations in float")


@register
class QuantizeDequantize(Op):
    """DequantizeLinear(QuantizeLinear(x, s, z), s, z) in float (minirt/qdq.py): y = clamp(round(x / s),
    lo - z, hi - z) * s with s, z per tensor and lo..hi the quantized type's range; attributes scale, lo, hi (lo - z,
    hi - z)."""
    name, domain = "QuantizeDequantize", "minirt"
    limits = "made as a graph is prepared (minirt/qdq.py) from a QuantizeLinear -> DequantizeLinear pair"
    code = 18      # glsl/unary.comp

    def infer(self, node, ins):
        return [(ins[0].shape, ins[0].dtype)]

    def reference(self, node, x):
        s = np.float32(node.attrs["scale"])
        with np.errstate(all="ignore"):
            q = np.clip(np.rint(np.asarray(x, np.float32) / s), node.attrs["lo"], node.attrs["hi"])
        return [(q.astype(np.float32) * s).astype(x.dtype, copy=False)]

    def lower(self, node, ctx):
        from .elementwise import elementwise_dispatch
        a = node.attrs
        elementwise_dispatch(ctx, "unary", self.code, ctx.t(node.outputs[0]), [ctx.t(node.inputs[0])], flops_per=4,
                             params=(float(a["scale"]), float(a["lo"]), float(a["hi"]),
                                     float(np.float32(1) / np.float32(a["scale"]))))
