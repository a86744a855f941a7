"""Tests of raysearch.tune.spaces: bundled YAML search spaces, Optuna define-by-run, validation."""

import math
import re
import subprocess
import sys
import warnings
from pathlib import Path

import optuna
import pytest

from raysearch.config import TRAIN_KEYS, RunConfig
from raysearch.losses import available_losses, build_loss
from raysearch.tune.recipes import apply_recipe, default_recipe, load_recipe
from raysearch.tune.spaces import (
    SearchSpace,
    SpaceError,
    available_spaces,
    load_space,
    validate_space,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)

SINGLE = ["ce", "ls", "focal", "flsd", "mbls", "acls", "ecp", "als", "sbece", "savuc", "avuc",
          "avuc_gs", "mmce", "mdca", "cpc", "crl"]
# the training keys the digits recipe sets (the schedule and mixing keys keep their defaults)
DIGITS_TRAIN = {"epochs", "batch_size", "lr", "momentum", "weight_decay"}


def _on_digits(name: str) -> SearchSpace:
    """Bundled space `name` as a digits sweep trains it: with the recipe `digits`."""
    return apply_recipe(load_space(name), load_recipe("digits"))


def _with_default_recipe(name: str, dataset: str) -> SearchSpace:
    """Bundled space `name` with the recipe a sweep on `dataset` takes by default."""
    space = load_space(name)
    recipe, _ = default_recipe(space.methods, dataset)
    assert recipe is not None, (name, dataset)
    return apply_recipe(space, recipe)


def _ask(space: SearchSpace, seed: int = 0, sampler=None):
    study = optuna.create_study(sampler=sampler or optuna.samplers.RandomSampler(seed=seed))
    trial = study.ask()
    fixed = space.define_by_run(trial)
    return study, trial, fixed


def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------
# Bundled spaces
# --------------------------------------------------------------------------------------------


#: segmentation spaces (PASCAL VOC, the MbLS/ACLS protocol) and the centre of each range
SEGMENTATION = {"voc_ce": {}, "voc_ls": {"epsilon": 0.1}, "voc_focal": {"gamma": 3.0},
                "voc_mbls": {"margin": 10.0}, "voc_acls": {"margin": 10.0, "lambda1": 0.1,
                                                           "lambda2": 0.01}}


#: text spaces (20 Newsgroups, MbLS App. B) and the centre of each range
TEXT = {"ng_ce": {}, "ng_ls": {"epsilon": 0.05}, "ng_focal": {"gamma": 3.0},
        "ng_mbls": {"margin": 6.0}}


def test_available_spaces_lists_every_bundled_file():
    assert available_spaces() == sorted([*SINGLE, *SEGMENTATION, *TEXT, "all", "posthoc"])
    assert available_spaces("train") == sorted([*SINGLE, *SEGMENTATION, *TEXT, "all"])


@pytest.mark.parametrize("name", sorted(TEXT))
def test_text_spaces_follow_the_paper(name):
    import yaml

    assert not load_space(name).train_values("epochs")  # the protocol is the recipe's
    space = _with_default_recipe(name, "newsgroups20")
    assert space.recipe == "mbls-20ng"
    # MbLS App. B: GPool-CNN, Adam lr 1e-3 (ce: searched around it), 100 epochs, x0.1 after 50
    assert space.train_values("model") == ("gpool_cnn",)
    assert space.train_values("optimizer") == ("adam",)
    assert space.train_values("epochs") == (100,)
    assert space.train_values("milestones") == ("50",)
    lr = space.train_values("optimizer.lr") or space.train_values("lr")
    assert math.sqrt(lr[0] * lr[-1]) == pytest.approx(0.001)
    assert (len(lr) == 2) == (name == "ng_ce")  # ce searches the lr: it has no loss parameter
    params = yaml.safe_load((Path(__file__).parents[1] / "search_spaces" /
                             f"{name}.yaml").read_text())["params"]
    for key, centre in TEXT[name].items():
        spec = params[key]
        mid = (math.sqrt(spec["low"] * spec["high"]) if spec.get("log")
               else (spec["low"] + spec["high"]) / 2)
        assert mid == pytest.approx(centre), key


