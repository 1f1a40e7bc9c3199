"""`minirt serve` as a client sees it: real server processes on 127.0.0.1 (a free port) with a small random Whisper
(synthetic.write_folder) and spoken clips, driven by the official `openai` client. The oracle is WhisperModel.transcribe
in this process with the server's options: every response format, translation, a sampled temperature, a prompt and a
file of three windows decoded beside short ones give transcribe()'s segments; 8 and 32 concurrent clients each get
their single-request answer; bad uploads get OpenAI's 4xx errors and the server goes on; a client that goes away has
its work dropped; the API key is enforced; a full queue answers 429; SIGTERM under load finishes the requests in
progress and exits 0, the uploads' temporary files gone."""
import http.client
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

for _name in ("starlette", "uvicorn", "multipart", "openai"):
    pytest.importorskip(_name, reason="the 'serve' extra (and openai, for the tests) is not installed")
import openai  # noqa: E402

import speech_clips  # noqa: E402
from test_whisper_batch import CFG  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
KEY = "test-key-5b3f"
# the servers' --transcribe-option values (beam_size=1 is the server's default): no temperature fallback, and at most
# 40 tokens a window (the random model's windows would run to 224), for time
OPTIONS = dict(beam_size=1, temperature=0, max_new_tokens=40)
SERVER_OPTIONS = ["--transcribe-option", "temperature=0", "--transcribe-option", "max_new_tokens=40"]


def _spoken(seed: int) -> np.ndarray:
    if speech_clips.espeak_available():
        return speech_clips.clip(speech_clips.sentences(seed, 1))
    rng = np.random.default_rng(seed)       # no espeak-ng: tones and noise (the random model transcribes noise)
    t = np.arange(int(16000 * (2.5 + seed))) / 16000
    return (0.3 * np.sin(2 * np.pi * (200 + 90 * seed) * t) + 0.05 * rng.standard_normal(len(t))).astype(np.float32)


class Server:
    """A `minirt serve` process on a free port of 127.0.0.1; its stderr in a file, its TMPDIR a folder of ours."""

    def __init__(self, folder, tmp: Path, *args, key=None):
        self.tmp, self.log = tmp, tmp / "server.log"
        (tmp / "t").mkdir()
        env = dict(os.environ, TMPDIR=str(tmp / "t"))
        env.pop("MINIRT_API_KEY", None)
        if key:
            env["MINIRT_API_KEY"] = key
        self.key = key
        self.proc = subprocess.Popen([sys.executable, "-m", "minirt", "serve", "--model", str(folder), "--port", "0",
                                      *args], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                     stderr=open(self.log, "w"))
        self.port = None

    def ready(self, timeout=180):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                pytest.fail(f"minirt serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            if self.port is None:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.log.read_text())
                self.port = int(m.group(1)) if m else None
            if self.port is not None:
                try:
                    if self.get("/health")[0] == 200:
                        return self
                except OSError:
                    pass
            time.sleep(0.2)
        pytest.fail(f"minirt serve did not start in {timeout} s:\n{self.log.read_text()}")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def client(self, key="default", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=(self.key or "unused") if key == "default" else key,
                             max_retries=0, timeout=300, **kw)

    def get(self, path, key="default"):
        key = self.key if key == "default" else key
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {key}"} if key else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def post(self, path, fields: dict, files: dict, timeout=300, key="default"):
        """(status, body) of a multipart POST made by hand (what the openai client will not send)."""
        key = self.key if key == "default" else key
        body, ctype = _multipart(fields, files)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body, {"Content-Type": ctype, **({"Authorization": f"Bearer {key}"}
                                                                         if key else {})})
            r = conn.getresponse()
            return r.status, r.read().decode()
        finally:
            conn.close()

    def metric(self, name) -> float:
        text = self.get("/metrics")[1]
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _multipart(fields: dict, files: dict):
    boundary = "minirt-test-boundary-7d41"
    out = io.BytesIO()
    for k, v in fields.items():
        for item in (v if isinstance(v, list) else [v]):
            out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{item}\r\n'.encode())
    for k, (name, data) in files.items():
        out.write(f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"; filename="{name}"\r\n'
                  f'Content-Type: application/octet-stream\r\n\r\n'.encode() + data + b"\r\n")
    out.write(f"--{boundary}--\r\n".encode())
    return out.getvalue(), f"multipart/form-data; boundary={boundary}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from minirt.whisper.synthetic import write_folder
    return write_folder(tmp_path_factory.mktemp("serve") / "tiny-random", CFG, seed=0)


