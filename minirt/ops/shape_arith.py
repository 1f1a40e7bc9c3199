"""Shape arithmetic that exporters emit around static reshapes (torch.onnx's Shape -> Gather ->
Unsqueeze -> Concat chains, masks built from Range/Equal/Where, ...). These ops never run on the GPU:
they fold to constants when their inputs are known, run on the host each run where their inputs are computed from
the model's integer and boolean inputs (minirt/host.py), and prepare() reports any that read GPU tensors.
Cast is the one exception: float32 -> float32 on a runtime tensor is a view (or a copy)."""
from __future__ import annotations

import functools

import numpy as np

from ..errors import ModelError
from . import Op, attr, register
from ._util import norm_axis
from .shape_ops import int_list, int_operand, view_or_copy

# TensorProto data type -> numpy dtype name (the loader's names)
ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}


class Folded(Op):
    gpu = False
    limits = "at load or on the host: its inputs must be constants or computed from the model's integer inputs"


class StaticShape(Folded):
    """Shape and Size fold whenever the shape is static, even if the tensor's values are not known."""

    def fold(self, node, ins):
        shape = ins[0].shape
        if shape is not None and all(isinstance(d, int) for d in self.dims(node, shape)):
            return self.result(node, shape)
        return None

    def reference(self, node, x):
        return self.result(node, x.shape)


@register
class Shape(StaticShape):
    name = "Shape"

    def dims(self, node, shape):
        return tuple(shape)[int(attr(node, "start", 0)):attr(node, "end")]   # Python clamping is ONNX's

    def result(self, node, shape):
        return [np.array(self.dims(node, shape), np.int64)]


@register
class Size(StaticShape):
    name = "Size"

    def dims(self, node, shape):
        return shape

    def result(self, node, shape):
        return [np.array(int(np.prod(shape, dtype=np.int64)), np.int64)]


@register
class Cast(Op):
    name = "Cast"
    limits = ("on the GPU only float32 -> float32 (a view); other casts fold at load, or run on the host where their "
              "input is computed from the model's integer or boolean inputs")

    def target(self, node, like):
        """The dtype name to cast to; `like` is input 1's dtype name (CastLike)."""
        to = ONNX_DTYPES.get(attr(node, "to"))
        if to is None:
            raise ModelError(f"{node}: cast to ONNX data type {attr(node, 'to')} is not supported")
        return to

    def _target(self, node, ins):
        return self.target(node, ins[1].dtype if len(ins) > 1 else None)

    def check(self, node, ins):
        to = self._target(node, ins)
        if to != "float32" or ins[0].dtype not in ("float32", None):
            return (f"casts a runtime {ins[0].dtype} tensor to {to}; minirt casts only constants (at load) and "
                    f"float32 -> float32 at run time")

    def infer(self, node, ins):
        return [(ins[0].shape, self._target(node, ins))]

    def reference(self, node, x, *like):
        with np.errstate(invalid="ignore"):    # NaN or inf to an integer: onnxruntime's value, no warning
            return [np.asarray(x).astype(self.target(node, like[0].dtype.name if like else None))]

    def lower(self, node, ctx):
        view_or_copy(ctx, ctx.t(node.outputs[0]), ctx.t(node.inputs[0]))


@register
class CastLike(Cast):
    name = "CastLike"

    def target(self, node, like):
        return like


@register
class Range(Folded):
    name = "Range"

    def reference(self, node, start, limit, delta):
        n = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
        return [(start + np.arange(n) * delta).astype(start.dtype)]


@register
class ConstantOfShape(Folded):
    name = "ConstantOfShape"

    def reference(self, node, shape):
        value = np.asarray(attr(node, "value", np.zeros(1, np.float32)))
        return [np.full(tuple(int_list(shape)), value.reshape(-1)[0], value.dtype)]


class Numpy(Folded):
    """A numpy function of the inputs; the result keeps the first input's dtype when `keep` is set."""
    fn = None
    keep = True

    def reference(self, node, *xs):
        with np.errstate(all="ignore"):
            r = np.asarray(self.fn(*xs))
        return [r.astype(xs[0].dtype) if self.keep else r]


def _variadic(f):
    return lambda *xs: functools.reduce(f, xs)


_NUMPY = {   # name: (function, keep the first input's dtype)
    "Equal": (np.equal, False), "Less": (np.less, False), "Greater": (np.greater, False),
    "LessOrEqual": (np.less_equal, False), "GreaterOrEqual": (np.greater_equal, False),
    "Not": (np.logical_not, False), "And": (np.logical_and, False), "Or": (np.logical_or, False),
    "Xor": (np.logical_xor, False), "Where": (np.where, False),
    "Min": (_variadic(np.minimum), True), "Max": (_variadic(np.maximum), True), "Sum": (_variadic(np.add), True),
    "Floor": (np.floor, True), "Ceil": (np.ceil, True)}
for _name, (_fn, _keep) in _NUMPY.items():
    register(type(_name, (Numpy,), {"name": _name, "fn": staticmethod(_fn), "keep": _keep}))


@register
class Mod(Folded):
    name = "Mod"

    def reference(self, node, a, b):
        with np.errstate(all="ignore"):
            return [(np.fmod if attr(node, "fmod", 0) else np.mod)(a, b).astype(np.result_type(a, b))]


@register
class ReduceProd(Folded):
    name = "ReduceProd"

    def reference(self, node, x, *rest):
        axes = int_operand(node, [x, *rest], 1, "axes")
        if not axes and attr(node, "noop_with_empty_axes", 0):
            return [x]
        axes = tuple(range(x.ndim)) if not axes else tuple(a % x.ndim for a in axes)
        return [np.prod(x, axis=axes, keepdims=bool(attr(node, "keepdims", 1))).astype(x.dtype)]



@register
class GatherElements(Folded):
    name = "GatherElements"

    def reference(self, node, x, indices):
        axis = norm_axis(node, int(attr(node, "axis", 0)), x.ndim)
        idx, d = np.asarray(indices).astype(np.int64), x.shape[axis]
        if idx.size and (idx.min() < -d or idx.max() >= d):
            raise ModelError(f"{node}: indices out of range for axis {axis} of size {d}")
        return [np.take_along_axis(x, np.where(idx < 0, idx + d, idx), axis=axis)]


@register
class CumSum(Folded):
    name = "CumSum"

    def reference(self, node, x, axis):
        a = norm_axis(node, int(np.asarray(axis).reshape(-1)[0]), x.ndim)
        y = np.flip(x, a) if attr(node, "reverse", 0) else x
        with np.errstate(all="ignore"):
            y = np.cumsum(y, axis=a, dtype=x.dtype)
        if attr(node, "exclusive", 0):      # each sum without its own element: shifted by one, 0 first
            y = np.concatenate([np.zeros_like(np.take(y, [0], axis=a)), np.delete(y, -1, axis=a)], axis=a)
        return [np.flip(y, a) if attr(node, "reverse", 0) else y]


@register
class Trilu(Folded):
    name = "Trilu"

    def reference(self, node, x, k=None):
        k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
        return [(np.triu if attr(node, "upper", 1) else np.tril)(x, k)]


@register
class IsNaN(Folded):
    name = "IsNaN"

    def reference(self, node, x):
        return [np.isnan(x)]


@register
class IsInf(Folded):
    name = "IsInf"

    def reference(self, node, x):
        pos, neg = attr(node, "detect_positive", 1), attr(node, "detect_negative", 1)
        return [(np.isposinf(x) & bool(pos)) | (np.isneginf(x) & bool(neg))]
