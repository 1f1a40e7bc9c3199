"""BatchedInferencePipeline: one long file's 30 s chunks decoded as a batch, with faster-whisper's API
(BatchedInferencePipeline(model).transcribe(audio, batch_size=16, ...) -> (segments generator, TranscriptionInfo)).

As faster-whisper's (1.2) batched pipeline: every chunk is decoded on its own (no previous text as the prompt, no
seek within a chunk), once (no fallback, no silent-chunk skip), by default without timestamps; a chunk's tokens are
split into segments on timestamp tokens as the sequential loop splits a window's. Every chunk has the same prompt
(get_prompt): the initial_prompt's text encoded as it is (no leading space, unlike the sequential loop's) as previous
text, the hotwords before it, never a prefix (faster-whisper's pipeline takes prefix and does not use it, so the
hotwords apply with one too). With multilingual, each chunk's language is detected on its own encoder output and
replaces the language in its prompt; the segments are reported in the file's language (TranscriptionInfo's), the
words aligned and split in it too, as faster-whisper's are. The first temperature decodes as temperature 0 and is
the segments' temperature: faster-whisper passes it to CTranslate2's generate without sampling_topk, whose default
(1) picks the best token at any temperature (the same tokens and scores; nothing is sampled).
With word_timestamps, a batch's chunks are aligned as faster-whisper aligns them (its add_word_timestamps over the
batch, CTranslate2's align run on the batch): each chunk's text tokens over its first ceil(duration) s of frames
(zero-padded log-mel past the speech included), the batch's padding as words.batch_alignments says, the words
timed from the chunk's start frame, and the last speech timestamp carried from chunk to chunk through the file.
Without clip_timestamps the chunks come from voice activity detection by default (vad_filter=True, as in
faster-whisper: minirt.whisper.vad, the speech joined into chunks of up to chunk_length s, 30 by default, the times
restored to the file's); with vad_filter=False the audio is cut into consecutive chunks of chunk_length s
(faster-whisper refuses audio that long without VAD or clip_timestamps). What differs: greedy decoding runs as a
batch, larger beams a chunk at a time; language detection for the file reads the speech's log-mel as one
(faster-whisper joins the chunks' own); a chunk's alignment encodes its window once more (the one-window state's;
faster-whisper aligns on the batch's encoder output); initial_prompt may be token ids (faster-whisper's pipeline
fails on them: it encodes the prompt as text). Refused: chunk_length above 30 (faster-whisper's pipeline
decodes only the first 30 s of such a chunk and drops the rest of its speech).
"""
from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import List, Optional, Union

import numpy as np

from ..errors import OptionError
from . import words as W
from .audio_input import SAMPLE_RATE, audio_samples
from .decoding import MAX_LENGTH, TranscriptionOptions, compression_ratio, generate, generate_batch, get_prompt
from .features import N_FRAMES, ArraySamples, LogMel
from .option_checks import check_int
from .transcribe import (Segment, TranscriptionInfo, batch_languages, detect_language, language_probabilities,
                         split_segments)
from .vad import VadOptions, keep_speech, restore_times, speech_chunks, vad_options

