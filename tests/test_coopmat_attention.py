"""Attention on cooperative matrices (glsl/attention_cm.comp, minirt/kernels/attention_cm.py), precision fp16.

- plan level, on the fake profiles: which plans take the path and with which tile;
- emulated (coopmat="emulate": the kernel's impl=emu variant, the matrix operations done by plain code), on any
  device with 16-bit storage, lavapipe included: the kernel's staging, masking, softmax, rescaling, split merging
  and stores against a float64 reference;
- the real kernel, only where the device has cooperative matrices (skipped elsewhere): the same checks, the
  Whisper shapes, and GPU timings (printed; run with -s to see them).

H200 runner: PYTHONPATH=. python -m pytest -q -s tests/test_coopmat_attention.py"""
import dataclasses
import math
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
from minirt.kernels import attention_cm
from minirt.planner import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuse_attention import attention_model  # noqa: E402

H200 = KNOWN_PROFILES["nvidia-h200"]
# attention_cm.comp itself: where the device's element layout allows, attention_cmr.comp runs instead
# (tests/test_attention_cmr.py), so these tests turn it off
FP16 = {"precision": "fp16", "attention_cm_reg": False}
# (B, Tq, Tk, H, dh): Whisper-tiny's encoder self-attention first, then odd sizes (Tq != Tk, B > 1, partial
# row and key blocks, one head, 8 heads)
SHAPES = [(1, 1500, 1500, 6, 64), (2, 37, 53, 2, 16), (1, 100, 17, 3, 32), (1, 5, 5, 1, 64), (1, 130, 130, 8, 64)]


def graph(B, Tq, Tk, H, dh):
    return prepare(load(attention_model(B, Tq, Tk, H, dh)))


def attention_dispatch(plan):
    """The attention kernel's dispatch (not the combine pass after a key split)."""
    (d,) = [d for d in plan.dispatches if d.op == "Attention" and "combine" not in d.kernel]
    return d


def plan_kernel(shape, profile=H200, storage="buffer", **options):
    return attention_dispatch(make_plan(graph(*shape), profile, storage, {**FP16, **options})).kernel


# -- plan level --------------------------------------------------------------------------------------------------

