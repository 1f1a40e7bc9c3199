"""tools/bench.py's per-GEMM view: the profiled dispatches of a real (small) Whisper plan grouped by role, checked
against the architecture: one GEMM a role a layer, the shape each role implies matching the FLOPs the planner counted
for that dispatch, every K-split reduce pass given to its GEMM, and the front end's FLOPs those of its two convolutions."""
import sys
from pathlib import Path

import numpy as np
import pytest

from minirt import Session

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import whisper_encoder as we  # noqa: E402

sys.path.append(str(ROOT / "tools"))   # last, so nothing in tools/ can shadow an installed module
import bench  # noqa: E402


@pytest.mark.parametrize("options", [{}, {"gemm_splitk": 2}], ids=["default", "split2"])
def test_gemm_figures_group_a_profiled_whisper_run(options):
    layers, frames, d = 2, 200, 384
    model = we.build_whisper_encoder("tiny", layers=layers, n_frames=frames, seed=4)
    x = we.sample_input(n_frames=frames, seed=np.random.SeedSequence().entropy % 2**31)
    with Session(model, storage="buffer", profile=True, options=options) as s:
        s.run(x)
        recs = s.profile_records()
    disp = [{"node": r.node, "kernel": r.kernel, "flops": r.flops, "gpu_us": (r.gpu_ms or 0) * 1e3} for r in recs]
    roles, front = bench.gemm_figures(disp, d, frames=frames // 2)
    assert set(roles) == {"QKV", "out-projection", "fc1 (+GELU)", "fc2 (+residual)"}
    for role, e in roles.items():
        m, k, n = e["shape"]
        assert len(e["gemm_us"]) == len(e["reduce_us"]) == layers, role
        assert e["flops"] == [2 * m * k * n] * layers, role
        assert all(t > 0 for t in e["gemm_us"]), role
    # every reduce pass outside the front end belongs to the GEMM before it
    reduces = [r for r in disp if r["kernel"].startswith("linear_reduce") and "/conv" not in r["node"]]
    given = sum(v > 0 for e in roles.values() for v in e["reduce_us"])
    assert given == len(reduces)
    if options:
        assert reduces, "gemm_splitk=2 split no GEMM"
    # conv1: positions x (mels x 3) x d; conv2 (stride 2): positions / 2 x (3 d) x d
    assert front["gflop"] * 1e9 == pytest.approx(2 * frames * 80 * 3 * d + 2 * (frames // 2) * 3 * d * d)
    assert front["us"] > 0


def test_output_modes_and_the_batch_table(capsys):
    """bench.output_modes times a Session's runs with the results dropped, kept and written into one out= array (all
    three positive, from rounds of runs); print_batches gives ms a batch item and the ratios."""
    from onnx import helper
    from oracle import make_model, rand
    m = make_model([helper.make_node("Tanh", ["x"], ["y"])], {"x": [4, 64]}, ["y"])
    with Session(m, storage="buffer") as s:
        modes = bench.output_modes(s, rand(4, 64), runs=3, warmup=1)
    assert set(modes) == {"dropped", "kept", "out"} and all(med >= mn > 0 for med, mn in modes.values())
    res = {1: {"wall_ms": 2.0, "kept_wall_ms": 2.2, "out_wall_ms": 2.1, "gpu_span_ms": 1.5},
           8: {"wall_ms": 16.0, "kept_wall_ms": 16.0, "out_wall_ms": 16.4, "gpu_span_ms": None,
               "torch_eager_wall_ms": 40.0, "torch_graph_wall_ms": 8.0}}
    bench.print_batches("tiny", "fp32", res, 64)
    rows = capsys.readouterr().out.strip().splitlines()[-2:]
    assert rows[0].split() == ["1", "2.000", "2.200", "1.10x", "2.100", "1.500", "-", "-", "-"]
    assert rows[1].split() == ["8", "2.000", "2.000", "1.00x", "2.050", "-", "5.000", "1.000", "2.00x"]
