"""The import graph of minirt/, read from the source with ast (imports inside functions counted): no cycle; the layers
point one way (minirt.kernels' local-size helper <- kernel families <- ops <- planner); no planner module reaches
into an op module's private names; no import is deferred into a function with an excuse about import order; only
the kernel families set local sizes."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "minirt"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module(p): p for p in ROOT.rglob("*.py")}


def _imports(name: str, path: Path, known) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import in the file, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "minirt"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "minirt":
                continue
            names = [a.name for a in node.names]
            # `from pkg import sub`: an import of the submodule
            subs = [n for n in names if f"{target}.{n}" in known]
            out += [(f"{target}.{n}", [], node.lineno) for n in subs]
            rest = [n for n in names if n not in subs]
            if rest or not subs:
                out.append((target, rest, node.lineno))
    return out


def _graph():
    known = _modules()
    graph = {}
    for name, path in known.items():
        graph[name] = {}
        for target, names, line in _imports(name, path, known):
            while target not in known and "." in target:      # an attribute path: its module
                target = target.rpartition(".")[0]
            if target in known and target != name:
                graph[name].setdefault(target, []).append((names, line))
    return graph


def test_no_import_cycle():
    graph = _graph()
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(n):] + [n]))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def _layer(m: str) -> int | None:
    if m == "minirt.kernels.local_size":
        return 0
    if m.startswith("minirt.kernels"):
        return 1
    if m.startswith("minirt.ops"):
        return 2
    if m.startswith("minirt.planner"):
        return 3
    return None


def test_layers_point_one_way():
    bad = [(m, n) for m, deps in _graph().items() for n in deps
           if _layer(m) is not None and _layer(n) is not None and _layer(n) > _layer(m)]
    assert not bad, f"imports against the direction local_size <- kernels <- ops <- planner: {bad}"


def test_planner_takes_no_op_internals():
    bad = [(m, n, names, line) for m, deps in _graph().items() if m.startswith("minirt.planner")
           for n, uses in deps.items() if n.startswith("minirt.ops.") for names, line in uses
           if any(x.startswith("_") for x in names)]
    assert not bad, f"planner modules importing op modules' private names: {bad}"


def test_no_import_order_excuses():
    bad = [f"{p}:{i}" for p in ROOT.rglob("*.py") for i, line in enumerate(p.read_text().splitlines(), 1)
           if "import" in line and ("not at import" in line or "imports the planner" in line)]
    assert not bad, f"deferred imports excused by import order: {bad}"


def test_only_kernel_families_set_local_sizes():
    """A lowering outside minirt/kernels/ leaves a dispatch's local size to its family's rule (minirt.kernels.rules)."""
    bad = []
    for path in [*(ROOT / "ops").rglob("*.py"), *(ROOT / "planner").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "dispatch" \
                    and any(k.arg == "local_size" for k in node.keywords):
                bad.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert not bad, f"local sizes set outside the kernel families: {bad}"
