"""The package is a house in layers: no module of ``raysearch`` imports itself round a circle.

The import graph is read from the source with ``ast``, not from ``sys.modules``: every
``import`` and ``from ... import`` anywhere in a module counts (at the top, inside a function, under
``if TYPE_CHECKING:``), since a lazy import only postpones the circle. Relative imports are
resolved against the importing module's package; ``from pkg import name`` is an import of
``pkg.name`` when that is a module of the package, else of ``pkg``. Only modules of the package
are nodes; imports of other distributions are ignored. Strings handed to
``importlib.import_module`` (the lazy ``__getattr__`` of ``raysearch/__init__.py`` and the
dataset/model registries' import strings) are not imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import raysearch

ROOT = Path(raysearch.__file__).resolve().parent

#: Import cycles the package is allowed to keep, each as the frozenset of the modules of one
#: strongly connected component of the import graph. Empty: the last two,
#: calibration.base <-> calibration.objectives and data.cub <-> data.objectness, were removed by
#: moving the shared helpers to the leaf modules calibration._checks and data._crops.
ALLOWED_CYCLES: set[frozenset[str]] = set()


def _modules(root: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file of the package under ``root``."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((package, *parts))] = path
    return modules


def import_graph(root: Path, package: str) -> dict[str, dict[str, int]]:
    """``{module: {imported module of the package: line of its first import}}``."""
    modules = _modules(root, package)

    def known(name: str) -> str | None:  # the module itself, else its closest package
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[: len(here.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] != package:
                    continue
                found = known(target)
                if found is not None and found != module:
                    edges.setdefault(found, node.lineno)
        graph[module] = dict(sorted(edges.items(), key=lambda item: item[1]))
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> set[frozenset[str]]:
    """Modules of every strongly connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: set[frozenset[str]] = set()
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.add(frozenset(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return cycles


def describe(cycle: frozenset[str], graph: dict[str, dict[str, int]]) -> str:
    """One shortest circle through the component's first module, with the import lines."""
    start = min(cycle)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for child in graph[node]:
            if child == start:
                path = [*paths[node], start]
                pairs = zip(path[:-1], path[1:], strict=True)
                hops = [f"{a} -> {b} (line {graph[a][b]})" for a, b in pairs]
                return f"{{{', '.join(sorted(cycle))}}}: " + "; ".join(hops)
            if child in cycle and child not in paths:
                paths[child] = [*paths[node], child]
                frontier.append(child)
    raise AssertionError(f"{sorted(cycle)} is not a cycle")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_package_has_no_import_cycle_outside_the_allow_list():
    graph = import_graph(ROOT, "raysearch")
    cycles = import_cycles(graph)
    new = "\n".join(describe(cycle, graph) for cycle in sorted(cycles - ALLOWED_CYCLES, key=min))
    gone = [sorted(cycle) for cycle in ALLOWED_CYCLES - cycles]
    assert not new, f"import cycles in raysearch:\n{new}"
    assert not gone, f"allowed import cycles that no longer exist (drop them): {gone}"


def test_the_graph_counts_lazy_and_type_checking_imports(tmp_path):
    # Circle 1: a -> b (relative, top level), b -> sub.c (relative, inside a function),
    # sub.c -> a (``from .. import a``: level 2 from pkg.sub is pkg, and pkg.a is a module).
    # Circle 2: d -> e (absolute, ``from pkg.sub import c`` too), e -> d (under TYPE_CHECKING).
    # Not edges: ``from pkg import VALUE`` is an import of pkg itself (VALUE is no module), and
    # the string given to importlib.import_module in pkg/__init__.py (else pkg <-> d circles).
    _write(tmp_path / "pkg", {
        "__init__.py": "import importlib\nVALUE = 1\nd = importlib.import_module('pkg.d')\n",
        "a.py": "import os\nfrom . import b\n",
        "b.py": "def f():\n    from .sub.c import thing\n    return thing\n",
        "sub/__init__.py": "",
        "sub/c.py": "from .. import a\nthing = 1\n",
        "d.py": "from pkg import VALUE\nfrom pkg.sub import c as cc\nimport pkg.e\n",
        "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import X\n",
    })
    graph = import_graph(tmp_path / "pkg", "pkg")
    assert graph == {
        "pkg": {},
        "pkg.a": {"pkg.b": 2},
        "pkg.b": {"pkg.sub.c": 2},
        "pkg.d": {"pkg": 1, "pkg.sub.c": 2, "pkg.e": 3},
        "pkg.e": {"pkg.d": 3},
        "pkg.sub": {},
        "pkg.sub.c": {"pkg.a": 1},
    }
    cycles = import_cycles(graph)
    assert cycles == {frozenset({"pkg.a", "pkg.b", "pkg.sub.c"}), frozenset({"pkg.d", "pkg.e"})}
    assert describe(frozenset({"pkg.d", "pkg.e"}), graph) == (
        "{pkg.d, pkg.e}: pkg.d -> pkg.e (line 3); pkg.e -> pkg.d (line 3)"
    )


def test_the_shared_helpers_sit_in_leaf_modules():
    graph = import_graph(ROOT, "raysearch")
    # The lazy imports that used to close the two circles are still seen ...
    assert "raysearch.calibration.objectives" in graph["raysearch.calibration.base"]
    assert "raysearch.training.data.cub_objectness" in graph["raysearch.training.data.objectness"]
    # ... but the way back now goes through leaves that import nothing of the package.
    assert "raysearch.calibration.base" not in graph["raysearch.calibration.objectives"]
    cub_objectness = graph["raysearch.training.data.cub_objectness"]
    assert "raysearch.training.data.objectness" not in cub_objectness
    assert graph["raysearch.calibration._checks"] == {}
    assert graph["raysearch.training.data._crops"] == {}
    assert graph["raysearch"] == {}  # the lazy __getattr__ names are no imports
