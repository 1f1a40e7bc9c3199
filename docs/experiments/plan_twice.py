#!/usr/bin/env python3
"""A one-off experiment (docs/benchmarks.md, fourteenth session): is layer 0's extra time the start of a run, or layer
0's own? The Whisper-tiny fp32 plan is recorded twice into one command buffer (its dispatch list doubled after
planning; the second pass recomputes from buffers the first left, so its output is not checked: timing only), beside
the plan as shipped, two Sessions of each in turns. Prints each dispatch's median GPU us: once, and both passes of
twice.

  python docs/experiments/plan_twice.py       # from the repository root, on the device to measure"""
from planedit import dispatch_medians, edited_plans

import whisper_encoder as we

model, x = we.build_whisper_encoder("tiny", opset=17, seed=0), we.sample_input(seed=1)
res = {}
for mode in ("once", "twice", "once", "twice"):
    with edited_plans((lambda ds: ds + ds) if mode == "twice" else None):
        res.setdefault(mode, []).append(dispatch_medians(model, x, runs=30))
n = len(res["once"][0][0])
for k in range(n):
    kern, node = res["once"][0][1][k]
    a = [r[0][k] for r in res["once"]]
    b1 = [r[0][k] for r in res["twice"]]
    b2 = [r[0][k + n] for r in res["twice"]]
    print(f"{kern[:28]:<28} {node[-34:]:<34} once {a[0]:6.1f} {a[1]:6.1f} | twice pass 1 {b1[0]:6.1f} {b1[1]:6.1f} pass 2 {b2[0]:6.1f} {b2[1]:6.1f}")
for mode in ("once", "twice"):
    print(mode, [round(sum(r[0]), 1) for r in res[mode]])
