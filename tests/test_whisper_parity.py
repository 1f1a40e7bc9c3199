"""faster-whisper's prefix, hotwords, clip_timestamps, word timestamps and hallucination_silence_threshold against
faster-whisper itself (the oracle: CTranslate2 on the CPU in float32, one thread) with the same tiny.en CTranslate2
folder (tests/real_whisper.py) on clips spoken by espeak-ng (tests/speech_clips.py): the same segments and tokens;
word lists equal, word times within 0.02 s in the median and 0.2 s at worst. minirt runs its numpy reference
backend here (tests/test_whisper_words_vulkan.py checks the GPU's alignment against it). And the option checks."""
import numpy as np
import pytest

import speech_clips

faster_whisper = pytest.importorskip("faster_whisper", reason="faster-whisper (the oracle) is not installed")
from test_whisper_decode import ct2_dir, model, oracle  # noqa: E402,F401  (the same fixtures)

needs_espeak = pytest.mark.skipif(not speech_clips.espeak_available(),
                                  reason="espeak-ng is not installed (tools/setup.sh installs it)")

GREEDY = dict(beam_size=1, temperature=0.0)


def gappy_clip():
    """Three sentences with 2.5 s of low noise between them (and before the first)."""
    rng = np.random.default_rng(5)
    parts = []
    for text in speech_clips.sentences(4, 3):
        parts += [(rng.standard_normal(40000) * 2e-3).astype(np.float32), speech_clips.speak(text)]
    return np.concatenate(parts)


def both(oracle, model, audio, **options):
    fs, _ = oracle.transcribe(audio, **options)
    ms, _ = model.transcribe(audio, **options)
    return list(fs), list(ms)


def assert_same_segments(fs, ms):
    def key(s):
        return s.id, s.seek, round(s.start, 6), round(s.end, 6), s.tokens, s.text, s.temperature

    assert [key(s) for s in ms] == [key(s) for s in fs]
    for f, m in zip(fs, ms):
        assert m.avg_logprob == pytest.approx(f.avg_logprob, abs=1e-3)


def assert_same_words(fs, ms):
    """Word lists equal; start and end within 0.02 s in the median, 0.2 s at worst; probabilities to 1e-3."""
    fw = [w for s in fs for w in s.words]
    mw = [w for s in ms for w in s.words]
    assert [w.word for w in mw] == [w.word for w in fw]
    assert fw
    err = np.abs([[a.start - b.start, a.end - b.end] for a, b in zip(mw, fw)])
    assert np.median(err) <= 0.02 and err.max() <= 0.2
    assert np.abs([a.probability - b.probability for a, b in zip(mw, fw)]).max() <= 1e-3
    for s in ms:
        assert all(isinstance(w.start, float) and w.start <= w.end for w in s.words)


@needs_espeak
@pytest.mark.parametrize("options", [
    dict(prefix="The quick", beam_size=3, temperature=0.0), dict(prefix="Hello", without_timestamps=True, **GREEDY),
    dict(hotwords="Stella container", initial_prompt="Hello there.", beam_size=2, temperature=0.0)],
    ids=["prefix-beam", "prefix-no-timestamps", "hotwords-prompt-beam"])
def test_prefix_and_hotwords(oracle, model, options):
    """A prefix forced after the start sequence (scored 0, within the length limit; after <|0.00|> with timestamps),
    hotwords as previous text: the same tokens as faster-whisper's."""
    audio = speech_clips.clip(speech_clips.sentences(3, 2), pause=1.0)
    fs, ms = both(oracle, model, audio, **options)
    assert ms
    assert_same_segments(fs, ms)
    if "prefix" in options and "hotwords" not in options:
        assert ms[0].text.strip().startswith(options["prefix"])


@needs_espeak
def test_clip_timestamps(oracle, model):
    """A string of clips whose last one runs to the end; a list whose second clip starts past the end."""
    audio = speech_clips.clip(speech_clips.sentences(0, 2), pause=1.5)
    for clips in ("1.0,4.5,5", [2.0, 3.0, 30.0, 31.0]):
        fs, ms = both(oracle, model, audio, clip_timestamps=clips, **GREEDY)
        assert ms
        assert_same_segments(fs, ms)


@needs_espeak
def test_word_timestamps(oracle, model):
    """Greedy, on a clip of three sentences after long silences, with hallucination_silence_threshold and other
    punctuation to merge."""
    fs, ms = both(oracle, model, gappy_clip(), word_timestamps=True, hallucination_silence_threshold=1.0,
                  prepend_punctuations="\"'(", append_punctuations="\".,!?)", **GREEDY)
    assert_same_segments(fs, ms)
    assert_same_words(fs, ms)


