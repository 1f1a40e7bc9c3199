"""minirt.whisper's backends against Hugging Face transformers' WhisperForConditionalGeneration (torch, CPU, float32)
on a small random-weights Whisper that transformers itself makes and saves (save_pretrained), read back by minirt's
checkpoint loader: the logits at every prompt position and at the first steps, from the same log-mel features,
within a relative error of 1e-4. The real tiny.en's reference logits are checked the same way in
tests/test_whisper_decode.py (test_reference_first_steps_against_transformers).

torch and transformers are test-only installs (tools/setup.sh); without them these tests are skipped."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (tools/setup.sh installs a CPU build)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (tools/setup.sh installs it)")

PROMPT, STEPS = [5, 17, 3], [42, 7, 99, 250]
TOLERANCE = 1e-4


def relative_errors(ours, theirs):
    """Per position: ||ours - theirs|| / ||theirs|| and max |ours - theirs| / max |theirs|, the larger."""
    d = ours - theirs
    l2 = np.linalg.norm(d, axis=1) / np.linalg.norm(theirs, axis=1)
    mx = np.abs(d).max(axis=1) / np.abs(theirs).max(axis=1)
    return np.maximum(l2, mx)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """(folder, features, logits): a 2+2-layer Whisper (d_model 64, 2 heads, 500 tokens, 48 frames) with
    transformers' random initialisation, saved as model.safetensors + config.json; random features; and
    transformers' logits for PROMPT + STEPS."""
    torch.manual_seed(0)
    cfg = transformers.WhisperConfig(
        vocab_size=500, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=256, decoder_ffn_dim=256, max_source_positions=24,
        max_target_positions=448, init_std=0.1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[])
    hf = transformers.WhisperForConditionalGeneration(cfg).eval()
    folder = tmp_path_factory.mktemp("small-whisper")
    hf.save_pretrained(folder)
    (folder / "tokenizer.json").write_text("{}")    # load_checkpoint wants one beside the weights; no text is read
    rng = np.random.default_rng(0)
    feats = (rng.standard_normal((80, 48)) * 0.5).astype(np.float32)
    with torch.no_grad():
        logits = hf(input_features=torch.from_numpy(feats[None]),
                    decoder_input_ids=torch.tensor([PROMPT + STEPS])).logits[0].numpy()
    return folder, feats, logits


def first_steps(backend, feats):
    """The backend's logits at each prompt position, then at each of STEPS fed one at a time."""
    backend.encode(feats)
    out = [backend.start(PROMPT, list(range(len(PROMPT))))]
    out += [backend.step(np.array([t])) for t in STEPS]
    return np.concatenate(out)


def check(backend, small):
    _, feats, theirs = small
    ours = first_steps(backend, feats)
    assert ours.shape == theirs.shape
    err = relative_errors(ours, theirs)
    assert err.max() <= TOLERANCE, f"relative errors per position {np.array2string(err, precision=2)}"
    return err


def test_reference_backend(small):
    from minirt.whisper.checkpoint import load_checkpoint
    from minirt.whisper.reference import ReferenceBackend
    ckpt = load_checkpoint(small[0])
    assert ckpt.kind == "huggingface"
    check(ReferenceBackend(ckpt.weights, ckpt.config), small)


def test_vulkan_backend(small):
    from minirt.whisper.checkpoint import load_checkpoint
    from minirt.whisper.vulkan import VulkanBackend
    ckpt = load_checkpoint(small[0])
    with VulkanBackend(ckpt.weights, ckpt.config, max_batch=1) as vb:
        check(vb, small)
