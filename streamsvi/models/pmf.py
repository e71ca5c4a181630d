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

Storage. A state made by an update does not hold those arrays (nor λ's) as
such: each side's rows live in an append-only log of records shared by a
lineage of states, and a state sees row r at ``log[where[r]]``; an update
appends the records of the rows it touched and copies only ``where``, so its
cost follows the rows the batch touches, not the rows the model has (see
"row storage" below). ``state.lam`` (a NatParams) and ``state.aux`` (a
read-only mapping) gather the full arrays on first access; snapshots hold
plain arrays, and ``svi_step`` accepts plain arrays too (copying them into
new logs once). Entries a state can see are never written again, so every
state stays as it was (also while a later update runs in another thread).

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
import threading
from collections.abc import Mapping

import numpy as np
import scipy.sparse as _sparse

# the batch type and the id rule live beside the other batch types (io/ reads them without
# importing models/); re-exported here
from ..ratings_batch import MAX_ID_LENGTH, Ratings, canonical_id  # noqa: F401
from ..settings import ConfigKind, Setting
from .base import ChecksState, ConjugateModel, NatParams, RowWise, ScoresRecords

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


class _RowIndex:
    """id → row lookups for the append-only id lists of ``aux`` (a cache, not state).

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


def _cholesky_rows(A) -> tuple[np.ndarray, np.ndarray]:
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


def _pd_rows(A) -> np.ndarray:
    """Per row of a stack: finite and positive definite in the sense that Cholesky succeeds.

    The same test the moments and the KL use (``np.linalg.cholesky``/``inv``),
    so a row that passes can always be inverted; never raises.
    """
    return _cholesky_rows(A)[1]


def _eigvalsh_rows(K) -> np.ndarray:
    """``eigvalsh`` per row; a row whose eigenvalues fail is given ±inf (so it takes s = 0)."""
    out = np.full(K.shape[:2], np.inf)
    for k in range(len(K)):
        try:
            out[k] = np.linalg.eigvalsh(K[k])
        except np.linalg.LinAlgError:
            pass
    return out


def _tril_inv(L) -> np.ndarray:
    """Inverses of a stack of lower-triangular matrices by forward substitution, vectorised over the stack.

    For the small D of PMF rows this is several times faster than ``np.linalg.inv`` (one LAPACK call
    per matrix); the result is lower triangular like L.
    """
    n, D, _ = L.shape
    X = np.zeros_like(L)
    d = 1.0 / np.diagonal(L, axis1=1, axis2=2)
    for i in range(D):
        X[:, i, i] = d[:, i]
        if i:
            X[:, i, :i] = -np.einsum("nk,nkj->nj", L[:, i, :i], X[:, :i, :i]) * d[:, i, None]
    return X


def _concat_params(parts: dict) -> NatParams:
    """NatParams whose arrays are the row-wise concatenations of ``parts[name]`` (one copy, into one buffer)."""
    layout, off = [], 0
    for k, ps in parts.items():
        shape = (sum(len(p) for p in ps),) + tuple(ps[0].shape[1:])
        size = int(np.prod(shape))
        layout.append((k, shape, off, off + size))
        off += size
    flat = np.empty(off)
    for (k, shape, lo, hi), ps in zip(layout, parts.values()):
        pos = lo
        for p in ps:
            flat[pos:pos + p.size] = np.asarray(p, dtype=np.float64).reshape(-1)
            pos += p.size
    return NatParams._wrap(tuple(layout), flat)


def _rho_rows(schedule, t) -> np.ndarray:
    """ρ = schedule(t) for an array of (real) clocks t ≥ 1; vectorised for the built-in schedules."""
    from ..inference.schedules import Constant, RobbinsMonro

    if isinstance(schedule, RobbinsMonro):
        rho = np.minimum((schedule.tau0 + t) ** (-float(schedule.kappa)), 1.0)
        return rho if schedule.rho_min is None else np.maximum(rho, schedule.rho_min)
    if isinstance(schedule, Constant):
        return np.full(len(t), float(schedule(1)))
    return np.array([schedule(float(v)) for v in t])


# ---------------------------------------------------------------- row storage
# One update touches the rows of the users and items of its batch, a few hundred out of thousands.
# States are immutable (the engine compares them, keeps the input of a failed update, and a
# checkpoint may be written from one while the next update runs), so a state cannot share a
# mutable array with its successor. Copying every per-row array on every update made the cost of
# an update grow with the number of rows (MovieLens latest-small: ~7 MB per update at the end).
# Instead each side's rows live in an append-only log of records shared by a lineage of states:
# a state's row r is ``log.buf[where[r]]``. An update appends the new records of its touched rows
# past the end of the log and gives its successor a ``where`` with those rows pointed at them;
# entries a state can see are never written again, so every older state still reads its own
# values. Per update the cost is the touched records plus one copy of ``where`` (8 bytes a row);
# when the log is full its live records are compacted into a new, larger log (amortised O(1)
# per appended record). A branch (an update of a state that is not the newest of its lineage)
# compacts too, so it never writes into records another state can see.

class _Log:
    """An append-only buffer shared by a lineage of states: entries below ``used`` are never rewritten."""

    __slots__ = ("buf", "used", "lock")

    def __init__(self, buf, used):
        self.buf, self.used, self.lock = buf, int(used), threading.Lock()

    def __getstate__(self):                  # pickle / deepcopy: the entries in use, not the lock
        return self.buf[:self.used], self.used

    def __setstate__(self, state):
        self.__init__(np.array(state[0]), state[1])

    def claim(self, end: int, k: int) -> int:
        """Reserve ``k`` entries after ``end`` if ``end`` is the tip and they fit: their start, or −1."""
        with self.lock:
            if self.used != end or end + k > len(self.buf):
                return -1
            self.used = end + k
            return end


class _Rows:
    """One side's rows in one state: row r's record is ``log.buf[where[r]]`` (never modified)."""

    __slots__ = ("log", "where", "end", "kl", "finite")

    def __init__(self, log, where, end, kl, finite=None):
        where.flags.writeable = kl.flags.writeable = False
        self.log, self.where, self.end = log, where, int(end)
        self.kl = kl                  # the KL column again, contiguous (the ELBO sums it every update)
        self.finite = finite          # λ columns all finite: True/False, None = not yet known

    @classmethod
    def from_records(cls, rec, fmt) -> "_Rows":
        n, W = rec.shape
        buf = np.empty((2 * n + 256, W))
        buf[:n] = rec
        finite = bool(np.isfinite(rec[:, :fmt.n_lam]).all())
        return cls(_Log(buf, n), np.arange(n, dtype=np.int64), n, rec[:, fmt.kl].copy(), finite)

    def __len__(self):
        return len(self.where)

    def gather(self, rows) -> np.ndarray:
        """The records of ``rows`` (a new array)."""
        return self.log.buf[self.where[rows]]

    def column(self, cols) -> np.ndarray:
        """``cols`` of every row (a new array)."""
        return self.log.buf[self.where, cols]

    def all_finite(self, n_lam_cols) -> bool:
        if self.finite is None:
            self.finite = bool(np.isfinite(self.log.buf[self.where, :n_lam_cols]).all())
        return self.finite

    def with_records(self, rows, rec, fmt) -> "_Rows":
        """The successor whose ``rows`` (sorted, unique; rows ≥ len(self) are new) have the records ``rec``.

        Every new row must be among ``rows``. ``self`` is unchanged.
        """
        k, n_old = len(rows), len(self.where)
        n_new = n_old if k == 0 else max(n_old, int(rows[-1]) + 1)
        if n_new - n_old != int(np.count_nonzero(rows >= n_old)):
            raise ValueError("every new row needs a record")
        ok = bool(np.isfinite(rec[:, :fmt.n_lam]).all())
        finite = ok if self.finite is True else (False if not ok else None)
        kl = np.empty(n_new)
        kl[:n_old] = self.kl
        kl[rows] = rec[:, fmt.kl]
        log = self.log
        pos = log.claim(self.end, k)
        if pos >= 0:                          # the tip of its lineage: append past everything visible
            log.buf[pos:pos + k] = rec
            where = np.empty(n_new, dtype=np.int64)
            where[:n_old] = self.where
            where[rows] = np.arange(pos, pos + k)
            return _Rows(log, where, pos + k, kl, finite)
        buf = np.empty((4 * n_new + 4 * k + 1024, log.buf.shape[1]))   # compact into a new log
        buf[:n_old] = log.buf[self.where]
        buf[rows] = rec
        return _Rows(_Log(buf, n_new), np.arange(n_new, dtype=np.int64), n_new, kl, finite)


def _pairs_append(log, end, pairs):
    """Append (k, 2) int64 ``pairs`` to the rated-pairs log after ``end``: the new (log, end)."""
    k = len(pairs)
    if log is not None:
        pos = log.claim(end, k)
        if pos >= 0:
            log.buf[pos:pos + k] = pairs
            return log, pos + k
    old = log.buf[:end] if log is not None else np.zeros((0, 2), dtype=np.int64)
    buf = np.empty((2 * (end + k) + 1024, 2), dtype=np.int64)
    buf[:end] = old
    buf[end:end + k] = pairs
    return _Log(buf, end + k), end + k


def _readonly(a):
    a.flags.writeable = False
    return a


class _RowParams(NatParams):
    """λ of a PMF state kept in the row logs (see "row storage" above): ``lam["user_h"]`` etc.

    Reading a name gathers the whole array once (cached, read-only); the update reads only the rows
    it touches. Arithmetic and comparisons act on the gathered arrays, as for any NatParams.
    """

    __slots__ = ("_sides", "_fmt", "_cache", "_mat")
    _NAMES = ("user_h", "user_prec", "item_h", "item_prec")

    def __new__(cls, *args, **kwargs):
        if len(args) == 3 and isinstance(args[0], _Rows):
            return object.__new__(cls)
        return NatParams(*args, **kwargs)       # built from arrays (``type(lam)({...})``): a plain NatParams

    def __init__(self, user: _Rows, item: _Rows, fmt):
        self._sides, self._fmt, self._cache, self._mat = {"user": user, "item": item}, fmt, {}, None

    def _get(self, key):
        a = self._cache.get(key)
        if a is None:
            if key not in self._NAMES:
                raise KeyError(key)
            side, what = key.split("_")
            D = self._fmt.D
            rows = self._sides[side]
            a = rows.column(self._fmt.h) if what == "h" else rows.column(self._fmt.P).reshape(len(rows), D, D)
            self._cache[key] = a = _readonly(a)
        return a

    def _views(self):
        return {k: self._get(k) for k in self._NAMES}

    def __getitem__(self, key):
        return self._get(key)

    def __iter__(self):
        return iter(self._NAMES)

    def __len__(self):
        return 4

    def __reduce__(self):                   # keeps sharing the logs with the state's aux in a copy
        return _RowParams, (self._sides["user"], self._sides["item"], self._fmt)

    def _flat_params(self):
        if self._mat is None:
            self._mat = NatParams(self._views())
        return self._mat

    # the NatParams buffer, built only when arithmetic or a comparison asks for it
    _flat = property(lambda self: self._flat_params()._flat)
    _layout = property(lambda self: self._flat_params()._layout)

    def all_finite(self) -> bool:
        n = self._fmt.n_lam
        return self._sides["user"].all_finite(n) and self._sides["item"].all_finite(n)

    def rows(self, side, rows):
        """(h, Λ) of ``rows`` of ``side`` without gathering the whole side."""
        rec = self._sides[side].gather(rows)
        D = self._fmt.D
        return rec[:, self._fmt.h], rec[:, self._fmt.P].reshape(-1, D, D)


class _PMFAux(Mapping):
    """``state.aux`` of a PMF state: the JSON values (id lists, seed, running mean, flags) and, read
    from the row logs on first access, the per-row arrays ``{user,item}_{n,t,N,kl,E}`` and ``rated``.

    A read-only mapping: ``dict(aux)`` or ``{**aux}`` gives a plain dict of plain arrays (what a
    snapshot stores, and what ``svi_step`` also accepts).
    """

    __slots__ = ("_plain", "_sides", "_rated", "_fmt", "_cache", "_keys")
    _ROW_KEYS = tuple(f"{s}_{c}" for s in ("user", "item") for c in ("n", "t", "N", "kl", "E"))

    def __init__(self, plain: dict, user: _Rows, item: _Rows, rated, fmt):
        self._plain, self._sides, self._rated, self._fmt = plain, {"user": user, "item": item}, rated, fmt
        self._cache = {}
        self._keys = tuple(plain) + self._ROW_KEYS + (("rated",) if rated is not None else ())

    def __getitem__(self, key):
        if key in self._plain:
            return self._plain[key]
        a = self._cache.get(key)
        if a is not None:
            return a
        if key == "rated" and self._rated is not None:
            log, end = self._rated
            a = log.buf[:end] if log is not None else np.zeros((0, 2), dtype=np.int64)
            a = _readonly(a.view())
        elif key in self._ROW_KEYS:
            side, c = key.split("_")
            rows, f, D = self._sides[side], self._fmt, self._fmt.D
            if c == "E":
                a = rows.column(f.E).reshape(len(rows), D + 1, D + 1)
            elif c == "kl":
                a = rows.kl
            else:
                a = rows.column(getattr(f, c))
                if c in ("n", "t"):
                    a = a.astype(np.int64)
            a = _readonly(a)
        else:
            raise KeyError(key)
        self._cache[key] = a
        return a

    def __contains__(self, key):
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def __repr__(self):
        return f"PMFAux(users={len(self._plain['users'])}, items={len(self._plain['items'])})"


class _Format:
    """Column layout of a row record: h (D), Λ (D²), E[X̃X̃ᵀ] ((D+1)²), KL, N, n, t."""

    def __init__(self, D):
        self.D = D
        self.h = slice(0, D)
        self.P = slice(D, D + D * D)
        self.n_lam = D + D * D
        self.E = slice(self.n_lam, self.n_lam + (D + 1) ** 2)
        self.kl = self.E.stop
        self.N, self.n, self.t = self.kl + 1, self.kl + 2, self.kl + 3
        self.width = self.kl + 4


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


def _unique_rows(rows, n) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, return_inverse=True)`` for integer rows in [0, n), without sorting."""
    mark = np.zeros(n, dtype=bool)
    mark[rows] = True
    uniq = np.flatnonzero(mark)
    pos = np.empty(n, dtype=np.int64)
    pos[uniq] = np.arange(len(uniq))
    return uniq, pos[rows]


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
    # annealing kinds (``streamsvi.inference.annealing``): none and svi+ only, for it is neither
    # Tempered nor RandomRestart (no local latent assignments to temper or restart)
    #: δ: an SVI+ step may not take Λ below δ·I/c (no variance above c/δ)
    PREC_FLOOR = 0.5

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
        self._index = {"user": _RowIndex(), "item": _RowIndex()}
        self._fmt = _Format(D)

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

    def __repr__(self):
        return "PMF(" + ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()) + ")"

    # ------------------------------------------------------------ batches
    def check_batch(self, x) -> Ratings:
        """A :class:`Ratings` with at least one finite rating (or a mapping of user/item/rating)."""
        if not isinstance(x, Ratings):
            try:
                x = Ratings(x["user"], x["item"], x["rating"])
            except (KeyError, TypeError, IndexError):
                raise ValueError(f"a PMF batch must be Ratings or have 'user', 'item' and 'rating' "
                                 f"columns, got {type(x).__name__}") from None
        if len(x) == 0:
            raise ValueError("x must hold at least one rating, got 0")
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

    def _new_rows(self, seed, side, ids):
        m = self.init_scale * _hashed_normals(seed, side, ids, self.dim)
        P = np.broadcast_to(self._eta_P, (len(ids), self.dim, self.dim))
        return m / self._pv, P

    def _init_records(self, seed, side, ids) -> np.ndarray:
        """Row records (see ``_Format``) of new ids: prior precision, hashed random mean, zero counts."""
        f, D, k = self._fmt, self.dim, len(ids)
        h, _ = self._new_rows(seed, side, ids)
        m = h * self._pv                       # Λ = diag(1/c): mean c h, covariance diag(c)
        rec = np.zeros((k, f.width))
        rec[:, f.h] = h
        rec[:, f.P] = self._eta_P.reshape(-1)
        E = np.empty((k, D + 1, D + 1))
        E[:, :D, :D] = np.diag(self._pv) + m[:, :, None] * m[:, None, :]
        E[:, :D, D] = E[:, D, :D] = m
        E[:, D, D] = 1.0
        rec[:, f.E] = E.reshape(k, -1)
        rec[:, f.kl] = 0.5 * (m * m / self._pv).sum(axis=1)
        return rec

    def init_state(self, rng, x, n_total):
        """λ with one row per user and item of ``x`` (first-appearance order) and the aux maps."""
        x = self.check_batch(x)
        seed = int(rng.integers(0, 2**63))
        # svi_plus_seen: whether an SVI+ step ever moved this state (only then can a row's data part
        # be indefinite, which the rescaling of a row must check; snapshots without it are checked)
        plain = {"seed": seed, "users": [], "items": [], "svi_plus_seen": False}
        if self.offset == "auto":
            plain.update({"rating_sum": 0.0, "rating_count": 0})
        sides = {}
        for side in ("user", "item"):
            _, new, grown = self._index[side].lookup(plain[f"{side}s"], getattr(x, side))
            plain[f"{side}s"] = grown
            sides[side] = _Rows.from_records(self._init_records(seed, side, new), self._fmt)
        rated = (None, 0) if self.remember_rated else None
        return (_RowParams(sides["user"], sides["item"], self._fmt),
                _PMFAux(plain, sides["user"], sides["item"], rated, self._fmt))

    def init_params(self, rng, x, n_total) -> NatParams:
        return self.init_state(rng, x, n_total)[0]

    def _stores(self, lam, aux):
        """(user rows, item rows, rated (log, end) or None, plain aux dict) of a state.

        A state made by this model shares its logs; any other (a loaded snapshot, a hand-made
        dict) is checked and copied into new logs once.
        """
        if (isinstance(aux, _PMFAux) and isinstance(lam, _RowParams) and aux._fmt.D == self.dim
                and lam._sides["user"] is aux._sides["user"] and lam._sides["item"] is aux._sides["item"]):
            return aux._sides["user"], aux._sides["item"], aux._rated, dict(aux._plain)
        self.check_state(lam, aux)
        f = self._fmt
        sides = {}
        for side in ("user", "item"):
            n = len(aux[f"{side}s"])
            rec = np.empty((n, f.width))
            rec[:, f.h] = lam[f"{side}_h"]
            rec[:, f.P] = np.asarray(lam[f"{side}_prec"]).reshape(n, -1)
            rec[:, f.E] = np.asarray(aux[f"{side}_E"]).reshape(n, -1)
            for c in ("kl", "N", "n", "t"):
                rec[:, getattr(f, c)] = aux[f"{side}_{c}"]
            sides[side] = _Rows.from_records(rec, f)
        rated = None
        if self.remember_rated:
            old = np.asarray(aux["rated"], dtype=np.int64).reshape(-1, 2) if "rated" in aux else None
            rated = (None, 0) if old is None or len(old) == 0 else _pairs_append(None, 0, old)
        plain = {k: v for k, v in aux.items() if k not in _PMFAux._ROW_KEYS and k != "rated"}
        return sides["user"], sides["item"], rated, plain

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
        if (isinstance(aux, _PMFAux) and isinstance(lam, _RowParams) and aux._fmt.D == D
                and all(lam._sides[s] is aux._sides[s] and len(aux._sides[s]) == len(aux[f"{s}s"])
                        for s in ("user", "item"))):
            return                            # made by svi_step/init_state: consistent by construction
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
        """(_moments, KL) of rows from one Cholesky factor L of Λ (computed unless given)."""
        if L is None:
            L = np.linalg.cholesky(P)
        n, D = h.shape
        Linv = _tril_inv(L)
        S = np.swapaxes(Linv, 1, 2) @ Linv
        m = np.einsum("nij,nj->ni", S, h)
        E = np.empty((n, D + 1, D + 1))
        top = E[:, :D, :D]
        np.multiply(m[:, :, None], m[:, None, :], out=top)
        top += S
        E[:, :D, D] = m
        E[:, D, :D] = m
        E[:, D, D] = 1.0
        pv = self._pv
        logdetP = 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)
        kl = 0.5 * ((np.diagonal(S, axis1=1, axis2=2) / pv).sum(axis=1) + (m * m / pv).sum(axis=1)
                    - D + float(np.log(pv).sum()) + logdetP)
        return m, S, E, kl

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

        Every id of ``x`` must already have a row (e.g. ``aux`` from ``init_state`` on ``x``).
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
    @staticmethod
    def _pd(P) -> np.ndarray:
        if len(P) == 0:
            return np.zeros(0, dtype=bool)
        return np.linalg.eigvalsh(0.5 * (P + np.swapaxes(P, 1, 2)))[:, 0] > 0

    def in_domain(self, lam) -> bool:
        return lam.all_finite() and bool(self._pd(lam["user_prec"]).all() and self._pd(lam["item_prec"]).all())

    # ------------------------------------------------------------ the update
    def svi_step(self, lam, aux, x, *, weights, n_total, records_before, schedule, step,
                 boundary_fraction, effective_batch_size=None):
        """One SVI / SVI+ step on the touched rows: users, then items, or the reverse (``sweep``).

        Called by :meth:`streamsvi.inference.SVI.update`; returns a dict with
        ``lam``, ``aux``, ``elbo``, ``grad_variance``, ``grad_norm``,
        ``domain_clipped`` and ``domain_blocks``. ``lam`` and ``aux`` are
        new objects; the arguments are not modified. The cost is that of the
        rows the batch touches (plus 8 bytes per row; see "row storage").
        """
        if aux is None:
            raise ValueError("a PMF state needs aux; start it with SVI.init")
        x = self.check_batch(x)
        U, I, rated, plain = self._stores(lam, aux)
        f = self._fmt
        seed = plain["seed"]
        # rows of the batch's ids (new ids get new rows) and the records of the touched rows
        work, inv, glob = {}, {}, {}
        for side, rows_store in (("user", U), ("item", I)):
            rows, new, grown = self._index[side].lookup(plain[f"{side}s"], getattr(x, side))
            plain[f"{side}s"] = grown
            n_old = len(rows_store)
            uniq, inv[side] = _unique_rows(rows, n_old + len(new))
            old = uniq < n_old
            W = np.empty((len(uniq), f.width))
            W[old] = rows_store.gather(uniq[old])
            if new:                             # new rows are n_old, n_old + 1, ...: the tail of uniq
                W[~old] = self._init_records(seed, side, new)
            work[side], glob[side] = W, (uniq, rows, new)
        S = len(x)
        M = float(S if effective_batch_size is None else effective_batch_size)
        R = records_before + S
        if self.offset == "auto":            # μ0: the running mean of every rating seen, this batch included
            plain["rating_sum"] = float(plain["rating_sum"]) + float(np.sum(x.rating))
            plain["rating_count"] = int(plain["rating_count"]) + S
        y = x.rating - self.mu0(plain)
        eta_P = self._eta_P
        D = self.dim
        report = {"grad_variance": 0.0, "grad_norm_sq": 0.0, "domain_clipped": 0, "domain_blocks": 0}

        def E_of(side):
            return work[side][:, f.E].reshape(-1, D + 1, D + 1)

        # the ELBO at the old λ (new rows at their initial values), from the per-row caches:
        # Σ_r E[log N(y'_r | f_r, σ²)] with E f_r = Eu_u[:, -1]·a_i and E f_r² = ⟨Eu_u, Q_i⟩ summed
        # per user through the grouped ratings (a_i, Q_i: item i's design moments)
        gu = _Grouped(inv["user"], inv["item"], y)
        gi = _Grouped(inv["item"], inv["user"], y)
        Qv, av = self._design_moments(E_of("item"), "user")
        Eu = E_of("user")
        nI = len(Qv)
        sum_yEf = float(np.sum(Eu[:, :, -1] * (gu.Cy(nI) @ av)))
        sum_Ef2 = float(np.sum(Eu.reshape(len(Eu), -1) * (gu.C1(nI) @ Qv.reshape(nI, -1))))
        local = (-0.5 * math.log(2 * math.pi * self.sigma2) * S
                 - (float(np.dot(y, y)) - 2.0 * sum_yEf + sum_Ef2) / (2 * self.sigma2))
        kl = 0.0
        for side, rows_store in (("user", U), ("item", I)):
            uniq, _, new = glob[side]
            kl_all = rows_store.kl
            if new:
                kl_all = np.concatenate([kl_all, work[side][len(uniq) - len(new):, f.kl]])
            kl += float(np.sum(kl_all))
        elbo = -kl + (n_total / S) * local

        check_floor = bool(plain.get("svi_plus_seen", True)) or weights is not None
        if weights is not None:
            plain["svi_plus_seen"] = True
        common = (weights, n_total, R, M, S, schedule, boundary_fraction, eta_P, report, check_floor)
        if self.sweep == "items_first":      # items from the current users, then users from the new items
            Qu, au = self._design_moments(E_of("user"), "item")
            self._step_block("item", Qu, au, gi, work["item"], *common)
            Qv, av = self._design_moments(E_of("item"), "user")
            self._step_block("user", Qv, av, gu, work["user"], *common)
        else:                                 # users from the current items, then items from the new users
            self._step_block("user", Qv, av, gu, work["user"], *common)
            Qu, au = self._design_moments(E_of("user"), "item")
            self._step_block("item", Qu, au, gi, work["item"], *common)
        # publish: nothing above wrote to a log, so a failure before here leaves no trace
        U2 = U.with_records(glob["user"][0], work["user"], f)
        I2 = I.with_records(glob["item"][0], work["item"], f)
        if rated is not None:
            rated = _pairs_append(rated[0], rated[1], np.stack([glob["user"][1], glob["item"][1]], axis=1))
        return {"lam": _RowParams(U2, I2, f), "aux": _PMFAux(plain, U2, I2, rated, f), "elbo": elbo,
                "grad_variance": report["grad_variance"], "grad_norm": math.sqrt(report["grad_norm_sq"]),
                "domain_clipped": report["domain_clipped"], "domain_blocks": report["domain_blocks"]}

    def _step_block(self, side, Q, a, g, W, weights, n_total, R, M, S, schedule, tau, eta_P, report,
                    check_floor=True):
        """Step the touched rows of one side: ``W`` holds their records (row k ↔ local row k of the
        grouping ``g``) and is updated in place (λ, counters, and the cached E[X̃X̃ᵀ] and KL)."""
        f, D = self._fmt, self.dim
        uniq, sums_w, sums, counts, sq = self._block_stats(side, Q, a, g, weights)
        every = len(uniq) == len(W)           # svi_step: every record of W is touched (uniq = 0, 1, ...)
        Wu = W if every else W[uniq]
        n_new = Wu[:, f.n] + counts
        t_new = Wu[:, f.t] + 1
        N_old = Wu[:, f.N]
        N_new = n_total * n_new / R if self.row_counts == "scaled" else n_new.astype(np.float64)
        scale = N_new / counts
        hs, Ps = self._unpack(sums_w)
        tgt_h = scale[:, None] * hs
        tgt_P = eta_P + scale[:, None, None] * Ps
        h_old, P_old = Wu[:, f.h], Wu[:, f.P].reshape(-1, D, D)
        r = np.where(N_old > 0, N_new / np.where(N_old > 0, N_old, 1.0), 1.0)
        if np.any(r != 1.0):
            h_eff = r[:, None] * h_old
            P_eff = eta_P + r[:, None, None] * (P_old - eta_P)
            # after SVI+ a data part may be non-PSD: stretching it must not take Λ below δ I/c
            # (without SVI+ every data part is PSD, so Λ_eff ⪰ η: nothing to check)
            if check_floor:
                bad = ~_pd_rows(P_eff - self.PREC_FLOOR * eta_P)
                h_eff[bad], P_eff[bad] = h_old[bad], P_old[bad]
        else:
            h_eff, P_eff = h_old, P_old
        if self.row_clock == "ratings":       # t_i = n_i / |S_i|: the row's ratings in units of this batch's
            rho = _rho_rows(schedule, n_new / counts)
        else:
            rho_vals, rho_idx = np.unique(t_new, return_inverse=True)
            rho = np.array([schedule(int(t)) for t in rho_vals])[rho_idx]
        if weights is None:
            new_h = (1.0 - rho)[:, None] * h_eff + rho[:, None] * tgt_h
            new_P = (1.0 - rho)[:, None, None] * P_eff + rho[:, None, None] * tgt_P
            new_P = 0.5 * (new_P + np.swapaxes(new_P, 1, 2))
            L_new, ok = _cholesky_rows(new_P)
            keep = ~ok                        # only a state left below η by SVI+ can get here
        else:
            new_h, new_P, keep = self._noisy_step(sums, scale, rho, h_eff, P_eff, tgt_h, tgt_P, tau,
                                                  eta_P, report)
            report["domain_blocks"] += len(uniq)
        if keep.any():                         # last resort: the row keeps its λ (counted)
            new_h[keep], new_P[keep] = h_old[keep], P_old[keep]
            report["domain_clipped"] += int(np.count_nonzero(keep))
        if weights is not None or keep.any():
            L_new = None
        _, _, E, kl = self._moments_kl(new_h, new_P, L_new)
        # ‖λ̂ − λ^eff‖² before the records are overwritten (h_eff, P_eff may be views of them)
        report["grad_norm_sq"] += float(np.sum((tgt_h - h_eff) ** 2) + np.sum((tgt_P - P_eff) ** 2))
        Wu[:, f.h] = new_h
        Wu[:, f.P] = new_P.reshape(len(uniq), -1)
        Wu[:, f.E] = E.reshape(len(uniq), -1)
        Wu[:, f.kl], Wu[:, f.N], Wu[:, f.n], Wu[:, f.t] = kl, N_new, n_new, t_new
        if not every:
            W[uniq] = Wu
        # metric: Σ_i N_i² tr Σ̂_i / M_i (M_i = |S_i| M/|S|)
        mean = sums / counts[:, None]
        tr = np.where(counts > 1, (sq - counts * np.einsum("ij,ij->i", mean, mean))
                      / np.maximum(counts - 1, 1), 0.0)
        report["grad_variance"] += float(np.sum(N_new ** 2 * np.maximum(tr, 0.0) / (counts * M / S)))

    def _noisy_step(self, sums, scale, rho, h_eff, P_eff, tgt_h, tgt_P, tau, eta_P, report):
        """The SVI+ step of touched rows with its noise shrunk symmetrically into the domain.

        Splits the weighted target into the SVI target (w ≡ 1, from the
        unweighted ``sums``) and the noise ξ = λ̂ − λ̂_SVI, zero-mean and
        symmetric given the batch (a linear function of the Gaussian ε). The
        row moves to ``base + s ρ ξ`` with ``base = (1 − ρ) λ^eff + ρ λ̂_SVI``
        and s = min(1, τ / ‖ρ L⁻¹ Ξ L⁻ᵀ‖₂), L Lᵀ = Λ_base − δ I/c, Ξ the
        precision part of ξ: the largest s for which both base ± (s ρ/τ) ξ are
        in the working domain. s(ξ) = s(−ξ), so E_w[λ_new] = base exactly:
        the step is unbiased for every weight variance (module docs). Returns
        (h, Λ, rows that must keep their old λ); rows with s < 1 are counted
        in ``report["domain_clipped"]``.
        """
        hs0, Ps0 = self._unpack(sums)
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
            L, chol_ok = _cholesky_rows(base_P[idx] - self.PREC_FLOOR * eta_P)
            idx, L = idx[chol_ok], L[chol_ok]
            if len(idx):
                Linv = _tril_inv(L)
                K = Linv @ xi_P[idx] @ np.swapaxes(Linv, 1, 2)
                K = 0.5 * (K + np.swapaxes(K, 1, 2))
                ev = np.linalg.eigvalsh(K) if np.isfinite(K).all() else _eigvalsh_rows(K)
                radius = np.max(np.abs(ev), axis=1)
                with np.errstate(divide="ignore", invalid="ignore"):
                    s[idx] = np.where(radius > tau, tau / radius, 1.0)
                s[idx] = np.where(np.isfinite(s[idx]), s[idx], 0.0)
        report["domain_clipped"] += int(np.count_nonzero(s < 1.0))
        new_h = base_h + s[:, None] * xi_h
        new_P = base_P + s[:, None, None] * xi_P
        bad = ~(_pd_rows(new_P) & np.isfinite(new_h).all(axis=1))
        if bad.any():                          # rounding: fall back to the SVI step for these rows
            new_h[bad], new_P[bad] = base_h[bad], base_P[bad]
        keep = ~(_pd_rows(new_P) & np.isfinite(new_h).all(axis=1))
        return new_h, new_P, keep

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
            h, P = lam.rows(side, r) if isinstance(lam, _RowParams) else (lam[f"{side}_h"][r],
                                                                         lam[f"{side}_prec"][r])
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
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        n_items = len(aux["items"])
        if n_items == 0:
            return []
        urow = self.rows_of(aux, "user", [user])
        Eu = self._row_moments(lam, "user", urow)[0]
        Ev = self._row_moments(lam, "item", np.arange(n_items))
        _, a = self._design_moments(Ev, "user")
        scores = self.mu0(aux) + a @ Eu[:, -1]
        keep = np.ones(n_items, dtype=bool)
        if urow[0] >= 0 and "rated" in aux and len(aux["rated"]):
            rated = aux["rated"]
            keep[rated[rated[:, 0] == urow[0], 1]] = False
        ex = self.rows_of(aux, "item", list(exclude)) if len(exclude) else np.empty(0, np.int64)
        keep[ex[ex >= 0]] = False
        cand = np.flatnonzero(keep)
        if len(cand) == 0:
            return []
        kk = min(int(k), len(cand))
        top = cand[np.argpartition(-scores[cand], kk - 1)[:kk]]
        top = top[np.lexsort((top, -scores[top]))]
        items = aux["items"]
        return [(items[j], float(scores[j])) for j in top]

    def score_records(self, lam, x, aux=None) -> list[dict]:
        """``{"user", "item", "prediction", "variance"}`` per rating of ``x`` (JSON-ready)."""
        x = self.check_batch(x)
        mean, var = self.predict_rating(lam, x.user, x.item, aux=aux)
        return [{"user": u, "item": i, "prediction": float(m), "variance": float(v)}
                for u, i, m, v in zip(x.user, x.item, mean, var)]

    @staticmethod
    def _need_aux(aux):
        if aux is None:
            raise ValueError("PMF scoring needs aux=state.aux (the id→row maps of the state); "
                             "streamsvi.load(...) passes it")
        return aux
