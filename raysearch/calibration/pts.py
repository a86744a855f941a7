r"""Parameterized temperature scaling: ``pts`` (Tomani et al.) and ``pts_sctl`` (Jung et al.'s).

.. math::

    p_n = \mathrm{softmax}(z_n / T_n), \qquad \log T_n = h_\theta(\mathrm{sort}_s(z_n))

``pts``: Tomani, Cremers and Buettner, "Parameterized Temperature Scaling for Boosting the
Expressive Power in Post-Hoc Uncertainty Calibration", ECCV 2022, arXiv:2102.12182; released
code tochris/pts-uncertainty, ``pts_calibrator.py`` (``PTS_calibrator``, TensorFlow/Keras).
:math:`\mathrm{sort}_s` keeps the s = min(``top_k``, K) largest logits in descending order.
Choices, and where they differ from the released code:

* objective: MSE by DEFAULT, because the released model is compiled with Keras'
  ``MeanSquaredError`` on one-hot labels (ours sums over K instead of averaging: same
  minimiser); ``loss="nll"`` is what Jung et al. (ICML 2023) train their PTS baseline with;
* architecture: ``n_layers`` hidden ReLU layers of ``n_nodes`` units on the top ``top_k``
  logits (the released class takes all three as required arguments, with no defaults; 2, 5
  and 10 here); the output is :math:`\log T_n` (released: :math:`|T_n|` clipped to
  [1e-12, 1e12]), so T is positive and smooth;
* input: the sorted top-s logits minus the row maximum (the released code feeds raw logits
  clipped to ±100), standardised with the calibration set's mean and std. Softmax ignores a
  per-row shift, so this makes PTS give the same result on raw logits and on ``log p``;
* start: the MLP starts as temperature scaling (last layer weights 0, its bias the log of the
  TS temperature fitted with the same objective), so training can only refine TS;
* training: full-batch Adam (lr ``lr``, ``weight_decay``) for a fixed ``steps`` with a seeded
  initialisation (the released code: Keras ``fit`` with a user-given batch size, learning rate
  and number of epochs, L2 kernel regularisation). Deterministic on CPU for a given torch
  version and thread count. Cost: ``steps`` passes over the (N, K) logits (about 2 ms per
  step for (5000, 10) on one thread); on a busy machine call ``torch.set_num_threads(1)``
  first, as the Ray trainable does.

Rank preserving: one positive temperature per sample keeps the order within the sample.

``pts_sctl`` (:class:`SCTLParameterizedTemperatureScaling`) is the PTS baseline of Jung et al.,
"Scaling of Class-wise Training Losses for Post-hoc Calibration", ICML 2023, as their released
code builds it (SeungjinJung/SCTL, ``models/scaler.py``, ``parameterized_temperature_scaler``;
``models/optimizer.py``, ``adam``; ``models/__init__.py``, ``calibrator``): an MLP
10 → 2 → 2 → 2 → 2 → 1 (four hidden ReLU layers of two units) on the top-10 sorted RAW logits,
its output used directly as :math:`T_n` (:math:`z_n / T_n`, no log, no absolute value), torch's
default initialisation after ``torch.manual_seed(1)``, NLL, full-batch Adam with lr 0.02 for
1000 steps and no weight decay (the paper's Sec. 5.3 says 0.002; the code passes none). It is
what their Tables 1-2 report as "PTS". Use it to reproduce those rows; ``pts`` is the method of
Tomani et al.
"""

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from raysearch.calibration._checks import validate_int, validate_number
from raysearch.calibration.base import Calibrator, is_separable
from raysearch.calibration.objectives import CalibrationObjective
from raysearch.calibration.temperature import TemperatureScaling, degenerate_message

__all__ = ["ParameterizedTemperatureScaling", "SCTLParameterizedTemperatureScaling"]

#: Bounds of log T_n, a safety net against overflow (T in [1e-3, 1e3]).
_LOG_T_LIMIT = math.log(1e3)


