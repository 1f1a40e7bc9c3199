"""glsl/linear.comp with sliced K (local size z = KS K slices in one work group, summed in a fixed order): against
onnxruntime, on the plan, and bit-stable across runs."""
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt import MinirtError, Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.lwg import pick_local_size
from minirt.ops.gemm import linear_shared
from oracle import check_model, cosine, make_model, onnxruntime_run, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402


def _linear(k, n, m=37, residual=True, act="Gelu"):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "bias"], ["hb"])]
    cur = "hb"
    if act:
        nodes.append(helper.make_node(act, [cur], ["ha"]))
        cur = "ha"
    nodes.append(helper.make_node("Add", [cur, "r"], ["y"]) if residual else helper.make_node("Identity", [cur], ["y"]))
    inputs = {"x": (1, m, k), **({"r": (1, m, n)} if residual else {})}
    return make_model(nodes, inputs, ["y"], {"w": rand(k, n, low=-.2, high=.2), "bias": rand(n)}, opset=20)


def _feeds(k, n, m=37, residual=True):
    seed = np.random.SeedSequence().entropy % 2**31        # fresh inputs each run
    return {"x": rand(1, m, k, seed=seed, low=-2, high=2), **({"r": rand(1, m, n, seed=seed + 1)} if residual else {})}


# K = 200: 7 steps of 32 (t44k32) or 13 of 16 (t44), so every split leaves a last slice short or idle
@pytest.mark.parametrize("tile", ["t44", "t44k32", "t88"])
@pytest.mark.parametrize("ks", [2, 3, 4])
@pytest.mark.parametrize("k,n,residual", [(200, 52, True), (384, 200, False)])
def test_sliced_k_matches_onnxruntime(tile, ks, k, n, residual):
    m = _linear(k, n, residual=residual)
    opts = {"gemm_tile": tile, "gemm_ksplit": ks}
    check_model(m, _feeds(k, n, residual=residual), storages=("buffer",), options=opts)
    with Session(m, options=opts) as s:
        (d,) = [d for d in s.plan.dispatches if d.kernel.startswith("linear_")]
    # t88's accumulators (4x as many) cap the split by lavapipe's 32 KiB of shared memory
    want = ks if tile != "t88" else min(ks, 3)
    assert d.family == "gemm_ks" and d.global_size[2] == want and d.local_size[2] == want, (d.global_size, d.local_size)
    assert linear_shared(tile, d.local_size) <= s.device.profile.max_shared_memory


def test_more_slices_than_steps_are_capped():
    """K = 40 is 3 steps of 16: a split of 8 becomes 3 (no slice without a step)."""
    m = _linear(40, 24)
    check_model(m, _feeds(40, 24), storages=("buffer",), options={"gemm_tile": "t44", "gemm_ksplit": 8})
    with Session(m, options={"gemm_tile": "t44", "gemm_ksplit": 8}) as s:
        assert [d.local_size[2] for d in s.plan.dispatches if d.kernel.startswith("linear_")] == [3]


def test_sliced_k_is_bit_stable():
    m = _linear(384, 200)
    feeds = _feeds(384, 200)
    with Session(m, options={"gemm_ksplit": 3}) as s:
        outs = {s.run(None, feeds)[0].tobytes() for _ in range(5)}
    assert len(outs) == 1


@pytest.mark.parametrize("local", [None, "24x12"])
def test_whisper_layer_with_sliced_k(local):
    """Every GEMM output mode of a Whisper layer with two K slices: the conv GEMMs (NCHW / channels-last with the
    positional residual), the merged QKV (part-major), out-projection and fc2 (residual), fc1 (GELU)."""
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=11)
    x = we.sample_input(n_frames=200, seed=np.random.SeedSequence().entropy % 2**31)
    ref = onnxruntime_run(model, {"input_features": x})[0]
    with Session(model, options={"poison": True, "gemm_ksplit": 2}, local_size=local) as s:
        y = s.run(x)
        zs = {d.local_size[2] for d in s.plan.dispatches if d.kernel.startswith("linear_")}
    assert zs == {2}
    assert cosine(y, ref) >= 0.99999
    assert float(np.abs(y - ref).max()) <= 1e-3 * float(np.abs(ref).max())


@pytest.mark.parametrize("bad", [0, -1, "two", True, 1.5])
def test_bad_split_is_refused(bad):
    with pytest.raises(MinirtError, match="gemm_ksplit must be an integer >= 1"):
        Session(_linear(64, 48), options={"gemm_ksplit": bad})


def test_picker_keeps_z_and_forced_xy():
    p = KNOWN_PROFILES["nvidia-h200"]
    assert pick_local_size("gemm_ks", (96, 375, 2), p) == (*pick_local_size("gemm", (96, 375, 1), p)[:2], 2)
    assert pick_local_size("gemm_ks", (96, 375, 2), p, forced=(24, 12, 1)) == (24, 12, 2)
    # a group too big for the device gives up x/y, never the slices
    x, y, z = pick_local_size("gemm_ks", (96, 375, 4), p, forced=(32, 32, 1))
    assert z == 4 and x * y * z <= p.max_invocations
