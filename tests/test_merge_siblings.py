"""merge_siblings: Linears reading the same input (Whisper's q, k, v projections) become one GEMM with a
part-major output whose parts are views at offsets. Checked on the rewritten graph, on the plan (one GEMM
dispatch per attention block, views with offsets), and numerically: against onnxruntime with poisoned
activations (fp32, both storages), the 2-layer Whisper encoder against onnxruntime, and precision fp16 (plain
and the emulated tensor-core kernel, so both GEMM epilogues' part-major mode runs) against minirt fp32."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.device_profile import KNOWN_PROFILES
from minirt.graph import Graph, Node, Tensor
from minirt.options import Options
from minirt.infer import bind_inputs, prepare
from minirt.loaders import load
from minirt.ops.linear import SplitParts
from minirt.planner import SWITCHED_OFF, Pass, make_plan, merge_siblings
from minirt.graph_reference import run_graph
from oracle import check_model, cosine, graph_after, make_model, onnxruntime_run, rand

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import whisper_encoder as we  # noqa: E402

LAVAPIPE, H200 = KNOWN_PROFILES["lavapipe"], KNOWN_PROFILES["nvidia-h200"]


def seed():
    return int(np.random.SeedSequence().entropy % 2**31)    # fresh inputs every run


def passes(model, shapes, upto="merge_siblings", **options):
    return graph_after(model, shapes, upto, **options)


def linears(g):
    return [n for n in g.nodes if n.op == "Linear"]


# -- a small ONNX model: three projections of one input -------------------------------------------------------
def qkv_model(t=37, k=64, n=48, biases=(True, False, True), scales=(0.125, None, None), act=None, batch=1,
              consume=True):
    """x [batch, t, k] -> three MatMul (+ bias) (* scale) (+ act) projections. consume: the outputs meet in
    other ops (q * k + v, and v alone); else the three projections are the graph outputs themselves."""
    h = helper.make_node
    nodes, init = [], {}
    outs = []
    for i, (b, s) in enumerate(zip(biases, scales)):
        p = "qkv"[i]
        init[f"w{p}"] = rand(k, n, seed=10 + i, low=-.3, high=.3)
        nodes.append(h("MatMul", ["x", f"w{p}"], [f"{p}0"]))
        cur = f"{p}0"
        if b:
            init[f"b{p}"] = rand(n, seed=20 + i)
            nodes.append(h("Add", [cur, f"b{p}"], [f"{p}1"]))
            cur = f"{p}1"
        if s is not None:
            init[f"s{p}"] = np.float32(s)
            nodes.append(h("Mul", [cur, f"s{p}"], [f"{p}2"]))
            cur = f"{p}2"
        if act:
            nodes.append(h(act, [cur], [f"{p}3"]))
            cur = f"{p}3"
        outs.append(cur)
    if consume:
        nodes += [h("Mul", [outs[0], outs[1]], ["qk"]), h("Add", ["qk", outs[2]], ["y"]),
                  h("Neg", [outs[2]], ["nv"])]
        outputs = ["y", "nv"]
    else:
        outputs = outs
    return make_model(nodes, {"x": (batch, t, k)}, outputs, init, opset=20)


def qkv_feeds(t=37, k=64, batch=1):
    return {"x": rand(batch, t, k, seed=seed(), low=-2, high=2)}


# -- graph tests ----------------------------------------------------------------------------------------------
def test_whisper_qkv_merge_into_one_linear_per_layer():
    m = we.build_whisper_encoder("tiny", layers=2, n_frames=200, seed=2)
    shapes = {"input_features": (1, 80, 200)}
    before = passes(m, shapes, upto="fuse_linear")
    g = passes(m, shapes)
    for layer in (0, 1):
        scope = f"/layers.{layer}/self_attn"
        old = {n.name.split("/")[-2]: n for n in linears(before) if n.name.startswith(scope + "/")
               and n.name.split("/")[-2] in ("q_proj", "k_proj", "v_proj")}
        assert len(old) == 3
        merged = [n for n in linears(g) if n.name.startswith(scope + "/")]
        assert [n.name for n in merged] == [f"{scope}/q_proj+k_proj+v_proj", f"{scope}/out_proj/MatMul"]
        mq = merged[0]
        assert mq.attrs["parts"] == 3 and mq.attrs["scale"] == 1.0 and mq.attrs["act"] == ""
        assert mq.inputs[0] == old["q_proj"].inputs[0] and not mq.inputs[3]
        # W = [Wq * scale | Wk | Wv], bias = [bq * scale | 0 | bv]
        w, b = g.tensor(mq.inputs[1]).data, g.tensor(mq.inputs[2]).data
        d = 384
        assert w.shape == (d, 3 * d) and b.shape == (3 * d,)
        for i, key in enumerate(("q_proj", "k_proj", "v_proj")):
            o = old[key]
            s = o.attrs.get("scale", 1.0)
            np.testing.assert_allclose(w[:, i * d:(i + 1) * d], before.tensor(o.inputs[1]).data * s, rtol=1e-6)
            ob = before.tensor(o.inputs[2]).data * s if o.inputs[2] else np.zeros(d)
            np.testing.assert_allclose(b[i * d:(i + 1) * d], ob, rtol=1e-6)
        assert old["q_proj"].attrs["scale"] == pytest.approx(0.125) and not old["k_proj"].inputs[2]
        # one SplitParts right after it hands out the original tensors, which shapes are unchanged
        i = g.nodes.index(mq)
        split = g.nodes[i + 1]
        assert split.op == "SplitParts" and split.inputs == mq.outputs
        assert split.outputs == [old[k].outputs[0] for k in ("q_proj", "k_proj", "v_proj")]
        assert g.tensor(mq.outputs[0]).shape == (3, 100, d)
        assert all(g.tensor(o).shape == (1, 100, d) for o in split.outputs)
        assert any("merged 3 sibling Linears" in t for t in g.notes[mq.name])
    # the attention pass still finds q, k and v (now SplitParts outputs)
    after = passes(m, shapes, upto="fuse_attention")
    att = [n for n in after.nodes if n.op == "Attention"]
    assert len(att) == 2
    split = [n for n in after.nodes if n.op == "SplitParts"]
    assert [a.inputs for a in att] == [s.outputs for s in split]


@pytest.mark.parametrize("biases,scales", [((True, True, True), (0.125, 0.5, 2.0)), ((False, False, False),
                                                                                     (None, None, None)),
                                           ((True, False, True), (0.125, None, None))])
def test_merge_folds_scales_and_biases_and_keeps_the_values(biases, scales):
    m = qkv_model(biases=biases, scales=scales)
    g = passes(m, {"x": (1, 37, 64)})
    lin = linears(g)
    assert len(lin) == 1 and lin[0].attrs["parts"] == 3 and lin[0].attrs["scale"] == 1.0
    assert bool(lin[0].inputs[2]) == any(biases)          # no bias at all: none made up
    assert [n.op for n in g.nodes].count("SplitParts") == 1
    # the rewritten graph (Linear parts + SplitParts references) computes what the model does
    fd = qkv_feeds()
    ref = onnxruntime_run(m, fd)
    got = run_graph(g, fd)
    for r, name in zip(ref, g.outputs):
        np.testing.assert_allclose(got[name], r, rtol=1e-4, atol=1e-4)


def test_equal_widths_merge_apart_from_others():
    """Siblings of two widths: each width merges on its own; a lone one stays."""
    h = helper.make_node
    init = {"w1": rand(64, 48, seed=1), "w2": rand(64, 48, seed=2), "w3": rand(64, 96, seed=3),
            "w4": rand(64, 96, seed=4), "w5": rand(64, 32, seed=5)}
    nodes = [h("MatMul", ["x", f"w{i}"], [f"y{i}"]) for i in range(1, 6)]
    m = make_model(nodes, {"x": (1, 40, 64)}, [f"y{i}" for i in range(1, 6)], init)
    g = passes(m, {"x": (1, 40, 64)})
    parts = sorted((n.attrs.get("parts", 1), g.tensor(n.inputs[1]).data.shape[1]) for n in linears(g))
    assert parts == [(1, 32), (2, 96), (2, 192)]


def _linear_graph(specs, t=37, alignprofile=None):
    """A Graph of Linear nodes straight from specs: [{x, k, n, bias, scale, act, residual, const_w}]."""
    g = Graph(name="t")
    for i, s in enumerate(specs):
        x = s.get("x", "x")
        k, n = s.get("k", 64), s.get("n", 48)
        if x not in g.tensors:
            g.add_tensor(Tensor(x, (1, t, k), "float32"))
            g.inputs.append(x)
        if s.get("const_w", True):
            g.const(f"w{i}", rand(k, n, seed=i))
        else:
            g.add_tensor(Tensor(f"w{i}", (k, n), "float32"))
            g.inputs.append(f"w{i}")
        b = ""
        if s.get("bias"):
            b = g.const(f"b{i}", rand(n, seed=100 + i)).name
        r = ""
        if s.get("residual"):
            r = f"r{i}"
            g.add_tensor(Tensor(r, (1, t, n), "float32"))
            g.inputs.append(r)
        g.add_tensor(Tensor(f"y{i}", (1, t, n), "float32"))
        g.outputs.append(f"y{i}")
        g.nodes.append(Node("Linear", f"lin{i}", [x, f"w{i}", b, r], [f"y{i}"],
                            {"act": s.get("act", ""), "scale": s.get("scale", 1.0)}, "minirt"))
    return g


def _merged(g, profile=LAVAPIPE, **options):
    g = Pass(merge_siblings)(g, Options.make({"storage": "buffer", **options}), profile)
    return [n for n in g.nodes if n.attrs.get("parts", 1) > 1], g


def test_pass_fires_on_plain_siblings():
    merged, g = _merged(_linear_graph([{"bias": True, "scale": 0.5}, {}, {"bias": True}]))
    assert len(merged) == 1 and merged[0].attrs["parts"] == 3
    assert [n.op for n in g.nodes] == ["Linear", "SplitParts"]


@pytest.mark.parametrize("why,specs", [
    ("different inputs", [{"x": "x"}, {"x": "x2"}]),
    ("different K", [{"x": "x", "k": 64}, {"x": "x3", "k": 32}]),
    ("residual", [{"residual": True}, {}]),
    ("different acts", [{"act": "gelu"}, {"act": ""}]),
    ("non-constant weight", [{"const_w": False}, {}]),
    ("different N", [{"n": 48}, {"n": 64}]),
])
def test_pass_does_not_fire(why, specs):
    merged, g = _merged(_linear_graph(specs))
    assert not merged, why
    assert [n.op for n in g.nodes] == ["Linear"] * len(specs)


def test_siblings_group_by_activation():
    """Two gelu siblings merge (act kept), the relu one stays apart."""
    merged, g = _merged(_linear_graph([{"act": "gelu"}, {"act": "gelu", "bias": True}, {"act": "relu"}]))
    assert len(merged) == 1 and merged[0].attrs["act"] == "gelu" and merged[0].attrs["parts"] == 2
    assert sum(n.op == "Linear" for n in g.nodes) == 2


@pytest.mark.parametrize("off", [False, "0", "false"])
def test_option_off(off):
    merged, g = _merged(_linear_graph([{}, {}, {}]), merge_siblings=off)
    assert not merged and g.notes == {SWITCHED_OFF: ["pass merge_siblings switched off (option merge_siblings)"]}


def test_unaligned_part_offsets_do_not_merge():
    """37 rows x 48 columns x 4 bytes = 7104 bytes per part: a multiple of 16 (lavapipe, H200), not of 256."""
    specs = [{}, {}, {}]
    merged, _ = _merged(_linear_graph(specs), profile=H200)
    assert merged
    mali = KNOWN_PROFILES["mali-g715"]
    assert mali.min_storage_buffer_offset_alignment == 256
    merged, g = _merged(_linear_graph(specs), profile=mali)
    assert not merged
    assert all("not a multiple of the device's storage-buffer offset alignment (256)" in g.notes[f"lin{i}"][0]
               for i in range(3))
    assert not _merged(_linear_graph(specs), profile=None)[0]     # no profile: the most Vulkan allows (256)
    assert _merged(_linear_graph(specs, t=64), profile=mali)[0]   # 64 x 48 x 4 = 12288 = 48 x 256
    # fp16 halves the part: 37 x 48 x 2 = 3552, a multiple of 16
    assert _merged(_linear_graph(specs), profile=H200, precision="fp16")[0]


def test_merged_tensors_stay_within_the_range():
    """Five siblings (outputs 37 x 48, weights 64 x 48: 12288 bytes a part) on a range of two parts' weights merge in
    groups of two, in order, and the fifth stays alone; a range below two parts merges none; each says why."""
    import dataclasses
    specs = [{}] * 5
    merged, g = _merged(_linear_graph(specs), profile=dataclasses.replace(LAVAPIPE, max_storage_buffer_range=30000))
    assert [n.attrs["parts"] for n in merged] == [2, 2] and sum(n.op == "Linear" for n in g.nodes) == 3
    assert all("groups of 2" in g.notes[n.name][0] for n in merged)
    merged, g = _merged(_linear_graph(specs), profile=dataclasses.replace(LAVAPIPE, max_storage_buffer_range=20000))
    assert not merged and "maxStorageBufferRange" in g.notes["lin0"][0]


def test_texture_and_general_gemm_do_not_merge():
    merged, g = _merged(_linear_graph([{}, {}]), storage="texture")
    assert not merged and "texture storage" in g.notes["lin0"][0]
    merged, g = _merged(_linear_graph([{}, {}]), fast_gemm=False)
    assert not merged and "general GEMM" in g.notes["lin0"][0]
    merged, g = _merged(_linear_graph([{"k": 30}, {"k": 30}]))
    assert not merged and "general GEMM" in g.notes["lin0"][0]


# -- plan tests -------------------------------------------------------------------------------------------------
def _whisper_plan(precision="fp32", storage="buffer", profile=H200, layers=2, **options):
    m = we.build_whisper_encoder("tiny", layers=layers, n_frames=200, seed=2)
    g = prepare(bind_inputs(load(m), {"input_features": (1, 80, 200)}))
    return make_plan(g, profile, storage, {"precision": precision, **options})


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_plan_one_gemm_per_attention_block_and_views(precision):
    p = _whisper_plan(precision)
    gemms = [d for d in p.dispatches if d.op == "Linear" and not d.kernel.startswith("linear_reduce")]   # split K: + reduce
    assert len(gemms) == 2 * 4      # per layer: q+k+v, out_proj, fc1, fc2
    d, m_rows = 384, 100
    item = 2 if precision == "fp16" else 4
    for layer in (0, 1):
        qkv = [g for g in gemms if g.node == f"/layers.{layer}/self_attn/q_proj+k_proj+v_proj"]
        assert len(qkv) == 1
        qkv = qkv[0]
        assert qkv.spec[0] == 2                                   # OUT_MODE 2: part-major
        assert np.frombuffer(qkv.push, "<i4")[[1, 6, 7]].tolist() == [3 * d, m_rows, d]   # N, M_total, NP
        out = qkv.writes[0]
        assert p.tensors[out].shape == (3, m_rows, d) and not p.tensors[out].view_of
        att = next(x for x in p.dispatches if x.op == "Attention" and x.node.startswith(f"/layers.{layer}/"))
        q, k, v = att.reads[:3]       # (then the mask binding, q again where there is no mask)
        assert [p.tensors[t].view_of for t in (q, k, v)] == [out] * 3
        assert [p.byte_offset(t) for t in (q, k, v)] == [0, m_rows * d * item, 2 * m_rows * d * item]
        assert all(p.root(t) == out for t in (q, k, v))
        # nothing else writes the parts: no copies
        assert not any(set(x.writes) & {q, k, v} for x in p.dispatches)
    notes = [t for v in p.notes.values() for t in v if "merged 3 sibling Linears" in t]
    assert len(notes) == 2


def test_plan_off_and_texture_keep_three_gemms():
    for p in (_whisper_plan(merge_siblings=False), _whisper_plan(storage="texture", layers=1)):
        n = len([d for d in p.dispatches if d.node.endswith(("q_proj/MatMul", "k_proj/MatMul", "v_proj/MatMul"))])
        assert n == 3 * (2 if p.storage == "buffer" else 1)
        assert not any(t.view_offset for t in p.tensors.values())
    p = _whisper_plan(storage="texture", layers=1)
    assert any("texture storage" in t for t in p.notes["/layers.0/self_attn/q_proj/MatMul"])


def test_lifetimes_follow_the_root():
    p = _whisper_plan(layers=1)
    out = next(d.writes[0] for d in p.dispatches if d.node.endswith("q_proj+k_proj+v_proj"))
    att = next(i for i, d in enumerate(p.dispatches) if d.op == "Attention")
    first, last = p.lifetimes[out]
    assert last == att and first < att
    assert not any(p.tensors[t].view_of for t in p.lifetimes)


# -- numbers ---------------------------------------------------------------------------------------------------
def _count_gemms(model, **options):
    with Session(model, storage="buffer", options=options) as s:
        return sum(d.op == "Linear" for d in s.plan.dispatches)


@pytest.mark.parametrize("case", [
    dict(),                                                       # Whisper-like: q scaled, k without bias
    dict(biases=(True, True, True), scales=(0.5, 2.0, None), act="Gelu", consume=False),   # parts are outputs
    dict(t=40, n=22, biases=(False, True, False), scales=(None, None, None)),   # parts straddle vec4 columns
    dict(batch=2, t=5, k=32, n=64, act="Relu"),
])
def test_matches_onnxruntime_with_poison(case):
    m = qkv_model(**case)
    t, k, b = case.get("t", 37), case.get("k", 64), case.get("batch", 1)
    check_model(m, qkv_feeds(t, k, b))       # buffer (merged) and texture (not merged), poisoned
    assert _count_gemms(m) == 1
    assert _count_gemms(m, merge_siblings=False) == 3


def test_merged_equals_unmerged_exactly():
    """Each output column is the same dot product in the same order: merging changes no bit."""
    m = qkv_model()
    fd = qkv_feeds()
    outs = []
    for on in (True, False):
        with Session(m, storage="buffer", options={"merge_siblings": on, "poison": True}) as s:
            outs.append(s.run(None, fd))
    for a, b in zip(*outs):
        assert a.tobytes() == b.tobytes()


def test_split_copy_fallback(monkeypatch):
    """Where a part cannot be a view (not reached from the pass: it checks alignment first), it is copied."""
    monkeypatch.setattr(SplitParts, "view_ok", staticmethod(lambda off, align: off == 0))
    m = qkv_model()
    check_model(m, qkv_feeds(), storages=("buffer",))
    with Session(m, storage="buffer") as s:
        assert sum(d.op == "SplitParts" for d in s.plan.dispatches) == 2


def _whisper(layers=2):
    return we.build_whisper_encoder("tiny", layers=layers, n_frames=200, seed=6)


@pytest.mark.parametrize("options", [{}, {"fuse_attention": False}])
def test_whisper_2_layers_against_onnxruntime(options):
    model = _whisper()
    x = we.sample_input(n_frames=200, seed=seed())
    ref = onnxruntime_run(model, {"input_features": x})[0]
    with Session(model, storage="buffer", options={"poison": True, **options}) as s:
        assert any(d.node.endswith("q_proj+k_proj+v_proj") for d in s.plan.dispatches)
        y = s.run(x)
    assert cosine(y, ref) >= 0.99999
    assert float(np.abs(y - ref).max()) <= 1e-3 * float(np.abs(ref).max())


def _has_kernel(name):
    return name in json.loads((ROOT / "spirv" / "manifest.json").read_text())["shaders"]


@pytest.mark.parametrize("cm_emulate", [False, True])
@pytest.mark.parametrize("fuse_attention", [False, True])
def test_whisper_fp16_close_to_fp32(cm_emulate, fuse_attention):
    if fuse_attention and not _has_kernel("attention_buffer_half"):
        pytest.skip("no attention_buffer_half kernel in this tree (fp16 attention is written elsewhere)")
    model = _whisper(layers=1)
    x = we.sample_input(n_frames=200, seed=seed())
    opts = {"fuse_attention": fuse_attention}
    with Session(model, storage="buffer", options={**opts, "merge_siblings": False}) as s:
        ref = s.run(x)
    with Session(model, storage="buffer", precision="fp16",
                 options={"poison": True, "coopmat": "emulate" if cm_emulate else "auto", "coopmat2": False,
                          **opts}) as s:
        kernels = {d.kernel for d in s.plan.dispatches if d.node.endswith("q_proj+k_proj+v_proj")}
        assert len(kernels) == 1
        p = s.device.profile      # the H200: tensor cores without emulation, their operands from registers (REGFED)
        want = "linear_cmreg_emu_" if cm_emulate else ("linear_cmreg_" if p.coopmat_layout == "mma" else "linear_cm_") \
            if p.cooperative_matrix else "linear_t"
        assert kernels.pop().startswith(want)
        y = s.run(x)
    rel = float(np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref))
    assert rel <= 2e-3, f"relative L2 {rel:.2e}"


@pytest.mark.parametrize("regfed", [True, False], ids=["linear_cmreg", "linear_cm"])
@pytest.mark.parametrize("case", [dict(), dict(t=40, n=22, act="Gelu"), dict(t=70, n=80, consume=False)])
def test_fp16_tensor_core_epilogue_parts(case, regfed):
    """The emulated cooperative-matrix kernels' part-major epilogues on small shapes whose 64-column blocks straddle parts, against minirt fp32."""
    m = qkv_model(**case)
    fd = qkv_feeds(case.get("t", 37))
    with Session(m, storage="buffer") as s:
        ref = s.run(None, fd)
    with Session(m, storage="buffer", precision="fp16",
                 options={"coopmat": "emulate", "poison": True, "cm_regfed": regfed}) as s:
        gemms = [d.kernel for d in s.plan.dispatches if d.op == "Linear"]
        assert len(gemms) == 1 and gemms[0].startswith("linear_cmreg_emu_" if regfed else "linear_cm_emu_"), gemms
        out = s.run(None, fd)
    for y, r in zip(out, ref):
        rel = float(np.linalg.norm(y.astype(np.float64) - r) / np.linalg.norm(r))
        assert rel <= 2e-3, f"relative L2 {rel:.2e}"
