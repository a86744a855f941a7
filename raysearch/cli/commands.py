"""The ``raysearch`` command: sweep, train, report, compare, sync, export, calibrate, ui.

A thin layer: each command parses its options (:mod:`raysearch.cli.options`), calls one
function of the Python API (:mod:`raysearch.api`) or of the layer behind it (the sweep engine
:mod:`raysearch.tune.engine` and :mod:`raysearch.tune.resume`, the reports of
:mod:`raysearch.tracking.reports`), and prints. Bad input (ValueError, FileNotFoundError)
becomes one line on stderr and exit code 2, without a traceback (:mod:`raysearch.cli.base`).
``raysearch list``, ``spaces`` and ``recipes`` live in :mod:`raysearch.cli.catalog`.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from raysearch.cli.base import (
    EXIT_INTERRUPTED,
    EXIT_NONE_COMPLETED,
    EXIT_SOME_FAILED,
    EXIT_TRACKING_AWAY,
    echo,
    friendly_errors,
    main,
    one_line,
)
from raysearch.cli.catalog import list_command, recipes, spaces
from raysearch.cli.options import (
    SWEEP_DATA_OPTIONS,
    SWEEP_RESOURCE_OPTIONS,
    SWEEP_RUN_OPTIONS,
    attach,
    sweep_settings,
    tracking_options,
)

__all__ = ["main"]

main.add_command(list_command)
main.add_command(spaces)
main.add_command(recipes)


@main.command()
@click.argument("space", required=False)
@click.option("--resume", "resume", default=None, metavar="NAME",
              help="Continue sweep NAME after its driver was killed or interrupted: finished "
                   "trials are kept, unfinished and failed ones go on from their checkpoints. "
                   "Takes the sweep's own space and settings (give no SPACE; --address, "
                   "--tracking-uri, --experiment and --storage-path, where its storage is now "
                   "if it was moved, may be given).")
@attach(SWEEP_DATA_OPTIONS)
@attach(SWEEP_RESOURCE_OPTIONS)
@attach(SWEEP_RUN_OPTIONS)
@tracking_options
@click.pass_context
@friendly_errors
def sweep(ctx: click.Context, space: str | None, resume: str | None, dry_run: bool,
          **options: Any) -> None:
    """Run a sweep over SPACE (a bundled space name such as 'acls', or a YAML file).

    `raysearch sweep --resume NAME` continues a sweep whose driver was killed.

    \b
    Exit codes:
      0    every trial completed
      2    bad input: one line on stderr, nothing written, Ray not started
      3    some trials failed (the last line counts them and names the most
           common error); the completed ones are selected, plotted, exportable
      4    no trial completed: nothing selected (the same last line)
      5    the trials ended while the tracking store did not answer: one line naming
           `raysearch sync NAME`, which writes the records once it answers
      130  stopped by Ctrl-C: `raysearch sweep --resume NAME` continues the sweep
    """  # noqa: D301 (\b: click keeps the list's lines as they are)
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
    settings = sweep_settings(options)
    if settings.name is not None:  # a new sweep's name: one folder under the storage path
        from raysearch.tune.storage import check_sweep_name

        check_sweep_name(settings.name)
    loaded = load_space(space)
    if dry_run:
        import yaml

        from raysearch.cli.plan import dry_run_document

        plan = dry_run_document(loaded, settings)
        click.echo(yaml.safe_dump(plan, sort_keys=False, width=100), nl=False)
        return
    from raysearch.tune.engine import run_sweep  # Ray, Tune and MLflow: seconds to import

    with _sweep_exits():
        result = run_sweep(loaded, settings, progress=echo)
    _print_result(result)


@contextlib.contextmanager
def _sweep_exits() -> Iterator[None]:
    """A sweep's ends that are not bad input: the store away at the end (5), Ctrl-C (130)."""
    from raysearch.tune.engine import TrackingUnavailableError

    try:
        yield
    except TrackingUnavailableError as exc:  # a ValueError, but not bad input: not exit 2
        click.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(EXIT_TRACKING_AWAY)
    except KeyboardInterrupt:  # before Tune runs, or a second Ctrl-C while it stops
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)


def _resume(ctx: click.Context, space: str | None, resume: str, options: dict[str, Any]) -> None:
    """``raysearch sweep --resume NAME``: the sweep's own space and settings, nothing else."""
    from raysearch.tune.resume import resume_sweep

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
    with _sweep_exits():
        result = resume_sweep(resume, tracking_uri=options["tracking_uri"],
                              experiment=options["experiment"], address=options["address"],
                              storage_path=options["storage_path"], progress=echo)
    _print_result(result)


