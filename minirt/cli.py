"""The `minirt` command line."""
from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
import time

import click
import numpy as np

from .errors import DeviceError, InputError, MinirtError, ModelError, UnsupportedError

# Exit codes (documented in the README): distinct so scripts can tell failures apart.
EXIT_OK, EXIT_USAGE, EXIT_MODEL, EXIT_RUNTIME, EXIT_NONDETERMINISTIC = 0, 2, 3, 4, 5


def _fail(e: Exception) -> None:
    code = EXIT_MODEL if isinstance(e, (ModelError, InputError)) else EXIT_RUNTIME
    if isinstance(e, MemoryError):      # the host ran out of memory: a runtime failure, not a bug
        e = f"out of host memory{f' ({e})' if str(e) else ''}"
    click.echo(f"error: {e}", err=True)
    sys.exit(code)


class _UsageError(click.ClickException):
    """A usage error that is not about one argument (an environment variable): exit 2 with one line, no synopsis."""
    exit_code = EXIT_USAGE

    def show(self, file=None):
        click.echo(f"error: {self.format_message()}", err=True)


def _check_environment():
    """Every MINIRT_* variable that sets a default (read_environment checks them) and MINIRT_DEVICE's form, as a
    usage error naming the variable, before any work."""
    from .options import read_environment
    try:
        env = read_environment()
    except MinirtError as e:
        raise _UsageError(str(e)) from None
    from .vk.device import parse_device
    try:
        parse_device(env.device)
    except ValueError as e:
        raise _UsageError(f"environment variable MINIRT_DEVICE={env.device!r} is not a device index or UUID: {e} "
                          f"(see `minirt devices`)") from None


def _check_device(device):
    """--device (or MINIRT_DEVICE) naming no device is a usage error (exit 2); no Vulkan at all stays a runtime
    failure (DeviceError, exit 4)."""
    from .options import environment
    if device is None and not environment().device:
        return
    from .vk.device import choose, physical_devices
    devs = physical_devices()
    try:
        choose(devs, device)
    except DeviceError as e:
        if device is None:       # the message names MINIRT_DEVICE
            raise _UsageError(str(e)) from None
        raise click.BadParameter(str(e), ctx=click.get_current_context(), param_hint="'--device'") from None


def _device_form(ctx, param, value):
    """--device's form (an index or a UUID) is checked while parsing; whether such a device exists, by _check_device."""
    from .vk.device import parse_device
    try:
        parse_device(value)
    except ValueError as e:
        raise click.BadParameter(f"{value!r} is not a device index or UUID: {e}", ctx=ctx, param=param) from None
    return value


def _check_output(ctx, param, value):
    """An output path that cannot be written is a usage error found while parsing, before anything runs: its
    folder must exist and take a new file (probed with one, as the write will make one there)."""
    if value is None:
        return None

    def bad(why):
        return click.BadParameter(f"{value!r}: {why}", ctx=ctx, param=param)

    if value.endswith(("/", os.sep)) or os.path.isdir(value):
        raise bad("is a folder; give a file name")
    target = os.path.realpath(value)      # a symlink is written through, as open() would
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise bad(f"folder {os.path.dirname(value) or '.'!r} does not exist")
    if os.path.exists(target) and not os.access(target, os.W_OK):
        raise bad("the file is not writable")
    if _special(target):        # /dev/null, a pipe: written in place, no file is made beside it
        return value
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(target)}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise bad(f"cannot create a file in {os.path.dirname(value) or '.'!r} ({e.strerror})") from None
    return value


def _special(path) -> bool:
    """Whether path exists and is not a regular file (a device such as /dev/null, a named pipe)."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


class _WriteError(click.ClickException):
    """Writing an output failed (a full disk, an I/O error): exit 4 with one line naming the file."""
    exit_code = EXIT_RUNTIME

    def show(self, file=None):
        click.echo(f"error: {self.format_message()}", err=True)


def _write_atomic(path, write):
    """Call write(binary file) on a temporary file beside `path`, then rename it over `path`: an error (a full
    disk, an interrupt) leaves the old file or none, never a partial one. Exactly `path` is written (np.save to
    an open file adds no .npy). An OSError is a _WriteError naming the path."""
    target = os.path.realpath(path)
    folder, name = os.path.split(target)
    tmp = None
    try:
        if _special(target):     # renaming over /dev/null would replace the device with a file
            with open(target, "wb") as f:
                write(f)
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        # mkstemp makes the file 0600; give it what a plain open() would (or the mode of the file it replaces)
        if os.path.exists(target):
            mode = os.stat(target).st_mode & 0o7777
        else:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise _WriteError(f"could not write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


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
      minirt transcribe speech.wav --model tiny.en
      minirt models
    `minirt COMMAND --help` shows each command's options and examples.

    \b
    Exit codes:
      0  success
      2  usage error (bad option, argument or MINIRT_* variable, e.g. a --local-size beyond the device's
         limits, or an output path whose folder does not exist)
      3  bad model or input (unreadable or malformed file, unsupported op or shape, wrong input)
      4  runtime or device failure (no Vulkan driver, out of memory, GPU error or timeout; an output file
         that could not be written, e.g. a full disk)
      5  nondeterminism: `run --repeat` saw different outputs for the same input
      1  an internal error (a bug: the traceback says where)

    \b
    Progress (loading, planning, uploading weights, runs) is shown on stderr when it is a terminal;
    --quiet or a pipe turns it off. Compiled pipelines are cached in $XDG_CACHE_HOME/minirt
    (MINIRT_CACHE_DIR overrides, MINIRT_NO_PIPELINE_CACHE=1 turns it off).
    """


storage_opt = click.option("--storage", type=click.Choice(["auto", "texture", "buffer"]), default=None,
                           help="Where tensors live: auto (the default) = textures on mobile GPUs, else buffers.")
device_opt = click.option("--device", default=None, callback=_device_form, metavar="INDEX|UUID",
                          help="Device index or UUID from `minirt devices` (nvidia-smi's GPU-... form too, or a unique "
                               "leading part of it; default: MINIRT_DEVICE or the best GPU).")
precision_opt = click.option("--precision", type=click.Choice(["fp32", "fp16"]), default=None,
                             help="fp32 (the default), or fp16: weights and activations in 16-bit storage, fp32 arithmetic (tensor cores "
                                  "where the device has VK_KHR_cooperative_matrix); inputs and outputs stay float32.")
fp32_precision_opt = click.option(
    "--fp32-precision", type=click.Choice(["ieee", "f16x3"]), default=None,
    help="How fp32 GEMMs multiply: ieee (the default: fp32 arithmetic), or f16x3 (operands split into fp16 hi and lo "
         "parts, three products on the tensor cores, fp32 accumulation; about fp32's accuracy). Same as --option "
         "fp32_precision=...")


