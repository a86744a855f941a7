"""The training layer: data, models, the epoch loop, its checkpoints and evaluation.

Plain PyTorch (torchvision, scikit-learn and scipy where a dataset needs them): no Ray Tune, no
MLflow, no Optuna. It imports the base (:mod:`raysearch.config`, :mod:`raysearch.registry`) and
the science (:mod:`raysearch.losses`, :mod:`raysearch.calibration`, :mod:`raysearch.metrics`);
the tracking, tune and interface layers import it, never the reverse.

- :mod:`raysearch.training.data`: the datasets (built in and a user's own), splits, augmentation;
- :mod:`raysearch.training.models`: the networks (built in, torchvision, pretrained weights);
- :mod:`raysearch.training.registries`: the name -> builder registries of every kind;
- :mod:`raysearch.training.optim`: optimisers and learning-rate schedules;
- :mod:`raysearch.training.contracts`: the checks a user's loss, metric and calibrator pass on
  two samples before a sweep starts;
- :mod:`raysearch.training.run`: :func:`~raysearch.training.run.fit`, one training run, in named
  steps, with its parts :mod:`~raysearch.training.passes`, :mod:`~raysearch.training.run_parts`,
  :mod:`~raysearch.training.run_weights`, :mod:`~raysearch.training.divergence`,
  :mod:`~raysearch.training.mixing` and :mod:`~raysearch.training.interleaving`;
- :mod:`raysearch.training.loop`: batches on the device, precision, DDP, predictions;
- :mod:`raysearch.training.tasks`: what a task evaluates (classification, dense prediction) and
  :mod:`raysearch.training.dense` its per-pixel meters;
- :mod:`raysearch.training.plots`: reliability diagrams and the Pareto plot (matplotlib, imported
  on first use);
- :mod:`raysearch.training.records`: the keys of a trial's reports and the files of its
  checkpoint, shared by the layers above.

Nothing here names a dataset or a model outside the registries and the data and model packages:
a user's plug-in goes through the same loop.
"""
