"""The attention family's entry and its fp32 kernel: lower picks the variant for an Attention node (the tensor-core
ones in attention_cmr.py and attention_cm.py, else glsl/attention.comp, split across work groups by
attention_split.py's rules) and holds the fp32 kernel's tiles (threads, column groups KG, rows RT, keys NK)."""
from __future__ import annotations

import math

from ..errors import MinirtError, UnsupportedError
from ..plan import Push
from . import attention_cm, attention_cmr
from .attention_split import combine_dispatch, splits, stream_groups
from .gemm import paired_lanes
from .variants import spec

MAX_HEAD_DIM = 128
# (threads, column groups KG, rows per thread RT, keys per thread NK) in order of preference; the first whose KG divides
# dh / 4 and whose tiles fit the shared memory wins. A work group owns RT * threads / KG query rows and steps over
# NK KG keys at a time (NK KG a multiple of 4: P V reads P as vec4).
# Measured on an H200 (tools/dev/attn_bench.py, docs/benchmarks.md), Whisper-tiny, dh = 64, with the register prefetch:
# (128, 8, 5) 163 us, (128, 16, 5) 186, (128, 4, 3) 212, (256, 16, 3) 213, (128, 16, 4) 233; 64-thread groups 270-500.
# Thread counts that give exactly one wave of groups (112 threads, 70 rows: 132 groups on 132 SMs) gained nothing.
# (128, 8, 5) gives each invocation a 5 x 8 output tile: 13 shared loads per 160 FMAs in P V against 9 per 80 for
# (128, 16, 5); it needs 44.5 KiB. Twice the warps in the same shared memory, (256, 16, 5, 2), took 161.5 us against
# 163.2 (docs/benchmarks.md, "fp32 attention tiles and K/V prefetch"), so NK stays 4.
TILES = ((128, 8, 5, 4), (128, 16, 5, 4), (128, 16, 3, 4), (128, 8, 4, 4), (64, 16, 4, 4), (64, 8, 4, 4)) + \
    tuple((32, kg, rt, 4) for kg in (16, 8, 4, 2, 1) for rt in (4, 2, 1))   # small groups for any other head dim
# Tried first where invocations are paired on column groups (PAIR_LANES, gemm.paired_lanes). With pairing, K and
# V loads cost as little as Q and P loads, so taller tiles gain: H200, tools/dev/dispatch_ab.py (docs/benchmarks.md,
# "fp32 attention tiles and K/V prefetch"), an attention of Whisper-tiny (layers 1-3) 125-131 us against 132-139 for (128, 8, 5, 4);
# (256, 16, 5, 2) 128-132, (128, 8, 5, 3) 128-131, (128, 8, 6, 2) 132-135. Whisper-base likewise (165-170 against
# 173-179). 45.4 KiB.
PAIRED_TILES = ((128, 8, 6, 3),)
MAX_PREFETCH = 8    # vec4 of K or V an invocation may carry between phases (Whisper's (128, 8, 5): 4)
# CPU drivers (lavapipe) gain more from fewer, taller work groups (less K/V restaging) than from short blocks.
CPU_TILES = ((128, 8, 3, 4),)


def shared_bytes(dh, threads, kg, rt, nk=4):
    p4, bq, bk = dh // 4 + 1, rt * threads // kg, nk * kg
    return 16 * p4 * (bq + bk) + 4 * bq * (bk + 4 + kg)


