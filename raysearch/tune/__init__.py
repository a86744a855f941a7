"""The tune layer: search spaces, recipes, searchers, the trainable and the one sweep engine.

Everything Ray Tune and Optuna: :mod:`raysearch.tune.spaces` (the YAML search spaces and their
Optuna distributions), :mod:`raysearch.tune.recipes` (the papers' training protocols),
:mod:`raysearch.tune.settings` (:class:`~raysearch.tune.settings.SweepSettings`),
:mod:`raysearch.tune.prepare` (a sweep's data, before Ray starts), :mod:`raysearch.tune.searchers`
(Optuna samplers behind Ray Tune), :mod:`raysearch.tune.trainable` (one trial: a
:func:`~raysearch.training.run.fit` with reports and checkpoints), :mod:`raysearch.tune.engine`
(the only place a ``Tuner`` is built: :func:`~raysearch.tune.engine.build_tuner`),
:mod:`raysearch.tune.posthoc_sweep` (a post-hoc calibrator search run by that engine) and
:mod:`raysearch.tune.storage` (local and S3 storage paths).

It imports the layers below it (base, science, training, tracking); only the interface layer
(:mod:`raysearch.cli`, :mod:`raysearch.api`) imports it. This package's ``__init__`` imports
nothing, so ``import raysearch.tune.spaces`` does not start Ray.
"""
