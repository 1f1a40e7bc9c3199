"""Session: load -> plan -> execute, with an onnxruntime-like face (the planning and closing shared with Program:
minirt/driver.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .driver import Driver, get_device, plan_graph
from .errors import InputError, MinirtError, ModelError, UnsupportedError
from .infer import bind_inputs, prepare
from .loaders import load
from .options import Options
from .timing import Phases

def _check_out(out: dict, shapes: dict) -> None:
    """An InputError naming the output unless each out= array can take it: a writeable C-contiguous float32 numpy array
    of the output's shape (`shapes`: name -> shape), sharing no memory with another one of `out`."""
    for name, a in out.items():
        want = f"a writeable C-contiguous float32 numpy array of shape {list(shapes[name])}"
        if not isinstance(a, np.ndarray):
            raise InputError(f"out for output '{name}' must be {want}, got {type(a).__name__}")
        bad = [what for what, wrong in ((f"dtype {a.dtype}", a.dtype != np.float32),
                                        (f"shape {list(a.shape)}", tuple(a.shape) != tuple(shapes[name])),
                                        ("not C-contiguous", not a.flags.c_contiguous),
                                        ("read-only", not a.flags.writeable)) if wrong]
        if bad:
            raise InputError(f"out for output '{name}' must be {want}; got {', '.join(bad)}")
    names = list(out)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if np.may_share_memory(out[a], out[b]):
                raise InputError(f"out arrays for outputs '{a}' and '{b}' share memory")


def _input_dtype(name, x, declared):
    """x as the declared dtype's array: float32 exactly; int64 inputs also as int32 (widened), int32 inputs also as
    int64 within int32's range; bool and other integer types exactly. An InputError naming the input otherwise."""
    if x.dtype == np.dtype(declared):
        return x
    if declared == "int64" and x.dtype == np.int32:
        return x.astype(np.int64)
    if declared == "int32" and x.dtype == np.int64:
        if x.size and (x.min() < -2**31 or x.max() >= 2**31):
            raise InputError(f"input '{name}' is int32; the int64 array given has values outside int32's range")
        return x.astype(np.int32)
    also = {"int64": " (or int32)", "int32": " (or int64 within int32's range)"}.get(declared, "")
    raise InputError(f"input '{name}' must be {declared}{also}, got {x.dtype}")


@dataclass(frozen=True)
class IOInfo:
    name: str
    shape: tuple
    dtype: str


