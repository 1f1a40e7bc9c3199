"""Where a run's outputs land in host memory, and what the caller gets back.

A returned array is the caller's: no later run writes it (unless the caller passes it back as `out=`). Each executor
keeps OUTPUT_SETS sets of output arrays (one where the outputs pass SETS_MAX_BYTES together), and a run hands out a
set only while no caller holds it: the CPython reference counts of its arrays and of the memory they view are at their
baseline (a held result, or any view of it, raises one). Zero-copy sets (zero_copy.py) are host memory imported into
Vulkan that the GPU copies the outputs into; plain sets (texture storage, option zero_copy off, drivers that cannot
import host memory) are filled by a host copy from the readback buffers. When every set is held, the run fills a fresh
set whose pages it touches while the GPU works, so that the host copy after the fence page-faults nothing: a result the
caller keeps costs that one copy and no page faults where the run waits for it."""
from __future__ import annotations

import sys

import numpy as np

from . import host_copy

OUTPUT_SETS = 3                 # output sets a caller may hold while runs still reuse memory already faulted in
SETS_MAX_BYTES = 64 << 20       # above this (all outputs together), one set: three copies of them are not worth it


def set_count(nbytes: int) -> int:
    """How many output sets an executor keeps for outputs of `nbytes` bytes together."""
    return OUTPUT_SETS if nbytes <= SETS_MAX_BYTES else 1


def refs(items):
    """CPython reference counts of a set's arrays and of the memory they view: a caller holding an output, or any
    view of it (numpy views reference the owner of the memory), raises one of them."""
    return [(sys.getrefcount(arr), sys.getrefcount(raw)) for _, arr, raw in items]


def free_set(sets):
    """The index of the first set no caller holds, or None."""
    return next((i for i, s in enumerate(sets) if refs(s["items"]) == s["base"]), None)


def fresh(shape) -> np.ndarray:
    """A new float32 array of `shape` with every page already faulted in (one byte written a page), so that filling
    it later costs only the copy."""
    a = np.empty(shape, np.float32)
    host_copy.touch(a.reshape(-1).view(np.uint8))
    return a


def plain_sets(plan, names) -> list:
    """[{"items": [(name, array, array)], "base": refs(items)}]: the output sets of a run whose outputs the host copies
    out of the readback buffers."""
    if not names:
        return []
    count = set_count(sum(plan.tensors[n].nbytes for n in names))
    # comprehensions: no name of this function's may hold an array when the baseline counts are taken
    sets = [{"items": [(n, a, a) for n, a in ((n, fresh(plan.tensors[n].shape)) for n in names)]} for _ in range(count)]
    for s in sets:
        s["base"] = refs(s["items"])
    return sets
