"""MatMulNBits (com.microsoft, onnxruntime's blockwise 4-bit weights, as its MatMulNBitsQuantizer writes them):
Y = A [.., K] @ B^T (+ bias), B [N, K] stored as B [N, blocks, block_size / 2] uint8 (two 4-bit values a byte, the
low nibble first), scales [N * blocks] (or [N, blocks]), zero points packed two a byte [N * ceil(blocks / 2)], or as
float [N * blocks], or none (8). It runs on the w=q4 variants of the buffer GEMMs (ops/int8_weight.py Int4Weight):
the weight stays half a byte an element on the GPU. bits 4 only; g_idx (act-order) is not supported."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError, UnsupportedError
from . import Op, attr, register
from ..kernels.gemm import linear_dispatch, linear_ok, pack_bias
from ..quant import dequantize_blocks
from .int8_weight import Int4Weight


def nbits_operands(node, ins, source=""):
    """(q [K, N] uint8 values 0..15, scale [blocks, N] float32, zero [blocks, N] float32, block) of a MatMulNBits
    node's constant inputs; a ModelError naming the tensor that does not fit."""
    where = f"{source}{node}"
    k, n = int(attr(node, "K", 0)), int(attr(node, "N", 0))
    bits, block = int(attr(node, "bits", 4)), int(attr(node, "block_size", 0))
    if bits != 4:
        raise UnsupportedError(f"{where}: bits={bits}; minirt runs 4-bit MatMulNBits only")
    if block < 16 or block & (block - 1):
        raise ModelError(f"{where}: block_size {block} is not a power of two of at least 16")
    if k <= 0 or n <= 0:
        raise ModelError(f"{where}: attributes K ({k}) and N ({n}) must be positive")
    blocks = -(-k // block)
    b, s = ins[1], ins[2]
    z = ins[3] if len(ins) > 3 else None
    for t in [b, s, z] + list(ins[4:]):
        if t is not None and not t.is_const:
            raise UnsupportedError(f"{where}: '{t.name}' must be a constant")
    if len(ins) > 4 and ins[4] is not None:
        raise UnsupportedError(f"{where}: g_idx '{ins[4].name}' (act-order) is not supported")
    want = (n, blocks, block // 2)
    if b.data.dtype != np.uint8 or tuple(b.data.shape) != want:
        raise ModelError(f"{where}: B '{b.name}' is {b.data.dtype} {list(b.data.shape)}; K={k}, N={n} and "
                         f"block_size {block} need uint8 {list(want)}")
    if s.data.size != n * blocks:
        raise ModelError(f"{where}: scales '{s.name}' {list(s.data.shape)} need N x blocks = {n} x {blocks} values")
    scale = np.asarray(s.data, np.float32).reshape(n, blocks)
    nib = np.empty((n, blocks, block), np.uint8)
    nib[..., 0::2], nib[..., 1::2] = b.data & 15, b.data >> 4
    q = np.ascontiguousarray(nib.reshape(n, blocks * block)[:, :k].T)
    if z is None:
        zero = np.full((n, blocks), 8.0, np.float32)
    elif z.data.dtype == np.uint8:
        per = -(-blocks // 2)
        if z.data.size != n * per:
            raise ModelError(f"{where}: zero points '{z.name}' {list(z.data.shape)} need N x ceil(blocks / 2) = "
                             f"{n} x {per} bytes (two 4-bit values a byte)")
        zb = z.data.reshape(n, per)
        zz = np.empty((n, per * 2), np.uint8)
        zz[:, 0::2], zz[:, 1::2] = zb & 15, zb >> 4
        zero = zz[:, :blocks].astype(np.float32)
    else:
        zero = np.asarray(z.data, np.float32)
        if zero.size != n * blocks:
            raise ModelError(f"{where}: zero points '{z.name}' {list(z.data.shape)} need N x blocks = {n} x {blocks}")
        zero = zero.reshape(n, blocks)
        if not np.all((zero >= 0) & (zero <= 15)):
            raise ModelError(f"{where}: zero points '{z.name}' hold values outside 0..15, the range of 4-bit weights")
    if not np.all(np.isfinite(scale)):
        raise ModelError(f"{where}: scales '{s.name}' hold values that are not finite")
    return q, np.ascontiguousarray(scale.T), np.ascontiguousarray(zero.T), block


@register
class MatMulNBits(Op):
    name = "MatMulNBits"
    domain = "com.microsoft"
    limits = "bits 4, constant B, scales and zero points (packed or float), no g_idx; buffer storage, K a multiple of 4"

    def infer(self, node, ins):
        return [(tuple(ins[0].shape[:-1]) + (int(attr(node, "N", 0)),), ins[0].dtype)]

    def fold(self, node, ins):
        return None

    def reference(self, node, a, b, scales, zero=None, g_idx=None, bias=None):
        from ..graph import Tensor
        ts = [Tensor("A", data=a), Tensor("B", data=b), Tensor("scales", data=scales),
              None if zero is None else Tensor("zero_points", data=zero)]
        q, s, z, block = nbits_operands(node, ts)
        y = a @ dequantize_blocks(q, s, z, block)
        return [(y if bias is None else y + bias).astype(a.dtype)]

    def check(self, node, ins):
        if ins[0].shape is None or ins[0].shape[-1] != int(attr(node, "K", 0)):
            return f"A's last dim must be K ({attr(node, 'K', 0)})"
        nbits_operands(node, ins)
        return None

    def lower(self, node, ctx):
        g = ctx.graph
        ins = [g.tensor(i) if i else None for i in node.inputs]
        q, s, z, block = nbits_operands(node, ins, f"{g.source}: ")
        k, n = q.shape
        if not linear_ok(ctx, k):
            raise UnsupportedError(f"{node}: MatMulNBits runs on the buffer GEMM: buffer storage and K a multiple of 4")
        x, y = ctx.t(node.inputs[0]), ctx.t(node.outputs[0])
        bias = ins[5].data if len(ins) > 5 and ins[5] is not None else None
        wt = Int4Weight(node.inputs[1], q, s, z, block)
        bt = pack_bias(ctx, f"{node.name}.bias", bias, n)
        m = int(np.prod(x.shape[:-1]))
        linear_dispatch(ctx, y, x, wt, bt, m, n, k, -(-n // 4))
