"""Read a CTranslate2 Whisper model.bin (faster-whisper's format) and map its variables to Hugging Face
Whisper names, in memory.

The reader consumes the file exactly: a short read or bytes left over is an error, and so is a variable the
mapping does not know (nothing is dropped silently). Quantized files (int8, int8_float16, int8_float32, int8_bfloat16:
int8 weights with a per-row `weight_scale`) give their Linear weights and the token embedding as
minirt.quant.QuantizedWeight (int8 on the GPU; np.asarray gives the float weight), their conv weights dequantized to
float. models/ct2_to_safetensors.py writes the result as a safetensors file.
"""
from __future__ import annotations

import re
import struct

import numpy as np

from ..errors import ModelError
from ..quant import QuantizedWeight, from_ct2

# CTranslate2 dtype codes
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: "bfloat16"}
_GELU = 3   # ctranslate2.specs.common_spec.Activation.GELU


class CT2FormatError(ModelError, ValueError):
    """A model.bin that is truncated, has bytes left over, or holds something the mapping does not know."""


def read_ct2(path):
    """(spec name, {variable name: ndarray}, {alias: target}) of a CTranslate2 model.bin.
    bfloat16 variables are widened to float32 (numpy has no bfloat16)."""
    with open(path, "rb") as f:
        buf = f.read()
    pos = 0

    def take(n, what):
        nonlocal pos
        if pos + n > len(buf):
            raise CT2FormatError(f"{path}: truncated: {what} needs bytes [{pos}, {pos + n}) but the file has "
                                 f"{len(buf)}")
        b = buf[pos:pos + n]
        pos += n
        return b

    def u(fmt, what):
        return struct.unpack("<" + fmt, take(struct.calcsize(fmt), what))[0]

    def string(what):
        n = u("H", what)
        raw = take(n, what)
        try:
            return raw.rstrip(b"\0").decode("utf-8")
        except UnicodeDecodeError:
            raise CT2FormatError(f"{path}: corrupt: {what} at byte {pos - n} is not text") from None

    version = u("I", "the version")
    if not 1 <= version <= 6:
        raise CT2FormatError(f"{path}: not a CTranslate2 model.bin (version {version}; known 1 to 6)")
    spec = string("the spec name") if version >= 2 else ""
    if version >= 2:
        u("I", "the spec revision")
    n_vars = u("I", "the variable count")
    variables = {}
    for i in range(n_vars):
        name = string(f"variable {i}'s name")
        rank = u("B", f"the rank of '{name}'")
        shape = tuple(u("I", f"the shape of '{name}'") for _ in range(rank))
        code = u("B", f"the dtype of '{name}'")
        if code not in _CT2_DTYPES:
            raise CT2FormatError(f"{path}: variable '{name}' has unknown dtype code {code}")
        nbytes = u("I", f"the byte count of '{name}'")
        dt = _CT2_DTYPES[code]
        item = 2 if dt == "bfloat16" else np.dtype(dt).itemsize
        if nbytes != int(np.prod(shape, dtype=np.int64)) * item:
            raise CT2FormatError(f"{path}: variable '{name}' {list(shape)} declares {nbytes} bytes, "
                                 f"expected {int(np.prod(shape)) * item}")
        raw = take(nbytes, f"the data of '{name}'")
        if dt == "bfloat16":
            arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, np.dtype(dt).newbyteorder("<"))
        if name in variables:
            raise CT2FormatError(f"{path}: variable '{name}' appears twice")
        variables[name] = arr.reshape(shape)
    aliases = {}
    if version >= 3:
        for i in range(u("I", "the alias count")):
            alias = string(f"alias {i}")
            aliases[alias] = string(f"the target of alias '{alias}'")
    if pos != len(buf):
        raise CT2FormatError(f"{path}: corrupt: {len(buf) - pos} byte(s) left over after the last entry "
                             f"(read {pos} of {len(buf)})")
    if spec and spec != "WhisperSpec":
        raise CT2FormatError(f"{path}: a CTranslate2 {spec}, not a WhisperSpec")
    for a, t in aliases.items():
        if t not in variables:
            raise CT2FormatError(f"{path}: alias '{a}' points at '{t}', which is not in the file")
    return spec, variables, aliases


