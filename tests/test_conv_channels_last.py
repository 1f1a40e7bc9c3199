"""Channels-last CNNs (planner/conv_channels_last.py, the conv routes linear and im2col on the buffer GEMM): which
route and kernel each conv takes, which tensors are NHWC and where the Transposes are, on the plan itself; results
against onnxruntime in both storages, batch 1 and 3, poisoned."""
import collections

import numpy as np
import pytest
from onnx import helper

import minirt.planner.conv_routing as conv_routing
from minirt import Session
from cnn_models import resnet
from oracle import check_model, compare, make_model, onnxruntime_run, rand

SMALL = dict(stages=((8, 1, 1), (16, 2, 2)), stem=8, classes=10, image=32)


def _plan_of(model, batch, precision="fp32", profile="nvidia-h200", **options):
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.infer import bind_inputs, prepare
    from minirt.loaders import load
    from minirt.planner import make_plan
    g = prepare(bind_inputs(load(model), {"x": (batch, 3, model.graph.input[0].type.tensor_type.shape.dim[2]
                                                .dim_value) + (model.graph.input[0].type.tensor_type.shape.dim[3]
                                                               .dim_value,)}))
    return make_plan(g, KNOWN_PROFILES[profile], "buffer", {"precision": precision, **options})


def _conv_nodes(model):
    return [n.name for n in model.graph.node if n.op_type == "Conv"]


@pytest.mark.parametrize("batch, precision", [(1, "fp32"), (1, "fp16"), (8, "fp32")])
def test_resnet50_plan_on_the_h200(batch, precision):
    """ResNet-50 at 224 x 224 as the H200 plans it (no GPU: the plan only): every conv on the buffer GEMM's kernels
    (linear.comp at fp32, the tensor-core kernels at fp16), none on the direct kernel or the generic GEMM; the 1x1
    convs at stride 1 Linears over channels-last pixels with no im2col; one Transpose in all (the pool's output to
    NHWC); the average pool a ReduceMean of the last block's channels-last output; each block's Add and Relu in its
    last conv's epilogue; the head's Gemm on the few-row kernel."""
    model = resnet(image=224, batch=batch)
    plan = _plan_of(model, batch, precision)
    by_node = collections.defaultdict(list)
    for d in plan.dispatches:
        by_node[d.node].append(d.kernel)
    convs = _conv_nodes(model)
    gemm = "linear_t44k32" if precision == "fp32" else "linear_c"
    for name in convs:
        kernels = by_node[name]
        assert kernels and all(k.startswith((gemm, "linear_reduce", "im2col")) for k in kernels), (name, kernels)
        one_by_one = name.endswith((".c1", ".c3")) or (name.endswith(".skip") and name.startswith("s0"))
        assert any(k.startswith("im2col") for k in kernels) != one_by_one, (name, kernels)
        assert f"route: {'linear' if one_by_one else 'im2col'}" in " ".join(plan.notes[name]), plan.notes[name]
    assert not any(k.startswith(("conv_", "gemm_", "matmul_")) for d in plan.dispatches for k in [d.kernel])
    transposes = [d for d in plan.dispatches if d.op == "Transpose"]
    assert [(plan.tensors[d.args[1][0]].shape, plan.tensors[d.args[0][0]].shape) for d in transposes] == [
        ((batch, 64, 56, 56), (batch, 56, 56, 64))]
    gap = [d for d in plan.dispatches if d.node == "gap"]
    assert [d.op for d in gap] == ["ReduceMean"] and plan.tensors[gap[0].args[1][0]].shape == (batch, 7, 7, 2048)
    assert by_node["fc"][0].startswith("linear_rows") == (batch <= 8)
    # the stem writes NCHW for the MaxPool; every block's tensors are channels-last
    assert plan.tensors["stem.relu"].shape == (batch, 64, 112, 112)
    assert plan.tensors["s3b2.out@nhwc"].shape == (batch, 7, 7, 2048)
    assert ("layout: reads NHWC, writes NHWC (a Linear over pixels" + (f"; the batch's {batch} images as GEMM rows)"
                                                                       if batch > 1 else ")")) in plan.notes["s1b0.c1"]
    # each block's Add and Relu are its last conv's epilogue: relu(conv + skip)
    assert not any(d.op in ("Add", "Relu") for d in plan.dispatches)
    assert "folded Add 's2b3/add' into the GEMM epilogue as the residual 's2b2.out@nhwc', then Relu 's2b3/relu' " \
           "after it" in plan.notes["s2b3.c3"]


