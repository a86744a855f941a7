"""GPU acceptance: what the CUDA paths compute equals the CPU paths (or a hand-derived value).

Every test needs a CUDA device and is skipped without one (``pytest -m gpu`` selects them):

- precision: the bf16 training forward pass gives the fp32 metrics; reported logits are float32;
- memory format: channels-last gives the contiguous outputs; training keeps the model and its
  inputs channels-last; autocast really runs the forward pass in bf16;
- optimizer: SGD/Adam/AdamW over CUDA parameters take torch's fused step, which updates the
  weights as the foreach step does;
- data: the on-device augmentation of an in-memory image set has the crop/flip statistics of
  the CPU pipeline and of the hand-derived values; the fused batch kernel equals the CPU batch;
- metrics and losses: CalibrationMeter (classification and dense, with ``ignore_index``) and
  the losses give the CPU numbers on CUDA;
- weights and checkpoints: pretrained weights load onto a GPU model; a checkpoint of a CUDA run
  resumes on the CPU and a CPU checkpoint on CUDA, ending where an uninterrupted run ends;
- Ray: four trials at 0.25 GPU run at once; a CUDA out-of-memory fails its trial in one line
  while the others complete; two NCCL workers give the single-process numbers (2 GPUs).

Exact equality is not expected between devices (kernels sum in other orders): comparisons use
float32 with TF32 disabled and tolerances stated per test.
"""

from __future__ import annotations

import contextlib
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from raysearch.config import RunConfig
from raysearch.losses import build_loss
from raysearch.metrics import CalibrationMeter, accuracy, ece, nll
from raysearch.training.data import CropFlip, ImageTensorDataset, load_dataset
from raysearch.training.dense import evaluate_dense
from raysearch.training.loop import Amp, Source
from raysearch.training.models import build_model
from raysearch.training.models.pretrained import load_pretrained
from raysearch.training.passes import train_forward
from raysearch.training.run import fit

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

IGNORE = 255
DIGITS_SHAPE = (1, 8, 8)
RUN = {"loss": {"name": "ce"}, "model": {"name": "cnn"}, "epochs": 2, "seed": 0,
       "batch_size": 64}


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