def _with_fp32_precision(options, fp32_precision):
    """The --option dict with --fp32-precision in it (checked with the rest when the Session is made)."""
    return {**options, "fp32_precision": fp32_precision} if fp32_precision else options


quiet_opt = click.option("-q", "--quiet", is_flag=True,
                         help="No progress display on stderr (there is none anyway when stderr is not a terminal).")
rewrite_opt = click.option("--no-conv1d-rewrite", is_flag=True,
                           help="Keep 1-D convs on the 1-D kernel (no conv1d-as-conv2d rewrite; also "
                                "MINIRT_NO_CONV1D_REWRITE=1).")

# The Whisper commands' --model and --compute-type (transcribe, serve)
whisper_model_opt = click.option(
    "--model", "model_path", required=True, type=click.Path(),
    help="A Whisper model folder: Hugging Face (model.safetensors, config.json, tokenizer.json) or CTranslate2 / "
         "faster-whisper (model.bin, config.json, tokenizer.json); or a name as faster-whisper takes it (tiny.en, "
         "base, small, large-v3, turbo, ...: `minirt models`) or a Hugging Face repo id (ORG/NAME), downloaded once "
         "into the Hugging Face cache (HF_HUB_CACHE; HF_HUB_OFFLINE=1: the cache only).")
compute_type_opt = click.option(
    "--compute-type", default=None,
    type=click.Choice(["default", "auto", "float32", "float16", "int8", "int8_float32", "int8_float16",
                       "int8_bfloat16"]),
    help="As faster-whisper's: float32 / float16 set the precision; int8, int8_float32 (fp32) and int8_float16, "
         "int8_bfloat16 (fp16) run the Linear weights as int8 (a float model's quantized at load per output row); "
         "default: --precision, and the weights as the file holds them (a CTranslate2 int8 model stays int8).")


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
    _check_environment()     # first, so a bad MINIRT_* variable is not reported as a bad --option
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


def _parse_shapes(ctx, param, value):
    """--shape NAME=D0,D1,... pairs as {name: dims}; dims are integers >= 1."""
    out = {}
    for item in value:
        name, sep, dims = item.partition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        if not sep or not name.strip() or not shape or min(shape) < 1:
            raise click.BadParameter(f"{item!r} is not NAME=D0,D1,... (integers >= 1)", ctx=ctx, param=param)
        out[name.strip()] = shape
    return out


def _check_local_size(local, device, options):
    """A forced local size beyond the device's limits is a usage error (exit 2), found before any work, whichever
    way it was forced: --local-size, --option local_size=... or MINIRT_LOCAL_SIZE (in that order of precedence)."""
    from .options import Options
    if local is not None:
        where = "'--local-size'"
    else:
        local = Options.make(options).local_size
        where = "'--option local_size'" if "local_size" in options else None
    if local is None:
        return
    from .kernels.local_size import check_local_size
    from .session import get_device
    try:
        check_local_size(local, get_device(device).profile)
    except ValueError as e:
        if where is None:
            raise _UsageError(f"environment variable MINIRT_LOCAL_SIZE: {e}") from None
        raise click.BadParameter(str(e), ctx=click.get_current_context(), param_hint=where) from None


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("input", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), callback=_check_output,
              help="Write the (first) output to this .npy file (exactly this path).")
