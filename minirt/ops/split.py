"""Split: each output one gather copy of its part of the input (glsl/copy.comp, as Slice). The part sizes come from
the split input (opset 13+; a constant), the split attribute (before 13), num_outputs (opset 18: parts of
ceil(d / n), the last one smaller) or, failing those, equal parts, one per output."""
from __future__ import annotations

from ..errors import ModelError
from . import attr, register
from ._util import norm_axis
from .shape_ops import ShapeOp, affine_copy, int_operand


@register
class Split(ShapeOp):
    name, consts = "Split", (1,)
    limits = "the split input must be a constant after folding; each output is a copy"

    def _parts(self, node, shape, xs):
        """(axis, [part sizes]) for a static dim along the axis."""
        axis = norm_axis(node, int(attr(node, "axis", 0)), len(shape))
        d, n = shape[axis], len(node.outputs)
        if not isinstance(d, int):
            raise ModelError(f"{node}: split axis {axis} has a symbolic size ({d})")
        sizes = int_operand(node, xs, 1, "split")
        if sizes is None and attr(node, "num_outputs") is not None:
            k = int(attr(node, "num_outputs"))
            if k != n:
                raise ModelError(f"{node}: num_outputs {k} but {n} outputs")
            step = -(-d // k)
            sizes = [min(step, d - i * step) for i in range(k)]
        elif sizes is None:
            if d % n:
                raise ModelError(f"{node}: axis {axis} of size {d} does not split into {n} equal parts")
            sizes = [d // n] * n
        if len(sizes) != n or sum(sizes) != d or min(sizes) < 0:
            raise ModelError(f"{node}: parts {sizes} do not split axis {axis} of size {d} into {n} outputs")
        return axis, sizes

    def infer(self, node, ins):
        xs = [None if t is None else t.data for t in ins]
        shape = tuple(ins[0].shape)
        axis, sizes = self._parts(node, shape, xs)
        return [(shape[:axis] + (s,) + shape[axis + 1:], ins[0].dtype) for s in sizes]

    def reference(self, node, x, *rest):
        axis, sizes = self._parts(node, x.shape, [x, *rest])
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return [x.take(range(b, b + s), axis=axis) for b, s in zip(starts, sizes)]

    def lower(self, node, ctx):
        src = ctx.t(node.inputs[0])
        xs = [ctx.graph.tensor(i).data if i else None for i in node.inputs]
        axis, sizes = self._parts(node, src.shape, xs)
        start = 0
        for name, size in zip(node.outputs, sizes):
            if name:
                affine_copy(ctx, ctx.t(name), src, [(start if a == axis else 0, 1, a) for a in range(len(src.shape))])
            start += size
