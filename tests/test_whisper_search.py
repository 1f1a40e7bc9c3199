"""minirt.whisper's logit filters and searches on synthetic logits, where CTranslate2's behaviour (which
faster-whisper uses) is known from its source: decoding.cc (GreedySearch, BeamSearch), decoding_utils.cc
(SuppressTokens, SuppressTokensBegin, RepetitionPenalty, NoRepeatNgram) and models/whisper.cc
(ApplyTimestampRules, the no-speech probability)."""
import math

import numpy as np
import pytest

from minirt.whisper import filters as F
from minirt.whisper.backend import DecoderBackend
from minirt.whisper.search import beam_search, greedy, max_candidates

NEG = np.finfo(np.float32).min


class ScriptedBackend:
    """A DecoderBackend whose logits are a function of each row's tokens since the prompt; it counts the
    steps and keeps the rows' histories, so a test can see how the search drove it."""

    n_mels, n_text_ctx, multilingual = 80, 448, False

    def __init__(self, vocab, fn):
        self.n_vocab, self.fn = vocab, fn
        self.rows, self.steps, self.reorders = [], 0, []

    def encode(self, features):
        pass

    def start(self, prompt, positions):
        self.rows = [[]]
        return np.stack([self.fn(()) for _ in positions]).astype(np.float32)

    def step(self, tokens):
        self.steps += 1
        assert len(tokens) == len(self.rows)
        for r, t in zip(self.rows, tokens):
            r.append(int(t))
        return np.stack([self.fn(tuple(r)) for r in self.rows]).astype(np.float32)

    def reorder(self, rows):
        self.reorders.append(list(rows))
        self.rows = [list(self.rows[i]) for i in rows]


def logits_from(table, vocab, default=None):
    """fn(history) -> logits: log of the probabilities table[history] ({token: p}); other tokens get -30 (or
    `default`)."""
    def fn(hist):
        out = np.full(vocab, -30.0 if default is None else default, np.float32)
        for t, p in table.get(tuple(hist), {}).items():
            out[t] = math.log(p)
        return out
    return fn


def test_scripted_backend_is_a_decoder_backend():
    assert isinstance(ScriptedBackend(4, lambda h: np.zeros(4)), DecoderBackend)


# -- filters ---------------------------------------------------------------------------------------------

EOT, NO_TS, TS0, VOCAB = 10, 11, 12, 20          # text 0..9, <|endoftext|>, <|notimestamps|>, timestamps 12..19


def rules(max_initial=2):
    return F.TimestampRules(EOT, NO_TS, TS0, VOCAB - 1, TS0 + max_initial)


def allowed(logits):
    return set(np.flatnonzero(logits[0] > NEG).tolist())


def apply(flt, seq, logits=None):
    seq = np.asarray([seq], np.int64).reshape(1, -1)
    x = np.zeros((1, VOCAB), np.float32) if logits is None else np.asarray([logits], np.float32)
    flt(x, seq.shape[1], seq)
    return x


def test_timestamp_rules_first_step_a_timestamp_up_to_max_initial():
    assert allowed(apply(rules(max_initial=2), [])) == {TS0, TS0 + 1, TS0 + 2}


def test_timestamp_rules_pairs_and_order():
    r = rules()
    text_likely = np.where(np.arange(VOCAB) <= EOT, 5.0, 0.0)    # so the probability-sum rule keeps text
    # a lone first timestamp counts as a pair: text must follow
    assert allowed(apply(r, [TS0 + 1])) == set(range(EOT + 1))
    # text after a timestamp: any text or EOT, or a timestamp later than the last one
    assert allowed(apply(r, [TS0 + 1, 3], text_likely)) == set(range(EOT + 1)) | set(range(TS0 + 2, VOCAB))
    # text then one timestamp: EOT or a timestamp no earlier than it (the next segment's start)
    assert allowed(apply(r, [TS0, 3, TS0 + 4], text_likely)) == {EOT} | set(range(TS0 + 4, VOCAB))
    # a closed pair: text
    assert allowed(apply(r, [TS0, 3, TS0 + 4, TS0 + 4])) == set(range(EOT + 1))
    # <|notimestamps|> never
    for seq in ([], [TS0], [TS0, 3], [TS0, 3, TS0 + 2]):
        assert NO_TS not in allowed(apply(r, seq, text_likely))


