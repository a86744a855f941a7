"""Training options of issue 8: schedules, warm-up, Nesterov, MixUp/CutMix, precision, devices.

No Ray, no MLflow; digits (bundled) and tiny synthetic image sets, CPU only (the CUDA branches
of the same code run on the lent GPU machines).
"""

import math

import pytest
import torch
from compare import assert_same_metrics
from torchvision.transforms import v2

from raysearch.config import RunConfig
from raysearch.training.data import load_dataset
from raysearch.training.divergence import Guard
from raysearch.training.mixing import make_mixer
from raysearch.training.run import DivergedError, fit
from raysearch.training.run_weights import lr_factor


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def test_cosine_with_warmup_factors():
    cfg = RunConfig(schedule={"warmup_epochs": 2}, epochs=10)
    f = lr_factor(cfg)
    # warm-up: epoch 1 trains at 0.1 of the cosine value (1 at i=0), epoch 2 at 0.1 + 0.9 * 1/2
    assert f(0) == pytest.approx(0.1)
    assert f(1) == pytest.approx(0.55)
    # then cosine over the remaining 8 epochs: i = 2 is its start, i = 6 its middle
    assert f(2) == pytest.approx(1.0)
    assert f(6) == pytest.approx((1 + math.cos(math.pi * 4 / 8)) / 2)  # 0.5
    assert f(9) == pytest.approx((1 + math.cos(math.pi * 7 / 8)) / 2)


def test_multistep_factors():
    cfg = RunConfig(schedule={"name": "multistep", "milestones": "3,5", "lr_decay": 0.1}, epochs=6)
    f = lr_factor(cfg)
    # MultiStepLR semantics: after 3 scheduler steps (epochs 1-3) the lr is decayed once
    assert [f(i) for i in range(6)] == pytest.approx([1, 1, 1, 0.1, 0.1, 0.01])
    assert [lr_factor(RunConfig(schedule={"name": "constant"}))(i) for i in range(3)] == [1, 1, 1]


def test_schedule_reaches_the_optimizer(digits):
    cfg = RunConfig(optimizer={"lr": 0.04, "params": {"nesterov": True}},
                    schedule={"name": "multistep", "milestones": "1,2", "lr_decay": 0.5}, epochs=3)
    lrs = []
    fit(cfg, data=digits, on_epoch=lambda e, m, s: lrs.append(
        (s["optimizer"]["param_groups"][0]["lr"], s["optimizer"]["param_groups"][0]["nesterov"])))
    # after epoch e the scheduler has stepped e times: lr * 0.5 ** #{m <= e}
    assert lrs == [(pytest.approx(0.02), True), (pytest.approx(0.01), True),
                   (pytest.approx(0.01), True)]


def test_config_rejects_bad_schedule():
    with pytest.raises(ValueError, match="milestones"):
        RunConfig(schedule={"name": "multistep"})
    with pytest.raises(ValueError, match="increasing"):
        RunConfig(schedule={"name": "multistep", "milestones": "5,3"})
    with pytest.raises(ValueError, match="schedule"):
        RunConfig(schedule={"name": "step"})
    with pytest.raises(ValueError, match="lr_decay"):
        RunConfig(schedule={"lr_decay": 0.0})
    with pytest.raises(ValueError, match="nesterov"):
        RunConfig(optimizer={"params": {"nesterov": True, "momentum": 0.0}})
    with pytest.raises(ValueError, match="mixup_alpha"):
        RunConfig(mixup_alpha=-0.1)
    assert RunConfig(schedule={"milestones": [150, 250]}).schedule.milestones == "150,250"


@pytest.mark.parametrize(("mixup", "cutmix"), [(0.4, 0.0), (0.0, 1.0)])
def test_mixer_recovers_torchvision_soft_labels(mixup, cutmix):
    k = 5
    x = torch.randn(8, 3, 6, 6)
    y = torch.tensor([0, 1, 2, 3, 4, 0, 1, 1])
    transform = v2.MixUp(alpha=mixup, num_classes=k) if mixup else v2.CutMix(alpha=cutmix,
                                                                              num_classes=k)
    torch.manual_seed(3)
    expected_x, soft = transform(x, y)
    torch.manual_seed(3)
    mixed, lam, partner = make_mixer(RunConfig(mixup_alpha=mixup, cutmix_alpha=cutmix), k)(x, y)
    assert torch.equal(mixed, expected_x)
    rebuilt = lam * torch.eye(k)[y] + (1 - lam) * torch.eye(k)[partner]
    torch.testing.assert_close(rebuilt, soft)
    # the mixed objective of CE equals CE against the soft labels (torch's soft-target CE)
    logits = torch.randn(8, k)
    ce = torch.nn.functional.cross_entropy
    torch.testing.assert_close(lam * ce(logits, y) + (1 - lam) * ce(logits, partner),
                               ce(logits, soft))


