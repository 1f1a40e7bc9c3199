"""Spoken English clips for the Whisper transcription tests, synthesized with espeak-ng (tools/setup.sh installs
it): sentences picked with a seeded generator, spoken, resampled to 16 kHz with soxr and joined with short
pauses. The same espeak-ng version gives the same samples, so a clip is cached per (text, voice, speed).
"""
from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A large container of fresh water stood beside the old wooden door.",
    "We will meet at the train station at half past seven tomorrow morning.",
    "The weather today is cloudy with a chance of rain in the afternoon.",
    "She opened the window and listened to the birds singing in the garden.",
    "Our team finished the project two weeks ahead of schedule.",
    "He bought three apples, a loaf of bread and a bottle of milk.",
    "The museum is closed on Mondays but open late on Fridays.",
    "Turn left at the next corner and walk straight for two blocks.",
    "The children played football in the park until it got dark.",
    "Could you send me the report before the meeting on Thursday?",
    "The library has thousands of books about history and science.",
    "It took them almost four hours to climb to the top of the mountain.",
    "My brother works as an engineer in a small company near the river.",
    "The concert was cancelled because the singer had a bad cold.",
    "Remember to turn off the lights when you leave the office.",
    "The new bridge will connect the two sides of the city.",
    "I have never seen such a beautiful sunset over the ocean.",
    "The price of coffee has gone up again this year.",
    "They decided to paint the kitchen a bright shade of yellow.",
    "The airplane landed safely despite the strong wind.",
    "Every student must submit the assignment by Friday evening.",
    "The old clock on the wall stopped working last winter.",
]


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


def _cache() -> Path:
    import real_whisper
    return real_whisper.cache_dir() / "speech-clips"


def speak(text: str, voice: str = "en-us", speed: int = 165) -> np.ndarray:
    """float32 16 kHz samples of espeak-ng saying `text` (cached)."""
    key = hashlib.sha256(f"{voice}|{speed}|{text}".encode()).hexdigest()[:20]
    cached = _cache() / f"{key}.npy"
    if cached.is_file():
        return np.load(cached)
    import soxr
    from minirt.whisper.audio_input import read_wav
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-w", str(wav), text], check=True,
                       capture_output=True, timeout=120)
        samples, rate = read_wav(str(wav))
    out = soxr.resample(samples, rate, 16000).astype(np.float32)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = cached.with_suffix(f".tmp{os.getpid()}.npy")
    np.save(tmp_path, out)
    tmp_path.replace(cached)
    return out


def sentences(seed: int, count: int) -> list:
    return random.Random(seed).sample(SENTENCES, count) if count <= len(SENTENCES) else \
        [random.Random(seed + i).choice(SENTENCES) for i in range(count)]


def clip(texts, pause: float = 0.5, voice: str = "en-us", speed: int = 165) -> np.ndarray:
    """The texts spoken one after another with `pause` seconds of silence between them."""
    gap = np.zeros(int(pause * 16000), np.float32)
    parts = []
    for i, t in enumerate(texts):
        if i:
            parts.append(gap)
        parts.append(speak(t, voice, speed))
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def clip_of_length(seed: int, seconds: float, pause: float = 0.5) -> tuple:
    """(samples, texts): seeded sentences spoken until the clip is about `seconds` long (not longer)."""
    rng = random.Random(seed)
    texts, total = [], 0.0
    while True:
        t = rng.choice(SENTENCES)
        n = len(speak(t)) / 16000 + (pause if texts else 0.0)
        if total + n > seconds:
            break
        texts.append(t)
        total += n
    return clip(texts, pause), texts


def wav_bytes(samples: np.ndarray) -> bytes:
    """16 kHz mono samples as the bytes of a 16-bit WAV file (an upload, or a file to write)."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()