def test_timestamp_rules_timestamp_when_their_sum_beats_every_text_token():
    # after [ts, text]: 8 allowed timestamps at p ~ 0.08 each sum above the best text token (p ~ 0.2)
    lg = np.log(np.array([0.2] + [0.05] * 9 + [0.01, 0.01] + [0.08] * 8, np.float32))
    out = apply(rules(), [TS0, 3], lg)
    assert allowed(out) == set(range(TS0 + 1, VOCAB))
    # the same without the timestamps' mass: text stays allowed
    lg2 = lg.copy()
    lg2[TS0:] = np.log(0.001)
    assert 0 in allowed(apply(rules(), [TS0, 3], lg2))


def test_suppress_blank_first_step_only_and_suppress_tokens_always():
    blank, sup = F.SuppressBlank([1, EOT]), F.SuppressTokens([4, 5])
    assert allowed(apply(blank, [])) == set(range(VOCAB)) - {1, EOT}
    assert allowed(apply(blank, [3])) == set(range(VOCAB))
    for seq in ([], [3], [3, 3]):
        assert allowed(apply(sup, seq)) == set(range(VOCAB)) - {4, 5}


def test_repetition_penalty_and_no_repeat_ngram():
    x = apply(F.RepetitionPenalty(2.0), [1, 2], np.array([0, 4.0, -4.0] + [1.0] * 17))
    assert x[0, 1] == 2.0 and x[0, 2] == -8.0 and x[0, 3] == 1.0
    # the row ends with (1, 2); (1, 2, 3) was seen, so 3 is suppressed
    assert allowed(apply(F.NoRepeatNgram(3), [1, 2, 3, 5, 1, 2])) == set(range(VOCAB)) - {3}


def test_log_softmax_keeps_suppressed_tokens_finite():
    x = np.array([[0.0, 1.0, NEG, NEG]], np.float32)
    lp = F.log_softmax(x)
    assert np.all(np.isfinite(lp)) and lp[0, 2] < -1e37
    assert np.isclose(np.exp(lp[0, :2]).sum(), 1.0)


# -- greedy ----------------------------------------------------------------------------------------------

V = 6
E = 5                 # <|endoftext|> of the scripted vocabulary


def test_greedy_tokens_and_score():
    table = {(): {1: 0.6, 2: 0.4}, (1,): {3: 0.7, E: 0.3}, (1, 3): {E: 0.9, 2: 0.1}}
    b = ScriptedBackend(V, logits_from(table, V))
    first = b.start([0], [0])[0]
    (h,) = greedy(b, first, [], E, max_length=10)
    assert h.tokens == [1, 3]
    lp = F.log_softmax(np.stack([logits_from(table, V)(k) for k in ((), (1,), (1, 3))]))
    total = np.float32(lp[0, 1]) + np.float32(lp[1, 3]) + np.float32(lp[2, E])     # <|endoftext|>'s included
    assert h.score == pytest.approx(float(total) / 2, rel=1e-6)
    assert b.steps == 2


def test_greedy_stops_at_max_length_keeping_the_last_token():
    b = ScriptedBackend(V, logits_from({}, V, default=0.0))       # uniform: argmax is token 0 every step
    (h,) = greedy(b, b.start([0], [0])[0], [], E, max_length=3)
    assert h.tokens == [0, 0, 0] and b.steps == 2


def test_sampling_is_seeded_and_follows_the_distribution():
    table = {(): {1: 0.7, 2: 0.3}}
    fn = logits_from({**table, (1,): {E: 1.0}, (2,): {E: 1.0}}, V, default=-1e4)

    def draw(seed, n):
        b = ScriptedBackend(V, fn)
        return greedy(b, b.start([0], [0])[0], [], E, 5, temperature=1.0, num_hypotheses=n,
                      rng=np.random.default_rng(seed))
    a, c = draw(3, 400), draw(3, 400)
    assert [h.tokens for h in a] == [h.tokens for h in c]
    share = sum(h.tokens == [1] for h in a) / 400
    assert 0.62 < share < 0.78
    assert a[0].score >= a[-1].score                               # best first


def test_sampling_drops_finished_rows():
    fn = logits_from({(): {1: 0.5, E: 0.5}, (1,): {E: 1.0}}, V, default=-1e4)
    b = ScriptedBackend(V, fn)
    hyps = greedy(b, b.start([0], [0])[0], [], E, 5, temperature=1.0, num_hypotheses=8,
                  rng=np.random.default_rng(0))
    assert b.reorders[0] == [0] * 8 and all(len(r) < 8 for r in b.reorders[1:])
    assert sorted(len(h.tokens) for h in hyps)[-1] == 1


