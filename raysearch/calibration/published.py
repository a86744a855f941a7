r"""The published numbers the reproduction report checks, read from a data file.

:data:`PUBLISHED` holds one :class:`PublishedNumber` per published calibration result on
network outputs that their authors released: the paper and table, the released output file it
belongs to, the call that gives our number (:attr:`PublishedNumber.call`), and its kind:

* ``"default"``: the call uses only our defaults (the method as the paper ran it);
* ``"explicit"``: the paper's row ran a different implementation than our method of that name
  (e.g. its own re-implementation of a baseline); a named setting reproduces it;
* ``"info"``: shown for comparison, not expected to match (the note says why). The
  ``Average`` rows of a table are ``info`` rows too: ours is the mean of our four rows above.

The numbers are data, not code: ``published_jung2023.yaml`` beside this module (package data)
lists the table's rows (label, call, kind, note) and its columns (network, file, published ECE
and accuracy in percent), read by :func:`load_published`.

Published numbers checked (ECE in %, 15 equal-width bins, calibrator fitted on the released
validation logits and measured on the released test logits):

* Jung et al., "Scaling of Class-wise Training Losses for Post-hoc Calibration", ICML 2023,
  Table 2 (CIFAR-10-LT and CIFAR-100-LT): DenseNet-40, WideResNet-28, ResNet-110 and
  ResNet-110-SD trained on long-tailed CIFAR (App. C, Eq. 16: :math:`\#D_i = \#D_0
  \rho^{i/(c-1)}` with :math:`\#D_0` = 5,000 (CIFAR-10) or 500 (CIFAR-100) and :math:`\rho`
  = 0.1, i.e. an imbalance ratio :math:`\#D_0 / \#D_{c-1}` of 10: the only value giving the
  paper's 20,431 and 19,573 images). Those images are split about 50/50 into the network's
  training set and the validation set the calibrators are fitted on ("10215/10216/10000 for
  CIFAR10-LT and 9786/9787/10000 for CIFAR100-LT", Sec. 5.1), still long-tailed (2,486 ... 256
  per class on CIFAR-10); the test set is the full balanced test set (10,000). Released with
  github.com/SeungjinJung/SCTL (commit 1f8585e; later moved to a download link in its README)
  under the names its ``models/utils.py`` reads:

  ========================  ==============  ==================================================
  network                   authors' name   file (``c100`` for CIFAR-100-LT)
  ========================  ==============  ==================================================
  DenseNet-40               densenet40      ``probs_densenet40_c10_LT_logits.p``
  WideResNet-28             resnet_wide28   ``probs_resnet_wide28_c10_LT_logits.p``
  ResNet-110                resnet110       ``probs_resnet110_c10_LT_logits.p``
  ResNet-110-SD             resnet110_SD    ``probs_resnet110_SD_c10_LT_logits.p``
  ========================  ==============  ==================================================

  (pickles of ``((val_logits, val_labels), (test_logits, test_labels))``); the same arrays as
  an ``.npz`` with ``val_logits``, ``val_labels``, ``test_logits``, ``test_labels`` are read
  too, named ``sctl_<authors' name>_cifar10_lt_logits.npz`` (``cifar100`` for CIFAR-100-LT),
  e.g. ``sctl_densenet40_cifar10_lt_logits.npz``. Table 2 has no ResNet-32 (its Table 1's
  WideResNet-32 outputs are balanced CIFAR, not checked here). Rows, for each network: the
  twenty of the table (uncalibrated, TS, ETS, PTS, CTS, each also with LS, with FL and with
  class-wise scaling, "Ours" in the table, and the four averages).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

__all__ = ["KINDS", "PUBLISHED", "PublishedNumber", "load_published"]

#: Kinds of :class:`PublishedNumber` (module docstring); the first two are checked.
KINDS = ("default", "explicit", "info")
#: The data file of Jung et al. 2023, Table 2 (package data of :mod:`raysearch.calibration`).
_JUNG_TABLE2 = "published_jung2023.yaml"


@dataclass(frozen=True)
class PublishedNumber:
    """One published calibration result on released network outputs.

    Attributes:
        source: the paper and table, e.g. ``"Jung et al. 2023, Table 2 (CIFAR-10-LT)"``.
        network: the network whose outputs were calibrated, e.g. ``"DenseNet-40"``.
        files: accepted names of the released output file, first the ``.npz`` layout, then the
            authors' own file name; looked up anywhere under the report's data folder,
            case-insensitively.
        label: the row as the paper names it, e.g. ``"TS + class-wise scaling"``.
        calibrator: a :func:`raysearch.calibration.fit_calibrator` name, or None for the
            uncalibrated outputs (and for an average row).
        params: keyword arguments of ``fit_calibrator`` beyond the name and the data.
        ece_pct: the published ECE in percent (15 bins).
        accuracy_pct: the published accuracy in percent, or None.
        kind: ``"default"``, ``"explicit"`` or ``"info"`` (module docstring).
        note: why the row is not a default, shown under the table.
        n_classes: the number of classes K the file's logits must have, or None for any.
        average_of: for an average row, the labels of the rows (same source and network) whose
            mean it is; empty otherwise.
    """

    source: str
    network: str
    files: tuple[str, ...]
    label: str
    calibrator: str | None
    params: Mapping[str, Any]
    ece_pct: float
    accuracy_pct: float | None = None
    kind: str = "default"
    note: str = ""
    n_classes: int | None = None
    average_of: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"`kind` must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.average_of and self.calibrator is not None:
            raise ValueError(f"an average row has no calibrator, got {self.calibrator!r}")

    @property
    def checked(self) -> bool:
        """Whether a miss fails the report (``default`` and ``explicit`` rows)."""
        return self.kind != "info"

    @property
    def call(self) -> str:
        """The call that gives our number, e.g. ``fit_calibrator("ts", classwise_scaling=True)``."""
        if self.average_of:
            return f"(mean of the {len(self.average_of)} rows above)"
        if self.calibrator is None:
            return "(uncalibrated)"
        args = [_literal(self.calibrator)]
        args += [f"{key}={_literal(value)}" for key, value in self.params.items()]
        return f"fit_calibrator({', '.join(args)})"


def _literal(value: Any) -> str:
    """A Python literal with double-quoted strings, as the docs write calls."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _files(file_name: str, cifar: int) -> tuple[str, str]:
    """Accepted names of one released Table 2 file: our ``.npz`` name, the authors' pickle."""
    short = "c10" if cifar == 10 else "c100"
    return (
        f"sctl_{file_name.lower()}_cifar{cifar}_lt_logits.npz",
        f"probs_{file_name}_{short}_LT_logits.p",
    )


