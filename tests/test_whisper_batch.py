"""Batched transcription: the batch entry points of the Vulkan program (bencode, bstepN, breorder: rows at their own
positions, each reading its own window's encoder output, dropped as they finish) against the same windows decoded
one at a time and against the numpy reference's batch, with poisoned activations; generate_batch's tokens against
generate()'s for windows with prompts of different lengths that finish at different steps; transcribe_batch against
transcribe() file by file (temperature fallback included); BatchedInferencePipeline against faster-whisper's on
spoken clips; and the errors for what a batch cannot take."""
import numpy as np
import pytest

from test_whisper_vulkan import N_AUDIO, N_MELS, VOCAB, small_whisper

# A Whisper of 30 s windows (1500 audio positions) but narrow, with an English tokenizer (synthetic.write_folder):
# what the host code (prompts, filters, segments) needs, a few milliseconds a step on lavapipe
CFG = {"d_model": 8, "num_mel_bins": 80, "max_source_positions": 1500, "max_target_positions": 448,
       "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
       "vocab_size": 1765}


def rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def small():
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import VulkanBackend
    w, cfg = small_whisper()
    with VulkanBackend(w, cfg, max_batch=2, max_items=4, options={"poison": True}) as vb:
        yield vb, ReferenceBackend(w, cfg)


def drive_rows(b, feats, prompts, steps, drop_at):
    """Rows fed their prompt then tokens 20 + step; at step k (drop_at: {step: rows kept}) rows are dropped.
    {item: [logits a step]}."""
    b.encode_batch(feats)
    b.start_rows(range(len(prompts)))
    rows, fed, out = list(range(len(prompts))), [0] * len(prompts), {i: [] for i in range(len(prompts))}
    for step in range(steps):
        tokens = [prompts[i][fed[i]] if fed[i] < len(prompts[i]) else 20 + step + i for i in rows]
        logits = b.step_rows(np.array(tokens))
        for r, i in enumerate(rows):
            out[i].append((tokens[r], np.array(logits[r])))
            fed[i] += 1
        if step in drop_at:
            keep = drop_at[step]
            b.reorder_rows(np.array(keep))
            rows = [rows[k] for k in keep]
    return out


def test_batched_rows_equal_single_sequences_and_the_reference(small):
    vb, ref = small
    feats = np.random.default_rng(1).standard_normal((3, N_MELS, 2 * N_AUDIO)).astype(np.float32)
    prompts = [[7, 300, 12], [5, 6], [9, 10, 11, 12, 499]]
    drop = {2: [0, 2], 5: [1]}          # item 1 ends after 3 steps, item 0 after 6, item 2 runs on alone
    got = drive_rows(vb, feats, prompts, 8, drop)
    want = drive_rows(ref, feats, prompts, 8, drop)
    assert [len(got[i]) for i in range(3)] == [6, 3, 8]
    for i in range(3):
        assert [t for t, _ in got[i]] == [t for t, _ in want[i]]
        assert max(rel(a, b) for (_, a), (_, b) in zip(got[i], want[i])) <= 1e-4
        # the same item alone through the one-sequence entry points: the same logits to float32 rounding
        vb.encode(feats[i])
        seq = [t for t, _ in got[i]]
        alone = [vb.start(seq[:1], [0])[0]] + [vb.step(np.array([t]))[0] for t in seq[1:]]
        assert max(rel(a, b) for (_, a), b in zip(got[i], alone)) <= 1e-5
    # rows of one item (the map from rows to items): two rows reading item 1 give the same logits
    vb.encode_batch(feats[:2])
    vb.start_rows([1, 1, 0])
    logits = vb.step_rows(np.array([7, 7, 7]))
    assert rel(logits[0], logits[1]) <= 1e-6 and rel(logits[0], logits[2]) > 1e-3


