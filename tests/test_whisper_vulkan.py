"""The Vulkan Whisper backend (minirt.whisper.vulkan) against the numpy reference through the conformance driver
(start, steps, replication, beam reorders, dropped rows) on a small random-weights Whisper; its plans (state
tensors, the parameter block, int32 inputs); steps that replay without recording; and the real tiny.en's greedy
tokens on the speech sample (slow). The same at precision fp16 (state in 16-bit storage) against the float32
reference, and a transcription at fp16 through WhisperModel's default backend."""
import numpy as np
import pytest

import real_whisper
from whisper_conformance import drive
from minirt.whisper.synthetic import random_checkpoint

D, HEADS, LAYERS, VOCAB, N_TEXT, N_MELS, N_AUDIO = 64, 2, 2, 500, 448, 80, 24


def small_whisper(seed=0, **config):
    """HF-named random weights and config of a small Whisper: d_model 64, 2 heads, 2 layers each side, 500 tokens,
    448 text positions, 80 mel bins, 24 audio positions (48 frames); config: other values of these keys."""
    return random_checkpoint({"d_model": D, "num_mel_bins": N_MELS, "max_source_positions": N_AUDIO,
                              "max_target_positions": N_TEXT, "encoder_layers": LAYERS, "decoder_layers": LAYERS,
                              "encoder_attention_heads": HEADS, "decoder_attention_heads": HEADS,
                              "vocab_size": VOCAB, **config}, seed)


@pytest.fixture(scope="module")
def small():
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import VulkanBackend
    w, cfg = small_whisper()
    with VulkanBackend(w, cfg, max_batch=4) as vb:
        yield vb, ReferenceBackend(w, cfg)


def relative_errors(a, b):
    return [float(np.abs(x - y).max() / np.abs(y).max()) for x, y in zip(a, b)]


def test_conformance_with_the_reference(small):
    vb, ref = small
    features = np.random.default_rng(1).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32)
    prompt = [7, 300, 12, 499, 0]
    got, want = (drive(b, features, prompt, steps=6, batch=4, seed=2) for b in (vb, ref))
    assert [x.shape for x in got] == [x.shape for x in want]
    assert [x.shape[0] for x in got] == [2] + [4] * 6 + [3, 3]
    assert max(relative_errors(got, want)) <= 1e-4
    # a second window and a second attempt on it: encode() and start() begin afresh
    features2 = np.random.default_rng(3).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32)
    got, want = (drive(b, features2, prompt[:2], steps=2, batch=2, seed=4) for b in (vb, ref))
    assert max(relative_errors(got, want)) <= 1e-4
    got, want = (b.start([5, 6, 7], [2, 0, 1]) for b in (vb, ref))
    assert max(relative_errors([got], [want])) <= 1e-4
    # a prompt longer than the short prompt entry point's 8 slots, then a step after it
    got, want = ([b.start(list(range(20, 40)), [19, 0]), b.step(np.array([41]))] for b in (vb, ref))
    assert max(relative_errors(got, want)) <= 1e-4


def test_plans_show_state_and_steps_replay(small):
    from minirt.cli import format_plan
    vb, _ = small
    step, enc, reorder = vb.plans["step4"], vb.plans["encode"], vb.plans["reorder"]
    assert sorted(vb.plans) == ["cross", "encode", "prompt232", "prompt8", "reorder", "step1", "step1_select", "step4"]
    prompt = vb.plans["prompt232"]      # a prompt in one run: 232 token slots, the logits at 2 positions
    assert prompt.tensors["tokens"].shape == (1, 232) and prompt.tensors["picks"].dtype == "int32"
    assert prompt.tensors["logits"].shape == (2, VOCAB) and prompt.params == ["pos"]
    assert step.params == ["pos"] and reorder.params == ["len"] and enc.params == []
    assert sorted(enc.state) == sorted(f"cross_{k}.{i}" for k in "kv" for i in range(LAYERS))
    assert set(step.state) == set(enc.state) | set(reorder.state)
    assert step.tensors["tokens"].dtype == "int32" and step.outputs == ["logits"]
    assert enc.outputs == [] and reorder.outputs == []           # nothing but the logits comes back
    text = format_plan(step)
    assert "self_k.0 [4,448,64] float32 written" in text and "cross_k.1 [1,24,64] float32 read" in text
    assert "params pos (slot 0)" in text and "tokens [4,1] int32" in text
    assert "cached_attention" in text and "copy_rows" in text
    one = vb.plans["step1"]      # one row of the same 4-row cache
    assert one.tensors["tokens"].shape == (1, 1) and one.tensors["self_k.0"].shape == (4, 448, D)
    # the step entry points hold the same weights, uploaded once: each constant has one place on the GPU
    plans = (step, one, prompt, vb.plans["prompt8"])
    weights = {n for p in plans for n, t in p.tensors.items() if t.role == "weight"}
    placed = vb.program.constants.placed
    assert weights and all(len(placed[k]) == 1 for k in placed)
    assert {k[0] for k in placed} >= weights
    assert vb.program.executors["step1"].res.const_buf is None
    assert_steps_replay(vb, np.zeros((N_MELS, 2 * N_AUDIO), np.float32))


