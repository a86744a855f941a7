"""The tune layer: search spaces, recipes, searchers, the trainable and the one sweep engine.

Everything Ray Tune and Optuna, a module a job:

- what a sweep is: :mod:`~raysearch.tune.spaces` (the YAML search spaces, their Optuna
  distributions, and the one place a searcher's suggestion becomes a run config),
  :mod:`~raysearch.tune.recipes` (the papers' training protocols),
  :mod:`~raysearch.tune.settings` (:class:`~raysearch.tune.settings.SweepSettings`),
  :mod:`~raysearch.tune.plan` (what the driver resolves and checks before Ray starts);
- running it: :mod:`~raysearch.tune.cluster` (Ray start-up and the cluster's checks),
  :mod:`~raysearch.tune.engine` (the only place a ``Tuner`` is built:
  :func:`~raysearch.tune.engine.build_tuner`), :mod:`~raysearch.tune.searchers` (Optuna behind
  Ray Tune), :mod:`~raysearch.tune.study` (the sweep's Optuna study),
  :mod:`~raysearch.tune.sweep_record` (its name and record), :mod:`~raysearch.tune.outcome`
  (its failed trials and what a sweep with none complete raises), :mod:`~raysearch.tune.resume`
  (``--resume`` and ``sync``), :mod:`~raysearch.tune.sync` (MLflow reconciled with Tune's
  records), :mod:`~raysearch.tune.storage` (local and S3 storage paths),
  :mod:`~raysearch.tune.heap` (the driver's garbage collection);
- one trial: :mod:`~raysearch.tune.trainable` (the trial function),
  :mod:`~raysearch.tune.trial_options` (its typed options and context),
  :mod:`~raysearch.tune.trial_reports` (what it reports and when),
  :mod:`~raysearch.tune.checkpoints` (its checkpoints), :mod:`~raysearch.tune.ddp` (a
  multi-GPU trial), :mod:`~raysearch.tune.drills` (fault drills);
- after it: :mod:`~raysearch.tune.model_export` (a selected trial as a model),
  :mod:`~raysearch.tune.posthoc_sweep` (a post-hoc calibrator search run by the engine).

It imports the layers below it (base, science, training, tracking); only the interface layer
(:mod:`raysearch.cli`, :mod:`raysearch.api`) imports it. This package's ``__init__`` imports
nothing, so ``import raysearch.tune.spaces`` does not start Ray.
"""
