"""Threads: Session.run from several threads gives the same results as from one. Runs on one Session
are serialised by its lock; Sessions share the device's queue under the device's lock."""
import threading

import numpy as np
import pytest
from onnx import helper

from minirt import MinirtError, Session
from minirt.vk.executor import live_objects
from oracle import make_model, rand

THREADS, RUNS = 4, 20


def model(dynamic=False):
    return make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Gelu", ["h"], ["g"]),
                       helper.make_node("Softmax", ["g"], ["y"], axis=-1)],
                      {"x": ["n" if dynamic else 8, 16]}, ["y"], {"w": rand(16, 24, seed=1)})


def _in_threads(fn, n=THREADS):
    errors = []

    def body(i):
        try:
            fn(i)
        except BaseException as e:      # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("storage", ["buffer", "texture"])
def test_one_session_many_threads(storage):
    xs = [rand(8, 16, seed=i) for i in range(THREADS)]
    with Session(model(), storage=storage) as s:
        want = [s.run(x) for x in xs]

        def work(i):
            for k in range(RUNS):
                j = (i + k) % THREADS          # threads interleave different inputs
                assert np.array_equal(s.run(xs[j]), want[j])

        _in_threads(work)


def test_one_session_many_threads_new_shapes():
    """Each thread's batch size is planned on first use, while the others run."""
    with Session(model(dynamic=True)) as s:
        xs = {i: rand(i + 1, 16, seed=i) for i in range(THREADS)}

        def work(i):
            first = s.run(xs[i])
            assert first.shape == (i + 1, 24)
            for _ in range(RUNS // 2):
                assert np.array_equal(s.run(xs[i]), first)

        _in_threads(work)
        for i, x in xs.items():
            ref = s.run(x)
            with Session(model(dynamic=True)) as fresh:
                assert np.array_equal(fresh.run(x), ref)


def test_many_sessions_many_threads():
    xs = [rand(8, 16, seed=i) for i in range(THREADS)]
    storage = [("buffer", "texture")[i % 2] for i in range(THREADS)]
    want = []
    for i, x in enumerate(xs):
        with Session(model(), storage=storage[i]) as s:
            want.append(s.run(x))

    def work(i):
        with Session(model(), storage=storage[i]) as mine:
            for _ in range(RUNS):
                assert np.array_equal(mine.run(xs[i]), want[i])

    live0 = live_objects()
    _in_threads(work)
    assert live_objects() == live0


def test_close_while_other_threads_run():
    s = Session(model())
    x = rand(8, 16, seed=3)
    want = s.run(x)
    started = threading.Event()

    def work(i):
        started.set()
        try:
            for _ in range(200):
                assert np.array_equal(s.run(x), want)
        except MinirtError as e:
            assert "closed" in str(e)

    live0 = live_objects()
    t = threading.Thread(target=work, args=(0,))
    t.start()
    started.wait(10)
    s.close()
    t.join(60)
    assert not t.is_alive()
    assert live_objects() < live0


def test_a_lock_per_device(monkeypatch):
    """Sessions and Programs on one physical device share its Device and queue lock, however the device is named (an
    index, its UUID or a leading part of it, the default); another device has a lock of its own, so its runs do not
    wait for the first one's (faked devices: lavapipe is one)."""
    import dataclasses

    from minirt import driver as session
    from minirt.device_profile import DeviceProfile
    from minirt.vk import device as vk_device
    gpu = DeviceProfile(name="gpu", vendor="nvidia", device_type="discrete")
    devs = [(i, object(), dataclasses.replace(gpu, uuid=f"{i + 1:08x}-1111-2222-3333-444455556666")) for i in range(2)]

    class FakeDevice:
        def __init__(self, chosen):
            self.index, self.pd, self.profile = chosen
            self.lock = threading.Lock()

    monkeypatch.setattr(vk_device, "physical_devices", lambda: devs)
    monkeypatch.setattr(vk_device, "Device", FakeDevice)
    monkeypatch.setattr(session, "_devices", {})
    monkeypatch.delenv("MINIRT_DEVICE", raising=False)
    d0 = session.get_device(0)
    assert d0.index == 0 and session.get_device(None) is d0 and session.get_device("0") is d0
    assert session.get_device("GPU-00000001") is d0
    d1 = session.get_device("GPU-00000002-1111-2222-3333-444455556666")
    assert d1.index == 1 and session.get_device(1) is d1 and d1.lock is not d0.lock
    with d0.lock:                                   # a run waiting on device 0's queue ...
        assert d1.lock.acquire(timeout=5)           # ... holds up none on device 1
        d1.lock.release()
