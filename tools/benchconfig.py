"""What the benchmark tools share: the PRECISION[:KEY=VALUE,...] configurations and round-robin timing of
tools/dev/gemm_bench.py and tools/dev/attn_bench.py, and the PyTorch CUDA timing of the peers in gemm_bench, bench and
dispatch_cost (torch is imported only when they ask for it)."""
from __future__ import annotations

import re
import statistics
import time

_DIMS = re.compile(r"^\d+(x\d+)+$")


def timed(fn, runs, warmup=0):
    """(median, min) wall ms of fn() over `runs` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def parse_config(text: str, local_size_families=("gemm",)) -> dict:
    """Session options from "fp16:cm_tile=m64n64k32,local_size=16x8,coopmat=0": 0/false -> False, NxM.. -> a tuple of
    ints (local_size padded to 3 and applied to `local_size_families` only, or to those of a
    local_size_families=A+B option), digits -> int, else the string."""
    prec, _, rest = text.partition(":")
    opts = {"precision": prec}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if v in ("0", "false"):
            opts[k] = False
        elif _DIMS.match(v):
            opts[k] = tuple(int(a) for a in v.split("x"))
        else:
            opts[k] = int(v) if v.isdigit() else v
    if "local_size" in opts:
        size = opts["local_size"] if isinstance(opts["local_size"], tuple) else (int(opts["local_size"]),)
        fams = opts.get("local_size_families")     # e.g. local_size_families=im2col+gemm
        opts["local_size"] = (size + (1, 1))[:3]
        opts["local_size_families"] = tuple(fams.split("+")) if isinstance(fams, str) else tuple(local_size_families)
    return opts


def round_robin(cases, rounds, runs, warmup=2):
    """GPU times of every case, taken in turns: each round runs each case `warmup` + `runs` times, so a slow stretch of a
    shared GPU touches every case alike instead of ruining one. cases: {key: (session, feeds, keep)}, where
    keep(profile record) picks the dispatches timed. Returns {key: {"ms": [GPU ms per timed run], "kernels": "a+b",
    "out": the last run's outputs}}."""
    res = {key: {"ms": []} for key in cases}
    for _ in range(rounds):
        for key, (session, feeds, keep) in cases.items():
            for i in range(warmup + runs):
                out = session.run(None, feeds)
                recs = [r for r in session.profile_records() if keep(r)]
                if i >= warmup:
                    res[key]["ms"].append(sum(r.gpu_ms or 0 for r in recs))
            res[key]["kernels"], res[key]["out"] = "+".join(r.kernel for r in recs), out
    return res


def torch_case(m, k, n, epilogue, precision, seed=2):
    """PyTorch CUDA at one shape: {"linear": F.linear with the epilogue, "mm": the product alone} as callables, or None
    without torch or CUDA."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    dt = torch.float16 if precision == "fp16" else torch.float32
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=dt, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=dt, generator=g) / k ** 0.5
    wt = w.t().contiguous()
    b = torch.randn(n, device="cuda", dtype=dt, generator=g)
    r = torch.randn(m, n, device="cuda", dtype=dt, generator=g)

    def linear():
        y = F.linear(x, w, b)
        if epilogue == "gelu":
            y = F.gelu(y)
        elif epilogue == "residual":
            y = y + r
        return y
    return {"linear": linear, "mm": lambda: x @ wt}


def torch_time(fn, rounds, runs, reps=20):
    """GPU us per call of fn: REPS calls captured back to back into one CUDA graph, timed by CUDA events around each
    replay (median of rounds x runs replays)."""
    import torch
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        us = []
        for _ in range(rounds * runs + 2):
            t0.record()
            graph.replay()
            t1.record()
            t1.synchronize()
            us.append(t0.elapsed_time(t1) * 1e3 / reps)
    return statistics.median(us[2:])


def cuda_kernels(fn):
    """Names of the CUDA kernels one call of fn launches, from torch.profiler. Call it after all timing: once the
    profiler has run, later kernel launches in the process are slower (1-3 us a GEMM on the H200)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def commit() -> str:
    """The checkout's commit (short hash, "+changes" where the work tree differs from it); outside a git checkout (a
    copy of the tree) $MINIRT_COMMIT, else "unknown": the line a benchmark prints beside its figures."""
    import os
    import subprocess
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    fallback = os.environ.get("MINIRT_COMMIT", "unknown")
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return fallback
    if head.returncode:
        return fallback
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")
