"""The sweep's Optuna study, kept in an Optuna journal file outside the Ray driver.

A sweep's searcher (:class:`raysearch.tune.searchers.CompletedOnlyOptunaSearch`) writes every trial
it asks and tells to the Optuna study named after the sweep, in an Optuna journal file
(``optuna.storages.JournalStorage`` over a ``JournalFileBackend``; :func:`optuna_storage_url`):
beside a SQLite MLflow store (``optuna.log`` in the folder of ``mlruns.db``), else in the sweep's
Tune storage folder. The parent MLflow run holds the file's path (tag :data:`STORAGE_TAG`) and
the study's name (tag :data:`STUDY_TAG`), so that ``optuna-dashboard <path>`` shows the study
while the sweep runs and ``raysearch report NAME --importance`` (:func:`importance_lines`)
reads it afterwards.

A team's sweeps (an ``mlflow server`` on PostgreSQL, Tune's storage in S3) keep their studies
in a database of their own (``--optuna-storage postgresql://user@host/optuna``: an
``optuna.storages.RDBStorage``), so that ``--resume`` and ``report --importance`` work from any
machine that reaches the servers. The URL carries no password (it is recorded in the parent
run's tag and pickled with Tune's searcher): PostgreSQL's client takes it from ``PGPASSWORD``.

Why a journal and not SQLite: the searcher asks and tells in Tune's control loop, between one
trial's end and the next one's start on the same worker. With an SQLite ``RDBStorage`` an ask
with its suggestions cost ~21 ms and a tell ~4 ms (a commit each, and the TPE sampler reads the
trials back per parameter); the journal appends one line per operation and keeps the study in
memory: ~3.5 ms and ~0.3 ms (16 trials of 4 parameters, 2-core machine). Sweeps recorded with
an SQLite URL (``sqlite:///.../optuna.db``, raysearch before the journal) still open
(:func:`open_storage` takes both).

Through a Ray Client (``--address ray://...``) Tune runs the searcher on the head node, where
a file of this machine is not: the study then stays in the searcher's memory, as before, and
the sweep has no study tags. With a cluster's GCS address (``host:port``) the driver, hence the
searcher, is this process.

Resuming a sweep continues the same study: Tune pickles the searcher with its storage, and a
``JournalStorage`` unpickles by reading its file (an absolute path) again, so the restored
searcher tells the resumed trials to the study that holds the first run's.
Trials a killed driver asked after Tune's last snapshot end FAIL when the resumed sweep ends
(:func:`fail_stale_trials`).

Part of the tune layer; imports Optuna at import time, MLflow (through
:mod:`raysearch.tracking`) only inside :func:`importance_lines`.
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import optuna
import sqlalchemy.exc
from optuna.storages.journal import JournalFileBackend

from raysearch.tune.storage import is_uri

__all__ = ["STORAGE_FILE", "STORAGE_TAG", "STUDY_TAG", "check_new_study", "create_sweep_study",
           "fail_stale_trials", "importance_lines", "load_sweep_study", "open_storage",
           "optuna_storage_url", "param_importances"]

#: Parent-run tag holding the sweep's Optuna storage: a journal file's absolute path, or a
#: database URL without a password (``--optuna-storage``; an ``sqlite:///`` URL for sweeps of
#: an older raysearch).
STORAGE_TAG = "raysearch.optuna_storage"
#: Parent-run tag holding the name of the sweep's Optuna study (the sweep's name).
STUDY_TAG = "raysearch.optuna_study"
#: File name of the Optuna journal (one JSON line per operation on a study).
STORAGE_FILE = "optuna.log"
#: Seconds an SQLite write (a sweep recorded with an ``sqlite:///`` URL) waits for a reader.
SQLITE_TIMEOUT_S = 30.0
#: Seconds a connection to a PostgreSQL study database may take before it fails.
CONNECT_TIMEOUT_S = 10.0
#: Times a database storage is opened before its error is final (another driver may be
#: creating the same tables meanwhile).
CREATE_ATTEMPTS = 5


def optuna_storage_url(tracking_uri: str, storage_path: str, given: str | None = None) -> str:
    """Where the Optuna study of a sweep lives: a database URL, or a journal file's absolute path.

    - `given` (``--optuna-storage``): a URL with a scheme as it is (``postgresql://user@host/db``;
      refused if it holds a password), a path made absolute.
    - A SQLite MLflow store (``sqlite:////abs/path/mlruns.db``; a relative one is taken
      against the current directory): ``/abs/path/optuna.log``, in the same folder.
    - Any other store (an ``http(s)://`` tracking server, a database URI): ``optuna.log`` in the
      sweep's Tune storage folder (``<storage_path>/optuna.log``), or in the current directory
      when that storage is remote (``s3://``, ``gs://``, ...): the journal is a local file.

    Every sweep of a folder shares the file; each has its own study, named after the sweep.
    ``optuna-dashboard <path>`` opens it.

    Args:
        tracking_uri (str): the sweep's MLflow tracking URI.
        storage_path (str): the sweep's Tune storage path (a local folder or a URI).
        given (str | None): the sweep's ``optuna_storage`` setting; None: the defaults above.

    Returns:
        str: the URL, or an absolute path (ending in ``optuna.log`` by default).

    Raises:
        ValueError: if `given` is a URL holding a password (one line, the password masked).
    """
    if given:
        if "://" not in given:
            return str(Path(given).expanduser().resolve())
        parts = urlsplit(given)
        if parts.password is not None:
            masked = given.replace(f":{parts.password}@", ":***@", 1)
            raise ValueError(f"--optuna-storage {masked} holds a password: the sweep records "
                             "this URL in MLflow and in Tune's state; leave it out and set "
                             "PGPASSWORD (or the database's own client settings) instead")
        return given
    if tracking_uri.startswith("sqlite:///"):
        folder = (Path.cwd() / tracking_uri[len("sqlite:///"):]).resolve().parent
    elif storage_path.startswith("file://"):
        folder = Path(storage_path[len("file://"):]).resolve()
    elif is_uri(storage_path):
        folder = Path.cwd().resolve()
    else:
        folder = Path(storage_path).expanduser().resolve()
    return str(folder / STORAGE_FILE)


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """The Optuna storage at `url` (created if missing), for the driver's writes.

    A path (what :func:`optuna_storage_url` gives): an ``optuna.storages.JournalStorage`` over
    a ``JournalFileBackend`` (file locks, so ``optuna-dashboard`` may read it meanwhile). A URL
    with a scheme: an ``optuna.storages.RDBStorage``: ``postgresql://...`` (a team's database;
    a connection attempt gives up after :data:`CONNECT_TIMEOUT_S`), or ``sqlite:///.../optuna.db``
    (recorded by sweeps of an older raysearch), where SQLite waits up to :data:`SQLITE_TIMEOUT_S`
    for a lock held by a reader. Either pickles with its location and reads it again when
    unpickled (how Tune saves and restores a searcher).

    Two drivers that open a fresh database at the same moment both create Optuna's tables (and
    its schema version), and the one that loses a race to a table gets an error of the
    database: it opens the storage again, up to :data:`CREATE_ATTEMPTS` times a second apart.

    Raises:
        ValueError: if the storage cannot be opened or created (one line naming `url`).
    """
    if "://" not in url:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.JournalStorage(JournalFileBackend(url))
        except Exception as exc:  # noqa: BLE001 (the file system's errors)
            raise _unusable(url, exc) from None
    for attempt in range(1, CREATE_ATTEMPTS + 1):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:
            if attempt == CREATE_ATTEMPTS:  # not (only) another driver creating the tables
                raise _unusable(url, exc) from None
            time.sleep(1.0)
        except Exception as exc:  # noqa: BLE001 (SQLAlchemy's and the driver's errors)
            raise _unusable(url, exc) from None
    raise AssertionError("unreachable")  # the loop returns or raises


def _unusable(url: str, exc: Exception) -> ValueError:
    """The one-line error of a storage that cannot be opened."""
    return ValueError(f"cannot open the Optuna storage {url}: {' '.join(str(exc).split())[:200]}")


def _engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine arguments of an Optuna database at `url` (by its dialect)."""
    if url.startswith("sqlite"):
        return {"connect_args": {"timeout": SQLITE_TIMEOUT_S}}
    if url.startswith("postgresql"):
        return {"connect_args": {"connect_timeout": int(CONNECT_TIMEOUT_S)},
                "pool_pre_ping": True}
    return {"pool_pre_ping": True}


