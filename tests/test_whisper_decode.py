"""minirt.whisper's transcription against faster-whisper (the oracle: CTranslate2 on the CPU in float32) with the
same tiny.en CTranslate2 folder (tests/real_whisper.py), on models/speech-sample.wav and on clips spoken by
espeak-ng (tests/speech_clips.py): the same segments with the same token ids, timestamps, seek, temperature and
text; avg_logprob and no_speech_prob to float32 rounding (the two models run different float32 kernels).

minirt runs its numpy reference backend here; a Vulkan decoder behind the same DecoderBackend interface must give
the same tokens.
"""
import numpy as np
import pytest

import real_whisper
import speech_clips

faster_whisper = pytest.importorskip("faster_whisper", reason="faster-whisper (the oracle) is not installed")

needs_espeak = pytest.mark.skipif(not speech_clips.espeak_available(),
                                  reason="espeak-ng is not installed (tools/setup.sh installs it)")


@pytest.fixture(scope="module")
def ct2_dir():
    try:
        return real_whisper.tiny_en_ct2_dir()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")


@pytest.fixture(scope="module")
def oracle(ct2_dir):
    return faster_whisper.WhisperModel(str(ct2_dir), device="cpu", compute_type="float32", cpu_threads=1)


@pytest.fixture(scope="module")
def model(ct2_dir):
    from minirt.whisper import WhisperModel
    return WhisperModel(ct2_dir, backend="reference")


def both(oracle, model, audio, **options):
    fs, finfo = oracle.transcribe(audio, **options)
    ms, minfo = model.transcribe(audio, **options)
    fs, ms = list(fs), list(ms)
    assert (minfo.language, minfo.language_probability) == (finfo.language, finfo.language_probability)
    assert minfo.duration == finfo.duration
    return fs, ms


def assert_same(fs, ms):
    """Segment for segment: token ids, times, seek, temperature, text equal; scores to float32 rounding."""
    def key(s):
        return s.id, s.seek, s.start, s.end, s.tokens, s.text, s.temperature

    assert [key(s) for s in ms] == [key(s) for s in fs]
    for f, m in zip(fs, ms):
        assert m.avg_logprob == pytest.approx(f.avg_logprob, abs=1e-3)
        assert m.no_speech_prob == pytest.approx(f.no_speech_prob, abs=1e-3)
        assert m.compression_ratio == f.compression_ratio


def wer(ref: str, hyp: str) -> float:
    r, h = ref.lower().split(), hyp.lower().split()
    d = list(range(len(h) + 1))
    for i in range(1, len(r) + 1):
        prev, d[0] = d[0], i
        for j in range(1, len(h) + 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (r[i - 1] != h[j - 1]))
    return d[len(h)] / max(1, len(r))


def test_speech_sample_greedy_and_beam(oracle, model):
    """The committed 16 kHz WAV, by path (both read the same int16 samples), with faster-whisper's default
    options (temperature fallback included): greedy and a beam of 5."""
    path = str(real_whisper.SPEECH)
    for beam in (1, 5):
        fs, ms = both(oracle, model, path, beam_size=beam)
        assert_same(fs, ms)
        assert len(ms) == 1 and ms[0].temperature == 0.0
        assert wer(real_whisper.SPEECH_TEXT, ms[0].text) <= 0.2


@needs_espeak
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_short_sentences_greedy(oracle, model, seed):
    """One spoken sentence (3-5 s): a window padded with zero features, faster-whisper's convention."""
    audio = speech_clips.clip(speech_clips.sentences(seed, 1))
    fs, ms = both(oracle, model, audio, beam_size=1, temperature=0.0)
    assert ms and ms[0].tokens[0] == model.tokenizer.timestamp_begin
    assert_same(fs, ms)


@needs_espeak
def test_25s_clip_greedy_beam_and_without_timestamps(oracle, model):
    audio, texts = speech_clips.clip_of_length(7, 28)
    assert 20 < len(audio) / 16000 <= 28
    fs, ms = both(oracle, model, audio, beam_size=1, temperature=0.0)
    assert_same(fs, ms)
    assert len(ms) >= 3                                  # split on timestamp pairs
    assert wer(" ".join(texts), " ".join(s.text for s in ms)) < 0.3

    fs, ms = both(oracle, model, audio, beam_size=1, temperature=0.0, without_timestamps=True)
    assert_same(fs, ms)
    assert len(ms) == 1 and all(t < model.tokenizer.eot for t in ms[0].tokens)

    fs, ms = both(oracle, model, audio, beam_size=5, temperature=0.0)
    f_text, m_text = " ".join(s.text for s in fs), " ".join(s.text for s in ms)
    assert f_text == m_text or wer(f_text, m_text) <= 0.01
    assert [s.tokens for s in ms] == [s.tokens for s in fs]


