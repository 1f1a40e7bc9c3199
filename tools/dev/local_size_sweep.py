#!/usr/bin/env python3
"""Sweep local work-group sizes for a model or one GEMM and print, per size: distinct outputs over N
runs, max deviation from a float64 reference, and GPU time. The table ExecuTorch's Adreno study was
built from, for any device.

Examples:
  python tools/dev/local_size_sweep.py --gemm 1500,384,384 --runs 20
  python tools/dev/local_size_sweep.py models/whisper-tiny-encoder.onnx --family gemm --sizes 8x8,16x4,4x16,64x1
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the checkout's minirt, installed or not

DEFAULT_SIZES = "8x8x1,4x16x1,16x4x1,32x2x1,64x1x1,2x32x1,1x64x1,16x16x1"


def gemm_model(m, k, n, seed=0):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = (0.1 * rng.standard_normal(n)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="ONNX model (or use --gemm)")
    ap.add_argument("--input", help=".npy input (default: seeded random of the input's shape)")
    ap.add_argument("--gemm", metavar="M,K,N", help="sweep one MatMul+bias of this shape instead of a model")
    ap.add_argument("--sizes", default=DEFAULT_SIZES, help=f"local sizes to try (default {DEFAULT_SIZES})")
    ap.add_argument("--family", default="gemm", help="which kernel family the forced size applies to "
                                                     "(gemm, im2col, elementwise, conv, copy, attention, all)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--storage", default="auto", choices=["auto", "buffer", "texture"])
    ap.add_argument("--json", help="write the table as JSON")
    a = ap.parse_args(argv)
    from minirt import MinirtError, Session
    from minirt.kernels.local_size import FORCEABLE
    from minirt.graph_reference import run_graph
    from minirt.loaders import load
    from minirt.options import parse_local_size
    if a.gemm:
        m, k, n = (int(v) for v in a.gemm.split(","))
        model, label = gemm_model(m, k, n), f"MatMul+bias {m}x{k}x{n}"
    elif a.model:
        model, label = a.model, a.model
    else:
        ap.error("give a model or --gemm M,K,N")
    families = FORCEABLE if a.family == "all" else (a.family,)
    g = load(model)
    info = g.tensor(g.inputs[0])
    x = (np.load(a.input).astype(np.float32) if a.input else
         np.random.default_rng(1).standard_normal([d if isinstance(d, int) else 1 for d in info.shape]).astype(np.float32))
    ref = run_graph(g, {g.inputs[0]: x})[g.outputs[0]]
    scale = float(np.abs(ref).max()) or 1.0
    rows = []
    print(f"{label}; {a.runs} runs per size; forced sizes apply to: {', '.join(families)}")
    print(f"{'local size':<12} {'distinct':>8} {'max |dev|':>11} {'dev/max|ref|':>12} {'GPU ms':>9} {'wall ms':>9}")
    for spec in a.sizes.split(","):
        size = parse_local_size(spec)
        try:
            with Session(model, storage=a.storage, profile=True,
                         options={"local_size": size, "local_size_families": families}) as s:
                outs, gpu, wall = [], [], []
                for _ in range(a.runs):
                    import time
                    t0 = time.perf_counter()
                    outs.append(s.run(x))
                    wall.append((time.perf_counter() - t0) * 1e3)
                    recs = s.profile_records()
                    gpu.append(sum(r.gpu_ms or 0 for r in recs))
                device = s.device.profile.name
        except MinirtError as e:
            print(f"{'x'.join(map(str, size)):<12} refused: {e}")
            continue
        distinct = len({hashlib.sha256(o.tobytes()).hexdigest() for o in outs})
        dev = max(float(np.abs(o - ref).max()) for o in outs)
        row = {"local_size": size, "distinct": distinct, "max_dev": dev, "rel_dev": dev / scale,
               "gpu_ms": statistics.median(gpu), "wall_ms": statistics.median(wall)}
        rows.append(row)
        print(f"{'x'.join(map(str, size)):<12} {distinct:>8} {dev:>11.3g} {dev / scale:>12.3g} "
              f"{row['gpu_ms']:>9.3f} {row['wall_ms']:>9.3f}")
    print(f"device: {device if rows else '?'}")
    if a.json:
        import json
        Path(a.json).write_text(json.dumps({"what": label, "device": device if rows else None, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
