"""The ``raysearch`` command: sweep, train, report, export, calibrate, reproduce, spaces.

A thin layer: parse options, call the public API, print. Bad input (ValueError,
FileNotFoundError) becomes one line on stderr and exit code 2, without a traceback.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

_EXIT_BAD_INPUT = 2
#: Exit status of a sweep stopped by Ctrl-C (128 + SIGINT, as shells report it).
_EXIT_INTERRUPTED = 130


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, FileNotFoundError) and exc.filename:
        text = f"file not found: {exc.filename}"
    return " ".join(text.split())


def friendly_errors(func: Callable) -> Callable:
    """Map bad-input exceptions to one line on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, FileNotFoundError, IsADirectoryError, KeyError) as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(_EXIT_BAD_INPUT)

    return wrapper


def _echo(line: str) -> None:
    click.echo(line)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="raysearch")
def main() -> None:
    """Ray-distributed hyperparameter search for network calibration.

    Sweeps calibration regularizers (label smoothing, focal, MbLS, ACLS, ...) with Ray Tune and
    Optuna, tracks every trial in MLflow, and selects the lowest-ECE trial within 1% of the best
    validation accuracy.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")  # no "Creating initial tables" noise
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


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
_SWEEP_DATA_OPTIONS = [
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
_SWEEP_RESOURCE_OPTIONS = [
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
_SWEEP_RUN_OPTIONS = [
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


def _options(options: list[Callable]) -> Callable:
    """Attach click options in the order listed (so ``--help`` lists them in that order)."""
    def attach(func: Callable) -> Callable:
        for opt in reversed(options):
            func = opt(func)
        return func

    return attach


@main.command()
@click.argument("space", required=False)
@click.option("--resume", "resume", default=None, metavar="NAME",
              help="Continue sweep NAME after its driver was killed or interrupted: finished "
                   "trials are kept, unfinished and failed ones go on from their checkpoints. "
                   "Takes the sweep's own space and settings (give no SPACE; --address, "
                   "--tracking-uri, --experiment and --storage-path, where its storage is now "
                   "if it was moved, may be given).")
@_options(_SWEEP_DATA_OPTIONS)
@_options(_SWEEP_RESOURCE_OPTIONS)
@_options(_SWEEP_RUN_OPTIONS)
@tracking_options
@click.pass_context
@friendly_errors
def sweep(ctx: click.Context, space: str | None, resume: str | None, dry_run: bool,
          **options: Any) -> None:
    """Run a sweep over SPACE (a bundled space name such as 'acls', or a YAML file).

    `raysearch sweep --resume NAME` continues a sweep whose driver was killed.
    """
    from raysearch.tune.spaces import load_space

    if not dry_run:
        from raysearch.tracking.reports import quiet_mlflow

        quiet_mlflow()
    if resume is not None:
        _resume(ctx, space, resume, options)
        return
    if space is None:
        raise ValueError("give a SPACE to sweep (e.g. `raysearch sweep acls`; `raysearch "
                         "spaces list` shows them) or --resume NAME")
    settings = _sweep_settings(options)
    settings.validate()
    loaded = load_space(space)
    if dry_run:
        import yaml

        from raysearch.cli.plan import plan_sweep

        plan = plan_sweep(loaded, settings)
        click.echo(yaml.safe_dump(plan, sort_keys=False, width=100), nl=False)
        return
    from raysearch.tune.engine import run_sweep  # Ray, Tune and MLflow: seconds to import

    result = run_sweep(loaded, settings, progress=_echo)
    _print_result(result)


def _sweep_settings(options: dict[str, Any]) -> Any:
    """The :class:`~raysearch.tune.settings.SweepSettings` of ``raysearch sweep``'s options.

    Every option is the settings field of its name, except ``--posthoc`` (a comma-separated
    list), ``--fault-drill`` (``fault_epoch``) and ``--model-param``/``--data-param`` (the
    ``model.<key>``/``data.<key>`` overrides).
    """
    from raysearch.tune.settings import SweepSettings

    fields = dict(options)
    extra = {**_key_values(fields.pop("model_params"), "model", "--model-param"),
             **_key_values(fields.pop("data_params"), "data", "--data-param")}
    fields["posthoc"] = _names(fields["posthoc"])
    fields["fault_epoch"] = fields.pop("fault_drill")
    return SweepSettings(**fields, extra_overrides=extra)


def _resume(ctx: click.Context, space: str | None, resume: str, options: dict[str, Any]) -> None:
    """``raysearch sweep --resume NAME``: the sweep's own space and settings, nothing else."""
    from raysearch.tune.engine import resume_sweep

    given = [p.opts[0] for p in ctx.command.params
             if p.name not in ("resume", "address", "tracking_uri", "experiment", "space",
                               "storage_path")
             and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE]
    if space is not None:
        raise ValueError(f"--resume {resume} continues the sweep with its own space: drop "
                         f"SPACE ('{space}')")
    if given:
        raise ValueError(f"--resume {resume} continues the sweep with its own settings: "
                         f"drop {', '.join(given)}")
    result = resume_sweep(resume, tracking_uri=options["tracking_uri"],
                          experiment=options["experiment"], address=options["address"],
                          storage_path=options["storage_path"], progress=_echo)
    _print_result(result)


