#!/usr/bin/env python3
"""fp32 accuracy by fp32_precision: each scheme's output against a float64 run of the same graph (minirt's numpy
references) and, for ONNX models, beside onnxruntime's fp32; and how many distinct outputs it gives over repeated
runs. By default the model is the Whisper tiny encoder with seeded random weights and a seeded input.

  python tools/fp32_accuracy.py                                     # Whisper tiny, random weights, ieee and f16x3
  python tools/fp32_accuracy.py whisper-tiny.en/model.safetensors models/speech-sample.wav --runs 60
  python tools/fp32_accuracy.py --layers 1 --frames 200 --option coopmat=emulate      # any device (slow)

Per scheme: max |y - ref| / max |ref|, relative L2 error and cosine against float64, the same against onnxruntime
where it runs the model, the kernels that did the GEMMs and the attention, and the distinct outputs over --runs runs.
The float64 run computes every op in float64 from the same float32 weights and input."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))   # the checkout's minirt, installed or not


def errors(y, ref) -> str:
    y, ref = np.asarray(y, np.float64).ravel(), np.asarray(ref, np.float64).ravel()
    rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    cos = float(y @ ref / np.linalg.norm(y) / np.linalg.norm(ref))
    return f"max {np.abs(y - ref).max() / np.abs(ref).max():.3e}  rel L2 {rel:.3e}  cosine {cos:.10f}"


def load_input(path, shape):
    if path is None:
        from models.whisper_encoder import sample_input
        if len(shape) == 3 and isinstance(shape[2], int):
            return sample_input(n_mels=shape[1], n_frames=shape[2], seed=4)
        return np.random.default_rng(4).standard_normal([d if isinstance(d, int) else 1 for d in shape]
                                                        ).astype(np.float32)
    if str(path).endswith(".wav"):
        from minirt.audio import whisper_features
        return whisper_features(path)
    return np.load(path).astype(np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", help="an ONNX or safetensors model (default: the Whisper encoder below)")
    ap.add_argument("input", nargs="?", help=".npy or (a Whisper encoder) a 16 kHz .wav; default: seeded random")
    ap.add_argument("--size", default="tiny", help="the default model's Whisper size")
    ap.add_argument("--layers", type=int, help="the default model's layers (default: the size's)")
    ap.add_argument("--frames", type=int, default=3000, help="the default model's input frames")
    ap.add_argument("--schemes", default="ieee,f16x3", help="fp32_precision values, comma-separated")
    ap.add_argument("--runs", type=int, default=20, help="runs per scheme for the distinct-output count")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="a Session option, repeatable")
    a = ap.parse_args(argv)

    from minirt import Session
    from minirt.graph_reference import run_graph
    model = a.model
    if model is None:
        from models import whisper_encoder as we
        model = we.build_whisper_encoder(a.size, layers=a.layers, n_frames=a.frames, seed=3)
    options = dict(o.split("=", 1) for o in a.option)
    with Session(model, storage="buffer", options=options) as s:
        graph, name, device = s.graph, s.inputs[0].name, s.device.profile.name
        x = load_input(a.input, s.inputs[0].shape)
    ref = next(iter(run_graph(graph, {name: x}).values()))
    ort = None
    if not isinstance(model, (str, Path)) or str(model).endswith(".onnx"):
        try:
            import onnx
            import onnxruntime
            proto = model if not isinstance(model, (str, Path)) else onnx.load(model)
            sess = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
            ort = sess.run(None, {name: x})[0]
        except ImportError:
            pass
    print(f"{a.model or f'Whisper {a.size} encoder (random weights)'} on {device}, input {list(x.shape)}; errors "
          f"relative to max |float64| = {np.abs(ref).max():.4g}")
    if ort is not None:
        print(f"  {'onnxruntime fp32':<16} vs float64: {errors(ort, ref)}")
    for scheme in a.schemes.split(","):
        with Session(model, storage="buffer", options={**options, "fp32_precision": scheme, "poison": True}) as s:
            kernels = sorted({d.kernel for d in s.plan.dispatches
                              if d.kernel.startswith(("linear", "gemm", "attention"))})
            outs = [s.run(x) for _ in range(a.runs)]
        y = outs[0]
        print(f"  {scheme:<16} vs float64: {errors(y, ref)}")
        if ort is not None:
            print(f"  {'':<16} vs onnxruntime: {errors(y, ort)}")
        print(f"  {'':<16} {len({o.tobytes() for o in outs})} distinct output(s) in {a.runs} runs; GEMM and attention "
              f"kernels: {', '.join(kernels)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
