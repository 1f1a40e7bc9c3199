"""The `minirt` command line."""
from __future__ import annotations

import hashlib
import sys
import time

import click
import numpy as np

from .errors import InputError, MinirtError, ModelError

# Exit codes (documented in the README): distinct so scripts can tell failures apart.
EXIT_OK, EXIT_USAGE, EXIT_MODEL, EXIT_RUNTIME, EXIT_NONDETERMINISTIC = 0, 2, 3, 4, 5


def _fail(e: Exception) -> None:
    code = EXIT_MODEL if isinstance(e, (ModelError, InputError)) else EXIT_RUNTIME
    click.echo(f"error: {e}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="minirt")
def main():
    """minirt: run ONNX and safetensors models on any Vulkan GPU (or the CPU via lavapipe).

    \b
    Examples:
      minirt devices
      minirt run models/whisper-tiny-encoder.onnx models/whisper-tiny-input.npy
      minirt plan models/whisper-tiny-encoder.onnx
      minirt profile models/whisper-tiny-encoder.onnx --runs 10
    `minirt COMMAND --help` shows each command's options and examples.

    \b
    Exit codes:
      0  success
      2  usage error (bad option or argument, e.g. a --local-size beyond the device's limits)
      3  bad model or input (unreadable or malformed file, unsupported op or shape, wrong input)
      4  runtime or device failure (no Vulkan driver, out of memory, GPU error or timeout)
      5  nondeterminism: `run --repeat` saw different outputs for the same input
      1  an internal error (a bug: the traceback says where)

    \b
    Progress (loading, planning, uploading weights, runs) is shown on stderr when it is a terminal;
    --quiet or a pipe turns it off. Compiled pipelines are cached in $XDG_CACHE_HOME/minirt
    (MINIRT_CACHE_DIR overrides, MINIRT_NO_PIPELINE_CACHE=1 turns it off).
    """


storage_opt = click.option("--storage", type=click.Choice(["auto", "texture", "buffer"]), default=None,
                           help="Where tensors live: auto (the default) = textures on mobile GPUs, else buffers.")
device_opt = click.option("--device", type=int, default=None,
                          help="Device index from `minirt devices` (default: MINIRT_DEVICE or the best GPU).")
precision_opt = click.option("--precision", type=click.Choice(["fp32", "fp16"]), default=None,
                             help="fp32 (the default), or fp16: weights and activations in 16-bit storage, fp32 arithmetic (tensor cores "
                                  "where the device has VK_KHR_cooperative_matrix); inputs and outputs stay float32.")
quiet_opt = click.option("-q", "--quiet", is_flag=True,
                         help="No progress display on stderr (there is none anyway when stderr is not a terminal).")
rewrite_opt = click.option("--no-conv1d-rewrite", is_flag=True,
                           help="Keep 1-D convs on the 1-D kernel (no conv1d-as-conv2d rewrite; also "
                                "MINIRT_NO_CONV1D_REWRITE=1).")


def _parse_local_size(ctx, param, value):
    if value is None or value == "":
        return None
    from .options import parse_local_size
    try:
        return parse_local_size(value)
    except MinirtError:
        raise click.BadParameter(f"{value!r} is not 1 to 3 positive integers such as 16,4,1",
                                 ctx=ctx, param=param) from None


local_size_opt = click.option("--local-size", default=None, metavar="X,Y,Z", callback=_parse_local_size,
                              help="Force one local work-group size on every kernel that takes one (experiments; "
                                   "also MINIRT_LOCAL_SIZE); it must fit the device's limits.")


def _parse_options(ctx, param, value):
    """--option KEY=VALUE pairs as a dict, checked by Options (an unknown key or bad value is a usage error)."""
    from .options import Options
    out = {}
    for item in value:
        key, sep, v = item.partition("=")
        if not sep:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx=ctx, param=param)
        out[key.strip()] = v.strip()
    try:
        Options.make(out)
    except MinirtError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    return out


option_opt = click.option("--option", "options", multiple=True, metavar="KEY=VALUE", callback=_parse_options,
                          help="A Session option (`minirt options` lists them); repeatable.")


