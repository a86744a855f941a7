"""A corpus of bad inputs to the real command: each one exits 2 with one line naming the problem.

Every case runs ``raysearch`` in-process on files written in their real on-disk formats and
checks that nothing was left half-written: no MLflow run in the tracking store, no Tune storage
folder, no calibration output folder. Extends tests/test_cli_errors.py.
"""

from __future__ import annotations

import io
import pickle
import socket
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from formats import write_cifar10, write_image_tree

from raysearch.cli.commands import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed once the block ends: nothing listens there


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


# Each builder writes its bad input into tmp_path and returns (args, needles). The sweep, train,
# report, export and calibrate arguments get --tracking-uri (and --storage-path or --output-dir)
# pointing into tmp_path from the test below.

def _space_syntax(tmp):
    bad = _write(tmp / "syntax.yaml", "method: acls\nparams:\n  margin: 'unterminated\n")
    return ["sweep", str(bad)], ["syntax.yaml"]


def _space_unknown_top_key(tmp):
    bad = _write(tmp / "key.yaml", "method: acls\nparmas:\n  margin: {low: 1.0, high: 10.0}\n")
    return ["sweep", str(bad)], ["parmas", "(did you mean params?)"]


def _space_unknown_train_key(tmp):
    bad = _write(tmp / "train.yaml", "method: ce\ntrain:\n  epoch: 3\n")
    return ["sweep", str(bad)], ["train.epoch", "(did you mean epochs?)"]


def _space_low_high_dry_run(tmp):
    bad = _write(tmp / "lohi.yaml", "method: acls\nparams:\n  margin: {low: 10.0, high: 6.0}\n")
    return ["sweep", str(bad), "--dry-run"], ["lohi.yaml", "margin"]


def _space_wrong_type(tmp):
    bad = _write(tmp / "type.yaml", "method: acls\nparams:\n  margin: {low: ten, high: 6.0}\n")
    return ["sweep", str(bad)], ["margin", "ten"]


def _space_empty(tmp):
    bad = _write(tmp / "empty.yaml", "")
    return ["sweep", str(bad)], ["empty.yaml"]


def _space_negative_epochs(tmp):
    bad = _write(tmp / "epochs.yaml", "method: ce\ntrain:\n  epochs: -5\n")
    return ["sweep", str(bad)], ["epochs"]


def _space_method_typo(tmp):
    bad = _write(tmp / "typo.yaml", "method: acsl\n")
    return ["sweep", str(bad)], ["acsl", "did you mean", "acls"]


def _negative_epochs_option(tmp):
    return ["sweep", "ce", "--epochs", "-3"], ["epochs", "-3"]


def _negative_epochs_dry_run(tmp):
    return ["sweep", "ce", "--epochs", "-1", "--dry-run"], ["epochs", "-1"]


def _model_typo(tmp):
    return ["sweep", "ce", "--model", "resnt20"], ["resnt20", "did you mean", "resnet20"]


def _dataset_typo(tmp):
    return ["sweep", "ce", "--dataset", "cifar1"], ["cifar1", "did you mean", "cifar10"]


def _cifar_no_data_dir(tmp):
    return ["sweep", "ce", "--dataset", "cifar10"], ["cifar10", "--data-dir"]


def _cifar_no_data_dir_dry_run(tmp):
    return ["sweep", "ce", "--dataset", "cifar10", "--dry-run"], ["cifar10", "--data-dir"]


def _cifar_missing_batches(tmp):
    root = tmp / "cifar"
    write_cifar10(root, per_batch=4, n_test=10)
    for b in (2, 3, 4, 5):
        (root / "cifar-10-batches-py" / f"data_batch_{b}").unlink()
    return ["sweep", "ce", "--dataset", "cifar10", "--data-dir", str(root)], ["data_batch_2"]


def _cifar_truncated_batch(tmp):
    root = tmp / "cifar"
    write_cifar10(root, per_batch=4, n_test=10)
    batch = root / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:200])
    return ["sweep", "ce", "--dataset", "cifar10", "--data-dir", str(root)], ["data_batch_3"]


