"""Constants beyond one binding's range (minirt/planner/split_wide_tables.py): a Linear's weight and a run-time
Gather's table split by columns into parts within maxStorageBufferRange, checked on the Plan and run on lavapipe
against numpy; a chunk's CacheWrite along the batch axis; and a large-v3-shaped Whisper (one layer each side: its token
embedding and vocabulary projection are 253 MiB at fp32, beyond lavapipe's 128 MiB) whose logits equal the numpy
reference's, and whose program and batch plan on the Adreno and Mali profiles."""
import dataclasses

import numpy as np
import pytest

from minirt.session import get_device
from test_state import graph


def _plan(g, limit=None, **options):
    from minirt.infer import prepare
    from minirt.planner import make_plan
    p = get_device().profile
    if limit:
        p = dataclasses.replace(p, max_storage_buffer_range=limit)
    return make_plan(prepare(g), p, "buffer", {"precision": "fp32", **options})


def _run(plan, feeds, params=None):
    from minirt.program import Program
    with Program({"run": plan}) as prog:
        return {k: np.array(v) for k, v in prog.run("run", feeds, params).items()}


def test_a_wide_linear_and_gather_split_by_columns():
    """A Linear of 600 output columns (bias, GELU, residual) and an embedding of 200 rows of 40 on a range of 16 KiB:
    the plan holds parts within it (no tensor beyond), says so in its notes, and computes what numpy does."""
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((16, 600), np.float32) / 4, rng.standard_normal(600, np.float32)
    table = rng.standard_normal((200, 40), np.float32)
    g = graph("wide", [("x", (2, 3, 16), "float32"), ("r", (2, 3, 600), "float32"), ("ids", (2, 3), "int32")],
              ["y", "e"], None, (),
              [("Linear", ["x", "w", "b", "r"], ["y"], {"act": "gelu", "scale": 1.0}),
               ("Gather", ["table", "ids"], ["e"], {"axis": 0})], {"w": w, "b": b, "table": table})
    g.nodes[0].domain = "minirt"
    limit = 16 << 10
    plan = _plan(g, limit, poison=True)
    assert max(t.nbytes for t in plan.tensors.values() if t.storage == "buffer") <= limit
    assert "w" not in plan.tensors and "table" not in plan.tensors
    linear, gather = " ".join(plan.notes["Linear_0"]), " ".join(plan.notes["Gather_1"])
    assert "split into 5 Linears of 128, 128, 128, 128, 88 output columns" in linear and "residual added" in linear
    assert "split into 2 Gathers of 20, 20 columns" in gather
    assert [d.op for d in plan.dispatches].count("Concat") == 3     # 5 parts: two dispatches
    x, r = rng.standard_normal((2, 3, 16), np.float32), rng.standard_normal((2, 3, 600), np.float32)
    ids = rng.integers(0, 200, (2, 3)).astype(np.int32)
    out = _run(plan, {"x": x, "r": r, "ids": ids})
    from math import erf
    h = x.astype(np.float64) @ w + b
    want = 0.5 * h * (1 + np.vectorize(erf)(h / np.sqrt(2))) + r
    assert np.abs(out["y"] - want).max() <= 1e-4 * np.abs(want).max()
    assert np.array_equal(out["e"], table[ids])
    # within the range: the same graph plans as it did without the pass
    whole = _plan(g)
    assert "w@packed" in whole.tensors and not any("split" in n for v in whole.notes.values() for n in v)


def test_cache_write_along_the_batch_axis():
    """CacheWrite axis 0: a chunk's items at the batch's items from param / T on; items past the cache are dropped."""
    rng = np.random.default_rng(4)
    T, D = 5, 8
    cache = {"cache": ((4, T, D), "cache@new")}
    write = graph("write", [("x", (3, T, D), "float32")], (), cache, ["row0"],
                  [("CacheWrite", ["cache", "x"], ["cache@new"], {"param": "row0", "axis": 0})])
    read = graph("read", [], ["y"], {"cache": ((4, T, D), "cache")}, (), [("Identity", ["cache"], ["y"], {})])
    from minirt.program import Program
    with Program({"write": _plan(write), "read": _plan(read)}) as prog:
        a, c = rng.standard_normal((3, T, D), np.float32), rng.standard_normal((3, T, D), np.float32)
        prog.run("write", {"x": a}, {"row0": 0})
        prog.run("write", {"x": c}, {"row0": 3 * T})      # items 3, 4, 5: only 3 is in the cache
        y = prog.run("read")["y"]
    assert np.array_equal(y[:3], a) and np.array_equal(y[3], c[0])


