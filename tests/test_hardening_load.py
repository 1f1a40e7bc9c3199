"""Loading untrusted files: small crafted models that must cost little and fail cleanly. Each case asserts a
minirt error (ModelError / UnsupportedError) that names the thing at fault; the amplification cases run in a
subprocess whose address space is capped, so a regression fails instead of exhausting the machine."""
import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from safetensors.numpy import save_file

from minirt.errors import MinirtError, ModelError
from minirt.infer import bind_inputs, prepare
from minirt.loaders import MAX_LOAD_BYTES, load
from minirt.loaders.safetensors_loader import encoder_param_shapes
from oracle import make_model, rand

ROOT = Path(__file__).resolve().parents[1]
AS_LIMIT = 2 << 30          # address space of the memory-bounded subprocess


def _bounded(code, timeout=120):
    """Run python `code` in a subprocess capped at AS_LIMIT bytes of address space; its stdout's last line as JSON."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=timeout, preexec_fn=cap)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _refusal(src, **kw):
    """The message of the minirt error that loading and preparing `src` raises (None if it loads)."""
    try:
        prepare(load(src, **kw))
    except MinirtError as e:
        return f"{type(e).__name__}: {e}"
    return None


# -- amplification: the bytes load-time folding makes, summed ------------------------------------------

def _fold_chain(n, adds, dtype=TensorProto.FLOAT):
    """ConstantOfShape of n elements, then `adds` chained Adds of constants (each folds at load), added to x."""
    one = helper.make_tensor("one", dtype, [1], [1])
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["c0"], value=one, name="fill")]
    for i in range(adds):
        nodes.append(helper.make_node("Add", [f"c{i}", f"c{i}"], [f"c{i + 1}"], name=f"add{i}"))
    nodes.append(helper.make_node("Add", ["x", f"c{adds}"], ["y"], name="out"))
    return make_model(nodes, {"x": [1]}, ["y"], {"shape": np.array([n], np.int64)})


def test_folding_is_bounded_in_total_not_per_node():
    m = _fold_chain(1 << 20, 8)                     # nine 4 MiB constants, 36 MiB in all
    assert MAX_LOAD_BYTES == 1 << 30
    g = prepare(load(m))                            # well within the default
    assert g.made_bytes == 9 * 4 << 20
    msg = _refusal(m, max_load_bytes=16 << 20)      # 4 MiB each: the fourth Add passes 16 MiB
    assert msg and msg.startswith("ModelError") and "Add node 'add3'" in msg and "max_load_bytes" in msg, msg
    assert "<ModelProto>" in msg


def test_folded_views_cost_nothing():
    """Reshape/Squeeze of a constant share its memory: only new memory counts."""
    w = np.zeros((1024, 1024), np.float32)           # 4 MiB initializer: the file holds it
    nodes = [helper.make_node("Reshape", ["w", "s1"], ["r1"]), helper.make_node("Reshape", ["r1", "s2"], ["r2"]),
             helper.make_node("Reshape", ["r2", "s1"], ["r3"]), helper.make_node("MatMul", ["x", "r3"], ["y"])]
    m = make_model(nodes, {"x": [1, 1024]}, ["y"], {"w": w, "s1": np.array([1024, 1024], np.int64),
                                                     "s2": np.array([-1], np.int64)})
    g = prepare(load(m, max_load_bytes=1 << 20))
    assert g.made_bytes < 1 << 20


def test_amplifying_files_are_refused_in_bounded_memory(tmp_path):
    """A 300-byte ONNX file (ConstantOfShape of 2**28 - 1 floats, eight chained Adds: ~8.5 GB if all folded) and a
    safetensors checkpoint naming one huge layer index, at the default limit, under a 2 GiB address space."""
    onnx.save(_fold_chain((1 << 28) - 1, 8), tmp_path / "bomb.onnx")
    assert (tmp_path / "bomb.onnx").stat().st_size < 400
    d = tmp_path / "ckpt"
    d.mkdir()
    tensors = _tiny_checkpoint()
    tensors["model.encoder.layers.1000000.fc1.bias"] = np.zeros(4 * 64, np.float16)
    save_file(tensors, str(d / "model.safetensors"))
    out = _bounded(f"""
        import json, time
        from minirt.errors import MinirtError
        from minirt.infer import prepare
        from minirt.loaders import load
        res = {{}}
        for p in {[str(tmp_path / "bomb.onnx"), str(d / "model.safetensors")]!r}:
            t0 = time.perf_counter()
            try:
                prepare(load(p))
                res[p] = ["loaded", time.perf_counter() - t0]
            except MinirtError as e:
                res[p] = [type(e).__name__ + ": " + str(e), time.perf_counter() - t0]
        print(json.dumps(res))
    """)
    msg, secs = out[str(tmp_path / "bomb.onnx")]
    assert msg.startswith("ModelError") and "bomb.onnx" in msg and "Add node 'add0'" in msg \
        and "max_load_bytes" in msg, msg
    msg, secs = out[str(d / "model.safetensors")]
    assert msg.startswith("ModelError") and "model.encoder.layers.1000000.fc1.bias" in msg, msg
    assert secs < 5, secs


# -- safetensors checkpoints and their config.json -----------------------------------------------------

CFG = {"d_model": 64, "num_mel_bins": 8, "max_source_positions": 4, "encoder_layers": 1}


def _tiny_checkpoint():
    return {"model.encoder." + k: np.zeros(s, np.float16) for k, s in encoder_param_shapes(CFG).items()}


def _checkpoint_dir(tmp_path, config=None):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    save_file(_tiny_checkpoint(), str(d / "model.safetensors"))
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    return d / "model.safetensors"


WHISPER = {"model_type": "whisper", "d_model": 64, "encoder_layers": 1, "encoder_attention_heads": 1,
           "num_mel_bins": 8, "max_source_positions": 4}


@pytest.mark.parametrize("key", ["d_model", "encoder_layers", "encoder_attention_heads", "num_mel_bins",
                                 "max_source_positions"])
@pytest.mark.parametrize("value", [10 ** 12, 2 ** 63, -3, 0, 1.5, True, "64", None, float("inf")])
def test_absurd_config_values_are_refused_naming_file_and_key(tmp_path, key, value):
    p = _checkpoint_dir(tmp_path, dict(WHISPER, **{key: value}))
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as e:
        load(p)
    assert "config.json" in str(e.value) and key in str(e.value), str(e.value)
    assert time.perf_counter() - t0 < 2


def test_a_good_config_still_loads(tmp_path):
    g = load(_checkpoint_dir(tmp_path, WHISPER))
    assert g.tensor("input_features").shape == (1, 8, 8)


def test_config_json_linked_out_of_the_folder_is_refused(tmp_path):
    p = _checkpoint_dir(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps(dict(WHISPER, encoder_attention_heads=2)))
    os.symlink(outside / "config.json", p.parent / "config.json")
    with pytest.raises(ModelError, match="config.json: a link to .*outside the model's folder"):
        load(p)
    # a link that stays inside the folder is fine
    (p.parent / "config.json").unlink()
    (p.parent / "real.json").write_text(json.dumps(WHISPER))
    os.symlink(p.parent / "real.json", p.parent / "config.json")
    assert load(p).tensor("input_features").shape == (1, 8, 8)


def test_huge_shapes_in_a_safetensors_header_do_not_wrap(tmp_path):
    """Dims whose int64 product wraps to 0 must not pass for an empty tensor."""
    from minirt.loaders.safetensors_loader import SafetensorsFile
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 32, 1 << 32], "data_offsets": [0, 0]}}).encode()
    p = tmp_path / "w.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ModelError, match=r"w\.safetensors: corrupt safetensors header: tensor 'w'"):
        SafetensorsFile(p)


# -- internal ops ------------------------------------------------------------------------------------

@pytest.mark.parametrize("op,ins,attrs", [("Linear", ["x", "w"], {"act": "nonsense"}),
                                          ("Attention", ["x", "x", "x"], {"heads": 1, "scale": 1.0})])
def test_internal_ops_from_a_file_are_refused(op, ins, attrs):
    nodes = [helper.make_node(op, ins, ["y"], name="evil", domain="minirt", **attrs)]
    m = make_model(nodes, {"x": [1, 4, 8]}, ["y"], {"w": rand(64, 8, seed=1)})
    m.opset_import.append(helper.make_opsetid("minirt", 1))
    with pytest.raises(ModelError, match=f"{op} node 'evil' is in domain 'minirt'"):
        load(m)


# -- external data -------------------------------------------------------------------------------------

def _external(tmp_path, **entries):
    w = rand(4, 3, seed=1)
    t = numpy_helper.from_array(w, "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in {"location": "w.bin", **entries}.items():
        t.external_data.add(key=k, value=str(v))
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [2, 4]}, ["y"])
    m.graph.initializer.append(t)
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "w.bin").write_bytes(b"\0" * 16 + w.tobytes())      # the tensor at offset 16, 64 bytes in all
    (d / "m.onnx").write_bytes(m.SerializeToString())
    return d / "m.onnx"


@pytest.mark.parametrize("entries", [
    {"offset": -1, "length": 48}, {"offset": 16, "length": -48}, {"offset": 10 ** 30, "length": 48},
    {"offset": 2 ** 63 - 1, "length": 48}, {"offset": 16, "length": 2 ** 63}, {"offset": 16, "length": 10 ** 30},
    {"offset": 2 ** 62, "length": 2 ** 62}, {"offset": 40, "length": 48}, {"offset": 64},
    {"offset": 65}, {"offset": 16, "length": 44}, {"offset": "1e3"}, {"length": "0x30"}, {"offset": "9" * 5000}])
def test_bad_external_data_entries_are_model_errors(tmp_path, entries):
    p = _external(tmp_path, **entries)
    with pytest.raises(ModelError) as e:
        load(p)
    assert "m.onnx" in str(e.value) and "'w'" in str(e.value), str(e.value)


def test_good_external_data_entry_loads(tmp_path):
    g = load(_external(tmp_path, offset=16, length=48))
    np.testing.assert_array_equal(g.tensor("w").data, rand(4, 3, seed=1))
    g = load(_external(tmp_path, offset=16))              # no length: to the end of the file
    np.testing.assert_array_equal(g.tensor("w").data, rand(4, 3, seed=1))


@pytest.mark.parametrize("exc", [MemoryError, OverflowError, ValueError])
def test_python_errors_while_decoding_a_tensor_are_model_errors(monkeypatch, exc):
    def boom(*a, **kw):
        raise exc("from numpy")
    monkeypatch.setattr(numpy_helper, "to_array", boom)
    m = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": [2, 4]}, ["y"], {"w": rand(4, 3)})
    with pytest.raises(ModelError, match=rf"<ModelProto>: tensor 'w' is corrupt \({exc.__name__}"):
        load(m)


# -- models that are not valid ONNX --------------------------------------------------------------------

def _matmul_with(w):
    return make_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], {"x": [2, 4]}, ["y"], {"w": w})


def _invalid_models():
    x4 = {"x": [2, 4]}
    cases = {}
    for dt in (np.int64, np.bool_, np.float16, np.float64):
        cases[f"{np.dtype(dt).name} MatMul weight"] = (
            _matmul_with(np.ones((4, 3), dt)), r"MatMul node 'mm' mixes float32 'x' and|'w' of MatMul node 'mm'")
    cases["float Reshape shape"] = (make_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], x4, ["y"],
                                               {"s": np.array([8.0], np.float32)}), r"'s' of Reshape node 'r'")
    cases["float Gather indices"] = (make_model([helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=1)],
                                                x4, ["y"], {"i": np.array([0.0, 2.0], np.float32)}),
                                     r"'i' of Gather node 'g'")
    cases["int Add to float"] = (make_model([helper.make_node("Add", ["x", "b"], ["y"], name="a")], x4, ["y"],
                                            {"b": np.ones(4, np.int64)}),
                                 r"Add node 'a' mixes float32 'x' and int64 'b'")
    neg = _matmul_with(np.ones((4, 3), np.float32))
    neg.graph.initializer[0].dims[:] = [-4, -3]
    cases["negative initializer dims"] = (neg, r"tensor 'w' has dims \[-4, -3\]")
    for et, what in ((TensorProto.STRING, "string"), (TensorProto.UNDEFINED, "UNDEFINED")):
        m = make_model([helper.make_node("Relu", ["x"], ["y"])], x4, ["y"])
        m.graph.input[0].type.tensor_type.elem_type = et
        cases[f"{what} input"] = (m, rf"input 'x' .*{what}")
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], x4, ["y"])
    m.opset_import[0].version = 99
    cases["opset 99"] = (m, "ONNX opset 99")
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], x4, ["y"])
    m.ir_version = 99
    cases["ir_version 99"] = (m, "ir_version 99")
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], x4, [])
    cases["no outputs"] = (m, "no outputs")
    cases["unknown attribute"] = (make_model([helper.make_node("Relu", ["x"], ["y"], name="rl", alpha=2.0)], x4,
                                             ["y"]), r"Relu node 'rl' is not valid ONNX .*alpha")
    cases["missing required attribute"] = (make_model([helper.make_node("Concat", ["x", "x"], ["y"], name="c")], x4,
                                                      ["y"]), r"Concat node 'c' is not valid ONNX .*axis")
    return cases


INVALID = _invalid_models()


@pytest.mark.parametrize("what", sorted(INVALID))
def test_invalid_models_are_refused_like_onnxruntime(what):
    import onnxruntime as ort
    m, pattern = INVALID[what]
    with pytest.raises(ModelError, match=pattern):
        prepare(load(m))
    if what == "no outputs":                # onnxruntime makes a session that computes nothing
        return
    so = ort.SessionOptions()
    so.log_severity_level = 4
    with pytest.raises(Exception):          # the oracle refuses it too
        ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_valid_typed_models_still_load():
    """Integer shape arithmetic and a Cast of a float16 weight, typed as ONNX types them, still load and fold."""
    nodes = [helper.make_node("Cast", ["wh"], ["w"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Shape", ["h"], ["sh"]),
             helper.make_node("Gather", ["sh", "i"], ["d"], axis=0),
             helper.make_node("Concat", ["d", "m1"], ["tgt"], axis=0),
             helper.make_node("Reshape", ["h", "tgt"], ["y"])]
    m = make_model(nodes, {"x": [2, 4]}, ["y"], {"wh": np.ones((4, 3), np.float16), "i": np.array([0], np.int64),
                                                 "m1": np.array([-1], np.int64)})
    g = prepare(load(m))
    assert [n.op for n in g.nodes] == ["MatMul", "Reshape"] and g.tensor("y").shape == (2, 3)


# -- symbolic dims -------------------------------------------------------------------------------------

def test_a_model_valid_only_at_other_sizes_passes_the_symbolic_check():
    """x ['n', 3] reshaped to [2, -1]: wrong at n = 1 (3 elements), right at n = 2; the up-front check must not
    bind the symbol to 1 and refuse it."""
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], {"x": ["n", 3]}, ["y"],
                   {"s": np.array([2, -1], np.int64)})
    g = load(m)
    with pytest.raises(ModelError, match="Reshape node 'r'"):
        prepare(bind_inputs(g, {"x": (1, 3)}))
    prepare(g.copy(), symbolic=True)
    assert prepare(bind_inputs(g, {"x": (2, 3)})).tensor("y").shape == (2, 3)
    bad = make_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], {"x": ["n", 3]}, ["y"],
                     {"s": np.array([2, -1, -1], np.int64)})        # wrong at every size: still refused
    with pytest.raises(ModelError, match="more than one -1"):
        prepare(load(bad), symbolic=True)


def test_session_accepts_a_model_valid_only_at_other_sizes():
    """The Session's up-front check refuses only what is wrong at every size; the run at a wrong size says so."""
    from minirt import Session
    m = make_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="r")], {"x": ["n", 3]}, ["y"],
                   {"s": np.array([2, -1], np.int64)})
    with Session(m, storage="buffer") as s:
        x = np.random.default_rng().standard_normal((2, 3)).astype(np.float32)
        assert np.array_equal(s.run(x), x.reshape(2, 3))
        with pytest.raises(ModelError, match="Reshape node 'r'"):
            s.run(np.ones((1, 3), np.float32))
        assert np.array_equal(s.run(x), x)      # usable after the refused run


