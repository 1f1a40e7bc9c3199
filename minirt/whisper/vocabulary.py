"""A Whisper tokenizer from a CTranslate2 vocabulary file (vocabulary.txt: one token a line; vocabulary.json: a
list), for model folders that come without a tokenizer.json.

The file lists byte-level BPE tokens in id order, which for Whisper's (GPT-2 style) vocabularies is also the order
of the merges that made them: token 256 + i is merge i. The merges are recovered as tiktoken's converters do: each
token is split by running BPE on its characters with only the merges made before it, which leaves exactly the two
parts it was merged from. Tokens written <|...|> are the special tokens.
"""
from __future__ import annotations

import json
import os

from ..errors import ModelError


def read_vocabulary(path) -> list:
    path = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as f:
            if path.endswith(".json"):
                tokens = json.load(f)
            else:
                tokens = f.read().split("\n")
                if tokens and tokens[-1] == "":
                    tokens.pop()
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: not a readable vocabulary file ({e})") from None
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise ModelError(f"{path}: a vocabulary must be a list of tokens")
    return tokens


def _split(token: str, ranks: dict, max_rank: int) -> list:
    """BPE of `token`'s characters using only merged tokens whose id is below max_rank."""
    parts = list(token)
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def merges_from_vocabulary(tokens: list, first_special: int) -> list:
    """[(left, right)] in merge order for the BPE tokens tokens[:first_special]."""
    ranks = {t: i for i, t in enumerate(tokens[:first_special]) if t}
    merges = []
    for rank, token in enumerate(tokens[:first_special]):
        if len(token) < 2:
            continue
        parts = _split(token, ranks, rank)
        if len(parts) != 2:
            raise ModelError(f"vocabulary token {rank} {token!r} is not the merge of two earlier tokens; not a "
                             f"byte-level BPE vocabulary in merge order")
        merges.append((parts[0], parts[1]))
    return merges


def tokenizer_from_vocabulary(path):
    """A tokenizers.Tokenizer equal to Whisper's tokenizer.json for the vocabulary in `path`."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise ModelError("Whisper transcription needs the 'tokenizers' package: pip install 'minirt[whisper]'") from None
    tokens = read_vocabulary(path)
    first_special = next((i for i, t in enumerate(tokens) if t.startswith("<|") and t.endswith("|>")), None)
    if first_special is None or first_special < 256:
        raise ModelError(f"{path}: no <|endoftext|> after the byte tokens; not a Whisper vocabulary")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        dup = next(t for i, t in enumerate(tokens) if vocab[t] != i)
        raise ModelError(f"{path}: token {dup!r} appears twice")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges_from_vocabulary(tokens, first_special)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens[first_special:]
                            if t.startswith("<|") and t.endswith("|>")])
    return tok
