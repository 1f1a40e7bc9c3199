"""minirt.whisper under callers who share a model between threads or give it what it cannot use: threads on one
WhisperModel get the transcripts they get alone (a generator left unfinished blocks no one); beam_size / best_of past
the backend's rows, malformed model folders, bad options and audio are refused at load or at the call with an error
naming the file, key or option; SRT / VTT cues survive any text; the batched pipeline reads a file a chunk at a
time. The model is a narrow random Whisper of 30 s windows (synthetic.write_folder: d_model 8, one layer a side,
an English tokenizer of 1765 tokens): its transcripts are noise, but deterministic."""
import json
import shutil
import threading
import tracemalloc

import numpy as np
import pytest

from minirt.errors import InputError, MinirtError, ModelError, OptionError

pytest.importorskip("tokenizers", reason="the whisper extra (tokenizers) is not installed")

CFG = {"d_model": 8, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
       "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
       "vocab_size": 1765}
GREEDY = dict(beam_size=1, temperature=0.0, max_new_tokens=8, condition_on_previous_text=False)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from minirt.whisper.synthetic import write_folder
    return write_folder(tmp_path_factory.mktemp("hardening") / "model", CFG, seed=0)


@pytest.fixture(scope="module")
def model(folder):
    from minirt.whisper import WhisperModel
    return WhisperModel(folder, max_batch_items=6)


def clip(seconds, seed):
    rng = np.random.default_rng(seed)
    t = np.arange(int(16000 * seconds)) / 16000
    return (0.3 * np.sin(2 * np.pi * (150 + 40 * seed) * t) + 0.1 * rng.standard_normal(len(t))).astype(np.float32)


def key(segments):
    return [(s.id, s.seek, s.start, s.end, s.text, s.tokens) for s in segments]


# -- threads ----------------------------------------------------------------------------------------------------

def _options(i):
    return dict(GREEDY, beam_size=1 + i % 2)        # greedy and beam search rows side by side


@pytest.mark.parametrize("threads", [2, 8])
def test_threads_sharing_a_model_get_their_own_transcripts(model, threads):
    """Each thread transcribes its own clip (a window: 12 s) with greedy or beam search, all started together:
    every transcript is the one the clip gets alone."""
    clips = [clip(12, seed) for seed in range(threads)]
    want = [key(model.transcribe(c, **_options(i))[0]) for i, c in enumerate(clips)]
    got, errors = [None] * threads, []
    start = threading.Barrier(threads)

    def work(i):
        try:
            start.wait()
            got[i] = key(model.transcribe(clips[i], **_options(i))[0])
        except BaseException as e:      # noqa: BLE001 (reported below)
            errors.append(e)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in ts), errors
    assert got == want
    assert all(want)                                    # no transcript is empty


def test_an_unfinished_generator_blocks_no_one(model):
    """A transcription stopped after its first segment holds no lock: another thread transcribes in full meanwhile,
    and the stopped one, resumed afterwards, still gives its own transcript."""
    long, other = clip(66, 11), clip(33, 12)
    want_long = key(model.transcribe(long, **GREEDY)[0])
    want_other = key(model.transcribe(other, **GREEDY)[0])
    assert len({s[1] for s in want_long}) >= 2           # segments from more than one window
    segments = model.transcribe(long, **GREEDY)[0]
    first = next(segments)
    got = []
    t = threading.Thread(target=lambda: got.append(key(model.transcribe(other, **GREEDY)[0])))
    t.start()
    t.join(timeout=120)
    assert not t.is_alive() and got == [want_other]
    assert key([first] + list(segments)) == want_long
    segments = model.transcribe(long, **GREEDY)[0]
    next(segments)
    del segments                                        # dropped mid-way: the lock stays free
    assert model.lock.acquire(timeout=5)
    model.lock.release()


