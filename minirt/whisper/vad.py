"""Voice activity detection for transcribe(vad_filter=True), as faster-whisper filters audio before decoding: the
Silero VAD model's speech probability for each 32 ms of audio, speech chunks found from it with faster-whisper's
options (VadOptions), the audio cut to the chunks and joined, and the transcript's times moved back onto the original
timeline (SpeechTimestampsMap).

The model is silero_vad_v6.onnx as the faster-whisper package ships it (package data; minirt does not carry it),
run on the CPU with onnxruntime, one thread: both are optional dependencies (`pip install minirt[vad]`). It is a
small recurrent network over 512-sample windows (each with the 64 samples before it as context); its work is a few
milliseconds a minute of audio, far below the transcription's.
"""
from __future__ import annotations

import bisect
import functools
import importlib.util
import os
from dataclasses import dataclass, fields
from typing import List, Optional

import numpy as np

from ..errors import UnsupportedError

SAMPLE_RATE = 16000
WINDOW = 512                # samples a speech probability
CONTEXT = 64                # samples of the window before that the model sees with each window
MODEL_FILE = "silero_vad_v6.onnx"


@dataclass
class VadOptions:
    """faster-whisper's VadOptions: threshold (a window is speech at or above it), neg_threshold (below it, silence;
    None: threshold - 0.15, at least 0.01), min_speech_duration_ms (shorter chunks are dropped),
    max_speech_duration_s (longer chunks are split, at a silence of over 98 ms where there is one),
    min_silence_duration_ms (a chunk ends after this much silence), speech_pad_ms (chunks are padded this much)."""
    threshold: float = 0.5
    neg_threshold: Optional[float] = None
    min_speech_duration_ms: int = 0
    max_speech_duration_s: float = float("inf")
    min_silence_duration_ms: int = 2000
    speech_pad_ms: int = 400


