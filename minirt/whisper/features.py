"""Whisper's log-mel features as faster-whisper computes them, one 30 s window at a time.

faster-whisper (feature_extractor.py) takes the log-mel of the whole audio at once: 160 zero samples appended,
a centred STFT (reflect padding of 200 at both ends) with a 400-sample periodic Hann window in float32, |X|^2
with the last frame dropped, Slaney mel filters, log10 clamped at 1e-10, max(x, max - 8) over the whole audio,
(x + 4) / 4. Each window's frames are then cut out and padded with zeros to 3000 frames. That last step differs
from openai-whisper and Hugging Face, which pad the audio with silence before the log-mel: a zero in the
normalised log-mel is not silence, and the two conventions give different greedy tokens on many short clips.

Here the frames are computed in chunks (a pass for the global maximum, then one window at a time), so memory
follows the window rather than the length of the audio; the values are faster-whisper's. A file is read the same
way (audio_input.AudioStream): its samples are decoded as the chunks need them.
"""
from __future__ import annotations

import numpy as np

from ..errors import InputError

SAMPLE_RATE = 16000
N_FFT = 400
HOP_LENGTH = 160
N_FRAMES = 3000                      # one 30 s window
TIME_PER_FRAME = HOP_LENGTH / SAMPLE_RATE
_CHUNK = N_FRAMES                    # frames computed per chunk


def mel_filters(n_mels: int, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT) -> np.ndarray:
    """[n_mels, 1 + n_fft // 2] float32 Slaney mel filters, as faster-whisper builds them (librosa's, computed
    in float64 then rounded)."""
    fftfreqs = np.fft.rfftfreq(n=n_fft, d=1.0 / sample_rate)
    mels = np.linspace(0.0, 45.245640471924965, n_mels + 2)       # 0 Hz to 8 kHz on the Slaney scale
    f_sp, min_log_hz = 200.0 / 3, 1000.0
    min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
    freqs = f_sp * mels
    log_t = mels >= min_log_mel
    freqs[log_t] = min_log_hz * np.exp(logstep * (mels[log_t] - min_log_mel))
    fdiff = np.diff(freqs)
    ramps = freqs.reshape(-1, 1) - fftfreqs.reshape(1, -1)
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (freqs[2:n_mels + 2] - freqs[:n_mels]))[:, None]
    return weights.astype(np.float32)


_WINDOW = np.hanning(N_FFT + 1)[:-1].astype(np.float32)


_RFFT_OUT = np.lib.NumpyVersion(np.__version__) >= "2.0.0"      # rfft(out=) and float32 transforms
_BLOCK = 256                         # frames a block of the STFT: its temporaries stay in cache