def check_new_study(url: str, name: str) -> None:
    """Refuse a sweep name whose study the storage at `url` already holds.

    Two experiments of one MLflow store may hold sweeps of the same name; their trials would
    be mixed in one study.

    Raises:
        ValueError: one line naming the study and the storage, or if it cannot be opened.
    """
    if "://" not in url and not Path(url).is_file():
        return  # no journal yet: no study of any name (and nothing is created here)
    try:
        open_storage(url).get_study_id_from_name(name)
    except KeyError:
        return
    raise ValueError(f"the Optuna storage {url} already holds a study named '{name}' (a sweep "
                     "of that name in another experiment?): choose another --name")


def create_sweep_study(url: str, name: str, metric: str | list[str],
                       mode: str | list[str]) -> optuna.storages.BaseStorage:
    """Create the study of sweep `name` at `url` and return the storage for ``OptunaSearch``.

    The study gets the searcher's directions and its metric names (``val_accuracy``,
    ``val_ece``: what ``optuna-dashboard`` and :func:`importance_lines` label the objectives
    with); ``OptunaSearch(study_name=name, storage=...)`` then loads it.

    Args:
        url (str): the storage's location (:func:`optuna_storage_url`).
        name (str): the sweep's name, the study's.
        metric (str | list[str]): the searcher's metric, or one per objective.
        mode (str | list[str]): ``"min"`` or ``"max"``, or one per objective.

    Returns:
        optuna.storages.BaseStorage: the storage (:func:`open_storage`).

    Raises:
        ValueError: if the study exists already (:func:`check_new_study`) or the storage cannot
            be opened.
    """
    if "://" not in url:  # the journal's folder (a storage path Tune has not made yet)
        Path(url).parent.mkdir(parents=True, exist_ok=True)
    metrics = [metric] if isinstance(metric, str) else list(metric)
    modes = [mode] if isinstance(mode, str) else list(mode)
    check_new_study(url, name)
    storage = open_storage(url)
    study = optuna.create_study(storage=storage, study_name=name,
                                directions=["minimize" if m == "min" else "maximize"
                                            for m in modes])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(metrics)
    return storage


