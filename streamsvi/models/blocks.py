"""Parameter blocks: the exponential families of λ and the statistics that add (issue 24, part 1).

λ is a set of named **blocks**. A block is a few arrays of λ that belong to
one exponential family q(β_b); the model says which (its math), the engine
says how they are stored and stepped (:mod:`streamsvi.inference.blocks`).
This module is the models' side: it imports nothing from ``inference/``,
``io/`` or ``service/``.

Three things live here.

**Families** (:class:`Family`). One object per block, owning the math of its
natural parameters and nothing else::

    in_domain(arrays) -> bool              is this a valid natural parameter?
    max_step(cur, tgt) -> limits           largest s ≥ 0 with cur + s (tgt − cur) inside,
                                           per row of the block (the fraction-to-boundary rule
                                           of the engine takes min(ρ, τ s) per row)
    temper(arrays, T) -> arrays            the λ whose natural parameter is θ/T (detAVI)
    kl(arrays, prior) -> per-row KL        KL(q ‖ p) to the prior (where written out)

``arrays`` is the tuple of the block's arrays, in the order of ``names``.
Families written here: :class:`Dirichlet` (rows of concentrations; GMM
weights, HMM rows, LDA topics), :class:`NormalWishart` (the GMM's components),
:class:`Gaussian1D` (the known-variance 1-D mixture), :class:`GaussianRows`
(Gaussian rows in precision form, (h, Λ); PMF's users and items) and
:class:`GammaRows` (Gamma rows as (shape, rate); Poisson factorisation).

**Blocks** (:class:`DenseBlock`, :class:`RowBlock`). A declaration: which
arrays, which family, which storage. A dense model lists its blocks in
``param_blocks`` (a tuple of :class:`DenseBlock`); the engine's dense step,
domain check and tempering go through them. A row-wise model lists its
row blocks in ``row_blocks`` (a tuple of :class:`RowBlock`, in the order of
one sweep): rows keyed by id that grow as new ids arrive, each with its own
clock t_i, record count n_i and N_i (the engine's row storage keeps them).

**Statistics that add** (bnpy's ``SuffStatBag``). Dense statistics are
:class:`~streamsvi.models.base.NatParams` (``+`` merges two half-batches).
Sparse statistics of a row block are :class:`RowStats`: the touched rows
and, per touched row, Σ_r w_r t_r, Σ_r t_r, the record count and Σ_r ‖t_r‖²
(the last two for the gradient-variance estimate). ``RowStats + RowStats``
is the statistics of the union of the two batches (rows merged, values added).
Statistics are in the family's flat layout (``GaussianRows``: h-part then the
D×D precision part, row-major; ``GammaRows``: shape-part then rate-part).

A row-wise model writes its math only (see :mod:`streamsvi.inference.blocks`
for the engine's side of the contract)::

    row_blocks                                 (RowBlock(...), ...) in sweep order
    row_keys(x) -> {block: ids per record}     canonical ids of each record's rows
    new_rows(seed, block, ids) -> λ rows       initial natural parameters of new ids
                                               (a deterministic function of seed, block, id)
    begin_batch(x, state_info, rows) -> ctx    per-batch context: ``rows[block]`` holds
                                               each record's local row (0..k−1 over
                                               the touched rows of that block)
    batch_loglik(ctx, caches) -> float         Σ_{r∈S} E_q[log p(x_r | rows)] at the
                                               touched rows' cached moments
    block_stats(block, ctx, caches, weights) -> RowStats
                                               the block's statistics given the other
                                               blocks' current moments
    ``caches[block]``: the family's cached moments of the touched rows (local order),
    updated by the engine after each block's step (so a sweep uses new moments).

Examples
--------
>>> import numpy as np
>>> fam = Dirichlet(per="row")
>>> cur, tgt = (np.array([[1.0, 2.0]]),), (np.array([[-1.0, 2.0]]),)
>>> fam.in_domain(cur), fam.in_domain(tgt), fam.max_step(cur, tgt).tolist()
(True, False, [0.5])
>>> a = RowStats(np.array([0, 2]), np.ones((2, 1)), np.ones((2, 1)), np.array([1, 1]), np.ones(2))
>>> b = RowStats(np.array([2, 3]), np.ones((2, 1)), np.ones((2, 1)), np.array([2, 1]), np.ones(2))
>>> s = a + b
>>> s.rows.tolist(), s.sums_w[:, 0].tolist(), s.counts.tolist()
([0, 2, 3], [1.0, 2.0, 1.0], [1, 3, 1])
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
from scipy.special import digamma, gammaln

from .base import NatParams, segment_limit_pd, segment_limit_positive, temper_dirichlet

__all__ = ["Family", "Dirichlet", "NormalWishart", "Gaussian1D", "GaussianRows", "GammaRows",
           "DenseBlock", "RowBlock", "RowStats", "RowIndex", "blocks_in_domain", "blocks_max_step",
           "blocks_temper", "cholesky_rows", "pd_rows", "tril_inv"]


# ------------------------------------------------------------------ small linear algebra
def cholesky_rows(A) -> tuple[np.ndarray, np.ndarray]:
    """Cholesky factors of a stack (n, p, p) and which rows have one (finite and PD); never raises."""
    n = len(A)
    if n == 0:
        return A.copy(), np.zeros(0, dtype=bool)
    finite = np.isfinite(A).reshape(n, -1).all(axis=1)
    if finite.all():
        try:
            return np.linalg.cholesky(A), np.ones(n, dtype=bool)
        except np.linalg.LinAlgError:
            pass
    L = np.zeros_like(A)
    ok = np.zeros(n, dtype=bool)
    for k in np.flatnonzero(finite):
        try:
            L[k] = np.linalg.cholesky(A[k])
            ok[k] = True
        except np.linalg.LinAlgError:
            pass
    return L, ok


def pd_rows(A) -> np.ndarray:
    """Per row of a stack: finite and positive definite in the sense that Cholesky succeeds.

    The same test the moments and the KL use, so a row that passes can always be inverted.
    """
    return cholesky_rows(A)[1]


def _eigvalsh_rows(K) -> np.ndarray:
    """``eigvalsh`` per row; a row whose eigenvalues fail is given ±inf (so it takes s = 0)."""
    out = np.full(K.shape[:2], np.inf)
    for k in range(len(K)):
        try:
            out[k] = np.linalg.eigvalsh(K[k])
        except np.linalg.LinAlgError:
            pass
    return out


def tril_inv(L) -> np.ndarray:
    """Inverses of a stack of lower-triangular matrices by forward substitution, vectorised.

    For small D this is several times faster than ``np.linalg.inv`` (one LAPACK call per
    matrix); the result is lower triangular like L.
    """
    n, D, _ = L.shape
    X = np.zeros_like(L)
    d = 1.0 / np.diagonal(L, axis1=1, axis2=2)
    for i in range(D):
        X[:, i, i] = d[:, i]
        if i:
            X[:, i, :i] = -np.einsum("nk,nkj->nj", L[:, i, :i], X[:, :i, :i]) * d[:, i, None]
    return X


# ------------------------------------------------------------------ families
class Family:
    """The exponential family of one parameter block (see the module docs).

    Subclasses set ``fields`` (the array names inside the block, e.g. ``("h", "prec")``
    for a row family whose λ arrays are ``<block>_h``, ``<block>_prec``) where that
    matters, and implement the methods below on tuples of arrays.

    A family used in a :class:`RowBlock` (the engine's row storage) also provides
    ``n_lam``, ``n_cache``, ``cache_name``, ``unpack(flat)``, ``pack(arrays, out)``,
    ``cache_view(cache)``, ``prior_rows(init)``, ``target(scale, sums)``,
    ``rescale(lam, r, check_floor)``, ``plain_step(lam_eff, tgt, rho)``,
    ``noisy_step(sums, scale, rho, lam_eff, tgt, tau)``, ``cache_of(lam, L)`` and
    ``sqdist(a, b)``; :class:`GaussianRows` and :class:`GammaRows` document them.
    """

    fields: tuple = ()
    #: row families only: whether the engine's row storage keeps Σ over every row of the cache
    #: in the state (``<block>_total`` in aux, so a resumed state continues bit for bit); a model
    #: reads the totals as ``caches.totals`` (``streamsvi.inference.blocks.RowCaches``)
    keeps_total: bool = False

    def in_domain(self, arrays) -> bool:
        """Finite and inside the family's domain."""
        return _finite(arrays) and self.in_domain_finite(arrays)

    def in_domain_finite(self, arrays) -> bool:  # pragma: no cover - interface
        """:meth:`in_domain` for arrays already known to be finite (the engine checks all of λ at once)."""
        raise NotImplementedError

    def max_step(self, cur, tgt) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def temper(self, arrays, T: float):  # pragma: no cover - interface
        raise NotImplementedError

    def kl(self, arrays, prior) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError(f"{type(self).__name__}.kl is not written out")


def _finite(arrays) -> bool:
    return all(bool(np.isfinite(a).all()) for a in arrays)


class Dirichlet(Family):
    """Dirichlet concentrations α > 0 (natural parameter α − 1).

    ``per="row"``: each row along the last axis is one Dirichlet, and the
    step limit is one number per row (the min over its entries; a 1-D array
    is one row, one limit). ``per="entry"``: one limit per entry (the GMM's
    mixture weights have always been clipped entry by entry).
    """

    def __init__(self, per: str = "row"):
        if per not in ("row", "entry"):
            raise ValueError(f"per must be 'row' or 'entry', got {per!r}")
        self.per = per

    def in_domain_finite(self, arrays) -> bool:
        return all(bool(np.all(a > 0)) for a in arrays)

    def max_step(self, cur, tgt) -> np.ndarray:
        (a,), (b,) = cur, tgt
        lim = segment_limit_positive(a, b)
        if self.per == "entry":
            return lim
        return np.min(lim) if lim.ndim == 1 else lim.min(axis=-1)

    def temper(self, arrays, T):
        return tuple(temper_dirichlet(a, T) for a in arrays)

    def kl(self, arrays, prior) -> np.ndarray:
        """KL(Dir(α) ‖ Dir(α0)) per row (last axis); ``prior`` a tuple (α0,) broadcastable."""
        (a,), (a0,) = arrays, prior
        a0 = np.broadcast_to(a0, a.shape)
        sa, s0 = a.sum(axis=-1), a0.sum(axis=-1)
        return (gammaln(sa) - gammaln(a).sum(axis=-1) - gammaln(s0) + gammaln(a0).sum(axis=-1)
                + ((a - a0) * (digamma(a) - digamma(sa)[..., None])).sum(axis=-1))


class NormalWishart(Family):
    """K Normal–Wishart components as (β, β m, Ψ, ν) (the GMM's storage; see ``gmm.py``).

    Domain: [[Ψ_k, β m_k], [β m_kᵀ, β_k]] positive definite and ν_k > D − 1.
    Tempering: β, β m, Ψ are natural parameters themselves (÷ T); ν's natural
    parameter is (ν − D)/2, so ν_T = D + (ν − D)/T.
    """

    def __init__(self, n_features: int):
        self.D = int(n_features)

    def joint(self, beta, beta_m, Psi):
        K, D = beta.shape[0], self.D
        A = np.empty((K, D + 1, D + 1))
        A[:, :D, :D] = Psi
        A[:, :D, D] = beta_m
        A[:, D, :D] = beta_m
        A[:, D, D] = beta
        return A

    def in_domain_finite(self, arrays) -> bool:
        beta, beta_m, Psi, nu = arrays
        if np.any(nu <= self.D - 1):
            return False
        try:
            np.linalg.cholesky(self.joint(beta, beta_m, Psi))
        except np.linalg.LinAlgError:
            return False
        return True

    def max_step(self, cur, tgt) -> np.ndarray:
        return np.minimum(segment_limit_pd(self.joint(*cur[:3]), self.joint(*tgt[:3])),
                          segment_limit_positive(cur[3], tgt[3], floor=self.D - 1.0))

    def temper(self, arrays, T):
        beta, beta_m, Psi, nu = arrays
        return beta / T, beta_m / T, Psi / T, self.D + (nu - self.D) / T

    def moment_params(self, arrays):
        """(m, β, W, ν) per component from the natural (β, β m, Ψ = W⁻¹ + β m mᵀ, ν)."""
        beta, beta_m, Psi, nu = (np.asarray(a, float) for a in arrays)
        m = beta_m / beta[:, None]
        Winv = Psi - beta_m[:, :, None] * m[:, None, :]
        return m, beta, np.linalg.inv(Winv), nu

    def kl(self, arrays, prior) -> np.ndarray:
        """KL(NW(m, β, W, ν) ‖ NW(m0, β0, W0, ν0)) per component (Bishop 2006, B.79 and §10.2.2).

        The reference form, one component at a time in closed form; the GMM's
        ``global_elbo`` computes the same sum regrouped for speed (tested equal).
        """
        D = self.D
        m, b, W, nu = self.moment_params(arrays)
        m0, b0, W0, nu0 = self.moment_params(tuple(np.broadcast_to(p, a.shape) for p, a in
                                                   zip(prior, arrays)))
        j = np.arange(D)
        _, ld_W = np.linalg.slogdet(W)
        _, ld_W0 = np.linalg.slogdet(W0)
        # E[log|Λ|] under q, and the log normaliser log B(W, ν) of the Wishart
        ElogL = digamma((nu[:, None] - j) / 2).sum(1) + D * np.log(2.0) + ld_W

        def log_B(ld, v):
            return (-0.5 * v * ld - 0.5 * v * D * np.log(2.0) - 0.25 * D * (D - 1) * np.log(np.pi)
                    - gammaln((v[:, None] - j) / 2).sum(1))

        d = m - m0
        tr_W0inv_W = np.einsum("kij,kji->k", np.linalg.inv(W0), W)
        quad = np.einsum("ki,kij,kj->k", d, W, d)
        # E_q[log q(μ, Λ)] − E_q[log p(μ, Λ)], Gaussian part then Wishart part
        gauss = 0.5 * (D * np.log(b / b0) + D * b0 / b - D + b0 * nu * quad)
        wish = (log_B(ld_W, nu) - log_B(ld_W0, nu0) + 0.5 * (nu - nu0) * ElogL
                + 0.5 * nu * (tr_W0inv_W - D))
        return gauss + wish


class Gaussian1D(Family):
    """K scalar Gaussians as natural parameters (η1, η2) = (m/s², −1/(2 s²)); domain η2 < 0."""

    def in_domain_finite(self, arrays) -> bool:
        return bool(np.all(arrays[1] < 0))

    def max_step(self, cur, tgt) -> np.ndarray:
        return segment_limit_positive(-cur[1], -tgt[1])

    def temper(self, arrays, T):
        inv = 1.0 / T
        return tuple(a * inv for a in arrays)

    def kl(self, arrays, prior) -> np.ndarray:
        """KL(N(m, s²) ‖ N(μ0, τ²)) per component, from the natural parameters of both."""
        (e1, e2), (p1, p2) = arrays, tuple(np.broadcast_to(p, a.shape) for p, a in zip(prior, arrays))
        s2, t2 = -0.5 / e2, -0.5 / p2
        m, mu0 = e1 * s2, p1 * t2
        return 0.5 * (np.log(t2 / s2) + (s2 + (m - mu0) ** 2) / t2 - 1.0)


class GaussianRows(Family):
    """Rows of D-dimensional Gaussians in precision form: λ_i = (h_i, Λ_i), mean Λ_i⁻¹ h_i.

    The prior is N(0, diag(c)), η = (0, diag(1/c)), c = ``prior_var`` per
    coordinate. Arrays of a row block ``b`` are ``b_h`` (n, D) and ``b_prec``
    (n, D, D). Statistics are flat (k, D + D²): the h-part, then Λ's part
    row-major.

    The working domain is Λ ⪰ δ·diag(1/c) with δ = ``floor`` (PMF: ½), not
    merely Λ ≻ 0: a nearly singular Λ lets SVI+ noise escalate between two
    blocks that feed each other's statistics. :meth:`noisy_step` is the
    fraction-to-boundary rule of this family for SVI+ (the noise is shrunk
    symmetrically, so the step stays unbiased); :meth:`rescale` stretches a
    row's data part to a new N_i without crossing the floor.

    Cached moments per row (what the engine's row storage keeps beside λ,
    ``cache_name = "E"``): E[X̃X̃ᵀ] of X̃ = (x, 1), (D+1)², and the KL to the
    prior.
    """

    fields = ("h", "prec")
    cache_name = "E"

    def __init__(self, prior_var, floor: float = 0.5):
        pv = np.asarray(prior_var, dtype=np.float64).reshape(-1)
        self.pv = pv
        self.D = D = len(pv)
        self.eta_P = np.diag(1.0 / pv)
        self.floor = float(floor)
        self.n_lam = D + D * D                  # λ columns of a row record: h, then Λ row-major
        self.n_cache = (D + 1) ** 2             # the cached E[X̃X̃ᵀ] (the KL is kept apart)

    # -- layout
    def unpack(self, flat):
        """(h-part (k, D), Λ-part (k, D, D)) of flat rows (λ or statistics)."""
        D = self.D
        return flat[:, :D], flat[:, D:D + D * D].reshape(-1, D, D)

    def cache_view(self, cache):
        D = self.D
        return cache.reshape(-1, D + 1, D + 1)

    # -- domain
    def in_domain_finite(self, arrays) -> bool:
        h, P = arrays
        if len(P) == 0:
            return True
        return bool((np.linalg.eigvalsh(0.5 * (P + np.swapaxes(P, 1, 2)))[:, 0] > 0).all())

    def max_step(self, cur, tgt) -> np.ndarray:
        return segment_limit_pd(cur[1], tgt[1])

    def temper(self, arrays, T):
        h, P = arrays
        return h / T, P / T

    # -- moments and KL
    def moments_kl(self, h, P, L=None):
        """(mean, covariance, E[X̃X̃ᵀ], KL to the prior) of rows, from one Cholesky factor of Λ."""
        if L is None:
            L = np.linalg.cholesky(P)
        n, D = h.shape
        Linv = tril_inv(L)
        S = np.swapaxes(Linv, 1, 2) @ Linv
        m = np.einsum("nij,nj->ni", S, h)
        E = np.empty((n, D + 1, D + 1))
        top = E[:, :D, :D]
        np.multiply(m[:, :, None], m[:, None, :], out=top)
        top += S
        E[:, :D, D] = m
        E[:, D, :D] = m
        E[:, D, D] = 1.0
        pv = self.pv
        logdetP = 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
        kl = 0.5 * ((np.diagonal(S, axis1=1, axis2=2) / pv).sum(axis=1) + (m * m / pv).sum(axis=1)
                    - D + float(np.log(pv).sum()) + logdetP)
        return m, S, E, kl

    def kl(self, arrays, prior=None) -> np.ndarray:
        """KL(N(Λ⁻¹h, Λ⁻¹) ‖ N(0, diag c)) per row (the prior is the family's)."""
        h, P = arrays
        return self.moments_kl(h, P)[3]

    def prior_rows(self, h) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(λ flat (k, n_lam), cache (k, n_cache), KL (k,)) of rows at the prior precision with
        natural mean ``h`` (mean c·h, covariance diag c), in closed form."""
        D, pv, k = self.D, self.pv, len(h)
        m = h * pv
        lam = np.empty((k, self.n_lam))
        lam[:, :D] = h
        lam[:, D:] = self.eta_P.reshape(-1)
        E = np.empty((k, D + 1, D + 1))
        E[:, :D, :D] = np.diag(pv) + m[:, :, None] * m[:, None, :]
        E[:, :D, D] = E[:, D, :D] = m
        E[:, D, D] = 1.0
        return lam, E.reshape(k, -1), 0.5 * (m * m / pv).sum(axis=1)

    # -- the pieces of one row step (called by the engine's row storage)
    def target(self, scale, sums):
        """λ̂ = η + scale · Σ t (per row): (h, Λ)."""
        hs, Ps = self.unpack(sums)
        return scale[:, None] * hs, self.eta_P + scale[:, None, None] * Ps

    def rescale(self, lam, r, check_floor: bool):
        """λ^eff = η + r (λ − η) per row; rows whose result would cross the floor keep λ
        (checked only when ``check_floor``: without SVI+ every data part is PSD)."""
        h_old, P_old = lam
        eta_P = self.eta_P
        h_eff = r[:, None] * h_old
        P_eff = eta_P + r[:, None, None] * (P_old - eta_P)
        if check_floor:
            bad = ~pd_rows(P_eff - self.floor * eta_P)
            h_eff[bad], P_eff[bad] = h_old[bad], P_old[bad]
        return h_eff, P_eff

    def plain_step(self, lam_eff, tgt, rho):
        """(1 − ρ_i) λ^eff + ρ_i λ̂ per row: ((h, Λ), Cholesky factors, rows that failed it)."""
        h_eff, P_eff = lam_eff
        tgt_h, tgt_P = tgt
        new_h = (1.0 - rho)[:, None] * h_eff + rho[:, None] * tgt_h
        new_P = (1.0 - rho)[:, None, None] * P_eff + rho[:, None, None] * tgt_P
        new_P = 0.5 * (new_P + np.swapaxes(new_P, 1, 2))
        L_new, ok = cholesky_rows(new_P)
        return (new_h, new_P), L_new, ~ok

    def noisy_step(self, sums, scale, rho, lam_eff, tgt, tau):
        """The SVI+ step of rows with its noise shrunk symmetrically into the domain.

        Splits the weighted target ``tgt`` into the SVI target (w ≡ 1, from the
        unweighted ``sums``) and the noise ξ = λ̂ − λ̂_SVI, zero-mean and
        symmetric given the batch (a linear function of the Gaussian ε). The row
        moves to ``base + s ρ ξ`` with ``base = (1 − ρ) λ^eff + ρ λ̂_SVI`` and
        s = min(1, τ / ‖ρ L⁻¹ Ξ L⁻ᵀ‖₂), L Lᵀ = Λ_base − δ·diag(1/c), Ξ the
        precision part of ξ: the largest s for which both base ± (s ρ/τ) ξ are
        in the working domain. s(ξ) = s(−ξ), so E_w[λ_new] = base exactly.
        Returns ((h, Λ), rows that must keep their old λ, rows with s < 1).
        A row whose shrunk step fails a Cholesky test takes the SVI step.
        """
        eta_P = self.eta_P
        h_eff, P_eff = lam_eff
        tgt_h, tgt_P = tgt
        hs0, Ps0 = self.unpack(sums)
        base_h = (1.0 - rho)[:, None] * h_eff + rho[:, None] * (scale[:, None] * hs0)
        base_P = (1.0 - rho)[:, None, None] * P_eff + rho[:, None, None] * (eta_P + scale[:, None, None] * Ps0)
        base_P = 0.5 * (base_P + np.swapaxes(base_P, 1, 2))
        xi_h = rho[:, None] * (tgt_h - scale[:, None] * hs0)
        xi_P = rho[:, None, None] * (tgt_P - eta_P - scale[:, None, None] * Ps0)
        xi_P = 0.5 * (xi_P + np.swapaxes(xi_P, 1, 2))
        s = np.zeros(len(rho))
        ok = (np.isfinite(xi_h).all(axis=1) & np.isfinite(xi_P).reshape(len(rho), -1).all(axis=1)
              & np.isfinite(base_P).reshape(len(rho), -1).all(axis=1))
        idx = np.flatnonzero(ok)
        if len(idx):
            L, chol_ok = cholesky_rows(base_P[idx] - self.floor * eta_P)
            idx, L = idx[chol_ok], L[chol_ok]
            if len(idx):
                Linv = tril_inv(L)
                K = Linv @ xi_P[idx] @ np.swapaxes(Linv, 1, 2)
                K = 0.5 * (K + np.swapaxes(K, 1, 2))
                ev = np.linalg.eigvalsh(K) if np.isfinite(K).all() else _eigvalsh_rows(K)
                radius = np.max(np.abs(ev), axis=1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    s[idx] = np.where(radius > tau, tau / radius, 1.0)
                s[idx] = np.where(np.isfinite(s[idx]), s[idx], 0.0)
        shrunk = int(np.count_nonzero(s < 1.0))
        new_h = base_h + s[:, None] * xi_h
        new_P = base_P + s[:, None, None] * xi_P
        bad = ~(pd_rows(new_P) & np.isfinite(new_h).all(axis=1))
        if bad.any():                          # rounding: fall back to the SVI step for these rows
            new_h[bad], new_P[bad] = base_h[bad], base_P[bad]
        keep = ~(pd_rows(new_P) & np.isfinite(new_h).all(axis=1))
        return (new_h, new_P), keep, shrunk

    def cache_of(self, lam, L=None):
        """(cache (k, n_cache), KL (k,)) of stepped rows (``L``: their Cholesky factors, if known)."""
        h, P = lam
        _, _, E, kl = self.moments_kl(h, P, L)
        return E.reshape(len(h), -1), kl

    def pack(self, lam, out):
        """Write (h, Λ) into the λ columns ``out`` (k, n_lam)."""
        h, P = lam
        D = self.D
        out[:, :D] = h
        out[:, D:] = P.reshape(len(h), -1)

    def sqdist(self, a, b) -> float:
        """‖a − b‖² over every coordinate of two (h, Λ) row sets."""
        return float(np.sum((a[0] - b[0]) ** 2) + np.sum((a[1] - b[1]) ** 2))


class GammaRows(Family):
    """Rows of K independent Gamma distributions as (shape a, rate b), natural parameters (a − 1, −b).

    The prior is Gamma(a0, b0) in every coordinate (``prior_shape``, ``prior_rate``:
    scalars or (K,) arrays). Arrays of a row block ``b`` are ``b_shape`` and
    ``b_rate`` (n, K); statistics are flat (k, 2K): the shape part, then the
    rate part (targets η + scale · Σ t). Domain: a > 0, b > 0. The step is the
    engine's fraction-to-boundary rule per row: ρ_i ← min(ρ_i, τ s_max,i).
    Cached moments (``cache_name = "moments"``): E[x] and E[log x], (2K).
    """

    fields = ("shape", "rate")
    cache_name = "moments"

    def __init__(self, n_components: int, prior_shape=0.3, prior_rate=0.3):
        K = self.K = int(n_components)
        self.a0 = np.broadcast_to(np.asarray(prior_shape, dtype=np.float64), (K,)).copy()
        self.b0 = np.broadcast_to(np.asarray(prior_rate, dtype=np.float64), (K,)).copy()
        self.n_lam = 2 * K
        self.n_cache = 2 * K

    def unpack(self, flat):
        K = self.K
        return flat[:, :K], flat[:, K:2 * K]

    def cache_view(self, cache):
        """The cached moments as the model reads them: (k, 2K), E[x] then E[log x]."""
        return cache

    def in_domain_finite(self, arrays) -> bool:
        return all(bool(np.all(a > 0)) for a in arrays)

    def max_step(self, cur, tgt) -> np.ndarray:
        return np.minimum(segment_limit_positive(cur[0], tgt[0]).min(axis=-1),
                          segment_limit_positive(cur[1], tgt[1]).min(axis=-1))

    def temper(self, arrays, T):
        a, b = arrays
        return 1.0 + (a - 1.0) / T, b / T

    def kl(self, arrays, prior=None) -> np.ndarray:
        """KL(Gamma(a, b) ‖ Gamma(a0, b0)) summed over the K coordinates, per row."""
        a, b = arrays
        a0, b0 = self.a0, self.b0
        return ((a - a0) * digamma(a) - gammaln(a) + gammaln(a0) + a0 * (np.log(b) - np.log(b0))
                + a * (b0 - b) / b).sum(axis=-1)

    def prior_rows(self, lam):
        """(λ flat, cache, KL) of new rows given their λ flat (k, 2K)."""
        a, b = self.unpack(lam)
        cache, kl = self.cache_of((a, b))
        return np.array(lam, dtype=np.float64), cache, kl

    def target(self, scale, sums):
        sa, sb = self.unpack(sums)
        return self.a0 + scale[:, None] * sa, self.b0 + scale[:, None] * sb

    def rescale(self, lam, r, check_floor: bool):
        a, b = lam
        a_eff, b_eff = self.a0 + r[:, None] * (a - self.a0), self.b0 + r[:, None] * (b - self.b0)
        if check_floor:
            bad = ~((a_eff > 0).all(axis=1) & (b_eff > 0).all(axis=1))
            a_eff[bad], b_eff[bad] = a[bad], b[bad]
        return a_eff, b_eff

    def plain_step(self, lam_eff, tgt, rho):
        new = tuple((1.0 - rho)[:, None] * c + rho[:, None] * t for c, t in zip(lam_eff, tgt))
        ok = np.isfinite(new[0]).all(axis=1) & np.isfinite(new[1]).all(axis=1) \
            & (new[0] > 0).all(axis=1) & (new[1] > 0).all(axis=1)
        return new, None, ~ok

    def noisy_step(self, sums, scale, rho, lam_eff, tgt, tau):
        """SVI+ step: ρ_i ← min(ρ_i, τ s_max,i) where the weighted target leaves the domain."""
        with np.errstate(invalid="ignore"):
            lim = self.max_step(lam_eff, tgt)
        rho_b = np.minimum(rho, tau * lim)
        new, _, keep = self.plain_step(lam_eff, tgt, rho_b)
        return new, keep, int(np.count_nonzero(rho_b < rho))

    def cache_of(self, lam, L=None):
        a, b = lam
        cache = np.concatenate([a / b, digamma(a) - np.log(b)], axis=1)
        return cache, self.kl((a, b))

    def pack(self, lam, out):
        K = self.K
        out[:, :K], out[:, K:] = lam

    def sqdist(self, a, b) -> float:
        return float(np.sum((a[0] - b[0]) ** 2) + np.sum((a[1] - b[1]) ** 2))


# ------------------------------------------------------------------ block declarations
@dataclass(frozen=True)
class DenseBlock:
    """Arrays ``names`` of a dense λ that form one family's natural parameter."""

    names: tuple
    family: Family


@dataclass(frozen=True)
class RowBlock:
    """A block of rows keyed by id (λ arrays ``<name>_<field>`` for the family's fields).

    ``counts``: N_i of row i, ``"scaled"`` N·n_i/R (its share of the population)
    or ``"seen"`` n_i. ``clock``: t_i of ρ_i = schedule(t_i), ``"updates"`` (the
    row's update count) or ``"ratings"`` (n_i/|S_i|, its records in units of this
    batch's).
    """

    name: str
    family: Family
    counts: str = "scaled"
    clock: str = "updates"

    def __post_init__(self):
        if self.counts not in ("scaled", "seen"):
            raise ValueError(f"RowBlock counts must be 'scaled' or 'seen', got {self.counts!r}")
        if self.clock not in ("updates", "ratings"):
            raise ValueError(f"RowBlock clock must be 'updates' or 'ratings', got {self.clock!r}")


def _block_arrays(lam, block):
    return [lam[n] for n in block.names]


def blocks_in_domain(blocks, lam) -> bool:
    """Every dense block's arrays in its family's domain (λ's finiteness checked once, on its buffer)."""
    return lam.all_finite() and all(b.family.in_domain_finite(_block_arrays(lam, b)) for b in blocks)


def blocks_max_step(blocks, lam, target) -> list:
    """[(names, limits)] per dense block (the form ``model.max_step`` has always returned)."""
    return [(b.names, b.family.max_step(_block_arrays(lam, b), _block_arrays(target, b))) for b in blocks]


def blocks_temper(blocks, target, T):
    """The λ whose natural parameter is θ(target)/T, block by block (names in ``target``'s order)."""
    if T == 1.0:
        return target
    out = {}
    for b in blocks:
        out.update(zip(b.names, b.family.temper(_block_arrays(target, b), T)))
    return NatParams({k: out[k] for k in target})


# ------------------------------------------------------------------ sparse statistics
@dataclass
class RowStats:
    """Statistics of one row block on a batch: values that add (see the module docs).

    ``rows`` ascending unique local rows; per row ``sums_w`` Σ_r w_r t_r, ``sums``
    Σ_r t_r (the same array when there are no weights), ``counts`` the records
    and ``sqsum`` Σ_r ‖t_r‖².
    """

    rows: np.ndarray
    sums_w: np.ndarray
    sums: np.ndarray
    counts: np.ndarray
    sqsum: np.ndarray

    def __add__(self, other: "RowStats") -> "RowStats":
        if not isinstance(other, RowStats):
            return NotImplemented
        rows, inv = np.unique(np.concatenate([self.rows, other.rows]), return_inverse=True)
        n = len(rows)

        def add(a, b):
            out = np.zeros((n,) + a.shape[1:], dtype=np.result_type(a, b))
            np.add.at(out, inv[:len(a)], a)
            np.add.at(out, inv[len(a):], b)
            return out
        sums_w = add(self.sums_w, other.sums_w)
        sums = sums_w if (self.sums is self.sums_w and other.sums is other.sums_w) \
            else add(self.sums, other.sums)
        return RowStats(rows, sums_w, sums, add(self.counts, other.counts), add(self.sqsum, other.sqsum))


# ------------------------------------------------------------------ id → row index
class RowIndex:
    """id → row lookups for append-only id lists (a cache, not state).

    The id lists of successive states are prefixes of one another, so one
    dict serves a whole lineage: an entry ``id → r`` is valid for a list of
    length n iff r < n. New ids extend the dict only from the newest list of
    the lineage (its "tip"); growing an older list (a branch) builds a fresh
    dict. Results never depend on the cache, only the cost does.
    """

    _KEEP = 8

    def __init__(self):
        self._by_list: dict[int, tuple] = {}
        self._lock = threading.Lock()           # scorers may look ids up from several threads

    def _entry(self, ids: list):
        with self._lock:
            e = self._by_list.get(id(ids))
        if e is None or e[0] is not ids:
            e = (ids, {k: r for r, k in enumerate(ids)}, [len(ids)])
            self._remember(e)
        return e

    def _remember(self, e):
        with self._lock:
            if len(self._by_list) >= self._KEEP:
                self._by_list.pop(next(iter(self._by_list)))
            self._by_list[id(e[0])] = e

    def lookup(self, ids: list, keys, grow: bool = True) -> tuple[np.ndarray, list, list]:
        """(rows of ``keys``, the new ids in order, the grown list) — rows ≥ len(ids) are new."""
        _, d, tip = self._entry(ids)
        n = len(ids)
        get = d.get
        if isinstance(keys, np.ndarray):
            keys = keys.tolist()
        rows = np.array([get(k, -1) for k in keys], dtype=np.int64).reshape(-1)
        new: dict = {}
        miss = np.flatnonzero((rows < 0) | (rows >= n))
        for p in miss.tolist():               # ids without a row in this list, in order of appearance
            k = keys[p]
            r = new.get(k)
            if r is None:
                r = new[k] = n + len(new)
            rows[p] = r
        if not new or not grow:
            return rows, list(new), ids
        grown = ids + list(new)
        if tip[0] == n:
            d.update(new)
            tip[0] = len(grown)
            self._remember((grown, d, tip))
        else:
            self._remember((grown, {k: r for r, k in enumerate(grown)}, [len(grown)]))
        return rows, list(new), grown


def top_unseen(rows_of, aux, user, k, exclude, score) -> list:
    """The ``k`` best-scored items for ``user``, best first, as ``[(item id, score), ...]``.

    ``rows_of(aux, side, ids)`` finds rows (−1: unknown); ``score(user_rows, n_items)``
    scores every item row for the user (``user_rows`` an array of one row, −1 for an
    unknown user). Leaves out the items the user already has (``aux["rated"]``, the
    (user row, item row) pairs a row model remembers) and the ids in ``exclude``. Ties
    go to the lower item row. Shared by every model that recommends from row blocks.
    """
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    n_items = len(aux["items"])
    if n_items == 0:
        return []
    urow = rows_of(aux, "user", [user])
    user_row = int(urow[0])
    scores = score(urow, n_items)
    excluded_rows = rows_of(aux, "item", list(exclude)) if len(exclude) else ()
    keep = np.ones(len(scores), dtype=bool)
    rated = aux.get("rated")
    if user_row >= 0 and rated is not None and len(rated):
        keep[rated[rated[:, 0] == user_row, 1]] = False
    ex = np.asarray(excluded_rows, dtype=np.int64)
    keep[ex[ex >= 0]] = False
    cand = np.flatnonzero(keep)
    if len(cand) == 0:
        return []
    kk = min(int(k), len(cand))
    top = cand[np.argpartition(-scores[cand], kk - 1)[:kk]]
    top = top[np.lexsort((top, -scores[top]))]
    items = aux["items"]
    return [(items[j], float(scores[j])) for j in top]