def _voc_wrong_layout(tmp):
    root = tmp / "voc"
    (root / "VOCdevkit" / "VOC2012" / "JPEGImages").mkdir(parents=True)  # no masks, no lists
    return (["sweep", "ce", "--dataset", "voc", "--model", "fcn_resnet50", "--data-dir",
             str(root)], ["voc"])


def _imagefolder_no_classes(tmp):
    root = tmp / "images"
    write_image_tree(root / "scratch", classes=("cat",), per_class=2)
    for sub in ("train", "val"):
        (root / sub).mkdir()
        (root / sub / "loose.txt").write_text("not a class folder\n")
    return ["sweep", "ce", "--dataset", "imagefolder", "--data-dir", str(root)], ["class"]


def _calibrate_npz_garbage(tmp):
    bad = tmp / "garbage.npz"
    bad.write_bytes(b"this is not a zip archive" * 10)
    return ["calibrate", str(bad)], ["garbage.npz", "not a .npz archive"]


def _calibrate_npz_truncated(tmp):
    rng = np.random.default_rng(0)
    good = _npz(tmp / "cut.npz", logits=rng.normal(size=(40, 3)), labels=np.arange(40) % 3)
    good.write_bytes(good.read_bytes()[:300])
    return ["calibrate", str(good)], ["cut.npz", "not a .npz archive"]


def _calibrate_npz_bad_crc(tmp):
    rng = np.random.default_rng(0)
    bad = tmp / "crc.npz"
    np.savez_compressed(bad, logits=rng.normal(size=(400, 3)), labels=np.arange(400) % 3)
    data = bytearray(bad.read_bytes())
    middle = len(data) // 2  # inside the compressed logits member; the zip directory is intact
    data[middle:middle + 8] = bytes(8)
    bad.write_bytes(bytes(data))
    return ["calibrate", str(bad)], ["crc.npz", "CRC"]


def _calibrate_parquet_garbage(tmp):
    bad = tmp / "garbage.parquet"
    bad.write_bytes(b"PAR1" + b"\x00garbage" * 20)
    return ["calibrate", str(bad)], ["garbage.parquet"]


def _calibrate_pickle_refused(tmp):
    bad = tmp / "probs.pkl"
    buf = io.BytesIO()
    pickle.dump((np.zeros((6, 3)), np.zeros(6, dtype=int)), buf)
    bad.write_bytes(buf.getvalue())
    return ["calibrate", str(bad)], ["--allow-pickle"]


def _calibrate_mismatched_n(tmp):
    rng = np.random.default_rng(0)
    bad = _npz(tmp / "mismatch.npz", logits=rng.normal(size=(40, 3)), labels=np.arange(39) % 3)
    return ["calibrate", str(bad)], ["40", "39"]


def _calibrate_unknown_calibrator(tmp):
    rng = np.random.default_rng(0)
    good = _npz(tmp / "ok.npz", logits=rng.normal(size=(60, 3)), labels=np.arange(60) % 3)
    return ["calibrate", str(good), "--methods", "ts,tss"], ["tss", "(did you mean ", "ts_sbece"]


def _train_corrupt_export(tmp):
    cfg = _write(tmp / "best.yaml",
                 "sweep: s1\nrun_id: abc\nconfig:\n  method: acls\n  loss_params: {margin: [1,\n")
    return ["train", str(cfg)], ["best.yaml", "malformed YAML"]


def _train_unknown_key(tmp):
    cfg = _write(tmp / "best.yaml", "config:\n  method: acls\n  epoch: 3\n")
    return ["train", str(cfg)], ["best.yaml", "epoch"]


def _train_export_aliases(tmp):
    cfg = _write(tmp / "best.yaml", "config:\n  method: ce\n  model:\n    name: mlp\n"
                 "    a: &a [lol, lol]\n    b: [*a, *a]\n")
    return ["train", str(cfg)], ["best.yaml: line 6", "YAML aliases (*a) are not allowed"]


