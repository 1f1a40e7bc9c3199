"""Local work group size (local_size_x/y/z) per kernel family.

pick_local_size is pure and deterministic: nothing is timed, nothing is
random, nothing is cached.  "Global size" is the number of invocations per
axis; the dispatch uses ceil(global / local) groups and shaders bounds-check,
so a local size larger than the global extent only wastes lanes.

Groups hold 64 invocations by default (or the subgroup size if larger, capped
by the device): 64 is two NVIDIA warps, one AMD/Adreno wave64, and within
every limit we know.  Larger groups only where measured: desktop GEMMs
(WAVE_SHAPES), and the small one-pass kernels where the device table says so
(DeviceProfile.tuning.small_pass_invocations: the row kernels and the attention
combine pass on NVIDIA).  What differs by device comes from that table.
"""
from __future__ import annotations

import math
import operator

from .device_profile import DeviceProfile
from .options import FORCEABLE_FAMILIES as FORCEABLE

FAMILIES = ("gemm", "im2col", "elementwise", "reduction", "conv", "copy", "attention", "coopmat")
# Families whose kernels size their work from the local size: a forced local size never applies to them.
UNFORCEABLE = tuple(f for f in FAMILIES if f not in FORCEABLE)

DEFAULT_INVOCATIONS = 64
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


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _ints3(value, what: str, minimum: int) -> tuple[int, int, int]:
    try:
        items = tuple(value)
        if len(items) != 3 or any(isinstance(v, bool) for v in items):
            raise TypeError
        items = tuple(operator.index(v) for v in items)
    except TypeError:
        raise ValueError(f"{what} must be 3 ints, got {value!r}") from None
    if any(v < minimum for v in items):
        raise ValueError(f"{what} must be 3 ints >= {minimum}, got {items}")
    return items


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; expected one of {FAMILIES}")


def check_local_size(local, profile: DeviceProfile) -> tuple[int, int, int]:
    """Return `local` as a tuple if the device accepts it, else ValueError naming the limit."""
    loc = _ints3(local, "local size", 1)
    for axis, (n, cap) in enumerate(zip(loc, profile.max_local_size)):
        if n > cap:
            raise ValueError(
                f"local size {loc}: {'xyz'[axis]}={n} exceeds maxComputeWorkGroupSize"
                f"[{axis}]={cap} (max_local_size) on device {profile.name!r}")
    if math.prod(loc) > profile.max_invocations:
        raise ValueError(
            f"local size {loc}: {math.prod(loc)} invocations exceed "
            f"maxComputeWorkGroupInvocations={profile.max_invocations} "
            f"(max_invocations) on device {profile.name!r}")
    return loc


def _caps(profile: DeviceProfile) -> tuple[int, ...]:
    # Power-of-two floor so doubling never crosses an odd device limit.
    return tuple(_pow2_floor(c) for c in profile.max_local_size)


def _budget(profile: DeviceProfile) -> int:
    # A group smaller than a subgroup leaves lanes idle, hence the max().
    want = max(DEFAULT_INVOCATIONS, _pow2_floor(profile.subgroup_size))
    return min(want, _pow2_floor(profile.max_invocations))


def _clamp(local, profile: DeviceProfile, limit: int | None = None) -> tuple[int, int, int]:
    """Fit a fixed shape into the device limits (and `limit` invocations),
    halving the largest axis first."""
    limit = profile.max_invocations if limit is None else limit
    loc = [min(n, c) for n, c in zip(local, _caps(profile))]
    while math.prod(loc) > limit:
        i = loc.index(max(loc))
        loc[i] //= 2
    return tuple(loc)


def _largest_first(g) -> list[int]:
    # Stable: ties keep x before y before z.
    return sorted(range(3), key=lambda i: (-g[i], i))


