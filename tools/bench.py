#!/usr/bin/env python3
"""Whisper encoder benchmark: minirt (Session.run wall time; GPU time from the timestamp query pool, both as the sum
of per-dispatch times with a stamp after every dispatch and as the span between one stamp before the run's first
dispatch and one after its last) beside PyTorch CUDA eager and with a CUDA graph (when torch with CUDA imports), each at every precision
asked for, and onnxruntime CPU, on the same model (seeded random weights) and input, in one process.
Prints a table with ratios and writes JSON.

  python tools/bench.py --sizes tiny,base --runs 50 --json bench.json
  python tools/bench.py --sizes tiny --precision fp32,fp16     # fp16: minirt precision="fp16", torch .half()
  python tools/bench.py --sizes tiny --fp32-precision f16x3    # fp32 GEMMs from split operands beside ieee

fp16 accuracy is reported against minirt's own fp32 result (relative L2 error and cosine).
--fp32-precision SCHEME[,SCHEME]: minirt at fp32 again with the Session option fp32_precision=SCHEME (the fp32 GEMMs on
tensor cores from split operands, and with f16x3 the attention too), after the ieee run in the same process: its GPU
time and the ratio to ieee's, its accuracy against ieee and onnxruntime, its attention's GPU time a layer beside ieee's
(per-dispatch stamps), its GEMMs.

Below each table, the encoder's GEMMs from the run with a stamp after every dispatch: each role's time a layer (the
GEMM dispatch alone, then with the pass that adds its K splits, which also does the next LayerNorm where one follows)
and TFLOP/s, beside PyTorch's F.linear with the same epilogue at the same shape (cuBLAS; TF32 off at fp32; timed as
tools/dev/gemm_bench.py --torch does), and the front end's convolutions (im2col, both GEMMs, their reduce pass) as
effective TFLOP/s.

Every figure is a median over --runs timed calls after --warmup untimed ones. Wall time is per call
with the input starting in host memory and the output ending in host memory, for every runtime.

minirt's wall time is taken three ways, in alternating rounds: outputs dropped (the caller lets go of each result
before the next run), kept (each appended to a list, as a caller collecting results does) and into one reusable
array (Session.run(..., out=)); the table gives each as a ratio of the dropped figure.

  python tools/bench.py --sizes tiny --precision fp32,fp16 --batch 1,4,8,16   # + ms a batch item, beside PyTorch
  python tools/bench.py --sizes large-v3-turbo --precision fp16,fp32 --runs 10 --warmup 2   # large-v3's encoder

--sizes takes models/whisper_encoder.py's sizes: tiny to large-v2 (80 mel bins), large-v3 and the models distilled
from it, large-v3-turbo and distil-large-v3 (the same encoder: 128 mel bins, 32 layers of 1280). Past 2 GiB of
weights (large at fp32: the built model is fp32 whatever --precision) onnxruntime is left out: an in-memory model
reaches it serialized, and protobuf stops at 2 GiB.

--batch builds the encoder with a symbolic batch dim and times each batch size (items: distinct sample inputs):
minirt's wall time (dropped and kept) and GPU span, and PyTorch's, per item. --frames and --layers shrink the model
(a quick check on lavapipe: --sizes tiny --frames 64 --layers 1 --runs 3 --warmup 1 --batch 1,2).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, runs, warmup):
    """(median, min) wall ms (benchconfig.timed)."""
    from benchconfig import timed as median_min
    return median_min(fn, runs, warmup)


def output_modes(s, x, runs, warmup, rounds=3):
    """Session.run wall ms (median, min) with each result dropped, kept (appended to a list until every round is done)
    and written into one out= array, in `rounds` alternating rounds so that a slow stretch touches each alike:
    {"dropped": (median, min), "kept": ..., "out": ...}."""
    kept, buf = [], np.empty_like(s.run(x))
    modes = {"dropped": lambda: s.run(x), "kept": lambda: kept.append(s.run(x)), "out": lambda: s.run(x, out=buf)}
    ts = {m: [] for m in modes}
    per = max(1, runs // rounds)
    for _ in range(rounds):
        for m, fn in modes.items():
            for i in range(warmup + per):
                t0 = time.perf_counter()
                fn()
                if i >= warmup:
                    ts[m].append((time.perf_counter() - t0) * 1e3)
    kept.clear()
    return {m: (statistics.median(v), min(v)) for m, v in ts.items()}


def cosine(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def bench_minirt(model, x, runs, warmup, storage, options):
    from minirt import Session
    res = {}
    with Session(model, storage=storage, options=options) as s:
        y = s.run(x)
        modes = output_modes(s, x, runs, warmup)
        res["wall_ms"], res["wall_min_ms"] = modes["dropped"]
        res["kept_wall_ms"], res["kept_wall_min_ms"] = modes["kept"]
        res["out_wall_ms"], res["out_wall_min_ms"] = modes["out"]
        outs = {s.run(x).tobytes() for _ in range(min(runs, 60))}
        res["distinct_outputs"] = len(outs)
        res["dispatches"] = len(s.plan.dispatches)
        res["gflop"] = sum(d.flops for d in s.plan.dispatches) / 1e9
        res["device"] = s.device.profile.name
        res["storage"] = s.storage
    with Session(model, storage=storage, options=options, profile=True) as s:
        gpu, per = [], None
        for i in range(runs + warmup):
            s.run(x)
            if i >= warmup:
                recs = s.profile_records()
                gpu.append(sum(r.gpu_ms or 0 for r in recs))
                per = per or [[] for _ in recs]
                for times, r in zip(per, recs):
                    times.append((r.gpu_ms or 0) * 1e3)
        res["gpu_ms"] = statistics.median(gpu)
        res["dispatch_us"] = [{"node": r.node, "kernel": r.kernel, "flops": r.flops, "gpu_us": statistics.median(t)}
                              for r, t in zip(recs, per)]
    with Session(model, storage=storage, options=options, profile="span") as s:
        span = []
        for i in range(runs + warmup):
            s.run(x)
            if i >= warmup:
                span.append(s.gpu_span_ms())
        res["gpu_span_ms"] = statistics.median(span)
    return y, res


# The encoder's GEMMs by the node names of the exported graph: role, (M, K, N) in units of d_model, epilogue
GEMM_ROLES = (("q_proj", "QKV", (1, 3), "none"), ("out_proj", "out-projection", (1, 1), "residual"),
              ("fc1", "fc1 (+GELU)", (1, 4), "gelu"), ("fc2", "fc2 (+residual)", (4, 1), "residual"))


def gemm_figures(dispatches, d_model, frames=1500):
    """The per-GEMM view of one profiled run: {role: {"shape": (M, K, N), "epilogue", "gemm_us": [per layer],
    "reduce_us": [per layer, 0 where K is not split], "flops": [the GEMM dispatch's, per layer]}} and the front end's
    {"us", "gflop"} (im2col, both convolutions and their reduce passes), from the per-dispatch medians
    (dispatches: [{"node", "kernel", "flops", "gpu_us"}] in dispatch order). frames: the encoder's positions."""
    roles, front = {}, {"us": 0.0, "gflop": 0.0}
    last = None
    for rec in dispatches:
        node, kernel = rec["node"], rec["kernel"]
        if "/conv1/" in node or "/conv2/" in node:
            front["us"] += rec["gpu_us"]
            if not kernel.startswith("linear_reduce"):   # the convolutions' FLOPs, not the adds of their K splits
                front["gflop"] += rec["flops"] / 1e9
            continue
        if kernel.startswith("linear_reduce") and last is not None:
            last["reduce_us"][-1] += rec["gpu_us"]
            continue
        last = None
        if not kernel.startswith("linear"):
            continue
        for key, role, (k, n), epi in GEMM_ROLES:
            if key in node:
                e = roles.setdefault(role, {"shape": (frames, k * d_model, n * d_model), "epilogue": epi,
                                            "gemm_us": [], "reduce_us": [], "flops": []})
                e["gemm_us"].append(rec["gpu_us"])
                e["reduce_us"].append(0.0)
                e["flops"].append(rec["flops"])
                last = e
    return roles, front


def attention_us(dispatches):
    """{node: (GPU us, kernels)} of the attention dispatches (the kernel and any combine pass after a key split), per
    Attention node in dispatch order, from the per-dispatch medians."""
    out = {}
    for rec in dispatches:
        if rec["kernel"].startswith("attention"):
            us, kernels = out.get(rec["node"], (0.0, []))
            out[rec["node"]] = (us + rec["gpu_us"], kernels + [rec["kernel"]])
    return out


def cublas_times(roles, precision, runs):
    """PyTorch CUDA (cuBLAS) us per call of F.linear with each role's epilogue, at its shape, or {} without torch."""
    from benchconfig import torch_case, torch_time
    out = {}
    for role, e in roles.items():
        fns = torch_case(*e["shape"], e["epilogue"], precision)
        if fns is None:
            return {}
        out[role] = torch_time(fns["linear"], 1, max(runs, 10))
    return out


def print_gemms(m, cublas=None):
    roles, front = m["gemms"], m["front_end"]
    cublas = cublas or {}
    print(f"{'GEMM (per-dispatch stamps)':<26} {'M x K x N':<16} {'us a layer, 0..':<30} {'TFLOP/s':<12} "
          f"{'+ reduce pass (us)':<22} {'with it':<12} {'cuBLAS us (TFLOP/s)' if cublas else ''}")
    def rates(f, us):   # "low-high" TFLOP/s over the layers; "-" where the device gave no times
        return f"{f / max(us):.1f}-{f / min(us):.1f}" if us and min(us) > 0 else "-"
    for role, e in roles.items():
        f = max(e["flops"]) / 1e6   # MFLOP: / us = TFLOP/s
        g, r = e["gemm_us"], e["reduce_us"]
        tot = [a + b for a, b in zip(g, r)]
        cb = f"{cublas[role]:.1f} ({f / cublas[role]:.1f})" if cublas.get(role) else ""
        print(f"{role:<26} {'x'.join(map(str, e['shape'])):<16} {' / '.join(f'{v:.1f}' for v in g):<30} "
              f"{rates(f, g):<12} {(' / '.join(f'{v:.1f}' for v in r) if any(r) else '-'):<22} "
              f"{(rates(f, tot) if any(r) else '-'):<12} {cb}")
    if front["us"]:
        print(f"{'front end (convs)':<26} {'':<16} {front['us']:.1f} us for {front['gflop']:.2f} GFLOP: "
              f"{front['gflop'] * 1e3 / front['us']:.1f} TFLOP/s effective")


def bench_ort(model, x, runs, warmup):
    import onnxruntime as ort
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = s.run(None, {"input_features": x})[0]
    med, mn = timed(lambda: s.run(None, {"input_features": x}), runs, warmup)
    return y, {"wall_ms": med, "wall_min_ms": mn, "threads": "default"}


def onnx_bytes(model) -> int:
    """The bytes of a model's initializers (what its serialized form is made of)."""
    return sum(len(t.raw_data) for t in model.graph.initializer)


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def bench_torch(model, x, runs, warmup, precision="fp32"):
    """HF transformers' WhisperEncoder with the ONNX model's weights, fp32 (TF32 off) or fp16 (.half()): (output,
    figures), or (None, None) without CUDA."""
    enc = torch_encoder(model, precision)
    return (None, None) if enc is None else torch_times(enc, x, runs, warmup, precision)


def torch_encoder(model, precision):
    """The model as HF transformers' WhisperEncoder on the GPU in `precision`, or None without CUDA."""
    import torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    import whisper_encoder as we
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    sd = we.hf_state_dict(model, prefix="")
    d = sd["conv1.weight"].shape[0]
    layers = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("layers."))
    cfg = WhisperConfig(d_model=d, encoder_layers=layers, encoder_attention_heads=d // 64, encoder_ffn_dim=4 * d,
                        num_mel_bins=sd["conv1.weight"].shape[1], max_source_positions=sd["embed_positions.weight"].shape[0])
    enc = WhisperEncoder(cfg).eval()
    missing, unexpected = enc.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    assert not unexpected and all("k_proj.bias" in k for k in missing), (missing, unexpected)
    return enc.cuda().to(torch.float16 if precision == "fp16" else torch.float32)


def torch_times(enc, x, runs, warmup, precision):
    """(output, {eager and CUDA-graph wall ms, ...}) of the torch encoder `enc` on input x."""
    import torch
    dt = torch.float16 if precision == "fp16" else torch.float32
    res = {}
    with torch.no_grad():
        def eager():
            return enc(torch.from_numpy(x).cuda().to(dt)).last_hidden_state.float().cpu()
        y = eager().numpy()
        res["eager_wall_ms"], res["eager_wall_min_ms"] = timed(eager, runs, warmup)
        graph, static_in, static_out, host_in = torch_graph(enc, x, dt)

        def replay():
            static_in.copy_(host_in, non_blocking=True)
            graph.replay()
            return static_out.cpu()
        yg = replay().numpy()
        res["graph_wall_ms"], res["graph_wall_min_ms"] = timed(replay, runs, warmup)
        res["graph_cosine_vs_eager"] = cosine(yg, y)
        res["torch"] = torch.__version__
        res["gpu"] = torch.cuda.get_device_name()
    return y, res


def torch_graph(enc, x, dt):
    """(graph, its input, its output, x in pinned host memory): the encoder captured in a CUDA graph after three
    warm-up calls on a side stream, as PyTorch's documentation does it."""
    import torch
    static_in = torch.from_numpy(x).cuda().to(dt)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            enc(static_in)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = enc(static_in).last_hidden_state.float()
    return graph, static_in, static_out, torch.from_numpy(x).pin_memory()


def batch_input(we, n_mels, frames, batch):
    """`batch` distinct sample inputs (seeds 1, 2, ...) stacked: [batch, n_mels, frames]."""
    return np.concatenate([we.sample_input(n_mels, frames, seed=1 + i) for i in range(batch)])


def bench_batches(we, size, batches, prec, a, opts, torch_on):
    """Per batch size: minirt's wall ms (dropped, kept) and GPU span, and PyTorch's eager and CUDA-graph wall ms, on the
    encoder built with a symbolic batch dim. {batch: {...}}; every time is for the whole batch."""
    from minirt import Session
    model = we.build_whisper_encoder(size, opset=17, seed=0, dynamic_batch=True, layers=a.layers, n_frames=a.frames)
    n_mels = we.SIZES[size][3]
    xs = {b: batch_input(we, n_mels, a.frames, b) for b in batches}
    res = {b: {} for b in batches}
    options = {**opts, "precision": prec}
    with Session(model, storage=a.storage, options=options) as s:
        for b, x in xs.items():
            modes = output_modes(s, x, a.runs, a.warmup)
            res[b]["wall_ms"], res[b]["kept_wall_ms"] = modes["dropped"][0], modes["kept"][0]
            res[b]["out_wall_ms"] = modes["out"][0]
    with Session(model, storage=a.storage, options=options, profile="span") as s:
        for b, x in xs.items():
            span = []
            for i in range(a.runs + a.warmup):
                s.run(x)
                if i >= a.warmup:
                    span.append(s.gpu_span_ms())
            res[b]["gpu_span_ms"] = statistics.median(span) if None not in span else None
    if torch_on:
        try:
            enc = torch_encoder(model, prec)
        except ImportError as e:
            enc = None
            print(f"torch not available: {e}", file=sys.stderr)
        for b, x in xs.items():
            if enc is not None:
                _, t = torch_times(enc, x, a.runs, a.warmup, prec)
                res[b]["torch_eager_wall_ms"], res[b]["torch_graph_wall_ms"] = t["eager_wall_ms"], t["graph_wall_ms"]
    return res


def print_batches(size, prec, res, frames):
    """The --batch table: ms a batch item, and ratios (kept / dropped; minirt / PyTorch CUDA graph)."""
    print(f"\nWhisper-{size} encoder, {prec}, input [B, mels, {frames}], dynamic batch: ms per item (median)")
    print(f"{'batch':>5} {'minirt wall':>12} {'kept':>8} {'kept/dropped':>13} {'out=':>8} {'GPU span':>9} "
          f"{'torch eager':>12} {'torch graph':>12} {'minirt/graph':>13}")
    def ms(v, b):
        return f"{v / b:.3f}" if v is not None else "-"
    for b, r in res.items():
        tg = r.get("torch_graph_wall_ms")
        vs_graph = f"{r['wall_ms'] / tg:.2f}x" if tg else "-"
        print(f"{b:>5} {ms(r['wall_ms'], b):>12} {ms(r['kept_wall_ms'], b):>8} "
              f"{r['kept_wall_ms'] / r['wall_ms']:>12.2f}x {ms(r['out_wall_ms'], b):>8} {ms(r['gpu_span_ms'], b):>9} "
              f"{ms(r.get('torch_eager_wall_ms'), b):>12} {ms(tg, b):>12} {vs_graph:>13}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,base")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--storage", default="auto", choices=["auto", "buffer", "texture"])
    ap.add_argument("--precision", default="fp32", help="comma-separated: fp32, fp16 (minirt and torch both)")
    ap.add_argument("--fp32-precision", default="", metavar="SCHEME[,SCHEME]",
                    help="also run minirt fp32 with option fp32_precision=SCHEME (e.g. f16x3), beside ieee")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--no-ort", action="store_true")
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a Session option for minirt (`minirt options` lists them), e.g. --option gemm_tile=t44")
    ap.add_argument("--batch", help="comma-separated batch sizes, e.g. 1,4,8,16: ms a batch item on the encoder built "
                                    "with a symbolic batch dim, beside PyTorch's")
    ap.add_argument("--frames", type=int, default=3000, help="input frames (default 3000: 30 s)")
    ap.add_argument("--layers", type=int, help="override the number of layers (quick checks)")
    a = ap.parse_args(argv)
    import whisper_encoder as we
    from benchconfig import commit
    print(f"commit {commit()}")
    results = []
    for size in a.sizes.split(","):
        model = we.build_whisper_encoder(size, opset=17, seed=0, layers=a.layers, n_frames=a.frames)
        x = we.sample_input(we.SIZES[size][3], a.frames, seed=1)
        r = {"size": size, "frames": a.frames}
        opts = dict(o.split("=", 1) for o in a.option)
        precisions = a.precision.split(",")
        schemes = [s for s in a.fp32_precision.split(",") if s and s != "ieee"]
        if schemes and "fp32" not in precisions:    # the split schemes are measured beside ieee, in the same run
            precisions.insert(0, "fp32")
        ys = {}
        for prec in precisions:
            key = "minirt" if prec == "fp32" else f"minirt_{prec}"
            ys[prec], r[key] = bench_minirt(model, x, a.runs, a.warmup, a.storage, {**opts, "precision": prec})
            r[key]["gemms"], r[key]["front_end"] = gemm_figures(r[key]["dispatch_us"], we.SIZES[size][0],
                                                                (a.frames + 1) // 2)
            r[key]["options"] = opts or None
            r[key]["precision"] = prec
        if "fp32" not in ys:    # the fp16 accuracy reference
            ys["fp32"], _ = bench_minirt(model, x, 1, 0, a.storage, opts)
        y = ys["fp32"]
        for scheme in schemes:
            key = f"minirt_fp32_{scheme}"
            ys[key], r[key] = bench_minirt(model, x, a.runs, a.warmup, a.storage,
                                           {**opts, "precision": "fp32", "fp32_precision": scheme})
            r[key]["gemms"], r[key]["front_end"] = gemm_figures(r[key]["dispatch_us"], we.SIZES[size][0],
                                                                (a.frames + 1) // 2)
            r[key]["rel_l2_vs_minirt_fp32"], r[key]["cosine_vs_minirt_fp32"] = rel_l2(ys[key], y), cosine(ys[key], y)
        for prec in precisions:
            if prec != "fp32":
                m = r[f"minirt_{prec}"]
                m["rel_l2_vs_minirt_fp32"], m["cosine_vs_minirt_fp32"] = rel_l2(ys[prec], y), cosine(ys[prec], y)
        ort_on = not a.no_ort and onnx_bytes(model) < we.EXTERNAL_DATA_THRESHOLD
        if not a.no_ort and not ort_on:
            print(f"Whisper-{size}: no onnxruntime peer (its {onnx_bytes(model) / 1e9:.1f} GB of weights pass "
                  f"protobuf's 2 GiB, which an in-memory model must serialize to)", file=sys.stderr)
        if ort_on:
            yo, r["onnxruntime_cpu"] = bench_ort(model, x, max(5, a.runs // 5), 2)
            for prec in precisions + [f"minirt_fp32_{s}" for s in schemes]:
                m = r[prec] if prec.startswith("minirt_fp32_") else r["minirt" if prec == "fp32" else f"minirt_{prec}"]
                m["cosine_vs_onnxruntime"] = cosine(ys[prec], yo)
                m["max_abs_diff_vs_onnxruntime"] = float(np.abs(ys[prec] - yo).max())
                m["max_abs_onnxruntime"] = float(np.abs(yo).max())
        if not a.no_torch:
            for prec in precisions:
                try:
                    yt, tr = bench_torch(model, x, a.runs, a.warmup, prec)
                except ImportError as e:
                    yt, tr = None, None
                    print(f"torch not available: {e}", file=sys.stderr)
                if tr:
                    tr["cosine_vs_minirt"] = cosine(yt, ys[prec])
                    tr["cosine_vs_minirt_fp32"] = cosine(yt, y)
                    m = r["minirt" if prec == "fp32" else f"minirt_{prec}"]
                    tr["gemm_us"] = cublas_times(m["gemms"], prec, a.runs)
                    r[f"torch_cuda_{prec}"] = tr
        results.append(r)
        print_table(r, precisions)
        for prec in precisions if a.batch else ():
            batches = [int(b) for b in a.batch.split(",")]
            r[f"batches_{prec}"] = bench_batches(we, size, batches, prec, a, opts, not a.no_torch)
            print_batches(size, prec, r[f"batches_{prec}"], a.frames)
        for scheme in schemes:
            print_split(r, scheme)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
        print(f"wrote {a.json}")
    return 0


def print_table(r, precisions=("fp32",)):
    for prec in precisions:
        m = r["minirt" if prec == "fp32" else f"minirt_{prec}"]
        base = m["wall_ms"]
        print(f"\nWhisper-{r['size']} encoder, input [1, mels, {r.get('frames', 3000)}], {prec}; "
              f"{m['gflop']:.1f} GFLOP in {m['dispatches']} "
              f"dispatches; {m['device']}, storage {m['storage']}")
        print(f"{'runtime':<34} {'median ms':>10} {'min ms':>8} {'vs minirt wall':>15}")
        rows = [("minirt Session.run (wall)", m["wall_ms"], m["wall_min_ms"]),
                ("minirt, outputs kept (wall)", m["kept_wall_ms"], m["kept_wall_min_ms"]),
                ("minirt, into one out= (wall)", m["out_wall_ms"], m["out_wall_min_ms"]),
                ("minirt GPU time (query pool)", m["gpu_ms"], None),
                ("minirt GPU span (two stamps)", m["gpu_span_ms"], None)]
        t = r.get(f"torch_cuda_{prec}")
        if t:
            rows += [(f"PyTorch CUDA {prec} eager", t["eager_wall_ms"], t["eager_wall_min_ms"]),
                     (f"PyTorch CUDA {prec} + CUDA graph", t["graph_wall_ms"], t["graph_wall_min_ms"])]
        o = r.get("onnxruntime_cpu")
        if o:
            rows.append(("onnxruntime CPU (fp32)", o["wall_ms"], o["wall_min_ms"]))
        for name, med, mn in rows:
            print(f"{name:<34} {med:>10.3f} {('%.3f' % mn) if mn else '':>8} {med / base:>14.2f}x")
        extra = [f"GPU throughput {m['gflop'] / m['gpu_ms']:.2f} TFLOP/s", f"{m['distinct_outputs']} distinct output(s)"]
        if "cosine_vs_onnxruntime" in m:
            extra.append(f"cosine vs onnxruntime {m['cosine_vs_onnxruntime']:.8f}")
        if "rel_l2_vs_minirt_fp32" in m:
            extra.append(f"vs minirt fp32: rel L2 {m['rel_l2_vs_minirt_fp32']:.2e}, cosine {m['cosine_vs_minirt_fp32']:.7f}")
        if t:
            extra.append(f"cosine torch vs minirt {t['cosine_vs_minirt']:.8f}")
        print("; ".join(extra))
        if m.get("gemms"):
            print_gemms(m, t.get("gemm_us") if t else None)


def print_split(r, scheme):
    """minirt fp32 with fp32_precision=scheme beside the ieee run of the same process."""
    m, ieee = r[f"minirt_fp32_{scheme}"], r["minirt"]
    print(f"\nWhisper-{r['size']} encoder, fp32, fp32_precision {scheme} (ieee: the fp32 run above); {m['device']}")
    print(f"{'':<34} {scheme:>10} {'ieee':>10} {'ratio':>8}")
    for name, key in (("minirt GPU time (query pool), ms", "gpu_ms"),
                      ("minirt GPU span (two stamps), ms", "gpu_span_ms"), ("minirt Session.run (wall), ms", "wall_ms")):
        print(f"{name:<34} {m[key]:>10.3f} {ieee[key]:>10.3f} {m[key] / ieee[key]:>7.2f}x")
    extra = [f"{m['distinct_outputs']} distinct output(s)",
             f"vs ieee: rel L2 {m['rel_l2_vs_minirt_fp32']:.2e}, cosine {m['cosine_vs_minirt_fp32']:.9f}"]
    if "cosine_vs_onnxruntime" in m:
        extra.append(f"vs onnxruntime: cosine {m['cosine_vs_onnxruntime']:.9f} "
                     f"(ieee {ieee['cosine_vs_onnxruntime']:.9f}), max |diff| {m['max_abs_diff_vs_onnxruntime']:.3g} "
                     f"(ieee {ieee['max_abs_diff_vs_onnxruntime']:.3g}) of max |y| {m['max_abs_onnxruntime']:.3g}")
    print("; ".join(extra))
    mine, theirs = attention_us(m.get("dispatch_us", [])), attention_us(ieee.get("dispatch_us", []))
    if mine and theirs:
        kernels = sorted({k for _, ks in mine.values() for k in ks})
        print(f"attention (per-dispatch stamps), us a layer: {scheme} "
              f"{' / '.join(f'{us:.1f}' for us, _ in mine.values())} ({'+'.join(kernels)}); ieee "
              f"{' / '.join(f'{us:.1f}' for us, _ in theirs.values())} "
              f"({'+'.join(sorted({k for _, ks in theirs.values() for k in ks}))})")
    if m.get("gemms"):
        print_gemms(m)


if __name__ == "__main__":
    sys.path[:0] = [str(ROOT), str(ROOT / "models")]   # the checkout's minirt, models/whisper_encoder.py
    sys.exit(main())
