#!/usr/bin/env python3
"""Build a Whisper encoder ONNX model with seeded random weights (no torch).

The graph mirrors what torch.onnx (TorchScript exporter) emits for Hugging Face
transformers' WhisperEncoder, so the runtime is tested against realistic export
idioms: Linear as MatMul([in, out] weight) + Add, Erf-GELU (opset 17) or Gelu
(opset 20), LayerNormalization, and Reshape targets computed at run time via
Shape -> Gather -> Unsqueeze -> Concat chains that a runtime must fold.

    python models/whisper_encoder.py --size tiny --opset 17 \
        -o models/whisper-tiny-encoder.onnx --sample-input models/whisper-tiny-input.npy

With real weights: build_whisper_encoder(weights=hf_dict) or --weights ckpt.safetensors takes a
Hugging Face-named state dict (`model.encoder.conv1.weight`, ..., prefix optional) instead of random
ones; hf_state_dict(model) maps a built model's initializers back to those names.
"""
from __future__ import annotations

import argparse
import math
import os
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# name: (d_model, layers, heads, n_mels)
SIZES = {
    "tiny": (384, 4, 6, 80),
    "base": (512, 6, 8, 80),
    "small": (768, 12, 12, 80),
    "medium": (1024, 24, 16, 80),
    "large": (1280, 32, 20, 80),
    "large-v2": (1280, 32, 20, 80),
    "large-v3": (1280, 32, 20, 128),
    # large-v3's encoder, kept whole by the models distilled from it (they cut decoder layers)
    "large-v3-turbo": (1280, 32, 20, 128),
    "distil-large-v3": (1280, 32, 20, 128),
}

# protobuf refuses to serialize messages over 2 GiB; stay clear of it.
EXTERNAL_DATA_THRESHOLD = int(1.8e9)


