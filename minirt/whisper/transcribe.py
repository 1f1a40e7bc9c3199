"""The seek loop over long audio, as faster-whisper's generate_segments runs it: 30 s windows of log-mel frames,
each decoded (with temperature fallback), split into segments on timestamp tokens, the next window starting
after the last complete segment; previous text as the prompt; silent windows skipped.

The loop itself (seek_loop) decodes nothing: it asks for each window's decode (a WindowRequest) and is sent the
result, so one driver decodes a file's windows one by one (generate_segments) and another the windows of many files
together, a window of each in a batch (generate_segments_batch), with the same results.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

import numpy as np

from . import words as W
from .decoding import (TIME_PRECISION, TranscriptionOptions, batchable, generate_batch, generate_with_fallback,
                       get_prompt)
from .features import N_FRAMES, TIME_PER_FRAME, LogMel
from .filters import log_softmax

INPUT_STRIDE = 2            # mel frames per encoder position (and per timestamp step)
FRAMES_PER_SECOND = W.FRAMES_PER_SECOND


@dataclass
class Segment:
    """faster-whisper's Segment (words: a list of words.Word with word_timestamps, else None)."""
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: List[int]
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: Optional[list]
    temperature: Optional[float]


@dataclass
class TranscriptionInfo:
    """faster-whisper's TranscriptionInfo (vad_options: the vad.VadOptions of a vad_filter run, else None), and
    speech_chunks: the [{"start", "end"}] samples of the audio the VAD kept (None without vad_filter)."""
    language: str
    language_probability: float
    duration: float
    duration_after_vad: float
    all_language_probs: Optional[List[Tuple[str, float]]]
    transcription_options: TranscriptionOptions
    vad_options: Optional[object] = None
    speech_chunks: Optional[list] = field(default=None, repr=False)


def language_probabilities(backend, tokenizer) -> list:
    """[(code, probability)] best first, for the window in the backend: the softmax over the language tokens'
    logits at <|startoftranscript|>."""
    return _language_probabilities(backend.start([tokenizer.sot], [0])[0], tokenizer)


def batch_languages(backend, tokenizer, n: int) -> list:
    """The best language code of each of the n windows a BatchDecoder holds (encode_batch), as CTranslate2's
    detect_language on a batch's encoder output: each window's language_probabilities, a row a window."""
    backend.start_rows(list(range(n)))
    logits = backend.step_rows(np.full(n, tokenizer.sot, np.int64))
    return [_language_probabilities(row, tokenizer)[0][0] for row in logits]


def _language_probabilities(logits_at_sot, tokenizer) -> list:
    codes = list(tokenizer.language_tokens)
    ids = [tokenizer.language_tokens[c] for c in codes]
    logits = np.asarray(logits_at_sot, np.float32)[ids]
    probs = np.exp(log_softmax(logits[None])[0])
    order = sorted(range(len(codes)), key=lambda i: -probs[i])
    return [(codes[i], float(probs[i])) for i in order]


def detect_language(backend, tokenizer, mel: LogMel, segments: int = 1, threshold: float = 0.5, start: int = 0):
    """faster-whisper's detect_language on the first `segments` windows from frame `start`: (language, probability,
    all probabilities of the last window tried). A window whose best language is above `threshold` decides; else
    the language that came first most often, with its highest probability."""
    seen = {}
    n = min(mel.n_frames - start, segments * N_FRAMES)
    probs = []
    for i in range(0, n, N_FRAMES):
        backend.encode(mel.window(start + i, min(N_FRAMES, n - i)))
        probs = language_probabilities(backend, tokenizer)
        language, p = probs[0]
        if p > threshold:
            return language, p, probs
        seen.setdefault(language, []).append(p)
    language = max(seen, key=lambda k: len(seen[k]))
    return language, max(seen[language]), probs


