"""BatchNormalization in inference mode: y = x * s + t per channel, with s = scale / sqrt(var + epsilon) and
t = B - mean * s computed at load in float64. Exporters fold a BatchNorm into the Conv before it when they fold
constants, and so does the fold_batch_norm pass; one that follows anything else (a pre-activation network's
BN -> ReLU -> Conv, a BatchNorm1d after a Linear) runs as two elementwise dispatches (Mul by s, Add t) on the binary
kernel."""
from __future__ import annotations

import numpy as np

from ..plan import CONSTANT
from . import Op, attr, register
from ._util import same
from .elementwise import Add, Mul, elementwise_dispatch


def affine(node, scale, bias, mean, var, rank):
    """(s, t) as float64 arrays shaped [C, 1, ...] to broadcast against an input of `rank` (N, C, spatial...)."""
    s = np.asarray(scale, np.float64) / np.sqrt(np.asarray(var, np.float64) + attr(node, "epsilon", 1e-5))
    t = np.asarray(bias, np.float64) - np.asarray(mean, np.float64) * s
    shape = (-1,) + (1,) * (rank - 2)
    return s.reshape(shape), t.reshape(shape)


@register
class BatchNormalization(Op):
    name = "BatchNormalization"
    limits = ("inference mode only (training_mode=0, the Y output alone); scale, B, mean and var must be constants; "
              "two elementwise dispatches, none after a Conv (the fold_batch_norm pass folds it into the conv)")

    def infer(self, node, ins):
        return same(node, ins)[:1]

    def check(self, node, ins):
        if int(attr(node, "training_mode", 0)) != 0:
            return "training_mode=1 is not supported (minirt runs BatchNormalization in inference mode)"
        if any(node.outputs[1:]):
            return "the running_mean and running_var outputs are not supported (only Y, in inference mode)"
        if int(attr(node, "spatial", 1)) != 1:
            return "spatial=0 (one statistic per element, opset < 9) is not supported"
        for t, what in zip(ins[1:5], ("scale", "B", "input_mean", "input_var")):
            if not t.is_const:
                return f"{what} ('{t.name}') is computed at run time; minirt needs it to be a constant"
        if ins[0].shape is None:
            return None
        if len(ins[0].shape) < 2:
            return f"input '{node.inputs[0]}' has rank {len(ins[0].shape)}; BatchNormalization needs (N, C, ...)"
        c = ins[0].shape[1]
        for t, what in zip(ins[1:5], ("scale", "B", "input_mean", "input_var")):
            if isinstance(c, int) and tuple(t.shape) != (c,):
                return f"{what} ('{t.name}') has shape {list(t.shape)}, expected [{c}] (one per channel)"

    def reference(self, node, x, scale, bias, mean, var):
        s, t = affine(node, scale, bias, mean, var, x.ndim)
        return [(x.astype(np.float64) * s + t).astype(x.dtype)]

    def lower(self, node, ctx):
        x, out = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        consts = [ctx.graph.tensor(n).data for n in node.inputs[1:5]]
        s, t = affine(node, *consts, len(x.shape))
        s_t, t_t = (ctx.temp(f"{node.name}/{what}", a.shape, role=CONSTANT) for what, a in (("s", s), ("t", t)))
        s_t.data, t_t.data = s.astype(np.float32), t.astype(np.float32)
        scaled = ctx.temp(f"{node.name}/scaled", x.shape)
        elementwise_dispatch(ctx, "binary", Mul.code, scaled, [x, s_t])
        elementwise_dispatch(ctx, "binary", Add.code, out, [scaled, t_t])