def test_alignment_pieces():
    """The DTW against a plain dynamic program (float64, the same tie order), the median filter against a direct
    window median with reflection."""
    from minirt.whisper.words import median_filter, negative_dtw
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 19)).astype(np.float32)
    n, m = x.shape
    cost = np.full((n + 1, m + 1), np.inf)
    cost[0, 0] = 0
    trace = np.zeros((n + 1, m + 1), int)
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c = [cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]]
            t = 0 if c[0] < c[1] and c[0] < c[2] else 1 if c[1] < c[0] and c[1] < c[2] else 2
            cost[i, j], trace[i, j] = -x[i - 1, j - 1] + c[t], t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, want = n, m, []
    while i > 0 or j > 0:
        want.append((i - 1, j - 1))
        i, j = {0: (i - 1, j - 1), 1: (i - 1, j), 2: (i, j - 1)}[trace[i, j]]
    assert negative_dtw(x) == want[::-1]
    y = rng.standard_normal((3, 10)).astype(np.float32)
    got = median_filter(y, 7)
    for k in range(10):
        idx = [abs(k + d) if abs(k + d) < 10 else 18 - abs(k + d) for d in range(-3, 4)]
        assert np.array_equal(got[:, k], np.median(y[:, idx], axis=-1).astype(np.float32))


def test_option_checks(model):
    from minirt.whisper import WhisperModel
    audio = np.zeros(1600, np.float32)
    for bad, match in ((dict(clip_timestamps="1,x"), "clip_timestamps"), (dict(clip_timestamps=[-1.0]), "clip"),
                       (dict(hallucination_silence_threshold=1.0), "word_timestamps"),
                       (dict(prefix=3), "prefix"), (dict(max_new_tokens=0), "max_new_tokens"),
                       (dict(language_detection_segments=0), "language_detection_segments")):
        with pytest.raises(ValueError, match=match):
            model.transcribe(audio, **bad)
    segments, _ = model.transcribe(audio, clip_timestamps=[5.0, 2.0], **GREEDY)   # out of order: nothing
    assert list(segments) == []
    with pytest.raises(ValueError, match="compute_type"):
        WhisperModel(model.path, backend="reference", compute_type="float64")
    assert WhisperModel(model.path, backend="reference", compute_type="float16").precision == "fp16"


@needs_espeak
def test_vad_filter(oracle, model):
    """Silero VAD's speech chunks on the gappy clip as faster-whisper finds them, with its default and other
    options; transcribed with vad_filter: the same segments, words and times on the original timeline, the same
    duration_after_vad and vad_options; all silence: no segments."""
    pytest.importorskip("onnxruntime", reason="onnxruntime (vad_filter's runtime) is not installed")
    from faster_whisper.vad import VadOptions as OracleOptions
    from faster_whisper.vad import get_speech_timestamps
    from minirt.whisper import vad
    audio = gappy_clip()
    probs = vad.speech_probabilities(audio)
    for options in (dict(), dict(min_silence_duration_ms=500, speech_pad_ms=100),
                    dict(max_speech_duration_s=2.0, threshold=0.6), dict(neg_threshold=0.2, min_speech_duration_ms=300)):
        want = get_speech_timestamps(audio, OracleOptions(**options))
        assert vad.speech_chunks(audio, vad.VadOptions(**options), probs) == want
        assert len(want) >= 3
    options = dict(vad_filter=True, word_timestamps=True, vad_parameters={"min_silence_duration_ms": 300})
    (fs, finfo), (ms, minfo) = oracle.transcribe(audio, **options, **GREEDY), model.transcribe(audio, **options,
                                                                                              **GREEDY)
    fs, ms = list(fs), list(ms)
    assert_same_segments(fs, ms)
    assert_same_words(fs, ms)
    assert minfo.duration == finfo.duration and abs(minfo.duration_after_vad - finfo.duration_after_vad) <= 0.1
    assert minfo.duration_after_vad < minfo.duration - 5
    assert vars(minfo.vad_options) == vars(finfo.vad_options)
    segments, info = model.transcribe(np.zeros(48000, np.float32), vad_filter=True)
    assert list(segments) == [] and info.duration_after_vad == 0 and info.speech_chunks == []
    with pytest.raises(ValueError, match="vad_parameters: unknown key"):
        model.transcribe(audio, vad_filter=True, vad_parameters={"threshhold": 0.4})