def sweep_exit_code(result: Any) -> int:
    """The exit code of a sweep that ended (see ``raysearch sweep --help``).

    Args:
        result: its :class:`~raysearch.tune.engine.SweepResult`.

    Returns:
        130 when it was interrupted, else 4 when no trial (configuration) completed, else 3
        when a trial failed, else 0.
    """
    if result.interrupted:
        return EXIT_INTERRUPTED
    if not result.completed:
        return EXIT_NONE_COMPLETED
    return EXIT_SOME_FAILED if result.failed else 0


def _print_result(result: Any) -> None:
    from raysearch.tracking.reports import sweep_result_lines

    for line in sweep_result_lines(result):
        click.echo(line)
    code = sweep_exit_code(result)
    if code:
        sys.exit(code)


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
    from raysearch.config import RunConfig
    from raysearch.config.yaml_file import read_yaml_file
    from raysearch.tracking import check_export_versions, train_and_log
    from raysearch.tracking.reports import metrics_line, quiet_mlflow

    quiet_mlflow()

    cfg = RunConfig.from_yaml(config)
    if epochs is not None:
        cfg.epochs = epochs
    if data_dir is not None:
        cfg.data.dir = str(Path(data_dir).expanduser().resolve())
    doc = read_yaml_file(config)
    exported = (doc.get("metric_functions") or []) if isinstance(doc, dict) else []
    from raysearch.training.registries import check_config_names

    check_config_names(cfg, exported)  # a name that does not import: its error, before any note
    check_export_versions(doc, echo)
    tags = {"raysearch.source_config": str(Path(config).resolve())}
    if isinstance(doc, dict) and doc.get("sweep"):
        tags["raysearch.source_sweep"] = str(doc["sweep"])
        tags["raysearch.source_run"] = str(doc.get("run_id", ""))
    hp = ", ".join(f"{k}={v}" for k, v in cfg.loss.params.items())
    click.echo(f"training {cfg.loss.name}({hp}) with {cfg.model.name} on {cfg.data.name}, "
               f"{cfg.epochs} epochs, seed {cfg.seed}")
    run_id, metrics = train_and_log(
        cfg, tracking_uri=tracking_uri, experiment=experiment, run_name=name, tags=tags,
        progress=echo, device=device, precision=precision, metrics=exported)
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
    from raysearch.tune.resume import sync_sweep

    quiet_mlflow()
    done = sync_sweep(name, tracking_uri=tracking_uri, experiment=experiment,
                      storage_path=storage_path, progress=echo)
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
    model: mlflow.pyfunc.load_model("models:/MODEL_NAME/1").predict(x) maps inputs
    (N, *input_shape) (float32; float64 and integers are cast) to calibrated probabilities
    (N, K). Where the validation split is perfectly classified the calibrator cannot be fitted
    and the model is exported without it (one warning line). A sweep of objects defined in a
    script or notebook is exported from it: raysearch.export(NAME, register=..., model=...).
    """
    from raysearch.api import export as export_sweep
    from raysearch.tracking.reports import export_line, searched_of

    if with_weights and output is None:
        raise ValueError("--with-weights writes a model folder: give it with -o DIR")
    model = register is not None or with_weights
    path = output if with_weights or not model else None
    with warnings.catch_warnings():  # a calibrator left out: the warning line below says so
        warnings.filterwarnings("ignore", "validation split is perfectly", UserWarning)
        doc = export_sweep(name, path if model else (output or "best.yaml"),
                           tracking_uri=tracking_uri, experiment=experiment, tolerance=tolerance,
                           register=register, with_weights=with_weights, calibrator=calibrator,
                           storage_path=storage_path)
    searched = searched_of(name, tracking_uri=tracking_uri, experiment=experiment)
    if not model:
        click.echo(f"wrote {output or 'best.yaml'}: {export_line(doc, searched)}")
        click.echo(f"train it again: raysearch train {output or 'best.yaml'}")
        return
    info = doc["model"]
    shape = ", ".join(str(d) for d in info["input_shape"])
    click.echo(f"model of {export_line(doc, searched)}")
    click.echo(f"  weights from the trial's {info['weights_from']}, calibrator "
               f"{info['calibrator']}: predict(float32 (N, {shape})) -> probabilities "
               f"(N, {info['num_classes']})")
    for line in ([f"warning: {info['warning']}"] if info.get("warning") else []) + info["notes"]:
        click.echo(line, err=True)
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
                     experiment=experiment, progress=echo)


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
                              progress=echo)
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
            click.echo(f"error: {one_line(exc)}", err=True)
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


if __name__ == "__main__":  # pragma: no cover
    main()
