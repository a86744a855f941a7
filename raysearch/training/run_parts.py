"""A run's data, model and loss, built from its config (the first step of ``fit``).

:func:`load_run_data` (the splits of ``cfg.data``), :func:`build_run_model` (the model of
``cfg.model`` for those splits), :func:`check_run_model` (the same, built cheaply on the meta
device to check it before a sweep), :func:`build_run_loss` (the loss of ``cfg.loss``) and
:func:`check_run_loss` (the same, called on two samples to check its contract). Names
of ``cfg`` resolve to objects given through the Python API (``components``) first, then to the
registries of :mod:`raysearch.training.data`, :mod:`raysearch.training.models` and
:mod:`raysearch.losses`.

Imports (lazily) :mod:`raysearch.training.data`, :mod:`raysearch.training.models`,
:mod:`raysearch.losses`, :mod:`raysearch.registry`, :mod:`raysearch.training.tasks` and
:mod:`raysearch.training.contracts` (and :mod:`raysearch.config` for type hints); never
:mod:`raysearch.training.run`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from raysearch.config import RunConfig
    from raysearch.training.data import DatasetSplits

__all__ = ["build_run_loss", "build_run_model", "check_run_loss", "check_run_model",
           "load_run_data", "run_model_spec"]


def load_run_data(cfg: RunConfig, *, components: Mapping[str, Mapping[str, Any]] | None = None,
                  **extra: Any) -> DatasetSplits:
    """The splits of `cfg`'s data section.

    ``load_dataset(data.name, data_dir=data.dir, seed=cfg.split_seed,
    val_fraction=data.val_fraction, **data.params)``.

    Args:
        cfg: the run config.
        components: objects given through the Python API (see :func:`fit`).
        **extra: more keyword arguments of the factory (``download=True``, ``verify=True``).

    Raises:
        ValueError: as :func:`raysearch.training.data.load_dataset` (unknown name, a keyword the
            factory does not take, a contract violation).
    """
    from raysearch.training.data import load_dataset

    name = _component(cfg.data.name, "datasets", components)
    return load_dataset(name, seed=cfg.split_seed, val_fraction=cfg.data.val_fraction,
                        data_dir=cfg.data.dir, **{**cfg.data.params, **extra})


def build_run_model(cfg: RunConfig, data: DatasetSplits, *,
                    components: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """The model of `cfg`'s model section for `data` (built from :func:`run_model_spec`).

    Raises:
        ValueError: as :func:`raysearch.training.models.build_model`.
    """
    from raysearch.training.models import build_model

    spec = run_model_spec(cfg, data, components=components)
    return build_model(spec["name"], num_classes=spec["num_classes"],
                       input_shape=spec["input_shape"], **spec["params"])


def run_model_spec(cfg: RunConfig, data: DatasetSplits, *,
                   components: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """What builds `cfg`'s model for `data`: its factory, classes, input shape and keywords.

    ``factory(num_classes=K, input_shape=data.input_shape, **model.params)``, plus what the data
    offers the factory (``data.model_kwargs``, such as a text dataset's vocabulary) where it
    takes it.

    Returns:
        ``{"name": factory name or callable, "num_classes": K, "input_shape": (...),
        "params": {keyword: value}}``.
    """
    from raysearch.registry import accepted_keywords
    from raysearch.training.models import model_factory

    name = _component(cfg.model.name, "models", components)
    names, var_kw = accepted_keywords(model_factory(name))
    offered = {k: v for k, v in data.model_kwargs.items()
               if (k in names or var_kw) and k not in cfg.model.params}
    return {"name": name, "num_classes": int(data.num_classes),
            "input_shape": tuple(int(d) for d in data.input_shape),
            "params": {**offered, **cfg.model.params}}


def check_run_model(cfg: RunConfig, data: DatasetSplits, *,
                    components: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """Build `cfg`'s model to check it, cheaply: on the meta device (shapes, no memory).

    A factory that cannot run on the meta device (it reads tensor values) is built on the CPU,
    whose error, if any, is the one raised; a factory given a file (a backbone's weights) is
    built for real, so the file is read.
    Then the data's task checks the model (a segmentation network on classification data).

    Raises:
        ValueError: as :func:`build_run_model`, or from the task's check.
    """
    from raysearch.training.models import model_factory
    from raysearch.training.tasks import task_for

    task = task_for(data)
    label = f"model {cfg.model.name!r}"
    # a factory that declares its task (the built-in segmentation networks) is checked first
    task.check_model(model_factory(_component(cfg.model.name, "models", components)), label)
    if any(isinstance(v, str) and Path(v).expanduser().is_file()
           for v in cfg.model.params.values()):
        # a factory that reads a file (a segmentation backbone's weights) reads it for real
        model = build_run_model(cfg, data, components=components)
    else:
        try:
            with torch.device("meta"):
                model = build_run_model(cfg, data, components=components)
        except Exception:  # noqa: BLE001 (the factory's own error, on the CPU)
            model = build_run_model(cfg, data, components=components)
    task.check_model(model, label)
    task.check_output(model, data, label)
    return model


def build_run_loss(cfg: RunConfig, data: DatasetSplits, *,
                   components: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """The loss of `cfg`'s loss section, told the data's ``ignore_index`` when it has one.

    Raises:
        ValueError: as :func:`raysearch.losses.build_loss`.
    """
    from raysearch.losses import build_loss

    name = _component(cfg.loss.name, "losses", components)
    if data.ignore_index is not None:
        return build_loss(name, ignore_index=data.ignore_index, **cfg.loss.params)
    return build_loss(name, **cfg.loss.params)


def check_run_loss(cfg: RunConfig, data: DatasetSplits, *,
                   components: Mapping[str, Mapping[str, Any]] | None = None) -> nn.Module:
    """Build `cfg`'s loss as a trial does and check its contract on two samples of `data`.

    :func:`build_run_loss`, then :func:`raysearch.training.contracts.check_loss`: on random
    logits ``(2, K[, *target])`` with the first two training targets (and the side inputs the
    loss declares) it must return a finite scalar whose gradient reaches the logits.

    Returns:
        The loss built (it has been called once: a fresh one is built for training).

    Raises:
        ValueError: as :func:`build_run_loss`, or one line naming the loss and what it
            returned (``loss 'mypkg.losses:PerSample' returned a tensor of shape (2,),
            expected a scalar (the batch mean)``).
    """
    from raysearch.training.contracts import check_loss

    loss_fn = build_run_loss(cfg, data, components=components)
    check_loss(loss_fn, data, f"loss {cfg.loss.name!r}")
    return loss_fn


def _component(name: str, kind: str, components: Mapping[str, Mapping[str, Any]] | None) -> Any:
    """The object given for `name` through the Python API, else the name itself."""
    given = (components or {}).get(kind) or {}
    return given.get(name, name)
