"""The decoder's attention over a key/value cache (glsl/cached_attention.comp, the CachedAttention op of
minirt/ops/state.py): ATTENTION_THREADS invocations a work group (set here: the kernel's tiles assume it), keys split
across work groups where one group a multiprocessor leaves most idle, merged by attention_split.py's combine pass."""
from __future__ import annotations

from ..plan import Push
from .attention_split import combine_dispatch
from .variants import spec

ATTENTION_THREADS = 64            # glsl/cached_attention.comp: invocations a work group ...
ATTENTION_MAX_DH = 4 * ATTENTION_THREADS   # ... of which each takes a vec4 column of the head in the p v pass
SPLIT_MIN_KEYS, SPLIT_MAX = 32, 64          # key splits (attention_splits): keys a split at least, splits at most


def lower(node, ctx):
    """The dispatches of CachedAttention `node` (buffers)."""
    out, q, k, v = ctx.t(node.outputs[0]), *(ctx.t(i) for i in node.inputs)
    heads, param = int(node.attrs.get("heads", 1)), node.attrs.get("param")
    B, Tq, D = q.shape
    Bk, Tk, _ = k.shape
    dh = D // heads
    S = key_splits(ctx, heads * Tq * B, Tk)
    rows = B * heads * S * Tq
    dst = out if S == 1 else ctx.scratch("cached_attention.partials", rows * (dh + 2))
    items = node.attrs.get("items", "")
    p = (Push().ivec4(Tq, Tk, heads, D).ivec4(Bk, -1 if param is None else ctx.param(param),
                                              int(node.attrs.get("offset", 0)), S)
         .ivec4(rows * dh // 2, ctx.param(items) + 1 if items else 0, int(node.attrs.get("per_row", 0)), 0)
         .vec4(float(node.attrs.get("scale", 1.0))))
    n = Tk if param is None else Tk / 2      # keys seen on average, for the estimates
    ctx.dispatch("cached_attention", [(dst.name, "w"), (q.name, "r"), (k.name, "r"), (v.name, "r"),
                                      (ctx.params_block().name, "r")],
                 p, spec("cached_attention", DH=dh), (ATTENTION_THREADS * heads * S, Tq, B), "attention",
                 flops=int(4 * B * Tq * n * D), nbytes=int(4 * (2 * q.numel + 2 * Bk * n * D)),
                 local_size=(ATTENTION_THREADS, 1, 1), info={"splits": S})
    if S > 1:
        combine_dispatch(ctx, out, dst, B, Tq, heads, S, rows * dh // 2)
        ctx.note(f"keys split {S} ways ({heads * Tq * B} x {S} work groups), then a combine pass")


def key_splits(ctx, groups: int, keys: int) -> int:
    """Key splits of a CachedAttention of `groups` (batch row, head, query row) triples over up to `keys` keys: as
    many as fill one work group a multiprocessor (a decoder step has a few triples and up to 1500 keys), each split
    keeping at least SPLIT_MIN_KEYS keys; 1 where the device table does not split work or has no multiprocessor
    count. Session(options={"attention_splits": S}) forces S (at most one a key)."""
    if ctx.options.attention_splits is not None:
        return max(1, min(int(ctx.options.attention_splits), keys))
    profile = ctx.profile
    if not (profile.compute_units and profile.tuning.split_work):
        return 1
    return max(1, min(profile.compute_units // max(groups, 1), keys // SPLIT_MIN_KEYS, SPLIT_MAX))
