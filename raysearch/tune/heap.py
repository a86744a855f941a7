"""The driver's heap kept out of Python's garbage collections while a sweep runs."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["frozen_heap"]

_FROZEN = {"depth": 0}  # frozen_heap blocks entered and not yet left (the outermost acts)
_FROZEN_LOCK = threading.Lock()


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep the objects that exist now out of Python's garbage collections inside the block.

    A sweep's driver holds ~800k objects (torch, Ray, MLflow, SQLAlchemy, Optuna); a full
    collection walks all of them, ~0.2-0.5 s with the GIL held, and a sweep's allocations set
    one off now and then: in Tune's loop or the MLflow writer between two trials, in the checks
    before the Tuner starts (0.4 s in one sweep of three, measured), or at the first MLflow read
    after the Tuner (0.47 s). ``gc.freeze()`` sets them aside; ``gc.unfreeze()`` on the way out
    gives them back (the caller's next full collection walks them: in the CLI the process ends
    first). :func:`~raysearch.tune.engine.run_sweep` and
    :func:`~raysearch.tune.resume.resume_sweep` each run inside one block, from their first
    line to their return; blocks nest (only the outermost freezes and unfreezes).
    """
    with _FROZEN_LOCK:
        _FROZEN["depth"] += 1
        if _FROZEN["depth"] == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _FROZEN_LOCK:
            _FROZEN["depth"] -= 1
            if _FROZEN["depth"] == 0:
                gc.unfreeze()
