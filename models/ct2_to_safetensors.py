#!/usr/bin/env python3
"""Convert a CTranslate2 Whisper model.bin (faster-whisper) to Hugging Face-named safetensors.

    python models/ct2_to_safetensors.py path/to/model.bin -o whisper-tiny.en/model.safetensors

Writes the encoder (`model.encoder.*`) and the decoder (`model.decoder.*`; the output projection is
tied to the token embeddings as in Hugging Face, so it is not written unless the file has its own),
and a config.json beside the output with Hugging Face WhisperConfig keys. Weights keep their stored
dtype (float16 in faster-whisper files) unless --dtype float32. Quantized (int8) files are refused.

The model.bin reader consumes the file exactly: a short read or bytes left over is an error, and so
is a variable this converter does not know (nothing is dropped silently). The reading and the name mapping
are minirt.whisper.ct2's (minirt's WhisperModel reads a model.bin the same way, in memory). The format:
../shared/reference/ctranslate2-whisper.md.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

try:
    from minirt.whisper.ct2 import CT2FormatError, ct2_to_hf, read_ct2
except ImportError:      # run from a checkout where minirt is not installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from minirt.whisper.ct2 import CT2FormatError, ct2_to_hf, read_ct2

__all__ = ["CT2FormatError", "read_ct2", "ct2_to_hf", "convert", "main"]


def convert(model_bin, output, encoder_only=False, dtype=None):
    """model.bin -> output (.safetensors) and config.json beside it. Returns the HF config."""
    from safetensors.numpy import save_file
    _, variables, aliases = read_ct2(model_bin)
    tensors, config = ct2_to_hf(variables, aliases, encoder_only, source=str(model_bin))
    for k, a in tensors.items():
        if dtype is not None and np.issubdtype(a.dtype, np.floating):
            tensors[k] = np.ascontiguousarray(a.astype(dtype))
    out_dir = os.path.dirname(os.path.abspath(output))
    os.makedirs(out_dir, exist_ok=True)
    tmp = f"{output}.tmp{os.getpid()}"
    save_file(tensors, tmp, metadata={"format": "pt", "converted_from": os.path.basename(str(model_bin))})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)    # safetensors creates its file 0600
    os.replace(tmp, output)
    cfg_tmp = os.path.join(out_dir, f"config.json.tmp{os.getpid()}")
    with open(cfg_tmp, "w") as f:
        json.dump(config, f, indent=2)
    os.replace(cfg_tmp, os.path.join(out_dir, "config.json"))
    return config


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_bin", help="CTranslate2 Whisper model.bin")
    ap.add_argument("-o", "--output", required=True, help="output .safetensors (config.json goes beside it)")
    ap.add_argument("--encoder-only", action="store_true", help="write only model.encoder.*")
    ap.add_argument("--dtype", choices=("float16", "float32"), help="cast floating weights (default: as stored)")
    args = ap.parse_args(argv)
    try:
        cfg = convert(args.model_bin, args.output, args.encoder_only, args.dtype)
    except CT2FormatError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {args.output} and config.json: d_model {cfg['d_model']}, {cfg['encoder_layers']} encoder / "
          f"{cfg.get('decoder_layers', 0)} decoder layers, {cfg['num_mel_bins']} mel bins")


if __name__ == "__main__":
    main()
