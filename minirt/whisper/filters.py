"""Logit filters applied at each decoding step, as CTranslate2 applies them for faster-whisper.

Each filter changes a float32 logits array [rows, vocab] in place, given the step (0 for the first generated
token) and the tokens generated so far ([rows, step], prompt excluded). A decode that starts with forced tokens (a
prefix: CTranslate2's prefix ids) counts them as its first steps; `begin`, their number, is where sampling begins,
from which the blank suppression and the timestamp rules count (CTranslate2's sample_begin). A suppressed token's logit becomes the
lowest float32 (CTranslate2's DisableTokens value, not -inf), so its log-probability stays finite.

CTranslate2's order: repetition penalty, no-repeat n-gram, suppress_tokens, suppress_blank (first step only),
then the timestamp rules, whose "timestamp if their total probability beats every text token" test sees the
logits with all earlier suppression applied.
"""
from __future__ import annotations

import numpy as np

from ..ops import token_select as ts_op

NEG = ts_op.NEG                       # a suppressed token's logit: float32's lowest


def log_softmax(x: np.ndarray, out: np.ndarray | None = None, work: np.ndarray | None = None) -> np.ndarray:
    """float32 log-softmax over the last axis (lowest-valued entries stay finite, as in CTranslate2). out, work:
    float32 arrays of x's shape to compute in (the result is `out`): a caller that reuses them across steps does not
    fault in fresh pages for each step's temporaries (16 x 51864 logits are 3.3 MB a temporary)."""
    with np.errstate(over="ignore", invalid="ignore"):
        m = x.max(-1, keepdims=True)
        s = np.subtract(x, m, out=out, dtype=np.float32)
        lse = np.log(np.exp(s, out=work).sum(-1, keepdims=True, dtype=np.float32))
        return np.subtract(s, lse, out=s)


def logsumexp(x: np.ndarray) -> np.float32:
    m = x.max()
    with np.errstate(over="ignore"):
        return np.float32(m + np.log(np.exp(x - m).sum(dtype=np.float32)))


class RepetitionPenalty:
    """Tokens already generated: a negative logit is multiplied by the penalty, a positive one divided."""

    def __init__(self, penalty: float):
        self.penalty = np.float32(penalty)

    def __call__(self, logits, step, seq):
        for r in range(seq.shape[0]):
            ids = seq[r]
            if len(ids):
                v = logits[r, ids]
                logits[r, ids] = np.where(v < 0, v * self.penalty, v / self.penalty)


class NoRepeatNgram:
    """No n-gram twice: a token that would complete an n-gram already in the row is suppressed."""

    def __init__(self, n: int):
        self.n = int(n)

    def __call__(self, logits, step, seq):
        n = self.n
        if seq.shape[1] < n:
            return
        for r in range(seq.shape[0]):
            row = list(seq[r])
            tail = row[len(row) - n + 1:]
            banned = {row[i + n - 1] for i in range(len(row) - n + 1) if row[i:i + n - 1] == tail}
            if banned:
                logits[r, sorted(banned)] = NEG


class SuppressTokens:
    """These tokens at every step (faster-whisper's suppress_tokens, after WhisperTokenizer.suppressed_tokens)."""

    def __init__(self, ids):
        self.ids = np.asarray(sorted(set(int(i) for i in ids)), np.int64)

    def __call__(self, logits, step, seq):
        if len(self.ids):
            logits[:, self.ids] = NEG


class SuppressBlank:
    """These tokens at the first sampled step only (suppress_blank: the space token and <|endoftext|>)."""

    def __init__(self, ids, begin: int = 0):
        self.ids = np.asarray(sorted(set(int(i) for i in ids)), np.int64)
        self.begin = int(begin)

    def __call__(self, logits, step, seq):
        if step == self.begin and len(self.ids):
            logits[:, self.ids] = NEG


