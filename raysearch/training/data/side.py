"""Per-sample inputs of a loss besides the logits and the targets, made by the data.

A loss states what else it takes in its class attribute ``side_inputs``, declared with the loss
class: a tuple of keyword names its ``forward`` accepts (``("objectness",)`` for
objectness-adaptive label smoothing, ``("index",)`` for the correctness ranking loss). The
training loop asks :func:`side_input_epochs` for the epochs that carry them and passes them to
the loss batch by batch, without knowing what they are. Plain PyTorch: no Ray, no MLflow.

Provided here:

- ``objectness`` (and ``context`` when the loss's ``context_fraction`` > 0): fresh crops of the
  training split every epoch with the share of each crop the object covers
  (:func:`raysearch.training.data.objectness.objectness_train_set`; Krothapalli & Abbott, Eq. 5-6).
- ``index``: int64 position of each sample in the training split, in [0, len(train)), for losses
  that keep a per-sample state across epochs (the correctness history of CRL, Moon et al. 2020).
  It describes the split itself, so alone it needs no fresh epochs
  (:func:`split_side_inputs`): the loop batches the training split as for any other loss, and
  under DDP each rank's shares carry their global positions. With ``objectness`` it is the
  position of each crop's image (crop i of an epoch is made from training image i).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from raysearch.registry import accepted_keywords
from raysearch.training.data.splits import DatasetSplits

__all__ = ["PROVIDED", "SPLIT_INPUTS", "loss_side_inputs", "side_input_epochs",
           "split_side_inputs"]

#: The side inputs the data can make.
PROVIDED = ("objectness", "context", "index")
#: The side inputs that describe the training split itself (the same every epoch).
SPLIT_INPUTS = ("index",)

EpochTensors = Callable[[int], tuple[Tensor, Tensor, dict[str, Tensor]]]


def loss_side_inputs(loss: Any) -> tuple[str, ...]:
    """The per-sample keyword inputs `loss` takes besides logits and targets (may be empty).

    Read from the loss's ``side_inputs`` attribute (a tuple of names, or none).

    Raises:
        ValueError: if ``side_inputs`` is not a tuple of names, or names one that the loss's
            ``forward`` does not accept.
    """
    names = getattr(loss, "side_inputs", ()) or ()
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"the loss's `side_inputs` must be a tuple of keyword names, got "
                         f"{names!r}")
    names = tuple(names)
    accepted, var_kw = accepted_keywords(getattr(loss, "forward", loss))
    missing = [name for name in names if name not in accepted]
    if missing and not var_kw:
        raise ValueError(f"the loss's `side_inputs` name {', '.join(missing)}, which its "
                         f"forward does not take as a keyword")
    return names


def side_input_epochs(data: DatasetSplits, names: tuple[str, ...], loss: Any, *,
                      seed: int) -> EpochTensors:
    """``epoch -> (x, y, {name: tensor})``: the training samples of an epoch and their inputs.

    Args:
        data: the run's splits.
        names: the inputs the loss takes (:func:`loss_side_inputs`).
        loss: the loss (its ``context_fraction`` adds object-free ``context`` samples).
        seed: seed of the crops (epoch e's crops depend on (seed, e) only).

    Raises:
        ValueError: for an input no data provides, or objectness on a dataset without object
            annotations.
    """
    unknown = [n for n in names if n not in PROVIDED]
    if unknown:
        raise ValueError(f"the loss takes {', '.join(unknown)} per sample, which no data "
                         f"provides (provided: {', '.join(PROVIDED)})")
    from raysearch.training.data.objectness import objectness_train_set

    context_fraction = float(getattr(loss, "context_fraction", 0.0))
    crops = objectness_train_set(data, seed=seed, context_fraction=context_fraction)

    def epoch_tensors(epoch: int) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        x, y, objectness, context = crops.epoch_tensors(epoch)
        side = {"objectness": objectness}
        if crops.context_fraction > 0:
            side["context"] = context
        if "index" in names:  # crop i is made from training image i
            side["index"] = torch.arange(len(y), dtype=torch.int64)
        return x, y, side

    return epoch_tensors


def split_side_inputs(data: DatasetSplits, names: tuple[str, ...]) -> dict[str, Tensor] | None:
    """The side inputs of a loss indexed like the training split, if all of them are.

    Args:
        data: the run's splits.
        names: the inputs the loss takes (:func:`loss_side_inputs`).

    Returns:
        ``{"index": arange(len(data.train))}`` (int64, CPU) when every name is in
        :data:`SPLIT_INPUTS`, so the loop feeds the training split itself and passes
        ``side[name][batch_index]``; None when an input needs epochs made by
        :func:`side_input_epochs` (or `names` is empty).
    """
    if not names or any(name not in SPLIT_INPUTS for name in names):
        return None
    return {"index": torch.arange(len(data.train), dtype=torch.int64)}
