"""The split of a row-wise update (PMF, Poisson factorisation): row statistics with their ids.

λ of a row-wise model is rows keyed by id (:mod:`.blocks`), and one update is a
CAVI sweep over the row blocks in ``model.sweep_order``: block A's statistics,
A's step, then block B's statistics at A's new moments. The split cuts each
block between its statistics and its step (:func:`~.blocks.row_sweep`, the
statistics half; :func:`~.blocks.row_apply`, the apply half; one
:func:`~.blocks.step_rows` serves both and the engine's own update):

* the worker (:meth:`RowsSplitter.contribution`) runs the whole sweep locally at
  the λ version it holds, publishing nothing, and keeps each block's
  :class:`~streamsvi.models.blocks.RowStats` (so B's statistics are at the
  worker's stepped A, as in one process);
* the applier (:meth:`RowsSplitter.apply`) steps its **current** rows with them,
  block by block in sweep order, with its own per-row clocks: n_i, t_i, N_i, R
  (records seen), ρ_i = schedule(t_i) (times the staleness ``rho_scale``), the
  family's domain rule. Ids it has no row for get new rows from
  ``model.new_rows`` with its state's seed, so an id new to two workers at the
  same stale version gets one row, created by the first contribution applied.

What a contribution holds (``Contribution.arrays``, per row block ``b``; k_b its
touched rows, w the family's statistic width: PMF D + D², Poisson factorisation 2K)::

    b/rows    int64 (k_b,)     positions in the id list of the rows the statistics name
    b/sums_w  float64 (k_b, w) Σ_r w_r t_r per row (the SVI+ weighted sums)
    b/sums    float64 (k_b, w) Σ_r t_r, only under SVI+ (else it is b/sums_w)
    b/counts  int64 (k_b,)     |S_i|
    b/sqsum   float64 (k_b,)   Σ_r ‖t_r‖² (the gradient-variance metric)
    pairs     int64 (|S|, 2)   each record's (user, item) positions in the id lists, for the
                               pair log (PMF's and HPF's ``rated``), when the model keeps one

and ``meta`` (JSON): ``ids`` (block -> the touched rows' ids, as the state's id
lists hold them: strings or integers, JSON keeps which), ``weighted``, ``M``
(SVI+'s effective size), ``elbo`` (the worker's ELBO at its λ, free: the sweep
computes it), ``running`` (the batch's part of the model's running values,
``init_row_values``, e.g. PMF's ``rating_sum``/``rating_count`` with
``offset="auto"``: values that add, made by ``model.begin_batch`` on fresh ones)
and ``symmetric`` (the sums sent packed: a Gaussian block's Λ part is a
symmetric D×D matrix, sent as its upper triangle, w = D + D(D+1)/2, when it is
exactly symmetric, which the worker checks, so the packing loses nothing).

Size: 8·(w + 3) bytes per touched row, 16 per record (pairs) and the ids' JSON.
MovieLens 100K, |S| = 1000 ratings (~370 users and ~560 items touched), rank 10:
~530 KB per delta (biases: ~620 KB); unpacked it was 870 KB (1.04 MB), above
Kafka's default 1 MiB message limit.

Agreement: exact. At the worker's own state the applier's local order of the
touched rows is the worker's (ascending rows; the ids are looked up in the
worker's order, so new rows get the same rows), and the step is the same code
on the same numbers, so ``apply(contribution(state, x))`` is ``update(state, x)``
bit for bit, λ and aux (counters, totals, pair log) alike. At another state the
statistics are reordered into the applier's local order.

A worker's λ comes from the published λ file (plain arrays):
:func:`~.blocks.row_adopt` copies it into the row storage once per λ version
(kept in the engine's row cache) and the sweep reads only the touched rows.
"""
from __future__ import annotations

import numpy as np

from ..models.blocks import GaussianRows, RowStats
from .blocks import row_adopt, row_apply, row_sweep
from .engine import EngineState
from .split import SPLITTERS, Applied, Contribution, Splitter

__all__ = ["RowsSplitter"]

_STATS = ("rows", "sums_w", "sums", "counts", "sqsum")


