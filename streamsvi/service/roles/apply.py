"""The applier's natural-gradient step on a delta: λ ← (1 − ρ)λ + ρ(η + delta).

The same step as :meth:`streamsvi.inference.SVI.update`, with the target
λ̂ = η + (N/|S|) Σ_n w_n E_q[t(θ_n)] computed by a worker (its delta) rather
than here, and the same fraction-to-boundary rule (:meth:`SVI.step_towards`,
the engine's own step).
"""
from __future__ import annotations

from dataclasses import dataclass


from ...inference.engine import EngineState
from ...models.base import NatParams


@dataclass(frozen=True)
class Applied:
    """What one applied delta did."""

    step: int
    rho: float
    records: int
    domain_clipped: int


def apply_delta(engine, state: EngineState, stats: NatParams, records: int, min_weight: float,
                rho_scale: float = 1.0) -> tuple[EngineState, Applied]:
    """One step of ``engine``'s schedule towards η + ``stats``; returns the new state.

    ``rho_scale`` ≤ 1 shortens the step (the staleness down-weighting of the
    applier). Raises ``FloatingPointError`` (state unchanged) if λ would
    become non-finite.
    """
    model, lam = engine.model, state.lam
    prior = model.prior()
    if set(stats) != set(prior):
        raise ValueError(f"delta parameters {sorted(stats)} do not match the model's {sorted(prior)}")
    target = prior + NatParams({k: stats[k] for k in prior})     # in the model's order
    t = state.step + 1
    rho = float(engine.schedule(t)) * float(rho_scale)
    new_lam, clipped, _ = engine.step_towards(lam, target, rho, min_weight)
    if not new_lam.all_finite():
        raise FloatingPointError(f"delta step {t} would make λ non-finite; state left unchanged")
    new = EngineState(step=t, lam=new_lam, rng_state=state.rng_state,
                      records_seen=state.records_seen + int(records), aux=state.aux)
    return new, Applied(step=t, rho=rho, records=int(records), domain_clipped=clipped)