@pytest.fixture(scope="module")
def servers(folder, tmp_path_factory):
    """(the shared server: batches of 8, 2 MiB uploads, an API key; the small one: no batches, a queue of 2), both
    started at once."""
    shared = Server(folder, tmp_path_factory.mktemp("shared"), "--max-batch", "8", "--max-upload-mb", "2",
                    *SERVER_OPTIONS, key=KEY)
    small = Server(folder, tmp_path_factory.mktemp("small"), "--max-batch", "1", "--max-queue", "2",
                   *SERVER_OPTIONS)
    try:
        yield shared.ready(), small.ready()
    finally:
        shared.stop()
        small.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """[(wav bytes, wav path)] of four short spoken clips."""
    d = tmp_path_factory.mktemp("clips")
    out = []
    for i in range(4):
        data = speech_clips.wav_bytes(_spoken(i))
        (d / f"c{i}.wav").write_bytes(data)
        out.append((data, str(d / f"c{i}.wav")))
    return out


@pytest.fixture(scope="module")
def long_clip(tmp_path_factory):
    """A 70 s file (three windows)."""
    audio = np.concatenate([_spoken(i % 4) for i in range(40)])[:70 * 16000]
    path = tmp_path_factory.mktemp("long") / "long.wav"
    path.write_bytes(speech_clips.wav_bytes(audio))
    return path.read_bytes(), str(path)


@pytest.fixture(scope="module")
def model(folder):
    from minirt.whisper import WhisperModel
    return WhisperModel(folder, max_batch_items=8)


@pytest.fixture(scope="module")
def oracle(model):
    """transcribe(path, **options) with the servers' options: (segments, info), memoized."""
    memo = {}

    def run(path, **options):
        key = (path, tuple(sorted(options.items())))
        if key not in memo:
            segments, info = model.transcribe(path, **{**OPTIONS, **options})
            memo[key] = (list(segments), info)
        return memo[key]
    return run


def _same_segments(got, want):
    """verbose_json segments (the openai client's objects) against transcribe()'s Segments."""
    assert [(s.id, s.seek, s.start, s.end, s.text, s.tokens, s.temperature) for s in got] == \
           [(s.id, s.seek, s.start, s.end, s.text, s.tokens, s.temperature) for s in want]
    assert [s.avg_logprob for s in got] == pytest.approx([s.avg_logprob for s in want], rel=1e-4, abs=1e-5)
    assert [s.no_speech_prob for s in got] == pytest.approx([s.no_speech_prob for s in want], rel=1e-4, abs=1e-6)


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")      # the openai client's translations
def test_every_format_and_option_equals_transcribe(server, clips, oracle):
    """The five response formats of one clip, a translation, a sampled temperature and a prompt, sent at once: each
    what transcribe() gives with the same options."""
    from minirt.whisper.output import full_text, to_srt, to_vtt
    c = server.client()
    (a0, p0), (a1, p1), (a2, p2), (a3, p3) = clips
    calls = {fmt: (lambda fmt=fmt: c.audio.transcriptions.create(file=("c0.wav", a0), model="whisper-1",
                                                                 response_format=fmt))
             for fmt in ("json", "text", "srt", "vtt", "verbose_json")}
    calls["translate"] = lambda: c.audio.translations.create(file=("c1.wav", a1), model="whisper-1",
                                                            response_format="verbose_json")
    calls["sampled"] = lambda: c.audio.transcriptions.create(file=("c2.wav", a2), model="whisper-1",
                                                            response_format="verbose_json", temperature=0.5)
    calls["prompt"] = lambda: c.audio.transcriptions.create(file=("c3.wav", a3), model="whisper-1",
                                                           response_format="verbose_json", language="en",
                                                           prompt="The weather today.")
    with ThreadPoolExecutor(len(calls)) as ex:
        futures = {k: ex.submit(f) for k, f in calls.items()}
        got = {k: f.result() for k, f in futures.items()}
    segments, info = oracle(p0)
    assert segments and full_text(segments)
    assert got["json"].text == full_text(segments)
    assert got["text"] == full_text(segments) + "\n"
    assert got["srt"] == to_srt(segments) and got["vtt"] == to_vtt(segments)
    v = got["verbose_json"]
    assert (v.task, v.language, v.text) == ("transcribe", "en", full_text(segments))
    assert v.duration == pytest.approx(info.duration) and v.words is None
    _same_segments(v.segments, segments)
    for name, path, options in (("translate", p1, dict(task="translate")), ("sampled", p2, dict(temperature=0.5)),
                                ("prompt", p3, dict(language="en", initial_prompt="The weather today."))):
        segments, _ = oracle(path, **options)
        assert got[name].text == full_text(segments), name
        _same_segments(got[name].segments, segments)
    assert got["translate"].task == "translate"
    assert {s.temperature for s in got["sampled"].segments} == {0.5}
    status, body = server.get("/v1/models")
    assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == ["tiny-random"]
    assert c.models.retrieve("tiny-random").owned_by == "minirt"


