"""A multilingual-layout Whisper built from tiny.en, for comparing the multilingual code paths (language detection,
<|startoftranscript|> <|xx|> <|task|> prompts, per-window detection) with faster-whisper, which has no small
multilingual model at hand here.

Multilingual vocabularies have one more text token than English-only ones, so every special token sits one id
higher (<|endoftext|> 50257, <|startoftranscript|> 50258, languages 50259-50357, ..., <|0.00|> 50364) and the
vocabulary has 51865 entries. The folder written here is tiny.en's CTranslate2 folder with a zero embedding row
inserted at 50256 (the empty token, as in multilingual vocabularies; its logit is always 0) and the special
tokens moved up by one in model.bin,
config.json, vocabulary.txt and tokenizer.json. The model transcribes as tiny.en does; in the multilingual layout.
Its 99 language rows are tiny.en's untrained ones, all alike; languages_apart_ct2_dir adds seeded noise to them, for
tests where each window's detected language must decide what is decoded.
"""
from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np

import real_whisper

INSERT_AT = 50256
DUMMY = ""      # the multilingual vocabulary's token 50256 is the empty string (CTranslate2 tests for it)
_CODES = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.int32): 3,
          np.dtype(np.float16): 4}


def _string(s: str) -> bytes:
    b = s.encode("utf-8") + b"\0"
    return struct.pack("<H", len(b)) + b


def write_ct2(path, spec: str, variables: dict, aliases: dict, version=6, revision=3):
    """A CTranslate2 model.bin (the layout minirt.whisper.ct2.read_ct2 reads)."""
    with open(path, "wb") as f:
        f.write(struct.pack("<I", version) + _string(spec) + struct.pack("<I", revision))
        f.write(struct.pack("<I", len(variables)))
        for name, a in variables.items():
            a = np.array(a, order="C", copy=True)      # keeps rank 0 (ascontiguousarray would make it 1)
            f.write(_string(name) + struct.pack("<B", a.ndim) + struct.pack(f"<{a.ndim}I", *a.shape))
            f.write(struct.pack("<BI", _CODES[a.dtype], a.nbytes) + a.astype(a.dtype.newbyteorder("<")).tobytes())
        f.write(struct.pack("<I", len(aliases)))
        for a, t in aliases.items():
            f.write(_string(a) + _string(t))


def _shift(i: int) -> int:
    return i + 1 if i >= INSERT_AT else i


def tiny_multilingual_ct2_dir() -> Path:
    """The folder (cached); raises real_whisper.Unavailable when tiny.en cannot be had."""
    from minirt.whisper.ct2 import read_ct2
    out = real_whisper.cache_dir() / "whisper-tiny-multilingual-layout-ct2"
    if (out / "model.bin").is_file():
        return out
    src = real_whisper.tiny_en_ct2_dir()
    with real_whisper._locked(real_whisper.cache_dir() / "whisper-tiny-multilingual-layout-ct2.lock"):
        if (out / "model.bin").is_file():
            return out
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=real_whisper.cache_dir()) as tmp:
            tmp = Path(tmp)
            spec, variables, aliases = read_ct2(src / "model.bin")
            emb = variables["decoder/embeddings/weight"]
            variables["decoder/embeddings/weight"] = np.insert(emb, INSERT_AT, 0, axis=0)
            cfg = json.loads((src / "config.json").read_text())
            cfg["suppress_ids"] = [_shift(i) for i in cfg["suppress_ids"]]
            cfg["suppress_ids_begin"] = [_shift(i) for i in cfg["suppress_ids_begin"]]
            cfg["lang_ids"] = list(range(50259, 50358))
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
            vocab = (src / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
            if vocab and vocab[-1] == "":
                vocab.pop()
            vocab.insert(INSERT_AT, DUMMY)
            (tmp / "vocabulary.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
            tok = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
            for t in tok["added_tokens"]:
                t["id"] = _shift(t["id"])
            tok["model"]["vocab"] = {k: _shift(v) for k, v in tok["model"]["vocab"].items()}
            tok["model"]["vocab"][DUMMY] = INSERT_AT
            for v in (tok.get("post_processor") or {}).get("special_tokens", {}).values():
                v["ids"] = [_shift(i) for i in v["ids"]]
            (tmp / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
            write_ct2(tmp / "model.bin", spec, variables, aliases)
            for f in ("config.json", "vocabulary.txt", "tokenizer.json", "model.bin"):
                os.replace(tmp / f, out / f)
    return out


LANGUAGE_NOISE = 0.02       # per element; tiny.en's 99 language rows are all alike, so every language is as likely


def languages_apart_ct2_dir() -> Path:
    """tiny_multilingual_ct2_dir with seeded noise added to the language tokens' embedding rows (the output
    projection is the same matrix): languages are then told apart (on the spoken clips, different chunks have
    different best languages, by margins far above float32 rounding), and the language token in a prompt changes
    what is decoded. The folder is cached; raises real_whisper.Unavailable when tiny.en cannot be had."""
    from minirt.whisper.ct2 import read_ct2
    out = real_whisper.cache_dir() / "whisper-tiny-multilingual-languages-apart-ct2"
    if (out / "model.bin").is_file():
        return out
    src = tiny_multilingual_ct2_dir()
    with real_whisper._locked(real_whisper.cache_dir() / "whisper-tiny-multilingual-languages-apart-ct2.lock"):
        if (out / "model.bin").is_file():
            return out
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=real_whisper.cache_dir()) as tmp:
            tmp = Path(tmp)
            spec, variables, aliases = read_ct2(src / "model.bin")
            emb = variables["decoder/embeddings/weight"].copy()
            rows = slice(50259, 50358)
            noise = np.random.default_rng(7).standard_normal(emb[rows].shape) * LANGUAGE_NOISE
            emb[rows] += noise.astype(np.float32)
            variables["decoder/embeddings/weight"] = emb
            write_ct2(tmp / "model.bin", spec, variables, aliases)
            for f in ("config.json", "vocabulary.txt", "tokenizer.json"):
                (tmp / f).write_bytes((src / f).read_bytes())
            for f in ("config.json", "vocabulary.txt", "tokenizer.json", "model.bin"):
                os.replace(tmp / f, out / f)
    return out