# -- beam search -----------------------------------------------------------------------------------------

TRAP = {
    # greedy takes 1 (0.6), whose continuations are poor; 2 (0.4) leads to a certain ending
    (): {1: 0.6, 2: 0.4},
    (1,): {3: 0.35, 4: 0.35, E: 0.3},
    (2,): {3: 0.95, E: 0.05},
    (2, 3): {E: 0.99},
    (1, 3): {E: 0.99},
    (1, 4): {E: 0.99},
}


def test_beam_search_finds_what_greedy_misses():
    fn = logits_from(TRAP, V)
    b = ScriptedBackend(V, fn)
    (g,) = greedy(b, b.start([0], [0])[0], [], E, 10)
    assert g.tokens == [1, 3]
    b = ScriptedBackend(V, fn)
    (h,) = beam_search(b, b.start([0], [0])[0], [], E, 10, beam_size=2)
    assert h.tokens == [2, 3]
    assert b.reorders[0] == [0, 0]          # the prompt's row replicated after the first step


def test_beam_search_length_penalty_normalises_by_length():
    # [1] then EOT at once (p 0.6 * 0.6 = 0.36) against [2, 3, 3] then EOT (0.4 * 0.95^3 = 0.343): the short one
    # has the higher sum, the long one the higher sum per token
    table = {(): {1: 0.6, 2: 0.4}, (1,): {E: 0.6, 4: 0.4}, (1, 4): {E: 0.01, 0: 0.99}, (2,): {3: 0.95, 4: 0.05},
             (2, 3): {3: 0.95, 4: 0.05}, (2, 3, 3): {E: 0.95, 4: 0.05}}
    fn = logits_from(table, V, default=-40.0)
    out = {}
    for lp in (0.0, 1.0):
        b = ScriptedBackend(V, fn)
        (h,) = beam_search(b, b.start([0], [0])[0], [], E, 10, beam_size=2, length_penalty=lp)
        out[lp] = h.tokens
    assert out[0.0] == [1]                  # length_penalty 0: the raw sum
    assert out[1.0] == [2, 3, 3]            # per token: the long one


def test_beam_search_patience_waits_for_more_finished_hypotheses():
    assert max_candidates(5, 1.0) == 5 and max_candidates(2, 1.25) == 3 and max_candidates(4, 0.5) == 2
    with pytest.raises(ValueError):
        beam_search(ScriptedBackend(V, logits_from({}, V)), np.zeros(V, np.float32), [], E, 5, 2, patience=0.2)
    # hypotheses finish one per step: [1], [2, 1], [2, 2, 1], ... ; with beam 2 and patience 1 the search stops
    # at two finished hypotheses, with patience 2 at four (it runs longer and sees the longer, better ones)
    def fn(hist):
        out = np.full(V, -30.0, np.float32)
        if len(hist) and hist[-1] == 1:
            out[E] = 0.0
        else:
            out[1], out[2] = math.log(0.2), math.log(0.8)
        return out
    steps = {}
    for patience in (1.0, 2.0):
        b = ScriptedBackend(V, fn)
        beam_search(b, b.start([0], [0])[0], [], E, 20, beam_size=2, patience=patience)
        steps[patience] = b.steps
    assert steps[2.0] > steps[1.0]


def test_beam_search_secondary_candidates_replace_finished_beams():
    # at step 0 the best candidate is <|endoftext|>: it finishes at once (empty hypothesis) and the beam goes on
    # with the next candidates
    table = {(): {E: 0.5, 1: 0.3, 2: 0.2}, (1,): {E: 1.0}, (2,): {E: 1.0}}
    b = ScriptedBackend(V, logits_from(table, V))
    hyps = beam_search(b, b.start([0], [0])[0], [], E, 10, beam_size=2, num_hypotheses=2)
    assert b.reorders[0] == [0, 0] and sorted(b.rows) == [[1], [2]]
    assert {tuple(h.tokens) for h in hyps} <= {(), (1,), (2,)}


def test_beam_search_with_timestamp_rules_only_timestamps_first():
    vocab = 20
    fn = logits_from({(): {3: 0.9, TS0: 0.05, TS0 + 1: 0.05}}, vocab)
    b = ScriptedBackend(vocab, fn)
    (h,) = beam_search(b, b.start([0], [0])[0], [rules()], EOT, 6, beam_size=2)
    assert h.tokens[0] in (TS0, TS0 + 1)