@pytest.fixture(scope="module")
def singles(server, clips, oracle):
    """Each clip's answer as a request alone (verbose_json), checked against transcribe()."""
    c = server.client()
    out = []
    for i, (data, path) in enumerate(clips):
        r = c.audio.transcriptions.create(file=(f"c{i}.wav", data), model="whisper-1", response_format="verbose_json")
        _same_segments(r.segments, oracle(path)[0])
        out.append(r)
    return out


@pytest.mark.parametrize("clients", [8, 32])
def test_concurrent_clients_get_their_single_answers(server, clips, singles, clients):
    c = server.client()
    before = server.metric("minirt_serve_batch_windows_count"), server.metric("minirt_serve_batch_windows_sum")

    def one(i):
        data = clips[i % len(clips)][0]
        return c.audio.transcriptions.create(file=(f"c{i}.wav", data), model="whisper-1",
                                             response_format="verbose_json")
    with ThreadPoolExecutor(clients) as ex:
        got = list(ex.map(one, range(clients)))
    assert len(got) == clients
    for i, r in enumerate(got):
        want = singles[i % len(clips)]
        assert r.text == want.text and [s.tokens for s in r.segments] == [s.tokens for s in want.segments], i
    batches = server.metric("minirt_serve_batch_windows_count") - before[0]
    windows = server.metric("minirt_serve_batch_windows_sum") - before[1]
    assert windows >= clients and batches < windows         # windows went together


def test_a_long_file_does_not_hold_up_short_ones(model, clips, long_clip, oracle):
    """The scheduler in this process: a 70 s file (three windows or more) alone for its first window, three short
    clips arriving meanwhile: their windows join the long file's next one in a batch and they finish before it; every
    result is transcribe()'s. The batch program holds 8 windows; the batch of 4 runs the encoder of 4 (bencode4)."""
    from minirt.serve.scheduler import Job, Scheduler, transcribe_options
    from minirt.whisper.audio_input import load_audio
    from minirt.whisper.features import LogMel
    want = {name: oracle(path)[0] for name, path in [("long", long_clip[1])] + [(f"s{i}", clips[i][1])
                                                                                for i in range(3)]}
    assert len({s.seek for s in want["long"]}) >= 3
    first_turn, go, batches = threading.Event(), threading.Event(), []

    class Pause:                # the scheduler reports each decode here: the first one waits for the short clips
        def batch(self, n):
            batches.append(n)
            if len(batches) == 1:
                first_turn.set()
                go.wait(60)

        def dropped(self):
            pass
    scheduler = Scheduler(model, 8, Pause())
    finished, results = [], {}

    def submit(name, path):
        samples = load_audio(path)

        def done(result, error, name=name):
            finished.append(name)
            results[name] = error or result[0]
        scheduler.submit(Job(samples, LogMel(samples, model.n_mels), transcribe_options(**OPTIONS), done))
    try:
        submit("long", long_clip[1])
        assert first_turn.wait(120)
        for i in range(3):
            submit(f"s{i}", clips[i][1])
        go.set()
        end = time.monotonic() + 120
        while len(finished) < 4 and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        go.set()
        scheduler.stop(120)
    assert finished[-1] == "long" and sorted(finished) == ["long", "s0", "s1", "s2"]
    assert batches[:2] == [1, 4]            # the long file's first window alone, then all four together
    runs = scheduler.backend.program.runs
    assert runs["bencode4"] >= 1 and runs["bencode4"] + runs["bencode1"] + runs["bencode2"] == \
        sum(n for k, n in runs.items() if k.startswith("bencode"))     # never the full 8
    for name, segments in want.items():
        got = results[name]
        assert [(s.id, s.seek, s.start, s.end, s.text, s.tokens) for s in got] == \
               [(s.id, s.seek, s.start, s.end, s.text, s.tokens) for s in segments], name


