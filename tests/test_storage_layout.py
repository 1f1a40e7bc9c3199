"""Mixed storage (minirt/planner/storage_layout.py, lower.lower_mixed): storage="auto" on a texture device keeps
textures where the device's images hold them and runs in buffers the nodes around a tensor too large for one, or
without a texture kernel for what they are given, with storage copies (glsl/storage_copy.comp) where a tensor crosses;
the Plan's notes name each buffer node and why; only an explicit storage="texture" refuses. Plans on the Adreno and
Mali profiles (text models with a vocabulary-wide LM head); runs on lavapipe, planned as an Adreno with small image
limits, against onnxruntime in both precisions."""
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minirt import Session, UnsupportedError
from minirt.device_profile import KNOWN_PROFILES
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.plan import INPUT, INTERMEDIATE, OUTPUT
from minirt.planner import make_plan
from oracle import compare, fake_profile, make_model, onnxruntime_run, rand, with_lm_head

FAMILIES = Path(__file__).resolve().parents[1] / "models" / "families"
TEXT_SHAPES = {"input_ids": (2, 16), "attention_mask": (2, 16), "encoder_hidden_states": (2, 24, 64)}


def _text_plan(model, profile, storage="auto"):
    """A text model's GPU plan as a Session on a texture device makes it (token ids gathered on the host)."""
    g = load(model)
    shapes = {n: TEXT_SHAPES[n] for n in g.inputs}
    return make_plan(prepare(bind_inputs(g, shapes), host=True, runtime_gather=0), KNOWN_PROFILES[profile], storage)


def _moved(plan):
    """node -> the note saying why it runs in buffers."""
    return {node: n for node, notes in plan.notes.items() for n in notes if n.startswith("storage: buffer")}


def _activations(plan, storage):
    return {n for n, t in plan.tensors.items() if t.storage == storage and t.role in (INPUT, OUTPUT, INTERMEDIATE)}


@pytest.mark.parametrize("name, vocab", [("whisper_decoder", 51865), ("gpt2", 50257), ("bert", 30522)])
def test_vocabulary_wide_logits_plan_in_buffers_where_no_image_holds_them(name, vocab):
    """Mali (images up to 4096): the logits [2, 16, vocab] and the LM head that writes them in buffers, the hidden
    state copied into a buffer for it, everything else in textures; an explicit storage="texture" refuses, naming the
    tensor. Adreno (16384): every activation in textures, the plan that storage="texture" makes."""
    model = with_lm_head(onnx.load(FAMILIES / f"{name}.onnx"), vocab, 64)
    mali = _text_plan(model, "mali-g715")
    assert mali.storage == "texture" and mali.tensors["logits"].storage == "buffer"
    assert _activations(mali, "buffer") == {"logits", "last_hidden_state@buffer"}
    assert len(_activations(mali, "texture")) > 20
    assert _moved(mali) == {"lm_head": f"storage: buffer (tensor 'logits' [2, 16, {vocab}] needs a texture of extents "
                                       f"({-(-vocab // 4)}, 16, 2), beyond this device's limit of 4096 "
                                       f"(maxImageDimension3D))"}
    head = [d for d in mali.dispatches if d.node == "lm_head"]
    copy = mali.dispatches[mali.dispatches.index(head[0]) - 1]
    assert copy.kernel == "storage_copy_t2b" and copy.args == [("last_hidden_state@buffer", "w"),
                                                               ("last_hidden_state", "r")]
    assert [d.kernel for d in mali.dispatches].count("storage_copy_t2b") == 1
    assert not any(d.kernel.startswith("storage_copy_b2t") for d in mali.dispatches)
    with pytest.raises(UnsupportedError, match=rf"tensor 'logits' \[2, 16, {vocab}\] needs a texture .* limit of 4096"):
        _text_plan(model, "mali-g715", "texture")
    adreno, texture = _text_plan(model, "adreno-840"), _text_plan(model, "adreno-840", "texture")
    assert not _moved(adreno) and not _activations(adreno, "buffer")
    assert [(d.kernel, d.args, d.push) for d in adreno.dispatches] == \
        [(d.kernel, d.args, d.push) for d in texture.dispatches]


