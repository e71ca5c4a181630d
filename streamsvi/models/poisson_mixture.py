"""Mixture of K components of D independent Poisson counts (a dense conjugate mixture).

Generative model::

    π ~ Dirichlet(α0)                          α0: ``weight_concentration`` (K,)
    θ_kd ~ Gamma(a0_d, b0_d)                   shape a0 ``prior_shape``, rate b0 ``prior_rate``
    z_n ~ Categorical(π)
    x_nd | z_n = k ~ Poisson(θ_kd)             d = 1..D, independent given z_n

Mean-field family: q(π) Dirichlet(α), q(θ_kd) Gamma(a_kd, b_kd), q(z_n)
Categorical(r_n). λ holds (the names of its arrays, and the statistic each
record adds under CAVI, λ = η + Σ_n E_q[t(x_n, z_n)])::

    alpha        (K,)     α_k                        α0_k  + Σ_n r_nk
    theta_shape  (K, D)   a_kd (natural a − 1)       a0_d  + Σ_n r_nk x_nd
    theta_rate   (K, D)   b_kd (natural −b)          b0_d  + Σ_n r_nk

Two parameter blocks (``streamsvi.models.blocks``): the weights a
:class:`~streamsvi.models.blocks.Dirichlet` (clipped entry by entry, as the
GMM's), the K×D rates a dense :class:`~streamsvi.models.blocks.GammaRows`
(each component one row of D Gammas, stored as (shape, rate) like Poisson
factorisation's rows). The families own the domain (every entry > 0), the
fraction-to-boundary limit, tempering (α_T = 1 + (α − 1)/T, a_T = 1 + (a − 1)/T,
b_T = b/T) and the KL to the prior; the engine's dense step does the rest.

Local step (E[log θ] = ψ(a) − log b, E[θ] = a/b, E[log π] = ψ(α) − ψ(Σα))::

    log ρ_nk = E[log π_k] + Σ_d (x_nd E[log θ_kd] − E[θ_kd]),   r_nk ∝ ρ_nk

and the record's local ELBO term is log Σ_k ρ_nk − Σ_d log x_nd! (the
constant log x! does not move r but is kept, so the ELBO bounds log p(x)).
The global ELBO is −KL(q(π) ‖ p(π)) − Σ_k KL(q(θ_k) ‖ p(θ_k)), from the
two families. Records are the dense kind's (n, D) arrays; ``check_batch``
refuses a count that is negative or not an integer.

Examples
--------
>>> x, z, rates = sample_mixture(600, seed=0)
>>> model = PoissonMixture(n_components=3, n_features=5)
>>> lam = model.init_params(np.random.default_rng(0), x, n_total=len(x))
>>> for _ in range(20):   # batch VI (CAVI)
...     lam = model.prior() + model.suffstats(model.local_step(lam, x), x)
>>> sorted(np.round(model.rates(lam)[:, 0]).tolist()) == sorted(rates[:, 0].tolist())
True
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.special import digamma, gammaln, logsumexp

from ..settings import ConfigKind, Setting
from .base import (ConjugateModel, Mixture, NatParams, PairedStats, RandomRestart, StartsFromData, Tempered,
                   check_matrix)
from .blocks import DenseBlock, Dirichlet, GammaRows, blocks_in_domain, blocks_max_step, blocks_temper
from .gmm import kmeans

#: the starts of :meth:`PoissonMixture.init_params`, the default first
INITS = ("kmeans", "random_from_data", "random_resp")

#: A streaming start gathers at least this many records per component (:meth:`PoissonMixture.start_size`).
START_RECORDS_PER_COMPONENT = 20


@dataclass(frozen=True)
class PoissonLocal:
    """Responsibilities ``resp`` (n, K) and ``log_norm`` (n,), the record's local ELBO term
    (at T ≠ 1 the tempered local objective at its optimum)."""

    resp: np.ndarray
    log_norm: np.ndarray


def sample_mixture(n=400, rates=None, weights=None, seed=0):
    """``n`` records of a Poisson mixture: (x (n, D) float counts, z (n,), rates (K, D)).

    Default: K = 3, D = 5, well-separated rates between 1 and 20, weights (0.5, 0.3, 0.2).
    """
    rng = np.random.default_rng(seed)
    rates = np.array([[1.0, 2.0, 12.0, 6.0, 1.0],
                      [10.0, 1.0, 2.0, 1.0, 8.0],
                      [4.0, 15.0, 1.0, 20.0, 3.0]]) if rates is None else np.asarray(rates, float)
    K = rates.shape[0]
    w = np.array([0.5, 0.3, 0.2]) if weights is None and K == 3 else \
        (np.full(K, 1.0 / K) if weights is None else np.asarray(weights, float))
    z = rng.choice(K, size=n, p=w / w.sum())
    return rng.poisson(rates[z]).astype(np.float64), z, rates


def _per(value, n: int, name: str) -> np.ndarray:
    """A setting of a number or ``n`` numbers as an (n,) array; ValueError naming it otherwise."""
    a = np.asarray(value, float)
    a = np.full(n, float(a)) if a.ndim == 0 else a
    if a.shape != (n,):
        raise ValueError(f"{name} must be a number or {n} numbers, got {value}")
    return a


class PoissonMixture(ConjugateModel, Tempered, RandomRestart, StartsFromData, Mixture, PairedStats):
    """Bayesian mixture of K products of D Poisson distributions (module docs).

    Parameters
    ----------
    n_components : int
        K.
    n_features : int
        D, the counts per record.
    weight_concentration : float or sequence of K floats
        α0 of the Dirichlet on the weights.
    prior_shape, prior_rate : float or sequence of D floats
        a0, b0 of the Gamma prior of every rate θ_kd (mean a0/b0).
    init : {"kmeans", "random_from_data", "random_resp"}
        The start's responsibilities: k-means (k-means++ then Lloyd) on √x, the
        variance-stabilising transform of Poisson counts; the nearest of K random
        records (in √x); or uniform random soft responsibilities.
    n_init : int
        Starts made; the one with the highest ELBO on the start's records after
        ``init_sweeps`` CAVI sweeps is kept.
    init_sweeps : int
        CAVI sweeps on the start's records from each start.
    init_batches : int
        Minibatches a streaming start gathers (:meth:`start_size`).
    """

    name = "poisson_mixture"
    record_kind = "dense"
    config_kinds = {"poisson_mixture": ConfigKind("mixture of K components of D independent Poisson counts")}
    settings = {
        "n_components": Setting("int", 3, "K, mixture components", low=1, required=True),
        "n_features": Setting("int", 2, "D, counts per record", low=1, required=True),
        "weight_concentration": Setting("numbers", 1.0, "alpha0 of the Dirichlet on the weights "
                                        "(a number or K numbers)", low=0, low_open=True),
        "prior_shape": Setting("numbers", 1.0, "a0: every rate theta_kd ~ Gamma(a0, b0) (a number or D numbers)",
                               low=0, low_open=True),
        "prior_rate": Setting("numbers", 0.1, "b0: the Gamma prior's rate, mean a0/b0 (a number or D numbers)",
                              low=0, low_open=True),
        "init": Setting("str", "kmeans", "the start on the start's records: kmeans (on sqrt x), "
                        "random_from_data or random_resp", choices=INITS),
        "n_init": Setting("int", 3, "starts made from the start's records, the best ELBO kept", low=1),
        "init_sweeps": Setting("int", 5, "CAVI sweeps on the start's records from each start", low=0),
        "init_batches": Setting("int", 4, "minibatches gathered before the streaming start", low=1),
    }
    START_SETTINGS = ("init", "n_init", "init_sweeps", "init_batches")

    @classmethod
    def param_size(cls, settings) -> int:
        """λ's size from the settings (``Model.param_size``): alpha, theta_shape, theta_rate."""
        K, D = int(settings["n_components"]), int(settings["n_features"])
        return K + 2 * K * D

    @classmethod
    def check_cases(cls) -> dict:
        """The check suite's case: three well-separated components in 5-D, 400 records, from one
        random soft start without sweeps (so that batch VI has something left to do)."""
        def poisson_mixture():
            x, _, _ = sample_mixture(400, seed=4)
            return cls(n_components=3, n_features=5, weight_concentration=0.8, prior_shape=1.0,
                       prior_rate=0.2, init="random_resp", n_init=1, init_sweeps=0), x
        return {"poisson_mixture": poisson_mixture}

    def __init__(self, n_components=3, n_features=2, weight_concentration=1.0, prior_shape=1.0,
                 prior_rate=0.1, init="kmeans", n_init=3, init_sweeps=5, init_batches=4):
        p = self.check_settings({k: v for k, v in locals().items() if k in self.settings})
        K, D = p["n_components"], p["n_features"]
        self.n_components, self.n_features = K, D
        self._alpha0 = _per(p["weight_concentration"], K, "weight_concentration")
        self._a0 = _per(p["prior_shape"], D, "prior_shape")
        self._b0 = _per(p["prior_rate"], D, "prior_rate")
        self.weight_concentration = p["weight_concentration"]
        self.prior_shape, self.prior_rate = p["prior_shape"], p["prior_rate"]
        self.init, self.n_init = p["init"], p["n_init"]
        self.init_sweeps, self.init_batches = p["init_sweeps"], p["init_batches"]
        self._prior = NatParams(alpha=self._alpha0.copy(), theta_shape=np.tile(self._a0, (K, 1)),
                                theta_rate=np.tile(self._b0, (K, 1)))

    def get_params(self) -> dict:
        def j(v):
            return np.asarray(v).tolist() if not np.isscalar(v) else v
        return {"n_components": self.n_components, "n_features": self.n_features,
                "weight_concentration": j(self.weight_concentration), "prior_shape": j(self.prior_shape),
                "prior_rate": j(self.prior_rate), "init": self.init, "n_init": self.n_init,
                "init_sweeps": self.init_sweeps, "init_batches": self.init_batches}

    # ------------------------------------------------------------ blocks
    @cached_property
    def param_blocks(self) -> tuple:
        """λ's blocks: q(π) a Dirichlet (clipped entry by entry), the rates K rows of D Gammas."""
        return (DenseBlock(("alpha",), Dirichlet(per="entry")),
                DenseBlock(("theta_shape", "theta_rate"),
                           GammaRows(self.n_features, prior_shape=self._a0, prior_rate=self._b0)))

    def prior(self) -> NatParams:
        """η (shared object: treat as read-only)."""
        return self._prior

    def check_batch(self, x) -> np.ndarray:
        """An (n, D) float64 array of counts: finite integers ≥ 0 (ValueError naming the records)."""
        x = check_matrix(x, self.n_features)
        bad = ~((x >= 0) & (x == np.floor(x))).all(axis=1)
        if bad.any():
            at = np.flatnonzero(bad)[:10]
            raise ValueError(f"Poisson mixture counts must be integers >= 0; got {x[at].tolist()} at records "
                             f"{at.tolist()}")
        return x

    # ------------------------------------------------------------ moments
    def rates(self, lam) -> np.ndarray:
        """E_q[θ] (K, D)."""
        return lam["theta_shape"] / lam["theta_rate"]

    def _coefficients(self, lam):
        """(E[log θ] (K, D), the constant of log ρ (K,): E[log π_k] − Σ_d E[θ_kd])."""
        a, b, alpha = lam["theta_shape"], lam["theta_rate"], lam["alpha"]
        elog_theta = digamma(a) - np.log(b)
        const = digamma(alpha) - digamma(alpha.sum()) - (a / b).sum(axis=1)
        return elog_theta, const

    def _log_rho(self, lam, x) -> np.ndarray:
        elog_theta, const = self._coefficients(lam)
        return x @ elog_theta.T + const

    def local_step(self, lam, x, temperature=1.0) -> PoissonLocal:
        """r_nk ∝ exp(log ρ_nk / T); ``log_norm`` = T log Σ_k exp(log ρ_nk / T) − Σ_d log x_nd!."""
        L = self._log_rho(lam, x)
        if temperature != 1.0:
            L = L / temperature
        lse = logsumexp(L, axis=1)
        resp = np.exp(L - lse[:, None])
        if temperature != 1.0:
            lse = temperature * lse
        return PoissonLocal(resp, lse - gammaln(x + 1.0).sum(axis=1))

    def temper(self, target, T) -> NatParams:
        """θ(target)/T block by block (Dirichlet: 1 + (α − 1)/T; Gamma: 1 + (a − 1)/T, b/T)."""
        return blocks_temper(self.param_blocks, target, T)

    # ------------------------------------------------------------ statistics
    def _stats(self, R, x) -> NatParams:
        nk = R.sum(axis=0)
        return NatParams(alpha=nk, theta_shape=R.T @ x,
                         theta_rate=np.repeat(nk[:, None], self.n_features, axis=1))

    def suffstats(self, local, x, weights=None) -> NatParams:
        R = local.resp if weights is None else local.resp * np.asarray(weights)[:, None]
        return self._stats(R, x)

    def suffstats_pair(self, local, x, weights):
        """(weighted, unweighted) statistics with one matrix product."""
        K = self.n_components
        R2 = np.concatenate([local.resp * np.asarray(weights)[:, None], local.resp], axis=1)
        nk, sx = R2.sum(axis=0), R2.T @ x
        D = self.n_features
        return tuple(NatParams(alpha=nk[s], theta_shape=sx[s], theta_rate=np.repeat(nk[s, None], D, axis=1))
                     for s in (slice(0, K), slice(K, 2 * K)))

    def suffstats_sqnorm(self, local, x) -> np.ndarray:
        """‖t_n‖² = ‖r_n‖² (1 + ‖x_n‖² + D): t_n = r_n ⊗ (1, x_n, 1_D)."""
        return (local.resp ** 2).sum(axis=1) * (1.0 + (x * x).sum(axis=1) + self.n_features)

    # ------------------------------------------------------------ ELBO
    def local_elbo(self, local) -> np.ndarray:
        return local.log_norm

    def global_elbo(self, lam) -> float:
        """−KL(q(π) ‖ p(π)) − Σ_k KL(q(θ_k) ‖ p(θ_k)), each from its block's family."""
        prior = self.prior()
        return -sum(float(np.sum(b.family.kl(tuple(lam[k] for k in b.names), tuple(prior[k] for k in b.names))))
                    for b in self.param_blocks)

    def in_domain(self, lam) -> bool:
        return blocks_in_domain(self.param_blocks, lam)

    def max_step(self, lam, target):
        return blocks_max_step(self.param_blocks, lam, target)

    # ------------------------------------------------------------ init
    def init_params(self, rng, x, n_total) -> NatParams:
        """The best of ``n_init`` starts (:meth:`start_params`), each after ``init_sweeps`` CAVI sweeps
        on ``x`` scaled to ``n_total`` records, by the ELBO on ``x``. Everything is drawn from ``rng``."""
        x = self.check_batch(x)
        scale = float(n_total) / x.shape[0]
        best, best_elbo = None, -math.inf
        for _ in range(self.n_init):
            lam = self.start_params(rng, x, n_total)
            for _ in range(self.init_sweeps):
                lam = self.prior() + self.suffstats(self.local_step(lam, x), x) * scale
            if self.n_init == 1:
                return lam
            elbo = self.global_elbo(lam) + scale * float(np.sum(self.local_step(lam, x).log_norm))
            if elbo > best_elbo:
                best, best_elbo = lam, elbo
        return best

    def start_params(self, rng, x, n_total) -> NatParams:
        """One start λ = η + (n_total/|x|) Σ_n t(x_n, r_n), r from the ``init`` setting."""
        x = self.check_batch(x)
        n, K = x.shape[0], self.n_components
        if self.init == "random_resp":
            resp = rng.uniform(size=(n, K))
            resp /= resp.sum(axis=1, keepdims=True)
        else:
            s = np.sqrt(x)
            if self.init == "kmeans":
                labels = kmeans(rng, s, K)[1]
            else:
                c = s[rng.choice(n, size=K, replace=n < K)]
                labels = ((s[:, None, :] - c[None]) ** 2).sum(axis=2).argmin(axis=1)
            resp = np.zeros((n, K))
            resp[np.arange(n), labels] = 1.0
        return self.prior() + self._stats(resp, x) * (float(n_total) / n)

    def random_init(self, rng, x, n_total) -> NatParams:
        """η_t of stochastic annealing: a random allocation n ~ Multinomial(N, 1/K) of the data
        set to the components gives α = α0 + n; each component's mean rates are the records'
        mean x̄ times independent Gamma(2, 2) factors (mean 1), held by 10 pseudo-records
        (a = a0 + 10 m, b = b0 + 10)."""
        x = self.check_batch(x)
        K, D = self.n_components, self.n_features
        n_k = rng.multinomial(int(round(float(n_total))), np.full(K, 1.0 / K)).astype(float)
        m = x.mean(axis=0)[None, :] * rng.gamma(2.0, 0.5, size=(K, D))
        return NatParams(alpha=self._alpha0 + n_k, theta_shape=self._a0 + 10.0 * m,
                         theta_rate=np.tile(self._b0 + 10.0, (K, 1)))

    def start_size(self, batch_size: int) -> int:
        """Records a streaming start gathers: ``init_batches`` minibatches, and at least
        :data:`START_RECORDS_PER_COMPONENT` · K (the daemon caps it at N)."""
        return max(self.init_batches * int(batch_size), START_RECORDS_PER_COMPONENT * self.n_components)

    def adopt_prior(self, other) -> None:
        """Nothing to adopt: the prior is the settings', never decided from data."""

    # ------------------------------------------------------------ scoring
    def responsibilities(self, lam, x) -> np.ndarray:
        """E_q[z_n] (n, K) of new records."""
        return self.local_step(lam, self.check_batch(x)).resp

    def predict(self, lam, x) -> np.ndarray:
        """MAP component of each record."""
        return self.responsibilities(lam, x).argmax(axis=1)

    def weights(self, lam) -> np.ndarray:
        """E_q[π]."""
        return lam["alpha"] / lam["alpha"].sum()

    def means(self, lam) -> np.ndarray:
        """E_q[θ_k]: a component's mean counts."""
        return self.rates(lam)

    def covariances(self, lam) -> np.ndarray:
        """diag(E_q[θ_k]): a Poisson count's variance is its rate."""
        r = self.rates(lam)
        return r[:, :, None] * np.eye(self.n_features)[None]

    def predictive_logpdf(self, lam, x) -> np.ndarray:
        """log p(x* | data) = log Σ_k E[π_k] Π_d NB(x*_d; a_kd, b_kd / (b_kd + 1)).

        Under q the rates are independent Gammas, so each count's predictive is the
        Gamma–Poisson (negative binomial) Γ(a + x)/(Γ(a) x!) (b/(b+1))^a (b+1)^−x.
        """
        x = self.check_batch(x)
        a, b = lam["theta_shape"][None], lam["theta_rate"][None]
        xs = x[:, None, :]
        lp = (gammaln(a + xs) - gammaln(a) - gammaln(xs + 1.0) + a * np.log(b / (b + 1.0))
              - xs * np.log1p(b)).sum(axis=2)
        return logsumexp(lp + np.log(self.weights(lam))[None], axis=1)
