#!/usr/bin/env python3
"""Whisper decoding benchmark: minirt's Vulkan encoder and decoder (minirt.whisper.vulkan) beside Hugging Face
transformers (when torch and transformers import: on CUDA where torch has it, else the CPU), on the same seeded random
weights, the same log-mel window and a fixed number of decoded tokens (no end of text: both sides do the same work).

  python tools/bench_transcribe.py --sizes tiny,base --tokens 224 --beams 1,5 --json transcribe.json
  python tools/bench_transcribe.py --model whisper-tiny.en --audio speech.wav --beams 1,5   # real-time factor
  python tools/bench_transcribe.py --sizes tiny --batch 16 --runs 3        # files/s: a batch of 16 vs one by one
  python tools/bench_transcribe.py --sizes large-v3,large-v3-turbo --beams 1 --precision fp16   # the large shapes
  python tools/bench_transcribe.py --sizes large-v3-turbo --batch 16 --tokens 64 --precision fp16,fp32 --runs 2
  python tools/bench_transcribe.py --sizes large-v3-turbo --precision fp16 --breakdown --rows 16,32 --runs 5

Figures, each a median over --runs windows after one untimed window:
  encoder ms     encode() alone (the encoder and every layer's cross-attention keys and values)
  step ms        one decode step, wall: the submission, the logits back, and the host's selection of the next
                 tokens (greedy: argmax; beam: log-softmax, the top beam_size of beam_size x vocab, cache reorder)
  window ms      a 30 s window end to end: encode, the 4-token prompt, --tokens steps
--batch N: files per second for N synthetic 30 s clips (N different log-mel windows), each an encoder run, the
4-token prompt and --tokens greedy tokens (<|endoftext|> suppressed, so every clip decodes the same length), decoded
one by one (encode, start, steps) and as one batch (encode_batch, the prompts and the steps of N rows: BatchDecoder),
on the same VulkanBackend; the median of --runs after one untimed round each, and the ratio. Beside them (where the
transformers peers run) transformers' batched generate on the same clips and weights: greedy, the same prompt,
min_new_tokens = max_new_tokens = --tokens and <|endoftext|> suppressed, with the dynamic and the static cache, the
clips starting in host memory as minirt's do; the table gives each runtime's files/s and minirt batched's ratio to
it, and whether minirt's batched tokens equal its one-by-one tokens. Each step's tokens are
picked on the GPU (step_select, step_rows_select: only the pick comes back); --host-select reads every step's logits
back and picks on the host instead. With --e2e also the whole host path (features, filters, segments) through
WhisperModel.transcribe and transcribe_batch, whose greedy steps pick on the GPU, or with --host-select run the
filters, log-softmax and argmax on the host. --profile: GPU time per dispatch of a one-row step, a step of N rows
(the select dispatch's line among them) and the batch's encoder.
--breakdown: where the GPU time goes (Program(profile=True): a stamp after every dispatch; the median of --runs after
one untimed run) for the one-window encoder (`encode`: the encoder and every decoder layer's cross-attention keys and
values) and for a batched greedy step of each of --rows rows (bstepN_select, as --batch decodes): per dispatch kind
(each GEMM by role and M x K x N, attention, layer norms, cache writes, token select, ...), summed, with the planner's
FLOPs and bytes as TFLOP/s, GB/s and a floor (FLOPs at the card's dense peak or bytes at its bandwidth, the larger),
and the run's floors: its FLOPs at the peak, its weights' bytes and all its bytes at the bandwidth. The peaks come
from the device's name (CARD_PEAKS: H100 SXM 989 TFLOP/s fp16 dense, 67 fp32, 3.35 TB/s; H200 4.8 TB/s), or
--peak-tflops and --peak-tbps.
transformers peers (each where it runs; --torch-device auto: CUDA where torch has it, else the CPU): `loop`, a
hand-written loop over the model with its key/value cache (greedy: argmax on the GPU); `generate` (greedy and beam
search, min_new_tokens = max_new_tokens = --tokens), with the dynamic cache and with cache_implementation="static".
fp32 peers run with TF32 off. --precision fp16: minirt's whole program at fp16 (weights, activations and the
key/value cache in 16-bit storage, fp32 arithmetic), the peers in torch.float16.
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
sys.path.insert(0, str(ROOT))

PROMPT = [50258, 50259, 50359, 50363]     # <|startoftranscript|><|en|><|transcribe|><|notimestamps|> (multilingual)
EOT = 50257


def log_softmax(x):
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def minirt_window(vb, feats, tokens, beams, times):
    """One window: encode, prompt, `tokens` steps; appends (encode ms, prompt ms, [step ms]) to times."""
    t0 = time.perf_counter()
    vb.encode(feats)
    t1 = time.perf_counter()
    logits = vb.start(PROMPT, [len(PROMPT) - 1])
    t2 = time.perf_counter()
    steps = []
    if beams == 1:
        tok = int(np.argmax(logits[0]))
        for _ in range(tokens):
            s = time.perf_counter()
            logits = vb.step(np.array([tok]))
            tok = int(np.argmax(logits[0]))
            steps.append(time.perf_counter() - s)
    else:
        lp = log_softmax(logits[0])
        best = np.argpartition(-lp, beams)[:beams]
        scores, toks = lp[best], best
        vb.reorder(np.zeros(beams, np.int64))
        n_vocab = logits.shape[-1]
        for _ in range(tokens):
            s = time.perf_counter()
            logits = vb.step(toks)
            cand = (scores[:, None] + log_softmax(logits)).reshape(-1)
            best = np.argpartition(-cand, beams)[:beams]
            rows, toks, scores = best // n_vocab, best % n_vocab, cand[best]
            vb.reorder(rows)
            steps.append(time.perf_counter() - s)
    times.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, [x * 1e3 for x in steps]))
    return toks if beams > 1 else tok


def batch_clips(cfg, n):
    """n different synthetic 30 s log-mel windows [n, mels, 3000] (seeded): the clips of --batch and --breakdown."""
    return np.random.default_rng(1).standard_normal((n, cfg["num_mel_bins"], 3000)).astype(np.float32)


def bench_batch(weights, cfg, args, precision, feats):
    """{"one_by_one_fps", "batched_fps", "ratio", ...} of the clips feats: see the module doc (--batch)."""
    from minirt.ops.token_select import control, suppress_bits
    from minirt.whisper.vulkan import VulkanBackend
    n, eot = len(feats), EOT
    bits, ctl = suppress_bits([eot], cfg["vocab_size"]), control(n, cfg["vocab_size"])

    def pick(logits):
        logits = np.array(logits, np.float32)
        logits[:, eot] = -np.inf
        return logits.argmax(-1)

    if args.host_select:
        def step(vb, tok):
            return pick(vb.step(tok))

        def step_rows(vb, tok):
            return pick(vb.step_rows(tok))
    else:
        def step(vb, tok):
            return vb.step_select(tok, bits, ctl[:1])[:, 0].astype(np.int64)

        def step_rows(vb, tok):
            return vb.step_rows_select(tok, bits, ctl[:len(tok)])[:, 0].astype(np.int64)

    def one_by_one(vb):
        out = []
        for f in feats:
            vb.encode(f)
            tok = pick(vb.start(PROMPT, [len(PROMPT) - 1]))
            seq = [int(tok[0])]
            for _ in range(args.tokens):
                tok = step(vb, tok)
                seq.append(int(tok[0]))
            out.append(seq)
        return out

    def batched(vb):
        vb.encode_batch(feats)
        vb.start_rows(range(n))
        for t in PROMPT:
            tok = step_rows(vb, np.full(n, t))
        seqs = [tok]
        for _ in range(args.tokens):
            tok = step_rows(vb, tok)
            seqs.append(tok)
        return np.stack(seqs, 1).tolist()

    res = {"clips": n, "tokens": args.tokens, "select": "host" if args.host_select else "gpu"}
    with VulkanBackend(weights, cfg, precision=precision, max_batch=1, max_items=n, options=args.options,
                       profile=args.profile, gpu_select=not args.host_select) as vb:
        for name, fn in (("one_by_one", one_by_one), ("batched", batched)):
            got = fn(vb)
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                fn(vb)
                times.append(time.perf_counter() - t0)
            res[f"{name}_fps"] = n / statistics.median(times)
            res[f"{name}_tokens"] = got
        res["same_tokens"] = res.pop("one_by_one_tokens") == res.pop("batched_tokens")
        if args.profile:        # the last runs' GPU time per dispatch: a one-row step and a step of n rows
            steps = ("step1", f"bstep{n}") if args.host_select else ("step1_select", f"bstep{n}_select")
            res["profile"] = {e: vb.program.dispatch_times(e) for e in steps + ("bencode",)}
        res["dispatches"] = {k: len(p.dispatches) for k, p in vb.plans.items() if k.startswith("b")}
        res["device"] = vb.program.device.profile.name
    if args.e2e:
        res.update(bench_batch_e2e(cfg, args, precision))
    res["ratio"] = res["batched_fps"] / res["one_by_one_fps"]
    return res


def bench_batch_e2e(cfg, args, precision):
    """Files per second through WhisperModel.transcribe (one by one) and transcribe_batch, a 51864-token English
    vocabulary (tokenizer_json), every timestamp and <|endoftext|> suppressed (one window of --tokens tokens a clip)."""
    import tempfile

    from minirt.whisper import WhisperModel
    from minirt.whisper.synthetic import write_folder
    cfg = dict(cfg, vocab_size=51864)
    clips = [np.random.default_rng(10 + i).standard_normal(30 * 16000).astype(np.float32) * 0.1
             for i in range(args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        model = WhisperModel(write_folder(tmp, cfg, 0), precision=precision, max_batch_items=args.batch)
        model.backend.gpu_select = not args.host_select
        tok = model.tokenizer
        opts = dict(beam_size=1, temperature=0.0, without_timestamps=True, condition_on_previous_text=False,
                    suppress_tokens=[tok.eot] + list(range(tok.timestamp_begin, cfg["vocab_size"])),
                    no_speech_threshold=None, log_prob_threshold=None, compression_ratio_threshold=None,
                    max_new_tokens=None)
        if args.tokens != 224:
            raise SystemExit("--e2e decodes Whisper's 224 tokens a window: leave --tokens at 224")

        def one_by_one():
            return [[s.tokens for s in model.transcribe(c, **opts)[0]] for c in clips]

        def batched():
            return [[s.tokens for s in segs] for segs, _ in model.transcribe_batch(clips, **opts)]
        res = {}
        for name, fn in (("e2e_one_by_one", one_by_one), ("e2e_batched", batched)):
            got = fn()
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            res[f"{name}_fps"] = len(clips) / statistics.median(times)
            res[f"{name}_tokens"] = got
        res["e2e_same_tokens"] = res.pop("e2e_one_by_one_tokens") == res.pop("e2e_batched_tokens")
        res["e2e_ratio"] = res["e2e_batched_fps"] / res["e2e_one_by_one_fps"]
        model.backend.close()
    return res


def print_profile(profile: dict, top: int) -> None:
    """Each entry point's GPU time ({entry: [(node, kernel, us)]}), its `top` slowest dispatches and its token
    selection's."""
    for entry, rows in profile.items():
        total = sum(t for _, _, t in rows)
        print(f"    {entry}: {total:.1f} us of GPU time in {len(rows)} dispatches; the most:")
        slowest = sorted(rows, key=lambda x: -x[2])[:top]
        for node, kernel, t in slowest + [r for r in rows if r[1].startswith("token_select") and r not in slowest]:
            print(f"      {t:8.1f} us  {kernel:32s} {node}")


