"""Streaming metrics: :class:`CalibrationMeter` (segmentation pixels or classification samples).

The meter keeps per-bin sums in torch tensors on the device of its inputs (GPU or CPU), made
batch by batch by :mod:`~raysearch.metrics.meter_sums` (binning with
:func:`~raysearch.metrics.binning._torch_equal_width_bins`, the torch form of the NumPy rule of
:func:`raysearch.metrics.binning._assign_bins`), and :meth:`CalibrationMeter.compute` reduces
them with the NumPy helpers of :mod:`raysearch.metrics.binning`. With ``keep_samples=True`` it
also keeps the samples, and :meth:`CalibrationMeter.table` computes the papers' table from them
with the kernels of the built-in metrics (:mod:`raysearch.metrics.builtin`), the one code path
of every table metric.

Imports :mod:`raysearch.metrics.checks`, :mod:`~raysearch.metrics.meter_sums`,
:mod:`~raysearch.metrics.binning`, :mod:`~raysearch.metrics.binned`,
:mod:`~raysearch.metrics.catalog` and :mod:`~raysearch.metrics.builtin`.
"""

import math
import numbers
from typing import Any

import numpy as np
import torch

from raysearch.metrics import builtin as _builtin  # noqa: F401 (registers the built-ins)
from raysearch.metrics.binned import ReliabilityBins
from raysearch.metrics.binning import _bin_means, _equal_width_edges
from raysearch.metrics.catalog import BUILTIN_METRICS, Scores, check_keys, group_keys
from raysearch.metrics.checks import (
    _ROW_SUM_TOLERANCE,
    _check_choice,
    _validate_top1,
    check_n_bins,
    softmax,
    to_numpy,
)
from raysearch.metrics.meter_sums import (
    _METER_WORK_DTYPES,
    _meter_tensor,
    add_to_state,
    batch_sums,
    check_batch,
    new_state,
    state_layout,
    state_metrics,
)

#: Inputs :class:`CalibrationMeter` accepts.
_METER_INPUTS = ("probs", "logits")