class Session(Driver):
    """Runs one model on one Vulkan device.

    storage: "auto" (textures on Adreno, Mali and PowerVR, with buffers for what their images cannot hold; buffers
    elsewhere), "texture" or "buffer".
    precision: "fp32" (default) or "fp16": weights and activations in 16-bit storage with fp32 arithmetic
    (tensor cores through VK_KHR_cooperative_matrix where the device has them); inputs and outputs stay float32.
    A device without 16-bit storage buffers refuses fp16 with an UnsupportedError.
    device: a device index or UUID ("GPU-..." as nvidia-smi shows it, the prefix optional, or a unique leading part)
    as listed by `minirt devices` (default: MINIRT_DEVICE or the best GPU).
    options: a dict of Options fields (minirt/options.py, README "Options"); storage, precision, local_size and
    conv1d_rewrite given as keywords win over the dict. `session.options` is the resulting Options.
    profile: True: a timestamp after every dispatch (profile_records()); "span": one before the first dispatch and
    one after the last (gpu_span_ms()), the run's GPU time with nothing between its dispatches.
    progress: called with a short label ("loading", "planning", "uploading weights", ...) as each
    start-up phase begins (the command line shows it on a terminal).
    startup_ms: milliseconds per start-up phase: load, check, device, plan, alloc, upload, pipelines,
    record (the executor's, for the first planned shape) and first_run (the first run's execution).
    """

    def __init__(self, model, *, storage=None, device=None, weights=None, options=None, profile=False,
                 local_size=None, conv1d_rewrite=None, precision=None, progress=None):
        super().__init__()
        if profile not in (False, True, "span"):
            raise MinirtError(f"profile must be False, True or 'span', got {profile!r}")
        self.profiling = profile
        self._last = None
        self._execs = {}      # input shapes -> Executor (None where the host computes every output)
        self._hosts = {}      # input shapes -> HostPart (minirt/host.py)
        self._progress = progress
        given = dict(storage=storage, local_size=local_size, conv1d_rewrite=conv1d_rewrite, precision=precision)
        self.options = Options.make(options, **{k: v for k, v in given.items() if v is not None})
        self.startup_ms = {}
        phase = Phases(self.startup_ms, progress)
        phase("load", "loading")
        self.graph = load(model, weights=weights, max_load_bytes=self.options.max_load_bytes)
        phase("check", "checking")
        static = all(self.graph.tensor(n).is_static for n in self.graph.inputs)
        # Validate the whole model (supported ops, shapes) before any GPU work. Symbolic dims are tried
        # at 1: shape arithmetic on them only folds once a run binds real shapes.
        trial = {n: tuple(d if isinstance(d, int) else 1 for d in self.graph.tensor(n).shape or ())
                 for n in self.graph.inputs}
        if static:
            self._prepared = prepare(self.graph.copy(), host=True)
        else:
            try:
                self._prepared = prepare(bind_inputs(self.graph, trial), host=True)
            except UnsupportedError:     # ops or tensors minirt cannot run at any size
                raise
            except ModelError:   # wrong at the trial size only? refuse here just what is wrong at every size
                self._prepared = prepare(self.graph.copy(), symbolic=True, host=True)
        phase("device", "opening the device")
        self.device = get_device(device)
        phase(None)
        from .planner import resolve_precision
        from .planner.storage_layout import resolve_storage
        self.storage = resolve_storage(self.options.storage, self.device.profile)
        self.precision = resolve_precision(self.options.precision, self.device.profile)
        self.inputs = [IOInfo(n, self.graph.tensor(n).shape, self.graph.tensor(n).dtype or "float32")
                       for n in self.graph.inputs]
        host = self._prepared.host
        self.outputs = [IOInfo(n, host.shapes[n], host.dtypes[n]) if host and n in host.outputs else
                        IOInfo(n, self._prepared.tensor(n).shape if static else self.graph.tensor(n).shape,
                               self._prepared.tensor(n).dtype or "float32") for n in self.graph.outputs]
        if static:
            self._executor({n: self.graph.tensor(n).shape for n in self.graph.inputs})

    # -- planning ---------------------------------------------------------------------------
    def _plan_for(self, shapes: dict):
        """(the graph for these input shapes, its integer and boolean arithmetic split off to the host (graph.host;
        minirt/host.py); the Plan of its GPU part, None where the host computes every output)."""
        limit = self.device.profile.max_storage_buffer_range if self.storage == "buffer" else 0
        # storage None: the options' own, so that "auto" reaches the planner (mixed storage on texture devices)
        return plan_graph(bind_inputs(self.graph, shapes), self.device.profile, None, self.options,
                          host=True, runtime_gather=limit)

    def plan_for(self, shapes: dict):
        """The Plan of the GPU part for these input shapes (None where the host computes every output)."""
        return self._plan_for(shapes)[1]

    def _executor(self, shapes):
        """(the Executor of these input shapes, or None where the host computes every output; the HostPart)."""
        key = tuple(tuple(shapes[n]) for n in self.graph.inputs)
        if key not in self._execs:
            times = {}
            phase = Phases(times, self._progress)
            phase("plan", "planning")
            g, plan = self._plan_for(shapes)
            phase(None)
            ex = plan and self._make_executor(self.device, plan, profile=self.profiling, progress=self._progress,
                                              timeout_s=self.options.timeout_s)
            self._execs[key], self._hosts[key] = ex, g.host
            if ex is not None and "record" not in self.startup_ms:      # the first executor is the start-up cost
                self.startup_ms.update(times)
                self.startup_ms.update(ex.startup_ms)
            if plan is not None:
                self.plan = plan
        return self._execs[key], self._hosts[key]

    # -- running ----------------------------------------------------------------------------
    def run(self, output_names=None, input_feed=None, *, out=None):
        """run(x) -> the single output; run(None | [names], {name: array}) -> list of outputs. Every returned array is
        the caller's: no later run writes it.

        out: arrays the outputs are written into instead (and returned), reusable across runs: for run(x) one array,
        else {output name: array} for some of the outputs asked for, or a list matching them. Each must be a
        writeable C-contiguous float32 array of that output's shape; a wrong one is an InputError naming the output,
        raised before anything runs."""
        single = input_feed is None and isinstance(output_names, np.ndarray)
        if single:
            if len(self.inputs) != 1:
                raise InputError(f"this model has {len(self.inputs)} inputs; call run(None, {{name: array}})")
            input_feed, output_names = {self.inputs[0].name: output_names}, None
        if input_feed is None:
            raise InputError("run() needs an input array or a {name: array} dict")
        feeds = self._check_feeds(input_feed)
        names = list(output_names) if output_names else [o.name for o in self.outputs]
        for n in names:
            if n not in self.graph.outputs:
                raise InputError(f"'{n}' is not an output of this model (outputs: {', '.join(self.graph.outputs)})")
        out = self._out_dict(out, names, single)
        with self._lock:
            if self._execs is None:
                raise MinirtError("this Session is closed")
            ex, host = self._executor({k: v.shape for k, v in feeds.items()})
            on_host = host.outputs if host is not None else []
            if out:
                if set(out) & set(on_host):
                    raise InputError(f"out= for output(s) {sorted(set(out) & set(on_host))}, which the host computes "
                                     f"from integer inputs (out= takes outputs computed on the GPU)")
                _check_out(out, {n: ex.plan.tensors[n].shape for n in out})
            t0 = time.perf_counter()
            res = {}
            if host is not None:
                gpu_feeds, res = host.run(feeds)
                feeds = {**{k: v for k, v in feeds.items() if k not in host.inputs}, **gpu_feeds}
            if ex is not None:
                res.update(ex.run(feeds, out=out))
                self._last = ex
            self.startup_ms.setdefault("first_run", (time.perf_counter() - t0) * 1e3)
        return res[names[0]] if single else [res[n] for n in names]

    @staticmethod
    def _out_dict(out, names, single) -> dict:
        """run()'s out= as {output name: array}."""
        if out is None:
            return {}
        if isinstance(out, np.ndarray) or not isinstance(out, (dict, list, tuple)):
            if not single:
                raise InputError("out must be {output name: array} or a list with an array for each output asked for")
            out = {names[0]: out}
        elif isinstance(out, dict):
            if single and set(out) - {names[0]}:
                raise InputError(f"out names {sorted(set(out) - {names[0]})}; this run returns '{names[0]}'")
            extra = [n for n in out if n not in names]
            if extra:
                raise InputError(f"out names {extra}, which this run does not return (it returns {names})")
        else:
            if len(out) != len(names):
                raise InputError(f"out has {len(out)} arrays for {len(names)} outputs ({names})")
            out = dict(zip(names, out))
        return out

    def _check_feeds(self, feed):
        if not isinstance(feed, dict):
            raise InputError("inputs must be a dict {name: numpy array}")
        want = {i.name: i for i in self.inputs}
        extra = [k for k in feed if k not in want]
        missing = [k for k in want if k not in feed]
        if extra or missing:
            raise InputError("inputs do not match the model: "
                             + (f"unknown {extra} " if extra else "") + (f"missing {missing} " if missing else "")
                             + f"(expected {list(want)})")
        out = {}
        for name, x in feed.items():
            if not isinstance(x, np.ndarray):
                raise InputError(f"input '{name}' must be a numpy array, got {type(x).__name__}")
            x = _input_dtype(name, x, want[name].dtype or "float32")
            decl = want[name].shape
            if decl is not None and (len(decl) != x.ndim or any(isinstance(d, int) and d != s for d, s in zip(decl, x.shape))):
                raise InputError(f"input '{name}' expects shape {list(decl)}, got {list(x.shape)}")
            out[name] = x if x.flags.c_contiguous else np.ascontiguousarray(x).reshape(x.shape)
        return out

    def profile_records(self):
        """Per-dispatch GPU timing of the last run (Session(..., profile=True)): a list of
        minirt.dispatch_timing.DispatchRecord, in dispatch order."""
        from .dispatch_timing import records_of
        if not self.profiling:
            raise MinirtError("profiling is off: create the Session with profile=True")
        if self.profiling == "span":
            raise MinirtError("this Session times whole runs (profile='span'): gpu_span_ms() gives the last one")
        if self._last is None:
            raise MinirtError("no run yet: call run() first")
        return records_of(self._last.plan, self._last.dispatch_times_ns(), self.device.profile)

    def gpu_span_ms(self):
        """GPU milliseconds of the last run from two timestamps, one before its first dispatch and one after its
        last (Session(..., profile="span")): no stamps between dispatches to perturb it."""
        if self.profiling != "span":
            raise MinirtError("create the Session with profile='span' to time whole runs")
        if self._last is None:
            raise MinirtError("no run yet: call run() first")
        t = self._last.dispatch_times_ns()
        return t[0] / 1e6 if t else None

    # -- lifetime (close() and the context manager: minirt.driver.Driver) ----------------------
    def _release(self) -> list:
        execs, self._execs, self._last = self._execs or {}, None, None
        return list(execs.values())

    def _is_open(self) -> bool:
        return bool(self._execs)