def assert_steps_replay(vb, features):
    """After encode and a prompt, steps of 3 rows, beam reorders, a dropped row and a step of the 2 left record
    nothing: each run replays its entry point's recording."""
    from minirt.vk.recorder import recordings
    vb.encode(features)
    vb.start([1, 2], [1])
    vb.reorder(np.array([0, 0, 0]))
    before = recordings()
    for t in range(5):
        vb.step(np.array([t, t + 1, t + 2]))
        vb.reorder(np.array([2, 0, 1]))
    vb.reorder(np.array([0, 1]))
    vb.step(np.array([9, 10]))
    assert recordings() == before


def test_minirt_plan_of_a_whisper_folder(tmp_path):
    """`minirt plan FOLDER` prints the plans of the Vulkan program: int32 inputs, state, parameters."""
    import json

    from click.testing import CliRunner
    from safetensors.numpy import save_file

    from minirt.cli import main
    w, cfg = small_whisper()
    save_file(w, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "whisper", **cfg}))
    (tmp_path / "tokenizer.json").write_text("{}")      # only looked for: planning reads no tokens
    r = CliRunner().invoke(main, ["plan", str(tmp_path), "--batch", "2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    for entry in ("encode", "cross", "prompt8", "prompt232", "step1", "step2", "step1_select", "reorder"):
        assert f"entry point {entry}" in r.output
    assert "tokens [2,1] int32" in r.output and "rows [2] int32" in r.output
    assert "cross_v.1 [1,24,64] float32 written" in r.output and "self_k.0 [2,448,64] float32 written" in r.output
    assert "params pos (slot 0)" in r.output and "params len (slot 0)" in r.output
    r = CliRunner().invoke(main, ["plan", str(tmp_path), "--entry", "reorder"], catch_exceptions=False)
    assert "entry point step" not in r.output and "ReorderRows" in r.output
    r = CliRunner().invoke(main, ["plan", str(tmp_path), "--entry", "step"])
    assert r.exit_code == 2 and "'step' is not an entry point of this program (encode, cross, prompt8, prompt232, step1, step5, step1_select, reorder)" \
        in r.output
    r = CliRunner().invoke(main, ["plan", str(tmp_path), "--batch", "2", "--entry", "step2", "--precision", "fp16"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "precision fp16" in r.output and "self_k.0 [2,448,64] float16 written" in r.output
    assert "cached_attention_half" in r.output and "copy_rows_half" in r.output


def test_errors(small):
    vb, _ = small
    vb.encode(np.zeros((N_MELS, 2 * N_AUDIO), np.float32))
    with pytest.raises(ValueError, match="features must be"):
        vb.encode(np.zeros((N_MELS, 3000), np.float32))
    vb.start([1], [0])
    with pytest.raises(ValueError, match="2 tokens for a batch of 1"):
        vb.step(np.array([1, 2]))
    with pytest.raises(ValueError, match="token ids"):
        vb.step(np.array([VOCAB]))
    with pytest.raises(ValueError, match="holds 1 to 4"):
        vb.reorder(np.zeros(5, np.int64))


class _EncoderOutput:
    """A Vulkan backend whose encode() takes the reference backend's encoder output (set_encoder_output): the
    encoder on real weights is tests/test_safetensors.py's (lavapipe takes most of a minute for a window); here
    both decoders start from the same bits."""

    def __init__(self, backend, reference):
        self.backend, self.reference = backend, reference

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def encode(self, features):
        self.backend.set_encoder_output(self.reference.encoder_output(features))


def test_cross_entry_equals_encode(small):
    """set_encoder_output (the cross entry point) on the encoder's output gives what encode() gives."""
    vb, ref = small
    features = np.random.default_rng(5).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32)
    prompt = [7, 300, 12]
    vb.encode(features)
    want = vb.start(prompt, [2, 0])
    vb.set_encoder_output(ref.encoder_output(features))
    got = vb.start(prompt, [2, 0])
    assert max(relative_errors([got], [want])) <= 1e-4
    with pytest.raises(ValueError, match=r"encoder output must be \[24, 64\]"):
        vb.set_encoder_output(np.ones((23, D), np.float32))


@pytest.mark.slow
def test_tiny_en_greedy_tokens_equal_the_reference():
    """OpenAI's tiny.en on models/speech-sample.wav, greedy, both decoders from the reference encoder's output: the
    same token ids as the numpy reference backend (which tests/test_whisper_decode.py checks against
    faster-whisper), and the same words from the GPU's alignment (VulkanBackend.align), times and probabilities to
    1e-3. Then, on that window, logits against the reference through replication, beam reorders and dropped rows."""
    pytest.importorskip("tokenizers", reason="the whisper extra (tokenizers) is not installed")
    from minirt.whisper import WhisperModel
    from minirt.whisper.checkpoint import load_checkpoint
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import VulkanBackend
    try:
        folder = real_whisper.tiny_en_ct2_dir()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    ckpt = load_checkpoint(folder)
    opts = dict(beam_size=1, temperature=0.0, word_timestamps=True)
    ref = ReferenceBackend(ckpt.weights, ckpt.config)
    (r,), _ = WhisperModel(folder, backend=ref).transcribe(str(real_whisper.SPEECH), **opts)
    with VulkanBackend(ckpt.weights, ckpt.config, max_batch=3) as vb:
        segs, _ = WhisperModel(folder, backend=_EncoderOutput(vb, ref)).transcribe(str(real_whisper.SPEECH), **opts)
        (g,) = list(segs)
        assert g.tokens == r.tokens and g.text == r.text
        assert g.avg_logprob == pytest.approx(r.avg_logprob, abs=1e-3)
        assert vb.align_heads == ckpt.alignment_heads and [w.word for w in g.words] == [w.word for w in r.words]
        assert np.abs([[a.start - b.start, a.end - b.end, a.probability - b.probability]
                       for a, b in zip(g.words, r.words)]).max() <= 1e-3

        prompt = [50257, 50362] + list(g.tokens[:3])
        got, want = [], []
        for b, out in ((vb, got), (ref, want)):
            out.append(b.start(prompt, [0, len(prompt) - 1]))
            b.reorder(np.zeros(3, np.int64))
            for tokens, rows in (([11, 13, 262], [2, 2, 0]), ([318, 11, 13], [1, 0]), ([257, 40], [1])):
                out.append(b.step(np.array(tokens)))
                b.reorder(np.array(rows))
            out.append(b.step(np.array([13])))
    assert max(relative_errors(got, want)) <= 1e-4


# -- precision fp16 ---------------------------------------------------------------------------------------------
# 16-bit storage of weights, activations and state against the float32 reference: each stored value is rounded to
# 11 significant bits (relative error up to 2^-12, about 2.4e-4), through a few dozen roundings on the way to the
# logits. FP16_TOLERANCE, 1e-2 of the largest |logit|, is eleven times the largest error measured here (8.9e-4; the
# fp16 reference, whose weights alone are rounded, is 5.0e-4 from the float32 one) and still far below what would
# change a token: a wrong kernel, index or element type gives errors of order 1.
FP16_TOLERANCE = 1e-2
EN_VOCAB = 51864        # tiny.en's vocabulary, so that its tokenizer reads what a model of it decodes


@pytest.fixture(scope="module")
def half():
    """small_whisper's Vulkan backend at fp16 and its float32 numpy reference."""
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import VulkanBackend
    w, cfg = small_whisper()
    with VulkanBackend(w, cfg, precision="fp16", max_batch=4) as vb:
        yield vb, ReferenceBackend(w, cfg)


def test_fp16_conformance_with_the_fp32_reference(half):
    """The whole program at fp16 (encode, both prompt entry points, steps of 1 and 4 rows, reorders, the cross entry
    point) against the float32 reference, within FP16_TOLERANCE of the largest |logit|."""
    vb, ref = half
    assert vb.precision == "fp16" and vb.name == "Vulkan (float16)"
    features = np.random.default_rng(1).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32)
    prompt = [7, 300, 12, 499, 0]
    got, want = (drive(b, features, prompt, steps=6, batch=4, seed=2) for b in (vb, ref))
    assert [x.shape for x in got] == [x.shape for x in want] and got[0].dtype == np.float32
    errors = relative_errors(got, want)
    # a prompt past the short entry point's 8 slots, then a one-row step; a one-token prompt (step1)
    got, want = ([b.start(list(range(20, 40)), [19, 0]), b.step(np.array([41])), b.start([5], [0])]
                 for b in (vb, ref))
    errors += relative_errors(got, want)
    # the cross entry point: the reference's float32 encoder output in, float16 cross keys and values made of it
    vb.set_encoder_output(ref.encoder_output(features))
    got, want = (b.start(prompt, [4, 0]) for b in (vb, ref))
    errors += relative_errors([got], [want])
    assert max(errors) <= FP16_TOLERANCE, errors


def test_fp16_plans_keep_state_in_half_and_steps_replay(half):
    """Every plan at fp16 runs half kernel variants (casts only at the float32 edges); the state tensors are float16,
    the logits and the encoder output float32, the token ids, rows and picks int32; steps and reorders replay their
    recordings."""
    from minirt.cli import format_plan
    vb = half[0]
    assert sorted(vb.plans) == ["cross", "encode", "prompt232", "prompt8", "reorder", "step1", "step1_select", "step4"]
    for name, p in vb.plans.items():
        assert p.precision == "fp16" and p.state, name
        assert {p.tensors[s].dtype for s in p.state} == {"float16"}, name
        assert all("half" in d.kernel.split("_") or d.stem == "cast" for d in p.dispatches), name
    step, prompt, cross = vb.plans["step4"], vb.plans["prompt232"], vb.plans["cross"]
    assert step.tensors["tokens"].dtype == "int32" and step.tensors["logits"].dtype == "float32"
    assert prompt.tensors["picks"].dtype == "int32" and vb.plans["reorder"].tensors["rows"].dtype == "int32"
    assert cross.tensors["encoder_output"].dtype == "float32"
    kernels = {d.kernel for p in vb.plans.values() for d in p.dispatches}
    assert {"copy_rows_half", "cached_attention_half"} <= kernels
    select = vb.plans["step1_select"]     # the logits stay float16 on the GPU: no cast, the selection float32
    assert select.tensors["logits"].dtype == "float16" and select.tensors["selection"].dtype == "float32"
    assert select.dispatches[-1].kernel == "token_select_half_out32"
    assert not any(d.stem == "cast" for d in select.dispatches)
    text = format_plan(step)
    assert "precision fp16" in text and "self_k.0 [4,448,64] float16 written" in text
    assert "cross_k.1 [1,24,64] float16 read" in text
    assert_steps_replay(vb, np.random.default_rng(6).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_greedy_on_the_gpu_select_path_equals_the_host_path(small, half, precision, monkeypatch):
    """greedy() with suppress_tokens, suppress_blank and the timestamp rules picking its tokens on the GPU
    (step1_select) against the host path (step1's logits back) on the same backend: the same tokens, the score to
    float32 rounding; at fp16 too, whose kernel reads the float16 logits the host path's cast makes float32."""
    from minirt.whisper import filters as F
    from minirt.whisper.search import greedy
    vb = (small if precision == "fp32" else half)[0]
    eot, begin = 400, 450
    filters = [F.SuppressTokens([1, 2, 3] + list(range(eot + 1, begin - 1))), F.SuppressBlank([220, eot]),
               F.TimestampRules(eot, begin - 1, begin, VOCAB - 1, begin + 10)]
    features = np.random.default_rng(7).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32)
    vb.encode(features)
    got = {}
    for gpu in (True, False):
        monkeypatch.setattr(vb, "gpu_select", gpu)
        steps = []
        monkeypatch.setattr(vb, "step_select", lambda *a, f=vb.step_select: steps.append("select") or f(*a))
        monkeypatch.setattr(vb, "step", lambda *a, f=vb.step: steps.append("logits") or f(*a))
        first = vb.start([7, 300, 12], [2])[0]
        (got[gpu],) = greedy(vb, first, filters, eot, 40)
        assert steps == ["select" if gpu else "logits"] * 39       # every step after the first, from the prompt's
        monkeypatch.undo()
    assert got[True].tokens == got[False].tokens and len(got[True].tokens) == 40
    assert got[True].tokens[0] >= begin and any(t < begin for t in got[True].tokens)
    assert got[True].score == pytest.approx(got[False].score, rel=1e-5)


class _FirstFrames:
    """A backend of small_whisper's 24 audio positions behind transcribe(), which encodes 30 s windows of 3000 frames:
    encode() takes the first 48 frames (all there is of a clip of 0.48 s or less; the rest is padding)."""

    def __init__(self, backend):
        self.backend = backend

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def encode(self, features):
        self.backend.encode(np.asarray(features)[..., :2 * N_AUDIO])


def test_fp16_transcribes_on_the_gpu_by_default(tmp_path, monkeypatch):
    """WhisperModel(precision="fp16") runs the Vulkan backend at fp16, and a short synthetic clip goes through
    transcribe() end to end on it (features, encode, prompt, greedy steps, segments): small_whisper with tiny.en's
    vocabulary (for its tokenizer; seed 1, whose first tokens decode to text), whose tokens are the fp16 numpy
    reference's."""
    pytest.importorskip("tokenizers", reason="the whisper extra (tokenizers) is not installed")
    import minirt.whisper.vulkan as vulkan
    from minirt.whisper import WhisperModel
    from minirt.whisper.reference import ReferenceBackend
    from test_whisper_bad_input import hf_folder
    w, cfg = small_whisper(1, vocab_size=EN_VOCAB)
    folder = hf_folder(tmp_path / "model", w, dict(cfg, model_type="whisper"))
    made, vulkan_backend = [], vulkan.VulkanBackend

    def backend(weights, config, precision, device, **rows):
        made.append(precision)
        return _FirstFrames(vulkan_backend(weights, config, precision, device, max_batch=1))
    monkeypatch.setattr(vulkan, "VulkanBackend", backend)
    t = np.arange(6400) / 16000
    audio = (0.3 * np.sin(2 * np.pi * 440 * t) * np.exp(-4 * t)).astype(np.float32)
    opts = dict(beam_size=1, temperature=0.0, max_new_tokens=4, without_timestamps=True,
                no_speech_threshold=None)
    model = WhisperModel(folder, precision="fp16")
    try:
        assert made == ["fp16"] and model.backend.precision == "fp16"
        segments, info = model.transcribe(audio, **opts)
        segments = list(segments)
    finally:
        model.backend.close()
    assert info.duration == pytest.approx(0.4) and segments and segments[0].text.strip()
    ref = WhisperModel(folder, backend=_FirstFrames(ReferenceBackend(w, cfg, "fp16")))
    want, _ = ref.transcribe(audio, **opts)
    assert [s.tokens for s in segments] == [s.tokens for s in want]


def test_transcribe_command_at_fp16_picks_the_gpu(tmp_path, monkeypatch):
    """`minirt transcribe --precision fp16` makes its WhisperModel with the Vulkan backend (--backend auto), as at
    fp32; --backend reference still picks the reference."""
    from click.testing import CliRunner

    import minirt.whisper.model as model
    from minirt.cli import main
    from minirt.errors import ModelError
    from test_whisper_stream import write_wav
    made = []

    class Stub:
        def __init__(self, path, precision, backend, device=None):
            made.append((precision, backend))
            raise ModelError("a stub model")
    monkeypatch.setattr(model, "WhisperModel", Stub)
    wav = write_wav(tmp_path / "a.wav", np.zeros(1600, "<i2"), 16000)
    for args in ([], ["--backend", "reference"]):
        r = CliRunner().invoke(main, ["transcribe", wav, "--model", str(tmp_path), "--precision", "fp16", *args])
        assert r.exit_code == 3 and "a stub model" in r.output
    assert made == [("fp16", "vulkan"), ("fp16", "reference")]
