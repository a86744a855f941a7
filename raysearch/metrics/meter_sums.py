"""The per-bin sums of :class:`~raysearch.metrics.meter.CalibrationMeter`, and their metrics.

:class:`_UpdateSums` turns one batch of probabilities (any device) into the meter's sums
(per-bin counts, confidences and hits, NLL, Brier and class-wise sums) in blocks of
:data:`_METER_BLOCK_ENTRIES` entries, binning with
:func:`~raysearch.metrics.binning._torch_equal_width_bins`; :func:`batch_sums` runs it over a
batch, :func:`check_batch` raises for a bad batch, :func:`add_to_state` adds its sums to the
meter's state and :func:`state_metrics` reduces that state to the meter's metrics with the
NumPy helpers of :mod:`raysearch.metrics.binning`. Plain torch; imports
:mod:`raysearch.metrics.checks`, :mod:`~raysearch.metrics.binning` and
:mod:`~raysearch.metrics.meter_kernel` of the package.
"""

import functools
import math
from typing import Any

import numpy as np
import torch

from raysearch.metrics.binning import (
    _bin_means,
    _equal_width_edges,
    _reduce_gaps,
    _torch_equal_width_bins,
    binned_ece,
)
from raysearch.metrics.checks import _PROB_TOLERANCE
from raysearch.metrics.meter_kernel import disable, fused_class_sums, kernel_ready

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