def test_batch_plans(small):
    vb, _ = small
    assert sorted(k for k in vb.plans if k.startswith("b") and not k.startswith("bencode")) == [
        "breorder", "bstep1", "bstep1_select", "bstep2", "bstep2_select", "bstep4", "bstep4_select"]
    assert sorted(k for k in vb.plans if k.startswith("bencode")) == ["bencode"] + [
        f"bencode{k}" for k in vb.encode_sizes[:-1]] and set(vb.encode_sizes) <= {1, 2, 4}
    step = vb.plans["bstep2"]
    assert step.params == ["pos.0", "pos.1", "item.0", "item.1"]
    assert step.tensors["bself_k.0"].shape == (4, 448, 64) and step.tensors["bcross_k.0"].shape == (4, N_AUDIO, 64)
    assert vb.plans["bencode"].tensors["input_features"].shape == (4, N_MELS, 2 * N_AUDIO)
    assert vb.plans["step1"].tensors["self_k.0"].shape == (2, 448, 64)      # the one-sequence state is its own
    from minirt.vk.recorder import recordings
    vb.encode_batch(np.zeros((2, N_MELS, 2 * N_AUDIO), np.float32))
    vb.start_rows([0, 1])
    before = recordings()
    for t in range(3):
        vb.step_rows(np.array([t, t + 1]))
    vb.reorder_rows(np.array([1]))
    vb.step_rows(np.array([4]))
    assert recordings() == before


def test_a_batch_of_fewer_windows_runs_the_smallest_encoder_that_holds_them():
    """3 windows in a program planned for 8 run the encoder entry point of 4 (bencode4, the ladder of
    decoder_graph.encode_sizes), which shares bencode's activation arena: every row's logits are bit for bit those of
    today's full-size path (bencode on 8 windows, 5 of them padding) and of each window encoded alone, and near the
    numpy reference's; poisoned activations show anything the smaller entry point leaves unwritten."""
    from minirt.whisper.reference import ReferenceBackend
    from minirt.whisper.vulkan import VulkanBackend
    w, cfg = small_whisper(max_target_positions=16)
    feats = np.random.default_rng(5).standard_normal((3, N_MELS, 2 * N_AUDIO)).astype(np.float32)
    tokens = np.array([7, 300, 12])
    with VulkanBackend(w, cfg, max_batch=1, max_items=8, options={"poison": True}) as vb:
        # lavapipe keeps 1, 2 and 4; a big GPU may leave out 1 and 2 (plan_batch: their kernels would differ)
        sizes = vb.encode_sizes
        assert 4 in sizes and sizes[-1] == 8 and set(sizes) <= {1, 2, 4, 8}
        entries = sorted(k for k in vb.plans if k.startswith("bencode"))
        assert entries == sorted(["bencode"] + [f"bencode{k}" for k in sizes[:-1]])
        assert vb.plans["bencode4"].tensors["input_features"].shape == (4, N_MELS, 2 * N_AUDIO)
        assert vb.plans["bencode4"].tensors["bcross_k.0"].shape == (8, N_AUDIO, 64)
        assert len({id(vb.program.executors[e].res.arena) for e in entries}) == 1 and len(vb.program.arenas) == 1

        def rows(items):
            vb.start_rows(items)
            return vb.step_rows(tokens[:len(items)])
        before = dict(vb.program.runs)
        vb.encode_batch(feats)
        ladder = rows([0, 1, 2])
        runs = {k: v - before.get(k, 0) for k, v in vb.program.runs.items() if k.startswith("bencode")}
        assert runs == {"bencode4": 1}
        vb.encode_sizes = [8]                       # today's path: the full-size bencode, padded
        vb.encode_batch(feats)
        assert np.array_equal(rows([0, 1, 2]), ladder) and vb.program.runs["bencode"] == 1
        vb.encode_sizes = sizes
        one = f"bencode{sizes[0]}"
        for i in range(3):                          # each window alone (bencode1), stepped in the same rows
            vb.encode_batch(feats[i:i + 1])
            assert np.array_equal(rows([0, 0, 0])[i], ladder[i]), i
        assert vb.program.runs[one] == 3 + (one == "bencode4")
        # 8 windows still take bencode, and the rows it wrote read as before
        vb.encode_batch(np.concatenate([feats, feats, feats[:2]]))
        assert np.array_equal(rows([3, 4, 5]), ladder) and vb.program.runs["bencode"] == 2
    ref = ReferenceBackend(w, cfg)
    ref.encode_batch(feats)
    ref.start_rows([0, 1, 2])
    assert rel(ladder, ref.step_rows(tokens)) <= 1e-4


