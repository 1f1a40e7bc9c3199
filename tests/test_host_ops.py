"""The ops a text model applies to its integer and boolean inputs, computed on the host each run (minirt/host.py),
against onnxruntime: each builds, from an int64 mask m [2, 5] (or int64 ids), a tensor that a float32 GPU graph
input x [2, 5] is added to, so every result crosses to the GPU as float32; both storages, poisoned activations, exact
equality (the host arithmetic is exact and the one GPU Add rounds as onnxruntime's does)."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from minirt import Session
from oracle import STORAGES, onnxruntime_run

I64, F32, BOOL = TensorProto.INT64, TensorProto.FLOAT, TensorProto.BOOL


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def const(name, value, dtype=I64):
    value = np.asarray(value)
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, dtype, value.shape,
                                                                             value.reshape(-1).tolist()))


def to_float(src):
    return [node("Cast", [src], ["f"], to=F32), node("Add", ["x", "f"], ["y"])]


CASES = {   # name: nodes computing y = x + (float of something from m)
    "compare_and_logic": [const("two", 2), node("Equal", ["m", "two"], ["e"]), node("Less", ["m", "two"], ["l"]),
                          node("Greater", ["m", "two"], ["g"]), node("Not", ["e"], ["ne"]),
                          node("And", ["ne", "g"], ["a"]), node("Or", ["a", "l"], ["o"]),
                          node("Xor", ["o", "e"], ["xo"]), node("GreaterOrEqual", ["m", "two"], ["ge"]),
                          node("LessOrEqual", ["m", "two"], ["le"]), node("And", ["ge", "le"], ["gl"]),
                          node("Or", ["xo", "gl"], ["b"]), *to_float("b")],
    "where_additive_mask": [node("Cast", ["m"], ["b"], to=BOOL), const("zero", 0.0, F32),
                            const("ninf", -3.4028234663852886e38, F32), node("Where", ["b", "zero", "ninf"], ["w"]),
                            const("tiny", 1e-30, F32), node("Mul", ["w", "tiny"], ["f"]), node("Add", ["x", "f"],
                                                                                              ["y"])],
    "cumsum_positions": [const("ax", 1), node("CumSum", ["m", "ax"], ["c"]), node("Mul", ["c", "m"], ["p"]),
                         *to_float("p")],
    "cumsum_exclusive_reverse": [const("ax", -1), node("CumSum", ["m", "ax"], ["p"], exclusive=1, reverse=1),
                                 *to_float("p")],
    "unsqueeze_expand_reshape_slice": [const("a0", [0]), node("Unsqueeze", ["m", "a0"], ["u"]),
                                       const("shp", [3, 2, 5]), node("Expand", ["u", "shp"], ["ex"]),
                                       const("st", [1]), const("en", [2]), node("Slice", ["ex", "st", "en", "a0"],
                                                                                 ["sl"]),
                                       const("r", [2, 5]), node("Reshape", ["sl", "r"], ["p"]), *to_float("p")],
    "tile_transpose_min_max": [const("reps", [1, 2]), node("Tile", ["m", "reps"], ["t"]),
                               const("s0", [0]), const("s1", [5]), const("ax1", [1]),
                               node("Slice", ["t", "s0", "s1", "ax1"], ["ts"]), const("three", 3),
                               node("Min", ["ts", "three"], ["mn"]), const("one", 1),
                               node("Max", ["mn", "one"], ["p"]), *to_float("p")],
    "range_gather_positions": [node("Shape", ["m"], ["sh"]), const("i1", 1), node("Gather", ["sh", "i1"], ["n"]),
                               const("z", 0), const("d", 1), node("Range", ["z", "n", "d"], ["rg"]),
                               node("Add", ["m", "rg"], ["p"]), *to_float("p")],
    "constant_of_shape_trilu": [const("sq", [5, 5]),
                                node("ConstantOfShape", ["sq"], ["ones"],
                                     value=helper.make_tensor("v", I64, [1], [1])),
                                node("Trilu", ["ones"], ["tri"], upper=0), const("k", 1),
                                node("Trilu", ["ones", "k"], ["up"]), node("Sub", ["tri", "up"], ["d"]),
                                const("r0", [0]), node("Gather", ["d", "r0"], ["row"], axis=0),
                                node("Mul", ["m", "row"], ["p"]), *to_float("p")],
    "gather_elements_isnan": [const("ix", [[0, 4, 1, 3, 2], [2, 2, 0, 1, 4]]),
                              node("GatherElements", ["m", "ix"], ["ge"], axis=1), node("Cast", ["ge"], ["gf"], to=F32),
                              const("zero", 0.0, F32), const("nan_", float("nan"), F32), const("three", 3),
                              node("Less", ["ge", "three"], ["lt"]), node("Where", ["lt", "nan_", "gf"], ["q"]),
                              node("IsNaN", ["q"], ["nan"]), node("Not", ["nan"], ["keep"]),
                              node("Where", ["keep", "gf", "zero"], ["f"]), node("Add", ["x", "f"], ["y"])],
    "embedding_gather": [node("Gather", ["table", "m"], ["f"]), node("ReduceSum", ["f", "lastax"], ["s"], keepdims=0),
                         node("Add", ["x", "s"], ["y"])],
}


def model_of(nodes):
    ins = [helper.make_tensor_value_info("x", F32, [2, 5]), helper.make_tensor_value_info("m", I64, [2, 5])]
    inits = [helper.make_tensor("table", F32, [7, 3], np.random.default_rng(0).standard_normal(21).tolist()),
             helper.make_tensor("lastax", I64, [1], [-1])]
    g = helper.make_graph(nodes, "host", ins, [helper.make_tensor_value_info("y", F32, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("case", sorted(CASES))
def test_host_op_matches_onnxruntime(case):
    m = model_of(CASES[case])
    rng = np.random.default_rng(len(case))
    feeds = {"x": rng.standard_normal((2, 5)).astype(np.float32), "m": rng.integers(0, 7, (2, 5)).astype(np.int64)}
    (ref,) = onnxruntime_run(m, feeds)
    for storage in STORAGES:
        with Session(m, storage=storage, options={"poison": True}) as s:
            for seed in (1, 2):           # the recorded GPU part replays; the host part is computed per run
                feeds["m"] = np.random.default_rng(seed).integers(0, 7, (2, 5)).astype(np.int64)
                (ref,) = onnxruntime_run(m, feeds)
                (out,) = s.run(None, feeds)
                np.testing.assert_array_equal(out, ref, err_msg=f"{case} {storage} seed {seed}")