def _zeroed(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`values` with the entries in `mask` set to 0 (in place), or as they are."""
    return values if mask is None else values.masked_fill_(mask, 0)


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
        x = x.to(self.edges.dtype)
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

        # Labels: checked over valid pixels, clamped so that gathers stay in range (a bad label
        # raises after the loop, before the state changes).
        checked = y if dropped is None else y.masked_fill(dropped, 0)
        label_range = torch.aminmax(checked)
        labels = checked.clamp(0, self.k - 1)  # not in place: `checked` may be the caller's
        conf, conf64, hits = self._add_top1(x, labels, dropped, unreleased)
        true_prob = self._add_true_class(x, labels, dropped)
        # All K scores: class-wise counts and sums (class c owns slots c*M ... c*M + M - 1),
        # squares for the Brier score, row sums and the lowest entry for the checks.
        sums = self._fused_class_sums(x, valid) if self.fused else None
        if sums is not None:
            counts, scores, row_sums, squares, low = sums
            k, m = self.k, self.m
            self.class_counts.view(k * m + 1, -1)[: k * m, 0] += counts.reshape(-1)
            self.class_scores.view(k * m + 1, -1)[: k * m, 0] += scores.reshape(-1)
        else:
            row_sums, squares, low = self._class_sums(x, dropped)
        self._add_checks(label_range, row_sums, low, conf, dropped)
        self._add_scores(true_prob, squares, hits, released, dropped)
        if dropped is not None:
            keys.masked_fill_(dropped, math.inf)
        return conf64, hits

    def _slots(self, index: torch.Tensor, slots: int, mask: torch.Tensor | None) -> torch.Tensor:
        """Slots of a histogram of `slots` (pixels in `mask`: the last), in its copies."""
        index = index if mask is None else index.masked_fill_(mask, slots - 1)
        return self._spread(index, slots)

    def _add_top1(
        self, x: torch.Tensor, labels: torch.Tensor, dropped: torch.Tensor | None,
        unreleased: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Top-1 per pixel: confidence bins, hits, confusion and the released evaluator's gaps.

        Returns each pixel's confidence (dtype of `x`, and float64) and hit.
        """
        k, m = self.k, self.m
        conf, pred = x.max(dim=1)  # first index on ties, as np.argmax
        hits = pred == labels
        bins = _torch_equal_width_bins(conf, self.edges)
        conf64 = conf.to(torch.float64)
        _index_add_ones(self.top_pairs, self._slots(2 * bins + hits, 2 * m + 1, dropped))
        self.top_conf.index_add_(
            0, self._slots(bins.clone(), m + 1, dropped).reshape(-1), conf64.reshape(-1)
        )
        _index_add_ones(self.confusion, self._slots(labels * k + pred, k * k + 1, dropped))
        # The released evaluator's n_b * ECE_b = sum over bins of |hits - confidences|.
        gaps = _zeroed(hits.to(torch.float64) - conf64, unreleased)
        self.released.index_add_(0, self._spread(bins, m).reshape(-1), gaps.reshape(-1))
        return conf, conf64, hits

    def _add_true_class(
        self, x: torch.Tensor, labels: torch.Tensor, dropped: torch.Tensor | None
    ) -> torch.Tensor:
        """Class-wise hits (slot y*M + bin of p_y); returns p_y of every pixel in float64."""
        true_prob = x.gather(1, labels.unsqueeze(1)).squeeze(1)
        true_slots = _torch_equal_width_bins(true_prob, self.edges).add_(labels * self.m)
        _index_add_ones(self.class_hits, self._slots(true_slots, self.k * self.m + 1, dropped))
        return true_prob.to(torch.float64)

    def _add_scores(
        self, true_prob: torch.Tensor, squares: torch.Tensor, hits: torch.Tensor,
        released: torch.Tensor | None, dropped: torch.Tensor | None,
    ) -> None:
        """NLL (-log max(p_y, eps), as `nll`), Brier (1 - 2 p_y + sum_k p_k^2, as `brier`)."""
        brier = 1.0 - 2.0 * true_prob + squares
        nll = -torch.log(true_prob.clamp_(min=_METER_NLL_EPS))
        if released is None:  # a fill, not a host-to-device copy (no stream synchronisation)
            n_released = torch.full((), hits.numel(), dtype=torch.float64, device=hits.device)
        else:
            n_released = released.sum().to(torch.float64)
        self.sums += torch.stack([_zeroed(nll, dropped).sum(), _zeroed(brier, dropped).sum(),
                                  n_released])

    def _add_checks(
        self, label_range: tuple[torch.Tensor, torch.Tensor], row_sums: torch.Tensor,
        low: torch.Tensor, conf: torch.Tensor, dropped: torch.Tensor | None,
    ) -> None:
        """Fold the block's label range, lowest entry, highest confidence and row sums in."""
        high = conf
        if dropped is not None:
            row_sums.masked_fill_(dropped, 1.0)
            low = low.masked_fill_(dropped, math.inf)
            high = conf.masked_fill(dropped, -math.inf)
        low_label, high_label = label_range
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


def state_layout(num_classes: int, n_bins: int, samples: int
                 ) -> dict[str, tuple[int, torch.dtype]]:
    """``{name: (size, dtype)}`` of the 1-D tensors of a meter's state.

    K classes, M bins and a sample of at most `samples` pixels behind ``aece``.
    """
    k, m, cap = num_classes, n_bins, samples
    return {
        "top_counts": (m, torch.int64),  # valid pixels per confidence bin
        "top_hits": (m, torch.int64),  # of which the argmax is the label
        "top_conf": (m, torch.float64),  # sum of their confidences
        "class_counts": (k * m, torch.int64),  # (K, M): pixels whose p_k is in bin b
        "class_hits": (k * m, torch.int64),  # of which the label is k
        "class_scores": (k * m, torch.float64),  # sum of their p_k
        "confusion": (k * k, torch.int64),  # (K, K): row = label, column = argmax
        # sum of -log max(p_y, eps), sum of the Brier terms, sum over updates of n_b * ECE_b of
        # the released evaluator (sum over bins of |hits - confidences|)
        "sums": (3, torch.float64),
        "released_n": (1, torch.int64),  # pixels behind ece_released
        "sample_keys": (cap, torch.float64),  # 2.0 (above every key) where empty
        "sample_conf": (cap, torch.float64),
        "sample_hits": (cap, torch.bool),
        "sample_pos": (cap, torch.int64),
    }


def new_state(num_classes: int, n_bins: int, samples: int,
              device: torch.device) -> dict[str, torch.Tensor]:
    """An empty meter state on `device` (:func:`state_layout`): zeros, sample keys 2.0."""
    state = {name: torch.zeros(size, dtype=dtype, device=device)
             for name, (size, dtype) in state_layout(num_classes, n_bins, samples).items()}
    state["sample_keys"].fill_(2.0)
    return state


def batch_sums(
    p3: torch.Tensor, y2: torch.Tensor, n_bins: int, ignore_index: int | None,
    background: int | None, generator: torch.Generator,
) -> tuple[_UpdateSums, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The sums of one batch, block by block, and its pixels' sample keys, confidences and hits.

    Args:
        p3: (N, K, S) probabilities on the meter's device.
        y2: (N, S) integer labels there.
        n_bins: equal-width bins M.
        ignore_index: label of the pixels to drop, or None.
        background: label left out of the released ECE, or None.
        generator: the sample's generator (one float64 key per pixel, drawn here).

    Returns:
        ``(sums, keys, conf, hits)``: the :class:`_UpdateSums` (folded by the caller after its
        checks), and (N, S) float64 keys (inf for dropped pixels), float64 confidences and
        bool hits.
    """
    n, k, s = p3.shape
    work = p3.dtype if p3.dtype in _METER_WORK_DTYPES else torch.float32
    edges = _edges_on(n_bins, p3.device, work)
    place = "cpu" if p3.device.type == "cpu" else "accelerator"
    fused = kernel_ready(p3, n_bins)
    sums = _UpdateSums(k, edges, ignore_index, background, replicas=_METER_REPLICAS[place],
                       fused=fused)
    keys = torch.rand((n, s), generator=generator, dtype=torch.float64, device=p3.device)
    conf = torch.empty((n, s), dtype=torch.float64, device=p3.device)
    hits = torch.empty((n, s), dtype=torch.bool, device=p3.device)
    if fused:  # no (N, K, S) temporaries: blocks of pixels
        per_block = _METER_BLOCK_PIXELS_FUSED
    else:
        per_block = max(1, _METER_BLOCK_ENTRIES[place] // k)
    images, width = (1, per_block) if s >= per_block else (max(1, per_block // s), s)
    for i in range(0, n, images):
        for j in range(0, s, width):
            rows, cols = slice(i, i + images), slice(j, j + width)
            conf[rows, cols], hits[rows, cols] = sums.add(
                p3[rows, :, cols], y2[rows, cols], keys[rows, cols]
            )
    return sums, keys, conf, hits


def check_batch(checks: torch.Tensor, row_tolerance: float, num_classes: int,
                ignore_index: int | None) -> None:
    """Raise the ValueError of the first failed check of a batch (one host synchronisation).

    ``checks`` (:attr:`_UpdateSums.checks`): lowest and highest valid label, lowest valid
    entry, highest valid confidence, largest |row sum - 1| of a valid pixel. With no valid
    pixel the labels and entries are +-inf in the order that passes.
    """
    label_low, label_high, low, high, deviation = checks.tolist()
    k = num_classes
    if label_low < 0 or label_high >= k:
        ignored = "" if ignore_index is None else f" or ignore_index={ignore_index}"
        raise ValueError(
            f"`labels` must lie in [0, {k}) for K={k} classes{ignored}, got values in "
            f"[{int(label_low)}, {int(label_high)}]"
        )
    not_finite = any(map(math.isnan, (low, high, deviation)))
    if not_finite or low == -math.inf or high == math.inf or deviation == math.inf:
        raise ValueError("`probs` must be finite; a valid pixel holds NaN or inf")
    if low < -_PROB_TOLERANCE or high > 1.0 + _PROB_TOLERANCE:
        raise ValueError(
            f"`probs` must lie in [0, 1], got values in [{low:.6g}, {high:.6g}]; pass "
            "probabilities, not logits (see `softmax`)"
        )
    if deviation > row_tolerance:
        raise ValueError(
            f"the K probabilities of every pixel must sum to 1 (within {row_tolerance:g}); "
            f"one sum is {deviation:.6g} away from 1"
        )


def add_to_state(state: dict[str, torch.Tensor], sums: _UpdateSums) -> None:
    """Add a folded batch's sums to the meter's state (after its checks passed)."""
    k, m = sums.k, sums.m
    pairs = sums.top_pairs[: 2 * m].view(m, 2)  # (misses, hits) per bin
    state["top_counts"] += pairs.sum(dim=1)
    state["top_hits"] += pairs[:, 1]
    state["top_conf"] += sums.top_conf[:m]
    state["class_counts"] += sums.class_counts[: k * m]
    state["class_hits"] += sums.class_hits[: k * m]
    state["class_scores"] += sums.class_scores[: k * m]
    state["confusion"] += sums.confusion[: k * k]
    state["sums"] += torch.stack([sums.sums[0], sums.sums[1], sums.released.abs().sum()])
    state["released_n"] += sums.sums[2].to(torch.int64)


def state_metrics(state: dict[str, np.ndarray], num_classes: int, n_bins: int, fill: int,
                  iou: np.ndarray) -> dict[str, float] | None:
    """The metrics of a meter's state (NumPy copies), or None when it holds no valid pixel.

    Keys of :attr:`CalibrationMeter.KEYS <raysearch.metrics.meter.CalibrationMeter.KEYS>`, in
    that order; `fill` is the size of the ``aece`` sample and `iou` the (K,) IoU per class.
    """
    k, m = num_classes, n_bins
    counts = state["top_counts"]
    n = int(counts.sum())
    sums = state["sums"]
    released_n = int(state["released_n"][0])
    ece_released = float(sums[2] / released_n) if released_n else math.nan
    if n == 0:
        return None
    accuracy_b, confidence_b = _bin_means(
        counts, state["top_conf"], state["top_hits"].astype(np.float64)
    )
    class_counts = state["class_counts"].reshape(k, m)
    class_acc, class_conf = _bin_means(
        class_counts,
        state["class_scores"].reshape(k, m),
        state["class_hits"].reshape(k, m).astype(np.float64),
    )
    per_class = [
        _reduce_gaps(class_counts[c], class_acc[c], class_conf[c], "l1") for c in range(k)
    ]
    order = np.argsort(state["sample_pos"][:fill], kind="stable")  # arrival order
    aece = binned_ece(
        state["sample_conf"][:fill][order],
        state["sample_hits"][:fill][order],
        m,
        "equal_mass",
        "l1",
    )
    return {
        "accuracy": float(state["top_hits"].sum() / n),
        "ece": _reduce_gaps(counts, accuracy_b, confidence_b, "l1"),
        "aece": aece,
        "cece": float(np.mean(per_class)),
        "mce": _reduce_gaps(counts, accuracy_b, confidence_b, "max"),
        "nll": float(sums[0] / n),
        "brier": float(max(0.0, sums[1] / n)),
        "miou": float(np.nanmean(iou)) if np.isfinite(iou).any() else math.nan,
        "ece_released": ece_released,
        "n": float(n),
        "n_aece": float(fill),
        "n_released": float(released_n),
    }
