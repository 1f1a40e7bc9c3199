#!/usr/bin/env python3
"""Exports small random-weight models of common families to ONNX for tests/test_families.py, which runs them against
onnxruntime: a ResNet-18-like, a MobileNetV2-like, a MobileNetV3-like, a UNet-like, an EfficientNet-B0-like, a
ConvNeXt-like, a ViT-like and a wav2vec2-like network and a Conformer block, at reduced widths so that each file is a
few hundred KB. Each is written twice: by torch's TorchScript exporter at opset 17 (<family>.onnx) and by
torch.export's exporter (dynamo=True) at opset 20 (<family>_dynamo.onnx, the weights inside the file). Weights,
BatchNorm and LayerNorm statistics and affines, layer scales and embeddings are seeded; the models are in eval mode.

What the exporters of torch 2.13 write for them: each BatchNorm folded into the Conv before it; the UNet's
nn.Upsample(bilinear, align_corners=False) as a linear Resize (half_pixel) with constant scales; SiLU as Sigmoid and
Mul; the EfficientNet's TensorFlow-style SAME padding as a Pad computed from shapes (TorchScript) or as asymmetric
Conv pads (torch.export); ConvNeXt's channels-first LayerNorm as a ReduceMean chain; the ViT's and the Conformer's q,
k, v picked from a rank-5 [B, T, 3, H, dh] tensor, the ViT's scaled_dot_product_attention with its scale split over q
and k, its nn.MultiheadAttention's q, k, v split through a rank-5 Transpose with unit axes; wav2vec2's GroupNorm as
InstanceNormalization, its weight-normed positional conv folded to one weight, and (torch.export) a Where(IsNaN) guard
after each softmax.

Needs torch, transformers (Wav2Vec2Model), onnx and (for the dynamo export) onnxscript, which minirt does not depend
on: in a separate venv,
    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.13.0 transformers==5.24.0 onnx onnxscript==0.7.2
    /tmp/tv/bin/python tools/export_families.py            # writes models/families/<family>{,_dynamo}.onnx
"""
from __future__ import annotations

import argparse
from pathlib import Path

import onnx
import torch
from torch import nn
from torch.nn.utils.parametrize import is_parametrized

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "models" / "families"
INPUT_SHAPE = (1, 3, 32, 32)
OPSET = 17
DYNAMO_OPSET = 20


def conv_bn(cin, cout, k, stride=1, groups=1, act=None):
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act else []))


# -- ResNet-18: a 7x7 stem with max pooling, 4 stages of 2 basic blocks, global average pooling, a linear head -------
class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, cout, 3, stride, act=nn.ReLU), conv_bn(cout, cout, 3))
        self.skip = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x):
        return torch.relu(self.body(x) + self.skip(x))


class ResNet18Like(nn.Module):
    def __init__(self, widths=(8, 16, 24, 32), classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


# -- MobileNetV2: inverted residuals (1x1 expand, 3x3 depthwise, 1x1 project) with ReLU6 -------------------------
class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand, act=nn.ReLU6, se=False):
        super().__init__()
        mid = cin * expand
        layers = [conv_bn(cin, mid, 1, act=act)] if expand != 1 else []
        layers += [conv_bn(mid, mid, 3, stride, groups=mid, act=act)]
        if se:
            layers.append(SqueezeExcite(mid))
        layers += [conv_bn(mid, cout, 1)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2Like(nn.Module):
    # (expansion, channels, blocks, first stride), as MobileNetV2's table at reduced widths and depth (each distinct
    # shape costs the tests pipeline compiles)
    SETTINGS = [(1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2)]

    def __init__(self, classes=10, act=nn.ReLU6, se=False, last=64, settings=SETTINGS):
        super().__init__()
        layers, cin = [conv_bn(3, 16, 3, 2, act=act)], 16
        for t, c, n, s in settings:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t, act, se and i == n - 1))
                cin = c
        layers.append(conv_bn(cin, last, 1, act=act))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(last, classes))

    def forward(self, x):
        return self.head(self.features(x))


