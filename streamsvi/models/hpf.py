"""Hierarchical Poisson factorisation (HPF) of implicit feedback (Gopalan, Hofman & Blei 2015).

Data: counts y_ui ≥ 0 of plays, clicks or purchases of item i by user u. A
record is a ``(user, item, count)`` triple of the **ratings record kind**
(:class:`~streamsvi.models.pmf.Ratings`, the count in its ``rating`` field;
see "Records" below for why).

Generative model (the paper's §2, Fig. 1; a, a', b', c, c', d' are its
names)::

    ξ_u ~ Gamma(a', a'/b')           user activity          (shape, rate)
    θ_uk | ξ_u ~ Gamma(a, ξ_u)       user preferences, k = 1..K
    η_i ~ Gamma(c', c'/d')           item popularity
    β_ik | η_i ~ Gamma(c, η_i)       item attributes
    y_ui ~ Poisson(θ_uᵀ β_i)         every pair (u, i), zeros included

With the auxiliary split y_ui = Σ_k z_uik, z_uik ~ Poisson(θ_uk β_ik), every
complete conditional is Gamma or multinomial (the paper's eqs. 5–8).

Variational family (mean field, the paper's eq. 9 and Fig. 5)::

    q(θ_uk) = Gamma(γ^shp_uk, γ^rte_uk)     ``user_shape``, ``user_rate``  (U, K)
    q(ξ_u)  = Gamma(a' + K a, κ^rte_u)      ``user_hyper``                 (U,)
    q(β_ik) = Gamma(λ^shp_ik, λ^rte_ik)     ``item_shape``, ``item_rate``  (I, K)
    q(η_i)  = Gamma(c' + K c, τ^rte_i)      ``item_hyper``                 (I,)
    q(z_ui) = Mult(y_ui, φ_ui)              local, one per non-zero count

The shapes of ξ and η are constants of the model (a' + K a, c' + K c), so only
their rates are stored. Gammas are stored as (shape, rate); the natural
parameter is (shape − 1, −rate), an affine function of it, so the step
λ ← (1 − ρ) λ + ρ λ̂ is the same in either coordinate.

Coordinate updates (the paper's Fig. 5)::

    φ_uik ∝ exp{E[log θ_uk] + E[log β_ik]}                                (1)
    γ_uk  = ( a + Σ_i y_ui φ_uik ,  E[ξ_u] + Σ_i E[β_ik] )                 (2)
    κ^rte_u = a'/b' + Σ_k E[θ_uk]                                         (3)
    λ_ik  = ( c + Σ_u y_ui φ_uik ,  E[η_i] + Σ_u E[θ_uk] )                 (4)
    τ^rte_i = c'/d' + Σ_k E[β_ik]                                         (5)

with E[θ] = shape/rate and E[log θ] = ψ(shape) − log(rate).

The streaming form. The shapes in (2) and (4) are sums over the **non-zero**
counts only: a record (u, i, y) contributes the statistic y φ_ui to row u
and to row i, exactly as a rating contributes to two rows in PMF, so they
are estimated from a minibatch with PMF's per-row scaling (below). The
rates are not: Σ_i E[β_ik] in (2) runs over **every** item, because every
pair (u, i), observed or not, is a Poisson draw, and a zero count still
pushes θ_u down through the −θ_uᵀβ_i term of its likelihood. No minibatch
of non-zero records can estimate that sum, but it does not depend on the
user, so the stream keeps it as two running totals::

    B_k = Σ_{item rows i} E_q[β_ik]       the first K of ``caches.totals["item"]``
    Θ_k = Σ_{user rows u} E_q[θ_uk]       the first K of ``caches.totals["user"]``

and the rate targets of (2) and (4) are E[ξ_u] + B and E[η_i] + Θ, exact
(not sampled) for the items (users) seen so far. The engine's row storage
keeps the totals (``streamsvi.inference.blocks.RowCaches``; the family
declares ``keeps_total``): a total costs K numbers, and keeping it costs
only the touched rows: a new row adds its initial E[·], an updated row adds
E_new − E_old, and the state carries it (``aux["user_total"]``), so a
resumed snapshot continues bit for bit. When a batch touches every row of a
side (batch VI, small data sets) the total is summed again from the rows,
which also clears rounding drift (tested: < 1e-10 relative after 60
minibatch steps otherwise). An item never seen in the stream is not in B:
on a fixed data set every item is in after the first epoch; on an open
stream B covers the catalogue seen so far, which is what a stream can know.

The step is the engine's (``streamsvi.inference.blocks.row_update`` and
``step_rows``); this file declares two row blocks, ``user`` and ``item``, of
the family :class:`HierarchicalGammaRows`, and writes the math: φ, the
statistics per touched row (``block_stats``: :class:`RowStats`, values that
add), the record-free part of the rate target, the ELBO terms. One update
on a minibatch S of records touches the users S_u and items S_i in it. It is a
block coordinate sweep, users first, like PMF's: φ (1) at the current λ,
then users (2), (3); φ again at the new users, then items (4), (5). For a
touched row, with n_u its records seen so far (this batch included), R the
records seen, N the engine's ``n_total``::

    N_u     = N n_u / R  (row_counts = "scaled")  or  n_u  ("seen")
    shape^ = a + (N_u/|S_u|) Σ_{r ∈ S_u} w_r y_r φ_r           target of (2)
    rate^  = E[ξ_u] + B                                        exact
    shape_eff = a + (N_u / N_u^old)(shape − a)                 old data part rescaled to N_u
    (shape, rate) ← (1 − ρ_u)(shape_eff, rate) + ρ_u (shape^, rate^)
    κ^rte_u ← (1 − ρ_u) κ^rte_u + ρ_u (a'/b' + Σ_k E[θ_uk])    (3) at the new θ_u

ρ_u = schedule(t_u), t_u the updates of row u (its own Robbins–Monro
clock, as in PMF). w_r are the engine's SVI+ weights (1 for SVI). In batch
mode (S = all records, ρ = 1) N_u/|S_u| = 1 and the sweep is exact CAVI
(1)–(5), so the batch ELBO never decreases (each step maximises the ELBO in
its block; tested). A negative weight can make a target shape ≤ 0: the row
then takes ρ_u' = min(ρ_u, τ s_max) with s_max the step at which a shape
reaches 0 (the engine's fraction-to-boundary rule, per row), counted in
``domain_clipped``. The rates never leave the domain (sums of positive
means).

The ELBO (``UpdateInfo.elbo``, at λ before the update)::

    L = Σ_{r ∈ S} (N/|S|) [ y_r log Σ_k exp(E log θ_uk + E log β_ik) − log y_r! ]
        − Σ_k Θ_k B_k                                    (−E[θ_uᵀβ_i] over every pair)
        + Σ_u { E log p(ξ_u) − E log q(ξ_u) + Σ_k [E log p(θ_uk | ξ_u) − E log q(θ_uk)] }
        + Σ_i { the same for η_i, β_i }

(the first line is the φ-maximised local term: ``batch_loglik``; the
second ``global_loglik`` from the totals; the rest is the rows' KL, cached
per row by the family). In batch mode it is the exact ELBO of the data.

Records. HPF uses the ratings record kind with the count in ``rating``
rather than a kind of its own: the record is the same triple, so the JSON
and binary codecs, the id rules (42 ≡ "42"), the dead-letter reasons and
the validator (``[validation] min_rating = 0``) all carry over, and a new
kind would have been 4–7 more files for no new information. ``check_batch``
refuses counts that are negative or non-finite; in the daemon the ratings
kind's validator dead-letters them first (``out_of_range``, ``non_finite``):
the class's ``min_rating = 0`` is a floor no config can lower. A non-integer count (a play fraction, a dwell time) is accepted:
every update above is defined for real y ≥ 0, and log y! is lgamma(y + 1).

Scoring: :meth:`HPF.recommend` ranks items by the posterior mean rate
E[θ_u]ᵀE[β_i] leaving out what the user already has (the pairs of the
training stream, kept in ``aux["rated"]`` with ``remember_rated``);
:meth:`HPF.predictive_logpdf` is the Poisson log-likelihood of held-out
counts at that rate.

Examples
--------
>>> import numpy as np
>>> from streamsvi.inference import batch_vi
>>> rng = np.random.default_rng(0)
>>> th, be = rng.gamma(1.0, 1.0, (40, 2)), rng.gamma(1.0, 1.0, (30, 2))
>>> u, i = np.divmod(np.arange(1200), 30)
>>> y = rng.poisson((th[u] * be[i]).sum(1))
>>> x = Ratings(u[y > 0], i[y > 0], y[y > 0])
>>> model = HPF(n_factors=2)
>>> engine = batch_vi(model, len(x))
>>> state, infos = engine.fit(engine.init(x, seed=1), x, n_steps=20)
>>> infos[-1].elbo > infos[0].elbo
True
"""
from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property

