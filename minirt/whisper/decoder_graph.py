"""The graphs of a Whisper model as a minirt Program (minirt/program.py): entry points over shared state.

  encode   input_features [1, n_mels, 2 n_audio_ctx] -> the encoder (minirt.loaders.safetensors_loader's graph), then
           per decoder layer the cross-attention keys and values of its output, written into the state tensors
           cross_k.<i>, cross_v.<i> [1, n_audio_ctx, d_model]. Nothing comes back to the host.
  cross    encoder_output [1, n_audio_ctx, d_model] -> the same cross-attention keys and values from an encoder
           output computed elsewhere (an encoder Session, another device, a test's reference).
  stepN    tokens [N, 1] int32, parameter pos -> logits [N, 1, n_vocab]: one token per row at position pos (the
           token embedding is a runtime Gather, the positional one ParamRows at pos); per layer the new keys and
           values are written at row pos of the state tensors self_k.<i>, self_v.<i> [B, n_text_ctx, d_model]
           (CacheWrite, into the first N of their B rows) and self-attention is causal over rows 0 .. pos
           (CachedAttention), cross-attention reads cross_k / cross_v; the logits are the final layer norm times the
           token embedding transposed.
  promptP  tokens [1, P] int32, picks [2] int32, parameter pos -> logits [2, n_vocab]: a prompt of up to P tokens
           in one run (as stepN, Tq = P), and the logits at two of its positions; P = 8 (a start sequence) and 232
           (one with previous text).
  reorder  rows [B] int32, parameter len -> nothing: new cache row i = old row rows[i], positions 0 .. len - 1
           (ReorderRows on every self_k / self_v).
  step1_select
           step1, then greedy decoding's pick of the next token from the logits on the GPU (TokenSelect,
           minirt/ops/token_select.py): inputs tokens, suppress [ceil(n_vocab / 32)] int32 and select [1, 12] int32
           (the logit filters as masks: minirt/whisper/filters.py GpuMasks) -> selection [1, 4] float32; the logits
           stay on the GPU.
  alignP   tokens [1, P] int32, key_mask [n_audio_ctx] float32, picks [P] int32, parameter pos (0) -> attention
           [heads, P, n_audio_ctx] and token_probs [P, 1]: word timestamps' alignment (align_graph): the decoder over
           a whole sequence as promptP runs it, the softmax probabilities of the alignment heads' cross-attention
           over the encoder positions the mask leaves, and each next token's probability among the text tokens.
           Made on first use (add_align), for P = 64 and 232; it writes row 0 of the cache, which the next window's
           prompt writes afresh.

B is the program's batch (the most rows a search uses); there is a step entry point for 1 row and for B (greedy
decoding and a prompt of one token run the first, or step1_select where every logit filter is a mask; beam search and
sampling the second), and the Program shares their weights. Weights are
Hugging Face-named (model.encoder.*, model.decoder.*, proj_out.weight when not tied), as checkpoint.load_checkpoint
gives them. The graphs are float32 (int32 token ids, rows and picks); plan_program (minirt/whisper/vulkan.py) plans
them in buffer storage at fp32 or fp16.

A batch of independent sequences (batch_graphs: many windows decoded together, each with its own encoder output, its
own length, finishing on its own) has entry points of its own over state of its own, M sequences at most:
  bencode  input_features [M, n_mels, 2 n_audio_ctx] -> the encoder on M windows as one batch, then per decoder
           layer the cross-attention keys and values of each window's output into bcross_k.<i>, bcross_v.<i>
           [M, n_audio_ctx, d_model] (item m in row m). Where the device cannot hold the encoder's activations for
           M windows (batch_graphs' encode_chunk), it takes C < M windows a run, and a run writes them at window
           param(row0) / n_audio_ctx on (a CacheWrite along the batch axis after each key and value projection).
  bencodeK input_features [K, n_mels, 2 n_audio_ctx], parameter row0 -> the same on K < C windows (C: bencode's
           windows, M or the chunk), written at window param(row0) / n_audio_ctx on as a chunk's are, for K in
           encode_sizes(C): an encoder run costs its windows, padding included, so a batch of fewer windows runs
           the smallest that holds them (the encoder entry points of a batch share one activation arena).
  bstepN   tokens [N, 1] int32, parameters pos.0 .. pos.N-1 and item.0 .. item.N-1 -> logits [N, 1, n_vocab]: row r
           appends its token at its own position pos.r (ParamRows, CacheWrite and CachedAttention read a parameter a
           row: per_row) into row r of bself_k.<i>, bself_v.<i> [M, n_text_ctx, d_model], attends causally over its
           own 0 .. pos.r, and its cross-attention reads the keys and values of item item.r (CachedAttention's
           items map). Rows of one item (beams, best_of) can share its encoder output through that map.
  breorder rows [M] int32, parameter len -> nothing: as reorder, on bself_k / bself_v (dropping finished rows
           packs the live ones first, so a smaller bstepN runs them; a row's item and position move on the host).
  bstepN_select
           bstepN, then TokenSelect on its N rows, as step1_select: selection [N, 4] float32 instead of the logits."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ModelError, UnsupportedError
from ..graph import Graph, Node, Tensor
from ..loaders.safetensors_loader import LN_EPS, build_whisper_encoder_graph, transposed_f32
from ..ops.token_select import CONTROL
from ..quant import QuantizedWeight


@dataclass(frozen=True)
class Dims:
    d_model: int
    encoder_heads: int
    decoder_heads: int
    encoder_layers: int
    decoder_layers: int
    n_mels: int
    n_audio_ctx: int
    n_text_ctx: int
    n_vocab: int

    @property
    def frames(self) -> int:
        return 2 * self.n_audio_ctx


def dims_of(weights: dict, config: dict) -> Dims:
    def shape(name):
        if name not in weights:
            raise ModelError(f"the checkpoint has no '{name}'")
        return tuple(weights[name].shape)

    d, n_mels, _ = shape("model.encoder.conv1.weight")
    vocab, d_dec = shape("model.decoder.embed_tokens.weight")
    if d_dec != d:
        raise ModelError(f"the decoder's d_model {d_dec} is not the encoder's {d}")
    for side in ("encoder", "decoder"):
        heads = int(config[f"{side}_attention_heads"])
        if heads < 1 or d % heads:
            raise ModelError(f"{side}_attention_heads {heads} does not divide d_model {d}")
        if (d // heads) % 4:
            raise UnsupportedError(
                f"'model.{side}.layers.0.self_attn.q_proj.weight' [{d}, {d}] in {heads} heads "
                f"({side}_attention_heads): head dim {d // heads}; the Vulkan attention kernels read heads as "
                f"vec4, so the head dim must be a multiple of 4 (the reference backend runs any)")
    return Dims(d, int(config["encoder_attention_heads"]), int(config["decoder_attention_heads"]),
                int(config["encoder_layers"]), int(config["decoder_layers"]), n_mels,
                shape("model.encoder.embed_positions.weight")[0], shape("model.decoder.embed_positions.weight")[0],
                vocab)


class _Shared(dict):
    """The weights of several graphs built together, and the transposed copies made of them so far (each made once:
    a vocabulary projection is 253 MiB at large-v3's shapes, and every step and prompt graph reads it)."""

    def __init__(self, weights):
        super().__init__(weights)
        self.transposed = {}


def shared_weights(weights: dict) -> dict:
    """weights as graphs built together take them: the transposed copies made of them shared (_Shared)."""
    return weights if isinstance(weights, _Shared) else _Shared(weights)


class _Builder:
    """Nodes and constants of one graph, named by scope."""

    def __init__(self, g: Graph, weights: dict):
        self.g, self.w = g, weights

    def param(self, name, data=None):
        """A constant: checkpoint tensor `name` (or `data`) as float32."""
        if name not in self.g.tensors:
            self.g.const(name, np.ascontiguousarray(self.w[name] if data is None else data, np.float32))
        return name

    def node(self, op, ins, out, domain="", **attrs):
        self.g.nodes.append(Node(op, out, list(ins), [out], attrs, domain))
        self.g.tensors.setdefault(out, Tensor(out))
        return out

    def transposed(self, name, rows=None):
        """Checkpoint tensor `name` (its first `rows` rows, where given) transposed, contiguous float32 (made once
        for graphs built together)."""
        made = getattr(self.w, "transposed", {})
        key = name if rows is None else (name, rows)
        if key not in made:
            made[key] = transposed_f32(self.w[name] if rows is None else np.asarray(self.w[name])[:rows])
        return made[key]

    def linear(self, x, prefix, out, bias=True, act="", residual=""):
        w, quant = self.weight_kn(f"{prefix}.weight^T", f"{prefix}.weight")
        b = self.param(f"{prefix}.bias") if bias else ""
        return self.node("Linear", [x, w, b, residual, *quant], out, "minirt", act=act, scale=1.0)

    def weight_kn(self, name, key):
        """(the constant W [K, N] of checkpoint weight `key` [N, K], [its scale, ""] where it is int8 or [])."""
        w = self.w[key]
        if not isinstance(w, QuantizedWeight):
            return self.param(name, self.transposed(key)), []
        q, s = w.kn()
        if name not in self.g.tensors:
            self.g.const(name, q)
            self.g.const(f"{name}.scale", s)
        return name, [f"{name}.scale", ""]

    def layer_norm(self, x, prefix, out):
        return self.node("LayerNormalization", [x, self.param(f"{prefix}.weight"), self.param(f"{prefix}.bias")],
                         out, axis=-1, epsilon=LN_EPS)

    def state(self, name, shape, new=None):
        self.g.add_tensor(Tensor(name, tuple(shape), "float32"))
        self.g.state[name] = new or name
        return name


def encoder_graph(weights: dict, dm: Dims, batch: int = 1, state: str = "", items: int = 0) -> Graph:
    """The encoder on `batch` windows, then the cross-attention keys and values of each into state `state`cross_*.
    items > batch: a chunk of a batch, the state holding `items` windows; the run's windows go to windows
    param(CHUNK_ROW) / n_audio_ctx on (the parameter counts the state's rows of n_audio_ctx a window)."""
    cfg = {"d_model": dm.d_model, "encoder_attention_heads": dm.encoder_heads, "num_mel_bins": dm.n_mels,
           "max_source_positions": dm.n_audio_ctx, "encoder_layers": dm.encoder_layers}
    shared = _Builder(None, weights)
    g = build_whisper_encoder_graph(cfg, lambda k: weights[f"model.encoder.{k}"], prefix="model.encoder.",
                                    source=f"whisper {state}encode", batch=batch,
                                    transposed=lambda k: shared.transposed(f"model.encoder.{k}"))
    g.outputs = []
    _cross_kv(_Builder(g, weights), dm, "last_hidden_state", batch, state, items if items > batch else 0)
    return g


BATCH_CROSS = "bcross_"   # the batch's cross keys and values: bcross_k.<i>, bcross_v.<i>
CHUNK_ROW = "row0"   # the parameter of a chunk's encoder (encoder_graph with items): its first row in the state


def cross_graph(weights: dict, dm: Dims) -> Graph:
    """The cross entry point: what encode does after the encoder, from an encoder output computed elsewhere
    ("encoder_output" [1, n_audio_ctx, d_model] float32)."""
    g = Graph(name="whisper cross", source="whisper cross")
    g.inputs.append("encoder_output")
    g.add_tensor(Tensor("encoder_output", (1, dm.n_audio_ctx, dm.d_model), "float32"))
    _cross_kv(_Builder(g, weights), dm, "encoder_output")
    return g


def _cross_kv(b: _Builder, dm: Dims, x: str, batch: int = 1, state: str = "", items: int = 0) -> None:
    """Every decoder layer's cross-attention keys and values from the encoder output x, into state (of `items`
    windows, a chunk's `batch` at param(CHUNK_ROW), where items is given)."""
    if items:
        b.g.params = [CHUNK_ROW]
    for i in range(dm.decoder_layers):
        p = f"model.decoder.layers.{i}.encoder_attn"
        for kv, bias in (("k", False), ("v", True)):
            name = f"{state}cross_{kv}.{i}"
            b.state(name, (items or batch, dm.n_audio_ctx, dm.d_model), f"{name}@new")
            if items:
                part = b.linear(x, f"{p}.{kv}_proj", f"{name}@chunk", bias=bias)
                b.node("CacheWrite", [name, part], f"{name}@new", "minirt", param=CHUNK_ROW, axis=0)
            else:
                b.linear(x, f"{p}.{kv}_proj", f"{name}@new", bias=bias)


def _decoder_layers(g: Graph, b: _Builder, dm: Dims, batch: int, tokens: int, rows: int, items: int = 0) -> str:
    """The decoder from the token ids ("tokens" [batch, tokens] int32, at positions pos .. pos + tokens - 1) to the
    last layer's output [batch, tokens, d_model]; the key/value cache has `rows` rows. items > 0: a batch of
    independent sequences (one token a row, row r at position pos.r, reading item item.r's encoder output of
    `items`; the module doc's bstepN)."""
    d, dd = "model.decoder", dm.d_model
    g.inputs.append("tokens")
    g.add_tensor(Tensor("tokens", (batch, tokens), "int32"))
    pos, per_row, state = ("pos.0", 1, "b") if items else ("pos", 0, "")
    g.params = [f"pos.{r}" for r in range(batch)] + [f"item.{r}" for r in range(batch)] if items else ["pos"]
    scale = float((dd // dm.decoder_heads) ** -0.5)
    x = b.node("Gather", [b.param(f"{d}.embed_tokens.weight"), "tokens"], "embed", axis=0)   # [B, T, D]
    pe = b.node("ParamRows", [b.param(f"{d}.embed_positions.weight")], "embed_pos", "minirt", param=pos,
                rows=batch if items else tokens, **({"per_row": 1} if items else {}))
    if items:       # a row's position embedding for each row: [B, D] as [B, 1, D]
        g.const("embed_pos.shape", np.array([batch, 1, dd], np.int64))
        pe = b.node("Reshape", [pe, "embed_pos.shape"], "embed_pos.rows")
    x = b.node("Add", [x, pe], "x.in")
    row_attrs = {"per_row": 1} if items else {}
    for i in range(dm.decoder_layers):
        p, s = f"{d}.layers.{i}", f"layers.{i}"
        a = b.layer_norm(x, f"{p}.self_attn_layer_norm", f"{s}/ln1")
        q = b.linear(a, f"{p}.self_attn.q_proj", f"{s}/q")
        k = b.linear(a, f"{p}.self_attn.k_proj", f"{s}/k", bias=False)
        v = b.linear(a, f"{p}.self_attn.v_proj", f"{s}/v")
        caches = []
        for name, new in ((f"{state}self_k.{i}", k), (f"{state}self_v.{i}", v)):
            b.state(name, (rows, dm.n_text_ctx, dd), f"{name}@new")
            caches.append(b.node("CacheWrite", [name, new], f"{name}@new", "minirt", param=pos, **row_attrs))
        o = b.node("CachedAttention", [q, *caches], f"{s}/self_attn", "minirt", heads=dm.decoder_heads, scale=scale,
                   param=pos, **row_attrs)
        x = b.linear(o, f"{p}.self_attn.out_proj", f"{s}/x1", residual=x)
        a = b.layer_norm(x, f"{p}.encoder_attn_layer_norm", f"{s}/ln2")
        q = b.linear(a, f"{p}.encoder_attn.q_proj", f"{s}/cq")
        ck = b.state(f"{state}cross_k.{i}", (max(items, 1), dm.n_audio_ctx, dd))
        cv = b.state(f"{state}cross_v.{i}", (max(items, 1), dm.n_audio_ctx, dd))
        o = b.node("CachedAttention", [q, ck, cv], f"{s}/cross_attn", "minirt", heads=dm.decoder_heads, scale=scale,
                   **({"items": "item.0"} if items else {}))
        x = b.linear(o, f"{p}.encoder_attn.out_proj", f"{s}/x2", residual=x)
        a = b.layer_norm(x, f"{p}.final_layer_norm", f"{s}/ln3")
        h = b.linear(a, f"{p}.fc1", f"{s}/fc1", act="gelu")
        x = b.linear(h, f"{p}.fc2", f"{s}/x3", residual=x)
    return x


def _logits(g: Graph, b: _Builder, weights: dict, x: str) -> None:
    """logits = the final layer norm of x times the output projection (the token embedding, transposed, when tied)."""
    d = "model.decoder"
    x = b.layer_norm(x, f"{d}.layer_norm", "ln_out")
    proj = "proj_out.weight" if "proj_out.weight" in weights else f"{d}.embed_tokens.weight"   # tied by default
    w, quant = b.weight_kn("logits.weight^T", proj)
    b.node("Linear", [x, w, "", "", *quant], "logits", "minirt", act="", scale=1.0)
    g.outputs.append("logits")


def _select(g: Graph, dm: Dims, rows: int) -> None:
    """The logits of a step's `rows` rows into TokenSelect, whose selection is the graph's only output."""
    g.outputs.remove("logits")
    for name, shape in (("suppress", ((dm.n_vocab + 31) // 32,)), ("select", (rows, CONTROL))):
        g.inputs.append(name)
        g.add_tensor(Tensor(name, shape, "int32"))
    _Builder(g, {}).node("TokenSelect", ["logits", "suppress", "select"], "selection", "minirt")
    g.outputs.append("selection")


def step_graph(weights: dict, dm: Dims, batch: int, cache_rows: int | None = None, select: bool = False) -> Graph:
    """One token for each of `batch` rows, over a key/value cache of `cache_rows` rows (default: batch), of which
    it reads and writes the first `batch`; select: the selection of the next tokens instead of the logits (_select)."""
    rows = cache_rows or batch
    if rows < batch:
        raise ValueError(f"a step of {batch} rows over a cache of {rows}")
    g = Graph(name=f"whisper step ({batch} rows{', select' if select else ''})", source="whisper step")
    b = _Builder(g, weights)
    _logits(g, b, weights, _decoder_layers(g, b, dm, batch, 1, rows))
    if select:
        _select(g, dm, batch)
    return g


def prompt_graph(weights: dict, dm: Dims, tokens: int, picks: int, cache_rows: int) -> Graph:
    """A prompt of up to `tokens` tokens in one run (row 0 of the cache, positions pos .. pos + tokens - 1; a shorter
    prompt is padded, and what the padding writes past it is overwritten by the steps that follow before anything
    reads it), and the logits at `picks` of its positions ("picks" [picks] int32): [picks, n_vocab]."""
    g = Graph(name=f"whisper prompt ({tokens} tokens)", source="whisper prompt")
    b = _Builder(g, weights)
    x = _decoder_layers(g, b, dm, 1, tokens, cache_rows)
    g.const("prompt.rows", np.array([tokens, dm.d_model], np.int64))
    x = b.node("Reshape", [x, "prompt.rows"], "prompt.hidden")
    g.inputs.append("picks")
    g.add_tensor(Tensor("picks", (picks,), "int32"))
    _logits(g, b, weights, b.node("Gather", [x, "picks"], "prompt.picked", axis=0))
    return g


def align_graph(weights: dict, dm: Dims, tokens: int, heads: list, eot: int, cache_rows: int) -> Graph:
    """alignP (the module doc): the decoder over a sequence of up to `tokens` tokens as a prompt runs (row 0 of the
    cache, from position 0; a shorter sequence is padded at the end, which the rows before it do not see), and
    besides the layers' own attention, for each alignment head (layer, head) of `heads`, in that order, the softmax
    of its cross-attention scores over the encoder positions whose key_mask is 0 (-inf elsewhere): "attention"
    [len(heads), tokens, n_audio_ctx]; and the probability among the text tokens (ids below eot) of the token whose
    flat index (row * eot + token) "picks" [tokens, 1] holds: "token_probs" [tokens, 1]."""
    g = Graph(name=f"whisper align ({tokens} tokens)", source="whisper align")
    b = _Builder(g, weights)
    x = _decoder_layers(g, b, dm, 1, tokens, cache_rows)
    H, dd = dm.decoder_heads, dm.d_model
    dh = dd // H
    g.inputs.append("key_mask")
    g.add_tensor(Tensor("key_mask", (dm.n_audio_ctx,), "float32"))
    g.const("align.q_shape", np.array([tokens, H, dh], np.int64))
    g.const("align.k_shape", np.array([dm.n_audio_ctx, H, dh], np.int64))
    g.const("align.scale", np.array(dh ** -0.5, np.float32))
    per_layer = []
    for layer in sorted({layer for layer, _ in heads}):
        hs = [h for lay, h in heads if lay == layer]
        s = f"align.{layer}"
        g.const(f"{s}.heads", np.array(hs, np.int64))
        q = b.node("Reshape", [f"layers.{layer}/cq", "align.q_shape"], f"{s}/q3")
        q = b.node("Transpose", [q], f"{s}/qh", perm=[1, 0, 2])                             # [H, T, dh]
        q = b.node("Gather", [q, f"{s}.heads"], f"{s}/q", axis=0)
        k = b.node("Reshape", [f"cross_k.{layer}", "align.k_shape"], f"{s}/k3")
        k = b.node("Transpose", [k], f"{s}/kh", perm=[1, 2, 0])                             # [H, dh, S]
        k = b.node("Gather", [k, f"{s}.heads"], f"{s}/k", axis=0)
        sc = b.node("MatMul", [q, k], f"{s}/scores")
        sc = b.node("Mul", [sc, "align.scale"], f"{s}/scaled")
        sc = b.node("Add", [sc, "key_mask"], f"{s}/masked")
        per_layer.append((hs, b.node("Softmax", [sc], f"{s}/probs", axis=-1)))
    # the heads in the order given: a Concat of the layers' probabilities, then a Gather where that order differs
    order = [(layer, h) for layer in sorted({lay for lay, _ in heads}) for h in
             [h for lay, h in heads if lay == layer]]
    probs = b.node("Concat", [p for _, p in per_layer], "align.by_layer", axis=0) if len(per_layer) > 1 \
        else per_layer[0][1]
    if order != [tuple(h) for h in heads]:
        g.const("align.order", np.array([order.index(tuple(h)) for h in heads], np.int64))
        probs = b.node("Gather", [probs, "align.order"], "align.ordered", axis=0)
    b.node("Identity", [probs], "attention")
    g.outputs.append("attention")
    d = "model.decoder"
    h = b.layer_norm(x, f"{d}.layer_norm", "ln_out")
    proj = "proj_out.weight" if "proj_out.weight" in weights else f"{d}.embed_tokens.weight"
    w = b.param("text_logits.weight^T", b.transposed(proj, eot))
    b.node("Linear", [h, w, "", ""], "text_logits", "minirt", act="", scale=1.0)               # [1, T, eot]
    b.node("Softmax", ["text_logits"], "text_probs", axis=-1)
    g.const("align.flat", np.array([tokens * eot, 1], np.int64))
    flat = b.node("Reshape", ["text_probs", "align.flat"], "text_probs.flat")
    g.inputs.append("picks")
    g.add_tensor(Tensor("picks", (tokens,), "int32"))
    b.node("Gather", [flat, "picks"], "token_probs", axis=0)
    g.outputs.append("token_probs")
    return g


def align_entry(tokens: int) -> str:
    """The entry point that aligns a sequence of up to `tokens` tokens (align_sizes)."""
    return f"align{tokens}"


def align_sizes(dm: Dims) -> list:
    """The token slots of the align entry points, smallest first: a sentence or two, and the longest a window's
    alignment runs (the start sequence, <|notimestamps|>, at most half the text context of text, <|endoftext|>), as
    prompt_tokens. A run costs its slots, padding included: the text logits of every slot."""
    return sorted({min(64, prompt_tokens(dm)), prompt_tokens(dm)})


def align_graphs(weights: dict, dm: Dims, heads: list, eot: int, cache_rows: int) -> dict:
    """{entry point: Graph} of the align entry points (align_sizes)."""
    weights = shared_weights(weights)     # one transposed copy of the text projection for all of them
    return {align_entry(n): align_graph(weights, dm, n, heads, eot, cache_rows) for n in align_sizes(dm)}


def reorder_graph(dm: Dims, batch: int, state: str = "") -> Graph:
    g = Graph(name=f"whisper {state}reorder", source=f"whisper {state}reorder")
    b = _Builder(g, {})
    g.inputs.append("rows")
    g.add_tensor(Tensor("rows", (batch,), "int32"))
    g.params = ["len"]
    for i in range(dm.decoder_layers):
        for kind in ("k", "v"):
            name = f"{state}self_{kind}.{i}"
            b.state(name, (batch, dm.n_text_ctx, dm.d_model), f"{name}@new")
            b.node("ReorderRows", [name, "rows"], f"{name}@new", "minirt", valid="len")
    return g


def step_entry(rows: int) -> str:
    """The entry point of a step of `rows` rows."""
    return f"step{rows}"


def select_entry(step: str) -> str:
    """The entry point that runs step entry point `step` (step1, bstepN) and TokenSelect on its logits."""
    return f"{step}_select"


PROMPT_PICKS = 2     # logits a prompt run returns: the last position's and <|startoftranscript|>'s


SHORT_PROMPT = 8     # a start sequence without previous text: <|startoftranscript|>, language, task, <|notimestamps|>,
                     # a short prefix


def prompt_tokens(dm: Dims) -> int:
    """The longest prompt the prompt entry points take: Whisper's previous-text prompt (<|startofprev|> and at most
    half the text context less one tokens) and its start sequence (<|startoftranscript|>, language, task,
    <|notimestamps|>, a prefix) fill 232 of 448."""
    return min(dm.n_text_ctx, dm.n_text_ctx // 2 + 8)


def prompt_sizes(dm: Dims) -> list:
    """The token slots of the prompt entry points, smallest first: a short one for a window's start sequence (the
    first window, and every window without condition_on_previous_text), the longest for one with previous text. A
    run costs its slots, padding included."""
    return sorted({min(SHORT_PROMPT, prompt_tokens(dm)), prompt_tokens(dm)})


def prompt_entry(tokens: int) -> str:
    """The entry point of a prompt of up to `tokens` tokens (one of prompt_sizes)."""
    return f"prompt{tokens}"


def program_graphs(weights: dict, dm: Dims, batch: int, step_rows=None) -> dict:
    """{entry point: Graph}: encode, cross, prompt8 and prompt232 (prompt_entry()), a step for each row count in step_rows (default: 1 and batch; entry
    points step1, step5, ..., step_entry()), step1_select, reorder, over a cache of `batch` rows (see the module doc)."""
    sizes = sorted(set(step_rows or (1, batch)))
    if not sizes or sizes[0] < 1 or sizes[-1] > batch:
        raise ValueError(f"step row counts {sizes} must be in 1..{batch}")
    weights = _Shared(weights)
    graphs = {"encode": encoder_graph(weights, dm), "cross": cross_graph(weights, dm)}
    graphs.update({prompt_entry(n): prompt_graph(weights, dm, n, PROMPT_PICKS, batch) for n in prompt_sizes(dm)})
    graphs.update({step_entry(n): step_graph(weights, dm, n, batch) for n in sizes})
    graphs[select_entry(step_entry(1))] = step_graph(weights, dm, 1, batch, select=True)
    graphs["reorder"] = reorder_graph(dm, batch)
    return graphs


MAX_ITEMS = 32       # sequences of a batch at most: a row takes two slots (pos.r, item.r) of the 64-slot parameter block


def batch_step_sizes(items: int) -> list:
    """The row counts of the bstep entry points of a batch of `items` sequences: powers of two below it, and it (a
    step costs its rows, padding included; finished rows are dropped, so the live ones run in the smallest that
    holds them)."""
    return sorted({1 << k for k in range(items.bit_length()) if 1 << k < items} | {items})


def batch_step_graph(weights: dict, dm: Dims, rows: int, items: int, select: bool = False) -> Graph:
    """bstep`rows`: one token for each of `rows` independent sequences (the module doc), over caches of `items` rows;
    select: bstep`rows`_select."""
    if not 1 <= rows <= items:
        raise ValueError(f"a batched step of {rows} rows over {items} sequences")
    g = Graph(name=f"whisper batched step ({rows} rows{', select' if select else ''})", source="whisper bstep")
    b = _Builder(g, weights)
    _logits(g, b, weights, _decoder_layers(g, b, dm, rows, 1, items, items))
    if select:
        _select(g, dm, rows)
    return g


def encode_sizes(chunk: int) -> list:
    """The window counts of a batch's encoder entry points, where bencode takes `chunk` windows a run: the rule of
    batch_step_sizes (powers of two below it, and it)."""
    return batch_step_sizes(chunk)


def encode_entry(windows: int, chunk: int) -> str:
    """The encoder entry point of `windows` (one of encode_sizes(chunk)): bencode for the chunk, else bencodeK."""
    return "bencode" if windows == chunk else f"bencode{windows}"


def batch_state_bytes(dm: Dims, itemsize: int) -> tuple:
    """What each sequence of a batch adds to the batch's state (bcross_*, bself_*): (bytes of its largest state
    tensor, bytes in all)."""
    rows = dm.n_audio_ctx + dm.n_text_ctx
    return max(dm.n_audio_ctx, dm.n_text_ctx) * dm.d_model * itemsize, 2 * dm.decoder_layers * rows * dm.d_model * \
        itemsize


def batch_graphs(weights: dict, dm: Dims, items: int, encode_chunk: int = 0, sizes=None) -> dict:
    """{entry point: Graph} of a batch of up to `items` independent sequences: bencode, bencodeK for the smaller K of
    encode_sizes(its windows), bstepN and bstepN_select for N in batch_step_sizes(items), breorder (the module doc);
    sizes: the encoder entry points' window counts to make (None: all of encode_sizes). encode_chunk (1 to items - 1;
    0: items): bencode takes
    that many windows a run, and encode_batch runs it a chunk at a time, each writing its windows' keys and values at
    parameter CHUNK_ROW (the chunk's first window times n_audio_ctx), where the device cannot hold the encoder's
    activations for the whole batch."""
    if not 1 <= items <= MAX_ITEMS:
        raise ValueError(f"a batch of 1 to {MAX_ITEMS} sequences, got {items}")
    if not 0 <= encode_chunk <= items:
        raise ValueError(f"an encoder chunk of 0 to {items} windows, got {encode_chunk}")
    chunk = encode_chunk if 0 < encode_chunk < items else items
    weights = shared_weights(weights)
    graphs = {"bencode": encoder_graph(weights, dm, chunk, "b", items)}
    for k in encode_sizes(chunk)[:-1] if sizes is None else sorted(set(sizes) - {chunk}):
        if not 1 <= k < chunk:
            raise ValueError(f"an encoder entry point of {k} windows beside bencode's {chunk}")
        graphs[encode_entry(k, chunk)] = encoder_graph(weights, dm, k, "b", items)
    for n in batch_step_sizes(items):
        graphs[f"bstep{n}"] = batch_step_graph(weights, dm, n, items)
        graphs[select_entry(f"bstep{n}")] = batch_step_graph(weights, dm, n, items, select=True)
    graphs["breorder"] = reorder_graph(dm, items, "b")
    return graphs
