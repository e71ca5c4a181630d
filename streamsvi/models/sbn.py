"""One-layer sigmoid belief net with a recognition model (seed 001 §4.3).

Generative model, binary data y ∈ {0, 1}^D and binary hidden units x ∈ {0, 1}^K::

    p(x) uniform,   p(y_d = 1 | x) = σ(w_dᵀ x̃),  x̃ = (x, 1)

Recognition model (the variational distribution of each image)::

    q_V(x | y) = Π_k σ(v_kᵀ ỹ)^{x_k} (1 − σ(v_kᵀ ỹ))^{1 − x_k},  ỹ = (y, 1)

Lower bound per image (seed 001 eq. 18): F_i = E_q[log p(y_i | x)] − K log 2 + H[q(x | y_i)].
W and V are point estimates (as in the paper). Gradients:

* W: one sample x ~ q per image, ∇_W log p(y | x, W) = (y − σ(W x̃)) x̃ᵀ (the paper's choice).
* V by LeGrad (eq. 19): for each k, the exact sum over x_k ∈ {0, 1} with the other
  units at the pivot sample: σ_k(1 − σ_k) [f(x_k = 1) − f(x_k = 0) + log((1 − σ_k)/σ_k)] ỹ.
* V by LdGrad: S samples, (1/S) Σ_s [log p(y, x_s) − log q(x_s | y)] (x_s − σ) ỹᵀ, no
  control variate; S = K by default, the number of f evaluations LeGrad makes.

ReGrad does not apply: the hidden units are discrete.

This model is trained in memory (:meth:`SigmoidBeliefNet.fit`, Adam on W and V): it is
the paper's third experiment (``bench/legrad.py --only sbn``), not a daemon model
(its recognition weights are per-model, not a Gaussian q over global weights).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import expit, log_expit

__all__ = ["SigmoidBeliefNet"]


class SigmoidBeliefNet:
    """Sigmoid belief net with K binary hidden units and a sigmoid recognition net.

    Parameters
    ----------
    n_visible, n_hidden : int
        D and K.
    estimator : {"legrad", "ldgrad"}
        Gradient of the recognition weights V.
    n_samples : int or None
        LdGrad's S (default K).
    seed : int
    """

    def __init__(self, n_visible: int, n_hidden: int = 200, estimator: str = "legrad",
                 n_samples: int | None = None, seed: int = 0):
        if estimator not in ("legrad", "ldgrad"):
            raise ValueError(f"estimator must be 'legrad' or 'ldgrad' (ReGrad needs continuous latents), "
                             f"got {estimator!r}")
        self.D, self.K = int(n_visible), int(n_hidden)
        self.estimator = estimator
        self.n_samples = int(n_samples) if n_samples is not None else self.K
        self.rng = np.random.default_rng(seed)
        self.W = 0.01 * self.rng.standard_normal((self.D, self.K + 1))
        self.V = 0.01 * self.rng.standard_normal((self.K, self.D + 1))

    @staticmethod
    def _tilde(a):
        return np.column_stack([a, np.ones(a.shape[0])])

    def _loglik(self, X, Y):
        """log p(y | x) per row, X (n, K), Y (n, D)."""
        A = self._tilde(X) @ self.W.T
        return np.sum(log_expit((2 * Y - 1) * A), axis=1)

    def bound(self, Y, rng=None) -> np.ndarray:
        """One-sample estimate of F_i per image."""
        rng = rng or self.rng
        s = expit(self._tilde(Y) @ self.V.T)
        X = (rng.random(s.shape) < s).astype(float)
        ent = -np.sum(s * np.log(np.clip(s, 1e-300, 1)) + (1 - s) * np.log(np.clip(1 - s, 1e-300, 1)), axis=1)
        return self._loglik(X, Y) - self.K * math.log(2) + ent

    def gradients(self, Y):
        """(∂W, ∂V) of the mean bound over the rows of Y."""
        n = Y.shape[0]
        Yt = self._tilde(Y)
        s = expit(Yt @ self.V.T)                                   # (n, K)
        X = (self.rng.random(s.shape) < s).astype(float)
        Xt = self._tilde(X)
        A = Xt @ self.W.T                                          # (n, D)
        gW = (Y - expit(A)).T @ Xt / n
        sgn = 2 * Y - 1
        logit_s = np.log(np.clip(s, 1e-300, 1)) - np.log(np.clip(1 - s, 1e-300, 1))
        if self.estimator == "legrad":
            coef = np.empty((n, self.K))
            Wk = self.W[:, :self.K]                                # (D, K)
            for i in range(n):                                     # f(x_k = 1) − f(x_k = 0), every k
                a1 = A[i][None, :] + ((1 - X[i]) [:, None]) * Wk.T  # x_k set to 1
                a0 = A[i][None, :] - (X[i][:, None]) * Wk.T         # x_k set to 0
                coef[i] = np.sum(log_expit(sgn[i] * a1) - log_expit(sgn[i] * a0), axis=1)
            G = s * (1 - s) * (coef - logit_s)
        else:
            S = self.n_samples
            G = np.zeros((n, self.K))
            logq_const = np.log(np.clip(1 - s, 1e-300, 1))
            for _ in range(S):
                Xs = (self.rng.random(s.shape) < s).astype(float)
                f = (self._loglik(Xs, Y) - self.K * math.log(2)
                     - np.sum(Xs * logit_s + logq_const, axis=1))     # log p(y, x) − log q(x | y)
                G += f[:, None] * (Xs - s)
            G /= S
        gV = G.T @ Yt / n
        return gW, gV

    def fit(self, Y, n_iter: int, batch_size: int = 100, learning_rate: float = 0.01, eval_every: int = 25):
        """Adam on (W, V); returns [(iteration, mean bound on all of Y)] every ``eval_every``."""
        Y = np.asarray(Y, float)
        m = [np.zeros_like(self.W), np.zeros_like(self.V)]
        v = [np.zeros_like(self.W), np.zeros_like(self.V)]
        b1, b2, eps = 0.9, 0.999, 1e-8
        eval_rng = np.random.default_rng(12345)
        hist = [(0, float(np.mean(self.bound(Y, eval_rng))))]
        for t in range(1, n_iter + 1):
            idx = self.rng.choice(Y.shape[0], size=batch_size, replace=False)
            grads = self.gradients(Y[idx])
            for j, (P, g) in enumerate(zip((self.W, self.V), grads)):
                m[j] = b1 * m[j] + (1 - b1) * g
                v[j] = b2 * v[j] + (1 - b2) * g * g
                P += learning_rate * (m[j] / (1 - b1 ** t)) / (np.sqrt(v[j] / (1 - b2 ** t)) + eps)
            if t % eval_every == 0 or t == n_iter:
                hist.append((t, float(np.mean(self.bound(Y, eval_rng)))))
        return hist
