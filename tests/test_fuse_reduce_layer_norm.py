"""fuse_reduce_layer_norm (minirt/planner/fuse_reduce_layer_norm.py): on the plan, a split GEMM's reduce pass takes over
the LayerNorm that reads its output (glsl/linear_reduce.comp post=ln). The rewrite is checked on the plans (Whisper on
the H200 profile, where fc2 and conv2 split; the cases it must leave alone), and the fused kernel against onnxruntime
with poisoned activations, split forced on this machine's device, at fp32 and fp16."""
import copy
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import prepare
from minirt.loaders import load
from minirt.options import Options
from minirt.planner import fuse_reduce_layer_norm, make_plan
from minirt.planner.fuse_reduce_layer_norm import REG
from oracle import compare, cosine, make_model, onnxruntime_run, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402

H200, LAVAPIPE = KNOWN_PROFILES["nvidia-h200"], KNOWN_PROFILES["lavapipe"]


def whisper_plan(profile=H200, **options):
    return make_plan(prepare(load(we.build_whisper_encoder("tiny", layers=2, seed=3))), profile, "buffer", options)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_whisper_on_h200_folds_each_layer_norm_after_a_split(precision):
    """conv2 and both fc2 split K on the H200; the LayerNorm reading each one's output (the next layer's
    self_attn_layer_norm, and the final one, a float32 graph output) becomes part of its reduce pass; the LayerNorms
    after the unsplit out-projections stay. (The pass applied to the plan made without it: with it, make_plan also
    splits the out-projections, the next test's subject.)"""
    off = whisper_plan(precision=precision, fuse_reduce_layer_norm=False)
    on = fuse_reduce_layer_norm.rewrite(copy.deepcopy(off), H200, Options())
    sfx = "_half" if precision == "fp16" else ""
    reduces = [d for d in off.dispatches if d.kernel == f"linear_reduce{sfx}"]
    norms = {d.args[1][0]: d for d in off.dispatches if d.kernel.startswith("layer_norm_rows")}
    assert [d.node.split("/")[-2] for d in reduces] == ["conv2", "fc2", "fc2"]
    assert all(d.args[0][0] in norms for d in reduces)
    fused = [d for d in on.dispatches if d.kernel.startswith("linear_reduce_ln")]
    assert len(on.dispatches) == len(off.dispatches) - 3 and len(fused) == 3
    assert [d.kernel for d in fused] == [f"linear_reduce_ln{sfx}"] * 2 + \
        [f"linear_reduce_ln{sfx}" + ("_out32" if precision == "fp16" else "")]
    for red, d in zip(reduces, fused):
        ln = norms[red.args[0][0]]
        # the LayerNorm's output first (io=out32 writes it), the reduce's inputs, the LayerNorm's weights, the output
        assert d.args == [ln.args[0], *red.args[1:], ln.args[2], (red.args[0][0], "w")]
        m, n, n4, splits = struct.unpack_from("<4i", red.push)
        assert struct.unpack_from("<4i", d.push) == (m, n4, struct.unpack_from("<4i", ln.push)[2], splits)
        assert d.push[16:] == ln.push[16:32] and d.spec == red.spec + ln.spec
        assert (d.stem, d.axes) == ("linear_reduce", {**ln.axes, "post": "ln"})
        assert d.info["splits"] == red.info["splits"] == splits and red.info["n4"] == ln.info["n4"] == n4
        assert d.global_size == ln.global_size and d.family == "reduction" and d.node == red.node
        assert any("folded into the reduce pass" in n for n in on.notes[red.node])
    assert len([d for d in on.dispatches if d.kernel.startswith("layer_norm_rows")]) == 2   # after out_proj
    # and each fused dispatch sits where its reduce was: every reader of its two outputs comes after it
    first = {}
    for i, d in enumerate(on.dispatches):
        for w in d.writes:
            first.setdefault(w, i)
    assert all(first[r] < i for i, d in enumerate(on.dispatches) for r in d.reads if r in first)


@pytest.mark.parametrize("precision, S", [("fp32", 2), ("fp16", 3)])
def test_gemms_before_a_layer_norm_split_on_short_k(precision, S):
    """The out-projections (K 384: 12 slices, too few for the split rules) feed a LayerNorm, so they split (gemm.before_ln)
    and their reduce passes do that LayerNorm: no LayerNorm dispatch is left in Whisper on the H200. Without the fusion
    pass (the reason to split) they stay on the plain rules."""
    on, off = whisper_plan(precision=precision), whisper_plan(precision=precision, fuse_reduce_layer_norm=False)
    assert not any(d.kernel.startswith("layer_norm_rows") for d in on.dispatches)
    fused = [d for d in on.dispatches if d.kernel.startswith("linear_reduce_ln")]
    assert [d.node.split("/")[-2] for d in fused] == ["conv2", "out_proj", "fc2", "out_proj", "fc2"]
    for d in fused:
        if "out_proj" in d.node:
            assert d.info["splits"] == S
    for p in (off, whisper_plan(precision=precision, fuse_reduce_layer_norm=False)):
        assert not any("out_proj" in d.node for d in p.dispatches if d.kernel.startswith("linear_reduce"))


