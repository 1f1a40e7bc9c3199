"""fp32_precision="f16x3": fp32 GEMMs on the fp16 tensor cores from split operands (glsl/linear_cm.glslh SPLIT3, the
dtype=f16x3 variants of linear_cmreg*; minirt/kernels/gemm.py split_kernel).

The packing (numpy): hi + lo 2^-11, unscaled, gives back every weight to about fp32's precision at any magnitude.
Plan level (the fake H200 profile): which GEMMs take it, their split weights, the notes, the fallbacks and refusals.
Numerics against float64 (beside the ieee kernel's error on the same inputs), in two modes:
  coopmat   the real kernel; skipped unless the device has cooperative matrices in the "mma" layout (an H200)
  emulated  linear_cmreg_emu*_f16x3: the same splits, scales and sums from the buffers in plain code (lavapipe too)."""
import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import re

import numpy as np
import pytest

from minirt import MinirtError, Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import prepare
from minirt.loaders import load
from minirt.kernels.gemm import pack_regfed, pack_regfed_split, split_f16x3
from minirt.options import Options
from minirt.planner import make_plan
from oracle import linear_model, onnxruntime_run
from test_coopmat_linear import _device_or_skip as _cm_device_or_skip

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import whisper_encoder as we  # noqa: E402

H200 = KNOWN_PROFILES["nvidia-h200"]
MODES = ("coopmat", "emulated")
SPLIT = {"fp32_precision": "f16x3"}


def _mixed(rng, shape, lo=-6, hi=4):
    """Values of random sign whose magnitudes are spread evenly over 10^lo .. 10^hi."""
    return (rng.choice([-1.0, 1.0], shape) * 10.0 ** rng.uniform(lo, hi, shape)).astype(np.float32)


def _linear_model(m, n, k, w, b, residual=False, act=None):
    return linear_model(m, w, b, act, residual)[0]


def _plan(model, profile=H200, **options):
    return make_plan(prepare(load(model)), profile, "buffer", {**SPLIT, **options})


def _gemms(plan):
    return [d for d in plan.dispatches if d.kernel.startswith("linear") and not d.kernel.startswith("linear_reduce")]


# -- the split weights (numpy) -----------------------------------------------------------------------------------

def test_split_weights_hold_fp32_precision_at_any_magnitude():
    """Column by column scaled by a power of two into fp16's range: (hi + lo 2^-11) 2^-s is each weight to within
    2^-22 of itself (fp32 keeps 2^-24), for magnitudes from fp32's subnormals to 1e30, far outside fp16's range, where
    plain fp16 parts would overflow or flush; zero columns stay zero."""
    rng = np.random.default_rng(0)
    w = _mixed(rng, (96, 8))
    w[:, 1] *= 1e-38            # fp32 subnormals and the smallest normals
    w[:, 2] *= 1e26             # up to 1e30
    w[:, 3] = 0.0
    w[:, 4] = _mixed(rng, 96, -40, -36)
    hi, lo, inv = split_f16x3(w)
    assert hi.dtype == lo.dtype == np.float16 and inv.dtype == np.float32 and np.isfinite(hi).all()
    back = (hi.astype(np.float64) + lo.astype(np.float64) / 2048) * inv.astype(np.float64)
    w64 = w.astype(np.float64)
    # relative to each element, but an element below 2^-36 of its column's largest may lose bits to fp16's subnormals
    # in lo (then it weighs nothing next to the largest, as in an fp32 sum)
    floor = np.abs(w64).max(axis=0) * 2.0 ** -36
    assert (np.abs(back - w64) <= 2.0 ** -22 * np.abs(w64) + floor).all()
    assert (back[:, 3] == 0).all()
    top = np.abs(hi.astype(np.float64)).max(axis=0)
    assert (top[[0, 2]] >= 2 ** 14).all() and (top <= 2 ** 15).all()   # scaled into [2^14, 2^15]
    assert (inv[[1, 4]] == 2.0 ** -126).all()    # (columns below 2^-112: the scale stops at 2^126, a normal float)


def test_split_pack_places_hi_then_lo_per_slice_and_column_block():
    """pack_regfed_split: for each 32-deep slice and 16-column block, pack_regfed's 512 halves of hi, then of lo."""
    rng = np.random.default_rng(1)
    hi = rng.standard_normal((72, 40)).astype(np.float16)
    lo = rng.standard_normal((72, 40)).astype(np.float16)
    got = pack_regfed_split(hi, lo).reshape(3, 3, 2, 512)
    assert (got[:, :, 0].reshape(-1) == pack_regfed(hi.astype(np.float32))).all()
    assert (got[:, :, 1].reshape(-1) == pack_regfed(lo.astype(np.float32))).all()


# -- plan level --------------------------------------------------------------------------------------------------