def print_batch(size, precision, r):
    """The --batch table: files per second of minirt (batched, one by one) and of each transformers peer, and minirt
    batched's ratio to each."""
    head = f"{size} {precision}, {r.get('clips', '?')} clips of 30 s"
    if "error" in r:
        print(f"{head}: minirt failed: {r['error']}")
        return
    print(f"\n{head}, {r['tokens']} tokens each (greedy, <|endoftext|> suppressed; minirt picks the tokens on the "
          f"{r['select'].upper()}); minirt on {r['device']}")
    n = r["clips"]
    rows = [("minirt batched", r["batched_fps"]), ("minirt one by one", r["one_by_one_fps"])]
    if "e2e_ratio" in r:
        rows += [("minirt WhisperModel.transcribe_batch", r["e2e_batched_fps"]),
                 ("minirt WhisperModel.transcribe, one by one", r["e2e_one_by_one_fps"])]
    errors = []
    for peer, t in r.get("transformers", {}).items():
        name = f"transformers {peer.replace('/', ', ')} cache"
        if "error" in t:
            errors.append(f"  {name}: {t['error']}")
        else:
            rows.append((name, t["fps"]))
    print(f"  {'runtime':<44} {'files/s':>9} {'s a batch':>10} {'minirt batched / this':>22}")
    for name, fps in rows:
        print(f"  {name:<44} {fps:>9.2f} {n / fps:>10.3f} {r['batched_fps'] / fps:>21.2f}x")
    for line in errors:
        print(line)
    print(f"  minirt's batched tokens equal its one-by-one tokens: {'yes' if r['same_tokens'] else 'NO'}"
          + (f"; transcribe_batch's equal transcribe's: {'yes' if r['e2e_same_tokens'] else 'NO'}"
             if "e2e_same_tokens" in r else "") + f"; dispatches {r['dispatches']}")
    print_profile(r.get("profile", {}), 8)
    sys.stdout.flush()


