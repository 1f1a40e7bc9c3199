"""Which element-to-lane mapping this device's 16 x 16 cooperative matrices use (glsl/coopmat_layout.comp).

VK_KHR_cooperative_matrix leaves the mapping to the implementation, so portable kernels only load, store and multiply
whole matrices. A kernel that reads accumulator elements as rows (attention_cm.comp's register softmax) may run only
where the device keeps them where it assumes: DeviceProfile.coopmat_layout says so, and this probe sets it once per
device, by loading known matrices and reading back what each lane holds."""
from __future__ import annotations

import numpy as np

from ..device_profile import COOPMAT_LAYOUTS
from ..plan import OUTPUT, Dispatch, Plan, TensorSpec

SLOTS = 16      # elements per lane the probe can report


def probe_plan() -> Plan:
    n = 3 * 32 * SLOTS + 4
    plan = Plan(storage="buffer")
    plan.tensors["out"] = TensorSpec("out", (n,), OUTPUT, "buffer", 0, dtype="float32")
    plan.outputs = ["out"]
    plan.lifetimes["out"] = (0, 0)
    plan.dispatches.append(Dispatch("coopmat_layout", "probe", "probe", [("out", "w")], b"", (), (32, 1, 1), "probe",
                                    local_size=(32, 1, 1)))
    return plan


def decode(words: np.ndarray) -> dict:
    """{"a" | "b" | "c": {(lane, i): (row, col)}} from the probe's output (uint32 words)."""
    words = np.asarray(words).view(np.uint32)
    lengths = words[3 * 32 * SLOTS: 3 * 32 * SLOTS + 3]
    out = {}
    for m, key in enumerate("abc"):
        n = int(lengths[m])
        if not 0 < n <= SLOTS:
            return {}
        grid = words[m * 32 * SLOTS:(m + 1) * 32 * SLOTS].reshape(32, SLOTS)
        out[key] = {(lane, i): divmod(int(grid[lane, i]), 16) for lane in range(32) for i in range(n)}
    return out


def classify(maps: dict) -> str:
    """The name in COOPMAT_LAYOUTS whose A and accumulator mappings both equal the probed ones and whose B mapping is
    their transpose (B's element i of a lane at (k, n) where A's is at (n, k): linear_cmreg builds both operands from
    registers), else ""."""
    for name, where in COOPMAT_LAYOUTS.items():
        want = {(lane, i): where(lane, i) for lane in range(32) for i in range(8)}
        want_b = {key: (c, r) for key, (r, c) in want.items()}
        if maps and maps.get("a") == want and maps.get("c") == want and maps.get("b") == want_b:
            return name
    return ""


def probe(dev) -> str:
    """Run the probe on dev (a minirt.vk.device.Device with 16 x 16 x 16 f16 cooperative matrices and subgroups
    of 32); "" where it fails or matches no known layout (kernels that need one are then not planned)."""
    from .executor import Executor
    try:
        ex = Executor(dev, probe_plan())
        try:
            words = ex.run({})["out"]
        finally:
            ex.close()
    except Exception:       # a probe must never stop a device from being used
        return ""
    return classify(decode(words))
