"""MLflow tracking of sweeps: one parent run per sweep, one child run per trial.

All MLflow writes happen in the driver process, through :class:`MlflowSweepCallback` (a Ray Tune
callback) and :class:`MlflowClient`; trial workers never talk to MLflow. The store and the
experiment are created by the driver before any trial starts (two processes creating a fresh
SQLite store at once race on its migrations).

The code lives in submodules by family, each importing only those before it in this list (none
imports this package, which re-exports every name of the former single module, private ones
included):

- :mod:`raysearch.tracking.client`: the client and experiment of a store, the params of a run,
  the batched writes (params, metrics, epochs, dataset, reliability diagram);
- :mod:`raysearch.tracking.book`: a sweep's child-run bookkeeping and its writer thread;
- :mod:`raysearch.tracking.sweeps`: a sweep read back (its runs, trials table, configuration
  summaries, the selection on the table, a trial's stored outputs);
- :mod:`raysearch.tracking.export`: :func:`finalize_sweep` and the exported best config;
- :mod:`raysearch.tracking.callback`: :class:`MlflowSweepCallback` and :class:`SweepCallback`;
- :mod:`raysearch.tracking.train`: :func:`train_and_log` and :func:`log_calibration_run`.
"""

from __future__ import annotations

# ruff: noqa: F401
# Every name of the former single module stays importable from here: what it defined (public and
# private, now in the submodules) and what it imported.
import contextlib
import json
import logging
import math
import queue
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.tracking import MlflowClient
from ray import tune

from raysearch.config import SELECTIONS, RunConfig
from raysearch.metrics.selection import selection_table
from raysearch.tracking.book import _BOOKS as _BOOKS
from raysearch.tracking.book import _BOOKS_LOCK as _BOOKS_LOCK
from raysearch.tracking.book import _book_for as _book_for
from raysearch.tracking.book import _SweepBook as _SweepBook
from raysearch.tracking.callback import MlflowSweepCallback as MlflowSweepCallback
from raysearch.tracking.callback import SweepCallback as SweepCallback
from raysearch.tracking.callback import _jsonable as _jsonable
from raysearch.tracking.callback import _last_step as _last_step
from raysearch.tracking.callback import _short as _short
from raysearch.tracking.callback import _short_name as _short_name
from raysearch.tracking.callback import _trial_error as _trial_error
from raysearch.tracking.client import _PARAM_CHARS as _PARAM_CHARS
from raysearch.tracking.client import _RUN_DEFAULTS as _RUN_DEFAULTS
from raysearch.tracking.client import _SHA_CACHE as _SHA_CACHE
from raysearch.tracking.client import _numeric_metrics as _numeric_metrics
from raysearch.tracking.client import _param_text as _param_text
from raysearch.tracking.client import _split_labels as _split_labels
from raysearch.tracking.client import _weights_sha256 as _weights_sha256
from raysearch.tracking.client import dataset_record as dataset_record
from raysearch.tracking.client import ensure_experiment as ensure_experiment
from raysearch.tracking.client import get_client as get_client
from raysearch.tracking.client import log_dataset as log_dataset
from raysearch.tracking.client import log_epochs as log_epochs
from raysearch.tracking.client import log_metrics as log_metrics
from raysearch.tracking.client import log_params as log_params
from raysearch.tracking.client import log_reliability as log_reliability
from raysearch.tracking.client import run_params as run_params
from raysearch.tracking.export import _config_names as _config_names
from raysearch.tracking.export import _ended_after as _ended_after
from raysearch.tracking.export import _package_version as _package_version
from raysearch.tracking.export import _plugin_packages as _plugin_packages
from raysearch.tracking.export import best_config_document as best_config_document
from raysearch.tracking.export import check_export_versions as check_export_versions
from raysearch.tracking.export import finalize_sweep as finalize_sweep
from raysearch.tracking.export import requirements as requirements
from raysearch.tracking.runs import (
    COMPLETE_TAG,
    CONFIG_TAG,
    CONFIGURATION_TAG,
    DEFAULT_EXPERIMENT,
    ERROR_TAG,
    EXPERIMENT_KIND,
    EXPERIMENT_KIND_TAG,
    METRIC_PREFIXES,
    NODE_KEY,
    NODE_TAG,
    OUTCOME_TAG,
    PARENT_TAG,
    REPEATS_TAG,
    RESUMED_TAG,
    RETRIES_TAG,
    SEALED_OUTCOMES,
    SEEDS_TAG,
    SWEEP_TAG,
    TRIAL_TAG,
    check_tracking_uri,
    default_tracking_uri,
    find_sweep,
    list_sweeps,
    resolve_tracking_uri,
)
from raysearch.tracking.sweeps import _SPOILING_OUTCOMES as _SPOILING_OUTCOMES
from raysearch.tracking.sweeps import _coerce as _coerce
from raysearch.tracking.sweeps import annotate_selection as annotate_selection
from raysearch.tracking.sweeps import child_runs as child_runs
from raysearch.tracking.sweeps import load_sweep as load_sweep
from raysearch.tracking.sweeps import seed_trials as seed_trials
from raysearch.tracking.sweeps import summarize_configuration as summarize_configuration
from raysearch.tracking.sweeps import sweep_runs as sweep_runs
from raysearch.tracking.sweeps import sweep_trials as sweep_trials
from raysearch.tracking.sweeps import trial_outputs as trial_outputs
from raysearch.tracking.sweeps import write_parquet as write_parquet
from raysearch.tracking.train import log_calibration_run as log_calibration_run
from raysearch.tracking.train import train_and_log as train_and_log
from raysearch.training import plots
from raysearch.training.records import (
    ARTIFACT_FILES,
    COMPLETED,
    CONFIG_ID_KEY,
    DIVERGED,
    EPOCH_HISTORY,
    LOGITS_FILE,
    RELIABILITY,
    RELIABILITY_PLOT,
    RESUMED_FROM,
    SEED_INDEX_KEY,
)

logger = logging.getLogger(__name__)
