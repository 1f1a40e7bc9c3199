"""linear_cmreg: the tensor-core GEMM whose lanes load their operands straight into registers (REGFED in
glsl/linear_cm.glslh), the default fp16 GEMM where the probed element layout is "mma" (an H200).

Plan level (the fake H200 profile): which GEMMs take it, with which tile, splits and packed weight, and where
linear_cm stays. Numerics against a float64 reference from the same fp16-rounded values, in two modes:
  coopmat   the real kernel; skipped unless the device reports cooperative matrices with the "mma" layout
  emulated  linear_cmreg_emu*.comp: the matrix operations done from the buffers in the kernel's permuted k order, so
            the loads' masks, the packing and the epilogues are tested on any fp16 device (lavapipe too)."""
import dataclasses

import numpy as np
import pytest

from minirt import MinirtError, Session
from minirt.kernels.gemm import pack_regfed
from test_coopmat_linear import H200, _check, _device_or_skip, _f16, _gelu, _linear_model, _plan as _cm_plan
from test_coopmat_linear import _front_end_model, _front_end_reference

MODES = ("coopmat", "emulated")


def _plan(model, profile=H200, **options):
    return _cm_plan(model, profile, **{"cm_regfed": True, **options})


def _gemms(plan):
    return [d for d in plan.dispatches if d.kernel.startswith("linear") and not d.kernel.startswith("linear_reduce")]


