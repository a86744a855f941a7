"""Tests of the pairwise losses: CPC (ACLS supp. S1.2) and CRL (ACLS supp. S1.5, Moon et al.)."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from raysearch.config import RunConfig
from raysearch.losses import CorrectnessRankingLoss, PairwiseConstraints, build_loss
from raysearch.training.data import load_dataset
from raysearch.training.data.side import split_side_inputs
from raysearch.training.loop import TrainFeed, train_feed
from raysearch.training.run import fit

LN = math.log


def _eq7(logits, targets, lambda1, lambda2):
    """dL/dz of ACLS supp. Eq. 2-4 (mean over samples), written out from Eq. 5 and 6.

    Eq. 7 with the factor 2 of Eq. 6 kept and the sign of Eq. 5 for the j != y one-vs-one term.
    """
    probs = torch.softmax(logits, dim=1)
    grad = torch.zeros_like(logits)
    num, k = logits.shape
    for i in range(num):
        p, y = probs[i], int(targets[i])
        for j in range(k):
            q = 1.0 if j == y else 0.0
            if j == y:
                one_vs_one = -sum(p[c] / (p[y] + p[c]) for c in range(k) if c != y)
                exclusion = 0.0
            else:
                one_vs_one = p[j] / (p[y] + p[j])
                exclusion = 2 * sum((p[j] - p[c]) / (p[j] + p[c]) for c in range(k) if c != y)
            grad[i, j] = p[j] - q + lambda1 * one_vs_one + lambda2 * exclusion
    return grad / num


# z = (0, ln 2, ln 3): p = (1/6, 2/6, 3/6), target 0
SIMPLE = torch.log(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64))
TARGET0 = torch.tensor([0])


class TestPairwiseConstraints:
    def test_paper_value_by_hand(self):
        # CE = -ln(1/6) = ln 6
        # L_1v1 = -ln(p0/(p0+p1)) - ln(p0/(p0+p2)) = -ln(1/3) - ln(1/4) = ln 12
        # L_BE over the ordered pairs (1, 2), (2, 1): each -ln(2/5) - ln(3/5) = ln(25/6)
        # total = ln 6 + ln 12 + 2 ln(25/6) = ln(72 * 625 / 36) = ln 1250
        loss = build_loss("cpc", variant="paper")(SIMPLE, TARGET0)
        assert loss.item() == pytest.approx(LN(1250.0), abs=1e-12)

    def test_official_value_by_hand(self):
        # released code: L_1v1 = ln 12 / (K - 1) = ln 12 / 2
        # L_BE = sum over ordered (k, l) in {1, 2}^2 (diagonal included) of -0.5 log
        #   sigmoid(z_k - z_l), / ((K - 1)(K - 2)) = 2: off-diagonal -ln(2/5) - ln(3/5) =
        #   ln(25/6), diagonal 2 ln 2: 0.5 * ln(25/6 * 4) / 2 = ln(50/3) / 4
        loss = build_loss("cpc")(SIMPLE, TARGET0)
        expected = LN(6.0) + LN(12.0) / 2 + LN(50.0 / 3.0) / 4
        assert loss.item() == pytest.approx(expected, abs=1e-12)
        terms = build_loss("cpc", lambda1=2.0, lambda2=0.5).terms(SIMPLE, TARGET0)
        assert terms["one_vs_one"].item() == pytest.approx(LN(12.0), abs=1e-12)
        assert terms["exclusion"].item() == pytest.approx(LN(50.0 / 3.0) / 8, abs=1e-12)

    def test_gradient_equals_eq7_by_hand(self):
        # p = (1/6, 1/3, 1/2), y = 0, lambda1 = lambda2 = 1:
        # CE: p - q = (-5/6, 1/3, 1/2)
        # Eq. 5: j = y: -(p1/(p0+p1) + p2/(p0+p2)) = -(2/3 + 3/4) = -17/12; j = 1: 2/3; j = 2: 3/4
        # Eq. 6: j = y: 0; j = 1: 2 (p1 - p2)/(p1 + p2) = -2/5; j = 2: +2/5
        # sum: (-5/6 - 17/12, 1/3 + 2/3 - 2/5, 1/2 + 3/4 + 2/5) = (-9/4, 3/5, 33/20)
        logits = SIMPLE.clone().requires_grad_(True)
        build_loss("cpc", variant="paper")(logits, TARGET0).backward()
        expected = torch.tensor([[-9 / 4, 3 / 5, 33 / 20]], dtype=torch.float64)
        torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-12)

    @pytest.mark.parametrize(("lambda1", "lambda2"), [(1.0, 1.0), (0.5, 0.25), (0.0, 2.0)])
    def test_gradient_matches_eq5_plus_eq6_on_two_samples(self, lambda1, lambda2):
        logits = torch.tensor([[2.0, -1.0, 0.5], [0.3, 1.2, -0.7]], dtype=torch.float64)
        targets = torch.tensor([1, 2])
        logits.requires_grad_(True)
        loss = build_loss("cpc", lambda1=lambda1, lambda2=lambda2, variant="paper")
        loss(logits, targets).backward()
        expected = _eq7(logits.detach(), targets, lambda1, lambda2)
        torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-12)

    def test_official_gradient_is_the_paper_terms_rescaled(self):
        # official = CE + lambda1 / (K - 1) L_1v1 + lambda2 / (4 (K - 1)(K - 2)) L_BE (+ const)
        torch.manual_seed(0)
        logits = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
        targets = torch.tensor([0, 3, 4, 1])
        build_loss("cpc", lambda1=0.7, lambda2=0.3)(logits, targets).backward()
        expected = _eq7(logits.detach(), targets, 0.7 / 4, 0.3 / (4 * 4 * 3))
        torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-12)

    def test_zero_weights_give_cross_entropy_and_two_classes_no_exclusion(self):
        torch.manual_seed(1)
        logits, targets = torch.randn(6, 4, dtype=torch.float64), torch.randint(0, 4, (6,))
        for variant in ("official", "paper"):
            loss = build_loss("cpc", lambda1=0.0, lambda2=0.0, variant=variant)
            torch.testing.assert_close(loss(logits, targets), F.cross_entropy(logits, targets))
        # K = 2: no pair of non-target classes; one-vs-one = CE there: -log sigmoid(z_y - z_k)
        two = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
        terms = build_loss("cpc").terms(two, torch.tensor([0]))
        assert terms["exclusion"].item() == 0.0
        assert terms["one_vs_one"].item() == pytest.approx(LN(1 + math.exp(-2.0)), abs=1e-12)

    def test_terms_sum_to_forward(self):
        loss = build_loss("cpc", lambda1=0.3, lambda2=0.2)
        terms = loss.terms(SIMPLE, TARGET0)
        torch.testing.assert_close(sum(terms.values()), loss(SIMPLE, TARGET0))

    def test_bad_parameters(self):
        with pytest.raises(ValueError, match="`lambda1` must be >= 0, got -1"):
            PairwiseConstraints(lambda1=-1.0)
        with pytest.raises(ValueError, match="lambda2"):
            build_loss("cpc", lambda2=float("nan"))
        with pytest.raises(ValueError, match="variant"):
            build_loss("cpc", variant="eq7")


def _history(loss):
    return loss.correct.tolist(), loss.visits.tolist()


# targets [0, 1, 0]; epoch-1 logits predict (0, 0, 1): only sample 0 is correct
EPOCH1 = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
TARGETS = torch.tensor([0, 1, 0])


class TestCorrectnessRankingLoss:
    def test_history_counts_by_hand(self):
        loss = CorrectnessRankingLoss()
        assert _history(loss) == ([], [])
        # batch 1: samples 2 and 0; predictions (1, 0) vs targets (0, 0): sample 0 correct
        loss(EPOCH1[[2, 0]], TARGETS[[2, 0]], index=torch.tensor([2, 0]))
        assert _history(loss) == ([1, 0, 0], [1, 0, 1])  # grown to index 2
        # batch 2: sample 1 wrong, then sample 3 (a new index) correct
        loss(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([1, 1]),
             index=torch.tensor([1, 3]))
        assert _history(loss) == ([1, 0, 0, 1], [1, 1, 1, 1])
        # epoch 2: all four correct, in one batch
        loss(torch.tensor([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [0.0, 2.0]]),
             torch.tensor([0, 1, 0, 1]), index=torch.tensor([0, 1, 2, 3]))
        assert _history(loss) == ([2, 1, 1, 2], [2, 2, 2, 2])
        # an ignored target counts its visit, not a correct classification
        loss = CorrectnessRankingLoss(ignore_index=-1)
        loss(torch.tensor([[2.0, 0.0], [2.0, 0.0]]), torch.tensor([0, -1]),
             index=torch.tensor([0, 1]))
        assert _history(loss) == ([1, 0], [1, 1])

    def test_regulariser_is_zero_when_histories_are_empty_or_equal(self):
        loss = CorrectnessRankingLoss(rank_weight=5.0)
        logits = torch.tensor([[3.0, 0.0], [0.0, 0.5], [1.0, 2.0]], dtype=torch.float64)
        targets = torch.tensor([0, 1, 1])
        # empty history: every h = 0, every pair has sgn 0 -> CE alone (ACLS Sec. 3.2)
        terms = loss.terms(logits, targets, index=torch.arange(3))
        assert terms["ranking"].item() == 0.0
        torch.testing.assert_close(terms["ce"], F.cross_entropy(logits, targets))
        # all three were correct in epoch 1: h = (1, 1, 1), equal -> 0 again
        assert _history(loss) == ([1, 1, 1], [1, 1, 1])
        assert loss.terms(logits, targets, index=torch.arange(3))["ranking"].item() == 0.0

    def test_loss_value_by_hand(self):
        loss = CorrectnessRankingLoss(rank_weight=2.0)
        loss(EPOCH1, TARGETS, index=torch.arange(3))  # h = (1, 0, 0) after epoch 1
        # epoch 2: h_max = max(1, completed epochs = 1) = 1, min h = 0: h~ = (1, 0, 0)
        # logits give confidences c = (3/4, 1/2, 4/5) (z = (ln 3, 0), (0, 0), (0, ln 4))
        # pairs (n, n + 1 mod 3):
        #   (0, 1): sgn(1 - 0) = +1, margin 1: max(0, -(3/4 - 1/2) + 1) = 3/4
        #   (1, 2): equal histories: 0
        #   (2, 0): sgn(0 - 1) = -1, margin 1: max(0, (4/5 - 3/4) + 1) = 1.05
        # ranking = (0.75 + 0 + 1.05) / 3 = 0.6
        # CE = (-ln(3/4) - ln(1/2) - ln(1/5)) / 3 = ln(40/3) / 3
        logits = torch.log(torch.tensor([[3.0, 1.0], [1.0, 1.0], [1.0, 4.0]], dtype=torch.float64))
        terms = loss.terms(logits, TARGETS, index=torch.arange(3))
        assert terms["ranking"].item() == pytest.approx(2.0 * 0.6, abs=1e-12)
        assert terms["ce"].item() == pytest.approx(LN(40.0 / 3.0) / 3, abs=1e-12)

    def test_gradient_of_an_active_pair_is_eq19(self):
        # h~ = (1, 0): both directed pairs (0, 1) and (1, 0) give c_1 - c_0 + 1 (active), the
        # mean over the 2 pairs is that hinge once, so d/dz^(1) is Eq. 19 for n = 1 (the lower
        # history): lambda p_j (1 - p_j) at j = yhat, -lambda p_yhat p_j elsewhere; sample 0
        # (the m of the pair) gets the opposite
        loss = CorrectnessRankingLoss(rank_weight=0.5)
        loss(torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), torch.tensor([0, 2]),
             index=torch.arange(2))
        logits = torch.tensor([[0.2, 1.5, -0.3], [0.9, 0.1, 0.4]], dtype=torch.float64,
                              requires_grad=True)
        targets = torch.tensor([1, 2])
        loss(logits, targets, index=torch.arange(2)).backward()
        probs = torch.softmax(logits.detach(), dim=1)
        expected = (probs - F.one_hot(targets, 3)) / 2  # CE, mean over 2 samples
        for n, sign in ((1, 1.0), (0, -1.0)):
            p = probs[n]
            yhat = int(p.argmax())
            d_conf = -p[yhat] * p  # j != yhat: -p_yhat p_j
            d_conf[yhat] = p[yhat] * (1 - p[yhat])
            expected[n] += sign * 0.5 * d_conf
        torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-12)

    def test_index_is_required_and_checked(self):
        logits, targets = torch.zeros(2, 3), torch.tensor([0, 1])
        with pytest.raises(ValueError, match="needs `index`"):
            build_loss("crl")(logits, targets)
        with pytest.raises(TypeError, match="`index` must be an int64 tensor, got torch.int32"):
            build_loss("crl")(logits, targets, index=torch.arange(2, dtype=torch.int32))
        with pytest.raises(ValueError, match=r"`index` must have shape \(2,\)"):
            build_loss("crl")(logits, targets, index=torch.arange(3))
        with pytest.raises(ValueError, match="positions >= 0, got -1"):
            build_loss("crl")(logits, targets, index=torch.tensor([0, -1]))
        with pytest.raises(ValueError, match="`rank_weight` must be >= 0"):
            build_loss("crl", rank_weight=-0.1)

    def test_loss_declares_the_index_side_input(self):
        digits = load_dataset("digits", seed=0)
        assert CorrectnessRankingLoss.side_inputs == ("index",)
        side = split_side_inputs(digits, ("index",))
        assert torch.equal(side["index"], torch.arange(len(digits.train)))
        assert split_side_inputs(digits, ("objectness", "index")) is None
        assert split_side_inputs(digits, ()) is None
        feed = train_feed(digits, build_loss("crl"), seed=0, device=torch.device("cpu"))
        assert isinstance(feed, TrainFeed)
        assert feed.side_inputs == ("index",)
        assert train_feed(digits, build_loss("ce"), seed=0,
                          device=torch.device("cpu")).side_inputs == ()


class _MapStyle(Dataset):
    """A user's plain map-style dataset (batched through a DataLoader by the loop)."""

    def __init__(self, tensors):
        self.x, self.y = tensors.tensors

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


@pytest.mark.parametrize("map_style", [False, True], ids=["tensors", "map-style"])
def test_fit_feeds_each_samples_index_to_the_history(map_style):
    digits = load_dataset("digits", seed=0)
    if map_style:
        digits = dataclasses.replace(digits, train=_MapStyle(digits.train))
    loss = CorrectnessRankingLoss()
    result = fit(RunConfig(loss={"name": "crl"}, epochs=1, batch_size=128), data=digits, loss=loss)
    n = len(digits.train)
    # one epoch: every training sample visited exactly once under its own position, and the
    # history holds exactly the correct predictions the loop counted for train_accuracy
    assert loss.visits.tolist() == [1] * n
    assert int(loss.correct.sum()) == round(result.metrics["train_accuracy"] * n)
    assert 0 < int(loss.correct.sum()) < n


def test_crl_refuses_batch_mixing():
    digits = load_dataset("digits", seed=0)
    with pytest.raises(ValueError, match="cannot be combined with a loss taking index"):
        fit(RunConfig(loss={"name": "crl"}, epochs=1, mixup_alpha=0.2), data=digits)
