"""Stochastic-gradient VI for models that are not conjugate (seed 001, Titsias).

q(w) = Π_i N(w_i | μ_i, σ_i²) over the model's P global weights, stored as
λ = ``NatParams(mean=μ, log_std=log σ)``. The ELBO is

    L(μ, σ) = (N/|S|) Σ_{n∈S} E_q[log p(y_n | w)] − KL(q ‖ p)

(a model without a separate prior, like the Gaussian target, has
L = E_q[log p(w)] + H[q] instead). The KL (or entropy) term and its gradient
are exact; the expected log-likelihood is estimated by one of three
estimators, all unbiased for the same gradient:

``legrad``  local expectation gradients (seed 001 eq. 10, Algorithm 1). Draw
            one pivot w ~ q; for each coordinate i take the exact 1-D
            expectation over w_i ~ N(μ_i, σ_i²) with the other coordinates at the
            pivot, by Gauss–Hermite quadrature with K nodes (K = 5, as in the
            paper): with w_i = μ_i + σ_i z_k, ``∂μ_i ≈ Σ_k π_k f_ik z_k / σ_i`` and
            ``∂log σ_i ≈ Σ_k π_k f_ik (z_k² − 1)``. Cost P·K evaluations of f.
``regrad``  reparameterisation (seed 001 eq. 6): w = μ + σ ε, ∇ f(w) chained
            through; one sample by default (as in the paper).
``ldgrad``  the score function / log-derivative trick (seed 001 eq. 5), no
            control variate, S samples; by default S = P·K, the paper's rule
            that matches LeGrad's cost (S = 500 for the 100-D target, 3925 for
            MNIST's 785 weights).

A step (``step_t = learning_rate · ρ_t``, ρ_t the Robbins–Monro schedule):

``natural`` (default)  the natural gradient of q's Gaussian family, whose Fisher
            information is diag(1/σ²) for μ and 2 for log σ:
            ``μ ← μ + step_t σ² ĝ_μ``, ``log σ ← log σ + step_t ĝ_log σ / 2``,
            clipped to a trust region (|Δμ_i| ≤ 3 σ_i, |Δ log σ_i| ≤ 0.5). At the mean-field
            fixed point σ_i² = 1/(1/v0_i + N E_q[−∂²_i log p]), so σ² ĝ_μ is a Newton
            step and ρ_t ∈ (0, 1] has the same meaning as on the conjugate path:
            no rate to tune for the data-set size.
``sgd``     plain Robbins–Monro: ``v ← v + step_t ĝ / N`` for v = (μ, log σ).
``adam``    Adam (Kingma & Ba 2015) on ĝ / N with step size ``step_t``, its
            moments kept in ``state.aux`` so a checkpoint resumes it exactly
            (an adaptive step, named as such; ``schedule = Constant(1)`` gives
            plain Adam).

The engine has the public surface of :class:`~streamsvi.inference.engine.SVI`
that the daemon, the checkpoints and the scorers use: ``init``, ``update``,
``fit``, ``predictive_logpdf``, ``to_dict``, ``n_total``, ``model``; states
are :class:`~streamsvi.inference.engine.EngineState` and updates report an
:class:`~streamsvi.inference.engine.UpdateInfo` (``grad_variance`` there is
N² tr(Σ̂)/|S|, Σ̂ the sample covariance of the records' gradient
contributions, as on the conjugate path; ``gradient`` is ĝ_t itself).

Examples
--------
>>> import numpy as np
>>> from streamsvi.models.logistic import CorrelatedGaussianTarget
>>> engine = GradientVI(CorrelatedGaussianTarget(), n_total=1, estimator="legrad",
...                     optimizer="adam", learning_rate=0.05, schedule=Constant(1.0))
>>> state, infos = engine.fit(engine.init(None, seed=0), None, n_steps=3000)
>>> bool(abs(np.mean(state.lam["mean"]) - 2.0) < 0.2)   # the optimum: μ = 2
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..models.base import NatParams
from ..models.nonconjugate import gauss_hermite, gaussian_kl
from .engine import EngineState, UpdateInfo
from .schedules import RobbinsMonro, Schedule, schedule_from_dict

__all__ = ["GradientVI", "ESTIMATORS", "OPTIMIZERS", "GradientEstimate"]

ESTIMATORS = ("legrad", "regrad", "ldgrad")
OPTIMIZERS = ("natural", "sgd", "adam")
#: natural-gradient steps are clipped to a trust region: |Δμ_i| ≤ MAX_MEAN_STEP · σ_i
#: and |Δ log σ_i| ≤ MAX_LOG_STD_STEP (a noisy gradient cannot throw q far in one step)
MAX_MEAN_STEP = 3.0
MAX_LOG_STD_STEP = 0.5
_ADAM_B1, _ADAM_B2, _ADAM_EPS = 0.9, 0.999, 1e-8


@dataclass(frozen=True)
class GradientEstimate:
    """One estimate: per-record contributions of Σ_n E_q[log p(y_n|w)] to ∂μ and ∂log σ.

    ``g_mean`` and ``g_log_std`` have shape (n, P); ``loglik`` (n,) is f_n at
    the first sample (for the stochastic ELBO value).
    """

    g_mean: np.ndarray
    g_log_std: np.ndarray
    loglik: np.ndarray


def _check_choice(name, v, choices):
    if v not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {v!r}")
    return v


@dataclass
class GradientVI:
    """Mean-field Gaussian VI by stochastic gradients (LeGrad, ReGrad or LdGrad).

    Parameters
    ----------
    model :
        A non-conjugate model (:mod:`streamsvi.models.nonconjugate`).
    n_total : float
        N, the data-set (or population) size; 1 for a data-free target.
    estimator : {"legrad", "regrad", "ldgrad"}
        The gradient estimator (module docs). Default "legrad".
    n_samples : int or None
        Pivots (legrad), samples (regrad) or samples (ldgrad) per update.
        None: 1, 1 and P·K.
    quadrature_points : int
        K, Gauss–Hermite nodes of LeGrad (default 5, seed 001).
    schedule : Schedule
        ρ_t; default ``RobbinsMonro(tau0=1, kappa=0.7)``.
    learning_rate : float
        Step size multiplier (module docs). Default 1.
    optimizer : {"natural", "sgd", "adam"}
        Robbins–Monro natural-gradient steps (default), plain Robbins–Monro
        steps, or Adam (module docs).
    """

    model: object
    n_total: float
    estimator: str = "legrad"
    n_samples: int | None = None
    quadrature_points: int = 5
    schedule: Schedule = field(default_factory=RobbinsMonro)
    learning_rate: float = 1.0
    optimizer: str = "natural"

    def __post_init__(self):
        if isinstance(self.n_total, bool) or not isinstance(self.n_total, (int, float, np.integer, np.floating)) \
                or not math.isfinite(self.n_total) or self.n_total <= 0:
            raise ValueError(f"n_total must be a finite number > 0, got {self.n_total!r}")
        _check_choice("estimator", self.estimator, ESTIMATORS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.n_samples is not None and (isinstance(self.n_samples, bool) or not isinstance(
                self.n_samples, (int, np.integer)) or self.n_samples < 1):
            raise ValueError(f"n_samples must be an integer >= 1 or None, got {self.n_samples!r}")
        if isinstance(self.quadrature_points, bool) or not isinstance(self.quadrature_points, (int, np.integer)) \
                or self.quadrature_points < 2:
            raise ValueError(f"quadrature_points must be an integer >= 2, got {self.quadrature_points!r}")
        if not isinstance(self.schedule, Schedule):
            raise ValueError(f"schedule must be a Schedule, got {type(self.schedule).__name__}")
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float)) \
                or not math.isfinite(self.learning_rate) or self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
        self._nodes, self._weights = gauss_hermite(self.quadrature_points)

    # ------------------------------------------------------------ settings
    @property
    def samples(self) -> int:
        """The number of samples (pivots) an update draws."""
        if self.n_samples is not None:
            return int(self.n_samples)
        return self.model.n_params * self.quadrature_points if self.estimator == "ldgrad" else 1

    def to_dict(self) -> dict:
        return {"n_total": float(self.n_total), "estimator": self.estimator, "n_samples": self.n_samples,
                "quadrature_points": int(self.quadrature_points), "schedule": self.schedule.to_dict(),
                "learning_rate": float(self.learning_rate), "optimizer": self.optimizer}

    @classmethod
    def from_dict(cls, model, d: dict) -> "GradientVI":
        d = dict(d)
        d["schedule"] = schedule_from_dict(d["schedule"])
        return cls(model, **d)

    # ---------------------------------------------------------------- init
    def init(self, x_init=None, seed: int = 0) -> EngineState:
        """A fresh state: q from ``model.init_params``, step 0 (Adam moments at 0)."""
        rng = np.random.Generator(np.random.PCG64(seed))
        lam = self.model.init_params(rng, None if x_init is None else self.model.check_batch(x_init),
                                     self.n_total)
        aux = None
        if self.optimizer == "adam":
            P = self.model.n_params
            aux = {"adam_m": np.zeros(2 * P), "adam_v": np.zeros(2 * P)}
        return EngineState(step=0, lam=lam, rng_state=rng.bit_generator.state, records_seen=0, aux=aux)

    # ----------------------------------------------------------- estimators
    def estimate(self, lam: NatParams, x, rng: np.random.Generator) -> GradientEstimate:
        """Per-record estimates of ∇ Σ_n E_q[log p(y_n | w)] with this engine's estimator."""
        mu = np.asarray(lam["mean"])
        std = np.exp(np.asarray(lam["log_std"]))
        S = self.samples
        P = mu.shape[0]
        model = self.model
        if self.estimator == "regrad":
            eps = rng.standard_normal((S, P))
            W = mu + std * eps
            G = model.grad_loglik(W, x)                          # (S, n, P)
            g_mean = G.mean(axis=0)
            g_ls = np.einsum("snp,sp->np", G, std * eps) / S
            f = model.loglik(W[:1], x)[0]
            return GradientEstimate(g_mean, g_ls, f)
        if self.estimator == "ldgrad":
            eps = rng.standard_normal((S, P))
            W = mu + std * eps
            F = model.loglik(W, x)                               # (S, n)
            g_mean = (F.T @ eps) / (S * std)
            g_ls = (F.T @ (eps * eps - 1.0)) / S
            return GradientEstimate(g_mean, g_ls, F[0])
        # legrad
        z, pi = self._nodes, self._weights
        g_mean = g_ls = f0 = None
        for s in range(S):
            w = mu + std * rng.standard_normal(P)
            nodes = mu[:, None] + std[:, None] * z[None, :]      # (P, K)
            own = getattr(model, "loglik_coordinate", None)
            if own is not None:
                F = own(w, nodes, x)                             # (n, P, K)
            else:
                F = self._coordinate_by_loglik(w, nodes, x)
            f = model.loglik(w[None, :], x)[0]                   # (n,)
            F = F - f[:, None, None]                             # Σ π z = Σ π (z²−1) = 0: exact shift
            gm = (F @ (pi * z)) / std[None, :]
            gl = F @ (pi * (z * z - 1.0))
            if s == 0:
                g_mean, g_ls, f0 = gm, gl, f
            else:
                g_mean, g_ls = g_mean + gm, g_ls + gl
        return GradientEstimate(g_mean / S, g_ls / S, f0)

    def _coordinate_by_loglik(self, w, nodes, x) -> np.ndarray:
        P, K = nodes.shape
        W = np.repeat(w[None, :], P * K, axis=0).reshape(P, K, P)
        idx = np.arange(P)
        W[idx, :, idx] = nodes
        F = self.model.loglik(W.reshape(P * K, P), x)            # (P·K, n)
        return F.T.reshape(-1, P, K)

    def _prior_terms(self, mu, std):
        """(KL or −entropy, its ∂μ, its ∂log σ): the exact part, to be subtracted."""
        pm = self.model.prior_moments()
        if pm is None:
            H = float(np.sum(np.log(std))) + 0.5 * mu.shape[0] * math.log(2 * math.pi * math.e)
            return -H, np.zeros_like(mu), -np.ones_like(mu)
        m0, v0 = pm
        return gaussian_kl(mu, std, m0, v0), (mu - m0) / v0, std * std / v0 - 1.0

    def _scale(self, x, n_records):
        return 1.0 if x is None else float(self.n_total) / n_records

    def gradient(self, lam: NatParams, x, rng) -> tuple[NatParams, GradientEstimate, float]:
        """(ĝ of the ELBO, the estimate behind it, the stochastic ELBO value)."""
        est = self.estimate(lam, x, rng)
        mu, std = np.asarray(lam["mean"]), np.exp(np.asarray(lam["log_std"]))
        scale = self._scale(x, est.g_mean.shape[0])
        kl, kl_m, kl_ls = self._prior_terms(mu, std)
        g = NatParams(mean=scale * est.g_mean.sum(axis=0) - kl_m,
                      log_std=scale * est.g_log_std.sum(axis=0) - kl_ls)
        elbo = scale * float(np.sum(est.loglik)) - kl
        return g, est, elbo

    def exact_gradient(self, lam: NatParams, x=None) -> NatParams:
        """∇ of the ELBO in closed form, for models with ``expected_loglik_grad`` (tests)."""
        x = self.model.check_batch(x) if x is not None else None
        mu, std = np.asarray(lam["mean"]), np.exp(np.asarray(lam["log_std"]))
        gm, gs = self.model.expected_loglik_grad(mu, std, x)
        n = 1 if x is None else x.shape[0]
        scale = self._scale(x, n)
        _, kl_m, kl_ls = self._prior_terms(mu, std)
        return NatParams(mean=scale * gm - kl_m, log_std=scale * gs * std - kl_ls)

    # --------------------------------------------------------------- update
    def update(self, state: EngineState, x) -> tuple[EngineState, UpdateInfo]:
        """One stochastic-gradient step on the minibatch ``x`` (None for a target)."""
        if x is not None:
            x = self.model.check_batch(x)
        rng = state.rng()
        lam = state.lam
        g, est, elbo = self.gradient(lam, x, rng)
        n = est.g_mean.shape[0]
        S = 0 if x is None else x.shape[0]
        N = float(self.n_total)
        t = state.step + 1
        rho = self.schedule(t)
        step = self.learning_rate * rho
        gflat = np.concatenate([g["mean"], g["log_std"]]) / N
        aux = state.aux
        if self.optimizer == "adam":
            m = _ADAM_B1 * aux["adam_m"] + (1 - _ADAM_B1) * gflat
            v = _ADAM_B2 * aux["adam_v"] + (1 - _ADAM_B2) * gflat * gflat
            mhat, vhat = m / (1 - _ADAM_B1 ** t), v / (1 - _ADAM_B2 ** t)
            delta = step * mhat / (np.sqrt(vhat) + _ADAM_EPS)
            aux = {"adam_m": m, "adam_v": v}
        elif self.optimizer == "natural":
            sd = np.exp(np.asarray(lam["log_std"]))
            delta = np.concatenate([np.clip(step * sd * sd * g["mean"], -MAX_MEAN_STEP * sd, MAX_MEAN_STEP * sd),
                                    np.clip(step * 0.5 * g["log_std"], -MAX_LOG_STD_STEP, MAX_LOG_STD_STEP)])
        else:
            delta = step * gflat
        P = self.model.n_params
        new_lam = NatParams(mean=np.asarray(lam["mean"]) + delta[:P],
                            log_std=np.asarray(lam["log_std"]) + delta[P:])
        if not new_lam.all_finite():
            raise FloatingPointError(f"update {t} would make q non-finite; state left unchanged "
                                     f"(lower learning_rate)")
        if n > 1:
            scale = self._scale(x, n)
            C = np.concatenate([est.g_mean, est.g_log_std], axis=1)
            tr = float(np.sum(C.var(axis=0, ddof=1)))
            grad_var = scale * scale * n * tr       # = N² tr Σ̂ / |S|
        else:
            grad_var = float("nan")
        info = UpdateInfo(step=t, rho=rho, batch_size=S, effective_batch_size=float(S), noise_std=0.0,
                          elbo=elbo, elbo_per_record=elbo / N, grad_variance=grad_var,
                          grad_norm=math.sqrt(g.sqnorm()), gradient=g)
        return EngineState(step=t, lam=new_lam, rng_state=rng.bit_generator.state,
                           records_seen=state.records_seen + S, aux=aux), info

    def predictive_logpdf(self, state: EngineState, x) -> np.ndarray:
        return self.model.predictive_logpdf(state.lam, x)

    def fit(self, state: EngineState, X, n_steps: int, batch_size: int | None = None,
            callback=None) -> tuple[EngineState, list[UpdateInfo]]:
        """``n_steps`` updates on minibatches drawn without replacement from ``X`` (None: a target)."""
        if X is not None:
            X = self.model.check_batch(X)
            n = X.shape[0]
            if batch_size is not None and not (1 <= batch_size <= n):
                raise ValueError(f"batch_size must be in [1, {n}] or None, got {batch_size}")
        infos = []
        for _ in range(int(n_steps)):
            if X is None or batch_size is None or batch_size == X.shape[0]:
                xb = X
            else:
                rng = state.rng()
                idx = rng.choice(X.shape[0], size=batch_size, replace=False)
                state = replace(state, rng_state=rng.bit_generator.state)
                xb = X[np.sort(idx)]
            state, info = self.update(state, xb)
            infos.append(info)
            if callback is not None:
                callback(state, info)
        return state, infos

