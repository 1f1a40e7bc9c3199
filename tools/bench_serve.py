#!/usr/bin/env python3
"""Load benchmark of `minirt serve`: requests per second, audio seconds per second and p50 / p99 latency at several
concurrencies, beside transcribing the same files one by one with WhisperModel.transcribe in one process.

  python tools/bench_serve.py --model whisper-large-v3-turbo --audio clips/*.wav
  python tools/bench_serve.py --model whisper-tiny.en --concurrency 1,8,32 --requests 64 --json serve.json
  python tools/bench_serve.py --size tiny --seconds 10        # a seeded random Whisper (noise in, noise out)

The server runs as a subprocess (`minirt serve --port 0`, --max-batch, --precision, --device and --transcribe-option
passed on) on 127.0.0.1. Each concurrency level sends --requests requests (the files in turn) from that many client
threads, each waiting for its answer before sending the next; a request's latency is from sending it to its answer
(upload, queue, decoding). Before the timed levels every file is sent once alone, untimed (warm-up and the single
answers). Then the server is stopped and the same process transcribes the files one by one with the same options
(requests/s: files per second; latency: each file's time), after one untimed pass over them. Every server answer's
text is compared with the one-by-one transcript of its file: the mismatch count is printed (0 expected: a request's
answer is the one it gets alone).

Without --audio: spoken clips (espeak-ng, as the tests make them) of about --seconds each, else tones with noise.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
import speech_clips  # noqa: E402  (the suite's clips and WAV writer)


def synthetic_clips(count: int, seconds: float, folder: Path) -> list:
    spoken = speech_clips.espeak_available()
    paths = []
    for i in range(count):
        if spoken:
            audio, texts = speech_clips.clip_of_length(100 + i, seconds)
            if not texts:           # shorter than any sentence: one sentence
                audio = speech_clips.clip(speech_clips.sentences(100 + i, 1))
        else:
            rng = np.random.default_rng(i)
            t = np.arange(int(16000 * seconds)) / 16000
            audio = (0.3 * np.sin(2 * np.pi * (200 + 37 * i) * t)
                     + 0.05 * rng.standard_normal(len(t))).astype(np.float32)
        p = folder / f"clip{i}.wav"
        p.write_bytes(speech_clips.wav_bytes(audio))
        paths.append(p)
    return paths


def multipart(data: bytes, name: str, fields: dict):
    boundary = "minirt-bench-3c1f9a"
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                 f'Content-Type: application/octet-stream\r\n\r\n'.encode() + data + b"\r\n")
    parts.append(f"--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


class Client:
    """One connection per thread (kept alive), POST /v1/audio/transcriptions."""

    def __init__(self, port: int, api_key=None):
        self.port, self.api_key = port, api_key
        self.local = threading.local()

    def transcribe(self, data: bytes, name: str) -> dict:
        body, ctype = multipart(data, name, {"model": "whisper-1", "response_format": "verbose_json"})
        headers = {"Content-Type": ctype}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        for attempt in (0, 1):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=3600)
            try:
                conn.request("POST", "/v1/audio/transcriptions", body, headers)
                r = conn.getresponse()
                text = r.read()
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
                continue
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {text[:300]!r}")
            return json.loads(text)


def start_server(args, log_path: Path):
    cmd = [sys.executable, "-m", "minirt", "serve", "--model", str(args.model), "--port", "0",
           "--max-batch", str(args.max_batch), "--max-queue", str(max(64, 2 * max(args.levels))),
           "--max-upload-mb", "1024", "--precision", args.precision, "--log-level", "warning"]
    if args.device is not None:
        cmd += ["--device", args.device]
    for opt in args.transcribe_option:
        cmd += ["--transcribe-option", opt]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
    end = time.monotonic() + 1800
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"minirt serve exited {proc.returncode}:\n{log_path.read_text()}")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log_path.read_text())
        if m:
            port = int(m.group(1))
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return proc, port
            except OSError:
                pass
        time.sleep(0.5)
    proc.kill()
    sys.exit("minirt serve did not start in 30 minutes")


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(np.ceil(q / 100 * len(xs))) - 1))]


def summary(latencies, wall, audio_seconds):
    return {"requests": len(latencies), "wall_s": wall, "requests_per_s": len(latencies) / wall,
            "audio_s_per_s": audio_seconds / wall, "p50_s": statistics.median(latencies),
            "p99_s": percentile(latencies, 99)}


def run_level(client, files, concurrency, requests):
    """summary of `requests` requests from `concurrency` threads; and {file index: [texts]}."""
    order = [i % len(files) for i in range(requests)]
    latencies, texts, lock = [], {}, threading.Lock()
    it = iter(order)

    def worker():
        while True:
            with lock:
                i = next(it, None)
            if i is None:
                return
            t0 = time.perf_counter()
            doc = client.transcribe(files[i][1], files[i][0].name)
            dt = time.perf_counter() - t0
            with lock:
                latencies.append(dt)
                texts.setdefault(i, []).append(doc["text"])
    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as ex:
        for f in [ex.submit(worker) for _ in range(concurrency)]:
            f.result()
    wall = time.perf_counter() - t0
    return summary(latencies, wall, sum(files[i][2] for i in order)), texts


def one_by_one(args, files, options):
    from minirt.whisper.model import WhisperModel
    from minirt.whisper.output import full_text
    model = WhisperModel(str(args.model), precision=args.precision, device=args.device)
    texts, latencies = [], []
    for path, _, _ in files:                                    # untimed pass
        texts.append(full_text(list(model.transcribe(str(path), **options)[0])))
    t0 = time.perf_counter()
    for path, _, _ in files:
        s = time.perf_counter()
        list(model.transcribe(str(path), **options)[0])
        latencies.append(time.perf_counter() - s)
    wall = time.perf_counter() - t0
    return summary(latencies, wall, sum(f[2] for f in files)), texts


def main(argv=None):
    from minirt.whisper.synthetic import SIZES
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="a Whisper model folder (Hugging Face or CTranslate2)")
    src.add_argument("--size", choices=list(SIZES),
                     help="a seeded random Whisper of these shapes (minirt.whisper.synthetic), in a temporary folder")
    ap.add_argument("--audio", nargs="+", type=Path, help="the files to send (default: --clips synthesized ones)")
    ap.add_argument("--clips", type=int, default=8, help="synthesized files without --audio (default 8)")
    ap.add_argument("--seconds", type=float, default=10, help="length of a synthesized file (default 10 s)")
    ap.add_argument("--concurrency", default="1,8,32", help="client threads, comma-separated (default 1,8,32)")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests a level (default: 2 x the concurrency, at least 2 x the files)")
    ap.add_argument("--max-batch", type=int, default=32, help="the server's --max-batch (default 32)")
    ap.add_argument("--precision", choices=["fp32", "fp16"], default="fp32")
    ap.add_argument("--device", default=None, help="the server's and the one-by-one run's --device")
    ap.add_argument("--transcribe-option", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to the server, and the same to the one-by-one transcribe(); repeatable")
    ap.add_argument("--no-baseline", action="store_true", help="leave out the one-by-one run")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    if args.size:
        from minirt.whisper.synthetic import write_folder
        cfg = dict(SIZES[args.size], vocab_size=51864)          # English-only: synthetic.tokenizer_json's
        args.model = write_folder(work / f"random-{args.size}", cfg, seed=0)
    paths = args.audio or synthetic_clips(args.clips, args.seconds, work)
    from minirt.whisper.audio_input import load_audio
    files = [(p, p.read_bytes(), len(load_audio(str(p))) / 16000) for p in paths]

    from minirt.cli import _option_value
    options = {"beam_size": 1}
    for opt in args.transcribe_option:
        k, _, v = opt.partition("=")
        options[k.strip().replace("-", "_")] = _option_value(v.strip())

    results = {"model": str(args.model), "files": len(files), "audio_s": sum(f[2] for f in files),
               "max_batch": args.max_batch, "precision": args.precision, "options": options, "server": {}}
    proc, port = start_server(args, work / "server.log")
    served = {}
    try:
        client = Client(port)
        singles = [client.transcribe(data, p.name)["text"] for p, data, _ in files]
        for c in args.levels:
            n = args.requests or max(2 * c, 2 * len(files))
            r, texts = run_level(client, files, c, n)
            results["server"][c] = r
            for i, ts in texts.items():
                served.setdefault(i, []).extend(ts)
            print(f"serve  concurrency {c:3d}: {r['requests']:4d} requests in {r['wall_s']:7.2f} s  "
                  f"{r['requests_per_s']:7.2f} req/s  {r['audio_s_per_s']:8.1f} audio s/s  "
                  f"p50 {r['p50_s']:6.3f} s  p99 {r['p99_s']:6.3f} s", flush=True)
    finally:
        proc.terminate()
        proc.wait(600)
    results["server_single_mismatches"] = sum(t != singles[i] for i, ts in served.items() for t in ts)
    print(f"answers under load differing from the file's single request: {results['server_single_mismatches']}")
    if not args.no_baseline:
        r, texts = one_by_one(args, files, options)
        results["one_by_one"] = r
        results["served_vs_transcribe_mismatches"] = sum(singles[i] != texts[i] for i in range(len(files)))
        print(f"one by one (WhisperModel.transcribe): {len(files)} files in {r['wall_s']:.2f} s  "
              f"{r['requests_per_s']:7.2f} files/s  {r['audio_s_per_s']:8.1f} audio s/s  p50 {r['p50_s']:6.3f} s  "
              f"p99 {r['p99_s']:6.3f} s")
        print(f"server answers differing from transcribe(): {results['served_vs_transcribe_mismatches']}")
        for c, s in results["server"].items():
            print(f"  concurrency {c}: {s['requests_per_s'] / r['requests_per_s']:.2f}x the one-by-one throughput")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
