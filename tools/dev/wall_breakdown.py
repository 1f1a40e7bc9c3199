#!/usr/bin/env python3
"""Where Session.run's wall time goes beyond the GPU's dispatches: the host copy of the input into staging,
submit + wait (which includes the GPU's input and output transfers and all dispatches), and the host copy of
the output out of the readback buffer. Buffer storage only; medians over --runs.

  python tools/dev/wall_breakdown.py --size tiny --precision fp16
  python tools/dev/wall_breakdown.py --size tiny --precision fp16 --batch 8     # the encoder with a symbolic batch
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "models")]   # the checkout's minirt, models/whisper_encoder.py


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--batch", type=int, default=1, help="a batch of distinct inputs (the encoder built with a "
                                                            "symbolic batch dim when above 1)")
    ap.add_argument("--torch", action="store_true", help="also PyTorch's parts: the input's copy from pinned memory, "
                                                         "the CUDA graph's replay alone, the output's copy back")
    a = ap.parse_args(argv)
    import whisper_encoder as we
    from minirt import Session
    model = we.build_whisper_encoder(a.size, opset=17, seed=0, dynamic_batch=a.batch > 1)
    x = np.concatenate([we.sample_input(seed=1 + i) for i in range(a.batch)])
    with Session(model, storage="buffer", precision=a.precision) as s:
        s.run(x)
        ex = s._last
        (name, (_, view, _t)), = ex.inputs.items()
        (oname, (_, oview, ot, _rng)), = ex.outputs.items()
        lib, vk = ex.vk.lib, ex.vk
        parts = {"input copy": [], "submit call": [], "wait": [], "output copy": [], "Session.run": []}
        for _ in range(a.runs):
            t0 = time.perf_counter()
            np.copyto(view, x.reshape(-1), casting="no")
            t1 = time.perf_counter()
            lib.vkQueueSubmit(s.device.queue, 1, ex._submit, ex.fence)
            t1b = time.perf_counter()
            while lib.vkGetFenceStatus(ex.d, ex.fence) == vk.VK_NOT_READY:
                pass
            lib.vkResetFences(ex.d, 1, ex._fences)
            t2 = time.perf_counter()
            y = oview.reshape(ot.shape).copy()
            t3 = time.perf_counter()
            s.run(x)
            t4 = time.perf_counter()
            for k, v in zip(parts, (t1 - t0, t1b - t1, t2 - t1b, t3 - t2, t4 - t3)):
                parts[k].append(v * 1e3)
        assert y.shape == ot.shape
        # the output copy, three ways: a fresh array each time (what run() does), into a reused array, and in
        # four threads into a reused array
        from concurrent.futures import ThreadPoolExecutor
        src, dst = oview.reshape(-1), np.empty(oview.size, np.float32)
        pool = ThreadPoolExecutor(4)
        chunks = np.array_split(np.arange(src.size), 4)
        bounds = [(c[0], c[-1] + 1) for c in chunks]
        for label, fn in (("fresh array", lambda: src.copy()), ("reused array", lambda: np.copyto(dst, src)),
                          ("4 threads", lambda: list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]),
                                                              bounds)))):
            ts = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            parts[f"out: {label}"] = ts
    print(f"Whisper-{a.size} {a.precision}, batch {a.batch}, buffer storage; input {x.nbytes / 1e6:.2f} MB, output {y.nbytes / 1e6:.2f} MB")
    for k, v in parts.items():
        print(f"  {k:<14} {statistics.median(v):8.3f} ms (min {min(v):.3f})")
    if a.torch:
        torch_parts(model, x, a)
    return 0


def torch_parts(model, x, a):
    """PyTorch's CUDA graph of the same encoder, part by part (CUDA events, medians): what bench.py's graph figure
    is made of."""
    sys.path.append(str(ROOT / "tools"))
    import torch
    from bench import torch_encoder, torch_graph
    enc = torch_encoder(model, a.precision)
    dt = torch.float16 if a.precision == "fp16" else torch.float32
    with torch.no_grad():
        graph, static_in, static_out, host_in = torch_graph(enc, x, dt)
        parts = {"torch: input copy (pinned)": lambda: static_in.copy_(host_in, non_blocking=True),
                 "torch: graph replay": graph.replay, "torch: output .cpu()": lambda: static_out.cpu()}
        for k, fn in parts.items():
            ts = []
            for _ in range(a.runs):
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                e0.record()
                fn()
                e1.record()
                torch.cuda.synchronize()
                ts.append(((time.perf_counter() - t0) * 1e3, e0.elapsed_time(e1)))
            print(f"  {k:<28} wall {statistics.median(t for t, _ in ts):8.3f} ms, "
                  f"CUDA events {statistics.median(g for _, g in ts):8.3f} ms")


if __name__ == "__main__":
    sys.exit(main())
