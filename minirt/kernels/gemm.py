"""The GEMM family: the tiled GEMM (glsl/gemm.comp), shared by conv routes (im2col, pointwise) and linear layers;
glsl/linear.comp's tiles, K splits and paired lanes; the tensor-core GEMMs (glsl/linear_cm*.comp, linear_cmreg*.comp)
with their tiles, weight packing and split reduce pass, and glsl/linear_cm2.comp (VK_NV_cooperative_matrix2) with its
tiles; the few-row GEMM (glsl/linear_rows.comp) and its push layout; and the local-size rules of the "gemm" and
"im2col" families (local_size, im2col_local_size), which only this module sets.

Tile shape of glsl/gemm.comp: each invocation computes TM rows x 4*TN4 columns; the work group (its local size chosen
by local_size here) stages BK-deep slices of A and B in shared memory."""
from __future__ import annotations

import numpy as np

from ..device_profile import DeviceProfile
from ..errors import MinirtError
from ..plan import Push
from .local_size import (check_local_size, clamp, default_budget, extent_room, fit_shared, forced_local_size, grow,
                         largest_first, pow2_floor, wave_places, wave_splits)
from .variants import ROW_VEC4_PER_LANE, act_code, spec


def tile_config(profile) -> tuple[int, int, int]:
    """(TM, TN4, BK) for a device: 4x4 outputs per invocation, 16-deep stages. Keeping 16 accumulators
    per invocation stays clear of register spills on every GPU we know of."""
    return 4, 1, 16


