"""Logit filters applied at each decoding step, as CTranslate2 applies them for faster-whisper.

Each filter changes a float32 logits array [rows, vocab] in place, given the step (0 for the first generated
token) and the tokens generated so far ([rows, step], prompt excluded). A suppressed token's logit becomes the
lowest float32 (CTranslate2's DisableTokens value, not -inf), so its log-probability stays finite.

CTranslate2's order: repetition penalty, no-repeat n-gram, suppress_tokens, suppress_blank (first step only),
then the timestamp rules, whose "timestamp if their total probability beats every text token" test sees the
logits with all earlier suppression applied.
"""
from __future__ import annotations

import numpy as np

NEG = np.finfo(np.float32).min        # a suppressed token's logit


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
    """These tokens at the first step only (suppress_blank: the space token and <|endoftext|>)."""

    def __init__(self, ids):
        self.ids = np.asarray(sorted(set(int(i) for i in ids)), np.int64)

    def __call__(self, logits, step, seq):
        if step == 0 and len(self.ids):
            logits[:, self.ids] = NEG


class TimestampRules:
    """CTranslate2's ApplyTimestampRules (decoding with timestamps):

    - <|notimestamps|> never;
    - the first token is a timestamp no later than max_initial_timestamp;
    - timestamps come in pairs: after a pair (or a lone first timestamp) comes text, after text and one timestamp
      comes <|endoftext|> or a timestamp no earlier than that one;
    - timestamps do not decrease: after text, timestamps up to the last one are suppressed;
    - where the row may end with text or a timestamp, if the timestamps' total probability is above every text
      token's, text (everything below <|0.00|>, <|endoftext|> included) is suppressed."""

    def __init__(self, eot: int, no_timestamps: int, timestamp_begin: int, timestamp_end: int,
                 max_initial_timestamp_id: int):
        self.eot, self.no_timestamps = eot, no_timestamps
        self.begin, self.end = timestamp_begin, timestamp_end
        self.max_initial = max_initial_timestamp_id

    def __call__(self, logits, step, seq):
        begin, end = self.begin, self.end
        check = []
        for r in range(logits.shape[0]):
            logits[r, self.no_timestamps] = NEG
            if step == 0:
                logits[r, :begin] = NEG
                logits[r, self.max_initial + 1:end + 1] = NEG
                continue
            last = int(seq[r, step - 1])
            if last >= begin:
                penultimate = int(seq[r, step - 2]) if step - 1 > 0 else last
                if penultimate >= begin:          # a pair closed: text must follow
                    logits[r, begin:end + 1] = NEG
                else:                             # text then one timestamp: <|endoftext|> or a later timestamp
                    logits[r, :self.eot] = NEG
                    logits[r, begin:last] = NEG
                    check.append(r)
            else:
                check.append(r)
                ts = seq[r, :step][seq[r, :step] >= begin]
                if len(ts):                       # no timestamp before (or equal to) the last one
                    logits[r, begin:int(ts[-1]) + 1] = NEG
        for r in check:
            lp = log_softmax(logits[r])
            if logsumexp(lp[begin:end + 1]) > lp[:begin].max():
                logits[r, :begin] = NEG
