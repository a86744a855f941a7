"""Batch mixing of a training run: MixUp, CutMix and RICAP as one ``mix(x, y)`` callable.

:func:`make_mixer` builds it from ``cfg.mixup_alpha``, ``cfg.cutmix_alpha`` and
``cfg.ricap_beta`` (torchvision.transforms.v2's ``MixUp``/``CutMix``; RICAP: Takahashi et al.
2018, :func:`raysearch.training.data.ricap.ricap_patches`); :func:`raysearch.training.run.fit`
trains on the mixed batch with the objective of its module docstring (**MixUp / CutMix**).

Imports (lazily) only :mod:`raysearch.training.data.ricap` of the package (and
:mod:`raysearch.config` for type hints); never :mod:`raysearch.training.run`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from raysearch.config import RunConfig


def make_mixer(
    cfg: RunConfig, num_classes: int
) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor]] | None:
    """MixUp/CutMix from torchvision.transforms.v2 as ``mix(x, y) -> (x_mixed, lam, y_partner)``.

    RICAP (``cfg.ricap_beta`` > 0) gives ``(x_mixed, weights (4,), labels (4, N))`` instead: the
    patch areas and labels of :func:`raysearch.training.data.ricap.ricap_patches`.

    torchvision returns soft labels ``lam * onehot(y) + (1 - lam) * onehot(y_partner)``; `lam` is
    the smallest own-label weight in the batch (every sample whose partner has another class
    carries exactly lam) and `y_partner` the class holding the rest.
    """
    mixup = float(getattr(cfg, "mixup_alpha", 0.0))
    cutmix = float(getattr(cfg, "cutmix_alpha", 0.0))
    ricap_beta = float(getattr(cfg, "ricap_beta", 0.0))
    if mixup <= 0 and cutmix <= 0 and ricap_beta <= 0:
        return None
    from torchvision.transforms import v2

    parts = []
    if mixup > 0:
        parts.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
    if cutmix > 0:
        parts.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
    if ricap_beta > 0:  # RICAP: (x, weights (4,), labels (4, N)), see passes.train_pass
        from raysearch.training.data.ricap import ricap_patches

        parts.append(lambda x, y: ricap_patches(x, y, ricap_beta))
    transform = parts[0] if len(parts) == 1 else v2.RandomChoice(parts)

    def mix(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out = transform(x, y)
        if len(out) == 3:
            return out
        mixed, soft = out
        lam = soft.gather(1, y[:, None]).min()
        rest = soft - lam * torch.nn.functional.one_hot(y, num_classes).to(soft.dtype)
        return mixed, lam, rest.argmax(dim=1)

    return mix
