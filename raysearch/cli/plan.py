"""``raysearch sweep ... --dry-run``: the fully resolved sweep, with nothing started.

:func:`plan_sweep` does what a sweep's driver does before Ray starts (the recipe, every name, the
data, the models on the meta device, the losses and optimizers: :func:`prepare_data`) and returns
what the sweep would run as plain data: the space and its searched parameters, the recipe and
its source, the data set with its sizes, the resources, every fixed value of a trial's config,
and the number of trials. No Ray, no MLflow: nothing is written and no process is started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raysearch.config import _plain
from raysearch.tune.prepare import prepare_data
from raysearch.tune.recipes import sweep_dataset, with_recipe
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SearchSpace, load_space

__all__ = ["SEARCHED", "plan_sweep", "sweep_dataset", "with_recipe"]  # the last two: recipes

#: What the resolved config shows for a value the sweep searches (its range is under
#: ``searched``).
SEARCHED = "<searched>"


def _mark(low: Any, high: Any) -> Any:
    """`low` with every leaf that differs from `high` replaced by :data:`SEARCHED`."""
    if isinstance(low, Mapping) and isinstance(high, Mapping):
        return {k: _mark(v, high.get(k)) for k, v in low.items()}
    return low if low == high else SEARCHED


def plan_sweep(space: str | SearchSpace, settings: SweepSettings, *,
               components: dict[str, dict[str, Any]] | None = None,
               say: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The resolved sweep as plain data (the ``--dry-run`` YAML), starting nothing.

    Args:
        space: a bundled space name, a YAML path or a loaded space.
        settings: the sweep's settings (the CLI's options).
        components: objects given through the Python API (as for a sweep).
        say: progress lines (default: none).

    Returns:
        ``{"sweep": ..., "recipe": ..., "data": ..., "resources": ..., "searched": ...,
        "config": ...}``: ``config`` is a trial's config (:class:`~raysearch.config.RunConfig`
        sections) with every searched value shown as :data:`SEARCHED`; a conditional space
        shows its first method's.

    Raises:
        ValueError: whatever the sweep's driver would refuse before Ray starts (an unknown
            name, a missing data set, a bad recipe, ...), as one line.
    """
    settings.validate()
    space = space if isinstance(space, SearchSpace) else load_space(space)
    space, recipe, why = with_recipe(space, settings)
    prepared = prepare_data(space, settings, say or (lambda _line: None), components)
    settings.validate()
    data = prepared.data
    overrides = settings.overrides()
    low = space.resolve(space.end_config("low"), **overrides)
    high = space.resolve(space.end_config("high"), **overrides)
    config = _mark(low.model_dump(), high.model_dump())
    searched = {k: v for k, v in space.searched().items() if k not in overrides}
    sizes = {split: len(getattr(data, split)) for split in ("train", "val", "test")}
    return _plain({
        "sweep": {
            "space": space.name, "space_file": str(space.path), "methods": space.methods,
            "trials": settings.trials, "num_samples": settings.num_samples,
            "repeats": settings.repeats, "max_concurrent": settings.max_concurrent,
            "objective": settings.objective, "sampler": settings.sampler,
            "scheduler": settings.scheduler, "selection_rule": settings.selection_rule(),
            "posthoc": list(settings.posthoc), "ece_metric": settings.ece_metric,
            "metrics": list(settings.metrics), "seed": settings.seed,
            "experiment": settings.experiment,
        },
        "recipe": None if recipe is None else {
            "name": recipe.name, "description": recipe.description, "source": recipe.source,
            "file": str(recipe.path), "augmentation": recipe.augmentation or None,
            "why": why,
        },
        "recipe_note": why if recipe is None else None,
        "data": {
            "dataset": settings.dataset, "data_dir": low.data.dir, "present": True,
            "task": getattr(data, "task", "classification"), "num_classes": data.num_classes,
            "input_shape": list(getattr(data, "input_shape", ()) or ()), **sizes,
            "shift": ("released corrupted test set " + settings.shift_data
                      if settings.shift_data else "15 ImageNet-C corruptions of "
                      f"{settings.shift_samples or 1000} test images" if settings.shift_eval
                      else None),
        },
        "resources": {**settings.resources.model_dump(), "precision": settings.precision,
                      "address": settings.address},
        "searched": searched,
        "config": config,
    })
