#!/usr/bin/env python3
"""Attention kernel benchmark: one fused Attention (q, k, v [B, T, D] -> [B, T, D]) per shape under several
planner configurations, GPU time of its dispatches from the timestamp query pool (median and min).

  python tools/dev/attn_bench.py                                     # Whisper tiny and base self-attention
  python tools/dev/attn_bench.py --config fp32 --config fp32:attention_splits=4 --config fp16 \\
      --config "fp16:coopmat_tile=2x2x32"

A config is PRECISION[:KEY=VALUE,...] with Session options (attention_splits, attention_tile=THREADSxKGxRTxNK,
coopmat=0, coopmat_tile=NRxKSxBK).
Configs are measured round-robin (--rounds times) so a slow stretch of the GPU does not fall on one of them."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # the checkout's minirt; test_fuse_attention's model
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ can shadow an installed module

from benchconfig import parse_config, round_robin  # noqa: E402

SHAPES = "1,1500,1500,6,64;1,1500,1500,8,64"   # B,Tq,Tk,heads,head dim


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--config", action="append", help="PRECISION[:KEY=VALUE,...] (repeatable; default fp32, fp16)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from minirt import MinirtError, Session
    from test_fuse_attention import attention_model, feeds
    configs = a.config or ["fp32", "fp16"]
    rows, device = [], None
    print(f"{'B,Tq,Tk,H,dh':<20} {'config':<34} {'kernels':<40} {'median us':>9} {'min us':>8} {'TFLOP/s':>8}")
    for spec in a.shapes.split(";"):
        B, Tq, Tk, H, dh = (int(v) for v in spec.split(","))
        model, x = attention_model(B, Tq, Tk, H, dh), feeds(B, Tq, Tk, H * dh)
        flops = 4 * B * H * Tq * Tk * dh
        sessions = {}
        for cfg in configs:
            try:
                sessions[cfg] = Session(model, storage="buffer", profile=True, options=parse_config(cfg))
            except MinirtError as e:
                print(f"{spec:<20} {cfg:<34} refused: {e}")
        timed = round_robin({cfg: (s, x, lambda r: r.op == "Attention") for cfg, s in sessions.items()},
                            a.rounds, a.runs)
        for cfg, s in sessions.items():
            device = s.device.profile.name
            s.close()
            us = [t * 1e3 for t in timed[cfg]["ms"]]
            med, mn, kernels = statistics.median(us), min(us), timed[cfg]["kernels"]
            rows.append({"shape": spec, "config": cfg, "kernels": kernels, "median_us": med, "min_us": mn,
                         "tflops": flops / (med * 1e-6) / 1e12})
            print(f"{spec:<20} {cfg:<34} {kernels[:40]:<40} {med:>9.1f} {mn:>8.1f} {rows[-1]['tflops']:>8.2f}")
    print(f"device: {device}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
