"""A numpy float32 Whisper (encoder and decoder with a key/value cache) behind the DecoderBackend interface:
the backend that runs transcription on the CPU until the Vulkan decoder exists, and an oracle for it after.

Weights are Hugging Face-named (model.encoder.*, model.decoder.*, proj_out.weight when not tied) as
weights.load_weights gives them; they are widened to float32 once (precision "fp16" rounds them through
float16 first). Everything is computed in float32; GELU is the exact (erf) one, with a float32 rational erf
accurate to a few units in the last place.
"""
from __future__ import annotations

import contextlib
from functools import lru_cache
from typing import Sequence

import numpy as np

from ..errors import ModelError

# erf(x) = x p(x^2) / q(x^2) on [-4, 4] (erf is +-1 in float32 outside): the float32 approximation Eigen uses
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def gelu(a: np.ndarray) -> np.ndarray:
    """0.5 a (1 + erf(a / sqrt 2)) in float32, a new array."""
    x = np.clip(a * np.float32(0.7071067811865476), np.float32(-4), np.float32(4))
    x2 = x * x
    p = np.full_like(x, _ERF_P[0])
    for c in _ERF_P[1:]:
        p *= x2
        p += np.float32(c)
    q = np.full_like(x, _ERF_Q[0])
    for c in _ERF_Q[1:]:
        q *= x2
        q += np.float32(c)
    p *= x
    p /= q
    p += np.float32(1)
    p *= a
    p *= np.float32(0.5)
    return p


def layer_norm(x, w, b, eps=np.float32(1e-5)):
    mean = x.mean(-1, keepdims=True)
    d = x - mean
    var = (d * d).mean(-1, keepdims=True)
    return d / np.sqrt(var + eps) * w + b


def softmax(x, axis=-1):
    """Softmax over `axis`, computed in place in x (which is returned)."""
    x -= x.max(axis, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis, keepdims=True)
    return x


@lru_cache(maxsize=None)
def _blas_controller():
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def blas_threads(n):
    """A context in which BLAS uses at most n threads (threadpoolctl, when installed; else BLAS's default)."""
    ctl = _blas_controller() if n else None
    return ctl.limit(limits=n, user_api="blas") if ctl is not None else contextlib.nullcontext()


class _Linear:
    __slots__ = ("wt", "b")

    def __init__(self, w, b):
        self.wt = np.ascontiguousarray(w.T)         # [in, out]
        self.b = b

    def __call__(self, x):
        y = x.reshape(-1, x.shape[-1]) @ self.wt      # one GEMM for every row
        if self.b is not None:
            y += self.b
        return y.reshape(x.shape[:-1] + (y.shape[-1],))


