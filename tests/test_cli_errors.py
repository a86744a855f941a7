"""Bad input gets one line naming the problem and exit code 2, with no traceback."""

from __future__ import annotations

import socket
import time

import pytest
from click.testing import CliRunner

from raysearch.cli.commands import main


def _run(*args: str):
    return CliRunner().invoke(main, list(args))


def _assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    err = result.stderr.strip()
    assert err.startswith("error: ") or err.startswith("Usage:"), err
    if err.startswith("error: "):
        assert len(err.splitlines()) == 1, err
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in err, (needle, err)


def test_unknown_space():
    _assert_one_line_error(_run("sweep", "nope"), "nope", "acls")


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: acls\nparams: {margin: [1, 2\n")
    _assert_one_line_error(_run("sweep", str(bad)), "bad.yaml")


def test_low_greater_than_high(tmp_path):
    bad = tmp_path / "lohi.yaml"
    bad.write_text("method: acls\nparams:\n  margin: {low: 10.0, high: 6.0}\n")
    _assert_one_line_error(_run("spaces", "validate", str(bad)), "lohi.yaml", "params.margin")


def test_negative_margin(tmp_path):
    bad = tmp_path / "neg.yaml"
    bad.write_text("method: mbls\nparams:\n  margin: {low: -1.0, high: 6.0}\n")
    _assert_one_line_error(_run("sweep", str(bad)), "margin")


def test_epsilon_outside_unit_interval(tmp_path):
    bad = tmp_path / "eps.yaml"
    bad.write_text("method: ls\nparams:\n  epsilon: 1.0\n")
    _assert_one_line_error(_run("spaces", "validate", str(bad)), "epsilon")


def test_unknown_method(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("method: magic\n")
    _assert_one_line_error(_run("sweep", str(bad)), "magic")


def test_unknown_dataset():
    _assert_one_line_error(_run("sweep", "acls", "--dataset", "imagenet"), "imagenet", "digits")


def test_unknown_sweep_for_report_and_export(tmp_path, sqlite_uri):
    _assert_one_line_error(_run("report", "ghost", "--tracking-uri", sqlite_uri), "ghost")
    _assert_one_line_error(_run("export", "ghost", "--tracking-uri", sqlite_uri,
                                "-o", str(tmp_path / "b.yaml")), "ghost")
    assert not (tmp_path / "b.yaml").exists()


def test_unreachable_tracking_uri_checked_before_any_trial(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    start = time.monotonic()
    result = _run("sweep", "acls", "--tracking-uri", f"http://127.0.0.1:{port}",
                  "--storage-path", str(tmp_path / "ray"))
    _assert_one_line_error(result, "unreachable", str(port))
    assert time.monotonic() - start < 30
    assert not (tmp_path / "ray").exists(), "no trial may start"


def test_missing_sqlite_folder():
    _assert_one_line_error(_run("report", "x", "--tracking-uri", "sqlite:////no/such/dir/m.db"),
                           "/no/such/dir")


def test_train_missing_file(tmp_path):
    _assert_one_line_error(_run("train", str(tmp_path / "none.yaml")), "none.yaml")


def test_train_bad_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("config:\n  method: acls\n  loss_params: {margin: -2.0}\n")
    _assert_one_line_error(_run("train", str(cfg)), "margin")


@pytest.mark.parametrize("flag", [["--num-samples", "0"], ["--tolerance", "-0.5"]])
def test_bad_numbers(flag):
    _assert_one_line_error(_run("sweep", "acls", *flag))


def test_spaces_commands():
    listed = _run("spaces", "list")
    assert listed.exit_code == 0
    for name in ("ce", "ls", "focal", "flsd", "mbls", "acls", "all"):
        assert any(line.split()[0] == name for line in listed.output.splitlines()), name
    shown = _run("spaces", "show", "acls")
    assert shown.exit_code == 0
    assert "margin" in shown.output
    assert "log" in shown.output
    ok = _run("spaces", "validate", "acls", "all")
    assert ok.exit_code == 0
    assert ok.output.count("ok:") == 2


def test_resume_errors(sqlite_uri):
    _assert_one_line_error(_run("sweep"), "SPACE", "--resume")
    _assert_one_line_error(_run("sweep", "acls", "--resume", "s1"), "drop SPACE")
    _assert_one_line_error(_run("sweep", "--resume", "s1", "--epochs", "3", "--seed", "1"),
                           "own settings", "--epochs", "--seed")
    _assert_one_line_error(_run("sweep", "--resume", "nope", "--tracking-uri", sqlite_uri),
                           "no sweep named 'nope'")
    _assert_one_line_error(_run("sweep", "ce", "--max-failures", "-1"), "--max-failures")