@storage_opt
@device_opt
@click.option("--repeat", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run N times and report distinct outputs; exit 5 if they differ.")
@precision_opt
@fp32_precision_opt
@local_size_opt
@rewrite_opt
@option_opt
@quiet_opt
def run(model, input, output, storage, device, repeat, precision, fp32_precision, local_size, no_conv1d_rewrite,
        options, quiet):
    """Run MODEL on INPUT (.npy, .npz with one array per model input, or a .wav for Whisper encoders) and
    summarise the first output.

    \b
    Examples:
      minirt run models/whisper-tiny-encoder.onnx models/whisper-tiny-input.npy -o out.npy
      minirt run whisper-tiny.en/model.safetensors models/speech-sample.wav   # log-mel computed
      minirt run model.onnx x.npy --repeat 60      # determinism check; exit 5 if outputs differ
      minirt run model.onnx x.npy --precision fp16 # 16-bit storage, tensor cores where available
      minirt run model.onnx x.npy --fp32-precision f16x3   # fp32 GEMMs from fp16 parts on tensor cores
      minirt run model.onnx x.npy --local-size 64,1,1 --no-conv1d-rewrite   # experiments
      minirt run bert.onnx feeds.npz    # np.savez("feeds.npz", input_ids=ids, attention_mask=mask)
    """
    from .session import Session
    options = _with_fp32_precision(options, fp32_precision)
    try:
        _check_device(device)
        _check_local_size(local_size, device, options)
        x = None if _is_wav(input) else _load_input(input)
        with _Status(quiet) as status, Session(model, storage=storage, device=device, local_size=local_size,
                                               conv1d_rewrite=False if no_conv1d_rewrite else None, precision=precision,
                                               options=options, progress=status) as s:
            if isinstance(x, dict):
                feeds = _name_feeds(x, s.inputs, input)
                run_once = lambda: s.run(None, feeds)[0]        # noqa: E731
            else:
                if len(s.inputs) != 1:
                    raise InputError(f"{model} has {len(s.inputs)} inputs ({', '.join(i.name for i in s.inputs)}); "
                                     f"give them as one .npz with an array per input name")
                if x is None:
                    x = _load_wav(input, s.inputs[0])
                run_once = lambda: s.run(x)                     # noqa: E731
            status("first run")
            run_once()   # warm-up: the first run pays for planning when shapes are dynamic
            status.done()
            # Only the first output and a digest of each later one are kept, so memory does not grow with N.
            y, digests, dev, walls = None, set(), 0.0, []
            with _progress(repeat, "running", quiet or repeat < 3) as bar:
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    out = run_once()
                    walls.append(time.perf_counter() - t0)
                    d = _digest(out)
                    if y is None:
                        y, first = out, d
                    elif d != first:
                        dev = max(dev, _deviation(out, y))
                    digests.add(d)
                    del out      # drop it now: a zero-copy output held by the caller cannot be reused by the next run
                    bar.update(1)
            p = s.device.profile
            click.echo(f"output   {s.outputs[0].name}: shape {list(y.shape)} {y.dtype}")
            if y.size:
                click.echo(f"values   min {y.min():.6g}  max {y.max():.6g}  mean {y.mean():.6g}")
            else:
                click.echo("values   none (the output has no elements)")
            split = s.options.fp32_precision
            on = sum(d.kernel.endswith(f"_{split}") for d in s.plan.dispatches)   # (the plan's notes say why not)
            click.echo(f"device   {p.name} ({p.device_type}, {p.driver}), storage {s.storage}, "
                       f"precision {s.precision}"
                       + (f", fp32_precision {split} on {on} GEMM dispatch(es)" if split != "ieee" else ""))
            walls_ms = sorted(w * 1e3 for w in walls)
            click.echo(f"run      {walls_ms[len(walls_ms) // 2]:.2f} ms wall, median of {repeat} "
                       f"(Session.run, upload and download included)")
            code = EXIT_OK
            if repeat > 1:
                click.echo(f"repeat   {repeat} runs: {len(digests)} distinct output(s), max deviation {dev:.3g}, "
                           f"wall min {walls_ms[0]:.2f} / max {walls_ms[-1]:.2f} ms")
                if len(digests) > 1:
                    click.echo("error: outputs differ between runs of the same input", err=True)
                    code = EXIT_NONDETERMINISTIC
    except (MinirtError, MemoryError) as e:
        _fail(e)
    if output:
        _write_atomic(output, lambda f: np.save(f, y, allow_pickle=False))
        click.echo(f"wrote    {output}")
    sys.exit(code)


def _digest(a) -> str:
    """SHA-256 of an array's shape, dtype and bytes, without a copy of the bytes where it is contiguous."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.shape} {a.dtype.str}".encode())
    h.update(a.reshape(-1).view(np.uint8))
    return h.hexdigest()


def _deviation(a, b) -> float:
    """The largest |a - b| (float64); NaN against a number counts as inf, NaN against NaN as equal."""
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a64 - b64)
    na, nb = np.isnan(a64), np.isnan(b64)
    diff[(a64 == b64) | (na & nb)] = 0.0      # equal infinities too (inf - inf is NaN)
    diff[na != nb] = np.inf
    return float(diff.max())


def _load_input(path):
    """An array from a .npy file, or {name: array} from an .npz archive; floating arrays as float32 (the integer and
    boolean ones as they are: token ids, masks)."""
    try:
        x = np.load(path, allow_pickle=False)
        if not isinstance(x, np.ndarray):      # an .npz archive
            with x:
                x = {k: x[k] for k in x.files}
    except Exception as e:
        raise InputError(f"{path}: not a readable .npy or .npz file ({e})") from None
    as32 = lambda a: a.astype(np.float32) if a.dtype != np.float32 and np.issubdtype(a.dtype, np.floating) else a  # noqa
    return {k: as32(v) for k, v in x.items()} if isinstance(x, dict) else as32(x)


def _name_feeds(arrays: dict, inputs, path) -> dict:
    """An .npz archive's arrays as the model's feeds: every input by its name, nothing else."""
    names = [i.name for i in inputs]
    missing, extra = [n for n in names if n not in arrays], [k for k in arrays if k not in names]
    if missing or extra:
        raise InputError(f"{path}: " + "; ".join(filter(None, [
            f"no array for input(s) {', '.join(missing)}" if missing else "",
            f"array(s) {', '.join(extra)} name no input" if extra else ""])) + f" (the model's inputs: {', '.join(names)})")
    return arrays


def _is_wav(path) -> bool:
    """Whether INPUT is a .wav file, read once the model gives its input shape; a missing one is reported now, before
    the model is loaded."""
    if not path.lower().endswith(".wav"):
        return False
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    return True


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
      minirt run model.onnx x.npy --device GPU-5b3f0c2e   # or a device by (a unique leading part of) its UUID
    """
    from .vk.device import choose, physical_devices
    _check_environment()
    try:
        devs = physical_devices()
    except (MinirtError, MemoryError) as e:
        _fail(e)
    try:
        chosen, bad_choice = choose(devs)[0], None
    except DeviceError as e:     # MINIRT_DEVICE names no device: list them anyway, then say so (exit 2)
        chosen, bad_choice = None, e
    for i, _, p in devs:
        mark = "*" if i == chosen else " "
        click.echo(f"{mark} [{i}] {p.name}  ({p.device_type}, vendor {p.vendor}, Vulkan {p.api_version})")
        click.echo(f"      driver: {p.driver}")
        click.echo(f"      uuid: {p.uuid or 'none (the driver reports none)'}")
        click.echo(f"      work group: max {p.max_invocations} invocations, size {list(p.max_local_size)}; "
                   f"subgroup {p.subgroup_size}; shared memory {p.max_shared_memory} B"
                   + (f"; {p.compute_units} multiprocessors" if p.compute_units else ""))
        click.echo(f"      push constants {p.max_push_constants} B; image3D {p.max_image_3d}; "
                   f"storage buffer range {p.max_storage_buffer_range >> 20} MiB")
        click.echo(f"      memory: device-local heap {p.device_heap >> 20} MiB, "
                   + ("shared with host-visible memory" if p.unified_heap else f"host-visible heap {p.host_heap >> 20} MiB")
                   + f"; largest allocation {p.max_allocation >> 20} MiB")
        feats = [f for f, on in (("fp16", p.fp16), ("16-bit storage", p.storage16),
                                 ("cooperative matrix", p.cooperative_matrix)) if on]
        click.echo(f"      features: {', '.join(feats) or 'none of fp16 / 16-bit storage / cooperative matrix'}; "
                   f"timestamps {p.timestamp_valid_bits} bits x {p.timestamp_period} ns")
        if p.coopmat_shapes:
            shapes = sorted({f"{m}x{n}x{k} {a}*{b}+{c}" for m, n, k, a, b, c, _ in p.coopmat_shapes})
            click.echo(f"      cooperative matrix (subgroup, MxNxK A*B+C): {', '.join(shapes)}")
        if p.coopmat2:
            combos = ", ".join(f"{m}x{n}x{k} at {inv}" for m, n, k, inv in p.coopmat2)
            click.echo(f"      VK_NV_cooperative_matrix2 (workgroup f16*f16+f32, MxNxK granularity at invocations): "
                       f"{combos}; largest side {p.coopmat2_max_dimension}")
        elif p.coopmat2_missing:
            click.echo(f"      VK_NV_cooperative_matrix2 not used: {p.coopmat2_missing}")
    click.echo("(* = the device minirt picks; MINIRT_DEVICE=<index or uuid> overrides)")
    if bad_choice is not None:
        raise _UsageError(str(bad_choice))


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
@click.option("--cache-dir", type=click.Path(file_okay=False), default=None,
              help="The Hugging Face cache to list (default: HF_HUB_CACHE, else $HF_HOME/hub, else "
                   "~/.cache/huggingface/hub).")
def models(cache_dir):
    """List the Whisper model names that `transcribe --model` and WhisperModel(...) take (faster-whisper's), with the
    Hugging Face repo each downloads, then the models in the local Hugging Face cache and whether minirt loads them.

    A name or a repo id (ORG/NAME, a CTranslate2 or Transformers Whisper checkpoint) is downloaded once into the
    cache (only the files minirt reads); later runs use the cached copy, also offline (HF_HUB_OFFLINE=1). Whether
    minirt loads a cached model is judged by its files, its config.json and its model.bin's header (an int8
    CTranslate2 model is refused only when loaded).

    \b
    Examples:
      minirt models
      minirt transcribe speech.wav --model tiny.en       # downloaded into the cache the first time
      HF_HUB_OFFLINE=1 minirt transcribe speech.wav --model tiny.en    # the cached copy, no network
      HF_HUB_CACHE=/data/hf minirt models                # another cache (also --cache-dir /data/hf)
    """
    from .whisper.hub import MODELS, cached_models
    try:
        cache, rows = cached_models(cache_dir)
    except (MinirtError, OSError) as e:
        _fail(e if isinstance(e, MinirtError) else ModelError(f"cannot read the Hugging Face cache: {e}"))
    loads = {repo for repo, _, _, _, _, kind, _ in rows if kind}
    click.echo("Names (--model NAME, WhisperModel(NAME)) and the Hugging Face repos they download:")
    nw, rw = max(map(len, MODELS)), max(map(len, MODELS.values()))
    for name, repo in MODELS.items():
        click.echo((f"  {name:<{nw}}  {repo:<{rw}}" + ("  cached" if repo in loads else "")).rstrip())
    click.echo("Any other repo id (ORG/NAME) of a CTranslate2 or Transformers Whisper checkpoint works too.")
    if not rows:
        click.echo(f"\nNo models cached in {cache}.")
        return
    whisper = [r for r in rows if r[5] or r[0] in MODELS.values() or "whisper" in r[0].lower()]
    click.echo(f"\nCached in {cache}:")
    iw = max(len(r[0]) for r in whisper) if whisper else 0
    for repo, refs, commit, size, folder, kind, why in whisper:
        rev = f"{','.join(refs)} ({commit[:8]})" if refs else commit[:12]
        status = f"loads ({'CTranslate2' if kind == 'ctranslate2' else 'Transformers'})" if kind else f"no: {why}"
        click.echo(f"  {repo:<{iw}}  {rev}  {size / 1e6:.1f} MB  {status}")
    others = len({r[0] for r in rows} - {r[0] for r in whisper})
    if others:
        click.echo(f"  ({others} other model repo(s), not Whisper checkpoints)")


@main.command()
@click.argument("model", type=click.Path())
@storage_opt
@device_opt
@click.option("--shape", "shapes", multiple=True, metavar="NAME=D0,D1,...", callback=_parse_shapes,
              help="Concrete shape for an input with symbolic dims.")
@click.option("--entry", default=None, metavar="NAME",
              help="A Whisper model folder: only this entry point of its Vulkan program (encode, cross, prompt8, "
                   "prompt232, step1, stepN for N = --batch, step1_select, reorder).")
@click.option("--batch", type=click.IntRange(min=1), default=5, show_default=True,
              help="A Whisper model folder: the rows (beams) of its Vulkan program.")
@click.option("--items", type=click.IntRange(min=0, max=32), default=0, show_default=True,
              help="A Whisper model folder: also the entry points of a batch of this many sequences (bencode, "
                   "bencodeK for fewer windows, bstepN, breorder: transcribe_batch's), fitted to the device's "
                   "limits; their notes say how.")
@precision_opt
@fp32_precision_opt
@local_size_opt
@rewrite_opt
@option_opt
def plan(model, storage, device, shapes, entry, batch, items, precision, fp32_precision, local_size,
         no_conv1d_rewrite, options):
    """Print the plan: per node its op, input and output shapes, the kernels it dispatches (with global
    and local sizes), then the planner's notes (conv1d rewrite, conv routing and why).

    MODEL may also be a Whisper model folder or name (as `minirt transcribe --model` takes them): then the plans of
    its Vulkan program, one per entry point (encode, cross, two prompt sizes, a step of 1 row and one of --batch
    rows, the step of 1 row with the pick of its next token on the GPU, reorder), with their int32 inputs, state
    tensors and run-time parameters; with --items, also those of a batch of that many sequences (transcribe_batch's),
    whose notes say where the device's limits make the encoder take fewer windows a run or the batch hold fewer, and
    which encoder entry points of fewer windows (bencodeK) the batch has.

    Nothing runs and no weights are uploaded: the model is loaded, checked and planned for the device.

    \b
    Examples:
      minirt plan models/whisper-tiny-encoder.onnx
      minirt plan models/whisper-tiny-encoder.onnx --storage texture --no-conv1d-rewrite
      minirt plan dynamic.onnx --shape input_features=1,80,3000
      minirt plan whisper-tiny.en --entry step1
      minirt plan tiny.en --entry step1      # a model by name (`minirt models`)
      minirt plan whisper-tiny.en --items 16 --entry bencode
      minirt plan models/whisper-tiny-encoder.onnx --fp32-precision f16x3 --option coopmat=emulate
    """
    from .infer import bind_inputs, prepare
    from .loaders import load
    from .options import Options
    from .planner import make_plan
    from .session import get_device
    options = _with_fp32_precision(options, fp32_precision)
    try:
        _check_device(device)
        _check_local_size(local_size, device, options)
        from .whisper.hub import is_model_name, model_folder
        if os.path.isdir(model) or is_model_name(model):
            return _plan_whisper_program(model_folder(model, progress=sys.stderr.isatty()), entry, batch, device,
                                         options, precision, storage, local_size, items)
        given = dict(shapes)
        max_load = Options.make(options).max_load_bytes
        g = load(model, max_load_bytes=max_load)
        unknown = [n for n in given if n not in g.inputs]
        if unknown:
            raise click.BadParameter(f"{', '.join(map(repr, unknown))} is not an input of {model} (inputs: "
                                     f"{', '.join(g.inputs)})", param_hint="'--shape'")
        for n in g.inputs:
            t = g.tensor(n)
            if n not in given:
                if not t.is_static:
                    what = f"symbolic shape {list(t.shape)}" if t.shape is not None else "no declared shape"
                    raise InputError(f"input '{n}' has {what}; pass --shape {n}=...")
                given[n] = t.shape
        given_opts = {k: v for k, v in dict(precision=precision, storage=storage, local_size=local_size,
                                             conv1d_rewrite=False if no_conv1d_rewrite else None).items()
                      if v is not None}
        opts = Options.make(options, **given_opts)
        dev = get_device(device)
        from .planner.storage_layout import resolve_storage
        buffers = resolve_storage(opts.storage, dev.profile) == "buffer"
        gpu = prepare(bind_inputs(g, given), host=True,
                      runtime_gather=dev.profile.max_storage_buffer_range if buffers else 0)
        if not gpu.outputs:
            raise UnsupportedError(f"{model}: every output is computed on the host from integer inputs; no GPU plan")
        p = make_plan(gpu, dev.profile, None, opts)
        click.echo(f"device {dev.profile.name}")
        if gpu.host.nodes:     # what runs on the host each run, and what it hands the GPU
            ops_ = sorted({n.op for n in gpu.host.nodes})
            click.echo(f"host {len(gpu.host.nodes)} node(s) each run ({', '.join(ops_)}); to the GPU: " + ", ".join(
                f"{b.name} ({'int32 rows' if b.rows else 'float32'})" for b in gpu.host.boundary))
        changed = opts.changed()
        if changed:
            click.echo("options " + ", ".join(f"{k}={v}" for k, v in changed.items()))
        click.echo(format_plan(p))
    except (MinirtError, MemoryError) as e:
        _fail(e)


@main.command()
@click.argument("model", type=click.Path(dir_okay=False))
@click.argument("input", required=False, type=click.Path(dir_okay=False))
@storage_opt
@device_opt
@click.option("--runs", type=click.IntRange(min=1), default=20, show_default=True,
              help="Timed runs; the report gives medians.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed runs first.")
@click.option("--top", type=click.IntRange(min=1), default=None,
              help="Show only the N slowest dispatches in the table.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), callback=_check_output,
              help="Write the records as JSON.")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), callback=_check_output,
              help="Write the records as CSV.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), callback=_check_output,
              help="Write a Chrome trace (open it in Perfetto).")
