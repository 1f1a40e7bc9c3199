#!/usr/bin/env python3
"""Whisper decoding benchmark: minirt's Vulkan encoder and decoder (minirt.whisper.vulkan) beside Hugging Face
transformers on CUDA (when torch with CUDA and transformers import; --torch-device cpu for the CPU), on the same seeded random weights, the same
log-mel window and a fixed number of decoded tokens (no end of text: both sides do the same work).

  python tools/bench_transcribe.py --sizes tiny,base --tokens 224 --beams 1,5 --json transcribe.json
  python tools/bench_transcribe.py --model whisper-tiny.en --audio speech.wav --beams 1,5   # real-time factor
  python tools/bench_transcribe.py --sizes tiny --batch 16 --runs 3        # files/s: a batch of 16 vs one by one
  python tools/bench_transcribe.py --sizes large-v3,large-v3-turbo --beams 1 --precision fp16   # the large shapes

Figures, each a median over --runs windows after one untimed window:
  encoder ms     encode() alone (the encoder and every layer's cross-attention keys and values)
  step ms        one decode step, wall: the submission, the logits back, and the host's selection of the next
                 tokens (greedy: argmax; beam: log-softmax, the top beam_size of beam_size x vocab, cache reorder)
  window ms      a 30 s window end to end: encode, the 4-token prompt, --tokens steps
--batch N: files per second for N synthetic 30 s clips (N different log-mel windows), each an encoder run, the
4-token prompt and --tokens greedy tokens (<|endoftext|> suppressed, so every clip decodes the same length), decoded
one by one (encode, start, steps) and as one batch (encode_batch, the prompts and the steps of N rows: BatchDecoder),
on the same VulkanBackend; the median of --runs after one untimed round each, and the ratio. Each step's tokens are
picked on the GPU (step_select, step_rows_select: only the pick comes back); --host-select reads every step's logits
back and picks on the host instead. With --e2e also the whole host path (features, filters, segments) through
WhisperModel.transcribe and transcribe_batch, whose greedy steps pick on the GPU, or with --host-select run the
filters, log-softmax and argmax on the host. --profile: GPU time per dispatch of a one-row step, a step of N rows
(the select dispatch's line among them) and the batch's encoder.
transformers peers (each where it runs): `loop`, a hand-written loop over the model with its key/value cache
(greedy: argmax on the GPU); `generate` (greedy and beam search, min_new_tokens = max_new_tokens = --tokens), with
the dynamic cache and with cache_implementation="static". fp32 peers run with TF32 off. --precision fp16: minirt's
whole program at fp16 (weights, activations and the key/value cache in 16-bit storage, fp32 arithmetic), the peers in
torch.float16.
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


def bench_batch(weights, cfg, args, precision):
    """{"one_by_one_fps", "batched_fps", "ratio", ...}: see the module doc (--batch)."""
    from minirt.ops.token_select import control, suppress_bits
    from minirt.whisper.vulkan import VulkanBackend
    n, eot = args.batch, EOT
    feats = np.random.default_rng(1).standard_normal((n, cfg["num_mel_bins"], 3000)).astype(np.float32)
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
    head = f"{size} {precision} batch={r.get('clips', '?')}"
    if "error" in r:
        print(f"{head}: failed: {r['error']}")
        return
    print(f"{head}: {r['tokens']} tokens a 30 s clip, tokens picked on the {r['select'].upper()}: one by one {r['one_by_one_fps']:.2f} files/s, batched "
          f"{r['batched_fps']:.2f} files/s: {r['ratio']:.2f}x (the same tokens: {r['same_tokens']}; "
          f"dispatches {r['dispatches']})")
    if "e2e_ratio" in r:
        print(f"    end to end (WhisperModel.transcribe / transcribe_batch): one by one {r['e2e_one_by_one_fps']:.2f} "
              f"files/s, batched {r['e2e_batched_fps']:.2f} files/s: {r['e2e_ratio']:.2f}x (the same tokens: "
              f"{r['e2e_same_tokens']})")
    print_profile(r.get("profile", {}), 8)
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
    import torch
    import transformers
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


def torch_ms(fn, runs):
    import torch
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
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


def torch_ready(device):
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        return False
    return device != "cuda" or torch.cuda.is_available()


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
    ap.add_argument("--torch-device", default="cuda", help="where the transformers peers run (default cuda)")
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
    if args.batch:
        if not 1 <= args.batch <= 32:
            ap.error("--batch must be 1..32")
        for size in sizes:
            weights = random_checkpoint(SIZES[size], 0)[0]
            for precision in args.precision.split(","):
                try:
                    row = bench_batch(weights, SIZES[size], args, precision)
                except Exception as e:
                    row = {"error": f"{type(e).__name__}: {e}"[:300]}
                results.append({"size": size, "precision": precision, "batch": row})
                print_batch(size, precision, row)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return
    use_torch = not args.no_torch and torch_ready(args.torch_device)
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
