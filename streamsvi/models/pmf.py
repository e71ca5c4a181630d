"""Probabilistic matrix factorisation (PMF) with Gaussian variational factors (seed 000 §IV-A).

Generative model (Mnih & Salakhutdinov 2007; seed 000 eqs. 24–25)::

    u_i ~ N(0, c I),  v_j ~ N(0, c I)                 users i, items j, rank d
    y_ij | u_i, v_j ~ N(u_iᵀ v_j + μ0, σ²)            (i, j) ∈ Ω, the observed ratings

With ``biases=True`` each side gets one more free coordinate, a user bias
b_i and an item bias e_j (both N(0, c_b), c_b = ``bias_var``, default c), and
the mean is u_iᵀv_j + b_i + e_j + μ0. μ0 (``offset``) is a fixed centring of
the ratings (e.g. the training mean), or with ``offset="auto"`` the running
mean of the ratings seen so far (a statistic of the stream, not a variational
parameter).

Variational family: q = Π_i N(u_i | m_i, Λ_i⁻¹) Π_j N(v_j | m_j, Λ_j⁻¹), each
row in precision form with natural parameters (h, Λ) (``*_h``, ``*_prec``)::

    prior η:       h = 0,   Λ = I / c
    user i:        Λ_i = I/c + Σ_{j ∈ Ω_i} E_q[v_j v_jᵀ] / σ²,  h_i = Σ_{j ∈ Ω_i} y'_ij E_q[v_j] / σ²

(seed 000 eq. 26; y' = y − μ0; with biases E_q[v v_ᵀ] and y' E_q[v] are
replaced by the moments of the user's "design" (v_j, 1) and the response
y' − e_j, see ``_design_moments``). Items are symmetric. There are no local
variables: both U and V are global, and a rating r = (i, j, y) contributes
the statistic t_r to row i (computed from q(v_j)) and to row j (from q(u_i)).

Batch VI. U | V and V | U are conjugate blocks, so CAVI is the alternating
sweep: every user row from the current items, then every item row from the
new users. One update of the engine is one such sweep (users first), which
is what makes the batch-VI ELBO monotone (a simultaneous "Jacobi" update of
both blocks is not coordinate ascent and can oscillate).

Stochastic updates: who is touched, N_i and the scaling. A minibatch S of
ratings touches the rows S_i = {r ∈ S: user(r) = i} (and likewise items).
Only those rows move; for row i::

    target   λ̂_i = η + (N_i / |S_i|) Σ_{r ∈ S_i} w_r t_r
    step     λ_i ← (1 − ρ_i) λ_i^eff + ρ_i λ̂_i

* N_i is row i's share of the population: N_i = N · n_i / R, where N is the
  engine's ``n_total`` (the data-set size, or the population size α of an
  unbounded stream), n_i the number of ratings of row i seen so far
  (including this batch) and R the number of ratings seen so far (including
  this batch). On a fixed data set processed in epochs or in full batches,
  n_i / R = N_i / N exactly after every full epoch, so N_i is row i's true
  count; in batch mode (S = Ω) the scale N_i/|S_i| is exactly 1 and the
  target is the CAVI update. Given |S_i|, a uniformly drawn S_i makes
  (N_i/|S_i|) Σ_{S_i} t_r an unbiased estimate of Σ_{r ∈ Ω_i} t_r.
* N_i changes as the stream goes on, so before the step the data part of
  the old λ_i is rescaled to the new count: λ_i^eff = η + (N_i/N_i^old)(λ_i − η),
  with N_i^old the N_i of row i's previous update (no rescaling for a row's
  first update). This is SVI on the per-rating statistic (λ_i − η)/N_i; with
  a constant N_i (batch, known counts) λ_i^eff = λ_i and the step is the
  ordinary SVI step.
* ρ_i = schedule(t_i), where t_i counts the updates row i has received: a
  row first seen at global step 10 000 starts with a large step, not with
  ρ_10000. In batch mode every row is updated every step, so ρ_i = ρ_t.
  ``UpdateInfo.rho`` is the schedule at the global step.
* SVI+ weights are per rating, drawn by the engine exactly as for every
  other model (w_r = 1 + ε_r − ε̄, ε_r ~ N(0, |S|/M − 1)), and enter every
  sum above: Σ_{r ∈ S_i} w_r t_r. Given the batch, the noise added to row
  i's target has covariance (N_i/|S_i|)² (|S|/M − 1)(Σ_{S_i} t_r t_rᵀ −
  (Σ_{S_i} t_r)(Σ_{S_i} t_r)ᵀ/|S|) (tested). M = |S| is plain SVI bit for
  bit; S = Ω with M < |Ω| is the batch SVI+ of seed 000's experiment.
* Negative weights can make a row's target precision indefinite. The
  working domain is Λ ⪰ δ I/c with δ = ``PREC_FLOOR`` = 1/2, not merely
  Λ ≻ 0: the exact posterior always has Λ ⪰ I/c, and because a row's moments
  feed the other side's statistics (E[v vᵀ] grows like Λ⁻¹), a nearly
  singular Λ lets the SVI+ noise escalate between users and items until the
  numbers overflow (observed with δ = 10⁻⁶). With SVI+ weights the step of
  every touched row is split into the SVI step and the noise::

      base = (1 − ρ_i) λ_i^eff + ρ_i λ̂_i^SVI      (λ̂^SVI: the target with w ≡ 1)
      ξ    = ρ_i (λ̂_i − λ̂_i^SVI)                 (zero-mean given the batch, symmetric)
      λ_i ← base + s_i ξ,   s_i = min(1, τ / ‖L⁻¹ Ξ L⁻ᵀ‖₂),  L Lᵀ = Λ_base − δ I/c

  (Ξ the precision part of ξ, τ the engine's ``boundary_fraction``): only
  the noise is shrunk, and by the largest factor for which base ± (s_i/τ) ξ
  both stay in the domain. Since ξ is a linear function of the Gaussian ε,
  ξ and −ξ are equally likely and s_i(ξ) = s_i(−ξ), so E_w[λ_new] = base
  exactly: one SVI+ step's expected λ (precision and h) is the SVI step's at
  every weight variance (tested: weights w and 2 − w average to the SVI
  step to rounding). base is in the domain (a convex combination of λ^eff
  and a target with Λ ⪰ I/c). Rows with s_i < 1 are counted in
  ``domain_clipped``. Shrinking the former way — shortening the whole step,
  ρ_i ← min(ρ_i, τ s_max) — truncates only the draws that lower a precision
  and biased tr Λ upward (MovieLens 100K, d = 5, ρ = 0.85, one batch step:
  +2.2 % at weight variance 9, +12 % at 49). The rule never raises: a row
  whose base or shrunk step fails a Cholesky test (rounding, overflow) takes
  the SVI step, and if that fails too it keeps its λ; both are counted in
  ``domain_clipped``. With M = |S| (no weights) the step is plain SVI, bit
  for bit.

New ids. Users and items are found through id→row maps kept in the engine
state's ``aux`` (``users``/``items`` lists, JSON in the snapshot). A new id
appends a row (λ grows) initialised at the prior precision with a random
mean whose coordinates are N(0, ``init_scale``²), drawn from a hash of
(the state's init seed, side, id): deterministic, independent of arrival
order, seed-dependent. Ids are strings or integers; an integer is the same id
as its decimal string (42 ≡ "42"), so JSON producers and TSV files agree.
Per-row counters ``*_n`` (ratings), ``*_t`` (updates), ``*_N`` (last N_i)
and, with ``remember_rated``, the rated (user row, item row) pairs (for
top-k without already-rated items) are numpy arrays in ``aux``.

Who does what (the block API, ``streamsvi.models.blocks``). Users and items
are two row blocks (``row_blocks``) of the family
:class:`~streamsvi.models.blocks.GaussianRows`, which owns the precision floor,
the rescaling of a row's data part and the symmetric SVI+ step above. The
engine's row storage (:mod:`streamsvi.inference.blocks`) owns N_i, ρ_i, the
per-row clocks and counters, new rows and the step; this module writes the
math only: the statistics t_r of a block given the other block's moments
(``block_stats``), the batch's expected log-likelihood (``batch_loglik``) and
the initial rows (``new_rows``).

Storage. A state made by an update does not hold those arrays (nor λ's) as
such: each side's rows live in the engine's append-only log of records shared
by a lineage of states, so an update's cost follows the rows the batch
touches, not the rows the model has. ``state.lam`` (a NatParams) and
``state.aux`` (a read-only mapping) gather the full arrays on first access;
snapshots hold plain arrays, and an update accepts plain arrays too (copying
them into new logs once). Entries a state can see are never written again, so
every state stays as it was (also while a later update runs in another thread).

Metrics (``UpdateInfo``): ``elbo`` is L_t = Σ_rows −KL(q‖p) + (N/|S|) Σ_{r∈S}
E_q[log p(y_r | u, v)] at λ before the update (new rows at their initial
values); in batch mode it is the full ELBO (with ``row_counts="seen"`` the
likelihood term is still scaled by the engine's N: set N to the stream's
size). ``UpdateInfo.gradient`` is None: λ's shape grows and untouched rows
have no gradient, so the daemon's step-to-step gradient variance is not
observed for PMF. ``grad_variance`` is
Σ_{touched rows} N_i² tr(Σ̂_i) / M_i with Σ̂_i the sample covariance of the
row's t_r and M_i = |S_i| M/|S| its effective count; ``grad_norm`` is the
norm of λ̂ − λ^eff over the touched rows.

Examples
--------
>>> import numpy as np
>>> from streamsvi.inference import batch_vi
>>> rng = np.random.default_rng(0)
>>> U, V = rng.normal(size=(30, 2)), rng.normal(size=(20, 2))
>>> i, j = rng.integers(0, 30, 400), rng.integers(0, 20, 400)
>>> x = Ratings(i, j, (U[i] * V[j]).sum(1) + 0.1 * rng.normal(size=400))
>>> model = PMF(n_factors=2, sigma2=0.01, prior_var=1.0)
>>> engine = batch_vi(model, len(x))
>>> state, infos = engine.fit(engine.init(x, seed=1), x, n_steps=30)
>>> infos[-1].elbo > infos[0].elbo
True
>>> mean, var = model.predict_rating(state.lam, [3], [7], aux=state.aux)
>>> bool(abs(mean[0] - U[3] @ V[7]) < 0.3)
True
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from functools import cached_property

import numpy as np
import scipy.sparse as _sparse

# the batch type and the id rule live beside the other batch types (io/ reads them without
# importing models/); re-exported here
from ..ratings_batch import MAX_ID_LENGTH, Ratings, as_ratings, canonical_id  # noqa: F401
from ..settings import ConfigKind, Setting
from .base import ChecksState, ConjugateModel, NatParams, RowWise, ScoresRecords
from .blocks import GaussianRows, RowBlock, RowIndex, RowStats, top_unseen

__all__ = ["PMF", "Ratings", "canonical_id"]

def _hash64(side: str, ids) -> np.ndarray:
    return np.array([int.from_bytes(hashlib.blake2b(f"{side}\x00{i}".encode(), digest_size=8).digest(),
                                    "little") for i in ids], dtype=np.uint64)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _hashed_normals(seed: int, side: str, ids, D: int) -> np.ndarray:
    """Standard normals (len(ids), D), a deterministic function of (seed, side, id)."""
    if len(ids) == 0:
        return np.empty((0, D))
    base = _hash64(side, ids) ^ _splitmix64(np.array([seed], dtype=np.uint64))
    k = np.arange(2 * D, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = _splitmix64(base[:, None] + _splitmix64(k)[None, :])
    u = ((z >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    u1, u2 = u[:, :D], u[:, D:]
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class _Grouped:
    """A batch's ratings grouped by the rows of one side: sparse (touched rows × other rows) matrices.

    Row k of a matrix is the k-th distinct row of ``rows_self`` (ascending, ``uniq``); an entry
    sums ``data_r`` over the ratings r of that row with the other side's row ``rows_other[r]``.
    """

    __slots__ = ("order", "starts", "uniq", "counts", "indptr", "cols", "ys", "_C1", "_Cy")

    def __init__(self, rows_self, rows_other, y):
        S = len(y)
        self.order = order = np.argsort(rows_self, kind="stable")   # the ratings of each row, together
        srt = rows_self[order]
        first = np.empty(S, dtype=bool)
        first[:1] = True
        np.not_equal(srt[1:], srt[:-1], out=first[1:])
        self.starts = starts = np.flatnonzero(first)
        self.uniq = srt[starts]
        self.indptr = np.append(starts, S)
        self.counts = np.diff(self.indptr)
        self.cols = rows_other[order]
        self.ys = y[order]
        self._C1 = self._Cy = None

    def matrix(self, data, n_other):
        """Σ_r data_r e_{row(r)} e_{other(r)}ᵀ, ``data`` in grouped order."""
        return _sparse.csr_matrix((data, self.cols, self.indptr), shape=(len(self.uniq), n_other))

    def C1(self, n_other):
        if self._C1 is None or self._C1.shape[1] != n_other:
            self._C1 = self.matrix(np.ones(len(self.ys)), n_other)
        return self._C1

    def Cy(self, n_other):
        if self._Cy is None or self._Cy.shape[1] != n_other:
            self._Cy = self.matrix(self.ys, n_other)
        return self._Cy


class PMF(ConjugateModel, RowWise, ChecksState, ScoresRecords):
    """Probabilistic matrix factorisation, q in precision form, users and items as growing rows.

    Parameters
    ----------
    n_factors : int
        d, the rank.
    sigma2 : float
        σ², the rating noise variance (seed 000: 1/2).
    prior_var : float
        c, the prior variance of every factor (and bias) coordinate (seed 000: 1).
    biases : bool
        Add a user and an item bias (each N(0, c)) to the mean.
    offset : float
        μ0, subtracted from every rating (a fixed centring, e.g. the training mean).
    init_scale : float
        Standard deviation of the random initial means of new rows.
    remember_rated : bool
        Keep the rated (user, item) pairs in the state so that :meth:`recommend`
        leaves them out (costs 16 bytes per rating in every snapshot).
    bias_var : float or None
        c_b, the prior variance of the biases b_i, e_j (None: c).
    row_clock : {"updates", "ratings"}
        The clock of row i's step ρ_i = schedule(t_i): t_i = its update count, or
        t_i = n_i/|S_i| (its ratings so far over its ratings in this batch). With
        ``row_counts="seen"``, τ0 = 0, κ = 1 the latter makes λ_i − η the exact sum
        of the row's statistics (streaming Bayes) whatever |S_i| each batch brings.
    sweep : {"users_first", "items_first"}
        Which side a step updates first (the other then uses its new moments).

    ``offset="auto"`` makes μ0 the running mean of every rating seen (kept in
    ``aux`` as ``rating_sum``/``rating_count``; a batch's statistics use the mean
    including that batch; predictions use the current one).

    Attributes
    ----------
    dim : int
        D, the free coordinates per row: d, or d + 1 with biases.
    """

    name = "pmf"
    record_kind = "ratings"
    #: the smallest rating a record may carry (a floor for the ratings kind's validator): none
    min_rating = None
    config_kinds = {"pmf": ConfigKind("probabilistic matrix factorisation of (user, item, rating) records")}
    settings = {
        "n_factors": Setting("int", 10, "d, the rank of the factorisation", low=1),
        "sigma2": Setting("float", 0.5, "the rating noise variance", low=0, low_open=True),
        "prior_var": Setting("float", 1.0, "c, the prior variance of every factor", low=0, low_open=True),
        "biases": Setting("bool", False, "add a user and an item bias to the mean"),
        "offset": Setting("float|auto", 0.0, "mu0 subtracted from every rating: a number, or auto = the "
                          "running mean of the ratings seen"),
        "init_scale": Setting("float", 0.1, "std of the random initial means of new rows",
                              low=0, low_open=True),
        "row_counts": Setting("str", "scaled", "N_i per user/item: scaled = n_total * n_i / records seen, "
                              "seen = the row's ratings seen so far (one pass over a stream)",
                              choices=("scaled", "seen")),
        "remember_rated": Setting("bool", True, "keep rated pairs so that top-k leaves them out"),
        "bias_var": Setting("float", None, "prior variance of the user and item biases; unset = prior_var",
                            low=0, low_open=True),
        "row_clock": Setting("str", "updates", "the clock of a row's step rho_i = schedule(t_i): updates = "
                             "its update count, ratings = its ratings seen / its ratings in the batch",
                             choices=("updates", "ratings")),
        "sweep": Setting("str", "users_first", "which side a minibatch updates first",
                         choices=("users_first", "items_first")),
    }
    #: the conjugate blocks, in the order of one CAVI sweep
    blocks = (("user_h", "user_prec"), ("item_h", "item_prec"))
    #: what ``streamsvi.load(...)`` offers (each called with λ and ``aux=``)
    scoring_methods = ("predict_rating", "recommend", "predictive_logpdf")
    #: ``fitted.score(x, top_k=10)``: a record of a user alone gets that many items
    score_options = ("top_k",)
    score_column_names = ("user", "item", "prediction", "sd", "log_density", "top_k")
    # annealing kinds (``streamsvi.inference.annealing``): none and svi+ only, for it is neither
    # Tempered nor RandomRestart (no local latent assignments to temper or restart)
    #: δ: an SVI+ step may not take Λ below δ·I/c (no variance above c/δ)
    PREC_FLOOR = 0.5

    @staticmethod
    def synthetic_ratings(n_users=25, n_items=18, n=400, d=2, seed=6, noise=0.3) -> Ratings:
        """A small synthetic rating set: y = u_iᵀv_j + 3 + noise, ids mixing strings and integers."""
        rng = np.random.default_rng(seed)
        U, V = rng.normal(size=(n_users, d)), rng.normal(size=(n_items, d))
        i, j = rng.integers(0, n_users, n), rng.integers(0, n_items, n)
        y = (U[i] * V[j]).sum(1) + 3.0 + noise * rng.normal(size=n)
        return Ratings([f"u{k}" for k in i], j.tolist(), y)

    @classmethod
    def check_cases(cls) -> dict:
        """The check suite's case: rank 2 with biases on :meth:`synthetic_ratings`."""
        return {"pmf": lambda: (cls(n_factors=2, sigma2=0.25, prior_var=1.0, biases=True, offset=3.0),
                                cls.synthetic_ratings())}

    def __init__(self, n_factors: int = 10, sigma2: float = 0.5, prior_var: float = 1.0,
                 biases: bool = False, offset: float = 0.0, init_scale: float = 0.1,
                 row_counts: str = "scaled", remember_rated: bool = True, bias_var=None,
                 row_clock: str = "updates", sweep: str = "users_first"):
        p = self.check_settings({k: v for k, v in locals().items() if k in self.settings})
        self.n_factors = p["n_factors"]
        self.sigma2, self.prior_var, self.bias_var = p["sigma2"], p["prior_var"], p["bias_var"]
        self.biases = p["biases"]
        self.offset = p["offset"]
        self.init_scale = p["init_scale"]
        self.row_counts = p["row_counts"]
        self.remember_rated = p["remember_rated"]
        self.row_clock = p["row_clock"]
        self.sweep = p["sweep"]
        if sweep == "items_first":         # the conjugate blocks in the order this model sweeps them
            self.blocks = type(self).blocks[::-1]
        d = self.n_factors
        self.dim = D = d + 1 if self.biases else d
        pv = np.full(D, self.prior_var)
        if self.biases and self.bias_var is not None:
            pv[d] = self.bias_var
        self._pv = pv                      # prior variance per coordinate: c (factors), c_b (bias)
        self._eta_P = np.diag(1.0 / pv)
        # the mean is f = X̃ᵀ B Z̃ with X̃ = (x, 1), Z̃ = (z, 1): uᵀv (+ b + e)
        B = np.zeros((D + 1, D + 1))
        B[:d, :d] = np.eye(d)
        if self.biases:
            B[d, D] = 1.0      # user bias × 1
            B[D, d] = 1.0      # 1 × item bias
        self._B = B
        self._perm = np.r_[0:D - 1, D, D - 1] if self.biases else None   # (v, e, 1) -> (v, 1, e)
        self._index = {"user": RowIndex(), "item": RowIndex()}

    def get_params(self) -> dict:
        """The settings; those added by issue 18 only when they differ from the former behaviour, so a
        snapshot written before them resumes under the same configuration."""
        params = {"n_factors": self.n_factors, "sigma2": self.sigma2, "prior_var": self.prior_var,
                  "biases": self.biases, "offset": self.offset, "init_scale": self.init_scale,
                  "row_counts": self.row_counts, "remember_rated": self.remember_rated}
        for k, former in (("bias_var", None), ("row_clock", "updates"), ("sweep", "users_first")):
            if getattr(self, k) != former:
                params[k] = getattr(self, k)
        return params

    # ------------------------------------------------------------ batches
    def check_batch(self, x) -> Ratings:
        """A :class:`Ratings` with at least one finite rating (or a mapping of user/item/rating)."""
        x = as_ratings(x, "a PMF batch")
        if not np.all(np.isfinite(x.rating)):
            bad = np.flatnonzero(~np.isfinite(x.rating))
            raise ValueError(f"x has non-finite ratings at {bad[:10].tolist()}")
        return x

    def mu0(self, aux=None) -> float:
        """μ0: the fixed ``offset``, or with ``offset="auto"`` the mean of the ratings seen so far."""
        if self.offset != "auto":
            return self.offset
        aux = self._need_aux(aux)
        n = int(aux.get("rating_count", 0))
        return float(aux["rating_sum"]) / n if n else 0.0

    # ------------------------------------------------------------ λ and aux
    def prior(self, n_users: int = 0, n_items: int = 0) -> NatParams:
        """η for ``n_users`` user rows and ``n_items`` item rows (h = 0, Λ = I/c)."""
        D = self.dim
        eye = self._eta_P
        return NatParams(user_h=np.zeros((n_users, D)), user_prec=np.broadcast_to(eye, (n_users, D, D)),
                         item_h=np.zeros((n_items, D)), item_prec=np.broadcast_to(eye, (n_items, D, D)))

    def prior_like(self, lam) -> NatParams:
        return self.prior(lam["user_h"].shape[0], lam["item_h"].shape[0])

    def init_params(self, rng, x, n_total) -> NatParams:
        """Not for PMF: its initial state (λ and aux together) comes from the engine's row storage."""
        raise TypeError("a PMF state (λ and its aux) is made by the engine's row storage: "
                        "use SVI(model, n_total).init(x)")

    def _new_rows(self, seed, side, ids):
        m = self.init_scale * _hashed_normals(seed, side, ids, self.dim)
        P = np.broadcast_to(self._eta_P, (len(ids), self.dim, self.dim))
        return m / self._pv, P

    # ------------------------------------------------------------ row blocks (streamsvi.models.blocks)
    @cached_property
    def family(self) -> GaussianRows:
        """The family of every user and item row: Gaussian rows in precision form, prior
        N(0, diag c), working domain Λ ⪰ δ·diag(1/c) with δ = ``PREC_FLOOR``."""
        return GaussianRows(self._pv, floor=self.PREC_FLOOR)

    @cached_property
    def row_blocks(self) -> tuple:
        """The two row blocks, users and items, keyed by id (N_i from ``row_counts``, t_i from ``row_clock``)."""
        return tuple(RowBlock(side, self.family, counts=self.row_counts, clock=self.row_clock)
                     for side in ("user", "item"))

    @property
    def sweep_order(self) -> tuple:
        """The blocks in the order of one step (``sweep``): the second uses the first's new moments."""
        return ("item", "user") if self.sweep == "items_first" else ("user", "item")

    @property
    def pair_log(self):
        """The name of the (user row, item row) log in ``aux`` (``remember_rated``), or None."""
        return "rated" if self.remember_rated else None

    pair_blocks = ("user", "item")

    def init_row_values(self) -> dict:
        """The model's own JSON values in a fresh state's aux: the running mean's sums with ``offset="auto"``."""
        return {"rating_sum": 0.0, "rating_count": 0} if self.offset == "auto" else {}

    def row_keys(self, x) -> dict:
        """The user and item id of each rating."""
        return {"user": x.user, "item": x.item}

    def new_rows(self, seed, side, ids) -> np.ndarray:
        """h of new rows: prior precision, mean N(0, init_scale²) per coordinate hashed from (seed, side, id)."""
        return self._new_rows(seed, side, ids)[0]

    def begin_batch(self, x, plain: dict, rows: dict) -> dict:
        """The batch's centred ratings y' and its ratings grouped by user and by item rows.

        With ``offset="auto"`` the running sums in ``plain`` take in this batch first (μ0 of a
        batch's statistics includes the batch).
        """
        S = len(x)
        if self.offset == "auto":            # μ0: the running mean of every rating seen, this batch included
            plain["rating_sum"] = float(plain["rating_sum"]) + float(np.sum(x.rating))
            plain["rating_count"] = int(plain["rating_count"]) + S
        y = x.rating - self.mu0(plain)
        return {"y": y, "g": {"user": _Grouped(rows["user"], rows["item"], y),
                              "item": _Grouped(rows["item"], rows["user"], y)}}

    def batch_loglik(self, ctx, caches) -> float:
        """Σ_r E_q[log N(y'_r | f_r, σ²)] over the batch, from the touched rows' cached E[X̃X̃ᵀ].

        E f_r = Eu[:, -1]·a_i and E f_r² = ⟨Eu, Q_i⟩ summed per user through the grouped
        ratings (a_i, Q_i: item i's design moments).
        """
        y, gu = ctx["y"], ctx["g"]["user"]
        Qv, av = self._design_moments(caches["item"], "user")
        Eu = caches["user"]
        nI = len(Qv)
        sum_yEf = float(np.sum(Eu[:, :, -1] * (gu.Cy(nI) @ av)))
        sum_Ef2 = float(np.sum(Eu.reshape(len(Eu), -1) * (gu.C1(nI) @ Qv.reshape(nI, -1))))
        return (-0.5 * math.log(2 * math.pi * self.sigma2) * len(y)
                - (float(np.dot(y, y)) - 2.0 * sum_yEf + sum_Ef2) / (2 * self.sigma2))

    def block_stats(self, side, ctx, caches, weights) -> RowStats:
        """The statistics of the touched rows of ``side`` from the other side's current moments."""
        other = "item" if side == "user" else "user"
        Q, a = self._design_moments(caches[other], side)
        return RowStats(*self._block_stats(side, Q, a, ctx["g"][side], weights))

    def refresh_cache(self, lam, aux) -> dict:
        """A copy of ``aux`` with the per-row caches (E[X̃X̃ᵀ], KL) recomputed from λ.

        Needed only after editing λ by hand (e.g. fixing rows in a test).
        """
        aux = dict(aux)
        for side in ("user", "item"):
            h, P = lam[f"{side}_h"], lam[f"{side}_prec"]
            if len(h):
                m, S, E = self._moments(h, P)
                aux[f"{side}_E"], aux[f"{side}_kl"] = E, self._kl(m, S, P)
        return aux

    def check_state(self, lam, aux) -> None:
        """Raise ``ValueError`` unless (λ, aux) is a consistent PMF state of this model."""
        names = {"user_h", "user_prec", "item_h", "item_prec"}
        if set(lam) != names:
            raise ValueError(f"PMF parameters must be {sorted(names)}, got {sorted(lam)}")
        if not isinstance(aux, Mapping) or not {"users", "items", "seed"} <= set(aux):
            raise ValueError("a PMF state needs aux with the 'users' and 'items' id lists")
        if self.offset == "auto":
            if not {"rating_sum", "rating_count"} <= set(aux):
                raise ValueError("a PMF state with offset='auto' needs aux rating_sum and rating_count (the "
                                 "running mean); this state was written with a fixed offset: set offset to it")
            if not (math.isfinite(float(aux["rating_sum"])) and int(aux["rating_count"]) >= 0):
                raise ValueError("aux rating_sum must be finite and rating_count >= 0")
        D = self.dim
        consistent = getattr(aux, "consistent_with", None)
        if consistent is not None and consistent(lam) and all(aux.family_of(s).D == D for s in ("user", "item")):
            return                            # made by the engine's row storage: consistent by construction
        for side in ("user", "item"):
            n = len(aux[f"{side}s"])
            if lam[f"{side}_h"].shape != (n, D) or lam[f"{side}_prec"].shape != (n, D, D):
                raise ValueError(f"{side} parameters have shapes {lam[f'{side}_h'].shape}, "
                                 f"{lam[f'{side}_prec'].shape}; expected ({n}, {D}) and ({n}, {D}, {D}) "
                                 f"for {n} {side}s and D={D}")
            for c in ("n", "t", "N", "kl"):
                if np.shape(aux.get(f"{side}_{c}")) != (n,):
                    raise ValueError(f"aux {side}_{c} must have {n} entries")
            if np.shape(aux.get(f"{side}_E")) != (n, D + 1, D + 1):
                raise ValueError(f"aux {side}_E must have shape ({n}, {D + 1}, {D + 1})")

    # ------------------------------------------------------------ moments
    def _kl(self, m, S, P):
        """KL(N(m, S) ‖ N(0, c I)) per row (S = Λ⁻¹)."""
        pv, D = self._pv, self.dim
        L = np.linalg.cholesky(P)
        logdetP = 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
        return 0.5 * ((np.diagonal(S, axis1=1, axis2=2) / pv).sum(axis=1) + (m * m / pv).sum(axis=1)
                      - D + float(np.log(pv).sum()) + logdetP)

    def _moments_kl(self, h, P, L=None):
        """(mean, covariance, E[X̃X̃ᵀ], KL) of rows from one Cholesky factor L of Λ (the family's)."""
        return self.family.moments_kl(h, P, L)

    def _moments(self, h, P):
        """Mean (n, D), covariance (n, D, D), E[X̃X̃ᵀ] (n, D+1, D+1) of rows given (h, Λ).

        Through the Cholesky factor, like the cached moments of a step, so the two agree bit for bit.
        """
        return self._moments_kl(h, P)[:3]

    def _design_moments(self, E, side):
        """For rows of the *other* side with moments E: (Q (n, D+1, D+1), a (n, D+1)).

        For a rating of row x of ``side`` against such a row z, f = x̃ᵀ φ with
        φ = B Z̃ (users; Bᵀ X̃ for items): Q = E[φφᵀ], a = E[φ]. The statistic
        of the rating for row x is Λ += Q[:D, :D]/σ², h += (y' a[:D] − Q[:D, D])/σ².
        B only zeroes (no biases) or swaps (biases) the last two coordinates, so
        this is indexing, not a product (``_B`` is the matrix, for reference).
        """
        D = self.dim
        if self.biases:                 # φ = (v, 1, e) from Z̃ = (v, e, 1): swap the last two
            perm = self._perm
            Q = E[:, perm[:, None], perm[None, :]]
            return Q, Q[:, :, D - 1]    # E[φ] = E[φ · 1], and φ_{D-1} = 1
        Q = E.copy()
        Q[:, D, :] = 0.0
        Q[:, :, D] = 0.0
        a = E[:, :, D].copy()
        a[:, D] = 0.0
        return Q, a

    # ------------------------------------------------------------ statistics
    def _block_stats(self, side, Q, a, g, weights):
        """Σ_r w_r t_r per touched row of ``side``: (rows, ΣwΛ-part, Σw h-part, unweighted, sqnorm sums).

        ``g`` (:class:`_Grouped`) holds the batch's ratings grouped by the rows of ``side``, its
        columns indexing ``Q``/``a`` (the other side's design moments). The sums are products of
        its sparse (touched rows × rows of Q) matrices with per-row statistics of the other side,
        so the per-rating statistics t_r (S × (D + D²)) are never formed.
        """
        D, s2 = self.dim, self.sigma2
        # t_r = (y_r a_o − q_o, A_o)/σ² with a_o = a[o, :D], q_o = Q[o, :D, D], A_o = Q[o, :D, :D]
        G = np.empty((len(Q), D + D * D))
        np.negative(Q[:, :D, D], out=G[:, :D])
        G[:, D:] = Q[:, :D, :D].reshape(len(Q), D * D)
        G /= s2
        ad = a[:, :D] / s2
        sums = g.C1(len(Q)) @ G
        sums[:, :D] += g.Cy(len(Q)) @ ad
        if weights is None:
            sums_w = sums
        else:
            ws = weights[g.order]
            sums_w = g.matrix(ws, len(Q)) @ G
            sums_w[:, :D] += g.matrix(ws * g.ys, len(Q)) @ ad
        # ‖t_r‖² = y² ‖a_o‖² + 2 y a_o·(−q_o) + ‖(−q_o, A_o)‖² (over σ⁴), per rating then summed per row
        o, ys = g.cols, g.ys
        g2 = np.einsum("ij,ij->i", G, G)
        aa = np.einsum("ij,ij->i", ad, ad)
        aq = np.einsum("ij,ij->i", ad, G[:, :D])
        sq = np.add.reduceat(ys * ys * aa[o] + 2.0 * ys * aq[o] + g2[o], g.starts)
        return g.uniq, sums_w, sums, g.counts, sq

    def _unpack(self, flat):
        D = self.dim
        return flat[:, :D], flat[:, D:].reshape(-1, D, D)

    def local_step(self, lam, x, aux=None):
        """Index ``x`` against ``aux`` and gather every row's moments (PMF has no local variables).

        Every id of ``x`` must already have a row (e.g. ``aux`` of ``SVI(model, n).init(x)``).
        """
        x = self.check_batch(x)
        if aux is None:
            raise ValueError("PMF.local_step needs aux (the id→row maps of the state)")
        urows, new_u, _ = self._index["user"].lookup(aux["users"], x.user, grow=False)
        irows, new_i, _ = self._index["item"].lookup(aux["items"], x.item, grow=False)
        if new_u or new_i:
            raise ValueError(f"ids without a row: users {new_u[:5]}, items {new_i[:5]}")
        _, _, Eu = self._moments(lam["user_h"], lam["user_prec"])
        _, _, Ev = self._moments(lam["item_h"], lam["item_prec"])
        return {"urows": urows, "irows": irows, "Eu": Eu, "Ev": Ev, "shape": (len(Eu), len(Ev)),
                "mu0": self.mu0(aux)}

    def suffstats(self, local, x, weights=None) -> NatParams:
        """Σ_r w_r t_r of both blocks at the moments of ``local`` (rows not rated: 0).

        The user block uses q(V) and the item block q(U) from the same λ (so
        one CAVI sweep is ``local_step``/``suffstats`` once per block, see ``blocks``).
        """
        y = x.rating - local["mu0"]
        nu, ni = local["shape"]
        out = {}
        for side, E_other, rows_o, rows_s, n in (("user", local["Ev"], local["irows"], local["urows"], nu),
                                                 ("item", local["Eu"], local["urows"], local["irows"], ni)):
            Q, a = self._design_moments(E_other, side)
            uniq, sums_w, _, _, _ = self._block_stats(side, Q, a, _Grouped(rows_s, rows_o, y), weights)
            h, P = self._unpack(sums_w)
            H = np.zeros((n, self.dim))
            PP = np.zeros((n, self.dim, self.dim))
            H[uniq], PP[uniq] = h, P
            out[f"{side}_h"], out[f"{side}_prec"] = H, PP
        return NatParams(user_h=out["user_h"], user_prec=out["user_prec"], item_h=out["item_h"],
                         item_prec=out["item_prec"])

    def local_elbo_terms(self, Eu_rows, Qv_rows, av_rows, y):
        """E_q[log N(y' | f, σ²)] per rating, from E[X̃X̃ᵀ] of its user and (Q, a) of its item."""
        Ef = np.einsum("ni,ni->n", Eu_rows[:, :, -1], av_rows)
        Ef2 = np.einsum("nij,nij->n", Eu_rows, Qv_rows)
        return -0.5 * math.log(2 * math.pi * self.sigma2) - (y * y - 2 * y * Ef + Ef2) / (2 * self.sigma2)

    def global_elbo(self, lam) -> float:
        """−Σ_rows KL(N(m, Λ⁻¹) ‖ N(0, c I))."""
        kl = 0.0
        for side in ("user", "item"):
            P = lam[f"{side}_prec"]
            if len(P) == 0:
                continue
            m, S, _ = self._moments(lam[f"{side}_h"], P)
            kl += float(np.sum(self._kl(m, S, P)))
        return -kl

    def elbo(self, lam, aux, x) -> float:
        """The ELBO of the data ``x`` (every id must have a row) at λ."""
        loc = self.local_step(lam, x, aux)
        Q, a = self._design_moments(loc["Ev"], "user")
        y = x.rating - self.mu0(aux)
        return self.global_elbo(lam) + float(np.sum(self.local_elbo_terms(
            loc["Eu"][loc["urows"]], Q[loc["irows"]], a[loc["irows"]], y)))

    # ------------------------------------------------------------ domain
    def in_domain(self, lam) -> bool:
        """Every user and item row a valid Gaussian (finite, Λ ≻ 0): the family's test per block."""
        return all(self.family.in_domain((lam[f"{b}_h"], lam[f"{b}_prec"])) for b in ("user", "item"))

    # ------------------------------------------------------------ scoring
    def rows_of(self, aux, side: str, ids) -> np.ndarray:
        """Rows of ``ids`` (canonicalised) on ``side`` ("user"/"item"); −1 for unknown ids."""
        keys = [canonical_id(i, side) for i in ids]
        rows, _, _ = self._index[side].lookup(aux[f"{side}s"], keys, grow=False)
        n = len(aux[f"{side}s"])
        return np.where(rows < n, rows, -1)

    def _row_moments(self, lam, side, rows):
        """E[X̃X̃ᵀ] of rows; the prior's for row −1 (an unknown id: mean 0, covariance c I)."""
        D = self.dim
        known = rows >= 0
        E = np.zeros((len(rows), D + 1, D + 1))
        E[:, :D, :D] = np.diag(self._pv)
        E[:, D, D] = 1.0
        if known.any():
            r = rows[known]
            rows_of = getattr(lam, "rows", None)    # λ in the engine's row storage: gather only these
            h, P = rows_of(side, r) if rows_of is not None else (lam[f"{side}_h"][r], lam[f"{side}_prec"][r])
            E[known] = self._moments(h, P)[2]
        return E

    def predict_rating(self, lam, users, items, aux=None):
        """Posterior predictive mean and variance of the rating of each (user, item) pair.

        mean = μ0 + E_q[f], variance = σ² + Var_q[f] with f = u_iᵀv_j (+ b_i + e_j),
        Var_q[f] = tr(E[X̃X̃ᵀ] B E[Z̃Z̃ᵀ] Bᵀ) − E[f]² (q(u_i), q(v_j) independent). Unknown
        ids use the prior (cold start). ``aux`` is the state's (id→row maps).
        """
        aux = self._need_aux(aux)
        Eu = self._row_moments(lam, "user", self.rows_of(aux, "user", users))
        Ev = self._row_moments(lam, "item", self.rows_of(aux, "item", items))
        Q, a = self._design_moments(Ev, "user")
        Ef = np.einsum("ni,ni->n", Eu[:, :, -1], a)
        Ef2 = np.einsum("nij,nij->n", Eu, Q)
        return self.mu0(aux) + Ef, self.sigma2 + np.maximum(Ef2 - Ef * Ef, 0.0)

    def predictive_logpdf(self, lam, x, aux=None) -> np.ndarray:
        """log N(y | predictive mean, predictive variance) per rating (moment-matched Gaussian)."""
        aux = self._need_aux(aux)
        x = self.check_batch(x)
        mean, var = self.predict_rating(lam, x.user, x.item, aux=aux)
        return -0.5 * np.log(2 * math.pi * var) - (x.rating - mean) ** 2 / (2 * var)

    def recommend(self, lam, user, k: int = 10, exclude=(), aux=None) -> list[tuple[str, float]]:
        """The ``k`` items with the highest predicted rating for ``user``, best first.

        Leaves out the items the user rated in the training stream (when the
        model has ``remember_rated``) and any ids in ``exclude``. Returns
        ``[(item id, predicted rating), ...]``.
        """
        aux = self._need_aux(aux)

        def score(urow, n_items):
            Eu = self._row_moments(lam, "user", urow)[0]
            _, a = self._design_moments(self._row_moments(lam, "item", np.arange(n_items)), "user")
            return self.mu0(aux) + a @ Eu[:, -1]

        return top_unseen(self.rows_of, aux, user, k, exclude, score)

    def score_columns(self, lam, x, aux=None, top_k: int = 10) -> dict:
        """Scores of (user, item[, rating]) records and of top-k requests (``ScoresRecords``).

        See :func:`rating_score_columns`: ``prediction`` is the predictive mean of
        :meth:`predict_rating`, ``sd`` its standard deviation √(σ² + Var_q[f]),
        ``log_density`` :meth:`predictive_logpdf` where a rating is given, and a
        record with a user and no item gets ``top_k``: :meth:`recommend` (rated items
        left out). Unknown users and items are predicted from the prior (cold start).
        """
        aux = self._need_aux(aux)

        def predict(users, items):
            mean, var = self.predict_rating(lam, users, items, aux=aux)
            return mean, np.sqrt(var)

        def density(y, mean, sd):
            return -0.5 * np.log(2 * math.pi * sd * sd) - (y - mean) ** 2 / (2 * sd * sd)

        return rating_score_columns(x, predict, density, lambda u, k: self.recommend(lam, u, k, aux=aux), top_k)

    @staticmethod
    def _need_aux(aux):
        if aux is None:
            raise ValueError("PMF scoring needs aux=state.aux (the id→row maps of the state); "
                             "streamsvi.load(...) passes it")
        return aux