def _resume_missing(tmp):
    return ["sweep", "--resume", "does-not-exist"], ["does-not-exist"]


def _report_missing(tmp):
    return ["report", "no-such-sweep"], ["no-such-sweep"]


def _export_missing(tmp):
    return ["export", "no-such-sweep", "-o", str(tmp / "best.yaml")], ["no-such-sweep"]


def _sync_missing(tmp):
    return ["sync", "no-such-sweep"], ["no-such-sweep"]


def _storage_under_file(tmp):
    blocker = _write(tmp / "blocker", "a regular file\n")
    return ["sweep", "ce", "--storage-path", str(blocker / "ray")], ["blocker"]


def _optuna_storage_with_password(tmp):
    url = "postgresql://alice:s3cret@127.0.0.1:5432/optuna"
    return ["sweep", "ce", "--optuna-storage", url], [
        "--optuna-storage postgresql://alice:***@127.0.0.1:5432/optuna holds a password",
        "PGPASSWORD"]


def _optuna_storage_unreachable(tmp):
    url = f"postgresql://alice@127.0.0.1:{_free_port()}/optuna"
    return ["sweep", "ce", "--optuna-storage", url], [f"cannot open the Optuna storage {url}"]


def _model_param_without_value(tmp):
    return ["sweep", "ce", "--model-param", "hidden", "--dry-run"], ["--model-param", "hidden"]


CASES = [
    _space_syntax, _space_unknown_top_key, _space_unknown_train_key, _space_low_high_dry_run,
    _space_wrong_type, _space_empty, _space_negative_epochs, _space_method_typo,
    _negative_epochs_option, _negative_epochs_dry_run, _model_typo, _dataset_typo,
    _cifar_no_data_dir, _cifar_no_data_dir_dry_run, _cifar_missing_batches,
    _cifar_truncated_batch, _voc_wrong_layout, _imagefolder_no_classes, _calibrate_npz_garbage,
    _calibrate_npz_truncated, _calibrate_npz_bad_crc, _calibrate_parquet_garbage,
    _calibrate_pickle_refused,
    _calibrate_mismatched_n, _calibrate_unknown_calibrator, _train_corrupt_export,
    _train_unknown_key, _train_export_aliases, _resume_missing, _report_missing, _export_missing,
    _storage_under_file,
    _model_param_without_value, _sync_missing, _optuna_storage_with_password,
    _optuna_storage_unreachable,
]


def _runs_in(db: Path) -> int:
    """Runs in an MLflow SQLite store (0 when the file or its tables were never created)."""
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        tables = {row[0] for row in con.execute("SELECT name FROM sqlite_master")}
        return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] if "runs" in tables else 0


def _assert_clean_failure(result, needles) -> None:
    out = result.output
    assert result.exit_code == 2, (result.exit_code, out, result.exception)
    assert "Traceback" not in out
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines
    assert lines[0][len("error: "):].strip(), lines
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "s3cret" not in out + result.stderr  # a password is never echoed


@pytest.mark.parametrize("build", CASES, ids=[c.__name__.lstrip("_") for c in CASES])
def test_bad_input_fails_cleanly(build, tmp_path):
    args, needles = build(tmp_path)
    db, storage, out_dir = tmp_path / "mlruns.db", tmp_path / "ray", tmp_path / "calib-out"
    command = args[0]
    if command in ("sweep", "train", "report", "export", "calibrate", "sync"):
        args += ["--tracking-uri", f"sqlite:///{db}"]
    if command == "sweep" and "--storage-path" not in args:
        args += ["--storage-path", str(storage)]
    if command == "calibrate":
        args += ["--output-dir", str(out_dir)]
    result = CliRunner().invoke(main, args)
    _assert_clean_failure(result, needles)
    assert _runs_in(db) == 0, "an MLflow run was left behind"
    assert not storage.exists(), "a Tune storage folder was left behind"
    assert not out_dir.exists(), "a calibration output folder was left behind"
    assert not (tmp_path / "best.yaml").exists() or command == "train"


