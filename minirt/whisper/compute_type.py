"""faster-whisper's compute_type for a Whisper checkpoint: the precision its plans run at and whether its Linear
weights are int8 (minirt/quant.py), from one function, apply_compute_type.

  default, auto           the precision asked for; weights as the file holds them (a CTranslate2 int8 model.bin
                          stays int8, a float one float)
  float32, float16        precision fp32 / fp16; int8 weights of the file dequantized to float
  int8, int8_float32      precision fp32, every Linear weight int8 (a float file's quantized at load per output row,
                          symmetric, as CTranslate2 does)
  int8_float16            precision fp16, Linear weights int8
  int8_bfloat16           as int8_float16 (minirt has no bfloat16 storage: its closest)
The Linear weights are the attention projections, fc1 and fc2 of every layer, and the token embedding, which the
logits read (tied) or proj_out; the convolutions stay float, and so does the embedding lookup (the Gather reads the
dequantized table)."""
from __future__ import annotations

import re

import numpy as np

from ..quant import COMPUTE_TYPES, QuantizedWeight, quantize_checkpoint

_LINEAR = re.compile(r"(\.(q_proj|k_proj|v_proj|out_proj|fc1|fc2)\.weight|^proj_out\.weight|"
                     r"^model\.decoder\.embed_tokens\.weight)$")


def linear_weight_names(weights: dict) -> list:
    return [n for n in weights if _LINEAR.search(n)]


def apply_compute_type(compute_type, precision: str, weights: dict) -> tuple[str, dict]:
    """(precision, weights) for WhisperModel's compute_type (None: precision and weights as given). A ValueError
    naming the option for an unknown value."""
    if compute_type is None or compute_type in ("default", "auto"):
        return precision, weights
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type must be one of {', '.join(COMPUTE_TYPES)}, got {compute_type!r}")
    if compute_type.startswith("int8"):
        precision = "fp32" if compute_type in ("int8", "int8_float32") else "fp16"
        return precision, quantize_checkpoint(weights, linear_weight_names(weights))
    floats = {n: np.asarray(w, np.float32) if isinstance(w, QuantizedWeight) else w for n, w in weights.items()}
    return ("fp32" if compute_type == "float32" else "fp16"), floats