import numpy as np
from scipy.special import digamma, gammaln, logsumexp

from ..ratings_batch import Ratings, as_ratings, canonical_id
from ..settings import ConfigKind, Setting
from .base import ChecksState, ConjugateModel, NatParams, RowWise, ScoresRecords, segment_limit_positive
from .blocks import Family, RowBlock, RowIndex, RowStats, top_unseen
from .pmf import _hashed_normals, rating_score_columns

__all__ = ["HPF"]

_NAMES = ("user_shape", "user_rate", "user_hyper", "item_shape", "item_rate", "item_hyper")
_ROW_KEYS = tuple(f"{s}_{c}" for s in ("user", "item") for c in ("n", "t", "N", "kl", "moments"))


def _row_sums(rows, values, n) -> np.ndarray:
    """Σ of ``values`` (S, K) per row in [0, n), in record order (one code for every caller,
    so the step's and :meth:`HPF.suffstats`'s sums agree bit for bit)."""
    out = np.zeros((n,) + values.shape[1:])
    np.add.at(out, rows, values)
    return out


class HierarchicalGammaRows(Family):
    """Rows of K Gammas with a Gamma hyperprior on their rate (HPF's users or items).

    Row u: q(θ_uk) = Gamma(shape_k, rate_k), q(ξ_u) = Gamma(A, hyper_rate) with
    A = a' + K a fixed; the prior is θ_uk | ξ_u ~ Gamma(a, ξ_u), ξ_u ~ Gamma(a', r0)
    (r0 = a'/b'). λ arrays ``<block>_shape``, ``<block>_rate`` (n, K) and
    ``<block>_hyper`` (n,); flat λ (2K + 1): shape, rate, hyper rate. Cache
    (``moments``, 2K + 2): E[θ], E[log θ], E[ξ], E[log ξ]. The row's KL term is the
    whole prior part of the row, KL(q(ξ) ‖ p(ξ)) + Σ_k E_q[log q(θ_k) − log p(θ_k | ξ)],
    which depends on the row alone.

    The family owns the blend (bnpy's "each parameter family owns its blend"):

    * target: shape = a + (N_i/|S_i|) Σ_r w_r y_r φ_r (the statistics' shape part, scaled
      like every row family's); rate = the statistics' rate part **as it is**: the model
      puts the record-free target E[ξ_u] + Σ_i E[β_i] there (``HPF.block_stats``), which
      no batch estimates and which must not be scaled by N_i/|S_i| (module docs, "the
      streaming form"). The unweighted ``sums`` carry 0 there, so the gradient-variance
      estimate sees only the y φ statistics.
    * rescale (a new N_i): only the shape's data part, shape − a.
    * step: (shape, rate) ← (1 − ρ)(shape, rate)_eff + ρ target, then the hyper rate
      ← (1 − ρ) hyper + ρ (r0 + Σ_k E[θ_k]) at the new θ (CAVI's order, (2) then (3)).
    * SVI+: a weighted shape target can be ≤ 0; the row takes ρ ← min(ρ, τ s_max) with
      s_max where a shape reaches 0 (the rates stay positive).
    """

    fields = ("shape", "rate", "hyper")
    cache_name = "moments"
    keeps_total = True          # Σ_rows E[θ] (E[β]): the all-items sums of the rates (module docs)

    def __init__(self, K, a, A, r0, rate0=None):
        self.K, self.a, self.A, self.r0 = int(K), float(a), float(A), float(r0)
        self.a_hyper = self.A - self.K * self.a              # a', the hyperprior's shape
        self.n_lam = 2 * self.K + 1
        self.n_cache = 2 * self.K + 2

    def unpack(self, flat):
        K = self.K
        return flat[:, :K], flat[:, K:2 * K], flat[:, 2 * K]

    def pack(self, lam, out):
        K = self.K
        out[:, :K], out[:, K:2 * K], out[:, 2 * K] = lam

    def in_domain(self, arrays) -> bool:
        return all(bool(np.isfinite(x).all() and np.all(x > 0)) for x in arrays)

    def max_step(self, cur, tgt) -> np.ndarray:
        return segment_limit_positive(cur[0], tgt[0]).min(axis=-1)

    def temper(self, arrays, T):
        raise NotImplementedError("HPF rows are not tempered (annealing kinds: none, svi+)")

    def kl(self, arrays, prior=None) -> np.ndarray:
        shape, rate, hyper = arrays
        a, A, a0, r0 = self.a, self.A, self.a_hyper, self.r0
        Ex, Elx = A / hyper, digamma(A) - np.log(hyper)
        lp_x = a0 * np.log(r0) - gammaln(a0) + (a0 - 1) * Elx - r0 * Ex
        lq_x = A * np.log(hyper) - gammaln(A) + (A - 1) * Elx - hyper * Ex
        Et, Elt = shape / rate, digamma(shape) - np.log(rate)
        lp_t = a * Elx[:, None] - gammaln(a) + (a - 1) * Elt - Ex[:, None] * Et
        lq_t = shape * np.log(rate) - gammaln(shape) + (shape - 1) * Elt - rate * Et
        return (lq_x - lp_x) + (lq_t - lp_t).sum(axis=1)

    def cache_of(self, lam, L=None):
        shape, rate, hyper = lam
        cache = np.concatenate([shape / rate, digamma(shape) - np.log(rate), (self.A / hyper)[:, None],
                                (digamma(self.A) - np.log(hyper))[:, None]], axis=1)
        return cache, self.kl(lam)

    def cache_view(self, cache):
        return cache

    def prior_rows(self, lam):
        cache, kl = self.cache_of(self.unpack(lam))
        return np.array(lam, dtype=np.float64), cache, kl

    def target(self, scale, sums):
        K = self.K
        return self.a + scale[:, None] * sums[:, :K], sums[:, K:2 * K]

    def rescale(self, lam, r, check_floor: bool):
        shape, rate, hyper = lam
        eff = self.a + r[:, None] * (shape - self.a)
        if check_floor:
            bad = ~(eff > 0).all(axis=1)
            eff[bad] = shape[bad]
        return eff, rate, hyper

    def plain_step(self, lam_eff, tgt, rho):
        shape, rate, hyper = lam_eff
        rc = (1.0 - rho)[:, None]
        new_shape = rc * shape + rho[:, None] * tgt[0]
        new_rate = rc * rate + rho[:, None] * tgt[1]
        new_hyper = (1.0 - rho) * hyper + rho * (self.r0 + (new_shape / new_rate).sum(axis=1))
        ok = (np.isfinite(new_shape).all(axis=1) & np.isfinite(new_rate).all(axis=1) & np.isfinite(new_hyper)
              & (new_shape > 0).all(axis=1) & (new_rate > 0).all(axis=1) & (new_hyper > 0))
        return (new_shape, new_rate, new_hyper), None, ~ok

    def noisy_step(self, sums, scale, rho, lam_eff, tgt, tau):
        with np.errstate(divide="ignore", invalid="ignore"):
            lim = self.max_step(lam_eff, tgt)
        rho_b = np.minimum(rho, tau * lim)
        new, _, keep = self.plain_step(lam_eff, tgt, rho_b)
        return new, keep, int(np.count_nonzero(rho_b < rho))

    def sqdist(self, a, b) -> float:
        return float(np.sum((a[0] - b[0]) ** 2) + np.sum((a[1] - b[1]) ** 2))


