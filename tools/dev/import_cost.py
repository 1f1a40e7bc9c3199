#!/usr/bin/env python3
"""What a kept output costs the host, part by part, per output size: faulting in a fresh array (outputs.fresh, done
while the GPU runs), copying the readback bytes into it (left after the fence), and, for comparison, importing fresh
host memory into Vulkan and freeing the import again (what a pool that hands a kept zero-copy set to the caller and
imports a new one in its place would pay each run instead of the copy). Medians over --runs, ms.

  python tools/dev/import_cost.py --mb 2.3,18.4,36.9
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]   # the checkout's minirt
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ shadows an installed module


def median_ms(fn, runs):
    from benchconfig import timed
    return timed(fn, runs)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", default="2.3,18.4,36.9", help="output sizes in MB (Whisper-tiny's: 2.3 a batch item)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--device", type=int)
    a = ap.parse_args(argv)
    from minirt.session import get_device
    from minirt.vk.outputs import fresh
    from minirt.vk.resources import Resources
    from minirt.vk.zero_copy import import_host
    dev = get_device(a.device)
    align = getattr(dev, "host_import_alignment", 0)
    print(f"{dev.profile.name}; host import alignment {align or 'none (no VK_EXT_external_memory_host)'}")
    print(f"{'MB':>6} {'fault in (fresh)':>17} {'copy into it':>13} {'import':>8} {'free import':>12}")
    for mb in (float(v) for v in a.mb.split(",")):
        n = int(mb * 1e6) // 4
        src = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        kept = []
        fault = median_ms(lambda: kept.append(fresh((n,))), a.runs)
        dsts = iter(kept)
        copy = median_ms(lambda: np.copyto(next(dsts), src), a.runs)
        imp = free = float("nan")
        if align:
            res = Resources(dev, None)
            size = -(-n * 4 // align) * align
            usage = dev.vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
            raws, ti, tf = [], [], []
            for _ in range(a.runs):
                raw = np.empty(size + align, np.uint8)          # fresh memory, as a new zero-copy set would take
                raws.append(raw)
                off = (-raw.ctypes.data) % align
                t0 = time.perf_counter()
                buf = import_host(res, raw.ctypes.data + off, size, usage, "a fresh block")
                t1 = time.perf_counter()
                if buf is None:
                    break
                errors = []
                res.destroy_all(errors)
                t2 = time.perf_counter()
                if errors:
                    raise errors[0]
                ti.append((t1 - t0) * 1e3)
                tf.append((t2 - t1) * 1e3)
            if ti:
                imp, free = statistics.median(ti), statistics.median(tf)
        print(f"{mb:>6.1f} {fault:>17.3f} {copy:>13.3f} {imp:>8.3f} {free:>12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