def test_h200_fp16_lowers_to_the_coopmat_kernel():
    """Whisper-tiny's self-attention on the H200 profile: SPLIT_TILE (14 KiB: 3 groups per multiprocessor, 396 places)
    with the keys split twice, 24 x 6 x 2 = 288 groups in one wave, then the combine pass."""
    g = graph(1, 1500, 1500, 6, 64)
    plan = make_plan(g, H200, "buffer", FP16)
    nr, ks, bk = attention_cm.SPLIT_TILE
    assert attention_cm.shared_bytes(64, nr, ks, bk) <= H200.max_shared_memory // 3
    d = attention_dispatch(plan)
    assert d.kernel == "attention_cm_khr_half" and d.spec == (64, nr, ks, bk, True)
    assert d.global_size == (32 * nr * ks, math.ceil(1500 / (16 * nr)), 6 * 2) and d.local_size == (32 * nr * ks, 1, 1)
    assert d.flops == 4 * 6 * 1500 * 1500 * 64
    assert tuple(np.frombuffer(d.push[32:40], np.int32)) == (2, 6 * 2 * 1500 * 64 // 2)   # S, first (m, l) pair
    part = plan.tensors[d.args[0][0]]
    assert part.dtype == "float32" and part.numel == 6 * 2 * 1500 * (64 + 2)
    assert [x.kernel for x in plan.dispatches] == \
        ["cast_buffer_down"] * 3 + ["attention_cm_khr_half", "attention_combine_buffer_half", "cast_buffer_up"]
    comb = plan.dispatches[4]
    assert comb.args == [(plan.dispatches[5].args[1][0], "w"), (part.name, "r")]


def test_unsplit_where_the_multiprocessor_count_is_unknown():
    """Without a multiprocessor count no key split, and TILES' first tile: one dispatch writing out."""
    g = graph(1, 1500, 1500, 6, 64)
    plan = make_plan(g, dataclasses.replace(H200, compute_units=0), "buffer", FP16)
    nr, ks, bk = attention_cm.TILES[0]
    d = attention_dispatch(plan)
    assert d.spec == (64, nr, ks, bk, False) and d.global_size == (32 * nr * ks, math.ceil(1500 / (16 * nr)), 6)
    assert d.bytes == 2 * 4 * 1500 * 384      # fp16: q in, out, k, v once each
    assert [x.kernel for x in plan.dispatches] == ["cast_buffer_down"] * 3 + ["attention_cm_khr_half", "cast_buffer_up"]


@pytest.mark.parametrize("heads, groups, S", [(6, 144, 2), (8, 192, 2), (12, 288, 1), (2, 48, 5), (1, 24, 5)])
def test_split_count_fills_one_wave(heads, groups, S):
    """S: the most splits whose groups still fit one wave (132 x 3 = 396 places for the 14 KiB tile), at least 256
    keys each (1500 keys: at most 5); where no split fits, TILES' own first tile runs unsplit."""
    d = attention_dispatch(make_plan(graph(1, 1500, 1500, heads, 64), H200, "buffer", FP16))
    assert math.ceil(1500 / 64) * heads == groups
    if S == 1:
        assert d.spec == (64, *attention_cm.TILES[0], False)
    else:
        assert d.spec == (64, *attention_cm.SPLIT_TILE, True) and d.global_size[2] == heads * S
        assert groups * S <= 396 and (groups * (S + 1) > 396 or S == 1500 // 256)


def test_forced_splits():
    d = attention_dispatch(make_plan(graph(1, 100, 600, 2, 64), H200, "buffer", {**FP16, "attention_splits": 3,
                                                                                  "coopmat_tile": (2, 1, 32)}))
    assert d.spec == (64, 2, 1, 32, True) and d.global_size == (64, 4, 6)


@pytest.mark.parametrize("shape", [(1, 1500, 1500, 8, 64)] + SHAPES[1:])
def test_every_test_shape_plans_on_h200(shape):
    d = attention_dispatch(make_plan(graph(*shape), H200, "buffer", FP16))
    assert d.kernel == "attention_cm_khr_half" and d.spec[0] == shape[4]


@pytest.mark.parametrize("why, kwargs", [
    ("coopmat=False", dict(coopmat=False)),
    ("fp32", dict(precision="fp32")),
    ("lavapipe has no cooperative matrices", dict(profile=KNOWN_PROFILES["lavapipe"])),
    ("textures", dict(storage="texture")),
    ("no 16x16x16 f16/f32 shape", dict(profile=dataclasses.replace(H200, coopmat_shapes=(
        (16, 8, 16, "f16", "f16", "f32", "f32"),)))),
    ("subgroups of 64", dict(profile=dataclasses.replace(H200, subgroup_size=64))),
    ("cooperative_matrix off", dict(profile=dataclasses.replace(H200, cooperative_matrix=False))),
])
def test_other_plans_keep_the_fp32_arithmetic_kernel(why, kwargs):
    profile, storage = kwargs.pop("profile", H200), kwargs.pop("storage", "buffer")
    assert not plan_kernel((1, 64, 64, 2, 64), profile, storage, **kwargs).startswith("attention_cm"), why


@pytest.mark.parametrize("H, dh", [(2, 8), (1, 40), (1, 100)])
def test_head_dims_off_the_16_grid_keep_the_fp32_arithmetic_kernel(H, dh):
    assert not plan_kernel((1, 20, 20, H, dh)).startswith("attention_cm")


@pytest.mark.parametrize("dh", range(16, 129, 16))
def test_every_head_dim_has_a_tile_within_the_h200_limits(dh):
    d = attention_dispatch(make_plan(graph(1, 50, 50, 1, dh), H200, "buffer", FP16))
    assert d.kernel == "attention_cm_khr_half"
    assert attention_cm.shared_bytes(dh, *d.spec[1:4]) <= H200.max_shared_memory
    assert attention_cm.tile_problem(dh, d.spec[1:4], H200.max_shared_memory) is None


def test_forced_tile_and_refused_tiles():
    d = attention_dispatch(make_plan(graph(1, 100, 100, 2, 64), H200, "buffer", {**FP16, "coopmat_tile": (4, 1, 64)}))
    assert d.spec == (64, 4, 1, 64, False) and d.global_size == (128, 2, 2)
    for bad in [(3, 1, 32), (2, 2, 24), (1, 1, 48), (4, 2, 64)]:
        with pytest.raises(UnsupportedError, match="coopmat_tile"):
            make_plan(graph(1, 100, 100, 2, 64), H200, "buffer", {**FP16, "coopmat_tile": bad})


def test_emulation_is_planned_anywhere_with_16_bit_storage():
    assert plan_kernel((1, 64, 64, 2, 64), KNOWN_PROFILES["lavapipe"], coopmat="emulate") == "attention_cm_emu_half"


# -- numerics -----------------------------------------------------------------------------------------------------

def f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


def reference(q, k, v, H, scale):
    """float64 attention of the float16-rounded inputs."""
    q, k, v = f16(q), f16(k), f16(v)
    B, Tq, D = q.shape

    def split(x):
        return x.reshape(B, x.shape[1], H, D // H).transpose(0, 2, 1, 3)

    s = split(q) @ split(k).transpose(0, 1, 3, 2) * scale
    e = np.exp(s - s.max(-1, keepdims=True))
    return ((e / e.sum(-1, keepdims=True)) @ split(v)).transpose(0, 2, 1, 3).reshape(B, Tq, D)


def inputs(B, Tq, Tk, D, seed, kind):
    """q, k, v: uniform in [-1, 1); "big": q x 8 (sharper softmax, large logits); "huge": q x 64 (logits in the
    hundreds: fp16 would overflow without fp32 statistics); "ramp": logits growing along the keys, so the running
    max keeps moving and the lazy rescaling of O runs many times."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.uniform(-1, 1, (B, T, D)).astype(np.float32) for T in (Tq, Tk, Tk))
    if kind == "big":
        q *= 8
    elif kind == "huge":
        q *= 64
    elif kind == "ramp":
        q = np.abs(q) + 0.1
        k = k + np.linspace(0, 6, Tk, dtype=np.float32)[None, :, None]
    return q, k, v


def seed(*key):
    return zlib.crc32(repr(key).encode())


def check(shape, kind, sd, options):
    B, Tq, Tk, H, dh = shape
    q, k, v = inputs(B, Tq, Tk, H * dh, sd, kind)
    with Session(attention_model(B, Tq, Tk, H, dh), storage="buffer", precision="fp16",
                 options={"poison": True, "attention_cm_reg": False, **options}) as s:
        kernel = attention_dispatch(s.plan).kernel
        y = s.run(None, {"q": q, "k": k, "v": v})[0]
    ref = reference(q, k, v, H, dh ** -0.5)
    assert not np.isnan(y).any(), f"{shape} {kind}: NaN"
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert rel <= 2e-3, f"{shape} {kind}: relative L2 error {rel:.3g}"
    assert np.abs(y - ref).max() <= 1e-2 * np.abs(ref).max(), f"{shape} {kind}"
    return kernel


def device_profile():
    from minirt.session import get_device
    return get_device().profile


# Emulated on any device: smaller shapes (lavapipe runs the emulated tiles slowly), every tile shape class.
# Head dims 64 (Whisper's) and 16 with their default tiles, 48 (not a power of two) with one other; every other
# tile at head dim 16: the emulated kernel compiles for minutes on a CPU driver at head dims 32 and 64, and a tile's
# logic (teams, in-group key splits, block depth) does not depend on the head dim.
# The two head-dim-64 shapes are one case: run in turn they share one compile, run by two test workers at once each
# compiles it (minutes).
EMU_CASES = [((2, 37, 53, 2, 16), None), ((1, 100, 17, 3, 16), None), (((1, 5, 5, 1, 64), (1, 130, 130, 2, 64)), None),
             ((2, 37, 53, 2, 16), (1, 2, 32)), ((1, 100, 17, 3, 16), (1, 2, 16)),
             ((1, 130, 130, 2, 16), (2, 1, 32)), ((1, 70, 300, 1, 48), (2, 2, 16)), ((1, 33, 200, 2, 16), (1, 1, 16)),
             ((1, 70, 90, 1, 16), (4, 1, 32)), ((1, 70, 300, 2, 16), (1, 4, 16)),
             ((1, 40, 37, 1, 16), (1, 4, 16)), ((1, 5, 5, 1, 16), (1, 2, 32))]   # the last two: splits with no keys


# every case with rising scores (the rescale path, the hardest); every input kind on the first case only: the
# emulated kernel is slow on a CPU driver. The head-dim-64 case runs with lavapipe's LLVM optimizations off
# (tests/unoptimized_child.py): its compile takes a third to a half of the CPU time; in the other cases an
# unoptimized kernel loses in its run what its compile saves, or more (docs/benchmarks.md, "The test suite").
EMU_RUNS = ([pytest.param(shape, tile, "ramp", marks=[pytest.mark.unoptimized] if isinstance(shape[0], tuple) else [])
             for shape, tile in EMU_CASES]
            + [(EMU_CASES[0][0], EMU_CASES[0][1], kind) for kind in ("plain", "big", "huge")])


@pytest.mark.slow
@pytest.mark.parametrize("shape, tile, kind", EMU_RUNS)
def test_emulated_kernel_matches_float64(shape, tile, kind):
    if not device_profile().storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    options = {"coopmat": "emulate", **({"coopmat_tile": tile} if tile else {})}
    for one in shape if isinstance(shape[0], tuple) else (shape,):
        assert check(one, kind, seed(one, kind), options) == "attention_cm_emu_half"


# Keys split across work groups (SPLIT + attention_combine): block-aligned ranges, a ragged last block, splits with
# no keys at all (5 keys in 3 splits of 16-key blocks), in-group splits inside, and P beside S (BK 16, dh 64).
EMU_SPLITS = [((1, 100, 230, 2, 64), (4, 1, 16), 2, "ramp"), ((2, 37, 300, 1, 16), (2, 1, 32), 3, "ramp"),
              ((1, 5, 5, 1, 16), (1, 1, 16), 3, "plain"), ((1, 70, 300, 2, 16), (1, 2, 16), 2, "huge"),
              ((1, 64, 200, 1, 16), (2, 1, 16), 4, "big")]


@pytest.mark.slow
@pytest.mark.parametrize("shape, tile, S, kind", EMU_SPLITS)
def test_emulated_split_kernel_matches_float64(shape, tile, S, kind):
    if not device_profile().storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    options = {"coopmat": "emulate", "coopmat_tile": tile, "attention_splits": S}
    assert check(shape, kind, seed(shape, kind, S), options) == "attention_cm_emu_half"


def needs_coopmat():
    p = device_profile()
    if not (p.cooperative_matrix and attention_cm.SHAPE in p.coopmat_shapes and p.subgroup_size == 32):
        pytest.skip(f"'{p.name}' has no 16x16x16 f16 -> f32 cooperative matrices on subgroups of 32")


@pytest.mark.parametrize("kind", ["plain", "big", "huge", "ramp"])
@pytest.mark.parametrize("shape", SHAPES)
def test_coopmat_kernel_matches_float64(shape, kind):
    needs_coopmat()
    assert check(shape, kind, seed(shape, kind), {}) == "attention_cm_khr_half"


@pytest.mark.parametrize("S", [1, 2, 3, 5])
@pytest.mark.parametrize("tile", [attention_cm.SPLIT_TILE, attention_cm.TILES[0], (2, 2, 16)])
def test_coopmat_split_kernel_matches_float64(tile, S):
    needs_coopmat()
    for kind in ("plain", "ramp"):
        check((1, 1500, 1500, 6, 64), kind, seed(tile, S, kind), {"coopmat_tile": tile, "attention_splits": S})


@pytest.mark.parametrize("tile", attention_cm.TILES)
@pytest.mark.parametrize("shape", [(1, 1500, 1500, 6, 64), (2, 37, 53, 2, 16), (1, 130, 130, 2, 128)])
def test_coopmat_kernel_every_tile(shape, tile):
    needs_coopmat()
    if attention_cm.tile_problem(shape[4], tile, device_profile().max_shared_memory):
        pytest.skip(f"tile {tile} does not fit head dim {shape[4]}")
    for kind in ("plain", "ramp"):
        check(shape, kind, 7, {"coopmat_tile": tile})
