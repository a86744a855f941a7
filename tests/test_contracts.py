"""The contract checks of a user's loss, metric, calibrator and data (raysearch.training.contracts).

Unit tests of the check functions on hand-made inputs: each refusal is one ValueError line
naming the object and what is wrong; the built-in losses and calibrators pass (no false
alarm). The same refusals through the real CLI are in tests/test_bad_inputs.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, Subset, TensorDataset

import raysearch
from raysearch.calibration import CALIBRATOR_REGISTRY
from raysearch.losses import LOSS_REGISTRY, build_loss
from raysearch.metrics import metric
from raysearch.registry import BUILT_IN
from raysearch.training.contracts import (
    check_calibrator,
    check_loss,
    check_metric,
    loss_check_inputs,
)
from raysearch.training.data import DatasetSplits, ImageTensorDataset
from raysearch.training.data.splits import check_finite_inputs
from raysearch.training.registries import metric_functions
from raysearch.tune.plan import make_plan
from raysearch.tune.settings import SweepSettings
from raysearch.tune.spaces import space_from_dict

K = 4


def _table(k: int = K, n: int = 12, x: torch.Tensor | None = None) -> DatasetSplits:
    rows = TensorDataset(torch.randn(n, 5) if x is None else x, torch.arange(n) % k)
    return DatasetSplits(train=rows, val=rows, test=rows, num_classes=k)


def _dense(k: int = 3, size: int = 6) -> DatasetSplits:
    masks = torch.randint(0, k, (4, size, size))
    masks[:, 0] = 255
    images = TensorDataset(torch.randn(4, 3, size, size), masks)
    return DatasetSplits(train=images, val=images, test=images, num_classes=k,
                         task="segmentation", ignore_index=255)


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


# -- losses ------------------------------------------------------------------------------------


class PerSample(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets, reduction="none")


class NotTensor(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets).item()


class NaNLoss(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets) * float("nan")


class Detached(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits.detach(), targets)


class OwnWeightOnly(nn.Module):
    """Requires grad through its own parameter, but not through the logits."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(()))

    def forward(self, logits, targets):
        return self.w * 2.0


class InfGradient(nn.Module):
    """Finite value (0), infinite gradient: sqrt at 0."""

    def forward(self, logits, targets):
        return torch.sqrt(logits - logits).sum()


class Raises(nn.Module):
    def forward(self, logits, targets):
        raise RuntimeError("boom\n  on two lines")


class OneElement(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets).reshape(1)


@pytest.mark.parametrize(("loss", "needle"), [
    (PerSample(), "returned a tensor of shape (2,), expected a scalar (the batch mean)"),
    (NotTensor(), "returned a float on logits (2, 4) and targets (2,), expected a scalar tensor"),
    (NaNLoss(), "returned nan on logits (2, 4) and targets (2,), expected a finite value"),
    (Detached(), "does not depend on the logits (requires_grad is False"),
    (OwnWeightOnly(), "no gradient reaches the logits"),
    (InfGradient(), "its gradient with respect to the logits is not finite"),
    (Raises(), "raised RuntimeError: boom on two lines (called on logits (2, 4) and targets (2,))"),
])
def test_a_loss_that_breaks_its_contract_is_one_line_naming_it(loss, needle):
    with pytest.raises(ValueError, match=r"^loss 'mypkg\.losses:Bad'") as exc:
        check_loss(loss, _table(), "loss 'mypkg.losses:Bad'")
    message = _one_line(exc)
    assert needle in message, message


def test_a_one_element_loss_passes():
    check_loss(OneElement(), _table(), "loss 'one'")  # backward() takes one element as well


def test_the_loss_gets_the_side_inputs_it_declares():
    seen = {}

    class WithObjectness(nn.Module):
        side_inputs = ("objectness", "index")
        context_fraction = 0.15

        def forward(self, logits, targets, *, objectness, index, context=None):
            seen.update(objectness=objectness, index=index, context=context)
            return F.cross_entropy(logits, targets)

    check_loss(WithObjectness(), _table(), "loss 'als_like'")
    assert seen["objectness"].shape == (2,)
    assert seen["objectness"].dtype == torch.float32
    assert bool(((seen["objectness"] >= 0) & (seen["objectness"] <= 1)).all())
    assert seen["index"].tolist() == [0, 1]
    assert seen["context"].dtype == torch.bool
    assert seen["context"].shape == (2,)