@pytest.fixture
def gemm_routes_for_small_convs(monkeypatch):
    """Small convs take the GEMM routes as ResNet-50's large ones do (the rule's size threshold off)."""
    monkeypatch.setattr(conv_routing, "IM2COL_MIN_MACS", 0)


@pytest.mark.parametrize("batch", [1, 3])
def test_small_resnet_matches_onnxruntime(gemm_routes_for_small_convs, batch):
    """A small bottleneck ResNet (7x7 stride-2 stem, max pool, 1x1 and 3x3 convs, a stride-2 block with its strided
    1x1 skip conv, residual Adds, a Gemm head) against onnxruntime in both storages, poisoned; the buffer plan has
    the channels-last routes, the texture plan today's."""
    model = resnet(batch=batch, **SMALL)
    x = rand(batch, 3, 32, 32, seed=batch)
    check_model(model, {"x": x})
    with Session(model, storage="buffer") as s:
        plan = s.plan
    routes = {n: next(t for t in plan.notes[n] if t.startswith("route:")) for n in _conv_nodes(model)}
    assert routes["stem"].startswith("route: im2col") and routes["s1b0.skip"].startswith("route: im2col (1x1 kernel")
    assert all(routes[n].startswith("route: linear") for n in ("s0b0.c1", "s0b0.c3", "s0b0.skip", "s1b1.c1"))
    assert [d.node for d in plan.dispatches if d.op == "Transpose"] == ["pool@nhwc/transpose"]
    assert [d.op for d in plan.dispatches if d.node == "gap"] == ["ReduceMean"]
    assert {d.kernel for d in plan.dispatches if d.node == "fc"} == {"linear_rows"}
    # a batch is more GEMM rows: one dispatch for a 1x1 conv's 3 images, M = 3 x 16 x 16 rows
    c1 = [d for d in plan.dispatches if d.node == "s0b0.c1"]
    assert len(c1) == 1 and plan.tensors[c1[0].args[0][0]].shape == (batch, 8, 8, 8)
    with Session(model, storage="texture") as s:
        assert not any(d.op == "Transpose" for d in s.plan.dispatches)
        assert not any("route: linear" in t for notes in s.plan.notes.values() for t in notes)


def test_small_resnet_fp16(gemm_routes_for_small_convs):
    """The same plan at fp16 (the half variants of im2col and the GEMMs, channels-last), against fp32."""
    model = resnet(batch=3, **SMALL)
    x = rand(3, 3, 32, 32, seed=7)
    ref = onnxruntime_run(model, {"x": x})[0]
    with Session(model, precision="fp16", options={"poison": True}) as s:
        compare(s.run(x), ref, 2e-2, "fp16")


def test_pass_off_keeps_nchw(gemm_routes_for_small_convs):
    """Option conv_channels_last=False: no NHWC tensor, no Transpose, 1x1 convs on the pointwise GEMM."""
    model = resnet(batch=1, **SMALL)
    with Session(model, storage="buffer", options={"conv_channels_last": False}) as s:
        plan = s.plan
        assert not any(d.op == "Transpose" for d in plan.dispatches)
        assert not any(name.endswith("@nhwc") for name in plan.tensors)
        assert "route: pointwise (1x1 kernel: a GEMM on the activation)" in plan.notes["s0b0.c1"]
        x = rand(1, 3, 32, 32, seed=11)
        compare(s.run(x), onnxruntime_run(model, {"x": x})[0], 1e-4)


