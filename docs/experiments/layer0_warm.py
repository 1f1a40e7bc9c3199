#!/usr/bin/env python3
"""A one-off experiment (docs/benchmarks.md, fifteenth session): layer 0's out-projection runs 2-3 us slower than the
other layers' the first time in a pass, and at their speed when recorded a second time right after it. Is that its
own buffers being cold (weights, partials), its pipeline, or where in the pass it runs? Variants of the Whisper-tiny fp32 plan, a
stamp after every dispatch, medians of 40 runs; copies of a dispatch recompute the same output from the same inputs,
or (moved earlier) from the previous run's, so only times are read.

  python docs/experiments/layer0_warm.py       # from the repository root, on the device to measure (all variants)
  VARIANTS="as shipped;front end twice" python docs/experiments/layer0_warm.py   # some of them"""
import dataclasses
import os

from planedit import dispatch_medians, edited_plans

import whisper_encoder as we


def find(ds, kernel_prefix, node_part, nth=0):
    hits = [i for i, d in enumerate(ds) if d.kernel.startswith(kernel_prefix) and node_part in d.node]
    return hits[nth]


def insert(ds, at, d):
    return ds[:at] + [d] + ds[at:]


def times(model, x, f):
    with edited_plans(f):
        return dispatch_medians(model, x, runs=40)


def op0(ds):  # layer 0's out-projection GEMM
    return find(ds, "linear_t", "layers.0/self_attn/out_proj")


def at0(ds):
    return find(ds, "attention_split", "layers.0/")


VARIANTS = {
    "as shipped": None,
    "layer 0's attention twice": lambda ds: insert(ds, at0(ds) + 1, ds[at0(ds)]),
    "layer 3's attention twice": lambda ds: insert(ds, find(ds, "attention_split", "layers.3/") + 1,
                                                   ds[find(ds, "attention_split", "layers.3/")]),
    "a copy of layer 0's out-proj before layer 0's QKV": lambda ds: insert(ds, find(ds, "linear_t", "layers.0/self_attn/q_proj"), ds[op0(ds)]),
    "a copy of layer 1's out-proj before layer 0's out-proj": lambda ds: insert(ds, op0(ds), ds[find(ds, "linear_t", "layers.1/self_attn/out_proj")]),
    # another pipeline that writes the same partials buffer (conv2's split GEMM reads its conv input as overlapping
    # rows: A_WIN), then the same pipeline on other buffers and weights (layer 0's fc2, recorded early)
    "a copy of conv2's GEMM before layer 0's out-proj": lambda ds: insert(ds, op0(ds), ds[find(ds, "linear_t", "conv2")]),
    "a copy of layer 0's fc2 before layer 0's out-proj": lambda ds: insert(ds, op0(ds), ds[find(ds, "linear_t", "layers.0/fc2")]),
    # the same pipeline, weights and input, its output sent elsewhere (the attention's partials, dead by then)
    "a copy of layer 0's out-proj writing elsewhere, before it": lambda ds: insert(
        ds, op0(ds), dataclasses.replace(ds[op0(ds)], args=[("attention.partials", "w")] + list(ds[op0(ds)].args[1:]))),
    # warm-ups that run a pipeline's loop with little work, where no barrier holds them (before layer 0's QKV, which
    # neither reads nor writes what they touch): the attention over its first 64 keys only (Tk, the second int of
    # its push constants), the out-projection with no rows (M = 0: its loop runs on zeros, nothing is stored) in one
    # group a multiprocessor
    "warm-up: layer 0's attention over 64 keys, before layer 0's QKV": lambda ds: insert(
        ds, find(ds, "linear_t", "layers.0/self_attn/q_proj"),
        dataclasses.replace(ds[at0(ds)], push=ds[at0(ds)].push[:4] + (64).to_bytes(4, "little") + ds[at0(ds)].push[8:])),
    "warm-up: layer 0's out-proj with no rows, 132 groups, before layer 0's QKV": lambda ds: insert(
        ds, find(ds, "linear_t", "layers.0/self_attn/q_proj"),
        dataclasses.replace(ds[op0(ds)], push=(0).to_bytes(4, "little") + ds[op0(ds)].push[4:],
                            global_size=(ds[op0(ds)].local_size[0] * 6, ds[op0(ds)].local_size[1] * 22, 1))),
    "a copy of layer 1's attention before layer 0's": lambda ds: insert(ds, at0(ds), ds[find(ds, "attention_split", "layers.1/")]),
    "layer 0's combine twice": lambda ds: insert(ds, at0(ds) + 2, ds[at0(ds) + 1]),
    "front end twice": lambda ds: ds[:at0(ds) - 1] + ds[:at0(ds) - 1] + ds[at0(ds) - 1:],
}
model, x = we.build_whisper_encoder("tiny", opset=17, seed=0), we.sample_input(seed=1)
WATCH = (("attention_split", "Attention"), ("attention_combine", "Attention"), ("linear_t", "out_proj"),
         ("linear_reduce_ln", "out_proj"), ("linear_t", "q_proj"))
ONLY = [v for v in os.environ.get("VARIANTS", "").split(";") if v]   # labels to run (default: all)
for label, f in VARIANTS.items():
    if ONLY and label not in ONLY:
        continue
    t, nm = times(model, x, f)
    print(f"{label}: total {sum(t):.1f} us")
    for kp, part in WATCH:
        row = [(n.split("/")[1] if n.startswith("/layers.") else n, v) for (k, n), v in zip(nm, t)
               if k.startswith(kp) and part in n]
        print(f"   {kp + ' ' + part:<30} " + "  ".join(f"{ly}:{v:.1f}" for ly, v in row))
