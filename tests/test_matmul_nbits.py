"""onnxruntime's MatMulNBits (com.microsoft, blockwise 4-bit weights) on the w=q4 variants of the buffer GEMMs
(linear_rows for a few rows, the tiled linear otherwise), against onnxruntime running the same model and a float64
numpy reference on the dequantized weights (poisoned activations, fp32 and fp16); the plan keeps the weight at half
a byte an element; bad blocks, shapes and zero points are ModelErrors naming the tensor."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from minirt import Session
from minirt.errors import ModelError
from oracle import compare, onnxruntime_run


def nbits_model(m, k, n, block, *, seed, zero="packed", bias=False):
    """(model, feeds, float64 W [K, N], bias): A [1, m, k] @ MatMulNBits(B), with random 4-bit weights, scales and
    zero points (packed uint8, float, or none)."""
    rng = np.random.default_rng(seed)
    blocks = -(-k // block)
    q = rng.integers(0, 16, size=(n, blocks * block)).astype(np.uint8)
    q[:, k:] = 0
    b = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(n, blocks, block // 2)
    s = rng.uniform(0.01, 0.05, size=(n, blocks)).astype(np.float32)
    inits = {"B": b, "scales": s.reshape(-1)}
    z = np.full((n, blocks), 8.0)
    ins = ["A", "B", "scales"]
    if zero == "packed":
        zq = rng.integers(0, 16, size=(n, 2 * -(-blocks // 2))).astype(np.uint8)
        inits["zp"] = (zq[:, 0::2] | (zq[:, 1::2] << 4)).reshape(-1)
        z = zq[:, :blocks].astype(np.float64)
        ins.append("zp")
    elif zero == "float":
        zf = rng.integers(0, 16, size=(n, blocks)).astype(np.float32)
        inits["zp"] = zf.reshape(-1)
        z = zf.astype(np.float64)
        ins.append("zp")
    bvec = None
    if bias:
        bvec = rng.standard_normal(n).astype(np.float32)
        inits["bias"] = bvec
        ins += [""] * (4 - len(ins)) + ["", "bias"]
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=k, N=n, bits=4, block_size=block)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, m, k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, name) for name, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    rows = np.arange(k) // block
    w = ((q[:, :k].astype(np.float64) - z[:, rows]) * s[:, rows]).T
    return model, {"A": rng.standard_normal((1, m, k)).astype(np.float32)}, w, bvec


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("m,k,n,block,zero,bias,kernel", [
    (1, 64, 20, 16, "packed", True, "linear_rows"),     # a decoder step's row, the bias as MatMulNBits' input 5
    (3, 80, 9, 32, "none", False, "linear_rows"),       # K not a multiple of the block: a short last block
    (12, 48, 24, 16, "float", False, "linear_t44"),     # the tiled GEMM
])
def test_matmul_nbits(precision, m, k, n, block, zero, bias, kernel):
    model, feeds, w, b = nbits_model(m, k, n, block, seed=m + k, zero=zero, bias=bias)
    with Session(model, storage="buffer", options={"poison": True, "precision": precision}) as s:
        (d,) = [x for x in s.plan.dispatches if x.op == "MatMulNBits"]
        assert d.kernel.startswith(kernel) and "_q4" in d.kernel
        (wq,) = [t for t in s.plan.tensors.values() if t.dtype == "uint4"]
        assert wq.nbytes == k * -(-n // 4) * 2
        got = s.run(None, feeds)[0]
    ref = feeds["A"].astype(np.float64) @ w + (0 if b is None else b)
    tol = 1e-5 if precision == "fp32" else 4e-3
    compare(got, ref, tol, f"{kernel} {precision}")
    if precision == "fp32":
        compare(got, onnxruntime_run(model, feeds)[0], 1e-4, "onnxruntime")


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("m,k,block,opts", [
    (1, 260, 32, {"gemm_splitk": 3}),                           # splits start and end inside blocks
    (2, 260, 16, {"rows_columns": 4, "local_size": (3, 5, 1)}),  # k runs of 22 vec4 rows over 4-row blocks
    (8, 80, 32, {"rows_columns": 1}),                           # the most rows; a short last block
    (5, 132, 64, {"gemm_splitk": 2}),                           # one block and a short one, split between them
    (1, 260, 32, {"n": 208}),                                   # 52 vec4 columns: 8-byte loads of 4 (VEC)
    (4, 132, 16, {"n": 208, "gemm_splitk": 3}),
    (5, 260, 32, {"n": 208}),                                   # beams: 2 columns a lane, 4-byte loads of 2
])
def test_rows_layouts(precision, m, k, block, opts):
    """The few-row kernel's layouts on 4-bit weights: each lane's run of K crosses blocks where the splits and k runs
    fall, its block sums added scaled as it leaves each; 75 columns (19 vec4: no whole group) or 208 (52 vec4: 8-byte
    loads of 4 vec4 columns)."""
    opts = dict(opts)
    n = opts.pop("n", 75)
    model, feeds, w, b = nbits_model(m, k, n, block, seed=50 + m, zero="packed", bias=True)
    with Session(model, storage="buffer", options={"poison": True, "precision": precision, **opts}) as s:
        (d,) = [x for x in s.plan.dispatches if x.op == "MatMulNBits" and x.kernel.startswith("linear_rows")]
        assert "_q4" in d.kernel and d.info["splits"] == opts.get("gemm_splitk", 1)
        assert d.info["vec"] == (n == 208 and d.info["cv"] > 1)
        got = s.run(None, feeds)[0]
    ref = feeds["A"].astype(np.float64) @ w + b
    compare(got, ref, 1e-5 if precision == "fp32" else 4e-3, f"{m} rows {opts} {precision}")


def test_bad_matmul_nbits_name_the_tensor():
    model, _, _, _ = nbits_model(1, 64, 8, 16, seed=0)
    node = model.graph.node[0]
    for a in node.attribute:
        if a.name == "block_size":
            a.i = 24
    with pytest.raises(ModelError, match="block_size 24"):
        Session(model)
    model, _, _, _ = nbits_model(1, 64, 8, 16, seed=0, zero="float")
    init = next(i for i in model.graph.initializer if i.name == "zp")
    init.CopyFrom(numpy_helper.from_array(np.full(8 * 4, 17, np.float32), "zp"))
    with pytest.raises(ModelError, match="zero points 'zp' hold values outside 0..15"):
        Session(model)
    model, _, _, _ = nbits_model(1, 64, 8, 16, seed=0)
    init = next(i for i in model.graph.initializer if i.name == "scales")
    init.CopyFrom(numpy_helper.from_array(np.ones(7, np.float32), "scales"))
    with pytest.raises(ModelError, match="scales 'scales'"):
        Session(model)
