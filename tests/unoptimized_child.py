"""Tests marked `unoptimized` run, on lavapipe, in a child process whose LLVM compiles without optimizations
(GALLIVM_PERF=no_opt; lavapipe reads it once, when the process starts its driver, so the test process itself cannot
switch). Those tests compile big kernels (the emulated tensor-core attention above all) to run them on small shapes:
unoptimized, the compile takes half the time or less and the run is still short (docs/benchmarks.md, "The test suite
(lavapipe)"). What they check is unchanged: the kernel's results against the test's own oracle.

One child a test process, started at the first such test and kept (its driver, device and compiled pipelines serve
the next ones); it runs each test with pytest and sends back the outcome. The child's pytest output goes to the
file descriptors the test process captures, so a failure shows it. Mesa's disk cache keys its entries by the
GALLIVM_PERF flags, so these unoptimized pipelines never stand in for the optimized ones of other tests."""
from __future__ import annotations

import multiprocessing
import os

IN_CHILD = "MINIRT_TEST_UNOPTIMIZED_CHILD"   # set in the child: its tests run in place
CHILD_ENV = {"GALLIVM_PERF": "no_opt", IN_CHILD: "1"}


def _serve(conn, env):
    os.environ.update(env)     # before anything starts a Vulkan driver in this process
    import pytest

    class Reports:
        def __init__(self):
            self.reports = []

        def pytest_runtest_logreport(self, report):
            self.reports.append(report)

        def outcome(self):
            failed = [r for r in self.reports if r.failed]
            if failed:
                return "failed", f"in the unoptimized child ({failed[0].when}):\n{failed[0].longreprtext}"
            skipped = [r for r in self.reports if r.skipped]
            if skipped:
                why = skipped[0].longrepr
                return "skipped", (why[2] if isinstance(why, tuple) else str(why)).removeprefix("Skipped: ")
            if any(r.when == "call" and r.passed for r in self.reports):
                return "passed", ""
            return "failed", "the unoptimized child ran no test"

    while True:
        args = conn.recv()
        if args is None:
            return
        reports = Reports()
        pytest.main(["-q", "-n", "0", "-p", "no:cacheprovider", *args], plugins=[reports])
        conn.send(reports.outcome())


class Child:
    def __init__(self, env):
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(theirs, {**CHILD_ENV, **env}), daemon=True)
        self.proc.start()
        theirs.close()

    def run(self, args):
        """pytest's outcome of the test that `args` (pytest's command line) selects: (outcome, text)."""
        try:
            self.conn.send(args)
            return self.conn.recv()
        except (EOFError, OSError) as e:
            return "died", f"the unoptimized child process ended (exit code {self.proc.exitcode}): {e!r}"

    def close(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
