"""Attention on cooperative matrices with the softmax in registers (glsl/attention_cmr.comp): the fp16 path of the
Attention op where the device keeps 16 x 16 matrix elements in the layout that kernel reads (DeviceProfile.
coopmat_layout == "mma", probed at start-up on devices with VK_KHR_cooperative_matrix), buffers only. Elsewhere
attention_cm.py's kernel, which moves S and P through shared memory, runs instead.

At precision fp32 with fp32_precision="f16x3" the same kernel's dtype=f16x3 variant (SPLIT3 in the source) runs the
Attention op from float32 q, k, v (and mask) to a float32 out: both products from fp16 hi and lo parts, three
products each, with the fp32 kernel's softmax (split_problem says where it cannot, and attention_fp32.lower then keeps
the fp32 SIMT kernel with a plan note).

Options (minirt/options.py):
  attention_cm_reg=False   keep attention_cm.comp even where this kernel could run
  coopmat="emulate"        the impl=emu variant (matrix operations and shuffles by plain code in the same layout), on
                           any fp16 device: how tests check the kernel's logic on lavapipe
  cmr_tile=(NR, BK)        force NR teams of 16 query rows and blocks of BK keys
  attention_splits=S       force S key splits across work groups (1: none), merged by glsl/attention_combine.comp"""
from __future__ import annotations

from . import attention_cm
from .variants import spec
from .attention_cm import MAX_HEAD_DIM, SHAPE, SUBGROUP, emit

# (NR, BK) in order of preference: four teams (64 query rows) sharing blocks of 32 keys. tools/dev/attn_bench.py on an H200
# (docs/benchmarks.md), 1500 x 1500 keys, 6 heads / 8 heads, GPU us with the combine pass: (4, 32) 36.0 (3 splits) /
# 40.3 (2 splits); (4, 16) 46.9 / 58.4; (2, 32) 46.4 / 68.6; (4, 64) 49.1 / 49.2 (unsplit), 56.4 / 58.1 (2 splits).
TILES = ((4, 32), (4, 16), (2, 32), (2, 16), (1, 32), (1, 16))
# Registers a multiprocessor's groups may hold: NVIDIA's driver gives the (4, 32) kernel 128 per invocation
# (tools/dev/occupancy.py stats), so 64K registers hold 4 groups of 128 invocations though 9 KiB of shared memory would
# allow 5; taken for every tile (16 / NR groups). Measured: tiny's 144 (query block, head) groups split 3 ways (432 in
# one wave of 528) 36.0 us, 4 ways (576) 38.6; base's 192 split 2 ways 40.3, 3 ways (576) 50.5.
REGISTERS_PER_INVOCATION = 128
# The f16x3 variant (H100: 133.9 us at tiny's shape against the fp32 kernel's 135.6, docs/benchmarks.md), its register
# count taken as the most NVIDIA's driver gives an invocation (it holds Q's two parts, the
# block's S and its corrections, P's two parts, O and the block's two P V sums), so that key splits never count on
# more resident groups than the registers may hold; tools/dev/occupancy.py on an H200 gives the real figure.
SPLIT_REGISTERS_PER_INVOCATION = 255
MAX_PREFETCH = 8     # f16vec4 of K (and as many of V) an invocation carries from one block to the next


def shared_bytes(dh, nr, bk, emulate=False, split=False):
    """Shared memory of one work group, as glsl/attention_cmr.comp declares it: a block's K and V rows (at the start
    the group's Q rows, where those are more), rows of dh + 8 halves; split (f16x3): each in a hi and a lo plane, and
    one int exponent per Q row, K row and V row."""
    planes = 2 if split else 1
    total = max(2 * bk, 16 * nr) * planes * (dh + 8) * 2
    if split:
        total += 4 * (16 * nr + 2 * bk)
    if emulate:
        total += nr * 512 * 4 + nr * 32 * 4
    return total


def tile_problem(dh, tile, shared, emulate=False, split=False):
    """Why (NR, BK) cannot run head dim dh within `shared` bytes (split: the f16x3 variant), or None."""
    nr, bk = tile
    if nr < 1 or nr & (nr - 1) or nr > 32:
        return f"NR = {nr} teams is not a power of two up to 32"
    if bk < 16 or bk % 16:
        return f"BK = {bk} is not a multiple of 16"
    per = bk * dh // 4
    if per % (SUBGROUP * nr) or per // (SUBGROUP * nr) > MAX_PREFETCH:
        return f"a block of {bk} x {dh} does not split into 1 .. {MAX_PREFETCH} vec4 per staging invocation"
    need = shared_bytes(dh, nr, bk, emulate, split)
    if need > shared:
        return f"needs {need} bytes of shared memory, the device has {shared}"
    return None


