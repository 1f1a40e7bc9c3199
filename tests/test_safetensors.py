"""Safetensors: Whisper encoders built from Hugging Face checkpoints, ONNX initializers from a weights
file, the CTranslate2 converter, and the real tiny.en weights against onnxruntime."""
import importlib.util
import json
import pathlib
import struct

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from safetensors.numpy import save_file

from minirt import Session
from minirt.errors import ModelError
from minirt.infer import prepare
from minirt.loaders import load
from minirt.loaders.safetensors_loader import SafetensorsFile, apply_weights, read_safetensors
from minirt.graph_reference import run_graph
from oracle import cosine, make_model, onnxruntime_run, rand

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "models" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


we = _module("whisper_encoder")
ct2 = _module("ct2_to_safetensors")

SMALL = dict(size="tiny", layers=1, n_frames=200)      # d 384, 6 heads, 100 positions
GRAPH_OPS = {"Conv", "Gelu", "Transpose", "Add", "LayerNormalization", "MatMul", "Reshape", "Softmax", "Mul"}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(ONNX model, HF state dict, path of model.safetensors with no config.json)."""
    m = we.build_whisper_encoder(opset=20, seed=3, **SMALL)
    hf = we.hf_state_dict(m)
    path = tmp_path_factory.mktemp("small") / "model.safetensors"
    save_file(hf, str(path))
    return m, hf, path


@pytest.fixture(scope="module")
def x_small():
    return we.sample_input(80, 200)


@pytest.fixture(scope="module")
def ort_small(small, x_small):
    return onnxruntime_run(small[0], {"input_features": x_small})[0]


def _save(d, tmp_path, name="model.safetensors", config=None):
    p = tmp_path / name
    save_file({k: np.ascontiguousarray(v) for k, v in d.items()}, str(p))
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    return p


# -- HF checkpoint -> Graph --------------------------------------------------------------------------

def test_hf_state_dict_round_trips_through_the_builder(small):
    m, hf, _ = small
    assert "model.encoder.layers.0.self_attn.q_proj.weight" in hf and "model.encoder.layers.0.self_attn.k_proj.bias" not in hf
    assert hf["model.encoder.layers.0.fc1.weight"].shape == (1536, 384)      # torch Linear: [out, in]
    again = we.build_whisper_encoder(opset=20, weights=hf)
    assert again.graph.SerializeToString() == m.graph.SerializeToString()


def test_graph_is_plain_onnx_ops(small):
    _, _, path = small
    g = load(path)
    assert {n.op for n in g.nodes} <= GRAPH_OPS
    assert g.opset == 20 and all(n.attrs["_opset"] == 20 for n in g.nodes)
    assert g.source == str(path)
    assert g.inputs == ["input_features"] and g.outputs == ["last_hidden_state"]
    assert g.tensor("input_features").shape == (1, 80, 200)
    assert prepare(g.copy()).tensor("last_hidden_state").shape == (1, 100, 384)


def test_graph_matches_onnxruntime_in_float64_reference(small, x_small, ort_small):
    y = run_graph(load(small[2]), {"input_features": x_small})["last_hidden_state"]
    assert cosine(y, ort_small) >= 0.99999
    np.testing.assert_allclose(y, ort_small, atol=1e-4 * np.abs(ort_small).max())


def test_session_matches_onnxruntime(small, x_small, ort_small):
    with Session(small[2]) as s:
        y = s.run(x_small)
    assert y.shape == ort_small.shape
    assert cosine(y, ort_small) >= 0.99999
    np.testing.assert_allclose(y, ort_small, atol=1e-3 * np.abs(ort_small).max())


@pytest.mark.parametrize("prefix", ["model.encoder.", "encoder.", ""])
def test_prefixes_and_whole_model_checkpoints(small, x_small, ort_small, tmp_path, prefix):
    _, hf, _ = small
    d = {prefix + k[len("model.encoder."):]: v for k, v in hf.items()}
    if prefix == "model.encoder.":   # a whole WhisperForConditionalGeneration: decoder tensors are ignored
        d["model.decoder.layers.0.fc1.weight"] = rand(8, 4, seed=1)
        d["model.decoder.embed_tokens.weight"] = rand(10, 384, seed=2)
        d["proj_out.weight"] = rand(10, 384, seed=2)
    g = load(_save(d, tmp_path))
    np.testing.assert_array_equal(g.tensor(prefix + "conv1.weight").data, hf["model.encoder.conv1.weight"])
    y = run_graph(g, {"input_features": x_small})["last_hidden_state"]
    assert cosine(y, ort_small) >= 0.99999


def test_half_precision_checkpoints_widen_to_float32(small, tmp_path):
    _, hf, _ = small
    k = "model.encoder.layers.0.fc1.weight"
    g16 = load(_save({n: v.astype(np.float16) for n, v in hf.items()}, tmp_path, "f16.safetensors"))
    t = g16.tensor(k + "^T")
    assert t.data.dtype == np.float32
    np.testing.assert_array_equal(t.data, hf[k].astype(np.float16).astype(np.float32).T)
    # bf16: numpy has none, so write the file by hand (top 16 bits of each float32)
    bits = {n: (np.ascontiguousarray(v, np.float32).view(np.uint32) >> 16).astype("<u2") for n, v in hf.items()}
    header, off, blobs = {}, 0, []
    for n, b in bits.items():
        raw = b.tobytes()
        header[n] = {"dtype": "BF16", "shape": list(b.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    p = tmp_path / "bf16.safetensors"
    p.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    gb = load(p)
    want = (bits[k].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(gb.tensor(k + "^T").data, want.T)
    assert np.abs(want - hf[k]).max() <= np.abs(hf[k]).max() * 2 ** -7


def test_config_inferred_without_config_json(small):
    g = load(small[2])
    assert g.tensor("const_heads_shape").data.tolist() == [1, 100, 6, 64]      # heads = 384 / 64
    assert sum(n.op == "Softmax" for n in g.nodes) == 1


def test_config_json_beside_the_file_is_used(tmp_path, x_small):
    m = we.build_whisper_encoder(opset=17, seed=4, heads=3, **SMALL)   # 3 heads of 128: only config.json says so
    p = _save(we.hf_state_dict(m), tmp_path, config={
        "model_type": "whisper", "d_model": 384, "encoder_layers": 1, "encoder_attention_heads": 3,
        "num_mel_bins": 80, "max_source_positions": 100, "activation_function": "gelu"})
    g = load(p)
    assert g.tensor("const_heads_shape").data.tolist() == [1, 100, 3, 128]
    ref = onnxruntime_run(m, {"input_features": x_small})[0]
    y = run_graph(g, {"input_features": x_small})["last_hidden_state"]
    assert cosine(y, ref) >= 0.99999


def test_unrelated_config_json_is_ignored(small, tmp_path):
    _, hf, _ = small
    p = _save(hf, tmp_path, config={"alignment_heads": [[1, 0]], "suppress_ids": [1, 2]})   # CTranslate2's
    assert load(p).tensor("const_heads_shape").data.tolist() == [1, 100, 6, 64]


def test_config_json_that_disagrees_with_the_tensors(small, tmp_path):
    _, hf, _ = small
    p = _save(hf, tmp_path, config={"model_type": "whisper", "d_model": 512, "encoder_layers": 1})
    with pytest.raises(ModelError, match=r"conv1\.weight.*d_model 512"):
        load(p)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper", "encoder_layers": 2}))
    with pytest.raises(ModelError, match=r"config\.json says encoder_layers 2 but the checkpoint has 1"):
        load(p)


def _fake_checkpoint(path, d, n_mels, n_pos, layers, prefix="model.encoder."):
    """A checkpoint of the right shapes (zeros, fp16: quick to write even at large-v3 width)."""
    from minirt.loaders.safetensors_loader import encoder_param_shapes
    shapes = encoder_param_shapes({"d_model": d, "num_mel_bins": n_mels, "max_source_positions": n_pos,
                                   "encoder_layers": layers})
    save_file({prefix + k: np.zeros(s, np.float16) for k, s in shapes.items()}, str(path))
    return path


@pytest.mark.parametrize("size", ["base", "small", "medium", "large-v3"])
def test_every_size_builds_from_shapes(tmp_path, size):
    d, _, heads, n_mels = we.SIZES[size]
    g = load(_fake_checkpoint(tmp_path / "model.safetensors", d, n_mels, 1500, 1))
    assert g.tensor("input_features").shape == (1, n_mels, 3000)
    assert g.tensor("const_heads_shape").data.tolist() == [1, 1500, heads, 64]
    assert prepare(g.copy()).tensor("last_hidden_state").shape == (1, 1500, d)
    if size == "large-v3":
        assert n_mels == 128 and heads == 20


# -- errors of a checkpoint --------------------------------------------------------------------------

def test_missing_extra_and_misshaped_encoder_tensors(small, tmp_path):
    _, hf, _ = small
    d = dict(hf)
    del d["model.encoder.layers.0.fc2.bias"]
    with pytest.raises(ModelError, match=r"missing: 'model\.encoder\.layers\.0\.fc2\.bias'"):
        load(_save(d, tmp_path, "a.safetensors"))
    d = dict(hf, **{"model.encoder.layers.0.self_attn.k_proj.bias": np.zeros(384, np.float32)})
    with pytest.raises(ModelError, match=r"does not use: 'model\.encoder\.layers\.0\.self_attn\.k_proj\.bias'"):
        load(_save(d, tmp_path, "b.safetensors"))
    d = dict(hf, **{"model.encoder.layers.0.fc1.weight": np.zeros((1536, 380), np.float32)})
    with pytest.raises(ModelError, match=r"'model\.encoder\.layers\.0\.fc1\.weight' is \[1536, 380\], expected \[1536, 384\]"):
        load(_save(d, tmp_path, "c.safetensors"))
    with pytest.raises(ModelError, match="not a Whisper checkpoint"):
        load(_save({"lm_head.weight": np.zeros((4, 4), np.float32)}, tmp_path, "d.safetensors"))


def test_truncated_and_corrupt_files(small, tmp_path):
    raw = small[2].read_bytes()
    p = tmp_path / "cut.safetensors"
    p.write_bytes(raw[:-1000])
    with pytest.raises(ModelError, match=r"cut\.safetensors: truncated: tensor '.*' needs bytes"):
        load(p)
    p.write_bytes(raw[:5])
    with pytest.raises(ModelError, match=r"cut\.safetensors: not a safetensors file"):
        load(p)
    p.write_bytes(raw[:100])
    with pytest.raises(ModelError, match=r"cut\.safetensors: corrupt or truncated safetensors file \(header length"):
        load(p)
    n = struct.unpack("<Q", raw[:8])[0]
    p.write_bytes(raw[:8] + b"{" + b"x" * (n - 1) + raw[8 + n:])
    with pytest.raises(ModelError, match=r"cut\.safetensors: corrupt safetensors header"):
        load(p)
    p.write_bytes(raw + b"\0" * 16)
    with pytest.raises(ModelError, match=r"cut\.safetensors: corrupt safetensors file: the tensors cover"):
        load(p)
    with pytest.raises(ModelError, match="no such safetensors file"):
        load(tmp_path / "absent.safetensors")


def test_weights_argument_is_refused_for_a_checkpoint(small):
    with pytest.raises(ModelError, match="weights= applies to ONNX models"):
        load(small[2], weights=small[2])


# -- ONNX + weights= ----------------------------------------------------------------------------------

def _initializers(m):
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def test_onnx_with_weights_file_matches_onnxruntime(tmp_path, x_small):
    model_a = we.build_whisper_encoder(opset=17, seed=0, **SMALL)      # the structure, with weights A
    model_b = we.build_whisper_encoder(opset=17, seed=5, **SMALL)      # same names, weights B
    onnx.save(model_a, tmp_path / "model.onnx")
    w = _save(_initializers(model_b), tmp_path, "weights.safetensors")
    ref = onnxruntime_run(model_b, {"input_features": x_small})[0]
    with Session(str(tmp_path / "model.onnx"), weights=str(w)) as s:
        y = s.run(x_small)
    assert cosine(y, ref) >= 0.99999
    np.testing.assert_allclose(y, ref, atol=1e-3 * np.abs(ref).max())


def _tiny_onnx():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Reshape", ["a", "shape"], ["y"])]
    return make_model(nodes, {"x": (2, 4)}, ["y"],
                      {"w": rand(4, 3, seed=0), "b": rand(3, seed=1), "shape": np.array([3, 2], np.int64)})


def test_apply_weights_replaces_by_name(tmp_path):
    w, b = rand(4, 3, seed=7), rand(3, seed=8)
    p = _save({"w": w.astype(np.float16), "b": b}, tmp_path)       # fp16 in the file, float32 initializer
    g = load(_tiny_onnx(), weights=p)
    assert g.tensor("w").data.dtype == np.float32
    np.testing.assert_array_equal(g.tensor("w").data, w.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(g.tensor("b").data, b)
    np.testing.assert_array_equal(g.tensor("shape").data, [3, 2])   # integer initializers may stay in the model
    x = rand(2, 4, seed=9)
    np.testing.assert_allclose(run_graph(g, {"x": x})["y"], (x @ g.tensor("w").data + b).reshape(3, 2), rtol=1e-6)


def test_apply_weights_errors_name_the_tensor_and_file(tmp_path):
    m = _tiny_onnx()
    w, b = rand(4, 3, seed=7), rand(3, seed=8)
    cases = [({"w": w}, r"missing from it: 'b'"),
             ({"w": w, "b": b, "w2": w}, r"name no initializer of <ModelProto>: 'w2'"),
             ({"w": w.T.copy(), "b": b}, r"tensor 'w' has shape \[3, 4\] but the model's initializer is \[4, 3\]"),
             ({"w": w, "b": b, "shape": np.array([6.0], np.float32)}, r"tensor 'shape' has shape \[1\]")]
    for i, (d, msg) in enumerate(cases):
        p = _save(d, tmp_path, f"w{i}.safetensors")
        with pytest.raises(ModelError, match=rf"w{i}\.safetensors: weights do not match the model: .*{msg}"):
            load(m, weights=p)
    p = _save({"w": w, "b": b, "w2": w}, tmp_path, "extra.safetensors")
    apply_weights(load(m), p, allow_extra=True)
    raw = _save({"w": w, "b": b}, tmp_path, "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(raw[:-4])
    with pytest.raises(ModelError, match=r"cut\.safetensors: truncated: tensor '.' needs bytes"):
        load(m, weights=tmp_path / "cut.safetensors")
    with pytest.raises(ModelError, match=r"nowhere\.safetensors: no such safetensors file"):
        load(m, weights=tmp_path / "nowhere.safetensors")


def test_apply_weights_integer_mismatch(tmp_path):
    p = _save({"w": rand(4, 3), "b": rand(3), "shape": np.array([3.0, 2.0], np.float32)}, tmp_path)
    with pytest.raises(ModelError, match=r"tensor 'shape' is float32 but the model's initializer is int64"):
        load(_tiny_onnx(), weights=p)


# -- CTranslate2 model.bin ----------------------------------------------------------------------------

def write_ct2(path, variables, aliases=None, version=6):
    """A CTranslate2 model.bin, written from the format description (independent of the reader)."""
    def s(x):
        b = x.encode() + b"\0"
        return struct.pack("<H", len(b)) + b
    codes = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
             np.dtype(np.float16): 4}
    out = [struct.pack("<I", version), s("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, a in variables.items():
        a = np.ascontiguousarray(a)
        out += [s(name), struct.pack("<B", a.ndim), struct.pack(f"<{a.ndim}I", *a.shape),
                struct.pack("<BI", codes[a.dtype], a.nbytes), a.tobytes()]
    aliases = aliases or {}
    out.append(struct.pack("<I", len(aliases)))
    for k, v in aliases.items():
        out += [s(k), s(v)]
    pathlib.Path(path).write_bytes(b"".join(out))


def _ct2_from_hf(hf, decoder_layers=1, vocab=10):
    """CTranslate2 variables for an HF encoder dict (and a small random decoder)."""
    e = {k[len("model.encoder."):]: v for k, v in hf.items()}
    d = e["conv1.weight"].shape[0]
    v = {"encoder/num_heads": np.array(d // 64, np.int16)}
    for c in ("conv1", "conv2"):
        v[f"encoder/{c}/weight"], v[f"encoder/{c}/bias"] = e[f"{c}.weight"], e[f"{c}.bias"]
    v["encoder/position_encodings/encodings"] = e["embed_positions.weight"]
    n = 1 + max(int(k.split(".")[1]) for k in e if k.startswith("layers."))
    for i in range(n):
        p, c = f"layers.{i}.", f"encoder/layer_{i}/"
        v[c + "self_attention/linear_0/weight"] = np.concatenate([e[p + f"self_attn.{x}_proj.weight"] for x in "qkv"])
        v[c + "self_attention/linear_0/bias"] = np.concatenate(
            [e[p + "self_attn.q_proj.bias"], np.zeros(d, np.float32), e[p + "self_attn.v_proj.bias"]])
        for ct, h in (("self_attention/linear_1", "self_attn.out_proj"), ("ffn/linear_0", "fc1"), ("ffn/linear_1", "fc2")):
            v[c + ct + "/weight"], v[c + ct + "/bias"] = e[p + h + ".weight"], e[p + h + ".bias"]
        for ct, h in (("self_attention/layer_norm", "self_attn_layer_norm"), ("ffn/layer_norm", "final_layer_norm")):
            v[c + ct + "/gamma"], v[c + ct + "/beta"] = e[p + h + ".weight"], e[p + h + ".bias"]
    v["encoder/layer_norm/gamma"], v["encoder/layer_norm/beta"] = e["layer_norm.weight"], e["layer_norm.bias"]
    r = np.random.default_rng(0)

    def f(*s):
        return r.standard_normal(s).astype(np.float32)
    v.update({"decoder/embeddings/weight": f(vocab, d), "decoder/position_encodings/encodings": f(16, d),
              "decoder/num_heads": np.array(d // 64, np.int16), "decoder/activation": np.array(3, np.int8),
              "decoder/pre_norm": np.array(1, np.int8), "decoder/layer_norm/gamma": f(d), "decoder/layer_norm/beta": f(d)})
    for i in range(decoder_layers):
        c = f"decoder/layer_{i}/"
        v.update({c + "self_attention/linear_0/weight": f(3 * d, d),
                  c + "self_attention/linear_0/bias": np.concatenate([f(d), np.zeros(d, np.float32), f(d)]),
                  c + "self_attention/linear_1/weight": f(d, d), c + "self_attention/linear_1/bias": f(d),
                  c + "attention/linear_0/weight": f(d, d), c + "attention/linear_0/bias": f(d),
                  c + "attention/linear_1/weight": f(2 * d, d),
                  c + "attention/linear_1/bias": np.concatenate([np.zeros(d, np.float32), f(d)]),
                  c + "attention/linear_2/weight": f(d, d), c + "attention/linear_2/bias": f(d),
                  c + "ffn/linear_0/weight": f(4 * d, d), c + "ffn/linear_0/bias": f(4 * d),
                  c + "ffn/linear_1/weight": f(d, 4 * d), c + "ffn/linear_1/bias": f(d)})
        for ln in ("self_attention", "attention", "ffn"):
            v[c + ln + "/layer_norm/gamma"], v[c + ln + "/layer_norm/beta"] = f(d), f(d)
    return v, {"decoder/projection/weight": "decoder/embeddings/weight"}


def test_ct2_converter_round_trip(small, tmp_path, x_small, ort_small):
    _, hf, _ = small
    v, aliases = _ct2_from_hf(hf)
    write_ct2(tmp_path / "model.bin", {k: (a.astype(np.float16) if a.dtype == np.float32 else a) for k, a in v.items()},
              aliases)
    cfg = ct2.convert(tmp_path / "model.bin", tmp_path / "out" / "model.safetensors")
    assert cfg["d_model"] == 384 and cfg["encoder_layers"] == 1 and cfg["decoder_layers"] == 1
    assert cfg["max_source_positions"] == 100 and cfg["tie_word_embeddings"] is True
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == cfg
    got = read_safetensors(tmp_path / "out" / "model.safetensors")
    for k, a in hf.items():
        np.testing.assert_array_equal(got[k], a.astype(np.float16).astype(np.float32), err_msg=k)
    assert "model.decoder.layers.0.encoder_attn.v_proj.bias" in got and "proj_out.weight" not in got
    assert not any(k.endswith("k_proj.bias") for k in got)
    y = run_graph(load(tmp_path / "out" / "model.safetensors"), {"input_features": x_small})["last_hidden_state"]
    assert cosine(y, ort_small) >= 0.9999     # fp16 weights


def test_ct2_reader_refuses_truncated_leftover_and_unknown(small, tmp_path):
    v, aliases = _ct2_from_hf(small[1])
    p = tmp_path / "model.bin"
    write_ct2(p, v, aliases)
    raw = p.read_bytes()
    for cut in (len(raw) - 3, len(raw) // 2, 10):
        p.write_bytes(raw[:cut])
        with pytest.raises(ct2.CT2FormatError, match=r"model\.bin: truncated"):
            ct2.read_ct2(p)
    p.write_bytes(raw + b"\0")
    with pytest.raises(ct2.CT2FormatError, match=r"1 byte\(s\) left over"):
        ct2.read_ct2(p)
    write_ct2(p, dict(v, **{"encoder/layer_0/mystery/weight": np.zeros(3, np.float32)}), aliases)
    with pytest.raises(ct2.CT2FormatError, match=r"does not map: \['encoder/layer_0/mystery/weight'\]"):
        ct2.ct2_to_hf(*ct2.read_ct2(p)[1:])
    bad = dict(v)
    bad["encoder/layer_0/self_attention/linear_0/bias"] = np.ones(3 * 384, np.float32)
    with pytest.raises(ct2.CT2FormatError, match="k part of 'encoder/layer_0/self_attention/linear_0/bias' is not zero"):
        ct2.ct2_to_hf(bad, aliases)


# -- real weights: OpenAI Whisper tiny.en (fixture tiny_en: tests/conftest.py) ---------------------------

def test_tiny_en_converted_checkpoint(tiny_en):
    cfg = json.loads((tiny_en.parent / "config.json").read_text())
    assert (cfg["d_model"], cfg["encoder_layers"], cfg["encoder_attention_heads"], cfg["num_mel_bins"],
            cfg["vocab_size"]) == (384, 4, 6, 80, 51864)
    f = SafetensorsFile(tiny_en)
    assert f.dtype("model.encoder.conv1.weight") == "F16"
    assert len([k for k in f.keys() if k.startswith("model.encoder.")]) == 4 * 15 + 7
    g = load(tiny_en)
    assert g.tensor("input_features").shape == (1, 80, 3000)
    assert sum(n.op == "Softmax" for n in g.nodes) == 4


@pytest.fixture(scope="module")
def real_speech(tiny_en):
    """(features of the spoken sample, onnxruntime's tiny.en encoder output on them, the ONNX export of the
    same weights: the Erf-GELU graph torch.onnx emits)."""
    import real_whisper
    from minirt.audio import whisper_features
    x = whisper_features(real_whisper.SPEECH)
    onnx_model = we.build_whisper_encoder(opset=17, weights=read_safetensors(tiny_en))
    ref = onnxruntime_run(onnx_model, {"input_features": x})[0]
    assert ref.shape == (1, 1500, 384)
    return x, ref, onnx_model


# Two tests that test workers can share: the fp32 runs use the same pipelines (one compile, when run in turn), fp16
# its own.

def same_work(a, b) -> bool:
    """Whether two plans run the same dispatches (kernel, push constants, specialization, sizes) on corresponding
    tensors (a consistent one-to-one map of names, the same roles and shapes) with constants of the same bytes: then
    they compute the same bits (a plan's runs are deterministic: tests/test_whisper.py, test_determinism)."""
    from minirt.plan import CONSTANT, WEIGHT
    if len(a.dispatches) != len(b.dispatches):
        return False
    names = {}
    for da, db in zip(a.dispatches, b.dispatches):
        if (da.kernel, da.push, da.spec, da.global_size, da.local_size) != \
                (db.kernel, db.push, db.spec, db.global_size, db.local_size) or len(da.args) != len(db.args):
            return False
        for (na, ma), (nb, mb) in zip(da.args, db.args):
            ta, tb = a.tensors[na], b.tensors[nb]
            if ma != mb or names.setdefault(na, nb) != nb or (ta.role, ta.shape) != (tb.role, tb.shape):
                return False
            if ta.role in (WEIGHT, CONSTANT) and not np.array_equal(ta.data, tb.data):
                return False
    return len(set(names.values())) == len(names)


def test_same_work_tells_plans_apart():
    from minirt.planner import make_plan
    from minirt.session import get_device
    from oracle import linear_case
    from minirt.infer import prepare
    from minirt.loaders import load

    def plan(seed, m=3):
        return make_plan(prepare(load(linear_case(m, 12, 8, True, False, seed=seed)[0])), get_device().profile,
                         "buffer", {})
    assert same_work(plan(0), plan(0))
    assert not same_work(plan(0), plan(1))          # other weights
    assert not same_work(plan(0), plan(0, m=4))     # other shapes


@pytest.mark.slow
def test_tiny_en_on_real_speech_matches_onnxruntime(tiny_en, real_speech):
    """From safetensors, and from the ONNX export of the same weights. Where the two plans do the same work on the same
    bytes (same_work) the ONNX one gives the same bits, so only the first runs: a full-size run costs lavapipe over a
    minute."""
    x, ref, onnx_model = real_speech
    with Session(tiny_en) as s:
        assert cosine(s.run(x), ref) >= 0.99999, "safetensors"
        plan = s.plan
    with Session(onnx_model) as s:
        if not same_work(s.plan, plan):
            assert cosine(s.run(x), ref) >= 0.99999, "onnx"


@pytest.mark.slow
def test_tiny_en_fp16_on_real_speech(tiny_en, real_speech):
    """precision fp16 (16-bit storage) on real weights and speech: relative L2 <= 2e-3 and cosine >= 0.9999 against
    fp32 (here onnxruntime's, which minirt's fp32 matches to cosine 0.99999 in the tests above). On the first 10 s
    of the window (the sample's 3.6 s of speech and silence; the positional table's first 500 rows): every weight
    and layer of the whole window, a third of the work for lavapipe."""
    from minirt.session import get_device
    if not get_device().profile.storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    w = read_safetensors(tiny_en)
    key = next(k for k in w if k.endswith("encoder.embed_positions.weight"))
    model = we.build_whisper_encoder(opset=17, weights={**w, key: w[key][:500]})
    x = np.ascontiguousarray(real_speech[0][:, :, :1000])
    ref = onnxruntime_run(model, {"input_features": x})[0]
    with Session(model, storage="buffer", precision="fp16") as s:
        y16 = s.run(x)
    ref = ref.astype(np.float64)
    rel = float(np.linalg.norm(y16 - ref) / np.linalg.norm(ref))
    assert np.isfinite(y16).all() and rel <= 2e-3, f"fp16: relative L2 {rel:.2e}"
    assert cosine(y16, ref) >= 0.9999
