"""Memory plan: when each tensor is alive, and offsets that let dead tensors' memory be reused.

Pure functions: the planner uses them with tensor byte sizes, the executor with the sizes and
alignments the driver reports for images.
"""
from __future__ import annotations

from ..plan import CONSTANT, HOST_IN, HOST_OUT, PARAMS, STATE, WEIGHT, Plan

PINNED = (CONSTANT, WEIGHT, HOST_IN, HOST_OUT, STATE, PARAMS)   # never aliased: they hold data across runs


def lifetimes(plan: Plan) -> dict[str, tuple[int, int]]:
    """(first, last) dispatch index touching each aliasable root tensor. Inputs are live from
    before the first dispatch (-1, their upload) and outputs until after the last (their download)."""
    n = len(plan.dispatches)
    live: dict[str, list[int]] = {}
    for i, d in enumerate(plan.dispatches):
        for name, _ in d.args:
            r = plan.root(name)
            if plan.tensors[r].role in PINNED:
                continue
            span = live.setdefault(r, [i, i])
            span[0], span[1] = min(span[0], i), max(span[1], i)
    for name in plan.inputs:
        r = plan.root(name)
        live.setdefault(r, [-1, -1])[0] = -1
    for name in plan.outputs:
        r = plan.root(name)
        if plan.tensors[r].role in PINNED:    # an output that is a view of a state tensor
            continue
        span = live.setdefault(r, [n, n])
        span[1] = n
    return {k: (v[0], v[1]) for k, v in live.items()}


def assign_offsets(items, alignment: int = 256):
    """items: [(key, size, align, first, last)]. Returns ({key: offset}, total bytes).

    Greedy by size: the largest tensors are placed first, each at the lowest offset that no
    tensor alive at the same time occupies. Deterministic for a given input order."""
    placed: list[tuple[int, int, int, int]] = []   # (offset, end, first, last)
    offsets = {}
    order = sorted(range(len(items)), key=lambda i: (-items[i][1], i))
    for i in order:
        key, size, align, first, last = items[i]
        align = max(align, alignment)
        busy = sorted((o, e) for o, e, f, l in placed if not (l < first or last < f))
        off = 0
        for o, e in busy:
            if off + size <= o:
                break
            off = max(off, -(-e // align) * align)
        offsets[key] = off
        placed.append((off, off + size, first, last))
    total = max((e for _, e, _, _ in placed), default=0)
    return offsets, total
