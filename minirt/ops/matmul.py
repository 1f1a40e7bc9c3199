"""MatMul and Gemm on one tiled kernel (glsl/matmul.comp). A constant right operand is prepacked
as vec4 rows along N (Gemm's transB and alpha folded in); a runtime one is read in its own layout.
A constant bias (Gemm's beta * C) is fused into the kernel."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..kernels import spec
from ..plan import CONSTANT, Push, whcn
from . import Op, attr, register
from ._util import broadcast_shapes
from .elementwise import elementwise_dispatch


def _pad_to(x, axis, mult):
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, -x.shape[axis] % mult)
    return np.pad(x, pad)


def matmul_dispatch(ctx, out, a, b, *, trans_a=False, trans_b=False, alpha=1.0, bias=None, squeeze_m=False):
    """out = alpha * op(a) @ op(b) (+ bias) with numpy batch broadcasting; out is [.., M, N] (rank <= 4), or
    [.., N] with squeeze_m (M = 1, a 1-D a).

    a: TensorSpec, [.., M, K] ([.., K, M] when trans_a; a 1-D [K] reads as [1, K]). b: a numpy array [.., K, N]
    (a constant: prepacked, trans_b and alpha folded) or a TensorSpec [.., K, N] ([.., N, K] when trans_b; a
    1-D [K] with trans_b reads as [1, K]). bias: None or a constant [rows, N] with rows 1 or M."""
    full = (out.shape[:-1] + (1,) + out.shape[-1:] if out.shape else (1, 1)) if squeeze_m else out.shape
    M, N = full[-2:]
    K = a.shape[-2] if trans_a and len(a.shape) > 1 else a.shape[-1]
    const = isinstance(b, np.ndarray)
    if const:
        w = alpha * (np.swapaxes(b, -1, -2) if trans_b else b).astype(np.float32)
        b_sizes = whcn(w.shape)
        b_spec = ctx.weight(f"{ctx.node.name}:B", _pad_to(_pad_to(w.reshape(-1, K, N), 1, 4), 2, 4))
        trans_b, alpha, b_pd = False, 1.0, 0
    else:
        b_spec, b_sizes, b_pd = b, b.whcn, b.packed_dim
    if bias is not None:
        bias_spec = ctx.weight(f"{ctx.node.name}:bias", _pad_to(np.asarray(bias, np.float32), 1, 4))
    else:    # the binding must be filled; the kernel never reads it
        bias_spec = b_spec if const else ctx.weight(f"{ctx.node.name}:nobias", np.zeros(4, np.float32))
    tile = 1 if out.packed_dim == 2 else 0
    _, _, c, n = whcn(full)
    grid = ((N + 3) // 4, (M + 3) // 4, c * n if tile == 0 else (c + 3) // 4 * n)
    push = (Push().sizes(out).sizes(a).ivec4(*b_sizes).ivec4(out.packed_dim, a.packed_dim, b_pd, K)
            .ivec4(0 if bias is None else bias.shape[0], (N + 3) // 4, (K + 3) // 4 * 4).vec4(alpha))
    batch = int(np.prod(full[:-2]))
    ctx.dispatch("matmul", [(out.name, "w"), (a.name, "r"), (b_spec.name, "r"), (bias_spec.name, "r")], push,
                 spec("matmul", TILE=tile, TRANS_A=trans_a, TRANS_B=trans_b, HAS_BIAS=bias is not None,
                      SQUEEZE_M=squeeze_m), grid, "gemm",
                 flops=2 * M * N * K * batch,
                 nbytes=4 * (out.numel + a.numel) + b_spec.nbytes + (bias_spec.nbytes if bias is not None else 0),
                 axes={"storage": ctx.storage, "b": "const" if const else "tensor"})


@register
class MatMul(Op):
    name = "MatMul"
    limits = ("textures: a rank-4 (channels-packed) output steps k one at a time, slower than the width-packed "
              "path")

    def infer(self, node, ins):
        a, b = ins[0].shape, ins[1].shape
        if not a or not b:
            raise ModelError(f"{node}: MatMul needs operands of rank >= 1, got {list(a)} and {list(b)}")
        a2, b2 = (1,) + a if len(a) == 1 else a, b + (1,) if len(b) == 1 else b
        if isinstance(a2[-1], int) and isinstance(b2[-2], int) and a2[-1] != b2[-2]:
            raise ModelError(f"{node}: inner dims differ: {list(a)} x {list(b)}")
        batch = broadcast_shapes(node, a2[:-2], b2[:-2])
        return [(batch + (a[-2:-1] if len(a) > 1 else ()) + (b[-1:] if len(b) > 1 else ()), ins[0].dtype)]

    def reference(self, node, a, b):
        return [np.matmul(a, b)]

    def check(self, node, ins):
        for t in ins:
            if t.shape is not None and len(t.shape) > 4:
                return f"input '{t.name}' has rank {len(t.shape)}; the GPU kernel takes rank <= 4"
        return None

    def lower(self, node, ctx):
        ga, gb = ctx.graph.tensor(node.inputs[0]), ctx.graph.tensor(node.inputs[1])
        swap = len(gb.shape) == 1 and len(ga.shape) > 1   # out[.., m] = sum_k b[k] a[.., m, k]: b as a [1, K] row
        ta, tb = (gb, ga) if swap else (ga, gb)
        a = ctx.t(ta.name)
        if tb.is_const:
            b = np.asarray(tb.data, np.float32)
            b = b.reshape(-1, 1) if b.ndim == 1 else b
        else:
            b = ctx.t(tb.name)
        # the swapped a is read transposed, and so is a runtime 1-D b (its [K] reads as [1, K])
        trans_b = swap or not tb.is_const and len(tb.shape) == 1
        matmul_dispatch(ctx, ctx.t(node.outputs[0]), a, b, trans_b=trans_b,
                        squeeze_m=len(ga.shape) == 1 or len(gb.shape) == 1)


@register
class Gemm(Op):
    name = "Gemm"
    limits = "a runtime C costs an extra elementwise dispatch (two with beta != 1); a constant C is fused"

    def infer(self, node, ins):
        a, b = ins[0].shape, ins[1].shape
        if len(a) != 2 or len(b) != 2:
            raise ModelError(f"{node}: Gemm needs 2-D A and B, got {list(a)} and {list(b)}")
        M, K = a[::-1] if attr(node, "transA", 0) else a
        K2, N = b[::-1] if attr(node, "transB", 0) else b
        if isinstance(K, int) and isinstance(K2, int) and K != K2:
            raise ModelError(f"{node}: inner dims differ: A {list(a)} x B {list(b)}")
        if len(ins) > 2 and ins[2] is not None:
            c = ins[2].shape
            if len(c) > 2 or broadcast_shapes(node, c, (M, N)) != (M, N):
                raise ModelError(f"{node}: C {list(c)} does not broadcast to [{M}, {N}]")
        return [((M, N), ins[0].dtype)]

    def reference(self, node, a, b, c=None):
        a = a.T if attr(node, "transA", 0) else a
        b = b.T if attr(node, "transB", 0) else b
        y = attr(node, "alpha", 1.0) * (a @ b)
        if c is not None:
            y = y + attr(node, "beta", 1.0) * c
        return [np.asarray(y).astype(a.dtype, copy=False)]

    def lower(self, node, ctx):
        alpha, beta = float(attr(node, "alpha", 1.0)), float(attr(node, "beta", 1.0))
        ta, tb = bool(attr(node, "transA", 0)), bool(attr(node, "transB", 0))
        a, gb = ctx.t(node.inputs[0]), ctx.graph.tensor(node.inputs[1])
        b = np.asarray(gb.data, np.float32) if gb.is_const else ctx.t(gb.name)
        out = ctx.t(node.outputs[0])
        M, N = out.shape
        gc = ctx.graph.tensor(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] and beta != 0 else None
        if gc is None or gc.is_const:
            bias = None
            if gc is not None:
                c = beta * np.asarray(gc.data, np.float32).reshape((1,) * (2 - len(gc.shape)) + gc.shape)
                bias = np.broadcast_to(c, (c.shape[0], N))
            matmul_dispatch(ctx, out, a, b, trans_a=ta, trans_b=tb, alpha=alpha, bias=bias)
            return
        # runtime C: the product goes to a temp, then out = product + beta * C
        prod = ctx.temp(f"{out.name}:AB", (M, N))
        matmul_dispatch(ctx, prod, a, b, trans_a=ta, trans_b=tb, alpha=alpha)
        c = ctx.t(gc.name)
        if beta != 1.0:
            k = ctx.temp(f"{out.name}:beta", (), role=CONSTANT)
            k.data = np.array(beta, np.float32)
            scaled = ctx.temp(f"{out.name}:betaC", c.shape)
            elementwise_dispatch(ctx, "binary", 2, scaled, [c, k])
            c = scaled
        elementwise_dispatch(ctx, "binary", 0, out, [prod, c])