@precision_opt
@fp32_precision_opt
@local_size_opt
@rewrite_opt
@option_opt
@quiet_opt
def profile(model, input, storage, device, runs, warmup, top, json_path, csv_path, trace_path, precision,
            fp32_precision, local_size, no_conv1d_rewrite, options, quiet):
    """Per-dispatch GPU time from a Vulkan timestamp query pool.

    INPUT is a .npy file (or a 16 kHz .wav for Whisper encoders); without it a seeded random input of
    the model's shape is used.

    \b
    Examples:
      minirt profile models/whisper-tiny-encoder.onnx --runs 50 --trace whisper.json
      minirt profile model.onnx x.npy --top 10 --csv dispatches.csv --quiet
    """
    from . import dispatch_timing as prof
    from .session import Session
    options = _with_fp32_precision(options, fp32_precision)
    writes = [(flag, path, fn) for flag, path, fn in (("--json", json_path, prof.to_json),
                                                      ("--csv", csv_path, prof.to_csv),
                                                      ("--trace", trace_path, prof.to_trace)) if path]
    seen = {}
    for flag, path, _ in writes:
        other = seen.setdefault(os.path.realpath(path), flag)
        if other != flag:
            raise click.BadParameter(f"{path!r} is also the {other} file", param_hint=f"'{flag}'")
    try:
        _check_device(device)
        _check_local_size(local_size, device, options)
        x = None if not input or _is_wav(input) else _load_input(input)
        with _Status(quiet) as status, Session(model, storage=storage, device=device, profile=True,
                                               local_size=local_size,
                                               conv1d_rewrite=False if no_conv1d_rewrite else None,
                                               precision=precision, options=options, progress=status) as s:
            if len(s.inputs) != 1:
                raise InputError(f"{model} has {len(s.inputs)} inputs; `minirt profile` feeds one")
            if x is None and input:
                x = _load_wav(input, s.inputs[0])
            elif x is None:
                if s.inputs[0].shape is None:
                    raise InputError(f"{model}: input '{s.inputs[0].name}' has no declared shape; give INPUT "
                                     f"(a .npy file) to profile it")
                x = prof.load_input(s, None)
            for i in range(warmup):
                status(f"warm-up run {i + 1}/{warmup}")
                s.run(x)
            status.done()
            with _progress(runs, "profiling", quiet or runs < 3) as bar:
                res = prof.profile_session(s, x, runs=runs, warmup=0, progress=lambda i: bar.update(1))
        click.echo(prof.format_report(res, top))
    except (MinirtError, MemoryError) as e:
        _fail(e)
    for _, path, fn in writes:
        text = fn(res).encode()
        _write_atomic(path, lambda f, text=text: f.write(text))
        click.echo(f"wrote {path}")


