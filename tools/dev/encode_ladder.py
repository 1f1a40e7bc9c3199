#!/usr/bin/env python3
"""The batch encoder's entry points of fewer windows (bencodeK, minirt/whisper/vulkan.py plan_batch) on a seeded
random Whisper of real shapes: which the plan keeps, the memory they take beside bencode, and per window count n of a
batch: the GPU wall time of encode_batch through the smallest entry point that holds n windows against today's
full-size bencode (all max-items windows, the rest padding), and whether each row's logits after one batched step
are bit for bit the same both ways.

  python tools/dev/encode_ladder.py --size large-v3-turbo --precision fp16 --max-items 32 --windows 1,3,8,17,32
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the checkout's minirt, installed or not


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="large-v3-turbo")
    ap.add_argument("--precision", default="fp16", choices=("fp32", "fp16"))
    ap.add_argument("--max-items", type=int, default=32)
    ap.add_argument("--windows", default="1,3,8,17,32", help="window counts of the batches to time")
    ap.add_argument("--runs", type=int, default=5, help="timed encode_batch runs a way (median)")
    ap.add_argument("--plan-times", action="store_true",
                    help="first, the host time of planning each encoder entry point on its own (what the ladder adds "
                         "to a backend's start)")
    a = ap.parse_args(argv)
    from minirt.planner.memory_plan import arena, buffer_alignment
    from minirt.whisper import decoder_graph
    from minirt.whisper.synthetic import SIZES, random_checkpoint
    from minirt.whisper.vulkan import VulkanBackend
    w, cfg = random_checkpoint(SIZES[a.size], seed=0)
    if a.plan_times:
        from minirt.driver import get_device
        from minirt.whisper.vulkan import _plans
        dm = decoder_graph.dims_of(w, cfg)
        graphs = decoder_graph.batch_graphs(w, dm, a.max_items)
        for name in sorted((k for k in graphs if k.startswith("bencode")), key=lambda k: (len(k), k)):
            t = time.perf_counter()
            _plans({name: graphs[name]}, get_device().profile, {"precision": a.precision})
            print(f"  planning {name}: {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    vb = VulkanBackend(w, cfg, precision=a.precision, max_batch=1, max_items=a.max_items)
    made_s = time.perf_counter() - t
    with vb:
        profile = vb.program.device.profile
        chunk = vb.plans["bencode"].tensors["input_features"].shape[0]
        entries = [decoder_graph.encode_entry(k, chunk) for k in vb.encode_sizes]
        print(f"{a.size} {a.precision} on {profile.name}: max_items {vb.max_items}, bencode {chunk} windows; backend "
              f"made in {made_s:.1f} s")
        for line in vb.plans["bencode"].notes.get("batch", []):
            print(f"  note: {line}")
        align = buffer_alignment(profile)
        for e in entries:
            p = vb.plans[e]
            print(f"  {e:10s} arena {arena(p, align)[1] / 2**20:9.1f} MiB  input staging "
                  f"{p.tensors['input_features'].nbytes / 2**20:6.1f} MiB")
        print(f"  shared arenas: {[round(s.nbytes / 2**20, 1) for s in vb.program.arenas]} MiB")
        rng = np.random.default_rng(1)
        shape = (vb.max_items, vb.n_mels, vb.dims.frames)
        feats = rng.standard_normal(shape).astype(np.float32)
        print(f"{'windows':>7} {'entry':>10} {'ladder ms':>10} {'full ms':>8} {'ratio':>6}  logits")
        sizes = vb.encode_sizes
        for n in [int(x) for x in a.windows.split(",") if int(x) <= vb.max_items]:
            x = feats[:n]
            out, times = {}, {}
            for way, use in (("ladder", sizes), ("full", [chunk])):
                vb.encode_sizes = use
                ts = []
                for _ in range(a.runs):
                    t = time.perf_counter()
                    vb.encode_batch(x)
                    ts.append(time.perf_counter() - t)
                times[way] = statistics.median(ts) * 1e3
                vb.start_rows(range(n))
                out[way] = np.array(vb.step_rows(np.full(n, 50, np.int64)))
            vb.encode_sizes = sizes
            k = next(k for k in sizes if k >= min(n, chunk))
            same = np.array_equal(out["ladder"], out["full"])
            diff = "bit-identical" if same else f"DIFFER (max {np.abs(out['ladder'] - out['full']).max():.3g})"
            print(f"{n:7d} {decoder_graph.encode_entry(k, chunk):>10} {times['ladder']:10.2f} {times['full']:8.2f} "
                  f"{times['full'] / times['ladder']:5.2f}x  {diff}")


if __name__ == "__main__":
    main()
