"""Weight-only int8 quantization, as plain numpy data: what a quantized checkpoint holds and what the GEMM kernels'
int8 variants read (glsl/qweight.glslh).

A quantized Linear weight is int8 with one float32 scale per output row (symmetric, as CTranslate2 quantizes:
q = round(w * 127 / max|w| of the row)), and optionally a zero point per row (ONNX's DequantizeLinear with a
uint8 or int8 zero point). In the graph a Linear reads such a weight as an int8 constant W [K, N] with its scale
[N] and zero point [N] (or "") as inputs 4 and 5: B[k][n] = (W[k][n] - zero[n]) * scale[n]."""
from __future__ import annotations

import numpy as np

from .errors import ModelError

COMPUTE_TYPES = ("default", "auto", "float32", "float16", "int8", "int8_float32", "int8_float16", "int8_bfloat16")


class QuantizedWeight:
    """A Linear weight [N, K] (output rows first, as checkpoints store it) as int8 `q` and a float32 `scale` per row:
    W = q * scale[:, None]. np.asarray(w) (and np.asarray(w, np.float32)) give that float weight, so code that only
    computes with weights (the numpy reference) reads it as any other; the Vulkan graphs keep it int8."""

    def __init__(self, q: np.ndarray, scale: np.ndarray, name: str = "weight"):
        q, scale = np.asarray(q), np.asarray(scale)
        if q.dtype != np.int8 or q.ndim != 2:
            raise ModelError(f"'{name}': a quantized weight is a 2-D int8 array, not {q.dtype} {list(q.shape)}")
        if scale.shape != (q.shape[0],):
            raise ModelError(f"'{name}': {list(q.shape)} int8 needs one scale per row ({q.shape[0]}), got "
                             f"{list(scale.shape)}")
        scale = scale.astype(np.float32)
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            bad = int(np.flatnonzero(~(np.isfinite(scale) & (scale > 0)))[0])
            raise ModelError(f"'{name}': scale of row {bad} is {scale[bad]}; scales must be finite and positive")
        self.q, self.scale, self.name = q, scale, name

    shape = property(lambda self: self.q.shape)
    ndim = 2
    dtype = np.dtype(np.float32)       # what it stands for
    nbytes = property(lambda self: self.q.nbytes + self.scale.nbytes)

    def __array__(self, dtype=None, copy=None):
        w = self.q.astype(np.float32) * self.scale[:, None]
        return w if dtype is None else w.astype(dtype, copy=False)

    def astype(self, dtype, copy=True):
        return np.asarray(self, dtype)

    def kn(self):
        """(W^T [K, N] int8 contiguous, scale [N]): the operands of a Linear reading x [.., K]."""
        return np.ascontiguousarray(self.q.T), self.scale


def quantize_rows(w, name: str = "weight") -> QuantizedWeight:
    """A float weight [N, K] quantized per output row, symmetric, to int8 as CTranslate2 does (a row of zeros gets
    scale 1)."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).max(axis=1) if w.shape[1] else np.zeros(w.shape[0], np.float32)
    ct2 = np.where(amax > 0, 127.0 / np.where(amax > 0, amax, 1.0), 1.0).astype(np.float32)
    q = np.clip(np.rint(w * ct2[:, None]), -127, 127).astype(np.int8)
    return QuantizedWeight(q, 1.0 / ct2, name)


def from_ct2(q: np.ndarray, weight_scale: np.ndarray, name: str, source: str = "model.bin") -> QuantizedWeight:
    """A CTranslate2 int8 variable and its `weight_scale` (W = q / weight_scale per row); a ModelError naming the
    variable where they do not match."""
    q, s = np.asarray(q), np.asarray(weight_scale, np.float32)
    if q.dtype != np.int8 or q.ndim != 2:
        raise ModelError(f"{source}: '{name}' has a weight_scale but is {q.dtype} {list(q.shape)}, not 2-D int8")
    if s.shape != (q.shape[0],):
        raise ModelError(f"{source}: '{name}_scale' {list(s.shape)} does not match '{name}' {list(q.shape)}: "
                         f"CTranslate2 int8 weights have one scale per row ({q.shape[0]})")
    if not np.all(np.isfinite(s)) or np.any(s <= 0):
        raise ModelError(f"{source}: '{name}_scale' holds scales that are not finite and positive")
    return QuantizedWeight(q, 1.0 / s, name)


def dequantize_kn(q_kn, scale, zero=None) -> np.ndarray:
    """B [K, N] float32 of an int8 Linear operand: (q - zero) * scale per column."""
    b = np.asarray(q_kn, np.float32)
    if zero is not None:
        b = b - np.asarray(zero, np.float32).reshape(1, -1)
    return b * np.asarray(scale, np.float32).reshape(1, -1)


def dequantize_blocks(q_kn, scale, zero, block: int) -> np.ndarray:
    """B [K, N] float32 of a blocked 4-bit Linear operand: (q - zero) * scale, scale and zero [blocks, N] one row a
    block of `block` k."""
    rows = np.arange(q_kn.shape[0]) // block
    return (q_kn.astype(np.float32) - zero[rows]) * scale[rows]


def quantize_checkpoint(weights: dict, linear_names) -> dict:
    """The checkpoint `weights` with each float weight named in `linear_names` quantized per row (quantize_rows);
    weights already quantized stay as they are."""
    out = dict(weights)
    for name in linear_names:
        if name in out and not isinstance(out[name], QuantizedWeight):
            out[name] = quantize_rows(out[name], name)
    return out
