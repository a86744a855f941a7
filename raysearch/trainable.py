"""Ray Tune wrapping of :func:`raysearch.training.fit`: one trial = one training run.

The trial function resolves its flat Tune config into a :class:`~raysearch.config.RunConfig`
through the sweep's search space, trains with one torch thread, reports validation metrics every
epoch with a checkpoint (``tune.report``), and adds the test metrics and the test reliability
bins to the last report. A trial that ran all its epochs reports ``completed = True`` in its last
result; a trial stopped early by a scheduler never does, which is how the searcher and the
selection rule tell finished trials from partial ones.
"""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ray import tune

from raysearch.config import RunConfig
from raysearch.data import load_dataset
from raysearch.metrics import reliability_bins, softmax
from raysearch.posthoc import Outputs, calibrate_outputs, write_outputs_parquet
from raysearch.spaces import SearchSpace
from raysearch.training import DivergedError, fit

#: Result key set to True in the last report of a trial that ran all its epochs.
COMPLETED = "completed"
#: Result key holding the error message of a trial whose training loss became NaN/inf.
DIVERGED = "diverged"
#: Result key holding the test reliability-diagram bins (lists) in the last report.
RELIABILITY = "test_reliability"
#: Parquet file (in the final checkpoint and the MLflow run) with val/test logits and labels.
LOGITS_FILE = "logits.parquet"
#: Dataset-shift results (``--shift-eval``): a table and a plot, in the final checkpoint and
#: the MLflow run.
SHIFT_TABLE = "shift.csv"
SHIFT_PLOT = "shift.png"
#: Files of the final checkpoint that the tracking callback attaches to the trial's run.
ARTIFACT_FILES = (LOGITS_FILE, SHIFT_TABLE, SHIFT_PLOT)
_CKPT_FILE = "state.pt"


def _nan_to_none(values: Any) -> list[Any]:
    return [None if (isinstance(v, float) and math.isnan(v)) else v for v in values]


