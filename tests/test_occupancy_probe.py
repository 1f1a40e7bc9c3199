"""tools/occupancy.py: the probe kernel runs its whole pointer chase in every work group of every dispatch (checked
against numpy), and the pipeline-statistics reader degrades to {} where the driver has none."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "tools"))   # after the stdlib: tools/profile.py
import occupancy  # noqa: E402


@pytest.mark.parametrize("words,threads,chain", [(64, 32, 50), (300, 64, 97), (1024, 128, 7)])
def test_probe_chase_matches_numpy(words, threads, chain):
    from minirt.session import get_device
    from minirt.vk.executor import Executor
    plan = occupancy.probe_plan(words, threads, [1, 3], chain)
    plan.poison = True      # an element no invocation wrote stays NaN, whose bits match no chase end
    ex = Executor(get_device(), plan, profile=True)
    try:
        out = ex.run({})["out"]
        times = ex.dispatch_times_ns()
    finally:
        ex.close()
    got = np.ascontiguousarray(out).view(np.uint32).reshape(3, threads)
    want = occupancy.chase(words, threads, chain)
    np.testing.assert_array_equal(got, np.broadcast_to(want, got.shape))
    assert len(times) == 2 and all(t >= 0 for t in times)


def test_statistics_without_capture_is_empty():
    # Without MINIRT_PIPELINE_STATS=1 the device is created without the extension's feature: no statistics
    from minirt.session import get_device
    from minirt.vk.kernels import Kernels
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


def test_probe_command_prints_a_row_per_size(capsys):
    rows = occupancy.main(["probe", "--sms", "1", "--threads", "32", "--shared-kib", "1,2", "--waves", "1,2",
                           "--chain", "20", "--runs", "1", "--warmup", "0"])
    out = capsys.readouterr().out
    assert [r[0] for r in rows] == [1.0, 2.0] and out.count("group(s) per SM") == 2
    assert all(set(r[2]) == {1, 2} and r[3] in (1, 2) for r in rows)
