"""The driver's heap while a sweep runs: out of Python's garbage collections, trimmed as it goes.

:func:`frozen_heap` keeps the objects that exist when a sweep starts out of Python's garbage
collections; :class:`HeapTrim`, a Tune callback, hands the C allocator's free pages back to the
operating system every few ended trials (:func:`trim_free_memory`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import threading
from collections.abc import Iterator
from typing import Any

from ray import tune

__all__ = ["HeapTrim", "frozen_heap", "trim_free_memory"]

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


def _malloc_trim() -> Any:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to call
        return None


_TRIM = _malloc_trim()


def trim_free_memory() -> bool:
    """Hand the free pages of the C heap back to the operating system (glibc's ``malloc_trim``).

    Memory that Python, Ray, SQLAlchemy or Arrow freed stays in the process's resident set as
    long as a live allocation shares its region of the heap; ``malloc_trim(0)`` releases every
    whole free page there. Takes milliseconds.

    Returns:
        True where it ran (Linux with glibc), False elsewhere (it does nothing there).
    """
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class HeapTrim(tune.Callback):
    """A Tune callback: :func:`trim_free_memory` once every `every` ended trials.

    Each trial the driver hands to Tune leaves freed memory scattered in its heap (its records
    in Tune, the searcher's, the MLflow writes); trimmed as the sweep goes, the driver's resident
    memory follows what it holds instead of growing with the trials
    (``benchmarks/sweep_scale.py``).

    Args:
        every: ended trials (completed, stopped or failed) between two trims, >= 1.
    """

    def __init__(self, every: int = 100) -> None:
        if every < 1:
            raise ValueError(f"`every` must be >= 1, got {every}")
        self.every = every
        self.ended = 0
        self.trims = 0

    def _ended(self) -> None:
        self.ended += 1
        if self.ended % self.every == 0 and trim_free_memory():
            self.trims += 1

    def on_trial_complete(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                          **info: Any) -> None:
        self._ended()

    def on_trial_error(self, iteration: int, trials: list, trial: Any,  # noqa: D102
                       **info: Any) -> None:
        self._ended()