@pytest.mark.parametrize("name", sorted(SEGMENTATION))
def test_segmentation_spaces_follow_the_papers(name):
    import yaml

    assert not load_space(name).train_values("epochs")  # the protocol is the recipe's
    space = _with_default_recipe(name, "voc")
    assert space.recipe in ("acls-voc", "mbls-voc")
    # MbLS App. B / ACLS Sec. 4.1: DeepLabV3-ResNet-50, SGD lr 1e-2 (ce: searched around it),
    # batch 8, 100 epochs, lr / 10 at 40 and 80 (crops of 512: the voc loader's default)
    assert space.train_values("model") == ("deeplabv3_resnet50",)
    assert space.train_values("batch_size") == (8,)
    assert space.train_values("epochs") == (100,)
    assert space.train_values("milestones") == ("40,80",)
    lr = space.train_values("optimizer.lr") or space.train_values("lr")
    assert math.sqrt(lr[0] * lr[-1]) == pytest.approx(0.01)
    assert (len(lr) == 2) == (name == "voc_ce")
    # every loss range is centred on the papers' setting (geometric centre of a log range)
    params = yaml.safe_load((Path(__file__).parents[1] / "search_spaces" /
                             f"{name}.yaml").read_text())["params"]
    for key, centre in SEGMENTATION[name].items():
        spec = params[key]
        low, high = spec["low"], spec["high"]
        mid = math.sqrt(low * high) if spec.get("log") else (low + high) / 2
        assert mid == pytest.approx(centre), key


@pytest.mark.parametrize("name", sorted([*SINGLE, "all"]))
def test_bundled_space_loads_and_validates(name):
    space = validate_space(name)
    assert space.name == name
    assert space.path.name == f"{name}.yaml"
    assert space.description
    assert load_space(name) is space  # cached per file
    assert load_space(space.path) is space  # same file by path
    if name == "all":
        assert space.conditional
        assert space.methods == SINGLE
    else:
        assert not space.conditional
        assert space.methods == [name]
    assert set(space.methods) <= set(available_losses())


def test_unknown_bundled_name_lists_available():
    pattern = r"unknown search space 'aclss'; available: acls, all, als, avuc"
    with pytest.raises(SpaceError, match=pattern):
        load_space("aclss")


def test_missing_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_space(tmp_path / "nope.yaml")


def test_bundled_ranges_follow_the_papers():
    acls = _on_digits("acls")
    flat = {"margin": 6.0, "lambda1": 0.1, "lambda2": 0.01, "lr": 0.1}
    config = acls.resolve(flat)
    assert config.loss.params == {
        "margin": 6.0,
        "lambda1": 0.1,
        "lambda2": 0.01,
        "variant": "official",
    }
    assert (config.optimizer.params["momentum"], config.optimizer.weight_decay,
            config.batch_size, config.epochs) == (0.9, 5e-4, 64, 10)
    flsd = load_space("flsd").resolve({})
    assert flsd.loss.params == {"threshold": 0.2, "gamma_high": 5.0, "gamma_low": 3.0}
    assert load_space("mbls").resolve({"margin": 10.0}).loss.params["alpha"] == 0.1


# --------------------------------------------------------------------------------------------
# define_by_run with real Optuna trials
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SINGLE)
def test_define_by_run_returns_only_fixed_values(name):
    space = _on_digits(name)
    for seed in range(5):
        _, trial, fixed = _ask(space, seed=seed)
        assert fixed["method"] == name
        assert not set(fixed) & set(trial.params), "a sampled value was returned as fixed"
        for key, value in fixed.items():
            assert isinstance(value, (str, int, float, bool)), (key, value)
        # every sampled value lies in its recorded distribution (a real Optuna check)
        for key, value in trial.params.items():
            dist = trial.distributions[key]
            assert dist._contains(dist.to_internal_repr(value)), (key, value, dist)
        assert set(trial.params) | set(fixed) >= {"lr", "momentum", "weight_decay"}


