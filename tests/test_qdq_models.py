"""QDQ models beyond weight-only int8 MatMuls: onnxruntime's quantize_static (QDQ, per channel) of a small convnet
(Conv weights int8 on the GEMM routes, the activations' Q/DQ pairs folded into QuantizeDequantize), blocked 4-bit
DequantizeLinear (opset 21, int4 / uint4 initializers) into MatMul and Gemm on the w=q4 kernels, the quantize_weights
option on Conv weights, and bad quantization parameters. Against onnxruntime (its own quantizer's models, graph
optimizations off so it runs each Q and DQ as written), fresh random inputs, poisoned activations; the rewrites are
checked on the Plan's dispatches and notes."""
import re
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cnn_models import resnet
from minirt import Session
from minirt.errors import ModelError, UnsupportedError
from minirt.plan import WEIGHT
from oracle import compare, make_model, onnxruntime_run


def _notes(plan):
    return [t for v in plan.notes.values() for t in v]


def _quantized_resnet(tmp_path, seed=0):
    """quantize_static (QDQ, per-channel int8 weights, uint8 activations) of a two-stage bottleneck ResNet on 16x16
    images: 7x7 stem, max pooling, 1x1 and 3x3 convs, skip convs, a Gemm head."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    rng = np.random.default_rng(seed)
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(resnet(stages=((4, 1, 1), (8, 1, 2)), stem=8, classes=10, batch=1, image=16, seed=seed), str(src))

    class Data(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(src), str(dst), Data(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    return onnx.load(str(dst)), rng


@pytest.mark.parametrize("storage,options", [("buffer", {}), ("buffer", {"conv_route": "im2col"}),
                                             ("texture", {})])
def test_quantize_static_convnet(tmp_path, storage, options):
    """Every Q/DQ pair of the activations is one QuantizeDequantize (or none, after max pooling and Flatten, which
    keep the grid); Conv weights stay int8 on the buffer GEMM routes and are dequantized at planning, with a note,
    on routes without an int8 kernel; the result is onnxruntime's (the same float operations, so to rounding)."""
    model, rng = _quantized_resnet(tmp_path)
    feeds = {"x": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    with Session(model.SerializeToString(), storage=storage, options={"poison": True, **options}) as s:
        ops = Counter(op for op, _node in {(d.op, d.node) for d in s.plan.dispatches})    # nodes per op
        notes = _notes(s.plan)
        got = s.run(None, feeds)[0]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert ops["QuantizeDequantize"] == 14 and ops["Conv"] == 9
    assert sum("already on its grid" in t for t in notes) == 2
    int8_convs = sum("(QDQ), a scale an output channel, on the int8 GEMM" in t for t in notes)
    float_convs = sum("int8 weight dequantized to float at planning: route" in t for t in notes)
    assert int8_convs + float_convs == 9
    if storage == "buffer":
        assert int8_convs >= (9 if options else 5)
        assert any("_i8" in d.kernel for d in s.plan.dispatches if d.op == "Conv")
    else:
        assert int8_convs == 0
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5)


def _blocked(k, n, block, signed, *, trans=False, zero=True, gemm=False, seed=0):
    """x [1, 3, k] @ DequantizeLinear(W 4-bit, blocked along K) (+ C): (model, feeds); W is [K, N], or [N, K] read by a
    transB Gemm."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    dt, lo, hi = (ml_dtypes.int4, -8, 8) if signed else (ml_dtypes.uint4, 0, 16)
    blocks = -(-k // block)
    wshape, sshape, axis = ((n, k), (n, blocks), 1) if trans else ((k, n), (blocks, n), 0)
    inits = {"q": rng.integers(lo, hi, size=wshape).astype(dt),
             "s": (rng.uniform(0.5, 2.0, size=sshape) / (4 * np.sqrt(k))).astype(np.float32)}
    dq_in = ["q", "s"]
    if zero:
        inits["z"] = rng.integers(lo, hi, size=sshape).astype(dt)
        dq_in.append("z")
    nodes = [helper.make_node("DequantizeLinear", dq_in, ["w"], axis=axis, block_size=block)]
    x = (3, k) if gemm else (1, 3, k)
    if gemm:
        inits["c"] = rng.standard_normal(n).astype(np.float32)
        nodes.append(helper.make_node("Gemm", ["x", "w", "c"], ["h"], transB=int(trans), alpha=0.5, beta=2.0))
    else:
        nodes.append(helper.make_node("MatMul", ["x", "w"], ["h"]))
    nodes.append(helper.make_node("Relu", ["h"], ["y"]))
    model = make_model(nodes, {"x": x}, ["y"], inits, opset=21)
    return model, {"x": rng.standard_normal(x).astype(np.float32)}


@pytest.mark.parametrize("k,n,block,signed,trans,zero,gemm", [
    (64, 24, 16, True, False, True, False),      # int4 with zero points, MatMul
    (48, 20, 32, False, False, False, False),    # uint4, no zero point (8), a partial last block of K
    (32, 12, 8, True, True, True, True),         # transB Gemm with alpha, beta, C
])
def test_blocked_4bit_dequantize_linear(k, n, block, signed, trans, zero, gemm):
    """A 4-bit DequantizeLinear blocked along K becomes a Linear of attribute block on the w=q4 GEMM: half a byte a
    weight in the plan (uint4), no float copy of it; onnxruntime's result."""
    model, feeds = _blocked(k, n, block, signed, trans=trans, zero=zero, gemm=gemm)
    with Session(model, storage="buffer", options={"poison": True}) as s:
        (lin,) = [d for d in s.plan.dispatches if d.op == "Linear"]
        assert "_q4" in lin.kernel
        assert [t for t in s.plan.tensors.values() if t.dtype == "uint4"]
        assert not [t for t in s.plan.tensors.values() if t.dtype == "float32" and t.numel == k * n]
        assert any("4-bit weight 'q'" in t for t in _notes(s.plan))
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5)


