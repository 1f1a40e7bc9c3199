"""linear_cm: the cooperative-matrix GEMM (glsl/linear_cm.comp) behind every buffer Linear and im2col conv at
precision fp16 on devices with VK_KHR_cooperative_matrix.

Plan level (no GPU, the fake H200 profile): which GEMMs take it and with what dispatch. Numerics: against a float64
numpy reference computed from the same fp16-rounded inputs, weights and biases, in two modes:
  coopmat   the real kernel; skipped unless this device reports cooperative matrices (an NVIDIA H200 does)
  emulated  glsl/linear_cm_emu.comp, the same source with the three matrix operations in plain code: runs on any
            fp16 device (lavapipe too), so tiling, staging, bounds and the epilogue are tested everywhere
Only the real kernel and the plan tests: `-k 'not emulated'` (every test id contains "coopmat": the module name)."""
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt import MinirtError, Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import prepare
from minirt.loaders import load
from minirt.kernels.gemm import CM_SHAPE, CM_TILES, REG_TILES, cm_shared_bytes
from minirt.planner import make_plan
from oracle import make_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402

H200 = KNOWN_PROFILES["nvidia-h200"]
MODES = ("coopmat", "emulated")
_erf = np.vectorize(math.erf, otypes=[np.float64])


def _plan(model, profile=H200, **options):
    """linear_cm's plan: REGFED (tests/test_coopmat_regfed.py) and linear_cm2 (tests/test_coopmat2_linear.py) off
    unless asked for."""
    return make_plan(prepare(load(model)), profile, "buffer", {"precision": "fp16", "cm_regfed": False,
                                                               "coopmat2": False, **options})


def _linear_model(m, n, k, act=None, residual=False, seed=0):
    """x [1, M, K] @ W + b (then Relu / Gelu / tanh Gelu) (+ r), which fuse_linear makes one Linear."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    b = (0.5 * rng.standard_normal(n)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"])]
    cur = "hb"
    if act:
        attrs = {"approximate": "tanh"} if act == "gelu_tanh" else {}
        nodes.append(helper.make_node("Relu" if act == "relu" else "Gelu", [cur], ["ha"], **attrs))
        cur = "ha"
    inputs = {"x": (1, m, k)}
    if residual:
        nodes.append(helper.make_node("Add", [cur, "r"], ["y"]))
        inputs["r"] = (1, m, n)
    else:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    return make_model(nodes, inputs, ["y"], {"w": w, "b": b}, opset=20), w, b


def _front_end_model(t, seed=0):
    """Whisper's conv front end: conv 80->384 k3 p1 + Gelu, conv 384->384 k3 s2 p1 + Gelu, on [1, 80, T]."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((384, 80, 3)) / math.sqrt(240)).astype(np.float32)
    b1 = (0.1 * rng.standard_normal(384)).astype(np.float32)
    w2 = (rng.standard_normal((384, 384, 3)) / math.sqrt(1152)).astype(np.float32)
    b2 = (0.1 * rng.standard_normal(384)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1]), helper.make_node("Gelu", ["c1"], ["g1"]),
             helper.make_node("Conv", ["g1", "w2", "b2"], ["c2"], pads=[1, 1], strides=[2]),
             helper.make_node("Gelu", ["c2"], ["y"])]
    return make_model(nodes, {"x": (1, 80, t)}, ["y"], {"w1": w1, "b1": b1, "w2": w2, "b2": b2}, opset=20), \
        (w1, b1, w2, b2)


def _kernels(plan):
    return [d.kernel for d in plan.dispatches]


# -- plan level ---------------------------------------------------------------------------------------------

