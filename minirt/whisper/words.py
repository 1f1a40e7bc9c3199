"""Word timestamps as faster-whisper computes them (transcribe.py: add_word_timestamps, find_alignment,
merge_punctuations) over CTranslate2's Whisper align (models/whisper.cc: align, compute_alignments; dtw.cc).

The decoder runs once more over the window's text tokens (the start sequence, <|notimestamps|>, the text,
<|endoftext|>); the backend returns the cross-attention probabilities of the model's alignment heads over the
window's encoder positions (a softmax over the first num_frames // 2 of them) and each text token's probability
(a softmax over the text vocabulary, ids below <|endoftext|>): DecoderBackend.align. Here, on the host: each head's
probabilities standardized over the tokens, a median filter of width 7 over the positions, the mean of the heads,
then dynamic time warping of the text rows against the positions; a word starts at the position where the path
reaches its first token and ends where it reaches the next word's. Words come from the tokenizer's split (on spaces;
on characters for zh, ja, th, lo, my, yue), punctuation is merged into the words around it, and faster-whisper's
adjustments of overlong words at sentence and segment boundaries follow.

Alignment heads: the checkpoint's (`alignment_heads` in a CTranslate2 config.json or a Hugging Face
generation_config.json), else openai-whisper's for the OpenAI model the checkpoint is (by its Hugging Face name, or
its shapes where only one model has them), else every head of the last half of the decoder layers, the default that
openai-whisper and CTranslate2's converter use for a model without a list of its own.
"""
from __future__ import annotations

import itertools
import string
from dataclasses import asdict, dataclass
from typing import List, Optional

import numpy as np

TOKENS_PER_SECOND = 50          # encoder positions a second (time precision 0.02 s)
FRAMES_PER_SECOND = 100         # mel frames a second
MEDIAN_FILTER_WIDTH = 7
SENTENCE_END_MARKS = ".。!！?？"
PUNCTUATION = "\"'“¿([{-\"'.。,，!！?？:：”)]}、"     # faster-whisper's set for the hallucination test
NO_SPACE_LANGUAGES = {"zh", "ja", "th", "lo", "my", "yue"}


@dataclass
class Word:
    """faster-whisper's Word."""
    start: float
    end: float
    word: str
    probability: float

    def _asdict(self) -> dict:
        return asdict(self)


# openai-whisper's alignment heads of its models ([layer, head] pairs; openai/whisper, whisper/__init__.py, MIT),
# for checkpoints that do not list their own
OPENAI_ALIGNMENT_HEADS = {
    "tiny.en": [(1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)],
    "tiny": [(2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)],
    "base.en": [(3, 3), (4, 7), (5, 1), (5, 5), (5, 7)],
    "base": [(3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)],
    "small.en": [(6, 6), (7, 0), (7, 3), (7, 8), (8, 2), (8, 5), (8, 7), (9, 0), (9, 4), (9, 8), (9, 10), (10, 0),
                 (10, 1), (10, 2), (10, 3), (10, 6), (10, 11), (11, 2), (11, 4)],
    "small": [(5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7), (9, 9), (10, 5)],
    "medium.en": [(11, 4), (14, 1), (14, 12), (14, 14), (15, 4), (16, 0), (16, 4), (16, 9), (17, 12), (17, 14),
                  (18, 7), (18, 10), (18, 15), (20, 0), (20, 3), (20, 9), (20, 14), (21, 12)],
    "medium": [(13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4)],
    "large-v1": [(9, 19), (11, 2), (11, 4), (11, 17), (22, 7), (22, 11), (22, 17), (23, 2), (23, 15)],
    "large-v2": [(10, 12), (13, 17), (16, 11), (16, 12), (16, 13), (17, 15), (17, 16), (18, 4), (18, 11), (18, 19),
                 (19, 11), (21, 2), (21, 3), (22, 3), (22, 9), (22, 12), (23, 5), (23, 7), (23, 13), (25, 5),
                 (26, 1), (26, 12), (27, 15)],
    "large-v3": [(7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14), (19, 11), (21, 4), (24, 1), (25, 6)],
    "large-v3-turbo": [(2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)],
}
# (decoder layers, d_model, vocabulary, mel bins) of the models above that no other one shares
_OPENAI_SHAPES = {(4, 384, 51864, 80): "tiny.en", (4, 384, 51865, 80): "tiny", (6, 512, 51864, 80): "base.en",
                  (6, 512, 51865, 80): "base", (12, 768, 51864, 80): "small.en", (12, 768, 51865, 80): "small",
                  (24, 1024, 51864, 80): "medium.en", (24, 1024, 51865, 80): "medium",
                  (32, 1280, 51866, 128): "large-v3", (4, 1280, 51866, 128): "large-v3-turbo"}