def read_ct2_spec(path) -> str:
    """The spec name in a model.bin's header ("WhisperSpec" for Whisper; "" before version 2), reading only the
    header's first bytes."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
            if len(head) < 4:
                raise CT2FormatError(f"{path}: truncated: {len(head)} bytes")
            version = struct.unpack("<I", head[:4])[0]
            if not 1 <= version <= 6:
                raise CT2FormatError(f"{path}: not a CTranslate2 model.bin (version {version}; known 1 to 6)")
            if version < 2:
                return ""
            n = struct.unpack("<H", head[4:6])[0] if len(head) == 6 else 0
            return f.read(n).rstrip(b"\0").decode("utf-8", "replace")
    except OSError as e:
        raise CT2FormatError(f"{path}: not readable ({e.strerror or e})") from None


def ct2_to_hf(variables: dict, aliases: dict | None = None, encoder_only=False, source="model.bin"):
    """({HF name: array}, HF config dict) from read_ct2's variables. Every variable must be mapped
    (or be a known scalar flag); anything else is a CT2FormatError naming it."""
    v = dict(variables)
    aliases = dict(aliases or {})
    out = {}
    used = set()

    def get(name):
        if name not in v:
            raise CT2FormatError(f"{source}: variable '{name}' is missing")
        scale = name + "_scale"
        if name.endswith("/weight") and scale in v:
            used.update((name, scale))
            try:
                w = from_ct2(v[name], v[scale], name, source) if v[name].ndim == 2 else None
            except ModelError as e:
                raise CT2FormatError(str(e)) from None
            if w is None:      # a conv's [out, in, width]: dequantized (the convs have no int8 kernel)
                q, s = v[name], np.asarray(v[scale], np.float32)
                if q.dtype != np.int8 or s.shape != q.shape[:1]:
                    raise CT2FormatError(f"{source}: '{scale}' {list(s.shape)} does not match '{name}' "
                                         f"{q.dtype} {list(q.shape)}: one scale per output row")
                w = q.astype(np.float32) / s.reshape((-1,) + (1,) * (q.ndim - 1))
            return w
        if name.endswith("/weight") and v[name].dtype == np.int8:
            raise CT2FormatError(f"{source}: '{name}' is int8 but the file has no '{scale}'")
        used.add(name)
        return v[name]

    def scalar(name, default=None):
        if name not in v:
            return default
        used.add(name)
        return v[name].reshape(()).item() if v[name].size == 1 else v[name]

    def put(name, arr):
        out[name] = arr if isinstance(arr, QuantizedWeight) else np.ascontiguousarray(arr)

    def linear(ct, hf, bias=True):
        put(f"{hf}.weight", get(f"{ct}/weight"))
        if bias:
            put(f"{hf}.bias", get(f"{ct}/bias"))

    def split(ct, hfs):
        """A fused projection (rows stacked) -> separate HF projections; a None bias means HF has none
        (CTranslate2 stores zeros there)."""
        w, b = get(f"{ct}/weight"), get(f"{ct}/bias")
        n = len(hfs)
        if w.shape[0] % n or b.shape[0] != w.shape[0]:
            raise CT2FormatError(f"{source}: '{ct}/weight' {list(w.shape)} does not split into {n}")
        parts = np.split(w, n) if not isinstance(w, QuantizedWeight) else [
            QuantizedWeight(q, s, f"{ct}/weight") for q, s in zip(np.split(w.q, n), np.split(w.scale, n))]
        for hf, ws, bs in zip(hfs, parts, np.split(b, n)):
            put(f"{hf}.weight", ws)
            if hf.endswith("k_proj"):
                if np.any(bs != 0):
                    raise CT2FormatError(f"{source}: the k part of '{ct}/bias' is not zero; Whisper's k_proj "
                                         f"has no bias")
            else:
                put(f"{hf}.bias", bs)

    def norm(ct, hf):
        put(f"{hf}.weight", get(f"{ct}/gamma"))
        put(f"{hf}.bias", get(f"{ct}/beta"))

    def n_layers(side):
        idx = {int(m.group(1)) for k in v for m in [re.match(rf"{side}/layer_(\d+)/", k)] if m}
        if idx and idx != set(range(len(idx))):
            raise CT2FormatError(f"{source}: {side} layers {sorted(idx)} are not numbered 0..{len(idx) - 1}")
        return len(idx)

    # encoder
    e = "model.encoder"
    for c in ("conv1", "conv2"):
        linear(f"encoder/{c}", f"{e}.{c}")
    put(f"{e}.embed_positions.weight", get("encoder/position_encodings/encodings"))
    n_enc = n_layers("encoder")
    for i in range(n_enc):
        ct, hf = f"encoder/layer_{i}", f"{e}.layers.{i}"
        split(f"{ct}/self_attention/linear_0", [f"{hf}.self_attn.{p}_proj" for p in "qkv"])
        linear(f"{ct}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
        norm(f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        linear(f"{ct}/ffn/linear_0", f"{hf}.fc1")
        linear(f"{ct}/ffn/linear_1", f"{hf}.fc2")
        norm(f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm")
    norm("encoder/layer_norm", f"{e}.layer_norm")
    d_model, n_mels = v["encoder/conv1/weight"].shape[:2]
    enc_heads = int(scalar("encoder/num_heads", d_model // 64))
    config = {
        "model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"],
        "d_model": int(d_model), "num_mel_bins": int(n_mels),
        "encoder_layers": n_enc, "encoder_attention_heads": enc_heads,
        "encoder_ffn_dim": int(v["encoder/layer_0/ffn/linear_0/weight"].shape[0]) if n_enc else 4 * int(d_model),
        "max_source_positions": int(v["encoder/position_encodings/encodings"].shape[0]),
        "activation_function": "gelu", "scale_embedding": False,
    }

    # decoder
    if not encoder_only and "decoder/embeddings/weight" in v:
        dd = "model.decoder"
        put(f"{dd}.embed_tokens.weight", get("decoder/embeddings/weight"))
        put(f"{dd}.embed_positions.weight", get("decoder/position_encodings/encodings"))
        n_dec = n_layers("decoder")
        for i in range(n_dec):
            ct, hf = f"decoder/layer_{i}", f"{dd}.layers.{i}"
            split(f"{ct}/self_attention/linear_0", [f"{hf}.self_attn.{p}_proj" for p in "qkv"])
            linear(f"{ct}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
            norm(f"{ct}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
            linear(f"{ct}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
            split(f"{ct}/attention/linear_1", [f"{hf}.encoder_attn.k_proj", f"{hf}.encoder_attn.v_proj"])
            linear(f"{ct}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
            norm(f"{ct}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
            linear(f"{ct}/ffn/linear_0", f"{hf}.fc1")
            linear(f"{ct}/ffn/linear_1", f"{hf}.fc2")
            norm(f"{ct}/ffn/layer_norm", f"{hf}.final_layer_norm")
        norm("decoder/layer_norm", f"{dd}.layer_norm")
        proj = "decoder/projection/weight"
        tied = aliases.pop(proj, None) == "decoder/embeddings/weight"
        if not tied:
            put("proj_out.weight", get(proj))
        for flag, want in (("decoder/activation", _GELU), ("decoder/pre_norm", 1), ("decoder/alibi", 0),
                           ("decoder/scale_embeddings", 0)):
            got = scalar(flag)
            if got is not None and int(got) != want:
                raise CT2FormatError(f"{source}: {flag} is {got}, expected {want} for Whisper")
        # flags newer converters write that do not change Whisper (alibi is checked off above)
        for flag in ("decoder/start_from_zero_embedding", "decoder/alignment_heads", "decoder/alignment_layer",
                     "decoder/alibi_use_positive_positions", "decoder/scale_alibi"):
            scalar(flag)
        config.update({
            "decoder_layers": n_dec,
            "decoder_attention_heads": int(scalar("decoder/num_heads", d_model // 64)),
            "decoder_ffn_dim": int(v["decoder/layer_0/ffn/linear_0/weight"].shape[0]) if n_dec else 4 * int(d_model),
            "vocab_size": int(v["decoder/embeddings/weight"].shape[0]),
            "max_target_positions": int(v["decoder/position_encodings/encodings"].shape[0]),
            "tie_word_embeddings": tied,
        })
        leftover = sorted(set(v) - used)
        if leftover or aliases:
            raise CT2FormatError(f"{source}: {len(leftover) + len(aliases)} variable(s) this converter does "
                                 f"not map: {(leftover + list(aliases))[:8]}")
    else:
        leftover = sorted(k for k in set(v) - used if k.startswith("encoder/"))
        if leftover:
            raise CT2FormatError(f"{source}: {len(leftover)} encoder variable(s) this converter does not map: "
                                 f"{leftover[:8]}")
    return out, config
