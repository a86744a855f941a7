r"""Evaluation under dataset shift: a test set corrupted by ImageNet-C-style corruptions.

A trained model's test set (or a stratified subsample of it) is corrupted by each of the 15
ImageNet-C benchmark corruptions at severities 1-5; accuracy, ECE and NLL are measured on every
(corruption, severity) before and after a post-hoc calibrator fitted on clean validation logits,
as in Ovadia et al. (2019) and Karandikar et al. (2021), Fig. 2::

    from raysearch.metrics.shift import build_shift_set, evaluate_shift
    shift_set = build_shift_set(test_images_uint8, test_labels, max_samples=1000, seed=0)
    report = evaluate_shift(predict_logits, shift_set, calibrator=cal)
    report.as_metrics()        # {"shift_gaussian_noise_3_ece_ts": 0.12, ...}
    print(report.summary())    # mean accuracy / ECE per severity

The corruptions come from ``imagecorruptions`` (the ``imagecorruptions-imaug`` fork of
bethgelab's package), imported on first use, not with this module. They use the *ImageNet-C*
constants whatever the image size: on 32x32 images the blurs (defocus radius 3-10 px, motion
radius 10-20 px) and noises (Gaussian sigma 0.08-0.38) are much stronger than the CIFAR-10-C
constants of Hendrycks and Dietterich's ``make_cifar_c.py`` (Gaussian sigma 0.04-0.10), so values
are comparable across our trials but not with published CIFAR-10-C curves. The library needs
images of at least 32x32 pixels.

Determinism: most corruptions draw from NumPy's global ``RandomState``. :func:`corrupt_images`
seeds it from (``seed``, corruption, severity) and restores the previous global state on exit,
so equal seeds give identical arrays and the caller's random stream is left untouched. The two
corruptions that draw from their own generators (``glass_blur``, ``impulse_noise``) get a seed
per image from the same key. Because the global state is shared, :func:`corrupt_images` is not
thread-safe (processes are fine: ``build_shift_set(processes=...)``).

Metrics are those of :mod:`raysearch.metrics`: accuracy, ECE (equal-width bins, l1 norm, 15 bins
by default) and NLL, all fractions or nats, never percent. Fig. 2 of Karandikar et al. shows
the equal-mass l2 ECE, mean over corruptions with error bars;
:func:`raysearch.training.plots.shift_plot` draws the box over corruptions (Ovadia et al.) with the
mean as a marker.

Released corrupted test sets (CIFAR-10-C, CIFAR-100-C, Tiny-ImageNet-C, ImageNet-C) are read by
:func:`load_released_shift_set` instead: the same :class:`ShiftSet`, its corrupted entries read
from the files one (corruption, severity) at a time, so the same :func:`evaluate_shift` and the
same metric names apply. The released folders also hold four extra corruptions
(:data:`HELD_OUT_CORRUPTIONS`): they get their own rows and metrics, but the means over
corruptions are over the benchmark's 15, as the papers' tables average them.

References:
    Hendrycks and Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and
    Perturbations", ICLR 2019, arXiv:1903.12261 (ImageNet-C, CIFAR-10-C).
    Michaelis et al., "Benchmarking Robustness in Object Detection: Autonomous Driving when
    Winter is Coming", 2019, arXiv:1907.07484 (the ``imagecorruptions`` package).
    Ovadia et al., "Can You Trust Your Model's Uncertainty? Evaluating Predictive Uncertainty
    Under Dataset Shift", NeurIPS 2019, arXiv:1906.02530.
    Karandikar et al., "Soft Calibration Objectives for Neural Networks", NeurIPS 2021,
    arXiv:2108.00106, Fig. 2.

Layers: the corruptions and the shared argument checks are in the leaf
:mod:`raysearch.metrics.shift.corruptions`; :class:`ShiftSet`, :class:`LazyImages` and
:func:`build_shift_set` in :mod:`raysearch.metrics.shift.sets`; :func:`load_released_shift_set` in
:mod:`raysearch.metrics.shift.released`; :class:`ShiftReport` and :func:`evaluate_shift` in
:mod:`raysearch.metrics.shift.evaluation`. This module gathers their public names; none of them
imports it.
"""

from __future__ import annotations

# raysearch.metrics (torch) and pandas are imported where they are used: the worker processes of
# build_shift_set(processes=...) import shift.sets and need neither (~2.5 s less start-up).
from raysearch.metrics.shift.corruptions import (
    DEFAULT_CORRUPTIONS,
    MIN_IMAGE_SIZE,
    SEVERITIES,
    corrupt_images,
)
from raysearch.metrics.shift.evaluation import ShiftReport, evaluate_shift
from raysearch.metrics.shift.released import (
    HELD_OUT_CORRUPTIONS,
    RELEASED_LABELS_FILE,
    load_released_shift_set,
)
from raysearch.metrics.shift.sets import CLEAN, LazyImages, ShiftSet, build_shift_set

__all__ = [
    "CLEAN",
    "DEFAULT_CORRUPTIONS",
    "HELD_OUT_CORRUPTIONS",
    "MIN_IMAGE_SIZE",
    "RELEASED_LABELS_FILE",
    "SEVERITIES",
    "LazyImages",
    "ShiftReport",
    "ShiftSet",
    "build_shift_set",
    "corrupt_images",
    "evaluate_shift",
    "load_released_shift_set",
]
