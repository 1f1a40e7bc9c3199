"""Find and read a Whisper checkpoint folder: Hugging Face (model.safetensors + config.json) or CTranslate2 /
faster-whisper (model.bin + config.json), each with a tokenizer.json (or, in a CTranslate2 folder, its
vocabulary.txt / vocabulary.json). Weights come out Hugging Face-named, as
ReferenceBackend (and the Vulkan decoder) take them.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from ..errors import ModelError
from .checkpoint_checks import check_begin_suppress, check_checkpoint


@dataclass
class Checkpoint:
    folder: str
    kind: str                     # "huggingface" or "ctranslate2"
    weights: dict                 # Hugging Face names -> arrays (stored dtype)
    config: dict                  # Hugging Face WhisperConfig keys
    tokenizer_path: str           # tokenizer.json, or a CTranslate2 vocabulary.txt / vocabulary.json
    begin_suppress: list = field(default_factory=list)     # suppress_blank's tokens; [] = the tokenizer's default
    alignment_heads: list = None  # [(layer, head)] for word timestamps, where the checkpoint lists them

    @property
    def multilingual(self) -> bool:
        return int(self.config["vocab_size"]) >= 51865


def _read_json(path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(doc, dict):
        raise ModelError(f"{path}: a JSON {type(doc).__name__}, not an object of keys")
    return doc


def _folder(path) -> str:
    path = os.fspath(path)
    if os.path.isfile(path) and os.path.basename(path) in ("model.safetensors", "model.bin"):
        return os.path.dirname(os.path.abspath(path))
    if not os.path.exists(path):
        raise ModelError(f"{path}: no such model folder")
    if not os.path.isdir(path):
        raise ModelError(f"{path}: give the model's folder (with model.safetensors or model.bin, config.json and "
                         f"tokenizer.json)")
    return path


# Every file load_checkpoint may read; minirt.whisper.hub downloads these and nothing else of a repo
CHECKPOINT_FILES = ("model.safetensors", "model.bin", "config.json", "generation_config.json", "tokenizer.json",
                    "vocabulary.json", "vocabulary.txt")


def checkpoint_files(folder) -> tuple[str, str, str]:
    """(kind, weights file, tokenizer file) of checkpoint folder `folder`, found by name as load_checkpoint finds
    them, reading nothing: kind "huggingface" (model.safetensors) or "ctranslate2" (model.bin); the tokenizer is
    tokenizer.json, else a CTranslate2 vocabulary.json / vocabulary.txt. ModelError naming what is missing."""
    st, ct = os.path.join(folder, "model.safetensors"), os.path.join(folder, "model.bin")
    if os.path.isfile(st):
        kind, weights = "huggingface", st
    elif os.path.isfile(ct):
        kind, weights = "ctranslate2", ct
    else:
        others = sorted(f for f in os.listdir(folder) if f.endswith((".bin", ".safetensors", ".pt", ".onnx")))
        raise ModelError(f"{folder}: no model.safetensors (Hugging Face) or model.bin (CTranslate2) found"
                         + (f"; found {', '.join(others)}" if others else ""))
    # a CTranslate2 vocabulary file will do (vocabulary.py rebuilds the merges)
    tok = next((os.path.join(folder, f) for f in ("tokenizer.json", "vocabulary.json", "vocabulary.txt")
                if os.path.isfile(os.path.join(folder, f))), None)
    if tok is None:
        raise ModelError(f"{folder}: no tokenizer.json (nor a CTranslate2 vocabulary.txt / vocabulary.json); "
                         f"copy the tokenizer.json of the matching Hugging Face Whisper model (e.g. "
                         f"openai/whisper-tiny.en) into the folder")
    return kind, weights, tok


def load_checkpoint(path) -> Checkpoint:
    """Read the checkpoint in folder `path` (or the folder of a model.safetensors / model.bin given directly).
    Raises ModelError naming what is missing or malformed."""
    folder = _folder(path)
    kind, path, tok = checkpoint_files(folder)
    weights, config, kind = _read_hf(folder, path) if kind == "huggingface" else _read_ct2(path)
    if "decoder_layers" not in config or "model.decoder.embed_tokens.weight" not in weights:
        raise ModelError(f"{folder}: the checkpoint has no decoder (an encoder-only conversion?); transcription "
                         f"needs the whole model")
    check_checkpoint(weights, config, os.path.join(folder, "config.json") if kind == "huggingface" else path, path)
    vocab = int(config["vocab_size"])
    # suppress_blank's tokens and the alignment heads: CTranslate2's config.json, or Hugging Face's
    # generation_config.json
    extra = os.path.join(folder, "config.json" if kind == "ctranslate2" else "generation_config.json")
    key = "suppress_ids_begin" if kind == "ctranslate2" else "begin_suppress_tokens"
    cfg = _read_json(extra) if os.path.isfile(extra) else {}
    begin = check_begin_suppress(cfg.get(key), vocab, f"{extra}: '{key}'") if cfg else []
    heads = None
    if cfg.get("alignment_heads"):
        from .words import check_alignment_heads
        heads = check_alignment_heads(cfg["alignment_heads"], int(config["decoder_layers"]),
                                      int(config["decoder_attention_heads"]), extra)
    return Checkpoint(folder, kind, weights, config, tok, begin, heads)


def _read_hf(folder, st):
    cfg_path = os.path.join(folder, "config.json")
    if not os.path.isfile(cfg_path):
        raise ModelError(f"{folder}: model.safetensors without config.json")
    config = _read_json(cfg_path)
    if config.get("model_type", "whisper") != "whisper":
        raise ModelError(f"{cfg_path}: model_type is {config.get('model_type')!r}, not 'whisper'")
    try:
        from safetensors.numpy import load_file
        weights = load_file(st)
    except Exception as e:       # safetensors raises its own error types for a bad header
        raise ModelError(f"{st}: not a readable safetensors file ({e})") from None
    if "model.encoder.conv1.weight" not in weights:
        raise ModelError(f"{st}: no model.encoder.conv1.weight; not a Hugging Face Whisper checkpoint")
    return weights, config, "huggingface"


def _read_ct2(path):
    from .ct2 import ct2_to_hf, read_ct2
    _, variables, aliases = read_ct2(path)
    weights, config = ct2_to_hf(variables, aliases, source=str(path))
    return weights, config, "ctranslate2"
