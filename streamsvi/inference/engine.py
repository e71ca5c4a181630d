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

Keeping λ in its domain. SVI+ weights can be negative, and then λ̂_t may lie
outside the natural-parameter domain (a negative Dirichlet count, a Wishart
scale that is not positive definite). The domain is convex and the current λ
is inside it, so the segment from λ towards λ̂_t leaves it at some s_max > 0,
computed in closed form per block of parameters by the model
(``max_step``). Each block takes the step ``min(ρ_t, τ · s_max)`` with
τ = ``boundary_fraction`` (the fraction-to-boundary rule of interior-point
methods): the same natural-gradient direction, never longer than the
schedule's step, never closer to the boundary than a fraction 1 − τ of the
way. Blocks far from the boundary keep ρ_t; the step is continuous in s_max.
The number of shortened blocks is in ``UpdateInfo.domain_clipped``. The check
costs one membership test per update (the closed-form limits only when it
fails), and only when some weight is negative: with non-negative weights
(SVI, batch VI) λ̂_t is always inside and nothing is checked.

Row-wise models. A model whose global parameters are many rows that a
minibatch touches only partly, and that grow as new ids appear (PMF: one
Gaussian per user and per item), provides ``init_state(rng, x, n_total) ->
(λ, aux)`` and ``svi_step(lam, aux, x, **context) -> dict``. :meth:`SVI.update`
then draws the SVI+ weights exactly as above (same random stream, same
M) and hands them, with ρ's schedule, N, the step and τ, to ``svi_step``,
which applies the natural-gradient step to the touched rows only (with its
own per-row N_i, ρ_i and rule for keeping λ in its domain; see the model's docs)
and returns the new ``lam`` and ``aux`` and the metrics of
:class:`UpdateInfo` (with ``checked_finite: True`` when it has already made
sure the new λ is finite, so the engine skips its own pass over λ). LDA uses
the same path to write only the columns of the words a batch holds (its
module docs, "Sparse global step"); its step equals the dense update above.
Every other model never reaches that path.

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
from .schedules import Constant, RobbinsMonro, Schedule


@dataclass(frozen=True)
class EngineState:
    """Everything an update changes: step t, λ, the random stream, records seen.

    Immutable: :meth:`SVI.update` returns a new state. ``rng_state`` is the
    numpy PCG64 state as a JSON-serialisable dict. One exception: LDA writes
    its stored topic matrix in place (only the batch's words; see its module
    docs), so an LDA state passed to ``update`` must not be used afterwards
    (it is unchanged when ``update`` raises).

    ``aux`` is model-owned state beside λ, for row-wise models (see "Row-wise
    models" in the module docs; PMF keeps its id→row maps and per-row counts
    there): None for every other model. A dict whose values are JSON values
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

    ``target`` is λ̂_t; ``stats`` the unweighted Σ_n E_q[t(θ_n)]; ``weights``
    the SVI+ w_n (None for SVI); ``rng_state`` the random stream after drawing them.
    """

    target: NatParams
    x: np.ndarray
    local: object
    stats: NatParams
    weights: np.ndarray | None
    effective_batch_size: float
    noise_var: float
    rng_state: dict


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
    gradient: NatParams | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        """The scalar fields (everything but ``gradient``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gradient"}


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
    """

    model: object
    n_total: float
    schedule: Schedule = field(default_factory=RobbinsMonro)
    effective_batch_size: float | None = None
    effective_fraction: float | None = None
    boundary_fraction: float = 0.9
    short_batches: str = "error"

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

    # ----------------------------------------------------------------- init
    def init(self, x_init, seed: int = 0) -> EngineState:
        """A fresh state: λ from ``model.init_params`` on ``x_init``, step 0."""
        rng = np.random.Generator(np.random.PCG64(seed))
        init_state = getattr(self.model, "init_state", None)   # row-wise models (module docs)
        if init_state is not None:
            lam, aux = init_state(rng, self.model.check_batch(x_init), self.n_total)
            return EngineState(step=0, lam=lam, rng_state=rng.bit_generator.state, records_seen=0,
                               aux=aux)
        lam = self.model.init_params(rng, self.model.check_batch(x_init), self.n_total)
        return EngineState(step=0, lam=lam, rng_state=rng.bit_generator.state, records_seen=0)

    def state_from_params(self, lam: NatParams, seed: int = 0) -> EngineState:
        """A fresh state (step 0) at a given λ."""
        rng = np.random.Generator(np.random.PCG64(seed))
        return EngineState(step=0, lam=lam.copy(), rng_state=rng.bit_generator.state, records_seen=0)

    # --------------------------------------------------------------- update
    def effective_size(self, batch_size: int) -> float:
        """M for a batch of ``batch_size`` records; raises if it is not in (0, |S|]."""
        if self.effective_fraction is not None:
            return self.effective_fraction * batch_size
        if self.effective_batch_size is None:
            return float(batch_size)
        M = float(self.effective_batch_size)
        if M > batch_size and self.short_batches == "svi":
            return float(batch_size)
        if M > batch_size:
            raise ValueError(f"effective batch size M={self.effective_batch_size} must be <= "
                             f"the batch size |S|={batch_size}")
        return M

    def stochastic_target(self, state: EngineState, x) -> "Target":
        """λ̂_t = η + (N/|S_t|) Σ_n w_n E_q[t(θ_n)] for the minibatch ``x`` at ``state``.

        The first half of :meth:`update` (local step, SVI+ weights, target),
        exposed so that the noise of λ'_t can be studied on its own.
        """
        model = self.model
        x = model.check_batch(x)
        S = x.shape[0]
        M = self.effective_size(S)
        local = model.local_step(state.lam, x)
        noise_var = S / M - 1.0
        rng_state = state.rng_state
        if noise_var > 0:
            rng = state.rng()
            eps = rng.normal(0.0, math.sqrt(noise_var), size=S)
            weights = 1.0 + eps - eps.mean()
            rng_state = rng.bit_generator.state
            pair = getattr(model, "suffstats_pair", None)
            if pair is not None:
                stats_w, stats = pair(local, x, weights)
            else:
                stats_w, stats = model.suffstats(local, x, weights), model.suffstats(local, x)
        else:
            weights = None
            stats = stats_w = model.suffstats(local, x)
        target = model.prior() + stats_w * (float(self.n_total) / S)
        return Target(target=target, x=x, local=local, stats=stats, weights=weights,
                      effective_batch_size=M, noise_var=noise_var, rng_state=rng_state)

    def update(self, state: EngineState, x) -> tuple[EngineState, UpdateInfo]:
        """One SVI+ step on the minibatch ``x``; returns the new state and its info.

        The input state is not modified. Raises ``ValueError`` for a bad batch
        and ``FloatingPointError`` if the update would make λ non-finite; in
        both cases nothing changed.
        """
        model = self.model
        if hasattr(model, "svi_step"):          # row-wise models (module docs)
            return self._rowwise_update(state, x)
        tg = self.stochastic_target(state, x)
        x, local, stats, target, M = tg.x, tg.local, tg.stats, tg.target, tg.effective_batch_size
        S = x.shape[0]
        N = float(self.n_total)
        scale = N / S
        lam = state.lam
        min_w = 1.0 if tg.weights is None else float(tg.weights.min())
        noise_var = tg.noise_var
        rng_state = tg.rng_state

        t = state.step + 1
        rho = self.schedule(t)
        clipped = blocks = 0
        tau = self.boundary_fraction
        # fraction-to-boundary: ρ_b = min(ρ, τ·s_max). A block is shortened iff
        # s_max < ρ/τ, i.e. iff λ + (ρ/τ)(λ̂ − λ) is outside the domain: one cheap
        # membership test first, the closed-form s_max only when it fails.
        if min_w < 0 and not model.in_domain(
                NatParams({k: lam[k] + (rho / tau) * (target[k] - lam[k]) for k in lam})):
            rho_arr = {}
            for names, limit in model.max_step(lam, target):
                limit = np.asarray(limit, float)
                rho_b = np.minimum(rho, tau * limit)
                clipped += int(np.count_nonzero(rho_b < rho))
                blocks += int(limit.size)
                for nm in names:
                    rho_arr[nm] = rho_b.reshape(rho_b.shape + (1,) * (lam[nm].ndim - rho_b.ndim))
            new_lam = NatParams({k: (1.0 - rho_arr.get(k, rho)) * lam[k] + rho_arr.get(k, rho) * target[k]
                                 for k in lam})
        else:
            new_lam = lam * (1.0 - rho) + target * rho
        if not new_lam.all_finite():
            raise FloatingPointError(f"update {t} would make λ non-finite; state left unchanged")

        # metrics
        elbo = model.global_elbo(lam) + scale * float(np.sum(model.local_elbo(local)))
        if S > 1:
            mean_sq = stats.sqnorm() / (S * S)
            tr_cov = max(0.0, (float(np.sum(model.suffstats_sqnorm(local, x))) - S * mean_sq) / (S - 1))
            grad_var = N * N * tr_cov / M
        else:
            grad_var = float("nan")
        gradient = target - lam
        grad_norm = math.sqrt(gradient.sqnorm())
        info = UpdateInfo(step=t, rho=rho, batch_size=S, effective_batch_size=M,
                          noise_std=math.sqrt(max(noise_var, 0.0)), elbo=elbo,
                          elbo_per_record=elbo / N, grad_variance=grad_var, grad_norm=grad_norm,
                          domain_clipped=clipped, domain_blocks=blocks, min_weight=min_w,
                          gradient=gradient)
        new_state = EngineState(step=t, lam=new_lam, rng_state=rng_state,
                                records_seen=state.records_seen + S)
        return new_state, info

    def _rowwise_update(self, state: EngineState, x) -> tuple[EngineState, UpdateInfo]:
        """:meth:`update` for a model with ``svi_step``: same weights, the model applies the step."""
        model = self.model
        x = model.check_batch(x)
        S = x.shape[0]
        M = self.effective_size(S)
        noise_var = S / M - 1.0
        rng_state, weights = state.rng_state, None
        if noise_var > 0:                       # the same draws as stochastic_target
            rng = state.rng()
            eps = rng.normal(0.0, math.sqrt(noise_var), size=S)
            weights = 1.0 + eps - eps.mean()
            rng_state = rng.bit_generator.state
        t = state.step + 1
        out = model.svi_step(state.lam, state.aux, x, weights=weights, n_total=float(self.n_total),
                             records_before=state.records_seen, schedule=self.schedule, step=t,
                             boundary_fraction=self.boundary_fraction, effective_batch_size=M)
        new_lam = out["lam"]
        if not out.get("checked_finite") and not new_lam.all_finite():
            raise FloatingPointError(f"update {t} would make λ non-finite; state left unchanged")
        N = float(self.n_total)
        info = UpdateInfo(step=t, rho=self.schedule(t), batch_size=S, effective_batch_size=M,
                          noise_std=math.sqrt(max(noise_var, 0.0)), elbo=out["elbo"],
                          elbo_per_record=out["elbo"] / N, grad_variance=out["grad_variance"],
                          grad_norm=out["grad_norm"], domain_clipped=out["domain_clipped"],
                          domain_blocks=out["domain_blocks"],
                          min_weight=1.0 if weights is None else float(weights.min()))
        return EngineState(step=t, lam=new_lam, rng_state=rng_state,
                           records_seen=state.records_seen + S, aux=out["aux"]), info

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
        """Engine settings (not the model's) as JSON-serialisable values."""
        return {"n_total": float(self.n_total), "schedule": self.schedule.to_dict(),
                "effective_batch_size": self.effective_batch_size,
                "effective_fraction": self.effective_fraction,
                "boundary_fraction": self.boundary_fraction, "short_batches": self.short_batches}


def batch_vi(model, n_total) -> SVI:
    """Batch VI (CAVI): ρ = 1, use with ``fit(..., batch_size=None)`` and N = len(X)."""
    return SVI(model, n_total, schedule=Constant(1.0))