@contextlib.contextmanager
def no_tf32():
    """Full float32 matmuls and convolutions on CUDA (TF32 keeps 10 mantissa bits only)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def seeded_cnn(seed: int = 0) -> torch.nn.Module:
    """The digits CNN with the weights of `seed`, on the CPU, in eval mode."""
    torch.manual_seed(seed)
    return build_model("cnn", num_classes=10, input_shape=DIGITS_SHAPE).eval()


def split_metrics(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """ECE (15 bins), NLL and accuracy of softmax(logits) by raysearch.metrics."""
    probs = torch.softmax(logits.float(), dim=1).cpu().numpy().astype(np.float64)
    y = labels.cpu().numpy()
    return {"ece": ece(probs, y), "nll": nll(probs, y), "accuracy": accuracy(probs, y)}


# ---------------------------------------------------------------------------------------------
# Precision, memory format, autocast


def test_bf16_and_fp32_training_forward_give_the_same_metrics(digits):
    # a trained model (confident logits, so a rounding of bf16 rarely moves an argmax) and
    # the validation split through the loop's training forward (train_forward: autocast, then
    # float32 logits), in eval mode so both passes see the same layers
    cfg = RunConfig(**{**RUN, "epochs": 5})
    model = fit(cfg, data=digits, device="cuda", precision="fp32").model.eval()
    x, y = digits.val.tensors
    x, y = x.cuda(), y.cuda()
    device = torch.device("cuda")
    with torch.no_grad(), no_tf32():
        low = train_forward(model, x, Amp(device, "bf16"))
        full = train_forward(model, x, Amp(device, "fp32"))
    assert low.dtype == full.dtype == torch.float32  # the loss always sees float32 logits
    assert not torch.equal(low, full)  # bf16 really rounded something
    a, b = split_metrics(low, y), split_metrics(full, y)
    assert b["accuracy"] > 0.9
    # NLL is smooth in the logits: bf16's relative rounding of 2**-8 moves it by ~1e-4
    assert a["nll"] == pytest.approx(b["nll"], abs=1e-3)
    # accuracy and ECE move in steps of one sample (1/360 on the validation digits): at most
    # one flipped argmax, and at most two samples' worth of bin changes for ECE
    n = len(y)
    assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1 / n + 1e-9)
    assert a["ece"] == pytest.approx(b["ece"], abs=2 / n)


def test_validation_logits_are_float32_under_bf16(digits):
    with no_tf32():
        result = fit(RunConfig(**{**RUN, "epochs": 1}), data=digits, device="cuda",
                     precision="bf16")
        x = digits.val.tensors[0].cuda().contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            plain = result.model.eval()(x).float().cpu().numpy()
    assert result.val_logits.dtype == np.float32
    assert result.test_logits.dtype == np.float32
    assert result.val_logits.shape == (360, 10)
    # computed in float32, not rounded to bf16 (whose values have 16 zero low bits as float32)
    assert (result.val_logits.view(np.uint32) & 0xFFFF).any()
    # and they are the model's float32 (not autocast) logits: a plain float32 forward agrees
    np.testing.assert_allclose(result.val_logits, plain, rtol=0, atol=1e-5)


def test_channels_last_gives_the_contiguous_outputs(digits):
    model = seeded_cnn().cuda()
    x = digits.val.tensors[0].cuda()
    with no_tf32():
        with torch.inference_mode():
            contiguous = model(x.contiguous())
        model.to(memory_format=torch.channels_last)
        # (the second convolution: a 1-channel tensor is both contiguous and channels-last)
        assert model.features[2].weight.is_contiguous(memory_format=torch.channels_last)
        assert not model.features[2].weight.is_contiguous()
        with torch.inference_mode():
            last = model(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(last.float(), contiguous.float(), rtol=0, atol=1e-4)


NOTEBOOK_RECORDER = '''
import torch
from torch import nn


class Recorder(nn.Module):
    """A conv net that notes, per training forward, the autocast and memory-format state."""

    def __init__(self, num_classes, input_shape):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], 8, 3, padding=1)
        self.mix = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8 * input_shape[1] * input_shape[2], num_classes)
        self.seen = []

    def forward(self, x):
        h = self.conv(x)
        if self.training:
            self.seen.append({
                "x_dtype": x.dtype, "conv_dtype": h.dtype,
                "autocast": torch.is_autocast_enabled("cuda"),
                "autocast_dtype": torch.get_autocast_dtype("cuda"),
                "h_channel_stride": h.stride(1),
                "weight_channels_last": self.mix.weight.is_contiguous(
                    memory_format=torch.channels_last),
                "weight_contiguous": self.mix.weight.is_contiguous(),
            })
        return self.head(torch.relu(self.mix(torch.relu(h))).flatten(1))
'''


def _recorder_class():
    namespace: dict = {"__name__": "__main__"}
    exec(textwrap.dedent(NOTEBOOK_RECORDER), namespace)  # noqa: S102 (the test's own source)
    return namespace["Recorder"]


def _recording_fit(digits, precision: str):
    label = "raysearch_test_gpu:recorder"
    cfg = RunConfig(**{**RUN, "epochs": 1, "model": {"name": label}})
    result = fit(cfg, data=digits, device="cuda", precision=precision,
                 components={"models": {label: _recorder_class()}})
    return result, result.model.seen


def test_autocast_runs_the_training_forward_in_bf16(digits):
    result, seen = _recording_fit(digits, "auto")  # auto: bf16 on CUDA
    assert len(seen) == math.ceil(1077 / 64)  # one record per training batch of one epoch
    for record in seen:
        assert record["autocast"] is True
        assert record["autocast_dtype"] == torch.bfloat16
        assert record["x_dtype"] == torch.float32  # the batch itself stays float32
        assert record["conv_dtype"] == torch.bfloat16  # the convolution ran in bf16
    _, fp32 = _recording_fit(digits, "fp32")
    assert all(not r["autocast"] and r["conv_dtype"] == torch.float32 for r in fp32)
    assert all(r["h_channel_stride"] == 1 for r in fp32)  # channels-last without autocast too
    assert result.val_logits.dtype == np.float32


def test_training_on_cuda_is_channels_last(digits):
    # digits batches are (N, 1, 8, 8): one channel, so the batch's own strides say nothing
    # (torch keeps (64, 64, 8, 1) in both formats); the first convolution's (N, 8, 8, 8)
    # output and the 8 -> 8 convolution's weight are unambiguous: channel stride 1 (strides
    # (512, 1, 64, 8)) when channels-last, 64 when contiguous
    result, seen = _recording_fit(digits, "bf16")
    assert seen
    assert all(r["h_channel_stride"] == 1 for r in seen)
    assert all(r["weight_channels_last"] and not r["weight_contiguous"] for r in seen)
    assert next(result.model.parameters()).is_cuda
    assert result.model.mix.weight.is_contiguous(memory_format=torch.channels_last)


def test_fit_on_cuda_reaches_the_cpu_accuracy(digits):
    cfg = RunConfig(**{**RUN, "epochs": 3})
    gpu = fit(cfg, data=digits, device="cuda")  # bf16 autocast, channels-last
    cpu = fit(cfg, data=digits, device="cpu")
    assert cpu.metrics["val_accuracy"] > 0.8
    assert gpu.metrics["val_accuracy"] == pytest.approx(cpu.metrics["val_accuracy"], abs=0.02)
    assert gpu.metrics["test_accuracy"] == pytest.approx(cpu.metrics["test_accuracy"], abs=0.02)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_the_optimizer_takes_the_fused_step_on_cuda(name):
    from raysearch.config import OptimizerConfig
    from raysearch.training.optim import build_optimizer

    with no_tf32():
        nets = [seeded_cnn().cuda().train() for _ in range(2)]
        config = OptimizerConfig(name=name, lr=0.05)
        fused = build_optimizer(config, nets[0].parameters())
        plain = build_optimizer(OptimizerConfig(name=name, lr=0.05, params={"foreach": True}),
                                nets[1].parameters())
        assert fused.defaults["fused"] is True
        assert not plain.defaults["fused"]  # the config's own foreach wins
        x = torch.linspace(-1, 1, 64 * 64, device="cuda").reshape(64, *DIGITS_SHAPE)
        y = torch.arange(64, device="cuda") % 10
        for net, opt in zip(nets, (fused, plain), strict=True):
            for _ in range(3):
                loss = torch.nn.functional.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        for a, b in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same update
    mixed = [torch.zeros(2, device="cuda", requires_grad=True), torch.zeros(2, requires_grad=True)]
    assert not build_optimizer(OptimizerConfig(name=name), mixed).defaults["fused"]


# ---------------------------------------------------------------------------------------------
# On-device augmentation of an in-memory image set


def _epoch(dataset: ImageTensorDataset, device: str, seed: int) -> torch.Tensor:
    """One augmented epoch (dataset order) through the loop's Source on `device`, on the CPU."""
    source = Source(dataset, torch.device(device))
    assert source.kind == "images"
    augment = torch.Generator().manual_seed(seed)
    parts = [xb.cpu() for xb, _, _ in source.batches(torch.arange(len(dataset)), 500, augment)]
    return torch.cat(parts)


