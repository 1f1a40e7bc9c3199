#!/usr/bin/env python3
"""Exports small random-weight models of common families to ONNX (opset 17) for tests/test_families.py, which runs
them against onnxruntime: a ResNet-18-like, a MobileNetV2-like, a MobileNetV3-like and a UNet-like network, at
reduced widths so that each file is a few hundred KB. Weights and BatchNorm statistics are seeded; the models are in
eval mode, and torch's TorchScript exporter folds each BatchNorm into the Conv before it (as for a deployed model).
The UNet-like is also exported by torch.export's exporter (dynamo=True) at opset 20, as unet_like_dynamo.onnx. Either
way torch 2.13 writes the UNet's nn.Upsample(bilinear, align_corners=False) as a linear Resize (half_pixel) with
constant scales, and folds the BatchNorms.

Needs torch, onnx and (for the dynamo export) onnxscript, which minirt does not depend on: in a separate venv,
    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch==2.13.0 onnx onnxscript   # onnxscript 0.7.2 was used
    /tmp/tv/bin/python tools/export_families.py            # writes models/families/<family>.onnx
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "models" / "families"
INPUT_SHAPE = (1, 3, 32, 32)
OPSET = 17
DYNAMO_OPSET = 20
DYNAMO_FAMILIES = ("unet_like",)    # also exported by torch.export's exporter, as <family>_dynamo.onnx


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


FAMILIES = {"resnet18_like": ResNet18Like, "mobilenet_v2_like": MobileNetV2Like,
            "mobilenet_v3_like": mobilenet_v3_like, "unet_like": UNetLike}


def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Seeded weights, and BatchNorm statistics and affines away from the identity, so folding them is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            elif isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.randn(m.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if m.bias is not None:
                    m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    return model.eval()


def export(name: str, path: Path, seed: int = 0, dynamo: bool = False) -> Path:
    """The TorchScript exporter at OPSET, or (dynamo) torch.export's at DYNAMO_OPSET with the weights inside the file;
    the same seeded weights either way."""
    model = randomize(FAMILIES[name](), seed)
    x = torch.randn(INPUT_SHAPE, generator=torch.Generator().manual_seed(seed + 1))
    if dynamo:
        torch.onnx.export(model, (x,), str(path), opset_version=DYNAMO_OPSET, input_names=["input"],
                          output_names=["logits"], dynamo=True, external_data=False)
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
        paths = [export(name, Path(a.out) / f"{name}.onnx")]
        if name in DYNAMO_FAMILIES:
            paths.append(export(name, Path(a.out) / f"{name}_dynamo.onnx", dynamo=True))
        for p in paths:
            print(f"wrote {p} ({p.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
