#!/usr/bin/env python3
"""fp32 GEMMs by fp32_precision: speed and accuracy of the ieee kernel and of each split scheme at the Whisper
encoder's GEMM shapes (x [M, K] @ W [K, N] + b as one Linear), on one device, in one process.

  python tools/gemm_split.py                          # M 1500, K x N in {384, 1536}^2 (+ the merged QKV), ieee, f16x3
  python tools/gemm_split.py --shapes 1500,384,1536 --schemes f16x3 --runs 20 --json split.json
  python tools/gemm_split.py --option coopmat=emulate --shapes 64,64,32 --runs 1 --rounds 1   # any device (slow)

Per shape and scheme: the GEMM's median GPU time (its dispatch and, after a K split, the reduce pass; timestamp
queries, round-robin over every case so a slow stretch of a shared GPU touches them alike), TFLOP/s, the kernel, and
its error against a float64 product on two inputs: "randn" (x standard normal, W / sqrt(K)) and "mixed" (magnitudes
spread over 1e-6 .. 1e4, random signs). Errors are |y - ref| / (|x| @ |W| + |b|): what fp32 arithmetic bounds (about
K x 2^-24 at worst, far less on average); max and mean over the outputs. The speed figures use the randn input."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # the checkout's minirt, installed or not
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ can shadow an installed module

from benchconfig import round_robin  # noqa: E402

SHAPES = "1500,384,384;1500,384,1152;1500,384,1536;1500,1536,384;1500,1536,1536"   # M,K,N


def inputs(kind, m, k, n, seed=0):
    """(x [1, M, K], W [K, N], b [N]) float32 of one input kind."""
    rng = np.random.default_rng(seed)
    if kind == "randn":
        x = rng.standard_normal((1, m, k))
        w = rng.standard_normal((k, n)) / np.sqrt(k)
    else:
        x = rng.choice([-1.0, 1.0], (1, m, k)) * 10.0 ** rng.uniform(-6, 4, (1, m, k))
        w = rng.choice([-1.0, 1.0], (k, n)) * 10.0 ** rng.uniform(-6, 4, (k, n))
    return x.astype(np.float32), w.astype(np.float32), (0.1 * rng.standard_normal(n)).astype(np.float32)


def linear_model(m, w, b):
    from onnx import TensorProto, helper, numpy_helper
    k, n = w.shape
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                          "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


def errors(y, x, w, b):
    """(max, mean) of |y - x @ w - b| / (|x| @ |w| + |b|), in float64."""
    x64, w64 = x[0].astype(np.float64), w.astype(np.float64)
    ref = x64 @ w64 + b
    scale = np.abs(x64) @ np.abs(w64) + np.abs(b.astype(np.float64))
    e = np.abs(np.asarray(y, np.float64).reshape(ref.shape) - ref) / scale
    return float(e.max()), float(e.mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help=f"M,K,N;... (default {SHAPES})")
    ap.add_argument("--schemes", default="f16x3", help="comma-separated fp32_precision values besides ieee")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the cases (round-robin)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a Session option for every case, e.g. --option coopmat=emulate")
    ap.add_argument("--json", help="write the rows as JSON")
    a = ap.parse_args(argv)
    from minirt import MinirtError, Session
    opts = dict(o.split("=", 1) for o in a.option)
    schemes = ["ieee"] + [s for s in a.schemes.split(",") if s and s != "ieee"]
    cases, device = {}, None
    for spec in a.shapes.split(";"):
        m, k, n = (int(v) for v in spec.split(","))
        data = {kind: inputs(kind, m, k, n) for kind in ("randn", "mixed")}
        for scheme in schemes:
            for kind, (x, w, b) in data.items():
                try:
                    s = Session(linear_model(m, w, b), storage="buffer", profile=True,
                                options={**opts, "fp32_precision": scheme})
                except MinirtError as e:
                    print(f"{m}x{k}x{n} {scheme}: refused: {e}")
                    break
                cases[(m, k, n), scheme, kind] = (s, {"x": x}, (x, w, b))
    flops = {key: 2 * key[0][0] * key[0][1] * key[0][2] for key in cases}
    timed = round_robin({key: (s, feeds, lambda r, f=flops[key]: r.flops >= f or r.kernel.startswith("linear_reduce"))
                         for key, (s, feeds, _) in cases.items() if key[2] == "randn"}, a.rounds, a.runs)
    rows = []
    print(f"{'M x K x N':<16} {'fp32_precision':<15} {'kernel':<44} {'GPU us':>8} {'TFLOP/s':>8} {'vs ieee':>8} "
          f"{'randn err max / mean':>22} {'mixed err max / mean':>22}")
    for (shape, scheme, kind), (s, feeds, (x, w, b)) in cases.items():
        if kind != "randn":
            continue
        device = s.device.profile.name
        t = timed[shape, scheme, kind]
        us = statistics.median(t["ms"]) * 1e3
        mixed = cases.get((shape, scheme, "mixed"))
        err = {"randn": errors(t["out"][0], x, w, b)}
        if mixed:
            err["mixed"] = errors(mixed[0].run(None, mixed[1])[0], *mixed[2])
        base = next((r for r in rows if r["shape"] == shape and r["scheme"] == "ieee"), None)
        row = {"shape": shape, "scheme": scheme, "kernel": t["kernels"], "gpu_us": us,
               "tflops": flops[shape, scheme, kind] / us / 1e6, "err": err,
               "vs_ieee": us / base["gpu_us"] if base else 1.0}
        rows.append(row)
        fmt = lambda e: f"{e[0]:.2e} / {e[1]:.2e}"  # noqa: E731
        print(f"{'x'.join(map(str, shape)):<16} {scheme:<15} {t['kernels'][:44]:<44} {us:>8.1f} {row['tflops']:>8.2f} "
              f"{row['vs_ieee']:>7.2f}x {fmt(err['randn']):>22} {fmt(err['mixed']) if mixed else '-':>22}")
    for s, _, _ in cases.values():
        s.close()
    print(f"device: {device}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
