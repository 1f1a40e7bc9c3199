"""Split K for the fp32 GEMM (glsl/linear.comp OUT_MODE 3, merge=split variants, merged by the last group of each
output block through glsl/split_merge.glslh; minirt/ops/gemm.py split_k): which GEMMs of the Whisper plan split on the
H200 profile and how (partials, counters), and the numbers against a float64 reference with poisoned activations, run
after run, for forced split counts on this machine's device."""
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
from minirt.ops import gemm
from minirt.planner import make_plan
from minirt.planner.plan import COUNTER

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tools"))   # after the stdlib: tools/profile.py
import whisper_encoder as we  # noqa: E402
from cm_bench import linear_case  # noqa: E402

H200 = KNOWN_PROFILES["nvidia-h200"]
_erf = np.vectorize(math.erf, otypes=[np.float64])


def whisper_plan(profile=H200, **options):
    return make_plan(prepare(load(we.build_whisper_encoder("tiny", layers=1, seed=3))), profile, "buffer", options)


def test_h200_splits_the_gemms_left_one_group_per_multiprocessor():
    """1500 x 384 outputs are 128 groups of 24 x 12 (18 KiB: 2 per multiprocessor, 264 places): fc2 (K 1536) and the
    conv2 GEMM (K 1152) split twice; the out-projection (K 384: 12 slices, 6 a split) and the wider GEMMs do not."""
    p = whisper_plan()
    slots = []
    splits = [(i, d) for i, d in enumerate(p.dispatches) if d.kernel.startswith("linear_t") and d.spec[0] == gemm.OUT_SPLIT]
    assert [d.node.split("/")[-2] for _, d in splits] == ["conv2", "fc2"]
    for i, d in splits:
        m, n, k, n4 = np.frombuffer(d.push[:16], np.int32)
        S = np.frombuffer(d.push[16:32], np.int32)[3]
        assert (m, n, S) == (1500, 384, 2) and d.global_size[2] == S
        assert d.kernel == "linear_t44k32_split" and len(d.args) == 7
        part, cnt = p.tensors[d.args[5][0]], p.tensors[d.args[6][0]]
        assert d.args[5][1] == d.args[6][1] == "w" and d.args[0][0] not in (part.name, cnt.name)
        assert part.dtype == "float32" and part.numel >= S * m * n4 * 4
        assert cnt.role == COUNTER and d.spec[1:] == ((2, 1) if "conv2" in d.node else (0, 1))  # GELU; residual
        first = np.frombuffer(d.push[16:32], np.int32)[2]
        slots.append((first, math.prod(-(-g // l) for g, l in zip(d.global_size[:2], d.local_size[:2]))))
    # each split dispatch has counters of its own, one per work group of its grid, and no other dispatch has any
    slots.sort()
    assert slots[0][0] == 0 and all(a + n == b for (a, n), (b, _) in zip(slots, slots[1:]))
    assert p.tensors["split.counters"].numel == sum(n for _, n in slots)
    assert all(len(d.args) == 5 for d in p.dispatches if d.op == "Linear" and d.spec[0] != gemm.OUT_SPLIT)
    others = [d for d in p.dispatches if d.kernel.startswith("linear_t") and d.spec[0] != gemm.OUT_SPLIT]
    assert len(others) == 4 and all(d.global_size[2] == 1 for d in others)   # conv1, qkv, out_proj, fc1


def test_no_split_without_multiprocessor_count_at_fp16_or_when_forced_off():
    for p in (whisper_plan(dataclasses.replace(H200, compute_units=0)), whisper_plan(precision="fp16"),
              whisper_plan(gemm_splitk=1), make_plan(prepare(load(we.build_whisper_encoder("tiny", layers=1, seed=3))),
                                                     KNOWN_PROFILES["lavapipe"], "buffer", {})):
        assert not any(d.op == "Linear" and (d.kernel.endswith("_split") or len(d.args) != 5) for d in p.dispatches)


@pytest.mark.parametrize("bad", [0, -1, "two", True])
def test_bad_split_option(bad):
    with pytest.raises(MinirtError, match="gemm_splitk"):
        whisper_plan(gemm_splitk=bad)


@pytest.mark.parametrize("m, n, k, act, residual, S", [(100, 64, 1536, True, True, 2), (37, 20, 520, False, True, 3),
                                                        (130, 384, 384, True, False, 4), (9, 8, 64, False, False, 5)])
def test_split_gemm_matches_float64(m, n, k, act, residual, S):
    """Poisoned activations: a block that no group merged stays NaN. Three runs give the same bits, which also shows
    the counters start from zero every run (a stale count would leave every block unmerged)."""
    model, feeds = linear_case(m, n, k, act, residual)     # tools/cm_bench.py: seeded weights and inputs
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w, b = init["w"], init["b"]
    with Session(model, storage="buffer", options={"gemm_splitk": S, "poison": True}) as s:
        assert [d.kernel for d in s.plan.dispatches] == ["linear_t44k32_split"]
        runs = [s.run(None, feeds)[0] for _ in range(3)]
    y = runs[0].astype(np.float64)
    assert all(r.tobytes() == runs[0].tobytes() for r in runs[1:])
    ref = feeds["x"].astype(np.float64) @ w.astype(np.float64) + b
    if act:
        ref = 0.5 * ref * (1 + _erf(ref / math.sqrt(2)))
    if residual:
        ref = ref + feeds["r"]
    assert not np.isnan(y).any()
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * math.sqrt(k))


def test_split_gemm_at_fp16_matches_float64():
    """Forced split K at fp16 on the scalar kernels: half inputs and output, fp32 partials, merged in the kernel."""
    m, n, k = 70, 48, 640
    model, feeds = linear_case(m, n, k, True, True)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    with Session(model, storage="buffer", precision="fp16",
                 options={"gemm_splitk": 3, "poison": True, "coopmat": False}) as s:
        assert any(d.kernel.startswith("linear_t44k32_split_half") for d in s.plan.dispatches)
        y = s.run(None, feeds)[0].astype(np.float64)
    ref = feeds["x"].astype(np.float64) @ init["w"].astype(np.float64) + init["b"]
    ref = 0.5 * ref * (1 + _erf(ref / math.sqrt(2))) + feeds["r"]
    assert not np.isnan(y).any()
    assert np.linalg.norm(y - ref) / np.linalg.norm(ref) < 3e-3
