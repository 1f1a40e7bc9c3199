"""The multilingual code paths against faster-whisper, on tiny.en's weights laid out as a multilingual model
(tests/whisper_multilingual.py): language detection, <|startoftranscript|> <|xx|> <|task|> prompts (transcribe and
translate), per-window detection (multilingual=True), the shifted special and timestamp ids; BatchedInferencePipeline's
per-chunk detection on the same weights with the languages told apart (whisper_multilingual.languages_apart_ct2_dir)."""
import pytest

import real_whisper
import speech_clips
import whisper_multilingual
from test_whisper_decode import assert_same

faster_whisper = pytest.importorskip("faster_whisper", reason="faster-whisper (the oracle) is not installed")


@pytest.fixture(scope="module")
def folder():
    try:
        return str(whisper_multilingual.tiny_multilingual_ct2_dir())
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")


@pytest.fixture(scope="module")
def oracle(folder):
    m = faster_whisper.WhisperModel(folder, device="cpu", compute_type="float32", cpu_threads=1)
    assert m.model.is_multilingual
    return m


@pytest.fixture(scope="module")
def model(folder):
    from minirt.whisper import WhisperModel
    m = WhisperModel(folder, backend="reference")
    assert m.is_multilingual and len(m.supported_languages) == 99
    tok = m.tokenizer
    assert (tok.eot, tok.sot, tok.no_speech, tok.no_timestamps, tok.timestamp_begin) == (50257, 50258, 50362, 50363,
                                                                                         50364)
    assert m.suppress_blank_ids == [220, 50257]
    return m


def test_language_detection(oracle, model):
    path = str(real_whisper.SPEECH)
    _, finfo = oracle.transcribe(path, beam_size=1)
    _, minfo = model.transcribe(path, beam_size=1)
    f_probs, m_probs = dict(finfo.all_language_probs), dict(minfo.all_language_probs)
    assert set(f_probs) == set(m_probs) and len(m_probs) == 99
    for code, p in f_probs.items():
        assert m_probs[code] == pytest.approx(p, abs=1e-5)
    # the same choice, unless two languages are within float32 rounding of each other (tiny.en's weights give an
    # almost flat distribution)
    assert minfo.language == finfo.language or abs(f_probs[minfo.language] - finfo.language_probability) < 1e-5
    assert minfo.language_probability == pytest.approx(finfo.language_probability, abs=1e-5)


@pytest.mark.parametrize("options", [dict(language="en"), dict(language="de", task="translate"),
                                     dict(language="fr", without_timestamps=True),
                                     dict(language="en", beam_size=5)], ids=["en", "de-translate", "fr-no-ts", "beam5"])
def test_prompts_and_decoding(oracle, model, options):
    path = str(real_whisper.SPEECH)
    options = dict(dict(beam_size=1, temperature=0.0), **options)
    fs, finfo = oracle.transcribe(path, **options)
    ms, minfo = model.transcribe(path, **options)
    assert minfo.language == finfo.language == options["language"]
    assert_same(list(fs), list(ms))


@pytest.mark.skipif(not speech_clips.espeak_available(), reason="espeak-ng is not installed (tools/setup.sh installs it)")
def test_per_window_detection_and_long_text(oracle, model):
    audio, _ = speech_clips.clip_of_length(7, 28)
    for options in (dict(language="fr", without_timestamps=True), dict(language="en", multilingual=True)):
        options = dict(beam_size=1, temperature=0.0, **options)
        fs, _ = oracle.transcribe(audio, **options)
        ms, _ = model.transcribe(audio, **options)
        assert_same(list(fs), list(ms))


@pytest.mark.skipif(not speech_clips.espeak_available(), reason="espeak-ng is not installed (tools/setup.sh installs it)")
def test_detection_options_clips_prefix_and_words(oracle, model):
    """language_detection_segments / language_detection_threshold from the first clip's start; a prefix and word
    timestamps after the three-token start sequence (the alignment runs after <|startoftranscript|> <|xx|>
    <|task|>)."""
    from test_whisper_parity import assert_same_words
    audio, _ = speech_clips.clip_of_length(5, 36, pause=0.7)
    options = dict(beam_size=1, temperature=0.0, language_detection_segments=2, language_detection_threshold=0.99,
                   clip_timestamps=[3.0], max_new_tokens=30)
    _, finfo = oracle.transcribe(audio, **options)
    _, minfo = model.transcribe(audio, **options)
    assert minfo.language_probability == pytest.approx(finfo.language_probability, abs=1e-5)
    assert dict(minfo.all_language_probs)["en"] == pytest.approx(dict(finfo.all_language_probs)["en"], abs=1e-5)
    path = str(real_whisper.SPEECH)
    options = dict(beam_size=1, temperature=0.0, language="en", prefix="Hello", word_timestamps=True)
    fs, ms = list(oracle.transcribe(path, **options)[0]), list(model.transcribe(path, **options)[0])
    assert_same(fs, ms)
    assert_same_words(fs, ms)