# -- MobileNetV3: the same blocks with hard swish, and squeeze-and-excitation gated by a hard sigmoid ---------------
class SqueezeExcite(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, max(c // 4, 4), 1), nn.ReLU(),
                                  nn.Conv2d(max(c // 4, 4), c, 1), nn.Hardsigmoid())

    def forward(self, x):
        return x * self.gate(x)


def mobilenet_v3_like():
    return MobileNetV2Like(act=nn.Hardswish, se=True, settings=[(1, 8, 1, 1), (4, 12, 2, 2)])


# -- UNet: two down blocks (Conv + BatchNorm + ReLU twice, then max pooling), a bottleneck, two up blocks (one a 2x2
# ConvTranspose of stride 2, the other a bilinear nn.Upsample) each joined with its skip by Concat, a 1x1 conv head ---
def double_conv(cin, cout):
    return nn.Sequential(conv_bn(cin, cout, 3, act=nn.ReLU), conv_bn(cout, cout, 3, act=nn.ReLU))


class UNetLike(nn.Module):
    def __init__(self, widths=(8, 16, 32), classes=2):
        super().__init__()
        a, b, c = widths
        self.down1, self.down2, self.pool = double_conv(3, a), double_conv(a, b), nn.MaxPool2d(2)
        self.bottleneck = double_conv(b, c)
        self.up1 = nn.ConvTranspose2d(c, b, 2, stride=2)
        self.dec1 = double_conv(2 * b, b)
        self.up2 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec2 = double_conv(b + a, a)
        self.head = nn.Conv2d(a, classes, 1)

    def forward(self, x):
        s1 = self.down1(x)
        s2 = self.down2(self.pool(s1))
        y = self.bottleneck(self.pool(s2))
        y = self.dec1(torch.cat([self.up1(y), s2], dim=1))
        y = self.dec2(torch.cat([self.up2(y), s1], dim=1))
        return self.head(y)


# -- EfficientNet-B0: MBConv (1x1 expand, depthwise 3x3 or 5x5, squeeze-and-excitation, 1x1 project) with SiLU; the
# stride-2 depthwise convs pad as TensorFlow's SAME does (more after than before: an explicit Pad, as timm's tf_ models)
class Conv2dSame(nn.Conv2d):
    def forward(self, x):
        pads = []
        for size, k, s in zip(reversed(x.shape[2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((-(-size // s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(nn.functional.pad(x, pads))


class MBConv(nn.Module):
    def __init__(self, cin, cout, k, stride, expand):
        super().__init__()
        mid = cin * expand
        layers = [conv_bn(cin, mid, 1, act=nn.SiLU)] if expand != 1 else []
        dw = (Conv2dSame(mid, mid, k, stride, 0, groups=mid, bias=False) if stride == 2 else
              nn.Conv2d(mid, mid, k, 1, k // 2, groups=mid, bias=False))
        se = max(cin // 4, 4)
        layers += [dw, nn.BatchNorm2d(mid), nn.SiLU()]
        self.body = nn.Sequential(*layers)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, se, 1), nn.SiLU(), nn.Conv2d(se, mid, 1),
                                nn.Sigmoid())
        self.project = conv_bn(mid, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        y = self.project(y * self.se(y))
        return x + y if self.residual else y


class EfficientNetB0Like(nn.Module):
    # (expansion, channels, kernel, first stride, blocks), as B0's table at reduced widths and depth
    SETTINGS = [(1, 8, 3, 1, 1), (6, 12, 3, 2, 2), (6, 16, 5, 2, 1)]

    def __init__(self, classes=10, last=64):
        super().__init__()
        layers, cin = [Conv2dSame(3, 16, 3, 2, 0, bias=False), nn.BatchNorm2d(16), nn.SiLU()], 16
        for t, c, k, s, n in self.SETTINGS:
            for i in range(n):
                layers.append(MBConv(cin, c, k, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, last, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(last, classes))

    def forward(self, x):
        return self.head(self.features(x))


# -- ConvNeXt: a 4x4 stride-4 stem, blocks of depthwise 7x7, LayerNorm, 4x MLP with GELU and layer scale, LayerNorm
# over channels (NCHW: mean and variance over dim 1, as ConvNeXt's channels_first LayerNorm) before each downsampling -
class ChannelsLayerNorm(nn.Module):
    def __init__(self, c, eps=1e-6):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(c)), nn.Parameter(torch.zeros(c)), eps

    def forward(self, x):
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dwconv = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))
        self.gamma = nn.Parameter(torch.ones(c))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)
        y = self.gamma * self.mlp(self.norm(y))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtLike(nn.Module):
    def __init__(self, widths=(16, 32), classes=10):
        super().__init__()
        layers = [nn.Conv2d(3, widths[0], 4, 4), ChannelsLayerNorm(widths[0]), ConvNeXtBlock(widths[0])]
        for cin, c in zip(widths, widths[1:]):
            layers += [ChannelsLayerNorm(cin), nn.Conv2d(cin, c, 2, 2), ConvNeXtBlock(c)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(widths[-1], eps=1e-6)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x):
        return self.head(self.norm(self.features(x).mean((2, 3))))


# -- ViT: a 4x4 stride-4 patch conv, a class token, learned position embeddings, pre-norm blocks (the first's attention
# as timm writes it, the second's nn.MultiheadAttention), the class token's LayerNorm into a linear head ------------
class ViTBlock(nn.Module):
    """timm's attention (a packed q, k, v projection reshaped to rank 5, scaled_dot_product_attention), or with mha
    torchvision's (nn.MultiheadAttention)."""
    def __init__(self, d, heads, mha=False):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        if mha:
            self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        else:
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, n, d = x.shape
        y = self.norm1(x)
        if hasattr(self, "mha"):
            x = x + self.mha(y, y, y, need_weights=False)[0]
        else:
            q, k, v = self.qkv(y).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v)
            x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class ViTLike(nn.Module):
    def __init__(self, d=32, heads=2, depth=2, patch=4, classes=10):
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.zeros(1, (INPUT_SHAPE[2] // patch) ** 2 + 1, d))
        self.blocks = nn.Sequential(*[ViTBlock(d, heads, mha=i % 2 == 1) for i in range(depth)])
        self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


# -- wav2vec2: transformers' Wav2Vec2Model from a small config (a GroupNorm in the first of three feature-extractor
# convs, a positional conv embedding with weight norm, two post-norm encoder layers); a float waveform in, no mask --
class Wav2Vec2Like(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import Wav2Vec2Config, Wav2Vec2Model
        cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                             conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="group",
                             do_stable_layer_norm=False, mask_time_prob=0.0)
        self.model = Wav2Vec2Model(cfg)

    def forward(self, x):
        return self.model(x).last_hidden_state


# -- Conformer block: half feed-forward, self-attention, a convolution module (pointwise conv, GLU, depthwise conv1d,
# BatchNorm, Swish, pointwise conv), half feed-forward, LayerNorm; input [batch, time, features] --------------------
def half_ff(d):
    return nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.SiLU(), nn.Linear(4 * d, d))


class ConformerBlock(nn.Module):
    def __init__(self, d=32, heads=4, kernel=15):
        super().__init__()
        self.ff1, self.ff2 = half_ff(d), half_ff(d)
        self.heads, self.attn_norm, self.qkv, self.proj = heads, nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.conv_norm = nn.LayerNorm(d)
        self.conv = nn.Sequential(nn.Conv1d(d, 2 * d, 1), nn.GLU(dim=1),
                                  nn.Conv1d(d, d, kernel, padding=kernel // 2, groups=d), nn.BatchNorm1d(d),
                                  nn.SiLU(), nn.Conv1d(d, d, 1))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        x = x + 0.5 * self.ff1(x)
        x = x + self.attend(self.attn_norm(x))
        x = x + self.conv(self.conv_norm(x).transpose(1, 2)).transpose(1, 2)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)

    def attend(self, x):
        """Multi-head self-attention spelt out (MatMul, Softmax, MatMul), as many conformer implementations write it."""
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-1, -2) * (d // self.heads) ** -0.5, dim=-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, d))


FAMILIES = {"resnet18_like": ResNet18Like, "mobilenet_v2_like": MobileNetV2Like,
            "mobilenet_v3_like": mobilenet_v3_like, "unet_like": UNetLike, "efficientnet_b0_like": EfficientNetB0Like,
            "convnext_like": ConvNeXtLike, "vit_like": ViTLike, "wav2vec2_like": Wav2Vec2Like,
            "conformer_block": ConformerBlock}
INPUT_SHAPES = {"wav2vec2_like": (1, 1600), "conformer_block": (1, 24, 32)}    # the others take INPUT_SHAPE


def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Seeded weights, and BatchNorm statistics and affines away from the identity, so folding them is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        done = set()
        for m in model.modules():
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            elif isinstance(m, (nn.Conv1d, nn.Conv2d, nn.ConvTranspose2d, nn.Linear)) and not is_parametrized(m):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            elif isinstance(m, (nn.LayerNorm, nn.GroupNorm, ChannelsLayerNorm)):
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
            else:
                continue
            done.update(id(p) for p in m.parameters(recurse=False))
        # the rest (layer scales, class token, position embeddings, a weight norm's magnitude and direction, the
        # attention's packed projections): near the scale of a trained model's
        for p in model.parameters():
            if id(p) not in done:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() > 1 else 0.2))
    return model.eval()


def export(name: str, path: Path, seed: int = 0, dynamo: bool = False) -> Path:
    """The TorchScript exporter at OPSET, or (dynamo) torch.export's at DYNAMO_OPSET with the weights inside the file
    and without the per-node metadata it writes (source paths and line numbers: the file then depends on the model
    alone); the same seeded weights either way."""
    model = randomize(FAMILIES[name](), seed)
    x = torch.randn(INPUT_SHAPES.get(name, INPUT_SHAPE), generator=torch.Generator().manual_seed(seed + 1))
    # (not under no_grad: there nn.MultiheadAttention takes a fused kernel TorchScript's exporter cannot write)
    if dynamo:
        torch.onnx.export(model, (x,), str(path), opset_version=DYNAMO_OPSET, input_names=["input"],
                          output_names=["logits"], dynamo=True, external_data=False)
        proto = onnx.load(str(path))
        for node in proto.graph.node:
            del node.metadata_props[:]
        onnx.save(proto, str(path))
    else:
        torch.onnx.export(model, (x,), str(path), opset_version=OPSET, input_names=["input"], output_names=["logits"],
                          do_constant_folding=True, dynamo=False)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(OUT), help=f"output folder (default {OUT.relative_to(ROOT)})")
    ap.add_argument("families", nargs="*", default=list(FAMILIES), help=f"which (default all: {', '.join(FAMILIES)})")
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    for name in a.families:
        paths = [export(name, Path(a.out) / f"{name}.onnx"),
                 export(name, Path(a.out) / f"{name}_dynamo.onnx", dynamo=True)]
        for p in paths:
            print(f"wrote {p} ({p.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
