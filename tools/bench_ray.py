#!/usr/bin/env python3
"""Corpus transcription throughput on one GPU: files per second with minirt.ray's Transcriber on Ray Data (1 actor
with the GPU, 2 actors sharing it), beside one process looping over the files and two plain processes without Ray,
in one run, on the same random-weights Whisper checkpoint folder (written here: tiny's shapes, an English-only
vocabulary) and the same fixed clips (seeded tones in noise, written as 16 kHz WAV).

  python tools/bench_ray.py --clips 128 --seconds 10 --json ray.json

Per mode: files, workers, wall s (from the start to the last file, start-up included: the model's load in each
worker, the worker processes' start; the Ray cluster is started before), start-up s (to the first file finished),
steady files/s (the files finished after every worker had finished its first, over the time they took) and files/s
(files over wall s). Transcripts must be the same in every mode (the script says where they differ).
Without ray installed the Ray modes are left out, and the script says so. First it prints, for each GPU NVML lists,
the Vulkan device with its UUID (the match minirt.ray's workers rely on). Exit status 1 where transcripts differ.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minirt.ray import Transcriber  # noqa: E402  (after the checkout is on the path)


class Timed(Transcriber):
    """A Transcriber that also writes, per row, when it finished and which process did it."""

    def transcribe(self, audio):
        row = super().transcribe(audio)
        self.finished.append(time.time())
        return row

    def __call__(self, batch):
        self.finished = []
        out = super().__call__(batch)
        out["finished"] = np.array(self.finished)
        out["worker"] = np.full(len(out["text"]), f"{os.getpid()}:{threading.get_native_id()}")
        return out


def write_clips(folder: Path, n: int, seconds: float) -> list:
    rng = np.random.default_rng(0)
    t = np.arange(int(16000 * seconds)) / 16000
    paths = []
    for i in range(n):
        x = 0.3 * np.sin(2 * np.pi * (150 + 37 * i) * t) * (1 + 0.5 * np.sin(2 * np.pi * 0.7 * t))
        x += 0.05 * rng.standard_normal(len(t))
        path = folder / f"clip{i:04d}.wav"
        with wave.open(str(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((np.clip(x, -1, 1) * 32767).astype("<i2").tobytes())
        paths.append(str(path))
    return paths


def summary(name, rows, started):
    """The mode's figures from its rows (each with finished, worker, audio, text)."""
    finished = sorted(r["finished"] for r in rows)
    firsts = {}
    for r in rows:
        firsts[r["worker"]] = min(firsts.get(r["worker"], np.inf), r["finished"])
    t0 = max(firsts.values())
    later = [f for f in finished if f > t0]
    wall = finished[-1] - started
    steady = len(later) / (finished[-1] - t0) if len(later) and finished[-1] > t0 else float("nan")
    return {"mode": name, "files": len(rows), "workers": len(firsts), "wall_s": wall,
            "startup_s": finished[0] - started, "steady_files_per_s": steady, "files_per_s": len(rows) / wall,
            "texts": {r["audio"]: r["text"] for r in rows}}


def one_process(folder, paths, options, batch):
    started = time.time()
    t = Timed(str(folder), **options)
    rows = []
    for i in range(0, len(paths), batch):
        out = t({"audio": np.array(paths[i:i + batch])})
        rows += [{k: v[j] for k, v in out.items()} for j in range(len(out["text"]))]
    return rows, started


def _pool_init(folder, options, gpus=None):
    """One model per worker process; with `gpus` (a queue of (how, device)) each worker takes one device: an NVML
    UUID it sees as Ray shows an actor its GPU, through CUDA_VISIBLE_DEVICES (Transcriber finds it by UUID), or a
    device passed as device=."""
    global _worker
    if gpus is not None:
        how, device = gpus.get()
        if how == "env":
            os.environ["CUDA_VISIBLE_DEVICES"] = device
        else:
            options = dict(options, device=device)
    _worker = Timed(str(folder), **options)