def _grow(local, room, axes, budget: int) -> tuple[int, int, int]:
    """Double `axes` round-robin (in the given order) while the group is under
    `budget` and the axis is under its `room`; each size stays on its own axis."""
    loc = list(local)
    grew = True
    while grew:
        grew = False
        for i in axes:
            if loc[i] * 2 <= room[i] and math.prod(loc) * 2 <= budget:
                loc[i] *= 2
                grew = True
    return tuple(loc)


def _need(g, profile: DeviceProfile) -> tuple[int, ...]:
    """Per axis: the global extent rounded up to a power of two, within the device cap."""
    return tuple(min(_pow2_ceil(n), c) for n, c in zip(g, _caps(profile)))


def _default(g, profile: DeviceProfile) -> tuple[int, int, int]:
    return _grow((1, 1, 1), _need(g, profile), _largest_first(g), _budget(profile))


def _gemm(g, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    rule = profile.tuning.gemm_groups
    if rule == "adreno":
        return _clamp(ADRENO_GEMM, profile)
    # 8x8 shrunk to what x/y need (1 -> 1); the spare share goes to the other
    # of x/y.  Effective table: (8,8) if x,y >= 5; (64,1) (32,2) (16,4) for
    # y = 1, 2, 3..4 and the transposes.  z stays 1: batches go to group count.
    need, budget = _need(g, profile), _budget(profile)
    shape = GEMM_SHAPE
    waves = _by_waves(g, profile, shared_xy) if rule == "desktop" else None
    if waves:
        return waves
    if rule == "desktop" and -(-g[0] // 16) * -(-g[1] // 16) >= DESKTOP_MIN_GROUPS:
        # Big GPUs hide latency with 256-invocation groups (16x16 measured faster than 8x8 on an H200),
        # but only while there are enough of them to spread over every multiprocessor; smaller GEMMs
        # (Whisper's 1500 x 384 outputs) balance better with 4x as many 8x8 groups.
        budget = min(256, _pow2_floor(profile.max_invocations))
        shape = (16, 16)
    elif rule == "desktop" and -(-g[0] // 16) * -(-g[1] // 8) >= DESKTOP_MIN_GROUPS:
        # In between, 16x8 groups (128 invocations) still make enough groups and beat 8x8 on an H200 for
        # Whisper's 1500 x 384 outputs (QKV-sized 27.2 vs 28.1 us, fc2 -7%: docs/benchmarks.md).
        budget = min(128, _pow2_floor(profile.max_invocations))
        shape = (16, 8)
    start = _clamp([min(shape[i], need[i]) for i in (0, 1)] + [1], profile, budget)
    return _grow(start, need, [i for i in _largest_first(g) if i < 2], budget)


def wave_places(shape, profile: DeviceProfile, shared_xy=()) -> int:
    """Work groups of local `shape` that run at once: as many a multiprocessor as the shared memory `shared_xy`
    (bytes per local x, per local y) lets share it, or one a multiprocessor where it is not declared."""
    if not shared_xy:
        return profile.compute_units
    return profile.wave_slots(shared_xy[0] * shape[0] + shared_xy[1] * shape[1])


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


def wave_splits(groups: int, slots: int, units: int, min_units: int, most: int) -> int:
    """Splits S (1 .. most) of a dispatch's work across work groups: the most whose groups * S still run in one wave
    of `slots` resident groups, each split keeping at least min_units of its `units` (K slices, keys); 1 if none."""
    return max((S for S in range(2, most + 1) if groups * S <= slots and units // S >= min_units), default=1)


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


# The small one-pass kernels take DeviceProfile.tuning.small_pass_invocations a work group where it is set (64, the
# default, elsewhere). On an H200 (docs/benchmarks.md), with 256:
#   - the row kernels (layer_norm_rows, linear_reduce post=ln: one subgroup a row, so 8 rows a group instead of 2)
#     took about 3 us less over Whisper-tiny's nine passes (span 1.501 -> 1.498 ms);
#   - the attention combine pass (glsl/attention_combine.comp, one invocation a vec4 of output) in a head's 16 vec4
#     columns by 16 rows took 5.0-6.0 us a pass against 5.6-6.9 in the elementwise picker's 8x8.


def row_invocations(profile: DeviceProfile, forced=None) -> int:
    """Invocations a work group of the row kernels (minirt/ops/normalization.py): `forced`, the device table's figure
    or 64, raised to one whole subgroup (the kernels give each subgroup a row)."""
    n = forced or profile.tuning.small_pass_invocations or DEFAULT_INVOCATIONS
    return max(n, profile.subgroup_size, 1)


def paired_lanes(profile: DeviceProfile, options) -> bool:
    """PAIR_LANES of linear.comp and attention.glslh: where the device table says (NVIDIA, whose shared memory returns
    a 16-byte load to a subgroup in 2 passes instead of 4 when lanes n and n ^ 1 read the same address: invocations 2i
    and 2i + 1 then take the same columns in two row groups, which only moves work between invocations); the option
    pair_lanes forces it."""
    return profile.tuning.paired_lanes if options.pair_lanes is None else options.pair_lanes


def head_rows_shape(head_vec4: int, profile: DeviceProfile):
    """Local size of the attention combine pass for heads of `head_vec4` vec4 columns (x: one head's columns, the
    lanes sharing a row's (m, l) pairs; y: rows), or None (the planner's elementwise rule)."""
    n = profile.tuning.small_pass_invocations
    if not n or n > profile.max_invocations or n % head_vec4 or head_vec4 > profile.max_local_size[0] \
            or n // head_vec4 > profile.max_local_size[1]:
        return None
    return (head_vec4, n // head_vec4, 1)


def _im2col(g, profile: DeviceProfile) -> tuple[int, int, int]:
    # Only 1-D cases are reshaped (to n x 1 or 1 x n, clean on Adreno); any
    # 2-D case keeps 16x4 so we never produce 8x8 or 4x16.
    need, budget = _need(g, profile), _budget(profile)
    if g[0] > 1 and g[1] > 1:
        # the device table's shape: 16x4 (ExecuTorch's), or on desktop GPUs 4x16: x = 4 columns of 4 channels by
        # y = 16 output positions, so a warp's loads are 4 runs of consecutive positions (whole cache sectors) and its
        # stores 8 rows of 64 contiguous bytes, where 16x4 spreads both over 32 lines
        return _clamp(profile.tuning.im2col_shape if g[0] >= 4 else (16, 4, 1), profile)
    if g[0] > 1:
        return (min(need[0], budget), 1, 1)
    if g[1] > 1:
        return (1, min(need[1], budget), 1)
    return (1, 1, 1)


def _reduction(g, profile: DeviceProfile) -> tuple[int, int, int]:
    # global x = threads cooperating on one row; one group per row.  Clamped to
    # the largest power of two the device allows, so the kernel must size its
    # shared array and stride its loop by gl_WorkGroupSize.x, and the caller
    # must dispatch with the returned x as the row's thread count.
    x = min(_pow2_floor(g[0]), _caps(profile)[0], _pow2_floor(profile.max_invocations))
    return (x, 1, 1)


def _coopmat(g, profile: DeviceProfile) -> tuple[int, int, int]:
    # global x = the invocations of one work group, chosen by the dispatcher as a number of whole
    # subgroups (cooperative-matrix kernels give each subgroup a fixed part of the group's tile, so the
    # size must be exact); y and z count work groups. The dispatcher checks the size against the device
    # (minirt/ops/gemm.py); a size beyond the limits is clamped to the largest power of two allowed.
    cap = min(_caps(profile)[0], _pow2_floor(profile.max_invocations))
    return (g[0] if g[0] <= min(profile.max_local_size[0], profile.max_invocations) else cap, 1, 1)


_PICKERS = {     # (gemm: _gemm, which also takes the kernel's shared memory)
    "im2col": _im2col,
    "reduction": _reduction,
    "elementwise": _default,
    "copy": _default,
    "conv": _default,
    "attention": _coopmat,     # the flash-attention kernels size their tiles from the exact thread count
    "coopmat": _coopmat,
}


def forced_local_size(family: str, options):
    """The local size options["local_size"] forces on a dispatch of `family`, or None: only families in
    options["local_size_families"] (default: every forceable one); reduction, cooperative-matrix and attention
    kernels size their work from their local size, so a forced size never applies to them."""
    forced = options.local_size
    if forced and family in options.local_size_families and family not in UNFORCEABLE:
        return forced
    return None


def pick_local_size(family: str, global_size, profile: DeviceProfile,
                    forced=None, shared_xy=()) -> tuple[int, int, int]:
    """Local size for one dispatch of `family` over `global_size` invocations.

    `forced` (e.g. from a tuning file or the command line) is returned as-is
    once check_local_size accepts it; it bypasses the family rules, including
    the Adreno GEMM one.  An empty dispatch (any global axis 0) gets (1,1,1).
    `shared_xy`: the kernel's shared memory in bytes per local x and per local
    y (GEMMs: how many groups share a multiprocessor; see WAVE_SHAPES).
    """
    _check_family(family)
    g = _ints3(global_size, "global size", 0)
    if forced is not None:
        loc = check_local_size(forced, profile)
        if shared_xy and shared_xy[0] * loc[0] + shared_xy[1] * loc[1] > profile.max_shared_memory:
            raise ValueError(f"local size {loc}: the {family} kernel's shared memory, "
                             f"{shared_xy[0] * loc[0] + shared_xy[1] * loc[1]} bytes, exceeds "
                             f"maxComputeSharedMemorySize={profile.max_shared_memory} on device {profile.name!r}")
        return loc
    if 0 in g:
        return (1, 1, 1)
    if family == "gemm":
        return fit_shared(_gemm(g, profile, shared_xy), profile, shared_xy)
    return _PICKERS[family](g, profile)


def fit_shared(local, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    """`local` halved on the axis that holds the most shared memory until the kernel's shared memory (`shared_xy`
    bytes per local x and per local y) fits the device's: a group over the limit does not run (on NVIDIA the
    device is lost), however few its rows (a 1-row GEMM over a 51865-column vocabulary grows x to 256)."""
    loc = list(local)
    if not shared_xy:
        return tuple(loc)
    while shared_xy[0] * loc[0] + shared_xy[1] * loc[1] > profile.max_shared_memory and loc[0] * loc[1] > 1:
        i = 0 if (shared_xy[0] * loc[0] >= shared_xy[1] * loc[1] and loc[0] > 1) or loc[1] == 1 else 1
        loc[i] //= 2
    return tuple(loc)


def describe_rule(family: str, profile: DeviceProfile) -> str:
    """One line saying why `family` gets its local size on `profile`."""
    _check_family(family)
    b = _budget(profile)
    if family == "gemm":
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
        return f"gemm: 8x8x1 shrunk to the x/y extent, spare share to the other axis, up to {b} invocations; z=1"
    if family == "im2col":
        if profile.tuning.im2col_shape == (4, 16, 1):
            return (f"im2col on {profile.vendor}: 4x16x1 (coalesced position runs); 1-D dispatches become n x 1 or "
                    f"1 x n")
        return "im2col: 16x4x1 as ExecuTorch; 1-D dispatches become n x 1 or 1 x n"
    if family == "coopmat":
        return (f"coopmat: local size = (global x, 1, 1), whole subgroups of {profile.subgroup_size} chosen by the "
                f"kernel's dispatcher; y and z count work groups; never forced")
    if family == "attention":
        return ("attention: local size = (global x, 1, 1), the thread count of the dispatcher's tile (any number, "
                "not only powers of two); y and z count work groups; never forced")
    if family == "reduction":
        cap = min(_caps(profile)[0], _pow2_floor(profile.max_invocations))
        return (f"reduction: one group per row, local x = threads per row (power of two, "
                f"<= {cap}); kernel must use gl_WorkGroupSize.x")
    return (f"{family}: {b} invocations spread over axes largest-global-first, "
            f"each axis <= its extent rounded up to a power of two")
