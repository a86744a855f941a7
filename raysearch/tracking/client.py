"""The MLflow client of a store and the writes every run makes: params, metrics, dataset, plot.

:func:`get_client` (the resolved, reachable and unlocked tracking URI) and :func:`ensure_experiment`
(the experiment, with its artifacts beside a SQLite store); :func:`run_params` (a RunConfig as
MLflow params, with the SHA-256 of pretrained weights); the batched writers :func:`log_params`,
:func:`log_epochs`, :func:`log_metrics`, :func:`log_dataset` (with :func:`dataset_record`) and
:func:`log_reliability` (the reliability diagram as an artifact), :func:`log_files` (files as
artifacts).

The leaf of :mod:`raysearch.tracking`: it imports no other module of the package (the tags and
URI rules come from :mod:`raysearch.tracking.runs`); every other ``raysearch.tracking.*`` module may
import it.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository
from mlflow.tracking import MlflowClient
from mlflow.utils.uri import add_databricks_profile_info_to_artifact_uri

from raysearch.config import RunConfig
from raysearch.tracking.runs import (
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    METRIC_PREFIXES,
    check_tracking_uri,
    probe_tracking_store,
    resolve_tracking_uri,
)
from raysearch.training.reliability_plot import reliability_diagram


def get_client(uri: str | None = None, *,
               write: bool = False) -> tuple[MlflowClient, str]:
    """A client for the resolved tracking URI and the URI itself.

    The store is checked first: it answers (:func:`~raysearch.tracking.runs.check_tracking_uri`)
    and, for a SQLite file, no other process holds it locked for reading, or with `write` for
    writing (:func:`~raysearch.tracking.runs.probe_tracking_store`).

    Raises:
        ValueError: one line naming the store and why it cannot be used.
    """
    uri = resolve_tracking_uri(uri)
    check_tracking_uri(uri)
    probe_tracking_store(uri, write=write)
    return MlflowClient(tracking_uri=uri), uri


def ensure_experiment(client: MlflowClient, name: str, uri: str) -> str:
    """Id of experiment `name`, created if missing (artifacts beside a SQLite store, absolute).

    The experiment is tagged :data:`EXPERIMENT_KIND_TAG` = :data:`EXPERIMENT_KIND` (MLflow 3's
    "model training" kind), so the MLflow UI does not ask which kind of experiment it is. Two
    drivers that create it at the same moment (two people's first sweeps on a shared server)
    get the same experiment.

    Raises:
        ValueError: for an empty `name`.
    """
    if not name.strip():
        raise ValueError("--experiment must name an MLflow experiment, got an empty name")
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        root = Path(uri[len("sqlite:///"):]).parent / "mlartifacts"
        location = root.resolve().as_uri()
    try:
        return client.create_experiment(name, artifact_location=location,
                                        tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id  # another driver made it


def _numeric_metrics(result: dict[str, Any]) -> dict[str, float]:
    out = {}
    for key, value in result.items():
        if key.startswith(METRIC_PREFIXES) and isinstance(value, (int, float)):
            if not isinstance(value, bool) and math.isfinite(value):
                out[key] = float(value)
    return out


def run_params(cfg: RunConfig) -> dict[str, Any]:
    """MLflow params of a run: the hyperparameters under plain names, plus the run settings.

    The loss's parameters under their own names (``margin``), ``method``, ``dataset``,
    ``model``, ``epochs``, ``seed``, ``lr``, ``batch_size``; the keyword arguments of the
    optimizer, the model factory and the dataset factory as ``optimizer.<kw>`` (with
    ``optimizer`` the optimizer's name), ``model.<kw>``, ``data.<kw>``; the other settings
    only where they differ from their defaults.
    """
    params: dict[str, Any] = {"method": cfg.loss.name, **cfg.loss.params}
    params.update({"dataset": cfg.data.name, "model": cfg.model.name, "epochs": cfg.epochs,
                   "seed": cfg.seed, "lr": cfg.optimizer.lr, "batch_size": cfg.batch_size,
                   "optimizer": cfg.optimizer.name})
    kwargs = cfg.optimizer.kwargs()
    params.update({f"optimizer.{k}": v for k, v in kwargs.items() if k != "lr"})
    params.update({f"model.{k}": v for k, v in cfg.model.params.items()})
    params.update({f"data.{k}": v for k, v in cfg.data.params.items()})
    if cfg.interleaved:
        params["interleaved"] = True
        params["interleave_fraction"] = cfg.interleave_fraction
    # the rest only where it differs from the default, so digits runs keep their short list
    flat = {"data_seed": cfg.data.seed, "val_fraction": cfg.data.val_fraction,
            "schedule": cfg.schedule.name, "milestones": cfg.schedule.milestones,
            "lr_decay": cfg.schedule.lr_decay, "warmup_epochs": cfg.schedule.warmup_epochs,
            "mixup_alpha": cfg.mixup_alpha, "cutmix_alpha": cfg.cutmix_alpha,
            "ricap_beta": cfg.ricap_beta,
            "pretrained": cfg.model.pretrained,
            "freeze_backbone_epochs": cfg.model.freeze_backbone_epochs,
            "head_lr": cfg.model.head_lr, "compile": cfg.compile}
    params.update({k: v for k, v in flat.items() if v != _RUN_DEFAULTS[k]})
    if cfg.model.pretrained:  # which weights exactly: `raysearch train` of the config is
        params["pretrained_sha256"] = _weights_sha256(cfg.model.pretrained)  # reproducible
    return params


_RUN_DEFAULTS = {"data_seed": None, "val_fraction": None, "schedule": "cosine", "milestones": "",
                 "lr_decay": 0.1, "warmup_epochs": 0, "mixup_alpha": 0.0, "cutmix_alpha": 0.0,
                 "ricap_beta": 0.0, "pretrained": None, "freeze_backbone_epochs": 0,
                 "head_lr": None, "compile": False}


def _weights_sha256(weights: str) -> str:
    """SHA-256 of a weights file, or of a torchvision weights name's cached file ("" if absent).

    Cached per (path, modification time): a sweep hashes its weights once, not per trial.
    """
    path = Path(weights).expanduser()
    if not path.is_file():
        try:
            import torch
            from torchvision.models import get_weight

            path = Path(torch.hub.get_dir()) / "checkpoints" / Path(get_weight(weights).url).name
        except Exception:  # noqa: BLE001 (an unknown name: the trial reports it)
            return ""
    if not path.is_file():
        return ""
    key = (str(path), path.stat().st_mtime)
    if key not in _SHA_CACHE:
        from raysearch.training.models.pretrained import file_sha256

        _SHA_CACHE[key] = file_sha256(path)
    return _SHA_CACHE[key]


_SHA_CACHE: dict[tuple[str, float], str] = {}


def log_params(client: MlflowClient, run_id: str, params: dict[str, Any]) -> None:
    """Log params in one batch (values as strings, as MLflow stores them; long ones cut)."""
    client.log_batch(run_id, params=[Param(k, _param_text(v)) for k, v in params.items()])


def _param_text(value: Any) -> str:
    text = str(value)
    return text if len(text) <= _PARAM_CHARS else text[:_PARAM_CHARS - 3] + "..."


#: Longest param value logged (MLflow stores at most 6,000 characters).
_PARAM_CHARS = 1000


def log_epochs(client: MlflowClient, run_id: str, epochs: list[tuple[int, dict[str, float]]],
               tags: dict[str, str] | None = None, times: list[int] | None = None,
               params: dict[str, Any] | None = None) -> None:
    """Log several epochs' metrics (each at ``step=epoch``), `tags` and `params` in one batch.

    `times`: each epoch's timestamp (milliseconds since the Unix epoch, one per entry of
    `epochs`: when it was reported); None: now, for all of them. `params`: as
    :func:`log_params` writes them.
    """
    now = int(time.time() * 1000)
    times = times if times is not None else [now] * len(epochs)
    client.log_batch(run_id, metrics=[Metric(k, v, ms, step)
                                      for (step, metrics), ms in zip(epochs, times, strict=True)
                                      for k, v in metrics.items()],
                     params=[Param(k, _param_text(v)) for k, v in (params or {}).items()],
                     tags=[RunTag(k, v) for k, v in (tags or {}).items()])


def dataset_record(data: Any, source: str) -> dict[str, Any]:
    """What MLflow shows of a sweep's dataset: name, source, split sizes and a digest.

    Args:
        data: the sweep's :class:`~raysearch.training.data.DatasetSplits`.
        source: where it was read from (the data folder, or the bundled loader's name).

    Returns:
        ``{"name", "source", "digest", "profile"}``; ``profile`` is a JSON string of the split
        sizes, the number of classes and the input shape; ``digest`` (12 hex digits) is a
        SHA-256 over the name, source, the split description (``data.info``, which holds the
        seed and fractions) and, where a split exposes them without reading images, its labels:
        the same dataset split the same way has the same digest.
    """
    import hashlib

    import numpy as np

    profile = {"train_size": len(data.train), "val_size": len(data.val),
               "test_size": len(data.test), "num_classes": int(data.num_classes),
               "input_shape": list(data.input_shape)}
    digest = hashlib.sha256(json.dumps([data.name, source, data.info, profile], sort_keys=True,
                                       default=str).encode())
    for split in (data.train, data.val, data.test):
        labels = _split_labels(split)
        if labels is not None:
            digest.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return {"name": data.name, "source": source, "digest": digest.hexdigest()[:12],
            "profile": json.dumps(profile)}


def _split_labels(split: Any) -> Any:
    """Labels of a split when it holds them in memory (a TensorDataset, ``targets``), else None."""
    tensors = getattr(split, "tensors", None)
    if isinstance(tensors, tuple) and len(tensors) >= 2:
        return tensors[1].cpu().numpy()
    for name in ("targets", "labels", "y"):
        value = getattr(split, name, None)
        if value is not None and hasattr(value, "__len__") and not callable(value):
            try:
                import numpy as np

                return np.asarray(value)
            except (TypeError, ValueError):
                return None
    return None


def log_dataset(client: MlflowClient, run_id: str, record: dict[str, Any],
                context: str = "training") -> None:
    """Attach `record` (:func:`dataset_record`) to `run_id` as an MLflow dataset input.

    An experiment holds one dataset row per name and digest, which MLflow's SQL store looks
    up and then inserts: two drivers logging the same new dataset at the same moment (two
    sweeps of one team on the same data) both insert it, and one gets a duplicate-key error.
    That one logs it again once, and then finds the other's row.
    """
    dataset = Dataset(name=record["name"], digest=record["digest"], source_type="local",
                      source=json.dumps({"uri": record["source"]}), profile=record["profile"])
    inputs = [DatasetInput(dataset, tags=[InputTag("mlflow.data.context", context)])]
    try:
        client.log_inputs(run_id, datasets=inputs)
    except MlflowException:
        time.sleep(0.5)
        client.log_inputs(run_id, datasets=inputs)


def last_step(client: MlflowClient, run_id: str) -> int:
    """Last epoch logged to `run_id` (0 when none)."""
    steps = [m.step for m in client.get_metric_history(run_id, "val_accuracy")]
    return max(steps, default=0)


def log_metrics(client: MlflowClient, run_id: str, metrics: dict[str, float], step: int) -> None:
    """Log metrics in one batch at `step` (the epoch)."""
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])


def log_files(client: MlflowClient, run_id: str, paths: Sequence[str | Path],
              artifact_uri: str | None = None) -> None:
    """Attach each file of `paths` to run `run_id`, at the top of its artifacts.

    `artifact_uri`: the run's ``info.artifact_uri`` where the caller has it (``create_run``
    returns it): the files go to that artifact repository, resolved as ``client.log_artifact``
    resolves it, without the client's look-up of the run (a ``get_run``, ~10 ms on a SQLite
    store). None: ``client.log_artifact``.
    """
    if artifact_uri is None:
        for path in paths:
            client.log_artifact(run_id, str(path))
        return
    repository = get_artifact_repository(
        add_databricks_profile_info_to_artifact_uri(artifact_uri, client.tracking_uri),
        tracking_uri=client.tracking_uri)
    for path in paths:
        repository.log_artifact(str(path))


def log_reliability(client: MlflowClient, run_id: str, bins: dict[str, list], title: str) -> None:
    """Draw the test reliability diagram from its bins and attach it as ``reliability.png``."""
    with tempfile.TemporaryDirectory() as d:
        path = reliability_diagram(bins["edges"], bins["counts"], bins["accuracy"],
                                   bins["confidence"], Path(d) / "reliability.png", title=title)
        client.log_artifact(run_id, str(path))
