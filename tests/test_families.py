"""Small random-weight models of common families (models/families/, exported by tools/export_families.py from torch,
each by the TorchScript exporter at opset 17 and as <family>_dynamo by torch.export's at opset 20) against
onnxruntime in both storages: a ResNet-18-like (Conv, Relu, MaxPool, Add, GlobalAveragePool, Gemm), a
MobileNetV2-like (depthwise convs, Clip as ReLU6), a MobileNetV3-like (HardSwish, squeeze-and-excitation with
HardSigmoid), a UNet-like (MaxPool down, ConvTranspose and a bilinear Resize up, skip Concats), an
EfficientNet-B0-like (SiLU as Sigmoid and Mul, squeeze-and-excitation, stride-2 depthwise convs padded as
TensorFlow's SAME: a Pad computed from shapes, or asymmetric Conv pads), a ConvNeXt-like (depthwise 7x7, LayerNorm
over channels spelt out as ReduceMean chains, GELU, layer scale), a ViT-like (patch conv, class token, position
embeddings; one block's attention as timm writes it, q, k, v picked from a rank-5 tensor into
scaled_dot_product_attention, the other's nn.MultiheadAttention, its q, k, v split through a rank-5 Transpose with
unit axes), transformers' Wav2Vec2Model at a small config (GroupNorm as InstanceNormalization, a weight-normed
positional conv, the encoder's NaN guards) and a Conformer block (GLU, depthwise conv1d with BatchNorm folded, Swish,
attention spelt out)."""
from pathlib import Path

import numpy as np
import onnx
import pytest

from minirt import Session
from oracle import STORAGES, cosine, onnxruntime_run, rand

FAMILIES = Path(__file__).resolve().parents[1] / "models" / "families"
NAMES = ["resnet18_like", "mobilenet_v2_like", "mobilenet_v3_like", "unet_like", "efficientnet_b0_like",
         "convnext_like", "vit_like", "wav2vec2_like", "conformer_block"]


@pytest.mark.parametrize("family", [n + s for n in NAMES for s in ("", "_dynamo")])
def test_family_matches_onnxruntime(family):
    model = onnx.load(FAMILIES / f"{family}.onnx")
    x = rand(*[d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim], seed=5)
    ref = onnxruntime_run(model, {"input": x})[0]
    for storage in STORAGES:
        with Session(model, storage=storage, options={"poison": True}) as s:
            out = s.run(x)
        assert out.shape == ref.shape
        assert cosine(out, ref) >= 0.99999, f"{family} {storage}: cosine {cosine(out, ref)}"
        err, scale = np.abs(out.astype(np.float64) - ref).max(), np.abs(ref).max()
        assert err <= 1e-3 * scale, f"{family} {storage}: max abs err {err:.3g}, max|ref| {scale:.3g}"


# What the planner makes of the exporters' patterns (a plan on lavapipe's profile, nothing run): op -> how many
# dispatches, and ops that must not be left.
PLANNED = {"efficientnet_b0_like": ({"Sigmoid": 4}, ("Pad",)),            # SiLU in conv epilogues; the SE gates stay
           "convnext_like": ({"AxisLayerNorm": 2}, ("Pow", "Sqrt", "Div")),
           "vit_like": ({"Attention": 2}, ("Softmax", "MatMul")),          # timm's and nn.MultiheadAttention's
           "conformer_block": ({"Attention": 1}, ("Softmax",)),
           "wav2vec2_like": ({"Attention": 2, "InstanceNormalization": 1}, ("Softmax", "Mul", "ReplaceNaN"))}


@pytest.mark.parametrize("family", [n + s for n in PLANNED for s in ("", "_dynamo")])
def test_family_plans(family):
    from minirt.device_profile import KNOWN_PROFILES
    from minirt.infer import prepare
    from minirt.loaders import load
    from minirt.planner import make_plan
    model = onnx.load(FAMILIES / f"{family}.onnx")
    counts, absent = PLANNED[family.removesuffix("_dynamo")]
    for storage in STORAGES:
        ops = [d.op for d in make_plan(prepare(load(model)), KNOWN_PROFILES["lavapipe"], storage).dispatches]
        assert {op: ops.count(op) for op in counts} == counts and not set(absent) & set(ops), (storage, ops)
