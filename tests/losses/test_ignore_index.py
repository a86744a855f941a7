"""Tests of ``ignore_index`` in every train-time loss (semantic segmentation: VOC's 255).

A location whose target equals ``ignore_index`` counts nowhere: the loss on (N, K, H, W) logits
equals the loss on the (M, K) rows of the other locations, batch statistics included.
"""

import inspect
import math
import re

import pytest
import torch
import torch.nn.functional as F

from raysearch.losses import _LOSSES, available_losses, build_loss, loss_parameters
from raysearch.losses._common import flatten_inputs
from raysearch.losses.classification import CrossEntropy, FocalLoss
from raysearch.losses.objectness import ObjectnessLabelSmoothing
from raysearch.losses.secondary import BrierLoss, SecondaryObjective

N, K, H, W = 2, 4, 3, 5
VOC = 255  # the boundary label of PASCAL VOC segmentation
# losses with a terms() method and the names of their regulariser terms
TERMS = {"mbls": "reg", "acls": "reg", "ecp": "entropy"}
SECONDARY = ("sbece", "savuc", "avuc", "avuc_gs", "mmce", "mdca")
# every loss with its defaults, plus parameters that make the regulariser active on logits of
# scale ~4 (the margin penalties need distances above the margin)
CASES = [(name, {}) for name in available_losses()] + [
    ("mbls", {"margin": 2.0}),
    ("mbls", {"margin": 2.0, "variant": "paper"}),
    ("acls", {"margin": 2.0}),
    ("acls", {"margin": 2.0, "variant": "paper"}),
    ("ecp", {"beta": 0.5, "variant": "paper"}),
    ("sbece", {"temperature": 0.05, "binning": "bin"}),
    ("sbece", {"temperature": 0.05, "p": 1, "variant": "paper"}),
    ("savuc", {"kappa": 0.3, "variant": "paper"}),
    ("avuc", {"kappa": 1.0}),
    ("mmce", {"weighted": True}),
    ("mmce", {"variant": "paper"}),
    ("mdca", {"primary": "focal"}),
    ("mdca", {"primary": "mse"}),
    ("mdca", {"primary": None}),
    ("als", {"beta": 0.5, "context_fraction": 0.15}),
]
IDS = [f"{name}-{params}" for name, params in CASES]


def _dense_inputs(seed=0, ignored=0.3, ignore_index=VOC):
    """(N, K, H, W) float64 logits and (N, H, W) targets with about `ignored` of them ignored."""
    torch.manual_seed(seed)
    logits = torch.randn(N, K, H, W, dtype=torch.float64) * 4.0
    targets = torch.randint(0, K, (N, H, W))
    drop = torch.rand(N, H, W) < ignored
    targets[drop] = ignore_index
    assert 0 < int(drop.sum()) < drop.numel()
    return logits.requires_grad_(True), targets


def _rows(logits, targets, ignore_index=VOC):
    """The (M, K) rows and (M,) targets of the locations that count, and their mask."""
    flat_logits = logits.movedim(1, -1).reshape(-1, logits.shape[1])
    flat_targets = targets.reshape(-1)
    mask = flat_targets != ignore_index
    return flat_logits[mask], flat_targets[mask], mask


def _objectness(num_samples, seed=1):
    torch.manual_seed(seed)
    return torch.rand(num_samples, dtype=torch.float64)


def _close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


