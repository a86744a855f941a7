"""GPU acceptance in one command: the gpu-marked tests and five figures, with goals, as a report.

Without a CUDA device it prints one line and exits 0. With one it runs, each part on its own
(a part that raises is reported as ``error: <one line>`` and the others still run):

1. **tests**: ``pytest -m gpu -q -rA tests`` in a subprocess (every gpu-marked test, those of
   ``tests/test_gpu.py`` included) with ``--junitxml=<out>/gpu_tests.xml``; pass / fail / skip
   per test is read from the XML.
2. **fit / bare loop**: images/s of a CIFAR-shaped (uint8 3x32x32, 10 classes) ResNet-18
   (``resnet18``) trained by ``raysearch.training.run.fit`` on an in-memory synthetic set
   (:func:`train_throughput.train_images_per_s`: bf16 autocast, channels-last, SGD, on-device
   crop + flip, validation every epoch; the epochs after the first are timed) over the
   images/s of a bare PyTorch loop on the same GPU (same model, batch size, bf16 autocast,
   channels-last, SGD with momentum 0.9; uint8 images gathered and normalised on the GPU, no
   augmentation, no validation: the ceiling). Goal >= 0.95.
3. **GPU sharing**: a real local Ray sweep (``raysearch.sweep``, space ``ce``, model ``cnn``) on
   CIFAR-format files written here: 4 trials at ``gpus_per_trial=0.25``, ``max_concurrent=4``,
   against the same 4 trials at ``gpus_per_trial=1`` (one trial on the GPU at a time). Images/s
   are all training images of the 4 trials over the sweep's wall time
   (``SweepResult.seconds``: from the start of the Tune run to the trials table; Ray's start-up
   is not in it). Both sweeps do the same work, so the per-trial and per-sweep fixed costs
   (process start, MLflow, evaluation, temperature scaling) weigh on both. Goal >= 2x.
4. **dense metrics**: the per-batch time of the streaming pixel metrics of a segmentation
   trial's evaluation (``raysearch.training.dense.evaluate_dense`` with the logits fed through
   ``nn.Identity``: finiteness check, softmax, ``CalibrationMeter.update``) on a VOC-sized
   batch (8 x 21 x 512 x 512, ~5% of the pixels ignored) over the time of
   DeepLabV3-ResNet-50's forward pass on the same batch (``deeplabv3_resnet50`` from the model
   registry, no pretrained weights, eval, float32, channels-last, ``torch.inference_mode``,
   as ``evaluate_dense`` runs it). Goal < 10%.
5. **JPEG folder loader**: images/s of the training batches of an ImageFolder tree of JPEG files
   written here (``jpeg_loader.py``: 3,000 images of 300-500 px, ``RandomResizedCrop(224)`` +
   flip, the trial's training feed with the machine's CPU count minus one worker processes)
   over the images/s of a bare ResNet-50 bf16 channels-last training step at 224 px on the
   GPU. Goal >= 1.0 (the GPU does not wait on data).
6. **sweep end to end**: an 8-trial, 2-epoch sweep (space ``ls``, ``resnet20``) on
   CIFAR-10-format files written here, ``gpus_per_trial=0.5``, tracked to
   ``sqlite:///<out>/mlruns.db``: every trial must finish and have an MLflow child run of the
   sweep's parent run, FINISHED, with ``test_accuracy``/``test_ece`` and one ``val_ece`` per
   epoch.

The CIFAR files and Tune's trial storage go to a temporary folder, removed at the end. Writes
``gpu_report.json``, ``gpu_report.md``, ``gpu_tests.xml``, ``gpu_tests.log`` and the MLflow
store ``mlruns.db`` (experiment ``gpu-acceptance``) to ``--out`` (device, torch and CUDA
versions, each figure with its goal and whether it was met, each test's outcome) and prints the
Markdown at the end. Exit code 1 when a test failed or a part raised, else 0 (a figure that
misses its goal is reported, not an error). ``--quick`` shortens every measurement (a smoke
run of a few minutes).

Usage: python benchmarks/gpu_acceptance.py [--out benchmarks/out] [--quick]
"""