def _pool_run(chunk):
    out = _worker({"audio": np.array(chunk)})
    return [{k: v[j] for k, v in out.items()} for j in range(len(out["text"]))]


def plain_processes(folder, paths, options, batch, n, devices=None):
    """n spawned processes, each with its own model (on the default device, or on its own of `devices`: (how,
    device) as _pool_init takes them), taking batches from a shared queue."""
    started = time.time()
    ctx = multiprocessing.get_context("spawn")
    gpus = None
    if devices:
        gpus = ctx.Queue()
        for d in devices:
            gpus.put(d)
    with ctx.Pool(n, initializer=_pool_init, initargs=(folder, options, gpus)) as pool:
        chunks = [paths[i:i + batch] for i in range(0, len(paths), batch)]
        rows = [r for part in pool.imap_unordered(_pool_run, chunks) for r in part]
    return rows, started


def threads_per_device(folder, paths, options, batch, devices):
    """One process, a model and a thread per device, taking batches from a shared list: runs on different devices
    overlap (minirt holds no process-wide lock across devices; the GIL is released while a thread waits on its
    GPU)."""
    started = time.time()
    workers = [Timed(str(folder), device=d, **options) for d in devices]
    chunks = [paths[i:i + batch] for i in range(0, len(paths), batch)]
    rows, lock = [], threading.Lock()

    def work(t):
        while True:
            with lock:
                if not chunks:
                    return
                chunk = chunks.pop(0)
            out = t({"audio": np.array(chunk)})
            with lock:
                rows.extend({k: v[j] for k, v in out.items()} for j in range(len(out["text"])))
    threads = [threading.Thread(target=work, args=(t,)) for t in workers]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return rows, started