def test_blocked_4bit_on_textures_and_8bit_blocks_fold_to_float():
    """Texture storage has no 4-bit kernel: the weight is dequantized at planning, with a note. A blocked 8-bit
    weight (values past 4 bits) has no kernel of its own either: folded to float, with a note. Both onnxruntime's."""
    model, feeds = _blocked(32, 8, 16, True)
    with Session(model, storage="texture", options={"poison": True}) as s:
        assert any("4-bit weight dequantized to float at planning" in t for t in _notes(s.plan))
        compare(s.run(None, feeds)[0], onnxruntime_run(model, feeds)[0], 1e-5)
    rng = np.random.default_rng(3)
    inits = {"q": rng.integers(-127, 128, size=(32, 8)).astype(np.int8),
             "s": rng.uniform(0.01, 0.02, size=(2, 8)).astype(np.float32)}
    model = make_model([helper.make_node("DequantizeLinear", ["q", "s"], ["w"], axis=0, block_size=16),
                        helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (1, 3, 32)}, ["y"], inits, opset=21)
    feeds = {"x": rng.standard_normal((1, 3, 32)).astype(np.float32)}
    with Session(model, storage="buffer") as s:
        assert any("folded to a float constant (blocked along K" in t for t in _notes(s.plan))
        compare(s.run(None, feeds)[0], onnxruntime_run(model, feeds)[0], 1e-5)


def test_4bit_matmul_nbits_quantizer_qdq(tmp_path):
    """onnxruntime's own 4-bit weight quantizer in its QDQ form (blocked int4 DequantizeLinear), where installed."""
    mq = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer", exc_type=ImportError)
    from onnxruntime.quantization import QuantFormat
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (1, 4, 64)}, ["y"], {"w": w}, opset=21)
    q = mq.MatMulNBitsQuantizer(model, block_size=32, is_symmetric=False, quant_format=QuantFormat.QDQ)
    q.process()
    qm = q.model.model
    assert "DequantizeLinear" in [n.op_type for n in qm.graph.node]
    feeds = {"x": rng.standard_normal((1, 4, 64)).astype(np.float32)}
    with Session(qm.SerializeToString(), storage="buffer", options={"poison": True}) as s:
        assert any("_q4" in d.kernel for d in s.plan.dispatches if d.op == "Linear")
        compare(s.run(None, feeds)[0], onnxruntime_run(qm, feeds)[0], 1e-5)


def test_quantize_weights_covers_conv_weights():
    """Option quantize_weights=int8 on a float convnet: Conv weights on the buffer GEMM's routes become int8 a
    scale an output channel (symmetric, as minirt.quant.quantize_rows), the rest stay float with a note; near the
    float model (a float64 reference on the quantized weights is test_int8_linear's, for Linears)."""
    model = resnet(stages=((4, 1, 1), (8, 1, 2)), stem=8, classes=10, batch=1, image=16, seed=1)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    with Session(model, storage="buffer", options={"poison": True, "quantize_weights": "int8",
                                                   "conv_route": "im2col"}) as s:
        convs = [d for d in s.plan.dispatches if d.op == "Conv" and d.kernel.startswith("linear")]
        assert convs and all("_i8" in d.kernel for d in convs)
        assert sum("quantize_weights int8: weight [" in t for t in _notes(s.plan)) == 9
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 3e-2, "near the float model")
    with Session(model, storage="texture", options={"quantize_weights": "int8"}) as s:
        assert not [t for t in s.plan.tensors.values() if t.dtype == "int8"]
        assert any("quantize_weights int8: left float" in t for t in _notes(s.plan))


