"""``compile: true`` (``RunConfig.compile``): torch.compile of the model and the loss.

A real Inductor compilation on the CPU (the machine's C++ compiler): the compiled run trains the
same numbers as the eager one up to floating-point rounding, keeps the uncompiled parameter
names, and reports the time spent compiling as ``compile_seconds``; a space that samples the key
hands each trial's value to its run config.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from raysearch.config import RunConfig
from raysearch.tracking.runs import METRIC_PREFIXES
from raysearch.training.compiled import COMPILE_SECONDS
from raysearch.training.run import fit
from raysearch.tune.spaces import TrialConfigs, space_from_dict


def test_compile_is_a_switch_in_both_layouts():
    assert RunConfig().compile is False
    assert RunConfig.from_dict({"compile": True}).compile is True
    assert RunConfig.from_dict({"method": "ce", "compile": True}).compile is True  # flat
    assert RunConfig(compile=True).to_dict()["compile"] is True
    with pytest.raises(ValueError, match=r"^`compile` must be true or false, got 'yes'$"):
        RunConfig(compile="yes")


def test_a_space_hands_each_trial_its_compile_value():
    space = space_from_dict({"method": "ce", "train": {"compile": {"choices": [True, False]}}},
                            "s")
    configs = TrialConfigs(space, {})
    assert configs.resolve({"method": "ce", "compile": True}).compile is True
    assert configs.resolve({"method": "ce", "compile": False}).compile is False
    fixed = space_from_dict({"method": "ce", "train": {"compile": True}}, "s")
    assert TrialConfigs(fixed, {}).resolve({"method": "ce"}).compile is True


def test_the_sweep_option_sets_every_trial_and_overrides_the_space():
    from raysearch.cli.commands import sweep
    from raysearch.cli.options import sweep_settings

    space = space_from_dict({"method": "ce", "train": {"compile": True}}, "s")
    seen = {}
    for args in ([], ["--compile"], ["--no-compile"]):
        ctx = sweep.make_context("sweep", ["ce", *args])
        options = {k: v for k, v in ctx.params.items() if k not in ("space", "resume", "dry_run")}
        configs = TrialConfigs(space, sweep_settings(options).config_overrides())
        seen[tuple(args)] = configs.resolve({"method": "ce"}).compile
    assert seen == {(): True, ("--compile",): True, ("--no-compile",): False}
    plain = TrialConfigs(space_from_dict({"method": "ce"}, "s"), {})
    assert plain.resolve({"method": "ce"}).compile is False


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="torch.compile's CPU backend (Inductor) builds C++ kernels and this "
                           "machine has no C++ compiler (c++ or g++); .ci/run's image has one")
def test_a_compiled_run_trains_the_eager_numbers_and_reports_its_compile_time():
    torch.set_num_threads(1)
    cfg = RunConfig(loss={"name": "ls", "params": {"epsilon": 0.1}}, epochs=1, seed=3)
    eager = fit(cfg)
    compiled = fit(cfg.model_copy(update={"compile": True}))

    assert COMPILE_SECONDS not in eager.metrics
    assert COMPILE_SECONDS.startswith(METRIC_PREFIXES)  # a metric MLflow and the table keep
    seconds = compiled.metrics[COMPILE_SECONDS]
    assert math.isfinite(seconds)
    assert seconds > 0
    # nn.Module.compile: the parameter names (and so the checkpoints) are the eager module's
    assert list(compiled.model.state_dict()) == list(eager.model.state_dict())
    assert compiled.model._compiled_call_impl is not None
    for key in ("train_loss", "val_nll", "val_ece", "test_nll", "test_accuracy"):
        a, b = eager.metrics[key], compiled.metrics[key]
        assert b == pytest.approx(a, rel=1e-3, abs=1e-4), key  # kernels sum in another order
    for name, value in eager.model.state_dict().items():
        torch.testing.assert_close(compiled.model.state_dict()[name], value, rtol=1e-3,
                                   atol=1e-4)

    # a second compiled run in the same process (a Ray worker's next trial) compiles afresh
    again = fit(cfg.model_copy(update={"compile": True}))
    assert again.metrics[COMPILE_SECONDS] > 0
    assert again.metrics["val_nll"] == pytest.approx(compiled.metrics["val_nll"], rel=1e-6)
