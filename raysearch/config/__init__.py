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
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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

#: The embedded default: scikit-learn's bundled digits and the small CNN (no download).
DEFAULT_DATASET = "digits"
DEFAULT_MODEL = "cnn"

#: Optimisers by short name (any ``torch.optim`` class also works by its name, case-insensitive,
#: or by import string; see :mod:`raysearch.optim`).
OPTIMIZERS = ("sgd", "adam", "adamw")
#: Learning-rate schedules of :attr:`ScheduleConfig.name`.
SCHEDULES = ("cosine", "multistep", "constant")
#: Keyword arguments an optimizer gets by default unless its section sets them: SGD with
#: momentum 0.9, as every paper of this field trains.
OPTIMIZER_DEFAULTS: dict[str, dict[str, Any]] = {"sgd": {"momentum": 0.9}}

#: Top-level fields of a RunConfig besides its sections.
RUN_KEYS = ("epochs", "batch_size", "seed", "ece_bins", "mixup_alpha", "cutmix_alpha",
            "ricap_beta", "interleaved", "interleave_fraction")

#: The flat keys of earlier raysearch versions (and of space files' ``train:``): where each goes,
#: as (section, field) or (section, "params", key).
LEGACY_KEYS: dict[str, tuple[str, ...]] = {
    "method": ("loss", "name"),
    "loss_params": ("loss", "params"),
    "dataset": ("data", "name"),
    "data_dir": ("data", "dir"),
    "val_fraction": ("data", "val_fraction"),
    "data_seed": ("data", "seed"),
    "test_fraction": ("data", "params", "test_fraction"),
    "imbalance_ratio": ("data", "params", "imbalance_ratio"),
    "crop_size": ("data", "params", "crop_size"),
    "model": ("model", "name"),
    "pretrained": ("model", "pretrained"),
    "freeze_backbone_epochs": ("model", "freeze_backbone_epochs"),
    "head_lr": ("model", "head_lr"),
    "pretrained_backbone": ("model", "params", "pretrained_backbone"),
    "embeddings": ("model", "params", "embeddings_path"),
    "optimizer": ("optimizer", "name"),
    "lr": ("optimizer", "lr"),
    "weight_decay": ("optimizer", "weight_decay"),
    "momentum": ("optimizer", "params", "momentum"),
    "nesterov": ("optimizer", "params", "nesterov"),
    "schedule": ("schedule", "name"),
    "milestones": ("schedule", "milestones"),
    "lr_decay": ("schedule", "lr_decay"),
    "warmup_epochs": ("schedule", "warmup_epochs"),
}

#: Training keys a space file's ``train:`` section may sample or fix (besides the loss
#: parameters and its ``model:``, ``data:`` and ``optimizer:`` sections).
TRAIN_KEYS = ("model", "epochs", "batch_size", "lr", "momentum", "weight_decay", "interleaved",
              "interleave_fraction", "schedule", "milestones", "lr_decay", "warmup_epochs",
              "nesterov", "mixup_alpha", "cutmix_alpha", "ricap_beta", "crop_size", "pretrained",
              "freeze_backbone_epochs", "head_lr", "embeddings", "optimizer")

#: The sections of a RunConfig and the prefix of their dotted flat keys.
SECTIONS = ("loss", "model", "data", "optimizer", "schedule")

# the values old exports wrote for every run (flat dataclass fields): dropped when they would
# now be a keyword that the run's dataset or model does not take
_LEGACY_DEFAULTS = {"crop_size": 512, "nesterov": False, "embeddings": None,
                    "pretrained_backbone": None, "test_fraction": None,
                    "imbalance_ratio": None}


