"""The registry of each kind, by its name (``models``, ``datasets``, ``losses``, ...).

Each registry lives with its built-ins (:data:`raysearch.training.models.MODEL_REGISTRY`,
:data:`raysearch.training.data.DATASET_REGISTRY`, :data:`raysearch.losses.LOSS_REGISTRY`,
:data:`raysearch.calibration.CALIBRATOR_REGISTRY`, :data:`raysearch.metrics.METRIC_REGISTRY`,
:data:`raysearch.training.optim.OPTIMIZER_REGISTRY`)
and the :class:`~raysearch.registry.Registry` class knows none of them; this module imports each
on first use (their imports are heavy). The metrics registry holds the built-in metrics (every
trial logs them) and the installed plug-ins (entry-point group ``raysearch.metrics``): a user's
metric is a plug-in, an import string or a function, named in ``metrics=`` / ``--metric``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from raysearch.registry import Entry, Registry, object_label

__all__ = ["KINDS", "check_config_names", "describe", "metric_functions", "registry"]

#: The kinds, in the order ``raysearch list`` offers them.
KINDS = ("models", "datasets", "losses", "calibrators", "metrics", "optimizers")

def registry(kind: str) -> Registry:
    """The registry of `kind`, one of :data:`KINDS`.

    Raises:
        ValueError: for an unknown kind.
    """
    if kind == "models":
        from raysearch.training.models import MODEL_REGISTRY

        return MODEL_REGISTRY
    if kind == "datasets":
        from raysearch.training.data import DATASET_REGISTRY

        return DATASET_REGISTRY
    if kind == "losses":
        from raysearch.losses import LOSS_REGISTRY

        return LOSS_REGISTRY
    if kind == "calibrators":
        from raysearch.calibration import CALIBRATOR_REGISTRY

        return CALIBRATOR_REGISTRY
    if kind == "metrics":
        from raysearch.metrics import METRIC_REGISTRY

        return METRIC_REGISTRY
    if kind == "optimizers":
        from raysearch.training.optim import OPTIMIZER_REGISTRY

        return OPTIMIZER_REGISTRY
    raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")


def metric_functions(specs: Iterable[Any],
                     components: Mapping[str, Mapping[str, Any]] | None = None,
                     *, num_classes: int | None = None,
                     ) -> dict[str, Callable[..., float]]:
    """``{name: fn}`` of a user's metrics, each ``fn(probs, labels) -> float``.

    Args:
        specs: registered names, import strings ``package.module:fn`` or functions.
        components: the Python API's objects by label (``{"metrics": {label: fn}}``).
        num_classes: the data's K: each function is then called once on a small probability
            matrix of K classes (:func:`raysearch.training.contracts.check_metric`) to check
            that it returns a finite float. None (default): not called.

    Returns:
        The functions by the name their values are logged under (``val_<name>``): the last
        part of the name given, or the function's ``__name__``.

    Raises:
        ValueError: (a :class:`~raysearch.registry.RegistryError`) for a name that does not
            resolve, one line for a built-in metric or a function logged under a built-in's
            name (every trial logs it already), one line if what it names is not a function,
            and with `num_classes` one line naming a function that raises or does not return
            a finite float on the check's inputs.
    """
    from raysearch.config import metric_name
    from raysearch.metrics import BUILTIN_METRICS, METRIC_REGISTRY

    given = (components or {}).get("metrics")
    out = {}
    for spec in specs:
        name = metric_name(spec)
        label = spec if isinstance(spec, str) else object_label(spec)
        if spec == name and name in BUILTIN_METRICS:
            raise ValueError(f"metric {name!r} is built in: every trial logs val_{name} "
                             "already (`raysearch list metrics` shows them)")
        if name in BUILTIN_METRICS:
            raise ValueError(f"metric {label!r} would be logged as val_{name}, the name of a "
                             "built-in metric; rename the function (`raysearch list metrics` "
                             "shows the built-ins)")
        fn = spec if callable(spec) else METRIC_REGISTRY.get(spec, components=given)
        if not callable(fn):
            raise ValueError(f"metric {label!r} is a {type(fn).__name__}, expected a function "
                             "fn(probs, labels) -> float")
        if num_classes is not None:
            from raysearch.training.contracts import check_metric

            check_metric(fn, f"metric {label!r}", num_classes)
        out[name] = fn
    return out


def check_config_names(cfg: Any, metrics: Iterable[Any] = (),
                       components: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Resolve a run config's loss, model, dataset and optimizer and its metrics by name.

    What ``raysearch train`` and :func:`raysearch.train` check first, so that a name that does
    not import is the one error, before any note about the versions an export was made with.

    Args:
        cfg: the :class:`~raysearch.config.RunConfig`.
        metrics: the user's metric functions (names, import strings or callables).
        components: the Python API's objects by kind and label.

    Raises:
        ValueError: (a :class:`~raysearch.registry.RegistryError`) one line for a name that is
            unknown or does not import.
    """
    components = components or {}
    for kind, section in (("losses", cfg.loss), ("models", cfg.model), ("datasets", cfg.data),
                          ("optimizers", cfg.optimizer)):
        registry(kind).get(section.name, components=components.get(kind))
    metric_functions(metrics, components)


def describe(kind: str, entry: Entry) -> str:
    """What ``raysearch list`` shows after a registered name and its source ('' if nothing).

    For a metric, its direction (``max`` or ``min``) and what it is; a plug-in metric is not
    imported to say so.
    """
    if kind != "metrics":
        return ""
    from raysearch.metrics import MetricSpec

    spec = entry.target
    if not isinstance(spec, MetricSpec):
        return ""
    return f"{spec.direction}  {spec.description}"
