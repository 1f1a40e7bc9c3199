"""onnxruntime's quantize_dynamic models (DynamicQuantizeLinear + MatMulInteger + Cast + Mul) on the int8 GEMM: the
rewrite on the graph (fold_dynamic_quantize), and the result against onnxruntime running the same model, per tensor
and per channel, few rows and many, fp32 and fp16 (poisoned activations)."""
import numpy as np
import onnx
import pytest
from onnx import helper

from minirt import Session
from minirt.infer import prepare
from minirt.loaders import load
from minirt.options import Options
from minirt.planner import fold_dynamic_quantize
from oracle import compare, make_model, onnxruntime_run


def dynamic_model(tmp_path, t, k, n, per_channel, seed=0):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])],
                   {"x": (1, t, k)}, ["y"], {"w": w, "b": b})
    src, dst = tmp_path / "f.onnx", tmp_path / "d.onnx"
    onnx.save(m, str(src))
    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel)
    return onnx.load(str(dst)), {"x": rng.standard_normal((1, t, k)).astype(np.float32)}


def test_rewrite_on_the_graph(tmp_path):
    model, _ = dynamic_model(tmp_path, 2, 16, 8, per_channel=True)
    g = prepare(load(model))
    assert {"DynamicQuantizeLinear", "MatMulInteger", "Cast"} <= {n.op for n in g.nodes}
    g = fold_dynamic_quantize.rewrite(g, Options.make({}))
    ops = [n.op for n in g.nodes]
    assert "MatMulInteger" not in ops and "Cast" not in ops and ops[0] == "DynamicQuantize"
    (lin,) = [n for n in g.nodes if n.op == "Linear"]
    assert lin.inputs[0] == g.nodes[0].outputs[0] and g.tensor(lin.inputs[1]).data.dtype == np.int8


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("t,per_channel", [(1, False), (3, True), (12, True)])
def test_quantize_dynamic_matches_onnxruntime(tmp_path, t, per_channel, precision):
    model, feeds = dynamic_model(tmp_path, t, 32, 24, per_channel, seed=t)
    with Session(model.SerializeToString(), storage="buffer", options={"poison": True, "precision": precision}) as s:
        kernels = [d.kernel for d in s.plan.dispatches]
        assert any(k.startswith("dynamic_quantize") for k in kernels) and any("_i8" in k for k in kernels)
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5 if precision == "fp32" else 4e-3)
