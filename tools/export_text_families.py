#!/usr/bin/env python3
"""Exports small random-weight transformer text models to ONNX for tests/test_text_families.py, which runs them
against onnxruntime: BERT (BertModel), DistilBERT, GPT-2 (GPT2Model, no cache), the T5 encoder (T5EncoderModel) and
the Whisper decoder (WhisperModel's decoder, the encoder's hidden states as a float input, no cache). Each is 2
layers, hidden size 64, 4 heads, a feed-forward width of 128, a vocabulary of 1000, with seeded weights (LayerNorm
weights and biases moved off the identity), in eval mode. Inputs: input_ids and attention_mask (int64, batch 2 and
16 tokens); the Whisper decoder also takes encoder_hidden_states (float32, 24 encoder positions).

Each model is written twice: by torch's TorchScript exporter at opset 17 with a dynamic batch and sequence
(models/families/<name>.onnx), and by torch.export's exporter (dynamo=True) at opset 20 with static shapes
(<name>_dynamo.onnx; torch.export's symbolic shapes fail on T5's attention reshape in torch 2.13). T5 is built with
eager attention (torch.export's decomposition cannot view SDPA's transposed output as T5 reshapes it); the others
with transformers' default, SDPA.

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
    vocab, positions, ffn (the feed-forward width), seq (of the example inputs); defaults: the small test
    configuration (feed-forward width 2 x hidden, to keep the files small)."""
    import torch
    import transformers as tf
    h, nh, nl = size.get("hidden", HIDDEN), size.get("heads", HEADS), size.get("layers", LAYERS)
    vocab, pos, seq = size.get("vocab", VOCAB), size.get("positions", 64), size.get("seq", SEQ)
    ffn = size.get("ffn", 2 * h)
    torch.manual_seed(0)
    if name == "bert":
        cfg = tf.BertConfig(vocab_size=vocab, hidden_size=h, num_hidden_layers=nl, num_attention_heads=nh,
                            intermediate_size=ffn, max_position_embeddings=pos)
        inner = tf.BertModel(cfg, add_pooling_layer=False)
    elif name == "distilbert":
        cfg = tf.DistilBertConfig(vocab_size=vocab, dim=h, n_layers=nl, n_heads=nh, hidden_dim=ffn,
                                  max_position_embeddings=pos)
        inner = tf.DistilBertModel(cfg)
    elif name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=vocab, n_embd=h, n_layer=nl, n_head=nh, n_positions=pos, n_inner=ffn,
                            use_cache=False)
        inner = tf.GPT2Model(cfg)
    elif name == "t5_encoder":
        cfg = tf.T5Config(vocab_size=vocab, d_model=h, d_kv=h // nh, d_ff=ffn, num_layers=nl, num_heads=nh,
                          use_cache=False, attn_implementation="eager")
        inner = tf.T5EncoderModel(cfg)
    elif name == "whisper_decoder":
        cfg = tf.WhisperConfig(vocab_size=vocab, d_model=h, decoder_layers=nl, decoder_attention_heads=nh,
                               encoder_layers=1, encoder_attention_heads=nh, decoder_ffn_dim=ffn,
                               encoder_ffn_dim=ffn, max_target_positions=pos, max_source_positions=ENC_SEQ,
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
            prog = torch.onnx.export(model, example, input_names=names, output_names=["last_hidden_state"],
                                     opset_version=DYNAMO_OPSET, dynamo=True)
            prog.save(f)
            return _without_metadata(f.getvalue())
        else:
            axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                    "encoder_hidden_states": {0: "batch"}, "last_hidden_state": {0: "batch", 1: "seq"}}
            axes = {k: v for k, v in axes.items() if k in names or k == "last_hidden_state"}
            torch.onnx.export(model, example, f, opset_version=OPSET, input_names=names,
                              output_names=["last_hidden_state"], dynamic_axes=axes, dynamo=False)
    return f.getvalue()


def _without_metadata(data: bytes) -> bytes:
    """The model without the exporter's per-node source locations and doc strings (most of a small model's bytes)."""
    import onnx
    m = onnx.load_from_string(data)
    for n in m.graph.node:
        del n.metadata_props[:]
        n.doc_string = ""
    for vi in list(m.graph.value_info) + list(m.graph.input) + list(m.graph.output):
        del vi.metadata_props[:]
    return m.SerializeToString()


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
