"""The occupancy probe (tools/occupancy_probe.py, glsl/occupancy_probe.comp; tools/dev/occupancy.py times it): the
kernel runs its whole pointer chase in every work group of every dispatch (checked against numpy), and the pipeline-statistics
reader degrades to {} where the driver has none."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "tools"))   # last: nothing in tools/ shadows a module
from occupancy_probe import probe_plan  # noqa: E402


def chase(words, threads, chain):
    """Where each invocation's pointer chase ends (glsl/occupancy_probe.comp), by numpy."""
    at = np.arange(threads, dtype=np.int64) % words
    for _ in range(chain):
        at = (at + threads + 1) % words
    return at.astype(np.uint32)


@pytest.mark.parametrize("words,threads,chain", [(64, 32, 50), (300, 64, 97), (1024, 128, 7)])
def test_probe_chase_matches_numpy(words, threads, chain):
    from minirt.session import get_device
    from minirt.vk.executor import Executor
    plan = probe_plan(words, threads, [1, 3], chain)
    plan.poison = True      # an element no invocation wrote stays NaN, whose bits match no chase end
    ex = Executor(get_device(), plan, profile=True)
    try:
        out = ex.run({})["out"]
        times = ex.dispatch_times_ns()
    finally:
        ex.close()
    got = np.ascontiguousarray(out).view(np.uint32).reshape(3, threads)
    want = chase(words, threads, chain)
    np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
    assert len(times) == 2 and all(t >= 0 for t in times)


def test_statistics_without_capture_is_empty():
    # Without MINIRT_PIPELINE_STATS=1 the device is created without the extension's feature: no statistics
    from minirt.session import get_device
    from minirt.vk.pipelines import Kernels
    dev = get_device()
    k = Kernels(dev)
    try:
        pipe, _ = k.pipeline("occupancy_probe", (dev.vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,), (32, 1, 1), (64,))
        st = k.statistics(pipe)
        if dev.executable_statistics is None:
            assert st == {}
        else:
            assert st and all(isinstance(v, (bool, int, float)) for v in st.values())
    finally:
        k.destroy()
