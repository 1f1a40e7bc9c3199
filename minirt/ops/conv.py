"""Conv (1-D and 2-D) with a direct kernel. The weight must be a constant: it is prepacked at load
into blocks of 4 output channels, [O/4][I/g][kh][kw] vec4, so one vec4 read feeds 4 outputs.
A planner pass may route suitable convs to im2col + GEMM; this kernel is the general fallback.

Planner-private attributes: _route (conv_routing), _act (fuse_activation), _out_layout "NLC"
(conv_output_nlc and conv_input_nlc, im2col only): the output is [N, H * W, C], channels last, and an optional 4th
input is a residual added after bias and activation; and _in_layout "NLC" (conv_input_nlc, im2col only, 1-D): the
input is [N, L, C], channels last, for the [N, C, L] (or, rewritten to 2-D, [N, C, 1, L]) the conv computes over.
_in_layout / _out_layout "NHWC" (conv_channels_last, routes linear and im2col, 2-D): the input / output is
[N, H, W, C] for the [N, C, H, W] the conv computes over; a channels-last output holds the whole batch's GEMM rows, and
may have a residual as 4th input (an _act "res+<act>" comes after it: minirt.kernels.RES_FIRST).
_wq (fold_dequantize_linear, quantize_weights): the weight is int8 with a scale an output channel: (scale [O], zero
point [O] or None) of a QDQ model's weight, which W (its float value) divides back into whole numbers, or "int8"
(option quantize_weights: quantized here per output channel, symmetric). The GEMM routes on the buffer GEMM (linear, im2col)
then read it at a byte a weight (ops/int8_weight.py); the other routes, which have no int8 kernel, read W in float and
the plan notes it."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError, UnsupportedError
from ..kernels import act_code, activate, spec
from ..kernels.gemm import OUT_NCHW, OUT_ROWS, gemm_dispatch, linear_dispatch, linear_ok, pack_bias, pack_weight
from ..plan import Push
from ..quant import quantize_rows
from . import Op, attr, register
from .int8_weight import Int8Weight


def _nchw_shape(node, shape, nd):
    """The [N, C, (H,) W] a conv of nd spatial dims computes over: a channels-last input (_in_layout "NLC", [N, L, C])
    is [N, C, L] (nd 1) or [N, C, 1, L] (nd 2)."""
    if node.attrs.get("_in_layout") == "NLC":
        n, length, c = shape
        return (n, c, length) if nd == 1 else (n, c, 1, length)
    if node.attrs.get("_in_layout") == "NHWC":
        n, h, w, c = shape
        return (n, c, h, w)
    return tuple(shape)


def conv_params(node, in_spatial, k_spatial, ceil_mode=False):
    """(strides, dilations, pads_begin, pads_end, out_spatial) for spatial dims that are ints. ceil_mode (pooling, with
    explicit pads): a last window that starts past the end of the rows still counts, unless it starts past the input
    and its leading pad (where it would hold padding only)."""
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
    if ceil_mode:
        out = [-(-(i + b + e - k) // s) + 1 for i, b, e, k, s in zip(in_spatial, pb, pe, eff, strides)]
        out = [o - 1 if (o - 1) * s >= i + b else o for o, s, i, b in zip(out, strides, in_spatial, pb)]
    if min(out) < 1:
        raise ModelError(f"{node}: input spatial size {list(in_spatial)} is smaller than the kernel")
    return strides, dil, pb, pe, out


def rank_reason(node, ins, kind):
    """Why a conv-like node (input, weight, ...) cannot run for its rank, or None for 1-D and 2-D."""
    x, w = ins[0], ins[1]
    rank = len(w.shape) if w.shape is not None else len(x.shape) if x.shape is not None else None
    if rank not in (3, 4):
        return (f"{rank - 2}-D {kind} (rank-{rank} tensors) is not supported; minirt runs 1-D and 2-D {node.op}"
                if rank else "the weight's rank is unknown")
    return None


@register
class Conv(Op):
    name = "Conv"
    limits = ("1-D and 2-D only (3-D is refused at load); the weight and bias must be constants "
              "(prepacked at load), or the weight a DequantizeLinear of one (int8 on the GEMM routes); float32")

    def check(self, node, ins):
        w = ins[1]
        why = rank_reason(node, ins, "convolution")
        if why:
            return why
        b = ins[2] if len(ins) > 2 else None
        if b is not None and b.shape is not None and w.shape is not None and tuple(b.shape) != (w.shape[0],):
            return f"bias '{node.inputs[2]}' has shape {list(b.shape)}, expected [{w.shape[0]}] (one per output channel)"
        if len(node.inputs) > 3 and node.attrs.get("_out_layout") not in ("NLC", "NHWC"):
            return f"{len(node.inputs)} inputs; Conv takes at most 3 (X, W, B)"
        for i, what in ((1, "weight"), (2, "bias")):
            if len(ins) > i and ins[i] is not None and not ins[i].is_const and not ins[i].planner_const:
                return (f"{what} '{node.inputs[i]}' is computed at run time; minirt needs Conv {what}s to be "
                        f"constants (they are prepacked at load)")

    def infer(self, node, ins):
        x, w = ins[0], ins[1]
        xshape = _nchw_shape(node, x.shape, len(w.shape) - 2)
        c, g = xshape[1], int(attr(node, "group", 1))
        if isinstance(c, int) and (c != w.shape[1] * g or w.shape[0] % g):
            raise ModelError(f"{node}: input has {c} channels but the weight is {list(w.shape)} with group {g}")
        sp = xshape[2:]
        out = [f"{node.outputs[0]}_d{2 + i}" for i in range(len(sp))]
        if all(isinstance(d, int) for d in sp):
            out = conv_params(node, sp, w.shape[2:])[4]
        if node.attrs.get("_out_layout") == "NLC":
            return [((x.shape[0], int(np.prod(out)), w.shape[0]), x.dtype)]
        if node.attrs.get("_out_layout") == "NHWC":
            return [((x.shape[0], *out, w.shape[0]), x.dtype)]
        return [((x.shape[0], w.shape[0], *out), x.dtype)]

    def reference(self, node, x, w, b=None, r=None):
        if node.attrs.get("_in_layout") == "NLC":
            x = x.transpose(0, 2, 1).reshape(_nchw_shape(node, x.shape, w.ndim - 2))
        elif node.attrs.get("_in_layout") == "NHWC":
            x = x.transpose(0, 3, 1, 2)
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
        # the activation and residual fused by the planner, as the kernels do them (the residual in the output's layout)
        if node.attrs.get("_out_layout") == "NLC":
            y = activate(y.reshape(n, oc, -1).transpose(0, 2, 1), node.attrs.get("_act"), r)
        elif node.attrs.get("_out_layout") == "NHWC":
            y = np.ascontiguousarray(activate(y.transpose(0, 2, 3, 1), node.attrs.get("_act"), r))
        else:
            y = activate(y, node.attrs.get("_act"))
        return [y.astype(np.result_type(x, w), copy=False)]

    def lower(self, node, ctx):
        route = node.attrs.get("_route", "direct")
        {"linear": _lower_linear, "im2col": _lower_im2col, "pointwise": _lower_pointwise,
         "depthwise": _lower_depthwise, "direct": _lower_direct}[route](node, ctx)


def _gemm_weight(ctx, node, b_kn, kp=0):
    """(the GEMM's B, N4) of a conv on the buffer GEMM (linear_dispatch): b_kn [K, N] float, or, where the conv has
    _wq, the int8 weight (rows K .. kp - 1, where the GEMM reads kp rows, dequantize to 0)."""
    wq = node.attrs.get("_wq")
    k, n = b_kn.shape
    if wq is None:
        return pack_weight(ctx, node.inputs[1], b_kn)
    if isinstance(wq, str):
        q8, s = quantize_rows(b_kn.T, node.inputs[1]).kn()
        z = None
        ctx.note(f"quantize_weights int8: weight [{k}, {n}] as int8 with a scale an output channel")
    else:
        s, z = wq
        t = b_kn / s.reshape(1, -1) + (0 if z is None else z.reshape(1, -1))
        r = np.rint(t)
        if t.size and (np.abs(t - r).max() > 1e-3 or r.min() < -128 or r.max() > 127):
            ctx.note("int8 weight read in float: the weight is no longer the int8 one times its scales (a pass "
                     "changed it after dequantizing)")
            return pack_weight(ctx, node.inputs[1], b_kn)
        q8 = r.astype(np.int8)
        ctx.note(f"int8 weight [{k}, {n}] (QDQ), a scale an output channel, on the int8 GEMM")
    if kp > k:
        pad = np.zeros((kp - k, n), np.int8) if z is None else np.broadcast_to(np.rint(z).astype(np.int8), (kp - k, n))
        q8 = np.concatenate([q8, pad])
    return Int8Weight(node.inputs[1], np.ascontiguousarray(q8), np.asarray(s, np.float32), z), -(-n // 4)


def _float_note(ctx, node, route):
    if node.attrs.get("_wq") is not None:
        ctx.note(f"int8 weight dequantized to float at planning: route {route} ({ctx.storage} storage) has no int8 "
                 f"kernel")


IM2COL_SCRATCH_BUDGET = 16 << 20   # bytes; larger convs run in tiles of output rows sharing one scratch


def _operands(node, ctx):
    x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
    w = np.asarray(ctx.graph.tensor(node.inputs[1]).data, np.float32)
    b = ctx.graph.tensor(node.inputs[2]).data if len(node.inputs) > 2 and node.inputs[2] else None
    strides, dil, pb, _, out = conv_params(node, _nchw_shape(node, x.shape, w.ndim - 2)[2:], w.shape[2:])
    if w.ndim == 3:  # a 1-D conv is a 2-D one of height 1
        w, strides, dil, pb, out = w[:, :, None, :], [1] + strides, [1] + dil, [0] + pb, [1] + out
    return x, y, w, b, strides, dil, pb, out


def _as4d(ctx, t):
    """A rank-3 [N, C, L] tensor as [N, C, 1, L]: a view in buffers, a copy between texture packings."""
    if len(t.shape) == 4:
        return t
    from .shape_ops import view_or_copy
    t4 = ctx.temp(f"{t.name}@4d", (t.shape[0], t.shape[1], 1, t.shape[2]))
    view_or_copy(ctx, t4, t)
    return t4


def _from4d(ctx, y4, y):
    if y4 is not y:
        from .shape_ops import view_or_copy
        view_or_copy(ctx, y, y4)


def _out4d(ctx, y):
    return y if len(y.shape) == 4 else ctx.temp(f"{y.name}@4d", (y.shape[0], y.shape[1], 1, y.shape[2]))


def _image(ctx, t, n, batch):
    """Image n of a batch tensor t (a view at its offset; t itself for a batch of 1), or t where it has no batch dim
    (a residual added to every image: [L, C] or [1, L, C])."""
    if batch == 1 or t.shape[0] != batch:
        return t
    one = ctx.temp(f"{t.name}@image{n}", (1,) + tuple(t.shape[1:]))
    align = ctx.profile.min_storage_buffer_offset_alignment
    if ctx.storage != "buffer" or (n * one.numel * t.itemsize) % max(align, 1):
        raise UnsupportedError(f"{ctx.node}: a batch of {batch} on the im2col route runs image by image on buffer "
                               f"views, at offsets of {one.numel * t.itemsize} bytes ({ctx.storage} storage, offset "
                               f"alignment {align}); conv routing sends such a conv to the direct kernel")
    ctx.view(one, t, n * one.numel)
    return one


def _lower_linear(node, ctx):
    """A 1x1, stride-1 conv on a channels-last input (conv_channels_last): a Linear over the batch's pixels, rows
    N * H * W by K = C_in, writing channels-last rows, or NCHW image by image on views (OUT_NCHW)."""
    x, y, w, b, *_ = _operands(node, ctx)
    oc, c = w.shape[:2]
    if node.attrs.get("_in_layout") != "NHWC" or not linear_ok(ctx, c):
        raise UnsupportedError(f"{node}: route linear needs a channels-last input (pass conv_channels_last) on the "
                               f"buffer GEMM with C_in % 4 == 0 ({ctx.storage} storage, {c} channels)")
    wt, n4 = _gemm_weight(ctx, node, w.reshape(oc, c).T)
    bt = pack_bias(ctx, f"{node.name}.bias", b, oc)
    batch, h, wd, _c = x.shape
    act = node.attrs.get("_act")
    res = ctx.t(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
    if node.attrs.get("_out_layout") == "NHWC":
        m = batch * h * wd
        linear_dispatch(ctx, y, x, wt, bt, m, oc, c, n4, out_mode=OUT_ROWS, act=act, m_total=m, residual=res)
        ctx.note(f"Linear over the channels-last pixels: M {m}, K {c}, N {oc}; output channels-last"
                 + (" + residual" if res is not None else ""))
        return
    for n in range(batch):
        linear_dispatch(ctx, _image(ctx, y, n, batch), _image(ctx, x, n, batch), wt, bt, h * wd, oc, c, n4,
                        out_mode=OUT_NCHW, act=act, m_total=h * wd)
    ctx.note(f"Linear over the channels-last pixels: M {h * wd}, K {c}, N {oc}; output NCHW"
             + (f", image by image, {batch} images" if batch > 1 else ""))


def _lower_im2col(node, ctx):
    """A batch runs image by image where the output is NCHW: each image's im2col and GEMM are a batch of 1's, on views
    of the batch's input, output and residual (conv routing sends a batch here only in buffer storage, at aligned
    offsets). A channels-last output (conv_channels_last) takes the whole batch as GEMM rows."""
    x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
    res = ctx.t(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
    _x, _y, w, b, strides, dil, pb, out = _operands(node, ctx)
    oc, c, kh, kw = w.shape
    k = c * kh * kw
    # k ordered (kh, kw, c), as im2col writes it; the buffer GEMM reads K padded to 4 (kp), the tiled GEMM K
    kp = -(-k // 4) * 4
    b_kn = w.transpose(2, 3, 1, 0).reshape(k, oc)
    if linear_ok(ctx, kp):
        wt, n4 = _gemm_weight(ctx, node, b_kn, kp)
    else:
        _float_note(ctx, node, "im2col")
        wt, n4 = pack_weight(ctx, node.inputs[1], b_kn)
    bt = pack_bias(ctx, f"{node.name}.bias", b, oc)
    batch = x.shape[0]
    if node.attrs.get("_out_layout") == "NHWC":
        ctx.note(_im2col_image(node, ctx, x, y, res, w.shape, wt, bt, n4, strides, dil, pb, out, images=batch))
        return
    for n in range(batch):
        note = _im2col_image(node, ctx, _image(ctx, x, n, batch), _image(ctx, y, n, batch),
                             None if res is None else _image(ctx, res, n, batch), w.shape, wt, bt, n4, strides, dil,
                             pb, out)
    ctx.note(note + (f"; image by image, {batch} images" if batch > 1 else ""))


def _im2col_image(node, ctx, x, y, res, w_shape, wt, bt, n4, strides, dil, pb, out, images=1) -> str:
    """One image's dispatches (or, images > 1, a channels-last output's whole batch as GEMM rows); returns the
    planner's note on them."""
    oc, c, kh, kw = w_shape
    oh, ow = out
    k = c * kh * kw
    kp = -(-k // 4) * 4
    m = images * oh * ow
    # whole output rows per tile while one fits the budget, else part of a row (a 1-D conv has one row)
    rows = max(1, IM2COL_SCRATCH_BUDGET // (kp * 4))
    rows = min(m, rows // ow * ow if rows >= ow else rows)
    act = node.attrs.get("_act")
    # conv_output_nlc, conv_channels_last: the GEMM's rows (positions) by columns (channels) stored as they are (plus
    # the residual)
    nlc = node.attrs.get("_out_layout") in ("NLC", "NHWC")
    in_nhwc = node.attrs.get("_in_layout") == "NHWC"
    if node.attrs.get("_in_layout") == "NLC":
        # conv_input_nlc: x is [1, L, C]; output position m's im2col row is x's elements from (m * stride - pad) * C
        # on, kw * C of them: A rows of stride stride * C that overlap, zero outside x (the padding)
        if not (linear_ok(ctx, k) and kh == 1 and c % 4 == 0 and dil[1] == 1):
            raise UnsupportedError(f"{node}: a channels-last input (conv_input_nlc) needs a 1-D conv over C % 4 == 0 "
                                   f"channels, dilation 1, on the buffer GEMM")
        linear_dispatch(ctx, y, x, wt, bt, m, oc, k, n4, out_mode=OUT_ROWS if nlc else OUT_NCHW, act=act, m0=0,
                        lda4=strides[1] * c // 4, m_total=m, residual=res, a_win=(pb[1] * c // 4, x.numel // 4))
        return (f"GEMM over the channels-last input's overlapping rows (no im2col): M {m}, K {k}, N {oc}"
                + ("; output channels-last" + (" + residual" if res is not None else "") if nlc else ""))
    scratch = ctx.scratch("im2col.scratch", rows * kp, dtype=ctx.dtype)   # im2col writes the activation type
    if nlc and not linear_ok(ctx, kp):
        raise UnsupportedError(f"{node}: a channels-last output (conv_output_nlc) needs the buffer GEMM "
                               f"(buffer storage, option fast_gemm on)")
    tiles = -(-m // rows)
    x = _as4d(ctx, x)    # a 1-D conv forced here (option conv_route=im2col) reads [N, C, L] as [N, C, 1, L]
    for t in range(tiles):
        m0, r = t * rows, min(rows, m - t * rows)
        p = (Push().sizes(x).ivec4(kh, kw, strides[0], strides[1]).ivec4(pb[0], pb[1], dil[0], dil[1])
             .ivec4(c, kp, m0, r).ivec4(ow, 0 if in_nhwc else x.packed_dim, k, oh * ow if images > 1 else 0))
        ctx.dispatch("im2col", [(scratch.name, "w"), (x.name, "r")], p,
                     spec("im2col", IN_NHWC=in_nhwc, trim_from="IN_NHWC"), (kp // 4, r, 1), "im2col",
                     nbytes=4 * (r * kp * 2), io="in32", axes={"storage": ctx.storage})
        if linear_ok(ctx, kp):
            linear_dispatch(ctx, y, scratch, wt, bt, r, oc, kp, n4, out_mode=OUT_ROWS if nlc else OUT_NCHW, act=act,
                            m0=m0, lda4=kp // 4, m_total=m, residual=res)
        else:
            gemm_dispatch(ctx, y, scratch, wt, bt, r, oc, k, n4, out_mode=1, act=act, m0=m0, lda=kp, scratch=True)
    nlc_note = ("; output channels-last" + (" + residual" if res is not None else "")) if nlc else ""
    return (f"im2col + tiled GEMM: M {m}, K {k}, N {oc}; scratch {rows * kp * 4 / 2**20:.1f} MiB, {tiles} tile(s)"
            f"{'; input channels-last' if in_nhwc else ''}{nlc_note}")


def _lower_pointwise(node, ctx):
    """One GEMM an image (the kernel's A and output are one image's [C, H * W]); a batch image by image on views, as
    the im2col route."""
    x, y, w, b, *_ = _operands(node, ctx)
    oc, c = w.shape[:2]
    x4, y4 = _as4d(ctx, x), _out4d(ctx, y)
    _float_note(ctx, node, "pointwise")
    wt, n4 = pack_weight(ctx, node.inputs[1], w.reshape(oc, c).T)
    bt = pack_bias(ctx, f"{node.name}.bias", b, oc)
    m = x4.shape[2] * x4.shape[3]
    batch = x4.shape[0]
    for n in range(batch):
        gemm_dispatch(ctx, _image(ctx, y4, n, batch), _image(ctx, x4, n, batch), wt, bt, m, oc, c, n4, a_mode=1,
                      out_mode=1, act=node.attrs.get("_act"))
    _from4d(ctx, y4, y)


def _lower_depthwise(node, ctx):
    x, y, w, b, strides, dil, pb, _ = _operands(node, ctx)
    c, _, kh, kw = w.shape
    _float_note(ctx, node, "depthwise")
    x4, y4 = _as4d(ctx, x), _out4d(ctx, y)
    wt = ctx.weight(node.inputs[1], w.reshape(-1))
    bt = ctx.weight(f"{node.name}.bias", np.zeros(c, np.float32) if b is None else b)
    p = (Push().sizes(y4).sizes(x4).ivec4(kh, kw, strides[0], strides[1]).ivec4(pb[0], pb[1], dil[0], dil[1])
         .ivec4(y4.packed_dim, x4.packed_dim, act_code(node.attrs.get("_act")), 0))
    ctx.dispatch("conv_dw", [(y4.name, "w"), (x4.name, "r"), (wt.name, "r"), (bt.name, "r")], p, (),
                 y4.texel_extents, "conv", flops=2 * y4.numel * kh * kw, nbytes=4 * (x4.numel + y4.numel + w.size),
                 axes={"storage": ctx.storage})
    _from4d(ctx, y4, y)


def _lower_direct(node, ctx):
    x, y, w, b, strides, dil, pb, out = _operands(node, ctx)
    conv1d = len(x.shape) == 3
    oc, icg, kh, kw = w.shape
    g = int(attr(node, "group", 1))
    _float_note(ctx, node, "direct")
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
    ctx.dispatch("conv", [(y.name, "w"), (x.name, "r"), (wt.name, "r"), (bt.name, "r")], p,
                 spec("conv", CONV1D=conv1d), (-(-ow // 4), oh, ocb * n), "conv", flops=2 * macs,
                 nbytes=4 * (x.numel + y.numel + wp.size + bp.size), axes={"storage": ctx.storage})