def test_nothing_to_fold_without_a_split_or_with_long_rows():
    # lavapipe: no split (and Whisper's 96 vec4 rows are more than REG x 8 lanes)
    assert not any(d.kernel.startswith("linear_reduce") for d in whisper_plan(LAVAPIPE).dispatches)
    forced = whisper_plan(LAVAPIPE, gemm_splitk=2)
    assert 96 > REG * LAVAPIPE.subgroup_size
    assert any(d.kernel == "linear_reduce" for d in forced.dispatches)
    assert not any(d.kernel.startswith("linear_reduce_ln") for d in forced.dispatches)


def _model(m=40, k=96, n=64, split_output=False):
    """y = x @ W + b + r; z = LayerNorm(y); out = z @ W2 + y (y also read later, as Whisper's residual stream).
    With split_output, y is a graph output too."""
    rng = np.random.default_rng(7)
    init = {"w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
            "b": (0.1 * rng.standard_normal(n)).astype(np.float32),
            "g": (1 + 0.1 * rng.standard_normal(n)).astype(np.float32),
            "beta": (0.1 * rng.standard_normal(n)).astype(np.float32),
            "w2": (rng.standard_normal((n, n)) / np.sqrt(n)).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Add", ["hb", "r"], ["y"]),
             helper.make_node("LayerNormalization", ["y", "g", "beta"], ["z"], axis=-1, epsilon=1e-5),
             helper.make_node("MatMul", ["z", "w2"], ["u"]), helper.make_node("Add", ["u", "y"], ["out"])]
    outs = ["out", "y"] if split_output else ["out"]
    return make_model(nodes, {"x": [1, m, k], "r": [1, m, n]}, outs, init), \
        {"x": rand(1, m, k, seed=11, low=-2, high=2), "r": rand(1, m, n, seed=12, low=-1, high=3)}


@pytest.mark.parametrize("S,rows", [(3, None), (6, None), (3, 256)])
@pytest.mark.parametrize("precision, tol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_fused_kernel_matches_onnxruntime(precision, tol, S, rows):
    """Split forced (K 96: 3 slices over S = 3, or S = 6, past the kernel's FAST_S: its loop, and splits with no
    slices); rows of 16 vec4 fit REG x 8 lanes of lavapipe (and any GPU). rows: the row kernel's invocations a work
    group (NVIDIA's 256: 32 rows a group on lavapipe's 8 lanes, so 40 rows are two groups, the second part empty)."""
    model, feeds = _model()
    ref = onnxruntime_run(model, feeds)[0]
    outs = {}
    for fuse in (True, False):
        with Session(model, storage="buffer", precision=precision,
                     options={"gemm_splitk": S, "poison": True, "fuse_reduce_layer_norm": fuse, "coopmat": False,
                              **({"rows_invocations": rows} if rows else {})}) as s:
            kernels = [d.kernel for d in s.plan.dispatches]
            assert any(k.startswith("linear_reduce_ln") for k in kernels) == fuse, kernels
            outs[fuse] = [s.run(None, feeds)[0] for _ in range(2)]
        assert outs[fuse][0].tobytes() == outs[fuse][1].tobytes()
        compare(outs[fuse][0], ref, tol, f"{precision} fused={fuse}")
        assert cosine(outs[fuse][0], ref) >= 0.9999
    if precision == "fp32":      # the same arithmetic as reduce + LayerNorm, so only contraction may differ
        compare(outs[True][0], outs[False][0], 1e-6, "fused against unfused")


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_the_gemm_output_is_a_graph_output_too(precision, tol):
    """y is both the LayerNorm's input and a graph output: the fused pass writes it (at fp16 its float16 stand-in,
    cast to the float32 output after) and both outputs match onnxruntime."""
    model, feeds = _model(split_output=True)
    with Session(model, storage="buffer", precision=precision,
                 options={"gemm_splitk": 3, "poison": True, "coopmat": False}) as s:
        assert any(d.kernel.startswith("linear_reduce_ln") for d in s.plan.dispatches)
        out, y = s.run(None, feeds)
    ref_out, ref_y = onnxruntime_run(model, feeds)
    compare(out, ref_out, tol, "out")
    compare(y, ref_y, tol, "y")


def test_row_groups_follow_the_vendor():
    """256 invocations a row-kernel work group on NVIDIA (8 rows of 32 lanes), 64 elsewhere; option rows_invocations
    forces it. The fused reduce + LayerNorm passes inherit the LayerNorm dispatch's shape."""
    for profile, inv, per in ((H200, 256, 8), (KNOWN_PROFILES["lavapipe"], 64, 8)):
        rows = [d for d in whisper_plan(profile, gemm_splitk=2).dispatches
                if d.kernel.startswith(("linear_reduce_ln", "layer_norm_rows"))]   # (lavapipe's 8 lanes: no fusion)
        assert rows and all(d.global_size[0] == inv and d.global_size[1] == -(-1500 // per) for d in rows)
    forced = whisper_plan(H200, rows_invocations=64).dispatches
    assert {d.global_size[0] for d in forced if d.kernel.startswith("linear_reduce_ln")} == {64}
