"""glsl/linear_rows.comp past 8 rows (a batched decoder step: one token a clip), where option rows_max (or the device
table's rows_max) sends Linears of up to 32 rows: the kernel then keeps only its accumulators in registers (one vec4
column a lane by default), loads each row's activations just before its FMAs, keeps a fused LayerNorm's statistics in
shared memory and scales 4-bit weights as it loads them. Against a float64 numpy reference (poisoned outputs, fresh
random inputs): 9, 16, 17 and 32 rows, float, int8 and 4-bit weights, fp32 and fp16, K split across groups, several
columns a lane, the fused LayerNorm; the planning rule (the option routes 16 rows there, the default does not; 32 at
most)."""
from math import erf, sqrt

import numpy as np
import pytest

from minirt import Session
from minirt.device_profile import KNOWN_PROFILES, Tuning
from minirt.errors import MinirtError
from minirt.kernels.gemm import ROWS_LIMIT, ROWS_VEC4_BYTES, rows_shape
from minirt.options import Options
from oracle import compare, linear_model

ROWS = [9, 16, 17, 32]


def fp16_ok():
    from minirt.session import get_device
    return get_device().profile.storage16


def float_case(m, k, n, act, residual, seed):
    """(model, feeds, float64 reference) of x @ w + b (-> Gelu) (+ r)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    model, inputs = linear_model(m, w, b, act, residual)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}
    y = feeds["x"].astype(np.float64) @ w + b
    if act:
        y = 0.5 * y * (1 + np.vectorize(erf)(y / sqrt(2)))
    return model, feeds, y + feeds["r"] if residual else y


def run(model, feeds, precision, opts):
    with Session(model, storage="buffer", options={"poison": True, "precision": precision, **opts}) as s:
        rows = [d for d in s.plan.dispatches if d.kernel.startswith("linear_rows")]
        got = s.run(None, feeds)[0]
        again = s.run(None, feeds)[0]
    assert got.tobytes() == again.tobytes()
    return rows, got


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("splits", [1, 3])
def test_float(precision, m, splits):
    """75 columns (19 vec4: no whole group of them), 33 vec4 rows of K (11 a split: runs and unrolled steps end
    short); GELU and a residual where m is odd."""
    if precision == "fp16" and not fp16_ok():
        pytest.skip("no 16-bit storage buffers")
    model, feeds, ref = float_case(m, 132, 75, m % 2 == 1, m % 2 == 1, seed=m + splits)
    opts = {"rows_max": 32, **({"gemm_splitk": splits} if splits > 1 else {})}
    (d,), got = run(model, feeds, precision, opts)
    assert d.info["rows"] == m and d.info["cv"] == 1 and d.info["splits"] == splits
    compare(got, ref, 1e-5 if precision == "fp32" else 4e-3, f"{m} rows {precision} {splits} splits")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("m,opts", [(9, {}), (16, {"gemm_splitk": 2}), (17, {"rows_columns": 2}),
                                    (32, {"rows_columns": 4, "local_size": (3, 5, 1)})])
def test_int8(precision, m, opts):
    """int8 weights with zero points (the sums of (q - zero), scaled once an output); 208 columns (52 vec4: 16-byte
    loads of 4 columns where a lane has them)."""
    from test_int8_linear import qdq_linear, reference
    if precision == "fp16" and not fp16_ok():
        pytest.skip("no 16-bit storage buffers")
    model, feeds, w, b = qdq_linear(m, 132, 208, seed=40 + m, zero=True, act=True, residual=True)
    (d,), got = run(model, feeds, precision, {"rows_max": 32, **opts})
    assert "_i8" in d.kernel and d.info["cv"] == opts.get("rows_columns", 1)
    compare(got, reference(feeds, w, b, True, True), 1e-5 if precision == "fp32" else 4e-3, f"int8 {m} rows {opts}")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("m,k,block,opts", [
    (9, 260, 32, {"gemm_splitk": 3}),             # splits start and end inside blocks
    (16, 80, 32, {}),                             # a short last block
    (17, 260, 16, {"rows_columns": 4, "local_size": (3, 5, 1), "n": 208}),  # 8-byte loads of 4 columns
    (32, 132, 64, {"gemm_splitk": 2}),            # one block and a short one, split between them
])
def test_q4(precision, m, k, block, opts):
    """4-bit weights with packed zero points, scaled as they are loaded past 8 rows."""
    from test_matmul_nbits import nbits_model
    if precision == "fp16" and not fp16_ok():
        pytest.skip("no 16-bit storage buffers")
    opts = dict(opts)
    n = opts.pop("n", 75)
    model, feeds, w, b = nbits_model(m, k, n, block, seed=60 + m, zero="packed", bias=True)
    (d,), got = run(model, feeds, precision, {"rows_max": 32, **opts})
    assert "_q4" in d.kernel and d.info["splits"] == opts.get("gemm_splitk", 1)
    compare(got, feeds["A"].astype(np.float64) @ w + b, 1e-5 if precision == "fp32" else 4e-3, f"q4 {m} rows {opts}")


@pytest.mark.parametrize("m,opts", [(9, {}), (17, {"gemm_splitk": 2}), (32, {"local_size": (3, 5, 1)})])
def test_fused_layer_norm(m, opts):
    """A LayerNorm folded into the Linear (fuse_norm_linear_rows): its statistics, four rows a pass, in shared memory;
    rows far from zero (the pivot matters); 15 invocations (the statistics' tree over no power of two)."""
    from test_fuse_norm_linear_rows import norm_linear
    model, feeds = norm_linear(m, 260, 75, act=True, residual=True, seed=80 + m)
    feeds["x"] = feeds["x"] + 100.0
    x = feeds["x"][0].astype(np.float64)
    init = {t.name: t for t in model.graph.initializer}
    from onnx import numpy_helper
    g, beta, w, b = (numpy_helper.to_array(init[k]).astype(np.float64) for k in ("gamma", "beta", "w", "b"))
    h = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5) * g + beta
    y = h @ w + b
    ref = 0.5 * y * (1 + np.vectorize(erf)(y / sqrt(2))) + feeds["r"][0]
    with Session(model, storage="buffer", options={"poison": True, "rows_max": 32, **opts}) as s:
        split = ["linear_reduce"] if "gemm_splitk" in opts else []
        assert [d.kernel for d in s.plan.dispatches] == ["linear_rows"] + split
        got = s.run(None, feeds)[0]
    compare(got[0], ref, 1e-4, f"fused LayerNorm, {m} rows {opts}")


