"""`minirt transcribe`: formats, output paths (checked before the model loads, written whole), several files, exit
codes for bad models and audio; and WhisperModel's errors for checkpoints it cannot use."""
import dataclasses
import json
import os
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

import real_whisper
from minirt.cli import main
from minirt.errors import InputError, ModelError

pytest.importorskip("tokenizers", reason="the whisper extra (tokenizers) is not installed")
SPEECH = str(real_whisper.SPEECH)


@pytest.fixture(scope="module")
def ct2_dir():
    try:
        return str(real_whisper.tiny_en_ct2_dir())
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")


def run(*args):
    """`minirt transcribe` on the numpy reference decoder (the GPU decoder is checked against it elsewhere; on
    lavapipe it would take minutes a clip) unless args name a backend."""
    backend = () if "--backend" in args else ("--backend", "reference")
    return CliRunner().invoke(main, ["transcribe", *backend, *args], catch_exceptions=False)


def test_formats(ct2_dir, tmp_path):
    from minirt.whisper import WhisperModel
    expected = list(WhisperModel(ct2_dir, backend="reference").transcribe(SPEECH, beam_size=1)[0])
    r = run(SPEECH, "--model", ct2_dir, "--beam-size", "1", "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc) == {"text", "language", "duration", "segments"}
    assert doc["language"] == "en" and doc["duration"] == pytest.approx(3.6265625)
    assert [(s["id"], s["start"], s["end"], s["text"], s["tokens"]) for s in doc["segments"]] == \
        [(s.id, s.start, s.end, s.text, s.tokens) for s in expected]
    assert doc["text"] == "".join(s.text for s in expected).strip()

    out = tmp_path / "t.srt"
    r = run(SPEECH, "--model", ct2_dir, "--beam-size", "1", "--format", "srt", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text() == f"1\n00:00:00,000 --> 00:00:03,360\n{expected[0].text.strip()}\n\n"
    assert f"wrote {out}" in r.stderr
    assert [f for f in os.listdir(tmp_path) if f != "t.srt"] == []        # no temporary file left
    r = run(SPEECH, "--model", ct2_dir, "--beam-size", "1", "--format", "vtt", "--no-timestamps")
    assert r.exit_code == 0 and r.stdout.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:03.")
    r = run(SPEECH, "--model", ct2_dir, "--beam-size", "1", "--language", "de")
    assert r.exit_code == 0 and "English-only" in r.stderr
    assert r.stdout == expected[0].text.strip() + "\n"


def test_words_prompts_and_clips(ct2_dir):
    """--word-timestamps (json words; srt a cue per --max-words words), --prefix, --hotwords, --initial-prompt,
    --clip-timestamps and --task as WhisperModel.transcribe's options (--vad-filter too: clip_timestamps other
    than "0" turns it off, as in faster-whisper)."""
    from minirt.whisper import WhisperModel
    options = dict(beam_size=1, word_timestamps=True, prefix="Hello", hotwords="speech", initial_prompt="A test.",
                   clip_timestamps="0.2", task="translate")
    (expected,) = WhisperModel(ct2_dir, backend="reference").transcribe(SPEECH, **options)[0]
    args = (SPEECH, "--model", ct2_dir, "--beam-size", "1", "--word-timestamps", "--prefix", "Hello", "--hotwords",
            "speech", "--initial-prompt", "A test.", "--clip-timestamps", "0.2", "--task", "translate",
            "--vad-filter")
    r = run(*args, "--format", "json")
    assert r.exit_code == 0, r.output
    assert "English-only" in r.stderr
    (seg,) = json.loads(r.stdout)["segments"]
    assert seg["tokens"] == expected.tokens and seg["text"].strip().startswith("Hello")
    assert seg["words"] == [dataclasses.asdict(w) for w in expected.words]
    r = run(*args, "--format", "srt", "--max-words", "2")
    words = expected.words
    assert r.exit_code == 0 and r.stdout.count(" --> ") == (len(words) + 1) // 2
    assert r.stdout.startswith(f"1\n00:00:00,{round(words[0].start * 1000):03d} --> ")
    assert f"\n{words[0].word.strip()} {words[1].word.strip()}\n" in r.stdout
    r = run(SPEECH, "--model", ct2_dir, "--max-words", "2")
    assert r.exit_code == 2 and "--word-timestamps" in r.output
    r = run(SPEECH, "--model", ct2_dir, "--clip-timestamps", "1,x")
    assert r.exit_code == 2 and "clip_timestamps" in r.output


def test_several_files_into_a_folder(ct2_dir, tmp_path):
    a, b = tmp_path / "in" / "a.wav", tmp_path / "in" / "b.wav"
    a.parent.mkdir()
    shutil.copy(SPEECH, a)
    shutil.copy(SPEECH, b)
    out = tmp_path / "out"
    out.mkdir()
    r = run(str(a), str(b), "--model", ct2_dir, "--beam-size", "1", "--format", "txt", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(out)) == ["a.txt", "b.txt"]
    assert (out / "a.txt").read_text() == (out / "b.txt").read_text() != ""
    r = run(str(a), str(b), "--model", ct2_dir, "--beam-size", "1")
    assert r.stdout.count("==> ") == 2


def test_output_paths_checked_before_the_model_loads(tmp_path):
    # a model path that does not exist: the usage error comes first (exit 2), nothing is loaded
    r = run(SPEECH, "--model", str(tmp_path / "nomodel"), "-o", str(tmp_path / "missing" / "t.txt"))
    assert r.exit_code == 2 and "does not exist" in r.output
    r = run(SPEECH, SPEECH, "--model", str(tmp_path / "nomodel"), "-o", str(tmp_path / "t.txt"))
    assert r.exit_code == 2 and "existing folder" in r.output
    r = run(SPEECH, "x/" + os.path.basename(SPEECH), "--model", "m", "-o", str(tmp_path))
    assert r.exit_code == 2 and "would both be written" in r.output
    r = run(SPEECH, "--model", "m", "--beam-size", "0")
    assert r.exit_code == 2
    # beams past the batch's rows (16; with --batch-size 8, 8): a usage error naming the option, before any work
    r = run(SPEECH, "--model", "m", "--beam-size", "17", "--backend", "vulkan")
    assert r.exit_code == 2 and "--beam-size" in r.output and "holds 16 rows (beams) at most" in r.output
    r = run(SPEECH, "--model", "m", "--beam-size", "9", "--batch-size", "8", "--backend", "vulkan")
    assert r.exit_code == 2 and "holds 8 rows (beams) at most with --batch-size 8" in r.output


def test_bad_models_and_audio_exit_3(ct2_dir, tmp_path):
    r = run(str(tmp_path / "none.wav"), "--model", ct2_dir)
    assert r.exit_code == 3 and "no such file" in r.stderr
    r = run(SPEECH, "--model", str(tmp_path / "nomodel"))
    assert r.exit_code == 3 and "no such model folder" in r.stderr
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    for f in ("model.bin", "config.json"):
        os.symlink(os.path.join(ct2_dir, f), no_tok / f)
    r = run(SPEECH, "--model", str(no_tok))
    assert r.exit_code == 3 and "no tokenizer.json" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run(SPEECH, "--model", str(empty))
    assert r.exit_code == 3 and "no model.safetensors" in r.stderr
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk")
    r = run(str(junk), "--model", ct2_dir, "--beam-size", "1")
    assert r.exit_code == 3 and "junk.wav" in r.stderr


def test_encoder_only_checkpoint_is_refused(tmp_path):
    try:
        st = real_whisper.tiny_en_safetensors()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    from safetensors.numpy import load_file, save_file
    from minirt.whisper import WhisperModel
    w = {k: v for k, v in load_file(st).items() if k.startswith("model.encoder.")}
    save_file(w, tmp_path / "model.safetensors")
    cfg = json.loads((st.parent / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if not k.startswith("decoder")}))
    shutil.copy(real_whisper.tokenizer_json(), tmp_path / "tokenizer.json")
    with pytest.raises(ModelError, match="no decoder"):
        WhisperModel(tmp_path)


def test_transcribe_refuses_what_it_does_not_do(ct2_dir):
    from minirt.whisper import WhisperModel
    m = WhisperModel(ct2_dir, backend="reference")
    with pytest.raises(NotImplementedError, match="chunk_length"):
        m.transcribe(np.zeros(16000, np.float32), chunk_length=10)
    with pytest.raises(TypeError, match="no_such_option"):
        m.transcribe(np.zeros(16000, np.float32), no_such_option=1)
    with pytest.raises(InputError):
        m.transcribe(np.zeros((2, 2, 2), np.float32))
    with pytest.raises(ValueError, match="beam_size"):
        m.transcribe(np.zeros(16000, np.float32), beam_size=0)


def test_ctranslate2_folder_with_only_a_vocabulary(ct2_dir, tmp_path):
    """A faster-whisper folder without tokenizer.json: the tokenizer is rebuilt from vocabulary.txt (the merges
    recovered from the token order) and gives the same ids and transcript."""
    from minirt.whisper import WhisperModel
    from minirt.whisper.vocabulary import merges_from_vocabulary, read_vocabulary
    for f in ("model.bin", "config.json", "vocabulary.txt"):
        os.symlink(os.path.join(ct2_dir, f), tmp_path / f)
    tokens = read_vocabulary(tmp_path / "vocabulary.txt")
    merges = json.loads(open(os.path.join(ct2_dir, "tokenizer.json"), encoding="utf-8").read())["model"]["merges"]
    assert merges_from_vocabulary(tokens, 50256) == [tuple(m.split(" ")) for m in merges]
    a, b = WhisperModel(tmp_path, backend="reference"), WhisperModel(ct2_dir, backend="reference")
    text = " Hello, this is a short test. Ça va? 東京 — naïve (( [DAVID] ♪♪ don't"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)
    assert a.tokenizer.non_speech_tokens == b.tokenizer.non_speech_tokens
    for name in ("eot", "sot", "no_speech", "no_timestamps", "sot_prev", "transcribe"):
        assert getattr(a.tokenizer, name) == getattr(b.tokenizer, name)
    sa = list(a.transcribe(SPEECH, beam_size=1)[0])
    sb = list(b.transcribe(SPEECH, beam_size=1)[0])
    assert [(s.tokens, s.text) for s in sa] == [(s.tokens, s.text) for s in sb]


def test_help_has_examples_and_the_command_is_listed():
    r = CliRunner().invoke(main, ["transcribe", "--help"])
    assert r.exit_code == 0 and "Examples" in r.output and "minirt transcribe" in r.output
    assert "transcribe" in CliRunner().invoke(main, ["--help"]).output
