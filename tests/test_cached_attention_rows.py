"""CachedAttention over every key with the query rows that read one K/V row grouped into a work group
(glsl/cached_attention_rows.comp, chosen in minirt/kernels/attention_cached.py): rows sharing one K/V batch row (a
step's beams over one encoder output, a prompt's tokens), a K/V row a query batch row, and the items map (a run-time
parameter a row) with runs of rows of one item, mixed and non-consecutive maps; with key splits and the combine pass,
at fp32 and fp16, poisoned, against a float64 reference and against the kernel of a work group a row
(attention_rows=1)."""
import numpy as np
import pytest

from minirt.graph import Graph, Node, Tensor
from minirt.infer import prepare
from minirt.ops.state import CachedAttention
from minirt.planner import make_plan
from minirt.program import Program
from minirt.session import get_device

HEADS, DH, TK = 2, 16, 70       # more keys than a chunk (64): the online softmax crosses chunks


def attend_graph(B, Tq, Bk, items, causal=False):
    d = HEADS * DH
    g = Graph(name="attend", source="attend")
    for n, shape in (("q", (B, Tq, d)), ("kv", (Bk, TK, d))):
        g.inputs.append(n)
        g.add_tensor(Tensor(n, shape, "float32"))
    attrs = {"heads": HEADS, "scale": 0.3}
    if items:
        attrs["items"] = "item.0"
    if causal:
        attrs["param"] = "pos"
    g.params = [f"item.{b}" for b in range(B)] + ["pos"]
    g.nodes.append(Node("CachedAttention", "attn", ["q", "kv", "kv"], ["y"], attrs, "minirt"))
    g.tensors["y"] = Tensor("y")
    g.outputs = ["y"]
    return g


def plan_of(g, **options):
    return make_plan(prepare(g), get_device().profile, "buffer", {"poison": True, **options})


def r16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)


# (B, Tq, Bk, items map or None): K/V rows known when planning (one shared; one a batch row, its Tq rows grouped),
# and maps from query batch rows to K/V rows at run time
CASES = [
    (2, 1, 1, None), (5, 1, 1, None), (8, 1, 1, None), (12, 1, 1, None),      # beams over one encoder output
    (1, 11, 1, None), (2, 3, 1, None),                                         # a prompt's tokens; B x Tq rows
    (2, 5, 3, None),                                                           # K/V row b for batch row b
    (5, 1, 3, [1, 1, 1, 1, 1]), (9, 1, 2, [0] * 9),                            # one item's rows (BeamRows)
    (8, 1, 3, [0, 0, 1, 1, 1, 0, 2, 2]), (4, 1, 4, [3, 1, 0, 2]),             # mixed runs; every row its own
    (6, 2, 3, [2, 2, 0, 2, 2, 1]),                                             # an item's rows not together
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("B,Tq,Bk,items", CASES)
def test_rows_sharing_a_kv_row_read_it_once(B, Tq, Bk, items, splits, precision):
    rng = np.random.default_rng([B, Tq, Bk, splits])
    g = attend_graph(B, Tq, Bk, items is not None)
    opts = {"precision": precision, "attention_splits": splits, "attention_rows_by_map": items is not None}
    plans = {"rows": plan_of(g, **opts), "one": plan_of(g, attention_rows=1, **opts)}
    suffix = "_half" if precision == "fp16" else ""
    kernels = {k: [x.kernel for x in p.dispatches] for k, p in plans.items()}
    assert f"cached_attention_rows{suffix}" in kernels["rows"] and f"cached_attention{suffix}" in kernels["one"]
    assert kernels["rows"].count(f"attention_combine_buffer{suffix}") == (splits > 1)
    assert any("query rows reading one K/V row a work group" in n for n in plans["rows"].notes.get("attn", []))
    d = HEADS * DH
    q, kv = rng.standard_normal((B, Tq, d), np.float32), rng.standard_normal((Bk, TK, d), np.float32)
    params = {f"item.{b}": (items[b] if items else 0) for b in range(B)}
    params["pos"] = 0
    with Program(plans) as prog:
        out = {k: prog.run(k, {"q": q, "kv": kv}, params)["y"] for k in plans}
    node = Node("CachedAttention", "a", [], [], {"heads": HEADS, "scale": 0.3})
    rd = r16 if precision == "fp16" else (lambda x: x.astype(np.float64))
    (want,) = CachedAttention().reference(node, rd(q), rd(kv), rd(kv), items=items)
    tol = 2e-3 if precision == "fp16" else 1e-5
    for k in plans:
        assert out[k].shape == want.shape
        np.testing.assert_allclose(out[k], want, rtol=tol, atol=tol, err_msg=k)
    # the same arithmetic a row as the kernel of a group a row: equal to fp32 rounding (fp16: one output rounding)
    np.testing.assert_allclose(out["rows"], out["one"], rtol=1e-6 if precision == "fp32" else 1e-3, atol=1e-7)


@pytest.mark.parametrize("most", [2, 3])
def test_attention_rows_caps_the_group(most):
    """attention_rows=R takes at most R rows a group: a run of 3 rows of one item in groups of 2 + 1, and 7 rows
    over one shared K/V row in ceil(7 / R) groups."""
    rng = np.random.default_rng(most)
    d = HEADS * DH
    for B, Bk, items in ((8, 3, [0, 0, 1, 1, 1, 0, 2, 2]), (7, 1, None)):
        g = attend_graph(B, 1, Bk, items is not None)
        plan = plan_of(g, precision="fp32", attention_rows=most, attention_rows_by_map=True)
        (disp,) = [x for x in plan.dispatches if x.kernel == "cached_attention_rows"]
        assert disp.spec == (DH, most)
        if items is None:
            assert disp.global_size[1:] == (-(-B // most), 1)
        q, kv = rng.standard_normal((B, 1, d), np.float32), rng.standard_normal((Bk, TK, d), np.float32)
        params = {f"item.{b}": (items[b] if items else 0) for b in range(B)}
        with Program({"a": plan}) as prog:
            y = prog.run("a", {"q": q, "kv": kv}, {**params, "pos": 0})["y"]
        node = Node("CachedAttention", "a", [], [], {"heads": HEADS, "scale": 0.3})
        (want,) = CachedAttention().reference(node, q.astype(np.float64), kv.astype(np.float64),
                                              kv.astype(np.float64), items=items)
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_causal_attention_keeps_a_group_a_row():
    """Self-attention over a growing cache (each row its own keys) stays on cached_attention.comp."""
    plan = plan_of(attend_graph(5, 1, 5, False, causal=True), precision="fp32")
    assert [x.kernel for x in plan.dispatches if "cached" in x.kernel] == ["cached_attention"]
