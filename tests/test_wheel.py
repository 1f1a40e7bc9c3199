"""The built wheel is a working install: built from the checkout, installed into a fresh venv outside it, `minirt run`
finds the compiled kernels inside the installed package (minirt/spirv/) and computes the right answer.

The new venv has no pip and downloads nothing: the wheel goes in with --no-deps through this interpreter's pip, and a
.pth file lets it import the dependencies (numpy, vulkan, onnx, ...) from this interpreter's site-packages. Lines of
a .pth file only add folders to sys.path; the .pth files inside those folders are not run, so an editable install of
minirt there (a .pth that hooks the checkout into imports) stays off, and the test checks where minirt came from."""
import importlib.metadata
import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
# What the build reads (pyproject.toml names the rest: the readme, the license, the packages)
BUILD_INPUTS = ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "README.md", "LICENSE", "minirt", "spirv")


def _setuptools_for_build():
    """None when this interpreter's setuptools can build the wheel, else why not."""
    try:
        version = importlib.metadata.version("setuptools")
    except importlib.metadata.PackageNotFoundError:
        return "setuptools is not installed in this interpreter (minirt's test extra has it)"
    if int(version.split(".")[0]) < 77:
        return f"setuptools {version} is older than pyproject.toml's setuptools>=77 (minirt's test extra has it)"
    return None


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r


def _tiny_model(path):
    """y = Relu(x @ w + b): x [3, 8], w [8, 5] and b [5] seeded initializers."""
    rng = np.random.default_rng(7)
    w, b = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["y"])]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    path.write_bytes(m.SerializeToString())
    return w, b


def test_wheel_installs_and_runs_outside_the_checkout(tmp_path):
    why = _setuptools_for_build()
    if why:
        pytest.skip(f"cannot build the wheel without a download: {why}")

    # 1. the wheel, built from a copy of the checkout (a build in place would leave build/ there, whose leftovers
    #    from earlier builds would go into later wheels)
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
          str(src)], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("minirt-*.whl")

    # every package under minirt/ is in the wheel (pyproject.toml lists them by hand), and so are the kernels
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    packages = {str(p.parent.relative_to(ROOT)) for p in (ROOT / "minirt").rglob("__init__.py")}
    assert {p for p in packages if f"{p}/__init__.py" not in names} == set()
    spv = sorted(p.name for p in (ROOT / "spirv").glob("*.spv"))
    assert "minirt/spirv/manifest.json" in names and all(f"minirt/spirv/{n}" in names for n in spv)

    # 2. a fresh venv outside the checkout, the wheel in it, this interpreter's site-packages for the dependencies
    venv = tmp_path / "venv"
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    install = ["install", "-q", "--no-deps", "--no-index", str(wheel)]
    import pip
    if tuple(int(v) for v in pip.__version__.split(".")[:2]) >= (22, 3):    # pip --python: no pip in the venv
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        _run([sys.executable, "-m", "pip", "--python", str(py), *install])
    else:
        _run([sys.executable, "-m", "venv", str(venv)])                      # ensurepip: offline, a few seconds
        _run([str(py), "-m", "pip", *install])
    purelib = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    deps = [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    if site.ENABLE_USER_SITE:
        deps.append(site.getusersitepackages())
    deps = dict.fromkeys(deps)
    (purelib / "_outer_site_packages.pth").write_text("".join(f"{d}\n" for d in deps if Path(d).is_dir()))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(PYTHONNOUSERSITE="1", MINIRT_CACHE_DIR=str(tmp_path / "cache"))
    where = _run([str(py), "-c", "import minirt, minirt.vk.pipelines as k; print(minirt.__file__); print(k.spirv_dir())"],
                 cwd=tmp_path, env=env).stdout.split("\n")
    assert Path(where[0]).parent == purelib / "minirt", where
    assert Path(where[1]) == purelib / "minirt" / "spirv", where

    # 3. the installed command on a tiny model
    w, b = _tiny_model(tmp_path / "tiny.onnx")
    x = np.random.default_rng(8).standard_normal((3, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    minirt = bindir / "minirt"
    r = _run([str(minirt), "run", "tiny.onnx", "x.npy", "-o", "y.npy", "-q"], cwd=tmp_path, env=env)
    assert "shape [3, 5] float32" in r.stdout, r.stdout
    want = np.maximum(x.astype(np.float64) @ w + b, 0)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-5, atol=1e-5)
