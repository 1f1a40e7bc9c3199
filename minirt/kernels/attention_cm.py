"""Attention on cooperative matrices (glsl/attention_cm.comp): the fp16 path of the Attention op on devices with
VK_KHR_cooperative_matrix (f16 x f16 -> f32, 16 x 16 x 16, subgroups of 32), buffers only. Same semantics as
glsl/attention.comp; attention_fp32.lower hands over when `usable` says so.

Options (minirt/options.py):
  coopmat="off"        never take this path (the fp32-arithmetic attention kernel runs instead)
  coopmat="emulate"    take it even without cooperative matrices, running the kernel's impl=emu variant: the same
                       code with the matrix operations emulated by plain shared-memory code (slow; tests use it to
                       check the kernel's logic on devices such as lavapipe)
  coopmat_tile=(NR, KS, BK)  force a tile: NR row teams (16 query rows each), KS key splits, BK keys per block
  attention_splits=S   force S key splits across work groups (1: none), merged by glsl/attention_combine.comp"""
from __future__ import annotations

import math

from ..errors import UnsupportedError
from ..plan import Push
from . import attention_split
from .local_size import wave_splits
from .variants import spec

SHAPE = (16, 16, 16, "f16", "f16", "f32", "f32")
MAX_HEAD_DIM = 128
SUBGROUP = 32
MAX_PREFETCH = 8    # f16vec4 of K (and as many of V) an invocation carries from one block to the next
# (NR, KS, BK) in order of preference: a work group of NR * KS subgroups owns 16 NR query rows; its KS key splits
# take every KS-th block of BK keys. Measured on an H200 for Whisper-tiny's self-attention (tools/dev/attn_bench.py,
# docs/benchmarks.md, "fp16 attention on tensor cores"; the kernel as it was before its shared area): (4, 1, 32) 64 us, (4, 2, 32) 78 us,
# (2, 4, 16) 82 us, (4, 1, 64) 114 us, (2, 2, 32) 132 us. Four teams sharing one key stream, with no split merge at the
# end, beat more, smaller work groups; several of the others lost because their groups took two waves (a
# multiprocessor holds 48 KiB of shared memory: tools/dev/occupancy.py). Where keys split across groups, SPLIT_TILE first.
TILES = ((4, 1, 32), (4, 2, 32), (2, 4, 16), (4, 1, 64), (2, 2, 32), (2, 1, 64), (2, 1, 32), (1, 2, 32), (1, 2, 16),
         (1, 1, 32), (1, 1, 16))


