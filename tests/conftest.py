import pytest


def pytest_addoption(parser):
    parser.addoption("--validation", action="store_true", help="run with the Khronos validation layer")