def test_whisper_gemms_take_coopmat_on_h200():
    m = we.build_whisper_encoder("tiny", layers=1, n_frames=3000, seed=2)
    plan = _plan(m)
    gemms = [d for d in plan.dispatches if d.kernel.startswith("linear_cm") or d.kernel.startswith("linear_t")]
    assert len(gemms) == 6, _kernels(plan)     # conv1, conv2, q+k+v (merge_siblings), out_proj, fc1, fc2
    splits = {}
    for d in gemms:
        assert d.kernel.startswith("linear_cm_") and d.kernel.endswith("_half"), d.kernel
        assert "emu" not in d.kernel and d.family == "coopmat" and d.local_size == (128, 1, 1), d
        tile = d.kernel[len("linear_cm_"):-len("_half")].replace("split_", "")
        mm, n = np.frombuffer(d.push[:8], np.int32)
        S = int(np.frombuffer(d.push[16:32], np.int32)[3]) if "_split_" in d.kernel else 1
        bm, bn = CM_TILES[tile][:2]
        assert d.global_size == (128, -(-mm // bm), -(-n // bn) * S), d
        splits[d.node.split("/")[-2]] = S
        if S > 1:   # its partials, then the reduce pass into the Linear's output
            red = plan.dispatches[plan.dispatches.index(d) + 1]
            # (linear_reduce_ln: with the LayerNorm that reads the output folded in, fuse_reduce_layer_norm)
            assert red.kernel.startswith("linear_reduce") and red.args[1] == (d.args[0][0], "r")
            assert plan.tensors[d.args[0][0]].dtype == "float32"
    # K split across work groups into as many splits as fit one wave of 64x64 groups (528 places: 4 a multiprocessor,
    # bound by registers) with 16 or more 32-deep slices each: fc2 (K 1536) three times; GEMMs whose output a LayerNorm
    # reads need 4 slices a split (gemm.before_ln: their reduce pass does the LayerNorm): conv2 (K 1152) and the
    # out-projection (K 384) three times too
    assert splits == {"conv1": 1, "conv2": 3, "self_attn": 1, "out_proj": 3, "fc1": 1, "fc2": 3}, splits
    tiles = {tuple(np.frombuffer(d.push[:8], np.int32)): d.kernel.replace("split_", "") for d in gemms}   # (M, N)
    # the default tile (the H200's fastest) for every Whisper GEMM whose 64x64 groups fit one wave (528 places), twice
    # as wide blocks where they do not: fc1 (1500 x 1536: 576 groups). The merged QKV (1500 x 1152: 432) and conv1
    # (3000 x 384: 282) fit.
    wide = {(1500, 1536)}
    assert wide | {(3000, 384), (1500, 1152)} <= set(tiles), tiles
    for (mm, n), kernel in tiles.items():
        assert kernel == ("linear_cm_m64n128k32s1_half" if (mm, n) in wide else "linear_cm_m64n64k32s1_half"), tiles
    assert not any(k.startswith("linear_t") for k in _kernels(plan))


def test_one_wave_rule_needs_the_multiprocessor_count():
    """Without a multiprocessor count (or with a forced tile) every GEMM keeps one 64x64 tile; and the rule follows the
    count: with 4x the multiprocessors fc1 fits one wave of 64x64 groups already."""
    import dataclasses
    m = we.build_whisper_encoder("tiny", layers=1, n_frames=3000, seed=2)
    for profile, options, tile in ((dataclasses.replace(H200, compute_units=0), {}, "m64n64k32s1"),
                                   (H200, {"cm_tile": "m64n64k32s1"}, "m64n64k32s1")):
        plan = _plan(m, profile=profile, **options)
        assert {d.kernel for d in plan.dispatches if d.kernel.startswith("linear_cm")} <= \
            {f"linear_cm_{tile}_half", f"linear_cm_split_{tile}_half"}, plan.dispatches
    plan = _plan(m, profile=dataclasses.replace(H200, compute_units=528))
    tiles = {tuple(np.frombuffer(d.push[:8], np.int32)): d.kernel for d in plan.dispatches if d.kernel.startswith("linear")}
    assert tiles[(1500, 1536)] == "linear_cm_m64n64k32s1_half"


def test_same_interface_as_linear():
    """Bindings, push constants and specialization constants are linear.comp's (plus linear_cm's REG_EPI, off where
    the output is not split K's partials, and VEC8 where K and N allow), for linears and im2col convs; A_WIN (conv2
    reading conv1's channels-last output) in both."""
    for model in (_linear_model(100, 72, 36, "gelu", True)[0], _front_end_model(64)[0]):
        cm = [d for d in _plan(model).dispatches if d.kernel.startswith("linear")]
        # (linear.comp's PAIR_LANES, after A_WIN, has no counterpart in linear_cm: left off here)
        plain = [d for d in _plan(model, coopmat=False, pair_lanes=False).dispatches if d.kernel.startswith("linear")]
        assert len(cm) == len(plain) >= 1
        for a, b in zip(cm, plain):
            assert a.kernel.startswith("linear_cm_") and b.kernel.startswith("linear_t"), (a.kernel, b.kernel)
            win = b.spec[3:]      # linear.comp's A_WIN, where on
            vec8 = a.spec[5:] if a.spec[4:] else ()
            assert (a.args[1:], a.push, a.spec, a.flops, a.bytes) == (
                b.args[1:], b.push, b.spec[:3] + (0,) + (win or ((0,) if vec8 else ())) + vec8, b.flops, b.bytes)
            # the graph output: linear.comp writes it as float32 (io=out32), linear_cm a float16 stand-in for a cast
            out = b.args[0][0]
            assert a.args[0] == (out, "w") or a.args[0] == (f"{out}@f16", "w") and b.kernel.endswith("_out32")


def test_off_switch_fp32_and_other_devices():
    m = _linear_model(1500, 384, 384, residual=True)[0]
    assert [k for k in _kernels(_plan(m, coopmat=False)) if k.startswith("linear")] == ["linear_t44k32_half_out32"]
    # fp32 never takes it and is what it was: the coopmat option changes nothing there
    g = prepare(load(m))
    fp32 = make_plan(g, H200, "buffer", {})
    assert [k for k in _kernels(fp32) if k.startswith("linear")] == ["linear_t44k32"]
    off = make_plan(g, H200, "buffer", {"coopmat": False})
    assert [(d.kernel, d.args, d.push, d.spec, d.global_size, d.local_size) for d in fp32.dispatches] == \
        [(d.kernel, d.args, d.push, d.spec, d.global_size, d.local_size) for d in off.dispatches]
    # devices without the f16 x f16 -> f32 subgroup shape, or without cooperative matrices at all
    f16_acc_only = dataclasses.replace(H200, coopmat_shapes=((16, 16, 16, "f16", "f16", "f16", "f16"),))
    for profile in (KNOWN_PROFILES["lavapipe"], f16_acc_only, dataclasses.replace(H200, cooperative_matrix=False),
                    dataclasses.replace(H200, fp16=False)):
        assert not any("linear_cm" in k for k in _kernels(_plan(m, profile))), profile.name
    assert CM_SHAPE in H200.coopmat_shapes


def test_forced_tile_and_shared_memory_limit():
    m = _linear_model(1500, 384, 384)[0]
    for tile in [t for t in CM_TILES if t not in REG_TILES]:
        assert f"linear_cm_{tile}_half" in _kernels(_plan(m, cm_tile=tile))
    with pytest.raises(MinirtError, match="cm_tile"):
        _plan(m, cm_tile="m16n16")
    # the default one-stage 64x64x32 blocks need 9.5 KiB (the epilogue's scratch lies over the stage), the wide tile
    # more: below that, linear.comp
    assert cm_shared_bytes("m64n64k32s1") == 9728
    assert cm_shared_bytes("m64n128k32s1") > 9728
    for shared, want in ((9216, "linear_t44k32_half"), (9728, "linear_cm_m64n64k32s1_half"),
                         (20480, "linear_cm_m64n64k32s1_half")):
        # (a 1500 x 384 output: 144 groups, one wave of 64x64 blocks at any of these sizes, so no wide tile)
        assert want in _kernels(_plan(_linear_model(1500, 384, 384)[0], dataclasses.replace(H200, max_shared_memory=shared)))


def test_forced_local_size_leaves_coopmat_alone():
    plan = _plan(_linear_model(1500, 384, 384)[0], local_size=(8, 8, 1))
    d = next(d for d in plan.dispatches if d.kernel.startswith("linear_cm"))
    assert d.local_size == (128, 1, 1)


def test_fp16_plan_casts_into_the_float32_outputs():
    plan = _plan(_linear_model(37, 20, 12)[0])
    last = plan.dispatches[-1]
    assert last.kernel == "cast_buffer_up" and last.writes == ["y"] and plan.tensors["y"].dtype == "float32"


# -- numerics -----------------------------------------------------------------------------------------------

def _device_or_skip(mode):
    from minirt.session import get_device
    try:
        p = get_device().profile
    except MinirtError as e:
        pytest.skip(f"no Vulkan device: {e}")
    if not (p.storage16 and p.fp16):
        pytest.skip(f"{p.name}: no 16-bit storage buffers / shaderFloat16")
    if mode == "coopmat" and not p.cooperative_matrix:
        pytest.skip(f"{p.name} reports no cooperative matrices")
    if mode == "emulated" and p.subgroup_size < 8:
        pytest.skip(f"{p.name}: subgroups of {p.subgroup_size} lanes (the emulation needs 8 or more)")
    return p


def _options(mode, **extra):
    return {"poison": True, "cm_regfed": False, "coopmat2": False,
            **({"coopmat": "emulate"} if mode == "emulated" else {}), **extra}


def _run(model, feeds, mode, **options):
    """Run at fp16 after checking that the plan's GEMMs are the mode's kernel and that every kernel it needs
    was built (the other kernels' _half variants come with the fp16 kernel work, not with linear_cm)."""
    from minirt.session import get_device
    from minirt.vk.pipelines import spirv_dir
    opts = _options(mode, **options)
    plan = _plan(model, get_device().profile, **opts)
    want = "linear_cm_emu_" if mode == "emulated" else "linear_cm_"
    gemms = [k for k in _kernels(plan) if k.startswith("linear") and not k.startswith("linear_reduce")]
    assert gemms and all(k.startswith(want) for k in gemms), _kernels(plan)
    built = json.loads((spirv_dir() / "manifest.json").read_text())["shaders"]
    missing = sorted(set(_kernels(plan)) - set(built))
    if missing:
        pytest.skip(f"kernels not built in this tree: {', '.join(missing)}")
    with Session(model, storage="buffer", precision="fp16", options=opts) as s:
        return s.run(None, feeds)[0], gemms


def _f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


def _gelu(v):
    return 0.5 * v * (1 + _erf(v / math.sqrt(2)))


def _check(y, ref, what):
    y = np.asarray(y, np.float64)
    assert y.shape == ref.shape, (what, y.shape, ref.shape)
    assert not np.isnan(y).any(), f"{what}: NaN in the output (an element not written?)"
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err <= 2e-3, f"{what}: relative L2 error {err:.3g}"


LINEAR_CASES = [(1500, 384, 384, None, False), (1500, 1536, 384, "gelu", False), (1500, 384, 1536, None, True),
                (37, 20, 12, "relu", False), (9, 8, 4, "gelu_tanh", True), (100, 72, 36, "gelu", True),
                (37, 22, 12, "relu", True)]    # N % 4 != 0: the epilogue's scalar stores
# (8 rows or fewer go to glsl/linear_rows.comp, at fp16 too: tests/test_linear_rows.py)


def _check_linear(mode, m, n, k, act, residual, seed, **options):
    model, w, b = _linear_model(m, n, k, act, residual, seed)
    rng = np.random.default_rng(seed + 100)
    feeds = {"x": rng.standard_normal((1, m, k)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((1, m, n)).astype(np.float32)
    y, _ = _run(model, feeds, mode, **options)
    ref = _f16(feeds["x"]) @ _f16(w) + _f16(b)
    if act == "relu":
        ref = np.maximum(ref, 0)
    elif act == "gelu":
        ref = _gelu(ref)
    elif act == "gelu_tanh":
        ref = 0.5 * ref * (1 + np.tanh(math.sqrt(2 / math.pi) * (ref + 0.044715 * ref ** 3)))
    if residual:
        ref = ref + _f16(feeds["r"])
    _check(y, ref, f"{mode} {m}x{n}x{k} act={act} residual={residual} {options}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k,act,residual", LINEAR_CASES)
def test_linear(mode, m, n, k, act, residual):
    p = _device_or_skip(mode)
    if mode == "emulated" and p.device_type == "cpu" and m * n * k > 1500 * 384 * 384:
        pytest.skip("the emulated kernel at this size takes too long on a CPU device")
    _check_linear(mode, m, n, k, act, residual, seed=m + n + k)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k,act,residual,S,tile", [
    (130, 64, 1536, "gelu", True, 2, None), (70, 36, 520, None, True, 3, None),
    (64, 128, 300, "relu", False, 4, "m64n128k32s1"), (9, 8, 100, None, False, 5, None)])   # 4 slices in 5 splits
def test_split_k(mode, m, n, k, act, residual, S, tile):
    """K split across work groups (linear_cm_split.comp, then linear_reduce_half) against float64 on fp16-rounded
    inputs, poisoned: ragged K ranges, splits without slices, the wide tile."""
    _device_or_skip(mode)
    extra = {"gemm_splitk": S, **({"cm_tile": tile} if tile else {})}
    model = _linear_model(m, n, k, act, residual, 1)[0]
    plan = _plan(model, **_options(mode, **extra))
    want = "linear_cm_emu_split_" if mode == "emulated" else "linear_cm_split_"
    ks = [k_ for k_ in _kernels(plan) if not k_.startswith("cast_")]   # casts of the float32 graph inputs aside
    (i,) = [j for j, k_ in enumerate(ks) if k_.startswith("linear_cm")]
    assert ks[i].startswith(want) and ks[i + 1].startswith("linear_reduce_half"), ks
    _check_linear(mode, m, n, k, act, residual, seed=m + k + S, **extra)


def _flags(d):
    """(A_WIN, VEC8, EPI8) of a linear_cm dispatch: the specialization constants after REG_EPI, 0 where left out."""
    return tuple(d.spec[4:]) + (0,) * (7 - len(d.spec))


def test_vec8_and_epi8_where_every_group_of_8_halves_is_whole():
    """VEC8 (16-byte loads of A and B) and EPI8 (16-byte epilogue stores): on for every Whisper GEMM on the H200 (EPI8
    not on split K's partials, which the register epilogue writes), off where K or N (or for EPI8 the part width) is
    not a multiple of 8; trailing constants left out where off."""
    plan = _plan(we.build_whisper_encoder("tiny", layers=1, seed=2))
    cms = [d for d in plan.dispatches if d.kernel.startswith("linear_cm")]
    assert len(cms) == 6
    for d in cms:
        assert _flags(d) == (int("conv2" in d.node), 1, int("_split_" not in d.kernel)), (d.node, d.spec)
    for (m, n, k), want in {(64, 24, 16): (0, 1, 1), (64, 20, 16): (0, 0, 0), (64, 24, 12): (0, 0, 1),
                            (100, 72, 36): (0, 0, 1), (64, 36, 16): (0, 0, 0)}.items():
        (d,) = [d for d in _plan(_linear_model(m, n, k)[0]).dispatches if d.kernel.startswith("linear_cm")]
        assert _flags(d) == want, (m, n, k, d.spec)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k,S", [(130, 72, 40, 1), (70, 48, 264, 3), (130, 68, 36, 1), (70, 44, 260, 3)])
def test_vec8_and_vec4_fetches(mode, m, n, k, S):
    """8-half fetches and 8-column epilogue stores (K and N multiples of 8) and their 4-wide fallbacks (K, N = 4 mod 8)
    against float64: ragged M, K not a multiple of the 32-deep slice, a split."""
    _device_or_skip(mode)
    _check_linear(mode, m, n, k, "gelu", True, seed=m + k, **({"gemm_splitk": S} if S > 1 else {}))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("m,n,k,act,residual,S", [
    (37, 21, 12, "relu", True, None),      # N odd: no column pairs, scalar stores
    (100, 72, 36, "gelu", True, None), (77, 130, 40, None, False, None),
    (130, 64, 1536, "gelu", True, 2)])     # split K: the partials as column pairs
def test_epilogues(mode, m, n, k, act, residual, S):
    """Both epilogues of linear_cm.glslh: REG_EPI for split K's partials (each lane's accumulator elements straight from
    registers, where the device's element layout is the probed "mma" one; always in the emulated kernel) and the
    shared-scratch one elsewhere; the plan carries the choice as specialization constant 6."""
    p = _device_or_skip(mode)
    reg = S is not None
    extra = {"gemm_splitk": S} if S else {}
    if mode == "coopmat" and reg and p.coopmat_layout != "mma":
        pytest.skip(f"{p.name}: cooperative-matrix layout {p.coopmat_layout!r}, not the one REG_EPI reads")
    plan = _plan(_linear_model(m, n, k, act, residual, 3)[0], p, **_options(mode, **extra))
    cms = [d for d in plan.dispatches if d.kernel.startswith("linear_cm")]
    assert cms and all(d.spec[3] == reg for d in cms), [(d.kernel, d.spec) for d in cms]
    _check_linear(mode, m, n, k, act, residual, seed=m + n + k + 7, **extra)


def test_reg_epilogue_needs_the_probed_layout():
    """REG_EPI by default for split K's partials only, and only where the device's layout was probed to be "mma" (or
    in the emulated kernel, which uses it)."""
    model = _linear_model(100, 72, 36, "gelu", True)[0]
    split = _linear_model(130, 64, 1536, "gelu", True)[0]
    unknown = dataclasses.replace(H200, coopmat_layout="")

    def regs(m, profile=H200, **options):
        return [d.spec[3] for d in _plan(m, profile, **options).dispatches if d.kernel.startswith("linear_cm")]
    assert regs(model) == [0] and regs(split, gemm_splitk=2) == [1]
    assert regs(split, unknown, gemm_splitk=2) == [0]
    assert regs(split, unknown, coopmat="emulate", gemm_splitk=2) == [1]


def test_split_k_refusals():
    """N % 4 != 0 or NCHW outputs never split."""
    assert not any("split" in k for k in _kernels(_plan(_linear_model(100, 66, 512, None, False)[0], gemm_splitk=2)))
    # (conv1 writes rows for conv2 under conv_input_nlc: off here, so both convs write NCHW)
    assert not any("split" in k for k in _kernels(_plan(_front_end_model(64)[0], gemm_splitk=2, conv_input_nlc=False)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tile", [t for t in CM_TILES if t not in REG_TILES])
def test_every_tile(mode, tile):
    """Every tile on a shape with partial blocks in M, N and K (K = 392: 6 full 64-deep slices and 8 more)."""
    p = _device_or_skip(mode)
    if cm_shared_bytes(tile) > p.max_shared_memory:
        pytest.skip(f"{tile} needs {cm_shared_bytes(tile)} bytes of shared memory, {p.name} has {p.max_shared_memory}")
    _check_linear(mode, 150, 200, 392, "gelu", True, seed=7, cm_tile=tile)


def _front_end_reference(x, w1, b1, w2, b2):
    """The same convs in float64 from fp16-rounded operands, the intermediate rounded to fp16 as it is stored."""
    def conv(v, w, b, stride):
        vp = np.pad(v, ((0, 0), (1, 1)))
        n = (v.shape[1] - 1) // stride + 1
        return sum(w[:, :, t] @ vp[:, t:t + (n - 1) * stride + 1:stride] for t in range(3)) + b[:, None]
    h = _f16(_gelu(conv(_f16(x[0]), _f16(w1), _f16(b1), 1)))
    return _gelu(conv(h, _f16(w2), _f16(b2), 2))[None]


@pytest.mark.parametrize("mode", MODES)
def test_whisper_conv_front_end(mode):
    """im2col + linear_cm with OUT_MODE 1 (NCHW output): M = 3000, K = 240 and M = 1500, K = 1152 on a real
    device; a shorter input for the emulation on a CPU device."""
    p = _device_or_skip(mode)
    t = 200 if mode == "emulated" and p.device_type == "cpu" else 3000
    model, ws = _front_end_model(t, seed=3)
    x = np.random.default_rng(4).standard_normal((1, 80, t)).astype(np.float32)
    y, _ = _run(model, {"x": x}, mode)
    _check(y, _front_end_reference(x, *ws), f"{mode} front end T={t}")


@pytest.mark.parametrize("mode", MODES)
def test_im2col_row_tiles(mode, monkeypatch):
    """A small scratch budget splits each conv into several im2col + GEMM pairs: output rows from M0 > 0."""
    import minirt.ops.conv as conv
    _device_or_skip(mode)
    monkeypatch.setattr(conv, "IM2COL_SCRATCH_BUDGET", 150 * 240 * 4)   # 150 rows of conv1, 31 of conv2
    model, ws = _front_end_model(400, seed=5)
    x = np.random.default_rng(6).standard_normal((1, 80, 400)).astype(np.float32)
    y, gemms = _run(model, {"x": x}, mode, conv_input_nlc=False)    # (it would take conv2's im2col away)
    assert len(gemms) == 3 + 7, gemms          # 400 = 150 + 150 + 100 rows, 200 = 6 x 31 + 14 rows
    _check(y, _front_end_reference(x, *ws), f"{mode} front end in row tiles")
