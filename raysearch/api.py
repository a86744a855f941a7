"""The Python API: sweep, train and export from a script or a notebook.

Everything the CLI does, with your own objects where the CLI takes names::

    import raysearch

    def make_net(num_classes, input_shape, hidden=64):       # defined in a notebook: fine
        ...

    result = raysearch.sweep(
        {"method": "ls", "params": {"epsilon": {"low": 0.0, "high": 0.2}},
         "model": {"hidden": {"low": 16, "high": 128}}},
        model=make_net, dataset="mypkg.data:load_table", num_samples=8, epochs=10)
    result.trials          # a DataFrame: a row per trial, params, metrics, on_front, selected
    result.selected        # the selected trial's row
    raysearch.export(result.name, "best.yaml")
    raysearch.train("best.yaml", model=make_net)

Names, import strings ``package.module:attr`` and callables are accepted alike (see
:mod:`raysearch.registry`); callables reach Ray's workers by value (cloudpickle), so objects
defined in a notebook or a script work. :func:`searcher` gives the parts for a Tune trainable
of your own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raysearch.config import RunConfig, sections_from_flat
from raysearch.config.flat import deep_merge
from raysearch.registry import object_label
from raysearch.tune.settings import SweepSettings

__all__ = ["Calibration", "TrainRun", "calibrate", "export", "searcher", "sweep", "train"]

#: Where each keyword's callables are looked up, by kind.
_KINDS = {"model": "models", "dataset": "datasets", "loss": "losses"}


def _name_of(value: Any, kind: str, components: dict[str, dict[str, Any]]) -> str | None:
    """A name, import string or callable -> the name recorded (callables by their label)."""
    if value is None or isinstance(value, str):
        return value
    if not callable(value):
        from raysearch.training.registries import registry

        raise ValueError(f"{registry(kind).noun} must be a name, an import string "
                         f"package.module:attr or a callable, got {value!r}")
    label = object_label(value)
    components.setdefault(kind, {})[label] = value
    return label


def _metrics(metrics: Any, components: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    if metrics is None:
        return ()
    if isinstance(metrics, str) or callable(metrics):
        metrics = [metrics]
    return tuple(_name_of(m, "metrics", components) for m in metrics)  # type: ignore[misc]


def sweep(space: str | Path | Mapping[str, Any] | Any, *, model: Any = None,
          dataset: Any = None, loss: Any = None, metrics: Any = None,
          progress: Callable[[str], None] | None = print, **settings: Any) -> Any:
    """Run a sweep and return its :class:`~raysearch.tune.engine.SweepResult`.

    Args:
        space: a bundled space name (``"acls"``), a YAML file, a loaded
            :class:`~raysearch.tune.spaces.SearchSpace`, or a mapping in the files' format
            (``{"method": ..., "params": {...}, "model": {...}, "optimizer": {...},
            "train": {...}}``; ``method`` may be left out when `loss` is given).
        model: the model for every trial: a name (``"resnet20"``), an import string, or a
            factory ``f(num_classes, input_shape, **model_params) -> nn.Module`` (a class
            works); None: the space's, else ``cnn``.
        dataset: the data: a name, an import string or a factory ``f(data_dir, seed,
            val_fraction, **data_params) -> raysearch.DatasetSplits``; None: the space's, else
            ``digits``.
        loss: the loss when the space names none: a name, an import string, or an
            ``nn.Module`` class or factory taking the space's ``params`` as keywords.
        metrics: your metric functions ``fn(probs (N, K), labels (N,)) -> float`` (callables or
            import strings): every trial logs ``val_<fn>`` and ``test_<fn>``; they may be the
            ``objective`` or the ``ece_metric``.
        progress: called with one line per finished trial and a few status lines (default:
            :func:`print`; None: the ``raysearch.tune.engine`` logger).
        **settings: any field of :class:`~raysearch.tune.settings.SweepSettings`:
            ``num_samples``, ``epochs``, ``max_concurrent``, ``objective``, ``tracking_uri``,
            ``experiment``, ``name``, ``seed``, ``data_dir``, ``model_params``, and the
            resources' keys ``gpus_per_trial``, ``cpus_per_trial``, ...

    Returns:
        SweepResult: ``trials`` (a DataFrame: one row per trial with its params, final metrics,
        ``complete``, ``on_front`` and ``selected``), ``front``, ``selected``,
        ``parent_run_id``, ``name``, ``mlflow_link``, ``failed`` (the failed trials with their
        one-line errors; a sweep in which some trials failed returns normally).

    Raises:
        ValueError: one line for an unknown name or setting, an import string that does not
            import, a factory that raises or breaks its contract, a `loss` given with a space
            that names its own; all before Ray starts or anything is written.
        raysearch.NoTrialCompletedError: (a RuntimeError) when the sweep ran but none of its
            trials completed; its ``result`` is the SweepResult (parent run, trials table and
            ``failed`` recorded as usual). Not raised for a sweep stopped by Ctrl-C, which
            returns with ``interrupted`` set.
    """
    from raysearch.tune.engine import run_sweep
    from raysearch.tune.spaces import SearchSpace, load_space, space_from_dict

    components: dict[str, dict[str, Any]] = {}
    model_name = _name_of(model, "models", components)
    dataset_name = _name_of(dataset, "datasets", components)
    loss_name = _name_of(loss, "losses", components)
    if isinstance(space, Mapping):
        doc = dict(space)
        if loss_name is not None:
            if "method" in doc or "methods" in doc:
                raise ValueError("the space names its loss (`method`): give `loss=` only with "
                                 "a space without one")
            doc["method"] = loss_name
        loaded = space_from_dict(doc, str(settings.pop("space_name", "space")),
                                 components=components)
    else:
        loaded = space if isinstance(space, SearchSpace) else load_space(space)
        if loss_name is not None:
            raise ValueError(f"space {loaded.name!r} names its loss ({', '.join(loaded.methods)})"
                             ": give `loss=` only with a space (a mapping) without `method`")
    values = dict(settings)
    if model_name is not None:
        values["model"] = model_name
    if dataset_name is not None:
        values["dataset"] = dataset_name
    values["metrics"] = _metrics(metrics, components)
    config = SweepSettings(**values)
    result = run_sweep(loaded, config, progress=progress, components=components or None)
    if not result.interrupted and not result.completed:
        from raysearch.tune.outcome import NoTrialCompletedError

        raise NoTrialCompletedError(result)
    return result


@dataclass
class TrainRun:
    """What :func:`train` returns.

    Attributes:
        run_id: the MLflow run.
        metrics: the final metrics (``val_*``, ``test_*``, ...).
        config: the config that was trained.
    """

    run_id: str
    metrics: dict[str, float]
    config: RunConfig = field(repr=False)


def train(config: RunConfig | Mapping[str, Any] | str | Path, *, model: Any = None,
          dataset: Any = None, loss: Any = None, metrics: Any = None,
          tracking_uri: str | None = None, experiment: str = "raysearch",
          run_name: str | None = None, device: str | None = None, precision: str = "auto",
          progress: Callable[[str], None] | None = None, **overrides: Any) -> TrainRun:
    """Train one configuration in this process and log it to MLflow.

    Args:
        config: a :class:`~raysearch.config.RunConfig`, a mapping (sections, or the flat keys
            of a trial config), or a YAML file (``raysearch export``'s ``best.yaml``).
        model: replaces the config's model: a name, an import string or a factory (give the
            factory again for a config exported from a sweep of notebook callables, whose
            names read ``__main__:...``).
        dataset: replaces the config's dataset, likewise.
        loss: replaces the config's loss, likewise.
        metrics: your metric functions (callables or import strings); an export's own are
            used when None.
        tracking_uri: MLflow store (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: MLflow experiment.
        run_name: the run's name.
        device: ``cpu``, ``cuda`` or ``cuda:N`` (default: a visible GPU, else the CPU).
        precision: ``auto``, ``bf16`` or ``fp32``.
        progress: called with one line per epoch.
        **overrides: values that replace the config's, as sections (``optimizer={"lr": 0.1}``,
            ``model={"params": {"hidden": 64}}``, merged key by key), run fields
            (``epochs=3``) or flat keys (``lr=0.1``, ``**{"model.hidden": 64}``), read by
            :func:`raysearch.config.sections_from_flat`.

    Returns:
        TrainRun: the run id, the final metrics and the trained config. With the same config
        and seed on the CPU, the test metrics equal the sweep trial's.

    Raises:
        ValueError: one line for an invalid config, an unknown name, a factory that raises;
            before the MLflow run is created.
        raysearch.training.run.DivergedError: if the loss becomes NaN (the run is marked FAILED).
        raysearch.training.run.OutOfMemoryRunError: one line if the device runs out of memory
            (the batch size, the device, what to lower; the run is marked FAILED).
    """
    from raysearch.config.yaml_file import read_yaml_file
    from raysearch.tracking import check_export_versions, train_and_log
    from raysearch.training.registries import check_config_names

    exported: list[str] = []
    doc = None
    if isinstance(config, (str, Path)):
        cfg = RunConfig.from_yaml(config)
        doc = read_yaml_file(config)
        if isinstance(doc, dict):
            exported = list(doc.get("metric_functions") or [])
    elif isinstance(config, RunConfig):
        cfg = config
    else:
        cfg = RunConfig.from_dict(config)
    components: dict[str, dict[str, Any]] = {}
    updates = dict(overrides)
    for section, value, kind in (("model", model, "models"), ("data", dataset, "datasets"),
                                 ("loss", loss, "losses")):
        name = _name_of(value, kind, components)
        if name is not None:
            updates = deep_merge(sections_from_flat(updates), {section: {"name": name}})
    if updates:
        cfg = _override(cfg, updates)
    specs = _metrics(metrics, components) if metrics is not None else tuple(exported)
    # a name that does not import is the one error, before any note on the export's versions
    check_config_names(cfg, specs, components)
    if isinstance(doc, dict):
        check_export_versions(doc, progress or (lambda line: None))
    run_id, values = train_and_log(cfg, tracking_uri=tracking_uri, experiment=experiment,
                                   run_name=run_name, progress=progress, device=device,
                                   precision=precision, components=components,
                                   metrics=[components.get("metrics", {}).get(s, s)
                                            for s in specs])
    return TrainRun(run_id, values, cfg)


def _override(cfg: RunConfig, values: Mapping[str, Any]) -> RunConfig:
    """`cfg` with `values` (sections, run fields or flat keys) merged in, key by key."""
    return RunConfig(**deep_merge(cfg.to_dict(), sections_from_flat(values)))


def export(name: str, path: str | Path | None = None, *, tracking_uri: str | None = None,
           experiment: str = "raysearch", tolerance: float | None = None,
           register: str | None = None, with_weights: bool = False, calibrator: str = "ts",
           storage_path: str | None = None, model: Any = None, dataset: Any = None,
           loss: Any = None) -> dict[str, Any]:
    """The selected trial of sweep `name` as an export document, a YAML file or a model.

    A model is rebuilt from the trial's config: a sweep of objects defined in a script or a
    notebook (recorded as ``__main__:name``) needs them again, given as `model` and `dataset`
    from the script or notebook that defines them::

        raysearch.export("nb", register="nb-model", model=make_net, dataset=rows)

    Args:
        name: the sweep's name.
        path: where to write the YAML (``raysearch train PATH`` trains it again); with
            `with_weights`, the folder of the MLflow pyfunc model instead; None: write nothing.
        tracking_uri: the sweep's MLflow store.
        experiment: its experiment.
        tolerance: the rule's accuracy tolerance (default: the sweep's).
        register: register the selected trial as this MLflow registered model (a new version):
            an MLflow pyfunc model whose ``predict(x)`` maps float32 inputs (N, *input_shape)
            to calibrated probabilities (N, K) (:mod:`raysearch.tracking.pyfunc`), logged in
            the trial's run under ``model/``.
        with_weights: write that model to the folder `path` (no registry needed).
        calibrator: the post-hoc calibrator fitted on the trial's validation logits and
            applied after the network (``ts``, ``cts``, ``ets``, ..., or ``none``).
        storage_path: where the sweep's Tune storage is now, when the trial's weights are read
            from its checkpoint (default: the path it was started with).
        model: the model's factory (a callable, a name or an import string) standing for the
            config's model, as :func:`sweep` took it; needed for a ``__main__`` factory.
        dataset: the dataset's factory likewise (it gives the model's input shape and classes).
        loss: the loss likewise; accepted so that a sweep's keywords can be passed again, the
            model itself does not use it.

    Returns:
        ``{"config": ..., "sweep": ..., "trial": ..., "run_id": ..., "selection": ...,
        "metrics": {...}, "requires": {versions, import strings, packages}}``; with a model,
        also ``"model": {"uri": ..., "calibrator": ..., "requirements": [...], "notes":
        [...]}`` (:func:`raysearch.tune.model_export.export_model`). Where the validation split
        is perfectly classified the calibrator cannot be fitted (``degenerate``): the model is
        exported without it (``"calibrator": "none"``, ``"warning"``) and a ``UserWarning``
        says so.

    Raises:
        ValueError: if the sweep is unknown or has no complete trial; for a model, if the
            trial's weights or validation logits are missing, `calibrator` is unknown, or the
            config names ``__main__`` objects that `model` / `dataset` do not give (one line
            naming ``raysearch.export(..., model=...)``).
    """
    import yaml

    from raysearch.tracking import best_config_document, get_client, load_sweep
    from raysearch.tracking.reports import quiet_mlflow

    quiet_mlflow()
    client, _ = get_client(tracking_uri)
    parent, frame, _ = load_sweep(client, name, experiment, tolerance)
    selected = frame[frame["selected"]] if not frame.empty else frame
    if not len(selected):
        raise ValueError(f"sweep '{name}' has no complete trial to export")
    doc = best_config_document(selected.iloc[0], parent)
    if register is not None or with_weights:
        if with_weights and path is None:
            raise ValueError("with_weights needs the model's folder (-o DIR)")
        if with_weights and Path(path).exists():
            raise ValueError(f"{path} exists; the model's folder must be new")
        from raysearch.tune.model_export import export_model

        components = _export_components(name, doc["config"], model=model, dataset=dataset,
                                        loss=loss)
        doc["model"] = export_model(client, parent, doc, register=register,
                                    folder=path if with_weights else None,
                                    calibrator=calibrator, storage_path=storage_path,
                                    components=components)
        if doc["model"].get("warning"):
            import warnings

            warnings.warn(doc["model"]["warning"], UserWarning, stacklevel=2)
    elif path is not None:
        Path(path).write_text(yaml.safe_dump(doc, sort_keys=False))
    return doc


def _export_components(name: str, config: Mapping[str, Any], *, model: Any, dataset: Any,
                       loss: Any) -> dict[str, dict[str, Any]]:
    """The given objects keyed by the config's names; raise for ``__main__`` names not given.

    Raises:
        ValueError: one line naming ``raysearch.export(..., model=...)`` for a ``__main__``
            model or dataset that is not given; for a value that is neither a name nor a
            callable.
    """
    cfg = RunConfig.from_dict(dict(config))
    recorded = (("model", "models", cfg.model.name, model),
                ("dataset", "datasets", cfg.data.name, dataset),
                ("loss", "losses", cfg.loss.name, loss))
    missing = [(keyword, str(label)) for keyword, _, label, given in recorded[:2]
               if given is None and str(label).startswith("__main__:")]
    if missing:
        named = ", ".join(f"{keyword} {label!r}" for keyword, label in missing)
        keywords = ", ".join(f"{keyword}={label.split(':', 1)[1]}" for keyword, label in missing)
        raise ValueError(f"sweep '{name}' trained objects defined in a script or notebook "
                         f"({named}), which only it can give again: export the model from it "
                         f"with raysearch.export('{name}', register=..., {keywords})")
    components: dict[str, dict[str, Any]] = {}
    for _, kind, label, given in recorded:
        if given is not None:
            _name_of(given, kind, {})  # a name, an import string or a callable
            components.setdefault(kind, {})[str(label)] = given
    return components


def searcher(space: Any, *, metric: str | Sequence[str] = ("val_accuracy", "val_ece"),
             mode: str | Sequence[str] = ("max", "min"), sampler: str = "tpe",
             seed: int = 0) -> Any:
    """A search space as a Ray Tune search algorithm, for a trainable of your own.

    Args:
        space: a space name, a YAML file, a loaded space or a mapping (as :func:`sweep`).
        metric: the metric(s) your trainable reports that Optuna optimises.
        mode: ``"min"``/``"max"`` per metric.
        sampler: ``tpe``, ``nsga2`` or ``random`` (seeded with `seed`).
        seed: seed of the sampler.

    Returns:
        An ``OptunaSearch`` sampling the space's define-by-run function; a trial's config
        holds the space's names (``margin``, ``lr``, ``model.hidden``, ...), and
        ``space.resolve(config)`` places it into a :class:`~raysearch.config.RunConfig`. A
        trial whose last result says ``completed: False`` is told to Optuna as pruned, one
        with ``diverged`` as failed.
    """
    import optuna

    from raysearch.tune.searchers import CompletedOnlyOptunaSearch, make_sampler
    from raysearch.tune.spaces import SearchSpace, load_space, space_from_dict

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line
    if isinstance(space, Mapping):
        space = space_from_dict(space)
    elif not isinstance(space, SearchSpace):
        space = load_space(space)
    metric = list(metric) if not isinstance(metric, str) else metric
    mode = list(mode) if not isinstance(mode, str) else mode
    return CompletedOnlyOptunaSearch(space=space.define_by_run, metric=metric, mode=mode,
                                     sampler=make_sampler(sampler, seed),
                                     require_completed=False)



@dataclass
class Calibration:
    """What :func:`calibrate` returns.

    Attributes:
        report: the fitted calibrators' table (a
            :class:`~raysearch.calibration.posthoc.CalibrationReport`); None after a search.
        output_dir: the folder holding ``calibration.csv`` and the reliability diagrams; None
            after a search.
        run_id: the MLflow run the results were logged to (a search's parent run), or None.
        search: the post-hoc sweep's result (a
            :class:`~raysearch.tune.posthoc_sweep.PosthocSweepResult`) with `search`, else None.
    """

    report: Any = None
    output_dir: Path | None = None
    run_id: str | None = None
    search: Any = None


def _method_names(methods: str | Sequence[str]) -> tuple[str, ...]:
    if not isinstance(methods, str):
        return tuple(methods)
    if methods.strip().lower() in ("", "none"):
        return ()
    return tuple(part.strip() for part in methods.split(",") if part.strip())


def _is_run_id(source: str) -> bool:
    return len(source) == 32 and all(c in "0123456789abcdef" for c in source)


def calibrate(source: str | Path, *, methods: str | Sequence[str] = "ts,ets,cts,pts,ts_sbece",
              classwise_scaling: str = "off", fraction: float = 0.5, seed: int = 0,
              n_bins: int = 15, output_dir: str | Path | None = None,
              allow_pickle: bool = False, log: bool = False, search: str | Path | None = None,
              num_samples: int = 16, holdout: float = 0.3, tracking_uri: str | None = None,
              experiment: str = "raysearch",
              progress: Callable[[str], None] | None = print) -> Calibration:
    """Fit post-hoc calibrators on stored network outputs and compare them.

    Without `search` each calibrator in `methods` is fitted on the calibration part and
    measured on the evaluation part (:func:`raysearch.calibration.posthoc.calibrate_outputs`); the
    table goes to ``<output_dir>/calibration.csv`` with one reliability diagram per row, and to an
    MLflow run with `log` or a `tracking_uri`. With `search` a post-hoc space is swept with
    Tune instead (:func:`raysearch.tune.posthoc_sweep.run_posthoc_sweep`), always logged to MLflow.

    Args:
        source: a ``.npz``/``.parquet`` file (or a pickle with `allow_pickle`) of logits or
            probabilities ``(N, K)`` float and labels ``(N,)`` int, or the 32-hex-digit MLflow
            run id of a sweep trial (its stored validation/test logits).
        methods: calibrator names, comma-separated or a sequence; ``"none"``: only the
            uncalibrated row.
        classwise_scaling: ``off``, ``on`` or ``both`` (class-wise loss scaling, Jung et al.
            2023).
        fraction: calibration share of a stratified split (files without their own split).
        seed: seed of the split.
        n_bins: bins of the metrics.
        output_dir: where the table and diagrams go (default: ``./calibrate-<stem>``).
        allow_pickle: read pickle files (only files you trust).
        log: log the results to MLflow (implied by `tracking_uri`).
        search: a post-hoc space name or YAML file to sweep instead of fitting `methods`.
        num_samples: trials of the search.
        holdout: held-out share of the calibration part that the search selects on.
        tracking_uri: MLflow store (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: MLflow experiment.
        progress: called with each line to show, in order (the table, the files written, the
            run; a search's trials and its selection); None: nothing is shown.

    Returns:
        Calibration: the report, the output folder, the MLflow run and the search's result.

    Raises:
        ValueError: for a file that cannot be read as outputs, a run without stored logits,
            an unknown calibrator or bad split settings, a search whose trials all failed.
        FileNotFoundError: if `source` is neither a file nor a run id.
    """
    from raysearch.calibration.posthoc import calibrate_outputs

    say = progress or (lambda line: None)
    source = str(source)
    outputs, stem, client = _load_source(source, allow_pickle, tracking_uri)
    if search:
        return _search(outputs, search, num_samples=num_samples, seed=seed, fraction=fraction,
                       holdout=holdout, tracking_uri=tracking_uri, experiment=experiment,
                       n_bins=n_bins, progress=progress)
    if (log or tracking_uri) and client is None:
        from raysearch.tracking.runs import check_tracking_uri, resolve_tracking_uri

        check_tracking_uri(resolve_tracking_uri(tracking_uri))  # before anything is written
    report = calibrate_outputs(outputs, methods=_method_names(methods),
                               classwise_scaling=classwise_scaling, fraction=fraction,
                               seed=seed, n_bins=n_bins)
    say(report.format_table())
    out = _write_report(report, Path(output_dir or f"calibrate-{stem}"), stem)
    say(f"\nwrote {out}/calibration.csv and {len(report.rows)} reliability diagrams")
    run_id = None
    if log or tracking_uri:
        from raysearch.tracking import get_client, log_calibration_run
        from raysearch.tracking.reports import quiet_mlflow

        quiet_mlflow()
        if client is None:
            client, uri = get_client(tracking_uri)
        else:
            uri = client.tracking_uri
        run_id = log_calibration_run(
            client, uri, experiment, run_name=f"calibrate-{stem}", source=source,
            params={"source": source,
                    "methods": methods if isinstance(methods, str) else ",".join(methods),
                    "classwise_scaling": classwise_scaling, "split": fraction, "seed": seed,
                    "n_bins": n_bins, "n_calibration": report.n_calibration,
                    "n_evaluation": report.n_evaluation},
            metrics=report.as_metrics("test"), folder=out)
        say(f"MLflow run {run_id} ({uri})")
    return Calibration(report=report, output_dir=out, run_id=run_id)


def _load_source(source: str, allow_pickle: bool,
                 tracking_uri: str | None) -> tuple[Any, str, Any]:
    """(outputs, a short name for files, the MLflow client if `source` is a run id)."""
    from raysearch.calibration.posthoc import load_outputs

    path = Path(source)
    if not path.exists() and _is_run_id(source):
        from raysearch.tracking import get_client, trial_outputs
        from raysearch.tracking.reports import quiet_mlflow

        quiet_mlflow()
        client, _ = get_client(tracking_uri)
        outputs = trial_outputs(client, source)
        if outputs is None:
            raise ValueError(f"run {source} has no stored logits (logits.parquet)")
        return outputs, f"run-{source[:8]}", client
    return load_outputs(path, allow_pickle=allow_pickle), path.stem, None


def _search(outputs: Any, search: str | Path, *, progress: Callable[[str], None] | None,
            **options: Any) -> Calibration:
    """A post-hoc sweep over `outputs` (:func:`raysearch.tune.posthoc_sweep.run_posthoc_sweep`)."""
    from raysearch.tracking.reports import percent, quiet_mlflow
    from raysearch.tune.posthoc_sweep import run_posthoc_sweep

    say = progress or (lambda line: None)
    quiet_mlflow()
    result = run_posthoc_sweep(outputs, space=search, progress=progress, **options)
    if result.selected is None:
        raise ValueError("every post-hoc trial failed: nothing selected")
    sel = result.selected
    base = result.uncalibrated
    say(f"\nselected: {result.best} (chosen on {result.split})")
    say(f"evaluation part: ECE {percent(base.get('eval_ece'))} -> "
        f"{percent(sel.get('eval_ece'))}, NLL {base.get('eval_nll', float('nan')):.4f}"
        f" -> {sel.get('eval_nll', float('nan')):.4f}, accuracy "
        f"{percent(base.get('eval_accuracy'))} -> {percent(sel.get('eval_accuracy'))}")
    say(f"MLflow: sweep {result.name}, parent run {result.parent_run_id} "
        f"({result.tracking_uri})")
    return Calibration(run_id=result.parent_run_id, search=result)


def _write_report(report: Any, out: Path, stem: str) -> Path:
    """``calibration.csv`` and a reliability diagram per row into the folder `out`."""
    from raysearch.training.reliability_plot import reliability_diagram

    out.mkdir(parents=True, exist_ok=True)
    report.to_frame().to_csv(out / "calibration.csv", index=False)
    for row in report.rows:
        if row.reliability is None:
            continue
        bins = row.reliability
        ece_text = f"ECE {100 * row.metrics['ece']:.2f}%" if "ece" in row.metrics else ""
        reliability_diagram(bins.edges, bins.counts, bins.accuracy, bins.confidence,
                            out / f"reliability_{row.name.replace('+', '_')}.png",
                            title=f"{stem}: {row.name}  {ece_text}")
    return out