def test_a_side_input_no_data_provides_is_refused():
    class WantsDepth(nn.Module):
        side_inputs = ("depth",)

        def forward(self, logits, targets, *, depth):
            return F.cross_entropy(logits, targets)

    with pytest.raises(ValueError, match=r"^loss 'mypkg:WantsDepth' takes depth per sample, "
                                         r"which no data provides \(provided: objectness"):
        check_loss(WantsDepth(), _table(), "loss 'mypkg:WantsDepth'")


def test_the_loss_check_inputs_follow_the_data():
    logits, targets, side = loss_check_inputs(nn.CrossEntropyLoss(), _table(k=7), "loss 'ce'")
    assert logits.shape == (2, 7)
    assert logits.requires_grad
    assert logits.dtype == torch.float32
    assert targets.tolist() == [0, 1]  # the first two labels
    assert targets.dtype == torch.int64
    assert side == {}
    data = _dense(k=3, size=6)
    logits, targets, _ = loss_check_inputs(nn.CrossEntropyLoss(), data, "loss 'ce'")
    assert logits.shape == (2, 3, 6, 6)
    assert torch.equal(targets, torch.stack([data.train[0][1], data.train[1][1]]))
    again, _, _ = loss_check_inputs(nn.CrossEntropyLoss(), data, "loss 'ce'")
    assert torch.equal(again, logits)  # seeded: the same inputs on every call


BUILTIN_LOSSES = sorted(n for n, e in LOSS_REGISTRY.entries().items() if e.source == BUILT_IN)


@pytest.mark.parametrize("name", BUILTIN_LOSSES)
def test_every_built_in_loss_passes_at_its_defaults(name):
    check_loss(build_loss(name), _table(k=10), f"loss {name!r}")


@pytest.mark.parametrize("name", [n for n in BUILTIN_LOSSES if n != "crl"])  # crl: whole samples
def test_every_dense_built_in_loss_passes_on_segmentation_targets(name):
    check_loss(build_loss(name, ignore_index=255), _dense(), f"loss {name!r}")


# -- metrics -----------------------------------------------------------------------------------


def needs_tensors(probs, labels):
    return (probs.argmax(dim=1) == labels).float().mean()


def returns_tensor(probs, labels):
    return torch.tensor(0.5)


def returns_array(probs, labels):
    return np.mean(probs, axis=0)


def returns_none(probs, labels):
    return None


def returns_nan(probs, labels):
    return float("nan")


def returns_inf(probs, labels):
    return np.float64("inf")


def raises(probs, labels):
    raise ZeroDivisionError("division by zero")


@pytest.mark.parametrize(("fn", "needle"), [
    (needs_tensors, "raised TypeError: "),
    (returns_tensor, "returned a Tensor of shape () on probs (8, 4) float64"),
    (returns_array, "returned a ndarray of shape (4,)"),
    (returns_none, "returned None on probs"),
    (returns_nan, "returned nan on probs (8, 4) float64 and labels (8,) int64"),
    (returns_inf, "returned inf on probs"),
    (raises, "raised ZeroDivisionError: division by zero on probs"),
])
def test_a_metric_that_breaks_its_contract_is_one_line_naming_it(fn, needle):
    with pytest.raises(ValueError, match=r"^metric 'mypkg\.metrics:m' ") as exc:
        check_metric(fn, "metric 'mypkg.metrics:m'", K)
    message = _one_line(exc)
    assert needle in message, message


def test_a_metric_gets_probabilities_of_every_class():
    seen = {}

    def gap(probs, labels):
        seen.update(probs=probs, labels=labels)
        return float(np.mean(probs.max(axis=1)))

    check_metric(gap, "metric 'gap'", 12)
    probs, labels = seen["probs"], seen["labels"]
    assert probs.shape == (12, 12)  # N = max(8, K)
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs.sum(axis=1), 1.0)
    assert sorted(set(labels.tolist())) == list(range(12))
    assert labels.dtype == np.int64


def test_a_metric_declaring_logits_gets_logits_and_numbers_of_any_kind_pass():
    seen = {}

    @metric(direction="max", reads="logits")
    def margin(logits, labels):
        seen["logits"] = logits
        return np.float32(1.5)

    check_metric(margin, "metric 'margin'", 3)
    assert seen["logits"].shape == (8, 3)
    assert (seen["logits"] < 0).any()  # not probabilities
    check_metric(lambda p, y: 1, "metric 'count'", 3)  # an int is a number


def test_metric_functions_checks_them_when_given_the_data_k():
    assert metric_functions([returns_nan]) == {"returns_nan": returns_nan}  # not called
    with pytest.raises(ValueError, match=r"metric '.*returns_nan' returned nan"):
        metric_functions([returns_nan], num_classes=3)


