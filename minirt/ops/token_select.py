"""TokenSelect: greedy decoding's choice of the next token on the GPU (glsl/token_select.comp), from logits that stay
there, with the suppression of the logit filters that are masks (Whisper's suppress_tokens, suppress_blank and
timestamp rules: minirt/whisper/filters.py builds the inputs). The host reads 4 floats a row instead of the row.

  TokenSelect(logits [..., V], suppress [>= ceil(V / 32)] int32, control [R, CONTROL] int32) -> [R, 4] float32,
  R the rows of logits (its leading dims). Per row, on x = the logits row:
    y = x with NEG (float32's lowest, CTranslate2's DisableTokens value: never chosen over a live entry, adding 0 to
        a sum) at the ids whose bit is set in suppress (bit i % 32 of word i // 32), in [lo0, hi0) and [lo1, hi1),
        and at the four single ids (-1: none);
    check: where logsumexp(y[begin:]) > max(y[:begin]) (Whisper's "timestamps if their total probability beats
        every text token"), y[:begin] = NEG too;
    out = (argmax y (the lowest id of equal maxima), log_softmax(y) there, x[no_speech] - max x, log sum exp(x - max
        x)); the last two 0 where no_speech is -1. exp(out[2] - out[3]) is softmax(x)[no_speech].
  control's slots: RANGES (lo0, hi0, lo1, hi1), IDS (four ids), BEGIN, CHECK (0 or 1), NO_SPEECH, one unused.

The kernel sums in float32 in its own order (a work group a row, a fixed-order tree): the same bits every run, equal
to a float32 host computation within rounding."""
from __future__ import annotations

import numpy as np

from ..errors import ModelError
from ..kernels import spec
from ..plan import Push
from . import Op, register
from .state import _buffers

NEG = np.finfo(np.float32).min
CONTROL = 12                        # int32 a row of control
RANGES, IDS, BEGIN, CHECK, NO_SPEECH = 0, 4, 8, 9, 10
N_IDS = 4
THREADS = 1024                      # invocations a row at most (fewer where the device allows fewer)
SHARED_PER_THREAD = 12              # bytes: the kernel's (max, sum, id) a thread


def control(rows: int, vocab: int) -> np.ndarray:
    """[rows, CONTROL] int32 that suppresses nothing and asks for no no-speech figures."""
    c = np.zeros((rows, CONTROL), np.int32)
    c[:, IDS:IDS + N_IDS] = -1
    c[:, BEGIN] = vocab
    c[:, NO_SPEECH] = -1
    return c


def suppress_bits(ids, vocab: int) -> np.ndarray:
    """The suppress input: [ceil(vocab / 32)] int32 with bit i % 32 of word i // 32 set for each id."""
    ids = np.asarray(sorted({int(i) for i in ids}), np.int64)
    if len(ids) and (ids[0] < 0 or ids[-1] >= vocab):
        raise ValueError(f"suppressed ids must be in 0..{vocab - 1}, got {ids[0]}..{ids[-1]}")
    bits = np.zeros((vocab + 31) // 32, np.uint32)
    np.bitwise_or.at(bits, ids // 32, (np.uint32(1) << (ids % 32).astype(np.uint32)))
    return bits.view(np.int32)


def select_reference(logits, suppress, ctl) -> np.ndarray:
    """The op in float64 (module doc), from the definition: logits [R, V], suppress and ctl as the op's inputs."""
    x = np.asarray(logits, np.float64).reshape(len(ctl), -1)
    V = x.shape[1]
    off = ((np.asarray(suppress).view(np.uint32)[np.arange(V) // 32] >> (np.arange(V) % 32).astype(np.uint32))
           & 1).astype(bool)
    out = np.zeros((len(x), 4), np.float64)
    for r, (row, c) in enumerate(zip(x, np.asarray(ctl))):
        y = row.copy()
        y[off] = NEG
        for lo, hi in ((c[RANGES], c[RANGES + 1]), (c[RANGES + 2], c[RANGES + 3])):
            y[max(lo, 0):max(hi, 0)] = NEG
        y[[i for i in c[IDS:IDS + N_IDS] if 0 <= i < V]] = NEG
        begin = int(c[BEGIN])
        if c[CHECK] and 0 < begin < V and _lse(y[begin:]) > y[:begin].max():
            y[:begin] = NEG
        k = int(np.argmax(y))
        out[r, :2] = k, -np.log(np.exp(y - y[k]).sum())
        if c[NO_SPEECH] >= 0:
            m = row.max()
            out[r, 2:] = row[c[NO_SPEECH]] - m, np.log(np.exp(row - m).sum())
    return out.astype(np.float32)


def _lse(v):
    m = v.max()
    return m + np.log(np.exp(v - m).sum())


@register
class TokenSelect(Op):
    name = "TokenSelect"
    domain = "minirt"
    limits = ("internal: greedy decoding's next token from logits rows with masks (suppressed id bits, two ranges, "
              "four ids, the timestamp check); float32 [rows, 4] out; buffers")

    def infer(self, node, ins):
        x, bits, c = ins
        if len(x.shape) < 1 or bits.dtype != "int32" or c.dtype != "int32" or len(bits.shape) != 1 \
                or len(c.shape) != 2 or c.shape[1] != CONTROL:
            raise ModelError(f"{node}: expects logits [..., V], suppress [>= V / 32] int32 and control "
                             f"[rows, {CONTROL}] int32, got {list(x.shape)}, {list(bits.shape)} {bits.dtype}, "
                             f"{list(c.shape)} {c.dtype}")
        rows, V = int(np.prod(x.shape[:-1], dtype=np.int64)), x.shape[-1]
        if c.shape[0] != rows or bits.shape[0] < (V + 31) // 32:
            raise ModelError(f"{node}: logits {list(x.shape)} ({rows} rows of {V}) need control [{rows}, {CONTROL}] "
                             f"and suppress [{(V + 31) // 32}] or longer, got {list(c.shape)} and {list(bits.shape)}")
        return [((rows, 4), "float32")]

    def fold(self, node, ins):
        return None      # its inputs are run-time inputs

    def reference(self, node, logits, suppress, ctl):
        return [select_reference(logits, suppress, ctl)]

    def lower(self, node, ctx):
        _buffers(ctx, node)
        out, x, bits, c = ctx.t(node.outputs[0]), *(ctx.t(i) for i in node.inputs)
        rows, V = c.shape[0], x.shape[-1]
        prof = ctx.profile
        most = min(THREADS, prof.max_invocations, prof.max_local_size[0], prof.max_shared_memory // SHARED_PER_THREAD)
        # a power of two within the device's limits: the reduction family's rule makes it the work group
        threads = 1 << min(most.bit_length() - 1, max(V - 1, 1).bit_length())
        ctx.dispatch("token_select", [(out.name, "w"), (x.name, "r"), (bits.name, "r"), (c.name, "r")],
                     Push().ivec4(V, rows), spec("token_select"), (threads, rows, 1), "reduction",
                     flops=12 * rows * V, nbytes=4 * (rows * V + bits.numel + c.numel + 4 * rows), io="out32")
        ctx.note(f"{threads} invocations a row")