# -- --breakdown: where the GPU time goes, beside the floors ----------------------------------------------------
# Dense peak rates for the floors: (name contains, fp16 tensor-core FLOP/s, fp32 FLOP/s, memory bytes/s); the first
# match wins. --peak-tflops and --peak-tbps override them (other cards).
CARD_PEAKS = (("H200", 989e12, 67e12, 4.8e12), ("H100 PCIe", 756e12, 51e12, 2.0e12),
              ("H100", 989e12, 67e12, 3.35e12))

# A GEMM's role from its node name (decoder_graph's step names, the exported encoder's), as the table prints it
_ROLE_NAMES = {"self_attn/q_proj+k_proj+v_proj": "q/k/v", "self_attn/out_proj": "out_proj", "fc1": "fc1 (+GELU)",
               "fc2": "fc2 (+residual)", "cross_k": "cross K (decoder layers)", "cross_v": "cross V (decoder layers)",
               "q+k+v": "self-attn q/k/v", "x1": "self-attn out_proj", "cq": "cross-attn q_proj",
               "x2": "cross-attn out_proj", "x3": "fc2 (+residual)", "logits": "logits"}


def node_role(node: str) -> str:
    """"/layers.3/fc1/MatMul" -> "fc1 (+GELU)", "layers.0/cq" -> "cross-attn q_proj", "cross_k.2@new" -> "cross K
    (decoder layers)": the node's name without its layer, read through _ROLE_NAMES (unknown names as they are)."""
    import re
    name = re.sub(r"^/?layers\.\d+/", "", node)
    name = re.sub(r"/(MatMul|Conv|Add|LayerNormalization|Attention)$", "", name).lstrip("/")
    name = re.sub(r"\.\d+(@\w+)?$", "", name)
    return _ROLE_NAMES.get(name, name)


def gemm_shape(plan, d):
    """"MxKxN" of a GEMM dispatch: the few-row kernel's rows, k and n, else M and K from the activation it reads
    (its first read that is no weight) and N from the FLOPs the planner counted (2 M K N); "" where they disagree."""
    from minirt.plan import CONSTANT, PARAMS, SCRATCH, WEIGHT
    info = d.info or {}
    if {"rows", "k", "n"} <= info.keys():
        return f"{info['rows']}x{info['k']}x{info['n']}"
    acts = [t for t in d.reads if plan.tensors[t].role not in (WEIGHT, CONSTANT, SCRATCH, PARAMS)]
    if not acts or not d.flops:
        return ""
    shape = plan.tensors[acts[0]].shape
    m, k = int(np.prod(shape[:-1])), int(shape[-1])
    n = d.flops / (2 * m * k)
    return f"{m}x{k}x{round(n)}" if n >= 1 and abs(n - round(n)) <= 0.01 * n else ""


