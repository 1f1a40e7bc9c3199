"""GatherND against onnxruntime: constant indices (batch_dims 0 and 1, whole slices and single elements, negative
indices) in both storages with poisoned activations; int32 indices given at run time and cast to int64 (picking along
axis 0, buffer storage at fp32); what cannot run is refused at load."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from minirt import Session, UnsupportedError
from oracle import check_model, compare, make_model, onnxruntime_run, rand


@pytest.mark.parametrize("shape, indices, batch_dims", [
    ((4, 5, 6), [[1], [3], [0], [3]], 0),
    ((4, 5, 6), [[1, 2], [3, -1], [0, 0]], 0),
    ((4, 5, 6), [[[1, 2, 3]], [[3, 4, 5]]], 0),
    ((3, 5, 6), [[[1], [4]], [[0], [0]], [[2], [3]]], 1),
    ((2, 3, 4, 5), [[[0, 1], [2, 3]], [[1, 1], [0, 0]]], 1)])
def test_constant_indices_match_onnxruntime(shape, indices, batch_dims):
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    m = make_model([node], {"x": shape}, ["y"], {"i": np.array(indices, np.int64)}, opset=13)
    check_model(m, {"x": rand(*shape, seed=1)})


def _runtime_model(x_shape, i_shape):
    """int32 indices given at run time, cast to the int64 ONNX's GatherND takes (the Cast is dropped at load)."""
    g = helper.make_graph([helper.make_node("Cast", ["i"], ["i64"], to=TensorProto.INT64),
                           helper.make_node("GatherND", ["x", "i64"], ["y"], name="gnd")], "test",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape),
                           helper.make_tensor_value_info("i", TensorProto.INT32, i_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def test_runtime_int32_indices_match_onnxruntime():
    m = _runtime_model([6, 4, 5], [2, 3, 1])
    x = rand(6, 4, 5, seed=2)
    with Session(m, storage="buffer", options={"poison": True}) as s:
        for seed in (3, 4):
            i = np.random.default_rng(seed).integers(0, 6, size=(2, 3, 1)).astype(np.int32)
            compare(s.run(None, {"x": x, "i": i})[0], onnxruntime_run(m, {"x": x, "i": i})[0], 0, f"seed {seed}")


def test_runtime_indices_past_axis_0_are_refused_naming_the_node():
    with pytest.raises(UnsupportedError, match="GatherND node 'gnd': indices computed at run time .*last dim 1"):
        Session(_runtime_model([6, 4, 5], [3, 2]), storage="buffer")