def rating_score_columns(x, predict, density, recommend, top_k: int = 10) -> dict:
    """The score columns of a ratings model (PMF, HPF) for ``x``.

    ``x`` is a :class:`Ratings`; for scoring, a record's rating may be NaN (not
    given) and its item ``None`` (a top-k request for the user). ``predict(users,
    items) -> (mean, sd)``, ``density(y, mean, sd)`` the log density of given
    ratings, ``recommend(user, k) -> [(item, score), ...]``. Columns: ``user``,
    ``item`` (absent for a top-k request), ``prediction`` and ``sd`` (pairs),
    ``log_density`` (pairs with a rating), ``top_k`` (requests: ``[{"item",
    "prediction"}, ...]`` best first, without the items the user rated).
    """
    if not isinstance(x, Ratings):
        x = as_ratings(x, "ratings to score")
    if isinstance(top_k, bool) or int(top_k) != top_k or top_k < 1:
        raise ValueError(f"top_k must be an integer >= 1, got {top_k!r}")
    n = len(x)
    items = x.item
    pair = np.fromiter((i is not None for i in items), dtype=bool, count=n)
    mean, sd, lp = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    if pair.any():
        rows = np.flatnonzero(pair)
        m, s = predict(x.user[rows], items[rows])
        mean[rows], sd[rows] = m, s
        y = x.rating[rows]
        given = np.isfinite(y)
        if given.any():
            lp[rows[given]] = density(y[given], m[given], s[given])
    top = None
    if not pair.all():
        top = [None] * n
        for r in np.flatnonzero(~pair).tolist():
            top[r] = [{"item": i, "prediction": float(v)} for i, v in recommend(x.user[r], int(top_k))]
    cols = {"user": x.user.tolist(), "item": items.tolist(), "prediction": mean, "sd": sd, "log_density": lp}
    if top is not None:
        cols["top_k"] = top
    return cols