def is_gemm(d) -> bool:
    """Whether dispatch d is a GEMM (a Linear's, a convolution's), not the reduce pass of one's K splits."""
    stem = d.stem or d.kernel
    return not stem.startswith("linear_reduce") and (d.family == "gemm" or stem.startswith(("linear", "gemm",
                                                                                             "matmul")))


def dispatch_kind(plan, d, last_gemm: str = "") -> str:
    """The row of the --breakdown table a dispatch of `plan` counts in: a GEMM by role and shape (its K-split reduce
    pass beside it: last_gemm, the kind of the GEMM dispatched before), the front end's convolutions, attention (the
    encoder's; the decoder's self- and cross-attention over the cache), layer norms, token selection, ..."""
    stem = d.stem or d.kernel
    if stem.startswith("linear_reduce"):
        return f"{last_gemm or 'GEMM'}, K-split reduce"
    if d.op == "Conv" or stem in ("im2col", "conv"):
        return f"front end {node_role(d.node)} ({stem})"
    if is_gemm(d):
        shape = gemm_shape(plan, d)
        return f"GEMM {node_role(d.node)}" + (f" {shape}" if shape else "")
    if stem == "cached_attention":
        return "cross-attention over 1500 keys" if "cross" in d.node else "self-attention over the cache"
    if stem == "attention_combine":
        return "attention, key-split combine"
    if stem.startswith("attention"):
        return "self-attention"
    if stem.startswith("layer_norm"):
        return "layer norm"
    if stem == "copy_rows":
        return "embeddings, cache writes (copy_rows)"
    if stem == "token_select":
        return "token select"
    return f"{d.op or 'other'} ({stem})"


def breakdown(plan, us) -> list:
    """[(kind, dispatches, GPU us, FLOPs, bytes)] of one run of `plan` (us: GPU microseconds per dispatch, in plan
    order), a row per dispatch_kind, the most time first; FLOPs and bytes are the planner's counts."""
    groups, last = {}, ""
    for d, t in zip(plan.dispatches, us):
        kind = dispatch_kind(plan, d, last)
        if is_gemm(d):
            last = kind
        g = groups.setdefault(kind, [0, 0.0, 0, 0])
        g[0] += 1
        g[1] += t
        g[2] += d.flops
        g[3] += d.bytes
    return sorted(((k, *v) for k, v in groups.items()), key=lambda r: -r[2])


def weight_bytes(plan) -> int:
    """Bytes of the weights (role WEIGHT, each once) that a run of `plan` reads."""
    from minirt.plan import WEIGHT
    roots = {plan.root(t) for d in plan.dispatches for t in d.reads}
    return sum(plan.tensors[t].nbytes for t in roots if plan.tensors[t].role == WEIGHT)


def peaks_of(device: str, precision: str, args):
    """(FLOP/s, bytes/s) for the floors: --peak-tflops / --peak-tbps, else CARD_PEAKS by the device's name; None for
    what neither gives."""
    card = next((c for c in CARD_PEAKS if c[0] in device), None)
    flops = args.peak_tflops * 1e12 if args.peak_tflops else card and card[1 if precision == "fp16" else 2]
    bw = args.peak_tbps * 1e12 if args.peak_tbps else card and card[3]
    return flops, bw


def profile_entry(vb, entry, run, runs):
    """(median GPU us per dispatch, median wall ms) of `runs` calls of run() that each run entry point `entry` once,
    after one untimed call."""
    per, walls = [], []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        run()
        wall = (time.perf_counter() - t0) * 1e3
        if i:
            per.append([t for *_, t in vb.program.dispatch_times(entry)])
            walls.append(wall)
    if not per[0]:
        raise RuntimeError(f"'{vb.program.device.profile.name}' gives no GPU timestamps")
    return [statistics.median(ts) for ts in zip(*per)], statistics.median(walls)


