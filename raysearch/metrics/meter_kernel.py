"""Fused GPU passes for the class-wise sums of :class:`~raysearch.metrics.meter.CalibrationMeter`.

The class-wise part of a meter update touches all K scores of every pixel: per class c and
equal-width bin b, the number of valid pixels whose score p_c falls in b and the sum of those
scores (the classwise ECE of Kull et al., NeurIPS 2019, as :mod:`~raysearch.metrics.classwise`),
plus each pixel's row sum (the probability check), sum of squares (the Brier score) and lowest
entry. In plain torch that is ~15 passes over the (N, K, S) scores and two scatters of N*K*S
entries into K*M slots: ~35% of DeepLabV3-ResNet-50's forward pass on an 8 x 21 x 512 x 512
VOC batch on an H200 (``benchmarks/gpu_acceptance.py``).

:func:`fused_class_sums` reads the scores twice, in two Triton kernels. ``class_bins``: a
program takes one class and a group of pixels, bins each score by counting the inner edges
below it (the bins of :func:`~raysearch.metrics.binning._torch_equal_width_bins`:
``torch.bucketize`` with ``right=False``), adds its one-hot bin to per-lane sums in registers,
and reduces the lanes once at the end into its own (M,) partial counts and sums (no atomics:
the same result on every run), which torch adds up. ``row_stats``: the per-pixel sums over the
K scores. Counts equal the plain-torch path's exactly; float64 sums differ in the last bits
(another order of addition).

Triton comes with PyTorch's CUDA wheels for Linux; where it is missing, or the scores are not
on a CUDA device, :func:`kernel_ready` is False and the meter takes its plain-torch path. Where
the kernels fail to compile or launch (Triton builds a small C launcher with the machine's
compiler on first use), :func:`disable` logs one warning and the process goes on in plain
torch. The tests run the kernels on the CPU through Triton's interpreter
(``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

#: Device types on which the meter takes the fused path (the tests add "cpu" under Triton's
#: interpreter).
KERNEL_DEVICES = {"cuda"}
#: Most equal-width bins the fused path handles (one-hot over the next power of two in
#: registers); more bins take the plain-torch path.
KERNEL_MAX_BINS = 32
#: Most classes the fused path handles (``row_stats`` holds each pixel's K scores, padded to a
#: power of two, in one tile; checked on a GPU up to K = 100); more take the plain-torch path.
KERNEL_MAX_CLASSES = 128
#: Pixels of one step of a class-wise program (its one-hot bins: this many x the padded bins,
#: summed per lane in registers).
_PIXELS_PER_STEP = 256
#: Programs of one class-wise launch, about (K x pixel groups x images; class fastest, so
#: that the K programs of a group read the same pixels' lines together): enough to hide the
#: latency of each step's load.
_PROGRAMS = 16384
#: Fewest pixels per image the fused path takes (programs run over one image's pixels), but
#: for one (classification: the rows become one image).
_MIN_PIXELS = 64
#: Entries (pixels x padded classes) of one row-statistics program.
_ROW_ENTRIES = 2048


@functools.cache
def _kernels() -> Any:
    """The two Triton kernels (compiled on first call), or None where Triton does not import."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def class_bins(
        x_ptr, valid_ptr, edges_ptr, counts_ptr, scores_ptr,
        S, stride_b, stride_k, stride_s, chunks,
        M: tl.constexpr, SLOTS: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr,
    ):
        # class c's scores of pixels s of image b in group g: `chunks` steps of BLOCK pixels,
        # one-hot bins summed per lane in registers, across lanes once at the end
        c = tl.program_id(0)
        g = tl.program_id(1)
        b = tl.program_id(2)
        slots = tl.arange(0, SLOTS)
        count = tl.zeros([BLOCK, SLOTS], dtype=tl.int32)
        total = tl.zeros([BLOCK, SLOTS], dtype=tl.float64)
        scores = x_ptr + b.to(tl.int64) * stride_b + c.to(tl.int64) * stride_k
        kept = valid_ptr + b.to(tl.int64) * S
        for i in range(chunks):
            pix = (g * chunks + i) * BLOCK + tl.arange(0, BLOCK)
            inside = pix < S
            keep = inside
            if MASKED:
                keep = inside & (tl.load(kept + pix, mask=inside, other=0) != 0)
            v = tl.load(scores + pix.to(tl.int64) * stride_s, mask=inside, other=0.0)
            bins = tl.zeros([BLOCK], dtype=tl.int32)
            for j in tl.static_range(1, M):  # inner edges e_1 .. e_{M-1}: bin = #{e_j < v}
                bins += (v > tl.load(edges_ptr + j)).to(tl.int32)
            hit = (bins[:, None] == slots[None, :]) & keep[:, None]
            count += hit.to(tl.int32)
            total += tl.where(hit, v.to(tl.float64)[:, None], 0.0)
        part = ((b * tl.num_programs(1) + g) * tl.num_programs(0) + c) * SLOTS + slots
        tl.store(counts_ptr + part, tl.sum(count, axis=0))
        tl.store(scores_ptr + part, tl.sum(total, axis=0))

    @triton.jit
    def row_stats(
        x_ptr, rows_ptr, squares_ptr, low_ptr, S, K, stride_b, stride_k, stride_s,
        KP: tl.constexpr, BLOCK: tl.constexpr,
    ):
        # per pixel s of image b: sum, sum of squares (float64) and lowest of its K scores
        pix = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        b = tl.program_id(1).to(tl.int64)
        inside = pix < S
        classes = tl.arange(0, KP)
        real = classes < K
        at = pix.to(tl.int64)[:, None] * stride_s + classes.to(tl.int64)[None, :] * stride_k
        v = tl.load(x_ptr + b * stride_b + at, mask=inside[:, None] & real[None, :], other=0.0)
        v = v.to(tl.float64)
        out = b * S + pix
        tl.store(rows_ptr + out, tl.sum(v, axis=1), mask=inside)
        tl.store(squares_ptr + out, tl.sum(v * v, axis=1), mask=inside)
        lowest = tl.min(tl.where(real[None, :], v, float("inf")), axis=1)
        tl.store(low_ptr + out, lowest, mask=inside)

    return class_bins, row_stats


