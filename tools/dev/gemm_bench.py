#!/usr/bin/env python3
"""GEMM kernel benchmark: one Linear layer (MatMul + bias, optionally GELU or a residual) per shape, under
several planner configurations, timed per dispatch from the timestamp query pool.

  python tools/dev/gemm_bench.py                                   # the Whisper-tiny shapes, default configs
  python tools/dev/gemm_bench.py --shapes 1500,384,1536 --config fp32 --config fp32:gemm_tile=t44,local_size=8x8
  python tools/dev/gemm_bench.py --config fp16 --config fp16:coopmat=0 --json gemm.json
  python tools/dev/gemm_bench.py --torch                            # with PyTorch CUDA (cuBLAS) at the same shapes

A config is PRECISION[:KEY=VALUE,...] with Session options (gemm_tile, cm_tile, coopmat=0, coopmat2=0 (the
VK_KHR_cooperative_matrix GEMMs where linear_cm2 would run), cm2_tile, local_size=XxY), and
weights=int8 (the weight as a per-column int8 DequantizeLinear: the w=i8 kernels) or weights=q4 (MatMulNBits, 4-bit
blocks of 32: the w=q4 kernels); e.g. a decode step's Linears, fp16 beside int8 and 4-bit weights:
  python tools/dev/gemm_bench.py --shapes "1,384,1536,gelu;1,1536,384,residual;1,384,51864" \
      --config fp16 --config fp16:weights=int8 --config fp16:weights=q4
Shapes and configs are measured round-robin (--rounds times --runs each), so a slow stretch of a shared GPU
touches them alike. Per row: the GEMM dispatch's median GPU time, TFLOP/s, and the max error against a float64 reference
computed from the inputs and weights as the kernel sees them (rounded to fp16 at fp16).

--torch adds PyTorch CUDA (cuBLAS, TF32 off) in the same process, at each shape and precision: F.linear with the same
epilogue, and the matrix product alone. Each is captured REPS times back to back into one CUDA graph (one stream, so
every call waits for the one before, as minirt's dispatches wait at their barriers) and timed by CUDA events around a
replay: GPU time per call, launch gaps included, which is what minirt's stamp-to-stamp figure holds."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))   # the checkout's minirt, installed or not
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ can shadow an installed module

from benchconfig import cuda_kernels, parse_config, round_robin, torch_case, torch_time  # noqa: E402

SHAPES = "1500,384,384,none;1500,384,1536,gelu;1500,1536,384,residual"   # M,K,N,epilogue


def linear_model(m, k, n, epilogue, seed=0, weights="float"):
    """(model, W [K, N] as the kernel sees it, bias); weights "int8" / "q4": quantized (see the module doc)."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = (0.1 * rng.standard_normal(n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"])]
    inits = {"b": b}
    if weights == "int8":
        s = (np.abs(w).max(axis=0) / 127).astype(np.float32)
        inits.update(q=np.clip(np.rint(w / s), -127, 127).astype(np.int8), s=s)
        w = inits["q"].astype(np.float32) * s
        nodes.insert(0, helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=1))
    elif weights == "q4":
        blk = 32
        wb = np.pad(w.T, ((0, 0), (0, -k % blk))).reshape(n, -1, blk)
        s = (np.abs(wb).max(axis=2) / 7 + 1e-12).astype(np.float32)
        q = np.clip(np.rint(wb / s[..., None]) + 8, 0, 15).astype(np.uint8)
        w = ((q.astype(np.float32) - 8) * s[..., None]).reshape(n, -1)[:, :k].T.copy()
        inits.update(B=q[..., 0::2] | (q[..., 1::2] << 4), scales=s.reshape(-1))
        nodes[:2] = [helper.make_node("MatMulNBits", ["x", "B", "scales", "", "", "b"], ["hb"], domain="com.microsoft",
                                      K=k, N=n, bits=4, block_size=blk)]
    else:
        inits["w"] = w
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])]
    if epilogue == "gelu":
        nodes.append(helper.make_node("Gelu", ["hb"], ["y"]))
    elif epilogue == "residual":
        nodes.append(helper.make_node("Add", ["hb", "r"], ["y"]))
        ins.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, m, n]))
    else:
        nodes[-1].output[0] = "y"
    g = helper.make_graph(nodes, "linear", ins, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    return model, w, b


def reference(x, w, b, r, epilogue, half):
    from math import erf as erf1, sqrt
    erf = np.vectorize(erf1, otypes=[np.float64])
    q = (lambda a: a.astype(np.float16).astype(np.float64)) if half else (lambda a: a.astype(np.float64))
    y = q(x) @ q(w) + q(b)
    if epilogue == "gelu":
        y = 0.5 * y * (1 + erf(y / sqrt(2)))
    elif epilogue == "residual":
        y = y + q(r)
    return y


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help=f"M,K,N[,none|gelu|residual];... (default {SHAPES})")
    ap.add_argument("--config", action="append", help="PRECISION[:KEY=VALUE,...] (repeatable; default fp32, fp16)")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds over the configs (round-robin)")
    ap.add_argument("--torch", action="store_true", help="also time PyTorch CUDA (cuBLAS, TF32 off) at each shape")
    ap.add_argument("--json", help="write the rows as JSON")
    a = ap.parse_args(argv)
    from minirt import MinirtError, Session
    configs = a.config or ["fp32", "fp16"]
    rows, device = [], None
    print(f"{'shape MxKxN':<18} {'epilogue':<9} {'config':<36} {'kernel':<36} {'GPU us':>8} {'min us':>8} {'TFLOP/s':>8} "
          f"{'err/max':>9}")
    cases = {}   # (shape, config) -> dict; every session is built first so the rounds go over all of them
    for spec in a.shapes.split(";"):
        parts = spec.split(",")
        m, k, n = (int(v) for v in parts[:3])
        epi = parts[3] if len(parts) > 3 else "none"
        rng = np.random.default_rng(1)
        feeds = {"x": rng.standard_normal((1, m, k)).astype(np.float32)}
        if epi == "residual":
            feeds["r"] = rng.standard_normal((1, m, n)).astype(np.float32)
        for cfg in configs:
            opts = parse_config(cfg)
            model, w, b = linear_model(m, k, n, epi, weights=opts.pop("weights", "float"))
            try:
                s = Session(model, storage="buffer", profile=True, options=opts)
            except MinirtError as e:
                print(f"{m}x{k}x{n:<12} {epi:<9} {cfg:<36} refused: {e}")
                continue
            cases[spec, cfg] = {"m": m, "k": k, "n": n, "epi": epi, "w": w, "b": b, "feeds": feeds, "s": s}
    # round-robin over shapes as well as configs
    # the GEMM and, after a K split, its reduce pass (not the casts of the float32 graph edges)
    timed = round_robin({key: (c["s"], c["feeds"], lambda r, f=2 * c["m"] * c["n"] * c["k"]:
                               r.flops >= f or r.kernel.startswith("linear_reduce"))
                         for key, c in cases.items()}, a.rounds, a.runs)
    refs = {}    # one reference per shape, precision and weights (the erf of a large GELU output takes a while)
    for (spec, cfg), c in cases.items():
        device = c["s"].device.profile.name
        # linear_cm2's tile (a specialization constant, not in the kernel's name)
        tile = next((d.info["tile"] for d in c["s"].plan.dispatches if d.kernel.startswith("linear_cm2")), "")
        c["s"].close()
        m, k, n, epi, feeds = c["m"], c["k"], c["n"], c["epi"], c["feeds"]
        t = timed[spec, cfg]
        ms = statistics.median(t["ms"])
        opts = parse_config(cfg)
        key = (spec, opts["precision"], opts.get("weights", "float"))
        if key not in refs:
            refs[key] = reference(feeds["x"][0], c["w"], c["b"], feeds.get("r", [None])[0], epi,
                                  opts["precision"] == "fp16")
        ref = refs[key]
        err = float(np.abs(t["out"][0][0] - ref).max() / np.abs(ref).max())
        tf = 2 * m * n * k / (ms * 1e-3) / 1e12 if ms else float("nan")
        kernels = f"{t['kernels']} {tile}".strip()
        rows.append({"m": m, "k": k, "n": n, "epilogue": epi, "config": cfg, "kernel": kernels,
                     "gpu_us": ms * 1e3, "min_us": min(t["ms"]) * 1e3, "tflops": tf, "rel_err": err})
        print(f"{f'{m}x{k}x{n}':<18} {epi:<9} {cfg:<36} {kernels[:36]:<36} {ms * 1e3:>8.1f} "
              f"{rows[-1]['min_us']:>8.1f} {tf:>8.2f} {err:>9.2e}")
    if a.torch:
        torch_rows = []
        for prec in dict.fromkeys(parse_config(c)["precision"] for c in configs):
            for spec in a.shapes.split(";"):
                parts = spec.split(",")
                m, k, n = (int(v) for v in parts[:3])
                epi = parts[3] if len(parts) > 3 else "none"
                fns = torch_case(m, k, n, epi, prec)
                if fns is None:
                    print("torch with CUDA not available: no PyTorch rows", file=sys.stderr)
                    break
                for name, fn in fns.items():
                    us = torch_time(fn, a.rounds, a.runs)
                    rows.append({"m": m, "k": k, "n": n, "epilogue": epi if name == "linear" else "none",
                                 "config": f"torch {prec} {'F.linear' if name == 'linear' else 'x @ w (no epilogue)'}",
                                 "gpu_us": us, "tflops": 2 * m * n * k / (us * 1e-6) / 1e12})
                    torch_rows.append((rows[-1], fn))
        for row, fn in torch_rows:   # the kernel names last: the profiler slows what runs after it
            row["kernel"] = "+".join(cuda_kernels(fn))
            shape = f"{row['m']}x{row['k']}x{row['n']}"
            print(f"{shape:<18} {row['epilogue']:<9} {row['config']:<36} {row['kernel'][:36]:<36} "
                  f"{row['gpu_us']:>8.1f} "
                  f"{'':>8} {row['tflops']:>8.2f}")
            print(f"{'':<18} kernels: {row['kernel']}")
    print(f"device: {device}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