class _GraphBuilder:
    """Accumulates nodes/initializers, naming them the way torch.onnx does
    ("/layers.0/self_attn/q_proj/MatMul" -> "..._output_0")."""

    def __init__(self, seed: int, weights: dict | None = None):
        self.rng = np.random.default_rng(seed)
        self.weights = weights      # HF names without prefix -> array, or None for random weights
        self.used: set = set()
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._names: Counter = Counter()
        self._matmul_id = 1000

    def _unique(self, base: str) -> str:
        n = self._names[base]
        self._names[base] += 1
        return base if n == 0 else f"{base}_{n}"

    def op(self, op_type, inputs, scope, out=None, **attrs) -> str:
        name = self._unique(f"{scope}/{op_type}")
        out = out or f"{name}_output_0"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def const(self, value, scope, dtype=np.int64) -> str:
        # Constant nodes (not initializers) for small literals, as torch emits them.
        arr = np.asarray(value, dtype=dtype)
        return self.op("Constant", [], scope, value=numpy_helper.from_array(arr))

    def init(self, name, arr) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, np.float32), name))
        return name

    def randn(self, *shape, scale=1.0):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    def param(self, hf_name, shape, make, transpose=False):
        """The HF parameter `hf_name` when weights were given (transposed for MatMul), else make()."""
        if self.weights is None:
            return make()
        if hf_name not in self.weights:
            raise ValueError(f"weights: '{hf_name}' is missing")
        w = np.asarray(self.weights[hf_name], np.float32)
        w = w.T if transpose else w
        if w.shape != tuple(shape):
            raise ValueError(f"weights: '{hf_name}' has shape {list(w.T.shape if transpose else w.shape)}, "
                             f"expected {list(shape[::-1] if transpose else shape)}")
        self.used.add(hf_name)
        return w

    # -- layers -------------------------------------------------------------
    def linear(self, x, d_in, d_out, scope, param, bias=True) -> str:
        # torch.onnx stores the transposed weight as an anonymous "onnx::MatMul_N".
        self._matmul_id += 1
        w = self.init(f"onnx::MatMul_{self._matmul_id}",
                      self.param(f"{param}.weight", (d_in, d_out),
                                 lambda: self.randn(d_in, d_out, scale=d_in ** -0.5), transpose=True))
        y = self.op("MatMul", [x, w], scope)
        if bias:
            b = self.init(f"{param}.bias", self.param(f"{param}.bias", (d_out,), lambda: self.randn(d_out, scale=0.05)))
            y = self.op("Add", [b, y], scope)
        return y

    def layer_norm(self, x, d, scope, param, out=None) -> str:
        w = self.init(f"{param}.weight", self.param(f"{param}.weight", (d,), lambda: 1.0 + self.randn(d, scale=0.1)))
        b = self.init(f"{param}.bias", self.param(f"{param}.bias", (d,), lambda: self.randn(d, scale=0.1)))
        return self.op("LayerNormalization", [x, w, b], scope, out=out, axis=-1, epsilon=1e-5)

    def gelu(self, x, scope, opset) -> str:
        if opset >= 20:
            return self.op("Gelu", [x], scope, approximate="none")
        f32 = np.float32
        t = self.op("Div", [x, self.const(1.4142135381698608, scope, f32)], scope)
        t = self.op("Erf", [t], scope)
        t = self.op("Add", [t, self.const(1.0, scope, f32)], scope)
        t = self.op("Mul", [x, t], scope)
        return self.op("Mul", [t, self.const(0.5, scope, f32)], scope)

    def dim(self, shape, index, scope) -> str:
        """Gather one dim out of a Shape and Unsqueeze it to a 1-element vector."""
        d = self.op("Gather", [shape, self.const(index, scope)], scope, axis=0)
        return self.op("Unsqueeze", [d, self.const([0], scope)], scope)

    def shape_of(self, x, parts, scope) -> str:
        """Reshape target from x's runtime dims: parts are ints (dim index of x)
        or lists (literal pieces), e.g. [0, 1, [6], [64]] -> [B, T, 6, 64]."""
        shape = self.op("Shape", [x], scope)
        pieces = [self.dim(shape, p, scope) if isinstance(p, int) else self.const(p, scope)
                  for p in parts]
        return self.op("Concat", pieces, scope, axis=0)

    def attention(self, x, d, heads, scope, param) -> str:
        head_dim = d // heads
        s = f"{scope}/self_attn"
        q = self.linear(x, d, d, f"{s}/q_proj", f"{param}.q_proj")
        q = self.op("Mul", [q, self.const(head_dim ** -0.5, s, np.float32)], s)
        k = self.linear(x, d, d, f"{s}/k_proj", f"{param}.k_proj", bias=False)  # HF: no k bias
        v = self.linear(x, d, d, f"{s}/v_proj", f"{param}.v_proj")

        def split_heads(t, seq):
            # HF's _shape(): q uses tgt_len, k/v use -1 for the sequence dim.
            t = self.op("Reshape", [t, self.shape_of(x, [0, seq, [heads], [head_dim]], s)], s)
            return self.op("Transpose", [t], s, perm=[0, 2, 1, 3])

        q, k, v = split_heads(q, 1), split_heads(k, [-1]), split_heads(v, [-1])
        kt = self.op("Transpose", [k], s, perm=[0, 1, 3, 2])
        p = self.op("Softmax", [self.op("MatMul", [q, kt], s)], s, axis=-1)
        o = self.op("Transpose", [self.op("MatMul", [p, v], s)], s, perm=[0, 2, 1, 3])
        o = self.op("Reshape", [o, self.shape_of(x, [0, 1, [d]], s)], s)
        return self.linear(o, d, d, f"{s}/out_proj", f"{param}.out_proj")


