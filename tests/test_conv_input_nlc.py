"""conv_input_nlc: a 1-D im2col conv reading another im2col conv's output: the producer writes channels-last and the
consumer's GEMM reads that buffer as overlapping rows (A_WIN in linear.comp and linear_cm.glslh), with no im2col.

Checked on the rewritten graph (attributes, the new [1, L, C] tensor, the reshapes gone, ineligible graphs unchanged
and noted), on the plan (no im2col for the consumer, the GEMM's A stride, window and specialization constant), and
numerically against onnxruntime with fresh random inputs and poisoned activations: strides 1-3, pads 0-2 (also
uneven), kernels 1-5, lengths that leave the last window ragged, at fp32 (whole and split K) and fp16 (scalar half
GEMM, and the emulated tensor-core GEMM whole and split), and the whole Whisper-tiny encoder."""
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.planner import make_plan
from minirt.graph_reference import run_graph
from oracle import compare, cosine, graph_after, make_model, onnxruntime_run, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402

LAVAPIPE = KNOWN_PROFILES["lavapipe"]
IM2COL = {"conv_route": "im2col"}      # small convs would otherwise take the direct kernel
FP16_TOL = 1e-2


def seed():
    return int(np.random.SeedSequence().entropy % 2**31)    # fresh inputs every run


