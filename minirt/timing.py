"""Start-up phase timing: Session.startup_ms and Executor.startup_ms, read by tools/coldstart.py and
shown as progress by the command line."""
from __future__ import annotations

import time


class Phases:
    """`phases("upload", "uploading weights")` ends the running phase (its milliseconds are added to
    `into[name]`), starts the next and tells `progress` its label; `phases(None)` ends the last one."""

    def __init__(self, into: dict, progress=None):
        self.into, self.progress = into, progress
        self.name, self.t0 = None, 0.0

    def __call__(self, name, label=None):
        now = time.perf_counter()
        if self.name is not None:
            self.into[self.name] = self.into.get(self.name, 0.0) + (now - self.t0) * 1e3
        self.name, self.t0 = name, now
        if name is not None and label and self.progress:
            self.progress(label)
