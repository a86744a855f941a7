"""The typed configuration of one training run, declared once (pydantic), in sections.

A :class:`RunConfig` is what one trial trains, what ``raysearch export`` writes, what
``raysearch train`` and :func:`raysearch.train` read, and what a search space resolves a trial's
sampled values into. It is plain data: no Ray, no MLflow, no torch. Its sections::

    loss:      {name: acls, params: {margin: 10.0, lambda1: 0.1}}
    model:     {name: resnet20, params: {}, pretrained: null, freeze_backbone_epochs: 0,
                head_lr: null}
    data:      {name: cifar10, dir: /data, val_fraction: null, seed: null, params: {}}
    optimizer: {name: sgd, lr: 0.1, weight_decay: 0.0005, params: {momentum: 0.9}}
    schedule:  {name: multistep, milestones: "150,250", lr_decay: 0.1, warmup_epochs: 0}
    epochs: 350
    batch_size: 128
    seed: 0
    ...

``name`` in the loss, model, data and optimizer sections is a registered name, an import string
``package.module:attr`` (:mod:`raysearch.registry`), and ``params`` are the keyword arguments of
that loss, model factory, dataset factory or optimizer: a run carries only the ones it uses (a
CIFAR run has no ``crop_size``; a VOC run has ``data.params.crop_size``).

**Flat keys.** A RunConfig takes sections only. The flat keys of a space's ``train:``
section, of the searcher's suggestions and of exports written before sections existed
(``method``, ``loss_params``, ``lr``, ``data_dir``, ``model.hidden``, ...) are read into
sections by one function, :func:`raysearch.config.flat.sections_from_flat`, where they enter:
the search space, :meth:`RunConfig.from_dict` / :meth:`RunConfig.from_yaml`, and the keyword
overrides of :func:`raysearch.train`.

Errors are one line (a ValueError) naming the field: ``optimizer: `lr` must be > 0, got -1.0``.

**Layout.** :mod:`raysearch.config.run` holds :class:`RunConfig` and its sections;
:mod:`raysearch.config.flat` the flat layout and its reader; :mod:`raysearch.config.base` the
section base class, the checks, and the few sweep names the layers below the sweep need
(:data:`DEFAULT_EXPERIMENT`, :data:`SELECTIONS`, :func:`metric_name`). The sweep's own settings
(:class:`~raysearch.tune.settings.SweepSettings`) live a layer up, in
:mod:`raysearch.tune.settings`.

**Layer.** The base of the house with :mod:`raysearch.registry`: it imports pydantic and no other
module of the package, and every layer may import it.
"""

from __future__ import annotations

from raysearch.config.base import (
    DEFAULT_EXPERIMENT,
    SECTIONS,
    SELECTIONS,
    Section,
    absolute_path,
    first_line,
    metric_name,
    one_line_error,
    plain_data,
)
from raysearch.config.flat import TRAIN_KEYS, sections_from_flat
from raysearch.config.run import (
    DEFAULT_DATASET,
    DEFAULT_MODEL,
    OPTIMIZER_DEFAULTS,
    OPTIMIZERS,
    SCHEDULES,
    DataConfig,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    RunConfig,
    ScheduleConfig,
)

__all__ = [
    "DEFAULT_DATASET",
    "DEFAULT_EXPERIMENT",
    "DEFAULT_MODEL",
    "OPTIMIZERS",
    "OPTIMIZER_DEFAULTS",
    "SCHEDULES",
    "SECTIONS",
    "SELECTIONS",
    "TRAIN_KEYS",
    "DataConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RunConfig",
    "ScheduleConfig",
    "Section",
    "absolute_path",
    "first_line",
    "metric_name",
    "one_line_error",
    "plain_data",
    "sections_from_flat",
]