@pytest.mark.parametrize("command", [["report", "s1"], ["export", "s1"], ["train", "CFG"],
                                     ["calibrate", "NPZ"], ["sync", "s1"]])
def test_unreachable_tracking_server_fails_fast(command, tmp_path):
    """An MLflow server nobody answers at: one line naming it, within seconds, nothing written.

    The sweep command's case is in tests/test_cli_errors.py.
    """
    cfg = _write(tmp_path / "c.yaml", "config:\n  method: ce\n  epochs: 1\n")
    rng = np.random.default_rng(0)
    npz = _npz(tmp_path / "ok.npz", logits=rng.normal(size=(60, 3)), labels=np.arange(60) % 3)
    args = [{"CFG": str(cfg), "NPZ": str(npz)}.get(a, a) for a in command]
    if command[0] == "export":
        args += ["-o", str(tmp_path / "best.yaml")]
    if command[0] == "calibrate":
        args += ["--output-dir", str(tmp_path / "calib-out")]
    port = _free_port()
    start = time.monotonic()
    result = CliRunner().invoke(main, [*args, "--tracking-uri", f"http://127.0.0.1:{port}"])
    elapsed = time.monotonic() - start
    _assert_clean_failure(result, [str(port)])
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert not (tmp_path / "best.yaml").exists()
    assert not (tmp_path / "calib-out").exists(), "calibration output written before the check"


# -- the user's code breaking its contract (issue 39): a package `contractpkg` written into
# tmp_path, run from there as a user would; each is refused before Ray starts, nothing written

_CONTRACT_PKG = '''
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from raysearch import DatasetSplits


class PerSample(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets, reduction="none")


class Detached(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits.detach(), targets)


def top1_torch(probs, labels):
    return (probs.argmax(dim=1) == labels).float().mean()


def always_nan(probs, labels):
    return float("nan")


class Halves:
    def fit(self, logits, labels):
        return self

    def predict_proba(self, logits):
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return 0.5 * e / e.sum(axis=1, keepdims=True)


def _rows(n, bad=0):
    x = torch.randn(n, 4)
    x.view(-1)[:bad] = float("nan")
    return TensorDataset(x, torch.arange(n) % 2)


def nan_rows(data_dir, seed, val_fraction):
    return DatasetSplits(train=_rows(40, bad=12), val=_rows(10), test=_rows(10), num_classes=2)


class Files(Dataset):
    def __len__(self):
        return 100

    def __getitem__(self, i):
        x = torch.zeros(4)
        x[0] = float("inf") if i == 99 else 0.0
        return x, i % 2


def inf_files(data_dir, seed, val_fraction):
    return DatasetSplits(train=_rows(40), val=_rows(10), test=Files(), num_classes=2)


def net(num_classes, input_shape):
    return nn.Linear(4, num_classes)
'''


def _contract_space(tmp, loss):
    return _write(tmp / "space.yaml", f"method: contractpkg.parts:{loss}\ntrain:\n  epochs: 1\n")


def _loss_per_sample(tmp):
    return (["sweep", str(_contract_space(tmp, "PerSample"))],
            ["loss 'contractpkg.parts:PerSample' returned a tensor of shape (2,), expected a "
             "scalar (the batch mean)"])


def _loss_detached_dry_run(tmp):
    return (["sweep", str(_contract_space(tmp, "Detached")), "--dry-run"],
            ["loss 'contractpkg.parts:Detached'", "does not depend on the logits"])


def _metric_needs_tensors(tmp):
    return (["sweep", "ce", "--metric", "contractpkg.parts:top1_torch"],
            ["metric 'contractpkg.parts:top1_torch' raised TypeError", "NumPy arrays"])


def _metric_returns_nan(tmp):
    return (["sweep", "ce", "--metric", "contractpkg.parts:always_nan"],
            ["metric 'contractpkg.parts:always_nan' returned nan", "expected a finite float"])