def _print_result(result: Any) -> None:
    from raysearch.tracking.reports import sweep_result_lines

    for line in sweep_result_lines(result):
        click.echo(line)
    if result.interrupted:
        sys.exit(_EXIT_INTERRUPTED)


@main.command()
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--epochs", default=None, type=int, help="Override the config's epochs.")
@click.option("--name", default=None, help="MLflow run name.")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False),
              help="Override the config's data folder (e.g. on another machine).")
@click.option("--device", default=None,
              help="cpu, cuda or cuda:N [default: cuda when a GPU is visible, else cpu].")
@click.option("--precision", default="auto", show_default=True,
              type=click.Choice(["auto", "bf16", "fp32"]),
              help="Training forward pass: auto = bf16 autocast on a GPU, fp32 on the CPU.")
@tracking_options
@friendly_errors
def train(config: str, epochs: int | None, name: str | None, data_dir: str | None,
          device: str | None, precision: str, tracking_uri: str | None,
          experiment: str) -> None:
    """Train one run from CONFIG (a file written by `raysearch export`) and log it to MLflow."""
    import yaml

    from raysearch.config import RunConfig
    from raysearch.tracking import check_export_versions, train_and_log
    from raysearch.tracking.reports import metrics_line, quiet_mlflow

    quiet_mlflow()

    cfg = RunConfig.from_yaml(config)
    if epochs is not None:
        cfg.epochs = epochs
    if data_dir is not None:
        cfg.data.dir = str(Path(data_dir).expanduser().resolve())
    doc = yaml.safe_load(Path(config).read_text())
    check_export_versions(doc, _echo)
    tags = {"raysearch.source_config": str(Path(config).resolve())}
    if isinstance(doc, dict) and doc.get("sweep"):
        tags["raysearch.source_sweep"] = str(doc["sweep"])
        tags["raysearch.source_run"] = str(doc.get("run_id", ""))
    hp = ", ".join(f"{k}={v}" for k, v in cfg.loss.params.items())
    click.echo(f"training {cfg.loss.name}({hp}) with {cfg.model.name} on {cfg.data.name}, "
               f"{cfg.epochs} epochs, seed {cfg.seed}")
    run_id, metrics = train_and_log(
        cfg, tracking_uri=tracking_uri, experiment=experiment, run_name=name, tags=tags,
        progress=_echo, device=device, precision=precision,
        metrics=(doc.get("metric_functions") or []) if isinstance(doc, dict) else [])
    click.echo(metrics_line(metrics))
    click.echo(f"MLflow run {run_id}")


@main.command()
@click.argument("name")
@click.option("--all", "show_all", is_flag=True, help="List every trial, not just the front.")
@click.option("--tolerance", default=None, type=float,
              help="Selection tolerance [default: the sweep's].")
@click.option("--calibrated", default=None, metavar="CALIBRATOR",
              help="Judge the front on the ECE after this post-hoc calibrator (e.g. ts).")
@click.option("--plot", default=None, type=click.Path(dir_okay=False),
              help="Also write the Pareto plot to this PNG file.")
@click.option("--ece-metric", default=None, metavar="NAME",
              help="Calibration error of the front and the rule (ece, ece_100, debiased_ce, "
                   "ece_l2em, sweep_ce, marginal_ece, ks, ...) [default: the sweep's].")
@click.option("--selection", default=None, type=click.Choice(["mean", "robust"]),
              help="Rule on a repeated sweep's configurations [default: the sweep's].")