def _dq_matmul(inits, opset=21, **attrs):
    inputs = ["q", "s"] + (["z"] if "z" in inits else [])
    return make_model([helper.make_node("DequantizeLinear", inputs, ["w"], **attrs),
                       helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (1, 2, 8)}, ["y"], inits, opset=opset)


def test_bad_quantization_parameters_name_the_tensor():
    import ml_dtypes
    rng = np.random.default_rng(0)
    q4 = rng.integers(-8, 8, size=(8, 4)).astype(ml_dtypes.int4)
    bad = {
        # a scale shape that is neither blocks of 4 along K nor anything else
        "scale 's' [3, 4] does not fit blocks of 4": ({"q": q4, "s": np.ones((3, 4), np.float32)},
                                                     dict(axis=0, block_size=4)),
        # a zero point of another type than the weight (int8 beside int4), so beyond the weight's range
        "mixes int4 'q' and int8 'z'": ({"q": q4, "s": np.ones((2, 4), np.float32), "z": np.full((2, 4), 20, np.int8)},
                           dict(axis=0, block_size=4)),
        "scale 's' holds values that are not finite": ({"q": q4, "s": np.full(4, np.inf, np.float32)}, dict(axis=1)),
        "block_size -4 is negative": ({"q": q4, "s": np.ones((2, 4), np.float32)}, dict(axis=0, block_size=-4)),
        # blocks of 3 along K = 8: ceil(8 / 3) = 3 blocks (a partial last one, as ONNX allows), not 2
        "scale 's' [2, 4] does not fit blocks of 3 along axis 0 of 'q' [8, 4] (expected [3, 4])":
            ({"q": q4, "s": np.ones((2, 4), np.float32)}, dict(axis=0, block_size=3)),
    }
    for match, (inits, attrs) in bad.items():
        with pytest.raises((ModelError, UnsupportedError), match=re.escape(match)):
            Session(_dq_matmul(inits, **attrs))


