"""Small random-weight transformer text models (models/families/, exported by tools/export_text_families.py: BERT,
GPT-2, DistilBERT, the T5 encoder and the Whisper decoder, each by TorchScript at opset 17 and by torch.export at
opset 20) against onnxruntime in both storages, on fresh seeded token ids and attention masks (int64, some rows
padded at the end): their masks, position ids and index tensors are computed on the host each run
(minirt/host.py), the rest on the GPU; one, with an LM head, in mixed storage (textures, and buffers where the
device's images cannot hold the logits). Also: what cannot run is refused at load with every node named at once, and
bad token ids or masks are InputErrors naming the tensor. Every attention runs as one fused Attention dispatch."""
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from minirt import InputError, Session, UnsupportedError
from oracle import STORAGES, cosine, fake_profile, onnxruntime_run, with_lm_head

F32 = TensorProto.FLOAT
FAMILIES = Path(__file__).resolve().parents[1] / "models" / "families"
NAMES = ["bert", "gpt2", "distilbert", "t5_encoder", "whisper_decoder"]
VOCAB, BATCH, SEQ = 1000, 2, 16
ATTENTIONS = {"whisper_decoder": 4}     # a layer's attentions (self, and cross in the decoder) x 2 layers; else 2


def feeds_for(model, seed):
    rng = np.random.default_rng(seed)
    mask = np.ones((BATCH, SEQ), np.int64)
    mask[1, SEQ - 1 - int(rng.integers(1, 6)):] = 0          # the second row padded at the end
    feeds = {"input_ids": rng.integers(0, VOCAB, (BATCH, SEQ)).astype(np.int64), "attention_mask": mask}
    if any(i.name == "encoder_hidden_states" for i in model.graph.input):
        feeds["encoder_hidden_states"] = rng.standard_normal((BATCH, 24, 64)).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", [n + s for n in NAMES for s in ("", "_dynamo")])
def test_text_family_matches_onnxruntime(name):
    model = onnx.load(FAMILIES / f"{name}.onnx")
    feeds = feeds_for(model, seed=len(name))
    (ref,) = onnxruntime_run(model, feeds)
    for storage in STORAGES:
        with Session(model, storage=storage, options={"poison": True}) as s:
            (out,) = s.run(None, feeds)
            # each attention one fused dispatch, its mask (computed on the host) read by the kernel
            ops = [d.op for d in s.plan.dispatches if "combine" not in d.kernel]
            assert ops.count("Attention") == ATTENTIONS.get(name.replace("_dynamo", ""), 2), ops
            assert not {"Softmax", "ReplaceNaN", "MatMul"} & set(ops), ops
            if name.startswith("gpt2"):     # its tanh GELU (gelu_new) one dispatch a layer, not 8
                assert ops.count("Gelu") == 2 and not {"Tanh", "Pow"} & set(ops), ops
        assert out.shape == ref.shape
        assert cosine(out, ref) >= 0.99999, f"{name} {storage}: cosine {cosine(out, ref)}"
        err, scale = np.abs(out.astype(np.float64) - ref).max(), np.abs(ref).max()
        assert err <= 1e-3 * scale, f"{name} {storage}: max abs err {err:.3g}, max|ref| {scale:.3g}"


def test_a_family_in_mixed_storage_matches_onnxruntime(monkeypatch):
    """The Whisper decoder with an LM head, storage "auto" on an Adreno whose images hold at most 128 texels a side:
    the logits [2, 16, 1000] (250 texels wide) and the head in buffers, the decoder in textures, as exact as the
    buffer and texture runs."""
    model = with_lm_head(onnx.load(FAMILIES / "whisper_decoder.onnx"), VOCAB, 64)
    feeds = feeds_for(model, seed=9)
    (ref,) = onnxruntime_run(model, feeds)
    fake_profile(monkeypatch, vendor="adreno", max_image_3d=128)
    with Session(model, storage="auto", options={"poison": True}) as s:
        (out,) = s.run(None, feeds)
        storages = {t.storage for n, t in s.plan.tensors.items() if n != "logits" and t.role == "intermediate"}
        assert s.plan.tensors["logits"].storage == "buffer" and "texture" in storages
        assert [n for n, notes in s.plan.notes.items() if any(x.startswith("storage: buffer") for x in notes)] == \
            ["lm_head"]
    assert cosine(out, ref) >= 0.99999
    err, scale = np.abs(out.astype(np.float64) - ref).max(), np.abs(ref).max()
    assert err <= 1e-3 * scale, f"mixed storage: max abs err {err:.3g}, max|ref| {scale:.3g}"


