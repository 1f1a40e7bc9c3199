"""Linear: minirt's own op for x @ W (+ b) (* s) (+ activation) (+ residual), made by the fuse_linear
planner pass from MatMul / Add / Mul / Gelu / Relu / Add chains, so a layer is one GEMM dispatch whose
epilogue does the rest. Inputs: x [.., K], W [K, N] (constant), bias [N] or "", residual [.., N] or "".
Optional inputs 4 and 5: W's scale [N] and zero point [N] (or ""): W is then an int8 constant, B = (W - zero) * scale
per column (minirt/quant.py), kept int8 on the GPU (ops/int8_weight.py).
Attributes: act ("", "relu", "gelu", "gelu_tanh", "hard_swish", "silu"), scale (folded into W and b at lowering), and
parts P (default 1; set by the merge_siblings pass): P sibling Linears' weights side by side, the output laid out
part-major [P, M, N / P] (M = the rows of x), which SplitParts hands out as P views.

SplitParts (also minirt's own, made by merge_siblings): [P, M, Np] -> P tensors of M * Np elements each
(any shapes), part p being input[p]. Buffer storage: free views at element offset p * M * Np."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError, UnsupportedError
from ..kernels import activate
from ..kernels.gemm import OUT_PARTS, linear_dispatch, linear_ok, pack_bias, pack_weight
from ..quant import dequantize_blocks, dequantize_kn
from . import Op, attr, register
from .elementwise import activation_dispatch, elementwise_dispatch
from .int8_weight import Int4Weight, Int8Weight, int4_operands, int8_operands
from .shape_ops import affine_copy, view_or_copy


@register
class Linear(Op):
    name = "Linear"
    domain = "minirt"
    limits = "made by the planner (fuse_linear; merge_siblings joins siblings into one); W must be a 2-D constant"

    def infer(self, node, ins):
        x, w = ins[0], ins[1]
        parts = int(attr(node, "parts", 1))
        if parts > 1:
            rows = x.shape[:-1]
            if not all(isinstance(d, int) for d in rows) or w.shape[1] % parts:
                raise ModelError(f"{node}: {parts} parts need static rows and N ({w.shape[1]}) divisible by them")
            return [((parts, int(np.prod(rows, dtype=np.int64)), w.shape[1] // parts), x.dtype)]
        return [(tuple(x.shape[:-1]) + (w.shape[1],), x.dtype)]

    def reference(self, node, x, w, b=None, r=None, s=None, z=None):
        if s is not None and "block" in node.attrs:
            w = dequantize_blocks(w, s, z, int(node.attrs["block"]))
        elif s is not None:
            w = dequantize_kn(w, s, z)
        parts = int(attr(node, "parts", 1))
        if parts > 1:     # part-major: [M, P * Np] -> [P, M, Np]
            y = self._reference(node, x.reshape(-1, x.shape[-1]), w, b, r)
            return [np.ascontiguousarray(y.reshape(y.shape[0], parts, -1).transpose(1, 0, 2))]
        return [self._reference(node, x, w, b, r)]

    def _reference(self, node, x, w, b, r):
        y = x @ w
        if b is not None:
            y = y + b
        y = activate(y * node.attrs.get("scale", 1.0), node.attrs.get("act", ""))
        if r is not None:
            y = y + r
        return y.astype(x.dtype, copy=False)

    def lower(self, node, ctx):
        g = ctx.graph
        x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        scale = float(node.attrs.get("scale", 1.0))
        quant = int8_operands(g, node)
        q4 = int4_operands(g, node)
        k, n = g.tensor(node.inputs[1]).data.shape
        w_scale = 1.0       # a float W's scale, folded in where it is packed (once a planning call: GemmWeight)
        if q4 is not None:       # a blocked 4-bit weight: on the w=q4 kernels, as MatMulNBits
            q, s, z, block = q4
            w = Int4Weight(node.inputs[1], q, s * np.float32(scale), z, block)
            if not linear_ok(ctx, k):
                ctx.note("4-bit weight dequantized to float at planning: the 4-bit kernels need buffer storage and "
                         "K a multiple of 4")
                w = w.b_kn
        elif quant is not None and linear_ok(ctx, k):      # the scale folds into the column scales
            q, s, z = quant
            w = Int8Weight(node.inputs[1], q, s * np.float32(scale), z)
        else:
            if quant is not None:
                ctx.note("int8 weight dequantized to float at planning: the int8 kernels need buffer storage and K "
                         "a multiple of 4")
                w = dequantize_kn(*quant) * scale
            else:
                w, w_scale = np.asarray(g.tensor(node.inputs[1]).data, np.float32), scale
        b = g.tensor(node.inputs[2]).data * scale if len(node.inputs) > 2 and node.inputs[2] else None
        res = ctx.t(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
        act = node.attrs.get("act") or None
        m = int(np.prod(x.shape[:-1]))
        parts = int(attr(node, "parts", 1))
        if parts > 1:
            # Only merge_siblings makes these, and only where this holds (it checks parts_ok first).
            if not linear_ok(ctx, k) or res is not None:
                raise UnsupportedError(f"{node}: a merged Linear ({parts} parts) runs only on the buffer GEMM "
                                       f"(buffer storage, K a multiple of 4, no residual)")
            wt, n4 = _weight(ctx, node, w, w_scale)
            bt = pack_bias(ctx, f"{node.name}.bias", b, n)
            linear_dispatch(ctx, y, x, wt, bt, m, n, k, n4, act=act, out_mode=OUT_PARTS, m_total=m,
                            part_n=n // parts)
            return
        if linear_ok(ctx, k):
            wt, n4 = _weight(ctx, node, w, w_scale)
            bt = pack_bias(ctx, f"{node.name}.bias", b, n)
            linear_dispatch(ctx, y, x, wt, bt, m, n, k, n4, act=act, residual=res)
            return
        # Other storages: the general matmul kernel with the bias fused, then the epilogue as separate ops.
        from .matmul import matmul_dispatch
        steps = ([act] if act else []) + (["res"] if res is not None else [])
        cur = y if not steps else ctx.temp(f"{y.name}@gemm", y.shape)
        matmul_dispatch(ctx, cur, x, w if w_scale == 1.0 else w * w_scale, bias=None if b is None else b.reshape(1, -1))
        for i, s in enumerate(steps):
            nxt = y if i == len(steps) - 1 else ctx.temp(f"{y.name}@{s}", y.shape)
            if s == "res":
                elementwise_dispatch(ctx, "binary", 0, nxt, [cur, res])
            else:
                activation_dispatch(ctx, s, nxt, cur)
            cur = nxt


def _weight(ctx, node, w, scale=1.0):
    """(the GEMM's weight, N4) of a float W [K, N] (times scale) or an Int8Weight."""
    if isinstance(w, Int8Weight):
        return w, -(-w.q.shape[1] // 4)
    return pack_weight(ctx, node.inputs[1], w, scale)


@register
class SplitParts(Op):
    name = "SplitParts"
    domain = "minirt"
    limits = "made by the planner (merge_siblings): the parts of a merged Linear's output, as views"

    def infer(self, node, ins):
        p, m, n = ins[0].shape
        if len(node.outputs) != p or len(attr(node, "shapes", ())) != p:
            raise ModelError(f"{node}: {p} parts need {p} outputs and shapes")
        shapes = [tuple(int(d) for d in s) for s in node.attrs["shapes"]]
        if any(int(np.prod(s, dtype=np.int64)) != m * n for s in shapes):
            raise ModelError(f"{node}: every part has {m * n} elements, shapes {shapes}")
        return [(s, ins[0].dtype) for s in shapes]

    def reference(self, node, x):
        return [x[i].reshape(s) for i, s in enumerate(node.attrs["shapes"])]

    @staticmethod
    def view_ok(offset_bytes: int, align: int) -> bool:
        """Whether a part at this byte offset can be a view (descriptor offsets must be aligned)."""
        return offset_bytes % max(int(align), 1) == 0

    def lower(self, node, ctx):
        src = ctx.t(node.inputs[0])
        p, m, n = src.shape
        for i, name in enumerate(node.outputs):
            out = ctx.t(name)
            off = i * m * n
            if ctx.storage == "buffer" and ctx.can_view(out, src) and \
                    self.view_ok(off * src.itemsize, ctx.profile.min_storage_buffer_offset_alignment):
                ctx.view(out, src, off)
                continue
            # not reached from merge_siblings (it merges only where every part can be a view); kept correct
            part = ctx.temp(f"{name}@part", (m, n))
            affine_copy(ctx, part, src, [(i, 0, None), (0, 1, 0), (0, 1, 1)])
            view_or_copy(ctx, out, part)