def test_unpaired_run_time_dequantize_is_refused():
    """A QuantizeLinear whose int8 output is a graph output, or read by other than a DequantizeLinear, is refused
    naming the node; the Session of a good model stays usable after a failed run."""
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="quant"),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequant")]
    inits = {"s": np.float32(0.1), "z": np.uint8(128)}
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 5))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
                           helper.make_tensor_value_info("q", TensorProto.UINT8, None)],
                          [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with pytest.raises(UnsupportedError, match="QuantizeLinear node 'quant'"):
        Session(m)
    del m.graph.output[1]
    x = np.random.default_rng(2).uniform(-15, 15, size=(2, 5)).astype(np.float32)   # past the range: saturates
    with Session(m, options={"poison": True}) as s:
        compare(s.run(None, {"x": x})[0], onnxruntime_run(m, {"x": x})[0], 0)


@pytest.mark.parametrize("family,storages", [("mobilenet_v2_like", ("buffer", "texture")),
                                             ("convnext_like", ("buffer",)), ("wav2vec2_like", ("buffer",)),
                                             ("vit_like", ("buffer",))])
def test_quantize_static_families(tmp_path, family, storages):
    """quantize_static (QDQ, per channel) of small models of the families (models/families/): depthwise convs, ReLU6
    as Clip, LayerNorm over channels, GELU, GroupNorm, attention (timm's q, k, v split through a rank-5 tensor, with
    a Q/DQ pair after each step, which lie on the projection's grid and go); as onnxruntime runs each Q and DQ, with
    the Linear weights int8. (A UNet's bilinear Resize rounds its last bit unlike onnxruntime's, which the next
    quantization may turn into a level of difference: not here.)"""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from oracle import rand
    from test_families import FAMILIES
    src, dst = FAMILIES / f"{family}.onnx", tmp_path / "q.onnx"
    shape = [d.dim_value for d in onnx.load(src).graph.input[0].type.tensor_type.shape.dim]

    class Data(CalibrationDataReader):
        def __init__(self):
            self.items = iter([{"input": rand(*shape, seed=i)} for i in range(2)])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(src), str(dst), Data(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    model = onnx.load(str(dst))
    x = rand(*shape, seed=7)
    ref = onnxruntime_run(model, {"input": x})[0]
    for storage in storages:
        with Session(model, storage=storage, options={"poison": True}) as s:
            ops = {d.op for d in s.plan.dispatches}
            assert "QuantizeDequantize" in ops and not ops & {"QuantizeLinear", "DequantizeLinear"}
            assert storage == "texture" or [t for t in s.plan.tensors.values() if t.dtype == "int8"]
            compare(s.run(x), ref, 1e-5, f"{family} {storage}")


def _qdq_conv(c, o, k, *, dtype=np.int8, bn=False, conv1d=False, seed=0):
    """x -> Conv(DequantizeLinear(W int8 / uint8 [o, c, k(, k)], scale and zero point per output channel)) (->
    BatchNormalization) -> Relu: (model, feeds)."""
    rng = np.random.default_rng(seed)
    lo, hi = (-127, 128) if dtype == np.int8 else (0, 256)
    ks = (k,) if conv1d else (k, k)
    inits = {"q": rng.integers(lo, hi, size=(o, c, *ks)).astype(dtype),
             "s": (rng.uniform(0.5, 2.0, size=o) / (64 * np.sqrt(c * k * k))).astype(np.float32),
             "z": rng.integers(lo // 8 + (0 if dtype == np.int8 else 112), lo // 8 + (16 if dtype == np.int8 else 144),
                               size=o).astype(dtype),
             "b": rng.standard_normal(o).astype(np.float32)}
    nodes = [helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], axis=0),
             helper.make_node("Conv", ["x", "w", "b"], ["h"], pads=[k // 2] * (2 * len(ks)))]
    cur = "h"
    if bn:
        f32 = np.float32
        inits.update({"g": rng.uniform(0.5, 1.5, o).astype(f32), "beta": rng.standard_normal(o).astype(f32),
                      "mu": rng.standard_normal(o).astype(f32), "var": rng.uniform(0.5, 2, o).astype(f32)})
        nodes.append(helper.make_node("BatchNormalization", [cur, "g", "beta", "mu", "var"], ["hb"]))
        cur = "hb"
    nodes.append(helper.make_node("Relu", [cur], ["y"]))
    shape = (1, c, 24) if conv1d else (1, c, 6, 7)
    model = make_model(nodes, {"x": shape}, ["y"], inits, opset=17)
    return model, {"x": rng.standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("dtype,bn,conv1d", [(np.int8, False, False), (np.uint8, True, False), (np.int8, True, True)])
def test_qdq_conv_weights_int8_on_im2col(dtype, bn, conv1d):
    """A Conv's DequantizeLinear weight (per output channel, zero points, uint8 stored as int8 less 128) runs int8 on
    the im2col GEMM, also after a BatchNormalization folded into it (the scales take it) and as a 1-D conv rewritten
    to 2-D; the plan holds the weight as int8 and no float copy of it."""
    model, feeds = _qdq_conv(12, 20, 3, dtype=dtype, bn=bn, conv1d=conv1d)
    with Session(model, storage="buffer", options={"poison": True, "conv_route": "im2col"}) as s:
        assert any("(QDQ), a scale an output channel, on the int8 GEMM" in t for t in _notes(s.plan))
        gemm = [d for d in s.plan.dispatches if d.op == "Conv" and d.kernel.startswith("linear")]
        assert gemm and all("_i8" in d.kernel for d in gemm)
        assert [t for t in s.plan.tensors.values() if t.dtype == "int8"]
        assert not [t for t in s.plan.tensors.values() if t.role == WEIGHT and t.dtype == "float32" and
                    t.numel >= 20 * 12 * 3]
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 1e-5)


def test_rewrites_on_the_graph():
    """fold_dequantize_linear marks the Conv (_wq: a scale an output channel) and folds its weight to float;
    preparing the graph (minirt/qdq.py) makes a Q/DQ pair one QuantizeDequantize of the pair's scale and levels."""
    from minirt.infer import prepare
    from minirt.loaders import load
    from minirt.options import Options
    from minirt.planner import fold_dequantize_linear
    model, _ = _qdq_conv(4, 8, 3, dtype=np.uint8)
    nodes = list(model.graph.node)
    nodes[1].input[0] = "xd"
    del model.graph.node[:]
    model.graph.node.extend([helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
                             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])] + nodes)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
                                    numpy_helper.from_array(np.array(3, np.int8), "xz")])
    g = load(model)
    assert [n.op for n in g.nodes] == ["QuantizeLinear", "DequantizeLinear", "DequantizeLinear", "Conv", "Relu"]
    g = prepare(g)
    assert [n.op for n in g.nodes] == ["QuantizeDequantize", "DequantizeLinear", "Conv", "Relu"]
    assert g.nodes[0].inputs == ["x"] and g.nodes[0].attrs == {"scale": np.float32(0.05), "lo": -131.0, "hi": 124.0}
    g = fold_dequantize_linear.rewrite(g, Options.make({}))
    assert [n.op for n in g.nodes] == ["QuantizeDequantize", "Conv", "Relu"]
    s, z = g.nodes[1].attrs["_wq"]
    assert g.tensor(g.nodes[1].inputs[1]).data.dtype == np.float32 and s.shape == z.shape == (8,)