def _check_meter_int(name: str, value: object, low: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be an integer, got {type(value).__name__} {value!r}")
    if low is not None and value < low:
        raise ValueError(f"`{name}` must be >= {low}, got {value}")
    return int(value)


class CalibrationMeter:
    r"""Streaming accuracy, calibration and mIoU over pixels (or samples), in constant memory.

    Feed it batches with :meth:`update` and read the metrics with :meth:`compute`. Without
    ``keep_samples`` the state holds sums and counts only (its size depends on K, ``n_bins``
    and ``aece_samples``, never on the number of pixels), so a whole validation set can be
    scored without keeping its probabilities: PASCAL VOC val, 1,449 images of ~500 x 500
    with K = 21, would need ~30 GB. The same meter scores plain (N, K) classification
    batches, and is the one evaluator of the papers' result tables (``table_summary``,
    post-hoc, reproduce, ``calibrate``): built with ``keep_samples=True`` it also keeps what
    the metrics without a fixed-size state need (:meth:`table`).

    ``keep_samples=True`` (classification, (N, K) batches, no ``ignore_index``): each update is
    also validated like the metric functions (same errors) and its probabilities, labels, top-1
    confidences and hits are kept, at ``K * s + s + 9`` bytes per sample (``s`` the itemsize of
    the probabilities after conversion: 4 for float16 / bfloat16 / float32, 8 for float64;
    intp labels, bool hits), e.g. 53 bytes per CIFAR-10 sample of float32 probabilities. The
    equal-mass bins (``aece``, ``ece_l2em``, ``marginal_ece``), the KS error and the sweep
    choose their bins from all samples, and ``marginal_ece`` bins every class score by its own
    quantiles, so no per-bin sum gives them; :meth:`table` computes every key from the kept
    samples with the kernels of the metric functions, so its values are those functions' on
    the concatenated batches, bit for bit, however the samples were batched.

    Each valid pixel (label != ``ignore_index``) is one sample of the functions of this module.
    On the concatenation of all valid pixels of all updates, :meth:`compute` gives, to float
    rounding (float64 accumulators; a different summation order than the functions):

    * ``accuracy``, ``ece``, ``mce``: :func:`accuracy`, :func:`ece` (equal-width, l1; Guo et
      al., ICML 2017; Naeini et al., AAAI 2015) and :func:`mce` from per-bin counts, hit
      counts and confidence sums, binned by the rule of :func:`ece`: bins (b/M, (b+1)/M] with
      edges in the dtype of ``probs``, 0.0 in the first bin, 1.0 in the last;
    * ``cece``: :func:`classwise_ece` (all K class scores of every pixel, equal-width, mean of
      the K per-class errors; Kull et al., NeurIPS 2019; the SCE of Nixon et al., CVPR-W 2019)
      from (K, M) counts, label counts and score sums;
    * ``nll``: :func:`nll` with ``eps`` = 1e-12 (nats); ``brier``: :func:`brier` (summed over
      the K classes, in [0, 2]);
    * ``miou``: mean over classes of :math:`\mathrm{IoU}_c = TP_c / (TP_c + FP_c + FN_c)` from
      the K x K confusion matrix (:attr:`confusion`), over the classes whose union
      :math:`TP_c + FP_c + FN_c` is non-zero (:meth:`iou` gives NaN for the others). The
      prediction is the argmax (first index on ties), as for ``accuracy``.

    ``aece`` (:func:`adaptive_ece`, equal-mass bins, Nixon et al., CVPR-W 2019) needs quantiles
    of all confidences, which no fixed-size sum gives. It is computed on a uniform sample
    without replacement of at most ``aece_samples`` valid pixels: every pixel draws a key from
    a ``torch.Generator`` seeded with ``seed`` (on the device of the state) and the pixels of
    the ``aece_samples`` smallest keys are kept (their confidence, hit and arrival position).
    While no more than ``aece_samples`` valid pixels have been seen, the sample is all of them
    and ``aece`` equals :func:`adaptive_ece` on the concatenation (the pixels are put back in
    arrival order, so tied confidences split as in the function). Beyond, it is an estimate.
    Measured on 20M synthetic pixels (K = 21, softmax outputs, a sample of 1M, 10 seeds), the
    absolute error |sampled - exact AECE| was at most 7e-4 (mean 2e-4 to 3e-4) for
    miscalibrated outputs (exact AECE 0.08, 0.10 and 0.17), and at most 1.5e-3 (mean 1e-3)
    for calibrated ones (exact AECE 4e-4), where the sample's own binning noise, an upward
    bias of any ECE on fewer samples, dominates. The sample depends on ``seed``, on the device
    (CPU and CUDA generators differ) and on the batch shapes (keys are drawn per update).

    ``ece_released`` is the number of the released evaluator of MbLS (Liu et al., CVPR 2022,
    Table 5; ``SegmentCalibrateEvaluator`` of github.com/by-liu/MbLS), whose protocol ACLS
    (Park et al., ICCV 2023, Table 4) follows for pixel ECE on PASCAL VOC: each update drops
    the pixels labelled ``ignore_index`` or ``background``, takes the equal-width ECE of the
    rest (``n_bins`` bins, the rule of :func:`ece`), and the result is the mean of these
    per-batch ECEs weighted by their pixel counts. It depends on how the pixels are batched
    (ECE is not additive over batches) and leaves out the background class; it is reported to
    compare with those papers' tables, not as a calibration error of the whole set (``ece``).
    The released code applies a softmax to logits and bins with ``torch.linspace`` edges; here
    ``probs`` are given and the edges are those of :func:`ece`.

    References:
        Guo, Pleiss, Sun and Weinberger, "On Calibration of Modern Neural Networks", ICML 2017,
        arXiv:1706.04599 (ECE with 15 equal-width bins).
        Nixon et al., "Measuring Calibration in Deep Learning", CVPR Workshops 2019,
        arXiv:1904.01685 (adaptive ECE, static/classwise calibration error).
        Kull et al., "Beyond temperature scaling", NeurIPS 2019, arXiv:1910.12656 (classwise
        ECE).
        Liu, Ben Ayed, Galdran and Dolz, "The Devil is in the Margin: Margin-based Label
        Smoothing for Network Calibration", CVPR 2022, arXiv:2111.15430, Table 5 (pixel ECE
        on PASCAL VOC, DeepLabV3).
        Park, Noh, Oh, Baek and Ham, "ACLS: Adaptive and Conditional Label Smoothing for Network
        Calibration", ICCV 2023, arXiv:2308.11911, Table 4.

    Args:
        num_classes: number of classes K >= 1 (the width of dim 1 of ``probs``).
        n_bins: number of bins M >= 1 of every binned metric. Defaults to ``15``.
        ignore_index: label of pixels to drop (e.g. ``255`` for VOC), or None to keep all.
            Defaults to ``None``.
        aece_samples: size of the uniform sample of pixels behind ``aece``, >= 1. Defaults to
            ``1_000_000`` (21 MiB of state: float64 key and confidence, int64 position, bool hit).
        seed: seed (>= 0) of the sample's generator. Defaults to ``0``.
        background: label dropped by ``ece_released`` (the VOC background class), or None to
            drop only ``ignore_index``. Defaults to ``0``.
        keep_samples: also keep every sample for :meth:`table` (see above). Defaults to
            ``False``.
        inputs: ``"probs"`` (default) or ``"logits"``: a softmax over dim 1 turns each batch
            into probabilities first (``softmax``, float64 NumPy; a tensor fed to a meter
            without ``keep_samples``: ``torch.softmax`` on its device, in float32 or float64).

    Shape:
        probs: (N, K) or (N, K, d1, d2, ...) probabilities (not logits), float16, bfloat16,
        float32 or float64, NumPy array or torch tensor on any device; every pixel's K
        probabilities lie in [0, 1] and sum to 1 (within 1e-3; 2**-7 for bfloat16).
        labels: (N,) or (N, d1, d2, ...) integer class indices in [0, K) or ``ignore_index``.

    Raises:
        TypeError: if an argument is not an integer (None allowed for ``ignore_index`` and
            ``background``).
        ValueError: if ``num_classes`` < 1, ``n_bins`` < 1, ``aece_samples`` < 1, ``seed`` < 0,
            ``inputs`` is unknown, or ``keep_samples`` is set with an ``ignore_index``.

    Example::

        meter = CalibrationMeter(21, ignore_index=255)
        for images, masks in loader:
            meter.update(model(images)["out"].softmax(dim=1), masks)
        metrics = meter.compute()  # {"accuracy": ..., "ece": ..., "miou": ..., ...}
    """

    #: Keys of :meth:`compute`, in order.
    KEYS = (
        "accuracy",
        "ece",
        "aece",
        "cece",
        "mce",
        "nll",
        "brier",
        "miou",
        "ece_released",
        "n",
        "n_aece",
        "n_released",
    )
    _COUNT_KEYS = ("n", "n_aece", "n_released")

    def __init__(
        self,
        num_classes: int,
        n_bins: int = 15,
        ignore_index: int | None = None,
        *,
        aece_samples: int = 1_000_000,
        seed: int = 0,
        background: int | None = 0,
        keep_samples: bool = False,
        inputs: str = "probs",
    ) -> None:
        self.num_classes = _check_meter_int("num_classes", num_classes, 1)
        self.n_bins = check_n_bins(n_bins)
        self.ignore_index = (
            None if ignore_index is None else _check_meter_int("ignore_index", ignore_index, None)
        )
        self.aece_samples = _check_meter_int("aece_samples", aece_samples, 1)
        self.seed = _check_meter_int("seed", seed, 0)
        self.background = (
            None if background is None else _check_meter_int("background", background, None)
        )
        self.keep_samples = bool(keep_samples)
        self.inputs = _check_choice("inputs", inputs, _METER_INPUTS)
        if self.keep_samples and self.ignore_index is not None:
            raise ValueError(
                "`keep_samples=True` scores (N, K) classification batches: `ignore_index` must "
                f"be None, got {self.ignore_index}"
            )
        self.reset()

    # ----------------------------------------------------------------------------- state

    def reset(self) -> None:
        """Forget every update (the next update allocates the state on its device)."""
        self._state: dict[str, torch.Tensor] | None = None
        self._generator: torch.Generator | None = None
        self._fill = 0  # pixels in the aece sample
        self._seen = 0  # pixels seen, ignored ones included: arrival positions of the sample
        self._threshold = 1.0  # keys below it enter the sample (keys lie in [0, 1))
        # keep_samples: (probs, labels, confidences, hits) of every update, in arrival order
        self._kept: list[tuple[np.ndarray, ...]] = []
        self._summed = 0  # kept batches already added to the sums

    @property
    def device(self) -> torch.device | None:
        """Device of the state: that of the first update's ``probs`` (None before it).

        The CPU for a ``keep_samples`` meter (its kept batches are NumPy arrays).
        """
        self._sum_kept()
        return None if self._state is None else self._state["top_counts"].device

    def _allocate(self, device: torch.device) -> None:
        # Normal tensors even under torch.inference_mode(): inference tensors could not be
        # updated in place by a later update or merge outside it.
        with torch.inference_mode(False):
            self._allocate_state(device)
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(self.seed)

    def _allocate_state(self, device: torch.device) -> None:
        self._state = new_state(self.num_classes, self.n_bins, self.aece_samples, device)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies of the state tensors (empty before the first update), e.g. for a checkpoint.

        Besides the sums, holds ``fill``, ``seen`` (0-d int64) and ``generator`` (the uint8
        state of the sample's generator). Its size does not depend on the number of pixels.

        Raises:
            ValueError: if the meter keeps samples (``keep_samples``): they are not saved.
        """
        self._check_no_kept_samples()
        if self._state is None:
            return {}
        out = {name: tensor.clone() for name, tensor in self._state.items()}
        out["fill"] = torch.tensor(self._fill)
        out["seen"] = torch.tensor(self._seen)
        out["generator"] = self._generator.get_state()
        return out

    def _check_no_kept_samples(self) -> None:
        if self.keep_samples:
            raise ValueError("the kept samples of `keep_samples=True` are not in a state_dict")

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore a :meth:`state_dict` of a meter with the same settings (on its device).

        Raises:
            ValueError: if an entry is missing or a tensor's shape does not match this meter;
                the meter is then unchanged; if the meter keeps samples (``keep_samples``).
        """
        self._check_no_kept_samples()
        if not state:
            self.reset()
            return
        k, m, cap = self.num_classes, self.n_bins, self.aece_samples
        sizes = {name: size for name, (size, _) in state_layout(k, m, cap).items()}
        for name in (*sizes, "fill", "seen", "generator"):
            if name not in state:
                raise ValueError(f"state entry `{name}` is missing")
        for name, size in sizes.items():
            if tuple(state[name].shape) != (size,):
                raise ValueError(
                    f"state `{name}` must have shape {(size,)} for this meter (num_classes={k}, "
                    f"n_bins={m}, aece_samples={cap}), got {tuple(state[name].shape)}"
                )
        self.reset()
        self._allocate(state["top_counts"].device)
        for name, tensor in self._state.items():
            tensor.copy_(state[name])
        self._fill = int(state["fill"])
        self._seen = int(state["seen"])
        self._generator.set_state(state["generator"])
        self._update_threshold()

    def _update_threshold(self) -> None:
        if self._fill == self.aece_samples:
            self._threshold = float(self._state["sample_keys"].max())

    # ----------------------------------------------------------------------------- update

    def _check_inputs(self, probs: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
        p = _meter_tensor("probs", probs)
        y = _meter_tensor("labels", labels)
        if not p.is_floating_point():
            raise TypeError(f"`probs` must hold floating-point probabilities, got dtype {p.dtype}")
        if p.ndim < 2:
            raise ValueError(f"`probs` must have shape (N, K) or (N, K, *), got {tuple(p.shape)}")
        if p.shape[1] != self.num_classes:
            raise ValueError(
                f"`probs` must have K={self.num_classes} classes in dim 1 (num_classes), got "
                f"shape {tuple(p.shape)}"
            )
        expected = (p.shape[0], *p.shape[2:])
        if tuple(y.shape) != expected:
            raise ValueError(
                f"`labels` must have shape {expected} to match `probs` of shape "
                f"{tuple(p.shape)}, got {tuple(y.shape)}"
            )
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ValueError(f"`labels` must hold integer class indices, got dtype {y.dtype}")
        device = p.device if self._state is None else self._state["top_counts"].device
        return p.to(device), y.to(device)

    def update(self, probs: Any, labels: Any) -> None:
        """Add a batch of probabilities and labels to the sums.

        The state lives on the device of the first update's ``probs`` (NumPy input: the CPU);
        later inputs and ``labels`` are moved there. Pixels labelled ``ignore_index`` are
        dropped (their probabilities are not checked). A batch that fails a check leaves the
        state unchanged. The work runs in blocks of about 2**20 entries of ``probs`` (2**24 on
        accelerators: ~0.8 GiB of GPU memory for a VOC-sized batch), whose temporaries take
        ~40 bytes per entry; across blocks it keeps 17 bytes per pixel of the batch for the
        ``aece`` sample. On accelerators each histogram is spread over up to 512 copies
        (``_METER_REPLICAS``: atomic adds to one slot wait on each other). On a CUDA device
        with Triton the class-wise sums take two fused kernels instead
        (:mod:`raysearch.metrics.meter_kernel`; up to 32 bins and 128 classes) and blocks hold
        2**22 pixels (~0.6 GiB). Two host synchronisations: the checks and the sample.

        With ``keep_samples=True`` the batch is first validated as the metric functions do
        (same errors) and kept as NumPy copies in host memory (see the class docstring), so
        the sums of such a meter live on the CPU whatever the device of ``probs``.

        Args:
            probs: (N, K) or (N, K, *) float probabilities (see the class docstring), or
                logits with ``inputs="logits"``.
            labels: (N,) or (N, *) integer labels in [0, K) or ``ignore_index``.

        Raises:
            TypeError: if ``probs`` is not floating point or an input does not hold numbers.
            ValueError: if ``probs`` has fewer than 2 dimensions or not K entries in dim 1; if
                ``labels`` has another shape than ``probs`` without dim 1 or is not integer;
                if a label other than ``ignore_index`` lies outside [0, K); if a valid pixel's
                probabilities are not finite, lie outside [0, 1] or do not sum to 1.
        """
        if self.inputs == "logits":
            probs = self._softmax(probs)
        kept = None
        if self.keep_samples:
            kept = _validate_top1(probs, labels)
            if kept[0].shape[1] != self.num_classes:
                raise ValueError(
                    f"`probs` must have K={self.num_classes} classes in dim 1 (num_classes), "
                    f"got shape {kept[0].shape}"
                )
            self._kept.append(kept)  # summed when the sums are first read (_sum_kept)
        else:
            self._update_sums(probs, labels)

    def _sum_kept(self) -> None:
        """Add the kept batches not yet in the sums, in arrival order (``keep_samples``).

        Deferred so that a meter read only through :meth:`table` never pays for the sums;
        they take the validated arrays (integer probabilities are floats by then, a bfloat16
        tensor float32 whose row tolerance was applied), so their checks are skipped.
        """
        while self._summed < len(self._kept):
            p, y, _, _ = self._kept[self._summed]
            self._summed += 1
            self._update_sums(p, y, checked=True)

    def _softmax(self, logits: Any) -> Any:
        """Probabilities of a batch of logits (softmax over dim 1), a tensor on its device."""
        if isinstance(logits, torch.Tensor) and not self.keep_samples:
            z = logits.detach()
            work = z.dtype if z.dtype in _METER_WORK_DTYPES else torch.float32
            return z.to(work).softmax(dim=1)
        return softmax(to_numpy(logits), axis=1)

    def _update_sums(self, probs: Any, labels: Any, checked: bool = False) -> None:
        p, y = self._check_inputs(probs, labels)
        if p.numel() == 0:
            return
        if self._state is None:
            self._allocate(p.device)
        n, k = p.shape[:2]
        # (N, K, S) and (N, S): views of contiguous input
        sums, keys, conf, hits = batch_sums(p.reshape(n, k, -1), y.reshape(n, -1), self.n_bins,
                                            self.ignore_index, self.background, self._generator)
        if not checked:
            row_tolerance = 2.0**-7 if p.dtype == torch.bfloat16 else _ROW_SUM_TOLERANCE
            check_batch(sums.checks, row_tolerance, k, self.ignore_index)
        sums.fold()
        add_to_state(self._state, sums)
        self._add_to_sample(keys.reshape(-1), conf.reshape(-1), hits.reshape(-1))

    def _add_to_sample(self, keys: torch.Tensor, conf: torch.Tensor, hits: torch.Tensor) -> None:
        """Keep the pixels of the ``aece_samples`` smallest keys seen so far (inf: dropped)."""
        chosen = torch.nonzero(keys < self._threshold).squeeze(1)
        self._merge_sample(keys[chosen], conf[chosen], hits[chosen], chosen + self._seen)
        self._seen += keys.numel()

    def _merge_sample(
        self, keys: torch.Tensor, conf: torch.Tensor, hits: torch.Tensor, pos: torch.Tensor
    ) -> None:
        state, fill, cap = self._state, self._fill, self.aece_samples
        count = keys.numel()
        if count == 0:
            return
        names = ("sample_keys", "sample_conf", "sample_hits", "sample_pos")
        if fill + count <= cap:
            for name, values in zip(names, (keys, conf, hits, pos), strict=True):
                state[name][fill : fill + count] = values
            self._fill = fill + count
        else:
            merged = [
                torch.cat((state[name][:fill], values))
                for name, values in zip(names, (keys, conf, hits, pos), strict=True)
            ]
            keep = torch.topk(merged[0], cap, largest=False, sorted=False).indices
            for name, values in zip(names, merged, strict=True):
                state[name].copy_(values[keep])
            self._fill = cap
        self._update_threshold()

    def merge(self, other: "CalibrationMeter") -> "CalibrationMeter":
        """Add the state of ``other`` (e.g. another process's meter) to this one, in place.

        The result is the meter that would have seen this meter's updates, then ``other``'s:
        sums add up and the ``aece`` samples merge by their keys. Give the meters different
        seeds (e.g. ``seed + rank``): equal seeds draw equal keys, so the merged sample is no
        longer uniform. ``other``'s state is moved to this meter's device.

        Returns:
            This meter.

        Raises:
            TypeError: if ``other`` is not a :class:`CalibrationMeter`.
            ValueError: if the meters differ in ``num_classes``, ``n_bins``, ``ignore_index``,
                ``aece_samples``, ``background`` or ``keep_samples``.
        """
        if not isinstance(other, CalibrationMeter):
            raise TypeError(f"`other` must be a CalibrationMeter, got {type(other).__name__}")
        for name in (
            "num_classes",
            "n_bins",
            "ignore_index",
            "aece_samples",
            "background",
            "keep_samples",
        ):
            if getattr(self, name) != getattr(other, name):
                raise ValueError(
                    f"cannot merge meters with different `{name}`: {getattr(self, name)!r} "
                    f"and {getattr(other, name)!r}"
                )
        self._sum_kept()
        other._sum_kept()
        self._kept.extend(other._kept)
        self._summed = len(self._kept)
        if other._state is None:
            return self
        if self._state is None:
            self._allocate(other.device)
        theirs = {name: tensor.to(self.device) for name, tensor in other._state.items()}
        for name, tensor in self._state.items():
            if not name.startswith("sample_"):
                tensor += theirs[name]
        fill = other._fill
        self._merge_sample(
            theirs["sample_keys"][:fill],
            theirs["sample_conf"][:fill],
            theirs["sample_hits"][:fill],
            theirs["sample_pos"][:fill] + self._seen,
        )
        self._seen += other._seen
        return self

    # ----------------------------------------------------------------------------- results

    @property
    def confusion(self) -> np.ndarray:
        """(K, K) int64 confusion matrix: entry (i, j) counts valid pixels of label i, argmax j."""
        k = self.num_classes
        self._sum_kept()
        if self._state is None:
            return np.zeros((k, k), dtype=np.int64)
        return self._state["confusion"].cpu().numpy().reshape(k, k).copy()

    def reliability_bins(self) -> ReliabilityBins:
        """Equal-width reliability-diagram bins of all valid pixels so far.

        The bins of :func:`reliability_bins` on the concatenated valid pixels (``n_bins``
        bins, the rule of :func:`ece`), so ``meter.reliability_bins().ece`` is
        ``compute()["ece"]``; counts are 0 and means NaN before any valid pixel.
        """
        m = self.n_bins
        self._sum_kept()
        if self._state is None:
            counts, conf_sums, hit_sums = np.zeros(m, np.int64), np.zeros(m), np.zeros(m)
        else:
            counts = self._state["top_counts"].cpu().numpy()
            conf_sums = self._state["top_conf"].cpu().numpy()
            hit_sums = self._state["top_hits"].cpu().numpy().astype(np.float64)
        accuracy_b, confidence_b = _bin_means(counts, conf_sums, hit_sums)
        return ReliabilityBins(_equal_width_edges(m), counts, accuracy_b, confidence_b)

    def iou(self) -> np.ndarray:
        r"""(K,) float64 IoU of every class, :math:`TP_c / (TP_c + FP_c + FN_c)`.

        NaN for a class absent from both the labels and the predictions (empty union).
        """
        confusion = self.confusion
        tp = np.diag(confusion).astype(np.float64)
        union = confusion.sum(axis=0) + confusion.sum(axis=1) - tp
        out = np.full(self.num_classes, np.nan)
        np.divide(tp, union, out=out, where=union > 0)
        return out

    def compute(self) -> dict[str, float]:
        """The metrics of all valid pixels so far (see the class docstring).

        Returns:
            Dict of Python floats with the keys of :data:`KEYS`, in that order: ``accuracy``,
            ``ece``, ``aece``, ``cece``, ``mce``, ``nll`` (nats), ``brier`` (in [0, 2]),
            ``miou`` and ``ece_released`` (fractions in [0, 1]), then ``n`` (valid pixels),
            ``n_aece`` (pixels in the ``aece`` sample) and ``n_released`` (pixels behind
            ``ece_released``) as floats. With no valid pixel every metric is NaN
            (``ece_released`` is NaN too when every valid pixel is background).
        """
        self._sum_kept()
        values = None
        if self._state is not None:
            state = {name: tensor.cpu().numpy() for name, tensor in self._state.items()}
            values = state_metrics(state, self.num_classes, self.n_bins, self._fill, self.iou())
        if values is None:
            return {key: (0.0 if key in self._COUNT_KEYS else math.nan) for key in self.KEYS}
        return values

    def table(self, keys: str | tuple[str, ...] | None = None) -> dict[str, float]:
        """The result-table metrics of all samples so far (``keep_samples=True`` only).

        Every value is the kernel of the built-in metric of its key
        (:mod:`raysearch.metrics.builtin`, which names the public function of the same value),
        on the concatenation of the kept batches, with this meter's ``n_bins`` (``ece_100``:
        100 bins; ``sweep_ce``: the bins of its sweep).

        Args:
            keys: names of built-in metrics with a kernel (``group_keys("kernels")``:
                ``CALIBRATED_KEYS``, then ``debiased_ce``), in the order wanted. Defaults to
                all of them.

        Returns:
            Dict ``{key: float}`` in the order of ``keys``: fractions in [0, 1] (``nll`` in
            nats, ``brier`` in [0, 2]); ``overconfidence`` / ``underconfidence`` are NaN when no
            prediction is wrong / right.

        Raises:
            ValueError: if the meter was built without ``keep_samples``, has no sample yet, or
                a key is unknown.
        """
        known = group_keys("kernels")
        keys = check_keys(known if keys is None else keys, known)
        if not self.keep_samples:
            raise ValueError("`table()` needs a meter built with `keep_samples=True`")
        if not self._kept:
            raise ValueError("`table()` needs at least one sample; call `update` first")
        arrays = self._kept[0]  # one batch: its arrays as they are, no copy
        if len(self._kept) > 1:
            arrays = tuple(np.concatenate(parts) for parts in zip(*self._kept, strict=True))
        scores = Scores(*arrays, self.n_bins)
        return {key: BUILTIN_METRICS[key].compute(scores) for key in keys}