def tiles(dh, shared, cpu=False, paired=False):
    """(threads, KG, RT, NK) for head dim dh within `shared` bytes of shared memory, or None; paired: PAIRED_TILES
    first."""
    order = (CPU_TILES if cpu else ()) + (PAIRED_TILES if paired else ()) + TILES
    return next((t for t in order if (dh // 4) % t[1] == 0 and shared_bytes(dh, *t) <= shared), None)


def forced_tile(value, dh, profile):
    """Session(options={"attention_tile": "THREADSxKGxRTxNK"}) (or a tuple; without NK, NK = 4), checked against
    head dim and device; returns (threads, KG, RT, NK)."""
    try:
        t = tuple(int(v) for v in (value.split("x") if isinstance(value, str) else value))
        if len(t) not in (3, 4) or min(t) < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise MinirtError(f"option attention_tile must be THREADSxKGxRT or THREADSxKGxRTxNK (positive integers), "
                          f"got {value!r}") from None
    t = t + (4,) * (4 - len(t))
    threads, kg, rt, nk = t
    why = (f"KG {kg} does not divide head dim / 4 = {dh // 4}" if (dh // 4) % kg else
           f"{threads} threads are not a multiple of KG {kg}" if threads % kg else
           f"NK {nk} x KG {kg} = {nk * kg} keys per block, not a multiple of 4" if nk * kg % 4 else
           f"{threads} threads exceed the device's {profile.max_invocations}" if threads > profile.max_invocations else
           f"it needs {shared_bytes(dh, *t)} bytes of shared memory, the device has {profile.max_shared_memory}"
           if shared_bytes(dh, *t) > profile.max_shared_memory else None)
    if why:
        raise MinirtError(f"option attention_tile={value!r} is refused: {why}")
    return t


def lower(node, ctx):
    """Dispatches computing Attention `node`: the tensor-core variants where they can run, else the fp32 kernel."""
    dh = ctx.t(node.inputs[0]).shape[-1] // node.attrs.get("heads", 1)
    masked = len(node.inputs) > 3
    scheme = ctx.options.fp32_precision
    if scheme != "ieee" and not ctx.half:     # fp32 from split operands on tensor cores (attention_cmr f16x3)
        why = attention_cmr.split_problem(ctx, dh)
        if why is None:
            return attention_cmr.lower(node, ctx, split=True)
        ctx.note(f"fp32_precision {scheme} not applied to attention ({why}): the fp32 SIMT kernel")
    if attention_cmr.usable(ctx, dh):      # the softmax in registers, where the element layout allows
        return attention_cmr.lower(node, ctx)
    if masked and attention_cm.usable(ctx, dh):
        ctx.note("masked: the scalar half kernel, not attention_cm (which takes no mask)")
    elif attention_cm.usable(ctx, dh):
        return attention_cm.lower(node, ctx)
    out, q, k, v = ctx.t(node.outputs[0]), *(ctx.t(i) for i in node.inputs[:3])
    # the mask's binding; without one, q stands in (the kernel never reads it: MASK is off)
    mask = ctx.t(node.inputs[3]) if masked else q
    nan_zero = int(node.attrs.get("nan_zero", 0))
    heads, scale = node.attrs.get("heads", 1), float(node.attrs.get("scale", 1.0))
    B, Tq, D = q.shape
    Tk = k.shape[1]
    dh = D // heads
    forced = ctx.options.attention_tile
    p = ctx.profile
    paired = paired_lanes(p, ctx.options)
    tile = (forced_tile(forced, dh, p) if forced is not None else
            tiles(dh, p.max_shared_memory, p.tuning.attention_cpu_tiles, paired))
    if tile is None:
        raise UnsupportedError(f"{node}: head dim {dh} needs more shared memory than this device's "
                               f"{ctx.profile.max_shared_memory} bytes")
    threads, kg, rt, nk = tile
    qblocks = -(-Tq // (rt * threads // kg))
    S = splits(ctx.profile, qblocks * B * heads, Tk, ctx.options)
    push = Push().ivec4(Tq, Tk, heads, D // 4).vec4(scale * math.log2(math.e)) \
        .ivec4(*(node.attrs.get("mask_shape") if masked else (1, 1, 1, 1))) \
        .ivec4(nan_zero, int(mask.storage == "texture" and mask.packed_dim == 2))
    # row maxima by subgroup shuffles (buffers; subgroups holding whole column-group clusters); option
    # attention_shuffle=False keeps the shared-memory reduction
    # invocations paired on a column group (attention.glslh PAIR_LANES): a row's KG threads then span 2 KG lanes,
    # which the shuffles need in one subgroup
    pair = paired and (threads // kg) % 2 == 0
    lanes = 2 * kg if pair else kg
    shuffle = (ctx.storage == "buffer" and p.subgroup_shuffle and p.subgroup_size >= lanes
               and p.subgroup_size % lanes == 0 and ctx.options.attention_shuffle)
    axes = {"storage": ctx.storage, "max": "shuffle" if shuffle else "smem"}
    # K and V staged through registers one phase ahead (attention.glslh PREFETCH): on an H200 228 -> 186 us
    # (tiny, (128, 16, 5)), 193 -> 163 ((128, 8, 5)). Off on CPU drivers, where there is no latency to hide, and
    # where an invocation would carry more than MAX_PREFETCH vec4 (small groups, big heads), which would spill.
    carried = -(-nk * kg * (dh // 4) // threads)
    prefetch = p.tuning.attention_prefetch and carried <= MAX_PREFETCH
    if ctx.options.attention_prefetch is not None:
        prefetch = ctx.options.attention_prefetch
    consts = dict(DH=dh, KG=kg, RT=rt, PREFETCH=prefetch, NK=nk, PAIR_LANES=pair, MASK=masked)   # attention.glslh's
    flops = 4 * B * heads * Tq * Tk * dh
    bk = nk * kg
    G = stream_groups(ctx, qblocks * B * heads, Tk, bk, shared_bytes(dh, threads, kg, rt, nk))
    # family "attention": the local x is exactly the global x given, so one work group = `threads` invocations
    if S == 1 and not G:
        ctx.dispatch("attention", [(out.name, "w"), (q.name, "r"), (k.name, "r"), (v.name, "r"), (mask.name, "r")],
                     push, spec("attention", trim_from="PAIR_LANES", **consts), (threads, qblocks, B * heads),
                     "attention", flops=flops, nbytes=4 * (2 * q.numel + k.numel + v.numel), axes=axes)
        return
    # Partials, fp32 whatever the storage and precision: rows ((b * H + h) * S + s) * Tq + t of dh floats
    # (unnormalised O), then one (m, l) pair per row from float rows * dh on (layout in glsl/attention.glslh).
    if G:
        # slots per (batch, head): the most groups whose ranges touch one query block's key blocks (the kernel's
        # and the combine pass's formula: the first group holding item u is ((u + 1) G - 1) // U)
        nb = -(-Tk // bk)
        U = qblocks * B * heads * nb
        S = max(((sg * nb + nb) * G - 1) // U - ((sg * nb + 1) * G - 1) // U + 1 for sg in range(U // nb))
    rows = B * heads * S * Tq
    part = ctx.scratch("attention.partials", rows * (dh + 2))
    ml_base = rows * dh // 2          # in (m, l) pairs
    grid = (threads, 1, G) if G else (threads, qblocks, B * heads * S)
    ctx.dispatch("attention_split", [(part.name, "w"), (q.name, "r"), (k.name, "r"), (v.name, "r"),
                                     (mask.name, "r")],
                 push.ivec4(S, ml_base, B * heads, 1 if G else 0),
                 spec("attention_split", trim_from="PAIR_LANES", **consts), grid, "attention",
                 flops=flops, nbytes=4 * (S * q.numel + k.numel + v.numel + rows * (dh + 2)), axes=axes)
    combine_dispatch(ctx, out, part, B, Tq, heads, S, ml_base, (G, rt * threads // kg, -(-Tk // bk)),
                     head_rows=True, nan_zero=nan_zero)
    ctx.note(f"keys split {S} ways: {qblocks * B * heads} x {S} work groups, then a combine pass; "
             f"partials {rows * (dh + 2) * 4 / 2**20:.1f} MiB" if not G else
             f"(query block, key block) items in {G} equal ranges, one a work group (stream split), then a "
             f"combine pass; partials {rows * (dh + 2) * 4 / 2**20:.1f} MiB")
