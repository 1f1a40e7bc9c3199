"""Seeded random Whisper checkpoints (Hugging Face names, float32) for benchmarks and tests: the work a model does
depends on its shapes, not on its weights, and real checkpoints are too large to carry everywhere.

    weights, config = random_checkpoint(SIZES["tiny"], seed=0)
    backend = VulkanBackend(weights, config)
"""
from __future__ import annotations

import numpy as np

from ..loaders.safetensors_loader import encoder_param_shapes

_COMMON = {"num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448, "vocab_size": 51865}

# OpenAI's shapes (multilingual vocabulary; the .en models have 51864 tokens)
SIZES = {
    "tiny": dict(_COMMON, d_model=384, encoder_layers=4, decoder_layers=4, encoder_attention_heads=6,
                 decoder_attention_heads=6),
    "base": dict(_COMMON, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                 decoder_attention_heads=8),
    "small": dict(_COMMON, d_model=768, encoder_layers=12, decoder_layers=12, encoder_attention_heads=12,
                  decoder_attention_heads=12),
}


def decoder_param_shapes(cfg: dict) -> dict[str, tuple]:
    """The HF names (without the model.decoder. prefix) and shapes of a Whisper decoder's parameters."""
    d = cfg["d_model"]
    s = {"embed_tokens.weight": (cfg["vocab_size"], d), "embed_positions.weight": (cfg["max_target_positions"], d),
         "layer_norm.weight": (d,), "layer_norm.bias": (d,)}
    for i in range(cfg["decoder_layers"]):
        p = f"layers.{i}."
        for att in ("self_attn", "encoder_attn"):
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                s[f"{p}{att}.{proj}.weight"] = (d, d)
                if proj != "k_proj":
                    s[f"{p}{att}.{proj}.bias"] = (d,)
        for ln in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
            s[f"{p}{ln}.weight"], s[f"{p}{ln}.bias"] = (d,), (d,)
        s[f"{p}fc1.weight"], s[f"{p}fc1.bias"] = (4 * d, d), (4 * d,)
        s[f"{p}fc2.weight"], s[f"{p}fc2.bias"] = (d, 4 * d), (d,)
    return s


def random_checkpoint(cfg: dict, seed: int = 0) -> tuple[dict, dict]:
    """(weights, config) of a Whisper with config `cfg` (d_model, num_mel_bins, max_source_positions,
    max_target_positions, vocab_size, encoder/decoder_layers, encoder/decoder_attention_heads): weights scaled so
    activations keep a unit scale through the layers (1/sqrt(fan-in) matrices, unit embeddings, layer-norm gains
    near 1, small biases), as VulkanBackend, ReferenceBackend and load_checkpoint's callers take them."""
    rng = np.random.default_rng(seed)

    def rand(name, shape):
        if name.endswith("layer_norm.weight"):
            return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        if name.endswith(".bias"):
            return (0.1 * rng.standard_normal(shape)).astype(np.float32)
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        scale = 1.0 if "embed" in name else fan_in ** -0.5
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    w = {f"model.encoder.{k}": rand(k, s) for k, s in encoder_param_shapes(cfg).items()}
    w.update({f"model.decoder.{k}": rand(k, s) for k, s in decoder_param_shapes(cfg).items()})
    return w, dict(cfg)
