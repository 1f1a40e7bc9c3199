"""Pad in constant, reflect, edge and wrap mode, one padding copy on glsl/copy.comp (MODE 2). From opset 11 pads and
constant_value are inputs, and from opset 18 axes too; minirt needs them to be constants. Negative pads crop, in
constant mode. Tile is the same copy in wrap mode, padded at the end of each axis by the repeats after the first."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from . import attr, register
from ._util import norm_axis
from .shape_ops import PAD, ShapeOp, _copy, int_list, int_operand

MODES = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}   # copy.comp's pad modes


def _mode(node) -> str:
    m = attr(node, "mode", "constant")
    return m.decode() if isinstance(m, bytes) else m


@register
class Pad(ShapeOp):
    name, consts = "Pad", (1, 2, 3)
    limits = ("pads, constant_value and axes must be constants after folding; negative pads (cropping) in constant "
              "mode only")

    def _pads(self, node, rank, xs):
        """(begin, end) pads for each of the rank axes."""
        pads = int_operand(node, xs, 1, "pads")
        if pads is None:
            raise ModelError(f"{node}: no pads given")
        axes = int_operand(node, xs, 3)
        axes = list(range(rank)) if axes is None else [norm_axis(node, a, rank) for a in axes]
        if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
            raise ModelError(f"{node}: {len(pads)} pads for axes {axes} (expected 2 per axis)")
        begin, end = [0] * rank, [0] * rank
        for k, a in enumerate(axes):
            begin[a], end[a] = pads[k], pads[k + len(axes)]
        return begin, end

    @staticmethod
    def _value(node, xs) -> float:
        if len(node.inputs) > 2 and node.inputs[2]:
            v = np.asarray(xs[2]).reshape(-1)
            return float(v[0]) if v.size else 0.0
        return float(attr(node, "value", 0.0))

    def check(self, node, ins):
        reason = super().check(node, ins)
        if reason:
            return reason
        if _mode(node) not in MODES:
            return f"mode {_mode(node)!r} (expected one of {', '.join(MODES)})"
        if _mode(node) != "constant" and ins[0].shape is not None:
            begin, end = self._pads(node, len(ins[0].shape), [None if t is None else t.data for t in ins])
            if min(begin + end) < 0:
                return (f"negative pads {begin + end} (cropping) in mode {_mode(node)!r}; minirt crops in constant "
                        f"mode only")

    def out_shape(self, node, shape, xs):
        begin, end = self._pads(node, len(shape), xs)
        out = []
        for a, (d, b, e) in enumerate(zip(shape, begin, end)):
            if isinstance(d, int):
                if d + b + e < 0:
                    raise ModelError(f"{node}: pads {b}, {e} crop more than axis {a}'s {d} elements")
                out.append(d + b + e)
            else:
                out.append(d if b == e == 0 else f"{node.name}:{a}")
        return tuple(out)

    def reference(self, node, x, *rest):
        xs = [x, *rest]
        begin, end = self._pads(node, x.ndim, xs)
        x = x[tuple(slice(max(-b, 0), d - max(-e, 0)) for d, b, e in zip(x.shape, begin, end))]   # negative: crop
        width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
        if _mode(node) == "constant":
            return [np.pad(x, width, constant_values=np.asarray(self._value(node, xs)).astype(x.dtype))]
        return [np.pad(x, width, mode=_mode(node))]

    def lower(self, node, ctx):
        out, src = ctx.t(node.outputs[0]), ctx.t(node.inputs[0])
        xs = [ctx.graph.tensor(i).data if i else None for i in node.inputs]
        begin, _ = self._pads(node, len(src.shape), xs)
        start = [0] * 4
        for a, b in enumerate(begin):
            start[len(src.shape) - 1 - a] = -b          # ONNX axis -> WHCN dim
        _copy(ctx, out, src, PAD, start, pad=(MODES[_mode(node)], self._value(node, xs)))


@register
class Tile(ShapeOp):
    name, consts = "Tile", (1,)
    limits = "repeats must be a constant after folding"

    @staticmethod
    def _repeats(node, rank, xs):
        reps = int_list(xs[1])
        if len(reps) != rank or min(reps, default=1) < 1:
            raise ModelError(f"{node}: repeats {reps} for an input of rank {rank} (expected {rank} values >= 1)")
        return reps

    def out_shape(self, node, shape, xs):
        reps = self._repeats(node, len(shape), xs)
        return tuple(d * r if isinstance(d, int) else (d if r == 1 else f"{node.name}:{a}")
                     for a, (d, r) in enumerate(zip(shape, reps)))

    def reference(self, node, x, repeats):
        return [np.tile(x, self._repeats(node, x.ndim, [x, repeats]))]

    def lower(self, node, ctx):
        _copy(ctx, ctx.t(node.outputs[0]), ctx.t(node.inputs[0]), PAD, pad=(MODES["wrap"], 0.0))
