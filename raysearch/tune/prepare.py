"""What a sweep's driver checks and builds before Ray starts: every name, the data, the models.

:func:`prepare_data` resolves the sweep's names (registered, import strings or the Python API's
objects), loads the dataset once, builds every distinct model (on the meta device), loss and
optimizer the trials will build, and records the folders of the user's code. ``sweep --dry-run``
(:mod:`raysearch.cli.plan`) runs it too, so this module imports neither Ray nor MLflow.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SearchSpace

__all__ = ["Prepared", "build_shift", "prepare_data"]


@dataclass
class Prepared:
    """What the driver learnt before Ray starts (:func:`prepare_data`).

    Attributes:
        data: the sweep's splits (every trial loads the same ones).
        code_paths: folders of the user's code (the parents of their top-level packages or
            modules, and the current directory): put on the trial workers' ``sys.path``.
        modules: the user's top-level packages or module files, shipped to a remote cluster
            (Ray ``runtime_env`` ``py_modules``).
    """

    data: Any
    code_paths: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()


def prepare_data(space: SearchSpace, settings: SweepSettings, say: Callable[[str], None],
                 components: dict[str, dict[str, Any]] | None = None) -> Prepared:
    """Resolve every name, load the dataset once and build what the trials will build.

    Runs in the driver before Ray starts or anything is written, so that an unknown name (with
    the closest ones), an import string that does not import, a keyword a factory does not
    take, a factory that raises or breaks its contract, a missing or corrupt dataset, a bad
    weights file or a misconfigured optimizer is one line, not a failed trial. Every trial loads
    the same splits (same dataset, seed and fractions). The model is built with the space's
    low and high ends of every searched argument (on the meta device: shapes only, no memory);
    the optimizer the same way.

    Sets ``settings.dataset`` and ``settings.model`` to the names the trials use, and
    ``settings.accuracy_metric`` to the data's primary metric when it is unset.

    Returns:
        Prepared: the splits (their ``info`` goes into the parent run's params) and the user's
        code paths.

    Raises:
        ValueError: (``DatasetError`` included) one line naming what is wrong.
    """
    from raysearch.training.optim import check_optimizer, optimizer_class
    from raysearch.training.registries import metric_functions, registry
    from raysearch.training.run import (
        build_run_loss,
        build_run_model,
        check_run_model,
        load_run_data,
    )
    from raysearch.training.tasks import task_for

    components = components or {}
    overrides = settings.overrides()
    configs = [space.resolve(space.end_config(which, method), **overrides)
               for method in space.methods for which in ("low", "high")]
    cfg = configs[0]
    settings.dataset = cfg.data.name
    if settings.download:
        say(f"checking {cfg.data.name} in {cfg.data.dir} (downloading what is missing)")
    extra = {"verify": True}  # a factory that takes `verify` checks every file now
    if settings.download and _takes(_factory("datasets", cfg.data.name, components), "download"):
        extra["download"] = True
    data = load_run_data(cfg, components=components, **_accepted(
        _factory("datasets", cfg.data.name, components), extra))
    task = task_for(data)
    if settings.accuracy_metric is None:
        settings.accuracy_metric = task.primary_metric
    if settings.shift_eval and importlib.util.find_spec("imagecorruptions") is None:
        raise ValueError("--shift-eval needs the image corruptions package: "
                         "pip install 'raysearch[shift]'")
    if settings.shift_eval and not callable(getattr(data.test, "with_images", None)):
        raise ValueError(f"--shift-eval needs an image dataset held in memory (its test split "
                         f"must offer with_images), got '{cfg.data.name}'")
    if settings.shift_data is not None:
        if not callable(getattr(data.test, "with_images", None)):
            raise ValueError(f"--shift-data needs an image dataset held in memory (its test "
                             f"split must offer with_images), got '{cfg.data.name}'")
        build_shift(data, settings, lambda line: None)  # the folder's layout, before Ray starts
    models = sorted({c.model.name for c in configs}, key=str)
    for model in space.train_values("model"):
        if model not in models and settings.model is None:
            models.append(model)
    settings.model = settings.model or (models[0] if len(models) == 1 else None)
    objects: list[Any] = [_factory("datasets", cfg.data.name, components)]
    checked: set[str] = set()  # each distinct model, loss and optimizer section once

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
            build_run_loss(run, data, components=components)
            objects.append(_factory("losses", run.loss.name, components))
        if once(run.optimizer):
            check_optimizer(run.optimizer)
            objects.append(optimizer_class(run.optimizer.name))
    objects.extend(metric_functions(settings.metrics, components).values())
    for name in settings.posthoc:
        objects.append(registry("calibrators").get(name))
    weights = cfg.model.pretrained
    if weights is not None and all(c.model.pretrained == weights for c in configs):
        from raysearch.training.models.pretrained import load_pretrained

        if settings.download:
            say(f"checking the weights {weights} (downloading them if missing)")
        info = load_pretrained(build_run_model(cfg, data, components=components), weights,
                               download=settings.download)
        data.info["pretrained_sha256"] = info.sha256
        say(f"pretrained weights {info.source}: {info.loaded} tensors, sha256 "
            f"{info.sha256[:12]}" + (", classification head replaced" if info.replaced_head
                                     else ""))
    return Prepared(data, *_user_code(objects))


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


def _user_code(objects: list[Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(code paths, module paths) of the user's objects: see :class:`Prepared`."""
    from raysearch.registry import code_module

    modules = sorted({m for m in (code_module(o) for o in objects) if m is not None})
    paths = [os.getcwd(), *sorted({str(Path(m).parent) for m in modules})]
    return tuple(dict.fromkeys(paths)), tuple(modules)


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
        say(f"shift evaluation: {len(shift_set.labels)} test images x "
            f"{len(shift_set.corruptions)} corruptions x {len(shift_set.severities)} severities "
            f"of {Path(settings.shift_data).expanduser().absolute()}, read by every trial")
        return shift_set
    samples = 1000 if settings.shift_samples is None else settings.shift_samples
    say(f"shift evaluation: corrupting {min(samples, len(labels))} test images "
        "(15 corruptions x 5 severities) once for every trial")
    return build_shift_set(data.test.images_hwc(), labels, max_samples=samples,
                           seed=settings.seed, progress=say)


