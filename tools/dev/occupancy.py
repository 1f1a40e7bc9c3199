#!/usr/bin/env python3
"""How many work groups share a multiprocessor, and what the driver says each kernel needs.

  python tools/dev/occupancy.py probe [--threads 128] [--shared-kib 1,16,24,32,40,48] [--waves 1,2,3,4,5,6]
  python tools/dev/occupancy.py stats MODEL [--precision fp32|fp16] [--storage buffer] [--option KEY=VALUE ...]

probe: glsl/occupancy_probe.comp (a latency-bound pointer chase through shared memory) dispatched with
multiprocessors x W groups for each W of --waves, per shared-memory size. While every group fits at once, the time
stays at one chain's; it steps up where they stop fitting. Prints the GPU us per dispatch (median of --runs) and the
resident groups per multiprocessor that the steps imply. Needs the multiprocessor count (NVIDIA, AMD).

stats: plans MODEL, creates its pipelines with VK_KHR_pipeline_executable_properties statistics on
(MINIRT_PIPELINE_STATS=1) and prints what the driver reports per kernel (on NVIDIA: registers, shared memory, ...).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))   # the checkout's minirt, installed or not
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ can shadow an installed module


def probe(args):
    from occupancy_probe import probe_plan
    from minirt.session import get_device
    from minirt.vk.executor import Executor
    dev = get_device()
    sms = args.sms or dev.profile.compute_units
    if not sms:
        sys.exit(f"'{dev.profile.name}' does not report its multiprocessor count; give --sms")
    waves = [int(w) for w in args.waves.split(",")]
    kib = [float(k) for k in args.shared_kib.split(",")]
    t = args.threads
    rows = []
    for k in kib:
        words = max(t, int(k * 1024) // 4)
        if 4 * words > dev.profile.max_shared_memory:
            print(f"{k} KiB: over the device's {dev.profile.max_shared_memory} bytes, skipped")
            continue
        ex = Executor(dev, probe_plan(words, t, [w * sms for w in waves], args.chain), profile=True)
        try:
            times = {w: [] for w in waves}
            for i in range(args.warmup + args.runs):
                ex.run({})
                if i >= args.warmup:
                    for w, ns in zip(waves, ex.dispatch_times_ns()):
                        times[w].append(ns / 1e3)
        finally:
            ex.close()
        med = {w: statistics.median(v) for w, v in times.items()}
        one = med[waves[0]]
        # resident groups: the largest W still within 1.3x of the first (smallest) W's time
        fit = max((w for w in waves if med[w] <= 1.3 * one), default=0)
        rows.append((k, words * 4, med, fit))
        print(f"{k:6g} KiB ({words * 4} B), {t} threads: " +
              "  ".join(f"W={w}: {med[w]:8.1f}" for w in waves) + f"  -> about {fit} group(s) per SM", flush=True)
    return rows


def stats(args):
    os.environ["MINIRT_PIPELINE_STATS"] = "1"   # before the device is created
    from minirt import Session
    from minirt.session import get_device
    dev = get_device()
    if not dev.executable_statistics:
        print(f"'{dev.profile.name}' has no VK_KHR_pipeline_executable_properties: kernels listed without statistics")
    from benchconfig import parse_config   # the tools' one reading of KEY=VALUE options (0 -> False, 8x16 -> a tuple)
    options = parse_config(f"{args.precision}:{','.join(args.option)}")
    with Session(args.model, storage=args.storage, precision=args.precision, options=options) as s:
        shapes = {n: tuple(d if isinstance(d, int) and d > 0 else 1 for d in s.graph.tensor(n).shape)
                  for n in s.graph.inputs}
        rng = np.random.default_rng(0)
        s.run(None, {n: rng.standard_normal(sh).astype(np.float32) for n, sh in shapes.items()})
        ex = next(iter(s._execs.values()))
        seen = {}
        for key, pipe in ex.kernels.pipelines.items():
            name, _, local, spec = key
            seen[(name, local, spec)] = ex.kernels.statistics(pipe)
    for (name, local, spec), st in seen.items():
        print(f"{name} local {'x'.join(map(str, local))} spec {list(spec)}")
        print("    " + ", ".join(f"{k} {v}" for k, v in st.items()))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe")
    p.add_argument("--threads", type=int, default=128)
    p.add_argument("--shared-kib", default="1,8,16,24,32,40,44,48")
    p.add_argument("--waves", default="1,2,3,4,5,6,8")
    p.add_argument("--chain", type=int, default=20000, help="dependent loads per invocation")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--sms", type=int, default=0, help="multiprocessor count, where the driver does not tell")
    p.add_argument("--warmup", type=int, default=2)
    q = sub.add_parser("stats")
    q.add_argument("model")
    q.add_argument("--precision", default="fp32")
    q.add_argument("--storage", default="buffer")
    q.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a Session option (repeatable)")
    args = ap.parse_args(argv)
    return probe(args) if args.cmd == "probe" else stats(args)


if __name__ == "__main__":
    main()
