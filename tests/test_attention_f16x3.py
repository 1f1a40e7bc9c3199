"""fp32_precision="f16x3" on the Attention op: attention_cmr's dtype=f16x3 variant (glsl/attention_cmr.comp SPLIT3,
minirt/kernels/attention_cmr.py split_problem and lower), fp32 attention from split operands on cooperative matrices.

Plan level (the fake profiles): where it runs, with which tile and note; where it does not, the fp32 SIMT kernel and a
note saying why; and the plans it must leave alone (devices without cooperative matrices, precision fp16,
fp32_precision ieee) against digests of their kernel choices taken before the option reached attention.
Numerics against float64 numpy, beside the fp32 SIMT kernel's error on the same inputs, in two modes:
  coopmat   the real kernel; skipped unless the device has cooperative matrices in the "mma" layout (an H200)
  emulated  attention_cmr_emu_f16x3: the same splits, scales, softmax and sums with the matrix operations and shuffles
            as plain code (lavapipe too; its pipelines at head dim 64 take minutes to compile the first time)."""
import dataclasses
import hashlib
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.errors import UnsupportedError
from minirt.infer import prepare
from minirt.loaders import load
from minirt.kernels import attention_cmr
from minirt.planner import make_plan
from test_coopmat_linear import _device_or_skip as _cm_device_or_skip
from test_fuse_attention import attention_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import whisper_encoder as we  # noqa: E402

H200 = KNOWN_PROFILES["nvidia-h200"]
SPLIT = {"fp32_precision": "f16x3"}
MODES = ("coopmat", "emulated")


def _models():
    return {"whisper": we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=1),
            "masked": attention_model(1, 70, 90, 2, 64, mask=(1, 1, 70, 90)),
            "dh32": attention_model(2, 37, 53, 2, 32)}


def _choices(plan):
    return [(d.kernel, tuple(d.spec), tuple(d.global_size)) for d in plan.dispatches]


def _attention(plan):
    return [d for d in plan.dispatches if d.op == "Attention" and "combine" not in d.kernel]


def _notes(plan):
    return [t for ts in plan.notes.values() for t in ts]


# -- plan level --------------------------------------------------------------------------------------------------

# sha256 (first 16 hex digits) of each default plan's kernel choices, [(kernel, spec, global size)], at precision
# fp32 (fp32_precision ieee) and fp16, as they were before fp32_precision reached attention: the split attention must
# not move them. A deliberate change to one of these plans updates its digest (the test prints them all).
DIGESTS = {
    "adreno-840/whisper/fp32": "4c87d8ed6a39f5e6", "adreno-840/whisper/fp16": "73685f8cd7a3c38c",
    "adreno-840/masked/fp32": "a02511f4d771b798", "adreno-840/masked/fp16": "9e04162e0cf1cb93",
    "adreno-840/dh32/fp32": "5d0664e35cf3565b", "adreno-840/dh32/fp16": "5b461f61f2e820fc",
    "mali-g715/whisper/fp32": "4c87d8ed6a39f5e6", "mali-g715/whisper/fp16": "73685f8cd7a3c38c",
    "mali-g715/masked/fp32": "a02511f4d771b798", "mali-g715/masked/fp16": "9e04162e0cf1cb93",
    "mali-g715/dh32/fp32": "5d0664e35cf3565b", "mali-g715/dh32/fp16": "5b461f61f2e820fc",
    "powervr/whisper/fp32": "4c87d8ed6a39f5e6", "powervr/whisper/fp16": "refused",
    "powervr/masked/fp32": "a02511f4d771b798", "powervr/masked/fp16": "refused",
    "powervr/dh32/fp32": "5d0664e35cf3565b", "powervr/dh32/fp16": "refused",
    "nvidia-h200/whisper/fp32": "db98fea1b59f9067", "nvidia-h200/whisper/fp16": "562588f6c75f34c1",
    "nvidia-h200/masked/fp32": "fc51682d1ff0140a", "nvidia-h200/masked/fp16": "5db2102c3776f96d",
    "nvidia-h200/dh32/fp32": "97f5263975d362dc", "nvidia-h200/dh32/fp16": "e54e83c296a32d88",
    "lavapipe/whisper/fp32": "466eafff970809fa", "lavapipe/whisper/fp16": "f96685561edb0132",
    "lavapipe/masked/fp32": "d3583e12fd86346b", "lavapipe/masked/fp16": "29ceeaf7f4df649e",
    "lavapipe/dh32/fp32": "bb00a3bd172a1b22", "lavapipe/dh32/fp16": "05ff3adb3fe9dadd",
    "tiny-limits/whisper/fp32": "ab0f872af6740811", "tiny-limits/whisper/fp16": "refused",
    "tiny-limits/masked/fp32": "a02511f4d771b798", "tiny-limits/masked/fp16": "refused",
    "tiny-limits/dh32/fp32": "5d0664e35cf3565b", "tiny-limits/dh32/fp16": "refused",
}


