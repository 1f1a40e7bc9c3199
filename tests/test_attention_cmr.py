"""Attention with the softmax in registers (glsl/attention_cmr.comp, minirt/kernels/attention_cmr.py), precision fp16.

- plan level, on the fake profiles: the kernel runs only where the device's cooperative-matrix element layout is the
  probed "mma" one (or emulated), with its tile and key splits;
- emulated (coopmat="emulate": impl=emu, the matrix operations and quad shuffles as plain code in the same layout),
  on any device with 16-bit storage, lavapipe included, against a float64 reference;
- the real kernel where the device has the layout (an H200), skipped elsewhere.

Test helpers (reference, inputs, check) are test_coopmat_attention's."""
import dataclasses

import numpy as np
import pytest

from minirt.options import Options
from minirt.device_profile import COOPMAT_LAYOUTS, KNOWN_PROFILES
from minirt.errors import UnsupportedError
from minirt.planner import make_plan
from minirt.kernels import attention_cmr
from test_coopmat_attention import H200, attention_dispatch, check, device_profile, graph, seed

FP16 = {"precision": "fp16"}


def plan_kernel(shape, profile=H200, **options):
    return attention_dispatch(make_plan(graph(*shape), profile, "buffer", {**FP16, **options})).kernel

# -- the probe's layout --------------------------------------------------------------------------------------------

