#!/usr/bin/env python3
"""A one-off experiment (docs/benchmarks.md, fifteenth session): what does each of the Whisper-tiny fp32 encoder's GEMM
dispatches cost the run, measured without a timestamp between dispatches? Each GEMM dispatch in turn is recorded twice
in a row (the copy rewrites the same output from the same inputs: a barrier, then the same work again), and the run's
GPU span (two stamps, profile="span") is compared with the plan as shipped; the difference is what one more such
dispatch costs, barrier included, with nothing else in between. Sessions alternate (plain, one duplicated, plain, ...)
so a slow stretch of the shared GPU hits both sides. Then, with a stamp after every dispatch, the same plan for other
inputs and weights, to see whether layer 0's extra time follows the data.

  python docs/experiments/marginal_cost.py       # from the repository root, on the device to measure
  SMALL=1 RUNS=2 python docs/experiments/marginal_cost.py   # a small encoder: a quick check of the script"""
import json
import os
import statistics

import numpy as np
from planedit import dispatch_medians, edited_plans, span_median

import whisper_encoder as we

RUNS = int(os.environ.get("RUNS", "40"))


def twice(i):
    return lambda ds: ds[:i + 1] + [ds[i]] + ds[i + 1:]


def role(node):
    for key, name in (("q_proj", "QKV"), ("out_proj", "out-proj"), ("fc1", "fc1"), ("fc2", "fc2"),
                      ("conv1", "conv1"), ("conv2", "conv2")):
        if key in node:
            return name
    return None


KW = dict(layers=2, d_model=64, heads=1, n_frames=200) if os.environ.get("SMALL") else {}
model = we.build_whisper_encoder("tiny", opset=17, seed=0, **KW)
x = we.sample_input(seed=1, n_frames=KW.get("n_frames", 3000))
_, names = dispatch_medians(model, x, runs=RUNS)
gemms = [i for i, (k, n) in enumerate(names) if k.startswith("linear_t") and role(n)]
out = {"gemms": {}, "base": []}
flops = {"QKV": 2 * 1500 * 384 * 1152, "out-proj": 2 * 1500 * 384 * 384, "fc1": 2 * 1500 * 384 * 1536,
         "fc2": 2 * 1500 * 1536 * 384, "conv1": 2 * 3000 * 240 * 384, "conv2": 2 * 1500 * 1152 * 384}
for rnd in range(2):
    for i in gemms:
        b = span_median(model, x, runs=RUNS)
        with edited_plans(twice(i)):
            d = span_median(model, x, runs=RUNS)
        out["base"].append(b)
        out["gemms"].setdefault(str(i), []).append(d - b)
print(f"span as shipped: {statistics.median(out['base']):.1f} us (median of {len(out['base'])} Sessions, "
      f"{min(out['base']):.1f}-{max(out['base']):.1f})")
print(f"{'dispatch':<44} {'marginal us (2 rounds)':>24} {'TFLOP/s':>9}")
for i in gemms:
    k, n = names[i]
    m = out["gemms"][str(i)]
    r = role(n)
    layer = n.split("/")[1] if n.startswith("/layers.") else "front"
    print(f"{i:3d} {r:<9} {layer:<10} {k:<20} {m[0]:8.1f} {m[1]:8.1f} {flops[r] / statistics.median(m) / 1e6:9.1f}")

print("\nlayer 0's out-projection recorded twice, a stamp after every dispatch (us):")
i0 = next(i for i in gemms if role(names[i][1]) == "out-proj")
with edited_plans(twice(i0)):
    t, nm = dispatch_medians(model, x, runs=RUNS)
print(" ".join(f"{nm[j][0][:14]}={t[j]:.1f}" for j in range(i0 - 2, i0 + 4)))

print("\nper-layer times (us, stamp after every dispatch) for other inputs and weights:")
cases = [("sample seed 1, weights seed 0", model, x),
         ("zeros input", model, np.zeros_like(x)),
         ("sample seed 7", model, we.sample_input(seed=7, n_frames=KW.get("n_frames", 3000))),
         ("weights seed 3", we.build_whisper_encoder("tiny", opset=17, seed=3, **KW), x),
         ("sample seed 1, weights seed 0 (again)", model, x)]
for label, m, xi in cases:
    t, nm = dispatch_medians(m, xi, runs=RUNS)
    rows = {}
    for j, (k, n) in enumerate(nm):
        if n.startswith("/layers."):
            key = (role(n) or k.split("_")[0] + ("_c" if "combine" in k else "")) + ("+ln" if "reduce" in k else "")
            rows.setdefault(key, []).append(t[j])
    print(f"  {label}: total {sum(t):.1f}")
    for key, v in rows.items():
        print(f"    {key:<14} " + " / ".join(f"{a:.1f}" for a in v))
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), "marginal_cost.json"), "w"), indent=1)
