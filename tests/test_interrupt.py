"""A run stopped part way (Ctrl-C while it waits on the GPU, or a timeout) must not poison the Session: every later
run waits for the stopped one's fence before resubmitting, and returns its own input's result."""
from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.errors import DeviceError
from oracle import make_model, rand

LAYERS, N = 4, 256


def chain_model(seed=0):
    """x [N, N] -> LAYERS MatMuls: long enough on lavapipe (tenths of a second) for a signal to land mid-run."""
    rng = np.random.default_rng(seed)
    ws = {f"w{i}": (rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32) for i in range(LAYERS)}
    nodes = [helper.make_node("MatMul", ["x" if i == 0 else f"y{i - 1}", f"w{i}"], [f"y{i}"]) for i in range(LAYERS)]
    return make_model(nodes, {"x": [N, N]}, [f"y{LAYERS - 1}"], ws), ws


def reference(ws, x):
    y = x.astype(np.float64)
    for i in range(LAYERS):
        y = y @ ws[f"w{i}"].astype(np.float64)
    return y


def check_runs(s, ws, n=10):
    for i in range(n):
        x = rand(N, N, seed=1000 + i)
        y = s.run(x)
        ref = reference(ws, x)
        assert np.max(np.abs(y - ref)) <= 1e-3 * np.max(np.abs(ref)), f"run {i} after the stop is not its own result"


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler, whatever a library loaded earlier in this test process installed (a handler
    set at the C level leaves Ctrl-C without its KeyboardInterrupt)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_ctrl_c_mid_run_then_ten_correct_runs(ctrl_c):
    model, ws = chain_model()
    with Session(model, storage="buffer") as s:
        x = rand(N, N, seed=1)
        t0 = time.perf_counter()
        s.run(x)
        run_s = time.perf_counter() - t0
        main = threading.get_ident()
        interrupted = False
        for attempt in range(5):        # the SIGINT must land while the run is under way
            timer = threading.Timer(run_s * 0.3, signal.pthread_kill, (main, signal.SIGINT))
            timer.start()
            try:
                s.run(rand(N, N, seed=2 + attempt))
                time.sleep(run_s)       # it came too late: let it land here, outside the run
            except KeyboardInterrupt:
                interrupted = True
                break
            finally:
                timer.join()
        assert interrupted
        check_runs(s, ws)


def test_timeout_then_ten_correct_runs():
    model, ws = chain_model(1)
    with Session(model, storage="buffer") as s:
        s.run(rand(N, N, seed=1))
        (ex,) = s._execs.values()
        ex.timeout_ns, ex.spin_s = 1, 0.0    # wait a nanosecond, with no polling first
        for attempt in range(20):            # a fast GPU may finish before the wait begins
            try:
                s.run(rand(N, N, seed=2 + attempt))
            except DeviceError as e:
                assert "did not finish" in str(e)
                break
        else:
            pytest.skip("every run finished before a one-nanosecond wait")
        ex.timeout_ns = int(600e9)
        check_runs(s, ws)