@click.option("--importance", is_flag=True,
              help="Print the fANOVA importance of each searched parameter per objective "
                   "instead, from the sweep's Optuna study.")
@tracking_options
@friendly_errors
def report(name: str, show_all: bool, tolerance: float | None, calibrated: str | None,
           plot: str | None, ece_metric: str | None, selection: str | None, importance: bool,
           tracking_uri: str | None, experiment: str) -> None:
    """Print the Pareto table (validation and test side by side) and the selected trial.

    With --calibrated ts the front and the selection use the validation ECE after temperature
    scaling (fitted on half of each trial's validation set, measured on the other half), and
    the test columns show the test ECE after it. With --importance: the fANOVA importances of
    the searched parameters, one row each, one column per objective.
    """
    if importance:
        from raysearch.tune.study import importance_lines

        for line in importance_lines(name, tracking_uri=tracking_uri, experiment=experiment):
            click.echo(line)
        return
    from raysearch.tracking.reports import report_lines

    for line in report_lines(name, tracking_uri=tracking_uri, experiment=experiment,
                             tolerance=tolerance, calibrated=calibrated, ece_metric=ece_metric,
                             selection=selection, show_all=show_all, plot=plot):
        click.echo(line)


@main.command()
@click.argument("name")
@click.option("--by", default="method", show_default=True,
              help="Column the trials are grouped by.")
@click.option("--baseline", default="ce", show_default=True,
              help="Group the effect sizes (Cohen's d of the test ECE) are computed against.")
@click.option("--tolerance", default=None, type=float,
              help="Selection tolerance [default: the sweep's].")
@tracking_options
@friendly_errors
def compare(name: str, by: str, baseline: str, tolerance: float | None,
            tracking_uri: str | None, experiment: str) -> None:
    """Compare the methods of sweep NAME: each one's selected configuration on test data.

    Per method the selection rule picks a configuration on validation data; its test accuracy
    and ECE are shown as mean ± SEM over its seeds (one seed: no SEM), with Cohen's d of its
    test ECE against the baseline's (positive: lower ECE; 0.8 is a large effect). The table
    (compare.csv) and a bar plot (compare.png) are attached to the sweep's parent run.
    """
    from raysearch.tracking.reports import compare_lines

    for line in compare_lines(name, by=by, baseline=baseline, tolerance=tolerance,
                              tracking_uri=tracking_uri, experiment=experiment):
        click.echo(line)


@main.command()
@click.argument("name")
@click.option("--storage-path", default=None, metavar="PATH|URI",
              help="Where the sweep's Tune storage is now [default: the path it was started "
                   "with].")
@tracking_options
@friendly_errors
def sync(name: str, storage_path: str | None, tracking_uri: str | None,
         experiment: str) -> None:
    """Write to MLflow what sweep NAME's runs lack of Ray Tune's records of its trials.

    After the tracking server was away for longer than its client's retries, or a driver was
    killed with writes still queued: every trial gets its child run, each epoch's metrics once,
    its params, outcome, artifacts and status; the parent its selection, Pareto plot and trials
    table. Running it again writes nothing.
    """
    from raysearch.tracking.reports import quiet_mlflow
    from raysearch.tune.engine import sync_sweep

    quiet_mlflow()
    done = sync_sweep(name, tracking_uri=tracking_uri, experiment=experiment,
                      storage_path=storage_path, progress=_echo)
    click.echo(f"sync {name}: {done.summary()}")


@main.command()
@click.argument("name")
@click.option("-o", "--output", default=None, type=click.Path(),
              help="Where to write the config [default: best.yaml]; with --with-weights, the "
                   "new folder of the model.")
@click.option("--tolerance", default=None, type=float,
              help="Selection tolerance [default: the sweep's].")
@click.option("--register", default=None, metavar="MODEL_NAME",
              help="Register the selected trial in the MLflow Model Registry as a pyfunc model "
                   "(weights + calibrator): predict(x) gives calibrated probabilities.")
@click.option("--with-weights", is_flag=True,
              help="Write that pyfunc model to the folder -o instead of (or besides) a registry.")
@click.option("--calibrator", default="ts", show_default=True,
              help="Post-hoc calibrator of the model, fitted on the trial's validation logits "
                   "(ts, cts, ets, ..., or none).")
@click.option("--storage-path", default=None, metavar="PATH|URI",
              help="Where the sweep's Tune storage is now (the trial's weights are read from "
                   "its last checkpoint) [default: the path it was started with].")
