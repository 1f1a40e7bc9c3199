"""Check a DecoderBackend against another (the numpy reference as the oracle): both are driven through the same
calls (encode, start, replicate, steps, a beam-style reorder, dropped rows) and their logits compared.
"""
from __future__ import annotations

import numpy as np


def drive(backend, features, prompt, steps: int = 8, batch: int = 3, seed: int = 0) -> list:
    """[logits arrays] from a fixed call sequence: encode(features); start(prompt, [0, last]); replicate to
    `batch` rows; `steps` steps of seeded tokens with a seeded row permutation before each (beam reordering);
    then one row dropped and two more steps."""
    rng = np.random.default_rng(seed)
    out = []
    backend.encode(features)
    out.append(np.asarray(backend.start(prompt, [0, len(prompt) - 1]), np.float32))
    backend.reorder(np.zeros(batch, np.int64))
    tokens = rng.integers(0, min(backend.n_vocab, 50000), batch)
    for _ in range(steps):
        out.append(np.asarray(backend.step(tokens), np.float32))
        backend.reorder(rng.integers(0, batch, batch))
        tokens = rng.integers(0, min(backend.n_vocab, 50000), batch)
    keep = np.arange(batch - 1) if batch > 1 else np.zeros(1, np.int64)
    backend.reorder(keep)
    for _ in range(2):
        tokens = rng.integers(0, min(backend.n_vocab, 50000), len(keep))
        out.append(np.asarray(backend.step(tokens), np.float32))
    return out


def max_deviation(candidate, reference, features, prompt, **kw) -> float:
    """The largest |logit difference| between two backends over drive()'s call sequence (shapes must agree)."""
    a, b = drive(candidate, features, prompt, **kw), drive(reference, features, prompt, **kw)
    worst = 0.0
    for x, y in zip(a, b):
        if x.shape != y.shape:
            raise AssertionError(f"logits of shape {list(x.shape)} against {list(y.shape)}")
        worst = max(worst, float(np.abs(x - y).max()))
    return worst
