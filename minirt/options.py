"""Every switch of minirt in one place: the Session's Options, and the environment variables that set their defaults.

Options is frozen and built once per Session (Options.make): a key it does not know, or a value of the wrong type, is
an error that lists the valid keys. Values may come as text (a command line's KEY=VALUE) and are converted by the
field's type. Environment variables are read here and nowhere else (Environment).

Fields after the pass switches force a path the planner would otherwise choose by device: tests use them to run on
lavapipe the plans another device (an H200) gets by default, and a tuner may use them to compare choices.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import MinirtError

PRECISIONS = ("fp32", "fp16")
# fp32_precision: "ieee" (exact fp32 arithmetic) or a split scheme on the fp16 tensor cores (minirt/kernels/gemm.py)
FP32_PRECISIONS = ("ieee", "f16x3")
STORAGES = ("auto", "texture", "buffer")
COOPMAT_MODES = ("auto", "off", "emulate")
DIRECT_IO = ("off", "in", "out", "both")
# kernel families a forced local size may apply to (the others size their work from their local size)
FORCEABLE_FAMILIES = ("gemm", "im2col", "elementwise", "conv", "copy")
GEMM_TILES = ("t44", "t44k32")
CM_TILES = ("m64n64k32s1", "m64n128k32s1", "r64n64", "r32n64")
CM2_TILES = ("m64n64k64", "m64n128k64", "m128n128k32", "m128n128k64", "m256n128k64", "m128n256k64")   # gemm.CM2_TILES
CONV_ROUTES = ("linear", "im2col", "pointwise", "depthwise", "direct")

_OFF = ("", "0", "false", "off", "no")
_ON = ("1", "true", "on", "yes")


def _flag(v):
    if isinstance(v, str):
        s = v.strip().lower()
        if s in _OFF or s in _ON:
            return s in _ON
    if isinstance(v, bool) or v in (0, 1):
        return bool(v)
    raise ValueError("a boolean (true/false, 1/0, on/off)")


def _count(v):
    try:
        n = int(v) if not isinstance(v, bool) else 0
    except (TypeError, ValueError):
        n = 0
    if isinstance(v, float) and v != n or n < 1:
        raise ValueError("an integer >= 1")
    return n


def _number(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = -1.0
    if not x >= 0 or x == float("inf"):
        raise ValueError("a finite number >= 0")
    return x


def _coopmat(v):
    """coopmat: "auto", "off" or "emulate" (True and False read as auto and off)."""
    if isinstance(v, bool) or (isinstance(v, str) and v.strip().lower() in _OFF + _ON):
        return "auto" if _flag(v) else "off"
    return _choice(COOPMAT_MODES)(v)


def _choice(choices):
    def conv(v):
        if v not in choices:
            raise ValueError(f"one of {', '.join(map(str, choices))}")
        return v
    return conv


def _column_count(v):
    """rows_columns: 1, 2 or 4."""
    n = _count(v)
    if n not in (1, 2, 4):
        raise ValueError("1, 2 or 4")
    return n


def _rows_count(v):
    """rows_max: 1 to 32 (glsl/linear_rows.comp's most rows)."""
    n = _count(v)
    if n > 32:
        raise ValueError("an integer from 1 to 32 (the few-row kernel's most rows)")
    return n


def _ints(n=None, low=1, want=None):
    """A tuple of positive ints, from a tuple or text such as "16,4,1" or "16x4x1"; `want` says what in errors."""
    counts = n if isinstance(n, tuple) else (n,)
    want = want or (f"{' to '.join(map(str, (counts[0], counts[-1]))) if len(counts) > 1 else n} integers >= {low} "
                    f"such as {'x'.join(['16', '4', '1', '2'][:counts[-1]])}")

    def conv(v):
        try:
            parts = v.replace("x", ",").split(",") if isinstance(v, str) else list(v)
            t = tuple(int(p) for p in parts)
        except (TypeError, ValueError):
            raise ValueError(want) from None
        if len(t) not in counts or min(t, default=0) < low:
            raise ValueError(want)
        return t
    return conv


def _local_size(v):
    t = _ints((1, 2, 3))(v)
    return t + (1,) * (3 - len(t))


def parse_local_size(v) -> tuple:
    """(x, y, z) from a tuple or text such as "16,4,1" or "16x4x1"."""
    try:
        return _local_size(v)
    except ValueError:
        raise MinirtError(f"a local size is 1 to 3 positive integers such as 16,4,1; got {v!r}") from None


def _names(choices):
    def conv(v):
        if not isinstance(v, (str, tuple, list)):
            raise ValueError(f"names from {', '.join(choices)}")
        t = tuple(s for s in (v.replace(",", "+").split("+") if isinstance(v, str) else v) if s)
        bad = [s for s in t if s not in choices]
        if bad:
            raise ValueError(f"names from {', '.join(choices)} (not {', '.join(map(str, bad))})")
        return t
    return conv


def _optional(conv):
    def opt(v):
        return None if v is None or (isinstance(v, str) and v.strip().lower() in ("", "none", "auto")) else conv(v)
    return opt


def _stream(v):
    """attention_stream: True (the device's rule), False (off) or a group count >= 2."""
    if isinstance(v, bool) or (isinstance(v, str) and v.strip().lower() in _OFF + _ON) or v == 0:
        return _flag(v)
    n = _count(v)
    if n == 1:
        return True
    return n


def _opt(default, conv, doc, device=""):
    return field(default=default, metadata={"conv": conv, "doc": doc, "device": device})


@dataclass(frozen=True)
class Options:
    """A Session's settings. Build with Options.make(**keys) (or Session(..., options={...})): it checks every key and
    converts text values."""

    precision: str = _opt("fp32", _choice(PRECISIONS),
                          "fp32, or fp16: weights and activations in 16-bit storage, fp32 arithmetic; inputs and "
                          "outputs stay float32", "any with 16-bit storage buffers")
    fp32_precision: str = _opt("ieee", _choice(FP32_PRECISIONS),
                               "how fp32 GEMMs (Linear layers, im2col convs) and attention multiply: ieee (fp32 "
                               "arithmetic), or f16x3 (each operand split into fp16 hi + lo parts, three products on "
                               "the tensor cores, fp32 accumulation and softmax: about fp32's accuracy, "
                               "docs/usage.md); where it cannot run, ieee, with a plan note; precision fp32 only",
                               "devices with VK_KHR_cooperative_matrix in NVIDIA's 'mma' layout (coopmat=emulate: any)")
    storage: str = _opt("auto", _choice(STORAGES),
                        "where activations live: auto (textures on Adreno, Mali and PowerVR, buffers for what their "
                        "images cannot hold; buffers elsewhere), texture or buffer")
    quantize_weights: str = _opt("off", _choice(("off", "int8")),
                                 "int8: every float Linear weight (MatMul, Gemm) quantized at planning per output "
                                 "column, symmetric, onto the int8 GEMM kernels (a byte a weight on the GPU; buffer "
                                 "storage, K a multiple of 4), and every Conv weight on a buffer-GEMM route (im2col, "
                                 "linear) per output channel; off: weights as the model holds them")
    conv1d_rewrite: bool = _opt(True, _flag, "run 1-D convolutions as 2-D ones over a height of 1 "
                                "(MINIRT_NO_CONV1D_REWRITE=1 turns it off)")
    local_size: tuple | None = _opt(None, _optional(_local_size),
                                    "force one local work-group size (x,y,z) on every forceable dispatch "
                                    "(MINIRT_LOCAL_SIZE); checked against the device's limits")
    local_size_families: tuple = _opt(FORCEABLE_FAMILIES, _names(FORCEABLE_FAMILIES),
                                      "the kernel families local_size applies to")
    coopmat: str = _opt("auto", _coopmat,
                        "cooperative-matrix kernels at fp16 (and fp32_precision's at fp32): auto (where the device "
                        "has them), off, or emulate (their logic in plain code, on any device with subgroups: for "
                        "tests)",
                        "devices with VK_KHR_cooperative_matrix")
    coopmat2: bool = _opt(False, _flag,
                          "the fp16 GEMMs of Linear layers and im2col convs on workgroup-scope tensor-core matrices "
                          "(glsl/linear_cm2.comp) where the device has VK_NV_cooperative_matrix2 and coopmat is auto; "
                          "off (the default: on an H100, driver 580.159, it ran 1.4-2.3x slower than linear_cmreg at "
                          "Whisper's encoder shapes, docs/benchmarks.md): the VK_KHR_cooperative_matrix GEMMs "
                          "(linear_cm, linear_cmreg)",
                          "devices with VK_NV_cooperative_matrix2")
    memory_reuse: bool = _opt(True, _flag, "activations share memory once their last reader has run (off: every "
                              "tensor its own bytes, a debugging aid)")
    poison: bool = _opt(False, _flag, "fill activations with NaN before each run, so an element no kernel writes "
                        "shows (a testing aid)")
    direct_io: str = _opt("off", _choice(DIRECT_IO),
                          "graph inputs and/or outputs in host memory that kernels read and write over the bus "
                          "instead of staging copies (MINIRT_DIRECT_IO)", "buffer storage")
    zero_copy: bool = _opt(True, _flag, "return outputs in host memory the GPU copied them into (3 sets, reused once "
                           "the caller lets go of them), without a host copy; off, or every set kept: one host copy "
                           "into memory faulted in while the GPU runs (MINIRT_ZERO_COPY)",
                           "drivers with VK_EXT_external_memory_host, buffer storage")
    max_load_bytes: int | None = _opt(None, _optional(_count),
                                      "bytes of constants loading may make beyond what the model files hold (load-time "
                                      "folding, summed over the graph), checked before allocating; default: 1 GiB "
                                      "(minirt.graph.MAX_LOAD_BYTES)")
    timeout_s: float = _opt(600.0, _number, "seconds a run may take on the GPU before a DeviceError "
                            "(MINIRT_TIMEOUT_S)")
    spin_ms: float | None = _opt(None, _optional(_number),
                                 "milliseconds to poll a run's fence before a sleeping wait (MINIRT_SPIN_MS); "
                                 "default: the device table's")
    # planner passes that may be turned off (debugging, measuring what a pass gains): each is named as the pass, which
    # declares it (OPTION in its module)
    fold_batch_norm: bool = _opt(True, _flag, "pass: an inference BatchNormalization after a Conv -> the conv's "
                                 "weight and bias")
    fold_pad_conv: bool = _opt(True, _flag, "pass: a zero Pad of the spatial axes before a Conv -> the conv's pads")
    fuse_layer_norm: bool = _opt(True, _flag, "pass: LayerNorm spelt out as ReduceMean chains -> one dispatch; "
                                 "GroupNorm of one channel a group -> one InstanceNormalization")
    fuse_silu: bool = _opt(True, _flag, "pass: Mul(x, Sigmoid(x)) -> one Silu, which joins a conv or Linear epilogue")
    conv_output_nlc: bool = _opt(True, _flag, "pass: an im2col conv + channels-last Transpose (+ Add) -> one GEMM")
    conv_input_nlc: bool = _opt(True, _flag, "pass: a 1-D im2col conv reading another's output reads it as rows")
    conv_channels_last: bool = _opt(True, _flag, "pass: 2-D convs on the buffer GEMM keep activations channels-last "
                                    "(NHWC) between them; 1x1 convs run as Linears over pixels")
    fuse_linear: bool = _opt(True, _flag, "pass: MatMul + bias + scale + activation + residual -> one Linear")
    merge_siblings: bool = _opt(True, _flag, "pass: Linears reading the same input -> one GEMM")
    fuse_attention: bool = _opt(True, _flag, "pass: head splits + MatMul (+ mask) + Softmax + MatMul -> one Attention")
    fuse_reduce_layer_norm: bool = _opt(True, _flag, "pass: a split GEMM's reduce pass also does the next LayerNorm")
    fuse_norm_linear_rows: bool = _opt(True, _flag, "pass: a LayerNorm read only by a few-row Linear (a decoder "
                                       "step's) is done by that Linear as it reads its rows")
    # -- forcing a path (tests, tuning) ---------------------------------------------------------------------------
    conv_route: str | None = _opt(None, _optional(_choice(CONV_ROUTES)), "force every Conv onto one route")
    fast_gemm: bool = _opt(True, _flag, "off: the generic GEMM (glsl/gemm.comp) where glsl/linear.comp would run")
    gemm_tile: str | None = _opt(None, _optional(_choice(GEMM_TILES)),
                                 "linear.comp tile: t44 (16-deep slices) or t44k32 (32-deep; discrete GPUs' default)")
    gemm_splitk: int | None = _opt(None, _optional(_count), "split every eligible GEMM's K this many ways (the "
                                   "few-row Linear's too, where its output is row-major)")
    rows_columns: int | None = _opt(None, _optional(_column_count),
                                    "vec4 columns each lane of the few-row Linear (glsl/linear_rows.comp) takes: 1, "
                                    "2 or 4; default: 16 bytes of weights a load (at most 2 past 4 rows, 1 past 8)")
    rows_max: int | None = _opt(None, _optional(_rows_count),
                                "Linears of at most this many rows (1-32) run on the few-row kernel "
                                "(glsl/linear_rows.comp) instead of the tiled or tensor-core GEMMs; default: the "
                                "device table's (8)")
    rows_vec: bool = _opt(True, _flag, "the few-row Linear's lanes read their columns 16 bytes (4-bit: 8) a load "
                          "where the weight's width allows; off: a load a vec4 column group, lanes interleaved")
    cm_tile: str | None = _opt(None, _optional(_choice(CM_TILES)),
                               "tensor-core GEMM tile: m64n64k32s1 (default), m64n128k32s1 (where the default takes "
                               "more than one wave), r64n64 or r32n64 (register-fed)", "cooperative-matrix devices")
    cm_regfed: bool = _opt(True, _flag, "the register-fed tensor-core GEMM where it applies",
                           "devices whose cooperative matrices have the 'mma' layout")
    cm2_tile: str | None = _opt(None, _optional(_choice(CM2_TILES)),
                                "linear_cm2 block mBMnBNkBK: one of " + ", ".join(CM2_TILES) + " (default: by the "
                                "grid, minirt/kernels/gemm.py cm2_tile)", "devices with VK_NV_cooperative_matrix2")
    pair_lanes: bool | None = _opt(None, _optional(_flag), "paired lanes in linear.comp and the attention "
                                   "(PAIR_LANES); default: the device table's")
    rows_invocations: int | None = _opt(None, _optional(_count), "invocations a group of the row kernels "
                                        "(LayerNorm); default: the device table's")
    attention_splits: int | None = _opt(None, _optional(_count), "split every attention's keys this many ways")
    attention_rows: int | None = _opt(None, _optional(_count), "query rows of the decoder's cross-attention "
                                      "(CachedAttention over every key) that read the same keys and values: up to "
                                      "this many a work group, each key read once for them (1: a group a row); "
                                      "default 8 (minirt/kernels/attention_cached.py ROWS_MAX)")
    attention_rows_by_map: bool = _opt(False, _flag, "also group, at run time, consecutive batch rows that the items "
                                       "map sends to one K/V row (beams on a batch's rows); off by default: a greedy "
                                       "batch sends each row to a clip of its own, where grouping only costs")
    attention_stream: bool | int = _opt(True, _stream, "stream splits of the attention's (query, key) blocks over "
                                        "one wave: True (where the device's rule says), False, or a group count")
    attention_tile: tuple | None = _opt(None, _optional(_ints((3, 4), want="THREADSxKGxRT or THREADSxKGxRTxNK "
                                                                            "(positive integers)")),
                                        "the fp32 attention tile THREADSxKGxRT[xNK]")
    attention_prefetch: bool | None = _opt(None, _optional(_flag), "the fp32 attention's K/V prefetch")
    attention_shuffle: bool = _opt(True, _flag, "off: the fp32 attention's row maxima through shared memory, as on "
                                   "devices without subgroup shuffles")
    attention_cm_reg: bool = _opt(True, _flag, "the tensor-core attention with its softmax in registers",
                                  "devices whose cooperative matrices have the 'mma' layout")
    coopmat_tile: tuple | None = _opt(None, _optional(_ints(3, want="NRxKSxBK (positive integers)")),
                                      "the tensor-core attention tile NRxKSxBK")
    cmr_tile: tuple | None = _opt(None, _optional(_ints(2, want="NRxBK (positive integers)")),
                                  "the register-softmax attention tile NRxBK")

    @classmethod
    def make(cls, options=None, **keys) -> "Options":
        """Options from a dict and/or keywords (keywords win), defaults from the environment (Environment)."""
        given = {**(options or {}), **keys}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        bad = sorted(k for k in given if k not in fields)
        if bad:
            raise MinirtError(f"unknown option{'s' if len(bad) > 1 else ''} {', '.join(map(repr, bad))}; valid keys: "
                              f"{', '.join(fields)}")
        values = {**environment().option_defaults(), **given}
        out = {}
        for k, v in values.items():
            try:
                out[k] = fields[k].metadata["conv"](v)
            except ValueError as e:     # every converter says what it wants
                raise MinirtError(f"option {k} must be {e}, got {v!r}") from None
        if out.get("fp32_precision", "ieee") != "ieee" and out.get("precision") == "fp16":
            raise MinirtError(f"option fp32_precision={out['fp32_precision']} sets how fp32 GEMMs multiply; it "
                              f"does not apply at precision fp16 (use fp32_precision=ieee, or precision fp32)")
        return cls(**out)

    @classmethod
    def of(cls, options) -> "Options":
        """options as Options: itself, or built from a dict (or None)."""
        return options if isinstance(options, cls) else cls.make(options)

    def replace(self, **keys) -> "Options":
        return Options.make({**dataclasses.asdict(self), **keys})

    def changed(self) -> dict:
        """The fields that differ from their defaults (what `minirt plan` shows)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}

    def pass_on(self, name: str) -> bool:
        """Whether planner pass `name` runs (its switch, named as the pass: minirt/planner/__init__.py PASSES), for
        what depends on a later pass."""
        return getattr(self, name)

    @property
    def planned_storage(self) -> str:
        """The storage passes plan for: make_plan resolves "auto" for the device first; a pass run on its own (tests)
        plans for buffers."""
        return "buffer" if self.storage == "auto" else self.storage


def option_table() -> list[tuple[str, str, str, str]]:
    """(name, default, what it does, where it matters) for every option: README and `minirt options`."""
    def text(v):
        return "+".join(v) if isinstance(v, tuple) else str(v)
    return [(f.name, text(f.default), f.metadata["doc"], f.metadata["device"] or "any")
            for f in dataclasses.fields(Options)]


@dataclass(frozen=True)
class Environment:
    """The process's environment variables, read once: MINIRT_DEVICE, MINIRT_VALIDATION, MINIRT_PIPELINE_STATS,
    MINIRT_CACHE_DIR, MINIRT_NO_PIPELINE_CACHE, the option defaults MINIRT_LOCAL_SIZE, MINIRT_NO_CONV1D_REWRITE,
    MINIRT_DIRECT_IO, MINIRT_ZERO_COPY, MINIRT_TIMEOUT_S, MINIRT_SPIN_MS, and CUDA_VISIBLE_DEVICES (minirt.ray)."""

    device: str = ""              # MINIRT_DEVICE: index or UUID of the default device
    # CUDA_VISIBLE_DEVICES: the GPUs Ray (or a user) gave this process, indices or UUIDs; only minirt.ray reads it,
    # to find the Vulkan device of a Ray worker's GPU (Vulkan itself ignores it)
    cuda_visible_devices: str = ""
    validation: bool = False      # enable the Khronos validation layer
    pipeline_stats: bool = False  # ask the driver for pipeline statistics (tools/profile)
    cache_dir: Path | None = None  # the pipeline cache folder; None: off
    options: tuple = ()           # (option, value) pairs the environment sets

    def option_defaults(self) -> dict:
        return dict(self.options)


_OPTION_ENV = (("MINIRT_LOCAL_SIZE", "local_size", str), ("MINIRT_DIRECT_IO", "direct_io",
               lambda s: {"0": "off", "1": "both"}.get(s.strip().lower(), s.strip().lower())),
               ("MINIRT_ZERO_COPY", "zero_copy", str), ("MINIRT_TIMEOUT_S", "timeout_s", str),
               ("MINIRT_SPIN_MS", "spin_ms", str),
               ("MINIRT_NO_CONV1D_REWRITE", "conv1d_rewrite", lambda s: not _flag(s)))


def read_environment(env=None) -> Environment:
    """Environment from `env` (default os.environ); a malformed value is an error naming the variable."""
    env = os.environ if env is None else env
    opts = []
    for var, key, conv in _OPTION_ENV:
        raw = env.get(var, "").strip()
        if raw:
            try:
                value = conv(raw)
                Options.__dataclass_fields__[key].metadata["conv"](value)
            except (TypeError, ValueError) as e:
                raise MinirtError(f"environment variable {var}={raw!r} is not valid: {e}") from None
            opts.append((key, value))
    cache = env.get("MINIRT_CACHE_DIR", "").strip()
    xdg = env.get("XDG_CACHE_HOME", "").strip()
    # $MINIRT_CACHE_DIR, else $XDG_CACHE_HOME/minirt (the XDG spec ignores a relative path), else ~/.cache/minirt
    cache_dir = (Path(cache).expanduser() if cache else
                 Path(xdg) / "minirt" if xdg and os.path.isabs(xdg) else Path.home() / ".cache" / "minirt")
    if env.get("MINIRT_NO_PIPELINE_CACHE", "").strip() not in ("", "0"):
        cache_dir = None
    return Environment(device=env.get("MINIRT_DEVICE", "").strip(),
                       cuda_visible_devices=env.get("CUDA_VISIBLE_DEVICES", "").strip(),
                       validation=env.get("MINIRT_VALIDATION", "").strip() not in ("", "0"),
                       pipeline_stats=env.get("MINIRT_PIPELINE_STATS", "").strip() not in ("", "0"),
                       cache_dir=cache_dir, options=tuple(opts))


def environment() -> Environment:
    """The environment as it is now (read each time: tests and tools set variables between Sessions)."""
    return read_environment()

