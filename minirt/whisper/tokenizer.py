"""Whisper's tokenizer over a tokenizer.json (the `tokenizers` library does the byte-level BPE): the special
token ids, encode/decode, and the token lists the decoder suppresses, computed as faster-whisper computes them.

English-only models (vocabulary below 51865 entries: tiny.en, base.en, ...) start a transcript with
<|startoftranscript|> alone; multilingual ones add a language and a task token.
"""
from __future__ import annotations

import os
from functools import cached_property

from ..errors import ModelError

TASKS = ("transcribe", "translate")

def load_tokenizers_json(path):
    """A tokenizers.Tokenizer from a tokenizer.json; ModelError when the library is missing or the file is bad."""
    try:
        import tokenizers
    except ImportError:
        raise ModelError("Whisper transcription needs the 'tokenizers' package: pip install 'minirt[whisper]'") from None
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:      # tokenizers raises its own Exception type for a malformed file
        raise ModelError(f"{path}: not a tokenizer.json the tokenizers library can read ({e})") from None


class WhisperTokenizer:
    """Token ids and text for one Whisper vocabulary. `multilingual` follows the model (vocabulary size >= 51865),
    not the tokenizer file: English-only models ship the language tokens too."""

    def __init__(self, tokenizer, multilingual: bool, source: str = "the tokenizer"):
        self.tokenizer = tokenizer
        self.multilingual = multilingual
        for name in ("eot", "sot", "no_timestamps", "sot_prev"):
            if getattr(self, name) is None:
                raise ModelError(f"{source}: no {name} token; is it a Whisper tokenizer.json?")

    @classmethod
    def from_file(cls, path, multilingual: bool) -> "WhisperTokenizer":
        """From a tokenizer.json, or a CTranslate2 vocabulary.txt / vocabulary.json (vocabulary.py)."""
        name = os.path.basename(os.fspath(path))
        if name.startswith("vocabulary.") and not name.endswith("tokenizer.json"):
            from .vocabulary import tokenizer_from_vocabulary
            return cls(tokenizer_from_vocabulary(path), multilingual, os.fspath(path))
        return cls(load_tokenizers_json(path), multilingual, os.fspath(path))

    def _id(self, token: str):
        return self.tokenizer.token_to_id(token)

    @cached_property
    def eot(self) -> int:
        return self._id("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self._id("<|startoftranscript|>")

    @cached_property
    def transcribe(self) -> int:
        return self._id("<|transcribe|>")

    @cached_property
    def translate(self) -> int:
        return self._id("<|translate|>")

    @cached_property
    def sot_lm(self) -> int:
        return self._id("<|startoflm|>")

    @cached_property
    def sot_prev(self) -> int:
        return self._id("<|startofprev|>")

    @cached_property
    def no_speech(self) -> int:
        """<|nospeech|> (large-v3) or <|nocaptions|> (earlier models)."""
        return self._id("<|nospeech|>") or self._id("<|nocaptions|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self._id("<|notimestamps|>")

    @property
    def timestamp_begin(self) -> int:
        """<|0.00|>; timestamps run in steps of 0.02 s up to the last token of the model's vocabulary."""
        return self.no_timestamps + 1

    @cached_property
    def language_tokens(self) -> dict:
        """{language code: token id}: the tokens between <|startoftranscript|> and <|translate|>, in vocabulary
        order, named as the vocabulary names them (CTranslate2's language detection reports those names; some
        tokenizer.json files have <|iw|> where others have <|he|>)."""
        out = {}
        for i in range(self.sot + 1, self.translate or self.sot + 1):
            tok = self.tokenizer.id_to_token(i)
            if tok and tok.startswith("<|") and tok.endswith("|>"):
                out[tok[2:-2]] = i
        return out

    def language_token(self, code: str) -> int:
        if code not in self.language_tokens:
            raise ValueError(f"'{code}' is not a language code of this model (known: "
                             f"{', '.join(self.language_tokens)})")
        return self.language_tokens[code]

    def sot_sequence(self, language: str | None, task: str = "transcribe") -> list:
        """<|startoftranscript|>, then for multilingual models the language and task tokens."""
        if not self.multilingual:
            return [self.sot]
        if task not in TASKS:
            raise ValueError(f"'{task}' is not a task (tasks: {', '.join(TASKS)})")
        return [self.sot, self.language_token(language), self._id(f"<|{task}|>")]

    def encode(self, text: str) -> list:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, tokens) -> str:
        """The text of the text tokens (ids below <|endoftext|>); special and timestamp tokens are left out."""
        return self.tokenizer.decode([t for t in tokens if t < self.eot])

    def decode_with_timestamps(self, tokens) -> str:
        """The text with timestamp tokens written as <|1.08|>."""
        parts, run = [], []
        for t in tokens:
            if t >= self.timestamp_begin:
                parts.append(self.tokenizer.decode(run))
                parts.append(f"<|{(t - self.timestamp_begin) * 0.02:.2f}|>")
                run = []
            else:
                run.append(t)
        parts.append(self.tokenizer.decode(run))
        return "".join(parts)

    @cached_property
    def non_speech_tokens(self) -> tuple:
        """Tokens of speaker tags and non-speech annotations ("♪♪♪", "( SPEAKING FOREIGN LANGUAGE )", "[DAVID]"),
        keeping basic punctuation: the list faster-whisper (and openai-whisper) suppress for suppress_tokens=[-1]."""
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += "<< >> <<< >>> -- --- -( -[ (' (\" (( )) ((( ))) [[ ]] {{ }} ♪♪ ♪♪♪".split()
        # U+2640..U+267F symbols share their first two UTF-8 bytes: suppressing the first token of each is safe
        miscellaneous = set("♩♪♫♬♭♮♯")
        # hyphens and single quotes are allowed between words, not at the start of one
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return tuple(sorted(result))

    def suppressed_tokens(self, suppress_tokens) -> tuple:
        """The ids to suppress at every step for faster-whisper's `suppress_tokens` option: -1 stands for
        non_speech_tokens; the task, start and no-speech tokens are added to any non-empty list. None or []
        suppresses nothing (as in faster-whisper, where an empty option skips the list altogether)."""
        if not suppress_tokens:
            return ()
        tokens = [int(t) for t in suppress_tokens]
        if any(t < -1 for t in tokens):
            raise ValueError(f"suppress_tokens: {min(tokens)} is not a token id (-1 stands for the non-speech set)")
        out = [t for t in tokens if t >= 0]
        if -1 in tokens:
            out.extend(self.non_speech_tokens)
        out.extend(t for t in (self.transcribe, self.translate, self.sot, self.sot_prev, self.sot_lm, self.no_speech)
                   if t is not None)
        return tuple(sorted(set(out)))
