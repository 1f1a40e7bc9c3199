"""The on-disk VkPipelineCache: compiled pipelines survive the process, so a second process starts faster.

One file per (device, driver, minirt version) under the cache directory (minirt.options.Environment.cache_dir:
$MINIRT_CACHE_DIR, else $XDG_CACHE_HOME/minirt, else ~/.cache/minirt; none with MINIRT_NO_PIPELINE_CACHE=1):

  pipelines-<vendorID>-<deviceID>-<hash of pipelineCacheUUID, driver version, driver name, minirt version>.bin

Each Kernels (one per executor) opens a VkPipelineCache with the file's bytes as initial data, passes it
to every vkCreateComputePipelines, and writes it back when it is destroyed (Session.close), only if it
created pipelines and the driver's data changed. Writes go to a temporary file in the same folder and
os.replace() it over the old one, so a reader never sees half a file. A file whose header does not
match this device (too short, wrong header version, vendor, device or UUID) is ignored and replaced;
Vulkan checks the header too, but a driver that trusts a foreign blob is a crash we can avoid.

This module imports no `vulkan` at import time; PipelineCache takes the executor's device."""
from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..options import environment
from ..version import __version__

HEADER = struct.Struct("<IIII16s")     # headerSize, headerVersion, vendorID, deviceID, pipelineCacheUUID
HEADER_VERSION_ONE = 1                 # VK_PIPELINE_CACHE_HEADER_VERSION_ONE


def minirt_version() -> str:
    return str(__version__)


@dataclass(frozen=True)
class DeviceKey:
    """What a pipeline cache file is valid for."""
    vendor_id: int
    device_id: int
    uuid: bytes             # VkPhysicalDeviceProperties.pipelineCacheUUID (16 bytes)
    driver_version: int
    driver: str = ""        # driver name and info ("llvmpipe Mesa 22.3.6 (LLVM 15.0.6)"): some drivers
    version: str = ""       # do not change their UUID between releases, so it is part of the key too

    def filename(self) -> str:
        h = hashlib.sha256()
        for part in (self.uuid.hex(), str(self.driver_version), self.driver, self.version):
            h.update(part.encode() + b"\0")
        return f"pipelines-{self.vendor_id:04x}-{self.device_id:04x}-{h.hexdigest()[:16]}.bin"

    def header(self) -> bytes:
        """The header a driver for this device writes (tests use it to fake files)."""
        return HEADER.pack(HEADER.size, HEADER_VERSION_ONE, self.vendor_id, self.device_id, self.uuid)


def device_key(dev) -> DeviceKey:
    """The key of a minirt.vk.device.Device (reads the physical device's properties)."""
    props = dev.vk.vkGetPhysicalDeviceProperties(dev.pd)
    uuid = bytes(bytearray(int(b) & 0xFF for b in props.pipelineCacheUUID))
    return DeviceKey(int(props.vendorID), int(props.deviceID), uuid, int(props.driverVersion),
                     getattr(dev.profile, "driver", ""), minirt_version())


def check_header(data: bytes, key: DeviceKey) -> str | None:
    """None when `data` starts with a pipeline-cache header for this device, else why not."""
    if len(data) < HEADER.size:
        return f"{len(data)} bytes, shorter than the {HEADER.size}-byte header"
    size, version, vendor, device, uuid = HEADER.unpack_from(data)
    if size < HEADER.size or size > len(data):
        return f"header length {size} is not between {HEADER.size} and the file size {len(data)}"
    if version != HEADER_VERSION_ONE:
        return f"header version {version} != {HEADER_VERSION_ONE}"
    if (vendor, device) != (key.vendor_id, key.device_id):
        return f"vendor/device {vendor:#x}/{device:#x} != this device's {key.vendor_id:#x}/{key.device_id:#x}"
    if uuid != key.uuid:
        return f"pipelineCacheUUID {uuid.hex()} != this driver's {key.uuid.hex()}"
    return None


