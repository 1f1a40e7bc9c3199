"""minirt.whisper's host logic against faster-whisper's own code with the model scripted out: the seek loop
(generate_segments: windows, prompts with previous text, the prompt reset, the no-speech skip, segment splitting,
seek advance) and the temperature fallback (generate_with_fallback). Both sides get the same scripted decode
results for the same prompts; the prompts they ask with and the segments they yield must be equal."""
import types

import numpy as np
import pytest

import real_whisper

faster_whisper = pytest.importorskip("faster_whisper", reason="faster-whisper (the oracle) is not installed")
from faster_whisper import transcribe as fwt  # noqa: E402
from faster_whisper.feature_extractor import FeatureExtractor  # noqa: E402
from faster_whisper.tokenizer import Tokenizer as FwTokenizer  # noqa: E402

from minirt.whisper import decoding, transcribe  # noqa: E402
from minirt.whisper.decoding import DecodeResult, TranscriptionOptions  # noqa: E402
from minirt.whisper.search import Hypothesis  # noqa: E402
from minirt.whisper.tokenizer import WhisperTokenizer  # noqa: E402

TEXT = list(range(300, 340))


@pytest.fixture(scope="module")
def toks():
    import tokenizers
    try:
        path = real_whisper.tokenizer_json()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en tokenizer unavailable: {e}")
    return WhisperTokenizer.from_file(path, False), FwTokenizer(tokenizers.Tokenizer.from_file(str(path)), False)