class ReferenceBackend:
    """The numpy reference Whisper (see the module doc). `weights` and `config` as weights.load_weights returns
    them."""

    name = "numpy reference (float32, CPU)"
    max_items = 32        # BatchDecoder: sequences of a batch (the Vulkan program's limit; here only a check)
    max_batch = 64        # beams or best_of samples: a bound, so that beam_size=10**6 is refused at the call

    def __init__(self, weights: dict, config: dict, precision: str = "fp32", threads: int | None = 1):
        """threads: BLAS threads while the backend computes (None: BLAS's default). One is the default: the
        decoder's matrices are small, and on a busy machine BLAS threads waiting for each other cost several
        times the work (needs threadpoolctl, which the whisper extra installs)."""
        if precision not in ("fp32", "fp16"):
            raise ValueError(f"precision must be fp32 or fp16, got {precision!r}")
        self.precision = precision
        self.threads = threads

        def get(name, required=True):
            if name not in weights:
                if required:
                    raise ModelError(f"the checkpoint has no '{name}'")
                return None
            a = weights[name]
            if precision == "fp16":
                a = a.astype(np.float16)
            return np.ascontiguousarray(a, np.float32)

        def lin(prefix, bias=True):
            return _Linear(get(f"{prefix}.weight"), get(f"{prefix}.bias") if bias else None)

        def norm(prefix):
            return get(f"{prefix}.weight"), get(f"{prefix}.bias")

        e, d = "model.encoder", "model.decoder"
        self.n_heads_enc = int(config["encoder_attention_heads"])
        self.n_heads_dec = int(config["decoder_attention_heads"])
        self.conv1_w, self.conv1_b = get(f"{e}.conv1.weight"), get(f"{e}.conv1.bias")
        self.conv2_w, self.conv2_b = get(f"{e}.conv2.weight"), get(f"{e}.conv2.bias")
        self.n_mels = self.conv1_w.shape[1]
        self.enc_pos = get(f"{e}.embed_positions.weight")
        self.enc_layers = []
        for i in range(int(config["encoder_layers"])):
            p = f"{e}.layers.{i}"
            self.enc_layers.append(dict(
                ln1=norm(f"{p}.self_attn_layer_norm"), q=lin(f"{p}.self_attn.q_proj"),
                k=lin(f"{p}.self_attn.k_proj", bias=False), v=lin(f"{p}.self_attn.v_proj"),
                o=lin(f"{p}.self_attn.out_proj"), ln2=norm(f"{p}.final_layer_norm"),
                fc1=lin(f"{p}.fc1"), fc2=lin(f"{p}.fc2")))
        self.enc_ln = norm(f"{e}.layer_norm")

        self.embed = get(f"{d}.embed_tokens.weight")
        self.dec_pos = get(f"{d}.embed_positions.weight")
        proj = get("proj_out.weight", required=False)
        # [d_model, vocab], contiguous: BLAS reads it about twice as fast as the transposed embedding
        self.proj_t = np.ascontiguousarray((self.embed if proj is None else proj).T)
        self.dec_layers = []
        for i in range(int(config["decoder_layers"])):
            p = f"{d}.layers.{i}"
            self.dec_layers.append(dict(
                ln1=norm(f"{p}.self_attn_layer_norm"), q=lin(f"{p}.self_attn.q_proj"),
                k=lin(f"{p}.self_attn.k_proj", bias=False), v=lin(f"{p}.self_attn.v_proj"),
                o=lin(f"{p}.self_attn.out_proj"),
                ln2=norm(f"{p}.encoder_attn_layer_norm"), cq=lin(f"{p}.encoder_attn.q_proj"),
                ck=lin(f"{p}.encoder_attn.k_proj", bias=False), cv=lin(f"{p}.encoder_attn.v_proj"),
                co=lin(f"{p}.encoder_attn.out_proj"),
                ln3=norm(f"{p}.final_layer_norm"), fc1=lin(f"{p}.fc1"), fc2=lin(f"{p}.fc2")))
        self.dec_ln = norm(f"{d}.layer_norm")
        self.n_vocab = self.embed.shape[0]
        self.n_text_ctx = self.dec_pos.shape[0]
        self.multilingual = self.n_vocab >= 51865
        self.d_model = self.embed.shape[1]
        self._cross = None        # per decoder layer: (K, V) of the encoder output, [heads, frames, head_dim]
        self._k = self._v = None  # per decoder layer: [batch, heads, n_text_ctx, head_dim]
        self._len = 0

    # -- encoder ----------------------------------------------------------------------------------------------

    @staticmethod
    def _conv1d(x, w, b, stride):
        """x [c_in, T] -> [T_out, c_out], kernel 3, padding 1."""
        c_out, c_in, k = w.shape
        xp = np.pad(x, ((0, 0), (1, 1)))
        t_out = (xp.shape[1] - k) // stride + 1
        cols = np.stack([xp[:, j:j + stride * (t_out - 1) + 1:stride] for j in range(k)], axis=-1)  # [c_in, T, k]
        cols = np.ascontiguousarray(cols.transpose(1, 0, 2)).reshape(t_out, c_in * k)
        return cols @ w.reshape(c_out, c_in * k).T + b

    def _attention(self, q, k, v, heads, mask=None):
        """q [Tq, d], k/v [Tk, d] -> [Tq, d] (one sequence)."""
        tq, dm = q.shape
        hd = dm // heads
        qh = q.reshape(tq, heads, hd).transpose(1, 0, 2)
        kh = k.reshape(-1, heads, hd).transpose(1, 2, 0)
        vh = v.reshape(-1, heads, hd).transpose(1, 0, 2)
        s = qh @ kh
        s *= np.float32(hd ** -0.5)
        if mask is not None:
            s += mask
        return (softmax(s) @ vh).transpose(1, 0, 2).reshape(tq, dm)

    def encode(self, features: np.ndarray) -> None:
        with blas_threads(self.threads):
            self._encode(features)

    def _encode(self, features):
        x = np.asarray(features, np.float32)
        if x.ndim == 3 and x.shape[0] == 1:
            x = x[0]
        if x.ndim != 2 or x.shape[0] != self.n_mels:
            raise ValueError(f"features must be [{self.n_mels}, frames], got {list(x.shape)}")
        h = gelu(self._conv1d(x, self.conv1_w, self.conv1_b, 1))
        h = gelu(self._conv1d(h.T, self.conv2_w, self.conv2_b, 2))
        if h.shape[0] > self.enc_pos.shape[0]:
            raise ValueError(f"{x.shape[1]} frames is more than the encoder's {2 * self.enc_pos.shape[0]}")
        h += self.enc_pos[:h.shape[0]]
        for L in self.enc_layers:
            a = layer_norm(h, *L["ln1"])
            h += L["o"](self._attention(L["q"](a), L["k"](a), L["v"](a), self.n_heads_enc))
            a = layer_norm(h, *L["ln2"])
            h += L["fc2"](gelu(L["fc1"](a)))
        self._set_cross(layer_norm(h, *self.enc_ln))

    def encoder_output(self, features: np.ndarray) -> np.ndarray:
        """The encoder's output on one window, [n_audio_ctx, d_model] float32 (as encode() computes it)."""
        with blas_threads(self.threads):
            self._encode(features)
        return self._mem

    def set_encoder_output(self, hidden: np.ndarray) -> None:
        """What encode() does after its encoder, from an encoder output computed elsewhere, [n_audio_ctx, d_model]."""
        mem = np.asarray(hidden, np.float32)
        if mem.ndim == 3 and mem.shape[0] == 1:
            mem = mem[0]
        if mem.ndim != 2 or mem.shape[1] != self.d_model:
            raise ValueError(f"the encoder output must be [positions, {self.d_model}], got {list(mem.shape)}")
        with blas_threads(self.threads):
            self._set_cross(mem)

    def _set_cross(self, mem):
        self._mem = mem
        hd = self.d_model // self.n_heads_dec
        self._cross = []
        for L in self.dec_layers:
            k = L["ck"](mem).reshape(-1, self.n_heads_dec, hd).transpose(1, 2, 0)      # [H, hd, S]
            v = L["cv"](mem).reshape(-1, self.n_heads_dec, hd).transpose(1, 0, 2)      # [H, S, hd]
            self._cross.append((np.ascontiguousarray(k), np.ascontiguousarray(v)))
        self._k = self._v = None
        self._len = 0

    # -- decoder ----------------------------------------------------------------------------------------------

    def _decode(self, x):
        """x [B, T, d] embedded tokens at positions self._len .. + T; appends to the cache; returns [B, T, d]
        after the final layer norm."""
        B, T, dm = x.shape
        H = self.n_heads_dec
        hd = dm // H
        start = self._len
        if start + T > self.n_text_ctx:
            raise ValueError(f"the decoder has {self.n_text_ctx} positions; {start + T} needed")
        scale = np.float32(hd ** -0.5)
        mask = None
        if T > 1:
            mask = np.triu(np.full((T, start + T), -np.inf, np.float32), k=start + 1)
        for i, L in enumerate(self.dec_layers):
            a = layer_norm(x, *L["ln1"])
            q = L["q"](a).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
            self._k[i][:, :, start:start + T] = L["k"](a).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
            self._v[i][:, :, start:start + T] = L["v"](a).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
            k = self._k[i][:, :, :start + T]
            v = self._v[i][:, :, :start + T]
            s = q @ k.transpose(0, 1, 3, 2)
            s *= scale
            if mask is not None:
                s += mask
            o = (softmax(s) @ v).transpose(0, 2, 1, 3).reshape(B, T, dm)
            x = x + L["o"](o)
            a = layer_norm(x, *L["ln2"])
            q = L["cq"](a).reshape(B, T, H, hd).transpose(0, 2, 1, 3)
            ck, cv = self._cross[i]
            s = q @ ck
            s *= scale
            o = (softmax(s) @ cv).transpose(0, 2, 1, 3).reshape(B, T, dm)
            x = x + L["co"](o)
            a = layer_norm(x, *L["ln3"])
            x = x + L["fc2"](gelu(L["fc1"](a)))
        self._len = start + T
        return layer_norm(x, *self.dec_ln)

    def _embed(self, tokens, start):
        tokens = np.asarray(tokens, np.int64)
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.n_vocab):
            raise ValueError(f"token ids must be in [0, {self.n_vocab}), got {tokens.min()}..{tokens.max()}")
        return self.embed[tokens] + self.dec_pos[start:start + tokens.shape[-1]]

    def start(self, prompt: Sequence[int], positions: Sequence[int]) -> np.ndarray:
        if self._cross is None:
            raise RuntimeError("start() before encode()")
        prompt = list(prompt)
        if not prompt:
            raise ValueError("the prompt is empty")
        H, hd = self.n_heads_dec, self.d_model // self.n_heads_dec
        shape = (1, H, self.n_text_ctx, hd)
        self._k = [np.zeros(shape, np.float32) for _ in self.dec_layers]
        self._v = [np.zeros(shape, np.float32) for _ in self.dec_layers]
        self._len = 0
        with blas_threads(self.threads):
            h = self._decode(self._embed(prompt, 0)[None])[0]
            return h[list(positions)] @ self.proj_t

    def step(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens).reshape(-1)
        if self._k is None or len(tokens) != self._k[0].shape[0]:
            raise ValueError(f"step() got {len(tokens)} tokens for a batch of "
                             f"{0 if self._k is None else self._k[0].shape[0]}")
        with blas_threads(self.threads):
            h = self._decode(self._embed(tokens[:, None], self._len))[:, 0]
            return h @ self.proj_t

    # -- word timestamps ---------------------------------------------------------------------------------------------

    def add_align(self, heads, eot: int, weights=None) -> None:
        """Make align() read these alignment heads [(layer, head)], text tokens being the ids below eot (weights:
        unused here; the Vulkan backend builds its entry point from them)."""
        self.align_heads, self.align_eot = [(int(a), int(b)) for a, b in heads], int(eot)

    def align(self, tokens: Sequence[int], num_frames: int):
        """CTranslate2's align for one sequence, on the encoder output in the backend: (the cross-attention
        probabilities of the alignment heads over the first num_frames // 2 encoder positions, [heads, len(tokens),
        num_frames // 2] float32, heads in add_align's order; the probability of each next token tokens[p + 1]
        among the text tokens at position p, [len(tokens)] float32, 0 where the next token is not a text token; at
        the last position that of token 0, as CTranslate2 pads). The key/value cache is left as it was."""
        if self._cross is None:
            raise RuntimeError("align() before encode()")
        heads = getattr(self, "align_heads", None)
        if heads is None:
            raise RuntimeError("align() before add_align()")
        tokens = [int(t) for t in tokens]
        n = int(num_frames) // 2
        if not tokens or not 1 <= n <= self._cross[0][0].shape[-1]:
            raise ValueError(f"align() of {len(tokens)} tokens over {n} encoder positions")
        with blas_threads(self.threads):
            x = self._embed(tokens, 0)
            T, dm = x.shape
            H = self.n_heads_dec
            hd = dm // H
            scale = np.float32(hd ** -0.5)
            mask = np.triu(np.full((T, T), -np.inf, np.float32), k=1)
            probs = {}
            for i, L in enumerate(self.dec_layers):
                a = layer_norm(x, *L["ln1"])
                x = x + L["o"](self._attention(L["q"](a), L["k"](a), L["v"](a), H, mask))
                a = layer_norm(x, *L["ln2"])
                q = L["cq"](a).reshape(T, H, hd).transpose(1, 0, 2)
                ck, cv = self._cross[i]
                s = q @ ck
                s *= scale
                for h in {h for layer, h in heads if layer == i}:
                    probs[(i, h)] = softmax(s[h, :, :n].copy())
                o = (softmax(s) @ cv).transpose(1, 0, 2).reshape(T, dm)
                x = x + L["co"](o)
                a = layer_norm(x, *L["ln3"])
                x = x + L["fc2"](gelu(L["fc1"](a)))
            logits = layer_norm(x, *self.dec_ln) @ self.proj_t[:, :self.align_eot]
            text = softmax(logits)
            nxt = np.array(tokens[1:] + [0])
            token_probs = np.where(nxt < self.align_eot, text[np.arange(T), np.minimum(nxt, self.align_eot - 1)], 0)
            token_probs = token_probs.astype(np.float32)
        return np.stack([probs[h] for h in heads]).astype(np.float32), token_probs

    # -- BatchDecoder: independent sequences, each with its own encoder output and position ------------------------

    def encode_batch(self, features: np.ndarray) -> None:
        x = np.asarray(features, np.float32)
        if x.ndim != 3 or not 1 <= len(x) <= self.max_items:
            raise ValueError(f"features must be [1 to {self.max_items}, {self.n_mels}, frames], got {list(x.shape)}")
        items = []
        with blas_threads(self.threads):
            for f in x:
                self._encode(f)
                items.append(self._cross)
        self._items, self._rows = items, []

    def start_rows(self, items) -> None:
        items = [int(i) for i in items]
        n = len(getattr(self, "_items", ()))
        if not n:
            raise RuntimeError("start_rows() before encode_batch()")
        if not 1 <= len(items) <= self.max_items or min(items) < 0 or max(items) >= n:
            raise ValueError(f"start_rows() items {items}: 1 to {self.max_items} rows, each an item of the {n} "
                             f"encoded")
        H, hd = self.n_heads_dec, self.d_model // self.n_heads_dec
        shape = (1, H, self.n_text_ctx, hd)
        self._rows = [dict(item=i, len=0, k=[np.zeros(shape, np.float32) for _ in self.dec_layers],
                           v=[np.zeros(shape, np.float32) for _ in self.dec_layers]) for i in items]

    def step_rows(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.asarray(tokens).reshape(-1)
        if not self._rows or len(tokens) != len(self._rows):
            raise ValueError(f"step_rows() got {len(tokens)} tokens for {len(self._rows)} rows")
        out = []
        with blas_threads(self.threads):        # a row at a time: the one-sequence decoder on its own state
            for t, row in zip(tokens, self._rows):
                self._cross, self._k, self._v, self._len = self._items[row["item"]], row["k"], row["v"], row["len"]
                out.append(self._decode(self._embed(np.array([[t]]), self._len))[0, 0] @ self.proj_t)
                row["len"] = self._len
        self._k = self._v = None
        return np.stack(out)

    def reorder_rows(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.int64).reshape(-1)
        if not 1 <= len(rows) <= self.max_items or rows.min() < 0 or rows.max() >= len(self._rows):
            raise ValueError(f"reorder_rows() rows {rows.tolist()} for {len(self._rows)} rows")
        self._rows = [dict(self._rows[r], k=[c.copy() for c in self._rows[r]["k"]],
                           v=[c.copy() for c in self._rows[r]["v"]]) for r in rows]

    def reorder(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, np.int64).reshape(-1)
        n = self._len
        for cache in (self._k, self._v):
            for i, c in enumerate(cache):
                new = np.zeros((len(rows),) + c.shape[1:], np.float32)
                new[:, :, :n] = c[rows, :, :n]
                cache[i] = new