def param_importances(study: optuna.Study) -> dict[str, dict[str, float]]:
    """The fANOVA importances of the study's parameters, per objective.

    ``optuna.importance.FanovaImportanceEvaluator(seed=0)`` (Hutter et al. 2014, "An Efficient
    Approach for Assessing Hyperparameter Importance", ICML): the fraction of the variance of
    an objective, over a random forest fitted to the complete trials, that each parameter
    explains alone; per objective the importances sum to 1. A parameter that only some trials
    have (a conditional space's per-method parameters) is left out.

    Args:
        study (optuna.Study): a study with at least 2 complete trials.

    Returns:
        dict[str, dict[str, float]]: ``{objective name: {parameter: importance in [0, 1]}}``,
        objectives in the study's order (named by its metric names, else ``objective <i>``),
        parameters by decreasing importance.

    Raises:
        ValueError: if the study has fewer than 2 complete trials.
    """
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if len(complete) < 2:
        raise ValueError(f"the Optuna study '{study.study_name}' has {len(complete)} complete "
                         "trials; parameter importances need at least 2")
    names = study.metric_names or [f"objective {i}" for i in range(len(study.directions))]
    multi = len(study.directions) > 1
    out: dict[str, dict[str, float]] = {}
    for i, objective in enumerate(names):
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        target = (lambda t, i=i: t.values[i]) if multi else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            out[objective] = optuna.importance.get_param_importances(
                study, evaluator=evaluator, target=target)
    return out


