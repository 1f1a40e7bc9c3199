"""The multilingual code paths against faster-whisper, on tiny.en's weights laid out as a multilingual model
(tests/whisper_multilingual.py): language detection, <|startoftranscript|> <|xx|> <|task|> prompts (transcribe and
translate), per-window detection (multilingual=True), the shifted special and timestamp ids."""
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
