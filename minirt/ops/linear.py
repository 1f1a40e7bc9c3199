"""Linear: minirt's own op for x @ W (+ b) (* s) (+ activation) (+ residual), made by the fuse_linear
planner pass from MatMul / Add / Mul / Gelu / Relu / Add chains, so a layer is one GEMM dispatch whose
epilogue does the rest. Inputs: x [.., K], W [K, N] (constant), bias [N] or "", residual [.., N] or "".
Attributes: act ("", "relu", "gelu", "gelu_tanh"), scale (folded into W and b at lowering)."""
from __future__ import annotations

import math

import numpy as np

from . import Op, register
from .elementwise import elementwise_dispatch
from .gemm import linear_dispatch, linear_ok, pack_bias, pack_weight

_erf = np.vectorize(math.erf, otypes=[np.float64])


@register
class Linear(Op):
    name = "Linear"
    domain = "minirt"
    limits = "made by the planner (fuse_linear); W must be a 2-D constant"

    def infer(self, node, ins):
        x, w = ins[0], ins[1]
        return [(tuple(x.shape[:-1]) + (w.shape[1],), x.dtype)]

    def reference(self, node, x, w, b=None, r=None):
        y = x @ w
        if b is not None:
            y = y + b
        y = y * node.attrs.get("scale", 1.0)
        act = node.attrs.get("act", "")
        if act == "relu":
            y = np.maximum(y, 0)
        elif act == "gelu":
            y = 0.5 * y * (1 + _erf(y / math.sqrt(2)))
        elif act == "gelu_tanh":
            y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
        if r is not None:
            y = y + r
        return [y.astype(x.dtype, copy=False)]

    def lower(self, node, ctx):
        g = ctx.graph
        x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        scale = float(node.attrs.get("scale", 1.0))
        w = np.asarray(g.tensor(node.inputs[1]).data, np.float32) * scale
        b = g.tensor(node.inputs[2]).data * scale if len(node.inputs) > 2 and node.inputs[2] else None
        res = ctx.t(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
        act = node.attrs.get("act") or None
        k, n = w.shape
        m = int(np.prod(x.shape[:-1]))
        if linear_ok(ctx, k):
            wt, n4 = pack_weight(ctx, node.inputs[1], w)
            bt = pack_bias(ctx, f"{node.name}.bias", b, n)
            linear_dispatch(ctx, y, x, wt, bt, m, n, k, n4, act=act, residual=res)
            return
        # Other storages: the general matmul kernel with the bias fused, then the epilogue as separate ops.
        from .matmul import matmul_dispatch
        codes = {"relu": 5, "gelu": 3, "gelu_tanh": 4}
        steps = ([act] if act else []) + (["res"] if res is not None else [])
        cur = y if not steps else ctx.temp(f"{y.name}@gemm", y.shape)
        matmul_dispatch(ctx, cur, x, w, bias=None if b is None else b.reshape(1, -1))
        for i, s in enumerate(steps):
            nxt = y if i == len(steps) - 1 else ctx.temp(f"{y.name}@{s}", y.shape)
            if s == "res":
                elementwise_dispatch(ctx, "binary", 0, nxt, [cur, res])
            else:
                elementwise_dispatch(ctx, "unary", codes[s], nxt, [cur], flops_per=8)
            cur = nxt