def vad_options(vad_parameters) -> VadOptions:
    """VadOptions from transcribe()'s vad_parameters (None, a dict of its fields, or VadOptions); ValueError naming
    a key that is not one, or a value that is not a number."""
    if vad_parameters is None:
        return VadOptions()
    if isinstance(vad_parameters, VadOptions):
        opts = vad_parameters
    elif isinstance(vad_parameters, dict):
        known = {f.name for f in fields(VadOptions)}
        unknown = sorted(set(vad_parameters) - known)
        if unknown:
            raise ValueError(f"vad_parameters: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        opts = VadOptions(**vad_parameters)
    else:
        raise ValueError(f"vad_parameters must be a dict or VadOptions, got {type(vad_parameters).__name__}")
    for f in fields(VadOptions):
        v = getattr(opts, f.name)
        if v is None and f.name == "neg_threshold":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
            raise ValueError(f"vad_parameters: {f.name} must be a number, got {v!r}")
    return opts


def model_path() -> str:
    """silero_vad_v6.onnx in the installed faster-whisper package; UnsupportedError saying what to install."""
    spec = importlib.util.find_spec("faster_whisper")
    path = os.path.join(os.path.dirname(spec.origin), "assets", MODEL_FILE) if spec and spec.origin else None
    if path is None or not os.path.isfile(path):
        raise UnsupportedError(f"vad_filter needs Silero VAD's {MODEL_FILE}, which the faster-whisper package ships: "
                               f"pip install 'minirt[vad]' (faster-whisper and onnxruntime)")
    return path


@functools.lru_cache(maxsize=1)
def _session(path: str):
    try:
        import onnxruntime
    except ImportError:
        raise UnsupportedError("vad_filter runs Silero VAD with onnxruntime: pip install 'minirt[vad]'") from None
    opts = onnxruntime.SessionOptions()
    opts.inter_op_num_threads = opts.intra_op_num_threads = 1
    opts.enable_cpu_mem_arena = False
    opts.log_severity_level = 4
    return onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"], sess_options=opts)


def speech_probabilities(audio: np.ndarray) -> np.ndarray:
    """The speech probability of each 512-sample window of the audio (zero-padded to a whole window, and always by
    at least one sample as faster-whisper pads it), [windows] float32. Each window goes in with the 64 samples
    before it (zeros before the first); the last window's own last 64 samples are zeros, as faster-whisper feeds
    them (it zeroes them in place while it takes the contexts)."""
    session = _session(model_path())
    padded = np.pad(np.asarray(audio, np.float32), (0, WINDOW - len(audio) % WINDOW))
    windows = padded.reshape(-1, WINDOW).copy()
    windows[-1, -CONTEXT:] = 0
    context = np.roll(windows[:, -CONTEXT:], 1, 0)
    batch = np.concatenate([context, windows], 1)
    h = np.zeros((1, 1, 128), np.float32)
    c = np.zeros((1, 1, 128), np.float32)
    out = []
    for i in range(0, len(batch), 10000):       # the state carries over from one run to the next
        p, h, c = session.run(None, {"input": batch[i:i + 10000], "h": h, "c": c})
        out.append(p)
    return np.concatenate(out, 0).reshape(-1)


def speech_chunks(audio: np.ndarray, options: VadOptions, probs: Optional[np.ndarray] = None) -> List[dict]:
    """[{"start", "end"}] in samples of the speech in the audio, as faster-whisper's get_speech_timestamps finds it
    from the windows' probabilities (speech_probabilities, or `probs`): a chunk starts at a window at or above the
    threshold and ends at the first of a run of windows below neg_threshold lasting min_silence_duration_ms; a
    chunk longer than max_speech_duration_s ends at its last silence of over 98 ms, else where it reaches the limit;
    chunks no longer than min_speech_duration_ms are dropped; then each is padded by speech_pad_ms (half the gap
    where two are closer than twice that)."""
    if probs is None:
        probs = speech_probabilities(audio)
    n = len(audio)
    threshold = options.threshold
    neg = options.neg_threshold if options.neg_threshold is not None else max(threshold - 0.15, 0.01)
    min_speech = SAMPLE_RATE * options.min_speech_duration_ms / 1000
    pad = SAMPLE_RATE * options.speech_pad_ms / 1000
    max_speech = SAMPLE_RATE * options.max_speech_duration_s - WINDOW - 2 * pad
    min_silence = SAMPLE_RATE * options.min_silence_duration_ms / 1000
    min_silence_at_max = SAMPLE_RATE * 98 / 1000

    chunks, cur, triggered = [], {}, False
    silence_from = 0                   # where the current silence began (0: none)
    last_silence_end = next_start = 0  # a split point for an overlong chunk, and where speech resumed after it
    for i, p in enumerate(probs):
        at = WINDOW * i
        if p >= threshold and silence_from:
            silence_from = 0
            if next_start < last_silence_end:
                next_start = at
        if p >= threshold and not triggered:
            triggered, cur = True, {"start": at}
            continue
        if triggered and at - cur["start"] > max_speech:
            if last_silence_end:
                cur["end"] = last_silence_end
                chunks.append(cur)
                cur = {}
                if next_start < last_silence_end:
                    triggered = False
                else:
                    cur["start"] = next_start
                last_silence_end = next_start = silence_from = 0
            else:
                cur["end"] = at
                chunks.append(cur)
                cur = {}
                last_silence_end = next_start = silence_from = 0
                triggered = False
                continue
        if p < neg and triggered:
            if not silence_from:
                silence_from = at
            if at - silence_from > min_silence_at_max:
                last_silence_end = silence_from
            if at - silence_from < min_silence:
                continue
            cur["end"] = silence_from
            if cur["end"] - cur["start"] > min_speech:
                chunks.append(cur)
            cur = {}
            last_silence_end = next_start = silence_from = 0
            triggered = False
    if cur and n - cur["start"] > min_speech:
        cur["end"] = n
        chunks.append(cur)

    for i, chunk in enumerate(chunks):
        if i == 0:
            chunk["start"] = int(max(0, chunk["start"] - pad))
        if i == len(chunks) - 1:
            chunk["end"] = int(min(n, chunk["end"] + pad))
            continue
        following = chunks[i + 1]
        gap = following["start"] - chunk["end"]
        if gap < 2 * pad:
            chunk["end"] += int(gap // 2)
            following["start"] = int(max(0, following["start"] - gap // 2))
        else:
            chunk["end"] = int(min(n, chunk["end"] + pad))
            following["start"] = int(max(0, following["start"] - pad))
    return chunks


def keep_speech(audio: np.ndarray, chunks: List[dict]) -> np.ndarray:
    """The chunks of the audio joined (no samples where there is no chunk)."""
    if not chunks:
        return np.zeros(0, np.float32)
    return np.concatenate([audio[c["start"]:c["end"]] for c in chunks]).astype(np.float32, copy=False)


class TimelineMap:
    """Times in the joined speech back to the original audio's, as faster-whisper's SpeechTimestampsMap moves them:
    each chunk's time plus the silence cut before it, to 0.01 s."""

    def __init__(self, chunks: List[dict], sampling_rate: int = SAMPLE_RATE):
        self.rate = sampling_rate
        self.chunk_ends, self.silence_before = [], []
        previous_end = cut = 0
        for c in chunks:
            cut += c["start"] - previous_end
            previous_end = c["end"]
            self.chunk_ends.append(c["end"] - cut)
            self.silence_before.append(cut / sampling_rate)

    def chunk_of(self, time: float, is_end: bool = False) -> int:
        sample = int(time * self.rate)
        if is_end and sample in self.chunk_ends:
            return self.chunk_ends.index(sample)
        return min(bisect.bisect(self.chunk_ends, sample), len(self.chunk_ends) - 1)

    def original(self, time: float, chunk: Optional[int] = None, is_end: bool = False) -> float:
        if chunk is None:
            chunk = self.chunk_of(time, is_end)
        return round(self.silence_before[chunk] + time, 2)


def restore_times(segments, chunks: List[dict]):
    """Yield the segments with their times (and their words') on the original timeline; a word's start and end are
    moved with the chunk of its middle, and a segment with words spans its first word's start to its last's end."""
    timeline = TimelineMap(chunks)
    for segment in segments:
        if segment.words:
            for word in segment.words:
                chunk = timeline.chunk_of((word.start + word.end) / 2)
                word.start = timeline.original(word.start, chunk)
                word.end = timeline.original(word.end, chunk)
            segment.start, segment.end = segment.words[0].start, segment.words[-1].end
        else:
            segment.start = timeline.original(segment.start)
            segment.end = timeline.original(segment.end, is_end=True)
        yield segment
