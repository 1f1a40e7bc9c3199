"""The large Whisper models' shapes end to end: for each size, a seeded random checkpoint of its exact shapes
(minirt.whisper.synthetic.SIZES: medium, large-v2, large-v3 with 128 mel bins, 51866 tokens and <|nospeech|>,
large-v3-turbo with 4 decoder layers, distil-large-v3 with 2) written in each checkpoint format minirt loads (a
CTranslate2 folder, a Hugging Face safetensors folder), and one 30 s window of seeded noise transcribed from it by
WhisperModel on the Vulkan backend and on the numpy reference: greedy, English, without timestamps, the special
tokens and white space suppressed so that exactly --tokens text tokens decode. Prints per size and format whether
the tokens are equal (and the first difference), the largest logit difference over the reference's steps (its calls
replayed on the GPU, relative to the reference's largest logit), and the wall times; exits 1 where any fp32 tokens
differ. At fp16 the reference rounds its weights to float16 as well, and the agreement is reported, not required.

    python tools/dev/large_sizes.py                                  # all five sizes, full size, both formats
    python tools/dev/large_sizes.py --sizes medium --layers 2,2 --formats ct2 --tokens 8

Each size's weights are drawn once (float32, on every core) and written to a temporary folder per format, which is
deleted before the next size (a full-size large-v2 is 6.2 GB a format).
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

SIZES = ("medium", "large-v2", "large-v3", "large-v3-turbo", "distil-large-v3")
FORMATS = {"ct2": "ctranslate2", "hf": "huggingface"}


class Recorder:
    """Wraps a backend's encode/start/step to keep what the reference saw and gave (features, prompt, each step's
    tokens and logits), for replaying on the GPU."""

    def __init__(self, backend):
        self.calls, self.logits = [], []
        for name in ("encode", "start", "step"):
            setattr(backend, name, self._wrap(name, getattr(backend, name)))

    def _wrap(self, name, fn):
        def call(*args):
            out = fn(*args)
            self.calls.append((name, [np.array(a) if not isinstance(a, list) else list(a) for a in args]))
            if out is not None:
                self.logits.append(np.array(out, np.float32))
            return out
        return call


def suppressed(tok, n_vocab: int) -> list:
    """<|endoftext|> and every token after it, and the text tokens that are only white space: what is left decodes to
    text, so the window's one segment is kept (a segment of no text is dropped, as faster-whisper drops it) and holds
    exactly the tokens asked for."""
    return [i for i in range(tok.eot) if not tok.tokenizer.decode([i]).strip()] + list(range(tok.eot, n_vocab))


def transcribe(folder, backend, precision, tokens, audio):
    """(tokens, load s, transcribe s, model, Recorder of the reference's calls or None) of one window through
    WhisperModel."""
    from minirt.whisper import WhisperModel
    t0 = time.perf_counter()
    model = WhisperModel(folder, precision=precision, backend=backend)
    if backend == "reference":
        model.backend.threads = None        # BLAS on every core: the full-size encoder is ~2 TFLOP
    t1 = time.perf_counter()
    rec = Recorder(model.backend) if backend == "reference" else None
    suppress = suppressed(model.tokenizer, int(model.config["vocab_size"]))
    segs, _ = model.transcribe(audio, language="en", beam_size=1, temperature=0.0, without_timestamps=True,
                               condition_on_previous_text=False, suppress_tokens=suppress,
                               no_speech_threshold=None, log_prob_threshold=None,
                               compression_ratio_threshold=None,
                               max_new_tokens=max(1, 2 * tokens - 4))   # CTranslate2 stops at half the prompt + that
    got = [t for s in segs for t in s.tokens]
    return got, t1 - t0, time.perf_counter() - t1, model, rec


def replay(vulkan, rec) -> float:
    """The reference's calls replayed on the Vulkan backend: the largest |logit difference| over every step,
    relative to the reference's largest |logit|."""
    worst, i = 0.0, 0
    for name, args in rec.calls:
        out = getattr(vulkan, name)(*args)
        if out is not None:
            ref = rec.logits[i]
            worst = max(worst, float(np.abs(np.asarray(out) - ref).max() / np.abs(ref).max()))
            i += 1
    return worst


def first_difference(a, b):
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None and len(a) != len(b):
        i = min(len(a), len(b))
    if i is None:
        return "-"
    return f"@{i}: {a[i] if i < len(a) else 'end'} vs {b[i] if i < len(b) else 'end'}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(SIZES), help="comma-separated (default: %(default)s)")
    ap.add_argument("--formats", default="ct2,hf", help="ct2 and/or hf (default: %(default)s)")
    ap.add_argument("--layers", default=None, help="E,D: encoder and decoder layers (default: the model's); every "
                                                   "width stays the model's")
    ap.add_argument("--tokens", type=int, default=16, help="greedy tokens decoded, 3 to 222 (default: %(default)s)")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tmp", default=None, help="folder for the checkpoints (default: the system's temporary one)")
    args = ap.parse_args(argv)
    if not 3 <= args.tokens <= 222:
        ap.error("--tokens: 3 to 222 (the 4-token prompt and twice the tokens within Whisper's 448 positions)")
    sys.stdout.reconfigure(line_buffering=True)     # each line as it comes, also into a file cut short by a timeout

    from minirt.whisper.synthetic import SIZES as CONFIGS, random_checkpoint, write_folder
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    for s in sizes:
        if s not in CONFIGS:
            ap.error(f"unknown size {s!r}; known: {', '.join(CONFIGS)}")
    for f in formats:
        if f not in FORMATS:
            ap.error(f"unknown format {f!r}; known: {', '.join(FORMATS)}")
    audio = (0.1 * np.random.default_rng(args.seed + 1).standard_normal(30 * 16000)).astype(np.float32)
    exact = args.precision == "fp32"
    rows, failed = [], False
    print(f"greedy, {args.tokens} tokens, special and white-space tokens suppressed, {args.precision}, one 30 s "
          f"window of noise")
    for size in sizes:
        cfg = dict(CONFIGS[size])
        if args.layers:
            e, d = (int(x) for x in args.layers.split(","))
            cfg.update(encoder_layers=e, decoder_layers=d)
        t0 = time.perf_counter()
        weights, cfg = random_checkpoint(cfg, args.seed, fast=True)
        n_params = sum(a.size for a in weights.values())
        gen_s = time.perf_counter() - t0
        shape = (f"d {cfg['d_model']}, {cfg['encoder_layers']}+{cfg['decoder_layers']} layers, "
                 f"{cfg['num_mel_bins']} mels, {cfg['vocab_size']} tokens, {n_params / 1e9:.2f} B parameters")
        print(f"\n{size} ({shape}): drawn in {gen_s:.1f} s")
        tmp = tempfile.mkdtemp(prefix=f"minirt-{size}-", dir=args.tmp)
        try:
            folders = {}
            for f in formats:
                t0 = time.perf_counter()
                folders[f] = write_folder(os.path.join(tmp, f), cfg, kind=FORMATS[f], weights=weights)
                print(f"  {f}: written in {time.perf_counter() - t0:.1f} s")
            del weights
            ref_tokens = {}
            for f in formats:
                try:
                    want, ref_load, ref_s, ref_model, rec = transcribe(folders[f], "reference", args.precision,
                                                                       args.tokens, audio)
                    del ref_model
                    gc.collect()
                    got, vk_load, vk_s, vk_model, _ = transcribe(folders[f], "vulkan", args.precision,
                                                                 args.tokens, audio)
                    t0 = time.perf_counter()
                    diff = replay(vk_model.backend, rec)
                    replay_s = time.perf_counter() - t0
                    vk_model.backend.close()
                    del vk_model
                    gc.collect()
                except Exception as e:     # one size's failure is reported, the others still run
                    print(f"  {f}: FAILED: {type(e).__name__}: {e}")
                    failed = True
                    continue
                ref_tokens[f] = want
                same = got == want
                agree = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
                failed |= exact and not same
                print(f"  {f}: tokens equal: {'yes' if same else 'NO'} ({agree}/{len(want)} agree; first "
                      f"difference {first_difference(got, want)}); max logit diff {diff:.2e} of the largest; "
                      f"vulkan load {vk_load:.1f} s, transcribe {vk_s:.2f} s; reference load {ref_load:.1f} s, "
                      f"transcribe {ref_s:.1f} s; replay {replay_s:.2f} s")
                if not same:
                    print(f"      vulkan    {got}\n      reference {want}")
                rows.append((size, f, same, agree, len(want), diff))
            if len(set(map(tuple, ref_tokens.values()))) > 1:
                print(f"  the reference's tokens differ between formats: {ref_tokens}")
                failed = True
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\nsize              format  tokens equal  agree   max logit diff")
    for size, f, same, agree, n, diff in rows:
        print(f"{size:17s} {f:7s} {'yes' if same else 'NO':13s} {agree:>3d}/{n:<3d} {diff:.2e}")
    expected = len(sizes) * len(formats)
    if len(rows) < expected:
        print(f"{expected - len(rows)} of {expected} runs failed")
    return 1 if failed or len(rows) < expected else 0


if __name__ == "__main__":
    sys.exit(main())
