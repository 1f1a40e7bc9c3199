"""Word timestamps' alignment on the GPU (VulkanBackend.align: the alignP entry points, decoder_graph.align_graph)
against the numpy reference (ReferenceBackend.align, which tests/test_whisper_parity.py checks against faster-whisper
through the words it gives): the alignment heads' cross-attention probabilities and the text tokens' probabilities,
on a small random Whisper with activations poisoned (NaN before each run); the plan (every op on the GPU, nothing
back but the two outputs). tests/test_whisper_vulkan.py checks real tiny.en words from the GPU's alignment."""
import numpy as np
import pytest

from test_whisper_vulkan import N_AUDIO, N_MELS, VOCAB, small_whisper

HEADS = [(1, 1), (0, 0), (1, 0)]      # out of layer order: the output follows the list
EOT = 400


@pytest.fixture(scope="module")
def small():
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import VulkanBackend
    w, cfg = small_whisper(seed=3)
    ref = ReferenceBackend(w, cfg)
    ref.add_align(HEADS, EOT)
    with VulkanBackend(w, cfg, max_batch=2, options={"poison": True}) as vb:
        vb.add_align(HEADS, EOT, lambda: w)
        yield vb, ref


def test_align_equals_the_reference(small):
    vb, ref = small
    rng = np.random.default_rng(7)
    features = rng.standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32)
    for b in (vb, ref):
        b.encode(features)
    for length, frames in ((9, 2 * N_AUDIO), (40, 31), (70, 3)):     # both entry points (64, 232 slots)
        tokens = [int(t) for t in rng.integers(0, VOCAB, length)]
        tokens[-1] = EOT
        (a, p), (b, q) = vb.align(tokens, frames), ref.align(tokens, frames)
        assert a.shape == b.shape == (len(HEADS), length, frames // 2)
        assert np.isfinite(a).all() and np.allclose(a.sum(-1), 1, atol=1e-5)
        assert np.abs(a - b).max() <= 1e-5
        assert p.shape == q.shape == (length,) and p[-2] == q[-2] == 0     # <|endoftext|> is not text
        assert np.abs(p - q).max() <= 1e-5 * q.max() + 1e-30
    # decoding goes on as before on the same window: align leaves nothing the next prompt reads
    got, want = (b.start([7, 300, 12], [2, 0]) for b in (vb, ref))
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_align_plan_and_errors(small):
    vb, _ = small
    vb.encode(np.random.default_rng(9).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32))
    plan = vb.plans["align64"]
    assert plan.inputs == ["tokens", "key_mask", "picks"] and plan.outputs == ["attention", "token_probs"]
    assert plan.tensors["attention"].shape == (len(HEADS), 64, N_AUDIO) and plan.params == ["pos"]
    assert {d.kernel for d in plan.dispatches} >= {"softmax_buffer", "matmul_buffer_tensor", "cached_attention"}
    assert "align232" in vb.plans
    with pytest.raises(ValueError, match="align"):
        vb.align(list(range(300)), 10)
    with pytest.raises(ValueError, match="encoder positions"):
        vb.align([1, 2], 1)


def test_align_at_fp16():
    """At precision fp16 (16-bit storage, fp32 arithmetic) the probabilities are the float32 reference's within
    test_whisper_vulkan's FP16_TOLERANCE."""
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import VulkanBackend
    from test_whisper_vulkan import FP16_TOLERANCE
    w, cfg = small_whisper(seed=4)
    ref = ReferenceBackend(w, cfg)
    ref.add_align(HEADS[:2], EOT)
    features = np.random.default_rng(8).standard_normal((N_MELS, 2 * N_AUDIO)).astype(np.float32)
    tokens = [5, 17, 300] + list(range(40, 70)) + [EOT]
    with VulkanBackend(w, cfg, precision="fp16", max_batch=1) as vb:
        vb.add_align(HEADS[:2], EOT, w)
        for b in (vb, ref):
            b.encode(features)
        (a, p), (b, q) = vb.align(tokens, 40), ref.align(tokens, 40)
    assert np.abs(a - b).max() <= FP16_TOLERANCE
    assert np.abs(p - q).max() <= FP16_TOLERANCE * q.max()


def test_words_of_a_search_on_the_batch_rows(tmp_path):
    """beam_size 6 runs on the batch's rows (BeamRows), whose alignment goes through the one-sequence entry points
    after encoding the window there: the GPU's tokens and words are the reference's; a beam past max_batch_items is
    an OptionError naming beam_size."""
    from minirt.errors import OptionError
    from minirt.whisper import WhisperModel
    from minirt.whisper.synthetic import write_folder
    cfg = {"d_model": 64, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
           "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
           "vocab_size": 2000}
    folder = write_folder(tmp_path, cfg)
    audio = np.random.default_rng(7).standard_normal(16000).astype(np.float32) * 0.1
    opts = dict(beam_size=6, word_timestamps=True, temperature=0.0, max_new_tokens=12)
    gpu = WhisperModel(folder, backend="vulkan", max_batch_items=6)
    ref = WhisperModel(folder, backend="reference")
    got = list(gpu.transcribe(audio, **opts)[0])
    want = list(ref.transcribe(audio, **opts)[0])
    assert [s.tokens for s in got] == [s.tokens for s in want] and any(s.words for s in got)
    assert [[w.word for w in s.words] for s in got] == [[w.word for w in s.words] for s in want]
    for s, r in zip(got, want):
        np.testing.assert_allclose([(w.start, w.end) for w in s.words], [(w.start, w.end) for w in r.words],
                                   atol=0.021)
    with pytest.raises(OptionError, match="beam_size"):
        gpu.transcribe(audio, beam_size=7)


def test_words_of_the_batched_pipeline(tmp_path):
    """BatchedInferencePipeline(word_timestamps=True) on the GPU (chunks decoded as a batch, each encoded again on the
    one-window state for its alignment) gives the reference's tokens and words, greedy in batches of 2 and with a
    beam chunk by chunk."""
    from minirt.whisper import BatchedInferencePipeline, WhisperModel
    from minirt.whisper.synthetic import write_folder
    cfg = {"d_model": 64, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
           "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
           "vocab_size": 2000}
    folder = write_folder(tmp_path, cfg, seed=1)     # (with <|notimestamps|> suppressed its chunks have words)
    audio = np.random.default_rng(8).standard_normal(16000 * 5).astype(np.float32) * 0.1
    clips = [{"start": 0.0, "end": 1.5}, {"start": 1.5, "end": 3.8}, {"start": 3.8, "end": 5.0}]
    gpu = BatchedInferencePipeline(WhisperModel(folder, backend="vulkan", max_batch_items=2))
    ref = BatchedInferencePipeline(WhisperModel(folder, backend="reference"))
    for beam in (1, 2):
        opts = dict(beam_size=beam, word_timestamps=True, max_new_tokens=10, clip_timestamps=clips, vad_filter=False,
                    batch_size=2, suppress_tokens=[-1, ref.model.tokenizer.no_timestamps])
        got, want = list(gpu.transcribe(audio, **opts)[0]), list(ref.transcribe(audio, **opts)[0])
        assert [s.tokens for s in got] == [s.tokens for s in want] and all(s.words for s in want)
        assert [[w.word for w in s.words] for s in got] == [[w.word for w in s.words] for s in want]
        for s, r in zip(got, want):
            np.testing.assert_allclose([(w.start, w.end) for w in s.words], [(w.start, w.end) for w in r.words],
                                       atol=0.021)