def _cpu_pipeline(dataset: ImageTensorDataset, seed: int) -> torch.Tensor:
    """The same epoch through ``__getitem__`` (the DataLoader path: global RNG, per sample)."""
    torch.manual_seed(seed)
    return torch.stack([dataset[i][0] for i in range(len(dataset))])


def test_on_device_augmentation_has_the_cpu_channel_statistics():
    # constant 8x8 images (channel values 255, 102, 51 -> 1.0, 0.4, 0.2 with mean 0, std 1),
    # zero padding 2: offset d uniform in {0..4} keeps 8 - |d - 2| rows, on average
    # 8 - 1.2 = 6.8 of 8 = 0.85, and the same for columns, independently: a fraction
    # p = 0.85**2 = 0.7225 of the output pixels is image, the rest padding (0). So the
    # per-channel mean is v * 0.7225 and the std v * sqrt(p * (1 - p)) = v * 0.44778.
    n = 2000
    values = torch.tensor([255, 102, 51], dtype=torch.uint8).view(1, 3, 1, 1)
    images = values.expand(n, 3, 8, 8).contiguous()
    dataset = ImageTensorDataset(images, torch.zeros(n, dtype=torch.int64), mean=(0.0,) * 3,
                                 std=(1.0,) * 3, augment=CropFlip(2, True))
    cuda = _epoch(dataset, "cuda", seed=3)
    cpu = _cpu_pipeline(dataset, seed=4)
    v = torch.tensor([1.0, 0.4, 0.2])
    p = 0.85**2
    for x in (cuda, cpu):
        mean = x.mean(dim=(0, 2, 3))
        std = x.std(dim=(0, 2, 3))
        torch.testing.assert_close(mean, v * p, rtol=0, atol=0.01)
        torch.testing.assert_close(std, v * math.sqrt(p * (1 - p)), rtol=0, atol=0.01)
    torch.testing.assert_close(cuda.mean(dim=(0, 2, 3)), cpu.mean(dim=(0, 2, 3)), rtol=0,
                               atol=0.015)
    # the same generator state gives the same epoch on the CPU as on CUDA
    torch.testing.assert_close(cuda, _epoch(dataset, "cpu", seed=3), rtol=0, atol=1e-6)