def one_line_error(exc: ValidationError, what: str = "run config") -> str:
    """The first error of a pydantic ValidationError as one readable line."""
    err = exc.errors()[0]
    loc = [str(p) for p in err.get("loc", ())]
    msg = str(err.get("msg", "invalid"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if err.get("type") == "extra_forbidden":
        section = ".".join(loc[:-1])
        return (f"unknown {what} key {'.'.join(loc)!r}"
                + (f" in section {section!r}" if section else ""))
    if err.get("type") == "missing":
        return f"{what}: `{'.'.join(loc)}` is required"
    if not loc:
        return msg
    if loc[-1] in SECTIONS:  # a section's own check (fields that go together)
        return f"{'.'.join(loc)}: {msg}"
    if not msg.startswith("`"):
        msg = f"`{loc[-1]}`: {msg} (got {err.get('input')!r})"
    prefix = ".".join(loc[:-1])
    return f"{prefix}: {msg}" if prefix else msg


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"`{name}` must be an integer, got {value!r}")
    return value


def _as_float(name: str, value: Any) -> float:
    if not _is_number(value):
        raise ValueError(f"`{name}` must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"`{name}` must be finite, got {value!r}")
    return float(value)


def _bounded(name: str, value: Any, *, low: float, high: float | None = None,
             low_open: bool = False, high_open: bool = False, integer: bool = False,
             optional: bool = False, note: str = "") -> Any:
    """`value` as an int or a float within its bounds, or a ValueError naming `name`.

    The message states the range as written in the field's docs: ``must be >= 0``, ``must be
    > 0``, ``must be in (0, 1]``, with `note` after it.
    """
    if value is None and optional:
        return None
    value = _as_int(name, value) if integer else _as_float(name, value)
    too_low = value <= low if low_open else value < low
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        if high is None:
            wanted = f"{'>' if low_open else '>='} {low}"
        else:
            wanted = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"`{name}` must be {wanted}{note}, got {value}")
    return value


def _name(section: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"`name` of the {section} must be a non-empty string (a registered "
                         f"name or an import string package.module:attr), got {value!r}")
    return value.strip()


class Section(BaseModel):
    """Base of every section: unknown keys are an error; assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    #: Numeric fields and their bounds (:func:`_bounded`'s keywords), checked on input.
    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {}

    @field_validator("*", mode="before")
    @classmethod
    def _check_bounds(cls, value: Any, info: Any) -> Any:
        spec = cls._BOUNDS.get(info.field_name)
        return value if spec is None else _bounded(info.field_name, value, **spec)

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ValueError(one_line_error(exc, type(self).__name__)) from None


def _params(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"`params` must be a mapping of keyword arguments, got {value!r}")
    return {str(k): _plain(v) for k, v in value.items()}


class _Factory(Section):
    """A section that names a factory (``name``) and holds its keyword arguments (``params``)."""

    _what: ClassVar[str] = ""
    name: str = ""
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name", mode="before")
    @classmethod
    def _check_name(cls, value: Any) -> str:
        return _name(cls._what, value)

    @field_validator("params", mode="before")
    @classmethod
    def _check_params(cls, value: Any) -> dict[str, Any]:
        return _params(value)


class LossConfig(_Factory):
    """The training objective: a loss name (or import string) and its keyword parameters.

    Attributes:
        name: a registered loss (``ce``, ``ls``, ``focal``, ``mbls``, ``acls``, ...; see
            :func:`raysearch.losses.available_losses`) or ``package.module:attr``.
        params: its keyword arguments (``margin``, ``lambda1``, ...).
    """

    _what: ClassVar[str] = "loss"
    name: str = "ce"



class ModelConfig(_Factory):
    """The network: a model factory, its keyword arguments, and the weights it starts from.

    Attributes:
        name: a registered model (``cnn``, ``resnet20``, ``wrn28_10``, ``deeplabv3_resnet50``,
            ``torchvision:<name>``, ...) or ``package.module:attr`` of a factory
            ``f(num_classes, input_shape, **params) -> nn.Module``.
        params: the factory's keyword arguments (a user's ``hidden``; a segmentation model's
            ``pretrained_backbone``; ``gpool_cnn``'s ``embeddings_path``).
        pretrained: weights the whole model starts from (fine-tuning): a local state-dict file
            (``weights_only=True``) or a torchvision weights name such as
            ``ResNet101_Weights.IMAGENET1K_V1``; the classification head is replaced when the
            number of classes differs (:func:`raysearch.models.pretrained.load_pretrained`).
        freeze_backbone_epochs: train only the classification head for the first E epochs; 0:
            none.
        head_lr: learning rate of the classification head's parameters (the rest uses the
            optimizer's ``lr``); None: the same lr for every parameter.
    """

    _what: ClassVar[str] = "model"
    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {
        "freeze_backbone_epochs": {"low": 0, "integer": True},
        "head_lr": {"low": 0, "low_open": True, "optional": True, "note": " (or null)"},
    }
    name: str = DEFAULT_MODEL
    pretrained: str | None = None
    freeze_backbone_epochs: int = 0
    head_lr: float | None = None


    @field_validator("pretrained", mode="before")
    @classmethod
    def _check_pretrained(cls, value: Any) -> Any:
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError("`pretrained` must be a file path or a torchvision weights name, "
                             f"got {value!r}")
        return value


    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.pretrained and self.params.get("pretrained_backbone"):
            raise ValueError("give either `pretrained` (the whole model) or "
                             "`pretrained_backbone` (a segmentation backbone), not both")
        return self


#: Bounds of the built-in datasets' common keyword arguments (``data.params``).
_DATA_PARAM_BOUNDS: dict[str, dict[str, Any]] = {
    "test_fraction": {"low": 0, "high": 1, "low_open": True, "high_open": True},
    "imbalance_ratio": {"low": 1, "note": " (n_max / n_min)"},
    "crop_size": {"low": 16, "integer": True},
}


class DataConfig(_Factory):
    """The data: a dataset factory, its folder, the split and the factory's own arguments.

    Attributes:
        name: a registered dataset (``digits``, ``cifar10``, ``voc``, ``newsgroups20``, ...) or
            ``package.module:attr`` of a factory ``f(data_dir, seed, val_fraction, **params)
            -> DatasetSplits``.
        dir: folder of an on-disk dataset (``data_dir`` of the factory); None for ``digits``.
        val_fraction: share held out for validation, in (0, 1); None: the dataset's default.
        seed: seed of the split when it must stay fixed while the run's `seed` varies (the
            seeds of a repeated sweep); None: the run's seed.
        params: the factory's keyword arguments (built-ins: ``test_fraction``,
            ``imbalance_ratio``, ``crop_size`` of a segmentation dataset, ``image_size`` of
            ``cub200``; a user's own).
    """

    _what: ClassVar[str] = "data"
    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {
        "val_fraction": {"low": 0, "high": 1, "low_open": True, "high_open": True,
                         "optional": True},
    }
    name: str = DEFAULT_DATASET
    dir: str | None = None
    val_fraction: float | None = None
    seed: int | None = None



    @field_validator("seed", mode="before")
    @classmethod
    def _check_seed(cls, value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"`data_seed` must be an integer >= 0 or null, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_known_params(self) -> DataConfig:
        for key in ("test_fraction", "imbalance_ratio", "crop_size"):
            value = self.params.get(key)
            if value is None:
                continue
            self.params[key] = _bounded(key, value, **_DATA_PARAM_BOUNDS[key])
        test = self.params.get("test_fraction")
        if self.val_fraction is not None and test is not None and self.val_fraction + test >= 1:
            raise ValueError("`val_fraction` + `test_fraction` must be < 1, got "
                             f"{self.val_fraction} + {test}")
        return self


class OptimizerConfig(_Factory):
    """The optimizer: any ``torch.optim`` class by name, or an import string, and its arguments.

    Attributes:
        name: ``sgd`` (default), ``adam``, ``adamw``, any other ``torch.optim`` class name
            (case-insensitive: ``rmsprop``, ``NAdam``) or ``package.module:attr``.
        lr: learning rate (> 0), scaled per epoch by the schedule.
        weight_decay: weight decay (>= 0) on every parameter, biases included (L2 for SGD and
            Adam, decoupled for AdamW, as torch defines each).
        params: the class's other keyword arguments (``momentum``, ``nesterov``, ``betas``,
            ``eps``, ...). SGD gets ``momentum: 0.9`` unless set (:data:`OPTIMIZER_DEFAULTS`).
    """

    _what: ClassVar[str] = "optimizer"
    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {
        "lr": {"low": 0, "low_open": True},
        "weight_decay": {"low": 0},
    }
    name: str = "sgd"
    lr: float = 0.05
    weight_decay: float = 5e-4



    @model_validator(mode="after")
    def _check_momentum(self) -> OptimizerConfig:
        momentum = self.params.get("momentum")
        if momentum is not None:
            self.params["momentum"] = _bounded("momentum", momentum, low=0, high=1,
                                               high_open=True)
        nesterov = self.params.get("nesterov")
        if nesterov is not None and not isinstance(nesterov, bool):
            raise ValueError(f"`nesterov` must be true or false, got {nesterov!r}")
        if nesterov and self.kwargs().get("momentum", 0) == 0:
            raise ValueError("`nesterov` needs `momentum` > 0")
        return self

    def kwargs(self) -> dict[str, Any]:
        """The optimizer's keyword arguments besides the parameters.

        ``lr``, ``weight_decay``, the defaults of :data:`OPTIMIZER_DEFAULTS` and `params`.
        """
        defaults = OPTIMIZER_DEFAULTS.get(self.name.lower(), {})
        return {"lr": self.lr, "weight_decay": self.weight_decay, **defaults, **self.params}


class ScheduleConfig(Section):
    """The learning-rate schedule, stepped once per epoch (see :mod:`raysearch.training`).

    Attributes:
        name: ``cosine`` (to 0 at the last epoch), ``multistep`` (multiply by `lr_decay` at each
            epoch in `milestones`) or ``constant``.
        milestones: comma-separated epochs of the ``multistep`` decays, e.g. ``"150,250"``
            (MbLS App. B: lr 0.1, x0.1 at epochs 150 and 250 of 350); a list is accepted.
        lr_decay: factor of each ``multistep`` decay, in (0, 1].
        warmup_epochs: linear warm-up from lr/10 to lr over this many epochs (0: none).
    """

    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {
        "lr_decay": {"low": 0, "high": 1, "low_open": True},
        "warmup_epochs": {"low": 0, "integer": True},
    }
    name: str = "cosine"
    milestones: str = ""
    lr_decay: float = 0.1
    warmup_epochs: int = 0

    @field_validator("name", mode="before")
    @classmethod
    def _check_name(cls, value: Any) -> str:
        if value not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {', '.join(SCHEDULES)}, got {value!r}")
        return value

    @field_validator("milestones", mode="before")
    @classmethod
    def _check_milestones(cls, value: Any) -> str:
        return _milestones_text(value)


    @model_validator(mode="after")
    def _needs_milestones(self) -> ScheduleConfig:
        if self.name == "multistep" and not self.milestones:
            raise ValueError("`schedule: multistep` needs `milestones`, e.g. \"150,250\"")
        return self

    def milestone_epochs(self) -> list[int]:
        """The ``multistep`` decay epochs as ints (empty when none)."""
        return [int(part) for part in self.milestones.split(",") if part]


class RunConfig(Section):
    """One training run: loss, model, data, optimizer and schedule sections, and its settings.

    Build it from sections (``RunConfig(loss={"name": "acls", "params": {...}},
    optimizer={"name": "adamw", "lr": 1e-3})``), from the flat keys of earlier versions and of
    space files (``RunConfig(method="ls", loss_params={"epsilon": 0.1}, lr=0.1, epochs=3)``,
    :meth:`from_flat`), or from YAML (:meth:`from_yaml`, both layouts).

    Attributes:
        loss: :class:`LossConfig`.
        model: :class:`ModelConfig`.
        data: :class:`DataConfig`.
        optimizer: :class:`OptimizerConfig`.
        schedule: :class:`ScheduleConfig`.
        epochs: number of training epochs (>= 1).
        batch_size: mini-batch size (>= 1).
        seed: seed of the initialisation and the batch order, and of the data split unless
            ``data.seed`` is set.
        ece_bins: number of bins of the reported calibration errors (>= 1); not the ``n_bins``
            loss parameter of SB-ECE.
        mixup_alpha: MixUp (Zhang et al. 2018) with lambda ~ Beta(alpha, alpha) per batch; 0 off.
        cutmix_alpha: CutMix (Yun et al. 2019) with lambda ~ Beta(alpha, alpha); 0 off. With
            both > 0 each batch uses one of the two, chosen with probability 0.5.
        ricap_beta: RICAP (Takahashi et al. 2018): four crops patched into each image around a
            boundary with position ~ Beta(beta, beta), labels mixed by patch area; 0 off (the
            paper uses 0.3). With MixUp/CutMix also on, each batch uses one of them, chosen
            uniformly.
        interleaved: interleaved training (Karandikar et al. App. B): each epoch trains the
            primary objective on the training set minus a held-out share, then the secondary
            (soft calibration) objective on that share; needs a ``primary + beta * secondary``
            loss.
        interleave_fraction: held-out share of the training set for interleaving, in (0, 1).
    """

    loss: LossConfig = Field(default_factory=LossConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    epochs: int = 10
    batch_size: int = 64
    seed: int = 0
    ece_bins: int = 15
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    ricap_beta: float = 0.0
    interleaved: bool = False
    interleave_fraction: float = 0.1

    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {
        "epochs": {"low": 1, "integer": True},
        "batch_size": {"low": 1, "integer": True},
        "seed": {"low": 0, "integer": True},
        "ece_bins": {"low": 1, "integer": True},
        "mixup_alpha": {"low": 0, "note": " (0 = off)"},
        "cutmix_alpha": {"low": 0, "note": " (0 = off)"},
        "ricap_beta": {"low": 0, "note": " (0 = off)"},
        "interleave_fraction": {"low": 0, "high": 1, "low_open": True, "high_open": True},
    }

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ValueError(one_line_error(exc)) from None

    @model_validator(mode="before")
    @classmethod
    def _flat_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and any(k not in cls.model_fields or
                                             (k in SECTIONS and not isinstance(v, (Mapping,
                                                                                   BaseModel)))
                                             for k, v in data.items()):
            return flat_to_sections(data)
        return data

    @field_validator("interleaved", mode="before")
    @classmethod
    def _check_interleaved(cls, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"`interleaved` must be true or false, got {value!r}")
        return value

    def __getattr__(self, name: str) -> Any:
        # the flat fields of earlier versions, read-only (``cfg.method``, ``cfg.lr``,
        # ``cfg.loss_params``, ...): kept so that code written against them still runs.
        # ``model``, ``optimizer`` and ``schedule`` are the sections now.
        path = LEGACY_KEYS.get(name)
        if path is not None and name not in SECTIONS:
            node: Any = self
            for part in path:
                node = node.get(part) if isinstance(node, dict) else getattr(node, part)
            return node
        return super().__getattr__(name)  # type: ignore[misc]

    # -- derived ---------------------------------------------------------------------------
    def milestone_epochs(self) -> list[int]:
        """The schedule's ``multistep`` decay epochs as ints (empty when none)."""
        return self.schedule.milestone_epochs()

    @property
    def split_seed(self) -> int:
        """Seed of the data split: ``data.seed``, or `seed` when it is None."""
        return self.seed if self.data.seed is None else self.data.seed

    def validate(self) -> None:
        """Check every field again (after an assignment to a section's dict, say).

        Raises:
            ValueError: naming the first field that is out of range or of the wrong type.
        """
        type(self)(**self.model_dump())

    # -- plain data in, plain data out ----------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (YAML/JSON-safe) of every section and field."""
        return _plain(self.model_dump())

    @classmethod
    def from_flat(cls, flat: Mapping[str, Any]) -> RunConfig:
        """Build from flat keys (a trial's config, an old export); see the module docstring.

        Raises:
            ValueError: on unknown keys or invalid values.
        """
        return cls(**flat_to_sections(flat))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Build from a mapping in either layout (sections, or the flat keys of old exports).

        Raises:
            ValueError: on unknown keys or invalid values.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a run config must be a mapping, got {type(data).__name__}")
        return cls(**dict(data))

    def to_yaml(self, path: str | Path) -> None:
        """Write this config as YAML (readable by :meth:`from_yaml` and ``raysearch train``)."""
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunConfig:
        """Read a config written by :meth:`to_yaml` or ``raysearch export`` (any version).

        A file with a top-level ``config:`` mapping (the export format, which also carries the
        sweep's metrics) is accepted too.

        Raises:
            FileNotFoundError: if `path` does not exist.
            ValueError: on malformed YAML or invalid values, naming the file.
        """
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: malformed YAML ({_first_line(exc)})") from None
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            data = data["config"]
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def _set(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = out
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"`{'.'.join(path)}` clashes with a value of {part!r}")
    node[path[-1]] = value


