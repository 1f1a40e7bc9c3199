"""The interface between the host-side decoding (decoding.py, search.py, transcribe.py) and a Whisper model that
runs somewhere: the numpy reference (reference.py) or the Vulkan program (vulkan.py).

The host never sees hidden states, only logits: it encodes one 30 s window, runs a prompt, then feeds one token
per row and step, and tells the backend how rows of its key/value cache are reordered, replicated or dropped.
A backend may also pick greedy decoding's tokens itself, from logits it keeps: with the attribute gpu_select true,
step_select(tokens, suppress, control) (and, on a BatchDecoder, step_rows_select) return TokenSelect's [rows, 4]
selection (minirt/ops/token_select.py; the logit filters as masks, filters.GpuMasks) instead of the logits
(VulkanBackend: on the GPU). decoding.generate_batch and search.greedy use them where every filter is a mask.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class DecoderBackend(Protocol):
    """A Whisper encoder-decoder with a key/value cache of `batch` rows.

    Attributes: n_mels (mel bins of the encoder input), n_vocab (logit width), n_text_ctx (decoder positions,
    448), multilingual (vocabulary of 51865 entries or more).

    A window's decode is: encode(features) once; then, for each decoding attempt (temperature fallback
    repeats it), start(prompt, positions) with batch 1, then any number of reorder() and step() calls.
    Logits are float32 and are not processed in any way (no suppression, no softmax)."""

    n_mels: int
    n_vocab: int
    n_text_ctx: int
    multilingual: bool

    def encode(self, features: np.ndarray) -> None:
        """Run the encoder on one window, [n_mels, 3000] float32; its output stays with the backend (on the
        device) for every start() and step() until the next encode()."""

    def start(self, prompt: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        """Clear the cache and run the prompt tokens (positions 0 .. len(prompt) - 1) as one row; return the
        logits at the given prompt positions, [len(positions), n_vocab]. The host asks for the last position
        (the next token's logits) and the <|startoftranscript|> position (its <|nocaptions|> probability
        is the window's no_speech_prob; language detection reads the language tokens there). The batch is 1
        afterwards."""

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Append one token to each row (int array [batch]) at the next position; return the logits there,
        [batch, n_vocab]."""

    def reorder(self, rows: np.ndarray) -> None:
        """Make new row i a copy of old row rows[i] (int array; its length is the new batch). This replicates the
        prompt's row for beam search or best-of sampling, follows beam reordering, and drops finished rows."""


@runtime_checkable
class BatchDecoder(Protocol):
    """A DecoderBackend that also decodes a batch of independent sequences (windows of several files, or of one long
    file), each with its own encoder output, its own position and its own end (VulkanBackend, ReferenceBackend).
    Attribute max_items: sequences a batch holds at most.

    encode_batch(features) once for the batch; start_rows(items) to begin; then step_rows() and reorder_rows(). A row
    is a sequence being decoded: its key/value cache, its length (its next position) and its item, the window
    whose encoder output its cross-attention reads (several rows of one item: beams or best_of, later). Logits are
    float32, unprocessed. This state is separate from the one-sequence interface's (encode, start, step)."""

    max_items: int

    def encode_batch(self, features: np.ndarray) -> None:
        """Run the encoder on n windows, [n, n_mels, 3000] float32, 1 <= n <= max_items: items 0 .. n-1."""

    def start_rows(self, items: Sequence[int]) -> None:
        """Rows with empty caches, row r reading item items[r]'s encoder output."""

    def step_rows(self, tokens: np.ndarray) -> np.ndarray:
        """Append one token to each row (int array [rows]) at that row's next position (rows start at 0 and
        move on by one a step, each on its own); return the logits there, [rows, n_vocab]."""

    def reorder_rows(self, rows: np.ndarray) -> None:
        """Make new row i a copy of old row rows[i] (cache, length and item): drops finished rows, packing the
        live ones first."""
