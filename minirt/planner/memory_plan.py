"""Memory plan: when each tensor is alive, offsets that let dead tensors' memory be reused, and what a plan
allocates, checked against the device's memory before anything is allocated.

Pure functions: the planner uses them with tensor byte sizes, the executor with the sizes and
alignments the driver reports for images.
"""
from __future__ import annotations

import random
from bisect import bisect_left, bisect_right

from ..errors import UnsupportedError
from ..plan import CONSTANT, HOST_IN, HOST_OUT, PARAMS, STATE, WEIGHT, Plan

PINNED = (CONSTANT, WEIGHT, HOST_IN, HOST_OUT, STATE, PARAMS)   # never aliased: they hold data across runs
UPLOAD_CHUNK = 64 << 20     # the weight upload's staging buffer holds at most this (minirt/vk/upload.py)


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


def buffer_alignment(profile) -> int:
    """Where buffer tensors may start in the arena and the weights buffer: the device's storage buffer offset
    alignment, at least 16 bytes."""
    return max(profile.min_storage_buffer_offset_alignment, 16)


def _arena_tensors(plan: Plan):
    """The root tensors of plan.lifetimes in buffer storage, except those bound in host memory (plan.direct_io)."""
    return [t for t in plan.tensors.values()
            if t.name in plan.lifetimes and not t.view_of and t.storage == "buffer" and t.role not in plan.direct_io]


def arena(plan: Plan, align: int):
    """The activation arena, one buffer for the buffer activations: ({name: byte offset}, bytes)."""
    return assign_offsets([(t.name, t.nbytes, align, *plan.lifetimes[t.name]) for t in _arena_tensors(plan)], align)


def _peak(items) -> int:
    """The most bytes alive at once: [(size, first, last)]."""
    events = sorted([(f, s) for s, f, _ in items] + [(l + 1, -s) for s, _, l in items])    # ends before starts
    live = most = 0
    for _, s in events:
        live += s
        most = max(most, live)
    return most


