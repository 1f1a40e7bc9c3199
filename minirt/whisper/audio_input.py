"""Audio for transcription: a path or an array in, float32 16 kHz mono samples out.

WAV files are read here (PCM 8/16/24/32-bit, IEEE float 32/64, WAVE_FORMAT_EXTENSIBLE), any sample rate and
channel count: channels are averaged, other rates resampled with soxr (its default high quality). Other formats
(FLAC, OGG, ...) go through `soundfile` when it is installed. Integer samples are scaled as faster-whisper's
decoder leaves them (int16 / 32768), so a 16 kHz 16-bit WAV gives the very samples faster-whisper transcribes.

A file is read in two ways with the same samples: load_audio() reads it whole (one soxr call), AudioStream reads it
in blocks (soxr.ResampleStream), keeping only the samples the caller still needs, so transcribing an hour of audio
holds a window's worth, not the hour. soxr's stream gives one-shot resampling's samples to the bit (its output
depends on the input only, not on how the input is cut into blocks; tests/test_whisper_stream.py checks it).
"""
from __future__ import annotations

import os
import struct

import numpy as np

from ..errors import InputError

SAMPLE_RATE = 16000
BLOCK_SECONDS = 10                   # a file is decoded and resampled this many seconds at a time

_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


def load_audio(audio, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """float32 mono samples at `sample_rate` from a path (str or os.PathLike) or an array of samples already at
    that rate (1-D; float32 is used as is, other dtypes are converted; a 2-D [samples, channels] array, with more
    samples than channels, is mixed down). Raises InputError for an unreadable or unsupported file."""
    if isinstance(audio, (str, os.PathLike)):
        samples, rate = read_audio_file(os.fspath(audio))
        return resample(samples, rate, sample_rate)
    return check_array(audio)


def audio_samples(audio, sample_rate: int = SAMPLE_RATE):
    """What LogMel reads: an AudioStream over a path (read in blocks, never whole), or the checked array."""
    if isinstance(audio, (str, os.PathLike)):
        return AudioStream(os.fspath(audio), sample_rate)
    return check_array(audio)


def check_array(audio) -> np.ndarray:
    """An array of samples as float32 mono (see load_audio); InputError for anything else."""
    if isinstance(audio, (bytes, bytearray)) or hasattr(audio, "read"):
        raise InputError("audio must be a file path or an array of samples; file objects and bytes are not read")
    if isinstance(audio, tuple):
        raise InputError(f"audio is a {len(audio)}-tuple; give one array of 16 kHz samples (or a path). "
                         f"(samples, sample rate) pairs are for transcribe_batch(); resample to 16 kHz first")
    try:
        a = np.asarray(audio)
    except (ValueError, TypeError) as e:       # a ragged list, an object numpy cannot make an array of
        raise InputError(f"audio is not an array of samples ({e})") from None
    if a.dtype.kind not in "fiu":
        raise InputError(f"audio array has dtype {a.dtype}; give float samples in [-1, 1]")
    if a.ndim == 2:
        if a.shape[1] >= a.shape[0]:
            raise InputError(f"audio array of shape {list(a.shape)}: a 2-D array is read as [samples, channels] "
                             f"(more samples than channels) and mixed down; for [channels, samples] give "
                             f"audio.T or audio.mean(axis=0)")
        a = a.astype(np.float32).mean(axis=1, dtype=np.float32)
    elif a.ndim != 1:
        raise InputError(f"audio array must be 1-D samples (or [samples, channels]), got shape {list(a.shape)}")
    if a.dtype.kind in "iu":
        raise InputError(f"audio array has integer dtype {a.dtype}; give float samples in [-1, 1] "
                         f"(e.g. int16 / 32768)")
    a = a.astype(np.float32, copy=False)
    bad = _first_non_finite(a)
    if bad is not None:
        raise InputError(f"audio array holds NaN or infinite samples (the first at sample {bad}, "
                         f"{bad / SAMPLE_RATE:.3f} s at 16 kHz); replace them (e.g. np.nan_to_num) before "
                         f"transcribing")
    return a


def _first_non_finite(a: np.ndarray):
    """The index of the first NaN or infinite sample, or None."""
    if np.isfinite(a.sum(dtype=np.float64)):        # NaN and infinities make the sum so; no n-byte mask
        return None
    return int(np.argmin(np.isfinite(a)))


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples at `target` Hz (soxr, high quality) from samples at `rate`."""
    if rate == target or len(samples) == 0:
        return samples.astype(np.float32, copy=False)
    out = _soxr(rate, target).resample(samples.astype(np.float32, copy=False), rate, target)
    return out.astype(np.float32, copy=False)


def _soxr(rate, target):
    try:
        import soxr
    except ImportError:
        raise InputError(f"the audio is at {rate} Hz and resampling to {target} Hz needs the 'soxr' package: "
                         f"pip install 'minirt[whisper]' (or convert it: `sox in.wav -r {target} out.wav`)") from None
    return soxr


def resampled_length(n: int, rate: int, target: int = SAMPLE_RATE) -> int:
    """How many samples soxr makes of `n` at `rate` (one-shot or streamed alike): n * target / rate rounded to
    the nearest (halves up)."""
    if rate == target:
        return n
    return (2 * n * target + rate) // (2 * rate)


# -- files -----------------------------------------------------------------------------------------------------

def open_audio_file(path: str):
    """A reader of the file at `path` (its header read, nothing more): a WavFile, or a SoundFileReader for other
    formats when soundfile is installed. Each has .path, .rate, .frames and .blocks(n) (mono float32 blocks of
    up to n frames, from the start). InputError names the file when it cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a folder, not an audio file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror or e})") from None
    if head[:4] in (b"RIFF", b"RIFX", b"RF64") and head[8:12] == b"WAVE":
        return WavFile(path)
    return SoundFileReader(path)