def test_large_sizes_and_default_alignment_heads():
    """The synthetic sizes of the large models have OpenAI's shapes (no weights made here: the shapes only); a
    checkpoint without alignment heads and not of an OpenAI model aligns on every head of its last half of decoder
    layers."""
    from minirt.loaders.safetensors_loader import encoder_param_shapes
    from minirt.whisper.synthetic import SIZES, decoder_param_shapes
    from minirt.whisper.words import default_alignment_heads, openai_alignment_heads
    want = {"medium": (1024, 24, 24, 80, 51865), "large-v2": (1280, 32, 32, 80, 51865),
            "large-v3": (1280, 32, 32, 128, 51866), "large-v3-turbo": (1280, 32, 4, 128, 51866),
            "distil-large-v3": (1280, 32, 2, 128, 51866)}
    for name, (d, enc, dec, mels, vocab) in want.items():
        cfg = SIZES[name]
        assert cfg["encoder_attention_heads"] == cfg["decoder_attention_heads"] == d // 64
        assert encoder_param_shapes(cfg)["conv1.weight"] == (d, mels, 3)
        assert f"layers.{enc - 1}.fc1.weight" in encoder_param_shapes(cfg)
        shapes = decoder_param_shapes(cfg)
        assert shapes["embed_tokens.weight"] == (vocab, d) and f"layers.{dec - 1}.fc2.weight" in shapes
        assert f"layers.{dec}.fc2.weight" not in shapes
    assert default_alignment_heads(4, 6) == [(2, h) for h in range(6)] + [(3, h) for h in range(6)]
    assert default_alignment_heads(2, 2) == [(1, 0), (1, 1)]
    # openai-whisper's list for a checkpoint without one: by its Hugging Face name, else by shapes only one model has
    assert openai_alignment_heads(dict(SIZES["large-v2"], _name_or_path="openai/whisper-large-v2"))[0] == (10, 12)
    assert openai_alignment_heads(SIZES["large-v2"]) is None            # large-v1 has the same shapes
    assert openai_alignment_heads(SIZES["large-v3-turbo"]) == [(2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)]
    assert openai_alignment_heads(dict(SIZES["tiny"], d_model=256)) is None


def test_openai_heads_of_tiny_en_are_its_ctranslate2_folders(ct2_dir):
    """tiny.en's heads as its CTranslate2 config.json lists them (the converter's) are openai-whisper's, which a
    Hugging Face folder of it without generation_config.json gets."""
    from minirt.whisper.checkpoint import load_checkpoint
    from minirt.whisper.words import openai_alignment_heads
    ckpt = load_checkpoint(ct2_dir)
    assert ckpt.alignment_heads == openai_alignment_heads(ckpt.config) == openai_alignment_heads(
        dict(ckpt.config, _name_or_path="openai/whisper-tiny.en"))


def test_word_timestamps_without_alignment_heads(tmp_path):
    """A checkpoint that lists no alignment heads (a random Hugging Face folder without generation_config.json)
    aligns on the default heads; its words cover its text."""
    from minirt.whisper import WhisperModel
    from minirt.whisper.synthetic import write_folder
    from minirt.whisper.words import default_alignment_heads
    cfg = {"d_model": 64, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
           "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
           "vocab_size": 2000}
    model = WhisperModel(write_folder(tmp_path, cfg, seed=1), backend="reference")
    assert model.alignment_heads is None
    audio = np.random.default_rng(0).standard_normal(32000).astype(np.float32) * 0.1
    segments, _ = model.transcribe(audio, word_timestamps=True, max_new_tokens=12, no_speech_threshold=None,
                                   **GREEDY)
    segments = list(segments)
    assert model.backend.align_heads == default_alignment_heads(2, 2)
    assert segments and any(s.words for s in segments)
    for s in segments:
        assert "".join(w.word for w in s.words) == s.text


@needs_espeak
def test_transcribe_batch_words(model):
    """transcribe_batch's words are transcribe()'s (each window encoded again for its alignment)."""
    audio = [speech_clips.clip(speech_clips.sentences(s, 1)) for s in (1, 2)]
    got = model.transcribe_batch(audio, word_timestamps=True, **GREEDY)
    for a, (segments, _) in zip(audio, got):
        want = list(model.transcribe(a, word_timestamps=True, **GREEDY)[0])
        assert [s.words for s in segments] == [s.words for s in want] and want[0].words


