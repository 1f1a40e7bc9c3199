"""Small random-weight models of common families (models/families/, exported by tools/export_families.py from torch
at opset 17) against onnxruntime in both storages: a ResNet-18-like (Conv, Relu, MaxPool, Add, GlobalAveragePool,
Gemm), a MobileNetV2-like (depthwise convs, Clip as ReLU6), a MobileNetV3-like (HardSwish, squeeze-and-excitation
with HardSigmoid) and a UNet-like (MaxPool down, ConvTranspose and a bilinear Resize up, skip Concats; also as
torch.export's exporter writes it at opset 20)."""
from pathlib import Path

import numpy as np
import onnx
import pytest

from minirt import Session
from oracle import STORAGES, cosine, onnxruntime_run, rand

FAMILIES = Path(__file__).resolve().parents[1] / "models" / "families"


@pytest.mark.parametrize("family", ["resnet18_like", "mobilenet_v2_like", "mobilenet_v3_like", "unet_like",
                                    "unet_like_dynamo"])
def test_family_matches_onnxruntime(family):
    model = onnx.load(FAMILIES / f"{family}.onnx")
    x = rand(1, 3, 32, 32, seed=5)
    ref = onnxruntime_run(model, {"input": x})[0]
    for storage in STORAGES:
        with Session(model, storage=storage, options={"poison": True}) as s:
            out = s.run(x)
        assert out.shape == ref.shape
        assert cosine(out, ref) >= 0.99999, f"{family} {storage}: cosine {cosine(out, ref)}"
        err, scale = np.abs(out.astype(np.float64) - ref).max(), np.abs(ref).max()
        assert err <= 1e-3 * scale, f"{family} {storage}: max abs err {err:.3g}, max|ref| {scale:.3g}"