@tracking_options
@friendly_errors
def export(name: str, output: str | None, tolerance: float | None, register: str | None,
           with_weights: bool, calibrator: str, storage_path: str | None,
           tracking_uri: str | None, experiment: str) -> None:
    """Write the selected trial's config of sweep NAME (reusable by `raysearch train`).

    With --register MODEL_NAME (or --with-weights -o DIR) the trial becomes an MLflow pyfunc
    model: mlflow.pyfunc.load_model("models:/MODEL_NAME/1").predict(x) maps float32 inputs
    (N, *input_shape) to calibrated probabilities (N, K).
    """
    from raysearch.api import export as export_sweep
    from raysearch.tracking.reports import export_line

    if with_weights and output is None:
        raise ValueError("--with-weights writes a model folder: give it with -o DIR")
    model = register is not None or with_weights
    path = output if with_weights or not model else None
    doc = export_sweep(name, path if model else (output or "best.yaml"),
                       tracking_uri=tracking_uri, experiment=experiment, tolerance=tolerance,
                       register=register, with_weights=with_weights, calibrator=calibrator,
                       storage_path=storage_path)
    if not model:
        click.echo(f"wrote {output or 'best.yaml'}: {export_line(doc)}")
        click.echo(f"train it again: raysearch train {output or 'best.yaml'}")
        return
    info = doc["model"]
    shape = ", ".join(str(d) for d in info["input_shape"])
    click.echo(f"model of {export_line(doc)}")
    click.echo(f"  weights from the trial's {info['weights_from']}, calibrator "
               f"{info['calibrator']}: predict(float32 (N, {shape})) -> probabilities "
               f"(N, {info['num_classes']})")
    if with_weights:
        click.echo(f"  saved to {output}: mlflow.pyfunc.load_model('{output}')")
    if register is not None:
        click.echo(f"  registered: mlflow.pyfunc.load_model('{info['uri']}')")


@main.command()
@click.argument("source")
@click.option("--methods", default="ts,ets,cts,pts,ts_sbece", show_default=True,
              help="Calibrators to fit, comma-separated (`raysearch list calibrators`: also "
                   "ts_hb_ece, dirichlet, pts_sctl, ...).")
@click.option("--classwise-scaling", type=click.Choice(["off", "on", "both"]), default="off",
              show_default=True, help="Wrap the calibrators in class-wise loss scaling "
              "(Jung et al., as their released code: per-class mean losses); 'both' reports "
              "each with and without.")
@click.option("--split", "fraction", default=0.5, show_default=True, type=float,
              help="Calibration share of a stratified split (files without their own split).")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the split.")
@click.option("--n-bins", default=15, show_default=True, type=int, help="Bins of the metrics.")
@click.option("--output-dir", default=None, type=click.Path(file_okay=False),
              help="Where reliability diagrams and the table go [default: ./calibrate-<name>].")
@click.option("--allow-pickle", is_flag=True,
              help="Read pickle files (.dat/.p/.pkl/.pickle); only for files you trust.")
@click.option("--log", "log_mlflow", is_flag=True,
              help="Log the results to MLflow (implied by --tracking-uri).")
@click.option("--search", "search_space", default=None, is_flag=False, flag_value="posthoc",
              metavar="[SPACE]", help="Sweep a post-hoc space (default: posthoc.yaml) with Tune "
              "instead of fitting --methods: selects on a held-out part of the calibration "
              "split, reports on the evaluation part.")
@click.option("--num-samples", default=16, show_default=True, type=int,
              help="Trials of --search.")
@click.option("--holdout", default=0.3, show_default=True, type=float,
              help="Held-out share of the calibration part that --search selects on.")
@tracking_options
@friendly_errors
def calibrate(source: str, methods: str, classwise_scaling: str, fraction: float, seed: int,
              n_bins: int, output_dir: str | None, allow_pickle: bool, log_mlflow: bool,
              search_space: str | None, num_samples: int, holdout: float,
              tracking_uri: str | None, experiment: str) -> None:
    """Fit post-hoc calibrators on stored network outputs and compare them.

    SOURCE is a .npz (keys `logits`, or `predictions`/`probs`, and `labels`/`ground_truth`), a
    .parquet (`label` + `logit_*` or `prob_*` columns, optional `split`), a pickle with
    --allow-pickle, or the MLflow run id of a sweep trial (its stored validation/test logits).
    Without a split of its own the file is split stratified: --split for calibration, the rest
    for evaluation.
    """
    from raysearch.api import calibrate as calibrate_source

    calibrate_source(source, methods=methods, classwise_scaling=classwise_scaling,
                     fraction=fraction, seed=seed, n_bins=n_bins, output_dir=output_dir,
                     allow_pickle=allow_pickle, log=log_mlflow, search=search_space,
                     num_samples=num_samples, holdout=holdout, tracking_uri=tracking_uri,
                     experiment=experiment, progress=_echo)


