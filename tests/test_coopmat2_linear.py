"""linear_cm2: the fp16 GEMM on VK_NV_cooperative_matrix2's workgroup-scope matrices (glsl/linear_cm2.comp), taken
before the VK_KHR_cooperative_matrix GEMMs (linear_cm, linear_cmreg) where the device has the extension.

Plan level (no GPU): a fake profile, the H200's with the workgroup-scope combinations an H100's driver lists. Numerics:
the real kernel against a float64 numpy reference from the same fp16-rounded operands, outputs poisoned; skipped
unless this device has a usable VK_NV_cooperative_matrix2 (lavapipe has no cooperative matrices at all). Device only:
    pytest tests/test_coopmat2_linear.py -k device"""
import dataclasses
import math

import numpy as np
import pytest
from onnx import numpy_helper

from minirt import MinirtError, Session
from minirt.kernels import gemm
from minirt.kernels.gemm import CM2_TILES
from minirt.options import CM2_TILES as OPTION_TILES
from test_coopmat_linear import H200, _check, _f16, _front_end_model, _front_end_reference, _gelu, _linear_model
from test_coopmat_linear import _plan as _khr_plan
from test_int8_linear import qdq_linear
from test_merge_siblings import qkv_model

import whisper_encoder as we  # noqa: E402  (models/, on the path test_coopmat_linear gives it)

CM2 = dataclasses.replace(H200, api_version="1.4.312", coopmat2=((32, 16, 16, 128), (32, 32, 16, 256)),
                          coopmat2_max_dimension=256, storage8=True)


def _plan(model, profile=CM2, **options):
    return _khr_plan(model, profile, **{"coopmat2": True, "cm_regfed": True, **options})


def _gemms(plan):
    return [d for d in plan.dispatches if d.kernel.startswith("linear") and not d.kernel.startswith("linear_reduce")]


def _notes(plan):
    return [n for ns in plan.notes.values() for n in ns]


# -- plan level ----------------------------------------------------------------------------------------------------

