"""A sweep's searchers: Optuna behind Ray Tune, and repeated seeds for any Tune searcher.

:class:`CompletedOnlyOptunaSearch` is Tune's ``OptunaSearch`` told only complete trials as
COMPLETE; :func:`make_sampler` is the seeded Optuna sampler of ``--sampler``.

:class:`RepeatedSearcher` wraps a searcher (raysearch's Optuna searcher) for ``--repeats R``.
The wrapped searcher samples a configuration once; the wrapper hands it to Tune R times, as R
trials that share a configuration id (:data:`~raysearch.tune.spaces.CONFIG_ID_KEY`) and differ in
their seed index (:data:`~raysearch.tune.spaces.SEED_INDEX_KEY`: seed ``seed + k`` on the data split
of ``seed``). Tune schedules them like any other trials, and a scheduler (ASHA) compares each
trial's rungs on its own. The wrapped searcher is told the configuration's result once all R
trials ended: the mean of every numeric metric over the seeds that ran all their epochs (the
soft calibration paper's protocol: Karandikar et al. 2021 report means over 10 runs). When no
seed completed, it is told the first seed's outcome (diverged: FAIL, stopped early: PRUNED,
error: FAIL).
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from ray.tune.search import Searcher
from ray.tune.search.optuna import OptunaSearch

from raysearch.training.records import COMPLETED, DIVERGED
from raysearch.tune.settings import SAMPLERS
from raysearch.tune.spaces import CONFIG_ID_KEY, SEED_INDEX_KEY


def mean_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean over `results` of every key that is a finite number in all of them.

    Args:
        results: the last results (Tune result dicts) of a configuration's complete seeds,
            at least one.

    Returns:
        The first result's items, with every numeric (non-bool) value replaced by its mean over
        `results` (keys missing or non-finite in some result keep the first result's value).

    Raises:
        ValueError: if `results` is empty.
    """
    if not results:
        raise ValueError("mean of no results")
    out = dict(results[0])
    for key, value in results[0].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        values = [r.get(key) for r in results]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for v in values):
            out[key] = sum(float(v) for v in values) / len(values)
    return out