@needs_espeak
def test_batched_pipeline_uses_vad_by_default(oracle, model):
    """BatchedInferencePipeline without clip_timestamps: Silero VAD's speech in chunks of up to 30 s, as
    faster-whisper's pipeline does by default; the same segments on the file's timeline."""
    pytest.importorskip("onnxruntime", reason="onnxruntime (vad_filter's runtime) is not installed")
    from minirt.whisper import BatchedInferencePipeline
    audio = gappy_clip()
    options = dict(beam_size=1, batch_size=2, without_timestamps=False)
    fs, finfo = faster_whisper.BatchedInferencePipeline(oracle).transcribe(audio, **options)
    ms, minfo = BatchedInferencePipeline(model).transcribe(audio, **options)
    fs, ms = list(fs), list(ms)

    def key(s):
        return s.id, s.seek, s.start, s.end, s.text, list(s.tokens)
    assert [key(s) for s in ms] == [key(s) for s in fs] and ms
    assert minfo.duration_after_vad == pytest.approx(finfo.duration_after_vad, abs=1e-6)
    assert vars(minfo.vad_options) == vars(finfo.vad_options)


def assert_same_pipeline_words(fs, ms):
    def key(s):
        return s.id, s.seek, s.start, s.end, s.text, list(s.tokens)
    assert [key(s) for s in ms] == [key(s) for s in fs]
    assert_same_words(fs, ms)


@needs_espeak
def test_batched_pipeline_words(oracle, model):
    """BatchedInferencePipeline(word_timestamps=True) against faster-whisper's: the same segments and words (times,
    probabilities) on 70 s of speech with a pause, VAD's three chunks in batches of 2 (the last speech timestamp
    carried into the next batch), and on three chunks of 3.5 s each (clip_timestamps: the same num_frames, texts of
    different lengths, so the batch's padding counts) in one batch of 3; the segments' seek is the chunk's frame."""
    pytest.importorskip("onnxruntime", reason="onnxruntime (vad_filter's runtime) is not installed")
    from minirt.whisper import BatchedInferencePipeline
    speech, _ = speech_clips.clip_of_length(11, 70)
    half = len(speech) // 2
    gap = (np.random.default_rng(1).standard_normal(24000) * 2e-3).astype(np.float32)
    speech = np.concatenate([speech[:half], gap, speech[half:]])
    short = [speech_clips.clip(speech_clips.sentences(s, k)) for s, k in ((0, 1), (1, 2), (2, 1))]
    starts = np.cumsum([0] + [len(a) for a in short[:-1]]) / 16000
    clips = [{"start": float(s), "end": float(s) + 3.5} for s in starts]
    for audio, options in ((speech, dict(batch_size=2)),
                           (np.concatenate(short), dict(batch_size=3, clip_timestamps=clips, vad_filter=False))):
        options = dict(options, beam_size=1, word_timestamps=True, without_timestamps=False)
        fs, _ = faster_whisper.BatchedInferencePipeline(oracle).transcribe(audio, **options)
        ms, minfo = BatchedInferencePipeline(model).transcribe(audio, **options)
        fs, ms = list(fs), list(ms)
        assert_same_pipeline_words(fs, ms)
        assert minfo.transcription_options.word_timestamps
    assert len({s.seek for s in ms}) == 3 and len(fs) >= 3


def three_chunks():
    """Three spoken sentences and their clip_timestamps, a chunk each."""
    audio = np.concatenate([speech_clips.clip(speech_clips.sentences(s, 1)) for s in (0, 1, 2)])
    n = len(audio) / 16000
    return audio, [{"start": k * n / 3, "end": (k + 1) * n / 3} for k in range(3)]


@needs_espeak
@pytest.mark.parametrize("options", [
    dict(initial_prompt="Hello there.", beam_size=1),
    dict(hotwords="Stella container", prefix="Hi", beam_size=1),
    dict(hotwords="Stella", initial_prompt="A shopping list.", without_timestamps=False, beam_size=2),
    dict(prefix="The quick", temperature=[0.6, 1.0], multilingual=True, beam_size=1)],
    ids=["prompt", "hotwords-prefix", "hotwords-prompt-beam", "prefix-temperature-multilingual"])
