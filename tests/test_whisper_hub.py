"""Whisper models by name (minirt/whisper/hub.py): faster-whisper's size names and Hugging Face repo ids resolved in a
Hugging Face cache the tests fill themselves (models--ORG--NAME/refs, snapshots/<commit>/), offline: the folders
against faster-whisper's own download_model on the same cache, download_root and local_files_only passed to
huggingface_hub as faster-whisper passes them, the errors for what cannot be found, `minirt models`, and a model by
name transcribing a clip on the GPU as the same folder by path does. No test reaches the network: HF_HUB_OFFLINE is
on, and the Hub's address is a closed local port where a test turns it off."""
import json
import os
import wave

import numpy as np
import pytest
from click.testing import CliRunner

from minirt.cli import main
from minirt.errors import ModelError

hub = pytest.importorskip("huggingface_hub", reason="the whisper extra (huggingface_hub) is not installed")
pytest.importorskip("tokenizers", reason="the whisper extra (tokenizers) is not installed")
import huggingface_hub.constants  # noqa: E402  (the package loads its submodules lazily)
import huggingface_hub.errors  # noqa: E402
import huggingface_hub.utils  # noqa: E402

from minirt.whisper.hub import ALLOW_PATTERNS, MODELS, model_folder  # noqa: E402

# a narrow Whisper with 30 s windows and an English tokenizer (synthetic.write_folder), quick on lavapipe
CFG = {"d_model": 8, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
       "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
       "vocab_size": 1765}
TINY_EN = MODELS["tiny.en"]
MAIN, V1 = "a" * 39 + "1", "b" * 39 + "2"       # two commits of TINY_EN: main and the tag v1


def snapshot(cache, repo, commit, refs=("main",)):
    """The snapshot folder of `repo` at `commit` in cache `cache`, laid out as huggingface_hub lays it out, with
    `refs` (branches, tags) pointing at the commit."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (root / "refs" / ref).write_text(commit)
    folder = root / "snapshots" / commit
    folder.mkdir(parents=True)
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache with tiny.en's repo at two commits (main, v1: random weights of two seeds), a repo id of a
    Transformers checkpoint, and two repos minirt cannot load (a config alone; PyTorch weights)."""
    from minirt.whisper.synthetic import write_folder
    cache = tmp_path_factory.mktemp("hf") / "hub"
    write_folder(snapshot(cache, TINY_EN, MAIN), CFG, seed=0)
    write_folder(snapshot(cache, TINY_EN, V1, refs=("v1",)), CFG, seed=1)
    write_folder(snapshot(cache, "someone/whisper-small-finetune", "c" * 40), CFG, seed=2)
    (snapshot(cache, "someone/not-a-model", "d" * 40) / "config.json").write_text("{}")
    pt = snapshot(cache, "someone/whisper-pytorch", "e" * 40)
    (pt / "config.json").write_text(json.dumps({"model_type": "whisper"}))
    (pt / "pytorch_model.bin").write_bytes(b"\0" * 8)
    return cache


@pytest.fixture
def offline(monkeypatch, cache):
    """HF_HUB_OFFLINE on, HF_HUB_CACHE the test cache (the Hub reads both when imported, so its constants too),
    and the Hub's address a closed local port."""
    c = hub.constants
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(c, "ENDPOINT", "http://127.0.0.1:9")
    return cache


def folder_of(cache, repo, commit):
    return os.path.realpath(cache / f"models--{repo.replace('/', '--')}" / "snapshots" / commit)