def test_load_budget_is_a_session_option():
    from minirt import Session
    m = make_model([helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos"),
                    helper.make_node("Add", ["x", "c"], ["y"], name="add")], {"x": [1024]}, ["y"],
                   {"s": np.array([1024], np.int64)})
    with pytest.raises(ModelError, match="max_load_bytes"):
        Session(m, options={"max_load_bytes": 1000})
    with Session(m, storage="buffer", options={"max_load_bytes": 8192}) as s:
        x = np.random.default_rng().standard_normal(1024).astype(np.float32)
        assert np.array_equal(s.run(x), x)


# -- planning time -------------------------------------------------------------------------------------

def _plan_seconds(n):
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.options import Options
    from minirt.planner import make_plan
    idx = np.random.default_rng(0).permutation(n).astype(np.int64)     # n / 2 runs of two: one copy each
    m = make_model([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)], {"x": [n, 4]}, ["y"], {"i": idx})
    g = prepare(load(m))
    t0 = time.perf_counter()
    plan = make_plan(g, KNOWN_PROFILES["lavapipe"], "buffer", Options.make({"storage": "buffer"}))
    assert len(plan.dispatches) > n // 2
    return time.perf_counter() - t0


def test_gather_of_many_shuffled_constant_indices_plans_in_linear_time():
    """20,000 shuffled indices: four times the indices may take about four times as long, not sixteen."""
    small, big = _plan_seconds(5000), _plan_seconds(20000)
    assert big < 8 * small and big < 30, (small, big)
