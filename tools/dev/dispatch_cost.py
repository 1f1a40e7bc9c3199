#!/usr/bin/env python3
"""What one more dependent dispatch costs a run: the GPU span (Session(profile="span"): two stamps around the run) of
chains of N tiny dispatches, each reading what the one before wrote (Add of a [1, 256] tensor to itself, then a
Softmax over it, N times), so the executor puts a barrier between every two. The span over the dispatch count is the
price of a dispatch that does almost nothing: its launch, the barrier before it and the drain of the one before, the
floor under every dispatch a fusion removes.

  python tools/dev/dispatch_cost.py --chains 8,32,64 --runs 50
  python tools/dev/dispatch_cost.py --torch      # beside the same chain in PyTorch CUDA, captured in one CUDA graph

--torch: x -> softmax(x + x) N times in PyTorch on the GPU, captured into one CUDA graph (one stream: each kernel waits
for the one before, as the dispatches wait at their barriers), timed by CUDA events around a replay; the time over
the kernel count is what CUDA's stream order costs where Vulkan's barrier does."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))   # the checkout's minirt, installed or not
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ can shadow an installed module


def chain_model(n: int, width: int):
    """ONNX model: x -> (Add(x, x) -> Softmax) n times, all [1, width]."""
    from onnx import TensorProto, helper
    nodes, prev = [], "x"
    for i in range(n):
        nodes.append(helper.make_node("Add", [prev, prev], [f"t{i}"]))
        nodes.append(helper.make_node("Softmax", [f"t{i}"], [f"s{i}"], axis=-1))
        prev = f"s{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, width])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", default="8,32,64", help="comma-separated N (Add + Softmax pairs)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--runs", type=int, default=50, help="timed runs per chain (after 20 untimed)")
    ap.add_argument("--torch", action="store_true", help="also time the chain in PyTorch CUDA (one CUDA graph)")
    a = ap.parse_args(argv)
    import numpy as np

    from minirt import Session
    x = np.random.default_rng(0).standard_normal((1, a.width)).astype(np.float32)
    print(f"{'pairs':>6} {'dispatches':>11} {'GPU span us':>12} {'us a dispatch':>14}")
    for n in (int(v) for v in a.chains.split(",")):
        with Session(chain_model(n, a.width), profile="span") as s:
            count = len(s.plan.dispatches)
            for _ in range(20):
                s.run(x)
            spans = []
            for _ in range(a.runs):
                s.run(x)
                spans.append(s.gpu_span_ms() * 1e3)
        span = statistics.median(spans)
        print(f"{n:6d} {count:11d} {span:12.1f} {span / count:14.2f}", flush=True)
    if a.torch:
        print(f"{'pairs':>6} {'CUDA kernels':>13} {'graph us':>10} {'us a kernel':>12}  (PyTorch, one CUDA graph)")
        timed = []
        for n in (int(v) for v in a.chains.split(",")):
            t = torch_chain(n, a.width, a.runs)
            if t is None:
                print("torch with CUDA not available", file=sys.stderr)
                break
            timed.append((n, *t))
        from benchconfig import cuda_kernels
        for n, us, chain in timed:   # kernels counted after all timing
            kernels = len(cuda_kernels(chain))
            print(f"{n:6d} {kernels:13d} {us:10.1f} {us / kernels:12.2f}", flush=True)
    return 0


def torch_chain(n: int, width: int, runs: int):
    """(GPU us per replay of the chain as one CUDA graph, the chain as a callable), or None without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from benchconfig import torch_time
    x = torch.randn(1, width, device="cuda")

    def chain():
        y = x
        for _ in range(n):
            y = torch.softmax(y + y, dim=-1)
        return y
    return torch_time(chain, 1, runs, reps=1), chain


if __name__ == "__main__":
    sys.exit(main())