def test_no_mixer_by_default():
    assert make_mixer(RunConfig(), 10) is None


def test_mixup_cutmix_train_and_reject_interleaving(digits):
    cfg = RunConfig(loss={"name": "acls"}, epochs=1, mixup_alpha=0.2, cutmix_alpha=1.0)
    result = fit(cfg, data=digits)
    assert math.isfinite(result.metrics["train_loss"])
    assert 0 <= result.metrics["val_accuracy"] <= 1
    bad = RunConfig(loss={"name": "sbece"}, epochs=1, mixup_alpha=0.2, interleaved=True)
    with pytest.raises(ValueError, match="MixUp/CutMix"):
        fit(bad, data=digits)


def test_bf16_autocast_on_cpu_keeps_float32_outputs(digits):
    cfg = RunConfig(loss={"name": "mbls"}, epochs=1)
    fp32 = fit(cfg, data=digits, precision="fp32")
    bf16 = fit(cfg, data=digits, precision="bf16")
    # validation/test logits are computed in float32 whatever the training precision
    assert bf16.val_logits.dtype == fp32.val_logits.dtype == "float32"
    assert math.isfinite(bf16.metrics["train_loss"])
    # bf16 changes the training numerics (a different run), not the metric definitions
    assert abs(bf16.metrics["val_accuracy"] - fp32.metrics["val_accuracy"]) < 0.2


def test_bad_precision_device_and_workers(digits):
    with pytest.raises(ValueError, match="precision"):
        fit(RunConfig(epochs=1), data=digits, precision="fp16")
    with pytest.raises(ValueError, match="num_workers"):
        fit(RunConfig(epochs=1), data=digits, num_workers=-1)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            fit(RunConfig(epochs=1), data=digits, device="cuda")


def test_deferred_divergence_check_names_the_first_bad_batch():
    # the CUDA path keeps the check on the device; here its logic runs on CPU tensors
    weight = torch.nn.Parameter(torch.ones(()))
    opt = torch.optim.SGD([weight], lr=0.1)
    guard = Guard(torch.device("cpu"), opt, epoch=4)
    guard.deferred = True
    for batch, value in enumerate([1.0, float("nan"), float("inf"), 2.0], start=1):
        guard.step(weight * value, batch)  # no raise while deferred (batch % 50 != 0)
    with pytest.raises(DivergedError, match="epoch 4, batch 2"):
        guard.check()


def test_image_files_train_through_dataloader_workers(tmp_path):
    # an ImageFolder tree of PNG files: read per sample by a DataLoader with a worker process
    from formats import write_image_tree

    from raysearch.training.data.images import ImageFileDataset
    from raysearch.training.data.vision import load_imagefolder

    write_image_tree(tmp_path / "tree", per_class=12)
    data = load_imagefolder(seed=0, data_dir=tmp_path / "tree", image_size=16)
    assert isinstance(data.train, ImageFileDataset)
    cfg = RunConfig(model={"name": "resnet20"}, epochs=1, batch_size=8)
    result = fit(cfg, data=data, num_workers=1)
    # validation and test come back in dataset order with their labels
    assert result.val_logits.shape == (len(data.val), 3)
    assert result.test_labels.tolist() == data.test.labels.tolist()
    assert result.val_labels.tolist() == data.val.labels.tolist()
    assert math.isfinite(result.metrics["train_loss"])


def test_in_memory_images_train_with_augmentation_reproducibly(tmp_path):
    from formats import write_cifar10

    from raysearch.training.data.images import ImageTensorDataset

    write_cifar10(tmp_path, per_batch=20, n_test=20)  # 100 images: 90 train, 10 val
    data = load_dataset("cifar10", data_dir=tmp_path, seed=0)
    assert isinstance(data.train, ImageTensorDataset)
    assert data.train.augment is not None
    cfg = RunConfig(model={"name": "resnet20"}, data={"name": "cifar10", "dir": str(tmp_path)},
                    epochs=2, batch_size=16)
    first = fit(cfg, data=data)
    second = fit(cfg)  # loads the folder itself; same seed: same crops, flips and batches
    assert_same_metrics(first.metrics, second.metrics)
