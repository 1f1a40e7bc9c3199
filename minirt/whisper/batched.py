"""BatchedInferencePipeline: one long file's 30 s chunks decoded as a batch, with faster-whisper's API
(BatchedInferencePipeline(model).transcribe(audio, batch_size=16, ...) -> (segments generator, TranscriptionInfo)).

As faster-whisper's (1.2) batched pipeline: every chunk is decoded on its own (no previous text as the prompt, no
seek within a chunk), once, at the first temperature (no fallback, no silent-chunk skip), by default without
timestamps; a chunk's tokens are split into segments on timestamp tokens as the sequential loop splits a window's.
What differs: no voice activity detection (vad_filter=True is refused), so without clip_timestamps the audio is cut
into consecutive chunks of 30 s (faster-whisper refuses audio over 30 s without VAD or clip_timestamps); greedy
decoding only at temperature 0 (beam_size=1 batched, larger beams a chunk at a time; sampling is refused).
"""
from __future__ import annotations

import math
from typing import List, Optional, Union

import numpy as np

from .audio_input import SAMPLE_RATE, load_audio
from .decoding import TranscriptionOptions, compression_ratio, generate, generate_batch, get_prompt
from .features import N_FRAMES, LogMel
from .transcribe import Segment, TranscriptionInfo, detect_language, split_segments

FRAMES_PER_SECOND = 100