def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, clips, singles):
    c = server.client()
    for name, data in (("notes.txt", b"this is not audio at all " * 40), ("empty.wav", b""),
                       ("cut.wav", clips[0][0][:30])):
        with pytest.raises(openai.BadRequestError) as e:
            c.audio.transcriptions.create(file=(name, data), model="whisper-1")
        err = e.value.body
        assert err["param"] == "file" and err["type"] == "invalid_request_error", err
        assert name in err["message"] and "Could not read the audio" in err["message"]
    with pytest.raises(openai.BadRequestError, match="response_format must be one of"):
        c.audio.transcriptions.create(file=("c.wav", clips[0][0]), model="whisper-1", response_format="xml")
    with pytest.raises(openai.BadRequestError, match="temperature must be a number from 0 to 1"):
        c.audio.transcriptions.create(file=("c.wav", clips[0][0]), model="whisper-1", temperature=3)
    with pytest.raises(openai.BadRequestError, match="needs response_format verbose_json"):
        c.audio.transcriptions.create(file=("c.wav", clips[0][0]), model="whisper-1",
                                      timestamp_granularities=["segment"])
    status, body = server.post("/v1/audio/transcriptions", {"model": "whisper-1"}, {})
    assert status == 400 and json.loads(body)["error"]["param"] == "file"
    with pytest.raises(openai.APIStatusError) as e:     # over --max-upload-mb 2 (and the 1 MiB for the form)
        c.audio.transcriptions.create(file=("big.wav", b"\0" * (3 << 20) + b"\1"), model="whisper-1")
    assert e.value.status_code == 413 and e.value.body["code"] == "file_too_large"
    status, body = server.get("/v1/nothing")
    assert status == 404 and "error" in json.loads(body)
    r = c.audio.transcriptions.create(file=("c0.wav", clips[0][0]), model="whisper-1", response_format="verbose_json")
    assert [s.tokens for s in r.segments] == [s.tokens for s in singles[0].segments]
    folders = list((server.tmp / "t").iterdir())       # the uploads' files are gone, their folder is the server's
    assert [f.name[:13] for f in folders] == ["minirt-serve-"] and not list(folders[0].iterdir())


def test_word_timestamps(server, clips, model, oracle):
    """timestamp_granularities word: verbose_json's words are transcribe(word_timestamps=True)'s."""
    c = server.client()
    data, path = clips[1]
    r = c.audio.transcriptions.create(file=("c1.wav", data), model="whisper-1", response_format="verbose_json",
                                      timestamp_granularities=["word", "segment"])
    segments, _ = model.transcribe(path, word_timestamps=True, **OPTIONS)
    words = [w for s in segments for w in s.words]
    assert words and [(w.word, w.start, w.end) for w in r.words] == [(w.word.strip(), w.start, w.end) for w in words]


