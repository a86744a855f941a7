"""Single runs outside a sweep: one RunConfig trained here, one post-hoc calibration logged.

:func:`train_and_log` trains a RunConfig in this process and logs it as an MLflow run (what
``raysearch train`` does); :func:`log_calibration_run` logs a post-hoc calibration of stored
outputs as one finished run (``raysearch calibrate``).

Imports only :mod:`raysearch.tracking.client` of the package's tracking modules; no module of
the package imports it but :mod:`raysearch.tracking`, which re-exports it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from raysearch.config import RunConfig
from raysearch.tracking.client import (
    _numeric_metrics,
    ensure_experiment,
    get_client,
    log_metrics,
    log_params,
    log_reliability,
    run_params,
)
from raysearch.tracking.runs import COMPLETE_TAG, CONFIG_TAG, DEFAULT_EXPERIMENT


def train_and_log(cfg: RunConfig, *, tracking_uri: str | None = None,
                  experiment: str = DEFAULT_EXPERIMENT, run_name: str | None = None,
                  tags: dict[str, str] | None = None,
                  progress: Callable[[str], None] | None = None, device: str | None = None,
                  precision: str = "auto",
                  components: dict[str, dict[str, Any]] | None = None,
                  metrics: Any = ()) -> tuple[str, dict[str, float]]:
    """Train one RunConfig in this process (one torch thread) and log it as an MLflow run.

    `device` defaults to ``cuda`` when a GPU is visible, else ``cpu``; `precision` as in
    :func:`raysearch.training.run.fit`. The data, the model, the loss and the optimizer are built
    before the run is created: a bad name or argument writes nothing.

    Params, per-epoch ``train_*``/``val_*`` metrics (``step=epoch``), the test metrics and a
    reliability diagram are logged; the run ends FINISHED, or FAILED if training raises.

    Args:
        cfg: the run.
        tracking_uri: MLflow store (default as for a sweep).
        experiment: MLflow experiment.
        run_name: the run's name.
        tags: more tags of the run.
        progress: called with one line per epoch.
        device: ``cpu``, ``cuda`` or ``cuda:N``.
        precision: ``auto``, ``bf16`` or ``fp32``.
        components: objects given through the Python API by label (as
            :func:`raysearch.training.run.fit`).
        metrics: a user's metric functions: import strings, callables, or a comma-separated
            string of import strings; logged as ``val_<fn>``/``test_<fn>``.

    Returns:
        (run id, final metrics).

    Raises:
        ValueError: if the tracking URI is unreachable or the config is invalid (unknown name,
            a keyword a factory does not take, a factory that raises).
        raysearch.training.run.DivergedError: if the loss becomes NaN (the run is marked FAILED).
    """
    import torch

    from raysearch.training.run import fit

    components = components or {}
    data, task, metric_fns = _checked_parts(cfg, components, metrics)  # before MLflow
    client, uri = get_client(tracking_uri)
    experiment_id = ensure_experiment(client, experiment, uri)
    run = client.create_run(experiment_id, run_name=run_name,
                            tags={CONFIG_TAG: json.dumps(cfg.to_dict()), **(tags or {})})
    run_id = run.info.run_id
    log_params(client, run_id, run_params(cfg))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a trial: same numerics, reproducible results
    on_epoch = _epoch_logger(client, run_id, cfg, f"val_{task.primary_metric}", progress)
    try:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        result = fit(cfg, on_epoch=on_epoch, device=device, precision=precision, data=data,
                     components=components, metrics=metric_fns)
    except BaseException as exc:
        client.set_tag(run_id, "raysearch.error", str(exc)[:4000])
        client.set_terminated(run_id, "FAILED")
        raise
    finally:
        torch.set_num_threads(threads)
    log_metrics(client, run_id, _numeric_metrics(result.metrics), cfg.epochs)
    bins = task.test_bins(result, cfg.ece_bins)
    log_reliability(client, run_id, {"edges": bins.edges, "counts": bins.counts,
                                     "accuracy": bins.accuracy, "confidence": bins.confidence},
                    f"{run_name or run_id}  test ECE {100 * result.metrics['test_ece']:.2f}%")
    client.set_tag(run_id, COMPLETE_TAG, "true")
    client.set_terminated(run_id, "FINISHED")
    return run_id, result.metrics


def _checked_parts(cfg: RunConfig, components: dict[str, dict[str, Any]], metrics: Any
                   ) -> tuple[Any, Any, dict[str, Any]]:
    """The run's data, its task and the user's metric functions, after checking the config.

    The model (on the meta device), the loss and the optimizer are built once to check them:
    a bad name or argument raises here, before anything is written to MLflow.
    """
    from raysearch.training.optim import check_optimizer
    from raysearch.training.registries import metric_functions
    from raysearch.training.run_parts import build_run_loss, check_run_model, load_run_data
    from raysearch.training.tasks import task_for

    if isinstance(metrics, str):
        metrics = [m for m in metrics.split(",") if m]
    metric_fns = metric_functions(metrics or (), components)
    data = load_run_data(cfg, components=components)
    task = task_for(data)
    check_run_model(cfg, data, components=components)
    build_run_loss(cfg, data, components=components)
    check_optimizer(cfg.optimizer)
    return data, task, metric_fns


def _epoch_logger(client: MlflowClient, run_id: str, cfg: RunConfig, accuracy: str,
                  progress: Callable[[str], None] | None
                  ) -> Callable[[int, dict[str, float], dict | None], None]:
    """The ``on_epoch`` of :func:`train_and_log`: log the epoch's metrics, then one line.

    `accuracy` is the task's primary validation metric (``val_accuracy``, or ``val_miou`` for
    segmentation, shown beside the pixel accuracy).
    """

    def on_epoch(epoch: int, values: dict[str, float], state: dict | None) -> None:
        log_metrics(client, run_id, _numeric_metrics(values), epoch)
        if progress is None:
            return
        if accuracy != "val_accuracy":
            progress(f"epoch {epoch}/{cfg.epochs}: {accuracy} {100 * values[accuracy]:.2f}% "
                     f"pixel acc {100 * values['val_accuracy']:.2f}% "
                     f"ECE {100 * values['val_ece']:.2f}%")
        else:
            progress(f"epoch {epoch}/{cfg.epochs}: val acc {100 * values['val_accuracy']:.2f}%"
                     f" ECE {100 * values['val_ece']:.2f}%")

    return on_epoch


def log_calibration_run(client: MlflowClient, uri: str, experiment: str, *, run_name: str,
                        source: str, params: dict[str, Any], metrics: dict[str, float],
                        folder: str | Path) -> str:
    """Log a post-hoc calibration of stored outputs as one finished MLflow run.

    Args:
        client: a client on the store.
        uri: the store's resolved tracking URI (where a new experiment keeps its artifacts).
        experiment: the experiment, created if missing.
        run_name: the run's name (``calibrate-<file stem>``).
        source: the calibrated file or trial run id (tag ``raysearch.source``).
        params: the calibration's settings, logged as params.
        metrics: its metrics (as
            :meth:`raysearch.calibration.posthoc.CalibrationReport.as_metrics`),
            logged at step 0.
        folder: a folder whose files (the table, the reliability diagrams) become artifacts.

    Returns:
        The run id.
    """
    exp_id = ensure_experiment(client, experiment, uri)
    run = client.create_run(exp_id, run_name=run_name, tags={"raysearch.source": source})
    log_params(client, run.info.run_id, params)
    log_metrics(client, run.info.run_id, metrics, step=0)
    for item in sorted(Path(folder).iterdir()):
        client.log_artifact(run.info.run_id, str(item))
    client.set_terminated(run.info.run_id, "FINISHED")
    return run.info.run_id
