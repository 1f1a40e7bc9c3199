"""The 1-D conv routing and correctness matrix (at a short length on lavapipe), and 2-D conv stacks."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from minirt import Session
from oracle import check_model, compare, make_model, rand

# The matrix: tools/dev/conv_matrix.py prints it as a table, at Whisper's length by default.
# (label, C_in, C_out, kernel, attrs, expected route)
CASES = [
    ("80->384 k3", 80, 384, 3, dict(pads=[1, 1]), "im2col"),
    ("384->384 k3 s2", 384, 384, 3, dict(pads=[1, 1], strides=[2]), "im2col"),
    ("128->256 k5 p0", 128, 256, 5, dict(pads=[0, 0]), "im2col"),
    ("64->64 k3", 64, 64, 3, dict(pads=[1, 1]), "direct"),
    ("256->256 k1", 256, 256, 1, dict(), "pointwise"),
    ("64->128 k1 s2", 64, 128, 1, dict(strides=[2]), "direct"),     # the pointwise GEMM reads every pixel, unpadded
    ("64->128 k1 p1", 64, 128, 1, dict(pads=[1, 1]), "direct"),
    ("256->256 k3 depthwise", 256, 256, 3, dict(pads=[1, 1], group=256), "depthwise"),
    ("128->256 k3 dilation 2", 128, 256, 3, dict(pads=[2, 2], dilations=[2]), "direct"),
    ("256->256 k3 groups 4", 256, 256, 3, dict(pads=[1, 1], group=4), "direct"),
]
KERNEL_OF = {"im2col": ("im2col", "gemm"), "pointwise": ("gemm",), "depthwise": ("conv_dw",), "direct": ("conv",)}


def case_model(cin, cout, k, attrs, length, seed=0):
    rng = np.random.default_rng(seed)
    g = attrs.get("group", 1)
    w = (rng.standard_normal((cout, cin // g, k)) / np.sqrt(cin // g * k)).astype(np.float32)
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", **attrs)], "conv",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, length])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def run_matrix(length=3000, storages=("buffer", "texture"), seed=0):
    import onnxruntime as ort
    rows = []
    for label, cin, cout, k, attrs, expect in CASES:
        m = case_model(cin, cout, k, attrs, length, seed)
        x = np.random.default_rng(seed + 1).standard_normal((1, cin, length)).astype(np.float32)
        ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        for st in storages:
            with Session(m, storage=st, options={"poison": True}) as s:
                y = s.run(x)
                plan = s.plan
            notes = " ".join(plan.notes.get("conv", []))
            kernels = sorted({d.kernel for d in plan.dispatches if d.node == "conv"})
            route = next((r for r in KERNEL_OF if f"route: {r}" in notes), "?")
            a, b_ = y.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
            rows.append(dict(case=label, storage=st, route=route, expected=expect, kernels=kernels,
                             rewritten="conv1d rewrite: yes" in notes,
                             cosine=float(a @ b_ / np.linalg.norm(a) / np.linalg.norm(b_)),
                             max_abs_diff=float(np.abs(y - ref).max()), max_ref=float(np.abs(ref).max())))
    return rows


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_routing_matrix(storage):
    rows = run_matrix(length=123, storages=(storage,), seed=np.random.SeedSequence().entropy % 2**31)
    for r in rows:
        assert r["route"] == r["expected"], r
        assert r["rewritten"] == (r["expected"] == "im2col"), r
        want = set(KERNEL_OF[r["route"]])
        # linear_* is the fast buffer GEMM, gemm_* the general one: both are the tiled GEMM
        got = {"conv_dw" if k.startswith("conv_dw") else {"linear": "gemm"}.get(k.split("_")[0], k.split("_")[0])
               for k in r["kernels"]}
        # textures may add a relayout copy between width-packed [N, C, L] and channels-packed [N, C, 1, L]
        assert got - {"copy"} == want and (storage == "texture" or "copy" not in got), r
        assert r["cosine"] >= 0.99999 and r["max_abs_diff"] <= 1e-3 * r["max_ref"], r


def test_im2col_splits_scratch_by_output_rows(monkeypatch):
    """With a tiny budget the conv runs as several im2col + GEMM pairs sharing one scratch."""
    import minirt.ops.conv as conv
    monkeypatch.setattr(conv, "IM2COL_SCRATCH_BUDGET", 4096)
    m = case_model(80, 128, 3, dict(pads=[1, 1]), 200)
    x = rand(1, 80, 200)
    check_model(m, {"x": x})
    with Session(m) as s:
        kinds = [{"linear": "gemm"}.get(d.kernel.split("_")[0], d.kernel.split("_")[0])
                 for d in s.plan.dispatches if d.node == "conv"]
        scratch = {a for d in s.plan.dispatches for a, _ in d.args if a == "im2col.scratch"}
    assert kinds.count("im2col") == kinds.count("gemm") > 1
    assert len(scratch) == 1


@pytest.mark.parametrize("length, budget", [(203, None), (200, 3 * 288 * 4), (201, 10 * 288 * 4)])
def test_nchw_gemm_output_aligned_and_not(monkeypatch, length, budget):
    """The GEMM's NCHW epilogue stores 4 positions of a channel at once where the column start is 4-aligned and
    falls back to single stores where not: 203 positions (M_total % 4 = 3, a partial last row group); row tiles of
    3 (the tile starts at 3, 6, ... are unaligned) and of 10 positions (201 % 4 = 1)."""
    import minirt.ops.conv as conv
    if budget:
        monkeypatch.setattr(conv, "IM2COL_SCRATCH_BUDGET", budget)
    m = case_model(96, 132, 3, dict(pads=[1, 1]), length)
    check_model(m, {"x": rand(1, 96, length)})
    with Session(m, precision="fp16") as s:     # the fp16 variant's 8-byte stores
        ref = Session(m)
        compare(s.run(rand(1, 96, length, seed=3)), ref.run(rand(1, 96, length, seed=3)), 3e-3, "fp16")
        ref.close()


def test_conv1d_rewrite_can_be_turned_off():
    m = case_model(80, 384, 3, dict(pads=[1, 1]), 64)
    with Session(m, conv1d_rewrite=False) as s:
        assert {d.kernel for d in s.plan.dispatches} == {"conv_buffer"}
        assert any("off" in n for n in s.plan.notes["conv"])


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_resnet_like_2d_stack(storage):
    """Strides, padding, 1x1 and 3x3, groups and depthwise, with Relu between, against onnxruntime."""
    def w(o, i, k):
        return rand(o, i, k, k, low=-0.3, high=0.3)
    inits = {"w1": w(128, 3, 3), "b1": rand(128), "w2": w(128, 1, 3), "w3": w(160, 128, 1), "b3": rand(160),
             "w4": w(160, 40, 3), "w5": w(192, 160, 3), "b5": rand(192), "w6": w(64, 192, 1)}
    n = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2]),
         helper.make_node("Relu", ["c1"], ["r1"]),
         helper.make_node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1], group=128),
         helper.make_node("Conv", ["c2", "w3", "b3"], ["c3"]),
         helper.make_node("Relu", ["c3"], ["r3"]),
         helper.make_node("Conv", ["r3", "w4"], ["c4"], pads=[1, 1, 1, 1], group=4),
         helper.make_node("Conv", ["c4", "w5", "b5"], ["c5"], pads=[0, 1, 1, 0], strides=[2, 1]),
         helper.make_node("Conv", ["c5", "w6"], ["y"])]
    m = make_model(n, {"x": (1, 3, 33, 29)}, ["y"], inits)
    check_model(m, {"x": rand(1, 3, 33, 29)}, storages=(storage,))
    with Session(m, storage=storage) as s:
        kernels = {d.kernel.rsplit("_", 1)[0] if "gemm" not in d.kernel and "linear" not in d.kernel else "gemm"
                   for d in s.plan.dispatches}
    assert {"im2col", "gemm", "conv_dw", "conv"} <= kernels


def test_a_batch_takes_im2col_in_buffers_at_aligned_offsets():
    """Batch 2: im2col (image by image) in buffer storage where each image's input and output start at an
    offset the device can bind; the direct kernel in textures and where an image's bytes do not keep the
    alignment."""
    from minirt.infer import bind_inputs, prepare
    from minirt.loaders import load
    from minirt.options import Options
    from minirt.planner import conv1d_as_conv2d, conv_routing

    def route(length, storage="buffer", align=16):
        m = case_model(80, 384, 3, dict(pads=[1, 1]), length)
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
        g = conv1d_as_conv2d.rewrite(prepare(bind_inputs(load(m), {"x": (2, 80, length)})), Options())
        (conv,) = [n for n in g.nodes if n.op == "Conv"]
        return conv_routing.route(conv, g, storage, align)

    assert route(40) == ("im2col", "im2col + tiled GEMM, image by image (batch 2)")
    assert route(40, "texture")[0] == "direct"
    r, why = route(41, align=64)      # 80 x 41 x 2 bytes: not a multiple of 64
    assert r == "direct" and "offset alignment 64" in why


@pytest.mark.parametrize("length", [40, 41])
def test_a_batch_matches_onnxruntime(length):
    """Batch 3 through the routing's choice (image by image at 40 frames; 41 keeps lavapipe's 16-byte alignment
    at fp32 and fp16 too), in both storages, poisoned."""
    m = case_model(80, 128, 3, dict(pads=[1, 1]), length, seed=length)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 3
    x = np.random.default_rng(length).standard_normal((3, 80, length)).astype(np.float32)
    check_model(m, {"x": x})


@pytest.mark.parametrize("channels_last", [True, False])
def test_every_route_takes_a_batch(channels_last):
    """Batch 3 through a 1x1 conv (a Linear over channels-last pixels, or with conv_channels_last off the pointwise
    GEMM), a 3x3 conv of 128 channels (im2col), a depthwise and a grouped conv (direct), 2-D, in both storages,
    poisoned: every image is computed (a route that ran only the first image would leave the others NaN or
    wrong)."""
    rng = np.random.default_rng(np.random.SeedSequence().entropy % 2**31)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
    h = helper.make_node
    nodes = [h("Conv", ["x", "w1"], ["a"], name="pointwise"), h("Relu", ["a"], ["ar"]),
             h("Conv", ["ar", "w2", "b2"], ["b"], name="im2col", pads=[1, 1, 1, 1]),
             h("Conv", ["b", "w3"], ["c"], name="depthwise", pads=[1, 1, 1, 1], group=128),
             h("Conv", ["c", "w4"], ["y"], name="grouped", pads=[1, 1, 1, 1], group=4)]
    m = make_model(nodes, {"x": (3, 64, 6, 7)}, ["y"], {"w1": w(128, 64, 1, 1), "w2": w(128, 128, 3, 3),
                                                        "b2": w(128, 1)[:, 0], "w3": w(128, 1, 3, 3),
                                                        "w4": w(128, 32, 3, 3)})
    options = {"conv_channels_last": channels_last}
    with Session(m, storage="buffer", options=options) as s:
        routes = " ".join(n for notes in s.plan.notes.values() for n in notes)
    if channels_last:
        assert "route: linear (1x1 kernel: a Linear over the pixels of the channels-last input)" in routes
    else:
        assert "route: pointwise (1x1 kernel: a GEMM on the activation, image by image (batch 3))" in routes
    assert "route: im2col (im2col + tiled GEMM, image by image (batch 3))" in routes
    check_model(m, {"x": rng.standard_normal((3, 64, 6, 7)).astype(np.float32)}, options=options)