def test_a_node_without_a_texture_kernel_runs_in_buffers():
    """A Gather by indices computed at run time (int32 rows from the host) has a buffer kernel only: in auto it runs
    in buffers and the Relu after it in textures, where storage="texture" refuses the plan."""
    table = rand(50, 8, seed=1)
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
                           helper.make_node("Relu", ["e"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(table, "table")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    gpu = prepare(bind_inputs(load(m), {"ids": (2, 5)}), host=True, runtime_gather=1 << 27)
    plan = make_plan(gpu, KNOWN_PROFILES["mali-g715"], "auto")
    assert [(d.node, d.kernel) for d in plan.dispatches] == [
        ("embed", "copy_rows"), ("", "storage_copy_b2t"), ("relu", "unary_texture")]
    assert plan.tensors["y"].storage == "texture" and plan.tensors["e"].storage == "buffer"
    assert list(_moved(plan)) == ["embed"] and "runs in buffer storage only" in _moved(plan)["embed"]
    with pytest.raises(UnsupportedError, match="int32 input 'ids.int32' needs buffer storage"):
        make_plan(gpu, KNOWN_PROFILES["mali-g715"], "texture")


def _crossing_model():
    """Tensors that cross between the storages both ways, channels-packed (rank 4, 6 channels: a partial texel) and
    width-packed, with a graph output in each storage: under images of at most 8 texels a side, the W-wide Concat,
    and the pool, MatMul and ReduceMax reading or writing wide tensors run in buffers."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Relu", ["x"], ["r"]),                                    # [1, 6, 5, 5] texture
             helper.make_node("Concat", ["r", "x"], ["wide"], axis=3),                   # [1, 6, 5, 10] buffer
             helper.make_node("MaxPool", ["wide"], ["p"], kernel_shape=[1, 2], strides=[1, 2]),   # buffer
             helper.make_node("Sigmoid", ["p"], ["s"]),                                  # texture
             helper.make_node("Reshape", ["s", "shape"], ["rows"]),                      # [1, 6, 25] texture
             helper.make_node("MatMul", ["rows", "w"], ["h"]),                           # [1, 6, 40] buffer
             helper.make_node("ReduceMax", ["h"], ["m"], axes=[2], keepdims=1),          # buffer
             helper.make_node("Tanh", ["m"], ["y"])]                                     # [1, 6, 1] texture
    inits = {"shape": np.array([1, 6, 25], np.int64), "w": rng.standard_normal((25, 40)).astype(np.float32)}
    return make_model(nodes, {"x": (1, 6, 5, 5)}, ["wide", "y"], inits)


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("fp16", 1e-2)])
def test_mixed_plan_runs_as_onnxruntime(monkeypatch, precision, tol):
    fake_profile(monkeypatch, vendor="adreno", max_image_3d=8)
    m = _crossing_model()
    x = rand(1, 6, 5, 5, seed=4)
    refs = onnxruntime_run(m, {"x": x})
    with Session(m, storage="auto", precision=precision, options={"poison": True}) as s:
        outs = s.run(None, {"x": x})
        plan = s.plan
        assert set(_moved(plan)) == {"Concat_1", "MaxPool_2", "MatMul_5", "ReduceMax_6"}
        kernels = [d.kernel.removesuffix("_half") for d in plan.dispatches]
        assert kernels.count("storage_copy_t2b") == 3 and kernels.count("storage_copy_b2t") == 2   # r, x, rows; p, m
        assert {plan.tensors[n].storage for n in ("wide", "p", "h", "m")} == {"buffer"}
        assert {plan.tensors[n].storage for n in ("x", "r", "s", "y")} == {"texture"}
        again = s.run(None, {"x": x})
    for o, a, r, name in zip(outs, again, refs, ("wide", "y")):
        compare(o, r, tol, f"{precision} {name}")
        np.testing.assert_array_equal(a, o)
    with pytest.raises(UnsupportedError, match=r"tensor 'wide' \[1, 6, 5, 10\] needs a texture of extents "
                                               r"\(10, 5, 2\), beyond this device's limit of 8"):
        Session(m, storage="texture")


def test_minirt_plan_names_the_buffer_nodes(monkeypatch):
    from minirt.cli import format_plan
    fake_profile(monkeypatch, vendor="adreno", max_image_3d=8)
    with Session(_crossing_model(), storage="auto") as s:
        text = format_plan(s.plan)
    assert "mixed storage: 4 node(s) in buffers where textures do not fit or have no kernel (Concat_1, MaxPool_2, " \
           "MatMul_5, ReduceMax_6; see the notes), 5 storage copies" in text
    assert "Concat_1: storage: buffer (tensor 'wide' [1, 6, 5, 10] needs a texture of extents (10, 5, 2)" in text
