"""The configuration of one training run: :class:`RunConfig` and its sections.

:class:`LossConfig`, :class:`ModelConfig`, :class:`DataConfig`, :class:`OptimizerConfig` and
:class:`ScheduleConfig` (each a :class:`~raysearch.config.base.Section`) and the
:class:`RunConfig` holding them; see :mod:`raysearch.config` for the layout. A RunConfig takes
sections only; the flat layout of earlier exports is read by :meth:`RunConfig.from_dict` and
:meth:`RunConfig.from_yaml` through :func:`raysearch.config.flat.sections_from_flat`.

Imports :mod:`raysearch.config.base` and :mod:`raysearch.config.flat` only of the package (and
pydantic, PyYAML); never :mod:`raysearch.config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from raysearch.config.base import Section, bounded, one_line_error, plain_data
from raysearch.config.flat import as_sections
from raysearch.config.yaml_file import read_yaml_file

__all__ = ["DATA_PARAM_BOUNDS", "DEFAULT_DATASET", "DEFAULT_MODEL", "OPTIMIZERS",
           "OPTIMIZER_DEFAULTS", "SCHEDULES", "DataConfig", "LossConfig", "ModelConfig",
           "OptimizerConfig", "RunConfig", "ScheduleConfig", "milestones_text"]

#: The embedded default: scikit-learn's bundled digits and the small CNN (no download).
DEFAULT_DATASET = "digits"
DEFAULT_MODEL = "cnn"

#: Optimisers by short name (any ``torch.optim`` class also works by its name, case-insensitive,
#: or by import string; see :mod:`raysearch.training.optim`).
OPTIMIZERS = ("sgd", "adam", "adamw")
#: Learning-rate schedules of :attr:`ScheduleConfig.name`.
SCHEDULES = ("cosine", "multistep", "constant")
#: Keyword arguments an optimizer gets by default unless its section sets them: SGD with
#: momentum 0.9, as every paper of this field trains.
OPTIMIZER_DEFAULTS: dict[str, dict[str, Any]] = {"sgd": {"momentum": 0.9}}

def _name(section: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"`name` of the {section} must be a non-empty string (a registered "
                         f"name or an import string package.module:attr), got {value!r}")
    return value.strip()


def _params(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"`params` must be a mapping of keyword arguments, got {value!r}")
    return {str(k): plain_data(v) for k, v in value.items()}


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
            number of classes differs
            (:func:`raysearch.training.models.pretrained.load_pretrained`).
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
DATA_PARAM_BOUNDS: dict[str, dict[str, Any]] = {
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
            self.params[key] = bounded(key, value, **DATA_PARAM_BOUNDS[key])
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
            self.params["momentum"] = bounded("momentum", momentum, low=0, high=1,
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
    """The learning-rate schedule, stepped once per epoch (see :mod:`raysearch.training.run`).

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
        return milestones_text(value)


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
    optimizer={"name": "adamw", "lr": 1e-3}, epochs=3)``), or read it from plain data or YAML
    in either layout, sections or the flat keys of earlier exports (:meth:`from_dict`,
    :meth:`from_yaml`).

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
        compile: compile the model and the loss with ``torch.compile`` (the default backend,
            Inductor: on the CPU it needs a C++ compiler); the run's final metrics then hold
            ``train_compile_seconds``, the time spent compiling, which the first steps and the first
            evaluation batches pay. Off by default: a short run spends more time compiling
            than it saves. The metrics differ from an uncompiled run's by rounding only.
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
    compile: bool = False

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

    @field_validator("interleaved", "compile", mode="before")
    @classmethod
    def _check_switch(cls, value: Any, info: ValidationInfo) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"`{info.field_name}` must be true or false, got {value!r}")
        return value

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
        return plain_data(self.model_dump())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """Build from a mapping in either layout: sections, or the flat keys of old exports.

        The flat layout is read by :func:`raysearch.config.flat.sections_from_flat`.

        Raises:
            ValueError: on unknown keys or invalid values.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a run config must be a mapping, got {type(data).__name__}")
        return cls(**as_sections(data))

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
            ValueError: one line naming the file: malformed YAML, a YAML alias, a duplicate key,
                a file over :data:`~raysearch.config.yaml_file.MAX_YAML_BYTES` or invalid values.
        """
        path = Path(path)
        data = read_yaml_file(path)
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            data = data["config"]
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None


def milestones_text(value: Any) -> str:
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
