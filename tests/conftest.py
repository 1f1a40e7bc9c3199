import pytest


def pytest_addoption(parser):
    parser.addoption("--validation", action="store_true", help="run with the Khronos validation layer")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a full-size model run (tens of seconds on lavapipe); runs by default, "
                                       "deselect with -m 'not slow'")