def test_names_ids_and_revisions_resolve_as_faster_whisper_resolves_them(offline, monkeypatch, tmp_path):
    """A size name, its repo id, a tag and a commit give the snapshot folder faster-whisper's download_model gives
    on the same cache; download_root wins over HF_HUB_CACHE; a path that exists is used as it is."""
    from faster_whisper.utils import download_model
    cache = offline
    main_folder, v1_folder = folder_of(cache, TINY_EN, MAIN), folder_of(cache, TINY_EN, V1)
    tuned = "someone/whisper-small-finetune"
    for name, revision, want in [("tiny.en", None, main_folder), (TINY_EN, None, main_folder),
                                 ("tiny.en", "main", main_folder), ("tiny.en", "v1", v1_folder),
                                 (TINY_EN, V1, v1_folder), (tuned, None, folder_of(cache, tuned, "c" * 40))]:
        got = model_folder(name, revision=revision)
        assert os.path.realpath(got) == want, (name, revision)
        assert os.path.realpath(download_model(name, revision=revision)) == want
        assert os.path.realpath(model_folder(name, download_root=cache, local_files_only=True,
                                             revision=revision)) == want
    # download_root names the cache (HF_HUB_CACHE is another, empty one)
    monkeypatch.setattr(hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    assert os.path.realpath(model_folder("tiny.en", download_root=str(cache))) == main_folder
    with pytest.raises(ModelError, match="not in the Hugging Face cache"):
        model_folder("tiny.en")
    assert model_folder(main_folder, download_root=str(tmp_path / "none"), revision="v9") == main_folder


def test_names_are_faster_whispers():
    """The same names, for the same repos (faster-whisper's table)."""
    from faster_whisper.utils import _MODELS
    assert MODELS == _MODELS


def test_what_cannot_be_found(offline, monkeypatch, tmp_path):
    """Each error names the model and why: offline and not cached (HF_HUB_OFFLINE; local_files_only), a revision
    not cached, an unknown name (listing the known ones), a path that does not exist, a repo without the files
    minirt loads. faster-whisper fails for each of the first three too."""
    from faster_whisper.utils import download_model
    cache = offline
    for name, revision, words in [("base.en", None, ["Systran/faster-whisper-base.en", "'base.en'", "HF_HUB_OFFLINE",
                                                     str(cache)]),
                                  ("tiny.en", "v2", [TINY_EN, "revision 'v2'", "HF_HUB_OFFLINE"]),
                                  ("org/nothing", None, ["org/nothing (a Hugging Face repo id; no such model "
                                                          "folder either)", "HF_HUB_OFFLINE"])]:
        with pytest.raises(ModelError) as e:
            model_folder(name, revision=revision)
        assert all(w in str(e.value) for w in words), str(e.value)
        with pytest.raises(hub.errors.LocalEntryNotFoundError):
            download_model(name, revision=revision)
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ModelError, match=r"Systran/faster-whisper-base.en \(the model 'base.en'\): it is not in "
                                         r"the Hugging Face cache .* local_files_only=True forbids"):
        model_folder("base.en", local_files_only=True)
    with pytest.raises(ModelError) as e:
        model_folder("tiny-en")
    assert "tiny-en: no such model folder, and not a model name" in str(e.value)
    assert all(n in str(e.value) for n in ("tiny.en", "large-v3-turbo", "distil-large-v3.5", "turbo"))
    for path in (str(tmp_path / "no" / "such"), "./whisper-tiny", "x/model.safetensors"):
        with pytest.raises(ModelError, match=r"no such model folder$"):
            model_folder(path)
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match=r"someone/not-a-model \(a Hugging Face repo id; no such model folder "
                                         r"either\): not a Whisper checkpoint minirt loads: .*no model.safetensors"):
        model_folder("someone/not-a-model")
    with pytest.raises(ModelError, match="not a Whisper checkpoint minirt loads: .*found pytorch_model.bin"):
        model_folder("someone/whisper-pytorch")


def test_no_network_uses_the_cache(offline, monkeypatch):
    """Not offline, but the Hub unreachable (a closed port): the cached copy, as faster-whisper gets it; nothing
    cached is an error saying the Hub cannot be reached."""
    from faster_whisper.utils import download_model
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    want = folder_of(offline, TINY_EN, MAIN)
    assert os.path.realpath(model_folder("tiny.en")) == want == os.path.realpath(download_model("tiny.en"))
    with pytest.raises(ModelError, match=r"Systran/faster-whisper-small \(the model 'small'\): it is not in the "
                                         r"Hugging Face cache .* cannot be reached"):
        model_folder("small")


def test_download_arguments_are_faster_whispers(monkeypatch, tmp_path):
    """What reaches huggingface_hub.snapshot_download for a name: the repo, cache_dir = download_root,
    local_files_only and revision as faster-whisper's WhisperModel passes them; of the files, only those
    load_checkpoint reads (and preprocessor_config.json, which faster-whisper asks for)."""
    from faster_whisper.utils import download_model
    from minirt.whisper.synthetic import write_folder
    calls = []
    model = write_folder(tmp_path / "snap", CFG)

    def fake(repo_id, **kw):
        calls.append(dict(kw, repo_id=repo_id))
        return str(model)
    monkeypatch.setattr(hub, "snapshot_download", fake)
    for kw in [{}, {"download_root": str(tmp_path / "root")}, {"local_files_only": True}, {"revision": "v1"}]:
        calls.clear()
        model_folder("large-v3-turbo", **kw)
        download_model("large-v3-turbo", cache_dir=kw.get("download_root"),
                       local_files_only=kw.get("local_files_only", False), revision=kw.get("revision"))
        ours, theirs = calls
        for k in ("repo_id", "cache_dir", "local_files_only", "revision"):
            assert ours.get(k) == theirs.get(k), (kw, k)
        assert ours["repo_id"] == "mobiuslabsgmbh/faster-whisper-large-v3-turbo"
    transformers_repo = [".gitattributes", "README.md", "added_tokens.json", "config.json", "flax_model.msgpack",
                         "generation_config.json", "merges.txt", "model.safetensors", "normalizer.json",
                         "preprocessor_config.json", "pytorch_model.bin", "special_tokens_map.json", "tf_model.h5",
                         "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    ct2_repo = [".gitattributes", "README.md", "config.json", "model.bin", "tokenizer.json", "vocabulary.txt",
                "preprocessor_config.json"]
    pick = lambda files: set(hub.utils.filter_repo_objects(files, allow_patterns=ALLOW_PATTERNS))  # noqa: E731
    assert pick(transformers_repo) == {"config.json", "generation_config.json", "model.safetensors",
                                       "preprocessor_config.json", "tokenizer.json"}
    assert pick(ct2_repo) == set(ct2_repo) - {".gitattributes", "README.md"}