def test_default_plans_keep_their_kernel_choices():
    """ieee and fp16 plans on every known profile: the same kernels, constants and grids as before."""
    got = {}
    for gname, model in _models().items():
        g = prepare(load(model))
        for pname, prof in KNOWN_PROFILES.items():
            for prec in ("fp32", "fp16"):
                try:
                    c = _choices(make_plan(g, prof, "buffer", {"precision": prec}))
                    got[f"{pname}/{gname}/{prec}"] = hashlib.sha256(repr(c).encode()).hexdigest()[:16]
                except UnsupportedError:
                    got[f"{pname}/{gname}/{prec}"] = "refused"
    print(got)
    assert got == DIGESTS


def test_without_cooperative_matrices_f16x3_changes_nothing():
    """On every profile without cooperative matrices, and on the H200 with coopmat=off, the f16x3 plan is the ieee plan
    dispatch for dispatch (arguments and push constants too), with a note on each attention saying why."""
    cases = [(p, {}) for p in KNOWN_PROFILES.values() if not p.cooperative_matrix] + [(H200, {"coopmat": "off"})]
    for gname, model in _models().items():
        g = prepare(load(model))
        for prof, opts in cases:
            ieee, split = (make_plan(g, prof, "buffer", {**opts, "fp32_precision": s}) for s in ("ieee", "f16x3"))
            assert [(d.kernel, d.spec, d.global_size, d.args, d.push) for d in split.dispatches] == \
                [(d.kernel, d.spec, d.global_size, d.args, d.push) for d in ieee.dispatches], (prof.name, gname)
            why = [t for t in _notes(split) if "not applied to attention" in t]
            assert len(why) == len(_attention(split)) and all(t.endswith("the fp32 SIMT kernel") for t in why)


def test_h200_runs_both_products_on_the_split_kernel():
    """Whisper-tiny's attention at fp32_precision f16x3 on the H200 profile: attention_cmr_khr_f16x3 with the fp16
    kernel's tile, no VEC8 (its fp32 vec4 loads are 16 bytes), MASK where masked, and a note; the rest of the plan is
    the GEMM-only one's."""
    for gname, model in _models().items():
        g = prepare(load(model))
        plan = make_plan(g, H200, "buffer", SPLIT)
        (d,) = _attention(plan)
        dh = {"dh32": 32}.get(gname, 64)
        assert d.kernel == "attention_cmr_khr_f16x3", d.kernel
        assert d.spec[:3] == (dh, *attention_cmr.TILES[0]) and d.spec[4:] == ((0, 1) if gname == "masked" else ())
        notes = plan.notes[d.node]
        assert any(t.startswith("fp32_precision f16x3: fp32 attention on tensor cores from split operands")
                   for t in notes), notes
        assert all(plan.tensors[a].dtype == "float32" for a, _ in d.args[:4])
        # with the attention left to the SIMT kernel (attention_cm_reg=False) the rest is the same
        other = make_plan(g, H200, "buffer", {**SPLIT, "attention_cm_reg": False})
        assert [x.kernel for x in other.dispatches if x.op != "Attention"] == \
            [x.kernel for x in plan.dispatches if x.op != "Attention"]
        assert not _attention(other)[0].kernel.startswith("attention_cmr")
    # Whisper-tiny's full encoder shape: one dispatch, 24 query blocks x 6 heads
    d = _attention(make_plan(prepare(load(attention_model(1, 1500, 1500, 6, 64))), H200, "buffer", SPLIT))[0]
    assert d.kernel == "attention_cmr_khr_f16x3" and d.global_size[1] == 24 and d.global_size[2] % 6 == 0