from __future__ import annotations

import argparse
import json
import pickle
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # the sibling benchmarks, imported for their measurement code

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


@dataclass
class Figure:
    """One measured figure of the report (or the error that stopped its part)."""

    key: str
    title: str
    goal: str
    value: float | None = None
    unit: str = ""
    met: bool | None = None
    details: str = ""
    error: str | None = None

    def shown(self) -> str:
        if self.error is not None:
            return f"error: {self.error}"
        if self.value is None:
            return "-"
        if self.unit == "%":
            return f"{self.value:.1f}%"
        if self.unit == " trials":
            return f"{self.value:.0f} trials"
        return f"{self.value:.2f}{self.unit}"


@dataclass
class TestOutcome:
    """One test case of the JUnit XML: ``passed``, ``failed``, ``error`` or ``skipped``."""

    name: str
    outcome: str
    seconds: float = 0.0
    message: str = ""


@dataclass
class Report:
    device: str
    torch: str
    cuda: str | None
    python: str
    quick: bool
    started: str
    figures: list[Figure] = field(default_factory=list)
    tests: list[TestOutcome] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # part -> one line

    def failed(self) -> bool:
        return bool(self.errors) or any(t.outcome in ("failed", "error") for t in self.tests)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{type(exc).__name__}: {text}"[:300]


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


# --------------------------------------------------------------------------------------------
# CIFAR-10 python-format files (data_batch_1..5, test_batch, batches.meta)
# --------------------------------------------------------------------------------------------


def write_cifar10(root: Path, per_batch: int, n_test: int, seed: int = 0) -> Path:
    """Write random CIFAR-10 python batches under ``root/cifar-10-batches-py``; returns root.

    Each file is a pickled dict as in the released archive: ``data`` uint8 (n, 3072) (the
    1024 red, then green, then blue values of each 32x32 image, row-major), ``labels`` a list of
    ints in [0, 10) (balanced, shuffled), ``batch_label`` and ``filenames``; ``batches.meta``
    holds ``label_names``. Files already there are rewritten.
    """
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n: int, label: str, path: Path) -> None:
        labels = np.arange(n) % 10
        rng.shuffle(labels)
        entry = {"batch_label": label, "labels": labels.tolist(),
                 "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "filenames": [f"{i:05d}.png" for i in range(n)]}
        with open(path, "wb") as f:
            pickle.dump(entry, f, protocol=2)

    for b in range(1, 6):
        batch(per_batch, f"training batch {b} of 5", folder / f"data_batch_{b}")
    batch(n_test, "testing batch 1 of 1", folder / "test_batch")
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
             "truck"]
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072},
                    f, protocol=2)
    return root


# --------------------------------------------------------------------------------------------
# 1. the gpu-marked tests
# --------------------------------------------------------------------------------------------


def parse_junit(path: Path) -> list[TestOutcome]:
    """Outcome of every ``testcase`` of a pytest JUnit XML file (root ``testsuites`` or not)."""
    root = ET.parse(path).getroot()
    out = []
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        label = f"{classname}::{name}" if classname else name
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = " ".join((child.get("message") or child.text or "").split())[:200]
                break
        out.append(TestOutcome(label, outcome, float(case.get("time") or 0.0), message))
    return out


