"""The SVI / SVI+ / batch-VI engine.

One update (seed 000, Algorithm 1; docs/design.md, "The math")::

    local step     q(θ_n) for n ∈ S_t given λ                  (the model)
    weights        w_n = 1 + ε_n − ε̄,  ε_n ~ N(0, |S_t|/M − 1)   (SVI+; w_n = 1 for SVI)
    target         λ̂_t = η + (N/|S_t|) Σ_n w_n E_q[t(θ_n)]
    step           λ ← (1 − ρ_t) λ + ρ_t λ̂_t

Special cases: M = |S_t| (or ``effective_batch_size=None``) is plain SVI, bit
for bit; S_t = all data, N = |S_t|, ρ = 1 is batch VI (CAVI); S_t = all data
with M < N is the batch SVI+ of seed 000 §IV-A.

N (``n_total``) is the data-set size. On an unbounded stream there is none;
set it to the population size α of population variational Bayes (McInerney,
Ranganath & Blei 2015): the size of the data set the posterior should
represent. Larger α makes the posterior more confident.

Parameter blocks (:mod:`streamsvi.models.blocks`, :mod:`~streamsvi.inference.blocks`).
λ is a set of blocks, each an exponential family with a storage; the model
returns statistics and the engine makes the one step.

Keeping λ in its domain. SVI+ weights can be negative, and then λ̂_t may lie
outside the natural-parameter domain (a negative Dirichlet count, a Wishart
scale that is not positive definite). The domain is convex and the current λ
is inside it, so the segment from λ towards λ̂_t leaves it at some s_max > 0,
computed in closed form per block by the block's family (``max_step``; a dense
model lists its blocks in ``param_blocks``). Each block takes the step
``min(ρ_t, τ · s_max)`` with τ = ``boundary_fraction`` (the fraction-to-boundary
rule of interior-point methods): the same natural-gradient direction, never
longer than the schedule's step, never closer to the boundary than a fraction
1 − τ of the way. Blocks far from the boundary keep ρ_t; the step is continuous
in s_max. The number of shortened blocks is in ``UpdateInfo.domain_clipped``.
The check costs one membership test per update (the closed-form limits only
when it fails), and only when some weight is negative: with non-negative
weights (SVI, batch VI) λ̂_t is always inside and nothing is checked.

Row blocks. A model whose global parameters are rows keyed by id, which a
minibatch touches only partly and which grow as new ids appear (PMF: one
Gaussian per user and per item), declares ``row_blocks`` and the row hooks
(:mod:`streamsvi.models.blocks`). :meth:`SVI.init` makes the rows of the first
batch's ids and :meth:`SVI.update` draws the SVI+ weights exactly as above
(same random stream, same M) and makes the row step of
:func:`~streamsvi.inference.blocks.row_update` on the touched rows only, with
per-row N_i, ρ_i and the family's domain rule; the state's ``aux`` holds the
id→row maps and per-row counters.

Scaled columns (LDA). A model whose λ is one (K, V) Dirichlet block that a
minibatch touches in a few columns declares ``global_storage =
"scaled_columns"``; the engine then keeps λ_kw = s_k μ_kw + c_k and makes the
step itself through :class:`~streamsvi.inference.storage_columns.ScaledColumns`
(its module docs are the storage's spec), writing μ only in the batch's
columns. :meth:`SVI.update` draws the SVI+ weights, the annealing levels and
η_t from the same stream as the dense path, runs the model's local step on the
batch's columns (and the untempered one for the ELBO under detAVI), takes the
statistics over those columns (``model.column_suffstats``), and the storage
applies the step (:func:`~streamsvi.inference.blocks.scaled_columns_step`), the
fraction-to-boundary rule, the dense fallbacks (ρ = 1, a stochastic restart)
and ‖ĝ‖; the gradient-variance estimate is the same formula as the dense
path's. It equals the dense update to rounding. The update is two halves:
:meth:`SVI.columns_batch` (weights, annealing levels, local step, statistics over
the batch's columns: reads λ) and :meth:`SVI.columns_step` (η_t of a restart, the
storage's step: writes λ); a scale-out worker runs the first and the applier the
second (:mod:`~streamsvi.inference.split_columns`), so the step lives once.

Annealing (:mod:`~streamsvi.inference.annealing`; docs/design.md §2.3a).
``annealer=`` picks one of none, SVI+ with a schedule M_t, deterministic
(detAVI: local step at temperature T_t and the target tempered block by
block, each family's ``temper``) or stochastic (stochAVI: the target mixed with a fresh
``model.random_init`` at weight ρ_t, drawn from the state's random stream).
The level is a pure function of t; ``UpdateInfo.elbo`` stays the untempered
ELBO. ``effective_batch_size=M`` is ``annealer=SVIPlus(M)``. A model of row
blocks declares the kinds it supports (``annealing_kinds``; PMF: none and
svi+). LDA, on the scaled-columns storage, declares all four: the engine takes
T_t and ρ_t from the annealer and, when ρ_t > 0, draws η_t from the state's
random stream after the SVI+ draws, as on the dense path, so nothing is drawn
when ρ_t = 0.

Examples
--------
>>> import numpy as np
>>> from streamsvi.models import BayesianGMM
>>> rng = np.random.default_rng(0)
>>> X = np.concatenate([rng.normal(-3, 1, (500, 2)), rng.normal(3, 1, (500, 2))])
>>> engine = SVI(BayesianGMM(2, 2), n_total=len(X), effective_batch_size=20)
>>> state = engine.init(X, seed=1)
>>> state, infos = engine.fit(state, X, n_steps=50, batch_size=100)
>>> state.step, state.records_seen
(50, 5000)
>>> infos[-1].noise_std
2.0
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..models.base import NatParams
from .annealing import Annealer, NoAnnealing, SVIPlus, annealer_from_dict
from ..models.base import PairedStats, StartsFromData
from .blocks import dense_step, is_rowwise, row_init, row_update
from .schedules import Constant, RobbinsMonro, Schedule
from .storage_columns import ScaledColumns

#: Storages a model may declare for its global block (``global_storage``); "dense" is
#: the engine's own ``NatParams`` arithmetic below.
STORAGES = {"scaled_columns": ScaledColumns}


def storage_for(model):
    """The storage object of ``model``'s declared ``global_storage``, or None (dense)."""
    name = "dense" if is_rowwise(model) else model.global_storage
    if name == "dense":
        return None
    if name not in STORAGES:
        raise ValueError(f"model {model.name!r} declares global_storage {name!r}; "
                         f"known: {', '.join(['dense', *STORAGES])}")
    return STORAGES[name](model)


