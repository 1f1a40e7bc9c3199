"""conv_output_nlc: an im2col conv followed by a channels-last Transpose (and an Add of a [L, C] tensor: Whisper's
positional embedding) becomes one GEMM writing [1, L, C] row-major with the Add as its residual.

Checked on the rewritten graph (Transpose and Add gone, conv attributes, consumers rewired; ineligible graphs
unchanged), on the plan (dispatch counts, the GEMM's output mode and residual), and numerically with fresh random
inputs and poisoned activations: against onnxruntime at fp32 (both storages: texture storage leaves the graph as
it is), at fp16 (scalar half GEMM and the emulated tensor-core one), in several im2col row tiles, and the whole
Whisper-tiny encoder."""
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import minirt.ops.conv as conv_op
from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.kernels.gemm import OUT_NCHW, OUT_ROWS
from minirt.planner import make_plan
from minirt.graph_reference import run_graph
from oracle import check_model, compare, cosine, graph_after, make_model, onnxruntime_run, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402

LAVAPIPE = KNOWN_PROFILES["lavapipe"]
FP16_TOL = 1e-2     # max abs error relative to max |ref| (as tests/test_fp16.py): fp16 storage along the chain


def seed():
    return int(np.random.SeedSequence().entropy % 2**31)    # fresh inputs every run