def test_the_fused_batch_kernel_equals_the_cpu_batch_to_the_bit():
    # CIFAR-shaped uint8 images, padding 4 and flips: the batch built on CUDA (one Triton
    # kernel where Triton is installed) equals the plain-torch batch on the CPU, same draws
    from raysearch.training.data import batch_kernel

    images = torch.randint(0, 256, (300, 3, 32, 32), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(0))
    cpu = ImageTensorDataset(images, torch.arange(300) % 10, mean=(0.4914, 0.4822, 0.4465),
                             std=(0.247, 0.243, 0.261), augment=CropFlip(4, True))
    cuda = cpu.to("cuda")
    index = torch.randperm(300, generator=torch.Generator().manual_seed(1))[:256]
    a, ya = cpu.batch(index, generator=torch.Generator().manual_seed(2))
    b, yb = cuda.batch(index.cuda(), generator=torch.Generator().manual_seed(2))
    assert batch_kernel.kernel_ready(cuda.images) == (batch_kernel._kernel() is not None)
    assert torch.equal(a, b.cpu())
    assert torch.equal(ya, yb.cpu())


def test_on_device_crop_and_flip_frequencies():
    # crops: 3x3 image with pixels 1..9, padding 1, no flip. Output pixel (1, 1) is padded
    # pixel (1 + dy, 1 + dx) = image pixel (dy, dx), value 1 + 3 * dy + dx: each of the nine
    # offsets, so each value 1..9, with frequency 1/9.
    n = 9000
    tiny = torch.arange(1, 10, dtype=torch.uint8).reshape(1, 1, 3, 3).expand(n, 1, 3, 3)
    crops = ImageTensorDataset(tiny.contiguous(), torch.zeros(n, dtype=torch.int64),
                               mean=(0.0,), std=(1.0 / 255,), augment=CropFlip(1, False))
    centre = _epoch(crops, "cuda", seed=5)[:, 0, 1, 1].round().long()
    freq = torch.bincount(centre, minlength=10)[1:].double() / n
    torch.testing.assert_close(freq, torch.full((9,), 1 / 9, dtype=torch.float64), rtol=0,
                               atol=0.02)
    # flips: 4x4 images whose first column is 255, no padding; a flipped sample has its bright
    # column last. P(flip) = 0.5.
    n = 4000
    edge = torch.zeros(n, 1, 4, 4, dtype=torch.uint8)
    edge[:, :, :, 0] = 255
    flips = ImageTensorDataset(edge, torch.zeros(n, dtype=torch.int64), mean=(0.0,),
                               std=(1.0,), augment=CropFlip(0, True))
    x = _epoch(flips, "cuda", seed=6)
    flipped = x[:, 0, 0, 3] == 1.0
    assert torch.equal(flipped, x[:, 0, 0, 0] == 0.0)  # every sample is flipped or not
    assert flipped.double().mean().item() == pytest.approx(0.5, abs=0.05)
    cpu = _cpu_pipeline(flips, seed=7)[:, 0, 0, 3] == 1.0
    assert flipped.double().mean().item() == pytest.approx(cpu.double().mean().item(), abs=0.05)