@needs_espeak
@pytest.mark.parametrize("options", [
    dict(beam_size=3, patience=2.0), dict(beam_size=4, length_penalty=0.0),
    dict(beam_size=2, length_penalty=0.6, patience=1.5), dict(beam_size=1, repetition_penalty=1.3),
    dict(beam_size=3, no_repeat_ngram_size=2), dict(beam_size=1, suppress_blank=False, suppress_tokens=None),
    dict(beam_size=1, max_new_tokens=10), dict(beam_size=1, max_initial_timestamp=0.0)],
    ids=["patience", "length-penalty-0", "length-penalty-patience", "repetition-penalty", "no-repeat-ngram",
         "no-suppression", "max-new-tokens", "max-initial-timestamp-0"])
def test_decoding_options(oracle, model, options):
    """CTranslate2's search and filter options as faster-whisper passes them, on a 14 s clip."""
    audio, _ = speech_clips.clip_of_length(3, 14)
    fs, ms = both(oracle, model, audio, temperature=0.0, **options)
    assert ms
    assert_same(fs, ms)


@needs_espeak
def test_two_windows_prompt_options(oracle, model):
    """About 35 s: two windows, the second prompted with the first's text (or not), an initial prompt."""
    audio, _ = speech_clips.clip_of_length(5, 36, pause=0.7)
    assert len(audio) > 30 * 16000
    for options in (dict(initial_prompt="Sentences read aloud for a test."),
                    dict(condition_on_previous_text=False)):
        fs, ms = both(oracle, model, audio, beam_size=1, temperature=0.0, **options)
        assert_same(fs, ms)
        assert {s.seek for s in ms} != {0}               # a second window


@pytest.mark.slow
@needs_espeak
def test_long_form_greedy(oracle, model):
    """About 150 s of speech: the seek loop over six or more windows, each prompted with the previous text."""
    audio, texts = speech_clips.clip_of_length(11, 150, pause=0.8)
    fs, ms = both(oracle, model, audio, beam_size=1, temperature=0.0)
    assert_same(fs, ms)
    assert len({s.seek for s in ms}) >= 5
    assert ms[-1].end > 140
    assert wer(" ".join(texts), " ".join(s.text for s in ms)) < 0.3


def test_silence_and_empty_audio(oracle, model):
    rng = np.random.default_rng(0)
    quiet = (rng.standard_normal(16000 * 8) * 1e-4).astype(np.float32)
    fs, ms = both(oracle, model, quiet, beam_size=1, temperature=0.0)
    assert_same(fs, ms)
    fs, ms = both(oracle, model, np.zeros(0, np.float32), beam_size=1)
    assert fs == [] and ms == []


def test_hugging_face_folder_gives_the_ctranslate2_folders_tokens(model):
    """The same weights as Hugging Face safetensors (converted by models/ct2_to_safetensors.py): the same
    transcript, and the same suppress_blank tokens (the tokenizer's space and <|endoftext|>, as the CTranslate2
    config.json lists them)."""
    from minirt.whisper import WhisperModel
    try:
        hf = WhisperModel(real_whisper.tiny_en_hf_dir(), backend="reference")
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    assert hf.suppress_blank_ids == model.suppress_blank_ids == [220, 50256]
    a = list(hf.transcribe(str(real_whisper.SPEECH), beam_size=1)[0])
    b = list(model.transcribe(str(real_whisper.SPEECH), beam_size=1)[0])
    assert [(s.tokens, s.start, s.end) for s in a] == [(s.tokens, s.start, s.end) for s in b]


def test_reference_first_steps_against_transformers(model):
    """The reference backend's logits at the prompt and the first steps against Hugging Face transformers'
    WhisperForConditionalGeneration (torch, CPU, float32) with the same weights and features, when both are
    installed (tools/setup.sh installs them): relative error at most 1e-4 at each position (as
    tests/test_whisper_transformers.py measures it; about 4e-6 here)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (optional cross-check)")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (optional cross-check)")
    from minirt.whisper.features import LogMel
    from minirt.whisper.audio_input import load_audio
    folder = real_whisper.tiny_en_hf_dir()
    hf = transformers.WhisperForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32).eval()
    feats = LogMel(load_audio(str(real_whisper.SPEECH))).window(0, 300)
    tokens = [50257, 50363, 18435, 11, 428]
    b = model.backend
    b.encode(feats)
    ours = [b.start(tokens[:2], [0, 1])]
    for t in tokens[2:]:
        ours.append(b.step(np.array([t])))
    ours = np.concatenate(ours)
    with torch.no_grad():
        theirs = hf(input_features=torch.from_numpy(feats[None]),
                    decoder_input_ids=torch.tensor([tokens])).logits[0].numpy()
    from test_whisper_transformers import TOLERANCE, relative_errors
    err = relative_errors(ours, theirs)
    assert err.max() <= TOLERANCE, f"relative errors per position {np.array2string(err, precision=2)}"
