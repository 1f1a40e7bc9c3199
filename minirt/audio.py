"""Whisper's audio front end in numpy: a 16 kHz mono WAV -> the normalized log-mel spectrogram the
encoder takes, [1, n_mels, 3000] for 30 s.

As openai-whisper's `log_mel_spectrogram` (and Hugging Face's WhisperFeatureExtractor) computes it:
samples as int16 / 32768, padded with zeros or cut to 30 s (480000 samples); an STFT with a
400-sample periodic Hann window, hop 160, centred frames (reflect padding of 200 at both ends);
power |X|^2 with the last frame dropped; 80 (or 128) mel filters on the Slaney scale with Slaney
area normalisation (librosa.filters.mel(sr=16000, n_fft=400, n_mels=80)); log10 clamped at 1e-10;
then max(x, x.max() - 8) and (x + 4) / 4.

Only 16-bit PCM WAV at 16 kHz is read (several channels are averaged); resample other files first,
e.g. `sox in.wav -r 16000 -c 1 -b 16 out.wav`.
"""
from __future__ import annotations

import wave

import numpy as np

from .errors import InputError

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE      # 480000
N_FRAMES = N_SAMPLES // HOP_LENGTH           # 3000


def read_wav(path, sample_rate=SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples in [-1, 1) from a 16-bit PCM WAV recorded at `sample_rate`."""
    try:
        with wave.open(str(path), "rb") as w:
            rate, width, channels, n = w.getframerate(), w.getsampwidth(), w.getnchannels(), w.getnframes()
            raw = w.readframes(n)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (wave.Error, EOFError, OSError) as e:
        raise InputError(f"{path}: not a PCM WAV file minirt can read ({e}); convert it with e.g. "
                         f"`sox in.wav -r 16000 -c 1 -b 16 out.wav`") from None
    if width != 2:
        raise InputError(f"{path}: {8 * width}-bit samples; minirt reads 16-bit PCM WAV "
                         f"(`sox in.wav -b 16 out.wav`)")
    if rate != sample_rate:
        raise InputError(f"{path}: sample rate {rate} Hz; Whisper needs {sample_rate} Hz and minirt does not "
                         f"resample (`sox in.wav -r {sample_rate} out.wav`)")
    x = np.frombuffer(raw, "<i2")
    x = x[:len(x) - len(x) % channels].reshape(-1, channels)
    if channels == 1:
        return x[:, 0].astype(np.float32) / np.float32(32768.0)
    return (x.astype(np.float32) / np.float32(32768.0)).mean(axis=1, dtype=np.float32)


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
    audio = np.asarray(audio, np.float32)
    if len(audio) >= length:
        return audio[:length]
    return np.pad(audio, (0, length - len(audio)))


def hz_to_mel(f):
    """Slaney's mel scale (librosa's default, htk=False): linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(f >= min_log_hz, min_log_mel + np.log(np.maximum(f, min_log_hz) / min_log_hz) / logstep,
                    f / f_sp)


def mel_to_hz(m):
    m = np.asarray(m, np.float64)
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    return np.where(m >= min_log_mel, min_log_hz * np.exp(logstep * (m - min_log_mel)), f_sp * m)


def mel_filters(n_mels: int = 80, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """[n_mels, 1 + n_fft // 2] triangular filters, Slaney scale and normalisation, 0 Hz to Nyquist:
    librosa.filters.mel(sr=sample_rate, n_fft=n_fft, n_mels=n_mels), in float64."""
    fft_hz = np.linspace(0, sample_rate / 2, 1 + n_fft // 2)
    edges = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sample_rate / 2), n_mels + 2))
    width = np.diff(edges)
    ramps = edges[:, None] - fft_hz[None, :]
    lower = -ramps[:-2] / width[:-1, None]
    upper = ramps[2:] / width[1:, None]
    w = np.maximum(0, np.minimum(lower, upper))
    return w * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """[n_mels, len(audio) // 160] float32: Whisper's normalized log-mel of `audio` as given (no padding
    to 30 s; see whisper_features)."""
    audio = np.asarray(audio, np.float64)
    if audio.ndim != 1 or len(audio) <= N_FFT // 2:
        raise InputError(f"audio must be 1-D with more than {N_FFT // 2} samples, got shape {list(audio.shape)}")
    x = np.pad(audio, N_FFT // 2, mode="reflect")
    n_frames = 1 + (len(x) - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(x, (n_frames, N_FFT), (x.strides[0] * HOP_LENGTH, x.strides[0]))
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)     # periodic Hann
    spec = np.fft.rfft(frames * window, axis=-1)[:-1]                     # Whisper drops the last frame
    power = spec.real ** 2 + spec.imag ** 2
    mel = mel_filters(n_mels) @ power.T
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)


def whisper_features(audio, n_mels: int = 80, n_frames: int = N_FRAMES) -> np.ndarray:
    """The encoder input [1, n_mels, n_frames] from a WAV path or 16 kHz float samples, padded or cut to
    n_frames * 160 samples (30 s for the usual 3000 frames)."""
    if not isinstance(audio, np.ndarray):
        audio = read_wav(audio)
    return log_mel_spectrogram(pad_or_trim(audio, n_frames * HOP_LENGTH), n_mels)[None]
