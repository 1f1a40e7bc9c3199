"""minirt/kernels/variants.py against the GLSL and the build: variant names as tools/build_shaders.py builds them, the
specialization constants each kernel declares, the activation codes of glsl/activation.glslh, and the plans' dispatches
(kernel names made from stem and axes, every one a built variant)."""
import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from minirt import kernels, ops
from minirt.device_profile import KNOWN_PROFILES
from minirt.graph import Node
from minirt.infer import prepare
from minirt.kernels import ACTIVATIONS, SPEC_CONSTANTS, activate, activation_of, spec, variant
from minirt.loaders import load
from minirt.planner import make_plan

ROOT = Path(__file__).resolve().parents[1]
GLSL = ROOT / "glsl"
sys.path.insert(0, str(ROOT / "models"))
import whisper_encoder as we  # noqa: E402


def _build_shaders():
    spec_ = importlib.util.spec_from_file_location("build_shaders_under_test", ROOT / "tools" / "build_shaders.py")
    mod = importlib.util.module_from_spec(spec_)
    sys.modules[spec_.name] = mod      # its dataclasses look their module up there
    spec_.loader.exec_module(mod)
    return mod


bs = _build_shaders()


def _expanded(path: Path, seen=None) -> str:
    """A source with its #include "x" lines replaced by the header's text (every one, #ifdef or not)."""
    seen = set() if seen is None else seen
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
        if m and m.group(1) not in seen:
            seen.add(m.group(1))
            out.append(_expanded(GLSL / m.group(1), seen))
        elif not m:
            out.append(line)
    return "\n".join(out)


SOURCES = sorted(GLSL.glob("*.comp"))


def _axis_keys(src: Path) -> list:
    """The axes of a source's variants line, in the line's order."""
    for line in src.read_text().splitlines()[:bs.HEADER_SCAN_LINES]:
        m = bs.DIRECTIVE_RE.match(line)
        if m and m.group(1) == "variants":
            return list(bs.parse_pairs(m.group(2), src.name, multi=True))
    return []


def test_variant_names_are_the_built_ones():
    """Every variant build_shaders.py builds is named by its stem and non-default values in the variants line's order
    (so AXES's order never reorders a name), which is variant()'s name; spirv/manifest.json lists exactly those."""
    names = set()
    for src in SOURCES:
        keys = _axis_keys(src)
        for v in bs.variants_of(src, ROOT):
            chosen = {k: d[len(k) + 1:-len("=1")].lower() for k, d in zip(keys, v.defines)}   # KEY_VALUE=1
            assert v.name == "_".join([src.stem, *(x for k, x in chosen.items() if kernels.DEFAULT_VALUES.get(k) != x)])
            assert v.name == variant(src.stem, **chosen)
            names.add(v.name)
    manifest = json.loads((ROOT / "spirv" / "manifest.json").read_text())["shaders"]
    assert set(manifest) == names


def test_variant():
    assert variant("attention", dtype="half", max="shuffle", storage="buffer") == "attention_buffer_shuffle_half"
    assert variant("linear_reduce", post="ln", dtype="float", io="elem") == "linear_reduce_ln"
    assert variant("linear_reduce", post="none", dtype="half", io=None) == "linear_reduce_half"
    assert variant("linear_cm_split", tile="m64n64k32s1", dtype="half") == "linear_cm_split_m64n64k32s1_half"
    with pytest.raises(ValueError, match="flavour"):
        variant("gemm", flavour="x")


def test_spec_constants_are_the_glsl_declarations():
    """SPEC_CONSTANTS lists, for every source, its layout(constant_id = N) constants from id 3 on, in id order with
    no gap (including those of headers it includes)."""
    assert set(SPEC_CONSTANTS) == {s.stem for s in SOURCES}
    for src in SOURCES:
        decl = re.findall(r"layout\s*\(\s*constant_id\s*=\s*(\d+)\s*\)\s*const\s+\w+\s+(\w+)", _expanded(src))
        assert [int(i) for i, _ in decl] == list(range(3, 3 + len(decl))), src.name
        assert tuple(name for _, name in decl) == SPEC_CONSTANTS[src.stem], src.name