# -- calibrators -------------------------------------------------------------------------------


class SoftmaxT:
    """A correct user calibrator: one temperature."""

    def __init__(self, t: float = 1.5):
        self.t = t

    def fit(self, logits, labels):
        self.k = logits.shape[1]

    def predict_proba(self, logits):
        z = logits / self.t
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


class Unnormalised(SoftmaxT):
    def predict_proba(self, logits):
        return np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True) * 0.5


class WrongShape(SoftmaxT):
    def predict_proba(self, logits):
        return super().predict_proba(logits)[:, :1]


class NaNProbs(SoftmaxT):
    def predict_proba(self, logits):
        p = super().predict_proba(logits)
        p[3, 1] = np.nan
        return p


class Negative(SoftmaxT):
    def predict_proba(self, logits):
        p = super().predict_proba(logits)
        return 2 * p - p.mean(axis=1, keepdims=True)


class FitRaises(SoftmaxT):
    def fit(self, logits, labels):
        raise KeyError("missing class 3")


class NoneOut(SoftmaxT):
    def predict_proba(self, logits):
        return None


@pytest.mark.parametrize(("cls", "needle"), [
    (Unnormalised, "predict_proba of (40, 4) logits returned rows that do not sum to 1"),
    (WrongShape, "returned shape (40, 1), expected (40, 4)"),
    (NaNProbs, "returned 1 non-finite values (NaN or inf)"),
    (Negative, "expected probabilities in [0, 1]"),
    (FitRaises, "raised KeyError: 'missing class 3'"),
    (NoneOut, "returned None, expected an (N, K) array of probabilities"),
])
def test_a_calibrator_that_breaks_its_contract_is_one_line_naming_it(cls, needle):
    with pytest.raises(ValueError, match=r"^calibrator 'mine'") as exc:
        check_calibrator("mine", K, components={"mine": cls})
    message = _one_line(exc)
    assert needle in message, message


def test_a_calibrator_is_fitted_on_every_class():
    seen = {}

    class Spy(SoftmaxT):
        def fit(self, logits, labels):
            seen.update(logits=logits, labels=labels)

    check_calibrator(Spy, 15)
    assert seen["logits"].shape == (60, 15)  # N = max(40, 4 K)
    assert np.bincount(seen["labels"], minlength=15).min() == 4


BUILTIN_CALIBRATORS = sorted(n for n, e in CALIBRATOR_REGISTRY.entries().items()
                             if e.source == BUILT_IN)


@pytest.mark.parametrize("name", BUILTIN_CALIBRATORS)
def test_every_built_in_calibrator_passes(name):
    # the MLP of the PTS family with fewer Adam steps than its default (seconds, not minutes)
    check_calibrator(name, 3, params={"steps": 20} if name.startswith("pts") else None)


# -- non-finite inputs -------------------------------------------------------------------------


def test_nan_in_an_in_memory_split_is_counted_whole():
    x = torch.randn(12, 5)
    x[3, 1], x[11, 4], x[7, 0] = float("nan"), float("inf"), -float("inf")
    with pytest.raises(ValueError, match="non-finite") as exc:
        check_finite_inputs(_table(x=x), "mypkg.data:load")
    assert _one_line(exc).startswith("dataset 'mypkg.data:load' train split: 3 non-finite "
                                     "input values (NaN or inf); ")
    check_finite_inputs(_table(), "fine")


def test_in_memory_images_subsets_and_integer_inputs():
    images = ImageTensorDataset(torch.zeros(6, 3, 4, 4, dtype=torch.uint8), torch.arange(6) % 2,
                                mean=(0.5,) * 3, std=(0.25,) * 3)
    check_finite_inputs(DatasetSplits(images, images, images, 2), "imgs")  # uint8: finite
    tokens = TensorDataset(torch.arange(24).reshape(6, 4), torch.arange(6) % 2)
    check_finite_inputs(DatasetSplits(tokens, tokens, tokens, 2), "tokens")

    class ArrayImages(Dataset):
        def __init__(self):
            self.images = np.zeros((5, 2), dtype=np.float32)
            self.images[4, 1] = np.nan

        def __len__(self):
            return 5

        def __getitem__(self, i):
            return self.images[i], i % 2

    arrays = ArrayImages()
    fine = TensorDataset(torch.zeros(5, 2), torch.arange(5) % 2)
    with pytest.raises(ValueError, match=r"^dataset 'arr' test split: 1 non-finite input value "):
        check_finite_inputs(DatasetSplits(fine, fine, arrays, 2), "arr")
    x = torch.zeros(10, 2)
    x[9, 0] = float("nan")
    base = TensorDataset(x, torch.arange(10) % 2)
    check_finite_inputs(DatasetSplits(Subset(base, range(9)), fine, fine, 2), "sub")
    with pytest.raises(ValueError, match="dataset 'sub' val split: 1 non-finite"):
        check_finite_inputs(DatasetSplits(fine, Subset(base, [9, 0]), fine, 2), "sub")


