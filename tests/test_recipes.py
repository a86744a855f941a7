"""Training recipes: each paper's protocol against its text, the default choice, precedence,
``sweep --dry-run`` (nothing started) and a real sweep whose trials train with a recipe."""

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from formats import write_cifar10
from mlflow.tracking import MlflowClient

from raysearch.cli.commands import main
from raysearch.cli.plan import SEARCHED
from raysearch.training.data.splits import long_tail_counts
from raysearch.tune.recipes import (
    RecipeError,
    apply_recipe,
    available_recipes,
    choose_recipe,
    default_recipe,
    load_recipe,
)
from raysearch.tune.spaces import load_space

PAPERS = Path(__file__).resolve().parents[2] / "shared" / "papers"

SGD_CIFAR = {"model": "resnet50", "epochs": 350, "batch_size": 128, "optimizer": "sgd",
             "lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4, "schedule": "multistep",
             "milestones": "150,250", "lr_decay": 0.1, "val_fraction": 0.1}
SGD_TINY = {**SGD_CIFAR, "epochs": 100, "batch_size": 64, "milestones": "40,60"}
VOC = {"model": "deeplabv3_resnet50", "epochs": 100, "batch_size": 8, "optimizer": "sgd",
       "lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "schedule": "multistep",
       "milestones": "40,80", "lr_decay": 0.1}
SOFT = {"model": "wrn28_10", "epochs": 200, "batch_size": 512, "optimizer": "sgd", "lr": 0.1,
        "momentum": 0.9, "weight_decay": {"type": "float", "low": 1e-5, "high": 1e-3,
                                          "log": True},
        "schedule": "multistep", "milestones": "60,120,160", "lr_decay": 0.2,
        "warmup_epochs": 1, "val_fraction": 0.1}

