r"""Shared pieces of the post-hoc calibrators: input validation, softmax helpers, the base class.

Every calibrator follows the netcal-style API: ``fit(logits, labels)`` returns the calibrator,
``predict_proba(logits)`` returns (N, K) float64 probabilities whose rows sum to 1, and
``predict_proba`` (or any fitted attribute) before ``fit`` raises ``RuntimeError``.

Inputs are logits (N, K) or, with ``inputs="probs"``, probabilities whose logarithm is used as
logits: :math:`z = \log \max(p, 10^{-12})`. Softmax ignores a per-row constant, so ``log p`` is a
valid logit vector for every calibrator whose output is invariant to such a shift (TS, ETS, PTS,
TS-SB-ECE); CTS divides each column by its own temperature and is not shift invariant (see
:class:`~raysearch.calibration.temperature.ClassTemperatureScaling`).

The class-wise loss scaling wrapper
(:class:`~raysearch.calibration.classwise.ClasswiseLossScaling`) drives a calibrator through
the hooks of :class:`Calibrator` (``_reset``, ``_first_iteration``, ``_fit_with_coef``,
``_fit_classwise``, ``_class_losses``): a calibrator written against them gets class-wise
scaling for free.

A fit has no finite optimum when the calibration set is separable
(:func:`is_separable`: every sample's own class has the strictly largest logit): the objectives
that reward confident right answers (NLL, Brier, focal, the ECEs) then keep falling as the
temperature goes to 0. The temperature calibrators stop at their lower bound ``t_min`` and set
:attr:`Calibrator.degenerate`; their probabilities are then close to one-hot and say nothing
about calibration.
"""

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

# The validation and softmax helpers live in the leaf module ``_checks`` (imported by
# ``objectives`` too, which ``Calibrator`` imports); the softmaxes are part of this module's API.
from raysearch.calibration._checks import log_softmax, softmax, validate_choice
from raysearch.metrics.checks import check_labels, check_row_sums, to_numpy

__all__ = [
    "INPUTS",
    "PROB_FLOOR",
    "Calibrator",
    "check_all_classes_present",
    "is_separable",
    "log_softmax",
    "softmax",
]

#: Accepted values of ``inputs``.
INPUTS = ("logits", "probs")
#: Floor on probabilities before their logarithm is taken (``inputs="probs"``).
PROB_FLOOR = 1e-12
#: Tolerance on probabilities slightly outside [0, 1] (float rounding), as in raysearch.metrics.
_PROB_TOLERANCE = 1e-6
#: Tolerance on row sums of probabilities, as in raysearch.metrics.
_ROW_SUM_TOLERANCE = 1e-3


# --------------------------------------------------------------------------------------------
# Array conversion and input validation
# --------------------------------------------------------------------------------------------