# -- a large-v3-shaped Whisper --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def large_v3():
    from minirt.whisper.synthetic import SIZES, random_checkpoint
    return random_checkpoint(dict(SIZES["large-v3"], encoder_layers=1, decoder_layers=1), 0)


@pytest.mark.slow
def test_large_v3_logits_on_lavapipe_equal_the_reference(large_v3):
    """The cross and step1 entry points of a large-v3-shaped Whisper on the device (lavapipe: 128 MiB ranges, so the
    embedding and the projection are split at fp32), from a random encoder output (of 24 positions: what is split
    is the decoder's vocabulary): each step's logits against the numpy reference's, within the decoder tests'
    tolerance."""
    from minirt.program import Program
    from minirt.whisper import decoder_graph
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import _plans
    w, cfg = large_v3
    positions = "model.encoder.embed_positions.weight"
    w = dict(w, **{positions: w[positions][:24]})
    dm = decoder_graph.dims_of(w, cfg)
    profile = get_device().profile
    graphs = {"cross": decoder_graph.cross_graph(w, dm), "step1": decoder_graph.step_graph(w, dm, 1)}
    plans = _plans(graphs, profile, {"poison": True})
    if profile.max_storage_buffer_range < 253 << 20:
        assert "split into 2" in " ".join(plans["step1"].notes["logits"])
    hidden = np.random.default_rng(5).standard_normal((dm.n_audio_ctx, dm.d_model)).astype(np.float32)
    ref = ReferenceBackend(w, cfg)
    ref.set_encoder_output(hidden)
    tokens = [50258, 50360, 51865, 440]
    want = [ref.start(tokens[:1], [0])[0]] + [ref.step(np.array([t]))[0] for t in tokens[1:]]
    with Program(plans) as prog:
        prog.run("cross", {"encoder_output": hidden[None]})
        got = [np.array(prog.run("step1", {"tokens": np.array([[t]], np.int32)}, {"pos": i})["logits"][0, 0])
               for i, t in enumerate(tokens)]
    for a, b in zip(got, want):
        assert a.shape == (51866,) and np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


@pytest.mark.slow
def test_large_v3_plans_on_phone_profiles(large_v3):
    """On the Adreno and Mali profiles (128 MiB ranges): the step's embedding and projection split at fp32 (253 MiB)
    and whole at fp16 (127 MiB); a batch of 16 has its encoder in chunks; no tensor passes the range."""
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.whisper import decoder_graph
    from minirt.whisper.vulkan import _plans, fit_batch
    w, cfg = large_v3
    dm = decoder_graph.dims_of(w, cfg)
    graphs = {"encode": decoder_graph.encoder_graph(w, dm), "step1": decoder_graph.step_graph(w, dm, 1)}
    for name, precision in (("adreno-840", "fp32"), ("adreno-840", "fp16"), ("mali-g715", "fp32")):
        profile = KNOWN_PROFILES[name]
        plans = _plans(graphs, profile, {"precision": precision})
        items, chunk, notes = fit_batch(dm, profile, 16, plans, precision)
        plans.update(_plans({"bencode": decoder_graph.encoder_graph(w, dm, chunk, "b", items)}, profile,
                            {"precision": precision}))
        for plan in plans.values():
            assert max(t.nbytes for t in plan.tensors.values() if t.storage == "buffer") <= \
                profile.max_storage_buffer_range
        split = " ".join(plans["step1"].notes.get("logits", []) + plans["step1"].notes.get("embed", []))
        assert (split.count("split into 2") == 2) == (precision == "fp32")
        assert items == 16 and 1 <= chunk < 16 and "maxStorageBufferRange" in notes[-1]
        assert plans["bencode"].tensors["input_features"].shape[0] == chunk