def test_define_by_run_acls_ranges_and_names():
    space = _on_digits("acls")
    values = {"margin": [], "lambda1": [], "lambda2": [], "lr": []}
    for seed in range(20):
        _, trial, fixed = _ask(space, seed=seed)
        assert set(trial.params) == {"margin", "lambda1", "lambda2", "lr"}
        assert fixed == {
            "method": "acls",
            "variant": "official",
            "momentum": 0.9,
            "weight_decay": 5e-4,
            "batch_size": 64,
            "epochs": 10,
        }
        for key in values:
            values[key].append(trial.params[key])
    assert all(6.0 <= v <= 10.0 for v in values["margin"])
    assert all(0.01 <= v <= 0.3 for v in values["lambda1"])
    assert all(0.001 <= v <= 0.03 for v in values["lambda2"])
    assert all(0.01 <= v <= 0.2 for v in values["lr"])
    _, trial, _ = _ask(space)
    assert trial.distributions["lambda1"] == optuna.distributions.FloatDistribution(
        0.01, 0.3, log=True
    )
    assert trial.distributions["margin"] == optuna.distributions.FloatDistribution(6.0, 10.0)


@pytest.mark.parametrize("name", SINGLE)
def test_resolve_builds_a_run_config_whose_loss_builds(name):
    space = _on_digits(name)
    for seed in range(3):
        _, trial, fixed = _ask(space, seed=seed)
        flat = {**fixed, **trial.params, "seed": 7, "dataset": "digits", "ece_bins": 10}
        config = space.resolve(flat, {"epochs": 3})
        assert isinstance(config, RunConfig)
        assert config.loss.name == name
        assert config.epochs == 3  # override beats the fixed value
        assert (config.seed, config.ece_bins) == (7, 10)  # extras pass through
        assert config.optimizer.lr == trial.params["lr"]
        build_loss(config.loss.name, **config.loss.params)
        params = space.plain_params(flat)
        assert params["method"] == name
        assert set(params) == {"method", *config.loss.params, *DIGITS_TRAIN}
        assert "seed" not in params


def test_resolve_places_the_suggestion_and_rejects_unknown_keys():
    space = _on_digits("focal")
    flat = {"gamma": 2.0, "lr": 0.05}
    assert space.resolve(flat).epochs == 10
    # the settings' sections replace the space's values, key by key
    config = space.resolve(flat, {"epochs": 4, "optimizer": {"params": {"nesterov": True}}})
    assert (config.epochs, config.optimizer.lr) == (4, 0.05)
    assert config.optimizer.params == {"momentum": 0.9, "nesterov": True}
    with pytest.raises(ValueError, match="unknown run-config key"):
        space.resolve({**flat, "bogus": 1})
    with pytest.raises(SpaceError, match="no sampled parameter 'gamma'"):
        space.resolve({"lr": 0.05})
    with pytest.raises(SpaceError, match="does not match"):
        space.resolve({**flat, "method": "acls"})


def test_all_samples_every_method_with_prefixed_names():
    space = load_space("all")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(60):
        trial = study.ask()
        fixed = space.define_by_run(trial)
        method = trial.params["method"]
        seen.add(method)
        loss_keys = [k for k in {**trial.params, **fixed} if k not in {"method", *TRAIN_KEYS}]
        assert all(k.startswith(f"{method}.") for k in loss_keys), (method, loss_keys)
        assert "method" not in fixed
        assert not set(fixed) & set(trial.params)
        config = space.resolve({**fixed, **trial.params})
        assert config.loss.name == method
        assert all("." not in k for k in config.loss.params)
        build_loss(config.loss.name, **config.loss.params)
        plain = space.plain_params({**fixed, **trial.params})
        assert plain["method"] == method
        assert all("." not in k for k in plain)
        study.tell(trial, 0.5)
    assert seen == set(SINGLE)


