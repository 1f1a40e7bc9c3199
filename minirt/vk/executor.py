"""The Executor: turns a Plan into Vulkan resources and recorded command buffers once, then replays them.

Its parts: resources.py owns every Vulkan object and places the tensors (activation arena, images, host staging,
readback and direct I/O), upload.py uploads the weights, outputs.py keeps the sets of output arrays a run hands out
(zero_copy.py: host memory imported into Vulkan), recorder.py records the run (descriptors, barriers, poison,
timestamps). This file runs the start-up phases in order, replays a run, reads the timestamps and closes."""
from __future__ import annotations

import time

import numpy as np

from ..errors import DeviceError
from ..layout import from_texels, to_texels
from ..timing import Phases
from .pipelines import Kernels
from .recorder import Recorder, make_query_pools
from .resources import Resources, count_live, live_objects
from .upload import TIMEOUT_HINT, place_constants
from . import host_copy
from .outputs import free_set, fresh, plain_sets
from .zero_copy import make_slots

__all__ = ["Executor", "live_objects"]     # live_objects: tests and tools import it from here


def _kernel_objects(k) -> int:
    """The Kernels' pipelines, layouts, modules and pipeline cache: live objects too."""
    cache = getattr(getattr(k, "cache", None), "handle", None)      # the VkPipelineCache, when there is one
    return (sum(len(getattr(k, a, ())) for a in ("pipelines", "pipe_layouts", "set_layouts", "modules"))
            + (cache is not None))


