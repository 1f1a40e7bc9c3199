"""Programs with state: tensors that live across runs (Graph.state, Plan.state), int32 inputs, the run-time parameter
block (Graph.params, Plan.params), the runtime Gather, the row copies (ParamRows, CacheWrite, ReorderRows) and
CachedAttention, on small graphs built by hand; several Plans over one set of state tensors (minirt.program), and
runs that replay without recording again."""
import numpy as np
import pytest

from minirt.graph import Graph, Node, Tensor
from minirt.infer import prepare
from minirt.plan import PARAMS, PARAMS_TENSOR, STATE
from minirt.planner import make_plan
from minirt.program import Program
from minirt.session import get_device

B, T, D = 3, 6, 8


def graph(name, inputs=(), outputs=(), state=None, params=(), nodes=(), consts=None):
    g = Graph(name=name, source=name)
    for n, shape, dtype in inputs:
        g.inputs.append(n)
        g.add_tensor(Tensor(n, shape, dtype))
    for n, (shape, new) in (state or {}).items():
        g.add_tensor(Tensor(n, shape, "float32"))
        g.state[n] = new
    for n, data in (consts or {}).items():
        g.const(n, np.asarray(data))
    g.params = list(params)
    for op, ins, outs, attrs in nodes:
        g.nodes.append(Node(op, f"{op}_{len(g.nodes)}", list(ins), list(outs), dict(attrs),
                            "minirt" if op in ("CacheWrite", "ReorderRows", "CachedAttention", "ParamRows") else ""))
        for o in outs:
            g.tensors.setdefault(o, Tensor(o))
    g.outputs = list(outputs)
    return g


def plan_of(g, **options):
    dev = get_device()
    return make_plan(prepare(g), dev.profile, "buffer", {"precision": "fp32", **options})


@pytest.fixture(scope="module")
def program():
    """write: cache[:2, pos] = x; read: y = cache, and a causal attention of q over the cache up to pos;
    reorder: cache rows by an int32 index, the first `len` positions; embed: table rows by int32 ids + row pos of
    a second table."""
    rng = np.random.default_rng(0)
    table, pos_table = rng.standard_normal((10, D), np.float32), rng.standard_normal((T, D), np.float32)
    cache = {"cache": ((B, T, D), "cache@new")}
    write = graph("write", [("x", (2, 1, D), "float32")], (), cache, ["pos"],
                  [("CacheWrite", ["cache", "x"], ["cache@new"], {"param": "pos"})])
    read = graph("read", [("q", (B, 1, D), "float32")], ["y", "att"], {"cache": ((B, T, D), "cache")}, ["pos"],
                 [("Identity", ["cache"], ["y"], {}),
                  ("CachedAttention", ["q", "cache", "cache"], ["att"], {"heads": 2, "scale": 0.5, "param": "pos"})])
    reorder = graph("reorder", [("rows", (B,), "int32")], (), cache, ["len"],
                    [("ReorderRows", ["cache", "rows"], ["cache@new"], {"valid": "len"})])
    embed = graph("embed", [("ids", (B, 1), "int32")], ["e"], None, ["pos"],
                  [("Gather", ["table", "ids"], ["g"], {"axis": 0}),
                   ("ParamRows", ["pos_table"], ["p"], {"param": "pos"}), ("Add", ["g", "p"], ["e"], {})],
                  {"table": table, "pos_table": pos_table})
    plans = {k: plan_of(g) for k, g in (("write", write), ("read", read), ("reorder", reorder), ("embed", embed))}
    with Program(plans) as prog:
        yield prog, table, pos_table


def test_plan_shows_state_params_and_integer_inputs(program):
    prog = program[0]
    p = prog.plans["write"]
    assert p.state == ["cache"] and p.params == ["pos"]
    assert p.tensors["cache"].role == STATE and p.tensors[PARAMS_TENSOR].role == PARAMS
    assert p.tensors["cache@new"].view_of == "cache"          # the new value lives in the state
    assert "cache" not in p.lifetimes and p.outputs == []       # never aliased, never read back
    assert prog.plans["reorder"].tensors["rows"].dtype == "int32"
    from minirt.cli import format_plan
    text = format_plan(prog.plans["reorder"])
    assert "cache [3,6,8] float32 written" in text and "params len (slot 0)" in text and "rows [3] int32" in text


