#!/usr/bin/env python3
"""Exports small random-weight transformer text models to ONNX for tests/test_text_families.py, which runs them
against onnxruntime: BERT (BertModel), DistilBERT, GPT-2 (GPT2Model, no cache), the T5 encoder (T5EncoderModel) and
the Whisper decoder (WhisperModel's decoder, the encoder's hidden states as a float input, no cache). Each is 2
layers, hidden size 64, 4 heads, a vocabulary of 1000, with seeded weights, in eval mode, for sequences of 16 tokens
(a dynamic batch and sequence). Inputs: input_ids and attention_mask (int64); the Whisper decoder also takes
encoder_hidden_states (float32, 24 encoder positions).

Each model is written twice: by torch's TorchScript exporter at opset 17 (models/families/<name>.onnx) and by
torch.export's exporter (dynamo=True) at opset 20 (<name>_dynamo.onnx).

Needs torch, transformers, onnx and onnxscript, which minirt does not depend on; used: torch 2.13 (CPU),
transformers 5.24, onnxscript 0.7.2, in a separate venv:
    /path/to/venv/bin/python tools/export_text_families.py [--only bert,gpt2] [--out DIR]
"""
from __future__ import annotations

import argparse
import io
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "models" / "families"
OPSET, DYNAMO_OPSET = 17, 20
SEQ, VOCAB, HIDDEN, HEADS, LAYERS, ENC_SEQ = 16, 1000, 64, 4, 2, 24
FAMILIES = ("bert", "gpt2", "distilbert", "t5_encoder", "whisper_decoder")


def build(name, **size):
    """(module, input names, example inputs) for one family, seeded, in eval mode. size: hidden, heads, layers,
    vocab, positions (defaults: the small test configuration)."""
    import torch
    import transformers as tf
    h, nh, nl = size.get("hidden", HIDDEN), size.get("heads", HEADS), size.get("layers", LAYERS)
    vocab, pos, seq = size.get("vocab", VOCAB), size.get("positions", 64), size.get("seq", SEQ)
    torch.manual_seed(0)
    if name == "bert":
        cfg = tf.BertConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=nl, num_attention_heads=nh,
                            intermediate_size=4 * h, max_position_embeddings=pos)
        inner = tf.BertModel(cfg, add_pooling_layer=False)
    elif name == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=vocab, dim=h, n_layers=nl, n_heads=nh, hidden_dim=4 * h,
                                  max_position_embeddings=pos)
        inner = tf.DistilBertModel(cfg)
    elif name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=h, n_layer=nl, n_head=nh, n_positions=pos, use_cache=False)
        inner = tf.GPT2Model(cfg)
    elif name == "t5_encoder":
        cfg = tf.T5Config(vocab_size=vocab, d_model=h, d_kv=h // nh, d_ff=4 * h, num_layers=nl, num_heads=nh,
                          use_cache=False, attn_implementation="eager")
        # eager attention: torch.export's decomposition cannot view SDPA's transposed output as T5 reshapes it
        inner = tf.T5EncoderModel(cfg)
    elif name == "whisper_decoder":
        cfg = tf.WhisperConfig(vocab_size=vocab, d_model=h, decoder_layers=nl, decoder_attention_heads=nh,
                               encoder_layers=1, encoder_attention_heads=nh, decoder_ffn_dim=4 * h,
                               encoder_ffn_dim=4 * h, max_target_positions=pos, max_source_positions=ENC_SEQ,
                               pad_token_id=1, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2,
                               use_cache=False)
        inner = tf.WhisperModel(cfg).get_decoder()
    else:
        raise SystemExit(f"unknown family {name!r}: choose from {', '.join(FAMILIES)}")
    inner.eval()
    with torch.no_grad():      # LayerNorm weights and biases that are not the identity
        for n_, p in inner.named_parameters():
            if p.dim() == 1:
                p.add_(torch.empty_like(p).uniform_(-0.1, 0.1))

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask, *encoder_hidden_states):
            kw = {"use_cache": False} if name in ("gpt2", "whisper_decoder") else {}
            if encoder_hidden_states:
                kw["encoder_hidden_states"] = encoder_hidden_states[0]
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kw).last_hidden_state

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (2, seq), generator=g)
    mask = torch.ones(2, seq, dtype=torch.int64)
    mask[1, -3:] = 0
    if name == "whisper_decoder":
        enc = torch.randn(2, ENC_SEQ, h, generator=g)
        return M().eval(), ["input_ids", "attention_mask", "encoder_hidden_states"], (ids, mask, enc)
    return M().eval(), ["input_ids", "attention_mask"], (ids, mask)


def export(model, names, example, dynamo) -> bytes:
    import torch
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            # static shapes: torch.export's symbolic shapes fail on T5's attention reshape (torch 2.13)
            prog = torch.onnx.export(model, example, input_names=names, output_names=["last_hidden_state"],
                                     opset_version=DYNAMO_OPSET, dynamo=True)
            prog.save(f)
        else:
            axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                    "encoder_hidden_states": {0: "batch"}, "last_hidden_state": {0: "batch", 1: "seq"}}
            axes = {k: v for k, v in axes.items() if k in names or k == "last_hidden_state"}
            torch.onnx.export(model, example, f, opset_version=OPSET, input_names=names,
                              output_names=["last_hidden_state"], dynamic_axes=axes, dynamo=False)
    return f.getvalue()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(FAMILIES), help="comma-separated families")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only.split(","):
        model, names, example = build(name)
        for dynamo in (False, True):
            path = out / f"{name}{'_dynamo' if dynamo else ''}.onnx"
            path.write_bytes(export(model, names, example, dynamo))
            print(f"{path}: {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main()
