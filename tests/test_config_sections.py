"""The typed config in sections; every searchable key reaches what it configures (no Ray)."""

from __future__ import annotations

import pytest
import torch
import yaml
from click.testing import CliRunner

from raysearch.cli.commands import main
from raysearch.config import RunConfig, sections_from_flat
from raysearch.training.data import load_dataset
from raysearch.training.run import build_run_model, fit, load_run_data
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import SpaceError, space_from_dict

# an export written by raysearch before the sections (every flat field, as it wrote them)
OLD_EXPORT = """\
config:
  method: acls
  loss_params: {margin: 8.0, lambda1: 0.1, lambda2: 0.01, variant: official}
  dataset: digits
  model: cnn
  epochs: 2
  batch_size: 64
  lr: 0.05
  momentum: 0.9
  weight_decay: 0.0005
  seed: 3
  data_seed: null
  val_fraction: null
  test_fraction: null
  ece_bins: 15
  data_dir: null
  interleaved: false
  interleave_fraction: 0.1
  imbalance_ratio: null
  schedule: cosine
  milestones: ''
  lr_decay: 0.1
  warmup_epochs: 0
  nesterov: false
  mixup_alpha: 0.0
  cutmix_alpha: 0.0
  crop_size: 512
  pretrained_backbone: null
  pretrained: null
  freeze_backbone_epochs: 0
  head_lr: null
  embeddings: null
  optimizer: sgd
sweep: old-sweep
"""


def test_an_export_of_the_flat_layout_still_loads(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(OLD_EXPORT)
    cfg = RunConfig.from_yaml(path)
    assert (cfg.loss.name, cfg.loss.params["margin"]) == ("acls", 8.0)
    assert (cfg.model.name, cfg.data.name, cfg.seed, cfg.epochs) == ("cnn", "digits", 3, 2)
    assert cfg.optimizer.kwargs() == {"lr": 0.05, "weight_decay": 0.0005, "momentum": 0.9}
    # a CIFAR-style run carries no crop_size: the old default is dropped, not kept around
    assert cfg.data.params == {}
    assert cfg.model.params == {}
    # the same config, written in sections and read back, is equal
    again = tmp_path / "new.yaml"
    cfg.to_yaml(again)
    assert "loss_params" not in again.read_text()
    assert RunConfig.from_yaml(again) == cfg
    # sections only: no flat alias is read from the config itself
    for flat in ("method", "lr", "loss_params"):
        assert not hasattr(cfg, flat)


def test_the_flat_layout_is_read_at_the_edge_into_the_same_config():
    flat = RunConfig.from_dict({"method": "ls", "loss_params": {"epsilon": 0.1}, "lr": 0.2,
                                "optimizer": "adamw", "crop_size": 64, "dataset": "voc",
                                "embeddings": "g.txt"})
    sections = RunConfig(loss={"name": "ls", "params": {"epsilon": 0.1}},
                         optimizer={"name": "adamw", "lr": 0.2},
                         data={"name": "voc", "params": {"crop_size": 64}},
                         model={"params": {"embeddings_path": "g.txt"}})
    assert flat == sections
    dotted = RunConfig(**sections_from_flat({
        "method": "ls", "loss_params": {"epsilon": 0.1}, "optimizer": "adamw",
        "optimizer.lr": 0.2, "dataset": "voc", "data.crop_size": 64,
        "model.embeddings_path": "g.txt"}))
    assert dotted == flat
    # the constructor itself takes sections only
    with pytest.raises(ValueError, match=r"unknown run config key 'method'"):
        RunConfig(**{"method": "ls"})


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"lr": -1.0}, r"^optimizer: `lr` must be > 0, got -1\.0$"),
    ({"epochs": 0}, r"^`epochs` must be >= 1, got 0$"),
    ({"optimizer": {"name": "sgd", "lrr": 0.1}}, r"unknown run config key 'optimizer\.lrr'"),
    ({"foo": 1}, r"^unknown run-config key\(s\) foo; known: "),
    ({"dataset": "voc", "crop_size": 8}, r"^data: `crop_size` must be >= 16, got 8$"),
    ({"schedule": "multistep"}, r"^schedule: `schedule: multistep` needs `milestones`"),
])
def test_config_errors_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as err:
        RunConfig.from_dict(kwargs)
    assert "\n" not in str(err.value)


