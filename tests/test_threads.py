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
