"""Options: one typed, checked settings object; the environment read in one place; the device table."""
from __future__ import annotations

import ast
import dataclasses
import re
import sys
from pathlib import Path

import pytest

from minirt.device_profile import KNOWN_PROFILES, Tuning
from minirt.errors import MinirtError
from minirt.infer import prepare
from minirt.loaders import load
from minirt.options import Options, option_table, read_environment
from minirt.planner import make_plan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))
import whisper_encoder as we  # noqa: E402


def test_unknown_key_lists_the_valid_ones():
    with pytest.raises(MinirtError) as e:
        Options.make({"gemm_tilee": "t44"})
    assert "gemm_tilee" in str(e.value) and "gemm_tile" in str(e.value) and "precision" in str(e.value)


@pytest.mark.parametrize("key, value, want", [
    ("gemm_splitk", "x", "an integer >= 1"), ("gemm_splitk", 0, "an integer >= 1"), ("gemm_splitk", 2.5, "an integer"),
    ("precision", "fp64", "one of fp32, fp16"), ("local_size", "8xq", "1 to 3 integers"),
    ("poison", "maybe", "a boolean"), ("timeout_s", -1, "a finite number >= 0"),
    ("local_size_families", ("gemm", "attention"), "names from"), ("coopmat", "always", "one of auto, off, emulate"),
])
def test_wrong_values_are_refused_by_name(key, value, want):
    with pytest.raises(MinirtError, match=f"option {key} must be {want}"):
        Options.make({key: value})


def test_text_values_convert_as_the_command_line_gives_them():
    o = Options.make({"local_size": "16x4", "local_size_families": "gemm+im2col", "poison": "1", "gemm_splitk": "3",
                      "attention_stream": "0", "coopmat": "false", "attention_tile": "64x8x2", "spin_ms": "2.5"})
    assert (o.local_size, o.local_size_families, o.poison, o.gemm_splitk) == ((16, 4, 1), ("gemm", "im2col"), True, 3)
    assert (o.attention_stream, o.coopmat, o.attention_tile, o.spin_ms) == (False, "off", (64, 8, 2), 2.5)
    assert o.changed() == {"local_size": (16, 4, 1), "local_size_families": ("gemm", "im2col"), "poison": True,
                           "gemm_splitk": 3, "attention_stream": False, "coopmat": "off",
                           "attention_tile": (64, 8, 2), "spin_ms": 2.5}
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.poison = False


def test_environment_sets_defaults_and_keywords_win(monkeypatch):
    monkeypatch.setenv("MINIRT_TIMEOUT_S", "12")
    monkeypatch.setenv("MINIRT_DIRECT_IO", "1")
    monkeypatch.setenv("MINIRT_NO_CONV1D_REWRITE", "1")
    o = Options.make()
    assert (o.timeout_s, o.direct_io, o.conv1d_rewrite) == (12.0, "both", False)
    assert Options.make({"timeout_s": 3}).timeout_s == 3.0
    monkeypatch.setenv("MINIRT_SPIN_MS", "soon")
    with pytest.raises(MinirtError, match="MINIRT_SPIN_MS"):
        Options.make()


def test_read_environment_cache_dir():
    assert read_environment({"MINIRT_CACHE_DIR": "/x/y"}).cache_dir == Path("/x/y")
    assert read_environment({"XDG_CACHE_HOME": "/c"}).cache_dir == Path("/c/minirt")
    assert read_environment({"XDG_CACHE_HOME": "rel"}).cache_dir == Path.home() / ".cache" / "minirt"
    assert read_environment({"MINIRT_NO_PIPELINE_CACHE": "1"}).cache_dir is None
    assert read_environment({"MINIRT_VALIDATION": "1", "MINIRT_DEVICE": "2"}).device == "2"


def test_only_options_reads_the_environment():
    """Every environment variable is resolved in minirt/options.py."""
    offenders = []
    for path in (ROOT / "minirt").rglob("*.py"):
        if path.name == "options.py" and path.parent.name == "minirt":
            continue
        if re.search(r"os\.environ|getenv\(", path.read_text()):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, offenders


def test_planner_never_imports_vulkan():
    for path in [*(ROOT / "minirt" / "planner").rglob("*.py"), *(ROOT / "minirt" / "ops").rglob("*.py"),
                 *(ROOT / "minirt" / "kernels").rglob("*.py"), ROOT / "minirt" / "options.py",
                 ROOT / "minirt" / "device_profile.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n == "vulkan" or n.startswith("vk") or ".vk" in n for n in names), (path, names)


def test_run_settings_are_in_the_plan():
    g = prepare(load(we.build_whisper_encoder("tiny", layers=1, n_frames=200, seed=1)))
    h200, lava, adreno = (KNOWN_PROFILES[k] for k in ("nvidia-h200", "lavapipe", "adreno-840"))
    p = make_plan(g, h200)
    assert (p.direct_io, p.zero_copy, p.spin_ms) == ((), True, 20.0)
    p = make_plan(g, lava, options={"direct_io": "out", "spin_ms": 1})
    assert (p.direct_io, p.zero_copy, p.spin_ms) == (("output",), False, 1.0)
    p = make_plan(g, adreno, options={"direct_io": "both"})       # textures: no direct I/O, no zero-copy
    assert (p.storage, p.direct_io, p.zero_copy, p.spin_ms) == ("texture", (), False, 0.0)


def test_device_table():
    t = {k: p.tuning for k, p in KNOWN_PROFILES.items()}
    assert t["nvidia-h200"] == dataclasses.replace(
        Tuning(), gemm_groups="desktop", im2col_shape=(4, 16, 1), linear_tile="t44k32", split_work=True, spin_ms=20.0,
        paired_lanes=True, small_pass_invocations=256, subgroup_rows=True)
    assert t["adreno-840"] == dataclasses.replace(Tuning(), storage="texture", gemm_groups="adreno")
    assert t["mali-g715"] == dataclasses.replace(Tuning(), storage="texture")
    assert t["lavapipe"] == dataclasses.replace(Tuning(), subgroup_rows=True, attention_cpu_tiles=True,
                                                attention_prefetch=False)


def test_no_vendor_lists_outside_the_device_table():
    """Vendor and device-type tests live in minirt/device_profile.py's TUNING (the CLI may print them)."""
    pattern = re.compile(r"\.vendor\s*(==|!=|in)|device_type\s*(==|!=|in)|VENDORS\b")
    offenders = []
    for path in (ROOT / "minirt").rglob("*.py"):
        if path.name in ("device_profile.py", "cli.py") or path.parent.name == "vk":
            continue
        offenders += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                      if pattern.search(line)]
    assert not offenders, offenders


def test_readme_documents_every_option():
    readme = (ROOT / "README.md").read_text()
    missing = [name for name, *_ in option_table() if f"`{name}`" not in readme]
    assert not missing, f"README.md's Options table lacks {missing}; regenerate it with `minirt options --markdown`"
