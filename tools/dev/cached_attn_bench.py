#!/usr/bin/env python3
"""The decoder's cross-attention (CachedAttention over every key: glsl/cached_attention.comp, or
cached_attention_rows.comp where query rows read one K/V row) under several Session option sets, side by side: GPU
time of its dispatches (the attention and, with key splits, the combine pass) from the timestamp query pool, the sets
measured in turns so a slow stretch of the GPU falls on all of them alike; the outputs of every set against the
first's.

  python tools/dev/cached_attn_bench.py                                  # large-v3-turbo's shapes, fp16 and fp32
  python tools/dev/cached_attn_bench.py --precision fp16 --cases beams5 "" "attention_rows=1" "attention_rows=4"

Cases (NAME: query batch rows x query rows a batch row over K/V rows):
  beams5    5 rows over one K/V row (a beam-search step of the one-sequence program: cross_k [1, 1500, D])
  beamrows8 8 rows, the items map sending all to item 0 (BeamRows: beams past the one-sequence cache)
  batch16   16 rows, each its own item (a greedy batch: nothing to group; the grouping's cost where it finds nothing)
  mixed16   16 rows, 4 items of 4 consecutive rows each
  prompt8   1 batch row of 8 query rows (a prompt over one encoder output)
  prompt232 1 batch row of 232 query rows (a prompt with the previous window's text)
An option set is KEY=VALUE[,KEY=VALUE...] ("" for the defaults)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ can shadow an installed module

CASES = {"beams5": (5, 1, None), "beamrows8": (8, 1, [0] * 8), "batch16": (16, 1, list(range(16))),
         "mixed16": (16, 1, [i // 4 for i in range(16)]), "prompt8": (1, 8, None),
         "prompt232": (1, 232, None)}


def graphs(B, Tq, items, heads, dh, keys):
    from minirt.graph import Graph, Node, Tensor
    d, bk = heads * dh, max(items) + 1 if items else 1

    def graph(name, inputs, outputs, state, nodes, params=()):
        g = Graph(name=name, source=name)
        for n, shape in inputs:
            g.inputs.append(n)
            g.add_tensor(Tensor(n, shape, "float32"))
        for n, new in state.items():
            g.add_tensor(Tensor(n, (bk, keys, d), "float32"))
            g.state[n] = new
        g.params = list(params)
        for op, ins, outs, attrs in nodes:
            g.nodes.append(Node(op, outs[0], ins, outs, attrs, "minirt" if op == "CachedAttention" else ""))
            g.tensors.setdefault(outs[0], Tensor(outs[0]))
        g.outputs = list(outputs)
        return g
    attrs = {"heads": heads, "scale": dh ** -0.5, **({"items": "item.0"} if items else {})}
    attend = graph("attend", [("q", (B, Tq, d))], ["y"], {"kv": "kv"},
                   [("CachedAttention", ["q", "kv", "kv"], ["y"], attrs)],
                   [f"item.{b}" for b in range(B)] if items else ())
    fill = graph("fill", [("c", (bk, keys, d))], (), {"kv": "kv@new"}, [("Identity", ["c"], ["kv@new"], {})])
    return attend, fill, bk


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="*", default=["", "attention_rows=1"],
                    help='option sets (default: "" "attention_rows=1", the grouping on and off)')
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--precision", default="fp16,fp32", help="fp16 and/or fp32, comma-separated")
    ap.add_argument("--heads", type=int, default=20, help="decoder heads (default 20: large-v3(-turbo))")
    ap.add_argument("--dh", type=int, default=64, help="head dim (default 64)")
    ap.add_argument("--keys", type=int, default=1500, help="encoder positions (default 1500)")
    ap.add_argument("--runs", type=int, default=20, help="timed runs per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stats", action="store_true", help="also the driver's statistics of each attention pipeline "
                    "(registers, shared memory: VK_KHR_pipeline_executable_properties, NVIDIA)")
    a = ap.parse_args(argv)
    if a.stats:
        import os
        os.environ["MINIRT_PIPELINE_STATS"] = "1"   # before the device is created
    from benchconfig import parse_config

    from minirt.infer import prepare
    from minirt.planner import make_plan
    from minirt.program import Program
    from minirt.session import get_device
    dev = get_device()
    print(f"device: {dev.profile.name}; {a.heads} heads x {a.dh}, {a.keys} keys")
    print(f"{'case':<10} {'prec':<5} {'config':<22} {'kernels':<54} {'median us':>9} {'min us':>8} {'K/V GB/s':>8} "
          f"{'max |diff|':>10}")
    rng = np.random.default_rng(0)
    for case in a.cases.split(","):
        B, Tq, items = CASES[case]
        for prec in a.precision.split(","):
            attend, fill, bk = graphs(B, Tq, items, a.heads, a.dh, a.keys)
            plans = {f"c{i}": make_plan(prepare(attend), dev.profile, "buffer", parse_config(f"{prec}:{c}"))
                     for i, c in enumerate(a.configs)}
            plans["fill"] = make_plan(prepare(fill), dev.profile, "buffer", {"precision": prec})
            d = a.heads * a.dh
            q = rng.standard_normal((B, Tq, d), np.float32)
            params = {f"item.{b}": items[b] for b in range(B)} if items else {}
            times, outs, kernels = {k: [] for k in plans if k != "fill"}, {}, {}
            with Program(plans, profile=True) as prog:
                prog.run("fill", {"c": rng.standard_normal((bk, a.keys, d), np.float32)})
                for _ in range(a.rounds):
                    for e in times:
                        for i in range(3 + a.runs):       # 3 untimed
                            outs[e] = prog.run(e, {"q": q}, params)["y"]
                            rows = [r for r in prog.dispatch_times(e) if "attention" in r[1]]
                            if i >= 3:
                                times[e].append(sum(t for _, _, t in rows))
                            kernels[e] = "+".join(r[1] for r in rows)
                if a.stats:
                    for e in times:
                        ex = prog.executors[e]
                        for (name, _, local, spec), pipe in ex.kernels.pipelines.items():
                            if name.startswith("cached_attention"):
                                st = ex.kernels.statistics(pipe)
                                print(f"  {case} {prec} {e} {name} spec {list(spec)}: "
                                      + ", ".join(f"{k} {v}" for k, v in st.items()))
            # the unique K/V bytes a run reads (each K/V row in use once: the floor grouping aims at)
            elem = 2 if prec == "fp16" else 4
            kv_bytes = 2 * len(set(items or [0])) * a.keys * d * elem
            for i, c in enumerate(a.configs):
                e = f"c{i}"
                med, mn = statistics.median(times[e]), min(times[e])
                diff = float(np.abs(outs[e] - outs["c0"]).max())
                print(f"{case:<10} {prec:<5} {c or 'defaults':<22} {kernels[e][:54]:<54} {med:9.1f} {mn:8.1f} "
                      f"{kv_bytes / med / 1e3:8.0f} {diff:10.2e}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
