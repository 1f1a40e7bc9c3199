#!/usr/bin/env python3
"""precision fp16 against fp32 on one model and input: relative L2 error, cosine and max abs difference, for the
default fp16 path (cooperative matrices where the device has them) and with coopmat=False (the scalar half kernels).

  python tools/dev/fp16_accuracy.py MODEL [INPUT.npy|INPUT.wav]      # default input: seeded random of the input shape
  python tools/dev/fp16_accuracy.py ~/.cache/minirt/whisper-tiny.en/model.safetensors models/speech-sample.wav
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the checkout's minirt, installed or not


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("input", nargs="?")
    ap.add_argument("--storage", default="buffer")
    a = ap.parse_args(argv)
    from minirt import Session
    with Session(a.model, storage=a.storage) as s:
        if a.input and a.input.endswith(".wav"):
            from minirt.audio import whisper_features
            x = whisper_features(a.input)
        elif a.input:
            x = np.load(a.input).astype(np.float32)
        else:
            shape = [d if isinstance(d, int) else 1 for d in s.inputs[0].shape]
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        ref = s.run(x).astype(np.float64)
        device = s.device.profile.name
    print(f"{a.model} on {device}, storage {a.storage}, input {list(x.shape)}")
    for label, opts in (("fp16 (default kernels)", {}), ("fp16, coopmat=False", {"coopmat": False})):
        with Session(a.model, storage=a.storage, precision="fp16", options=opts) as s:
            y = s.run(x).astype(np.float64)
            kernels = sorted({d.kernel for d in s.plan.dispatches if "_cm" in d.kernel})
        rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        cos = float(y.ravel() @ ref.ravel() / np.linalg.norm(y) / np.linalg.norm(ref))
        print(f"  {label:<24} rel L2 {rel:.3e}  cosine {cos:.8f}  max |diff| {np.abs(y - ref).max():.4g}  "
              f"cooperative-matrix kernels: {', '.join(kernels) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