def test_spec():
    full = dict(OUT_MODE=0, ACT=2, HAS_RES=True)
    assert spec("linear", **full) == (0, 2, 1)
    assert spec("linear", **full, A_WIN=False, PAIR_LANES=False, trim_from="A_WIN") == (0, 2, 1)
    assert spec("linear", **full, A_WIN=True, PAIR_LANES=False, trim_from="A_WIN") == (0, 2, 1, 1)
    assert spec("linear", **full, A_WIN=False, PAIR_LANES=True, trim_from="A_WIN") == (0, 2, 1, 0, 1)
    assert spec("linear", OUT_MODE=0, ACT=0, HAS_RES=0, trim_from="OUT_MODE") == ()
    assert all(type(v) is int for v in spec("linear", **full, A_WIN=True))
    with pytest.raises(ValueError, match="HAS_RES"):
        spec("linear", OUT_MODE=0, ACT=1, A_WIN=True)      # a constant before one given is missing
    with pytest.raises(ValueError, match="VEC8"):
        spec("linear", OUT_MODE=0, VEC8=True)              # linear.comp has no VEC8


def _header_codes():
    text = (GLSL / "activation.glslh").read_text()
    return {name.lower(): int(code) for name, code in re.findall(r"#define\s+ACT_(\w+)\s+(\d+)", text)}


def test_activation_codes_are_the_headers():
    assert _header_codes() == {name or "none": a.code for name, a in ACTIVATIONS.items()}


def test_one_activate_in_the_glsl():
    """activate() is defined once, in activation.glslh; every kernel with an ACT (a specialization constant or a
    #define) includes it."""
    defining = [p.name for p in sorted(GLSL.iterdir()) if re.search(r"float\s+activate\s*\(", p.read_text())]
    assert defining == ["activation.glslh"]
    takers = [s.stem for s in SOURCES if re.search(r"const\s+int\s+ACT\b|#define\s+ACT\b", _expanded(s))]
    assert sorted(takers) == sorted({"gemm", "linear", "linear_reduce", "linear_rows", "conv_dw"} |
                                    {s for s in SPEC_CONSTANTS if s.startswith("linear_cm")})
    for stem in takers:
        assert "float activate(float x)" in _expanded(GLSL / f"{stem}.comp"), stem


@pytest.mark.parametrize("op, attrs, name", [("Relu", {}, "relu"), ("Gelu", {}, "gelu"),
                                              ("Gelu", {"approximate": "none"}, "gelu"),
                                              ("Gelu", {"approximate": "tanh"}, "gelu_tanh"),
                                              ("HardSwish", {}, "hard_swish"), ("Sigmoid", {}, None)])
def test_activations_of_onnx_nodes(op, attrs, name):
    """The activation a node computes, the unary kernel's OP for it (as the op lowers it alone) and its reference."""
    node = Node(op, "n", ["x"], ["y"], attrs)
    assert activation_of(op, attrs) == name
    if name is None:
        return
    assert ACTIVATIONS[name].unary == ops.get(op).code_for(node)
    x = np.linspace(-4, 4, 33).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(activate(x, name)).astype(np.float32), ops.get(op).reference(node, x)[0])


@pytest.mark.parametrize("profile, precision, options", [
    ("nvidia-h200", "fp32", {}), ("nvidia-h200", "fp16", {}), ("lavapipe", "fp16", {"coopmat": "emulate"}),
    ("lavapipe", "fp16", {"coopmat": "emulate", "gemm_splitk": 2, "cm_regfed": False}),
    ("lavapipe", "fp32", {"fast_gemm": False}), ("adreno-840", "fp16", {}), ("lavapipe", "fp32", {"gemm_splitk": 2}),
    ("nvidia-h200", "fp32", {"fp32_precision": "f16x3"}),
    ("lavapipe", "fp32", {"fp32_precision": "f16x3", "coopmat": "emulate", "gemm_splitk": 2})])
def test_dispatches_name_built_kernels(profile, precision, options):
    """Each dispatch's kernel is variant(stem, **axes), a variant in the manifest, with at most as many specialization
    constants as its source declares."""
    manifest = json.loads((ROOT / "spirv" / "manifest.json").read_text())["shaders"]
    g = prepare(load(we.build_whisper_encoder("tiny", layers=1)))
    plan = make_plan(g, KNOWN_PROFILES[profile], None, {"precision": precision, **options})
    for d in plan.dispatches:
        assert d.kernel == variant(d.stem, **d.axes) and d.kernel in manifest, d
        assert len(d.spec) <= len(SPEC_CONSTANTS[d.stem]), d
