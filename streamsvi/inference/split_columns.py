"""The scaled-columns update (LDA) split in two, for scale-out: sparse column contributions.

:mod:`.split` is the contract; this is the splitter of the ``columns`` storage
(:mod:`.storage_columns`). The engine's update is already two halves
(:meth:`SVI.columns_batch` and :meth:`SVI.columns_step`); a worker runs the first at
the λ version it holds, the applier the second at its own λ, so the step lives once.

What a contribution holds (plain arrays and JSON numbers, no pickle):

* ``cols`` (int64, |u|): the batch's sorted column (word) ids;
* ``stats`` (float64, K × |u|): the weighted statistics Σ_d w_d n_dw φ_dwk over
  those columns only. The delta grows with K·|u|, never with K·V: at K = 100 and a
  batch of 256 documents of a Zipf corpus (|u| ≈ 10⁴ of V = 10⁵ words) it is 8.1 MiB
  instead of the 76 MiB of a dense λ̂ − η; on NYT (V = 3,012) a batch holds nearly
  every word and there is no saving (docs/design.md §6.7);
* ``meta``: ``scale`` N/|S| (the worker's N, as the dense splitter's λ̂ − η has it),
  ``temperature`` T_t and ``restart_weight`` ρ^a_t, and for a restart ``restart_draws``
  and ``mean_length`` (below); ``local_elbo`` Σ_d L_d when T_t = 1 (so the applier
  reports the ELBO without a second local step); the SVI+ ``min_weight`` travels
  as the contribution's own field.

Annealing levels are the worker's: T_t, ρ^a_t (and M_t) at t = version + 1, where the
local step ran. The tempered local step and the tempered target belong together, so
the applier does not re-evaluate them at its own t; ρ_t (the schedule) is the
applier's, times the staleness factor, as for the dense splitter. At the same state
the two t are equal, so ``apply(contribution(state, x)) == update(state, x)``.

Stochastic annealing is supported, not refused: while ρ^a_t > 0 the target mixes in
η_t, a dense K × V Dirichlet draw (``model.random_topics``). Sending η_t would make the
delta dense; instead the worker sends what η_t is drawn from, the batch's random stream
after the SVI+ weights (a PCG64 state, JSON integers) and c, the batch's mean document
length, and the applier draws the same η_t (bit for bit) in :meth:`SVI.columns_step`.
The applier's step is then dense (as the one-process step is while ρ^a_t > 0: the
storage's dense fallback), so a restart phase costs the applier O(K·V) per delta.

Compact (:func:`.split.compact`, ``scaleout.compact_below``): ``stats`` is replaced by
``kept`` (uint8, a bitmap of the K × |u| entries kept, row-major) and ``values``
(float32, those entries); entries below the threshold rounded at random, unbiased. On
NYT at K = 100 a batch of 1,024 documents' 2.4 MB became about 0.7 MB (about half
the entries at least 0.01 tokens, ``bench/scaleout.py --model lda``).

Agreement: bit for bit (exact contributions). The applier reads λ's columns itself (``lam_columns``), the
same values the worker's local step read at the same λ. An applied state's μ is
written in place: the state passed to :func:`apply` must not be used afterwards
(the applier replaces its state with the returned one; a worker never steps λ).
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .engine import ColumnStats
from .split import SPLITTERS, Applied, Contribution, Splitter


class ColumnsSplitter(Splitter):
    """λ in scaled columns (LDA): the contribution is the batch's columns and their statistics."""

    agreement = "exact"

    def contribution(self, engine, state, x, rng_state):
        # no prepare here: the local step reads a plain λ and its scaled copy to the same bits,
        # and a worker's λ is never stepped (no copy per batch)
        b = engine.columns_batch(replace(state, rng_state=rng_state), x, elbo=False)
        c = b.stats
        meta = {"scale": c.scale, "temperature": c.temperature, "restart_weight": c.restart_weight}
        if c.temperature == 1.0:
            meta["local_elbo"] = float(np.sum(engine.model.local_elbo(b.local)))
        if c.restart_weight > 0:
            meta["restart_draws"] = c.restart_draws
            meta["mean_length"] = c.mean_length
        return Contribution(arrays={"cols": c.cols, "stats": np.ascontiguousarray(c.Sw)},
                            records=int(c.records), min_weight=c.min_weight, meta=meta)

    def compact(self, c, below, rng):
        """The statistics as a bitmap of the entries kept and their float32 values, those below
        ``below`` rounded at random to 0 or ``below`` (:func:`.split.compact`)."""
        Sw = np.asarray(c.arrays["stats"], dtype=np.float64)
        small = Sw < below
        up = rng.random(Sw.shape) * below < Sw          # P = x / below; never for x = 0
        kept = ~small | up
        values = np.where(small, below, Sw)[kept].astype(np.float32)
        arrays = {"cols": c.arrays["cols"], "kept": np.packbits(kept, axis=None), "values": values}
        return replace(c, arrays=arrays, meta={**c.meta, "compact_below": below})

    @staticmethod
    def _expand(arrays, K):
        """The dense K × |cols| statistics of a compact contribution (:meth:`compact`)."""
        cols, kept, values = np.asarray(arrays["cols"]), np.asarray(arrays["kept"]), np.asarray(arrays["values"])
        n = K * cols.size
        if kept.dtype != np.uint8 or kept.ndim != 1 or kept.size != -(-n // 8):
            raise ValueError(f"compact columns delta: the bitmap holds {kept.size} bytes, not "
                             f"{-(-n // 8)} for K = {K} topics over |cols| = {cols.size} columns")
        mask = np.unpackbits(kept, count=n).astype(bool)
        if values.ndim != 1 or values.size != int(mask.sum()):
            raise ValueError(f"compact columns delta: {values.size} values for {int(mask.sum())} entries kept")
        Sw = np.zeros(n)
        Sw[mask] = values
        return Sw.reshape(K, cols.size)

    def apply(self, engine, state, c, rho_scale=1.0, metrics=True):
        K, V = int(engine.model.n_components), int(engine.model.n_features)
        try:
            cols = np.asarray(c.arrays["cols"])
            if "kept" in c.arrays:
                Sw = self._expand(c.arrays, K)
            else:
                Sw = np.asarray(c.arrays["stats"], dtype=np.float64)
            m = c.meta
            stats = ColumnStats(cols=cols, Sw=Sw, records=int(c.records), scale=float(m["scale"]),
                                min_weight=float(c.min_weight), temperature=float(m["temperature"]),
                                restart_weight=float(m["restart_weight"]),
                                restart_draws=m.get("restart_draws"), mean_length=m.get("mean_length"))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a columns delta (cols, stats and meta scale, temperature, "
                             f"restart_weight): {type(exc).__name__}: {exc}") from None
        u = cols.size
        if cols.dtype.kind not in "iu" or cols.ndim != 1 or Sw.shape != (K, u):
            raise ValueError(f"columns delta: cols {cols.dtype} {cols.shape} and stats {Sw.shape} "
                             f"do not fit K = {K} topics over |cols| = {u} columns")
        if u and (cols[0] < 0 or cols[-1] >= V or (u > 1 and not (np.diff(cols) > 0).all())):
            raise ValueError(f"columns delta: cols must be sorted distinct ids in [0, {V})")
        if not (math.isfinite(stats.scale) and stats.scale > 0 and stats.temperature > 0):
            raise ValueError(f"columns delta: scale {stats.scale} and temperature "
                             f"{stats.temperature} must be finite and > 0")
        t = state.step + 1
        rho = float(engine.schedule(t)) * float(rho_scale)
        new, out = engine.columns_step(state, stats, rho, metrics=metrics)
        elbo = None
        if metrics and "local_elbo" in m:
            elbo = float(out["global_elbo"]) + stats.scale * float(m["local_elbo"])
        # the applier's random stream stays its own (a restart drew from the worker's)
        return replace(new, rng_state=state.rng_state), Applied(
            step=t, rho=rho, records=int(c.records), domain_clipped=int(out["domain_clipped"]),
            elbo=elbo)


SPLITTERS["columns"] = ColumnsSplitter()