def test_an_option_the_dataset_would_ignore_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"dataset 'digits' takes no argument 'crop_size'"):
        load_dataset("digits", crop_size=64)
    out = CliRunner().invoke(main, ["sweep", "ce", "--crop-size", "64",
                                    "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
                                    "--storage-path", str(tmp_path / "ray")])
    assert out.exit_code == 2
    assert out.stderr.count("\n") == 1
    assert "takes no argument 'crop_size'" in out.stderr
    assert not (tmp_path / "m.db").exists()
    assert not (tmp_path / "ray").exists()


SPACE = {
    "method": "ls",
    "params": {"epsilon": {"low": 0.0, "high": 0.2}},
    "model": {"name": "mlp", "hidden": {"low": 8, "high": 64}},
    "data": {"name": "digits", "test_fraction": {"choices": [0.2, 0.3]}},
    "optimizer": {"name": "adamw", "lr": {"low": 1e-3, "high": 1e-2, "log": True},
                  "weight_decay": {"low": 1e-4, "high": 1e-1, "log": True},
                  "betas": [0.8, 0.99]},
    "train": {"epochs": 1, "batch_size": {"choices": [32, 64]}},
}


def test_a_space_refuses_keywords_its_factories_do_not_take():
    with pytest.raises(SpaceError, match=r"model: model 'mlp' takes no argument 'hidden'"):
        space_from_dict(SPACE, "s")


def wide_mlp(num_classes, input_shape, hidden=16):
    """A model factory of a user's, with a searchable width."""
    size = 1
    for d in input_shape:
        size *= d
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(size, hidden),
                               torch.nn.ReLU(), torch.nn.Linear(hidden, num_classes))


def test_every_searched_key_reaches_what_it_configures():
    space = space_from_dict({**SPACE, "model": {"name": "raysearch_test_wide:wide_mlp",
                                                "hidden": {"low": 8, "high": 64}}},
                            "s", components={"models": {"raysearch_test_wide:wide_mlp":
                                                        wide_mlp}})
    trial = {"method": "ls", "epsilon": 0.15, "model.hidden": 37, "data.test_fraction": 0.3,
             "optimizer.lr": 0.004, "optimizer.weight_decay": 0.02, "batch_size": 32}
    cfg = space.resolve(trial)
    components = {"models": {"raysearch_test_wide:wide_mlp": wide_mlp}}
    data = load_run_data(cfg)
    assert len(data.test) == 540  # data.test_fraction: 30% of 1797 digits
    model = build_run_model(cfg, data, components=components)
    assert model[1].out_features == 37  # model.hidden
    states = []
    result = fit(cfg, data=data, components=components,
                 on_epoch=lambda epoch, metrics, state: states.append(state))
    group = states[0]["optimizer"]["param_groups"][0]
    assert group["weight_decay"] == pytest.approx(0.02)  # optimizer.weight_decay
    assert group["betas"] == (0.8, 0.99)  # a fixed list reaches AdamW as its tuple
    assert group["initial_lr"] == pytest.approx(0.004)  # optimizer.lr
    assert "decoupled_weight_decay" in group  # AdamW, not Adam
    assert cfg.loss.params == {"epsilon": 0.15}
    assert cfg.batch_size == 32
    assert 0 <= result.metrics["test_ece"] <= 1
    # and MLflow names them by their section
    from raysearch.tracking import run_params

    params = run_params(cfg)
    assert params["model.hidden"] == 37
    assert params["optimizer.weight_decay"] == 0.02
    assert params["data.test_fraction"] == 0.3
    assert params["optimizer"] == "adamw"
    assert params["epsilon"] == 0.15
    assert params["lr"] == 0.004


