#!/usr/bin/env python3
"""Run an ONNX model in minirt (each storage) and in onnxruntime on the same seeded random input and
print cosine and max abs difference per output. Exit status 1 when any cosine is below --min-cosine.
Float inputs are standard normal; integer inputs uniform in [0, --int-high) (a text model's token ids: its
vocabulary size; an attention mask: 2), bool inputs random.

  python tools/compare_ort.py model.onnx [--shape NAME=1,80,3000] [--storage buffer,texture] [--int-high 1000]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the checkout's minirt, installed or not


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,..",
                    help="concrete shape for an input with symbolic dims (default: 1 for each)")
    ap.add_argument("--storage", default="buffer,texture")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-cosine", type=float, default=0.99999)
    ap.add_argument("--int-high", type=int, default=2, help="integer inputs are drawn from [0, this) (default 2)")
    a = ap.parse_args(argv)
    import onnxruntime as ort
    from minirt import Session
    from minirt.loaders import load
    g = load(a.model)
    given = {k: tuple(int(d) for d in v.split(",")) for k, v in (s.split("=", 1) for s in a.shape)}
    rng = np.random.default_rng(a.seed)
    feeds = {}
    for name in g.inputs:
        shape = given.get(name) or tuple(d if isinstance(d, int) else 1 for d in g.tensor(name).shape)
        dtype = np.dtype(g.tensor(name).dtype or "float32")
        if dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[name] = rng.integers(0, a.int_high, shape).astype(dtype)
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    refs = ort.InferenceSession(a.model, providers=["CPUExecutionProvider"]).run(None, feeds)
    worst = 1.0
    for st in a.storage.split(","):
        with Session(a.model, storage=st) as s:
            outs = s.run(None, feeds)
            dev = s.device.profile.name
        for name, y, r in zip(g.outputs, outs, refs):
            if not np.issubdtype(r.dtype, np.floating):     # computed on the host from integer inputs
                print(f"{Path(a.model).name} [{st}] {name} {list(y.shape)} {r.dtype}: "
                      f"{'equal' if np.array_equal(y, r) else 'DIFFERENT'}")
                worst = worst if np.array_equal(y, r) else 0.0
                continue
            y64, r64 = y.astype(np.float64).ravel(), r.astype(np.float64).ravel()
            cos = float(y64 @ r64 / (np.linalg.norm(y64) * np.linalg.norm(r64)))
            worst = min(worst, cos)
            print(f"{Path(a.model).name} [{st}, {dev}] {name} {list(y.shape)}: cosine {cos:.9f}, "
                  f"max abs diff {np.abs(y - r).max():.2e} (max abs ref {np.abs(r).max():.3g})")
    return 0 if worst >= a.min_cosine else 1


if __name__ == "__main__":
    sys.exit(main())
