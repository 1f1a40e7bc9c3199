"""Greedy decoding, sampling and beam search on the host, step for step as CTranslate2 runs them for
faster-whisper (decoding.cc: GreedySearch, BeamSearch; sampling.cc), against a DecoderBackend.

Both start from the logits of the prompt's last position (the first generated token) with one cache row. Where the
decode starts with forced tokens (`prefix`: a prefix the prompt ran, CTranslate2's prefix ids), they are the first
tokens of every hypothesis, count as its first steps and score 0, and the search picks from the step after them.
Scores are float32 sums of log-probabilities (after the filters), <|endoftext|>'s included; a hypothesis' final
score is that sum divided by len(tokens) ** length_penalty, its tokens exclude <|endoftext|>.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .filters import GpuMasks, log_softmax


@dataclass
class Hypothesis:
    tokens: list
    score: float          # the final score: summed log-probability / len(tokens) ** length_penalty


def _final_score(total, length, length_penalty) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float32(total) / np.float32(math.pow(length, length_penalty)))


def _apply(filters, logits, step, seq):
    for f in filters:
        f(logits, step, seq)


def _sample(log_probs: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """One token per row from softmax(log_probs / temperature)."""
    with np.errstate(over="ignore"):
        scaled = log_probs * np.float32(1.0 / temperature)
    scaled -= scaled.max(-1, keepdims=True)
    p = np.exp(scaled, dtype=np.float64)
    c = np.cumsum(p, axis=-1)
    u = rng.random(len(p)) * c[:, -1]
    return np.minimum((c < u[:, None]).sum(-1), p.shape[-1] - 1)


def greedy(backend, first_logits, filters, eot: int, max_length: int, temperature: float = 0.0,
           num_hypotheses: int = 1, length_penalty: float = 1.0, rng=None, prefix=()) -> list:
    """Greedy decoding (temperature 0) or sampling (temperature > 0, num_hypotheses independent rows, best
    first). Returns [Hypothesis]. The backend's cache holds the prompt as one row on entry. Greedy decoding of one
    row picks the tokens after the first on the GPU where the backend offers it (gpu_select: step_select) and every
    filter is a mask (filters.GpuMasks): only the pick comes back, the same tokens as the host's, scores equal to
    float32 rounding (the GPU sums in another order). Sampling needs every probability: the host path."""
    n = int(num_hypotheses)
    masks = None
    if temperature == 0 and n == 1 and getattr(backend, "gpu_select", False) and hasattr(backend, "step_select"):
        masks = GpuMasks.of(filters, backend.n_vocab)
    if n > 1:
        backend.reorder(np.zeros(n, np.int64))
    if temperature > 0 and rng is None:
        rng = np.random.default_rng()
    logits = np.repeat(np.asarray(first_logits, np.float32).reshape(1, -1), n, axis=0)
    alive = list(range(n))                       # hypothesis index of each cache row
    begin = len(prefix)
    seq = np.tile(np.asarray(prefix, np.int64).reshape(1, begin), (n, 1))     # tokens so far, per row
    tokens = [list(prefix) for _ in range(n)]
    totals = [np.float32(0)] * n
    for step in range(begin, max_length):
        if step > begin and masks is not None:
            sel = backend.step_select(seq[:, -1], masks.bits, masks.control(step, seq))
            ids, scores = sel[:, 0].astype(np.int64), sel[:, 1]
        else:
            if step > begin:
                logits = np.array(backend.step(seq[:, -1]), np.float32)
            _apply(filters, logits, step, seq)
            log_probs = log_softmax(logits)
            if temperature > 0:
                ids = _sample(log_probs, temperature, rng)
            else:
                ids = log_probs.argmax(-1)
            scores = log_probs[np.arange(len(ids)), ids]
        seq = np.concatenate([seq, ids[:, None]], axis=1)
        keep = []
        for r, h in enumerate(alive):
            t = int(ids[r])
            if t != eot:
                tokens[h].append(t)
            totals[h] = np.float32(totals[h] + scores[r])
            if t != eot and step + 1 < max_length:
                keep.append(r)
        if not keep:
            break
        if len(keep) != len(alive):
            alive = [alive[r] for r in keep]
            seq = seq[keep]
            backend.reorder(np.asarray(keep, np.int64))
    hyps = [Hypothesis(tokens[h], _final_score(totals[h], len(tokens[h]), length_penalty)) for h in range(n)]
    return sorted(hyps, key=lambda h: -h.score) if n > 1 else hyps


def _topk(x: np.ndarray, k: int):
    """Indices of the k largest values of a 1-D array, largest first (ties: lower index first)."""
    k = min(k, len(x))
    part = np.argpartition(-x, k - 1)[:k]
    order = np.lexsort((part, -x[part]))
    return part[order]


def max_candidates(beam_size: int, patience: float) -> int:
    """How many finished hypotheses end a beam search: round(beam_size * patience), halves away from zero."""
    return int(math.floor(float(np.float32(beam_size) * np.float32(patience)) + 0.5))


def beam_search(backend, first_logits, filters, eot: int, max_length: int, beam_size: int, patience: float = 1.0,
                length_penalty: float = 1.0, num_hypotheses: int = 1, prefix=()) -> list:
    """CTranslate2's beam search for one input: 2 * beam_size candidates per step; a candidate ending in
    <|endoftext|> among the first beam_size becomes a finished hypothesis and its place goes to the next
    unfinished candidate; the search stops once round(beam_size * patience) hypotheses are finished (or, with
    length_penalty 0, once the best beam finished and num_hypotheses are), or at max_length. Returns
    [Hypothesis], best first, at most num_hypotheses. After a prefix, the first search step turns an <|endoftext|>
    candidate other than the best into token 0 with score -1e10, as CTranslate2 does (it keeps a short hypothesis
    from ending the search early)."""
    wanted = max_candidates(beam_size, patience)
    if num_hypotheses > wanted:
        raise ValueError(f"num_hypotheses {num_hypotheses} is more than beam_size * patience ({wanted})")
    n_cand = 2 * beam_size
    early_exit = length_penalty == 0
    logits = np.asarray(first_logits, np.float32).reshape(1, -1).copy()
    vocab = logits.shape[1]
    begin = len(prefix)
    seq = np.asarray(prefix, np.int64).reshape(1, begin)
    beam_scores = None
    finished = []                      # (summed score, tokens)
    top_finished = False
    for step in range(begin, max_length):
        if step > begin:
            logits = np.array(backend.step(seq[:, -1]), np.float32)
        _apply(filters, logits, step, seq)
        log_probs = log_softmax(logits)
        if beam_scores is not None:
            log_probs += beam_scores[:, None]
        flat = log_probs.reshape(-1)
        top = _topk(flat, n_cand)
        origin, word, score = top // vocab, top % vocab, flat[top]
        if begin and step == begin:
            late_end = np.nonzero(word[1:] == eot)[0] + 1
            word[late_end], score[late_end], origin[late_end] = 0, np.float32(-1e10), 0
        seq = np.concatenate([seq[origin], word[:, None]], axis=1)
        last = step + 1 == max_length
        secondary = beam_size
        active = []
        for k in range(beam_size):
            nxt = k
            if word[k] == eot or last:
                if k == 0:
                    top_finished = True
                end = step if word[k] == eot else step + 1
                finished.append((score[k], [int(t) for t in seq[k, :end]]))
                for j in range(secondary, len(word)):
                    if word[j] != eot:
                        nxt, secondary = j, j + 1
                        break
            active.append(nxt)
        if last or (top_finished and len(finished) >= num_hypotheses if early_exit else len(finished) >= wanted):
            break
        seq, beam_scores = seq[active], score[active]
        backend.reorder(origin[active])
    hyps = [Hypothesis(toks, _final_score(s, len(toks), length_penalty)) for s, toks in finished]
    return sorted(hyps, key=lambda h: -h.score)[:num_hypotheses]
