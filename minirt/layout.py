"""Host-side conversion between dense NCHW arrays and the texel layout of image3D tensors.

A texture tensor of WHCN sizes (W, H, C, N) packed along dim p is an rgba image of extents
(x, y, z) = (W', H, C' * N), where the packed dim is divided into groups of 4 (padded with zeros).
"""
from __future__ import annotations

import numpy as np

from .plan import whcn


def to_texels(a: np.ndarray, packed_dim: int) -> np.ndarray:
    """Dense array -> float32 array of shape (z, y, x, 4), ready for vkCmdCopyBufferToImage."""
    w, h, c, n = whcn(a.shape)
    x = np.asarray(a, np.float32).reshape(n, c, h, w)
    if packed_dim == 0:
        w4 = -(-w // 4) * 4
        x = np.pad(x, ((0, 0), (0, 0), (0, 0), (0, w4 - w)))
        return np.ascontiguousarray(x.reshape(n * c, h, w4 // 4, 4))
    if packed_dim == 2:
        c4 = -(-c // 4) * 4
        x = np.pad(x, ((0, 0), (0, c4 - c), (0, 0), (0, 0)))
        x = x.reshape(n, c4 // 4, 4, h, w).transpose(0, 1, 3, 4, 2)
        return np.ascontiguousarray(x.reshape(n * c4 // 4, h, w, 4))
    raise ValueError(f"unsupported packed dim {packed_dim}")


def from_texels(t: np.ndarray, shape, packed_dim: int, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of to_texels: (z, y, x, 4) texels -> dense float32 array of `shape` (written into `out`, a C-contiguous
    float32 array of that shape, where given)."""
    w, h, c, n = whcn(shape)
    if packed_dim == 0:
        x = t.reshape(n, c, h, -1)[..., :w]
    elif packed_dim == 2:
        x = t.reshape(n, -1, h, w, 4).transpose(0, 1, 4, 2, 3).reshape(n, -1, h, w)[:, :c]
    else:
        raise ValueError(f"unsupported packed dim {packed_dim}")
    if out is not None:
        np.copyto(out.reshape(x.shape), x)
        return out
    return np.array(x, dtype=np.float32, order="C").reshape(shape)  # always a copy: t may be mapped memory
