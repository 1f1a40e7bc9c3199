"""Shape-family ops on the GPU (views, the gather copy, Concat) and the load-time shape arithmetic
that folds into them, against onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.helper import np_dtype_to_tensor_dtype

from minirt import Session, UnsupportedError, ops
from minirt.graph import Node
from minirt.infer import prepare
from minirt.loaders import load
from oracle import check_model, make_model, onnxruntime_run, rand

I64_MAX, I64_MIN = 2 ** 63 - 1, -2 ** 63


def i64(*v):
    return np.array(v, np.int64)


def run_one(op, shape, consts=None, opset=17, relu=False, **attrs):
    """Check one node on input x (plus constant operands) in both storages. relu=True puts the node
    between two Relus so that buffer storage can make it a view."""
    consts = consts or {}
    src, dst = ("r", "t") if relu else ("x", "y")
    nodes = [helper.make_node(op, [src] + list(consts), [dst], **attrs)]
    if relu:
        nodes = [helper.make_node("Relu", ["x"], ["r"])] + nodes + [helper.make_node("Relu", ["t"], ["y"])]
    m = make_model(nodes, {"x": shape}, ["y"], consts, opset=opset)
    return check_model(m, {"x": rand(*shape, low=0.1, high=1.0)})


# -- views and reshape copies -----------------------------------------------------------------
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape,target", [((2, 3, 5, 7), (0, -1, 7)), ((6, 35), (2, 3, 5, 7)), ((13,), (1, 13, 1)),
                                          ((2, 3, 5, 7), (-1,)), ((3, 5), (5, 3)), ((1, 6, 1, 5), (3, 1, 1, 10))])
def test_reshape(shape, target, relu):
    run_one("Reshape", shape, {"s": i64(*target)}, relu=relu)


def test_reshape_allowzero():
    run_one("Reshape", (2, 3, 5), {"s": i64(5, 3, 2)}, opset=14, allowzero=1)


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -3])
def test_flatten(axis):
    run_one("Flatten", (2, 3, 5, 7), axis=axis)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape,axes", [((3, 1, 5), [1]), ((1, 7, 1, 6), [0, -2]), ((1, 5, 1), None)])
def test_squeeze(shape, axes, opset):
    if opset >= 13:
        run_one("Squeeze", shape, {"a": i64(*axes)} if axes else {}, opset=opset, relu=True)
    else:
        run_one("Squeeze", shape, opset=opset, **({"axes": axes} if axes else {}))


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("shape,axes", [((3, 5), [0]), ((7,), [0, -1]), ((3, 5, 6), [-2]), ((9,), [1, 0, 3])])
def test_unsqueeze(shape, axes, opset):
    if opset >= 13:
        run_one("Unsqueeze", shape, {"a": i64(*axes)}, opset=opset, relu=True)
    else:
        run_one("Unsqueeze", shape, opset=opset, axes=axes)


def test_reshape_in_buffer_storage_is_a_view_and_in_texture_a_copy():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["t"]),
             helper.make_node("Unsqueeze", ["t", "a"], ["u"]), helper.make_node("Relu", ["u"], ["y"])]
    m = make_model(nodes, {"x": (2, 3, 5, 7)}, ["y"], {"s": i64(6, 35), "a": i64(0)})
    x = rand(2, 3, 5, 7)
    with Session(m, storage="buffer") as s:
        assert [d.op for d in s.plan.dispatches] == ["Relu", "Relu"]
        assert s.plan.root("u") == "r"
        np.testing.assert_allclose(s.run(x), np.maximum(x, 0).reshape(1, 6, 35))
    with Session(m, storage="texture") as s:   # channels-packed rank 4 -> width-packed rank 2
        assert [d.op for d in s.plan.dispatches] == ["Relu", "Reshape", "Relu"]


def test_maps_that_move_only_size_1_dims_are_views_in_buffer_storage():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Slice", ["t", "s", "e"], ["u"]), helper.make_node("Gather", ["u", "i"], ["v"]),
             helper.make_node("Relu", ["v"], ["y"])]
    m = make_model(nodes, {"x": (5, 1, 6)}, ["y"], {"s": i64(0), "e": i64(I64_MAX), "i": np.array(0, np.int64)})
    with Session(m, storage="buffer") as s:
        assert [d.op for d in s.plan.dispatches] == ["Relu", "Relu"]
    check_model(m, {"x": rand(5, 1, 6)})


def test_dynamic_shapes_infer_symbolically_and_run():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", 6])
    outs = ["r", "f", "tr", "sl", "c", "y"]
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("Reshape", ["x", "s2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"], axis=2), helper.make_node("Unsqueeze", ["r", "a"], ["u"]),
             helper.make_node("Transpose", ["u"], ["tr"], perm=[2, 1, 0]),
             helper.make_node("Slice", ["x", "a", "e", "a2"], ["sl"]),
             helper.make_node("Concat", ["x", "x"], ["c"], axis=1),
             helper.make_node("Gather", ["x", "i"], ["y"], axis=2)]
    inits = {"s": i64(0, -1), "s2": i64(-1, 2, 3), "a": i64(1), "e": i64(I64_MAX), "a2": i64(2), "i": i64(0, 2)}
    g = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    pg = prepare(load(m))
    assert [pg.tensor(o).shape for o in outs] == [("n", "6*t"), ("2*n*t", 3), ("6*t", 1, "n"), ("n", "t", 5),
                                                  ("n", "t+t", 6), ("n", "t", 2)]
    for shape in [(2, 3, 6), (1, 5, 6)]:
        check_model(m, {"x": rand(*shape)})


# -- the gather copy: Transpose, Slice, Expand, Gather ----------------------------------------
@pytest.mark.parametrize("shape,perm", [((3, 5), None), ((2, 3, 5, 7), [0, 2, 3, 1]), ((2, 3, 5, 7), [3, 1, 0, 2]),
                                        ((3, 6, 7), [1, 0, 2]), ((3, 6, 7), None), ((13,), None),
                                        ((2, 1, 5, 6), [1, 0, 2, 3])])
def test_transpose(shape, perm):
    run_one("Transpose", shape, relu=True, **({"perm": perm} if perm else {}))


SLICES = [  # shape, starts, ends, axes, steps
    ((3, 5, 6, 7), [1, -4], [3, I64_MAX], [1, 3], None),
    ((3, 5, 6, 7), [-1, 5], [I64_MIN, 0], [-1, 2], [-2, -1]),
    ((3, 5, 6, 7), [0, 1, 0], [2, 100, -1], [0, 1, 3], [1, 3, 2]),
    ((13,), [-100], [100], None, None),
    ((13,), [11], [-100], [0], [-3]),
    ((5, 9, 10), [0, 0], [5, 9], [0, 1], None),   # a full slice: a view
]


@pytest.mark.parametrize("shape,starts,ends,axes,steps", SLICES)
def test_slice(shape, starts, ends, axes, steps):
    consts = {"s": i64(*starts), "e": i64(*ends)}
    if axes or steps:
        consts["a"] = i64(*(axes or range(len(starts))))
    if steps:
        consts["st"] = i64(*steps)
    run_one("Slice", shape, consts, relu=True)


def test_slice_opset1_attributes():
    run_one("Slice", (3, 5, 7), opset=9, starts=[1, -3], ends=[3, 1000], axes=[0, -1])


@pytest.mark.parametrize("shape,target", [((3, 1, 7), (2, 1, 5, 1)), ((1,), (3, 5)), ((5, 1), (5, 6)),
                                          ((2, 3, 1, 5), (2, 3, 4, 5)), ((6,), (6,))])
def test_expand(shape, target):
    run_one("Expand", shape, {"s": i64(*target)}, relu=True)


@pytest.mark.parametrize("shape,axis,idx", [((5, 6, 7), 1, np.array(2)), ((5, 6, 7), -1, np.array(-1)),
                                            ((5, 6, 7), 0, i64(1, 3)), ((5, 6, 7), 2, i64(6, 4, 2, 0)),
                                            ((5, 6, 7), 1, i64(0, 1, 2, 5, 4, -1, 3)),
                                            ((5, 6, 7), 1, np.array([[0, 2], [4, -1]])), ((9,), 0, i64(8, 0, 3)),
                                            ((5, 6, 7), 0, i64(3, 3, 1)), ((2, 5, 3, 4), 1, np.array(3)),
                                            ((2, 5, 3, 4), -3, i64(4, 0, 1, 2))])
def test_gather_runtime_data_constant_indices(shape, axis, idx):
    run_one("Gather", shape, {"i": idx.astype(np.int64)}, axis=axis)


def test_cast_float_to_float_on_the_gpu():
    run_one("Cast", (3, 5, 6), relu=True, to=TensorProto.FLOAT)


# -- Concat -----------------------------------------------------------------------------------
CONCATS = [([(2, 3, 5, 7), (2, 4, 5, 7)], 1), ([(2, 3, 5, 7)] * 3, -1), ([(3, 5), (3, 1), (3, 6), (3, 2)], 1),
           ([(1, 5), (4, 5), (3, 5)], 0), ([(7,), (6,)], 0), ([(2, 3, 5), (2, 3, 2)], 2),
           ([(1, 2, 3, 4), (2, 2, 3, 4)], 0), ([(2, 3, 5, 7), (2, 3, 1, 7)], 2),
           ([(3, k) for k in range(1, 10)], -1),            # 9 inputs: a tree of dispatches
           ([(k, 3, 2, 5) for k in (1, 2, 3, 1, 2)], 0)]


@pytest.mark.parametrize("shapes,axis", CONCATS)
def test_concat(shapes, axis):
    names = [f"x{i}" for i in range(len(shapes))]
    m = make_model([helper.make_node("Concat", names, ["y"], axis=axis)], dict(zip(names, shapes)), ["y"])
    check_model(m, {n: rand(*s) for n, s in zip(names, shapes)})


def test_concat_with_a_constant_and_a_repeated_input():
    m = make_model([helper.make_node("Concat", ["x", "c", "x"], ["y"], axis=1)], {"x": (3, 5)}, ["y"],
                   {"c": rand(3, 2, seed=1)})
    check_model(m, {"x": rand(3, 5)})


# -- folding ----------------------------------------------------------------------------------
def _shape_chain_model():
    """torch.onnx-style: y = x.reshape(x.shape[0], x.shape[1] * x.shape[2], -1) through Shape arithmetic."""
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["d0"], axis=0),
             helper.make_node("Gather", ["sh", "i1"], ["d1"], axis=0),
             helper.make_node("Gather", ["sh", "i2"], ["d2"], axis=0),
             helper.make_node("Mul", ["d1", "d2"], ["d12"]),
             helper.make_node("Unsqueeze", ["d0", "ax"], ["u0"]),
             helper.make_node("Unsqueeze", ["d12", "ax"], ["u1"]),
             helper.make_node("Concat", ["u0", "u1", "m1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    return make_model(nodes, {"x": (2, 3, 5, 7)}, ["y"],
                      {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "i2": np.array(2, np.int64),
                       "ax": i64(0), "m1": i64(-1)})


def test_shape_arithmetic_folds_into_a_static_reshape():
    m = _shape_chain_model()
    g = prepare(load(m))
    assert [n.op for n in g.nodes] == ["Reshape"]
    target = g.tensor(g.nodes[0].inputs[1])
    assert target.is_const and target.data.tolist() == [2, 15, -1]
    assert g.tensor("y").shape == (2, 15, 7)
    check_model(m, {"x": rand(2, 3, 5, 7)})


def test_shape_of_a_runtime_tensor_with_a_static_shape_folds():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Shape", ["r"], ["s"], start=-1),
             helper.make_node("Size", ["r"], ["n"]), helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["sf", "nf"], ["q"]), helper.make_node("Mul", ["r", "q"], ["y"])]
    m = make_model(nodes, {"x": (2, 3, 5)}, ["y"], opset=17)
    g = prepare(load(m))
    assert [n.op for n in g.nodes] == ["Relu", "Mul"]
    check_model(m, {"x": rand(2, 3, 5)})


def test_unfoldable_shape_arithmetic_is_reported_at_session_creation():
    """A Reshape/Gather needing a runtime int tensor cannot run (a Shape of a dynamic dim folds once a run
    binds the shape, so it is no error)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [helper.make_node("Shape", ["x"], ["sh"], name="the_shape"),
             helper.make_node("Reshape", ["x", "sh"], ["r"], name="dyn_reshape"),
             helper.make_node("Reshape", ["r", "s"], ["r2"], name="rt_reshape"),
             helper.make_node("Gather", ["r2", "s"], ["y"], name="rt_gather")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x, s], [y]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedError) as e:
        Session(m)
    msg = str(e.value)
    for name in ("rt_reshape", "rt_gather"):
        assert name in msg
    assert "constant" in msg and "the_shape" not in msg