@pytest.mark.skipif(not speech_clips.espeak_available(), reason="espeak-ng is not installed (tools/setup.sh installs it)")
def test_batched_pipeline_detects_each_chunks_language():
    """BatchedInferencePipeline(multilingual=True) against faster-whisper's, on a model whose languages are told apart
    (whisper_multilingual.languages_apart_ct2_dir): each chunk's language, detected on its own encoder output, goes
    into its prompt (greedy in batches of 3; beam search a chunk at a time), the words are aligned in the file's
    language; the same segments, tokens and words. The chunks' languages differ and change what is decoded."""
    import numpy as np
    from faster_whisper.audio import pad_or_trim

    from minirt.whisper import BatchedInferencePipeline, WhisperModel
    from test_whisper_parity import assert_same_words
    try:
        folder = str(whisper_multilingual.languages_apart_ct2_dir())
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    fw = faster_whisper.WhisperModel(folder, device="cpu", compute_type="float32", cpu_threads=1)
    oracle = faster_whisper.BatchedInferencePipeline(fw)
    pipe = BatchedInferencePipeline(WhisperModel(folder, backend="reference"))
    parts = [speech_clips.clip(speech_clips.sentences(s, k)) for s, k in ((0, 1), (1, 2), (2, 1), (3, 1), (4, 2))]
    starts = np.cumsum([0] + [len(a) for a in parts[:-1]]) / 16000
    clips = [{"start": float(s), "end": float(s) + len(a) / 16000} for s, a in zip(starts, parts)]
    audio = np.concatenate(parts)
    features = np.stack([pad_or_trim(fw.feature_extractor(a)[..., :-1]) for a in parts])
    assert len({r[0][0] for r in fw.model.detect_language(fw.encode(features))}) > 1

    def key(s):
        return s.id, s.seek, s.start, s.end, s.text, list(s.tokens), s.temperature
    base = dict(clip_timestamps=clips, vad_filter=False, max_new_tokens=40, multilingual=True)
    for options in (dict(beam_size=1, batch_size=3, language="en", word_timestamps=True),
                    dict(beam_size=2, batch_size=2)):
        options = dict(base, **options)
        fs, finfo = oracle.transcribe(audio, **options)
        ms, minfo = pipe.transcribe(audio, **options)
        fs, ms = list(fs), list(ms)
        assert [key(s) for s in ms] == [key(s) for s in fs] and len(ms) >= 5
        assert [s.avg_logprob for s in ms] == pytest.approx([s.avg_logprob for s in fs], abs=1e-4)
        assert minfo.language == finfo.language and minfo.transcription_options.multilingual
        if options.get("word_timestamps"):
            assert_same_words(fs, ms)
            one = list(oracle.transcribe(audio, **dict(options, multilingual=False))[0])
            assert [s.tokens for s in one] != [s.tokens for s in fs]       # the chunks' languages mattered


@pytest.mark.long
@pytest.mark.skipif(not speech_clips.espeak_available(), reason="espeak-ng is not installed (tools/setup.sh installs it)")
def test_batched_pipeline_languages_on_the_gpu():
    """BatchedInferencePipeline(multilingual=True) on the GPU gives the reference's tokens: each chunk's language read
    from the batch's rows (two chunks of different languages in one batch of 2), and from the one-window state with a
    beam of 2 (long: real tiny windows, about 4 minutes on lavapipe)."""
    import numpy as np

    from minirt.whisper import BatchedInferencePipeline, WhisperModel
    try:
        folder = str(whisper_multilingual.languages_apart_ct2_dir())
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    parts = [speech_clips.clip(speech_clips.sentences(s, 1)) for s in (2, 3, 4)]
    starts = np.cumsum([0] + [len(a) for a in parts[:-1]]) / 16000
    clips = [{"start": float(s), "end": float(s) + len(a) / 16000} for s, a in zip(starts, parts)]
    audio = np.concatenate(parts)
    gpu = BatchedInferencePipeline(WhisperModel(folder, backend="vulkan", max_batch_items=2))
    ref = BatchedInferencePipeline(WhisperModel(folder, backend="reference"))
    for beam in (1, 2):
        opts = dict(beam_size=beam, batch_size=2, language="en", multilingual=True, max_new_tokens=20,
                    clip_timestamps=clips, vad_filter=False)
        got, want = list(gpu.transcribe(audio, **opts)[0]), list(ref.transcribe(audio, **opts)[0])
        assert [s.tokens for s in got] == [s.tokens for s in want] and len(want) == 3
        if beam == 1:
            plain = list(ref.transcribe(audio, **dict(opts, multilingual=False))[0])
            assert [s.tokens for s in plain] != [s.tokens for s in want]
