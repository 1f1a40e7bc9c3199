#!/usr/bin/env python3
"""The conv routing and correctness matrix: for each 1-D conv case, the kernel(s) dispatched, whether
the conv1d -> conv2d rewrite fired, and cosine / max abs diff against onnxruntime, as a Markdown table (the cases:
tests/test_conv_routing.py, which runs them at a short length).

  python tools/dev/conv_matrix.py [--length 3000] [--storage buffer,texture]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # the checkout's minirt; the matrix of tests/test_conv_routing.py


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=3000)
    ap.add_argument("--storage", default="buffer,texture")
    a = ap.parse_args()
    from test_conv_routing import run_matrix
    rows = run_matrix(a.length, tuple(a.storage.split(",")))
    print(f"| case (L={a.length}) | storage | rewritten | route | kernels | cosine | max abs diff (max abs ref) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for r in rows:
        good = r["route"] == r["expected"] and r["cosine"] >= 0.99999 and r["max_abs_diff"] <= 1e-3 * r["max_ref"]
        ok &= good
        print(f"| {r['case']} | {r['storage']} | {'yes' if r['rewritten'] else 'no'} | {r['route']} | "
              f"{', '.join(r['kernels'])} | {r['cosine']:.8f} | {r['max_abs_diff']:.2e} ({r['max_ref']:.2f}) |"
              + ("" if good else " MISMATCH"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
