"""Conv (1-D and 2-D) with a direct kernel. The weight must be a constant: it is prepacked at load
into blocks of 4 output channels, [O/4][I/g][kh][kw] vec4, so one vec4 read feeds 4 outputs.
A planner pass may route suitable convs to im2col + GEMM; this kernel is the general fallback."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..planner.plan import Push
from . import Op, attr, register


def conv_params(node, in_spatial, k_spatial):
    """(strides, dilations, pads_begin, pads_end, out_spatial) for spatial dims that are ints."""
    nd = len(k_spatial)
    strides = list(attr(node, "strides", [1] * nd))
    dil = list(attr(node, "dilations", [1] * nd))
    auto = attr(node, "auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    eff = [d * (k - 1) + 1 for d, k in zip(dil, k_spatial)]
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(in_spatial, strides)]
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, eff, in_spatial)]
        lo = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        return strides, dil, lo, [t - b for t, b in zip(total, lo)], out
    if auto == "VALID":
        pb = pe = [0] * nd
    elif auto == "NOTSET":
        pads = list(attr(node, "pads", [0] * 2 * nd))
        pb, pe = pads[:nd], pads[nd:]
    else:
        raise ModelError(f"{node}: unknown auto_pad {auto!r}")
    out = [(i + b + e - k) // s + 1 for i, b, e, k, s in zip(in_spatial, pb, pe, eff, strides)]
    if min(out) < 1:
        raise ModelError(f"{node}: input spatial size {list(in_spatial)} is smaller than the kernel")
    return strides, dil, pb, pe, out


@register
class Conv(Op):
    name = "Conv"
    limits = ("1-D and 2-D only (3-D is refused at load); the weight and bias must be constants "
              "(prepacked at load); float32")

    def check(self, node, ins):
        x, w = ins[0], ins[1]
        rank = len(w.shape) if w.shape is not None else len(x.shape) if x.shape is not None else None
        if rank not in (3, 4):
            return (f"{rank - 2}-D convolution (rank-{rank} tensors) is not supported; minirt runs 1-D and 2-D Conv"
                    if rank else "the weight's rank is unknown")
        for i, what in ((1, "weight"), (2, "bias")):
            if len(ins) > i and ins[i] is not None and not ins[i].is_const:
                return (f"{what} '{node.inputs[i]}' is computed at run time; minirt needs Conv {what}s to be "
                        f"constants (they are prepacked at load)")

    def infer(self, node, ins):
        x, w = ins[0], ins[1]
        c, g = x.shape[1], int(attr(node, "group", 1))
        if isinstance(c, int) and (c != w.shape[1] * g or w.shape[0] % g):
            raise ModelError(f"{node}: input has {c} channels but the weight is {list(w.shape)} with group {g}")
        sp = x.shape[2:]
        out = [f"{node.outputs[0]}_d{2 + i}" for i in range(len(sp))]
        if all(isinstance(d, int) for d in sp):
            out = conv_params(node, sp, w.shape[2:])[4]
        return [((x.shape[0], w.shape[0], *out), x.dtype)]

    def reference(self, node, x, w, b=None):
        n, c = x.shape[:2]
        oc, cg, *ks = w.shape
        g = int(attr(node, "group", 1))
        if c != cg * g or oc % g:
            raise ModelError(f"{node}: input has {c} channels, weight {list(w.shape)} with group {g}")
        strides, dil, pb, pe, out = conv_params(node, x.shape[2:], ks)
        xp = np.pad(x, [(0, 0), (0, 0)] + list(zip(pb, pe))).reshape(n, g, cg, *[i + b + e for i, b, e in
                                                                                  zip(x.shape[2:], pb, pe)])
        wg = w.reshape(g, oc // g, cg, *ks)
        y = np.zeros((n, g, oc // g, *out), np.result_type(x, w))
        for k in np.ndindex(*ks):
            sl = tuple(slice(ki * d, ki * d + (o - 1) * s + 1, s) for ki, d, o, s in zip(k, dil, out, strides))
            y += np.einsum("ngc...,goc->ngo...", xp[(Ellipsis, *sl)], wg[(Ellipsis, *k)])
        y = y.reshape(n, oc, *out)
        if b is not None:
            y = y + b.reshape(oc, *[1] * len(out))
        return [y.astype(np.result_type(x, w), copy=False)]

    def lower(self, node, ctx):
        x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        w = np.asarray(ctx.graph.tensor(node.inputs[1]).data, np.float32)
        b = ctx.graph.tensor(node.inputs[2]).data if len(node.inputs) > 2 and node.inputs[2] else None
        strides, dil, pb, _, out = conv_params(node, x.shape[2:], w.shape[2:])
        conv1d = w.ndim == 3
        if conv1d:  # a 1-D conv is a 2-D one of height 1
            w, strides, dil, pb, out = w[:, :, None, :], [1] + strides, [1] + dil, [0] + pb, [1] + out
        oc, icg, kh, kw = w.shape
        g = int(attr(node, "group", 1))
        ocb = -(-oc // 4)
        # [O/4][I/g][kh][kw] vec4: lane l of block o4 is output channel 4*o4 + l (zeros past O)
        wp = np.zeros((ocb * 4, icg, kh, kw), np.float32)
        wp[:oc] = w
        wp = wp.reshape(ocb, 4, icg, kh, kw).transpose(0, 2, 3, 4, 1)
        bp = np.zeros(ocb * 4, np.float32)
        if b is not None:
            bp[:oc] = b
        wt = ctx.weight(node.inputs[1], wp)
        bt = ctx.weight(node.inputs[2] if b is not None else f"{node.outputs[0]}.zero_bias", bp)
        n, (oh, ow) = x.shape[0], out
        p = (Push().sizes(y).sizes(x).ivec4(kh, kw, icg, oc // g).ivec4(strides[0], strides[1], dil[0], dil[1])
             .ivec4(pb[0], pb[1], x.packed_dim, y.packed_dim))
        macs = n * oc * oh * ow * icg * kh * kw
        ctx.dispatch(ctx.variant("conv"), [(y.name, "w"), (x.name, "r"), (wt.name, "r"), (bt.name, "r")], p,
                     (int(conv1d),), (-(-ow // 4), oh, ocb * n), "conv", flops=2 * macs,
                     nbytes=4 * (x.numel + y.numel + wp.size + bp.size))