def test_routing():
    """The device table's default (8) keeps 16 rows on the tiled GEMM; option rows_max=16 sends them to linear_rows
    (a plan note says so) and 17 rows back; past ROWS_LIMIT the option is refused."""
    from minirt.session import get_device
    assert Tuning().rows_max == 8 and get_device().profile.tuning.rows_max == 8
    model, feeds, ref = float_case(16, 64, 40, False, False, seed=5)
    for opts, rows in (({}, False), ({"rows_max": 16}, True), ({"rows_max": 15}, False)):
        with Session(model, storage="buffer", options={"poison": True, **opts}) as s:
            kernels = [d.kernel for d in s.plan.dispatches]
            assert ("linear_rows" in kernels) == rows, (opts, kernels)
            if rows:
                assert any("16 rows on the few-row kernel (rows_max 16)" in t for t in sum(s.plan.notes.values(), []))
            compare(s.run(None, feeds)[0], ref, 1e-5, f"{opts}")
    assert ROWS_LIMIT == 32 and Options.make({"rows_max": 32}).rows_max == 32
    with pytest.raises((MinirtError, ValueError)):
        Options.make({"rows_max": 33})


def test_layout_rule_past_eight_rows():
    """rows_shape on the H200's entry: one vec4 column a lane past 8 rows whatever the weight type (the accumulators:
    ROWS vec4), two up to 8 (fp16), four at one row of int8; rows_columns still forces it."""
    p, o = KNOWN_PROFILES["nvidia-h200"], Options.make({})

    def cv(m, w, options=o):
        return rows_shape(p, options, m, 320, 320, ROWS_VEC4_BYTES[w], False)["cv"]

    assert [cv(m, "half") for m in (1, 8, 9, 16, 32)] == [2, 2, 1, 1, 1]
    assert [cv(m, "i8") for m in (1, 5, 9, 32)] == [4, 2, 1, 1] and cv(32, "q4") == 1
    assert cv(16, "half", Options.make({"rows_columns": 2})) == 2