def split_segments(tokenizer, tokens, time_offset, segment_size, segment_duration, seek):
    """faster-whisper's _split_segments_by_timestamps: ([{seek, start, end, tokens}], next seek,
    single_timestamp_ending)."""
    begin = tokenizer.timestamp_begin
    out = []
    single_ending = len(tokens) >= 2 and tokens[-2] < begin <= tokens[-1]
    consecutive = [i for i in range(len(tokens)) if i > 0 and tokens[i] >= begin and tokens[i - 1] >= begin]
    if consecutive:
        slices = list(consecutive)
        if single_ending:
            slices.append(len(tokens))
        last = 0
        for cur in slices:
            part = tokens[last:cur]
            start = time_offset + (part[0] - begin) * TIME_PRECISION
            end = time_offset + (part[-1] - begin) * TIME_PRECISION
            out.append(dict(seek=seek, start=start, end=end, tokens=part))
            last = cur
        if single_ending:
            seek += segment_size        # nothing spoken after the last timestamp
        else:                           # the unfinished segment is decoded again from its start
            seek += (tokens[last - 1] - begin) * INPUT_STRIDE
    else:
        duration = segment_duration
        ts = [t for t in tokens if t >= begin]
        if ts and ts[-1] != begin:
            duration = (ts[-1] - begin) * TIME_PRECISION
        out.append(dict(seek=seek, start=time_offset, end=time_offset + duration, tokens=tokens))
        seek += segment_size
    return out, seek, single_ending


@dataclass
class WindowRequest:
    """What seek_loop asks of its driver: decode this window (features [n_mels, 3000]) after this previous text, in
    this language (or the window's own, detected on it, with options.multilingual), with this prefix and these
    hotwords, and send back (DecodeResult, language)."""
    features: np.ndarray
    previous_tokens: list
    language: str
    task: str
    prefix: Optional[str] = None
    hotwords: Optional[str] = None

    def prompt(self, tokenizer, language, options: TranscriptionOptions) -> list:
        return get_prompt(tokenizer, self.previous_tokens, language, self.task, options.without_timestamps,
                          self.prefix, self.hotwords)


def decode_window(backend, tokenizer, request: WindowRequest, options: TranscriptionOptions, suppress_blank_ids,
                  rng=None, first=None):
    """(DecodeResult, language) of one window on a DecoderBackend. first: the first temperature's (Hypothesis,
    no_speech_prob) from a batch (generate_batch); the window is encoded here only where a later temperature needs
    it."""
    encode = (lambda: backend.encode(request.features))
    if first is None:
        encode()
    language = request.language
    if options.multilingual:
        language = language_probabilities(backend, tokenizer)[0][0]
    prompt = request.prompt(tokenizer, language, options)
    if first is None:
        result = generate_with_fallback(backend, tokenizer, prompt, options, suppress_blank_ids, rng)
    else:
        result = generate_with_fallback(backend, tokenizer, prompt, options, suppress_blank_ids, rng, first=first,
                                        encode=encode)
    return result, language


def generate_segments(backend, tokenizer, mel: LogMel, options: TranscriptionOptions, language: str,
                      task: str = "transcribe", suppress_blank_ids=(), rng=None, progress=None, lock=None):
    """Yield Segments for the whole audio (see the module doc). `progress(seconds done, seconds in all)` is
    called after each window. lock: held while each window decodes (the backend's state is one window's), released
    before its segments are yielded."""
    lock = lock or contextlib.nullcontext()
    loop = seek_loop(tokenizer, mel, options, language, task, progress)
    msg = None
    while True:
        if msg is None:
            try:
                msg = loop.send(None)
            except StopIteration:
                return
        if not isinstance(msg, Segment):
            # A window's decode and its words' alignment (which reads the encoder output the decode left in the
            # backend) run under one hold of the lock, so no other thread's window comes between them; the lock is
            # let go before a segment is yielded.
            with lock:
                while not isinstance(msg, Segment):
                    if isinstance(msg, AlignRequest):
                        reply = backend.align(msg.tokens, msg.num_frames)
                    else:
                        reply = decode_window(backend, tokenizer, msg, options, suppress_blank_ids, rng)
                    try:
                        msg = loop.send(reply)
                    except StopIteration:
                        return
        yield msg
        msg = None


def generate_segments_batch(backend, tokenizer, files, options: TranscriptionOptions, suppress_blank_ids=(),
                            batch_size: int = 16) -> list:
    """[[Segment]] for each of `files`, [(LogMel, language, task, rng)], as generate_segments gives each: every
    file's seek loop runs, and the windows they ask for are decoded together, up to batch_size at a time (a window a
    file), on a BatchDecoder. The first decoding attempt of a window is batched where it is greedy at temperature 0
    (decoding.batchable) and the window's language is known; the rest (temperature fallback, beam search,
    sampling, a language detected a window) runs window by window."""
    loops = [seek_loop(tokenizer, mel, options, language, task) for mel, language, task, _ in files]
    out = [[] for _ in files]
    pending = {}

    def advance(f, reply):
        while True:
            try:
                msg = loops[f].send(reply)
            except StopIteration:
                return
            reply = None
            if isinstance(msg, Segment):
                out[f].append(msg)
            elif isinstance(msg, AlignRequest):     # the batch's encoder outputs are not the one-window state's
                backend.encode(msg.features)
                reply = backend.align(msg.tokens, msg.num_frames)
            else:
                pending[f] = msg
                return

    for f in range(len(files)):
        advance(f, None)
    together = batchable(options) and not options.multilingual
    while pending:
        if not together:
            for f in sorted(pending):
                advance(f, decode_window(backend, tokenizer, pending.pop(f), options, suppress_blank_ids,
                                         files[f][3]))
            continue
        batch = sorted(pending)[:batch_size]
        requests = [pending.pop(f) for f in batch]
        backend.encode_batch(np.stack([r.features for r in requests]))
        firsts = generate_batch(backend, tokenizer, [r.prompt(tokenizer, r.language, options) for r in requests],
                                options, suppress_blank_ids)
        for f, request, first in zip(batch, requests, firsts):
            advance(f, decode_window(backend, tokenizer, request, options, suppress_blank_ids, files[f][3], first))
    return out


