"""WhisperModel: speech in, text out, with faster-whisper's API (WhisperModel(...).transcribe(audio, ...) ->
(segments generator, TranscriptionInfo)).

The model runs behind a DecoderBackend: by default VulkanBackend (encoder and decoder on the GPU, at fp32 or fp16),
or the numpy reference (ReferenceBackend), which computes in float32 on the CPU. Everything else (features, prompts,
logit filters, search, fallback, segmentation) is host code that follows faster-whisper and CTranslate2 and gives their
tokens for the same model and audio.
"""
from __future__ import annotations

import inspect
import logging
import os
import sys
from typing import Iterable, List, Optional, Tuple, Union

import numpy as np

from ..pools import pool
from .audio_input import SAMPLE_RATE, audio_samples
from .checkpoint import load_checkpoint
from .compute_type import apply_compute_type
from .decoding import TranscriptionOptions
from .features import LogMel
from .hub import model_folder
from .reference import blas_threads
from .tokenizer import TASKS, WhisperTokenizer
from .transcribe import TranscriptionInfo, detect_language, generate_segments, generate_segments_batch

log = logging.getLogger("minirt.whisper")

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


class WhisperModel:
    """A Whisper checkpoint ready to transcribe.

    path: a Hugging Face Whisper folder (model.safetensors, config.json, tokenizer.json, generation_config.json
    when present) or a CTranslate2 / faster-whisper folder (model.bin, config.json, tokenizer.json); or, as
    faster-whisper takes them, a size name (tiny.en, base, large-v3, turbo, ...: minirt.whisper.hub.MODELS) or a
    Hugging Face repo id (ORG/NAME) of such a checkpoint, found in the Hugging Face cache or downloaded into it
    (minirt.whisper.hub.model_folder).
    download_root, local_files_only, revision: faster-whisper's, for a name or repo id: the cache folder (default
    HF_HUB_CACHE), never to download (HF_HUB_OFFLINE=1 does the same), the repo's branch, tag or commit.
    precision: "fp32" or "fp16" (on the GPU: weights, activations and the key/value cache in 16-bit storage, fp32
    arithmetic; in the reference: weights rounded to float16, arithmetic in float32).
    device: the Vulkan device for the GPU decoder, an index or a UUID as Session takes it (the numpy reference runs on
    the CPU and ignores it).
    backend: "vulkan" (minirt.whisper.vulkan.VulkanBackend: encoder and decoder on the GPU, at either precision,
    beams and best_of up to 5), "reference" (the numpy reference on the CPU), None (the default: vulkan), or a
    DecoderBackend to use as it is.
    max_batch_items: the most windows transcribe_batch and BatchedInferencePipeline decode together (batch_size at
    most this; on the GPU, the batch's entry points and state are made for this many when first used).
    compute_type: faster-whisper's ("default", "auto", "float32", "float16", "int8", "int8_float32", "int8_float16",
    "int8_bfloat16"; minirt.whisper.compute_type): a float type sets the precision, an int8 one the precision and
    int8 Linear weights (a float checkpoint's quantized at load per output row); None or "default" keeps precision
    and the weights as the file holds them (a CTranslate2 int8 model.bin runs with int8 weights)."""

    def __init__(self, path, precision: str = "fp32", device=None, backend=None, max_batch_items: int = 16,
                 download_root=None, local_files_only: bool = False, revision=None, compute_type=None):
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be 'fp32' or 'fp16', got {precision!r}")
        ckpt = load_checkpoint(model_folder(path, download_root, local_files_only, revision))
        self.compute_type = compute_type
        precision, ckpt.weights = apply_compute_type(compute_type, precision, ckpt.weights)
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
        self.max_batch_items = int(max_batch_items)
        if not 1 <= self.max_batch_items <= 32:
            raise ValueError(f"max_batch_items must be 1 to 32, got {max_batch_items}")
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
        kw = {k: v for k, v in locals().items() if k not in ("self", "audio", "ignored", "log_progress", "progress")}
        mel, options, info, rng = self._setup(audio, dict(kw, **ignored))
        if progress is None and log_progress:
            progress = _stderr_progress
        segments = generate_segments(self.backend, self.tokenizer, mel, options, info.language, kw["task"],
                                     self.suppress_blank_ids, rng, progress)
        return segments, info

    def transcribe_batch(self, audio: list, batch_size: Optional[int] = None, **options) -> list:
        """Transcribe several files together: [(segments, TranscriptionInfo)], one a file of `audio` (paths, float32
        16 kHz samples as transcribe() takes them, or (samples, sample rate) pairs, resampled to 16 kHz each at its
        own rate), in the same order, each what transcribe() gives that file with the same options (every option of
        transcribe() but progress). The files' seek loops run side by side and their windows are decoded on the GPU
        as a batch of up to batch_size (a window a file at a time),
        where a window's first attempt is greedy at temperature 0 (beam_size=1); temperature fallback, beam search,
        sampling and multilingual=True decode those windows one by one. batch_size: 1 to max_batch_items (None:
        max_batch_items). The segments are lists (the work is done when this returns)."""
        for bad in ("progress", "log_progress"):
            if options.pop(bad, None):
                raise TypeError(f"transcribe_batch() does not take {bad}")
        if isinstance(audio, (str, np.ndarray)):
            raise TypeError("transcribe_batch() takes a list of files or sample arrays; transcribe() takes one")
        audio = [_at_16k(a, i) if isinstance(a, tuple) else a for i, a in enumerate(audio)]
        batch_size = self.max_batch_items if batch_size is None else batch_size
        if not audio:
            return []
        self.batch_backend(batch_size)
        bound = inspect.signature(WhisperModel.transcribe).bind(self, None, **options)
        bound.apply_defaults()
        kw = {k: v for k, v in bound.arguments.items() if k not in ("self", "audio", "log_progress", "progress",
                                                                     "ignored")}
        kw.update(bound.arguments.get("ignored", {}))
        # The files' log-mels are host work, most of it in numpy's FFT and BLAS, which release the GIL: computed
        # side by side they cost a fraction of their serial time before the first window reaches the GPU. BLAS is
        # held to one thread meanwhile (process-wide, through threadpoolctl where installed): OpenBLAS's own
        # threads, called from several threads at once, spin against each other and took the parallel run back to
        # the serial time on a 16-core host. Its sums do not depend on its thread count at these shapes.
        threads = pool("minirt-mel", min(_FEATURE_THREADS, os.cpu_count() or 1))
        with blas_threads(1 if len(audio) > 1 else None):
            mels = [threads.submit(lambda a: LogMel(audio_samples(a), self.n_mels), a) for a in audio]
            try:
                setups = [self._setup(a, dict(kw), mel.result) for a, mel in zip(audio, mels)]
            finally:
                for mel in mels:
                    mel.cancel()
        options = setups[0][1]
        files = [(mel, info.language, kw["task"], rng) for mel, _, info, rng in setups]
        segments = generate_segments_batch(self.backend, self.tokenizer, files, options, self.suppress_blank_ids,
                                           batch_size)
        return [(segs, info) for segs, (_, _, info, _) in zip(segments, setups)]

    def batch_backend(self, batch_size: int):
        """The backend, able to decode batches of batch_size windows (BatchDecoder): on the GPU, the batch's entry
        points are made the first time (for max_batch_items windows, from the checkpoint read again)."""
        b = self.backend
        if not 1 <= batch_size <= self.max_batch_items:
            raise ValueError(f"batch_size must be 1 to {self.max_batch_items} (WhisperModel(max_batch_items=...)), "
                             f"got {batch_size}")
        if not all(hasattr(b, m) for m in ("encode_batch", "start_rows", "step_rows", "reorder_rows")):
            raise TypeError(f"the backend {getattr(b, 'name', type(b).__name__)} does not decode batches "
                            f"(minirt.whisper.BatchDecoder)")
        if not getattr(b, "max_items", 0) and hasattr(b, "add_batch"):
            ckpt = load_checkpoint(self.path)
            _, weights = apply_compute_type(self.compute_type, self.precision, ckpt.weights)
            b.add_batch(weights, ckpt.config, self.max_batch_items)
        if batch_size > b.max_items:
            raise ValueError(f"batch_size {batch_size} is more than the backend's batch of {b.max_items}")
        return b

    def _setup(self, audio, kw: dict, features=None):
        """(LogMel, TranscriptionOptions, TranscriptionInfo, rng) of one file for transcribe()'s options `kw`;
        features(), where given, returns the file's LogMel (computed elsewhere), after the options are checked."""
        ignored = {k: kw.pop(k) for k in list(kw) if k not in _OPTION_NAMES}
        (language, task, beam_size, best_of, patience, length_penalty, repetition_penalty, no_repeat_ngram_size,
         temperature, compression_ratio_threshold, log_prob_threshold, no_speech_threshold,
         condition_on_previous_text, prompt_reset_on_temperature, initial_prompt, prefix, suppress_blank,
         suppress_tokens, without_timestamps, max_initial_timestamp, word_timestamps, multilingual, vad_filter,
         max_new_tokens, chunk_length, clip_timestamps, hotwords, language_detection_threshold,
         language_detection_segments, seed) = (kw[k] for k in _OPTION_NAMES)
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

        # a file is read a block at a time, never whole
        mel = features() if features else LogMel(audio_samples(audio), self.n_mels)
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
        info = TranscriptionInfo(language=language, language_probability=language_probability, duration=duration,
                                 duration_after_vad=duration, all_language_probs=all_language_probs,
                                 transcription_options=options)
        return mel, options, info, np.random.default_rng(seed)


