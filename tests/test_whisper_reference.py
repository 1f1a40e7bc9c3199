"""The numpy reference backend as a DecoderBackend: the cache (incremental steps equal a whole-prompt pass), row
replication, reordering and dropping, determinism, and the conformance driver a GPU backend is checked with."""
import numpy as np
import pytest

import real_whisper
from minirt.whisper.backend import DecoderBackend
from whisper_conformance import drive, max_deviation

pytest.importorskip("tokenizers", reason="the whisper extra (tokenizers) is not installed")


@pytest.fixture(scope="module")
def checkpoint():
    from minirt.whisper.checkpoint import load_checkpoint
    try:
        return load_checkpoint(real_whisper.tiny_en_ct2_dir())
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")


@pytest.fixture(scope="module")
def features():
    from minirt.whisper.audio_input import load_audio
    from minirt.whisper.features import LogMel
    mel = LogMel(load_audio(str(real_whisper.SPEECH)))
    return mel.window(0, mel.content_frames)


def backend(checkpoint, precision="fp32"):
    from minirt.whisper.reference import ReferenceBackend
    return ReferenceBackend(checkpoint.weights, checkpoint.config, precision)


def test_cache_rows_and_positions(checkpoint, features):
    b = backend(checkpoint)
    assert isinstance(b, DecoderBackend)
    assert (b.n_vocab, b.n_text_ctx, b.n_mels, b.multilingual) == (51864, 448, 80, False)
    prompt = [50257, 50363, 18435, 11, 428]
    b.encode(features)
    whole = b.start(prompt, list(range(len(prompt))))
    assert whole.shape == (5, 51864) and whole.dtype == np.float32
    first = b.start(prompt[:2], [0, 1])
    np.testing.assert_allclose(first, whole[:2], atol=2e-4, rtol=0)     # a new start clears the cache
    b.reorder(np.zeros(3, np.int64))                             # replicate
    steps = [b.step(np.full(3, t)) for t in prompt[2:]]
    for i, s in enumerate(steps):
        assert s.shape == (3, 51864)
        np.testing.assert_array_equal(s[0], s[2])
        np.testing.assert_allclose(s[0], whole[2 + i], atol=2e-4, rtol=0)   # incremental == whole prompt
    # rows follow a reorder: give the rows different histories, then permute and compare with fresh runs
    b.start(prompt[:2], [1])
    b.reorder(np.array([0, 0]))
    b.step(np.array([18435, 40]))
    b.reorder(np.array([1, 0, 1]))
    got = b.step(np.array([11, 11, 11]))
    for row, second in ((0, 40), (1, 18435), (2, 40)):
        b.start(prompt[:2], [1])
        b.step(np.array([second]))
        np.testing.assert_allclose(got[row], b.step(np.array([11]))[0], atol=2e-4, rtol=0)
    b.reorder(np.array([0, 0, 0]))
    b.step(np.array([13, 13, 13]))
    b.reorder(np.array([2]))                                      # drop rows
    assert b.step(np.array([13])).shape == (1, 51864)
    with pytest.raises(ValueError, match="tokens for a batch of 1"):
        b.step(np.array([13, 13]))


def test_conformance_driver(checkpoint, features):
    a, b = backend(checkpoint), backend(checkpoint)
    logits = drive(a, features, [50257], steps=3, batch=2)
    assert [x.shape for x in logits] == [(2, 51864)] + [(2, 51864)] * 3 + [(1, 51864)] * 2
    assert max_deviation(a, b, features, [50257], steps=3, batch=2) == 0.0
    with pytest.raises(ValueError, match="precision"):
        backend(checkpoint, "int8")
