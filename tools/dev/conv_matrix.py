#!/usr/bin/env python3
"""The conv routing and correctness matrix: for each 1-D conv case, the kernel(s) dispatched, whether
the conv1d -> conv2d rewrite fired, and cosine / max abs diff against onnxruntime.

  python tools/conv_matrix.py [--length 3000] [--storage buffer,texture] [--markdown]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path[0] = str(Path(__file__).resolve().parents[1])   # not tools/: tools/profile.py shadows the stdlib

# (label, C_in, C_out, kernel, attrs, expected route)
CASES = [
    ("80->384 k3", 80, 384, 3, dict(pads=[1, 1]), "im2col"),
    ("384->384 k3 s2", 384, 384, 3, dict(pads=[1, 1], strides=[2]), "im2col"),
    ("128->256 k5 p0", 128, 256, 5, dict(pads=[0, 0]), "im2col"),
    ("64->64 k3", 64, 64, 3, dict(pads=[1, 1]), "direct"),
    ("256->256 k1", 256, 256, 1, dict(), "pointwise"),
    ("256->256 k3 depthwise", 256, 256, 3, dict(pads=[1, 1], group=256), "depthwise"),
    ("128->256 k3 dilation 2", 128, 256, 3, dict(pads=[2, 2], dilations=[2]), "direct"),
    ("256->256 k3 groups 4", 256, 256, 3, dict(pads=[1, 1], group=4), "direct"),
]
KERNEL_OF = {"im2col": ("im2col", "gemm"), "pointwise": ("gemm",), "depthwise": ("conv_dw",), "direct": ("conv",)}


def case_model(cin, cout, k, attrs, length, seed=0):
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    g = attrs.get("group", 1)
    w = (rng.standard_normal((cout, cin // g, k)) / np.sqrt(cin // g * k)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", **attrs)], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def run_matrix(length=3000, storages=("buffer", "texture"), seed=0):
    import onnxruntime as ort
    from minirt import Session
    rows = []
    for label, cin, cout, k, attrs, expect in CASES:
        m = case_model(cin, cout, k, attrs, length, seed)
        x = np.random.default_rng(seed + 1).standard_normal((1, cin, length)).astype(np.float32)
        ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        for st in storages:
            with Session(m, storage=st, options={"poison": True}) as s:
                y = s.run(x)
                plan = s.plan
            notes = " ".join(plan.notes.get("conv", []))
            kernels = sorted({d.kernel for d in plan.dispatches if d.node == "conv"})
            route = next((r for r in KERNEL_OF if f"route: {r}" in notes), "?")
            a, b_ = y.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
            rows.append(dict(case=label, storage=st, route=route, expected=expect, kernels=kernels,
                             rewritten="conv1d rewrite: yes" in notes,
                             cosine=float(a @ b_ / np.linalg.norm(a) / np.linalg.norm(b_)),
                             max_abs_diff=float(np.abs(y - ref).max()), max_ref=float(np.abs(ref).max())))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--length", type=int, default=3000)
    ap.add_argument("--storage", default="buffer,texture")
    a = ap.parse_args()
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
