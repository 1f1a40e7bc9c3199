"""BatchedInferencePipeline: one long file's 30 s chunks decoded as a batch, with faster-whisper's API
(BatchedInferencePipeline(model).transcribe(audio, batch_size=16, ...) -> (segments generator, TranscriptionInfo)).

As faster-whisper's (1.2) batched pipeline: every chunk is decoded on its own (no previous text as the prompt, no
seek within a chunk), once, at the first temperature (no fallback, no silent-chunk skip), by default without
timestamps; a chunk's tokens are split into segments on timestamp tokens as the sequential loop splits a window's.
With word_timestamps, a batch's chunks are aligned as faster-whisper aligns them (its add_word_timestamps over the
batch, CTranslate2's align run on the batch): each chunk's text tokens over its first ceil(duration) s of frames
(zero-padded log-mel past the speech included), the batch's padding as words.batch_alignments says, the words
timed from the chunk's start frame, and the last speech timestamp carried from chunk to chunk through the file.
Without clip_timestamps the chunks come from voice activity detection by default (vad_filter=True, as in
faster-whisper: minirt.whisper.vad, the speech joined into chunks of up to 30 s, the times restored to the file's);
with vad_filter=False the audio is cut into consecutive chunks of 30 s (faster-whisper refuses audio over 30 s
without VAD or clip_timestamps). What differs: greedy decoding only at temperature 0 (beam_size=1 batched, larger
beams a chunk at a time; sampling is refused); language detection reads the speech's log-mel as one (faster-whisper
joins the chunks' own); a chunk's alignment encodes its window once more (the one-window state's; faster-whisper
aligns on the batch's encoder output).
"""
from __future__ import annotations

import math
from typing import List, Optional, Union

import numpy as np

