"""Attention with the keys split across work groups (glsl/attention_split.comp + attention_combine.comp):
forced splits match a float64 numpy reference in both storages (ragged key blocks, empty splits, batch 2,
cross attention), the plan has two dispatches exactly when S > 1, and the automatic rule splits only on
discrete GPUs with few work groups."""
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

import minirt.kernels.attention_split as attention_splits
import minirt.kernels.attention_fp32 as attention
from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.errors import MinirtError
from minirt.options import Options
from minirt.infer import prepare
from minirt.loaders import load
from minirt.planner import make_plan
from minirt.plan import SCRATCH
from oracle import STORAGES, check_model, compare, cosine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuse_attention import attention_model, feeds  # noqa: E402

H200, LAVAPIPE = KNOWN_PROFILES["nvidia-h200"], KNOWN_PROFILES["lavapipe"]


def reference(q, k, v, heads):
    """softmax(q_h k_h^T / sqrt(dh)) v_h per head, in float64."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, Tq, D = q.shape
    dh = D // heads
    out = np.empty((B, Tq, D))
    for b in range(B):
        for h in range(heads):
            c = slice(h * dh, (h + 1) * dh)
            s = q[b, :, c] @ k[b, :, c].T / np.sqrt(dh)
            e = np.exp(s - s.max(-1, keepdims=True))
            out[b, :, c] = (e / e.sum(-1, keepdims=True)) @ v[b, :, c]
    return out


def inputs(B, Tq, Tk, D, seed, spread=2.0):
    rng = np.random.default_rng(seed)
    return {"q": rng.uniform(-spread, spread, (B, Tq, D)).astype(np.float32),
            "k": rng.uniform(-spread, spread, (B, Tk, D)).astype(np.float32),
            "v": rng.uniform(-1, 1, (B, Tk, D)).astype(np.float32)}


def kernels(plan):
    """Kernel names without the row-max flavour (max=shuffle variants: tests/test_attention_split.py checks it)."""
    return [d.kernel.replace("_shuffle", "") for d in plan.dispatches]


def check_split(B, Tq, Tk, H, dh, S, storages=STORAGES, seed=0, spread=2.0):
    m = attention_model(B, Tq, Tk, H, dh)
    fd = inputs(B, Tq, Tk, H * dh, seed, spread)
    ref = reference(fd["q"], fd["k"], fd["v"], H)
    for st in storages:
        with Session(m, storage=st, options={"poison": True, "attention_splits": S}) as s:
            assert kernels(s.plan) == ([f"attention_{st}"] if S == 1 else
                                       [f"attention_split_{st}", f"attention_combine_{st}"])
            y = s.run(None, fd)[0]
        compare(y, ref, 1e-4, f"{st} S={S}")
        assert cosine(y, ref) >= 0.99999, st


# lavapipe's tile for dh = 64 and 32 is (128, 8, 3): 48 query rows, 32-key blocks; for dh = 16 (32, 4, 4): 16 keys.
@pytest.mark.parametrize("B,Tq,Tk,H,dh,S", [
    (1, 7, 101, 2, 64, 2),     # few query rows, 4 key blocks (the last ragged), 101 keys not a multiple of S
    (1, 130, 101, 2, 32, 3),   # 3 query blocks (the last partial), 4 key blocks over 3 splits
    (2, 21, 45, 3, 16, 5),     # batch 2, cross attention; 3 key blocks over 5 splits: 2 are empty
    (1, 50, 77, 1, 64, 5),     # 3 key blocks, 5 splits (head dim 128, the largest, compiles for a minute on a CPU
                               # driver: it runs unsplit in test_fuse_attention; the splits' logic does not depend on it)
    (1, 9, 33, 2, 64, 16),     # 2 key blocks, 16 splits: 14 empty
])
def test_forced_splits_match_numpy(B, Tq, Tk, H, dh, S):
    check_split(B, Tq, Tk, H, dh, S, seed=B * 1000 + Tq * 10 + S)


def test_one_split_is_todays_single_dispatch():
    check_split(1, 19, 70, 2, 64, 1, seed=5)


def test_peaked_scores_in_different_splits():
    """Large logits: each split's row max differs a lot from the others', so the combine's rescaling matters."""
    check_split(1, 20, 150, 2, 64, 3, seed=11, spread=6.0)