def front_model(cin=16, cout=128, t=40, stride=2, batch=1, act="Gelu", bias=True, perm=(0, 2, 1), pos="const",
                pos_shape=None, extra=None):
    """x [batch, cin, t] -> Conv k3 p1 (+ act) -> Transpose(perm) -> Add(pos) -> y, Whisper's front end in small.
    pos: "const" (an initializer), "input" (a graph input), "late" (Relu of a graph input, a node placed after the
    conv), or None (no Add: the Transpose's output is y). pos_shape defaults to [L, C].
    extra: "conv" (the conv's result has a second reader), "transpose" (the Transpose's output is a graph output
    as well)."""
    h = helper.make_node
    length = (t - 1) // stride + 1
    init = {"w": rand(cout, cin, 3, seed=seed(), low=-.3, high=.3)}
    if bias:
        init["b"] = rand(cout, seed=seed())
    nodes = [h("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], name="conv", pads=[1, 1], strides=[stride])]
    cur = "c"
    if act:
        nodes.append(h(act, [cur], ["a"], name="act"))
        cur = "a"
    nodes.append(h("Transpose", [cur], ["t"], name="transpose", perm=list(perm)))
    inputs, outputs = {"x": (batch, cin, t)}, ["t"]
    if pos is not None:
        shape = pos_shape or (length, cout)
        if pos == "const":
            init["pos"] = rand(*shape, seed=seed())
        elif pos == "input":
            inputs["pos"] = shape
        else:
            inputs["z"] = shape
            nodes.append(h("Relu", ["z"], ["pos"], name="late"))
        nodes.append(h("Add", ["t", "pos"], ["y"], name="add"))
        outputs = ["y"] + (["t"] if extra == "transpose" else [])
    if extra == "conv":
        nodes.append(h("Relu", [cur], ["r"], name="other"))
        outputs.append("r")
    return make_model(nodes, inputs, outputs, init, opset=20)


def feeds_for(model):
    """Fresh random values for every graph input (never zeros)."""
    out = {}
    for v in model.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        out[v.name] = rand(*shape, seed=seed(), low=-2, high=2)
    return out


def shapes_of(model):
    return {k: v.shape for k, v in feeds_for(model).items()}


def passes(model, upto="conv_output_nlc", **options):
    return graph_after(model, shapes_of(model), upto, **options)


def structure(g):
    return [(n.op, list(n.inputs), list(n.outputs), dict(n.attrs)) for n in g.nodes]


def conv_node(g):
    return next(n for n in g.nodes if n.op == "Conv")


def plan(model, storage="buffer", **options):
    g = prepare(bind_inputs(load(model), shapes_of(model)))
    return make_plan(g, LAVAPIPE, storage, options)


# -- the graph -------------------------------------------------------------------------------------------------
def test_whisper_front_end_becomes_one_conv():
    m = front_model()
    before = passes(m, upto="fuse_activation")
    assert [n.op for n in before.nodes] == ["Reshape", "Conv", "Reshape", "Transpose", "Add"]
    g = passes(m)
    assert [n.op for n in g.nodes] == ["Reshape", "Conv"]
    c = conv_node(g)
    assert c.attrs["_out_layout"] == "NLC" and c.attrs["_act"] == "gelu" and c.attrs["_route"] == "im2col"
    assert c.inputs[1:] == ["w", "b", "pos"] and c.outputs == ["y"]
    assert g.tensor("y").shape == (1, 20, 128)
    assert not {"c", "a", "t"} & set(g.tensors)          # the tensors in between are gone
    notes = " ".join(g.notes["conv"])
    assert "conv writes channels-last [1, 20, 128]; removed Transpose 'transpose'" in notes
    assert "folded Add 'add' into the GEMM epilogue as the residual 'pos'" in notes
    # the rewritten graph, evaluated by the ops' references (Conv honours _act, _out_layout and the
    # residual), computes what the model does
    fd = feeds_for(m)
    compare(run_graph(g, fd)["y"], onnxruntime_run(m, fd)[0], 1e-5, "rewritten graph")


def test_without_bias_the_residual_takes_the_fourth_input():
    g = passes(front_model(bias=False, act="Relu", pos_shape=(1, 20, 128)))
    c = conv_node(g)
    assert c.inputs[2:] == ["", "pos"] and c.attrs["_act"] == "relu"


def test_transpose_alone_rewires_its_readers():
    """No Add, or an Add that does not fold: the Transpose goes and its readers read the conv's output."""
    g = passes(front_model(pos=None))
    c = conv_node(g)
    assert [n.op for n in g.nodes] == ["Reshape", "Conv"] and c.outputs == ["t"] and len(c.inputs) == 3
    assert g.tensor("t").shape == (1, 20, 128)
    for kw in (dict(pos_shape=(128,)), dict(pos_shape=(1, 1, 128)), dict(pos_shape=(20, 1)), dict(extra="transpose")):
        g = passes(front_model(**kw))
        c = conv_node(g)
        add = g.nodes[-1]
        assert [n.op for n in g.nodes] == ["Reshape", "Conv", "Add"], kw
        assert c.outputs == ["t"] and add.inputs[0] == "t" and c.attrs["_out_layout"] == "NLC", kw
        assert len(c.inputs) == 3, kw
    assert "Add 'add' not folded" in " ".join(passes(front_model(pos_shape=(128,))).notes["conv"])


def test_a_residual_computed_later_moves_the_conv_after_it():
    """The residual's producer comes after the conv in the model: the conv takes the Add's place."""
    g = passes(front_model(pos="late"))
    ops = [n.op for n in g.nodes]
    assert ops == ["Reshape", "Relu", "Conv"], ops
    assert conv_node(g).inputs[3] == "pos"


@pytest.mark.parametrize("why,kw,options", [
    ("perm (2, 1, 0)", dict(perm=(2, 1, 0), pos=None), {}),
    ("perm (1, 0, 2)", dict(perm=(1, 0, 2), pos=None), {}),
    ("conv result read twice", dict(extra="conv"), {}),
    ("direct route (64 channels)", dict(cout=64), {}),
    ("no conv1d rewrite", dict(), {"conv1d_rewrite": False}),
    ("option off", dict(), {"conv_output_nlc": False}),
    ("option off (string)", dict(), {"conv_output_nlc": "0"}),
    ("texture storage", dict(), {"storage": "texture"}),
    ("general GEMM", dict(), {"fast_gemm": False}),
    ("batch 2 in textures (the direct route)", dict(batch=2), {"storage": "texture"}),
])
def test_ineligible_graphs_are_unchanged(why, kw, options):
    m = front_model(**kw)
    before = passes(m, upto="fuse_activation", **options)
    after = passes(m, **options)
    assert structure(after) == structure(before), why
    assert {k: v.shape for k, v in after.tensors.items()} == {k: v.shape for k, v in before.tensors.items()}, why


def test_refusals_are_noted_and_off_is_silent():
    def notes(**options):
        return " ".join(passes(front_model(), **options).notes["conv"])

    assert "stays channels-first before Transpose 'transpose'" in notes(storage="texture")
    assert "texture storage" in notes(storage="texture")
    assert "fast_gemm off" in notes(fast_gemm=False)
    assert "channels" not in notes(conv_output_nlc=False)


def test_a_batch_writes_channels_last_image_by_image():
    """Batch 3: the pass rewrites as at batch 1 ([3, L, C], the Add folded); the plan runs each image's im2col and
    GEMM on views of the batch's input and output at the image's offset, the shared [L, C] residual for each."""
    m = front_model(batch=3)
    g = passes(m)
    assert [n.op for n in g.nodes] == ["Reshape", "Conv"] and g.tensor(conv_node(g).outputs[0]).shape == (3, 20, 128)
    p = plan(m)
    assert [d.kernel for d in p.dispatches] == ["im2col_buffer", "linear_t44"] * 3
    gemms = [d for d in p.dispatches if d.kernel == "linear_t44"]
    outs = [p.tensors[d.writes[0]] for d in gemms]
    assert [(t.view_of, t.view_offset, t.shape) for t in outs] == [("y", i * 20 * 128, (1, 20, 128)) for i in range(3)]
    assert all(d.reads[-1] == "pos" for d in gemms)
    assert "image by image, 3 images" in " ".join(p.notes["conv"])


# -- the plan --------------------------------------------------------------------------------------------------
def _gemm(p):
    (d,) = [d for d in p.dispatches if d.op == "Conv" and d.kernel.startswith("linear")]
    return d


def test_plan_one_gemm_writes_rows_with_the_residual():
    m = front_model()
    p = plan(m)
    assert [d.kernel for d in p.dispatches] == ["im2col_buffer", "linear_t44"]
    d = _gemm(p)
    assert d.spec == (OUT_ROWS, 2, 1)                       # OUT_MODE 0, gelu, HAS_RES
    assert d.writes == ["y"] and d.reads[-1] == "pos" and p.tensors["y"].shape == (1, 20, 128)
    off = plan(m, conv_output_nlc=False)
    assert [d.kernel for d in off.dispatches] == ["im2col_buffer", "linear_t44", "copy_buffer", "binary_buffer"]
    assert _gemm(off).spec == (OUT_NCHW, 2, 0)
    tex = plan(m, "texture")
    assert not any(d.kernel.startswith("linear") for d in tex.dispatches)
    assert sum(d.op in ("Transpose", "Add") for d in tex.dispatches) == 2


# -- numbers ---------------------------------------------------------------------------------------------------
CASES = {
    "whisper_like": dict(),
    "pos_1LC": dict(pos_shape=(1, 20, 128)),
    "pos_runtime_input": dict(pos="input"),
    "pos_computed_later": dict(pos="late"),
    "no_bias_relu_stride1": dict(bias=False, act="Relu", stride=1, t=33),
    "no_activation": dict(act=None, cout=132, cin=7, t=29),         # C and K not multiples of 4
    "transpose_only": dict(pos=None),
    "add_not_folded": dict(pos_shape=(1, 1, 128)),
    "transpose_also_output": dict(extra="transpose"),
    "batch2": dict(batch=2),
    "batch3_pos_per_image": dict(batch=3, pos="input", pos_shape=(3, 20, 128)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_onnxruntime_with_poison(case):
    m = front_model(**CASES[case])
    check_model(m, feeds_for(m))        # buffer (rewritten) and texture (left alone), poisoned


def test_2d_conv_flattened_and_transposed():
    """A patch embedding (ViT style): 2-D conv [1, C, H, W] -> Reshape [1, C, H * W] -> Transpose -> + pos."""
    h = helper.make_node
    nodes = [h("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
             h("Reshape", ["c", "s"], ["f"]), h("Transpose", ["f"], ["t"], perm=[0, 2, 1]),
             h("Add", ["pos", "t"], ["y"], name="add")]
    init = {"w": rand(128, 3, 3, 3, seed=seed()), "b": rand(128, seed=seed()), "s": np.array([1, 128, -1], np.int64),
            "pos": rand(30, 128, seed=seed())}
    m = make_model(nodes, {"x": (1, 3, 10, 12)}, ["y"], init, opset=20)
    g = passes(m)
    assert [n.op for n in g.nodes] == ["Conv"] and conv_node(g).inputs[3] == "pos"
    check_model(m, feeds_for(m), storages=("buffer",))


@pytest.mark.parametrize("budget_rows", [7, 20])
def test_im2col_row_tiles(budget_rows, monkeypatch):
    """A small scratch budget splits the conv into im2col + GEMM pairs whose rows start at M0 > 0 (a 1-D conv has
    one output row, so these are parts of it): row-major output and residual at the right rows."""
    m = front_model(cin=16, t=99)                     # L = 50, K = 48
    monkeypatch.setattr(conv_op, "IM2COL_SCRATCH_BUDGET", budget_rows * 48 * 4)
    with Session(m, storage="buffer", options={"poison": True}) as s:
        gemms = [d for d in s.plan.dispatches if d.kernel.startswith("linear")]
        assert len(gemms) == -(-50 // budget_rows) > 1
        assert all(d.spec[:3] == (OUT_ROWS, 2, 1) for d in gemms)   # (NVIDIA's plans add PAIR_LANES)
        fd = feeds_for(m)
        compare(s.run(None, fd)[0], onnxruntime_run(m, fd)[0], 1e-4, "row tiles")


@pytest.mark.parametrize("cm_emulate", [False, True])
@pytest.mark.parametrize("case", ["whisper_like", "pos_runtime_input", "no_activation"])
def test_fp16(case, cm_emulate, monkeypatch):
    """precision fp16: the device's own half GEMM (scalar, or tensor cores where it has them) and the emulated
    tensor-core GEMM (its OUT_MODE 0 epilogue with the residual), in row tiles of 16 positions where K = 48."""
    m = front_model(**CASES[case])
    monkeypatch.setattr(conv_op, "IM2COL_SCRATCH_BUDGET", 16 * 48 * 4)
    fd = feeds_for(m)
    ref = onnxruntime_run(m, fd)[0]
    with Session(m, storage="buffer", precision="fp16", options={"poison": True, "coopmat": "emulate" if cm_emulate else "auto",
                                                                  "coopmat2": False}) as s:
        gemms = [d for d in s.plan.dispatches if d.kernel.startswith("linear")]
        p = s.device.profile
        want = "linear_cmreg_emu_" if cm_emulate else ("linear_cmreg_" if p.coopmat_layout == "mma" else "linear_cm_m") \
            if p.cooperative_matrix else "linear_t"
        assert gemms and all(d.kernel.startswith(want) and "_half" in d.kernel for d in gemms), gemms
        assert all(d.spec[0] == OUT_ROWS and d.spec[2] == 1 for d in gemms)
        assert not any(d.op in ("Transpose", "Add") for d in s.plan.dispatches)
        compare(s.run(None, fd)[0], ref, FP16_TOL, f"fp16 {case}")


def test_whisper_tiny_front_end_dispatches_and_onnxruntime():
    """The Whisper-tiny encoder's front end and a layer (600 frames: the pass does not depend on the length or the
    depth): 14 dispatches without the pass, 12 with it, and the same result as onnxruntime (fresh input, poisoned
    activations). conv_input_nlc (conv2 without its im2col) is off here: tests/test_conv_input_nlc.py counts its
    dispatch."""
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=600, seed=11)
    g = prepare(bind_inputs(load(model), {"input_features": (1, 80, 600)}))
    off = {"conv_input_nlc": False}
    assert len(make_plan(g, LAVAPIPE, "buffer", {"conv_output_nlc": False, **off}).dispatches) == 14
    # (counted on lavapipe's profile: GPUs that tell their multiprocessor count add split-K reduce and attention
    # combine passes, and fold LayerNorms into the reduces)
    assert len(make_plan(g, LAVAPIPE, "buffer", off).dispatches) == 12
    x = we.sample_input(n_frames=600, seed=seed())
    ref = onnxruntime_run(model, {"input_features": x})[0]
    with Session(model, storage="buffer", options={"poison": True, **off}) as s:
        assert not any(d.op in ("Transpose", "Add") for d in s.plan.dispatches)
        y = s.run(x)
    assert cosine(y, ref) >= 0.99999
    assert float(np.abs(y - ref).max()) <= 1e-3 * float(np.abs(ref).max())


def test_whisper_fp16_close_to_fp32():
    """A 1-layer Whisper at fp16 (scalar half GEMMs) against minirt fp32 without the pass."""
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=12)
    x = we.sample_input(n_frames=200, seed=seed())
    with Session(model, storage="buffer", options={"conv_output_nlc": False}) as s:
        ref = s.run(x)
    with Session(model, storage="buffer", precision="fp16", options={"poison": True}) as s:
        assert any("folded Add '/Add'" in t for t in s.plan.notes["/conv2/Conv"])
        y = s.run(x)
    rel = float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref))
    assert rel <= 2e-3, f"relative L2 {rel:.2e}"
