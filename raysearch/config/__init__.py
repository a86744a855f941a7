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

**Flat keys.** A trial's config, a space file's ``train:`` section and the configs exported before
the sections existed use flat keys; :meth:`RunConfig.from_flat` reads them all:

- ``method`` and ``loss_params`` (the loss), ``dataset`` and ``model`` and ``optimizer`` and
  ``schedule`` (names), ``lr``, ``momentum``, ``weight_decay``, ``nesterov``, ``data_dir``,
  ``val_fraction``, ``test_fraction``, ``imbalance_ratio``, ``data_seed``, ``crop_size``,
  ``pretrained``, ``pretrained_backbone``, ``embeddings``, ``milestones``, ... (the old flat
  fields: :data:`LEGACY_KEYS` says where each goes);
- dotted keys ``model.<kw>``, ``data.<kw>``, ``optimizer.<kw>``, ``loss.<kw>`` (a space's
  ``model:``, ``data:`` and ``optimizer:`` sections), which go into that section's ``params``
  (``optimizer.lr`` and ``optimizer.weight_decay`` into the section's own fields).

Errors are one line (a ValueError) naming the field: ``optimizer: `lr` must be > 0, got -1.0``.

**Layout.** :mod:`raysearch.config.run` holds :class:`RunConfig`, its sections and the flat-key
tables; :mod:`raysearch.config._common` the section base class, the checks, and the few sweep
names the layers below the sweep need (:data:`DEFAULT_EXPERIMENT`, :data:`SELECTIONS`,
:func:`metric_name`). The sweep's own settings (:class:`~raysearch.tune.settings.SweepSettings`)
live a layer up, in :mod:`raysearch.tune.settings`.

**Layer.** The base of the house with :mod:`raysearch.registry`: it imports pydantic and no other
module of the package, and every layer may import it.
"""

from __future__ import annotations

from raysearch.config._common import DEFAULT_EXPERIMENT as DEFAULT_EXPERIMENT

# The run config (raysearch.config.run) and what it shares (raysearch.config._common) live in
# their own modules; every name stays importable from here.
from raysearch.config._common import SECTIONS as SECTIONS
from raysearch.config._common import SELECTIONS as SELECTIONS
from raysearch.config._common import Section as Section
from raysearch.config._common import _absolute as _absolute
from raysearch.config._common import _as_float as _as_float
from raysearch.config._common import _as_int as _as_int
from raysearch.config._common import _bounded as _bounded
from raysearch.config._common import _first_line as _first_line
from raysearch.config._common import _is_number as _is_number
from raysearch.config._common import _plain as _plain
from raysearch.config._common import metric_name as metric_name
from raysearch.config._common import one_line_error as one_line_error
from raysearch.config.run import _DATA_PARAM_BOUNDS as _DATA_PARAM_BOUNDS
from raysearch.config.run import _LEGACY_DEFAULTS as _LEGACY_DEFAULTS
from raysearch.config.run import DEFAULT_DATASET as DEFAULT_DATASET
from raysearch.config.run import DEFAULT_MODEL as DEFAULT_MODEL
from raysearch.config.run import LEGACY_KEYS as LEGACY_KEYS
from raysearch.config.run import OPTIMIZER_DEFAULTS as OPTIMIZER_DEFAULTS
from raysearch.config.run import OPTIMIZERS as OPTIMIZERS
from raysearch.config.run import RUN_KEYS as RUN_KEYS
from raysearch.config.run import SCHEDULES as SCHEDULES
from raysearch.config.run import TRAIN_KEYS as TRAIN_KEYS
from raysearch.config.run import DataConfig as DataConfig
from raysearch.config.run import LossConfig as LossConfig
from raysearch.config.run import ModelConfig as ModelConfig
from raysearch.config.run import OptimizerConfig as OptimizerConfig
from raysearch.config.run import RunConfig as RunConfig
from raysearch.config.run import ScheduleConfig as ScheduleConfig
from raysearch.config.run import _Factory as _Factory
from raysearch.config.run import _milestones_text as _milestones_text
from raysearch.config.run import _name as _name
from raysearch.config.run import _params as _params
from raysearch.config.run import _set as _set
from raysearch.config.run import flat_to_sections as flat_to_sections

__all__ = [
    "DEFAULT_DATASET",
    "DEFAULT_MODEL",
    "LEGACY_KEYS",
    "OPTIMIZERS",
    "RUN_KEYS",
    "SCHEDULES",
    "TRAIN_KEYS",
    "DataConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RunConfig",
    "ScheduleConfig",
    "one_line_error",
]
