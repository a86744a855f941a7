"""The settings of a sweep: what it runs besides its search space, and its trials' resources.

:class:`SweepSettings` (the CLI's options, the API's keywords) with its section
:class:`Resources`, and the names its options take (:data:`OBJECTIVES`, :data:`SAMPLERS`,
:data:`SCHEDULERS`, :data:`PRECISIONS`, :data:`FAULT_KINDS`) and :data:`RAY_JOB_ENV`. The
settings are checked once, when they are made; what the sweep resolves from them (its dataset,
model, recipe and accuracy metric) is the sweep's plan (:mod:`raysearch.tune.plan`), not
written back into them.

Part of the tune layer (:mod:`raysearch.tune`). Imports :mod:`raysearch.config` and pydantic at
import time, and lazily :mod:`raysearch.calibration` and :mod:`raysearch.metrics` to check names;
never Ray.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from raysearch.config import (
    DEFAULT_EXPERIMENT,
    SELECTIONS,
    Section,
    absolute_path,
    metric_name,
    one_line_error,
    plain_data,
)

__all__ = ["FAULT_KINDS", "OBJECTIVES", "PRECISIONS", "RAY_JOB_ENV", "SAMPLERS", "SCHEDULERS",
           "Resources", "SweepSettings"]

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
#: Values of ``precision``.
PRECISIONS = ("auto", "bf16", "fp32")
#: Values of ``fault_kind`` (the fault drills of :mod:`raysearch.tune.drills`):
#: ``raise`` raises after reporting the drill epoch; ``kill-in-checkpoint`` leaves a torn
#: checkpoint (a truncated ``state.pt`` in the trial's next checkpoint folder) and SIGKILLs its
#: own worker process; ``corrupt-checkpoint`` truncates the ``state.pt`` of the trial's newest
#: checkpoint in storage after reporting the drill epoch, then raises.
FAULT_KINDS = ("raise", "kill-in-checkpoint", "corrupt-checkpoint")
#: Set by Ray in the environment of a Ray Job's entrypoint (``ray job submit -- ...``).
RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


class Resources(Section):
    """What every trial of a sweep asks Ray for, and its precision.

    Attributes:
        cpus_per_trial: CPUs reserved per trial (> 0): torch threads on the CPU and DataLoader
            workers (CPUs - 1) for datasets read from files.
        gpus_per_trial: GPUs reserved per trial (>= 0); fractions share a GPU (0.25: four
            trials on one GPU); above 1 a whole number. 0 trains on the CPU.
        workers_per_trial: Ray Train DDP workers per trial (1: no DDP, the trial trains in its
            own process).
        cpus_per_worker: CPUs per DDP worker (> 0; only with `workers_per_trial` > 1).
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

    The resources of each trial are the section :attr:`resources` (:class:`Resources`, read as
    ``settings.resources.gpus_per_trial``); when the settings are made, the section's keys are
    also accepted at the top level (``SweepSettings(cpus_per_trial=2)``, the CLI's and the
    API's keywords). Every setting is checked when the settings are made (a ValueError naming
    the first invalid one), and so is an option that can never take effect with the others
    given (``scheduler_metric`` without `scheduler`, ``shift_samples`` without a shift
    evaluation, DDP worker sizes without DDP, ``checkpoint_every`` above ``epochs``); they are
    not changed afterwards.

    Attributes:
        num_samples: number of sampled configurations (>= 1): trials, or with `repeats` R,
            configurations of R trials each.
        repeats: seeds per configuration (>= 1). With R > 1 every sampled configuration is
            trained R times, with seeds ``seed + k`` (k = 0..R-1) on the split of ``seed``
            (:class:`~raysearch.tune.searchers.RepeatedSearcher`); the searcher is told the mean
            over the seeds, MLflow gets a configuration run (mean and SEM of every metric) with the
            seed runs nested under it, and the front and the rule use the means.
        selection: the rule applied to the configurations of a repeated sweep: ``mean``
            (default) or ``robust`` (lowest mean + 1 SEM of ECE; needs `repeats` >= 2).
        max_concurrent: trials running at once (>= 1).
        epochs: overrides the space's ``epochs`` when set.
        dataset: dataset name or import string; None (default): the space's ``data: name``,
            else the recipe's, else ``digits``.
        recipe: the training protocol (:mod:`raysearch.tune.recipes`): a recipe name
            (``mbls-cifar10``) or YAML file; None (default): the recipe of the space's method
            on the dataset, if one exists; ``"none"``: no recipe.
        data_dir: folder of on-disk datasets.
        seed: seeds the sampler and every trial's data split and initialisation.
        name: sweep name (default ``<space>-<YYYYmmdd-HHMMSS>``); a new sweep's is one folder
            name (:func:`~raysearch.tune.storage.check_sweep_name`), a resumed sweep keeps the
            name it was started with.
        tracking_uri: MLflow tracking URI (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: MLflow experiment name (not empty).
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
        scheduler_metric: metric ASHA compares (default ``val_nll``, lower is better): one
            every trial reports after every epoch (``nll`` is read as ``val_nll``); only with
            `scheduler`.
        tolerance: accuracy tolerance of the selection rule (absolute fraction, default 0.01).
        address: address of an existing Ray cluster (None: start a local Ray).
        storage_path: where Tune keeps trial checkpoints: a local folder (an NFS mount on a
            cluster) or a URI such as ``s3://bucket/prefix`` (default ``~/ray_results``).
        optuna_storage: where the sweep's Optuna study lives: a database URL without a
            password (``postgresql://user@host:5432/optuna``; the driver's ``PGPASSWORD`` or
            the database's other client settings give it) or an Optuna journal file; None
            (default): a journal beside a SQLite store, else in the storage path
            (:func:`raysearch.tune.study.optuna_storage_url`). Through a Ray Client
            (``ray://``) the study stays in the searcher's memory.
        n_bins: bins of the reported calibration errors.
        posthoc: post-hoc calibrators fitted on each trial's validation logits and measured on
            its test logits (``test_ece_ts``, ...); empty for none.
        checkpoint_every: a trial checkpoints every n-th epoch (0: the last epoch only); None
            (default): once a minute of training. The last epoch always carries a checkpoint
            (so n is at most `epochs` when that is given).
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
            :func:`raysearch.metrics.shift.load_released_shift_set`); None: none.
        shift_samples: test images in the shift evaluation (stratified subsample); None
            (default): 1000 with `shift_eval`, every image with `shift_data`; only with one of
            them.
        max_failures: how often Tune retries a trial that raised or whose node died; None
            (default): 2 on a cluster, else 0. A diverged trial is never retried.
        log_weights: every complete trial also keeps its final weights (the model's state
            dict) as ``weights.pt`` on its MLflow run; False (default): only in its last Tune
            checkpoint, where ``raysearch export --register`` reads them.
        compile: every trial's ``RunConfig.compile`` (``torch.compile`` of the model and the
            loss, ``train_compile_seconds`` in its metrics); None (default): the space's value.
        fault_epoch: a fault drill: the first attempt of every trial raises after reporting
            this epoch; None: never.
        fault_kind: what the drill at `fault_epoch` does (:data:`FAULT_KINDS`): ``raise``
            (default); ``kill-in-checkpoint``: the attempt dies (SIGKILL) while writing the
            drill epoch's checkpoint, leaving a torn one in storage; ``corrupt-checkpoint``: it
            truncates its newest checkpoint's ``state.pt`` in storage, then raises. The last
            two need one-process trials (``workers_per_trial == 1``).
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
        model_params: keyword arguments of the model factory every trial gets (``{"hidden":
            64}``, ``--model-param hidden=64``): ``model.params`` of each trial's config.
        data_params: keyword arguments of the dataset factory every trial gets
            (``--data-param``): ``data.params``.
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
    optuna_storage: str | None = None
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
    log_weights: bool = False
    compile: bool | None = None
    fault_epoch: int | None = None
    fault_kind: str = "raise"
    crop_size: int | None = None
    pretrained_backbone: str | None = None
    pretrained: str | None = None
    freeze_backbone_epochs: int | None = None
    head_lr: float | None = None
    embeddings: str | None = None
    model_params: dict[str, Any] = Field(default_factory=dict)
    data_params: dict[str, Any] = Field(default_factory=dict)
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
        return absolute_path(value)

    @field_validator("scheduler_metric", mode="after")
    @classmethod
    def _validation_metric(cls, value: str) -> str:
        return value if value.startswith("val_") else f"val_{value}"  # what ASHA reads

    @field_validator("posthoc", "metrics", mode="before")
    @classmethod
    def _names(cls, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return tuple(value)

    @model_validator(mode="after")
    def _check(self) -> SweepSettings:
        self._check_counts()
        self._check_choices()
        self._check_metrics()
        self._check_effect()
        if not self.experiment.strip():
            raise ValueError("--experiment must name an MLflow experiment, got an empty name")
        return self

    def _check_counts(self) -> None:
        if self.num_samples < 1:
            raise ValueError(f"`num_samples` must be >= 1, got {self.num_samples}")
        if self.repeats < 1:
            raise ValueError(f"`repeats` must be an int >= 1, got {self.repeats!r}")
        if self.max_concurrent < 1:
            raise ValueError(f"`max_concurrent` must be >= 1, got {self.max_concurrent}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"`epochs` must be >= 1, got {self.epochs}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"`tolerance` must be in [0, 1), got {self.tolerance}")
        if self.n_bins < 1:
            raise ValueError(f"`n_bins` must be >= 1, got {self.n_bins}")
        if self.shift_samples is not None and self.shift_samples < 1:
            raise ValueError(f"`shift_samples` must be >= 1, got {self.shift_samples}")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise ValueError(f"`checkpoint_every` must be >= 0, got {self.checkpoint_every}")
        if self.max_failures is not None and self.max_failures < 0:
            raise ValueError(f"`max_failures` must be an int >= 0, got {self.max_failures!r}")
        if self.fault_epoch is not None and self.fault_epoch < 1:
            raise ValueError(f"`fault_epoch` must be >= 1, got {self.fault_epoch}")

    def _check_choices(self) -> None:
        if self.selection not in SELECTIONS:
            raise ValueError(f"unknown selection '{self.selection}'; choose from "
                             f"{', '.join(SELECTIONS)}")
        if self.selection == "robust" and self.repeats < 2:
            raise ValueError("--selection robust needs the standard error over seeds: use it "
                             "with --repeats 2 or more")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler '{self.sampler}'; choose from {', '.join(SAMPLERS)}")
        if self.scheduler not in (None, *SCHEDULERS):
            raise ValueError(f"unknown scheduler '{self.scheduler}'; "
                             f"choose from {', '.join(SCHEDULERS)}")
        if self.fault_kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault_kind {self.fault_kind!r}; choose from "
                             f"{', '.join(FAULT_KINDS)}")
        workers = self.resources.workers_per_trial
        if self.fault_kind != "raise" and workers > 1:
            raise ValueError(f"fault_kind {self.fault_kind!r} needs one-process trials "
                             f"(workers_per_trial 1), got {workers}")
        if self.shift_eval and self.shift_data is not None:
            raise ValueError("--shift-data and --shift-eval are mutually exclusive: --shift-eval "
                             "corrupts the test set itself, --shift-data reads a released "
                             "corrupted test set; give one")
        if self.posthoc:
            from raysearch.calibration import CALIBRATOR_REGISTRY

            for name in self.posthoc:
                CALIBRATOR_REGISTRY.get(name)  # an unknown name: the registry's error

    def _check_metrics(self) -> None:
        known = self.known_metrics()
        self._check_metric_name(self.ece_metric, known, "--ece-metric")
        if self.accuracy_metric is not None:
            self._check_metric_name(self.accuracy_metric, known, "--accuracy-metric")
        self.objective_metrics()  # parses and checks --objective
        if self.scheduler is not None:
            name = self.scheduler_metric
            base = name[len("val_"):] if name.startswith("val_") else name
            # ASHA compares trials after every epoch: only what every epoch reports
            self._check_metric_name(base, self.known_metrics(epoch=True), "--scheduler-metric",
                                    name, when=" every epoch")

    def _check_effect(self) -> None:
        """Refuse options that can never take effect with the other options given."""
        resources = self.resources
        if self.scheduler is None and self.scheduler_metric != "val_nll":
            raise ValueError(f"--scheduler-metric {self.scheduler_metric} has no effect without "
                             "--scheduler asha")
        if self.shift_samples is not None and not self.shift_eval and self.shift_data is None:
            raise ValueError("--shift-samples has no effect without --shift-eval or --shift-data")
        if resources.workers_per_trial == 1 and (resources.cpus_per_worker != 1.0
                                                 or resources.gpus_per_worker != 0.0):
            raise ValueError("--cpus-per-worker and --gpus-per-worker size DDP workers: give "
                             "--workers-per-trial 2 or more, or --cpus-per-trial/--gpus-per-trial "
                             "for one-process trials")
        if (self.checkpoint_every is not None and self.epochs is not None
                and self.checkpoint_every > self.epochs):
            raise ValueError(f"--checkpoint-every {self.checkpoint_every} has no effect with "
                             f"--epochs {self.epochs}: a trial checkpoints its last epoch anyway "
                             f"(give 1 to {self.epochs}, or 0 for the last epoch only)")

    # -- metrics -------------------------------------------------------------------------
    def metric_names(self) -> list[str]:
        """Names the user's metric functions are logged under (``val_<name>``)."""
        return [metric_name(m) for m in self.metrics]

    def known_metrics(self, *, epoch: bool = False) -> set[str]:
        """Metric names (without ``val_``/``test_``) every trial of this sweep reports.

        Args:
            epoch: only those reported after every epoch: the summary (or, for segmentation,
                dense) metrics and a user's; the estimators, the table metrics and the
                post-hoc calibrators' are measured on the final model only.
        """
        from raysearch.metrics import group_keys

        if epoch:
            every = {key for group in ("summary", "dense") for key in group_keys(group)}
            return every | set(self.metric_names())
        builtin = {key for group in ("summary", "dense", "estimator", "table")
                   for key in group_keys(group)}
        # after a post-hoc calibrator: the summary and table metrics and a user's metrics
        after = (*group_keys("calibrated"), *self.metric_names())
        calibrated = {f"{m}_{c}" for m in after for c in self.posthoc}
        return builtin | set(self.metric_names()) | calibrated

    @staticmethod
    def _check_metric_name(name: str, known: set[str], option: str,
                           given: str | None = None, when: str = "") -> None:
        if name not in known:
            import difflib

            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"{option} {given or name}: the trials report no metric "
                             f"val_{name}{when}{hint}; they report: {', '.join(sorted(known))}")

    def _metric_functions(self) -> dict[str, Any]:
        """The user's metric functions by logged name ({} when they do not import here)."""
        from raysearch.training.registries import metric_functions

        try:
            return metric_functions(self.metrics)
        except ValueError:  # resolved (and refused in one line) when the sweep is planned
            return {}

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
        if not mode:  # the registered direction (val_accuracy_ts is an accuracy too)
            from raysearch.metrics import metric_direction

            mode = metric_direction(base, calibrators=self.posthoc,
                                    functions=self._metric_functions())
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
        return plain_data(self.model_dump())

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> SweepSettings:
        """Settings written by :meth:`to_record` (any version; unknown keys are ignored).

        A record's ``extra_overrides`` (dotted ``model.<kw>`` / ``data.<kw>`` keys, as sweeps
        recorded them before :attr:`model_params` and :attr:`data_params`) are read into those.
        """
        names = {*cls.model_fields, *_RESOURCE_KEYS}
        values = {k: v for k, v in record.items() if k in names}
        for key, value in dict(record.get("extra_overrides") or {}).items():
            section, _, kw = str(key).partition(".")
            if section in ("model", "data") and kw:
                values.setdefault(f"{section}_params", {})[kw] = value
        return cls(**values)

    def with_values(self, **values: Any) -> SweepSettings:
        """A copy with `values` replaced, checked again (the settings themselves never change).

        Raises:
            ValueError: naming the first invalid setting.
        """
        return type(self)(**{**self.model_dump(), **values})

    def config_overrides(self) -> dict[str, Any]:
        """What every trial's :class:`~raysearch.config.RunConfig` takes from these settings.

        The sections and fields set here replace the space's and the recipe's values:
        ``seed`` and ``ece_bins`` always; the dataset, its folder, the validation share,
        ``--epochs``, the model, its weights and the factories' keyword arguments where given.
        Paths are made absolute (the trials and a later ``--resume`` may run elsewhere).

        Returns:
            Partial sections, e.g. ``{"seed": 0, "ece_bins": 15, "data": {"name":
            "mypkg.data:load", "dir": "/data/mine"}, "model": {"params": {"hidden": 64}}}``.
        """
        model: dict[str, Any] = {}
        data: dict[str, Any] = {}
        out: dict[str, Any] = {"seed": self.seed, "ece_bins": self.n_bins}
        if self.epochs is not None:
            out["epochs"] = self.epochs
        if self.compile is not None:
            out["compile"] = self.compile
        if self.dataset is not None:
            data["name"] = self.dataset
        if self.data_dir is not None:
            data["dir"] = absolute_path(self.data_dir)
        if self.val_fraction is not None:
            data["val_fraction"] = self.val_fraction
        data_params = dict(self.data_params)
        if self.crop_size is not None:
            data_params["crop_size"] = self.crop_size
        if self.imbalance_ratio is not None:
            data_params["imbalance_ratio"] = self.imbalance_ratio
        if self.model is not None:
            model["name"] = self.model
        if self.pretrained is not None:  # a file (made absolute for the trials) or a name
            path = Path(self.pretrained).expanduser()
            model["pretrained"] = str(path.resolve()) if path.is_file() else self.pretrained
        for key in ("freeze_backbone_epochs", "head_lr"):
            if getattr(self, key) is not None:
                model[key] = getattr(self, key)
        model_params = dict(self.model_params)
        if self.pretrained_backbone is not None:
            model_params["pretrained_backbone"] = absolute_path(self.pretrained_backbone)
        if self.embeddings is not None:
            model_params["embeddings_path"] = absolute_path(self.embeddings)
        if model_params:
            model["params"] = model_params
        if data_params:
            data["params"] = data_params
        out.update({k: v for k, v in (("model", model), ("data", data)) if v})
        return out
