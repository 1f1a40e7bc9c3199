"""The one table from kernel family (Dispatch.family) to the rule that sizes its work groups, and the picker the
planner runs once per dispatch that its lowering left without a local size (a lowering sets one only through its
family's module). A rule is fn(global size, profile, shared_xy) -> local size, with a one-line description."""
from __future__ import annotations

from typing import Callable, NamedTuple

from ..device_profile import DeviceProfile
from . import gemm
from .local_size import (caps, check_family, check_local_size, default_budget, exact, ints3, per_row, pow2_floor,
                         spread)


class Rule(NamedTuple):
    pick: Callable               # (global size, profile, shared_xy) -> local size
    describe: Callable           # profile -> one line saying why


def _describe_exact(family):
    if family == "coopmat":
        return lambda p: (f"coopmat: local size = (global x, 1, 1), whole subgroups of {p.subgroup_size} chosen by "
                          f"the kernel's dispatcher; y and z count work groups; never forced")
    return lambda p: ("attention: local size = (global x, 1, 1), the thread count of the dispatcher's tile (any "
                      "number, not only powers of two); y and z count work groups; never forced")


def _describe_per_row(p):
    cap = min(caps(p)[0], pow2_floor(p.max_invocations))
    return (f"reduction: one group per row, local x = threads per row (power of two, "
            f"<= {cap}); kernel must use gl_WorkGroupSize.x")


def _describe_spread(family):
    return lambda p: (f"{family}: {default_budget(p)} invocations spread over axes largest-global-first, "
                      f"each axis <= its extent rounded up to a power of two")


RULES: dict[str, Rule] = {
    "gemm": Rule(gemm.local_size, gemm.describe_local_size),
    "im2col": Rule(gemm.im2col_local_size, gemm.describe_im2col),
    "reduction": Rule(per_row, _describe_per_row),
    "elementwise": Rule(spread, _describe_spread("elementwise")),
    "copy": Rule(spread, _describe_spread("copy")),
    "conv": Rule(spread, _describe_spread("conv")),
    "attention": Rule(exact, _describe_exact("attention")),    # flash attention sizes its tiles from the exact count
    "coopmat": Rule(exact, _describe_exact("coopmat")),
}


def pick_local_size(family: str, global_size, profile: DeviceProfile,
                    forced=None, shared_xy=()) -> tuple[int, int, int]:
    """Local size for one dispatch of `family` over `global_size` invocations.

    `forced` (e.g. from a tuning file or the command line) is returned as-is
    once check_local_size accepts it; it bypasses the family rules, including
    the Adreno GEMM one.  An empty dispatch (any global axis 0) gets (1,1,1).
    `shared_xy`: the kernel's shared memory in bytes per local x and per local
    y (GEMMs: how many groups share a multiprocessor; see gemm.WAVE_SHAPES).
    """
    check_family(family)
    g = ints3(global_size, "global size", 0)
    if forced is not None:
        loc = check_local_size(forced, profile)
        if shared_xy and shared_xy[0] * loc[0] + shared_xy[1] * loc[1] > profile.max_shared_memory:
            raise ValueError(f"local size {loc}: the {family} kernel's shared memory, "
                             f"{shared_xy[0] * loc[0] + shared_xy[1] * loc[1]} bytes, exceeds "
                             f"maxComputeSharedMemorySize={profile.max_shared_memory} on device {profile.name!r}")
        return loc
    if 0 in g:
        return (1, 1, 1)
    return RULES[family].pick(g, profile, shared_xy)


def describe_rule(family: str, profile: DeviceProfile) -> str:
    """One line saying why `family` gets its local size on `profile`."""
    check_family(family)
    return RULES[family].describe(profile)