def test_a_failed_window_releases_the_lock(model, monkeypatch):
    """A window whose decode raises leaves the lock free and the model usable."""
    audio = clip(2, 3)
    want = key(model.transcribe(audio, **GREEDY)[0])

    def broken(features):
        raise RuntimeError("the device failed")
    monkeypatch.setattr(model.backend, "encode", broken)
    with pytest.raises(RuntimeError, match="the device failed"):
        list(model.transcribe(audio, **GREEDY)[0])
    monkeypatch.undo()
    t = threading.Thread(target=lambda: model.lock.acquire(timeout=5) and model.lock.release())
    t.start()
    t.join(timeout=10)
    assert key(model.transcribe(audio, **GREEDY)[0]) == want


# -- beams and options ------------------------------------------------------------------------------------------

def test_beams_past_the_one_sequence_cache_run_on_the_batch_rows(model, folder):
    """beam_size 6 and best_of 6 (5 rows in the one-sequence cache) run on the batch entry points' rows (BeamRows,
    max_batch_items 6): the numpy reference's tokens, for transcribe() and transcribe_batch(); past the batch's rows
    they are refused at the call naming the option."""
    from minirt.whisper import BatchedInferencePipeline, WhisperModel
    ref = WhisperModel(folder, backend="reference")
    audio = [clip(2, 7), clip(3, 8)]
    assert model.backend.max_batch == 5 and model.max_rows() == 6
    with pytest.raises(OptionError, match=r"beam_size must be 1 to 6 \(the backend's search holds 6 rows\), got 7"):
        model.transcribe(audio[0], beam_size=7)
    with pytest.raises(OptionError, match=r"best_of must be 1 to 6 .*got 7"):
        model.transcribe(audio[0], beam_size=1, best_of=7)           # sampling when a window falls back
    with pytest.raises(OptionError, match="beam_size must be 1 to 6"):
        model.transcribe_batch(audio, beam_size=7)
    with pytest.raises(OptionError, match="beam_size must be 1 to 6"):
        BatchedInferencePipeline(model).transcribe(audio[0], beam_size=8)
    list(model.transcribe(audio[0], beam_size=1, best_of=7, temperature=0.0, max_new_tokens=4)[0])  # no sampling

    opts = dict(beam_size=6, temperature=0.0, max_new_tokens=10, condition_on_previous_text=False)
    want = [key(ref.transcribe(a, **opts)[0]) for a in audio]
    assert key(model.transcribe(audio[0], **opts)[0]) == want[0]
    assert [key(s) for s, _ in model.transcribe_batch(audio, **opts)] == want
    # sampling with best_of 6 (the first temperature above 0) runs; the one-sequence entry points still give
    # beam 5 the reference's tokens afterwards
    assert list(model.transcribe(audio[0], beam_size=1, best_of=6, temperature=0.5, max_new_tokens=6)[0])
    opts5 = dict(opts, beam_size=5)
    assert key(model.transcribe(audio[0], **opts5)[0]) == key(ref.transcribe(audio[0], **opts5)[0])


BAD_OPTIONS = [
    ("language_detection_segments", 0), ("patience", float("nan")), ("max_initial_timestamp", float("nan")),
    ("beam_size", 2.5), ("beam_size", "5"), ("best_of", True), ("temperature", "0.2"), ("temperature", float("nan")),
    ("temperature", [0.0, -0.2]), ("temperature", []), ("initial_prompt", 12345), ("initial_prompt", [1, 10 ** 6]),
    ("seed", "abc"), ("seed", -1), ("max_new_tokens", -5), ("max_new_tokens", 500), ("suppress_tokens", [-7]),
    ("suppress_tokens", "abc"), ("length_penalty", float("inf")), ("repetition_penalty", 0),
    ("no_repeat_ngram_size", -1), ("log_prob_threshold", "x"), ("task", "summarise"), ("language", 5),
    ("without_timestamps", "yes"),
]


