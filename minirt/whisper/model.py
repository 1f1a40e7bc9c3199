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
import threading
from typing import Iterable, List, Optional, Tuple, Union

import numpy as np

from ..errors import InputError, OptionError
from ..pools import pool
from .audio_input import SAMPLE_RATE, audio_samples, load_audio
from .checkpoint import load_checkpoint
from .checkpoint_checks import check_tokenizer
from .compute_type import apply_compute_type
from .decoding import TranscriptionOptions
from .features import LogMel
from .hub import model_folder
from .option_checks import check_options, is_int
from .reference import blas_threads
from .tokenizer import WhisperTokenizer
from .transcribe import TranscriptionInfo, detect_language, generate_segments, generate_segments_batch
from .vad import keep_speech, restore_times, speech_chunks, vad_options

log = logging.getLogger("minirt.whisper")

DEFAULT_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
MAX_BATCH_ITEMS = 16        # WhisperModel's default max_batch_items


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
    backend: "vulkan" (minirt.whisper.vulkan.VulkanBackend: encoder and decoder on the GPU, at either precision;
    beams and best_of past 5 run on its batch rows, minirt.whisper.beam_rows), "reference" (the numpy reference on
    the CPU), None (the default: vulkan), or a DecoderBackend to use as it is.
    max_batch_items: the most windows transcribe_batch and BatchedInferencePipeline decode together (batch_size at
    most this; on the GPU, the batch's entry points and state are made for this many when first used, or for as many
    as the device's limits hold: VulkanBackend.add_batch).
    compute_type: faster-whisper's ("default", "auto", "float32", "float16", "int8", "int8_float32", "int8_float16",
    "int8_bfloat16"; minirt.whisper.compute_type): a float type sets the precision, an int8 one the precision and
    int8 Linear weights (a float checkpoint's quantized at load per output row); None or "default" keeps precision
    and the weights as the file holds them (a CTranslate2 int8 model.bin runs with int8 weights)."""

    def __init__(self, path, precision: str = "fp32", device=None, backend=None,
                 max_batch_items: int = MAX_BATCH_ITEMS, download_root=None, local_files_only: bool = False,
                 revision=None, compute_type=None):
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be 'fp32' or 'fp16', got {precision!r}")
        ckpt = load_checkpoint(model_folder(path, download_root, local_files_only, revision))
        self.compute_type = compute_type
        precision, ckpt.weights = apply_compute_type(compute_type, precision, ckpt.weights)
        self.path = ckpt.folder
        self.precision, self.device = precision, device
        self.config = ckpt.config
        self.tokenizer = WhisperTokenizer.from_file(ckpt.tokenizer_path, ckpt.multilingual)
        check_tokenizer(self.tokenizer, int(self.config["vocab_size"]), ckpt.tokenizer_path,
                        os.path.join(ckpt.folder, "config.json" if ckpt.kind == "huggingface" else "model.bin"))
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
        self.alignment_heads = ckpt.alignment_heads     # None: words.openai_alignment_heads or the default

    @property
    def lock(self) -> threading.RLock:
        """Held while the backend decodes a window (or a batch of windows, or detects a language): the backend's
        state on the GPU (the encoder output, the key/value cache) is one window's at a time, so threads sharing
        the model take turns a window at a time. A transcription's generator holds it only inside its own
        next() while a window decodes, never between segments: one left unfinished blocks no one."""
        return self.__dict__.setdefault("_lock", threading.RLock())

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

        prefix, hotwords, clip_timestamps ("start,end,..." seconds or a list of seconds; an odd count ends at the
        end of the audio), word_timestamps (Segment.words: words.Word(start, end, word, probability), from the
        cross-attention of the model's alignment heads: minirt.whisper.words), prepend_punctuations,
        append_punctuations and hallucination_silence_threshold (only with word_timestamps) are faster-whisper's
        and give its tokens and words. vad_filter with vad_parameters (a dict of vad.VadOptions' fields, or one)
        transcribes only the speech Silero VAD finds (minirt.whisper.vad; faster-whisper's package and onnxruntime
        needed), the times restored to the original audio; the file is read whole then. Not supported, refused
        with NotImplementedError: chunk_length other than 30."""
        kw = {k: v for k, v in locals().items() if k not in ("self", "audio", "ignored", "log_progress", "progress")}
        mel, options, info, rng = self._setup(audio, dict(kw, **ignored))
        if progress is None and log_progress:
            progress = _stderr_progress
        segments = generate_segments(self.search_backend(options), self.tokenizer, mel, options, info.language,
                                     kw["task"], self.suppress_blank_ids, rng, progress, lock=self.lock)
        if info.speech_chunks:
            segments = restore_times(segments, info.speech_chunks)
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
        bound = inspect.signature(WhisperModel.transcribe).bind(self, None, **options)
        bound.apply_defaults()
        kw = {k: v for k, v in bound.arguments.items() if k not in ("self", "audio", "log_progress", "progress",
                                                                     "ignored")}
        kw.update(bound.arguments.get("ignored", {}))
        self.check_options({k: v for k, v in kw.items() if k in _OPTION_NAMES})
        audio = [_at_16k(a, i) if isinstance(a, tuple) else a for i, a in enumerate(audio)]
        batch_size = self.max_batch_items if batch_size is None else batch_size
        if not audio:
            return []
        self.batch_backend(batch_size)
        # The files' log-mels are host work, most of it in numpy's FFT and BLAS, which release the GIL: computed
        # side by side they cost a fraction of their serial time before the first window reaches the GPU. BLAS is
        # held to one thread meanwhile (process-wide, through threadpoolctl where installed): OpenBLAS's own
        # threads, called from several threads at once, spin against each other and took the parallel run back to
        # the serial time on a 16-core host. Its sums do not depend on its thread count at these shapes.
        threads = pool("minirt-mel", min(_FEATURE_THREADS, os.cpu_count() or 1))
        with blas_threads(1 if len(audio) > 1 else None):
            mels = [threads.submit(self._item_mel, i, a) for i, a in enumerate(audio)]
            try:
                setups = [self._setup(a, dict(kw), mel.result) for a, mel in zip(audio, mels)]
            finally:
                for mel in mels:
                    mel.cancel()
        options = setups[0][1]
        files = [(mel, info.language, kw["task"], rng) for mel, _, info, rng in setups]
        with self.lock:
            segments = generate_segments_batch(self.search_backend(options), self.tokenizer, files, options,
                                               self.suppress_blank_ids,
                                               min(batch_size, self.backend.max_items))
        return [(list(restore_times(segs, info.speech_chunks)) if info.speech_chunks else segs, info)
                for segs, (_, _, info, _) in zip(segments, setups)]

    def _item_mel(self, index: int, audio) -> LogMel:
        """The LogMel of transcribe_batch's audio[index]; an InputError says which item it is about."""
        try:
            return LogMel(audio_samples(audio), self.n_mels)
        except InputError as e:
            raise InputError(f"audio[{index}]: {e}") from None

    def batch_backend(self, batch_size: int):
        """The backend, able to decode batches of batch_size windows (BatchDecoder): on the GPU, the batch's entry
        points are made the first time (for max_batch_items windows, from the checkpoint read again, or as many as
        the device holds: VulkanBackend.add_batch). A backend whose batch holds fewer (its max_items) decodes
        batch_size windows as batches of that many."""
        b = self.backend
        if not is_int(batch_size) or not 1 <= batch_size <= self.max_batch_items:
            raise OptionError(f"batch_size must be 1 to {self.max_batch_items} (WhisperModel(max_batch_items=...)), "
                             f"got {batch_size}")
        if not all(hasattr(b, m) for m in ("encode_batch", "start_rows", "step_rows", "reorder_rows")):
            raise TypeError(f"the backend {getattr(b, 'name', type(b).__name__)} does not decode batches "
                            f"(minirt.whisper.BatchDecoder)")
        with self.lock:
            if not getattr(b, "max_items", 0) and hasattr(b, "add_batch"):
                ckpt = load_checkpoint(self.path)
                _, weights = apply_compute_type(self.compute_type, self.precision, ckpt.weights)
                b.add_batch(weights, ckpt.config, self.max_batch_items)
        return b

    def check_options(self, kw: dict, sampling_allowed: bool = True) -> dict:
        """transcribe()'s options `kw` checked and normalised (option_checks.check_options): an OptionError naming
        the first bad one, before any audio is read."""
        return check_options(kw, self.tokenizer, int(self.backend.n_vocab), self.max_rows(), sampling_allowed)

    def max_rows(self):
        """The most rows (beams, or best_of samples) a search may have: the backend's one-sequence cache
        (max_batch), or on a backend with batch entry points, its batch's rows (max_batch_items: BeamRows); None
        for no limit."""
        b = self.backend
        rows = getattr(b, "max_batch", None)
        if rows is None:
            return None
        batch = getattr(b, "max_items", 0) or (self.max_batch_items if hasattr(b, "add_batch") else 0)
        return max(rows, batch)

    def search_backend(self, options: TranscriptionOptions):
        """The backend for options' searches: the model's, or where they need more rows than its one-sequence
        cache holds, BeamRows over its batch entry points (made now if they are not yet)."""
        rows = max([options.beam_size] + [options.best_of for t in options.temperatures if t > 0])
        b = self.backend
        if rows <= getattr(b, "max_batch", rows):
            return b
        from .beam_rows import BeamRows
        return BeamRows(self.batch_backend(min(rows, self.max_batch_items)))

    def word_backend(self):
        """The backend, able to align tokens for word timestamps (DecoderBackend.align): the alignment heads are the
        checkpoint's, else openai-whisper's for its model (words.openai_alignment_heads), else
        words.default_alignment_heads; on the GPU the align entry points are made the first time
        (from the checkpoint read again)."""
        from .words import default_alignment_heads, openai_alignment_heads
        b = self.backend
        if not all(hasattr(b, m) for m in ("align", "add_align")):
            raise TypeError(f"the backend {getattr(b, 'name', type(b).__name__)} does not align tokens (word "
                            f"timestamps need DecoderBackend.align)")
        if getattr(b, "align_heads", None) is None:
            heads = self.alignment_heads or openai_alignment_heads(self.config) or default_alignment_heads(
                int(self.config["decoder_layers"]), int(self.config["decoder_attention_heads"]))
            b.add_align(heads, self.tokenizer.eot, lambda: apply_compute_type(
                self.compute_type, self.precision, load_checkpoint(self.path).weights)[1])
        return b

    def _setup(self, audio, kw: dict, features=None):
        """(LogMel, TranscriptionOptions, TranscriptionInfo, rng) of one file for transcribe()'s options `kw`;
        features(), where given, returns the file's LogMel (computed elsewhere), after the options are checked."""
        ignored = {k: kw.pop(k) for k in list(kw) if k not in _OPTION_NAMES}
        kw = self.check_options(kw)
        (language, task, beam_size, best_of, patience, length_penalty, repetition_penalty, no_repeat_ngram_size,
         temperatures, compression_ratio_threshold, log_prob_threshold, no_speech_threshold,
         condition_on_previous_text, prompt_reset_on_temperature, initial_prompt, prefix, suppress_blank,
         suppress_tokens, without_timestamps, max_initial_timestamp, word_timestamps, multilingual, vad_filter,
         max_new_tokens, chunk_length, clip_timestamps, hotwords, language_detection_threshold,
         language_detection_segments, seed) = (kw[k] for k in _OPTION_NAMES)
        unsupported = [name for name, on in (
            ("chunk_length", chunk_length not in (None, 30)),) if on]
        if unsupported:
            raise NotImplementedError(f"minirt's WhisperModel does not support {', '.join(unsupported)}")
        known_extra = {"prepend_punctuations", "append_punctuations", "hallucination_silence_threshold",
                       "vad_parameters"}
        unknown = sorted(set(ignored) - known_extra)
        if unknown:
            raise TypeError(f"transcribe() got unexpected keyword argument(s) {', '.join(unknown)}")
        parity = parity_options(prefix=prefix, hotwords=hotwords, clip_timestamps=clip_timestamps,
                                word_timestamps=word_timestamps, max_new_tokens=max_new_tokens,
                                language_detection_segments=language_detection_segments,
                                language_detection_threshold=language_detection_threshold, **ignored)
        tok = self.tokenizer

        vad, chunks = None, None
        if vad_filter and isinstance(clip_timestamps, str) and clip_timestamps == "0":    # as faster-whisper
            vad = vad_options(ignored.get("vad_parameters"))
            samples = load_audio(audio)     # the model sees the speech only: the file is read whole
            chunks = speech_chunks(samples, vad)
            duration = len(samples) / SAMPLE_RATE
            mel = LogMel(keep_speech(samples, chunks), self.n_mels)
        else:
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
                with self.lock:
                    language, language_probability, all_language_probs = detect_language(
                        self.backend, tok, mel, language_detection_segments, language_detection_threshold,
                        start=detection_start(parity["clip_timestamps"], mel.content_frames))
        else:
            if not self.is_multilingual and language != "en":
                log.warning("the model is English-only; language %r is ignored ('en' is used)", language)
                language = "en"
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
            multilingual=multilingual, max_new_tokens=max_new_tokens, **parity)
        if word_timestamps:
            with self.lock:         # the align entry points join the backend's Program once
                self.word_backend()
        info = TranscriptionInfo(language=language, language_probability=language_probability, duration=duration,
                                 duration_after_vad=len(mel.samples) / SAMPLE_RATE,
                                 all_language_probs=all_language_probs, transcription_options=options,
                                 vad_options=vad, speech_chunks=chunks)
        return mel, options, info, np.random.default_rng(seed)


