"""Interleaved training (Karandikar et al., App. B) in raysearch.training.run.fit."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from compare import assert_same_metrics
from torch import nn
from torch.utils.data import TensorDataset

from raysearch.config import RunConfig
from raysearch.losses.penalties import ConfidencePenalty
from raysearch.metrics import ESTIMATOR_KEYS, TABLE_KEYS
from raysearch.training.data import DatasetSplits
from raysearch.training.interleaving import interleave_split
from raysearch.training.run import fit

SUMMARY = ("accuracy", "ece", "aece", "cece", "mce", "nll", "brier")
FINAL_KEYS = {"train_loss", "train_accuracy"} | {
    f"{split}_{k}" for split in ("val", "test") for k in (*SUMMARY, *ESTIMATOR_KEYS, *TABLE_KEYS)
}


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class _Recorded(dict):
    """The dict returned by ``terms``: logs which term the training loop reads, and on what."""

    def __init__(self, log, targets, **terms):
        super().__init__(**terms)
        self._log = log
        self._targets = targets

    def __getitem__(self, key):
        self._log.append((key, self._targets.clone()))
        return super().__getitem__(key)


class PrimarySecondary(nn.Module):
    """Stand-in for a soft-calibration loss: CE + beta * mean confidence."""

    def __init__(self, beta=0.5):
        super().__init__()
        self.beta = beta
        self.log = []

    def terms(self, logits, targets):
        primary = F.cross_entropy(logits, targets)
        secondary = torch.softmax(logits, dim=1).amax(dim=1).mean()
        total = primary + self.beta * secondary
        return _Recorded(self.log, targets, primary=primary, secondary=secondary, total=total)

    def forward(self, logits, targets):
        return self.terms(logits, targets)["total"]


def _toy(n_train=90):
    gen = torch.Generator().manual_seed(0)

    def split(n):
        y = torch.arange(n) % 3
        x = torch.randn(n, 2, 4, 4, generator=gen) + y.view(-1, 1, 1, 1).float()
        return TensorDataset(x, y)

    return DatasetSplits(split(n_train), split(30), split(30), 3, (2, 4, 4), "toy")


def _cfg(fraction=0.2, **kwargs):
    """An interleaved run of the mlp; `kwargs` are sections or run fields."""
    kwargs = {"epochs": 2, "model": {"name": "mlp"}, "batch_size": 16, **kwargs}
    cfg = RunConfig(**kwargs)
    cfg.interleaved = True  # assignments are checked as the constructor checks
    cfg.interleave_fraction = fraction
    return cfg


@pytest.fixture
def stand_in(monkeypatch):
    loss = PrimarySecondary(beta=0.5)
    return loss


def test_epoch_is_primary_then_secondary(stand_in):
    # 90 samples, fraction 0.2: held-out 18 (6 per class), majority 72; batch 16:
    # majority batches 16, 16, 16, 16, 8 (primary) then held-out 16, 2 (secondary), per epoch
    data = _toy()
    result = fit(_cfg(), data=data, loss=stand_in)
    assert set(result.metrics) == FINAL_KEYS
    keys = [key for key, _ in stand_in.log]
    sizes = [len(t) for _, t in stand_in.log]
    assert keys == (["primary"] * 5 + ["secondary"] * 2) * 2
    assert sizes == [16, 16, 16, 16, 8, 16, 2] * 2
    # each part is stratified: the majority sees 24 samples of each class, held-out 6
    for epoch in range(2):
        calls = stand_in.log[epoch * 7 : (epoch + 1) * 7]
        majority = torch.cat([t for key, t in calls if key == "primary"])
        held_out = torch.cat([t for key, t in calls if key == "secondary"])
        assert torch.bincount(majority).tolist() == [24, 24, 24]
        assert torch.bincount(held_out).tolist() == [6, 6, 6]


def test_default_fraction_and_determinism(stand_in):
    # interleave_fraction 0.1 of 90 -> 9 held out (3 per class): batches 16 x 5 + 1, then 9
    data = _toy()
    first = fit(_cfg(fraction=0.1, epochs=1), data=data, loss=stand_in)
    sizes = [len(t) for _, t in stand_in.log]
    assert sizes == [16, 16, 16, 16, 16, 1, 9]
    second = fit(_cfg(fraction=0.1, epochs=1), data=data, loss=stand_in)
    assert_same_metrics(second.metrics, first.metrics)


def test_resume_is_exact(stand_in):
    data = _toy()
    states = {}
    straight = fit(
        _cfg(), data=data, on_epoch=lambda e, m, s: states.setdefault(e, s), loss=stand_in
    )
    resumed = fit(_cfg(), data=data, resume=states[1], loss=stand_in)
    assert_same_metrics(resumed.metrics, straight.metrics)
    np.testing.assert_array_equal(resumed.test_logits, straight.test_logits)


def test_interleaved_false_is_the_plain_loop():
    data = _toy()
    plain = fit(RunConfig(loss={"name": "ce"}, model={"name": "mlp"}, epochs=1, batch_size=16),
                data=data)
    cfg = RunConfig(loss={"name": "ce"}, model={"name": "mlp"}, epochs=1, batch_size=16)
    cfg.interleaved = False  # explicit False is the plain loop
    assert_same_metrics(fit(cfg, data=data).metrics, plain.metrics)


def test_secondary_step_is_beta_weighted(monkeypatch):
    # with beta = 0 (and no momentum or weight decay) the held-out steps have zero gradient and
    # cannot move the weights, so what the secondary term is does not matter; with beta > 0 it does
    class Opposite(PrimarySecondary):
        def terms(self, logits, targets):
            parts = super().terms(logits, targets)
            return {**parts, "secondary": 1 - 3 * dict.__getitem__(parts, "secondary")}

    def run(loss):
        cfg = _cfg(epochs=1, optimizer={"weight_decay": 0.0, "params": {"momentum": 0.0}})
        return fit(cfg, data=_toy(), loss=loss).metrics

    zero, zero_opposite = run(PrimarySecondary(beta=0.0)), run(Opposite(beta=0.0))
    assert {k: v for k, v in zero.items() if k != "train_loss"} == {
        k: v for k, v in zero_opposite.items() if k != "train_loss"
    }
    assert run(PrimarySecondary(beta=0.5)) != run(Opposite(beta=0.5))


def test_split_is_stratified_seeded_and_disjoint():
    labels = np.repeat(np.arange(4), 25)  # 100 samples, 25 per class
    majority, held_out = interleave_split(labels, 0.2, seed=3)
    assert len(held_out) == 20
    assert len(majority) == 80
    assert set(majority.tolist()).isdisjoint(held_out.tolist())
    assert sorted(majority.tolist() + held_out.tolist()) == list(range(100))
    assert np.bincount(labels[held_out.numpy()]).tolist() == [5, 5, 5, 5]
    again, _ = interleave_split(labels, 0.2, seed=3)
    assert torch.equal(again, majority)
    other, _ = interleave_split(labels, 0.2, seed=4)
    assert not torch.equal(other, majority)


def test_split_too_small():
    with pytest.raises(ValueError, match="interleave_fraction"):
        interleave_split(np.array([0, 0, 1, 1, 2, 2]), 0.2, seed=0)


def test_needs_primary_and_secondary():
    data = _toy()
    with pytest.raises(ValueError, match=r"interleaved training needs a primary \+ secondary"):
        fit(_cfg(loss={"name": "ce"}), data=data)


def test_terms_without_primary_and_secondary(monkeypatch):
    # ecp has terms() and beta, but its terms are "ce" and "entropy"
    with pytest.raises(ValueError, match=r"needs a primary \+ secondary.*'ce', 'entropy'"):
        fit(_cfg(), data=_toy(), loss=ConfidencePenalty())


def test_detached_term_rejected(monkeypatch):
    class Detached(PrimarySecondary):
        def terms(self, logits, targets):
            return {key: value.detach() for key, value in super().terms(logits, targets).items()}

    with pytest.raises(ValueError, match="carries no gradient"):
        fit(_cfg(), data=_toy(), loss=Detached())


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.5, True, "0.1"])
def test_bad_fraction(stand_in, fraction):
    with pytest.raises(ValueError, match="interleave_fraction"):
        fit(_cfg(fraction=fraction), data=_toy(), loss=stand_in)
