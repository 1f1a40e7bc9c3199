"""Whisper with int8 weights: a CTranslate2 int8 model.bin (converted here from the real tiny.en with ctranslate2's
own converter) loads with its Linear weights int8 on the GPU (no widening), compute_type quantizes a float checkpoint
as CTranslate2 does, and the int8 model transcribes speech as faster-whisper's int8 and float32 runs do."""
import shutil

import numpy as np
import pytest

import real_whisper
import speech_clips
from minirt.quant import QuantizedWeight, quantize_rows
from minirt.whisper.compute_type import apply_compute_type, linear_weight_names
from minirt.whisper.ct2 import CT2FormatError, ct2_to_hf, read_ct2

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 (the converter and oracle) is not installed")


@pytest.fixture(scope="module")
def hf_dir():
    try:
        return real_whisper.tiny_en_hf_dir()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")


@pytest.fixture(scope="module")
def int8_dir(hf_dir, tmp_path_factory):
    """tiny.en as ct2-transformers-converter --quantization int8 writes it, with the tokenizer beside it."""
    from ctranslate2.converters import TransformersConverter
    out = tmp_path_factory.mktemp("tiny-int8") / "model"
    TransformersConverter(str(hf_dir)).convert(str(out), quantization="int8", force=True)
    shutil.copy(hf_dir / "tokenizer.json", out / "tokenizer.json")
    return out


def test_int8_model_bin_reads_int8(int8_dir):
    from minirt.whisper.checkpoint import load_checkpoint
    w = load_checkpoint(int8_dir).weights
    q = {n for n, v in w.items() if isinstance(v, QuantizedWeight)}
    assert q == set(linear_weight_names(w)) and "model.decoder.layers.0.self_attn.k_proj.weight" in q
    assert w["model.encoder.conv1.weight"].dtype == np.float32      # convs dequantized


def test_compute_type_int8_quantizes_as_ctranslate2(hf_dir, int8_dir):
    """apply_compute_type("int8") on the float checkpoint gives CTranslate2's own int8 weights and scales (ties of
    rounding aside)."""
    from minirt.whisper.checkpoint import load_checkpoint
    ours = apply_compute_type("int8", "fp16", load_checkpoint(hf_dir).weights)
    theirs = load_checkpoint(int8_dir).weights
    assert ours[0] == "fp32"
    for name in ("model.decoder.layers.1.fc1.weight", "model.encoder.layers.0.self_attn.q_proj.weight",
                 "model.decoder.embed_tokens.weight"):
        a, b = ours[1][name], theirs[name]
        assert isinstance(a, QuantizedWeight) and a.q.shape == b.q.shape
        np.testing.assert_allclose(a.scale, b.scale, rtol=1e-6)
        diff = np.abs(a.q.astype(np.int16) - b.q)
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3, name
    assert apply_compute_type("float16", "fp32", theirs)[0] == "fp16"
    assert not any(isinstance(v, QuantizedWeight) for v in apply_compute_type("float32", "fp32", theirs)[1].values())
    with pytest.raises(ValueError, match="compute_type must be one of"):
        apply_compute_type("int4", "fp32", theirs)


def test_scales_that_do_not_match_name_the_variable(int8_dir):
    _, v, aliases = read_ct2(int8_dir / "model.bin")
    name = "decoder/layer_0/ffn/linear_0/weight_scale"
    bad = dict(v, **{name: v[name][:-1]})
    with pytest.raises(CT2FormatError, match="'decoder/layer_0/ffn/linear_0/weight_scale' .* does not match"):
        ct2_to_hf(bad, aliases)
    bad = dict(v, **{name: -v[name]})
    with pytest.raises(CT2FormatError, match="linear_0/weight_scale' holds scales"):
        ct2_to_hf(bad, aliases)