def _sinusoids(length: int, channels: int) -> np.ndarray:
    # Whisper's fixed encoder positions (HF stores them as embed_positions.weight).
    inc = math.log(10000) / (channels // 2 - 1)
    inv = np.exp(-inc * np.arange(channels // 2))
    t = np.arange(length)[:, None] * inv[None, :]
    return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


_ENCODER_PREFIXES = ("model.encoder.", "encoder.", "")


def encoder_weights(weights: dict) -> dict:
    """The encoder part of a HF Whisper state dict, prefix ('model.encoder.', 'encoder.' or none) removed."""
    prefix = next((p for p in _ENCODER_PREFIXES if p + "conv1.weight" in weights), None)
    if prefix is None:
        raise ValueError("weights: no conv1.weight (as model.encoder.conv1.weight, encoder.conv1.weight "
                         "or conv1.weight): not a Whisper encoder state dict")
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def hf_state_dict(model: onnx.ModelProto, prefix: str = "model.encoder.") -> dict:
    """A built encoder's initializers under Hugging Face names: the anonymous MatMul weights
    ("onnx::MatMul_N", [in, out]) get the name of their node's scope ("/layers.0/fc1/MatMul" ->
    "layers.0.fc1.weight"), transposed to torch's [out, in]; the rest already carry HF names."""
    users = {}
    for n in model.graph.node:
        for i in n.input:
            users.setdefault(i, []).append(n)
    out = {}
    for t in model.graph.initializer:
        arr = numpy_helper.to_array(t)
        name = t.name
        if name.startswith("onnx::MatMul_"):
            (node,) = users[name]
            scope = node.name.rsplit("/", 1)[0].strip("/")
            name, arr = scope.replace("/", ".") + ".weight", arr.T
        out[prefix + name] = np.ascontiguousarray(arr)
    return out


def build_whisper_encoder(size="tiny", opset=17, layers=None, d_model=None, heads=None,
                          seed=0, dynamic_batch=False, n_mels=None, n_frames=None,
                          weights=None) -> onnx.ModelProto:
    """weights: a HF-named state dict (see encoder_weights) to use instead of random weights; then
    d_model, layers, n_mels and n_frames (2 x positions) come from it, heads from d_model / 64."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {sorted(SIZES)}")
    if opset not in (17, 20):
        raise ValueError("opset must be 17 or 20")
    d0, l0, h0, m0 = SIZES[size]
    if weights is not None:
        weights = encoder_weights(weights)
        d0, m0 = np.shape(weights["conv1.weight"])[:2]
        l0 = 1 + max((int(k.split(".")[1]) for k in weights if k.startswith("layers.")), default=-1)
        h0 = max(d0 // 64, 1)
        if n_frames is None and "embed_positions.weight" in weights:
            n_frames = 2 * np.shape(weights["embed_positions.weight"])[0]
    n_frames = n_frames or 3000
    d, n_layers, heads, n_mels = d_model or d0, layers or l0, heads or h0, n_mels or m0
    if d % heads:
        raise ValueError(f"d_model {d} not divisible by heads {heads}")
    n_pos = (n_frames + 1) // 2  # conv2: kernel 3, stride 2, pad 1
    batch = "batch" if dynamic_batch else 1

    g = _GraphBuilder(seed, weights)
    x = "input_features"
    for name, c_in, stride in (("conv1", n_mels, 1), ("conv2", d, 2)):
        w = g.init(f"{name}.weight", g.param(f"{name}.weight", (d, c_in, 3),
                                             lambda: g.randn(d, c_in, 3, scale=(3 * c_in) ** -0.5)))
        b = g.init(f"{name}.bias", g.param(f"{name}.bias", (d,), lambda: g.randn(d, scale=0.05)))
        x = g.op("Conv", [x, w, b], f"/{name}", dilations=[1], group=1,
                 kernel_shape=[3], pads=[1, 1], strides=[stride])
        x = g.gelu(x, f"/{name}", opset)
    x = g.op("Transpose", [x], "", perm=[0, 2, 1])
    x = g.op("Add", [x, g.init("embed_positions.weight", g.param("embed_positions.weight", (n_pos, d),
                                                                 lambda: _sinusoids(n_pos, d)))], "")

    for i in range(n_layers):
        s, p = f"/layers.{i}", f"layers.{i}"
        h = g.layer_norm(x, d, f"{s}/self_attn_layer_norm", f"{p}.self_attn_layer_norm")
        x = g.op("Add", [x, g.attention(h, d, heads, s, f"{p}.self_attn")], s)
        h = g.layer_norm(x, d, f"{s}/final_layer_norm", f"{p}.final_layer_norm")
        h = g.gelu(g.linear(h, d, 4 * d, f"{s}/fc1", f"{p}.fc1"), s, opset)
        x = g.op("Add", [x, g.linear(h, 4 * d, d, f"{s}/fc2", f"{p}.fc2")], s)
    g.layer_norm(x, d, "/layer_norm", "layer_norm", out="last_hidden_state")
    if weights is not None and set(weights) - g.used:
        raise ValueError(f"weights: {len(set(weights) - g.used)} tensor(s) this encoder does not use, such as "
                         f"{sorted(set(weights) - g.used)[:4]}")

    graph = helper.make_graph(
        g.nodes, "main_graph",
        [helper.make_tensor_value_info("input_features", TensorProto.FLOAT, [batch, n_mels, n_frames])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, [batch, n_pos, d])],
        initializer=g.inits,
    )
    # Opset 20 needs IR 9; keep the lowest IR that works, as older exporters do.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="minirt-whisper-encoder-builder",
                              ir_version=8 if opset <= 17 else 9)
    what = "given weights" if weights is not None else f"random weights (seed {seed})"
    model.doc_string = (f"Whisper {size} encoder, {what}: d_model={d} "
                        f"layers={n_layers} heads={heads} n_mels={n_mels} n_frames={n_frames}")
    return model


def save(model: onnx.ModelProto, path: str, external_data: bool = False) -> None:
    """Save; weights go to <stem>.data next to path when forced or when the
    proto would be too large. Note: external-data saving mutates `model`."""
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if not (external_data or size > EXTERNAL_DATA_THRESHOLD):
        onnx.save_model(model, path)
        return
    location = os.path.splitext(os.path.basename(path))[0] + ".data"
    data_path = os.path.join(os.path.dirname(os.path.abspath(path)), location)
    if os.path.exists(data_path):
        os.remove(data_path)  # onnx appends to an existing data file
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=location, size_threshold=1024)


def sample_input(n_mels=80, n_frames=3000, seed=1) -> np.ndarray:
    """A [1, n_mels, n_frames] float32 array shaped like Whisper's normalized
    log-mel ((log10 mel + 4) / 4): time-smoothed, louder in low bands, in [-1, 1.5]."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal((n_mels, n_frames + 4))
    smooth = sum(noise[:, k:k + n_frames] for k in range(5)) / math.sqrt(5)
    tilt = 0.8 - 0.6 * np.linspace(0.0, 1.0, n_mels)[:, None]
    return np.clip(tilt + 0.4 * smooth, -1.0, 1.5).astype(np.float32)[None]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--opset", type=int, default=17, choices=(17, 20))
    ap.add_argument("--layers", type=int, help="override the number of layers")
    ap.add_argument("--d-model", type=int, help="override d_model (test configs)")
    ap.add_argument("--heads", type=int, help="override the number of heads (test configs)")
    ap.add_argument("--n-mels", type=int, help="override the mel bins (default per size)")
    ap.add_argument("--n-frames", type=int, default=None, help="input frames (T = n_frames/2; default 3000)")
    ap.add_argument("--weights", metavar="CKPT.safetensors",
                    help="Hugging Face-named Whisper weights to use instead of random ones")
    ap.add_argument("--seed", type=int, default=0, help="weight seed")
    ap.add_argument("--dynamic-batch", action="store_true", help='symbolic batch dim "batch"')
    ap.add_argument("-o", "--output", help="default: models/whisper-<size>-encoder.onnx")
    ap.add_argument("--external-data", action="store_true", help="force external weight file")
    ap.add_argument("--sample-input", metavar="PATH.npy", help="also write a sample input")
    ap.add_argument("--input-seed", type=int, default=1, help="sample input seed")
    ap.add_argument("--check", action="store_true", help="run onnx.checker on the saved file")
    args = ap.parse_args(argv)

    weights = None
    if args.weights:
        from minirt.loaders.safetensors_loader import read_safetensors   # F16 / BF16 widened
        weights = read_safetensors(args.weights)
    model = build_whisper_encoder(args.size, args.opset, args.layers, args.d_model, args.heads,
                                  args.seed, args.dynamic_batch, args.n_mels, args.n_frames, weights)
    n_mels = model.graph.input[0].type.tensor_type.shape.dim[1].dim_value
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      f"whisper-{args.size}-encoder.onnx")
    save(model, out, args.external_data)
    if args.check:
        onnx.checker.check_model(out)  # by path, so external data and >2 GB work
    print(f"wrote {out}: {len(model.graph.node)} nodes, {n_params / 1e6:.1f}M params; {model.doc_string}")
    if args.sample_input:
        n_frames = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
        np.save(args.sample_input, sample_input(n_mels, n_frames, args.input_seed))
        print(f"wrote {args.sample_input}: [1, {n_mels}, {n_frames}] float32")


if __name__ == "__main__":
    main()
