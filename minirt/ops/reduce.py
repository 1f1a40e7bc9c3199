"""Reductions over any set of axes: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceL2 (one kernel, the
function chosen by a specialization constant). Axes come from the attribute (before opset 18; 13 for
ReduceSum) or from the second input, which must be a constant. GlobalAveragePool and GlobalMaxPool are the mean
and max over the spatial dims on the same kernel."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..kernels import spec
from ..plan import Push
from . import Op, attr, register
from ._util import norm_axis
from .elementwise import copy_dispatch


def reduce_dispatch(ctx, out, x, axes, code):
    """out = x reduced over the ONNX `axes` by glsl/reduce.comp's OP `code` (out: keepdims or not)."""
    mask = sum(1 << (len(x.shape) - 1 - a) for a in axes)
    p = Push().sizes(out).sizes(x).ivec4(out.packed_dim, x.packed_dim, mask)
    ctx.dispatch("reduce", [(out.name, "w"), (x.name, "r")], p, spec("reduce", OP=code),
                 out.texel_extents, "elementwise", flops=x.numel, nbytes=4 * (x.numel + out.numel),
                 axes={"storage": ctx.storage})


class Reduce(Op):
    code = 0
    exact = False         # a sum: the reference adds float inputs in float64 (see reference)
    limits = ("the axes input must be a constant; one invocation per output element loops over all its "
              "reduced elements (fine for rows, slow for reducing a whole large tensor to a few values)")

    def axes(self, node, rank, axes_input=None):
        """Normalised reduced axes, or None for a no-op (empty axes with noop_with_empty_axes)."""
        axes = axes_input if axes_input is not None else attr(node, "axes")
        axes = [] if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
        if not axes:
            return None if attr(node, "noop_with_empty_axes", 0) else tuple(range(rank))
        return tuple(sorted({norm_axis(node, a, rank) for a in axes}))

    def _axes_of(self, node, ins):
        t = ins[1] if len(ins) > 1 else None
        return self.axes(node, len(ins[0].shape), None if t is None else t.data)

    def infer(self, node, ins):
        axes, shape = self._axes_of(node, ins), tuple(ins[0].shape)
        if axes is not None:
            keep = attr(node, "keepdims", 1)
            shape = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
        return [(shape, ins[0].dtype)]

    def reference(self, node, x, axes=None):
        ax = self.axes(node, x.ndim, axes)
        if ax is None:
            return [x]
        # float sums in float64: the kernel's do not overflow on the way either (a running sum that overflows is
        # taken again, scaled), so only a sum whose value is past float32's range is inf
        xs = x.astype(np.float64) if x.dtype.kind == "f" and self.exact else x
        with np.errstate(over="ignore"):
            return [np.asarray(self.fn(xs, ax, keepdims=bool(attr(node, "keepdims", 1)))).astype(x.dtype)]

    def check(self, node, ins):
        if len(ins) > 1 and ins[1] is not None and not ins[1].is_const:
            return f"the axes input ('{node.inputs[1]}') is computed at run time; minirt needs it to be a constant"

    def lower(self, node, ctx):
        x, out = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        axes_in = ctx.graph.tensor(node.inputs[1]).data if len(node.inputs) > 1 and node.inputs[1] else None
        axes = self.axes(node, len(x.shape), axes_in)
        if axes is None:
            if ctx.can_view(out, x):
                ctx.view(out, x)
            else:
                copy_dispatch(ctx, out, x)
            return
        reduce_dispatch(ctx, out, x, axes, self.code)


@register
class ReduceSum(Reduce):
    name, code, fn, exact = "ReduceSum", 0, staticmethod(np.sum), True


@register
class ReduceMean(Reduce):
    name, code, fn, exact = "ReduceMean", 1, staticmethod(np.mean), True


@register
class ReduceMax(Reduce):
    name, code, fn = "ReduceMax", 2, staticmethod(np.max)


@register
class ReduceMin(Reduce):
    name, code, fn = "ReduceMin", 3, staticmethod(np.min)


def _l2(x, axes, keepdims):
    return np.sqrt(np.sum(np.square(x), axes, keepdims=keepdims))


@register
class ReduceL2(Reduce):
    name, code, fn, exact = "ReduceL2", 4, staticmethod(_l2), True


class GlobalPool(Op):
    """The mean or max over every dim after the first two (N, C): [N, C, H, W] -> [N, C, 1, 1]."""
    code = 0
    fn = None

    def infer(self, node, ins):
        shape = tuple(ins[0].shape)
        if len(shape) < 3:
            raise ModelError(f"{node}: {self.name} needs an input of rank >= 3 (N, C, spatial dims), got {list(shape)}")
        return [(shape[:2] + (1,) * (len(shape) - 2), ins[0].dtype)]

    def reference(self, node, x):
        xs = x.astype(np.float64) if x.dtype.kind == "f" else x
        return [np.asarray(type(self).fn(xs, tuple(range(2, x.ndim)), keepdims=True)).astype(x.dtype)]

    def lower(self, node, ctx):
        x = ctx.t(node.inputs[0])
        reduce_dispatch(ctx, ctx.t(node.outputs[0]), x, range(2, len(x.shape)), self.code)


@register
class GlobalAveragePool(GlobalPool):
    name, code, fn = "GlobalAveragePool", 1, staticmethod(np.mean)


@register
class GlobalMaxPool(GlobalPool):
    name, code, fn = "GlobalMaxPool", 2, staticmethod(np.max)
