#!/usr/bin/env python3
"""A one-off experiment (docs/benchmarks.md, fifteenth session): linear.comp's B_DIRECT (B read from the weight buffer
through L1 instead of staged in shared memory) on every fp32 GEMM of the Whisper-tiny encoder. Checks that the output
is bit-identical to the plan as shipped, then times both, Sessions in turns, a stamp after every dispatch. The kernel
change is not in the tree (it was slower): apply it first.

  git apply docs/experiments/b-direct.patch && python tools/build_shaders.py
  python docs/experiments/b_direct.py       # from the repository root, on the device to measure
  SMALL=1 python docs/experiments/b_direct.py   # a small encoder: the bit check alone, quick on lavapipe"""
import dataclasses
import os
import statistics
import sys

import numpy as np
from planedit import dispatch_medians, edited_plans

import whisper_encoder as we
from minirt import Session

PATCHED = {"n": 0}


def b_direct(ds):
    out = []
    for d in ds:
        if d.kernel.startswith("linear_t") and not d.kernel.endswith(("_half", "_half_out32")):
            spec = tuple(d.spec) + (0,) * (5 - len(d.spec))   # ids 3-7, then B_DIRECT (id 8)
            d = dataclasses.replace(d, spec=spec + (1,))
        out.append(d)
    PATCHED["n"] = sum(len(d.spec) == 6 for d in out)
    return out


SMALL = bool(os.environ.get("SMALL"))
KW = dict(layers=2, d_model=64, heads=1, n_frames=200) if SMALL else {}
model = we.build_whisper_encoder("tiny", opset=17, seed=0, **KW)
x = we.sample_input(seed=1, n_frames=KW.get("n_frames", 3000))
outs = {}
for mode in (False, True):
    with edited_plans(b_direct if mode else None), Session(model, options={"poison": True}) as s:
        outs[mode] = s.run(x).copy()
same = np.array_equal(outs[False].view(np.uint32), outs[True].view(np.uint32))
print(f"{PATCHED['n']} GEMM dispatches with B_DIRECT; output bit-identical to staged B: {same} "
      f"(max diff {np.max(np.abs(outs[False] - outs[True])):.3g}, finite {np.isfinite(outs[True]).all()})")
if SMALL:
    sys.exit(0 if same else 1)
res = {False: [], True: []}
for rnd in range(3):
    for mode in (False, True):
        with edited_plans(b_direct if mode else None):
            t, names = dispatch_medians(model, x, runs=20)
        res[mode].append(t)
for k, (kern, node) in enumerate(names):
    if kern.startswith("linear_t"):
        a = statistics.median(r[k] for r in res[False])
        b = statistics.median(r[k] for r in res[True])
        print(f"{kern:<16} {node[-38:]:<38} staged {a:6.1f}  direct {b:6.1f}  ({b / a:.3f})")
print("totals staged", [round(sum(r), 1) for r in res[False]], "direct", [round(sum(r), 1) for r in res[True]])
