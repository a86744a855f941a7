"""Tests of raysearch.calibration.reproduce and `raysearch reproduce`: published beside ours."""

import math
import pickle
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from raysearch.calibration.reproduce import PUBLISHED, PublishedNumber, reproduce
from raysearch.cli.commands import main
from raysearch.metrics import ece, softmax

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
LT_FILES = [
    SHARED_DATA / "cifar_outputs" / name
    for name in ("sctl_densenet40_cifar10_lt_logits.npz", "sctl_resnet110_cifar10_lt_logits.npz")
]


def _write_split(path: Path, seed: int = 0, n: int = 300, k: int = 4) -> dict[str, np.ndarray]:
    """An .npz in the released layout: over-confident logits, a val and a test part."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for split in ("val", "test"):
        labels = rng.integers(0, k, size=n)
        logits = rng.normal(size=(n, k))
        logits[np.arange(n), labels] += 1.5
        arrays[f"{split}_logits"] = 4.0 * logits
        arrays[f"{split}_labels"] = labels
    np.savez(path, **arrays)
    return arrays


def _released_layout(n: int = 200, k: int = 10) -> tuple:
    """Logits whose ECE is known by hand, as ``((val_logits, val_labels), (test_..., ...))``.

    Every row has logit ln 27 at its predicted class and 0 elsewhere, so its confidence is
    27 / (27 + 9) = 0.75 (K = 10); every second row is wrong (its label is the next class).
    Hence, all rows in the bin (0.733, 0.8] of 15: ECE = |0.75 - 0.5| = 25.00 %, accuracy
    50.00 %. TS minimises the NLL -(1/2) ln p - (1/2) ln((1 - p) / 9) at p = 0.5, i.e.
    e^(ln 27 / T) = 9, T = ln 27 / ln 9 = 1.5, and the test ECE after TS is 0.
    """
    rows = np.arange(n)
    pred = (rows // 2) % k
    labels = np.where(rows % 2 == 0, pred, (pred + 1) % k).astype(np.int64)
    logits = np.zeros((n, k), dtype=np.float32)
    logits[rows, pred] = np.log(27.0)
    return (logits, labels), (logits.copy(), labels.copy())


def _row(files, calibrator, ece_pct, kind="default", params=None):
    return PublishedNumber(
        "Test 2026, Table 1",
        "toy",
        files,
        f"row {calibrator}",
        calibrator,
        params or {},
        ece_pct,
        None,
        kind,
    )


class TestReport:
    def test_uncalibrated_row_is_the_ece_of_the_test_logits(self, tmp_path):
        arrays = _write_split(tmp_path / "toy.npz")
        expected = 100 * ece(softmax(arrays["test_logits"]), arrays["test_labels"], n_bins=15)
        report = reproduce(tmp_path, published=[_row(("toy.npz",), None, expected)])
        (row,) = report.rows
        assert row.ece_pct == pytest.approx(expected, abs=1e-9)
        assert row.status(0.3) == "ok"
        assert report.passed

    @pytest.mark.parametrize("kind", ["default", "explicit"])
    def test_a_checked_row_beyond_the_tolerance_fails(self, tmp_path, kind):
        arrays = _write_split(tmp_path / "toy.npz")
        ours = 100 * ece(softmax(arrays["test_logits"]), arrays["test_labels"], n_bins=15)
        near = _row(("toy.npz",), None, ours + 0.29, kind)
        far_info = _row(("toy.npz",), None, ours - 5.0, "info")
        assert reproduce(tmp_path, published=[near, far_info]).passed
        far = _row(("toy.npz",), None, ours + 0.31, kind)
        report = reproduce(tmp_path, published=[near, far])
        assert not report.passed
        assert [row.published for row in report.failures] == [far]
        assert report.rows[1].difference == pytest.approx(-0.31)
        # a wider tolerance lets it through
        assert reproduce(tmp_path, published=[far], tolerance=0.5).passed

    def test_unknown_kind_is_rejected(self):
        with pytest.raises(ValueError, match="kind"):
            _row(("toy.npz",), None, 1.0, "maybe")

    def test_calibrator_row_fits_on_val_and_measures_on_test(self, tmp_path):
        arrays = _write_split(tmp_path / "toy.npz")
        from raysearch.calibration import fit_calibrator

        cal = fit_calibrator("ts", arrays["val_logits"], arrays["val_labels"])
        expected = 100 * ece(cal.predict_proba(arrays["test_logits"]), arrays["test_labels"])
        report = reproduce(tmp_path, published=[_row(("toy.npz",), "ts", expected)])
        assert report.rows[0].ece_pct == pytest.approx(expected, abs=1e-9)
        # fitted on val: not what a TS fitted on the test part gives
        on_test = fit_calibrator("ts", arrays["test_logits"], arrays["test_labels"])
        assert on_test.temperature != pytest.approx(cal.temperature, rel=1e-3)

    def test_a_failing_calibrator_is_an_error_row_and_the_rest_go_on(self, tmp_path):
        _write_split(tmp_path / "toy.npz")
        bad = _row(("toy.npz",), "ts", 1.0, params={"t_max": -1.0})
        good = _row(("toy.npz",), None, 1.0, "info")
        report = reproduce(tmp_path, published=[bad, good])
        assert report.rows[0].status(0.3) == "error"
        assert "t_max" in report.rows[0].error
        assert not math.isnan(report.rows[1].ece_pct)
        assert not report.passed

    def test_worker_processes_give_the_numbers_and_lines_of_one_process(self, tmp_path):
        # the fits of several files and calibrators run in 2 spawned workers or here; every
        # number is the same to the last bit and the progress lines come in row order
        for seed, name in enumerate(("a.npz", "b.npz")):
            _write_split(tmp_path / name, seed=seed, n=400, k=5)
        rows = [
            _row((name,), calibrator, 1.0, "info", params=params)
            for name in ("a.npz", "b.npz")
            for calibrator, params in [
                (None, {}), ("pts_sctl", {"steps": 40}), ("ts", {}), ("cts", {}),
                ("pts_sctl", {"steps": 40, "loss": "focal"}), ("ts", {"t_max": -1.0}),
                ("ts", {"classwise_scaling": True}),
            ]
        ]
        lines: dict[int, list[str]] = {1: [], 2: []}
        reports = {
            n: reproduce(tmp_path, published=rows, progress=lines[n].append, processes=n)
            for n in (1, 2)
        }
        assert lines[1] == lines[2]
        assert len(lines[1]) == 1 + len(rows)
        for one, two in zip(reports[1].rows, reports[2].rows, strict=True):
            assert one.published is two.published
            assert one.error == two.error
            for ours, theirs in [(one.ece_pct, two.ece_pct), (one.accuracy_pct, two.accuracy_pct)]:
                assert ours == theirs or (math.isnan(ours) and math.isnan(theirs))
        assert sum(bool(row.error) for row in reports[2].rows) == 2  # t_max=-1: one line each
        assert reports[1].format_table() == reports[2].format_table()

    @pytest.mark.parametrize("processes", [0, -1, 1.5, True])
    def test_bad_processes_is_a_value_error(self, tmp_path, processes):
        _write_split(tmp_path / "toy.npz")
        with pytest.raises(ValueError, match="processes"):
            reproduce(tmp_path, published=[_row(("toy.npz",), None, 1.0)], processes=processes)

    def test_the_authors_pickle_is_read_with_allow_pickle(self, tmp_path):
        arrays = _write_split(tmp_path / "toy.npz")
        (tmp_path / "toy.npz").unlink()
        layout = (
            (arrays["val_logits"], arrays["val_labels"]),
            (arrays["test_logits"], arrays["test_labels"]),
        )
        (tmp_path / "probs_toy_logits.p").write_bytes(pickle.dumps(layout))
        ours = 100 * ece(softmax(arrays["test_logits"]), arrays["test_labels"])
        rows = [_row(("toy.npz", "probs_toy_logits.p"), None, ours)]
        with pytest.raises(ValueError, match="not read without --allow-pickle"):
            reproduce(tmp_path, published=rows)
        report = reproduce(tmp_path, published=rows, allow_pickle=True)
        assert report.rows[0].file.name == "probs_toy_logits.p"
        assert report.rows[0].ece_pct == pytest.approx(ours, abs=1e-9)

    def test_missing_files_are_skipped_and_named(self, tmp_path):
        arrays = _write_split(tmp_path / "toy.npz")
        ours = 100 * ece(softmax(arrays["test_logits"]), arrays["test_labels"])
        report = reproduce(
            tmp_path, published=[_row(("toy.npz",), None, ours), _row(("absent.npz",), None, 1.0)]
        )
        assert report.passed
        assert report.rows[1].status(0.3) == "no file"
        assert "not found (skipped): absent.npz" in report.format_table()

    def test_no_known_file_is_a_value_error(self, tmp_path):
        with pytest.raises(ValueError, match="no released output file"):
            reproduce(tmp_path, published=[_row(("toy.npz",), None, 1.0)])
        with pytest.raises(FileNotFoundError):
            reproduce(tmp_path / "nowhere")
        _write_split(tmp_path / "toy.npz")
        with pytest.raises(ValueError, match="tolerance"):
            reproduce(tmp_path, tolerance=-0.1, published=[_row(("toy.npz",), None, 1.0)])


class TestReleasedFiles:
    """Every file under the folder is named in the report: used, or skipped with the reason."""

    RELEASED = (
        "probs_densenet40_c10_LT_logits.p",
        "probs_resnet_wide28_c10_LT_logits.p",
        "probs_resnet110_c10_LT_logits.p",
        "probs_resnet110_sd_c10_lt_logits.p",  # the authors spell it resnet110_SD, _LT
    )

    @pytest.fixture(scope="class")
    def report(self, tmp_path_factory):
        folder = tmp_path_factory.mktemp("released")
        for name in self.RELEASED:
            (folder / name).write_bytes(pickle.dumps(_released_layout()))
        # ResNet-32 is no network of Table 2 (its name is not a released one)
        (folder / "probs_resnet32_c10_LT_logits.p").write_bytes(pickle.dumps(_released_layout()))
        (folder / "probs_densenet40_c100_LT_logits.p").write_bytes(b"this is not a pickle")
        # CIFAR-100-LT outputs must have 100 classes
        (folder / "probs_resnet110_c100_LT_logits.p").write_bytes(
            pickle.dumps(_released_layout())
        )
        (folder / "sub").mkdir()
        (folder / "sub" / "probs_DenseNet40_c10_LT_logits.p").write_bytes(
            pickle.dumps(_released_layout())
        )
        (folder / "README.txt").write_text("my notes")
        fast = [pub for pub in PUBLISHED if pub.label in ("uncalibrated", "TS")]
        return reproduce(folder, published=fast, allow_pickle=True)

    def _reason(self, report, name):
        (found,) = [f for f in report.files if f.path.name == name]
        return found.used, found.reason

    def test_every_file_is_listed(self, report):
        assert sorted(f.path.name for f in report.files) == sorted(
            [*self.RELEASED, "probs_resnet32_c10_LT_logits.p", "README.txt",
             "probs_densenet40_c100_LT_logits.p", "probs_resnet110_c100_LT_logits.p",
             "probs_DenseNet40_c10_LT_logits.p"]
        )
        assert len(report.skipped) == 5
        text = report.format_table()
        for found in report.files:
            rel = found.path.relative_to(report.data_dir)
            verdict = "used" if found.used else "skipped"
            assert f"  {verdict:<8} {rel}: {found.reason}" in text

    def test_the_released_names_are_used(self, report):
        for name, network in zip(
            self.RELEASED, ("DenseNet-40", "WideResNet-28", "ResNet-110", "ResNet-110-SD"),
            strict=True,
        ):
            used, reason = self._reason(report, name)
            assert used, reason
            assert reason.startswith(f"{network}, Jung et al. 2023, Table 2 (CIFAR-10-LT): 2 rows")
            assert "200 val / 200 test samples, 10 classes" in reason

    def test_skipped_files_say_why(self, report):
        assert self._reason(report, "probs_resnet32_c10_LT_logits.p") == (
            False, "unknown name: not a released output file of a published table"
        )
        assert self._reason(report, "README.txt")[1].startswith("unknown name")
        used, reason = self._reason(report, "probs_densenet40_c100_LT_logits.p")
        assert not used
        assert "unreadable pickle (UnpicklingError" in reason
        used, reason = self._reason(report, "probs_resnet110_c100_LT_logits.p")
        assert not used
        assert reason == (
            "ResNet-110, Jung et al. 2023, Table 2 (CIFAR-100-LT): wrong array shapes: logits of "
            "10 classes, the published outputs have 100"
        )
        used, reason = self._reason(report, "probs_DenseNet40_c10_LT_logits.p")
        assert not used
        assert reason.endswith("a second copy; probs_densenet40_c10_LT_logits.p was used")

    def test_numbers_of_the_used_files(self, report):
        found = report.found
        assert len(found) == 8  # 4 networks x (uncalibrated, TS)
        for row in found:
            if row.published.label == "uncalibrated":  # _released_layout: 25 % by hand
                assert row.ece_pct == pytest.approx(25.0, abs=1e-4)
            else:  # TS at T = 1.5: confidence 0.5 = accuracy
                assert row.ece_pct == pytest.approx(0.0, abs=0.01)
            assert row.accuracy_pct == pytest.approx(50.0)
        assert {row.published.network for row in report.rows if row.file is None} == {
            "DenseNet-40", "WideResNet-28", "ResNet-110", "ResNet-110-SD"  # CIFAR-100-LT
        }

    def test_a_pickle_without_allow_pickle_is_skipped_with_the_reason(self, tmp_path):
        (tmp_path / "probs_resnet110_c10_LT_logits.p").write_bytes(
            pickle.dumps(_released_layout())
        )
        _write_split(tmp_path / "sctl_densenet40_cifar10_lt_logits.npz", k=10)
        fast = [pub for pub in PUBLISHED if pub.label == "uncalibrated"]
        report = reproduce(tmp_path, published=fast)
        assert [f.used for f in report.files] == [False, True]
        assert "not read without --allow-pickle" in report.files[0].reason


class TestPublished:
    def test_table2_has_every_row_of_every_network(self):
        # 2 datasets x 4 networks x 21 rows (16 methods, uncalibrated, 4 averages)
        assert len(PUBLISHED) == 2 * 4 * 21
        assert len({(p.source, p.network, p.label) for p in PUBLISHED}) == len(PUBLISHED)
        assert {p.files[-1] for p in PUBLISHED} == {
            f"probs_{net}_{c}_LT_logits.p"
            for net in ("densenet40", "resnet_wide28", "resnet110", "resnet110_SD")
            for c in ("c10", "c100")
        }

    def test_the_averages_are_the_means_of_the_printed_rows(self):
        # a check of the transcription: each printed average is the mean of the four rows
        # above it, to the table's rounding (e.g. DenseNet-40 CIFAR-10-LT:
        # (3.22 + 3.08 + 3.13 + 2.79) / 4 = 3.055, printed 3.06)
        by_key = {(p.source, p.network, p.label): p for p in PUBLISHED}
        averages = [p for p in PUBLISHED if p.average_of]
        assert len(averages) == 2 * 4 * 4
        for avg in averages:
            parts = [by_key[(avg.source, avg.network, label)] for label in avg.average_of]
            assert np.mean([p.ece_pct for p in parts]) == pytest.approx(avg.ece_pct, abs=0.006)
            assert np.mean([p.accuracy_pct for p in parts]) == pytest.approx(
                avg.accuracy_pct, abs=0.006
            )


class TestCommand:
    def test_wrong_numbers_under_a_released_name_exit_1(self, tmp_path):
        _write_split(tmp_path / "sctl_densenet40_cifar10_lt_logits.npz", k=10)
        (tmp_path / "probs_resnet110_c10_LT_logits.p").write_bytes(b"this is not a pickle")
        (tmp_path / "notes.txt").write_text("not outputs")
        result = CliRunner().invoke(main, ["reproduce", str(tmp_path)])
        assert result.exit_code == 1, result.output
        assert "MISS" in result.output
        assert "files under" in result.output
        assert "3 found, 1 used" in result.output
        lines = result.output.splitlines()
        assert any(line.split()[:2] == ["used", "sctl_densenet40_cifar10_lt_logits.npz:"]
                   for line in lines)
        # without --allow-pickle the pickle is not even opened
        assert any(line.split()[:2] == ["skipped", "probs_resnet110_c10_LT_logits.p:"]
                   and "--allow-pickle" in line for line in lines)
        assert any(line.split()[:2] == ["skipped", "notes.txt:"] and "unknown name" in line
                   for line in lines)
        assert "not found (skipped): " in result.output
        assert "probs_resnet_wide28_c10_LT_logits.p" in result.output.splitlines()[-1]

    def test_no_usable_file_is_one_line_naming_the_reasons_and_exit_2(self, tmp_path):
        (tmp_path / "probs_densenet40_c10_LT_logits.p").write_bytes(b"this is not a pickle")
        (tmp_path / "notes.txt").write_text("not outputs")
        result = CliRunner().invoke(main, ["reproduce", str(tmp_path), "--allow-pickle"])
        assert result.exit_code == 2, result.output
        (line,) = result.output.strip().splitlines()[-1:]
        assert line.startswith("error: no released output file under")
        assert "probs_densenet40_c10_LT_logits.p: DenseNet-40" in line
        assert "unreadable pickle" in line
        assert "Traceback" not in result.output

    def test_bad_input_is_one_line_and_exit_2(self, tmp_path):
        result = CliRunner().invoke(main, ["reproduce", str(tmp_path)])
        assert result.exit_code == 2
        assert result.output.strip().splitlines()[-1].startswith("error: no released output")
        assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def real_report():
    """`raysearch reproduce` on the shared data folder, run once: (exit code, row lines)."""
    if not all(path.exists() for path in LT_FILES):
        pytest.skip(f"released long-tailed CIFAR-10 logits not found under {SHARED_DATA}")
    result = CliRunner().invoke(main, ["reproduce", str(SHARED_DATA)])
    rows, source = {}, None
    for line in result.output.splitlines():
        if line.startswith("Jung et al."):
            source = line.split(":")[0]
        for pub in PUBLISHED:
            if pub.source == source and line.startswith(f"{pub.network:<13} {pub.label:<25} "):
                rows[(pub.source, pub.network, pub.label)] = line[40:].split()
    return result, rows


def _released_rows():
    """The PUBLISHED rows of the released files in the shared folder (CIFAR-10-LT, 2 nets)."""
    names = {path.name for path in LT_FILES}
    return [pub for pub in PUBLISHED if pub.files[0] in names]


def test_every_published_number_is_reproduced(real_report):
    """Every default and explicit row of the files found within 0.3 ECE points; exit status 0."""
    result, rows = real_report
    assert result.exit_code == 0, result.output
    released = _released_rows()
    assert len(released) == 2 * 21  # Table 2: 21 rows (with the 4 averages) per network
    assert len(rows) == len(released)
    n_checked = sum(pub.checked for pub in released)
    assert f"{n_checked} of {n_checked} checked results" in result.output
    for pub in released:
        ours, paper, diff = (float(v) for v in rows[(pub.source, pub.network, pub.label)][:3])
        assert paper == pub.ece_pct
        assert diff == pytest.approx(ours - paper, abs=0.011)
        if pub.checked:
            assert abs(diff) <= 0.3, (pub.network, pub.label, ours, paper)
    # the shared folder's other files are listed as skipped, never silently left out
    assert "skipped  cifar_outputs/netcal_lenet-5-cifar-10.npz: unknown name" in result.output


def test_released_pts_rows_match_to_the_hundredth(real_report):
    # pts_sctl is the released network bit for bit at initialisation: no slack is needed
    _, rows = real_report
    for (_, network, label), cells in rows.items():
        if label in ("PTS", "PTS + class-wise scaling", "PTS + LS"):
            assert abs(float(cells[2])) <= 0.01, (network, label, cells)
