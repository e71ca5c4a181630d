"""The gradient path's update split in two (logistic and softmax regression scale out).

:meth:`GradientVI.update <streamsvi.inference.gradients.GradientVI.update>` is
``gradient`` (the data) then ``step_with`` (the optimiser). Scale-out cuts
between them (the contract is :mod:`.split`'s):

* :meth:`GradientSplitter.contribution` (a worker, at the λ version it holds):
  ĝ, the minibatch's stochastic ELBO gradient (``GradientVI.gradient``, the
  estimator's draws from the batch's stream ``rng_state``), one float64 array
  per λ entry (``mean``, ``log_std``, and ``coupling`` or ``factor`` for a
  full or low-rank covariance); ``records`` = |S|; ``meta``: the stochastic
  ELBO value L_t at the worker's λ, the gradient-variance estimate
  N² tr(Σ̂)/|S| (None below two records) and ‖ĝ‖, for the applier's metrics.
* :meth:`GradientSplitter.apply` (the applier, at its current λ):
  ``GradientVI.step_with`` at step t = ``state.step + 1`` with
  ρ = ρ_t · ``rho_scale`` from the applier's schedule. Adam's moments
  (``aux["adam_m"]``, ``aux["adam_v"]``) live in the applier's state only: they
  are part of the single writer's optimiser, start from the λ_0 proposal (zero),
  are saved in its snapshots and taken over with them; workers never use them.

At the same state ``apply(contribution(state, x))`` is ``update(state, x)`` with
the same draws, bit for bit (``agreement = "exact"``): both run the same two
methods on the same bytes (float64 arrays travel unchanged, JSON floats
round-trip exactly).

Staleness. A worker's ĝ is the gradient at the λ it read, ``staleness`` versions
behind the applier's (asynchronous SGD). The applier's policy
(``scaleout.stale_policy``) applies unchanged: beyond the bound, "downweight"
multiplies ρ_t by bound/staleness, "drop" skips the gradient. For Adam the
factor shortens the step (the update of λ), not the moments: a stale ĝ enters
m and v as any other.

The default bound for this storage is :data:`MAX_STALENESS` = 4 versions (the
statistic deltas of a dense λ keep 16), used when ``scaleout.max_staleness`` is
not set. Why smaller: a dense delta is a target λ̂ that depends on λ only through
the local step (not at all for a model without local variables), so a stale one
is still a sensible target; a gradient is evaluated *at* the stale λ. Near the
optimum the natural step (a Newton step, ρ_t ≤ 1) on an error e is the delayed
recurrence e ← e − ρ e_{−τ}, stable iff ρ < 2 sin(π / (4τ + 2)) (Levin & May
1976), about π / (2τ); Adam adds its own delay (its momentum averages the last
~1/(1 − β₁) = 10 gradients, and asynchrony acts as more momentum: Mitliagkas et
al. 2016, "Asynchrony begets momentum"). Under "downweight" a delta τ > bound
versions old steps ρ_t · bound/τ (the staleness-aware rule η/τ of Zhang et al.
2016), so every staleness is stable once ρ_t < 2 sin(π / (4·bound + 2)): from
step 4 with bound 4 under the default schedule (1 + t)^−0.7, from step 28 with
16. A bound below a few workers' usual lag (the other workers' deltas in flight)
would shorten nearly every step, so not lower than 4.

Measured (logistic regression, D = 3, 6 000 records already on the topic, batches
of 100, 3 workers, one run each): staleness 0 to 22 (one worker: up to 31, the
applier reading many deltas per poll before it publishes), more than 4 for about
half the deltas. Held-out log-likelihood per record, natural / adam: −0.3755 /
−0.3754 with bound 4, −0.417 / −0.381 with 16, −0.377 / −0.397 with 1000 (the
true weights: −0.374).
"""
from __future__ import annotations

import math

import numpy as np

from ..models.base import NatParams
from .engine import EngineState
from .split import SPLITTERS, Applied, Contribution, Splitter

__all__ = ["GradientSplitter", "MAX_STALENESS"]

#: The staleness bound of gradient contributions when ``scaleout.max_staleness`` is unset (module docs).
MAX_STALENESS = 4


class GradientSplitter(Splitter):
    """λ is q's Gaussian parameters, moved by an optimiser: the contribution is ĝ (module docs)."""

    agreement = "exact"
    max_staleness = MAX_STALENESS

    def contribution(self, engine, state: EngineState, x, rng_state: dict) -> Contribution:
        if x is not None:
            x = engine.model.check_batch(x)
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = rng_state
        g, est, elbo = engine.gradient(state.lam, x, rng)
        gv = engine.gradient_variance(est, x)
        meta = {"elbo": float(elbo), "grad_variance": float(gv) if math.isfinite(gv) else None,
                "grad_norm": math.sqrt(g.sqnorm())}
        return Contribution(arrays=NatParams({k: np.asarray(v, dtype=np.float64) for k, v in g.items()}),
                            records=0 if x is None else int(x.shape[0]), meta=meta)

    def apply(self, engine, state: EngineState, c: Contribution, rho_scale: float = 1.0,
              metrics: bool = True):
        lam = state.lam
        if set(c.arrays) != set(lam):
            raise ValueError(f"gradient delta parameters {sorted(c.arrays)} do not match the state's "
                             f"{sorted(lam)} (a different covariance setting?)")
        g = {}
        for k in lam:                                            # in λ's order
            a = np.asarray(c.arrays[k])
            if a.shape != np.shape(lam[k]) or a.dtype != np.float64:
                raise ValueError(f"gradient delta {k!r}: {a.dtype} {a.shape}, the state's is float64 "
                                 f"{np.shape(lam[k])}")
            g[k] = a
        if engine.optimizer == "adam" and not (state.aux and "adam_m" in state.aux):
            raise ValueError("optimizer = 'adam' but the applier's state has no Adam moments "
                             "(a state started with another optimizer?)")
        t = state.step + 1
        rho = float(engine.schedule(t)) * float(rho_scale)
        try:
            new_lam, aux = engine.step_with(lam, state.aux, NatParams(g), t, rho)
        except FloatingPointError:
            raise FloatingPointError(f"gradient delta step {t} would make q non-finite; state left "
                                     f"unchanged (lower learning_rate)") from None
        new = EngineState(step=t, lam=new_lam, rng_state=state.rng_state,
                          records_seen=state.records_seen + int(c.records), aux=aux)
        elbo = c.meta.get("elbo")
        return new, Applied(step=t, rho=rho, records=int(c.records), domain_clipped=0,
                            elbo=None if elbo is None else float(elbo))


SPLITTERS["gradient"] = GradientSplitter()
