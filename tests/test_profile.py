"""Timestamp profiling: one record per planned dispatch, positive times that fit in the wall time."""
import json
import time

import numpy as np
import pytest
from onnx import helper

from minirt import MinirtError, Session
from minirt import dispatch_timing as prof
from oracle import make_model, rand


def _model():
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("Tanh", ["a"], ["b"]),
             helper.make_node("Add", ["b", "x"], ["c"]), helper.make_node("Sigmoid", ["c"], ["y"])]
    return make_model(nodes, {"x": (96, 130)}, ["y"])


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_records_match_dispatches(storage):
    x = rand(96, 130)
    with Session(_model(), storage=storage, profile=True) as s:
        t0 = time.perf_counter()
        y = s.run(x)
        wall_ms = (time.perf_counter() - t0) * 1e3
        recs = s.profile_records()
        plan = s.plan
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-(np.tanh(x * x) + x))), rtol=1e-5, atol=1e-6)
    assert len(recs) == len(plan.dispatches)
    for r, d in zip(recs, plan.dispatches):
        assert (r.node, r.kernel, r.global_size, r.local_size) == (d.node, d.kernel, d.global_size, d.local_size)
        assert r.gpu_ms > 0
    assert sum(r.gpu_ms for r in recs) <= wall_ms


def test_profile_report_and_trace(tmp_path):
    with Session(_model(), profile=True) as s:
        res = prof.profile_session(s, rand(96, 130), runs=3, warmup=1)
    text = prof.format_report(res)
    assert "by kernel" in text and "by op" in text and "Tanh" in text
    trace = json.loads(prof.to_trace(res))
    assert len([e for e in trace["traceEvents"] if e["ph"] == "X"]) == len(res.records)
    data = json.loads(prof.to_json(res))
    assert len(data["dispatches"]) == len(res.records)
    assert prof.to_csv(res).count("\n") == len(res.records) + 1


def test_many_dispatches_span_several_query_pools(monkeypatch):
    import minirt.vk.recorder as recorder
    monkeypatch.setattr(recorder, "QUERIES_PER_POOL", 4)
    with Session(_model(), profile=True) as s:
        s.run(rand(96, 130))
        assert len(next(iter(s._execs.values())).query_pools) == 2
        assert all(r.gpu_ms > 0 for r in s.profile_records())


def test_zero_timestamp_period_warns_instead_of_lying(capsys):
    import dataclasses
    with Session(_model(), profile=True) as s:
        s.run(rand(96, 130))
        s.device.profile, real = dataclasses.replace(s.device.profile, timestamp_period=0.0), s.device.profile
        try:
            recs = s.profile_records()
        finally:
            s.device.profile = real
    assert all(r.gpu_ms is None for r in recs)
    assert "no usable timestamps" in capsys.readouterr().err


def test_profiling_off_costs_nothing_and_says_so():
    with Session(_model()) as s:
        s.run(rand(96, 130))
        assert not hasattr(next(iter(s._execs.values())), "query_pools")
        with pytest.raises(MinirtError, match="profile=True"):
            s.profile_records()


def test_cli_profile(tmp_path):
    from click.testing import CliRunner
    from minirt.cli import main
    import onnx
    p = tmp_path / "m.onnx"
    onnx.save(_model(), p)
    r = CliRunner().invoke(main, ["profile", str(p), "--runs", "2", "--warmup", "1",
                                  "--trace", str(tmp_path / "t.json"), "--csv", str(tmp_path / "t.csv")])
    assert r.exit_code == 0, r.output
    assert "GPU time" in r.output
    assert len(json.loads((tmp_path / "t.json").read_text())["traceEvents"]) == 4


def test_span_times_the_whole_run_with_two_stamps():
    """profile="span": two queries (before the first dispatch, after the last); the span covers every dispatch, so it
    is at least the longest one a per-dispatch Session measures on the same input, and it fits in the wall time."""
    x = rand(96, 130)
    with Session(_model(), profile="span") as s:
        t0 = time.perf_counter()
        y = s.run(x)
        wall_ms = (time.perf_counter() - t0) * 1e3
        ex = next(iter(s._execs.values()))
        assert [n for _, n in ex.query_pools] == [2]
        span = s.gpu_span_ms()
        with pytest.raises(MinirtError, match="gpu_span_ms"):
            s.profile_records()
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-(np.tanh(x * x) + x))), rtol=1e-5, atol=1e-6)
    with Session(_model(), profile=True) as s:
        s.run(x)
        longest = max(r.gpu_ms for r in s.profile_records())
        with pytest.raises(MinirtError, match="profile='span'"):
            s.gpu_span_ms()
    assert 0 < span <= wall_ms
    assert span >= 0.5 * longest     # (another Session's run: the same work, not the same clock state)


def test_profile_argument_is_checked():
    with pytest.raises(MinirtError, match="profile must be"):
        Session(_model(), profile="yes")
