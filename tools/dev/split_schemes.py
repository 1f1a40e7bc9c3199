#!/usr/bin/env python3
"""Which split scheme recovers fp32 GEMM accuracy from 16-bit tensor-core products, emulated in numpy: each fp32
operand split into 16-bit terms, the kept products of terms computed exactly and summed in fp32 (as a tensor core
accumulates), against a float64 reference. Error per output is |C - C64| / (|A| |W|)[m, n]; max and mean over the
outputs, beside the SIMT fp32 GEMM's (ieee), with the products each scheme costs (bf16 and fp16 products run at the
same tensor-core rate on Hopper, so products are cost).

  python tools/dev/split_schemes.py --k 384,1536

Schemes: f16x3, minirt's fp32_precision="f16x3" (hi = x rounded to 11 bits, lo = fp16 of the remainder scaled by 2^11,
each row of A and each column of W scaled by a power of two that puts its largest |x| in [2^14, 2^15); hi hi + hi lo +
lo hi); bf16x3 (hi = bf16(x), lo = bf16(x - hi); the same three products); bf16x6 (three bf16 terms, the six products
whose terms' orders add up to at most 2, PyTorch's and cuBLAS's name); bf16x9 (all nine). Inputs: randn; spread (signs
random, magnitudes log-uniform over 1e-6 .. 1e4); tiny (randn times 1e-36: values fp16 cannot hold unscaled).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np


def bf16(x):
    """Round float32 to bfloat16 (nearest even), returned as float32."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def pow2_scale(x, axis):
    """2^s per row (axis=1) or column (axis=0) with the largest |x| in [2^14, 2^15) after scaling."""
    mx = np.abs(x).max(axis=axis, keepdims=True)
    e = np.floor(np.log2(np.where(mx > 0, mx, 1.0).astype(np.float64)))
    return np.exp2(14 - e).astype(np.float64)


def split_f16(x, scale):
    """(hi, lo): x scaled = hi + lo 2^-11, both fp16 values (as float32)."""
    xs = (x.astype(np.float64) * scale).astype(np.float32)
    hi = xs.astype(np.float16).astype(np.float32)
    lo = ((xs.astype(np.float64) - hi) * 2048).astype(np.float16).astype(np.float32)
    return hi, lo


def mm32(a, b):
    return np.matmul(a.astype(np.float32), b.astype(np.float32))


def scheme_f16x3(a, w):
    sa, sw = pow2_scale(a, 1), pow2_scale(w, 0)
    ah, al = split_f16(a, sa)
    wh, wl = split_f16(w, sw)
    corr = (mm32(ah, wl) + mm32(al, wh)) * np.float32(1 / 2048)
    c = mm32(ah, wh) + corr
    return (c.astype(np.float64) / (sa * sw)).astype(np.float32)


def bf16_terms(x, n):
    terms, r = [], x.astype(np.float32)
    for _ in range(n):
        t = bf16(r)
        terms.append(t)
        r = (r - t).astype(np.float32)
    return terms


def scheme_bf16(k_terms, max_order):
    def run(a, w):
        at, wt = bf16_terms(a, k_terms), bf16_terms(w, k_terms)
        parts = [mm32(at[i], wt[j]) for i in range(k_terms) for j in range(k_terms) if i + j <= max_order]
        c = np.zeros_like(parts[0])
        for p in reversed(parts):       # the smallest terms first
            c = c + p
        return c
    return run


SCHEMES = {"ieee": (mm32, 1), "f16x3": (scheme_f16x3, 3), "bf16x3": (scheme_bf16(2, 1), 3),
           "bf16x6": (scheme_bf16(3, 2), 6), "bf16x9": (scheme_bf16(3, 4), 9)}


def inputs(kind, m, k, n, rng):
    if kind == "randn":
        return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    if kind == "spread":
        def one(shape):
            mag = 10.0 ** rng.uniform(-6, 4, shape)
            return (mag * rng.choice([-1, 1], shape)).astype(np.float32)
        return one((m, k)), one((k, n))
    a, w = inputs("randn", m, k, n, rng)
    return (a * np.float32(1e-36)).astype(np.float32), w


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--k", default="384,1536", help="comma-separated inner dimensions (the encoder's: 384, 1536)")
    a = ap.parse_args(argv)
    print(f"{'K':>5} {'input':>7} " + " ".join(f"{s + ' max / mean':>22}" for s in SCHEMES))
    for k in (int(v) for v in a.k.split(",")):
        for kind in ("randn", "spread", "tiny"):
            x, w = inputs(kind, a.m, k, a.n, np.random.default_rng(k))
            ref = x.astype(np.float64) @ w.astype(np.float64)
            denom = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64)
            row = []
            for fn, _ in SCHEMES.values():
                err = np.abs(fn(x, w).astype(np.float64) - ref) / np.where(denom > 0, denom, 1)
                row.append(f"{err.max():.1e} / {err.mean():.1e}")
            print(f"{k:>5} {kind:>7} " + " ".join(f"{r:>22}" for r in row))
    print("products (tensor-core cost, x fp16's): " + ", ".join(f"{s} {c}" for s, (_, c) in SCHEMES.items()
                                                                 if s != "ieee"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
