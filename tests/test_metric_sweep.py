"""A user's decorated metric in a real sweep (Ray, MLflow): logged by the trials wherever a
built-in one is, after the post-hoc calibrator included, and the sampler's objective in its
declared direction."""

from __future__ import annotations

import textwrap

import pytest

import raysearch
from raysearch.tune.settings import SweepSettings

pytestmark = pytest.mark.integration

METRICS = textwrap.dedent('''
    import numpy as np

    from raysearch.metrics import metric


    @metric(direction="max")
    def top2(probs, labels):
        """Top-2 accuracy: the label is one of the two most probable classes."""
        best = np.argsort(-probs, axis=1, kind="stable")[:, :2]
        return float(np.mean((best == labels[:, None]).any(axis=1)))
''')


def test_a_decorated_metric_is_logged_by_the_trials_and_is_the_objective(ray_session, tmp_path,
                                                                         monkeypatch):
    (tmp_path / "mymetrics.py").write_text(METRICS)
    monkeypatch.chdir(tmp_path)  # the import string resolves from here, as for the CLI
    monkeypatch.syspath_prepend(str(tmp_path))
    options = {"metrics": ["mymetrics:top2"], "posthoc": ("ts",), "objective": "val_top2_ts"}
    assert SweepSettings(**options).objective_metrics() == ("val_top2_ts", "max")
    result = raysearch.sweep("ce", num_samples=1, epochs=1, name="top2",
                             tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}",
                             storage_path=str(tmp_path / "ray"), progress=None, **options)
    trials = result.trials
    assert trials["complete"].all(), trials[["trial", "outcome"]]
    for key in ("val_top2", "test_top2", "val_top2_ts", "test_top2_ts", "test_ece_ts"):
        assert trials[key].between(0, 1).all(), key
