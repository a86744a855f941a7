"""Objectness-adaptive label smoothing: the smoothing of each sample follows its object size.

The loss needs one number per sample from the data pipeline, the objectness
``o_i = object area / image area`` of the sample's augmented crop (see
:mod:`raysearch.training.data.objectness`), passed as ``loss_fn(logits, targets, objectness=o)``.
Notation: ``z`` are the K logits of a sample, ``t`` its target class, ``p = softmax(z)``.
"""

import torch

from raysearch.losses._common import (
    DEFAULT_IGNORE_INDEX,
    FlatLoss,
    check_tensor,
    kept_rows,
    reshape_inputs,
    validate_number,
    zero_loss,
)


class ObjectnessLabelSmoothing(FlatLoss):
    """Adaptive label smoothing from the objectness of each crop, ALS (registry name ``als``).

    Krothapalli and Abbott smooth the one-hot label pi of sample i by the share of the image that
    is NOT the object, ``alpha_i = 1 - o_i`` with ``o_i = wh / (WH)`` the object area over the
    image area after the augmentation crop (Eq. 5), and mix the result with the hard label by
    ``beta`` (the weighted form above Eq. 6):

        q_{i, k} = beta * [pi_k (1 - alpha_i) + (1 - pi_k) alpha_i / (K - 1)] + (1 - beta) pi_k,

    i.e. ``1 - beta * alpha_i`` on the target and ``beta * alpha_i / (K - 1)`` on each of the
    K - 1 other classes; the loss is the cross-entropy with these soft labels,

        L = (1/N) sum_i -sum_k q_{i, k} log p_{i, k}.

    Eq. 6 as printed has a sign slip in its non-target term (``-beta(... - alpha sum ...)``) and
    writes ``log p_{i, y}`` inside the sum; this class implements the cross-entropy with the soft
    label that the text defines, which is what Eq. 6 expands to once both are fixed. Read
    literally, Eq. 6 collapses to ``-(1 - 2 * alpha * beta) log p_{i, y}``, which pushes the target
    probability DOWN whenever ``alpha * beta > 1/2``, contradicting Eq. 5 and the text; it is a
    typesetting error, not a method, so there is no ``variant="paper"``.

    Released code and default: the authors released no code (App. A.4 promises a release before
    the conference; we found none), so the paper's equations are the only reference and there is
    no ``variant``. Its published numbers (ImageNet ResNet-50/101, Tables 1-3 and 5) come from
    ImageNet-scale training with box-derived objectness; the defaults follow its main
    "A. L. S." setting (``beta = 1``, no context samples). The paper computes the object share
    from the transformed object mask (App. A.2, Fig. 4: white pixels after the crop); the data
    pipeline supplies ``o_i``. Note that the paper's LS baseline (its Eq. 4) spreads alpha over
    the K - 1 other classes, unlike :class:`raysearch.losses.LabelSmoothing`, which spreads
    epsilon over all K.

    Limits: ``beta=0`` or ``o_i=1`` (the object fills the crop) gives plain cross-entropy; a crop
    that misses the object (``o_i=0``, ``alpha_i=1``) with ``beta=1`` puts ALL the mass on the
    K - 1 other classes, ``1/(K - 1)`` each and 0 on the target, as Eq. 5 says ("a uniform
    distribution over all other classes").

    Context (the paper's "A. L. S. + Context"): about 15% of the training samples are drawn from
    a copy of the data with the objects removed, and their label is "a vector of uniform
    probability distribution across [all] classes", ``q_{i, k} = 1/K`` for every k, target
    included, whatever ``beta``. Samples flagged in ``context`` get that label. The share is
    ``context_fraction``: this loss does not use it in ``forward``; the training loop
    (:func:`raysearch.training.run.fit`) reads it to make that share of the training samples
    object-free and passes ``context=`` (see
    :class:`raysearch.training.data.objectness.ObjectnessDataset`). ``context_fraction=0`` (the
    default) is plain ALS.

    The class attribute ``side_inputs = ("objectness",)`` tells the training loop to feed
    augmented crops with their objectness (:mod:`raysearch.training.data.side`).

    References:
        Krothapalli and Abbott, "Adaptive Label Smoothing" (ICLR 2021 submission, "One size
        doesn't fit all: adaptive label smoothing"), arXiv:2009.06432.

    Args:
        beta (float, optional): weight of the adaptive smoothing against the hard label, in
            [0, 1]; 0 is hard labels, 1 is full adaptive smoothing. Defaults to ``1.0`` (the
            paper's main "A. L. S." setting; it also reports 0.75 and 0.25).
        context_fraction (float, optional): share of training samples that the training loop
            turns into object-free context samples, in [0, 1). The paper's "+ Context" runs use
            about ``0.15``. Defaults to ``0.0``.
        ignore_index (int, optional): keyword-only; target value of the locations that count
            nowhere (no term, no mean, no batch statistic; all ignored gives 0). Defaults to
            ``-100`` (as ``torch.nn.CrossEntropyLoss``).

    Shape:
        logits: (N, K) or (N, K, *) float with K >= 2; targets: (N,) or (N, *) int64 with values
        in [0, K) or ``ignore_index``; objectness: (N,) float in [0, 1], one value per sample
        (shared by every location of a dense prediction); context: (N,) bool, optional. Each
        location gets its sample's objectness and context flag first, then the ignored ones are
        removed with them: the mean runs over the other locations only.

    Returns:
        Scalar tensor: the batch mean over the locations whose target is not ``ignore_index``
        (0 if there is none).

    Raises:
        TypeError: if a parameter is not a real number.
        ValueError: if ``beta`` is not in [0, 1] or ``context_fraction`` not in [0, 1).
    """

    repr_names = ("beta", "context_fraction", "ignore_index")

    #: Read by the training loop: this loss takes ``objectness=`` per sample (and ``context=``
    #: when ``context_fraction`` > 0).
    side_inputs = ("objectness",)

    def __init__(
        self,
        beta: float = 1.0,
        context_fraction: float = 0.0,
        *,
        ignore_index: int = DEFAULT_IGNORE_INDEX,
    ) -> None:
        super().__init__(ignore_index=ignore_index)
        self.beta = validate_number("beta", beta, minimum=0.0, maximum=1.0)
        self.context_fraction = validate_number(
            "context_fraction", context_fraction, minimum=0.0, maximum=1.0, maximum_inclusive=False
        )

    def soft_targets(
        self,
        targets: torch.Tensor,
        num_classes: int,
        *,
        objectness: torch.Tensor,
        context: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Soft labels q of Eq. 5 mixed by ``beta`` (uniform 1/K on context samples).

        Args:
            targets: class indices, (M,) int64.
            num_classes: K, >= 2.
            objectness: (M,) float in [0, 1] (already checked).
            context: (M,) bool or None.

        Returns:
            (M, K) tensor in the dtype of ``objectness``; every row sums to 1.
        """
        smoothing = self.beta * (1.0 - objectness)
        q = (smoothing / (num_classes - 1)).unsqueeze(1).repeat(1, num_classes)
        q.scatter_(1, targets.unsqueeze(1), (1.0 - smoothing).unsqueeze(1))
        if context is not None:
            q = torch.where(context.unsqueeze(1), torch.full_like(q, 1.0 / num_classes), q)
        return q

    def forward(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        *,
        objectness: torch.Tensor | None = None,
        context: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute the mean cross-entropy with objectness-adaptive soft labels.

        Args:
            logits: unnormalised scores, (N, K) or (N, K, *) float, K >= 2.
            targets: class indices, (N,) or (N, *) int64; ``ignore_index`` counts nowhere.
            objectness: (N,) float in [0, 1], object area / image area of each sample's crop.
                Required (``None`` raises).
            context: (N,) bool, True for object-free context samples (uniform label), or
                ``None`` for none. Defaults to ``None``.

        Returns:
            Scalar tensor, mean over samples.

        Raises:
            TypeError: if ``logits`` is not floating point, ``targets`` is not int64,
                ``objectness`` is not a floating-point tensor or ``context`` not a bool tensor.
            ValueError: if ``objectness`` is missing, not of shape (N,), or has a value outside
                [0, 1] (or NaN); if ``context`` is not of shape (N,); if K < 2; if the shape of
                ``targets`` does not match ``logits``; if a target is neither in [0, K) nor
                ``ignore_index``.
        """
        num_samples = logits.shape[0] if isinstance(logits, torch.Tensor) and logits.ndim else 0
        flat_logits, flat_targets = reshape_inputs(logits, targets)
        num_classes = flat_logits.shape[1]
        if num_classes < 2:
            raise ValueError(f"`logits` must have K >= 2 classes for 'als', got K={num_classes}")
        objectness = _check_objectness(objectness, num_samples)
        if context is not None:
            context = _check_context(context, num_samples)
        keep = kept_rows(flat_targets, num_classes, self.ignore_index)
        # one row per location, sample-major (reshape_inputs): sample i owns `locations` rows
        locations = flat_logits.shape[0] // num_samples
        objectness = objectness.to(device=flat_logits.device, dtype=flat_logits.dtype)
        if locations > 1:
            objectness = objectness.repeat_interleave(locations)
            context = None if context is None else context.repeat_interleave(locations)
        if context is not None:
            context = context.to(flat_logits.device)
        if keep is not None:
            # drop the ignored locations together with their copies of the per-sample inputs
            flat_logits, flat_targets, objectness = (
                flat_logits[keep],
                flat_targets[keep],
                objectness[keep],
            )
            context = None if context is None else context[keep]
        if flat_logits.shape[0] == 0:
            return zero_loss(flat_logits)
        log_probs = torch.log_softmax(flat_logits, dim=1)
        q = self.soft_targets(flat_targets, num_classes, objectness=objectness, context=context)
        return -(q * log_probs).sum(dim=1).mean()


def _check_objectness(objectness: torch.Tensor | None, num_samples: int) -> torch.Tensor:
    """Validate the per-sample objectness (one host sync for the range check)."""
    if objectness is None:
        raise ValueError(
            "`objectness` is required by 'als': pass loss_fn(logits, targets, objectness=o) with "
            "o of shape (N,), the object area / image area of each crop"
        )
    check_tensor("objectness", objectness)
    if not objectness.is_floating_point():
        raise TypeError(f"`objectness` must be a floating-point tensor, got {objectness.dtype}")
    if tuple(objectness.shape) != (num_samples,):
        raise ValueError(
            f"`objectness` must have shape ({num_samples},) for {num_samples} samples, "
            f"got {tuple(objectness.shape)}"
        )
    inside = (objectness >= 0) & (objectness <= 1)
    if not bool(inside.all()):
        bad = objectness[~inside][0].item()
        raise ValueError(f"`objectness` must be in [0, 1], got a value {bad}")
    return objectness


def _check_context(context: torch.Tensor, num_samples: int) -> torch.Tensor:
    """Validate the per-sample context flags."""
    if not isinstance(context, torch.Tensor) or context.dtype != torch.bool:
        kind = context.dtype if isinstance(context, torch.Tensor) else type(context).__name__
        raise TypeError(f"`context` must be a bool tensor, got {kind}")
    if tuple(context.shape) != (num_samples,):
        raise ValueError(
            f"`context` must have shape ({num_samples},) for {num_samples} samples, "
            f"got {tuple(context.shape)}"
        )
    return context