def _calibrator_rows_not_summing_to_one(tmp):
    return (["sweep", "ce", "--posthoc", "ts,contractpkg.parts:Halves"],
            ["calibrator 'contractpkg.parts:Halves'", "rows that do not sum to 1"])


def _dataset_nan_inputs(tmp):
    return (["sweep", "ce", "--dataset", "contractpkg.parts:nan_rows", "--model",
             "contractpkg.parts:net"],
            ["dataset 'contractpkg.parts:nan_rows' train split: 12 non-finite input values "
             "(NaN or inf)"])


def _dataset_inf_in_files_dry_run(tmp):
    return (["sweep", "ce", "--dataset", "contractpkg.parts:inf_files", "--model",
             "contractpkg.parts:net", "--dry-run"],
            ["dataset 'contractpkg.parts:inf_files' test split: 1 non-finite input value "
             "(NaN or inf) in its first and last 32 items"])


CONTRACT_CASES = [
    _loss_per_sample, _loss_detached_dry_run, _metric_needs_tensors, _metric_returns_nan,
    _calibrator_rows_not_summing_to_one, _dataset_nan_inputs, _dataset_inf_in_files_dry_run,
]


@pytest.mark.parametrize("build", CONTRACT_CASES,
                         ids=[c.__name__.lstrip("_") for c in CONTRACT_CASES])
def test_user_code_breaking_its_contract_fails_cleanly(build, tmp_path, monkeypatch):
    import sys

    (tmp_path / "contractpkg").mkdir()
    (tmp_path / "contractpkg" / "__init__.py").write_text("")
    (tmp_path / "contractpkg" / "parts.py").write_text(_CONTRACT_PKG)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # what the CLI adds (the cwd); undone after
    args, needles = build(tmp_path)
    db, storage = tmp_path / "mlruns.db", tmp_path / "ray"
    try:
        result = CliRunner().invoke(main, [*args, "--tracking-uri", f"sqlite:///{db}",
                                           "--storage-path", str(storage)])
    finally:
        for name in [m for m in sys.modules if m.startswith("contractpkg")]:
            del sys.modules[name]
    _assert_clean_failure(result, needles)
    assert not db.exists(), "a tracking store was created"
    assert not storage.exists(), "a Tune storage folder was left behind"
    assert {p.name for p in tmp_path.iterdir()} <= {"contractpkg", "space.yaml"}


# -- bad inputs of issue 39 (item 8): YAML that expands, names, options that can never take
# effect, stores that cannot be written, symlink loops; each refused in one line before anything
# is written (no tracking store, no Tune storage folder), the sweep's name still free

def _space_yaml_aliases(tmp):
    bad = _write(tmp / "laughs.yaml", "method: ce\nmodel:\n  name: mlp\n  a: &a [lol, lol]\n"
                 "  b: &b [*a, *a, *a, *a]\n  c: [*b, *b, *b, *b]\n")
    return ["sweep", str(bad)], ["laughs.yaml: line 5", "YAML aliases (*a) are not allowed"]


def _recipe_yaml_aliases(tmp):
    recipe = _write(tmp / "r.yaml", "description: &d quick\nsource: *d\ntrain:\n  epochs: 2\n")
    return ["sweep", "ce", "--recipe", str(recipe)], ["r.yaml: line 2", "YAML aliases (*d)"]


def _train_key_at_fault(tmp):
    bad = _write(tmp / "lr.yaml", "method: ce\ntrain:\n  epochs: 3\n  lr: -1.0\n")
    return ["sweep", str(bad), "--dry-run"], ["lr.yaml: train.lr: `lr` must be > 0, got -1.0"]


def _name_escapes_storage(tmp):
    return ["sweep", "ce", "--name", "../escape"], ["sweep name '../escape' holds '/'"]


def _name_is_a_path(tmp):
    return ["sweep", "ce", "--name", "runs/today"], ["sweep name 'runs/today' holds '/'"]