@pytest.mark.parametrize("text, profile, options, dh", [
    ("option coopmat=off", H200, {"coopmat": "off"}, 64),
    ("option attention_cm_reg=False", H200, {"attention_cm_reg": False}, 64),
    ("no 16x16x16 f16 x f16 -> f32 cooperative matrices", KNOWN_PROFILES["lavapipe"], {}, 64),
    ("'mma' element layout", dataclasses.replace(H200, coopmat_layout=""), {}, 64),
    ("'mma' element layout", dataclasses.replace(H200, subgroup_shuffle=False), {}, 64),
    ("no shaderFloat16", dataclasses.replace(KNOWN_PROFILES["lavapipe"], fp16=False), {"coopmat": "emulate"}, 64),
    ("head dim 40 is not a multiple of 16", H200, {}, 40),
])
def test_where_it_does_not_apply_the_simt_kernel_with_a_note(text, profile, options, dh):
    plan = make_plan(prepare(load(attention_model(1, 40, 40, 2, dh))), profile, "buffer", {**SPLIT, **options})
    (d,) = _attention(plan)
    assert d.kernel.startswith("attention_buffer") or d.kernel.startswith("attention_split_buffer"), d.kernel
    why = [t for t in _notes(plan) if "not applied to attention" in t]
    assert len(why) == 1 and text in why[0], why


def test_texture_storage_and_emulation():
    g = prepare(load(attention_model(1, 40, 40, 2, 64)))
    tex = make_plan(g, H200, "texture", SPLIT)
    assert _choices(tex) == _choices(make_plan(g, H200, "texture", {}))
    assert any("reads buffers, not textures" in t for t in _notes(tex))
    # emulated: any device with shaderFloat16, the fp16 kernel's tile rules with the split's shared memory
    lp = KNOWN_PROFILES["lavapipe"]
    d = _attention(make_plan(g, lp, "buffer", {**SPLIT, "coopmat": "emulate"}))[0]
    assert d.kernel == "attention_cmr_emu_f16x3"
    assert attention_cmr.shared_bytes(64, *d.spec[1:3], True, True) <= lp.max_shared_memory
    assert attention_cmr.shared_bytes(64, 4, 32, split=True) == 2 * attention_cmr.shared_bytes(64, 4, 32) + 4 * 128
    with pytest.raises(UnsupportedError, match="cmr_tile"):
        make_plan(g, H200, "buffer", {**SPLIT, "cmr_tile": (32, 64)})


@pytest.mark.parametrize("dh", range(16, 129, 16))
def test_every_head_dim_has_a_tile_on_h200(dh):
    d = _attention(make_plan(prepare(load(attention_model(1, 50, 50, 1, dh))), H200, "buffer", SPLIT))[0]
    assert d.kernel == "attention_cmr_khr_f16x3"
    assert attention_cmr.tile_problem(dh, d.spec[1:3], H200.max_shared_memory, split=True) is None


# -- numerics ----------------------------------------------------------------------------------------------------

def _device_or_skip(mode):
    p = _cm_device_or_skip(mode)
    if mode == "coopmat" and p.coopmat_layout != "mma":
        pytest.skip(f"{p.name}: cooperative matrices not in the 'mma' layout")
    if not p.fp16:
        pytest.skip(f"{p.name}: no shaderFloat16")
    return p


def _mixed(rng, shape, lo, hi):
    """Values of random sign whose magnitudes spread evenly over 10^lo .. 10^hi."""
    return rng.choice([-1.0, 1.0], shape) * 10.0 ** rng.uniform(lo, hi, shape)


