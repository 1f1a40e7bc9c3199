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
    # 128 mel bins and one more token (<|yue|>); its token embedding alone is 253 MiB at float32
    "large-v3": dict(_COMMON, num_mel_bins=128, vocab_size=51866, d_model=1280, encoder_layers=32, decoder_layers=32,
                     encoder_attention_heads=20, decoder_attention_heads=20),
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


# The special tokens of an English-only Whisper vocabulary (.en models: no language tokens), in Whisper's order right
# after the text tokens; the timestamps <|0.00|> .. <|30.00|> fill the ids after them
SPECIAL_TOKENS = ("<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
                  "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>")
TIMESTAMPS = 1501


def _byte_chars() -> list:
    """GPT-2's byte-level alphabet: the character standing for each byte 0..255."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def tokenizer_json(vocab_size: int) -> dict:
    """A tokenizer.json (byte-level BPE) for an English-only Whisper of `vocab_size` tokens: the 256 byte tokens, then
    two-byte tokens that no merge makes (they only fill ids up to the special tokens, as a real vocabulary's merged
    tokens would), SPECIAL_TOKENS, and TIMESTAMPS ids left for the timestamps."""
    chars = _byte_chars()
    n_text = vocab_size - len(SPECIAL_TOKENS) - TIMESTAMPS
    if not 256 <= n_text or vocab_size >= 51865:
        raise ValueError(f"an English-only vocabulary of 256 + {len(SPECIAL_TOKENS)} + {TIMESTAMPS} to 51864 tokens, "
                         f"got {vocab_size}")
    vocab = {c: i for i, c in enumerate(chars)}
    pairs = (a + b for a in chars for b in chars)
    while len(vocab) < n_text:
        vocab[next(pairs)] = len(vocab)
    specials = [{"id": n_text + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": specials, "normalizer": None,
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": []}}


def write_folder(folder, cfg: dict, seed: int = 0):
    """A Whisper model folder that WhisperModel loads, with random_checkpoint(cfg, seed)'s weights: model.safetensors,
    config.json and tokenizer.json (tokenizer_json: English-only, so cfg's vocab_size is below 51865). What it
    transcribes is noise, but deterministic: the same folder and audio give the same tokens. Returns the folder."""
    import json
    from pathlib import Path

    from safetensors.numpy import save_file
    folder = Path(folder)
    tokenizer = tokenizer_json(int(cfg["vocab_size"]))
    folder.mkdir(parents=True, exist_ok=True)
    weights, config = random_checkpoint(cfg, seed)
    save_file(weights, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "whisper", **config}, indent=1))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    return folder