def test_whisper_gemms_take_the_split_kernel_on_h200():
    """Every GEMM of the encoder (its linears and both convs) on linear_cmreg*_f16x3 at fp32, with float16 split
    weights and float32 column scales in the plan and a note each, and its attention on attention_cmr_khr_f16x3
    (tests/test_attention_f16x3.py); nothing else changes kernel."""
    model = we.build_whisper_encoder("tiny", layers=1, seed=2)
    plan, ieee = _plan(model), _plan(model, fp32_precision="ieee")
    gemms = _gemms(plan)
    assert len(gemms) == 6
    for d in gemms:
        assert d.kernel.startswith("linear_cmreg_") and d.kernel.endswith("_f16x3") and "emu" not in d.kernel, d.kernel
        (w, _), (scales, _) = d.args[2], d.args[5]
        wt, st = plan.tensors[w], plan.tensors[scales]
        assert w.endswith("@f16x3@packed") and wt.dtype == "float16" and st.dtype == "float32", (w, wt.dtype)
        m, n, k = (int(v) for v in np.frombuffer(d.push[:12], np.int32))
        assert wt.shape == (-(-k // 32) * 32 * -(-n // 16) * 16 * 2,) and st.shape == (-(-n // 16) * 16,)
        assert any("fp32_precision f16x3: fp32 GEMM on tensor cores" in t for t in plan.notes[d.node])
    assert [d.kernel for d in ieee.dispatches if d.kernel.startswith("linear_t")]    # the ieee path is SIMT
    default = _plan(model, fp32_precision="ieee", coopmat="auto")
    assert [d.kernel for d in default.dispatches] == [d.kernel for d in ieee.dispatches]
    assert [d.kernel for d in plan.dispatches if d.op == "Attention"] == ["attention_cmr_khr_f16x3"]
    # everything but the GEMMs (and the weights they read) and the attention is the ieee plan's
    rest = [d.kernel for d in plan.dispatches if d not in gemms and d.op != "Attention"]
    assert rest == [d.kernel for d in ieee.dispatches if not d.kernel.startswith("linear_t") and d.op != "Attention"]


def test_where_it_does_not_apply_the_ieee_kernel_with_a_note():
    model = _linear_model(100, 40, 64, np.ones((64, 40), np.float32), np.zeros(40, np.float32))
    why = {
        "coopmat=off": (H200, {"coopmat": "off"}),
        "no 16x16x16": (KNOWN_PROFILES["lavapipe"], {}),
        "'mma' element layout": (dataclasses.replace(H200, coopmat_layout=""), {}),
        "whole groups of 8": (H200, {}),
    }
    for text, (profile, options) in why.items():
        m = model if text != "whole groups of 8" else _linear_model(100, 40, 60, np.ones((60, 40), np.float32),
                                                                      np.zeros(40, np.float32))
        plan = _plan(m, profile, **options)
        assert [d.kernel for d in _gemms(plan)] and all(d.kernel.startswith("linear_t") for d in _gemms(plan)), text
        notes = [t for ts in plan.notes.values() for t in ts if t.startswith("fp32_precision")]
        assert notes and all(text in t and "not applied" in t for t in notes), (text, notes)
    # texture storage has no buffer GEMM (the matmul kernel): the option changes nothing there
    g = prepare(load(model))
    tex = make_plan(g, H200, "texture", SPLIT)
    assert [d.kernel for d in tex.dispatches] == [d.kernel for d in make_plan(g, H200, "texture", {}).dispatches]
    # emulated: any device with 16-bit storage and subgroups
    assert _gemms(_plan(model, KNOWN_PROFILES["lavapipe"], coopmat="emulate"))[0].kernel == \
        "linear_cmreg_emu_r64n64_f16x3"


def test_refused_at_fp16_and_unknown_schemes():
    with pytest.raises(MinirtError, match="fp32_precision=f16x3 .* does not apply at precision fp16"):
        Options.make(precision="fp16", fp32_precision="f16x3")
    Options.make(precision="fp16", fp32_precision="ieee")
    with pytest.raises(MinirtError, match="fp32_precision must be one of ieee, f16x3"):
        Options.make(fp32_precision="tf32")


def test_cli_plan_shows_the_split_kernel(tmp_path):
    model = _linear_model(100, 40, 64, np.ones((64, 40), np.float32), np.zeros(40, np.float32))
    path = tmp_path / "linear.onnx"
    path.write_bytes(model.SerializeToString())
    run = [sys.executable, "-m", "minirt", "plan", str(path), "--storage", "buffer"]
    out = subprocess.run(run + ["--fp32-precision", "f16x3", "--option", "coopmat=emulate"], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert re.search(r"linear_cmreg_emu_r\d+n\d+_f16x3", out.stdout) and "fp32_precision=f16x3" in out.stdout
    assert "weights as fp16 hi and lo parts (w@f16x3@packed, float16" in out.stdout
    bad = subprocess.run(run + ["--fp32-precision", "f16x3", "--precision", "fp16"], capture_output=True, text=True,
                         cwd=ROOT)
    assert bad.returncode != 0 and "does not apply at precision fp16" in bad.stderr
    np.save(tmp_path / "x.npy", np.random.default_rng(2).standard_normal((1, 100, 64)).astype(np.float32))
    ran = subprocess.run([sys.executable, "-m", "minirt", "run", str(path), str(tmp_path / "x.npy"), "--storage",
                          "buffer", "--fp32-precision", "f16x3", "--option", "coopmat=emulate", "--repeat", "2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    assert "fp32_precision f16x3 on 1 GEMM dispatch(es)" in ran.stdout and "1 distinct output" in ran.stdout


# -- numerics ----------------------------------------------------------------------------------------------------

def _device_or_skip(mode):
    from minirt.vk.pipelines import spirv_dir
    p = _cm_device_or_skip(mode)
    if mode == "coopmat" and p.coopmat_layout != "mma":
        pytest.skip(f"{p.name}: cooperative matrices not in the 'mma' layout")
    if "linear_cmreg_emu_r64n64_f16x3" not in json.loads((spirv_dir() / "manifest.json").read_text())["shaders"]:
        pytest.skip("the f16x3 kernels are not built in this tree")
    return p


def _options(mode, **extra):
    return {"poison": True, **({"coopmat": "emulate"} if mode == "emulated" else {}), **extra}


def _errors(y, ref, scale):
    """(max, mean) of |y - ref| / scale over the outputs whose scale (sum of |a| |w| + |b| + |r|) is a normal fp32
    number well clear of the subnormals, and the largest |y - ref| over the others."""
    y = np.asarray(y, np.float64).reshape(ref.shape)
    assert np.isfinite(y).all(), "a non-finite output (an element not written?)"
    ok = scale > 1e-30
    e = np.abs(y - ref)[ok] / scale[ok]
    return float(e.max()), float(e.mean()), float(np.abs(y - ref)[~ok].max(initial=0.0))


GEMM_CASES = [(70, 40, 264, False, None), (130, 72, 520, True, 3), (37, 36, 96, True, None), (64, 24, 1024, False, 2)]


@pytest.mark.unoptimized      # (lavapipe: the emulated kernel compiles for seconds, runs in a fraction of one)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k,residual,splits", GEMM_CASES)
def test_accuracy_against_float64_beside_ieee(mode, m, n, k, residual, splits):
    """A GEMM whose inputs' magnitudes spread over 1e-6 .. 1e4, with a row of A near fp32's subnormals, a row around
    1e15 (far past fp16's 65504), a weight column near 1e-30 and one around 1e8: the split kernel's error against
    float64, relative to sum |a| |w| (what fp32 arithmetic promises), holds within 2x the ieee kernel's on the same
    inputs, max and mean, emulated and on real tensor cores (measured: about the same, often below). Ragged M and N, K
    over several slices, split K."""
    _device_or_skip(mode)
    rng = np.random.default_rng(m + n + k)
    x, w = _mixed(rng, (m, k)), _mixed(rng, (k, n))
    x[3] *= 1e-38
    x[5] *= 1e15
    w[:, 2] *= 1e-30
    w[:, 7] *= 1e8
    b = (0.01 * rng.standard_normal(n)).astype(np.float32)
    feeds = {"x": x[None]}
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = x64 @ w64 + b
    scale = np.abs(x64) @ np.abs(w64) + np.abs(b)
    if residual:
        feeds["r"] = _mixed(rng, (1, m, n))
        ref, scale = ref + feeds["r"][0], scale + np.abs(feeds["r"][0].astype(np.float64))
    model = _linear_model(m, n, k, w, b, residual)
    extra = {"gemm_splitk": splits} if splits else {}
    errs = {}
    for scheme in ("ieee", "f16x3"):
        with Session(model, storage="buffer", options=_options(mode, fp32_precision=scheme, **extra)) as s:
            kernels = [d.kernel for d in s.plan.dispatches]
            y = s.run(None, feeds)[0]
        want = "linear_cmreg_" + ("emu_" if mode == "emulated" else "") + ("split_" if splits else "")
        assert (scheme == "f16x3") == any(kn.startswith(want) and kn.endswith("_f16x3") for kn in kernels), kernels
        errs[scheme] = _errors(y, ref, scale)
    (emax, emean, etiny), (imax, imean, itiny) = errs["f16x3"], errs["ieee"]
    print(f"{mode} {m}x{n}x{k}: f16x3 max {emax:.3g} mean {emean:.3g}; ieee max {imax:.3g} mean {imean:.3g}; "
          f"subnormal-range outputs: {etiny:.3g} / {itiny:.3g}")
    assert emax <= 2 * imax and emean <= 2 * imean, errs
    assert emax < 2e-6, errs
    assert etiny <= max(2 * itiny, 1e-37), errs


@pytest.mark.unoptimized
def test_gelu_epilogue_and_determinism():
    """A GEMM with the GELU epilogue on normal data against float64 (as tight as fp32 allows), and the same output bits
    in every run."""
    mode = "emulated"
    _device_or_skip(mode)
    rng = np.random.default_rng(5)
    m, n, k = 50, 48, 136
    x, w = rng.standard_normal((1, m, k)).astype(np.float32), (rng.standard_normal((k, n)) / 12).astype(np.float32)
    b = (0.1 * rng.standard_normal(n)).astype(np.float32)
    h = x[0].astype(np.float64) @ w.astype(np.float64) + b
    ref = 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    with Session(_linear_model(m, n, k, w, b, act="gelu"), storage="buffer", options=_options(mode, **SPLIT)) as s:
        outs = [s.run(None, {"x": x})[0] for _ in range(4)]
    assert len({o.tobytes() for o in outs}) == 1
    assert np.abs(outs[0][0] - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.unoptimized
@pytest.mark.parametrize("mode", MODES)
def test_whisper_encoder_against_onnxruntime(mode):
    """A small Whisper encoder (its convs and linears all on the split kernel, its attention on attention_cmr's split
    variant) against onnxruntime's fp32: cosine >= 0.99999 and max |error| <= 1e-3 max |reference|; the same output
    in every run."""
    p = _device_or_skip(mode)
    # on a CPU device (the emulation: seconds) a narrower encoder, d_model 64 in one head, its convs routed to the GEMM
    # as the full-width ones are
    cpu = p.device_type == "cpu"
    layers, frames, narrow = (2, 200, {"d_model": 64, "heads": 1}) if cpu else (2, 3000, {})
    model = we.build_whisper_encoder("tiny", layers=layers, n_frames=frames, seed=3, **narrow)
    x = we.sample_input(n_frames=frames, seed=4)
    ref = onnxruntime_run(model, {"input_features": x})[0].astype(np.float64)
    options = _options(mode, **SPLIT, **({"conv_route": "im2col"} if cpu else {}))
    with Session(model, storage="buffer", options=options) as s:
        gemms = _gemms(s.plan)
        assert len(gemms) == 2 + 4 * layers and all(d.kernel.endswith("_f16x3") for d in gemms)
        attn = [d.kernel for d in s.plan.dispatches if d.op == "Attention"]
        assert attn == [f"attention_cmr_{'emu' if mode == 'emulated' else 'khr'}_f16x3"] * layers, attn
        outs = [s.run(x) for _ in range(3)]
    assert len({o.tobytes() for o in outs}) == 1
    y = outs[0].astype(np.float64).ravel()
    cos = float(y @ ref.ravel() / np.linalg.norm(y) / np.linalg.norm(ref))
    err = float(np.abs(y - ref.ravel()).max())
    print(f"{mode} whisper ({layers} layers, {frames} frames, {narrow}): cosine {cos:.9f}, max |err| {err:.3g} of "
          f"{np.abs(ref).max():.3g}")
    assert cos >= 0.99999 and err <= 1e-3 * np.abs(ref).max()


@pytest.mark.unoptimized
@pytest.mark.parametrize("mode", MODES)
def test_conv_front_end_nchw_row_tiles(mode, monkeypatch):
    """Whisper's two convs as im2col + the split GEMM writing NCHW (OUT_MODE 1; conv_input_nlc off) in several row tiles
    (output rows from M0 > 0, a small scratch budget), against onnxruntime."""
    import minirt.ops.conv as conv
    from test_coopmat_linear import _front_end_model
    _device_or_skip(mode)
    monkeypatch.setattr(conv, "IM2COL_SCRATCH_BUDGET", 32 * 240 * 4)    # 32 rows of conv1, 6 of conv2
    model, _ = _front_end_model(64, seed=5)
    x = np.random.default_rng(6).standard_normal((1, 80, 64)).astype(np.float32)
    ref = onnxruntime_run(model, {"x": x})[0].astype(np.float64)
    with Session(model, storage="buffer", options=_options(mode, **SPLIT, conv_input_nlc=False)) as s:
        gemms = _gemms(s.plan)
        y = s.run(x).astype(np.float64)
    assert len(gemms) == 2 + 6 and all(d.kernel.endswith("_f16x3") and d.spec[0] == 1 for d in gemms), \
        [(d.kernel, d.spec) for d in gemms]
    assert np.abs(y - ref).max() <= (1e-5 if mode == "emulated" else 1e-3) * np.abs(ref).max()
