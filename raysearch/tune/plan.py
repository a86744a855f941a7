"""A sweep's plan: what its driver resolves and checks before Ray starts.

:func:`make_plan` applies the sweep's recipe to its space, resolves every name (registered,
import strings or the Python API's objects), loads the dataset once, builds every distinct
model (on the meta device), loss and optimizer the trials will build, and records the folders
of the user's code; it returns a :class:`SweepPlan`, which the engine runs and ``sweep
--dry-run`` (:mod:`raysearch.cli.plan`) prints. The settings are read, never written. This
module imports neither Ray nor MLflow.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysearch.config import RunConfig
from raysearch.tune.recipes import Recipe, with_recipe
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SearchSpace, TrialConfigs

__all__ = ["SweepPlan", "build_shift", "make_plan"]


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep runs, resolved before Ray starts (:func:`make_plan`).

    Attributes:
        space: the search space with the recipe applied (its ``recipe`` names it).
        settings: the sweep's settings, with ``accuracy_metric`` resolved to the data's
            primary metric when it was not given.
        recipe: the recipe applied, or None.
        recipe_note: one line saying which recipe and why (or why none).
        overrides: what every trial's config takes from the settings, in sections
            (:meth:`~raysearch.tune.settings.SweepSettings.config_overrides`).
        configs: the configs at the low and high end of every searched value, per method,
            each checked (model, loss, optimizer built).
        data: the sweep's splits (every trial loads the same ones).
        dataset: the dataset name the trials use.
        model: the model name every trial uses, or None when the space searches it.
        code_paths: folders of the user's code (the parents of their top-level packages or
            modules, and the current directory): put on the trial workers' ``sys.path``.
        modules: the user's top-level packages or module files, shipped to a remote cluster
            (Ray ``runtime_env`` ``py_modules``).
    """

    space: SearchSpace
    settings: SweepSettings
    recipe: Recipe | None
    recipe_note: str
    overrides: Mapping[str, Any]
    configs: tuple[RunConfig, ...]
    data: Any
    dataset: str
    model: str | None
    code_paths: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    @property
    def trial_configs(self) -> TrialConfigs:
        """The space and the settings' sections: what trials and tracking resolve with."""
        return TrialConfigs(self.space, dict(self.overrides))

    @property
    def task(self) -> str:
        """The name of the data's task (:func:`raysearch.training.tasks.task_for`)."""
        from raysearch.training.tasks import task_for

        return task_for(self.data).name

    def sizes(self) -> dict[str, int]:
        """Samples per split: ``{"train": ..., "val": ..., "test": ...}``."""
        return {split: len(getattr(self.data, split)) for split in ("train", "val", "test")}


def make_plan(space: SearchSpace, settings: SweepSettings, say: Callable[[str], None],
              components: dict[str, dict[str, Any]] | None = None) -> SweepPlan:
    """Apply the recipe, resolve every name, load the dataset once, build what trials build.

    Runs in the driver before Ray starts or anything is written, so that an unknown name (with
    the closest ones), an import string that does not import, a keyword a factory does not
    take, a factory that raises or breaks its contract, a missing or corrupt dataset, NaN or
    inf in its inputs, a bad weights file or a misconfigured optimizer is one line, not a
    failed trial. Every trial loads the same splits (same dataset, seed and fractions). The
    model is built with the space's low and high ends of every searched argument (on the meta
    device: shapes only, no memory); the optimizer and the loss the same way, the loss then
    called on two samples (:func:`raysearch.training.run_parts.check_run_loss`). A user's
    metric functions and post-hoc calibrators are run once on small inputs of the data's K
    (:mod:`raysearch.training.contracts`).

    Args:
        space: the loaded search space (a recipe already applied to it is kept).
        settings: the sweep's settings (read only).
        say: progress lines.
        components: objects given through the Python API, by kind and label.

    Returns:
        SweepPlan: the space with its recipe, the resolved settings, the splits (their
        ``info`` goes into the parent run's params), the checked configs and the user's code.

    Raises:
        ValueError: (``DatasetError`` and ``RecipeError`` included) one line naming what is
            wrong.
    """
    components = components or {}
    space, recipe, why = with_recipe(space, settings)
    overrides = settings.config_overrides()
    configs = tuple(space.resolve(space.end_config(which, method), overrides)
                    for method in space.methods for which in ("low", "high"))
    data = _load_data(configs[0], settings, say, components)
    _check_inputs(data, configs[0].data.name, components)
    from raysearch.training.tasks import task_for

    task = task_for(data)
    if settings.accuracy_metric is None:
        settings = settings.model_copy(update={"accuracy_metric": task.primary_metric})
    _check_shift(data, settings, configs[0].data.name)
    models = sorted({c.model.name for c in configs}, key=str)
    for model in space.train_values("model"):
        if model not in models and settings.model is None:
            models.append(model)
    objects = _check_builds(configs, models, data, settings, components)
    _check_weights(configs, data, settings, say, components)
    return SweepPlan(space=space, settings=settings, recipe=recipe, recipe_note=why,
                     overrides=overrides, configs=configs, data=data,
                     dataset=configs[0].data.name,
                     model=settings.model or (models[0] if len(models) == 1 else None),
                     **_user_code(objects))


