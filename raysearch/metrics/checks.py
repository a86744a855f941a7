"""Input conversion and validation of ``probs`` / ``labels``, the top-1 scan, and softmax.

The leaf of :mod:`raysearch.metrics`: every other module of the package imports its checks from
here, and this module imports nothing from the package (NumPy only). The public checks
(:func:`to_numpy`, :func:`check_n_bins`, :func:`check_row_sums`, :func:`validate_probs`,
:func:`check_labels`, :func:`softmax`) are those the post-hoc calibrators share.
"""

import numbers
from typing import Any

import numpy as np

#: Tolerance on probabilities slightly outside [0, 1] (float rounding of a softmax).
_PROB_TOLERANCE = 1e-6
#: Tolerance on row sums of ``probs``.
_ROW_SUM_TOLERANCE = 1e-3
#: Entries per block of the checks and top-1 scan of ``probs`` (512 KiB of float32: in cache).
_BLOCK_ENTRIES = 1 << 17


def to_numpy(value: Any) -> np.ndarray:
    """A NumPy view or copy of a NumPy array, a PyTorch tensor (any device) or a sequence.

    A float16 or bfloat16 tensor becomes float32 (NumPy has no bfloat16).

    Args:
        value: the array, tensor or (nested) sequence.

    Returns:
        The NumPy array (a view where possible).
    """
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        tensor = value.detach().cpu()
        if tensor.is_floating_point() and tensor.element_size() < 4:
            tensor = tensor.float()  # float16/bfloat16: NumPy has no bfloat16
        return tensor.numpy()
    return np.asarray(value)


def _as_float_array(name: str, value: Any) -> np.ndarray:
    """Convert to a real floating array (ints and bools become float64, float16 float32)."""
    array = to_numpy(value)
    if array.dtype == np.bool_ or np.issubdtype(array.dtype, np.integer):
        return array.astype(np.float64)
    if array.dtype == np.float16:
        return array.astype(np.float32)
    if not np.issubdtype(array.dtype, np.floating):
        raise TypeError(f"`{name}` must hold real numbers, got dtype {array.dtype}")
    return array


def check_n_bins(n_bins: object) -> int:
    """``n_bins`` as an int.

    Raises:
        TypeError: if `n_bins` is not an integer (a bool is not).
        ValueError: if `n_bins` < 1.
    """
    if isinstance(n_bins, bool) or not isinstance(n_bins, numbers.Integral):
        raise TypeError(f"`n_bins` must be an integer, got {type(n_bins).__name__} {n_bins!r}")
    if n_bins < 1:
        raise ValueError(f"`n_bins` must be >= 1, got {n_bins}")
    return int(n_bins)


def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"`{name}` must be one of {listed}, got {value!r}")
    return value


def _probs_array(probs: Any) -> tuple[np.ndarray, float]:
    """Convert ``probs`` and check its shape; return it with the tolerance on its row sums."""
    # bfloat16 rounds each probability by up to 2**-8 relative: its rows may miss 1 by more than
    # 1e-3, so the row-sum tolerance grows to its epsilon 2**-7 (float16: 2**-10 < 1e-3).
    row_sum_tolerance = _ROW_SUM_TOLERANCE
    if str(getattr(probs, "dtype", "")) == "torch.bfloat16":
        row_sum_tolerance = max(_ROW_SUM_TOLERANCE, 2.0**-7)
    p = _as_float_array("probs", probs)
    if p.ndim != 2:
        raise ValueError(f"`probs` must be 2-D (N, K), got shape {tuple(p.shape)}")
    n, k = p.shape
    if n == 0 or k == 0:
        raise ValueError(f"`probs` must hold at least one sample and one class, got shape {(n, k)}")
    return p, row_sum_tolerance


def _check_probs_exact(p: np.ndarray, row_sum_tolerance: float) -> None:
    """The reference value checks of ``probs``: finite, in [0, 1], rows summing to 1.

    Raises the ``ValueError`` of the first failed condition. The fast checks of
    :func:`_check_probs` and :func:`_top1_scan` defer to this function whenever they cannot
    prove that all three conditions hold, so errors and the accepted inputs are exactly these.
    """
    # A NaN or inf anywhere in a row makes its sum NaN or inf: one pass checks both conditions.
    row_sums = p.sum(axis=1, dtype=np.float64)
    finite = np.isfinite(row_sums)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ValueError(f"`probs` must be finite; row {row} holds NaN or inf")
    low, high = float(p.min()), float(p.max())
    if low < -_PROB_TOLERANCE or high > 1.0 + _PROB_TOLERANCE:
        raise ValueError(
            f"`probs` must lie in [0, 1], got values in [{low:.6g}, {high:.6g}]; pass "
            "probabilities, not logits (see `softmax`)"
        )
    check_row_sums(row_sums, row_sum_tolerance)


