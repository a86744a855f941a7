"""Shared helpers of the train-time losses: parameter validation and input flattening.

Every loss validates its hyperparameters in ``__init__`` with :func:`validate_number` (or
:func:`validate_choice`), its keyword-only ``ignore_index`` with :func:`validate_ignore_index`,
and checks and flattens its inputs in ``forward`` with :func:`flatten_inputs`, so that all losses
reject the same bad input with the same message and ignore the same targets.

Inputs: logits (N, K) or (N, K, d1, ..., dm) float; targets (N,) or (N, d1, ..., dm) int64, each
value a class in [0, K) or ``ignore_index`` (an int, ``-100`` by default as in
``torch.nn.CrossEntropyLoss``). A location whose target equals ``ignore_index`` counts nowhere:
:func:`flatten_inputs` removes its row, so every mean and batch statistic runs over the M kept
rows only (as the MbLS code does: ``logits[targets != ignore_index]``). When no row is kept, a
loss returns :func:`zero_loss`. :class:`FlatLoss` and :class:`TermsLoss` are the base classes
that do this once for every loss and document the shared ``ignore_index``, shapes and errors.
"""

import contextlib
import contextvars
import math
import numbers
from collections.abc import Iterator

import torch
from torch import nn

#: Floating-point dtypes that the losses compute in float32 (their gradient flows back unchanged).
_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Default ``ignore_index`` of every loss, that of ``torch.nn.CrossEntropyLoss``.
DEFAULT_IGNORE_INDEX = -100
#: Set by :func:`checked_targets`: the caller vouches for every target of the losses it calls.
_CHECKED_TARGETS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "raysearch_checked_targets", default=False
)


@contextlib.contextmanager
def checked_targets(checked: bool = True) -> Iterator[None]:
    """Within the block, :func:`kept_rows` trusts the targets: no check, every row kept.

    For a training loop that has checked all the labels of its split once (each a class index
    in [0, K), none ``ignore_index``): the per-batch check is a host synchronisation on CUDA,
    which makes every step wait for the GPU (and, with trials sharing a GPU, for its time
    slice). ``checked=False`` is a no-op block, for a loop whose labels failed or skipped the
    check. Per thread (a context variable).
    """
    token = _CHECKED_TARGETS.set(bool(checked) or _CHECKED_TARGETS.get())
    try:
        yield
    finally:
        _CHECKED_TARGETS.reset(token)