def memory_needs(plan: Plan, profile, reuse: bool = True) -> list[tuple[str, str, int]]:
    """What an executor allocates for the plan and keeps until it closes (minirt/vk/resources.py and upload.py):
    [(what, "device" or "host" memory, bytes)]. Buffers as laid out there (the driver may round each up a little);
    textures at their texel bytes, which the driver's image sizes and alignments only add to, the activation ones as
    the most alive at once (their memory plan uses the driver's sizes). Device-local: the weights buffer, the constant
    textures, the activation arena and textures; host-visible: each input's staging and output's readback, and the
    weight upload's staging. reuse=False: the arena as if no two activations shared bytes (no memory plan to make;
    never less than the real one)."""
    align = buffer_alignment(profile)
    consts = [t for t in plan.tensors.values() if t.role in (WEIGHT, CONSTANT) and not t.view_of]
    out = [("weights", "device", sum(-(-t.nbytes // align) * align for t in consts if t.storage == "buffer")),
           ("constant textures", "device", sum(t.nbytes for t in consts if t.storage == "texture"))]
    if reuse:
        out.append(("activations", "device", arena(plan, align)[1]))
    else:
        out.append(("activations", "device", sum(-(-t.nbytes // align) * align for t in _arena_tensors(plan))))
    out.append(("activation textures", "device", _peak(
        [(t.nbytes, *plan.lifetimes[t.name]) for t in plan.tensors.values()
         if t.name in plan.lifetimes and not t.view_of and t.storage == "texture"])))
    out += [(f"input '{n}' staging", "host", plan.tensors[n].nbytes) for n in plan.inputs]
    out += [(f"output '{n}' readback", "host", plan.tensors[n].nbytes) for n in plan.outputs]
    uploads = [t.nbytes if t.storage == "texture" else t.data.size * t.itemsize for t in consts if t.data is not None]
    if uploads:
        out.append(("weight upload staging", "host", min(UPLOAD_CHUNK, max(uploads))))
    return [(what, heap, n) for what, heap, n in out if n]


def _size(n) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.{2 if shift == 30 else 1}f} {unit}"
    return f"{n} bytes"


def check_memory(plan: Plan, profile) -> None:
    """Refuses a plan the device cannot hold, before anything is allocated: a tensor beyond the largest allocation
    (maxMemoryAllocationSize) or beyond the memory heap it lives in, or a plan whose allocations (memory_needs) add up
    to more than their heap (one sum on a device with one heap). Where the profile does not know a size (0: the
    fakes in KNOWN_PROFILES), that size is not checked."""
    p = profile
    roots = [t for t in plan.tensors.values() if not t.view_of]
    for t in roots:
        host = t.name in plan.inputs or t.name in plan.outputs
        device = not (t.role in plan.direct_io and t.storage == "buffer")
        for limit, what in ((p.max_allocation, "allows at most {} in one allocation (maxMemoryAllocationSize)"),
                            (p.device_heap if device else 0, "has a device-local memory heap of {}"),
                            (p.host_heap if host else 0, "has a host-visible memory heap (staging, readback) of {}")):
            if limit and t.nbytes > limit:
                raise UnsupportedError(f"tensor '{t.name}' {list(t.shape)} ({t.role}) needs {_size(t.nbytes)}; "
                                       f"'{p.name}' " + what.format(_size(limit)), [t.name])
    if not (p.device_heap or p.host_heap):
        return
    for reuse in (False, True):        # the memory plan is made only where the plan would not fit without it
        needs = memory_needs(plan, p, reuse)
        heaps = ([("device and host-visible", p.device_heap, needs)] if p.unified_heap else
                 [("device-local", p.device_heap, [n for n in needs if n[1] == "device"]),
                  ("host-visible", p.host_heap, [n for n in needs if n[1] == "host"])])
        over = [(heap, limit, parts) for heap, limit, parts in heaps if limit and sum(n for *_, n in parts) > limit]
        if not over:
            return
    heap, limit, parts = over[0]
    big = sorted(roots, key=lambda t: -t.nbytes)[:3]
    raise UnsupportedError(
        f"this plan needs {_size(sum(n for *_, n in parts))} of {heap} memory on '{p.name}', more than its "
        f"{_size(limit)} heap: " + ", ".join(f"{what} {_size(n)}" for what, _, n in parts) + "; the largest tensors: "
        + ", ".join(f"'{t.name}' {list(t.shape)} ({t.role}) {_size(t.nbytes)}" for t in big), [t.name for t in big])


def per_item(plan: Plan, profile) -> tuple:
    """What a batch holds of `plan`, the plan of one item, for each item: everything but its weights, constants,
    state and parameters grows with the batch (activations, scratch, inputs and outputs). (the largest such tensor,
    its bytes, the bytes of its activation arena)."""
    grows = [t for t in plan.tensors.values() if not t.view_of and t.role not in PINNED]
    big = max(grows, key=lambda t: t.nbytes)
    return big, big.nbytes, arena(plan, buffer_alignment(profile))[1]


def items_that_fit(profile, most: int, largest: int, allocation: int = 0, heap: int = 0, reserved: int = 0,
                   storage: str = "buffer") -> tuple[int, str]:
    """The most items, up to `most`, a batch holds where each item adds `largest` bytes to its largest tensor,
    `allocation` bytes to one allocation (an activation arena) and `heap` bytes to the device-local heap, with
    `reserved` bytes of that heap held besides (weights, other plans' memory): its largest tensor within
    maxStorageBufferRange (buffer storage) and maxMemoryAllocationSize, the allocation within
    maxMemoryAllocationSize, and the heap less reserved (where that leaves anything: else the driver judges).
    (items, the limit that bound them, as text; "" where `most` fit). 0 where one item's largest tensor does not fit;
    at least 1 otherwise (a plan of one item needs as much anyway)."""
    p = profile
    bounds = []
    if storage == "buffer":
        bounds.append((p.max_storage_buffer_range, largest, "its largest tensor", "maxStorageBufferRange"))
    if p.max_allocation:
        bounds.append((p.max_allocation, largest, "its largest tensor", "maxMemoryAllocationSize"))
        bounds.append((p.max_allocation, allocation, "its activations (one allocation)", "maxMemoryAllocationSize"))
    if p.device_heap > reserved:
        bounds.append((p.device_heap - reserved, heap, "what it holds",
                       f"the device heap less {_size(reserved)} held besides"))
    n, why = most, ""
    for limit, per, what, name in bounds:
        k = limit // per if per else most
        if what != "its largest tensor":
            k = max(1, k)
        if k < n:
            n, why = k, f"{what}, {_size(per)} an item, {_size(per * most)} for {most}, is beyond {name} ({_size(limit)})"
    return n, why


def assign_offsets(items, alignment: int = 256):
    """items: [(key, size, align, first, last)], first <= last. Returns ({key: offset}, total bytes).

    Greedy by size: the largest tensors are placed first, each at the lowest multiple of its alignment (at least
    `alignment`) where it overlaps no tensor placed before it that is alive at the same time (lifetimes [first, last]
    sharing a dispatch). Deterministic for a given input order. A tensor of no bytes overlaps nothing: offset 0.

    That offset is found in one of two indexes of the tensors placed so far, whichever gets there first (each is
    given a number of steps in turn, four times more each round; both only ever raise a lower bound on the offset):
    _ByTime finds the tensors alive at the same time, as a few sets of merged byte ranges, and suits tensors that
    live briefly (a chain reusing a few slots); _ByOffset walks them in offset order and steps over a run of tensors
    that are all alive then and packed end to end at once, and suits many tensors alive together (a Gather of
    thousands of shuffled indices keeps every run it copies alive until their Concat). Together they are near-linear
    on every kind of plan measured (O(n log^2 n) steps; that Gather's 13,335 tensors take 1-2 s on a 2-core VM, where
    comparing each tensor with every earlier one took 50 s); only a plan that defeats both could cost as much as
    that comparison."""
    for key, size, _, first, last in items:
        if size < 0 or first > last:
            raise ValueError(f"memory plan item {key!r}: size {size}, lifetime [{first}, {last}]")
    aligns = sorted({max(a, alignment) for _, _, a, _, _ in items})
    times = sorted({t for it in items for t in it[3:]})
    by_time = {a: _ByTime(times) for a in aligns}        # ends rounded up to each alignment in use: tensors
    by_offset = {a: _ByOffset() for a in aligns}         # padded to it pack end to end
    priority = random.Random(0)
    offsets, total = {}, 0
    for i in sorted(range(len(items)), key=lambda i: (-items[i][1], i)):
        key, size, align, first, last = items[i]
        if not size:
            offsets[key] = 0
            continue
        align = max(align, alignment)
        nodes, above = by_time[align].nodes(first, last)
        sets = by_time[align].sets(nodes, above)
        off, steps, done = 0, 16, False
        while not done:
            off, done = _jump(sets, off, size, steps)
            if not done:
                off, done = by_offset[align].walk(off, size, first, last, steps)
                steps *= 4
        offsets[key] = off
        total = max(total, off + size)
        p = priority.random()
        for a in aligns:
            end = -(-(off + size) // a) * a
            by_time[a].add(nodes, above, off, end)
            by_offset[a].add((off, first, i), off, end, first, last, p)
    return offsets, total


# Every placed tensor is, to the search for an offset at alignment A, the bytes [offset, its end rounded up to A):
# an offset that is a multiple of A overlaps the tensor exactly when it overlaps those bytes. The search keeps `off`,
# a multiple of A below which no offset fits, and raises it past whatever [off, off + size) overlaps.

class _ByTime:
    """The placed tensors by lifetime: a segment tree over the time points, each tensor at the O(log T) nodes that
    exactly cover its lifetime. Each node keeps sorted disjoint byte ranges (ranges that overlap or touch merged):
    those of the tensors covering it ("cover"), and those of the tensors at it or anywhere below it ("under"). The
    tensors alive at some point of [first, last] are those in "under" of the nodes covering [first, last] and in
    "cover" of their ancestors: O(log T) sets of merged ranges."""

    def __init__(self, times):
        self.at = {t: i for i, t in enumerate(times)}
        self.leaves = 1 << max(len(times) - 1, 0).bit_length()
        self.cover, self.under = {}, {}

    def nodes(self, first, last):
        """(the nodes exactly covering [first, last], their ancestors)."""
        lo, hi = self.at[first] + self.leaves, self.at[last] + self.leaves + 1
        nodes, above = [], set()
        while lo < hi:
            if lo & 1:
                nodes.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                nodes.append(hi)
            lo >>= 1
            hi >>= 1
        for n in nodes:
            n >>= 1
            while n and n not in above:
                above.add(n)
                n >>= 1
        return nodes, above

    def sets(self, nodes, above):
        return ([s for s in map(self.under.get, nodes) if s is not None]
                + [s for s in map(self.cover.get, above) if s is not None])

    def add(self, nodes, above, start, end):
        for sets, keys in ((self.cover, nodes), (self.under, nodes), (self.under, above)):
            for key in keys:
                s = sets.get(key)
                if s is None:
                    sets[key] = ([start], [end])
                    continue
                starts, ends = s
                i = bisect_left(ends, start)        # the first range ending at or after start
                j = bisect_right(starts, end)       # ranges [i, j) overlap or touch [start, end)
                if i == j:
                    starts.insert(i, start)
                    ends.insert(i, end)
                elif i + 1 < j or start < starts[i] or ends[i] < end:
                    s0, e0 = starts[i], ends[j - 1]
                    starts[i:j] = [min(start, s0)]
                    ends[i:j] = [max(end, e0)]


def _jump(sets, off, size, steps):
    """Raises off past each range of `sets` that [off, off + size) overlaps, until none does: (off, True); or
    (off so far, False) once `steps` moves are made."""
    moved = True
    while moved:
        moved = False
        for starts, ends in sets:
            j = bisect_right(ends, off)             # the first range ending after off
            if j < len(ends) and starts[j] < off + size:
                off, moved = ends[j], True
                steps -= 1
                if steps < 0:
                    return off, False
    return off, True


class _Node:
    """A placed tensor in _ByOffset's treap, with what the tensors of its subtree have in common: the lowest offset
    ("low"), the highest end ("high"), the bounds of their lifetimes, and whether they lie end to end ("tight": each,
    in offset order, starts at or before the highest end of those before it)."""
    __slots__ = ("key", "start", "end", "first", "last", "priority", "left", "right",
                 "low", "high", "first_min", "first_max", "last_min", "last_max", "tight")

    def __init__(self, key, start, end, first, last, priority):
        self.key, self.start, self.end, self.first, self.last = key, start, end, first, last
        self.priority, self.left, self.right = priority, None, None
        self.low, self.high, self.tight = start, end, True
        self.first_min = self.first_max = first
        self.last_min = self.last_max = last

    def update(self):
        """Recomputes what the subtree's tensors have in common from the children's (comparisons rather than
        min() and max(): this runs O(log n) times for each tensor placed)."""
        a, b = self.left, self.right
        low, high, tight = self.start, self.end, True
        fmin = fmax = self.first
        lmin = lmax = self.last
        if a is not None:
            low, tight = a.low, a.tight and self.start <= a.high
            if a.high > high:
                high = a.high
            if a.first_min < fmin:
                fmin = a.first_min
            if a.first_max > fmax:
                fmax = a.first_max
            if a.last_min < lmin:
                lmin = a.last_min
            if a.last_max > lmax:
                lmax = a.last_max
        if b is not None:
            tight = tight and b.tight and b.low <= high
            if b.high > high:
                high = b.high
            if b.first_min < fmin:
                fmin = b.first_min
            if b.first_max > fmax:
                fmax = b.first_max
            if b.last_min < lmin:
                lmin = b.last_min
            if b.last_max > lmax:
                lmax = b.last_max
        self.low, self.high, self.tight = low, high, tight
        self.first_min, self.first_max, self.last_min, self.last_max = fmin, fmax, lmin, lmax


def _split(n, key):
    """(the subtree's nodes before key, the rest)."""
    if n is None:
        return None, None
    if n.key < key:
        n.right, rest = _split(n.right, key)
        n.update()
        return n, rest
    before, n.left = _split(n.left, key)
    n.update()
    return before, n


def _insert(n, new):
    """The subtree n with the node `new` added; returns its root."""
    if n is None:
        return new
    if new.priority > n.priority:
        new.left, new.right = _split(n, new.key)
        new.update()
        return new
    if new.key < n.key:
        n.left = _insert(n.left, new)
    else:
        n.right = _insert(n.right, new)
    n.update()
    return n


class _OutOfSteps(Exception):
    pass


class _ByOffset:
    """The placed tensors in offset order (a treap keyed by (offset, first, index))."""

    def __init__(self):
        self.root = None

    def add(self, key, start, end, first, last, priority):
        self.root = _insert(self.root, _Node(key, start, end, first, last, priority))

    def walk(self, off, size, first, last, steps):
        """The greedy scan from off over the tensors alive at some point of [first, last], in offset order: each
        either leaves room for [off, off + size) before it (done) or raises off to its end. It steps over a subtree
        whose tensors all end by off or are none of them alive then, and over one whose tensors are all alive then
        and lie end to end (off rises to their end). (off, True), or (off so far, False) after `steps` nodes."""
        state = [off, steps]

        def visit(n):
            while n is not None:
                off = state[0]
                if n.low >= off + size:
                    return True                 # it fits before everything from here on
                if n.high <= off or n.first_min > last or n.last_max < first:
                    return False
                if n.tight and n.first_max <= last and n.last_min >= first:
                    state[0] = max(off, n.high)
                    return False
                state[1] -= 1
                if state[1] < 0:
                    raise _OutOfSteps
                if visit(n.left):
                    return True
                if n.first <= last and n.last >= first:
                    if n.start >= state[0] + size:
                        return True
                    state[0] = max(state[0], n.end)
                n = n.right
            return False

        try:
            visit(self.root)
        except _OutOfSteps:
            return state[0], False
        return state[0], True