def _column(table: Mapping[str, Any], column: Mapping[str, Any]) -> list[PublishedNumber]:
    """The rows of one column (network and dataset) of a table, in the table's row order."""
    cifar = column["cifar"]
    source = f"{table['source']} (CIFAR-{cifar}-LT)"
    files = _files(column["file_name"], cifar)
    overrides = column.get("overrides") or {}
    numbers = []
    for row, ece_pct, acc_pct in zip(table["rows"], column["ece"], column["accuracy"],
                                     strict=True):
        row = {**row, **overrides.get(row["label"], {})}
        note = table["notes"][row["note"]] if row.get("note") else ""
        numbers.append(PublishedNumber(
            source, column["network"], files, row["label"], row.get("calibrator"),
            dict(row.get("params") or {}), float(ece_pct), float(acc_pct), row["kind"], note,
            cifar, tuple(row.get("average_of") or ()),
        ))
    return numbers


def load_published(path: str | Path | None = None) -> tuple[PublishedNumber, ...]:
    """The published numbers of a table file, one per row and column.

    Args:
        path: a YAML file laid out as ``published_jung2023.yaml`` (``source``, ``notes``,
            ``rows``, ``columns``); None: that file, shipped with the package.

    Returns:
        One :class:`PublishedNumber` per row of each column, column by column, each in the
        table's row order.

    Raises:
        ValueError: if a column does not give one ECE and one accuracy per row, or a row has
            an unknown kind.
        KeyError: if a row names a note the file does not define.
    """
    if path is None:
        text = resources.files("raysearch.calibration").joinpath(_JUNG_TABLE2).read_text()
    else:
        text = Path(path).read_text()
    table = yaml.safe_load(text)
    return tuple(number for column in table["columns"] for number in _column(table, column))


#: Every published number the report checks (module docstring): Jung et al. 2023, Table 2, read
#: from ``published_jung2023.yaml``.
PUBLISHED: tuple[PublishedNumber, ...] = load_published()
