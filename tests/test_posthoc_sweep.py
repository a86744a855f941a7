"""Tests of raysearch.tune.posthoc_sweep: post-hoc spaces, conditional sampling, a real sweep."""

from pathlib import Path

import numpy as np
import optuna
import pytest

from raysearch.calibration.posthoc import Outputs
from raysearch.metrics.selection import select_best
from raysearch.tune.posthoc_sweep import PosthocSpace, load_posthoc_space, run_posthoc_sweep
from raysearch.tune.spaces import SpaceError, available_spaces, load_space, space_kind

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _write(tmp_path: Path, text: str, name: str = "ph.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_bundled_posthoc_space_loads():
    space = load_posthoc_space("posthoc")
    assert isinstance(space, PosthocSpace)
    assert space.description
    assert set(space.specs) == {"calibrator", "loss", "classwise_scaling", "epsilon", "gamma"}
    assert space.specs["calibrator"].choices == ("ts", "ets", "cts", "pts", "ts_sbece")
    assert space.specs["epsilon"].log
    assert "epsilon" in space.describe()


def test_kind_dispatch_and_training_loader_refuses_posthoc():
    assert "posthoc" in available_spaces()
    assert available_spaces("posthoc") == ["posthoc"]
    assert "posthoc" not in available_spaces("train")
    assert space_kind("posthoc") == "posthoc"
    assert space_kind("acls") == "train"
    with pytest.raises(SpaceError, match=r"posthoc.yaml: a post-hoc search space.*--search"):
        load_space("posthoc")
    with pytest.raises(SpaceError, match="kind: expected 'posthoc'"):
        load_posthoc_space("acls")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (
            "kind: posthoc\ncalibrator: {choices: [ts, tss]}\n",
            r"ph.yaml: calibrator: unknown value 'tss'; allowed: cts, dirichlet, ets",
        ),
        ("kind: posthoc\ncalibrator: ts\nloss: {choices: [nll, bce]}\n", r"ph.yaml: loss: unknown"),
        (
            "kind: posthoc\ncalibrator: ts\nclasswise_scaling: {choices: [0, 1]}\n",
            r"ph.yaml: classwise_scaling: unknown value 0",
        ),
        ("kind: posthoc\ncalibrator: {low: 1, high: 2}\n", r"ph.yaml: calibrator: .*not a range"),
        (
            "kind: posthoc\ncalibrator: ts\nloss: ls\nepsilon: {low: 0.3, high: 0.1}\n",
            r"ph.yaml: epsilon: low \(0.3\) must be <= high \(0.1\)",
        ),
        (
            "kind: posthoc\ncalibrator: ts\nloss: ls\nepsilon: {low: -0.1, high: 0.1}\n",
            r"ph.yaml: epsilon: .*epsilon",
        ),
        (
            "kind: posthoc\ncalibrator: ts\nloss: nll\ngamma: 2.0\n",
            r"ph.yaml: gamma: only used with loss 'focal'",
        ),
        ("kind: posthoc\ncalibrator: ts\nlr: 0.1\n", r"ph.yaml: unknown top-level key\(s\) lr"),
        ("kind: posthoc\nloss: nll\n", r"ph.yaml: calibrator: missing"),
        ("calibrator: ts\n", r"ph.yaml: kind: expected 'posthoc'"),
        ("kind: posthoc\ncalibrator: [ts\n", r"ph.yaml: malformed YAML"),
    ],
)
def test_invalid_posthoc_spaces(tmp_path, text, match):
    with pytest.raises(SpaceError, match=match):
        load_posthoc_space(_write(tmp_path, text))


def test_unknown_kind_is_a_space_error(tmp_path):
    path = _write(tmp_path, "kind: eval\nmethod: ce\n")
    with pytest.raises(SpaceError, match="kind: must be 'train' or 'posthoc'"):
        space_kind(path)
    with pytest.raises(SpaceError, match="kind: must be 'train' or 'posthoc'"):
        load_space(path)


def test_define_by_run_is_conditional():
    space = load_posthoc_space("posthoc")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(80):
        trial = study.ask()
        fixed = space.define_by_run(trial)
        config = {**trial.params, **fixed}
        sampled = set(trial.params)
        assert {"calibrator", "classwise_scaling"} <= sampled
        if config["calibrator"] == "ts_sbece":
            assert "loss" not in sampled
            assert fixed == {"loss": "sbece"}
        else:
            assert "loss" in sampled
        assert ("epsilon" in sampled) == (config["loss"] == "ls")
        assert ("gamma" in sampled) == (config["loss"] == "focal")
        kwargs = space.fit_arguments(config)
        assert set(kwargs) - {"name", "loss", "classwise_scaling"} <= {"epsilon", "gamma"}
        seen.add(config["loss"])
        study.tell(trial, 0.0)
    assert seen == {"nll", "mse", "ls", "focal", "sbece"}