def test_state_persists_across_runs_and_plans(program):
    from minirt.vk.recorder import recordings
    prog = program[0]
    rng = np.random.default_rng(1)
    want = np.zeros((B, T, D), np.float32)
    prog.run("read", {"q": np.zeros((B, 1, D), np.float32)}, {"pos": 0})     # recorded already: warm
    before = recordings()
    for pos in range(T):
        x = rng.standard_normal((2, 1, D), np.float32)
        prog.run("write", {"x": x}, {"pos": pos})
        want[:2, pos] = x[:, 0]
        q = rng.standard_normal((B, 1, D), np.float32)
        y, att = (prog.run("read", {"q": q}, {"pos": pos})[k] for k in ("y", "att"))
        np.testing.assert_array_equal(y, want)
        from minirt.ops.state import CachedAttention
        node = Node("CachedAttention", "a", [], [], {"heads": 2, "scale": 0.5})
        (ref,) = CachedAttention().reference(node, q, want, want, offset=pos)
        np.testing.assert_allclose(att, ref, rtol=1e-5, atol=1e-6)
    rows = np.array([2, 0, 0])
    prog.run("reorder", {"rows": rows}, {"len": 4})
    got = prog.run("read", {"q": q}, {"pos": 0})["y"]
    np.testing.assert_array_equal(got[:, :4], want[rows, :4])
    np.testing.assert_array_equal(got[:, 4:], want[:, 4:])       # past `len`: left as it was
    assert recordings() == before                                 # every run replayed its recording


def test_runtime_gather_and_param_rows(program):
    prog, table, pos_table = program
    ids = np.array([[3], [9], [0]])
    e = prog.run("embed", {"ids": ids}, {"pos": 4})["e"]
    np.testing.assert_allclose(e, table[ids[:, 0]][:, None] + pos_table[4], rtol=1e-6)
    with pytest.raises(Exception, match="int32"):
        prog.run("embed", {"ids": ids.astype(np.float32)}, {"pos": 4})
    with pytest.raises(Exception, match="missing"):
        prog.run("embed", {"ids": ids})


def test_onnx_gather_with_runtime_int32_indices():
    """An ONNX embedding lookup whose indices are an int32 graph input runs in a Session (buffer storage)."""
    from onnx import TensorProto, helper, numpy_helper

    from minirt import Session
    table = np.random.default_rng(2).standard_normal((11, 8)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)], "embed",
                          [helper.make_tensor_value_info("ids", TensorProto.INT32, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 8])],
                          [numpy_helper.from_array(table, "table")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    ids = np.array([[0, 10, 3], [3, 3, 7]], np.int32)
    with Session(model, storage="buffer") as s:
        assert s.inputs[0].dtype == "int32"
        np.testing.assert_array_equal(s.run(ids), table[ids])
        np.testing.assert_array_equal(s.run(ids[::-1].copy()), table[ids[::-1]])
        with pytest.raises(Exception, match="must be int32"):
            s.run(ids.astype(np.float32))


def test_program_frees_everything_and_checks_shared_state():
    from minirt.errors import MinirtError
    from minirt.vk.executor import live_objects
    a = graph("a", [("x", (1, 1, D), "float32")], (), {"s": ((2, T, D), "s@new")}, ["pos"],
              [("CacheWrite", ["s", "x"], ["s@new"], {"param": "pos"})])
    b = graph("b", [("q", (2, 1, D), "float32")], ["y"], {"s": ((2, T + 1, D), "s")}, [],
              [("CachedAttention", ["q", "s", "s"], ["y"], {"heads": 1})])
    before = live_objects()
    with Program({"a": plan_of(a)}) as prog:
        prog.run("a", {"x": np.ones((1, 1, D), np.float32)}, {"pos": 2})
        assert live_objects() > before
    assert live_objects() == before
    with pytest.raises(MinirtError, match="state tensor 's' is"):
        Program({"a": plan_of(a), "b": plan_of(b)})
    assert live_objects() == before


@pytest.mark.parametrize("splits", [1, 3, 7])
def test_cached_attention_key_splits(splits):
    """CachedAttention with its keys split S ways across work groups (a combine pass merges them; chosen from the
    multiprocessor count on big GPUs, forced here): causal over a growing cache of more rows than the query
    (a one-row step over a beam cache) and over every key of a one-row cache (cross-attention), against the
    float64-checked reference at every position, with empty splits while the cache is short."""
    from minirt.ops.state import CachedAttention
    rng = np.random.default_rng(splits)
    tk, heads, dh, rows = 40, 2, 8, 3
    d = heads * dh
    cache, enc = rng.standard_normal((rows, tk, d), np.float32), rng.standard_normal((1, tk, d), np.float32)
    g = graph("attend", [("q", (1, 2, d), "float32")], ["self", "cross"],
              {"cache": ((rows, tk, d), "cache"), "enc": ((1, tk, d), "enc")}, ["pos"],
              [("CachedAttention", ["q", "cache", "cache"], ["self"], {"heads": heads, "scale": 0.3, "param": "pos"}),
               ("CachedAttention", ["q", "enc", "enc"], ["cross"], {"heads": heads, "scale": 0.3})])
    fill = graph("fill", [("c", (rows, tk, d), "float32"), ("e", (1, tk, d), "float32")], (),
                 {"cache": ((rows, tk, d), "cache@new"), "enc": ((1, tk, d), "enc@new")}, (),
                 [("Identity", ["c"], ["cache@new"], {}), ("Identity", ["e"], ["enc@new"], {})])
    plan = plan_of(g, attention_splits=splits)
    kernels = [x.kernel for x in plan.dispatches]
    assert kernels.count("attention_combine_buffer") == (2 if splits > 1 else 0)
    with Program({"attend": plan, "fill": plan_of(fill)}) as prog:
        prog.run("fill", {"c": cache, "e": enc})
        node = Node("CachedAttention", "a", [], [], {"heads": heads, "scale": 0.3})
        for pos in (0, 1, 5, tk - 2):
            q = rng.standard_normal((1, 2, d), np.float32)
            out = prog.run("attend", {"q": q}, {"pos": pos})
            (want,) = CachedAttention().reference(node, q.astype(np.float64), cache.astype(np.float64),
                                                  cache.astype(np.float64), offset=pos)
            np.testing.assert_allclose(out["self"], want, rtol=1e-5, atol=1e-5)
            (want,) = CachedAttention().reference(node, q.astype(np.float64), enc.astype(np.float64),
                                                  enc.astype(np.float64))
            np.testing.assert_allclose(out["cross"], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 3])