def read_valid(path: Path, key: DeviceKey) -> tuple[bytes, str]:
    """(data, status): the file's bytes if they suit this device, else b"" and why they were ignored."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return b"", "missing"
    except OSError as e:
        return b"", f"unreadable ({e.strerror or e})"
    why = check_header(data, key)
    if why:
        return b"", f"ignored: {why}"
    return data, "loaded"


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class PipelineCache:
    """A VkPipelineCache backed by a file. `handle` is None when the cache is off or could not be made,
    and vkCreateComputePipelines then gets no cache.

    status: "off", "missing" (a fresh file will be written), "loaded", "ignored: <why>" (a corrupt or
    foreign file, replaced at the next save) or "unreadable (...)"; saved: whether save() wrote the file."""

    def __init__(self, dev, path: Path | None = None):
        self.dev, self.vk = dev, dev.vk
        self.handle, self.path, self.initial, self.saved = None, None, b"", False
        folder = environment().cache_dir     # read now: tests change the variables between Sessions
        if folder is None:
            self.status = "off"
            return
        try:
            self.key = device_key(dev)
            self.path = Path(path) if path else folder / self.key.filename()
        except Exception as e:   # a cache is an optimisation: never fail a Session over it
            self.status = f"off ({e})"
            return
        self.initial, self.status = read_valid(self.path, self.key)
        self.handle = self._create(self.initial)
        if self.handle is None and self.initial:
            self.status = "ignored: the driver refused the data"
            self.initial = b""
            self.handle = self._create(b"")

    def _create(self, data: bytes):
        vk, ffi = self.vk, self.vk.ffi
        try:
            if data:
                buf = ffi.new("char[]", data)
                info = vk.VkPipelineCacheCreateInfo(initialDataSize=len(data), pInitialData=buf)
            else:
                info = vk.VkPipelineCacheCreateInfo(initialDataSize=0, pInitialData=ffi.NULL)
            return vk.vkCreatePipelineCache(self.dev.device, info, None)
        except vk.VkError:
            return None

    def data(self, handle=None) -> bytes:
        """The driver's serialised cache: vkGetPipelineCacheData's size query, then the data (raw cffi:
        the binding has no wrapper for the two-call pattern). Retries when the size grew in between."""
        vk, ffi = self.vk, self.vk.ffi
        handle = self.handle if handle is None else handle
        size = ffi.new("size_t*")
        for _ in range(4):
            if vk.lib.vkGetPipelineCacheData(self.dev.device, handle, size, ffi.NULL) != vk.VK_SUCCESS:
                return b""
            buf = ffi.new("char[]", max(int(size[0]), 1))
            r = vk.lib.vkGetPipelineCacheData(self.dev.device, handle, size, buf)
            if r == vk.VK_SUCCESS:
                return bytes(ffi.buffer(buf, int(size[0])))
            if r != vk.VK_INCOMPLETE:
                return b""
        return b""

    def save(self) -> bool:
        """Write the cache back if the driver's data differ from what was loaded. Pipelines that another
        process or Session wrote to the file since we read it are merged in first, so none are lost."""
        if self.handle is None:
            return False
        vk = self.vk
        try:
            current, _ = read_valid(self.path, self.key)
            if current and current != self.initial:
                other = self._create(current)
                if other is not None:
                    try:
                        vk.vkMergePipelineCaches(self.dev.device, self.handle, 1, [other])
                    except vk.VkError:
                        pass
                    finally:
                        vk.vkDestroyPipelineCache(self.dev.device, other, None)
            data = self.data()
            if not data or check_header(data, self.key) or data == self.initial or data == current:
                return False
            write_atomic(self.path, data)
            self.initial, self.saved = data, True
            return True
        except OSError:         # read-only home, full disk: run on, uncached
            return False

    def destroy(self):
        if self.handle is not None:
            self.vk.vkDestroyPipelineCache(self.dev.device, self.handle, None)
            self.handle = None