def _name_too_long(tmp):
    return ["sweep", "ce", "--name", "n" * 300], ["(300 characters) is longer than 100"]


def _name_hidden_dry_run(tmp):
    return ["sweep", "ce", "--name", ".hidden", "--dry-run"], ["'.hidden' starts with '.'"]


def _experiment_empty(tmp):
    return ["sweep", "ce", "--experiment", ""], ["--experiment must name an MLflow experiment"]


def _scheduler_metric_not_reported(tmp):
    return (["sweep", "ce", "--scheduler", "asha", "--scheduler-metric", "val_ece_ts"],
            ["--scheduler-metric val_ece_ts: the trials report no metric val_ece_ts every "
             "epoch"])


def _scheduler_metric_without_scheduler(tmp):
    return (["sweep", "ce", "--scheduler-metric", "val_ece", "--dry-run"],
            ["--scheduler-metric val_ece has no effect without --scheduler asha"])


def _shift_samples_without_shift(tmp):
    return (["sweep", "ce", "--shift-samples", "100"],
            ["--shift-samples has no effect without --shift-eval or --shift-data"])


def _worker_size_without_ddp(tmp):
    return (["sweep", "ce", "--cpus-per-worker", "2"],
            ["--cpus-per-worker and --gpus-per-worker size DDP workers"])


def _checkpoint_every_beyond_epochs(tmp):
    return (["sweep", "ce", "--epochs", "3", "--checkpoint-every", "5"],
            ["--checkpoint-every 5 has no effect with --epochs 3"])


def _unwritable_folder(tmp) -> Path:
    import os

    if os.geteuid() == 0:  # root writes through permissions; nobody writes into /proc/<pid>
        return Path(f"/proc/{os.getpid()}")
    folder = tmp / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def _storage_unwritable(tmp):
    folder = _unwritable_folder(tmp)
    return (["sweep", "ce", "--name", "keep", "--storage-path", str(folder)],
            [f"storage path {folder} cannot be written"])


def _imagefolder_loop(tmp):
    root = tmp / "images"
    write_image_tree(root, classes=("ant", "cat"), per_class=2)
    (root / "cat" / "again").symlink_to(root)
    return (["sweep", "ce", "--dataset", "imagefolder", "--data-dir", str(root)],
            [f"the link {root / 'cat' / 'again'} leads to {root}", "(a symlink loop)"])


def _imagefolder_loop_dry_run(tmp):
    root = tmp / "images"
    write_image_tree(root / "train", classes=("ant", "cat"), per_class=2)
    write_image_tree(root / "val", classes=("ant", "cat"), per_class=1)
    (root / "val" / "ant" / "self").symlink_to(".")
    return (["sweep", "ce", "--dataset", "imagefolder", "--data-dir", str(root), "--dry-run"],
            [f"the link {root / 'val' / 'ant' / 'self'} leads to", "(a symlink loop)"])


GUARD_CASES = [
    _space_yaml_aliases, _recipe_yaml_aliases, _train_key_at_fault, _name_escapes_storage,
    _name_is_a_path, _name_too_long, _name_hidden_dry_run, _experiment_empty,
    _scheduler_metric_not_reported, _scheduler_metric_without_scheduler,
    _shift_samples_without_shift, _worker_size_without_ddp, _checkpoint_every_beyond_epochs,
    _storage_unwritable, _imagefolder_loop, _imagefolder_loop_dry_run,
]


@pytest.mark.parametrize("build", GUARD_CASES, ids=[c.__name__.lstrip("_") for c in GUARD_CASES])
def test_bad_input_refused_before_anything_is_written(build, tmp_path):
    args, needles = build(tmp_path)
    db, storage = tmp_path / "mlruns.db", tmp_path / "ray"
    args += ["--tracking-uri", f"sqlite:///{db}"]
    if "--storage-path" not in args:
        args += ["--storage-path", str(storage)]
    result = CliRunner().invoke(main, args)
    _assert_clean_failure(result, needles)
    assert not db.exists(), "a tracking store was created"
    assert not storage.exists(), "a Tune storage folder was left behind"
    assert not any(p.name.startswith(".raysearch-probe") for p in tmp_path.rglob("*"))


