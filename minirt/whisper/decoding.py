"""One window's decode on the host, as faster-whisper drives CTranslate2 (transcribe.py: get_prompt,
generate_with_fallback; models/whisper.cc: generate): the prompt, the no-speech probability, the logit filters,
greedy / sampling / beam search, and the temperature fallback.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable, List, Optional, Union

import numpy as np

from ..ops import token_select as ts_op
from . import filters as F
from .filters import log_softmax
from .search import Hypothesis, _apply, _final_score, beam_search, greedy

MAX_LENGTH = 448            # faster-whisper's max_length: prompt and generated tokens of one window
TIME_PRECISION = 0.02       # seconds per timestamp token


@dataclass
class TranscriptionOptions:
    """faster-whisper's TranscriptionOptions (the fields minirt uses; names and meanings are faster-whisper's)."""
    beam_size: int = 5
    best_of: int = 5
    patience: float = 1.0
    length_penalty: float = 1.0
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    log_prob_threshold: Optional[float] = -1.0
    no_speech_threshold: Optional[float] = 0.6
    compression_ratio_threshold: Optional[float] = 2.4
    condition_on_previous_text: bool = True
    prompt_reset_on_temperature: float = 0.5
    temperatures: List[float] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    initial_prompt: Optional[Union[str, Iterable[int]]] = None
    suppress_blank: bool = True
    suppress_tokens: Optional[List[int]] = (-1,)      # the resolved list once transcribe() has built it
    without_timestamps: bool = False
    max_initial_timestamp: float = 1.0
    multilingual: bool = False
    max_new_tokens: Optional[int] = None
    word_timestamps: bool = False
    prefix: Optional[str] = None
    hotwords: Optional[str] = None
    clip_timestamps: Union[str, List[float]] = "0"
    hallucination_silence_threshold: Optional[float] = None
    prepend_punctuations: str = "\"'“¿([{-"
    append_punctuations: str = "\"'.。,，!！?？:：”)]}、"


@dataclass
class DecodeResult:
    tokens: list
    score: float                 # the search's final score (summed log-probability / len ** length_penalty)
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float


def compression_ratio(text: str) -> float:
    """len(utf-8 bytes) / len(zlib-compressed bytes), faster-whisper's repetition measure."""
    b = text.encode("utf-8")
    return len(b) / len(zlib.compress(b))