def test_fixed_values_are_returned(tmp_path):
    space = load_posthoc_space(
        _write(tmp_path, "kind: posthoc\ncalibrator: ts\nloss: focal\ngamma: 2.0\n")
    )
    trial = optuna.create_study().ask()
    fixed = space.define_by_run(trial)
    assert trial.params == {}
    assert fixed == {"calibrator": "ts", "loss": "focal", "gamma": 2.0, "classwise_scaling": False}
    assert space.fit_arguments(fixed) == {
        "name": "ts",
        "loss": "focal",
        "classwise_scaling": False,
        "gamma": 2.0,
    }


def _synthetic(n: int = 600, k: int = 5, seed: int = 0) -> Outputs:
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % k
    logits = rng.normal(size=(n, k))
    logits[np.arange(n), labels] += 1.5
    return Outputs(3.0 * logits, labels)  # overconfident


def test_posthoc_sweep_end_to_end(ray_session, sqlite_uri, tmp_path):
    from mlflow.tracking import MlflowClient

    outputs = _synthetic()
    lines = []
    result = run_posthoc_sweep(
        outputs,
        num_samples=6,
        seed=0,
        tracking_uri=sqlite_uri,
        experiment="ph",
        name="ph-test",
        progress=lines.append,
        storage_path=str(tmp_path / "ray"),
    )
    client = MlflowClient(sqlite_uri)
    exp = client.get_experiment_by_name("ph")
    parent = client.get_run(result.parent_run_id)
    assert parent.data.tags["raysearch.sweep"] == "ph-test"
    assert parent.data.tags["raysearch.kind"] == "posthoc"
    assert parent.info.status == "FINISHED"
    children = client.search_runs(
        [exp.experiment_id], f"tags.mlflow.parentRunId = '{result.parent_run_id}'"
    )
    assert len(children) == 6
    assert len(result.trials) == 6
    for child in children:
        assert {"calibrator", "loss", "classwise_scaling"} <= set(child.data.params)
    children = sorted(children, key=lambda c: c.info.run_name)  # trial order, as the sweep's
    ok = [c for c in children if c.info.status == "FINISHED"]
    assert ok
    for child in ok:
        assert {"holdout_accuracy", "holdout_ece", "holdout_nll", "eval_ece"} <= set(
            child.data.metrics
        )
    # the rule on the children's held-out metrics picks the reported winner
    rows = [c.data.metrics for c in ok]
    pick = ok[select_best(rows, accuracy="holdout_accuracy", ece="holdout_ece")]
    assert pick.info.run_id == result.selected["run_id"]
    assert pick.data.metrics["holdout_ece"] == min(
        r["holdout_ece"]
        for r in rows
        if r["holdout_accuracy"] >= max(q["holdout_accuracy"] for q in rows) - 0.01 - 1e-12
    )
    assert pick.data.metrics["holdout_ece"] == pytest.approx(result.selected["holdout_ece"])
    assert parent.data.tags["raysearch.selected_run"] == pick.info.run_id
    # calibration helps on the evaluation part
    assert result.selected["eval_ece"] < result.uncalibrated["eval_ece"]
    artifacts = {a.path for a in client.list_artifacts(result.parent_run_id)}
    assert {"trials.parquet", "best_posthoc.yaml"} <= artifacts
    assert result.best["name"] == result.selected["calibrator"]
    assert any(line.startswith("selected trial") for line in lines)


def test_space_without_loss_fits_each_calibrators_default_objective(tmp_path):
    from raysearch.calibration import default_objective

    space = load_posthoc_space(
        _write(tmp_path, "kind: posthoc\ncalibrator: {choices: [ts, ets, pts, cts]}\n")
    )
    assert "loss" not in space.specs
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = {}
    for _ in range(30):
        trial = study.ask()
        fixed = space.define_by_run(trial)
        calibrator = trial.params["calibrator"]
        assert "loss" not in trial.params
        seen[calibrator] = fixed["loss"]
        assert space.fit_arguments({**trial.params, **fixed})["loss"] == fixed["loss"]
        study.tell(trial, 0.0)
    # the authors' objectives: Mix-n-Match's ETS and Tomani et al.'s PTS fit MSE
    assert seen == {"ts": "nll", "ets": "mse", "pts": "mse", "cts": "nll"}
    assert all(default_objective(name) == loss for name, loss in seen.items())
    # gamma needs a focal loss, which no default objective is
    with pytest.raises(SpaceError, match="gamma: only used with loss 'focal'"):
        load_posthoc_space(_write(tmp_path, "kind: posthoc\ncalibrator: ts\ngamma: 2.0\n"))


def test_classwise_trials_run_the_released_variant():
    from raysearch.calibration import fit_calibrator

    space = load_posthoc_space("posthoc")
    kwargs = space.fit_arguments({"calibrator": "ts", "loss": "nll", "classwise_scaling": True})
    assert "variant" not in kwargs  # the wrapper's default applies
    outputs = _synthetic()
    cal = fit_calibrator(kwargs.pop("name"), outputs.logits, outputs.labels, **kwargs)
    assert cal.params_["variant"] == "official"
