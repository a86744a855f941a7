"""Pairwise calibration losses: CPC (pairs of classes) and CRL (pairs of samples).

Both add a regulariser on pairs to the cross-entropy and return one scalar, the total objective
``CE + reg``; :meth:`terms` returns the parts for logging. Notation: ``z`` are the K logits of a
sample, ``p = softmax(z)``, ``y`` its target class, ``yhat = argmax_k z_k`` its prediction, N the
number of samples whose target is not ``ignore_index`` (the others count nowhere; a batch with
none gives 0).

Variants: where the equation a paper writes and the released code differ, ``variant="official"``
(the DEFAULT) is the released code, whose scale the published hyperparameters belong to, and
``variant="paper"`` is the equation as written.
"""

import torch
import torch.nn.functional as F

from raysearch.losses._common import (
    DEFAULT_IGNORE_INDEX,
    FlatLoss,
    TermsLoss,
    kept_rows,
    reshape_inputs,
    target_log_probs,
    validate_choice,
    validate_number,
    zero_loss,
)

#: Variants of :class:`PairwiseConstraints`: the released code (``"official"``, the default) or
#: ACLS supp. Eq. 2-4 as written (``"paper"``).
CPC_VARIANTS = ("official", "paper")


class PairwiseConstraints(TermsLoss):
    """Calibration by pairwise constraints, CPC (registry name ``cpc``).

    Cheng and Vasconcelos split the K-way softmax into binary problems on pairs of classes
    (ACLS supplementary S1.2, Eq. 2-4): a one-vs-one term that separates the target from every
    other class and a binary-exclusion term that asks every pair of non-target classes for equal
    binary probabilities. With ``p_a / (p_a + p_b) = sigmoid(z_a - z_b)``, ``variant="paper"``
    is Eq. 2-4 as written, per sample and averaged over the N samples,

        L = CE + lambda1 * L_1v1 + lambda2 * L_BE,
        L_1v1 = -sum_{k != y} log sigmoid(z_y - z_k)                               (Eq. 3)
        L_BE = -sum_{k != l; k, l != y} [log sigmoid(z_k - z_l) + log sigmoid(z_l - z_k)],  (Eq. 4)

    over the (K - 1)(K - 2) ordered pairs of distinct non-target classes (a pair k = l adds
    the constant 2 log 2 and no gradient, so it is left out). Its gradient is

        dL/dz_j = p_j - q_j + lambda1 * (-sum_{k != y} p_k / (p_y + p_k))    (j = y)
        dL/dz_j = p_j - q_j + lambda1 * p_j / (p_y + p_j)
                  + 2 * lambda2 * sum_{k != y} (p_j - p_k) / (p_j + p_k)      (j != y),

    the sum of Eq. 5 and 6. Eq. 7 prints the same terms with the constant 2 dropped "for
    brevity" and, for j != y, the one-vs-one term with the opposite sign of its own Eq. 5
    (``p_j - (q_j + lambda1 p_j / (p_y + p_j) ...)``); the gradient above is that of Eq. 2-4
    (checked with autograd in the tests).

    ``variant="official"`` (default) is the released code that the MbLS/ACLS authors ran for
    their CPC baselines (by-liu/CALS ``calibrate/losses/cpc_loss.py``, ``CPCLoss``, also copied
    into later calibration code bases): both terms are MEANS, the one-vs-one term over the
    K - 1 other classes and the exclusion term over the ordered pairs of non-target classes with
    weight 1/2 and the diagonal k = l included,

        L_1v1 = -(1 / (K - 1)) sum_{k != y} log sigmoid(z_y - z_k)
        L_BE = -(1 / ((K - 1)(K - 2))) sum_{k, l != y} (1/2) log sigmoid(z_k - z_l),

    i.e. Eq. 3 divided by K - 1 and Eq. 4 divided by 4 (K - 1)(K - 2), plus the constant
    ``log 2 / (2 (K - 2))`` of the diagonal. The code's ``+ 1e-10`` inside the sigmoid is left
    out (below float32 resolution). The default weights ``lambda1 = lambda2 = 1`` are that
    code's defaults; ACLS (Sec. 4.1) ran CPC "with default hyperparameters, provided by the
    authors" without stating them. With K = 2 there is no pair of non-target classes and
    ``L_BE = 0`` (the released code divides by K - 2 = 0 there).

    References:
        Cheng and Vasconcelos, "Calibrating Deep Neural Networks by Pairwise Constraints", CVPR
        2022. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for Network
        Calibration", ICCV 2023, arXiv:2308.11911, supplementary S1.2.

    Args:
        lambda1 (float, optional): weight of the one-vs-one term L_1v1, >= 0. Defaults to
            ``1.0``.
        lambda2 (float, optional): weight of the binary-exclusion term L_BE, >= 0. Defaults to
            ``1.0``.
        variant (str, optional): ``"official"`` (the released code: both terms means) or
            ``"paper"`` (Eq. 2-4: sums over the class pairs). Defaults to ``"official"``.
        ignore_index (int, optional): keyword-only; as
            :class:`~raysearch.losses._common.FlatLoss`, which gives the shapes.

    Returns:
        Scalar tensor: CE + lambda1 * L_1v1 + lambda2 * L_BE, each a mean over the N samples.

    Raises:
        TypeError: if ``lambda1`` or ``lambda2`` is not a real number, or ``variant`` not a str.
        ValueError: if ``lambda1`` < 0 or ``lambda2`` < 0 (or NaN), or ``variant`` is not
            ``"official"`` or ``"paper"``.
    """

    repr_names = ("lambda1", "lambda2", "variant", "ignore_index")
    term_names = ("ce", "one_vs_one", "exclusion")

    def __init__(
        self,
        lambda1: float = 1.0,
        lambda2: float = 1.0,
        variant: str = "official",
        *,
        ignore_index: int = DEFAULT_IGNORE_INDEX,
    ) -> None:
        super().__init__(ignore_index=ignore_index)
        self.lambda1 = validate_number("lambda1", lambda1, minimum=0.0)
        self.lambda2 = validate_number("lambda2", lambda2, minimum=0.0)
        self.variant = validate_choice("variant", variant, CPC_VARIANTS)

    def _rows_terms(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{"ce": CE, "one_vs_one": lambda1 * L_1v1, "exclusion": lambda2 * L_BE}``, M >= 1."""
        num_samples, num_classes = logits.shape
        ce = -target_log_probs(logits, targets).mean()
        other = ~F.one_hot(targets, num_classes).bool()
        # rest: the K - 1 non-target logits of each sample, (N, K - 1)
        rest = logits[other].reshape(num_samples, num_classes - 1)
        target_logit = logits.gather(1, targets.unsqueeze(1))
        one_vs_one = -F.logsigmoid(target_logit - rest).sum(dim=1)
        # diff[i, k, l] = z_k - z_l over the non-target classes of sample i
        diff = rest.unsqueeze(2) - rest.unsqueeze(1)
        if self.variant == "official":
            one_vs_one = one_vs_one / (num_classes - 1)
            if num_classes > 2:
                pairs = (num_classes - 1) * (num_classes - 2)
                exclusion = -0.5 * F.logsigmoid(diff).sum(dim=(1, 2)) / pairs
            else:
                exclusion = logits.new_zeros(num_samples)
        else:
            off_diagonal = ~torch.eye(num_classes - 1, dtype=torch.bool, device=logits.device)
            both = F.logsigmoid(diff) + F.logsigmoid(-diff)
            exclusion = -(both * off_diagonal).sum(dim=(1, 2))
        return {
            "ce": ce,
            "one_vs_one": self.lambda1 * one_vs_one.mean(),
            "exclusion": self.lambda2 * exclusion.mean(),
        }


class CorrectnessRankingLoss(FlatLoss):
    """Correctness ranking loss, CRL (registry name ``crl``).

    Moon et al. keep, for every training sample n, its correctness history h_n: how many times
    it was classified correctly so far in training. In each mini-batch they rank the confidence
    ``c_n = max_k p_{n, k}`` of pairs of samples (n, m) by their histories with a margin ranking
    loss (ACLS supplementary S1.5, Eq. 18; the gradient of an active pair is Eq. 19):

        L = CE + lambda * (1 / N) sum_n max(0, -sgn(h~_n - h~_m) (c_n - c_m) + |h~_n - h~_m|),

    where m is the next sample of the batch (cyclically: ``torch.roll(-1)``), a pair with equal
    histories adds 0, and ``h~ = (h - min h) / (h_max - min h)`` is the history normalised to
    [0, 1]: min over all training samples, ``h_max = max(1, number of completed epochs)``. This
    is the authors' released code (daintlab/confidence-aware-learning, ``crl_utils.History`` and
    ``train.py`` with ``--rank_target softmax``, ``nn.MarginRankingLoss(margin=0.0)`` on
    ``c_m + margin / target``, default ``--rank_weight 1.0``), which is the CRL paper's Eq. 2
    with g the sign of the history difference. ACLS Eq. 18 writes the same hinge without the
    margin |h~_n - h~_m| (a constant: the gradient, Eq. 19, is the same wherever the pair is
    active) and as a sum over pairs.

    History: after the ranking term of a batch is computed, each of its samples counts one visit
    and, if ``argmax z = y``, one correct classification (``index_add`` into buffers sized
    lazily to the largest index seen). The number of completed epochs is the smallest visit
    count (every sample is seen once per epoch), so no epoch hook is needed. At the start all
    histories are equal (0) and the regulariser is 0: training begins as plain CE (ACLS Sec.
    3.2). The histories belong to this module and are not part of a training checkpoint: a
    resumed run starts them afresh. Under DDP each rank keeps the history of the samples of its
    own shares (like a per-GPU batch statistic), so it matches one worker only approximately.

    A location whose target is ``ignore_index`` counts nowhere: no CE, no pair, no correct
    classification (it still counts its visit, which only counts epochs).

    The training loop passes ``index`` (the position of each sample in the training split,
    :mod:`raysearch.training.data.side`) because the class attribute ``side_inputs`` names it.

    References:
        Moon, Kim, Shin and Hwang, "Confidence-Aware Learning for Deep Neural Networks", ICML
        2020, arXiv:2007.01458. Park et al., "ACLS: Adaptive and Conditional Label Smoothing for
        Network Calibration", ICCV 2023, arXiv:2308.11911, supplementary S1.5.

    Args:
        rank_weight (float, optional): weight lambda of the ranking term, >= 0 (the released
            ``--rank_weight``). Defaults to ``1.0`` (the released default).
        ignore_index (int, optional): keyword-only; target value of the samples that count
            nowhere. Defaults to ``-100`` (as ``torch.nn.CrossEntropyLoss``).

    Shape:
        logits: (N, K) float (one confidence per sample: dense (N, K, *) logits are refused);
        targets: (N,) int64 with values in [0, K) or ``ignore_index``; index: (N,) int64 >= 0,
        each sample's position in the training split.

    Returns:
        Scalar tensor: CE (mean over the N samples) + lambda * ranking term (mean over the N
        pairs).

    Raises:
        TypeError: if ``rank_weight`` is not a real number.
        ValueError: if ``rank_weight`` < 0 (or NaN).
    """

    repr_names = ("rank_weight", "ignore_index")

    #: Read by the training loop: this loss takes ``index=`` per sample.
    side_inputs = ("index",)

    def __init__(
        self, rank_weight: float = 1.0, *, ignore_index: int = DEFAULT_IGNORE_INDEX
    ) -> None:
        super().__init__(ignore_index=ignore_index)
        self.rank_weight = validate_number("rank_weight", rank_weight, minimum=0.0)
        self.register_buffer("correct", torch.zeros(0, dtype=torch.int64))
        self.register_buffer("visits", torch.zeros(0, dtype=torch.int64))

    def normalized_history(self, index: torch.Tensor) -> torch.Tensor:
        """The normalised correctness history h~ of samples (released ``correctness_normalize``).

        Args:
            index: (M,) int64 positions in the training split.

        Returns:
            (M,) float32 ``(h - min h) / (h_max - min h)``, min over every sample stored,
            ``h_max = max(1, completed epochs)``; all 0 when ``h_max == min h`` (every history
            equal) or none is stored yet.
        """
        if self.correct.numel() == 0:
            return torch.zeros(len(index), device=index.device)
        stored = index < self.correct.numel()
        history = torch.where(stored, self.correct[index.clamp(max=self.correct.numel() - 1)], 0)
        low = self.correct.min()
        high = self.visits.min().clamp(min=1)
        span = (high - low).float()
        if span.item() <= 0:  # equal histories: no ranking
            return torch.zeros(len(index), device=index.device)
        return (history - low).float() / span

    def update_history(self, index: torch.Tensor, correct: torch.Tensor,
                       visited: torch.Tensor | None = None) -> None:
        """Count one visit for `visited` and one correct classification where `correct`.

        Args:
            index: (M,) int64 positions of the counted samples.
            correct: (M,) bool, ``argmax z == y`` for each of them.
            visited: (V,) int64 positions visited (defaults to `index`); every visited sample
                counts one visit whether or not it is counted.
        """
        visited = index if visited is None else visited
        size = int(visited.max().item()) + 1 if visited.numel() else 0
        if size > self.correct.numel():  # grow lazily to the largest index seen
            grow = size - self.correct.numel()
            self.correct = torch.cat([self.correct, self.correct.new_zeros(grow)])
            self.visits = torch.cat([self.visits, self.visits.new_zeros(grow)])
        self.visits.index_add_(0, visited, torch.ones_like(visited))
        self.correct.index_add_(0, index, correct.to(torch.int64))

    def terms(
        self, logits: torch.Tensor, targets: torch.Tensor, *, index: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Compute the parts of the objective, then update the histories of the batch.

        Args:
            logits: unnormalised scores, (N, K) float.
            targets: class indices, (N,) int64; ``ignore_index`` counts nowhere.
            index: (N,) int64 positions in the training split. Required.

        Returns:
            ``{"ce": mean cross-entropy, "ranking": lambda * ranking term}``, scalar tensors
            (attached to the graph) whose sum is :meth:`forward`.

        Raises:
            TypeError: if ``logits`` is not floating point, ``targets`` or ``index`` not int64.
            ValueError: if the logits are dense (N, K, *); if the shape of ``targets`` does not
                match ``logits``; if a target is neither in [0, K) nor ``ignore_index``; if
                ``index`` is missing, not of shape (N,), or negative.
        """
        dense = isinstance(logits, torch.Tensor) and logits.ndim > 2
        logits, targets = reshape_inputs(logits, targets)
        keep = kept_rows(targets, logits.shape[1], self.ignore_index)
        if dense:
            raise ValueError("'crl' ranks whole samples: `logits` must have shape (N, K), got "
                             "dense logits (N, K, *)")
        index = self._check_index(index, len(targets))
        visited = index.to(logits.device)
        if self.correct.device != visited.device:  # the histories live with the logits
            self.correct, self.visits = self.correct.to(visited.device), self.visits.to(
                visited.device)
        if keep is not None:
            logits, targets, index = logits[keep], targets[keep], visited[keep]
        else:
            index = visited
        if logits.shape[0] == 0:
            self.update_history(index, targets == 0, visited)
            zero = zero_loss(logits)
            return {"ce": zero, "ranking": zero}
        ce = -target_log_probs(logits, targets).mean()
        confidence = torch.softmax(logits, dim=1).max(dim=1).values
        history = self.normalized_history(index)
        partner = torch.roll(history, -1)
        sign = torch.sign(history - partner)
        margin = (history - partner).abs()
        # a pair with equal histories has sign 0 and margin 0: hinge 0
        ranking = F.relu(-sign * (confidence - torch.roll(confidence, -1)) + margin).mean()
        with torch.no_grad():
            self.update_history(index, logits.argmax(dim=1) == targets, visited)
        return {"ce": ce, "ranking": self.rank_weight * ranking}

    def forward(
        self, logits: torch.Tensor, targets: torch.Tensor, *, index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Compute CE + lambda * ranking term, then update the histories of the batch.

        Args:
            logits: unnormalised scores, (N, K) float.
            targets: class indices, (N,) int64; ``ignore_index`` counts nowhere.
            index: (N,) int64 positions of the samples in the training split. Required.

        Returns:
            Scalar tensor, mean over samples.

        Raises:
            TypeError: if ``logits`` is not floating point, ``targets`` or ``index`` not int64.
            ValueError: as :meth:`terms`.
        """
        return sum(self.terms(logits, targets, index=index).values())

    def _check_index(self, index: torch.Tensor | None, num_rows: int) -> torch.Tensor:
        """`index` checked: an int64 (N,) tensor of positions >= 0."""
        if index is None:
            raise ValueError("'crl' needs `index` (each sample's position in the training "
                             "split) as loss_fn(logits, targets, index=index)")
        if not isinstance(index, torch.Tensor) or index.dtype != torch.int64:
            kind = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
            raise TypeError(f"`index` must be an int64 tensor, got {kind}")
        if tuple(index.shape) != (num_rows,):
            raise ValueError(f"`index` must have shape ({num_rows},), one position per sample, "
                             f"got {tuple(index.shape)}")
        lowest = int(index.min().item())
        if lowest < 0:
            raise ValueError(f"`index` must hold positions >= 0, got {lowest}")
        return index
