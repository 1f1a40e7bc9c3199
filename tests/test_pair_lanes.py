"""Paired lanes (PAIR_LANES in glsl/linear.comp and glsl/attention.glslh, minirt.kernels.gemm.paired_lanes): invocations 2i and
2i + 1 of a work group take the same columns in two row groups, so that NVIDIA's shared memory returns their 16-byte
loads in half the passes. Only the invocations' roles move, so every output must keep its bits.

On lavapipe the pairing is forced with the option; each case is run paired and unpaired, poisoned, against a float64
reference, and the two runs must agree bit for bit. The plan side: on for NVIDIA only, as the last specialization
constant, the paired attention tile and the shuffle rule that needs a row's lanes in one subgroup."""
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import minirt.kernels.attention_fp32 as attention
from minirt.options import Options
from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import prepare
from minirt.loaders import load
from minirt.kernels.gemm import paired_lanes
from minirt.planner import make_plan
from oracle import compare, make_model, rand

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_attention_split import inputs, reference  # noqa: E402
from test_fuse_attention import attention_model  # noqa: E402
import whisper_encoder as we  # noqa: E402
from onnx import helper  # noqa: E402

H200, LAVAPIPE = KNOWN_PROFILES["nvidia-h200"], KNOWN_PROFILES["lavapipe"]


def _linear_model(m, k, n, seed):
    """y = x @ W + b + r: a Linear with its residual (fused into one GEMM)."""
    w, b = rand(k, n, seed=seed), rand(n, seed=seed + 1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["xwb"]),
             helper.make_node("Add", ["xwb", "r"], ["y"])]
    return make_model(nodes, {"x": [m, k], "r": [m, n]}, ["y"], {"w": w, "b": b}), w, b


def _run_both(model, feeds, options):
    """The model's outputs with the lanes paired and unpaired (poisoned, two runs each), and the paired plan."""
    outs = []
    for pair in (True, False):
        with Session(model, storage="buffer", options={"poison": True, "pair_lanes": pair, **options}) as s:
            y = s.run(None, feeds)[0]
            assert np.array_equal(y, s.run(None, feeds)[0]), "two runs differ"
            if pair:
                plan = s.plan
        outs.append(y)
    assert np.array_equal(outs[0], outs[1]), "paired lanes changed the bits"
    return outs[0], plan


@pytest.mark.parametrize("m,k,n,options", [
    (150, 96, 72, {"gemm_tile": "t44k32"}),
    (150, 96, 72, {"gemm_tile": "t44k32", "gemm_splitk": 2}),
    (93, 64, 40, {"gemm_tile": "t44", "local_size": (8, 6, 1), "local_size_families": ("gemm",)}),
    (93, 64, 40, {"gemm_tile": "t44", "local_size": (16, 12, 1), "local_size_families": ("gemm",)}),
    (70, 32, 24, {"gemm_tile": "t44", "local_size": (4, 5, 1), "local_size_families": ("gemm",)}),   # odd y: unpaired
])
def test_linear_paired_matches_float64_and_keeps_bits(m, k, n, options):
    model, w, b = _linear_model(m, k, n, seed=m + k + n)
    x, r = rand(m, k, seed=1 + m), rand(m, n, seed=2 + n)
    y, plan = _run_both(model, {"x": x, "r": r}, options)
    ref = x.astype(np.float64) @ w + b + r
    compare(y, ref, 1e-5, f"linear {m}x{k}x{n} {options}")
    gemm = next(d for d in plan.dispatches if d.kernel.startswith("linear_t"))
    assert len(gemm.spec) == 5 and gemm.spec[4] == 1     # PAIR_LANES, constant_id 7


