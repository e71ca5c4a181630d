"""Scaled-columns storage: one (K, V) Dirichlet block written only in the columns a batch holds.

The engine's step on one block of K Dirichlet rows over V columns (LDA's topics
over its vocabulary; Hoffman, Blei & Bach 2010 §3.3 and Mimno, Hoffman & Blei
2012 keep λ this way) is

    λ'_kw = (1 − ρ_k) λ_kw + ρ_k λ̂_kw,   λ̂_kw = e + (N/|S|) Σ_d w_d S_dkw  (w in the batch)
                                          λ̂_kw = e                          (w not in it)

with e the prior η (tempered under deterministic annealing, e = 1 + (η − 1)/T_t).
A column the batch does not hold only moves towards a per-row constant:
λ'_kw − e = (1 − ρ_k)(λ_kw − e). So the storage keeps

    λ_kw = s_k · μ_kw + c_k

and a step folds (1 − ρ_k) into s_k and c_k, c'_k = (1 − ρ_k) c_k + ρ_k e, and
writes μ only in the batch's columns, μ'_kw = (λ'_kw − c'_k)/s'_k. Every value
it writes equals the dense update's to rounding.

Spec (what this storage owns; the model owns the local step, the statistics
over the batch's columns, the ELBO terms and reading λ in either form):

* **Layout.** One ``NatParams`` over one buffer, the names every snapshot since
  the sparse step was introduced holds: ``word_topic`` μᵀ (V, K), word-major so
  that a batch's columns are contiguous rows; ``topic_scale`` s (K,);
  ``topic_offset`` c (K,); ``topic_stored_sum`` R_k = Σ_w μ_kw (K,). Beside it in
  ``state.aux``: ``stored_sqsum`` Q_k = Σ_w μ_kw², ``global_elbo`` and
  ``global_elbo_step`` (the last dense global ELBO term and the step of the λ it
  was computed at). The plain form ``NatParams(topic_word=λ)`` (snapshots of
  releases before the sparse step, and the result of a dense step) is converted
  with one transposing copy by the first sparse step (:meth:`ScaledColumns.scaled`).
* **Lazy scale.** Row sums Σ_w λ_kw = s_k R_k + V c_k cost O(K) (the model reads them
  for E[log β]). A row whose scale falls below ``_RESCALE_BELOW`` is folded back,
  μ_k ← s_k μ_k + c_k, s_k = 1, c_k = 0 (a pass over one row).
* **In place.** μ is written in place; the λ returned is a new ``NatParams``
  object over the same buffer (the model caches by identity), and the state
  passed in must not be used afterwards. Nothing is written when the update
  would make λ non-finite (``FloatingPointError``).
* **Fraction to boundary.** With a negative SVI+ weight, the membership test at
  ρ/τ runs on the batch's columns; when ρ/τ > 1 an untouched λ_kw moving towards
  e can cross 0 beyond s = 1, and only the largest untouched λ_kw of a row can
  do so first, so it joins the per-row limit. Each row takes
  ρ_k = min(ρ, τ · s_max,k) when the test fails (one block per row, as
  ``LDA.max_step`` declares).
* **Dense fallbacks.** A step with some ρ_k ≥ 1 (batch VI forgets λ) and a step of
  the stochastic annealer while ρ^a_t > 0 (η_t, a fresh random λ, is dense) are
  done densely on λ itself and return the plain form; the next sparse step
  converts it back.
* **Metrics.** ‖ĝ‖ = ‖λ̂ − λ‖ is exact: the batch's columns directly, the others
  from s, c, R, Q: Σ_w (λ_kw − e)² = s²Q + 2s(c − e)R + V(c − e)², less the batch's
  columns. The global ELBO term −Σ_k KL(q(β_k) ‖ p(β_k)) is a dense pass, so it is
  recomputed at step 1, at every dense step, when aux has none, and every
  max(1, round(K·V / ``_ELBO_ELEMENTS``)) steps; in between it is reused. The
  gradient-variance estimate is the engine's (one formula for every path).

The block API (:mod:`streamsvi.models.blocks`, :mod:`streamsvi.inference.blocks`):
the block's family is the model's one ``param_blocks`` entry, a
:class:`~streamsvi.models.blocks.Dirichlet` (its tempering and its step limit
are the ones used here, on the batch's columns), and the fold of (1 − ρ_k)
into s, c and the touched columns is
:func:`~streamsvi.inference.blocks.scaled_columns_step`; this class adds what
the storage needs around it (layout, conversion, the untouched columns' limit,
the dense fallbacks, running sums, the metrics' cadence).

The engine calls :meth:`ScaledColumns.init` for a fresh state, :meth:`ScaledColumns.prepare`
and :meth:`ScaledColumns.step` for each update (``SVI.update``, docs/design.md §5.3a), in
one place, ``SVI.columns_step``, which the scale-out applier calls too
(:mod:`.split_columns`: the step from a worker's statistics over the batch's columns).
The model declares ``global_storage = "scaled_columns"`` and ``param_blocks``
(one Dirichlet block) and provides:
``n_components``/``n_features`` (K, V), ``column_prior`` (η, a number),
``init_topics(rng, x, n_total)`` (the K initial rows, one at a time),
``column_suffstats(local, weights)`` → (cols, weighted (K, |cols|),
unweighted (K, |cols|)), ``local.lam_cols`` (λ in the batch's columns, word-major,
as the local step read them, or None), ``lam_columns(lam, cols)``,
``lam_matrix(lam)``, ``is_scaled(lam)``, ``global_elbo(lam)``, ``random_init`` and, for
η_t of a stochastic restart drawn from a number rather than the batch (so an applier can
draw it), ``mean_doc_length(x)`` and ``random_topics(rng, mean_length, n_total)``.
"""
from __future__ import annotations

