"""The tiled GEMM dispatch (glsl/gemm.comp), shared by conv routes (im2col, pointwise) and linear layers.

Tile shape: each invocation computes TM rows x 4*TN4 columns; the work group (its local size chosen by
the "gemm" family picker) stages BK-deep slices of A and B in shared memory."""
from __future__ import annotations

import numpy as np

from ..planner.plan import Push

ACTS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}


def tile_config(profile) -> tuple[int, int, int]:
    """(TM, TN4, BK) for a device: 4x4 outputs per invocation, 16-deep stages. Keeping 16 accumulators
    per invocation stays clear of register spills on every GPU we know of."""
    return 4, 1, 16


def pack_weight(ctx, name: str, b_kn: np.ndarray):
    """B [K, N] -> a [Kp][N4] vec4 weight buffer, zero past K and N."""
    k, n = b_kn.shape
    kp, n4 = -(-k // 4) * 4, -(-n // 4)
    w = np.zeros((kp, n4 * 4), np.float32)
    w[:k, :n] = b_kn
    return ctx.weight(name, w), n4


def pack_bias(ctx, name: str, bias, n: int):
    b = np.zeros(-(-n // 4) * 4, np.float32)
    if bias is not None:
        b[:n] = np.asarray(bias, np.float32).reshape(-1)
    return ctx.weight(name, b)


def gemm_dispatch(ctx, out, a, wt, bt, m, n, k, n4, *, a_mode=0, out_mode=0, act=None, m0=0, lda=None,
                  scratch=False):
    """out[m0 : m0 + m] = act(A @ B + bias); `a` is the A tensor (activation or im2col scratch)."""
    tm, tn4, bk = tile_config(ctx.profile)
    p = (Push().sizes(out).sizes(a).ivec4(m, n, k, n4)
         .ivec4(m0, lda if lda is not None else k, a.packed_dim, 0))
    kernel = f"gemm_{ctx.storage}_{'scratch' if scratch else 'act'}"
    ctx.dispatch(kernel, [(out.name, "w"), (a.name, "r"), (wt.name, "r"), (bt.name, "r")], p,
                 (tm, tn4, bk, a_mode, out_mode, ACTS[act]), (-(-n4 // tn4), -(-m // tm), 1), "gemm",
                 flops=2 * m * n * k, nbytes=4 * (m * k + k * n + m * n))


def linear_tile(ctx, m, n):
    """Tile variant of glsl/linear.comp. Discrete GPUs: 4x4 outputs per invocation with 32-deep shared-memory
    slices (on an H200 it beat 16-deep slices and 8x4 tiles on every Whisper GEMM: docs/benchmarks.md);
    elsewhere 4x4 with 16-deep slices, which fits any shared-memory size. Session(options={"gemm_tile": ...})
    overrides."""
    forced = ctx.options.get("gemm_tile")
    if forced:
        return forced
    return "t44k32" if ctx.profile.device_type == "discrete" else "t44"


def linear_ok(ctx, k) -> bool:
    """glsl/linear.comp reads A rows as vec4 from buffers: buffer storage and K a multiple of 4."""
    return ctx.storage == "buffer" and k % 4 == 0 and not ctx.options.get("no_fast_gemm")


def linear_dispatch(ctx, out, a, wt, bt, m, n, k, n4, *, out_mode=0, act=None, m0=0, lda4=None, m_total=0,
                    residual=None):
    """out (rows m0 .. m0 + m) = act(A @ B + bias) (+ residual) on the fast buffer GEMM."""
    tile = linear_tile(ctx, m, n)
    tm, tn4 = {"t44": (4, 1), "t84": (8, 1), "t48": (4, 2), "t88": (8, 2), "t44k32": (4, 1)}[tile]
    p = Push().ivec4(m, n, k, n4).ivec4(m0, lda4 if lda4 is not None else k // 4, m_total, 0)
    res = residual if residual is not None else bt
    ctx.dispatch(f"linear_{tile}", [(out.name, "w"), (a.name, "r"), (wt.name, "r"), (bt.name, "r"), (res.name, "r")],
                 p, (out_mode, ACTS[act], residual is not None), (-(-n4 // tn4), -(-m // tm), 1), "gemm",
                 flops=2 * m * n * k, nbytes=4 * (m * k + k * n + m * n * (2 if residual is not None else 1)))
