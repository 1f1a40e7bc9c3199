"""The scheduler: one thread owns the WhisperModel and decodes the windows of every request in flight.

Each request runs faster-whisper's seek loop (transcribe.seek_loop), which asks for one 30 s window's decode at a
time. The scheduler keeps the request whose window has waited longest first; when that window's first decoding
attempt is greedy at temperature 0 (decoding.batchable), every other window waiting with the same decoding options
joins it, up to max_batch, and they are decoded together on the GPU (decoding.generate_batch: each row at its own
position, dropped when it ends). Temperature fallback, sampling and beam search then run on the windows that need
them, one by one, as WhisperModel.transcribe_batch runs them; a window with none to join it is decoded alone, as
transcribe() decodes it (a batch's encoder runs the smallest entry point that holds its windows: VulkanBackend.
encode_batch). A window decoded goes to the back of the line, so a
long file takes a turn a window at a time and never holds a short request for longer than its own windows take.

A request's result is what WhisperModel.transcribe gives it alone: the same seek loop, prompts and fallback, its own
sampling generator; a row's tokens in a batch are the tokens of the window decoded alone (tests/test_whisper_batch.py).
Requests that ask for word timestamps run transcribe() itself, a window a turn, not batched.
"""
from __future__ import annotations

import inspect
import logging
import threading
from collections import deque
from typing import Callable, Optional

import numpy as np

from ..whisper.decoding import batchable, generate_batch
from ..whisper.model import WhisperModel
from ..whisper.transcribe import Segment, decode_window, seek_loop

log = logging.getLogger("minirt.serve")

_NOT_OPTIONS = ("self", "audio", "log_progress", "progress", "ignored")


def transcribe_options(**options) -> dict:
    """Every option of WhisperModel.transcribe by name, `options` over its defaults (what WhisperModel._setup
    takes; it refuses names transcribe() does not know)."""
    bound = inspect.signature(WhisperModel.transcribe).bind(None, None, **options)
    bound.apply_defaults()
    kw = {k: v for k, v in bound.arguments.items() if k not in _NOT_OPTIONS}
    kw.update(bound.arguments.get("ignored", {}))
    return kw


class WordTimestampsUnavailable(Exception):
    """The model's transcribe() does not compute word timestamps."""


class Job:
    """One request's transcription. samples: float32 16 kHz; mel: their LogMel; options: transcribe()'s keywords
    (transcribe_options); done(result, error) is called once, from the scheduler thread, with ([Segment],
    TranscriptionInfo) or an exception. cancel() (any thread) drops the work at the scheduler's next turn."""

    def __init__(self, samples: np.ndarray, mel, options: dict, done: Callable):
        self.samples, self.mel, self.kw, self._done = samples, mel, options, done
        self.cancelled = False
        self.segments: list = []
        self.info = None
        self.options = self.rng = None      # TranscriptionOptions and the sampling generator, from _setup
        self.loop = None                    # the seek loop, or transcribe()'s segment generator (solo)
        self.solo = bool(options.get("word_timestamps"))
        self.window = None                  # the WindowRequest waiting for its decode
        self.turn = 0                       # when its work joined the line (lower goes first)
        self.finished = False

    def cancel(self):
        self.cancelled = True

    def finish(self, result=None, error: Optional[BaseException] = None):
        if not self.finished:
            self.finished = True
            if self.loop is not None and hasattr(self.loop, "close"):
                self.loop.close()
            self.loop = self.window = None
            self._done(result, error)


