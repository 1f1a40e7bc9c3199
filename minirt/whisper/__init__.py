"""Whisper speech-to-text with faster-whisper's API:

    from minirt.whisper import WhisperModel
    model = WhisperModel("tiny.en")        # faster-whisper's name, a Hugging Face repo id, or a model folder
    segments, info = model.transcribe("speech.wav", beam_size=5)
    for s in segments:
        print(f"[{s.start:.2f} -> {s.end:.2f}] {s.text}")
    results = model.transcribe_batch(["a.wav", "b.wav"], beam_size=1)   # [(segments, info)]: windows in batches
    segments, info = BatchedInferencePipeline(model).transcribe("long.wav", batch_size=16, beam_size=1)
    segments, info = model.transcribe("talk.wav", word_timestamps=True, vad_filter=True)   # Segment.words: [Word]

The host side (features, prompts, logit filters, greedy / beam / sampling search, temperature fallback, the seek
loop) follows faster-whisper and CTranslate2; the model runs behind a DecoderBackend (backend.py), the numpy
reference (reference.py) by default. Needs the 'whisper' extra: pip install 'minirt[whisper]'.
"""
from .backend import BatchDecoder, DecoderBackend
from .batched import BatchedInferencePipeline
from .decoding import TranscriptionOptions
from .model import WhisperModel
from .transcribe import Segment, TranscriptionInfo
from .vad import VadOptions
from .words import Word

__all__ = ["WhisperModel", "BatchedInferencePipeline", "Segment", "Word", "TranscriptionInfo", "TranscriptionOptions",
           "VadOptions", "DecoderBackend", "BatchDecoder"]