from . import words as W
from .audio_input import SAMPLE_RATE, audio_samples
from .decoding import TranscriptionOptions, compression_ratio, generate, generate_batch, get_prompt
from .features import N_FRAMES, ArraySamples, LogMel
from .option_checks import check_int
from .transcribe import Segment, TranscriptionInfo, detect_language, split_segments
from .vad import VadOptions, keep_speech, restore_times, speech_chunks, vad_options

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
        vad_filter: bool = True,
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
        30 s), else the speech VAD finds (vad_filter, the default; vad_parameters as faster-whisper's batched
        pipeline takes them: minirt.whisper.vad), else consecutive 30 s. beam_size=1 decodes the chunks of a batch together on the GPU (greedy); a
        larger beam decodes them one at a time with beam search. Options faster-whisper's batched mode ignores
        (the thresholds, condition_on_previous_text, prompt_reset_on_temperature, max_initial_timestamp: CTranslate2's
        1 s applies, log_progress) are accepted and ignored, as are hallucination_silence_threshold and the
        language detection ones. word_timestamps: each segment's words as faster-whisper's pipeline computes them
        (the module doc; prepend_punctuations and append_punctuations as transcribe() takes them). Segment.seek is its
        chunk's first frame, Segment.temperature the first temperature, as faster-whisper's. batch_size: None is
        the model's max_batch_items (16 by default)."""
        kw = {k: v for k, v in locals().items() if k not in ("self", "audio", "ignored", "batch_size",
                                                              "log_progress")}
        kw.update({k: v for k, v in ignored.items() if k.startswith("language_detection_")})
        # the pipeline decodes every chunk without previous text: the longest prompt has none
        kw.update(language=language or self.preset_language, task=task or "transcribe",
                  condition_on_previous_text=False)
        model, tok = self.model, self.model.tokenizer
        kw = model.check_options(kw, sampling_allowed=False)
        beam_size, temperatures, initial_prompt = kw["beam_size"], kw["temperature"], kw["initial_prompt"]
        unsupported = [name for name, on in (("prefix", prefix),
                                             ("hotwords", hotwords),
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
        from .model import parity_options
        punctuations = {k: v for k, v in parity_options(
            word_timestamps=word_timestamps, **{k: ignored[k] for k in ("prepend_punctuations", "append_punctuations")
                                                if k in ignored}).items() if k.endswith("_punctuations")}
        batch_size = model.max_batch_items if batch_size is None else check_int("batch_size", batch_size, 1)
        if beam_size == 1:
            model.batch_backend(batch_size)
        if word_timestamps:
            with model.lock:        # the align entry points join the backend's Program once
                model.word_backend()
        samples = audio_samples(audio)          # a file is read a chunk at a time (whole only for the VAD)
        samples = samples if hasattr(samples, "read") else ArraySamples(samples)
        samples.settle()
        duration = len(samples) / SAMPLE_RATE
        vad, speech = None, None
        if vad_filter and not clip_timestamps:
            vad = batched_vad_options(ignored.get("vad_parameters"))
            whole = samples.read(0, len(samples))       # the VAD reads every sample: the file is read whole then
            speech = speech_chunks(whole, vad)
            samples, chunks = ArraySamples(keep_speech(whole, speech)), speech_windows(speech)
        else:
            chunks = _chunks(clip_timestamps, len(samples))
        language = language or self.preset_language
        task = task or "transcribe"
        language_probability, all_language_probs = 1, None
        if not model.is_multilingual:
            language = "en"
        elif language is None:
            mel = LogMel(samples, model.n_mels)
            with model.lock:
                language, language_probability, all_language_probs = detect_language(model.backend, tok, mel)
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
            max_new_tokens=max_new_tokens, word_timestamps=bool(word_timestamps), **punctuations)
        prompt = get_prompt(tok, previous, language, task, without_timestamps)
        info = TranscriptionInfo(language=language, language_probability=language_probability, duration=duration,
                                 duration_after_vad=sum(e - s for s, e in chunks) / SAMPLE_RATE,
                                 all_language_probs=all_language_probs, transcription_options=options,
                                 vad_options=vad, speech_chunks=speech)
        segments = self._segments(samples, chunks, prompt, options, batch_size, language, task)
        return (restore_times(segments, speech) if speech else segments), info

    def _segments(self, samples, chunks, prompt, options, batch_size, language, task):
        model, tok = self.model, self.model.tokenizer
        backend, idx = model.search_backend(options), 0
        # as many windows a decode as the backend's batch holds (the device may hold fewer); the words are aligned
        # over the batch_size chunks faster-whisper batches
        per_decode = min(batch_size, backend.max_items) if options.beam_size == 1 else 1
        last_speech_timestamp = 0.0
        for at in range(0, len(chunks), batch_size):
            part = chunks[at:at + batch_size]
            windows = [LogMel(samples.read(s, e), model.n_mels) for s, e in part]
            windows = [m.window(0, min(N_FRAMES, m.content_frames)) for m in windows]
            sizes = [int(math.ceil((e - s) / SAMPLE_RATE) * FRAMES_PER_SECOND) for s, e in part]
            with model.lock:        # the backend's state is this batch's until its tokens (and words) are out
                results = []
                for k in range(0, len(part), per_decode):
                    if options.beam_size == 1:
                        backend.encode_batch(np.stack(windows[k:k + per_decode]))
                        results += generate_batch(backend, tok, [prompt] * len(windows[k:k + per_decode]), options,
                                                  model.suppress_blank_ids)
                    else:
                        backend.encode(windows[k])
                        results.append(generate(backend, tok, prompt, options, 0.0, model.suppress_blank_ids))
                batch = []
                for (s, e), size, (hyp, no_speech_prob) in zip(part, sizes, results):
                    parts, _, _ = split_segments(tok, hyp.tokens, s / SAMPLE_RATE, size, (e - s) / SAMPLE_RATE, 0)
                    seek = int(s / SAMPLE_RATE * FRAMES_PER_SECOND)
                    for p in parts:
                        p["seek"] = seek        # the words are timed from here (faster-whisper's segment seek)
                    batch.append((parts, hyp, no_speech_prob))
                if options.word_timestamps:
                    last_speech_timestamp = self._add_words(windows, sizes, [p for p, _, _ in batch], options,
                                                            language, task, last_speech_timestamp)
            for parts, hyp, no_speech_prob in batch:
                n = len(hyp.tokens)
                avg_logprob = hyp.score * (n ** options.length_penalty) / (n + 1)
                for p in parts:
                    idx += 1
                    text = tok.decode(p["tokens"])
                    words = [W.Word(**w) for w in p["words"]] if options.word_timestamps else None
                    yield Segment(id=idx, seek=p["seek"], start=round(p["start"], 3), end=round(p["end"], 3),
                                  text=text, tokens=p["tokens"], avg_logprob=avg_logprob,
                                  compression_ratio=compression_ratio(text), no_speech_prob=no_speech_prob,
                                  words=words, temperature=options.temperatures[0])

    def _add_words(self, windows, sizes, batch, options, language, task, last_speech_timestamp) -> float:
        """Set the words of a batch's segments (batch: each chunk's split_segments parts), as faster-whisper's
        add_word_timestamps over its batch: each chunk's text aligned over its first `sizes` frames (its window
        encoded again on the one-window state, where align reads it), the batch's padding added
        (words.batch_alignments), then the word rules chunk by chunk, the last speech timestamp carried on; returns
        it."""
        tok = self.model.tokenizer
        backend = self.model.word_backend()
        sot = tok.sot_sequence(language, task)
        aligned = []
        for window, size, parts in zip(windows, sizes, batch):
            text = W.text_tokens_of(tok, parts)
            if text:
                backend.encode(window)
                aligned.append(backend.align(W.alignment_tokens(tok, sot, text), size))
            else:
                aligned.append(None)
        for parts, a in zip(batch, W.batch_alignments(aligned, sizes)):
            last_speech_timestamp = W.add_word_timestamps(
                tok, parts, len(sot), language, a, options.prepend_punctuations, options.append_punctuations,
                last_speech_timestamp)
        return last_speech_timestamp


def batched_vad_options(vad_parameters) -> VadOptions:
    """The pipeline's VAD options, as faster-whisper's: speech at most 30 s a chunk, and a chunk ends after 160 ms
    of silence by default (a dict's max_speech_duration_s is replaced by 30 s; VadOptions are used as they are)."""
    if vad_parameters is None:
        return VadOptions(max_speech_duration_s=30, min_silence_duration_ms=160)
    if isinstance(vad_parameters, dict):
        return vad_options(dict(vad_parameters, max_speech_duration_s=30))
    return vad_options(vad_parameters)


def speech_windows(speech: list) -> list:
    """[(start, end)] in samples of the joined speech (vad.keep_speech): the speech chunks gathered in order into
    windows of at most 30 s, as faster-whisper's collect_chunks gathers them (none where there is no speech)."""
    limit = N_FRAMES * SAMPLE_RATE // FRAMES_PER_SECOND
    out, start, length = [], 0, 0
    for c in speech:
        n = c["end"] - c["start"]
        if length + n > limit and length:
            out.append((start, start + length))
            start, length = start + length, 0
        length += n
    if length:
        out.append((start, start + length))
    return out


def _chunks(clip_timestamps, n: int) -> list:
    """[(start, end)] in samples: clip_timestamps' ({"start", "end"} in seconds, at most 30 s each), else
    consecutive 30 s."""
    limit = N_FRAMES * SAMPLE_RATE // FRAMES_PER_SECOND
    if not clip_timestamps:
        return [(s, min(s + limit, n)) for s in range(0, n, limit)]
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