class TimestampRules:
    """CTranslate2's ApplyTimestampRules (decoding with timestamps):

    - <|notimestamps|> never;
    - the first token is a timestamp no later than max_initial_timestamp;
    - timestamps come in pairs: after a pair (or a lone first timestamp) comes text, after text and one timestamp
      comes <|endoftext|> or a timestamp no earlier than that one;
    - timestamps do not decrease: after text, timestamps up to the last one are suppressed;
    - where the row may end with text or a timestamp, if the timestamps' total probability is above every text
      token's, text (everything below <|0.00|>, <|endoftext|> included) is suppressed.

    After `sample_begin` forced tokens (a prefix) the rules read only the tokens sampled after them, and the first
    sampled step has none of them (only <|notimestamps|> is suppressed there), as CTranslate2 applies them."""

    def __init__(self, eot: int, no_timestamps: int, timestamp_begin: int, timestamp_end: int,
                 max_initial_timestamp_id: int, sample_begin: int = 0):
        self.eot, self.no_timestamps = eot, no_timestamps
        self.begin, self.end = timestamp_begin, timestamp_end
        self.max_initial = max_initial_timestamp_id
        self.sample_begin = int(sample_begin)

    def rules(self, step: int, row) -> tuple:
        """(the [lo, hi) id ranges suppressed, whether the text-or-timestamp check applies) for a row whose tokens so
        far are row[:step]; <|notimestamps|> is suppressed besides."""
        begin, end = self.begin, self.end
        if self.sample_begin:
            if step <= self.sample_begin:
                return [], False
            step, row = step - self.sample_begin, row[self.sample_begin:]
        if step == 0:
            return [(0, begin), (self.max_initial + 1, end + 1)], False
        last = int(row[step - 1])
        if last >= begin:
            penultimate = int(row[step - 2]) if step - 1 > 0 else last
            if penultimate >= begin:              # a pair closed: text must follow
                return [(begin, end + 1)], False
            return [(0, self.eot), (begin, last)], True   # text then one timestamp: <|endoftext|> or a later one
        ts = row[:step][row[:step] >= begin]      # no timestamp before (or equal to) the last one
        return ([(begin, int(ts[-1]) + 1)] if len(ts) else []), True

    def __call__(self, logits, step, seq):
        begin, end = self.begin, self.end
        check = []
        for r in range(logits.shape[0]):
            logits[r, self.no_timestamps] = NEG
            ranges, checked = self.rules(step, seq[r])
            for lo, hi in ranges:
                logits[r, lo:hi] = NEG
            if checked:
                check.append(r)
        for r in check:
            lp = log_softmax(logits[r])
            if logsumexp(lp[begin:end + 1]) > lp[:begin].max():
                logits[r, :begin] = NEG


class GpuMasks:
    """A decode's filters as the inputs of TokenSelect (minirt/ops/token_select.py), greedy decoding's pick on the GPU:
    `bits`, SuppressTokens' ids (the same every step), and control(step, seq), each row's SuppressBlank ids (step 0),
    TimestampRules' <|notimestamps|>, ranges and check (TimestampRules.rules) and the split of text from timestamps.
    Only filters that set logits to NEG at a few ids and ranges decided from the tokens so far are masks: the
    repetition penalty rescales logits and no_repeat_ngram bans any number of ids, so a decode with either keeps the
    host path (of() gives None), as do sampling and beam search, which need every log-probability."""

    def __init__(self, filters, vocab: int):
        self.vocab = int(vocab)
        self.rules = next((f for f in filters if isinstance(f, TimestampRules)), None)
        self.blank = sorted({int(i) for f in filters if isinstance(f, SuppressBlank) for i in f.ids})
        self.blank_step = next((f.begin for f in filters if isinstance(f, SuppressBlank)), 0)
        self.bits = ts_op.suppress_bits([int(i) for f in filters if isinstance(f, SuppressTokens) for i in f.ids],
                                        self.vocab)

    @classmethod
    def of(cls, filters, vocab: int):
        """GpuMasks of these filters, or None where one is not a mask or they need more ids than a row holds."""
        if any(not isinstance(f, (SuppressTokens, SuppressBlank, TimestampRules)) for f in filters) or \
                sum(isinstance(f, TimestampRules) for f in filters) > 1:
            return None
        m = cls(filters, vocab)
        if len(m.blank) + (m.rules is not None) > ts_op.N_IDS or (m.rules and m.rules.end != m.vocab - 1):
            return None
        return m

    def control(self, step: int, seq) -> np.ndarray:
        """TokenSelect's control rows for rows at generation step `step` whose tokens so far are seq [rows, step]."""
        c = ts_op.control(len(seq), self.vocab)
        ids = self.blank if step == self.blank_step else []
        if self.rules is not None:
            ids = ids + [self.rules.no_timestamps]
            c[:, ts_op.BEGIN] = self.rules.begin
            for r in range(len(seq)):
                ranges, check = self.rules.rules(step, seq[r])
                for k, (lo, hi) in enumerate(ranges):
                    c[r, ts_op.RANGES + 2 * k:ts_op.RANGES + 2 * k + 2] = lo, hi
                c[r, ts_op.CHECK] = check
        c[:, ts_op.IDS:ts_op.IDS + len(ids)] = ids
        return c
