"""Rank-5 picks (minirt/rank5.py): q, k, v taken by index from a packed projection reshaped to rank 5, as exporters
write them (Split + Squeeze, Slice + Squeeze, Gather with a scalar index), become rank-4 Slice, Reshape and
Transpose when the graph is prepared; against onnxruntime in both storages with poisoned activations. A rank-5
tensor that is not only picked is refused at load, every node that needs one named at once."""
import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.errors import UnsupportedError
from minirt.infer import prepare
from minirt.loaders import load
from oracle import check_model, make_model, rand

N, H, D = 5, 2, 4     # tokens, heads, head dim: qkv [1, N, 3 * H * D] -> [1, N, 3, H, D] -> [3, 1, H, N, D]


def ints(*v):
    return np.array(v, np.int64)


def qkv_model(pick, perm=(2, 0, 3, 1, 4), axis=0):
    """x [1, N, 3HD] -> Reshape [1, N, 3, H, D] -> Transpose(perm) (none if perm is None) -> q, k, v picked along
    `axis` -> q + k * v (rank 4)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r5"])]
    src = "r5"
    if perm is not None:
        nodes.append(helper.make_node("Transpose", ["r5"], ["t5"], perm=list(perm)))
        src = "t5"
    inits = {"shape": ints(1, N, 3, H, D), "ax": ints(axis)}
    names = ["q", "k", "v"]
    if pick == "split":
        nodes.append(helper.make_node("Split", [src, "ones"], ["s0", "s1", "s2"], axis=axis))
        inits["ones"] = ints(1, 1, 1)
        nodes += [helper.make_node("Squeeze", [f"s{i}", "ax"], [n]) for i, n in enumerate(names)]
    elif pick == "slice":
        for i, n in enumerate(names):
            inits[f"st{i}"], inits[f"en{i}"] = ints(i - 3 if i == 2 else i), ints(i + 1 if i < 2 else 2 ** 62)
            nodes += [helper.make_node("Slice", [src, f"st{i}", f"en{i}", "ax"], [f"s{i}"]),
                      helper.make_node("Squeeze", [f"s{i}", "ax"], [n])]
    else:
        for i, n in enumerate(names):
            inits[f"i{i}"] = np.array(i - 3 if i == 1 else i, np.int64)     # a negative index too
            nodes.append(helper.make_node("Gather", [src, f"i{i}"], [n], axis=axis))
    nodes += [helper.make_node("Mul", ["k", "v"], ["kv"]), helper.make_node("Add", ["q", "kv"], ["y"])]
    return make_model(nodes, {"x": [1, N, 3 * H * D]}, ["y"], inits)


def rank5_free(g):
    return all(len(t.shape) <= 4 for t in g.tensors.values() if not t.is_const)


@pytest.mark.parametrize("pick", ["split", "slice", "gather"])
def test_picks_of_a_transposed_rank5_tensor(pick):
    # the picked axis (3) and those after it (H, D) make up x's last axis: each pick slices columns of x
    model = qkv_model(pick)
    g = prepare(load(model))
    assert rank5_free(g)
    assert sorted(n.op for n in g.nodes) == sorted(["Slice", "Reshape", "Transpose"] * 3 + ["Mul", "Add"])
    assert all(n.inputs[0] == "x" for n in g.nodes if n.op == "Slice")
    check_model(model, {"x": rand(1, N, 3 * H * D, seed=3)})


def test_picks_without_a_transpose():
    # [1, N, 3, H, D] picked along axis 2: q, k, v [1, N, H, D], a Slice and a Reshape each
    model = qkv_model("split", perm=None, axis=2)
    g = prepare(load(model))
    assert rank5_free(g) and sorted(n.op for n in g.nodes) == sorted(["Slice", "Reshape"] * 3 + ["Mul", "Add"])
    check_model(model, {"x": rand(1, N, 3 * H * D, seed=4)})


def test_picks_of_a_middle_axis():
    # [1, N, 3, H, D] -> Transpose(1, 0, 3, 2, 4): picking a token slices the middle axis of x seen as [1, N, 3HD]
    model = qkv_model("gather", perm=(1, 0, 3, 2, 4), axis=0)
    g = prepare(load(model))
    assert rank5_free(g)
    assert sorted(n.op for n in g.nodes) == sorted(["Reshape"] + ["Slice", "Reshape", "Transpose"] * 3 +
                                                   ["Mul", "Add"])
    check_model(model, {"x": rand(1, N, 3 * H * D, seed=5)})


def test_packed_qkv_attention_fuses():
    """q, k, v picked from a packed projection, then scaled_dot_product_attention as torch writes it: the picks are
    the [B, T, D] roots fuse_attention needs, so the whole block is one Attention."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r5"]),
             helper.make_node("Transpose", ["r5"], ["t5"], perm=[2, 0, 3, 1, 4]),
             helper.make_node("Split", ["t5", "ones"], ["s0", "s1", "s2"], axis=0)]
    nodes += [helper.make_node("Squeeze", [f"s{i}", "ax"], [n]) for i, n in enumerate("qkv")]
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("Mul", ["q", "c"], ["qs"]), helper.make_node("Mul", ["kt", "c"], ["ks"]),
              helper.make_node("MatMul", ["qs", "ks"], ["sc"]), helper.make_node("Softmax", ["sc"], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["o"]),
              helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", ["ot", "back"], ["y"])]
    inits = {"shape": ints(1, N, 3, H, 16), "ones": ints(1, 1, 1), "ax": ints(0), "back": ints(1, N, H * 16),
             "c": np.array([16 ** -0.25], np.float32)}
    model = make_model(nodes, {"x": [1, N, 3 * H * 16]}, ["y"], inits)
    with Session(model, storage="buffer") as s:
        assert "Attention" in [d.op for d in s.plan.dispatches]
    check_model(model, {"x": rand(1, N, 3 * H * 16, seed=6)})


