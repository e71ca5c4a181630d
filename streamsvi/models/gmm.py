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

from ..settings import ConfigKind, Setting
from .base import (ConjugateModel, Mixture, NatParams, PairedStats, RandomRestart, StartsFromData, Tempered,
                   check_matrix, segment_limit_pd, segment_limit_positive, temper_dirichlet)
from functools import cached_property

from .base import NatParams, check_matrix
from .blocks import (DenseBlock, Dirichlet, NormalWishart, blocks_in_domain, blocks_max_step,
                     blocks_temper)

_LOG_2PI = math.log(2.0 * math.pi)

try:  # the stacked LAPACK gufuncs behind np.linalg.cholesky / inv, without the
    # wrappers' per-call checks (they run once per update; see _expectations)
    from numpy.linalg import _umath_linalg as _ula
    _CHOLESKY, _INV = _ula.cholesky_lo, _ula.inv
except (ImportError, AttributeError):  # pragma: no cover - another numpy layout
    _CHOLESKY = _INV = None


def _multigammaln(a: np.ndarray, d: int) -> np.ndarray:
    """log Γ_d(a), vectorised over ``a``."""
    j = np.arange(d)
    return 0.25 * d * (d - 1) * math.log(math.pi) + gammaln(np.asarray(a)[..., None] - 0.5 * j).sum(axis=-1)


#: the starts of :meth:`BayesianGMM.init_params`, the default first
INITS = ("kmeans", "kmeans++", "random_from_data", "random_resp")
#: where m0 and W0 come from when ``mean`` / ``scale`` are not given (:class:`BayesianGMM`)
PRIORS_FROM = ("auto", "settings", "data")
#: ``prior_from = "auto"`` takes m0, W0 from the data when the covariance of the init data has a
#: condition number above this (nearly collinear columns; README, "Gaussian mixtures: initialisation")
AUTO_CONDITION = 1e3