def run_tests(out: Path) -> list[TestOutcome]:
    xml = out / "gpu_tests.xml"
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rA", "-p", "no:cacheprovider",
           f"--junitxml={xml}", "tests"]
    say(f"  $ {' '.join(cmd[2:])}")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    (out / "gpu_tests.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode == 5:
        raise RuntimeError("pytest collected no gpu-marked tests")
    if not xml.is_file():
        last = (proc.stdout + proc.stderr).strip().splitlines() or ["(no output)"]
        raise RuntimeError(f"pytest exited {proc.returncode} without a report: {last[-1]}")
    tests = parse_junit(xml)
    if proc.returncode not in (0, 1) and not any(t.outcome in ("failed", "error") for t in tests):
        raise RuntimeError(f"pytest exited {proc.returncode} (see gpu_tests.log)")
    return tests


# --------------------------------------------------------------------------------------------
# 2. raysearch's training loop against a bare PyTorch loop
# --------------------------------------------------------------------------------------------


def bare_images_per_s(model: str, n_train: int, epochs: int, batch_size: int = 128,
                      device: str = "cuda") -> float:
    """Images/s of a bare bf16 channels-last SGD loop on uint8 CIFAR-shaped images on the GPU.

    The first epoch warms up (cuDNN autotuning, allocator) and is not timed.
    """
    from raysearch.training.models import build_model

    dev = torch.device(device)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n_train, 3, 32, 32), generator=g, dtype=torch.uint8).to(dev)
    labels = torch.randint(0, 10, (n_train,), generator=g).to(dev)
    mean = torch.tensor(CIFAR_MEAN, device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor(CIFAR_STD, device=dev).view(1, 3, 1, 1) * 255
    torch.manual_seed(0)
    net = build_model(model, num_classes=10, input_shape=(3, 32, 32)).to(dev)
    net = net.to(memory_format=torch.channels_last).train()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)

    def epoch() -> None:
        for index in torch.randperm(n_train, device=dev).split(batch_size):
            x = ((images[index].float() - mean) / std).contiguous(
                memory_format=torch.channels_last)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = net(x)
            loss = torch.nn.functional.cross_entropy(logits.float(), labels[index])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    epoch()
    sync()
    start = time.perf_counter()
    for _ in range(max(1, epochs - 1)):
        epoch()
    sync()
    return n_train * max(1, epochs - 1) / (time.perf_counter() - start)


def fit_vs_bare(quick: bool) -> Figure:
    from train_throughput import train_images_per_s

    n_train, epochs = (2560, 2) if quick else (20000, 4)
    fig = Figure("fit_vs_bare", "ResNet-18 training, raysearch fit / bare PyTorch loop",
                 ">= 0.95", unit="x")
    bare = bare_images_per_s("resnet18", n_train, epochs)
    ours, _ = train_images_per_s("resnet18", n_train, epochs, "cuda", precision="bf16",
                                 batch_size=128)
    fig.value, fig.met = ours / bare, ours / bare >= 0.95
    fig.details = (f"fit {ours:,.0f} images/s, bare loop {bare:,.0f} images/s (batch 128, bf16, "
                   f"channels-last, {n_train} images x {epochs - 1} timed epochs)")
    return fig


def jpeg_feed(quick: bool) -> Figure:
    from jpeg_loader import default_workers, measure

    images, batches = (600, 4) if quick else (3000, 20)
    workers = default_workers()
    fig = Figure("jpeg_loader", "JPEG folder loader / ResNet-50 bf16 training (224 px)",
                 ">= 1.0", unit="x")
    f = measure(images=images, image_size=224, batch_size=128, batches=batches,
                workers=workers, model="resnet50", device=torch.device("cuda"))
    fig.value, fig.met = f["ratio"], f["ratio"] >= 1.0
    fig.details = (f"loader {f['loader']:,.0f} images/s ({workers} worker processes, "
                   f"{images} JPEGs of 300-500 px), training {f['training']:,.0f} images/s "
                   "(batch 128, bf16, channels-last)")
    return fig


# --------------------------------------------------------------------------------------------
# 3. 4 trials sharing one GPU against one trial at a time
# --------------------------------------------------------------------------------------------


