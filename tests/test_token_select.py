"""TokenSelect (minirt/ops/token_select.py, glsl/token_select.comp), greedy decoding's pick of the next token on the
GPU: the kernel against a float64 numpy reference on random logits with poisoned activations (suppressed id bits,
ranges, single ids, ties, rows suppressed but for a range or wholly, the no-speech figures), at fp32 and fp16; the
logit filters as masks (filters.GpuMasks) against the host's filters, log-softmax and argmax for each case of the
timestamp rules, the check going both ways; and the whole decode: generate_batch and greedy on the GPU path give the
host path's tokens on a small random-weights Whisper, and their plans end in the select dispatch."""
import numpy as np
import pytest

from minirt.graph import Graph, Node, Tensor
from minirt.infer import prepare
from minirt.ops import token_select as ts
from minirt.planner import make_plan
from minirt.program import Program
from minirt.session import get_device
from minirt.whisper import filters as F

R, V = 6, 3001          # rows; a vocabulary that is neither a multiple of 32 nor of the work group
BEGIN = 2000            # the timestamps' first id in the cases below
NEG = np.float32(F.NEG)


def select_graph(rows=R, vocab=V):
    g = Graph(name="select", source="select")
    for name, shape, dtype in (("logits", (rows, vocab), "float32"), ("suppress", ((vocab + 31) // 32,), "int32"),
                               ("control", (rows, ts.CONTROL), "int32")):
        g.inputs.append(name)
        g.add_tensor(Tensor(name, shape, dtype))
    g.nodes.append(Node("TokenSelect", "select", ["logits", "suppress", "control"], ["selection"], {}, "minirt"))
    g.tensors["selection"] = Tensor("selection")
    g.outputs = ["selection"]
    return g


@pytest.fixture(scope="module")
def program():
    plans = {p: make_plan(prepare(select_graph()), get_device().profile, "buffer", {"precision": p, "poison": True})
             for p in ("fp32", "fp16")}
    with Program(plans) as prog:
        yield prog


def run(program, logits, bits, control, precision="fp32"):
    c = ts.control(R, V)
    c[:len(control)] = control
    x = np.zeros((R, V), np.float32)
    x[:len(logits)] = logits
    return program.run(precision, {"logits": x, "suppress": bits, "control": c})["selection"][:len(logits)]


def bits_of(bits, vocab=V):
    """The suppressed ids of a suppress input, as booleans [vocab]."""
    return ((bits.view(np.uint32)[np.arange(vocab) // 32] >> (np.arange(vocab) % 32).astype(np.uint32)) & 1) > 0


def random_logits(rows, seed):
    return (4 * np.random.default_rng(seed).standard_normal((rows, V))).astype(np.float32)


def assert_selects(got, logits, bits, control):
    want = ts.select_reference(logits, bits, control)
    assert not np.isnan(got).any()
    assert got[:, 0].tolist() == want[:, 0].tolist()
    np.testing.assert_allclose(got[:, 1:], want[:, 1:], rtol=1e-5, atol=2e-5)


def test_plan_is_one_dispatch_a_row_group(program):
    plan = program.plans["fp32"]
    (d,) = plan.dispatches
    assert d.kernel == "token_select" and d.global_size == (d.local_size[0], R, 1)
    assert d.local_size[0] & (d.local_size[0] - 1) == 0 and d.local_size[0] <= 1024
    assert [d.kernel for d in program.plans["fp16"].dispatches] == ["cast_buffer_down", "token_select_half_out32"]
    assert plan.tensors["selection"].shape == (R, 4) and plan.tensors["selection"].dtype == "float32"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_masks_and_no_speech_against_float64(program, precision):
    x = random_logits(R, 1)
    bits = ts.suppress_bits([0, 31, 32, 1023, 1024, 2047, 3000] + list(range(100, 200)), V)
    c = ts.control(R, V)
    c[1, ts.IDS:ts.IDS + 3] = [int(np.argmax(x[1])), 5, 2999]          # the row's maximum among them
    c[2, ts.RANGES:ts.RANGES + 4] = [0, 1500, 2500, V]                  # two ranges
    c[3, ts.RANGES:ts.RANGES + 4] = [7, 3, 10, 10]                      # empty ranges: nothing
    c[4, ts.NO_SPEECH] = 17
    c[5, ts.NO_SPEECH], c[5, ts.IDS] = int(np.argmax(x[5])), int(np.argmax(x[5]))   # raw figures see it
    if precision == "fp16":     # the graph input is read as float16
        x = x.astype(np.float16).astype(np.float32)
    got = run(program, x, bits, c, precision)
    assert_selects(got, x, bits, c)
    assert got[1, 0] != np.argmax(x[1]) and got[0, 0] == np.argmax(np.where(bits_of(bits), NEG, x[0]))
    # the no-speech figures: softmax of the raw row at the id
    for r in (4, 5):
        p = np.exp(x[r].astype(np.float64) - x[r].max())
        assert np.exp(got[r, 2] - got[r, 3]) == pytest.approx(p[c[r, ts.NO_SPEECH]] / p.sum(), rel=1e-5)
    assert (got[:4, 2:] == 0).all()


def test_ties_go_to_the_lowest_id(program):
    """Equal maxima: in one invocation's ids (i, i + 2 x 1024), in different invocations', across the text /
    timestamp split, and behind a suppressed larger one: the lowest id, as numpy's argmax."""
    x = random_logits(4, 2)
    top = np.float32(30)
    for r, ids in enumerate(([2053, 5, 7, 3000], [1030, 6, 2999], [2100, 1999, 2500], [900, 1200, 1300])):
        x[r, ids] = top
    x[3, 50] = 40                        # suppressed below
    c = ts.control(4, V)
    c[2, ts.BEGIN] = BEGIN
    c[3, ts.IDS] = 50
    got = run(program, x, ts.suppress_bits([], V), c)
    assert got[:, 0].tolist() == [5, 6, 1999, 900]
    assert_selects(got, x, ts.suppress_bits([], V), c)
    # the score of a row of k equal maxima and nothing near: -log(k), to float32 rounding
    y = np.full((1, V), -60, np.float32)
    y[0, [10, 1500, 2800]] = 0
    assert run(program, y, ts.suppress_bits([], V), ts.control(1, V))[0, 1] == pytest.approx(-np.log(3), rel=1e-6)


def test_rows_suppressed_but_for_a_range_and_wholly(program):
    x = random_logits(3, 3)
    c = ts.control(3, V)
    c[0, ts.RANGES:ts.RANGES + 4] = [0, 1400, 1600, V]      # only [1400, 1600) live
    c[1, ts.RANGES:ts.RANGES + 4] = [0, 2000, 2001, V]      # only 2000
    c[2, ts.RANGES:ts.RANGES + 4] = [0, 1000, 1000, V]      # nothing live
    got = run(program, x, ts.suppress_bits([], V), c)
    assert 1400 <= got[0, 0] < 1600 and got[0, 0] == 1400 + np.argmax(x[0, 1400:1600])
    assert got[1, :2].tolist() == [2000, 0.0]               # the only live entry: log-probability 0
    # every entry NEG: as CTranslate2's (and the host's) log-softmax, uniform, id 0
    assert got[2, 0] == 0 and got[2, 1] == pytest.approx(-np.log(V), rel=1e-6)
    assert_selects(got, x, ts.suppress_bits([], V), c)
    # the same through the suppressed-id bits alone
    everything = ts.suppress_bits(range(V), V)
    got = run(program, x[:1], everything, ts.control(1, V))
    assert got[0, 0] == 0 and got[0, 1] == pytest.approx(-np.log(V), rel=1e-6)


# -- the filters as masks against the host's filters ----------------------------------------------------------------
EOT, NO_TS, MAX_INITIAL = 1990, BEGIN - 1, BEGIN + 50     # as Whisper's: special ids between them, suppressed


def host_pick(filters, logits, step, seq):
    x = logits.copy()
    for f in filters:
        f(x, step, seq)
    lp = F.log_softmax(x)
    ids = lp.argmax(-1)
    return ids, lp[np.arange(len(ids)), ids]


# (step, tokens so far): each case of TimestampRules
CASES = {
    "first token": [],
    "a lone first timestamp": [2010],
    "a pair closed": [5, 2010, 2020],
    "text then one timestamp": [2010, 5, 2030],
    "text after a timestamp": [2010, 5],
    "text only": [5, 6],
}


@pytest.mark.parametrize("case", CASES)
def test_timestamp_rules_as_masks_equal_the_filters(program, case):
    """Each case of the timestamp rules, with suppress_tokens and suppress_blank: GpuMasks and the kernel pick the
    host's token with its log-probability. Every row's largest text logit (<|endoftext|>'s, 10) is above every
    timestamp's; on odd rows the timestamps' total probability beats it (about 900 at 8 to 8.5), on even rows not (2
    to 2.5), so where the rules check, odd rows get a timestamp and even rows text: the check both ways."""
    row = CASES[case]
    step = len(row)
    filters = [F.SuppressTokens([3, 4, 1234, 2999] + list(range(EOT + 1, NO_TS))), F.SuppressBlank([220, EOT]),
               F.TimestampRules(EOT, NO_TS, BEGIN, V - 1, MAX_INITIAL)]
    masks = F.GpuMasks.of(filters, V)
    rng = np.random.default_rng(4 + step)
    x = np.minimum(random_logits(R, 4 + step), 9)
    x[:, EOT] = 10
    x[:, BEGIN:] = np.where(np.arange(R)[:, None] % 2, 8, 2) + 0.5 * rng.random((R, V - BEGIN), np.float32)
    seq = np.tile(np.array(row, np.int64), (R, 1)).reshape(R, step)
    control = masks.control(step, seq)
    got = run(program, x, masks.bits, control)
    ids, scores = host_pick(filters, x, step, seq)
    assert got[:, 0].astype(np.int64).tolist() == ids.tolist(), case
    np.testing.assert_allclose(got[:, 1], scores, rtol=1e-5, atol=1e-5)
    assert_selects(got, x, masks.bits, control)
    _, checked = filters[2].rules(step, seq[0])
    assert bool(control[0, ts.CHECK]) == checked
    if checked:
        assert (ids[1::2] >= BEGIN).all() and (ids[0::2] == EOT).all()


def test_what_is_not_a_mask():
    vocab = 100
    assert F.GpuMasks.of([F.SuppressTokens([1]), F.RepetitionPenalty(1.2)], vocab) is None
    assert F.GpuMasks.of([F.NoRepeatNgram(3)], vocab) is None
    assert F.GpuMasks.of([F.SuppressBlank([1, 2, 3, 4]), F.TimestampRules(5, 6, 50, 99, 60)], vocab) is None
    assert F.GpuMasks.of([F.TimestampRules(5, 6, 50, 98, 60)], vocab) is None    # timestamps not the last ids
    m = F.GpuMasks.of([F.SuppressTokens([1, 70]), F.SuppressBlank([2, 3])], vocab)
    assert m.control(1, np.zeros((2, 1), np.int64))[:, ts.IDS].tolist() == [-1, -1]    # blank: step 0 only
    assert m.control(0, np.zeros((2, 0), np.int64))[0, ts.IDS:ts.IDS + 3].tolist() == [2, 3, -1]
    assert np.flatnonzero(bits_of(m.bits, vocab)).tolist() == [1, 70]


def test_bad_inputs_are_named():
    from minirt.errors import ModelError
    g = select_graph()
    g.tensors["control"] = Tensor("control", (R, 8), "int32")
    with pytest.raises(ModelError, match=r"control \[rows, 12\] int32"):
        prepare(g)
    with pytest.raises(ValueError, match="suppressed ids must be in 0..99"):
        ts.suppress_bits([100], 100)


# -- the whole decode ----------------------------------------------------------------------------------------------
from test_whisper_batch import clips, model  # noqa: E402,F401  (the small English Whisper and its clips)


class Calls:
    """Counts a backend's calls of its step methods."""

    def __init__(self, backend, monkeypatch):
        self.n = {}
        for name in ("step", "step_select", "step_rows", "step_rows_select"):
            fn = getattr(backend, name)
            monkeypatch.setattr(backend, name, self.counted(name, fn))

    def counted(self, name, fn):
        def call(*a, **k):
            self.n[name] = self.n.get(name, 0) + 1
            return fn(*a, **k)
        return call


def windows_and_prompts(model):
    from minirt.whisper.decoding import get_prompt
    from minirt.whisper.features import LogMel
    tok = model.tokenizer
    windows = [(lambda m: m.window(0, min(3000, m.content_frames)))(LogMel(c, 80)) for c in clips(4, seed=3)]
    prompts = [get_prompt(tok, list(range(40, 40 + k)), "en", "transcribe", k % 2 == 1) for k in (0, 3, 9, 0)]
    return windows, prompts


def test_decodes_on_the_gpu_path_equal_the_host_path(model, monkeypatch):
    """generate_batch and greedy (generate at temperature 0) with suppress_tokens, suppress_blank and the timestamp
    rules (prompts with and without <|notimestamps|>): on the GPU path no step's logits come back, and the tokens
    are the host path's, the scores and no-speech probabilities to float32 rounding."""
    from minirt.whisper.decoding import TranscriptionOptions, generate, generate_batch
    tok, backend = model.tokenizer, model.batch_backend(4)
    windows, prompts = windows_and_prompts(model)
    options = TranscriptionOptions(beam_size=1, temperatures=[0.0], max_new_tokens=30,
                                   suppress_tokens=list(tok.suppressed_tokens([-1])))
    calls = Calls(backend, monkeypatch)
    results = {}
    for gpu in (True, False):
        monkeypatch.setattr(backend, "gpu_select", gpu)
        backend.encode_batch(np.stack(windows))
        batch = generate_batch(backend, tok, prompts, options, model.suppress_blank_ids)
        alone = []
        for w, p in zip(windows, prompts):
            backend.encode(w)
            alone.append(generate(backend, tok, p, options, 0.0, model.suppress_blank_ids))
        results[gpu], calls.n = (batch, alone, dict(calls.n)), {}
    assert set(results[True][2]) == {"step_select", "step_rows_select"}
    assert set(results[False][2]) == {"step", "step_rows"}
    for got, want in zip(results[True][:2], results[False][:2]):
        for (hyp, nsp), (h0, nsp0) in zip(got, want):
            assert hyp.tokens == h0.tokens and hyp.score == pytest.approx(h0.score, rel=1e-5, abs=1e-6)
            assert nsp == pytest.approx(nsp0, rel=1e-5, abs=1e-7)
    assert len({len(h.tokens) for h, _ in results[True][0]}) > 1           # rows ended at different steps
    assert any(t >= tok.timestamp_begin for h, _ in results[True][0] for t in h.tokens)    # timestamps decoded


def test_filters_that_need_the_row_keep_the_host_path(model, monkeypatch):
    from minirt.whisper.decoding import TranscriptionOptions, generate_batch
    tok, backend = model.tokenizer, model.batch_backend(4)
    windows, prompts = windows_and_prompts(model)
    options = TranscriptionOptions(beam_size=1, temperatures=[0.0], max_new_tokens=8, repetition_penalty=1.5)
    calls = Calls(backend, monkeypatch)
    backend.encode_batch(np.stack(windows[:2]))
    generate_batch(backend, tok, prompts[:2], options, model.suppress_blank_ids)
    assert backend.gpu_select and set(calls.n) == {"step_rows"}


def test_select_entry_points_end_in_the_select_dispatch(model):
    """bstepN_select and step1_select: the step's dispatches (the same kernels as bstepN's and step1's), then
    TokenSelect over the logits, which stay an intermediate; the selection is the only output."""
    backend = model.batch_backend(4)
    for entry in ("step1", "bstep1", "bstep2", "bstep4"):
        step, sel = backend.plans[entry], backend.plans[f"{entry}_select"]
        rows = step.tensors["tokens"].shape[0]
        assert sel.outputs == ["selection"] and sel.tensors["selection"].shape == (rows, 4)
        assert sel.inputs == ["tokens", "suppress", "select"]
        assert {sel.tensors[k].dtype for k in sel.inputs} == {"int32"}
        assert sel.tensors["logits"].role == "intermediate"
        assert [d.kernel for d in sel.dispatches] == [d.kernel for d in step.dispatches] + ["token_select"]
        last = sel.dispatches[-1]
        assert last.op == "TokenSelect" and last.args[0] == ("selection", "w") and last.args[1] == ("logits", "r")


def test_select_errors_name_what_is_at_fault(model):
    from minirt.errors import InputError
    backend = model.batch_backend(4)
    vocab = backend.n_vocab
    bits = ts.suppress_bits([], vocab)
    backend.encode_batch(np.zeros((2, 80, 3000), np.float32))
    backend.start_rows([0, 1])
    with pytest.raises(ValueError, match=r"control must be \[2, 12\] for 2 rows, got \[3, 12\]"):
        backend.step_rows_select(np.array([1, 2]), bits, ts.control(3, vocab))
    with pytest.raises(InputError, match=r"input 'suppress' expects shape \[56\], got \[55\]"):
        backend.step_rows_select(np.array([1, 2]), bits[:-1], ts.control(2, vocab))
    backend.encode(np.zeros((80, 3000), np.float32))
    backend.start([1, 2], [1])
    backend.reorder(np.array([0, 0]))
    with pytest.raises(ValueError, match="step_select.. takes one token for a batch of 1, got 2 for 2"):
        backend.step_select(np.array([1, 2]), bits, ts.control(2, vocab))
