"""Weight-only int8 operands of the buffer GEMMs (the w=i8 variants of glsl/linear.comp, linear_rows.comp and
linear_cm.glslh; glsl/qweight.glslh): a Linear whose W is an int8 constant [K, N] with a float32 scale [N] and zero point [N] (inputs 4
and 5, minirt/quant.py) keeps its weight at a byte an element on the GPU, dequantized in the kernels' registers."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..plan import WEIGHT, TensorSpec
from ..kernels.gemm import pack_regfed_i8, pack_regfed_q4, pack_regfed_q4_params
from ..quant import dequantize_blocks, dequantize_kn


def int8_operands(graph, node):
    """(q [K, N] int8, scale [N] float32, zero [N] float32 or None) of a Linear with an int8 weight, else None."""
    ins = list(node.inputs) + [""] * (6 - len(node.inputs))
    if not ins[4] or "block" in node.attrs:
        return None
    q, s = graph.tensor(ins[1]), graph.tensor(ins[4])
    z = graph.tensor(ins[5]) if ins[5] else None
    if not q.is_const or q.data.dtype != np.int8 or q.data.ndim != 2:
        raise ModelError(f"{node}: a weight scale needs an int8 2-D constant weight, '{q.name}' is "
                         f"{getattr(q.data, 'dtype', 'not a constant')}")
    n = q.data.shape[1]
    for t in (s, z):
        if t is not None and (not t.is_const or t.data.size != n):
            raise ModelError(f"{node}: '{t.name}' must be a constant of {n} values (one per column of '{q.name}')")
    return (q.data, np.asarray(s.data, np.float32).reshape(-1),
            None if z is None else np.asarray(z.data, np.float32).reshape(-1))


def int4_operands(graph, node):
    """(q [K, N] uint8 values 0..15, scale [blocks, N], zero [blocks, N] float32, block) of a Linear with a blocked
    4-bit weight (attribute block: fold_dequantize_linear), else None."""
    block = int(node.attrs.get("block", 0))
    if not block:
        return None
    q, s, z = (graph.tensor(node.inputs[i]) for i in (1, 4, 5))
    k, n = q.data.shape
    want = (-(-k // block), n)
    if q.data.dtype != np.uint8 or s.data.shape != want or z.data.shape != want or block % 4:
        raise ModelError(f"{node}: a blocked 4-bit weight needs uint8 '{q.name}' [K, N] with scale and zero point "
                         f"{list(want)} and a block size that is a multiple of 4")
    return q.data, np.asarray(s.data, np.float32), np.asarray(z.data, np.float32), block


class Int8Weight:
    """B [K, N] int8 with per-column scale and zero point, as the GEMM dispatches take a weight (GemmWeight's
    row_major and regfed): packed [K][N4] one uint32 per k and 4 columns (little-endian bytes), zero past N, or per
    slice and lane for linear_cmreg; `params` the float32 scale [N4 vec4] then zero [N4 vec4]."""

    axes = {"w": "i8"}

    def __init__(self, name: str, q_kn: np.ndarray, scale: np.ndarray, zero: np.ndarray | None):
        self.name, self.q, self.scale, self.zero = name, q_kn, scale, zero

    @property
    def b_kn(self) -> np.ndarray:
        """The dequantized float weight (paths that have no int8 kernel)."""
        return dequantize_kn(self.q, self.scale, self.zero)

    def _packed(self, ctx, packing: str, make, dtype: str, per_elem: int = 1) -> TensorSpec:
        """The plan's buffer name@packing of make()'s bytes (made once a planning call: LowerCtx.packs; one spec a
        plan), sized in elements of per_elem bytes."""
        key = f"{self.name}@{packing}"
        spec = ctx.plan.tensors.get(key)
        if spec is None:
            w = ctx.packs.once((packing, self.q), make)
            spec = TensorSpec(key, (w.size // per_elem,), WEIGHT, "buffer", 0, w, dtype=dtype)
            ctx.plan.tensors[key] = spec
        return spec

    def row_major(self, ctx) -> TensorSpec:
        def pack():
            k, n = self.q.shape
            w = np.zeros((k, -(-n // 4) * 4), np.int8)
            w[:, :n] = self.q
            return w.reshape(-1)
        return self._packed(ctx, "i8", pack, "int8")

    def regfed(self, ctx) -> TensorSpec:
        """The weight packed for linear_cmreg's w=i8 variant (gemm.py pack_regfed_i8), still a byte an element."""
        return self._packed(ctx, "i8regfed", lambda: pack_regfed_i8(self.q), "int8")

    def regfed_args(self, ctx) -> list:
        """The extra binding of linear_cmreg's quantized variant: for int8, the same scales and zero points."""
        return self.extra_args(ctx)

    def params(self, ctx) -> TensorSpec:
        key = f"{self.name}.qparams"
        spec = ctx.plan.tensors.get(f"{key}@packed")
        if spec is None:
            n = self.q.shape[1]
            n4 = -(-n // 4) * 4
            p = np.zeros(2 * n4, np.float32)
            p[:n] = self.scale
            if self.zero is not None:
                p[n4:n4 + n] = self.zero
            spec = ctx.weight(key, p, dtype="float32")
        return spec

    def extra_args(self, ctx) -> list:
        return [(self.params(ctx).name, "r")]


class Int4Weight(Int8Weight):
    """B [K, N] as unsigned 4-bit values with a scale and zero point per block of `block` k and column (onnxruntime's
    MatMulNBits), for the w=q4 variants: packed 16 bits per k and 4 columns (nibble j column 4 n4 + j), two such a
    uint32; `params` a header vec4 (block, blocks), then scale [blocks][N4] and zero [blocks][N4]."""

    axes = {"w": "q4"}

    def __init__(self, name: str, q_kn: np.ndarray, scale: np.ndarray, zero: np.ndarray, block: int):
        self.name, self.q, self.scale, self.zero, self.block = name, q_kn, scale, zero, int(block)

    @property
    def b_kn(self) -> np.ndarray:
        return dequantize_blocks(self.q, self.scale, self.zero, self.block)

    def row_major(self, ctx) -> TensorSpec:
        def pack():
            k, n = self.q.shape
            n4 = -(-n // 4)
            w = np.zeros((k, n4 * 4), np.uint16)
            w[:, :n] = self.q
            packed = (w[:, 0::4] | w[:, 1::4] << 4 | w[:, 2::4] << 8 | w[:, 3::4] << 12).reshape(-1)
            return np.pad(packed, (0, (-packed.size) % 2)).astype("<u2").view(np.uint8)
        return self._packed(ctx, "q4", pack, "uint4", 2)

    def regfed(self, ctx) -> TensorSpec:
        """The weight packed for linear_cmreg's w=q4 variant (gemm.py pack_regfed_q4), still half a byte an element."""
        return self._packed(ctx, "q4regfed", lambda: pack_regfed_q4(self.q).view(np.uint8), "uint4", 2)

    def regfed_args(self, ctx) -> list:
        """linear_cmreg w=q4's block parameters: fp16 (scale, 1024 + zero) per block and column, a lane's two columns
        side by side (gemm.py pack_regfed_q4_params)."""
        key = f"{self.name}.q4regfed"
        spec = ctx.plan.tensors.get(f"{key}@packed")
        if spec is None:
            spec = ctx.weight(key, pack_regfed_q4_params(self.scale, self.zero, self.block, self.q.shape[0]),
                              dtype="float16")
        return [(spec.name, "r")]

    def params(self, ctx) -> TensorSpec:
        key = f"{self.name}.q4params"
        spec = ctx.plan.tensors.get(f"{key}@packed")
        if spec is None:
            blocks, n = self.scale.shape
            n4 = -(-n // 4) * 4
            s, z = np.zeros((blocks, n4), np.float32), np.zeros((blocks, n4), np.float32)
            s[:, :n], z[:, :n] = self.scale, self.zero
            head = np.array([self.block, blocks, 0, 0], np.float32)
            spec = ctx.weight(key, np.concatenate([head, s.reshape(-1), z.reshape(-1)]), dtype="float32")
        return spec