def bench_breakdown(weights, cfg, args, precision):
    """--breakdown: GPU time per dispatch kind of the one-window encoder (`encode`: the encoder and every decoder
    layer's cross-attention keys and values) and of a batched greedy step of each of --rows rows (bstepN_select, the
    GPU picking the tokens, as --batch runs it), beside the floors. {entry: {...}}."""
    from minirt.ops.token_select import control, suppress_bits
    from minirt.whisper.decoder_graph import select_entry
    from minirt.whisper.vulkan import VulkanBackend
    rows = sorted({int(r) for r in args.rows.split(",")})
    feats = batch_clips(cfg, max(rows))
    bits, ctl = suppress_bits([EOT], cfg["vocab_size"]), control(max(rows), cfg["vocab_size"])
    out = {}
    with VulkanBackend(weights, cfg, precision=precision, max_batch=1, max_items=max(rows), options=args.options,
                       profile=True) as vb:
        device = vb.program.device.profile.name

        def entry_row(entry, us, wall, what):
            plan = vb.plans[entry]
            return {"entry": entry, "what": what, "device": device, "wall_ms": wall, "gpu_us": sum(us),
                    "dispatches": len(us), "flops": sum(d.flops for d in plan.dispatches),
                    "bytes": sum(d.bytes for d in plan.dispatches), "weight_bytes": weight_bytes(plan),
                    "kinds": breakdown(plan, us)}
        us, wall = profile_entry(vb, "encode", lambda: vb.encode(feats[0]), args.runs)
        out["encode"] = entry_row("encode", us, wall, "the encoder of one 30 s window and the decoder layers' "
                                                      "cross-attention keys and values")
        vb.encode_batch(feats[:vb.max_items])
        for r in rows:
            entry = select_entry(f"bstep{r}")
            if entry not in vb.plans:
                out[entry] = {"error": f"no {entry}: the batch holds {vb.max_items} sequences, its steps "
                                       f"{sorted(k for k in vb.plans if k.startswith('bstep'))}"}
                continue
            vb.start_rows(range(r))
            tok = np.full(r, PROMPT[0])
            for t in PROMPT:        # the prompt, then a few tokens: the steps timed read a short self-attention cache
                tok = vb.step_rows_select(np.full(r, t), bits, ctl[:r])[:, 0].astype(np.int64)

            def step():
                nonlocal tok
                tok = vb.step_rows_select(tok, bits, ctl[:r])[:, 0].astype(np.int64)
            us, wall = profile_entry(vb, entry, step, args.runs)
            out[entry] = entry_row(entry, us, wall, f"one greedy step of {r} row{'s' if r > 1 else ''} (the batch's sequences), "
                                                    f"the tokens picked on the GPU")
    return out


def print_breakdown(size, precision, res, args):
    """The --breakdown tables: a row per dispatch kind, the total, and the run's floors."""
    def fmt(v, spec):
        return format(v, spec) if v else "-"
    for entry, r in res.items():
        if "error" in r:
            print(f"\n{size} {precision} {entry}: {r['error']}")
            continue
        peak, bw = peaks_of(r["device"], precision, args)
        print(f"\n{size} {precision} `{entry}`: {r['what']}; {r['device']}; medians of {args.runs} runs, a stamp "
              f"after every dispatch")
        print(f"  {'dispatch kind':<52} {'n':>4} {'GPU us':>9} {'share':>6} {'TFLOP/s':>8} {'GB/s':>7} "
              f"{'floor us':>9}")
        for kind, n, us, fl, by in r["kinds"]:
            floor = max(fl / peak if peak else 0, by / bw if bw else 0) * 1e6
            print(f"  {kind[:52]:<52} {n:>4} {us:>9.1f} {us / r['gpu_us']:>6.1%} "
                  f"{fmt(fl / max(us, 1e-9) / 1e6, '.1f'):>8} {fmt(by / max(us, 1e-9) / 1e3, '.0f'):>7} "
                  f"{fmt(floor, '.1f'):>9}")
        print(f"  {'total':<52} {r['dispatches']:>4} {r['gpu_us']:>9.1f}   (wall {r['wall_ms']:.3f} ms a run)")
        floors = [("FLOPs", r["flops"] / 1e9, "GFLOP", peak and r["flops"] / peak),
                  ("weights", r["weight_bytes"] / 1e6, "MB", bw and r["weight_bytes"] / bw),
                  ("all bytes moved (the planner's count)", r["bytes"] / 1e6, "MB", bw and r["bytes"] / bw)]
        rates = (f"at {peak / 1e12:.0f} TFLOP/s and {bw / 1e12:.2f} TB/s" if peak and bw else
                 "no peak rates for this card: --peak-tflops, --peak-tbps")
        print(f"  floors ({rates}):")
        for name, amount, unit, secs in floors:
            print(f"    {name:<40} {amount:>10.1f} {unit:<6}" + (f" {secs * 1e6:>9.1f} us: GPU time "
                                                                  f"{r['gpu_us'] / (secs * 1e6):.2f}x" if secs else ""))
    sys.stdout.flush()


def summarise(times, tokens):
    enc = statistics.median(t[0] for t in times)
    prompt = statistics.median(t[1] for t in times)
    step = statistics.median(x for t in times for x in t[2])
    window = statistics.median(t[0] + t[1] + sum(t[2]) for t in times)
    return {"encoder_ms": enc, "prompt_ms": prompt, "step_ms": step, "window_ms": window, "tokens": tokens}


def bench_minirt(weights, cfg, args, precision, beams):
    from minirt.whisper.vulkan import VulkanBackend
    feats = np.random.default_rng(1).standard_normal((cfg["num_mel_bins"], 3000)).astype(np.float32)
    t0 = time.perf_counter()
    with VulkanBackend(weights, cfg, precision=precision, max_batch=beams, options=args.options) as vb:
        setup = time.perf_counter() - t0
        times = []
        for i in range(args.runs + 1):
            minirt_window(vb, feats, args.tokens, beams, times)
        res = summarise(times[1:], args.tokens)
        res["setup_s"] = setup
        if args.words:
            res["align_ms"] = align_ms(vb, weights, cfg, args)
        res["dispatches"] = {k: len(p.dispatches) for k, p in vb.plans.items()}
    if args.profile:
        with VulkanBackend(weights, cfg, precision=precision, max_batch=beams, options=args.options,
                           profile=True) as vb:
            minirt_window(vb, feats, args.tokens, beams, [])
            entry = f"step{beams}"
            res["profile"] = {e: vb.program.dispatch_times(e) for e in ("encode", entry)}
    return res