def chain_model(cin=8, mid=16, cout=12, t=23, k2=3, stride2=2, pads2=(1, 1), dil2=1, group2=1, act="Gelu",
                extra=None, transpose=False, batch=1):
    """x [1, cin, t] -> Conv k3 p1 (+ act) -> Conv (k2, stride2, pads2, dil2, group2) -> y: Whisper's two front-end
    convs in small. extra="mid": the first conv's result is a graph output too. transpose: y is the second conv's
    result transposed to [1, L, C] (as in Whisper, so conv_output_nlc makes that GEMM write rows, which K splits
    need)."""
    h = helper.make_node
    init = {"w1": rand(mid, cin, 3, seed=seed(), low=-.4, high=.4), "b1": rand(mid, seed=seed()),
            "w2": rand(cout, mid // group2, k2, seed=seed(), low=-.4, high=.4), "b2": rand(cout, seed=seed())}
    nodes = [h("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1])]
    cur = "c1"
    if act:
        nodes.append(h(act, [cur], ["a1"], name="act"))
        cur = "a1"
    nodes.append(h("Conv", [cur, "w2", "b2"], ["c2" if transpose else "y"], name="conv2", pads=list(pads2),
                   strides=[stride2], dilations=[dil2], group=group2))
    if transpose:
        nodes.append(h("Transpose", ["c2"], ["y"], name="transpose", perm=[0, 2, 1]))
    return make_model(nodes, {"x": (batch, cin, t)}, ["y"] + ([cur] if extra == "mid" else []), init, opset=20)


def feeds(model):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": rand(*shape, seed=seed(), low=-2, high=2)}


def passes(model, upto="conv_input_nlc", **options):
    return graph_after(model, {"x": tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)},
                       upto, **{**IM2COL, **options})


def has_win(d):
    """A_WIN on: the specialization constant after linear.comp's 3 (linear_cm's and linear_cmreg's 4) others."""
    i = 4 if "_cm" in d.kernel else 3
    return len(d.spec) > i and d.spec[i] == 1


def convs(g):
    return {n.name: n for n in g.nodes if n.op == "Conv"}


def plan(model, profile=LAVAPIPE, **options):
    g = prepare(bind_inputs(load(model), {"x": tuple(d.dim_value for d in
                                                     model.graph.input[0].type.tensor_type.shape.dim)}))
    return make_plan(g, profile, "buffer", {**IM2COL, **options})


# -- the graph -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mid,cout,before_ops,after_ops", [
    (16, 12, ["Conv", "Conv"], ["Conv", "Conv"]),     # 1-D convs as they are
    # >= 128 output channels: conv1d_as_conv2d makes both 2-D over a height of 1, with reshapes around each
    (128, 128, ["Reshape", "Conv", "Reshape", "Reshape", "Conv", "Reshape"], ["Reshape", "Conv", "Conv", "Reshape"])])
def test_the_second_conv_reads_the_first_channels_last(mid, cout, before_ops, after_ops):
    m = chain_model(mid=mid, cout=cout)
    before = passes(m, upto="conv_output_nlc")
    assert [n.op for n in before.nodes] == before_ops
    g = passes(m)
    assert [n.op for n in g.nodes] == after_ops
    c = convs(g)
    assert c["conv1"].attrs["_out_layout"] == "NLC" and "_in_layout" not in c["conv1"].attrs
    assert c["conv2"].attrs["_in_layout"] == "NLC" and "_out_layout" not in c["conv2"].attrs
    nlc = c["conv1"].outputs[0]
    assert c["conv2"].inputs[0] == nlc and nlc.endswith("@nlc")
    assert g.tensor(nlc).shape == (1, 23, mid)
    # the tensors in between are gone: the new one is all that joins the convs
    between = set(before.tensors) - set(g.tensors)
    assert {"a1"} <= between and not (set(g.tensors) - set(before.tensors) - {nlc})
    assert "reads Conv 'conv1''s channels-last output" in " ".join(g.notes["conv2"])
    # evaluated by the ops' references (Conv honours both layouts), the rewritten graph computes what the model does
    fd = feeds(m)
    compare(run_graph(g, fd)["y"], onnxruntime_run(m, fd)[0], 1e-5, "rewritten graph")


def test_whisper_front_end_drops_conv2s_im2col():
    model = we.build_whisper_encoder("tiny", seed=3)
    g = prepare(bind_inputs(load(model), {"input_features": (1, 80, 3000)}))
    on, off = make_plan(g, LAVAPIPE, "buffer"), make_plan(g, LAVAPIPE, "buffer", {"conv_input_nlc": False})
    assert len(off.dispatches) - len(on.dispatches) == 1
    im2col = [d.node for d in on.dispatches if d.kernel.startswith("im2col")]
    assert im2col == ["/conv1/Conv"], im2col
    (gemm,) = [d for d in on.dispatches if d.node == "/conv2/Conv"]
    assert gemm.kernel.startswith("linear_") and has_win(gemm)
    assert gemm.reads[0] != "im2col.scratch"
    (c1,) = [d for d in on.dispatches if d.node == "/conv1/Conv" and d.kernel.startswith("linear_")]
    assert c1.spec[0] == 0 and not has_win(c1)     # OUT_MODE 0: conv1 writes rows (positions) of channels


@pytest.mark.parametrize("why,kw,options", [
    ("dilation 2", dict(dil2=2), {}),
    ("group 2", dict(group2=2), {}),
    ("channels not a multiple of 4", dict(mid=6), {}),
    ("first conv's result read twice", dict(extra="mid"), {}),
    ("option off", dict(), {"conv_input_nlc": False}),
    ("option off (string)", dict(), {"conv_input_nlc": "0"}),
    ("texture storage", dict(), {"storage": "texture"}),
    ("general GEMM", dict(), {"fast_gemm": False}),
])
def test_ineligible_graphs_are_unchanged(why, kw, options):
    m = chain_model(**kw)
    before = passes(m, upto="conv_output_nlc", **options)
    after = passes(m, **options)
    assert [(n.op, n.inputs, n.outputs, n.attrs) for n in after.nodes] == \
        [(n.op, n.inputs, n.outputs, n.attrs) for n in before.nodes], why
    assert {k: v.shape for k, v in after.tensors.items()} == {k: v.shape for k, v in before.tensors.items()}, why


def test_refusals_are_noted():
    def notes(m, **options):
        return " ".join(passes(m, **options).notes.get("conv2", []))

    assert "grouped or dilated" in notes(chain_model(dil2=2))
    assert "6 channels" in notes(chain_model(mid=6))
    assert "texture storage" in notes(chain_model(), storage="texture")
    assert "im2col kept" not in notes(chain_model(), conv_input_nlc=False)


# -- the plan --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stride,pads,k2", [(2, (1, 1), 3), (1, (2, 0), 5), (3, (0, 2), 4)])
def test_the_gemm_reads_overlapping_rows(stride, pads, k2):
    p = plan(chain_model(stride2=stride, pads2=pads, k2=k2))
    assert [d.node for d in p.dispatches if d.kernel.startswith("im2col")] == ["conv1"]
    (d,) = [d for d in p.dispatches if d.node == "conv2"]
    m, n, k, _n4, _m0, lda4, _mt, _np, off4, len4, *_ = np.frombuffer(d.push, np.int32)
    length = (23 + sum(pads) - k2) // stride + 1
    assert (m, n, k) == (length, 12, 16 * k2)
    assert lda4 == stride * 16 // 4 and off4 == pads[0] * 16 // 4 and len4 == 23 * 16 // 4
    assert has_win(d)


# -- numbers ---------------------------------------------------------------------------------------------------
CASES = [dict(), dict(stride2=1), dict(stride2=3, pads2=(0, 2), k2=4), dict(stride2=1, pads2=(2, 0), k2=5),
         dict(k2=1, pads2=(0, 0)), dict(t=64, mid=32, cout=40), dict(act=None, pads2=(2, 2), k2=3, t=17)]


@pytest.mark.parametrize("kw", CASES)
def test_fp32_matches_onnxruntime(kw):
    m = chain_model(**kw)
    fd = feeds(m)
    ref = onnxruntime_run(m, fd)[0]
    with Session(m, storage="buffer", options={"poison": True, **IM2COL}) as s:
        assert any(has_win(d) for d in s.plan.dispatches if d.node == "conv2")
        compare(s.run(None, fd)[0], ref, 1e-4, f"fp32 {kw}")


@pytest.mark.parametrize("kw", [dict(batch=3), dict(batch=2, mid=128, cout=128, transpose=True)])
def test_a_batch_reads_each_image_channels_last(kw):
    """A batch: each image's GEMM reads that image's rows of the channels-last buffer (a view at its offset: the
    window's zero padding at each image's ends, not at the batch's), whole and with K split."""
    m = chain_model(**kw)
    fd = feeds(m)
    ref = onnxruntime_run(m, fd)[0]
    for options in ({}, {"gemm_splitk": 2}):
        with Session(m, storage="buffer", options={"poison": True, **IM2COL, **options}) as s:
            wins = [d for d in s.plan.dispatches if d.node == "conv2" and has_win(d)]
            assert len(wins) == kw["batch"]
            assert {s.plan.tensors[d.reads[0]].view_offset for d in wins} == \
                {i * s.plan.tensors[wins[0].reads[0]].numel for i in range(kw["batch"])}
            compare(s.run(None, fd)[0], ref, 1e-4, f"batch {kw} {options}")


# conv_output_nlc (row output, which K splits need) takes 2-D convs: >= 128 output channels get conv1d_as_conv2d
WIDE = [dict(mid=128, cout=128), dict(mid=128, cout=136, stride2=1, pads2=(2, 0), k2=5, t=41)]


@pytest.mark.parametrize("kw", WIDE)
def test_fp32_split_k_matches_onnxruntime(kw):
    m = chain_model(**kw, transpose=True)
    fd = feeds(m)
    with Session(m, storage="buffer", options={"poison": True, "gemm_splitk": 2, **IM2COL}) as s:
        d = next(d for d in s.plan.dispatches if d.node == "conv2")
        assert d.spec[0] == 3 and has_win(d)          # OUT_MODE 3 (split K) with A_WIN
        compare(s.run(None, fd)[0], onnxruntime_run(m, fd)[0], 1e-4, f"fp32 split {kw}")


@pytest.mark.parametrize("options", [{}, {"coopmat": "emulate"}, {"coopmat": "emulate", "cm_regfed": False}],
                         ids=["device", "cmreg_emu", "cm_emu"])
@pytest.mark.parametrize("kw", [dict(), dict(stride2=3, pads2=(0, 2), k2=4), dict(t=70, mid=32, cout=64)] + WIDE)
def test_fp16_matches_onnxruntime(kw, options):
    _fp16(kw, options)


@pytest.mark.parametrize("kw", WIDE)
def test_fp16_split_k_matches_onnxruntime(kw):
    _fp16(kw, {"coopmat": "emulate", "cm_tile": "m64n64k32s1", "gemm_splitk": 2})


def _fp16(kw, options):
    m = chain_model(**kw, transpose="gemm_splitk" in options)
    fd = feeds(m)
    with Session(m, storage="buffer", options={"poison": True, "precision": "fp16", **IM2COL, **options}) as s:
        d = next(d for d in s.plan.dispatches if d.node == "conv2")
        # without options: the device's own fp16 GEMM (scalar half on lavapipe, tensor cores where there are some)
        assert has_win(d) and ("_emu_" in d.kernel) == bool(options), d.kernel
        if options:   # emulated: linear_cmreg unless turned off or a linear_cm tile is forced
            assert ("_cmreg_" in d.kernel) == (options.get("cm_regfed", True)
                                               and not options.get("cm_tile", "r").startswith("m")), d.kernel
        assert ("_split_" in d.kernel) == ("gemm_splitk" in options), d.kernel
        compare(s.run(None, fd)[0], onnxruntime_run(m, fd)[0], FP16_TOL, f"fp16 {kw} {options}")


def test_whisper_tiny_matches_onnxruntime_and_the_im2col_plan():
    # the front end and one layer at 600 frames: the pass does not depend on the length or the depth
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=600, seed=5)
    x = we.sample_input(n_frames=600, seed=seed())
    ref = onnxruntime_run(model, {"input_features": x})[0]
    with Session(model, storage="buffer", options={"poison": True}) as s:
        assert sum(d.kernel.startswith("im2col") for d in s.plan.dispatches) == 1
        y = s.run(x)
    with Session(model, storage="buffer", options={"conv_input_nlc": False}) as s:
        y_off = s.run(x)
    assert cosine(y, ref) >= 0.99999
    compare(y, ref, 1e-3)
    compare(y, y_off, 1e-4, "against the im2col route")