FRAMES_PER_SECOND = W.FRAMES_PER_SECOND
log = logging.getLogger("minirt.whisper")


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
        (the module doc says how, and what differs). Chunks: clip_timestamps ([{"start", "end"}] in seconds, each
        at most 30 s), else the speech VAD finds (vad_filter, the default; vad_parameters as faster-whisper's batched
        pipeline takes them: minirt.whisper.vad), else consecutive chunk_length s; chunk_length: 1 to 30 (None:
        30). beam_size=1 decodes the chunks of a batch together on the GPU (greedy); a larger beam decodes them one
        at a time with beam search. initial_prompt, hotwords, multilingual and temperature as faster-whisper's
        pipeline uses them (the module doc). Options faster-whisper's batched mode ignores (prefix, best_of, the
        thresholds, condition_on_previous_text, prompt_reset_on_temperature, max_initial_timestamp: CTranslate2's
        1 s applies, log_progress) are accepted and ignored, as are hallucination_silence_threshold and the
        language detection ones. word_timestamps: each segment's words as faster-whisper's pipeline computes them
        (the module doc; prepend_punctuations and append_punctuations as transcribe() takes them). Segment.seek is
        its chunk's first frame, Segment.temperature the first temperature, as faster-whisper's. batch_size: None is
        the model's max_batch_items (16 by default)."""
        kw = {k: v for k, v in locals().items() if k not in ("self", "audio", "ignored", "batch_size",
                                                              "log_progress")}
        kw.update({k: v for k, v in ignored.items() if k.startswith("language_detection_")})
        # the pipeline decodes every chunk without previous text: the longest prompt has none
        # (max_new_tokens is checked against the prompt's length below: every chunk has the same prompt)
        kw.update(language=language or self.preset_language, task=task or "transcribe",
                  condition_on_previous_text=False, max_new_tokens=None)
        model, tok = self.model, self.model.tokenizer
        kw = model.check_options(kw, sampling_allowed=False)
        beam_size, temperatures, initial_prompt = kw["beam_size"], kw["temperature"], kw["initial_prompt"]
        without_timestamps, multilingual = kw["without_timestamps"], kw["multilingual"]
        chunk_length = 30 if chunk_length is None else check_int("chunk_length", chunk_length, 1)
        if chunk_length > 30:
            raise NotImplementedError(
                f"minirt's BatchedInferencePipeline does not support chunk_length above 30 (got {chunk_length}): "
                f"faster-whisper's pipeline decodes only the first 30 s of such a chunk and drops the rest of its "
                f"speech")
        unknown = sorted(set(ignored) - {"prepend_punctuations", "append_punctuations", "vad_parameters",
                                         "hallucination_silence_threshold", "language_detection_threshold",
                                         "language_detection_segments"})
        if unknown:
            raise TypeError(f"transcribe() got unexpected keyword argument(s) {', '.join(unknown)}")
        from .model import parity_options
        parity = parity_options(prefix=prefix, hotwords=hotwords, word_timestamps=word_timestamps,
                                **{k: ignored[k] for k in ("prepend_punctuations", "append_punctuations")
                                   if k in ignored})
        parity = {k: v for k, v in parity.items() if k not in ("clip_timestamps", "hallucination_silence_threshold")}
        # faster-whisper's pipeline encodes the initial prompt's text as it is (its sequential loop adds a space)
        previous = [] if initial_prompt is None else (
            tok.encode(initial_prompt) if isinstance(initial_prompt, str) else list(initial_prompt))
        task = task or "transcribe"
        prompts = {}

        def prompt_of(lang):        # faster-whisper's pipeline passes no prefix: the hotwords apply with one
            if lang not in prompts:
                prompts[lang] = get_prompt(tok, previous, lang, task, without_timestamps, hotwords=hotwords)
            return prompts[lang]

        length = len(prompt_of(model.supported_languages[0]))       # the same in any language
        if length >= MAX_LENGTH:
            raise OptionError(f"initial_prompt and hotwords: each chunk's prompt would have {length} tokens, and "
                              f"Whisper's {MAX_LENGTH} positions hold the prompt and the new tokens")
        if max_new_tokens is not None:
            max_new_tokens = check_int("max_new_tokens", max_new_tokens, 1, MAX_LENGTH - length,
                                       f" (each chunk's prompt, the start sequence with any initial_prompt and "
                                       f"hotwords, has {length} tokens; Whisper's {MAX_LENGTH} positions hold the "
                                       f"prompt and the new tokens)")
        if multilingual and not model.is_multilingual:
            log.warning("the model is English-only; multilingual=True is ignored")      # as faster-whisper's
            multilingual = False
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
            vad = batched_vad_options(ignored.get("vad_parameters"), chunk_length)
            whole = samples.read(0, len(samples))       # the VAD reads every sample: the file is read whole then
            speech = speech_chunks(whole, vad)
            samples, chunks = ArraySamples(keep_speech(whole, speech)), speech_windows(speech, chunk_length)
        else:
            chunks = _chunks(clip_timestamps, len(samples), chunk_length)
        language = language or self.preset_language
        language_probability, all_language_probs = 1, None
        if not model.is_multilingual:
            language = "en"
        elif language is None:
            mel = LogMel(samples, model.n_mels)
            with model.lock:
                language, language_probability, all_language_probs = detect_language(model.backend, tok, mel)
        options = TranscriptionOptions(
            beam_size=beam_size, best_of=best_of, patience=patience, length_penalty=length_penalty,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            log_prob_threshold=log_prob_threshold, no_speech_threshold=no_speech_threshold,
            compression_ratio_threshold=compression_ratio_threshold, condition_on_previous_text=False,
            prompt_reset_on_temperature=0.5,
            temperatures=temperatures[:1],
            initial_prompt=initial_prompt, suppress_blank=suppress_blank,
            suppress_tokens=list(tok.suppressed_tokens(suppress_tokens)) if suppress_tokens else suppress_tokens,
            without_timestamps=without_timestamps, max_initial_timestamp=1.0, multilingual=multilingual,
            max_new_tokens=max_new_tokens, **parity)
        info = TranscriptionInfo(language=language, language_probability=language_probability, duration=duration,
                                 duration_after_vad=sum(e - s for s, e in chunks) / SAMPLE_RATE,
                                 all_language_probs=all_language_probs, transcription_options=options,
                                 vad_options=vad, speech_chunks=speech)
        segments = self._segments(samples, chunks, prompt_of, options, batch_size, language, task)
        return (restore_times(segments, speech) if speech else segments), info

    def _segments(self, samples, chunks, prompt_of, options, batch_size, language, task):
        """The segments of the chunks, batch_size at a time; prompt_of(language): a chunk's prompt."""
        model, tok = self.model, self.model.tokenizer
        # the first temperature decodes as 0 (the module doc): no sampling, no best_of rows
        decode = replace(options, temperatures=[0.0])
        backend, idx = model.search_backend(decode), 0
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
                        some = windows[k:k + per_decode]
                        backend.encode_batch(np.stack(some))
                        languages = (batch_languages(backend, tok, len(some)) if options.multilingual
                                     else [language] * len(some))
                        results += generate_batch(backend, tok, [prompt_of(lang) for lang in languages], decode,
                                                  model.suppress_blank_ids)
                    else:
                        backend.encode(windows[k])
                        lang = language_probabilities(backend, tok)[0][0] if options.multilingual else language
                        results.append(generate(backend, tok, prompt_of(lang), decode, 0.0, model.suppress_blank_ids))
                batch = []
                for (s, e), size, (hyp, no_speech_prob) in zip(part, sizes, results):
                    parts, _, _ = split_segments(tok, hyp.tokens, s / SAMPLE_RATE, size, (e - s) / SAMPLE_RATE, 0)
                    seek = int(s / SAMPLE_RATE * FRAMES_PER_SECOND)
                    for p in parts:
                        p["seek"] = seek        # the words are timed from here (faster-whisper's segment seek)
                    batch.append((parts, hyp, no_speech_prob))
                if options.word_timestamps:
                    # aligned in the file's language, whatever each chunk's (as faster-whisper's pipeline does)
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


