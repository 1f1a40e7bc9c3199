#!/usr/bin/env python3
"""What GPU timestamps cost a run: Session.run wall time of one Whisper encoder with profiling off, with
profile="span" (two stamps around the run) and with profile=True (a stamp after every dispatch), the Sessions taken
in turns, and the GPU times the two profiled ones report. If the stamps between dispatches cost the run time, the
per-dispatch Session's wall time exceeds the others' by about the difference of the two GPU figures.

  python tools/dev/stamp_cost.py --size tiny --precision fp16 --runs 50 --rounds 3"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "models")]   # the checkout's minirt, models/whisper_encoder.py


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--runs", type=int, default=50, help="timed runs per Session per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import whisper_encoder as we
    from minirt import Session
    model, x = we.build_whisper_encoder(a.size, opset=17, seed=0), we.sample_input(seed=1)
    modes = {"off": False, "span": "span", "per-dispatch": True}
    sessions = {k: Session(model, storage="buffer", profile=v, options={"precision": a.precision})
                for k, v in modes.items()}
    wall = {k: [] for k in modes}
    gpu = {k: [] for k in modes}
    try:
        for _ in range(a.rounds):
            for k, s in sessions.items():
                for i in range(5 + a.runs):     # 5 untimed
                    t0 = time.perf_counter()
                    s.run(x)
                    dt = (time.perf_counter() - t0) * 1e3
                    if i < 5:
                        continue
                    wall[k].append(dt)
                    if k == "span":
                        gpu[k].append(s.gpu_span_ms())
                    elif k == "per-dispatch":
                        gpu[k].append(sum(r.gpu_ms or 0 for r in s.profile_records()))
    finally:
        for s in sessions.values():
            s.close()
    print(f"Whisper-{a.size} {a.precision}, {a.rounds} rounds x {a.runs} runs a Session, medians (ms):")
    print(f"{'profiling':<14} {'wall':>8} {'GPU':>8}")
    for k in modes:
        g = f"{statistics.median(gpu[k]):8.3f}" if gpu[k] else "       -"
        print(f"{k:<14} {statistics.median(wall[k]):8.3f} {g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