def _output_targets(ctx, audio, output, fmt):
    """[(audio, output path or None)]: one AUDIO writes to -o FILE (or stdout); several write into -o FOLDER as
    <stem>.<format> (or to stdout, each after a '==> AUDIO <==' line). Every path is checked now, before the model
    is loaded; a usage error names the bad one."""
    if output is None:
        return [(a, None) for a in audio]
    if len(audio) == 1 and not (output.endswith(("/", os.sep)) or os.path.isdir(output)):
        return [(audio[0], _check_output(ctx, _param(ctx, "output"), output))]
    if not os.path.isdir(output):
        raise click.BadParameter(f"{output!r}: with several AUDIO files -o names an existing folder "
                                 f"(each transcript is written there as <name>.{fmt})", ctx=ctx,
                                 param=_param(ctx, "output"))
    targets, seen = [], {}
    for a in audio:
        target = os.path.join(output, os.path.splitext(os.path.basename(a))[0] + f".{fmt}")
        if target in seen:
            raise click.BadParameter(f"{seen[target]!r} and {a!r} would both be written to {target!r}", ctx=ctx,
                                     param=_param(ctx, "output"))
        seen[target] = a
        targets.append((a, _check_output(ctx, _param(ctx, "output"), target)))
    return targets


def _param(ctx, name):
    return next(p for p in ctx.command.params if p.name == name)


@main.command()
@click.argument("audio", nargs=-1, required=True, type=click.Path())
@whisper_model_opt
@click.option("--beam-size", type=click.IntRange(min=1), default=5, show_default=True,
              help="Beam search width; 1 is greedy decoding. On the GPU, beams past 5 run on the batch's rows: at most 16 "
                   "(with --batch-size N, the larger of N and 5).")
@click.option("--task", type=click.Choice(["transcribe", "translate"]), default="transcribe", show_default=True,
              help="translate: English text from speech in another language (multilingual models).")
@click.option("--initial-prompt", default=None, metavar="TEXT",
              help="Text the first window is prompted with, as if it came before (spellings, names, style).")
@click.option("--prefix", default=None, metavar="TEXT",
              help="Text the transcript of the first window starts with (the decoder goes on from it).")
@click.option("--hotwords", default=None, metavar="TEXT",
              help="Words or phrases to prompt every window with (no effect with --prefix).")
@click.option("--clip-timestamps", default="0", metavar="START,END,...",
              help="Transcribe only these clips, in seconds (start,end,start,end,...; an odd count runs to the end).")
@click.option("--vad-filter", is_flag=True,
              help="Transcribe only the speech Silero VAD finds (faster-whisper's default VAD options; needs "
                   "minirt[vad]: faster-whisper's model file and onnxruntime); times stay the file's. The file is read "
                   "whole.")