@pytest.mark.parametrize("name,value", BAD_OPTIONS, ids=[f"{n}={v!r}" for n, v in BAD_OPTIONS])
def test_bad_options_are_refused_at_the_call(model, name, value):
    """transcribe(), transcribe_batch() and BatchedInferencePipeline.transcribe() each raise an OptionError naming the
    option before any audio is read (the audio here is a path that does not exist: reading it would be an
    InputError)."""
    from minirt.whisper import BatchedInferencePipeline
    calls = [lambda **kw: model.transcribe("/nonexistent.wav", **kw),
             lambda **kw: model.transcribe_batch(["/nonexistent.wav"], **kw)]
    if name != "seed":
        calls.append(lambda **kw: BatchedInferencePipeline(model).transcribe("/nonexistent.wav", **kw))
    for call in calls:
        with pytest.raises(OptionError, match=name):
            call(**{name: value})


def test_max_new_tokens_limit_follows_the_prompt(model):
    """The longest prompt a window can have decides: 224 tokens of previous text and <|startoftranscript|> leave
    223; without previous text 447 (one token of prompt), 446 without timestamps."""
    audio = clip(1, 1)
    with pytest.raises(OptionError, match="max_new_tokens must be 1 to 223"):
        model.transcribe(audio, max_new_tokens=224)
    with pytest.raises(OptionError, match="max_new_tokens must be 1 to 446"):
        model.transcribe(audio, max_new_tokens=447, condition_on_previous_text=False, without_timestamps=True)
    list(model.transcribe(audio, **dict(GREEDY, max_new_tokens=447))[0])


# -- audio ------------------------------------------------------------------------------------------------------

