"""The generic half of local work-group sizes (local_size_x/y/z): the device limits, the forced size, the rules the
families share (spread, per row, exact), and what every family's rule builds on. Each kernel family's own rule is in
its module (minirt/kernels/gemm.py: GEMM and im2col groups); minirt/kernels/rules.py maps family to rule.

Every rule is pure and deterministic: nothing is timed, nothing is random, nothing is cached.  "Global size" is the
number of invocations per axis; the dispatch uses ceil(global / local) groups and shaders bounds-check, so a local
size larger than the global extent only wastes lanes.

Groups hold 64 invocations by default (or the subgroup size if larger, capped by the device): 64 is two NVIDIA warps,
one AMD/Adreno wave64, and within every limit we know.  Larger groups only where measured: desktop GEMMs
(minirt/kernels/gemm.py WAVE_SHAPES), and the small one-pass kernels where the device table says so
(DeviceProfile.tuning.small_pass_invocations: the row kernels and the attention combine pass on NVIDIA).  What
differs by device comes from that table.
"""
from __future__ import annotations

import math
import operator

from ..device_profile import DeviceProfile
from ..options import FORCEABLE_FAMILIES as FORCEABLE

FAMILIES = ("gemm", "im2col", "elementwise", "reduction", "conv", "copy", "attention", "coopmat")
# Families whose kernels size their work from the local size: a forced local size never applies to them.
UNFORCEABLE = tuple(f for f in FAMILIES if f not in FORCEABLE)

DEFAULT_INVOCATIONS = 64


def pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1) if n >= 1 else 1


def _pow2_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def ints3(value, what: str, minimum: int) -> tuple[int, int, int]:
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


def check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; expected one of {FAMILIES}")


def check_local_size(local, profile: DeviceProfile) -> tuple[int, int, int]:
    """Return `local` as a tuple if the device accepts it, else ValueError naming the limit."""
    loc = ints3(local, "local size", 1)
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


def caps(profile: DeviceProfile) -> tuple[int, ...]:
    # Power-of-two floor so doubling never crosses an odd device limit.
    return tuple(pow2_floor(c) for c in profile.max_local_size)


def default_budget(profile: DeviceProfile) -> int:
    # A group smaller than a subgroup leaves lanes idle, hence the max().
    want = max(DEFAULT_INVOCATIONS, pow2_floor(profile.subgroup_size))
    return min(want, pow2_floor(profile.max_invocations))


def clamp(local, profile: DeviceProfile, limit: int | None = None) -> tuple[int, int, int]:
    """Fit a fixed shape into the device limits (and `limit` invocations),
    halving the largest axis first."""
    limit = profile.max_invocations if limit is None else limit
    loc = [min(n, c) for n, c in zip(local, caps(profile))]
    while math.prod(loc) > limit:
        i = loc.index(max(loc))
        loc[i] //= 2
    return tuple(loc)


def largest_first(g) -> list[int]:
    # Stable: ties keep x before y before z.
    return sorted(range(3), key=lambda i: (-g[i], i))


def grow(local, room, axes, budget: int) -> tuple[int, int, int]:
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


def extent_room(g, profile: DeviceProfile) -> tuple[int, ...]:
    """Per axis: the global extent rounded up to a power of two, within the device cap."""
    return tuple(min(_pow2_ceil(n), c) for n, c in zip(g, caps(profile)))


def spread(g, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    """The elementwise rule (elementwise, copy and direct-conv kernels): the default budget spread over the axes
    largest-global-first, each axis up to its extent rounded up to a power of two."""
    return grow((1, 1, 1), extent_room(g, profile), largest_first(g), default_budget(profile))


def wave_places(shape, profile: DeviceProfile, shared_xy=()) -> int:
    """Work groups of local `shape` that run at once: as many a multiprocessor as the shared memory `shared_xy`
    (bytes per local x, per local y) lets share it, or one a multiprocessor where it is not declared."""
    if not shared_xy:
        return profile.compute_units
    return profile.wave_slots(shared_xy[0] * shape[0] + shared_xy[1] * shape[1])


def wave_splits(groups: int, slots: int, units: int, min_units: int, most: int) -> int:
    """Splits S (1 .. most) of a dispatch's work across work groups: the most whose groups * S still run in one wave
    of `slots` resident groups, each split keeping at least min_units of its `units` (K slices, keys); 1 if none."""
    return max((S for S in range(2, most + 1) if groups * S <= slots and units // S >= min_units), default=1)


def per_row(g, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    """The reduction rule: one group a row, its threads the local x."""
    # global x = threads cooperating on one row; one group per row.  Clamped to
    # the largest power of two the device allows, so the kernel must size its
    # shared array and stride its loop by gl_WorkGroupSize.x, and the caller
    # must dispatch with the returned x as the row's thread count.
    x = min(pow2_floor(g[0]), caps(profile)[0], pow2_floor(profile.max_invocations))
    return (x, 1, 1)


def exact(g, profile: DeviceProfile, shared_xy=()) -> tuple[int, int, int]:
    """The rule of kernels that size their tiles from their thread count (cooperative-matrix and flash attention):
    the global x is one group."""
    # global x = the invocations of one work group, chosen by the dispatcher as a number of whole
    # subgroups (cooperative-matrix kernels give each subgroup a fixed part of the group's tile, so the
    # size must be exact); y and z count work groups. The dispatcher checks the size against the device
    # (minirt/kernels/gemm.py); a size beyond the limits is clamped to the largest power of two allowed.
    cap = min(caps(profile)[0], pow2_floor(profile.max_invocations))
    return (g[0] if g[0] <= min(profile.max_local_size[0], profile.max_invocations) else cap, 1, 1)


def forced_local_size(family: str, options):
    """The local size options["local_size"] forces on a dispatch of `family`, or None: only families in
    options["local_size_families"] (default: every forceable one); reduction, cooperative-matrix and attention
    kernels size their work from their local size, so a forced size never applies to them."""
    forced = options.local_size
    if forced and family in options.local_size_families and family not in UNFORCEABLE:
        return forced
    return None


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
