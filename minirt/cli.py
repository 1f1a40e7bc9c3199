"""The `minirt` command line."""
from __future__ import annotations

import hashlib
import sys
import time

import click
import numpy as np

from .errors import DeviceError, InputError, MinirtError, ModelError

# Exit codes (documented in the README): distinct so scripts can tell failures apart.
EXIT_OK, EXIT_USAGE, EXIT_MODEL, EXIT_RUNTIME, EXIT_NONDETERMINISTIC = 0, 2, 3, 4, 5


def _fail(e: Exception) -> None:
    code = EXIT_MODEL if isinstance(e, (ModelError, InputError)) else EXIT_RUNTIME
    click.echo(f"error: {e}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="minirt")
def main():
    """minirt: run ONNX and safetensors models on any Vulkan GPU (or the CPU via lavapipe).

    \b
    Exit codes: 0 success, 2 usage error, 3 bad model or input, 4 runtime or device failure,
    5 nondeterminism found by --repeat.
    """


storage_opt = click.option("--storage", type=click.Choice(["auto", "texture", "buffer"]), default="auto",
                           show_default=True, help="Where tensors live: auto = textures on mobile GPUs, else buffers.")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("input", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the (first) output to this .npy file.")
@storage_opt
@click.option("--device", type=int, default=None, help="Device index from `minirt devices` (default: best GPU).")
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run N times and report distinct outputs; exit 5 if they differ.")
@click.option("--local-size", default=None, metavar="X,Y,Z",
              help="Force one local work-group size (experiments; also MINIRT_LOCAL_SIZE).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def run(model, input, output, storage, device, repeat, local_size, quiet):
    """Run MODEL on INPUT (.npy, or a 16 kHz .wav for Whisper encoders) and summarise the output.

    \b
    Examples:
      minirt run models/whisper-tiny-encoder.onnx models/whisper-tiny-input.npy -o out.npy
      minirt run whisper-tiny.en/model.safetensors models/speech-sample.wav   # log-mel computed
      minirt run model.onnx x.npy --repeat 60      # determinism check; exit 5 if outputs differ
    """
    from .session import Session
    try:
        x = None if input.lower().endswith(".wav") else _load_input(input)
        with Session(model, storage=storage, device=device, local_size=local_size) as s:
            if len(s.inputs) != 1:
                raise InputError(f"{model} has {len(s.inputs)} inputs; `minirt run` feeds one")
            if x is None:
                x = _load_wav(input, s.inputs[0])
            s.run(x)   # warm-up: the first run pays for planning when shapes are dynamic
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
            click.echo(f"device   {p.name} ({p.device_type}, {p.driver}), storage {s.storage}")
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


@main.command()
def devices():
    """List Vulkan devices with their type, driver, key limits and features.

    \b
    Example:
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
                   f"subgroup {p.subgroup_size}; shared memory {p.max_shared_memory} B")
        click.echo(f"      push constants {p.max_push_constants} B; image3D {p.max_image_3d}; "
                   f"storage buffer range {p.max_storage_buffer_range >> 20} MiB")
        feats = [f for f, on in (("fp16", p.fp16), ("16-bit storage", p.storage16),
                                 ("cooperative matrix", p.cooperative_matrix)) if on]
        click.echo(f"      features: {', '.join(feats) or 'none of fp16 / 16-bit storage / cooperative matrix'}; "
                   f"timestamps {p.timestamp_valid_bits} bits x {p.timestamp_period} ns")
    click.echo("(* = the device minirt picks; MINIRT_DEVICE=<index> overrides)")


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@storage_opt
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...",
              help="Concrete shape for an input with symbolic dims.")
def plan(model, storage, shapes):
    """Print the plan: every dispatch with its node, kernel, sizes and local size.

    \b
    Example:
      minirt plan models/whisper-tiny-encoder.onnx --storage texture
    """
    from .session import Session
    try:
        given = {}
        for s in shapes:
            name, _, dims = s.partition("=")
            given[name] = tuple(int(d) for d in dims.split(","))
        from .infer import bind_inputs  # noqa: F401
        from .loaders import load
        g = load(model)
        for n in g.inputs:
            t = g.tensor(n)
            if n not in given:
                if not t.is_static:
                    raise InputError(f"input '{n}' has symbolic shape {list(t.shape)}; pass --shape {n}=...")
                given[n] = t.shape
        with Session(model, storage=storage) as s:
            p = s.plan_for(given)
        click.echo(format_plan(p))
    except MinirtError as e:
        _fail(e)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("input", required=False, type=click.Path(dir_okay=False))
@storage_opt
@click.option("--runs", default=20, show_default=True, help="Timed runs; the report gives medians.")
@click.option("--warmup", default=3, show_default=True, help="Untimed runs first.")
@click.option("--top", type=int, default=None, help="Show only the N slowest dispatches in the table.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write the records as JSON.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), help="Write the records as CSV.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="Write a Chrome trace (open it in Perfetto).")
def profile(model, input, storage, runs, warmup, top, json_path, csv_path, trace_path):
    """Per-dispatch GPU time from a Vulkan timestamp query pool.

    INPUT is a .npy file; without it a seeded random input of the model's shape is used.

    \b
    Example:
      minirt profile models/whisper-tiny-encoder.onnx --runs 50 --trace whisper.json
    """
    from . import profile as prof
    from .session import Session
    try:
        with Session(model, storage=storage, profile=True) as s:
            x = prof.load_input(s, input)
            res = prof.profile_session(s, x, runs=runs, warmup=warmup)
        click.echo(prof.format_report(res, top))
        for path, fn in ((json_path, prof.to_json), (csv_path, prof.to_csv), (trace_path, prof.to_trace)):
            if path:
                with open(path, "w") as f:
                    f.write(fn(res))
                click.echo(f"wrote {path}")
    except MinirtError as e:
        _fail(e)


def format_plan(p) -> str:
    lines = [f"storage {p.storage}; {len(p.dispatches)} dispatches; "
             f"{sum(d.flops for d in p.dispatches) / 1e9:.3f} GFLOP"]
    lines.append(f"{'#':>4}  {'node':<28} {'op':<20} {'kernel':<26} {'output shape':<20} {'global':<18} local")
    for i, d in enumerate(p.dispatches):
        out = p.tensors[d.writes[0]].shape if d.writes else ()
        lines.append(f"{i:>4}  {d.node[:28]:<28} {d.op:<20} {d.kernel:<26} {str(list(out)):<20} "
                     f"{str(list(d.global_size)):<18} {list(d.local_size)}")
    for node, notes in p.notes.items():
        for n in notes:
            lines.append(f"note  {node}: {n}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
