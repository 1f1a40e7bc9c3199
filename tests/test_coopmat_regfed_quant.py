"""linear_cmreg's quantized variants (glsl/linear_cm.glslh REGFED with W_I8 or W_Q4): the register-fed tensor-core GEMM
reading an int8 weight (ops/int8_weight.py Int8Weight: a scale and zero point per column) or a blockwise 4-bit one
(Int4Weight, MatMulNBits) packed per slice and lane (gemm.py pack_regfed_i8, pack_regfed_q4), made fp16 in registers:
int8 as q - zero with each column's scale applied after the K loop, 4-bit as (q - zero) * scale per block.

Plan level (the fake H200 profile): which quantized GEMMs take it and the weight it reads (int8 or 4-bit bytes, no
float copy). Numerics against a float64 reference on the dequantized weights, from the fp16-rounded activations, in
the two modes of tests/test_coopmat_regfed.py: the real kernel where the device has cooperative matrices in the "mma"
layout, and the emulated one (linear_cmreg_emu*, any fp16 device, lavapipe too)."""
import dataclasses
import math

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minirt import Session
from minirt.kernels.gemm import (I8_BYTE_ORDER, Q4_NIBBLE_ORDER, pack_regfed_i8, pack_regfed_q4, pack_regfed_q4_params,
                                 regfed_zero_ok)
from oracle import make_model
from test_int8_linear import _siblings
from test_matmul_nbits import nbits_model
from test_coopmat_linear import H200, _check, _f16, _gelu
from test_coopmat_regfed import MODES, _device_mma_or_skip, _gemms, _plan


