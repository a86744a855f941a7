"""The per-bin sums of :class:`~raysearch.metrics.meter.CalibrationMeter`, batch by batch.

:class:`_UpdateSums` turns one batch of probabilities (any device) into the meter's sums
(per-bin counts, confidences and hits, NLL, Brier and class-wise sums) in blocks of
:data:`_METER_BLOCK_ENTRIES` entries, binning with
:func:`~raysearch.metrics.binning._torch_equal_width_bins`. Plain torch; imports
:mod:`raysearch.metrics._checks` and :mod:`~raysearch.metrics.binning` of the package.
:mod:`raysearch.metrics.meter` re-exports every name here.
"""

import functools
import math
from typing import Any

import numpy as np
import torch

from raysearch.metrics.binning import (
    _equal_width_edges,
    _torch_equal_width_bins,
)
from raysearch.metrics.meter_kernel import disable, fused_class_sums

#: Entries of ``probs`` per block of :meth:`CalibrationMeter.update` on the CPU (in cache) and
#: on accelerators (fewer kernel launches); its temporaries take ~40 bytes per entry.
_METER_BLOCK_ENTRIES = {"cpu": 1 << 20, "accelerator": 1 << 24}
#: Pixels per block where the class-wise sums take the fused kernel
#: (:func:`~raysearch.metrics.meter_kernel.fused_class_sums`): no temporary holds all K scores,
#: the per-pixel ones take ~150 bytes per pixel (~0.6 GiB), and a VOC batch is one block.
_METER_BLOCK_PIXELS_FUSED = 1 << 22
#: Copies of each histogram of an update on the CPU and on accelerators, at most. On a GPU,
#: most of a segmentation batch's K scores fall in the first bin of their class: thousands of
#: threads adding to the same few slots wait on each other (atomic adds to one address run
#: one at a time; on an H200, 85% of an 8 x 21 x 512 x 512 update went there with one copy).
#: Pixel i adds to copy ``i % R`` and the copies are summed once per update. The CPU adds in
#: order and needs one.
_METER_REPLICAS = {"cpu": 1, "accelerator": 512}
#: A histogram takes fewer copies when R copies would exceed this many slots (8 MiB of
#: float64): a (K, K) confusion matrix of 1,000 classes gets one.
_METER_REPLICA_SLOTS = 1 << 20
#: Floor on the probability of the true class in the meter's NLL, as in :func:`nll`.
_METER_NLL_EPS = 1e-12
#: Floating dtypes the meter works in; float16 and bfloat16 become float32, as in the functions.
_METER_WORK_DTYPES = (torch.float32, torch.float64)


def _meter_tensor(name: str, value: Any) -> torch.Tensor:
    """A torch view of a tensor (detached) or a NumPy array / sequence (on the CPU)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    array = np.asarray(value)
    if array.dtype == object or not (
        array.dtype == np.bool_ or np.issubdtype(array.dtype, np.number)
    ):
        raise TypeError(f"`{name}` must hold numbers, got dtype {array.dtype}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    return torch.from_numpy(np.ascontiguousarray(array))


def _index_add_ones(out: torch.Tensor, index: torch.Tensor) -> None:
    """``out[i] += 1`` for every entry i of ``index`` (int64 ``out``, repeated indices add up).

    ``index_add_`` rather than ``torch.bincount``, which synchronises with the host on CUDA
    (it reads the largest index).
    """
    index = index.reshape(-1)
    ones = torch.ones(1, dtype=torch.int64, device=index.device)
    out.index_add_(0, index, ones.expand(index.numel()))


@functools.lru_cache(maxsize=32)
def _edges_on(n_bins: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The (M + 1,) equal-width edges on `device`, copied there once per process (read-only).

    A host-to-device copy of a pageable array waits for the device's queued work: copying the
    edges (and :func:`_check_constants`) at every update made the GPU meter wait three times
    per batch.
    """
    return torch.from_numpy(_equal_width_edges(n_bins)).to(device, dtype)


@functools.lru_cache(maxsize=8)
def _check_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The checks' start values and which take the minimum, on `device` (read-only, cached)."""
    start = torch.tensor([math.inf, -math.inf, math.inf, -math.inf, 0.0], dtype=torch.float64)
    take_min = torch.tensor([True, False, True, False, False])
    return start.to(device), take_min.to(device)