def test_ids_and_masks_are_checked_naming_the_tensor():
    model = onnx.load(FAMILIES / "bert.onnx")
    feeds = feeds_for(model, seed=3)
    for storage in STORAGES:
        with Session(model, storage=storage) as s:
            (ref,) = s.run(None, feeds)
            # int32 ids and masks are taken for the int64 inputs (the same values, the same result)
            (same,) = s.run(None, {k: v.astype(np.int32) for k, v in feeds.items()})
            np.testing.assert_array_equal(same, ref)
            with pytest.raises(InputError, match="input 'input_ids' must be int64 \\(or int32\\), got float32"):
                s.run(None, {**feeds, "input_ids": feeds["input_ids"].astype(np.float32)})
            with pytest.raises(InputError, match="input 'attention_mask' expects shape"):
                s.run(None, {**feeds, "attention_mask": feeds["attention_mask"][:, :, None]})
            for bad in (VOCAB, -VOCAB - 1):     # onnxruntime refuses these too; minirt never clamps them
                ids = feeds["input_ids"].copy()
                ids[1, 4] = bad
                with pytest.raises(InputError, match=f"{bad}.*input_ids|input_ids.*{bad}|input_ids.*out of range"):
                    s.run(None, {**feeds, "input_ids": ids})
            (again,) = s.run(None, feeds)       # the Session stays usable
            np.testing.assert_array_equal(again, ref)


def test_negative_ids_count_from_the_end_as_in_onnxruntime():
    model = onnx.load(FAMILIES / "gpt2_dynamo.onnx")
    feeds = feeds_for(model, seed=4)
    feeds["input_ids"][0, :3] = [-1, -VOCAB, -7]
    (ref,) = onnxruntime_run(model, feeds)
    for storage in STORAGES:
        with Session(model, storage=storage) as s:
            (out,) = s.run(None, feeds)
        assert cosine(out, ref) >= 0.99999


def _int_model(nodes, outputs=("y",)):
    g = helper.make_graph(nodes, "text", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
                                          helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 4])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_what_cannot_run_is_refused_at_load_with_every_node_named():
    # ops minirt does not have: every one named at once
    m = _int_model([helper.make_node("NonZero", ["mask"], ["nz"], name="the_nonzero"),
                    helper.make_node("Unique", ["mask"], ["u"], name="the_unique"),
                    helper.make_node("Relu", ["x"], ["y"])])
    with pytest.raises(UnsupportedError) as e:
        Session(m)
    assert all(s in str(e.value) for s in ("NonZero", "the_nonzero", "Unique", "the_unique"))
    # ops minirt has, fed what they cannot take: a host-only op reading a GPU tensor, a GPU op reading an integer
    # tensor as data, a Reshape to a shape computed at run time
    c = helper.make_tensor("c", TensorProto.FLOAT, [], [0.0])
    m = _int_model([helper.make_node("Cast", ["mask"], ["b"], to=TensorProto.BOOL),
                    helper.make_node("Constant", [], ["zero"], value=c),
                    helper.make_node("Where", ["b", "x", "zero"], ["w"], name="gpu_where"),
                    helper.make_node("Shape", ["mask"], ["s"]),
                    helper.make_node("Mul", ["s", "s"], ["s2"]),
                    helper.make_node("ReduceSum", ["mask"], ["n"], keepdims=0),
                    helper.make_node("Reshape", ["x", "n"], ["r"], name="runtime_reshape"),
                    helper.make_node("Add", ["w", "r"], ["y"])])
    with pytest.raises(UnsupportedError) as e:
        Session(m)
    msg = str(e.value)
    assert "gpu_where" in msg and "computed on the GPU" in msg
    assert "runtime_reshape" in msg and "constant" in msg


def test_outputs_computed_on_the_host_come_back_with_their_dtype():
    """A graph output computed from integer inputs alone (a position id, a mask) is returned as the host made it."""
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    m = _int_model([helper.make_node("Constant", [], ["one"], value=one),
                    helper.make_node("CumSum", ["mask", "ax"], ["cs"]),
                    helper.make_node("Sub", ["cs", "one"], ["pos"]),
                    helper.make_node("Relu", ["x"], ["y"])], outputs=("y", "pos"))
    m.graph.initializer.append(helper.make_tensor("ax", TensorProto.INT64, [], [1]))
    m.graph.output[1].type.tensor_type.elem_type = TensorProto.INT64
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4)).astype(np.float32), "mask": np.array([[1, 1, 1, 1], [1, 1, 0, 0]])}
    ref = onnxruntime_run(m, feeds)
    for storage in STORAGES:
        with Session(m, storage=storage) as s:
            y, pos = s.run(None, feeds)
        assert pos.dtype == np.int64 and (pos == ref[1]).all()
        np.testing.assert_array_equal(y, ref[0])