def test_the_plan_holds_int8(int8_dir):
    """The program's Linears read int8 weights (the few-row kernel in a step, the tiled GEMM in the encoder), and the
    weights' GPU bytes are the int8 bytes plus scales: no float copy of a Linear weight."""
    from minirt.options import Options
    from minirt.session import get_device
    from minirt.whisper.checkpoint import load_checkpoint
    from minirt.whisper.vulkan import plan_program
    ck = load_checkpoint(int8_dir)
    plans = plan_program(ck.weights, ck.config, get_device().profile, 1, Options.make({}))
    for entry, kernel in (("encode", "linear_t44"), ("step1", "linear_rows")):
        p = plans[entry]
        lin = {d.kernel for d in p.dispatches if d.op == "Linear"}
        assert lin and all(k.startswith(kernel) and "_i8" in k for k in lin), (entry, lin)
        big = [t for t in p.tensors.values() if t.role == "weight" and t.numel >= 384 * 384]
        assert big and all(t.dtype == "int8" or "conv" in t.name for t in big), [(t.name, t.dtype) for t in big]
    logits = [t for t in plans["step1"].tensors.values() if t.dtype == "int8" and t.nbytes == 51864 * 384]
    assert logits      # the tied logits read the int8 embedding
    from minirt.cli import format_plan
    line = next(x for x in format_plan(plans["step1"]).splitlines() if x.startswith("weights (GPU bytes by type)"))
    assert "int8 " in line and "float32 " in line


@pytest.mark.slow
def test_int8_transcribes_as_faster_whisper(int8_dir):
    """Greedy text of the int8 model on the GPU: within a point of WER of faster-whisper's float32 run of the same
    weights, and near faster-whisper's int8 run on the CPU."""
    import faster_whisper
    from minirt.whisper import WhisperModel
    from test_whisper_decode import wer
    clips = [(str(real_whisper.SPEECH), real_whisper.SPEECH_TEXT)]
    if speech_clips.espeak_available():
        texts = speech_clips.sentences(1, 2)
        clips.append((speech_clips.clip(texts), " ".join(texts)))
    model = WhisperModel(int8_dir, compute_type="default")
    fw = {ct: faster_whisper.WhisperModel(str(int8_dir), device="cpu", compute_type=ct, cpu_threads=1)
          for ct in ("int8", "float32")}

    def text(m, audio):
        return " ".join(s.text for s in m.transcribe(audio, beam_size=1, temperature=0.0)[0])

    for audio, truth in clips:
        ours, f_int8, f_fp32 = text(model, audio), text(fw["int8"], audio), text(fw["float32"], audio)
        assert wer(truth, ours) <= wer(truth, f_fp32) + 0.01, (ours, f_fp32)
        assert wer(f_int8, ours) <= 0.1, (ours, f_int8)


def test_quantize_rows_round_trip():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 10)).astype(np.float32)
    w[2] = 0
    q = quantize_rows(w)
    assert q.q.dtype == np.int8 and np.abs(q.q).max() == 127 and q.scale[2] == 1.0
    np.testing.assert_allclose(np.asarray(q), w, atol=np.abs(w).max() / 254 + 1e-7)


def test_cli_compute_type(tmp_path, monkeypatch):
    """`minirt transcribe --compute-type` reaches WhisperModel's compute_type; an unknown value is a usage error."""
    from click.testing import CliRunner

    import minirt.whisper.model as model
    from minirt.cli import main
    from minirt.errors import ModelError
    from test_whisper_stream import write_wav
    made = []

    class Stub:
        def __init__(self, path, precision, backend, device=None, compute_type=None):
            made.append(compute_type)
            raise ModelError("a stub model")
    monkeypatch.setattr(model, "WhisperModel", Stub)
    wav = write_wav(tmp_path / "a.wav", np.zeros(1600, "<i2"), 16000)
    r = CliRunner().invoke(main, ["transcribe", wav, "--model", str(tmp_path), "--compute-type", "int8_float16"])
    assert r.exit_code == 3 and made == ["int8_float16"]
    r = CliRunner().invoke(main, ["transcribe", wav, "--model", str(tmp_path), "--compute-type", "int4"])
    assert r.exit_code == 2 and "--compute-type" in r.output