def check_row_sums(row_sums: np.ndarray, tolerance: float, what: str = "`probs`") -> None:
    """Check that every row of probabilities sums to 1 within `tolerance`.

    Args:
        row_sums: (N,) float row sums.
        tolerance: the largest accepted |row sum - 1|.
        what: the input, for the message. Defaults to ```probs```.

    Raises:
        ValueError: naming the worst row if its sum is beyond `tolerance` of 1.
    """
    deviation = np.abs(row_sums - 1.0)
    worst = int(np.argmax(deviation))
    if deviation[worst] > tolerance:
        raise ValueError(
            f"rows of {what} must sum to 1 (within {tolerance:g}); row {worst} sums "
            f"to {row_sums[worst]:.6g}"
        )


def _fast_bound(p: np.ndarray, row_sum_tolerance: float) -> float | None:
    r"""Tolerance on fast row sums that proves the exact check, or None (no fast path for ``p``).

    The fast checks take C-contiguous native float32/float64 arrays. A sum of K terms in any
    order with unit roundoff u errs by at most :math:`\gamma_{K-1} \sum_j |p_j|`,
    :math:`\gamma_m = m u / (1 - m u)`; with entries in [-1e-6, 1 + 1e-6] and a sum below 2,
    :math:`\sum_j |p_j| \le 2 + 2 K 10^{-6}`. The margin adds the errors of the fast sum (an
    ``einsum`` in the dtype of ``p``) and of the float64 sum of :func:`_check_probs_exact`, with
    a factor 2 to spare: a fast row sum within ``row_sum_tolerance - margin`` of 1 proves the
    exact row sum within the tolerance. (For float32 the margin reaches 1e-3 near K = 4000: no
    fast path beyond.)
    """
    if not (p.flags.c_contiguous and p.dtype.isnative and p.dtype in (np.float32, np.float64)):
        return None
    k = p.shape[1]
    eps = float(np.finfo(p.dtype).eps) + float(np.finfo(np.float64).eps)
    bound = row_sum_tolerance - k * eps * (2.0 + 2.0 * k * _PROB_TOLERANCE)
    return bound if bound > 0 else None


def _block_checks(block: np.ndarray) -> tuple[float, float]:
    """Minimum entry and largest |row sum - 1| of a block (NaN if it holds a NaN)."""
    # float sums in the dtype of the block; s - 1 is exact for s in [1/2, 2] (Sterbenz)
    return block.min(), np.max(np.abs(np.einsum("ij->i", block) - 1.0))


def _fast_checks_pass(low: float, high: float, deviation: float, bound: float) -> bool:
    """Whether all entries lie in [-1e-6, 1 + 1e-6] and all row sums within ``bound`` of 1.

    NaN anywhere makes these NaN, and NaN fails every comparison; entries in range are finite.
    """
    return low >= -_PROB_TOLERANCE and high <= 1.0 + _PROB_TOLERANCE and deviation <= bound