def test_all_fixed_values_only_of_the_chosen_branch():
    space = load_space("all")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(40):
        trial = study.ask()
        fixed = space.define_by_run(trial)
        method = trial.params["method"]
        prefixes = {k.split(".")[0] for k in fixed if "." in k}
        assert prefixes <= {method}
        if method == "flsd":
            assert fixed["flsd.gamma_high"] == 5.0
        if method == "acls":
            assert fixed["acls.variant"] == "official"
            assert 6.0 <= trial.params["acls.margin"] <= 10.0


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.parametrize("multivariate", [False, True])
def test_all_with_tpe_has_no_distribution_conflict(multivariate):
    space = load_space("all")
    sampler = optuna.samplers.TPESampler(
        seed=0, n_startup_trials=5, multivariate=multivariate, group=multivariate
    )
    study = optuna.create_study(sampler=sampler)
    for i in range(60):
        trial = study.ask()
        space.define_by_run(trial)
        study.tell(trial, float(i % 7))
    assert len(study.trials) == 60
    assert {t.params["method"] for t in study.trials} <= set(SINGLE)
    assert len({t.params["method"] for t in study.trials}) >= 10
    # multi-objective, as the sweep runs it
    study = optuna.create_study(
        directions=["maximize", "minimize"], sampler=optuna.samplers.NSGAIISampler(seed=0)
    )
    for i in range(12):
        trial = study.ask()
        space.define_by_run(trial)
        study.tell(trial, [0.9, 0.01 * i])


def test_describe_lists_every_parameter():
    text = _on_digits("all").describe()
    for name in ("method", "acls.margin", "acls.lambda1", "mbls.alpha", "ls.epsilon", "lr"):
        assert re.search(rf"^\s+{re.escape(name)}\s", text, re.M), name
    assert re.search(r"acls\.lambda1\s+float\s+\[0\.01, 0\.3\]\s+log", text)
    text = load_space("acls").describe()
    assert re.search(r"^\s+variant\s+fixed\s+official", text, re.M)
    assert "acls.margin" not in text