class GemmWeight:
    """A GEMM's B [K, N] (its source times `scale`), packed once its dispatch knows the kernel: [Kp][N4] vec4 for
    linear.comp, gemm.comp and linear_cm (row_major), per slice and lane for linear_cmreg (regfed). Each packing is
    made once, however many dispatches read it (a conv's row tiles), and once in a planning call, however many
    plans pack it (LowerCtx.weight's key: the packing, the source by content and the scale)."""

    def __init__(self, name: str, b_kn: np.ndarray, scale: float = 1.0):
        self.name, self.source, self.scale = name, np.asarray(b_kn, np.float32), float(scale)
        self._b_kn = None

    @property
    def b_kn(self) -> np.ndarray:
        if self._b_kn is None:    # (a copy of a vocabulary projection costs a second or two at large-v3's shapes)
            self._b_kn = self.source if self.scale == 1.0 else self.source * np.float32(self.scale)
        return self._b_kn

    def _packed(self, ctx, key, how, pack):
        spec = ctx.plan.tensors.get(f"{key}@packed")
        return spec if spec is not None else ctx.weight(key, pack, key=(how, self.source, self.scale))

    def row_major(self, ctx):
        def pack():
            k, n = self.b_kn.shape
            w = np.zeros((-(-k // 4) * 4, -(-n // 4) * 4), np.float32)
            w[:k, :n] = self.b_kn
            return w
        return self._packed(ctx, self.name, "row_major", pack)

    def regfed(self, ctx):
        return self._packed(ctx, f"{self.name}@regfed", "regfed", lambda: pack_regfed(self.b_kn))

    def split(self, ctx, scheme):
        """(the fp16 hi and lo parts packed for linear_cmreg's split variant, the float32 2^-s of each column) for
        fp32_precision `scheme` (split_f16x3): float16 and float32 weights in the plan."""
        key = f"{self.name}@{scheme}"
        if f"{key}@packed" not in ctx.plan.tensors:
            how, parts = (scheme, self.source, self.scale), []

            def split():        # (hi, lo, inv), made where a packing of them is not made yet
                parts[:] = parts or split_f16x3(self.b_kn)
                return parts
            w = ctx.weight(key, lambda: pack_regfed_split(*split()[:2]), dtype="float16", key=("hi_lo",) + how)
            scales = ctx.weight(f"{key}.colscale", lambda: np.pad(split()[2], (0, -len(split()[2]) % 16)),
                                key=("colscale",) + how)
            ctx.note(f"fp32_precision {scheme}: fp32 GEMM on tensor cores from split operands: weights as fp16 hi and "
                     f"lo parts ({w.name}, {w.dtype} [{w.shape[0]}]) and column scales ({scales.name}), activations "
                     f"split as loaded")
        return ctx.plan.tensors[f"{key}@packed"], ctx.plan.tensors[f"{key}.colscale@packed"]


def pack_weight(ctx, name: str, b_kn: np.ndarray, scale: float = 1.0):
    """B [K, N] (times scale) as a GemmWeight (packed by the dispatch that reads it) and N4, its vec4 columns."""
    return GemmWeight(name, b_kn, scale), -(-b_kn.shape[1] // 4)


def pack_bias(ctx, name: str, bias, n: int):
    b = np.zeros(-(-n // 4) * 4, np.float32)
    if bias is not None:
        b[:n] = np.asarray(bias, np.float32).reshape(-1)
    return ctx.weight(name, b)


def gemm_dispatch(ctx, out, a, wt, bt, m, n, k, n4, *, a_mode=0, out_mode=0, act=None, m0=0, lda=None,
                  scratch=False, groups=1):
    """out[m0 : m0 + m] = act(A @ B + bias); `a` is the A tensor (activation or im2col scratch), `wt` B as pack_weight
    gives it. groups > 1 (a_mode 1, out_mode 0): group z multiplies channels z * k .. of A by rows z * k .. of B into
    output rows z * m .., one work-group layer each."""
    tm, tn4, bk = tile_config(ctx.profile)
    p = (Push().sizes(out).sizes(a).ivec4(m, n, k, n4)
         .ivec4(m0, lda if lda is not None else k, a.packed_dim, 0))
    ctx.dispatch("gemm", [(out.name, "w"), (a.name, "r"), (wt.row_major(ctx).name, "r"), (bt.name, "r")], p,
                 spec("gemm", TM=tm, TN4=tn4, BK=bk, A_MODE=a_mode, OUT_MODE=out_mode, ACT=act_code(act)),
                 (-(-n4 // tn4), -(-m // tm), groups), "gemm", flops=2 * groups * m * n * k,
                 nbytes=4 * groups * (m * k + k * n + m * n),
                 axes={"storage": ctx.storage, "a": "scratch" if scratch else "act"})


# Local sizes of the GEMM family's work groups.
# Non-Adreno GEMM: square tiles load the fewest A/B edges per output.
GEMM_SHAPE = (8, 8, 1)
# Adreno 840: 8x8x1 and 4x16x1 corrupt whole work groups of the tiled GEMM
# family (linear, matmul, conv GEMM) in 10-23% of runs; 16x4, 32x2, 64x1,
# 2x32 and 1x64 are clean.  ExecuTorch uses 16x4x1 there unconditionally.
ADRENO_GEMM = (16, 4, 1)
DESKTOP_MIN_GROUPS = 256   # "desktop" GEMM groups (DeviceProfile.tuning.gemm_groups): 256 invocations when this many
# Desktop GPUs whose driver tells the multiprocessor count: the GEMM shape with the fewest waves of work, each
# wave costing x + y (a group's shared-memory staging per output, which bounds these kernels more than the FMAs),
# among these shapes (ties keep this order). A wave is as many groups as run at once: where the dispatch declares its
# shared memory per local x and y (Dispatch.shared_xy), the groups that memory lets share a multiprocessor
# (DeviceProfile.wave_slots), else one a multiprocessor. On an H200 (132 SMs, 48 KiB a multiprocessor;
# tools/dev/dispatch_ab.py, docs/benchmarks.md) for glsl/linear.comp's 32-deep slices (512 bytes per x and per y) it takes
# 16x12 (14 KiB, 3 a multiprocessor) for Whisper's 3000 x 384 conv1 (26.9 us against 29.0 in 24x12) and 1500 x 1536
# fc1, 16x8 (4 a multiprocessor) for the 1500 x 1152 QKV GEMM (51.9 against 54.9). 12x12 and 8x16 were slower on
# every Whisper GEMM (docs/benchmarks.md, "GEMM work-group shapes (WAVE_SHAPES)") and are not offered.
WAVE_SHAPES = ((16, 16), (16, 8), (24, 12), (16, 12), (24, 16))


def _gemm(g, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    rule = profile.tuning.gemm_groups
    if rule == "adreno":
        return clamp(ADRENO_GEMM, profile)
    # 8x8 shrunk to what x/y need (1 -> 1); the spare share goes to the other
    # of x/y.  Effective table: (8,8) if x,y >= 5; (64,1) (32,2) (16,4) for
    # y = 1, 2, 3..4 and the transposes.  z stays 1: batches go to group count.
    need, budget = extent_room(g, profile), default_budget(profile)
    shape = GEMM_SHAPE
    waves = _by_waves(g, profile, shared_xy) if rule == "desktop" else None
    if waves:
        return waves
    if rule == "desktop" and -(-g[0] // 16) * -(-g[1] // 16) >= DESKTOP_MIN_GROUPS:
        # Big GPUs hide latency with 256-invocation groups (16x16 measured faster than 8x8 on an H200),
        # but only while there are enough of them to spread over every multiprocessor; smaller GEMMs
        # (Whisper's 1500 x 384 outputs) balance better with 4x as many 8x8 groups.
        budget = min(256, pow2_floor(profile.max_invocations))
        shape = (16, 16)
    elif rule == "desktop" and -(-g[0] // 16) * -(-g[1] // 8) >= DESKTOP_MIN_GROUPS:
        # In between, 16x8 groups (128 invocations) still make enough groups and beat 8x8 on an H200 for
        # Whisper's 1500 x 384 outputs (QKV-sized 27.2 vs 28.1 us, fc2 -7%: docs/benchmarks.md).
        budget = min(128, pow2_floor(profile.max_invocations))
        shape = (16, 8)
    start = clamp([min(shape[i], need[i]) for i in (0, 1)] + [1], profile, budget)
    return grow(start, need, [i for i in largest_first(g) if i < 2], budget)


def _wave_shapes(g, profile: DeviceProfile):
    """WAVE_SHAPES that fit the device, if it has a multiprocessor count and the GEMM fills the largest; else []."""
    fits = [(x, y) for x, y in WAVE_SHAPES if x * y <= profile.max_invocations and x <= profile.max_local_size[0]
            and y <= profile.max_local_size[1]]
    if not profile.compute_units or not fits or g[0] < max(x for x, _ in fits) or g[1] < max(y for _, y in fits):
        return []
    return fits


def _by_waves(g, profile: DeviceProfile, shared_xy=()):
    """WAVE_SHAPES' choice for a GEMM big enough to fill its largest shape, on a device with a multiprocessor count;
    else None."""
    fits = _wave_shapes(g, profile)
    if not fits:
        return None

    def cost(s):
        groups = -(-g[0] // s[0]) * -(-g[1] // s[1])
        return -(-groups // wave_places(s, profile, shared_xy)) * (s[0] + s[1])
    x, y = min(fits, key=cost)
    return (x, y, 1)


def _busy(g, shape, profile: DeviceProfile, shared_xy, splits=1) -> float:
    """The share of the places a GEMM's groups (times its K splits) keep busy over the waves they take."""
    groups = -(-g[0] // shape[0]) * -(-g[1] // shape[1]) * splits
    places = wave_places(shape, profile, shared_xy)
    return groups / (-(-groups // places) * places)


def gemm_split_shape(g, profile: DeviceProfile, shared_xy, units: int, min_units: int, most: int):
    """(local size, S) for a GEMM over grid g whose K (`units` slices) may split S ways across work groups
    (glsl/linear.comp OUT_MODE 3), or None (then unsplit, in the plain rule's shape). Of WAVE_SHAPES, the one whose
    split groups fill the most of one wave (wave_splits: the most splits that still fit it, each at least min_units
    slices), ties to the smaller x + y, taken where it keeps more of the places busy than the plain rule's unsplit
    shape does over its waves: on an H200 Whisper's 1500 x 384 outputs split twice in 16x12 groups (384 of 396 places,
    against 282 of 528 unsplit in 16x8; fc2 63.2 us against 65.8 in 24x12, 256 of 264)."""
    best = None
    for s in _wave_shapes(g, profile):
        groups = -(-g[0] // s[0]) * -(-g[1] // s[1])
        S = wave_splits(groups, wave_places(s, profile, shared_xy), units, min_units, most)
        key = (-_busy(g, s, profile, shared_xy, S), s[0] + s[1])
        if S > 1 and (best is None or key < best[0]):
            best = (key, (s[0], s[1], 1), S)
    if best is None or -best[0][0] <= _busy(g, _gemm(g, profile, shared_xy), profile, shared_xy):
        return None
    return best[1:]


def paired_lanes(profile: DeviceProfile, options) -> bool:
    """PAIR_LANES of linear.comp and attention.glslh: where the device table says (NVIDIA, whose shared memory returns
    a 16-byte load to a subgroup in 2 passes instead of 4 when lanes n and n ^ 1 read the same address: invocations 2i
    and 2i + 1 then take the same columns in two row groups, which only moves work between invocations); the option
    pair_lanes forces it."""
    return profile.tuning.paired_lanes if options.pair_lanes is None else options.pair_lanes


def im2col_local_size(g, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    """The "im2col" family's rule: the conv GEMM's packing pass (glsl/im2col.comp)."""
    # Only 1-D cases are reshaped (to n x 1 or 1 x n, clean on Adreno); any
    # 2-D case keeps 16x4 so we never produce 8x8 or 4x16.
    need, budget = extent_room(g, profile), default_budget(profile)
    if g[0] > 1 and g[1] > 1:
        # the device table's shape: 16x4 (ExecuTorch's), or on desktop GPUs 4x16: x = 4 columns of 4 channels by
        # y = 16 output positions, so a warp's loads are 4 runs of consecutive positions (whole cache sectors) and its
        # stores 8 rows of 64 contiguous bytes, where 16x4 spreads both over 32 lines
        return clamp(profile.tuning.im2col_shape if g[0] >= 4 else (16, 4, 1), profile)
    if g[0] > 1:
        return (min(need[0], budget), 1, 1)
    if g[1] > 1:
        return (1, min(need[1], budget), 1)
    return (1, 1, 1)

def local_size(g, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    """The "gemm" family's rule: the device table's GEMM groups (_gemm), halved until the kernel's shared memory
    (`shared_xy` bytes per local x and per local y) fits the device."""
    return fit_shared(_gemm(g, profile, shared_xy), profile, shared_xy)


def describe_local_size(profile: DeviceProfile) -> str:
    """One line saying why the "gemm" family gets its local size on `profile`."""
    if profile.tuning.gemm_groups == "adreno":
        return ("gemm on Adreno: fixed 16x4x1 (8x8x1 and 4x16x1 corrupt tiled-GEMM "
                "work groups on Adreno 840)")
    if profile.tuning.gemm_groups == "desktop" and profile.compute_units:
        return (f"gemm on {profile.vendor} with {profile.compute_units} multiprocessors: of "
                f"{', '.join(f'{x}x{y}' for x, y in WAVE_SHAPES)}, the fewest waves x (x + y), a wave being the "
                f"groups that run at once (as many a multiprocessor as the kernel's shared memory allows, where "
                f"it declares it); K-split GEMMs the shape whose splits fill the most of one wave; small GEMMs "
                f"as without a count; z=1")
    if profile.tuning.gemm_groups == "desktop":
        return (f"gemm on {profile.vendor}: 16x16x1 when that makes at least {DESKTOP_MIN_GROUPS} groups, else "
                f"16x8x1 when that does, else 8x8x1; shrunk to the x/y extent, spare share to the other axis; z=1")
    return (f"gemm: 8x8x1 shrunk to the x/y extent, spare share to the other axis, up to {default_budget(profile)} "
            f"invocations; z=1")


def describe_im2col(profile: DeviceProfile) -> str:
    """One line saying why the "im2col" family gets its local size on `profile`."""
    if profile.tuning.im2col_shape == (4, 16, 1):
        return (f"im2col on {profile.vendor}: 4x16x1 (coalesced position runs); 1-D dispatches become n x 1 or "
                f"1 x n")
    return "im2col: 16x4x1 as ExecuTorch; 1-D dispatches become n x 1 or 1 x n"


# glsl/linear.comp tile variants: (TM rows, TN4 vec4 columns) per invocation, BK-deep shared-memory slices
LINEAR_TILES = {"t44": (4, 1, 16), "t44k32": (4, 1, 32)}


def linear_shared_xy(tile) -> tuple[int, int]:
    """glsl/linear.comp's shared memory in bytes per local x and per local y: a BK-deep fp32 slice of B (4 TN4 columns
    an invocation of x) and of A (TM rows an invocation of y)."""
    tm, tn4, bk = LINEAR_TILES[tile]
    return (4 * bk * 4 * tn4, 4 * bk * tm)


def linear_tile(ctx, m, n):
    """Tile variant of glsl/linear.comp: the device table's (DeviceProfile.tuning.linear_tile: 4x4 outputs per
    invocation, 32-deep shared-memory slices on discrete GPUs, where on an H200 it beat 16-deep slices and 8x4 tiles
    on every Whisper GEMM: docs/benchmarks.md; 16-deep elsewhere, which fits any shared-memory size), or the option
    gemm_tile."""
    return ctx.options.gemm_tile or ctx.profile.tuning.linear_tile


def fast_gemm(storage, options, k=4) -> bool:
    """glsl/linear.comp reads A rows as vec4 from buffers: buffer storage and K a multiple of 4 (planner passes
    ask this before lowering, with the Session options)."""
    return storage == "buffer" and k % 4 == 0 and options.fast_gemm


def linear_ok(ctx, k) -> bool:
    return fast_gemm(ctx.storage, ctx.options, k)


# glsl/linear_cm.comp (tensor cores through VK_KHR_cooperative_matrix, fp16 only): tile -> (BM, BN, BK, subgroups);
# "s1": one shared stage
CM_TILES = {"m64n64k32s1": (64, 64, 32, 4), "m64n128k32s1": (64, 128, 32, 4),
            # REGFED (glsl/linear_cmreg.comp): operands loaded straight into registers, no shared stages
            "r64n64": (64, 64, 32, 4), "r32n64": (32, 64, 32, 4)}
DEFAULT_TILE = "m64n64k32s1"
REG_TILES = ("r64n64", "r32n64")
CM_SHAPE = (16, 16, 16, "f16", "f16", "f32", "f32")   # the one cooperative-matrix shape the kernel uses


def cm_shared_bytes(tile: str) -> int:
    """Shared memory of a linear_cm tile: its stages of A and B (rows padded by 8 halves), over which the epilogue's
    scratch (one 16 x 20 fp32 tile per subgroup) lies once the K loop is done."""
    bm, bn, bk, warps = CM_TILES[tile]
    if tile in REG_TILES:
        return warps * 16 * 20 * 4
    return max(2 * (bm * (bk + 8) + bk * (bn + 8)), warps * 16 * 20 * 4)


def _cm_fits(ctx, tile: str) -> bool:
    p = ctx.profile
    return cm_shared_bytes(tile) <= p.max_shared_memory and CM_TILES[tile][3] * p.subgroup_size <= min(
        p.max_invocations, p.max_local_size[0])


# The tensor-core GEMM's sources (linear_cm.glslh, built with and without REGFED, CM_EMULATE and SPLIT_K):
# (REGFED, emulated, split K) -> stem
CM_SOURCES = {(False, False, False): "linear_cm", (False, True, False): "linear_cm_emu",
              (False, False, True): "linear_cm_split", (False, True, True): "linear_cm_emu_split",
              (True, False, False): "linear_cmreg", (True, True, False): "linear_cmreg_emu",
              (True, False, True): "linear_cmreg_split", (True, True, True): "linear_cmreg_emu_split"}


def cm_kernel(ctx, m, n):
    """(emulated, tile) of the cooperative-matrix GEMM for an M x N output, or None where it does not apply. It needs
    precision fp16 and a device reporting the 16x16x16 f16 x f16 -> f32 subgroup shape (with shaderFloat16);
    option coopmat="off" turns it off, option cm_tile forces a tile. Default: 64x64 blocks with 32-deep slices and one
    shared stage (measured best on an H200), twice as wide where the grid takes more than one wave.
    coopmat="emulate" (tests): glsl/linear_cm_emu.comp, the same kernel with the matrix operations in plain
    code, on any fp16 device with subgroups of 8, 16 or 32 lanes, cooperative matrices or not."""
    p = ctx.profile
    if not ctx.half or ctx.options.coopmat == "off":
        return None
    if ctx.options.coopmat == "emulate":
        if not (p.fp16 and p.subgroup_size in (8, 16, 32)):
            return None
        emulate = True
    elif p.cooperative_matrix and p.fp16 and CM_SHAPE in p.coopmat_shapes:
        emulate = False
    else:
        return None
    tile = cm_tile(ctx, m, n)
    return (emulate, tile) if tile else None


def cm_tile(ctx, m, n):
    """cm_kernel's linear_cm tile for an M x N output, or None where the device cannot run one."""
    forced = ctx.options.cm_tile
    if forced in REG_TILES:    # cm_regfed takes it where REGFED applies; elsewhere the default linear_cm tile
        forced = None
    # 64x64 blocks, 32-deep slices, one shared stage: fastest on an H200 for every Whisper GEMM but the merged QKV
    # (tools/dev/gemm_bench.py, docs/benchmarks.md); it needs the least shared memory of the tiles measured
    tile = forced or DEFAULT_TILE
    if not _cm_fits(ctx, tile):
        return None
    if not forced and _cm_fits(ctx, WIDE_TILE) and cm_waves(ctx, tile, m, n) > 1:
        tile = WIDE_TILE
    return tile


# A multiprocessor holds as many work groups at once as its shared memory and its registers allow. Shared memory:
# DeviceProfile.wave_slots (48 KiB in all on an H200); the one-stage tiles keep their epilogue scratch over the dead
# stages, so the default m64n64k32s1 needs 9.5 KiB. Registers: 64K a multiprocessor, and NVIDIA's driver gives these
# kernels 116 (m64n64k32s1) and 185 (m64n128k32s1) per invocation (tools/dev/occupancy.py stats), so 4 and 2 groups of
# 128 invocations: the device table's cm_register_groups. Where the 64 x 64 grid needs more than one wave, twice as wide
# blocks (WIDE_TILE) win on an H200 (tools/dev/gemm_bench.py: fc1 1500 x 384 x 1536
# 27.7 -> 23.7 us, base's QKV 1500 x 512 x 1536 32.1 -> 26.5); where it fits one wave they lose (tiny's QKV, 432
# groups: 16.1 against 18.6).
WIDE_TILE = "m64n128k32s1"
# (cm_regfed's small-grid rule counts r64n64's places as the 64 x 64 tile's 4 a multiprocessor, though its 83 registers
# and 5 KiB would fit 6: the rule was measured so.)


def cm_slots(ctx, tile) -> int:
    """Work groups of a linear_cm tile that run at once (0 where the multiprocessor count is unknown)."""
    return ctx.profile.wave_slots(cm_shared_bytes(tile), dict(ctx.profile.tuning.cm_register_groups).get(tile))


def cm_waves(ctx, tile, m, n) -> int:
    """Waves of work groups of a linear_cm tile for an M x N output (0 where the multiprocessor count is unknown)."""
    slots = cm_slots(ctx, tile)
    if not slots:
        return 0
    bm, bn, _bk, _warps = CM_TILES[tile]
    return -(-(-(-m // bm) * -(-n // bn)) // slots)


def linear_cm_dispatch(ctx, emulate, tile, out, a, wt, bt, m, n, k, n4, *, out_mode, act, m0, lda4, m_total,
                       residual, part_n=0, a_win=None, split=None):
    """linear_dispatch on tensor cores: same bindings, push constants and specialization constants as linear.comp.
    Global size: x = the work group's invocations (whole subgroups, family "coopmat"), y = row blocks,
    z = column blocks. split: an fp32 GEMM from split operands (fp32_precision, split_kernel): the scheme, which
    names the kernel's dtype variant; B as its split parts and their column scales (binding 5)."""
    lda = lda4 if lda4 is not None else k // 4
    splittable = out_mode == OUT_ROWS and m0 == 0 and n % 4 == 0
    S = cm_split_k(ctx, tile, m, n, k, before_ln(ctx, out, n)) if splittable else 1
    quant = getattr(wt, "axes", {}).get("w")   # a quantized weight: the w=i8 (or, REGFED only, w=q4) variants
    if split:
        reg = regfed_tile(ctx, m, n, S > 1)
    elif quant and not regfed_zero_ok(wt.zero):
        reg = None
    else:
        reg = cm_regfed(ctx, emulate, a, m, n, k, lda, a_win, S > 1)
    if quant == "q4" and not reg:
        raise MinirtError(f"4-bit weight '{wt.name}': the tensor-core GEMM has a w=q4 variant only register-fed "
                          f"(linear_dispatch routes it so)")
    if reg:
        tile = reg      # same splits as the tile it replaces (REGFED's 64 x 64 tile keeps its rules)
    extra = wt.regfed_args(ctx) if reg and quant else _int8_args(ctx, wt)   # the scales (and zero points)
    axes = {"tile": tile, **getattr(wt, "axes", {})}
    # w=q4 takes log2 of its block size in the third push vec4's z (A_WIN uses x and y)
    win = (*_win(a_win)[:2], wt.block.bit_length() - 1, 0) if quant == "q4" else _win(a_win)
    if split:
        wt, scales = wt.split(ctx, split)
        extra, axes["dtype"] = [(scales.name, "r")], split
    else:
        wt = wt.regfed(ctx) if reg else wt.row_major(ctx)
    bm, bn, _bk, warps = CM_TILES[tile]
    res = residual if residual is not None else bt
    if S > 1:
        # K split S ways (linear_cm_split.comp): fp32 partials [S][M][N], then linear_reduce adds them in split order
        # with bias, activation and residual; work group z = column block + column blocks * split
        part = ctx.scratch("linear.partials", S * m * n)
        stem = CM_SOURCES[bool(reg), emulate, True]
        ctx.dispatch(stem, [(part.name, "w"), (a.name, "r"), (wt.name, "r"), (bt.name, "r"), (bt.name, "r"), *extra],
                     Push().ivec4(m, n, k, n4).ivec4(0, lda, 0, S).ivec4(*win),
                     _cm_spec(ctx, stem, a, k, n, lda, a_win, out_mode=OUT_SPLIT, act=None, has_res=False,
                              reg_epi=cm_reg_epilogue(ctx, emulate, True), vec8_ok=not quant),
                     (warps * ctx.profile.subgroup_size, -(-m // bm), -(-n // bn) * S),
                     "coopmat", flops=2 * m * n * k, nbytes=4 * (m * k + k * n) + 16 * S * m * n, axes=axes)
        reduce_dispatch(ctx, out, part, bt, res, m, n, n4, S, act, residual is not None)
        return
    stem = CM_SOURCES[bool(reg), emulate, False]
    p = Push().ivec4(m, n, k, n4).ivec4(m0, lda, m_total, part_n).ivec4(*win)
    ctx.dispatch(stem, [(out.name, "w"), (a.name, "r"), (wt.name, "r"), (bt.name, "r"), (res.name, "r"), *extra],
                 p, _cm_spec(ctx, stem, a, k, n, lda, a_win, out_mode=out_mode, act=act, has_res=residual is not None,
                             reg_epi=cm_reg_epilogue(ctx, emulate, False),
                             epi8=not split and _cm_epi8(ctx, out, residual, n, out_mode, part_n), vec8_ok=not quant),
                 (warps * ctx.profile.subgroup_size, -(-m // bm), -(-n // bn)), "coopmat",
                 flops=2 * m * n * k, nbytes=4 * (m * k + k * n + m * n * (2 if residual is not None else 1)),
                 axes=axes)


OUT_ROWS, OUT_NCHW, OUT_PARTS, OUT_SPLIT = 0, 1, 2, 3    # linear.comp / linear_cm.glslh OUT_MODE


# glsl/linear_cm2.comp: the fp16 GEMM on workgroup-scope matrices (VK_NV_cooperative_matrix2, DeviceProfile.coopmat2),
# one BM x BN accumulator a work group, BK-deep slices loaded by tensor addressing; tile -> (BM, BN, BK, invocations).
# A tile runs where the device lists a workgroup-scope f16 x f16 -> f32 entry of its invocations whose granularities
# divide BM, BN and BK (an H100's driver lists 32 x 16 x 16 at 128 invocations, 32 x 32 x 16 at 256, as llama.cpp's
# Vulkan backend requires for its tiles of the same sizes), and no side exceeds the maximum dimension.
CM2_TILES = {"m64n64k64": (64, 64, 64, 128), "m64n128k64": (64, 128, 64, 128), "m128n128k32": (128, 128, 32, 256),
             "m128n128k64": (128, 128, 64, 256), "m256n128k64": (256, 128, 64, 256),
             "m128n256k64": (128, 256, 64, 256)}
CM2_DEFAULT, CM2_LARGE, CM2_SMALL = "m128n128k64", "m256n128k64", "m64n64k64"
# The default tile's groups, in multiprocessors, past which the large tile (half the groups, 1.33x the operand reuse)
# and under which the small one (4x the groups) is taken. Not yet measured: llama.cpp's rule for the same tiles
# (large where the medium grid overfills the GPU; small for narrow outputs) moved to a wave count;
# tools/dev/gemm_bench.py with cm2_tile=... compares them.
CM2_LARGE_WAVES = 4
CM2_SMALL_WAVES = 0.5


def cm2_fits(profile: DeviceProfile, tile: str) -> bool:
    """Whether the device's VK_NV_cooperative_matrix2 lists a combination linear_cm2's `tile` can run with."""
    bm, bn, bk, inv = CM2_TILES[tile]
    if profile.coopmat2_max_dimension and max(bm, bn, bk) > profile.coopmat2_max_dimension:
        return False
    return inv <= profile.max_invocations and any(
        i == inv and bm % mg == 0 and bn % ng == 0 and bk % kg == 0 for mg, ng, kg, i in profile.coopmat2)


def cm2_tile(ctx, m, n, a_win=None):
    """linear_cm2's tile for an M x N fp16 GEMM, or None (then the VK_KHR_cooperative_matrix kernels), with a plan note
    saying which and why. It needs precision fp16, options coopmat auto and coopmat2 on (and no gemm_splitk: linear_cm2
    does not split K), a device with a usable VK_NV_cooperative_matrix2 (DeviceProfile.coopmat2), and A read as plain
    rows (no A_WIN window). Default: 128 x 128 blocks; 256 x 128 where they make more than CM2_LARGE_WAVES groups a
    multiprocessor, 64 x 64 where under CM2_SMALL_WAVES; option cm2_tile forces one."""
    o, p = ctx.options, ctx.profile
    if not ctx.half or o.coopmat != "auto" or not o.coopmat2 or (o.gemm_splitk or 1) > 1:
        return None
    if not p.coopmat2:
        if p.coopmat2_missing:
            ctx.note(f"linear_cm2 not used: {p.coopmat2_missing}")
        return None
    if a_win is not None:
        ctx.note("linear_cm2 not used: A is read through a window (a channels-last convolution input): linear_cm")
        return None
    fits = [t for t in CM2_TILES if cm2_fits(p, t)]
    if o.cm2_tile:
        if o.cm2_tile not in fits:
            ctx.note(f"linear_cm2 not used: option cm2_tile={o.cm2_tile} is not among the device's combinations "
                     f"({', '.join(fits) or 'none'})")
            return None
        return o.cm2_tile
    if CM2_DEFAULT not in fits:
        ctx.note(f"linear_cm2 not used: the device lists no combination for its {CM2_DEFAULT} tile")
        return None
    bm, bn = CM2_TILES[CM2_DEFAULT][:2]
    groups, units = -(-m // bm) * -(-n // bn), p.compute_units
    if units and groups > CM2_LARGE_WAVES * units and CM2_LARGE in fits:
        return CM2_LARGE
    if units and groups < CM2_SMALL_WAVES * units and CM2_SMALL in fits:
        return CM2_SMALL
    return CM2_DEFAULT


def cm2_weight(ctx, wt) -> bool:
    """Whether linear_cm2 reads this weight: float, or int8 (its w=i8 variant) with no zero point, on a device with
    8-bit storage buffers; else a plan note, and the VK_KHR_cooperative_matrix kernels' w=i8 variants."""
    if getattr(wt, "axes", {}).get("w") != "i8" or not (ctx.half and ctx.profile.coopmat2 and ctx.options.coopmat2):
        return True
    if wt.zero is not None and np.any(wt.zero):
        ctx.note("linear_cm2 not used: its int8 weights are symmetric (this one has zero points)")
        return False
    if not ctx.profile.storage8:
        ctx.note("linear_cm2 not used: int8 weights need 8-bit storage buffers (storageBuffer8BitAccess)")
        return False
    return True


def linear_cm2_dispatch(ctx, tile, out, a, wt, bt, m, n, k, n4, *, out_mode, act, m0, lda4, m_total, residual,
                        part_n=0):
    """linear_dispatch on glsl/linear_cm2.comp: linear_cm's bindings (B row-major [K][N4] vec4, or its w=i8 variant's
    int8 B and scales) and push constants;
    specialization constants BM, BN, BK (the tile), OUT_MODE, ACT, HAS_RES. Global size: x = the tile's invocations
    (family "coopmat": one work group), y = row blocks, z = column blocks. io=out32 where the output is a float32 graph
    output."""
    bm, bn, bk, inv = CM2_TILES[tile]
    res = residual if residual is not None else bt
    lda = lda4 if lda4 is not None else k // 4
    int8 = _int8_args(ctx, wt)      # w=i8: the scales (binding 5)
    ctx.dispatch("linear_cm2", [(out.name, "w"), (a.name, "r"), (wt.row_major(ctx).name, "r"), (bt.name, "r"),
                                (res.name, "r"), *int8],
                 Push().ivec4(m, n, k, n4).ivec4(m0, lda, m_total, part_n).ivec4(0, 0, 0, 0),
                 spec("linear_cm2", BM=bm, BN=bn, BK=bk, OUT_MODE=out_mode, ACT=act_code(act),
                      HAS_RES=residual is not None),
                 (inv, -(-m // bm), -(-n // bn)), "coopmat", flops=2 * m * n * k,
                 nbytes=4 * (m * k + k * n + m * n * (2 if residual is not None else 1)), io="out32",
                 axes=getattr(wt, "axes", None), info={"tile": tile, "rows": m, "n": n, "k": k})
    ctx.note(f"tensor-core GEMM on VK_NV_cooperative_matrix2 (linear_cm2): {bm} x {bn} blocks, {bk}-deep slices, "
             f"{inv} invocations a group")


# REGFED (glsl/linear_cmreg.comp, linear_cm.glslh): the tensor-core GEMM whose lanes load their operands' elements
# straight into registers (16 bytes a load, K permuted inside each 32-deep slice alike for A and B) and build the
# matrices element by element, with no shared-memory stages and no barriers in the K loop. It needs the element layout
# the probe checks (DeviceProfile.coopmat_layout "mma": A, B and accumulator) or the emulated kernels. H200,
# Whisper-tiny fp16 (tools/dev/dispatch_ab.py, docs/benchmarks.md): 507.9 -> 483.0 us; QKV 16.0 -> 12.7 us, fc2 18.5 ->
# 14.9, fc1 20.4 -> 19.8 (against the 64 x 128 tile). Where the 64 x 64 grid of an unsplit GEMM fills under 0.6 of the
# resident places (conv1: 282 groups of 528), the 32-row tile (twice the groups): 15.4 -> 12.7 us.
REGFED_SMALL_GRID = 0.6


def cm_regfed(ctx, emulate, a, m, n, k, lda4, a_win, split):
    """The REGFED tile for this GEMM, or None (then linear_cm's tiles). Session(options={"cm_regfed": False}) turns it
    off; options["cm_tile"] = a REG_TILES tile forces that one where REGFED applies, a linear_cm tile forces linear_cm.
    Its A loads are 16 bytes: K, A's row stride and window offsets are whole 8-half groups and A starts 16-byte
    aligned."""
    forced = ctx.options.cm_tile
    if not ctx.options.cm_regfed or (forced and forced not in REG_TILES):
        return None
    if not (emulate or ctx.profile.coopmat_layout == "mma"):
        return None
    if not regfed_operands(ctx, a, k, lda4, a_win):
        return None
    return regfed_tile(ctx, m, n, split)


def regfed_operands(ctx, a, k, lda4, a_win) -> bool:
    """REGFED's A loads are 16 bytes (8 halves; at fp32, two of 4 floats): K, A's row stride and window offsets are
    whole 8-element groups and A starts 16-byte aligned."""
    return not (k % 8 or lda4 % 2 or (a_win is not None and (a_win[0] % 2 or a_win[1] % 2))
                or ctx.plan.byte_offset(a.name) % 16)


def regfed_tile(ctx, m, n, split) -> str:
    """The REGFED tile: option cm_tile where it names one, else 64 x 64, or 32 x 64 for an unsplit grid that fills
    under REGFED_SMALL_GRID of the resident places."""
    forced = ctx.options.cm_tile
    if forced in REG_TILES:
        return forced
    if not split:
        slots = cm_slots(ctx, "r64n64")
        if slots and -(-m // 64) * -(-n // 64) < REGFED_SMALL_GRID * slots:
            return "r32n64"
    return "r64n64"


def pack_regfed(w_kn: np.ndarray) -> np.ndarray:
    """W [K, N] -> linear_cmreg's B, [K / 32][N / 16][2][32 lanes][8 halves], zero past K and N: lane L = 4 c + q holds
    W[32 kb + 8 q + 0..7][16 nb + c + 8 h] (glsl/linear_cm.glslh, REGFED)."""
    k, n = w_kn.shape
    kb, nb = -(-k // 32), -(-n // 16)
    wp = np.zeros((kb * 32, nb * 16), np.float32)
    wp[:k, :n] = w_kn
    return wp.reshape(kb, 4, 8, nb, 2, 8).transpose(0, 3, 4, 5, 1, 2).reshape(-1)


# The byte order of each uint of pack_regfed_i8: k 0, 2, 1, 3 of its 4, so that bytes 0 and 2 (then 1 and 3) are the
# pairs (k0, k1) and (k2, k3) linear_cm.glslh's I8_F16 makes of one uint.
I8_BYTE_ORDER = (0, 2, 1, 3)


def pack_regfed_i8(q_kn: np.ndarray) -> np.ndarray:
    """int8 Q [K, N] -> linear_cmreg w=i8's B, [K / 32][N / 16][32 lanes][2 columns][2 halves of the run][4 bytes],
    zero past K and N: lane L = 4 c + q holds Q[32 kb + 8 q + 4 s + I8_BYTE_ORDER[b]][16 nb + c + 8 h] at [h][s][b],
    16 bytes a lane (glsl/linear_cm.glslh, REGFED with W_I8)."""
    k, n = q_kn.shape
    kb, nb = -(-k // 32), -(-n // 16)
    wp = np.zeros((kb * 32, nb * 16), np.int8)
    wp[:k, :n] = q_kn
    # (kb, q, s, b, nb, h, c) -> (kb, nb, c, q, h, s, b)
    w = wp.reshape(kb, 4, 2, 4, nb, 2, 8).transpose(0, 4, 6, 1, 5, 2, 3)
    return np.ascontiguousarray(w[..., list(I8_BYTE_ORDER)]).reshape(-1)


# The nibble order of each uint of pack_regfed_q4: nibble p holds k Q4_NIBBLE_ORDER[p] of its 8, so that nibbles s and
# s + 4 are the pairs (k0, k1), (k2, k3), (k4, k5), (k6, k7) for s = 0 .. 3 (linear_cm.glslh's Q4_F16).
Q4_NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def pack_regfed_q4(q_kn: np.ndarray) -> np.ndarray:
    """4-bit Q [K, N] (values 0..15) -> linear_cmreg w=q4's B, [K / 32][N / 16][32 lanes][2 columns] uint32, zero past
    K and N: lane L = 4 c + q holds Q[32 kb + 8 q + Q4_NIBBLE_ORDER[p]][16 nb + c + 8 h] in nibble p of uint h."""
    k, n = q_kn.shape
    kb, nb = -(-k // 32), -(-n // 16)
    wp = np.zeros((kb * 32, nb * 16), np.uint32)
    wp[:k, :n] = q_kn
    w = wp.reshape(kb, 4, 8, nb, 2, 8).transpose(0, 3, 5, 1, 4, 2)[..., list(Q4_NIBBLE_ORDER)]   # (kb, nb, c, q, h, p)
    return np.bitwise_or.reduce(w << (4 * np.arange(8, dtype=np.uint32)), axis=-1).astype("<u4").reshape(-1)


def pack_regfed_q4_params(scale: np.ndarray, zero: np.ndarray, block: int, k: int) -> np.ndarray:
    """linear_cmreg w=q4's block parameters: [blocks][N / 16][8 c][2 h][scale, 1024 + zero] for column 16 nb + c + 8 h
    (a lane's two columns side by side), as float32 for an fp16 weight; zero (a scale of 0) past N and past the blocks
    of K, up to the 32-deep slices' end."""
    blocks, n = scale.shape
    nb, bp = -(-n // 16), max(blocks, -(-(-(-k // 32) * 32) // block))
    p = np.zeros((bp, nb * 16, 2), np.float32)
    p[:blocks, :n, 0] = scale
    p[:blocks, :n, 1] = 1024 + np.asarray(zero, np.float32)
    return p.reshape(bp, nb, 2, 8, 2).transpose(0, 1, 3, 2, 4).reshape(-1)


def regfed_zero_ok(zero) -> bool:
    """linear_cmreg's w=i8 and w=q4 subtract 1152 + zero (1024 + zero) from 1152 + q (1024 + q) in fp16, exact for
    integral zero points of magnitude up to 896 (every int8, uint8 and packed 4-bit one); others stay on kernels that
    dequantize in fp32 (w=i8: linear_cm's; w=q4: glsl/linear.comp's)."""
    if zero is None:
        return True
    z = np.asarray(zero, np.float64)
    return bool(np.all(z == np.round(z)) and np.all(np.abs(z) <= 896))


# fp32_precision (Session option): fp32 GEMMs on the fp16 tensor cores from split operands, each fp32 value as an fp16
# hi part and an fp16 lo part scaled by 2^11, three of the four products kept, accumulated in fp32 (Ootomo & Yokota
# 2022; glsl/linear_cm.glslh SPLIT3, the dtype=f16x3 variants of linear_cmreg*). The option's value names the variant.


def split_exponents(mx: np.ndarray) -> np.ndarray:
    """The power of two s that scales a largest |x| (float32) into [2^14, 2^15), clamped to [-126, 126]: as
    glsl/linear_cm.glslh split_exp."""
    biased = (np.asarray(mx, np.float32).view(np.uint32) >> 23) & 0xFF
    return np.clip(141 - biased.astype(np.int64), -126, 126)


def split_f16x3(w_kn: np.ndarray):
    """W [K, N] float32 as (hi, lo) float16 [K, N] and inv float32 [N]: column n scaled by 2^s (split_exponents of its
    largest |w|), hi = fp16(w 2^s), lo = fp16((w 2^s - hi) 2^11), inv = 2^-s; w = (hi + lo 2^-11) inv to about fp32's
    precision for any finite w (hi never overflows, lo stays clear of fp16's subnormals)."""
    w = np.asarray(w_kn, np.float32)
    s = split_exponents(np.abs(w).max(axis=0) if w.shape[0] else np.zeros(w.shape[1], np.float32))
    ws = w.astype(np.float64) * np.exp2(s.astype(np.float64))
    with np.errstate(invalid="ignore", over="ignore"):      # non-finite weights stay non-finite
        hi = ws.astype(np.float16)
        lo = ((ws - hi.astype(np.float64)) * 2048.0).astype(np.float16)
    return hi, lo, np.exp2(-s.astype(np.float64)).astype(np.float32)


def pack_regfed_split(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """linear_cmreg's split B: pack_regfed's layout with, for each 32-deep slice and 16-column block, its hi part then
    its lo part: [K / 32][N / 16][2 parts][2][32 lanes][8 halves]."""
    k, n = hi.shape
    kb, nb = -(-k // 32), -(-n // 16)
    parts = [pack_regfed(x.astype(np.float32)).reshape(kb, nb, 1, 512) for x in (hi, lo)]
    return np.concatenate(parts, axis=2).reshape(-1)


def split_kernel(ctx, a, m, n, k, lda4, a_win):
    """(emulated, linear_cm tile) for an fp32 GEMM under fp32_precision != "ieee", or None (the ieee kernels), with a
    plan note saying which and why. It needs a device with the 16x16x16 f16 x f16 -> f32 cooperative-matrix shape in the
    "mma" element layout (the kernel is register-fed), shaderFloat16, 16-bit storage and subgroup shuffles, or
    coopmat="emulate" (any device with 16-bit storage and subgroups of 8, 16 or 32 lanes); and REGFED's operands."""
    scheme, p = ctx.options.fp32_precision, ctx.profile
    if scheme == "ieee" or ctx.half:
        return None
    emulate = ctx.options.coopmat == "emulate"
    if ctx.options.coopmat == "off":
        why = "option coopmat=off"
    elif emulate and not (p.fp16 and p.storage16 and p.subgroup_size in (8, 16, 32)):
        why = "the emulated kernel needs shaderFloat16, 16-bit storage and subgroups of 8, 16 or 32 lanes"
    elif not emulate and not (p.cooperative_matrix and p.fp16 and p.storage16 and CM_SHAPE in p.coopmat_shapes):
        why = "the device has no 16x16x16 f16 x f16 -> f32 cooperative matrices with 16-bit storage"
    elif not emulate and not (p.coopmat_layout == "mma" and p.subgroup_shuffle):
        why = "the split kernel is register-fed: it needs the 'mma' element layout and subgroup shuffles"
    elif not regfed_operands(ctx, a, k, lda4 if lda4 is not None else k // 4, a_win):
        why = f"K ({k}), A's row stride and offset must be whole groups of 8 floats"
    elif cm_tile(ctx, m, n) is None or not _cm_fits(ctx, "r64n64"):
        why = "the device's shared memory or work-group size is too small for the tensor-core tiles"
    else:
        return emulate, cm_tile(ctx, m, n)
    ctx.note(f"fp32_precision {scheme} not applied ({why}): ieee fp32 GEMM")
    return None


def _win(a_win):
    """The third push-constant vec4 of linear.comp and linear_cm.glslh: A_WIN's (row 0's start before the buffer,
    the buffer's length), in vec4; pushed (as zeros) by every dispatch, since the kernels declare it."""
    return (*a_win, 0, 0) if a_win is not None else (0, 0, 0, 0)


# glsl/linear_rows.comp: Linears of a few rows (a decoder step: one token a beam, or a clip of a batch) split K across
# the invocations of a group (and, where the column groups alone leave the GPU idle, across groups) instead of tiling M.
# A one-row Linear reads each weight once: its time is the memory system's, so the shape below is chosen to keep
# enough weight loads in flight on every multiprocessor, each lane's load 16 bytes of a k row where registers allow.
# Which Linears go there: at most rows_max() rows (the device table's rows_max, option rows_max), never more than
# ROWS_LIMIT (the kernel's accumulators are registers: ROWS x CV vec4 a lane).
ROWS_LIMIT = 32
ROWS_REG = 8              # the kernel's REG_ROWS: past this many rows it keeps only the accumulators in registers
ROWS_GROUP = 256          # invocations a group where the device tells no multiprocessor count
ROWS_LX = 8               # lanes along N: each load of a group's lanes is 8 x 16 = 128 contiguous bytes of a k row
ROWS_LX_FEW = 4           # where the column groups are fewer than the multiprocessors: 64 bytes, twice the groups
ROWS_LY_MAX = 64          # k runs a group at most (512 invocations)
ROWS_MIN_RUN = 4          # vec4 rows of K a lane at least (16 k: two of the kernel's unrolled steps)
ROWS_LANES_PER_UNIT = 1024  # lanes aimed at per multiprocessor (half an H100 SM's 2048)
ROWS_SPLIT_BYTES = 256 << 10  # weight bytes one column group may read before K is split across groups
ROWS_SPLIT_MAX = 4
# bytes of B per vec4 column group and k row, by weight type (w axis of the variant; float by precision)
ROWS_VEC4_BYTES = {"float": 16, "half": 8, "i8": 4, "q4": 2}
# VEC: vec4 column groups one vector load of linear_rows.comp takes at most (16 bytes; 4-bit: 8), by those bytes; a
# lane's cv where that is fewer
ROWS_VEC_COLUMNS = {16: 1, 8: 2, 4: 4, 2: 4}


def rows_max(profile, options) -> int:
    """The most rows of a Linear that runs on glsl/linear_rows.comp: option rows_max, else the device table's."""
    return min(ROWS_LIMIT, options.rows_max or profile.tuning.rows_max)


def rows_shape(profile, options, m: int, n4: int, k4: int, wbytes: int, part_major: bool) -> dict:
    """The few-row kernel's layout for m rows of n4 vec4 columns over k4 vec4 rows of K, the weight wbytes bytes per
    vec4 column group and k row: {lx, ly (the group: lanes along N by k runs), cv (vec4 columns a lane: 16 bytes a k
    row, at most 2 past 4 rows and 1 past ROWS_REG for the accumulators' registers: at most 16 vec4 a lane up to
    ROWS_REG rows, ROWS vec4 past it), vec (the lane's columns adjacent and read by vector
    loads of min(cv, ROWS_VEC_COLUMNS) columns: where n4 is a multiple of that, so every load is aligned), splits (K
    split across groups), ks (vec4 rows of K a split)}. The local_size, gemm_splitk, rows_columns and rows_vec options
    force their parts.
    Lanes along N: ROWS_LX, or ROWS_LX_FEW where that many would make fewer column groups than multiprocessors (1280
    fp16 columns: 20 groups of 8 lanes on an H100's 132, 40 of 4). Splits: where a column group would read more than
    ROWS_SPLIT_BYTES and the column groups are still fewer than the multiprocessors (a 5120-deep fc2 into 1280
    columns), K splits up to ROWS_SPLIT_MAX ways and linear_reduce.comp adds the fp32 partials (one more dispatch);
    part-major outputs are not split.
    k runs: lanes enough for ROWS_LANES_PER_UNIT a multiprocessor, each run at least ROWS_MIN_RUN vec4 rows."""
    cv = options.rows_columns or max(1, min(16 // wbytes, 4 if m <= 4 else 2 if m <= ROWS_REG else 1))
    forced = forced_local_size("gemm", options)
    units = profile.compute_units if profile.tuning.split_work else 0
    lx = forced[0] if forced is not None else ROWS_LX_FEW if -(-n4 // (ROWS_LX * cv)) < units else ROWS_LX
    groups_n = -(-n4 // (lx * cv))
    if options.gemm_splitk is not None:
        splits = options.gemm_splitk if not part_major else 1
    elif units and not part_major and groups_n < units:
        splits = min(ROWS_SPLIT_MAX, -(-units // groups_n), -(-4 * k4 * lx * cv * wbytes // ROWS_SPLIT_BYTES),
                     max(1, k4 // ROWS_MIN_RUN))
    else:
        splits = 1
    ks = -(-k4 // max(1, splits))
    splits = -(-k4 // ks) if k4 else 1
    if forced is not None:
        ly = forced[1]
    else:
        most = min(ROWS_LY_MAX, profile.max_invocations // lx, profile.max_local_size[1])
        want = units * ROWS_LANES_PER_UNIT // (groups_n * splits * lx) if units else ROWS_GROUP // lx
        want = min(want, most, max(1, ks // ROWS_MIN_RUN))
        ly = 1
        while ly * 2 <= want:
            ly *= 2
    # the kernel's red_sh (a vec4 a column a lane) and ln_sh (3 floats a row)
    while cv > 1 and lx * ly * cv * 16 + 12 * m > profile.max_shared_memory:
        cv //= 2
    vpl = min(cv, ROWS_VEC_COLUMNS[wbytes])
    vec = options.rows_vec and vpl > 1 and n4 % vpl == 0
    return {"lx": lx, "ly": ly, "cv": cv, "vec": vec, "splits": splits, "ks": ks}


def linear_rows_dispatch(ctx, out, a, wt, bt, m, n, k, n4, *, act=None, residual=None, part_n=0):
    """out = act(A @ B + bias) (+ residual) for m <= ROWS_LIMIT rows, row-major or (part_n > 0) part-major
    [n / part_n][m][part_n]: glsl/linear_rows.comp in rows_shape()'s layout, then linear_reduce.comp where K is split
    across groups."""
    forced = forced_local_size("gemm", ctx.options)
    if forced is not None:
        check_local_size(forced, ctx.profile)
    quant = getattr(wt, "axes", {}).get("w")
    wbytes = ROWS_VEC4_BYTES[quant or ("half" if ctx.half else "float")]
    shape = rows_shape(ctx.profile, ctx.options, m, n4, k // 4, wbytes, part_n > 0)
    lx, ly, cv, S = shape["lx"], shape["ly"], shape["cv"], shape["splits"]
    res = residual if residual is not None else bt
    groups = -(-n4 // (lx * cv))
    split = S > 1
    info = {"rows": m, "n": n, "k": k, "n4": n4, "part_n": part_n, "act": None if split else act,
            "has_res": residual is not None and not split, **shape}
    target = ctx.scratch("linear.partials", S * m * n4 * 4) if split else out
    # binding 5 (a fused LayerNorm's scale and bias, fuse_norm_linear_rows) holds the bias until that pass fills it;
    # an int8 weight (ops/int8_weight.py) adds its scales and zero points at binding 6
    ctx.dispatch("linear_rows", [(target.name, "w"), (a.name, "r"), (wt.row_major(ctx).name, "r"), (bt.name, "r"),
                                 (res.name, "r"), (bt.name, "r"), *_int8_args(ctx, wt)],
                 rows_push(info), rows_spec(info), (groups * lx, ly, S), "gemm", flops=2 * m * n * k,
                 nbytes=4 * (m * k + k * n + m * n * (2 if residual is not None else 1)),
                 local_size=(lx, ly, 1), info=info, axes=getattr(wt, "axes", None))
    if split:
        reduce_dispatch(ctx, out, target, bt, res, m, n, n4, S, act, residual is not None)


def _int8_args(ctx, wt) -> list:
    """The extra binding of an int8 weight (its scales and zero points), none for a float one."""
    return wt.extra_args(ctx) if hasattr(wt, "extra_args") else []


def rows_push(info, eps=0.0) -> Push:
    """linear_rows.comp's push constants from its dispatch's info: dims, geo (the part width, the K splits and the
    vec4 rows of K a split), ln (a fused LayerNorm's epsilon)."""
    i = info
    return Push().ivec4(i["rows"], i["n"], i["k"], i["n4"]).ivec4(i["part_n"], i["splits"], i["ks"], 0).vec4(eps)


def rows_spec(info, ln=False, ln_bias=True) -> tuple:
    """linear_rows.comp's specialization constants from its dispatch's info (ln, ln_bias: a fused LayerNorm's)."""
    i = info
    return spec("linear_rows", ACT=act_code(i["act"]), HAS_RES=i["has_res"], LN=ln, LN_BIAS=ln_bias,
                ROWS=i["rows"], CV=i["cv"], SPLIT=i["splits"] > 1, VEC=i["vec"])


def _linear_spec(ctx, out_mode, act, has_res, a_win):
    """linear.comp's specialization constants: after HAS_RES, A_WIN and PAIR_LANES (paired_lanes), left
    out from the last one on that is off."""
    return spec("linear", OUT_MODE=out_mode, ACT=act_code(act), HAS_RES=has_res, A_WIN=a_win is not None,
                PAIR_LANES=paired_lanes(ctx.profile, ctx.options), trim_from="A_WIN")


def _cm_epi8(ctx, out, residual, n, out_mode, part_n) -> bool:
    """EPI8 of linear_cm.glslh: 8-column (16-byte) epilogue stores for row-major and part-major outputs whose rows (or
    parts) are whole groups of 8 and whose output and residual start 16-byte aligned."""
    width = n if out_mode == OUT_ROWS else part_n if out_mode == OUT_PARTS else 0
    return (width > 0 and width % 8 == 0 and n % 8 == 0
            and all(ctx.plan.byte_offset(t.name) % 16 == 0 for t in (out, residual) if t is not None))


def _cm_spec(ctx, stem, a, k, n, lda4, a_win, *, out_mode, act, has_res, reg_epi, epi8=False, vec8_ok=True):
    """linear_cm.glslh's specialization constants: after REG_EPI, A_WIN and VEC8 (16-byte loads of A and B) both where
    either is on, and EPI8 (_cm_epi8) where it is on. VEC8 needs whole 8-half groups everywhere (K, N, A's row stride
    and window) and A 16-byte aligned in its buffer (weights and arena tensors are)."""
    vec8 = (vec8_ok and k % 8 == 0 and n % 8 == 0 and lda4 % 2 == 0
            and (a_win is None or (a_win[0] % 2 == 0 and a_win[1] % 2 == 0))
            and ctx.plan.byte_offset(a.name) % 16 == 0)
    tail = {"A_WIN": a_win is not None, "VEC8": vec8} if a_win is not None or vec8 or epi8 else {}
    if epi8:
        tail["EPI8"] = True
    return spec(stem, OUT_MODE=out_mode, ACT=act_code(act), HAS_RES=has_res, REG_EPI=reg_epi, **tail)


def cm_reg_epilogue(ctx, emulate, split) -> bool:
    """REG_EPI of linear_cm.glslh: the epilogue takes each lane's accumulator elements straight from registers, which
    needs the element layout cm_layout.glslh assumes: probed on the device (DeviceProfile.coopmat_layout), always
    true of the emulated kernels. By default only for split K's fp32 partials: on an H200 (tools/dev/gemm_bench.py,
    docs/benchmarks.md) it saves about 1 us there, and costs 3-7 us where it writes the fp16 output, whose column
    pairs from 8 rows a store coalesce worse than the scratch path's vec4 rows."""
    if not split:
        return False
    return emulate or ctx.profile.coopmat_layout == "mma"


def reduce_dispatch(ctx, out, part, bt, res, m, n, n4, S, act, has_res):
    """The second half of a split-K GEMM: glsl/linear_reduce.comp adds the S fp32 partials in split order, then bias,
    activation and residual (its _half variants at fp16; out32 where out is a float32 graph output)."""
    ctx.dispatch("linear_reduce", [(out.name, "w"), (part.name, "r"), (bt.name, "r"), (res.name, "r")],
                 Push().ivec4(m, n, n4, S), spec("linear_reduce", ACT=act_code(act), HAS_RES=has_res), (n4, m, 1),
                 "elementwise", flops=S * m * n, nbytes=4 * (S * m * n + m * n * (2 if has_res else 1)), io="out32",
                 info={"rows": m, "n4": n4, "splits": S, "act": act or "", "has_res": has_res})
    ctx.note(f"K split {S} ways across work groups, then a reduce pass")


# Split K on tensor cores (linear_cm_split.comp, the one-stage tiles): split_k's reasoning for the default 64 x 64
# tile's 4 groups per H200 multiprocessor (528 places: tiny's fc2, 144 groups, splits 3 ways, conv2 and base's fc2
# twice).
CM_SPLIT_TILES = ("m64n64k32s1", "m64n128k32s1")
# Each split at least this many 32-deep slices. H200, tools/dev/gemm_bench.py (GEMM + reduce, us, unsplit -> 2 splits):
# 1500 x 384 x 384 (12 slices) 13.4 -> 14.8, 1500 x 512 x 512 (16) 16.2 -> 17.2, 1500 x 1152 x 384 (36) 27.1 -> 23.9,
# 1500 x 1536 x 384 (48) 34.2 -> 28.0, 1500 x 2048 x 512 (64) 51.7 -> 38.7 (then 3 groups a multiprocessor; with 4,
# tiny's fc2 gains from a third split: 27.7 -> 25.0).
CM_SPLIT_MIN_SLICES = 16


def cm_split_k(ctx, tile, m, n, k, ln_next=False) -> int:
    """K splits of a row-major tensor-core GEMM (1: none). Session(options={"gemm_splitk": S}) forces S;
    ln_next (before_ln): a LayerNorm reads the output, so LN_SPLIT_MIN_SLICES applies."""
    forced = ctx.options.gemm_splitk
    if forced is not None and forced > 1 and tile not in CM_SPLIT_TILES:
        raise MinirtError(f"option gemm_splitk={forced} on tensor cores needs cm_tile {' or '.join(CM_SPLIT_TILES)}, "
                          f"not {tile}")
    if forced is not None:
        return forced
    p = ctx.profile
    if tile not in CM_SPLIT_TILES or not (p.compute_units and p.tuning.split_work):
        return 1
    bm, bn, bk, _ = CM_TILES[tile]
    return wave_splits(-(-m // bm) * -(-n // bn), cm_slots(ctx, tile), -(-k // bk),
                       LN_SPLIT_MIN_SLICES if ln_next else CM_SPLIT_MIN_SLICES, SPLIT_K_MAX)


# A GEMM whose output a LayerNorm reads splits K on shorter loops: its reduce pass then does the LayerNorm too
# (planner/fuse_reduce_layer_norm.py), so the split costs no dispatch of its own and saves the LayerNorm's. Whisper's
# out-projections (K = d_model: 12 or 16 slices, too few for the rules above) feed the MLP's LayerNorm. H200, Whisper-tiny
# (tools/dev/dispatch_ab.py, docs/benchmarks.md): out-projection + LayerNorm 77.6 -> 72.5 us over 4 layers at fp16 (3 splits;
# 2 splits 74.3), 121.9 -> 115.6 at fp32 (2 splits; 3 splits 121.8).
LN_SPLIT_MIN_SLICES = 4


def before_ln(ctx, out, n) -> bool:
    """Whether a LayerNorm reads `out` and fuse_reduce_layer_norm could take it into a split GEMM's reduce pass
    (buffers, rows of at most REG x subgroup-size vec4, as that pass checks)."""
    return (ctx.options.pass_on("fuse_reduce_layer_norm") and ctx.storage == "buffer"
            and -(-n // 4) <= ROW_VEC4_PER_LANE * ctx.profile.subgroup_size and ctx.read_by_op(out.name, "LayerNormalization"))


# Split K (linear.comp OUT_MODE 3 + linear_reduce.comp), fp32 only: where an fp32 GEMM's grid fills a fraction of the
# groups a big GPU runs at once (Whisper's 1500 x 384 outputs: 282 groups of 16 x 8 for 528 places on an H200),
# splitting K over S groups gives each 1/S of the K loop, for one more (reduce) dispatch: in the shape whose split groups
# fill the most of one wave (16 x 12, 2 splits: 384 of 396), with the most splits that still fit it
# (DeviceProfile.wave_slots), each split at least SPLIT_K_MIN_SLICES 32-deep slices.
SPLIT_K_MIN_SLICES = 8
SPLIT_K_MAX = 4


def split_k(ctx, tile, m, n4, k, ln_next=False):
    """(K splits, local size or None) of an fp32 row-major linear.comp GEMM (1: none; None: the planner's picker).
    Session(options={"gemm_splitk": S}) forces S; ln_next: as cm_split_k. The shape whose splits fill the most of one
    wave (gemm_split_shape) is taken with its splits where it keeps more of the places busy than the
    picker's unsplit shape does over its waves (Whisper's 1500 x 384 outputs: 384 of 396 places against 282 of 528)."""
    forced = ctx.options.gemm_splitk
    if forced is not None:
        return forced, None
    p = ctx.profile
    if ctx.half or not (p.compute_units and p.tuning.split_work) or tile != "t44k32":
        return 1, None
    tm, tn4, _bk = LINEAR_TILES[tile]
    g = (-(-n4 // tn4), -(-m // tm), 1)
    sxy, forced_local = linear_shared_xy(tile), forced_local_size("gemm", ctx.options)
    units, least = -(-k // 32), LN_SPLIT_MIN_SLICES if ln_next else SPLIT_K_MIN_SLICES
    if forced_local is not None:    # the forced shape, as the planner will take it, with the splits that fit it
        lx, ly, _ = check_local_size(forced_local, p)
        return wave_splits(-(-g[0] // lx) * -(-g[1] // ly), wave_places((lx, ly), p, sxy), units, least,
                           SPLIT_K_MAX), None
    split = gemm_split_shape(g, p, sxy, units, least, SPLIT_K_MAX)
    return split[::-1] if split else (1, None)


def linear_dispatch(ctx, out, a, wt, bt, m, n, k, n4, *, out_mode=OUT_ROWS, act=None, m0=0, lda4=None, m_total=0,
                    residual=None, part_n=0, a_win=None):
    """out (rows m0 .. m0 + m) = act(A @ B + bias) (+ residual) on the fast buffer GEMM: glsl/linear_cm.comp
    (cooperative matrices) where cm_kernel allows, else glsl/linear.comp. out_mode OUT_PARTS (merged sibling
    Linears): out is part-major [n / part_n][m_total][part_n]."""
    if out_mode == OUT_PARTS and (part_n <= 0 or n % part_n or m_total < m0 + m):
        raise MinirtError(f"part-major GEMM output needs N ({n}) a multiple of the part width ({part_n}) "
                          f"and M_total ({m_total}) covering the rows")
    if m <= rows_max(ctx.profile, ctx.options) and out_mode in (OUT_ROWS, OUT_PARTS) and m0 == 0 and lda4 is None \
            and a_win is None and (out_mode == OUT_ROWS or m_total == m):
        if m > ROWS_REG:
            ctx.note(f"{m} rows on the few-row kernel (rows_max {rows_max(ctx.profile, ctx.options)})")
        linear_rows_dispatch(ctx, out, a, wt, bt, m, n, k, n4, act=act, residual=residual,
                             part_n=part_n if out_mode == OUT_PARTS else 0)
        return
    quant = getattr(wt, "axes", {}).get("w")    # int8 ("i8") or 4-bit ("q4") weights: their variants
    tile = None if quant not in (None, "i8") or not cm2_weight(ctx, wt) else cm2_tile(ctx, m, n, a_win)
    if tile is not None:
        linear_cm2_dispatch(ctx, tile, out, a, wt, bt, m, n, k, n4, out_mode=out_mode, act=act, m0=m0, lda4=lda4,
                            m_total=m_total, residual=residual, part_n=part_n)
        return
    cm = cm_kernel(ctx, m, n)
    if cm is not None and quant == "q4" and not (regfed_zero_ok(wt.zero) and cm_regfed(
            ctx, cm[0], a, m, n, k, lda4 if lda4 is not None else k // 4, a_win, False)):
        cm = None       # linear_cm has no w=q4 variant: glsl/linear.comp's
    if cm is not None:
        linear_cm_dispatch(ctx, *cm, out, a, wt, bt, m, n, k, n4, out_mode=out_mode, act=act, m0=m0, lda4=lda4,
                           m_total=m_total, residual=residual, part_n=part_n, a_win=a_win)
        return
    cm = None if quant else split_kernel(ctx, a, m, n, k, lda4, a_win)
    if cm is not None:
        linear_cm_dispatch(ctx, *cm, out, a, wt, bt, m, n, k, n4, out_mode=out_mode, act=act, m0=m0, lda4=lda4,
                           m_total=m_total, residual=residual, part_n=part_n, a_win=a_win,
                           split=ctx.options.fp32_precision)
        return
    tile = linear_tile(ctx, m, n)
    tm, tn4, _bk = LINEAR_TILES[tile]
    res = residual if residual is not None else bt
    extra, axes = _int8_args(ctx, wt), {"tile": tile, **getattr(wt, "axes", {})}
    wt = wt.row_major(ctx)
    S, local = split_k(ctx, tile, m, n4, k, before_ln(ctx, out, n)) if out_mode == OUT_ROWS and m0 == 0 else (1, None)
    sxy = linear_shared_xy(tile)
    if S > 1:
        # K split S ways across work groups (linear.comp OUT_MODE 3): fp32 partials [S][M][N4] vec4, then
        # linear_reduce.comp adds them in order with bias, activation and residual
        part = ctx.scratch("linear.partials", S * m * n4 * 4)
        ctx.dispatch("linear", [(part.name, "w"), (a.name, "r"), (wt.name, "r"), (bt.name, "r"), (bt.name, "r"),
                                *extra],
                     Push().ivec4(m, n, k, n4).ivec4(0, lda4 if lda4 is not None else k // 4, 0, S).ivec4(*_win(a_win)),
                     _linear_spec(ctx, OUT_SPLIT, None, False, a_win), (-(-n4 // tn4), -(-m // tm), S), "gemm",
                     flops=2 * m * n * k, nbytes=4 * (m * k + k * n + S * m * n), shared_xy=sxy, local_size=local,
                     axes=axes)
        reduce_dispatch(ctx, out, part, bt, res, m, n, n4, S, act, residual is not None)
        return
    p = (Push().ivec4(m, n, k, n4).ivec4(m0, lda4 if lda4 is not None else k // 4, m_total, part_n)
         .ivec4(*_win(a_win)))
    ctx.dispatch("linear", [(out.name, "w"), (a.name, "r"), (wt.name, "r"), (bt.name, "r"), (res.name, "r"), *extra],
                 p, _linear_spec(ctx, out_mode, act, residual is not None, a_win), (-(-n4 // tn4), -(-m // tm), 1),
                 "gemm",
                 flops=2 * m * n * k, nbytes=4 * (m * k + k * n + m * n * (2 if residual is not None else 1)),
                 io="out32", shared_xy=sxy, axes=axes)