@click.option("--word-timestamps", is_flag=True,
              help="Times of each word (json: a \"words\" list per segment; srt, vtt: see --max-words).")
@click.option("--max-words", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --word-timestamps, srt and vtt: a subtitle per N words of a segment, timed by its words "
                   "(default: a subtitle per segment).")
@click.option("--language", default=None, metavar="CODE",
              help="The spoken language (en, de, ...); detected from the first 30 s when not given. English-only "
                   "models always use en.")
@click.option("--no-timestamps", is_flag=True, help="Decode without timestamp tokens (one segment per 30 s window).")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="fp16: on the GPU, weights, activations and the key/value cache in 16-bit storage with fp32 "
                   "arithmetic (a device with 16-bit storage buffers); in the numpy reference, the weights rounded "
                   "to float16.")
@click.option("--backend", type=click.Choice(["auto", "vulkan", "reference"]), default="auto", show_default=True,
              help="vulkan: encoder and decoder on the GPU (fp32 or fp16; beams up to 5, or up to the batch's 16 rows "
                   "(--batch-size N: N) planned when first needed); reference: the numpy "
                   "decoder on the CPU; auto: vulkan.")
@compute_type_opt
@device_opt
@click.option("--format", "fmt", type=click.Choice(["txt", "json", "srt", "vtt"]), default="txt", show_default=True,
              help='txt: a line per segment; json: {"text", "language", "duration", "segments": [{"id", "start", '
                   '"end", "text", "tokens"}]}; srt, vtt: subtitles.')
@click.option("-o", "--output", type=click.Path(), default=None,
              help="Write the transcript to this file (one AUDIO) or into this folder as <name>.<format> (several); "
                   "default: stdout.")
@click.option("--batch-size", type=click.IntRange(1, 32), default=1, show_default=True,
              help="Decode the windows of up to this many files together on the GPU (WhisperModel.transcribe_batch): "
                   "each file's transcript is the one it gets alone; windows decoded greedily (--beam-size 1) run "
                   "as one batch, the rest one by one. 1: one file after another.")
@click.option("--progress", "progress_lines", is_flag=True,
              help="A line on stderr after each 30 s window (seconds done, of the total), also when stderr is not a "
                   "terminal (a log file); on a terminal the status line shows the same without it.")
@quiet_opt
@click.pass_context
def transcribe(ctx, audio, model_path, beam_size, task, initial_prompt, prefix, hotwords, clip_timestamps,
               vad_filter, word_timestamps, max_words, language, no_timestamps, precision, backend, compute_type, device,
               fmt, output, batch_size, progress_lines, quiet):
    """Transcribe speech in AUDIO files (WAV at any rate; FLAC, OGG, ... with the soundfile package) with a
    Whisper model, as faster-whisper does (its default options: beam search, temperature fallback, previous text
    as the prompt).

    The encoder and the decoder run on the GPU, at fp32 or fp16 (--backend reference runs minirt.whisper's numpy
    reference decoder on the CPU instead). Files are read 10 s at a time, so hours of audio need no more memory than
    a minute.
    Exit codes as for `minirt run`: 3 for a model or audio file that cannot be used (the message names it), 4 for
    a runtime failure, 2 for a usage error.

    \b
    Examples:
      minirt transcribe speech.wav --model tiny.en      # Systran/faster-whisper-tiny.en, downloaded once
      minirt transcribe speech.wav --model whisper-tiny.en      # a model folder
      minirt transcribe talk.flac --model openai/whisper-small --format srt -o talk.srt
      minirt transcribe a.wav b.wav --model whisper-base --format json -o transcripts/
      minirt transcribe clips/*.wav --model whisper-base --beam-size 1 --batch-size 16 -o transcripts/
      minirt transcribe meeting.wav --model whisper-tiny.en --progress 2>progress.log
      minirt transcribe talk.wav --model whisper-tiny.en --device GPU-5b3f0c2e   # the GPU with that UUID
      minirt transcribe talk.wav --model whisper-tiny.en --word-timestamps --format srt --max-words 5
      minirt transcribe lecture.mp3 --model whisper-small --vad-filter
      minirt transcribe interview.wav --model whisper-small --task translate --initial-prompt "An interview."
    """
    targets = _output_targets(ctx, audio, output, fmt)
    if backend == "auto":
        backend = "vulkan"
    from .whisper.hub import model_folder
    from .whisper.model import MAX_BATCH_ITEMS, WhisperModel
    from .whisper.vulkan import DEFAULT_MAX_BATCH
    # beams past the one-sequence cache run on the batch's rows (minirt/whisper/beam_rows.py): as many as it holds
    items = batch_size if batch_size > 1 else MAX_BATCH_ITEMS
    if backend == "vulkan" and beam_size > max(DEFAULT_MAX_BATCH, items):
        raise click.BadParameter(f"{beam_size}: the vulkan backend holds {max(DEFAULT_MAX_BATCH, items)} rows "
                                 f"(beams) at most{' with --batch-size ' + str(batch_size) if batch_size > 1 else ''}",
                                 ctx=ctx, param=_param(ctx, "beam_size"))
    if max_words is not None and not word_timestamps:
        raise click.BadParameter("--max-words cuts subtitles by their words: give --word-timestamps too", ctx=ctx,
                                 param=_param(ctx, "max_words"))
    from .whisper.transcribe import parse_clip_timestamps
    try:
        parse_clip_timestamps(clip_timestamps)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=_param(ctx, "clip_timestamps")) from None
    decode = dict(beam_size=beam_size, language=language, without_timestamps=no_timestamps, task=task,
                  initial_prompt=initial_prompt, prefix=prefix, hotwords=hotwords, clip_timestamps=clip_timestamps,
                  word_timestamps=word_timestamps, vad_filter=vad_filter)
    from .whisper.output import render
    try:
        for a in audio:
            if os.path.isdir(a):
                raise InputError(f"{a}: is a folder, not an audio file")
            if not os.path.isfile(a):
                raise InputError(f"{a}: no such file")
        if backend == "vulkan":
            _check_device(device)
        model_path = model_folder(model_path, progress=not quiet and sys.stderr.isatty())
        with _Status(quiet) as status:
            status("loading the model")
            model = WhisperModel(model_path, precision=precision, device=device, backend=backend,
                                 **({"compute_type": compute_type} if compute_type else {}),
                                 **({"max_batch_items": batch_size} if batch_size > 1 else {}))
            status.done()
        if task == "translate" and not model.is_multilingual:
            click.echo("warning: the model is English-only; --task translate transcribes", err=True)
        if language is not None:
            if not model.is_multilingual and language != "en":
                click.echo(f"warning: the model is English-only; --language {language} is ignored", err=True)
                language = None
            elif model.is_multilingual and language not in model.supported_languages:
                raise click.BadParameter(f"{language!r} is not a language of this model (known: "
                                         f"{', '.join(model.supported_languages)})", ctx=ctx,
                                         param=_param(ctx, "language"))
        done = {}
        if batch_size > 1 and len(targets) > 1:
            with _Status(quiet) as status:
                status(f"transcribing {len(targets)} files, {batch_size} windows at a time")
                results = model.transcribe_batch([a for a, _ in targets], batch_size=batch_size,
                                                  **dict(decode, language=language))
            done = {i: render(fmt, segments, info, max_words) for i, (segments, info) in enumerate(results)}
        for i, (a, target) in enumerate(targets):
            name = os.path.basename(a)
            with _Status(quiet) as status:
                status(f"transcribing {name}")

                def progress(done, total, status=status, name=name):
                    if progress_lines and not quiet:
                        click.echo(_progress_line(name, done, total), err=True)
                    else:
                        status(f"transcribing {name}: {done:.0f} of {total:.0f} s")
                if i in done:
                    text = done[i]
                else:
                    segments, info = model.transcribe(a, **dict(decode, language=language), progress=progress)
                    text = render(fmt, segments, info, max_words)
            if target is None:
                if len(targets) > 1:
                    click.echo(f"==> {a} <==")
                click.echo(text, nl=False)
            else:
                _write_atomic(target, lambda f, text=text: f.write(text.encode("utf-8")))
                if not quiet:
                    click.echo(f"wrote {target}", err=True)
    except (MinirtError, MemoryError) as e:
        _fail(e)


