"""ReplaceNaN: Where(IsNaN(x), c, x), the guard exporters write after a masked softmax, folded when a graph is
prepared (minirt.infer.fold_nan_guards) into one op, so no boolean tensor is made. Checked on the prepared graph and
against onnxruntime (both storages, poisoned) with rows that are all mask; guards it must not fold stay refused."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from minirt import Session
from minirt.errors import UnsupportedError
from minirt.infer import prepare
from minirt.loaders import load
from oracle import check_model


def guard_model(value=0.0, reuse=False, runtime_c=False):
    """x [3, 9] -> Softmax -> Where(IsNaN(p), c, p); reuse: IsNaN's output is also a graph output (cast to float);
    runtime_c: c a graph input instead of a constant."""
    nodes = [helper.make_node("Softmax", ["x"], ["p"], axis=-1), helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "c", "p"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 9])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 9])]
    inits = [] if runtime_c else [numpy_helper.from_array(np.array(value, np.float32), "c")]
    if runtime_c:
        inputs.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, []))
    if reuse:
        nodes.append(helper.make_node("Cast", ["nan"], ["nanf"], to=TensorProto.FLOAT))
        outputs.append(helper.make_tensor_value_info("nanf", TensorProto.FLOAT, [3, 9]))
    g = helper.make_graph(nodes, "guard", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(seed):
    x = np.random.default_rng(seed).standard_normal((3, 9)).astype(np.float32)
    x[1] = -np.inf          # a row that is all mask: softmax gives NaN there
    x[2, :4] = -np.inf
    return {"x": x}


@pytest.mark.parametrize("value", [0.0, -2.5])
def test_guard_is_folded_and_matches_onnxruntime(value):
    g = prepare(load(guard_model(value)))
    assert [n.op for n in g.nodes] == ["Softmax", "ReplaceNaN"] and g.nodes[1].attrs == {"value": value}
    refs = check_model(guard_model(value), feeds(3 if value else 4))
    assert np.isnan(refs[0]).sum() == 0 and (refs[0][1] == value).all()


@pytest.mark.parametrize("kind", ["reuse", "runtime_c"])
def test_guards_it_cannot_fold_are_refused(kind):
    with pytest.raises(UnsupportedError, match="IsNaN"):
        Session(guard_model(**{kind: True}))