def shared_bytes(dh, nr, ks, bk, emulate=False):
    """Shared memory of one work group, as glsl/attention_cm.comp declares it: each key split's K and V rows, and per
    team an area of 16 rows x max(BK + 4 floats, DH + 8 halves) for Q, S, P and O tiles in turn."""
    ns = nr * ks
    area_row = 16 * max(bk // 4 + 1, dh // 8 + 1)
    total = ks * 2 * bk * (dh + 8) * 2 + ns * 16 * area_row + 2 * ns * 16 * 4
    if emulate:
        total += ns * 512 * 4 + ns * 32 * 4 + 4
    return total


def tile_problem(dh, tile, shared, emulate=False):
    """Why (NR, KS, BK) cannot run head dim dh within `shared` bytes, or None."""
    nr, ks, bk = tile
    ns = nr * ks
    if min(tile) < 1 or ns & (ns - 1) or ns > 32:
        return f"NR * KS = {ns} subgroups is not a power of two up to 32"
    if bk % 16:
        return f"BK = {bk} is not a multiple of 16"
    if (bk * dh // 4) % (SUBGROUP * nr) or bk * dh // 4 // (SUBGROUP * nr) > MAX_PREFETCH:
        return f"a block of {bk} x {dh} does not split into 1 .. {MAX_PREFETCH} vec4 per staging invocation"
    if shared_bytes(dh, nr, ks, bk, emulate) > shared:
        return f"needs {shared_bytes(dh, nr, ks, bk, emulate)} bytes of shared memory, the device has {shared}"
    return None


# Where keys may be split across work groups (a discrete GPU that tells its multiprocessor count), this tile comes
# first if it then splits: 14 KiB, so 3 groups share an H200 multiprocessor and Whisper-tiny's 144 (query block,
# head) groups split twice in one wave. tools/dev/attn_bench.py on an H200 (docs/benchmarks.md): 1500 x 1500, 6 heads
# 56.6 us (with the combine pass) against 64.4 for (4, 1, 32) unsplit; 8 heads 58.1 against 64.6. Unsplit it is
# slower (83.6 us), so elsewhere TILES' order holds.
SPLIT_TILE = (4, 1, 16)


def pick_tile(ctx, dh, option="coopmat_tile", tiles=TILES, problem=None, what="(NR, KS, BK)"):
    """The tile for head dim dh on ctx's device: the one forced by the option named `option` (a tuple), else the
    first of `tiles` that fits, or None. problem(dh, tile, shared, emulate) says why a tile cannot run (default: this
    kernel's tile_problem). lower puts SPLIT_TILE first where it splits; attention_cmr.py picks its tiles here too."""
    problem = problem or tile_problem
    emulate = ctx.options.coopmat == "emulate"
    shared = ctx.profile.max_shared_memory
    forced = getattr(ctx.options, option)
    if forced is not None:
        tile = tuple(forced)
        why = problem(dh, tile, shared, emulate) if len(tile) == len(what.split(",")) else f"want {what}"
        if why:
            raise UnsupportedError(f"{option} {forced!r} for head dim {dh}: {why}")
        return tile
    return next((t for t in tiles if problem(dh, t, shared, emulate) is None), None)


def usable(ctx, dh):
    """Whether Attention with head dim dh runs on this path in ctx's plan."""
    opt = ctx.options.coopmat
    if opt == "off" or not ctx.half or ctx.storage != "buffer" or dh % 16 or not 16 <= dh <= MAX_HEAD_DIM:
        return False
    if opt != "emulate":
        p = ctx.profile
        if not (p.cooperative_matrix and SHAPE in tuple(map(tuple, p.coopmat_shapes)) and p.subgroup_size == SUBGROUP):
            return False
    return pick_tile(ctx, dh) is not None


def splits(ctx, shared, groups, tk, most=None):
    """Key splits S across work groups (SPLIT in glsl/attention_cm.comp and attention_cmr.comp, merged by
    attention_combine.comp) for `groups` work groups of `shared` bytes each: the most that still run in one wave of
    resident groups (multiprocessors x the groups its shared memory holds, at most `most` where registers bind), each
    split at least attention_split.SPLIT_MIN_KEYS keys; 1 where the multiprocessor count is unknown or on other than discrete
    GPUs. Session(options={"attention_splits": S}) forces S."""
    if ctx.options.attention_splits is not None:
        return attention_split.splits(ctx.profile, groups, tk, ctx.options)
    p = ctx.profile
    if not (p.compute_units and p.tuning.split_work):
        return 1
    slots = p.wave_slots(shared, most)
    return wave_splits(groups, slots, tk, attention_split.SPLIT_MIN_KEYS, attention_split.MAX_SPLITS)


def sizes(node, ctx):
    """(B, Tq, Tk, heads, head dim, emulated) of an Attention node in ctx's plan."""
    q, k = ctx.t(node.inputs[0]), ctx.t(node.inputs[1])
    heads = node.attrs.get("heads", 1)
    return q.shape[0], q.shape[1], k.shape[1], heads, q.shape[2] // heads, ctx.options.coopmat == "emulate"


def lower(node, ctx):
    B, Tq, Tk, heads, dh, emulate = sizes(node, ctx)
    tile, S = pick_tile(ctx, dh), None
    if ctx.options.coopmat_tile is None \
            and tile_problem(dh, SPLIT_TILE, ctx.profile.max_shared_memory, emulate) is None:
        s = splits(ctx, shared_bytes(dh, *SPLIT_TILE, emulate), -(-Tq // (16 * SPLIT_TILE[0])) * B * heads, Tk)
        if s > 1:    # SPLIT_TILE first where it splits
            tile, S = SPLIT_TILE, s
    nr, ks, bk = tile
    qblocks = -(-Tq // (16 * nr))
    if S is None:
        S = splits(ctx, shared_bytes(dh, *tile, emulate), qblocks * B * heads, Tk)
    ctx.note(f"cooperative-matrix attention{' (emulated)' if emulate else ''}: {16 * nr} query rows per work group, "
             f"{ks} key split(s) in a group, blocks of {bk} keys" + (f", keys split {S} ways across groups" if S > 1 else ""))
    emit(ctx, "attention_cm", emulate, node, lambda split: spec("attention_cm", DH=dh, NR=nr, KS=ks, BK=bk, SPLIT=split),
         SUBGROUP * nr * ks, qblocks, S)


def emit(ctx, stem, emulate, node, consts, local, qblocks, S, mask_binding=False, dtype=None):
    """The attention dispatch of a cooperative-matrix kernel (attention_cm.comp, attention_cmr.comp: the same bindings
    and push constants; impl=emu where `emulate`) with `local` invocations a work group, and where S > 1 its split
    partials and the combine pass. consts(split) gives the kernel's specialization constants. mask_binding: the kernel
    has attention_cmr.comp's binding 4 and push constants for a mask (q stands in where the node has none). dtype: the
    kernel's dtype variant at fp32 (attention_cmr's f16x3)."""
    out, q, k, v = ctx.t(node.outputs[0]), *(ctx.t(i) for i in node.inputs[:3])
    heads, scale = node.attrs.get("heads", 1), float(node.attrs.get("scale", 1.0))
    B, Tq, D = q.shape
    Tk = k.shape[1]
    dh = D // heads
    push = Push().ivec4(Tq, Tk, heads, D // 4).vec4(scale * math.log2(math.e))
    flops = 4 * B * heads * Tq * Tk * dh
    axes = {"impl": "emu" if emulate else "khr", **({"dtype": dtype} if dtype else {})}
    masked = len(node.inputs) > 3
    extra, tail = [], Push()
    if mask_binding:
        extra = [(ctx.t(node.inputs[3]).name if masked else q.name, "r")]
        tail.ivec4(*(node.attrs.get("mask_shape") if masked else (1, 1, 1, 1))).ivec4(int(node.attrs.get("nan_zero", 0)))
    # family "attention": the local x is exactly the global x given, so one work group = `local` invocations
    if S == 1:
        ctx.dispatch(stem, [(out.name, "w"), (q.name, "r"), (k.name, "r"), (v.name, "r"), *extra],
                     push.ivec4(1, 0).bytes() + tail.bytes(), consts(False), (local, qblocks, B * heads), "attention",
                     flops=flops, nbytes=4 * (2 * q.numel + k.numel + v.numel), axes=axes)
        return
    # partials as attention_fp32.py's split kernel writes them (fp32): O rows ((b * H + h) * S + s) * Tq + t of dh floats,
    # then one (m, l) pair per row
    rows = B * heads * S * Tq
    part = ctx.scratch("attention.partials", rows * (dh + 2))
    ml_base = rows * dh // 2
    ctx.dispatch(stem, [(part.name, "w"), (q.name, "r"), (k.name, "r"), (v.name, "r"), *extra],
                 push.ivec4(S, ml_base).bytes() + tail.bytes(), consts(True), (local, qblocks, B * heads * S),
                 "attention", flops=flops, nbytes=4 * (S * q.numel + k.numel + v.numel + rows * (dh + 2)), axes=axes)
    attention_split.combine_dispatch(ctx, out, part, B, Tq, heads, S, ml_base,
                                     nan_zero=int(node.attrs.get("nan_zero", 0)))
