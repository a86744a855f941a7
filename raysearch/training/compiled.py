"""``torch.compile`` for a run (``RunConfig.compile``): the model and the loss, and its cost.

:func:`compile_run` compiles the run's model and loss in place (``nn.Module.compile``: the
parameter names, the state dicts and so the checkpoints are those of the uncompiled module)
after clearing what Dynamo compiled before in the process (``torch.compiler.reset()``: a Ray
worker that trains one trial after another starts each from nothing, and never reaches Dynamo's
recompilation limit). Compilation is lazy: the first training step compiles the training graph
(forward and backward), the first evaluation batch the inference graph; a batch of another shape
(an epoch's last, smaller batch) may compile once more. :class:`CompileClock` reads the seconds
Dynamo spent compiling since the run started, which the run reports as ``train_compile_seconds``
besides its metrics.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["COMPILE_SECONDS", "CompileClock", "compile_run"]

#: The run's metric of the seconds spent compiling (with ``RunConfig.compile`` only).
COMPILE_SECONDS = "train_compile_seconds"


class CompileClock:
    """Seconds that ``torch.compile`` spent compiling in this process since it was made.

    Read from Dynamo's own record of its compilations (the table that
    ``torch._dynamo.utils.compile_times()`` prints): the time of each frame's compilation, the
    backend's included, and of a backward graph compiled on its first call; the steps' own
    compute is not counted.
    """

    def __init__(self) -> None:
        self._start = _compiling_seconds()

    def seconds(self) -> float:
        """Seconds spent compiling since the clock was made (>= 0)."""
        return max(_compiling_seconds() - self._start, 0.0)


def _compiling_seconds() -> float:
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(sum(times) for name, times in compilation_time_metrics.items()
                     if name == "_compile.compile_inner" or name.startswith("backward.")))


def compile_run(net: nn.Module, loss_fn: object) -> CompileClock:
    """Compile `net` and `loss_fn` (when it is an ``nn.Module``) in place; start the clock.

    Args:
        net: the run's model (not yet wrapped for DDP).
        loss_fn: the run's objective; a plain function is left as it is.

    Returns:
        CompileClock: started after ``torch.compiler.reset()``.
    """
    torch.compiler.reset()
    net.compile()
    if isinstance(loss_fn, nn.Module):
        loss_fn.compile()
    return CompileClock()