def validate_number(
    name: str,
    value: object,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    maximum_inclusive: bool = True,
) -> float:
    """Check that a hyperparameter is a real number in a range and return it as a float.

    The lower bound is inclusive; the upper bound is inclusive unless ``maximum_inclusive`` is
    False. NaN is rejected whatever the bounds; infinity is accepted where the bounds allow it
    (e.g. ``margin=inf`` switches a margin penalty off).

    Args:
        name: parameter name, quoted in the error message.
        value: the value to check; ``bool`` is rejected although it is an ``int``.
        minimum: inclusive lower bound, or None for no lower bound.
        maximum: upper bound, or None for no upper bound.
        maximum_inclusive: whether ``value == maximum`` is allowed.

    Returns:
        ``float(value)``.

    Raises:
        TypeError: if ``value`` is not a real number (``int``, ``float``, NumPy scalar).
        ValueError: if ``value`` is NaN or outside the range, e.g. "`margin` must be >= 0,
            got -1.0".
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if minimum is not None and maximum is not None:
        closing = "]" if maximum_inclusive else ")"
        condition = f"in [{minimum:g}, {maximum:g}{closing}"
    elif minimum is not None:
        condition = f">= {minimum:g}"
    elif maximum is not None:
        condition = f"{'<=' if maximum_inclusive else '<'} {maximum:g}"
    else:
        condition = "a number (not NaN)"
    too_low = minimum is not None and not number >= minimum
    too_high = maximum is not None and (
        number > maximum if maximum_inclusive else number >= maximum
    )
    if math.isnan(number) or too_low or too_high:
        raise ValueError(f"`{name}` must be {condition}, got {value}")
    return number


def validate_choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    """Check that a string hyperparameter is one of the allowed choices.

    Args:
        name: parameter name, quoted in the error message.
        value: the value to check.
        choices: the allowed strings.

    Returns:
        ``value`` unchanged.

    Raises:
        TypeError: if ``value`` is not a ``str``.
        ValueError: if ``value`` is not in ``choices``.
    """
    allowed = ", ".join(repr(choice) for choice in sorted(choices))
    if not isinstance(value, str):
        raise TypeError(f"`{name}` must be a str (one of {allowed}), got {type(value).__name__}")
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {allowed}, got {value!r}")
    return value


def validate_ignore_index(value: object) -> int:
    """Check the ``ignore_index`` of a loss and return it as an int.

    Any integer is accepted (``-100``, torch's default; ``255``, the boundary label of PASCAL VOC);
    one in [0, K) makes that class count nowhere.

    Args:
        value: the value to check; ``bool`` is rejected although it is an ``int``.

    Returns:
        ``int(value)``.

    Raises:
        TypeError: if ``value`` is not an integer (``int`` or NumPy integer), e.g. ``255.0``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`ignore_index` must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def check_tensor(name: str, value: object) -> None:
    """Raise TypeError "`name` must be a torch.Tensor, got <type>" unless ``value`` is a tensor."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}")


def reshape_inputs(
    logits: torch.Tensor, targets: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check logits and targets and reshape dense predictions to one row per location.

    The first half of :func:`flatten_inputs`: every row is kept and target values are not
    checked. Logits of shape (N, K, d1, ..., dm) become (N * d1 * ... * dm, K) (class axis last,
    sample-major: the rows of sample i are ``i * L`` to ``(i + 1) * L - 1``, L = d1 * ... * dm)
    and targets of shape (N, d1, ..., dm) become (N * d1 * ... * dm,). Float16 and bfloat16
    logits are cast to float32, so the squared margin penalties cannot overflow; the gradient
    flows back in the input dtype.

    Args:
        logits: unnormalised scores, float, shape (N, K) or (N, K, d1, ..., dm).
        targets: class indices, int64, shape (N,) or (N, d1, ..., dm), the logits' shape without
            axis 1.

    Returns:
        ``(logits_2d, targets_1d)`` of shapes (N * L, K) and (N * L,), L = d1 * ... * dm (1 for
        2-D logits).

    Raises:
        TypeError: if an input is not a tensor, ``logits`` is not floating point or ``targets`` is
            not int64.
        ValueError: if ``logits`` has fewer than 2 dimensions, no sample or no class, or the shape
            of ``targets`` is not ``logits.shape[:1] + logits.shape[2:]`` (both shapes quoted).
    """
    check_tensor("logits", logits)
    check_tensor("targets", targets)
    if not logits.is_floating_point():
        raise TypeError(f"`logits` must be a floating-point tensor, got dtype {logits.dtype}")
    if targets.dtype != torch.int64:
        raise TypeError(f"`targets` must be an int64 tensor of class indices, got {targets.dtype}")
    if logits.ndim < 2:
        raise ValueError(f"`logits` must have shape (N, K) or (N, K, *), got {tuple(logits.shape)}")
    expected = tuple(logits.shape[:1] + logits.shape[2:])
    if tuple(targets.shape) != expected:
        raise ValueError(
            f"`targets` must have shape {expected} for logits of shape {tuple(logits.shape)}, "
            f"got {tuple(targets.shape)}"
        )
    if logits.numel() == 0:
        raise ValueError(
            f"`logits` must hold at least one sample and one class, got shape {tuple(logits.shape)}"
        )
    num_classes = logits.shape[1]
    if logits.ndim > 2:
        logits = logits.movedim(1, -1).reshape(-1, num_classes)
        targets = targets.reshape(-1)
    if logits.dtype in _LOW_PRECISION:
        logits = logits.float()
    return logits, targets


def kept_rows(targets: torch.Tensor, num_classes: int, ignore_index: int) -> torch.Tensor | None:
    """Check target values and find the rows that count (target not ``ignore_index``).

    One host synchronisation (range check and count together); removing rows needs one anyway.
    None without a check inside :func:`checked_targets`.

    Args:
        targets: class indices, int64, shape (M,).
        num_classes: K.
        ignore_index: the target value of rows that count nowhere.

    Returns:
        Bool tensor (M,), True where ``targets != ignore_index``, or None when every row counts.

    Raises:
        ValueError: if a target is neither in [0, K) nor ``ignore_index``, e.g. "`targets` must
            be class indices in [0, 4) or `ignore_index`=255, got 7".
    """
    if _CHECKED_TARGETS.get():  # the caller checked every label (see `checked_targets`)
        return None
    keep = targets != ignore_index
    outside = keep & ((targets < 0) | (targets >= num_classes))
    num_outside, num_kept = torch.stack((outside.sum(), keep.sum())).tolist()
    if num_outside:
        bad = targets[outside][0].item()
        raise ValueError(
            f"`targets` must be class indices in [0, {num_classes}) or "
            f"`ignore_index`={ignore_index}, got {bad}"
        )
    return None if num_kept == targets.numel() else keep


def flatten_inputs(
    logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = DEFAULT_IGNORE_INDEX
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check logits and targets, flatten dense predictions and drop the ignored locations.

    Logits of shape (N, K, d1, ..., dm) become (N * d1 * ... * dm, K) (class axis last) and
    targets of shape (N, d1, ..., dm) become (N * d1 * ... * dm,), so that every location of a
    dense prediction counts as one sample (:func:`reshape_inputs`). Then the rows whose target
    equals ``ignore_index`` are removed, for (N, K) inputs too, leaving M rows: a loss computed on
    the result counts an ignored location nowhere (no term, no mean, no batch statistic), and its
    gradient there is 0. M = 0 when every target is ignored; the losses then return
    :func:`zero_loss`. Float16 and bfloat16 logits are cast to float32, so the squared margin
    penalties cannot overflow; the gradient flows back in the input dtype.

    Target values are checked (one host synchronisation per call, which removing rows needs
    anyway): each must lie in [0, K) or equal ``ignore_index``.

    Args:
        logits: unnormalised scores, float, shape (N, K) or (N, K, d1, ..., dm).
        targets: class indices, int64, shape (N,) or (N, d1, ..., dm), the logits' shape without
            axis 1; values in [0, K) or ``ignore_index``.
        ignore_index: target value of the locations that count nowhere. Defaults to ``-100``
            (``torch.nn.CrossEntropyLoss``'s default).

    Returns:
        ``(logits_2d, targets_1d)`` of shapes (M, K) and (M,), M = the number of locations
        (N * d1 * ... * dm) whose target is not ``ignore_index``; values in [0, K).

    Raises:
        TypeError: if an input is not a tensor, ``logits`` is not floating point or ``targets`` is
            not int64.
        ValueError: if ``logits`` has fewer than 2 dimensions, no sample or no class, the shape
            of ``targets`` is not ``logits.shape[:1] + logits.shape[2:]`` (both shapes quoted), or
            a target is neither in [0, K) nor ``ignore_index`` (the value quoted).
    """
    logits, targets = reshape_inputs(logits, targets)
    keep = kept_rows(targets, logits.shape[1], ignore_index)
    if keep is not None:
        logits, targets = logits[keep], targets[keep]
    return logits, targets


def zero_loss(logits: torch.Tensor) -> torch.Tensor:
    """The loss of a batch in which no location counts: 0, attached to ``logits``.

    Args:
        logits: the (0, K) rows left by :func:`flatten_inputs` (or any float tensor).

    Returns:
        Scalar zero tensor (``logits.sum() * 0``) that requires grad when ``logits`` does; its
        gradient is 0 everywhere, never NaN.
    """
    return logits.sum() * 0.0


def target_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Log-softmax probability of the target class of every row.

    Args:
        logits: float tensor of shape (M, K).
        targets: int64 tensor of shape (M,), values in [0, K).

    Returns:
        Tensor of shape (M,): ``log p_t = z_t - log sum_k exp(z_k)``.
    """
    return torch.log_softmax(logits, dim=1).gather(1, targets.unsqueeze(1)).squeeze(1)


class FlatLoss(nn.Module):
    """Base class of a loss computed on the kept rows of :func:`flatten_inputs`.

    :meth:`forward` checks and flattens the inputs, returns :func:`zero_loss` when every target
    is ignored and otherwise the subclass's ``_rows_loss`` of the (M, K) kept rows. The
    subclasses' docstrings refer here for ``ignore_index``, the shapes and the input errors.

    Args:
        ignore_index (int, optional): keyword-only; target value of the locations that count
            nowhere (no term, no mean, no batch statistic; all ignored gives 0). Defaults to
            ``-100`` (as ``torch.nn.CrossEntropyLoss``).

    Shape:
        logits: (N, K) or (N, K, *) float; targets: (N,) or (N, *) int64 with values in [0, K)
        or ``ignore_index``. Every location of (N, K, *) logits counts as one sample.

    Raises:
        TypeError: if ``ignore_index`` is not an int; in ``forward``, if ``logits`` is not
            floating point or ``targets`` not int64.
        ValueError: in ``forward``, if the shapes do not match (both shapes quoted) or a
            target is neither in [0, K) nor ``ignore_index``.
    """

    #: The attributes that ``repr`` shows, in order (``name=repr(value)``).
    repr_names: tuple[str, ...] = ("ignore_index",)

    def __init__(self, *, ignore_index: int = DEFAULT_IGNORE_INDEX) -> None:
        super().__init__()
        self.ignore_index = validate_ignore_index(ignore_index)

    def extra_repr(self) -> str:
        """Return the hyperparameters shown by ``repr`` (those named in ``repr_names``)."""
        return ", ".join(f"{name}={getattr(self, name)!r}" for name in self.repr_names)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Compute the loss of the batch.

        Args:
            logits: unnormalised scores, (N, K) or (N, K, *) float.
            targets: class indices, (N,) or (N, *) int64; ``ignore_index`` counts nowhere.

        Returns:
            Scalar tensor (as the subclass's docstring says; 0 when every target is ignored).

        Raises:
            TypeError: if ``logits`` is not floating point or ``targets`` is not int64.
            ValueError: if the shape of ``targets`` does not match ``logits``, or a target is
                neither in [0, K) nor ``ignore_index``.
        """
        logits, targets = flatten_inputs(logits, targets, ignore_index=self.ignore_index)
        if logits.shape[0] == 0:
            return zero_loss(logits)
        return self._rows_loss(logits, targets)

    def _rows_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of M >= 1 kept rows: logits (M, K), targets (M,) in [0, K)."""
        raise NotImplementedError


class TermsLoss(FlatLoss):
    """Base class of a loss made of named parts: :meth:`terms` for logging, their total.

    :meth:`terms` checks and flattens the inputs, runs ``_check_rows`` (a subclass's condition
    on K), gives every part named in ``term_names`` as :func:`zero_loss` when every target is
    ignored and otherwise the subclass's ``_rows_terms``; :meth:`forward` is ``_total`` of the
    parts (their sum unless a subclass says otherwise). ``ignore_index``, shapes and errors:
    as :class:`FlatLoss`.
    """

    #: The names of the parts returned by :meth:`terms`, in order.
    term_names: tuple[str, ...] = ()

    def terms(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """Compute the parts of the objective, for logging.

        Args:
            logits: unnormalised scores, (N, K) or (N, K, *) float.
            targets: class indices, (N,) or (N, *) int64; ``ignore_index`` counts nowhere.

        Returns:
            ``{name: scalar tensor}`` for every name of ``term_names`` (what each part is: the
            subclass's docstring), attached to the graph; :meth:`forward` combines them.

        Raises:
            TypeError: if ``logits`` is not floating point or ``targets`` is not int64.
            ValueError: if the shape of ``targets`` does not match ``logits``, a target is
                neither in [0, K) nor ``ignore_index``, or a subclass's requirement on K fails.
        """
        logits, targets = flatten_inputs(logits, targets, ignore_index=self.ignore_index)
        self._check_rows(logits)
        if logits.shape[0] == 0:
            return dict.fromkeys(self.term_names, zero_loss(logits))
        return self._rows_terms(logits, targets)

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Compute the total objective (the parts of :meth:`terms` combined).

        Args:
            logits: unnormalised scores, (N, K) or (N, K, *) float.
            targets: class indices, (N,) or (N, *) int64; ``ignore_index`` counts nowhere.

        Returns:
            Scalar tensor (as the subclass's docstring says).

        Raises:
            TypeError, ValueError: as :meth:`terms`.
        """
        return self._total(self.terms(logits, targets))

    def _check_rows(self, logits: torch.Tensor) -> None:
        """Raise ValueError where the (M, K) kept logits do not suit the loss (default: none)."""

    def _rows_terms(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parts of M >= 1 kept rows: logits (M, K), targets (M,) in [0, K)."""
        raise NotImplementedError

    def _total(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        """The objective from its parts: their sum."""
        return sum(parts.values())
