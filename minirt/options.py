"""Session options as planner passes and ops read them."""
from __future__ import annotations

OFF = ("", "0", "false", "off", "no")


def option_on(options: dict, key: str, default: bool) -> bool:
    """A boolean option that may come as a string from a command line (tools/bench.py --option KEY=0)."""
    v = options.get(key)
    if v is None:
        return default
    return v.strip().lower() not in OFF if isinstance(v, str) else bool(v)


def option_count(options: dict, key: str):
    """A count option (an integer >= 1, possibly as a string), or None where absent; anything else is refused."""
    from .errors import MinirtError
    v = options.get(key)
    if v is None:
        return None
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or isinstance(v, bool) or (isinstance(v, float) and v != n):
        raise MinirtError(f"option {key} must be an integer >= 1, got {v!r}")
    return n
