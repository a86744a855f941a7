"""How a trial is shown: its MLflow params and config, its short name, its error in one line.

:func:`describe` gives a trial's config JSON (the ``raysearch.config`` tag), MLflow params and
method name; :func:`short_name` and :func:`short_value` shorten names and values for run names
and progress lines, :func:`headline` is a trial's method and searched values for its progress
line; :func:`trial_error` reads a failed trial's error as one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raysearch.tracking.client import run_params
from raysearch.tracking.reconcile import error_line
from raysearch.tracking.searched import searched_values
from raysearch.training.records import SEED_INDEX_KEY

__all__ = ["describe", "short_name", "short_value", "trial_error"]


def describe(configs: Any, config: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """(config JSON, MLflow params, short method name) of a sweep's trial config.

    The config is resolved by the sweep's `configs` (``configs.resolve(config) -> RunConfig``:
    :class:`raysearch.tune.spaces.TrialConfigs`); a config that cannot be resolved (the trial
    will fail too) gets an ``error`` param.
    """
    try:
        cfg = configs.resolve(config)
    except ValueError as exc:
        return "{}", {"error": str(exc)[:400]}, "?"
    return json.dumps(cfg.to_dict()), run_params(cfg), short_name(cfg.loss.name)


def short_name(name: str) -> str:
    """A name for run names and progress lines: an import string's attribute (``MyLoss``)."""
    return name.rsplit(":", 1)[-1].rsplit(".", 1)[-1] if ":" in name else name


def short_value(value: Any) -> str:
    """A float to 3 significant digits, anything else as text."""
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)



def headline(configs: Any, config: dict[str, Any], repeats: int = 1) -> str:
    """The method and hyperparameters of a trial, for its progress line.

    Args:
        configs: resolves a trial's config into its run config (``configs.resolve``), as the
            sweep's callback's; when it (or its ``space``) has ``searched()``, only the
            searched values are shown.
        config: the trial's Tune config.
        repeats: seeds per configuration: with more than one, the seed is shown.

    Returns:
        ``"<method> k=v ..."``, or ``"?"`` for a config that does not resolve.
    """
    try:
        cfg = configs.resolve(config)
    except ValueError:
        return "?"
    space = getattr(configs, "space", configs)
    if hasattr(space, "searched"):  # the values the space searches, and only those
        shown = searched_values(cfg.to_dict(), space.searched())
    else:
        shown = {**cfg.loss.params, "lr": cfg.optimizer.lr}
    hp = " ".join(f"{k}={short_value(v)}" for k, v in shown.items() if k != "variant")
    head = f"{short_name(cfg.loss.name):<6s} {hp}"
    if repeats > 1 and SEED_INDEX_KEY in config:
        head += f" seed {cfg.seed}"
    return head

def trial_error(trial: Any) -> str:
    """A failed Tune trial's error as one line (from its error file, else its message)."""
    path = getattr(trial, "error_file", None)
    if path and Path(path).is_file():
        return error_line(Path(path).read_text())
    return str(getattr(trial, "error_msg", None) or "unknown error")
