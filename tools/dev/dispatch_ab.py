#!/usr/bin/env python3
"""Per-dispatch GPU time of a Whisper encoder under several Session option sets, side by side: every set gets its own
Session, and the Sessions run in turns (--rounds x --runs timed runs each), so a slow stretch of a shared GPU falls on
all of them alike. Prints each set's total and each dispatch's median (timestamp query pool).

  python tools/dev/dispatch_ab.py --size tiny --precision fp16 "" "gemm_splitk=1"
  python tools/dev/dispatch_ab.py --size tiny --precision fp16 "" "fuse_reduce_layer_norm=0"

An option set is KEY=VALUE[,KEY=VALUE...] ("" for the defaults)."""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "models")]   # the checkout's minirt, models/whisper_encoder.py
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ can shadow an installed module


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("configs", nargs="+", help='option sets, e.g. "" "gemm_splitk=1"')
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    import whisper_encoder as we
    from minirt import Session
    from benchconfig import parse_config
    configs = a.configs
    model, x = we.build_whisper_encoder(a.size, opset=17, seed=0), we.sample_input(seed=1)
    # (as gemm_bench's --config: 0/false -> False, NxM -> a tuple; local_size=XxY applies to the GEMMs only)
    sessions = [Session(model, storage="buffer", profile=True, options=parse_config(f"{a.precision}:{c}"))
                for c in configs]
    runs = [[] for _ in sessions]
    try:
        for _ in range(a.rounds):
            for s, got in zip(sessions, runs):
                for i in range(3 + a.runs):      # 3 untimed
                    s.run(x)
                    if i >= 3:
                        got.append([(r.kernel, r.node, r.gpu_ms or 0.0) for r in s.profile_records()])
    finally:
        for s in sessions:
            s.close()
    for c, got in zip(configs, runs):
        n = len(got[0])
        total = statistics.median(sum(d[2] for d in run) for run in got) * 1e3
        print(f"== Whisper-{a.size} {a.precision} {c or 'defaults'}: {total:.1f} us GPU, {n} dispatches")
        for k in range(n):
            kernel, node = got[0][k][:2]
            print(f"  {kernel[:34]:<34} {node[-34:]:<34} {statistics.median(run[k][2] for run in got) * 1e3:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
