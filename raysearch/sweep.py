"""Build and run a sweep: Ray Tune ``Tuner`` + seeded ``OptunaSearch`` + MLflow tracking.

The default objective is the pair (validation accuracy max, validation ECE min) searched with
Optuna's multi-objective samplers: ECE alone is a degenerate target (a constant uniform predictor
has ECE 0 on balanced classes). After the last trial the selection rule ("lowest validation ECE
within `tolerance` of the best validation accuracy") picks the winner among trials that ran all
their epochs, and the parent MLflow run gets the Pareto plot, the trials table and the winner's
config.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search.optuna import OptunaSearch

from raysearch import tracking, ui
from raysearch.config import RunConfig
from raysearch.data import available_datasets
from raysearch.metrics import ESTIMATOR_KEYS
from raysearch.searchers import RepeatedSearcher
from raysearch.spaces import SearchSpace, load_space
from raysearch.storage import check_storage, resolve_storage
from raysearch.trainable import COMPLETED, DIVERGED, run_trial, trial_env, trial_resources

logger = logging.getLogger(__name__)

#: Datasets `--download` can fetch (the others are only read from --data-dir).
DOWNLOADABLE_DATASETS = ("cifar10", "cifar100", "svhn", "mnist", "fashion_mnist",
                         "tiny_imagenet")
#: --objective -> (metric(s), mode(s)) given to the searcher.
OBJECTIVES: dict[str, tuple[Any, Any]] = {
    "pareto": (["val_accuracy", "val_ece"], ["max", "min"]),
    "ece": ("val_ece", "min"),
    "accuracy": ("val_accuracy", "max"),
    "nll": ("val_nll", "min"),
}
SAMPLERS = ("tpe", "nsga2", "random")
#: --ece-metric: the calibration error of the selection rule, the Pareto front and the
#: searcher's ECE objective (logged by every trial as ``val_<name>`` / ``test_<name>``).
ECE_METRICS = ("ece", "aece", "cece", *ESTIMATOR_KEYS)
#: Checkpoints Tune keeps per trial. Two, not one: Tune deletes a trial's older checkpoint when
#: it registers a newer one, while its experiment snapshot (what ``--resume`` reads) is written
#: a moment later; with one kept, a driver killed in between leaves a snapshot pointing at a
#: deleted checkpoint and the trial cannot resume ("does not exist on storage anymore").
_KEEP_CHECKPOINTS = 2
SCHEDULERS = ("asha",)


@dataclass
class SweepSettings:
    """Everything a sweep needs besides its search space.

    Attributes:
        num_samples: number of sampled configurations (>= 1): trials, or with `repeats` R,
            configurations of R trials each.
        repeats: seeds per configuration (>= 1). With R > 1 every sampled configuration is
            trained R times, with seeds ``seed + k`` (k = 0..R-1) on the split of ``seed``
            (:class:`~raysearch.searchers.RepeatedSearcher`); the searcher is told the mean over
            the seeds, MLflow gets a configuration run (mean and SEM of every metric) with the
            seed runs nested under it, and the front and the rule use the means.
        selection: the rule applied to the configurations of a repeated sweep: ``mean``
            (default: lowest mean ECE within the tolerance of the best mean accuracy) or
            ``robust`` (lowest mean + 1 SEM of ECE; needs `repeats` >= 2). See
            :mod:`raysearch.repeats`.
        max_concurrent: trials running at once (>= 1).
        epochs: overrides the space's ``epochs`` when set.
        dataset: dataset name (default ``digits``).
        data_dir: folder of on-disk datasets.
        seed: seeds the sampler and every trial's data split and initialisation.
        name: sweep name (default ``<space>-<YYYYmmdd-HHMMSS>``).
        tracking_uri: MLflow tracking URI (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: MLflow experiment name.
        objective: ``pareto`` (default), ``ece``, ``accuracy`` or ``nll``.
        ece_metric: the calibration error the objective, the Pareto front and the selection
            rule use, one of :data:`ECE_METRICS` (default ``ece``: equal-width l1 ECE; e.g.
            ``debiased_ce`` or ``ece_l2em``, see :func:`raysearch.metrics.estimator_summary`).
        sampler: ``tpe`` (default), ``nsga2`` or ``random``.
        scheduler: None or ``asha`` (early stopping on its own single metric,
            `scheduler_metric`).
        scheduler_metric: metric ASHA compares (default ``val_nll``, lower is better).
        tolerance: accuracy tolerance of the selection rule (absolute fraction, default 0.01).
        address: address of an existing Ray cluster (None: start a local Ray).
        storage_path: where Tune keeps trial checkpoints: a local folder (an NFS mount on a
            cluster) or a URI such as ``s3://bucket/prefix`` or ``gs://bucket/prefix``, read
            and written through pyarrow's filesystems (default ``~/ray_results``).
        n_bins: bins of the reported calibration errors.
        cpus_per_trial: CPUs reserved per trial.
        posthoc: post-hoc calibrators fitted on each trial's validation logits and measured on
            its test logits (``test_ece_ts``, ...); empty for none.
        checkpoint_every: a trial checkpoints every n-th epoch (0: the last epoch only); None
            (default): once a minute of training (``trainable.CHECKPOINT_INTERVAL_S``), the
            cadence a retry or ``--resume`` needs. The last epoch always carries a checkpoint.
        model: overrides the space's ``model`` when set (``resnet18``, ``torchvision:<name>``).
        gpus_per_trial: GPUs reserved per trial; fractions share a GPU (0.25: four trials on
            one GPU). 0 trains on the CPU.
        precision: ``auto`` (bf16 autocast on a GPU, fp32 on the CPU), ``bf16`` or ``fp32``.
        download: let the driver download a missing dataset into `data_dir` before any trial.
        val_fraction: overrides the dataset's validation share.
        imbalance_ratio: long-tailed training set (rho >= 1), see RunConfig.
        shift_eval: evaluate every complete trial on the test set corrupted by the 15
            ImageNet-C corruptions at severities 1-5 (a subsample of `shift_samples` images,
            corrupted once by the driver), before and after the first `posthoc` calibrator.
        shift_samples: test images in the shift evaluation (stratified subsample).
        workers_per_trial: Ray Train DDP workers per trial (1: no DDP, the trial trains in its
            own process).
        gpus_per_worker: GPUs per DDP worker.
        cpus_per_worker: CPUs per DDP worker.
        max_failures: how often Tune retries a trial that raised or whose node died, from its
            last checkpoint, on any node (``FailureConfig``); None (default): 2 on a cluster
            (`address` set, or a Ray Job), else 0. A diverged trial is never retried.
        fault_epoch: a fault drill for testing a cluster's retry path: the first attempt of
            every trial raises after reporting this epoch (see ``run_trial``); None: never.
        crop_size: training crop / evaluation canvas side of a segmentation dataset (``voc``,
            ``segfolder``); None: the space's or RunConfig's 512.
        pretrained_backbone: a local torchvision state-dict file for a segmentation model's
            backbone (``weights_only=True``); None: random initialisation.
        pretrained: weights every trial's model starts from: a local state-dict file or a
            torchvision weights name (``ResNet101_Weights.IMAGENET1K_V1``; with `download` the
            driver fetches it into torchvision's cache first). Checked, and its sha256 logged
            (``pretrained_sha256``), before Ray starts.
        freeze_backbone_epochs: epochs during which only the classification head trains.
        head_lr: learning rate of the classification head (None: the trial's ``lr``).
        embeddings: a GloVe-format file for a text model's frozen embedding (``gpool_cnn``).
    """

    num_samples: int = 8
    repeats: int = 1
    selection: str = "mean"
    max_concurrent: int = 2
    epochs: int | None = None
    dataset: str = "digits"
    data_dir: str | None = None
    seed: int = 0
    name: str | None = None
    tracking_uri: str | None = None
    experiment: str = tracking.DEFAULT_EXPERIMENT
    objective: str = "pareto"
    ece_metric: str = "ece"
    sampler: str = "tpe"
    scheduler: str | None = None
    scheduler_metric: str = "val_nll"
    tolerance: float = 0.01
    address: str | None = None
    storage_path: str | None = None
    n_bins: int = 15
    cpus_per_trial: float = 1.0
    posthoc: tuple[str, ...] = ("ts",)
    checkpoint_every: int | None = None
    model: str | None = None
    gpus_per_trial: float = 0.0
    precision: str = "auto"
    download: bool = False
    val_fraction: float | None = None
    imbalance_ratio: float | None = None
    shift_eval: bool = False
    shift_samples: int = 1000
    workers_per_trial: int = 1
    gpus_per_worker: float = 0.0
    cpus_per_worker: float = 1.0
    max_failures: int | None = None
    fault_epoch: int | None = None
    crop_size: int | None = None
    pretrained_backbone: str | None = None
    pretrained: str | None = None
    freeze_backbone_epochs: int | None = None
    head_lr: float | None = None
    embeddings: str | None = None
    extra_overrides: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Raises ValueError naming the first invalid setting."""
        if self.num_samples < 1:
            raise ValueError(f"`num_samples` must be >= 1, got {self.num_samples}")
        if isinstance(self.repeats, bool) or not isinstance(self.repeats, int) \
                or self.repeats < 1:
            raise ValueError(f"`repeats` must be an int >= 1, got {self.repeats!r}")
        if self.selection not in tracking.SELECTIONS:
            raise ValueError(f"unknown selection '{self.selection}'; choose from "
                             f"{', '.join(tracking.SELECTIONS)}")
        if self.selection == "robust" and self.repeats < 2:
            raise ValueError("--selection robust needs the standard error over seeds: use it "
                             "with --repeats 2 or more")
        if self.max_concurrent < 1:
            raise ValueError(f"`max_concurrent` must be >= 1, got {self.max_concurrent}")
        if self.epochs is not None and self.epochs < 1:
            raise ValueError(f"`epochs` must be >= 1, got {self.epochs}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective '{self.objective}'; "
                             f"choose from {', '.join(OBJECTIVES)}")
        if self.ece_metric not in ECE_METRICS:
            raise ValueError(f"unknown ECE metric '{self.ece_metric}'; "
                             f"choose from {', '.join(ECE_METRICS)}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"unknown sampler '{self.sampler}'; choose from {', '.join(SAMPLERS)}")
        if self.scheduler not in (None, *SCHEDULERS):
            raise ValueError(f"unknown scheduler '{self.scheduler}'; "
                             f"choose from {', '.join(SCHEDULERS)}")
        if self.dataset not in available_datasets():
            raise ValueError(f"Unknown dataset '{self.dataset}'; "
                             f"available: {', '.join(available_datasets())}")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"`tolerance` must be in [0, 1), got {self.tolerance}")
        if self.n_bins < 1:
            raise ValueError(f"`n_bins` must be >= 1, got {self.n_bins}")
        if self.checkpoint_every is not None and self.checkpoint_every < 0:
            raise ValueError(f"`checkpoint_every` must be >= 0, got {self.checkpoint_every}")
        if not self.gpus_per_trial >= 0:
            raise ValueError(f"`gpus_per_trial` must be >= 0, got {self.gpus_per_trial}")
        if self.gpus_per_trial > 1 and not float(self.gpus_per_trial).is_integer():
            raise ValueError("`gpus_per_trial` above 1 must be a whole number of GPUs, got "
                             f"{self.gpus_per_trial}")
        if not self.cpus_per_trial > 0:
            raise ValueError(f"`cpus_per_trial` must be > 0, got {self.cpus_per_trial}")
        from raysearch.training import PRECISIONS

        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision '{self.precision}'; "
                             f"choose from {', '.join(PRECISIONS)}")
        if isinstance(self.workers_per_trial, bool) or not isinstance(
                self.workers_per_trial, int) or self.workers_per_trial < 1:
            raise ValueError(f"`workers_per_trial` must be an int >= 1, "
                             f"got {self.workers_per_trial!r}")
        if not self.gpus_per_worker >= 0 or not self.cpus_per_worker > 0:
            raise ValueError("`gpus_per_worker` must be >= 0 and `cpus_per_worker` > 0, got "
                             f"{self.gpus_per_worker} and {self.cpus_per_worker}")
        if self.workers_per_trial > 1 and self.gpus_per_trial:
            raise ValueError("with --workers-per-trial > 1 the GPUs are per worker: use "
                             "--gpus-per-worker instead of --gpus-per-trial")
        if self.max_failures is not None and (isinstance(self.max_failures, bool) or not
                                              isinstance(self.max_failures, int)
                                              or self.max_failures < 0):
            raise ValueError(f"`max_failures` must be an int >= 0, got {self.max_failures!r}")
        if self.fault_epoch is not None and self.fault_epoch < 1:
            raise ValueError(f"`fault_epoch` must be >= 1, got {self.fault_epoch}")
        if self.shift_samples < 1:
            raise ValueError(f"`shift_samples` must be >= 1, got {self.shift_samples}")
        if self.shift_eval and not self.posthoc:
            logger.info("shift evaluation without a post-hoc calibrator: uncalibrated only")
        if self.posthoc:
            from raysearch.calibration import available_calibrators

            unknown = [m for m in self.posthoc if m not in available_calibrators()]
        if self.posthoc and unknown:
            raise ValueError(f"Unknown calibrator '{unknown[0]}' in `posthoc`; available: "
                             f"{', '.join(available_calibrators())}")

    @property
    def accuracy_metric(self) -> str:
        """The accuracy axis of the front and the rule: ``miou`` for a segmentation dataset."""
        from raysearch.data import dataset_task

        return "miou" if dataset_task(self.dataset) == "segmentation" else "accuracy"

    @property
    def accuracy_key(self) -> str:
        """``val_<accuracy_metric>``: ``val_accuracy``, or ``val_miou`` for segmentation."""
        return f"val_{self.accuracy_metric}"

    def objective_metrics(self) -> tuple[Any, Any]:
        """The searcher's metric(s) and mode(s).

        :data:`OBJECTIVES` with the chosen ECE, and mIoU instead of accuracy for segmentation.
        """
        metric, mode = OBJECTIVES[self.objective]
        swap = {"val_ece": self.ece_key, "val_accuracy": self.accuracy_key}
        if isinstance(metric, list):
            return [swap.get(m, m) for m in metric], mode
        return swap.get(metric, metric), mode

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

    @property
    def ece_key(self) -> str:
        """The validation metric of the selection rule, ``val_<ece_metric>``."""
        return f"val_{self.ece_metric}"

    def resolved_max_failures(self) -> int:
        """`max_failures`, or its default: 2 on a cluster (`address` or a Ray Job), else 0."""
        if self.max_failures is not None:
            return self.max_failures
        return 2 if (self.address and self.address != "local") or in_ray_job() else 0

    def to_record(self) -> dict[str, Any]:
        """The settings as JSON-ready data (the sweep's record, for ``--resume``)."""
        out = dataclasses.asdict(self)
        out["posthoc"] = list(self.posthoc)
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> SweepSettings:
        """Settings written by :meth:`to_record` (unknown keys are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in record.items() if k in names}
        values["posthoc"] = tuple(values.get("posthoc", ()))
        return cls(**values)

    def overrides(self) -> dict[str, Any]:
        """RunConfig fields every trial of the sweep shares."""
        out = {"dataset": self.dataset, "seed": self.seed, "ece_bins": self.n_bins,
               "data_dir": _absolute(self.data_dir), **self.extra_overrides}
        if self.epochs is not None:
            out["epochs"] = self.epochs
        if self.pretrained_backbone is not None:
            out["pretrained_backbone"] = _absolute(self.pretrained_backbone)
        if self.pretrained is not None:  # a file (made absolute for the trials) or a name
            path = Path(self.pretrained).expanduser()
            out["pretrained"] = str(path.resolve()) if path.is_file() else self.pretrained
        if self.embeddings is not None:
            out["embeddings"] = _absolute(self.embeddings)
        for key in ("freeze_backbone_epochs", "head_lr"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        for key in ("model", "val_fraction", "imbalance_ratio", "crop_size"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def _absolute(path: str | None) -> str | None:
    """Trials on other nodes or in other working directories need an absolute data path."""
    return None if path is None else str(Path(path).expanduser().resolve())


@dataclass
class SweepResult:
    """What a finished sweep returns.

    Attributes:
        name: the sweep's name.
        parent_run_id: MLflow parent run id.
        tracking_uri: where it was tracked.
        trials: one row per trial (params, final metrics, ``complete``, ``on_front``,
            ``selected``).
        selected: the selected trial's row, or None when no trial finished.
        seconds: wall time of the sweep.
        interrupted: True when the sweep was stopped (Ctrl-C) before all its trials ended;
            ``raysearch sweep --resume NAME`` continues it.
        mlflow_link: the parent run in the MLflow UI's model-training view
            (:func:`raysearch.ui.run_link`); for a local store the UI is that of
            ``raysearch ui`` on its default port.
        mlflow_hint: how to serve that UI (``" (serve it with `raysearch ui`)"``), empty for a
            tracking server.
    """

    name: str
    parent_run_id: str
    tracking_uri: str
    trials: pd.DataFrame
    selected: pd.Series | None
    seconds: float
    interrupted: bool = False
    mlflow_link: str = ""
    mlflow_hint: str = ""


class CompletedOnlyOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna only trials that ran all their epochs as COMPLETE.

    Ray reports a trial stopped early by a scheduler as complete with its partial-epoch values;
    here such a trial (whose last result lacks ``completed = True``) is told as PRUNED, so it never
    enters the sampler's history or a multi-objective Pareto set as a finished trial. A trial
    whose loss diverged (``diverged`` in its last result) is told as FAIL.
    """

    def on_trial_complete(self, trial_id: str, result: dict | None = None,  # noqa: D102
                          error: bool = False) -> None:
        if not error and result is not None and result.get(DIVERGED):
            result, error = None, True  # -> FAIL
        elif not error and result is not None and not result.get(COMPLETED):
            result = None  # -> PRUNED in OptunaSearch.on_trial_complete
        super().on_trial_complete(trial_id, result=result, error=error)


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """The seeded Optuna sampler for ``--sampler`` (tpe handles one or several objectives)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler '{name}'; choose from {', '.join(SAMPLERS)}")


def quiet_ray_env() -> None:
    """Silence the noise users see from Ray and Optuna in a sweep (see the stack notes)."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_CHDIR_TO_TRIAL_DIR", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # a diverged trial's last report carries no metrics (it is recorded FAILED, not scored)
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # our own progress lines report every trial (failures included); Tune's summaries of the
    # same events and its "could not fetch metrics" notes (no result.json by design) are noise
    for name in ("ray.tune", "ray.train", "ray.air"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def init_ray(address: str | None = None) -> None:
    """Connect to `address` or start a local Ray, unless Ray is already initialised."""
    quiet_ray_env()
    if ray.is_initialized():
        return
    ray.init(address=address, log_to_driver=False, configure_logging=True,
             logging_level=logging.WARNING, runtime_env={"env_vars": trial_env()})


def prepare_data(space: SearchSpace, settings: SweepSettings,
                 say: Callable[[str], None]) -> Any:
    """Load the sweep's dataset once in the driver (downloading it if asked) and check the model.

    Every trial loads the same splits (same dataset, seed and fractions), so a missing, partial
    or corrupt dataset, or an unknown model, is reported here in one line before Ray starts.

    Returns:
        DatasetSplits: the splits; their ``info`` (sizes, split, class counts) goes into the
        parent run's params.

    Raises:
        ValueError: (``DatasetError`` included) naming the path and the expected layout, or the
            unknown model with the known ones.
    """
    import torch

    from raysearch.data import load_dataset
    from raysearch.models import available_models, build_model, is_segmentation_model

    if settings.download:
        say(f"checking {settings.dataset} in {settings.data_dir} (downloading what is missing)")
    segmentation = settings.accuracy_metric == "miou"
    extra: dict[str, Any] = {}
    if segmentation:  # every mask is checked once here, before Ray starts
        crops = space.train_values("crop_size")
        extra = {"crop_size": settings.crop_size or (crops[0] if crops else RunConfig().crop_size),
                 "verify": True}
    # --download also fetches torchvision weights (--pretrained): a dataset raysearch cannot
    # download is then only checked, not refused
    fetch = settings.download and ((settings.pretrained is None
                                    and not space.train_values("pretrained"))
                                   or settings.dataset in DOWNLOADABLE_DATASETS)
    data = load_dataset(settings.dataset, seed=settings.seed, val_fraction=settings.val_fraction,
                        data_dir=_absolute(settings.data_dir), download=fetch,
                        imbalance_ratio=settings.imbalance_ratio, **extra)
    default_model = RunConfig().model
    if settings.shift_eval and importlib.util.find_spec("imagecorruptions") is None:
        raise ValueError("--shift-eval needs the image corruptions package: "
                         "pip install 'raysearch[shift]'")
    if settings.shift_eval and not callable(getattr(data.test, "with_images", None)):
        raise ValueError(f"--shift-eval needs an image dataset held in memory (cifar10, "
                         f"cifar100, svhn, mnist, fashion_mnist, tiny_imagenet), got "
                         f"'{settings.dataset}'")
    models = [settings.model] if settings.model else (space.train_values("model")
                                                      or [default_model])
    for model in models:
        dense_model = is_segmentation_model(model)
        if segmentation and not dense_model:
            raise ValueError(f"--dataset {settings.dataset} is a segmentation dataset: choose a "
                             f"segmentation --model "
                             f"({', '.join(available_models(task='segmentation'))}), "
                             f"not '{model}'")
        if not segmentation and dense_model:
            raise ValueError(f"--model {model} is a segmentation model: it needs a segmentation "
                             "--dataset (voc, segfolder)")
        text = {} if getattr(data, "vocabulary", None) is None else {
            "vocabulary": data.vocabulary}
        if settings.embeddings is not None:  # a bad GloVe file fails here, in one line
            text["embeddings_path"] = _absolute(settings.embeddings)
        with torch.device("meta"):  # names and shapes only: no memory, no initialisation cost
            build_model(model, num_classes=data.num_classes, input_shape=data.input_shape,
                        **text)
    if settings.pretrained_backbone is not None:
        from raysearch.models import load_backbone_weights

        path = _absolute(settings.pretrained_backbone)
        if not segmentation:
            raise ValueError("--pretrained-backbone applies to segmentation models")
        if not Path(path).is_file():
            raise ValueError(f"--pretrained-backbone {path}: no such file")
        load_backbone_weights(build_model(models[0], num_classes=data.num_classes,
                                          input_shape=data.input_shape), path)
    spaced = space.train_values("pretrained")
    weights = (settings.overrides()["pretrained"] if settings.pretrained is not None
               else spaced[0] if len(spaced) == 1 else None)
    if weights is not None:  # a bad file or name fails here, in one line
        from raysearch.models.pretrained import load_pretrained

        if settings.download:
            say(f"checking the weights {weights} (downloading them if missing)")
        vocabulary = getattr(data, "vocabulary", None)
        info = load_pretrained(build_model(models[0], num_classes=data.num_classes,
                                           input_shape=data.input_shape,
                                           **({"vocabulary": vocabulary} if vocabulary
                                              else {})),
                               weights, download=settings.download)
        data.info["pretrained_sha256"] = info.sha256
        say(f"pretrained weights {info.source}: {info.loaded} tensors, sha256 "
            f"{info.sha256[:12]}" + (", classification head replaced" if info.replaced_head
                                     else ""))
    return data


#: Set by Ray in the environment of a Ray Job's entrypoint (``ray job submit -- ...``).
_RAY_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def in_ray_job() -> bool:
    """True when this process is a Ray Job's entrypoint (its cwd is a temporary copy)."""
    return _RAY_JOB_ENV in os.environ


def is_remote_address(address: str | None) -> bool:
    """True when the sweep's driver-side work may run away from this machine's cwd.

    A Ray Client address (``ray://``, even tunnelled to 127.0.0.1: Tune then runs the sweep on
    the head node) or a cluster on another host; ``auto``/``local``/None and a GCS address on
    this machine are local.
    """
    if not address or address in ("local", "auto"):
        return False
    if address.startswith("ray://"):
        return True
    host = address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def check_tracking_for_cluster(uri: str | None, address: str | None) -> None:
    """Refuse a relative SQLite tracking URI when the sweep runs on a remote cluster.

    The MLflow records are written by the sweep's driver-side callback, which runs where Tune's
    controller runs: on the head node for a Ray Client address (``ray://``) or a Ray Job, whose
    working directory is a temporary copy that vanishes with the job. A relative SQLite file
    (including the default ``./mlruns.db``) would land there. An ``http(s)://`` tracking
    server, a database URI or an absolute SQLite path that exists where the driver runs is
    accepted.

    Args:
        uri (str | None): the tracking URI as the user gave it (``--tracking-uri`` or
            ``$MLFLOW_TRACKING_URI``); None means the default ``./mlruns.db``.
        address (str | None): ``--address``.

    Raises:
        ValueError: one line saying why and what to use instead.
    """
    if not is_remote_address(address) and not in_ray_job():
        return
    if uri is not None and (not uri.startswith("sqlite:///") or uri.startswith("sqlite:////")):
        return
    uri = uri or "sqlite:///mlruns.db (the default)"
    where = (f"--address {address} runs the sweep on a remote Ray cluster"
             if is_remote_address(address) else "this sweep runs as a Ray Job")
    raise ValueError(f"--tracking-uri {uri} is a relative SQLite file, but {where}, where the "
                     "driver's working folder may be a temporary copy: use an MLflow server "
                     "(--tracking-uri http://HOST:5000) or an absolute sqlite:////path")


def check_ray_address(address: str | None, *, timeout: float = 5.0) -> None:
    """Fail in one line when `address` (``host:port`` or ``ray://host:port``) is unreachable.

    ``ray.init`` would otherwise retry for minutes. ``auto``, ``local`` and None are not probed.

    Raises:
        ValueError: naming the address and the socket error.
    """
    if not address or address in ("auto", "local"):
        return
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--address {address}: expected host:port or ray://host:port")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ValueError(f"cannot reach the Ray cluster at --address {address}: "
                         f"{exc.strerror or exc}") from None


def check_gpus(settings: SweepSettings) -> None:
    """Fail in one line when trials ask for GPUs that the Ray cluster does not have."""
    if settings.workers_per_trial > 1:
        wanted = settings.workers_per_trial * settings.gpus_per_worker
        option = f"--workers-per-trial {settings.workers_per_trial} --gpus-per-worker " \
                 f"{settings.gpus_per_worker:g}"
    else:
        wanted, option = settings.gpus_per_trial, f"--gpus-per-trial {settings.gpus_per_trial:g}"
    if not wanted:
        return
    have = float(ray.cluster_resources().get("GPU", 0))
    if have >= wanted:
        return
    cluster = bool(settings.address) or in_ray_job()
    where = "the Ray cluster" if cluster else "this machine"
    message = (f"{option} needs {wanted:g} GPU per trial but {where} has {have:g}; "
               "leave the GPU options out to train on the CPU")
    if cluster:
        # an autoscaling cluster may still add GPU nodes: say it, and let Ray wait for them
        logger.warning("%s (waiting for the autoscaler to add GPU nodes)", message)
        return
    raise ValueError(message)


def build_shift(data: Any, settings: SweepSettings, say: Callable[[str], None]) -> Any:
    """The corrupted test subsample of ``--shift-eval``, built once in the driver."""
    from raysearch.shift import build_shift_set

    labels = np.asarray(data.test.labels.cpu() if hasattr(data.test.labels, "cpu")
                        else data.test.labels)
    say(f"shift evaluation: corrupting {min(settings.shift_samples, len(labels))} test images "
        "(15 corruptions x 5 severities) once for every trial")
    return build_shift_set(data.test.images_hwc(), labels, max_samples=settings.shift_samples,
                           seed=settings.seed, progress=say)


def _sizes(data: Any) -> str:
    return f"{len(data.train)} train / {len(data.val)} val / {len(data.test)} test images"


def default_sweep_name(space: SearchSpace) -> str:
    """``<space>-<YYYYmmdd-HHMMSS>``."""
    return f"{space.name}-{time.strftime('%Y%m%d-%H%M%S')}"


#: Parent-run artifact holding what ``--resume`` needs: the settings and the search space.
SWEEP_RECORD = "sweep.json"


def check_new_sweep_name(client: Any, experiment: str, name: str) -> None:
    """Refuse a sweep name the experiment already holds (its runs would be mixed up).

    Raises:
        ValueError: one line naming the existing sweep and suggesting ``--resume``.
    """
    if client.get_experiment_by_name(experiment) is None:
        return
    try:
        parent = tracking.find_sweep(client, name, experiment)
    except ValueError:
        return
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(parent.info.start_time / 1000))
    raise ValueError(f"a sweep named '{name}' already exists in experiment '{experiment}' "
                     f"(started {started}, {parent.info.status}): continue it with "
                     f"`raysearch sweep --resume {name}` or choose another --name")


def run_sweep(space: str | Path | SearchSpace, settings: SweepSettings | None = None, *,
              progress: Callable[[str], None] | None = None) -> SweepResult:
    """Run one sweep end to end and return its trials table and selected trial.

    Args:
        space: a bundled space name (``acls``), a YAML path or a loaded SearchSpace.
        settings: sweep settings (defaults: 8 trials, 2 at a time, digits, Pareto objective).
        progress: called with one readable line per finished trial and a few status lines.

    Returns:
        The :class:`SweepResult`.

    Raises:
        ValueError: on bad settings, an unknown space, an unreachable tracking URI, or a sweep
            name the experiment already has (use :func:`resume_sweep`); all are checked before
            Ray starts or any trial runs.
    """
    settings = settings or SweepSettings()
    settings.validate()
    space = space if isinstance(space, SearchSpace) else load_space(space)
    say = progress or (lambda line: logger.info("%s", line))
    client, uri = tracking.get_client(settings.tracking_uri)
    name = settings.name or default_sweep_name(space)
    check_new_sweep_name(client, settings.experiment, name)
    data = prepare_data(space, settings, say)  # bad paths and names fail here, before Ray
    storage = resolve_storage(settings.storage_path)
    check_storage(storage)
    check_tracking_for_cluster(settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"),
                               settings.address)

    experiment_id = tracking.ensure_experiment(client, settings.experiment, uri)
    check_ray_address(settings.address)
    init_ray(settings.address)
    check_gpus(settings)
    parent = client.create_run(experiment_id, run_name=name,
                               tags={tracking.SWEEP_TAG: name, "raysearch.space": space.name})
    parent_id = parent.info.run_id
    max_failures = settings.resolved_max_failures()
    tracking.log_params(client, parent_id, {
        "space": space.name, "methods": ",".join(space.methods), "dataset": settings.dataset,
        "num_samples": settings.num_samples, "max_concurrent": settings.max_concurrent,
        "epochs": settings.epochs if settings.epochs is not None else "space",
        "seed": settings.seed, "objective": settings.objective, "sampler": settings.sampler,
        "scheduler": settings.scheduler or "none", "tolerance": settings.tolerance,
        "posthoc": ",".join(settings.posthoc) or "none",
        "selection_rule": settings.selection_rule(), "ece_metric": settings.ece_metric,
        "repeats": settings.repeats, "selection": settings.selection,
        "accuracy_metric": settings.accuracy_metric,
        "model": settings.model or "space", "gpus_per_trial": settings.gpus_per_trial,
        "cpus_per_trial": settings.cpus_per_trial, "precision": settings.precision,
        "workers_per_trial": settings.workers_per_trial, "max_failures": max_failures,
        "storage_path": storage,
        **{f"data_{k}": v for k, v in data.info.items()},
    })
    record = {"version": 1, "name": name, "storage_path": storage,
              "settings": {**settings.to_record(), "name": name},
              "space": space.to_dict()}
    client.log_text(parent_id, json.dumps(record, indent=1), SWEEP_RECORD)
    tracking.log_dataset(client, parent_id, _dataset_record(data, settings))
    gpu = f", {settings.gpus_per_trial:g} GPU per trial" if settings.gpus_per_trial else ""
    count = (f"{settings.num_samples} trials" if settings.repeats == 1 else
             f"{settings.num_samples} configurations x {settings.repeats} seeds "
             f"({settings.trials} trials)")
    say(f"sweep {name}: {count} of space '{space.name}' on "
        f"{settings.dataset} ({_sizes(data)}){gpu}, objective {settings.objective}, sampler "
        f"{settings.sampler}; MLflow {uri} (experiment '{settings.experiment}')")
    return _execute(space, settings, client, uri, experiment_id, parent_id, name, storage, data,
                    say)


def resume_sweep(name: str, *, tracking_uri: str | None = None,
                 experiment: str = tracking.DEFAULT_EXPERIMENT, address: str | None = None,
                 progress: Callable[[str], None] | None = None) -> SweepResult:
    """Continue sweep `name` after its driver was killed or interrupted (``sweep --resume``).

    The sweep's settings and search space come from its record (``sweep.json`` of the parent
    run); Tune's experiment state, the Optuna searcher and the trials' checkpoints come from
    its storage path (``Tuner.restore``). Finished trials are not run again; unfinished ones
    and ones that had failed resume from their last checkpoints (``resume_unfinished``,
    ``resume_errored``: the same trial ids, so each keeps its one MLflow child run, set RUNNING
    again); the searcher samples the trials the sweep still lacks. The parent run is reopened,
    not recreated, and gets the selection, plot and table at the end as usual.

    Args:
        name: the sweep's name (``--name``, or the ``<space>-<timestamp>`` it printed).
        tracking_uri: the store the sweep was tracked in (default as for a sweep).
        experiment: its MLflow experiment.
        address: the Ray cluster to continue on (default: the sweep's own ``--address``).
        progress: as for :func:`run_sweep`.

    Returns:
        The :class:`SweepResult` over all the sweep's trials.

    Raises:
        ValueError: if the sweep is unknown, already finished, has no record (made by an
            older raysearch) or no Tune experiment state at its storage path.
    """
    say = progress or (lambda line: logger.info("%s", line))
    client, uri = tracking.get_client(tracking_uri)
    parent = tracking.find_sweep(client, name, experiment)
    if parent.info.status == "FINISHED" and not _has_errored_trials(client, parent):
        raise ValueError(f"sweep '{name}' already finished with no failed trial; nothing to "
                         f"resume (`raysearch report {name}` shows it)")
    record = _load_record(client, parent.info.run_id, name)
    space = SearchSpace.from_dict(record["space"])
    settings = SweepSettings.from_record(record["settings"])
    settings.tracking_uri, settings.experiment, settings.name = uri, experiment, name
    if address is not None:
        settings.address = address
    settings.validate()
    storage = record["storage_path"]
    path = f"{storage.rstrip('/')}/{name}"
    check_storage(storage)
    if not tune.Tuner.can_restore(path):
        raise ValueError(f"sweep '{name}' cannot be resumed: no Tune experiment state under "
                         f"{path} (the driver stopped before Tune's first snapshot); start it "
                         "again with another --name")
    data = prepare_data(space, settings, say)
    check_tracking_for_cluster(tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"),
                               settings.address)
    check_ray_address(settings.address)
    init_ray(settings.address)
    check_gpus(settings)
    parent_id = parent.info.run_id
    client.update_run(parent_id, status="RUNNING")
    resumes = int(parent.data.tags.get("raysearch.resumes", 0)) + 1
    client.set_tag(parent_id, "raysearch.resumes", str(resumes))
    count = (f"{settings.num_samples} trials" if settings.repeats == 1 else
             f"{settings.num_samples} configurations x {settings.repeats} seeds")
    say(f"resuming sweep {name} from {path} ({count} of space "
        f"'{space.name}' on {settings.dataset}); MLflow {uri} (experiment '{experiment}')")
    return _execute(space, settings, client, uri, parent.info.experiment_id, parent_id, name,
                    storage, data, say, restore=path)


def _has_errored_trials(client: Any, parent: Any) -> bool:
    """True when a trial of the sweep ended FAILED by an error (``--resume`` retries those)."""
    runs = tracking.sweep_runs(client, parent.info.experiment_id, parent.info.run_id)
    return any(r.data.tags.get(tracking.OUTCOME_TAG) == "error" for r in runs
               if r.data.tags.get(tracking.TRIAL_TAG))


def _load_record(client: Any, parent_id: str, name: str) -> dict[str, Any]:
    names = {a.path for a in client.list_artifacts(parent_id)}
    if SWEEP_RECORD not in names:
        raise ValueError(f"sweep '{name}' has no {SWEEP_RECORD} record (it was started by an "
                         "older raysearch) and cannot be resumed")
    with tempfile.TemporaryDirectory() as d:
        local = client.download_artifacts(parent_id, SWEEP_RECORD, d)
        return json.loads(Path(local).read_text())


def _execute(space: SearchSpace, settings: SweepSettings, client: Any, uri: str,
             experiment_id: str, parent_id: str, name: str, storage: str, data: Any,
             say: Callable[[str], None], restore: str | None = None) -> SweepResult:
    """Run (or, with `restore`, continue) the Tuner of a sweep; select and log at the end."""
    metric, mode = settings.objective_metrics()
    overrides = settings.overrides()
    max_failures = settings.resolved_max_failures()
    start = time.monotonic()
    status = "FAILED"
    callback = None
    try:
        shift_set = None
        if settings.shift_eval:
            shift_set = build_shift(data, settings, say)
        # the callback Tune calls after a restore is the copy pickled with the experiment;
        # every copy in this process shares one writer, which this one flushes below
        callback = tracking.MlflowSweepCallback(
            client, experiment_id, parent_id, name, space, overrides, progress=say,
            total=settings.trials, max_failures=max_failures,
            dataset=_dataset_record(data, settings), repeats=settings.repeats)
        resources = trial_resources(
            cpus_per_trial=settings.cpus_per_trial, gpus_per_trial=settings.gpus_per_trial,
            workers=settings.workers_per_trial, cpus_per_worker=settings.cpus_per_worker,
            gpus_per_worker=settings.gpus_per_worker)
        trainable = tune.with_resources(
            tune.with_parameters(run_trial, space=space, overrides=overrides,
                                 posthoc=tuple(settings.posthoc),
                                 checkpoint_every=settings.checkpoint_every,
                                 # a scheduler compares trials at every epoch (ASHA's rungs);
                                 # otherwise epochs travel in fewer reports
                                 report_every_epoch=settings.scheduler is not None,
                                 precision=settings.precision,
                                 cpus_per_trial=settings.cpus_per_trial, shift_set=shift_set,
                                 workers=settings.workers_per_trial,
                                 cpus_per_worker=settings.cpus_per_worker,
                                 gpus_per_worker=settings.gpus_per_worker,
                                 fault_epoch=settings.fault_epoch),
            resources)
        if restore is not None:
            # unfinished trials go on from their checkpoints; failed ones too (resume, not
            # restart: a restarted trial gets a new id, hence a second MLflow run)
            tuner = tune.Tuner.restore(restore, trainable=trainable, resume_unfinished=True,
                                       resume_errored=True)
            callback.setup()  # adopt the sweep's runs now (Tune's restored copy shares them)
            trials = _snapshot_trials(restore)
            if trials is not None:
                callback.known_trials({t.trial_id for t in trials})
        else:
            tuner = _new_tuner(space, settings, trainable, callback, name, storage, metric,
                               mode, max_failures)
        tuner.fit()
        # Ctrl-C once: Tune stops the trials and returns normally
        ended = _trials_ended(f"{storage.rstrip('/')}/{name}")
        interrupted = ended is not None and ended < settings.trials
        status = "KILLED" if interrupted else "FINISHED"
        if interrupted:
            say(f"interrupted: {ended} of {settings.trials} trials ended; selecting among "
                f"the finished ones (`raysearch sweep --resume {name}` continues the sweep)")
    except KeyboardInterrupt:
        status = "KILLED"
        say(f"interrupted: finished trials are kept in MLflow; selecting among them "
            f"(`raysearch sweep --resume {name}` continues the sweep)")
        raise
    finally:
        if callback is not None:
            callback.close()  # flush the queued MLflow writes before selecting
        frame = tracking.finalize_sweep(client, parent_id, tolerance=settings.tolerance,
                                        ece_key=settings.ece_key, status=status,
                                        selection=settings.selection,
                                        accuracy_key=settings.accuracy_key)
    selected = None
    if not frame.empty and frame["selected"].any():
        selected = frame[frame["selected"]].iloc[0]
    seconds = time.monotonic() - start
    done = int(frame["complete"].sum()) if not frame.empty else 0
    what = "trials" if settings.repeats == 1 else f"configurations ({settings.repeats} seeds each)"
    say(f"sweep {name} {'stopped' if status == 'KILLED' else 'finished'} in {seconds:.1f}s: "
        f"{done}/{settings.num_samples} {what} complete; parent run {parent_id}")
    return SweepResult(name, parent_id, uri, frame, selected, seconds,
                       interrupted=status == "KILLED",
                       mlflow_link=ui.run_link(ui.ui_base_url(uri), experiment_id, parent_id),
                       mlflow_hint=_ui_hint(uri))


def _ui_hint(uri: str) -> str:
    """How to serve a local store's UI (the sweep's link points there); empty for a server."""
    if uri.startswith(("http://", "https://")):
        return ""
    store = "" if uri == tracking.default_tracking_uri() else f" --tracking-uri {uri}"
    return f" (serve it with `raysearch ui{store}`)"


def _dataset_record(data: Any, settings: SweepSettings) -> dict[str, Any]:
    """The sweep's dataset as MLflow shows it (:func:`raysearch.tracking.dataset_record`)."""
    source = _absolute(settings.data_dir) or f"raysearch.data.load_dataset('{data.name}')"
    return tracking.dataset_record(data, source)


def _trials_ended(path: str) -> int | None:
    """Trials that ended (TERMINATED or ERROR) in Tune's last snapshot of the experiment.

    After a Ctrl-C, Tune snapshots the experiment before it stops the running trials, so they
    are still unfinished there (and ``Tuner.restore`` continues them), while the trials that
    ``Tuner.fit`` returns are all stopped. None if the snapshot cannot be read.
    """
    trials = _snapshot_trials(path)
    if trials is None:
        return None
    return sum(t.status in ("TERMINATED", "ERROR") for t in trials)


def _snapshot_trials(path: str) -> list[Any] | None:
    """The trials of Tune's last experiment snapshot at `path` (None if unreadable)."""
    from ray.tune import ExperimentAnalysis

    try:
        return ExperimentAnalysis(path).trials
    except Exception as exc:  # noqa: BLE001 (the sweep's result does not depend on it)
        logger.warning("cannot read Tune's experiment state at %s: %s", path, exc)
        return None


def _new_tuner(space: SearchSpace, settings: SweepSettings, trainable: Any, callback: Any,
               name: str, storage: str, metric: Any, mode: Any, max_failures: int) -> Any:
    # a conditional space (all.yaml) first gives every method one trial, in file order, so
    # that each method is on the board before the sampler concentrates on the good ones
    warm_start = [{"method": m} for m in space.methods] if space.conditional else None
    searcher = CompletedOnlyOptunaSearch(
        space=space.define_by_run, metric=metric, mode=mode,
        sampler=make_sampler(settings.sampler, settings.seed),
        points_to_evaluate=warm_start)
    if settings.repeats > 1:  # R trials per sampled configuration; the sampler sees their mean
        searcher = RepeatedSearcher(searcher, settings.repeats)
    scheduler = None
    if settings.scheduler == "asha":
        smode = "max" if settings.scheduler_metric.endswith("accuracy") else "min"
        scheduler = ASHAScheduler(metric=settings.scheduler_metric, mode=smode,
                                  time_attr="training_iteration", grace_period=1,
                                  max_t=max(settings.epochs or 100, 1))
    return tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                    num_samples=settings.trials, reuse_actors=True,
                                    max_concurrent_trials=settings.max_concurrent),
        run_config=tune.RunConfig(
            name=name, storage_path=storage, verbose=0,
            callbacks=[callback],
            checkpoint_config=tune.CheckpointConfig(num_to_keep=_KEEP_CHECKPOINTS),
            failure_config=tune.FailureConfig(max_failures=max_failures, fail_fast=False)),
    )
