"""The package's layers: each module imports only from its own layer and the layers below.

The layers, lowest first, are folders of ``raysearch/`` (README "Layout"):

- base: ``registry.py`` (the registry machinery) and ``config/`` (the typed run config);
- science: ``losses/``, ``calibration/`` (post-hoc calibrators, their evaluation, reproduce),
  ``metrics/`` (binned and binless metrics, selection, statistics over seeds, shift); plain
  PyTorch/NumPy;
- training: ``training/``: data, models, the loop and what it evaluates with, plots, the
  registries of every kind;
- tracking: ``tracking/``: MLflow (runs, the sweep callback, export, reports, the UI launcher);
- tune: ``tune/``: Ray Tune and Optuna (spaces, recipes, settings, searchers, the trainable, the
  sweep engine);
- interface: ``cli/`` (the command line, ``--dry-run``) and ``api.py`` (the Python API).

The graph is built from the source (``tests/test_import_graph.py``): every import anywhere in a
module counts, lazy ones too. Upward imports that must exist for a while go in ``KNOWN_UPWARD``
with the reason; the test fails on any other, and on a listed one that has gone.
"""

from __future__ import annotations

import ast
from pathlib import Path

from test_import_graph import import_graph

ROOT = Path(__file__).resolve().parents[1] / "raysearch"
ORDER = ("base", "science", "training", "tracking", "tune", "interface")
LAYERS = {
    "base": ("registry", "config"),
    "science": ("losses", "calibration", "metrics"),
    "training": ("training",),
    "tracking": ("tracking",),
    "tune": ("tune",),
    "interface": ("cli", "api"),
}
#: (importing module's top name, imported module's top name): why it is allowed for now.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> str | None:
    """The layer of a ``raysearch.<name>...`` module (None for the package itself)."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for layer, names in LAYERS.items():
        if parts[1] in names:
            return layer
    raise AssertionError(f"{module} is in no layer: add its name to LAYERS")


def upward_imports(graph: dict[str, dict[str, int]]) -> dict[tuple[str, str], list[str]]:
    """``{(top name, imported top name): ["a -> b (line n)", ...]}`` of every upward import."""
    found: dict[tuple[str, str], list[str]] = {}
    for module, imports in graph.items():
        low = layer_of(module)
        for target, line in imports.items():
            high = layer_of(target)
            if low is None or high is None or ORDER.index(high) <= ORDER.index(low):
                continue
            key = (module.split(".")[1], target.split(".")[1])
            found.setdefault(key, []).append(f"{module} -> {target} (line {line})")
    return found


def test_every_module_is_in_a_layer():
    for module in import_graph(ROOT, "raysearch"):
        layer_of(module)


def test_imports_go_down_the_layers():
    found = upward_imports(import_graph(ROOT, "raysearch"))
    new = {k: v for k, v in found.items() if k not in KNOWN_UPWARD}
    assert not new, "upward imports: " + "; ".join(e for v in new.values() for e in v)
    gone = set(KNOWN_UPWARD) - set(found)
    assert not gone, f"no longer upward, drop from KNOWN_UPWARD: {sorted(gone)}"


def test_the_checker_finds_an_upward_import():
    # by hand: the loop (training) importing the engine (tune) is one upward import; data
    # (training) importing metrics (science) goes down and is fine
    graph = {"raysearch.training.loop": {"raysearch.tune.engine": 3, "raysearch.metrics": 4},
             "raysearch.training.data.x": {"raysearch.metrics.binned": 1}}
    assert upward_imports(graph) == {
        ("training", "tune"): ["raysearch.training.loop -> raysearch.tune.engine (line 3)"]}


def test_the_top_of_the_package_is_the_layers():
    # a newcomer sees the architecture from the folders: one package per layer, and at the top
    # only the package's face (__init__), the base registry and the Python API
    modules = sorted(p.name for p in ROOT.glob("*.py"))
    assert modules == ["__init__.py", "api.py", "registry.py"]
    folders = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert folders == {n for names in LAYERS.values() for n in names} - {"api", "registry"}


def test_every_layer_package_says_what_it_holds_and_may_import():
    for name in ("config", "losses", "calibration", "metrics", "training", "tracking", "tune",
                 "cli"):
        source = (ROOT / name / "__init__.py").read_text()
        doc = ast.get_docstring(ast.parse(source)) or ""
        assert len(doc) > 200, f"raysearch/{name}/__init__.py: no docstring"
        assert "import" in doc, f"raysearch/{name}/__init__.py does not say what it may import"


def test_mlflow_is_imported_only_under_tracking():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n.split(".")[0] == "mlflow" for n in names):
                found.append(str(path.relative_to(ROOT)))
    assert found, "the checker found no MLflow import at all"
    assert {f.split("/")[0] for f in found} == {"tracking"}, sorted(set(found))