def _check_local_size(local, device):
    """A forced local size beyond the device's limits is a usage error (exit 2), found before any work."""
    if local is None:
        return
    from .lwg import check_local_size
    from .session import get_device
    try:
        check_local_size(local, get_device(device).profile)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=click.get_current_context(), param_hint="'--local-size'") from None


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("input", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the (first) output to this .npy file.")
@storage_opt
@device_opt
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run N times and report distinct outputs; exit 5 if they differ.")
@precision_opt
@local_size_opt
@rewrite_opt
@option_opt
@quiet_opt
def run(model, input, output, storage, device, repeat, precision, local_size, no_conv1d_rewrite, options, quiet):
    """Run MODEL on INPUT (.npy, or a 16 kHz .wav for Whisper encoders) and summarise the output.

    \b
    Examples:
      minirt run models/whisper-tiny-encoder.onnx models/whisper-tiny-input.npy -o out.npy
      minirt run whisper-tiny.en/model.safetensors models/speech-sample.wav   # log-mel computed
      minirt run model.onnx x.npy --repeat 60      # determinism check; exit 5 if outputs differ
      minirt run model.onnx x.npy --precision fp16 # 16-bit storage, tensor cores where available
      minirt run model.onnx x.npy --local-size 64,1,1 --no-conv1d-rewrite   # experiments
    """
    from .session import Session
    try:
        _check_local_size(local_size, device)
        x = None if input.lower().endswith(".wav") else _load_input(input)
        with _Status(quiet) as status, Session(model, storage=storage, device=device, local_size=local_size,
                                               conv1d_rewrite=False if no_conv1d_rewrite else None, precision=precision,
                                               options=options, progress=status) as s:
            if len(s.inputs) != 1:
                raise InputError(f"{model} has {len(s.inputs)} inputs; `minirt run` feeds one")
            if x is None:
                x = _load_wav(input, s.inputs[0])
            status("first run")
            s.run(x)   # warm-up: the first run pays for planning when shapes are dynamic
            status.done()
            outs, walls = [], []
            with _progress(repeat, "running", quiet or repeat < 3) as bar:
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    outs.append(s.run(x))
                    walls.append(time.perf_counter() - t0)
                    bar.update(1)
            y = outs[0]
            p = s.device.profile
            click.echo(f"output   {s.outputs[0].name}: shape {list(y.shape)} {y.dtype}")
            click.echo(f"values   min {y.min():.6g}  max {y.max():.6g}  mean {y.mean():.6g}")
            click.echo(f"device   {p.name} ({p.device_type}, {p.driver}), storage {s.storage}, "
                       f"precision {s.precision}")
            walls_ms = sorted(w * 1e3 for w in walls)
            click.echo(f"run      {walls_ms[len(walls_ms) // 2]:.2f} ms wall, median of {repeat} "
                       f"(Session.run, upload and download included)")
            code = EXIT_OK
            if repeat > 1:
                digests = {hashlib.sha256(o.tobytes()).hexdigest() for o in outs}
                dev = max(float(np.max(np.abs(o.astype(np.float64) - y))) for o in outs)
                click.echo(f"repeat   {repeat} runs: {len(digests)} distinct output(s), max deviation {dev:.3g}, "
                           f"wall min {walls_ms[0]:.2f} / max {walls_ms[-1]:.2f} ms")
                if len(digests) > 1:
                    click.echo("error: outputs differ between runs of the same input", err=True)
                    code = EXIT_NONDETERMINISTIC
        if output:
            np.save(output, y)
            click.echo(f"wrote    {output}")
        sys.exit(code)
    except MinirtError as e:
        _fail(e)


def _load_input(path):
    try:
        x = np.load(path, allow_pickle=False)
    except Exception as e:
        raise InputError(f"{path}: not a readable .npy file ({e})") from None
    if not isinstance(x, np.ndarray):      # an .npz archive
        raise InputError(f"{path}: not a .npy array file")
    if x.dtype != np.float32 and np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
    return x


def _load_wav(path, inp):
    """Whisper's log-mel of a WAV, shaped for the model's input [1, n_mels, n_frames]."""
    from .audio import whisper_features
    shape = inp.shape
    if shape is None or len(shape) != 3 or not all(isinstance(d, int) for d in shape[1:]):
        raise InputError(f"{path}: a .wav input needs a Whisper encoder whose input is [1, n_mels, n_frames]; "
                         f"'{inp.name}' is {list(shape) if shape else 'of unknown shape'}")
    return whisper_features(path, n_mels=shape[1], n_frames=shape[2])


class _NoBar:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass

    def update(self, n):
        pass


def _progress(total, label, quiet):
    """A progress bar on a terminal; nothing when piped or quiet."""
    if quiet or not sys.stderr.isatty():
        return _NoBar()
    return click.progressbar(length=total, label=label, file=sys.stderr)


class _Status:
    """One phase line on stderr ("| uploading weights... 2.1 s"), redrawn by a thread while a phase runs
    and erased at the end; nothing when stderr is not a terminal or with --quiet. Call it with a label
    to start a phase (Session(progress=...) does)."""

    FRAMES = "|/-\\"

    def __init__(self, quiet=False):
        self.on = not quiet and sys.stderr.isatty()
        self.label, self.t0, self.i = None, 0.0, 0
        self._thread = None
        import threading
        self._stop, self._lock = threading.Event(), threading.Lock()

    def __call__(self, label):
        if not self.on:
            return
        with self._lock:
            self.label, self.t0 = label, time.perf_counter()
            self._draw()
        if self._thread is None:
            import threading
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def _loop(self):
        while not self._stop.wait(0.1):
            with self._lock:
                self._draw()

    def _draw(self):
        if self.label is None:
            return
        self.i += 1
        sys.stderr.write(f"\r\033[K{self.FRAMES[self.i % 4]} {self.label}... {time.perf_counter() - self.t0:.1f} s")
        sys.stderr.flush()

    def done(self):
        """Erase the line; later calls draw nothing."""
        if not self.on:
            return
        self.on = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self.label is not None:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()
            self.label = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.done()


@main.command()
def devices():
    """List Vulkan devices with their type, driver, key limits and features.

    \b
    Examples:
      minirt devices
      MINIRT_DEVICE=1 minirt run model.onnx x.npy   # pick device 1
    """
    from .vk.device import choose, physical_devices
    try:
        devs = physical_devices()
        chosen = choose(devs)[0]
    except MinirtError as e:
        _fail(e)
    for i, _, p in devs:
        mark = "*" if i == chosen else " "
        click.echo(f"{mark} [{i}] {p.name}  ({p.device_type}, vendor {p.vendor}, Vulkan {p.api_version})")
        click.echo(f"      driver: {p.driver}")
        click.echo(f"      work group: max {p.max_invocations} invocations, size {list(p.max_local_size)}; "
                   f"subgroup {p.subgroup_size}; shared memory {p.max_shared_memory} B"
                   + (f"; {p.compute_units} multiprocessors" if p.compute_units else ""))
        click.echo(f"      push constants {p.max_push_constants} B; image3D {p.max_image_3d}; "
                   f"storage buffer range {p.max_storage_buffer_range >> 20} MiB")
        feats = [f for f, on in (("fp16", p.fp16), ("16-bit storage", p.storage16),
                                 ("cooperative matrix", p.cooperative_matrix)) if on]
        click.echo(f"      features: {', '.join(feats) or 'none of fp16 / 16-bit storage / cooperative matrix'}; "
                   f"timestamps {p.timestamp_valid_bits} bits x {p.timestamp_period} ns")
        if p.coopmat_shapes:
            shapes = sorted({f"{m}x{n}x{k} {a}*{b}+{c}" for m, n, k, a, b, c, _ in p.coopmat_shapes})
            click.echo(f"      cooperative matrix (subgroup, MxNxK A*B+C): {', '.join(shapes)}")
    click.echo("(* = the device minirt picks; MINIRT_DEVICE=<index> overrides)")


@main.command(name="options")
@click.option("--markdown", is_flag=True, help="As a Markdown table (the README's).")
def options_cmd(markdown):
    """List the Session options: name, default, what it does, where it matters.

    Set them with `--option KEY=VALUE` on run, plan and profile, or Session(model, options={...}) in Python.
    """
    from .options import option_table
    rows = option_table()
    if markdown:
        click.echo("| option | default | what it does | matters on |\n| --- | --- | --- | --- |")
        for name, default, doc, where in rows:
            click.echo(f"| `{name}` | {default} | {doc} | {where} |")
        return
    nw = max(len(r[0]) for r in rows)
    dw = max(len(r[1]) for r in rows)
    for name, default, doc, where in rows:
        click.echo(f"{name:<{nw}}  {default:<{dw}}  {doc}" + ("" if where == "any" else f" [{where}]"))


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@storage_opt
@device_opt
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...",
              help="Concrete shape for an input with symbolic dims.")
