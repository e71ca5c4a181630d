"""1-D Gaussian mixture with known variance: the worked example of seed 003.

Generative model (slides "Example: Gaussian Mixture Model")::

    μ_k ~ N(μ0, τ²)                   k = 1..K
    z_n ~ Categorical(1/K, …, 1/K)    (fixed, uniform mixing weights)
    x_n | z_n = k ~ N(μ_k, σ²)        σ² known

q(μ_k) = N(m_k, s_k²), q(z_n) = Categorical(φ_n). Natural parameters::

    eta1 (K,)   m_k / s_k²       prior μ0/τ²       statistic φ_nk x_n / σ²
    eta2 (K,)   −1 / (2 s_k²)    prior −1/(2τ²)    statistic −φ_nk / (2σ²)

The local step is the slide's φ_nk ∝ exp{(m_k x_n − (m_k² + s_k²)/2) / σ²} and
the SVI target is the slide's η̂ = (μ0/τ² + (N/|S|) Σ_n φ_nk x_n/σ²,
−½ (1/τ² + (N/|S|) Σ_n φ_nk / σ²)). The domain is eta2 < 0.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(1)
>>> x = np.concatenate([rng.normal(-3, 1, 300), rng.normal(3, 1, 300)])[:, None]
>>> model = KnownVarianceGMM1D(n_components=2, sigma2=1.0, prior_var=100.0)
>>> lam = model.init_params(rng, x, n_total=len(x))
>>> for _ in range(30):
...     lam = model.prior() + model.suffstats(model.local_step(lam, x), x)
>>> m, s2 = model.posterior_mean_var(lam)
>>> sorted(np.round(m).tolist())
[-3.0, 3.0]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp

from ..settings import ConfigKind, Setting
from .base import ConjugateModel, NatParams, RandomRestart, Tempered, check_matrix, segment_limit_positive
from functools import cached_property

from .base import NatParams, check_matrix
from .blocks import DenseBlock, Gaussian1D, blocks_in_domain, blocks_max_step, blocks_temper


@dataclass(frozen=True)
class Gauss1DLocal:
    resp: np.ndarray
    log_norm: np.ndarray


class KnownVarianceGMM1D(ConjugateModel, Tempered, RandomRestart):
    """Mixture of K 1-D Gaussians with known variance σ² and uniform weights.

    Parameters
    ----------
    n_components : int
        K.
    sigma2 : float
        σ² > 0, the known observation variance.
    prior_mean : float
        μ0.
    prior_var : float
        τ² > 0.
    """

    name = "gauss1d"
    record_kind = "dense"
    config_kinds = {"gauss1d": ConfigKind("1-D Gaussian mixture with known variance (the worked example)")}
    settings = {
        "n_components": Setting("int", 3, "K, mixture components", low=1, required=True),
        "sigma2": Setting("float", 1.0, "the known observation variance", low=0, low_open=True),
        "prior_mean": Setting("float", 0.0, "mu0, the prior mean of every component mean"),
        "prior_var": Setting("float", 10.0, "tau^2, the prior variance of every component mean",
                             low=0, low_open=True),
    }
    n_features = 1

    @classmethod
    def param_size(cls, settings) -> int:
        """λ's size from the settings (``Model.param_size``)."""
        return 2 * int(settings["n_components"])   # eta1, eta2

    @classmethod
    def check_cases(cls) -> dict:
        """The check suite's case: three well-separated components, 400 records."""
        def gauss1d():
            rng = np.random.default_rng(2)
            X = np.concatenate([rng.normal(-3, 1, 150), rng.normal(0.5, 1, 100), rng.normal(4, 1, 150)])
            return cls(n_components=3, sigma2=1.0, prior_mean=0.0, prior_var=25.0), X[:, None]
        return {"gauss1d": gauss1d}

    def __init__(self, n_components=3, sigma2=1.0, prior_mean=0.0, prior_var=10.0):
        p = self.check_settings({k: v for k, v in locals().items() if k in self.settings})
        self.n_components = p["n_components"]
        self.sigma2 = p["sigma2"]
        self.prior_mean = p["prior_mean"]
        self.prior_var = p["prior_var"]

    def get_params(self) -> dict:
        return {"n_components": self.n_components, "sigma2": self.sigma2,
                "prior_mean": self.prior_mean, "prior_var": self.prior_var}

    def prior(self) -> NatParams:
        K = self.n_components
        return NatParams(eta1=np.full(K, self.prior_mean / self.prior_var),
                         eta2=np.full(K, -0.5 / self.prior_var))

    @staticmethod
    def posterior_mean_var(lam: NatParams):
        """(m_k, s_k²) from natural parameters."""
        s2 = -0.5 / lam["eta2"]
        return lam["eta1"] * s2, s2

    def check_batch(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64) if not isinstance(x, np.ndarray) else x
        if x.ndim == 1:
            x = x[:, None]
        return check_matrix(x, 1)

    def init_params(self, rng, x, n_total) -> NatParams:
        """K distinct random records as centres, hard nearest-centre assignment."""
        x = self.check_batch(x)
        n, K = x.shape[0], self.n_components
        idx = rng.choice(n, size=K, replace=n < K)
        d2 = (x - x[idx, 0][None, :]) ** 2
        resp = np.zeros((n, K))
        resp[np.arange(n), d2.argmin(axis=1)] = 1.0
        return self.prior() + self.suffstats(Gauss1DLocal(resp, np.zeros(n)), x) * (n_total / n)

    def _log_rho(self, lam, x):
        m, s2 = self.posterior_mean_var(lam)
        xs = x[:, 0][:, None]
        # E_q[log p(x_n | z_n = k, μ_k)] + log(1/K)
        return (-0.5 * math.log(2 * math.pi * self.sigma2)
                - (xs * xs - 2.0 * xs * m + m * m + s2) / (2.0 * self.sigma2)
                - math.log(self.n_components))

    def local_step(self, lam, x, temperature=1.0) -> Gauss1DLocal:
        """φ_nk ∝ exp(log ρ_nk / T); ``log_norm`` is T log Σ_k exp(log ρ_nk / T)
        (the tempered local objective at its optimum; the ELBO term at T = 1)."""
        log_rho = self._log_rho(lam, x)
        if temperature != 1.0:
            log_rho = log_rho / temperature
        log_norm = logsumexp(log_rho, axis=1)
        resp = np.exp(log_rho - log_norm[:, None])
        return Gauss1DLocal(resp, log_norm if temperature == 1.0 else temperature * log_norm)

    @cached_property
    def param_blocks(self) -> tuple:
        """λ's one block (``streamsvi.models.blocks``): K scalar Gaussians (η1, η2)."""
        return (DenseBlock(("eta1", "eta2"), Gaussian1D()),)

    def temper(self, target, T) -> NatParams:
        """θ/T: (eta1, eta2) are the natural parameters of N(m, s²) themselves."""
        return blocks_temper(self.param_blocks, target, T)

    def random_init(self, rng, x, n_total) -> NatParams:
        """Seed 002 §4.3 for this model: means drawn from N(x̄, var(x)), precision of
        q(μ_k) ten times the empirical precision (s_k² = var(x)/10)."""
        x = self.check_batch(x)
        mean, var = float(x.mean()), max(float(x.var()), 1e-12)
        m = rng.normal(mean, math.sqrt(var), size=self.n_components)
        s2 = var / 10.0
        return NatParams(eta1=m / s2, eta2=np.full(self.n_components, -0.5 / s2))

    def suffstats(self, local, x, weights=None) -> NatParams:
        r = local.resp if weights is None else local.resp * np.asarray(weights)[:, None]
        return NatParams(eta1=(r * x).sum(axis=0) / self.sigma2,
                         eta2=-0.5 * r.sum(axis=0) / self.sigma2)

    def suffstats_sqnorm(self, local, x) -> np.ndarray:
        r2 = (local.resp ** 2).sum(axis=1)
        return r2 * (x[:, 0] ** 2 + 0.25) / self.sigma2 ** 2

    def local_elbo(self, local) -> np.ndarray:
        return local.log_norm

    def global_elbo(self, lam) -> float:
        """−Σ_k KL(N(m_k, s_k²) ‖ N(μ0, τ²)), from the block's family (``Gaussian1D.kl``)."""
        (b,), prior = self.param_blocks, self.prior()
        return -float(np.sum(b.family.kl(tuple(lam[k] for k in b.names), tuple(prior[k] for k in b.names))))

    def in_domain(self, lam) -> bool:
        return blocks_in_domain(self.param_blocks, lam)

    def max_step(self, lam, target):
        return blocks_max_step(self.param_blocks, lam, target)

    def responsibilities(self, lam, x) -> np.ndarray:
        return self.local_step(lam, self.check_batch(x)).resp

    def predict(self, lam, x) -> np.ndarray:
        return self.responsibilities(lam, x).argmax(axis=1)

    def predictive_logpdf(self, lam, x) -> np.ndarray:
        """log (1/K) Σ_k N(x | m_k, σ² + s_k²)."""
        x = self.check_batch(x)
        m, s2 = self.posterior_mean_var(lam)
        v = self.sigma2 + s2
        lp = -0.5 * np.log(2 * math.pi * v) - (x - m) ** 2 / (2 * v)
        return logsumexp(lp, axis=1) - math.log(self.n_components)
