"""Audio for transcription: a path or an array in, float32 16 kHz mono samples out.

WAV files are read here (PCM 8/16/24/32-bit, IEEE float 32/64, WAVE_FORMAT_EXTENSIBLE), any sample rate and
channel count: channels are averaged, other rates resampled with soxr (its default high quality). Other formats
(FLAC, OGG, ...) go through `soundfile` when it is installed. Integer samples are scaled as faster-whisper's
decoder leaves them (int16 / 32768), so a 16 kHz 16-bit WAV gives the very samples faster-whisper transcribes.
"""
from __future__ import annotations

import os
import struct

import numpy as np

from ..errors import InputError

SAMPLE_RATE = 16000

_PCM, _FLOAT, _EXTENSIBLE = 1, 3, 0xFFFE


def load_audio(audio, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """float32 mono samples at `sample_rate` from a path (str or os.PathLike) or an array of samples already at
    that rate (1-D; float32 is used as is, other dtypes are converted; a 2-D [samples, channels] array is mixed
    down). Raises InputError for an unreadable or unsupported file."""
    if isinstance(audio, (str, os.PathLike)):
        samples, rate = read_audio_file(os.fspath(audio))
        return resample(samples, rate, sample_rate)
    if isinstance(audio, (bytes, bytearray)) or hasattr(audio, "read"):
        raise InputError("audio must be a file path or an array of samples; file objects and bytes are not read")
    a = np.asarray(audio)
    if a.dtype.kind not in "fiu":
        raise InputError(f"audio array has dtype {a.dtype}; give float samples in [-1, 1]")
    if a.ndim == 2:
        a = a.astype(np.float32).mean(axis=1, dtype=np.float32)
    elif a.ndim != 1:
        raise InputError(f"audio array must be 1-D samples (or [samples, channels]), got shape {list(a.shape)}")
    if a.dtype.kind in "iu":
        raise InputError(f"audio array has integer dtype {a.dtype}; give float samples in [-1, 1] "
                         f"(e.g. int16 / 32768)")
    a = a.astype(np.float32, copy=False)
    if not np.all(np.isfinite(a)):
        raise InputError("audio array holds NaN or infinite samples")
    return a


def resample(samples: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Mono float32 samples at `target` Hz (soxr, high quality) from samples at `rate`."""
    if rate == target or len(samples) == 0:
        return samples.astype(np.float32, copy=False)
    try:
        import soxr
    except ImportError:
        raise InputError(f"the audio is at {rate} Hz and resampling to {target} Hz needs the 'soxr' package: "
                         f"pip install 'minirt[whisper]' (or convert it: `sox in.wav -r {target} out.wav`)") from None
    return soxr.resample(samples.astype(np.float32, copy=False), rate, target).astype(np.float32, copy=False)


def read_audio_file(path: str):
    """(mono float32 samples, sample rate) of a WAV file, or of any format soundfile reads when it is installed."""
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
        return read_wav(path)
    try:
        import soundfile
    except ImportError:
        raise InputError(f"{path}: not a WAV file; other formats (FLAC, OGG, ...) need the 'soundfile' package "
                         f"(pip install soundfile), or convert it: `ffmpeg -i {path} -ar 16000 -ac 1 out.wav`") from None
    try:
        data, rate = soundfile.read(path, dtype="float32", always_2d=True)
    except Exception as e:     # soundfile.LibsndfileError and friends
        raise InputError(f"{path}: not an audio file minirt can read ({e})") from None
    return data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0], int(rate)


def read_wav(path: str):
    """(mono float32 samples, sample rate) of a RIFF WAV file."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:4] != b"RIFF":
        raise InputError(f"{path}: {raw[:4].decode('latin-1')!r} WAV files are not read (only little-endian RIFF); "
                         f"convert it: `sox {path} -b 16 out.wav`")
    pos, fmt, data = 12, None, None
    while pos + 8 <= len(raw):
        cid, size = raw[pos:pos + 4], struct.unpack("<I", raw[pos + 4:pos + 8])[0]
        body = raw[pos + 8:pos + 8 + size]
        if cid == b"fmt ":
            fmt = body
        elif cid == b"data":
            data = body     # a truncated file keeps what it has
            break
        pos += 8 + size + (size & 1)
    if fmt is None or len(fmt) < 16 or data is None:
        raise InputError(f"{path}: a WAV file without {'a fmt' if fmt is None or len(fmt) < 16 else 'a data'} chunk")
    tag, channels, rate, _, block, bits = struct.unpack("<HHIIHH", fmt[:16])
    if tag == _EXTENSIBLE and len(fmt) >= 26:
        tag = struct.unpack("<H", fmt[24:26])[0]       # the sub-format GUID starts with the format tag
    if channels < 1 or rate < 1:
        raise InputError(f"{path}: a WAV file with {channels} channels at {rate} Hz")
    width = bits // 8 if bits % 8 == 0 else 0
    if tag == _PCM and width in (1, 2, 3, 4):
        n = len(data) // (width * channels) * channels
        b = np.frombuffer(data, np.uint8, n * width)
        if width == 1:
            x = (b.astype(np.float32) - 128) / np.float32(128)
        elif width == 2:
            x = b.view("<i2").astype(np.float32) / np.float32(32768)
        elif width == 3:
            w = b.reshape(-1, 3).astype(np.int32)
            v = (w[:, 0] | (w[:, 1] << 8) | (w[:, 2] << 16))
            v = np.where(v >= 1 << 23, v - (1 << 24), v)
            x = (v / float(1 << 23)).astype(np.float32)
        else:
            x = (b.view("<i4") / float(1 << 31)).astype(np.float32)
    elif tag == _FLOAT and width in (4, 8):
        n = len(data) // (width * channels) * channels
        x = np.frombuffer(data, "<f4" if width == 4 else "<f8", n).astype(np.float32)
    else:
        kind = {_PCM: "PCM", _FLOAT: "float"}.get(tag, f"format tag {tag:#x}")
        raise InputError(f"{path}: {bits}-bit {kind} WAV is not read (PCM 8/16/24/32-bit and float 32/64 are); "
                         f"convert it: `sox {path} -b 16 out.wav`")
    x = x.reshape(-1, channels)
    mono = x[:, 0] if channels == 1 else x.mean(axis=1, dtype=np.float32)
    if not np.all(np.isfinite(mono)):
        raise InputError(f"{path}: the WAV file holds NaN or infinite samples")
    return np.ascontiguousarray(mono, np.float32), rate