def test_models_command(offline):
    """`minirt models`: every name with its repo (tiny.en marked cached), the cached Whisper repos with their
    revisions and whether minirt loads them, the rest counted."""
    r = CliRunner().invoke(main, ["models"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    for name, repo in MODELS.items():
        line = next(ln for ln in lines if ln.split()[:2] == [name, repo])
        assert line.endswith("cached") == (name == "tiny.en"), line
    cached = {}
    for ln in lines[lines.index(f"Cached in {offline}:") + 1:]:
        cached.setdefault(ln.split()[0], []).append(ln)
    assert sorted(ln.split()[1:3] for ln in cached[TINY_EN]) == [["main", "(aaaaaaaa)"], ["v1", "(bbbbbbbb)"]]
    assert all(ln.endswith("loads (Transformers)") for ln in cached[TINY_EN])
    assert cached["someone/whisper-small-finetune"][0].endswith("loads (Transformers)")
    assert "no: no model.safetensors" in cached["someone/whisper-pytorch"][0]
    assert "someone/not-a-model" not in cached
    assert "(1 other model repo(s), not Whisper checkpoints)" in r.output
    empty = CliRunner().invoke(main, ["models", "--cache-dir", str(offline / "none")])
    assert f"No models cached in {offline / 'none'}." in empty.output
    h = CliRunner().invoke(main, ["models", "--help"])
    assert h.exit_code == 0 and "Examples" in h.output and "minirt models" in h.output
    assert "models" in CliRunner().invoke(main, ["--help"]).output


def test_plan_takes_a_name(offline):
    """`minirt plan tiny.en` plans the cached snapshot's Vulkan program, as `minirt plan FOLDER` does."""
    by_name = CliRunner().invoke(main, ["plan", "tiny.en", "--entry", "step1"], catch_exceptions=False)
    by_path = CliRunner().invoke(main, ["plan", folder_of(offline, TINY_EN, MAIN), "--entry", "step1"])
    assert by_name.exit_code == 0 and "entry point step1" in by_name.output
    assert by_name.output == by_path.output


def write_wav(path, seconds, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    x = 0.3 * np.sin(2 * np.pi * 330 * t) + 0.05 * rng.standard_normal(len(t))
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
    return str(path)


def test_a_model_by_name_transcribes(offline, tmp_path):
    """WhisperModel("tiny.en") from the cache, on the GPU, gives the tokens of the same snapshot loaded by path, and
    not those of the other revision; `minirt transcribe --model tiny.en` prints the same text."""
    from minirt.whisper import WhisperModel
    wav = write_wav(tmp_path / "clip.wav", 2.5, seed=7)
    by_name = WhisperModel("tiny.en", local_files_only=True)
    assert os.path.realpath(by_name.path) == folder_of(offline, TINY_EN, MAIN)
    opts = dict(beam_size=1, temperature=0)
    segs = list(by_name.transcribe(wav, **opts)[0])
    want = list(WhisperModel(folder_of(offline, TINY_EN, MAIN)).transcribe(wav, **opts)[0])
    assert segs and [s.tokens for s in segs] == [s.tokens for s in want]
    # the numpy reference: the CLI by name against the folder by path, and the other revision differs
    ref = list(WhisperModel(folder_of(offline, TINY_EN, MAIN), backend="reference").transcribe(wav, **opts)[0])
    other = list(WhisperModel("tiny.en", revision="v1", backend="reference").transcribe(wav, **opts)[0])
    assert [s.tokens for s in other] != [s.tokens for s in ref]
    r = CliRunner().invoke(main, ["transcribe", wav, "--model", "tiny.en", "--beam-size", "1", "--backend",
                                  "reference"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stdout == "".join(f"{s.text.strip()}\n" for s in ref)
    r = CliRunner().invoke(main, ["transcribe", wav, "--model", "base.en"])
    assert r.exit_code == 3 and "Systran/faster-whisper-base.en" in r.stderr and "HF_HUB_OFFLINE" in r.stderr
