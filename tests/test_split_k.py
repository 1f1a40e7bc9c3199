"""Split K for the fp32 GEMM (glsl/linear.comp OUT_MODE 3 + glsl/linear_reduce.comp, minirt/kernels/gemm.py split_k):
which GEMMs of the Whisper plan split on the H200 profile and how, and the numbers against a float64 reference with
poisoned activations, for forced split counts on this machine's device."""
import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import numpy_helper

from minirt import MinirtError, Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import prepare
from minirt.loaders import load
from minirt.kernels import gemm
from minirt.planner import make_plan

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402
from oracle import linear_case  # noqa: E402

H200 = KNOWN_PROFILES["nvidia-h200"]
_erf = np.vectorize(math.erf, otypes=[np.float64])


def whisper_plan(profile=H200, **options):
    return make_plan(prepare(load(we.build_whisper_encoder("tiny", layers=1, seed=3))), profile, "buffer", options)


def test_h200_splits_the_gemms_left_one_group_per_multiprocessor():
    """1500 x 384 outputs: unsplit, the picker's 16 x 8 groups (12 KiB, 4 a multiprocessor) fill 282 of 528 places;
    split twice, 16 x 12 groups (14 KiB, 3 a multiprocessor) fill 384 of 396, so fc2 (K 1536) and the conv2 GEMM (K
    1152) split twice in 16 x 12 groups, a local size the lowering chose; the out-projection (K 384: 12 slices, 6 a
    split) and the wider GEMMs do not. (The reduce pass as it is: the LayerNorm folded into it is
    tests/test_fuse_reduce_layer_norm.py's.)"""
    p = whisper_plan(fuse_reduce_layer_norm=False)
    splits = [(i, d) for i, d in enumerate(p.dispatches) if d.kernel.startswith("linear_t") and d.spec[0] == gemm.OUT_SPLIT]
    assert [d.node.split("/")[-2] for _, d in splits] == ["conv2", "fc2"]
    for i, d in splits:
        m, n, k, n4 = np.frombuffer(d.push[:16], np.int32)
        S = np.frombuffer(d.push[16:32], np.int32)[3]
        assert (m, n, S) == (1500, 384, 2) and d.global_size[2] == S
        assert d.local_size == (16, 12, 1) and d.shared_xy == (512, 512)
        part = p.tensors[d.args[0][0]]
        assert part.dtype == "float32" and part.numel >= S * m * n4 * 4
        red = p.dispatches[i + 1]
        assert red.kernel == "linear_reduce" and red.args[1] == (part.name, "r")
        assert tuple(np.frombuffer(red.push[:16], np.int32)) == (m, n, n4, S)
        assert red.spec == ((2, 1) if "conv2" in d.node else (0, 1))    # GELU then the positional embedding; residual
    others = [d for d in p.dispatches if d.kernel.startswith("linear_t") and d.spec[0] != gemm.OUT_SPLIT]
    assert len(others) == 4 and all(d.global_size[2] == 1 for d in others)   # conv1, qkv, out_proj, fc1
    # the picker's shapes with 3 (16 x 12) or 4 (16 x 8) groups a multiprocessor: conv1 one wave of 378 groups in 396
    # places, QKV 846 groups in 528, out_proj 282 in 528, fc1 768 in 396
    assert [d.local_size for d in others] == [(16, 12, 1), (16, 8, 1), (16, 8, 1), (16, 12, 1)]
    # a forced local size still wins over the lowering's choice, and the split count follows it
    forced = whisper_plan(fuse_reduce_layer_norm=False, local_size=(24, 12, 1), local_size_families=("gemm",))
    split = [d for d in forced.dispatches if d.kernel.startswith("linear_t") and d.spec[0] == gemm.OUT_SPLIT]
    assert len(split) == 2 and all(d.local_size == (24, 12, 1) and d.global_size[2] == 2 for d in split)


def test_no_split_without_multiprocessor_count_or_when_forced_off():
    # (at fp16 the tensor-core GEMM has a split of its own: tests/test_coopmat_linear.py)
    for p in (whisper_plan(dataclasses.replace(H200, compute_units=0)), whisper_plan(precision="fp16", gemm_splitk=1),
              whisper_plan(gemm_splitk=1), make_plan(prepare(load(we.build_whisper_encoder("tiny", layers=1, seed=3))),
                                                     KNOWN_PROFILES["lavapipe"], "buffer", {})):
        assert not any(d.kernel == "linear_reduce" for d in p.dispatches)


@pytest.mark.parametrize("bad", [0, -1, "two", True])
def test_bad_split_option(bad):
    with pytest.raises(MinirtError, match="gemm_splitk"):
        whisper_plan(gemm_splitk=bad)


@pytest.mark.parametrize("m, n, k, act, residual, S", [(100, 64, 1536, True, True, 2), (37, 20, 520, False, True, 3),
                                                        (130, 384, 384, True, False, 4), (9, 8, 64, False, False, 5)])
def test_split_gemm_matches_float64(m, n, k, act, residual, S):
    model, feeds = linear_case(m, n, k, act, residual)     # seeded weights and inputs
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w, b = init["w"], init["b"]
    with Session(model, storage="buffer", options={"gemm_splitk": S, "poison": True}) as s:
        assert [d.kernel for d in s.plan.dispatches][-1] == "linear_reduce"
        y = s.run(None, feeds)[0].astype(np.float64)
    ref = feeds["x"].astype(np.float64) @ w.astype(np.float64) + b
    if act:
        ref = 0.5 * ref * (1 + _erf(ref / math.sqrt(2)))
    if residual:
        ref = ref + feeds["r"]
    assert not np.isnan(y).any()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * math.sqrt(k))


def test_split_gemm_at_fp16_matches_float64():
    """Forced split K at fp16 on the scalar kernels: the half GEMM variant writes fp32 partials, the half reduce adds
    them (out32: the graph's float32 output written in place)."""
    m, n, k = 70, 48, 640
    model, feeds = linear_case(m, n, k, True, True)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    with Session(model, storage="buffer", precision="fp16",
                 options={"gemm_splitk": 3, "poison": True, "coopmat": False}) as s:
        ks = [d.kernel for d in s.plan.dispatches if not d.kernel.startswith("cast_")]
        assert len(ks) == 2 and ks[0].startswith("linear_t44") and ks[1].startswith("linear_reduce_half"), ks
        y = s.run(None, feeds)[0].astype(np.float64)
    ref = feeds["x"].astype(np.float64) @ init["w"].astype(np.float64) + init["b"]
    ref = 0.5 * ref * (1 + _erf(ref / math.sqrt(2))) + feeds["r"]
    assert not np.isnan(y).any()
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 3e-3


def test_wave_splits_rule():
    """The one split-count rule (GEMM K slices, attention keys): the most splits whose groups fit one wave, each
    keeping min_units; never past `most`; 1 where no split fits."""
    from minirt.kernels.local_size import wave_splits
    assert wave_splits(144, 528, 48, 16, 4) == 3      # tiny fc2 on the H200: 432 groups fit, 4 would not keep 16
    assert wave_splits(192, 528, 64, 16, 4) == 2      # base fc2: 576 groups would not fit
    assert wave_splits(144, 528, 12, 16, 4) == 1      # too few slices
    assert wave_splits(600, 528, 64, 1, 4) == 1       # one wave is already full
    assert wave_splits(6, 1000, 1500, 256, 16) == 5   # attention keys: 1500 // 5 >= 256 > 1500 // 6
    assert H200.wave_slots(9728) == 132 * 5 and H200.wave_slots(9728, 4) == 132 * 4 and H200.wave_slots(20000, 4) == 264
