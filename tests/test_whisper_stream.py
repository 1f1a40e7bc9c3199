"""Audio files read in blocks (minirt.whisper.audio_input.AudioStream): the log-mel windows of a streamed file equal
those of the file read whole (16 kHz, resampled, stereo, FLAC; windows in any order, as language detection and the
seek loop ask for them), soxr's streamed resampling equals its one-shot resampling to the bit, a header that is
wrong about the length still gives the real samples, and an hour of audio is transcribed holding about a window's
worth of memory."""
import tracemalloc
import wave

import numpy as np
import pytest

import real_whisper
from minirt.whisper import features
from minirt.whisper.audio_input import BLOCK_SECONDS, AudioStream, load_audio, resample, resampled_length
from minirt.whisper.features import N_FRAMES, LogMel

pytest.importorskip("soxr", reason="the whisper extra (soxr) is not installed")


def write_wav(path, frames: np.ndarray, rate: int):
    """frames: int16 [n] or [n, channels], or uint8 for 8-bit."""
    frames = frames if frames.ndim == 2 else frames[:, None]
    with wave.open(str(path), "wb") as w:
        w.setnchannels(frames.shape[1])
        w.setsampwidth(frames.dtype.itemsize)
        w.setframerate(rate)
        w.writeframes(frames.tobytes())
    return str(path)


