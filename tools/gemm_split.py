#!/usr/bin/env python3
"""fp32 GEMMs and attention by fp32_precision: speed and accuracy of the ieee kernels and of each split scheme at the
Whisper encoder's GEMM shapes (x [M, K] @ W [K, N] + b as one Linear) and its self-attention (one fused Attention,
q, k, v [B, T, heads x head dim]), on one device, in one process.

  python tools/gemm_split.py                          # M 1500, K x N in {384, 1536}^2 (+ the merged QKV), ieee, f16x3;
                                                      # attention 1 x 1500 x 1500, 6 heads of 64 (Whisper tiny)
  python tools/gemm_split.py --shapes 1500,384,1536 --schemes f16x3 --runs 20 --json split.json
  python tools/gemm_split.py --shapes none --attention 1,1500,1500,6,64;1,1500,1500,8,64    # attention only
  python tools/gemm_split.py --option coopmat=emulate --shapes 64,64,32 --attention 1,64,64,1,64 --runs 1 --rounds 1
                                                      # any device (slow)

Per shape and scheme: the GEMM's median GPU time (its dispatch and, after a K split, the reduce pass; timestamp
queries, round-robin over every case so a slow stretch of a shared GPU touches them alike), TFLOP/s, the kernel, and
its error against a float64 product on two inputs: "randn" (x standard normal, W / sqrt(K)) and "mixed" (magnitudes
spread over 1e-6 .. 1e4, random signs). Errors are |y - ref| / (|x| @ |W| + |b|): what fp32 arithmetic bounds (about
K x 2^-24 at worst, far less on average); max and mean over the outputs. The speed figures use the randn input.
Per attention shape and scheme: the Attention's median GPU time (its dispatches, the combine pass after a key split
included), TFLOP/s (4 B H Tq Tk dh), the kernels, and the error against float64 on "randn" (q, k, v standard normal)
and "mixed" (each row of q, k and v its own magnitude, 1e-3 .. 1e3, logits up to the hundreds), relative to
sum_j P_j |v_j| (the scale fp32's rounding of each output has)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # the checkout's minirt, installed or not
sys.path += [str(ROOT / "tools"), str(ROOT / "tests")]   # benchconfig, test_fuse_attention's attention model; last, so
                                                       # nothing there can shadow an installed module

from benchconfig import round_robin  # noqa: E402

SHAPES = "1500,384,384;1500,384,1152;1500,384,1536;1500,1536,384;1500,1536,1536"   # M,K,N
ATTENTION = "1,1500,1500,6,64"   # B,Tq,Tk,heads,head dim: Whisper tiny's encoder self-attention


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


def attention_inputs(kind, B, Tq, Tk, D, seed=0):
    """q, k, v [B, T, D] float32 of one input kind."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((B, T, D)) for T in (Tq, Tk, Tk))
    if kind == "mixed":
        q = q * 10.0 ** rng.uniform(-3, 1.5, (B, Tq, 1))
        k = k * 10.0 ** rng.uniform(-3, 1, (B, Tk, 1))
        v = v * 10.0 ** rng.uniform(-3, 3, (B, Tk, 1))
    return {"q": q.astype(np.float32), "k": k.astype(np.float32), "v": v.astype(np.float32)}


def attention_errors(y, feeds, H):
    """(max, mean) of |y - ref| / (P @ |v|) against float64 attention with scale dh^-0.5."""
    q, k, v = (feeds[n].astype(np.float64) for n in "qkv")
    B, Tq, D = q.shape
    dh = D // H
    heads = lambda x: x.reshape(B, -1, H, dh).transpose(0, 2, 1, 3)  # noqa: E731
    s = heads(q) @ heads(k).transpose(0, 1, 3, 2) * dh ** -0.5
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref, scale = p @ heads(v), p @ np.abs(heads(v))
    e = np.abs(heads(np.asarray(y, np.float64)) - ref) / scale
    return float(e.max()), float(e.mean())


def attention_rows(specs, schemes, opts, rounds, runs):
    """The attention shapes' rows (printed as they come), each scheme beside ieee, and the device's name."""
    from minirt import MinirtError, Session
    from test_fuse_attention import attention_model
    rows, cases, device = [], {}, None
    for spec in specs:
        B, Tq, Tk, H, dh = (int(v) for v in spec.split(","))
        model = attention_model(B, Tq, Tk, H, dh)
        for scheme in schemes:
            try:
                s = Session(model, storage="buffer", profile=True, options={**opts, "fp32_precision": scheme})
            except MinirtError as e:
                print(f"attention {spec} {scheme}: refused: {e}")
                continue
            cases[spec, scheme] = (s, H, 4 * B * H * Tq * Tk * dh,
                                   {kind: attention_inputs(kind, B, Tq, Tk, H * dh) for kind in ("randn", "mixed")})
    timed = round_robin({key: (s, x["randn"], lambda r: r.op == "Attention") for key, (s, _, _, x) in cases.items()},
                        rounds, runs)
    print(f"\n{'B,Tq,Tk,H,dh':<16} {'fp32_precision':<15} {'attention kernels':<44} {'GPU us':>8} {'TFLOP/s':>8} "
          f"{'vs ieee':>8} {'randn err max / mean':>22} {'mixed err max / mean':>22}")
    for (spec, scheme), (s, H, flops, data) in cases.items():
        t = timed[spec, scheme]
        us = statistics.median(t["ms"]) * 1e3
        err = {"randn": attention_errors(t["out"][0], data["randn"], H),
               "mixed": attention_errors(s.run(None, data["mixed"])[0], data["mixed"], H)}
        base = next((r for r in rows if r["shape"] == spec and r["scheme"] == "ieee"), None)
        rows.append({"attention": True, "shape": spec, "scheme": scheme, "kernel": t["kernels"], "gpu_us": us,
                     "tflops": flops / us / 1e6, "err": err, "vs_ieee": us / base["gpu_us"] if base else 1.0})
        r = rows[-1]
        print(f"{spec:<16} {scheme:<15} {t['kernels'][:44]:<44} {us:>8.1f} {r['tflops']:>8.2f} {r['vs_ieee']:>7.2f}x "
              f"{err['randn'][0]:.2e} / {err['randn'][1]:.2e} {err['mixed'][0]:.2e} / {err['mixed'][1]:.2e}")
        device = s.device.profile.name
        s.close()
    return rows, device


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help=f"M,K,N;... (default {SHAPES}); none: no GEMMs")
    ap.add_argument("--attention", default=ATTENTION,
                    help=f"B,Tq,Tk,heads,head dim;... (default {ATTENTION}); none: no attention")
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
    for spec in a.shapes.split(";") if a.shapes != "none" else ():
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
    if cases:
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
        device = s.device.profile.name
        s.close()
    if a.attention != "none":
        more, device = attention_rows(a.attention.split(";"), schemes, opts, a.rounds, a.runs)
        rows += more
    print(f"device: {device}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
