"""One update split in two, for scale-out: a worker's contribution and the applier's step.

:meth:`SVI.update` reads a minibatch and moves λ. Scale-out cuts it at the
point where the data has been used and λ has not moved yet:

* :func:`contribution` (a worker, at the λ version it holds): the local step
  and everything computed from the records (statistics, a gradient), with the
  random draws of the update (SVI+ weights, η_t) from the stream ``rng``;
* :func:`apply` (the applier, at its current λ): the storage's one step
  (:mod:`.blocks`, :mod:`.storage_columns`, the gradient optimiser) from that
  contribution, with ρ from the applier's own schedule times ``rho_scale`` (the
  staleness down-weighting).

Contract, tested for every model family by its check case
(``tests/models/test_checks.py``): ``apply(state, contribution(state, x))`` at
the same state is :meth:`SVI.update`'s λ, bit for bit or to rounding (the
family's splitter says which), so one process and N workers run the same step.

A contribution is plain arrays (float64, float32, int64 or uint8) and JSON values, so it
travels on the deltas topic without pickle (:mod:`streamsvi.service.roles.transport`).
How λ is stored decides what the contribution holds; each storage has its own
splitter, registered in :data:`SPLITTERS` by :func:`storage_kind`:

* ``dense`` (this module): the scaled statistics λ̂ − η (``Target.target − η``);
* ``columns`` (LDA), ``rows`` (PMF, Poisson factorisation), ``gradient``
  (the gradient path): their own modules, when present.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from ..models.base import NatParams
from .engine import EngineState, owns_its_step


@dataclass
class Contribution:
    """What a worker sends for one minibatch (module docs).

    ``arrays``: name -> float64 or int64 array (the statistics); ``meta``: JSON
    values the splitter needs besides them; ``records``: records that reached
    the model; ``min_weight``: the smallest SVI+ weight (1.0 without SVI+).
    """

    arrays: dict
    records: int
    min_weight: float = 1.0
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Applied:
    """What one applied contribution did."""

    step: int
    rho: float
    records: int
    domain_clipped: int
    elbo: float | None = None


class Splitter:
    """How one storage splits its update (module docs). Subclasses fill both halves."""

    #: "exact": apply(contribution) at the same state is update(), bit for bit; "rounding": to rounding.
    agreement = "exact"

    def compact(self, c: Contribution, below: float, rng: np.random.Generator) -> Contribution:
        """``c`` in fewer bytes, an unbiased estimate of it (:func:`compact`); the default
        keeps it as it is (a storage whose statistics have no small entries to drop)."""
        return c

    def contribution(self, engine, state: EngineState, x, rng_state: dict) -> Contribution:
        raise NotImplementedError

    def apply(self, engine, state: EngineState, c: Contribution, rho_scale: float = 1.0,
              metrics: bool = True):
        """``(new state, Applied)``; ``metrics=False`` may skip what only the applier's metrics
        read (the same λ: a worker replaying the applier's steps)."""
        raise NotImplementedError


class DenseSplitter(Splitter):
    """λ is one dense NatParams: the contribution is λ̂ − η, the step :meth:`SVI.step_towards`."""

    def contribution(self, engine, state, x, rng_state):
        at = EngineState(step=state.step, lam=state.lam, rng_state=rng_state,
                         records_seen=state.records_seen, aux=state.aux)
        tg = engine.stochastic_target(at, x)
        stats = tg.target - engine.model.prior()
        return Contribution(arrays=stats, records=int(tg.x.shape[0]),
                            min_weight=1.0 if tg.weights is None else float(tg.weights.min()))

    def apply(self, engine, state, c, rho_scale=1.0, metrics=True):
        prior = engine.model.prior()
        if set(c.arrays) != set(prior):
            raise ValueError(f"delta parameters {sorted(c.arrays)} do not match the model's {sorted(prior)}")
        target = prior + NatParams({k: c.arrays[k] for k in prior})     # in the model's order
        t = state.step + 1
        rho = float(engine.schedule(t)) * float(rho_scale)
        new_lam, clipped, _ = engine.step_towards(state.lam, target, rho, c.min_weight)
        if not new_lam.all_finite():
            raise FloatingPointError(f"delta step {t} would make λ non-finite; state left unchanged")
        new = EngineState(step=t, lam=new_lam, rng_state=state.rng_state,
                          records_seen=state.records_seen + int(c.records), aux=state.aux)
        return new, Applied(step=t, rho=rho, records=int(c.records), domain_clipped=clipped)


#: storage kind -> its splitter. A storage without one cannot scale out (``why_not``).
SPLITTERS: dict[str, Splitter] = {"dense": DenseSplitter()}


def storage_kind(engine) -> str:
    """"gradient" (the gradient path), "rows" (row blocks), "columns" (a declared
    column storage, LDA) or "dense"."""
    from .blocks import is_rowwise
    from .gradients import GradientVI

    if isinstance(engine, GradientVI):
        return "gradient"
    model = engine.model
    if is_rowwise(model):
        return "rows"
    if owns_its_step(model):
        return "columns"
    return "dense"


def splitter_for(engine) -> Splitter:
    """The splitter of ``engine``'s storage; ``ValueError`` naming the storage if it has none."""
    kind = storage_kind(engine)
    sp = SPLITTERS.get(kind)
    if sp is None:
        raise ValueError(why_not(engine))
    return sp


def why_not(engine) -> str | None:
    """None if ``engine``'s update can be split; else one line saying why not."""
    kind = storage_kind(engine)
    if kind in SPLITTERS:
        return None
    return (f"model {engine.model.name!r} keeps λ in {kind!r} storage, whose update cannot be split "
            f"into worker contributions yet: run it as one process")


def _batch_stream(seed: int, topic: str, partition: int, first: int, *tag: int) -> np.random.Generator:
    """A random stream of one batch, seeded by (seed, topic, partition, first offset) and
    ``tag`` (which of the batch's streams), so a batch read again after a crash draws the same."""
    seq = np.random.SeedSequence([int(seed), zlib.crc32(topic.encode()), int(partition), int(first), *tag])
    return np.random.Generator(np.random.PCG64(seq))


def batch_rng_state(seed: int, topic: str, partition: int, first: int) -> dict:
    """The random stream of one batch: seeded by (seed, topic, partition, first offset), so a
    batch read again after a crash makes the same draws (SVI+ weights, η_t)."""
    return _batch_stream(seed, topic, partition, first).bit_generator.state


def contribution(engine, state: EngineState, x, rng_state: dict) -> Contribution:
    """The contribution of minibatch ``x`` at ``state`` (module docs)."""
    return splitter_for(engine).contribution(engine, state, x, rng_state)


def compact(engine, c: Contribution, below: float, rng: np.random.Generator) -> Contribution:
    """``c`` with its small statistics rounded at random, for the wire (``scaleout.compact_below``).

    An entry ``x`` below ``below`` (in the statistics' own units: for LDA, tokens) becomes
    ``below`` with probability ``x / below`` and 0 otherwise, so its expectation is ``x``:
    the applier's step stays an unbiased natural gradient (what SVI's convergence needs),
    with a variance of at most ``below · x`` added per entry. The entries kept travel as
    float32 (relative rounding 2⁻²⁴) behind a bitmap of where they are. Workers replaying
    the step read the same message as the applier, so their λ is still the applier's bit for
    bit; what no longer holds is ``apply(compact(c)) == update()``. ``below = 0``: ``c``
    unchanged. Only the columns splitter (LDA) compacts; the others return ``c``.
    """
    if not below > 0:
        return c
    return splitter_for(engine).compact(c, float(below), rng)


def compact_rng(seed: int, topic: str, partition: int, first: int) -> np.random.Generator:
    """The draws of one batch's :func:`compact`: a stream of their own, seeded like
    :func:`batch_rng_state` (a batch read again after a crash compacts the same way)."""
    return _batch_stream(seed, topic, partition, first, 0xC0)


def apply(engine, state: EngineState, c: Contribution, rho_scale: float = 1.0, metrics: bool = True):
    """``(new state, Applied)``: the applier's step from contribution ``c`` (module docs).

    ``rho_scale`` ≤ 1 shortens the step. ``metrics=False``: a worker replaying the
    applier's step, which needs the same λ but not the step's ELBO or gradient norm
    (LDA's global ELBO term is a pass over K × V; ``Applied.elbo`` is then None).
    Raises ``FloatingPointError`` (state unchanged) if λ would become non-finite,
    ``ValueError`` for a contribution that does not fit the model.
    """
    return splitter_for(engine).apply(engine, state, c, rho_scale, metrics=metrics)


from . import split_columns  # noqa: E402, F401 - registers SPLITTERS["columns"] (it subclasses Splitter)
from . import split_gradient  # noqa: E402,F401  (registers SPLITTERS["gradient"]: the gradient path)
from . import split_rows  # noqa: E402,F401  (registers SPLITTERS["rows"])