def owns_its_step(model) -> bool:
    """True when λ is not one dense ``NatParams`` stepped by :meth:`SVI.step_towards`
    (row blocks, or a declared storage such as LDA's scaled columns): such a model's
    update is split for scale-out by its storage's own splitter (:mod:`.split`), or refused."""
    return is_rowwise(model) or model.global_storage != "dense"


@dataclass(frozen=True)
class EngineState:
    """Everything an update changes: step t, λ, the random stream, records seen.

    Immutable: :meth:`SVI.update` returns a new state. ``rng_state`` is the
    numpy PCG64 state as a JSON-serialisable dict. One exception: LDA writes
    its stored topic matrix in place (only the batch's words; see its module
    docs; the engine's scaled-columns storage), so an LDA state passed to
    ``update`` must not be used afterwards (it is unchanged when ``update`` raises).

    ``aux`` is state beside λ for row blocks (see "Row blocks" in the module
    docs: the id→row maps and per-row counts) and the scaled-columns storage
    (LDA: per-topic Σ_w μ_kw² and the last global ELBO term): None for every
    other model. A dict whose values are JSON values
    or numpy arrays; it is never modified in place (an update returns a new
    dict), and :mod:`~streamsvi.inference.state` saves it without pickle.
    """

    step: int
    lam: NatParams
    rng_state: dict
    records_seen: int
    aux: dict | None = None

    def rng(self) -> np.random.Generator:
        g = np.random.Generator(np.random.PCG64())
        g.bit_generator.state = self.rng_state
        return g


@dataclass(frozen=True)
class Target:
    """The stochastic natural-gradient target of one minibatch (see ``SVI.stochastic_target``).

    ``target`` is λ̂_t (annealed: tempered at ``temperature``, mixed with a
    random restart at weight ``restart_weight``); ``stats`` the unweighted
    Σ_n E_q[t(θ_n)] (of the tempered local factors when T ≠ 1); ``weights``
    the SVI+ w_n (None for SVI); ``rng_state`` the random stream after drawing
    them (and η_t).
    """

    target: NatParams
    x: np.ndarray
    local: object
    stats: NatParams
    weights: np.ndarray | None
    effective_batch_size: float
    noise_var: float
    rng_state: dict
    temperature: float = 1.0
    restart_weight: float = 0.0


