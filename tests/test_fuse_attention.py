"""fuse_attention: every exporter spelling of multi-head attention becomes one Attention node (one dispatch, no
score matrix); near misses stay unfused; the fused kernel matches onnxruntime in both storages."""
import math
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

import minirt.kernels.attention_fp32 as attention
from minirt.options import Options
from minirt import Session
from minirt.graph import Node
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.ops import OPS
from minirt.device_profile import KNOWN_PROFILES
from minirt.planner import GRAPH_PASSES, Pass, fuse_attention
from oracle import STORAGES, check_model, compare, cosine, make_model, onnxruntime_run, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402


def attention_model(B, Tq, Tk, H, dh, spelling="builder", axis=-1, extra_reader=False, mask=None, guard=False):
    """q [B, Tq, D], k and v [B, Tk, D] -> y [B, Tq, D], attention written out the way `spelling`'s exporter does.
    mask: the shape of a float input `mask` added to the scaled scores before the Softmax; guard: the NaN guard of
    torch's SDPA export after it, Where(IsNaN(p), 0, p)."""
    D, s = H * dh, dh ** -0.5
    init = {"to4q": np.array([0, -1, H, dh]), "to4k": np.array([B, Tk, H, dh]), "to3": np.array([B, Tq, D]),
            "s": np.array(s, np.float32), "rs": np.array(math.sqrt(s), np.float32), "sq": np.array(1 / s, np.float32),
            "toBH": np.array([B * H, Tk, dh]), "toKt": np.array([B, H, dh, Tk]), "to4o": np.array([B, H, Tq, dh])}
    n = helper.make_node
    nodes = [n("Reshape", ["q", "to4q"], ["q4"]), n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
             n("Reshape", ["k", "to4k"], ["k4"]), n("Reshape", ["v", "to4k"], ["v4"]),
             n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3])]
    if spelling == "builder":       # ours: K through two transposes, the scale on the scores
        nodes += [n("Transpose", ["k4"], ["kh"], perm=[0, 2, 1, 3]), n("Transpose", ["kh"], ["kt"], perm=[0, 1, 3, 2]),
                  n("MatMul", ["qh", "kt"], ["sc0"]), n("Mul", ["sc0", "s"], ["sc"])]
    elif spelling == "torchscript":  # torch.onnx TorchScript: sqrt(scale) on Qh and on Kt
        nodes += [n("Transpose", ["k4"], ["kt0"], perm=[0, 2, 3, 1]), n("Mul", ["qh", "rs"], ["qs"]),
                  n("Mul", ["rs", "kt0"], ["kt"]), n("MatMul", ["qs", "kt"], ["sc"])]
    elif spelling == "dynamo":       # torch.onnx dynamo: K^T through [B*H, T, dh]; the scores divided
        nodes += [n("Transpose", ["k4"], ["kh"], perm=[0, 2, 1, 3]), n("Reshape", ["kh", "toBH"], ["k3"]),
                  n("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]), n("Reshape", ["k3t", "toKt"], ["kt"]),
                  n("MatMul", ["qh", "kt"], ["sc0"]), n("Div", ["sc0", "sq"], ["sc"])]
    if mask is not None:
        nodes += [n("Add", ["sc", "mask"], ["scm"])]
    nodes += [n("Softmax", ["scm" if mask is not None else "sc"], ["p"], axis=axis)]
    if guard:
        init["zero"] = np.array(0.0, np.float32)
        nodes += [n("IsNaN", ["p"], ["isn"]), n("Where", ["isn", "zero", "p"], ["pg"])]
    nodes += [n("MatMul", ["pg" if guard else "p", "vh"], ["o"])]
    if spelling != "builder":       # a no-op reshape back to [B, H, Tq, dh], as both torch exporters emit
        nodes += [n("Reshape", ["o", "to4o"], ["o4"])]
    nodes += [n("Transpose", ["o4" if spelling != "builder" else "o"], ["ot"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ot", "to3"], ["y"])]
    outputs = ["y"]
    if extra_reader:
        nodes.append(n("ReduceMax", ["p"], ["pm"], keepdims=0))
        outputs.append("pm")
    inputs = {"q": (B, Tq, D), "k": (B, Tk, D), "v": (B, Tk, D)}
    if mask is not None:
        inputs["mask"] = tuple(mask)
    return make_model(nodes, inputs, outputs, init)


def feeds(B, Tq, Tk, D, seed=0):
    return {"q": rand(B, Tq, D, seed=seed, low=-2, high=2), "k": rand(B, Tk, D, seed=seed + 1, low=-2, high=2),
            "v": rand(B, Tk, D, seed=seed + 2)}


def fused(model, options=None):
    return Pass(fuse_attention)(prepare(load(model)), Options.make(options))


def ops_of(g):
    return [n.op for n in g.nodes]


def check_fused(model, fd, storages=STORAGES):
    """minirt (fused, poisoned) vs onnxruntime: cosine >= 0.99999 and max abs diff <= 1e-4 x max|ref|."""
    ref = onnxruntime_run(model, fd)[0]
    for st in storages:
        with Session(model, storage=st, options={"poison": True}) as s:
            # one attention kernel (discrete GPUs may add a combine pass for split keys)
            assert len([d for d in s.plan.dispatches if d.op == "Attention" and "combine" not in d.kernel]) == 1
            y = s.run(None, fd)[0]
        compare(y, ref, 1e-4, st)
        assert cosine(y, ref) >= 0.99999, st


# -- the pass on the graph ------------------------------------------------------------------------------

@pytest.mark.parametrize("spelling", ["builder", "torchscript", "dynamo"])
def test_every_spelling_becomes_one_attention(spelling):
    g = fused(attention_model(2, 37, 37, 3, 16, spelling))
    assert ops_of(g) == ["Attention"]
    node = g.nodes[0]
    assert node.domain == "minirt" and node.inputs == ["q", "k", "v"] and node.outputs == ["y"]
    assert node.attrs["heads"] == 3 and node.attrs["scale"] == pytest.approx(16 ** -0.5, rel=1e-6)
    assert any("Attention" in t for t in g.notes[node.name])


@pytest.mark.parametrize("opset", [17, 20])
def test_fires_on_the_whisper_layer(opset):
    m = we.build_whisper_encoder("tiny", layers=2, n_frames=200, opset=opset, seed=1)
    g = fused(m)
    att = [n for n in g.nodes if n.op == "Attention"]
    assert len(att) == 2 and all(n.attrs["heads"] == 6 for n in att)
    assert "Softmax" not in ops_of(g) and ops_of(g).count("Transpose") == 1   # the one after the convs
    q_mul = [n for n in g.nodes if n.outputs[0] == att[0].inputs[0]][0]
    assert q_mul.op == "Mul"     # q's scaling on [B, T, D] stays outside (fuse_linear folds it into q_proj)


@pytest.mark.parametrize("path", ["/tmp/hf-whisper-tiny.onnx", "/tmp/hf-whisper-tiny-dynamo.onnx"])
def test_fires_on_hugging_face_exports(path):
    if not os.path.exists(path):
        pytest.skip(f"{path} absent (tools/dev/export_hf_whisper.py makes it)")
    m = onnx.load(path)
    g = fuse_attention.rewrite(prepare(bind_inputs(load(m), {"input_features": (1, 80, 3000)})), Options())
    assert ops_of(g).count("Attention") == 4 and "Softmax" not in ops_of(g)


def test_an_intermediate_with_another_reader_blocks_fusion():
    g = fused(attention_model(1, 9, 9, 2, 8, extra_reader=True))
    assert "Attention" not in ops_of(g) and "Softmax" in ops_of(g)


def test_a_graph_output_inside_the_chain_blocks_fusion():
    m = attention_model(1, 9, 9, 2, 8)
    m.graph.output.append(helper.make_tensor_value_info("p", onnx.TensorProto.FLOAT, None))
    assert "Attention" not in ops_of(fused(m))


def test_softmax_on_another_axis_is_left_alone():
    g = fused(attention_model(1, 9, 9, 2, 8, axis=2))
    assert "Attention" not in ops_of(g) and "Softmax" in ops_of(g)


def test_unsupported_head_dims_stay_unfused_with_a_note():
    g = fused(attention_model(1, 9, 9, 2, 6))       # head dim 6: not a multiple of 4
    assert "Attention" not in ops_of(g)
    assert any("head dim 6 " in t for notes in g.notes.values() for t in notes)


def test_the_option_turns_it_off():
    m = attention_model(1, 9, 9, 2, 8)
    assert "Attention" not in ops_of(fused(m, {"fuse_attention": False}))
    with Session(m, options={"fuse_attention": False}) as s:
        assert "Attention" not in [d.op for d in s.plan.dispatches]


# -- numerics ---------------------------------------------------------------------------------------------

def test_reference_matches_onnxruntime():
    m = attention_model(2, 11, 7, 3, 8, "torchscript")
    fd = feeds(2, 11, 7, 24)
    ref = onnxruntime_run(m, fd)[0]
    node = Node("Attention", "a", ["q", "k", "v"], ["y"], {"heads": 3, "scale": 8 ** -0.5}, "minirt")
    got = OPS["Attention"].reference(node, *(fd[n].astype(np.float64) for n in "qkv"))[0]
    compare(got, ref, 1e-5, "reference")


@pytest.mark.parametrize("B,Tq,Tk,H,dh,spelling", [
    (1, 37, 37, 6, 64, "builder"),      # Whisper's head dim, odd T: partial query and key blocks
    (2, 21, 45, 3, 16, "torchscript"),  # batch 2, cross attention (Tq != Tk)
    (1, 5, 70, 1, 128, "dynamo"),       # the largest head dim, one head
    (1, 13, 13, 2, 12, "builder"),      # a head dim that is not a multiple of 16
])
def test_fused_matches_onnxruntime(B, Tq, Tk, H, dh, spelling):
    check_fused(attention_model(B, Tq, Tk, H, dh, spelling), feeds(B, Tq, Tk, H * dh))


@pytest.mark.parametrize("tile", [(128, 16, 3, 4), (64, 16, 4, 4), (32, 4, 4, 4), (64, 8, 2, 2), (64, 4, 4, 3)])
def test_other_tile_shapes(monkeypatch, tile):
    """The shapes GPUs or other head dims get (lavapipe's own for dh = 64 is (128, 8, 3, 4)), and fewer keys per
    thread (NK = 2, 3: 16- and 12-key blocks, 37 keys)."""
    monkeypatch.setattr(attention, "tiles", lambda dh, shared, cpu, paired=False: tile)
    check_fused(attention_model(1, 37, 37, 6, 64), feeds(1, 37, 37, 384), storages=["buffer"])


def test_tile_choice_fits_shared_memory():
    for dh in range(4, 129, 4):
        for shared in (32768, 49152):    # every GPU we know has at least 32 KiB
            t = attention.tiles(dh, shared)
            assert t is not None and attention.shared_bytes(dh, *t) <= shared and (dh // 4) % t[1] == 0
    assert attention.tiles(64, 49152) == (128, 8, 5, 4) and attention.tiles(64, 32768, cpu=True) == (128, 8, 3, 4)
    assert attention.tiles(64, 32768) == (128, 16, 3, 4)   # (128, 8, 5) and (128, 16, 5) need 44.5 and 41.7 KiB


def test_whisper_layer_fused_matches_onnxruntime_and_drops_dispatches():
    m = we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=3)
    x = we.sample_input(n_frames=200, seed=4)
    ref = onnxruntime_run(m, {"input_features": x})[0]
    for st in STORAGES:
        counts = {}
        for fuse in (True, False):
            with Session(m, storage=st, options={"poison": True, "fuse_attention": fuse}) as s:
                # (a combine pass for split keys, on discrete GPUs, named apart from the attention kernel)
                counts[fuse] = [d.op if "combine" not in d.kernel else "combine" for d in s.plan.dispatches]
                y = s.run(x)
            assert cosine(y, ref) >= 0.99999
            compare(y, ref, 1e-4, f"{st} fuse={fuse}")
        assert "Softmax" not in counts[True] and "Softmax" in counts[False] and counts[True].count("Attention") == 1
        assert len(counts[True]) < len(counts[False])


def test_dynamo_spelling_through_the_oracle():
    check_model(attention_model(1, 9, 9, 2, 8, "dynamo"), feeds(1, 9, 9, 16), options={"fuse_attention": True})


# -- masked attention (text models) -------------------------------------------------------------------------

LOWEST = float(np.finfo(np.float32).min)     # Hugging Face's default mask value


def mask_values(shape, fill, seed, full_rows=True):
    """An additive mask of `shape`: 0 or `fill` (about a third of the entries), or a finite bias where fill is None;
    with full_rows, the first row of every (batch, head) slice, or the first batch's whole mask when the mask has one
    query row, is all `fill` (a fully masked row)."""
    rng = np.random.default_rng(seed)
    if fill is None:
        return rng.standard_normal(shape).astype(np.float32) * 3
    m = np.where(rng.random(shape) < 0.35, np.float32(fill), np.float32(0)).astype(np.float32)
    if full_rows:
        if len(shape) >= 2 and shape[-2] > 1:
            m[..., 0, :] = fill
        else:
            m[0] = fill
    return m


def same_with_nan(out, ref, tol, what):
    """NaN exactly where onnxruntime has NaN (fully masked rows without a guard), elsewhere within tol x max|ref|."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape, what
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref), err_msg=what)
    ok = ~np.isnan(ref)
    scale = max(np.abs(ref[ok]).max(initial=0.0), 1e-6)
    err = np.abs(out[ok] - ref[ok]).max(initial=0.0)
    assert err <= tol * scale, f"{what}: max abs diff {err:.3g} > {tol} x max|ref| {scale:.3g}"


def check_masked(model, fd, storages=STORAGES, precision="fp32", options=None, tol=None):
    ref = onnxruntime_run(model, fd)[0]
    for st in storages:
        with Session(model, storage=st, precision=precision, options={"poison": True, **(options or {})}) as s:
            att = [d for d in s.plan.dispatches if d.op == "Attention" and "combine" not in d.kernel]
            assert len(att) == 1 and "Softmax" not in [d.op for d in s.plan.dispatches]
            y = s.run(None, fd)[0]
            kernels = [d.kernel for d in s.plan.dispatches if d.op == "Attention"]
        same_with_nan(y, ref, tol or (1e-4 if precision == "fp32" else 1e-2), f"{st} {precision} {kernels}")


@pytest.mark.parametrize("mask,fill,guard", [
    ((2, 1, 13, 13), "-inf", True),      # torch SDPA at opset 20: -inf, a fully masked row is 0 after the guard
    ((2, 1, 13, 13), "-inf", False),     # without the guard: NaN, as onnxruntime's Softmax gives
    ((2, 1, 13, 13), "lowest", False),   # HF's float32 min: a fully masked row is uniform (x + min rounds to min)
    ((2, 1, 1, 13), "lowest", True),     # BERT's padding mask [B, 1, 1, Tk]: batch 0 wholly masked
    ((13, 13), "-inf", False),           # a rank-2 (causal-like) mask shared by batch and heads
    ((1, 2, 13, 13), None, False),       # a finite per-head bias (T5's position bias)
])
def test_masked_attention_matches_onnxruntime(mask, fill, guard):
    value = {"-inf": -np.inf, "lowest": LOWEST, None: None}[fill]
    m = attention_model(2, 13, 13, 2, 16, "torchscript", mask=mask, guard=guard)
    fd = {**feeds(2, 13, 13, 32, seed=5), "mask": mask_values(mask, value, seed=6)}
    check_masked(m, fd)


@pytest.mark.parametrize("fill,guard", [("-inf", True), ("lowest", False), ("-inf", False)])
@pytest.mark.parametrize("split", [{"attention_splits": 3}, {"attention_stream": 3}])
def test_masked_split_attention(fill, guard, split):
    """attention_split + attention_combine (keys split across work groups): a split with only masked keys, and a row
    masked in every split."""
    value = {"-inf": -np.inf, "lowest": LOWEST}[fill]
    m = attention_model(1, 9, 40, 2, 16, "dynamo", mask=(1, 2, 9, 40), guard=guard)
    fd = {**feeds(1, 9, 40, 32, seed=7), "mask": mask_values((1, 2, 9, 40), value, seed=8)}
    fd["mask"][0, 1, 3, :20] = value      # half a row: the first splits see only masked keys
    check_masked(m, fd, storages=["buffer"] if fill != "-inf" or guard else STORAGES,
                 options={**split, "attention_tile": (32, 4, 2, 2)})


@pytest.mark.parametrize("fill,guard", [("-inf", True), ("lowest", True), ("-inf", False), ("lowest", False)])
def test_masked_attention_at_fp16(fill, guard):
    """fp16: the mask reaches the kernel as float16 (float32's min saturated to -65504, still a fully masked row's
    uniform weights). The scalar half kernel; attention_cmr (emulated here: the layout of an H200's registers), whole
    and with its keys split; attention_cm takes no mask, so there the plan keeps the scalar half kernel."""
    value = {"-inf": -np.inf, "lowest": LOWEST}[fill]
    m = attention_model(2, 11, 21, 2, 16, "torchscript", mask=(2, 1, 11, 21), guard=guard)
    fd = {**feeds(2, 11, 21, 32, seed=9), "mask": mask_values((2, 1, 11, 21), value, seed=10)}
    fd["mask"][1, 0, 4, :16] = value      # the first 16-key block of a row: all masked
    check_masked(m, fd, precision="fp16")
    ref = onnxruntime_run(m, fd)[0]
    # (the scalar half kernel whole, or on a GPU whose table splits the keys across work groups, split)
    scalar = ("attention_buffer", "attention_split_buffer")
    for opts, kernel in (({}, ("attention_cmr_emu_half",)), ({"attention_splits": 2}, ("attention_cmr_emu_half",)),
                         ({"attention_cm_reg": False}, scalar)):
        with Session(m, storage="buffer", precision="fp16",
                     options={"coopmat": "emulate", "poison": True, "cmr_tile": (1, 16), **opts}) as s:
            att = [d.kernel for d in s.plan.dispatches if d.op == "Attention"]
            assert att[0].startswith(kernel), att
            assert ("scalar half kernel" in str(s.plan.notes)) == (kernel == scalar)
            y = s.run(None, fd)[0]
        same_with_nan(y, ref, 1e-2, f"fp16 coopmat=emulate {opts} {att}")


def test_a_scale_after_the_mask_stays_unfused():
    m = attention_model(1, 9, 9, 2, 8, "torchscript", mask=(1, 1, 9, 9))
    # the scores scaled after the mask is added: the scale would apply to the mask too
    nodes = list(m.graph.node)
    sm = next(x for x in nodes if x.op_type == "Softmax")
    sm.input[0] = "scm2"
    m.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    m.graph.node.insert(nodes.index(sm), helper.make_node("Mul", ["scm", "half"], ["scm2"]))
    assert "Attention" not in ops_of(fused(m))
    m = attention_model(1, 9, 9, 2, 8, "torchscript", mask=(1, 1, 9, 1))   # one value a query row: fused
    assert ops_of(fused(m)) == ["Attention"] and fused(m).nodes[0].attrs["mask_shape"] == [1, 1, 9, 1]


def test_masked_reference_matches_onnxruntime():
    m = attention_model(2, 7, 9, 2, 8, "torchscript", mask=(2, 1, 7, 9), guard=True)
    fd = {**feeds(2, 7, 9, 16, seed=11), "mask": mask_values((2, 1, 7, 9), -np.inf, seed=12)}
    g = fused(m)
    (node,) = g.nodes
    assert node.inputs == ["q", "k", "v", "mask"] and node.attrs["mask_shape"] == [2, 1, 7, 9]
    assert node.attrs["nan_zero"] == 1
    got = OPS["Attention"].reference(node, *(fd[n] for n in ("q", "k", "v", "mask")))[0]
    same_with_nan(got, onnxruntime_run(m, fd)[0], 1e-5, "reference")


FAMILIES = Path(__file__).resolve().parents[1] / "models" / "families"
# (file, attentions, masked ones, the ReplaceNaN guard, mask terms summed by an Add node)
TEXT = [("bert", 2, 2, True, False), ("gpt2", 2, 2, True, False), ("distilbert", 2, 2, True, False),
        ("t5_encoder", 2, 2, False, True), ("whisper_decoder", 4, 2, True, False)]


@pytest.mark.parametrize("name,n,masked,guard,summed", [(f + s, *r) for f, *r in TEXT for s in ("", "_dynamo")])
def test_the_pass_on_the_text_families(name, n, masked, guard, summed):
    """Each layer's attention of the five text families (both exporters) becomes one Attention: the mask (computed on
    the host) its fourth input with its broadcast shape, the NaN guard folded in; nothing of the pattern is left."""
    g = load(FAMILIES / f"{name}.onnx")
    shapes = {"input_ids": (2, 16), "attention_mask": (2, 16), "encoder_hidden_states": (2, 24, 64)}
    g = prepare(bind_inputs(g, {k: v for k, v in shapes.items() if k in g.inputs}), host=True)
    for _, fn in GRAPH_PASSES:
        g = fn(g, Options.make({"storage": "buffer"}), KNOWN_PROFILES["lavapipe"])
    att = [x for x in g.nodes if x.op == "Attention"]
    assert len(att) == n
    left = ops_of(g)
    assert not {"Softmax", "ReplaceNaN", "MatMul", "Transpose"} & set(left), left
    with_mask = [a for a in att if len(a.inputs) == 4]
    assert len(with_mask) == masked and len({a.inputs[3] for a in with_mask}) == 1   # one mask, shared by layers
    host = {b.name for b in g.host.boundary}
    for a in with_mask:
        shape = [2, 4, 16, 16] if summed else [2, 1, 16, 16]     # T5: position bias [1, H, T, T] + padding mask
        assert a.attrs["mask_shape"] == shape and a.attrs["heads"] == 4
        assert bool(a.attrs.get("nan_zero")) == guard
        assert (a.inputs[3] in host) != summed
        assert any("mask" in t for t in g.notes[a.name])
    if summed:
        (add,) = [x for x in g.nodes if x.outputs[0] == with_mask[0].inputs[3]]
        assert add.op == "Add" and any(i in host for i in add.inputs) and any(g.tensor(i).is_const for i in add.inputs)
    for a in att:
        assert a.attrs["scale"] == pytest.approx(1.0 if name.startswith(("t5", "whisper")) else 0.25)


@pytest.mark.parametrize("precision,kernel", [("fp32", "attention"), ("fp16", "attention_cmr_khr_half")])
def test_bert_plans_on_an_h200(precision, kernel):
    """BERT's plan on the H200 profile (planning only): each layer one masked attention kernel (with its split's combine
    pass where the rule splits), on tensor cores at fp16, the mask from the host its last binding."""
    from minirt.planner import make_plan
    g = load(FAMILIES / "bert.onnx")
    g = prepare(bind_inputs(g, {"input_ids": (1, 64), "attention_mask": (1, 64)}), host=True)
    plan = make_plan(g, KNOWN_PROFILES["nvidia-h200"], "buffer", {"precision": precision})
    att = [d for d in plan.dispatches if d.op == "Attention" and "combine" not in d.kernel]
    assert len(att) == 2 and all(d.kernel.startswith(kernel) for d in att), [d.kernel for d in att]
    assert all(d.spec[-1] == 1 for d in att)                        # MASK on
    masks = {d.args[4][0] for d in att}      # at fp16 the input's float16 copy, cast once
    assert len(masks) == 1 and plan.tensors[plan.root(masks.pop().replace("@f16", ""))].role == "input"


def test_two_added_terms_become_one_mask():
    """Two added terms: a constant bias and a mask input, summed by one Add node (T5's layers share it:
    test_the_pass_on_the_text_families); both constant, folded into one constant mask."""
    m = attention_model(1, 9, 9, 2, 8, "torchscript", mask=(1, 1, 9, 9))
    bias = np.random.default_rng(1).standard_normal((1, 2, 9, 9)).astype(np.float32)
    m.graph.initializer.append(onnx.numpy_helper.from_array(bias, "bias"))
    add = next(x for x in m.graph.node if x.op_type == "Add")
    add.input[:] = ["sc0b", "mask"]
    m.graph.node.insert(list(m.graph.node).index(add), helper.make_node("Add", ["sc", "bias"], ["sc0b"]))
    fd = {**feeds(1, 9, 9, 16, seed=13), "mask": mask_values((1, 1, 9, 9), LOWEST, seed=14)}
    g = fused(m)
    assert ops_of(g) == ["Add", "Attention"] and g.nodes[1].inputs[3] == g.nodes[0].outputs[0]
    assert g.nodes[1].attrs["mask_shape"] == [1, 2, 9, 9] and "the sum of 2 terms" in g.notes[g.nodes[1].name][-1]
    check_masked(m, fd, storages=["buffer"])
    m.graph.input.remove(next(i for i in m.graph.input if i.name == "mask"))
    m.graph.initializer.append(onnx.numpy_helper.from_array(fd.pop("mask"), "mask"))
    g = fused(m)
    assert ops_of(g) == ["Attention"] and g.tensor(g.nodes[0].inputs[3]).is_const
    check_masked(m, fd, storages=["buffer"])