# recipe -> (the values it must hold, the paper file, sentences of that paper giving them)
CASES = {
    "digits": ({"lr": {"type": "float", "low": 0.01, "high": 0.2, "log": True},
                "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 64, "epochs": 10},
               "acls_adaptive_conditional_label_smoothing.md", [
        "momentum of 0.1, 5e-4, and 0.9, respectively"]),
    "acls-cifar10": (SGD_CIFAR, "acls_adaptive_conditional_label_smoothing.md", [
        "We use network architectures of ResNet-50 and ResNet-101",
        "momentum of 0.1, 5e-4, and 0.9, respectively",
        "trained for 350 and 100 epochs with a batch size of 128 and 64 for CIFAR10 and "
        "Tiny-ImageNet",
        "We divide the learning rate by 10 at 150 and 250 epochs for CIFAR10"]),
    "acls-tiny-imagenet": (SGD_TINY, "acls_adaptive_conditional_label_smoothing.md", [
        "at 40 and 60 epochs for Tiny-ImageNet"]),
    "acls-imagenet": ({"model": "torchvision:resnet50", "epochs": 200, "batch_size": 256,
                       "optimizer": "adamw", "lr": 5e-4, "weight_decay": 0.05,
                       "schedule": "cosine", "optimizer.betas": [0.9, 0.999],
                       "dataset": "imagefolder"},
                      "acls_adaptive_conditional_label_smoothing.md", [
        "we train ResNet-50 for 200 epochs using the AdamW optimizer",
        "of 256, 5e-4, 5e-2, 0.9, and 0.999, respectively",
        "We use a cosine annealing technique"]),
    "acls-voc": (VOC, "acls_adaptive_conditional_label_smoothing.md", [
        "We use DeepLabV3 [2] with ImageNet pretrained ResNet-50 as a backbone",
        "for 100 epochs with batch size, learning rate, momentum, and weight decay of 8, 1e-2, "
        "0.9, and 5e-4", "We divide the learning rate by 10 at 40 and 80 epochs"]),
    "mbls-cifar10": (SGD_CIFAR, "mbls_margin_based_label_smoothing.md", [
        "45,000/5,000/10,000 images", "we fixed the batch size to 128",
        "The number of training epochs is set to 350",
        "learning rate of 0.1 for the first 150 epochs, 0.01 for the next 100 epochs"]),
    "mbls-tiny-imagenet": (SGD_TINY, "mbls_margin_based_label_smoothing.md", [
        "we use 50 samples per class (a total of 10,000 samples) from the training set as a "
        "validation set", "We train for 100 epochs with a learning rate of 0.1 for the first 40 "
        "epochs, of 0.01 for the next 20 epochs"]),
    "mbls-cub200": ({"model": "torchvision:resnet101",
                     "pretrained": "ResNet101_Weights.IMAGENET1K_V1",
                     "epochs": 200, "batch_size": 16, "optimizer": "sgd", "lr": 0.1,
                     "momentum": 0.9, "weight_decay": 5e-4, "schedule": "multistep",
                     "milestones": "80,160", "lr_decay": 0.1},
                    "mbls_margin_based_label_smoothing.md", [
        "We initialize the model by pre-trained weights on ImageNet and then train on this "
        "dataset for 200 epochs", "The batch size is set to 16 and SGD optimizer is used with a "
        "momentum of 0.9", "decayed by a factor of 0.1 every 80 epochs",
        "CUB-200-2011 | R-101"]),
    "mbls-voc": (VOC, "mbls_margin_based_label_smoothing.md", [
        "The batch size is set to 8, and the momentum of the SGD optimizer to 0.9",
        "The learning rate is initialized as 0.01, and decayed by a factor of 0.1 every 40 "
        "epochs", "the network is trained for 100 epochs"]),
    "mbls-20ng": ({"model": "gpool_cnn", "epochs": 100, "batch_size": 64, "optimizer": "adam",
                   "lr": 1e-3, "weight_decay": 0.0, "schedule": "multistep", "milestones": "50",
                   "lr_decay": 0.1, "optimizer.betas": [0.9, 0.999]},
                  "mbls_margin_based_label_smoothing.md", [
        "Adam is used as optimizer with an initial learning rate of 0.001, and beta values equal "
        "to 0.9 and 0.999", "The training is performed during 100 epochs, with a learning-rate "
        "decay by a factor of 0.1 after the first 50 epochs"]),
    "als-imagenet": ({"model": "torchvision:resnet50", "epochs": 300, "batch_size": 256,
                      "optimizer": "sgd",
                      "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4,
                      "schedule": "multistep", "milestones": "75,150,225", "lr_decay": 0.1,
                      "dataset": "imagefolder"},
                     "adaptive_label_smoothing_objectness.md", [
        "train all our ImageNet models for 300 epochs starting with a learning rate of 0.1 and "
        "decayed by 0.1 at epochs 75, 150, and 225 using a batch size of 256",
        "Classification and calibration results with ImageNet using ResNet-50"]),
    "sbece-cifar10": (SOFT, "soft_calibration_objectives.md", [
        "We use the Wide-Resnet-28-10 architecture [Zagoruyko and Komodakis, 2017] trained for "
        "200 epochs on CIFAR-100 and CIFAR-10", "momentum fixed to 0.9 and base learning rate "
        "fixed to 0.1", "for an effective batch size of 512",
        "We tune the  $\\beta$  and  $\\lambda$  parameters"]),
    "sbece-cifar100": (SOFT, "soft_calibration_objectives.md", [
        "trained for 200 epochs on CIFAR-100 and CIFAR-10"]),
    "sbece-imagenet": ({"model": "torchvision:resnet50", "epochs": 90, "batch_size": 512,
                        "optimizer": "sgd", "lr": 0.1, "momentum": 0.9,
                        "weight_decay": SOFT["weight_decay"], "schedule": "multistep",
                        "milestones": "30,60,80", "lr_decay": 0.1, "warmup_epochs": 5,
                        "dataset": "imagefolder"},
                       "soft_calibration_objectives.md", [
        "For Imagenet, we use the Resnet-50 [He et al., 2015] architecture training for 90 "
        "epochs"]),
    "sctl-cifar10-lt": ({"model": "resnet110", "epochs": 200, "batch_size": 128,
                         "optimizer": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4,
                         "dataset": "cifar10", "data.imbalance_ratio": 10,
                         "val_fraction": 0.5},
                        "classwise_loss_scaling_posthoc.md", [
        "resnet110\t75.97\t19.14\t0.1\t1-e4\tSGD\t128\t200",
        "we bring 20431 samples from training data 50000 and separate them into 10215 training "
        "datasets and 10216 validation datasets"]),
}


def test_every_bundled_recipe_is_checked_here():
    assert sorted(CASES) == available_recipes()


@pytest.mark.parametrize("name", sorted(CASES))
def test_recipe_holds_its_papers_protocol(name):
    expected, paper, quotes = CASES[name]
    recipe = load_recipe(name)
    assert recipe.values() == expected
    assert recipe.source
    assert recipe.description


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_cited_paper_says_so(name):
    _, paper, quotes = CASES[name]
    path = PAPERS / paper
    if not path.is_file():  # the papers' text sits beside the repository, not in it
        pytest.skip(f"the paper's text {paper} is not beside this checkout (../shared/papers): "
                    "the recipe's values are checked, the quotes backing them cannot be")
    text = path.read_text(encoding="utf-8")
    for quote in quotes:
        assert quote in text, f"{paper} does not say {quote!r}"


def test_sctl_long_tail_ratio_is_the_one_that_gives_its_sample_counts():
    # Jung et al. App. C: 20,431 of CIFAR-10's 50,000 training images, split 10,215 / 10,216.
    # n_i = floor(5000 * rho^(-i/9)): for rho = 10 the factors are 1, 0.774, 0.599, 0.464, ...,
    # 0.1, i.e. 5000 + 3871 + 2997 + 2320 + 1796 + 1391 + 1077 + 834 + 645 + 500 = 20,431.
    ratio = load_recipe("sctl-cifar10-lt").values()["data.imbalance_ratio"]
    assert sum(long_tail_counts([5000] * 10, ratio)) == 20431
    assert sum(long_tail_counts([5000] * 10, 100)) == 12406


@pytest.mark.parametrize(("methods", "dataset", "expected"), [
    (["mbls"], "cifar10", "mbls-cifar10"),
    (["acls"], "cifar10", "acls-cifar10"),
    (["sbece"], "cifar10", "sbece-cifar10"),
    (["savuc"], "cifar100", "sbece-cifar100"),
    (["mbls"], "tiny_imagenet", "mbls-tiny-imagenet"),
    (["mbls"], "newsgroups20", "mbls-20ng"),
    (["acls"], "voc", "acls-voc"),
    (["ce"], "cifar10", "acls-cifar10"),   # a baseline: the first paper comparing with it
    (["ls", "mbls"], "cifar10", "mbls-cifar10"),  # an own method beats a baseline
    (["mbls"], "digits", "digits"),  # names no method: every method's on digits
    (["acls"], "cub200", None),
    (["acls"], "mypkg.data:load_table", None),
])
def test_default_recipe(methods, dataset, expected):
    recipe, why = default_recipe(methods, dataset)
    assert (recipe.name if recipe else None) == expected
    assert why
    if expected is None and dataset == "cub200":
        assert "mbls-cub200" in why
        assert "--recipe" in why


def test_a_bundled_space_trains_with_its_recipe():
    space = apply_recipe(load_space("mbls"), load_recipe("mbls-cifar10"))
    assert space.recipe == "mbls-cifar10"
    cfg = space.resolve(space.end_config("high"))
    assert (cfg.model.name, cfg.epochs, cfg.batch_size) == ("resnet50", 350, 128)
    assert (cfg.optimizer.lr, cfg.optimizer.weight_decay) == (0.1, 5e-4)  # lr no longer searched
    assert (cfg.schedule.name, cfg.schedule.milestone_epochs()) == ("multistep", [150, 250])
    assert cfg.data.val_fraction == 0.1
    assert set(space.searched()) == {"margin"}
    # the command line wins over the recipe
    cfg = space.resolve(space.end_config("low"), {"epochs": 3, "model": {"name": "resnet20"}})
    assert (cfg.epochs, cfg.model.name) == (3, "resnet20")


def test_your_own_spaces_keys_win_over_the_recipe(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("method: mbls\nparams:\n  margin: 8.0\n"
                    "train:\n  lr: {low: 0.01, high: 0.1, log: true}\n  batch_size: 32\n"
                    "optimizer:\n  weight_decay: 1.0e-4\n")
    space = apply_recipe(load_space(path), load_recipe("mbls-cifar10"))
    assert set(space.searched()) == {"lr"}
    low, high = (space.resolve(space.end_config(w)) for w in ("low", "high"))
    assert (low.optimizer.lr, high.optimizer.lr) == (0.01, 0.1)
    assert (low.batch_size, low.optimizer.weight_decay) == (32, 1e-4)
    assert (low.epochs, low.schedule.milestones) == (350, "150,250")  # the rest: the recipe's


def test_sctl_recipe_reaches_the_data_section():
    space = apply_recipe(load_space("ce"), load_recipe("sctl-cifar10-lt"))
    cfg = space.resolve(space.end_config("low"))
    assert cfg.data.name == "cifar10"
    assert cfg.data.params["imbalance_ratio"] == 10
    assert cfg.data.val_fraction == 0.5
    space = apply_recipe(load_space("acls"), load_recipe("acls-imagenet"))
    cfg = space.resolve(space.end_config("low"))
    assert (cfg.optimizer.name, tuple(cfg.optimizer.params["betas"])) == ("adamw", (0.9, 0.999))


def test_choose_recipe_none_and_resumed():
    space = load_space("mbls")
    same, recipe, why = choose_recipe(space, "none", "cifar10")
    assert same is space
    assert recipe is None
    assert "--recipe none" in why
    applied, recipe, _ = choose_recipe(space, None, "cifar10")
    assert recipe.name == "mbls-cifar10"
    again, recipe, why = choose_recipe(applied, "acls-cifar10", "cifar10")
    assert again is applied
    assert recipe is None
    assert "recorded" in why


def test_recipe_errors(tmp_path):
    with pytest.raises(RecipeError, match=r"unknown recipe 'mbls-cifar' \(did you mean "
                                          r"mbls-cifar10"):
        load_recipe("mbls-cifar")
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: me\ntrain:\n  epoch: 3\n")
    with pytest.raises(RecipeError, match=r"bad.yaml: train.epoch: unknown training key"):
        load_recipe(bad)
    bad.write_text("train:\n  epochs: 3\n")
    with pytest.raises(RecipeError, match=r"bad.yaml: source: must be a non-empty string"):
        load_recipe(bad)
    bad.write_text("source: me\nepochs: 3\n")
    with pytest.raises(RecipeError, match=r"unknown key\(s\) epochs"):
        load_recipe(bad)
    bad.write_text("source: me\nval_fraction: 1.5\n")
    with pytest.raises(RecipeError, match=r"val_fraction: must be a fixed number in \(0, 1\)"):
        load_recipe(bad)


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("c10")
    write_cifar10(root)
    return root


DRY_RUNS = {
    "mbls": ["mbls"], "acls": ["acls"], "sbece": ["sbece"],
    "none": ["mbls", "--recipe", "none"],
}
# one process for every dry run: it must import neither Ray nor MLflow, and write nothing
_DRY_RUN_PROCESS = """
import json, os, sys
from click.testing import CliRunner
from raysearch.cli.commands import main
data, cases = sys.argv[1], json.loads(sys.argv[2])
out = {}
for case, args in cases.items():
    result = CliRunner().invoke(main, ["sweep", *args, "--dataset", "cifar10", "--data-dir",
                                       data, "-n", "4", "--dry-run"])
    out[case] = [result.exit_code, result.stdout]
out["_modules"] = {m: m in sys.modules for m in ("ray", "mlflow", "raysearch.tune.engine")}
out["_files"] = os.listdir(".")
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def dry_runs(cifar_dir, tmp_path_factory):
    import json
    import subprocess
    import sys

    cwd = tmp_path_factory.mktemp("dry_run_cwd")
    done = subprocess.run([sys.executable, "-c", _DRY_RUN_PROCESS, str(cifar_dir),
                           json.dumps(DRY_RUNS)], cwd=cwd, capture_output=True, text=True,
                          check=True, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_dry_run_starts_nothing(dry_runs):
    assert dry_runs["_modules"] == {"ray": False, "mlflow": False,
                                    "raysearch.tune.engine": False}
    assert dry_runs["_files"] == []  # no mlruns.db, no ray_results


@pytest.mark.parametrize(("space", "model", "epochs", "batch", "searched"), [
    ("mbls", "resnet50", 350, 128, {"margin"}),
    ("acls", "resnet50", 350, 128, {"margin", "lambda1", "lambda2"}),
    ("sbece", "wrn28_10", 200, 512, {"primary", "beta", "temperature", "weight_decay"}),
])
def test_dry_run_prints_the_papers_protocol(space, model, epochs, batch, searched, cifar_dir,
                                            dry_runs):
    code, stdout = dry_runs[space]
    assert code == 0, stdout
    plan = yaml.safe_load(stdout)
    cfg = plan["config"]
    assert (cfg["model"]["name"], cfg["epochs"], cfg["batch_size"]) == (model, epochs, batch)
    assert (cfg["optimizer"]["name"], cfg["optimizer"]["lr"]) == ("sgd", 0.1)
    assert cfg["optimizer"]["params"]["momentum"] == 0.9
    assert cfg["schedule"]["name"] == "multistep"
    assert set(plan["searched"]) == searched
    for key in searched - {"weight_decay"}:
        assert cfg["loss"]["params"][key] == SEARCHED
    assert plan["recipe"]["name"] == f"{space}-cifar10"
    assert plan["recipe"]["source"]
    assert plan["data"] == {"dataset": "cifar10", "data_dir": str(cifar_dir.resolve()),
                            "present": True, "task": "classification", "num_classes": 10,
                            "input_shape": [3, 32, 32], "train": 90, "val": 10, "test": 20,
                            "shift": None}
    assert plan["sweep"]["trials"] == 4
    assert plan["resources"]["cpus_per_trial"] == 1.0


def test_dry_run_recipe_none_and_errors(dry_runs, tmp_path):
    code, stdout = dry_runs["none"]
    assert code == 0, stdout
    plan = yaml.safe_load(stdout)
    assert plan["recipe"] is None
    assert "--recipe none" in plan["recipe_note"]
    # no recipe: the run config's defaults, nothing but the loss searched
    assert plan["config"]["epochs"] == 10
    assert plan["config"]["optimizer"]["lr"] == 0.05
    assert set(plan["searched"]) == {"margin"}
    out = CliRunner().invoke(main, ["sweep", "mbls", "--dataset", "cifar10", "--data-dir",
                                    str(tmp_path / "nowhere"), "--dry-run"])
    assert out.exit_code == 2
    assert len(out.output.strip().splitlines()) == 1
    assert "cifar-10-batches-py" in out.output
    out = CliRunner().invoke(main, ["sweep", "mbls", "--recipe", "mbls-cifar", "--dry-run"])
    assert out.exit_code == 2
    assert "did you mean mbls-cifar10" in out.output


def test_recipes_list_and_show():
    out = CliRunner().invoke(main, ["recipes", "list"])
    assert out.exit_code == 0
    lines = out.output.splitlines()
    assert len(lines) == len(available_recipes())
    assert re.match(r"mbls-cifar10\s+MbLS on CIFAR-10 .*\[default for mbls on cifar10\]$",
                    next(line for line in lines if line.startswith("mbls-cifar10")))
    out = CliRunner().invoke(main, ["recipes", "show", "sctl-cifar10-lt"])
    assert out.exit_code == 0
    assert "imbalance_ratio: 10" in out.output
    assert "20431 samples" in out.output


def test_a_sweeps_trials_train_with_the_recipe(ray_session, tmp_path, sqlite_uri):
    recipe = tmp_path / "quick.yaml"
    recipe.write_text("description: a quick protocol\nsource: this test\n"
                      "train:\n  model: mlp\n  epochs: 2\n  batch_size: 32\n  lr: 0.05\n"
                      "  schedule: multistep\n  milestones: \"1\"\n  lr_decay: 0.5\n"
                      "val_fraction: 0.25\n")
    out = CliRunner().invoke(main, [
        "sweep", "ce", "--recipe", str(recipe), "-n", "1", "--name", "quick",
        "--tracking-uri", sqlite_uri, "--storage-path", str(tmp_path / "ray")])
    assert out.exit_code == 0, out.output
    assert "recipe quick (--recipe)" in out.output
    client = MlflowClient(sqlite_uri)
    exp = client.get_experiment_by_name("raysearch")
    runs = client.search_runs([exp.experiment_id])
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert parent.data.params["recipe"] == "quick"
    params = child.data.params
    assert (params["model"], params["epochs"], params["batch_size"]) == ("mlp", "2", "32")
    assert float(params["lr"]) == 0.05
    assert params["milestones"] == "1"
    assert float(params["lr_decay"]) == 0.5
    # digits' val_fraction is a share of all 1,797 samples: 0.25 -> 450 validation samples
    assert int(parent.data.params["data_val_size"]) == 450
    assert float(parent.data.params["data_val_fraction"]) == 0.25


def test_a_recipe_files_datasets_are_read_again_when_the_file_changes(tmp_path, monkeypatch):
    import os

    from raysearch.tune import recipes

    monkeypatch.setattr(recipes, "_bundled_dir", lambda: tmp_path)
    path = tmp_path / "mine.yaml"
    path.write_text("datasets: [cifar10]\n", encoding="utf-8")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert recipes._declared_datasets("mine") == ("cifar10",)
    path.write_text("datasets: [svhn, cifar100]\n", encoding="utf-8")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))  # same stamp: the kept answer
    assert recipes._declared_datasets("mine") == ("cifar10",)
    os.utime(path, ns=(2_000_000_000, 2_000_000_000))  # changed: read again
    assert recipes._declared_datasets("mine") == ("svhn", "cifar100")


def test_the_datasets_read_ahead_are_the_loaded_recipes(monkeypatch):
    # the quick read of every bundled file (libyaml, unchecked) gives each recipe's datasets
    # as the checked load does
    from raysearch.tune import recipes

    monkeypatch.setattr(recipes, "_DECLARED", {})
    names = recipes.available_recipes()
    assert len(names) >= 10
    for name in names:
        assert recipes._declared_datasets(name) == tuple(recipes.load_recipe(name).datasets)
