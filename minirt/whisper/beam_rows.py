"""Beams past the one-sequence cache: a DecoderBackend over a BatchDecoder's rows.

VulkanBackend's one-sequence entry points (encode, start, step, reorder) hold max_batch rows (5: faster-whisper's
default beam_size and best_of). Its batch entry points (bencode, bstepN, breorder) hold max_items rows, each at its
own position and reading its own item's encoder output; rows of one item are a search's beams or samples. BeamRows
runs a search there when it needs more rows than max_batch: the window is the batch's one item, the prompt runs a
token a step on one row (the batch has no prompt entry point), and step / reorder are step_rows / reorder_rows.
The batch's entry points are planned once, when first needed (WhisperModel.batch_backend), and shared with
transcribe_batch: the model's lock keeps one user of that state at a time.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class BeamRows:
    """A DecoderBackend over `backend`'s batch rows (see the module doc), for searches of up to its max_items rows.
    The batch methods (encode_batch, start_rows, step_rows, step_rows_select, reorder_rows) are the backend's own,
    so transcribe_batch can decode its batches through it too."""

    def __init__(self, backend):
        self.backend = backend
        self.n_mels, self.n_vocab = backend.n_mels, backend.n_vocab
        self.n_text_ctx, self.multilingual = backend.n_text_ctx, backend.multilingual
        self.name = f"{getattr(backend, 'name', type(backend).__name__)}, batch rows as beams"

    @property
    def max_batch(self) -> int:
        return self.backend.max_items

    @property
    def max_items(self) -> int:
        return self.backend.max_items

    @property
    def gpu_select(self) -> bool:       # step_rows_select only: one-sequence steps (step_select) are not offered
        return getattr(self.backend, "gpu_select", False)

    def encode(self, features: np.ndarray) -> None:
        x = np.asarray(features, np.float32)
        self._features = x
        self.backend.encode_batch(x if x.ndim == 3 else x[None])

    def align(self, tokens: Sequence[int], num_frames: int):
        """The backend's align (word timestamps), which reads the one-sequence encoder output: the window is
        encoded there first."""
        self.backend.encode(self._features)
        return self.backend.align(tokens, num_frames)

    def start(self, prompt: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        prompt, positions = [int(t) for t in prompt], [int(p) for p in positions]
        if not prompt or any(not 0 <= p < len(prompt) for p in positions):
            raise ValueError(f"start() positions {positions} for a prompt of {len(prompt)} tokens")
        self.backend.start_rows([0])
        out = np.empty((len(positions), self.n_vocab), np.float32)
        for at, token in enumerate(prompt):
            logits = self.backend.step_rows(np.array([token]))[0]
            for i, p in enumerate(positions):
                if p == at:
                    out[i] = logits
        return out

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self.backend.step_rows(np.asarray(tokens).reshape(-1))

    def reorder(self, rows: np.ndarray) -> None:
        self.backend.reorder_rows(np.asarray(rows).reshape(-1))

    def encode_batch(self, features):
        return self.backend.encode_batch(features)

    def start_rows(self, items):
        return self.backend.start_rows(items)

    def step_rows(self, tokens):
        return self.backend.step_rows(tokens)

    def step_rows_select(self, tokens, suppress, control):
        return self.backend.step_rows_select(tokens, suppress, control)

    def reorder_rows(self, rows):
        return self.backend.reorder_rows(rows)