def test_shape_of_a_dynamic_dim_folds_at_each_bound_shape():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    c = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.INT64, [2], [-1, 3]))
    nodes = [helper.make_node("Shape", ["x"], ["sh"]), helper.make_node("Gather", ["sh", "i"], ["n0"], axis=0),
             c, helper.make_node("Reshape", ["x", "c"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    i = helper.make_tensor("i", TensorProto.INT64, [], [0])
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [i]), opset_imports=[helper.make_opsetid("", 17)])
    with Session(m) as s:
        for n in (1, 4):
            a = rand(n, 6)
            np.testing.assert_allclose(s.run(a), np.maximum(a, 0).reshape(-1, 3))


def test_cast_of_a_runtime_tensor_to_int_is_reported():
    m = make_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64, name="to_int")], {"x": (3,)}, ["y"])
    with pytest.raises(UnsupportedError, match="to_int"):
        Session(m)


# -- numpy references (used for folding) vs onnxruntime, on integer tensors too -------------------
def _ref_case(op, inputs, attrs=None, opset=17, const_inputs=()):
    names = [f"in{i}" if v is not None else "" for i, v in enumerate(inputs)]
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    ours = {k: numpy_helper.to_array(v) if isinstance(v, TensorProto) else v for k, v in (attrs or {}).items()}
    got = ops.OPS[op].reference(Node(op, "n", names, ["y"], ours), *inputs)[0]
    vi = [helper.make_tensor_value_info(n, np_dtype_to_tensor_dtype(v.dtype), v.shape)
          for n, v in zip(names, inputs) if n]
    out = helper.make_tensor_value_info("y", np_dtype_to_tensor_dtype(np.asarray(got).dtype), None)
    m = helper.make_model(helper.make_graph([node], "g", vi, [out]), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 20 else 9
    ref = onnxruntime_run(m, {n: v for n, v in zip(names, inputs) if n})[0]
    assert np.asarray(got).dtype == ref.dtype, f"{op}: dtype {np.asarray(got).dtype} != {ref.dtype}"
    np.testing.assert_allclose(got, ref, rtol=1e-6)


A = i64(7, -7, 12, 3, -1, 0)
B = i64(2, 2, -5, 3, 4, 9)
F = np.array([1.5, -2.5, 3.7, -0.2, 0.0, 9.99], np.float32)
INT_CASES = [
    ("Add", [A, B], {}), ("Sub", [A, B], {}), ("Mul", [A, B], {}), ("Div", [A, B], {}),
    ("Shape", [np.zeros((2, 3, 5), np.float32)], {}), ("Shape", [np.zeros((2, 3, 5), np.float32)], {"start": -2}),
    ("Shape", [np.zeros((2, 3, 5), np.float32)], {"start": 1, "end": -1}), ("Size", [np.zeros((2, 3), np.float32)], {}),
    ("Gather", [A, np.array(-2, np.int64)], {}), ("Gather", [A.reshape(2, 3), i64(1, 0)], {"axis": 0}),
    ("Gather", [A.reshape(2, 3), i64(-1, 1)], {"axis": 1}),
    ("Cast", [A], {"to": TensorProto.FLOAT}), ("Cast", [F], {"to": TensorProto.INT64}),
    ("Cast", [A], {"to": TensorProto.BOOL}), ("Cast", [F], {"to": TensorProto.INT32}),
    ("CastLike", [F, A], {}),
    ("Range", [np.array(2, np.int64), np.array(11, np.int64), np.array(3, np.int64)], {}),
    ("Range", [np.array(5, np.int64), np.array(-4, np.int64), np.array(-2, np.int64)], {}),
    ("Range", [np.array(0.5, np.float32), np.array(2.0, np.float32), np.array(0.3, np.float32)], {}),
    ("ConstantOfShape", [i64(2, 3)], {}),
    ("ConstantOfShape", [i64(3)], {"value": helper.make_tensor("v", TensorProto.INT64, [1], [7])}),
    ("Equal", [A, B], {}), ("Less", [A, B], {}), ("Greater", [A, B], {}), ("LessOrEqual", [A, B], {}),
    ("GreaterOrEqual", [A, B], {}), ("Where", [A > 2, A, B], {}), ("Not", [A > 0], {}),
    ("And", [A > 0, B > 0], {}), ("Or", [A > 0, B > 0], {}), ("Xor", [A > 0, B > 0], {}),
    ("Min", [A, B, i64(0)], {}), ("Max", [A, B], {}), ("Sum", [F, F, F[::-1].copy()], {}),
    ("Floor", [F], {}), ("Ceil", [F], {}),
    ("Mod", [A, B], {}), ("Mod", [A, B], {"fmod": 1}), ("Mod", [F, F[::-1].copy() + 3], {"fmod": 1}),
    ("ReduceProd", [A.reshape(2, 3)], {"keepdims": 0}), ("ReduceProd", [A.reshape(2, 3), i64(-1)], {}, 18),
    ("Squeeze", [A.reshape(1, 6), i64(0)], {}), ("Unsqueeze", [A, i64(-1, 0)], {}),
    ("Concat", [A, B, i64()], {"axis": 0}), ("Reshape", [A, i64(3, -1)], {}),
    ("Reshape", [A.reshape(2, 3), i64(0, 3)], {}),
    ("Slice", [A, i64(-1), i64(I64_MIN), i64(0), i64(-2)], {}), ("Slice", [A, i64(1), i64(I64_MAX)], {}),
    ("Transpose", [A.reshape(2, 3)], {}), ("Expand", [i64(1, 2), i64(3, 1)], {}),
    ("Flatten", [A.reshape(1, 2, 3)], {"axis": 2}), ("Identity", [A], {}), ("Neg", [A], {}), ("Abs", [A], {}),
]


@pytest.mark.parametrize("case", INT_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(INT_CASES)])
def test_reference_matches_onnxruntime(case):
    op, inputs, attrs, *opset = case
    _ref_case(op, inputs, attrs, *opset)
