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
    _train_unknown_key, _resume_missing, _report_missing, _export_missing, _storage_under_file,
    _model_param_without_value, _sync_missing,
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
