"""What Session (minirt/session.py) and Program (minirt/program.py, the Whisper program's runtime) share: the device
(get_device, one a physical device in the process), the one path from a loaded graph to a Plan (plan_graph: prepare,
then the planner) and from Plans to Executors on the device, and the one close: every executor and shared resource
freed once, the first failure raised after all were tried."""
from __future__ import annotations

import threading

from .errors import DeviceError
from .infer import prepare
from .options import Options


def plan_graph(graph, profile, storage, options: Options, *, host: bool = False, runtime_gather: int = 1 << 62,
               packs=None):
    """(the prepared graph, its Plan on `profile`). host and runtime_gather as minirt.infer.prepare takes them (the
    graph is prepared in place); with host, the Plan is None where the host computes every output. packs: as
    make_plan takes it."""
    from .planner import make_plan
    g = prepare(graph, host=host, runtime_gather=runtime_gather)
    return g, (None if host and not g.outputs else make_plan(g, profile, storage, options, packs))


_devices: dict = {}
_devices_lock = threading.Lock()


def get_device(device=None):
    """One logical device per physical device, shared by every Session and Program in the process. device: an index
    or a UUID as `minirt devices` lists them (minirt.vk.device.parse_device), None: MINIRT_DEVICE, else the best GPU.
    Each spec is resolved once; specs naming the same physical device get the same Device (and its queue lock)."""
    from .vk.device import Device, choose, physical_devices
    if isinstance(device, bool) or not isinstance(device, (int, str, type(None))):
        raise DeviceError(f"device must be an index or a UUID (see `minirt devices`), not {type(device).__name__}")
    key = "default" if device is None else device
    with _devices_lock:
        dev = _devices.get(key)
        if dev is None:
            chosen = choose(physical_devices(), device)
            dev = _devices.get(chosen[0])
            if dev is None:
                dev = Device(chosen)
                _devices[chosen[0]] = dev
            _devices[key] = dev
        return dev


class Driver:
    """Executors of Plans on one device. A subclass gives up what close() frees through _release() (executors first,
    then what they share), and says whether it is open through _is_open(); runs take self._lock."""

    def __init__(self):
        self._lock = threading.Lock()

    def _make_executor(self, device, plan, **made):
        """An Executor of `plan` on `device` (made: the Executor's keywords)."""
        from .vk.executor import Executor
        return Executor(device, plan, **made)

    def _release(self) -> list:
        """What close() frees, in order (None entries are skipped); after this call the driver is closed."""
        raise NotImplementedError

    def _is_open(self) -> bool:
        raise NotImplementedError

    def close(self):
        """Free every GPU resource; idempotent. Everything is closed even when one fails to (the first failure is
        raised after)."""
        with self._lock:
            first = None
            for r in self._release():
                if r is None:
                    continue
                try:
                    r.close()
                except Exception as e:
                    first = first or e
            if first is not None:
                raise first

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if self._is_open():
                self.close()
        except Exception:
            pass
