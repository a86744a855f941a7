"""A sweep's searched names and a trial's values of them, as the summaries show them.

The parent run of a sweep holds the names its space samples (:data:`SEARCHED_TAG`);
:func:`searched_values` picks a trial's values of them out of its stored run config, under the
names ``raysearch sweep``'s table and ``selected:`` line, ``raysearch report``, ``raysearch
export`` and the progress lines show: every searched value and only those.

Imports :mod:`raysearch.config` when called, nothing else of the package: neither MLflow nor
pandas.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["SEARCHED_TAG", "searched_values", "shown_value"]

#: Tag of a sweep's parent run: the names its space samples, as a JSON list in the space's own
#: names (``["margin", "lr", "optimizer.weight_decay", "model.hidden"]``; ``method`` and
#: ``<method>.<param>`` in a conditional space).
SEARCHED_TAG = "raysearch.searched"


def shown_value(value: Any) -> str:
    """A value as the summaries show it (a float with 3 significant digits)."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _at(node: Any, path: tuple[str, ...]) -> Any:
    """The value at `path` in nested mappings, or None."""
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def searched_values(config: Any, searched: Iterable[str]) -> dict[str, Any]:
    """A trial's values of the searched names, under the names the summaries show.

    A loss parameter is shown under its own name (after the method: ``margin``; a conditional
    space's ``<method>.<param>`` only for the trial's method), every other value with its
    section: ``lr`` as ``optimizer.lr``, ``weight_decay`` as ``optimizer.weight_decay``,
    ``model.hidden`` as it is, a run field (``batch_size``) plain, a searched factory as its
    section (``model``). ``method`` itself is left out (it is shown before them).

    Args:
        config: the trial's stored run config (its ``raysearch.config`` tag, parsed), in
            sections or the flat layout of older sweeps.
        searched: the space's sampled names (:data:`SEARCHED_TAG`).

    Returns:
        ``{shown name: value}`` in the order of `searched`; a name the config lacks is left out.
    """
    from raysearch.config import SECTIONS
    from raysearch.config.flat import as_sections, flat_key_path

    try:
        cfg = as_sections(config) if isinstance(config, Mapping) else {}
    except ValueError:  # not a readable config: nothing to show
        cfg = {}
    loss = cfg.get("loss") if isinstance(cfg.get("loss"), Mapping) else {}
    params = loss.get("params") if isinstance(loss.get("params"), Mapping) else {}
    out: dict[str, Any] = {}
    for key in searched:
        head, _, tail = key.rpartition(".")
        if key == "method" or (head and head not in SECTIONS and head != loss.get("name")):
            continue
        try:
            path = None if head and head not in SECTIONS else flat_key_path(key)
        except ValueError:  # not a run-config key: a loss parameter
            path = None
        if path is None:
            name = tail if head else key
            if name in params:
                out[name] = params[name]
            continue
        value = _at(cfg, path)
        if value is not None:
            shown = path[0] if len(path) == 1 or path[-1] == "name" else f"{path[0]}.{path[-1]}"
            out[shown] = value
    return out