class RepeatedSearcher(Searcher):
    """Issue every configuration of `searcher` `repeats` times; tell it the mean over seeds.

    Args:
        searcher: the searcher that samples configurations (e.g. raysearch's
            ``CompletedOnlyOptunaSearch``); its metric and mode are this searcher's.
        repeats: seeds per configuration, >= 1 (1: every trial is its own configuration, with
            the two keys added).

    Trial configs get ``_config_id`` (the id of the configuration's first trial, under which
    the wrapped searcher knows it) and ``_seed_index`` (0..repeats-1). The seeds of one
    configuration are issued back to back, so a configuration's seeds run close together in
    time and its mean is told to the sampler as early as possible.

    Raises:
        ValueError: if `repeats` < 1.
    """

    def __init__(self, searcher: Searcher, repeats: int) -> None:
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise ValueError(f"`repeats` must be an int >= 1, got {repeats!r}")
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher
        self.repeats = repeats
        #: configuration id -> {"config", "issued", "results": {trial id: (result, error)}}
        self.groups: dict[str, dict[str, Any]] = {}
        self.trial_group: dict[str, str] = {}  # trial id -> configuration id

    def set_search_properties(self, metric: Any, mode: Any, config: dict,  # noqa: D102
                              **spec: Any) -> bool:
        ok = self.searcher.set_search_properties(metric, mode, config, **spec)
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        return ok

    def set_max_concurrency(self, max_concurrent: int) -> bool:  # noqa: D102
        return False  # Tune's ConcurrencyLimiter limits the trials (seeds), as it should

    def suggest(self, trial_id: str) -> dict | str | None:
        """The next seed of an open configuration, else a new configuration's first seed."""
        for gid, group in self.groups.items():
            if group["issued"] < self.repeats:
                return self._issue(trial_id, gid)
        config = self.searcher.suggest(trial_id)
        if not isinstance(config, dict):  # None (wait) or Searcher.FINISHED
            return config
        self.groups[trial_id] = {"config": config, "issued": 0, "results": {}}
        return self._issue(trial_id, trial_id)

    def _issue(self, trial_id: str, gid: str) -> dict:
        group = self.groups[gid]
        index = group["issued"]
        group["issued"] += 1
        self.trial_group[trial_id] = gid
        return {**group["config"], CONFIG_ID_KEY: gid, SEED_INDEX_KEY: index}

    def on_trial_result(self, trial_id: str, result: dict) -> None:  # noqa: D102
        pass  # the wrapped searcher learns from configurations' means only

    def on_trial_complete(self, trial_id: str, result: dict | None = None,
                          error: bool = False) -> None:
        """Record a seed's end; once all seeds of its configuration ended, tell the searcher."""
        gid = self.trial_group.pop(trial_id, None)
        if gid is None or gid not in self.groups:
            return
        group = self.groups[gid]
        group["results"][trial_id] = (result, error)
        if len(group["results"]) < self.repeats:
            return
        del self.groups[gid]
        outcomes = list(group["results"].values())
        complete = [r for r, e in outcomes
                    if not e and r is not None and r.get(COMPLETED) and not r.get(DIVERGED)]
        if complete:
            self.searcher.on_trial_complete(gid, result=mean_result(complete))
            return
        first, first_error = group["results"].get(gid, outcomes[0])
        self.searcher.on_trial_complete(gid, result=first, error=first_error)

    def get_state(self) -> dict[str, Any]:
        """This wrapper's bookkeeping; Tune saves the wrapped searcher on its own."""
        return {"repeats": self.repeats, "groups": self.groups,
                "trial_group": self.trial_group}

    def set_state(self, state: dict[str, Any]) -> None:  # noqa: D102
        self.repeats = state["repeats"]
        self.groups = state["groups"]
        self.trial_group = state["trial_group"]


class CompletedOnlyOptunaSearch(OptunaSearch):
    """OptunaSearch that tells Optuna only trials that ran all their epochs as COMPLETE.

    Ray reports a trial stopped early by a scheduler as complete with its partial-epoch values;
    here such a trial (whose last result lacks ``completed = True``) is told as PRUNED, so it never
    enters the sampler's history or a multi-objective Pareto set as a finished trial. A trial
    whose loss diverged (``diverged`` in its last result) is told as FAIL.

    An ended trial's ``optuna.Trial`` handle (``OptunaSearch._ot_trials``: a copy of its
    ``FrozenTrial`` each) is dropped once told: the study holds the trial, and Tune pickles the
    searcher at each experiment snapshot, so the handles of ended trials would make the
    driver's memory and each snapshot grow with the number of trials.

    Args:
        *args: as ``OptunaSearch``.
        require_completed: True (raysearch's trainable): a result without ``completed = True``
            is partial. False (a trainable of one's own): only a result with ``completed =
            False`` is.
        **kwargs: as ``OptunaSearch``.
    """

    def __init__(self, *args: Any, require_completed: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.require_completed = require_completed

    def on_trial_complete(self, trial_id: str, result: dict | None = None,  # noqa: D102
                          error: bool = False) -> None:
        complete = (result or {}).get(COMPLETED, not getattr(self, "require_completed", True))
        if not error and result is not None and result.get(DIVERGED):
            result, error = None, True  # -> FAIL
        elif not error and result is not None and not complete:
            result = None  # -> PRUNED in OptunaSearch.on_trial_complete
        super().on_trial_complete(trial_id, result=result, error=error)
        self._ot_trials.pop(trial_id, None)  # told; `_completed_trials` keeps its id


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    """The seeded Optuna sampler for ``--sampler`` (tpe handles one or several objectives)."""
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown sampler '{name}'; choose from {', '.join(SAMPLERS)}")
