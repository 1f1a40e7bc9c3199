"""How the attention kernels split their work across work groups: key splits (flash decoding, merged by
glsl/attention_combine.comp) and stream splits of the (query block, key block) items over one wave. Shared by the
fp32 kernel (attention_fp32.py), the tensor-core ones (attention_cm.py, attention_cmr.py) and the decoder's
(attention_cached.py); the combine pass's work group is sized here (head_rows_shape)."""
from __future__ import annotations

from ..device_profile import DeviceProfile
from ..plan import Push
from .variants import spec


# Key splits (flash decoding, glsl/attention_split.comp + attention_combine.comp). One work group per
# (query block, batch, head) may leave a big GPU with a ragged last wave. Splitting the keys S ways multiplies the
# groups by S at the price of an fp32 partial per split and a small combine pass. Where the driver tells the
# multiprocessor count (NVIDIA, AMD), S minimises ceil(groups * S / multiprocessors) / S (waves of work, each 1/S as
# long) + SPLIT_COST * (S - 1). On an H200 (132 SMs) with the (128, 8, 5) tile: Whisper-tiny (114 groups, one wave)
# runs 163 us unsplit and 171-172 with S = 2..4; Whisper-base (152 groups, two waves) 301 us unsplit, 245 / 226 / 222
# with S = 2 / 3 / 4, which the cost picks (SPLIT_COST fitted to those). Without a multiprocessor count: on discrete
# GPUs with at least SPLIT_FROM_GROUPS groups, the smallest S reaching SPLIT_TARGET_GROUPS. Never a split shorter than
# SPLIT_MIN_KEYS keys or more than MAX_SPLITS; S = 1 (one dispatch, no scratch) on every other device type
# (integrated and mobile GPUs and CPU drivers are filled by far fewer groups).
# Session(options={"attention_splits": S}) forces S.
SPLIT_COST = 0.06
SPLIT_FROM_GROUPS = 256
SPLIT_TARGET_GROUPS = 900
SPLIT_MIN_KEYS = 256
MAX_SPLITS = 16


# Stream splits (STREAM in glsl/attention.glslh), before the rule above where the multiprocessor count is known: the
# grid's (query block, key block) items are cut into as many equal ranges as the device runs groups at once (one wave),
# so no multiprocessor idles or waits for a ragged last wave; each range's pieces write partials that
# attention_combine.comp merges. H200, fp32 (tools/dev/dispatch_ab.py, docs/benchmarks.md): Whisper-tiny (114 groups of
# one a multiprocessor for 132) 160.8 -> 141.8 + 6.8 us an attention, the encoder 1634.6 -> 1573.6 us; Whisper-base
# (152 groups; the rule above split them 4 ways) 212.9 -> 180.3 + 7.0, the encoder 3526.4 -> 3344.1. Not where the
# groups fill whole waves. Session(options={"attention_stream": G}) forces G groups, False (or 0) turns it off;
# attention_splits=S forces plain splits instead.
STREAM_MAX_ITEMS = 2 ** 31 - 1


def stream_groups(ctx, groups, tk, bk, shared) -> int:
    """G work groups for a stream split of an attention of `groups` groups over `tk` keys in blocks of `bk`, or 0
    (then the plain splits of the rule above)."""
    opt = ctx.options.attention_stream
    if opt is False:
        return 0
    p = ctx.profile
    if opt is not True:
        G = opt
    elif ctx.options.attention_splits is not None or not (p.tuning.split_work and p.compute_units):
        return 0
    else:
        G = p.wave_slots(shared)
        if groups % G == 0:
            return 0
    nb = -(-tk // bk)
    G = min(G, groups * nb)     # no group without items: every group between a block's first and last holds some
    return G if 1 < G and groups * nb * (G + 1) <= STREAM_MAX_ITEMS else 0


def splits(profile, groups, tk, options=None):
    """Key splits S for an attention of `groups` work groups over `tk` keys (see the rule above); Options'
    attention_splits, where set, forces S."""
    if options is not None and options.attention_splits is not None:
        return options.attention_splits
    if not profile.tuning.split_work:
        return 1
    most = max(1, min(tk // SPLIT_MIN_KEYS, MAX_SPLITS))
    cu = profile.compute_units
    if cu:
        return min(range(1, most + 1), key=lambda s: -(-groups * s // cu) / s + SPLIT_COST * (s - 1))
    if groups < SPLIT_FROM_GROUPS:
        return 1
    return max(1, min(-(-SPLIT_TARGET_GROUPS // groups), most))


# The combine pass (glsl/attention_combine.comp, one invocation a vec4 of output) on NVIDIA (the device table's
# small_pass_invocations, 256): in a head's 16 vec4 columns by 16 rows it took 5.0-6.0 us a pass on an H200 against
# 5.6-6.9 in the elementwise rule's 8x8 (docs/benchmarks.md).
def head_rows_shape(head_vec4: int, profile: DeviceProfile):
    """Local size of the attention combine pass for heads of `head_vec4` vec4 columns (x: one head's columns, the
    lanes sharing a row's (m, l) pairs; y: rows), or None (the planner's elementwise rule)."""
    n = profile.tuning.small_pass_invocations
    if not n or n > profile.max_invocations or n % head_vec4 or head_vec4 > profile.max_local_size[0] \
            or n // head_vec4 > profile.max_local_size[1]:
        return None
    return (head_vec4, n // head_vec4, 1)


def combine_dispatch(ctx, out, part, B: int, Tq: int, heads: int, S: int, ml_base: int, stream=(0, 0, 0),
                     head_rows=False, nan_zero=0) -> None:
    """glsl/attention_combine.comp: out [B, Tq, D] from the S partials in `part` (unnormalised sums, then (m, l)
    pairs from `ml_base`, as the split kernels write them); stream: (G, query rows a block, key blocks) of a stream
    split, (0, 0, 0) for plain splits; head_rows: work groups of head_rows_shape where the device table gives one
(else the elementwise rule's); nan_zero: a row with no weight in any split (every score -inf) is 0, not NaN.
    One invocation per output vec4: S weighted vec4 adds (8 flops each) and S exp2 per row and column."""
    D = out.shape[-1]
    dh = D // heads
    rows = B * heads * S * Tq
    ctx.dispatch("attention_combine", [(out.name, "w"), (part.name, "r")],
                 Push().ivec4(Tq, heads, D // 4, S).ivec4(B, ml_base, nan_zero).ivec4(*stream),
                 spec("attention_combine", DH=dh),
                 (D // 4, Tq, B), "elementwise",
                 flops=2 * S * out.numel + 2 * S * B * Tq * D // 4, nbytes=4 * (rows * (dh + 2) + out.numel),
                 local_size=head_rows_shape(dh // 4, ctx.profile) if head_rows else None,
                 axes={"storage": ctx.storage})
