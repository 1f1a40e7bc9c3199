#!/usr/bin/env python3
"""Developer check of the Whisper path against the PyTorch implementations (not part of CI: needs torch
and transformers, which minirt's tests never do). Run it with a Python that has both, e.g.

    /tmp/torchenv/bin/python tools/dev/check_whisper_torch.py [--wav models/speech-sample.wav]

It compares, on the spoken sample:
  1. minirt.audio's log-mel with openai-whisper's own `whisper.audio.log_mel_spectrogram` (torch.stft,
     taken from the openai-whisper sdist on PyPI) and with transformers' WhisperFeatureExtractor;
  2. the tiny.en encoder minirt builds from the converted safetensors (evaluated with the float64 numpy
     graph evaluator, no Vulkan needed) with transformers' WhisperEncoder (torch, float32) on the same
     weights;
and prints tiny.en's greedy transcript of the sample (transformers' decoder), which checks the
CTranslate2 conversion end to end. Exit status 1 when a comparison misses its bound.
"""
from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]   # the checkout's minirt; tests/real_whisper.py


def openai_whisper_audio(tmp):
    """whisper.audio from the openai-whisper sdist, importable without the rest of the package."""
    import real_whisper
    top = real_whisper.WHISPER_SDIST[:-len(".tar.gz")]
    with tarfile.open(real_whisper.whisper_sdist()) as t:
        for name in ("audio.py", "utils.py", "assets/mel_filters.npz"):
            out = Path(tmp) / "whisper" / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(t.extractfile(f"{top}/whisper/{name}").read())
    (Path(tmp) / "whisper" / "__init__.py").write_text("")
    sys.path.insert(0, tmp)
    import whisper.audio
    return whisper.audio


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wav", default=str(ROOT / "models" / "speech-sample.wav"))
    args = ap.parse_args()
    import torch
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    import real_whisper
    from minirt import audio
    from minirt.whisper.audio_input import load_audio
    from minirt.loaders import load
    from minirt.loaders.safetensors_loader import read_safetensors
    from minirt.graph_reference import run_graph

    ok = True

    def report(what, diff, bound):
        nonlocal ok
        ok &= diff <= bound
        print(f"{'ok  ' if diff <= bound else 'FAIL'} {what}: max abs diff {diff:.3g} (bound {bound:g})")

    samples = load_audio(args.wav)
    ours = audio.whisper_features(samples)
    with tempfile.TemporaryDirectory() as tmp:
        wa = openai_whisper_audio(tmp)
        ref = wa.log_mel_spectrogram(wa.pad_or_trim(torch.from_numpy(samples))).numpy()
    report("log-mel vs openai-whisper log_mel_spectrogram (torch.stft)", float(np.abs(ours[0] - ref).max()), 1e-4)
    hf_fe = WhisperFeatureExtractor(feature_size=80)(samples, sampling_rate=16000, return_tensors="np").input_features
    report("log-mel vs transformers WhisperFeatureExtractor", float(np.abs(ours - hf_fe).max()), 1e-4)

    path = real_whisper.tiny_en_safetensors()
    cfg = json.loads((path.parent / "config.json").read_text())
    cfg.pop("architectures", None)
    model = WhisperForConditionalGeneration(WhisperConfig(**cfg)).eval()
    state = {k: torch.from_numpy(v) for k, v in read_safetensors(path).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"proj_out.weight"}, (missing, unexpected)   # tied to embed_tokens
    with torch.no_grad():
        enc = model.model.encoder(torch.from_numpy(ours)).last_hidden_state
    y = run_graph(load(path), {"input_features": ours})["last_hidden_state"]
    t = enc.numpy().astype(np.float64)
    cos = float((y.ravel() @ t.ravel()) / np.linalg.norm(y) / np.linalg.norm(t))
    print(f"     encoder: cosine {cos:.9f} between minirt's graph (float64) and transformers (float32)")
    report("encoder vs transformers WhisperEncoder", float(np.abs(y - t).max()), 1e-3 * float(np.abs(t).max()))

    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(real_whisper.tokenizer_json()))
    sot, eot, no_ts = (tok.token_to_id(s) for s in ("<|startoftranscript|>", "<|endoftext|>", "<|notimestamps|>"))
    ids = [sot, no_ts]
    with torch.no_grad():
        for _ in range(60):
            nxt = int(model(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            if nxt == eot:
                break
            ids.append(nxt)
    print(f"     tiny.en transcript: {tok.decode(ids[2:]).strip()!r} (spoken: {real_whisper.SPEECH_TEXT!r})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