def _check_scores(values: Any, inputs: str, name: str) -> np.ndarray:
    """Validate (N, K) logits or probabilities and return float64 logits.

    Raises:
        TypeError: if ``values`` does not hold real numbers.
        ValueError: if not 2-D, empty, K < 2, not finite; for ``inputs="probs"`` if outside
            [0, 1] (tolerance 1e-6) or rows not summing to 1 (tolerance 1e-3).
    """
    array = to_numpy(values)
    if array.dtype == np.bool_ or not (
        np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)
    ):
        raise TypeError(f"`{name}` must hold real numbers, got dtype {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"`{name}` must be 2-D (N, K), got shape {tuple(array.shape)}")
    n, k = array.shape
    if n == 0:
        raise ValueError(f"`{name}` must hold at least one sample, got shape {(n, k)}")
    if k < 2:
        raise ValueError(f"`{name}` must have K >= 2 classes (columns), got shape {(n, k)}")
    z = array.astype(np.float64)  # a copy: callers may modify it
    finite = np.isfinite(z)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise ValueError(f"`{name}` must be finite; row {row} holds NaN or inf")
    if inputs == "logits":
        return z
    low, high = float(z.min()), float(z.max())
    if low < -_PROB_TOLERANCE or high > 1.0 + _PROB_TOLERANCE:
        raise ValueError(
            f"`{name}` with inputs='probs' must lie in [0, 1], got values in "
            f"[{low:.6g}, {high:.6g}]; pass inputs='logits' for logits"
        )
    check_row_sums(z.sum(axis=1), _ROW_SUM_TOLERANCE, f"`{name}` with inputs='probs'")
    np.maximum(z, PROB_FLOOR, out=z)
    np.log(z, out=z)
    return z


def check_all_classes_present(labels: np.ndarray, n_classes: int, method: str) -> None:
    """Raise if a class has no sample in the calibration set.

    Args:
        labels: (N,) validated labels.
        n_classes: K.
        method: name of what needs every class, quoted in the message.

    Raises:
        ValueError: naming the missing classes, e.g. "cts needs every class in the calibration
            set; missing classes: 3, 7".
    """
    counts = np.bincount(labels, minlength=n_classes)
    missing = np.flatnonzero(counts == 0)
    if missing.size:
        listed = ", ".join(str(int(c)) for c in missing[:20])
        more = f" (and {missing.size - 20} more)" if missing.size > 20 else ""
        raise ValueError(
            f"{method} needs every class in the calibration set; missing classes: {listed}{more}"
        )


def is_separable(z: np.ndarray, labels: np.ndarray) -> bool:
    """Whether every sample's own class has the strictly largest score (100% accuracy, no ties).

    On such a calibration set NLL, the Brier score, focal loss and the ECEs fall towards 0 as
    a temperature T -> 0, so temperature scaling has no finite optimum there.

    Args:
        z: (N, K) float64 logits (or log-probabilities: the argmax is the same).
        labels: (N,) int64 labels in [0, K).

    Returns:
        True when the set is separable; False for an empty set.
    """
    if z.shape[0] == 0:
        return False
    top = z.max(axis=1)
    if not np.all(z[np.arange(z.shape[0]), labels] >= top):  # a wrong argmax: ordinary data
        return False
    return bool(np.all((z == top[:, None]).sum(axis=1) == 1))  # and no tie for the top


# --------------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------------


class Calibrator:
    """Base class of the post-hoc calibrators (netcal-style ``fit`` → ``predict_proba``).

    Subclasses implement ``_reset``, ``_fit_with_coef``, ``_first_iteration``,
    ``_predict_log_proba`` and ``_params``; the base class validates inputs, converts
    probabilities to logits and guards against use before ``fit``.

    Attributes:
        degenerate (bool): True when the last ``fit`` had no finite optimum: the calibration
            set is separable (:func:`is_separable`) and the objective is lowest at the lower
            bound ``t_min`` of the temperatures the fit searches, where the fitted temperature(s)
            stopped (``pts``: the TS temperature it starts from; ``pts_sctl``: TS with its
            objective), so the calibrated probabilities are near one-hot. Each calibrator then
            warns (``UserWarning``). False before ``fit``, for a finite optimum (``ls``), and
            for calibrators without a temperature (``dirichlet``).

    Class attributes:
        name: registry name (e.g. ``"ts"``).
        rank_preserving: whether the calibrated probabilities keep the order of the logits
            within every sample (so predictions never change).
        default_objective: objective used when none is given.

    Args:
        objective (CalibrationObjective): the fitted objective, from
            :func:`raysearch.calibration.objectives.build_objective`.
        inputs (str, optional): ``"logits"`` or ``"probs"`` (``log max(p, 1e-12)`` is used).
            Defaults to ``"logits"``.

    Raises:
        ValueError: if ``inputs`` is unknown.
        TypeError: if ``objective`` is not a ``CalibrationObjective``.
    """

    name: ClassVar[str] = ""
    rank_preserving: ClassVar[bool] = True
    default_objective: ClassVar[str] = "nll"

    def __init__(self, objective: Any, *, inputs: str = "logits") -> None:
        from raysearch.calibration.objectives import CalibrationObjective

        if not isinstance(objective, CalibrationObjective):
            raise TypeError(
                "`objective` must be a CalibrationObjective (see build_objective), got "
                f"{type(objective).__name__}"
            )
        self.objective = objective
        self.inputs = validate_choice("inputs", inputs, INPUTS)
        self.n_classes_: int | None = None
        self.degenerate = False

    # ---------------------------------------------------------------- public API

    def fit(self, logits: Any, labels: Any) -> "Calibrator":
        """Fit on a calibration set.

        Args:
            logits: (N, K) float logits, or probabilities when ``inputs="probs"``; NumPy
                array or torch tensor.
            labels: (N,) integer class indices in [0, K).

        Returns:
            ``self``, fitted.

        Raises:
            ValueError: for invalid inputs (see the module docstring), or a missing class
                where the method needs every class.
        """
        z, y = self._prepare_fit(logits, labels)
        self._reset(z, y)
        self._fit_with_coef(z, y, None)
        self.degenerate = self._is_degenerate(z, y)
        self.n_classes_ = z.shape[1]
        return self

    def predict_proba(self, logits: Any) -> np.ndarray:
        """Calibrated probabilities.

        Args:
            logits: (N, K) float logits (probabilities when ``inputs="probs"``).

        Returns:
            (N, K) float64 probabilities; rows sum to 1.

        Raises:
            RuntimeError: if called before ``fit``.
            ValueError: for invalid inputs or a K different from the fitted one.
        """
        z = self._prepare_predict(logits)
        return np.exp(self._predict_log_proba(z))

    @property
    def is_fitted(self) -> bool:
        """Whether ``fit`` has completed."""
        return self.n_classes_ is not None

    @property
    def params_(self) -> dict[str, Any]:
        """Fitted parameters for logging (floats, lists of floats, strings).

        Raises:
            RuntimeError: if called before ``fit``.
        """
        self._check_fitted()
        return {**self._params(), **{f"objective_{k}": v for k, v in self.objective.params.items()}}

    def __repr__(self) -> str:
        state = "fitted" if self.is_fitted else "unfitted"
        return (
            f"{type(self).__name__}(objective={self.objective.name!r}, "
            f"inputs={self.inputs!r}) [{state}]"
        )

    # ---------------------------------------------------------------- validation helpers

    def _prepare_fit(self, logits: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
        """Validate and convert a calibration set; marks the calibrator unfitted until done."""
        z = _check_scores(logits, self.inputs, "logits")
        y = check_labels(labels, z.shape[0], z.shape[1], "logits")
        self.n_classes_ = None
        self.degenerate = False
        return z, y

    def _prepare_predict(self, logits: Any) -> np.ndarray:
        self._check_fitted()
        z = _check_scores(logits, self.inputs, "logits")
        if z.shape[1] != self.n_classes_:
            raise ValueError(
                f"`logits` must have K={self.n_classes_} columns like the calibration set, "
                f"got shape {z.shape}"
            )
        return z

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError(
                f"{type(self).__name__} is not fitted yet; call fit(logits, labels) first"
            )

    def _class_losses(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per-class objective (mean over each class's samples) at the current parameters."""
        return self.objective.class_losses(self._predict_log_proba(z), y, z.shape[1])

    # ---------------------------------------------------------------- hooks

    def _reset(self, z: np.ndarray, y: np.ndarray) -> None:
        """Set the parameters to the start of the optimisation."""
        raise NotImplementedError

    def _fit_with_coef(self, z: np.ndarray, y: np.ndarray, class_coef: np.ndarray | None) -> None:
        r"""Minimise the objective (class-weighted when ``class_coef`` is given), warm start.

        With ``class_coef`` = c the objective is :math:`\sum_i c_i L_i`, L_i the objective on
        class i's samples; with None it is the objective on all samples.
        """
        raise NotImplementedError

    def _first_iteration(self, z: np.ndarray, y: np.ndarray, class_coef: np.ndarray) -> None:
        """Take one iteration of the optimiser on the class-weighted objective (Eq. 6's L^1)."""
        raise NotImplementedError

    def _fit_classwise(
        self,
        z: np.ndarray,
        y: np.ndarray,
        coef_fn: Callable[[np.ndarray], np.ndarray],
        *,
        max_rounds: int,
        tol: float,
    ) -> dict[str, Any]:
        """Fit with class coefficients that follow the current class losses (fixed point).

        The released class-wise scaling code recomputes the weights from the current
        (detached) class losses at every optimiser step. A scipy optimiser needs a fixed
        objective, so the same stationary point is reached by rounds: fit with the
        coefficients frozen, recompute them from the new class losses, move the coefficients
        towards them, repeat. The move is damped (Mann iteration: the step factor starts at 1
        and halves, down to 1/64, whenever the residual max|new - coef| fails to shrink or the
        update reverses direction), because undamped rounds can oscillate with period 2.
        Converged when the residual is <= ``tol``. No fixed point may exist when the
        calibrator can equalise the class losses (CTS with ``nd``: the normalisation divides by
        a vanishing spread); the caller then warns and keeps the last fit.

        Returns:
            ``{"rounds": int, "converged": bool, "residual": float}``.
        """
        coef = coef_fn(self._class_losses(z, y))
        step, previous, previous_update = 1.0, float("inf"), None
        converged, residual, rounds = False, float("inf"), 0
        for rounds in range(1, max_rounds + 1):  # noqa: B007
            self._fit_with_coef(z, y, coef)
            update = coef_fn(self._class_losses(z, y)) - coef
            residual = float(np.max(np.abs(update)))
            if residual <= tol:
                converged = True
                break
            reversed_ = previous_update is not None and float(update @ previous_update) < 0
            if residual >= previous or reversed_:
                step = max(step / 2.0, 1.0 / 64.0)
            previous, previous_update = residual, update
            coef = coef + step * update
        return {"rounds": rounds, "converged": converged, "residual": residual}

    def _is_degenerate(self, z: np.ndarray, y: np.ndarray) -> bool:
        """Whether the fit just made has no finite optimum (see :attr:`degenerate`)."""
        return False

    def _predict_log_proba(self, z: np.ndarray) -> np.ndarray:
        """Log of the calibrated probabilities of validated float64 logits."""
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        raise NotImplementedError
