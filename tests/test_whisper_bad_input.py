"""minirt.whisper and `minirt transcribe` on input they cannot use: each error names the file or folder at fault,
the command line exits 3 with one line on stderr and no traceback; empty audio gives an empty transcript; a file
that changes while it is read is an error, not a crash; --progress writes a line per window.

The model here is a small random-weights Whisper in a Hugging Face folder (tests/test_whisper_vulkan.py's
small_whisper) with a tokenizer.json of its vocabulary; no test decodes with it (the stub backend of
tests/test_whisper_stream.py stands in where a transcript is made)."""
import json
import os
import shutil
import struct
import wave

import numpy as np
import pytest
from click.testing import CliRunner

import real_whisper
from minirt.cli import main
from minirt.errors import InputError, ModelError
from minirt.whisper.audio_input import load_audio
from test_whisper_stream import EndsAtOnce, stub_model, write_wav
from test_whisper_vulkan import small_whisper

pytest.importorskip("tokenizers", reason="the whisper extra (tokenizers) is not installed")


def hf_folder(path, weights=None, config=None, tokenizer=True):
    """A Hugging Face Whisper folder of small_whisper's weights with a vocabulary of 1765 (or `weights`), its config
    and a tokenizer of the model's vocabulary: tiny.en's for 51864 tokens, else synthetic.tokenizer_json's."""
    from safetensors.numpy import save_file

    from minirt.whisper.synthetic import tokenizer_json
    w, cfg = small_whisper(vocab_size=1765)
    config = dict(cfg, model_type="whisper") if config is None else config
    path.mkdir()
    save_file(w if weights is None else weights, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    if tokenizer and config.get("vocab_size") == 51864:
        try:
            shutil.copy(real_whisper.tokenizer_json(), path / "tokenizer.json")
        except real_whisper.Unavailable as e:
            pytest.skip(f"Whisper tiny.en tokenizer unavailable: {e}")
    elif tokenizer:     # (a vocabulary too small for one: a folder refused before its tokenizer is read)
        vocab = config.get("vocab_size", 0)
        (path / "tokenizer.json").write_text(json.dumps(tokenizer_json(vocab if 1765 <= vocab < 51864 else 1765)))
    return str(path)


def transcribe(*args):
    return CliRunner().invoke(main, ["transcribe", "--backend", "reference", *args])


def assert_fails(r, code, *names):
    """Exit `code`, one 'error: ...' line on stderr naming each of `names`, no traceback."""
    assert r.exit_code == code, (r.exit_code, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error")]
    assert len(lines) == 1, r.stderr
    for n in names:
        assert n in lines[0], (n, lines[0])


# -- models ----------------------------------------------------------------------------------------------------

def test_a_model_folder_without_a_tokenizer(tmp_path):
    from minirt.whisper import WhisperModel
    folder = hf_folder(tmp_path / "no-tok", tokenizer=False)
    with pytest.raises(ModelError, match="no tokenizer.json") as e:
        WhisperModel(folder)
    assert folder in str(e.value)
    wav = write_wav(tmp_path / "a.wav", np.zeros(1600, "<i2"), 16000)
    assert_fails(transcribe(wav, "--model", folder), 3, folder, "no tokenizer.json")


def test_a_checkpoint_without_a_decoder(tmp_path):
    """An encoder-only safetensors (the decoder's weights missing, with or without its config keys)."""
    from minirt.whisper import WhisperModel
    w, cfg = small_whisper()
    enc = {k: v for k, v in w.items() if k.startswith("model.encoder.")}
    for i, config in enumerate([dict(cfg, model_type="whisper"),
                                {k: v for k, v in cfg.items() if not k.startswith("decoder")}]):
        folder = hf_folder(tmp_path / f"enc{i}", weights=enc, config=config)
        with pytest.raises(ModelError, match="no decoder") as e:
            WhisperModel(folder)
        assert folder in str(e.value)
    assert_fails(transcribe(write_wav(tmp_path / "a.wav", np.zeros(1600, "<i2"), 16000), "--model", folder), 3,
                 folder, "no decoder")


def test_a_folder_that_is_no_model(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "weights.onnx").write_bytes(b"")
    wav = write_wav(tmp_path / "a.wav", np.zeros(1600, "<i2"), 16000)
    assert_fails(transcribe(wav, "--model", str(empty)), 3, str(empty), "no model.safetensors", "weights.onnx")
    assert_fails(transcribe(wav, "--model", str(tmp_path / "nothing")), 3, str(tmp_path / "nothing"))


# -- audio files -----------------------------------------------------------------------------------------------

def bad_files(tmp_path):
    """{file: what its error says}."""
    real = open(real_whisper.SPEECH, "rb").read()
    files = {"text.wav": (b"this is not audio\n" * 20, "not an audio file|soundfile"),
             "header-only.wav": (real[:20], "without a fmt chunk"),
             "no-data.wav": (real[:36], "without a data chunk"),
             "riff-cut.wav": (real[:10], "not an audio file|soundfile"),
             "noise.mp3": (np.random.default_rng(0).bytes(4000), "not an audio file|soundfile"),
             "alaw.wav": (real[:20] + struct.pack("<HHIIHH", 6, 1, 8000, 8000, 1, 8) + b"data" + real[40:44]
                          + real[44:1044], "format tag 0x6")}
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    return {str(tmp_path / n): m for n, (_, m) in files.items()}


def test_unreadable_audio_files_are_named(tmp_path):
    for path, message in bad_files(tmp_path).items():
        with pytest.raises(InputError, match=message) as e:
            load_audio(path)
        assert path in str(e.value)
    with pytest.raises(InputError, match="is a folder") as e:
        load_audio(str(tmp_path))
    assert str(tmp_path) in str(e.value)


def test_other_formats_without_soundfile(tmp_path, monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_soundfile(name, *a, **k):
        if name == "soundfile":
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_soundfile)
    p = tmp_path / "noise.mp3"
    p.write_bytes(np.random.default_rng(0).bytes(4000))
    with pytest.raises(InputError, match="need the 'soundfile' package") as e:
        load_audio(str(p))
    assert str(p) in str(e.value)


def test_the_command_line_names_the_audio_file(tmp_path):
    model = hf_folder(tmp_path / "model")
    files = bad_files(tmp_path)
    r = transcribe(*files, "--model", model)            # the first bad file stops the run
    assert_fails(r, 3, next(iter(files)))
    for path in files:
        assert_fails(transcribe(path, "--model", model), 3, path)
    assert_fails(transcribe(str(tmp_path), "--model", model), 3, f"{tmp_path}: is a folder")


def test_nan_and_infinite_samples(tmp_path):
    """Refused, naming the first bad sample. In faster-whisper one NaN sample makes the whole log-mel NaN (its
    maximum is NaN) and tiny.en's transcript of 3 s a row of '!' (token 0)."""
    for bad in (np.nan, np.inf, -np.inf):
        x = np.zeros(48000, np.float32)
        x[32000] = bad
        with pytest.raises(InputError, match="NaN or infinite samples .the first at sample 32000, 2.000 s"):
            load_audio(x)
        p = tmp_path / "nan.wav"
        with wave.open(str(p), "wb") as w:
            w.setnchannels(1), w.setsampwidth(4), w.setframerate(16000)
            w.writeframes(x.astype("<f4").tobytes())
        data = bytearray(p.read_bytes())
        data[20:22] = struct.pack("<H", 3)       # the wave module writes PCM; mark it IEEE float
        p.write_bytes(bytes(data))
        with pytest.raises(InputError, match="NaN or infinite samples .the first at frame 32000") as e:
            load_audio(str(p))
        assert str(p) in str(e.value)


# -- empty, changing and long audio ---------------------------------------------------------------------------

def test_empty_audio_gives_no_segments(tmp_path):
    """0 samples, as an array and as WAV files at 16 kHz and at 44.1 kHz (resampled): no segments, duration 0
    (faster-whisper's answer for an empty array, tests/test_whisper_decode.py::test_silence_and_empty_audio)."""
    m = stub_model(EndsAtOnce)
    inputs = [np.zeros(0, np.float32), write_wav(tmp_path / "16k.wav", np.zeros(0, "<i2"), 16000),
              write_wav(tmp_path / "44k.wav", np.zeros((0, 2), "<i2"), 44100)]
    for audio in inputs:
        segments, info = m.transcribe(audio)
        assert list(segments) == [] and info.duration == 0, audio
    assert m.backend.windows == 0


def test_a_file_cut_short_while_it_is_read(tmp_path):
    """The file shrinks after transcribe() measured it: an InputError naming it when the windows are read."""
    p = write_wav(tmp_path / "a.wav", np.ones(16000 * 95, "<i2"), 16000)
    segments, _ = stub_model(EndsAtOnce).transcribe(p, beam_size=1)
    with open(p, "r+b") as f:
        f.truncate(16000 * 20)
    with pytest.raises(InputError, match="shorter while it was read") as e:
        list(segments)
    assert p in str(e.value)


def test_progress_lines(tmp_path, monkeypatch):
    """--progress: a line per window on stderr, which is not a terminal here; nothing without it."""
    from minirt.whisper import model as model_module
    p = write_wav(tmp_path / "talk.wav", np.zeros(16000 * 65, "<i2"), 16000)
    monkeypatch.setattr(model_module, "WhisperModel", lambda *a, **k: stub_model(EndsAtOnce))
    r = transcribe(p, "--model", str(tmp_path), "--progress")
    assert r.exit_code == 0, r.output
    assert r.stderr.splitlines() == ["talk.wav: 30 of 65 s (46%)", "talk.wav: 60 of 65 s (92%)",
                                     "talk.wav: 65 of 65 s (100%)"]
    r = transcribe(p, "--model", str(tmp_path))
    assert r.exit_code == 0 and r.stderr == ""
    r = transcribe(p, "--model", str(tmp_path), "--progress", "-q")
    assert r.exit_code == 0 and r.stderr == ""