def parse_clip_timestamps(clip_timestamps) -> list:
    """clip_timestamps as faster-whisper takes it ("start,end,start,end,..." seconds, or a list of seconds) as a
    list of floats (None: none, the whole audio); ValueError where an item is not a finite number >= 0."""
    if clip_timestamps is None:
        return []
    if isinstance(clip_timestamps, str):
        items = clip_timestamps.split(",") if clip_timestamps.strip() else []
    else:
        try:
            items = list(clip_timestamps)
        except TypeError:
            raise ValueError(f"clip_timestamps must be a string 'start,end,...' or a list of seconds, got "
                             f"{clip_timestamps!r}") from None
    out = []
    for item in items:
        try:
            v = float(item)
        except (TypeError, ValueError):
            raise ValueError(f"clip_timestamps: {item!r} is not a number of seconds") from None
        if not np.isfinite(v) or v < 0:
            raise ValueError(f"clip_timestamps: {item!r} is not a time >= 0 in seconds")
        out.append(v)
    return out


def seek_clips(clip_timestamps: list, content_frames: int) -> list:
    """[(start frame, end frame)] of the clips, as faster-whisper pairs them: an odd count ends at the end of the
    audio. A clip past the end of the audio, or whose end is not after its start, or that starts before the previous
    clip's decoded end, is (partly) skipped by the seek loop, as in faster-whisper."""
    points = [round(t * FRAMES_PER_SECOND) for t in clip_timestamps] or [0]
    if len(points) % 2 == 1:
        points.append(content_frames)
    return list(zip(points[::2], points[1::2]))


@dataclass
class AlignRequest:
    """What seek_loop asks of its driver for word timestamps: the alignment of `tokens` (words.alignment_tokens) in
    this window (features [n_mels, 3000], its first num_frames frames the content): DecoderBackend.align's result
    sent back."""
    features: np.ndarray
    tokens: list
    num_frames: int


