"""What the fault drills compare a sweep's records with: Tune's own reports and a run never
interrupted. Shared by tests/test_faults.py, tests/test_checkpoint_faults.py, tests/test_sync.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from raysearch.config import RunConfig
from raysearch.training.run import fit


def first_reports(storage: Path, trial_id: str, key: str) -> dict[int, float]:
    """``{epoch: first reported value of key}`` from the trial's ``result.json`` in `storage`.

    Read as Tune wrote it (one JSON report per line, earlier epochs in ``epoch_history``),
    independently of raysearch's own reader.
    """
    (folder,) = [p for p in storage.iterdir() if f"_{trial_id}_" in p.name]
    first: dict[int, float] = {}
    for line in (folder / "result.json").read_text().splitlines():
        result = json.loads(line)
        for entry in [*result.get("epoch_history", ()), result]:
            if key in entry:
                first.setdefault(int(entry["epoch"]), entry[key])
    return first


def uninterrupted(cfg: RunConfig) -> tuple[Any, list[dict[str, float]]]:
    """`cfg` trained straight through with one torch thread, as in a trial.

    Returns:
        The :class:`~raysearch.training.run.TrainResult` and each epoch's metrics, in order.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the trial
    per_epoch: list[dict[str, float]] = []
    try:
        result = fit(cfg, on_epoch=lambda epoch, metrics, state: per_epoch.append(metrics))
    finally:
        torch.set_num_threads(threads)
    return result, per_epoch
