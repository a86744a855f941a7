"""The public names import: every `raysearch.*` name docs/python-api.md gives, and every name in
the `__all__` of raysearch and of its public science and config packages.

The names of the page are parsed out of it (backticks, tables and code blocks alike), so a name
the page adds is checked without touching this file; MLflow tag names, which look like dotted
Python names (tag `raysearch.tune.trainable`), are left out by the word "tag" before them.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "python-api.md"
NAME = re.compile(r"\braysearch(?:\.[A-Za-z_]\w*)+")
TAG = re.compile(r"\btags?\s+`$")

#: The entry points of the page's opening table: the page must keep naming them.
TABLE = ["raysearch.sweep", "raysearch.train", "raysearch.export", "raysearch.calibrate",
         "raysearch.RunConfig", "raysearch.searcher", "raysearch.metrics.calibration_report",
         "raysearch.tracking.SweepCallback", "raysearch.metrics.selection.select_best"]

#: The packages whose `__all__` is public.
PACKAGES = ["raysearch", "raysearch.losses", "raysearch.calibration", "raysearch.metrics",
            "raysearch.config"]


def page_names(text: str) -> list[str]:
    """The dotted `raysearch.*` names of `text`, sorted, without MLflow tag names."""
    return sorted({m.group(0) for m in NAME.finditer(text)
                   if not TAG.search(text[max(0, m.start() - 8):m.start()])})


def resolve(dotted: str) -> object:
    """The object a dotted name denotes: the longest importable module, then attributes.

    Raises:
        ImportError: if no prefix of the name imports.
        AttributeError: if a part after the module is missing.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                raise  # the module exists but imports something missing: a real failure
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"no module of {dotted!r} imports")


PAGE_NAMES = page_names(PAGE.read_text())


def test_the_page_names_its_entry_points_and_no_tag_is_taken_for_a_name():
    assert set(TABLE) <= set(PAGE_NAMES)
    assert "raysearch.tune.trainable" not in page_names("tag `raysearch.tune.trainable = own`")
    assert page_names("`raysearch.sweep(space)` and `raysearch.metrics.ece`") == [
        "raysearch.metrics.ece", "raysearch.sweep"]


@pytest.mark.parametrize("dotted", PAGE_NAMES)
def test_every_name_of_python_api_md_imports(dotted):
    assert resolve(dotted) is not None


@pytest.mark.parametrize("package", PACKAGES)
def test_every_name_in_all_imports(package):
    module = importlib.import_module(package)
    names = module.__all__
    assert names, f"{package}.__all__ is empty"
    assert len(set(names)) == len(names), f"{package}.__all__ lists a name twice"
    missing = [n for n in names if not hasattr(module, n)]
    assert missing == [], f"{package}.__all__ names what it does not have: {missing}"


def test_resolve_fails_on_a_missing_name():
    with pytest.raises(AttributeError):
        resolve("raysearch.metrics.no_such_metric")
    with pytest.raises(ImportError):
        resolve("raysearchx.nothing")