def _check_probs(p: np.ndarray, row_sum_tolerance: float) -> None:
    """Value checks of ``probs`` (see :func:`_check_probs_exact`), fast when they pass.

    One pass over blocks of about ``_BLOCK_ENTRIES`` entries (cache-sized): minimum, maximum
    and row sums of each block, the sums accepted within the bound of :func:`_fast_bound`.
    Anything else runs the exact checks, which raise the error.
    """
    bound = _fast_bound(p, row_sum_tolerance)
    if bound is not None:
        rows = max(1, _BLOCK_ENTRIES // p.shape[1])
        minima, maxima, deviations = [], [], []
        for start in range(0, p.shape[0], rows):
            block = p[start : start + rows]
            low, deviation = _block_checks(block)
            minima.append(low)
            deviations.append(deviation)
            maxima.append(block.max())
        if _fast_checks_pass(np.min(minima), np.max(maxima), np.max(deviations), bound):
            return
    _check_probs_exact(p, row_sum_tolerance)


def validate_probs(probs: Any) -> np.ndarray:
    """Check (N, K) probabilities and return them as a NumPy array.

    ``probs`` keeps its float32/float64 precision (no copy of a large float32 array; float16 and
    bfloat16 become float32). Rows must sum to 1 within 1e-3 (within 2**-7 for bfloat16 tensors,
    whose own rounding exceeds 1e-3).

    Args:
        probs: (N, K) probabilities, NumPy array or torch tensor.

    Returns:
        The (N, K) float32 or float64 NumPy array.

    Raises:
        TypeError: if `probs` does not hold real numbers.
        ValueError: if `probs` is not 2-D, not finite, outside [0, 1] or has a row not summing
            to 1.
    """
    p, row_sum_tolerance = _probs_array(probs)
    _check_probs(p, row_sum_tolerance)
    return p


def _top1_scan(p: np.ndarray, row_sum_tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """Check ``p`` (as :func:`_check_probs`) and return its argmax and top-1 confidence.

    One pass over blocks of about ``_BLOCK_ENTRIES`` entries: the checks of
    :func:`_check_probs` (the maximum entry is the largest confidence), ``np.argmax`` (first
    index on ties) and the confidence gathered at the argmax, all while the block is in cache.
    If the fast checks cannot prove ``p`` valid, the exact checks run and raise.

    Returns:
        ``(predictions, confidences)``: (N,) ``np.intp`` argmax and (N,) confidences in the dtype
        of ``p``, equal to ``p.argmax(axis=1)`` and ``p.max(axis=1)`` on valid input.
    """
    n, k = p.shape
    bound = _fast_bound(p, row_sum_tolerance)
    predictions = np.empty(n, dtype=np.intp)
    confidences = np.empty(n, dtype=p.dtype)
    minima, deviations = [], []
    rows = max(1, _BLOCK_ENTRIES // k)
    row_offsets = np.arange(min(rows, n), dtype=np.intp) * k  # row starts in a flat block
    for start in range(0, n, rows):
        block = p[start : start + rows]
        stop = start + block.shape[0]
        if bound is not None:
            low, deviation = _block_checks(block)
            minima.append(low)
            deviations.append(deviation)
        argmax = np.argmax(block, axis=1, out=predictions[start:stop])
        if p.flags.c_contiguous:  # gather from the flat view (take_along_axis is slower)
            flat_index = argmax + row_offsets[: stop - start]
            np.take(block.reshape(-1), flat_index, out=confidences[start:stop], mode="clip")
        else:
            confidences[start:stop] = np.take_along_axis(block, argmax[:, None], axis=1)[:, 0]
    if bound is not None:
        # argmax picks a NaN first, so a NaN entry makes the largest confidence NaN too
        high = np.max(confidences)
        if _fast_checks_pass(np.min(minima), high, np.max(deviations), bound):
            return predictions, confidences
    _check_probs_exact(p, row_sum_tolerance)
    return predictions, confidences


def check_labels(labels: Any, n: int, k: int, scores_name: str = "probs") -> np.ndarray:
    """Check (N,) labels against scores of shape (N, K); return them as ``np.intp``.

    Args:
        labels: (N,) integer class indices, NumPy array, tensor or sequence.
        n: the number of samples N.
        k: the number of classes K.
        scores_name: the scores, for messages. Defaults to ``"probs"``.

    Returns:
        (N,) ``np.intp`` labels in [0, K).

    Raises:
        ValueError: on a shape mismatch (both shapes quoted, the scores named `scores_name`),
            a non-integer dtype (bool included) or values outside [0, K).
    """
    y = to_numpy(labels)
    if y.shape != (n,):
        raise ValueError(
            f"`labels` must have shape ({n},) to match `{scores_name}` of shape {(n, k)}, "
            f"got {tuple(y.shape)}"
        )
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"`labels` must hold integer class indices, got dtype {y.dtype}")
    y_min, y_max = int(y.min()), int(y.max())
    if y_min < 0 or y_max >= k:
        raise ValueError(
            f"`labels` must lie in [0, {k}) for K={k} classes, got values in [{y_min}, {y_max}]"
        )
    return y.astype(np.intp, copy=False)


def _validate(probs: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """Check ``probs`` (N, K) and ``labels`` (N,) and return them as NumPy arrays.

    ``probs`` is checked by :func:`validate_probs`; ``labels`` becomes ``np.intp``.
    """
    p = validate_probs(probs)
    return p, check_labels(labels, *p.shape)


def _validate_top1(
    probs: Any, labels: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_validate` fused with :func:`_confidences_and_hits` (one scan of ``probs``).

    Returns:
        ``(p, y, confidences, hits)`` as :func:`_validate` and :func:`_confidences_and_hits`.
    """
    p, row_sum_tolerance = _probs_array(probs)
    predictions, confidences = _top1_scan(p, row_sum_tolerance)
    y = check_labels(labels, *p.shape)
    return p, y, confidences, predictions == y


def _confidences_and_hits(p: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-1 confidence c_i (dtype of ``p``) and hit a_i (bool) of every sample."""
    predictions = p.argmax(axis=1)
    confidences = np.take_along_axis(p, predictions[:, None], axis=1)[:, 0]
    return confidences, predictions == y


def softmax(logits: Any, axis: int = -1) -> np.ndarray:
    r"""Numerically stable softmax, for turning stored logits into ``probs``.

    Computes :math:`\exp(z_k - \max_j z_j) / \sum_l \exp(z_l - \max_j z_j)` in float64.

    Args:
        logits: real array or tensor (e.g. (N, K) float); ``-inf`` entries get probability 0.
        axis: axis holding the classes. Defaults to ``-1``.

    Returns:
        float64 NumPy array of the shape of ``logits`` whose slices along ``axis`` sum to 1.

    Raises:
        TypeError: if ``logits`` does not hold real numbers.
        ValueError: if ``logits`` is a scalar, or holds NaN, ``+inf`` or a slice that is ``-inf``
            everywhere.
    """
    z = _as_float_array("logits", logits).astype(np.float64)
    if z.ndim == 0:
        raise ValueError("`logits` must have at least one dimension, got a scalar")
    top = z.max(axis=axis, keepdims=True)
    if not np.isfinite(top).all():
        raise ValueError(
            "`logits` must be finite (-inf is allowed where a slice has a finite entry); found "
            "NaN, +inf or an all -inf slice"
        )
    e = np.exp(z - top)
    e /= e.sum(axis=axis, keepdims=True)
    return e
