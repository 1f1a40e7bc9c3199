"""The checks of a Whisper checkpoint at load: its config against its weights (every tensor a layer needs there,
at the shape the config and d_model give it, floating point and finite), and the tokenizer against the model's
vocabulary. Each failure is a ModelError naming the file and the key or tensor, raised before anything is planned,
so a malformed folder never reaches the decoder as an internal error or a silently wrong transcript.
"""
from __future__ import annotations

import os
import re

import numpy as np

from ..errors import ModelError
from .decoding import MAX_LENGTH

TIMESTAMPS = 1501           # <|0.00|> .. <|30.00|>: the tokens after <|notimestamps|> in every Whisper vocabulary
_REQUIRED = ("vocab_size", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads")
_MATCH_WEIGHTS = {          # config key -> (tensor, axis) that must agree with it, where the config has the key
    "d_model": ("model.encoder.conv1.weight", 0),
    "num_mel_bins": ("model.encoder.conv1.weight", 1),
    "max_source_positions": ("model.encoder.embed_positions.weight", 0),
    "max_target_positions": ("model.decoder.embed_positions.weight", 0),
    "vocab_size": ("model.decoder.embed_tokens.weight", 0),
}


def _config_int(config: dict, key: str, config_file: str, minimum: int = 1) -> int:
    if key not in config:
        raise ModelError(f"{config_file}: no '{key}' (a Whisper config.json has it)")
    v = config[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ModelError(f"{config_file}: '{key}' is {v!r}, not an integer")
    if v < minimum:
        raise ModelError(f"{config_file}: '{key}' is {v}; it must be at least {minimum}")
    return v


def layer_shapes(side: str, d: int, ffn: int) -> dict:
    """{name within a layer: shape} of one encoder or decoder layer of width d and feed-forward width ffn."""
    s = {}
    for att in ("self_attn",) + (("encoder_attn",) if side == "decoder" else ()):
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            s[f"{att}.{proj}.weight"] = (d, d)
            if proj != "k_proj":
                s[f"{att}.{proj}.bias"] = (d,)
    for ln in ("self_attn_layer_norm", "final_layer_norm") + (("encoder_attn_layer_norm",) if side == "decoder"
                                                              else ()):
        s[f"{ln}.weight"], s[f"{ln}.bias"] = (d,), (d,)
    s["fc1.weight"], s["fc1.bias"], s["fc2.weight"], s["fc2.bias"] = (ffn, d), (ffn,), (d, ffn), (d,)
    return s


def check_checkpoint(weights: dict, config: dict, config_file: str, weights_file: str) -> None:
    """ModelError naming `config_file` or `weights_file` and the key or tensor where the config and the weights
    do not make a Whisper this runtime transcribes with."""
    if not isinstance(config, dict):
        raise ModelError(f"{config_file}: not a JSON object of config keys")
    n = {k: _config_int(config, k, config_file) for k in _REQUIRED}

    def tensor(name, rank, why=""):
        if name not in weights:
            raise ModelError(f"{weights_file}: no '{name}'{why}")
        a = weights[name]
        if a.ndim != rank:
            raise ModelError(f"{weights_file}: '{name}' is {list(a.shape)}, not of rank {rank}")
        return a

    conv1 = tensor("model.encoder.conv1.weight", 3)
    d, n_mels, kernel = conv1.shape
    if kernel != 3:
        raise ModelError(f"{weights_file}: 'model.encoder.conv1.weight' is {list(conv1.shape)}: a kernel of "
                         f"{kernel}; Whisper's convolutions have a kernel of 3")
    for key, (name, axis) in _MATCH_WEIGHTS.items():
        if key in config:
            want = _config_int(config, key, config_file)
            got = tensor(name, 2 if name != "model.encoder.conv1.weight" else 3).shape[axis]
            if got != want:
                raise ModelError(f"{config_file}: '{key}' is {want}, but {weights_file}'s '{name}' is "
                                 f"{list(weights[name].shape)}")
    for side in ("encoder", "decoder"):
        heads = n[f"{side}_attention_heads"]
        if d % heads:
            raise ModelError(f"{config_file}: '{side}_attention_heads' is {heads}, which does not divide d_model "
                             f"{d} (the width of '{weights_file}'s model.encoder.conv1.weight)")
    expected = {"model.encoder.conv1.bias": (d,), "model.encoder.conv2.weight": (d, d, 3),
                "model.encoder.conv2.bias": (d,), "model.encoder.layer_norm.weight": (d,),
                "model.encoder.layer_norm.bias": (d,), "model.decoder.layer_norm.weight": (d,),
                "model.decoder.layer_norm.bias": (d,)}
    n_audio = tensor("model.encoder.embed_positions.weight", 2).shape[0]
    n_text = tensor("model.decoder.embed_positions.weight", 2).shape[0]
    vocab = tensor("model.decoder.embed_tokens.weight", 2).shape[0]
    expected.update({"model.encoder.embed_positions.weight": (n_audio, d),
                     "model.decoder.embed_positions.weight": (n_text, d),
                     "model.decoder.embed_tokens.weight": (vocab, d)})
    if "proj_out.weight" in weights:
        expected["proj_out.weight"] = (vocab, d)
    if vocab != n["vocab_size"]:
        raise ModelError(f"{config_file}: 'vocab_size' is {n['vocab_size']}, but {weights_file}'s "
                         f"'model.decoder.embed_tokens.weight' has {vocab} rows")
    if n_text < MAX_LENGTH:
        raise ModelError(f"{weights_file}: 'model.decoder.embed_positions.weight' has {n_text} positions; a 30 s "
                         f"window's prompt and tokens need {MAX_LENGTH}")
    for side in ("encoder", "decoder"):
        layers = n[f"{side}_layers"]
        found = {int(m.group(1)) for k in weights for m in [re.match(rf"model\.{side}\.layers\.(\d+)\.", k)] if m}
        extra = sorted(i for i in found if i >= layers)
        if extra:
            raise ModelError(f"{config_file}: '{side}_layers' is {layers}, but {weights_file} has weights of "
                             f"{side} layer {extra[0]}")
        for i in range(layers):
            p = f"model.{side}.layers.{i}."
            why = f" ({os.path.basename(config_file)}'s '{side}_layers' is {layers})"
            ffn = tensor(p + "fc1.weight", 2, why).shape[0]
            expected.update({p + k: s for k, s in layer_shapes(side, d, ffn).items()})
    for name, shape in expected.items():
        if name not in weights:
            raise ModelError(f"{weights_file}: no '{name}'")
        a = weights[name]
        if tuple(a.shape) != tuple(shape):
            raise ModelError(f"{weights_file}: '{name}' is {list(a.shape)}, expected {list(shape)} (d_model {d})")
    for name, a in weights.items():
        if a.dtype.kind != "f":
            raise ModelError(f"{weights_file}: '{name}' holds {a.dtype}; Whisper's weights are floating point")
        if not _finite(getattr(a, "scale", a)):    # an int8 weight is finite where its scales are (QuantizedWeight)
            raise ModelError(f"{weights_file}: '{name}' holds NaN or infinite values")


def _finite(a: np.ndarray) -> bool:
    """Every element finite: a sum first (one pass, no mask), the elementwise test where the sum is not."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(a.sum(dtype=np.float32)):
            return True
    return bool(np.isfinite(a).all())


def check_begin_suppress(tokens, vocab: int, source: str) -> list:
    """suppress_blank's token list (generation_config.json's begin_suppress_tokens, CTranslate2's
    suppress_ids_begin): token ids of the vocabulary; ModelError naming `source` (file and key) otherwise."""
    if tokens is None:
        return []
    if not isinstance(tokens, list):
        raise ModelError(f"{source} is {tokens!r}, not a list of token ids")
    for i, t in enumerate(tokens):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
            raise ModelError(f"{source}[{i}] is {t!r}, not a token id of the model's {vocab}")
    return list(tokens)


def check_tokenizer(tokenizer, vocab: int, tokenizer_path: str, config_file: str) -> None:
    """The tokenizer's special tokens and timestamps within the model's vocabulary: ModelError naming both files
    where the tokenizer is another model's."""
    size = tokenizer.tokenizer.get_vocab_size()
    if size > vocab:
        raise ModelError(f"{tokenizer_path}: {size} tokens, more than the model's vocabulary of {vocab} "
                         f"({config_file}'s vocab_size): the tokenizer is another model's")
    timestamps = vocab - tokenizer.timestamp_begin
    if timestamps != TIMESTAMPS:
        raise ModelError(f"{tokenizer_path}: <|notimestamps|> is token {tokenizer.no_timestamps}, which leaves "
                         f"{timestamps} timestamp tokens in the model's vocabulary of {vocab} ({config_file}'s "
                         f"vocab_size); Whisper has {TIMESTAMPS}: the tokenizer is another model's")