def gpu_sharing(out: Path, scratch: Path, quick: bool, stamp: str) -> Figure:
    import raysearch

    per_batch, epochs = (500, 2) if quick else (5000, 8)
    data_dir = write_cifar10(scratch / "cifar-sharing", per_batch=per_batch, n_test=1000)
    uri = f"sqlite:///{out / 'mlruns.db'}"
    fig = Figure("gpu_sharing", "4 trials at 0.25 GPU / 1 trial at a time (cnn, images/s)",
                 ">= 2x", unit="x")
    rates, lines = [], []
    for share, concurrent in ((1.0, 1), (0.25, 4)):
        result = raysearch.sweep(
            "ce", model="cnn", dataset="cifar10", data_dir=str(data_dir), recipe="none",
            num_samples=4, max_concurrent=concurrent, gpus_per_trial=share, epochs=epochs,
            seed=0, name=f"gpu-sharing-{concurrent}x{share:g}-{stamp}", tracking_uri=uri,
            experiment="gpu-acceptance", storage_path=str(scratch / "ray"), progress=None)
        trials = result.trials
        if len(trials) != 4 or not trials["complete"].all():
            raise RuntimeError(f"{int(trials['complete'].sum())} of 4 trials at {share:g} GPU "
                               "completed")
        n_train = int(raysearch_train_size(result))
        rate = 4 * n_train * epochs / result.seconds
        rates.append(rate)
        lines.append(f"{concurrent} at a time at {share:g} GPU: {result.seconds:.1f} s, "
                     f"{rate:,.0f} images/s")
        say(f"  {lines[-1]}")
    fig.value, fig.met = rates[1] / rates[0], rates[1] / rates[0] >= 2.0
    fig.details = (f"{'; '.join(lines)} (4 trials x {epochs} epochs x {n_train} images; "
                   "sweep wall time without Ray's start-up)")
    return fig


def raysearch_train_size(result: Any) -> int:
    """Training images per trial, from the parameters the sweep logged on its parent run."""
    from mlflow import MlflowClient

    run = MlflowClient(result.tracking_uri).get_run(result.parent_run_id)
    return int(run.data.params["data_train_size"])