# -- the packed weight -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,n", [(64, 32), (40, 20), (8, 3), (96, 48)])
def test_pack_regfed_places_every_element(k, n):
    """Lane L = 4 c + q of slice kb, column block nb, half h holds W[32 kb + 8 q + e][16 nb + c + 8 h] for e < 8, zero
    past K and N: checked element by element against that statement, not against the reshape that builds it."""
    w = np.random.default_rng(k * n).standard_normal((k, n)).astype(np.float32)
    got = pack_regfed(w)
    kb, nb = -(-k // 32), -(-n // 16)
    assert got.shape == (kb * nb * 2 * 32 * 8,)
    i = 0
    for s in range(kb):
        for b in range(nb):
            for h in range(2):
                for lane in range(32):
                    c, q = divmod(lane, 4)
                    for e in range(8):
                        kk, nn = 32 * s + 8 * q + e, 16 * b + c + 8 * h
                        want = w[kk, nn] if kk < k and nn < n else 0.0
                        assert got[i] == want, (s, b, h, lane, e)
                        i += 1


# -- plan level --------------------------------------------------------------------------------------------------

def test_whisper_tiny_takes_it_everywhere_on_h200():
    import whisper_encoder as we
    plan = _plan(we.build_whisper_encoder("tiny", opset=17, seed=0))
    gemms = {d.node: d for d in _gemms(plan)}
    assert gemms and all(d.kernel.startswith("linear_cmreg_") for d in gemms.values()), \
        [d.kernel for d in gemms.values()]
    # conv1's 64 x 64 grid (47 x 6 groups) fills under 0.6 of the 528 places: the 32-row tile
    assert gemms["/conv1/Conv"].kernel == "linear_cmreg_r32n64_half"
    assert gemms["/layers.0/self_attn/q_proj+k_proj+v_proj"].kernel == "linear_cmreg_r64n64_half"
    assert gemms["/layers.0/fc1/MatMul"].kernel == "linear_cmreg_r64n64_half"
    # the splits linear_cm's 64 x 64 tile takes (a LayerNorm reads all three): conv2 3 (with its A window),
    # out-projections 3, fc2 3
    for node, S in [("/conv2/Conv", 3), ("/layers.0/self_attn/out_proj/MatMul", 3), ("/layers.0/fc2/MatMul", 3)]:
        d = gemms[node]
        assert d.kernel == "linear_cmreg_split_r64n64_half" and d.global_size[2] == 6 * S, (node, d)
    assert gemms["/conv2/Conv"].spec[4] == 1      # A_WIN: conv2 reads conv1's channels-last rows
    # every GEMM's weight packed once, for linear_cmreg only: its row-major pack is not in the plan
    for d in _gemms(plan):
        w = d.args[2][0]
        assert w.endswith("@regfed@packed") and w[:-len("@regfed@packed")] + "@packed" not in plan.tensors, w


def test_where_linear_cm_stays():
    m = _linear_model(1500, 1152, 384)[0]
    assert [d.kernel for d in _gemms(_plan(m))] == ["linear_cmreg_r64n64_half"]
    # 144 groups of 64 x 64 in 528 places: twice as many of 32 x 64
    assert [d.kernel for d in _gemms(_plan(_linear_model(1500, 384, 384)[0]))] == ["linear_cmreg_r32n64_half"]
    assert [d.kernel for d in _gemms(_plan(m, cm_regfed=False))] == ["linear_cm_m64n64k32s1_half"]
    # a device whose layout was not probed to be the one the kernel builds its operands in
    for layout in ("", "other"):
        assert [d.kernel for d in _gemms(_plan(m, dataclasses.replace(H200, coopmat_layout=layout)))] == \
            ["linear_cm_m64n64k32s1_half"]
    # K not a multiple of 8: A's 16-byte loads would straddle rows
    assert [d.kernel for d in _gemms(_plan(_linear_model(100, 64, 12)[0]))] == ["linear_cm_m64n64k32s1_half"]
    # a forced linear_cm tile is linear_cm; a forced REGFED tile is that tile
    assert [d.kernel for d in _gemms(_plan(m, cm_tile="m64n128k32s1"))] == ["linear_cm_m64n128k32s1_half"]
    assert [d.kernel for d in _gemms(_plan(m, cm_tile="r32n64"))] == ["linear_cmreg_r32n64_half"]
    # fp32 and devices without cooperative matrices: linear.comp
    assert [d.kernel for d in _gemms(_plan(m, coopmat=False))][0].startswith("linear_t")


def test_bad_tile_is_named():
    with pytest.raises(MinirtError, match="cm_tile"):
        _plan(_linear_model(64, 64, 64)[0], cm_tile="r16n16")


# -- numerics ----------------------------------------------------------------------------------------------------

def _device_mma_or_skip(mode):
    p = _device_or_skip(mode)
    if mode == "coopmat" and p.coopmat_layout != "mma":
        pytest.skip(f"{p.name}: cooperative-matrix layout {p.coopmat_layout!r}, not the one linear_cmreg builds")
    return p


def _run(model, feeds, mode, **options):
    opts = {"poison": True, "coopmat2": False, **({"coopmat": "emulate"} if mode == "emulated" else {}), **options}
    with Session(model, storage="buffer", precision="fp16", options=opts) as s:
        gemms = [d.kernel for d in _gemms(s.plan)]
        assert gemms and all(k.startswith("linear_cmreg_emu_" if mode == "emulated" else "linear_cmreg_")
                             for k in gemms), gemms
        y = s.run(None, feeds)[0]
        y2 = s.run(None, feeds)[0]
    assert np.array_equal(y, y2), "two runs differ"
    return y, gemms


def _reference(feeds, w, b, act, residual):
    ref = _f16(feeds["x"]) @ _f16(w) + _f16(b)
    if act == "relu":
        ref = np.maximum(ref, 0)
    elif act == "gelu":
        ref = _gelu(ref)
    if residual:
        ref = ref + _f16(feeds["r"])
    return ref


CASES = [  # M, N, K, act, residual, options
    (100, 64, 48, None, False, {}),                 # K: one and a half slices
    (37, 20, 16, "relu", True, {}),                 # M, N ragged; N % 4 != 0 for the epilogue's scalar stores
    (130, 96, 80, "gelu", True, {}),
    (33, 24, 8, None, False, {"cm_tile": "r32n64"}),
    (64, 64, 1024, None, False, {}),                # 32 slices in one group
    (70, 48, 256, None, True, {"gemm_splitk": 3}),  # K split, fp32 partials through linear_reduce
    (96, 40, 512, "gelu", False, {"gemm_splitk": 2, "cm_tile": "r32n64"}),
    (80, 72, 40, None, True, {"gemm_splitk": 2}),
    (1500, 384, 384, None, True, {}),
    (1500, 1536, 384, "gelu", False, {}),
    (1500, 384, 1536, None, True, {}),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k,act,residual,options", CASES)
def test_linear(mode, m, n, k, act, residual, options):
    p = _device_mma_or_skip(mode)
    if mode == "emulated" and p.device_type == "cpu" and m * n * k > 1500 * 384 * 64:
        pytest.skip("the emulated kernel at this size takes too long on a CPU device")
    model, w, b = _linear_model(m, n, k, act, residual, seed=m + n + k)
    rng = np.random.default_rng(m * n + k)
    feeds = {"x": rng.standard_normal((1, m, k)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((1, m, n)).astype(np.float32)
    y, gemms = _run(model, feeds, mode, **options)
    if "gemm_splitk" in options:
        assert "_split_" in gemms[0]
    _check(y, _reference(feeds, w, b, act, residual), f"{mode} {m}x{n}x{k} {act} {residual} {options}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("options", [{}, {"gemm_splitk": 2}, {"conv_input_nlc": False}])
def test_whisper_conv_front_end(mode, options):
    """conv1 (im2col rows) and conv2 (conv1's channels-last rows through A_WIN, or its own im2col), whole or split."""
    p = _device_mma_or_skip(mode)
    t = 200 if mode == "emulated" and p.device_type == "cpu" else 3000
    model, weights = _front_end_model(t, seed=3)
    x = np.random.default_rng(11).standard_normal((1, 80, t)).astype(np.float32)
    y, _ = _run(model, {"x": x}, mode, **options)
    _check(y, _front_end_reference(x, *weights), f"{mode} front end T={t} {options}")