def test_sweep_settings_are_typed_and_take_resources_flat_or_in_a_section():
    flat = SweepSettings(cpus_per_trial=2, gpus_per_trial=0.5)
    section = SweepSettings(resources={"cpus_per_trial": 2, "gpus_per_trial": 0.5})
    assert flat == section
    assert flat.resources.cpus_per_trial == 2.0
    assert not hasattr(flat, "cpus_per_trial")  # read through the section only
    assert SweepSettings.from_record(yaml.safe_load(yaml.safe_dump(flat.to_record()))) == flat
    with pytest.raises(ValueError, match="gpus_per_trial` above 1 must be a whole number"):
        SweepSettings(gpus_per_trial=1.5)
    with pytest.raises(ValueError, match=r"--objective val_brierr: the trials report no metric "
                                         r"val_brierr \(did you mean brier"):
        SweepSettings(objective="val_brierr")  # checked when made
    assert SweepSettings(objective="val_brier").objective_metrics() == ("val_brier", "min")
    assert SweepSettings(objective="accuracy_ts").objective_metrics() == \
        ("val_accuracy_ts", "max")
    mine = SweepSettings(metrics=("mypkg.metrics:sharpness",), objective="sharpness:max",
                         ece_metric="sharpness")
    assert mine.objective_metrics() == ("val_sharpness", "max")
    assert mine.ece_key == "val_sharpness"


def test_the_api_names_stay_callable_once_the_engine_is_imported():
    """`raysearch.sweep` is the API function, not a module that importing it would shadow."""
    import raysearch
    import raysearch.tune.engine  # noqa: F401 (what a sweep imports)

    assert callable(raysearch.sweep)
    assert callable(raysearch.train)
    assert raysearch.SweepResult is raysearch.tune.engine.SweepResult
    assert raysearch.sweep.__module__ == "raysearch.api"


def test_the_settings_model_and_data_params_reach_every_trial_once():
    from raysearch.cli.commands import sweep
    from raysearch.cli.options import sweep_settings
    from raysearch.tune.spaces import TrialConfigs

    # the command line parsed by click, as `raysearch sweep` parses it
    ctx = sweep.make_context("sweep", ["ls", "--model-param", "hidden=37", "--model-param",
                                       "depth=[1, 2]", "--data-param", "test_fraction=0.3",
                                       "--seed", "4"])
    options = {k: v for k, v in ctx.params.items() if k not in ("space", "resume", "dry_run")}
    settings = sweep_settings(options)
    assert settings.model_params == {"hidden": 37, "depth": [1, 2]}  # values read as YAML
    assert settings.data_params == {"test_fraction": 0.3}
    configs = TrialConfigs(space_from_dict({"method": "ls", "params": {"epsilon": 0.1}}, "s"),
                           settings.config_overrides())
    cfg = configs.resolve({"method": "ls"})
    assert cfg.model.params == {"hidden": 37, "depth": [1, 2]}
    assert cfg.data.params == {"test_fraction": 0.3}
    assert (cfg.seed, cfg.loss.params) == (4, {"epsilon": 0.1})


def test_a_sweep_recorded_with_dotted_overrides_resumes_with_them():
    # the settings a sweep recorded before model_params/data_params and the resources section
    record = {"num_samples": 3, "extra_overrides": {"model.hidden": 64, "data.n_features": 20},
              "cpus_per_trial": 2.0, "gpus_per_trial": 0.5, "an_unknown_key": 1}
    settings = SweepSettings.from_record(record)
    assert settings.model_params == {"hidden": 64}
    assert settings.data_params == {"n_features": 20}
    assert (settings.resources.cpus_per_trial, settings.resources.gpus_per_trial) == (2.0, 0.5)
    assert settings.config_overrides()["model"] == {"params": {"hidden": 64}}
    again = SweepSettings.from_record(settings.to_record())
    assert again == settings