def test_mma_layout_covers_every_element_once():
    """cm_layout.glslh's formula (and COOPMAT_LAYOUTS["mma"]): 32 lanes x 8 elements hit each of the 256 cells once,
    each lane's elements lie in 2 rows held by the 4 lanes of its quad, and pairs (2h, 2h + 1) are adjacent columns."""
    f = COOPMAT_LAYOUTS["mma"]
    cells = [f(lane, e) for lane in range(32) for e in range(8)]
    assert sorted(cells) == [(r, c) for r in range(16) for c in range(16)]
    for lane in range(32):
        assert {f(lane, e)[0] for e in range(8)} == {lane // 4, lane // 4 + 8}
        for e in range(0, 8, 2):
            r, c = f(lane, e)
            assert f(lane, e + 1) == (r, c + 1)
        for e in range(8):   # the quad holds the whole row
            row = f(lane, e)[0]
            assert sorted(f(q, x)[1] for q in range(lane & ~3, (lane & ~3) + 4) for x in range(8)
                          if f(q, x)[0] == row) == list(range(16))


def test_probe_decoding():
    """coopmat_probe.classify names the layout from the probe's words (A and accumulator as the formula, B its
    transpose), and refuses anything else."""
    from minirt.vk import coopmat_probe as cp
    f = COOPMAT_LAYOUTS["mma"]
    words = np.full(3 * 32 * cp.SLOTS + 4, 0xFFFFFFFF, np.uint32)
    for m in range(3):
        for lane in range(32):
            for e in range(8):
                r, c = f(lane, e) if m != 1 else f(lane, e)[::-1]    # B: the transpose (H200 probe)
                words[(m * 32 + lane) * cp.SLOTS + e] = r * 16 + c
    words[3 * 32 * cp.SLOTS:3 * 32 * cp.SLOTS + 3] = 8
    assert cp.classify(cp.decode(words.view(np.float32))) == "mma"
    swapped = words.copy()
    swapped[[0, 1]] = swapped[[1, 0]]          # lane 0 of A: two elements exchanged
    assert cp.classify(cp.decode(swapped)) == ""
    b_as_a = words.copy()                      # B laid out as A: linear_cmreg would read it wrong
    for lane in range(32):
        for e in range(8):
            r, c = f(lane, e)
            b_as_a[(32 + lane) * cp.SLOTS + e] = r * 16 + c
    assert cp.classify(cp.decode(b_as_a)) == ""
    short = words.copy()
    short[3 * 32 * cp.SLOTS] = 0               # a length the probe cannot have read
    assert cp.classify(cp.decode(short)) == ""


# -- plan level ----------------------------------------------------------------------------------------------------

def test_h200_takes_the_register_kernel_with_splits():
    """Whisper-tiny's self-attention on the H200 profile: (4, 32) tiles, 24 x 6 groups split 3 ways (432 groups in the
    528 places of one wave: 4 groups a multiprocessor, by registers), the fastest split measured; base's 8 heads 2."""
    plan = make_plan(graph(1, 1500, 1500, 6, 64), H200, "buffer", FP16)
    d = attention_dispatch(plan)
    assert d.kernel == "attention_cmr_khr_half"
    dh, nr, bk, split, vec8 = d.spec
    assert (dh, nr, bk) == (64, 4, 32) and split and vec8
    assert d.global_size == (128, 24, 6 * 3)
    base = attention_dispatch(make_plan(graph(1, 1500, 1500, 8, 64), H200, "buffer", FP16))
    assert base.global_size == (128, 24, 8 * 2)
    assert [x.kernel for x in plan.dispatches if x.op == "Attention"][-1].startswith("attention_combine")


def test_layout_gates_the_kernel():
    """No probed layout (or another one), the off switch, fp32, textures: the shared-memory kernel or the fp32 one."""
    shape = (1, 130, 130, 2, 64)
    assert plan_kernel(shape) == "attention_cmr_khr_half"
    assert plan_kernel(shape, dataclasses.replace(H200, coopmat_layout="")) == "attention_cm_khr_half"
    assert plan_kernel(shape, dataclasses.replace(H200, coopmat_layout="other")) == "attention_cm_khr_half"
    assert plan_kernel(shape, attention_cm_reg=False) == "attention_cm_khr_half"
    assert plan_kernel(shape, coopmat=False).startswith("attention_")
    assert "cm" not in plan_kernel(shape, coopmat=False)
    assert plan_kernel(shape, KNOWN_PROFILES["lavapipe"], coopmat="emulate") == "attention_cmr_emu_half"


def test_forced_tile_and_refusals():
    d = attention_dispatch(make_plan(graph(1, 130, 130, 2, 64), H200, "buffer", {**FP16, "cmr_tile": "2x16"}))
    assert d.spec[:3] == (64, 2, 16) and d.global_size[0] == 64
    for bad in ("3x32", "4x24", "4x128"):
        with pytest.raises(UnsupportedError, match="cmr_tile"):
            make_plan(graph(1, 130, 130, 2, 64), H200, "buffer", {**FP16, "cmr_tile": bad})


@pytest.mark.parametrize("dh", range(16, 129, 16))
def test_every_head_dim_has_a_tile(dh):
    assert attention_cmr.pick_tile(type("C", (), {"options": Options(), "profile": H200})(), dh) is not None


# -- numerics ------------------------------------------------------------------------------------------------------

# (shape, (NR, BK), S, kind): partial query and key blocks, B > 1, one head, dh 16 .. 64, rising scores (the running
# max moves every block), logits large enough to overflow fp16, splits with no keys (5 keys in 3 splits). The split
# cases at head dim 16 (a tile's split logic does not depend on the head dim; each head dim 64 tile costs lavapipe
# half a minute to compile emulated); head dim 128 (minutes) runs in the hardware tests below.
EMU_CASES = [((2, 37, 53, 2, 16), (1, 16), 1, "ramp"), ((1, 100, 230, 2, 64), (4, 32), 1, "ramp"),
             ((1, 100, 17, 3, 32), (2, 32), 1, "huge"), ((1, 70, 300, 1, 48), (2, 16), 2, "ramp"),
             ((1, 5, 5, 1, 16), (1, 16), 3, "plain"), ((1, 64, 200, 1, 16), (2, 16), 4, "big"),
             ((2, 37, 300, 1, 32), (4, 16), 3, "ramp")]


@pytest.mark.slow
@pytest.mark.parametrize("shape, tile, S, kind", EMU_CASES)
def test_emulated_kernel_matches_float64(shape, tile, S, kind):
    if not device_profile().storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    options = {"coopmat": "emulate", "cmr_tile": tile, "attention_splits": S}
    assert check(shape, kind, seed(shape, kind, S), {"attention_cm_reg": True, **options}) == "attention_cmr_emu_half"


def test_vec8_fetch_plan():
    """VEC8 (16-byte loads of K and V) where k and v start 16-byte aligned (the numerics tests here run it)."""
    shape = (1, 130, 130, 2, 64)
    assert attention_dispatch(make_plan(graph(*shape), H200, "buffer", FP16)).spec[4:] == (1,)


def needs_layout():
    p = device_profile()
    if p.coopmat_layout != "mma":
        pytest.skip(f"'{p.name}': cooperative-matrix layout {p.coopmat_layout!r}, not the one this kernel reads")


@pytest.mark.parametrize("kind", ["plain", "big", "huge", "ramp"])
@pytest.mark.parametrize("shape", [(1, 1500, 1500, 6, 64), (2, 37, 53, 2, 16), (1, 100, 17, 3, 32), (1, 5, 5, 1, 64),
                                   (1, 130, 130, 8, 64), (1, 130, 130, 2, 128)])
def test_kernel_matches_float64(shape, kind):
    needs_layout()
    assert check(shape, kind, seed(shape, kind), {"attention_cm_reg": True}) == "attention_cmr_khr_half"


@pytest.mark.parametrize("S", [1, 2, 3, 5])
@pytest.mark.parametrize("tile", attention_cmr.TILES)
def test_kernel_tiles_and_splits(tile, S):
    needs_layout()
    if attention_cmr.tile_problem(64, tile, device_profile().max_shared_memory):
        pytest.skip(f"tile {tile} does not fit head dim 64")
    for kind in ("plain", "ramp"):
        assert check((1, 1500, 1500, 6, 64), kind, seed(tile, S, kind),
                     {"attention_cm_reg": True, "cmr_tile": tile, "attention_splits": S}) == "attention_cmr_khr_half"
