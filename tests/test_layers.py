"""The package's layers: each module imports only from its own layer and the layers below.

The layers, lowest first (README "Layout"):

- base: the registry machinery and the typed run config;
- science: losses, post-hoc calibrators, metrics, shift, selection, statistics over seeds (plain
  PyTorch/NumPy);
- training: data, models, the loop and what it evaluates with, plots, the registries of every
  kind;
- tracking: MLflow (runs, the sweep callback, export, UI links);
- tune: Ray Tune (the sweep engine, the trainable, searchers), spaces, recipes, sweep settings;
- interface: the CLI, the Python API, the text of the reports, ``--dry-run``.

The graph is built from the source (``tests/test_import_graph.py``): every import anywhere in a
module counts, lazy ones too. Upward imports that exist today are listed in ``KNOWN_UPWARD`` with
the reason; the test fails on any other, and on a listed one that has gone (so the list shrinks
as the layers are cleaned up).
"""

from __future__ import annotations

from pathlib import Path

from test_import_graph import import_graph

ROOT = Path(__file__).resolve().parents[1] / "raysearch"
ORDER = ("base", "science", "training", "tracking", "tune", "interface")
LAYERS = {
    "base": ("registry", "config"),
    "science": ("losses", "calibration", "metrics", "posthoc", "reproduce", "shift",
                "selection", "repeats"),
    "training": ("training", "loop", "tasks", "data", "models", "optim", "registries", "dense",
                 "plots", "records"),
    "tracking": ("tracking", "ui", "runs"),
    "tune": ("sweep_engine", "prepare", "trainable", "searchers", "posthoc_sweep", "spaces",
             "recipes", "storage"),
    "interface": ("cli", "reports", "api", "plan"),
}
#: Modules of a package that belong to another layer than the package's first name says.
OVERRIDES = {"raysearch.config.sweep": "tune"}
#: (importing module's top name, imported module's top name): why it is allowed for now.
KNOWN_UPWARD = {
    ("config", "config"): "raysearch.config re-exports SweepSettings (config.sweep, tune layer)",
}


def layer_of(module: str) -> str | None:
    """The layer of a ``raysearch.<name>...`` module (None for the package itself)."""
    for prefix, layer in OVERRIDES.items():
        if module == prefix or module.startswith(prefix + "."):
            return layer
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
    # by hand: loop (training) importing sweep_engine (tune) is one upward import; data
    # (training) importing metrics (science) goes down and is fine
    graph = {"raysearch.loop": {"raysearch.sweep_engine": 3, "raysearch.metrics": 4},
             "raysearch.data.x": {"raysearch.metrics.binned": 1}}
    assert upward_imports(graph) == {
        ("loop", "sweep_engine"): ["raysearch.loop -> raysearch.sweep_engine (line 3)"]}
