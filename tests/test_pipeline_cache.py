"""The on-disk pipeline cache: where it lives, reuse by a second Session, corrupt and foreign files
ignored and replaced, atomic writes, and the switch that turns it off."""
import os
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from minirt import Session
from minirt.options import environment
from minirt.vk import pipeline_cache as cache
from oracle import make_model, rand


def _model():
    nodes = [helper.make_node("Tanh", ["x"], ["a"]), helper.make_node("Mul", ["a", "x"], ["y"])]
    return make_model(nodes, {"x": (4, 33)}, ["y"])


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("MINIRT_CACHE_DIR", str(d))
    monkeypatch.delenv("MINIRT_NO_PIPELINE_CACHE", raising=False)
    return d


def _kernels(s):
    return next(iter(s._execs.values())).kernels


def _open(check=True):
    """A Session run once; returns (PipelineCache of its kernels, the file's path). Closed on return."""
    x = rand(4, 33)
    with Session(_model()) as s:
        pc = _kernels(s).cache
        if check:
            np.testing.assert_allclose(s.run(x), np.tanh(x) * x, rtol=1e-5, atol=1e-6)
        folder = environment().cache_dir          # None when the cache is off
        path = folder / cache.device_key(s.device).filename() if folder else None
    return pc, path


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("MINIRT_CACHE_DIR", raising=False)
    monkeypatch.delenv("MINIRT_NO_PIPELINE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert environment().cache_dir == tmp_path / "xdg" / "minirt"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")          # the XDG spec: ignore relative paths
    assert environment().cache_dir == Path.home() / ".cache" / "minirt"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert environment().cache_dir == Path.home() / ".cache" / "minirt"
    monkeypatch.setenv("MINIRT_CACHE_DIR", str(tmp_path / "mine"))
    assert environment().cache_dir == tmp_path / "mine"
    monkeypatch.setenv("MINIRT_NO_PIPELINE_CACHE", "1")
    assert environment().cache_dir is None


def test_key_names_device_driver_and_version():
    k = cache.DeviceKey(0x10DE, 0x2335, bytes(range(16)), 555, "NVIDIA 555.1", "0.1.0")
    assert k.filename().startswith("pipelines-10de-2335-") and k.filename().endswith(".bin")
    for other in (cache.DeviceKey(0x10DE, 0x2335, bytes(16), 555, "NVIDIA 555.1", "0.1.0"),
                  cache.DeviceKey(0x10DE, 0x2335, bytes(range(16)), 556, "NVIDIA 555.1", "0.1.0"),
                  cache.DeviceKey(0x10DE, 0x2335, bytes(range(16)), 555, "NVIDIA 555.1", "0.2.0")):
        assert other.filename() != k.filename()
    assert cache.check_header(k.header(), k) is None
    assert "shorter" in cache.check_header(k.header()[:20], k)
    assert "vendor/device" in cache.check_header(cache.DeviceKey(1, 2, k.uuid, 0).header(), k)
    assert "UUID" in cache.check_header(cache.DeviceKey(k.vendor_id, k.device_id, bytes(16), 0).header(), k)


def test_second_session_reuses_the_file(cache_dir):
    pc1, path = _open()
    assert pc1.status == "missing" and pc1.saved
    data = path.read_bytes()
    assert path.parent == cache_dir and len(data) >= cache.HEADER.size
    assert cache.check_header(data, pc1.key) is None
    stamp = path.stat().st_mtime_ns, path.stat().st_ino

    pc2, path2 = _open()
    assert path2 == path
    assert pc2.status == "loaded" and pc2.initial == data   # created with the file's bytes as initial data
    assert not pc2.saved                                     # nothing new: the file is not rewritten
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == stamp
    assert [p.name for p in cache_dir.iterdir()] == [path.name]    # no temporary files left behind