#: `crl` ranks whole samples by their training-split index: (N, K) logits only
DENSE_REFUSED = "ranks whole samples"


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_dense_with_ignored_equals_valid_rows(name, params):
    logits, targets = _dense_inputs()
    loss_fn = build_loss(name, ignore_index=VOC, **params)
    reference = build_loss(name, **params)
    rows, row_targets, mask = _rows(logits, targets)
    if name == "crl":
        with pytest.raises(ValueError, match=DENSE_REFUSED):
            loss_fn(logits, targets, index=torch.arange(N))
        return
    if name == "als":
        # per-sample objectness and context flags: every location of sample i shares them
        objectness = _objectness(N)
        context = torch.tensor([True, False])
        loss = loss_fn(logits, targets, objectness=objectness, context=context)
        expected = reference(
            rows,
            row_targets,
            objectness=objectness.repeat_interleave(H * W)[mask],
            context=context.repeat_interleave(H * W)[mask],
        )
    else:
        loss = loss_fn(logits, targets)
        expected = reference(rows, row_targets)
    _close(loss, expected)
    # gradient: that of the valid rows, 0 at every ignored location
    (grad,) = torch.autograd.grad(loss, logits)
    (row_grad,) = torch.autograd.grad(expected, logits)
    _close(grad, row_grad)
    ignored = (targets == VOC).unsqueeze(1).expand_as(grad)
    assert (grad[ignored] == 0).all()
    assert grad[~ignored].abs().sum() > 0


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
def test_two_dimensional_rows_with_ignored(name, params):
    torch.manual_seed(3)
    logits = torch.randn(12, K, dtype=torch.float64) * 4.0
    targets = torch.randint(0, K, (12,))
    targets[[1, 4, 5, 10]] = VOC
    keep = targets != VOC
    side = {}
    if name == "als":
        objectness = _objectness(12)
        side = {"objectness": objectness}
        expected_side = {"objectness": objectness[keep]}
    elif name == "crl":  # (both losses start with empty histories)
        side = {"index": torch.arange(12)}
        expected_side = {"index": torch.arange(12)[keep]}
    else:
        expected_side = {}
    loss = build_loss(name, ignore_index=VOC, **params)(logits, targets, **side)
    expected = build_loss(name, **params)(logits[keep], targets[keep], **expected_side)
    _close(loss, expected)


@pytest.mark.parametrize("name", sorted(TERMS) + list(SECONDARY))
def test_terms_and_regulariser_skip_ignored(name):
    # the regulariser alone (not only the total) ignores the same locations
    logits, targets = _dense_inputs(seed=4)
    params = {"margin": 2.0} if name in ("mbls", "acls") else {}
    loss_fn = build_loss(name, ignore_index=VOC, **params)
    rows, row_targets, _ = _rows(logits, targets)
    dense, flat = loss_fn.terms(logits, targets), loss_fn.terms(rows, row_targets)
    _close(dense, flat)
    if name in TERMS:
        assert dense[TERMS[name]].item() > 0
    else:
        assert dense["secondary"].item() > 0
        _close(loss_fn.secondary(logits, targets), loss_fn.secondary(rows, row_targets))
        _close(
            loss_fn.primary_loss(logits, targets),
            F.cross_entropy(logits, targets, ignore_index=VOC),
        )


def test_flatten_inputs_drops_ignored_rows():
    logits, targets = _dense_inputs(seed=5)
    rows, row_targets, mask = _rows(logits, targets)
    flat_logits, flat_targets = flatten_inputs(logits, targets, ignore_index=VOC)
    assert flat_logits.shape == (int(mask.sum()), K)
    torch.testing.assert_close(flat_logits, rows, rtol=0, atol=0)
    torch.testing.assert_close(flat_targets, row_targets, rtol=0, atol=0)
    # 2-D inputs too, and nothing dropped when no target is ignored
    two_d, kept = flatten_inputs(rows.detach()[:3], torch.tensor([0, VOC, 2]), ignore_index=VOC)
    assert two_d.shape == (2, K)
    assert kept.tolist() == [0, 2]
    same, _ = flatten_inputs(rows, row_targets, ignore_index=VOC)
    assert same is rows


@pytest.mark.parametrize(("name", "params"), CASES, ids=IDS)
@pytest.mark.parametrize("shape", [(N, K, H, W), (6, K)], ids=["dense", "rows"])
def test_all_ignored_gives_zero_with_zero_gradient(name, params, shape):
    torch.manual_seed(6)
    logits = (torch.randn(*shape, dtype=torch.float64) * 4.0).requires_grad_(True)
    targets = torch.full(shape[:1] + shape[2:], VOC)
    side = {"objectness": _objectness(shape[0])} if name == "als" else {}
    if name == "crl":
        side = {"index": torch.arange(shape[0])}
        if len(shape) > 2:
            with pytest.raises(ValueError, match=DENSE_REFUSED):
                build_loss(name, ignore_index=VOC, **params)(logits, targets, **side)
            return
    loss = build_loss(name, ignore_index=VOC, **params)(logits, targets, **side)
    assert loss.ndim == 0
    assert loss.item() == 0.0
    assert loss.requires_grad
    loss.backward()
    assert logits.grad is not None
    assert not torch.isnan(logits.grad).any()
    assert (logits.grad == 0).all()


