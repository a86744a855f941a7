"""``raysearch sweep ... --dry-run``: the fully resolved sweep, with nothing started.

:func:`dry_run_document` does what a sweep's driver does before Ray starts (the recipe, every
name, the data, the models on the meta device, the losses and optimizers:
:func:`~raysearch.tune.plan.make_plan`) and returns what the sweep would run as plain data: the
space and its searched parameters, the recipe and its source, the data set with its sizes, the
resources, every fixed value of a trial's config, and the number of trials. No Ray, no MLflow:
nothing is written and no process is started.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from raysearch.config import plain_data
from raysearch.tune.plan import make_plan
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SearchSpace, load_space

__all__ = ["SEARCHED", "dry_run_document"]

#: What the resolved config shows for a value the sweep searches (its range is under
#: ``searched``).
SEARCHED = "<searched>"


def _mark(low: Any, high: Any) -> Any:
    """`low` with every leaf that differs from `high` replaced by :data:`SEARCHED`."""
    if isinstance(low, Mapping) and isinstance(high, Mapping):
        return {k: _mark(v, high.get(k)) for k, v in low.items()}
    return low if low == high else SEARCHED


def dry_run_document(space: str | SearchSpace, settings: SweepSettings, *,
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
    space = space if isinstance(space, SearchSpace) else load_space(space)
    plan = make_plan(space, settings, say or (lambda _line: None), components)
    settings, space, recipe = plan.settings, plan.space, plan.recipe
    low, high = plan.configs[0], plan.configs[1]
    config = _mark(low.model_dump(), high.model_dump())
    searched = {k: v for k, v in space.searched().items()
                if not _overridden(k, plan.overrides)}
    return plain_data({
        "sweep": _sweep_part(plan),
        "recipe": None if recipe is None else {
            "name": recipe.name, "description": recipe.description, "source": recipe.source,
            "file": str(recipe.path), "augmentation": recipe.augmentation or None,
            "why": plan.recipe_note,
        },
        "recipe_note": plan.recipe_note if recipe is None else None,
        "data": _data_part(plan, low),
        "resources": {**settings.resources.model_dump(), "address": settings.address},
        "searched": searched,
        "config": config,
    })


def _overridden(name: str, overrides: Mapping[str, Any]) -> bool:
    """Whether the settings fix the value the space's `name` searches (``--epochs``, ...)."""
    from raysearch.config.flat import flat_key_path

    try:
        path = flat_key_path(name)
    except ValueError:
        return False
    node: Any = overrides
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return False
        node = node[part]
    return True


def _sweep_part(plan: Any) -> dict[str, Any]:
    settings, space = plan.settings, plan.space
    return {
        "space": space.name, "space_file": str(space.path), "methods": space.methods,
        "trials": settings.trials, "num_samples": settings.num_samples,
        "repeats": settings.repeats, "max_concurrent": settings.max_concurrent,
        "objective": settings.objective, "sampler": settings.sampler,
        "scheduler": settings.scheduler, "selection_rule": settings.selection_rule(),
        "posthoc": list(settings.posthoc), "ece_metric": settings.ece_metric,
        "metrics": list(settings.metrics), "seed": settings.seed,
        "experiment": settings.experiment,
    }


def _data_part(plan: Any, low: Any) -> dict[str, Any]:
    settings, data = plan.settings, plan.data
    return {
        "dataset": plan.dataset, "data_dir": low.data.dir, "present": True,
        "task": plan.task, "num_classes": data.num_classes,
        "input_shape": list(getattr(data, "input_shape", ()) or ()), **plan.sizes(),
        "shift": ("released corrupted test set " + settings.shift_data
                  if settings.shift_data else "15 ImageNet-C corruptions of "
                  f"{settings.shift_samples or 1000} test images" if settings.shift_eval
                  else None),
    }