def _sqdist(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """‖x_n − c_k‖² (n, K), as ‖x‖² − 2 x·c + ‖c‖² (one matrix product), clipped at 0."""
    d2 = np.einsum("nd,nd->n", x, x)[:, None] - 2.0 * (x @ c.T) + np.einsum("kd,kd->k", c, c)[None, :]
    return np.maximum(d2, 0.0, out=d2)


def kmeans_plusplus(rng: np.random.Generator, x: np.ndarray, k: int) -> np.ndarray:
    """Indices of ``k`` seed records by greedy k-means++ (D² sampling).

    The first seed is a uniform draw; each next seed is the best, by the
    resulting potential Σ_n min_j ‖x_n − c_j‖², of 2 + ⌊ln k⌋ candidates drawn
    with probability ∝ the squared distance to the nearest seed so far
    (Arthur & Vassilvitskii 2007, with the greedy trials of scikit-learn's
    ``kmeans_plusplus``). A record already chosen has distance 0, so it is
    never drawn again: the indices are distinct, and the seeds distinct
    points while ``x`` has k distinct rows. When fewer remain, the rest are
    uniform draws among the records not yet chosen (or, for k > |x|, with
    replacement).

    >>> x = np.array([[0.0, 0.0], [0.1, 0.0], [10.0, 10.0], [10.0, 10.1]])
    >>> sorted(x[kmeans_plusplus(np.random.default_rng(0), x, 2)][:, 0].round().tolist())
    [0.0, 10.0]
    """
    x = np.asarray(x, float)
    n = x.shape[0]
    idx = np.empty(k, dtype=np.intp)
    idx[0] = rng.integers(n)
    d2 = _sqdist(x, x[idx[:1]])[:, 0]
    n_trials = 2 + int(math.log(k)) if k > 1 else 1
    for j in range(1, k):
        total = float(d2.sum())
        if not total > 0.0:                      # every record coincides with a seed
            free = np.setdiff1d(np.arange(n), idx[:j])
            idx[j:] = rng.choice(free if free.size else n, size=k - j,
                                 replace=free.size < k - j)
            break
        cand = np.searchsorted(np.cumsum(d2), rng.uniform(size=n_trials) * total, side="right")
        cand = np.minimum(cand, n - 1)
        cand_d2 = np.minimum(d2[:, None], _sqdist(x, x[cand]))        # (n, trials)
        best = int(np.argmin(cand_d2.sum(axis=0)))
        idx[j] = cand[best]
        d2 = cand_d2[:, best]
    return idx


def kmeans(rng: np.random.Generator, x: np.ndarray, k: int, max_iter: int = 100):
    """k-means++ seeds, then Lloyd iterations: (centres (k, D), labels (n,)).

    Stops when no label changes or after ``max_iter`` iterations. A cluster
    that empties is reseeded at the record farthest from its centre.

    >>> x = np.array([[0.0, 0.0], [0.2, 0.0], [9.0, 9.0], [9.2, 9.0]])
    >>> c, labels = kmeans(np.random.default_rng(0), x, 2)
    >>> labels.tolist() in ([0, 0, 1, 1], [1, 1, 0, 0])
    True
    """
    x = np.asarray(x, float)
    n = x.shape[0]
    centres = x[kmeans_plusplus(rng, x, k)].copy()
    labels = np.full(n, -1)
    for _ in range(max_iter):
        d2 = _sqdist(x, centres)
        new = d2.argmin(axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
        onehot = np.zeros((k, n))
        onehot[labels, np.arange(n)] = 1.0
        counts, sums = onehot.sum(axis=1), onehot @ x
        empty = counts == 0
        if empty.any() and n >= k:                # reseed at the farthest records
            far = np.argsort(d2[np.arange(n), labels])[::-1][:int(empty.sum())]
            centres[empty] = x[far]
        centres[~empty] = sums[~empty] / counts[~empty, None]
    return centres, labels


@dataclass(frozen=True)
class GMMLocal:
    """Local factors of a minibatch.

    ``resp_t`` (K, n) are the responsibilities r_nk, stored component-major
    (reductions over the K components of each record then run along the long
    axis, several times faster in numpy than along a short last axis);
    ``resp`` is the (n, K) view. ``log_norm`` (n,) is log Σ_k exp(log ρ_nk),
    the record's local ELBO term at the optimal r; ``features_t``
    (T + D + 1, n) are [x_i² | x_i x_j (i < j) | x | 1] feature-major (see
    :meth:`BayesianGMM.features`), shared by the E-step and the statistics so
    both are one matrix product each.
    """

    resp_t: np.ndarray
    log_norm: np.ndarray
    features_t: np.ndarray

    @property
    def resp(self) -> np.ndarray:
        return self.resp_t.T


#: A streaming start gathers at least this many records per component and dimension
#: (:meth:`BayesianGMM.start_size`): the DP mixture, K = 50 in 30 dimensions, trailed
#: scikit-learn from 4,000 records and reached it from 8,000 (bench/gmm_init.py --study start).
START_RECORDS_PER_COMPONENT_DIM = 5

#: The kept start's further CAVI sweeps (``refine_sweeps``) stop once the ELBO per record of
#: the init records changes by less than this.
REFINE_TOL = 1e-4


class BayesianGMM(ConjugateModel, Tempered, RandomRestart, StartsFromData, Mixture, PairedStats):
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
    mean : float, sequence of D floats or None
        m0, the prior mean of the component means. None: 0, or from the data
        (``prior_from``).
    degrees_of_freedom : float or None
        ν0 > D − 1; None means D.
    scale : float, sequence of D floats or D×D matrix, or None
        W0, the Wishart scale (E[Λ] = ν0 W0). A float s means s·I, a vector its
        diagonal. None means I, or from the data (``prior_from``).
    init : {"kmeans", "kmeans++", "random_from_data", "random_resp"}
        How :meth:`init_params` starts (see :data:`INITS`). Every start makes
        responsibilities r of the records it is given and turns them into λ
        the same way (:meth:`init_from_responsibilities`); all draw from the
        engine's random stream, so the same seed gives the same λ.

        * ``"kmeans"`` (default): k-means++ seeding, then Lloyd iterations
          (:func:`kmeans`); r is the hard final assignment. It is scikit-learn's
          ``BayesianGaussianMixture`` start, and the best held-out
          log-likelihood of the four on the real data sets of
          ``bench/gmm_init.py`` (README, "GMM initialisation").
        * ``"kmeans++"``: k-means++ seeding only (:func:`kmeans_plusplus`),
          r the hard nearest-seed assignment.
        * ``"random_from_data"``: K distinct random records as centres, r the
          hard nearest-centre assignment (the default up to 0.1.0).
        * ``"random_resp"``: uniform random soft responsibilities (as
          scikit-learn's ``init_params="random"``).
    n_init : int
        How many starts :meth:`init_params` makes (default 3), each from its
        own draw of ``init``; the one with the highest ELBO on the init data
        after ``init_sweeps`` CAVI sweeps is kept.
    init_sweeps : int
        CAVI sweeps on the init data, λ ← η + (N/|x|) Σ_n E[t(x_n)], run from
        each start before they are compared (default 5). In batch VI they are
        the first sweeps; in the daemon they fit the start's records before
        the first SVI step.
    refine_sweeps : int
        At most this many further CAVI sweeps of the kept start on the same
        records, until its ELBO per record changes by less than
        :data:`REFINE_TOL` (default 100; 0: none). In batch VI they are the
        sweeps batch VI would take next anyway; in the daemon and the river
        face they fit the start's records to convergence before the first
        SVI step, which the steps alone take many passes to make up for
        (README, "The streaming start").
    init_batches : int
        How many minibatches a streaming start gathers before :meth:`init_params`
        (default 4; :meth:`start_size`): the daemon holds back its first
        updates until it has ``init_batches`` × ``batch_size`` records and at
        least 5·K·D (or N, or an empty poll), starts from all of them, then
        steps through them in order. 1 with a small K·D starts from the first
        minibatch alone; from one minibatch in 30 dimensions SVI trails
        batch VI by 0.2 to 0.6 nats per record after 10 passes (README,
        "Gaussian mixtures: initialisation").
    prior_from : {"auto", "settings", "data"}
        Where m0 and W0 come from when ``mean`` / ``scale`` are None.
        ``"settings"``: m0 = 0, W0 = I. ``"data"``: scikit-learn's
        data-dependent prior, m0 = the mean and W0⁻¹ = the covariance of the
        records :meth:`init_params` is given (the whole set for batch VI, the
        start's records in the daemon). ``"auto"`` (default): ``"data"`` when
        there are more than 2D of those records and their covariance has a
        condition number above :data:`AUTO_CONDITION`
        (nearly collinear columns, where W0⁻¹ = I swamps the small
        directions), else ``"settings"``. Decided once (:meth:`fit_prior`)
        and stored as the concrete ``mean`` and ``scale`` settings: a
        snapshot holds them, and a resumed daemon uses the snapshot's values
        (:meth:`adopt_prior`) instead of recomputing them. Until then the
        model's η is the ``"settings"`` one. A value given in ``mean`` or
        ``scale`` is kept as given.
    """

    name = "gmm"
    record_kind = "dense"
    config_kinds = {
        "gmm": ConfigKind("Bayesian Gaussian mixture (Normal-Wishart components)"),
        "gmm_dp": ConfigKind("truncated Dirichlet-process mixture, pi ~ Dirichlet(alpha/K)",
                             defaults={"weight_concentration": 1.0, "mean_precision": 0.1},
                             docs={"weight_concentration": "alpha, the DP concentration, split as alpha/K"},
                             build="_from_dp_settings"),
    }
    settings = {
        "n_components": Setting("int", 3, "K, mixture components (the truncation level for gmm_dp)",
                                low=1, required=True),
        "n_features": Setting("int", 2, "D, values per record", low=1, required=True),
        "weight_concentration": Setting("numbers", 1.0, "alpha0 of the Dirichlet on the weights "
                                        "(a number or K numbers)", low=0, low_open=True),
        "mean_precision": Setting("float", 1.0, "beta0, what the prior mean m0 is worth in records",
                                  low=0, low_open=True),
        "mean": Setting("numbers", None, "m0, a number or D numbers; unset = 0 or from the data "
                        "(prior_from)"),
        "degrees_of_freedom": Setting("float", None, "nu0 > D - 1; unset = D"),
        "scale": Setting("numbers", None, "W0: a number s (s I), D numbers (its diagonal) or a DxD "
                         "matrix; unset = I or from the data (prior_from)"),
        "init": Setting("str", "kmeans", "the start on the start's records: kmeans (k-means++ then "
                        "Lloyd), kmeans++, random_from_data or random_resp", choices=INITS),
        "n_init": Setting("int", 3, "starts made from the start's records, the best ELBO kept", low=1),
        "init_sweeps": Setting("int", 5, "CAVI sweeps on the start's records from each start", low=0),
        "prior_from": Setting("str", "auto", "where m0 and W0 come from when mean / scale are unset: "
                              "settings (0, I), data (the start's records) or auto (data when their "
                              "covariance has a condition number above 1e3)", choices=PRIORS_FROM),
        "init_batches": Setting("int", 4, "minibatches gathered before the streaming start", low=1),
        "refine_sweeps": Setting("int", 100, "at most this many more CAVI sweeps of the kept start, "
                                 "until its ELBO per record changes by < 1e-4; 0 = none", low=0),
    }

    #: Settings that only shape the initial λ (``init_params``): a snapshot made with
    #: other values still resumes (``streamsvi.checkpoint.check_compatible``).
    START_SETTINGS = ("init", "n_init", "init_sweeps", "prior_from", "init_batches", "refine_sweeps")

    @classmethod
    def param_size(cls, settings) -> int:
        """λ's size from the settings (``Model.param_size``)."""
        K, D = int(settings["n_components"]), int(settings["n_features"])
        return K * (D * D + D + 3)                  # alpha, beta, nu, beta_m, Psi

    @classmethod
    def check_cases(cls) -> dict:
        """The check suite's cases (``tests/models/test_checks.py``): a 2-D mixture with a set prior,
        seed 000's prior in 3-D, and the truncated DP mixture."""
        from ..datasets import make_blobs

        def gmm():
            X, _ = make_blobs(400, seed=11)
            return cls(n_components=4, n_features=2, weight_concentration=0.8, mean_precision=0.2,
                       degrees_of_freedom=3.0, scale=0.7), X

        def gmm_paper_prior_3d():
            rng = np.random.default_rng(5)
            X = np.concatenate([rng.normal(-2, 1.0, (150, 3)), rng.normal(2, 0.6, (150, 3)),
                                rng.normal([0, 3, -3], 0.8, (100, 3))])
            return cls.paper_prior(3, 3), X

        def gmm_dp():
            X, _ = make_blobs(300, seed=3)
            return cls.dp_approximation(n_features=2, concentration=1.0, n_components=12), X

        return {"gmm": gmm, "gmm_paper_prior_3d": gmm_paper_prior_3d, "gmm_dp": gmm_dp}

    def __init__(self, n_components=3, n_features=2, weight_concentration=1.0,
                 mean_precision=1.0, mean=None, degrees_of_freedom=None, scale=None,
                 init="kmeans", n_init=3, init_sweeps=5, prior_from="auto", init_batches=4,
                 refine_sweeps=100):
        p = self.check_settings({k: v for k, v in locals().items() if k in self.settings})
        K, D = p["n_components"], p["n_features"]
        a0 = np.asarray(weight_concentration, float)
        a0 = np.full(K, float(a0)) if a0.ndim == 0 else a0
        if a0.shape != (K,):
            raise ValueError(f"weight_concentration must be a number or {K} numbers, "
                             f"got {weight_concentration}")
        m0 = np.asarray(0.0 if mean is None else mean, float)
        if m0.ndim == 0:
            m0 = np.full(D, float(m0))
        if m0.shape != (D,):
            raise ValueError(f"mean must be a number or {D} finite numbers, got {mean}")
        nu0 = float(D if degrees_of_freedom is None else degrees_of_freedom)
        if not nu0 > D - 1:
            raise ValueError(f"degrees_of_freedom must be > n_features - 1 = {D - 1}, "
                             f"got {degrees_of_freedom}")
        W0 = self._scale_matrix(scale, D)
        if W0.shape != (D, D) or not np.allclose(W0, W0.T) or np.any(np.linalg.eigvalsh(W0) <= 0):
            raise ValueError(f"scale must be a positive number, {D} positive numbers or a "
                             f"symmetric positive definite {D}x{D} matrix, got {scale}")
        mean_precision = p["mean_precision"]
        self.n_init, self.init_sweeps = int(n_init), int(init_sweeps)
        self.init_batches = int(init_batches)
        self.refine_sweeps = int(refine_sweeps)
        self.n_components, self.n_features = K, D
        self.weight_concentration = weight_concentration
        self.mean_precision = float(mean_precision)
        # None shows as 0 until decided (fit_prior / adopt_prior); _given says what the caller set
        self._given = (mean is not None, scale is not None)
        self.mean = 0.0 if mean is None else mean
        self.degrees_of_freedom = degrees_of_freedom
        self.scale = scale
        self.init = init
        self.prior_from = prior_from
        self._prior_fitted = prior_from == "settings" or all(self._given)
        self._alpha0, self._nu0 = a0, nu0
        # the pairs (i, j), i ≤ j, of t(x): the D squares first, then i < j row by row
        off = np.triu_indices(D, 1)
        self._triu = (np.concatenate([np.arange(D), off[0]]), np.concatenate([np.arange(D), off[1]]))
        self._triu_w = np.where(self._triu[0] == self._triu[1], -0.5, -1.0)
        self._triu_flat = self._triu[0] * D + self._triu[1]
        T = self._triu_flat.size
        sym = np.empty((D, D), dtype=np.intp)               # (i, j) -> its row in [x_i x_j, i ≤ j]
        sym[self._triu] = np.arange(T)
        sym.T[self._triu] = np.arange(T)
        self._j = np.arange(D, dtype=float)
        self._g_const = 0.5 * D * (math.log(2.0) - _LOG_2PI)
        self._const_coef = np.array([1.0, 0.5, -1.0, -0.5 * D, -0.5])   # rows of Q, see _expectations
        self._set_prior(m0, W0)
        # rows of RᵀZ (K, T + D + 1), flattened, -> the flat buffer of a NatParams laid out as η
        W1 = T + D + 1
        base = np.arange(K)[:, None] * W1
        cnt = (base + T + D).ravel()
        self._stats_index = np.concatenate([cnt, cnt, (base + T + np.arange(D)).ravel(),
                                            (base + sym.ravel()).ravel(), cnt])
        assert self._stats_index.size == self._prior._flat.size

    def _set_prior(self, m0, W0):
        """Every quantity derived from (m0, W0) with the other prior settings: η and the ELBO's constants."""
        K, D = self.n_components, self.n_features
        a0, nu0 = self._alpha0, self._nu0
        self._m0, self._W0 = m0, W0
        self._W0inv = np.linalg.inv(W0)
        b0 = self.mean_precision
        # tr(W0⁻¹ W_k) + β0 m0ᵀ W_k m0 = W_k : (W0⁻¹ + β0 m0 m0ᵀ), one product for all k
        self._kl_quad_tiled = np.tile((self._W0inv + b0 * np.outer(m0, m0)).ravel(), K)
        self._alpha0_sum = float(a0.sum())
        self._m0_nonzero = bool(np.any(m0 != 0.0))
        # every term of −KL that depends on the prior only (see global_elbo)
        kl_const = (-gammaln(a0.sum()) + gammaln(a0).sum()
                    + K * (0.5 * nu0 * np.linalg.slogdet(W0)[1] + multigammaln(0.5 * nu0, D)))
        self._elbo_const = float(-kl_const + K * 0.25 * D * (D - 1) * math.log(math.pi)
                                 + 0.5 * K * D * (1.0 + math.log(b0)))
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
                "init": self.init, "n_init": self.n_init, "init_sweeps": self.init_sweeps,
                "prior_from": self.prior_from, "init_batches": self.init_batches,
                "refine_sweeps": self.refine_sweeps}

    @staticmethod
    def _scale_matrix(scale, D) -> np.ndarray:
        """W0 from the ``scale`` setting: None -> I, s -> sI, a vector -> its diagonal, or the matrix."""
        if scale is None:
            return np.eye(D)
        s = np.asarray(scale, float)
        return s * np.eye(D) if s.ndim == 0 else (np.diag(s) if s.ndim == 1 else s)

    @property
    def prior_pending(self) -> bool:
        """True while ``prior_from`` ("auto", "data") has still to decide m0 or W0 from the init data."""
        return not self._prior_fitted

    def fit_prior(self, x) -> None:
        """Fill the ``mean`` and ``scale`` not given from records ``x`` (``prior_from``).

        ``"data"``, or ``"auto"`` when ``x`` has more than 2D records and
        their covariance a condition number above :data:`AUTO_CONDITION`: m0 = the mean of ``x`` and W0⁻¹ =
        its covariance (ddof 1, plus 1e-6 of its mean variance on the
        diagonal so that a constant column or fewer than D + 1 records still
        give a proper prior; W0⁻¹ = I from a single record). ``"auto"``
        otherwise: m0 = 0 and W0 = I (``scale`` stays None). The values
        become the model's ``mean`` and ``scale`` settings, so a snapshot
        holds them and a model rebuilt from it (or resumed,
        :meth:`adopt_prior`) has the same η. Called by :meth:`init_params`;
        does nothing once decided.
        """
        if not self.prior_pending:
            return
        x = self.check_batch(x)
        D = self.n_features
        cov = None
        if x.shape[0] > 1:
            cov = np.atleast_2d(np.cov(x.T))
            cov = 0.5 * (cov + cov.T) + 1e-6 * max(float(np.trace(cov)) / D, 1e-12) * np.eye(D)
        use_data = self.prior_from == "data"
        # "auto" picks the whole prior or none of it, and never from a rank-deficient handful
        if self.prior_from == "auto" and x.shape[0] > 2 * D and not any(self._given):
            ev = np.linalg.eigvalsh(cov)
            use_data = bool(ev[-1] > AUTO_CONDITION * ev[0])
        if use_data:
            if not self._given[0]:
                self.mean = x.mean(axis=0).tolist()
            if not self._given[1]:
                W0 = np.eye(D) if cov is None else np.linalg.inv(cov)
                self.scale = (0.5 * (W0 + W0.T)).tolist()
        self._prior_fitted = True
        # through the settings' JSON form, so a model rebuilt from get_params is bit-identical
        self._set_prior(np.asarray(self.mean, float) * np.ones(D), self._scale_matrix(self.scale, D))

    def adopt_prior(self, other: "BayesianGMM") -> None:
        """On resume: take the ``mean`` and ``scale`` a snapshot's model resolved from its data.

        Only the ones this model still has to fill (``prior_from`` "auto" or
        "data" and not given): the snapshot's prior is used as it was, never
        recomputed (a snapshot from before ``prior_from`` existed counts as
        m0 = its ``mean``, W0 = its ``scale`` or I). Given values are left for
        ``streamsvi.checkpoint.check_compatible`` to compare.
        """
        if not self.prior_pending:
            return
        if not self._given[0]:
            self.mean = other.mean if other.mean is not None else 0.0
        if not self._given[1]:
            self.scale = other.scale
        self._prior_fitted = True
        self._set_prior(np.asarray(self.mean, float) * np.ones(self.n_features),
                        self._scale_matrix(self.scale, self.n_features))

    @classmethod
    def paper_prior(cls, n_components, n_features, alpha=0.5, c=10.0, **kw):
        """Seed 000 §IV-D settings: a = D, B = I, c = 10, α (see module docs)."""
        return cls(n_components, n_features, weight_concentration=alpha,
                   mean_precision=1.0 / c, mean=0.0, degrees_of_freedom=n_features,
                   scale=1.0, **kw)

    @classmethod
    def empirical_prior(cls, n_components, x, **kw):
        """scikit-learn's data-dependent prior (``BayesianGaussianMixture`` defaults) from records ``x``.

        m0 = the mean of ``x``, W0⁻¹ = its covariance (ddof 1), ν0 = D,
        β0 = 1. The values are stored as the ``mean`` and ``scale`` settings,
        so a checkpoint keeps them. On standardised, uncorrelated columns this
        is the default prior; it matters when columns are strongly correlated
        (README, "Gaussian mixtures: initialisation"). ``kw`` overrides any of
        them and passes other settings (``weight_concentration``, ``init``, ...).

        >>> x = np.random.default_rng(0).normal(5.0, 2.0, (500, 2))
        >>> m = BayesianGMM.empirical_prior(3, x)
        >>> np.round(m.mean, 1).tolist(), np.round(np.linalg.inv(m.scale).diagonal()).tolist()
        ([4.8, 5.0], [4.0, 4.0])
        """
        x = np.asarray(x, float)
        if x.ndim != 2 or x.shape[0] < 2 or not np.all(np.isfinite(x)):
            raise ValueError(f"empirical_prior needs a finite (n, D) array with n >= 2, got shape {x.shape}")
        cov = np.atleast_2d(np.cov(x.T))
        if np.linalg.eigvalsh(cov)[0] <= 0:
            raise ValueError("empirical_prior: the covariance of x is singular (a constant or "
                             "linearly dependent column); drop it or pass scale")
        kw.setdefault("mean", x.mean(axis=0))
        kw.setdefault("scale", np.linalg.inv(cov))
        kw.setdefault("degrees_of_freedom", float(x.shape[1]))
        kw.setdefault("mean_precision", 1.0)
        return cls(n_components, x.shape[1], **kw)

    @classmethod
    def _from_dp_settings(cls, weight_concentration, n_features, n_components, **kw):
        """``model.kind = "gmm_dp"``: :meth:`dp_approximation` with the config's settings (unset ones left out)."""
        return cls.dp_approximation(n_features, concentration=weight_concentration, n_components=n_components,
                                    **{k: v for k, v in kw.items() if v is not None})

    @classmethod
    def dp_approximation(cls, n_features, concentration=1.0, n_components=50, c=10.0, **kw):
        """Truncated Dirichlet-process mixture, π ~ Dirichlet(α/K, …, α/K) (seed 000 §IV-E).

        The finite symmetric Dirichlet with total mass α converges to DP(α G0)
        as K → ∞ (Ishwaran & Zarepour 2002); components the data do not need
        keep weight near zero.
        """
        kw.setdefault("mean_precision", 1.0 / c)
        kw.setdefault("degrees_of_freedom", n_features)
        if kw.get("prior_from", "auto") == "settings":
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
        """Initial λ: the best of ``n_init`` starts, each ``init_sweeps`` CAVI sweeps on ``x``,
        then up to ``refine_sweeps`` more sweeps of the kept one (:meth:`_refine`).

        A start is λ = η + (n_total/|x|) Σ_n t(x_n, r_n) with r from the
        ``init`` setting (:meth:`start_params`); each sweep is
        λ ← η + (n_total/|x|) Σ_n E_q[t(x_n)] (CAVI on ``x`` as if it were
        the whole data set); the kept start has the highest ELBO on ``x``
        at its last λ (:meth:`init_elbo`). ``x`` is all the data init sees:
        the full data set for batch VI, the start's records in the daemon
        and the river face (:meth:`start_size`).
        Everything is drawn from ``rng``: the same seed gives the same λ.
        """
        x = self.check_batch(x)
        self.fit_prior(x)
        scale = float(n_total) / x.shape[0]
        Zt = self.features(x)                   # t(x_n) once for every sweep on x
        best_elbo, best, best_local = -math.inf, None, None
        for _ in range(self.n_init):
            lam = self._start(rng, x, n_total, Zt)
            for _ in range(self.init_sweeps):
                lam = self.prior() + self.suffstats(self._local(lam, Zt), x) * scale
            if self.n_init == 1:
                best = lam
                break
            local = self._local(lam, Zt)
            elbo = self._scaled_elbo(lam, local, scale)
            if best is None or elbo > best_elbo:
                best_elbo, best, best_local = elbo, lam, local
        return self._refine(best, x, n_total, Zt, best_local)

    def _refine(self, lam: NatParams, x, n_total, Zt, local=None) -> NatParams:
        """Up to ``refine_sweeps`` CAVI sweeps of ``lam`` on ``x`` (scaled to ``n_total``),
        until the ELBO per record changes by less than :data:`REFINE_TOL`. ``Zt``: the
        features of ``x``; ``local``: the local step at ``lam``, if already made."""
        if not self.refine_sweeps:
            return lam
        scale = float(n_total) / x.shape[0]
        local = self._local(lam, Zt) if local is None else local
        prev = self._scaled_elbo(lam, local, scale)
        for _ in range(self.refine_sweeps):
            lam = self.prior() + self.suffstats(local, x) * scale
            local = self._local(lam, Zt)
            elbo = self._scaled_elbo(lam, local, scale)
            if abs(elbo - prev) < REFINE_TOL * n_total:
                break
            prev = elbo
        return lam

    def start_size(self, batch_size: int) -> int:
        """Records a streaming start gathers before :meth:`init_params`: ``init_batches``
        minibatches, and at least :data:`START_RECORDS_PER_COMPONENT_DIM` · K · D, so that
        k-means and each component's covariance have records enough (the daemon caps it at N)."""
        return max(self.init_batches * int(batch_size),
                   START_RECORDS_PER_COMPONENT_DIM * self.n_components * self.n_features)

    def init_elbo(self, lam: NatParams, x, n_total) -> float:
        """The ELBO of λ on ``x`` as if it were the whole data set scaled to ``n_total`` records."""
        x = self.check_batch(x)
        local = self.local_step(lam, x)
        return self._scaled_elbo(lam, local, float(n_total) / x.shape[0])

    def _scaled_elbo(self, lam: NatParams, local: GMMLocal, scale: float) -> float:
        """The ELBO of λ with its local step on records scaled by ``scale`` = n_total/|x|."""
        return self.global_elbo(lam) + scale * float(np.add.reduce(local.log_norm))

    def start_params(self, rng: np.random.Generator, x, n_total) -> NatParams:
        """One start λ = η + (n_total/|x|) Σ_n t(x_n, r_n), r from the ``init`` setting."""
        x = self.check_batch(x)
        return self._start(rng, x, n_total, self.features(x))

    def _start(self, rng, x, n_total, Zt) -> NatParams:
        """:meth:`start_params` given the features ``Zt`` of ``x``."""
        n, K = x.shape[0], self.n_components
        if self.init == "random_resp":
            resp = rng.uniform(size=(n, K))
            resp /= resp.sum(axis=1, keepdims=True)
        else:
            if self.init == "kmeans":
                labels = kmeans(rng, x, K)[1]
            else:
                if self.init == "kmeans++":
                    centres = x[kmeans_plusplus(rng, x, K)]
                else:
                    centres = x[rng.choice(n, size=K, replace=n < K)]
                labels = _sqdist(x, centres).argmin(axis=1)
            resp = np.zeros((n, K))
            resp[np.arange(n), labels] = 1.0
        return self._from_resp(resp, x, n_total, Zt)

    def init_from_responsibilities(self, resp, x, n_total=None) -> NatParams:
        """λ = η + (n_total/|x|) Σ_n t(x_n, r_n) for given responsibilities."""
        x = self.check_batch(x)
        return self._from_resp(np.asarray(resp, float), x, x.shape[0] if n_total is None else n_total,
                               self.features(x))

    def _from_resp(self, resp, x, n_total, Zt) -> NatParams:
        stats = self.suffstats(GMMLocal(np.ascontiguousarray(resp.T), np.zeros(len(x)), Zt), x)
        return self.prior() + stats * (n_total / x.shape[0])

    # ---------------------------------------------------------- local step
    def features(self, x) -> np.ndarray:
        """t(x_n) = [x_i² | x_i x_j for i < j | x | 1] of every record, feature-major: (T + D + 1, n).

        Feature-major, so each block x_i · x_{i..D−1} is one product of
        contiguous rows (no index temporaries) and both matrix products of the
        E-step read it as it is.

        >>> BayesianGMM(1, 2).features(np.array([[2.0, 3.0]])).ravel().tolist()
        [4.0, 9.0, 6.0, 2.0, 3.0, 1.0]
        """
        D = self.n_features
        T = self._triu_flat.size
        Zt = np.empty((T + D + 1, x.shape[0]))
        xt = Zt[T:T + D]
        xt[...] = x.T
        Zt[T + D] = 1.0
        if x.shape[0] == 1:                                 # one record: one outer product, same values
            r = Zt[T:T + D, 0]
            Zt[:T, 0] = np.multiply.outer(r, r).ravel().take(self._triu_flat)
            return Zt
        np.multiply(xt, xt, out=Zt[:D])                     # x_i², then x_i x_j for i < j
        o = D
        for i in range(D - 1):
            np.multiply(xt[i], xt[i + 1:], out=Zt[o:o + D - 1 - i])
            o += D - 1 - i
        return Zt

    def _expectations(self, lam: NatParams) -> dict:
        """Everything about q(β) the local step and the ELBO need, computed once per λ.

        One Cholesky and one inverse per component (numpy's LAPACK gufuncs
        called directly when available); raises ``LinAlgError`` if a W_k⁻¹ is
        not positive definite. Cached for the last λ seen (λ is never
        mutated, so identity is a safe key). This runs once per update, so
        it is written for few numpy calls: one digamma call
        for all of ψ(ν_k/2 − j/2), ψ(α_k) and ψ(Σα), whose arguments are
        kept for the one gammaln call of :meth:`global_elbo`.
        """
        cache = self._cache
        if cache is not None and cache[0] is lam:
            return cache[1]
        alpha, beta, bm, nu = lam["alpha"], lam["beta"], lam["beta_m"], lam["nu"]
        K, D = self.n_components, self.n_features
        KD, T = K * D, self._triu_flat.size
        m = bm / beta[:, None]
        Winv = bm[:, :, None] * m[:, None, :]
        np.subtract(lam["Psi"], Winv, out=Winv)             # Cholesky reads the lower triangle
        if _CHOLESKY is None:                              # pragma: no cover
            C, EL = np.linalg.cholesky(Winv), np.linalg.inv(Winv)
        else:                                              # NaN rows if not PD: checked below
            C, EL = _CHOLESKY(Winv, signature="d->d"), _INV(Winv, signature="d->d")
        EL *= nu[:, None, None]                            # E[Λ_k] = ν_k W_k
        args = np.empty(KD + K + 1)                        # [ν_k/2 − j/2 | α_k | Σα]
        half = args[:KD].reshape(K, D)
        np.subtract(nu[:, None], self._j, out=half)
        half *= 0.5
        args[KD:KD + K] = alpha
        args[KD + K] = np.add.reduce(alpha)
        dg = digamma(args)
        # the per-component scalars, one row each, so that the constant of
        # log ρ is one product and the ELBO's sums are one reduction:
        #   Eg = E[log π_k] + g (g = −D/2 log π), ψ_D = Σ_j ψ(ν_k/2 − j/2),
        #   ld = Σ_j log C_jj = ½ log|W_k⁻¹|, 1/β_k, m_kᵀE[Λ_k]m_k, log β_k
        Q = np.empty((6, K))
        np.subtract(dg[KD:KD + K], dg[KD + K] - self._g_const, out=Q[0])
        np.add.reduce(dg[:KD].reshape(K, D), axis=1, out=Q[1])
        np.add.reduce(np.log(C.reshape(K, D * D)[:, ::D + 1]), axis=1, out=Q[2])
        np.divide(1.0, beta, out=Q[3])
        # log ρ_nk = Gt_k · t(x_n) = E[log π_k] + ½E[log|Λ_k|] − D/2 log 2π
        #                           − ½(D/β_k + (x−m_k)ᵀE[Λ_k](x−m_k))
        Gt = np.empty((K, T + D + 1))
        np.multiply(EL.reshape(K, D * D).take(self._triu_flat, axis=1), self._triu_w, out=Gt[:, :T])
        ELm = Gt[:, T:T + D]                               # E[Λ_k] m_k
        np.matmul(EL, m[:, :, None], out=ELm[:, :, None])
        np.matmul(m[:, None, :], ELm[:, :, None], out=Q[4, :, None, None])
        np.log(beta, out=Q[5])
        # constant: Eg + ½ψ_D − ld − ½D/β − ½mᵀE[Λ]m (E[log|Λ|] = ψ_D + D log 2 − 2 ld)
        c = Gt[:, T + D]
        np.matmul(self._const_coef, Q[:5], out=c)
        if not math.isfinite(np.add.reduce(c)):            # Winv = C Cᵀ failed: fail loudly
            bad = np.flatnonzero(~np.isfinite(Q[2])).tolist()
            raise np.linalg.LinAlgError(f"W_k⁻¹ is not positive definite for components {bad}: "
                                        f"λ is outside the domain" if bad else
                                        f"non-finite E-step coefficients for components "
                                        f"{np.flatnonzero(~np.isfinite(c)).tolist()}")
        ex = {"alpha": alpha, "nu": nu, "EL": EL, "ELm": ELm, "Q": Q, "args": args, "Gt": Gt}
        self._cache = (lam, ex)
        return ex

    def _log_rho_t(self, lam, x, Zt=None):
        """log ρ (K, n) and the features Zt (T + D + 1, n)."""
        Zt = self.features(x) if Zt is None else Zt
        return np.dot(self._expectations(lam)["Gt"], Zt), Zt

    def local_step(self, lam: NatParams, x, temperature=1.0) -> GMMLocal:
        """r_nk ∝ exp(E[log π_k] + ½E[log|Λ_k|] − D/2 log 2π − ½E[(x−μ_k)ᵀΛ_k(x−μ_k)]).

        At ``temperature`` T ≠ 1, r_nk ∝ exp(log ρ_nk / T) (detAVI) and
        ``log_norm`` is T log Σ_k exp(log ρ_nk / T), the tempered local
        objective at its optimum (the ELBO term only at T = 1).
        """
        return self._local(lam, self.features(x), temperature)

    def _local(self, lam: NatParams, Zt, temperature=1.0) -> GMMLocal:
        """:meth:`local_step` given the features ``Zt`` of the records (:meth:`features`)."""
        L, Zt = self._log_rho_t(lam, None, Zt)              # (K, n), log-sum-exp in place
        if temperature != 1.0:
            L *= 1.0 / temperature
        mx = L.max(axis=0)
        L -= mx
        np.exp(L, out=L)
        s = L.sum(axis=0)
        L /= s
        np.log(s, out=s)
        s += mx
        if temperature != 1.0:
            s *= temperature
        return GMMLocal(L, s, Zt)

    @cached_property
    def param_blocks(self) -> tuple:
        """λ's blocks (``streamsvi.models.blocks``): q(π) a Dirichlet (clipped entry by entry),
        the K components a Normal–Wishart (β, β m, Ψ, ν)."""
        return (DenseBlock(("alpha",), Dirichlet(per="entry")),
                DenseBlock(("beta", "beta_m", "Psi", "nu"), NormalWishart(self.n_features)))

    def temper(self, target: NatParams, T: float) -> NatParams:
        """The λ whose natural parameter is θ(target)/T (seed 002 eq. 8), block by block.

        Conventions: ``alpha`` is the Dirichlet concentration (natural parameter
        α − 1, so α_T = 1 + (α − 1)/T); ``beta``, ``beta_m`` and ``Psi`` are
        natural parameters of the Normal-Wishart themselves (÷ T); ``nu`` is
        stored as ν, whose natural parameter is (ν − D)/2 (the power of |Λ|), so
        ν_T = D + (ν − D)/T. Every result is in the domain for T ≥ 1.
        """
        return blocks_temper(self.param_blocks, target, T)

    def random_init(self, rng: np.random.Generator, x, n_total) -> NatParams:
        """A fresh random initialisation η_t for stochastic annealing (seed 002 §4.3).

        A random allocation of a data set of ``n_total`` records to the K
        components (n ~ Multinomial(n_total, 1/K)) gives q(π) = Dir(α0 + n) and
        ν_k = ν0 + n_k; each mean m_k ~ N(x̄, Σ̂) (empirical mean and covariance
        of ``x``); q(μ_k | Λ_k) has β_k = 10, so its precision at E[Λ_k] is ten
        times the empirical precision; and W_k⁻¹ = ν_k Σ̂, so E[Λ_k] = Σ̂⁻¹.
        """
        x = self.check_batch(x)
        K, D = self.n_components, self.n_features
        n_k = rng.multinomial(int(round(float(n_total))), np.full(K, 1.0 / K)).astype(float)
        mean = x.mean(axis=0)
        cov = np.cov(x, rowvar=False).reshape(D, D) if x.shape[0] > 1 else np.eye(D)
        cov = cov + 1e-6 * max(float(np.trace(cov)) / D, 1e-12) * np.eye(D)
        m = rng.multivariate_normal(mean, cov, size=K)
        nu = self._nu0 + n_k
        beta = np.full(K, 10.0)
        return self.from_standard(self._alpha0 + n_k, beta, m, nu[:, None, None] * cov, nu)

    # ------------------------------------------------- sufficient statistics
    def _unpack(self, P):
        """NatParams from a C-contiguous block of rows of RᵀZ (K, T + D + 1): one gather."""
        return NatParams._wrap(self._prior._layout, P.ravel().take(self._stats_index))

    def suffstats(self, local: GMMLocal, x, weights=None) -> NatParams:
        rt = local.resp_t if weights is None else local.resp_t * np.asarray(weights)[None, :]
        return self._unpack(np.dot(rt, local.features_t.T))

    def suffstats_pair(self, local: GMMLocal, x, weights):
        """(weighted, unweighted) statistics with one matrix product."""
        K = self.n_components
        rt = local.resp_t
        Rt = np.empty((2 * K, rt.shape[1]))
        np.multiply(rt, np.asarray(weights)[None, :], out=Rt[:K])
        Rt[K:] = rt
        P = np.dot(Rt, local.features_t.T)
        return self._unpack(P[:K]), self._unpack(P[K:])

    def suffstats_sqnorm(self, local: GMMLocal, x) -> np.ndarray:
        """‖t_n‖² = ‖r_n‖² (3 + ‖x_n‖² + ‖x_n‖⁴): t_n = r_n ⊗ (1, 1, 1, x_n, x_n x_nᵀ) factorises."""
        rt = local.resp_t
        sq = np.add.reduce(local.features_t[:self.n_features], axis=0)   # the rows x_i²
        out = sq * sq
        out += sq
        out += 3.0
        out *= np.add.reduce(rt * rt, axis=0)
        return out

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
        """−KL(q(π) ‖ p(π)) − Σ_k KL(q(μ_k, Λ_k) ‖ p(μ_k, Λ_k)), all constants included.

        The Dirichlet KL plus the Normal-Wishart KL (Bishop 2006 §10.2.2, B.79),
        regrouped so every per-component term is one vector operation. With
        E_k = E[log π_k], ψ_k = Σ_j ψ(ν_k/2 − j/2), ℓ_k = ψ_k − log|W_k⁻¹| and
        q_k = tr(W0⁻¹W_k) + β0 (m_k − m0)ᵀW_k(m_k − m0)::

            Σ_k log Γ(α_k) − log Γ(Σα) − (α − α0)·E + Σ_k log Γ_D(ν_k/2)
            + ½ν0 Σ_k ℓ_k − ½ Σ_k ν_k (ψ_k + q_k − D) − ½D Σ_k (β0/β_k + log β_k)
            + terms of the prior only (computed once in ``__init__``).
        """
        ex = self._expectations(lam)
        alpha, nu, args, Q = ex["alpha"], ex["nu"], ex["args"], ex["Q"]
        D = self.n_features
        b0 = self.mean_precision
        gl = gammaln(args)                                 # [log Γ(ν_k/2 − j/2) | log Γ(α_k) | log Γ(Σα)]
        _, s_psi, s_ld, s_ib, s_mELm, s_logb = np.add.reduce(Q, axis=1).tolist()
        # Σ_k ν_k q_k = Σ_k E[Λ_k] : (W0⁻¹ + β0 m0 m0ᵀ) + β0 Σ_k (m_kᵀE[Λ_k]m_k − 2 m0ᵀE[Λ_k]m_k)
        nq = float(np.dot(ex["EL"].ravel(), self._kl_quad_tiled)) + b0 * s_mELm
        if self._m0_nonzero:
            nq -= 2.0 * b0 * float(np.add.reduce(ex["ELm"] @ self._m0))
        # Eg = E[log π] + g, so (α − α0)·E[log π] = (α − α0)·Eg − g (Σα − Σα0)
        a_E = float(np.dot(alpha - self._alpha0, Q[0])) - self._g_const * (float(args[-1]) - self._alpha0_sum)
        # ℓ_k = ψ_D − 2 ld_k;  −½ Σ ν_k (ψ_k − D) − ½ Σ_k ν_k q_k
        return (self._elbo_const + float(np.add.reduce(gl)) - 2.0 * float(gl[-1]) - a_E
                + (0.5 * self._nu0) * (s_psi - 2.0 * s_ld)
                - 0.5 * (float(np.dot(nu, Q[1])) - D * float(np.add.reduce(nu)) + nq)
                - (0.5 * D) * (b0 * s_ib + s_logb))

    # -------------------------------------------------------------- domain
    def in_domain(self, lam: NatParams) -> bool:
        """True when λ is a valid Dirichlet × Normal-Wishart natural parameter."""
        return blocks_in_domain(self.param_blocks, lam)

    def max_step(self, lam: NatParams, target: NatParams):
        return blocks_max_step(self.param_blocks, lam, target)

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
