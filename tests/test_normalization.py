"""LayerNormalization, Softmax and the Reduce ops against onnxruntime, in both storages."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from minirt import Session, ops
from minirt.errors import UnsupportedError
from minirt.loaders import load
from oracle import check_model, compare, make_model, onnxruntime_run, rand

OFFSET = 1e3   # a one-pass variance (E[x^2] - E[x]^2) loses every digit at this offset


def layer_norm_model(shape, axis, bias=True, scale_shape=None, epsilon=1e-5, seed=0):
    k = len(shape) + axis if axis < 0 else axis
    norm = shape[k:]
    inits = {"s": rand(*(scale_shape or norm), seed=seed, low=0.5, high=1.5)}
    if bias:
        inits["b"] = rand(*norm, seed=seed + 1)
    node = helper.make_node("LayerNormalization", ["x", "s"] + (["b"] if bias else []), ["y"], axis=axis,
                            epsilon=epsilon)
    return make_model([node], {"x": shape}, ["y"], inits), inits


@pytest.mark.parametrize("shape,axis", [
    ((1, 20, 384), -1),      # Whisper's rows (384 = tiny's width), fewer of them
    ((1, 9, 100), -1),       # rows held in registers on any subgroup size (25 vec4: under 4 per lane of 8)
    ((1, 9, 132), -1),       # 33 vec4: one past lavapipe's 4 x 8 in registers, so they stream
    ((3, 37), -1),           # row length not a multiple of 4
    ((2, 6, 37), -2),        # normalise over the last two dims
    ((2, 3, 5, 7), -1),      # textures: channels-packed, lanes are 4 separate rows
    ((2, 6, 5, 7), 1),       # textures: channels-packed, the packed dim inside the row
    ((5, 1280), 0)])         # one row of 6400; Whisper large's width
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(shape, axis, bias):
    m, inits = layer_norm_model(shape, axis, bias)
    x = rand(*shape, seed=7) + OFFSET
    check_model(m, {"x": x})
    # also against float64 maths on the same fp32 input: far tighter than fp32 onnxruntime itself
    node = load(m).nodes[0]
    want = ops.OPS["LayerNormalization"].reference(node, x.astype(np.float64), *inits.values())[0]
    for st in ("buffer", "texture"):
        with Session(m, storage=st) as s:
            compare(s.run(None, {"x": x})[0], want, 2e-6, f"{st} vs float64")


@pytest.mark.parametrize("inv", [8, 64, 256])
def test_layer_norm_rows_any_group_size(inv):
    """Session option rows_invocations (256 by default on NVIDIA): rows a work group = invocations / subgroup size;
    67 rows leave the last group part empty, and a request below one subgroup gets one whole subgroup."""
    m, inits = layer_norm_model((1, 67, 384), -1, seed=3)
    x = rand(1, 67, 384, seed=inv) + OFFSET
    node = load(m).nodes[0]
    want = ops.OPS["LayerNormalization"].reference(node, x.astype(np.float64), *inits.values())[0]
    with Session(m, storage="buffer", options={"poison": True, "rows_invocations": inv}) as s:
        ln = [d for d in s.plan.dispatches if d.kernel.startswith("layer_norm_rows")]
        if s.device.profile.tuning.subgroup_rows:
            sg = s.device.profile.subgroup_size
            assert ln and ln[0].global_size[0] == max(inv, sg)     # at least one whole subgroup
            per = max(1, max(inv, sg) // sg)
            assert ln[0].global_size[1] == -(-67 // per)
        compare(s.run(None, {"x": x})[0], want, 2e-6, f"{inv} invocations vs float64")


def test_layer_norm_broadcast_scale_and_epsilon():
    m, _ = layer_norm_model((2, 6, 37), -2, scale_shape=(37,), epsilon=0.1)
    check_model(m, {"x": rand(2, 6, 37, low=-0.2, high=0.2)})   # variance ~ epsilon: epsilon matters


@pytest.mark.parametrize("shape,axis", [
    ((5, 37), -1), ((5, 37), 0), ((5, 37), 1), ((3, 5, 7), -1), ((3, 5, 7), 1), ((3, 5, 7), 0),
    ((2, 6, 5, 7), -1), ((2, 6, 5, 7), 1), ((2, 6, 5, 7), 0), ((2, 6, 5, 7), -2), ((1, 2, 150, 150), -1)])
def test_softmax(shape, axis):
    m = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], {"x": shape}, ["y"], opset=13)
    check_model(m, {"x": rand(*shape, low=-50, high=50)}, tol=1e-5)


def test_softmax_logits_too_large_for_exp():
    """exp(110) overflows fp32: only a max-subtracted softmax gets these right."""
    m = make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": (3, 40)}, ["y"], opset=13)
    check_model(m, {"x": rand(3, 40, low=-50, high=50) + 60}, tol=1e-5)


@pytest.mark.parametrize("shape,axis", [((2, 6, 5, 7), None), ((2, 6, 5, 7), 2), ((2, 6, 5, 7), -1), ((5, 37), 0)])
def test_softmax_before_opset_13_coerces_to_2d(shape, axis):
    attrs = {} if axis is None else {"axis": axis}
    m = make_model([helper.make_node("Softmax", ["x"], ["y"], **attrs)], {"x": shape}, ["y"], opset=11)
    check_model(m, {"x": rand(*shape, low=-50, high=50)}, tol=1e-5)


def reduce_model(op, shape, axes, keepdims, opset, noop=None):
    attrs = {"keepdims": keepdims} if keepdims is not None else {}
    if noop is not None:
        attrs["noop_with_empty_axes"] = noop
    inits, names = {}, ["x"]
    if axes is not None and opset >= (13 if op == "ReduceSum" else 18):
        inits["axes"] = np.array(axes, np.int64)
        names.append("axes")
    elif axes is not None:
        attrs["axes"] = axes
    return make_model([helper.make_node(op, names, ["y"], **attrs)], {"x": shape}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("shape,axes", [
    ((2, 3, 5, 6), [1]), ((2, 3, 5, 6), [3]), ((2, 3, 5, 6), [0, 2]), ((2, 3, 5, 6), [1, 2, 3]),
    ((2, 3, 5, 6), [-1, -2]), ((2, 3, 5, 6), None), ((7, 9), [0]), ((7, 9), [1]), ((3, 5, 9), [0, 2])])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [17, 18])
def test_reduce_mean(shape, axes, keepdims, opset):
    # inputs off centre: the mean of all 180 values of a zero-centred input can land within 1e-5 of 0, where the
    # tolerance relative to max|ref| falls below the summation's rounding
    check_model(reduce_model("ReduceMean", shape, axes, keepdims, opset), {"x": rand(*shape, low=-0.5, high=1.5)})


@pytest.mark.parametrize("noop", [0, 1])
def test_reduce_mean_empty_axes(noop):
    m = reduce_model("ReduceMean", (3, 5, 6), [], 0, 18, noop)
    # off centre for the reason test_reduce_mean gives: with noop 0 this is one mean of 90 values
    check_model(m, {"x": rand(3, 5, 6, low=-0.5, high=1.5)})


@pytest.mark.parametrize("op,opset", [("ReduceSum", 13), ("ReduceSum", 11), ("ReduceMax", 18), ("ReduceMin", 13),
                                      ("ReduceL2", 18), ("ReduceL2", 13)])
def test_other_reductions(op, opset):
    check_model(reduce_model(op, (2, 3, 5, 6), [1, 3], 1, opset), {"x": rand(2, 3, 5, 6)})
    check_model(reduce_model(op, (7, 9), [-1], 0, opset), {"x": rand(7, 9)})


def test_reduce_l2_whose_squares_overflow():
    """Rows of values around 1e20 to 1e36 (their squares past float32's range) give the exact norm, rounded; a row
    with an inf gives inf."""
    x = (rand(5, 9, seed=3) * 10.0 ** np.array([20, 26, 32, 36, 20])[:, None]).astype(np.float32)
    x[4, 4] = np.inf
    want = np.sqrt((x.astype(np.float64) ** 2).sum(-1, keepdims=True)).astype(np.float32)
    for storage in ("buffer", "texture"):
        with Session(reduce_model("ReduceL2", x.shape, [-1], 1, 18), storage=storage) as s:
            np.testing.assert_allclose(s.run(x), want, rtol=1e-5, err_msg=storage)


@pytest.mark.parametrize("shape", [(2, 6, 5, 7), (1, 3, 9), (2, 4, 64)])
def test_instance_norm(shape):
    """Per-channel scale and bias on layer_norm.comp: rank 4 (channels-packed in textures: a texel's lanes are 4
    channels) and rank 3."""
    c = shape[1]
    m = make_model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)], {"x": shape},
                   ["y"], {"s": rand(c, seed=1), "b": rand(c, seed=2)})
    check_model(m, {"x": rand(*shape, seed=3, low=-1, high=3)})


def test_instance_norm_scale_computed_at_run_time_is_refused():
    m = make_model([helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="norm")],
                   {"x": (1, 3, 4, 4), "s": (3,)}, ["y"], {"b": rand(3)})
    with pytest.raises(UnsupportedError, match="InstanceNormalization node 'norm': scale \\('s'\\) is computed"):
        Session(m)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 6, 5, 7), (1, 5, 9)])
def test_global_pools(op, shape):
    check_model(make_model([helper.make_node(op, ["x"], ["y"])], {"x": shape}, ["y"]), {"x": rand(*shape)})


def test_numpy_references_match_onnxruntime():
    cases = [(layer_norm_model((2, 6, 37), -2)[0], (2, 6, 37)),
             (layer_norm_model((3, 37), -1, bias=False)[0], (3, 37)),
             (make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 3, 5)}, ["y"], opset=13),
              (2, 3, 5)),
             (make_model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": (2, 3, 5)}, ["y"], opset=11),
              (2, 3, 5)),
             (reduce_model("ReduceMean", (2, 3, 5, 6), [0, 2], 0, 18), (2, 3, 5, 6)),
             (reduce_model("ReduceMean", (2, 3, 5, 6), [-1], 1, 17), (2, 3, 5, 6)),
             (reduce_model("ReduceMean", (3, 4), [], 1, 18, 1), (3, 4)),
             (reduce_model("ReduceSum", (2, 3, 5), None, 0, 13), (2, 3, 5)),
             (reduce_model("ReduceMax", (2, 3, 5), [1], 1, 18), (2, 3, 5)),
             (reduce_model("ReduceMin", (2, 3, 5), [0, 1], 0, 17), (2, 3, 5))]
    for m, shape in cases:
        x = rand(*shape, low=-30, high=30) + (OFFSET if m.graph.node[0].op_type == "LayerNormalization" else 0)
        g = load(m)
        node = g.nodes[0]
        got = ops.OPS[node.op].reference(node, x, *[g.tensor(n).data for n in node.inputs[1:]])[0]
        ref = onnxruntime_run(m, {"x": x})[0]
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=2e-5, err_msg=node.op)


def test_integer_reductions_fold_at_load():
    """Reductions of int64 shape arithmetic fold on the CPU and keep their dtype."""
    node = load(reduce_model("ReduceSum", (3,), [0], 0, 13)).nodes[0]
    got = ops.OPS["ReduceSum"].reference(node, np.array([2, 3, 4], np.int64), np.array([0], np.int64))[0]
    assert got.dtype == np.int64 and got == 9


@pytest.mark.parametrize("case", ["runtime scale", "mean output", "runtime axes"])
def test_unsupported_configurations_name_the_node(case):
    if case == "runtime scale":
        node = helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="n0")
        m = make_model([node], {"x": (2, 8), "s": (8,)}, ["y"])
    elif case == "mean output":
        node = helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean"], name="n0")
        m = make_model([node], {"x": (2, 8)}, ["y"], {"s": np.ones(8, np.float32)})
    else:
        m = make_model([helper.make_node("ReduceMean", ["x", "a"], ["y"], name="n0")], {"x": (2, 8)}, ["y"], opset=18)
        m.graph.input.append(helper.make_tensor_value_info("a", TensorProto.INT64, (1,)))
    with pytest.raises(UnsupportedError, match="n0"):
        Session(m, storage="buffer")