def test_rank5_tensors_read_otherwise_are_refused_naming_every_node():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r5"]), helper.make_node("Relu", ["r5"], ["a"]),
             helper.make_node("Sigmoid", ["a"], ["b"]), helper.make_node("Reshape", ["b", "back"], ["y"])]
    model = make_model(nodes, {"x": [1, N, 3 * H * D]}, ["y"],
                       {"shape": ints(1, N, 3, H, D), "back": ints(1, N, 3 * H * D)})
    with pytest.raises(UnsupportedError, match="4 node") as e:
        Session(model, storage="buffer")
    for name in ("Reshape node 'Reshape_3'", "Relu node", "Sigmoid node", "tensor 'r5' has rank 5",
                 "tensor 'b' has rank 5"):
        assert name in str(e.value)


def test_transpose_between_unit_axes_runs_at_rank_4():
    """nn.MultiheadAttention's split of its packed projection: [T, B, 3E] -> Reshape [T, B, 3, E] -> Unsqueeze(0) ->
    Transpose(3, 1, 2, 0, 4) -> Squeeze(-2) -> [3, T, B, E], q, k, v picked by Gather: a rank-4 Transpose."""
    T, B, E = 6, 2, 8
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r4"]), helper.make_node("Unsqueeze", ["r4", "ax0"], ["u5"]),
             helper.make_node("Transpose", ["u5"], ["t5"], perm=[3, 1, 2, 0, 4]),
             helper.make_node("Squeeze", ["t5", "axm2"], ["s4"])]
    inits = {"shape": ints(T, B, 3, E), "ax0": ints(0), "axm2": ints(-2)}
    for i, n in enumerate("qkv"):
        inits[f"i{i}"] = np.array(i, np.int64)
        nodes.append(helper.make_node("Gather", ["s4", f"i{i}"], [n], axis=0))
    nodes += [helper.make_node("Mul", ["k", "v"], ["kv"]), helper.make_node("Add", ["q", "kv"], ["y"])]
    model = make_model(nodes, {"x": [T, B, 3 * E]}, ["y"], inits)
    g = prepare(load(model))
    assert rank5_free(g) and [n.op for n in g.nodes].count("Transpose") == 1
    check_model(model, {"x": rand(T, B, 3 * E, seed=7)})