def _load_data(cfg: RunConfig, settings: SweepSettings, say: Callable[[str], None],
               components: dict[str, dict[str, Any]]) -> Any:
    """The sweep's splits, every file checked (downloaded first with ``--download``)."""
    from raysearch.training.run import load_run_data

    factory = _factory("datasets", cfg.data.name, components)
    if settings.download:
        say(f"checking {cfg.data.name} in {cfg.data.dir} (downloading what is missing)")
    extra = {"verify": True}  # a factory that takes `verify` checks every file now
    if settings.download and _takes(factory, "download"):
        extra["download"] = True
    return load_run_data(cfg, components=components, **_accepted(factory, extra))


def _check_inputs(data: Any, dataset: str, components: dict[str, dict[str, Any]]) -> None:
    """NaN or inf in the inputs: all of a split in memory, a sample of the user's files."""
    from raysearch.registry import BUILT_IN
    from raysearch.training.data.splits import FINITE_CHECK_SAMPLES, check_finite_inputs
    from raysearch.training.registries import registry

    builtin = (dataset not in components.get("datasets", {})
               and registry("datasets").source(dataset) == BUILT_IN)
    # the built-in readers decode 8-bit files: only what they hold in memory is checked
    check_finite_inputs(data, dataset, sample=0 if builtin else FINITE_CHECK_SAMPLES)


def _check_shift(data: Any, settings: SweepSettings, dataset: str) -> None:
    """``--shift-eval`` / ``--shift-data`` need an in-memory image test split (one line)."""
    if settings.shift_eval and importlib.util.find_spec("imagecorruptions") is None:
        raise ValueError("--shift-eval needs the image corruptions package: "
                         "pip install 'raysearch[shift]'")
    option = "--shift-eval" if settings.shift_eval else "--shift-data"
    if (settings.shift_eval or settings.shift_data is not None) and not callable(
            getattr(data.test, "with_images", None)):
        raise ValueError(f"{option} needs an image dataset held in memory (its test split "
                         f"must offer with_images), got '{dataset}'")
    if settings.shift_data is not None:
        build_shift(data, settings, lambda line: None)  # the folder's layout, before Ray starts


def _check_builds(configs: tuple[RunConfig, ...], models: list[str], data: Any,
                  settings: SweepSettings, components: dict[str, dict[str, Any]]) -> list[Any]:
    """Build each distinct model, loss and optimizer once, check the user's code; returns it."""
    from raysearch.training.optim import check_optimizer, optimizer_class
    from raysearch.training.registries import metric_functions
    from raysearch.training.run_parts import check_run_loss, check_run_model

    objects: list[Any] = [_factory("datasets", configs[0].data.name, components)]
    checked: set[str] = set()

    def once(section: Any) -> bool:
        key = f"{type(section).__name__}:{json.dumps(section.model_dump(), sort_keys=True)}"
        fresh = key not in checked
        checked.add(key)
        return fresh

    for run in configs:
        for model in models if run is configs[0] else [run.model.name]:
            trial = run.model_copy(update={"model": run.model.model_copy(update={"name": model})})
            if once(trial.model):
                objects.append(_factory("models", model, components))
                check_run_model(trial, data, components=components)
        if once(run.loss):
            check_run_loss(run, data, components=components)
            objects.append(_factory("losses", run.loss.name, components))
        if once(run.optimizer):
            check_optimizer(run.optimizer)
            objects.append(optimizer_class(run.optimizer.name))
    objects.extend(metric_functions(settings.metrics, components,
                                    num_classes=data.num_classes).values())
    objects.extend(_check_calibrators(settings.posthoc, data.num_classes))
    return objects