def test_audio_arrays_of_the_wrong_form(model):
    from minirt.whisper.audio_input import check_array
    rng = np.random.default_rng(4)
    stereo = rng.uniform(-0.5, 0.5, (2, 48000)).astype(np.float32)
    with pytest.raises(InputError, match=r"shape \[2, 48000\].*\[channels, samples\] give audio.T"):
        model.transcribe(stereo)
    np.testing.assert_array_equal(check_array(stereo.T), stereo.mean(axis=0, dtype=np.float32))
    with pytest.raises(InputError, match=r"audio is a 2-tuple.*transcribe_batch"):
        model.transcribe((stereo[0], 16000))
    with pytest.raises(InputError, match="not an array of samples"):
        model.transcribe([[0.1, 0.2], [0.3]])
    t = np.arange(16000) / 16000
    loud = (1e18 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    with pytest.raises(InputError, match=r"too large for a log-mel in float32 \(they reach 1e\+18\)"):
        model.transcribe(loud)
    # samples that only look loud (int16 values as floats) still transcribe
    list(model.transcribe(loud / 1e18 * 32768, **GREEDY)[0])


def test_transcribe_batch_names_the_bad_item(model):
    audio = [clip(1, 0), clip(1, 1)]
    audio[1][100] = np.nan
    with pytest.raises(InputError, match=r"audio\[1\]: audio array holds NaN .* sample 100"):
        model.transcribe_batch(audio, **GREEDY)
    with pytest.raises(InputError, match=r"audio\[1\]: audio array holds NaN"):
        model.transcribe_batch([(audio[0], 16000), (audio[1], 8000)], **GREEDY)
    assert len(model.transcribe_batch(audio[:1], **GREEDY)) == 1          # still usable


def test_the_pipeline_on_empty_audio_gives_no_segment(model):
    from minirt.whisper import BatchedInferencePipeline
    segments, info = BatchedInferencePipeline(model).transcribe(np.zeros(0, np.float32), beam_size=1)
    assert list(segments) == [] and info.duration == 0 and info.duration_after_vad == 0


def test_the_pipeline_reads_a_file_a_chunk_at_a_time(tmp_path, monkeypatch):
    """Ten minutes of 16-bit WAV (38 MB as float32 samples): BatchedInferencePipeline.transcribe without the VAD
    (which reads every sample), a chunk a batch, with a backend that ends every chunk at once peaks at a few MB (a
    batch's chunks), as transcribe() does, and decodes the file's 20 chunks."""
    from minirt.whisper import BatchedInferencePipeline, features
    from test_whisper_stream import EndsAtOnce, cheap_mel, stub_model, write_wav
    minutes = 10
    rng = np.random.default_rng(5)
    path = write_wav(tmp_path / "long.wav", rng.integers(-3000, 3000, 16000 * 60 * minutes).astype("<i2"), 16000)
    monkeypatch.setattr(features, "_mel", cheap_mel)
    m = stub_model(EndsAtOnce)
    m.max_batch_items = 4
    tracemalloc.start()
    try:
        segments, info = BatchedInferencePipeline(m).transcribe(path, beam_size=2, batch_size=1, vad_filter=False)
        list(segments)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.duration == 60 * minutes and m.backend.windows == 2 * minutes
    whole = 16000 * 60 * minutes * 4
    assert peak < whole / 4, f"peak {peak / 2 ** 20:.1f} MiB for a file of {whole / 2 ** 20:.0f} MiB of samples"


# -- model folders ----------------------------------------------------------------------------------------------

def _hf(weights, config):
    return weights, config


def _drop(name):
    return lambda w, c: ({k: v for k, v in w.items() if k != name}, c)


def _set(name, array):
    return lambda w, c: (dict(w, **{name: array(w[name])}), c)


def _cfg(**changes):
    return lambda w, c: (w, {**c, **changes})


def _without(key):
    return lambda w, c: (w, {k: v for k, v in c.items() if k != key})


FOLDER_CASES = {
    # case: (mutation of (weights, config), file named, words the message must hold)
    "config a list": (lambda w, c: (w, [c]), "config.json", "not an object"),
    "no vocab_size": (_without("vocab_size"), "config.json", "'vocab_size'"),
    "no encoder_layers": (_without("encoder_layers"), "config.json", "'encoder_layers'"),
    "no attention heads": (_without("decoder_attention_heads"), "config.json", "'decoder_attention_heads'"),
    "heads 0": (_cfg(encoder_attention_heads=0), "config.json", "'encoder_attention_heads' is 0"),
    "heads 3": (_cfg(encoder_attention_heads=3), "config.json", "does not divide d_model 8"),
    "heads a string": (_cfg(decoder_attention_heads="2"), "config.json", "'decoder_attention_heads' is '2'"),
    "more layers than weights": (_cfg(encoder_layers=2), "model.safetensors",
                                 "'model.encoder.layers.1.fc1.weight' (config.json's 'encoder_layers' is 2)"),
    "decoder_layers 0": (_cfg(decoder_layers=0), "config.json", "'decoder_layers' is 0"),
    "decoder_layers -1": (_cfg(decoder_layers=-1), "config.json", "'decoder_layers' is -1"),
    "fc2 of another width": (_set("model.decoder.layers.0.fc2.weight", lambda a: a[:, :16]), "model.safetensors",
                             "'model.decoder.layers.0.fc2.weight' is [8, 16], expected [8, 32]"),
    "vocab_size not the embedding's": (_cfg(vocab_size=1766), "config.json", "'vocab_size' is 1766"),
    "NaN weight": (_set("model.encoder.layers.0.fc1.bias", lambda a: np.where(np.arange(len(a)) == 3, np.nan, a)
                        .astype(np.float32)), "model.safetensors", "'model.encoder.layers.0.fc1.bias' holds NaN"),
    "int32 weight": (_set("model.decoder.layer_norm.bias", lambda a: a.astype(np.int32)), "model.safetensors",
                     "'model.decoder.layer_norm.bias' holds int32"),
    "too few decoder positions": (lambda w, c: ({**w, "model.decoder.embed_positions.weight":
                                                 w["model.decoder.embed_positions.weight"][:100]},
                                                {**c, "max_target_positions": 100}),
                                  "model.safetensors", "100 positions"),
    "conv1 kernel 2": (_set("model.encoder.conv1.weight", lambda a: a[:, :, :2]), "model.safetensors",
                       "a kernel of 2"),
    "q_proj of the wrong shape": (_set("model.decoder.layers.0.encoder_attn.q_proj.weight", lambda a: a[:, :4]),
                                  "model.safetensors", "'model.decoder.layers.0.encoder_attn.q_proj.weight' is [8, 4]"),
    "mel bins": (_cfg(num_mel_bins=128), "config.json", "'num_mel_bins' is 128"),
    "audio positions": (_cfg(max_source_positions=750), "config.json", "'max_source_positions' is 750"),
}


def _write(tmp_path, folder, mutate):
    from safetensors.numpy import load_file, save_file
    w, c = mutate(load_file(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text()))
    out = tmp_path / "bad"
    out.mkdir()
    save_file(w, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(c))
    shutil.copy(folder / "tokenizer.json", out / "tokenizer.json")
    return out


@pytest.mark.parametrize("case", sorted(FOLDER_CASES))
def test_malformed_model_folders_are_named_at_load(folder, tmp_path, case):
    from minirt.whisper import WhisperModel
    mutate, file, words = FOLDER_CASES[case]
    bad = _write(tmp_path, folder, mutate)
    with pytest.raises(ModelError) as e:
        WhisperModel(bad, backend="reference")
    assert str(bad / file) in str(e.value) and words in str(e.value), str(e.value)


def test_tokenizer_and_suppress_lists_against_the_model(folder, tmp_path):
    from minirt.whisper import WhisperModel
    from minirt.whisper.synthetic import tokenizer_json
    bad = _write(tmp_path, folder, _hf)
    tok = bad / "tokenizer.json"
    tok.write_text(json.dumps(tokenizer_json(2000)))         # another model's (2000 tokens) with this 1765-token one
    with pytest.raises(ModelError, match="leaves 1266 timestamp tokens in the model's vocabulary of 1765") as e:
        WhisperModel(bad, backend="reference")
    assert str(tok) in str(e.value)
    small = tokenizer_json(1765)
    small["added_tokens"] = [t for t in small["added_tokens"] if t["content"] != "<|endoftext|>"]
    tok.write_text(json.dumps(small))
    with pytest.raises(ModelError, match="no eot token") as e:
        WhisperModel(bad, backend="reference")
    assert str(tok) in str(e.value)
    shutil.copy(folder / "tokenizer.json", tok)
    gen = bad / "generation_config.json"
    for value, words in (("220", "not a list"), ([220, 1765], "[1] is 1765, not a token id"),
                         ([220, "x"], "[1] is 'x'")):
        gen.write_text(json.dumps({"begin_suppress_tokens": value}))
        with pytest.raises(ModelError, match=r"begin_suppress_tokens") as e:
            WhisperModel(bad, backend="reference")
        assert str(gen) in str(e.value) and words in str(e.value)
    gen.write_text(json.dumps({"begin_suppress_tokens": [220, 1764]}))
    assert WhisperModel(bad, backend="reference").suppress_blank_ids == [220, 1764]


def test_ctranslate2_suppress_ids_begin_is_checked(tmp_path):
    """faster-whisper's config.json beside tiny.en's model.bin: a suppress_ids_begin of the wrong type or beyond the
    vocabulary is a ModelError naming the file and the key, at load."""
    import os

    import real_whisper
    from minirt.whisper import WhisperModel
    try:
        src = real_whisper.tiny_en_ct2_dir()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    for f in ("model.bin", "tokenizer.json"):
        os.symlink(src / f, tmp_path / f)
    config = json.loads((src / "config.json").read_text())
    for value, words in ((220, "220, not a list"), ([220, 51864], "[1] is 51864, not a token id of the model's 51864"),
                         ([None], "[0] is None")):
        (tmp_path / "config.json").write_text(json.dumps(dict(config, suppress_ids_begin=value)))
        with pytest.raises(ModelError, match="suppress_ids_begin") as e:
            WhisperModel(tmp_path, backend="reference")
        assert str(tmp_path / "config.json") in str(e.value) and words in str(e.value), str(e.value)


def test_head_dim_the_gpu_cannot_run_is_named_at_load(tmp_path):
    """d_model 12 in 2 heads: head dim 6, which the Vulkan attention kernels do not read (vec4); said at load,
    before any planning, naming the tensor; the reference runs it."""
    from minirt.whisper import WhisperModel
    from minirt.whisper.synthetic import write_folder
    bad = write_folder(tmp_path / "m", dict(CFG, d_model=12), seed=1)
    with pytest.raises(ModelError, match=r"'model.encoder.layers.0.self_attn.q_proj.weight' \[12, 12\] in 2 heads "
                                         r"\(encoder_attention_heads\): head dim 6"):
        WhisperModel(bad)
    WhisperModel(bad, backend="reference")


# -- output and the command line ------------------------------------------------------------------------------

def test_subtitle_cues_survive_any_text():
    from minirt.whisper import Segment
    from minirt.whisper.output import to_srt, to_vtt
    texts = [" Hello\n\nworld", " a --> b & <i>c</i>", "\r\n  \n two\r\nlines  "]
    segs = [Segment(i + 1, 0, i, i + 0.5, t, [], 0, 0, 0, None, 0) for i, t in enumerate(texts)]
    srt = to_srt(segs)
    cues = srt.rstrip("\n").split("\n\n")
    assert len(cues) == 3
    assert cues[0].split("\n")[2:] == ["Hello", "world"]
    assert cues[2].split("\n")[2:] == ["two", "lines"]
    vtt = to_vtt(segs)
    body = vtt.split("\n\n")[1:]
    cues = [c for c in body if c]
    assert len(cues) == 3
    assert cues[1].split("\n")[1] == "a --&gt; b &amp; &lt;i&gt;c&lt;/i&gt;"
    assert vtt.count("-->") == 3                       # the timing lines only


def test_a_memory_limit_is_named_as_the_cause(monkeypatch):
    """A driver that fails to start under a memory limit (ulimit -v) is not reported as a missing driver."""
    import vulkan
    from minirt.errors import DeviceError
    from minirt.vk import device

    error = [vulkan.VkErrorInitializationFailed]

    def fail(instance):
        raise error[0]()
    monkeypatch.setattr(vulkan, "vkEnumeratePhysicalDevices", fail)
    monkeypatch.setattr(device, "_memory_limit", lambda: 300 << 20)
    with pytest.raises(DeviceError, match=r"no physical device \(VkErrorInitializationFailed\)\. The process's memory "
                                          r"is limited to 300 MiB \(ulimit -v or -d\).*raise or remove the limit\. "
                                          r"If that is not it: Install"):
        device.physical_devices()
    error[0] = vulkan.VkErrorOutOfHostMemory
    with pytest.raises(DeviceError, match="limited to 300 MiB") as e:
        device.physical_devices()
    assert "Install" not in str(e.value)
    monkeypatch.setattr(device, "_memory_limit", lambda: None)
    with pytest.raises(DeviceError, match=r"\(VkErrorOutOfHostMemory\)\. The host or the device is out of memory"):
        device.physical_devices()
    error[0] = vulkan.VkErrorInitializationFailed
    with pytest.raises(DeviceError, match="Install a Vulkan loader and driver"):
        device.physical_devices()


# -- fuzz -------------------------------------------------------------------------------------------------------

ABSURD = [0, -1, 1.5, float("nan"), float("inf"), "5", None, [1], {}, True, 10 ** 12, "", (0.0, "x"), b"x"]
CONFIG_ABSURD = [0, -1, 1.5, float("nan"), "5", None, [1], {}, True, 10 ** 12, ""]
OPTION_NAMES = ["beam_size", "best_of", "patience", "length_penalty", "repetition_penalty", "no_repeat_ngram_size",
                "temperature", "compression_ratio_threshold", "log_prob_threshold", "no_speech_threshold",
                "condition_on_previous_text", "prompt_reset_on_temperature", "initial_prompt", "suppress_blank",
                "suppress_tokens", "without_timestamps", "max_initial_timestamp", "max_new_tokens",
                "language_detection_threshold", "language_detection_segments", "seed", "language", "task"]
ALLOWED = (MinirtError, NotImplementedError)


def _fuzz_audio(rng):
    kind = rng.integers(8)
    n = int(rng.integers(0, 20000))
    return [lambda: rng.standard_normal(n).astype(np.float32),
            lambda: rng.standard_normal((n, int(rng.integers(1, 4)))).astype(np.float64),
            lambda: rng.standard_normal((int(rng.integers(1, 4)), n)).astype(np.float32),
            lambda: rng.integers(-100, 100, n).astype(np.int16),
            lambda: np.full(n, rng.choice([np.nan, np.inf, 1e30, -1e38, 0.0]), np.float32),
            lambda: rng.standard_normal((2, 2, max(n, 1))).astype(np.float32),
            lambda: ["a", 1.0][: int(rng.integers(3))],
            lambda: (rng.standard_normal(n).astype(np.float32), int(rng.choice([-2, 0, 8000, 44100])))][kind]()


def test_fuzz_options_audio_and_folders(folder, tmp_path):
    """A seeded list of absurd option values, audio and config.json / weight changes: whatever is accepted
    transcribes, everything else is a MinirtError (or NotImplementedError for what is not supported); no
    AttributeError, KeyError, TypeError, IndexError, ZeroDivisionError or numpy ValueError escapes. On the host:
    the numpy reference decodes, and loading checks folders before anything is planned."""
    from safetensors.numpy import load_file

    from minirt.whisper import BatchedInferencePipeline, WhisperModel
    rng = np.random.default_rng(2024)
    ref = WhisperModel(folder, backend="reference", max_batch_items=4)
    small = dict(max_new_tokens=4, temperature=0.0, beam_size=1)
    for i in range(120):
        opts = dict(small)
        for _ in range(int(rng.integers(1, 3))):
            opts[OPTION_NAMES[rng.integers(len(OPTION_NAMES))]] = ABSURD[rng.integers(len(ABSURD))]
        if opts.get("max_new_tokens") not in (None, 0, 1, -1) and not isinstance(opts.get("max_new_tokens"), str):
            opts["max_new_tokens"] = 4          # an accepted huge value would decode for long
        call = i % 3
        audio = clip(0.5, i) if i % 4 else _fuzz_audio(rng)
        try:
            if call == 0:
                list(ref.transcribe(audio, **opts)[0])
            elif call == 1:
                ref.transcribe_batch([audio, clip(0.3, 1)], **opts)
            else:
                opts.pop("seed", None)          # not an option of the pipeline
                list(BatchedInferencePipeline(ref).transcribe(audio, **opts)[0])
        except ALLOWED:
            pass
        except Exception as e:      # noqa: BLE001
            pytest.fail(f"case {i} call {call} options {opts} audio {type(audio).__name__}: "
                        f"{type(e).__name__}: {e}")
    weights = load_file(str(folder / "model.safetensors"))
    config = json.loads((folder / "config.json").read_text())
    names = sorted(weights)
    for i in range(80):
        w, c = dict(weights), dict(config)
        what = rng.integers(4)
        name = names[rng.integers(len(names))]
        if what == 0:
            c[sorted(c)[rng.integers(len(c))]] = CONFIG_ABSURD[rng.integers(len(CONFIG_ABSURD))]
        elif what == 1:
            del w[name]
        elif what == 2:
            a = w[name]
            w[name] = a.reshape(-1)[: max(1, a.size // 2)].copy() if rng.integers(2) else a.astype(np.float16)
        else:
            w[name.replace(".0.", ".3.")] = w.pop(name)
        case = tmp_path / f"case{i}"
        case.mkdir()
        try:
            out = _write(case, folder, lambda _w, _c: (w, c))
            WhisperModel(out, backend="reference")
        except ALLOWED:
            pass
        except Exception as e:      # noqa: BLE001
            pytest.fail(f"folder case {i} ({what}, {name}): {type(e).__name__}: {e}")
