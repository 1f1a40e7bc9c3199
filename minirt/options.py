"""Session options as planner passes and ops read them."""
from __future__ import annotations

OFF = ("", "0", "false", "off", "no")


def option_on(options: dict, key: str, default: bool) -> bool:
    """A boolean option that may come as a string from a command line (tools/bench.py --option KEY=0)."""
    v = options.get(key)
    if v is None:
        return default
    return v.strip().lower() not in OFF if isinstance(v, str) else bool(v)
