"""The selected trial of a sweep as a model to use: its weights, its calibrator, its network.

:func:`export_model` gathers what :mod:`raysearch.tracking.pyfunc` packs: the trial's final
weights (the child run's ``weights.pt`` when the sweep ran with ``--log-weights``, else the
``state.pt`` of its last checkpoint in Tune's storage), the network's factory and shape (from the
trial's config and its dataset), and a post-hoc calibrator fitted on the trial's validation
logits (``logits.parquet``). ``raysearch export NAME --register MODEL`` and ``--with-weights``
call it through :func:`raysearch.api.export`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from raysearch import tracking
from raysearch.config import RunConfig
from raysearch.tracking import pyfunc


def export_model(client: Any, parent: Any, doc: dict[str, Any], *, register: str | None,
                 folder: str | Path | None, calibrator: str = "ts",
                 storage_path: str | None = None) -> dict[str, Any]:
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

    Returns:
        ``{"uri": "models:/<name>/<version>" or the folder, "calibrator": name,
        "weights_from": "run" or "checkpoint", "input_shape": [...], "num_classes": K}``.

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
    spec = run_model_spec(cfg, load_run_data(cfg))
    fitted = None
    if calibrator != "none":
        val = np.asarray(outputs.split) == "val"
        fitted = fit_calibrator(calibrator, outputs.logits[val], outputs.labels[val])
    saved = {"model": spec, "weights": weights, "calibrator": fitted,
             "calibrator_name": calibrator, "export": doc}
    out = {"calibrator": calibrator, "weights_from": source,
           "input_shape": list(spec["input_shape"]), "num_classes": spec["num_classes"]}
    if folder is not None:
        out["uri"] = str(pyfunc.save_calibrated_model(folder, **saved).resolve())
    if register is not None:
        version = pyfunc.register_calibrated_model(client, doc["run_id"], register, **saved)
        out["uri"] = f"models:/{register}/{version.version}"
    return out


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
