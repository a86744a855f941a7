"""The selected trial of a sweep as a model to use: its weights, its calibrator, its network.

:func:`export_model` gathers what :mod:`raysearch.tracking.pyfunc` packs: the trial's final
weights (the child run's ``weights.pt`` when the sweep ran with ``--log-weights``, else the
``state.pt`` of its last checkpoint in Tune's storage), the network's factory and shape (from the
trial's config and its dataset), and a post-hoc calibrator fitted on the trial's validation
logits (``logits.parquet``). ``raysearch export NAME --register MODEL`` and ``--with-weights``
call it through :func:`raysearch.api.export`.

A calibrator whose fit is ``degenerate`` (the validation split is perfectly classified: no
finite temperature) is left out: the model gives the network's softmax, its metadata names the
calibrator under ``calibrator_degenerate`` and the result carries the line
:data:`~raysearch.tracking.export.DEGENERATE_EXPORT`. A sweep of objects defined in ``__main__``
(a script or a notebook, recorded as ``__main__:name``) needs them again: ``components``.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from raysearch import tracking
from raysearch.config import RunConfig
from raysearch.tracking import pyfunc
from raysearch.tracking.export import DEGENERATE_EXPORT, model_environment


def export_model(client: Any, parent: Any, doc: dict[str, Any], *, register: str | None,
                 folder: str | Path | None, calibrator: str = "ts",
                 storage_path: str | None = None,
                 components: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Register the trial of `doc` as MLflow model `register` and/or save it to `folder`.

    Args:
        client: MLflow client of the sweep's store.
        parent: the sweep's parent run.
        doc: the exported document of the selected trial
            (:func:`raysearch.tracking.best_config_document`).
        register: the registered model's name, or None.
        folder: a new folder to save the pyfunc model to, or None.
        calibrator: the calibrator fitted on the trial's validation logits, or ``none``.
        storage_path: where the sweep's Tune storage is now (default: its recorded path).
        components: objects standing for the config's names (``{"models": {name: factory},
            "datasets": {name: factory}}``), for a sweep of ``__main__`` objects.

    Returns:
        ``{"uri": "models:/<name>/<version>" or the folder, "calibrator": name (``none``
        where the asked one was degenerate), "weights_from": "run" or "checkpoint",
        "input_shape": [...], "num_classes": K, "requirements": [pip lines], "code": [the
        user's code carried], "notes": [lines]}``, plus ``"warning"`` (one line) and
        ``"degenerate_calibrator"`` where the calibrator was left out.

    Raises:
        ValueError: for an unknown calibrator, a trial without validation logits (a
            segmentation sweep, or an older one) or without weights.
    """
    from raysearch.calibration import available_calibrators, fit_calibrator
    from raysearch.training.run_parts import load_run_data, run_model_spec

    if calibrator != "none" and calibrator not in available_calibrators():
        from raysearch.registry import did_you_mean

        raise ValueError(f"unknown calibrator {calibrator!r}"
                         f"{did_you_mean(calibrator, available_calibrators())}; available: "
                         f"{', '.join(available_calibrators())}, none")
    run = client.get_run(doc["run_id"])
    outputs = tracking.trial_outputs(client, doc["run_id"])
    if outputs is None:
        raise ValueError(f"trial {doc['trial']} has no logits.parquet (validation logits): only "
                         "a classification trial that ran all its epochs can be exported as a "
                         "model")
    weights, source = _weights(client, parent, run, storage_path)
    cfg = RunConfig.from_dict(doc["config"])
    spec = run_model_spec(cfg, load_run_data(cfg, components=components), components=components)
    fitted, skipped = None, ""
    if calibrator != "none":
        val = np.asarray(outputs.split) == "val"
        fitted = _fit(fit_calibrator, calibrator, outputs.logits[val], outputs.labels[val])
        if getattr(fitted, "degenerate", False):
            fitted, skipped = None, calibrator
    pip, code, notes = model_environment([spec["name"], fitted])
    saved = {"model": spec, "weights": weights, "calibrator": fitted,
             "calibrator_name": "none" if skipped else calibrator, "export": doc,
             "requirements": pip, "code_paths": code,
             "metadata": {"calibrator_degenerate": skipped} if skipped else None}
    out: dict[str, Any] = {
        "calibrator": saved["calibrator_name"], "weights_from": source,
        "input_shape": list(spec["input_shape"]), "num_classes": spec["num_classes"],
        "requirements": pip, "code": code, "notes": notes}
    if skipped:
        out.update(warning=DEGENERATE_EXPORT, degenerate_calibrator=skipped)
    if folder is not None:
        out["uri"] = str(pyfunc.save_calibrated_model(folder, **saved).resolve())
    if register is not None:
        version = pyfunc.register_calibrated_model(client, doc["run_id"], register, **saved)
        out["uri"] = f"models:/{register}/{version.version}"
    return out


def _fit(fit_calibrator: Any, name: str, logits: np.ndarray, labels: np.ndarray) -> Any:
    """The calibrator fitted; its warning of a degenerate fit is left to the caller's line."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "[^:]*: the calibration set is perfectly", UserWarning)
        return fit_calibrator(name, logits, labels)


def _weights(client: Any, parent: Any, run: Any, storage_path: str | None) -> tuple[dict, str]:
    """The trial's final weights, and where they came from (``run`` or ``checkpoint``)."""
    import torch

    if pyfunc.WEIGHTS_FILE in {a.path for a in client.list_artifacts(run.info.run_id)}:
        with tempfile.TemporaryDirectory() as d:
            local = client.download_artifacts(run.info.run_id, pyfunc.WEIGHTS_FILE, d)
            return torch.load(local, weights_only=True, map_location="cpu"), "run"
    from raysearch.tune.resume import sweep_experiment_path
    from raysearch.tune.sync import trial_weights

    path = sweep_experiment_path(client, parent, storage_path)
    return trial_weights(path, run.data.tags[tracking.TRIAL_TAG]), "checkpoint"
