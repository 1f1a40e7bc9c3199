"""Per-dispatch GPU timing from a Vulkan timestamp query pool, and its reports.

One implementation behind `minirt profile`, `tools/profile` and Session.profile_records().
Dispatch i's time is the gap between the timestamp written after dispatch i-1 finished and the
one after dispatch i finished (both at the bottom of the pipe), so the times add up to the GPU
time of the whole run; a dispatch that overlaps its predecessor is charged only its tail."""
from __future__ import annotations

import csv
import io
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class DispatchRecord:
    index: int
    node: str
    op: str
    kernel: str
    global_size: tuple
    local_size: tuple
    gpu_ms: float | None
    flops: int
    bytes: int

    @property
    def gflops(self):
        return self.flops / self.gpu_ms / 1e6 if self.gpu_ms else None

    @property
    def gbps(self):
        return self.bytes / self.gpu_ms / 1e6 if self.gpu_ms else None


def records_of(plan, times_ns, profile):
    if times_ns is None:
        print(f"warning: '{profile.name}' reports no usable timestamps (timestampPeriod "
              f"{profile.timestamp_period}, {profile.timestamp_valid_bits} valid bits); GPU times are unknown",
              file=sys.stderr)
    return [DispatchRecord(i, d.node, d.op, d.kernel, tuple(d.global_size), tuple(d.local_size),
                           None if times_ns is None else times_ns[i] / 1e6, d.flops, d.bytes)
            for i, d in enumerate(plan.dispatches)]


@dataclass
class ProfileResult:
    records: list            # median GPU time per dispatch over the timed runs
    wall_ms: list            # Session.run wall time of each timed run
    gpu_ms: list             # summed GPU time of each timed run
    device: str
    storage: str

    @property
    def gpu_total_ms(self):
        return statistics.median(self.gpu_ms) if self.gpu_ms and self.gpu_ms[0] is not None else None

    @property
    def wall_median_ms(self):
        return statistics.median(self.wall_ms)


def profile_session(session, x, runs=20, warmup=3, progress=None):
    for _ in range(warmup):
        session.run(x)
    per_run, walls, totals = [], [], []
    for i in range(runs):
        t0 = time.perf_counter()
        session.run(x)
        walls.append((time.perf_counter() - t0) * 1e3)
        recs = session.profile_records()
        per_run.append(recs)
        totals.append(None if recs and recs[0].gpu_ms is None else sum(r.gpu_ms for r in recs))
        if progress:
            progress(i + 1)
    med = []
    for i, r in enumerate(per_run[0]):
        times = [run[i].gpu_ms for run in per_run]
        r.gpu_ms = None if times[0] is None else statistics.median(times)
        med.append(r)
    p = session.device.profile
    return ProfileResult(med, walls, totals, p.name, session.storage)


def summary(records, key):
    """[(name, count, total ms, share)] grouped by `key` ("kernel" or "op"), largest first."""
    total = sum(r.gpu_ms or 0 for r in records) or 1.0
    groups = {}
    for r in records:
        g = groups.setdefault(getattr(r, key), [0, 0.0, 0, 0])
        g[0] += 1
        g[1] += r.gpu_ms or 0
        g[2] += r.flops
        g[3] += r.bytes
    rows = [(k, c, ms, ms / total, fl, by) for k, (c, ms, fl, by) in groups.items()]
    return sorted(rows, key=lambda r: -r[2])


def format_report(res: ProfileResult, top=None) -> str:
    out = io.StringIO()
    w = out.write
    w(f"device {res.device}, storage {res.storage}; {len(res.records)} dispatches; "
      f"median of {len(res.wall_ms)} runs\n")
    gpu = res.gpu_total_ms
    w(f"GPU time {gpu:.3f} ms (sum over dispatches)   wall {res.wall_median_ms:.3f} ms (Session.run)\n"
      if gpu is not None else f"GPU time unknown   wall {res.wall_median_ms:.3f} ms (Session.run)\n")
    w("(the stamp after each dispatch costs the run some time of its own, about 1 us a dispatch on an NVIDIA H200; "
      "Session(profile='span') times a run without them)\n\n")
    w(f"{'#':>4} {'node':<30} {'op':<18} {'kernel':<24} {'global':<16} {'local':<12} {'ms':>8} "
      f"{'GFLOP/s':>9} {'GB/s':>7}\n")
    recs = sorted(res.records, key=lambda r: -(r.gpu_ms or 0))[:top] if top else res.records
    for r in recs:
        ms = f"{r.gpu_ms:8.4f}" if r.gpu_ms is not None else "       -"
        gf = f"{r.gflops:9.1f}" if r.gflops and r.flops else "        -"
        gb = f"{r.gbps:7.1f}" if r.gbps and r.bytes else "      -"
        w(f"{r.index:>4} {r.node[:30]:<30} {r.op[:18]:<18} {r.kernel[:24]:<24} {str(list(r.global_size)):<16} "
          f"{str(list(r.local_size)):<12} {ms} {gf} {gb}\n")
    for key in ("kernel", "op"):
        w(f"\nby {key}:\n{key:<26} {'count':>5} {'ms':>9} {'share':>7} {'GFLOP/s':>9}\n")
        for name, c, ms, share, fl, _ in summary(res.records, key):
            rate = f"{fl / ms / 1e6:9.1f}" if ms and fl else "        -"
            w(f"{name[:26]:<26} {c:>5} {ms:9.4f} {share:7.1%} {rate}\n")
    return out.getvalue()


def to_json(res: ProfileResult) -> str:
    return json.dumps({"device": res.device, "storage": res.storage, "gpu_ms": res.gpu_total_ms,
                       "wall_ms": res.wall_median_ms, "wall_ms_runs": res.wall_ms,
                       "dispatches": [dict(asdict(r), gflops=r.gflops, gbps=r.gbps) for r in res.records]},
                      indent=1)


def to_csv(res: ProfileResult) -> str:
    out = io.StringIO()
    wr = csv.writer(out)
    wr.writerow(["index", "node", "op", "kernel", "global", "local", "gpu_ms", "flops", "bytes", "gflops", "gbps"])
    for r in res.records:
        wr.writerow([r.index, r.node, r.op, r.kernel, "x".join(map(str, r.global_size)),
                     "x".join(map(str, r.local_size)), r.gpu_ms, r.flops, r.bytes, r.gflops, r.gbps])
    return out.getvalue()


def to_trace(res: ProfileResult) -> str:
    """Chrome trace event format (opens in Perfetto / chrome://tracing): one complete event per dispatch."""
    events, t = [], 0.0
    for r in res.records:
        dur = (r.gpu_ms or 0) * 1e3
        events.append({"name": r.kernel, "cat": r.op, "ph": "X", "ts": round(t, 3), "dur": round(dur, 3),
                       "pid": 1, "tid": 1, "args": {"index": r.index, "node": r.node, "global": list(r.global_size),
                                                    "local": list(r.local_size), "flops": r.flops,
                                                    "bytes": r.bytes}})
        t += dur
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                       "otherData": {"device": res.device, "storage": res.storage}})


def load_input(session, path):
    """The input for profiling: a .npy file, or fresh seeded random data of the input's shape."""
    if path:
        return np.load(path, allow_pickle=False).astype(np.float32, copy=False)
    info = session.inputs[0]
    shape = [d if isinstance(d, int) else 1 for d in info.shape]
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)
