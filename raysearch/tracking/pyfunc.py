"""A sweep's selected trial as an MLflow pyfunc model: its weights and its fitted calibrator.

:class:`CalibratedClassifier` is what ``raysearch export NAME --register MODEL`` registers and
``--with-weights -o DIR`` saves: ``mlflow.pyfunc.load_model(uri).predict(x)`` maps an array of
inputs (N, *input_shape) to calibrated probabilities (N, K) whose rows sum to 1. The network
takes float32: float64, integer and boolean inputs are cast to it (a copy, batch by batch). The
model's signature declares its outputs, float64 (-1, K), and no input schema, because MLflow
refuses any dtype but a tensor schema's own before the model sees the input; the input's dtype
and shape are in the model's metadata (``input``) and in its input example. ``mlflow models
serve`` answers ``POST /invocations`` with ``{"inputs": [...]}`` alike.

The network is rebuilt at load time from its factory (a built-in name, ``torchvision:<name>``
or the import string of a user's factory, which must import where the model is loaded), its
keyword arguments and the data's shape, then gets the trial's final weights (``weights.pt``, a
state dict read with ``torch.load(weights_only=True)``). The fitted post-hoc calibrator
(temperature scaling by default; any of :func:`raysearch.calibration.available_calibrators`,
or ``none``) travels pickled inside the model, as MLflow pickles every pyfunc ``PythonModel``;
the run's exported config is the artifact ``best_config.yaml``. The model's pip requirements
and code are :func:`raysearch.tracking.export.model_environment`'s: raysearch as it is installed
(a direct reference to its folder for a source install) and the packages of the user's factory
and calibrator (their distributions, or the package folder itself as MLflow ``code_paths``).

It imports :mod:`raysearch.training.models`; the interface layer (:func:`raysearch.api.export`)
calls it.
"""

from __future__ import annotations

import json
import shutil
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

from raysearch.tracking.export import model_environment
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
        """(N, K) float64 logits of inputs `x` (N, *input_shape), in batches, on the CPU.

        `x` is an array, a nested list or a DataFrame of numbers; float64, integer and boolean
        values are cast to float32 (a writable copy of each batch).

        Raises:
            ValueError: one line, for inputs that are not numbers or not (N, *input_shape).
        """
        import torch

        from raysearch.training.models import output_logits

        shape = tuple(self.model_spec["input_shape"])
        x = np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x)
        if x.dtype.kind not in "fiub":
            raise ValueError(f"inputs must be numbers (float32, or float64/integers cast to "
                             f"float32), got dtype {x.dtype}")
        if tuple(x.shape[1:]) != shape:
            raise ValueError(f"inputs of shape {tuple(x.shape)}; the model takes (N, "
                             f"{', '.join(map(str, shape))})")
        out = []
        with torch.no_grad():
            for start in range(0, len(x), _BATCH):
                batch = torch.from_numpy(np.array(x[start:start + _BATCH], dtype=np.float32))
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


def signature(num_classes: int) -> ModelSignature:
    """Probabilities float64 (-1, K); no input schema (inputs are cast by the model)."""
    return ModelSignature(outputs=Schema([TensorSpec(np.dtype(np.float64), (-1, num_classes))]))


def _label(name: Any) -> str:
    """A model factory's name as the metadata records it (a callable by its import string)."""
    from raysearch.registry import object_label

    return name if isinstance(name, str) else object_label(name)


def _copy_code(paths: list[str], folder: Path) -> list[str]:
    """Copies of the user's package folders (or module files) without ``__pycache__``."""
    copies = []
    for path in map(Path, paths):
        target = folder / path.name
        if path.is_dir():
            shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, target)
        copies.append(str(target))
    return copies


def save_calibrated_model(path: str | Path, *, model: dict[str, Any], weights: dict[str, Any],
                          calibrator: Any, calibrator_name: str, export: dict[str, Any],
                          requirements: list[str] | None = None,
                          code_paths: list[str] | None = None,
                          metadata: dict[str, str] | None = None) -> Path:
    """Save the pyfunc model to folder `path` (which must not exist): ``mlflow.pyfunc.load_model``.

    Args:
        path: the model's folder.
        model: the network's factory (a name, an import string or the callable), classes,
            input shape and keyword arguments (:class:`CalibratedClassifier`).
        weights: its state dict (tensors).
        calibrator: the fitted calibrator, or None.
        calibrator_name: its name.
        export: the exported document (:func:`raysearch.tracking.best_config_document`), saved
            as ``best_config.yaml``.
        requirements: the model's pip requirements; None:
            :func:`~raysearch.tracking.export.model_environment`'s for the factory and the
            calibrator.
        code_paths: the user's package folders (or module files) to carry inside the model
            (``code/``, on ``sys.path`` where it is loaded); None: as `requirements`.
        metadata: more entries of the model's metadata (strings).

    Returns:
        `path`.
    """
    import torch

    if requirements is None or code_paths is None:
        wanted, code, _ = model_environment([model["name"], calibrator])
        requirements = wanted if requirements is None else requirements
        code_paths = code if code_paths is None else code_paths
    path = Path(path)
    shape = tuple(int(d) for d in model["input_shape"])
    described = {k: (_label(v) if k == "name" else v) for k, v in model.items() if k != "params"}
    with tempfile.TemporaryDirectory() as d:
        torch.save(weights, Path(d) / WEIGHTS_FILE)
        (Path(d) / CONFIG_FILE).write_text(yaml.safe_dump(export, sort_keys=False))
        (Path(d) / "code").mkdir()
        mlflow.pyfunc.save_model(
            str(path), python_model=CalibratedClassifier(model, calibrator, calibrator_name),
            artifacts={"weights": str(Path(d) / WEIGHTS_FILE),
                       "config": str(Path(d) / CONFIG_FILE)},
            signature=signature(int(model["num_classes"])),
            input_example=np.zeros((1, *shape), dtype=np.float32),
            pip_requirements=list(requirements),
            code_paths=_copy_code(list(code_paths), Path(d) / "code") or None,
            metadata={"calibrator": calibrator_name, "sweep": export.get("sweep", ""),
                      "trial": export.get("trial", ""), "model": json.dumps(described),
                      "input": json.dumps({"dtype": "float32", "shape": [-1, *shape],
                                           "cast": ["float64", "integer", "bool"]}),
                      **(metadata or {})})
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
