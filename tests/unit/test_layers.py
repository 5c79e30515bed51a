"""The package's layers: a module imports only from its own layer's package or lower layers.

DESIGN.md section 3 and STYLE.md: the data path runs one way (api -> planning -> render ->
reconcilers -> the process runtime -> the command line), and a lower layer never imports a
higher one, not even lazily inside a function (that is how the old planning <-> rules
cycle hid). This test reads every module's imports with ``ast`` (module level, function
level and ``TYPE_CHECKING`` blocks alike) and fails on an import that climbs, naming it.

The rooms: ``runtime/`` is the process (control loop, work queue, object cache, leader
election, liveness, heap, kopf glue, entry point) and ranks above the reconcilers, below
the command line. Three of its modules are *floors* ranked on their own, lower, because
lower rooms use them: the object cache (which the reconcilers' API client reads through),
the liveness heartbeats (which a reconcile beats and the metrics server answers
``/healthz`` from) and the work queue's stats (which the metrics read); a floor never
imports the rest of ``runtime/``. The dev tools (``devtools/``, import package
``sglang_pd_operator_dev``) are outside: they may use the operator, the operator never
names them.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "sglang_pd_operator"
ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "operator"
DEV_PACKAGE = "sglang_pd_operator_dev"
DEV_SOURCE = ROOT / "devtools" / DEV_PACKAGE

#: Rank of each room (a top-level module or subpackage) and of each floor (a dotted module
#: inside a room, ranked apart from it): an import must go to a lower rank (or stay in its room).
RANK = {
    "api": 0,
    "catalog": 1, "runtime.liveness": 1, "runtime.workqueue": 1,
    "planning": 2,
    "render": 3,
    "kernelbuild": 4, "metrics": 4, "oracle": 4,
    "runtime.cache": 5,
    "reconcilers": 6,
    "runtime": 7,
    "cli": 8,
}
#: What may lie loose at the package root (every other module lives in a room).
ROOT_MODULES = {"__init__", "catalog", "cli"}


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
    """The RANK key of ``module``: its floor when it is one, else its room; None for the package itself."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANK:
            return ".".join(parts[:n])
    return parts[0] if parts else None


def test_every_room_and_floor_has_a_rank():
    found = {p.stem for p in SOURCE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    found |= {p.name for p in SOURCE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    rooms = {k for k in RANK if "." not in k}
    assert found == rooms, f"give a new module its place in RANK (or drop a gone one): {found ^ rooms}"
    floors = [k for k in RANK if "." in k]
    missing = [f for f in floors if not SOURCE.joinpath(*f.split(".")).with_suffix(".py").is_file()]
    assert not missing, f"floors in RANK that are no module: {missing}"
    assert all(RANK[f] < RANK[f.split(".")[0]] for f in floors), "a floor ranks below its room"


def test_nothing_loose_at_the_package_root():
    loose = {p.stem for p in SOURCE.glob("*.py")} - ROOT_MODULES
    assert not loose, f"modules loose at the package root: {sorted(loose)}; give each a room (runtime/, api/ ...)"


def test_the_runtime_ranks_above_the_reconcilers_and_below_the_command_line():
    assert RANK["reconcilers"] < RANK["runtime"] < RANK["cli"]


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
    probe.write_text("def f():\n    from ..planning.problems import Problem\n    from .. import cli\n    from . import load\n"
                     "    from ..runtime import cache\n")
    assert _targets(probe, f"{PACKAGE}.api.probe") == {f"{PACKAGE}.planning.problems", f"{PACKAGE}.cli", f"{PACKAGE}.api.load",
                                                       f"{PACKAGE}.runtime.cache"}
    assert [_layer(m) for m in sorted(_targets(probe, f"{PACKAGE}.api.probe"))] == ["api", "cli", "planning", "runtime.cache"]
    assert _layer(f"{PACKAGE}.runtime.controller") == "runtime" and _layer(f"{PACKAGE}.runtime") == "runtime"


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


def _imports_of(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (relative imports left out), at any level."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_the_operator_never_names_the_dev_tools():
    """The dev package stays outside: no import of it, not even a string that could load it (importlib, ``-m``)."""
    assert DEV_SOURCE.is_dir(), DEV_SOURCE
    found = []
    for path in sorted(SOURCE.rglob("*")):
        if path.is_file() and path.suffix in (".py", ".yaml", ".json", ".txt"):
            text = path.read_text()
            if DEV_PACKAGE in text or (path.suffix == ".py" and any(m.split(".")[0] == DEV_PACKAGE for m in _imports_of(path))):
                found.append(str(path.relative_to(ROOT)))
    for path in sorted((ROOT / "kernels").rglob("*.yaml")):  # the catalog ships in the package too
        if DEV_PACKAGE in path.read_text():
            found.append(str(path.relative_to(ROOT)))
    assert not found, f"the operator names the dev tools ({DEV_PACKAGE}) in: {found}"

