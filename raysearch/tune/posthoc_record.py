"""The MLflow record of a post-hoc sweep, written by the driver after the trials.

A parent run tagged ``raysearch.sweep`` = name and ``raysearch.kind`` = ``posthoc`` with the
sweep's params and the uncalibrated metrics (:func:`open_parent`); one child run per trial with
the calibrator's settings as params and its ``holdout_*``/``eval_*`` metrics, FAILED for a
combination the calibrator rejected (:func:`log_trials`); then the parent's artifacts
``trials.parquet`` and ``best_posthoc.yaml``, the winner's ``best_*`` metrics and its run id
(:func:`finish_parent`). :mod:`raysearch.tune.posthoc_sweep` calls them.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from raysearch import tracking
from raysearch.tune.posthoc_space import PARAM_LOSS, PosthocSpace
from raysearch.tune.spaces import one_line

__all__ = ["FAILED", "KIND_TAG", "config_text", "finish_parent", "log_trials", "open_parent"]

#: Result key holding the error message of a combination the calibrator rejected.
FAILED = "error"
#: Tag marking a post-hoc sweep's runs (``posthoc``).
KIND_TAG = "raysearch.kind"

def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and k.startswith(("holdout_", "eval_", "fit_"))
    }


def open_parent(
    client: Any,
    experiment_id: str,
    name: str,
    space: PosthocSpace,
    params: dict[str, Any],
    uncalibrated: dict[str, float],
) -> str:
    """Create the sweep's parent run with its params and uncalibrated metrics; its run id."""
    parent_id = client.create_run(
        experiment_id,
        run_name=name,
        tags={
            tracking.SWEEP_TAG: name,
            KIND_TAG: "posthoc",
            "raysearch.space": space.name,
        },
    ).info.run_id
    tracking.log_params(client, parent_id, params)
    tracking.log_metrics(
        client, parent_id, {f"uncalibrated_{k}": v for k, v in uncalibrated.items()}, step=0
    )
    return parent_id


def config_text(kwargs: dict[str, Any]) -> str:
    """``fit_calibrator`` keywords as one readable line: ``name=ts, loss=nll, ...``."""
    return ", ".join(f"{k}={v}" for k, v in kwargs.items())


def log_trials(
    client: Any,
    experiment_id: str,
    parent_id: str,
    name: str,
    space: PosthocSpace,
    grid: Any,
    say: Callable[[str], None],
) -> pd.DataFrame:
    """One child run per trial of the ResultGrid; returns the trials table (trial order)."""
    results = sorted(grid, key=lambda r: (r.metrics or {}).get("trial_id") or r.path or "")
    rows = []
    for index, result in enumerate(results):
        row = _log_trial(client, experiment_id, parent_id, name, space, index, result)
        rows.append(row)
        shown = config_text({k: row[k] for k in _PARAM_COLUMNS if k in row})
        if row["error"]:
            say(f"trial {index} ({shown}) failed: {row['error']}")
        else:
            say(
                f"trial {index} ({shown}): held-out acc {100 * row['holdout_accuracy']:.2f}% "
                f"ECE {100 * row['holdout_ece']:.2f}% NLL {row['holdout_nll']:.4f}"
            )
    frame = pd.DataFrame(rows)
    for column in ("holdout_accuracy", "holdout_ece", "holdout_nll", "epsilon", "gamma"):
        if column not in frame:
            frame[column] = np.nan
    return frame


#: The trial config's keys that are calibrator settings (and the table's param columns).
_PARAM_COLUMNS = ("calibrator", "loss", "classwise_scaling", "epsilon", "gamma")


def _log_trial(client: Any, experiment_id: str, parent_id: str, name: str, space: PosthocSpace,
               index: int, result: Any) -> dict[str, Any]:
    """Record one trial's result as a child run; its row of the trials table."""
    metrics = result.metrics or {}
    config = {k: v for k, v in (result.config or {}).items() if k in _PARAM_COLUMNS}
    params = space.fit_arguments(config) if "calibrator" in config else {}
    params = {("calibrator" if k == "name" else k): v for k, v in params.items()}
    error = metrics.get(FAILED)
    if result.error is not None:
        error = f"{type(result.error).__name__}: {one_line(result.error)}"
    trial_id = metrics.get("trial_id", str(index))
    run = client.create_run(
        experiment_id,
        run_name=f"{name}-{index:03d}",
        tags={
            tracking.PARENT_TAG: parent_id,
            tracking.SWEEP_TAG: name,
            KIND_TAG: "posthoc",
            tracking.TRIAL_TAG: trial_id,
        },
    )
    run_id = run.info.run_id
    tracking.log_params(client, run_id, params)
    values = _finite(metrics)
    if values:
        tracking.log_metrics(client, run_id, values, step=0)
    if error:
        client.set_tag(run_id, "raysearch.error", error[:5000])
    client.set_terminated(run_id, "FAILED" if error else "FINISHED")
    return {"trial": index, "trial_id": trial_id, "run_id": run_id,
            "status": "failed" if error else "ok", "error": error, **params, **values}


def finish_parent(
    client: Any,
    parent_id: str,
    frame: pd.DataFrame,
    selected: pd.Series | None,
    best: dict[str, Any] | None,
    name: str,
    rule: str,
    split: str,
) -> None:
    """Attach ``trials.parquet`` and ``best_posthoc.yaml`` to the parent run and end it.

    With a winner (`selected`, its ``fit_calibrator`` keywords `best`) the parent also gets its
    ``best_*`` metrics and the tag ``raysearch.selected_run``; ``raysearch.trials_ok`` counts
    the trials that ran.
    """
    with tempfile.TemporaryDirectory() as d:
        tracking.write_parquet(frame, Path(d) / "trials.parquet")
        client.log_artifact(parent_id, str(Path(d) / "trials.parquet"))
        if selected is not None and best is not None:
            metrics = _finite(selected.to_dict())
            document = {
                "calibrator": best["name"],
                "loss": best["loss"],
                "classwise_scaling": best["classwise_scaling"],
                "params": {k: float(v) for k, v in best.items() if k in PARAM_LOSS},
                "sweep": name,
                "trial": int(selected["trial"]),
                "run_id": selected["run_id"],
                "selection": rule,
                "split": split,
                "metrics": dict(sorted(metrics.items())),
            }
            (Path(d) / "best_posthoc.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
            client.log_artifact(parent_id, str(Path(d) / "best_posthoc.yaml"))
            tracking.log_metrics(
                client, parent_id, {f"best_{k}": v for k, v in metrics.items()}, step=0
            )
            client.set_tag(parent_id, "raysearch.selected_run", selected["run_id"])
    client.set_tag(
        parent_id,
        "raysearch.trials_ok",
        str(int((frame.get("status") == "ok").sum()) if not frame.empty else 0),
    )
    client.set_terminated(parent_id, "FINISHED")