@pytest.mark.parametrize("zero_dtype,storage", [(np.uint8, "buffer"), (np.int8, "texture")])
def test_quantize_dequantize_at_rounding_ties(zero_dtype, storage):
    """The pair's rounding where it is closest to going either way: x at (k + 1/2) s and a few ulps around it, for
    odd and even k, past both ends of the levels, and plain random values; bit for bit onnxruntime's (whose x / s is
    correctly rounded, which a Vulkan division need not be: the kernel settles those cases exactly)."""
    rng = np.random.default_rng(11)
    s = np.float32(rng.uniform(0.003, 0.05))
    z = zero_dtype(rng.integers(100, 156) if zero_dtype == np.uint8 else rng.integers(-20, 20))
    k = np.arange(-300, 300, dtype=np.float32)
    mid = ((k + np.float32(0.5)) * s).astype(np.float32)
    near = [mid]
    for steps in (1, 2, 3):
        near += [np.nextafter(near[-1] if steps > 1 else mid, np.float32(np.inf))]
    down = mid
    for _ in range(3):
        down = np.nextafter(down, np.float32(-np.inf))
        near.append(down)
    x = np.concatenate(near + [rng.uniform(-8, 8, 4000).astype(np.float32)]).astype(np.float32)
    x = x[: x.size // 4 * 4].reshape(4, -1)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    m = make_model(nodes, {"x": x.shape}, ["y"], {"s": s, "z": np.asarray(z)}, opset=17)
    want = onnxruntime_run(m, {"x": x})[0]
    with Session(m, storage=storage, options={"poison": True}) as sess:
        got = sess.run(None, {"x": x})[0]
    assert np.array_equal(got, want), f"{np.sum(got != want)} of {x.size} differ"


def test_int4_per_column_runs_as_int8():
    """An int4 weight with a scale a column (no blocks) is an int8 Linear's weight (the same values, a byte each)."""
    import ml_dtypes
    rng = np.random.default_rng(8)
    inits = {"q": rng.integers(-8, 8, size=(24, 12)).astype(ml_dtypes.int4),
             "s": rng.uniform(0.05, 0.1, 12).astype(np.float32), "z": rng.integers(-8, 8, 12).astype(ml_dtypes.int4)}
    model = make_model([helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"], axis=1),
                        helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (1, 5, 24)}, ["y"], inits, opset=21)
    feeds = {"x": rng.standard_normal((1, 5, 24)).astype(np.float32)}
    with Session(model, storage="buffer", options={"poison": True}) as s:
        (lin,) = [d for d in s.plan.dispatches if d.op == "Linear"]
        assert "_i8" in lin.kernel
        compare(s.run(None, feeds)[0], onnxruntime_run(model, feeds)[0], 1e-5)


def test_qdq_conv_on_the_tensor_core_gemm():
    """At fp16, an im2col conv with a QDQ int8 weight (K = 3 * 3 * 6, not a multiple of 32: the padded rows
    dequantize to 0) runs the tensor-core kernel's w=i8 variant (emulated here, coopmat=emulate)."""
    from minirt.session import get_device
    if get_device().profile.subgroup_size not in (8, 16, 32):
        pytest.skip("the emulated tensor-core kernel needs subgroups of 8, 16 or 32 lanes")
    model, feeds = _qdq_conv(6, 72, 3, dtype=np.uint8, seed=4)
    feeds = {"x": np.random.default_rng(4).standard_normal((1, 6, 12, 12)).astype(np.float32)}
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 12
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_value = 12
    opts = {"poison": True, "precision": "fp16", "coopmat": "emulate", "conv_route": "im2col"}
    with Session(model, storage="buffer", options=opts) as s:
        kernels = [d.kernel for d in s.plan.dispatches if d.op == "Conv"]
        assert any(k.startswith(("linear_cm_emu", "linear_cmreg_emu")) and "_i8" in k for k in kernels), kernels
        got = s.run(None, feeds)[0]
    compare(got, onnxruntime_run(model, feeds)[0], 4e-3, "tensor-core int8 conv")