def random_tokens(rng, begin, size_frames):
    """Decoder output shaped as Whisper's: timestamped segments ending in a single timestamp, or in a pair, or
    in unfinished text; one timestamp then text; text without timestamps; nothing."""
    kind = rng.integers(6)
    if kind == 0:
        return []
    if kind == 1:
        return [int(t) for t in rng.choice(TEXT, rng.integers(1, 8))]
    last = min(size_frames // 2, 1500)
    out, t = [], int(rng.integers(0, 20))
    for _ in range(rng.integers(1, 5)):
        if t >= last:
            break
        out.append(begin + t)
        out += [int(x) for x in rng.choice(TEXT, rng.integers(1, 6))]
        t = min(last, t + int(rng.integers(0, 400)))
        out.append(begin + t)
        t += int(rng.integers(0, 30))
    if out and kind == 3:                    # one timestamp, then text to the end
        out = out[:1] + [int(x) for x in rng.choice(TEXT, 4)]
    elif out and kind == 4:                  # unfinished: text after the last pair
        out += [int(x) for x in rng.choice(TEXT, 3)]
    elif out and kind == 5:                  # a pair at the end, then nothing
        out.append(out[-1])
    return out


class Script:
    """Decode results keyed by call order; records the prompts."""

    def __init__(self, seed, begin, window_frames):
        self.rng = np.random.default_rng(seed)
        self.begin, self.window_frames = begin, window_frames
        self.prompts, self.results = [], []

    def __call__(self, prompt):
        self.prompts.append(list(prompt))
        if len(self.prompts) > len(self.results):
            r = self.rng
            self.results.append(dict(tokens=random_tokens(r, self.begin, self.window_frames),
                                     avg_logprob=float(r.uniform(-1.6, -0.1)),
                                     temperature=float(r.choice([0.0, 0.0, 0.2, 0.6, 1.0])),
                                     compression_ratio=float(r.uniform(0.5, 3)),
                                     no_speech_prob=float(r.uniform(0, 1))))
        return self.results[len(self.prompts) - 1]


def run_faster_whisper(fw_tok, n_frames, options, script):
    fw = fwt.WhisperModel.__new__(fwt.WhisperModel)
    fw.logger = fwt.get_logger()
    fw.feature_extractor = FeatureExtractor()
    fw.input_stride, fw.frames_per_second, fw.time_precision, fw.max_length = 2, 100, 0.02, 448
    fw.encode = lambda segment: None

    def gwf(encoder_output, prompt, tokenizer, opts):
        d = script(prompt)
        result = types.SimpleNamespace(sequences_ids=[d["tokens"]], no_speech_prob=d["no_speech_prob"])
        return result, d["avg_logprob"], d["temperature"], d["compression_ratio"]
    fw.generate_with_fallback = gwf
    fw_opts = fwt.TranscriptionOptions(
        beam_size=1, best_of=5, patience=1, length_penalty=1, repetition_penalty=1, no_repeat_ngram_size=0,
        log_prob_threshold=options.log_prob_threshold, no_speech_threshold=options.no_speech_threshold,
        compression_ratio_threshold=2.4, condition_on_previous_text=options.condition_on_previous_text,
        prompt_reset_on_temperature=options.prompt_reset_on_temperature, temperatures=[0.0],
        initial_prompt=options.initial_prompt, prefix=None, suppress_blank=True, suppress_tokens=[],
        without_timestamps=options.without_timestamps, max_initial_timestamp=1.0, word_timestamps=False,
        prepend_punctuations="", append_punctuations="", multilingual=False, max_new_tokens=None,
        clip_timestamps="0", hallucination_silence_threshold=None, hotwords=None)
    features = np.zeros((80, n_frames), np.float32)
    return list(fw.generate_segments(features, fw_tok, fw_opts, False))


def run_minirt(tok, n_frames, options, script, monkeypatch):
    def gwf(backend, tokenizer, prompt, opts, suppress_blank_ids, rng=None):
        d = script(prompt)
        return DecodeResult(d["tokens"], 0.0, d["avg_logprob"], d["no_speech_prob"], d["temperature"],
                            d["compression_ratio"])
    monkeypatch.setattr(transcribe, "generate_with_fallback", gwf)
    mel = types.SimpleNamespace(content_frames=n_frames - 1, window=lambda seek, size: None)
    backend = types.SimpleNamespace(encode=lambda f: None)
    return list(transcribe.generate_segments(backend, tok, mel, options, "en"))


@pytest.mark.parametrize("seed", range(40))
def test_seek_loop_equals_faster_whisper(toks, seed, monkeypatch):
    tok, fw_tok = toks
    rng = np.random.default_rng(1000 + seed)
    n_frames = int(rng.integers(2, 12000))
    options = TranscriptionOptions(
        condition_on_previous_text=bool(rng.integers(0, 4)), prompt_reset_on_temperature=0.5,
        no_speech_threshold=[None, 0.6, 0.3][seed % 3], log_prob_threshold=[None, -1.0][seed % 2],
        initial_prompt=[None, "Some words first.", [400, 401]][seed % 3], without_timestamps=seed % 7 == 0)
    a = Script(seed, tok.timestamp_begin, 3000)
    b = Script(seed, tok.timestamp_begin, 3000)
    fs = run_faster_whisper(fw_tok, n_frames, options, a)
    ms = run_minirt(tok, n_frames, options, b, monkeypatch)
    assert b.prompts == a.prompts
    assert ms == [transcribe.Segment(**{k: getattr(s, k) for k in transcribe.Segment.__dataclass_fields__})
                  for s in fs]


@pytest.mark.parametrize("seed", range(30))
def test_temperature_fallback_equals_faster_whisper(toks, seed, monkeypatch):
    """The same per-temperature results through both fallbacks: the same chosen result and reported temperature."""
    tok, fw_tok = toks
    rng = np.random.default_rng(seed)
    temps = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0][: int(rng.integers(1, 7))]
    thresholds = dict(compression_ratio_threshold=[None, 2.4][seed % 2], log_prob_threshold=[None, -1.0][seed % 3 > 0],
                      no_speech_threshold=[None, 0.6][seed % 5 > 0])
    attempts = []
    for _ in temps:
        words = [int(x) for x in rng.choice(TEXT[: int(rng.integers(1, 40))], int(rng.integers(0, 60)))]
        attempts.append((words, float(rng.uniform(-3, -0.01)), float(rng.uniform(0, 1))))

    class FakeCT2:
        calls = 0

        def generate(self, *a, **k):
            words, score, nsp = attempts[FakeCT2.calls]
            FakeCT2.calls += 1
            return [types.SimpleNamespace(sequences_ids=[words], scores=[score], no_speech_prob=nsp)]
    fw = fwt.WhisperModel.__new__(fwt.WhisperModel)
    fw.logger, fw.model, fw.time_precision, fw.max_length = fwt.get_logger(), FakeCT2(), 0.02, 448
    fw_opts = types.SimpleNamespace(max_initial_timestamp=1.0, max_new_tokens=None, temperatures=temps, best_of=5,
                                    beam_size=5, patience=1, length_penalty=1.0, repetition_penalty=1,
                                    no_repeat_ngram_size=0, suppress_blank=True, suppress_tokens=[], **thresholds)
    f_result, f_avg, f_temp, f_ratio = fw.generate_with_fallback(None, [tok.sot], fw_tok, fw_opts)

    calls = iter(attempts)

    def generate(backend, tokenizer, prompt, options, temperature, suppress_blank_ids, rng=None):
        words, score, nsp = next(calls)
        return Hypothesis(words, score), nsp
    monkeypatch.setattr(decoding, "generate", generate)
    opts = TranscriptionOptions(temperatures=temps, **thresholds)
    r = decoding.generate_with_fallback(None, tok, [tok.sot], opts, [])
    assert (r.tokens, r.temperature, r.compression_ratio) == (f_result.sequences_ids[0], f_temp, f_ratio)
    assert r.avg_logprob == pytest.approx(f_avg, rel=1e-12) and r.no_speech_prob == f_result.no_speech_prob