def disable(error: BaseException) -> None:
    """Take the plain-torch path from now on in this process, after the kernels raised `error`.

    Logs one warning naming the error; the meter recomputes the block in plain torch.
    """
    if KERNEL_DEVICES:
        logger.warning("the meter's fused GPU kernels failed (%s: %s); it goes on in plain "
                       "torch", type(error).__name__, " ".join(str(error).split())[:300])
    KERNEL_DEVICES.clear()


def kernel_ready(x: torch.Tensor, n_bins: int) -> bool:
    """Whether :func:`fused_class_sums` runs for (B, K, S) scores `x` in `n_bins` bins.

    Any float dtype: the meter works in float32 or float64.
    """
    return (
        x.device.type in KERNEL_DEVICES
        and n_bins <= KERNEL_MAX_BINS
        and x.shape[1] <= KERNEL_MAX_CLASSES
        and (x.shape[2] == 1 or x.shape[2] >= _MIN_PIXELS)
        and _kernels() is not None
    )


def fused_class_sums(
    x: torch.Tensor, valid: torch.Tensor | None, edges: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Class-wise bin counts and score sums, and each pixel's row sum, squares and lowest entry.

    Args:
        x: (B, K, S) float32 or float64 probabilities, any strides (a block of the batch).
        valid: (B, S) bool, False for dropped pixels (ignored labels), or None (all valid).
        edges: (M + 1,) equal-width bin edges in `x`'s dtype, on its device (M <=
            :data:`KERNEL_MAX_BINS`).

    Returns:
        ``(counts, scores, row_sums, squares, low)``: int64 (K, M) valid pixels per class and
        bin of its score, float64 (K, M) the sum of those scores; float64 (B, S) sum over k of
        p_k, float64 (B, S) sum over k of p_k**2 and float64 (B, S) min over k of p_k, for every
        pixel (dropped ones too: the caller masks them).
    """
    class_bins, row_stats = _kernels()
    n, k, s = x.shape
    if s == 1 and n > 1:  # one pixel per image (classification): the N rows as one image
        counts, scores, row_sums, squares, low = fused_class_sums(
            x.permute(2, 1, 0), None if valid is None else valid.reshape(1, n), edges
        )
        return counts, scores, row_sums.view(n, 1), squares.view(n, 1), low.view(n, 1)
    m = edges.numel() - 1
    slots = max(2, 1 << (m - 1).bit_length())
    step = _PIXELS_PER_STEP
    groups = max(1, min(-(-_PROGRAMS // (k * n)), -(-s // step)))  # per image
    chunks = -(-s // (step * groups))  # steps of a program
    groups = -(-s // (step * chunks))
    device = x.device
    counts = torch.empty((n * groups, k, slots), dtype=torch.int32, device=device)
    scores = torch.empty((n * groups, k, slots), dtype=torch.float64, device=device)
    mask = counts if valid is None else valid.contiguous()
    edges = edges.contiguous()
    class_bins[(k, groups, n)](
        x, mask, edges, counts, scores, s, x.stride(0), x.stride(1), x.stride(2), chunks,
        M=m, SLOTS=slots, BLOCK=step, MASKED=valid is not None, num_warps=8,
    )
    row_sums = torch.empty((n, s), dtype=torch.float64, device=device)
    squares = torch.empty((n, s), dtype=torch.float64, device=device)
    low = torch.empty((n, s), dtype=torch.float64, device=device)
    padded = max(2, 1 << (k - 1).bit_length())
    block = max(1, _ROW_ENTRIES // padded)
    row_stats[(-(-s // block), n)](
        x, row_sums, squares, low, s, k, x.stride(0), x.stride(1), x.stride(2),
        KP=padded, BLOCK=block,
    )
    counts = counts.sum(dim=0, dtype=torch.int64)[:, :m]
    return counts, scores.sum(dim=0)[:, :m], row_sums, squares, low
