"""The decoder's attention over a key/value cache (glsl/cached_attention.comp, the CachedAttention op of
minirt/ops/state.py): ATTENTION_THREADS invocations a work group (set here: the kernel's tiles assume it), keys split
across work groups where one group a multiprocessor leaves most idle, merged by attention_split.py's combine pass.

Over every key (cross-attention: no causal length), the query rows that read the same K/V batch row go up to
ROWS_MAX at a time into one work group of glsl/cached_attention_rows.comp, which reads each key and value row once
for all of them: a step of 5 beams reading one encoder output (1500 keys) reads it once instead of 5 times, and a
prompt's tokens theirs ceil(P / ROWS_MAX) times instead of P. Which rows share is known when planning where K and V
hold one batch row (every query row) or a row a query batch row (its Tq rows); with the items map (a run-time
parameter a query batch row) the kernel groups consecutive batch rows that the map sends to the same K/V row (the
rows of one item lie together: BeamRows' beams, a search's rows of one window) and gives any other row a group of its
own. Session(options={"attention_rows": 1}) turns it off (a group a query row, cached_attention.comp)."""
from __future__ import annotations

from ..plan import Push
from .attention_split import combine_dispatch
from .variants import spec

ATTENTION_THREADS = 64            # glsl/cached_attention.comp: invocations a work group ...
ATTENTION_MAX_DH = 4 * ATTENTION_THREADS   # ... of which each takes a vec4 column of the head in the p v pass
SPLIT_MIN_KEYS, SPLIT_MAX = 32, 64          # key splits (attention_splits): keys a split at least, splits at most
ROWS_MAX = 8        # glsl/cached_attention_rows.comp: query rows a work group at most (its R; shared memory grows
                    # with R: 13 KiB at R = 8 and the largest head dim, 256)


def lower(node, ctx):
    """The dispatches of CachedAttention `node` (buffers)."""
    out, q, k, v = ctx.t(node.outputs[0]), *(ctx.t(i) for i in node.inputs)
    heads, param = int(node.attrs.get("heads", 1)), node.attrs.get("param")
    items = node.attrs.get("items", "")
    B, Tq, D = q.shape
    Bk, Tk, _ = k.shape
    dh = D // heads
    R, L = row_groups(ctx, B, Tq, Bk, bool(items), param is not None)
    grid = (Tq, B) if R == 1 or items else (-(-L // R), B * Tq // L)
    # work groups that do work; with items, as many as where the rows of one item lie together (the case grouping is
    # for: rows of different items take a group each, and the more key splits chosen here then cost a little)
    groups = heads * (B * Tq // L) * -(-L // R)
    S = key_splits(ctx, groups, Tk)
    rows = B * heads * S * Tq
    dst = out if S == 1 else ctx.scratch("cached_attention.partials", rows * (dh + 2))
    ip = ctx.param(items) + 1 if items else 0
    if R > 1:
        stem, consts = "cached_attention_rows", spec("cached_attention_rows", DH=dh, R=R)
        cfg, part = (Bk, B, L, S), (rows * dh // 2, ip, 0, 0)
        how = "rows that the items map sends to one, at run time" if items else f"work groups a head: {groups // heads}"
        ctx.note(f"up to {R} query rows reading one K/V row a work group ({how}): each key read once for them")
    else:
        stem, consts = "cached_attention", spec("cached_attention", DH=dh)
        cfg = (Bk, -1 if param is None else ctx.param(param), int(node.attrs.get("offset", 0)), S)
        part = (rows * dh // 2, ip, int(node.attrs.get("per_row", 0)), 0)
    n = Tk if param is None else Tk / 2      # keys seen on average, for the estimates
    ctx.dispatch(stem, [(dst.name, "w"), (q.name, "r"), (k.name, "r"), (v.name, "r"), (ctx.params_block().name, "r")],
                 Push().ivec4(Tq, Tk, heads, D).ivec4(*cfg).ivec4(*part).vec4(float(node.attrs.get("scale", 1.0))),
                 consts, (ATTENTION_THREADS * heads * S, *grid), "attention",
                 flops=int(4 * B * Tq * n * D), nbytes=int(4 * (2 * q.numel + 2 * Bk * n * D)),
                 local_size=(ATTENTION_THREADS, 1, 1), info={"splits": S, "rows": R})
    if S > 1:
        combine_dispatch(ctx, out, dst, B, Tq, heads, S, rows * dh // 2)
        ctx.note(f"keys split {S} ways ({groups} x {S} work groups), then a combine pass")


def row_groups(ctx, B: int, Tq: int, Bk: int, items: bool, causal: bool) -> tuple:
    """(R, L): query rows a work group at most (1: cached_attention.comp, a group a row), and the length of the runs
    of consecutive rows (flat, b Tq + t) that read one K/V row as far as planning knows: all B Tq rows where K and V
    hold one batch row, or (Options.attention_rows_by_map) where the run-time items map may send them all to one;
    else a query batch row's Tq rows. The map's grouping is off by default: a greedy batch sends each row to a clip of
    its own, and there the grouped grid only costs (idle row slots, other key splits). Only over every key (causal
    rows see keys of their own); Options.attention_rows caps R (1: off)."""
    L = B * Tq if Bk == 1 or (items and ctx.options.attention_rows_by_map) else Tq
    most = ctx.options.attention_rows
    R = min(ROWS_MAX if most is None else most, L)
    return (1, L) if causal or R < 2 else (R, L)


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