def flat_to_sections(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Flat keys (legacy fields, ``train:`` keys, dotted ``model.<kw>``) -> section dicts.

    Section mappings given as such (``{"model": {"name": ..., "params": ...}}``) are merged in
    first; flat keys then set single fields. Legacy values that every old export carried and
    that would now be a keyword nobody takes (``crop_size: 512``, ``nesterov: false``, a null
    ``embeddings``, SGD's ``momentum`` on another optimizer) are dropped.

    Raises:
        ValueError: for a key that is neither a field, a legacy key nor a dotted section key.
    """
    out: dict[str, Any] = {}
    for section in SECTIONS:
        value = flat.get(section)
        if isinstance(value, BaseModel):
            value = value.model_dump()
        if isinstance(value, Mapping):
            out[section] = {k: (dict(v) if isinstance(v, Mapping) else v)
                            for k, v in value.items()}
    optimizer = flat.get("optimizer")
    optimizer_name = (optimizer if isinstance(optimizer, str)
                      else (out.get("optimizer") or {}).get("name", "sgd"))
    for key, value in flat.items():
        if key in SECTIONS and isinstance(value, (Mapping, BaseModel)):
            continue
        if key in RUN_KEYS:
            out[key] = value
        elif key in LEGACY_KEYS:
            if key in _LEGACY_DEFAULTS and value == _LEGACY_DEFAULTS[key]:
                continue
            if key == "momentum" and str(optimizer_name).lower() != "sgd":
                continue  # old exports carried SGD's momentum for Adam runs too
            if key == "loss_params":
                if value is None:
                    continue
                if not isinstance(value, Mapping):
                    raise ValueError(f"`loss_params` must be a mapping, got {value!r}")
                out.setdefault("loss", {}).setdefault("params", {}).update(value)
                continue
            if value is None and len(LEGACY_KEYS[key]) == 3:
                continue  # a param that is off: pass nothing
            _set(out, LEGACY_KEYS[key], value)
        elif "." in key and key.split(".", 1)[0] in SECTIONS:
            section, kw = key.split(".", 1)
            if section == "optimizer" and kw in ("lr", "weight_decay", "name"):
                _set(out, (section, kw), value)
            elif section == "schedule":
                _set(out, (section, kw), value)
            elif kw == "name":
                _set(out, (section, "name"), value)
            else:
                _set(out, (section, "params", kw), value)
        else:
            known = sorted({*RunConfig.model_fields, *LEGACY_KEYS})
            raise ValueError(f"unknown run-config key(s) {key}; known: {', '.join(known)} "
                             "(and model.<kw>, data.<kw>, optimizer.<kw>)")
    return out


def _milestones_text(value: Any) -> str:
    """``"150,250"`` from a string, an int or a list of ints; ValueError otherwise."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        raise ValueError(f"`milestones` must be epochs like \"150,250\", got {value!r}")
    if isinstance(value, int):
        parts: list[Any] = [value]
    elif isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise ValueError(f"`milestones` must be epochs like \"150,250\", got {value!r}")
    epochs = []
    for part in parts:
        try:
            epoch = int(part)
        except (TypeError, ValueError):
            raise ValueError(
                f"`milestones` must be epochs like \"150,250\", got {value!r}") from None
        if isinstance(part, float) and not part.is_integer() or epoch < 1:
            raise ValueError(f"`milestones` must be positive integer epochs, got {value!r}")
        epochs.append(epoch)
    if epochs != sorted(set(epochs)):
        raise ValueError(f"`milestones` must be increasing, got {value!r}")
    return ",".join(str(e) for e in epochs)


def _plain(value: Any) -> Any:
    """Turn numpy scalars and tuples into plain Python values so YAML and MLflow see them."""
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (list, dict)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


# ------------------------------------------------------------------------------------------
# The sweep: what a sweep runs besides its search space, and the resources of its trials.
# ------------------------------------------------------------------------------------------

#: ``--objective`` names -> (metric(s), mode(s)) given to the searcher; any metric a trial
#: reports also works as ``<metric>[:min|max]`` (:meth:`SweepSettings.objective_metrics`).
OBJECTIVES: dict[str, tuple[Any, Any]] = {
    "pareto": (["val_accuracy", "val_ece"], ["max", "min"]),
    "ece": ("val_ece", "min"),
    "accuracy": ("val_accuracy", "max"),
    "nll": ("val_nll", "min"),
}
SAMPLERS = ("tpe", "nsga2", "random")
SCHEDULERS = ("asha",)
#: ``--selection``: the rule applied to a repeated sweep's configurations (see
#: :mod:`raysearch.repeats`): ``mean`` (lowest mean ECE within the tolerance of the best mean
#: accuracy) or ``robust`` (lowest mean + 1 SEM of ECE, same accuracy constraint).
SELECTIONS = ("mean", "robust")
#: Values of ``precision``.
PRECISIONS = ("auto", "bf16", "fp32")
#: Set by Ray in the environment of a Ray Job's entrypoint (``ray job submit -- ...``).
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
#: Experiment of every sweep unless ``--experiment`` says otherwise.
DEFAULT_EXPERIMENT = "raysearch"


class Resources(Section):
    """What every trial of a sweep asks Ray for, and its precision.

    Attributes:
        cpus_per_trial: CPUs reserved per trial (> 0): torch threads on the CPU and DataLoader
            workers (CPUs - 1) for datasets read from files.
        gpus_per_trial: GPUs reserved per trial (>= 0); fractions share a GPU (0.25: four
            trials on one GPU); above 1 a whole number. 0 trains on the CPU.
        workers_per_trial: Ray Train DDP workers per trial (1: no DDP, the trial trains in its
            own process).
        cpus_per_worker: CPUs per DDP worker (> 0).
        gpus_per_worker: GPUs per DDP worker (0 or a whole number: NCCL ranks cannot share).
        precision: ``auto`` (bf16 autocast on a GPU, fp32 on the CPU), ``bf16`` or ``fp32``.
    """

    _BOUNDS: ClassVar[dict[str, dict[str, Any]]] = {
        "cpus_per_trial": {"low": 0, "low_open": True},
        "gpus_per_trial": {"low": 0},
        "workers_per_trial": {"low": 1, "integer": True},
        "cpus_per_worker": {"low": 0, "low_open": True},
        "gpus_per_worker": {"low": 0},
    }
    cpus_per_trial: float = 1.0
    gpus_per_trial: float = 0.0
    workers_per_trial: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    precision: str = "auto"

    @field_validator("precision", mode="before")
    @classmethod
    def _precision(cls, value: Any) -> str:
        if value not in PRECISIONS:
            raise ValueError(f"unknown precision '{value}'; choose from {', '.join(PRECISIONS)}")
        return value

    @model_validator(mode="after")
    def _together(self) -> Resources:
        if self.gpus_per_trial > 1 and not float(self.gpus_per_trial).is_integer():
            raise ValueError("`gpus_per_trial` above 1 must be a whole number of GPUs, got "
                             f"{self.gpus_per_trial}")
        if self.workers_per_trial > 1 and self.gpus_per_trial:
            raise ValueError("with --workers-per-trial > 1 the GPUs are per worker: use "
                             "--gpus-per-worker instead of --gpus-per-trial")
        return self


_RESOURCE_KEYS = tuple(Resources.model_fields)


class SweepSettings(BaseModel):
    """Everything a sweep needs besides its search space (the CLI's options, the API's keywords).

    The resources of each trial are the section :attr:`resources` (:class:`Resources`); their
    keys are also accepted flat (``SweepSettings(cpus_per_trial=2)``), as the CLI and sweeps
    recorded by earlier versions give them.

    Attributes:
        num_samples: number of sampled configurations (>= 1): trials, or with `repeats` R,
            configurations of R trials each.
        repeats: seeds per configuration (>= 1). With R > 1 every sampled configuration is
            trained R times, with seeds ``seed + k`` (k = 0..R-1) on the split of ``seed``
            (:class:`~raysearch.searchers.RepeatedSearcher`); the searcher is told the mean over
            the seeds, MLflow gets a configuration run (mean and SEM of every metric) with the
            seed runs nested under it, and the front and the rule use the means.
        selection: the rule applied to the configurations of a repeated sweep: ``mean``
            (default) or ``robust`` (lowest mean + 1 SEM of ECE; needs `repeats` >= 2).
        max_concurrent: trials running at once (>= 1).
        epochs: overrides the space's ``epochs`` when set.
        dataset: dataset name or import string; None (default): the space's ``data: name``,
            else ``digits``. Set to the name the trials use once the sweep resolved it.
        recipe: the training protocol (:mod:`raysearch.recipes`): a recipe name
            (``mbls-cifar10``) or YAML file; None (default): the recipe of the space's method
            on the dataset, if one exists; ``"none"``: no recipe.
        data_dir: folder of on-disk datasets.
        seed: seeds the sampler and every trial's data split and initialisation.
        name: sweep name (default ``<space>-<YYYYmmdd-HHMMSS>``).
        tracking_uri: MLflow tracking URI (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: MLflow experiment name.
        objective: ``pareto`` (default), ``ece``, ``accuracy``, ``nll``, or any metric the
            trials report as ``<metric>[:min|max]`` (``val_brier``, ``overconfidence:min``,
            a user's metric of `metrics`); without a mode, metrics ending in ``accuracy`` or
            ``miou`` are maximised, the others minimised.
        ece_metric: the calibration error the objective, the Pareto front and the selection
            rule use (default ``ece``; ``aece``, ``cece``, ``debiased_ce``, ``ece_l2em``,
            ``ks``, ``ece_100``, ``sweep_ce``, ``brier``, ``nll``, a user's metric of `metrics`,
            ...; :data:`raysearch.metrics.TABLE_KEYS`).
        accuracy_metric: the accuracy axis of the front and the rule; None (default): the
            data's primary metric (``accuracy``, or ``miou`` for segmentation), set when the
            data is loaded.
        metrics: a user's metric functions, as import strings ``package.module:fn`` (the API
            also takes callables) of ``fn(probs (N, K), labels (N,)) -> float``; every trial
            logs ``val_<fn>`` each epoch and ``test_<fn>`` at the end.
        sampler: ``tpe`` (default), ``nsga2`` or ``random``.
        scheduler: None or ``asha`` (early stopping on its own single metric,
            `scheduler_metric`).
        scheduler_metric: metric ASHA compares (default ``val_nll``, lower is better).
        tolerance: accuracy tolerance of the selection rule (absolute fraction, default 0.01).
        address: address of an existing Ray cluster (None: start a local Ray).
        storage_path: where Tune keeps trial checkpoints: a local folder (an NFS mount on a
            cluster) or a URI such as ``s3://bucket/prefix`` (default ``~/ray_results``).
        n_bins: bins of the reported calibration errors.
        posthoc: post-hoc calibrators fitted on each trial's validation logits and measured on
            its test logits (``test_ece_ts``, ...); empty for none.
        checkpoint_every: a trial checkpoints every n-th epoch (0: the last epoch only); None
            (default): once a minute of training. The last epoch always carries a checkpoint.
        model: overrides the space's model (a name, ``torchvision:<name>`` or an import string).
        download: let the driver download a missing dataset into `data_dir` (and torchvision
            weights named by `pretrained`) before any trial.
        val_fraction: overrides the dataset's validation share.
        imbalance_ratio: long-tailed training set (rho >= 1), a built-in dataset's argument.
        shift_eval: evaluate every complete trial on the corrupted test set (15 ImageNet-C
            corruptions x 5 severities), before and after the first `posthoc` calibrator.
        shift_data: a released corrupted test set (a CIFAR-10-C-layout folder
            ``<corruption>.npy`` + ``labels.npy``, or an ImageNet-C-layout folder
            ``<corruption>/<severity>/<class>/*.JPEG``) every complete trial is evaluated on
            instead of `shift_eval`'s own corruptions (see
            :func:`raysearch.shift.load_released_shift_set`); None: none.
        shift_samples: test images in the shift evaluation (stratified subsample); None
            (default): 1000 with `shift_eval`, every image with `shift_data`.
        max_failures: how often Tune retries a trial that raised or whose node died; None
            (default): 2 on a cluster, else 0. A diverged trial is never retried.
        fault_epoch: a fault drill: the first attempt of every trial raises after reporting
            this epoch; None: never.
        crop_size: ``data.crop_size`` of a segmentation dataset (refused by datasets that take
            no ``crop_size``).
        pretrained_backbone: ``model.pretrained_backbone``: a local torchvision state-dict file
            for a segmentation model's backbone.
        pretrained: weights every trial's model starts from (a file or a torchvision weights
            name); checked, and its sha256 logged, before Ray starts.
        freeze_backbone_epochs: epochs during which only the classification head trains.
        head_lr: learning rate of the classification head (None: the trial's ``lr``).
        embeddings: ``model.embeddings_path``: a GloVe-format file for a text model's frozen
            embedding.
        extra_overrides: more trial-config keys every trial gets, e.g. ``{"model.hidden": 64,
            "data.n_features": 20}`` (``--model-param``, ``--data-param``).
        resources: :class:`Resources` of each trial.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    num_samples: int = 8
    repeats: int = 1
    selection: str = "mean"
    max_concurrent: int = 2
    epochs: int | None = None
    dataset: str | None = None
    recipe: str | None = None
    data_dir: str | None = None
    seed: int = 0
    name: str | None = None
    tracking_uri: str | None = None
    experiment: str = DEFAULT_EXPERIMENT
    objective: str = "pareto"
    ece_metric: str = "ece"
    accuracy_metric: str | None = None
    metrics: tuple[str, ...] = ()
    sampler: str = "tpe"
    scheduler: str | None = None
    scheduler_metric: str = "val_nll"
    tolerance: float = 0.01
    address: str | None = None
    storage_path: str | None = None
    n_bins: int = 15
    posthoc: tuple[str, ...] = ("ts",)
    checkpoint_every: int | None = None
    model: str | None = None
    download: bool = False
    val_fraction: float | None = None
    imbalance_ratio: float | None = None
    shift_eval: bool = False
    shift_data: str | None = None
    shift_samples: int | None = None
    max_failures: int | None = None
    fault_epoch: int | None = None
    crop_size: int | None = None
    pretrained_backbone: str | None = None
    pretrained: str | None = None
    freeze_backbone_epochs: int | None = None
    head_lr: float | None = None
    embeddings: str | None = None
    extra_overrides: dict[str, Any] = Field(default_factory=dict)
    resources: Resources = Field(default_factory=Resources)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ValueError(one_line_error(exc, "sweep setting")) from None

    @model_validator(mode="before")
    @classmethod
    def _flat_resources(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and any(k in data for k in _RESOURCE_KEYS):
            data = dict(data)
            section = dict(data.get("resources") or {})
            if isinstance(section, BaseModel):
                section = section.model_dump()
            for key in _RESOURCE_KEYS:
                if key in data:
                    section[key] = data.pop(key)
            data["resources"] = section
        return data

    @field_validator("shift_data", mode="after")
    @classmethod
    def _absolute_shift_data(cls, value: str | None) -> str | None:
        # the trials and a later --resume (from another folder) read the same folder
        return _absolute(value)

    @field_validator("posthoc", "metrics", mode="before")
    @classmethod
    def _names(cls, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return tuple(value)

    def __getattr__(self, name: str) -> Any:
        # the resources' keys read flat, as before they had a section
        if name in _RESOURCE_KEYS:
            return getattr(self.resources, name)
        return super().__getattr__(name)  # type: ignore[misc]

    def validate(self) -> None:
        """Raises ValueError naming the first invalid setting."""
        if self.num_samples < 1:
            raise ValueError(f"`num_samples` must be >= 1, got {self.num_samples}")
        if self.repeats < 1:
            raise ValueError(f"`repeats` must be an int >= 1, got {self.repeats!r}")
        if self.selection not in SELECTIONS:
            raise ValueError(f"unknown selection '{self.selection}'; choose from "
                             f"{', '.join(SELECTIONS)}")
        if self.selection == "robust" and self.repeats < 2:
            raise ValueError("--selection robust needs the standard error over seeds: use it "
                             "with --repeats 2 or more")
        if self.max_concurrent < 1:
            raise ValueError(f"`max_concurrent` must be >= 1, got {self.max_concurrent}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"`epochs` must be >= 1, got {self.epochs}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler '{self.sampler}'; choose from {', '.join(SAMPLERS)}")
        if self.scheduler not in (None, *SCHEDULERS):
            raise ValueError(f"unknown scheduler '{self.scheduler}'; "
                             f"choose from {', '.join(SCHEDULERS)}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"`tolerance` must be in [0, 1), got {self.tolerance}")
        if self.n_bins < 1:
            raise ValueError(f"`n_bins` must be >= 1, got {self.n_bins}")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise ValueError(f"`checkpoint_every` must be >= 0, got {self.checkpoint_every}")
        if self.max_failures is not None and self.max_failures < 0:
            raise ValueError(f"`max_failures` must be an int >= 0, got {self.max_failures!r}")
        if self.fault_epoch is not None and self.fault_epoch < 1:
            raise ValueError(f"`fault_epoch` must be >= 1, got {self.fault_epoch}")
        if self.shift_samples is not None and self.shift_samples < 1:
            raise ValueError(f"`shift_samples` must be >= 1, got {self.shift_samples}")
        if self.shift_eval and self.shift_data is not None:
            raise ValueError("--shift-data and --shift-eval are mutually exclusive: --shift-eval "
                             "corrupts the test set itself, --shift-data reads a released "
                             "corrupted test set; give one")
        if self.posthoc:
            from raysearch.calibration import CALIBRATOR_REGISTRY

            for name in self.posthoc:
                CALIBRATOR_REGISTRY.get(name)  # an unknown name: the registry's error
        known = self.known_metrics()
        self._check_metric_name(self.ece_metric, known, "--ece-metric")
        if self.accuracy_metric is not None:
            self._check_metric_name(self.accuracy_metric, known, "--accuracy-metric")
        self.objective_metrics()  # parses and checks --objective

    # -- metrics -------------------------------------------------------------------------
    def metric_names(self) -> list[str]:
        """Names the user's metric functions are logged under (``val_<name>``)."""
        return [metric_name(m) for m in self.metrics]

    def known_metrics(self) -> set[str]:
        """Metric names (without ``val_``/``test_``) every trial of this sweep reports."""
        from raysearch.metrics import (
            CALIBRATED_KEYS,
            DENSE_KEYS,
            ESTIMATOR_KEYS,
            SUMMARY_KEYS,
            TABLE_KEYS,
        )

        base = {*SUMMARY_KEYS, *DENSE_KEYS, *ESTIMATOR_KEYS, *TABLE_KEYS, *self.metric_names()}
        # after a post-hoc calibrator: the summary and table metrics (not a user's metrics)
        calibrated = {f"{m}_{c}" for m in CALIBRATED_KEYS for c in self.posthoc}
        return base | calibrated

    @staticmethod
    def _check_metric_name(name: str, known: set[str], option: str,
                           given: str | None = None) -> None:
        if name not in known:
            import difflib

            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"{option} {given or name}: the trials report no metric "
                             f"val_{name}{hint}; they report: {', '.join(sorted(known))}")

    @property
    def accuracy_key(self) -> str:
        """``val_<accuracy_metric>``: ``val_accuracy``, or ``val_miou`` for segmentation."""
        return f"val_{self.accuracy_metric or 'accuracy'}"

    @property
    def ece_key(self) -> str:
        """The validation metric of the selection rule, ``val_<ece_metric>``."""
        return f"val_{self.ece_metric}"

    def objective_metrics(self) -> tuple[Any, Any]:
        """The searcher's metric(s) and mode(s).

        :data:`OBJECTIVES` with the chosen ECE and accuracy axes, or ``<metric>[:min|max]``.

        Raises:
            ValueError: for a metric the trials do not report or a mode other than min/max.
        """
        if self.objective in OBJECTIVES:
            metric, mode = OBJECTIVES[self.objective]
            swap = {"val_ece": self.ece_key, "val_accuracy": self.accuracy_key}
            if isinstance(metric, list):
                return [swap.get(m, m) for m in metric], mode
            return swap.get(metric, metric), mode
        name, _, mode = self.objective.partition(":")
        base = name[len("val_"):] if name.startswith("val_") else name
        self._check_metric_name(base, self.known_metrics(), "--objective", self.objective)
        if not mode:
            root = base
            for calibrator in self.posthoc:  # val_accuracy_ts is an accuracy too
                if root.endswith(f"_{calibrator}"):
                    root = root[: -len(calibrator) - 1]
            mode = "max" if root.endswith(("accuracy", "miou")) else "min"
        if mode not in ("min", "max"):
            raise ValueError(f"--objective {self.objective}: the mode after ':' must be min or "
                             f"max, got {mode!r}")
        return f"val_{base}", mode

    def resolved_max_failures(self) -> int:
        """`max_failures`, or its default: 2 on a cluster (`address` or a Ray Job), else 0."""
        if self.max_failures is not None:
            return self.max_failures
        on_cluster = (self.address and self.address != "local") or RAY_JOB_ENV in os.environ
        return 2 if on_cluster else 0

    @property
    def trials(self) -> int:
        """Tune trials of the sweep: `num_samples` x `repeats`."""
        return self.num_samples * self.repeats

    def selection_rule(self) -> str:
        """The rule in words (the parent run's ``selection_rule`` param)."""
        acc = self.accuracy_key
        if self.repeats == 1:
            return f"lowest {self.ece_key} within {self.tolerance} of the best {acc}"
        if self.selection == "robust":
            return (f"lowest mean + 1 SEM of {self.ece_key} over {self.repeats} seeds among "
                    f"configurations within {self.tolerance} of the best mean {acc}")
        return (f"lowest mean {self.ece_key} over {self.repeats} seeds within {self.tolerance} "
                f"of the best mean {acc}")

    def to_record(self) -> dict[str, Any]:
        """The settings as JSON-ready data (the sweep's record, for ``--resume``)."""
        return _plain(self.model_dump())

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SweepSettings:
        """Settings written by :meth:`to_record` (any version; unknown keys are ignored)."""
        names = {*cls.model_fields, *_RESOURCE_KEYS}
        return cls(**{k: v for k, v in record.items() if k in names})

    def overrides(self) -> dict[str, Any]:
        """Trial-config keys every trial of the sweep shares (flat, as ``RunConfig.from_flat``)."""
        out = {"seed": self.seed, "ece_bins": self.n_bins, **self.extra_overrides}
        if self.dataset is not None:
            out["dataset"] = self.dataset
        if self.data_dir is not None:
            out["data_dir"] = _absolute(self.data_dir)
        if self.epochs is not None:
            out["epochs"] = self.epochs
        if self.pretrained_backbone is not None:
            out["model.pretrained_backbone"] = _absolute(self.pretrained_backbone)
        if self.pretrained is not None:  # a file (made absolute for the trials) or a name
            path = Path(self.pretrained).expanduser()
            out["pretrained"] = str(path.resolve()) if path.is_file() else self.pretrained
        if self.embeddings is not None:
            out["model.embeddings_path"] = _absolute(self.embeddings)
        if self.crop_size is not None:
            out["data.crop_size"] = self.crop_size
        if self.imbalance_ratio is not None:
            out["data.imbalance_ratio"] = self.imbalance_ratio
        for key in ("freeze_backbone_epochs", "head_lr", "model", "val_fraction"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def metric_name(spec: Any) -> str:
    """The name a user's metric is logged under: the function's name (``val_<name>``)."""
    if isinstance(spec, str):
        return spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    return getattr(spec, "__name__", type(spec).__name__)


def _absolute(path: str | None) -> str | None:
    """Trials on other nodes or in other working directories need an absolute data path."""
    return None if path is None else str(Path(path).expanduser().resolve())
