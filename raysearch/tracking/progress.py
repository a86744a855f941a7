"""The progress line of a finished trial: its number, the sweep's count, its scores.

``[trial 003, 4 of 6 done] acls margin=8.1 ... val acc 97.50% ECE 1.20% | test acc ...
(3.1s, done)``: the trial is named by the number of its child run (``<sweep>-003-acls``;
``003 seed 1`` for a seed run of a repeated sweep), not by the order trials end in.
:class:`~raysearch.tracking.callback.MlflowSweepCallback` prints it; this module imports
nothing of the package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["number_of", "trial_line"]


def number_of(run_name: str, sweep: str) -> str:
    """The number in a trial run's name ``<sweep>-<NNN>-<method>[-seed<k>]``: ``NNN [seed k]``."""
    rest = run_name[len(sweep) + 1:] if run_name.startswith(f"{sweep}-") else run_name
    seed = rest.rpartition("-seed")[2] if "-seed" in rest else ""
    number = rest.split("-", 1)[0]
    return f"{number} seed {seed}" if seed.isdigit() else number


def trial_line(number: str, finished: int, total: int | None, head: str,
               result: dict[str, Any], complete: bool, outcome: str) -> str:
    """A finished trial's progress line.

    Args:
        number: the trial's number (:func:`number_of`, ``001``).
        finished: trials of the sweep that ended so far, this one included.
        total: trials of the sweep, or None when unknown.
        head: the method and the searched values.
        result: the trial's last result (``val_*``, ``test_*`` fractions in [0, 1]).
        complete: whether it ran all its epochs (its test scores are shown then).
        outcome: how it ended, with its time (``3.1s, done``).

    Returns:
        ``[trial 001, 4 of 6 done] <head> val acc 97.50% ECE 1.20% | test acc ... (<outcome>)``.
    """
    scores = ""
    if "val_miou" in result and "val_ece" in result:  # segmentation
        scores = (f" val mIoU {100 * result['val_miou']:.2f}%"
                  f" pixel ECE {100 * result['val_ece']:.2f}%")
    elif "val_accuracy" in result and "val_ece" in result:
        scores = (f" val acc {100 * result['val_accuracy']:.2f}%"
                  f" ECE {100 * result['val_ece']:.2f}%")
    if "test_miou" in result and complete:
        scores += (f" | test mIoU {100 * result['test_miou']:.2f}%"
                   f" pixel ECE {100 * result['test_ece']:.2f}%")
    elif "test_accuracy" in result and complete:
        scores += (f" | test acc {100 * result['test_accuracy']:.2f}%"
                   f" ECE {100 * result['test_ece']:.2f}%")
    done = f"{finished} of {total}" if total else str(finished)
    return f"[trial {number}, {done} done] {head}{scores} ({outcome})"
