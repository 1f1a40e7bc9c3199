import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--validation", action="store_true",
                     help="run with the Khronos validation layer (also MINIRT_TEST_VALIDATION=1): any validation "
                          "warning or error during a test fails it")
    parser.addoption("--long", action="store_true",
                     help="also run the tests marked long (also MINIRT_TEST_LONG=1): many full-size windows, "
                          "minutes on lavapipe")


def _validation_requested(config) -> bool:
    return bool(config.getoption("--validation")) or os.environ.get("MINIRT_TEST_VALIDATION", "") not in ("", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a full-size model run, or a kernel that compiles for tens of seconds on "
                                       "lavapipe; runs by default (first), deselect with -m 'not slow'")
    config.addinivalue_line("markers", "long: many full-size windows on the device, minutes on lavapipe; skipped "
                                       "unless --long or MINIRT_TEST_LONG=1")
    config.addinivalue_line("markers", "unoptimized: compiles big kernels to run them on small shapes; on lavapipe "
                                       "it runs in a child process whose LLVM does not optimize (GALLIVM_PERF=no_opt: "
                                       "tests/unoptimized_child.py)")
    if _validation_requested(config):
        # before any test creates the (lazily made, process-wide) VkInstance
        os.environ["MINIRT_VALIDATION"] = "1"


def pytest_collection_modifyitems(config, items):
    """Tests marked slow first (a stable sort): with -n, no worker ends the run alone on one of them (on lavapipe most
    of their time is the first compile of a big kernel). Tests marked long are skipped unless asked for."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not (config.getoption("--long") or os.environ.get("MINIRT_TEST_LONG", "") not in ("", "0")):
        skip = pytest.mark.skip(reason="long: run with --long or MINIRT_TEST_LONG=1")
        for item in items:
            if item.get_closest_marker("long") is not None:
                item.add_marker(skip)


_unoptimized_child = None


def _on_lavapipe() -> bool:
    from minirt.session import get_device
    return get_device().profile.vendor == "llvmpipe"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A test marked `unoptimized` runs in the unoptimized child (tests/unoptimized_child.py) on lavapipe, unless
    this process is that child or GALLIVM_PERF is set already (whoever set it chose lavapipe's LLVM flags)."""
    global _unoptimized_child
    import unoptimized_child
    if pyfuncitem.get_closest_marker("unoptimized") is None or "GALLIVM_PERF" in os.environ \
            or os.environ.get(unoptimized_child.IN_CHILD) or not _on_lavapipe():
        return None
    config = pyfuncitem.config
    if _unoptimized_child is None:
        _unoptimized_child = unoptimized_child.Child({"MINIRT_TEST_VALIDATION": "1"}
                                                      if _validation_requested(config) else {})
    outcome, text = _unoptimized_child.run(["--rootdir", str(config.rootpath),
                                            str(config.rootpath / pyfuncitem.nodeid)])
    if outcome == "skipped":
        pytest.skip(text)
    if outcome != "passed":
        if outcome == "died":
            _unoptimized_child = None
        pytest.fail(text, pytrace=False)
    return True


def pytest_unconfigure(config):
    if _unoptimized_child is not None:
        _unoptimized_child.close()


def pytest_report_header(config):
    if _validation_requested(config):
        return "minirt: Khronos validation layer on (any warning or error fails the test)"


_performance_advice: dict = {}    # message id -> (count, first text), reported once at the end


@pytest.fixture(autouse=True)
def _validation_clean(request):
    """With --validation, fail the test when the validation layer reported a warning or an error while it
    ran. Performance advice (e.g. "layout should be TRANSFER_DST_OPTIMAL instead of GENERAL": minirt
    keeps every image in GENERAL on purpose) does not fail a test; it is summarised at the end."""
    if not _validation_requested(request.config):
        yield
        return
    from minirt.vk import device
    start = len(device.validation_messages)
    yield
    new = device.validation_messages[start:]
    bad = [m for m in new if not m.startswith("PERFORMANCE ")]
    for m in new:
        if m.startswith("PERFORMANCE "):
            ident = m.split("]", 1)[0] + "]"
            n, first = _performance_advice.get(ident, (0, m))
            _performance_advice[ident] = (n + 1, first)
    if bad:
        shown = "\n".join(f"  {m}" for m in bad[:10]) + (f"\n  ... ({len(bad) - 10} more)" if len(bad) > 10 else "")
        pytest.fail(f"{len(bad)} Vulkan validation message(s) during this test:\n{shown}", pytrace=False)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _validation_requested(config) and _performance_advice:
        terminalreporter.section("Vulkan validation: performance advice (does not fail tests)")
        for ident, (n, first) in sorted(_performance_advice.items()):
            terminalreporter.write_line(f"{n:6d} x {ident}  e.g. {first[:400]}")


@pytest.fixture(autouse=True, scope="session")
def _private_pipeline_cache(tmp_path_factory):
    """Tests write pipeline caches to a temporary folder, never the user's ~/.cache."""
    import os
    if "MINIRT_CACHE_DIR" not in os.environ:
        os.environ["MINIRT_CACHE_DIR"] = str(tmp_path_factory.mktemp("pipeline-cache"))
    yield


# OpenAI's Whisper tiny.en encoder weights as safetensors (tests/real_whisper.py), for the real-weights tests
@pytest.fixture(scope="session")
def tiny_en():
    import real_whisper
    try:
        return real_whisper.tiny_en_safetensors()
    except real_whisper.Unavailable as e:
        pytest.skip(f"Whisper tiny.en weights unavailable: {e}")
