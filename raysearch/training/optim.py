"""Optimizers by name: every ``torch.optim`` class, import strings, and their keyword arguments.

``OptimizerConfig(name="adamw", lr=1e-3, weight_decay=0.05, params={"betas": [0.9, 0.999]})``
builds ``torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05, betas=(0.9, 0.999))``: the name
is a ``torch.optim`` class name, case-insensitive (``sgd``, ``adam``, ``adamw``, ``rmsprop``,
``nadam``, ...), or an import string ``package.module:attr`` of a class or factory taking the
parameters first and its hyperparameters as keywords. Lists in the keyword arguments become
tuples (YAML has no tuples; ``betas`` must be one). The keyword arguments are checked by building
the optimizer over one dummy tensor, so a misspelt or out-of-range argument is a one-line error
before any training (:func:`check_optimizer`). A ``torch.optim`` class with a fused step
(``fused=True``: SGD, Adam, AdamW) takes it when every parameter is a floating-point CUDA
tensor and the config sets neither ``fused`` nor ``foreach``: one kernel launch updates every
parameter (the same update up to rounding); on the CPU torch's default step is kept.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

from raysearch.config import OptimizerConfig
from raysearch.registry import Registry, accepted_keywords, object_label

__all__ = ["OPTIMIZER_REGISTRY", "available_optimizers", "build_optimizer", "check_optimizer",
           "optimizer_class"]


def _torch_optimizers() -> dict[str, type[torch.optim.Optimizer]]:
    out = {}
    for name, value in vars(torch.optim).items():
        if (inspect.isclass(value) and issubclass(value, torch.optim.Optimizer)
                and value is not torch.optim.Optimizer and not name.startswith("_")):
            out[name.lower()] = value
    return out


#: ``torch.optim`` classes by lower-case name, plus the installed plug-ins (entry-point group
#: ``raysearch.optimizers``) and import strings.
OPTIMIZER_REGISTRY = Registry("optimizers", _torch_optimizers())


def available_optimizers() -> list[str]:
    """Lower-case names of the ``torch.optim`` classes, sorted."""
    return OPTIMIZER_REGISTRY.names()


def optimizer_class(name: Any) -> Any:
    """The optimizer class (or factory) of a name, import string or callable.

    Raises:
        ValueError: for an unknown name (with the closest ones) or an import string that does
            not import.
    """
    if isinstance(name, str) and name.lower() in OPTIMIZER_REGISTRY:
        name = name.lower()
    return OPTIMIZER_REGISTRY.get(name)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def build_optimizer(config: OptimizerConfig, params: Iterable[Any]) -> torch.optim.Optimizer:
    """``cls(params, **config.kwargs())`` for the optimizer `config` names.

    Args:
        config: the optimizer section of a run config.
        params: parameters or parameter groups (dicts with ``"params"`` and per-group options,
            e.g. a classification head's ``lr``).

    Returns:
        The optimizer.

    Raises:
        ValueError: one line for an unknown optimizer, a keyword argument the class does not
            take (the message lists the ones it takes), or a value it rejects.
    """
    cls = optimizer_class(config.name)
    label = config.name if isinstance(config.name, str) else object_label(config.name)
    kwargs = {k: _tuples(v) for k, v in config.kwargs().items()}
    names, var_kw = accepted_keywords(cls)
    if not var_kw:
        unknown = sorted(set(kwargs) - names)
        # lr and weight_decay are set for every optimizer; drop them only where the class has
        # none (LBFGS takes no weight_decay) and they are the defaults
        for key in ("weight_decay",):
            if key in unknown and key not in config.params:
                kwargs.pop(key)
                unknown.remove(key)
        if unknown:
            taken = sorted(names - {"self", "params"})
            raise ValueError(f"optimizer {label!r} takes no argument {unknown[0]!r}; it takes: "
                             f"{', '.join(taken)}")
    if not isinstance(params, torch.Tensor):  # one tensor: torch's own error below
        params = [dict(p, params=_tensors(p["params"])) if isinstance(p, dict) else p
                  for p in params]
        kwargs.update(_fused_step(cls, params, kwargs, names))
    try:
        return cls(params, **kwargs)
    except Exception as exc:  # noqa: BLE001 (torch's or a plug-in's own check: one line)
        raise ValueError(f"optimizer {label!r} with {kwargs}: {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())}") from None


#: torch.optim classes whose ``fused=True`` step runs on CUDA.
_FUSED_ON_CUDA = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def _tensors(params: Any) -> list[Any]:
    """A parameter group's ``params`` as a list (one tensor is a list of one, as torch takes it)."""
    return [params] if isinstance(params, torch.Tensor) else list(params)


def _fused_step(cls: Any, params: list[Any], kwargs: dict[str, Any], names: set[str]
                ) -> dict[str, Any]:
    """``{"fused": True}`` for a torch.optim class that has a fused step over CUDA parameters."""
    if (cls not in _FUSED_ON_CUDA or "fused" not in names
            or any(k in kwargs for k in ("fused", "foreach", "differentiable"))):
        return {}
    tensors = [t for p in params for t in (p["params"] if isinstance(p, dict) else [p])]
    if tensors and all(isinstance(t, torch.Tensor) and t.is_cuda and t.is_floating_point()
                       for t in tensors):
        return {"fused": True}
    return {}


def check_optimizer(config: OptimizerConfig) -> None:
    """Build the optimizer over one dummy tensor: bad names and arguments fail here, in one line.

    Raises:
        ValueError: as :func:`build_optimizer`.
    """
    build_optimizer(config, [torch.zeros(1, requires_grad=True)])