@precision_opt
@local_size_opt
@rewrite_opt
@option_opt
def plan(model, storage, device, shapes, precision, local_size, no_conv1d_rewrite, options):
    """Print the plan: per node its op, input and output shapes, the kernels it dispatches (with global
    and local sizes), then the planner's notes (conv1d rewrite, conv routing and why).

    Nothing runs and no weights are uploaded: the model is loaded, checked and planned for the device.

    \b
    Examples:
      minirt plan models/whisper-tiny-encoder.onnx
      minirt plan models/whisper-tiny-encoder.onnx --storage texture --no-conv1d-rewrite
      minirt plan dynamic.onnx --shape input_features=1,80,3000
    """
    from .infer import bind_inputs, prepare
    from .loaders import load
    from .options import Options
    from .planner import make_plan
    from .session import get_device
    try:
        given = {}
        for s in shapes:
            name, _, dims = s.partition("=")
            try:
                given[name] = tuple(int(d) for d in dims.split(","))
            except ValueError:
                raise click.BadParameter(f"{s!r} is not NAME=D0,D1,... (integers)", param_hint="'--shape'") from None
        g = load(model)
        for n in g.inputs:
            t = g.tensor(n)
            if n not in given:
                if not t.is_static:
                    raise InputError(f"input '{n}' has symbolic shape {list(t.shape)}; pass --shape {n}=...")
                given[n] = t.shape
        _check_local_size(local_size, device)
        given_opts = {k: v for k, v in dict(precision=precision, storage=storage, local_size=local_size,
                                             conv1d_rewrite=False if no_conv1d_rewrite else None).items()
                      if v is not None}
        opts = Options.make(options, **given_opts)
        dev = get_device(device)
        p = make_plan(prepare(bind_inputs(g, given)), dev.profile, None, opts)
        click.echo(f"device {dev.profile.name}")
        changed = opts.changed()
        if changed:
            click.echo("options " + ", ".join(f"{k}={v}" for k, v in changed.items()))
        click.echo(format_plan(p))
    except MinirtError as e:
        _fail(e)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("input", required=False, type=click.Path(dir_okay=False))
