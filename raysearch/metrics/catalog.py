"""What each metric is: its name, direction, input and where it is computed.

A built-in metric is one function decorated with :func:`builtin_metric` (in
:mod:`raysearch.metrics.builtin`): a kernel that reads a split's validated arrays
(:class:`Scores`) and returns a float. The decorator records a :class:`MetricSpec` in
:data:`BUILTIN_METRICS`, in the order of registration, and every list of metric names is read
from there (:func:`group_keys`): the metrics of the summary, of a segmentation split, of the
papers' result tables, the ones measured after each post-hoc calibrator, the estimators, and
the kernels of :meth:`~raysearch.metrics.meter.CalibrationMeter.table`.

A user's metric is a function ``fn(probs, labels) -> float`` given to a sweep or a run by name
(``metrics=``, ``--metric``); :func:`metric` declares its direction (and whether it reads
logits) on the function. :func:`metric_direction` says whether a logged metric is maximised or
minimised; :func:`user_metric_values` computes a user's metrics on a split.

Plain Python and NumPy; imports no other module of the package.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

__all__ = [
    "BUILTIN_METRICS",
    "DIRECTIONS",
    "GROUPS",
    "INPUTS",
    "MetricSpec",
    "Scores",
    "builtin_metric",
    "check_keys",
    "group_keys",
    "metric",
    "metric_direction",
    "metric_spec",
    "streamed_metric",
    "user_metric_values",
]

#: Directions of a metric: lower is better (``min``) or higher is better (``max``).
DIRECTIONS = ("min", "max")
#: What a metric reads: the softmax probabilities or the logits of a split.
INPUTS = ("probs", "logits")
#: The lists of metric names :func:`group_keys` derives from the registrations.
GROUPS = ("summary", "dense", "table", "calibrated", "estimator", "kernels")
#: Floor on probabilities before the log that turns them into logits (a logits metric after a
#: post-hoc calibrator reads ``log(max(p, 1e-12))``, which has the calibrator's softmax).
PROB_FLOOR = 1e-12


@dataclass(frozen=True, eq=False)
class Scores:
    """A split's validated arrays: what the kernel of a built-in metric reads.

    Attributes:
        probs: (N, K) float probabilities (rows sum to 1), float32 or float64.
        labels: (N,) intp class indices in [0, K).
        conf: (N,) top-1 confidence of every sample, in the dtype of ``probs``.
        hits: (N,) bool, whether the top-1 class (first on ties) is the label.
        n_bins: the run's number of bins M >= 1 (a metric's ``bins=None``).
    """

    probs: np.ndarray
    labels: np.ndarray
    conf: np.ndarray
    hits: np.ndarray
    n_bins: int


@dataclass(frozen=True, eq=False)
class MetricSpec:
    """One registered metric.

    Attributes:
        name: the name it is logged under (``{split}_{name}``).
        direction: ``"min"`` (lower is better) or ``"max"``.
        reads: ``"probs"`` or ``"logits"``.
        streams: whether :class:`~raysearch.metrics.meter.CalibrationMeter` computes it from
            its per-bin sums (:meth:`~raysearch.metrics.meter.CalibrationMeter.compute`), so a
            trial logs it every epoch (and segmentation splits have it).
        table: whether it is one of the result-table metrics a classification trial logs on
            its final model and after each post-hoc calibrator.
        estimator: its place (1, 2, ...) among the calibration estimators of
            :func:`~raysearch.metrics.estimator_summary`, or None.
        options: the keywords its kernel is called with (``bins``: None for the run's M;
            ``binning``, ``norm``, ...).
        kernel: ``kernel(scores, **options) -> float``, or None for a metric computed only
            from the meter's sums (``miou``, ``ece_released``).
        column: the papers' table columns it reproduces ('' if none).
        description: one line saying what it is.
    """

    name: str
    direction: str
    reads: str = "probs"
    streams: bool = False
    table: bool = False
    estimator: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    kernel: Callable[..., float] | None = None
    column: str = ""
    description: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a metric name must be an identifier, got {self.name!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"metric {self.name!r}: `direction` must be 'min' or 'max', got "
                             f"{self.direction!r}")
        if self.reads not in INPUTS:
            raise ValueError(f"metric {self.name!r}: `reads` must be 'probs' or 'logits', got "
                             f"{self.reads!r}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def compute(self, scores: Scores) -> float:
        """The kernel on `scores`, with this metric's options (``bins=None``: the run's M).

        Raises:
            ValueError: for a metric without a kernel (computed only by the meter's sums).
        """
        if self.kernel is None:
            raise ValueError(f"metric {self.name!r} is computed from the meter's sums only")
        options = dict(self.options)
        if "bins" in options and options["bins"] is None:
            options["bins"] = scores.n_bins
        return self.kernel(scores, **options)

    def options_text(self) -> str:
        """The options in one line (``bins=M, binning=equal_width, norm=l1``)."""
        return ", ".join(f"{key}={'M' if value is None else value}"
                         for key, value in self.options.items())


#: The built-in metrics by name, in the order they were registered (:func:`builtin_metric`).
BUILTIN_METRICS: dict[str, MetricSpec] = {}


def _register(spec: MetricSpec) -> MetricSpec:
    if spec.name in BUILTIN_METRICS:
        raise ValueError(f"metric {spec.name!r} is registered twice")
    BUILTIN_METRICS[spec.name] = spec
    return spec


def builtin_metric(name: str, direction: str, *, streams: bool = False, table: bool = False,
                   estimator: int | None = None, column: str = "",
                   **options: Any) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Register the decorated kernel as the built-in metric `name` (see :class:`MetricSpec`).

    The kernel is ``kernel(scores: Scores, **options) -> float`` (it reads the probabilities of
    `scores`: ``reads="probs"``); its docstring's first line is the metric's description. A
    metric with ``table=True`` is logged by every classification trial on its final model
    (``val_<name>``, ``test_<name>``) and after each post-hoc calibrator
    (``test_<name>_<calibrator>``), and :func:`~raysearch.metrics.table_summary` computes it.

    Args:
        name: the logged name (an identifier, not yet registered).
        direction: ``"min"`` or ``"max"``.
        streams: computed by the meter's sums too (see :class:`MetricSpec`). Defaults to False.
        table: a result-table metric. Defaults to False.
        estimator: its place among :func:`~raysearch.metrics.estimator_summary`'s keys.
        column: the papers' table columns it reproduces.
        **options: the keywords of the kernel (``bins=None``: the run's M).

    Raises:
        ValueError: for a name registered twice, or a bad `direction`.
    """

    def register(kernel: Callable[..., float]) -> Callable[..., float]:
        doc = (kernel.__doc__ or "").strip().splitlines()
        _register(MetricSpec(name, direction, "probs", streams, table, estimator, options,
                             kernel, column, doc[0] if doc else ""))
        return kernel

    return register


def streamed_metric(name: str, direction: str, *, description: str, column: str = "",
                    **options: Any) -> MetricSpec:
    """Register a metric that only the meter's sums give (no kernel over samples).

    Raises:
        ValueError: as :func:`builtin_metric`.
    """
    return _register(MetricSpec(name, direction, streams=True, options=options, column=column,
                                description=description))


def group_keys(group: str) -> tuple[str, ...]:
    """The names of the registered built-in metrics of `group`, in order.

    * ``summary``: metrics with a kernel that the meter's sums give too (logged every epoch);
    * ``dense``: every metric the meter's sums give (a segmentation split);
    * ``table``: the result-table metrics (``table=True``), in the order registered;
    * ``calibrated``: the ``summary`` metrics, then the other ``table`` ones (logged after
      each post-hoc calibrator);
    * ``estimator``: the metrics with an ``estimator`` place, by that place;
    * ``kernels``: the ``calibrated`` metrics, then every other metric with a kernel (the keys
      of :meth:`~raysearch.metrics.meter.CalibrationMeter.table`).

    Raises:
        ValueError: for an unknown group.
    """
    specs = list(BUILTIN_METRICS.values())
    if group == "dense":
        return tuple(s.name for s in specs if s.streams)
    if group == "summary":
        return tuple(s.name for s in specs if s.streams and s.kernel is not None)
    if group == "table":
        return tuple(s.name for s in specs if s.table)
    if group == "calibrated":
        summary = group_keys("summary")
        return (*summary, *(key for key in group_keys("table") if key not in summary))
    if group == "estimator":
        ranked = sorted((s for s in specs if s.estimator is not None), key=lambda s: s.estimator)
        return tuple(s.name for s in ranked)
    if group == "kernels":
        calibrated = group_keys("calibrated")
        return (*calibrated, *(s.name for s in specs
                               if s.kernel is not None and s.name not in calibrated))
    raise ValueError(f"unknown metric group {group!r}; known: {', '.join(GROUPS)}")


def check_keys(keys: str | Iterable[str], known: tuple[str, ...]) -> tuple[str, ...]:
    """`keys` as a tuple (one name may be a string).

    Raises:
        ValueError: naming every key not in `known`, and listing `known`.
    """
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    unknown = [key for key in keys if key not in known]
    if unknown:
        raise ValueError(
            f"unknown table metric(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
        )
    return keys


# -- a user's metrics ---------------------------------------------------------------------------


def metric(fn: Callable[..., float] | None = None, *, direction: str,
           reads: str = "probs") -> Any:
    """Declare a user's metric function: whether it is maximised, and what it reads.

    Use as ``@metric(direction="max")`` above ``def top2(probs, labels) -> float``. The
    function is returned unchanged, with a :class:`MetricSpec` as its ``metric_spec``
    attribute: a sweep's ``--objective val_top2`` (or ``val_top2_ts``) is then maximised
    without ``:max``.

    Args:
        fn: the function, when called as ``metric(fn, direction=...)``; None (default) as a
            decorator.
        direction: ``"min"`` or ``"max"``.
        reads: ``"probs"`` (default: ``fn(probs (N, K) float64, labels (N,) int64)``) or
            ``"logits"`` (``fn(logits (N, K) float64, labels)``).

    Returns:
        `fn` with its ``metric_spec``, or the decorator that returns it.

    Raises:
        ValueError: for a bad `direction` or `reads`.
    """

    def declare(function: Callable[..., float]) -> Callable[..., float]:
        name = getattr(function, "__name__", type(function).__name__)
        function.metric_spec = MetricSpec(name if name.isidentifier() else "metric",
                                          direction, reads,
                                          description=_first_line(function.__doc__))
        return function

    return declare if fn is None else declare(fn)


def _first_line(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0] if lines else ""


def metric_spec(fn: Any) -> MetricSpec | None:
    """The :class:`MetricSpec` a user's function declares with :func:`metric` (or None)."""
    spec = getattr(fn, "metric_spec", None)
    return spec if isinstance(spec, MetricSpec) else None


def metric_direction(name: str, *, calibrators: Iterable[str] = (),
                     functions: Mapping[str, Any] | None = None) -> str:
    """Whether a logged metric is maximised (``"max"``) or minimised (``"min"``).

    The name may carry a split prefix (``val_``, ``test_``) and a post-hoc calibrator's
    suffix (``_ts``, of one of `calibrators`). A built-in metric has its registered
    direction; a user's function of `functions` the one it declares (:func:`metric`); any
    other name is maximised when it ends in ``accuracy`` or ``miou``.

    Args:
        name: the metric (``val_accuracy``, ``ece_ts``, ``top2``).
        calibrators: the post-hoc calibrators whose suffix to strip.
        functions: a user's metric functions by logged name.
    """
    base = name
    for prefix in ("val_", "test_"):
        if base.startswith(prefix):
            base = base[len(prefix):]
            break
    for calibrator in calibrators:
        if base.endswith(f"_{calibrator}") and base != f"_{calibrator}":
            base = base[: -len(calibrator) - 1]
            break
    if base in BUILTIN_METRICS:
        return BUILTIN_METRICS[base].direction
    spec = metric_spec((functions or {}).get(base))
    if spec is not None:
        return spec.direction
    return "max" if base.endswith(("accuracy", "miou")) else "min"


def user_metric_values(fns: Mapping[str, Callable[..., float]], probs: np.ndarray,
                       labels: np.ndarray, *, logits: np.ndarray | None = None,
                       where: str = "") -> dict[str, float]:
    """``{name: float(fn(probs, labels))}`` of a user's metric functions on one split.

    A function that declares ``reads="logits"`` (:func:`metric`) gets `logits`, or
    ``log(max(probs, 1e-12))`` when none are given (probabilities of a post-hoc calibrator).

    Args:
        fns: the functions by logged name.
        probs: (N, K) float64 probabilities.
        labels: (N,) int64 labels.
        logits: (N, K) float64 logits of the same samples, or None.
        where: the split, for messages (``"the val split"``).

    Raises:
        ValueError: one line naming the metric if it raises or returns something that is not
            a number.
    """
    out = {}
    for name, fn in fns.items():
        spec = metric_spec(fn)
        scores = probs
        if spec is not None and spec.reads == "logits":
            scores = logits if logits is not None else np.log(np.maximum(probs, PROB_FLOOR))
        try:
            value = float(fn(scores, labels))
        except Exception as exc:  # noqa: BLE001 (a user's metric: one line naming it)
            raise ValueError(f"metric {name!r} raised {type(exc).__name__} on {where or 'a split'}"
                             f": {' '.join(str(exc).split())}") from None
        out[name] = value
    return out
