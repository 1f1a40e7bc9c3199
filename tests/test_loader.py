"""ONNX loading: sources, constants, external data confinement, errors that name what is wrong."""
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from minirt.errors import ModelError, UnsupportedError
from minirt.infer import prepare
from minirt.loaders import load
from oracle import make_model, rand


def _model():
    w = rand(4, 3, seed=0)
    return make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                      {"x": (2, 4)}, ["y"], {"w": w})


def test_loads_from_path_bytes_and_proto(tmp_path):
    m = _model()
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    for src in (m, m.SerializeToString(), str(p), p):
        g = load(src)
        assert [n.op for n in g.nodes] == ["MatMul", "Relu"]
        assert g.tensor("w").is_const and g.tensor("w").data.shape == (4, 3)
        assert g.inputs == ["x"] and g.outputs == ["y"]


def test_constant_nodes_become_constants():
    c = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.float32([1, 2, 3]), "c"))
    s = helper.make_node("Constant", [], ["s"], value_float=2.0)
    m = make_model([c, s, helper.make_node("Mul", ["x", "c"], ["t"]), helper.make_node("Mul", ["t", "s"], ["y"])],
                   {"x": (3,)}, ["y"])
    g = load(m)
    assert [n.op for n in g.nodes] == ["Mul", "Mul"]
    np.testing.assert_array_equal(g.tensor("c").data, [1, 2, 3])
    assert float(g.tensor("s").data) == 2.0


def test_every_unsupported_op_is_reported_at_once():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("NonMaxSuppression", ["a"], ["b"], name="nms"),
             helper.make_node("Mystery", ["b"], ["c"], name="custom", domain="com.example"),
             helper.make_node("LSTM", ["c"], ["y"], name="rnn")]
    g = load(make_model(nodes, {"x": (3,)}, ["y"]))
    with pytest.raises(UnsupportedError) as e:
        prepare(g)
    msg = str(e.value)
    for needle in ("NonMaxSuppression", "'nms'", "Mystery", "com.example", "'custom'", "LSTM", "'rnn'"):
        assert needle in msg
    assert len(e.value.items) == 3


def test_external_data_inside_folder_is_read(tmp_path):
    m = _model()
    onnx.save(m, tmp_path / "m.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.data", size_threshold=0)
    g = load(tmp_path / "m.onnx")
    np.testing.assert_array_equal(g.tensor("w").data, numpy_helper.to_array(_model().graph.initializer[0]))


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../x.bin"])
def test_external_data_escaping_the_folder_is_refused(tmp_path, location):
    m = _model()
    init = m.graph.initializer[0]
    raw = init.raw_data or numpy_helper.from_array(numpy_helper.to_array(init)).raw_data
    init.ClearField("raw_data")
    init.ClearField("float_data")
    init.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(len(raw)))):
        e = init.external_data.add()
        e.key, e.value = k, v
    (tmp_path / "secret.bin").write_bytes(raw)
    d = tmp_path / "model"
    d.mkdir()
    (d / "m.onnx").write_bytes(m.SerializeToString())
    with pytest.raises(ModelError, match="outside the model's folder"):
        load(d / "m.onnx")


def test_truncated_file_is_a_model_error(tmp_path):
    data = _model().SerializeToString()
    p = tmp_path / "cut.onnx"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="cut.onnx"):
        load(p)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(ModelError, match="nothere.onnx"):
        load(tmp_path / "nothere.onnx")


def test_cycle_is_refused():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
             helper.make_node("Relu", ["b"], ["y"], name="n3")]
    m = make_model(nodes, {"x": (3,)}, ["y"])
    with pytest.raises(ModelError, match="cycle"):
        prepare(load(m))


def test_undefined_input_is_named():
    m = make_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")], {"x": (3,)}, ["y"])
    with pytest.raises(ModelError, match="ghost"):
        load(m)
