"""glsl/linear_rows.comp: Linears of at most 8 rows (a decoder step; the device table's default rows_max, past which
tests/test_linear_rows_many.py goes) split K across a group's invocations (and across groups: gemm_splitk). Against
onnxruntime (poisoned outputs): rows 1..8, widths that are and are not multiples of 4 or of a group's columns, K whose
vec4 rows are odd (the splits, k runs and unrolled steps end short), 1, 2 and 4 vec4 columns a lane, with the bias,
GELU and a residual; fp16, its 16-byte loads; the plan routes them there and a ninth row back to the tiled GEMM; two
runs give the same bits. The layout rule (rows_shape) on the H200's table entry."""
import pytest

from minirt import Session
from minirt.kernels.gemm import ROWS_VEC4_BYTES, rows_shape
from oracle import compare, linear_case, onnxruntime_run

ROWS_MAX = 8        # the device table's default rows_max (lavapipe's)


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


@pytest.mark.parametrize("m", range(1, ROWS_MAX + 1))
def test_k_split_across_groups(m):
    """K split 3 ways across work groups (what the planner picks on a big GPU where few column groups read a long K):
    fp32 partials, then linear_reduce adds them in split order with the bias, GELU and residual. 75 columns (19 vec4:
    no whole group of them) and 33 vec4 rows of K (11 a split: every run and unrolled step can end short)."""
    model, feeds = linear_case(m, 75, 132, m % 2 == 1, True, seed=10 + m)
    with Session(model, storage="buffer", options={"poison": True, "gemm_splitk": 3}) as s:
        assert kernels(s) == ["linear_rows", "linear_reduce"]
        (d,) = [d for d in s.plan.dispatches if d.kernel == "linear_rows"]
        assert d.global_size[2] == 3 and d.info["splits"] == 3 and d.info["ks"] == 11
        got = s.run(None, feeds)[0]
        again = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5, f"{m} rows, K split 3 ways")
    assert got.tobytes() == again.tobytes()


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("cv,local", [(1, (3, 5, 1)), (2, (8, 4, 1)), (4, (4, 16, 1)), (4, (1, 1, 1))])
def test_columns_a_lane(m, cv, local):
    """1, 2 or 4 vec4 columns a lane (rows_columns) in groups of several shapes (one invocation; 3 x 5: neither a
    power of two), 19 vec4 columns and 65 vec4 rows of K, against onnxruntime."""
    model, feeds = linear_case(m, 75, 260, True, m > 2, seed=20 + m)
    with Session(model, storage="buffer", options={"poison": True, "rows_columns": cv, "local_size": local}) as s:
        (d,) = s.plan.dispatches
        assert d.kernel == "linear_rows" and d.info["cv"] == cv and d.local_size == local
        assert d.global_size[0] == -(-19 // (local[0] * cv)) * local[0]
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5, f"{m} rows, {cv} vec4 columns a lane, group {local}")


@pytest.mark.parametrize("m,splits", [(1, 1), (5, 3)])
def test_fp16(m, splits):
    from minirt.session import get_device
    if not get_device().profile.storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    model, feeds = linear_case(m, 75, 260, True, True, seed=30 + m)
    opts = {"poison": True, "gemm_splitk": splits}
    with Session(model, storage="buffer", precision="fp16", options=opts) as s:
        assert [d.kernel for d in s.plan.dispatches if d.op == "Linear"][0] == "linear_rows_half"
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 4e-3, f"fp16, {m} rows, {splits} splits")


@pytest.mark.parametrize("m,opts", [(1, {}), (3, {"gemm_splitk": 2}), (4, {"rows_columns": 4, "local_size": (3, 5, 1)}),
                                     (8, {}), (2, {"rows_vec": False})])
def test_vector_loads_fp16(m, opts):
    """fp16 weights read 16 bytes (2 vec4 column groups) a load where N4 is even: 52 vec4 columns (no whole group of
    them: the last lanes' loads stay in the row), against onnxruntime; and the same with rows_vec off."""
    from minirt.session import get_device
    if not get_device().profile.storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    model, feeds = linear_case(m, 208, 260, True, True, seed=70 + m)
    with Session(model, storage="buffer", precision="fp16", options={"poison": True, **opts}) as s:
        (d,) = [d for d in s.plan.dispatches if d.kernel == "linear_rows_half"]
        assert d.info["vec"] == opts.get("rows_vec", True)
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 4e-3, f"fp16, {m} rows, {opts}")


def test_layout_rule_on_a_big_gpu():
    """rows_shape on the H200's table entry (132 multiprocessors, as an H100) for a Whisper-large decoder step: 16
    bytes a lane's load (2 vec4 columns of fp16, 4 of int8; at most 2 past 4 rows; vector loads where N4 is a multiple
    of those); 4 lanes along N where 8 would make fewer column groups than multiprocessors; K split where the column
    groups are still fewer and each would read more than 256 KiB (fc2: 5120 deep into 1280 columns), not for the
    logits (811 column groups) nor a part-major output; about 1024 lanes a multiprocessor or more."""
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.options import Options
    p, o = KNOWN_PROFILES["nvidia-h200"], Options.make({})

    def shape(m, k, n, w="half", part_major=False, options=o):
        return rows_shape(p, options, m, -(-n // 4), k // 4, ROWS_VEC4_BYTES[w], part_major)

    assert shape(1, 1280, 1280)["cv"] == 2 and shape(1, 1280, 1280, "i8")["cv"] == 4
    assert shape(1, 1280, 1280)["vec"] and shape(1, 1280, 1280, "i8")["vec"] and shape(1, 1280, 1280, "q4")["vec"]
    assert not shape(1, 1280, 51866)["vec"] and shape(5, 1280, 1280, "i8")["vec"]   # 12967 vec4: odd
    assert shape(1, 1280, 1280, "float")["cv"] == 1 and shape(5, 1280, 1280, "i8")["cv"] == 2
    assert shape(1, 1280, 1280)["splits"] == 1 and shape(1, 1280, 5120)["splits"] == 1
    assert shape(1, 5120, 1280)["splits"] == 2 and shape(1, 5120, 1280, part_major=True)["splits"] == 1
    assert shape(1, 1280, 1280)["lx"] == 4 and shape(1, 1280, 51866)["lx"] == 8    # 40 column groups, not 20
    logits = shape(1, 1280, 51866)
    lanes = -(-12967 // (logits["lx"] * logits["cv"])) * logits["lx"] * logits["ly"]
    assert logits["splits"] == 1 and lanes >= 132 * 512
    forced = shape(1, 1280, 51866, options=Options.make({"gemm_splitk": 2, "rows_columns": 1, "local_size": (4, 8, 1)}))
    assert forced == {"lx": 4, "ly": 8, "cv": 1, "vec": False, "splits": 2, "ks": 160}
