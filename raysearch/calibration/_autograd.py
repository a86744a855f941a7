"""Gradients for the scipy optimisers of the calibrators, by torch autograd in float64.

Every fitted quantity (logits, temperatures, mixture weights, Dirichlet parameters) is a NumPy
float64 vector for scipy; the objective is written once as a torch function of it and
:func:`value_and_grad` runs the backward pass. No gradient is written by hand.
"""

from collections.abc import Callable

import numpy as np
import torch

__all__ = ["value_and_derivatives", "value_and_grad"]


def value_and_grad(
    fn: Callable[[torch.Tensor], torch.Tensor], x: np.ndarray | float
) -> tuple[float, np.ndarray]:
    """Value of a scalar torch function and its gradient, for scipy (``jac=True``).

    Args:
        fn: maps a float64 tensor shaped like ``x`` to a 0-d float64 tensor.
        x: the point, any shape (a float gives a 0-d gradient array).

    Returns:
        ``(fn(x), dfn/dx)``: a float and a float64 array of the shape of ``x``.
    """
    x_t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    value = fn(x_t)
    value.backward()
    return value.item(), x_t.grad.numpy()


def value_and_derivatives(
    fn: Callable[[torch.Tensor], torch.Tensor], x: float
) -> tuple[float, float, float]:
    """Value, first and second derivative of a scalar torch function of one variable.

    Args:
        fn: maps a 0-d float64 tensor to a 0-d float64 tensor.
        x: the point.

    Returns:
        ``(f(x), f'(x), f''(x))`` as floats (double backward).
    """
    x_t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    value = fn(x_t)
    (first,) = torch.autograd.grad(value, x_t, create_graph=True)
    (second,) = torch.autograd.grad(first, x_t)
    return value.item(), first.item(), second.item()
