"""Attention (domain minirt): multi-head softmax(scale * q k^T [+ mask]) v in one flash-style kernel
(glsl/attention.comp), made by the fuse_attention pass from the exporters' head-split MatMul/Softmax
chain. q [B, Tq, D], k and v [B, Tk, D], out [B, Tq, D]; head h is columns h*dh .. h*dh + dh - 1. An optional fourth
input is an additive float mask whose shape, padded to 4 dims, is the attribute mask_shape: each dim 1 (broadcast) or
B, H, Tq, Tk; nan_zero = 1: a row whose every score is -inf gives 0 (else NaN, as Softmax does)."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..kernels import attention_fp32
from ..kernels.attention_fp32 import MAX_HEAD_DIM
from . import Op, attr, register


@register
class Attention(Op):
    name, domain = "Attention", "minirt"
    limits = (f"internal, made by the fuse_attention pass (Session option fuse_attention=False turns it off); "
              f"head dim a multiple of 4 up to {MAX_HEAD_DIM}; an additive float mask broadcasting to [B, H, Tq, Tk] "
              f"(masks are computed on the host, causal ones too); at fp16 on cooperative matrices where the device has them "
              f"(with a mask only where the registers' layout is known: attention_cmr); at fp32 with "
              f"fp32_precision=f16x3 attention_cmr's split variant where that kernel's conditions hold")

    def infer(self, node, ins):
        q, k, v = (t.shape for t in ins[:3])
        if len(q) != 3 or len(k) != 3 or len(v) != 3 or k != v or q[0] != k[0] or q[2] != k[2]:
            raise ModelError(f"{node}: expects q [B, Tq, D], k and v [B, Tk, D], got {list(q)} {list(k)} {list(v)}")
        if len(ins) > 3:
            ms, m = list(attr(node, "mask_shape", [])), tuple(ins[3].shape)
            full = (q[0], attr(node, "heads", 1), q[1], k[1])
            if len(ms) != 4 or len(m) > 4 or (1,) * (4 - len(m)) + m != tuple(ms) or \
                    any(d not in (1, f) for d, f in zip(ms, full)):
                raise ModelError(f"{node}: mask {list(m)} (mask_shape {ms}) does not broadcast to the scores "
                                 f"{list(full)}")
        return [(q, ins[0].dtype)]

    @staticmethod
    def head_problem(d, heads):
        """Why D split into `heads` heads cannot run on the kernel, or None (the fusion pass asks first)."""
        if heads < 1 or d % heads:
            return f"D = {d} is not divisible by heads = {heads}"
        dh = d // heads
        if dh % 4 or dh > MAX_HEAD_DIM:
            return f"head dim {dh} is not a multiple of 4 in 4 .. {MAX_HEAD_DIM}"
        return None

    def check(self, node, ins):
        d = ins[0].shape[-1] if ins[0].shape else None
        return self.head_problem(d, attr(node, "heads", 1)) if isinstance(d, int) else None

    def reference(self, node, q, k, v, mask=None):
        h, scale = attr(node, "heads", 1), attr(node, "scale", 1.0)

        def split(x):   # [B, T, D] -> [B, H, T, dh]
            return x.reshape(x.shape[0], x.shape[1], h, -1).transpose(0, 2, 1, 3)

        s = split(q) @ split(k).transpose(0, 1, 3, 2) * np.asarray(scale, q.dtype)
        if mask is not None:
            s = s + mask.reshape(attr(node, "mask_shape")).astype(s.dtype, copy=False)
        with np.errstate(invalid="ignore"):     # a row of only -inf: NaN, as Softmax gives
            e = np.exp(s - s.max(-1, keepdims=True))
            p = e / e.sum(-1, keepdims=True)
        if attr(node, "nan_zero", 0):
            p = np.where(np.isnan(p), 0, p)
        o = p @ split(v)
        return [o.transpose(0, 2, 1, 3).reshape(q.shape).astype(q.dtype, copy=False)]

    def lower(self, node, ctx):
        attention_fp32.lower(node, ctx)      # the attention family picks the kernel
