#!/usr/bin/env python3
"""What a kept output costs the host, part by part, per output size: faulting in a fresh array (outputs.fresh, done
while the GPU runs), copying the readback bytes into it (left after the fence), and, for comparison, importing fresh
host memory into Vulkan and freeing the import again (what a pool that hands a kept zero-copy set to the caller and
imports a new one in its place would pay each run instead of the copy). Medians over --runs, ms. --fault-ways also
times other ways of getting a fresh array's pages: mmap with MAP_POPULATE, madvise(MADV_HUGEPAGE) before the
touch, the touch split over 2 and 4 threads, and a fresh array where the process has just freed one of that size.

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
    ap.add_argument("--fault-ways", action="store_true", help="also time other ways of faulting a fresh array in")
    a = ap.parse_args(argv)
    if a.fault_ways:
        fault_ways(a)
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


def _touch(b):
    import mmap
    b[::mmap.PAGESIZE] = 0
    if b.size:
        b[-1] = 0


def fault_ways(a):
    """ms to get a fresh n-byte array with its pages faulted in, several ways (each array kept, as a caller would)."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    print(f"transparent huge pages: {thp.read_text().strip() if thp.exists() else 'not available'}")
    pools = {k: ThreadPoolExecutor(k) for k in (2, 4)}

    def numpy_touch(n):
        b = np.empty(n, np.uint8)
        _touch(b)
        return b

    def populate(n):
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0))
        return np.frombuffer(m, np.uint8)

    def hugepage(n):
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            m.madvise(mmap.MADV_HUGEPAGE)
        b = np.frombuffer(m, np.uint8)
        _touch(b)
        return b

    def threads(k):
        def make(n):
            b = np.empty(n, np.uint8)
            step = -(-n // k // mmap.PAGESIZE) * mmap.PAGESIZE
            list(pools[k].map(lambda i: _touch(b[i:i + step]), range(0, n, step)))
            return b
        return make

    def after_free(n):
        np.empty(n, np.uint8).fill(0)      # made, touched and freed: glibc gives a block this large back to the kernel
        return numpy_touch(n)

    ways = {"numpy + touch": numpy_touch, "MAP_POPULATE": populate, "MADV_HUGEPAGE + touch": hugepage,
            "touch in 2 threads": threads(2), "touch in 4 threads": threads(4), "just after a free": after_free}
    print(f"{'MB':>6} " + " ".join(f"{k:>22}" for k in ways))
    for mb in (float(v) for v in a.mb.split(",")):
        n = int(mb * 1e6)
        row = []
        for fn in ways.values():
            kept = []
            row.append(median_ms(lambda: kept.append(fn(n)), a.runs))
            del kept
        print(f"{mb:>6.1f} " + " ".join(f"{v:>22.3f}" for v in row))
    for p in pools.values():
        p.shutdown()


if __name__ == "__main__":
    sys.exit(main())