def test_state_at_fp16(splits):
    """The same ops at precision fp16 (their kernels' half variants; the state in float16): token and positional
    embeddings written into a cache at a parameter (runtime Gather, ParamRows, Add, CacheWrite), read back whole, a
    causal CachedAttention over it (keys split `splits` ways) and a ReorderRows, against float64 references on the
    float16-rounded values."""
    from minirt.ops.state import CachedAttention
    rng = np.random.default_rng(10 + splits)
    heads, dh, tk = 2, 8, 40
    d = heads * dh
    table, pos_table = rng.standard_normal((10, d), np.float32), rng.standard_normal((tk, d), np.float32)
    cache = {"cache": ((B, tk, d), "cache@new")}
    write = graph("write", [("ids", (2, 1), "int32")], (), cache, ["pos"],
                  [("Gather", ["table", "ids"], ["g"], {"axis": 0}),
                   ("ParamRows", ["pos_table"], ["p"], {"param": "pos"}), ("Add", ["g", "p"], ["x"], {}),
                   ("CacheWrite", ["cache", "x"], ["cache@new"], {"param": "pos"})],
                  {"table": table, "pos_table": pos_table})
    read = graph("read", [("q", (B, 1, d), "float32")], ["y", "att"], {"cache": ((B, tk, d), "cache")}, ["pos"],
                 [("Identity", ["cache"], ["y"], {}),
                  ("CachedAttention", ["q", "cache", "cache"], ["att"],
                   {"heads": heads, "scale": 0.5, "param": "pos"})])
    reorder = graph("reorder", [("rows", (B,), "int32")], (), cache, ["len"],
                    [("ReorderRows", ["cache", "rows"], ["cache@new"], {"valid": "len"})])
    plans = {k: plan_of(g, precision="fp16", attention_splits=splits)
             for k, g in (("write", write), ("read", read), ("reorder", reorder))}
    assert all(p.tensors["cache"].dtype == "float16" for p in plans.values())
    kernels = [x.kernel for p in plans.values() for x in p.dispatches]
    assert {"copy_rows_half", "cached_attention_half"} <= set(kernels)
    assert kernels.count("attention_combine_buffer_half") == (splits > 1)

    def r16(x):
        return np.asarray(x, np.float32).astype(np.float16).astype(np.float64)
    node = Node("CachedAttention", "a", [], [], {"heads": heads, "scale": 0.5})
    want = np.zeros((B, tk, d))
    with Program(plans) as prog:
        for pos in range(6):
            ids = rng.integers(0, 10, (2, 1))
            prog.run("write", {"ids": ids}, {"pos": pos})
            want[:2, pos] = r16(r16(table[ids[:, 0]]) + r16(pos_table[pos]))
            q = rng.standard_normal((B, 1, d), np.float32)
            out = prog.run("read", {"q": q}, {"pos": pos})
            assert out["y"].dtype == np.float32 and out["att"].dtype == np.float32
            np.testing.assert_allclose(out["y"], want, rtol=1e-3, atol=1e-3)
            (ref,) = CachedAttention().reference(node, r16(q), want, want, offset=pos)
            np.testing.assert_allclose(out["att"], ref, rtol=2e-3, atol=2e-3)
        rows = np.array([2, 0, 0])
        prog.run("reorder", {"rows": rows}, {"len": 4})
        got = prog.run("read", {"q": q}, {"pos": 0})["y"]
        np.testing.assert_array_equal(got[:, :4], out["y"][rows, :4])     # 16-bit values moved as they are
        np.testing.assert_array_equal(got[:, 4:], out["y"][:, 4:])


