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

import minirt.ops.attention as attention
from minirt.options import Options
from minirt import Session
from minirt.graph import Node
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.ops import OPS
from minirt.planner import fuse_attention
from oracle import STORAGES, check_model, compare, cosine, make_model, onnxruntime_run, rand

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402


def attention_model(B, Tq, Tk, H, dh, spelling="builder", axis=-1, extra_reader=False):
    """q [B, Tq, D], k and v [B, Tk, D] -> y [B, Tq, D], attention written out the way `spelling`'s exporter does."""
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
    nodes += [n("Softmax", ["sc"], ["p"], axis=axis), n("MatMul", ["p", "vh"], ["o"])]
    if spelling != "builder":       # a no-op reshape back to [B, H, Tq, dh], as both torch exporters emit
        nodes += [n("Reshape", ["o", "to4o"], ["o4"])]
    nodes += [n("Transpose", ["o4" if spelling != "builder" else "o"], ["ot"], perm=[0, 2, 1, 3]),
              n("Reshape", ["ot", "to3"], ["y"])]
    outputs = ["y"]
    if extra_reader:
        nodes.append(n("ReduceMax", ["p"], ["pm"], keepdims=0))
        outputs.append("pm")
    return make_model(nodes, {"q": (B, Tq, D), "k": (B, Tk, D), "v": (B, Tk, D)}, outputs, init)


def feeds(B, Tq, Tk, D, seed=0):
    return {"q": rand(B, Tq, D, seed=seed, low=-2, high=2), "k": rand(B, Tk, D, seed=seed + 1, low=-2, high=2),
            "v": rand(B, Tk, D, seed=seed + 2)}


def fused(model, options=None):
    return fuse_attention.rewrite(prepare(load(model)), Options.make(options))


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
