"""A Ray Tune trainable of your own, with raysearch's parts around it.

Keep your training loop; take from raysearch what a calibration sweep needs:

- the search space as a Tune search algorithm (``raysearch.searcher``: Optuna, seeded);
- the metrics a raysearch trial logs, from your logits (``calibration_report``);
- the MLflow record: a parent run per sweep, a child run per trial, and at the end the
  selection rule ("lowest validation ECE within 1% of the best validation accuracy"),
  ``pareto.png``, ``trials.parquet`` and ``best_config.yaml`` on the parent run
  (``raysearch.tracking.SweepCallback``);
- the rule on a DataFrame (``raysearch.metrics.selection.select_best``).

Run it (MLflow goes where ``$MLFLOW_TRACKING_URI`` says, else ``./mlruns.db``)::

    python examples/own_trainable.py --num-samples 6
    raysearch ui        # the sweep's parent run, with pareto.png and best_config.yaml

It starts a Ray of its own on this machine, as ``raysearch sweep`` does, and never joins a Ray
already running here; ``--address auto`` (a cluster node) or ``--address ray://HEAD:10001``
(a Ray Client) runs the trials on that cluster instead (the script's imports must be there).

The trainable below is a softmax-regression network on scikit-learn's digits, trained with
label smoothing whose epsilon and learning rate the sweep searches. Only public names are used.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import ray
import torch
from ray import tune
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import raysearch
from raysearch.losses import build_loss
from raysearch.metrics import calibration_report
from raysearch.metrics.selection import select_best
from raysearch.tracking import SweepCallback
from raysearch.tune.spaces import space_from_dict

#: What the sweep searches: the files' format, as a mapping (a YAML file works the same).
SPACE = {
    "method": "ls",
    "description": "label smoothing on a small MLP, your own loop",
    "params": {"epsilon": {"low": 0.0, "high": 0.3}},
    "train": {"lr": {"low": 0.01, "high": 0.5, "log": True}, "epochs": 30},
}


def load() -> tuple[np.ndarray, ...]:
    """Digits, split 60/20/20 (stratified, seed 0), features scaled to [0, 1]."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=0.2, stratify=y,
                                                      random_state=0)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=0.25,
                                                      stratify=y_rest, random_state=0)
    return x_train, y_train, x_val, y_val, x_test, y_test


def trainable(config: dict) -> None:
    """Your own Tune function trainable: reports raysearch's metric names every epoch."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    x_train, y_train, x_val, y_val, x_test, y_test = (torch.from_numpy(a) for a in load())
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    loss_fn = build_loss(config["method"], epsilon=config["epsilon"])
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    epochs = int(config["epochs"])
    for epoch in range(1, epochs + 1):
        model.train()
        for index in torch.randperm(len(y_train)).split(64):
            optimizer.zero_grad()
            loss_fn(model(x_train[index]), y_train[index].long()).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            metrics = calibration_report(model(x_val), y_val, prefix="val_")
            if epoch == epochs:  # the test split once, at the end
                metrics.update(calibration_report(model(x_test), y_test, prefix="test_"))
        tune.report({"epoch": epoch, **metrics})


def main() -> None:
    """Sweep SPACE with the trainable above; print the selected trial."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-samples", type=int, default=6)
    parser.add_argument("--storage-path", default=os.path.expanduser("~/ray_results"))
    parser.add_argument("--name", default=None, help="sweep name (the parent run's)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to run on (auto, ray://HEAD:10001) [default: start a "
                             "local Ray, never one already running on this machine]")
    args = parser.parse_args()

    space = space_from_dict(SPACE, "own-trainable")
    callback = SweepCallback(args.name, space=space)  # honours $MLFLOW_TRACKING_URI
    search = raysearch.searcher(space, seed=0)
    # a Ray of its own, or --address's cluster; a session this process started is used as it
    # is. Started before the Tuner (which, through a Ray Client, runs on the head node)
    if not ray.is_initialized():
        ray.init(address=args.address or "local")
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(search_alg=search, num_samples=args.num_samples,
                                    max_concurrent_trials=2),
        run_config=tune.RunConfig(name=callback.sweep_name, callbacks=[callback], verbose=0,
                                  storage_path=os.path.abspath(args.storage_path)),
    )
    tuner.fit()
    # the rule on a DataFrame: what the callback applied for pareto.png and best_config.yaml
    complete = callback.trials[callback.trials["complete"]].reset_index(drop=True)
    best = complete.iloc[select_best(complete, accuracy="val_accuracy", ece="val_ece")]
    print(f"selected {best['trial']}: epsilon={best['epsilon']:.3f} lr={best['lr']:.3g} | "
          f"val acc {100 * best['val_accuracy']:.2f}% ECE {100 * best['val_ece']:.2f}% | "
          f"test acc {100 * best['test_accuracy']:.2f}% ECE {100 * best['test_ece']:.2f}%")
    print(f"MLflow parent run {callback.parent_run_id} holds pareto.png and best_config.yaml")


if __name__ == "__main__":
    main()
