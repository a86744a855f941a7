"""What differs between tasks, in one place: how a split is evaluated and what a trial keeps.

The epoch loop (:mod:`raysearch.training.run`), the trainable and the sweep never ask which dataset
or model they run: they ask the task of the data (``DatasetSplits.task``, :func:`task_for`):

- :class:`ClassificationTask` (``"classification"``: one label per sample, any input shape:
  images, token sequences, tabular rows): the validation logits of every epoch go through
  :class:`raysearch.metrics.CalibrationMeter` (``val_accuracy``, ``val_ece``, ...); at the end
  the test split, the estimators, the user's metrics, ``logits.parquet``, the post-hoc
  calibrators and the shift evaluation;
- :class:`DenseTask` (``"segmentation"``: one label per pixel): every split streams through the
  meter (pixel accuracy, mIoU, pixel ECE, no per-pixel storage); temperature scaling on a seeded
  pixel sample; per-class IoU and confidence maps. Its primary metric is ``miou``.

A task also checks that a model suits it (a segmentation network on classification data is a
one-line error) and which training regimes it supports (MixUp, objectness, interleaving).
Plain PyTorch/NumPy: no Ray, no MLflow.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from raysearch.metrics import DENSE_KEYS, SUMMARY_KEYS, group_keys
from raysearch.metrics.catalog import user_metric_values
from raysearch.training.loop import (
    Amp,
    Dist,
    DivergedError,
    Source,
    TrainResult,
    numpy_logits,
    predict_source,
)
from raysearch.training.records import (
    CLASS_IOU,
    CONFIDENCE_PLOT,
    DEGENERATE_CALIBRATORS,
    LOGITS_FILE,
    SHIFT_PLOT,
    SHIFT_TABLE,
)

if TYPE_CHECKING:
    from raysearch.config import RunConfig
    from raysearch.training.data import DatasetSplits

__all__ = ["ClassificationTask", "DenseTask", "EvalContext", "Task", "task_for"]

logger = logging.getLogger(__name__)

_DENSE_TS_KEYS = SUMMARY_KEYS

# the files a trial writes (LOGITS_FILE, SHIFT_TABLE, SHIFT_PLOT, CLASS_IOU, CONFIDENCE_PLOT)
# are named in raysearch.training.records, which the tracking reads too

MetricFn = Callable[[np.ndarray, np.ndarray], float]


@dataclass
class EvalContext:
    """What a task needs to evaluate one run.

    Attributes:
        data: the run's splits.
        cfg: the run's config (``ece_bins``, ``batch_size``, ``split_seed``).
        amp: precision and memory format of the forward passes.
        ddp: the DDP group, or None.
        num_workers: DataLoader workers for file-backed splits.
        label: the model's name, for messages (``model 'mypkg.models:make_net'``).
        metric_fns: a user's metrics ``{name: fn(probs (N, K) float64, labels (N,) int64) ->
            float}``, logged as ``val_<name>`` every epoch and ``test_<name>`` at the end.
    """

    data: DatasetSplits
    cfg: RunConfig
    amp: Amp
    ddp: Dist | None
    num_workers: int = 0
    label: str = "the model"
    metric_fns: Mapping[str, MetricFn] = field(default_factory=dict)


def custom_metrics(fns: Mapping[str, MetricFn], logits: Tensor, labels: Tensor,
                   split: str) -> dict[str, float]:
    """``{split}_{name}: fn(probs, labels)`` for a user's metric functions on a split's logits.

    A function declaring ``reads="logits"`` (:func:`raysearch.metrics.metric`) gets the
    logits (float64) instead of their softmax.

    Raises:
        ValueError: one line naming the metric if it raises or returns something that is not
            a number.
    """
    from raysearch.metrics import softmax

    z = numpy_logits(logits)
    values = user_metric_values(fns, softmax(z), labels.cpu().numpy(),
                                logits=z.astype(np.float64), where=f"the {split} split")
    return {f"{split}_{name}": value for name, value in values.items()}


class Task:
    """The behaviour of one kind of prediction (see the module docstring)."""

    #: ``DatasetSplits.task`` values this class serves.
    name = "classification"
    #: The accuracy axis of the front and the rule (``val_<primary_metric>``).
    primary_metric = "accuracy"

    def check_model(self, model: nn.Module, label: str) -> None:
        """Refuse a model made for another task (its ``task`` attribute, when it has one).

        Raises:
            ValueError: one line naming the model and what it is for.
        """
        kind = getattr(model, "task", None)
        if kind is not None and kind != self.name:
            raise ValueError(f"{label} is a {kind} model: it needs a {kind} dataset, and this "
                             f"dataset is for {self.name} (`raysearch list models` shows them)")

    def check_output(self, model: nn.Module, data: DatasetSplits, label: str) -> None:
        """Check the shape of the logits `model` returns for two samples shaped like the data's.

        Run on the meta device (shapes only): (N, K) for one label per sample, (N, K, *target)
        for one label per element of a target.

        A model whose parameters are not on the meta device, or whose forward pass cannot run
        there, is not checked here (the loop's first batch checks it).

        Raises:
            ValueError: one line naming the model, the shape it returned and the one expected.
        """
        from raysearch.training.models import output_logits

        if any(p.device.type != "meta" for p in model.parameters()):
            return
        x, y = data.train[0][:2]
        x = torch.as_tensor(x)
        target = tuple(torch.as_tensor(y).shape)
        expected = (2, data.num_classes, *target)
        try:
            with torch.no_grad():
                out = model.eval()(torch.zeros((2, *x.shape), dtype=x.dtype, device="meta"))
        except Exception:  # noqa: BLE001 (an op the meta device lacks: checked in the loop)
            return
        logits = output_logits(out, model=label)
        if tuple(logits.shape) != expected:
            what = ("one label per sample" if not target else
                    f"one label per element of each {tuple(target)} target ({self.name})")
            raise ValueError(f"{label} returned logits of shape {tuple(logits.shape)} for "
                             f"inputs {(2, *x.shape)}; the data has {what}: expected "
                             f"{expected}")

    def check_training(self, *, side_inputs: tuple[str, ...], interleaved: bool, mixing: bool,
                       method: str) -> None:
        """Refuse training regimes this task does not support (none refused here)."""

    def evaluate(self, net: nn.Module, source: Source, ctx: EvalContext, after: str, *,
                 final: bool) -> tuple[Any, dict[str, float]]:
        """Evaluate `net` on the validation split: (state kept for :meth:`finish`, metrics)."""
        raise NotImplementedError

    def finish(self, net: nn.Module, state: Any, val_source: Source, ctx: EvalContext,
               metrics: dict[str, float], epochs_completed: int,
               start_epoch: int) -> TrainResult:
        """The end of a run: the test split (and what the task computes once)."""
        raise NotImplementedError

    def test_bins(self, result: TrainResult, n_bins: int) -> Any:
        """Reliability bins of the test split (the trial's reliability diagram)."""
        raise NotImplementedError

    def write_artifacts(self, result: TrainResult, cfg: RunConfig, out: Path, test: Any, *,
                        posthoc: tuple[str, ...] = (), shift_set: Any = None,
                        title: str = "trial",
                        metric_fns: Mapping[str, MetricFn] | None = None) -> dict[str, Any]:
        """Write the trial's files into `out`; return what they add to the last report.

        Args:
            result: the trained run.
            cfg: its config.
            out: the folder of the trial's last checkpoint.
            test: the test split (the shift evaluation corrupts its images).
            posthoc: the calibrators fitted after training (may be empty).
            shift_set: a :class:`raysearch.metrics.shift.ShiftSet` to evaluate on, or None.
            title: names the trial in its figures.
            metric_fns: the user's metrics of the run (:attr:`EvalContext.metric_fns`), also
                measured after each post-hoc calibrator.
        """
        raise NotImplementedError


class ClassificationTask(Task):
    """One label per sample (see the module docstring)."""

    name = "classification"
    primary_metric = "accuracy"

    def evaluate(self, net: nn.Module, source: Source, ctx: EvalContext, after: str, *,
                 final: bool) -> tuple[Any, dict[str, float]]:
        """The validation logits and labels, and ``val_*`` metrics (a user's metrics too)."""
        logits, labels = predict_source(net, source, ctx.amp, ddp=ctx.ddp, label=ctx.label)
        metrics = summary(logits, labels, "val", ctx.cfg.ece_bins, after)
        if ctx.metric_fns:
            metrics.update(custom_metrics(ctx.metric_fns, logits, labels, "val"))
        return (logits, labels), metrics

    def finish(self, net: nn.Module, state: Any, val_source: Source, ctx: EvalContext,
               metrics: dict[str, float], epochs_completed: int,
               start_epoch: int) -> TrainResult:
        """The test split, the estimators and the user's metrics on the final model."""
        if state is None:  # resumed after the last epoch: nothing trained, evaluate again
            state, again = self.evaluate(net, val_source, ctx,
                                         f"resumed after epoch {start_epoch - 1}", final=True)
            metrics.update(again)
        val_logits, val_y = state
        test_source = Source(ctx.data.test, ctx.amp.device, num_workers=ctx.num_workers)
        test_logits, test_y = predict_source(net, test_source, ctx.amp, ddp=ctx.ddp,
                                             label=ctx.label)
        n_bins = ctx.cfg.ece_bins
        metrics.update(summary(test_logits, test_y, "test", n_bins,
                               f"after epoch {epochs_completed}"))
        # the estimators of raysearch.metrics.estimator_summary and the rest of the papers'
        # table metrics (raysearch.metrics.TABLE_KEYS), once, on the final model
        metrics.update(_estimators(val_logits, val_y, "val", n_bins))
        metrics.update(_estimators(test_logits, test_y, "test", n_bins))
        if ctx.metric_fns:
            metrics.update(custom_metrics(ctx.metric_fns, test_logits, test_y, "test"))
        net.eval()
        return TrainResult(
            metrics=metrics, epochs_completed=epochs_completed, model=net,
            val_logits=numpy_logits(val_logits),
            val_labels=val_y.cpu().numpy().astype(np.int64),
            test_logits=numpy_logits(test_logits),
            test_labels=test_y.cpu().numpy().astype(np.int64), task=self.name)

    def test_bins(self, result: TrainResult, n_bins: int) -> Any:  # noqa: D102
        from raysearch.metrics import reliability_bins, softmax

        return reliability_bins(softmax(result.test_logits), result.test_labels, n_bins=n_bins)

    def write_artifacts(self, result: TrainResult, cfg: RunConfig, out: Path, test: Any, *,
                        posthoc: tuple[str, ...] = (), shift_set: Any = None,
                        title: str = "trial",
                        metric_fns: Mapping[str, MetricFn] | None = None) -> dict[str, Any]:
        """``logits.parquet``; the post-hoc calibrators; the shift evaluation when asked.

        ``test_*_<calibrator>`` come from calibrators fitted on the validation logits;
        ``val_*_<calibrator>`` from ones fitted on a stratified half of the validation set and
        measured on the other half (an honest validation score to select on). ``*`` is every
        metric of ``group_keys("calibrated")`` and each of the user's `metric_fns`. Where the
        validation split (or a half) is perfectly classified, the calibrators that could not
        be fitted (``degenerate``) are named under
        :data:`~raysearch.training.records.DEGENERATE_CALIBRATORS` (the run's tag and one
        progress line come from the tracking; their own warnings are not repeated here).
        """
        from raysearch.calibration.posthoc import Outputs, calibrate_outputs, write_outputs_parquet

        posthoc = tuple(posthoc)
        final: dict[str, Any] = {}
        logits = np.concatenate([result.val_logits, result.test_logits])
        labels = np.concatenate([result.val_labels, result.test_labels])
        split = ["val"] * len(result.val_labels) + ["test"] * len(result.test_labels)
        write_outputs_parquet(out / LOGITS_FILE, logits, labels, split)
        if posthoc:
            with warnings.catch_warnings():  # a degenerate fit: one line from the tracking
                warnings.filterwarnings("ignore", "[^:]*: the calibration set is perfectly",
                                        UserWarning)
                # the uncalibrated rows are left out: fit measured the test split already, and
                # the val half's raw numbers are not reported
                report = calibrate_outputs(Outputs(logits, labels, split=np.asarray(split)),
                                           methods=posthoc, n_bins=cfg.ece_bins,
                                           uncalibrated=False, metrics=metric_fns)
                val_only = Outputs(result.val_logits, result.val_labels)
                halves = calibrate_outputs(val_only, methods=posthoc, n_bins=cfg.ece_bins,
                                           fraction=0.5, seed=cfg.seed, uncalibrated=False,
                                           metrics=metric_fns)
            final.update({k: v for k, v in report.as_metrics("test").items()
                          if k not in result.metrics})
            final.update(halves.as_metrics("val", calibrated_only=True))
            degenerate = dict.fromkeys((*report.degenerate, *halves.degenerate))
            if degenerate:
                final[DEGENERATE_CALIBRATORS] = ",".join(degenerate)
        if shift_set:
            final.update(_shift_eval(result, cfg, test, shift_set, posthoc, out))
        return final


class DenseTask(Task):
    """One label per pixel (see the module docstring)."""

    name = "segmentation"
    primary_metric = "miou"

    def check_training(self, *, side_inputs: tuple[str, ...], interleaved: bool, mixing: bool,
                       method: str) -> None:
        """Refuse what needs one label per sample: loss side inputs, interleaving, MixUp.

        Raises:
            ValueError: naming the regime and the method.
        """
        if side_inputs or interleaved or mixing:
            what = (f"a loss taking {', '.join(side_inputs)} per sample" if side_inputs
                    else "interleaved training" if interleaved else "MixUp/CutMix/RICAP")
            raise ValueError(f"{what} is not available for segmentation (method {method!r})")

    def evaluate(self, net: nn.Module, source: Source, ctx: EvalContext, after: str, *,
                 final: bool) -> tuple[Any, dict[str, float]]:
        """The split streamed through the meter (pixel metrics, mIoU); no logits kept."""
        if ctx.metric_fns:
            raise ValueError(f"metrics {', '.join(ctx.metric_fns)} take (N, K) probabilities: "
                             "they are not computed for per-pixel outputs")
        evaluation = _dense_eval(net, source, ctx, after, final=final)
        return evaluation, _dense_metrics(evaluation.meters[0], "val")

    def finish(self, net: nn.Module, state: Any, val_source: Source, ctx: EvalContext,
               metrics: dict[str, float], epochs_completed: int,
               start_epoch: int) -> TrainResult:
        """TS fitted on a validation pixel sample, then the test pass.

        The test pass feeds two meters (T = 1 and the fitted T); the result holds what the trial
        logs (:class:`TrainResult`, ``dense``).
        """
        from raysearch.metrics import CalibrationMeter, softmax
        from raysearch.training.dense import fit_temperature, split_sample

        data, cfg = ctx.data, ctx.cfg
        if state is None or not len(state.sample_labels):
            # resumed after the last epoch (nothing trained): evaluate the final model again
            state = _dense_eval(net, val_source, ctx, f"resumed after epoch {start_epoch - 1}",
                                final=True)
            metrics.update(_dense_metrics(state.meters[0], "val"))
        logits, labels = state.sample_logits, state.sample_labels
        temperature = fit_temperature(logits, labels)
        # an honest validation score of TS: fitted on one half of the pixel sample, measured on
        # the other (as classification trials do with their validation logits)
        fit_half, eval_half = split_sample(labels, cfg.split_seed)
        t_half = fit_temperature(logits[fit_half], labels[fit_half])
        half = CalibrationMeter(data.num_classes, n_bins=cfg.ece_bins)
        if len(eval_half):
            half.update(softmax(logits[eval_half] / t_half), labels[eval_half])
            metrics.update(_dense_metrics(half, "val", "_ts", _DENSE_TS_KEYS))
        test_source = Source(data.test, ctx.amp.device, num_workers=ctx.num_workers)
        test_eval = _dense_eval(net, test_source, ctx, f"after epoch {epochs_completed}",
                                final=False, temperatures=(1.0, temperature))
        metrics.update(_dense_metrics(test_eval.meters[0], "test"))
        metrics.update(_dense_metrics(test_eval.meters[1], "test", "_ts", _DENSE_TS_KEYS))
        metrics["val_ts_temperature"] = temperature
        net.eval()
        k = data.num_classes
        dense = {"temperature": temperature, "test_bins": test_eval.meters[0].reliability_bins(),
                 "val_iou": state.meters[0].iou(), "test_iou": test_eval.meters[0].iou(),
                 "class_names": list(data.class_names or [str(i) for i in range(k)]),
                 "images": state.images}
        return TrainResult(metrics=metrics, epochs_completed=epochs_completed, model=net,
                           val_logits=logits, val_labels=labels,
                           test_logits=np.zeros((0, k), np.float32),
                           test_labels=np.zeros(0, np.int64), task=self.name, dense=dense)

    def test_bins(self, result: TrainResult, n_bins: int) -> Any:  # noqa: D102
        return result.dense["test_bins"]

    def write_artifacts(self, result: TrainResult, cfg: RunConfig, out: Path, test: Any, *,
                        posthoc: tuple[str, ...] = (), shift_set: Any = None,
                        title: str = "trial",
                        metric_fns: Mapping[str, MetricFn] | None = None) -> dict[str, float]:
        """Per-class IoU (``class_iou.csv``) and the confidence maps; no logits file.

        A VOC split has hundreds of millions of pixels. Temperature scaling was fitted in
        :meth:`finish` on a validation pixel sample and measured on all test pixels
        (``test_*_ts``), whatever ``posthoc`` asks for.
        """
        import pandas as pd

        from raysearch.training import plots
        dense = result.dense
        pd.DataFrame({"class": dense["class_names"], "val_iou": dense["val_iou"],
                      "test_iou": dense["test_iou"]}).to_csv(out / CLASS_IOU, index=False)
        if dense["images"]:
            try:
                plots.confidence_maps(dense["images"], out / CONFIDENCE_PLOT,
                                      title=f"{title}: validation images")
            except Exception as exc:  # noqa: BLE001 (a plot must never fail the trial)
                logger.warning("confidence maps not drawn: %s", exc)
        return {}


_TASKS: dict[str, Task] = {task.name: task for task in (ClassificationTask(), DenseTask())}


def task_for(data: Any) -> Task:
    """The task of a dataset's splits (``DatasetSplits.task``) or of a task name.

    Raises:
        ValueError: for a task no class serves.
    """
    name = data if isinstance(data, str) else getattr(data, "task", "classification")
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(_TASKS)}")
    return _TASKS[name]


# -- classification helpers ------------------------------------------------------------------

def summary(logits: Tensor, labels: Tensor, split: str, n_bins: int,
            after: str) -> dict[str, float]:
    """``{split}_{metric}`` of :class:`raysearch.metrics.CalibrationMeter` on a split's logits.

    The same numbers as :func:`raysearch.metrics.calibration_summary` (to float rounding).

    Raises:
        DivergedError: if a logit is NaN or infinite (`after` says when, for the message).
    """
    from raysearch.metrics import CalibrationMeter, softmax

    if not torch.isfinite(logits).all():
        # the last optimizer step blew the weights up: the loss was finite, the model is not
        raise DivergedError(f"the model's {split} logits are not finite ({after})")
    if logits.ndim != 2:
        raise ValueError(f"the model's {split} logits have shape {tuple(logits.shape)}, "
                         "expected (N, K) for one label per sample")
    # the same streaming meter as segmentation trials (one update: the split's logits fit in
    # memory); equal to raysearch.metrics.calibration_summary to float rounding
    meter = CalibrationMeter(int(logits.shape[1]), n_bins=n_bins,
                             aece_samples=max(int(labels.shape[0]), 1))  # exact adaptive ECE
    meter.update(softmax(numpy_logits(logits)), labels.cpu().numpy())
    values = meter.compute()
    return {f"{split}_{key}": float(values[key]) for key in SUMMARY_KEYS}


def _estimators(logits: Tensor, labels: Tensor, split: str, n_bins: int) -> dict[str, float]:
    """``{split}_{key}`` of the estimators and of the other table metrics (final model only).

    :func:`raysearch.metrics.estimator_summary`, then :func:`raysearch.metrics.table_summary`
    for the table metrics (``group_keys("table")``) that :func:`summary` and the estimators do
    not give (``ece_100``, ``overconfidence``, ``underconfidence``, ``average_confidence``).
    """
    from raysearch.metrics import estimator_summary, softmax, table_summary

    probs, y = softmax(numpy_logits(logits)), labels.cpu().numpy()
    values = estimator_summary(probs, y, n_bins=n_bins)
    logged = (*group_keys("summary"), *group_keys("estimator"))
    extra = tuple(key for key in group_keys("table") if key not in logged)
    values.update(table_summary(probs, y, n_bins=n_bins, keys=extra))
    return {f"{split}_{key}": float(value) for key, value in values.items()}


def _shift_eval(result: TrainResult, cfg: RunConfig, test: Any, shift_set: Any,
                posthoc: tuple[str, ...], out: Path) -> dict[str, float]:
    """Evaluate the trained model on the corrupted test subsample; write the table and plot.

    The entries of a released set (``--shift-data``) are read here, one at a time; every entry
    goes through the test split's normalisation (``with_images``).
    """
    from raysearch.calibration import fit_calibrator
    from raysearch.metrics.shift import ShiftSet, evaluate_shift
    from raysearch.training import plots
    from raysearch.training.loop import evaluate

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
    frame.to_csv(out / SHIFT_TABLE, index=False)  # every corruption, the held-out ones too
    # the boxes are the benchmark's corruptions, as the means are
    benchmark = frame[~frame["corruption"].isin(report.held_out)]
    plots.shift_plot(benchmark, out / SHIFT_PLOT, calibrator=name,
                     title=f"{cfg.loss.name} on {cfg.data.name}: corrupted test set")
    return report.as_metrics()


# -- dense helpers ----------------------------------------------------------------------------

def _dense_eval(net: nn.Module, source: Source, ctx: EvalContext, after: str, *, final: bool,
                temperatures: tuple[float, ...] = (1.0,)) -> Any:
    """Stream a segmentation split through `net` (:func:`raysearch.training.dense.evaluate_dense`).

    With `final` it also keeps the temperature-scaling pixel sample and the confidence-map
    images. Batches of ``cfg.batch_size`` images; every DDP rank evaluates the whole split.

    Raises:
        DivergedError: if the logits are not finite (`after` says when).
    """
    from raysearch.training.dense import KEEP_IMAGES, TS_SAMPLE_PIXELS, evaluate_dense

    cfg, data = ctx.cfg, ctx.data
    order = torch.arange(source.n)
    batches = ((xb, yb) for xb, yb, _ in source.batches(order, cfg.batch_size, None))
    try:
        return evaluate_dense(
            net, batches, num_classes=data.num_classes, ignore_index=data.ignore_index,
            n_bins=cfg.ece_bins, temperatures=temperatures,
            sample_pixels=TS_SAMPLE_PIXELS if final else 0,
            keep_images=KEEP_IMAGES if final else 0, seed=cfg.split_seed,
            prepare=ctx.amp.prepare, label=ctx.label)
    except ValueError as exc:
        if "not finite" in str(exc):
            raise DivergedError(f"the model's logits are not finite ({after})") from None
        raise


def _dense_metrics(meter: Any, split: str, suffix: str = "",
                   keys: tuple[str, ...] = DENSE_KEYS) -> dict[str, float]:
    """``{split}_{key}{suffix}`` of a meter's :meth:`compute` (the keys it has)."""
    values = meter.compute()
    return {f"{split}_{k}{suffix}": float(values[k]) for k in keys if k in values}