def test_batch_errors(small):
    from minirt.whisper.reference import ReferenceBackend
    vb, _ = small
    w, cfg = small_whisper()
    with pytest.raises(RuntimeError, match="before encode_batch"):
        ReferenceBackend(w, cfg).start_rows([0])
    with pytest.raises(ValueError, match=r"features must be \[1 to 4, 80, 48\].*got \[5, 80, 48\]"):
        vb.encode_batch(np.zeros((5, N_MELS, 2 * N_AUDIO), np.float32))
    vb.encode_batch(np.zeros((2, N_MELS, 2 * N_AUDIO), np.float32))
    with pytest.raises(ValueError, match="each an item of the 2 encoded"):
        vb.start_rows([0, 2])
    vb.start_rows([0, 1])
    with pytest.raises(ValueError, match="3 tokens for 2 rows"):
        vb.step_rows(np.array([1, 2, 3]))
    with pytest.raises(ValueError, match="token ids"):
        vb.step_rows(np.array([1, VOCAB]))
    with pytest.raises(ValueError, match=r"rows \[2\] for 2 rows"):
        vb.reorder_rows(np.array([2]))


# -- the host side: tokens, files, the pipeline ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from minirt.whisper import WhisperModel
    from minirt.whisper.synthetic import write_folder
    folder = write_folder(tmp_path_factory.mktemp("batch") / "model", CFG, seed=0)
    return WhisperModel(folder, max_batch_items=4)