def _inputs(kind, B, Tq, Tk, D, rng):
    """q, k, v float32 of one kind: magnitudes from 1e-3 to 1e3, per tensor, per row or per element."""
    n = lambda T, s=1.0: rng.standard_normal((B, T, D)) * s  # noqa: E731
    if kind == "randn":
        q, k, v = n(Tq), n(Tk), n(Tk)
    elif kind == "q1e3 k1e-3 v1e3":
        q, k, v = n(Tq, 1e3), n(Tk, 1e-3), n(Tk, 1e3)
    elif kind == "q1e-3 k1e3 v1e-3":
        q, k, v = n(Tq, 1e-3), n(Tk, 1e3), n(Tk, 1e-3)
    elif kind == "sharp":         # logits in the tens to hundreds: the softmax amplifies every error in S
        q, k, v = n(Tq, 30.0), n(Tk), n(Tk, 1e-3)
    elif kind == "rows":          # each row its own magnitude, 1e-3 .. 1e3
        q = n(Tq) * 10.0 ** rng.uniform(-3, 1, (B, Tq, 1))
        k = n(Tk) * 10.0 ** rng.uniform(-3, 1, (B, Tk, 1))
        v = n(Tk) * 10.0 ** rng.uniform(-3, 3, (B, Tk, 1))
    else:                         # "elements": every element its own magnitude
        q, k, v = _mixed(rng, (B, Tq, D), -2, 0.5), _mixed(rng, (B, Tk, D), -2, 0.5), _mixed(rng, (B, Tk, D), -3, 3)
    return tuple(x.astype(np.float32) for x in (q, k, v))


def _mask(rng, shape):
    """An additive float mask: random values in [-8, 0], about a tenth -inf (no row of only -inf), and one row at
    float32's lowest everywhere (uniform there, as onnxruntime gives)."""
    m = rng.uniform(-8, 0, shape)
    m[rng.random(shape) < 0.1] = -np.inf
    m[..., 0] = rng.uniform(-1, 0, shape[:-1])
    if shape[-2] > 3:
        m[..., 3, :] = np.finfo(np.float32).min
    return m.astype(np.float32)


def _reference(q, k, v, H, mask=None):
    """float64 attention (scale dh^-0.5) and, per output, sum_j P_j |v_j|: the scale of fp32's rounding of it."""
    B, Tq, D = q.shape
    dh = D // H

    def heads(x):
        return x.astype(np.float64).reshape(B, -1, H, dh).transpose(0, 2, 1, 3)

    s = heads(q) @ heads(k).transpose(0, 1, 3, 2) * dh ** -0.5
    if mask is not None:
        s = s + mask.astype(np.float64)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    back = lambda x: x.transpose(0, 2, 1, 3).reshape(B, Tq, D)  # noqa: E731
    return back(p @ heads(v)), back(p @ np.abs(heads(v)))


def _errors(y, ref, scale):
    y = np.asarray(y, np.float64)
    assert np.isfinite(y).all(), "a non-finite output (an element not written?)"
    e = np.abs(y - ref) / scale
    return float(e.max()), float(e.mean())


def _options(mode, scheme, **extra):
    return {"poison": True, "fp32_precision": scheme, **({"coopmat": "emulate"} if mode == "emulated" else {}), **extra}


# The f16x3 kernel's error may exceed the fp32 kernel's by these factors (max, mean). It represents each operand to
# 2^-22 .. 2^-23 of itself (hi's 11 bits, lo's 11) and drops lo lo, where the fp32 kernel takes its inputs exact; at
# head dim 64 its shorter sums (fresh accumulators per block) make up for it (measured, emulated: max 0.5 to 1.5 x the
# fp32 kernel's, mean 0.6 to 1.0 x), at head dims 16 and 32 the dot products are too short to (max up to 2.7 x, on
# logits in the hundreds, mean up to 1.4 x).
MAX_FACTOR, MEAN_FACTOR = 3.0, 2.0
KINDS = ("randn", "q1e3 k1e-3 v1e3", "q1e-3 k1e3 v1e-3", "sharp", "rows", "elements")
# (B, Tq, Tk, H, dh, mask shape or None, forced (NR, BK) or None, key splits or None): head dim 64 with the default
# tile ((4, 32): ragged query and key blocks) with and without a mask; head dim 32 split across groups (the fp32
# partials and the combine pass); head dim 16 with splits that get no keys and a broadcast mask.
CASES = [(2, 70, 90, 2, 64, None, None, None), (1, 70, 90, 2, 64, (1, 1, 70, 90), None, None),
         (2, 37, 53, 2, 32, None, (2, 16), 2), (2, 37, 5, 1, 16, (2, 1, 1, 5), (1, 16), 3)]


def _case_id(c):
    return "x".join(map(str, c[:5])) + ("_mask" if c[5] else "") + (f"_split{c[7]}" if c[7] else "")