def pick_tile(ctx, dh, split=False):
    """The (NR, BK) for head dim dh (or the forced cmr_tile), or None; split: for the f16x3 variant."""
    return attention_cm.pick_tile(ctx, dh, "cmr_tile", TILES,
                                  lambda d, t, sh, em: tile_problem(d, t, sh, em, split), "(NR, BK)")


def usable(ctx, dh):
    """Whether Attention with head dim dh runs on this kernel in ctx's plan."""
    opt = ctx.options.coopmat
    if opt == "off" or not ctx.options.attention_cm_reg:
        return False
    if not ctx.half or ctx.storage != "buffer" or dh % 16 or not 16 <= dh <= MAX_HEAD_DIM:
        return False
    if opt != "emulate":
        p = ctx.profile
        if not (p.cooperative_matrix and SHAPE in tuple(map(tuple, p.coopmat_shapes)) and p.subgroup_size == SUBGROUP
                and p.coopmat_layout == "mma"):
            return False
    return pick_tile(ctx, dh) is not None


def split_problem(ctx, dh):
    """Why the f16x3 variant (fp32 attention from split operands) cannot run Attention with head dim dh in ctx's plan,
    or None. It needs what the fp16 kernel needs (the 16x16x16 f16 x f16 -> f32 shape in the "mma" layout, subgroups
    of 32, buffers) and subgroup shuffles (rows' largest values at staging) and shaderFloat16, at fp32; coopmat=emulate
    needs only shaderFloat16."""
    opt, p = ctx.options.coopmat, ctx.profile
    if opt == "off":
        return "option coopmat=off"
    if not ctx.options.attention_cm_reg:
        return "option attention_cm_reg=False"
    if ctx.storage != "buffer":
        return "the kernel reads buffers, not textures"
    if dh % 16 or not 16 <= dh <= MAX_HEAD_DIM:
        return f"head dim {dh} is not a multiple of 16 in 16 .. {MAX_HEAD_DIM}"
    if not p.fp16:
        return "the device has no shaderFloat16"
    if opt != "emulate":
        if not (p.cooperative_matrix and SHAPE in tuple(map(tuple, p.coopmat_shapes))):
            return "the device has no 16x16x16 f16 x f16 -> f32 cooperative matrices"
        if not (p.coopmat_layout == "mma" and p.subgroup_size == SUBGROUP and p.subgroup_shuffle):
            return "the kernel reads the 'mma' element layout, in subgroups of 32 with shuffles"
    if pick_tile(ctx, dh, split=True) is None:
        return "no tile fits the device's shared memory"
    return None


def lower(node, ctx, split=False):
    """The Attention node on this kernel: at fp16, or with split (fp32_precision f16x3, where split_problem allows) its
    dtype=f16x3 variant at fp32."""
    B, Tq, Tk, heads, dh, emulate = attention_cm.sizes(node, ctx)
    nr, bk = pick_tile(ctx, dh, split)
    qblocks = -(-Tq // (16 * nr))
    # groups a multiprocessor's registers hold
    regs = SPLIT_REGISTERS_PER_INVOCATION if split else REGISTERS_PER_INVOCATION
    most = max(1, ctx.profile.tuning.register_file // (regs * SUBGROUP * nr))
    S = attention_cm.splits(ctx, shared_bytes(dh, nr, bk, emulate, split), qblocks * B * heads, Tk, most)
    if split:
        ctx.note(f"fp32_precision {ctx.options.fp32_precision}: fp32 attention on tensor cores from split operands "
                 f"(Q, K, V and P as fp16 hi + lo, three products each, fp32 softmax and sums; attention_cmr's "
                 f"dtype=f16x3 variant)")
    ctx.note(f"cooperative-matrix attention, softmax in registers{' (emulated)' if emulate else ''}: {16 * nr} query "
             f"rows per work group, blocks of {bk} keys" + (f", keys split {S} ways across groups" if S > 1 else ""))
    # VEC8 (16-byte loads of K and V) where both start 16-byte aligned: D = heads x dh is a multiple of 8 halves. The
    # split variant's fp32 vec4 loads are 16 bytes already.
    k, v = ctx.t(node.inputs[1]), ctx.t(node.inputs[2])
    vec8 = not split and all(ctx.plan.byte_offset(t.name) % 16 == 0 for t in (k, v))
    masked = len(node.inputs) > 3
    emit(ctx, "attention_cmr", emulate, node,
         lambda parts: spec("attention_cmr", DH=dh, NR=nr, BK=bk, SPLIT=parts, VEC8=vec8, MASK=masked,
                            trim_from="VEC8"),
         SUBGROUP * nr, qblocks, S, mask_binding=True, dtype=ctx.options.fp32_precision if split else None)
