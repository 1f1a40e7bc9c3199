"""The checks of transcribe()'s options, shared by WhisperModel.transcribe, transcribe_batch and
BatchedInferencePipeline.transcribe: each option's type and range, made before any audio is read or decoded, so a
bad value is an OptionError naming it at the call rather than an error deep inside the first window (or the tenth).
"""
from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import OptionError
from .decoding import MAX_LENGTH
from .search import max_candidates
from .tokenizer import TASKS

_FLAGS = ("condition_on_previous_text", "suppress_blank", "without_timestamps", "multilingual")
_MAX_LENGTH_PENALTY = 100
_OPTIONAL_REALS = ("compression_ratio_threshold", "log_prob_threshold", "no_speech_threshold",
                   "language_detection_threshold")


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_real(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_int(name: str, v, low: int, high=None, why="") -> int:
    """v as an int, OptionError naming `name` where it is no int or not in [low, high]."""
    if not is_int(v):
        raise OptionError(f"{name} must be an int, got {v!r} ({type(v).__name__})")
    if v < low or (high is not None and v > high):
        bound = f"at least {low}" if high is None else f"{low} to {high}"
        raise OptionError(f"{name} must be {bound}{why}, got {v}")
    return int(v)


def _real(kw, name, low=None, strict=False):
    v = kw[name]
    if not _is_real(v) or not math.isfinite(float(v)):
        raise OptionError(f"{name} must be a finite number, got {v!r}")
    if low is not None and (v <= low if strict else v < low):
        raise OptionError(f"{name} must be {'>' if strict else '>='} {low}, got {v}")
    return float(v)


def _token_ids(name, value, vocab: int, allow_minus_one=False, what="a list of token ids") -> list:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise OptionError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    out = list(value)
    low = -1 if allow_minus_one else 0
    for i, t in enumerate(out):
        if not is_int(t) or not low <= t < vocab:
            raise OptionError(f"{name}[{i}] = {t!r} is not a token id of the model (0 to {vocab - 1}"
                              f"{'; -1 stands for the non-speech set' if allow_minus_one else ''})")
    return [int(t) for t in out]


def check_options(kw: dict, tokenizer, n_vocab: int, max_rows=None, sampling_allowed=True) -> dict:
    """Check transcribe()'s options `kw` (every key of model._OPTION_NAMES; BatchedInferencePipeline's may lack the
    language detection ones): OptionError naming the first bad one. Returns them normalised (ints as int, reals as
    float, temperature as a list, initial_prompt and suppress_tokens as lists where given as iterables).

    n_vocab: the model's vocabulary; max_rows: the rows (beams, or best_of samples) the backend's search holds, None
    for no limit."""
    kw = dict(kw)
    language, task = kw.get("language"), kw.get("task", "transcribe")
    if language is not None:
        if not isinstance(language, str):
            raise OptionError(f"language must be a language code (a str such as 'en') or None, got {language!r}")
        if tokenizer.multilingual and language not in tokenizer.language_tokens:
            raise OptionError(f"language {language!r} is not a language code of this model (known: "
                              f"{', '.join(tokenizer.language_tokens)})")
    if task not in TASKS:
        raise OptionError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    for name in _FLAGS:
        v = kw.get(name, False)
        if not (isinstance(v, (bool, np.bool_)) or (is_int(v) and v in (0, 1))):
            raise OptionError(f"{name} must be True or False, got {v!r}")
        kw[name] = bool(v)

    temperature = kw["temperature"]
    temps = list(temperature) if isinstance(temperature, (list, tuple)) else [temperature]
    if not temps or not all(_is_real(t) and math.isfinite(float(t)) and t >= 0 for t in temps):
        raise OptionError(f"temperature must be a number >= 0 or a non-empty list of them, got {temperature!r}")
    kw["temperature"] = [float(t) for t in temps]

    limit = "" if max_rows is None else f" (the backend's search holds {max_rows} rows)"
    kw["beam_size"] = check_int("beam_size", kw["beam_size"], 1, max_rows, limit)
    samples = any(t > 0 for t in kw["temperature"]) and sampling_allowed
    kw["best_of"] = check_int("best_of", kw["best_of"], 1, max_rows if samples else None, limit)
    kw["patience"] = _real(kw, "patience", 0, strict=True)
    if kw["beam_size"] > 1 and max_candidates(kw["beam_size"], kw["patience"]) < 1:
        raise OptionError(f"patience {kw['patience']} with beam_size {kw['beam_size']}: the search ends after "
                          f"round(beam_size * patience) finished hypotheses, which must be at least 1")
    kw["length_penalty"] = _real(kw, "length_penalty")
    if abs(kw["length_penalty"]) > _MAX_LENGTH_PENALTY:     # a length to this power is beyond float range
        raise OptionError(f"length_penalty must be from -{_MAX_LENGTH_PENALTY} to {_MAX_LENGTH_PENALTY}, got "
                          f"{kw['length_penalty']}")
    kw["repetition_penalty"] = _real(kw, "repetition_penalty", 0, strict=True)
    kw["no_repeat_ngram_size"] = check_int("no_repeat_ngram_size", kw["no_repeat_ngram_size"], 0)
    kw["prompt_reset_on_temperature"] = _real(kw, "prompt_reset_on_temperature")
    kw["max_initial_timestamp"] = _real(kw, "max_initial_timestamp", 0)
    for name in _OPTIONAL_REALS:
        if kw.get(name) is not None:
            kw[name] = _real(kw, name)
    if "language_detection_segments" in kw:
        kw["language_detection_segments"] = check_int("language_detection_segments",
                                                      kw["language_detection_segments"], 1)

    prompt = kw.get("initial_prompt")
    if prompt is not None and not isinstance(prompt, str):
        kw["initial_prompt"] = _token_ids("initial_prompt", prompt, n_vocab, what="text or a list of token ids")
    if kw.get("suppress_tokens"):
        kw["suppress_tokens"] = _token_ids("suppress_tokens", kw["suppress_tokens"], n_vocab, allow_minus_one=True)

    if kw.get("max_new_tokens") is not None:
        # the longest prompt a window can have: <|startofprev|> and 223 previous tokens where there is previous
        # text, the start sequence, <|notimestamps|>
        previous = prompt is not None or kw["condition_on_previous_text"]
        longest = (MAX_LENGTH // 2 if previous else 0) + (3 if tokenizer.multilingual else 1) \
            + kw["without_timestamps"]
        kw["max_new_tokens"] = check_int("max_new_tokens", kw["max_new_tokens"], 1, MAX_LENGTH - longest,
                                         f" (a window's prompt may have {longest} tokens, and Whisper's "
                                         f"{MAX_LENGTH} positions hold the prompt and the new tokens)")
    seed = kw.get("seed")
    if seed is not None and (not is_int(seed) or seed < 0):
        raise OptionError(f"seed must be an int >= 0 or None, got {seed!r}")
    return kw

