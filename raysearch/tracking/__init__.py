"""MLflow tracking of sweeps: one parent run per sweep, one child run per trial.

All MLflow writes happen in the driver process, through :class:`MlflowSweepCallback` (a Ray Tune
callback) and :class:`MlflowClient`; trial workers never talk to MLflow. The store and the
experiment are created by the driver before any trial starts (two processes creating a fresh
SQLite store at once race on its migrations).

The code lives in submodules by family, each importing only those before it in this list (none
imports this package, which offers their public names):

- :mod:`raysearch.tracking.client`: the client and experiment of a store, the params of a run,
  the batched writes (params, metrics, epochs, dataset, reliability diagram);
- :mod:`raysearch.tracking.reconcile`: a trial's child run reconciled with Ray Tune's records
  of it (what ``raysearch sync`` writes);
- :mod:`raysearch.tracking.sweeps`: a sweep read back (its runs, trials table, configuration
  summaries, the selection on the table, a trial's stored outputs);
- :mod:`raysearch.tracking.live_table`: the trials table a sweep's callback keeps as its trials
  end (what the end of the sweep selects on, without reading the runs back);
- :mod:`raysearch.tracking.book`: a sweep's child-run bookkeeping and its writer thread;
- :mod:`raysearch.tracking.pareto_html`: a sweep's interactive Pareto front (``pareto.html``);
- :mod:`raysearch.tracking.export`: :func:`finalize_sweep` and the exported best config;
- :mod:`raysearch.tracking.trial_text`: how a trial is shown (params, config, short names);
- :mod:`raysearch.tracking.searched`: the values a sweep searched, for its summaries;
- :mod:`raysearch.tracking.progress`: a trial's number and progress line;
- :mod:`raysearch.tracking.callback`: :class:`MlflowSweepCallback`, the sweep's record;
- :mod:`raysearch.tracking.own_sweep`: :class:`SweepCallback`, the same for a trainable of
  the user's own;
- :mod:`raysearch.tracking.train`: :func:`train_and_log` and :func:`log_calibration_run`;
- :mod:`raysearch.tracking.pyfunc`: a selected trial as an MLflow pyfunc model (weights and
  calibrator), saved or registered.

Every name is imported on first use (PEP 562 ``__getattr__``): ``import raysearch.tracking.runs``
or ``raysearch.tracking.ui`` loads neither Ray nor pandas, and ``raysearch.tracking.X`` loads
only the submodule that defines ``X``.

**Layer.** Tracking sits above training and the science (it imports :mod:`raysearch.config`,
:mod:`raysearch.metrics`, :mod:`raysearch.calibration` and :mod:`raysearch.training`) and below
the tune and interface layers, which import it. It is the only layer that imports MLflow.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Where each public name of this package comes from: ``{submodule: names}``.
_FROM: dict[str, tuple[str, ...]] = {
    'raysearch.tracking.callback': (
        'MlflowSweepCallback',
    ),
    'raysearch.tracking.own_sweep': (
        'SweepCallback',
    ),
    'raysearch.tracking.client': (
        'dataset_record', 'ensure_experiment',
        'get_client', 'log_dataset', 'log_epochs', 'log_metrics', 'log_params',
        'log_reliability', 'run_params',
    ),
    'raysearch.tracking.export': (
        'FAULT_ENV', 'best_config_document', 'check_export_versions', 'fault_point',
        'finalize_sweep', 'requirements',
    ),
    'raysearch.tracking.runs': (
        'COMPLETE_TAG', 'CONFIGURATION_TAG', 'CONFIG_TAG', 'DEFAULT_EXPERIMENT',
        'DRIVER_TAG', 'ERROR_TAG', 'EXPERIMENT_KIND', 'EXPERIMENT_KIND_TAG', 'METRIC_PREFIXES',
        'NODE_KEY', 'NODE_TAG', 'OUTCOME_TAG', 'PARENT_TAG', 'REPEATS_TAG', 'RESUMED_TAG',
        'RECORDED_TAG', 'RETRIES_TAG', 'SEALED_OUTCOMES', 'SKIPPED_TAG', 'SEEDS_TAG',
        'SWEEP_TAG', 'TABLE_TAG', 'TRIAL_TAG',
        'check_tracking_uri', 'default_tracking_uri', 'find_sweep', 'list_sweeps',
        'resolve_tracking_uri',
    ),
    'raysearch.tracking.pareto_html': (
        'ERROR_KEYS', 'metric_pairs', 'pareto_html',
    ),
    'raysearch.tracking.pyfunc': (
        'CalibratedClassifier', 'register_calibrated_model', 'save_calibrated_model',
    ),
    'raysearch.tracking.reconcile': (
        'STORE_ERRORS', 'Reconciled', 'SweepRuns', 'TrialRecords', 'error_line',
        'reconcile_trial',
    ),
    'raysearch.tracking.sweeps': (
        'annotate_selection', 'child_runs', 'load_sweep',
        'seed_trials', 'stored_trials', 'summarize_configuration', 'sweep_runs',
        'sweep_trials', 'trial_outputs', 'write_parquet',
    ),
    'raysearch.tracking.trial_text': (
        'describe',
    ),
    'raysearch.tracking.train': (
        'log_calibration_run', 'train_and_log',
    ),
}
_WHERE = {name: module for module, names in _FROM.items() for name in names}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
