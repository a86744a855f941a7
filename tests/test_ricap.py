"""RICAP (Takahashi et al. 2018): patching, area-weighted soft targets, the ``ricap_beta`` key."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raysearch.config import RunConfig
from raysearch.tracking import run_params
from raysearch.training.data import load_dataset
from raysearch.training.data.ricap import ricap, ricap_patches
from raysearch.training.mixing import make_mixer
from raysearch.training.run import fit
from raysearch.tune.spaces import load_space

N, K, H, W = 6, 4, 4, 5
LABELS = torch.tensor([0, 1, 2, 3, 1, 2])


def _images():
    """Image i is the constant i (one channel), so each patch shows which image it came from."""
    return torch.arange(N, dtype=torch.float32).reshape(N, 1, 1, 1).expand(N, 1, H, W).clone()


def test_fixed_boundary_areas_and_soft_targets_by_hand():
    # boundary (w, h) = (3, 1) on a 4 x 5 (H x W) image: regions
    #   top-left 3 x 1 = 3, top-right (5 - 3) x 1 = 2, bottom-left 3 x (4 - 1) = 9,
    #   bottom-right 2 x 3 = 6; 3 + 2 + 9 + 6 = 20 = H * W
    # weights = areas / 20 = (0.15, 0.10, 0.45, 0.30)
    generator = torch.Generator().manual_seed(0)
    mixed, weights, patch_labels = ricap_patches(_images(), LABELS, 0.3, generator=generator,
                                                 boundary=(3, 1))
    torch.testing.assert_close(weights, torch.tensor([0.15, 0.10, 0.45, 0.30]))
    regions = [(slice(0, 1), slice(0, 3)), (slice(0, 1), slice(3, 5)),
               (slice(1, 4), slice(0, 3)), (slice(1, 4), slice(3, 5))]
    assert sum(mixed[0, 0][r].numel() for r in regions) == H * W
    generator = torch.Generator().manual_seed(0)
    same, soft = ricap(_images(), LABELS, 0.3, K, generator=generator, boundary=(3, 1))
    assert torch.equal(same, mixed)
    for i in range(N):
        expected = torch.zeros(K)
        for k, region in enumerate(regions):
            patch = mixed[i, 0][region]
            source = int(patch[0, 0])
            assert (patch == source).all()  # one source image per region
            assert LABELS[source] == patch_labels[k, i]
            expected[LABELS[source]] += patch.numel() / (H * W)
        torch.testing.assert_close(soft[i], expected)
    torch.testing.assert_close(soft.sum(dim=1), torch.ones(N))


def test_drawn_boundary_is_deterministic_given_the_generator():
    runs = [ricap(_images(), LABELS, 0.3, K, generator=torch.Generator().manual_seed(s))
            for s in (5, 5, 6)]
    assert torch.equal(runs[0][0], runs[1][0])
    assert torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][0], runs[2][0])
    generator = torch.Generator().manual_seed(6)
    _, weights, _ = ricap_patches(_images(), LABELS, 0.3, generator=generator)
    # areas are whole pixels: weights * H * W are integers summing to H * W
    areas = weights * H * W
    torch.testing.assert_close(areas, areas.round())
    assert areas.sum().item() == pytest.approx(H * W)
    # the two weights of each row of regions have the same height, of each column the same width
    assert areas[0] * areas[3] == pytest.approx(areas[1] * areas[2])


def test_ce_on_the_soft_targets_is_the_area_weighted_loss():
    # the loop trains on sum_k W_k * loss(logits, c_k); for CE that is CE with the soft target
    torch.manual_seed(0)
    logits = torch.randn(N, K)
    generator = torch.Generator().manual_seed(1)
    _, weights, patch_labels = ricap_patches(_images(), LABELS, 0.3, generator=generator)
    _, soft = ricap(_images(), LABELS, 0.3, K, generator=torch.Generator().manual_seed(1))
    weighted = sum(w * F.cross_entropy(logits, c) for w, c in zip(weights, patch_labels,
                                                                   strict=True))
    torch.testing.assert_close(weighted, F.cross_entropy(logits, soft))


def test_bad_input():
    with pytest.raises(ValueError, match=r"RICAP needs image batches \(N, C, H, W\), got \(6, 5\)"):
        ricap_patches(torch.zeros(N, 5), LABELS, 0.3)
    with pytest.raises(ValueError, match="`beta` must be a number > 0, got 0"):
        ricap_patches(_images(), LABELS, 0)
    with pytest.raises(ValueError, match="`boundary`"):
        ricap_patches(_images(), LABELS, 0.3, boundary=(6, 1))
    with pytest.raises(ValueError, match="ricap_beta"):
        RunConfig(ricap_beta=-0.3)


def test_mixer_gives_patch_weights_and_labels():
    assert make_mixer(RunConfig(), K) is None
    torch.manual_seed(0)
    mixed, weights, patch_labels = make_mixer(RunConfig(ricap_beta=0.3), K)(_images(), LABELS)
    assert mixed.shape == (N, 1, H, W)
    assert patch_labels.shape == (4, N)
    assert weights.sum().item() == pytest.approx(1.0)


class _Recorder(nn.Module):
    """Cross-entropy that counts its calls (one per label set of a batch)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, logits, targets):
        self.calls += 1
        return F.cross_entropy(logits, targets)


def test_searchable_ricap_beta_reaches_training(tmp_path):
    path = tmp_path / "ricap.yaml"
    path.write_text("method: ce\ntrain:\n  ricap_beta: {choices: [0.0, 0.3]}\n  epochs: 1\n"
                    "  batch_size: 256\n  lr: 0.05\n")
    space = load_space(path)
    assert space.train_values("ricap_beta") == (0.0, 0.3)
    digits = load_dataset("digits", seed=0)
    batches = -(-len(digits.train) // 256)
    calls = {}
    for beta in (0.0, 0.3):
        cfg = space.resolve({"ricap_beta": beta})
        assert cfg.ricap_beta == beta
        recorder = _Recorder()
        fit(cfg, data=digits, loss=recorder)
        calls[beta] = recorder.calls
    # off: one loss per batch; RICAP: one per patch with a non-zero area (1 to 4 per batch)
    assert calls[0.0] == batches
    assert batches < calls[0.3] <= 4 * batches
    assert run_params(cfg)["ricap_beta"] == 0.3
    assert "ricap_beta" not in run_params(RunConfig())
