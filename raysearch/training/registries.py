"""The registry of each kind, by its name (``models``, ``datasets``, ``losses``, ...).

Each registry lives with its built-ins (:data:`raysearch.training.models.MODEL_REGISTRY`,
:data:`raysearch.training.data.DATASET_REGISTRY`, :data:`raysearch.losses.LOSS_REGISTRY`,
:data:`raysearch.calibration.CALIBRATOR_REGISTRY`,
:data:`raysearch.training.optim.OPTIMIZER_REGISTRY`)
and the :class:`~raysearch.registry.Registry` class knows none of them; this module imports each
on first use (their imports are heavy). Metrics have no built-in names: their registry holds the
installed plug-ins' (entry-point group ``raysearch.metrics``) and import strings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from raysearch.registry import Registry, object_label

__all__ = ["KINDS", "METRIC_REGISTRY", "metric_functions", "registry"]

#: The kinds, in the order ``raysearch list`` offers them.
KINDS = ("models", "datasets", "losses", "calibrators", "metrics", "optimizers")

#: A user's metric functions ``fn(probs, labels) -> float`` (plug-ins and import strings).
METRIC_REGISTRY = Registry("metrics", {})


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
        return METRIC_REGISTRY
    if kind == "optimizers":
        from raysearch.training.optim import OPTIMIZER_REGISTRY

        return OPTIMIZER_REGISTRY
    raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")


def metric_functions(specs: Iterable[Any],
                     components: Mapping[str, Mapping[str, Any]] | None = None,
                     ) -> dict[str, Callable[..., float]]:
    """``{name: fn}`` of a user's metrics, each ``fn(probs, labels) -> float``.

    Args:
        specs: registered names, import strings ``package.module:fn`` or functions.
        components: the Python API's objects by label (``{"metrics": {label: fn}}``).

    Returns:
        The functions by the name their values are logged under (``val_<name>``): the last
        part of the name given, or the function's ``__name__``.

    Raises:
        ValueError: (a :class:`~raysearch.registry.RegistryError`) for a name that does not
            resolve, or one line if what it names is not a function.
    """
    from raysearch.config import metric_name

    given = (components or {}).get("metrics")
    out = {}
    for spec in specs:
        fn = spec if callable(spec) else METRIC_REGISTRY.get(spec, components=given)
        if not callable(fn):
            label = spec if isinstance(spec, str) else object_label(spec)
            raise ValueError(f"metric {label!r} is a {type(fn).__name__}, expected a function "
                             "fn(probs, labels) -> float")
        out[metric_name(spec)] = fn
    return out
