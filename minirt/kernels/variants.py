"""What Python knows about the kernels in glsl/: how a variant is named, the names of each kernel's specialization
constants, and the epilogue activations (the codes the kernels take, with numpy references).

A variant is named by its source's stem and the values of its variant axes (the `// variants:` line of
glsl/<stem>.comp), in AXES order, leaving out the values in DEFAULT_VALUES:
    variant("attention", storage="buffer", max="shuffle", dtype="half") == "attention_buffer_shuffle_half"
tools/build_shaders.py names what it builds with variant(), so a name made here is a name in spirv/manifest.json.

Standard library only at import: tools/build_shaders.py loads this file by path, without the minirt package."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Variant axes in the order their values appear in a name (whatever order a `// variants:` line lists them in).
AXES = ("storage", "a", "b", "max", "post", "tile", "impl", "dir", "w", "dtype", "io")
DEFAULT_VALUES = {"dtype": "float", "max": "smem", "io": "elem", "post": "none", "w": "float"}   # left out of names
# The row kernels (glsl/layer_norm_rows.comp, linear_reduce.comp post=ln) keep a row in registers: this many vec4 a
# lane, so a row of at most ROW_VEC4_PER_LANE x subgroup size vec4 fits one subgroup.
ROW_VEC4_PER_LANE = 4


def variant(stem: str, **axes) -> str:
    """The name of the variant of glsl/<stem>.comp with these axis values; an axis given None takes its default."""
    unknown = [k for k in axes if k not in AXES]
    if unknown:
        raise ValueError(f"kernel {stem}: unknown variant axis {unknown[0]!r} (minirt/kernels/variants.py AXES: "
                         f"{', '.join(AXES)})")
    return "_".join([stem, *(str(axes[k]) for k in AXES
                             if axes.get(k) is not None and axes[k] != DEFAULT_VALUES.get(k))])


# Specialization constants of each source, in constant_id order from 3 (ids 0-2 are the local size), as the GLSL
# declares them (`layout(constant_id = N) const TYPE NAME`, in the source or a header it includes; tests/test_kernels.py
# checks the two agree). Sources that include one header share its list.
_ATTENTION = ("DH", "KG", "RT", "PREFETCH", "NK", "PAIR_LANES", "MASK")              # attention.glslh
_LINEAR_CM = ("OUT_MODE", "ACT", "HAS_RES", "REG_EPI", "A_WIN", "VEC8", "EPI8")   # linear_cm.glslh
SPEC_CONSTANTS: dict[str, tuple[str, ...]] = {
    "attention": _ATTENTION,
    "attention_split": _ATTENTION,
    "attention_combine": ("DH",),
    "attention_cm": ("DH", "NR", "KS", "BK", "SPLIT"),
    "attention_cmr": ("DH", "NR", "BK", "SPLIT", "VEC8", "MASK"),
    "binary": ("OP",),
    "cast": (),
    "dynamic_quantize": (),
    "col2im": (),
    "cached_attention": ("DH",),
    "cached_attention_rows": ("DH", "R"),
    "concat": (),
    "conv": ("CONV1D",),
    "conv_dw": (),
    "coopmat_layout": (),
    "copy": ("MODE",),
    "copy_rows": ("VEC4",),
    "gemm": ("TM", "TN4", "BK", "A_MODE", "OUT_MODE", "ACT"),
    "im2col": ("IN_NHWC",),
    "layer_norm": ("HAS_BIAS", "PER_CHANNEL"),
    "layer_norm_rows": ("HAS_BIAS",),
    "linear": ("OUT_MODE", "ACT", "HAS_RES", "A_WIN", "PAIR_LANES"),
    **{stem: _LINEAR_CM for stem in ("linear_cm", "linear_cm_emu", "linear_cm_split", "linear_cm_emu_split",
                                     "linear_cmreg", "linear_cmreg_emu", "linear_cmreg_split", "linear_cmreg_emu_split")},
    "linear_cm2": ("BM", "BN", "BK", "OUT_MODE", "ACT", "HAS_RES"),
    "linear_reduce": ("ACT", "HAS_RES", "LN_BIAS"),      # LN_BIAS: post=ln variants only
    "linear_rows": ("ACT", "HAS_RES", "LN", "LN_BIAS", "ROWS", "CV", "SPLIT", "VEC"),   # LN, LN_BIAS: fuse_norm_linear_rows
    "matmul": ("TILE", "TRANS_A", "TRANS_B", "HAS_BIAS", "SQUEEZE_M"),
    "occupancy_probe": ("SHARED",),
    "pool": ("OP",),
    "reduce": ("OP",),
    "resize": (),
    "softmax": (),
    "storage_copy": (),
    "token_select": (),
    "unary": ("OP",),
}


def spec(stem: str, *, trim_from: str | None = None, **values) -> tuple[int, ...]:
    """The specialization constants of glsl/<stem>.comp, given by name, as the tuple a Dispatch carries (ids 3, 4, ...
    in order). The tuple ends with the last constant named; every one before it must be named too (the executor sets
    ids in order, so only trailing constants can be left at the kernel's default). trim_from: from that constant on,
    the ones after the last that is on (non-zero) are left out as well."""
    names = SPEC_CONSTANTS[stem]
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ValueError(f"kernel {stem} has no specialization constant {unknown[0]} (it has: {', '.join(names)})")
    end = max((names.index(k) + 1 for k in values), default=0)
    missing = [k for k in names[:end] if k not in values]
    if missing:
        raise ValueError(f"kernel {stem}: {missing[0]} comes before {names[end - 1]}, so it must be given too")
    out = [int(values[k]) for k in names[:end]]
    if trim_from is not None:
        keep = names.index(trim_from)
        while len(out) > keep and not out[-1]:
            out.pop()
    return tuple(out)


def erf(x):
    """The exact erf, elementwise in float64, for references (numpy has none)."""
    import math

    import numpy as np
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _gelu(y):
    import math
    return 0.5 * y * (1 + erf(y / math.sqrt(2)))


def _gelu_tanh(y):
    import math

    import numpy as np
    return 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))


def _relu(y):
    import numpy as np
    return np.maximum(y, 0)


def clip(y, lo, hi):
    """y clamped to [lo, hi], NaN kept; every value becomes hi where lo > hi (ONNX's Clip, as glsl/common.glslh
    clip_f)."""
    import numpy as np
    return np.minimum(np.maximum(y, lo), hi)


def _hard_swish(y):
    return y * clip(y / 6 + 0.5, 0, 1)


def _silu(y):
    import numpy as np
    with np.errstate(over="ignore", invalid="ignore"):     # -inf * 0 is NaN, as Sigmoid then Mul gives
        return y * (1 / (1 + np.exp(-y)))


@dataclass(frozen=True)
class Activation:
    code: int                     # ACT_<NAME> of glsl/activation.glslh: the ACT the epilogue kernels take
    unary: int                    # glsl/unary.comp's OP computing it on its own (for epilogues done as a pass)
    reference: Callable           # numpy


# The epilogue activations: name ("" for none) -> codes and reference. gemm, linear, linear_cm*, linear_reduce and
# conv_dw apply them through glsl/activation.glslh, whose ACT_* codes tests/test_kernels.py checks against these.
ACTIVATIONS: dict[str, Activation] = {
    "": Activation(0, 0, lambda y: y),
    "relu": Activation(1, 5, _relu),
    "gelu": Activation(2, 3, _gelu),
    "gelu_tanh": Activation(3, 4, _gelu_tanh),
    "hard_swish": Activation(4, 13, _hard_swish),
    "silu": Activation(5, 17, _silu),
}


# An epilogue activation named "res+<act>" comes after the GEMM's residual, act(v + r) (a ResNet block's
# relu(conv + skip)), not before it: the ACT code with glsl/activation.glslh's flag ACT_AFTER_RES.
RES_FIRST = "res+"
ACT_AFTER_RES = 16


def act_code(act: str | None) -> int:
    """The ACT code of an epilogue activation ("" or None: none; "res+<act>": after the residual)."""
    if act and act.startswith(RES_FIRST):
        return ACT_AFTER_RES | ACTIVATIONS[act[len(RES_FIRST):]].code
    return ACTIVATIONS[act or ""].code


def activate(y, act: str | None, residual=None):
    """The epilogue activation `act` ("" or None: none) in numpy, then the residual if given (for "res+<act>": the
    residual, then the activation), for references."""
    if act and act.startswith(RES_FIRST):
        return ACTIVATIONS[act[len(RES_FIRST):]].reference(y if residual is None else y + residual)
    y = ACTIVATIONS[act or ""].reference(y)
    return y if residual is None else y + residual


def activation_of(op: str, attrs: dict) -> str | None:
    """The epilogue activation an ONNX node computes on its own (what the fusion passes take into a GEMM's epilogue),
    or None."""
    if op == "Relu":
        return "relu"
    if op == "HardSwish":
        return "hard_swish"
    if op == "Silu":     # minirt's own, made by the fuse_silu pass
        return "silu"
    if op == "Gelu":
        return "gelu_tanh" if attrs.get("approximate", "none") == "tanh" else "gelu"
    return None