# Emulated, the head-dim-64 tile compiles for 5 to 16 minutes on lavapipe with an empty shader cache (a cold CI run:
# it alone would double the suite), so emulation checks the kernel's logic at head dims 16 and 32, and the 64 tile
# runs on real cooperative matrices (here and in test_kernel_at_the_whisper_shape).
@pytest.mark.slow
@pytest.mark.unoptimized
@pytest.mark.parametrize("mode, case", [pytest.param(m, c, id=f"{_case_id(c)}-{m}") for m in MODES for c in CASES
                                        if m == "coopmat" or c[4] <= 32])
def test_accuracy_against_float64_beside_the_fp32_kernel(mode, case):
    """Every input kind through one session per scheme: the f16x3 kernel's error against float64, relative to
    sum_j P_j |v_j|, within MAX_FACTOR / MEAN_FACTOR of the fp32 SIMT kernel's on the same inputs and below 2e-5; the
    same bits on a second run."""
    _device_or_skip(mode)
    B, Tq, Tk, H, dh, mshape, tile, S = case
    rng = np.random.default_rng(zlib.crc32(repr((mode, case)).encode()))
    extra = {**({"cmr_tile": tile} if tile else {}), **({"attention_splits": S} if S else {})}
    model = attention_model(B, Tq, Tk, H, dh, mask=mshape)
    with Session(model, storage="buffer", options=_options(mode, "ieee", **extra)) as ieee, \
            Session(model, storage="buffer", options=_options(mode, "f16x3", **extra)) as split:
        (d,) = _attention(split.plan)
        assert d.kernel == "attention_cmr_" + ("emu" if mode == "emulated" else "khr") + "_f16x3", d.kernel
        assert not _attention(ieee.plan)[0].kernel.startswith("attention_cmr")
        if S:
            assert any("combine" in x.kernel for x in split.plan.dispatches)
        for kind in KINDS:
            q, k, v = _inputs(kind, B, Tq, Tk, H * dh, rng)
            feeds = {"q": q, "k": k, "v": v}
            mask = None
            if mshape:
                feeds["mask"] = mask = _mask(rng, mshape)
            ref, scale = _reference(q, k, v, H, mask)
            y = split.run(None, feeds)[0]
            (emax, emean), (imax, imean) = _errors(y, ref, scale), _errors(ieee.run(None, feeds)[0], ref, scale)
            print(f"{mode} {case[:5]} {kind}: f16x3 max {emax:.3g} mean {emean:.3g}; fp32 kernel max {imax:.3g} "
                  f"mean {imean:.3g}")
            assert emax <= MAX_FACTOR * imax and emean <= MEAN_FACTOR * imean, (kind, emax, imax, emean, imean)
            assert emax < 2e-5, kind
            assert split.run(None, feeds)[0].tobytes() == y.tobytes(), f"{kind}: another output on a second run"


@pytest.mark.parametrize("case", CASES[:2], ids=("plain", "masked"))
def test_kernel_at_the_whisper_shape(case):
    """The real kernel at Whisper-tiny's encoder shape (1500 x 1500 keys, 6 heads of 64), unmasked and masked."""
    _device_or_skip("coopmat")
    rng = np.random.default_rng(7)
    mshape = (1, 1, 1500, 1500) if case[5] else None
    model = attention_model(1, 1500, 1500, 6, 64, mask=mshape)
    with Session(model, storage="buffer", options=_options("coopmat", "ieee")) as ieee, \
            Session(model, storage="buffer", options=_options("coopmat", "f16x3")) as split:
        assert _attention(split.plan)[0].kernel == "attention_cmr_khr_f16x3"
        for kind in ("randn", "sharp", "rows"):
            q, k, v = _inputs(kind, 1, 1500, 1500, 384, rng)
            feeds = {"q": q, "k": k, "v": v, **({"mask": _mask(rng, mshape)} if mshape else {})}
            ref, scale = _reference(q, k, v, 6, feeds.get("mask"))
            (emax, emean), (imax, imean) = (_errors(s.run(None, feeds)[0], ref, scale) for s in (split, ieee))
            print(f"whisper shape {kind}: f16x3 max {emax:.3g} mean {emean:.3g}; fp32 kernel max {imax:.3g} "
                  f"mean {imean:.3g}")
            assert emax <= MAX_FACTOR * imax and emean <= MEAN_FACTOR * imean, (kind, emax, imax, emean, imean)
