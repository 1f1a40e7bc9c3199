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
    "medium": dict(_COMMON, d_model=1024, encoder_layers=24, decoder_layers=24, encoder_attention_heads=16,
                   decoder_attention_heads=16),
    "large-v2": dict(_COMMON, d_model=1280, encoder_layers=32, decoder_layers=32, encoder_attention_heads=20,
                     decoder_attention_heads=20),
    # large-v3 and the models distilled from it: 128 mel bins, 51866 tokens (<|yue|> added, so <|nospeech|> and
    # the timestamps one id later); turbo keeps 4 of the 32 decoder layers, distil-large-v3 2
    "large-v3": dict(_COMMON, num_mel_bins=128, vocab_size=51866, d_model=1280, encoder_layers=32,
                     decoder_layers=32, encoder_attention_heads=20, decoder_attention_heads=20),
    "large-v3-turbo": dict(_COMMON, num_mel_bins=128, vocab_size=51866, d_model=1280, encoder_layers=32,
                           decoder_layers=4, encoder_attention_heads=20, decoder_attention_heads=20),
    "distil-large-v3": dict(_COMMON, num_mel_bins=128, vocab_size=51866, d_model=1280, encoder_layers=32,
                            decoder_layers=2, encoder_attention_heads=20, decoder_attention_heads=20),
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


def random_checkpoint(cfg: dict, seed: int = 0, fast: bool = False) -> tuple[dict, dict]:
    """(weights, config) of a Whisper with config `cfg` (d_model, num_mel_bins, max_source_positions,
    max_target_positions, vocab_size, encoder/decoder_layers, encoder/decoder_attention_heads): weights scaled so
    activations keep a unit scale through the layers (1/sqrt(fan-in) matrices, unit embeddings, layer-norm gains
    near 1, small biases), as VulkanBackend, ReferenceBackend and load_checkpoint's callers take them.
    fast: other (equally seeded) numbers, drawn in float32 with a generator a tensor, on every core: the full-size
    large models' 1.5 billion take seconds this way, minutes the default way."""
    shapes = {f"model.encoder.{k}": s for k, s in encoder_param_shapes(cfg).items()}
    shapes.update({f"model.decoder.{k}": s for k, s in decoder_param_shapes(cfg).items()})

    def scale_shift(name, shape):
        if name.endswith("layer_norm.weight"):
            return 0.1, 1.0
        if name.endswith(".bias"):
            return 0.1, 0.0
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        return (1.0 if "embed" in name else fan_in ** -0.5), 0.0

    if not fast:
        rng = np.random.default_rng(seed)

        def rand(name, shape):
            scale, shift = scale_shift(name, shape)
            return (shift + scale * rng.standard_normal(shape)).astype(np.float32)
        return {k: rand(k, s) for k, s in shapes.items()}, dict(cfg)

    import os
    from concurrent.futures import ThreadPoolExecutor

    def rand_fast(item):
        (name, shape), seq = item
        a = np.random.Generator(np.random.SFC64(seq)).standard_normal(shape, np.float32)  # fills without the GIL
        scale, shift = scale_shift(name, shape)
        a *= np.float32(scale)
        if shift:
            a += np.float32(shift)
        return name, a

    seqs = np.random.SeedSequence(seed).spawn(len(shapes))
    with ThreadPoolExecutor(os.cpu_count() or 1) as ex:
        return dict(ex.map(rand_fast, zip(shapes.items(), seqs))), dict(cfg)


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


# A multilingual vocabulary's language tokens, in Whisper's order (large-v3 adds <|yue|>)
LANGUAGES = ("en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg "
             "lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si km sn yo so "
             "af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw ln ha ba jw su yue").split()


def _text_tokens(n: int) -> dict:
    """The 256 byte tokens, then two-byte tokens that no merge makes (they only fill ids up to the special tokens,
    as a real vocabulary's merged tokens would): {token: id} for ids 0 .. n - 1."""
    chars = _byte_chars()
    vocab = {c: i for i, c in enumerate(chars)}
    pairs = (a + b for a in chars for b in chars)
    while len(vocab) < n:
        vocab[next(pairs)] = len(vocab)
    return vocab


def tokenizer_json(vocab_size: int) -> dict:
    """A tokenizer.json (byte-level BPE) for a Whisper of `vocab_size` tokens: text tokens (_text_tokens), the special
    tokens, and TIMESTAMPS ids left for the timestamps. Below 51865 tokens an English-only layout (SPECIAL_TOKENS
    after as many text tokens as fit); 51865 (large-v2 and before) or 51866 (large-v3, with <|yue|>) Whisper's
    multilingual one: 50257 text tokens, <|endoftext|> 50257, <|startoftranscript|>, the LANGUAGES, <|translate|>,
    <|transcribe|>, <|startoflm|>, <|startofprev|>, <|nocaptions|> (<|nospeech|> in large-v3), <|notimestamps|>."""
    if vocab_size in (51865, 51866):
        n_text = 50257
        langs = LANGUAGES[:vocab_size - 51865 + 99]
        no_speech = "<|nospeech|>" if vocab_size == 51866 else "<|nocaptions|>"
        specials = ["<|endoftext|>", "<|startoftranscript|>", *(f"<|{c}|>" for c in langs), "<|translate|>",
                    "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", no_speech, "<|notimestamps|>"]
    else:
        n_text = vocab_size - len(SPECIAL_TOKENS) - TIMESTAMPS
        if not 256 <= n_text or vocab_size >= 51865:
            raise ValueError(f"an English-only vocabulary of 256 + {len(SPECIAL_TOKENS)} + {TIMESTAMPS} to 51864 "
                             f"tokens, or a multilingual one of 51865 or 51866, got {vocab_size}")
        specials = SPECIAL_TOKENS
    vocab = _text_tokens(n_text)
    added = [{"id": n_text + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(specials)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                      "merges": []}}