@pytest.mark.parametrize("batch", [1, 3])
def test_edges_and_unaligned_images(batch):
    """A 1x1 conv reading a graph input (a Transpose in), a strided 1x1 conv reading its output channels-last, and a
    1x1 conv whose output is a graph output (written NCHW: image by image, or, where an image's 5 x 9 values are no
    multiple of the 16-byte offset alignment, channels-last with a Transpose out); a Relu between, an Add with a
    scalar constant."""
    h = helper.make_node
    nodes = [h("Conv", ["x", "w1", "b1"], ["a"], name="in1x1"), h("Relu", ["a"], ["ar"]),
             h("Add", ["ar", "half"], ["ah"], name="add_scalar"),
             h("Conv", ["ah", "w2"], ["b"], name="strided", strides=[2, 2]),
             h("Conv", ["b", "w3", "b3"], ["y"], name="out1x1")]
    m = make_model(nodes, {"x": (batch, 8, 6, 6)}, ["y"],
                   {"w1": rand(16, 8, 1, 1, seed=1), "b1": rand(16, seed=2), "half": np.float32(0.5),
                    "w2": rand(16, 16, 1, 1, seed=3), "w3": rand(5, 16, 1, 1, seed=4), "b3": rand(5, seed=5)})
    import minirt.planner.conv_routing as cr
    old = cr.IM2COL_MIN_MACS
    cr.IM2COL_MIN_MACS = 0
    try:
        check_model(m, {"x": rand(batch, 8, 6, 6, seed=9)})
        with Session(m, storage="buffer") as s:
            plan = s.plan
    finally:
        cr.IM2COL_MIN_MACS = old
    transposes = [(d.args[1][0], d.args[0][0]) for d in plan.dispatches if d.op == "Transpose"]
    assert transposes[0] == ("x", "x@nhwc")
    assert plan.tensors["b@nhwc"].shape == (batch, 3, 3, 16)
    assert "route: im2col (1x1 kernel with strides [2, 2]" in " ".join(plan.notes["strided"])
    if batch == 1:      # one image: the GEMM writes NCHW itself
        assert len(transposes) == 1 and "layout: reads NHWC, writes NCHW (a Linear over pixels)" in plan.notes["out1x1"]
    else:               # 90-byte images (fp16's 2 bytes a value) cannot be bound one by one
        assert transposes[1] == ("y@nhwc", "y") and plan.tensors["y@nhwc"].shape == (batch, 3, 3, 5)