def ray_actors(ray, folder, paths, options, batch, actors, gpus):
    started = time.time()
    ds = ray.data.from_items([{"audio": p} for p in paths])
    ds = ds.map_batches(Timed, fn_constructor_args=(str(folder),), fn_constructor_kwargs=options, batch_size=batch,
                        compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=1, num_gpus=gpus / actors)
    return ds.take_all(), started


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clips", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of each clip")
    ap.add_argument("--batch", type=int, default=4, help="map_batches batch_size (and the batch of the others)")
    ap.add_argument("--beam-size", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="tokens at most per 30 s window")
    ap.add_argument("--size", default="tiny", choices=["tiny", "base", "small"], help="the Whisper shapes")
    ap.add_argument("--d-model", type=int, help="narrower than --size (one head per 64 wide, at least one): a smoke "
                                                "run on a CPU driver")
    ap.add_argument("--layers", type=int, help="fewer layers than --size, on each side")
    ap.add_argument("--devices", help="comma-separated devices (indices or UUIDs) for the modes with a device per "
                                      "worker (default: every GPU NVML lists, by UUID)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    try:
        import ray
    except ImportError:
        ray = None
        print("ray is not installed here (pip install 'minirt[ray]'): the Ray modes are left out", flush=True)

    from minirt.session import get_device
    from minirt.whisper.synthetic import SIZES, write_folder
    tmp = Path(tempfile.mkdtemp(prefix="minirt-bench-ray-"))
    cfg = dict(SIZES[args.size], vocab_size=51864)
    if args.d_model:
        heads = max(1, args.d_model // 64)
        cfg.update(d_model=args.d_model, encoder_attention_heads=heads, decoder_attention_heads=heads)
    if args.layers:
        cfg.update(encoder_layers=args.layers, decoder_layers=args.layers)
    folder = write_folder(tmp / "model", cfg, seed=0)
    paths = write_clips(tmp, args.clips, args.seconds)
    options = {"beam_size": args.beam_size, "temperature": 0.0, "max_new_tokens": args.max_new_tokens,
               "condition_on_previous_text": False}
    profile = get_device().profile
    shape = f" (d_model {cfg['d_model']}, layers {cfg['encoder_layers']})" if args.d_model or args.layers else ""
    print(f"{args.clips} clips of {args.seconds:g} s, Whisper {args.size} shapes{shape} (random weights, English-only "
          f"vocabulary), beam {args.beam_size}, at most {args.max_new_tokens} tokens a window, batches of "
          f"{args.batch}; device {profile.name} ({profile.uuid or 'no UUID'})", flush=True)

    from minirt.ray import nvml_uuids
    from minirt.vk.device import choose, physical_devices
    uuids = nvml_uuids()
    if not uuids:
        print("NVML: no NVIDIA GPU answers (pynvml, nvidia-smi): Ray's GPU indices cannot be mapped to UUIDs here")
    for index, uuid in sorted((uuids or {}).items()):
        try:
            found = choose(physical_devices(), uuid)
            print(f"NVML GPU {index} {uuid} is Vulkan device [{found[0]}] {found[2].name}")
        except Exception as e:  # noqa: BLE001 - reported: the mapping is what is being checked
            print(f"NVML GPU {index} {uuid}: {e}")

    results = []

    def report(name, rows_started):
        s = summary(name, *rows_started)
        results.append(s)
        print(f"{name:<34} {s['files']:>5} {s['workers']:>7} {s['wall_s']:>8.2f} {s['startup_s']:>10.2f} "
              f"{s['steady_files_per_s']:>15.2f} {s['files_per_s']:>8.2f}", flush=True)

    print(f"{'mode':<34} {'files':>5} {'workers':>7} {'wall s':>8} {'start-up s':>10} {'steady files/s':>15} "
          f"{'files/s':>8}")
    report("one process", one_process(folder, paths, options, args.batch))
    report("2 processes, no Ray", plain_processes(folder, paths, options, args.batch, 2))
    gpus = args.devices.split(",") if args.devices else [uuid for _, uuid in sorted((uuids or {}).items())]
    if len(gpus) >= 2:
        how = "device" if args.devices else "env"
        report(f"{len(gpus)} processes, a GPU each", plain_processes(folder, paths, options, args.batch, len(gpus),
                                                                    [(how, g) for g in gpus]))
        report(f"one process, {len(gpus)} GPUs, a thread each",
               threads_per_device(folder, paths, options, args.batch, gpus))
    else:
        print(f"{len(gpus)} NVIDIA GPU here: the modes with a GPU per worker are left out", flush=True)
    if ray is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        except Exception as e:  # noqa: BLE001 - reported; the other modes' figures stand
            print(f"Ray could not start here ({type(e).__name__}: {e}): the Ray modes are left out", flush=True)
            ray = None
    if ray is not None:
        ray.data.DataContext.get_current().enable_progress_bars = False
        gpus = 1 if ray.cluster_resources().get("GPU", 0) >= 1 else 0
        if not gpus:
            print("Ray sees no GPU here: its actors ask for none and open the default device", flush=True)
        try:
            report(f"Ray, 1 actor ({gpus} GPU)", ray_actors(ray, folder, paths, options, args.batch, 1, gpus))
            report(f"Ray, 2 actors ({gpus / 2:g} GPU each)",
                   ray_actors(ray, folder, paths, options, args.batch, 2, gpus))
        finally:
            ray.shutdown()
    for r in results[1:]:
        print(f"{r['mode']}: {r['files_per_s'] / results[0]['files_per_s']:.2f}x one process's files/s, "
              f"{r['steady_files_per_s'] / results[0]['steady_files_per_s']:.2f}x steady")
    first = results[0]["texts"]
    differ = [r["mode"] for r in results[1:] if r["texts"] != first]
    print("transcripts: " + (f"differ from one process's in {', '.join(differ)}" if differ
                             else "the same in every mode"))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"device": profile.name, "uuid": profile.uuid, "args": vars(args),
             "results": [{k: v for k, v in r.items() if k != "texts"} for r in results]}, indent=1))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