class Files(Dataset):
    """A split read item by item; the items of `bad` hold an inf."""

    def __init__(self, n: int, bad: set[int]):
        self.n, self.bad, self.read = n, bad, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.read.append(i)
        x = torch.zeros(3)
        if i in self.bad:
            x[0] = float("inf")
        return x, i % 2


def test_a_split_in_files_is_checked_on_its_first_and_last_items():
    fine = Files(10, set())
    middle = Files(100, {50})
    check_finite_inputs(DatasetSplits(middle, fine, fine, 2), "files")  # not in the sample
    assert sorted(middle.read) == [*range(32), *range(68, 100)]
    ends = Files(100, {0, 99})
    with pytest.raises(ValueError, match="non-finite") as exc:
        check_finite_inputs(DatasetSplits(fine, ends, fine, 2), "files")
    assert _one_line(exc).startswith("dataset 'files' val split: 2 non-finite input values "
                                     "(NaN or inf) in its first and last 32 items")
    unread = Files(100, {0})
    check_finite_inputs(DatasetSplits(unread, fine, fine, 2), "files", sample=0)
    assert unread.read == []
    with pytest.raises(ValueError, match=r"test split: 1 non-finite input value \(NaN or inf\) "
                                         r"in its 10 items"):
        check_finite_inputs(DatasetSplits(fine, fine, Files(10, {5}), 2), "files")


# -- the driver's plan -------------------------------------------------------------------------


def _rows(data_dir, seed, val_fraction):
    return _table(k=3, n=30)


def _net(num_classes, input_shape):
    return nn.Linear(input_shape[0], num_classes)


def test_the_python_api_refuses_a_per_sample_loss_before_ray_and_writes_nothing(tmp_path):
    import ray

    ray_was_up = ray.is_initialized()  # other tests' session cluster may already be up
    with pytest.raises(ValueError, match="^loss ") as exc:
        raysearch.sweep({"train": {"epochs": 1}}, loss=PerSample, dataset=_rows, model=_net,
                        tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}",
                        storage_path=str(tmp_path / "ray"), progress=None)
    assert _one_line(exc) == ("loss 'test_contracts:PerSample' returned a tensor of shape (2,), "
                              "expected a scalar (the batch mean) (called on logits (2, 3) and "
                              "targets (2,))")
    assert ray.is_initialized() == ray_was_up
    assert list(tmp_path.iterdir()) == []


def test_make_plan_passes_the_python_api_objects_that_keep_their_contracts():
    components = {"losses": {"ce": nn.CrossEntropyLoss}, "datasets": {"rows": _rows},
                  "metrics": {"gap": needs_tensors}, "models": {"net": _net}}
    space = space_from_dict({"method": "ce", "train": {"epochs": 1}}, "s", components=components)
    settings = SweepSettings(dataset="rows", model="net", metrics=(),
                             posthoc=("ts", "test_contracts:SoftmaxT"))
    plan = make_plan(space, settings, lambda line: None, components)
    assert plan.data.num_classes == 3
    bad = settings.model_copy(update={"metrics": ("gap",)})
    with pytest.raises(ValueError, match=r"^metric 'gap' raised TypeError"):
        make_plan(space, bad, lambda line: None, components)
    bad = settings.model_copy(update={"posthoc": ("ts", "test_contracts:Unnormalised")})
    with pytest.raises(ValueError, match=r"^calibrator 'test_contracts:Unnormalised': "
                                         r"predict_proba of \(40, 3\) logits returned rows"):
        make_plan(space, bad, lambda line: None, components)


def test_a_memory_map_is_read_as_files(tmp_path):
    class Mapped(Files):
        def __init__(self):
            super().__init__(80, {40, 79})
            self.images = np.memmap(tmp_path / "x.dat", dtype=np.float32, mode="w+",
                                    shape=(80, 3))

    mapped = Mapped()
    with pytest.raises(ValueError, match=r"train split: 1 non-finite input value \(NaN or inf\) "
                                         r"in its first and last 32 items"):
        check_finite_inputs(DatasetSplits(mapped, Files(4, set()), Files(4, set()), 2), "mm")
    assert 40 not in mapped.read