def seek_loop(tokenizer, mel: LogMel, options: TranscriptionOptions, language: str, task: str = "transcribe",
              progress=None):
    """The seek loop of one file as a generator: it yields a WindowRequest for each window, to be sent back
    (DecodeResult, language), an AlignRequest for a window's word timestamps (options.word_timestamps), to be sent
    back DecoderBackend.align's result, and the Segments (see the module doc). It runs over the clips of
    options.clip_timestamps, the prefix on the window at the start of the audio, the hotwords on every window."""
    content_frames = mel.content_frames
    content_duration = float(content_frames * TIME_PER_FRAME)
    clips = seek_clips(parse_clip_timestamps(options.clip_timestamps), content_frames)
    idx, clip_idx = 0, 0
    seek = clips[0][0]
    all_tokens, prompt_reset_since = [], 0
    if options.initial_prompt is not None:
        if isinstance(options.initial_prompt, str):
            all_tokens.extend(tokenizer.encode(" " + options.initial_prompt.strip()))
        else:
            all_tokens.extend(int(t) for t in options.initial_prompt)
    last_speech_timestamp = 0.0
    while clip_idx < len(clips):
        clip_start, clip_end = clips[clip_idx]
        clip_end = min(clip_end, content_frames)
        seek = max(seek, clip_start)
        if seek >= clip_end:
            clip_idx += 1
            if clip_idx < len(clips):
                seek = clips[clip_idx][0]
            continue
        time_offset = seek * TIME_PER_FRAME
        window_end_time = float((seek + N_FRAMES) * TIME_PER_FRAME)
        segment_size = min(N_FRAMES, content_frames - seek, clip_end - seek)
        segment_duration = segment_size * TIME_PER_FRAME
        previous_tokens = all_tokens[prompt_reset_since:]
        features = mel.window(seek, segment_size)
        result, language = yield WindowRequest(features, previous_tokens, language, task,
                                               options.prefix if seek == 0 else None, options.hotwords)
        previous_seek = seek
        if options.no_speech_threshold is not None:
            skip = result.no_speech_prob > options.no_speech_threshold
            if options.log_prob_threshold is not None and result.avg_logprob > options.log_prob_threshold:
                skip = False
            if skip:
                seek += segment_size
                if progress:
                    progress(min(content_frames, seek) * TIME_PER_FRAME, content_duration)
                continue
        parts, seek, single_ending = split_segments(tokenizer, result.tokens, time_offset, segment_size,
                                                    segment_duration, seek)
        if options.word_timestamps:
            sot = tokenizer.sot_sequence(language, task)
            text = W.text_tokens_of(tokenizer, parts)
            aligned = None
            if text and segment_size // 2 > 0:
                aligned = yield AlignRequest(features, W.alignment_tokens(tokenizer, sot, text), segment_size)
            # (faster-whisper keeps the last speech timestamp from before the window until the end of the window)
            W.add_word_timestamps(
                tokenizer, parts, len(sot), language, aligned, options.prepend_punctuations,
                options.append_punctuations, last_speech_timestamp)
            if not single_ending:
                last_word_end = W.get_end(parts)
                if last_word_end is not None and last_word_end > time_offset:
                    seek = round(last_word_end * FRAMES_PER_SECOND)
            threshold = options.hallucination_silence_threshold
            if threshold is not None:
                skipped = _skip_hallucination(parts, threshold, time_offset, segment_duration, window_end_time,
                                              content_duration, content_frames, previous_seek,
                                              last_speech_timestamp)
                if skipped is not None:
                    seek, leading = skipped
                    if leading:
                        continue
            last_word_end = W.get_end(parts)
            if last_word_end is not None:
                last_speech_timestamp = last_word_end
        for part in parts:
            text = tokenizer.decode(part["tokens"])
            if part["start"] == part["end"] or not text.strip():
                continue
            all_tokens.extend(part["tokens"])
            idx += 1
            words = [W.Word(**w) for w in part["words"]] if options.word_timestamps else None
            yield Segment(id=idx, seek=previous_seek, start=part["start"], end=part["end"], text=text,
                          tokens=part["tokens"], avg_logprob=result.avg_logprob,
                          compression_ratio=result.compression_ratio, no_speech_prob=result.no_speech_prob,
                          words=words, temperature=result.temperature)
        if not options.condition_on_previous_text or result.temperature > options.prompt_reset_on_temperature:
            prompt_reset_since = len(all_tokens)
        if progress:
            progress(min(content_frames, seek) * TIME_PER_FRAME, content_duration)


def _skip_hallucination(parts, threshold, time_offset, segment_duration, window_end_time, content_duration,
                        content_frames, previous_seek, last_speech_timestamp):
    """faster-whisper's hallucination_silence_threshold on a window's segments (with words): None where nothing is
    skipped; else (the new seek, True) where the window's first segment is a likely hallucination after a silence
    longer than the threshold (the window is decoded again from after the silence), or (the new seek, False) where
    a later one is, surrounded by silence or hallucinations (the segments from it on are dropped, in place)."""
    first = W.next_words_segment(parts)
    if first is not None and W.is_segment_anomaly(first):
        gap = first["start"] - time_offset
        if gap > threshold:
            return previous_seek + round(gap * FRAMES_PER_SECOND), True
    hal_last_end = last_speech_timestamp
    for si, segment in enumerate(parts):
        if not segment["words"]:
            continue
        if W.is_segment_anomaly(segment):
            following = W.next_words_segment(parts[si + 1:])
            hal_next_start = following["words"][0]["start"] if following is not None \
                else time_offset + segment_duration
            silence_before = (segment["start"] - hal_last_end > threshold or segment["start"] < threshold
                              or segment["start"] - time_offset < 2.0)
            silence_after = (hal_next_start - segment["end"] > threshold or W.is_segment_anomaly(following)
                             or window_end_time - segment["end"] < 2.0)
            if silence_before and silence_after:
                seek = round(max(time_offset + 1, segment["start"]) * FRAMES_PER_SECOND)
                if content_duration - segment["end"] < threshold:
                    seek = content_frames
                parts[si:] = []
                return seek, False
        hal_last_end = segment["end"]
    return None
