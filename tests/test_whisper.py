"""The Whisper encoder end to end: both ONNX spellings, both storages, against onnxruntime."""
import sys
from pathlib import Path

import numpy as np
import pytest

from minirt import Session
from oracle import cosine, onnxruntime_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
import whisper_encoder as we  # noqa: E402


def _check(model, x, storage, **kw):
    ref = onnxruntime_run(model, {"input_features": x})[0]
    with Session(model, storage=storage, options={"poison": True}, **kw) as s:
        y = s.run(x)
    assert y.shape == ref.shape
    cos = cosine(y, ref)
    err = float(np.abs(y - ref).max())
    assert cos >= 0.99999, f"cosine {cos}"
    assert err <= 1e-3 * float(np.abs(ref).max()), f"max abs diff {err}"
    return y


@pytest.mark.slow
@pytest.mark.parametrize("opset, storage", [(20, "texture")])
def test_whisper_tiny_full(opset, storage):
    """The real Whisper-tiny encoder shape: input [1, 80, 3000], output [1, 1500, 384], the opset 20 graph in
    texture storage, one of its four layers (the layers repeat the same dispatches; tests/test_safetensors.py runs
    the opset 17 graph and the safetensors one whole and full size in buffers, with OpenAI's weights on speech)."""
    model = we.build_whisper_encoder("tiny", layers=1, opset=opset, seed=opset)
    x = we.sample_input(seed=np.random.SeedSequence().entropy % 2**31)   # fresh input each run
    y = _check(model, x, storage)
    assert y.shape == (1, 1500, 384)


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_whisper_small_config_dynamic_batch(storage):
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=200, dynamic_batch=True, seed=5)
    x = we.sample_input(n_frames=200, seed=np.random.SeedSequence().entropy % 2**31)
    _check(model, x, storage)


def _image_copies(one, batch, n):
    """Whether plan `batch` runs plan `one`'s dispatches (kernel, specialization, local size) with each Conv node's
    repeated n times (image by image) and the rest as they are: then every item's arithmetic is what it is alone."""
    def keys(plan):
        nodes = {}
        for d in plan.dispatches:
            nodes.setdefault(d.node, []).append((d.kernel, d.spec, d.local_size))
        return nodes
    conv = {d.node for d in one.dispatches if d.op == "Conv"}
    k1, kn = keys(one), keys(batch)
    return kn.keys() == k1.keys() and all(kn[node] == k1[node] * (n if node in conv else 1) for node in k1)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_batch_items_equal_single_runs(precision):
    """A batch of 3 through the dynamic-batch encoder: each item matches its run alone (cosine 0.99999999 at fp32),
    with the same bits where the batch's plan is batch 1's with each conv run image by image (the front end alone,
    on lavapipe; a device may pick other GEMM splits for the batch's rows), and the batch matches onnxruntime."""
    from minirt.session import get_device
    if precision == "fp16" and not get_device().profile.storage16:
        pytest.skip("no 16-bit storage buffers: precision fp16 cannot run")
    x = we.sample_input(n_frames=100, seed=np.random.SeedSequence().entropy % 2**31)
    x = np.ascontiguousarray(np.concatenate([x, x[:, :, ::-1], 0.5 * x]))
    for layers in (0, 1):
        model = we.build_whisper_encoder("tiny", layers=layers, d_model=128, heads=2, n_frames=100,
                                         dynamic_batch=True, seed=5)
        with Session(model, storage="buffer", precision=precision, options={"poison": True}) as s:
            y = s.run(x)
            p3, p1 = s.plan_for({"input_features": x.shape}), s.plan_for({"input_features": (1,) + x.shape[1:]})
            assert [d.kernel for d in p3.dispatches].count(
                "im2col_buffer" if precision == "fp32" else "im2col_buffer_half_in32") == 3
            same = _image_copies(p1, p3, 3)
            assert same or layers or get_device().profile.vendor != "llvmpipe"
            for i in range(3):
                one = s.run(x[i:i + 1])[0]
                if same:
                    assert one.tobytes() == y[i].tobytes(), f"item {i}"
                assert cosine(one, y[i]) >= (0.99999999 if precision == "fp32" else 0.99999), f"item {i}"
        ref = onnxruntime_run(model, {"input_features": x})[0]
        assert cosine(y, ref) >= (0.99999 if precision == "fp32" else 0.9999)


@pytest.mark.slow
def test_whisper_small_config_is_deterministic():
    """8 runs of one Session give bit-identical outputs."""
    model = we.build_whisper_encoder("tiny", layers=1, d_model=128, heads=2, n_frames=200, seed=7)
    x = we.sample_input(n_frames=200, seed=3)
    with Session(model) as s:
        outs = {s.run(x).tobytes() for _ in range(8)}
    assert len(outs) == 1


@pytest.mark.parametrize("local", ["24x12", "24x16", "12x12"])
@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_whisper_small_config_in_wave_shaped_groups(storage, local):
    """The group shapes the wave rule picks on desktop GPUs (not powers of two), forced on every forceable kernel
    family of a Whisper layer (GEMMs of both storages, im2col, copies, elementwise)."""
    model = we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=9)
    x = we.sample_input(n_frames=200, seed=np.random.SeedSequence().entropy % 2**31)
    _check(model, x, storage, local_size=local)
