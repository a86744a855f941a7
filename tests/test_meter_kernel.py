"""The fused class-wise kernels of the meter (raysearch.metrics.meter_kernel) on the CPU.

Triton's interpreter (``TRITON_INTERPRET=1``, read when the kernels are defined) runs the
kernels on CPU tensors, so these tests run in a fresh Python process with the variable set and
the CPU added to the kernel's devices. Every case compares a meter that takes the fused path
with one that takes the plain-torch path on the same batch: the class-wise counts must be
equal, every metric equal to 1e-12. The GPU acceptance run (``benchmarks/gpu_acceptance.py``)
checks the compiled kernels against the CPU on a real GPU.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton", reason="Triton is not installed (the fused path is then unused)")

SCRIPT = textwrap.dedent(
    """
    import json, math, sys
    import torch
    from raysearch.metrics import CalibrationMeter
    from raysearch.metrics import meter_kernel
    from raysearch.metrics import binning

    def meter(p, y, fused, **kw):
        meter_kernel.KERNEL_DEVICES.clear()
        if fused:
            meter_kernel.KERNEL_DEVICES.add("cpu")
        blocks = p.reshape(p.shape[0], p.shape[1], -1)
        assert meter_kernel.kernel_ready(blocks, kw.get("n_bins", 15)) == fused
        m = CalibrationMeter(p.shape[1], **kw)
        m.update(p, y)
        return m

    def compare(name, p, y, **kw):
        plain, fused = meter(p, y, False, **kw), meter(p, y, True, **kw)
        same = torch.equal(plain._state["class_counts"], fused._state["class_counts"])
        a, b = plain.compute(), fused.compute()
        diff = max(abs(a[k] - b[k]) for k in a if not math.isnan(a[k]))
        return {"case": name, "counts_equal": same, "max_diff": diff,
                "class_scores": plain._state["class_scores"].sum().item()}

    g = torch.Generator().manual_seed(0)
    cases = []
    for n_bins in (15, 2, 32):
        logits = 3 * torch.randn(2, 5, 17, 19, generator=g)
        y = torch.randint(0, 5, (2, 17, 19), generator=g)
        y[torch.rand(2, 17, 19, generator=g) < 0.1] = 255
        cases.append(compare(f"{n_bins} bins", logits.softmax(1), y, n_bins=n_bins,
                             ignore_index=255))
    cl = (3 * torch.randn(2, 21, 12, 12, generator=g)).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 21, (2, 12, 12), generator=g)
    cases.append(compare("channels-last", cl.softmax(1), y, ignore_index=255))
    p = torch.randn(300, 7, generator=g, dtype=torch.float64).softmax(1)
    cases.append(compare("classification float64", p, torch.randint(0, 7, (300,), generator=g)))
    # scores exactly on the edges: bin b holds (e_b, e_{b+1}], as torch.bucketize(right=False)
    edges = torch.from_numpy(binning._equal_width_edges(15)).float()
    first = edges.repeat(5)[: 80].view(1, 1, 80)
    p = torch.cat([first, 1 - first], dim=1)
    cases.append(compare("scores on the edges", p, torch.zeros(1, 80, dtype=torch.int64)))
    # a bad batch raises the same error on both paths
    bad = torch.full((1, 5, 8, 8), 0.2)
    bad[0, 1, 0, 0] = float("nan")
    errors = []
    for fused in (False, True):
        try:
            meter(bad, torch.zeros(1, 8, 8, dtype=torch.int64), fused)
        except ValueError as exc:
            errors.append(str(exc))
    json.dump({"cases": cases, "errors": errors}, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def results() -> dict:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_fused_counts_equal_the_plain_torch_path(results):
    assert [c["case"] for c in results["cases"]] == [
        "15 bins", "2 bins", "32 bins", "channels-last", "classification float64",
        "scores on the edges",
    ]
    for case in results["cases"]:
        assert case["counts_equal"], case


def test_fused_metrics_equal_the_plain_torch_path(results):
    for case in results["cases"]:
        assert case["max_diff"] <= 1e-12, case
        assert case["class_scores"] > 0, case  # the sums were filled


def test_a_bad_batch_raises_the_same_error_on_both_paths(results):
    assert results["errors"] == ["`probs` must be finite; a valid pixel holds NaN or inf"] * 2


def test_the_fused_path_is_off_the_gpu_and_for_many_bins_or_classes():
    import torch

    from raysearch.metrics import meter_kernel

    assert meter_kernel.KERNEL_DEVICES == {"cuda"}
    x = torch.rand(2, 21, 4096)
    assert not meter_kernel.kernel_ready(x, 15)  # a CPU tensor: the plain-torch path
    meter_kernel.KERNEL_DEVICES.add("cpu")
    try:
        assert meter_kernel.kernel_ready(x, 15)
        assert not meter_kernel.kernel_ready(x, meter_kernel.KERNEL_MAX_BINS + 1)
        assert not meter_kernel.kernel_ready(torch.rand(1, meter_kernel.KERNEL_MAX_CLASSES + 1,
                                                        4096), 15)
        assert not meter_kernel.kernel_ready(torch.rand(8, 3, 4), 15)  # 4 pixels per image
        assert meter_kernel.kernel_ready(torch.rand(8, 3, 1), 15)  # rows of a classifier
    finally:
        meter_kernel.KERNEL_DEVICES.discard("cpu")


def test_kernels_that_fail_leave_the_meter_in_plain_torch(monkeypatch, caplog):
    # Triton builds a C launcher on first use: a machine without a compiler makes the kernels
    # raise. The block is recomputed in plain torch, one warning, the path stays off.
    import torch

    from raysearch.metrics import CalibrationMeter, meter_kernel

    class Broken:  # launched as kernel[grid](...), as a Triton kernel
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                raise RuntimeError("Failed to find C compiler. Please specify via CC "
                                   "environment variable.")
            return launch

    monkeypatch.setattr(meter_kernel, "_kernels", lambda: (Broken(), Broken()))
    monkeypatch.setattr(meter_kernel, "KERNEL_DEVICES", {"cpu"})
    g = torch.Generator().manual_seed(3)
    p = (2 * torch.randn(2, 5, 9, 9, generator=g)).softmax(1)
    y = torch.randint(0, 5, (2, 9, 9), generator=g)
    y[0, 0] = 255
    fallback = CalibrationMeter(5, ignore_index=255)
    with caplog.at_level("WARNING", logger="raysearch.metrics.meter_kernel"):
        fallback.update(p, y)
        fallback.update(p, y)
    assert meter_kernel.KERNEL_DEVICES == set()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "C compiler" in warnings[0]
    plain = CalibrationMeter(5, ignore_index=255)
    plain.update(p, y)
    plain.update(p, y)
    assert torch.equal(fallback._state["class_counts"], plain._state["class_counts"])
    assert fallback.compute() == pytest.approx(plain.compute(), abs=0, nan_ok=True)
