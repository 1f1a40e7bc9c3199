#!/usr/bin/env python3
"""Cold start: the time from Session(...) to the first result of the Whisper encoders, per phase.

Each measurement is a fresh Python process (so nothing is warm in memory): for every size, the first
process starts with an empty pipeline cache ("cold") and the second reuses what the first wrote
("warm"). Phases come from Session.startup_ms:

  load       read the ONNX file into a Graph          (minirt/loaders)
  check      shape inference, folding, op support     (minirt/infer.py)
  device     Vulkan instance and device (first Session in the process)
  plan       graph passes, lowering, prepacking weights, local sizes, memory plan (minirt/planner)
  pipelines  pipeline cache, shader modules, vkCreateComputePipelines (minirt/vk/pipelines.py, cache.py)
  upload     weights into device memory               (Executor._alloc_constants)
  alloc      activations, staging, readback           (Executor._alloc_activations, _alloc_host)
  record     descriptor sets and the command buffer   (Executor._record)
  first run  the first Session.run: upload input, execute, read back (drivers that compile lazily,
             such as lavapipe, compile kernels here)

`total` is the wall time from Session(...) to the first result; `import` (Python importing minirt,
numpy, onnx, vulkan) comes before it and is not included; `2nd run` (a second Session.run, for scale:
first run minus second run is roughly what the first run pays for lazy compilation and first touches).
The last column gives the process's CPU time (all threads, so lavapipe's too) for Session(...), the
first and the second run: on a busy machine it is steadier than wall time.

The driver's own shader caches are isolated too (Mesa: MESA_SHADER_CACHE_DIR; NVIDIA:
__GL_SHADER_DISK_CACHE_PATH point into the same temporary folder), so "cold" is cold for both and
"warm" warm for both; a third process, "warm, driver cache emptied", keeps minirt's pipeline cache but
empties the driver's, which shows what minirt's cache alone brings. --system-driver-cache leaves the
driver's caches where they are (and skips the third process).

    python tools/coldstart.py                       # Whisper tiny, cold and warm
    python tools/coldstart.py --sizes tiny,base --repeat 3 --json coldstart.json
Models are built with models/whisper_encoder.py (seeded random weights) when missing."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MINIRT_ONLY = "warm, driver cache emptied"
PHASES = ("load", "check", "device", "plan", "pipelines", "upload", "alloc", "record", "first_run")


def child(model: str, inp: str, storage: str) -> None:
    """Runs in the measured process: prints one JSON line."""
    t_imp = time.perf_counter()
    import numpy as np
    from minirt import Session
    import_ms = (time.perf_counter() - t_imp) * 1e3
    x = np.load(inp) if inp else None
    t0, c0 = time.perf_counter(), time.process_time()
    s = Session(model, storage=storage)
    if x is None:
        shape = [d if isinstance(d, int) else 1 for d in s.inputs[0].shape]
        x = np.zeros(shape, np.float32)
    c1 = time.process_time()
    s.run(x)
    total, c2 = (time.perf_counter() - t0) * 1e3, time.process_time()
    t1 = time.perf_counter()
    s.run(x)
    second, c3 = (time.perf_counter() - t1) * 1e3, time.process_time()
    ex = next(iter(s._execs.values()))
    cache = ex.kernels.cache
    # CPU time of the whole process (lavapipe's threads included): steadier than wall time on a busy machine
    cpu = {"session_cpu_ms": (c1 - c0) * 1e3, "first_run_cpu_ms": (c2 - c1) * 1e3, "second_run_cpu_ms": (c3 - c2) * 1e3}
    info = {"phases": s.startup_ms, "total_ms": total, "import_ms": import_ms, "second_run_ms": second, **cpu,
            "cache": cache.status,
            "pipelines": ex.kernels.created, "device": s.device.profile.name, "driver": s.device.profile.driver,
            "storage": s.storage}
    s.close()
    info["cache_bytes"] = cache.path.stat().st_size if cache.path and cache.path.exists() else 0
    print("COLDSTART " + json.dumps(info), flush=True)


def ensure_model(size: str) -> tuple[Path, Path | None]:
    model = ROOT / "models" / f"whisper-{size}-encoder.onnx"
    inp = ROOT / "models" / f"whisper-{size}-input.npy"
    if not model.exists():
        print(f"building {model.relative_to(ROOT)} (seeded random weights)...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, str(ROOT / "models" / "whisper_encoder.py"), "--size", size,
                        "-o", str(model), "--sample-input", str(inp)], check=True)
    return model, (inp if inp.exists() else None)


def measure(model, inp, storage, cache_root: Path, system_driver_cache: bool) -> dict:
    env = dict(os.environ)
    env.pop("MINIRT_NO_PIPELINE_CACHE", None)
    env["MINIRT_CACHE_DIR"] = str(cache_root / "minirt")
    if not system_driver_cache:
        env["MESA_SHADER_CACHE_DIR"] = str(cache_root / "mesa")
        env["__GL_SHADER_DISK_CACHE_PATH"] = str(cache_root / "nvidia")
        (cache_root / "nvidia").mkdir(parents=True, exist_ok=True)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(model), str(inp or ""), storage]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("COLDSTART ")), None)
    if r.returncode or line is None:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(f"the measured process failed (exit {r.returncode})")
    return json.loads(line[len("COLDSTART "):])


def median_of(runs: list[dict]) -> dict:
    out = dict(runs[0])
    out["phases"] = {p: statistics.median(r["phases"].get(p, 0.0) for r in runs) for p in PHASES}
    for k in ("total_ms", "import_ms", "second_run_ms", "session_cpu_ms", "first_run_cpu_ms", "second_run_cpu_ms"):
        out[k] = statistics.median(r[k] for r in runs)
    return out


def fmt(ms: float) -> str:
    return f"{ms / 1e3:.2f} s" if ms >= 1000 else f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


def table(rows) -> str:
    head = ["size", "pipeline cache", *[p.replace("_", " ") for p in PHASES], "total", "(import)", "(2nd run)",
            "CPU: Session() / 1st run / 2nd run"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for size, mode, r in rows:
        cells = [size, f"{mode} ({r['cache']}, {r['cache_bytes']} B)",
                 *[fmt(r["phases"].get(p, 0.0)) for p in PHASES], f"**{fmt(r['total_ms'])}**", fmt(r["import_ms"]),
                 fmt(r["second_run_ms"]),
                 " / ".join(fmt(r[k]) for k in ("session_cpu_ms", "first_run_cpu_ms", "second_run_cpu_ms"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--sizes", default="tiny", help="comma-separated Whisper sizes (default tiny)")
    ap.add_argument("--storage", default="auto", choices=("auto", "buffer", "texture"))
    ap.add_argument("--repeat", type=int, default=1, help="cold and warm sets per size, each in fresh cache folders; "
                                                        "the table shows medians")
    ap.add_argument("--system-driver-cache", action="store_true",
                    help="leave the driver's own shader cache (Mesa, NVIDIA) where it is instead of isolating it")
    ap.add_argument("--json", metavar="FILE", help="also write every measurement as JSON")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "INPUT", "STORAGE"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        child(*a.child)
        return 0
    rows, raw = [], []
    for size in [s.strip() for s in a.sizes.split(",") if s.strip()]:
        model, inp = ensure_model(size)
        modes = ["cold", "warm"] + ([] if a.system_driver_cache else [MINIRT_ONLY])
        runs = {m: [] for m in modes}
        for i in range(a.repeat):
            with tempfile.TemporaryDirectory(prefix="minirt-coldstart-") as tmp:
                for mode in modes:
                    if mode == MINIRT_ONLY:      # keep minirt's pipeline cache, empty the driver's own
                        for d in ("mesa", "nvidia"):
                            shutil.rmtree(Path(tmp) / d, ignore_errors=True)
                    print(f"{size}: {mode} process {i + 1}/{a.repeat}...", file=sys.stderr, flush=True)
                    r = measure(model, inp, a.storage, Path(tmp), a.system_driver_cache)
                    runs[mode].append(r)
                    raw.append({"size": size, "mode": mode, **r})
        rows += [(size, m, median_of(runs[m])) for m in modes]
    r0 = rows[0][2]
    print(f"device: {r0['device']} ({r0['driver']}); storage {r0['storage']}; median of {a.repeat} "
          f"process(es) each; {r0['pipelines']} pipelines for {rows[0][0]}")
    print(table(rows))
    if a.json:
        Path(a.json).write_text(json.dumps(raw, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