@storage_opt
@device_opt
@click.option("--runs", type=click.IntRange(min=1), default=20, show_default=True,
              help="Timed runs; the report gives medians.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--top", type=int, default=None, help="Show only the N slowest dispatches in the table.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the records as JSON.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Write the records as CSV.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="Write a Chrome trace (open it in Perfetto).")
@precision_opt
@local_size_opt
@rewrite_opt
@option_opt
@quiet_opt
def profile(model, input, storage, device, runs, warmup, top, json_path, csv_path, trace_path, precision, local_size,
            no_conv1d_rewrite, options, quiet):
    """Per-dispatch GPU time from a Vulkan timestamp query pool.

    INPUT is a .npy file (or a 16 kHz .wav for Whisper encoders); without it a seeded random input of
    the model's shape is used.

    \b
    Examples:
      minirt profile models/whisper-tiny-encoder.onnx --runs 50 --trace whisper.json
      minirt profile model.onnx x.npy --top 10 --csv dispatches.csv --quiet
    """
    from . import profile as prof
    from .session import Session
    try:
        _check_local_size(local_size, device)
        x = _load_input(input) if input and not input.lower().endswith(".wav") else None
        with _Status(quiet) as status, Session(model, storage=storage, device=device, profile=True,
                                               local_size=local_size,
                                               conv1d_rewrite=False if no_conv1d_rewrite else None,
                                               precision=precision, options=options, progress=status) as s:
            if x is None:
                x = _load_wav(input, s.inputs[0]) if input else prof.load_input(s, None)
            for i in range(warmup):
                status(f"warm-up run {i + 1}/{warmup}")
                s.run(x)
            status.done()
            with _progress(runs, "profiling", quiet or runs < 3) as bar:
                res = prof.profile_session(s, x, runs=runs, warmup=0, progress=lambda i: bar.update(1))
        click.echo(prof.format_report(res, top))
        for path, fn in ((json_path, prof.to_json), (csv_path, prof.to_csv), (trace_path, prof.to_trace)):
            if path:
                with open(path, "w") as f:
                    f.write(fn(res))
                click.echo(f"wrote {path}")
    except MinirtError as e:
        _fail(e)


def _shapes(plan, names):
    return " ".join(str(list(plan.tensors[n].shape)).replace(" ", "") for n in names) or "-"


def format_plan(p) -> str:
    """Per node (in dispatch order): op, input and output shapes, then one line per dispatch with its
    kernel, global and local size; then the planner's notes per node (conv1d rewrite, conv route and the
    rule that decided it). Nodes that dispatch nothing (free reshapes, folded shape arithmetic) appear
    only through their notes, if any."""
    from .plan import CONSTANT, SCRATCH, WEIGHT
    by_node, order = {}, []
    for d in p.dispatches:
        if d.node not in by_node:
            by_node[d.node] = []
            order.append(d.node)
        by_node[d.node].append(d)
    # a node's outputs: what it writes that another node (or the caller) reads
    read_by = {}
    for d in p.dispatches:
        for n in d.reads:
            read_by.setdefault(p.root(n), set()).add(d.node)
    for n in p.outputs:
        read_by.setdefault(p.root(n), set()).add("")
    params = (WEIGHT, CONSTANT, SCRATCH)
    rows = []
    for node in order:
        ds = by_node[node]
        written = {w for d in ds for w in d.writes}
        ins, consts, outs = [], 0, []
        for d in ds:
            for n in d.reads:
                role = p.tensors[p.root(n)].role
                if role in params:
                    consts += role != SCRATCH and n not in ins
                    continue
                if n not in written and n not in ins:
                    ins.append(n)
        for w in sorted(written, key=[x for d in ds for x in d.writes].index):
            if p.tensors[p.root(w)].role != SCRATCH and read_by.get(p.root(w), set()) - {node}:
                outs.append(w)
        if not outs:
            outs = [w for w in written if p.tensors[p.root(w)].role != SCRATCH]
        notes = " ".join(p.notes.get(node, []))
        conv = ""
        if ds[0].op == "Conv":
            conv = "1d->2d " if "conv1d rewrite: yes" in notes else ""
            route = next((n.split()[1] for n in p.notes.get(node, []) if n.startswith("route: ")), "")
            conv += route
        ins_s = _shapes(p, ins) + (f" +{consts} const" if consts else "")
        rows.append((node, ds[0].op, ins_s, _shapes(p, outs), conv, ds))
    nw = min(max([4] + [len(r[0]) for r in rows]), 36)
    ow = max([2] + [len(r[1]) for r in rows])
    iw = min(max([6] + [len(r[2]) for r in rows]), 34)
    uw = min(max([7] + [len(r[3]) for r in rows]), 22)
    cw = max([4] + [len(r[4]) for r in rows]) if any(r[4] for r in rows) else -2   # no column without convs
    kw = max([6] + [len(d.kernel) for r in rows for d in r[5]])
    io = "direct " + "+".join(p.direct_io) if p.direct_io else "staged"
    lines = [f"storage {p.storage}, precision {p.precision}; {len(p.dispatches)} dispatches from {len(rows)} nodes; "
             f"{sum(d.flops for d in p.dispatches) / 1e9:.3f} GFLOP",
             f"run: inputs and outputs {io}, zero-copy outputs {'on' if p.zero_copy else 'off'}, "
             f"fence spin {p.spin_ms:g} ms",
             f"{'node':<{nw}}  {'op':<{ow}}  {'inputs':<{iw}}  {'outputs':<{uw}}  "
             + (f"{'conv':<{cw}}  " if cw > 0 else "") + f"{'kernel':<{kw}}  {'global':<16} local"]

    def cut(s, w):
        return s if len(s) <= w else s[:w - 2] + ".."

    for node, op, ins_s, outs_s, conv, ds in rows:
        for i, d in enumerate(ds):
            left = (f"{cut(node, nw):<{nw}}  {op:<{ow}}  {cut(ins_s, iw):<{iw}}  {cut(outs_s, uw):<{uw}}  "
                    + (f"{conv:<{cw}}  " if cw > 0 else "")) if i == 0 else " " * (nw + ow + iw + uw + cw + 10)
            lines.append(f"{left}{d.kernel:<{kw}}  {str(list(d.global_size)).replace(' ', ''):<16} "
                         f"{str(list(d.local_size)).replace(' ', '')}")
    if p.notes:
        lines += ["", "notes:"]
        for node, notes in p.notes.items():
            for n in notes:
                lines.append(f"  {node}: {n}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