def align_ms(vb, weights, cfg, args):
    """Word timestamps' alignment of a window (VulkanBackend.align: the decoder over the start sequence, --tokens
    text tokens (at most 227) and <|endoftext|>, the alignment heads' attention and the tokens' probabilities back),
    on every head of the last half of the decoder layers (a random checkpoint's); the median of --runs after one."""
    from minirt.whisper.words import default_alignment_heads
    eot = 50257 if cfg["vocab_size"] >= 51865 else 50256
    vb.add_align(default_alignment_heads(cfg["decoder_layers"], cfg["decoder_attention_heads"]), eot, weights)
    vb.encode(np.random.default_rng(2).standard_normal((cfg["num_mel_bins"], 3000)).astype(np.float32))
    text = np.random.default_rng(3).integers(0, eot, min(args.tokens, 227)).tolist()
    tokens = PROMPT + text + [eot]
    ts = []
    for _ in range(args.runs + 1):
        t0 = time.perf_counter()
        vb.align(tokens, 3000)
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts[1:])


# -- transformers --------------------------------------------------------------------------------------------------
def hf_model(cfg, seed):
    import warnings

    import torch
    import transformers
    transformers.logging.set_verbosity_error()      # its notes on deprecated arguments would bury the figures
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    torch.manual_seed(seed)
    hc = transformers.WhisperConfig(
        vocab_size=cfg["vocab_size"], num_mel_bins=cfg["num_mel_bins"], d_model=cfg["d_model"],
        encoder_layers=cfg["encoder_layers"], decoder_layers=cfg["decoder_layers"],
        encoder_attention_heads=cfg["encoder_attention_heads"], decoder_attention_heads=cfg["decoder_attention_heads"],
        encoder_ffn_dim=4 * cfg["d_model"], decoder_ffn_dim=4 * cfg["d_model"],
        max_source_positions=cfg["max_source_positions"], max_target_positions=cfg["max_target_positions"])
    return transformers.WhisperForConditionalGeneration(hc).eval()


def weights_of(model):
    """minirt's weights dict (HF names, float32 numpy) from a transformers Whisper."""
    return {k: v.detach().float().cpu().numpy().copy() for k, v in model.state_dict().items()}


def torch_ms(fn, runs, warm=True):
    """Median wall ms of `runs` calls of fn, each to its GPU work's end, after one untimed call (warm=False: the
    caller made it)."""
    import torch
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    if warm:
        fn()
    sync()
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        sync()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def bench_hf(model, cfg, args, precision, beams):
    """{peer: {"window_ms", "step_ms", "encoder_ms"}} for what runs; failures as {"error": ...}."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = torch.float16 if precision == "fp16" else torch.float32
    dev = args.torch_device
    m = model.to(dev, dt)
    feats = torch.from_numpy(np.random.default_rng(1).standard_normal((1, cfg["num_mel_bins"], 3000))
                             .astype(np.float32)).to(dev, dt)
    prompt = torch.tensor([PROMPT], device=dev)
    out = {}
    with torch.inference_mode():
        enc = torch_ms(lambda: m.model.encoder(feats), args.runs)
        if beams == 1:
            def loop():
                h = m.model.encoder(feats).last_hidden_state
                r = m(encoder_outputs=(h,), decoder_input_ids=prompt, use_cache=True)
                past, tok = r.past_key_values, r.logits[:, -1:].argmax(-1)
                for _ in range(args.tokens):
                    r = m(encoder_outputs=(h,), decoder_input_ids=tok, past_key_values=past, use_cache=True)
                    past, tok = r.past_key_values, r.logits[:, -1:].argmax(-1)
                return tok
            try:
                w = torch_ms(loop, args.runs)
                out["loop"] = {"window_ms": w, "step_ms": (w - enc) / args.tokens, "encoder_ms": enc}
            except Exception as e:      # a transformers version without this call shape
                out["loop"] = {"error": f"{type(e).__name__}: {e}"[:200]}
        for cache in ("dynamic", "static"):
            kw = dict(decoder_input_ids=prompt, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                      num_beams=beams, do_sample=False)
            if cache == "static":
                kw["cache_implementation"] = "static"

            def gen():
                # GenerationMixin's generate: Whisper's own adds its language / timestamp logic, not wanted here
                return super(type(m), m).generate(input_features=feats, **kw)
            try:
                n = gen().shape[-1]     # the new tokens, or the prompt and the new tokens
                if n not in (args.tokens, args.tokens + len(PROMPT)):
                    raise RuntimeError(f"generated {n} tokens, not {args.tokens}")
                w = torch_ms(gen, args.runs)
                out[f"generate/{cache}"] = {"window_ms": w, "step_ms": (w - enc) / args.tokens, "encoder_ms": enc}
            except Exception as e:
                out[f"generate/{cache}"] = {"error": f"{type(e).__name__}: {e}"[:200]}
    model.to("cpu", torch.float32)
    return out


def bench_hf_batch(model, args, precision, feats):
    """transformers' batched generate on the clips feats (the same as minirt's --batch), greedy, the 4-token prompt
    and min_new_tokens = max_new_tokens = --tokens with <|endoftext|> suppressed (every clip decodes the same count),
    with the dynamic cache and with cache_implementation="static": {peer: {"fps", "batch_ms"} or {"error"}}. The
    clips start in host memory, as minirt's do; the median of --runs after one untimed call (where the static cache
    compiles). fp32 with TF32 off."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dt = torch.float16 if precision == "fp16" else torch.float32
    dev = args.torch_device
    m = model.to(dev, dt)
    n = len(feats)
    prompt = torch.tensor([PROMPT] * n, device=dev)
    out = {}
    with torch.inference_mode():
        for cache in ("dynamic", "static"):
            kw = dict(decoder_input_ids=prompt, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                      suppress_tokens=[EOT], num_beams=1, do_sample=False)
            if cache == "static":
                kw["cache_implementation"] = "static"

            def gen():
                x = torch.from_numpy(feats).to(dev, dt)
                # GenerationMixin's generate: Whisper's own adds its language / timestamp logic, not wanted here
                return super(type(m), m).generate(input_features=x, **kw)
            try:
                got = gen()
                if got.shape[0] != n or got.shape[-1] not in (args.tokens, args.tokens + len(PROMPT)):
                    raise RuntimeError(f"generated {list(got.shape)}, not {n} x {args.tokens} tokens")
                ms = torch_ms(gen, args.runs, warm=False)
                out[cache] = {"fps": n / ms * 1e3, "batch_ms": ms}
            except Exception as e:
                out[cache] = {"error": f"{type(e).__name__}: {e}"[:200]}
    model.to("cpu", torch.float32)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()        # the next precision's minirt program takes the GPU memory back
    return {f"generate/{k}": v for k, v in out.items()}


