"""ConvTranspose (1-D and 2-D) as a GEMM and a gather. The GEMM (glsl/gemm.comp, A read from the NCHW input, one
work-group layer per group) makes the columns: for every input position and group, what each (output channel, tap)
pair receives, [G * N * H, W, C_out / G * KH * KW]. glsl/col2im.comp then gives each output element its bias plus
the columns of the (input position, tap) pairs that land on it, in a fixed order: no atomics, the same bits on every
run. The weight [C_in, C_out / G, kh, kw] must be a constant: it is packed at load as the GEMM's B, group after group.
A 1-D ConvTranspose runs as a 2-D one of height 1."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..kernels.gemm import gemm_dispatch, pack_weight
from ..plan import Push
from . import Op, attr, register
from .conv import _as4d, _from4d, _out4d, rank_reason


def _auto_pad(node) -> str:
    auto = attr(node, "auto_pad", "NOTSET")
    return auto.decode() if isinstance(auto, bytes) else auto


def conv_transpose_params(node, in_spatial, k_spatial):
    """(strides, dilations, pads_begin, out_spatial) for spatial dims that are ints. Output position o takes the
    taps whose full-size position i * stride + k * dilation is o + pads_begin. With output_shape or auto_pad SAME_*
    (whose output is input * stride) the pads come from the total padding (full size - output size), as ONNX defines
    it: SAME_UPPER puts the odd one at the end, SAME_LOWER and explicit output_shape at the start. Where the output is
    larger than the full size, SAME_* pads negatively as ONNX's reference does (onnxruntime instead gives the full
    size), and an explicit output_shape pads nothing at the start (its last positions hold the bias alone)."""
    nd = len(k_spatial)
    strides = [int(s) for s in attr(node, "strides", [1] * nd)]
    dil = [int(d) for d in attr(node, "dilations", [1] * nd)]
    opad = [int(p) for p in attr(node, "output_padding", [0] * nd)]
    if len(strides) != nd or len(dil) != nd or len(opad) != nd or len(in_spatial) != nd:
        raise ModelError(f"{node}: strides {strides}, dilations {dil}, output_padding {opad} or the input's spatial "
                         f"dims {list(in_spatial)} do not have {nd} values (one per spatial dim of the weight)")
    if min(strides) < 1 or min(dil) < 1 or min(opad) < 0:
        raise ModelError(f"{node}: strides {strides} and dilations {dil} must be positive, output_padding {opad} "
                         f"not negative")
    full = [s * (i - 1) + p + d * (k - 1) + 1 for s, i, p, d, k in zip(strides, in_spatial, opad, dil, k_spatial)]
    auto = _auto_pad(node)
    out_shape = attr(node, "output_shape")
    if auto in ("SAME_UPPER", "SAME_LOWER") or out_shape is not None:
        out = [int(o) for o in out_shape[-nd:]] if out_shape is not None else [i * s for i, s in
                                                                                  zip(in_spatial, strides)]
        total = [f - o if auto.startswith("SAME") else max(0, f - o) for f, o in zip(full, out)]
        pb = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    elif auto == "VALID":
        pb, out = [0] * nd, full
    elif auto == "NOTSET":
        pads = [int(p) for p in attr(node, "pads", [0] * 2 * nd)]
        if len(pads) != 2 * nd:
            raise ModelError(f"{node}: pads {pads} do not have {2 * nd} values")
        pb = pads[:nd]
        out = [f - b - e for f, b, e in zip(full, pb, pads[nd:])]
    else:
        raise ModelError(f"{node}: unknown auto_pad {auto!r}")
    if min(out) < 1:
        raise ModelError(f"{node}: the output would have spatial size {out}")
    return strides, dil, pb, out


@register
class ConvTranspose(Op):
    name = "ConvTranspose"
    limits = ("1-D and 2-D only (3-D is refused at load); the weight and bias must be constants (packed at load); any "
              "group count; auto_pad SAME_* with a stride past the kernel's span gives input * stride positions, as "
              "ONNX defines (onnxruntime gives fewer)")

    def check(self, node, ins):
        w = ins[1]
        why = rank_reason(node, ins, "transposed convolution")
        if why:
            return why
        for i, what in ((1, "weight"), (2, "bias")):
            if len(ins) > i and ins[i] is not None and not ins[i].is_const and not ins[i].planner_const:
                return (f"{what} '{node.inputs[i]}' is computed at run time; minirt needs ConvTranspose {what}s to "
                        f"be constants (they are packed at load)")
        ks = attr(node, "kernel_shape")
        if ks is not None and w.shape is not None and [int(k) for k in ks] != list(w.shape[2:]):
            return f"kernel_shape {list(ks)} differs from the weight's {list(w.shape[2:])}"
        g = int(attr(node, "group", 1))
        b = ins[2] if len(ins) > 2 else None
        if b is not None and b.shape is not None and w.shape is not None and tuple(b.shape) != (w.shape[1] * g,):
            return (f"bias '{node.inputs[2]}' has shape {list(b.shape)}, expected [{w.shape[1] * g}] (one per output "
                    f"channel)")

    def infer(self, node, ins):
        x, w = ins[0], ins[1]
        c, g = x.shape[1], int(attr(node, "group", 1))
        if len(x.shape) != len(w.shape) or g < 1:
            raise ModelError(f"{node}: input of rank {len(x.shape)}, weight {list(w.shape)}, group {g}")
        if isinstance(c, int) and (c != w.shape[0] or c % g):
            raise ModelError(f"{node}: input has {c} channels but the weight is {list(w.shape)} with group {g}")
        sp = x.shape[2:]
        out = [f"{node.outputs[0]}_d{2 + i}" for i in range(len(sp))]
        if all(isinstance(d, int) for d in sp):
            out = conv_transpose_params(node, sp, w.shape[2:])[3]
        return [((x.shape[0], w.shape[1] * g, *out), x.dtype)]

    def reference(self, node, x, w, b=None):
        """Scatter form (each input position adds its taps' products where they land), in float64."""
        n, c, *sp = x.shape
        _, ocg, *ks = w.shape
        g = int(attr(node, "group", 1))
        strides, dil, pb, out = conv_transpose_params(node, sp, ks)
        xg = x.reshape(n, g, c // g, *sp).astype(np.float64)
        wg = w.reshape(g, c // g, ocg, *ks).astype(np.float64)
        y = np.zeros((n, g, ocg, *out))
        for k in np.ndindex(*ks):
            part = np.einsum("ngc...,gco->ngo...", xg, wg[(Ellipsis, *k)])
            src, dst = [], []
            for i, s, d, kk, p, o in zip(sp, strides, dil, k, pb, out):
                lo = max(0, -(-(p - kk * d) // s))              # first input position landing at o >= 0
                hi = min(i - 1, (o - 1 + p - kk * d) // s)      # last landing at o < out
                if hi < lo:
                    break
                src.append(slice(lo, hi + 1))
                dst.append(slice(lo * s + kk * d - p, hi * s + kk * d - p + 1, s))
            else:
                y[(Ellipsis, *dst)] += part[(Ellipsis, *src)]
        y = y.reshape(n, g * ocg, *out)
        if b is not None:
            y = y + np.asarray(b, np.float64).reshape(-1, *[1] * len(out))
        return [y.astype(np.result_type(x, w))]

    def lower(self, node, ctx):
        x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        w = np.asarray(ctx.graph.tensor(node.inputs[1]).data, np.float32)
        b = ctx.graph.tensor(node.inputs[2]).data if len(node.inputs) > 2 and node.inputs[2] else None
        strides, dil, pb, _ = conv_transpose_params(node, x.shape[2:], w.shape[2:])
        if w.ndim == 3:    # 1-D: a 2-D ConvTranspose of height 1
            w, strides, dil, pb = w[:, :, None, :], [1] + strides, [1] + dil, [0] + pb
        x4, y4 = _as4d(ctx, x), _out4d(ctx, y)
        c, ocg, kh, kw = w.shape
        g = int(attr(node, "group", 1))
        n, _, h, wd = x4.shape
        cg, ncols, m = c // g, ocg * kh * kw, n * h * wd
        # B: group after group, [G * C/G, C_out/G * KH * KW], columns ordered (output channel, kh, kw)
        wt, n4 = pack_weight(ctx, f"{node.inputs[1]}@cols", w.reshape(c, ncols))   # a layout of its own
        zero = ctx.weight(f"{node.name}.gemm_zero", np.zeros(n4 * 4, np.float32))    # the bias comes in col2im
        cols = ctx.temp(f"{node.outputs[0]}@cols", (g * n * h, wd, ncols))
        gemm_dispatch(ctx, cols, x4, wt, zero, m, ncols, cg, n4, a_mode=1, out_mode=0, groups=g)
        bias = np.zeros(y4.shape[1], np.float32) if b is None else np.asarray(b, np.float32)
        bt = ctx.weight(f"{node.name}.bias", bias)
        p = (Push().sizes(y4).sizes(cols).ivec4(kh, kw, strides[0], strides[1]).ivec4(pb[0], pb[1], dil[0], dil[1])
             .ivec4(h, wd, ocg, n).ivec4(y4.packed_dim, cols.packed_dim))
        taps = -(-kh // strides[0]) * -(-kw // strides[1])
        ctx.dispatch("col2im", [(y4.name, "w"), (cols.name, "r"), (bt.name, "r")], p, (), y4.texel_extents,
                     "elementwise", flops=y4.numel * taps, nbytes=4 * (y4.numel * (taps + 1)),
                     axes={"storage": ctx.storage})
        _from4d(ctx, y4, y)
        ctx.note(f"GEMM to columns (M {m}, K {cg}, N {ncols}, {g} group(s)) + col2im gather")