import math

import numpy as np

from ..models.base import NatParams
from ..models.blocks import Dirichlet
from .blocks import scaled_columns_step

#: A row's scale is folded into its stored values when it falls below this.
_RESCALE_BELOW = 1e-100
#: The global ELBO term is recomputed every max(1, round(K·V / this)) updates (module docs).
_ELBO_ELEMENTS = 2 ** 16
#: Dense passes go through column blocks of about this many elements.
_CHUNK = 2 ** 20


class ScaledColumns:
    """The scaled-columns storage of ``model``'s one (K, V) Dirichlet block (module docs)."""

    name = "scaled_columns"

    def __init__(self, model):
        self.model = model
        self.K, self.V = int(model.n_components), int(model.n_features)
        (block,) = model.param_blocks
        if not isinstance(block.family, Dirichlet):
            raise ValueError(f"the scaled-columns storage holds one Dirichlet block; model "
                             f"{model.name!r} declares {type(block.family).__name__}")
        self.family = block.family                    # its domain, step limit and tempering
        self._entry = Dirichlet(per="entry")          # the same family, one limit per value

    # ------------------------------------------------------------------ form
    def _chunks(self):
        step = max(1, _CHUNK // self.K)
        return [(lo, min(self.V, lo + step)) for lo in range(0, self.V, step)]

    def _buffer(self):
        K, V = self.K, self.V
        n = K * V
        layout = (("word_topic", (V, K), 0, n), ("topic_scale", (K,), n, n + K),
                  ("topic_offset", (K,), n + K, n + 2 * K),
                  ("topic_stored_sum", (K,), n + 2 * K, n + 3 * K))
        flat = np.empty(n + 3 * K)
        flat[n:n + K] = 1.0
        flat[n + K:n + 2 * K] = 0.0
        return layout, flat, flat[:n].reshape(V, K), flat[n + 2 * K:]

    def scaled(self, L: np.ndarray) -> NatParams:
        """The plain λ = L (K, V) in the scaled form: μᵀ = Lᵀ, s = 1, c = 0 (one copy)."""
        layout, flat, muT, sums = self._buffer()
        for lo, hi in self._chunks():
            muT[lo:hi] = L[:, lo:hi].T
        sums[:] = L.sum(axis=1)
        return NatParams._wrap(layout, flat)

    @staticmethod
    def fresh_aux(lam: NatParams, elbo=None, elbo_step=-1) -> dict:
        mu = lam["word_topic"]
        return {"stored_sqsum": np.einsum("ij,ij->j", mu, mu), "global_elbo": elbo,
                "global_elbo_step": int(elbo_step)}

    def init(self, rng, x, n_total):
        """(λ, aux) of a fresh state: the model's initial rows (``init_topics``, the same
        values and draws as its ``init_params``) written straight into the scaled form,
        so no K × V temporary is made."""
        layout, flat, muT, sums = self._buffer()
        for k, row in enumerate(self.model.init_topics(rng, x, n_total)):
            muT[:, k] = row
            sums[k] = row.sum()
        lam = NatParams._wrap(layout, flat)
        return lam, self.fresh_aux(lam)

    def _rescale(self, lam: NatParams, rows) -> None:
        """Fold s_k, c_k into the stored rows ``rows`` in place (μ_k ← s_k μ_k + c_k)."""
        mu, s, c, R = lam["word_topic"], lam["topic_scale"], lam["topic_offset"], lam["topic_stored_sum"]
        for k in rows:
            col = mu[:, k]
            col *= s[k]
            col += c[k]
            s[k], c[k] = 1.0, 0.0
            R[k] = col.sum()

    def prepare(self, lam: NatParams, aux, dense: bool):
        """(λ, aux) ready for a step: a sparse step converts a plain λ (once) and makes
        aux's sums; a dense step takes either form as it is."""
        if dense:
            return lam, (aux if aux is not None else {})
        if not self.model.is_scaled(lam):
            lam = self.scaled(lam["topic_word"])
            aux = None
        if aux is None or aux.get("stored_sqsum") is None:
            aux = self.fresh_aux(lam)
        return lam, aux

    # ------------------------------------------------------------------ step
    def step(self, lam: NatParams, aux: dict, local, cols, Sw: np.ndarray, *, scale: float,
             rho: float, tau: float, min_weight: float, step: int, temperature: float = 1.0,
             restart_weight: float = 0.0, restart=None, metrics: bool = True,
             dirichlet_shift: float = 0.0) -> dict:
        """One natural-gradient step of the block over the batch's columns (module docs).

        ``lam``/``aux`` as returned by :meth:`prepare`; ``local`` the batch's local
        factors (their ``lam_cols`` are reused) or None (a scale-out applier: λ's
        columns are read here, at the λ being stepped); ``cols`` the batch's sorted
        column ids and ``Sw`` (K, |cols|) its weighted statistics Σ_d w_d S_dkw;
        ``scale`` N/|S|; ``rho`` ρ_t; ``tau`` the boundary fraction; ``min_weight`` the
        smallest SVI+ weight; ``temperature`` T_t; ``dirichlet_shift`` s subtracted from the
        tempered target (the annealer's ``dirichlet_shift(T_t)``: 1 − 1/T_t for α/T tempering,
        else 0); ``restart`` η_t (K, V) when
        ``restart_weight`` ρ^a_t > 0. Returns ``lam``, ``aux``, ``global_elbo`` (the
        term at the λ before the step), ``grad_norm``, ``domain_clipped`` and
        ``domain_blocks``. ``metrics=False`` (a scale-out worker following λ) skips the
        global ELBO term and the gradient norm (NaN, or the last computed term): the
        same λ, without the two reductions over K × V a follower never reads.
        """
        model = self.model
        K, V = self.K, self.V
        eta = float(model.column_prior)
        T, rho_a = float(temperature), float(restart_weight)
        dense_restart = rho_a > 0.0
        SwT = Sw.T                                     # word-major (|u|, K)
        lam_u = None if local is None else local.lam_cols   # λ there as the local step read it
        if lam_u is None or lam_u.shape[0] != cols.size:
            lam_u = model.lam_columns(lam, cols)
        tgt_u = SwT * scale
        tgt_u += eta
        e = eta                                        # the target of a column the batch does not hold
        if T != 1.0:
            (tgt_u,) = self.family.temper((tgt_u,), T)
            e = float(self.family.temper((np.float64(eta),), T)[0])
            if dirichlet_shift:                        # α/T = [1 + (α − 1)/T] − (1 − 1/T)
                tgt_u -= dirichlet_shift
                e -= dirichlet_shift
        if dense_restart:                              # λ̂ is dense: (1 − ρ^a) λ̂ + ρ^a η_t
            L = model.lam_matrix(lam)                  # (a plain λ itself: not copied)
            tgt = self._dense_target(cols, Sw, scale, eta, T, dirichlet_shift)
            tgt *= 1.0 - rho_a
            tgt += restart * rho_a
        else:
            mu, s, c, R = lam["word_topic"], lam["topic_scale"], lam["topic_offset"], lam["topic_stored_sum"]

        # fraction to boundary: membership test at ρ/τ first, per-row limits if it fails
        rho_k = np.full(K, rho)
        clipped = blocks = 0
        if min_weight < 0:
            r = rho / tau
            if dense_restart:
                lim = self.family.max_step((L,), (tgt,))
            else:                                      # per topic: the columns are word-major
                lim = self.family.max_step((lam_u.T,), (tgt_u.T,))
            if not dense_restart and r > 1.0 and cols.size < V:
                # an untouched λ_kw moves towards e; beyond s = 1 it can cross 0 (at s = λ/(λ − e))
                keep = np.ones(V, dtype=bool)
                keep[cols] = False
                top = np.max(mu, axis=0, where=keep[:, None], initial=-np.inf) * s + c
                lim = np.minimum(lim, self._entry.max_step((top,), (np.full(K, e),)))
            if (lim <= r).any():
                rho_k = np.minimum(rho, tau * lim)
                clipped, blocks = int(np.count_nonzero(rho_k < rho)), K

        # metrics at the λ before the step
        every = max(1, round(K * V / _ELBO_ELEMENTS))
        dense_step = dense_restart or bool((rho_k >= 1.0).any())
        if not metrics:
            G, G_step = aux.get("global_elbo"), aux.get("global_elbo_step")   # (None before a first)
        elif dense_step or step == 1 or step % every == 0 or aux.get("global_elbo") is None:
            G, G_step = model.global_elbo(lam), step - 1
        else:
            G, G_step = float(aux["global_elbo"]), int(aux["global_elbo_step"])
        Q = None if dense_restart else aux["stored_sqsum"]
        if not metrics:
            g2 = math.nan
        elif dense_restart:
            g2 = float(np.sum(np.square(tgt - L)))
        else:
            d = c - e                                  # Σ_w (λ_kw − e)² = s²Q + 2s(c−e)R + V(c−e)²
            full_sq = s * s * Q + 2.0 * s * d * R + V * d * d
            # Σ_{w∈u} (λ_kw − e)², and ‖λ̂ − λ‖² on the batch's columns, without temporaries
            ll = np.einsum("ij,ij->j", lam_u, lam_u)
            lsum = lam_u.sum(axis=0)
            touched = ll - 2.0 * e * lsum + cols.size * e * e
            untouched = np.maximum(full_sq - touched, 0.0)
            g2 = max(0.0, float(np.einsum("ij,ij->", tgt_u, tgt_u)
                                - 2.0 * np.einsum("ij,ij->", tgt_u, lam_u) + ll.sum())) \
                + float(untouched.sum())
        out = {"global_elbo": G, "grad_norm": math.sqrt(g2), "domain_clipped": clipped,
               "domain_blocks": blocks}

        if dense_step:                                 # ρ_k ≥ 1 or a restart: the plain form, densely
            if not dense_restart:
                tgt = self._dense_target(cols, Sw, scale, eta, T, dirichlet_shift)
            if (rho_k == 1.0).all():
                new = NatParams(topic_word=tgt)
            else:
                L = model.lam_matrix(lam) if not dense_restart else L
                new = NatParams(topic_word=(1.0 - rho_k)[:, None] * L + rho_k[:, None] * tgt)
            if not new.all_finite():
                raise FloatingPointError(f"update {step} would make λ non-finite; state left unchanged")
            out.update(lam=new, aux={"global_elbo": G, "global_elbo_step": G_step})
            return out

        mu_u, s_new, c_new = scaled_columns_step(mu, s, c, cols, lam_u, tgt_u, rho_k, e)
        if not (np.isfinite(mu_u).all() and np.isfinite(s_new).all() and np.isfinite(c_new).all()
                and (s_new > 0).all()):
            raise FloatingPointError(f"update {step} would make λ non-finite; state left unchanged")
        old_u = mu[cols]
        R_new = R + (mu_u.sum(axis=0) - old_u.sum(axis=0))
        Q_new = Q + (np.einsum("ij,ij->j", mu_u, mu_u) - np.einsum("ij,ij->j", old_u, old_u))
        mu[cols] = mu_u                                # in place: only the batch's columns
        s[:], c[:], R[:] = s_new, c_new, R_new
        small = np.flatnonzero(s_new < _RESCALE_BELOW)
        if small.size:
            self._rescale(lam, small)
            Q_new = Q_new.copy()
            for k in small:
                Q_new[k] = float(np.dot(mu[:, k], mu[:, k]))
        new_lam = NatParams._wrap(lam._layout, lam._flat)   # a new λ object over the same storage
        out.update(lam=new_lam, aux={"stored_sqsum": Q_new, "global_elbo": G, "global_elbo_step": G_step})
        return out

    def _dense_target(self, cols, Sw, scale, eta, T, dirichlet_shift=0.0) -> np.ndarray:
        """λ̂ (K, V): η + scale·Sw in the batch's columns, η elsewhere; tempered when T ≠ 1."""
        if cols.size == self.V:
            tgt = Sw * scale
        else:
            tgt = np.zeros((self.K, self.V))
            tgt[:, cols] = Sw
            tgt *= scale
        tgt += eta
        if T != 1.0:
            (tgt,) = self.family.temper((tgt,), T)
            if dirichlet_shift:
                tgt -= dirichlet_shift
        return tgt