# ---------------------------------------------------------------------------------------------
# Metrics, losses


def _random_probs(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    z = 2.0 * rng.normal(size=(n, k))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return p.astype(np.float32), rng.integers(0, k, n)


def test_meter_on_cuda_equals_the_cpu_for_classification():
    # A streaming meter keeps its sums on the GPU; a keep_samples meter (the table's samples)
    # keeps host copies, so its sums live on the CPU. Both equal the CPU's numbers.
    rng = np.random.default_rng(0)
    cpu = CalibrationMeter(10, keep_samples=True)
    gpu = CalibrationMeter(10)
    kept = CalibrationMeter(10, keep_samples=True)
    for _ in range(3):  # three batches: the sums accumulate on each device
        p, y = _random_probs(rng, 700, 10)
        cpu.update(torch.from_numpy(p), torch.from_numpy(y))
        gpu.update(torch.from_numpy(p).cuda(), torch.from_numpy(y).cuda())
        kept.update(torch.from_numpy(p).cuda(), torch.from_numpy(y).cuda())
    assert gpu.device.type == "cuda"
    assert kept.device.type == "cpu"
    expected = cpu.compute()
    assert expected["n"] == 2100
    assert gpu.compute() == pytest.approx(expected, abs=1e-6, nan_ok=True)
    assert kept.compute() == pytest.approx(expected, abs=1e-6, nan_ok=True)
    assert kept.table() == pytest.approx(cpu.table(), abs=1e-6, nan_ok=True)


def test_meter_on_cuda_equals_the_cpu_for_segmentation_with_ignore_index():
    rng = np.random.default_rng(1)
    k, shape = 5, (2, 5, 12, 16)
    z = 2.0 * rng.normal(size=shape)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    labels = rng.integers(0, k, (2, 12, 16))
    labels[:, :3, :] = IGNORE  # 2 x 3 x 16 = 96 of the 384 pixels ignored
    cpu = CalibrationMeter(k, ignore_index=IGNORE)
    gpu = CalibrationMeter(k, ignore_index=IGNORE)
    cpu.update(torch.from_numpy(p), torch.from_numpy(labels))
    gpu.update(torch.from_numpy(p).cuda(), torch.from_numpy(labels).cuda())
    result = gpu.compute()
    assert result["n"] == 384 - 96
    assert result == pytest.approx(cpu.compute(), abs=1e-6, nan_ok=True)
    np.testing.assert_array_equal(gpu.confusion, cpu.confusion)


def test_dense_evaluation_on_cuda_equals_the_cpu():
    # the segmentation evaluation path: a 1x1-conv "network" streamed through the meters
    torch.manual_seed(0)
    net = torch.nn.Conv2d(3, 4, kernel_size=1)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, 3, 10, 12, generator=generator)
    y = torch.randint(0, 4, (6, 10, 12), generator=generator)
    y[:, 0, :] = IGNORE
    batches = [(x[:3], y[:3]), (x[3:], y[3:])]
    with no_tf32():
        cpu = evaluate_dense(net, batches, num_classes=4, ignore_index=IGNORE,
                             temperatures=(1.0, 2.0))
        gpu_net = net.cuda()
        gpu = evaluate_dense(gpu_net, [(xb.cuda(), yb.cuda()) for xb, yb in batches],
                             num_classes=4, ignore_index=IGNORE, temperatures=(1.0, 2.0))
    assert len(gpu.meters) == 2
    for g, c in zip(gpu.meters, cpu.meters, strict=True):
        assert g.compute()["n"] == 6 * 9 * 12
        assert g.compute() == pytest.approx(c.compute(), abs=1e-6, nan_ok=True)


