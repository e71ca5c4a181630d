"""Full-covariance Bayesian Gaussian mixture (and its truncated DP approximation).

Generative model (Bishop 2006 §10.2; seed 000 §IV-C)::

    π ~ Dirichlet(α0)                    α0: ``weight_concentration`` (K,)
    Λ_k ~ Wishart(W0, ν0)                E[Λ_k] = ν0 W0
    μ_k | Λ_k ~ N(m0, (β0 Λ_k)⁻¹)
    c_n ~ Categorical(π)
    x_n | c_n = k ~ N(μ_k, Λ_k⁻¹)

Mean-field family: q(π) Dirichlet(α), q(μ_k, Λ_k) Normal-Wishart
(m_k, β_k, W_k, ν_k), q(c_n) Categorical(r_n).

Natural parameters (the names of the arrays in λ)::

    alpha  (K,)      α_k                         + Σ_n r_nk
    beta   (K,)      β_k                         + Σ_n r_nk
    beta_m (K, D)    β_k m_k                     + Σ_n r_nk x_n
    Psi    (K, D, D) W_k⁻¹ + β_k m_k m_kᵀ         + Σ_n r_nk x_n x_nᵀ
    nu     (K,)      ν_k                         + Σ_n r_nk

so CAVI is ``λ = η + Σ_n E_q[t(θ_n)]`` with the statistics on the right. The
natural-parameter domain is α_k > 0, ν_k > D − 1 and the (D+1)×(D+1) matrix
``[[Psi_k, beta_m_k], [beta_m_kᵀ, beta_k]]`` positive definite (its Schur
complement is W_k⁻¹, so this is β_k > 0 and W_k⁻¹ ≻ 0). Every condition is
linear in λ, which gives :meth:`BayesianGMM.max_step` in closed form.

Seed 000 settings (:meth:`BayesianGMM.paper_prior`): ν0 = a = D, W0 = B = I,
α0 = 0.5. The paper puts an independent prior μ_k ~ N(0, c I) with c = 10;
the conjugate Normal-Wishart used here has μ_k | Λ_k ~ N(0, (β0 Λ_k)⁻¹), and
β0 = 1/c gives the paper's prior covariance c I at Λ_k = I.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> x = np.concatenate([rng.normal(-4, 1, (100, 2)), rng.normal(4, 1, (100, 2))])
>>> model = BayesianGMM(n_components=2, n_features=2)
>>> lam = model.init_params(rng, x, n_total=len(x))
>>> for _ in range(20):   # batch VI (CAVI)
...     lam = model.prior() + model.suffstats(model.local_step(lam, x), x)
>>> sorted(np.round(model.means(lam)[:, 0]).tolist())
[-4.0, 4.0]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import digamma, gammaln, logsumexp, multigammaln

from .base import NatParams, check_matrix, segment_limit_pd, segment_limit_positive

_LOG_2PI = math.log(2.0 * math.pi)


def _multigammaln(a: np.ndarray, d: int) -> np.ndarray:
    """log Γ_d(a), vectorised over ``a``."""
    j = np.arange(d)
    return 0.25 * d * (d - 1) * math.log(math.pi) + gammaln(np.asarray(a)[..., None] - 0.5 * j).sum(axis=-1)


@dataclass(frozen=True)
class GMMLocal:
    """Local factors of a minibatch.

    ``resp_t`` (K, n) are the responsibilities r_nk, stored component-major
    (reductions over the K components of each record then run along the long
    axis, several times faster in numpy than along a short last axis);
    ``resp`` is the (n, K) view. ``log_norm`` (n,) is log Σ_k exp(log ρ_nk),
    the record's local ELBO term at the optimal r; ``features`` (n, T + D + 1)
    are [x_i x_j (i ≤ j) | x | 1], shared by the E-step and the statistics so
    both are one matrix product each.
    """

    resp_t: np.ndarray
    log_norm: np.ndarray
    features: np.ndarray

    @property
    def resp(self) -> np.ndarray:
        return self.resp_t.T


class BayesianGMM:
    """Bayesian Gaussian mixture with Normal-Wishart components.

    Parameters
    ----------
    n_components : int
        K, the number of mixture components (the truncation level for the DP
        approximation).
    n_features : int
        D, the dimension of a record.
    weight_concentration : float or sequence of K floats
        α0, the Dirichlet prior on the mixing weights π (per component).
    mean_precision : float
        β0 > 0, how many pseudo-observations the prior mean m0 is worth.
    mean : float or sequence of D floats
        m0, the prior mean of the component means.
    degrees_of_freedom : float or None
        ν0 > D − 1; None means D.
    scale : float, sequence of D floats or D×D matrix, or None
        W0, the Wishart scale (E[Λ] = ν0 W0). A float s means s·I, a vector its
        diagonal. None means I.
    init : {"random_from_data", "random_resp"}
        How :meth:`init_params` starts: K distinct random records as centres
        and a hard nearest-centre assignment, or uniform random soft
        responsibilities (as scikit-learn's ``init_params="random"``).
    """

    name = "gmm"

    def __init__(self, n_components=3, n_features=2, weight_concentration=1.0,
                 mean_precision=1.0, mean=0.0, degrees_of_freedom=None, scale=None,
                 init="random_from_data"):
        K, D = int(n_components), int(n_features)
        if K < 1 or K != n_components:
            raise ValueError(f"n_components must be an integer >= 1, got {n_components}")
        if D < 1 or D != n_features:
            raise ValueError(f"n_features must be an integer >= 1, got {n_features}")
        a0 = np.asarray(weight_concentration, float)
        a0 = np.full(K, float(a0)) if a0.ndim == 0 else a0
        if a0.shape != (K,) or not np.all(a0 > 0) or not np.all(np.isfinite(a0)):
            raise ValueError(f"weight_concentration must be > 0 (a number or {K} numbers), "
                             f"got {weight_concentration}")
        if not (np.isscalar(mean_precision) and mean_precision > 0 and math.isfinite(mean_precision)):
            raise ValueError(f"mean_precision must be a number > 0, got {mean_precision}")
        m0 = np.asarray(mean, float)
        if m0.ndim == 0:
            m0 = np.full(D, float(m0))
        if m0.shape != (D,) or not np.all(np.isfinite(m0)):
            raise ValueError(f"mean must be a number or {D} finite numbers, got {mean}")
        nu0 = float(D if degrees_of_freedom is None else degrees_of_freedom)
        if not nu0 > D - 1:
            raise ValueError(f"degrees_of_freedom must be > n_features - 1 = {D - 1}, "
                             f"got {degrees_of_freedom}")
        if scale is None:
            W0 = np.eye(D)
        else:
            s = np.asarray(scale, float)
            W0 = s * np.eye(D) if s.ndim == 0 else (np.diag(s) if s.ndim == 1 else s)
        if W0.shape != (D, D) or not np.allclose(W0, W0.T) or np.any(np.linalg.eigvalsh(W0) <= 0):
            raise ValueError(f"scale must be a positive number, {D} positive numbers or a "
                             f"symmetric positive definite {D}x{D} matrix, got {scale}")
        if init not in ("random_from_data", "random_resp"):
            raise ValueError(f"init must be 'random_from_data' or 'random_resp', got {init!r}")
        self.n_components, self.n_features = K, D
        self.weight_concentration = weight_concentration
        self.mean_precision = float(mean_precision)
        self.mean = mean
        self.degrees_of_freedom = degrees_of_freedom
        self.scale = scale
        self.init = init
        # derived prior quantities
        self._alpha0, self._m0, self._nu0, self._W0 = a0, m0, nu0, W0
        self._W0inv = np.linalg.inv(W0)
        self._triu = np.triu_indices(D)
        self._triu_w = np.where(self._triu[0] == self._triu[1], -0.5, -1.0)
        self._triu_flat = self._triu[0] * D + self._triu[1]
        sym = np.empty((D, D), dtype=np.intp)               # (i, j) -> its column in [x_i x_j, i ≤ j]
        sym[self._triu] = np.arange(self._triu_flat.size)
        sym.T[self._triu] = np.arange(self._triu_flat.size)
        self._sym_from_triu = sym.ravel()
        self._half_j = 0.5 * np.arange(D)
        self._g_const = 0.5 * D * (math.log(2.0) - _LOG_2PI)
        self._W0inv_flat = self._W0inv.ravel()
        self._m0_outer_flat = np.outer(m0, m0).ravel()
        # prior-only constants of the KL terms
        self._kl_const = (-gammaln(a0.sum()) + gammaln(a0).sum()
                          + K * (0.5 * nu0 * np.linalg.slogdet(W0)[1] + multigammaln(0.5 * nu0, D)))
        self._cache = None
        self._prior = self._make_prior()

    # ------------------------------------------------------------ settings
    def get_params(self) -> dict:
        def j(v):
            return np.asarray(v).tolist() if v is not None and not np.isscalar(v) else v
        return {"n_components": self.n_components, "n_features": self.n_features,
                "weight_concentration": j(self.weight_concentration),
                "mean_precision": self.mean_precision, "mean": j(self.mean),
                "degrees_of_freedom": self.degrees_of_freedom, "scale": j(self.scale),
                "init": self.init}

    @classmethod
    def paper_prior(cls, n_components, n_features, alpha=0.5, c=10.0, **kw):
        """Seed 000 §IV-D settings: a = D, B = I, c = 10, α (see module docs)."""
        return cls(n_components, n_features, weight_concentration=alpha,
                   mean_precision=1.0 / c, mean=0.0, degrees_of_freedom=n_features,
                   scale=1.0, **kw)

    @classmethod
    def dp_approximation(cls, n_features, concentration=1.0, n_components=50, c=10.0, **kw):
        """Truncated Dirichlet-process mixture, π ~ Dirichlet(α/K, …, α/K) (seed 000 §IV-E).

        The finite symmetric Dirichlet with total mass α converges to DP(α G0)
        as K → ∞ (Ishwaran & Zarepour 2002); components the data do not need
        keep weight near zero.
        """
        kw.setdefault("mean_precision", 1.0 / c)
        kw.setdefault("degrees_of_freedom", n_features)
        kw.setdefault("scale", 1.0)
        return cls(n_components, n_features,
                   weight_concentration=concentration / n_components, **kw)

    # ------------------------------------------------------- natural params
    def prior(self) -> NatParams:
        """η (shared object: treat as read-only)."""
        return self._prior

    def _make_prior(self) -> NatParams:
        K = self.n_components
        b0, m0 = self.mean_precision, self._m0
        return NatParams(
            alpha=self._alpha0.copy(),
            beta=np.full(K, b0),
            beta_m=np.tile(b0 * m0, (K, 1)),
            Psi=np.tile(self._W0inv + b0 * np.outer(m0, m0), (K, 1, 1)),
            nu=np.full(K, self._nu0),
        )

    @staticmethod
    def standard(lam: NatParams):
        """(α, β, m, W⁻¹, ν) from natural parameters."""
        beta = lam["beta"]
        m = lam["beta_m"] / beta[:, None]
        Winv = lam["Psi"] - lam["beta_m"][:, :, None] * m[:, None, :]
        Winv = 0.5 * (Winv + np.swapaxes(Winv, 1, 2))
        return lam["alpha"], beta, m, Winv, lam["nu"]

    def from_standard(self, alpha, beta, m, Winv, nu) -> NatParams:
        beta = np.asarray(beta, float)
        m = np.asarray(m, float)
        return NatParams(alpha=alpha, beta=beta, beta_m=beta[:, None] * m,
                         Psi=np.asarray(Winv, float) + beta[:, None, None] * m[:, :, None] * m[:, None, :],
                         nu=nu)

    def check_batch(self, x) -> np.ndarray:
        return check_matrix(x, self.n_features)

    # ---------------------------------------------------------------- init
    def init_params(self, rng: np.random.Generator, x, n_total) -> NatParams:
        """Random initial λ = η + (n_total/|x|) Σ_n t(x_n, r_n) from random r."""
        x = self.check_batch(x)
        n, K = x.shape[0], self.n_components
        if self.init == "random_resp":
            resp = rng.uniform(size=(n, K))
            resp /= resp.sum(axis=1, keepdims=True)
        else:
            idx = rng.choice(n, size=K, replace=n < K)
            d2 = ((x[:, None, :] - x[idx][None, :, :]) ** 2).sum(axis=2)
            resp = np.zeros((n, K))
            resp[np.arange(n), d2.argmin(axis=1)] = 1.0
        return self.init_from_responsibilities(resp, x, n_total)

    def init_from_responsibilities(self, resp, x, n_total=None) -> NatParams:
        """λ = η + (n_total/|x|) Σ_n t(x_n, r_n) for given responsibilities."""
        x = self.check_batch(x)
        resp = np.asarray(resp, float)
        n_total = x.shape[0] if n_total is None else n_total
        stats = self.suffstats(GMMLocal(np.ascontiguousarray(resp.T), np.zeros(len(x)), self.features(x)), x)
        return self.prior() + stats * (n_total / x.shape[0])

    # ---------------------------------------------------------- local step
    def features(self, x) -> np.ndarray:
        """[x_i x_j for i ≤ j | x | 1] per record: t(x_n) in one row."""
        D = self.n_features
        iu, ju = self._triu
        T = iu.size
        Z = np.empty((x.shape[0], T + D + 1))
        np.multiply(x.take(iu, axis=1), x.take(ju, axis=1), out=Z[:, :T])
        Z[:, T:T + D] = x
        Z[:, T + D] = 1.0
        return Z

    def _expectations(self, lam: NatParams) -> dict:
        """Everything about q(β) the local step and the ELBO need, computed once per λ.

        One Cholesky per component; cached for the last λ seen (λ is never
        mutated, so identity is a safe key). This runs once per update, so it
        is written for few numpy calls.
        """
        cache = self._cache
        if cache is not None and cache[0] is lam:
            return cache[1]
        alpha, beta, bm, nu = lam["alpha"], lam["beta"], lam["beta_m"], lam["nu"]
        K, D = self.n_components, self.n_features
        m = bm / beta[:, None]
        Winv = lam["Psi"] - bm[:, :, None] * m[:, None, :]  # Cholesky reads the lower triangle
        C = np.linalg.cholesky(Winv)                       # Winv = C Cᵀ: fails loudly if not PD
        W = np.linalg.inv(Winv)
        logdet_Winv = 2.0 * np.log(C.reshape(K, D * D)[:, ::D + 1]).sum(axis=1)
        dg = digamma(np.concatenate([(0.5 * nu[:, None] - self._half_j).ravel(), alpha, [alpha.sum()]]))
        psi_D = dg[:K * D].reshape(K, D).sum(axis=1)
        E_log_pi = dg[K * D:K * D + K] - dg[-1]
        Wm = (W @ m[:, :, None])[:, :, 0]
        mWm = (m * Wm).sum(axis=1)
        # log ρ_nk = E[log π_k] + ½E[log|Λ_k|] − D/2 log 2π − ½(D/β_k + ν_k (x−m_k)ᵀW_k(x−m_k))
        T = self._triu_flat.size
        G = np.empty((T + D + 1, K))
        G[:T] = (W.reshape(K, D * D).take(self._triu_flat, axis=1) * (nu[:, None] * self._triu_w)).T
        G[T:T + D] = (nu[:, None] * Wm).T
        G[T + D] = (E_log_pi + 0.5 * (psi_D - logdet_Winv)
                    + self._g_const - 0.5 * D / beta - 0.5 * nu * mWm)
        ex = {"alpha": alpha, "beta": beta, "m": m, "W": W, "nu": nu, "Wm": Wm, "mWm": mWm,
              "logdet_Winv": logdet_Winv, "psi_D": psi_D, "G": G, "E_log_pi": E_log_pi}
        self._cache = (lam, ex)
        return ex

    def _log_rho_t(self, lam, x, Z=None):
        """log ρ (K, n) and the features Z."""
        Z = self.features(x) if Z is None else Z
        return np.dot(self._expectations(lam)["G"].T, Z.T), Z

    def local_step(self, lam: NatParams, x) -> GMMLocal:
        """r_nk ∝ exp(E[log π_k] + ½E[log|Λ_k|] − D/2 log 2π − ½E[(x−μ_k)ᵀΛ_k(x−μ_k)])."""
        L, Z = self._log_rho_t(lam, x)                      # (K, n)
        mx = L.max(axis=0)
        L -= mx
        np.exp(L, out=L)
        s = L.sum(axis=0)
        L /= s
        return GMMLocal(L, np.log(s) + mx, Z)

    # ------------------------------------------------- sufficient statistics
    def _unpack(self, P):
        """NatParams from one block of rows of RᵀZ (K, T + D + 1)."""
        K, D = self.n_components, self.n_features
        T = self._triu_flat.size
        Nk = P[:, T + D]
        return NatParams(alpha=Nk, beta=Nk, beta_m=P[:, T:T + D],
                         Psi=P.take(self._sym_from_triu, axis=1).reshape(K, D, D), nu=Nk)

    def suffstats(self, local: GMMLocal, x, weights=None) -> NatParams:
        rt = local.resp_t if weights is None else local.resp_t * np.asarray(weights)[None, :]
        return self._unpack(rt @ local.features)

    def suffstats_pair(self, local: GMMLocal, x, weights):
        """(weighted, unweighted) statistics with one matrix product."""
        K = self.n_components
        Rt = np.concatenate([local.resp_t * np.asarray(weights)[None, :], local.resp_t], axis=0)
        P = Rt @ local.features
        return self._unpack(P[:K]), self._unpack(P[K:])

    def suffstats_sqnorm(self, local: GMMLocal, x) -> np.ndarray:
        # ‖t_n‖² = Σ_k r_nk² (3 + ‖x_n‖² + ‖x_n‖⁴)
        rt = local.resp_t
        sq = np.einsum("nd,nd->n", x, x)
        return (rt * rt).sum(axis=0) * (3.0 + sq + sq * sq)

    # ---------------------------------------------------------------- ELBO
    def local_elbo(self, local: GMMLocal) -> np.ndarray:
        return local.log_norm

    def local_elbo_given_resp(self, lam, x, resp) -> np.ndarray:
        """Per-record local ELBO term for arbitrary responsibilities r."""
        log_rho = self._log_rho_t(lam, self.check_batch(x))[0].T
        with np.errstate(divide="ignore", invalid="ignore"):
            ent = np.where(resp > 0, resp * np.log(resp), 0.0)
        return (resp * log_rho).sum(axis=1) - ent.sum(axis=1)

    def global_elbo(self, lam: NatParams) -> float:
        """−KL(q(π) ‖ p(π)) − Σ_k KL(q(μ_k, Λ_k) ‖ p(μ_k, Λ_k)), all constants included."""
        ex = self._expectations(lam)
        alpha, beta, W, nu = ex["alpha"], ex["beta"], ex["W"], ex["nu"]
        a0, b0, m0, nu0 = self._alpha0, self.mean_precision, self._m0, self._nu0
        D = self.n_features
        # Dirichlet KL + Wishart KL(W(W, ν) ‖ W(W0, ν0)), prior-only terms in self._kl_const;
        # one gammaln call for log Γ(Σα), Σ log Γ(α_k) and Σ_k log Γ_D(ν_k/2)
        A = alpha.sum()
        K = len(nu)
        gl = gammaln(np.concatenate([[A], alpha, (0.5 * nu[:, None] - self._half_j).ravel()]))
        kl_pi = gl[0] - gl[1:K + 1].sum() + (alpha - a0) @ ex["E_log_pi"]
        Wf = W.reshape(K, D * D)
        tr = Wf @ self._W0inv_flat
        mgl = gl[K + 1:].sum() + K * 0.25 * D * (D - 1) * math.log(math.pi)
        # E_q(Λ) KL of the conditional Gaussians; (m − m0)ᵀW(m − m0) expanded
        quad = ex["mWm"] - 2.0 * (ex["Wm"] @ m0) + Wf @ self._m0_outer_flat
        kl = ((0.5 * (nu - nu0)) @ ex["psi_D"] + (0.5 * nu0) * ex["logdet_Winv"].sum()
              + (0.5 * nu) @ (tr - D) - mgl
              + 0.5 * (D * b0 * (1.0 / beta).sum() - K * D + D * np.log(beta / b0).sum() + b0 * (nu @ quad)))
        return float(-self._kl_const - kl_pi - kl)

    # -------------------------------------------------------------- domain
    def _block(self, p: NatParams) -> np.ndarray:
        """[[Psi_k, beta_m_k], [beta_m_kᵀ, beta_k]]: PD iff β_k > 0 and W_k⁻¹ ≻ 0."""
        K, D = self.n_components, self.n_features
        A = np.empty((K, D + 1, D + 1))
        A[:, :D, :D] = p["Psi"]
        A[:, :D, D] = p["beta_m"]
        A[:, D, :D] = p["beta_m"]
        A[:, D, D] = p["beta"]
        return A

    def in_domain(self, lam: NatParams) -> bool:
        """True when λ is a valid Dirichlet × Normal-Wishart natural parameter."""
        if not lam.all_finite() or np.any(lam["alpha"] <= 0) or np.any(lam["nu"] <= self.n_features - 1):
            return False
        try:
            np.linalg.cholesky(self._block(lam))
        except np.linalg.LinAlgError:
            return False
        return True

    def max_step(self, lam: NatParams, target: NatParams):
        D = self.n_features
        lim_nw = np.minimum(segment_limit_pd(self._block(lam), self._block(target)),
                            segment_limit_positive(lam["nu"], target["nu"], floor=D - 1.0))
        return [(("alpha",), segment_limit_positive(lam["alpha"], target["alpha"])),
                (("beta", "beta_m", "Psi", "nu"), lim_nw)]

    # ------------------------------------------------------------- scoring
    def responsibilities(self, lam: NatParams, x) -> np.ndarray:
        """E_q[c_n] (n, K): the posterior responsibilities of new records."""
        return self.local_step(lam, self.check_batch(x)).resp

    def predict(self, lam: NatParams, x) -> np.ndarray:
        """MAP component of each record."""
        return self.responsibilities(lam, x).argmax(axis=1)

    def weights(self, lam: NatParams) -> np.ndarray:
        """E_q[π]."""
        return lam["alpha"] / lam["alpha"].sum()

    def means(self, lam: NatParams) -> np.ndarray:
        return lam["beta_m"] / lam["beta"][:, None]

    def covariances(self, lam: NatParams) -> np.ndarray:
        """E_q[Λ_k]⁻¹ = W_k⁻¹ / ν_k (scikit-learn's ``covariances_``)."""
        _, _, _, Winv, nu = self.standard(lam)
        return Winv / nu[:, None, None]

    def predictive_logpdf(self, lam: NatParams, x) -> np.ndarray:
        """log p(x* | data) = log Σ_k E[π_k] St(x* | m_k, L_k, ν_k + 1 − D).

        Student-t with ν'_k = ν_k + 1 − D degrees of freedom and precision
        L_k = ν'_k β_k / (1 + β_k) W_k (Bishop 2006, eq. 10.81–10.82).
        """
        x = self.check_batch(x)
        alpha, beta, m, Winv, nu = self.standard(lam)
        D = self.n_features
        dof = nu + 1.0 - D
        scale = (1.0 + beta) / (dof * beta)                # L_k⁻¹ = scale_k Winv_k
        C = np.linalg.cholesky(Winv * scale[:, None, None])
        P = np.swapaxes(np.linalg.inv(C), 1, 2)
        Y = np.matmul(x, P) - np.einsum("kd,kde->ke", m, P)[:, None, :]
        quad = np.einsum("knd,knd->nk", Y, Y)
        logdet_L = -2.0 * np.log(np.diagonal(C, axis1=1, axis2=2)).sum(axis=1)
        log_t = (gammaln(0.5 * (dof + D)) - gammaln(0.5 * dof) + 0.5 * logdet_L
                 - 0.5 * D * np.log(dof * math.pi) - 0.5 * (dof + D) * np.log1p(quad / dof))
        return logsumexp(log_t + np.log(self.weights(lam)), axis=1)