def test_module_imports_no_ray_or_mlflow():
    code = ("import sys, raysearch.tune.spaces; "
            "print(any(m in sys.modules for m in ('ray', 'mlflow')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# Format rules
# --------------------------------------------------------------------------------------------

TRAIN = "train: {lr: 0.1}\n"


def test_int_rule_and_yaml12_floats(tmp_path):
    path = _write(
        tmp_path,
        "method: acls\nparams:\n  margin: {low: 6, high: 10, type: float}\n"
        "train:\n  epochs: {low: 2, high: 4}\n  batch_size: {choices: [32, 64]}\n"
        "  weight_decay: 1e-4\n  lr: {low: 0.01, high: 0.1, step: 0.01}\n",
        "rules.yaml",
    )
    space = load_space(path)
    _, trial, fixed = _ask(space)
    assert isinstance(trial.distributions["epochs"], optuna.distributions.IntDistribution)
    assert isinstance(trial.distributions["margin"], optuna.distributions.FloatDistribution)
    assert trial.distributions["lr"].step == pytest.approx(0.01)
    assert fixed["weight_decay"] == 1e-4  # 1e-4 is a float, not the string "1e-4"


def test_int_bounds_for_a_float_parameter_warn(tmp_path):
    path = _write(tmp_path, f"method: mbls\nparams:\n  margin: {{low: 6, high: 10}}\n{TRAIN}")
    with pytest.warns(UserWarning, match=r"params\.margin: both bounds are integers"):
        space = load_space(path)
    _, trial, _ = _ask(space)
    assert isinstance(trial.distributions["margin"], optuna.distributions.IntDistribution)


def test_user_all_yaml_uses_sibling_branch_files(tmp_path):
    _write(tmp_path, f"method: ls\nparams:\n  epsilon: {{low: 0.1, high: 0.1}}\n{TRAIN}", "ls.yaml")
    path = _write(tmp_path, f"methods: [ls, ce]\n{TRAIN}", "mine.yaml")
    space = load_space(path)
    assert space.methods == ["ls", "ce"]
    assert "[0.1, 0.1]" in space.describe()  # the sibling ls.yaml, not the bundled one


# --------------------------------------------------------------------------------------------
# Errors: one line naming the file and the key path
# --------------------------------------------------------------------------------------------

ERROR_CASES = {
    "malformed_yaml": (
        "method: acls\nparams:\n  margin: {low: 6.0, high: 10.0\n",
        r"bad\.yaml: malformed YAML at line \d+, column \d+",
    ),
    "duplicate_key": (
        "method: acls\nparams:\n  margin: 6.0\n  margin: 7.0\n",
        r"bad\.yaml: malformed YAML at line 4.*duplicate key 'margin'",
    ),
    "low_gt_high": (
        "method: acls\nparams:\n  margin: {low: 10.0, high: 6.0}\n",
        r"bad\.yaml: params\.margin: low \(10\.0\) must be <= high \(6\.0\)",
    ),
    "unknown_spec_key": (
        "method: acls\nparams:\n  margin: {low: 6.0, hi: 10.0}\n",
        r"bad\.yaml: params\.margin: unknown key\(s\) hi \(did you mean high\?\); "
        r"allowed: type, low, high",
    ),
    "unknown_top_level_key": (
        "method: acls\nparms:\n  margin: 6.0\n",
        r"bad\.yaml: unknown top-level key\(s\) parms \(did you mean params\?\); "
        r"allowed: method, description, params",
    ),
    "unknown_method": (
        "method: aclss\n",
        r"bad\.yaml: method: unknown method 'aclss' \(did you mean acls, als\?\); available: "
        r"acls, als, avuc, avuc_gs, ce, cpc, crl, ecp, flsd, focal, ls, mbls, mdca, mmce, savuc, "
        r"sbece "
        r"\(built-in\)",
    ),
    "unknown_loss_param": (
        "method: acls\nparams:\n  lambda3: 0.1\n",
        r"bad\.yaml: params\.lambda3: loss 'acls' has no parameter 'lambda3'; "
        r"accepted: margin, lambda1, lambda2, variant",
    ),
    "negative_margin": (
        "method: mbls\nparams:\n  margin: {low: -1.0, high: 10.0}\n",
        r"bad\.yaml: params\.margin: `margin` must be >= 0",
    ),
    "epsilon_one": (
        "method: ls\nparams:\n  epsilon: {choices: [0.1, 1.0]}\n",
        r"bad\.yaml: params\.epsilon: `epsilon` must be .*got 1\.0",
    ),
    "bad_variant": (
        "method: acls\nparams:\n  variant: oficial\n",
        r"bad\.yaml: params\.variant: `variant` must be one of",
    ),
    "log_low_zero": (
        "method: acls\nparams:\n  lambda1: {low: 0.0, high: 0.3, log: true}\n",
        r"bad\.yaml: params\.lambda1: log scale needs low > 0, got low \(0\.0\)",
    ),
    "log_with_step": (
        "method: acls\nparams:\n  lambda1: {low: 0.1, high: 0.3, log: true, step: 0.1}\n",
        r"bad\.yaml: params\.lambda1: log and step cannot be combined",
    ),
    "missing_high": (
        "method: acls\nparams:\n  margin: {low: 6.0}\n",
        r"bad\.yaml: params\.margin: missing high",
    ),
    "empty_choices": (
        "method: acls\nparams:\n  margin: {choices: []}\n",
        r"bad\.yaml: params\.margin: `choices` must not be empty",
    ),
    "bare_list": (
        "method: acls\nparams:\n  margin: [6.0, 10.0]\n",
        r"bad\.yaml: params\.margin: a list is not a spec",
    ),
    "step_not_dividing": (
        "method: acls\nparams:\n  margin: {low: 6.0, high: 10.0, step: 3.0}\n",
        r"bad\.yaml: params\.margin: high - low \(10\.0 - 6\.0\) must be a multiple of step",
    ),
    "int_type_fractional_bound": (
        "method: acls\nparams:\n  margin: {low: 6.5, high: 10, type: int}\n",
        r"bad\.yaml: params\.margin: low must be an integer for `type: int`",
    ),
    "unknown_train_key": (
        "method: ce\ntrain:\n  learning_rate: 0.1\n",
        r"bad\.yaml: train\.learning_rate: unknown training key 'learning_rate'; "
        r"allowed: model, epochs",
    ),
    "lr_not_positive": (
        "method: ce\ntrain:\n  lr: {low: 0.0, high: 0.1}\n",
        r"bad\.yaml: train\.lr: `lr` must be > 0, got 0\.0",
    ),
    "momentum_choice_out_of_range": (
        "method: ce\ntrain:\n  momentum: {choices: [0.9, 1.0]}\n",
        r"bad\.yaml: train\.momentum: `momentum` must be in \[0, 1\)",
    ),
    "weight_decay_string": (
        "method: ce\ntrain:\n  weight_decay: small\n",
        r"bad\.yaml: train\.weight_decay: `weight_decay` must be a number",
    ),
    "both_method_and_methods": (
        "method: ce\nmethods: [ce]\n",
        r"bad\.yaml: give exactly one of `method`",
    ),
    "empty_file": ("", r"bad\.yaml: empty file"),
    "methods_unknown": (
        "methods: [ce, nope]\n",
        r"bad\.yaml: methods: unknown method 'nope'",
    ),
    "methods_duplicate": ("methods: [ce, ce]\n", r"bad\.yaml: methods: 'ce' is listed twice"),
    "all_bad_train": (
        "methods: [ce, acls]\ntrain:\n  epochs: 0\n",
        r"bad\.yaml: train\.epochs: `epochs` must be >= 1, got 0",
    ),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_names_file_and_key(tmp_path, case):
    text, pattern = ERROR_CASES[case]
    path = _write(tmp_path, text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(SpaceError, match=pattern) as info:
            load_space(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))


def test_error_in_branch_file_names_both_files(tmp_path):
    _write(tmp_path, "method: acls\nparams:\n  margin: {low: 10.0, high: 6.0}\n", "acls.yaml")
    path = _write(tmp_path, "methods: [ce, acls]\n", "mine.yaml")
    with pytest.raises(
        SpaceError,
        match=r"mine\.yaml: methods\.acls: acls\.yaml: params\.margin: low \(10\.0\) must be <=",
    ):
        load_space(path)


def test_branch_file_declaring_another_method(tmp_path):
    _write(tmp_path, "method: ce\n", "ls.yaml")
    path = _write(tmp_path, "methods: [ls]\n", "mine.yaml")
    with pytest.raises(SpaceError, match=r"mine\.yaml: methods\.ls: ls\.yaml declares method 'ce'"):
        load_space(path)


def test_cache_sees_edited_file(tmp_path):
    path = _write(tmp_path, f"method: ls\nparams:\n  epsilon: 0.1\n{TRAIN}", "ls.yaml")
    first = load_space(path)
    assert load_space(path) is first
    path.write_text(f"method: ls\nparams:\n  epsilon: {{low: 0.2, high: 0.9}}\n{TRAIN}")
    second = load_space(path)
    assert second is not first
    assert "[0.2, 0.9]" in second.describe()


def test_schedule_and_mixing_keys_in_a_space(tmp_path):
    path = tmp_path / "cifar.yaml"
    path.write_text(
        "method: ce\n"
        "train:\n"
        "  model: resnet20\n"
        "  schedule: multistep\n"
        "  milestones: \"150,250\"   # MbLS App. B\n"
        "  lr_decay: 0.1\n"
        "  warmup_epochs: 5\n"
        "  nesterov: true\n"
        "  mixup_alpha: {low: 0.0, high: 0.4}\n"
        "  cutmix_alpha: {choices: [0.0, 1.0]}\n"
        "  epochs: 350\n")
    space = load_space(path)
    config = space.resolve({"method": "ce", "mixup_alpha": 0.2, "cutmix_alpha": 1.0})
    assert config.milestone_epochs() == [150, 250]
    assert (config.schedule.name, config.schedule.warmup_epochs,
            config.optimizer.params["nesterov"]) == ("multistep", 5, True)
    assert (config.mixup_alpha, config.cutmix_alpha, config.model.name) == (0.2, 1.0, "resnet20")
    assert space.train_values("model") == ("resnet20",)
    assert space.train_values("cutmix_alpha") == (0.0, 1.0)
    assert space.train_values("lr") == ()
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: ce\ntrain:\n  schedule: multistep\n  milestones: \"250,150\"\n")
    with pytest.raises(SpaceError, match=r"train\.\w+: `milestones` must be increasing"):
        load_space(bad)


@pytest.mark.parametrize("name", ["acls", "all", "savuc"])
def test_space_survives_its_json_record(name):
    import json

    space = load_space(name)
    again = SearchSpace.from_dict(json.loads(json.dumps(space.to_dict())))
    assert again.methods == space.methods
    assert again.to_dict() == space.to_dict()
    # the same sampler seed draws the same trials from both
    first = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    second = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(5):
        assert space.define_by_run(first.ask()) == again.define_by_run(second.ask())


def test_malformed_space_record_is_a_space_error():
    with pytest.raises(SpaceError, match="malformed"):
        SearchSpace.from_dict({"name": "x"})
