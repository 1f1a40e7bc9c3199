"""minirt.driver.Driver, the close Session and Program share: every resource it gives up is closed once, in order,
even when one fails (the first failure is raised after the rest were closed); a closed driver closes nothing again,
and one that failed half-built is collected quietly."""
import gc

import pytest

from minirt.driver import Driver


class Part:
    def __init__(self, log, name, fail=False):
        self.log, self.name, self.fail = log, name, fail

    def close(self):
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} failed")


class Owner(Driver):
    def __init__(self, parts):
        super().__init__()
        self.parts = parts

    def _release(self):
        parts, self.parts = self.parts, None
        return parts or []

    def _is_open(self):
        return bool(self.parts)


def test_close_frees_everything_in_order_and_raises_the_first_failure():
    log = []
    d = Owner([Part(log, "a"), None, Part(log, "b", fail=True), Part(log, "c", fail=True), Part(log, "d")])
    with pytest.raises(RuntimeError, match="b failed"):
        d.close()
    assert log == ["a", "b", "c", "d"]
    d.close()                                       # idempotent
    assert log == ["a", "b", "c", "d"]


def test_context_manager_and_collection_close_once():
    log = []
    with Owner([Part(log, "a")]):
        pass
    assert log == ["a"]
    Owner([Part(log, "b")])
    gc.collect()
    assert log == ["a", "b"]

    class HalfBuilt(Owner):
        def __init__(self):
            super().__init__([])
            raise ValueError("failed in __init__")

    with pytest.raises(ValueError):
        HalfBuilt()
    gc.collect()
