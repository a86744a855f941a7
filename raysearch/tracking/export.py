"""The end of a sweep and its export: the selection's artifacts and ``best_config.yaml``.

:func:`finalize_sweep` applies the selection rule and attaches ``pareto.png`` (and its
interactive ``pareto.html``), ``trials.parquet`` (``seeds.parquet``) and ``best_config.yaml``
to the parent run;
:func:`best_config_document` is the exported document and :func:`requirements` what it needs to
train again (versions, the user's code behind its names); :func:`check_export_versions` says
where this environment differs from an export's. :func:`model_environment` is what a registered
model needs where it is loaded (pip requirements, the user's code that no index has), and
:func:`degenerate_line` reports a trial whose calibrator could not be fitted (its tag:
:data:`~raysearch.tracking.runs.DEGENERATE_TAG`).

Imports :mod:`raysearch.tracking.client` and :mod:`~raysearch.tracking.sweeps`;
:mod:`~raysearch.tracking.callback` and :mod:`raysearch.tracking` import it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from raysearch.tracking.pareto_html import pareto_html
from raysearch.tracking.runs import (
    DEGENERATE_TAG,
    ERROR_TAG,
    OUTCOME_TAG,
    PARENT_TAG,
    REPEATS_TAG,
    SWEEP_TAG,
    TABLE_TAG,
    TRIAL_TAG,
)
from raysearch.tracking.sweeps import (
    annotate_selection,
    seed_trials,
    stored_sections,
    summarize_configuration,
    sweep_runs,
    sweep_trials,
    write_parquet,
)

logger = logging.getLogger("raysearch.tracking")


#: What ``export --register`` says when the calibrator could not be fitted on the trial's
#: validation logits; the model is then exported without it.
DEGENERATE_EXPORT = ("validation split is perfectly classified; the calibrator cannot be "
                     "fitted — exported without it")


def degenerate_line(trial: str, names: str) -> str:
    """The progress line of a trial whose calibrators `names` could not be fitted."""
    return (f"  {trial}: validation split is perfectly classified; calibrator {names} cannot be "
            f"fitted (its temperature stopped at the lower bound; tag {DEGENERATE_TAG})")


#: Environment variable of a fault drill: ``selection`` SIGKILLs the driver in the middle of
#: :func:`finalize_sweep` (after the trials table, before the plot, the exported config and the
#: parent's status), as a lost SSH session or the OOM killer would; ``--resume`` repairs it.
FAULT_ENV = "RAYSEARCH_FAULT_AT"


def fault_point(name: str) -> None:
    """SIGKILL this process when the fault drill :data:`FAULT_ENV` names `name`."""
    if os.environ.get(FAULT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


def warm_end_imports() -> None:
    """Import what :func:`finalize_sweep` draws with: matplotlib and Plotly (~0.25 s of CPU).

    Imported on first use, these libraries made the first sweep of a process ~0.25 s slower
    before its first trial (matplotlib) and at its end (Plotly's template). The tracking
    callback runs this on a background thread once the last trial started and another ended
    (a worker is idle then); a process that never gets there imports them when it draws.
    """
    import plotly.io as pio

    from raysearch.training import plots  # noqa: F401 (imported for its side effect)

    pio.templates["plotly_white"]  # noqa: B018 (loads the template's JSON once)


def finalize_sweep(client: MlflowClient, parent_run_id: str, *, tolerance: float,
                   ece_key: str = "val_ece", accuracy_key: str = "val_accuracy",
                   status: str = "FINISHED", selection: str = "mean",
                   runs: list[Any] | None = None, read_at: int | None = None,
                   table: pd.DataFrame | None = None) -> pd.DataFrame:
    """Select the winner and attach ``pareto.png``, ``trials.parquet``, ``best_config.yaml``.

    The selection rule (lowest validation ECE within `tolerance` of the best validation
    accuracy) runs over the trials that ran all their epochs; failed and early-stopped trials
    stay in the table with ``on_front = selected = False``. In a repeated sweep the rows are
    its configuration runs (summarised here if a seed ended after the live summary), the rule
    applies to their means (`selection` ``mean``) or to mean + SEM of ECE (``robust``),
    ``pareto.png`` draws ±1 SEM error bars, and ``seeds.parquet`` holds the seed runs. The
    parent's tag :data:`~raysearch.tracking.runs.TABLE_TAG` is the time the runs were read
    (:func:`~raysearch.tracking.sweeps.stored_trials` reads the table back while it is current).

    `runs` (with `read_at`, the time in ms since the epoch before they were read): the sweep's
    runs (:func:`~raysearch.tracking.sweeps.sweep_runs`) when the caller has just read them and
    written nothing since; None: read here. `table`: the trials table of a sweep that is not
    repeated and whose runs all ended, as :func:`~raysearch.tracking.sweeps.sweep_trials` reads
    it, when the caller holds it (the sweep's
    :attr:`~raysearch.tracking.callback.MlflowSweepCallback.table`): no run is read then.

    Returns:
        The trials table with ``on_front`` and ``selected`` columns.
    """
    parent = client.get_run(parent_run_id)
    if table is not None:
        frame, repeated, read_at = table, [], int(time.time() * 1000)
    else:
        frame, repeated, read_at = _read_table(client, parent, runs, read_at)
    if frame.empty:
        client.set_terminated(parent_run_id, status)
        return frame
    try:
        frame = annotate_selection(frame, tolerance=tolerance, accuracy_key=accuracy_key,
                                   ece_key=ece_key, selection=selection)
    except ValueError as exc:  # robust without SEM (a single complete seed per configuration)
        logger.warning("%s; selecting on means", exc)
        frame = annotate_selection(frame, tolerance=tolerance, accuracy_key=accuracy_key,
                                   ece_key=ece_key)
    metrics: dict[str, float] = {}  # the selected trial's, as best_* (step 0)
    tags: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as d:
        write_parquet(frame, Path(d) / "trials.parquet")
        client.log_artifact(parent_run_id, str(Path(d) / "trials.parquet"))
        fault_point("selection")
        if repeated:
            seeds = seed_trials(client, parent)
            if not seeds.empty:
                write_parquet(seeds, Path(d) / "seeds.parquet")
                client.log_artifact(parent_run_id, str(Path(d) / "seeds.parquet"))
        _attach_pareto(client, parent, frame, Path(d), accuracy_key, ece_key)
        if frame["selected"].any():
            best = frame[frame["selected"]].iloc[0]
            export = best_config_document(best, parent)
            (Path(d) / "best_config.yaml").write_text(yaml.safe_dump(export, sort_keys=False))
            client.log_artifact(parent_run_id, str(Path(d) / "best_config.yaml"))
            metrics = {f"best_{k}": float(best[k]) for k in best.index
                       if isinstance(k, str) and k.startswith(("val_", "test_"))
                       and isinstance(best[k], (int, float)) and math.isfinite(best[k])}
            tags["raysearch.selected_run"] = best["run_id"]
    tags["raysearch.trials_complete"] = str(int(frame["complete"].sum()))
    tags[TABLE_TAG] = str(read_at)
    now = int(time.time() * 1000)
    client.log_batch(parent_run_id, metrics=[Metric(k, v, now, 0) for k, v in metrics.items()],
                     tags=[RunTag(k, v) for k, v in tags.items()])  # one write
    client.set_terminated(parent_run_id, status)
    return frame


def _read_table(client: MlflowClient, parent: Any, runs: list[Any] | None,
                read_at: int | None) -> tuple[pd.DataFrame, list[Any], int]:
    """The trials table read from the store, the configuration runs, when the runs were read.

    Trials left RUNNING end as interrupted, and a repeated sweep's configuration runs get
    their summaries first (see :func:`finalize_sweep`).
    """
    parent_run_id = parent.info.run_id
    if runs is None or read_at is None:
        read_at = int(time.time() * 1000)
        runs = sweep_runs(client, parent.info.experiment_id, parent_run_id)
    changed = _kill_left_over_trials(client, runs, parent.data.tags.get(SWEEP_TAG, ""))
    repeated = [r for r in runs if r.data.tags.get(REPEATS_TAG)
                and not r.data.tags.get(TRIAL_TAG)]
    for run in repeated:
        if run.info.status != "FINISHED" or _ended_after(client, run, runs):
            summarize_configuration(client, parent.info.experiment_id, run.info.run_id)
            changed = True
    frame = sweep_trials(client, parent, runs=None if changed else [
        r for r in runs if r.data.tags.get(PARENT_TAG) == parent_run_id])
    return frame, repeated, read_at


def _kill_left_over_trials(client: MlflowClient, runs: list[Any], sweep_name: str) -> bool:
    """End the trials a sweep left RUNNING as KILLED (``interrupted``); whether there were any.

    They were interrupted, or lost with a killed driver; ``sweep --resume`` sets them RUNNING
    again when it continues them.
    """
    changed = False
    for run in runs:
        if run.info.status == "RUNNING" and run.data.tags.get(TRIAL_TAG):
            changed = True
            client.set_tag(run.info.run_id, OUTCOME_TAG, "interrupted")
            client.set_tag(run.info.run_id, ERROR_TAG, "the sweep ended while this trial ran; "
                           f"`raysearch sweep --resume {sweep_name}` continues it")
            client.set_terminated(run.info.run_id, "KILLED")
    return changed


def _attach_pareto(client: MlflowClient, parent: Any, frame: pd.DataFrame, folder: Path,
                   accuracy_key: str, ece_key: str) -> None:
    """Draw the complete trials' front as ``pareto.png`` and ``pareto.html``, attach both.

    Nothing is drawn when no complete trial has the accuracy. A repeated sweep's points carry
    ±1 SEM error bars.
    """
    if accuracy_key not in frame:
        return
    drawn = frame["complete"] & frame[accuracy_key].notna()
    shown = frame if drawn.all() else frame[drawn]  # (no copy of a table that is all drawn)
    if shown.empty:
        return
    from raysearch.training import plots  # matplotlib (see warm_end_imports)

    parent_run_id = parent.info.run_id
    sweep_name = parent.data.tags.get(SWEEP_TAG, "")
    sel = [i for i, s in enumerate(shown["selected"]) if s]
    bars = {}
    if accuracy_key + "_sem" in shown and ece_key + "_sem" in shown:
        bars = {"accuracy_sem": shown[accuracy_key + "_sem"],
                "ece_sem": shown[ece_key + "_sem"]}
    plots.pareto_plot(shown[accuracy_key], shown[ece_key], shown["on_front"],
                      folder / "pareto.png", selected=sel[0] if sel else None,
                      groups=(list(shown["method"].astype(str))
                              if "method" in shown else None),
                      title=f"sweep {sweep_name}" + (
                          f" (mean ± SEM over {parent.data.params.get('repeats')} seeds)"
                          if bars else ""),
                      ece_label="validation " + (
                          "ECE" if ece_key == "val_ece" else ece_key[len("val_"):]),
                      **bars)
    client.log_artifact(parent_run_id, str(folder / "pareto.png"))
    pareto_html(shown, folder / "pareto.html", accuracy_key=accuracy_key,
                ece_key=ece_key, title=f"sweep {sweep_name}")
    client.log_artifact(parent_run_id, str(folder / "pareto.html"))


def _ended_after(client: MlflowClient, config_run: Any, runs: list[Any]) -> bool:
    """True when a seed run of `config_run` ended after the configuration was summarised."""
    done = config_run.info.end_time or 0
    return any(r.data.tags.get(PARENT_TAG) == config_run.info.run_id
               and (r.info.end_time or 0) > done for r in runs)


def best_config_document(best: pd.Series, parent: Any) -> dict[str, Any]:
    """The exported document: ``config``, where it came from, and what it needs.

    ``config`` is a RunConfig mapping; ``requires`` is :func:`requirements`.
    """
    config = json.loads(best["config"])
    metrics = {k: float(best[k]) for k in best.index if isinstance(k, str)
               and k.startswith(("val_", "test_")) and isinstance(best[k], (int, float))
               and math.isfinite(best[k])}
    return {
        "config": config,
        "sweep": parent.data.tags.get(SWEEP_TAG, ""),
        "trial": best["trial"],
        "run_id": best["run_id"],
        "selection": parent.data.params.get("selection_rule", ""),
        "metrics": dict(sorted(metrics.items())),
        **({"metric_functions": parent.data.params["metrics"].split(",")}
           if parent.data.params.get("metrics") else {}),
        "requires": requirements(config, parent.data.params.get("metrics", "")),
    }


def requirements(config: dict[str, Any], metrics: str = "") -> dict[str, Any]:
    """What a config needs to train again: versions and the user's code behind its names.

    Returns:
        ``{"python": ..., "raysearch": ..., "torch": ..., "imports": [import strings of the
        loss, model, dataset, optimizer and metrics], "packages": {top-level package: its
        version}}``; a package without a version (not installed, no ``__version__``) is
        listed as ``"unversioned"``.
    """
    import platform
    import sys

    from raysearch import __version__
    from raysearch.registry import is_import_string

    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:  # pragma: no cover (torch is a dependency)
        torch_version = "absent"
    sections = stored_sections(config)
    names = [sections[s].get("name") for s in ("loss", "model", "data", "optimizer")
             if isinstance(sections.get(s), dict)]
    names += [m for m in str(metrics).split(",") if m]
    imports = [n for n in names if is_import_string(n)]
    packages = _plugin_packages(config, names)
    for name in imports:
        top = name.split(":", 1)[0].split(".", 1)[0]
        if top in ("__main__", "raysearch") or top in sys.stdlib_module_names:
            continue
        packages[top] = _package_version(top)
    return {"python": platform.python_version(), "raysearch": __version__,
            "torch": torch_version, "imports": imports, "packages": packages}


def _plugin_packages(config: dict[str, Any], names: list[Any]) -> dict[str, str]:
    """``{distribution: version}`` of the installed plug-ins behind a config's short names."""
    from raysearch.registry import BUILT_IN, is_import_string
    from raysearch.training.registries import registry

    kinds = {"loss": "losses", "model": "models", "data": "datasets", "optimizer": "optimizers"}
    pairs = [(kinds[s], config[s].get("name")) for s in kinds
             if isinstance(config.get(s), dict)]
    pairs += [("metrics", n) for n in names[len(pairs):]]
    out = {}
    for kind, name in pairs:
        if not isinstance(name, str) or is_import_string(name):
            continue
        try:
            source = registry(kind).source(name)
        except Exception:  # noqa: BLE001 (a registry that cannot be read here: nothing known)
            continue
        if source not in (BUILT_IN, "unknown") and " " in source:
            dist, version = source.rsplit(" ", 1)
            out[dist] = version
    return out


def _package_version(top: str) -> str:
    """The installed distribution's version of a top-level package, else its __version__."""
    import importlib
    import importlib.metadata

    from raysearch.registry import ensure_cwd_on_path

    ensure_cwd_on_path()
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    try:
        return str(getattr(importlib.import_module(top), "__version__", "unversioned"))
    except Exception:  # noqa: BLE001 (not importable here: the export still records it)
        return "unversioned"


def check_export_versions(doc: Any, say: Callable[[str], None]) -> None:
    """Say (one line each) where this environment differs from an export's ``requires``."""
    if not isinstance(doc, dict) or not isinstance(doc.get("requires"), dict):
        return
    wanted = doc["requires"]
    here = requirements(doc.get("config") or {}, ",".join(
        m for m in wanted.get("imports", []) if m not in _config_names(doc.get("config"))))
    for key in ("raysearch", "torch"):
        if wanted.get(key) and wanted[key] != here[key]:
            say(f"note: exported with {key} {wanted[key]}, this is {here[key]}: numbers may "
                "differ")
    for package, version in (wanted.get("packages") or {}).items():
        mine = here["packages"].get(package, _package_version(package))
        if version != mine:
            say(f"note: exported with {package} {version}, this is {mine}")


def _config_names(config: Any) -> set[str]:
    if not isinstance(config, dict):
        return set()
    return {str(v.get("name")) for v in config.values() if isinstance(v, dict)}


#: Top-level modules a model's environment never lists by themselves (pinned, or raysearch's).
_NOT_LISTED = ("__main__", "builtins", "raysearch", "torch", "numpy", "mlflow", "cloudpickle")


def model_environment(objects: Any) -> tuple[list[str], list[str], list[str]]:
    """What a pyfunc model made of `objects` needs where it is loaded.

    raysearch as it is installed (:func:`raysearch_requirement`), torch, MLflow, NumPy and
    cloudpickle at their versions here, and the package behind each object: an installed
    distribution by name and version (``mypkg==0.1.0``; ``mypkg @ file:///...`` where it was
    installed from a folder, a wheel file or a repository), ``torchvision`` for a
    ``torchvision:`` model, a plug-in's distribution for its registered name; a package that
    is no distribution (a folder next to the user) goes into the model as code
    (MLflow ``code_paths``). Objects of ``__main__`` travel by value in the model's pickle.

    Args:
        objects: the model's factory (a name, an import string or the callable) and the fitted
            calibrator (or None), in any number.

    Returns:
        ``(pip requirement lines, code paths (package folders or module files), notes)``, a
        note (one line each) where raysearch is pinned by version only or a package is
        neither installed nor importable here.
    """
    import cloudpickle
    import mlflow
    import numpy as np
    import torch

    line, note = raysearch_requirement()
    pip = [f"torch=={torch.__version__.split('+')[0]}", f"mlflow=={mlflow.__version__}",
           f"numpy=={np.__version__}", f"cloudpickle=={cloudpickle.__version__}", line]
    code: list[str] = []
    notes = [note] if note else []
    for top in dict.fromkeys(t for obj in objects for t in _top_modules(obj)):
        if top.startswith("dist:"):
            pip.append(_distribution_requirement(top[len("dist:"):]))
            continue
        wanted = _package_requirement(top)
        if wanted:
            pip.append(wanted)
        elif _module_path(top):
            code.append(_module_path(top))
        else:
            notes.append(f"note: the model imports {top}, which is neither installed nor "
                         "importable here: make it importable where the model is loaded")
    return list(dict.fromkeys(pip)), code, notes


def raysearch_requirement() -> tuple[str, str]:
    """The pip line of the raysearch this process runs, and a note where it is a bare version.

    A source tree (an editable install, or a checkout on ``sys.path``) gives
    ``raysearch @ file:///<its folder>``; an install from a folder, a wheel file or a
    repository gives its direct reference (PEP 610 ``direct_url.json``). Otherwise
    ``raysearch==<version>`` with a note: the name ``raysearch`` on PyPI belongs to an
    unrelated project.
    """
    import tomllib

    import raysearch

    root = Path(raysearch.__file__).resolve().parent.parent
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    if project.get("name") == "raysearch":
        return f"raysearch @ {root.as_uri()}", ""
    url = _direct_url("raysearch")
    if url:
        return f"raysearch @ {url}", ""
    version = raysearch.__version__
    return f"raysearch=={version}", (
        f"note: the model's requirements pin raysearch=={version}, but the name raysearch on "
        "PyPI belongs to an unrelated project: install this raysearch from its source where "
        "the model is loaded")


def _direct_url(dist: str) -> str:
    """The PEP 610 URL a distribution was installed from (``git+URL@commit`` for a VCS), or ""."""
    import importlib.metadata

    try:
        info = json.loads(importlib.metadata.distribution(dist).read_text("direct_url.json")
                          or "{}")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return ""
    url = str(info.get("url", ""))
    vcs = info.get("vcs_info")
    if url and isinstance(vcs, dict):
        commit = f"@{vcs['commit_id']}" if vcs.get("commit_id") else ""
        url = f"{vcs.get('vcs', 'git')}+{url}{commit}"
    return url


def _distribution_requirement(dist: str) -> str:
    """``dist @ URL`` where it was installed from one, else ``dist==version``."""
    import importlib.metadata

    url = _direct_url(dist)
    if url:
        return f"{dist} @ {url}"
    try:
        return f"{dist}=={importlib.metadata.version(dist)}"
    except importlib.metadata.PackageNotFoundError:
        return dist


def _package_requirement(top: str) -> str:
    """The requirement of the installed distribution holding top-level module `top`, or ""."""
    import importlib.metadata

    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
        return _distribution_requirement(dist)
    return ""


def _module_path(top: str) -> str:
    """The folder of package `top` (or its module file) as imported here, or ""."""
    import importlib
    import sys

    try:
        module = sys.modules.get(top) or importlib.import_module(top)
    except Exception:  # noqa: BLE001 (not importable here: the caller says so)
        return ""
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    path = os.path.abspath(path)
    return os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path


def _top_modules(obj: Any) -> list[str]:
    """Top-level modules behind a model name, import string or object (``dist:`` a plug-in's)."""
    import sys

    from raysearch.registry import BUILT_IN, is_import_string

    if obj is None:
        return []
    if isinstance(obj, str):
        if obj.startswith("torchvision:"):
            return ["torchvision"]
        if is_import_string(obj):
            top = obj.split(":", 1)[0].split(".", 1)[0]
        else:
            from raysearch.training.registries import registry

            try:
                source = registry("models").source(obj)
            except Exception:  # noqa: BLE001 (an unknown name: nothing to list)
                return []
            plugin = source not in (BUILT_IN, "unknown") and " " in source
            return [f"dist:{source.rsplit(' ', 1)[0]}"] if plugin else []
    else:
        func = getattr(obj, "func", obj)  # functools.partial
        module = getattr(func, "__module__", None) if callable(func) else None
        top = (module or type(obj).__module__ or "").split(".", 1)[0]
    if not top or top in _NOT_LISTED or top in sys.stdlib_module_names:
        return []
    return [top]
