"""The package's layers: a module imports only from its own layer's package or lower layers.

DESIGN.md section 3 and STYLE.md: the data path runs one way (api -> planning -> render ->
reconcilers -> the control loop -> the command line), and a lower layer never imports a
higher one, not even lazily inside a function (that is how the old planning <-> rules
cycle hid). This test reads every module's imports with ``ast`` (module level, function
level and ``TYPE_CHECKING`` blocks alike) and fails on an import that climbs, naming it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "sglang_pd_operator"
SOURCE = Path(__file__).resolve().parents[2] / "operator"

#: Rank of each top-level module or subpackage: an import must go to a lower rank (or stay in its own package).
RANK = {
    "api": 0,
    "catalog": 1, "heap": 1, "lws": 1, "liveness": 1, "workqueue": 1,
    "planning": 2,
    "render": 3,
    "kernelbuild": 4, "metrics": 4, "oracle": 4,
    "reconcilers": 5,
    "controller": 6, "leader": 6,
    "handlers": 7,
    "operator_main": 8, "devcluster": 8,
    "cli": 9,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([PACKAGE, *parts])


def _targets(path: Path, name: str | None = None) -> set[str]:
    """Every module of the package that ``path`` (the module ``name``, by default its place in the source tree) imports."""
    name = name or _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if not module.startswith(PACKAGE):
                continue
            for alias in node.names:  # `from .. import lws` imports the submodule lws
                sub = f"{module}.{alias.name}"
                stem = sub.removeprefix(PACKAGE + ".").split(".")
                is_module = (SOURCE.joinpath(*stem).with_suffix(".py").exists() or SOURCE.joinpath(*stem).is_dir())
                out.add(sub if is_module else module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(PACKAGE))
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_every_top_level_module_has_a_rank():
    found = {p.stem for p in SOURCE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    found |= {p.name for p in SOURCE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert found == set(RANK), f"give a new module its place in RANK (or drop a gone one): {found ^ set(RANK)}"


def test_no_module_imports_a_higher_layer():
    climbing = []
    for path in sorted(SOURCE.rglob("*.py")):
        source = _layer(_module_name(path))
        if source is None:
            continue
        for target in sorted(_targets(path)):
            layer = _layer(target)
            if layer is None or layer == source:
                continue
            if RANK[layer] >= RANK[source]:
                climbing.append(f"{path.relative_to(SOURCE.parent)} imports {target} ({source} {RANK[source]} -> {layer} {RANK[layer]})")
    assert not climbing, "imports that climb a layer:\n" + "\n".join(climbing)


def test_the_check_sees_a_climbing_import(tmp_path):
    """The resolver finds relative imports inside functions, as the layer test relies on."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..planning.problems import Problem\n    from .. import lws\n    from . import load\n")
    assert _targets(probe, f"{PACKAGE}.api.probe") == {f"{PACKAGE}.planning.problems", f"{PACKAGE}.lws", f"{PACKAGE}.api.load"}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_between_modules():
    graph = {_module_name(p): _targets(p) for p in SOURCE.rglob("*.py")}
    assert not _cycles(graph), f"modules that import each other: {_cycles(graph)}"


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