class BatchedInferencePipeline:
    """model: a minirt.whisper.WhisperModel. language: a language for every transcribe() that names none."""

    def __init__(self, model, options=None, tokenizer=None, language: Optional[str] = None):
        self.model = model
        self.preset_language = language

    def transcribe(
        self,
        audio: Union[str, np.ndarray],
        language: Optional[str] = None,
        task: Optional[str] = None,
        log_progress: bool = False,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1,
        length_penalty: float = 1,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        temperature: Union[float, List[float]] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        compression_ratio_threshold: Optional[float] = 2.4,
        log_prob_threshold: Optional[float] = -1.0,
        no_speech_threshold: Optional[float] = 0.6,
        condition_on_previous_text: bool = True,
        prompt_reset_on_temperature: float = 0.5,
        initial_prompt=None,
        prefix: Optional[str] = None,
        suppress_blank: bool = True,
        suppress_tokens: Optional[List[int]] = (-1,),
        without_timestamps: bool = True,
        max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False,
        multilingual: bool = False,
        vad_filter: bool = False,
        max_new_tokens: Optional[int] = None,
        chunk_length: Optional[int] = None,
        clip_timestamps: Optional[List[dict]] = None,
        batch_size: Optional[int] = None,
        hotwords: Optional[str] = None,
        **ignored,
    ):
        """Transcribe `audio` (a path, or float32 16 kHz mono samples) in chunks decoded as batches of batch_size:
        (a generator of Segments, TranscriptionInfo), as faster-whisper's BatchedInferencePipeline.transcribe
        (the module doc says what differs). Chunks: clip_timestamps ([{"start", "end"}] in seconds, each at most
        30 s), else consecutive 30 s. beam_size=1 decodes the chunks of a batch together on the GPU (greedy); a
        larger beam decodes them one at a time with beam search. Options faster-whisper's batched mode ignores
        (the thresholds, condition_on_previous_text, prompt_reset_on_temperature, max_initial_timestamp: CTranslate2's
        1 s applies, log_progress) are accepted and ignored, as are prepend_punctuations, append_punctuations,
        vad_parameters, hallucination_silence_threshold and the language detection ones. Segment.seek is its
        chunk's first frame, Segment.temperature the first temperature, as faster-whisper's. batch_size: None is
        the model's max_batch_items (16 by default)."""
        temperatures = list(temperature) if isinstance(temperature, (list, tuple)) else [temperature]
        unsupported = [name for name, on in (("word_timestamps", word_timestamps), ("prefix", prefix),
                                             ("hotwords", hotwords), ("vad_filter", vad_filter),
                                             ("multilingual", multilingual and self.model.is_multilingual),
                                             ("temperature above 0", not temperatures or temperatures[0] != 0),
                                             ("chunk_length", chunk_length not in (None, 30))) if on]
        if unsupported:
            raise NotImplementedError(f"minirt's BatchedInferencePipeline does not support {', '.join(unsupported)}")
        unknown = sorted(set(ignored) - {"prepend_punctuations", "append_punctuations", "vad_parameters",
                                         "hallucination_silence_threshold", "language_detection_threshold",
                                         "language_detection_segments"})
        if unknown:
            raise TypeError(f"transcribe() got unexpected keyword argument(s) {', '.join(unknown)}")
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        model, tok = self.model, self.model.tokenizer
        batch_size = model.max_batch_items if batch_size is None else batch_size
        if beam_size == 1:
            model.batch_backend(batch_size)
        elif not 1 <= batch_size:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        samples = load_audio(audio)
        duration = len(samples) / SAMPLE_RATE
        chunks = _chunks(clip_timestamps, len(samples))
        language = language or self.preset_language
        task = task or "transcribe"
        language_probability, all_language_probs = 1, None
        if not model.is_multilingual:
            language = "en"
        elif language is None:
            language, language_probability, all_language_probs = detect_language(
                model.backend, tok, LogMel(samples, model.n_mels))
        else:
            tok.language_token(language)
        previous = []
        if initial_prompt is not None:
            previous = (tok.encode(" " + initial_prompt.strip()) if isinstance(initial_prompt, str)
                        else [int(t) for t in initial_prompt])
        options = TranscriptionOptions(
            beam_size=beam_size, best_of=best_of, patience=patience, length_penalty=length_penalty,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            log_prob_threshold=log_prob_threshold, no_speech_threshold=no_speech_threshold,
            compression_ratio_threshold=compression_ratio_threshold, condition_on_previous_text=False,
            prompt_reset_on_temperature=0.5,
            temperatures=temperatures,
            initial_prompt=initial_prompt, suppress_blank=suppress_blank,
            suppress_tokens=list(tok.suppressed_tokens(suppress_tokens)) if suppress_tokens else suppress_tokens,
            without_timestamps=without_timestamps, max_initial_timestamp=1.0, multilingual=False,
            max_new_tokens=max_new_tokens, word_timestamps=False)
        prompt = get_prompt(tok, previous, language, task, without_timestamps)
        info = TranscriptionInfo(language=language, language_probability=language_probability, duration=duration,
                                 duration_after_vad=sum(e - s for s, e in chunks) / SAMPLE_RATE,
                                 all_language_probs=all_language_probs, transcription_options=options)
        return self._segments(samples, chunks, prompt, options, batch_size), info

    def _segments(self, samples, chunks, prompt, options, batch_size):
        model, tok = self.model, self.model.tokenizer
        backend, idx = model.backend, 0
        if options.beam_size == 1:     # as many windows a batch as the backend's holds (the device may hold fewer)
            batch_size = min(batch_size, backend.max_items)
        for at in range(0, len(chunks), batch_size):
            part = chunks[at:at + batch_size]
            windows = [LogMel(samples[s:e], model.n_mels) for s, e in part]
            windows = [m.window(0, min(N_FRAMES, m.content_frames)) for m in windows]
            if options.beam_size == 1:
                backend.encode_batch(np.stack(windows))
                results = generate_batch(backend, tok, [prompt] * len(part), options, model.suppress_blank_ids)
            else:
                results = []
                for w in windows:
                    backend.encode(w)
                    results.append(generate(backend, tok, prompt, options, 0.0, model.suppress_blank_ids))
            for (s, e), (hyp, no_speech_prob) in zip(part, results):
                n = len(hyp.tokens)
                avg_logprob = hyp.score * (n ** options.length_penalty) / (n + 1)
                chunk_duration = (e - s) / SAMPLE_RATE
                parts, _, _ = split_segments(tok, hyp.tokens, s / SAMPLE_RATE,
                                             int(math.ceil(chunk_duration) * FRAMES_PER_SECOND), chunk_duration, 0)
                seek = int(s / SAMPLE_RATE * FRAMES_PER_SECOND)
                for p in parts:
                    idx += 1
                    text = tok.decode(p["tokens"])
                    yield Segment(id=idx, seek=seek, start=round(p["start"], 3), end=round(p["end"], 3), text=text,
                                  tokens=p["tokens"], avg_logprob=avg_logprob,
                                  compression_ratio=compression_ratio(text), no_speech_prob=no_speech_prob,
                                  words=None, temperature=options.temperatures[0])


def _chunks(clip_timestamps, n: int) -> list:
    """[(start, end)] in samples: clip_timestamps' ({"start", "end"} in seconds, at most 30 s each), else
    consecutive 30 s."""
    limit = N_FRAMES * SAMPLE_RATE // FRAMES_PER_SECOND
    if not clip_timestamps:
        return [(s, min(s + limit, n)) for s in range(0, n, limit)] or [(0, 0)]
    out = []
    for i, c in enumerate(clip_timestamps):
        try:
            s, e = int(float(c["start"]) * SAMPLE_RATE), int(float(c["end"]) * SAMPLE_RATE)
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"clip_timestamps[{i}] must be {{'start': seconds, 'end': seconds}}, got {c!r}") \
                from None
        if not 0 <= s < e <= n or e - s > limit:
            raise ValueError(f"clip_timestamps[{i}] = {c!r}: within the audio's {n / SAMPLE_RATE:.3f} s and at most "
                             f"{limit // SAMPLE_RATE} s long")
        out.append((s, e))
    return out
