"""Process-wide worker threads for host work that numpy runs without the GIL (copies, page faulting, FFTs).

Each pool is made the first time it is asked for and kept: fresh threads would start with cold allocator arenas,
and a run would pay for making them."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_pools: dict = {}
_lock = threading.Lock()


def pool(name: str, threads: int) -> ThreadPoolExecutor:
    """The process's pool called `name` (its threads' name prefix), of `threads` threads."""
    p = _pools.get(name)
    if p is None:
        with _lock:
            p = _pools.get(name)
            if p is None:
                p = _pools[name] = ThreadPoolExecutor(threads, thread_name_prefix=name)
    return p