class _TemperatureNet(nn.Module):
    """MLP from standardised sorted top-s logits to log T."""

    def __init__(self, n_inputs: int, n_layers: int, n_nodes: int, generator: torch.Generator):
        super().__init__()
        layers: list[nn.Module] = []
        width = n_inputs
        for _ in range(n_layers):
            linear = nn.Linear(width, n_nodes, dtype=torch.float64)
            bound = 1.0 / math.sqrt(width)  # PyTorch's default init, from our generator
            with torch.no_grad():
                linear.weight.uniform_(-bound, bound, generator=generator)
                linear.bias.uniform_(-bound, bound, generator=generator)
            layers += [linear, nn.ReLU()]
            width = n_nodes
        self.hidden = nn.Sequential(*layers)
        self.out = nn.Linear(width, 1, dtype=torch.float64)
        with torch.no_grad():
            self.out.weight.zero_()
            self.out.bias.zero_()

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        log_t = self.out(self.hidden(features))[:, 0]
        return log_t.clamp(-_LOG_T_LIMIT, _LOG_T_LIMIT)


class ParameterizedTemperatureScaling(Calibrator):
    """Parameterized temperature scaling ``pts`` (see the module docstring).

    Args:
        objective (CalibrationObjective): the training objective (``fit_calibrator`` default:
            ``mse``, the released code's loss; ``nll`` is Jung et al.'s).
        inputs (str, optional): ``"logits"`` or ``"probs"``. Defaults to ``"logits"``.
        top_k (int, optional): number s of sorted logits fed to the MLP, capped at K.
            Defaults to ``10``.
        n_layers (int, optional): hidden layers >= 0. Defaults to ``2``.
        n_nodes (int, optional): units per hidden layer >= 1. Defaults to ``5``.
        steps (int, optional): full-batch Adam steps >= 1. Defaults to ``300``.
        lr (float, optional): Adam learning rate > 0. Defaults to ``0.005``.
        weight_decay (float, optional): Adam weight decay >= 0 (Jung et al.: 0.002; released
            code: a Keras L2 regulariser). Defaults to ``0.0``.
        seed (int, optional): seed of the MLP initialisation. Defaults to ``0``.

    Attributes:
        degenerate (bool): after ``fit``, True when the temperature scaling it starts from
            stopped at its lower bound on a perfectly classified calibration set (no finite
            optimum; the per-sample temperatures are clamped to [1e-3, 1e3]).

    Shape:
        logits: (N, K) float; labels: (N,) int in [0, K).

    Raises:
        ValueError: if a parameter is out of range.
        TypeError: if an integer parameter is not an integer.
    """

    name = "pts"
    rank_preserving = True
    default_objective = "mse"

    def __init__(
        self,
        objective: CalibrationObjective,
        *,
        inputs: str = "logits",
        top_k: int = 10,
        n_layers: int = 2,
        n_nodes: int = 5,
        steps: int = 300,
        lr: float = 0.005,
        weight_decay: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__(objective, inputs=inputs)
        self.top_k = validate_int("top_k", top_k, minimum=1)
        self.n_layers = validate_int("n_layers", n_layers, minimum=0)
        self.n_nodes = validate_int("n_nodes", n_nodes, minimum=1)
        self.steps = validate_int("steps", steps, minimum=1)
        self.lr = validate_number("lr", lr, minimum=0.0, minimum_inclusive=False)
        self.weight_decay = validate_number("weight_decay", weight_decay, minimum=0.0)
        self.seed = validate_int("seed", seed, minimum=0)
        self._net: _TemperatureNet | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._feature_mean = np.zeros(0)
        self._feature_std = np.ones(0)
        self.losses_: list[float] = []
        self._ts_temperature = 1.0
        self._ts_at_bound = ""
        self._temperature_stats = (float("nan"),) * 3

    # ---------------------------------------------------------------- helpers

    def _n_inputs(self, k: int) -> int:
        return min(self.top_k, k)

    def _raw_features(self, z: np.ndarray) -> np.ndarray:
        s = self._n_inputs(z.shape[1])
        top = -np.sort(-z, axis=1)[:, :s] if s < z.shape[1] else -np.sort(-z, axis=1)
        return top - top[:, :1]  # minus the row maximum

    def _features(self, z: np.ndarray) -> torch.Tensor:
        x = (self._raw_features(z) - self._feature_mean) / self._feature_std
        return torch.from_numpy(np.ascontiguousarray(x))

    def _log_temperatures(self, features: torch.Tensor) -> torch.Tensor:
        if self._net is None:
            raise RuntimeError("PTS network is not built; call fit first")
        return self._net(features)

    def _logit_tensor(self, z: np.ndarray) -> torch.Tensor:
        """The (N, K) logits as the tensor :meth:`_log_probs` takes."""
        return torch.from_numpy(z)

    def _log_probs(self, z_t: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        log_t = self._log_temperatures(features)
        return torch.log_softmax(z_t * torch.exp(-log_t)[:, None], dim=1)

    def _adam_steps(
        self, z: np.ndarray, steps: int, loss_fn: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``steps`` Adam steps on ``loss_fn`` of the (N, K) log-probabilities; the features."""
        if self._optimizer is None:
            raise RuntimeError("PTS optimiser is not built; call fit first")
        z_t, features = self._logit_tensor(z), self._features(z)
        for _ in range(steps):
            self._optimizer.zero_grad()
            loss = loss_fn(self._log_probs(z_t, features))
            loss.backward()
            self._optimizer.step()
            self.losses_.append(float(loss.detach()))
        return features

    # ---------------------------------------------------------------- hooks

    def _reset(self, z, y):
        raw = self._raw_features(z)
        self._feature_mean = raw.mean(axis=0)
        std = raw.std(axis=0)
        self._feature_std = np.where(std > 1e-12, std, 1.0)
        generator = torch.Generator().manual_seed(self.seed)
        self._net = _TemperatureNet(raw.shape[1], self.n_layers, self.n_nodes, generator)
        # start as temperature scaling fitted with the same objective
        ts = TemperatureScaling(self.objective, inputs="logits")
        ts._reset(z, y)
        ts._fit_with_coef(z, y, None)
        self._ts_temperature = math.exp(ts._log_t)
        self._ts_at_bound = ts.fit_info_.get("at_bound", "")
        with torch.no_grad():
            self._net.out.bias.fill_(ts._log_t)
        self._optimizer = torch.optim.Adam(
            self._net.parameters(), lr=self.lr, weight_decay=self.weight_decay
        )
        self.losses_ = []

    def _fit_with_coef(self, z, y, class_coef):
        loss_fn = self.objective.torch_objective(y, class_coef)
        self._record_temperatures(self._adam_steps(z, self.steps, loss_fn))

    def _record_temperatures(self, features: torch.Tensor) -> None:
        with torch.no_grad():
            temperatures = torch.exp(self._log_temperatures(features))
        self._temperature_stats = (
            float(temperatures.mean()),
            float(temperatures.min()),
            float(temperatures.max()),
        )

    def _first_iteration(self, z, y, class_coef):
        self._adam_steps(z, 1, self.objective.torch_objective(y, class_coef))

    def _fit_classwise(self, z, y, coef_fn, *, max_rounds, tol):
        """Adam with the class weights recomputed from the detached class losses every step.

        This is exactly the released class-wise scaling code's loop (for an Adam-trained
        calibrator no fixed-point rounds are needed): after the first iteration (one step,
        taken by the wrapper) ``steps - 1`` steps follow, so ``steps`` is the total as in the
        released code. ``max_rounds`` and ``tol`` are unused.
        """
        y_t = torch.from_numpy(y.astype(np.int64))
        k = z.shape[1]

        def loss_fn(log_p):
            class_losses = self.objective.torch_class_losses(log_p, y_t, k)
            coef = coef_fn(class_losses.detach().numpy().copy())
            return (torch.as_tensor(coef, dtype=torch.float64) * class_losses).sum()

        self._record_temperatures(self._adam_steps(z, self.steps - 1, loss_fn))
        return {"rounds": self.steps, "converged": True, "reweighting": "every step"}

    def _is_degenerate(self, z, y):
        """Whether the TS fit it starts from stopped at its lower bound on a separable set."""
        return self._ts_at_bound == "lower" and is_separable(z, y)

    def _predict_log_proba(self, z):
        with torch.no_grad():
            log_p = self._log_probs(self._logit_tensor(z), self._features(z))
        return np.ascontiguousarray(log_p.numpy())

    def temperatures(self, logits: Any) -> np.ndarray:
        """Per-sample temperatures T_n of (N, K) logits (probabilities when inputs="probs").

        Raises:
            RuntimeError: if called before ``fit``.
        """
        z = self._prepare_predict(logits)
        with torch.no_grad():
            return np.exp(self._log_temperatures(self._features(z)).numpy())

    def _params(self):
        return {
            "top_k": self._n_inputs(int(self.n_classes_ or self.top_k)),
            "n_layers": self.n_layers,
            "n_nodes": self.n_nodes,
            "steps": self.steps,
            "lr": self.lr,
            "weight_decay": self.weight_decay,
            "seed": self.seed,
            "ts_temperature_start": self._ts_temperature,
            # per-sample temperatures on the calibration set
            "temperature_mean": self._temperature_stats[0],
            "temperature_min": self._temperature_stats[1],
            "temperature_max": self._temperature_stats[2],
            "final_loss": self.losses_[-1] if self.losses_ else float("nan"),
        }


def _torch_default_linear(n_in: int, n_out: int, generator: torch.Generator) -> nn.Linear:
    """A float64 ``nn.Linear`` holding torch's default initialisation drawn from ``generator``.

    ``nn.Linear.reset_parameters``: weight by ``kaiming_uniform_(a=sqrt(5))``, then bias
    uniform in ±1/sqrt(fan_in). The draws are made in float32, as ``nn.Linear(n_in, n_out)``
    makes them, so the same generator state gives the released code's numbers bit for bit;
    the global RNG is left alone.
    """
    weight = torch.empty(n_out, n_in)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
    bias = torch.empty(n_out)
    bound = 1.0 / math.sqrt(n_in)
    nn.init.uniform_(bias, -bound, bound, generator=generator)
    linear = nn.utils.skip_init(nn.Linear, n_in, n_out, dtype=torch.float64)
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    return linear


def _sctl_network(n_inputs: int, n_layers: int, n_nodes: int, seed: int) -> nn.Sequential:
    """The released MLP: ``n_layers`` (Linear, ReLU) pairs, then Linear(., 1), seeded init."""
    generator = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    width = n_inputs
    for _ in range(n_layers):
        layers += [_torch_default_linear(width, n_nodes, generator), nn.ReLU()]
        width = n_nodes
    layers.append(_torch_default_linear(width, 1, generator))
    return nn.Sequential(*layers)


class SCTLParameterizedTemperatureScaling(ParameterizedTemperatureScaling):
    r"""Jung et al.'s PTS baseline (``pts_sctl``): :math:`p_n = \mathrm{softmax}(z_n / T_n)`.

    :math:`T_n = h_\theta(\mathrm{sort}_s(z_n))`, the raw output of an MLP on the s =
    min(``top_k``, K) largest RAW logits in descending order (no shift, no standardisation, no
    log, no absolute value): the re-implementation of PTS in the released code of Jung et al.,
    ICML 2023 (module docstring), whose numbers their Tables 1-2 report as "PTS". Defaults are
    the released ones: four hidden ReLU layers of two units, top 10 logits, torch's default
    initialisation from seed 1 (bit for bit the released network: the released code seeds the
    global RNG with ``torch.manual_seed(1)`` right before building it; here a private
    generator is used), NLL, full-batch Adam with lr 0.02 for 1000 steps, no weight decay.
    The released code runs in float32 on a GPU, here float64 on the CPU; on the CIFAR-10-LT
    outputs of Table 2 both give the published ECE to the hundredth (DenseNet-40 6.10,
    ResNet-110 5.90; with class-wise scaling 3.13 and 3.47).

    With these defaults the four narrow ReLU layers can die during training (on the
    DenseNet-40 outputs every unit of the third hidden layer is inactive after 1000 steps),
    and :math:`T_n` then ends as one constant, the NLL temperature: such "PTS" rows equal
    temperature scaling.

    Differences from the released code: K < 10 is allowed (s = K inputs; the released network
    needs 10), and fitting raises ``FloatingPointError`` when the training loss stops being
    finite (a :math:`T_n` of 0, or an MLP that overflows), where the released code would go
    on with NaN.

    Not rank preserving in general: :math:`T_n` is not constrained positive (predictions
    only change where some :math:`T_n < 0`). Not invariant to a per-row shift of the logits
    (the MLP sees raw logits), so ``inputs="probs"`` differs from the network's logits.

    The arguments ``inputs``, ``top_k``, ``n_layers``, ``n_nodes``, ``steps``, ``lr``,
    ``weight_decay`` and ``seed`` are those of :class:`ParameterizedTemperatureScaling`
    (``n_layers`` counts ReLU layers), with the released defaults ``"logits"``, ``10``, ``4``,
    ``2``, ``1000``, ``0.02``, ``0.0`` and ``1``.

    Args:
        objective (CalibrationObjective): the training objective (default ``nll``, the
            released code's ``nn.CrossEntropyLoss``).

    Attributes:
        degenerate (bool): after ``fit``, True when the calibration set is perfectly classified
            and temperature scaling with the same objective has no finite optimum there.

    Shape:
        as :class:`ParameterizedTemperatureScaling`.

    Raises:
        ValueError, TypeError: as :class:`ParameterizedTemperatureScaling`.
        FloatingPointError: in ``fit``, if the training loss becomes NaN or infinite.
    """

    name = "pts_sctl"
    rank_preserving = False
    default_objective = "nll"

    def __init__(
        self,
        objective: CalibrationObjective,
        *,
        inputs: str = "logits",
        top_k: int = 10,
        n_layers: int = 4,
        n_nodes: int = 2,
        steps: int = 1000,
        lr: float = 0.02,
        weight_decay: float = 0.0,
        seed: int = 1,
    ) -> None:
        super().__init__(
            objective,
            inputs=inputs,
            top_k=top_k,
            n_layers=n_layers,
            n_nodes=n_nodes,
            steps=steps,
            lr=lr,
            weight_decay=weight_decay,
            seed=seed,
        )
        self._sctl_net: nn.Sequential | None = None

    def _raw_features(self, z: np.ndarray) -> np.ndarray:
        return -np.sort(-z, axis=1)[:, : self._n_inputs(z.shape[1])]

    def _features(self, z: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(self._raw_features(z)))

    def _temperature_tensor(self, features: torch.Tensor) -> torch.Tensor:
        if self._sctl_net is None:
            raise RuntimeError("PTS network is not built; call fit first")
        return self._sctl_net(features)[:, 0]

    def _logit_tensor(self, z: np.ndarray) -> torch.Tensor:
        """The logits transposed, (K, N) contiguous: softmax over K then runs along N.

        With K small (10 on CIFAR-10) a softmax over the last dimension of (N, K) is several
        times slower than over the first dimension of (K, N), in the forward and the backward
        pass alike; the values are the same softmax of :math:`z_n / T_n`.
        """
        return torch.from_numpy(np.ascontiguousarray(z.T))

    def _log_probs(self, z_t: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """(N, K) log-probabilities (a transposed view) of the (K, N) logits ``z_t``."""
        return torch.log_softmax(z_t / self._temperature_tensor(features), dim=0).T

    def _reset(self, z, y):
        self._sctl_net = _sctl_network(
            self._n_inputs(z.shape[1]), self.n_layers, self.n_nodes, self.seed
        )
        self._optimizer = torch.optim.Adam(
            self._sctl_net.parameters(), lr=self.lr, weight_decay=self.weight_decay
        )
        self.losses_ = []

    def _record_temperatures(self, features: torch.Tensor) -> None:
        if not np.isfinite(self.losses_).all():
            raise FloatingPointError(
                "pts_sctl: the training loss became NaN or infinite (a per-sample temperature "
                "of 0, or logits too large for the MLP to stay finite)"
            )
        with torch.no_grad():
            temperatures = self._temperature_tensor(features)
        self._temperature_stats = (
            float(temperatures.mean()),
            float(temperatures.min()),
            float(temperatures.max()),
        )

    def _is_degenerate(self, z, y):
        """Whether the objective has no finite optimum: TS with it is degenerate on this set.

        Only a separable set is tried (one TS fit, a few passes over the logits); the
        ``UserWarning`` names ``pts_sctl``.
        """
        if not is_separable(z, y):
            return False
        ts = TemperatureScaling(self.objective, inputs="logits")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ts._reset(z, y)
            ts._fit_with_coef(z, y, None)
        if not ts._is_degenerate(z, y):
            return False
        warnings.warn(degenerate_message(
            "pts_sctl", "the per-sample temperatures have no finite optimum either"),
            UserWarning, stacklevel=3)
        return True

    def temperatures(self, logits: Any) -> np.ndarray:
        """Per-sample temperatures T_n (the MLP's raw output; may be <= 0).

        Raises:
            RuntimeError: if called before ``fit``.
        """
        z = self._prepare_predict(logits)
        with torch.no_grad():
            return self._temperature_tensor(self._features(z)).numpy()

    def _params(self):
        params = super()._params()
        del params["ts_temperature_start"]
        return params