@pytest.mark.parametrize(("lock", "command"), [("EXCLUSIVE", ["sweep", "ce"]),
                                           ("IMMEDIATE", ["sweep", "ce"]),
                                           ("EXCLUSIVE", ["report", "s1"])])
def test_a_tracking_store_locked_by_another_process(lock, command, tmp_path):
    """Another process holds the SQLite store: one line after 5 s (MLflow's own wait).

    ``EXCLUSIVE`` lets nobody read; ``IMMEDIATE`` lets readers in but no writer, which a sweep
    needs (its name is free, its parent run could not be created).
    """
    from clusters import stop_process
    from test_input_guards import hold_lock

    db, storage = tmp_path / "mlruns.db", tmp_path / "ray"
    args = [*command, "--tracking-uri", f"sqlite:///{db}"]
    if command[0] == "sweep":
        args += ["--storage-path", str(storage)]
    holder = hold_lock(db, lock)
    try:
        result = CliRunner().invoke(main, args)
    finally:
        stop_process(holder)
    _assert_clean_failure(result, [f"tracking store {db} is locked by another process"])
    assert _runs_in(db) == 0, "an MLflow run was left behind"
    assert not storage.exists(), "a Tune storage folder was left behind"


@pytest.mark.integration
@pytest.mark.parametrize(("options", "needle"), [
    (["--cpus-per-trial", "64"], "--cpus-per-trial 64 needs 64 CPUs per trial but this "
                                 "machine has "),
    (["--workers-per-trial", "2", "--cpus-per-worker", "32"],
     "--workers-per-trial 2 --cpus-per-worker 32 needs 64 CPUs per trial but this machine has "),
    (["--gpus-per-trial", "1"], "--gpus-per-trial 1 needs 1 GPU per trial but this machine "
                                "has 0; leave the GPU options out to train on the CPU"),
])
def test_resources_no_trial_can_get(ray_session, options, needle, tmp_path):
    """Resources Ray can never grant: one line once Ray is up, no parent run, no storage."""
    have = ray_session.cluster_resources()
    if "--gpus-per-trial" in options and have.get("GPU", 0):
        pytest.skip("this test's Ray has a GPU, so a trial asking for 1 GPU is granted: there "
                    "is no refusal to check")
    if "--gpus-per-trial" not in options and have.get("CPU", 0) >= 64:
        pytest.skip(f"this test's Ray has {have['CPU']:g} CPUs, so a trial asking for 64 is "
                    "granted: there is no refusal to check")
    db, storage = tmp_path / "mlruns.db", tmp_path / "ray"
    result = CliRunner().invoke(main, ["sweep", "ce", *options, "--tracking-uri",
                                       f"sqlite:///{db}", "--storage-path", str(storage)])
    _assert_clean_failure(result, [needle])
    assert _runs_in(db) == 0, "an MLflow run was left behind"
    assert not storage.exists(), "a Tune storage folder was left behind"


@pytest.mark.integration
def test_an_unwritable_storage_leaves_the_name_free(ray_session, tmp_path):
    """A storage that cannot be written burns nothing: the same name sweeps once it is fixed."""
    db, storage = tmp_path / "mlruns.db", tmp_path / "ray"
    common = ["sweep", "ce", "--name", "keep", "-n", "1", "--epochs", "1", "--posthoc", "none",
              "--tracking-uri", f"sqlite:///{db}"]
    folder = _unwritable_folder(tmp_path)
    result = CliRunner().invoke(main, [*common, "--storage-path", str(folder)])
    _assert_clean_failure(result, [f"storage path {folder} cannot be written"])
    assert not db.exists()
    result = CliRunner().invoke(main, [*common, "--storage-path", str(storage)])
    assert result.exit_code == 0, result.output
    assert _runs_in(db) == 2  # the parent run and its trial
    assert (storage / "keep").is_dir()
