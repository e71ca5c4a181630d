"""Storages of parameter blocks and the one natural-gradient step (issue 24, part 1).

The models' side of the block API is :mod:`streamsvi.models.blocks` (families,
block declarations, statistics that add). This module is the engine's side:
how a block is stored and how it is stepped. A model never sees ρ, N, the
SVI+ weights, the annealer or the domain rule; it returns statistics.

Storages
--------
* **Dense** (:func:`dense_step`): λ is one :class:`~streamsvi.models.base.NatParams`;
  the model lists its blocks in ``param_blocks`` (``DenseBlock(names, family)``).
  The step is ``λ_b ← (1 − ρ_b) λ_b + ρ_b λ̂_b`` with ρ_b = min(ρ_t, τ s_max,b)
  (the fraction-to-boundary rule; s_max from the block's family). GMM, the 1-D
  mixture and the HMM use it.
* **Scaled columns** (:func:`scaled_columns_step`): λ_kw = s_k μ_kw + c_k, LDA's
  storage. A column the batch does not touch moves only towards the target of an
  untouched column, e: λ' − e = (1 − ρ_k)(λ − e), which folds into s_k and c_k;
  only the touched columns of μ are written.
* **Growing rows keyed by id** (:class:`RowStorage`, :func:`row_update`): each row
  block (``RowBlock(name, family, counts, clock)``) keeps, per row, λ, the family's
  cached moments, its KL to the prior, N_i, n_i and t_i, in an append-only log
  shared by a lineage of states (below). PMF (Gaussian rows) and Poisson
  factorisation (Gamma rows) use it.

The one step, per row block (:func:`step_rows`)
-----------------------------------------------
For the touched rows i of a block, with S_i the batch's records of row i::

    n_i ← n_i + |S_i|,  t_i ← t_i + 1
    N_i = N n_i / R  (counts="scaled"; R the records seen, this batch included)  or  n_i ("seen")
    λ_i^eff = η + (N_i / N_i^old)(λ_i − η)           the data part rescaled to the new N_i
    ρ_i = schedule(t_i)  (clock="updates")  or  schedule(n_i / |S_i|)  ("ratings"),
          vectorised over the rows (``Schedule.at_steps`` / ``Schedule.many``)
    λ̂_i = η + (N_i / |S_i|) Σ_{r∈S_i} w_r t_r        (the family's ``target``)
    λ_i ← (1 − ρ_i) λ_i^eff + ρ_i λ̂_i                 (the family's ``plain_step``), or under
          SVI+ the family's ``noisy_step`` (its fraction-to-boundary rule for noisy targets)

A row whose result fails the domain test keeps its λ (counted in
``domain_clipped``). The gradient-variance estimate Σ_i N_i² tr(Σ̂_i)/M_i
(M_i = |S_i| M/|S|) and ‖λ̂ − λ^eff‖² are summed here too, from the
statistics' counts and Σ‖t_r‖².

A row-wise update (:func:`row_update`): look the batch's ids up (new ids get
rows from ``model.new_rows``), gather the touched rows, ``model.begin_batch``,
the ELBO at the old λ (−Σ KL + (N/|S|) ``model.batch_loglik``), then for each
block in ``model.sweep_order``: ``model.block_stats`` and :func:`step_rows`
(the next block's statistics see the new moments: a CAVI sweep in batch mode).
It is two halves around one step (:class:`_Sweep`, whose ``step`` is
:func:`step_rows` and the block's running total): the statistics half
:func:`row_sweep` (statistics, then the step, block by block; without
publishing for a scale-out worker) and the apply half :func:`row_apply` (the
steps from statistics made elsewhere, by the touched rows' ids; the scale-out
applier, :mod:`.split_rows`). :func:`row_update` is :func:`row_sweep`, published.

Row storage: one update touches a few hundred rows out of many thousands, and
states are immutable, so a state cannot share a mutable array with its
successor. Each block's rows live in an append-only log of records shared by a
lineage of states: a state's row r is ``log.buf[where[r]]``. An update appends
the records of its touched rows past the end of the log and gives its
successor a ``where`` with those rows pointed at them; entries a state can see
are never written again. Per update the cost is the touched records plus one
copy of ``where`` (8 bytes a row); a full log is compacted into a larger one
(amortised O(1) per record), and so is a branch (an update of a state that is
not the newest of its lineage). A record is
``[λ (family.n_lam) | cache (family.n_cache) | KL | N_i | n_i | t_i]``.

``state.lam`` of a row-wise state is a :class:`RowParams` (arrays
``<block>_<field>`` gathered on first access) and ``state.aux`` a
:class:`RowAux`: the JSON values (``seed``, the id lists ``<block>s``,
``svi_plus_seen`` and the model's own running values) and the per-row arrays
``<block>_{n,t,N,kl,<cache_name>}`` (and a pair log, e.g. PMF's ``rated``).
Snapshots hold plain arrays; :func:`row_stores` copies those into new logs once.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Mapping

import numpy as np

from ..models.base import NatParams, RowWise
from ..models.blocks import RowIndex, RowStats, blocks_in_domain, blocks_max_step

__all__ = ["dense_step", "scaled_columns_step", "step_rows", "row_update", "row_sweep", "row_apply",
           "row_adopt", "row_init", "row_stores", "RowParams", "RowAux", "RowFormat", "is_rowwise"]


def is_rowwise(model) -> bool:
    """Whether ``model`` keeps growing rows keyed by id (declares ``row_blocks``)."""
    return bool(model.row_blocks)


# ====================================================================== dense
def dense_step(blocks, lam: NatParams, target: NatParams, rho: float, tau: float,
               min_weight: float = 1.0) -> tuple[NatParams, int, int]:
    """λ ← (1 − ρ) λ + ρ λ̂, each block kept in its family's domain; ``(new λ, clipped, blocks)``.

    Each block takes ρ_b = min(ρ, τ·s_max). A block is shortened iff s_max < ρ/τ,
    i.e. iff λ + (ρ/τ)(λ̂ − λ) is outside the domain: one membership test first,
    the closed-form s_max only when it fails, and neither when no weight was
    negative (``min_weight`` ≥ 0: λ̂ is inside).
    """
    clipped = nblocks = 0
    if min_weight < 0 and not blocks_in_domain(
            blocks, NatParams({k: lam[k] + (rho / tau) * (target[k] - lam[k]) for k in lam})):
        rho_arr = {}
        for names, limit in blocks_max_step(blocks, lam, target):
            limit = np.asarray(limit, float)
            rho_b = np.minimum(rho, tau * limit)
            clipped += int(np.count_nonzero(rho_b < rho))
            nblocks += int(limit.size)
            for nm in names:
                rho_arr[nm] = rho_b.reshape(rho_b.shape + (1,) * (lam[nm].ndim - rho_b.ndim))
        new_lam = NatParams({k: (1.0 - rho_arr.get(k, rho)) * lam[k] + rho_arr.get(k, rho) * target[k]
                             for k in lam})
    else:
        new_lam = lam * (1.0 - rho) + target * rho
    return new_lam, clipped, nblocks


# ============================================================ scaled columns
def scaled_columns_step(mu, s, c, cols, lam_cols, tgt_cols, rho_k, e):
    """One step of λ_kw = s_k μ_kw + c_k (μ stored word-major, (V, K)); returns ``(μ_cols', s', c')``.

    ``lam_cols`` (|cols|, K) is λ on the touched columns, ``tgt_cols`` λ̂ there, ``e``
    the target of every untouched column (η, or η tempered), ``rho_k`` (K,) the
    per-row step. The new stored values of the touched columns are
    ((1 − ρ_k) λ + ρ_k λ̂ − c'_k)/s'_k with s' = (1 − ρ_k) s, c' = (1 − ρ_k) c + ρ_k e;
    an untouched column then equals (1 − ρ_k) λ + ρ_k e without being written.
    Nothing is written: the caller stores μ_cols' into ``mu[cols]`` (and its
    running sums) once it has checked the result. ``tgt_cols`` is overwritten.
    """
    keep_k = 1.0 - rho_k
    s_new = keep_k * s
    c_new = keep_k * c + rho_k * e
    mu_u = lam_cols * keep_k
    tgt_cols *= rho_k
    mu_u += tgt_cols
    mu_u -= c_new
    mu_u /= s_new
    return mu_u, s_new, c_new


# ====================================================================== rows
class RowFormat:
    """Column layout of one row block's records: λ, the family's cache, KL, N, n, t."""

    def __init__(self, family):
        self.family = family
        self.n_lam = family.n_lam
        self.lam = slice(0, family.n_lam)
        self.cache = slice(family.n_lam, family.n_lam + family.n_cache)
        self.kl = self.cache.stop
        self.N, self.n, self.t = self.kl + 1, self.kl + 2, self.kl + 3
        self.width = self.kl + 4

    def same(self, other) -> bool:
        return isinstance(other, RowFormat) and other.width == self.width and other.n_lam == self.n_lam


class _Log:
    """An append-only buffer shared by a lineage of states: entries below ``used`` are never rewritten."""

    __slots__ = ("buf", "used", "lock")

    def __init__(self, buf, used):
        self.buf, self.used, self.lock = buf, int(used), threading.Lock()

    def __getstate__(self):                  # deepcopy: the entries in use, not the lock
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


class RowStorage:
    """One block's rows in one state: row r's record is ``log.buf[where[r]]`` (never modified)."""

    __slots__ = ("log", "where", "end", "kl", "finite", "total")

    def __init__(self, log, where, end, kl, finite=None, total=None):
        where.flags.writeable = kl.flags.writeable = False
        self.log, self.where, self.end = log, where, int(end)
        self.kl = kl                  # the KL column again, contiguous (the ELBO sums it every update)
        self.finite = finite          # λ columns all finite: True/False, None = not yet known
        self.total = total            # Σ over every row of the family's cache (running; ``RowCaches``)

    @classmethod
    def from_records(cls, rec, fmt: RowFormat) -> "RowStorage":
        n, W = rec.shape
        buf = np.empty((2 * n + 256, W))
        buf[:n] = rec
        finite = bool(np.isfinite(rec[:, :fmt.n_lam]).all())
        return cls(_Log(buf, n), np.arange(n, dtype=np.int64), n, rec[:, fmt.kl].copy(), finite,
                   rec[:, fmt.cache].sum(axis=0))

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

    def with_records(self, rows, rec, fmt: RowFormat, total=None) -> "RowStorage":
        """The successor whose ``rows`` (sorted, unique; rows ≥ len(self) are new) have the records ``rec``.

        Every new row must be among ``rows``. ``self`` is unchanged. ``total``: the successor's
        Σ of the cache over every row (``row_update`` keeps it; default: computed again).
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
            out = RowStorage(log, where, pos + k, kl, finite, total)
        else:
            buf = np.empty((4 * n_new + 4 * k + 1024, log.buf.shape[1]))   # compact into a new log
            buf[:n_old] = log.buf[self.where]
            buf[rows] = rec
            out = RowStorage(_Log(buf, n_new), np.arange(n_new, dtype=np.int64), n_new, kl, finite, total)
        if total is None:
            out.total = out.column(fmt.cache).sum(axis=0)
        return out


class RowCaches(dict):
    """``caches`` of a row-wise update: block -> the family's cached moments of the touched rows
    (local order), and ``totals``: block -> Σ of the cache over **every** row of the block.

    The engine keeps both current through the sweep: after a block's step its touched rows'
    cache is rewritten and its total moves by their difference (summed again from the rows when
    the batch touches every row of the block, which also clears rounding drift). A
    model whose step needs an all-rows sum (Poisson factorisation's rate: Σ_i E[β_i] over every
    item, the zero counts) reads it here at the cost of the touched rows.
    """

    def __init__(self, caches, totals):
        super().__init__(caches)
        self.totals = totals


def _pairs_append(log, end, pairs):
    """Append (k, 2) int64 ``pairs`` to a pair log after ``end``: the new (log, end)."""
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


def _names(blocks):
    return tuple(f"{b.name}_{f}" for b in blocks for f in b.family.fields)


class RowParams(NatParams):
    """λ of a row-wise state kept in the row logs: ``lam["user_h"]`` etc. (module docs).

    Reading a name gathers the whole array once (cached, read-only); an update
    reads only the rows it touches (:meth:`rows`). Arithmetic and comparisons act
    on the gathered arrays, as for any NatParams.
    """

    __slots__ = ("_sides", "_fmts", "_cache", "_mat", "_names_")

    def __new__(cls, *args, **kwargs):
        if len(args) == 2 and isinstance(args[0], dict) and all(isinstance(v, RowStorage)
                                                                for v in args[0].values()):
            return object.__new__(cls)
        return NatParams(*args, **kwargs)       # built from arrays (``type(lam)({...})``): a plain NatParams

    def __init__(self, sides: dict, fmts: dict):
        self._sides, self._fmts, self._cache, self._mat = sides, fmts, {}, None
        self._names_ = tuple(f"{b}_{f}" for b, fmt in fmts.items() for f in fmt.family.fields)

    def _get(self, key):
        a = self._cache.get(key)
        if a is None:
            if key not in self._names_:
                raise KeyError(key)
            block, field = key.rsplit("_", 1)
            fmt = self._fmts[block]
            rows = self._sides[block]
            parts = fmt.family.unpack(rows.column(fmt.lam))
            a = parts[fmt.family.fields.index(field)]
            self._cache[key] = a = _readonly(a)
        return a

    def _views(self):
        return {k: self._get(k) for k in self._names_}

    def __getitem__(self, key):
        return self._get(key)

    def __iter__(self):
        return iter(self._names_)

    def __len__(self):
        return len(self._names_)

    def __reduce__(self):                   # keeps sharing the logs with the state's aux in a copy
        return RowParams, (self._sides, self._fmts)

    def _flat_params(self):
        if self._mat is None:
            self._mat = NatParams(self._views())
        return self._mat

    # the NatParams buffer, built only when arithmetic or a comparison asks for it
    _flat = property(lambda self: self._flat_params()._flat)
    _layout = property(lambda self: self._flat_params()._layout)

    def all_finite(self) -> bool:
        return all(s.all_finite(self._fmts[b].n_lam) for b, s in self._sides.items())

    def rows(self, block, rows):
        """The family's arrays (e.g. (h, Λ)) of ``rows`` of ``block`` without gathering the whole block."""
        fmt = self._fmts[block]
        return fmt.family.unpack(self._sides[block].gather(rows)[:, fmt.lam])


class RowAux(Mapping):
    """``state.aux`` of a row-wise state: the JSON values and, read from the row logs on first
    access, the per-row arrays ``<block>_{n,t,N,kl,<cache>}`` and the pair log (module docs).

    A read-only mapping: ``dict(aux)`` gives a plain dict of plain arrays (what a
    snapshot stores, and what :func:`row_stores` also accepts).
    """

    __slots__ = ("_plain", "_sides", "_pairs", "_pair_name", "_fmts", "_cache", "_keys", "_row_keys")

    def __init__(self, plain: dict, sides: dict, fmts: dict, pairs=None, pair_name=None):
        self._plain, self._sides, self._fmts = plain, sides, fmts
        self._pairs, self._pair_name = pairs, pair_name
        self._cache = {}
        self._row_keys = tuple(f"{b}_{c}" for b, fmt in fmts.items() for c in _row_columns(fmt))
        self._keys = tuple(plain) + self._row_keys + ((pair_name,) if pairs is not None else ())

    def family_of(self, block):
        """The family whose records this aux's ``block`` rows hold."""
        return self._fmts[block].family

    def consistent_with(self, lam) -> bool:
        """Whether ``lam`` is the λ made together with this aux (same logs, same lengths)."""
        return (isinstance(lam, RowParams) and all(
            lam._sides.get(b) is s and len(s) == len(self._plain[f"{b}s"]) for b, s in self._sides.items()))

    def __getitem__(self, key):
        if key in self._plain:
            return self._plain[key]
        a = self._cache.get(key)
        if a is not None:
            return a
        if key == self._pair_name and self._pairs is not None:
            log, end = self._pairs
            a = log.buf[:end] if log is not None else np.zeros((0, 2), dtype=np.int64)
            a = _readonly(a.view())
        elif key in self._row_keys:
            block, c = key.rsplit("_", 1)
            rows, fmt = self._sides[block], self._fmts[block]
            if c == "kl":
                a = rows.kl
            elif c == "total":
                a = np.array(rows.total if rows.total is not None else rows.column(fmt.cache).sum(axis=0))
            elif c in ("n", "t", "N"):
                a = rows.column(getattr(fmt, c))
                if c in ("n", "t"):
                    a = a.astype(np.int64)
            else:
                a = fmt.family.cache_view(rows.column(fmt.cache))
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
        return "RowAux(" + ", ".join(f"{b}s={len(self._plain[b + 's'])}" for b in self._sides) + ")"


def _row_columns(fmt) -> tuple:
    """The per-block keys of a row-wise aux: counters, KL, the cache (and its total, when kept)."""
    return ("n", "t", "N", "kl", fmt.family.cache_name) + (("total",) if fmt.family.keeps_total else ())


def _formats(cache: dict, model) -> dict:
    """{block: RowFormat} of ``model``, kept in the engine's ``cache`` (the blocks are fixed per model)."""
    fm = cache.get("formats")
    if fm is None or fm[0] is not model:
        fm = cache["formats"] = (model, {b.name: RowFormat(b.family) for b in model.row_blocks})
    return fm[1]


def _indices(engine_cache: dict, model) -> dict:
    idx = engine_cache.get("index")
    if idx is None or set(idx) != {b.name for b in model.row_blocks}:
        idx = engine_cache["index"] = {b.name: RowIndex() for b in model.row_blocks}
    return idx


def _new_records(model, fmt, seed, block, ids) -> np.ndarray:
    """Records of new ids: the model's initial λ, the family's cache and KL, zero counters."""
    lam, cache, kl = fmt.family.prior_rows(model.new_rows(seed, block, ids))
    rec = np.zeros((len(ids), fmt.width))
    rec[:, fmt.lam] = lam
    rec[:, fmt.cache] = cache
    rec[:, fmt.kl] = kl
    return rec


def _total_with(store, W, fmt, glob) -> np.ndarray:
    """Σ of the cache over the block's rows, new rows (the tail of ``W``) included."""
    uniq, _, new = glob
    total = store.total if store.total is not None else store.column(fmt.cache).sum(axis=0)
    if new:
        total = total + W[len(uniq) - len(new):, fmt.cache].sum(axis=0)
    return total


def row_init(model, cache: dict, rng, x):
    """(λ, aux) of a fresh row-wise state: one row per id of ``x`` (first-appearance order)."""
    fmts = _formats(cache, model)
    index = _indices(cache, model)
    seed = int(rng.integers(0, 2**63))
    # svi_plus_seen: whether an SVI+ step ever moved this state (only then can a row's data part
    # be outside the family's working domain, which the rescaling of a row must check)
    plain = {"seed": seed, **{f"{b.name}s": [] for b in model.row_blocks}, "svi_plus_seen": False}
    plain.update(model.init_row_values())
    keys = model.row_keys(x)
    sides = {}
    for b in model.row_blocks:
        _, new, grown = index[b.name].lookup(plain[f"{b.name}s"], keys[b.name])
        plain[f"{b.name}s"] = grown
        sides[b.name] = RowStorage.from_records(_new_records(model, fmts[b.name], seed, b.name, new),
                                                fmts[b.name])
    pname = model.pair_log
    pairs = (None, 0) if pname else None
    return RowParams(sides, fmts), RowAux(plain, sides, fmts, pairs, pname)


def row_stores(model, lam, aux, cache=None):
    """(block storages, pair log or None, plain aux dict) of a state.

    A state made by :func:`row_update`/:func:`row_init` shares its logs; any
    other (a loaded snapshot, a hand-made dict) is checked by ``model.check_state``
    and copied into new logs once.
    """
    fmts = _formats({} if cache is None else cache, model)
    if isinstance(aux, RowAux) and aux.consistent_with(lam) and all(
            fmts[b].same(aux._fmts.get(b)) for b in fmts) and set(fmts) == set(aux._fmts):
        return dict(aux._sides), aux._pairs, dict(aux._plain)
    model.check_state(lam, aux)
    sides = {}
    for b in model.row_blocks:
        fmt, name = fmts[b.name], b.name
        n = len(aux[f"{name}s"])
        rec = np.empty((n, fmt.width))
        fmt.family.pack(tuple(np.asarray(lam[f"{name}_{f}"]) for f in fmt.family.fields), rec[:, fmt.lam])
        rec[:, fmt.cache] = np.asarray(aux[f"{name}_{fmt.family.cache_name}"]).reshape(n, -1)
        for c in ("kl", "N", "n", "t"):
            rec[:, getattr(fmt, c)] = aux[f"{name}_{c}"]
        sides[name] = RowStorage.from_records(rec, fmt)
        if fmt.family.keeps_total and f"{name}_total" in aux:   # the running total, as the state had it
            sides[name].total = np.array(aux[f"{name}_total"], dtype=np.float64).reshape(fmt.family.n_cache)
    pairs = None
    pname = model.pair_log
    if pname:
        old = np.asarray(aux[pname], dtype=np.int64).reshape(-1, 2) if pname in aux else None
        pairs = (None, 0) if old is None or len(old) == 0 else _pairs_append(None, 0, old)
    row_keys = {f"{b}_{c}" for b, fmt in fmts.items() for c in _row_columns(fmt)}
    plain = {k: v for k, v in aux.items() if k not in row_keys and k != pname}
    return sides, pairs, plain


def _unique_rows(rows, n) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, return_inverse=True)`` for integer rows in [0, n), without sorting."""
    mark = np.zeros(n, dtype=bool)
    mark[rows] = True
    uniq = np.flatnonzero(mark)
    pos = np.empty(n, dtype=np.int64)
    pos[uniq] = np.arange(len(uniq))
    return uniq, pos[rows]


def step_rows(block, fmt: RowFormat, W, stats, *, weighted: bool, n_total: float, R: int, M: float,
              S: int, schedule, tau: float, check_floor: bool, report: dict) -> None:
    """The one step of the touched rows of a row block (module docs), in place on their records ``W``.

    ``W`` holds the records of the block's touched rows (local row k ↔ row k of the
    batch's grouping); ``stats`` (:class:`~streamsvi.models.blocks.RowStats`) names
    the rows it touches (``stats.rows``, ascending) and their sums. λ, the cached
    moments, KL, N_i, n_i and t_i of those records are updated; ``report``
    accumulates grad_variance, grad_norm_sq, domain_clipped and domain_blocks.
    """
    fam = fmt.family
    uniq, sums_w, sums, counts, sq = stats.rows, stats.sums_w, stats.sums, stats.counts, stats.sqsum
    every = len(uniq) == len(W)           # every record of W is touched (uniq = 0, 1, ...)
    Wu = W if every else W[uniq]
    n_new = Wu[:, fmt.n] + counts
    t_new = Wu[:, fmt.t] + 1
    N_old = Wu[:, fmt.N]
    N_new = n_total * n_new / R if block.counts == "scaled" else n_new.astype(np.float64)
    scale = N_new / counts
    tgt = fam.target(scale, sums_w)
    lam_old = fam.unpack(Wu[:, fmt.lam])
    r = np.where(N_old > 0, N_new / np.where(N_old > 0, N_old, 1.0), 1.0)
    lam_eff = fam.rescale(lam_old, r, check_floor) if np.any(r != 1.0) else lam_old
    if block.clock == "ratings":          # t_i = n_i / |S_i|: the row's records in units of this batch's
        rho = schedule.many(n_new / counts)
    else:
        rho = schedule.at_steps(t_new)
    if not weighted:
        new, L_new, keep = fam.plain_step(lam_eff, tgt, rho)   # keep: only a state left outside by SVI+
    else:
        new, keep, shrunk = fam.noisy_step(sums, scale, rho, lam_eff, tgt, tau)
        report["domain_clipped"] += shrunk
        report["domain_blocks"] += len(uniq)
        L_new = None
    if keep.any():                         # last resort: the row keeps its λ (counted)
        for a, old in zip(new, lam_old):
            a[keep] = old[keep]
        report["domain_clipped"] += int(np.count_nonzero(keep))
        L_new = None
    cache, kl = fam.cache_of(new, L_new)
    # ‖λ̂ − λ^eff‖² before the records are overwritten (λ^eff may be views of them)
    report["grad_norm_sq"] += fam.sqdist(tgt, lam_eff)
    fam.pack(new, Wu[:, fmt.lam])
    Wu[:, fmt.cache] = cache
    Wu[:, fmt.kl], Wu[:, fmt.N], Wu[:, fmt.n], Wu[:, fmt.t] = kl, N_new, n_new, t_new
    if not every:
        W[uniq] = Wu
    # metric: Σ_i N_i² tr Σ̂_i / M_i (M_i = |S_i| M/|S|)
    mean = sums / counts[:, None]
    tr = np.where(counts > 1, (sq - counts * np.einsum("ij,ij->i", mean, mean))
                  / np.maximum(counts - 1, 1), 0.0)
    report["grad_variance"] += float(np.sum(N_new ** 2 * np.maximum(tr, 0.0) / (counts * M / S)))


class _Sweep:
    """One row update in progress (module docs): the touched rows' records of every block, in
    local order, gathered from a state, and what the steps have measured so far.

    The two halves of a row update both use it: the statistics half (:func:`row_sweep`: the
    model's ``block_stats`` block by block, each followed by :meth:`step`) and the apply half
    (:func:`row_apply`: :meth:`step` from statistics made elsewhere, e.g. by a scale-out
    worker). Nothing is written to a log before :meth:`publish`.

    ``keys``: block -> the ids of the batch's records (or of the touched rows); ids without a
    row get new records from ``model.new_rows`` with the state's seed. ``grow=False`` leaves
    the id lists as they are (a worker's sweep, which publishes nothing).
    """

    __slots__ = ("model", "fmts", "sides", "pairs", "plain", "work", "inv", "glob", "totals", "report",
                 "check_floor", "n_ids", "blocks")

    def __init__(self, model, cache: dict, lam, aux, keys: dict, grow: bool = True):
        if aux is None:
            raise ValueError("a row-wise state needs aux; start it with SVI.init")
        self.model = model
        self.blocks = {b.name: b for b in model.row_blocks}
        self.fmts = fmts = _formats(cache, model)
        index = _indices(cache, model)
        self.sides, self.pairs, self.plain = row_stores(model, lam, aux, cache)
        plain, seed = self.plain, self.plain["seed"]
        self.work, self.inv, self.glob, self.n_ids = {}, {}, {}, {}
        for b in model.row_blocks:
            name, fmt, store = b.name, fmts[b.name], self.sides[b.name]
            ids = plain[f"{name}s"]
            rows, new, grown = index[name].lookup(ids, keys[name], grow=grow)
            self.n_ids[name] = len(ids)
            if grow:
                plain[f"{name}s"] = grown
            n_old = len(store)
            uniq, self.inv[name] = _unique_rows(rows, n_old + len(new))
            old = uniq < n_old
            W = np.empty((len(uniq), fmt.width))
            W[old] = store.gather(uniq[old])
            if new:                             # new rows are n_old, n_old + 1, ...: the tail of uniq
                W[~old] = _new_records(model, fmt, seed, name, new)
            self.work[name], self.glob[name] = W, (uniq, rows, new)
        self.totals = {b: _total_with(self.sides[b], self.work[b], fmts[b], self.glob[b]) for b in self.work}
        self.report = {"grad_variance": 0.0, "grad_norm_sq": 0.0, "domain_clipped": 0, "domain_blocks": 0}
        self.check_floor = bool(plain.get("svi_plus_seen", True))

    def touched_ids(self, block) -> list:
        """The ids of ``block``'s touched rows, in local order (new ids included)."""
        ids, n = self.plain[f"{block}s"], self.n_ids[block]
        uniq, _, new = self.glob[block]
        return [ids[r] if r < n else new[r - n] for r in uniq.tolist()]

    def caches(self):
        """The touched rows' cached moments, as they are now, and the totals."""
        fmts = self.fmts
        return RowCaches({b: fmts[b].family.cache_view(W[:, fmts[b].cache]) for b, W in self.work.items()},
                         self.totals)

    def weighted(self, weighted: bool) -> None:
        """Say whether this update's statistics carry SVI+ weights (before the first :meth:`step`)."""
        self.check_floor = self.check_floor or weighted
        if weighted:
            self.plain["svi_plus_seen"] = True

    def old_kl(self) -> float:
        """Σ of every row's KL at the old λ (new rows at their initial values)."""
        kl = 0.0
        for name, store in self.sides.items():
            uniq, _, new = self.glob[name]
            kl_all = store.kl
            if new:
                kl_all = np.concatenate([kl_all, self.work[name][len(uniq) - len(new):, self.fmts[name].kl]])
            kl += float(np.sum(kl_all))
        return kl

    def step(self, block, stats, *, weighted: bool, n_total: float, R: int, M: float, S: int, schedule,
             tau: float) -> None:
        """The apply half for one block: :func:`step_rows` on its touched records, then its total."""
        fmt, W = self.fmts[block], self.work[block]
        before = W[:, fmt.cache].sum(axis=0)
        step_rows(self.blocks[block], fmt, W, stats, weighted=weighted, n_total=n_total, R=R, M=M,
                  S=S, schedule=schedule, tau=tau, check_floor=self.check_floor, report=self.report)
        if len(W) == len(self.sides[block]) + len(self.glob[block][2]):     # every row touched: sum again
            self.totals[block] = W[:, fmt.cache].sum(axis=0)
        else:
            self.totals[block] = self.totals[block] + (W[:, fmt.cache].sum(axis=0) - before)

    def publish(self, pair_rows=None) -> tuple:
        """(λ, aux) of the successor state: the touched records appended to the logs, and
        ``pair_rows`` ((k, 2) rows of ``model.pair_blocks``) to the pair log."""
        fmts, sides = self.fmts, self.sides
        new_sides = {name: sides[name].with_records(self.glob[name][0], self.work[name], fmts[name],
                                                    self.totals[name]) for name in sides}
        pairs = self.pairs
        if pairs is not None and pair_rows is not None:
            pairs = _pairs_append(pairs[0], pairs[1], pair_rows)
        return (RowParams(new_sides, fmts),
                RowAux(self.plain, new_sides, fmts, pairs, self.model.pair_log))

    def results(self) -> dict:
        r = self.report
        return {"grad_variance": r["grad_variance"], "grad_norm": math.sqrt(r["grad_norm_sq"]),
                "domain_clipped": r["domain_clipped"], "domain_blocks": r["domain_blocks"]}


def row_sweep(model, cache: dict, lam, aux, x, *, weights, n_total: float, records_before: int,
              schedule, tau: float, effective_batch_size=None, publish: bool = True) -> dict:
    """The statistics half of a row update (module docs), with each block's step as it goes.

    For each block in ``model.sweep_order``: ``model.block_stats`` at the current moments,
    then the block's step (:meth:`_Sweep.step`, the apply half) on the touched records, so the
    next block's statistics see the new moments. Returns ``elbo`` (at the old λ), ``stats``
    (block -> :class:`~streamsvi.models.blocks.RowStats`, local rows), ``sweep`` (the
    :class:`_Sweep`: touched ids, each record's local rows ``inv``) and the step metrics; with
    ``publish`` also the successor's ``lam`` and ``aux``. ``publish=False`` (a scale-out worker)
    writes nothing and leaves the id lists and logs as they are.
    """
    sw = _Sweep(model, cache, lam, aux, model.row_keys(x), grow=publish)
    S = len(x)
    M = float(S if effective_batch_size is None else effective_batch_size)
    R = records_before + S
    ctx = model.begin_batch(x, sw.plain, sw.inv)
    # the ELBO at the old λ (new rows at their initial values)
    caches = sw.caches()
    elbo = -sw.old_kl() + (n_total / S) * model.batch_loglik(ctx, caches)
    if isinstance(model, RowWise):          # the term no record carries (RowWise.global_loglik)
        elbo += model.global_loglik(ctx, caches)
    weighted = weights is not None
    sw.weighted(weighted)
    stats = {}
    for name in model.sweep_order:
        stats[name] = st = model.block_stats(name, ctx, sw.caches(), weights)
        sw.step(name, st, weighted=weighted, n_total=n_total, R=R, M=M, S=S, schedule=schedule, tau=tau)
    out = {"elbo": elbo, "stats": stats, "sweep": sw, **sw.results()}
    if publish:
        pair_rows = None
        if sw.pairs is not None:
            a, b = model.pair_blocks
            pair_rows = np.stack([sw.glob[a][1], sw.glob[b][1]], axis=1)
        out["lam"], out["aux"] = sw.publish(pair_rows)
    return out


def row_update(model, cache: dict, lam, aux, x, *, weights, n_total: float, records_before: int,
               schedule, tau: float, effective_batch_size=None) -> dict:
    """One SVI / SVI+ step of a row-wise model on the touched rows (module docs).

    Returns ``lam``, ``aux``, ``elbo``, ``grad_variance``, ``grad_norm``,
    ``domain_clipped`` and ``domain_blocks``. ``lam`` and ``aux`` are new objects;
    the arguments are not modified, and nothing visible is written before the end
    (a failure leaves no trace). The cost is that of the rows the batch touches.
    """
    out = row_sweep(model, cache, lam, aux, x, weights=weights, n_total=n_total,
                    records_before=records_before, schedule=schedule, tau=tau,
                    effective_batch_size=effective_batch_size)
    del out["stats"], out["sweep"]
    return out


def row_apply(model, cache: dict, lam, aux, ids: dict, stats: dict, *, weighted: bool, n_total: float,
              records_before: int, S: int, M: float, schedule, tau: float, pairs=None,
              running=None) -> dict:
    """The apply half of a row update: the step of every block from statistics made elsewhere.

    ``ids``: block -> the touched rows' ids (distinct; the rows of ``stats[block]`` index this
    list); ids without a row here get new rows (``model.new_rows``, this state's seed).
    ``stats``: block -> :class:`~streamsvi.models.blocks.RowStats`. The blocks are stepped in
    ``model.sweep_order`` with this state's per-row clocks (n_i, t_i, N_i), R =
    ``records_before`` + ``S``. ``pairs``: (k, 2) positions in ``ids`` of ``model.pair_blocks``,
    appended to the pair log; ``running``: the batch's part of the model's running values
    (``init_row_values``), added to this state's. At the state the statistics were made at,
    the result is :func:`row_update`'s, bit for bit (same local order, same arithmetic).
    Returns ``lam``, ``aux`` and the step metrics; nothing is written on failure.
    """
    names = [b.name for b in model.row_blocks]
    if set(ids) != set(names) or set(stats) != set(names):
        raise ValueError(f"row statistics for blocks {sorted(stats)} (ids {sorted(ids)}) do not match the "
                         f"model's {sorted(names)}")
    sw = _Sweep(model, cache, lam, aux, ids, grow=True)
    where = {}
    for name in names:
        k = len(ids[name])
        if len(sw.glob[name][0]) != k:
            raise ValueError(f"the touched {name} ids of a row contribution are not distinct")
        where[name] = sw.inv[name]             # position in ids -> local row here
        st = stats[name]
        n = len(st.rows)
        if not (len(st.sums_w) == len(st.sums) == len(st.counts) == len(st.sqsum) == n) or (
                n and (st.rows.min() < 0 or st.rows.max() >= k)) or np.any(st.counts <= 0):
            raise ValueError(f"row statistics of block {name!r} are inconsistent ({n} rows of {k} ids)")
    for key, v in (running or {}).items():
        if key not in sw.plain:
            raise ValueError(f"running value {key!r} is not one of this model's")
        sw.plain[key] = sw.plain[key] + v
    sw.weighted(weighted)
    for name in model.sweep_order:
        st = stats[name]
        r = where[name][st.rows]
        order = np.argsort(r, kind="stable")
        if np.any(order != np.arange(len(r))):     # into this state's local order (ascending rows)
            st = RowStats(r[order], st.sums_w[order], st.sums[order], st.counts[order], st.sqsum[order])
        else:
            st = RowStats(r, st.sums_w, st.sums, st.counts, st.sqsum)
        sw.step(name, st, weighted=weighted, n_total=n_total, R=records_before + S, M=M, S=S,
                schedule=schedule, tau=tau)
    pair_rows = None
    if sw.pairs is not None and pairs is not None:
        a, b = model.pair_blocks
        pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
        if len(pairs) and (pairs.min() < 0 or pairs[:, 0].max() >= len(ids[a])
                           or pairs[:, 1].max() >= len(ids[b])):
            raise ValueError("pair positions of a row contribution are outside its id lists")
        pair_rows = np.stack([sw.glob[a][1][pairs[:, 0]], sw.glob[b][1][pairs[:, 1]]], axis=1)
    out = sw.results()
    out["lam"], out["aux"] = sw.publish(pair_rows)
    return out


def row_adopt(model, cache: dict, lam, aux) -> tuple:
    """(λ, aux) of a state in the row storage: itself if it is one, else (a loaded snapshot or λ
    file: plain arrays) copied into new logs, once, after ``model.check_state``."""
    if isinstance(lam, RowParams) and isinstance(aux, RowAux) and aux.consistent_with(lam):
        return lam, aux
    sides, pairs, plain = row_stores(model, lam, aux, cache)
    fmts = _formats(cache, model)
    return RowParams(sides, fmts), RowAux(plain, sides, fmts, pairs, model.pair_log)