def _mel(padded: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """[n_mels, n_frames] mel power of the frames of an already padded float32 signal (every frame, the caller
    drops what it does not want).

    The STFT runs a block of frames at a time into one power array: the same values as one whole-signal rfft (each
    frame's transform is its own), but whole-signal temporaries are fresh memory, and faulting it in costs more
    than the FFT on a VM and serialises threads that compute several files at once. The matmul sees the layout the
    whole-signal form gave it, so its sums are the same too."""
    n_frames = 1 + (len(padded) - N_FFT) // HOP_LENGTH
    frames = np.lib.stride_tricks.as_strided(padded, (n_frames, N_FFT),
                                             (padded.strides[0] * HOP_LENGTH, padded.strides[0]))
    power = np.empty((n_frames, N_FFT // 2 + 1), np.float32)
    windowed = np.empty((min(_BLOCK, n_frames), N_FFT), np.float32)
    spec = np.empty((len(windowed), N_FFT // 2 + 1), np.complex64)
    for f in range(0, n_frames, _BLOCK):
        n = min(_BLOCK, n_frames - f)
        np.multiply(frames[f:f + n], _WINDOW, out=windowed[:n])
        if _RFFT_OUT:
            np.fft.rfft(windowed[:n], n=N_FFT, axis=-1, out=spec[:n])
        else:           # numpy 1.x transforms in float64, as faster-whisper's call does there
            spec[:n] = np.fft.rfft(windowed[:n], n=N_FFT, axis=-1)
        np.abs(spec[:n], out=power[f:f + n])
        np.square(power[f:f + n], out=power[f:f + n])
    return filters @ power.T


class ArraySamples:
    """Samples held in memory, read as AudioStream (audio_input.py) reads a file."""

    def __init__(self, audio: np.ndarray):
        audio = np.asarray(audio)
        if audio.ndim != 1:
            raise ValueError(f"audio must be 1-D samples, got shape {list(audio.shape)}")
        self.audio = audio if audio.dtype == np.float32 else audio.astype(np.float32)

    def __len__(self) -> int:
        return len(self.audio)

    def read(self, a: int, b: int) -> np.ndarray:
        return self.audio[a:b]

    def settle(self) -> bool:
        return True


class LogMel:
    """The log-mel frames of one audio signal (float32, 16 kHz), faster-whisper's values, computed on demand.

    `audio` is an array of samples or an AudioStream over a file (audio_input.py), which is read forward: the
    pass for the maximum reads it through once, then each window reads its own samples (and 200 before them),
    so the file is never held whole. Both give the same values for the same samples.

    n_frames is faster-whisper's features.shape[-1]: len(audio) // 160 + 1; the last frame (from the 160 appended
    zeros) counts only towards the maximum, never as content (content_frames = n_frames - 1)."""

    def __init__(self, audio, n_mels: int = 80):
        self.samples = audio if hasattr(audio, "read") else ArraySamples(audio)
        self.filters = mel_filters(n_mels)
        self.n_mels = n_mels
        while True:
            self._measure()
            if self.samples.settle():       # a file's header gave its length; else measure again with the real one
                break

    def _measure(self):
        """n_frames and the maximum over all frames (the whole audio's, as faster-whisper takes it)."""
        n = len(self.samples)
        # the signal faster-whisper transforms: audio, 160 zeros, reflect-padded by 200 at both ends
        self._n_ext = n + HOP_LENGTH
        self.n_frames = (self._n_ext + 2 * (N_FFT // 2) - N_FFT) // HOP_LENGTH + 1 - 1      # last STFT frame dropped
        self._whole = None
        with np.errstate(over="ignore", invalid="ignore"):      # an overflow is reported below
            if self.n_frames <= 2 * _CHUNK:       # short audio: all of it at once, exactly as faster-whisper
                self._whole = self._mel_frames(0, self.n_frames)
                self.max = self._whole.max()
            else:
                self.max = max(self._mel_frames(f, min(f + _CHUNK, self.n_frames)).max()
                               for f in range(0, self.n_frames, _CHUNK))
        self.max = np.float32(self.max)
        if not np.isfinite(self.max):
            # float32 power spectra overflow for samples beyond about 1e16: every frame would be inf or NaN
            # after the normalisation by the maximum, and the transcript garbage
            peak = f" (they reach {float(np.abs(self.samples.audio).max()):.3g})" \
                if isinstance(self.samples, ArraySamples) else ""
            raise InputError(f"the audio's samples are too large for a log-mel in float32{peak}; give samples in "
                             f"[-1, 1] (e.g. divide int16 samples by 32768)")

    @property
    def content_frames(self) -> int:
        return self.n_frames - 1

    def _ext(self, a: int, b: int) -> np.ndarray:
        """Samples [a, b) of the audio with 160 zeros appended (0 <= a <= b <= len + 160)."""
        n = len(self.samples)
        if b <= n:
            return self.samples.read(a, b)
        return np.concatenate([self.samples.read(min(a, n), n), np.zeros(b - max(a, n), np.float32)])

    def _mel_frames(self, f0: int, f1: int) -> np.ndarray:
        """log10 of the clamped mel power of frames [f0, f1) (not yet normalised)."""
        half = N_FFT // 2
        s0, s1 = f0 * HOP_LENGTH - half, (f1 - 1) * HOP_LENGTH + half      # in extended-signal coordinates
        if s0 >= 0 and s1 <= self._n_ext:
            padded = self._ext(s0, s1)
        elif f0 == 0 and f1 == self.n_frames:
            padded = np.pad(self._ext(0, self._n_ext), half, mode="reflect")
        elif s0 < 0:        # the first chunk of long audio: reflect the start (it holds far more than 200 samples)
            padded = np.pad(self._ext(0, max(s1, half + 1)), (half, 0), mode="reflect")
        else:               # the last chunk of long audio: reflect the end (chunks after the first are >= 1 window)
            padded = np.pad(self._ext(s0, self._n_ext), (0, s1 - self._n_ext), mode="reflect")
        mel = _mel(np.ascontiguousarray(padded, np.float32), self.filters)[:, :f1 - f0]
        return np.log10(np.maximum(mel, np.float32(1e-10), out=mel), out=mel)

    def frames(self, start: int, count: int) -> np.ndarray:
        """[n_mels, count] normalised log-mel frames from `start`."""
        if self._whole is not None:
            log = self._whole[:, start:start + count]
        else:
            log = self._mel_frames(start, start + count)
        log = np.maximum(log, self.max - np.float32(8.0))
        return (log + np.float32(4.0)) / np.float32(4.0)

    def window(self, seek: int, size: int, n_frames: int = N_FRAMES) -> np.ndarray:
        """The encoder input for frames [seek, seek + size): [n_mels, n_frames] float32, zero-padded at the end
        (faster-whisper's pad_or_trim of the feature window)."""
        out = np.zeros((self.n_mels, n_frames), np.float32)
        size = min(size, n_frames)
        if size > 0:
            out[:, :size] = self.frames(seek, size)
        return out


def whisper_features(audio, n_mels: int = 80, n_frames: int = N_FRAMES) -> np.ndarray:
    """The encoder input [1, n_mels, n_frames] of one window as openai-whisper and Hugging Face compute it, for a
    Session that runs a Whisper encoder: the audio (a path, read by audio_input.load_audio, or 16 kHz float samples)
    padded with silence or cut to n_frames * 160 samples, then the log-mel of that window alone (its own maximum).
    WhisperModel's windows are faster-whisper's instead (LogMel: the log-mel of the whole audio, then cut)."""
    from .audio_input import load_audio
    x = load_audio(audio)
    n = n_frames * HOP_LENGTH
    x = x[:n] if len(x) >= n else np.pad(x, (0, n - len(x)))
    padded = np.ascontiguousarray(np.pad(x, N_FFT // 2, mode="reflect"), np.float32)
    mel = _mel(padded, mel_filters(n_mels))[:, :n_frames]          # Whisper drops the last frame
    log = np.log10(np.maximum(mel, 1e-10, dtype=np.float64))      # silence gives exactly (-10 + 4) / 4
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0).astype(np.float32)[None]