def noise(seconds, rate, channels=1, seed=0):
    """int16 noise, the first third 40 dB quieter (so the log-mel's clamp at max - 8 matters)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    x = (rng.standard_normal((n, channels)) * 3000).astype("<i2")
    x[: n // 3] //= 100
    return x


def seeks(content_frames):
    """Window starts in the order transcription reads them: language detection's first window, then the seek loop
    from 0 (forward, with windows that overlap the previous one, as after a timestamp inside a window), the last
    window, and 0 again (a new pass)."""
    c = content_frames
    order = [0, 0, 1234 % c, 2871, 2871 + 1500, max(0, c - 17), 0]
    return [s for s in order if s < c]


def assert_same_windows(path):
    whole, streamed = LogMel(load_audio(path)), LogMel(AudioStream(path))
    assert len(streamed.samples) == len(whole.samples)
    assert (streamed.n_frames, streamed.max) == (whole.n_frames, whole.max)
    c = whole.content_frames
    for s in seeks(c):
        np.testing.assert_array_equal(streamed.window(s, min(N_FRAMES, c - s)), whole.window(s, min(N_FRAMES, c - s)),
                                      err_msg=f"{path} at frame {s}")
    return whole


@pytest.mark.parametrize("rate,channels,seconds", [(16000, 1, 95.3), (22050, 2, 70.7), (8000, 1, 61.2)])
def test_streamed_windows_equal_the_whole_files(tmp_path, rate, channels, seconds):
    """Several windows (the pass for the maximum in chunks, windows overlapping their predecessors, a restart):
    equal to the bit to the log-mel of the file read whole."""
    mel = assert_same_windows(write_wav(tmp_path / "a.wav", noise(seconds, rate, channels), rate))
    assert mel.content_frames > 2 * N_FRAMES


def test_streamed_flac_equals_the_whole_file(tmp_path):
    soundfile = pytest.importorskip("soundfile")
    p = tmp_path / "a.flac"
    soundfile.write(str(p), noise(64, 44100, 2, seed=3), 44100, subtype="PCM_16")
    assert_same_windows(str(p))


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
def test_streamed_resampling_is_one_shot_resampling(tmp_path, rate):
    """soxr.ResampleStream over blocks of BLOCK_SECONDS gives soxr.resample's samples to the bit, and as many
    as resampled_length() says."""
    x = noise(2.5 * BLOCK_SECONDS, rate, seed=rate)[:, 0]
    p = write_wav(tmp_path / "a.wav", x, rate)
    s = AudioStream(p)
    got = s.read(0, len(s))
    want = resample(x.astype(np.float32) / np.float32(32768), rate)
    assert len(s) == len(want) == resampled_length(len(x), rate)
    np.testing.assert_array_equal(got, want)
    assert s.settle()


def test_a_header_wrong_about_the_length(tmp_path):
    """When decoding gives another number of samples than the header promised, the log-mel is measured again
    with the real number: the windows are those of the file read whole."""
    p = write_wav(tmp_path / "a.wav", noise(70, 16000), 16000)
    for wrong in (+5000, -5000):
        s = AudioStream(p)
        s._n += wrong
        mel = LogMel(s)
        whole = LogMel(load_audio(p))
        assert len(s) == len(whole.samples) and mel.n_frames == whole.n_frames and mel.max == whole.max
        last = whole.content_frames - 100
        np.testing.assert_array_equal(mel.window(last, 100), whole.window(last, 100))


class EndsAtOnce:
    """A DecoderBackend that finds every window silent at once: no_speech_prob near 1 at <|startoftranscript|>,
    <|endoftext|> the likeliest next token, so only the audio and feature path does work."""
    n_mels, n_vocab, n_text_ctx, multilingual = 80, 51864, 448, False

    def __init__(self, tokenizer):
        self.tok, self.windows = tokenizer, 0

    def encode(self, features):
        assert features.shape == (80, N_FRAMES)
        self.windows += 1

    def _logits(self, rows, first=False):
        x = np.zeros((rows, self.n_vocab), np.float32)
        x[:, self.tok.eot] = 5
        if first:
            x[0, self.tok.no_speech] = 30
        return x

    def start(self, prompt, positions):
        out = self._logits(len(positions))
        for i, p in enumerate(positions):
            if p == 0:
                out[i] = self._logits(1, first=True)[0]
        return out

    def step(self, tokens):
        return self._logits(len(tokens))

    def reorder(self, rows):
        pass


def stub_model(backend_factory):
    from minirt.whisper import WhisperModel
    from minirt.whisper.tokenizer import WhisperTokenizer
    try:
        tok = WhisperTokenizer.from_file(real_whisper.tokenizer_json(), multilingual=False)
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en tokenizer unavailable: {e}")
    m = object.__new__(WhisperModel)      # the tokenizer and host code of a model, a stub for the network
    m.tokenizer, m.backend, m.n_mels, m.suppress_blank_ids = tok, backend_factory(tok), 80, [220, tok.eot]
    return m


def cheap_mel(padded, filters):
    """Stands in for the STFT (whose memory is per 30 s chunk: test_the_stft_memory_is_per_chunk)."""
    return np.zeros((filters.shape[0], 1 + (len(padded) - features.N_FFT) // features.HOP_LENGTH), np.float32)


def test_an_hour_is_transcribed_a_window_at_a_time(tmp_path, monkeypatch):
    """60 minutes of 8 kHz 8-bit noise (29 MB of WAV; 230 MB as 16 kHz float32): transcribe() with a backend that
    finds each window silent reads, resamples and cuts the file into 120 windows with a traced peak of a few MB."""
    rate, minutes = 8000, 60
    minute = np.random.default_rng(0).integers(96, 160, rate * 60).astype(np.uint8)
    with wave.open(str(tmp_path / "hour.wav"), "wb") as w:
        w.setnchannels(1), w.setsampwidth(1), w.setframerate(rate)
        for _ in range(minutes):
            w.writeframes(minute.tobytes())
    m = stub_model(EndsAtOnce)
    monkeypatch.setattr(features, "_mel", cheap_mel)
    done = []
    tracemalloc.start()
    try:
        segments, info = m.transcribe(str(tmp_path / "hour.wav"), beam_size=1, without_timestamps=True,
                                      temperature=0.0, progress=lambda d, t: done.append((d, t)))
        assert list(segments) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    decoded = minutes * 60 * 16000 * 4
    assert info.duration == minutes * 60
    assert m.backend.windows == 120 and len(done) == 120 and done[-1] == (3600.0, 3600.0)
    assert peak < 12e6, f"peak {peak / 1e6:.1f} MB for {decoded / 1e6:.0f} MB of decoded audio"


def test_the_stft_memory_is_per_chunk(tmp_path):
    """The real log-mel of a streamed file: the traced peak over 6 minutes is that over 70 s. It is the STFT of one
    30 s chunk (about 35 MB: frames, their spectrum, the power), the same however long the file."""
    peaks = []
    for seconds in (70, 360):
        p = write_wav(tmp_path / f"{seconds}.wav", np.full(seconds * 8000, 128, np.uint8), 8000)
        tracemalloc.start()
        try:
            mel = LogMel(AudioStream(p))
            for s in range(0, mel.content_frames, N_FRAMES):
                mel.window(s, min(N_FRAMES, mel.content_frames - s))
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[1] < 1.1 * peaks[0], [f"{p / 1e6:.1f} MB" for p in peaks]