def openai_alignment_heads(config: dict):
    """openai-whisper's alignment heads for a checkpoint of one of its models, or None: the model named by a Hugging
    Face config's _name_or_path (".../whisper-large-v2"), else the one whose shapes these are (large-v1 and large-v2
    share theirs: those need the name)."""
    name = str(config.get("_name_or_path") or "").rstrip("/").rsplit("/", 1)[-1]
    name = {"whisper-large": "large-v3", "whisper-turbo": "large-v3-turbo"}.get(name, name)
    if name.startswith("whisper-") and name[len("whisper-"):] in OPENAI_ALIGNMENT_HEADS:
        return list(OPENAI_ALIGNMENT_HEADS[name[len("whisper-"):]])
    try:
        shape = (int(config["decoder_layers"]), int(config["d_model"]), int(config["vocab_size"]),
                 int(config.get("num_mel_bins", 80)))
    except (KeyError, TypeError, ValueError):
        return None
    return list(OPENAI_ALIGNMENT_HEADS[_OPENAI_SHAPES[shape]]) if shape in _OPENAI_SHAPES else None


def default_alignment_heads(decoder_layers: int, decoder_heads: int) -> list:
    """[(layer, head)]: every head of the last half of the decoder layers."""
    return [(layer, head) for layer in range(decoder_layers // 2, decoder_layers) for head in range(decoder_heads)]


def check_alignment_heads(heads, decoder_layers: int, decoder_heads: int, source: str) -> list:
    """The heads as [(layer, head)] ints, ModelError naming `source` where one is not a pair within the model."""
    from ..errors import ModelError
    if not isinstance(heads, list):
        raise ModelError(f"{source}: alignment_heads must be a list of [layer, head] pairs, got {heads!r}")
    out = []
    for h in heads:
        try:
            layer, head = (int(x) for x in h)
        except (TypeError, ValueError):
            raise ModelError(f"{source}: alignment_heads must be [layer, head] pairs, got {h!r}") from None
        if not (0 <= layer < decoder_layers and 0 <= head < decoder_heads):
            raise ModelError(f"{source}: alignment head {[layer, head]} is not in the model's {decoder_layers} "
                             f"decoder layers of {decoder_heads} heads")
        out.append((layer, head))
    if not out:
        raise ModelError(f"{source}: alignment_heads is empty")
    return out


# -- the tokenizer's word split -------------------------------------------------------------------------------------

def split_tokens_on_unicode(tokenizer, tokens: list):
    decoded_full = tokenizer.decode_with_timestamps(tokens)
    replacement = "\ufffd"
    words, word_tokens, current, offset = [], [], [], 0
    for token in tokens:
        current.append(token)
        decoded = tokenizer.decode_with_timestamps(current)
        at = decoded.find(replacement)
        at = None if at < 0 else at + offset
        if at is None or (at < len(decoded_full) and decoded_full[at] == replacement):
            words.append(decoded)
            word_tokens.append(current)
            current = []
            offset += len(decoded)
    return words, word_tokens


def split_tokens_on_spaces(tokenizer, tokens: list):
    subwords, subword_tokens = split_tokens_on_unicode(tokenizer, tokens)
    words, word_tokens = [], []
    for subword, toks in zip(subwords, subword_tokens):
        special = toks[0] >= tokenizer.eot
        with_space = subword.startswith(" ")
        punctuation = subword.strip() in string.punctuation
        if special or with_space or punctuation or not words:
            words.append(subword)
            word_tokens.append(toks)
        else:
            words[-1] = words[-1] + subword
            word_tokens[-1].extend(toks)
    return words, word_tokens


def split_to_word_tokens(tokenizer, tokens: list, language: str):
    if language in NO_SPACE_LANGUAGES:
        return split_tokens_on_unicode(tokenizer, tokens)
    return split_tokens_on_spaces(tokenizer, tokens)


# -- the alignment ----------------------------------------------------------------------------------------------------

def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """CTranslate2's MedianFilter over the last axis: a window of `width`, reflected at the ends (a row no longer than
    width // 2 is left as it is)."""
    depth, rank = x.shape[-1], width // 2
    if depth <= rank:
        return x.copy()
    idx = np.abs(np.arange(depth)[:, None] + np.arange(-rank, rank + 1)[None, :])
    idx = np.where(idx >= depth, 2 * depth - idx - 2, idx)
    out = np.empty_like(x)
    rows = x.reshape(-1, x.shape[-2], depth) if x.ndim > 2 else x.reshape(1, -1, depth)
    for r, row in zip(out.reshape(rows.shape), rows):     # a head at a time: [tokens, positions, width] each
        r[...] = np.median(row[:, idx], axis=-1)
    return out


def negative_dtw(x: np.ndarray) -> list:
    """CTranslate2's negative_dtw: the path [(i, j)] of least cost through -x [n, m] from (0, 0) to (n - 1, m - 1),
    preferring the diagonal, then a step down, then a step right on ties as it does, in float32. Computed by
    anti-diagonals (every cell of one depends only on the two before)."""
    n, m = x.shape
    inf = np.float32(np.inf)
    cost = np.full((n + 1, m + 1), inf, np.float32)
    trace = np.full((n + 1, m + 1), -1, np.int8)
    cost[0, 0] = 0
    neg = -np.asarray(x, np.float32)
    for d in range(2, n + m + 1):
        i = np.arange(max(1, d - m), min(n, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2)).astype(np.int8)
        c = np.where(t == 0, c0, np.where(t == 1, c1, c2))
        cost[i, j] = neg[i - 1, j - 1] + c
        trace[i, j] = t
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j, path = n, m, []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        if t == 0:
            i, j = i - 1, j - 1
        elif t == 1:
            i -= 1
        else:
            j -= 1
    path.reverse()
    return path


def alignment_path(attention: np.ndarray, sot_length: int, text_length: int,
                   width: int = MEDIAN_FILTER_WIDTH) -> list:
    """CTranslate2's compute_alignments for one sequence: attention [heads, tokens, positions] (the softmax
    probabilities of the alignment heads) standardized over the tokens, median-filtered over the positions,
    averaged over the heads; the DTW path of rows sot_length .. sot_length + text_length (the text tokens and
    <|endoftext|>, as the rows before predict them)."""
    w = np.asarray(attention, np.float32)
    mean = w.mean(-2, keepdims=True)
    var = np.maximum((w * w).mean(-2, keepdims=True) - mean * mean, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = (w - mean) / np.sqrt(var)
    w = median_filter(w, width).mean(0)
    return negative_dtw(w[sot_length:sot_length + text_length + 1])


def alignment_tokens(tokenizer, sot_sequence: list, text_tokens: list) -> list:
    """The token sequence CTranslate2's align runs: the start sequence, <|notimestamps|>, the text, <|endoftext|>."""
    return list(sot_sequence) + [tokenizer.no_timestamps] + list(text_tokens) + [tokenizer.eot]


def find_alignment(tokenizer, sot_length: int, text_tokens: list, aligned, language: str) -> list:
    """faster-whisper's find_alignment for one window: [{word, tokens, start, end, probability}], times from the
    window's start. aligned: what DecoderBackend.align gave for alignment_tokens() (None: no alignment, as
    CTranslate2 gives for a window of less than two frames)."""
    if not text_tokens or aligned is None:
        return []
    attention, token_probs = aligned
    path = alignment_path(attention, sot_length, len(text_tokens))
    text_probs = np.asarray(token_probs, np.float32)[sot_length:sot_length + len(text_tokens)]
    text_indices = np.array([p[0] for p in path])
    time_indices = np.array([p[1] for p in path])
    words, word_tokens = split_to_word_tokens(tokenizer, list(text_tokens) + [tokenizer.eot], language)
    if len(word_tokens) <= 1:
        return []
    boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    if len(boundaries) <= 1:
        return []
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    starts, ends = jump_times[boundaries[:-1]], jump_times[boundaries[1:]]
    probabilities = [np.mean(text_probs[i:j]) for i, j in zip(boundaries[:-1], boundaries[1:])]
    return [dict(word=w, tokens=t, start=s, end=e, probability=p)
            for w, t, s, e, p in zip(words, word_tokens, starts, ends, probabilities)]


def batch_alignments(aligned: list, num_frames: list) -> list:
    """The alignments of a batch of windows (DecoderBackend.align's result for each, None where a window has no
    text) as CTranslate2's align gives them for the batch run at once on the CPU (models/whisper.cc), which
    faster-whisper's BatchedInferencePipeline calls on each batch of its chunks: where the windows' num_frames // 2
    differ, each window's alone; where they are all the same, the attention of a window with fewer tokens than the
    batch's longest comes with padding rows, its last token's row repeated (the padding remover fills a padded query
    with the sequence's last one), which the standardization over the tokens (alignment_path) then counts."""
    if len({int(n) // 2 for n in num_frames}) > 1:
        return list(aligned)
    rows = max((a[0].shape[1] for a in aligned if a is not None), default=0)
    out = []
    for a in aligned:
        if a is not None and a[0].shape[1] < rows:
            attention, probs = a
            pad = np.repeat(attention[:, -1:], rows - attention.shape[1], axis=1)
            a = (np.concatenate([attention, pad], axis=1), probs)
        out.append(a)
    return out


def text_tokens_of(tokenizer, segments: list) -> list:
    """The text tokens of a window's segments, in order (what is aligned)."""
    return [t for s in segments for t in s["tokens"] if t < tokenizer.eot]


def merge_punctuations(alignment: list, prepended: str, appended: str) -> None:
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous["word"].startswith(" ") and previous["word"].strip() in prepended:
            following["word"] = previous["word"] + following["word"]
            following["tokens"] = previous["tokens"] + following["tokens"]
            previous["word"], previous["tokens"] = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous["word"].endswith(" ") and following["word"] in appended:
            previous["word"] = previous["word"] + following["word"]
            previous["tokens"] = previous["tokens"] + following["tokens"]
            following["word"], following["tokens"] = "", []
        else:
            i = j
        j += 1


def add_word_timestamps(tokenizer, segments: list, sot_length: int, language: str, aligned,
                        prepend_punctuations: str, append_punctuations: str, last_speech_timestamp: float) -> float:
    """faster-whisper's add_word_timestamps for one window's segments (dicts with seek, start, end, tokens): sets
    each one's "words" (dicts with word, start, end, probability) and adjusts its start and end; returns the last
    speech timestamp. aligned: DecoderBackend.align's result for the window's alignment_tokens()."""
    if not segments:
        return last_speech_timestamp
    per_segment = [[t for t in s["tokens"] if t < tokenizer.eot] for s in segments]
    text_tokens = list(itertools.chain.from_iterable(per_segment))
    alignment = find_alignment(tokenizer, sot_length, text_tokens, aligned, language)
    durations = np.array([w["end"] - w["start"] for w in alignment])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations) if len(durations) > 0 else 0.0))
    max_duration = median_duration * 2
    if len(durations) > 0:      # words at sentence boundaries no longer than twice the median
        for i in range(1, len(alignment)):
            if alignment[i]["end"] - alignment[i]["start"] > max_duration:
                if alignment[i]["word"] in SENTENCE_END_MARKS:
                    alignment[i]["end"] = alignment[i]["start"] + max_duration
                elif alignment[i - 1]["word"] in SENTENCE_END_MARKS:
                    alignment[i]["start"] = alignment[i]["end"] - max_duration
    merge_punctuations(alignment, prepend_punctuations, append_punctuations)

    word_index = 0
    time_offset = segments[0]["seek"] / FRAMES_PER_SECOND
    for segment, seg_tokens in zip(segments, per_segment):
        saved, words = 0, []
        while word_index < len(alignment) and saved < len(seg_tokens):
            timing = alignment[word_index]
            if timing["word"]:
                words.append(dict(word=timing["word"], start=float(round(time_offset + timing["start"], 2)),
                                  end=float(round(time_offset + timing["end"], 2)),
                                  probability=float(timing["probability"])))
            saved += len(timing["tokens"])
            word_index += 1
        if words:
            # the first and second word after a pause no longer than twice the median word
            if words[0]["end"] - last_speech_timestamp > median_duration * 4 and (
                    words[0]["end"] - words[0]["start"] > max_duration
                    or (len(words) > 1 and words[1]["end"] - words[0]["start"] > max_duration * 2)):
                if len(words) > 1 and words[1]["end"] - words[1]["start"] > max_duration:
                    boundary = max(words[1]["end"] / 2, words[1]["end"] - max_duration)
                    words[0]["end"] = words[1]["start"] = boundary
                words[0]["start"] = max(0, words[0]["end"] - max_duration)
            # the segment's start where the first word is too long, else the first word's
            if segment["start"] < words[0]["end"] and segment["start"] - 0.5 > words[0]["start"]:
                words[0]["start"] = max(0, min(words[0]["end"] - median_duration, segment["start"]))
            else:
                segment["start"] = words[0]["start"]
            # the segment's end where the last word is too long, else the last word's
            if segment["end"] > words[-1]["start"] and segment["end"] + 0.5 < words[-1]["end"]:
                words[-1]["end"] = max(words[-1]["start"] + median_duration, segment["end"])
            else:
                segment["end"] = words[-1]["end"]
            last_speech_timestamp = segment["end"]
        segment["words"] = words
    return last_speech_timestamp


def get_end(segments: list) -> Optional[float]:
    """The end of the last word of the segments, else of the last segment (None: no segments)."""
    return next((w["end"] for s in reversed(segments) for w in reversed(s["words"])),
                segments[-1]["end"] if segments else None)


# -- hallucination_silence_threshold ----------------------------------------------------------------------------------

def word_anomaly_score(word: dict) -> float:
    probability = word.get("probability", 0.0)
    duration = word["end"] - word["start"]
    score = 0.0
    if probability < 0.15:
        score += 1.0
    if duration < 0.133:
        score += (0.133 - duration) * 15
    if duration > 2.0:
        score += duration - 2.0
    return score


def is_segment_anomaly(segment: Optional[dict]) -> bool:
    if segment is None or not segment["words"]:
        return False
    words = [w for w in segment["words"] if w["word"] not in PUNCTUATION][:8]
    score = sum(word_anomaly_score(w) for w in words)
    return score >= 3 or score + 0.01 >= len(words)


def next_words_segment(segments: List[dict]) -> Optional[dict]:
    return next((s for s in segments if s["words"]), None)