def clips(count, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        t = np.arange(int(16000 * (0.5 + 7.3 * i))) / 16000
        out.append((0.3 * np.sin(2 * np.pi * (200 + 90 * i) * t) + 0.05 * rng.standard_normal(len(t)))
                   .astype(np.float32))
    return out


def test_generate_batch_equals_generate(model):
    """Windows with prompts of 3 to 12 tokens (previous text), timestamps or not: each row's tokens, score and
    no-speech probability are what generate() gives the window alone; rows end at different steps."""
    from minirt.whisper.decoding import TranscriptionOptions, generate, generate_batch, get_prompt
    from minirt.whisper.features import LogMel
    tok, backend = model.tokenizer, model.batch_backend(4)
    windows = [(lambda m: m.window(0, min(3000, m.content_frames)))(LogMel(c, 80)) for c in clips(4, seed=3)]
    prompts = [get_prompt(tok, list(range(40, 40 + k)), "en", "transcribe", k % 2 == 1) for k in (0, 3, 9, 0)]
    options = TranscriptionOptions(beam_size=1, temperatures=[0.0], max_new_tokens=30,
                                   suppress_tokens=list(tok.suppressed_tokens([-1])))
    backend.encode_batch(np.stack(windows))
    got = generate_batch(backend, tok, prompts, options, model.suppress_blank_ids)
    lengths = set()
    for w, p, (hyp, nsp) in zip(windows, prompts, got):
        backend.encode(w)
        want, want_nsp = generate(backend, tok, p, options, 0.0, model.suppress_blank_ids)
        assert hyp.tokens == want.tokens and hyp.score == pytest.approx(want.score, rel=1e-4, abs=1e-5)
        assert nsp == pytest.approx(want_nsp, rel=1e-4, abs=1e-6)
        lengths.add(len(hyp.tokens))
    assert len(lengths) > 1             # the rows ended at different steps


def test_transcribe_batch_equals_transcribe(model):
    """Four files of 0.5 to 22 s (windows of several files in a batch of 3, files of several windows), greedy
    without and with temperature fallback (previous text as the prompt): each file's segments are transcribe()'s."""
    audio = clips(4)

    def key(segments):
        return [(s.id, s.seek, s.start, s.end, s.text, s.tokens, s.temperature) for s in segments]
    for options, files in ((dict(beam_size=1, temperature=0.0, max_new_tokens=30,
                                 condition_on_previous_text=False), audio),
                           (dict(beam_size=1, best_of=2, temperature=(0.0, 0.5), max_new_tokens=12), audio[:3])):
        want = [key(model.transcribe(a, **options)[0]) for a in files]
        got = model.transcribe_batch(files, batch_size=3, **options)
        assert [key(s) for s, _ in got] == want
        assert [info.duration for _, info in got] == [len(a) / 16000 for a in files]
    assert any(s[6] > 0 for w in want for s in w)          # the fallback ran


def test_transcribe_batch_errors(model):
    from minirt.errors import InputError
    audio = clips(2)
    with pytest.raises(ValueError, match=r"batch_size must be 1 to 4 \(WhisperModel\(max_batch_items=...\)\), got 5"):
        model.transcribe_batch(audio, batch_size=5, beam_size=1)
    with pytest.raises(TypeError, match="takes a list of files"):
        model.transcribe_batch("a.wav")
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        model.transcribe_batch(audio, beam_sizes=1)
    with pytest.raises(InputError, match=r"audio\[1\]: a pair must be \(samples, sample rate"):
        model.transcribe_batch([audio[0], (audio[1], 0)], beam_size=1)
    # files at different rates are each resampled: a 8 kHz copy transcribes as its 16 kHz original
    soxr = pytest.importorskip("soxr", reason="soxr (the resampler, an optional dependency) is not installed")
    at8k = soxr.resample(audio[1], 16000, 8000)
    got = model.transcribe_batch([(audio[0], 16000), (at8k, 8000)], beam_size=1, temperature=0.0)
    want = model.transcribe(soxr.resample(at8k, 8000, 16000), beam_size=1, temperature=0.0)[0]
    assert [s.tokens for s in got[1][0]] == [s.tokens for s in want]
    from minirt.whisper import BatchedInferencePipeline
    pipe = BatchedInferencePipeline(model)
    with pytest.raises(NotImplementedError, match="chunk_length above 30"):
        pipe.transcribe(audio[0], chunk_length=45, beam_size=1)
    with pytest.raises(ValueError, match=r"clip_timestamps\[0\]"):
        pipe.transcribe(audio[0], clip_timestamps=[{"start": 0, "end": 40}], beam_size=1)
    with pytest.raises(ValueError, match="batch_size must be 1 to 4"):
        pipe.transcribe(audio[0], batch_size=8, beam_size=1)


def test_transcribe_batch_features_in_threads(model, tmp_path):
    """The log-mels run in the feature threads with BLAS held to one thread: a file that cannot be read fails the
    call with its name, the BLAS limit is given back, and the next call transcribes."""
    from minirt.errors import InputError
    from minirt.whisper.reference import _blas_controller
    audio = clips(3)
    missing = str(tmp_path / "missing.wav")
    ctl = _blas_controller()
    before = [m["num_threads"] for m in ctl.select(user_api="blas").info()] if ctl else None
    with pytest.raises((InputError, OSError), match="missing.wav"):
        model.transcribe_batch([audio[0], missing, audio[2]], beam_size=1, max_new_tokens=5)
    if ctl:
        assert [m["num_threads"] for m in ctl.select(user_api="blas").info()] == before
    got = model.transcribe_batch(audio, beam_size=1, temperature=0.0, max_new_tokens=5)
    want = [[s.tokens for s in model.transcribe(a, beam_size=1, temperature=0.0, max_new_tokens=5)[0]] for a in audio]
    assert [[s.tokens for s in segs] for segs, _ in got] == want


def test_the_pipeline_cuts_long_audio_into_30s_chunks(model):
    from minirt.whisper import BatchedInferencePipeline
    audio = np.concatenate(clips(5)[2:])                  # 67 s: chunks of 30, 30 and 7 s
    segments, info = BatchedInferencePipeline(model).transcribe(audio, batch_size=2, beam_size=1,
                                                                 max_new_tokens=20, vad_filter=False)
    segments = list(segments)
    assert info.duration == info.duration_after_vad == pytest.approx(len(audio) / 16000)
    assert sorted({s.seek for s in segments}) == [0, 3000, 6000]
    assert [s.id for s in segments] == list(range(1, len(segments) + 1))


def test_pipeline_equals_faster_whispers():
    """BatchedInferencePipeline on tiny.en (the numpy reference) against faster-whisper's on three spoken
    sentences as clip_timestamps, in batches of 2: the same segments (ids, seek, times, text, tokens, temperature,
    compression ratio), avg_logprob and no_speech_prob to float32 rounding."""
    import real_whisper
    import speech_clips
    faster_whisper = pytest.importorskip("faster_whisper", reason="faster-whisper (the oracle) is not installed")
    if not speech_clips.espeak_available():
        pytest.skip("espeak-ng is not installed (tools/setup.sh installs it)")
    try:
        folder = str(real_whisper.tiny_en_ct2_dir())
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
    from minirt.whisper import BatchedInferencePipeline, WhisperModel
    audio = np.concatenate([speech_clips.clip(speech_clips.sentences(s, 1)) for s in (0, 1, 2)])
    n = len(audio) / 16000
    chunks = [{"start": 0.0, "end": n / 3}, {"start": n / 3, "end": 2 * n / 3}, {"start": 2 * n / 3, "end": n}]
    oracle = faster_whisper.BatchedInferencePipeline(
        faster_whisper.WhisperModel(folder, device="cpu", compute_type="float32", cpu_threads=1))
    fs, finfo = oracle.transcribe(audio, beam_size=1, clip_timestamps=chunks, vad_filter=False, batch_size=2,
                                  without_timestamps=False)
    ms, minfo = BatchedInferencePipeline(WhisperModel(folder, backend="reference")).transcribe(
        audio, beam_size=1, clip_timestamps=chunks, batch_size=2, without_timestamps=False)
    fs, ms = list(fs), list(ms)

    def key(s):
        return (s.id, s.seek, s.start, s.end, s.text, list(s.tokens), s.temperature, round(s.compression_ratio, 4))
    assert [key(s) for s in ms] == [key(s) for s in fs] and len(ms) >= 3
    assert [s.avg_logprob for s in ms] == pytest.approx([s.avg_logprob for s in fs], abs=1e-4)
    assert [s.no_speech_prob for s in ms] == pytest.approx([s.no_speech_prob for s in fs], abs=1e-5)
    assert minfo.duration_after_vad == pytest.approx(finfo.duration_after_vad)
    assert "library" in ms[0].text


def test_cli_batch_size(model, tmp_path):
    """`minirt transcribe A B --batch-size 2` writes what one file after another writes, with --word-timestamps too
    (transcribe_batch aligns each window on the one-window state) (the numpy reference: the
    CLI's default temperature fallback samples 224-token windows, minutes on lavapipe)."""
    import json
    import wave

    from click.testing import CliRunner

    from minirt.cli import main
    paths = []
    for i, a in enumerate(clips(2)):
        paths.append(str(tmp_path / f"c{i}.wav"))
        with wave.open(paths[-1], "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((np.clip(a, -1, 1) * 32767).astype("<i2").tobytes())
    for words in ([], ["--word-timestamps"]):
        outs = []
        for extra in ([], ["--batch-size", "2"]):
            out = tmp_path / f"{'batched' if extra else 'one'}{'-words' if words else ''}"
            out.mkdir()
            r = CliRunner().invoke(main, ["transcribe", *paths, "--model", str(model.path), "--beam-size", "1",
                                          "--format", "json", "-o", str(out), "-q", "--backend", "reference",
                                          *extra, *words], catch_exceptions=False)
            assert r.exit_code == 0, r.output
            outs.append([json.loads((out / f"c{i}.json").read_text()) for i in range(2)])
        assert outs[0] == outs[1] and any(d["segments"] for d in outs[0])
        assert all(("words" in s) == bool(words) for d in outs[0] for s in d["segments"])
