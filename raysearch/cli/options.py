"""The options of ``raysearch``'s commands and how they become settings.

The click options of ``raysearch sweep`` (what every trial trains on, its resources, the
search), ``--tracking-uri``/``--experiment``, and the parsing of their values into
:class:`~raysearch.tune.settings.SweepSettings` (:func:`sweep_settings`). No torch, NumPy,
MLflow or Ray import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

__all__ = ["SWEEP_DATA_OPTIONS", "SWEEP_RESOURCE_OPTIONS", "SWEEP_RUN_OPTIONS", "attach",
           "key_values", "names", "sweep_settings", "tracking_options"]

_tracking_opts = [
    click.option("--tracking-uri", default=None, metavar="URI",
                 help="MLflow tracking URI [default: $MLFLOW_TRACKING_URI or "
                      "sqlite:///<cwd>/mlruns.db]"),
    click.option("--experiment", default="raysearch", show_default=True,
                 help="MLflow experiment name."),
]


def tracking_options(func: Callable) -> Callable:
    """Attach --tracking-uri and --experiment."""
    for opt in reversed(_tracking_opts):
        func = opt(func)
    return func


#: ``raysearch sweep``: What every trial trains on and with: data, recipe, model, weights.
SWEEP_DATA_OPTIONS = [
    click.option("--dataset", default=None,
                 help="Dataset: a name (`raysearch list datasets`: digits, cifar10, ...) or the "
                      "import string package.module:factory of your own [default: the space's, "
                      "else digits]."),
    click.option("--data-dir", default=None, type=click.Path(file_okay=False),
                 help="Folder holding the dataset in its standard layout (not needed for digits)."),
    click.option("--recipe", default=None, metavar="NAME|FILE|none",
                 help="Training protocol of a paper (`raysearch recipes list`: mbls-cifar10, "
                      "sbece-cifar100, ...) or a recipe YAML file; none = the space's training "
                      "values [default: the recipe of the space's method on the dataset, if any]."),
    click.option("--dry-run", is_flag=True,
                 help="Print the fully resolved sweep (space, recipe, data, resources, searched "
                      "and fixed values, number of trials) as YAML and exit: no Ray, no MLflow."),
    click.option("--download", is_flag=True,
                 help="Download the dataset into --data-dir if it is missing (never by default)."),
    click.option("--model", default=None,
                 help="Network: a name (`raysearch list models`: resnet20/32/56/110, resnet18/34/"
                      "50/101, wrn28_10, densenet40, cnn, mlp, ...), torchvision:<name>, or the "
                      "import string package.module:factory of your own [default: the space's, "
                      "else cnn]."),
    click.option("--model-param", "model_params", multiple=True, metavar="KEY=VALUE",
                 help="A keyword argument of the model factory for every trial (repeatable; the "
                      "value is read as YAML: 64, 0.1, true, [1, 2])."),
    click.option("--data-param", "data_params", multiple=True, metavar="KEY=VALUE",
                 help="A keyword argument of the dataset factory for every trial (repeatable)."),
    click.option("--metric", "metrics", multiple=True, metavar="PACKAGE.MODULE:FN",
                 help="Your own metric fn(probs, labels) -> float: every trial logs val_<fn> and "
                      "test_<fn>; usable in --objective and --ece-metric (repeatable)."),
    click.option("--val-fraction", default=None, type=float,
                 help="Validation share carved (stratified) from the training split "
                      "[default: 0.1 for datasets with a test split, 0.2 of all for digits]."),
    click.option("--crop-size", default=None, type=click.IntRange(min=16), metavar="S",
                 help="Segmentation datasets (voc, segfolder): training crop and evaluation canvas "
                      "side [default: the space's, else 512]."),
    click.option("--pretrained-backbone", default=None, metavar="PATH",
                 type=click.Path(dir_okay=False),
                 help="A local torchvision state-dict file for a segmentation model's backbone "
                      "(e.g. ImageNet ResNet-50 weights), loaded with weights_only=True."),
    click.option("--pretrained", default=None, metavar="WEIGHTS",
                 help="Start every trial's model from these weights: a local state-dict file or a "
                      "torchvision weights name (e.g. ResNet101_Weights.IMAGENET1K_V1, fetched "
                      "only with --download); the head is replaced when the classes differ."),
    click.option("--freeze-backbone-epochs", default=None, type=click.IntRange(min=0),
                 metavar="E", help="Train only the classification head for the first E epochs."),
    click.option("--embeddings", default=None, metavar="PATH", type=click.Path(dir_okay=False),
                 help="A GloVe-format file (e.g. glove.6B.100d.txt) for a text model's frozen "
                      "embedding (gpool_cnn); without it the embedding is learned."),
    click.option("--head-lr", default=None, type=float, metavar="LR",
                 help="Learning rate of the classification head [default: the trial's lr]."),
    click.option("--imbalance-ratio", default=None, type=float, metavar="RHO",
                 help="Long-tailed training set: n_i = n_max * RHO^(-i/(K-1)) images of class i."),
]

#: ``raysearch sweep``: What every trial asks Ray for.
SWEEP_RESOURCE_OPTIONS = [
    click.option("--gpus-per-trial", default=0.0, show_default=True, type=float,
                 help="GPUs per trial; fractions share a GPU (0.25: four trials per GPU)."),
    click.option("--cpus-per-trial", default=1.0, show_default=True, type=float,
                 help="CPUs per trial (torch threads on CPU; DataLoader workers = CPUs - 1 for "
                      "datasets read from image files)."),
    click.option("--precision", default="auto", show_default=True,
                 type=click.Choice(["auto", "bf16", "fp32"]),
                 help="Training forward pass: auto = bf16 autocast on a GPU, fp32 on the CPU."),
    click.option("--workers-per-trial", default=1, show_default=True, type=int,
                 help="Ray Train DDP workers per trial (NCCL on GPUs, gloo on CPUs); 1 = no DDP."),
    click.option("--gpus-per-worker", default=0.0, show_default=True, type=float,
                 help="GPUs per DDP worker (with --workers-per-trial > 1)."),
    click.option("--cpus-per-worker", default=1.0, show_default=True, type=float,
                 help="CPUs per DDP worker (with --workers-per-trial > 1)."),
]

#: ``raysearch sweep``: The search: trials, seeds, objective, selection, shift, storage, faults.
SWEEP_RUN_OPTIONS = [
    click.option("--shift-eval", is_flag=True,
                 help="Also evaluate each trial on the test set corrupted by 15 ImageNet-C "
                      "corruptions at severities 1-5, before and after its post-hoc calibrator."),
    click.option("--shift-samples", default=None, type=int,
                 help="Test images (stratified subsample) of the shift evaluation  [default: 1000 "
                      "with --shift-eval, all with --shift-data]"),
    click.option("--shift-data", default=None, metavar="DIR",
                 help="Also evaluate each trial on a released corrupted test set, before and after "
                      "its post-hoc calibrator: a CIFAR-10-C/CIFAR-100-C folder (<corruption>.npy "
                      "+ labels.npy) or a Tiny-ImageNet-C/ImageNet-C folder "
                      "(<corruption>/<severity>/<class>/*.JPEG)."),
    click.option("--num-samples", "-n", default=8, show_default=True, type=int,
                 help="Number of sampled configurations (trials, with --repeats 1)."),
    click.option("--repeats", default=1, show_default=True, type=int, metavar="R",
                 help="Seeds per configuration: each sampled configuration trains R times "
                      "(seed, seed+1, ...; same data split); the sampler, the front and the rule "
                      "use the means, MLflow and the tables show mean ± SEM."),
    click.option("--selection", default="mean", show_default=True,
                 type=click.Choice(["mean", "robust"]),
                 help="Rule on a repeated sweep's configurations: mean = lowest mean ECE within "
                      "the tolerance of the best mean accuracy; robust = lowest mean + 1 SEM of "
                      "ECE."),
    click.option("--max-concurrent", default=2, show_default=True, type=int,
                 help="Trials running at once."),
    click.option("--epochs", default=None, type=int,
                 help="Epochs per trial [default: the space's]."),
    click.option("--objective", default="pareto", show_default=True, metavar="NAME",
                 help="What the sampler optimises: pareto = (val accuracy max, val ECE min), ece, "
                      "accuracy, nll, or any metric the trials report as METRIC[:min|max] "
                      "(val_brier, val_ece_100, val_overconfidence, your --metric's name)."),
    click.option("--sampler", default="tpe", show_default=True,
                 type=click.Choice(["tpe", "nsga2", "random"]), help="Optuna sampler."),
    click.option("--scheduler", default=None, type=click.Choice(["asha"]),
                 help="Early stopping (ASHA on --scheduler-metric)."),
    click.option("--scheduler-metric", default="val_nll", show_default=True,
                 help="The single metric ASHA compares."),
    click.option("--tolerance", default=0.01, show_default=True, type=float,
                 help="Selection: lowest val ECE within this absolute accuracy of the best."),
    click.option("--seed", default=0, show_default=True, type=int,
                 help="Seeds the sampler, the data split and every trial."),
    click.option("--name", default=None, help="Sweep name [default: <space>-<timestamp>]."),
    click.option("--address", default=None, help="Address of an existing Ray cluster."),
    click.option("--storage-path", default=None, metavar="PATH|URI",
                 help="Where Tune keeps checkpoints: a folder (an NFS mount on a cluster) or "
                      "s3://bucket/prefix, gs://bucket/prefix [default: ~/ray_results]."),
    click.option("--optuna-storage", default=None, metavar="URL|PATH",
                 help="Where the sweep's Optuna study lives: a database URL such as "
                      "postgresql://USER@HOST:5432/optuna (the password in PGPASSWORD, never in "
                      "the URL) or a journal file [default: optuna.log beside a SQLite store, "
                      "else in --storage-path, else in the current folder]."),
    click.option("--posthoc", default="ts", show_default=True,
                 help="Post-hoc calibrators fitted per trial on validation logits, comma-separated "
                      "(ts, ets, cts, pts, ts_sbece, ts_hb_ece, dirichlet, ...; `raysearch list "
                      "calibrators`), or 'none'."),
    click.option("--ece-metric", default="ece", show_default=True, metavar="NAME",
                 help="Calibration error of the objective, the Pareto front and the selection "
                      "rule: ece, ece_100, aece, cece, ece_l2em, debiased_ce, sweep_ce, "
                      "marginal_ece, ks, brier, nll, or your --metric's name."),
    click.option("--log-weights", is_flag=True,
                 help="Keep each complete trial's final weights on its MLflow run (weights.pt); "
                      "`export --register` then reads them there [default: only in Tune's "
                      "checkpoints]."),
    click.option("--compile/--no-compile", "compile", default=None,
                 help="torch.compile every trial's model and loss (train_compile_seconds in its "
                      "metrics; pays off on long GPU trials) [default: the space's, else off]."),
    click.option("--checkpoint-every", default=None, type=click.IntRange(min=0), metavar="N",
                 help="Checkpoint every N epochs (0: the last epoch only) [default: once a "
                      "minute of training]."),
    click.option("--max-failures", default=None, type=click.IntRange(min=0), metavar="N",
                 help="Retry a trial that raised or whose node died up to N times, from its last "
                      "checkpoint [default: 2 with --address, else 0]."),
    click.option("--fault-drill", default=None, type=click.IntRange(min=1), metavar="EPOCH",
                 help="Test the cluster's retry path: the first attempt of every trial fails "
                      "after EPOCH (use with --max-failures >= 1)."),
    click.option("--fault-kind", default="raise", show_default=True, hidden=True,
                 type=click.Choice(["raise", "kill-in-checkpoint", "corrupt-checkpoint"]),
                 help="What --fault-drill does: raise, die (SIGKILL) while writing a checkpoint, "
                      "or truncate the newest checkpoint then raise."),
]


def attach(options: list[Callable]) -> Callable:
    """Attach click options in the order listed (so ``--help`` lists them in that order)."""
    def decorate(func: Callable) -> Callable:
        for opt in reversed(options):
            func = opt(func)
        return func

    return decorate


def sweep_settings(options: dict[str, Any]) -> Any:
    """The :class:`~raysearch.tune.settings.SweepSettings` of ``raysearch sweep``'s options.

    Every option is the settings field of its name, except ``--posthoc`` (a comma-separated
    list), ``--fault-drill`` (``fault_epoch``) and ``--model-param``/``--data-param``
    (``KEY=VALUE`` items into ``model_params``/``data_params``).

    Raises:
        ValueError: naming the first invalid setting.
    """
    from raysearch.tune.settings import SweepSettings

    fields = dict(options)
    fields["model_params"] = key_values(fields["model_params"], "--model-param")
    fields["data_params"] = key_values(fields["data_params"], "--data-param")
    fields["posthoc"] = names(fields["posthoc"])
    fields["fault_epoch"] = fields.pop("fault_drill")
    return SweepSettings(**fields)


def key_values(items: tuple[str, ...], option: str) -> dict[str, Any]:
    """``("hidden=64",)`` -> ``{"hidden": 64}`` (values read as YAML).

    Raises:
        ValueError: for an item without ``=`` or a key, naming `option`.
    """
    import yaml

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{option} {item!r}: expected KEY=VALUE, e.g. hidden=64")
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError:
            value = text
        out[key.strip()] = value
    return out


def names(text: str) -> tuple[str, ...]:
    """``"ts, ets"`` -> ``("ts", "ets")``; ``"none"`` or an empty text -> ``()``."""
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())