def _positive(doc, default):
    return Setting("float", default, doc, low=0, low_open=True)


class HPF(ConjugateModel, RowWise, ChecksState, ScoresRecords):
    """Hierarchical Poisson factorisation; users and items are growing rows of Gamma factors.

    Parameters
    ----------
    n_factors : int
        K, the number of latent factors.
    theta_shape, activity_shape, activity_mean : float
        a, a', b' of the paper: θ_uk ~ Gamma(a, ξ_u), ξ_u ~ Gamma(a', a'/b')
        (so E[ξ_u] = b').
    beta_shape, popularity_shape, popularity_mean : float
        c, c', d': β_ik ~ Gamma(c, η_i), η_i ~ Gamma(c', c'/d').
    init_scale : float
        New rows start at shape = prior shape · exp(init_scale · z), z ~ N(0, 1)
        drawn from a hash of (seed, side, id): deterministic and independent of
        arrival order (the random start that breaks the symmetry of the K factors).
    row_counts : {"scaled", "seen"}
        N_u: N n_u / R (epochs over a fixed set) or n_u (one pass over a stream).
    remember_rated : bool
        Keep the (user, item) pairs seen so that :meth:`recommend` leaves them
        out (16 bytes per record in every snapshot).

    The defaults a = a' = c = c' = 0.3, b' = d' = 1 are the paper's (§4).
    """

    name = "hpf"
    record_kind = "ratings"
    #: counts are >= 0: the ratings kind's validator dead-letters a negative count (out_of_range)
    #: whatever ``[validation] min_rating`` says, so no record can fail an update
    min_rating = 0.0
    config_kinds = {"hpf": ConfigKind("hierarchical Poisson factorisation of (user, item, count) records "
                                      "(the count in 'rating')")}
    settings = {
        "n_factors": Setting("int", 10, "K, the number of latent factors", low=1),
        "theta_shape": _positive("a: theta_uk ~ Gamma(a, xi_u)", 0.3),
        "activity_shape": _positive("a': the user activity xi_u ~ Gamma(a', a'/b')", 0.3),
        "activity_mean": _positive("b': E[xi_u], the prior mean of the user activity", 1.0),
        "beta_shape": _positive("c: beta_ik ~ Gamma(c, eta_i)", 0.3),
        "popularity_shape": _positive("c': the item popularity eta_i ~ Gamma(c', c'/d')", 0.3),
        "popularity_mean": _positive("d': E[eta_i], the prior mean of the item popularity", 1.0),
        "init_scale": _positive("new rows start at shape = prior shape * exp(init_scale * z), z ~ N(0, 1)",
                                0.3),
        "row_counts": Setting("str", "scaled", "N_i per user/item: scaled = n_total * n_i / records seen, "
                              "seen = the row's records seen so far (one pass over a stream)",
                              choices=("scaled", "seen")),
        "remember_rated": Setting("bool", True, "keep the seen (user, item) pairs so that top-k leaves "
                                  "them out"),
    }
    #: the coordinate blocks in the order of one sweep (module docs, (2)–(5))
    blocks = (("user_shape", "user_rate"), ("user_hyper",), ("item_shape", "item_rate"),
              ("item_hyper",))
    scoring_methods = ("recommend", "predict_rate", "predict_count", "predictive_logpdf")
    #: ``fitted.score(x, top_k=10)``: a record of a user alone gets that many items
    score_options = ("top_k",)
    score_column_names = ("user", "item", "prediction", "sd", "log_density", "top_k")
    # annealing kinds: none and svi+, for it is neither Tempered nor RandomRestart (φ could be
    # tempered; not written yet)

    def __init__(self, n_factors: int = 10, theta_shape: float = 0.3, activity_shape: float = 0.3,
                 activity_mean: float = 1.0, beta_shape: float = 0.3, popularity_shape: float = 0.3,
                 popularity_mean: float = 1.0, init_scale: float = 0.3, row_counts: str = "scaled",
                 remember_rated: bool = True):
        p = self.check_settings({k: v for k, v in locals().items() if k in self.settings})
        for k, v in p.items():
            setattr(self, k, v)
        K = self.n_factors
        # per side: (shape of θ/β, shape of ξ/η (fixed), prior rate of ξ/η, initial rate of θ/β)
        self._side = {
            "user": (self.theta_shape, self.activity_shape + K * self.theta_shape,
                     self.activity_shape / self.activity_mean, self.activity_mean),
            "item": (self.beta_shape, self.popularity_shape + K * self.beta_shape,
                     self.popularity_shape / self.popularity_mean, self.popularity_mean),
        }
        self._index = {"user": RowIndex(), "item": RowIndex()}

    def get_params(self) -> dict:
        return {k: getattr(self, k) for k in self.settings}

    @classmethod
    def check_cases(cls) -> dict:
        """The shared check suite's case: K = 2 on counts drawn from the model itself."""
        return {"hpf": lambda: (cls(n_factors=2), sample_counts())}

    # ------------------------------------------------------------ batches
    def check_batch(self, x) -> Ratings:
        """A :class:`Ratings` of counts: at least one record, every count finite and ≥ 0."""
        x = as_ratings(x, "an HPF batch (the count in 'rating')")
        y = x.rating
        bad = ~(np.isfinite(y) & (y >= 0))
        if bad.any():
            at = np.flatnonzero(bad)[:10]
            raise ValueError(f"HPF counts must be finite numbers >= 0; got {y[at].tolist()} at records "
                             f"{at.tolist()}")
        return x

    # ------------------------------------------------------------ moments
    @staticmethod
    def _mean(shape, rate):
        return shape / rate

    @staticmethod
    def _elog(shape, rate):
        return digamma(shape) - np.log(rate)

    def _act_mean(self, side, act_rate):
        return self._side[side][1] / act_rate

    # ------------------------------------------------------------ λ and aux
    def prior(self, n_users: int = 0, n_items: int = 0) -> NatParams:
        """The top of the hierarchy in λ's layout: shapes a (c), rates b' (d') = E[ξ] (E[η]) and the
        activity (popularity) rates a'/b' (c'/d'). The coordinate targets depend on λ: :meth:`prior_like`."""
        out = {}
        for side, n, act in (("user", n_users, "user_hyper"), ("item", n_items, "item_hyper")):
            a, _, r0, rate0 = self._side[side]
            out[f"{side}_shape"] = np.full((n, self.n_factors), a)
            out[f"{side}_rate"] = np.full((n, self.n_factors), rate0)
            out[act] = np.full(n, r0)
        return NatParams({k: out[k] for k in _NAMES})

    def init_params(self, rng, x, n_total) -> NatParams:
        """Not for HPF: its initial state (λ and aux together) comes from the engine's row storage."""
        raise TypeError("an HPF state (λ and its aux) is made by the engine's row storage: "
                        "use SVI(model, n_total).init(x)")

    def check_state(self, lam, aux) -> None:
        """Raise ``ValueError`` unless (λ, aux) is a consistent HPF state of this model."""
        if set(lam) != set(_NAMES):
            raise ValueError(f"HPF parameters must be {sorted(_NAMES)}, got {sorted(lam)}")
        need = {"seed", "users", "items"} | set(_ROW_KEYS)
        if not isinstance(aux, Mapping) or not need <= set(aux):
            missing = sorted(need - set(aux or {}))
            raise ValueError(f"an HPF state needs aux with {missing}")
        K = self.n_factors
        for side in ("user", "item"):
            n = len(aux[f"{side}s"])
            for nm, shp in ((f"{side}_shape", (n, K)), (f"{side}_rate", (n, K)), (f"{side}_hyper", (n,)),
                            (f"{side}_moments", (n, 2 * K + 2))):
                got = np.shape(aux[nm] if nm.endswith("moments") else lam[nm])
                if got != shp:
                    raise ValueError(f"HPF {nm} has shape {got}, expected {shp} for {n} {side}s and K={K}")
            for c in ("n", "t", "N", "kl"):
                if np.shape(aux[f"{side}_{c}"]) != (n,):
                    raise ValueError(f"aux {side}_{c} must have {n} entries, got {np.shape(aux[f'{side}_{c}'])}")

    # ------------------------------------------------------------ row blocks (streamsvi.models.blocks)
    @cached_property
    def row_blocks(self) -> tuple:
        """Users and items, keyed by id: Gamma rows with their hierarchy (:class:`HierarchicalGammaRows`)."""
        return tuple(RowBlock(side, HierarchicalGammaRows(self.n_factors, *self._side[side]),
                              counts=self.row_counts) for side in ("user", "item"))

    #: users from the current items, then items from the new users (module docs, (1)–(5))
    sweep_order = ("user", "item")
    pair_blocks = ("user", "item")

    @property
    def pair_log(self):
        """The name of the seen (user row, item row) log in ``aux`` (``remember_rated``), or None."""
        return "rated" if self.remember_rated else None

    def init_row_values(self) -> dict:
        return {}

    def row_keys(self, x) -> dict:
        return {"user": x.user, "item": x.item}

    def new_rows(self, seed, side, ids) -> np.ndarray:
        """λ (flat: shape, rate, hyper rate) of new rows: hashed random shapes (``init_scale``), the
        prior mean rate b' (d'), and the hyper rate at its coordinate optimum (3) / (5)."""
        a, _, r0, rate0 = self._side[side]
        shape = a * np.exp(self.init_scale * _hashed_normals(seed, side, ids, self.n_factors))
        rate = np.full_like(shape, rate0)
        hyper = r0 + self._mean(shape, rate).sum(axis=1)
        return np.concatenate([shape, rate, hyper[:, None]], axis=1)

    def begin_batch(self, x, plain: dict, rows: dict) -> dict:
        return {"y": x.rating, "rows": rows}

    def _batch_phi(self, ctx, caches):
        K = self.n_factors
        return self._phi(caches["user"][:, K:2 * K][ctx["rows"]["user"]],
                         caches["item"][:, K:2 * K][ctx["rows"]["item"]])

    def batch_loglik(self, ctx, caches) -> float:
        """Σ_r [y_r log Σ_k exp(E log θ_uk + E log β_ik) − log y_r!] at the touched rows' moments."""
        _, lse = self._batch_phi(ctx, caches)
        return float(np.sum(self.local_elbo_terms(ctx["y"], lse)))

    def global_loglik(self, ctx, caches) -> float:
        """−Σ_k Θ_k B_k: −E[θ_uᵀβ_i] summed over every (user, item) pair, zeros included."""
        K = self.n_factors
        return -float(caches.totals["user"][:K] @ caches.totals["item"][:K])

    def block_stats(self, side, ctx, caches, weights) -> RowStats:
        """Per touched row of ``side``: Σ_r w_r y_r φ_r (φ at the current moments of both sides) and,
        in the rate part, the record-free rate target E[ξ_u] + Σ_i E[β_i] (every item row:
        ``caches.totals``). See :class:`HierarchicalGammaRows` for why the rate part is there."""
        K = self.n_factors
        other = "item" if side == "user" else "user"
        phi, _ = self._batch_phi(ctx, caches)
        t = ctx["y"][:, None] * phi
        inv = ctx["rows"][side]
        n = len(caches[side])
        sums = np.zeros((n, 2 * K))
        sums[:, :K] = _row_sums(inv, t, n)
        sums_w = sums.copy()
        if weights is not None:
            sums_w[:, :K] = _row_sums(inv, np.asarray(weights, dtype=np.float64)[:, None] * t, n)
        sums_w[:, K:] = caches[side][:, 2 * K][:, None] + caches.totals[other][:K][None, :]
        counts = np.bincount(inv, minlength=n)
        sq = _row_sums(inv, np.einsum("rk,rk->r", t, t)[:, None], n)[:, 0]
        return RowStats(np.arange(n), sums_w, sums, counts, sq)

    def in_domain(self, lam) -> bool:
        return lam.all_finite() and all(bool(np.all(np.asarray(lam[k]) > 0)) for k in _NAMES)

    # ------------------------------------------------------------ local step and statistics
    def _rows(self, aux, x):
        urows, new_u, _ = self._index["user"].lookup(aux["users"], x.user, grow=False)
        irows, new_i, _ = self._index["item"].lookup(aux["items"], x.item, grow=False)
        if new_u or new_i:
            raise ValueError(f"ids without a row: users {new_u[:5]}, items {new_i[:5]}; start the state "
                             f"with SVI.init on these records, or let an update add them")
        return urows, irows

    @staticmethod
    def _phi(elog_u, elog_i):
        """φ (1) per record from the E[log] rows of its user and item; also log Σ_k exp(·) (the ELBO)."""
        s = elog_u + elog_i
        lse = logsumexp(s, axis=1)
        return np.exp(s - lse[:, None]), lse

    def local_step(self, lam, x, aux=None):
        """φ (1) of every record of ``x`` at λ (every id must have a row in ``aux``)."""
        x = self.check_batch(x)
        if aux is None:
            raise ValueError("HPF.local_step needs aux (the id→row maps of the state)")
        urows, irows = self._rows(aux, x)
        phi, lse = self._phi(self._elog(lam["user_shape"], lam["user_rate"])[urows],
                             self._elog(lam["item_shape"], lam["item_rate"])[irows])
        return {"urows": urows, "irows": irows, "phi": phi, "lse": lse,
                "shape": (len(lam["user_shape"]), len(lam["item_shape"]))}

    def suffstats(self, local, x, weights=None) -> NatParams:
        """Σ_r w_r y_r φ_r per user and per item row (the data part of the shapes (2), (4)).

        Additive over records. The rates (and ξ, η) have no per-record statistic: their
        targets are in :meth:`prior_like` (module docs, "the streaming form").
        """
        t = x.rating[:, None] * local["phi"]
        if weights is not None:
            t = np.asarray(weights, dtype=np.float64)[:, None] * t
        nu, ni = local["shape"]
        K = self.n_factors
        return NatParams(user_shape=_row_sums(local["urows"], t, nu), user_rate=np.zeros((nu, K)),
                         user_hyper=np.zeros(nu), item_shape=_row_sums(local["irows"], t, ni),
                         item_rate=np.zeros((ni, K)), item_hyper=np.zeros(ni))

    def prior_like(self, lam) -> NatParams:
        """The part of each block's coordinate target that no record carries, at λ.

        Shapes: a and c. Rates: E[ξ_u] + Σ_i E[β_i] and E[η_i] + Σ_u E[θ_u] (over every
        row: the zero counts). ξ, η: a'/b' + Σ_k E[θ_uk] and c'/d' + Σ_k E[β_ik]. Hence
        ``prior_like(λ) + suffstats(local_step(λ, x), x)`` is the CAVI target of every
        block at λ (the hierarchy makes it depend on λ; for a flat model it is η).
        """
        out = {}
        Em = {s: self._mean(lam[f"{s}_shape"], lam[f"{s}_rate"]) for s in ("user", "item")}
        for side, other, act in (("user", "item", "user_hyper"), ("item", "user", "item_hyper")):
            a, A, r0, _ = self._side[side]
            out[f"{side}_shape"] = np.full_like(Em[side], a)
            out[f"{side}_rate"] = self._act_mean(side, lam[act])[:, None] + Em[other].sum(axis=0)[None, :]
            out[act] = r0 + Em[side].sum(axis=1)
        return NatParams({k: out[k] for k in _NAMES})

    # ------------------------------------------------------------ ELBO
    def _row_kl(self, side, shape, rate, hyper_rate) -> np.ndarray:
        """The KL term of each row (its Gammas and its ξ or η): :meth:`HierarchicalGammaRows.kl`."""
        return self.row_blocks[0 if side == "user" else 1].family.kl((shape, rate, hyper_rate))

    def global_elbo(self, lam) -> float:
        """Σ_rows −KL − Σ_k Θ_k B_k (the prior terms and the all-pairs −E[θᵀβ])."""
        kl = sum(float(np.sum(self._row_kl(s, lam[f"{s}_shape"], lam[f"{s}_rate"], lam[act])))
                 for s, act in (("user", "user_hyper"), ("item", "item_hyper")))
        Th = self._mean(lam["user_shape"], lam["user_rate"]).sum(axis=0)
        B = self._mean(lam["item_shape"], lam["item_rate"]).sum(axis=0)
        return -kl - float(Th @ B)

    @staticmethod
    def local_elbo_terms(y, lse) -> np.ndarray:
        """y log Σ_k exp(E log θ_uk + E log β_ik) − log y! per record (the φ-maximised term)."""
        return y * lse - gammaln(y + 1.0)

    def elbo(self, lam, aux, x) -> float:
        """The ELBO of the data ``x`` at λ (every id must have a row)."""
        loc = self.local_step(lam, x, aux)
        return self.global_elbo(lam) + float(np.sum(self.local_elbo_terms(x.rating, loc["lse"])))

    # ------------------------------------------------------------ scoring
    def rows_of(self, aux, side: str, ids) -> np.ndarray:
        """Rows of ``ids`` (canonicalised) on ``side`` ("user"/"item"); −1 for unknown ids."""
        keys = [canonical_id(i, side) for i in ids]
        rows, _, _ = self._index[side].lookup(aux[f"{side}s"], keys, grow=False)
        return np.where(rows < len(aux[f"{side}s"]), rows, -1)

    def _means(self, lam, side, rows) -> np.ndarray:
        """E[θ_u] (or E[β_i]) of rows; the prior's a/b' (c/d') for row −1 (an unknown id)."""
        a, _, _, rate0 = self._side[side]
        out = np.full((len(rows), self.n_factors), a / rate0)
        known = rows >= 0
        if known.any():
            r = rows[known]
            out[known] = self._mean(np.asarray(lam[f"{side}_shape"])[r], np.asarray(lam[f"{side}_rate"])[r])
        return out

    def predict_rate(self, lam, users, items, aux=None) -> np.ndarray:
        """E_q[θ_u]ᵀ E_q[β_i], the posterior mean Poisson rate of each (user, item) pair."""
        aux = self._need_aux(aux)
        Eu = self._means(lam, "user", self.rows_of(aux, "user", users))
        Ei = self._means(lam, "item", self.rows_of(aux, "item", items))
        return np.einsum("nk,nk->n", Eu, Ei)

    def predictive_logpdf(self, lam, x, aux=None) -> np.ndarray:
        """log Poisson(y | E[θ_u]ᵀE[β_i]) per record (held-out counts, zeros included)."""
        x = self.check_batch(x)
        mu = self.predict_rate(lam, x.user, x.item, aux=aux)
        y = x.rating
        return y * np.log(mu) - mu - gammaln(y + 1.0)

    def recommend(self, lam, user, k: int = 10, exclude=(), aux=None) -> list[tuple[str, float]]:
        """The ``k`` items with the highest rate E[θ_u]ᵀE[β_i] for ``user``, best first.

        Leaves out the items the user already has in the training stream (with
        ``remember_rated``) and any ids in ``exclude``. Returns ``[(item id, rate), ...]``;
        an unknown user gets the items by popularity under the prior θ (Σ_k E[β_ik]).
        """
        return top_unseen(self.rows_of, self._need_aux(aux), user, k, exclude, lambda urow, n_items:
                          self._means(lam, "item", np.arange(n_items)) @ self._means(lam, "user", urow)[0])

    def _moments2(self, lam, side, rows):
        """(E[θ], E[θ²]) per coordinate of rows (Gamma(shape, rate): a/b, a(a+1)/b²); the prior
        Gamma(a, b') of an unknown row (−1)."""
        a, _, _, rate0 = self._side[side]
        m = np.full((len(rows), self.n_factors), a / rate0)
        m2 = np.full((len(rows), self.n_factors), a * (a + 1.0) / rate0 ** 2)
        known = rows >= 0
        if known.any():
            r = rows[known]
            shape, rate = np.asarray(lam[f"{side}_shape"])[r], np.asarray(lam[f"{side}_rate"])[r]
            m[known] = shape / rate
            m2[known] = shape * (shape + 1.0) / (rate * rate)
        return m, m2

    def predict_count(self, lam, users, items, aux=None):
        """Posterior predictive mean and standard deviation of the count of each (user, item) pair.

        The predictive of y ~ Poisson(θ_uᵀβ_i) under q: mean μ = E[θ_u]ᵀE[β_i] (:meth:`predict_rate`)
        and variance E[θᵀβ] + Var_q[θᵀβ], Var_q[θᵀβ] = Σ_k (E[θ_k²]E[β_k²] − E[θ_k]²E[β_k]²)
        (q(θ_u), q(β_i) independent Gammas). Unknown ids use the prior Gamma(a, b′) (Gamma(c, d′)).
        """
        aux = self._need_aux(aux)
        mu, mu2 = self._moments2(lam, "user", self.rows_of(aux, "user", users))
        mi, mi2 = self._moments2(lam, "item", self.rows_of(aux, "item", items))
        mean = np.einsum("nk,nk->n", mu, mi)
        var = mean + np.maximum(np.einsum("nk,nk->n", mu2, mi2) - np.einsum("nk,nk->n", mu * mu, mi * mi), 0.0)
        return mean, np.sqrt(var)

    def score_columns(self, lam, x, aux=None, top_k: int = 10) -> dict:
        """Scores of (user, item[, count]) records and top-k requests (``ScoresRecords``).

        See :func:`streamsvi.models.pmf.rating_score_columns`: ``prediction`` and ``sd`` from
        :meth:`predict_count`, ``log_density`` log Poisson(y | μ) at the posterior mean rate
        (as :meth:`predictive_logpdf`) where a count is given, ``top_k`` from :meth:`recommend`.
        """
        aux = self._need_aux(aux)
        return rating_score_columns(
            x, lambda u, i: self.predict_count(lam, u, i, aux=aux),
            lambda y, mean, sd: y * np.log(mean) - mean - gammaln(y + 1.0),
            lambda u, k: self.recommend(lam, u, k, aux=aux), top_k)

    @staticmethod
    def _need_aux(aux):
        if aux is None:
            raise ValueError("HPF scoring needs aux=state.aux (the id→row maps of the state); "
                             "streamsvi.load(...) passes it")
        return aux

def sample_counts(n_users=30, n_items=20, K=2, seed=7) -> Ratings:
    """A small count data set from HPF's own generative model (θ, β ~ Gamma(0.8, 1)): the non-zero
    counts of every (user, item) pair, ids mixing strings and integers (the check suite's case)."""
    rng = np.random.default_rng(seed)
    th, be = rng.gamma(0.8, 1.0, (n_users, K)), rng.gamma(0.8, 1.0, (n_items, K))
    u, i = np.divmod(np.arange(n_users * n_items), n_items)
    y = rng.poisson((th[u] * be[i]).sum(1))
    keep = y > 0
    return Ratings([f"u{v}" if v % 2 else int(v) for v in u[keep]], i[keep], y[keep])
