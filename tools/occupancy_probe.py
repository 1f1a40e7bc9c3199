"""The occupancy probe: a Plan of glsl/occupancy_probe.comp dispatches, a latency-bound pointer chase through shared
memory. tools/dev/occupancy.py times such plans to find how many work groups of a given shared-memory size share a
multiprocessor; tests/test_occupancy_probe.py checks the kernel. The kernel ships with the others, so the probe runs
wherever minirt does (a helper module of tools/, not a script)."""
from __future__ import annotations

from minirt.plan import OUTPUT, Dispatch, Plan, Push, TensorSpec


def probe_plan(words: int, threads: int, group_counts, chain: int) -> Plan:
    """One probe dispatch per entry of group_counts (that many work groups of `threads` invocations, each with `words`
    32-bit words of shared memory and a chase of `chain` dependent loads), all writing output "out": uint32 bits in
    float32 storage, out[g * threads + i] = where invocation i of group g ends its chase. The executor puts a barrier
    between the dispatches, so each is timed alone."""
    plan = Plan(storage="buffer")
    plan.tensors["out"] = TensorSpec("out", (max(group_counts) * threads,), OUTPUT, "buffer", 0, dtype="float32")
    plan.outputs = ["out"]
    plan.lifetimes["out"] = (0, len(group_counts) - 1)
    for g in group_counts:
        plan.dispatches.append(Dispatch("occupancy_probe", f"groups{g}", "probe", [("out", "w")],
                                        Push().ivec4(chain, 0, 0, 0).bytes(), (words,), (g * threads, 1, 1),
                                        "probe", local_size=(threads, 1, 1)))
    return plan