def test_what_crosses_to_the_gpu():
    """An embedding table that no storage buffer of the device holds (GPT-2's 147 MiB on lavapipe's 128 MiB range)
    is read on the host, and never uploaded; one that fits is gathered on the GPU by int32 rows. Host nodes that
    compute the same (each layer's mask) run once and cross once."""
    from minirt.infer import bind_inputs, prepare
    from minirt.loaders import load
    g = load(FAMILIES / "gpt2.onnx")
    shapes = {"input_ids": (BATCH, SEQ), "attention_mask": (BATCH, SEQ)}
    small = prepare(bind_inputs(g, shapes), host=True, runtime_gather=VOCAB * 64 * 4 - 1)
    assert "inner.wte.weight" not in small.tensors
    assert any(n.op == "Gather" for n in small.host.nodes) and all(b.rows == 0 for b in small.host.boundary)
    fits = prepare(bind_inputs(g, shapes), host=True, runtime_gather=VOCAB * 64 * 4)
    assert "inner.wte.weight" in fits.tensors
    # the ids as int32 rows, and one additive mask: the exporter's mask made again for each layer is made once
    assert sorted(b.rows for b in fits.host.boundary) == [0, VOCAB]


def test_a_host_shape_that_depends_on_the_values_is_an_input_error():
    """ConstantOfShape of a length read from the mask: planned from inputs of ones, refused before allocating when a
    run's values would give another shape (a mask of huge values makes nothing huge)."""
    m = _int_model([helper.make_node("ReduceSum", ["mask"], ["n"], keepdims=1),
                    helper.make_node("ConstantOfShape", ["n"], ["c"], value=helper.make_tensor("v", F32, [1], [2.0])),
                    helper.make_node("Relu", ["x"], ["y"])], outputs=("y", "c"))
    x = np.ones((2, 4), np.float32)
    with Session(m) as s:
        y, c = s.run(None, {"x": x, "mask": np.ones((2, 4), np.int64)})      # 8 ones: the planned shape
        assert c.shape == (8,) and (c == 2).all()
        for mask in (np.zeros((2, 4), np.int64), np.full((2, 4), 10**15, np.int64)):
            with pytest.raises(InputError, match="depends on the values of the inputs"):
                s.run(None, {"x": x, "mask": mask})
        s.run(None, {"x": x, "mask": np.ones((2, 4), np.int64)})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_one_session_runs_new_batch_and_sequence_lengths(precision):
    """The TorchScript exports' dynamic batch and sequence: each new shape is planned at its first run (the host part
    with it); fp16 keeps the mask arithmetic on the host exact and the GPU part within fp16's rounding."""
    model = onnx.load(FAMILIES / "gpt2.onnx")
    tol = 1e-5 if precision == "fp32" else 1e-2
    with Session(model, storage="buffer", precision=precision, options={"poison": True}) as s:
        for batch, seq in ((1, 9), (3, 5), (1, 9)):
            rng = np.random.default_rng(batch * seq)
            feeds = {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64),
                     "attention_mask": np.ones((batch, seq), np.int64)}
            feeds["attention_mask"][-1, -2:] = 0
            (ref,) = onnxruntime_run(model, feeds)
            (out,) = s.run(None, feeds)
            assert np.abs(out - ref).max() <= tol * np.abs(ref).max(), (precision, batch, seq)


@pytest.mark.parametrize("name", ["bert", "gpt2_dynamo", "t5_encoder"])
def test_a_wholly_padded_row_at_fp32_and_fp16(name):
    """A batch row that is all padding (every key masked by float32's min in each of its query rows: uniform weights,
    as onnxruntime gives), at fp32 and at fp16 on the scalar half kernel and on attention_cmr (emulated: the layout of
    an H200's registers)."""
    model = onnx.load(FAMILIES / f"{name}.onnx")
    feeds = feeds_for(model, seed=7)
    feeds["attention_mask"][0] = 0
    (ref,) = onnxruntime_run(model, feeds)
    for precision, options, tol in (("fp32", {}, 1e-5), ("fp16", {}, 1e-2), ("fp16", {"coopmat": "emulate"}, 1e-2)):
        with Session(model, storage="buffer", precision=precision, options={"poison": True, **options}) as s:
            (out,) = s.run(None, feeds)
            kernels = {d.kernel for d in s.plan.dispatches if d.op == "Attention"}
        assert ("attention_cmr_emu_half" in kernels) == ("coopmat" in options), kernels
        assert np.abs(out - ref).max() <= tol * np.abs(ref).max(), (precision, options)
