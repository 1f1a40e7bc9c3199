#!/usr/bin/env python3
"""Model-family benchmark: minirt beside PyTorch (CUDA eager and a CUDA graph) on the same model, weights and input,
in one process. The models are built here in plain torch with seeded weights, in eval mode, and exported to ONNX
by torch's TorchScript exporter (which folds each BatchNorm into the Conv before it, as for a deployed model);
minirt runs that ONNX file.

  python tools/bench_models.py --models resnet50 --batch 1,8 --runs 30
  python tools/bench_models.py --models resnet50 --batch 1 --image 64 --no-torch     # a quick check anywhere
  python tools/bench_models.py --models resnet50 --batch 1 --runs 1 --export r50.onnx  # then: tools/profile r50.onnx

Needs torch and onnx (minirt depends on neither). Every figure is the median wall time of a call over --runs calls
after --warmup untimed ones, the input starting in host memory and the output ending there (for PyTorch: copied
to the device, run, copied back and synchronised). The cosine of minirt's output against PyTorch's fp32 output is
printed beside it.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "tools"))   # benchconfig; last, so nothing in tools/ shadows an installed module


def resnet50(num_classes=1000):
    """ResNet-50 (torchvision's layout: a 7x7 stem with max pooling, bottleneck stages of 3, 4, 6 and 3 blocks with
    the stride on the 3x3 conv, global average pooling, a linear head), seeded, in eval mode."""
    import torch
    from torch import nn

    def conv_bn(cin, cout, k, stride=1, relu=True):
        layers = [nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)]
        return nn.Sequential(*layers, *([nn.ReLU()] if relu else []))

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = 4 * mid
            self.body = nn.Sequential(conv_bn(cin, mid, 1), conv_bn(mid, mid, 3, stride),
                                      conv_bn(mid, cout, 1, relu=False))
            self.skip = conv_bn(cin, cout, 1, stride, relu=False) if stride != 1 or cin != cout else nn.Identity()

        def forward(self, x):
            return torch.relu(self.body(x) + self.skip(x))

    layers, cin = [conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1)], 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = 4 * mid
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes)]
    torch.manual_seed(0)
    model = nn.Sequential(*layers)
    with torch.no_grad():           # BatchNorm statistics that are not the identity
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.0)
                m.bias.uniform_(-0.1, 0.1)
    return model.eval()


MODELS = {"resnet50": (resnet50, lambda batch, image: (batch, 3, image, image))}


def export(model, shape) -> bytes:
    """The model as ONNX (opset 17, TorchScript exporter, a dynamic batch)."""
    import torch
    f = io.BytesIO()
    torch.onnx.export(model, (torch.zeros(shape),), f, opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
    return f.getvalue()


def timed(fn, runs, warmup):
    from benchconfig import timed as median_min
    return median_min(fn, runs, warmup)[0]


def bench_minirt(onnx_bytes, x, precision, args):
    import onnx

    from minirt import Session
    options = dict(o.split("=", 1) for o in args.option)
    with Session(onnx.load_from_string(onnx_bytes), precision=precision, options=options) as s:
        y = s.run(x)
        ms = timed(lambda: s.run(x), args.runs, args.warmup)
        return {"ms": ms, "dispatches": len(s.plan_for({"x": x.shape}).dispatches)}, y


def bench_torch(model, x, precision, args):
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = torch.float16 if precision == "fp16" else torch.float32
    m = model.to("cuda", dt)
    host = torch.from_numpy(x)
    out = {}
    with torch.inference_mode():
        def eager():
            return m(host.to("cuda", dt)).float().cpu()
        out["eager"] = timed(eager, args.runs, args.warmup)
        static_in = host.to("cuda", dt)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = m(static_in)

        def graph():
            static_in.copy_(host.to("cuda", dt))
            g.replay()
            return static_out.float().cpu()
        out["graph"] = timed(graph, args.runs, args.warmup)
        y = eager().numpy()
    model.to("cpu", torch.float32)
    return out, y


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--image", type=int, default=224, help="image side (default 224)")
    ap.add_argument("--precision", default="fp32", help="fp32 and/or fp16, comma-separated")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--no-torch", action="store_true", help="minirt alone (its output against the CPU torch model)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--export", help="also write the exported ONNX model here (one model: for tools/profile)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a minirt Session option (`minirt options`), repeatable: e.g. conv_channels_last=false")
    args = ap.parse_args(argv)
    if any("=" not in o for o in args.option):
        ap.error(f"--option takes KEY=VALUE, got {args.option}")
    try:
        import onnx  # noqa: F401
        import torch
    except ImportError as e:
        ap.error(f"needs torch and onnx: {e}")
    names = [m for m in args.models.split(",") if m]
    if any(m not in MODELS for m in names):
        ap.error(f"unknown model in {names}: choose from {', '.join(MODELS)}")
    use_torch = not args.no_torch and torch.cuda.is_available()
    rows = []
    for name in names:
        build, shape_of = MODELS[name]
        model = build()
        onnx_bytes = export(model, shape_of(1, args.image))
        if args.export:
            Path(args.export).write_bytes(onnx_bytes)
        for batch in (int(b) for b in args.batch.split(",")):
            x = np.random.default_rng(batch).standard_normal(shape_of(batch, args.image)).astype(np.float32)
            with torch.inference_mode():
                ref = model(torch.from_numpy(x)).numpy()
            for precision in args.precision.split(","):
                row = {"model": name, "batch": batch, "precision": precision, "image": args.image}
                try:
                    row["minirt"], y = bench_minirt(onnx_bytes, x, precision, args)
                    row["minirt"]["cosine"] = cosine(y, ref)
                except Exception as e:       # a refusal or a failure: reported, the next row runs
                    row["minirt"] = {"error": f"{type(e).__name__}: {e}"[:300]}
                if use_torch:
                    row["torch"], yt = bench_torch(model, x, precision, args)
                    row["torch"]["cosine"] = cosine(yt, ref)
                rows.append(row)
                print_row(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def print_row(row):
    head = f"{row['model']} batch {row['batch']} {row['precision']} ({row['image']}x{row['image']})"
    mr = row["minirt"]
    if "error" in mr:
        print(f"{head}: minirt failed: {mr['error']}", flush=True)
        return
    line = (f"{head}: minirt {mr['ms']:.3f} ms ({mr['ms'] / row['batch']:.3f} an image; {mr['dispatches']} "
            f"dispatches; cosine {mr['cosine']:.7f})")
    t = row.get("torch")
    if t:
        line += (f"; torch eager {t['eager']:.3f} ms ({t['eager'] / mr['ms']:.2f}x minirt), CUDA graph "
                 f"{t['graph']:.3f} ms ({t['graph'] / mr['ms']:.2f}x)")
    print(line, flush=True)


if __name__ == "__main__":
    main()