def read_audio_file(path: str):
    """(mono float32 samples, sample rate) of a WAV file, or of any format soundfile reads when it is installed."""
    reader = open_audio_file(path)
    return _read_all(reader), reader.rate


def read_wav(path: str):
    """(mono float32 samples, sample rate) of a RIFF WAV file."""
    reader = WavFile(path)
    return _read_all(reader), reader.rate


def _read_all(reader) -> np.ndarray:
    blocks = list(reader.blocks(max(1, reader.frames)))
    if not blocks:
        return np.zeros(0, np.float32)
    return blocks[0] if len(blocks) == 1 else np.concatenate(blocks)


def _mono(x: np.ndarray, path: str, at: int) -> np.ndarray:
    """Frames [n, channels] mixed down to float32 mono (the channels' mean); InputError for NaN or infinite
    samples, naming the file and the first bad frame (`at` is the block's first frame)."""
    mono = x[:, 0] if x.shape[1] == 1 else x.mean(axis=1, dtype=np.float32)
    bad = _first_non_finite(mono)
    if bad is not None:
        raise InputError(f"{path}: the file holds NaN or infinite samples (the first at frame {at + bad})")
    return np.ascontiguousarray(mono, np.float32)


class WavFile:
    """A RIFF WAV file's format and where its samples lie; blocks() decodes them a block at a time. A data chunk
    cut short (a truncated file) gives the whole frames that are there."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._parse(f, size)
        except OSError as e:
            raise InputError(f"{path}: cannot be read ({e.strerror or e})") from None

    def _parse(self, f, size):
        path = self.path
        riff = f.read(12)
        if riff[:4] != b"RIFF":
            raise InputError(f"{path}: {riff[:4].decode('latin-1')!r} WAV files are not read (only little-endian "
                             f"RIFF); convert it: `sox {path} -b 16 out.wav`")
        pos, fmt, data = 12, None, None
        while pos + 8 <= size:
            f.seek(pos)
            cid, n = struct.unpack("<4sI", f.read(8))
            if cid == b"fmt ":
                fmt = f.read(min(n, 64))
            elif cid == b"data":
                data = (pos + 8, min(n, size - pos - 8))
                break
            pos += 8 + n + (n & 1)
        if fmt is None or len(fmt) < 16 or data is None:
            raise InputError(f"{path}: a WAV file without {'a fmt' if fmt is None or len(fmt) < 16 else 'a data'} "
                             f"chunk")
        tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", fmt[:16])
        if tag == _EXTENSIBLE and len(fmt) >= 26:
            tag = struct.unpack("<H", fmt[24:26])[0]       # the sub-format GUID starts with the format tag
        if channels < 1 or rate < 1:
            raise InputError(f"{path}: a WAV file with {channels} channels at {rate} Hz")
        width = bits // 8 if bits % 8 == 0 else 0
        if not ((tag == _PCM and width in (1, 2, 3, 4)) or (tag == _FLOAT and width in (4, 8))):
            kind = {_PCM: "PCM", _FLOAT: "float"}.get(tag, f"format tag {tag:#x}")
            raise InputError(f"{path}: {bits}-bit {kind} WAV is not read (PCM 8/16/24/32-bit and float 32/64 "
                             f"are); convert it: `sox {path} -b 16 out.wav`")
        self.tag, self.channels, self.rate, self.width = tag, channels, rate, width
        self._offset = data[0]
        self.frames = data[1] // (width * channels)

    def blocks(self, n: int):
        """Mono float32 blocks of up to `n` frames, from the first frame to the last."""
        step = self.width * self.channels
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                for first in range(0, self.frames, n):
                    count = min(n, self.frames - first)
                    raw = f.read(count * step)
                    if len(raw) < count * step:
                        raise InputError(f"{self.path}: the file became shorter while it was read")
                    yield _mono(self._decode(raw).reshape(count, self.channels), self.path, first)
        except OSError as e:
            raise InputError(f"{self.path}: cannot be read ({e.strerror or e})") from None

    def _decode(self, raw: bytes) -> np.ndarray:
        """float32 samples of whole frames of raw data."""
        b = np.frombuffer(raw, np.uint8)
        if self.tag == _FLOAT:
            return np.frombuffer(raw, "<f4" if self.width == 4 else "<f8").astype(np.float32)
        if self.width == 1:
            return (b.astype(np.float32) - 128) / np.float32(128)
        if self.width == 2:
            return b.view("<i2").astype(np.float32) / np.float32(32768)
        if self.width == 3:
            w = b.reshape(-1, 3).astype(np.int32)
            v = w[:, 0] | (w[:, 1] << 8) | (w[:, 2] << 16)
            v = np.where(v >= 1 << 23, v - (1 << 24), v)
            return (v / float(1 << 23)).astype(np.float32)
        return (b.view("<i4") / float(1 << 31)).astype(np.float32)


class SoundFileReader:
    """A file in a format soundfile (libsndfile) reads: FLAC, OGG, ...; InputError when soundfile is not
    installed or cannot read the file."""

    def __init__(self, path: str):
        self.path = path
        sf = self._soundfile()
        try:
            with sf.SoundFile(path) as f:
                self.rate, self.channels, self.frames = int(f.samplerate), int(f.channels), int(f.frames)
        except Exception as e:     # soundfile.LibsndfileError and friends
            raise InputError(f"{path}: not an audio file minirt can read ({e})") from None
        if self.rate < 1 or self.channels < 1:
            raise InputError(f"{path}: an audio file with {self.channels} channels at {self.rate} Hz")

    def _soundfile(self):
        try:
            import soundfile
        except ImportError:
            raise InputError(f"{self.path}: not a WAV file; other formats (FLAC, OGG, ...) need the 'soundfile' "
                             f"package (pip install soundfile), or convert it: "
                             f"`ffmpeg -i {self.path} -ar 16000 -ac 1 out.wav`") from None
        return soundfile

    def blocks(self, n: int):
        """Mono float32 blocks of up to `n` frames, from the first frame to the last."""
        sf = self._soundfile()
        first = 0
        try:
            with sf.SoundFile(self.path) as f:
                while True:
                    x = f.read(n, dtype="float32", always_2d=True)
                    if len(x) == 0:
                        return
                    yield _mono(x, self.path, first)
                    first += len(x)
        except InputError:
            raise
        except Exception as e:     # a decoding error part-way, an I/O error
            raise InputError(f"{self.path}: reading failed at frame {first} ({e})") from None


class AudioStream:
    """The 16 kHz mono samples of an audio file, decoded and resampled a block at a time as read() asks for them.

    read(a, b) gives samples [a, b). Reads may overlap the previous one but should not start before it: the
    samples before the last read's start are dropped, and a read that starts earlier decodes the file again from
    its beginning (transcription does that twice: after the pass for the log-mel's maximum, and after language
    detection). len() is the number of samples, known from the header before anything is decoded;
    settle() checks it against what decoding gave (see there)."""

    def __init__(self, path: str, sample_rate: int = SAMPLE_RATE):
        self.path, self.sample_rate = path, sample_rate
        self.reader = open_audio_file(path)
        if self.reader.rate != sample_rate:
            _soxr(self.reader.rate, sample_rate)
        self._n = resampled_length(self.reader.frames, self.reader.rate, sample_rate)
        self._restart()

    def __len__(self) -> int:
        return self._n

    def _restart(self):
        if getattr(self, "_blocks", None) is not None:
            self._blocks.close()            # closes the file now, not when the generator is collected
        self._blocks = self._resampled()
        self._buf, self._start, self._ended = np.zeros(0, np.float32), 0, False

    def _resampled(self):
        """16 kHz blocks of the whole file, from its start."""
        rate, target = self.reader.rate, self.sample_rate
        blocks = self.reader.blocks(BLOCK_SECONDS * rate)
        if rate == target:
            yield from blocks
            return
        stream = _soxr(rate, target).ResampleStream(rate, target, 1, dtype="float32")
        for block in blocks:
            yield stream.resample_chunk(block, last=False)
        yield stream.resample_chunk(np.zeros(0, np.float32), last=True)

    def _pull(self):
        """Append the next block to the buffer (or mark the end of the file)."""
        block = next(self._blocks, None)
        if block is None:
            self._ended = True
        else:
            self._buf = np.concatenate([self._buf, block]) if len(self._buf) else block

    def _drop(self, a: int):
        """Forget the samples before `a` (as far as they are in the buffer)."""
        k = min(max(0, a - self._start), len(self._buf))
        self._buf, self._start = self._buf[k:], self._start + k

    def read(self, a: int, b: int) -> np.ndarray:
        """float32 samples [a, b); zeros past the end of what the file holds."""
        if a < self._start:
            self._restart()
        self._drop(a)
        while self._start + len(self._buf) < b and not self._ended:
            self._pull()
            self._drop(a)
        out = self._buf[a - self._start:b - self._start]
        if len(out) < b - a:
            out = np.concatenate([out, np.zeros(b - a - len(out), np.float32)])
        return out

    def settle(self) -> bool:
        """True when len() is the number of samples the file gives; else len() becomes that number and False is
        returned. The rest of the file is decoded to count them (not kept). The count from the header is right for
        WAV files and for resampling; a file whose header is wrong about its length still gives its real samples."""
        end = self._start + len(self._buf)
        if not self._ended:
            end += sum(len(block) for block in self._blocks)
            self._restart()
        right, self._n = end == self._n, end
        return right
