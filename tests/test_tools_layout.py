"""Scripts in tools/ and tools/dev/ run with their folder first on sys.path, so none may be named like a module that
Python or an installed package provides (a tools/profile.py would hide the standard `profile`, which torch imports:
hence the extensionless tools/profile); and tests import no diagnostic from tools/dev/."""
import ast
import sys
from importlib.machinery import PathFinder
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL_DIRS = (ROOT / "tools", ROOT / "tools" / "dev")
SCRIPTS = sorted(p for d in TOOL_DIRS for p in d.glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_shadows_no_module(script):
    name = script.stem
    assert name not in sys.stdlib_module_names and name not in sys.builtin_module_names, name
    elsewhere = [p for p in sys.path if Path(p or ".").resolve() not in TOOL_DIRS]
    spec = PathFinder.find_spec(name, elsewhere)
    assert spec is None or spec.origin is None, f"tools script {script.name} shadows {spec.origin}"


def test_tests_import_no_diagnostic():
    dev = {p.stem for p in (ROOT / "tools" / "dev").glob("*.py")}
    for test in sorted((ROOT / "tests").glob("*.py")):
        tree = ast.parse(test.read_text(), str(test))
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not names & dev, f"{test.name} imports {sorted(names & dev)} from tools/dev/"