def test_batched_pipeline_prompts(oracle, model, options, caplog):
    """BatchedInferencePipeline's prompt options against faster-whisper's pipeline, three chunks in batches of 2: the
    initial prompt's text encoded as it is, the hotwords as previous text, the prefix taken and not used (the hotwords
    apply with it), a first temperature above 0 decoding as 0 and reported as the segments' temperature,
    multilingual turned off (with a warning) on an English-only model. The same segments, scores and options."""
    from minirt.whisper import BatchedInferencePipeline
    audio, clips = three_chunks()
    options = dict(options, clip_timestamps=clips, vad_filter=False, batch_size=2)
    fs, finfo = faster_whisper.BatchedInferencePipeline(oracle).transcribe(audio, **options)
    with caplog.at_level("WARNING", logger="minirt.whisper"):
        ms, minfo = BatchedInferencePipeline(model).transcribe(audio, **options)
    fs, ms = list(fs), list(ms)

    def key(s):
        return s.id, s.seek, s.start, s.end, s.text, list(s.tokens), s.temperature
    assert [key(s) for s in ms] == [key(s) for s in fs] and len(ms) >= 3
    assert [s.avg_logprob for s in ms] == pytest.approx([s.avg_logprob for s in fs], abs=1e-4)
    assert [s.no_speech_prob for s in ms] == pytest.approx([s.no_speech_prob for s in fs], abs=1e-5)
    for name in ("temperatures", "initial_prompt", "prefix", "hotwords", "multilingual", "without_timestamps"):
        assert getattr(minfo.transcription_options, name) == getattr(finfo.transcription_options, name), name
    assert ("multilingual=True is ignored" in caplog.text) == ("multilingual" in options)
    if isinstance(options.get("initial_prompt"), str):
        # token ids (which faster-whisper's pipeline cannot take: it encodes the prompt as text) as the text's
        ids = model.tokenizer.encode(options["initial_prompt"])
        got, _ = BatchedInferencePipeline(model).transcribe(audio, **dict(options, initial_prompt=ids))
        assert [s.tokens for s in got] == [s.tokens for s in ms]


@needs_espeak
def test_batched_pipeline_chunk_length(oracle, model):
    """chunk_length=10: the VAD's speech at most 10 s a piece, gathered into chunks of up to 10 s, as faster-whisper's
    pipeline; above 30 s refused (faster-whisper's would decode a chunk's first 30 s only), 0 an OptionError."""
    pytest.importorskip("onnxruntime", reason="onnxruntime (vad_filter's runtime) is not installed")
    from minirt.errors import OptionError
    from minirt.whisper import BatchedInferencePipeline
    pipe = BatchedInferencePipeline(model)
    audio = gappy_clip()
    options = dict(beam_size=1, batch_size=2, chunk_length=10)
    fs, finfo = faster_whisper.BatchedInferencePipeline(oracle).transcribe(audio, **options)
    ms, minfo = pipe.transcribe(audio, **options)
    fs, ms = list(fs), list(ms)

    def key(s):
        return s.id, s.seek, s.start, s.end, s.text, list(s.tokens)
    assert [key(s) for s in ms] == [key(s) for s in fs] and len({s.seek for s in ms}) >= 2
    assert vars(minfo.vad_options) == vars(finfo.vad_options)
    with pytest.raises(NotImplementedError, match="chunk_length above 30"):
        pipe.transcribe(audio, chunk_length=40)
    with pytest.raises(OptionError, match="chunk_length must be at least 1"):
        pipe.transcribe(audio, chunk_length=0)


@needs_espeak
def test_batch_alignments_are_ctranslate2s(oracle, model):
    """words.batch_alignments over the reference's alignment of each window alone gives CTranslate2's align of the
    batch (the DTW paths): with every num_frames the same (a shorter text's padding rows count: without them a path
    differs) and with different ones (each alone)."""
    from faster_whisper.audio import pad_or_trim
    from minirt.whisper import words as W
    audio = [speech_clips.clip(speech_clips.sentences(s, 2)) for s in (0, 1, 2)]
    features = np.stack([pad_or_trim(oracle.feature_extractor(a)[..., :-1]) for a in audio])
    tok = model.tokenizer
    texts = [tok.encode(" " + " ".join(speech_clips.sentences(s, 2))) for s in (0, 1, 2)]
    texts = [texts[0], texts[1][:3], texts[2][:12]]
    sot = tok.sot_sequence("en", "transcribe")
    backend = model.word_backend()
    encoded = oracle.encode(features)
    for frames in ([3000] * 3, [2800, 3000, 3000]):
        aligned = []
        for f, text, n in zip(features, texts, frames):
            backend.encode(f)
            aligned.append(backend.align(W.alignment_tokens(tok, sot, text), n))
        want = [[tuple(p) for p in r.alignments] for r in oracle.model.align(encoded, sot, texts, frames)]
        got = [W.alignment_path(a[0], len(sot), len(t)) for a, t in zip(W.batch_alignments(aligned, frames), texts)]
        assert got == want
        if frames[0] == frames[1]:
            alone = [W.alignment_path(a[0], len(sot), len(t)) for a, t in zip(aligned, texts)]
            assert alone[0] == want[0] and alone != want     # the longest has no padding rows
