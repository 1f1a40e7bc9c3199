"""Tests for tools/build_shaders.py, run against a throwaway copy of the repo layout."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "build_shaders.py"
KERNELS = TOOL.parent.parent / "minirt" / "kernels" / "variants.py"    # the tool names variants with it, by path

HEADER = "float scale(float x) { return 2.0 * x; }\n"
SHADER = """#version 450
#extension GL_GOOGLE_include_directive : require
// variants: storage=buffer,texture
#include "common.glslh"
layout(local_size_x = 64) in;
#ifdef STORAGE_BUFFER
layout(std430, binding = 0) buffer Buf { float data[]; };
void main() { uint i = gl_GlobalInvocationID.x; data[i] = scale(data[i]); }
#elif defined(STORAGE_TEXTURE)
layout(binding = 0, r32f) uniform image1D img;
void main() { int i = int(gl_GlobalInvocationID.x); imageStore(img, i, vec4(scale(imageLoad(img, i).x))); }
#endif
"""
PLAIN = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() {}\n"


@pytest.fixture
def root(tmp_path):
    (tmp_path / "tools").mkdir()
    shutil.copy(TOOL, tmp_path / "tools" / TOOL.name)
    (tmp_path / "minirt" / "kernels").mkdir(parents=True)
    shutil.copy(KERNELS, tmp_path / "minirt" / "kernels" / KERNELS.name)
    (tmp_path / "glsl").mkdir()
    (tmp_path / "glsl" / "common.glslh").write_text(HEADER)
    (tmp_path / "glsl" / "scale.comp").write_text(SHADER)
    (tmp_path / "glsl" / "noop.comp").write_text(PLAIN)
    return tmp_path


def run(root, *args, env=None):
    # Run the copy under tools/ via --root from an unrelated cwd, proving paths don't depend on cwd.
    return subprocess.run([sys.executable, str(root / "tools" / TOOL.name), "--root", str(root), *args],
                          capture_output=True, text=True, cwd="/", env=env)


needs_glslc = pytest.mark.skipif(shutil.which("glslc") is None or shutil.which("spirv-val") is None,
                                 reason="glslc/spirv-val not installed")


def test_list_needs_no_compiler(root):
    r = run(root, "--list")
    assert r.returncode == 0, r.stderr
    assert "scale_buffer" in r.stdout and "-DSTORAGE_TEXTURE=1" in r.stdout and "noop" in r.stdout


def test_product_and_exclude(root):
    (root / "glsl" / "gemm.comp").write_text(
        "#version 450\n// variants: storage=buffer,texture dtype=float,half\n"
        "// exclude: storage=texture dtype=half\nlayout(local_size_x = 1) in;\nvoid main() {}\n")
    names = [line.split()[0] for line in run(root, "--list").stdout.splitlines()]
    assert [n for n in names if n.startswith("gemm")] == ["gemm_buffer", "gemm_buffer_half", "gemm_texture"]  # dtype=float keeps the short name


def test_names_follow_the_axis_order_of_minirt_kernels(root):
    """Values go into a name in minirt/kernels/variants.py's AXES order, whatever order the variants line lists them in; an axis
    not in AXES is refused (its place in names would be undefined)."""
    (root / "glsl" / "gemm.comp").write_text(
        "#version 450\n// variants: dtype=float,half storage=buffer\nlayout(local_size_x = 1) in;\nvoid main() {}\n")
    names = [line.split()[0] for line in run(root, "--list").stdout.splitlines()]
    assert [n for n in names if n.startswith("gemm")] == ["gemm_buffer", "gemm_buffer_half"]
    (root / "glsl" / "gemm.comp").write_text(
        "#version 450\n// variants: flavour=a,b\nlayout(local_size_x = 1) in;\nvoid main() {}\n")
    r = run(root, "--list")
    assert r.returncode == 2 and "flavour" in r.stderr and "AXES" in r.stderr


@needs_glslc
def test_build_check_and_header_edit(root):
    r = run(root)
    assert r.returncode == 0, r.stderr
    manifest_bytes = (root / "spirv" / "manifest.json").read_bytes()
    shaders = json.loads(manifest_bytes)["shaders"]
    assert set(shaders) == {"scale_buffer", "scale_texture", "noop"}
    assert shaders["scale_buffer"]["defines"] == ["STORAGE_BUFFER=1"]
    assert shaders["scale_texture"]["source"] == "glsl/scale.comp"
    assert shaders["noop"]["defines"] == []
    assert all((root / "spirv" / f"{n}.spv").is_file() for n in shaders)

    # --check must work without glslc on PATH.
    r = run(root, "--check", env={**os.environ, "PATH": ""})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "spirv/ is up to date (3 shaders)" in r.stdout

    # Rebuilding unchanged sources gives a byte-identical manifest.
    assert run(root).returncode == 0
    assert (root / "spirv" / "manifest.json").read_bytes() == manifest_bytes

    # Editing an included header makes both variants that include it stale, but not noop.
    (root / "glsl" / "common.glslh").write_text(HEADER.replace("2.0", "3.0"))
    r = run(root, "--check")
    assert r.returncode == 1
    assert "stale: scale_buffer" in r.stdout and "stale: scale_texture" in r.stdout and "noop" not in r.stdout

    # Dropping a variant: --check reports it extra; a rebuild deletes its .spv.
    (root / "glsl" / "scale.comp").write_text(SHADER.replace("storage=buffer,texture", "storage=buffer"))
    r = run(root, "--check")
    assert r.returncode == 1 and "extra: scale_texture" in r.stdout
    assert run(root).returncode == 0
    assert not (root / "spirv" / "scale_texture.spv").exists()
    assert run(root, "--check").returncode == 0

    # A tampered .spv is caught.
    (root / "spirv" / "noop.spv").write_bytes(b"junk")
    r = run(root, "--check")
    assert r.returncode == 1 and "stale: noop" in r.stdout


@needs_glslc
def test_syntax_error_names_variant(root):
    assert run(root).returncode == 0
    before = (root / "spirv" / "manifest.json").read_bytes()
    (root / "glsl" / "scale.comp").write_text(SHADER.replace(
        "#elif defined(STORAGE_TEXTURE)", "#elif defined(STORAGE_TEXTURE)\nthis is not glsl;"))
    r = run(root)
    assert r.returncode != 0
    assert "scale_texture" in r.stderr and "STORAGE_TEXTURE=1" in r.stderr
    assert "error: scale_buffer" not in r.stderr  # the buffer variant still compiles
    # A failed build leaves the previous manifest untouched.
    assert (root / "spirv" / "manifest.json").read_bytes() == before


def test_missing_glslc_message(root):
    r = run(root, env={**os.environ, "PATH": ""})
    assert r.returncode != 0
    assert "glslc" in r.stderr and "spirv-tools" in r.stderr


def test_env_root(root):
    env = {**os.environ, "MINIRT_ROOT": str(root)}
    r = subprocess.run([sys.executable, str(root / "tools" / TOOL.name), "--list"],
                       capture_output=True, text=True, cwd="/", env=env)
    assert r.returncode == 0 and "scale_buffer" in r.stdout