# --------------------------------------------------------------------------------------------
# 4. streaming pixel metrics against DeepLabV3-ResNet-50's forward pass
# --------------------------------------------------------------------------------------------


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of `fn()` over `repeats` calls after one untimed call (GPU synced)."""
    fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def deeplab_forward(batch: int, size: int, classes: int, repeats: int,
                    device: str = "cuda") -> tuple[float, Any]:
    """(median seconds of one forward pass, float32 logits (N, K, H, W)) of DeepLabV3-R50."""
    from raysearch.training.models import build_model, output_logits

    dev = torch.device(device)
    g = torch.Generator(device=dev).manual_seed(0)
    images = torch.randn(batch, 3, size, size, device=dev, generator=g)
    images = images.contiguous(memory_format=torch.channels_last)
    torch.manual_seed(0)
    net = build_model("deeplabv3_resnet50", num_classes=classes, input_shape=(3, size, size))
    net = net.to(dev).to(memory_format=torch.channels_last).eval()
    with torch.inference_mode():
        forward = median_seconds(lambda: net(images), repeats)
        logits = output_logits(net(images), model="deeplabv3_resnet50").float()
    return forward, logits


def dense_cost(quick: bool, *, batch: int = 8, size: int = 512, device: str = "cuda") -> Figure:
    from torch import nn

    from raysearch.training.dense import evaluate_dense

    classes, repeats = 21, (3 if quick else 10)
    dev = torch.device(device)
    fig = Figure("dense_metrics", "streaming pixel metrics / DeepLabV3-ResNet-50 forward "
                 f"({batch}x3x{size}x{size}, {classes} classes)", "< 10%", unit="%")
    forward, logits = deeplab_forward(batch, size, classes, repeats, device)
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    g = torch.Generator(device=dev).manual_seed(1)
    labels = torch.randint(0, classes, (batch, size, size), device=dev, generator=g)
    labels[torch.rand(batch, size, size, device=dev, generator=g) < 0.05] = 255
    identity = nn.Identity()  # the logits stand for the model's output: only the metrics run
    metrics = median_seconds(lambda: evaluate_dense(identity, [(logits, labels)],
                                                    num_classes=classes, ignore_index=255),
                             repeats)
    share = metrics / forward
    fig.value, fig.met = 100 * share, share < 0.10
    fig.details = (f"metrics {metrics * 1e3:.1f} ms, forward {forward * 1e3:.1f} ms per batch "
                   f"(medians of {repeats}; fp32 forward, channels-last)")
    return fig


# --------------------------------------------------------------------------------------------
# 5. an 8-trial sweep end to end, tracked to MLflow
# --------------------------------------------------------------------------------------------


def sweep_end_to_end(out: Path, scratch: Path, quick: bool, stamp: str) -> Figure:
    import raysearch

    trials_wanted, epochs = 8, 2
    data_dir = write_cifar10(scratch / "cifar-sweep", per_batch=200 if quick else 1000,
                             n_test=500)
    uri = f"sqlite:///{out / 'mlruns.db'}"
    fig = Figure("sweep_e2e", f"{trials_wanted}-trial {epochs}-epoch sweep at 0.5 GPU: trials "
                 "finished with an MLflow child run", f"{trials_wanted} of {trials_wanted}",
                 unit=" trials")
    start = time.perf_counter()
    result = raysearch.sweep(
        "ls", model="resnet20", dataset="cifar10", data_dir=str(data_dir), recipe="none",
        num_samples=trials_wanted, max_concurrent=2, gpus_per_trial=0.5, epochs=epochs, seed=0,
        name=f"gpu-sweep-{stamp}", tracking_uri=uri, experiment="gpu-acceptance",
        storage_path=str(scratch / "ray"), progress=None)
    seconds = time.perf_counter() - start
    good, problems = check_sweep(result, epochs)
    fig.value, fig.met = float(good), good == trials_wanted and len(result.trials) == trials_wanted
    fig.details = (f"{len(result.trials)} trials, {good} complete with a FINISHED child run and "
                   f"metrics, {seconds:.0f} s; store {uri}")
    if problems:
        fig.details += "; " + "; ".join(problems[:4])
    return fig


def check_sweep(result: Any, epochs: int) -> tuple[int, list[str]]:
    """(trials complete with a FINISHED MLflow child run holding their metrics, problems)."""
    from mlflow import MlflowClient

    client = MlflowClient(result.tracking_uri)
    good, problems = 0, []
    for _, row in result.trials.iterrows():
        label = row.get("trial", row.get("run_id"))
        if not bool(row.get("complete")):
            problems.append(f"{label} not complete")
            continue
        run = client.get_run(row["run_id"])
        history = client.get_metric_history(run.info.run_id, "val_ece")
        missing = [k for k in ("test_accuracy", "test_ece") if k not in run.data.metrics]
        if run.data.tags.get("mlflow.parentRunId") != result.parent_run_id:
            problems.append(f"{label}: not a child of the sweep's parent run")
        elif run.info.status != "FINISHED":
            problems.append(f"{label}: MLflow status {run.info.status}")
        elif missing or len(history) != epochs:
            problems.append(f"{label}: missing {', '.join(missing) or 'val_ece'} "
                            f"({len(history)} val_ece steps)")
        else:
            good += 1
    return good, problems


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------


def cell(text: str) -> str:
    """`text` safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def markdown(report: Report) -> str:
    lines = [f"GPU acceptance on {report.device} (torch {report.torch}, CUDA "
             f"{report.cuda or 'none'}, Python {report.python}), {report.started}"
             f"{' (--quick)' if report.quick else ''}", "",
             "| Figure | Value | Goal | Met | Details |", "|---|---|---|---|---|"]
    for f in report.figures:
        met = "-" if f.met is None else ("yes" if f.met else "NO")
        lines.append(f"| {cell(f.title)} | {cell(f.shown())} | {cell(f.goal)} | {met} | "
                     f"{cell(f.details)} |")
    lines += ["", "| Test | Outcome | Seconds |", "|---|---|---|"]
    if "tests" in report.errors:
        lines.append(f"| (pytest -m gpu tests) | error: {cell(report.errors['tests'])} | - |")
    for t in report.tests:
        outcome = t.outcome + (f": {t.message}" if t.message and t.outcome != "passed" else "")
        lines.append(f"| {cell(t.name)} | {cell(outcome)} | {t.seconds:.1f} |")
    counts = {k: sum(t.outcome == k for t in report.tests)
              for k in ("passed", "failed", "error", "skipped")}
    lines += ["", ", ".join(f"{n} {k}" for k, n in counts.items()) + " tests; "
              f"{len(report.errors)} part(s) with an error"]
    return "\n".join(lines) + "\n"