def test_a_client_that_goes_away_has_its_work_dropped(server, long_clip):
    """A client that hangs up once its file of three windows is with the scheduler: the job is dropped before its
    windows are all decoded."""
    gone = 'minirt_serve_requests_total{route="/v1/audio/transcriptions",status="499"}'
    before = server.metric(gone), server.metric("minirt_serve_dropped_total")
    body, ctype = _multipart({"model": "whisper-1"}, {"file": ("long.wav", long_clip[0])})
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/audio/transcriptions", body, {"Content-Type": ctype,
                                                            "Authorization": f"Bearer {server.key}"})
    end = time.monotonic() + 60
    while server.metric("minirt_serve_queue_depth") < 1:      # the job is with the scheduler: hang up
        assert time.monotonic() < end
        time.sleep(0.005)
    conn.close()
    while (server.metric(gone), server.metric("minirt_serve_dropped_total")) != (before[0] + 1, before[1] + 1):
        assert time.monotonic() < end, server.get("/metrics")[1]
        time.sleep(0.1)
    assert server.metric("minirt_serve_queue_depth") == 0


def test_the_api_key_is_enforced(server, clips):
    with pytest.raises(openai.AuthenticationError) as e:
        server.client(key="wrong").audio.transcriptions.create(file=("c.wav", clips[0][0]), model="whisper-1")
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    status, body = server.post("/v1/audio/transcriptions", {"model": "whisper-1"}, {"file": ("c.wav", clips[0][0])},
                               key=None)
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    for key in (None, "wrong", KEY + "x"):
        assert server.get("/health", key=key)[0] == 401
        assert server.get("/metrics", key=key)[0] == 401
    assert server.get("/health")[0] == 200


def test_a_full_queue_answers_429_and_sigterm_finishes_the_work_in_progress(servers, long_clip, oracle):
    """The small server (a queue of 2, windows one by one): two long files in progress, a third request gets 429 with
    Retry-After; SIGTERM then closes the port, both files are answered in full, and the process exits 0 with its
    temporary folder removed."""
    small = servers[1]
    c = small.client()

    def one(_):
        return c.audio.transcriptions.create(file=("long.wav", long_clip[0]), model="whisper-1",
                                             response_format="verbose_json")
    ex = ThreadPoolExecutor(2)
    running = [ex.submit(one, i) for i in range(2)]
    end = time.monotonic() + 60
    while small.metric("minirt_serve_requests_in_progress") < 2:
        assert time.monotonic() < end and not any(f.done() for f in running)
        time.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as e:
        one(2)
    assert int(e.value.response.headers["retry-after"]) >= 1
    small.proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + 30
    while True:             # new connections are refused while the two are finished
        try:
            small.get("/health")
        except OSError:
            break
        assert time.monotonic() < end, "the server still accepts connections after SIGTERM"
        time.sleep(0.05)
    segments, _ = oracle(long_clip[1])
    for f in running:
        _same_segments(f.result().segments, segments)
    ex.shutdown()
    assert small.proc.wait(60) == 0
    assert not list((small.tmp / "t").iterdir())


def test_command_line_errors(tmp_path):
    """Options that cannot work are usage errors (exit 2) naming the option, before a model is loaded; a model
    folder that is not one exits 3."""
    from click.testing import CliRunner

    from minirt.cli import main
    r = CliRunner().invoke(main, ["serve", "--help"])
    assert r.exit_code == 0 and "Examples" in r.output and "minirt serve --model" in r.output
    for args, message in ((["--transcribe-option", "task=translate"], "each request sets it"),
                          (["--transcribe-option", "beam_size=x"], "beam_size is a number"),
                          (["--transcribe-option", "beam_size"], "is not KEY=VALUE"),
                          (["--max-batch", "33"], "--max-batch"),
                          (["--max-batch", "8", "--transcribe-option", "beam_size=9"], "holds 8 beams")):
        r = CliRunner().invoke(main, ["serve", "--model", str(tmp_path), *args])
        assert r.exit_code == 2 and message in r.output, r.output
    r = CliRunner().invoke(main, ["serve", "--model", str(tmp_path / "missing")])
    assert r.exit_code == 3 and "missing" in r.output


def test_bench_serve_help():
    r = subprocess.run([sys.executable, str(REPO / "tools" / "bench_serve.py"), "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "--concurrency" in r.stdout and "p50 / p99" in r.stdout