def test_per_row_positions_and_the_row_to_item_map():
    """per_row: ParamRows, CacheWrite and CachedAttention read a parameter a batch row (the slots after the named
    one: each sequence of a batch at its own position); items: CachedAttention's K/V row of query row b is
    param(item + b) (each sequence reads its own encoder output). Against the ops' references, poisoned; and a
    Program entry point added later over the same state (Program.add)."""
    from minirt.graph import Node
    from minirt.ops.state import CachedAttention
    rng = np.random.default_rng(5)
    pos_table = rng.standard_normal((T, D)).astype(np.float32)
    cache = {"cache": ((B, T, D), "cache@new")}
    names = ["p0", "p1", "i0", "i1"]
    write = graph("write", [("x", (2, 1, D), "float32")], (), cache, names,
                  [("CacheWrite", ["cache", "x"], ["cache@new"], {"param": "p0", "per_row": 1})])
    attn = {"heads": 2, "scale": 0.5}
    read = graph("read", [("q", (2, 1, D), "float32")], ["y", "self", "cross"], {"cache": ((B, T, D), "cache")},
                 names, [("Identity", ["cache"], ["y"], {}),
                         ("CachedAttention", ["q", "cache", "cache"], ["self"], dict(attn, param="p0", per_row=1)),
                         ("CachedAttention", ["q", "cache", "cache"], ["cross"], dict(attn, items="i0"))])
    embed = graph("embed", [], ["e"], None, names,
                  [("ParamRows", ["pos_table"], ["e"], {"param": "p0", "per_row": 1, "rows": 2})],
                  consts={"pos_table": pos_table})
    with Program({"write": plan_of(write, poison=True), "embed": plan_of(embed, poison=True)}) as prog:
        prog.add({"read": plan_of(read, poison=True)})
        values = {"p0": 4, "p1": 1, "i0": 2, "i1": 0}
        np.testing.assert_array_equal(prog.run("embed", {}, values)["e"], pos_table[[4, 1]])
        for p0, p1 in ((3, 0), (4, 1)):     # row 0 at positions 3 then 4, row 1 at 0 then 1
            values = {"p0": p0, "p1": p1, "i0": 2, "i1": 0}
            x = rng.standard_normal((2, 1, D)).astype(np.float32)
            prog.run("write", {"x": x}, values)
        q = rng.standard_normal((2, 1, D)).astype(np.float32)
        out = prog.run("read", {"q": q}, values)
        y = out["y"]
        np.testing.assert_array_equal(y[0, 4], x[0, 0])
        np.testing.assert_array_equal(y[1, 1], x[1, 0])
        node = Node("CachedAttention", "a", [], [], dict(attn, per_row=1), "minirt")
        (want,) = CachedAttention().reference(node, q, y, y, offset=np.array([4, 1]))
        np.testing.assert_allclose(out["self"], want, rtol=1e-5, atol=1e-6)
        node = Node("CachedAttention", "a", [], [], dict(attn, items="i0"), "minirt")
        (want,) = CachedAttention().reference(node, q, y, y, items=np.array([2, 0]))
        np.testing.assert_allclose(out["cross"], want, rtol=1e-5, atol=1e-6)
        with pytest.raises(Exception, match="exist already"):
            prog.add({"read": plan_of(read)})
