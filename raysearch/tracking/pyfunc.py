"""A sweep's selected trial as an MLflow pyfunc model: its weights and its fitted calibrator.

:class:`CalibratedClassifier` is what ``raysearch export NAME --register MODEL`` registers and
``--with-weights -o DIR`` saves: ``mlflow.pyfunc.load_model(uri).predict(x)`` maps a float32
array of inputs (N, *input_shape) to calibrated probabilities (N, K) whose rows sum to 1.

The network is rebuilt at load time from its factory (a built-in name, ``torchvision:<name>``
or the import string of a user's factory, which must import where the model is loaded), its
keyword arguments and the data's shape, then gets the trial's final weights (``weights.pt``, a
state dict read with ``torch.load(weights_only=True)``). The fitted post-hoc calibrator
(temperature scaling by default; any of :func:`raysearch.calibration.available_calibrators`,
or ``none``) travels pickled inside the model, as MLflow pickles every pyfunc ``PythonModel``;
the run's exported config is the artifact ``best_config.yaml``.

It imports :mod:`raysearch.training.models`; the interface layer (:func:`raysearch.api.export`)
calls it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import yaml
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.tracking import MlflowClient
from mlflow.types import Schema, TensorSpec

from raysearch.training.records import WEIGHTS_FILE

CONFIG_FILE = "best_config.yaml"
MODEL_PATH = "model"  # the artifact folder of a registered model in its trial's run
_BATCH = 1024


class CalibratedClassifier(PythonModel):
    """Network + post-hoc calibrator: inputs (N, *input_shape) -> probabilities (N, K).

    Args:
        model: ``{"name": factory, "num_classes": K, "input_shape": [...], "params": {...}}``,
            what :func:`raysearch.training.models.build_model` takes.
        calibrator: a fitted calibrator with ``predict_proba(logits) -> (N, K)``, or None
            (softmax of the logits).
        calibrator_name: its name (``ts``, ``cts``, ..., ``none``), for the model's metadata.
    """

    def __init__(self, model: dict[str, Any], calibrator: Any, calibrator_name: str) -> None:
        self.model_spec = model
        self.calibrator = calibrator
        self.calibrator_name = calibrator_name
        self._net: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_net"] = None  # rebuilt from the weights artifact by load_context
        return state

    def load_context(self, context: Any) -> None:
        """Rebuild the network and load the trial's weights (``weights_only=True``)."""
        import torch

        from raysearch.training.models import build_model

        spec = self.model_spec
        net = build_model(spec["name"], num_classes=int(spec["num_classes"]),
                          input_shape=tuple(spec["input_shape"]), **spec.get("params", {}))
        state = torch.load(context.artifacts["weights"], weights_only=True, map_location="cpu")
        net.load_state_dict(state)
        self._net = net.eval()

    def logits(self, x: Any) -> np.ndarray:
        """(N, K) float64 logits of inputs `x` (N, *input_shape), in batches, on the CPU."""
        import torch

        from raysearch.training.models import output_logits

        shape = tuple(self.model_spec["input_shape"])
        x = np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x, dtype=np.float32)
        if tuple(x.shape[1:]) != shape:
            raise ValueError(f"inputs of shape {tuple(x.shape)}; the model takes (N, "
                             f"{', '.join(map(str, shape))})")
        out = []
        with torch.no_grad():
            for start in range(0, len(x), _BATCH):
                batch = torch.from_numpy(x[start:start + _BATCH])
                out.append(output_logits(self._net(batch)).double().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.model_spec["num_classes"]))

    def predict(self, context: Any, model_input: np.ndarray,
                params: dict[str, Any] | None = None) -> np.ndarray:
        """Calibrated probabilities (N, K), float64, rows summing to 1, of inputs (N, *shape)."""
        logits = self.logits(model_input)
        if self.calibrator is None:
            shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
            return shifted / shifted.sum(axis=1, keepdims=True)
        return np.asarray(self.calibrator.predict_proba(logits), dtype=np.float64)


def signature(input_shape: tuple[int, ...], num_classes: int) -> ModelSignature:
    """Inputs float32 (-1, *input_shape) -> probabilities float64 (-1, K)."""
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, *input_shape))]),
        outputs=Schema([TensorSpec(np.dtype(np.float64), (-1, num_classes))]))


def save_calibrated_model(path: str | Path, *, model: dict[str, Any], weights: dict[str, Any],
                          calibrator: Any, calibrator_name: str,
                          export: dict[str, Any]) -> Path:
    """Save the pyfunc model to folder `path` (which must not exist): ``mlflow.pyfunc.load_model``.

    Args:
        path: the model's folder.
        model: the network's factory, classes, input shape and keyword arguments
            (:class:`CalibratedClassifier`).
        weights: its state dict (tensors).
        calibrator: the fitted calibrator, or None.
        calibrator_name: its name.
        export: the exported document (:func:`raysearch.tracking.best_config_document`), saved
            as ``best_config.yaml``.

    Returns:
        `path`.
    """
    import torch

    import raysearch

    path = Path(path)
    with tempfile.TemporaryDirectory() as d:
        torch.save(weights, Path(d) / WEIGHTS_FILE)
        (Path(d) / CONFIG_FILE).write_text(yaml.safe_dump(export, sort_keys=False))
        mlflow.pyfunc.save_model(
            str(path), python_model=CalibratedClassifier(model, calibrator, calibrator_name),
            artifacts={"weights": str(Path(d) / WEIGHTS_FILE),
                       "config": str(Path(d) / CONFIG_FILE)},
            signature=signature(tuple(model["input_shape"]), int(model["num_classes"])),
            input_example=np.zeros((1, *model["input_shape"]), dtype=np.float32),
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}",
                              f"mlflow=={mlflow.__version__}", f"numpy=={np.__version__}",
                              f"raysearch=={raysearch.__version__}"],
            metadata={"calibrator": calibrator_name, "sweep": export.get("sweep", ""),
                      "trial": export.get("trial", ""),
                      "model": json.dumps({k: v for k, v in model.items() if k != "params"})})
    return path


def register_calibrated_model(client: MlflowClient, run_id: str, model_name: str,
                              **saved: Any) -> Any:
    """Log the pyfunc model into the trial's run (``model/``) and register it as `model_name`.

    Args:
        client: client of the sweep's store (its registry is the store's own).
        run_id: the selected trial's child run.
        model_name: the registered model's name (created if new; each call adds a version).
        **saved: as :func:`save_calibrated_model`.

    Returns:
        The ``ModelVersion`` (``.version``; load it with ``models:/<model_name>/<version>``).
    """
    with tempfile.TemporaryDirectory() as d:
        folder = save_calibrated_model(Path(d) / MODEL_PATH, **saved)
        client.log_artifacts(run_id, str(folder), MODEL_PATH)
    mlflow.set_tracking_uri(client.tracking_uri)
    mlflow.set_registry_uri(client.tracking_uri)
    return mlflow.register_model(f"runs:/{run_id}/{MODEL_PATH}", model_name)