def _int8_model(m, n, k, act=None, residual=False, *, seed, zero=None, dtype=np.int8):
    """x [1, M, K] @ DequantizeLinear(q [K, N], scale [N], zero [N]) + b (then Relu / Gelu) (+ r): (model, float64 W as
    dequantized, b). zero: None, "int" (random integral zero points), or an array."""
    rng = np.random.default_rng(seed)
    lo, hi = (-127, 128) if dtype == np.int8 else (0, 256)
    q = rng.integers(lo, hi, size=(k, n)).astype(dtype)
    s = (rng.uniform(0.5, 2.0, n) / (64 * math.sqrt(k))).astype(np.float32)
    b = (0.5 * rng.standard_normal(n)).astype(np.float32)
    inits = {"q": q, "s": s, "b": b}
    z = np.zeros(n, dtype)
    if zero is not None:
        z = rng.integers(-20, 20, n).astype(dtype) if isinstance(zero, str) else np.asarray(zero, dtype)
        inits["z"] = z
    nodes = [helper.make_node("DequantizeLinear", ["q", "s"] + (["z"] if zero is not None else []), ["w"], axis=1),
             helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"])]
    cur, inputs = "hb", {"x": (1, m, k)}
    if act:
        nodes.append(helper.make_node("Relu" if act == "relu" else "Gelu", [cur], ["ha"]))
        cur = "ha"
    if residual:
        nodes.append(helper.make_node("Add", [cur, "r"], ["y"]))
        inputs["r"] = (1, m, n)
    else:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    w = (q.astype(np.float64) - z.astype(np.float64)) * s.astype(np.float64)
    return make_model(nodes, inputs, ["y"], inits, opset=20), w, b


def _int8(plan):
    return {n: t for n, t in plan.tensors.items() if t.dtype == "int8"}


# -- the packed weight -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,n", [(64, 32), (40, 20), (8, 3), (96, 48)])
def test_pack_regfed_i8_places_every_element(k, n):
    """Lane L = 4 c + q of slice kb, column block nb holds, at byte 4 (2 h + s) + j, Q[32 kb + 8 q + 4 s + order[j]][16
    nb + c + 8 h], zero past K and N: checked byte by byte against that statement, not against the reshape that builds
    it."""
    w = np.random.default_rng(k * n).integers(-128, 128, size=(k, n)).astype(np.int8)
    got = pack_regfed_i8(w)
    kb, nb = -(-k // 32), -(-n // 16)
    assert got.dtype == np.int8 and got.shape == (kb * nb * 32 * 16,)
    i = 0
    for s in range(kb):
        for b in range(nb):
            for lane in range(32):
                c, q = divmod(lane, 4)
                for h in range(2):
                    for half in range(2):
                        for j in range(4):
                            kk, nn = 32 * s + 8 * q + 4 * half + I8_BYTE_ORDER[j], 16 * b + c + 8 * h
                            want = w[kk, nn] if kk < k and nn < n else 0
                            assert got[i] == want, (s, b, lane, h, half, j)
                            i += 1


def test_i8_to_f16_is_exact():
    """linear_cm.glslh's I8_F16 on every int8 value in each byte of a uint, for integral zero points up to the limit
    regfed_zero_ok allows: (u & 0x00FF00FF) ^ 0x64806480 (or of u >> 8) as two fp16, less 1152 + zero, in fp16
    arithmetic, is q - zero exactly (numpy's float16 rounds as the GPU's fp16 subtraction does)."""
    q = np.arange(-128, 128)
    u = (q.astype(np.int64) & 0xFF).astype(np.uint32)
    words = u | (np.roll(u, 1) << 8) | (np.roll(u, 2) << 16) | (np.roll(u, 3) << 24)
    want = [q, np.roll(q, 2), np.roll(q, 1), np.roll(q, 3)]    # bytes 0, 2 (lo) then 1, 3 (hi)
    for z in (0, 1, -128, 255, 896, -896):
        zb = np.float16(1152 + z)
        got = []
        for hi in (False, True):
            bits = ((words >> 8 if hi else words) & 0x00FF00FF) ^ 0x64806480
            pairs = bits.astype("<u4").view(np.float16).reshape(-1, 2) - zb
            got += [pairs[:, 0], pairs[:, 1]]
        for g, w in zip(got, want):
            assert np.array_equal(g.astype(np.float64), w - z), z


# -- plan level --------------------------------------------------------------------------------------------------

def test_int8_takes_linear_cmreg_where_fp16_does():
    """On the H200 profile ("mma" layout) an int8 GEMM takes linear_cmreg's w=i8 variant wherever the fp16 weight takes
    linear_cmreg, with the same tile and splits; the weight it reads is int8, a byte an element of the padded packing,
    and no float copy of it is planned."""
    for m, n, k in [(1500, 1536, 384), (1500, 384, 1536), (1500, 384, 384), (300, 72, 64)]:
        model, _, _ = _int8_model(m, n, k, seed=1)
        fmodel = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                            {"x": (1, m, k)}, ["y"], {"w": np.ones((k, n), np.float32), "b": np.ones(n, np.float32)},
                            opset=20)
        plan, fplan = _plan(model), _plan(fmodel)
        got, want = _gemms(plan), _gemms(fplan)
        assert want[0].kernel.startswith("linear_cmreg_"), want[0].kernel
        assert [d.kernel for d in got] == [d.kernel.replace("_half", "_i8_half", 1) if d.kernel.startswith("linear_cmreg")
                                           else d.kernel for d in want], (m, n, k)
        assert [d.global_size for d in got] == [d.global_size for d in want]
        (w,) = _int8(plan).values()
        assert plan.dispatches[[d.op for d in plan.dispatches].index("Linear")].args[2][0] == w.name
        assert w.nbytes == -(-k // 32) * 32 * -(-n // 16) * 16 and w.role == "weight"
        assert not any(t.data is not None and t.numel >= k * n and t.dtype != "int8" for t in plan.tensors.values())


def test_whisper_tiny_int8_on_h200():
    """quantize_weights="int8": every Linear of Whisper-tiny's encoder, and the convolutions' im2col GEMMs, on the w=i8
    variant, with the tiles and splits the fp16 plan gives them."""
    import whisper_encoder as we
    model = we.build_whisper_encoder("tiny", opset=17, seed=0)
    fp16 = {d.node: d for d in _gemms(_plan(model))}
    int8 = {d.node: d for d in _gemms(_plan(model, quantize_weights="int8"))}
    assert fp16.keys() == int8.keys()
    for node, d in int8.items():
        want = fp16[node].kernel.replace("_half", "_i8_half")
        assert d.kernel == want and d.global_size == fp16[node].global_size, (node, d.kernel, want)


def test_where_int8_stays_on_linear_cm():
    m, n, k = 1500, 1536, 384
    q = _int8_model(m, n, k, seed=2, zero="int")[0]
    assert [d.kernel for d in _gemms(_plan(q))] == ["linear_cmreg_r64n64_i8_half"]
    # cm_regfed off, a forced linear_cm tile, a device whose layout is not the one the kernel builds: linear_cm w=i8
    assert [d.kernel for d in _gemms(_plan(q, cm_regfed=False))] == ["linear_cm_m64n128k32s1_i8_half"]
    assert [d.kernel for d in _gemms(_plan(q, cm_tile="m64n64k32s1"))] == ["linear_cm_m64n64k32s1_i8_half"]
    assert [d.kernel for d in _gemms(_plan(q, dataclasses.replace(H200, coopmat_layout="")))] == \
        ["linear_cm_m64n128k32s1_i8_half"]
    # zero points fp16 cannot take exactly from 1152 + q (ONNX's are integers, so none comes from a model)
    assert regfed_zero_ok(None) and regfed_zero_ok(np.array([-128.0, 255.0, 0.0]))
    assert not regfed_zero_ok(np.array([0.0, 0.5])) and not regfed_zero_ok(np.array([1000.0]))


# -- numerics ----------------------------------------------------------------------------------------------------

def _run(model, feeds, mode, **options):
    opts = {"poison": True, **({"coopmat": "emulate"} if mode == "emulated" else {}), **options}
    with Session(model, storage="buffer", precision="fp16", options=opts) as s:
        gemms = [d.kernel for d in _gemms(s.plan)]
        want = "linear_cmreg_emu_" if mode == "emulated" else "linear_cmreg_"
        assert gemms and all(g.startswith(want) and "_i8_" in g for g in gemms), gemms
        assert _int8(s.plan)
        y = s.run(None, feeds)[0]
        y2 = s.run(None, feeds)[0]
    assert np.array_equal(y, y2), "two runs differ"
    return y, gemms


CASES = [  # M, N, K, act, residual, options, zero points
    (100, 64, 48, None, False, {}, None),                 # K: one and a half slices
    (37, 20, 16, "relu", True, {}, "int"),                # M, N ragged; N % 4 != 0: the epilogue's scalar stores
    (130, 96, 80, "gelu", True, {}, None),
    (33, 24, 8, None, False, {"cm_tile": "r32n64"}, "int"),
    (64, 64, 1024, None, False, {}, None),                # 32 slices in one group
    (70, 48, 256, None, True, {"gemm_splitk": 3}, "int"),  # K split, fp32 partials through linear_reduce
    (96, 40, 512, "gelu", False, {"gemm_splitk": 2, "cm_tile": "r32n64"}, None),
    (80, 72, 40, "relu", True, {"gemm_splitk": 2}, None),
    (1500, 384, 384, None, True, {}, None),
    (1500, 1536, 384, "gelu", False, {}, "int"),
    (1500, 384, 1536, None, True, {}, None),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k,act,residual,options,zero", CASES)
def test_linear_int8(mode, m, n, k, act, residual, options, zero):
    p = _device_mma_or_skip(mode)
    if mode == "emulated" and p.device_type == "cpu" and m * n * k > 1500 * 384 * 64:
        pytest.skip("the emulated kernel at this size takes too long on a CPU device")
    model, w, b = _int8_model(m, n, k, act, residual, seed=m + n + k, zero=zero)
    rng = np.random.default_rng(m * n + k)
    feeds = {"x": rng.standard_normal((1, m, k)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((1, m, n)).astype(np.float32)
    y, gemms = _run(model, feeds, mode, **options)
    if "gemm_splitk" in options:
        assert "_split_" in gemms[0]
    ref = _f16(feeds["x"]) @ w + _f16(b)
    if act == "relu":
        ref = np.maximum(ref, 0)
    elif act == "gelu":
        ref = _gelu(ref)
    if residual:
        ref = ref + _f16(feeds["r"])
    _check(y, ref, f"{mode} {m}x{n}x{k} {act} {residual} {options} zero={zero}")


@pytest.mark.parametrize("mode", MODES)
def test_uint8_weight_with_zero_points(mode):
    """uint8 weights (int8 less 128 in the plan, their zero points moved alike: up to 255 - 128 from q)."""
    _device_mma_or_skip(mode)
    model, w, b = _int8_model(90, 40, 64, "relu", seed=5, zero=np.random.default_rng(6).integers(0, 256, 40),
                              dtype=np.uint8)
    x = np.random.default_rng(7).standard_normal((1, 90, 64)).astype(np.float32)
    y, _ = _run(model, {"x": x}, mode)
    _check(y, np.maximum(_f16(x) @ w + _f16(b), 0), f"{mode} uint8")


@pytest.mark.parametrize("mode", MODES)
def test_merged_int8_siblings(mode):
    """q, k and v with int8 weights merged into one GEMM whose output is part-major (OUT_MODE 2), on the w=i8 variant."""
    _device_mma_or_skip(mode)
    model, feeds, ws = _siblings(100)
    opts = {"poison": True, **({"coopmat": "emulate"} if mode == "emulated" else {})}
    with Session(model, storage="buffer", precision="fp16", options=opts) as s:
        (lin,) = [d for d in s.plan.dispatches if d.op == "Linear"]
        assert lin.kernel.startswith("linear_cmreg_") and "_i8_" in lin.kernel and lin.spec[0] == 2, lin
        got = s.run(None, feeds)
    for g, (w, b) in zip(got, ws):
        _check(g, _f16(feeds["x"]) @ w + _f16(b), f"{mode} merged q, k, v")


# -- 4-bit weights (MatMulNBits) -----------------------------------------------------------------------------------

@pytest.mark.parametrize("k,n", [(64, 32), (40, 20), (8, 3)])
def test_pack_regfed_q4_places_every_element(k, n):
    """Lane L = 4 c + q of slice kb, column block nb holds in nibble p of uint h Q[32 kb + 8 q + order[p]][16 nb + c +
    8 h], zero past K and N; the parameters of block b are (scale, 1024 + zero) of column 16 nb + c + 8 h at [b][nb][c]
    [h], zero past N and past K's blocks."""
    rng = np.random.default_rng(k * n)
    w = rng.integers(0, 16, size=(k, n)).astype(np.uint8)
    got = pack_regfed_q4(w)
    kb, nb = -(-k // 32), -(-n // 16)
    assert got.shape == (kb * nb * 32 * 2,)
    i = 0
    for s in range(kb):
        for b in range(nb):
            for lane in range(32):
                c, q = divmod(lane, 4)
                for h in range(2):
                    for p in range(8):
                        kk, nn = 32 * s + 8 * q + Q4_NIBBLE_ORDER[p], 16 * b + c + 8 * h
                        want = w[kk, nn] if kk < k and nn < n else 0
                        assert (int(got[i]) >> (4 * p)) & 15 == want, (s, b, lane, h, p)
                    i += 1
    block = 16
    blocks = -(-k // block)
    scale, zero = rng.uniform(0.01, 0.1, (blocks, n)).astype(np.float32), rng.integers(0, 16, (blocks, n))
    par = pack_regfed_q4_params(scale, zero, block, k).reshape(-1, nb, 8, 2, 2)
    assert par.shape[0] == kb * 32 // block
    for bl in range(par.shape[0]):
        for b in range(nb):
            for c in range(8):
                for h in range(2):
                    nn = 16 * b + c + 8 * h
                    want = (scale[bl, nn], 1024 + zero[bl, nn]) if bl < blocks and nn < n else (0, 0)
                    assert tuple(par[bl, b, c, h]) == want, (bl, b, c, h)


def test_q4_to_f16_is_exact():
    """linear_cm.glslh's Q4_F16 on every 4-bit value in each nibble: ((u >> 4 s) & 0x000F000F) | 0x64006400 as two
    fp16, less 1024 + zero, is q - zero exactly for every 4-bit zero point (then one fp16 rounding by the scale)."""
    q = np.arange(16, dtype=np.uint32)
    words = sum(np.roll(q, j) << (4 * j) for j in range(8))
    for z in range(16):
        for sh in range(4):
            bits = ((words >> (4 * sh)) & 0x000F000F) | 0x64006400
            pairs = bits.astype("<u4").view(np.float16).reshape(-1, 2) - np.float16(1024 + z)
            assert np.array_equal(pairs[:, 0].astype(np.float64), np.roll(q, sh) - z.__float__())
            assert np.array_equal(pairs[:, 1].astype(np.float64), np.roll(q, sh + 4) - z.__float__())


def test_q4_takes_linear_cmreg_where_fp16_does():
    """At fp16 on the H200 profile MatMulNBits runs linear_cmreg's w=q4 variant (it has no linear_cm one), the weight
    half a byte an element of the padded packing and its block parameters fp16, no float copy of either; fractional
    zero points and fp32 keep glsl/linear.comp's w=q4."""
    for m, k, n, block, zero in [(1500, 384, 1536, 32, "packed"), (1500, 1536, 384, 16, "none"),
                                 (300, 64, 72, 64, "float")]:
        model = nbits_model(m, k, n, block, seed=1, zero=zero, bias=True)[0]
        plan = _plan(model)
        (d,) = [d for d in plan.dispatches if d.op == "MatMulNBits" and not d.kernel.startswith("linear_reduce")]
        assert d.kernel.startswith("linear_cmreg_") and d.kernel.endswith("_q4_half"), d.kernel
        w = plan.tensors[d.args[2][0]]
        assert w.dtype == "uint4" and w.nbytes == -(-k // 32) * 32 * -(-n // 16) * 16 // 2
        par = plan.tensors[d.args[5][0]]
        blocks = max(-(-k // block), -(-k // 32) * 32 // block)     # (past K up to the last slice's end)
        assert par.dtype == "float16" and par.nbytes == blocks * -(-n // 16) * 16 * 2 * 2
        assert not any(t.data is not None and t.numel >= k * n // 4 and t.name not in (w.name, par.name)
                       for t in plan.tensors.values()), sorted(plan.tensors)
    model = nbits_model(300, 64, 72, 32, seed=1, zero="float")[0]
    zp = next(t for t in model.graph.initializer if t.name == "zp")
    zp.CopyFrom(numpy_helper.from_array(np.full(numpy_helper.to_array(zp).shape, 7.5, np.float32), "zp"))
    (fallback,) = [d.kernel for d in _plan(model).dispatches if d.op == "MatMulNBits"]
    assert fallback.startswith("linear_t44k32_q4_half"), fallback
    (fp32,) = [d.kernel for d in _plan(model, precision="fp32").dispatches if d.op == "MatMulNBits"]
    assert fp32.startswith("linear_t44k32_q4") and "_half" not in fp32, fp32


Q4_CASES = [  # M, K, N, block, zero points, bias, options
    (100, 64, 48, 16, "packed", True, {}),
    (37, 40, 20, 32, "none", False, {}),                     # M, N ragged; K a slice and a quarter, a short last block
    (130, 256, 96, 64, "float", True, {"gemm_splitk": 2}),    # (integral float zero points), K split
    (70, 512, 40, 128, "packed", False, {"cm_tile": "r32n64", "gemm_splitk": 3}),
    (64, 1024, 64, 32, "packed", True, {}),                  # 32 slices in one group
    (1500, 384, 384, 32, "packed", True, {}),
    (1500, 1536, 384, 128, "none", True, {}),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,k,n,block,zero,bias,options", Q4_CASES)
def test_matmul_nbits_q4(mode, m, k, n, block, zero, bias, options):
    p = _device_mma_or_skip(mode)
    if mode == "emulated" and p.device_type == "cpu" and m * n * k > 1500 * 384 * 64:
        pytest.skip("the emulated kernel at this size takes too long on a CPU device")
    model, feeds, w, b = nbits_model(m, k, n, block, seed=m + k + n, zero=zero, bias=bias)
    opts = {"poison": True, **({"coopmat": "emulate"} if mode == "emulated" else {}), **options}
    with Session(model, storage="buffer", precision="fp16", options=opts) as s:
        gemms = [d.kernel for d in s.plan.dispatches if d.op == "MatMulNBits" and not d.kernel.startswith("linear_r")]
        want = "linear_cmreg_emu_" if mode == "emulated" else "linear_cmreg_"
        assert gemms and all(g.startswith(want) and "_q4_" in g for g in gemms), gemms
        if "gemm_splitk" in options:
            assert "_split_" in gemms[0]
        y = s.run(None, feeds)[0]
        assert np.array_equal(y, s.run(None, feeds)[0]), "two runs differ"
    ref = _f16(feeds["A"]) @ w + (_f16(b) if b is not None else 0)
    _check(y, ref, f"{mode} {m}x{k}x{n} block {block} zero {zero} {options}")