def parity_options(prefix=None, hotwords=None, clip_timestamps="0", word_timestamps=False, max_new_tokens=None,
                   language_detection_segments=1, language_detection_threshold=0.5,
                   hallucination_silence_threshold=None, prepend_punctuations=None, append_punctuations=None,
                   vad_parameters=None) -> dict:
    """The TranscriptionOptions fields of transcribe()'s prefix, hotwords, clip_timestamps, word timestamps and
    hallucination options, checked (OptionError naming the option)."""
    from .transcribe import parse_clip_timestamps
    for name, v in (("prefix", prefix), ("hotwords", hotwords)):
        if v is not None and not isinstance(v, str):
            raise OptionError(f"{name} must be a string or None, got {type(v).__name__}")
    clips = parse_clip_timestamps(clip_timestamps)
    if max_new_tokens is not None and (not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1):
        raise OptionError(f"max_new_tokens must be a positive int or None, got {max_new_tokens!r}")
    if not isinstance(language_detection_segments, (int, np.integer)) or language_detection_segments < 1:
        raise OptionError(f"language_detection_segments must be an int >= 1, got {language_detection_segments!r}")
    if hallucination_silence_threshold is not None:
        if not word_timestamps:
            raise OptionError("hallucination_silence_threshold needs word_timestamps=True (it reads the words' "
                             "times, as in faster-whisper)")
        if not float(hallucination_silence_threshold) > 0:
            raise OptionError(f"hallucination_silence_threshold must be > 0 seconds, got "
                             f"{hallucination_silence_threshold!r}")
    out = dict(prefix=prefix, hotwords=hotwords, clip_timestamps=clips, word_timestamps=bool(word_timestamps),
               hallucination_silence_threshold=hallucination_silence_threshold)
    for name, v in (("prepend_punctuations", prepend_punctuations), ("append_punctuations", append_punctuations)):
        if v is not None:
            if not isinstance(v, str):
                raise OptionError(f"{name} must be a string, got {type(v).__name__}")
            out[name] = v
    return out


def detection_start(clip_timestamps: list, content_frames: int) -> int:
    """The frame language detection starts at: the first clip's start where it is inside the audio, as in
    faster-whisper."""
    start = int(clip_timestamps[0] * 100) if clip_timestamps else 0
    return start if start < content_frames else 0


_FEATURE_THREADS = 8        # 16 log-mels of 30 s on a 16-core host, BLAS at one thread: 8 threads 3.4x one, 16 slower


def _at_16k(item, index: int) -> np.ndarray:
    """The samples of a (samples, sample rate) pair at 16 kHz; InputError naming the item where it is not one."""
    from .audio_input import check_array, resample
    if len(item) != 2 or not isinstance(item[1], (int, np.integer)) or isinstance(item[1], bool) or item[1] <= 0:
        raise InputError(f"audio[{index}]: a pair must be (samples, sample rate in Hz, a positive int), got a "
                         f"{len(item)}-tuple" + (f" with rate {item[1]!r}" if len(item) == 2 else ""))
    try:
        samples = check_array(item[0])
    except InputError as e:
        raise InputError(f"audio[{index}]: {e}") from None
    return resample(samples, int(item[1]), SAMPLE_RATE)


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