@pytest.mark.parametrize("name", sorted(TERMS) + list(SECONDARY))
def test_all_ignored_terms_are_zero(name):
    logits = torch.randn(N, K, H, W, dtype=torch.float64, requires_grad=True)
    targets = torch.full((N, H, W), VOC)
    loss_fn = build_loss(name, ignore_index=VOC)
    for value in loss_fn.terms(logits, targets).values():
        assert value.item() == 0.0
    if name in SECONDARY:
        secondary = loss_fn.secondary(logits, targets)
        assert secondary.item() == 0.0
        secondary.backward()
        assert (logits.grad == 0).all()


def test_cross_entropy_hand_value_with_one_ignored_row():
    # row 0: logits (0, ln 3), target 1: p = 3 / (1 + 3) = 3/4, CE = -ln(3/4) = ln(4/3)
    # row 1: logits (ln 2, 0), target 0: p = 2 / (2 + 1) = 2/3, CE = -ln(2/3) = ln(3/2)
    # row 2: logits (5, -5), target 255: ignored (its CE, ~10, would dominate the mean)
    # mean over the 2 counted rows: (ln(4/3) + ln(3/2)) / 2 = ln(4/3 * 3/2) / 2 = ln(2) / 2
    logits = torch.tensor(
        [[0.0, math.log(3.0)], [math.log(2.0), 0.0], [5.0, -5.0]], dtype=torch.float64
    )
    targets = torch.tensor([1, 0, VOC])
    loss = build_loss("ce", ignore_index=VOC)(logits, targets)
    assert loss.item() == pytest.approx(math.log(2.0) / 2.0, abs=1e-12)
    _close(loss, F.cross_entropy(logits, targets, ignore_index=VOC))


def test_matches_torch_cross_entropy_and_label_smoothing():
    logits, targets = _dense_inputs(seed=7)
    _close(
        build_loss("ce", ignore_index=VOC)(logits, targets),
        F.cross_entropy(logits, targets, ignore_index=VOC),
    )
    _close(
        build_loss("ls", ignore_index=VOC, epsilon=0.1)(logits, targets),
        F.cross_entropy(logits, targets, ignore_index=VOC, label_smoothing=0.1),
    )


@pytest.mark.parametrize("name", available_losses())
def test_default_ignores_minus_100_like_torch(name):
    logits, targets = _dense_inputs(seed=8, ignore_index=-100)
    assert build_loss(name).ignore_index == -100
    rows, row_targets, mask = _rows(logits, targets, ignore_index=-100)
    if name == "crl":
        with pytest.raises(ValueError, match=DENSE_REFUSED):
            build_loss(name)(logits, targets, index=torch.arange(N))
        return
    if name == "als":
        objectness = _objectness(N)
        loss = build_loss(name)(logits, targets, objectness=objectness)
        expected = build_loss(name)(
            rows, row_targets, objectness=objectness.repeat_interleave(H * W)[mask]
        )
    else:
        loss = build_loss(name)(logits, targets)
        expected = build_loss(name)(rows, row_targets)
    _close(loss, expected)
    if name == "ce":
        _close(loss, F.cross_entropy(logits, targets))  # torch's default ignore_index is -100