def _progress_line(name, done, total) -> str:
    """'talk.wav: 90 of 3600 s (2%)'."""
    return f"{name}: {done:.0f} of {total:.0f} s ({100 * done / total if total else 100:.0f}%)"


def _option_value(text: str):
    """A --transcribe-option value: true / false, none, a number, a comma-separated list of them, else the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    if "," in text:
        return tuple(_option_value(t.strip()) for t in text.split(",") if t.strip())
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _parse_transcribe_options(ctx, param, value):
    """--transcribe-option KEY=VALUE pairs as a dict of WhisperModel.transcribe() keywords (checked when the model
    is loaded)."""
    out = {}
    for item in value:
        key, sep, v = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", ctx=ctx, param=param)
        if key in ("task", "word_timestamps", "progress", "log_progress"):
            raise click.BadParameter(f"{key}: each request sets it (the route, timestamp_granularities)", ctx=ctx,
                                     param=param)
        out[key] = _option_value(v.strip())
        default = _transcribe_defaults().get(key)
        if isinstance(default, (int, float)) and not isinstance(default, bool) and isinstance(out[key], str):
            raise click.BadParameter(f"{item!r}: {key} is a number", ctx=ctx, param=param)
    return out


def _transcribe_defaults() -> dict:
    import inspect

    from .whisper.model import WhisperModel
    return {k: p.default for k, p in inspect.signature(WhisperModel.transcribe).parameters.items()}


@main.command()
@whisper_model_opt
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on; 0.0.0.0 (or ::) listens on every interface.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="The TCP port; 0 picks a free one (the 'listening on' line on stderr names it).")
@device_opt
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="fp16: weights, activations and the key/value cache in 16-bit storage, fp32 arithmetic (a device "
                   "with 16-bit storage buffers).")
@compute_type_opt
@click.option("--max-batch", type=click.IntRange(1, 32), default=16, show_default=True,
              help="The most windows (30 s of audio, one a request at a time) decoded together on the GPU.")
@click.option("--max-queue", type=click.IntRange(min=1), default=64, show_default=True,
              help="The most transcription requests in the server at once (uploading, waiting or being decoded); "
                   "more are answered 429 with Retry-After.")
@click.option("--max-upload-mb", type=click.FloatRange(min=0, min_open=True), default=25, show_default=True,
              help="The largest audio upload in MiB (413 above it).")
@click.option("--api-key", envvar="MINIRT_API_KEY", default=None, metavar="KEY",
              help="Every request must send 'Authorization: Bearer KEY' (401 otherwise); also MINIRT_API_KEY. "
                   "Default: no key.")
@click.option("--transcribe-option", "transcribe_opts", multiple=True, metavar="KEY=VALUE",
              callback=_parse_transcribe_options,
              help="A WhisperModel.transcribe() option (faster-whisper's name) for every request, e.g. beam_size=5, "
                   "temperature=0 (no fallback), condition_on_previous_text=false, language=en (for requests that "
                   "name none); repeatable. Default: beam_size=1, faster-whisper's other defaults.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True, help="uvicorn's log level (info: a line per request on stderr).")
@click.pass_context
def serve(ctx, model_path, host, port, device, precision, compute_type, max_batch, max_queue, max_upload_mb, api_key,
          transcribe_opts, log_level):
    """Serve a Whisper model over HTTP with OpenAI's audio API: POST /v1/audio/transcriptions and
    /v1/audio/translations (multipart: file, model, language, prompt, response_format json | text | srt |
    verbose_json | vtt, temperature, timestamp_granularities[]), GET /v1/models, /health and /metrics (Prometheus).

    Requests transcribed at the same time have their 30 s windows decoded together on the GPU, up to --max-batch,
    and each gets the transcript WhisperModel.transcribe gives it alone with the same options. A long file takes
    its turn a window at a time, so it does not hold up short ones. SIGTERM (or Ctrl+C) stops accepting
    connections, finishes the requests in progress and exits 0. Needs the 'serve' extra: pip install 'minirt[serve]'.

    \b
    Examples:
      minirt serve --model whisper-large-v3-turbo
      minirt serve --model whisper-small --port 9000 --max-batch 32 --precision fp16
      MINIRT_API_KEY=secret minirt serve --model whisper-base --host 0.0.0.0
      minirt serve --model whisper-small --transcribe-option beam_size=5 --device GPU-5b3f0c2e
      curl 127.0.0.1:8000/v1/audio/transcriptions -F file=@speech.wav -F model=whisper-1
    """
    try:
        from . import serve as server
    except ImportError as e:
        raise _UsageError(f"`minirt serve` needs the 'serve' extra: pip install 'minirt[serve]' ({e})") from None
    from .whisper.features import LogMel
    from .whisper.hub import model_folder
    from .whisper.model import WhisperModel
    from .whisper.reference import blas_threads
    options = {"beam_size": 1, **transcribe_opts}
    # beams past the one-sequence cache's 5 run on the batch's rows (minirt/whisper/beam_rows.py): --max-batch of them
    if isinstance(options["beam_size"], int) and options["beam_size"] > max(5, max_batch):
        raise click.BadParameter(f"beam_size={options['beam_size']}: the GPU decoder holds {max(5, max_batch)} beams "
                                 f"at most with --max-batch {max_batch}", ctx=ctx, param=_param(ctx, "transcribe_opts"))
    try:
        _check_device(device)
        model = WhisperModel(model_folder(model_path, progress=sys.stderr.isatty()), precision=precision,
                             device=device, max_batch_items=max_batch, compute_type=compute_type)
        try:        # the values, as a request would use them (language detection runs once on silence)
            model._setup(None, server.transcribe_options(**options),
                         lambda: LogMel(np.zeros(1600, np.float32), model.n_mels))
        except (ValueError, TypeError, NotImplementedError) as e:
            raise click.BadParameter(str(e), ctx=ctx, param=_param(ctx, "transcribe_opts")) from None
        try:
            sock = server.listen(host, port)
        except OSError as e:
            raise MinirtError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        name = os.path.basename(os.path.normpath(model_path))
        config = server.ServeConfig(name, max_queue=max_queue, max_upload_bytes=int(max_upload_mb * (1 << 20)),
                                    api_key=api_key or None, options=options)
        shown = f"[{host}]" if ":" in host else host
        click.echo(f"minirt serve: model {name}, listening on http://{shown}:{sock.getsockname()[1]}", err=True)
        with blas_threads(1):   # the uploads' log-mels run side by side in worker threads
            started = server.serve(model, config, sock, max_batch, log_level)
        if not started:
            sys.exit(EXIT_RUNTIME)
    except (MinirtError, MemoryError) as e:
        _fail(e)


def _plan_whisper_program(folder, entry, batch, device, options, precision, storage, local_size, items=0):
    """`minirt plan` of a Whisper model folder: the plans of its Vulkan program (minirt/whisper/vulkan.py), and of
    its batch entry points for `items` sequences."""
    from .options import Options
    from .session import get_device
    from .whisper.checkpoint import load_checkpoint
    from .planner.lower import Packs
    from .whisper.vulkan import plan_batch, plan_program
    given = {k: v for k, v in dict(precision=precision, storage=storage, local_size=local_size).items()
             if v is not None}
    opts = Options.make(options, **given)
    ckpt = load_checkpoint(folder)
    dev = get_device(device)
    packs = Packs()     # the batch's encoders reuse the program's packed weights
    plans = plan_program(ckpt.weights, ckpt.config, dev.profile, batch, opts, packs)
    if items:
        plans.update(plan_batch(ckpt.weights, ckpt.config, dev.profile, items, opts, plans, packs))
    if entry is not None and entry not in plans:
        raise click.BadParameter(f"{entry!r} is not an entry point of this program ({', '.join(plans)})",
                                 param_hint="'--entry'")
    click.echo(f"device {dev.profile.name}")
    for name, p in plans.items():
        if entry in (None, name):
            click.echo(f"\nentry point {name}")
            click.echo(format_plan(p))


def _shapes(plan, names):
    return " ".join(str(list(plan.tensors[n].shape)).replace(" ", "") for n in names) or "-"


def _storage_lines(p) -> list:
    """Mixed storage (storage auto on a texture device): which nodes run in buffers; the notes say why."""
    moved = [node for node, notes in p.notes.items() if any(n.startswith("storage: buffer") for n in notes)]
    if not moved:
        return []
    first = {}
    for i, d in enumerate(p.dispatches):
        first.setdefault(d.node, i)
    moved.sort(key=lambda node: first.get(node, len(p.dispatches)))
    copies = sum(d.kernel.startswith("storage_copy") for d in p.dispatches)
    return [f"mixed storage: {len(moved)} node(s) in buffers where textures do not fit or have no kernel "
            f"({', '.join(moved[:6])}{', ...' if len(moved) > 6 else ''}; see the notes), {copies} storage copies"]


def _state_lines(p) -> list:
    """The plan's inputs (with their dtypes), state tensors and run-time parameters, where it has state or parameters."""
    if not p.state and not p.params:
        return []
    written = {p.root(n) for d in p.dispatches for n in d.writes}
    ins = ", ".join(f"{n} {_shapes(p, [n])} {p.tensors[n].dtype}" for n in p.inputs) or "none"
    st = [f"{n} {_shapes(p, [n])} {p.tensors[n].dtype} {'written' if n in written else 'read'}" for n in p.state]
    lines = [f"inputs {ins}"]
    if p.state:
        lines.append("state (kept across runs, shared by name with the program's other plans):")
        lines += [f"  {s}" for s in st]
    if p.params:
        lines.append("params " + ", ".join(f"{n} (slot {i})" for i, n in enumerate(p.params))
                     + ": int32, written before each run into a uniform buffer the kernels read (no re-recording)")
    return lines


