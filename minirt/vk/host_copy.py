"""Host-side copies and page faulting of large arrays, split over a few threads.

One thread copies at about 11 GB/s and faults fresh pages in at about 3.5 GB/s on the lent H100's host, so a batch's
input (7.7 MB for 8 Whisper windows) and output (18.4 MB) cost a run milliseconds on one core; numpy releases the GIL
for these loops, so four threads take a fraction of that (docs/benchmarks.md, "Batches on main"). Below
PARALLEL_BYTES the threads' hand-off costs more than it saves, and the copy stays on the calling thread."""
from __future__ import annotations

import mmap
import os

import numpy as np

from ..pools import pool

PARALLEL_BYTES = 4 << 20        # at and above this, copies and page faulting are split over the threads
THREADS = max(1, min(4, os.cpu_count() or 1))


def _chunks(nbytes: int, itemsize: int):
    """[(start, stop)] element ranges, page-aligned, one a thread."""
    step = -(-nbytes // THREADS // mmap.PAGESIZE) * mmap.PAGESIZE // itemsize
    n = nbytes // itemsize
    return [(i, min(i + step, n)) for i in range(0, n, step)]


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src for 1-D arrays of one dtype and length (np.copyto with casting="no")."""
    if dst.nbytes < PARALLEL_BYTES or THREADS == 1:
        np.copyto(dst, src, casting="no")
        return
    list(pool("minirt-copy", THREADS).map(lambda r: np.copyto(dst[r[0]:r[1]], src[r[0]:r[1]], casting="no"),
                        _chunks(dst.nbytes, dst.itemsize)))


def touch(b: np.ndarray) -> None:
    """Fault every page of the 1-D uint8 array b in (a byte written a page), so that filling it later costs only the
    copy."""
    def one(r):
        b[r[0]:r[1]:mmap.PAGESIZE] = 0
    if b.nbytes < PARALLEL_BYTES or THREADS == 1:
        one((0, b.size))
    else:
        list(pool("minirt-copy", THREADS).map(one, _chunks(b.nbytes, 1)))
    if b.size:
        b[-1] = 0