@pytest.mark.parametrize("hw, precision, options", [
    ((6, 6), "fp32", {}),                                     # linear.comp
    ((6, 6), "fp32", {"gemm_splitk": 2}),                     # split K: linear_reduce applies them
    ((1, 2), "fp32", {}),                                     # 6 rows: linear_rows
    ((6, 6), "fp16", {"coopmat": "emulate"}),                 # the tensor-core kernel's epilogues (emulated)
    ((6, 6), "fp16", {"coopmat": "emulate", "gemm_splitk": 2}),
    ((6, 6), "fp16", {}),
])
def test_residual_then_relu_in_the_gemm_epilogue(hw, precision, options):
    """relu(conv(a) + a) with a channels-last: the Add and the Relu go into the conv's GEMM epilogue (activation after
    the residual), on each GEMM kernel that has a residual, batch 3, poisoned, against onnxruntime."""
    h = helper.make_node
    nodes = [h("Conv", ["x", "w0", "b0"], ["a0"], name="c0"), h("Relu", ["a0"], ["a"]),
             h("Conv", ["a", "w1", "b1"], ["b"], name="c1"), h("Add", ["b", "a"], ["s"], name="add"),
             h("Relu", ["s"], ["r"], name="relu"), h("Conv", ["r", "w2"], ["y"], name="c2")]
    m = make_model(nodes, {"x": (3, 8, *hw)}, ["y"],
                   {"w0": rand(16, 8, 1, 1, seed=1), "b0": rand(16, seed=2), "w1": rand(16, 16, 1, 1, seed=3),
                    "b1": rand(16, seed=4), "w2": rand(8, 16, 1, 1, seed=5)})
    x = rand(3, 8, *hw, seed=6)
    opts = {"poison": True, **options}
    with Session(m, storage="buffer", precision=precision, options=opts) as s:
        compare(s.run(x), onnxruntime_run(m, {"x": x})[0], 1e-4 if precision == "fp32" else 2e-2, str(options))
        plan = s.plan
    assert not any(d.op in ("Add", "Relu") for d in plan.dispatches)
    assert "folded Add 'add' into the GEMM epilogue as the residual 'a@nhwc', then Relu 'relu' after it" in \
        plan.notes["c1"]
    c1 = [d for d in plan.dispatches if d.node == "c1"]
    assert c1[-1].kernel.startswith({"fp32": "linear_rows" if hw == (1, 2) else "linear", "fp16": "linear"}[precision])
    if options.get("gemm_splitk"):
        assert c1[-1].kernel.startswith("linear_reduce")
    from minirt.kernels import ACT_AFTER_RES
    assert any(v & ACT_AFTER_RES for v in c1[-1].spec[:2])     # the ACT code carries the flag


@pytest.mark.parametrize("precision, options", [("fp32", {}), ("fp16", {"coopmat": "emulate"})])
def test_basic_block_in_row_tiles(gemm_routes_for_small_convs, monkeypatch, precision, options):
    """A ResNet-18 basic block (3x3 conv, Relu, 3x3 conv, + skip, Relu) and a global average pool at batch 3, its
    im2col convs run in row tiles of a small scratch that cross images: the second conv's tiles add the residual at
    their own rows (relu(conv + skip) in the epilogue of each tile), against onnxruntime, poisoned."""
    import minirt.ops.conv as conv
    monkeypatch.setattr(conv, "IM2COL_SCRATCH_BUDGET", 53 * 72 * 4)     # tiles of 48 rows, of 64 an image
    h = helper.make_node
    nodes = [h("Conv", ["x", "w0", "b0"], ["a"], name="c0", pads=[1, 1, 1, 1]), h("Relu", ["a"], ["ar"]),
             h("Conv", ["ar", "w1", "b1"], ["b"], name="c1", pads=[1, 1, 1, 1]),
             h("Relu", ["b"], ["br"]), h("Conv", ["br", "w2", "b2"], ["c"], name="c2", pads=[1, 1, 1, 1]),
             h("Add", ["c", "ar"], ["s"], name="add"), h("Relu", ["s"], ["r"], name="relu"),
             h("GlobalAveragePool", ["r"], ["y"], name="gap")]
    m = make_model(nodes, {"x": (3, 8, 8, 8)}, ["y"],
                   {"w0": rand(8, 8, 3, 3, seed=1), "b0": rand(8, seed=2), "w1": rand(8, 8, 3, 3, seed=3),
                    "b1": rand(8, seed=4), "w2": rand(8, 8, 3, 3, seed=5), "b2": rand(8, seed=6)})
    x = rand(3, 8, 8, 8, seed=7)
    with Session(m, storage="buffer", precision=precision, options={"poison": True, **options}) as s:
        compare(s.run(x), onnxruntime_run(m, {"x": x})[0], 1e-4 if precision == "fp32" else 2e-2, precision)
        plan = s.plan
    c2 = [d for d in plan.dispatches if d.node == "c2"]
    assert sum(d.kernel.startswith("im2col") for d in c2) > 2
    assert "then Relu 'relu' after it" in " ".join(plan.notes["c2"])
    assert plan.tensors["ar@nhwc"].shape == (3, 8, 8, 8)