def _weight_line(p, role) -> str:
    """'weights (GPU bytes by type): int8 8.3 MB (24 tensors), float32 2.4 MB (51 tensors)'."""
    by = {}
    for t in p.tensors.values():
        if t.role == role:
            n, b = by.get(t.dtype, (0, 0))
            by[t.dtype] = (n + 1, b + t.nbytes)
    parts = [f"{dt} {b / 1e6:.1f} MB ({n} tensor{'s' if n != 1 else ''})" for dt, (n, b) in sorted(by.items())]
    return "weights (GPU bytes by type): " + (", ".join(parts) or "none")


def format_plan(p) -> str:
    """Per node (in dispatch order): op, input and output shapes, then one line per dispatch with its
    kernel, global and local size; then the planner's notes per node (conv1d rewrite, conv route and the
    rule that decided it). Nodes that dispatch nothing (free reshapes, folded shape arithmetic) appear
    only through their notes, if any."""
    from .plan import CONSTANT, PARAMS, SCRATCH, WEIGHT
    by_node, order = {}, []
    for i, d in enumerate(p.dispatches):
        key = d.node or ("", i)     # an edge's dispatch (a cast, a storage copy): its own row, where it runs
        if key not in by_node:
            by_node[key] = []
            order.append(key)
        by_node[key].append(d)
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
        ins, consts, outs = [], set(), []
        for d in ds:
            for n in d.reads:
                role = p.tensors[p.root(n)].role
                if role == PARAMS:      # the parameter block: its own line above
                    continue
                if role in params:
                    if role != SCRATCH:
                        consts.add(n)
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
        ins_s = _shapes(p, ins) + (f" +{len(consts)} const" if consts else "")
        rows.append((node if isinstance(node, str) else "", ds[0].op, ins_s, _shapes(p, outs), conv, ds))
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
             *_state_lines(p), *_storage_lines(p),
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
    lines.append(_weight_line(p, WEIGHT))
    if p.notes:
        lines += ["", "notes:"]
        for node, notes in p.notes.items():
            for n in notes:
                lines.append(f"  {node}: {n}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