class _UpdateSums:
    """The sums of one :meth:`CalibrationMeter.update`, added block by block.

    Histograms hold one more slot than the state: pixels to drop (ignored labels) are sent to
    that last slot instead of being removed, so that no step depends on how many pixels are
    valid (no host synchronisation on CUDA). They are added to the state only after the
    checks have passed, and after :meth:`fold`.

    With ``replicas`` R > 1 a histogram of J slots holds ``r = min(R, max(1,
    _METER_REPLICA_SLOTS // J))`` copies (slot j of copy c at ``j * r + c``) and pixel i of a
    block adds to copy ``i % r`` (see :data:`_METER_REPLICAS`); :meth:`fold` sums the copies.
    The integer counts are the same for any R; float sums may differ in the last bits (another
    order of addition).
    """

    def __init__(
        self,
        num_classes: int,
        edges: torch.Tensor,
        ignore_index: int | None,
        background: int | None,
        replicas: int = 1,
        fused: bool = False,
    ) -> None:
        k, m = num_classes, edges.numel() - 1
        # class-wise sums by fused_class_sums (the caller's kernel_ready; off if it raises)
        self.fused = fused
        self.k, self.m, self.edges = k, m, edges
        self.ignore_index, self.background = ignore_index, background
        device = edges.device
        self.copies: dict[int, int] = {}  # copies of each histogram, by its number of slots
        self._lanes: dict[tuple[int, int, int], torch.Tensor] = {}
        self._histograms: dict[str, int] = {}  # name -> slots, for fold()

        def zeros(name: str, size: int, dtype: torch.dtype) -> torch.Tensor:
            """Histogram `name` of `size` slots, in its copies."""
            r = max(1, min(int(replicas), _METER_REPLICA_SLOTS // size))
            self.copies[size] = r
            self._histograms[name] = size
            return torch.zeros(size * r, dtype=dtype, device=device)

        # slot 2b + hit of confidence bin b
        self.top_pairs = zeros("top_pairs", 2 * m + 1, torch.int64)
        self.top_conf = zeros("top_conf", m + 1, torch.float64)
        # slot c*M + b of score p_c
        self.class_counts = zeros("class_counts", k * m + 1, torch.int64)
        self.class_scores = zeros("class_scores", k * m + 1, torch.float64)
        self.class_hits = zeros("class_hits", k * m + 1, torch.int64)  # slot y*M + b of p_y
        self.confusion = zeros("confusion", k * k + 1, torch.int64)  # slot y*K + argmax
        # per bin: sum of hit - confidence
        self.released = zeros("released", m, torch.float64)
        # sum of -log max(p_y, eps), sum of 1 - 2 p_y + sum_k p_k^2, released pixels
        self.sums = torch.zeros(3, dtype=torch.float64, device=device)
        # lowest and highest valid label, lowest valid entry, highest valid confidence, largest
        # |row sum - 1| of a valid pixel
        start, self.take_min = _check_constants(device)
        self.checks = start.clone()
        self.offsets = (torch.arange(k, device=device) * m).view(1, k, 1)

    def add(
        self, x: torch.Tensor, y: torch.Tensor, keys: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Add a block; return its pixels' confidence (float64) and hit, and mask its keys.

        Args:
            x: (B, K, S) probabilities, any float dtype.
            y: (B, S) integer labels.
            keys: (B, S) float64 sample keys of these pixels, set to inf where dropped.
        """
        k, m, edges = self.k, self.m, self.edges
        x = x.to(edges.dtype)
        if not self.fused:  # the kernels take any strides
            x = x.contiguous()  # a block of pixels is a strided view of the batch
        y = y.to(torch.int64)
        valid = None if self.ignore_index is None else y != self.ignore_index
        released = valid
        if self.background is not None:
            foreground = y != self.background
            released = foreground if valid is None else valid & foreground
        # the complements, once: pixels dropped from the sums, and from the released ECE
        dropped = None if valid is None else ~valid
        unreleased = None if released is None else ~released

        def drop(index: torch.Tensor, slots: int, mask: torch.Tensor | None) -> torch.Tensor:
            """Slots of a histogram of `slots` (pixels in `mask`: the last), in its copies."""
            index = index if mask is None else index.masked_fill_(mask, slots - 1)
            return self._spread(index, slots)

        def zero(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            return values if mask is None else values.masked_fill_(mask, 0)

        # Labels: checked over valid pixels, clamped so that gathers stay in range (a bad label
        # raises after the loop, before the state changes).
        checked = y if dropped is None else y.masked_fill(dropped, 0)
        low_label, high_label = torch.aminmax(checked)
        labels = checked.clamp(0, k - 1)  # not in place: `checked` may be the caller's labels

        # Top-1 per pixel: confidence bins, hits, confusion.
        conf, pred = x.max(dim=1)  # first index on ties, as np.argmax
        hits = pred == labels
        bins = _torch_equal_width_bins(conf, edges)
        conf64 = conf.to(torch.float64)
        _index_add_ones(self.top_pairs, drop(2 * bins + hits, 2 * m + 1, dropped))
        self.top_conf.index_add_(
            0, drop(bins.clone(), m + 1, dropped).reshape(-1), conf64.reshape(-1)
        )
        _index_add_ones(self.confusion, drop(labels * k + pred, k * k + 1, dropped))
        # The released evaluator's n_b * ECE_b = sum over bins of |hits - confidences|.
        gaps = zero(hits.to(torch.float64) - conf64, unreleased)
        self.released.index_add_(0, self._spread(bins, m).reshape(-1), gaps.reshape(-1))

        # True class: NLL (-log max(p_y, eps), as `nll`), Brier (1 - 2 p_y + sum_k p_k^2, as
        # `brier`) and the class-wise hits (slot y*M + bin of p_y).
        true_prob = x.gather(1, labels.unsqueeze(1)).squeeze(1)
        true_slots = _torch_equal_width_bins(true_prob, edges).add_(labels * m)
        _index_add_ones(self.class_hits, drop(true_slots, k * m + 1, dropped))
        true_prob = true_prob.to(torch.float64)

        # All K scores: class-wise counts and sums (class c owns slots c*M ... c*M + M - 1),
        # squares for the Brier score, row sums and the lowest entry for the checks.
        sums = self._fused_class_sums(x, valid) if self.fused else None
        if sums is not None:
            counts, scores, row_sums, squares, low = sums
            self.class_counts.view(k * m + 1, -1)[: k * m, 0] += counts.reshape(-1)
            self.class_scores.view(k * m + 1, -1)[: k * m, 0] += scores.reshape(-1)
        else:
            row_sums, squares, low = self._class_sums(x, dropped)
        high = conf
        if dropped is not None:
            row_sums.masked_fill_(dropped, 1.0)
            low = low.masked_fill_(dropped, math.inf)
            high = conf.masked_fill(dropped, -math.inf)
        brier = 1.0 - 2.0 * true_prob + squares
        nll = -torch.log(true_prob.clamp_(min=_METER_NLL_EPS))
        if released is None:  # a fill, not a host-to-device copy (no stream synchronisation)
            n_released = torch.full((), hits.numel(), dtype=torch.float64, device=x.device)
        else:
            n_released = released.sum().to(torch.float64)
        self.sums += torch.stack([zero(nll, dropped).sum(), zero(brier, dropped).sum(),
                                  n_released])
        block = torch.stack(
            [
                low_label.to(torch.float64),
                high_label.to(torch.float64),
                low.min().to(torch.float64),
                high.max().to(torch.float64),
                (row_sums - 1.0).abs().max(),
            ]
        )
        self.checks = torch.where(
            self.take_min,
            torch.minimum(self.checks, block),
            torch.maximum(self.checks, block),
        )
        if dropped is not None:
            keys.masked_fill_(dropped, math.inf)
        return conf64, hits

    def _fused_class_sums(self, x: torch.Tensor, valid: torch.Tensor | None) -> Any:
        """:func:`fused_class_sums` of the block, or None (and the kernels off) if it raised."""
        try:
            return fused_class_sums(x, valid, self.edges)
        except Exception as exc:  # a GPU without a C compiler for Triton's launcher, say
            disable(exc)
            self.fused = False
            return None

    def _class_sums(
        self, x: torch.Tensor, dropped: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add the class-wise counts and sums in plain torch.

        Returns each pixel's (B, S) row sum, sum of squares (float64) and lowest entry, as
        :func:`fused_class_sums`.
        """
        k, m = self.k, self.m
        slots = _torch_equal_width_bins(x, self.edges).add_(self.offsets)
        if dropped is not None:
            slots.masked_fill_(dropped.unsqueeze(1), k * m)  # (B, 1, S)
        slots = self._spread(slots, k * m + 1)
        _index_add_ones(self.class_counts, slots)
        x64 = x.to(torch.float64)
        self.class_scores.index_add_(0, slots.reshape(-1), x64.reshape(-1))
        row_sums = x64.sum(dim=1)
        squares = torch.linalg.vecdot(x64, x64, dim=1)
        return row_sums, squares, x.amin(dim=1)

    def _spread(self, index: torch.Tensor, size: int) -> torch.Tensor:
        """`index` (in place) into the copies of a histogram of `size` slots: pixel i's copy.

        `index` is (B, S) (a slot per pixel) or (B, K, S) (a slot per class score of each
        pixel); its pixels are those of the block in order, i = b * S + s.
        """
        r = self.copies[size]
        if r == 1:
            return index
        b, s = index.shape[0], index.shape[-1]
        if (b, s, r) not in self._lanes:
            i = torch.arange(b * s, dtype=torch.int64, device=index.device)
            self._lanes[(b, s, r)] = i.remainder_(r).view(b, s)
        lane = self._lanes[(b, s, r)]
        return index.mul_(r).add_(lane if index.ndim == 2 else lane.unsqueeze(1))

    def fold(self) -> None:
        """Sum the copies of every histogram into one (after the last block; once)."""
        for name, size in self._histograms.items():
            if self.copies[size] > 1:
                setattr(self, name, getattr(self, name).view(size, -1).sum(dim=1))
        self.copies = dict.fromkeys(self.copies, 1)