def ct2_variables(weights: dict, config: dict):
    """(name, array) pairs of the CTranslate2 WhisperSpec variables holding Hugging Face-named Whisper `weights` (as
    random_checkpoint gives them: the projection tied to the token embedding), one at a time: q, k, v (and the
    cross-attention's k, v) stacked by rows as CTranslate2 fuses them, the k part of the bias zero."""
    def linear(ct, hf, bias=True):
        yield f"{ct}/weight", weights[f"{hf}.weight"]
        if bias:
            yield f"{ct}/bias", weights[f"{hf}.bias"]

    def fused(ct, hfs):
        yield f"{ct}/weight", np.concatenate([weights[f"{h}.weight"] for h in hfs])
        yield f"{ct}/bias", np.concatenate([weights[f"{h}.bias"] if not h.endswith("k_proj") else
                                            np.zeros(len(weights[f"{h}.weight"]), np.float32) for h in hfs])

    def norm(ct, hf):
        yield f"{ct}/gamma", weights[f"{hf}.weight"]
        yield f"{ct}/beta", weights[f"{hf}.bias"]

    def self_attention(ct, hf):         # the encoder's and decoder's layers alike
        yield from fused(f"{ct}/self_attention/linear_0", [f"{hf}.self_attn.{p}_proj" for p in "qkv"])
        yield from linear(f"{ct}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
        yield from norm(f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")

    def ffn(ct, hf):
        yield from linear(f"{ct}/ffn/linear_0", f"{hf}.fc1")
        yield from linear(f"{ct}/ffn/linear_1", f"{hf}.fc2")
        yield from norm(f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm")

    e, d = "model.encoder", "model.decoder"
    for c in ("conv1", "conv2"):
        yield from linear(f"encoder/{c}", f"{e}.{c}")
    yield "encoder/num_heads", np.array(config["encoder_attention_heads"], np.int16)
    yield "encoder/position_encodings/encodings", weights[f"{e}.embed_positions.weight"]
    for i in range(config["encoder_layers"]):
        ct, hf = f"encoder/layer_{i}", f"{e}.layers.{i}"
        yield from self_attention(ct, hf)
        yield from ffn(ct, hf)
    yield from norm("encoder/layer_norm", f"{e}.layer_norm")
    yield "decoder/num_heads", np.array(config["decoder_attention_heads"], np.int16)
    yield "decoder/activation", np.array(3, np.int8)       # GELU
    yield "decoder/pre_norm", np.array(1, np.int8)
    yield "decoder/embeddings/weight", weights[f"{d}.embed_tokens.weight"]
    yield "decoder/position_encodings/encodings", weights[f"{d}.embed_positions.weight"]
    for i in range(config["decoder_layers"]):
        ct, hf = f"decoder/layer_{i}", f"{d}.layers.{i}"
        yield from self_attention(ct, hf)
        yield from linear(f"{ct}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
        yield from fused(f"{ct}/attention/linear_1", [f"{hf}.encoder_attn.k_proj", f"{hf}.encoder_attn.v_proj"])
        yield from linear(f"{ct}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
        yield from norm(f"{ct}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        yield from ffn(ct, hf)
    yield from norm("decoder/layer_norm", f"{d}.layer_norm")


_CT2_CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
              np.dtype(np.float16): 4}


def write_ct2(path, weights: dict, config: dict) -> None:
    """A CTranslate2 model.bin (format version 6, WhisperSpec) of ct2_variables(weights, config), written a variable
    at a time (a full-size large model's 6 GB are not copied whole), the projection an alias of the embedding."""
    import struct

    def string(s):
        b = s.encode() + b"\0"
        return struct.pack("<H", len(b)) + b
    with open(path, "wb") as f:
        f.write(struct.pack("<I", 6) + string("WhisperSpec") + struct.pack("<I", 3))
        count_at, count = f.tell(), 0
        f.write(struct.pack("<I", 0))               # the variable count, written when known
        for name, a in ct2_variables(weights, config):
            count += 1
            a = np.asarray(a)
            f.write(string(name) + struct.pack(f"<B{a.ndim}I", a.ndim, *a.shape))
            f.write(struct.pack("<BI", _CT2_CODES[a.dtype], a.nbytes))
            f.write(np.ascontiguousarray(a, a.dtype.newbyteorder("<")).reshape(-1).view(np.uint8).data)
        f.write(struct.pack("<I", 1) + string("decoder/projection/weight") + string("decoder/embeddings/weight"))
        f.seek(count_at)
        f.write(struct.pack("<I", count))


def write_folder(folder, cfg: dict, seed: int = 0, kind: str = "huggingface", weights: dict | None = None):
    """A Whisper model folder that WhisperModel loads, with random_checkpoint(cfg, seed)'s weights (or `weights`, of
    that config): kind "huggingface" (model.safetensors and config.json) or "ctranslate2" (model.bin), each with a
    tokenizer.json (tokenizer_json: English-only below 51865 tokens, else multilingual). What it transcribes is
    noise, but deterministic: the same folder and audio give the same tokens. Returns the folder."""
    import json
    from pathlib import Path

    if kind not in ("huggingface", "ctranslate2"):
        raise ValueError(f"kind must be 'huggingface' or 'ctranslate2', got {kind!r}")
    folder = Path(folder)
    tokenizer = tokenizer_json(int(cfg["vocab_size"]))
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(cfg)
    if weights is None:
        weights, config = random_checkpoint(cfg, seed)
    if kind == "ctranslate2":
        write_ct2(folder / "model.bin", weights, config)
    else:
        from safetensors.numpy import save_file
        save_file(weights, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps({"model_type": "whisper", **config}, indent=1))
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    return folder
