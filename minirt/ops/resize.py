"""Resize (opset 11 and later) as a separable filter over the last two axes (glsl/resize.comp). The scales or sizes
(and, for tf_crop_and_resize, the roi) must be constants, as exporters write them: the output shape is then known at
load, and so is every output position's source taps along each axis (index and weight), which are computed once on
the host in float64, as ONNX's reference computes them, and kept as a table. Every mode (nearest with each
nearest_mode, linear, cubic, antialias), coordinate_transformation_mode, exclude_outside, extrapolation_value, axes
and keep_aspect_ratio_policy is a table's contents, not a kernel variant: nearest gives one tap a position (a copy),
linear two, cubic four, antialias as many as the filter spans."""
from __future__ import annotations

import math

import numpy as np

from ..errors import ModelError
from ..plan import Push
from . import Op, attr, register

MODES = ("nearest", "linear", "cubic")
TRANSFORMS = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _text(node, key, default):
    v = attr(node, key, default)
    return v.decode() if isinstance(v, bytes) else v


def _const(t):
    """A constant input as a float64 vector, None where omitted or empty."""
    if t is None or t.data is None or np.asarray(t.data).size == 0:
        return None
    return np.asarray(t.data, np.float64).reshape(-1)


def _coeffs(node, ratio, scale):
    """The taps' weights around a source coordinate whose fraction is `ratio` (in (0, 1]; ONNX's reference)."""
    mode = _text(node, "mode", "nearest")
    if mode == "nearest":
        nm = _text(node, "nearest_mode", "round_prefer_floor")
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}[nm]
        return np.array([0.0, 1.0]) if up else np.array([1.0, 0.0])
    antialias = bool(attr(node, "antialias", 0)) and scale < 1.0
    if mode == "linear":
        if not antialias:
            return np.array([1.0 - ratio, ratio])
        start = int(np.floor(-1 / scale) + 1)
        c = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * scale), 0, 1)
        return c / c.sum()
    a = float(attr(node, "cubic_coeff_a", -0.75))
    if not antialias:
        return np.array([((a * (ratio + 1) - 5 * a) * (ratio + 1) + 8 * a) * (ratio + 1) - 4 * a,
                         ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
                         ((a + 2) * (1 - ratio) - (a + 3)) * (1 - ratio) * (1 - ratio) + 1,
                         ((a * (2 - ratio) - 5 * a) * (2 - ratio) + 8 * a) * (2 - ratio) - 4 * a])

    def cubic(x):
        x = abs(x)
        return ((a + 2) * x ** 3 - (a + 3) * x ** 2 + 1 if x <= 1
                else a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a if x < 2 else 0.0)
    start = int(np.floor(-2 / scale) + 1)
    c = np.array([cubic(scale * (i - ratio)) for i in range(start, 2 - start)])
    return c / c.sum()