class _ScaledSchedule:
    """ρ of a schedule times a constant (the applier's staleness down-weighting), per row too."""

    def __init__(self, schedule, scale: float):
        self.schedule, self.scale = schedule, float(scale)

    def __call__(self, t):
        return float(self.schedule(t)) * self.scale

    def many(self, t):
        return self.schedule.many(t) * self.scale

    def at_steps(self, t):
        return self.schedule.at_steps(t) * self.scale


def _adopted(engine, state):
    """(λ, aux) of ``state`` in the row storage, copied at most once per state (engine's cache): a
    worker computes many contributions at one loaded λ version."""
    cache = engine._rows_cache
    memo = cache.get("adopted")
    if memo is not None and memo[0] is state.lam and memo[1] is state.aux:
        return memo[2], memo[3]
    lam, aux = row_adopt(engine.model, cache, state.lam, state.aux)
    if lam is not state.lam:
        cache["adopted"] = (state.lam, state.aux, lam, aux)
    return lam, aux


class RowsSplitter(Splitter):
    """Row blocks keyed by id (module docs): the touched rows' ids and statistics; exact agreement."""

    agreement = "exact"

    def contribution(self, engine, state: EngineState, x, rng_state: dict) -> Contribution:
        model = engine.model
        x = model.check_batch(x)
        S = x.shape[0]
        M = engine.effective_size(S, state.step + 1)
        at = EngineState(step=state.step, lam=state.lam, rng_state=rng_state,
                         records_seen=state.records_seen, aux=state.aux)
        weights, _, _ = engine._svi_plus_weights(at, S, M)       # the draws of SVI.update
        lam, aux = _adopted(engine, state)
        out = row_sweep(model, engine._rows_cache, lam, aux, x, weights=weights,
                        n_total=float(engine.n_total), records_before=state.records_seen,
                        schedule=engine.schedule, tau=float(engine.boundary_fraction),
                        effective_batch_size=M, publish=False)
        sw, weighted = out["sweep"], weights is not None
        arrays, ids, packed = {}, {}, []
        for b in model.row_blocks:
            st = out["stats"][b.name]
            ids[b.name] = sw.touched_ids(b.name)
            arrays[f"{b.name}/rows"] = np.asarray(st.rows, dtype=np.int64)
            for k in ("sums_w", "sums") if weighted else ("sums_w",):
                arrays[f"{b.name}/{k}"], sym = _pack(b.family, getattr(st, k))
                if sym:
                    packed.append(f"{b.name}/{k}")
            arrays[f"{b.name}/counts"] = np.asarray(st.counts, dtype=np.int64)
            arrays[f"{b.name}/sqsum"] = np.asarray(st.sqsum, dtype=np.float64)
        if model.pair_log:
            a, b = model.pair_blocks
            arrays["pairs"] = np.stack([sw.inv[a], sw.inv[b]], axis=1).astype(np.int64)
        meta = {"storage": "rows", "ids": ids, "weighted": weighted, "M": float(M), "symmetric": packed,
                "elbo": float(out["elbo"]), "running": _running(model, x, sw)}
        return Contribution(arrays=arrays, records=int(S),
                            min_weight=1.0 if weights is None else float(weights.min()), meta=meta)

    def apply(self, engine, state: EngineState, c: Contribution, rho_scale: float = 1.0,
              metrics: bool = True):
        model = engine.model
        meta = c.meta or {}
        if meta.get("storage") != "rows" or not isinstance(meta.get("ids"), dict):
            raise ValueError("not a row contribution (its meta has no 'ids'): was it made by a worker "
                             f"of another model than {model.name!r}?")
        weighted = bool(meta.get("weighted", False))
        ids, stats = {}, {}
        for b in model.row_blocks:
            name = b.name
            if name not in meta["ids"] or not isinstance(meta["ids"][name], list):
                raise ValueError(f"row contribution has no ids for block {name!r}")
            ids[name] = meta["ids"][name]
            need = [f"{name}/{k}" for k in _STATS if k != "sums" or weighted]
            missing = [k for k in need if k not in c.arrays]
            if missing:
                raise ValueError(f"row contribution lacks {missing}")
            g = {k: np.asarray(c.arrays[f"{name}/{k}"]) for k in _STATS if f"{name}/{k}" in c.arrays}
            for k in ("sums_w", "sums"):
                if f"{name}/{k}" in meta.get("symmetric", ()):
                    g[k] = _unpack(b.family, g[k])
            sums_w = np.asarray(g["sums_w"], dtype=np.float64)
            stats[name] = RowStats(g["rows"].astype(np.int64), sums_w,
                                   np.asarray(g["sums"], dtype=np.float64) if weighted else sums_w,
                                   g["counts"].astype(np.int64), np.asarray(g["sqsum"], dtype=np.float64))
        pairs = c.arrays.get("pairs")
        if model.pair_log and pairs is None:
            raise ValueError(f"row contribution lacks the pairs of the pair log {model.pair_log!r}")
        t = state.step + 1
        sched = engine.schedule if rho_scale == 1.0 else _ScaledSchedule(engine.schedule, rho_scale)
        records = int(c.records)
        lam, aux = row_adopt(model, engine._rows_cache, state.lam, state.aux)   # copied once after a resume
        out = row_apply(model, engine._rows_cache, lam, aux, ids, stats, weighted=weighted,
                        n_total=float(engine.n_total), records_before=state.records_seen, S=records,
                        M=float(meta.get("M", records)), schedule=sched,
                        tau=float(engine.boundary_fraction), pairs=pairs, running=meta.get("running"))
        if not out["lam"].all_finite():
            raise FloatingPointError(f"delta step {t} would make λ non-finite; state left unchanged")
        new = EngineState(step=t, lam=out["lam"], rng_state=state.rng_state,
                          records_seen=state.records_seen + records, aux=out["aux"])
        elbo = meta.get("elbo")
        return new, Applied(step=t, rho=float(engine.schedule(t)) * float(rho_scale), records=records,
                            domain_clipped=int(out["domain_clipped"]),
                            elbo=None if elbo is None else float(elbo))


