"""Secondary calibration objectives added to a primary loss: SB-ECE, S-AvUC, AvUC, MMCE, MDCA.

Karandikar et al. (NeurIPS 2021, Sec. 5) train with ``PL + beta * SL``: a primary loss PL
(cross-entropy, focal or squared error) plus beta times a secondary, calibration-incentivising
loss SL computed on the whole batch. Every class of the family is such a pair:
:class:`SecondaryObjective` builds the primary from ``primary`` / ``primary_params`` and each
subclass implements :meth:`SecondaryObjective.secondary`. ``forward`` returns one scalar, the
total objective; :meth:`SecondaryObjective.terms` returns ``{"primary", "secondary", "total"}``
for logging.

Notation (Karandikar et al., Sec. 3): ``p_i = softmax(z_i)`` over K classes, confidence
``c_i = max_k p_ik`` (the gradient flows through the max), accuracy ``a_i = 1[argmax_k p_ik ==
y_i]`` (a constant: no gradient), entropy ``h_i = -sum_k p_ik log p_ik`` in nats. Every location
of a dense (N, K, *) prediction counts as one sample. The secondary losses are batch statistics
(bins, kernels, class frequencies over the batch), not means of per-sample terms, so their value
depends on the batch size. A location whose target is ``ignore_index`` counts nowhere: its row is
removed before the primary AND the secondary loss, so it is in no bin, kernel, count or class
mean, and N counts the other locations only; a batch with none gives 0.

Variants: where the paper's equations and the authors' released code differ, ``variant=
"official"`` (the DEFAULT) is the released code, the form whose scale the published
hyperparameters and tables belong to, and ``variant="paper"`` the equations as written. SB-ECE,
S-AvUC, AvUC and AvUC-GS also accept the older names ``"caltrain"`` (and, for SB-ECE,
``"caltrain_lb"`` / ``"caltrain_bin"``, which also fix ``binning``) for ``"official"``. MDCA's
paper and code agree: it has no variant. Each class docstring says what differs and why.

:func:`soft_binned_ece` is the soft-binned ECE of the paper's Eq. 11-12 on given confidences and
correctness, shared with the post-hoc ``ts_sbece`` calibrator.

Layout: this module holds no code; it re-exports every name of the modules of the family, each
importable from here as before:

- :mod:`raysearch.losses.secondary`: :class:`SecondaryObjective` (primary + beta * secondary),
  :class:`BrierLoss` (the ``"mse"`` primary), and the parameter checks and numerics shared by
  the secondary losses;
- :mod:`raysearch.losses.soft_binning`: soft binning, :func:`soft_binned_ece` and
  :class:`SoftBinnedECE` (Eq. 8-12);
- :mod:`raysearch.losses.avuc`: :func:`soft_uncertainty`, :class:`SoftAvUC`, :class:`AvUC` and
  :class:`AvUCGS` (Eq. 13-16; Krishnan and Tickoo);
- :mod:`raysearch.losses.mmce_mdca`: :class:`MMCE` and :class:`MDCA`.

Those modules import :mod:`raysearch.losses.secondary` (and ``_common`` / ``classification``),
never this one.

References:
    Karandikar, Cain, Tran, Lakshminarayanan, Shlens, Mozer and Roelofs, "Soft Calibration
    Objectives for Neural Networks", NeurIPS 2021, arXiv:2108.00106. Released code (footnote 2
    of the paper): google/uncertainty-baselines ``experimental/caltrain/secondary_losses.py``.
    Kumar, Sarawagi and Jain, "Trainable Calibration Measures for Neural Networks from Kernel
    Mean Embeddings", ICML 2018; code: aviralkumar2907/MMCE ``20ng_mmce.py``.
    Hebbalaguppe, Prakash, Madan and Arora, "A Stitch in Time Saves Nine", CVPR 2022,
    arXiv:2203.13834; code: mdca-loss/MDCA-Calibration ``solvers/loss.py``.
"""

from raysearch.losses.avuc import AVUC_VARIANTS as AVUC_VARIANTS
from raysearch.losses.avuc import AvUC as AvUC
from raysearch.losses.avuc import AvUCGS as AvUCGS
from raysearch.losses.avuc import SoftAvUC as SoftAvUC
from raysearch.losses.avuc import _avuc_ratio as _avuc_ratio
from raysearch.losses.avuc import _entropy as _entropy
from raysearch.losses.avuc import _smoothed_entropy as _smoothed_entropy
from raysearch.losses.avuc import soft_uncertainty as soft_uncertainty
from raysearch.losses.mmce_mdca import MDCA as MDCA
from raysearch.losses.mmce_mdca import MMCE as MMCE
from raysearch.losses.mmce_mdca import MMCE_VARIANTS as MMCE_VARIANTS
from raysearch.losses.mmce_mdca import MMCE_W_EPS as MMCE_W_EPS
from raysearch.losses.mmce_mdca import MMCE_W_ROOT_EPS as MMCE_W_ROOT_EPS
from raysearch.losses.mmce_mdca import _paper_mmce_w_squared as _paper_mmce_w_squared
from raysearch.losses.mmce_mdca import _released_mmce_w as _released_mmce_w
from raysearch.losses.secondary import CALTRAIN_EPS as CALTRAIN_EPS
from raysearch.losses.secondary import OFFICIAL as OFFICIAL
from raysearch.losses.secondary import PRIMARIES as PRIMARIES
from raysearch.losses.secondary import PRIMARY_PARAMS as PRIMARY_PARAMS
from raysearch.losses.secondary import BrierLoss as BrierLoss
from raysearch.losses.secondary import SecondaryObjective as SecondaryObjective
from raysearch.losses.secondary import _build_primary as _build_primary
from raysearch.losses.secondary import _canonical_variant as _canonical_variant
from raysearch.losses.secondary import _check_primary as _check_primary
from raysearch.losses.secondary import _confidence_and_accuracy as _confidence_and_accuracy
from raysearch.losses.secondary import _finite as _finite
from raysearch.losses.secondary import _open_unit as _open_unit
from raysearch.losses.secondary import _positive as _positive
from raysearch.losses.secondary import _positive_int as _positive_int
from raysearch.losses.secondary import _safe_root as _safe_root
from raysearch.losses.soft_binning import _EMPTY_BIN as _EMPTY_BIN
from raysearch.losses.soft_binning import SBECE_BINNINGS as SBECE_BINNINGS
from raysearch.losses.soft_binning import SBECE_VARIANTS as SBECE_VARIANTS
from raysearch.losses.soft_binning import SoftBinnedECE as SoftBinnedECE
from raysearch.losses.soft_binning import _bin_centres as _bin_centres
from raysearch.losses.soft_binning import _caltrain_bin as _caltrain_bin
from raysearch.losses.soft_binning import _caltrain_lb as _caltrain_lb
from raysearch.losses.soft_binning import _paper_sbece as _paper_sbece
from raysearch.losses.soft_binning import _soft_memberships as _soft_memberships
from raysearch.losses.soft_binning import soft_binned_ece as soft_binned_ece