@pytest.mark.parametrize("name", available_losses())
@pytest.mark.parametrize("bad", [K, 7, -1, -100])
def test_targets_outside_classes_still_rejected(name, bad):
    # with ignore_index=255, a target neither in [0, K) nor 255 is an error (-100 included)
    logits = torch.randn(3, K, 2, dtype=torch.float64)
    targets = torch.tensor([[0, 1], [VOC, bad], [2, 3]])
    side = {"objectness": _objectness(3)} if name == "als" else {}
    message = f"`targets` must be class indices in [0, {K}) or `ignore_index`={VOC}, got {bad}"
    with pytest.raises(ValueError, match=re.escape(message)):
        build_loss(name, ignore_index=VOC)(logits, targets, **side)


@pytest.mark.parametrize("name", available_losses())
def test_ignore_index_is_not_a_loss_parameter(name):
    assert "ignore_index" not in loss_parameters(name)
    loss_fn = build_loss(name, ignore_index=VOC)
    assert loss_fn.ignore_index == VOC
    assert f"ignore_index={VOC}" in repr(loss_fn)
    # the class takes it keyword-only, with torch's default, and builds directly
    parameter = inspect.signature(_LOSSES[name].__init__).parameters["ignore_index"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    assert parameter.default == -100
    assert _LOSSES[name]().ignore_index == -100
    assert _LOSSES[name](ignore_index=VOC).ignore_index == VOC


@pytest.mark.parametrize("primary", ["ce", "focal", "mse"])
def test_secondary_objective_passes_ignore_index_to_its_primary(primary):
    loss_fn = build_loss("mdca", primary=primary, ignore_index=VOC)
    assert isinstance(loss_fn, SecondaryObjective)
    assert isinstance(loss_fn.primary_loss, (CrossEntropy, FocalLoss, BrierLoss))
    assert loss_fn.primary_loss.ignore_index == VOC


def test_ignore_index_inside_the_classes_drops_that_class():
    # ignore_index=0: class-0 locations count nowhere, as in torch
    logits, _ = _dense_inputs(seed=9)
    targets = torch.randint(0, K, (N, H, W), generator=torch.Generator().manual_seed(9))
    _close(
        build_loss("ce", ignore_index=0)(logits, targets),
        F.cross_entropy(logits, targets, ignore_index=0),
    )


@pytest.mark.parametrize("bad", [255.0, True, "255", None])
def test_ignore_index_must_be_an_int(bad):
    with pytest.raises(TypeError, match="`ignore_index` must be an int"):
        build_loss("ce", ignore_index=bad)
    with pytest.raises(TypeError, match="`ignore_index` must be an int"):
        ObjectnessLabelSmoothing(ignore_index=bad)


def test_ignored_locations_drop_their_objectness_with_them():
    # sample 0 (objectness 0.2) is entirely ignored: the loss is that of sample 1 alone, so a
    # wrong pairing of rows and objectness after dropping would change the value
    logits, targets = _dense_inputs(seed=10)
    targets[0] = VOC
    targets[1, 0, 0] = VOC
    objectness = torch.tensor([0.2, 0.7], dtype=torch.float64)
    loss = build_loss("als", ignore_index=VOC)(logits, targets, objectness=objectness)
    rows, row_targets, _ = _rows(logits[1:], targets[1:])
    expected = build_loss("als")(
        rows, row_targets, objectness=torch.full((rows.shape[0],), 0.7, dtype=torch.float64)
    )
    _close(loss, expected)


def test_checked_targets_skip_the_check_and_keep_every_row():
    from raysearch.losses._common import checked_targets, kept_rows

    logits = torch.randn(4, K, dtype=torch.float64)
    good, bad = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 1, 2, K])
    expected = build_loss("ce")(logits, good)
    with checked_targets():
        assert kept_rows(bad, K, VOC) is None  # trusted: no check, every row kept
        assert kept_rows(torch.tensor([0, VOC]), K, VOC) is None
        _close(build_loss("ce")(logits, good), expected)
        with checked_targets(False):  # a nested unchecked block keeps the outer trust
            assert kept_rows(bad, K, VOC) is None
    with checked_targets(False), pytest.raises(ValueError, match="class indices"):
        kept_rows(bad, K, VOC)
    with pytest.raises(ValueError, match="class indices"):  # the check is back after the block
        build_loss("ce")(logits, bad)
