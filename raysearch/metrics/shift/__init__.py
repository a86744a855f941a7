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
same metric names apply.

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
:mod:`raysearch.metrics.shift.evaluation`. This module only re-exports them (every name, private
ones included, stays importable from ``raysearch.metrics.shift``); none of them imports it.
"""

from __future__ import annotations

# The corruptions (corruptions), the shift sets (sets), the released corrupted test
# sets (released) and the evaluation (evaluation) live in their own modules; every
# name stays importable from here. raysearch.metrics (torch) and pandas are imported where they
# are used: the worker processes of build_shift_set(processes=...) import shift.sets and need
# neither (~2.5 s less start-up).
from raysearch.metrics.shift.corruptions import _NAME_PATTERN as _NAME_PATTERN
from raysearch.metrics.shift.corruptions import _SEEDED_BY_KEYWORD as _SEEDED_BY_KEYWORD
from raysearch.metrics.shift.corruptions import DEFAULT_CORRUPTIONS as DEFAULT_CORRUPTIONS
from raysearch.metrics.shift.corruptions import MIN_IMAGE_SIZE as MIN_IMAGE_SIZE
from raysearch.metrics.shift.corruptions import SEVERITIES as SEVERITIES
from raysearch.metrics.shift.corruptions import _as_index_array as _as_index_array
from raysearch.metrics.shift.corruptions import _check_corruption as _check_corruption
from raysearch.metrics.shift.corruptions import _check_images as _check_images
from raysearch.metrics.shift.corruptions import _check_int as _check_int
from raysearch.metrics.shift.corruptions import _check_severity as _check_severity
from raysearch.metrics.shift.corruptions import _check_size as _check_size
from raysearch.metrics.shift.corruptions import _corrupt_checked as _corrupt_checked
from raysearch.metrics.shift.corruptions import _known_corruptions as _known_corruptions
from raysearch.metrics.shift.corruptions import _library as _library
from raysearch.metrics.shift.corruptions import _rng_seeds as _rng_seeds
from raysearch.metrics.shift.corruptions import _seeded_global_rng as _seeded_global_rng
from raysearch.metrics.shift.corruptions import corrupt_images as corrupt_images
from raysearch.metrics.shift.evaluation import _METRICS as _METRICS
from raysearch.metrics.shift.evaluation import ShiftReport as ShiftReport
from raysearch.metrics.shift.evaluation import _calibrator_label as _calibrator_label
from raysearch.metrics.shift.evaluation import _logits_array as _logits_array
from raysearch.metrics.shift.evaluation import _row_metrics as _row_metrics
from raysearch.metrics.shift.evaluation import evaluate_shift as evaluate_shift
from raysearch.metrics.shift.released import _IMAGE_SUFFIXES as _IMAGE_SUFFIXES
from raysearch.metrics.shift.released import _LAYOUTS as _LAYOUTS
from raysearch.metrics.shift.released import _RESERVED_NAMES as _RESERVED_NAMES
from raysearch.metrics.shift.released import RELEASED_LABELS_FILE as RELEASED_LABELS_FILE
from raysearch.metrics.shift.released import _cifar_c_entries as _cifar_c_entries
from raysearch.metrics.shift.released import _class_indices as _class_indices
from raysearch.metrics.shift.released import _corruption_name as _corruption_name
from raysearch.metrics.shift.released import _ImageFiles as _ImageFiles
from raysearch.metrics.shift.released import _imagenet_c_files as _imagenet_c_files
from raysearch.metrics.shift.released import _imagenet_c_folders as _imagenet_c_folders
from raysearch.metrics.shift.released import _NpyRows as _NpyRows
from raysearch.metrics.shift.released import _open_npy as _open_npy
from raysearch.metrics.shift.released import _read_image as _read_image
from raysearch.metrics.shift.released import _shape_text as _shape_text
from raysearch.metrics.shift.released import _subfolders as _subfolders
from raysearch.metrics.shift.released import load_released_shift_set as load_released_shift_set
from raysearch.metrics.shift.sets import _IMAGE_KEY_PREFIX as _IMAGE_KEY_PREFIX
from raysearch.metrics.shift.sets import CLEAN as CLEAN
from raysearch.metrics.shift.sets import LazyImages as LazyImages
from raysearch.metrics.shift.sets import ShiftSet as ShiftSet
from raysearch.metrics.shift.sets import _corrupt_severities as _corrupt_severities
from raysearch.metrics.shift.sets import _entry_shape as _entry_shape
from raysearch.metrics.shift.sets import _stratified_subsample as _stratified_subsample
from raysearch.metrics.shift.sets import build_shift_set as build_shift_set
from raysearch.metrics.shift.sets import logger as logger

__all__ = [
    "CLEAN",
    "DEFAULT_CORRUPTIONS",
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
