#!/usr/bin/env python3
"""Model-family benchmark: minirt beside PyTorch (CUDA eager and a CUDA graph) on the same model, weights and input,
in one process. The models are built here with seeded weights, in eval mode, and exported to ONNX by torch's
TorchScript exporter (which folds each BatchNorm into the Conv before it, as for a deployed model); minirt runs that
ONNX file. ResNet-50 is plain torch; BERT-base (BertModel: 12 layers, hidden 768, 12 heads, vocabulary 30522) and
GPT-2 small (GPT2Model, no cache: 12 layers, hidden 768, 12 heads, vocabulary 50257) are transformers models built
from their configs with random weights (tools/export_text_families.py's builder), fed random token ids and an
attention mask of ones (int64) of --seq tokens; their output is the last hidden state.

  python tools/bench_models.py --models resnet50 --batch 1,8 --runs 30
  python tools/bench_models.py --models bert_base,gpt2_small --batch 1,8 --seq 128 --precision fp32,fp16
  python tools/bench_models.py --models resnet50 --batch 1 --image 64 --no-torch     # a quick check anywhere
  python tools/bench_models.py --models resnet50 --batch 1 --runs 1 --export r50.onnx  # then: tools/profile r50.onnx

Needs torch and onnx (minirt depends on neither), and transformers for the text models. Every figure is the median
wall time of a call over --runs calls after --warmup untimed ones, the input starting in host memory and the output
ending there (for PyTorch: copied to the device, run, copied back and synchronised; for minirt the text models' mask
arithmetic on the host is in it too). The cosine of minirt's output against PyTorch's fp32 output (on the CPU) is
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
# text models: (family in tools/export_text_families.py, its size)
TEXT_MODELS = {"bert_base": ("bert", dict(hidden=768, heads=12, layers=12, ffn=3072, vocab=30522, positions=512)),
               "gpt2_small": ("gpt2", dict(hidden=768, heads=12, layers=12, ffn=3072, vocab=50257, positions=1024))}


def export(model, shape) -> bytes:
    """The model as ONNX (opset 17, TorchScript exporter, a dynamic batch)."""
    import torch
    f = io.BytesIO()
    torch.onnx.export(model, (torch.zeros(shape),), f, opset_version=17, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
    return f.getvalue()


def text_model(name, seq):
    """(module, ONNX bytes, input names, vocabulary) of a text model: TorchScript, opset 17, dynamic batch and
    sequence."""
    from export_text_families import build
    from export_text_families import export as export_text
    family, size = TEXT_MODELS[name]
    model, names, example = build(family, seq=seq, **size)
    return model, export_text(model, names, example, dynamo=False), names, size["vocab"]


def text_feeds(batch, seq, vocab, seed):
    rng = np.random.default_rng(seed)
    return {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64),
            "attention_mask": np.ones((batch, seq), np.int64)}


def timed(fn, runs, warmup):
    from benchconfig import timed as median_min
    return median_min(fn, runs, warmup)[0]


def bench_minirt(onnx_bytes, feeds, precision, args):
    """feeds: {input name: array}."""
    import onnx

    from minirt import Session
    options = dict(o.split("=", 1) for o in args.option)
    with Session(onnx.load_from_string(onnx_bytes), precision=precision, options=options) as s:
        (y,) = s.run(None, feeds)
        ms = timed(lambda: s.run(None, feeds), args.runs, args.warmup)
        return {"ms": ms, "dispatches": len(s.plan_for({k: v.shape for k, v in feeds.items()}).dispatches)}, y


def bench_torch(model, xs, precision, args):
    """xs: the model's inputs as numpy arrays, in order (float ones cast to the precision, integer ones kept)."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = torch.float16 if precision == "fp16" else torch.float32
    m = model.to("cuda", dt)
    hosts = [torch.from_numpy(x) for x in xs]

    def to_device(h):
        return h.to("cuda", dt) if h.is_floating_point() else h.to("cuda")
    out = {}
    with torch.inference_mode():
        def eager():
            return m(*[to_device(h) for h in hosts]).float().cpu()
        out["eager"] = timed(eager, args.runs, args.warmup)
        static_in = [to_device(h) for h in hosts]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                m(*static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = m(*static_in)

        def graph():
            for d, h in zip(static_in, hosts):
                d.copy_(to_device(h))
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
    ap.add_argument("--models", default="resnet50", help=f"comma-separated, of {', '.join([*MODELS, *TEXT_MODELS])}")
    ap.add_argument("--batch", default="1,8", help="batch sizes, comma-separated")
    ap.add_argument("--image", type=int, default=224, help="image side (default 224)")
    ap.add_argument("--seq", type=int, default=128, help="tokens a sequence, for the text models (default 128)")
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
    if any(m not in MODELS and m not in TEXT_MODELS for m in names):
        ap.error(f"unknown model in {names}: choose from {', '.join([*MODELS, *TEXT_MODELS])}")
    use_torch = not args.no_torch and torch.cuda.is_available()
    rows = []
    for name in names:
        if name in TEXT_MODELS:
            model, onnx_bytes, in_names, vocab = text_model(name, args.seq)
        else:
            build, shape_of = MODELS[name]
            model = build()
            onnx_bytes, in_names = export(model, shape_of(1, args.image)), ["x"]
        if args.export:
            Path(args.export).write_bytes(onnx_bytes)
        for batch in (int(b) for b in args.batch.split(",")):
            if name in TEXT_MODELS:
                feeds = text_feeds(batch, args.seq, vocab, batch)
            else:
                feeds = {"x": np.random.default_rng(batch).standard_normal(shape_of(batch, args.image))
                         .astype(np.float32)}
            xs = [feeds[n] for n in in_names]
            with torch.inference_mode():
                ref = model(*[torch.from_numpy(x) for x in xs]).numpy()
            for precision in args.precision.split(","):
                row = {"model": name, "batch": batch, "precision": precision,
                       "shape": f"{args.seq} tokens" if name in TEXT_MODELS else f"{args.image}x{args.image}"}
                try:
                    row["minirt"], y = bench_minirt(onnx_bytes, feeds, precision, args)
                    row["minirt"]["cosine"] = cosine(y, ref)
                except Exception as e:       # a refusal or a failure: reported, the next row runs
                    row["minirt"] = {"error": f"{type(e).__name__}: {e}"[:300]}
                if use_torch:
                    try:
                        row["torch"], yt = bench_torch(model, xs, precision, args)
                        row["torch"]["cosine"] = cosine(yt, ref)
                    except Exception as e:   # a failed capture, say: reported beside minirt's row
                        row["torch"] = {"error": f"{type(e).__name__}: {e}"[:300]}
                        model.to("cpu", torch.float32)
                rows.append(row)
                print_row(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def print_row(row):
    head = f"{row['model']} batch {row['batch']} {row['precision']} ({row['shape']})"
    mr = row["minirt"]
    if "error" in mr:
        print(f"{head}: minirt failed: {mr['error']}", flush=True)
        return
    line = (f"{head}: minirt {mr['ms']:.3f} ms ({mr['ms'] / row['batch']:.3f} an item; {mr['dispatches']} "
            f"dispatches; cosine {mr['cosine']:.7f})")
    t = row.get("torch")
    if t and "error" in t:
        line += f"; torch failed: {t['error']}"
    elif t:
        line += (f"; torch eager {t['eager']:.3f} ms ({t['eager'] / mr['ms']:.2f}x minirt), CUDA graph "
                 f"{t['graph']:.3f} ms ({t['graph'] / mr['ms']:.2f}x)")
    print(line, flush=True)


if __name__ == "__main__":
    main()