def test_every_pipeline_goes_through_the_cache(cache_dir, monkeypatch):
    seen = []
    with Session(_model()) as s:
        k = _kernels(s)
        assert k.cache.handle is not None and k.created >= 2
        real = k.vk.vkCreateComputePipelines

        def spy(device, pcache, *a):
            seen.append(pcache)
            return real(device, pcache, *a)
        monkeypatch.setattr(k.vk, "vkCreateComputePipelines", spy)
        name, types, local, spec = next(iter(k.pipelines))
        k.pipeline(name, types, (1, 1, 1) if tuple(local) != (1, 1, 1) else (2, 1, 1), spec)
    assert seen and all(c is not None for c in seen)


@pytest.mark.parametrize("content", [b"", b"garbage" * 3, os.urandom(4096)])
def test_corrupt_file_is_ignored_and_replaced(cache_dir, content):
    _, path = _open()
    good = path.read_bytes()
    path.write_bytes(content)
    pc, _ = _open()
    assert pc.status.startswith("ignored") and pc.saved
    assert path.read_bytes()[:cache.HEADER.size] == good[:cache.HEADER.size]


@pytest.mark.parametrize("field", ["vendor", "uuid", "header_version", "header_size"])
def test_foreign_header_is_ignored(cache_dir, field):
    _, path = _open()
    size, version, vendor, device, uuid = cache.HEADER.unpack_from(path.read_bytes())
    if field == "vendor":
        vendor ^= 0x1234
    elif field == "uuid":
        uuid = bytes(b ^ 0xFF for b in uuid)
    elif field == "header_version":
        version = 7
    else:
        size = 1 << 20
    path.write_bytes(cache.HEADER.pack(size, version, vendor, device, uuid) + os.urandom(256))
    pc, _ = _open()
    assert pc.status.startswith("ignored") and pc.saved
    assert cache.check_header(path.read_bytes(), pc.key) is None     # replaced by this device's cache


def test_writes_are_atomic(cache_dir, monkeypatch):
    calls = []
    real = os.replace

    def spy(src, dst):
        calls.append((Path(src), Path(dst), Path(src).read_bytes()))
        return real(src, dst)
    monkeypatch.setattr(cache.os, "replace", spy)
    _, path = _open()
    assert len(calls) == 1
    src, dst, data = calls[0]
    assert dst == path and src.parent == path.parent and src != path and data == path.read_bytes()
    assert not src.exists()

    # a write that fails half-way leaves the old file whole and no temporary file
    old = path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")
    monkeypatch.setattr(cache.os, "replace", boom)
    with pytest.raises(OSError):
        cache.write_atomic(path, b"new contents")
    assert path.read_bytes() == old and [p.name for p in cache_dir.iterdir()] == [path.name]


def test_unwritable_cache_dir_is_harmless(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("MINIRT_CACHE_DIR", str(blocker / "minirt"))
    monkeypatch.delenv("MINIRT_NO_PIPELINE_CACHE", raising=False)
    pc, _ = _open()
    assert not pc.saved


def test_switched_off(cache_dir, monkeypatch):
    monkeypatch.setenv("MINIRT_NO_PIPELINE_CACHE", "1")
    pc, _ = _open()
    assert pc.status == "off" and pc.handle is None and not pc.saved
    assert not cache_dir.exists()


def test_two_sessions_at_once_share_the_file(cache_dir):
    with Session(_model()) as a, Session(_model()) as b:
        x = rand(4, 33)
        np.testing.assert_allclose(a.run(x), b.run(x))
        pa, pb = _kernels(a).cache, _kernels(b).cache
    assert pa.path == pb.path and (pa.saved or pb.saved)
    assert cache.check_header(pa.path.read_bytes(), pa.key) is None


def test_startup_phases_are_recorded(cache_dir):
    with Session(_model()) as s:
        assert {"load", "check", "device", "plan", "pipelines", "upload", "alloc", "record"} <= set(s.startup_ms)
        assert "first_run" not in s.startup_ms
        s.run(rand(4, 33))
        assert s.startup_ms["first_run"] > 0 and all(v >= 0 for v in s.startup_ms.values())


def test_progress_callback_names_the_phases(cache_dir):
    seen = []
    with Session(_model(), progress=seen.append):
        pass
    assert seen[:2] == ["loading", "checking"] and "planning" in seen and "uploading weights" in seen