def _check_dispatch(d, tile, out_mode):
    bm, bn, bk, inv = CM2_TILES[tile]
    m, n = np.frombuffer(d.push[:8], np.int32)
    assert d.stem == "linear_cm2" and d.kernel.startswith("linear_cm2_") and "emu" not in d.kernel, d.kernel
    assert d.info["tile"] == tile and d.spec[:4] == (bm, bn, bk, out_mode), (d.node, d.info, d.spec)
    assert d.family == "coopmat" and d.local_size == (inv, 1, 1) and d.global_size == (inv, -(-m // bm), -(-n // bn))
    assert np.frombuffer(d.push[32:48], np.int32).tolist() == [0, 0, 0, 0]    # no A window


def test_whisper_base_takes_it():
    """Every GEMM of a Whisper-base layer but conv2 (which reads conv1's channels-last rows through a window) on
    linear_cm2, unsplit, in the tile of its grid on 132 multiprocessors: 128 x 128 blocks, 64 x 64 for the 512-wide
    outputs (48 blocks of 128 x 128 fill under half of them); the merged QKV writes its parts (OUT_MODE 2)."""
    plan = _plan(we.build_whisper_encoder("base", layers=1, n_frames=3000, seed=2))
    gemms = {d.node.split("/")[-2] if "layers" in d.node else d.node.split("/")[1]: d for d in _gemms(plan)}
    assert set(gemms) == {"conv1", "conv2", "self_attn", "out_proj", "fc1", "fc2"}, list(gemms)
    conv2 = gemms.pop("conv2")
    assert conv2.kernel.startswith("linear_cmreg_")
    assert {d.node for d in plan.dispatches if d.kernel.startswith("linear_reduce")} <= {conv2.node}   # its K split
    tiles = {"conv1": "m128n128k64", "self_attn": "m128n128k64", "fc1": "m128n128k64", "out_proj": "m64n64k64",
             "fc2": "m64n64k64"}
    for name, d in gemms.items():
        _check_dispatch(d, tiles[name], 2 if name == "self_attn" else d.spec[3])
    assert gemms["fc1"].spec[4] == 2      # ACT_GELU
    assert gemms["fc2"].spec[5] == 1 and gemms["out_proj"].spec[5] == 1    # the residuals
    assert any("linear_cm2" in n for n in _notes(plan)) and any("window" in n for n in _notes(plan))


@pytest.mark.parametrize("m,n,k,tile", [(1500, 1536, 512, "m128n128k64"), (1500, 512, 2048, "m64n64k64"),
                                        (24000, 5120, 1280, "m256n128k64"), (1500, 3840, 1280, "m128n128k64"),
                                        (17, 384, 64, "m64n64k64")])
def test_tile_by_grid(m, n, k, tile):
    (d,) = _gemms(_plan(_linear_model(m, n, k, "gelu")[0]))
    _check_dispatch(d, tile, 0)
    # without a multiprocessor count: the default everywhere
    (d,) = _gemms(_plan(_linear_model(m, n, k, "gelu")[0], dataclasses.replace(CM2, compute_units=0)))
    assert d.info["tile"] == gemm.CM2_DEFAULT


def test_forced_tiles_and_the_device_list():
    model = _linear_model(1500, 384, 384, None, True)[0]
    for tile in CM2_TILES:
        (d,) = _gemms(_plan(model, cm2_tile=tile))
        _check_dispatch(d, tile, 0)
        assert d.kernel == "linear_cm2_half_out32" and d.spec[5] == 1     # the graph output itself, the residual
    # a device listing only 256-invocation combinations: the 128-invocation tiles are not among them
    only256 = dataclasses.replace(CM2, coopmat2=((32, 32, 16, 256),))
    assert [t for t in CM2_TILES if gemm.cm2_fits(only256, t)] == [t for t in CM2_TILES if CM2_TILES[t][3] == 256]
    plan = _plan(model, only256, cm2_tile="m64n64k64")
    assert _gemms(plan)[0].kernel.startswith("linear_cmreg_") and any("cm2_tile=m64n64k64" in n for n in _notes(plan))
    # the small tile is not there either: the default tile for a narrow grid
    (d,) = _gemms(_plan(_linear_model(1500, 512, 2048)[0], only256))
    assert d.info["tile"] == gemm.CM2_DEFAULT
    # a maximum dimension below the large tile's 256 rows
    assert not gemm.cm2_fits(dataclasses.replace(CM2, coopmat2_max_dimension=128), "m256n128k64")
    assert OPTION_TILES == tuple(CM2_TILES)
    with pytest.raises(MinirtError, match="cm2_tile"):
        _plan(model, cm2_tile="m16n16k16")


def test_off_switches_give_the_khr_plan():
    """coopmat2=False plans exactly what a device without the extension gets; so do coopmat off or emulate, fp32 and
    a forced K split (linear_cm2 does not split K)."""
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=600, seed=3)

    def key(plan):
        return [(d.kernel, d.args, d.push, d.spec, d.global_size, d.local_size) for d in plan.dispatches]
    for opts in ({}, {"coopmat": "off"}, {"coopmat": "emulate"}, {"gemm_splitk": 2}, {"precision": "fp32"}):
        off = key(_plan(model, H200, **opts))
        assert key(_plan(model, CM2, **{**opts, "coopmat2": False})) == off
        if opts:
            assert key(_plan(model, CM2, **opts)) == off, opts


def test_int8_weights():
    """Symmetric int8 weights (quantize_weights, or a DequantizeLinear without zero points) on the w=i8 variant, its
    scales at binding 5; with zero points, or without 8-bit storage, a KHR GEMM's w=i8 variant and a note."""
    plan = _plan(_linear_model(100, 64, 64)[0], quantize_weights="int8")
    (d,) = _gemms(plan)
    assert d.kernel == "linear_cm2_i8_half" and d.args[2][0].endswith("@i8") and d.args[5][0].endswith(".qparams@packed")
    _check_dispatch(d, "m64n64k64", 0)
    model = qdq_linear(1500, 384, 384, seed=1, residual=True)[0]
    assert [d.kernel for d in _gemms(_plan(model))] == ["linear_cm2_i8_half_out32"]
    for profile, model, why in ((CM2, qdq_linear(100, 64, 64, seed=1, zero=True)[0], "zero points"),
                                (dataclasses.replace(CM2, storage8=False), model, "8-bit storage")):
        plan = _plan(model, profile)
        kernel = _gemms(plan)[0].kernel   # the KHR int8 GEMMs: register-fed on the "mma" layout
        assert kernel.startswith(("linear_cmreg_r32n64_i8_half", "linear_cm_m64n64k32s1_i8_half")), kernel
        assert any("linear_cm2 not used" in n and why in n for n in _notes(plan)), _notes(plan)


def test_extension_without_its_features_is_noted():
    why = "VK_NV_cooperative_matrix2 lacks the feature cooperativeMatrixTensorAddressing"
    plan = _plan(_linear_model(1500, 384, 384)[0], dataclasses.replace(H200, coopmat2_missing=why))
    assert _gemms(plan)[0].kernel.startswith("linear_cmreg_") and f"linear_cm2 not used: {why}" in _notes(plan)


def test_feature_structs_match_the_vulkan_headers():
    """The structs minirt/vk/device.py declares for VK_NV_cooperative_matrix2 (the binding predates it): the C layout
    of vulkan_core.h's (enums and VkBool32 are 32-bit; pNext at 8), and a chained struct's address in its head."""
    from minirt.vk.device import _cm2_struct, cm2_ffi
    ffi = cm2_ffi()
    for ctype, size, last, at in (
            ("VkPhysicalDeviceCooperativeMatrix2FeaturesNV", 48, "cooperativeMatrixBlockLoads", 40),
            ("VkPhysicalDeviceCooperativeMatrix2PropertiesNV", 32, "cooperativeMatrixWorkgroupScopeReservedSharedMemory", 24),
            ("VkCooperativeMatrixFlexibleDimensionsPropertiesNV", 56, "workgroupInvocations", 52)):
        assert (ffi.sizeof(ctype), ffi.offsetof(ctype, "pNext"), ffi.offsetof(ctype, last)) == (size, 8, at), ctype
    vk = pytest.importorskip("vulkan")
    nxt = vk.ffi.new("VkPhysicalDeviceSubgroupProperties*")
    head = vk.ffi.new("VkPhysicalDeviceFeatures2*", {"pNext": nxt})
    ptr, s = _cm2_struct(vk, head, "features")
    assert s.sType == 1000593000 and int(ffi.cast("uintptr_t", s.pNext)) == int(vk.ffi.cast("uintptr_t", nxt))
    at = int(ffi.cast("uintptr_t", s))
    assert int(vk.ffi.cast("uintptr_t", head.pNext)) == at == int(vk.ffi.cast("uintptr_t", ptr))


# -- numerics on the device ----------------------------------------------------------------------------------------

def _device_or_skip():
    from minirt.session import get_device
    try:
        p = get_device().profile
    except MinirtError as e:
        pytest.skip(f"no Vulkan device: {e}")
    if not p.coopmat2:
        pytest.skip(f"{p.name}: no usable VK_NV_cooperative_matrix2 ({p.coopmat2_missing or 'not listed'})")
    return p


def _run(model, feeds, **options):
    opts = {"poison": True, "coopmat2": True, **options}
    with Session(model, storage="buffer", precision="fp16", options=opts) as s:
        gemms = [d.kernel for d in _gemms(s.plan)]
        assert gemms and all(k.startswith("linear_cm2_") for k in gemms), (gemms, _notes(s.plan))
        y = s.run(None, feeds)
        y2 = s.run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(y, y2)), "two runs differ"
    return y


