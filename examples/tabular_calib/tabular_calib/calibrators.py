"""Vector scaling (Guo et al., ICML 2017, Sec. 4.2): softmax(w * z + b), fitted by NLL."""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from scipy.special import log_softmax, softmax


class VectorScaling:
    """One weight and one bias per class, fitted on held-out logits by L-BFGS.

    raysearch's calibrator contract: keyword hyperparameters, ``fit(logits, labels)``,
    ``predict_proba(logits) -> (N, K)`` probabilities.
    """

    def __init__(self, l2: float = 1e-3) -> None:
        self.l2 = l2
        self.w: np.ndarray | None = None
        self.b: np.ndarray | None = None

    def fit(self, logits: np.ndarray, labels: np.ndarray) -> VectorScaling:
        """Fit w and b on (N, K) logits and (N,) int labels; returns self."""
        logits = np.asarray(logits, dtype=np.float64)
        labels = np.asarray(labels)
        k = logits.shape[1]

        def loss(theta: np.ndarray) -> float:
            w, b = theta[:k], theta[k:]
            log_p = log_softmax(logits * w + b, axis=1)
            nll = -log_p[np.arange(len(labels)), labels].mean()
            return nll + self.l2 * float(np.sum((w - 1) ** 2) + np.sum(b ** 2))

        theta = minimize(loss, np.concatenate([np.ones(k), np.zeros(k)]), method="L-BFGS-B").x
        self.w, self.b = theta[:k], theta[k:]
        return self

    def predict_proba(self, logits: np.ndarray) -> np.ndarray:
        """(N, K) float64 probabilities of (N, K) logits; rows sum to 1."""
        if self.w is None:
            raise RuntimeError("VectorScaling is not fitted: call fit() first")
        return softmax(np.asarray(logits, dtype=np.float64) * self.w + self.b, axis=1)