def _square(family):
    """D if ``family``'s statistics hold a D×D matrix after D columns (Gaussian rows: h, then Λ's
    part row-major), else None."""
    return family.D if isinstance(family, GaussianRows) else None


def _pack(family, sums):
    """(array to send, packed?): a Gaussian block's Λ part as its upper triangle when it is exactly
    symmetric (it is, from symmetric cached moments; the check makes the packing lossless)."""
    D = _square(family)
    if D is None or sums.shape[1] != D + D * D:
        return sums, False
    P = sums[:, D:].reshape(-1, D, D)
    if not np.array_equal(P, np.swapaxes(P, 1, 2)):
        return sums, False
    iu = np.triu_indices(D)
    return np.concatenate([sums[:, :D], P[:, iu[0], iu[1]]], axis=1), True


def _unpack(family, packed):
    """The full statistics of :func:`_pack`'s packed ones (the triangle mirrored)."""
    D = _square(family)
    iu = np.triu_indices(D) if D is not None else None
    if D is None or packed.ndim != 2 or packed.shape[1] != D + len(iu[0]):
        raise ValueError("a row contribution's packed statistics do not fit the model's blocks")
    P = np.empty((len(packed), D, D))
    P[:, iu[0], iu[1]] = packed[:, D:]
    P[:, iu[1], iu[0]] = packed[:, D:]
    return np.concatenate([packed[:, :D], P.reshape(len(packed), D * D)], axis=1)


def _running(model, x, sw) -> dict:
    """The batch's part of the model's running values: ``model.begin_batch`` on fresh ones (they
    add: the applier adds them to its own, which is what ``begin_batch`` does to the state's)."""
    fresh = model.init_row_values()
    if not fresh:
        return {}
    if any(v != 0 for v in fresh.values()):
        raise ValueError(f"model {model.name!r}: running values {sorted(fresh)} do not start at 0, so a "
                         "batch's part cannot be split off")
    model.begin_batch(x, fresh, sw.inv)
    return {k: fresh[k] for k in model.init_row_values()}


SPLITTERS["rows"] = RowsSplitter()