def _reference(x, w, b, act, r):
    ref = _f16(x) @ _f16(w) + _f16(b)
    if act == "relu":
        ref = np.maximum(ref, 0)
    elif act == "gelu":
        ref = _gelu(ref)
    elif act == "gelu_tanh":
        ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref ** 3)))
    return ref if r is None else ref + _f16(r)


def _check_linear(m, n, k, act, residual, seed, **options):
    model, w, b = _linear_model(m, n, k, act, residual, seed)
    rng = np.random.default_rng(seed + 100)
    feeds = {"x": rng.standard_normal((1, m, k)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((1, m, n)).astype(np.float32)
    (y,) = _run(model, feeds, **options)
    _check(y, _reference(feeds["x"], w, b, act, feeds.get("r")), f"{m}x{n}x{k} act={act} residual={residual} {options}")


# Whisper's GEMMs (base: d_model 512; large-v3-turbo: 1280; M = 1500 positions, 3000 for conv1), ragged M (17), N and
# K off every block size, N % 4 != 0, every epilogue
DEVICE_CASES = [(1500, 1536, 512, None, False), (1500, 2048, 512, "gelu", False), (1500, 512, 2048, None, True),
                (3000, 512, 240, "gelu", False), (1500, 3840, 1280, None, False), (1500, 5120, 1280, "gelu", False),
                (1500, 1280, 5120, None, True), (17, 384, 64, "relu", True), (1500, 200, 72, "gelu_tanh", True),
                (37, 22, 12, "relu", True), (100, 72, 36, "gelu", True)]


@pytest.mark.parametrize("m,n,k,act,residual", DEVICE_CASES)
def test_device_linear(m, n, k, act, residual):
    _device_or_skip()
    _check_linear(m, n, k, act, residual, seed=m + n + k)


@pytest.mark.parametrize("tile", list(CM2_TILES))
@pytest.mark.parametrize("m,n,k,act,residual", [(1500, 200, 72, "gelu", True), (300, 264, 136, None, False)])
def test_device_tiles(tile, m, n, k, act, residual):
    """Every tile on blocks ragged in M, N and K (the clamped loads and stores) and on whole ones."""
    p = _device_or_skip()
    if not gemm.cm2_fits(p, tile):
        pytest.skip(f"{p.name} lists no combination for {tile}")
    _check_linear(m, n, k, act, residual, seed=n + k, cm2_tile=tile)


@pytest.mark.parametrize("m,k,n,residual", [(1500, 512, 1536, False), (1500, 2048, 512, True), (17, 72, 200, True)])
def test_device_int8(m, k, n, residual):
    """Symmetric int8 weights (w=i8: int8 slices converted to fp16, the scale in the epilogue) against float64."""
    p = _device_or_skip()
    if not p.storage8:
        pytest.skip(f"{p.name}: no 8-bit storage buffers")
    model, feeds, w, b = qdq_linear(m, k, n, seed=m + n, act=True, residual=residual)
    (y,) = _run(model, feeds)
    ref = np.maximum(_f16(feeds["x"][0]) @ w + _f16(b), 0)
    _check(y[0], ref + (_f16(feeds["r"][0]) if residual else 0), f"int8 {m}x{k}x{n}")


@pytest.mark.parametrize("tile", [None, "m128n256k64", "m64n128k64"])
@pytest.mark.parametrize("t,n", [(1500, 384), (40, 72)])
def test_device_parts(tile, t, n):
    """Sibling Linears merged into one GEMM writing part-major output (OUT_MODE 2): blocks inside one part (tensor
    stores) and blocks across parts (384 or 72 columns a part: the per-element stores)."""
    p = _device_or_skip()
    if tile and not gemm.cm2_fits(p, tile):
        pytest.skip(f"{p.name} lists no combination for {tile}")
    k = 64
    model = qkv_model(t=t, k=k, n=n, biases=(True, True, True), scales=(None, None, None), act="Relu", consume=False)
    x = np.random.default_rng(t + n).uniform(-2, 2, (1, t, k)).astype(np.float32)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    with Session(model, storage="buffer", precision="fp16",
                 options={"poison": True, "coopmat2": True, **({"cm2_tile": tile} if tile else {})}) as s:
        (d,) = _gemms(s.plan)
        assert d.kernel.startswith("linear_cm2_") and d.spec[3] == 2, (d.kernel, d.spec)
        outs = s.run(None, {"x": x})
    for y, name in zip(outs, "qkv"):
        _check(y, _reference(x, inits[f"w{name}"], inits[f"b{name}"], "relu", None), f"part {name} tile={tile}")


def test_device_conv_front_end():
    """Whisper's conv front end at 3000 frames: conv1's im2col GEMM on linear_cm2 (conv2 reads through a window: the
    KHR kernels), against float64."""
    _device_or_skip()
    model, ws = _front_end_model(3000, seed=3)
    x = np.random.default_rng(4).standard_normal((1, 80, 3000)).astype(np.float32)
    with Session(model, storage="buffer", precision="fp16", options={"poison": True, "coopmat2": True}) as s:
        assert any(d.kernel.startswith("linear_cm2_") for d in _gemms(s.plan)), [d.kernel for d in _gemms(s.plan)]
        (y,) = s.run(None, {"x": x})
    _check(y, _front_end_reference(x, *ws), "front end")


def test_device_profile_reports_it():
    """What the driver reported, as the profile holds it: workgroup-scope combinations of 128 or more invocations whose
    granularities are powers of two, and a maximum dimension."""
    p = _device_or_skip()
    assert p.coopmat2_max_dimension >= 64 and not p.coopmat2_missing
    for mg, ng, kg, inv in p.coopmat2:
        assert inv >= 32 and all(g > 0 and g & (g - 1) == 0 for g in (mg, ng, kg)), p.coopmat2
    assert gemm.cm2_fits(p, gemm.CM2_DEFAULT), p.coopmat2


def test_pipeline_failure_names_the_kernel(monkeypatch):
    """A driver that refuses a pipeline (as a first coopmat2 driver might): a DeviceError naming the kernel, its local
    size and constants; the next Session, with the driver well again, runs."""
    vk = pytest.importorskip("vulkan")
    from minirt.errors import DeviceError
    model, w, b = _linear_model(37, 20, 12, "relu")
    x = np.random.default_rng(5).standard_normal((1, 37, 12)).astype(np.float32)

    def refuse(*args, **kwargs):
        raise vk.VkErrorInitializationFailed("refused")
    with monkeypatch.context() as mp:
        mp.setattr(vk, "vkCreateComputePipelines", refuse)
        mp.setenv("MINIRT_NO_PIPELINE_CACHE", "1")
        with pytest.raises(DeviceError, match=r"creating the pipeline of kernel 'linear_\w+' \(local size"):
            Session(model, storage="buffer")
    with Session(model, storage="buffer") as s:
        (y,) = s.run(None, {"x": x})
    ref = np.maximum(x.astype(np.float64) @ w + b, 0)
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()


def test_flexible_dimensions_are_read(monkeypatch):
    """minirt/vk/device.py's reading of vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV, against a
    stand-in entry point that lists what an H100's driver does (and entries the kernel cannot use: another scope,
    f16 accumulation, saturating, int8): only the workgroup-scope f16 x f16 -> f32 ones are kept; and what turns the
    route off (a missing feature, Vulkan 1.2, no KHR cooperative matrices) is said."""
    import types

    import minirt.vk.device as device
    vk = pytest.importorskip("vulkan")
    ffi = device.cm2_ffi()
    # (M, N, K granularity, A, B, C, result, saturating, scope, invocations); types 0 f16, 1 f32, 3 s8, 5 s32
    listed = [(32, 16, 16, 0, 0, 1, 1, 0, 2, 128), (32, 32, 16, 0, 0, 1, 1, 0, 2, 256), (32, 32, 16, 0, 0, 0, 0, 0, 2, 256),
              (16, 16, 16, 0, 0, 1, 1, 0, 3, 32), (32, 32, 32, 3, 3, 5, 5, 1, 2, 256)]
    fields = ("MGranularity", "NGranularity", "KGranularity", "AType", "BType", "CType", "ResultType",
              "saturatingAccumulation", "scope", "workgroupInvocations")
    seen = []

    @ffi.callback("PFN_flexible")
    def flexible(pd, count, props):
        seen.append(int(ffi.cast("uintptr_t", pd)))
        if props == ffi.NULL:
            count[0] = len(listed)
            return 0
        for i, row in enumerate(listed[:count[0]]):
            assert props[i].sType == 1000593001
            for f, v in zip(fields, row):
                setattr(props[i], f, v)
        return 0
    addr = int(ffi.cast("uintptr_t", flexible))
    fake = types.SimpleNamespace(ffi=vk.ffi, lib=types.SimpleNamespace(
        vkGetInstanceProcAddr=lambda inst, name: vk.ffi.cast("void*", addr)))
    monkeypatch.setattr(device._Instance, "get", classmethod(lambda cls: None))
    feats = ffi.new("VkPhysicalDeviceCooperativeMatrix2FeaturesNV*", {f: 1 for f in device.CM2_FEATURES})
    pd = vk.ffi.cast("void*", 0x1000)
    v14 = (1 << 22) | (4 << 12)
    assert device._coopmat2(fake, pd, v14, True, feats) == (((32, 16, 16, 128), (32, 32, 16, 256)), "")
    assert seen == [0x1000, 0x1000]
    assert "Vulkan 1.3" in device._coopmat2(fake, pd, (1 << 22) | (2 << 12), True, feats)[1]
    assert "VK_KHR_cooperative_matrix" in device._coopmat2(fake, pd, v14, False, feats)[1]
    feats.cooperativeMatrixTensorAddressing = 0
    assert device._coopmat2(fake, pd, v14, True, feats) == ((), "VK_NV_cooperative_matrix2 lacks the feature "
                                                                "cooperativeMatrixTensorAddressing")