class Executor:
    """profile: True (a timestamp after every dispatch), "span" (one before the first dispatch and one after the last:
    the run's GPU time without whatever per-dispatch stamps cost) or False. timeout_s bounds each wait for the GPU.
    How a run moves its data comes from the plan: plan.direct_io, plan.zero_copy, plan.spin_ms. state: the
    StateBuffers (minirt/vk/state_buffers.py) holding plan.state, shared with the executors of the program's other
    plans; arena: a SharedArena (resources.py) for the activations, shared with other executors whose runs never
    overlap this one's (settle() before running one of them)."""

    def __init__(self, dev, plan, profile=False, progress=None, timeout_s=600.0, state=None, constants=None,
                 arena=None):
        self.dev, self.vk, self.plan, self.d = dev, dev.vk, plan, dev.device
        self.startup_ms = {}      # phase -> ms (alloc, upload, pipelines, record): Session.startup_ms
        phase = Phases(self.startup_ms, progress)
        self.profiling = bool(profile) and dev.profile.timestamp_valid_bits > 0
        self.span = profile == "span"
        self.timeout_ns = int(float(timeout_s) * 1e9)
        # Poll the fence for up to this long before a blocking wait: a sleeping wait adds a thread wake-up
        # to every run (0.25 ms on an H200); 0 waits at once.
        self.spin_s = float(plan.spin_ms) / 1e3
        # any texture to sample (a plan of storage "auto" may hold textures and buffers)
        self.texture = any(t.storage == "texture" for t in plan.tensors.values())
        self.res = res = Resources(dev, plan, tuple(plan.direct_io) if plan.storage == "buffer" else ())
        self.kernels, self._kernel_objects = None, 0
        self.inputs = self.outputs = None
        self.slots = []           # zero-copy output sets (zero_copy.py)
        self.plain = []           # output sets the host copies into, where there are no zero-copy ones (outputs.py)
        try:
            phase("pipelines")                    # opening the on-disk pipeline cache
            self.kernels = Kernels(dev)
            phase("alloc", "allocating")
            if self.texture:
                res.make_sampler()
            res.place_activations(arena)
            phase("upload", "uploading weights")
            place_constants(res, self.timeout_ns, constants)
            phase("alloc")
            res.place_host()
            res.place_state(state)
            self.inputs, self.outputs = res.inputs, res.outputs
            res.place_views()
            self.slots = make_slots(res)
            if not self.slots:
                self.plain = plain_sets(plan, list(res.outputs))
            if self.profiling:
                self.query_pools = make_query_pools(res, 2 if self.span else len(plan.dispatches) + 1)
            phase("record", "creating pipelines and recording")
            rec = Recorder(res, self.kernels, self.query_pools if self.profiling else None, self.span)
            self.fence, self._cmds, self._submits = rec.record(self.slots)
            self.barriers = rec.barriers
            self._submit = self._submits[-1]
            self._fences = self.vk.ffi.new("VkFence[1]", [self.fence])
            self._pending = False      # a run stopped (timeout, exception) before its fence was reset
            phase(None)
            self.startup_ms["pipelines"] += self.kernels.pipeline_s * 1e3   # spent inside recording
            self.startup_ms["record"] -= self.kernels.pipeline_s * 1e3
            # the Kernels' pipelines, layouts and modules count as live objects too (all made by now)
            self._kernel_objects = _kernel_objects(self.kernels)
            count_live(self._kernel_objects)
        except BaseException as e:
            try:
                self.close()
            except Exception:
                pass        # the first error is the one to report
            if isinstance(e, self.vk.VkError):     # e.g. out of host or device memory creating a buffer
                raise DeviceError(f"creating the Vulkan resources of this model on '{dev.profile.name}' failed: "
                                  f"{type(e).__name__}") from e
            raise

    def run(self, feeds: dict, params: dict | None = None, out: dict | None = None) -> dict:
        """feeds: {input name: array of the planned shape and dtype (float32, or int32 for integer inputs)};
        params: {name: int} for every run-time parameter of the plan (plan.params), written into the parameter block
        before the submission; out: {output name: float32 C-contiguous writeable array of its shape} (checked by the
        caller) that those outputs are written into. Returns {output name: array}: arrays no caller holds
        (outputs.py), or out's."""
        if self.plan.params:
            given = params or {}
            for slot, name in enumerate(self.plan.params):
                self.res.params[slot] = int(given[name])
        for name, (_, view, t) in self.inputs.items():
            x = feeds[name]
            if t.storage == "texture":
                view[:] = to_texels(x, t.packed_dim).reshape(-1)
            else:
                host_copy.copy(view, x.reshape(-1))
        lib, vk = self.vk.lib, self.vk
        slot = None if out else free_set(self.slots)
        submit = self._submit if slot is None else self._submits[slot]
        dest = None
        with self.dev.lock:
            rc = vk.VK_SUCCESS
            if self._pending:
                # the last run stopped before its fence was reset (a timeout, or an exception such as Ctrl-C while it
                # waited): its command buffer may still execute; it must finish before the fence is reset and the
                # buffer resubmitted (a signalled fence resubmitted would let this run return before the GPU is done)
                rc = self._finish_pending()
            if rc == vk.VK_SUCCESS:
                # pending from before the submission until the fence is reset, whatever interrupts in between
                self._pending = True
                rc = lib.vkQueueSubmit(self.dev.queue, 1, submit, self.fence)
                if rc != vk.VK_SUCCESS:
                    self._pending = False       # nothing was submitted: the fence stays unsignalled
                elif slot is None:
                    dest = self._destination(out or {})     # while the GPU works: its pages are faulted in by now
                if rc == vk.VK_SUCCESS and self.spin_s:
                    # poll first: a sleeping wait costs a thread wake-up after the GPU is done
                    end = time.perf_counter() + self.spin_s
                    while lib.vkGetFenceStatus(self.d, self.fence) == vk.VK_NOT_READY and time.perf_counter() < end:
                        pass
                if rc == vk.VK_SUCCESS:
                    rc = lib.vkWaitForFences(self.d, 1, self._fences, 1, self.timeout_ns)
                    if rc != vk.VK_TIMEOUT:
                        lib.vkResetFences(self.d, 1, self._fences)
                        self._pending = False
        if rc != vk.VK_SUCCESS:
            if rc == vk.VK_TIMEOUT:
                raise DeviceError(f"the GPU did not finish within {self.timeout_ns / 1e9:g} s: {TIMEOUT_HINT}; "
                                  f"the next run waits for this one")
            what = vk.exception_codes[rc].__name__ if rc in vk.exception_codes else f"VkResult {rc}"
            raise DeviceError(f"the GPU failed while running: {what}")
        if slot is not None:     # the GPU wrote these arrays; nobody else holds them
            return {name: arr for name, arr, _ in self.slots[slot]["items"]}
        for name, (_, view, t, rng) in self.outputs.items():
            if rng is not None:
                self.vk.vkInvalidateMappedMemoryRanges(self.d, 1, [rng])
            if t.storage == "texture":
                from_texels(view, t.shape, t.packed_dim, out=dest[name])
            else:
                host_copy.copy(dest[name].reshape(-1), view)
        return dest

    def settle(self) -> None:
        """Wait for a run that stopped before its fence was reset (a timeout, an interrupt) to finish, so that an
        executor sharing this one's activation arena may run; a DeviceError where it does not within the timeout."""
        if not self._pending:
            return
        with self.dev.lock:
            self._finish_pending()
        if self._pending:
            raise DeviceError(f"an earlier run sharing this run's activation memory did not finish within "
                              f"{self.timeout_ns / 1e9:g} s: {TIMEOUT_HINT}")

    def _finish_pending(self) -> int:
        """Under dev.lock, with a run pending: wait for its fence and reset it (no longer pending) where it signals
        within the timeout; the wait's VkResult."""
        rc = self.vk.lib.vkWaitForFences(self.d, 1, self._fences, 1, self.timeout_ns)
        if rc == self.vk.VK_SUCCESS:
            self.vk.lib.vkResetFences(self.d, 1, self._fences)
            self._pending = False
        return rc

    def _destination(self, out: dict) -> dict:
        """{output name: the array a run's host copy fills}: out's, then a plain set no caller holds, else fresh arrays
        with their pages faulted in (the caller kept every set)."""
        i = free_set(self.plain)
        if i is not None:
            dest = {name: arr for name, arr, _ in self.plain[i]["items"]}
        else:
            dest = {name: fresh(t.shape) for name, (_, _, t, _) in self.outputs.items() if name not in out}
        dest.update(out)
        return dest

    def dispatch_times_ns(self):
        """GPU nanoseconds per dispatch of the last run (profile=True; profile="span": one figure, the whole run),
        or None when the device gives no usable clock."""
        vk, ffi = self.vk, self.vk.ffi
        p = self.dev.profile
        if not p.timestamp_period or not p.timestamp_valid_bits:
            return None
        ticks = []
        for pool, cnt in self.query_pools:
            buf = ffi.new("uint64_t[]", cnt)
            vk.vkGetQueryPoolResults(self.d, pool, 0, cnt, cnt * 8, buf, 8,
                                     vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
            ticks.extend(buf[0:cnt])
        mask = (1 << p.timestamp_valid_bits) - 1 if p.timestamp_valid_bits < 64 else (1 << 64) - 1
        # differences modulo the valid bits survive a counter wrap within the run
        return [((b - a) & mask) * p.timestamp_period for a, b in zip(ticks, ticks[1:])]

    def close(self):
        """Destroy everything this executor created; idempotent, and safe after a failed __init__.
        Every object is destroyed even when one destroy fails; the first failure is raised after."""
        res = self.res
        self.inputs, self.outputs = None, None     # drop numpy views before unmapping
        errors = []
        if res.trash:
            # an upload or run that timed out may still be executing: nothing it uses may be destroyed before
            # it ends (other Sessions' work is never in flight here: they wait for it under the same lock)
            try:
                with self.dev.lock:
                    self.vk.vkQueueWaitIdle(self.dev.queue)
            except Exception as e:
                errors.append(e)
        res.unmap_all(errors)
        if self.kernels is not None:
            try:
                self.kernels.destroy()
            except Exception as e:
                errors.append(e)
            count_live(-self._kernel_objects)
            self._kernel_objects = 0
        res.destroy_all(errors)
        self.slots, self.plain = [], []      # host memory goes only after the memory objects importing it
        if errors:
            raise DeviceError(f"closing the executor failed: {type(errors[0]).__name__}: {errors[0]}") from errors[0]
