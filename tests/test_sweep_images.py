"""End to end on a real on-disk format: `raysearch sweep` over a CIFAR-10-format folder.

The folder is written by the test in the python-pickle layout users download
(cifar-10-batches-py/ with data_batch_1..5, test_batch, batches.meta); the sweep reads it
through the same loader users get, trains a CIFAR ResNet per trial with real Ray and MLflow,
and evaluates each trial under dataset shift.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from formats import write_cifar10
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.tracking import MlflowSweepCallback

pytestmark = pytest.mark.integration


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    write_cifar10(root, per_batch=20, n_test=30)  # 100 training images, 30 test images
    return root


@pytest.fixture(scope="module")
def cifar_sweep(ray_session, cifar_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep-cifar")
    uri = f"sqlite:///{root / 'mlruns.db'}"
    with pytest.MonkeyPatch.context() as mp:
        # an epoch line for every report (real CIFAR epochs take longer than the 30 s default)
        mp.setattr(MlflowSweepCallback, "EPOCH_LINE_EVERY_S", 0.0)
        result = _run_sweep(cifar_dir, root, uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id], max_results=100) if exp else []
    return {"result": result, "client": client, "runs": runs}


def _run_sweep(cifar_dir, root, uri):
    return _cli("sweep", "ls", "--dataset", "cifar10", "--data-dir", str(cifar_dir),
                "--model", "resnet20", "--num-samples", "2", "--epochs", "1",
                "--imbalance-ratio", "2", "--val-fraction", "0.2",
                "--name", "e2e-cifar", "--tracking-uri", uri, "--storage-path",
                str(root / "ray"), "--shift-eval", "--shift-samples", "10")


def test_two_trials_on_a_cifar_format_folder(cifar_sweep):
    result = cifar_sweep["result"]
    assert result.exit_code == 0, result.output
    # long tail with rho = 2 on 10 images per class: n_i = floor(10 * 2 ** (-i / 9)) keeps
    # 10, 9, 8, 7, 7, 6, 6, 5, 5, 5 = 68 images; 20% of them (ceil 13.6 = 14) are validation
    assert "on cifar10 (54 train / 14 val / 30 test samples)" in result.output
    assert result.output.count(" epoch 1/1: val acc ") == 2  # one epoch line per trial
    parents = [r for r in cifar_sweep["runs"] if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in cifar_sweep["runs"] if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1
    assert len(children) == 2
    params = parents[0].data.params
    assert params["dataset"] == "cifar10"
    assert params["model"] == "resnet20"
    assert params["data_train_size"] == "54"
    assert params["data_val_size"] == "14"
    assert params["data_test_size"] == "30"
    assert params["data_class_counts"] == "10,9,8,7,7,6,6,5,5,5"
    assert params["data_imbalance_ratio"] == "2.0"
    assert "stratified 20%" in params["data_val_split"]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.params["dataset"] == "cifar10"
        assert child.data.params["model"] == "resnet20"
        assert child.data.params["data.imbalance_ratio"] == "2.0"
        assert child.data.params["val_fraction"] == "0.2"
        metrics = child.data.metrics
        assert 0 <= metrics["test_accuracy"] <= 1
        assert 0 <= metrics["test_ece"] <= 1


def test_shift_metrics_and_artifacts_per_trial(cifar_sweep):
    client = cifar_sweep["client"]
    children = [r for r in cifar_sweep["runs"] if "mlflow.parentRunId" in r.data.tags]
    for child in children:
        metrics = child.data.metrics
        for key in ("shift_gaussian_noise_1_ece", "shift_gaussian_noise_5_ece_ts",
                    "shift_jpeg_compression_3_accuracy", "shift_mean_5_ece",
                    "shift_mean_0_accuracy"):
            assert key in metrics, key
            assert 0 <= metrics[key] <= 1, key
        # severity 0 is the clean subsample of the same model
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"shift.png", "shift.csv", "logits.parquet"} <= names


def test_bad_data_path_fails_in_one_line_before_ray(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    result = CliRunner().invoke(main, ["sweep", "ls", "--dataset", "cifar10", "--data-dir",
                                       str(tmp_path / "nowhere"), "--tracking-uri", uri])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "cifar10" in lines[0]
    assert "cifar-10-batches-py" in lines[0]
    assert "Traceback" not in result.output
    # nothing was recorded: the check runs before the parent run is created
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("raysearch")
    assert exp is None or not client.search_runs([exp.experiment_id])


def test_unknown_model_fails_in_one_line(tmp_path, cifar_dir):
    result = CliRunner().invoke(main, ["sweep", "ls", "--dataset", "cifar10", "--data-dir",
                                       str(cifar_dir), "--model", "resnet19",
                                       "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert result.exit_code == 2
    assert "Unknown model 'resnet19'" in result.output
    assert "resnet18" in result.output
    assert "torchvision:<name>" in result.output


def test_gpus_per_trial_without_a_gpu_is_one_line(ray_session, cifar_dir, tmp_path):
    if ray_session.cluster_resources().get("GPU", 0):
        pytest.skip("this test's Ray has a GPU, so --gpus-per-trial 0.5 is granted: there is "
                    "no refusal to check")
    result = CliRunner().invoke(main, ["sweep", "ls", "--dataset", "cifar10", "--data-dir",
                                       str(cifar_dir), "--gpus-per-trial", "0.5",
                                       "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    assert result.exit_code == 2
    assert "--gpus-per-trial 0.5 needs 0.5 GPU per trial but this machine has 0" in result.output


def test_shift_eval_needs_an_image_dataset(tmp_path):
    result = CliRunner().invoke(main, ["sweep", "ls", "--shift-eval", "--tracking-uri",
                                       f"sqlite:///{tmp_path / 'm.db'}", "--num-samples", "1"])
    assert result.exit_code == 2
    assert "--shift-eval needs an image dataset" in result.output