_FEATURE_THREADS = 8        # 16 log-mels of 30 s on a 16-core host, BLAS at one thread: 8 threads 3.4x one, 16 slower


def _at_16k(item, index: int) -> np.ndarray:
    """The samples of a (samples, sample rate) pair at 16 kHz; InputError naming the item where it is not one."""
    from ..errors import InputError
    from .audio_input import check_array, resample
    if len(item) != 2 or not isinstance(item[1], (int, np.integer)) or isinstance(item[1], bool) or item[1] <= 0:
        raise InputError(f"audio[{index}]: a pair must be (samples, sample rate in Hz, a positive int), got a "
                         f"{len(item)}-tuple" + (f" with rate {item[1]!r}" if len(item) == 2 else ""))
    return resample(check_array(item[0]), int(item[1]), SAMPLE_RATE)


_OPTION_NAMES = (
    "language", "task", "beam_size", "best_of", "patience", "length_penalty", "repetition_penalty",
    "no_repeat_ngram_size", "temperature", "compression_ratio_threshold", "log_prob_threshold", "no_speech_threshold",
    "condition_on_previous_text", "prompt_reset_on_temperature", "initial_prompt", "prefix", "suppress_blank",
    "suppress_tokens", "without_timestamps", "max_initial_timestamp", "word_timestamps", "multilingual", "vad_filter",
    "max_new_tokens", "chunk_length", "clip_timestamps", "hotwords", "language_detection_threshold",
    "language_detection_segments", "seed")


def _stderr_progress(done, total):
    sys.stderr.write(f"\r{done:.1f} / {total:.1f} s")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()