def trial_device() -> torch.device:
    """``cuda`` when this process sees a GPU, else ``cpu``.

    Ray sets ``CUDA_VISIBLE_DEVICES`` to the trial's share; a trial that asked for none sees none.
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def loader_workers(cpus_per_trial: float) -> int:
    """DataLoader workers of a trial with `cpus_per_trial` CPUs (0 for one CPU or less).

    One CPU runs the training loop, the rest load image files.
    """
    return max(int(math.floor(cpus_per_trial)) - 1, 0)


def run_trial(config: dict[str, Any], *, space: SearchSpace, overrides: dict[str, Any],
              posthoc: tuple[str, ...] = ("ts",), checkpoint_every: int = 1,
              precision: str = "auto", cpus_per_trial: float = 1.0,
              shift_set: Any = None) -> None:
    """Tune function trainable: train one configuration and report to Tune.

    After the last epoch the post-hoc calibrators named in `posthoc` are fitted on the
    validation logits and measured on the test logits (``test_ece_ts``, ...); ``val_ece_ts``
    etc. come from a calibrator fitted on one stratified half of the validation set and
    measured on the other half (an out-of-sample validation score to select on). The validation
    and test logits and labels are written as ``logits.parquet`` into the final checkpoint (the
    tracking callback attaches it to the trial's MLflow run).

    Args:
        config: the flat trial config from the searcher (sampled and fixed values).
        space: the sweep's search space (resolves `config` into a RunConfig).
        overrides: sweep-wide settings (dataset, epochs, seed, n_bins, data_dir) that replace the
            space's values.
        posthoc: calibrator names of :func:`raysearch.calibration.fit_calibrator` (may be empty).
        checkpoint_every: attach a checkpoint (model, optimizer, scheduler) to every n-th
            epoch's report; 0 checkpoints the last epoch only. The last epoch always has one.
        precision: ``auto``, ``bf16`` or ``fp32`` (:func:`raysearch.training.fit`).
        cpus_per_trial: CPUs Ray reserved for the trial: torch threads on the CPU and
            DataLoader workers (:func:`loader_workers`) for file-backed datasets.
        shift_set: a :class:`raysearch.shift.ShiftSet` built by the driver (or its ``.npz`` path):
            after training the model is evaluated on it, before and after the first calibrator
            of `posthoc` (``shift_*`` metrics, ``shift.csv`` and ``shift.png``).

    The trial trains on the GPU Ray gave it (:func:`trial_device`), else on the CPU.

    A training loss that becomes NaN/inf ends the trial with a last report holding
    ``diverged`` (the message): the tracking callback records it FAILED and the searcher tells
    Optuna FAIL. Any other exception propagates (Tune marks the trial ERROR).
    """
    device = trial_device()
    torch.set_num_threads(1 if device.type == "cuda" else max(int(cpus_per_trial), 1))
    cfg: RunConfig = space.resolve(config, **overrides)

    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            resume = torch.load(Path(d) / _CKPT_FILE, weights_only=False, map_location="cpu")

    def on_epoch(epoch: int, metrics: dict[str, float], state: dict) -> None:
        if epoch == cfg.epochs:
            return  # the last epoch is reported below, together with the test metrics
        if not checkpoint_every or epoch % checkpoint_every:
            tune.report({"epoch": epoch, **metrics})
            return
        with tempfile.TemporaryDirectory() as d:
            torch.save(state, Path(d) / _CKPT_FILE)
            tune.report({"epoch": epoch, **metrics},
                        checkpoint=tune.Checkpoint.from_directory(d))

    last_state: dict[str, Any] = {}

    def on_last(epoch: int, metrics: dict[str, float], state: dict) -> None:
        on_epoch(epoch, metrics, state)
        if epoch == cfg.epochs:
            last_state.update(state)

    try:
        data = load_dataset(cfg.dataset, seed=cfg.seed, val_fraction=cfg.val_fraction,
                            test_fraction=cfg.test_fraction, data_dir=cfg.data_dir,
                            imbalance_ratio=cfg.imbalance_ratio)
        result = fit(cfg, on_epoch=on_last, resume=resume, device=device, precision=precision,
                     num_workers=loader_workers(cpus_per_trial), data=data)
    except DivergedError as exc:
        # reported, not raised: the trial ends FAILED in MLflow and Optuna, and its worker
        # process stays alive for the next trial (reuse_actors) instead of being replaced
        tune.report({DIVERGED: str(exc), COMPLETED: False})
        return
    bins = reliability_bins(softmax(result.test_logits), result.test_labels, n_bins=cfg.ece_bins)
    final = {
        "epoch": cfg.epochs,
        **result.metrics,
        COMPLETED: True,
        RELIABILITY: {
            "edges": [float(e) for e in bins.edges],
            "counts": [int(c) for c in bins.counts],
            "accuracy": _nan_to_none(float(a) for a in bins.accuracy),
            "confidence": _nan_to_none(float(c) for c in bins.confidence),
        },
    }
    with tempfile.TemporaryDirectory() as d:
        torch.save(last_state, Path(d) / _CKPT_FILE)
        logits = np.concatenate([result.val_logits, result.test_logits])
        labels = np.concatenate([result.val_labels, result.test_labels])
        split = ["val"] * len(result.val_labels) + ["test"] * len(result.test_labels)
        write_outputs_parquet(Path(d) / LOGITS_FILE, logits, labels, split)
        if posthoc:
            report = calibrate_outputs(Outputs(logits, labels, split=np.asarray(split)),
                                       methods=posthoc, n_bins=cfg.ece_bins)
            final.update({k: v for k, v in report.as_metrics("test").items()
                          if k not in final})
            # an honest validation score of the calibrated model (for `report --calibrated`):
            # fitted on a stratified half of the validation set, measured on the other half
            val_only = Outputs(result.val_logits, result.val_labels)
            halves = calibrate_outputs(val_only, methods=posthoc, n_bins=cfg.ece_bins,
                                       fraction=0.5, seed=cfg.seed)
            final.update({k: v for k, v in halves.as_metrics("val").items()
                          if k.count("_") >= 2})
        if shift_set:
            final.update(_shift_eval(result, cfg, data.test, shift_set, posthoc, Path(d)))
        tune.report(final, checkpoint=tune.Checkpoint.from_directory(d))


def _shift_eval(result: Any, cfg: RunConfig, test: Any, shift_set: Any,
                posthoc: tuple[str, ...], out: Path) -> dict[str, float]:
    """Evaluate the trained model on the corrupted test subsample; write the table and plot."""
    from raysearch import plots
    from raysearch.calibration import fit_calibrator
    from raysearch.shift import ShiftSet, evaluate_shift
    from raysearch.training import evaluate

    if isinstance(shift_set, (str, Path)):
        shift_set = ShiftSet.load(shift_set)
    model = result.model
    device = next(model.parameters()).device
    subsample = test.subset(shift_set.index)  # the test images the shift set was made from

    def predict_logits(images: np.ndarray) -> np.ndarray:
        return evaluate(model, subsample.with_images(images), device=device)[0]

    calibrator = name = None
    if posthoc:
        name = posthoc[0]
        calibrator = fit_calibrator(name, result.val_logits, result.val_labels)
    report = evaluate_shift(predict_logits, shift_set, calibrator=calibrator,
                            calibrator_name=name, n_bins=cfg.ece_bins)
    frame = report.to_frame()
    frame.to_csv(out / SHIFT_TABLE, index=False)
    plots.shift_plot(frame, out / SHIFT_PLOT, calibrator=name,
                     title=f"{cfg.method} on {cfg.dataset}: corrupted test set")
    return report.as_metrics()


def trial_env() -> dict[str, str]:
    """Environment variables every trial worker needs (set through Ray's runtime env)."""
    return {
        # keep the driver's working directory: relative paths stay meaningful in trials
        "RAY_CHDIR_TO_TRIAL_DIR": "0",
        "OMP_NUM_THREADS": os.environ.get("RAYSEARCH_TRIAL_THREADS", "1"),
    }
