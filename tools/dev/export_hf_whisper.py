#!/usr/bin/env python3
"""Export a Hugging Face transformers WhisperEncoder (random weights, tiny config by default) with
torch.onnx, to check that minirt runs what the real exporter produces. Needs torch and transformers
(a developer tool: CI does not run it).

  python tools/dev/export_hf_whisper.py -o /tmp/hf-whisper-tiny.onnx [--dynamo] [--opset 17]
"""
import argparse


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--dynamo", action="store_true", help="use the torch.export-based exporter")
    ap.add_argument("--d-model", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()
    import torch   # here, so that --help works without torch
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    torch.manual_seed(0)
    cfg = WhisperConfig(d_model=a.d_model, encoder_layers=a.layers, encoder_attention_heads=a.d_model // 64,
                        encoder_ffn_dim=4 * a.d_model, num_mel_bins=80, max_source_positions=1500)
    enc = WhisperEncoder(cfg).eval()
    with torch.no_grad():   # random biases and LayerNorm parameters, so nothing hides behind zeros or ones
        for name, p in enc.named_parameters():
            if name.endswith("bias") or "layer_norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(1, 80, 3000)

    class Wrap(torch.nn.Module):
        def __init__(self, e):
            super().__init__()
            self.e = e

        def forward(self, input_features):
            return self.e(input_features).last_hidden_state

    kw = dict(input_names=["input_features"], output_names=["last_hidden_state"], opset_version=a.opset)
    if a.dynamo:
        torch.onnx.export(Wrap(enc), (x,), a.output, dynamo=True, **kw)
    else:
        torch.onnx.export(Wrap(enc), (x,), a.output, dynamo=False,
                          dynamic_axes={"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}}, **kw)
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