def load_sweep_study(parent: Any) -> optuna.Study:
    """The Optuna study of the sweep whose parent MLflow run is `parent` (from its tags).

    Raises:
        ValueError: if the run has no :data:`STORAGE_TAG` (a sweep of an older raysearch, or
            one run through a Ray Client), its
            file is missing or it holds no such study.
    """
    tags = parent.data.tags
    name = tags.get(STUDY_TAG) or tags.get("raysearch.sweep", "")
    url = tags.get(STORAGE_TAG)
    if not url:
        raise ValueError(f"sweep '{name}' has no Optuna study recorded (no {STORAGE_TAG} tag: "
                         "it was started by an older raysearch or through a Ray Client)")
    file = url[len("sqlite:///"):] if url.startswith("sqlite:///") else url
    if "://" not in file and not Path(file).is_file():
        raise ValueError(f"the Optuna storage of sweep '{name}' is missing: no file {file}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=name, storage=open_storage(url))
    except KeyError:
        raise ValueError(f"the Optuna storage {url} holds no study named '{name}' (was "
                         f"{STORAGE_FILE} moved or deleted?)") from None


def fail_stale_trials(parent: Any) -> int:
    """End as FAIL the RUNNING trials of a resumed sweep's study once all its trials ended.

    A driver killed between two of Tune's snapshots leaves trials its searcher had asked but
    the restored searcher does not know (Tune runs new trials in their place); they would stay
    RUNNING in the study forever. Call it only when the sweep's trials have all ended.

    Args:
        parent: the sweep's parent MLflow run (a run without :data:`STORAGE_TAG` is skipped).

    Returns:
        int: how many trials were ended.
    """
    if STORAGE_TAG not in parent.data.tags:
        return 0
    study = load_sweep_study(parent)
    storage = open_storage(parent.data.tags[STORAGE_TAG])
    study_id = storage.get_study_id_from_name(study.study_name)
    stale = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    for trial in stale:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
    return len(stale)


def importance_lines(name: str, *, tracking_uri: str | None = None,
                     experiment: str = "raysearch") -> list[str]:
    """The fANOVA importance table of sweep `name` (``raysearch report NAME --importance``).

    One row per searched parameter, one column per objective (:func:`param_importances`),
    read from the study the parent run's tags point to.

    Args:
        name: the sweep's name.
        tracking_uri: its MLflow store (default: ``$MLFLOW_TRACKING_URI`` or
            ``sqlite:///<cwd>/mlruns.db``).
        experiment: its experiment.

    Returns:
        The lines: a heading naming the study and its storage, the column header, the rows.

    Raises:
        ValueError: if the sweep is unknown, has no study (an older sweep) or fewer than 2
            complete trials.
    """
    from raysearch.tracking import find_sweep, get_client
    from raysearch.tracking.reports import quiet_mlflow

    quiet_mlflow()
    client, _ = get_client(tracking_uri)
    parent = find_sweep(client, name, experiment)
    study = load_sweep_study(parent)
    table = param_importances(study)
    objectives = list(table)
    params = list(table[objectives[0]])
    n = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)))
    width = max(len("parameter"), *(len(p) for p in params)) if params else len("parameter")
    lines = [f"sweep {name}: fANOVA importances over {n} complete trials (Optuna study "
             f"'{study.study_name}' in {parent.data.tags[STORAGE_TAG]})",
             "  ".join([f"{'parameter':<{width}}", *(f"{o:>14}" for o in objectives)])]
    for p in params:
        lines.append("  ".join([f"{p:<{width}}",
                                *(f"{table[o].get(p, 0.0):>14.3f}" for o in objectives)]))
    return lines
