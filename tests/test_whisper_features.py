"""minirt.whisper's log-mel windows against faster-whisper's FeatureExtractor (whole audio, then each window cut out
and zero-padded), its tokenizer against faster-whisper's, and the audio reader (WAV variants, resampling, other
formats, errors)."""
import struct
import wave

import numpy as np
import pytest

import real_whisper
from minirt.errors import InputError
from minirt.whisper.audio_input import load_audio, read_wav
from minirt.whisper.features import N_FRAMES, LogMel

faster_whisper = pytest.importorskip("faster_whisper", reason="faster-whisper (the oracle) is not installed")


def fw_windows(audio):
    from faster_whisper.audio import pad_or_trim
    from faster_whisper.feature_extractor import FeatureExtractor
    feats = FeatureExtractor()(audio)
    content = feats.shape[-1] - 1
    return feats, {seek: pad_or_trim(feats[:, seek:seek + min(N_FRAMES, content - seek)])
                   for seek in sorted({0, 1234 % max(1, content), max(0, content - 17)} | set(range(0, content, 2871)))
                   if seek < content}


@pytest.mark.parametrize("n", [0, 1, 199, 200, 201, 400, 16000 * 3 + 7, 16000 * 59])
def test_windows_equal_faster_whisper_short_audio(n):
    """Up to a minute: computed at once, as faster-whisper does: equal to the bit."""
    rng = np.random.default_rng(n)
    audio = (rng.standard_normal(n) * 0.1).astype(np.float32)
    audio[: n // 3] *= 1e-3
    feats, windows = fw_windows(audio)
    mel = LogMel(audio)
    assert mel.n_frames == feats.shape[-1] and mel.content_frames == feats.shape[-1] - 1
    for seek, ref in windows.items():
        np.testing.assert_array_equal(mel.window(seek, min(N_FRAMES, mel.content_frames - seek)), ref)


@pytest.mark.parametrize("seconds", [61.3, 95])
def test_windows_equal_faster_whisper_long_audio(seconds):
    """Longer audio is computed window by window (a pass for the maximum first): equal to float32 rounding."""
    rng = np.random.default_rng(1)
    audio = (rng.standard_normal(int(seconds * 16000)) * 0.1).astype(np.float32)
    audio[: len(audio) // 3] *= 1e-3
    feats, windows = fw_windows(audio)
    mel = LogMel(audio)
    assert mel.n_frames == feats.shape[-1]
    for seek, ref in windows.items():
        np.testing.assert_allclose(mel.window(seek, min(N_FRAMES, mel.content_frames - seek)), ref, atol=1e-6, rtol=0)


def test_speech_sample_window():
    from faster_whisper.audio import decode_audio
    audio = load_audio(str(real_whisper.SPEECH))
    np.testing.assert_array_equal(audio, decode_audio(str(real_whisper.SPEECH)))
    _, windows = fw_windows(audio)
    mel = LogMel(audio)
    np.testing.assert_array_equal(mel.window(0, mel.content_frames), windows[0])


# -- tokenizer ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizers_pair():
    import tokenizers
    from faster_whisper.tokenizer import Tokenizer
    from minirt.whisper.tokenizer import WhisperTokenizer
    try:
        path = real_whisper.tokenizer_json()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en tokenizer unavailable: {e}")
    return (WhisperTokenizer.from_file(path, multilingual=False),
            Tokenizer(tokenizers.Tokenizer.from_file(str(path)), multilingual=False))


def test_tokenizer_matches_faster_whisper(tokenizers_pair):
    from faster_whisper.transcribe import get_suppressed_tokens
    ours, theirs = tokenizers_pair
    for name in ("eot", "sot", "transcribe", "translate", "sot_lm", "sot_prev", "no_speech", "no_timestamps",
                 "timestamp_begin"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert (ours.sot, ours.eot, ours.no_speech, ours.timestamp_begin) == (50257, 50256, 50361, 50363)
    assert ours.sot_sequence(None) == theirs.sot_sequence == [50257]
    assert ours.non_speech_tokens == theirs.non_speech_tokens
    for opt in ([-1], [-1, 7, 50], [13]):
        assert ours.suppressed_tokens(opt) == get_suppressed_tokens(theirs, list(opt))
    assert ours.suppressed_tokens(None) == ours.suppressed_tokens([]) == ()
    text = " Hello, this is a short test of speech recognition. Ça va? 東京"
    ids = ours.encode(text)
    assert ids == theirs.encode(text) and ours.decode(ids) == text
    with_ts = [50363] + ids[:3] + [50400, 50400] + ids[3:5] + [50450]
    assert ours.decode_with_timestamps(with_ts) == theirs.decode_with_timestamps(with_ts)
    assert ours.decode(with_ts) == theirs.decode(with_ts)


def test_multilingual_start_sequence(tokenizers_pair):
    from minirt.whisper.tokenizer import WhisperTokenizer
    ml = WhisperTokenizer(tokenizers_pair[0].tokenizer, multilingual=True)
    assert ml.sot_sequence("de", "translate") == [50257, ml.language_tokens["de"], ml.translate]
    assert list(ml.language_tokens)[:3] == ["en", "zh", "de"] and ml.language_tokens["en"] == 50258
    with pytest.raises(ValueError, match="not a language code"):
        ml.sot_sequence("xx")
    with pytest.raises(ValueError, match="task"):
        ml.sot_sequence("en", "summarize")


# -- audio input -------------------------------------------------------------------------------------------

def write_wav(path, data: bytes, rate, channels, bits, tag=1, extensible=False):
    block = channels * bits // 8
    if extensible:
        fmt = struct.pack("<HHIIHHHHI", 0xFFFE, channels, rate, rate * block, block, bits, 22, bits, 0)
        fmt += struct.pack("<H", tag) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
    else:
        fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"LIST" + struct.pack("<I", 4) + b"INFO"
    body += b"data" + struct.pack("<I", len(data)) + data
    path.write_bytes(b"RIFF" + struct.pack("<I", len(body)) + body)


def test_wav_variants_read_alike(tmp_path):
    t = np.arange(16000) / 16000
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    i16 = np.round(x * 32767).astype("<i2")
    variants = {
        "pcm16": (i16.tobytes(), 1, 16, 1, False),
        "pcm16-ext": (i16.tobytes(), 1, 16, 1, True),
        "pcm24": (b"".join(int(v).to_bytes(3, "little", signed=True) for v in np.round(x * 8388607).astype(int)),
                  1, 24, 1, False),
        "pcm32": ((np.round(x * 2147483647).astype("<i4")).tobytes(), 1, 32, 1, False),
        "pcm8": (np.round(x * 127 + 128).astype(np.uint8).tobytes(), 1, 8, 1, False),
        "float32": (x.astype("<f4").tobytes(), 1, 32, 3, False),
        "float64-ext": (x.astype("<f8").tobytes(), 1, 64, 3, True),
        "stereo": (np.stack([i16, i16], 1).tobytes(), 2, 16, 1, False),
    }
    for name, (data, ch, bits, tag, ext) in variants.items():
        p = tmp_path / f"{name}.wav"
        write_wav(p, data, 16000, ch, bits, tag, ext)
        got = load_audio(str(p))
        assert got.dtype == np.float32 and got.shape == x.shape, name
        np.testing.assert_allclose(got, x, atol=1.5 / 128 if bits == 8 else 1e-4, err_msg=name)


def test_other_rates_are_resampled(tmp_path):
    t = np.arange(44100) / 44100
    x = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    p = tmp_path / "44k.wav"
    with wave.open(str(p), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(44100)
        w.writeframes(np.round(x * 32767).astype("<i2").tobytes())
    got = load_audio(str(p))
    assert abs(len(got) - 16000) <= 1
    ref = (0.5 * np.sin(2 * np.pi * 440 * np.arange(len(got)) / 16000)).astype(np.float32)
    np.testing.assert_allclose(got[200:-200], ref[200:-200], atol=2e-3)


def test_flac_through_soundfile(tmp_path):
    soundfile = pytest.importorskip("soundfile")
    x = (0.3 * np.sin(np.arange(8000) / 5)).astype(np.float32)
    p = tmp_path / "a.flac"
    soundfile.write(str(p), x, 16000, subtype="PCM_16")
    np.testing.assert_allclose(load_audio(str(p)), x, atol=1e-4)


def test_audio_errors(tmp_path, monkeypatch):
    with pytest.raises(InputError, match="no such file"):
        load_audio(str(tmp_path / "missing.wav"))
    with pytest.raises(InputError, match="is a folder"):
        load_audio(str(tmp_path))
    junk = tmp_path / "junk.ogg"
    junk.write_bytes(b"not audio at all" * 10)
    with pytest.raises(InputError, match="not an audio file|soundfile"):
        load_audio(str(junk))
    import builtins
    real_import = builtins.__import__
    monkeypatch.setattr(builtins, "__import__",
                        lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name)) if name == "soundfile"
                        else real_import(name, *a, **k))
    with pytest.raises(InputError, match="soundfile"):
        load_audio(str(junk))
    monkeypatch.undo()
    p = tmp_path / "alaw.wav"
    write_wav(p, b"\x00" * 100, 8000, 1, 8, tag=6)
    with pytest.raises(InputError, match="format tag"):
        read_wav(str(p))
    with pytest.raises(InputError, match="integer dtype"):
        load_audio(np.zeros(10, np.int16))
    with pytest.raises(InputError, match="1-D"):
        load_audio(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(InputError, match="NaN"):
        load_audio(np.array([0.0, np.nan], np.float32))
    assert load_audio(np.zeros((10, 2), np.float64)).shape == (10,)