def _check_calibrators(names: tuple[str, ...], num_classes: int) -> list[Any]:
    """The calibrators of ``--posthoc``; a user's is fitted once on a small logit matrix."""
    from raysearch.registry import BUILT_IN
    from raysearch.training.contracts import check_calibrator
    from raysearch.training.registries import registry

    calibrators = registry("calibrators")
    for name in names:
        if calibrators.source(name) != BUILT_IN:  # the built-ins are trusted (and slow to fit)
            check_calibrator(name, num_classes)
    return [calibrators.get(name) for name in names]


def _check_weights(configs: tuple[RunConfig, ...], data: Any, settings: SweepSettings,
                   say: Callable[[str], None], components: dict[str, dict[str, Any]]) -> None:
    """Load the weights every trial starts from once (``--pretrained``); their sha256 too."""
    cfg = configs[0]
    weights = cfg.model.pretrained
    if weights is None or any(c.model.pretrained != weights for c in configs):
        return
    from raysearch.training.models.pretrained import load_pretrained
    from raysearch.training.run import build_run_model

    if settings.download:
        say(f"checking the weights {weights} (downloading them if missing)")
    info = load_pretrained(build_run_model(cfg, data, components=components), weights,
                           download=settings.download)
    data.info["pretrained_sha256"] = info.sha256
    say(f"pretrained weights {info.source}: {info.loaded} tensors, sha256 "
        f"{info.sha256[:12]}" + (", classification head replaced" if info.replaced_head
                                 else ""))


def _factory(kind: str, name: Any, components: dict[str, dict[str, Any]]) -> Any:
    from raysearch.training.registries import registry
    return registry(kind).get(name, components=components.get(kind))


def _takes(factory: Any, key: str) -> bool:
    from raysearch.registry import accepted_keywords

    names, var_kw = accepted_keywords(factory)
    return key in names or var_kw


def _accepted(factory: Any, extra: dict[str, Any]) -> dict[str, Any]:
    """The entries of `extra` that `factory` takes (the driver's own checks, not the user's)."""
    from raysearch.registry import accepted_keywords

    names, _ = accepted_keywords(factory)
    return {k: v for k, v in extra.items() if k in names}


def _user_code(objects: list[Any]) -> dict[str, tuple[str, ...]]:
    """``code_paths`` and ``modules`` of the user's objects (see :class:`SweepPlan`)."""
    from raysearch.registry import code_module

    modules = sorted({m for m in (code_module(o) for o in objects) if m is not None})
    paths = [os.getcwd(), *sorted({str(Path(m).parent) for m in modules})]
    return {"code_paths": tuple(dict.fromkeys(paths)), "modules": tuple(modules)}


def build_shift(data: Any, settings: SweepSettings, say: Callable[[str], None]) -> Any:
    """The shift set of ``--shift-eval`` or ``--shift-data``, built once in the driver.

    ``--shift-eval`` corrupts a test subsample now; ``--shift-data`` lists the released folder
    and checks it against the test split (its images are read by each trial).

    Raises:
        ValueError: for ``--shift-data``, one line ``--shift-data DIR: <what is wrong>``.
    """
    from raysearch.metrics.shift import build_shift_set, load_released_shift_set

    labels = np.asarray(data.test.labels.cpu() if hasattr(data.test.labels, "cpu")
                        else data.test.labels)
    if settings.shift_data is not None:
        try:
            shift_set = load_released_shift_set(
                settings.shift_data, data.test.images_hwc(), labels,
                num_classes=data.num_classes, class_names=data.class_names,
                max_samples=settings.shift_samples, seed=settings.seed)
        except ValueError as exc:
            raise ValueError(f"--shift-data {exc}") from None
        extra = (f" (+ {len(shift_set.held_out)} reported apart: "
                 f"{', '.join(shift_set.held_out)})" if shift_set.held_out else "")
        say(f"shift evaluation: {len(shift_set.labels)} test images x "
            f"{len(shift_set.benchmark)} corruptions{extra} x {len(shift_set.severities)} "
            f"severities of {Path(settings.shift_data).expanduser().absolute()}, read by every "
            "trial")
        return shift_set
    samples = 1000 if settings.shift_samples is None else settings.shift_samples
    say(f"shift evaluation: corrupting {min(samples, len(labels))} test images "
        "(15 corruptions x 5 severities) once for every trial")
    return build_shift_set(data.test.images_hwc(), labels, max_samples=samples,
                           seed=settings.seed, progress=say)


