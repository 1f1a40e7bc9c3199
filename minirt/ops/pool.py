"""MaxPool and AveragePool, 1-D and 2-D, on glsl/pool.comp: kernel_shape, strides, pads, auto_pad, dilations and
ceil_mode as ONNX defines them; AveragePool's count_include_pad. A 1-D pool runs as a 2-D one of height 1 over
[N, C, L] (the kernel's H then indexes C, with a window of one row). MaxPool skips NaN elements, as onnxruntime and
ONNX's reference do; a window of NaN alone gives NaN. A window that holds no input element at all (dilations can make
one) gives what onnxruntime gives: 0 for AveragePool, the lowest float for MaxPool. AveragePool's divisor, as
onnxruntime's: the window positions inside the input, and with count_include_pad those in the explicit pads too, never
those past the end pad where ceil_mode adds a last window."""
from __future__ import annotations

import functools

import numpy as np

from ..errors import ModelError
from ..kernels import spec
from ..plan import Push
from . import Op, attr, register
from .conv import conv_params

MAX, AVERAGE = 0, 1   # pool.comp OP


class Pool(Op):
    code = MAX
    limits = ("1-D and 2-D only (3-D is refused at load); ceil_mode with explicit pads only (not with auto_pad); the "
              "Indices output is not supported")

    def _params(self, node, shape):
        ks = [int(k) for k in attr(node, "kernel_shape")]
        if len(shape) != len(ks) + 2:
            raise ModelError(f"{node}: kernel_shape {ks} does not fit an input of rank {len(shape)}")
        return conv_params(node, shape[2:], ks, bool(attr(node, "ceil_mode", 0)))

    def check(self, node, ins):
        ks = attr(node, "kernel_shape")
        if ks is None:
            return "no kernel_shape"
        if len(ks) not in (1, 2):
            return f"{len(ks)}-D pooling is not supported; minirt runs 1-D and 2-D {node.op}"
        if any(o for o in node.outputs[1:]):
            return "the Indices output is not supported (only Y)"
        auto = attr(node, "auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if attr(node, "ceil_mode", 0) and auto != "NOTSET":
            return f"ceil_mode with auto_pad {auto} is not supported (only with explicit pads)"

    def infer(self, node, ins):
        shape = tuple(ins[0].shape)
        nd = len(attr(node, "kernel_shape"))
        sp = shape[2:]
        if not all(isinstance(d, int) for d in sp):
            return [(shape[:2] + tuple(f"{node.outputs[0]}_d{2 + i}" for i in range(nd)), ins[0].dtype)]
        return [(shape[:2] + tuple(self._params(node, shape)[4]), ins[0].dtype)]

    def reference(self, node, x):
        strides, dil, pb, pe, out = self._params(node, x.shape)
        ks = [int(k) for k in attr(node, "kernel_shape")]
        # kernel positions past the padded input add nothing: a window far larger than the input costs what it holds
        ks = [min(k, -(-(b + i + e) // d)) for k, b, i, e, d in zip(ks, pb, x.shape[2:], pe, dil)]
        # pad past the explicit pads as far as the last window reaches (ceil_mode)
        reach = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(out, strides, dil, ks)]
        tail = [max(e, r - i - b) for e, r, i, b in zip(pe, reach, x.shape[2:], pb)]
        width = [(0, 0), (0, 0)] + list(zip(pb, tail))
        xf = x.astype(np.float64)
        xp = np.pad(xf, width, constant_values=np.nan if self.code == MAX else 0.0)   # fmax skips NaN
        include = bool(attr(node, "count_include_pad", 0))   # the explicit pads count; the ceil_mode tail never does
        masks = []
        for b, i, e, t in zip(pb, x.shape[2:], pe, tail):
            at = np.arange(b + i + t) - b
            masks.append(((at >= (-b if include else 0)) & (at < (i + e if include else i))).astype(np.float64))
        counts = functools.reduce(np.multiply.outer, masks)
        y = np.full(x.shape[:2] + tuple(out), np.nan if self.code == MAX else 0.0)
        n = np.zeros(out)
        inside = np.zeros(out)     # input elements in each window
        held = functools.reduce(np.multiply.outer, [((np.arange(b + i + t) - b >= 0) & (np.arange(b + i + t) - b < i))
                                                    .astype(np.float64) for b, i, t in zip(pb, x.shape[2:], tail)])
        for k in np.ndindex(*ks):
            sl = tuple(slice(ki * d, ki * d + (o - 1) * s + 1, s) for ki, d, o, s in zip(k, dil, out, strides))
            win = xp[(Ellipsis, *sl)]
            y = np.fmax(y, win) if self.code == MAX else y + win
            n += counts[sl]
            inside += held[sl]
        # a window holding no input element (dilated windows can miss the input) gives what onnxruntime gives: 0 for
        # average, the lowest float for max
        if self.code == AVERAGE:
            with np.errstate(invalid="ignore", divide="ignore"):
                y = np.where(inside > 0, y / n, 0.0)
        else:
            y = np.where(inside > 0, y, np.finfo(np.float32).min)
        return [y.astype(x.dtype)]

    def lower(self, node, ctx):
        x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        strides, dil, pb, pe, _ = self._params(node, x.shape)
        ks = [int(k) for k in attr(node, "kernel_shape")]
        if len(ks) == 1:          # over W alone: one row a window, H (here C) passed through
            ks, strides, dil, pb, pe = [1, *ks], [1, *strides], [1, *dil], [0, *pb], [0, *pe]
        rows, cols = x.whcn[1], x.whcn[0]
        if attr(node, "count_include_pad", 0):
            cnt = (-pb[0], -pb[1], rows + pe[0], cols + pe[1])
        else:
            cnt = (0, 0, rows, cols)
        p = (Push().sizes(y).sizes(x).ivec4(ks[0], ks[1], strides[0], strides[1]).ivec4(pb[0], pb[1], dil[0], dil[1])
             .ivec4(*cnt).ivec4(y.packed_dim, x.packed_dim))
        ctx.dispatch("pool", [(y.name, "w"), (x.name, "r")], p, spec("pool", OP=self.code), y.texel_extents,
                     "elementwise", flops=y.numel * ks[0] * ks[1], nbytes=4 * (x.numel + y.numel),
                     axes={"storage": ctx.storage})


@register
class MaxPool(Pool):
    name, code = "MaxPool", MAX


@register
class AveragePool(Pool):
    name, code = "AveragePool", AVERAGE
