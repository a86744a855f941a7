"""Jung et al. (ICML 2023) Table 2 on the released CIFAR-10-LT logits, with our defaults.

The class-wise loss scaling paper released the logits its Table 2 (CIFAR-10-LT) was computed
on (SeungjinJung/SCTL, ``datasets/probs_{densenet40,resnet110}_c10_LT_logits.p``; converted to
``.npz`` in the shared data folder). ECE in percent, 15 equal-width bins, fitted on
``val_logits`` (long-tailed, 10,216 images) and measured on ``test_logits`` (balanced, 10,000).
A default must land within 0.3 ECE points of the published number (issue 7). The published
numbers are those of :data:`raysearch.calibration.reproduce.PUBLISHED`; every row of it, including
the ETS/PTS rows that need explicit settings, is checked through ``raysearch reproduce`` in
tests/test_reproduce.py. Here: the two rows the method stands on, by direct calls.
"""

from pathlib import Path

import numpy as np
import pytest

from raysearch.calibration import fit_calibrator
from raysearch.calibration.reproduce import PUBLISHED
from raysearch.metrics import accuracy, ece, softmax

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "cifar_outputs"
SKIP_REASON = (
    f"the released CIFAR-10-LT logits are not at {DATA} (the shared data folder is absent; "
    "see shared/data/README.md)"
)
TOLERANCE = 0.3  # ECE points
NETWORKS = {"DenseNet-40": "densenet40", "ResNet-110": "resnet110"}


def _published(network: str, label: str) -> tuple[float, float]:
    """(ECE %, accuracy %) of Table 2's row ``label`` for ``network``."""
    (row,) = [p for p in PUBLISHED if p.network == network and p.label == label
              and p.source.endswith("(CIFAR-10-LT)")]
    return row.ece_pct, row.accuracy_pct


@pytest.fixture(scope="module", params=sorted(NETWORKS))
def released(request):
    """(network, val_logits, val_labels, test_logits, test_labels) of one released file."""
    path = DATA / f"sctl_{NETWORKS[request.param]}_cifar10_lt_logits.npz"
    if not path.is_file():
        pytest.skip(SKIP_REASON)
    data = np.load(path)
    return (
        request.param,
        data["val_logits"],
        data["val_labels"],
        data["test_logits"],
        data["test_labels"],
    )


def _measure(released, name, **params):
    """Our (ECE %, accuracy %) of fit_calibrator(name, val, **params) on the test logits."""
    _, val_z, val_y, test_z, test_y = released
    probs = fit_calibrator(name, val_z, val_y, **params).predict_proba(test_z)
    return 100.0 * ece(probs, test_y, n_bins=15), 100.0 * accuracy(probs, test_y)


def _check(released, label, ours, tolerance=TOLERANCE):
    published_ece, published_acc = _published(released[0], label)
    ours_ece, ours_acc = ours
    assert abs(ours_ece - published_ece) <= tolerance, (label, ours_ece, published_ece)
    assert abs(ours_acc - published_acc) <= 0.05, (label, ours_acc, published_acc)


def test_uncalibrated_outputs_are_the_table_s(released):
    _, _, _, test_z, test_y = released
    probs = softmax(test_z.astype(np.float64))
    ours = (100 * ece(probs, test_y), 100 * accuracy(probs, test_y))
    _check(released, "uncalibrated", ours, tolerance=0.01)


def test_ts_default(released):
    _check(released, "TS", _measure(released, "ts"))


def test_ts_with_classwise_scaling_default(released):
    # the released code's variant is the default: it reproduces the published gain
    _check(released, "TS + class-wise scaling", _measure(released, "ts", classwise_scaling=True))


def test_paper_variant_does_not_reproduce_the_gain(released):
    # Eq. 3's per-class SUMS let the frequent classes dominate a long-tailed set: the ECE
    # stays near plain TS (6.33 and 5.77 measured), far from the published 3.22 and 3.53;
    # this is why the released code's class MEANS are the default
    ours_ece, _ = _measure(released, "ts", classwise_scaling=True, variant="paper")
    assert ours_ece > _published(released[0], "TS + class-wise scaling")[0] + 2.0