@pytest.mark.parametrize("tile", [(128, 16, 3, 4), (64, 16, 4, 4)])
def test_gpu_tiles_split(monkeypatch, tile):
    """GPU tiles (64-key blocks; the H200's own (128, 16, 5) needs more than lavapipe's 32 KiB of shared
    memory), split over ragged blocks."""
    monkeypatch.setattr(attention, "tiles", lambda dh, shared, cpu, paired=False: tile)
    check_split(1, 45, 200, 2, 64, 3, storages=["buffer"], seed=7)


# -- the plan ------------------------------------------------------------------------------------------

def plan_for(profile, B=1, Tq=1500, Tk=1500, H=6, dh=64, storage="buffer", options=None):
    """The plan with stream splits off unless asked for (tests/test_attention_stream.py tests those), and the lanes
    unpaired, so the tile rule is the one every device has (tests/test_pair_lanes.py tests NVIDIA's paired tile)."""
    return make_plan(prepare(load(attention_model(B, Tq, Tk, H, dh))), profile, storage,
                     {"attention_stream": False, "pair_lanes": False, **(options or {})})


@pytest.mark.parametrize("storage", STORAGES)
def test_split_plan_has_attention_then_combine(storage):
    p = plan_for(LAVAPIPE, 2, 21, 45, 3, 16, storage, {"attention_splits": 3})
    split, comb = p.dispatches
    assert kernels(p) == [f"attention_split_{storage}", f"attention_combine_{storage}"]
    part = p.tensors[split.args[0][0]]
    assert part.role == SCRATCH and part.storage == "buffer" and split.args[0][1] == "w"
    assert comb.args == [("y", "w"), (part.name, "r")]
    rows = 2 * 3 * 3 * 21
    assert part.shape == (rows * (16 + 2),)
    assert split.global_size[2] == 2 * 3 * 3
    assert comb.global_size == (48 // 4, 21, 2)
    # the split pass does all the attention's flops; the combine a few per output element
    assert split.flops == 4 * 2 * 3 * 21 * 45 * 16
    assert 0 < comb.flops <= 4 * 3 * 2 * 21 * 48 and comb.bytes > 0
    assert kernels(plan_for(LAVAPIPE, 2, 21, 45, 3, 16, storage, {"attention_splits": 1})) == [f"attention_{storage}"]


def test_auto_rule_splits_whisper_base_on_a_discrete_gpu():
    # On the H200 profile (132 multiprocessors, tile (128, 8, 5): 80 rows a group): Whisper-tiny's encoder attention
    # (19 x 6 = 114 groups, one wave) stays one dispatch; base's (19 x 8 = 152 groups, two waves) splits 4 ways
    assert kernels(plan_for(H200)) == ["attention_buffer"]
    assert plan_for(H200).dispatches[0].global_size[1:] == (19, 6)
    p = plan_for(H200, H=8)
    assert kernels(p) == ["attention_split_buffer", "attention_combine_buffer"]
    split = p.dispatches[0]
    S = split.global_size[2] // 8
    assert S == 4 and 1500 // S >= attention_splits.SPLIT_MIN_KEYS
    assert any("split 4 ways" in n for notes in p.notes.values() for n in notes)
    # an edited CPU profile that claims to be discrete splits too; the real CPU one never does
    assert len(plan_for(dataclasses.replace(LAVAPIPE, device_type="discrete"), H=8).dispatches) == 2
    assert kernels(plan_for(LAVAPIPE, H=8)) == ["attention_buffer"]
    assert kernels(plan_for(KNOWN_PROFILES["adreno-840"], storage="texture")) == ["attention_texture"]
    # the option wins over the rule both ways
    assert kernels(plan_for(H200, H=8, options={"attention_splits": 1})) == ["attention_buffer"]
    assert plan_for(LAVAPIPE, options={"attention_splits": "4"}).dispatches[0].global_size[2] == 6 * 4


def test_auto_rule_by_waves():
    """With a multiprocessor count: the fewest waves of work, each split costing SPLIT_COST of a group's time."""
    s = attention_splits.splits
    assert s(H200, 114, 1500) == 1          # one wave already; a split only adds its cost
    assert s(H200, 132, 1500) == 1
    assert s(H200, 133, 1500) == 4          # unsplit 2 waves; S = 2, 3, 4, 5: 1.56, 1.45, 1.43, 1.44
    assert s(H200, 152, 1500) == 4          # 2, 1.56, 1.45, 1.43, 1.44 for S = 1 .. 5
    assert s(H200, 152, 600) == 2           # at least 256 keys per split
    assert s(H200, 152, 255) == 1
    assert s(H200, 264, 100000) == 1        # two full waves
    for groups in range(1, 600):            # never more waves than unsplit
        S = s(H200, groups, 100000)
        assert -(-groups * S // 132) / S <= -(-groups // 132)


def test_auto_rule_without_a_multiprocessor_count():
    s, h = attention_splits.splits, dataclasses.replace(H200, compute_units=0)
    assert s(h, 228, 1500) == 1          # below SPLIT_FROM_GROUPS
    assert s(h, 304, 1500) == 3          # ceil(900 / 304) = 3; 500 keys each
    assert s(h, 304, 600) == 2           # at least 256 keys per split
    assert s(h, 304, 255) == 1
    assert s(h, 256, 100000) == 4
    assert s(h, 1024, 100000) == 1       # already enough groups
    assert s(LAVAPIPE, 300, 100000) == 1 and s(KNOWN_PROFILES["mali-g715"], 300, 100000) == 1
    assert s(LAVAPIPE, 8, 10, Options(attention_splits=7)) == 7


@pytest.mark.parametrize("bad", [0, -1, "x", 2.5, True])
def test_bad_split_option(bad):
    with pytest.raises(MinirtError, match="attention_splits"):
        attention_splits.splits(H200, 228, 1500, Options.make({"attention_splits": bad}))


@pytest.mark.parametrize("forced", [None, False])
def test_row_max_by_subgroup_shuffles(forced):
    """Buffers on devices with subgroup shuffles and subgroups holding whole column-group clusters take the
    max=shuffle variants; textures, attention_shuffle=False and small subgroups keep the shared-memory reduction.
    Both match numpy (the tests above run whichever this device picks; this one runs both)."""
    opts = {} if forced is None else {"attention_shuffle": forced}
    p = plan_for(H200, options=opts)
    assert [d.kernel for d in p.dispatches] == (["attention_buffer_shuffle"] if forced is None else ["attention_buffer"])
    assert [d.kernel for d in plan_for(H200, storage="texture").dispatches] == ["attention_texture"]
    small = dataclasses.replace(H200, subgroup_size=4)      # KG = 8 lanes share a row
    assert [d.kernel for d in plan_for(small).dispatches] == ["attention_buffer"]
    assert [d.kernel for d in plan_for(dataclasses.replace(H200, subgroup_shuffle=False)).dispatches] == \
        ["attention_buffer"]
    m = attention_model(2, 37, 45, 2, 32)
    x = feeds(2, 37, 45, 64)
    check_model(m, x, storages=("buffer",), options=opts)
    check_model(m, x, storages=("buffer",), options={**opts, "attention_splits": 3})


# -- register prefetch and forced tiles -----------------------------------------------------------------

def check_opts(B, Tq, Tk, H, dh, options, storages=STORAGES, seed=0, precision="fp32"):
    m = attention_model(B, Tq, Tk, H, dh)
    fd = inputs(B, Tq, Tk, H * dh, seed)
    if precision == "fp16":   # the kernel sees fp16 q, k, v; its output is rounded to fp16 too
        fd = {k: v.astype(np.float16).astype(np.float32) for k, v in fd.items()}
    ref = reference(fd["q"], fd["k"], fd["v"], H)
    for st in storages:
        with Session(m, storage=st, precision=precision, options={"poison": True, **options}) as s:
            y = s.run(None, fd)[0]
        compare(y, ref, 1e-4 if precision == "fp32" else 2e-3, f"{st} {precision} {options}")


@pytest.mark.parametrize("B,Tq,Tk,H,dh,S", [(1, 200, 300, 2, 64, 1), (1, 45, 200, 2, 64, 3)])
def test_default_tiles_at_fp16_match_numpy(B, Tq, Tk, H, dh, S):
    """The device's own scalar tile, prefetch and shuffles with fp16 storage (coopmat=False keeps tensor-core
    devices on this kernel): on an H200 (128, 8, 5) with the register prefetch, on lavapipe its CPU tile."""
    check_opts(B, Tq, Tk, H, dh, {"coopmat": False, "attention_splits": S}, storages=["buffer"], seed=S,
               precision="fp16")


@pytest.mark.parametrize("B,Tq,Tk,H,dh,S,tile", [
    (1, 50, 101, 2, 64, 1, None),            # lavapipe's own tile; 4 key blocks, the last ragged
    (2, 21, 45, 3, 16, 3, None),             # batch 2, cross attention, splits (one empty) with the prefetch
    (1, 45, 200, 2, 64, 1, "128x16x3"),      # a GPU tile: 64-key blocks, 8 vec4 per invocation in flight
    (1, 45, 200, 2, 64, 3, "64x16x4"),       # 16 vec4 per invocation, split over ragged blocks
    (1, 33, 70, 2, 32, 1, "32x4x2"),         # NL = 2 (each invocation stages two vec4 of a 16 x 8 block)
    (1, 80, 150, 2, 32, 1, "96x8x3"),        # not a power of two: 36 rows a group (the local size is exact)
    (1, 40, 90, 2, 32, 2, "24x8x2"),         # 6 rows a group, a partial subgroup on 8-lane devices too
])
def test_register_prefetch_matches_numpy(B, Tq, Tk, H, dh, S, tile):
    """attention_prefetch (PREFETCH in attention.glslh): K and V staged through registers one phase ahead. The
    forced GPU tiles run in buffer storage only: the devices whose table picks them (discrete GPUs) run buffers, and
    texture storage (the mobile default) runs its own tile, checked in both storages here and above."""
    opts = {"attention_prefetch": True, "attention_splits": S}
    if tile:
        opts["attention_tile"] = tile
    check_opts(B, Tq, Tk, H, dh, opts, seed=Tq + Tk + S, storages=STORAGES if tile is None else ["buffer"])


def test_prefetch_is_a_specialization_constant():
    """On by default on GPUs, off on CPU drivers; the option wins both ways; the kernel variant is the same."""
    on, off = plan_for(H200).dispatches[0], plan_for(H200, options={"attention_prefetch": False}).dispatches[0]
    assert on.kernel == off.kernel and on.spec[:3] == off.spec[:3] and (on.spec[3], off.spec[3]) == (1, 0)
    assert plan_for(LAVAPIPE).dispatches[0].spec[3] == 0
    assert plan_for(LAVAPIPE, options={"attention_prefetch": True}).dispatches[0].spec[3] == 1
    # dh = 128 takes (64, 16, 4) on the H200: 32 vec4 of K or V per invocation would be carried, more than MAX_PREFETCH
    big = plan_for(H200, H=3, dh=128).dispatches[0]
    assert big.spec[1:3] == (16, 4) and big.spec[3] == 0
    assert plan_for(H200, H=3, dh=128, options={"attention_prefetch": True}).dispatches[0].spec[3] == 1


def test_forced_tile_is_used_and_checked():
    d = plan_for(H200, options={"attention_tile": "64x8x4", "attention_splits": 1}).dispatches[0]
    assert d.spec[1:3] == (8, 4) and d.global_size == (64, -(-1500 // 32), 6)
    check_opts(1, 37, 60, 2, 64, {"attention_tile": (64, 8, 2)}, seed=3)
    for bad, why in (("64x16", "THREADSxKGxRT"), ("64x8x4x2x1", "THREADSxKGxRTxNK"), ("64x8x4x0", "positive"),
                     ("64x5x4", "does not divide"), ("24x16x4", "not a multiple"), ("64x2x4x3", "keys per block"),
                     ("2048x16x1", "exceed"), ("1024x16x8", "shared memory"), ("128x8x5x8", "shared memory")):
        with pytest.raises(MinirtError, match=why):
            plan_for(H200, options={"attention_tile": bad})


def test_default_plans_keep_four_keys_per_thread():
    """NK (constant_id 7, the 5th specialization value) is 4 in every default tile of unpaired lanes."""
    assert plan_for(H200).dispatches[0].spec == (64, 8, 5, True, 4)
    assert plan_for(LAVAPIPE).dispatches[0].spec == (64, 8, 3, False, 4)
    assert plan_for(KNOWN_PROFILES["adreno-840"], storage="texture").dispatches[0].spec == (64, 16, 3, True, 4)
    assert all(t[3] == 4 for t in attention.TILES + attention.CPU_TILES)


# -- keys per thread (NK: blocks of BK = NK KG keys) --------------------------------------------------------

def test_forced_tile_takes_keys_per_thread():
    f = attention.forced_tile
    assert f("64x8x4", 64, H200) == f((64, 8, 4), 64, H200) == f("64x8x4x4", 64, H200) == (64, 8, 4, 4)
    assert f("64x8x4x2", 64, H200) == f((64, 8, 4, 2), 64, H200) == (64, 8, 4, 2)
    assert f("64x4x4x3", 64, H200) == (64, 4, 4, 3) and f("64x4x4x1", 64, H200) == (64, 4, 4, 1)
    for bad, why in (("64x2x4x3", "NK 3 x KG 2 = 6 keys per block, not a multiple of 4"),
                     ("64x2x4x1", "NK 1 x KG 2 = 2 keys per block, not a multiple of 4"),
                     ("64x8x4x2x1", "THREADSxKGxRT or THREADSxKGxRTxNK"), ((64, 8, 4, 0), "positive integers")):
        with pytest.raises(MinirtError, match=why):
            f(bad, 64, H200)


# Configurations for the GPU measurement (Whisper-tiny, dh = 64) and their shared memory, from the kernel's arrays:
# Q BQ x 17 vec4 + K/V BK x 17 vec4 + P BQ x (BK + 4) floats + row partials BQ x KG floats.
MEASURE_TILES = {"256x16x5x2": 47104, "128x8x5x2": 35072, "256x16x4x2": 39424, "128x16x5x2": 27904,
                 "128x8x5x4": 44544}


@pytest.mark.parametrize("tile,nbytes", MEASURE_TILES.items())
def test_tiles_to_measure_plan(tile, nbytes):
    """Each plans on the H200 profile (and on lavapipe's given 48 KiB) with NK as the 5th specialization value;
    lavapipe's real 32 KiB refuses those above it."""
    threads, kg, rt, nk = (int(v) for v in tile.split("x"))
    assert attention.shared_bytes(64, threads, kg, rt, nk) == nbytes <= H200.max_shared_memory
    bq = rt * threads // kg
    for prof, prefetch in ((H200, True), (dataclasses.replace(LAVAPIPE, max_shared_memory=49152), False)):
        d = plan_for(prof, options={"attention_tile": tile, "attention_splits": 1}).dispatches
        assert len(d) == 1 and d[0].spec == (64, kg, rt, prefetch, nk)
        assert d[0].global_size == (threads, -(-1500 // bq), 6)
    if nbytes > LAVAPIPE.max_shared_memory:
        with pytest.raises(MinirtError, match="shared memory"):
            plan_for(LAVAPIPE, options={"attention_tile": tile})
    else:
        assert plan_for(LAVAPIPE, options={"attention_tile": tile}).dispatches[0].spec[4] == nk


def test_shared_bytes_follow_keys_per_thread():
    assert attention.shared_bytes(64, 128, 8, 5) == attention.shared_bytes(64, 128, 8, 5, 4) == 44544
    assert attention.shared_bytes(64, 128, 8, 5, 1) == 80 * 17 * 16 + 8 * 17 * 16 + 80 * 12 * 4 + 80 * 8 * 4   # BK 8
    assert attention.shared_bytes(32, 64, 4, 4, 3) == 64 * 9 * 16 + 12 * 9 * 16 + 64 * 16 * 4 + 64 * 4 * 4   # BK 12


# (B, Tq, Tk, H, dh, S, tile, prefetch): Tk is never a multiple of BK (the last block is ragged) nor Tq of BQ
@pytest.mark.parametrize("B,Tq,Tk,H,dh,S,tile,prefetch", [
    (1, 37, 37, 2, 64, 1, "64x4x2x1", False),     # BK = 4: one key per thread, 10 blocks
    (1, 37, 37, 2, 64, 4, "64x4x2x1", True),      # the same over 4 splits
    (1, 50, 101, 2, 64, 1, "64x8x2x2", True),     # BK = 16
    (2, 21, 45, 3, 16, 3, "32x2x4x2", False),     # BK = 4 at dh = 16, batch 2, cross attention, 3 splits
    (1, 50, 101, 2, 64, 1, "64x4x4x3", False),    # BK = 12: P rows of 16 floats
    (1, 50, 101, 2, 64, 2, "32x16x2x3", True),    # BK = 48, KG 16: row max through shared memory on 8-lane subgroups
    (1, 50, 301, 2, 64, 1, "32x8x2x8", False),    # BK = 64
    (1, 50, 301, 2, 32, 3, "64x8x4x8", True),     # BK = 64 at dh = 32, 3 splits
])
def test_keys_per_thread_match_numpy(B, Tq, Tk, H, dh, S, tile, prefetch):
    opts = {"attention_tile": tile, "attention_splits": S, "attention_prefetch": prefetch}
    threads, kg, rt, nk = (int(v) for v in tile.split("x"))
    assert Tk % (nk * kg) and Tq % (rt * threads // kg)
    d = plan_for(LAVAPIPE, B, Tq, Tk, H, dh, options=opts).dispatches[0]
    assert d.spec == (dh, kg, rt, prefetch, nk)
    assert d.global_size == (threads, -(-Tq // (rt * threads // kg)), B * H * S)
    # buffers only but for the first case: forced tiles are GPU tiles, and GPUs that pick them run buffers (above)
    first = (B, Tq, Tk, H, dh, S, tile) == (1, 37, 37, 2, 64, 1, "64x4x2x1")
    check_opts(B, Tq, Tk, H, dh, opts, seed=Tk + nk * 10 + S, storages=STORAGES if first else ["buffer"])


def test_keys_per_thread_at_fp16():
    check_opts(1, 50, 101, 2, 64, {"attention_tile": "64x8x2x2", "attention_splits": 2, "coopmat": False},
               storages=["buffer"], seed=9, precision="fp16")


@pytest.mark.parametrize("tile,S", [("128x16x5x2", 1), ("64x8x5x2", 3), ("128x16x4x2", 1)])
def test_whisper_tiny_shape_with_two_keys_per_thread(tile, S):
    """Whisper-tiny's self-attention (1500 keys: 32- and 16-key blocks, the last ragged) with MEASURE_TILES' NK = 2
    tiles that fit lavapipe: 128x16x5x2 itself, 64x8x5x2 and 128x16x4x2 (half the rows of 128x8x5x2 and
    256x16x4x2, the same per-thread work)."""
    check_opts(1, 1500, 1500, 6, 64, {"attention_tile": tile, "attention_splits": S}, storages=["buffer"], seed=S)