def write_report(report: Report, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    text = markdown(report)
    (out / "gpu_report.md").write_text(text)
    return text


def run_part(report: Report, key: str, title: str, goal: str, fn) -> None:
    """Run one part; a raising part becomes a figure (or test row) holding its error."""
    say(f"{key}: start")
    start = time.perf_counter()
    try:
        value = fn()
    except Exception as exc:  # one broken part must not stop the others
        report.errors[key] = one_line(exc)
        if key != "tests":
            report.figures.append(Figure(key, title, goal, error=report.errors[key]))
        say(f"{key}: error after {time.perf_counter() - start:.0f} s: {report.errors[key]}")
        return
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if key == "tests":
        report.tests = value
        outcomes = ", ".join(f"{sum(t.outcome == k for t in value)} {k}"
                             for k in ("passed", "failed", "error", "skipped"))
        say(f"{key}: done in {time.perf_counter() - start:.0f} s: {outcomes}")
    else:
        report.figures.append(value)
        say(f"{key}: done in {time.perf_counter() - start:.0f} s: {value.shown()} "
            f"(goal {value.goal}: {'met' if value.met else 'NOT met'})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "out", help="report folder")
    ap.add_argument("--quick", action="store_true", help="shorten every measurement")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu_acceptance: no CUDA device found (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda or 'none'}); nothing to do")
        return 0
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    scratch = Path(tempfile.mkdtemp(prefix="gpu_acceptance-"))  # CIFAR files, Tune's storage
    report = Report(device=torch.cuda.get_device_name(), torch=torch.__version__,
                    cuda=torch.version.cuda, python=platform.python_version(),
                    quick=args.quick, started=time.strftime("%Y-%m-%d %H:%M:%S"))
    say(f"gpu_acceptance on {report.device}: torch {report.torch}, CUDA {report.cuda}; "
        f"report in {out}")
    try:
        run_part(report, "tests", "pytest -m gpu tests", "all pass", lambda: run_tests(out))
        run_part(report, "fit_vs_bare", "ResNet-18 training, raysearch fit / bare PyTorch loop",
                 ">= 0.95", lambda: fit_vs_bare(args.quick))
        run_part(report, "gpu_sharing", "4 trials at 0.25 GPU / 1 trial at a time", ">= 2x",
                 lambda: gpu_sharing(out, scratch, args.quick, stamp))
        run_part(report, "dense_metrics", "streaming pixel metrics / DeepLabV3-ResNet-50 forward",
                 "< 10%", lambda: dense_cost(args.quick))
        run_part(report, "jpeg_loader", "JPEG folder loader / ResNet-50 bf16 training",
                 ">= 1.0", lambda: jpeg_feed(args.quick))
        run_part(report, "sweep_e2e", "8-trial 2-epoch sweep at 0.5 GPU", "8 of 8",
                 lambda: sweep_end_to_end(out, scratch, args.quick, stamp))
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    print(write_report(report, out))
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
