"""Program: several Plans (entry points) on one device over one set of state tensors.

A Plan with state (Plan.state) reads and writes tensors that live across runs; the Plans of a Program share them by
name, so one entry point's run leaves in them what another's reads (an encoder fills a decoder's cross-attention
keys and values, a step appends to a key/value cache, a reorder permutes its rows). Each entry point is recorded
once (an Executor: its activations and command buffers; weights with the same name and bytes in several Plans are
uploaded once and shared); a run writes its inputs and its run-time
parameters (Plan.params: positions, lengths) into host-visible memory and replays the recording, so nothing is
recorded again however many runs follow.

Entry points that add() is told share their activations (entry points of one size ladder, say) get one activation
arena between them, as large as the largest of theirs: runs never overlap, so none needs its own.

    program = Program({"encode": plan_a, "step": plan_b}, device=None)
    program.run("encode", {"input_features": x})
    logits = program.run("step", {"tokens": ids}, {"pos": 3})["logits"]
"""
from __future__ import annotations

import collections

import numpy as np

from .driver import Driver, get_device
from .errors import InputError, MinirtError
from .plan import Plan


def check_feeds(plan: Plan, feeds: dict, params: dict) -> dict:
    """feeds as the executor takes them: every input of the plan, of its shape, as float32 (or int32 for integer
    inputs: integers are converted when they fit); every parameter of the plan given as an int."""
    feeds, params = dict(feeds or {}), dict(params or {})
    extra = [k for k in feeds if k not in plan.inputs] + [k for k in params if k not in plan.params]
    missing = [k for k in plan.inputs if k not in feeds] + [k for k in plan.params if k not in params]
    if extra or missing:
        raise InputError("inputs and parameters do not match the plan: "
                         + (f"unknown {extra} " if extra else "") + (f"missing {missing} " if missing else "")
                         + f"(inputs {plan.inputs}, parameters {plan.params})")
    out = {}
    for name, x in feeds.items():
        t = plan.tensors[name]
        x = np.asarray(x)
        if tuple(x.shape) != tuple(t.shape):
            raise InputError(f"input '{name}' expects shape {list(t.shape)}, got {list(x.shape)}")
        if t.dtype == "int32":
            if x.dtype.kind not in "iu" or (x.size and (x.min() < -2**31 or x.max() >= 2**31)):
                raise InputError(f"input '{name}' takes int32 values, got {x.dtype}")
            x = x.astype(np.int32)
        elif x.dtype != np.float32:
            raise InputError(f"input '{name}' must be float32, got {x.dtype}")
        out[name] = np.ascontiguousarray(x)
    for name, v in params.items():
        if not isinstance(v, (int, np.integer)) or not -2**31 <= int(v) < 2**31:
            raise InputError(f"parameter '{name}' must be an int32 value, got {v!r}")
    return out


class Program(Driver):
    """plans: {entry point: Plan}, each planned for `device` (an index or UUID as `minirt devices` lists them, or None) in
    buffer storage. Executors are made at creation, all of them, with one StateBuffers for every plan's state.
    Runs are serialised by the Program's lock. profile=True: a GPU timestamp after every dispatch
    (dispatch_times). add() makes more entry points later, over the same state and weights. runs: {entry point:
    runs so far} (which of several sizes a caller ran)."""

    def __init__(self, plans: dict, device=None, timeout_s: float = 600.0, progress=None, profile=False):
        from .vk.state_buffers import StateBuffers
        from .vk.upload import SharedConstants
        super().__init__()
        self.plans = {}
        self.device = get_device(device)
        self._made = dict(timeout_s=timeout_s, profile=profile, progress=progress)
        self.state = StateBuffers(self.device, timeout_s)
        self.constants = SharedConstants(self.device)
        self.executors = {}
        self.arenas = []          # SharedArenas (add's share), freed after the executors
        self.sharing = {}         # entry point -> the other entry points of its shared arena
        self.runs = collections.Counter()
        try:
            self.add(plans)
        except BaseException:
            self.close()
            raise

    def add(self, plans: dict, share: tuple = ()) -> None:
        """More entry points ({entry point: Plan}, names not used yet), over this Program's state and weights (a
        weight already uploaded is shared). share: names of these plans whose activations share one arena
        (SharedArena). Where one fails, none of them is added."""
        from .planner.memory_plan import arena, buffer_alignment
        from .vk.resources import SharedArena
        taken = sorted(set(plans) & set(self.plans))
        if taken:
            raise MinirtError(f"entry point(s) {', '.join(taken)} exist already")
        share = [n for n in share if n in plans]
        made, shared = {}, None
        with self._lock:
            if self.executors is None:
                raise MinirtError("this Program is closed")
            try:
                if len(share) > 1:
                    align = buffer_alignment(self.device.profile)
                    shared = SharedArena(self.device, max(arena(plans[n], align)[1] for n in share))
                for name, plan in plans.items():
                    made[name] = self._make_executor(self.device, plan, state=self.state, constants=self.constants,
                                                     arena=shared if name in share else None, **self._made)
            except BaseException:
                for ex in made.values():
                    ex.close()
                if shared is not None:
                    shared.close()
                raise
            self.plans.update(plans)
            self.executors.update(made)
            if shared is not None:
                self.arenas.append(shared)
                for n in share:
                    self.sharing[n] = [m for m in share if m != n]

    def run(self, entry: str, feeds: dict | None = None, params: dict | None = None) -> dict:
        """Run entry point `entry`: {output name: array}."""
        plan = self.plans.get(entry)
        if plan is None:
            raise InputError(f"'{entry}' is not an entry point of this program ({', '.join(self.plans)})")
        feeds = check_feeds(plan, feeds, params)
        with self._lock:
            if self.executors is None:
                raise MinirtError("this Program is closed")
            for other in self.sharing.get(entry, ()):
                self.executors[other].settle()
            self.runs[entry] += 1
            return self.executors[entry].run(feeds, params)

    def dispatch_times(self, entry: str) -> list:
        """[(node, kernel, GPU microseconds)] of entry point `entry`'s last run, a row per dispatch (profile=True), or
        [] where the device gives no usable clock."""
        ex, plan = self.executors[entry], self.plans[entry]
        ns = ex.dispatch_times_ns() if ex.profiling else None
        return [] if ns is None else [(d.node, d.kernel, t / 1e3) for d, t in zip(plan.dispatches, ns)]

    # -- lifetime (close() and the context manager: minirt.driver.Driver) ----------------------
    def _release(self) -> list:
        """The executors first, then the state and weights they share."""
        execs, self.executors = self.executors or {}, None
        shared, self.state, self.constants = [*self.arenas, self.state, self.constants], None, None
        self.arenas = []
        return [*execs.values(), *shared]

    def _is_open(self) -> bool:
        return bool(self.executors)
