"""raysearch: Ray-distributed hyperparameter search for network calibration.

The Python API (see docs/python-api.md)::

    import raysearch

    result = raysearch.sweep("acls", num_samples=8)            # a SweepResult
    result.trials, result.front, result.selected, result.parent_run_id
    raysearch.train("best.yaml")                               # retrain an exported config
    raysearch.export(result.name, "best.yaml")
    raysearch.calibrate("my_logits.npz", methods=("ts", "dirichlet"))  # post-hoc on a file

Names are imported on first use, so ``import raysearch`` stays cheap (no torch, Ray or MLflow).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: Public names -> the module that defines them (imported on first access).
_LAZY = {
    "DatasetSplits": "raysearch.training.data.splits",
    "DatasetError": "raysearch.training.data.splits",
    "RunConfig": "raysearch.config",
    "SweepSettings": "raysearch.tune.settings",
    "SweepResult": "raysearch.tune.engine",
    "NoTrialCompletedError": "raysearch.tune.outcome",
    "sweep": "raysearch.api",
    "train": "raysearch.api",
    "export": "raysearch.api",
    "searcher": "raysearch.api",
    "calibrate": "raysearch.api",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'raysearch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