@main.command("list")
@click.argument("kind", type=click.Choice(["models", "datasets", "losses", "calibrators",
                                           "metrics", "optimizers"]))
@friendly_errors
def list_command(kind: str) -> None:
    """List the names KIND accepts and where each comes from (built-in or a plug-in).

    Installed packages add names through entry points (groups raysearch.training.models,
    raysearch.datasets, raysearch.losses, raysearch.calibrators, raysearch.metrics,
    raysearch.optimizers); any import string package.module:attr works too without being
    listed. A name declared twice is listed as an error (exit code 2).
    """
    from raysearch.training.registries import registry

    reg = registry(kind)
    entries = reg.entries()
    clashes = reg.conflicts()
    width = max((len(n) for n in entries), default=0)
    for name in sorted(entries):
        note = "  (declared twice: refused)" if name in clashes else ""
        click.echo(f"{name:<{width}s}  {entries[name].source}{note}")
    extra = " (and torchvision:<name>)" if kind == "models" else ""
    click.echo(f"{len(entries)} {kind}{extra}; any import string package.module:attr works too")
    for message in clashes.values():
        click.echo(f"error: {message}", err=True)
    if clashes:
        sys.exit(_EXIT_BAD_INPUT)


@main.group()
def spaces() -> None:
    """List, show and validate search spaces."""


@spaces.command("list")
@friendly_errors
def spaces_list() -> None:
    """List the bundled search spaces."""
    from raysearch.tune.posthoc_sweep import load_posthoc_space
    from raysearch.tune.spaces import available_spaces, load_space

    for name in available_spaces("train"):
        click.echo(f"{name:<8s} {load_space(name).description}")
    for name in available_spaces("posthoc"):
        click.echo(f"{name:<8s} {load_posthoc_space(name).description} "
                   "(post-hoc: raysearch calibrate FILE --search)")


@spaces.command("show")
@click.argument("space")
@friendly_errors
def spaces_show(space: str) -> None:
    """Show the parameters, ranges and scales of SPACE (a name or a YAML file)."""
    from raysearch.tune.posthoc_sweep import load_posthoc_space
    from raysearch.tune.spaces import load_space, space_kind

    if space_kind(space) == "posthoc":
        click.echo(load_posthoc_space(space).describe())
    else:
        click.echo(load_space(space).describe())


@main.group()
def recipes() -> None:
    """List and show the papers' training recipes (sweep --recipe NAME)."""


@recipes.command("list")
@friendly_errors
def recipes_list() -> None:
    """List the bundled recipes, the methods and datasets each is the default for."""
    from raysearch.tune.recipes import available_recipes, load_recipe

    names = available_recipes()
    width = max(map(len, names), default=0)
    for name in names:
        recipe = load_recipe(name)
        default = (f"  [default for {'/'.join(recipe.methods)} on {'/'.join(recipe.datasets)}]"
                   if recipe.methods and recipe.datasets else "")
        click.echo(f"{name:<{width}s}  {recipe.description}{default}")


@recipes.command("show")
@click.argument("recipe")
@friendly_errors
def recipes_show(recipe: str) -> None:
    """Show RECIPE (a name or a YAML file): its values and, in its comments, their sources."""
    from raysearch.tune.recipes import load_recipe

    loaded = load_recipe(recipe)
    click.echo(f"# {loaded.path}")
    click.echo(loaded.text(), nl=False)


@spaces.command("validate")
@click.argument("spaces_", metavar="SPACE...", nargs=-1, required=True)
@friendly_errors
def spaces_validate(spaces_: tuple[str, ...]) -> None:
    """Validate one or more spaces (names or YAML files); exit 2 on the first problem."""
    from raysearch.tune.posthoc_sweep import load_posthoc_space
    from raysearch.tune.spaces import space_kind, validate_space

    for space in spaces_:
        if space_kind(space) == "posthoc":
            load_posthoc_space(space)
            click.echo(f"ok: {space} (post-hoc)")
            continue
        loaded = validate_space(space)
        click.echo(f"ok: {space} ({', '.join(loaded.methods)})")


