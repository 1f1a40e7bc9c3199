#!/usr/bin/env python3
"""GPU time of Whisper's GEMMs (tiny/base widths) per linear_cm tile at precision fp16, beside the fp32 linear.comp.

  python tools/dev/cm_bench.py [--runs 50] [--d 384] [--tiles m64n64k32s1,m64n128k32s1,r64n64] [--json out.json]

Each row is one GEMM dispatch (a Linear layer, or the GEMM of an im2col conv, with its epilogue): median GPU
microseconds over --runs (timestamp queries, minirt.Session(profile=True)) and TFLOP/s. "default" is the tile the
planner picks; "fp32" is linear.comp in fp32 for reference. Kernels this tree has not built are reported as such.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # the checkout's minirt; tests/oracle.py


def front_end_case(d, t=3000):
    from onnx import helper
    from oracle import make_model
    rng = np.random.default_rng(0)
    inits = {"w1": (rng.standard_normal((d, 80, 3)) / math.sqrt(240)).astype(np.float32),
             "b1": rng.standard_normal(d).astype(np.float32),
             "w2": (rng.standard_normal((d, d, 3)) / math.sqrt(3 * d)).astype(np.float32),
             "b2": rng.standard_normal(d).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]), helper.make_node("Gelu", ["c1"], ["g1"]),
             helper.make_node("Conv", ["g1", "w2", "b2"], ["c2"], pads=[1, 1], strides=[2]),
             helper.make_node("Gelu", ["c2"], ["y"])]
    return make_model(nodes, {"x": (1, 80, t)}, ["y"], inits, opset=20), \
        {"x": rng.standard_normal((1, 80, t)).astype(np.float32)}


def gemm_times(model, feeds, options, runs, warmup):
    """[(kernel, label, median gpu us, flops)] of the plan's GEMM dispatches."""
    from minirt import Session
    per = {}
    with Session(model, storage="buffer", options=options, profile=True) as s:
        for i in range(warmup + runs):
            s.run(None, feeds)
            if i >= warmup:
                for r in s.profile_records():
                    if r.kernel.startswith("linear"):
                        per.setdefault(r.index, (r, []))[1].append(r.gpu_ms)
    return [(r.kernel, r.node, statistics.median(ts) * 1e3, r.flops) for r, ts in per.values()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--d", type=int, default=384, help="model width (384 tiny, 512 base)")
    ap.add_argument("--tiles", default="default,m64n64k32s1,m64n128k32s1,r64n64,r32n64,fp32")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from minirt import MinirtError
    from minirt.session import get_device
    from oracle import linear_case
    dev = get_device().profile
    print(f"{dev.name}: cooperative matrices {dev.cooperative_matrix}, shapes {dev.coopmat_shapes}")
    d = a.d
    cases = [("qkv/out_proj", *linear_case(1500, d, d, False, False)),
             ("fc1 + gelu", *linear_case(1500, 4 * d, d, True, False)),
             ("fc2 + residual", *linear_case(1500, d, 4 * d, False, True)),
             ("conv front end", *front_end_case(d))]
    rows = []
    print(f"{'case':<16} {'variant':<11} {'kernel':<28} {'MMAC':>10} {'GPU us':>8} {'TFLOP/s':>8}")
    for label, model, feeds in cases:
        for tile in a.tiles.split(","):
            opts = {} if tile == "fp32" else {"precision": "fp16"}
            if tile not in ("default", "fp32"):
                opts["cm_tile"] = tile
            try:
                times = gemm_times(model, feeds, opts, a.runs, a.warmup)
            except MinirtError as e:
                print(f"{label:<16} {tile:<11} not run: {e}")
                continue
            for kernel, node, us, flops in times:
                rows.append(dict(case=label, variant=tile, kernel=kernel, node=node, gpu_us=us, flops=flops))
                print(f"{label:<16} {tile:<11} {kernel:<28} {flops / 2 / 1e6:>10.0f} {us:>8.1f} "
                      f"{flops / us / 1e6:>8.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