def get_prompt(tokenizer, previous_tokens, language, task="transcribe", without_timestamps=False, prefix=None,
               hotwords=None) -> list:
    """faster-whisper's get_prompt: <|startofprev|>, the hotwords (where there is no prefix) and the last 223 previous
    tokens (when there are any of either), the start sequence, <|notimestamps|> when decoding without timestamps, and
    the prefix (after <|0.00|> when decoding with timestamps). Hotwords and a prefix longer than half the text
    context are cut to its half less one, from the end, as faster-whisper cuts them."""
    prompt = []
    hot = hotwords and not prefix
    if previous_tokens or hot:
        prompt.append(tokenizer.sot_prev)
        if hot:
            prompt.extend(tokenizer.encode(" " + hotwords.strip())[:MAX_LENGTH // 2 - 1])
        if previous_tokens:
            prompt.extend(previous_tokens[-(MAX_LENGTH // 2 - 1):])
    prompt.extend(tokenizer.sot_sequence(language, task))
    if without_timestamps:
        prompt.append(tokenizer.no_timestamps)
    if prefix:
        tokens = tokenizer.encode(" " + prefix.strip())[:MAX_LENGTH // 2 - 1]
        if not without_timestamps:
            prompt.append(tokenizer.timestamp_begin)
        prompt.extend(tokens)
    return prompt


def make_filters(tokenizer, options: TranscriptionOptions, vocab: int, with_timestamps: bool,
                 suppress_blank_ids, sample_begin: int = 0) -> list:
    """The logit filters in CTranslate2's order; sample_begin: the forced tokens (a prefix) before the first sampled
    step (filters.py)."""
    out = []
    if options.repetition_penalty != 1:
        out.append(F.RepetitionPenalty(options.repetition_penalty))
    if options.no_repeat_ngram_size > 0:
        out.append(F.NoRepeatNgram(options.no_repeat_ngram_size))
    if options.suppress_tokens:
        out.append(F.SuppressTokens(options.suppress_tokens))
    if options.suppress_blank:
        out.append(F.SuppressBlank(suppress_blank_ids, sample_begin))
    if with_timestamps:
        index = int(round(options.max_initial_timestamp / TIME_PRECISION))
        begin = tokenizer.timestamp_begin
        out.append(F.TimestampRules(tokenizer.eot, tokenizer.no_timestamps, begin, vocab - 1, begin + index,
                                    sample_begin))
    return out


def no_speech_probability(logits_at_sot: np.ndarray, no_speech_id: int) -> float:
    p = F.log_softmax(np.asarray(logits_at_sot, np.float32).reshape(1, -1))[0, no_speech_id]
    return float(np.exp(p))


def _limits(tokenizer, prompt, options: TranscriptionOptions):
    """(index of <|startoftranscript|> in the prompt, tokens to generate at most, the forced tokens) as CTranslate2
    counts them: the prompt runs up to its last special token of the start sequence (<|startoftranscript|> ..
    <|notimestamps|>), and the tokens after it (a prefix, with <|0.00|> when decoding with timestamps) are forced
    as the first generated ones, within the limit."""
    sot_index = prompt.index(tokenizer.sot)
    length = sot_index
    while length < len(prompt) and tokenizer.sot <= prompt[length] <= tokenizer.no_timestamps:
        length += 1
    if options.max_new_tokens is not None:
        max_length = len(prompt) + options.max_new_tokens
    else:
        max_length = MAX_LENGTH
    if max_length > MAX_LENGTH:
        raise ValueError(f"the prompt has {len(prompt)} tokens and max_new_tokens is {options.max_new_tokens}: "
                         f"{max_length} in all is more than Whisper's {MAX_LENGTH}")
    # CTranslate2 runs prompt[:length - 1] as the prompt and generates from prompt[length - 1] on, at most half the
    # context, the forced tokens included
    return sot_index, min(max_length // 2, max_length - (length - 1)), list(prompt[length:])


def generate(backend, tokenizer, prompt, options: TranscriptionOptions, temperature: float,
             suppress_blank_ids, rng=None):
    """One decoding attempt: (best Hypothesis, no_speech_prob). The encoder output of the window must be in the
    backend already."""
    sot_index, steps, forced = _limits(tokenizer, prompt, options)
    # the forced tokens run with the prompt: the decoder computes them as it would step by step, and their
    # scores are 0 (CTranslate2 overrides their picks)
    logits = backend.start(prompt, [sot_index, len(prompt) - 1])
    no_speech_prob = no_speech_probability(logits[0], tokenizer.no_speech)
    with_timestamps = _with_timestamps(tokenizer, prompt, forced)
    flt = make_filters(tokenizer, options, backend.n_vocab, with_timestamps, suppress_blank_ids, len(forced))
    if temperature > 0:
        hyps = greedy(backend, logits[1], flt, tokenizer.eot, steps, temperature=temperature,
                      num_hypotheses=options.best_of, length_penalty=options.length_penalty, rng=rng, prefix=forced)
    elif options.beam_size == 1:
        hyps = greedy(backend, logits[1], flt, tokenizer.eot, steps, length_penalty=options.length_penalty,
                      prefix=forced)
    else:
        hyps = beam_search(backend, logits[1], flt, tokenizer.eot, steps, options.beam_size, options.patience,
                           options.length_penalty, prefix=forced)
    return hyps[0], no_speech_prob


def _with_timestamps(tokenizer, prompt, forced) -> bool:
    """Whether a prompt decodes with timestamps: its start sequence does not end with <|notimestamps|>."""
    return prompt[len(prompt) - len(forced) - 1] != tokenizer.no_timestamps


def batchable(options: TranscriptionOptions) -> bool:
    """Whether a window's first decoding attempt can run in a batch (generate_batch): greedy at temperature 0."""
    return options.beam_size == 1 and options.temperatures[0] == 0


def generate_batch(backend, tokenizer, prompts, options: TranscriptionOptions, suppress_blank_ids) -> list:
    """Greedy decoding (temperature 0) of several windows at once on a BatchDecoder whose items 0 .. n-1 are their
    encoder outputs (encode_batch): [(Hypothesis, no_speech_prob)] a prompt, each what generate() gives for that
    window alone. A row a window: each step feeds every row its next prompt token or its last generated one (rows
    with shorter prompts start generating earlier), and a row that ends (<|endoftext|> or its length limit) is
    dropped, the live rows packed first. Each step's tokens are picked on the GPU where the backend offers it
    (gpu_select: step_rows_select) and every filter is a mask (_gpu_masks); else the logits come back and the host
    filters them and picks (the same tokens; scores and no_speech_prob equal to float32 rounding: the GPU sums in
    another order)."""
    n = len(prompts)
    prompts = [list(p) for p in prompts]
    limits = [_limits(tokenizer, p, options) for p in prompts]
    filters = {}
    for p, (_, _, forced) in zip(prompts, limits):
        key = (_with_timestamps(tokenizer, p, forced), len(forced))
        if key not in filters:
            filters[key] = make_filters(tokenizer, options, backend.n_vocab, key[0], suppress_blank_ids, key[1])
    flt = [filters[(_with_timestamps(tokenizer, p, f), len(f))] for p, (_, _, f) in zip(prompts, limits)]
    masks = _gpu_masks(backend, filters.values(), "step_rows_select")
    # a row's tokens start with its forced ones (a prefix, fed with its prompt), which score 0
    fed, tokens, totals, no_speech = [0] * n, [list(f) for _, _, f in limits], [np.float32(0)] * n, [0.0] * n
    rows = list(range(n))               # the item of each row
    scratch = np.empty((2, 0, 0), np.float32)     # log_softmax's arrays, reused from step to step
    backend.start_rows(rows)
    while rows:
        feed = np.asarray([prompts[i][fed[i]] if fed[i] < len(prompts[i]) else tokens[i][-1] for i in rows],
                          np.int64)
        gen, sot = [], []               # rows past their prompt: (row, item, generation step); rows at their sot
        for r, i in enumerate(rows):
            at = fed[i]
            fed[i] += 1
            if at == limits[i][0]:
                sot.append((r, i))
            if at >= len(prompts[i]) - 1:
                gen.append((r, i, at - (len(prompts[i]) - 1) + len(limits[i][2])))
        groups = {}
        for r, i, step in gen:          # rows with the same filters at the same step are filtered together
            groups.setdefault((id(flt[i]), step), []).append((r, i))
        groups = [(flt[members[0][1]], step, [r for r, _ in members],
                   np.array([tokens[i] for _, i in members], np.int64).reshape(len(members), step))
                  for (_, step), members in groups.items()]
        if masks:
            ids, scores, probs = _pick_gpu(backend, masks, feed, gen, groups, sot, tokenizer.no_speech)
        else:
            ids, scores, probs, scratch = _pick_host(backend, feed, gen, groups, sot, tokenizer.no_speech, scratch)
        for (r, i), p in zip(sot, probs):
            no_speech[i] = p
        done = set()
        for k, (r, i, step) in enumerate(gen):
            t = int(ids[k])
            totals[i] = np.float32(totals[i] + scores[k])
            if t != tokenizer.eot:
                tokens[i].append(t)
            if t == tokenizer.eot or step + 1 >= limits[i][1]:
                done.add(r)
        if done:
            keep = [r for r in range(len(rows)) if r not in done]
            rows = [rows[r] for r in keep]
            if rows:
                backend.reorder_rows(np.asarray(keep, np.int64))
    return [(Hypothesis(tokens[i], _final_score(totals[i], len(tokens[i]), options.length_penalty)), no_speech[i])
            for i in range(n)]


def _gpu_masks(backend, filter_lists, method: str):
    """{id(filter list): filters.GpuMasks} where the backend picks tokens on the GPU (gpu_select and `method`) and
    every list is masks sharing one suppressed id set (TokenSelect takes one a step), else None."""
    if not getattr(backend, "gpu_select", False) or not hasattr(backend, method):
        return None
    masks = {id(f): F.GpuMasks.of(f, backend.n_vocab) for f in filter_lists}
    ms = list(masks.values())
    if any(m is None for m in ms) or any(not np.array_equal(m.bits, ms[0].bits) for m in ms):
        return None
    return masks


def _pick_host(backend, feed, gen, groups, sot, no_speech_id, scratch):
    """A step's logits back; (ids and scores of the generating rows, the no-speech probabilities of the rows at
    their <|startoftranscript|>, the log-softmax scratch) picked on the host."""
    logits = np.asarray(backend.step_rows(feed), np.float32)       # filtered in place
    probs = [no_speech_probability(logits[r], no_speech_id) for r, _ in sot]
    for flt, step, idx, seq in groups:
        if idx == list(range(idx[0], idx[0] + len(idx))):          # consecutive rows: filtered in place
            _apply(flt, logits[idx[0]:idx[-1] + 1], step, seq)
        else:
            sub = logits[idx]
            _apply(flt, sub, step, seq)
            logits[idx] = sub
    if not gen:
        return [], [], probs, scratch
    idx = [r for r, _, _ in gen]
    if scratch.shape[1] < len(idx):
        scratch = np.empty((2, len(idx), logits.shape[1]), np.float32)
    log_probs = log_softmax(logits[idx[0]:idx[-1] + 1] if idx == list(range(idx[0], idx[-1] + 1))
                            else logits[idx], scratch[0, :len(idx)], scratch[1, :len(idx)])
    ids = log_probs.argmax(-1)
    return ids, log_probs[np.arange(len(ids)), ids], probs, scratch


def _pick_gpu(backend, masks, feed, gen, groups, sot, no_speech_id):
    """_pick_host's figures from the GPU's TokenSelect (step_rows_select): the filters as masks, 16 bytes a row back."""
    control = ts_op.control(len(feed), backend.n_vocab)
    for flt, step, idx, seq in groups:
        control[idx] = masks[id(flt)].control(step, seq)
    control[[r for r, _ in sot], ts_op.NO_SPEECH] = no_speech_id
    sel = backend.step_rows_select(feed, next(iter(masks.values())).bits, control)
    probs = [float(np.exp(sel[r, 2] - sel[r, 3])) for r, _ in sot]       # exp(log_softmax(logits)[no_speech])
    idx = [r for r, _, _ in gen]
    return sel[idx, 0].astype(np.int64), sel[idx, 1], probs


def generate_with_fallback(backend, tokenizer, prompt, options: TranscriptionOptions, suppress_blank_ids,
                           rng=None, first=None, encode=None) -> DecodeResult:
    """Decode at each temperature in turn until the text is neither too repetitive (compression ratio above
    compression_ratio_threshold) nor too improbable (avg_logprob below log_prob_threshold), a silent window
    (no_speech_prob above no_speech_threshold with a low avg_logprob) being accepted as it is. When every
    temperature fails: the best avg_logprob among the results under the compression threshold (or among all),
    reported with the last temperature (for prompt_reset_on_temperature). first: the first temperature's
    (Hypothesis, no_speech_prob), decoded elsewhere (generate_batch); encode: what puts the window's encoder
    output into the backend, called before a later temperature's attempt where first was given."""
    results, below_cr = [], []
    temperature = 0.0
    for k, temperature in enumerate(options.temperatures):
        if k == 0 and first is not None:
            hyp, no_speech_prob = first
        else:
            if k == 1 and first is not None and encode is not None:
                encode()
            hyp, no_speech_prob = generate(backend, tokenizer, prompt, options, temperature, suppress_blank_ids,
                                           rng)
        n = len(hyp.tokens)
        cum_logprob = hyp.score * (n ** options.length_penalty)
        avg_logprob = cum_logprob / (n + 1)
        ratio = compression_ratio(tokenizer.decode(hyp.tokens).strip())
        result = DecodeResult(hyp.tokens, hyp.score, avg_logprob, no_speech_prob, temperature, ratio)
        results.append(result)
        fallback = False
        if options.compression_ratio_threshold is not None:
            if ratio > options.compression_ratio_threshold:
                fallback = True
            else:
                below_cr.append(result)
        if options.log_prob_threshold is not None and avg_logprob < options.log_prob_threshold:
            fallback = True
        if (options.no_speech_threshold is not None and no_speech_prob > options.no_speech_threshold
                and options.log_prob_threshold is not None and avg_logprob < options.log_prob_threshold):
            fallback = False        # silence
        if not fallback:
            return result
    best = max(below_cr or results, key=lambda r: r.avg_logprob)
    return DecodeResult(best.tokens, best.score, best.avg_logprob, best.no_speech_prob, temperature,
                        best.compression_ratio)
