"""BatchNormalization in inference mode (minirt/ops/batch_norm.py; folded into a Conv before it by fold_batch_norm)
against onnxruntime in both storages with poisoned activations: a pre-activation block (BatchNorm -> Relu -> Conv,
which no exporter folds), a BatchNorm1d after a Gemm (rank 2) and over a sequence (rank 3); what it does not run is
refused at load, every node named at once."""
import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.errors import UnsupportedError
from oracle import check_model, make_model, rand


def bn_inits(prefix, c, seed):
    rng = np.random.default_rng(seed)
    return {f"{prefix}_s": rng.uniform(0.5, 1.5, c).astype(np.float32),
            f"{prefix}_b": rng.normal(0, 0.1, c).astype(np.float32),
            f"{prefix}_m": rng.normal(0, 0.3, c).astype(np.float32),
            f"{prefix}_v": rng.uniform(0.5, 1.5, c).astype(np.float32)}


def bn(prefix, x, y, **attrs):
    return helper.make_node("BatchNormalization", [x] + [f"{prefix}_{k}" for k in "sbmv"], [y], **attrs)


def test_pre_activation_block():
    nodes = [bn("bn", "x", "n", epsilon=1e-3), helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Conv", ["r", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    model = make_model(nodes, {"x": [2, 6, 7, 5]}, ["y"], {**bn_inits("bn", 6, 1), "w": rand(4, 6, 3, 3, seed=2)})
    check_model(model, {"x": rand(2, 6, 7, 5, seed=3, low=-2, high=2)})


@pytest.mark.parametrize("shape", [(3, 10), (2, 5, 9)])
def test_batch_norm_1d(shape):
    model = make_model([bn("bn", "x", "y")], {"x": list(shape)}, ["y"], bn_inits("bn", shape[1], 4))
    check_model(model, {"x": rand(*shape, seed=5, low=-2, high=2)})


def test_what_it_does_not_run_is_refused_naming_every_node():
    nodes = [bn("a", "x", "h", training_mode=1), helper.make_node("Relu", ["x"], ["m"]),
             helper.make_node("BatchNormalization", ["h", "a_s", "a_b", "m", "a_v"], ["y"])]
    model = make_model(nodes, {"x": [1, 4, 3, 3]}, ["y"], bn_inits("a", 4, 6), opset=15)
    with pytest.raises(UnsupportedError, match="2 node") as e:
        Session(model, storage="buffer")
    assert "training_mode=1" in str(e.value) and "input_mean ('m') is computed at run time" in str(e.value)


@pytest.mark.parametrize("group, bias", [(1, True), (4, False)])
def test_batch_norm_after_a_conv_folds_into_it(group, bias):
    """A model exported without constant folding keeps Conv -> BatchNormalization: fold_batch_norm folds it into the
    conv's weight and bias (a grouped conv, a conv without a bias too)."""
    from oracle import graph_after
    nodes = [helper.make_node("Conv", ["x", "w"] + (["cb"] if bias else []), ["c"], kernel_shape=[3, 3],
                              pads=[1, 1, 1, 1], group=group), bn("bn", "c", "y", epsilon=1e-3)]
    inits = {**bn_inits("bn", 8, 7), "w": rand(8, 8 // group, 3, 3, seed=8), "cb": rand(8, seed=9)}
    if not bias:
        del inits["cb"]
    model = make_model(nodes, {"x": [1, 8, 6, 5]}, ["y"], inits)
    g = graph_after(model, {"x": (1, 8, 6, 5)}, "fold_batch_norm")
    assert [n.op for n in g.nodes] == ["Conv"] and g.nodes[0].outputs == ["y"]
    check_model(model, {"x": rand(1, 8, 6, 5, seed=10, low=-2, high=2)})
    g = graph_after(model, {"x": (1, 8, 6, 5)}, "fold_batch_norm", fold_batch_norm=False)
    assert [n.op for n in g.nodes] == ["Conv", "BatchNormalization"]