@dataclass(frozen=True)
class UpdateInfo:
    """What one update measured.

    Attributes
    ----------
    step : int
        t, the 1-based number of this update.
    rho : float
        ρ_t from the schedule.
    batch_size : int
        |S_t|.
    effective_batch_size : float
        M (= |S_t| for plain SVI).
    noise_std : float
        √(|S_t|/M − 1), the standard deviation of the SVI+ ε_n.
    elbo : float
        L_t = E_q[log p(β) − log q(β)] + (N/|S_t|) Σ_n (E_q[log p(x_n, θ_n|β)] − E_q[log q(θ_n)]),
        at the λ before this update and the local factors fitted to it.
    elbo_per_record : float
        L_t / N.
    grad_variance : float
        N² tr(Σ̂_t) / M_eff, Σ̂_t the sample covariance of E_q[t(θ_n)] over the
        batch, M_eff = M (SVI+) or |S_t| (SVI): the estimated total variance of
        the natural gradient.
    grad_norm : float
        ‖ĝ_t‖ = ‖η + N λ'_t − λ‖ (Euclidean over all coordinates).
    domain_clipped : int
        Blocks whose step was shortened to stay in the domain (see module docs).
    domain_blocks : int
        Blocks checked (0 when every weight was ≥ 0).
    min_weight : float
        Smallest SVI+ weight w_n in the batch (1.0 for SVI).
    annealing_level : float
        The annealer's level at this step: the noise std √(|S_t|/M_t − 1)
        (svi+), the temperature T_t (deterministic), the restart weight ρ_t
        (stochastic), 0 (none).
    temperature : float
        T_t (1.0 unless deterministic annealing).
    restart_weight : float
        ρ_t of the random restart (0.0 unless stochastic annealing).
    gradient : NatParams
        ĝ_t = λ̂_t − λ itself (not in ``to_dict``).
    """

    step: int
    rho: float
    batch_size: int
    effective_batch_size: float
    noise_std: float
    elbo: float
    elbo_per_record: float
    grad_variance: float
    grad_norm: float
    domain_clipped: int = 0
    domain_blocks: int = 0
    min_weight: float = 1.0
    annealing_level: float = 0.0
    temperature: float = 1.0
    restart_weight: float = 0.0
    gradient: NatParams | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """The scalar fields (everything but ``gradient``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gradient"}


@dataclass(frozen=True)
class ColumnStats:
    """What the scaled-columns step needs from one minibatch (:meth:`SVI.columns_batch`).

    ``cols`` the batch's sorted column ids (int64), ``Sw`` (K, |cols|) its weighted
    statistics Σ_d w_d S_dkw over them, ``records`` |S|, ``scale`` N/|S|, ``min_weight``
    the smallest SVI+ weight, and the annealing levels of its step t: ``temperature``
    T_t, ``restart_weight`` ρ^a_t; when ρ^a_t > 0, ``restart_draws`` (the random stream
    after the SVI+ weights, which η_t is drawn from) and ``mean_length`` (c of
    ``model.random_topics``). Arrays and numbers only: a scale-out worker sends it
    (:mod:`~streamsvi.inference.split_columns`).
    """

    cols: np.ndarray
    Sw: np.ndarray
    records: int
    scale: float
    min_weight: float = 1.0
    temperature: float = 1.0
    restart_weight: float = 0.0
    restart_draws: dict | None = None
    mean_length: float | None = None


@dataclass(frozen=True)
class ColumnsBatch:
    """The data half of a scaled-columns update (:meth:`SVI.columns_batch`): ``stats``
    for the step, and what the update's metrics need besides (the local factors,
    ``elbo_local`` the untempered ones or None, the unweighted statistics ``Su``, M, the
    SVI+ noise variance, the random stream after the SVI+ weights)."""

    stats: ColumnStats
    t: int
    local: object
    elbo_local: object
    Su: np.ndarray
    effective_batch_size: float
    noise_var: float
    rng_state: dict


def _check_positive_number(name, v, allow_none=False):
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) \
            or not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return v


@dataclass
class SVI:
    """Stochastic variational inference with optional SVI+ annealing.

    Parameters
    ----------
    model :
        A conjugate model (see :mod:`streamsvi.models.base`).
    n_total : float
        N, the data-set size, or the population size α for an unbounded stream.
    schedule : Schedule
        ρ_t; default ``RobbinsMonro(tau0=1, kappa=0.7)``.
    effective_batch_size : float or None
        M, the SVI+ effective batch size, 0 < M ≤ |S_t|. None is plain SVI.
    effective_fraction : float or None
        Alternative to M for batches of varying size: M = fraction · |S_t|,
        fraction in (0, 1].
    boundary_fraction : float
        τ in (0, 1): how far towards the domain boundary a step may go
        (module docs). Default 0.9.
    short_batches : {"error", "svi"}
        What a batch smaller than M means: an error (default), or a plain SVI
        step with M = |S_t| for that batch (the daemon's choice: a stream
        delivers a short batch when ``max_wait_seconds`` expires).
    annealer : Annealer, dict or None
        How the target is annealed (:mod:`~streamsvi.inference.annealing`):
        ``NoAnnealing``, ``SVIPlus``, ``Deterministic`` or ``Stochastic``, or
        its ``to_dict()`` form. None: ``SVIPlus(effective_batch_size)`` (or
        ``SVIPlus(fraction=effective_fraction)``) when one is set, else no
        annealing. Setting ``annealer`` together with ``effective_batch_size``
        or ``effective_fraction`` is an error.

    Combinations (docs/design.md, "Annealing"). Every annealer works with any
    batch size and any ρ schedule: batch VI (S_t = all, ρ = 1) gives the
    papers' algorithms exactly, minibatches their SVI forms:

    * ``svi+``: seed 000's Algorithm 1, for every model (row-wise ones too).
    * ``deterministic``: tempered local step and tempered target
      λ̂_T = temper(η + (N/|S_t|) Σ_n E_q_T[t(θ_n)], T_t), then the usual step
      λ ← (1 − ρ_t) λ + ρ_t λ̂_T (the stochastic form of Abrol et al. 2014).
    * ``stochastic``: λ ← (1 − ρ_t) λ + ρ_t [(1 − ρ^a_t) λ̂ + ρ^a_t η_t];
      with ρ_t = 1 this is seed 002's eq. 12.

    Refused with ``ValueError``: a kind the model does not declare in
    ``annealing_kinds`` (PMF: ``deterministic`` and ``stochastic``, since it
    has no local latent assignments to temper or restart), and any annealer
    together with ``effective_batch_size`` / ``effective_fraction`` (one
    annealer at a time).
    """

    model: object
    n_total: float
    schedule: Schedule = field(default_factory=RobbinsMonro)
    effective_batch_size: float | None = None
    effective_fraction: float | None = None
    boundary_fraction: float = 0.9
    short_batches: str = "error"
    annealer: Annealer | None = None
    #: caches of the row storage (id→row indices, record formats): never state, never compared
    _rows_cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    #: the model's declared storage (``storage_for``), made on first use: never state, never compared
    _storage_obj: object = field(default=False, init=False, repr=False, compare=False)

    def __post_init__(self):
        _check_positive_number("n_total", self.n_total)
        if not isinstance(self.schedule, Schedule):
            raise ValueError(f"schedule must be a Schedule, got {type(self.schedule).__name__}")
        _check_positive_number("effective_batch_size (M)", self.effective_batch_size, allow_none=True)
        if self.effective_fraction is not None:
            if self.effective_batch_size is not None:
                raise ValueError("set effective_batch_size or effective_fraction, not both")
            if not (0 < self.effective_fraction <= 1):
                raise ValueError(f"effective_fraction must be in (0, 1], got {self.effective_fraction}")
        if not (0 < self.boundary_fraction < 1):
            raise ValueError(f"boundary_fraction must be in (0, 1), got {self.boundary_fraction}")
        if self.short_batches not in ("error", "svi"):
            raise ValueError(f"short_batches must be 'error' or 'svi', got {self.short_batches!r}")
        if self.annealer is not None:
            if self.effective_batch_size is not None or self.effective_fraction is not None:
                raise ValueError("set annealer or effective_batch_size/effective_fraction, not both "
                                 "(effective_batch_size=M is annealer=SVIPlus(M))")
            self.annealer = annealer_from_dict(self.annealer)
            self.annealer.check_model(self.model)

    @property
    def annealing(self) -> Annealer:
        """The annealer in force: ``annealer``, or what ``effective_batch_size`` /
        ``effective_fraction`` mean (constant SVI+), or :class:`NoAnnealing`."""
        if self.annealer is not None:
            return self.annealer
        if self.effective_batch_size is not None:
            return SVIPlus(self.effective_batch_size)
        if self.effective_fraction is not None:
            return SVIPlus(fraction=self.effective_fraction)
        return NoAnnealing()

    # ----------------------------------------------------------------- init
    def init(self, x_init, seed: int = 0) -> EngineState:
        """A fresh state: λ from ``model.init_params`` on ``x_init``, step 0."""
        rng = np.random.Generator(np.random.PCG64(seed))
        if is_rowwise(self.model):                     # growing rows keyed by id (module docs)
            lam, aux = row_init(self.model, self._rows_cache, rng, self.model.check_batch(x_init))
            return EngineState(step=0, lam=lam, rng_state=rng.bit_generator.state, records_seen=0,
                               aux=aux)
        storage = self._storage()
        if storage is not None:                                  # a declared storage (module docs)
            lam, aux = storage.init(rng, self.model.check_batch(x_init), self.n_total)
            return EngineState(step=0, lam=lam, rng_state=rng.bit_generator.state, records_seen=0,
                               aux=aux)
        lam = self.model.init_params(rng, self.model.check_batch(x_init), self.n_total)
        return EngineState(step=0, lam=lam, rng_state=rng.bit_generator.state, records_seen=0)

    def state_from_params(self, lam: NatParams, seed: int = 0) -> EngineState:
        """A fresh state (step 0) at a given λ."""
        rng = np.random.Generator(np.random.PCG64(seed))
        return EngineState(step=0, lam=lam.copy(), rng_state=rng.bit_generator.state, records_seen=0)

    # --------------------------------------------------------------- update
    def effective_size(self, batch_size: int, t: int | None = None) -> float:
        """M_t for a batch of ``batch_size`` records at step ``t``; raises if it is not in (0, |S|].

        ``t`` matters only for a scheduled SVI+ M_t (default: the first step).
        """
        ann = self.annealer
        if ann is not None and not isinstance(ann, SVIPlus):
            return float(batch_size)
        if ann is not None:
            M = ann.effective_size(1 if t is None else t, batch_size)
            given = ann.M0
        elif self.effective_fraction is not None:
            return self.effective_fraction * batch_size
        elif self.effective_batch_size is None:
            return float(batch_size)
        else:
            given = self.effective_batch_size
            M = float(given)
        if M > batch_size and self.short_batches == "svi":
            return float(batch_size)
        if M > batch_size:
            raise ValueError(f"effective batch size M={given} must be <= "
                             f"the batch size |S|={batch_size}")
        return M

    def _svi_plus_weights(self, state: EngineState, S: int, M: float):
        """(weights or None, noise variance, rng_state): seed 000 Algorithm 1, lines 4–6."""
        noise_var = S / M - 1.0
        if noise_var > 0:
            rng = state.rng()
            eps = rng.normal(0.0, math.sqrt(noise_var), size=S)
            return 1.0 + eps - eps.mean(), noise_var, rng.bit_generator.state
        return None, noise_var, state.rng_state

    def stochastic_target(self, state: EngineState, x, t: int | None = None) -> "Target":
        """λ̂_t = η + (N/|S_t|) Σ_n w_n E_q[t(θ_n)] for the minibatch ``x`` at ``state``, annealed.

        The first half of :meth:`update` (local step, SVI+ weights, target),
        exposed so that the noise of λ'_t can be studied on its own. ``t`` is
        the step the target is for (default ``state.step + 1``). Under
        deterministic annealing the local step runs at T_t and the target is
        λ̂ tempered block by block (each family's ``temper``); under stochastic annealing it is
        (1 − ρ_t) λ̂ + ρ_t η_t with η_t = ``model.random_init`` drawn from the
        state's random stream (nothing is drawn when ρ_t = 0).
        """
        model = self.model
        x = model.check_batch(x)
        S = x.shape[0]
        t = state.step + 1 if t is None else t
        ann = self.annealing
        M = self.effective_size(S, t)
        T = ann.temperature(t)
        local = model.local_step(state.lam, x) if T == 1.0 else \
            model.local_step(state.lam, x, temperature=T)
        weights, noise_var, rng_state = self._svi_plus_weights(state, S, M)
        if weights is not None:
            if isinstance(model, PairedStats):
                stats_w, stats = model.suffstats_pair(local, x, weights)
            else:
                stats_w, stats = model.suffstats(local, x, weights), model.suffstats(local, x)
        else:
            stats = stats_w = model.suffstats(local, x)
        target = model.prior() + stats_w * (float(self.n_total) / S)
        if T != 1.0:
            target = self._temper(target, T)
        target, rng_state = ann.perturb_target(model, target, t, rng_state)   # detAVI's jitter, if set
        rho_a = ann.restart_weight(t)
        if rho_a > 0:
            rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = rng_state
            eta_t = model.random_init(rng, x, float(self.n_total))
            rng_state = rng.bit_generator.state
            target = target * (1.0 - rho_a) + eta_t * rho_a
        return Target(target=target, x=x, local=local, stats=stats, weights=weights,
                      effective_batch_size=M, noise_var=noise_var, rng_state=rng_state,
                      temperature=T, restart_weight=rho_a)

    def update(self, state: EngineState, x) -> tuple[EngineState, UpdateInfo]:
        """One SVI+ step on the minibatch ``x``; returns the new state and its info.

        The input state is not modified. Raises ``ValueError`` for a bad batch
        and ``FloatingPointError`` if the update would make λ non-finite; in
        both cases nothing changed.
        """
        model = self.model
        if is_rowwise(model):                   # growing rows keyed by id (module docs)
            return self._row_update(state, x)
        storage = self._storage()
        if storage is not None:                 # scaled columns (LDA; module docs)
            return self._columns_update(storage, state, x)
        t = state.step + 1
        tg = self.stochastic_target(state, x, t)
        x, local, stats, target, M = tg.x, tg.local, tg.stats, tg.target, tg.effective_batch_size
        S = x.shape[0]
        N = float(self.n_total)
        scale = N / S
        lam = state.lam
        min_w = 1.0 if tg.weights is None else float(tg.weights.min())
        noise_var = tg.noise_var
        rng_state = tg.rng_state
        rho = self.schedule(t)
        new_lam, clipped, blocks = self.step_towards(lam, target, rho, min_w)
        if not new_lam.all_finite():
            raise FloatingPointError(f"update {t} would make λ non-finite; state left unchanged")

        # metrics. The reported ELBO is the true one, L(λ) = max over the local
        # factors of the untempered objective: under detAVI that needs the
        # untempered local step too (one more per update while T_t > 1).
        elbo_local = local if tg.temperature == 1.0 else model.local_step(lam, x)
        elbo = model.global_elbo(lam) + scale * float(np.sum(model.local_elbo(elbo_local)))
        grad_var = _grad_variance(stats.sqnorm() if S > 1 else 0.0,
                                  model.suffstats_sqnorm(local, x) if S > 1 else None, S, N, M)
        gradient = target - lam
        grad_norm = math.sqrt(gradient.sqnorm())
        info = UpdateInfo(step=t, rho=rho, batch_size=S, effective_batch_size=M,
                          noise_std=math.sqrt(max(noise_var, 0.0)), elbo=elbo,
                          elbo_per_record=elbo / N, grad_variance=grad_var, grad_norm=grad_norm,
                          domain_clipped=clipped, domain_blocks=blocks, min_weight=min_w,
                          annealing_level=self._annealing_level(noise_var, tg.temperature,
                                                                tg.restart_weight),
                          temperature=tg.temperature, restart_weight=tg.restart_weight,
                          gradient=gradient)
        new_state = EngineState(step=t, lam=new_lam, rng_state=rng_state,
                                records_seen=state.records_seen + S)
        return new_state, info

    def step_towards(self, lam: NatParams, target: NatParams, rho: float,
                     min_weight: float = 1.0) -> tuple[NatParams, int, int]:
        """λ ← (1 − ρ) λ + ρ λ̂, kept in the domain; returns ``(new λ, clipped, blocks)``.

        The fraction-to-boundary rule of the module docs: each block takes
        ρ_b = min(ρ, τ·s_max). A block is shortened iff s_max < ρ/τ, i.e. iff
        λ + (ρ/τ)(λ̂ − λ) is outside the domain: one cheap membership test
        first, the closed-form s_max only when it fails, and neither when no
        weight was negative (``min_weight`` ≥ 0: λ̂ is inside). Shared by
        :meth:`update` and the scale-out applier, which gets λ̂ from a worker.
        """
        return dense_step(self.model.param_blocks, lam, target, rho, self.boundary_fraction, min_weight)

    def _temper(self, target: NatParams, T: float) -> NatParams:
        """θ(target)/T block by block (each block's family tempers its own parameters; the
        annealer says how a Dirichlet block is read, ``Deterministic.dirichlet``)."""
        return self.annealing.temper_target(self.model, target, T)

    def _row_update(self, state: EngineState, x) -> tuple[EngineState, UpdateInfo]:
        """:meth:`update` for a model of row blocks (module docs): same weights, the row step."""
        model = self.model
        x = model.check_batch(x)
        S = x.shape[0]
        t = state.step + 1
        M = self.effective_size(S, t)
        weights, noise_var, rng_state = self._svi_plus_weights(state, S, M)   # as stochastic_target
        ann = self.annealing
        T, rho_a = ann.temperature(t), ann.restart_weight(t)
        out = row_update(model, self._rows_cache, state.lam, state.aux, x, weights=weights,
                         n_total=float(self.n_total), records_before=state.records_seen,
                         schedule=self.schedule, tau=self.boundary_fraction, effective_batch_size=M)
        new_lam = out["lam"]
        if not new_lam.all_finite():
            raise FloatingPointError(f"update {t} would make λ non-finite; state left unchanged")
        N = float(self.n_total)
        info = UpdateInfo(step=t, rho=self.schedule(t), batch_size=S, effective_batch_size=M,
                          noise_std=math.sqrt(max(noise_var, 0.0)), elbo=out["elbo"],
                          elbo_per_record=out["elbo"] / N, grad_variance=out["grad_variance"],
                          grad_norm=out["grad_norm"], domain_clipped=out["domain_clipped"],
                          domain_blocks=out["domain_blocks"],
                          min_weight=1.0 if weights is None else float(weights.min()),
                          annealing_level=self._annealing_level(noise_var, T, rho_a),
                          temperature=T, restart_weight=rho_a)
        return EngineState(step=t, lam=new_lam, rng_state=rng_state,
                           records_seen=state.records_seen + S, aux=out["aux"]), info

    # ------------------------------------------------ scaled-columns storage
    def _storage(self):
        """The model's declared storage object (None: dense or row blocks), made once."""
        if self._storage_obj is False:
            self._storage_obj = storage_for(self.model)
        return self._storage_obj

    def _columns_update(self, storage, state: EngineState, x) -> tuple[EngineState, UpdateInfo]:
        """:meth:`update` through a column storage (:mod:`.storage_columns`): the same
        weights, annealing levels, random stream and metrics as the dense update; the
        storage writes λ only in the batch's columns (or densely, see its docs). Its two
        halves, :meth:`columns_batch` and :meth:`columns_step`, are what a scale-out
        worker and applier run (:mod:`.split_columns`)."""
        model = self.model
        t = state.step + 1
        lam, aux = storage.prepare(state.lam, state.aux, dense=self.annealing.restart_weight(t) > 0)
        b = self.columns_batch(replace(state, lam=lam, aux=aux), x)
        c, local = b.stats, b.local
        S, N, M = c.records, float(self.n_total), b.effective_batch_size
        rho = self.schedule(t)
        new, out = self.columns_step(replace(state, lam=lam, aux=aux, rng_state=b.rng_state), c,
                                     float(rho), local=local)
        elbo = out["global_elbo"] + c.scale * float(np.sum(model.local_elbo(b.elbo_local)))
        grad_var = _grad_variance(float(np.einsum("ij,ij->", b.Su, b.Su)) if S > 1 else 0.0,
                                  model.suffstats_sqnorm(local) if S > 1 else None, S, N, M)
        T, rho_a = c.temperature, c.restart_weight
        info = UpdateInfo(step=t, rho=rho, batch_size=S, effective_batch_size=M,
                          noise_std=math.sqrt(max(b.noise_var, 0.0)), elbo=elbo,
                          elbo_per_record=elbo / N, grad_variance=grad_var,
                          grad_norm=out["grad_norm"], domain_clipped=out["domain_clipped"],
                          domain_blocks=out["domain_blocks"], min_weight=c.min_weight,
                          annealing_level=self._annealing_level(b.noise_var, T, rho_a),
                          temperature=T, restart_weight=rho_a)
        return new, info

    def columns_batch(self, state: EngineState, x, elbo: bool = True) -> "ColumnsBatch":
        """The data half of a scaled-columns update of ``x`` at ``state``: SVI+ weights from
        the state's random stream, the annealing levels of step t = ``state.step + 1``, the
        local step (at T_t) on the batch's columns and the statistics over them. ``elbo``:
        also the untempered local step the reported ELBO needs (one more under detAVI; the
        tempered one serves when T_t = 1). Reads λ, never writes it."""
        model = self.model
        x = model.check_batch(x)
        S = x.shape[0]
        t = state.step + 1
        M = self.effective_size(S, t)
        weights, noise_var, rng_state = self._svi_plus_weights(state, S, M)   # as stochastic_target
        ann = self.annealing
        T, rho_a = ann.temperature(t), ann.restart_weight(t)
        lam = state.lam
        # under detAVI the untempered local step first (the tempered one's λ columns are the
        # ones the step reuses)
        elbo_local = model.local_step(lam, x) if elbo and T != 1.0 else None
        local = model.local_step(lam, x) if T == 1.0 else model.local_step(lam, x, temperature=T)
        if elbo and elbo_local is None:
            elbo_local = local
        local, rng_state = ann.restart_local(model, local, t, rng_state)   # stochAVI's q(π_d) restart
        cols, Sw, Su = model.column_suffstats(local, weights)
        stats = ColumnStats(cols=np.asarray(cols, dtype=np.int64), Sw=Sw, records=S,
                            scale=float(self.n_total) / S,
                            min_weight=1.0 if weights is None else float(weights.min()),
                            temperature=float(T), restart_weight=float(rho_a),
                            restart_draws=rng_state if rho_a > 0 else None,
                            mean_length=model.mean_doc_length(x) if rho_a > 0 else None)
        return ColumnsBatch(stats=stats, t=t, local=local, elbo_local=elbo_local, Su=Su,
                            effective_batch_size=M, noise_var=noise_var, rng_state=rng_state)

    def columns_step(self, state: EngineState, c: "ColumnStats", rho: float, local=None,
                     metrics: bool = True):
        """``(new state, the storage's step output)``: the one scaled-columns step of
        :meth:`update` and of the scale-out applier, from the batch's statistics ``c`` at
        step ``state.step + 1`` with ρ = ``rho``.

        λ is prepared (:meth:`ScaledColumns.prepare`), η_t of a stochastic restart (ρ^a > 0)
        drawn from ``c.restart_draws`` (``model.random_topics``, as ``random_init`` draws it),
        and stepped in place (the state passed in must not be used afterwards; nothing is
        written when ``FloatingPointError`` is raised). ``local``: the local factors, whose
        ``lam_cols`` the step reuses, or None (λ's columns read again). The new state's
        random stream is the one after η_t's draws, or ``state.rng_state``. ``metrics=False``:
        the same λ without the step's ELBO term and gradient norm (a follower's replay).
        """
        storage = self._storage()
        rho_a = float(c.restart_weight)
        lam, aux = storage.prepare(state.lam, state.aux, dense=rho_a > 0)
        eta_t, rng_state = None, state.rng_state
        if rho_a > 0:                           # η_t from the batch's stream, as stochastic_target
            if c.restart_draws is None or c.mean_length is None:
                raise ValueError("a restart step (ρ^a > 0) needs the random stream and the mean "
                                 "document length it draws η_t from")
            rng = np.random.Generator(np.random.PCG64())
            rng.bit_generator.state = c.restart_draws
            eta_t = self.model.random_topics(rng, c.mean_length, float(self.n_total))
            rng_state = rng.bit_generator.state
        t = state.step + 1
        out = storage.step(lam, aux, local, c.cols, c.Sw, scale=float(c.scale), rho=float(rho),
                           tau=float(self.boundary_fraction), min_weight=float(c.min_weight), step=t,
                           temperature=float(c.temperature), restart_weight=rho_a, restart=eta_t,
                           metrics=metrics,
                           dirichlet_shift=self.annealing.dirichlet_shift(float(c.temperature)))
        return EngineState(step=t, lam=out["lam"], rng_state=rng_state,
                           records_seen=state.records_seen + int(c.records), aux=out["aux"]), out

    def _annealing_level(self, noise_var: float, T: float, rho_a: float) -> float:
        kind = self.annealing.kind
        if kind == "svi+":
            return math.sqrt(max(noise_var, 0.0))
        if kind == "deterministic":
            return T
        if kind == "stochastic":
            return rho_a
        return 0.0

    def predictive_logpdf(self, state: EngineState, x) -> np.ndarray:
        """log p(x* | data) per record at ``state`` (passes ``state.aux`` to row-wise models)."""
        if state.aux is not None:
            return self.model.predictive_logpdf(state.lam, x, aux=state.aux)
        return self.model.predictive_logpdf(state.lam, x)

    # ----------------------------------------------------- in-memory driver
    def fit(self, state: EngineState, X, n_steps: int, batch_size: int | None = None,
            callback=None) -> tuple[EngineState, list[UpdateInfo]]:
        """Run ``n_steps`` updates on minibatches drawn from the array ``X``.

        Each S_t is drawn uniformly without replacement with the state's random
        stream (so runs are reproducible); ``batch_size=None`` uses all of ``X``
        every step. ``callback(state, info)`` is called after every update.
        """
        X = self.model.check_batch(X)
        n = X.shape[0]
        if batch_size is not None and not (1 <= batch_size <= n):
            raise ValueError(f"batch_size must be in [1, {n}] or None, got {batch_size}")
        infos = []
        for _ in range(int(n_steps)):
            if batch_size is None or batch_size == n:
                xb = X
            else:
                rng = state.rng()
                idx = rng.choice(n, size=batch_size, replace=False)
                state = replace(state, rng_state=rng.bit_generator.state)
                xb = X[np.sort(idx)]
            state, info = self.update(state, xb)
            infos.append(info)
            if callback is not None:
                callback(state, info)
        return state, infos

    def elbo(self, lam: NatParams, X) -> float:
        """The full-data ELBO at λ with optimal local factors (N = len(X))."""
        X = self.model.check_batch(X)
        local = self.model.local_step(lam, X)
        return self.model.global_elbo(lam) + float(np.sum(self.model.local_elbo(local)))

    def to_dict(self) -> dict:
        """Engine settings (not the model's) as JSON-serialisable values.

        ``annealer`` is present only when one was given, so an engine without
        one writes exactly what it wrote before annealers existed (and a
        checkpoint without it loads as no annealing / constant M).
        """
        d = {"n_total": float(self.n_total), "schedule": self.schedule.to_dict(),
             "effective_batch_size": self.effective_batch_size,
             "effective_fraction": self.effective_fraction,
             "boundary_fraction": self.boundary_fraction, "short_batches": self.short_batches}
        if self.annealer is not None:
            d["annealer"] = self.annealer.to_dict()
        return d


def _grad_variance(stats_sqnorm: float, record_sqnorms, S: int, N: float, M: float) -> float:
    """N² tr(Σ̂) / M: the estimated total variance of the natural gradient (``UpdateInfo``).

    ``stats_sqnorm`` ‖Σ_n E_q[t(θ_n)]‖² and ``record_sqnorms`` the per-record
    ‖E_q[t(θ_n)]‖²; tr(Σ̂) is their sample covariance's trace. NaN for one record."""
    if S <= 1:
        return float("nan")
    mean_sq = stats_sqnorm / (S * S)
    tr_cov = max(0.0, (float(np.sum(record_sqnorms)) - S * mean_sq) / (S - 1))
    return N * N * tr_cov / M


def start_records(model, batch_size: int, n_total: float) -> float:
    """Records a streaming start gathers before ``engine.init``: the model's
    ``start_size(batch_size)`` if it declares one (the GMM: ``init_batches`` minibatches
    and at least 5·K·D records), else one minibatch; at most ``n_total`` = N. The daemon,
    the scale-out worker and the river face all hold their first minibatches to this."""
    size = model.start_size(batch_size) if isinstance(model, StartsFromData) else batch_size
    return min(size, n_total)


def batch_vi(model, n_total) -> SVI:
    """Batch VI (CAVI): ρ = 1, use with ``fit(..., batch_size=None)`` and N = len(X)."""
    return SVI(model, n_total, schedule=Constant(1.0))
