"""Test helpers: build small ONNX models, run them in onnxruntime (the oracle) and in minirt
with poisoned activations, and compare."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

STORAGES = ("buffer", "texture")


def make_model(nodes, inputs: dict, outputs, initializers=None, opset=17):
    """nodes: onnx NodeProtos; inputs: {name: shape}; outputs: [names]; initializers: {name: array}."""
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    g = helper.make_graph(nodes, "test", ins, outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 20 else 9
    return m


def linear_model(m, w, b, act=False, residual=False):
    """A Linear layer as an exporter writes it: x [1, m, k] @ w [k, n] + b, then Gelu if act, then + r [1, m, n] if
    residual (opset 20). Returns (model, its inputs' shapes)."""
    (k, n) = w.shape
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"])]
    cur, inputs = "hb", {"x": (1, m, k)}
    if act:
        nodes.append(helper.make_node("Gelu", [cur], ["ha"]))
        cur = "ha"
    if residual:
        nodes.append(helper.make_node("Add", [cur, "r"], ["y"]))
        inputs["r"] = (1, m, n)
    else:
        nodes.append(helper.make_node("Identity", [cur], ["y"]))
    return make_model(nodes, inputs, ["y"], {"w": w, "b": b}, opset=20), inputs


def linear_case(m, n, k, act, residual, seed=0):
    """linear_model with seeded weights. Returns (model, feeds)."""
    rng = np.random.default_rng(seed)
    model, inputs = linear_model(m, (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
                                 rng.standard_normal(n).astype(np.float32), act, residual)
    return model, {name: rng.standard_normal(shape).astype(np.float32) for name, shape in inputs.items()}


def with_lm_head(model, vocab, d, seed=0):
    """A copy of a text model whose output [.., d] goes through an LM head: MatMul by a random [d, vocab] weight, the
    one output 'logits' [.., vocab] (the families export the last hidden state alone)."""
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(model)
    hidden = m.graph.output[0].name
    w = (np.random.default_rng(seed).standard_normal((d, vocab)) / np.sqrt(d)).astype(np.float32)
    m.graph.initializer.append(numpy_helper.from_array(w, "lm_head.weight"))
    m.graph.node.append(helper.make_node("MatMul", [hidden, "lm_head.weight"], ["logits"], name="lm_head"))
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, None))
    return m


def fake_profile(monkeypatch, **changes):
    """This process's device (lavapipe) planned as another: its profile with `changes` (vendor="adreno" makes
    storage "auto" plan textures; a small max_image_3d makes tensors too large for an image)."""
    import dataclasses

    from minirt.session import get_device
    dev = get_device()
    monkeypatch.setattr(dev, "profile", dataclasses.replace(dev.profile, **changes))
    return dev.profile


def onnxruntime_run(model, feeds):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def rand(*shape, seed=None, low=-1.0, high=1.0):
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(np.float32)


def compare(out, ref, tol=1e-4, what=""):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    assert not np.isnan(out).any() or np.isnan(ref).any(), f"{what}: NaN in output (an element was not written?)"
    scale = max(np.abs(ref).max(initial=0.0), 1e-6)
    err = np.abs(out - ref).max(initial=0.0)
    assert err <= tol * scale, f"{what}: max abs diff {err:.3g} > {tol} x max|ref| {scale:.3g}"
    return err


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def check_model(model, feeds, storages=STORAGES, tol=1e-4, options=None):
    """Run in onnxruntime and in minirt (each storage, poisoned); assert every output matches."""
    from minirt import Session
    refs = onnxruntime_run(model, feeds)
    for st in storages:
        with Session(model, storage=st, options={"poison": True, **(options or {})}) as s:
            outs = s.run(None, feeds)
        for o, r, name in zip(outs, refs, [v.name for v in model.graph.output]):
            compare(o, r, tol, f"{st} output '{name}'")
    return refs


def graph_after(model, shapes, upto, **options):
    """The graph after the planner's passes up to and including `upto` (buffer storage on lavapipe unless options say
    otherwise): what a planner-pass test inspects."""
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.infer import bind_inputs, prepare
    from minirt.loaders import load
    from minirt.options import Options
    from minirt.planner import GRAPH_PASSES
    g = prepare(bind_inputs(load(model), shapes))
    opts = Options.make({"storage": "buffer", **options})
    for name, fn in GRAPH_PASSES:
        g = fn(g, opts, KNOWN_PROFILES["lavapipe"])
        if name == upto:
            break
    return g


# -- small models the bad-input and fuzz tests share -------------------------------------------------

W, B = rand(4, 3, seed=1), rand(3, seed=2)


def small_model():
    """x [2, 4] -> MatMul W -> Add B -> Softmax -> y [2, 3]."""
    return make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
                       helper.make_node("Softmax", ["a"], ["y"], axis=-1)], {"x": [2, 4]}, ["y"], {"w": W, "b": B})


def rich_model():
    """Conv, LayerNorm, shape arithmetic (Shape/Gather/Unsqueeze/Concat -> Reshape), MatMul, Gelu, Slice,
    ReduceMean, Softmax: the fuzz target, so mutations reach many parsers and ops."""
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], kernel_shape=[3], pads=[1, 1], strides=[1]),
        helper.make_node("Transpose", ["c"], ["t"], perm=[0, 2, 1]),
        helper.make_node("LayerNormalization", ["t", "g", "bt"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("Shape", ["ln"], ["sh"]),
        helper.make_node("Gather", ["sh", "i1"], ["d1"], axis=0),
        helper.make_node("Unsqueeze", ["d1", "ax0"], ["d1u"]),
        helper.make_node("Concat", ["one", "d1u", "m1"], ["tgt"], axis=0),
        helper.make_node("Reshape", ["ln", "tgt"], ["r"]),
        helper.make_node("MatMul", ["r", "w"], ["mm"]),
        helper.make_node("Gelu", ["mm"], ["ge"]),
        helper.make_node("Slice", ["ge", "st", "en", "axs"], ["sl"]),
        helper.make_node("ReduceMean", ["sl", "axr"], ["rm"], keepdims=1),
        helper.make_node("Sub", ["sl", "rm"], ["y0"]),
        helper.make_node("Softmax", ["y0"], ["y"], axis=-1),
    ]
    inits = {"cw": rand(8, 4, 3, seed=1), "cb": rand(8, seed=2), "g": rand(8, seed=3), "bt": rand(8, seed=4),
             "i1": np.array(1, np.int64), "ax0": np.array([0], np.int64), "one": np.array([1], np.int64),
             "m1": np.array([-1], np.int64), "w": rand(8, 6, seed=5), "st": np.array([1], np.int64),
             "en": np.array([5], np.int64), "axs": np.array([2], np.int64), "axr": np.array([1], np.int64)}
    return make_model(nodes, {"x": [1, 4, 6]}, ["y"], inits, opset=20)
