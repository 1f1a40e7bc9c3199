"""WhisperModel: speech in, text out, with faster-whisper's API (WhisperModel(...).transcribe(audio, ...) ->
(segments generator, TranscriptionInfo)).

The model runs behind a DecoderBackend: by default VulkanBackend (encoder and decoder on the GPU, at fp32 or fp16),
or the numpy reference (ReferenceBackend), which computes in float32 on the CPU. Everything else (features, prompts,
logit filters, search, fallback, segmentation) is host code that follows faster-whisper and CTranslate2 and gives their
tokens for the same model and audio.
"""
from __future__ import annotations

import logging
import sys
from typing import Iterable, List, Optional, Tuple, Union

import numpy as np

from .audio_input import SAMPLE_RATE, audio_samples
from .checkpoint import load_checkpoint
from .decoding import TranscriptionOptions
from .features import LogMel
from .tokenizer import TASKS, WhisperTokenizer
from .transcribe import TranscriptionInfo, detect_language, generate_segments

log = logging.getLogger("minirt.whisper")

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class WhisperModel:
    """A Whisper checkpoint ready to transcribe.

    path: a Hugging Face Whisper folder (model.safetensors, config.json, tokenizer.json, generation_config.json
    when present) or a CTranslate2 / faster-whisper folder (model.bin, config.json, tokenizer.json).
    precision: "fp32" or "fp16" (on the GPU: weights, activations and the key/value cache in 16-bit storage, fp32
    arithmetic; in the reference: weights rounded to float16, arithmetic in float32).
    device: the Vulkan device for the GPU decoder, an index or a UUID as Session takes it (the numpy reference runs on
    the CPU and ignores it).
    backend: "vulkan" (minirt.whisper.vulkan.VulkanBackend: encoder and decoder on the GPU, at either precision,
    beams and best_of up to 5), "reference" (the numpy reference on the CPU), None (the default: vulkan), or a
    DecoderBackend to use as it is."""

    def __init__(self, path, precision: str = "fp32", device=None, backend=None):
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be 'fp32' or 'fp16', got {precision!r}")
        ckpt = load_checkpoint(path)
        self.path = ckpt.folder
        self.precision, self.device = precision, device
        self.config = ckpt.config
        self.tokenizer = WhisperTokenizer.from_file(ckpt.tokenizer_path, ckpt.multilingual)
        if backend is None:
            backend = "vulkan"
        if backend == "reference":
            from .reference import ReferenceBackend
            backend = ReferenceBackend(ckpt.weights, ckpt.config, precision)
        elif backend == "vulkan":
            from .vulkan import VulkanBackend
            backend = VulkanBackend(ckpt.weights, ckpt.config, precision, device)
        elif isinstance(backend, str):
            raise ValueError(f"backend must be 'reference', 'vulkan' or a DecoderBackend, got {backend!r}")
        self.backend = backend
        del ckpt.weights
        self.n_mels = int(self.config.get("num_mel_bins", backend.n_mels))
        tok = self.tokenizer
        self.suppress_blank_ids = list(ckpt.begin_suppress) or tok.encode(" ") + [tok.eot]

    @property
    def is_multilingual(self) -> bool:
        return self.tokenizer.multilingual

    @property
    def supported_languages(self) -> List[str]:
        return list(self.tokenizer.language_tokens) if self.is_multilingual else ["en"]

    def transcribe(
        self,
        audio: Union[str, np.ndarray],
        language: Optional[str] = None,
        task: str = "transcribe",
        log_progress: bool = False,
        beam_size: int = 5,
        best_of: int = 5,
        patience: float = 1,
        length_penalty: float = 1,
        repetition_penalty: float = 1,
        no_repeat_ngram_size: int = 0,
        temperature: Union[float, List[float], Tuple[float, ...]] = DEFAULT_TEMPERATURES,
        compression_ratio_threshold: Optional[float] = 2.4,
        log_prob_threshold: Optional[float] = -1.0,
        no_speech_threshold: Optional[float] = 0.6,
        condition_on_previous_text: bool = True,
        prompt_reset_on_temperature: float = 0.5,
        initial_prompt: Optional[Union[str, Iterable[int]]] = None,
        prefix: Optional[str] = None,
        suppress_blank: bool = True,
        suppress_tokens: Optional[List[int]] = (-1,),
        without_timestamps: bool = False,
        max_initial_timestamp: float = 1.0,
        word_timestamps: bool = False,
        multilingual: bool = False,
        vad_filter: bool = False,
        max_new_tokens: Optional[int] = None,
        chunk_length: Optional[int] = None,
        clip_timestamps: Union[str, List[float]] = "0",
        hotwords: Optional[str] = None,
        language_detection_threshold: Optional[float] = 0.5,
        language_detection_segments: int = 1,
        seed: Optional[int] = 0,
        progress=None,
        **ignored,
    ):
        """Transcribe `audio` (a path, or float32 16 kHz mono samples): (a generator of Segments,
        TranscriptionInfo), as faster-whisper's WhisperModel.transcribe. The options are faster-whisper's, with
        its defaults (beam search of 5, temperature fallback). Also: seed, the sampling generator's seed at
        temperatures above 0 (None: fresh entropy); progress(seconds done, seconds in all), called after each
        30 s window. A file is read in blocks (twice, or three times with language detection), so memory follows
        the 30 s window, not the length of the file.

        Not supported, refused with NotImplementedError: word_timestamps, prefix, hotwords, vad_filter,
        clip_timestamps other than "0", chunk_length other than 30. Options of faster-whisper that only matter
        with those (prepend_punctuations, append_punctuations, hallucination_silence_threshold, vad_parameters)
        are accepted and have no effect."""
        unsupported = [name for name, on in (
            ("word_timestamps", word_timestamps), ("prefix", prefix), ("hotwords", hotwords),
            ("vad_filter", vad_filter),
            ("clip_timestamps", clip_timestamps not in ("0", "", [0], [0.0], (0,), None)),
            ("chunk_length", chunk_length not in (None, 30))) if on]
        if unsupported:
            raise NotImplementedError(f"minirt's WhisperModel does not support {', '.join(unsupported)}")
        known_extra = {"prepend_punctuations", "append_punctuations", "hallucination_silence_threshold",
                       "vad_parameters"}
        unknown = sorted(set(ignored) - known_extra)
        if unknown:
            raise TypeError(f"transcribe() got unexpected keyword argument(s) {', '.join(unknown)}")
        temperatures = list(temperature) if isinstance(temperature, (list, tuple)) else [temperature]
        if not temperatures or any(t < 0 for t in temperatures):
            raise ValueError(f"temperature must be >= 0 (one value or a list), got {temperature!r}")
        if beam_size < 1 or best_of < 1:
            raise ValueError(f"beam_size and best_of must be >= 1, got {beam_size} and {best_of}")
        if patience <= 0:
            raise ValueError(f"patience must be > 0, got {patience}")
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
        tok = self.tokenizer

        mel = LogMel(audio_samples(audio), self.n_mels)      # a file is read a block at a time, never whole
        duration = len(mel.samples) / SAMPLE_RATE

        all_language_probs = None
        if multilingual and not self.is_multilingual:
            log.warning("the model is English-only; multilingual=True is ignored")
            multilingual = False
        if language is None:
            if not self.is_multilingual:
                language, language_probability = "en", 1
            else:
                language, language_probability, all_language_probs = detect_language(
                    self.backend, tok, mel, language_detection_segments, language_detection_threshold)
        else:
            if not self.is_multilingual and language != "en":
                log.warning("the model is English-only; language %r is ignored ('en' is used)", language)
                language = "en"
            elif self.is_multilingual:
                tok.language_token(language)        # a ValueError naming the known codes
            language_probability = 1

        options = TranscriptionOptions(
            beam_size=beam_size, best_of=best_of, patience=patience, length_penalty=length_penalty,
            repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size,
            log_prob_threshold=log_prob_threshold, no_speech_threshold=no_speech_threshold,
            compression_ratio_threshold=compression_ratio_threshold,
            condition_on_previous_text=condition_on_previous_text,
            prompt_reset_on_temperature=prompt_reset_on_temperature, temperatures=temperatures,
            initial_prompt=initial_prompt, suppress_blank=suppress_blank,
            suppress_tokens=list(tok.suppressed_tokens(suppress_tokens)) if suppress_tokens else suppress_tokens,
            without_timestamps=without_timestamps, max_initial_timestamp=max_initial_timestamp,
            multilingual=multilingual, max_new_tokens=max_new_tokens, word_timestamps=False)
        if progress is None and log_progress:
            progress = _stderr_progress
        rng = np.random.default_rng(seed)
        segments = generate_segments(self.backend, tok, mel, options, language, task, self.suppress_blank_ids,
                                     rng, progress)
        info = TranscriptionInfo(language=language, language_probability=language_probability, duration=duration,
                                 duration_after_vad=duration, all_language_probs=all_language_probs,
                                 transcription_options=options)
        return segments, info


def _stderr_progress(done, total):
    sys.stderr.write(f"\r{done:.1f} / {total:.1f} s")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()