def axis_taps(node, in_w, out_w, scale, roi):
    """(indices [out_w, n] clamped into the input, weights [out_w, n], extrapolated [out_w] bool) of one axis, as
    ONNX's reference interpolates along it (onnx.reference.ops.op_resize)."""
    ctm = _text(node, "coordinate_transformation_mode", "half_pixel")
    y = np.arange(out_w, dtype=np.float64)
    width = scale * in_w
    extrap = np.zeros(out_w, bool)
    if ctm == "align_corners":
        x = np.zeros(out_w) if width == 1 else y * (in_w - 1) / (width - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        x = (np.full(out_w, (roi[1] - roi[0]) * (in_w - 1) / 2) if width == 1
             else y * (roi[1] - roi[0]) * (in_w - 1) / (width - 1)) + roi[0] * (in_w - 1)
        extrap = (x < 0) | (x > in_w - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_w, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    else:   # half_pixel_symmetric
        x = in_w / 2 * (1 - out_w / width) + (y + 0.5) / scale - 0.5
    xi = np.floor(x)
    ratios = np.where(x == xi, 1.0, x - xi)
    w = np.stack([_coeffs(node, float(r), scale) for r in ratios])
    n = w.shape[1]
    # the n indices nearest x, ties to the smaller (the reference's edge-padded neighbours)
    pad = -(-n // 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p + off)[:, None] + np.arange(n)[None, :] - pad
    if attr(node, "exclude_outside", 0):
        w = np.where((idx < 0) | (idx >= in_w), 0.0, w)
        s = w.sum(axis=1, keepdims=True)
        w = w / np.where(s == 0, 1.0, s)
    return np.clip(idx, 0, in_w - 1), w, extrap


class _Setup:
    """What a Resize node does to an input shape: the output shape and, per axis, (scale, roi) or None (identity)."""

    def __init__(self, node, shape, ins):
        r = len(shape)
        axes = attr(node, "axes")
        axes = list(range(r)) if axes is None else [int(a) % r for a in axes]
        roi_in = _const(ins[1]) if len(ins) > 1 else None
        scales_in = _const(ins[2]) if len(ins) > 2 else None
        sizes_in = _const(ins[3]) if len(ins) > 3 else None
        if (scales_in is None) == (sizes_in is None):
            raise ModelError(f"{node}: needs exactly one of scales and sizes (constants)")
        given = scales_in if scales_in is not None else sizes_in
        if len(given) != len(axes):
            raise ModelError(f"{node}: {'scales' if scales_in is not None else 'sizes'} has {len(given)} values "
                             f"for {len(axes)} axes")
        roi = np.array([0.0] * r + [1.0] * r)
        if roi_in is not None and len(roi_in) == 2 * len(axes):
            for i, d in enumerate(axes):
                roi[d], roi[r + d] = roi_in[i], roi_in[len(axes) + i]
        if scales_in is not None:
            scales = [1.0] * r
            for i, d in enumerate(axes):
                scales[d] = float(scales_in[i])
            out = [int(s * d) for s, d in zip(scales, shape)]
        else:
            out = list(shape)
            for i, d in enumerate(axes):
                out[d] = int(sizes_in[i])
            scales = [o / d for o, d in zip(out, shape)]
            policy = _text(node, "keep_aspect_ratio_policy", "stretch")
            if policy != "stretch":
                s = (min if policy == "not_larger" else max)(scales[d] for d in axes)
                scales = [s if i in axes else 1.0 for i in range(r)]
                out = [int(s * shape[i] + 0.5) if i in axes else shape[i] for i in range(r)]
        if min(out, default=1) < 1 or not all(np.isfinite(scales)):
            raise ModelError(f"{node}: the output would have shape {out} (scales {scales})")
        self.out = tuple(out)
        self.axes = {}
        for d in range(r):
            if not (math.isclose(scales[d], 1.0) and out[d] == shape[d] and math.isclose(roi[d], 0.0)
                    and math.isclose(roi[r + d], 1.0)):
                self.axes[d] = (scales[d], (roi[d], roi[r + d]))


@register
class Resize(Op):
    name = "Resize"
    limits = ("opset 11 and later; scales or sizes (and tf_crop_and_resize's roi) must be constants; only the last "
              "two axes may change (H and W of NCHW), rank <= 4; every mode, coordinate transformation, nearest_mode, "
              "antialias, axes and keep_aspect_ratio_policy")

    def check(self, node, ins):
        if attr(node, "_opset", 11) < 11:
            return "Resize before opset 11 is not supported (export at opset 11 or later)"
        mode = _text(node, "mode", "nearest")
        if mode not in MODES:
            return f"mode {mode!r} is not one of {', '.join(MODES)}"
        ctm = _text(node, "coordinate_transformation_mode", "half_pixel")
        if ctm not in TRANSFORMS:
            return f"coordinate_transformation_mode {ctm!r} is not supported"
        nm = _text(node, "nearest_mode", "round_prefer_floor")
        if nm not in NEAREST_MODES:
            return f"nearest_mode {nm!r} is not supported"
        if attr(node, "antialias", 0) and mode == "nearest":
            return "antialias with mode nearest is not defined"
        policy = _text(node, "keep_aspect_ratio_policy", "stretch")
        if policy not in ("stretch", "not_larger", "not_smaller"):
            return f"keep_aspect_ratio_policy {policy!r} is not supported"
        for i, what in ((2, "scales"), (3, "sizes")) + (((1, "roi"),) if ctm == "tf_crop_and_resize" else ()):
            if len(ins) > i and ins[i] is not None and not ins[i].is_const:
                return (f"{what} '{node.inputs[i]}' is computed at run time; minirt needs Resize's {what} to be "
                        f"constants (the output shape and the taps are fixed at load)")
        x = ins[0]
        if x.shape is not None and len(x.shape) > 4:
            return (f"resizing a rank-{len(x.shape)} tensor is not supported; minirt resizes tensors of rank <= 4 "
                    f"(NCHW and less)")
        if ctm == "tf_crop_and_resize" and (len(ins) < 2 or _const(ins[1]) is None):
            return "tf_crop_and_resize needs a roi"
        if x.shape is not None and all(isinstance(d, int) for d in x.shape):
            s = _Setup(node, x.shape, ins)
            r = len(x.shape)
            bad = [d for d in s.axes if d < r - 2]
            if bad:
                return (f"it resizes axis {bad[0]} of a rank-{r} input; minirt resizes only the last two axes "
                        f"(H and W of NCHW)")

    def infer(self, node, ins):
        shape = tuple(ins[0].shape)
        if not all(isinstance(d, int) for d in shape):
            return [(tuple(f"{node.outputs[0]}_d{i}" for i in range(len(shape))), ins[0].dtype)]
        return [(_Setup(node, shape, ins).out, ins[0].dtype)]

    def _taps(self, node, shape, ins):
        s = _Setup(node, shape, ins)
        taps = {}
        for d, (scale, roi) in s.axes.items():
            taps[d] = axis_taps(node, shape[d], s.out[d], scale, roi)
        return s, taps

    def reference(self, node, x, roi=None, scales=None, sizes=None):
        from ..graph import Tensor
        ins = [None] + [None if v is None else Tensor("", np.shape(v), None, np.asarray(v)) for v in
                        (roi, scales, sizes)]
        s, taps = self._taps(node, x.shape, ins)
        y = x.astype(np.float64)
        extrap = np.zeros(s.out, bool)
        for d in sorted(taps):
            idx, w, ex = taps[d]
            g = np.take(y, idx, axis=d)             # [.., out, n, ..]
            y = (g * w.reshape((1,) * d + w.shape + (1,) * (x.ndim - d - 1))).sum(axis=d + 1)
            extrap |= ex.reshape((1,) * d + ex.shape + (1,) * (x.ndim - d - 1))
        y = np.where(extrap, float(attr(node, "extrapolation_value", 0.0)), y)
        return [y.astype(x.dtype)]

    def lower(self, node, ctx):
        x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        ins = [ctx.graph.tensor(i) if i else None for i in node.inputs]
        _, taps = self._taps(node, x.shape, ins)
        r = len(x.shape)
        tables, widths = [], []
        for d in (r - 2, r - 1):        # WHCN y, then x
            if d < 0 or d not in taps:   # identity: one tap of weight 1 at the same index
                n = x.shape[d] if d >= 0 else 1
                idx, w, ex = np.arange(n)[:, None], np.ones((n, 1)), np.zeros(n, bool)
            else:
                idx, w, ex = taps[d]
                if np.all((w == 0) | (w == 1)) and np.all(w.sum(axis=1) == 1):   # nearest: the one tap of weight 1
                    idx, w = idx[np.arange(len(idx)), w.argmax(axis=1)][:, None], np.ones((len(idx), 1))
            idx = np.where(ex[:, None], -1, idx)      # extrapolated: the kernel writes extrapolation_value
            tables.append(np.stack([idx, w], axis=-1).reshape(-1))
            widths.append(idx.shape[1])
        table = ctx.weight(f"{node.name}.taps", np.concatenate(tables), dtype="float32")
        p = (Push().sizes(y).sizes(x).ivec4(widths[0], widths[1], tables[0].size // 2)
             .ivec4(y.packed_dim, x.packed_dim).vec4(float(attr(node, "extrapolation_value", 0.0))))
        ctx.dispatch("resize", [(y.name, "w"), (x.name, "r"), (table.name, "r")], p, (), y.texel_extents,
                     "elementwise", flops=2 * y.numel * widths[0] * widths[1],
                     nbytes=4 * (y.numel * (1 + widths[0] * widths[1]) + table.numel), axes={"storage": ctx.storage})
        ctx.note(f"{widths[0]} x {widths[1]} taps an output element (H x W)")