class Scheduler:
    """The thread that decodes every Job's windows (see the module doc). metrics: a Metrics (batch(windows),
    dropped()), or None."""

    def __init__(self, model: WhisperModel, max_batch: int, metrics=None):
        self.model, self.max_batch, self.metrics = model, int(max_batch), metrics
        self.backend = model.batch_backend(self.max_batch) if self.max_batch > 1 else model.backend
        self._cond = threading.Condition()
        self._incoming: deque = deque()
        self._active: list = []
        self._stopping = False
        self._tick = 0
        self._thread = threading.Thread(target=self._run, name="minirt-serve-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Job):
        with self._cond:
            if self._stopping:
                raise RuntimeError("the scheduler is stopped")
            self._incoming.append(job)
            self._cond.notify()

    def cancel(self, job: Job):
        job.cancel()
        with self._cond:
            self._cond.notify()

    @property
    def depth(self) -> int:
        """Jobs waiting or being decoded."""
        return len(self._incoming) + len(self._active)

    def stop(self, timeout: Optional[float] = None):
        """Finish the jobs in hand, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------------------------------

    def _run(self):
        while True:
            with self._cond:
                while not self._incoming and not self._active and not self._stopping:
                    self._cond.wait()
                if self._stopping and not self._incoming and not self._active:
                    return
                new = list(self._incoming)
                self._incoming.clear()
            for job in new:
                self._start(job)
            for job in self._active:
                if job.cancelled:
                    self._drop(job)
            self._active = [j for j in self._active if not j.finished]
            if self._active:
                try:
                    self._turn()
                except Exception as e:          # a failure outside any one job's work (a device error)
                    log.exception("decoding failed")
                    for job in self._active:
                        job.finish(error=e)
                self._active = [j for j in self._active if not j.finished]

    def _drop(self, job: Job):
        job.finish(error=CancelledJob())
        if self.metrics:
            self.metrics.dropped()

    def _queue(self, job: Job):
        self._tick += 1
        job.turn = self._tick

    def _start(self, job: Job):
        if job.cancelled:
            self._drop(job)
            return
        model = self.model
        try:
            if job.solo:
                try:
                    segments, job.info = model.transcribe(job.samples, **job.kw)
                except NotImplementedError as e:
                    if "word_timestamps" in str(e):
                        raise WordTimestampsUnavailable(str(e)) from None
                    raise
                job.loop = segments
            else:
                mel, job.samples = job.mel, None        # the seek loop reads the log-mel only
                _, job.options, job.info, job.rng = model._setup(None, dict(job.kw), lambda: mel)
                job.loop = seek_loop(model.tokenizer, mel, job.options, job.info.language, job.kw["task"])
                self._advance(job, None)
        except Exception as e:
            job.finish(error=e)
            return
        if not job.finished:
            self._queue(job)
            self._active.append(job)

    def _advance(self, job: Job, reply):
        """Run the job's seek loop on to its next window (job.window), or to its end (finish)."""
        while True:
            try:
                msg = job.loop.send(reply)
            except StopIteration:
                job.finish((job.segments, job.info))
                return
            reply = None
            if isinstance(msg, Segment):
                job.segments.append(msg)
            else:
                job.window = msg
                return

    def _together(self, job: Job) -> bool:
        return not job.solo and batchable(job.options) and not job.options.multilingual

    @staticmethod
    def _batch_key(job: Job):
        """The options generate_batch reads: windows decoded together must agree on them."""
        o = job.options
        return (o.max_new_tokens, o.repetition_penalty, o.no_repeat_ngram_size, tuple(o.suppress_tokens or ()),
                o.suppress_blank, o.max_initial_timestamp, o.length_penalty)

    def _turn(self):
        """One turn: the longest-waiting job's work, with every window that can be decoded beside it."""
        line = sorted(self._active, key=lambda j: j.turn)
        first = line[0]
        if first.solo:
            self._solo_step(first)
        elif self.max_batch > 1 and self._together(first):
            key = self._batch_key(first)
            batch = [j for j in line if self._together(j) and self._batch_key(j) == key][:self.max_batch]
            if len(batch) > 1:
                self._decode_batch(batch)
            else:       # alone: the one-window entry points (the batch encoder runs all max_batch items)
                self._decode_one(first)
        else:
            self._decode_one(first)

    def _decode_one(self, job: Job):
        model = self.model
        try:
            result = decode_window(model.backend, model.tokenizer, job.window, job.options, model.suppress_blank_ids,
                                   job.rng)
            if self.metrics:
                self.metrics.batch(1)
            self._queue(job)
            self._advance(job, result)
        except Exception as e:
            job.finish(error=e)

    def _decode_batch(self, batch: list):
        model, tok, b = self.model, self.model.tokenizer, self.backend
        windows = [j.window for j in batch]
        try:
            b.encode_batch(np.stack([w.features for w in windows]))
            firsts = generate_batch(b, tok, [w.prompt(tok, w.language, j.options) for j, w in zip(batch, windows)],
                                    batch[0].options, model.suppress_blank_ids)
        except Exception as e:
            log.exception("a batch of %d windows failed", len(batch))
            for job in batch:
                job.finish(error=e)
            return
        if self.metrics:
            self.metrics.batch(len(batch))
        for job, window, first in zip(batch, windows, firsts):
            try:
                result = decode_window(b, tok, window, job.options, model.suppress_blank_ids, job.rng, first)
                self._queue(job)
                self._advance(job, result)
            except Exception as e:
                job.finish(error=e)

    def _solo_step(self, job: Job):
        """A word-timestamps job: its next segment from transcribe() (at most one window's decode)."""
        try:
            seg = next(job.loop)
        except StopIteration:
            job.finish((job.segments, job.info))
            return
        except Exception as e:
            job.finish(error=e)
            return
        job.segments.append(seg)
        self._queue(job)


class CancelledJob(Exception):
    """The job was cancelled (its client went away)."""