def batched_vad_options(vad_parameters, chunk_length: int = 30) -> VadOptions:
    """The pipeline's VAD options, as faster-whisper's: speech at most chunk_length s a chunk, and a chunk ends after
    160 ms of silence by default (a dict's max_speech_duration_s is replaced by chunk_length; VadOptions are used as
    they are)."""
    if vad_parameters is None:
        return VadOptions(max_speech_duration_s=chunk_length, min_silence_duration_ms=160)
    if isinstance(vad_parameters, dict):
        return vad_options(dict(vad_parameters, max_speech_duration_s=chunk_length))
    return vad_options(vad_parameters)


def speech_windows(speech: list, chunk_length: int = 30) -> list:
    """[(start, end)] in samples of the joined speech (vad.keep_speech): the speech chunks gathered in order into
    windows of at most chunk_length s, as faster-whisper's collect_chunks gathers them (none where there is no
    speech)."""
    limit = chunk_length * SAMPLE_RATE
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


def _chunks(clip_timestamps, n: int, chunk_length: int = 30) -> list:
    """[(start, end)] in samples: clip_timestamps' ({"start", "end"} in seconds, at most 30 s each), else
    consecutive chunk_length s."""
    limit = N_FRAMES * SAMPLE_RATE // FRAMES_PER_SECOND
    if not clip_timestamps:
        step = chunk_length * SAMPLE_RATE
        return [(s, min(s + step, n)) for s in range(0, n, step)]
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