def bench_real(args):
    """--model DIR --audio FILE...: transcribe each file with a real checkpoint (after one untimed warm-up on the
    first), printing audio seconds, wall seconds and the real-time factor (wall / audio: below 1 is faster than
    real time), for each precision and beam size asked."""
    from minirt.whisper import WhisperModel
    from minirt.whisper.audio_input import load_audio
    audio = [load_audio(a) for a in args.audio]
    rows = []
    for precision in args.precision.split(","):
        model = WhisperModel(args.model, precision=precision)
        for beams in (int(b) for b in args.beams.split(",")):
            list(model.transcribe(audio[0], beam_size=beams)[0])
            for name, a in zip(args.audio, audio):
                t0 = time.perf_counter()
                segments, info = model.transcribe(a, beam_size=beams)
                text = " ".join(s.text.strip() for s in segments)
                wall = time.perf_counter() - t0
                row = {"audio": name, "precision": precision, "beams": beams, "audio_s": info.duration,
                       "wall_s": wall, "rtf": wall / max(info.duration, 1e-9), "backend": model.backend.name,
                       "text": text}
                rows.append(row)
                print(f"{Path(name).name} {precision} beams={beams} ({row['backend']}): {info.duration:.1f} s of "
                      f"audio in {wall * 1e3:.1f} ms, real-time factor {row['rtf']:.5f} "
                      f"({1 / max(row['rtf'], 1e-12):.0f}x real time): {text[:80]!r}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def torch_ready(args):
    """Whether the transformers peers run: torch and transformers import, and the device asked for is there;
    --torch-device auto becomes cuda where torch sees a CUDA device, else cpu."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        return False
    if args.torch_device == "auto":
        args.torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    return not args.torch_device.startswith("cuda") or torch.cuda.is_available()


def print_header(args, use_torch):
    """The line above every table: the commit, minirt's Vulkan device, and the peers' versions and device."""
    from benchconfig import commit
    from minirt.driver import get_device
    line = f"commit {commit()}; minirt on {get_device(None).profile.name} (Vulkan)"
    if use_torch:
        import torch
        import transformers
        dev = args.torch_device
        name = torch.cuda.get_device_name(torch.device(dev)) if dev.startswith("cuda") else "the CPU"
        line += f"; transformers {transformers.__version__}, torch {torch.__version__} on {name} ({dev})"
    print(line, flush=True)


def main(argv=None):
    from minirt.whisper.synthetic import SIZES, random_checkpoint
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--tokens", type=int, default=224, help="decoded tokens a window (default 224)")
    ap.add_argument("--beams", default="1,5", help="beam sizes, comma-separated (1: greedy)")
    ap.add_argument("--precision", default="fp32", help="fp32 and/or fp16, comma-separated")
    ap.add_argument("--runs", type=int, default=5, help="timed windows per figure (default 5)")
    ap.add_argument("--no-torch", action="store_true", help="leave out the transformers peers")
    ap.add_argument("--profile", action="store_true",
                    help="also GPU time per dispatch of the encoder and of the window's last step")
    ap.add_argument("--torch-device", default="auto",
                    help="where the transformers peers run (default auto: cuda where torch has it, else cpu)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a Session option for minirt's plans (`minirt options`), repeatable")
    ap.add_argument("--model", help="a real Whisper checkpoint folder: with --audio, transcribe files and print the "
                                    "real-time factor instead of the synthetic benchmark")
    ap.add_argument("--audio", nargs="+", help="audio files for --model")
    ap.add_argument("--batch", type=int, default=0, metavar="N",
                    help="files per second: N synthetic 30 s clips as one batch vs one by one (see above)")
    ap.add_argument("--e2e", action="store_true", help="with --batch: also through WhisperModel, host work included")
    ap.add_argument("--host-select", action="store_true",
                    help="with --batch: every step's logits back and the tokens picked on the host (to compare with "
                         "the default, the pick on the GPU)")
    ap.add_argument("--words", action="store_true",
                    help="also time word timestamps' alignment of a window (align ms; the default alignment heads)")
    ap.add_argument("--breakdown", action="store_true",
                    help="GPU time per dispatch kind of the one-window encoder and of a batched step of each of "
                         "--rows rows, beside the floors (FLOPs at the card's peak, bytes at its bandwidth)")
    ap.add_argument("--rows", default="16,32", help="with --breakdown: the step's rows, comma-separated (up to 32)")
    ap.add_argument("--peak-tflops", type=float, help="with --breakdown: the card's dense peak at the precision "
                    "(default by the device's name: 989 fp16 on an H100 SXM or H200, 67 fp32)")
    ap.add_argument("--peak-tbps", type=float, help="with --breakdown: the card's memory bandwidth in TB/s "
                    "(default by the device's name: 3.35 on an H100 SXM, 4.8 on an H200)")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    from minirt.errors import MinirtError
    from minirt.options import Options
    args.options = dict(o.partition("=")[::2] for o in args.option)
    try:
        Options.make(args.options)
    except MinirtError as e:
        ap.error(f"--option: {e}")
    if bool(args.model) != bool(args.audio):
        ap.error("--model and --audio go together")
    if args.model:
        return bench_real(args)
    sizes = [s for s in args.sizes.split(",") if s]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        ap.error(f"unknown size(s) {bad}: choose from {', '.join(SIZES)}")
    if not 1 <= args.tokens <= 448 - len(PROMPT):
        ap.error(f"--tokens must be 1..{448 - len(PROMPT)}")
    results = []
    if args.breakdown:
        rows = [r for r in args.rows.split(",") if r]
        if not rows or not all(r.isdigit() and 1 <= int(r) <= 32 for r in rows):
            ap.error("--rows: row counts of 1..32, comma-separated")
        print_header(args, False)
        for size in sizes:
            weights = random_checkpoint(SIZES[size], 0)[0]
            for precision in args.precision.split(","):
                res = bench_breakdown(weights, SIZES[size], args, precision)
                results.append({"size": size, "precision": precision, "breakdown": res})
                print_breakdown(size, precision, res, args)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return
    use_torch = not args.no_torch and torch_ready(args)
    if args.batch:
        if not 1 <= args.batch <= 32:
            ap.error("--batch must be 1..32")
        print_header(args, use_torch)
        for size in sizes:
            cfg = SIZES[size]
            # the peers' weights: transformers' own initialisation, copied into minirt (as for one window)
            model = hf_model(cfg, 0) if use_torch else None
            weights = weights_of(model) if use_torch else random_checkpoint(cfg, 0)[0]
            feats = batch_clips(cfg, args.batch)
            for precision in args.precision.split(","):
                try:
                    row = bench_batch(weights, cfg, args, precision, feats)
                except Exception as e:
                    row = {"error": f"{type(e).__name__}: {e}"[:300]}
                if use_torch and "error" not in row:
                    row["transformers"] = bench_hf_batch(model, args, precision, feats)
                results.append({"size": size, "precision": precision, "batch": row})
                print_batch(size, precision, row)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return
    print_header(args, use_torch)
    for size in sizes:
        cfg = SIZES[size]
        model = hf_model(cfg, 0) if use_torch else None
        weights = weights_of(model) if use_torch else random_checkpoint(cfg, 0)[0]
        for precision in args.precision.split(","):
            for beams in (int(b) for b in args.beams.split(",")):
                row = {"size": size, "precision": precision, "beams": beams}
                try:
                    row["minirt"] = bench_minirt(weights, cfg, args, precision, beams)
                except Exception as e:
                    row["minirt"] = {"error": f"{type(e).__name__}: {e}"[:300]}
                if use_torch:
                    row["transformers"] = bench_hf(model, cfg, args, precision, beams)
                results.append(row)
                print_row(row)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def print_row(row):
    head = f"{row['size']} {row['precision']} beams={row['beams']}"
    mr = row["minirt"]
    if "error" in mr:
        print(f"{head}: minirt failed: {mr['error']}")
        return
    print(f"{head}: minirt encoder {mr['encoder_ms']:.3f} ms, prompt {mr['prompt_ms']:.3f} ms, "
          f"step {mr['step_ms']:.4f} ms, window {mr['window_ms']:.2f} ms ({mr['tokens']} tokens; "
          f"dispatches {mr['dispatches']})")
    if "align_ms" in mr:
        print(f"    word timestamps: align {mr['align_ms']:.2f} ms a window")
    print_profile(mr.get("profile", {}), 12)
    for peer, r in row.get("transformers", {}).items():
        if "error" in r:
            print(f"    transformers {peer}: {r['error']}")
        else:
            print(f"    transformers {peer}: step {r['step_ms']:.4f} ms ({r['step_ms'] / mr['step_ms']:.2f}x minirt), "
                  f"window {r['window_ms']:.2f} ms ({r['window_ms'] / mr['window_ms']:.2f}x), "
                  f"encoder {r['encoder_ms']:.3f} ms")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
