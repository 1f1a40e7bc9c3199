"""minirt.audio.whisper_features (minirt.whisper.features): one window's log-mel as openai-whisper computes it, and
the filter bank, against an independent float64 reimplementation and openai-whisper's own filter bank; `minirt run
model speech.wav`. Reading files (every WAV variant, other rates, errors) is tests/test_whisper_features.py's."""
import importlib.util
import pathlib
import struct

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from minirt import audio
from minirt.whisper.audio_input import load_audio
from minirt.whisper.features import mel_filters

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEECH = ROOT / "models" / "speech-sample.wav"


# -- an independent reference, written from Whisper's description: a RIFF parser instead of `wave`,
# an explicit DFT instead of an FFT, filters built one triangle at a time --------------------------

def ref_read_wav(path):
    raw = pathlib.Path(path).read_bytes()
    assert raw[:4] == b"RIFF" and raw[8:12] == b"WAVE"
    pos, fmt, data = 12, None, None
    while pos + 8 <= len(raw):
        cid, size = raw[pos:pos + 4], struct.unpack("<I", raw[pos + 4:pos + 8])[0]
        body = raw[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif cid == b"data":
            data = body
        pos += 8 + size + (size & 1)
    tag, channels, rate, _, _, bits = fmt
    assert (tag, channels, rate, bits) == (1, 1, 16000, 16)
    return np.array(struct.unpack(f"<{len(data) // 2}h", data), np.float64) / 32768.0


def ref_slaney_filters(n_mels, sr=16000, n_fft=400):
    def to_mel(f):
        return f * 3 / 200 if f < 1000 else 15 + 27 * np.log(f / 1000) / np.log(6.4)

    def to_hz(m):
        return m * 200 / 3 if m < 15 else 1000 * 6.4 ** ((m - 15) / 27)
    top = to_mel(sr / 2)
    edges = [to_hz(top * i / (n_mels + 1)) for i in range(n_mels + 2)]
    bins = [k * sr / n_fft for k in range(n_fft // 2 + 1)]
    fb = np.zeros((n_mels, len(bins)))
    for m in range(n_mels):
        lo, c, hi = edges[m:m + 3]
        for k, f in enumerate(bins):
            if lo <= f <= c:
                fb[m, k] = (f - lo) / (c - lo)
            elif c < f <= hi:
                fb[m, k] = (hi - f) / (hi - c)
        fb[m] *= 2 / (hi - lo)      # Slaney: equal area
    return fb


def ref_log_mel(samples, filters):
    a = np.zeros(480000)
    a[:min(len(samples), 480000)] = samples[:480000]
    a = np.concatenate([a[200:0:-1], a, a[-2:-202:-1]])                  # reflect, as torch.stft(center=True)
    n = np.arange(400)
    window = np.sin(np.pi * n / 400) ** 2                                  # periodic Hann
    frames = np.stack([a[i * 160:i * 160 + 400] for i in range(3000)]) * window   # the 3001st is dropped
    k = np.arange(201)[:, None]
    re, im = frames @ np.cos(2 * np.pi * k * n / 400).T, frames @ np.sin(2 * np.pi * k * n / 400).T
    mel = filters @ (re ** 2 + im ** 2).T
    x = np.log10(np.clip(mel, 1e-10, None))
    x = np.maximum(x, x.max() - 8)
    return (x + 4) / 4


@pytest.fixture(scope="module")
def speech():
    return ref_read_wav(SPEECH)


def test_speech_sample_is_a_few_seconds_of_16khz_speech(speech):
    assert 2 * 16000 < len(speech) < 8 * 16000
    np.testing.assert_array_equal(load_audio(SPEECH), speech.astype(np.float32))
    assert np.abs(speech).max() > 0.1


def test_mel_filters_match_the_slaney_formulas():
    for n in (80, 128):
        ref = ref_slaney_filters(n)
        got = mel_filters(n)
        assert got.shape == (n, 201) and got.dtype == np.float32
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-7 * ref.max())       # float32 rounding


def test_log_mel_matches_independent_reference(speech):
    got = audio.whisper_features(SPEECH)
    assert got.shape == (1, 80, 3000) and got.dtype == np.float32
    ref = ref_log_mel(speech, ref_slaney_filters(80))
    assert np.abs(got[0] - ref).max() <= 1e-4


def test_filters_and_log_mel_match_openai_whisper(speech):
    """openai-whisper's assets/mel_filters.npz (librosa.filters.mel, float32) is the filter bank Whisper
    runs with; with it, the reference log-mel must still match ours to 1e-4."""
    import real_whisper
    try:
        path = real_whisper.whisper_mel_filters()
    except real_whisper.Unavailable as e:
        pytest.skip(f"openai-whisper's mel filters unavailable: {e}")
    with np.load(path) as f:
        for n in (80, 128):
            np.testing.assert_allclose(mel_filters(n), f[f"mel_{n}"], rtol=0, atol=1e-7)
        whisper_filters = f["mel_80"].astype(np.float64)
    ref = ref_log_mel(speech, whisper_filters)
    assert np.abs(audio.whisper_features(SPEECH)[0] - ref).max() <= 1e-4


def test_padding_cutting_silence_and_128_bins():
    x = audio.whisper_features(np.zeros(16000, np.float32))
    np.testing.assert_array_equal(x, -1.5)           # log10(1e-10) = -10 -> (-10 + 4) / 4
    long = np.random.default_rng(0).standard_normal(35 * 16000).astype(np.float32) * 0.1
    a = audio.whisper_features(long, n_mels=128)
    b = audio.whisper_features(long[:480000], n_mels=128)
    assert a.shape == (1, 128, 3000)
    np.testing.assert_array_equal(a, b)
    assert audio.whisper_features(long, n_frames=200).shape == (1, 80, 200)


# -- minirt run model.onnx speech.wav -----------------------------------------------------------------

def _whisper_encoder():
    spec = importlib.util.spec_from_file_location("whisper_encoder", ROOT / "models" / "whisper_encoder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_runs_a_wav_through_a_whisper_encoder(tmp_path):
    from minirt import Session
    from minirt.cli import main
    m = _whisper_encoder().build_whisper_encoder(opset=20, layers=1, n_frames=200)
    onnx.save(m, tmp_path / "enc.onnx")
    r = CliRunner().invoke(main, ["run", str(tmp_path / "enc.onnx"), str(SPEECH), "-o", str(tmp_path / "y.npy"), "-q"])
    assert r.exit_code == 0, r.output
    with Session(str(tmp_path / "enc.onnx")) as s:
        want = s.run(audio.whisper_features(SPEECH, n_frames=200))
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


def test_cli_refuses_a_wav_for_other_models(tmp_path):
    from onnx import helper

    from minirt.cli import EXIT_MODEL, main
    from oracle import make_model
    onnx.save(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": (4,)}, ["y"]), tmp_path / "relu.onnx")
    r = CliRunner().invoke(main, ["run", str(tmp_path / "relu.onnx"), str(SPEECH), "-q"])
    assert r.exit_code == EXIT_MODEL
    assert "a .wav input needs a Whisper encoder" in r.output
