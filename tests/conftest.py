import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--validation", action="store_true",
                     help="run with the Khronos validation layer (also MINIRT_TEST_VALIDATION=1): any validation "
                          "warning or error during a test fails it")


def _validation_requested(config) -> bool:
    return bool(config.getoption("--validation")) or os.environ.get("MINIRT_TEST_VALIDATION", "") not in ("", "0")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a full-size model run, or a kernel that compiles for tens of seconds on "
                                       "lavapipe; runs by default (first), deselect with -m 'not slow'")
    if _validation_requested(config):
        # before any test creates the (lazily made, process-wide) VkInstance
        os.environ["MINIRT_VALIDATION"] = "1"


def pytest_collection_modifyitems(config, items):
    """Tests marked slow first (a stable sort): with -n, no worker ends the run alone on one of them (on lavapipe most
    of their time is the first compile of a big kernel)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
