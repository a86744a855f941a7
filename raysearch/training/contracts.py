"""The contracts of a user's loss, metric and post-hoc calibrator, checked on tiny inputs.

A sweep's driver runs these before Ray starts (:func:`raysearch.tune.plan.make_plan`), so that
code that breaks its contract is one line naming it, not a sweep in which every trial fails:

- :func:`check_loss`: the loss on logits of two samples of the data (random, shaped like the
  model's output) with their real targets and the side inputs it declares must return a finite
  scalar whose gradient reaches the logits;
- :func:`check_metric`: a metric function on a small probability matrix of the data's K (on
  logits when it declares ``reads="logits"``) must return a finite number;
- :func:`check_calibrator`: a calibrator must ``fit`` a small logit matrix (every class
  present) and ``predict_proba`` finite rows that sum to 1.

The inputs are seeded (the same on every call) and the messages are one line each. Plain
PyTorch and NumPy: no Ray, no MLflow.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from raysearch.training.data import DatasetSplits

__all__ = ["CALIBRATOR_SAMPLES", "METRIC_SAMPLES", "check_calibrator", "check_loss",
           "check_metric", "loss_check_inputs"]

#: Rows of the probability matrix a metric is checked on (at least K, so every class occurs).
METRIC_SAMPLES = 8
#: Rows of the logit matrix a calibrator is checked on (at least 4 K: every class 4 times).
CALIBRATOR_SAMPLES = 40
#: Tolerance on the row sums of a calibrator's probabilities (as :mod:`raysearch.metrics`).
_ROW_SUM_TOLERANCE = 1e-3
#: Seed of the check inputs.
_SEED = 0


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _what(value: Any) -> str:
    """``a Tensor of shape (2,)``, ``a float``, ``None``: what a function returned."""
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    name = type(value).__name__
    if shape is not None:
        return f"a {name} of shape {tuple(int(d) for d in shape)}"
    return f"a {name}"


# -- losses ------------------------------------------------------------------------------------


def loss_check_inputs(loss_fn: Any, data: DatasetSplits, label: str
                      ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """The inputs :func:`check_loss` calls `loss_fn` with: logits, targets and side inputs.

    Targets: those of the first two training samples (the first twice when the split holds
    one, or when their shapes differ), int64 ``(2,)`` or ``(2, *target)`` on the CPU.
    Logits: float32 ``(2, K, *target)`` drawn from a seeded normal, with ``requires_grad``.
    Side inputs (the loss's ``side_inputs``, :mod:`raysearch.training.data.side`):
    ``objectness`` float32 (2,) in [0, 1], ``context`` bool (2,) (when the loss's
    ``context_fraction`` > 0), ``index`` int64 ``[0, 1]``.

    Raises:
        ValueError: one line naming the loss if its ``side_inputs`` are malformed or name an
            input no data provides.
    """
    from raysearch.training.data.side import PROVIDED, loss_side_inputs

    try:
        names = loss_side_inputs(loss_fn)
    except ValueError as exc:
        raise ValueError(f"{label}: {exc}") from None
    unknown = [name for name in names if name not in PROVIDED]
    if unknown:
        raise ValueError(f"{label} takes {', '.join(unknown)} per sample, which no data "
                         f"provides (provided: {', '.join(PROVIDED)})")
    first = torch.as_tensor(data.train[0][1]).long().cpu()
    second = torch.as_tensor(data.train[1][1]).long().cpu() if len(data.train) > 1 else first
    targets = torch.stack([first, second if second.shape == first.shape else first])
    generator = torch.Generator().manual_seed(_SEED)
    logits = torch.randn((2, int(data.num_classes), *first.shape), generator=generator)
    side: dict[str, Tensor] = {}
    if "objectness" in names:
        side["objectness"] = torch.rand(2, generator=generator)
        if float(getattr(loss_fn, "context_fraction", 0.0)) > 0:
            side["context"] = torch.zeros(2, dtype=torch.bool)
    if "index" in names:
        side["index"] = torch.arange(2, dtype=torch.int64)
    return logits.requires_grad_(True), targets, side


def check_loss(loss_fn: Any, data: DatasetSplits, label: str) -> None:
    """Call a built loss as a training step would and check what it returns.

    ``loss_fn(logits, targets, **side)`` on the inputs of :func:`loss_check_inputs` must return
    a tensor of one element (the batch mean; a 0-d tensor by the contract), finite, that
    requires grad, whose gradient reaches the logits and is finite.

    Args:
        loss_fn: the loss, built as a trial builds it
            (:func:`raysearch.training.run_parts.build_run_loss`).
        data: the sweep's splits (K and two training targets).
        label: names the loss in messages (``loss 'mypkg.losses:PerSample'``).

    Raises:
        ValueError: one line naming the loss and what is wrong: it raised (its message), it
            returned something that is not a tensor, a tensor of more than one element ("of
            shape (2,), expected a scalar (the batch mean)"), a non-finite value, a value that
            does not depend on the logits, or a non-finite gradient.
    """
    logits, targets, side = loss_check_inputs(loss_fn, data, label)
    given = f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)}"
    try:
        out = loss_fn(logits, targets, **side)
    except Exception as exc:  # noqa: BLE001 (a user's loss: one line naming it)
        raise ValueError(f"{label} raised {_one_line(exc)} (called on {given})") from None
    if not isinstance(out, Tensor):
        raise ValueError(f"{label} returned {_what(out)} on {given}, expected a scalar tensor "
                         "(the batch mean)")
    if out.numel() != 1:
        raise ValueError(f"{label} returned a tensor of shape {tuple(out.shape)}, expected a "
                         f"scalar (the batch mean) (called on {given})")
    if not bool(torch.isfinite(out.detach()).all()):
        raise ValueError(f"{label} returned {float(out.detach().reshape(()))} on {given}, "
                         "expected a finite value")
    if not out.requires_grad:
        raise ValueError(f"{label} returned a value that does not depend on the logits "
                         "(requires_grad is False: detached, or computed outside autograd); "
                         "training needs its gradient")
    (grad,) = torch.autograd.grad(out.reshape(()), logits, allow_unused=True)
    if grad is None:
        raise ValueError(f"{label}: no gradient reaches the logits from its value (is it "
                         "computed from a detached copy?); training needs it")
    if not bool(torch.isfinite(grad).all()):
        raise ValueError(f"{label}: its gradient with respect to the logits is not finite "
                         f"(NaN or inf) on {given}")


# -- metrics -----------------------------------------------------------------------------------


def _metric_inputs(num_classes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded ``(logits, probs, labels)``: (N, K) float64 twice and (N,) int64 0..K-1, cycled.

    N is :data:`METRIC_SAMPLES`, or K when larger, so every class occurs.
    """
    from raysearch.metrics import softmax

    n = max(METRIC_SAMPLES, num_classes)
    rng = np.random.default_rng(_SEED)
    labels = np.arange(n, dtype=np.int64) % num_classes
    logits = rng.normal(size=(n, num_classes)) * 2.0
    logits[np.arange(n), labels] += 1.0
    return logits, softmax(logits).astype(np.float64), labels


def check_metric(fn: Callable[..., Any], label: str, num_classes: int) -> None:
    """Call a user's metric function on a small probability matrix and check its value.

    ``fn(probs, labels)``: probs (N, K) float64 (a softmax: rows sum to 1), labels (N,) int64
    covering 0..K-1, N = max(8, K); a function declaring ``reads="logits"``
    (:func:`raysearch.metrics.metric`) gets the (N, K) float64 logits. It must return a real
    number (a Python or NumPy scalar), finite.

    Args:
        fn: the metric function.
        label: names it in messages (``metric 'mypkg.metrics:gap'``).
        num_classes: K, the data's number of classes (>= 2).

    Raises:
        ValueError: one line naming the metric if it raises (its message), or returns
            something that is not a number (a tensor, an array, None) or a NaN or inf.
    """
    from raysearch.metrics.catalog import metric_spec

    logits, probs, labels = _metric_inputs(num_classes)
    spec = metric_spec(fn)
    reads = "logits" if spec is not None and spec.reads == "logits" else "probs"
    given = (f"{reads} {logits.shape} float64 and labels {labels.shape} int64 "
             f"(NumPy arrays)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            value = fn(logits if reads == "logits" else probs, labels)
    except Exception as exc:  # noqa: BLE001 (a user's metric: one line naming it)
        raise ValueError(f"{label} raised {_one_line(exc)} on {given}; a metric is "
                         "fn(probs, labels) -> float on NumPy arrays") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{label} returned {_what(value)} on {given}, expected a float "
                         "(use float(...) on the result)")
    if not np.isfinite(float(value)):
        raise ValueError(f"{label} returned {float(value)} on {given}, expected a finite "
                         "float")


# -- calibrators -------------------------------------------------------------------------------


def _calibrator_inputs(num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (N, K) float64 logits and (N,) int64 labels, every class 4 times or more.

    N = max(40, 4 K); the labels' logit is raised by 2 over N(0, 2^2) noise (about 60% top-1
    accuracy for K = 10: not separable, so every calibrator has a finite optimum).
    """
    n = max(CALIBRATOR_SAMPLES, 4 * num_classes)
    rng = np.random.default_rng(_SEED)
    labels = np.arange(n, dtype=np.int64) % num_classes
    logits = rng.normal(size=(n, num_classes)) * 2.0
    logits[np.arange(n), labels] += 2.0
    return logits, labels


def check_calibrator(name: Any, num_classes: int, *,
                     components: Mapping[str, Any] | None = None,
                     params: Mapping[str, Any] | None = None) -> None:
    """Fit a post-hoc calibrator on a small logit matrix and check its probabilities.

    ``fit_calibrator(name, logits, labels)`` (its default keywords, as a trial fits it) on
    (N, K) float64 logits with every class present, N = max(40, 4 K), then
    ``predict_proba(logits)`` must be an (N, K) array of real numbers, finite, in [0, 1], each
    row summing to 1 (within 1e-3). Warnings of the fit are silenced.

    Args:
        name: the calibrator's registered name, import string or class.
        num_classes: K, the data's number of classes (>= 2).
        components: objects given through the Python API by label (``{"mine": MyCal}``).
        params: keywords of the fit (:func:`raysearch.calibration.fit_calibrator`); None
            (default): none, as a trial fits it.

    Raises:
        ValueError: one line naming the calibrator if it cannot be resolved, its ``fit`` or
            ``predict_proba`` raises (the message), or the probabilities break the contract.
    """
    from raysearch.calibration import CALIBRATOR_REGISTRY, fit_calibrator
    from raysearch.registry import object_label

    label = f"calibrator {name if isinstance(name, str) else object_label(name)!r}"
    target = CALIBRATOR_REGISTRY.get(name, components=components)
    if isinstance(name, str) and not (components and name in components):
        target = name  # fit_calibrator resolves it and names it as given
    logits, labels = _calibrator_inputs(num_classes)
    given = f"logits {logits.shape} float64 with labels 0..{num_classes - 1}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calibrator = fit_calibrator(target, logits, labels, **dict(params or {}))
            probs = calibrator.predict_proba(logits.copy())
    except Exception as exc:  # noqa: BLE001 (a user's calibrator: one line naming it)
        message = " ".join(str(exc).split())
        if message.startswith(label):
            raise ValueError(f"{message} (fitted on {given})") from None
        raise ValueError(f"{label} failed on {given}: {_one_line(exc)}") from None
    _check_probs(probs, label, logits.shape)


def _check_probs(probs: Any, label: str, shape: tuple[int, int]) -> None:
    """Refuse what a calibrator's ``predict_proba`` returned unless it is (N, K) probabilities."""
    from raysearch.metrics.checks import to_numpy

    head = f"{label}: predict_proba of {shape} logits returned"
    if probs is None or not hasattr(probs, "__len__"):
        raise ValueError(f"{head} {_what(probs)}, expected an (N, K) array of probabilities")
    try:
        array = to_numpy(probs)
    except (TypeError, ValueError) as exc:  # a ragged list, an object numpy cannot read
        raise ValueError(f"{head} {_what(probs)} that is not an array: {_one_line(exc)}"
                         ) from None
    if array.dtype == np.bool_ or not (np.issubdtype(array.dtype, np.floating)
                                       or np.issubdtype(array.dtype, np.integer)):
        raise ValueError(f"{head} {array.dtype} values, expected probabilities (floats)")
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{head} shape {tuple(array.shape)}, expected {tuple(shape)} "
                         "(one row of K probabilities per sample)")
    array = array.astype(np.float64)
    bad = int((~np.isfinite(array)).sum())
    if bad:
        raise ValueError(f"{head} {bad} non-finite values (NaN or inf)")
    if array.min() < -1e-6 or array.max() > 1 + 1e-6:
        raise ValueError(f"{head} values in [{array.min():.6g}, {array.max():.6g}], expected "
                         "probabilities in [0, 1]")
    worst = float(np.abs(array.sum(axis=1) - 1.0).max())
    if worst > _ROW_SUM_TOLERANCE:
        raise ValueError(f"{head} rows that do not sum to 1 (off by up to {worst:.3g})")