@pytest.mark.parametrize("B,Tq,Tk,H,dh,tile,options", [
    (1, 150, 150, 2, 64, "64x8x6x3", {}),      # the H200's tile in half the rows (lavapipe has 32 KiB)
    (1, 150, 150, 2, 64, "64x8x6x3", {"attention_stream": 5}),
    (2, 37, 45, 2, 32, "64x4x4x4", {}),          # KG 4: the paired shuffles fit lavapipe's 8-lane subgroups
    (2, 37, 45, 2, 32, "64x4x4x4", {"attention_splits": 3}),
    (1, 50, 70, 3, 16, "32x4x2x4", {}),
    (1, 50, 70, 3, 16, "96x4x3x4", {}),          # 24 row groups of 4 lanes
    (1, 40, 40, 2, 16, "48x4x2x4", {}),          # 12 row groups
    (1, 40, 40, 2, 16, "20x4x2x4", {}),          # 5 row groups: odd, so the kernel stays unpaired
])
def test_attention_paired_matches_float64_and_keeps_bits(B, Tq, Tk, H, dh, tile, options):
    m = attention_model(B, Tq, Tk, H, dh)
    fd = inputs(B, Tq, Tk, H * dh, seed=Tq + Tk + H)
    y, plan = _run_both(m, fd, {"attention_tile": tile, "coopmat": False, **options})
    compare(y, reference(fd["q"], fd["k"], fd["v"], H), 2e-5, f"attention {tile} {options}")
    att = next(d for d in plan.dispatches if d.kernel.startswith("attention_") and "combine" not in d.kernel)
    threads, kg = (int(v) for v in tile.split("x")[:2])
    assert att.spec[5:] == ((True,) if (threads // kg) % 2 == 0 else ())


def test_paired_shuffles_run_where_a_row_fits_a_subgroup():
    """KG 4: a paired row spans 8 lanes, one subgroup on lavapipe (and the H200), so the shuffle variant runs (and is
    right: above)."""
    m = attention_model(1, 40, 40, 2, 32)
    opts = {"attention_tile": "64x4x4x4", "pair_lanes": True, "attention_splits": 1, "attention_stream": False}
    with Session(m, storage="buffer", options=opts) as s:
        kernels = [d.kernel for d in s.plan.dispatches]
        lanes = s.device.profile.subgroup_size
    assert kernels == (["attention_buffer_shuffle"] if lanes % 8 == 0 and s.device.profile.subgroup_shuffle
                       else ["attention_buffer"])


def test_whisper_layer_paired_keeps_bits():
    """A Whisper layer on the H200's kernels (32-deep GEMM slices, split K, stream-split attention), paired and not."""
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=13)
    x = we.sample_input(n_frames=200, seed=np.random.SeedSequence().entropy % 2**31)
    opts = {"gemm_tile": "t44k32", "gemm_splitk": 2, "attention_stream": 7, "attention_tile": "64x8x6x3"}
    y, plan = _run_both(model, {"input_features": x}, opts)
    assert not np.isnan(y).any()
    assert {d.spec[-1] for d in plan.dispatches if d.kernel.startswith(("linear_t", "attention_split"))} == {1}


# -- the plan -------------------------------------------------------------------------------------------------

def _plan(profile, options=None, H=6):
    return make_plan(prepare(load(attention_model(1, 1500, 1500, H, 64))), profile, "buffer",
                     {"attention_stream": False, **(options or {})})


def test_on_for_nvidia_only_and_the_option_wins():
    assert paired_lanes(H200, Options()) and not paired_lanes(H200, Options.make({"pair_lanes": "0"}))
    for name, prof in KNOWN_PROFILES.items():
        assert paired_lanes(prof, Options()) == (prof.vendor == "nvidia"), name
        assert paired_lanes(prof, Options(pair_lanes=True))


def test_nvidia_plans_take_the_paired_tile_and_constant():
    d = _plan(H200, {"attention_splits": 1}).dispatches[0]
    assert d.kernel == "attention_buffer_shuffle"
    assert d.spec == (64, 8, 6, True, 3, True)          # (128, 8, 6, 3), PAIR_LANES (constant_id 8)
    assert d.global_size == (128, -(-1500 // 96), 6)
    off = _plan(H200, {"pair_lanes": False}).dispatches[0]
    assert off.spec == (64, 8, 5, True, 4) and off.kernel == "attention_buffer_shuffle"
    streamed = make_plan(prepare(load(attention_model(1, 1500, 1500, 6, 64))), H200, "buffer", {}).dispatches[0]
    assert streamed.kernel == "attention_split_buffer_shuffle" and streamed.spec == d.spec
    for name in ("lavapipe", "adreno-840"):
        assert len(_plan(KNOWN_PROFILES[name]).dispatches[0].spec) == 5, name
    assert attention.shared_bytes(64, *attention.PAIRED_TILES[0]) <= H200.max_shared_memory
    # a paired row of KG = 8 spans 16 lanes: 16-lane subgroups still shuffle, 8-lane ones reduce in shared memory
    one = {"attention_splits": 1}
    assert _plan(dataclasses.replace(H200, subgroup_size=16), one).dispatches[0].kernel == "attention_buffer_shuffle"
    assert _plan(dataclasses.replace(H200, subgroup_size=8), one).dispatches[0].kernel == "attention_buffer"


def test_nvidia_gemms_carry_the_constant_last():
    """linear.comp: PAIR_LANES is constant_id 7, after A_WIN (given as False where off); other vendors' plans are
    unchanged (no A_WIN unless on, no PAIR_LANES)."""
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=1)
    g = prepare(load(model))
    for prof, want in ((H200, True), (KNOWN_PROFILES["lavapipe"], False), (KNOWN_PROFILES["adreno-840"], False)):
        p = make_plan(g, prof, "buffer", {})
        gemms = [d for d in p.dispatches if d.kernel.startswith("linear_t")]
        assert gemms, prof.name
        for d in gemms:
            if want:
                assert len(d.spec) == 5 and d.spec[4] == 1, (prof.name, d.node, d.spec)
            else:
                assert len(d.spec) in (3, 4), (prof.name, d.node, d.spec)
