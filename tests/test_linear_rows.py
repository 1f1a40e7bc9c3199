"""glsl/linear_rows.comp: Linears of at most ROWS_MAX rows (a decoder step) split K across a group's invocations.
Against onnxruntime (poisoned outputs): rows 1..8, widths that are and are not multiples of 4, with the bias, GELU
and a residual; the plan routes them there and a ninth row back to the tiled GEMM; two runs give the same bits."""
import pytest

from minirt import Session
from minirt.kernels.gemm import ROWS_MAX
from oracle import compare, linear_case, onnxruntime_run


def kernels(s):
    return [d.kernel for d in s.plan.dispatches]


@pytest.mark.parametrize("m,n,k,act,residual", [
    (1, 37, 132, False, False),       # N not a multiple of 4, one row
    (5, 515, 260, True, True),        # the beams of a step: GELU and the residual in the epilogue
    (8, 64, 1540, False, True),       # the most rows; K longer than one pass of the k-lanes
    (3, 1, 4, True, False),           # one column, one vec4 of K
])
def test_linear_rows_matches_onnxruntime(m, n, k, act, residual):
    model, feeds = linear_case(m, n, k, act, residual, seed=m + n)
    ref = onnxruntime_run(model, feeds)[0]
    with Session(model, storage="buffer", options={"poison": True}) as s:
        assert "linear_rows" in kernels(s) and not any(x.startswith("linear_t") for x in kernels(s))
        got = s.run(None, feeds)[0]
        again = s.run(None, feeds)[0]
    compare(got, ref, 1e-5, "linear_rows")
    assert got.tobytes() == again.tobytes()


@pytest.mark.parametrize("local", [(2, 128, 1), (1, 4, 1), (8, 32, 1)])
def test_group_shapes(local):
    """Group shapes forced through the local_size option (the default 8 x 32, a wide one of 2 x 128, a small one):
    the same values whatever the shape."""
    model, feeds = linear_case(5, 515, 260, True, True, seed=3)
    with Session(model, storage="buffer", options={"poison": True, "local_size": local}) as s:
        assert [d.local_size for d in s.plan.dispatches if d.kernel == "linear_rows"] == [local]
        compare(s.run(None, feeds)[0], onnxruntime_run(model, feeds)[0], 1e-5, f"local {local}")


def test_more_rows_take_the_tiled_gemm():
    model, feeds = linear_case(ROWS_MAX + 1, 40, 64, False, False)
    with Session(model, storage="buffer", options={"poison": True}) as s:
        assert "linear_rows" not in kernels(s)
        compare(s.run(None, feeds)[0], onnxruntime_run(model, feeds)[0], 1e-5)


@pytest.mark.parametrize("t", [1, 3])
def test_merged_siblings_few_rows(t):
    """Sibling projections merged into one Linear (merge_siblings) with a part-major output: a decoder step's q, k,
    v. The rows kernel writes the parts where the views expect them."""
    from oracle import check_model
    from test_merge_siblings import qkv_feeds, qkv_model
    model, feeds = qkv_model(t=t), qkv_feeds(t=t)
    with Session(model, storage="buffer") as s:
        assert [d.kernel for d in s.plan.dispatches if d.op == "Linear"] == ["linear_rows"]
    check_model(model, feeds, storages=("buffer",), tol=1e-5)
