"""tools/bench_transcribe.py --breakdown's grouping: every dispatch of a real (small) Whisper plan lands in one row, each
GEMM under its role with the M x K x N its FLOPs imply, a K-split reduce pass beside its GEMM, and the floors' weight
bytes those of the weights the plan reads. Planning only: nothing runs on the device."""
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT / "tools"))   # last, so nothing in tools/ can shadow an installed module
import bench_transcribe as bt  # noqa: E402


@pytest.fixture(scope="module")
def plans():
    from minirt.driver import get_device
    from minirt.whisper.synthetic import SIZES, random_checkpoint
    from minirt.whisper.vulkan import plan_batch, plan_program
    cfg = dict(SIZES["tiny"], encoder_layers=2, decoder_layers=1)
    weights = random_checkpoint(cfg, 3)[0]
    profile = get_device(None).profile
    program = plan_program(weights, cfg, profile, 1)
    out = {"encode": program["encode"], "split": plan_program(weights, cfg, profile, 1, {"gemm_splitk": 2})["encode"]}
    out.update(plan_batch(weights, cfg, profile, 2, None, program))
    return out, weights


def test_node_roles():
    assert bt.node_role("/layers.3/fc1/MatMul") == "fc1 (+GELU)"
    assert bt.node_role("/layers.0/self_attn/q_proj+k_proj+v_proj") == "q/k/v"
    assert bt.node_role("cross_k.1@new") == "cross K (decoder layers)"
    assert bt.node_role("layers.2/cq") == "cross-attn q_proj"
    assert bt.node_role("/conv2/Conv") == "conv2"
    assert bt.node_role("something/else") == "something/else"


def test_encoder_rows(plans):
    plans, _ = plans
    plan = plans["encode"]
    us = list(np.random.default_rng().uniform(1, 50, len(plan.dispatches)))
    rows = bt.breakdown(plan, us)
    assert sum(r[1] for r in rows) == len(plan.dispatches)
    assert sum(r[2] for r in rows) == pytest.approx(sum(us))
    assert sum(r[3] for r in rows) == sum(d.flops for d in plan.dispatches)
    assert [r[2] for r in rows] == sorted((r[2] for r in rows), reverse=True)
    kinds = {r[0]: r[1] for r in rows}
    d = 384
    for role, (k, n), count in (("q/k/v", (d, 3 * d), 2), ("out_proj", (d, d), 2), ("fc1 (+GELU)", (d, 4 * d), 2),
                                ("fc2 (+residual)", (4 * d, d), 2), ("cross K (decoder layers)", (d, d), 1),
                                ("cross V (decoder layers)", (d, d), 1)):
        assert kinds.get(f"GEMM {role} 1500x{k}x{n}") == count, (role, kinds)
    assert kinds["self-attention"] >= 2 and kinds["layer norm"] >= 4
    assert any(k.startswith("front end conv1") for k in kinds), kinds


def test_split_reduce_passes_sit_beside_their_gemm(plans):
    plan = plans[0]["split"]
    rows = bt.breakdown(plan, [1.0] * len(plan.dispatches))
    reduces = [r for r in rows if r[0].endswith("K-split reduce")]
    assert reduces, "gemm_splitk=2 split no GEMM"
    gemms = {r[0] for r in rows}
    for r in reduces:
        assert r[0].removesuffix(", K-split reduce") in gemms or r[0].startswith("front end"), r[0]
    assert sum(r[1] for r in reduces) == sum(d.kernel.startswith("linear_reduce") for d in plan.dispatches)


def test_step_rows_and_weight_bytes(plans):
    plans, weights = plans
    plan = plans["bstep2_select"]
    kinds = {r[0]: r[1] for r in bt.breakdown(plan, [1.0] * len(plan.dispatches))}
    assert kinds["GEMM logits 2x384x51865"] == 1
    assert kinds["GEMM fc1 (+GELU) 2x384x1536"] == 1
    assert kinds["cross-attention over 1500 keys"] == 1 and kinds["self-attention over the cache"] == 1
    assert kinds["token select"] == 1
    # a step reads every decoder Linear's weights (fp32 here) but not the cross K/V projections (done by encode)
    dec = [k for k in weights if k.startswith("model.decoder.layers.") and k.endswith("weight") and "layer_norm" not in k
           and "encoder_attn.k_proj" not in k and "encoder_attn.v_proj" not in k]
    linears = sum(weights[k].nbytes for k in dec) + weights["model.decoder.embed_tokens.weight"].nbytes
    assert linears <= bt.weight_bytes(plan) <= linears * 1.01


def test_peaks():
    class A:
        peak_tflops = peak_tbps = None
    assert bt.peaks_of("NVIDIA H100 80GB HBM3", "fp16", A) == (989e12, 3.35e12)
    assert bt.peaks_of("NVIDIA H200", "fp32", A) == (67e12, 4.8e12)
    assert bt.peaks_of("llvmpipe", "fp16", A) == (None, None)
    A.peak_tflops, A.peak_tbps = 100, 2
    assert bt.peaks_of("llvmpipe", "fp16", A) == (100e12, 2e12)