@main.command()
@click.argument("data_dir", type=click.Path(file_okay=False))
@click.option("--tolerance", default=0.3, show_default=True, type=float,
              help="Largest allowed |ours - published| ECE difference, in ECE points.")
@click.option("--allow-pickle", is_flag=True,
              help="Read the authors' pickle files (.p); only for files you trust.")
@friendly_errors
def reproduce(data_dir: str, tolerance: float, allow_pickle: bool) -> None:
    """Refit calibrators on released network outputs and compare with the published numbers.

    DATA_DIR is searched (recursively) for the output files that papers published numbers on:
    the long-tailed CIFAR-10/100 logits released with the class-wise loss scaling paper,
    probs_<net>_c10_LT_logits.p (c100 for CIFAR-100) with <net> densenet40, resnet_wide28,
    resnet110 or resnet110_SD, or their .npz conversions; names match case-insensitively.
    Lists every file found, used or skipped with the reason, then prints our ECE beside the
    published one. Exits 1 when a checked row misses by more than --tolerance ECE points, 2
    when no file can be used. See docs/reproduce.md.
    """
    from raysearch.calibration.reproduce import reproduce as run_reproduction

    click.echo(f"reproducing published numbers from {data_dir} ...")
    report = run_reproduction(data_dir, tolerance=tolerance, allow_pickle=allow_pickle,
                              progress=_echo)
    click.echo("")
    click.echo(report.format_table())
    if not report.passed:
        sys.exit(1)


@main.command("ui")
@click.option("--port", default=5000, show_default=True, type=click.IntRange(1, 65535),
              help="Port the MLflow UI listens on (local stores).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Interface the MLflow UI listens on (local stores).")
@click.option("--sweep", "sweep_name", default=None, metavar="NAME",
              help="Link this sweep [default: the experiment's latest].")
@tracking_options
@friendly_errors
def ui_command(port: int, host: str, sweep_name: str | None, tracking_uri: str | None,
               experiment: str) -> None:
    """Open the sweeps in the MLflow UI: print a link to the latest sweep's parent run.

    For a local store (the SQLite file sweeps write to) starts `mlflow ui` on it, prints the
    link, and serves until Ctrl-C, which stops the server. For an http(s) tracking URI (an
    MLflow server, whose UI is at the same address) starts nothing and only prints the link.
    The link opens MLflow's model-training view of the run: its metrics, params and artifacts
    (pareto.png, trials.parquet, best_config.yaml); the trials are its child runs.
    """
    import signal

    from raysearch.tracking import ui
    from raysearch.tracking.reports import sweep_links

    links = sweep_links(tracking_uri, experiment, sweep_name, host=host, port=port)
    uri, base, lines = links.uri, links.base, links.lines
    if links.remote:
        click.echo(f"MLflow UI: {base}")
        for line in lines:
            click.echo(line)
        return

    ui.check_port_free(host, port)  # before saying "starting"; start_mlflow_ui checks again

    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    # a plain `kill` or a closed terminal stops the server too, as Ctrl-C does
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    proc = None
    try:
        click.echo(f"starting mlflow ui on {uri} ...")
        try:
            proc = ui.start_mlflow_ui(uri, host=host, port=port)
        except RuntimeError as exc:
            click.echo(f"error: {_one_line(exc)}", err=True)
            sys.exit(1)
        click.echo(f"MLflow UI: {base}")
        for line in lines:
            click.echo(line)
        click.echo("Ctrl-C stops the server")
        code = proc.wait()
        click.echo(f"error: mlflow ui (pid {proc.pid}) exited with code {code}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        if proc is not None:
            ui.stop_mlflow_ui(proc)
        click.echo("MLflow UI stopped")
    finally:
        if proc is not None:
            ui.stop_mlflow_ui(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------------------------------------
# option parsing

def _key_values(items: tuple[str, ...], section: str, option: str) -> dict[str, Any]:
    """``("hidden=64",)`` -> ``{"model.hidden": 64}`` (values read as YAML)."""
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
        out[f"{section}.{key.strip()}"] = value
    return out


def _names(text: str) -> tuple[str, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    return tuple(part.strip() for part in text.split(",") if part.strip())


if __name__ == "__main__":  # pragma: no cover
    main()