@pytest.mark.parametrize("name", ["ce", "ls", "focal", "mbls", "acls"])
def test_loss_on_cuda_equals_the_cpu(name):
    generator = torch.Generator().manual_seed(2)
    logits = 3.0 * torch.randn(64, 10, generator=generator, dtype=torch.float32)
    targets = torch.randint(0, 10, (64,), generator=generator)
    cpu_logits = logits.clone().requires_grad_(True)
    gpu_logits = logits.cuda().requires_grad_(True)
    cpu = build_loss(name)(cpu_logits, targets)
    gpu = build_loss(name).cuda()(gpu_logits, targets.cuda())
    assert gpu.is_cuda
    assert gpu.item() == pytest.approx(cpu.item(), abs=1e-5)
    cpu.backward()
    gpu.backward()
    torch.testing.assert_close(gpu_logits.grad.cpu(), cpu_logits.grad, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Pretrained weights, checkpoints


def test_pretrained_weights_load_onto_a_gpu_model(digits, tmp_path):
    source = seeded_cnn(seed=0)
    path = tmp_path / "cnn.pt"
    torch.save(source.state_dict(), path)
    target = seeded_cnn(seed=1).cuda()  # other initial weights, on the GPU
    info = load_pretrained(target, str(path))
    assert info.loaded == len(source.state_dict())
    assert not info.replaced_head
    assert all(p.is_cuda for p in target.parameters())
    x = digits.val.tensors[0]
    with torch.inference_mode(), no_tf32():
        expected = source(x)
        got = target.eval()(x.cuda()).cpu()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


def test_run_config_pretrained_path_on_cuda(digits, tmp_path):
    # `model.pretrained` loads the file into the run's (CUDA, channels-last) model before
    # training; with lr 1e-9 the weights stay as loaded (to ~1e-9), so the run's logits are
    # the file's
    source = seeded_cnn(seed=0)
    path = tmp_path / "cnn.pt"
    torch.save({"state_dict": source.state_dict()}, path)
    cfg = RunConfig(**{**RUN, "epochs": 1, "seed": 5,
                       "optimizer": {"lr": 1e-9, "weight_decay": 0.0},
                       "model": {"name": "cnn", "pretrained": str(path)}})
    result = fit(cfg, data=digits, device="cuda", precision="fp32")
    with torch.inference_mode():
        expected = source(digits.val.tensors[0]).numpy()
    np.testing.assert_allclose(result.val_logits, expected, rtol=0, atol=1e-3)


def _state_file(state: dict, path: Path) -> dict:
    """`state` written as a checkpoint file and read back onto the CPU (a Tune checkpoint)."""
    torch.save(state, path)
    return torch.load(path, map_location="cpu", weights_only=False)


def test_a_cuda_checkpoint_resumes_on_the_cpu_and_back(digits, tmp_path):
    cfg = RunConfig(**{**RUN, "epochs": 3})
    with no_tf32():
        gpu_states: dict = {}
        gpu = fit(cfg, data=digits, device="cuda", precision="fp32",
                  on_epoch=lambda e, m, s: gpu_states.setdefault(e, s))
        cpu_states: dict = {}
        cpu = fit(cfg, data=digits, device="cpu",
                  on_epoch=lambda e, m, s: cpu_states.setdefault(e, s))
        # CUDA epoch 1 -> CPU epochs 2-3, against the uninterrupted CPU run
        assert gpu_states[1]["model"]["features.0.weight"].is_cuda  # a state of the GPU run
        to_cpu = fit(cfg, data=digits, device="cpu",
                     resume=_state_file(gpu_states[1], tmp_path / "gpu1.pt"))
        # CPU epoch 2 -> CUDA epoch 3, against the uninterrupted CUDA run
        to_gpu = fit(cfg, data=digits, device="cuda", precision="fp32",
                     resume=_state_file(cpu_states[2], tmp_path / "cpu2.pt"))
    assert next(to_gpu.model.parameters()).is_cuda
    for resumed, straight in ((to_cpu, cpu), (to_gpu, gpu)):
        assert resumed.epochs_completed == 3
        # CUDA and CPU kernels round differently, and the difference grows over the epochs
        # trained: the NLL moves little; one digit of 360 crossing a bin or flipping its
        # prediction moves the ECE and the accuracy by up to 1/360 (first GPU run: val ECE
        # 0.0290 against 0.0320). A resume that lost the optimiser's momentum moves the
        # validation NLL by ~0.04 (CPU, these settings).
        for key in ("val_nll", "test_nll"):
            assert resumed.metrics[key] == pytest.approx(straight.metrics[key], abs=2e-3), key
        for key in ("val_ece", "test_ece", "val_accuracy", "test_accuracy"):  # 2 digits at most
            assert resumed.metrics[key] == pytest.approx(straight.metrics[key], abs=0.006), key


# ---------------------------------------------------------------------------------------------
# Ray: fractional GPUs, an out-of-memory trial, NCCL DDP


NOTEBOOK_TRIALS = '''
import os
import time

import torch
from torch import nn


class Net(nn.Module):
    """A small conv net that logs (pid, time, device) per CUDA training forward to LOG.

    With BARRIER (a folder) set, the first CUDA training forward of each trial waits (at most
    two minutes) until WAIT_FOR trials have reached theirs, so trials that run at once are all
    training at one moment. The first trial to claim the file CLAIM (when set) allocates an
    impossible tensor instead.
    """

    def __init__(self, num_classes, input_shape):
        super().__init__()
        self.conv = nn.Conv2d(input_shape[0], 8, 3, padding=1)
        self.head = nn.Linear(8 * input_shape[1] * input_shape[2], num_classes)

    def forward(self, x):
        if x.is_cuda and self.training:
            if BARRIER and not getattr(self, "met", False):
                self.met = True
                open(os.path.join(BARRIER, str(os.getpid())), "w").close()
                deadline = time.monotonic() + 120
                while len(os.listdir(BARRIER)) < WAIT_FOR and time.monotonic() < deadline:
                    time.sleep(0.05)
            if CLAIM:
                try:
                    os.close(os.open(CLAIM, os.O_CREAT | os.O_EXCL))
                    self.doomed = True
                except FileExistsError:
                    pass
                if getattr(self, "doomed", False):
                    torch.empty(1 << 44, device=x.device)  # 2**44 float32: 64 TiB
            with open(LOG, "a") as f:
                f.write(f"{os.getpid()} {time.time()} {x.device.type}\\n")
        return self.head(torch.relu(self.conv(x)).flatten(1))


def make_net(num_classes, input_shape):
    return Net(num_classes, input_shape)
'''


def _trial_factory(log: Path, *, claim: Path | None = None, barrier: Path | None = None,
                   wait_for: int = 0):
    """``make_net`` as a notebook defines it (``__main__``: it reaches the trials by value)."""
    if barrier is not None:
        barrier.mkdir()
    namespace: dict = {"__name__": "__main__", "LOG": str(log),
                       "CLAIM": str(claim) if claim else "",
                       "BARRIER": str(barrier) if barrier else "", "WAIT_FOR": wait_for}
    exec(textwrap.dedent(NOTEBOOK_TRIALS), namespace)  # noqa: S102 (the test's own source)
    return namespace["make_net"]


def _children(uri: str, parent_run_id: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parent = client.get_run(parent_run_id)
    return client.search_runs([parent.info.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'")


@pytest.mark.integration
def test_four_quarter_gpu_trials_run_at_once(ray_session, tmp_path):
    import raysearch

    assert ray_session.cluster_resources().get("GPU", 0) >= 1
    log = tmp_path / "forwards.log"
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    barrier = tmp_path / "barrier"
    result = raysearch.sweep(
        "ce", model=_trial_factory(log, barrier=barrier, wait_for=4), num_samples=4,
        max_concurrent=4, epochs=2, gpus_per_trial=0.25, cpus_per_trial=0.5, posthoc=(),
        name="quarters", tracking_uri=uri, storage_path=str(tmp_path / "ray"), progress=None)
    assert len(result.trials) == 4
    assert result.trials["complete"].all(), result.trials[["trial", "outcome"]]
    # the MLflow runs' intervals (created when a trial starts, ended when it completes)
    children = _children(uri, result.parent_run_id)
    assert len(children) == 4
    assert all(c.info.status == "FINISHED" for c in children)
    starts = [c.info.start_time for c in children]
    ends = [c.info.end_time for c in children]
    assert max(starts) < min(ends), (starts, ends)  # all four were running at one moment
    # and the trials' own record: four processes, every training forward on CUDA, and all
    # four inside their training at one moment (each waited at the barrier for the others,
    # which only ends early if the four ran at once)
    rows = [line.split() for line in log.read_text().splitlines()]
    assert {device for _, _, device in rows} == {"cuda"}
    spans: dict[str, list[float]] = {}
    for pid, when, _ in rows:
        spans.setdefault(pid, []).append(float(when))
    assert len(spans) == 4
    assert sorted(path.name for path in barrier.iterdir()) == sorted(spans)
    assert max(min(t) for t in spans.values()) < min(max(t) for t in spans.values())


@pytest.mark.integration
def test_a_cuda_out_of_memory_fails_its_trial_in_one_line(ray_session, tmp_path):
    import raysearch

    claim = tmp_path / "oom.claim"
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    result = raysearch.sweep(
        "ce", model=_trial_factory(tmp_path / "forwards.log", claim=claim), num_samples=3,
        max_concurrent=3, epochs=1, gpus_per_trial=0.25, cpus_per_trial=0.5, max_failures=0,
        posthoc=(), name="oom", tracking_uri=uri, storage_path=str(tmp_path / "ray"),
        progress=None)
    assert claim.exists()  # exactly one trial claimed it: the doomed one
    trials = result.trials
    assert len(trials) == 3
    assert sorted(trials["outcome"]) == ["complete", "complete", "error"], trials["outcome"]
    assert int(trials["complete"].sum()) == 2
    children = _children(uri, result.parent_run_id)
    failed = [c for c in children if c.info.status == "FAILED"]
    assert len(failed) == 1
    assert sum(c.info.status == "FINISHED" for c in children) == 2
    error = failed[0].data.tags["raysearch.error"]
    assert "out of memory" in error.lower(), error
    assert "\n" not in error.strip()
    assert "Traceback" not in error


@pytest.mark.integration
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
@pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context")  # (Train imports it)
def test_two_nccl_workers_give_the_single_process_numbers(ray_session, tmp_path):
    import ray.train
    from ray.train.torch import TorchTrainer

    def per_worker(loop: dict) -> None:  # nested: pickled by value for the Train workers
        import ray.train as train
        import ray.train.torch as train_torch

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        context = train.get_context()
        seen = []
        result = fit(RunConfig(**loop["run"]), data=load_dataset("digits", seed=0),
                     device=train_torch.get_device(), precision="fp32",
                     on_epoch=lambda epoch, metrics, state: seen.append(metrics))
        if context.get_world_rank() == 0:
            np.savez(loop["out"], val=result.val_logits, test=result.test_logits,
                     val_labels=result.val_labels, world=context.get_world_size(),
                     metrics=json.dumps(result.metrics), epochs=json.dumps(seen))

    out = tmp_path / "rank0.npz"
    trainer = TorchTrainer(
        per_worker, train_loop_config={"run": RUN, "out": str(out)},
        scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=True,
                                               resources_per_worker={"CPU": 0.5, "GPU": 1}),
        run_config=ray.train.RunConfig(name="nccl-equivalence", storage_path=str(tmp_path)))
    trainer.fit()

    with no_tf32():
        single = fit(RunConfig(**RUN), data=load_dataset("digits", seed=0), device="cuda",
                     precision="fp32")
    ddp = np.load(out)
    assert int(ddp["world"]) == 2
    metrics = json.loads(str(ddp["metrics"]))
    assert set(metrics) == set(single.metrics)
    for key, value in single.metrics.items():
        if math.isfinite(value):
            assert metrics[key] == pytest.approx(value, abs=1e-4), key
    np.testing.assert_allclose(ddp["val"], single.val_logits, rtol=0, atol=1e-3)
    np.testing.assert_allclose(ddp["test"], single.test_logits, rtol=0, atol=1e-3)
    np.testing.assert_array_equal(ddp["val_labels"], single.val_labels)
    assert len(json.loads(str(ddp["epochs"]))) == RUN["epochs"]
