"""Typed, validated configuration of one training run (YAML in, YAML out).

A :class:`RunConfig` is what one trial trains and what ``raysearch export`` writes: the method
(a loss name from :func:`raysearch.losses.build_loss`) with its parameters, plus the data, model and
optimiser settings. It is plain data: no Ray, no MLflow.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

#: Training hyperparameters a search space may sample or fix (besides the loss parameters).
TRAIN_KEYS = ("model", "epochs", "batch_size", "lr", "momentum", "weight_decay", "interleaved",
              "interleave_fraction", "schedule", "milestones", "lr_decay", "warmup_epochs",
              "nesterov", "mixup_alpha", "cutmix_alpha", "crop_size", "pretrained",
              "freeze_backbone_epochs", "head_lr", "embeddings", "optimizer")

#: Optimisers of :attr:`RunConfig.optimizer`.
OPTIMIZERS = ("sgd", "adam")
#: Learning-rate schedules of :attr:`RunConfig.schedule`.
SCHEDULES = ("cosine", "multistep", "constant")


@dataclass
class RunConfig:
    """One training run: method, loss parameters, data, model and SGD settings.

    Attributes:
        method: loss name in the registry (``ce``, ``ls``, ``focal``, ``flsd``, ``mbls``, ``acls``).
        loss_params: keyword arguments of the loss (``margin``, ``lambda1``, ...).
        dataset: dataset name in :mod:`raysearch.data` (default ``digits``).
        model: model name in :mod:`raysearch.models` (``cnn``, ``resnet20``, ``resnet18``,
            ``wrn28_10``, ``densenet40``, ..., or ``torchvision:<name>``).
        epochs: number of training epochs (>= 1).
        batch_size: mini-batch size (>= 1).
        lr: SGD learning rate (> 0).
        momentum: SGD momentum in [0, 1).
        weight_decay: L2 weight decay (>= 0).
        seed: seed of the initialisation and the batch order, and of the data split unless
            `data_seed` is set.
        data_seed: seed of the data split (train/validation/test) when it must stay fixed while
            `seed` varies (the seeds of a repeated sweep, ``--repeats``); None: `seed`.
        val_fraction: share held out for validation, in (0, 1); None means the dataset's
            default (digits: 0.2 of all samples; datasets with an official test split: 0.1 of
            the training split, stratified).
        test_fraction: share held out for test, in (0, 1), for datasets without an official
            test split (digits: default 0.2); None means the dataset's default.
        imbalance_ratio: long-tailed training set with n_i = n_max * rho^(-i/(K-1)) samples
            of class i (Jung et al. App. C, Eq. 16), rho >= 1; None for the full set.
        ece_bins: number of bins of the reported calibration errors (>= 1); not the ``n_bins``
            loss parameter of SB-ECE.
        data_dir: folder of on-disk datasets (unused by ``digits``).
        interleaved: interleaved training (Karandikar et al. App. B): each epoch trains the
            primary objective on the training set minus a held-out share, then the secondary
            (soft calibration) objective on that share; needs a ``primary + beta * secondary``
            loss.
        interleave_fraction: held-out share of the training set for interleaving, in (0, 1).
        schedule: learning-rate schedule, stepped once per epoch: ``cosine`` (to 0 at the last
            epoch), ``multistep`` (multiply by `lr_decay` at each epoch in `milestones`) or
            ``constant``.
        milestones: comma-separated epochs of the ``multistep`` decays, e.g. ``"150,250"``
            (MbLS App. B: lr 0.1, x0.1 at epochs 150 and 250 of 350); a list is accepted.
        lr_decay: factor of each ``multistep`` decay, in (0, 1].
        warmup_epochs: linear warm-up from lr/10 to lr over this many epochs before the
            schedule (0: none).
        nesterov: Nesterov momentum.
        mixup_alpha: MixUp (Zhang et al. 2018) with lambda ~ Beta(alpha, alpha) per batch; 0 off.
        cutmix_alpha: CutMix (Yun et al. 2019) with lambda ~ Beta(alpha, alpha); 0 off. With
            both > 0 each batch uses one of the two, chosen with probability 0.5.
        crop_size: side of the square training crops and evaluation canvases of a segmentation
            dataset (``voc``, ``segfolder``; >= 16; the papers' 512); unused otherwise.
        pretrained_backbone: a local torchvision state-dict file loaded into a segmentation
            model's backbone (``weights_only=True``; e.g. ImageNet ResNet-50 weights, as the
            papers start from); None: random initialisation.
        pretrained: weights the whole model starts from (fine-tuning): a local state-dict
            file (``weights_only=True``) or a torchvision weights name such as
            ``ResNet101_Weights.IMAGENET1K_V1`` (read from torchvision's cache; the sweep's
            ``--download`` fetches it). The classification head is replaced when the number of
            classes differs (:func:`raysearch.models.pretrained.load_pretrained`). None: none.
        freeze_backbone_epochs: train only the classification head for the first E epochs
            (the rest has ``requires_grad=False``; BatchNorm statistics still update); 0: none.
        head_lr: learning rate of the classification head's parameters (the rest uses `lr`);
            None: `lr` for every parameter.
        optimizer: ``sgd`` (default: `lr`, `momentum`, `nesterov`, `weight_decay`) or ``adam``
            (`lr`, betas (0.9, 0.999), `weight_decay` as L2; MbLS App. B trains the 20
            Newsgroups GPool-CNN with Adam at lr 1e-3).
        embeddings: a GloVe-format text file (``glove.6B.100d.txt``) whose vectors initialise
            a text model's embedding, frozen (MbLS Table 6; words not in it get zeros); None:
            learned embeddings.
    """

    method: str = "ce"
    loss_params: dict[str, Any] = field(default_factory=dict)
    dataset: str = "digits"
    model: str = "cnn"
    epochs: int = 10
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    seed: int = 0
    data_seed: int | None = None
    val_fraction: float | None = None
    test_fraction: float | None = None
    ece_bins: int = 15
    data_dir: str | None = None
    interleaved: bool = False
    interleave_fraction: float = 0.1
    imbalance_ratio: float | None = None
    schedule: str = "cosine"
    milestones: str = ""
    lr_decay: float = 0.1
    warmup_epochs: int = 0
    nesterov: bool = False
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    crop_size: int = 512
    pretrained_backbone: str | None = None
    pretrained: str | None = None
    freeze_backbone_epochs: int = 0
    head_lr: float | None = None
    embeddings: str | None = None
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check types and ranges.

        Raises:
            ValueError: naming the first field that is out of range or of the wrong type.
        """
        if not isinstance(self.method, str) or not self.method:
            raise ValueError(f"`method` must be a non-empty string, got {self.method!r}")
        if not isinstance(self.loss_params, dict):
            raise ValueError(f"`loss_params` must be a mapping, got {self.loss_params!r}")
        for name in ("epochs", "batch_size", "seed", "ece_bins", "warmup_epochs", "crop_size",
                     "freeze_backbone_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    setattr(self, name, int(value))
                else:
                    raise ValueError(f"`{name}` must be an integer, got {value!r}")
        for name in ("lr", "momentum", "weight_decay", "val_fraction", "test_fraction",
                     "imbalance_ratio", "lr_decay", "mixup_alpha", "cutmix_alpha"):
            value = getattr(self, name)
            if value is None and name in _OPTIONAL:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"`{name}` must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"`{name}` must be finite, got {value!r}")
            setattr(self, name, float(value))
        if self.epochs < 1:
            raise ValueError(f"`epochs` must be >= 1, got {self.epochs}")
        if self.batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {self.batch_size}")
        if not isinstance(self.interleaved, bool):
            raise ValueError(f"`interleaved` must be true or false, got {self.interleaved!r}")
        if isinstance(self.interleave_fraction, bool) or not isinstance(
                self.interleave_fraction, (int, float)) or not 0 < self.interleave_fraction < 1:
            raise ValueError(
                f"`interleave_fraction` must be in (0, 1), got {self.interleave_fraction!r}")
        self.interleave_fraction = float(self.interleave_fraction)
        if self.seed < 0:
            raise ValueError(f"`seed` must be >= 0, got {self.seed}")
        if self.freeze_backbone_epochs < 0:
            raise ValueError("`freeze_backbone_epochs` must be >= 0, got "
                             f"{self.freeze_backbone_epochs}")
        if self.head_lr is not None and (isinstance(self.head_lr, bool) or not isinstance(
                self.head_lr, (int, float)) or not self.head_lr > 0):
            raise ValueError(f"`head_lr` must be a number > 0 or null, got {self.head_lr!r}")
        if self.head_lr is not None:
            self.head_lr = float(self.head_lr)
        if self.pretrained is not None and (not isinstance(self.pretrained, str)
                                            or not self.pretrained):
            raise ValueError("`pretrained` must be a file path or a torchvision weights name, "
                             f"got {self.pretrained!r}")
        if self.pretrained and self.pretrained_backbone:
            raise ValueError("give either `pretrained` (the whole model) or "
                             "`pretrained_backbone` (a segmentation backbone), not both")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"`optimizer` must be one of {', '.join(OPTIMIZERS)}, "
                             f"got {self.optimizer!r}")
        if self.embeddings is not None and (not isinstance(self.embeddings, str)
                                            or not self.embeddings):
            raise ValueError(f"`embeddings` must be a file path or null, got {self.embeddings!r}")
        if self.crop_size < 16:
            raise ValueError(f"`crop_size` must be >= 16, got {self.crop_size}")
        if self.pretrained_backbone is not None and not isinstance(self.pretrained_backbone, str):
            raise ValueError("`pretrained_backbone` must be a file path or null, got "
                             f"{self.pretrained_backbone!r}")
        if self.data_seed is not None and (isinstance(self.data_seed, bool) or not isinstance(
                self.data_seed, int) or self.data_seed < 0):
            raise ValueError(f"`data_seed` must be an integer >= 0 or null, got {self.data_seed!r}")
        if self.ece_bins < 1:
            raise ValueError(f"`ece_bins` must be >= 1, got {self.ece_bins}")
        if self.lr <= 0:
            raise ValueError(f"`lr` must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"`momentum` must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            raise ValueError(f"`weight_decay` must be >= 0, got {self.weight_decay}")
        for name in ("val_fraction", "test_fraction"):
            if getattr(self, name) is not None and not 0 < getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be in (0, 1), got {getattr(self, name)}")
        self._validate_schedule()
        if self.imbalance_ratio is not None and self.imbalance_ratio < 1:
            raise ValueError(f"`imbalance_ratio` must be >= 1 (n_max / n_min), "
                             f"got {self.imbalance_ratio}")
        for name in ("mixup_alpha", "cutmix_alpha"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.val_fraction is None or self.test_fraction is None:
            return
        if self.val_fraction + self.test_fraction >= 1:
            raise ValueError(
                "`val_fraction` + `test_fraction` must be < 1, got "
                f"{self.val_fraction} + {self.test_fraction}"
            )

    def _validate_schedule(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"`schedule` must be one of {', '.join(SCHEDULES)}, "
                             f"got {self.schedule!r}")
        if not isinstance(self.nesterov, bool):
            raise ValueError(f"`nesterov` must be true or false, got {self.nesterov!r}")
        if self.nesterov and self.momentum == 0:
            raise ValueError("`nesterov` needs `momentum` > 0")
        if self.warmup_epochs < 0:
            raise ValueError(f"`warmup_epochs` must be >= 0, got {self.warmup_epochs}")
        if not 0 < self.lr_decay <= 1:
            raise ValueError(f"`lr_decay` must be in (0, 1], got {self.lr_decay}")
        self.milestones = _milestones_text(self.milestones)
        if self.schedule == "multistep" and not self.milestones:
            raise ValueError("`schedule: multistep` needs `milestones`, e.g. \"150,250\"")

    @property
    def split_seed(self) -> int:
        """Seed of the data split: `data_seed`, or `seed` when it is None."""
        return self.seed if self.data_seed is None else self.data_seed

    def milestone_epochs(self) -> list[int]:
        """The ``multistep`` decay epochs as ints (empty when none)."""
        return [int(part) for part in self.milestones.split(",") if part]

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python dict (YAML/JSON-safe) of every field."""
        out = dataclasses.asdict(self)
        out["loss_params"] = {k: _plain(v) for k, v in self.loss_params.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        """Build from a mapping; unknown keys are an error.

        Raises:
            ValueError: on unknown keys or invalid values.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a run config must be a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(
                f"unknown run-config key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        return cls(**{k: _plain(v) for k, v in data.items()})

    def to_yaml(self, path: str | Path) -> None:
        """Write this config as YAML (readable by :meth:`from_yaml` and ``raysearch train``)."""
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def from_yaml(cls, path: str | Path) -> RunConfig:
        """Read a config written by :meth:`to_yaml` or ``raysearch export``.

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


#: Fields that may be None (meaning: the dataset's default, or off).
_OPTIONAL = frozenset({"val_fraction", "test_fraction", "imbalance_ratio"})


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
    """Turn numpy scalars into Python scalars so YAML and MLflow see plain values."""
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (list, dict)):
        try:
            return value.item()
        except (TypeError, ValueError):
            return value
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _first_line(exc: Exception) -> str:
    return " ".join(str(exc).split())
