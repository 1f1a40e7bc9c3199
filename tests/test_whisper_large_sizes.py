"""The large Whisper sizes (minirt.whisper.synthetic.SIZES: medium, large-v2, large-v3, large-v3-turbo,
distil-large-v3): their full-size parameter shapes pass the checkpoint checks and give the decoder's dimensions, their
vocabularies' special tokens sit at Whisper's ids (large-v3's 51866 tokens: <|yue|>, <|nospeech|>, every later id one
higher), and a medium of one layer a side (every width the model's: 1024, 80 mel bins, 51865 tokens) written as a
CTranslate2 folder transcribes on lavapipe to the numpy reference's tokens. The Vulkan plans need the weights
themselves (they are packed while planning), so the full sizes are not planned here: tools/dev/large_sizes.py runs
them on a GPU."""
import numpy as np
import pytest

from minirt.whisper.synthetic import SIZES

LARGE = ("medium", "large-v2", "large-v3", "large-v3-turbo", "distil-large-v3")
V3 = ("large-v3", "large-v3-turbo", "distil-large-v3")
LAYERS = {"medium": (24, 24), "large-v2": (32, 32), "large-v3": (32, 32), "large-v3-turbo": (32, 4),
          "distil-large-v3": (32, 2)}


@pytest.mark.parametrize("size", LARGE)
def test_full_size_shapes_load_with_whispers_special_tokens(size, tmp_path):
    """The full-size shapes (arrays of one repeated value: no memory) pass check_checkpoint and give dims_of's
    dimensions; the vocabulary's tokenizer.json loads, passes check_tokenizer and has Whisper's ids."""
    import json

    from minirt.loaders.safetensors_loader import encoder_param_shapes
    from minirt.whisper.checkpoint_checks import check_checkpoint, check_tokenizer
    from minirt.whisper.decoder_graph import dims_of
    from minirt.whisper.synthetic import decoder_param_shapes, tokenizer_json
    from minirt.whisper.tokenizer import WhisperTokenizer
    cfg = SIZES[size]
    shapes = {f"model.encoder.{k}": s for k, s in encoder_param_shapes(cfg).items()}
    shapes.update({f"model.decoder.{k}": s for k, s in decoder_param_shapes(cfg).items()})
    one = np.float32(0.5)
    check_checkpoint({k: np.broadcast_to(one, s) for k, s in shapes.items()}, cfg, "config.json", "model.safetensors")
    d = 1024 if size == "medium" else 1280
    v3 = size in V3
    dm = dims_of({k: np.broadcast_to(one, s) for k, s in shapes.items()}, cfg)
    assert (dm.d_model, dm.encoder_heads, dm.decoder_heads, dm.n_audio_ctx, dm.n_text_ctx) == (d, d // 64, d // 64,
                                                                                              1500, 448)
    assert (dm.encoder_layers, dm.decoder_layers) == LAYERS[size]
    assert (dm.n_mels, dm.n_vocab) == ((128, 51866) if v3 else (80, 51865))
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(tokenizer_json(dm.n_vocab), ensure_ascii=False))
    tok = WhisperTokenizer.from_file(path, multilingual=True)
    check_tokenizer(tok, dm.n_vocab, str(path), "config.json")
    # Whisper's ids (openai-whisper's tokenizer, faster-whisper's large-v2 and large-v3 vocabularies)
    assert (tok.eot, tok.sot, tok.language_token("en"), tok.translate) == (50257, 50258, 50259, 50358 + v3)
    assert tok.sot_sequence("en") == [50258, 50259, 50359 + v3]
    assert (tok.no_speech, tok.no_timestamps, tok.timestamp_begin) == (50362 + v3, 50363 + v3, 50364 + v3)
    assert tok.tokenizer.id_to_token(tok.no_speech) == ("<|nospeech|>" if v3 else "<|nocaptions|>")
    assert len(tok.language_tokens) == 99 + v3 and ("yue" in tok.language_tokens) == v3


def _suppressed(tok, n_vocab):
    """The special tokens and the text tokens of only white space: what is left decodes to text, so the window's
    segment is kept (one of no text is dropped) and holds every token decoded."""
    return [i for i in range(tok.eot) if not tok.tokenizer.decode([i]).strip()] + list(range(tok.eot, n_vocab))


@pytest.mark.slow
def test_medium_widths_ctranslate2_folder_transcribe_as_the_reference(tmp_path):
    """A medium of one layer a side (d_model 1024, 16 heads, 80 mel bins, 51865 tokens: its embedding and projection
    are 212 MiB at fp32, split on lavapipe's 128 MiB range) written as a CTranslate2 folder and as a Hugging Face one
    from the same weights: WhisperModel's greedy tokens on lavapipe (the plans poisoned), from the CTranslate2 folder,
    equal the numpy reference's from either folder, on one 30 s window of noise."""
    from minirt.whisper import WhisperModel
    from minirt.whisper.checkpoint import load_checkpoint
    from minirt.whisper.synthetic import random_checkpoint, write_folder
    from minirt.whisper.vulkan import VulkanBackend
    weights, cfg = random_checkpoint(dict(SIZES["medium"], encoder_layers=1, decoder_layers=1), 3, fast=True)
    ct2 = write_folder(tmp_path / "ct2", cfg, kind="ctranslate2", weights=weights)
    hf = write_folder(tmp_path / "hf", cfg, kind="huggingface", weights=weights)
    del weights
    audio = (0.1 * np.random.default_rng(4).standard_normal(30 * 16000)).astype(np.float32)

    def tokens(model):
        opts = dict(language="en", beam_size=1, temperature=0.0, without_timestamps=True,
                    condition_on_previous_text=False, no_speech_threshold=None, log_prob_threshold=None,
                    compression_ratio_threshold=None, max_new_tokens=3,
                    suppress_tokens=_suppressed(model.tokenizer, 51865))
        return [t for s in model.transcribe(audio, **opts)[0] for t in s.tokens]

    want = tokens(WhisperModel(ct2, backend="reference"))
    assert len(want) == 3 and tokens(WhisperModel(hf, backend="reference")) == want
    ck = load_checkpoint(ct2)
    assert ck.kind == "ctranslate2" and ck.config["vocab_size"] == 51865 and ck.config["d_model"] == 1024
    with VulkanBackend(ck.weights, ck.config, options={"poison": True}) as vb:
        del ck
        assert tokens(WhisperModel(ct2, backend=vb)) == want
