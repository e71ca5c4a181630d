"""Annealers: one object per annealing method, each with its schedule (issue 13).

An annealer changes *how* the engine forms its target λ̂_t, never the
reported objective: ``UpdateInfo.elbo`` is always the true, untempered ELBO.
Its level at step t is a pure function of t (``level(t)``), so a resumed
checkpoint continues exactly where it stopped. Step t is 1-based, as for ρ_t.

==================  ========================================================  =============
kind                what it does (docs/design.md, "Annealing")                 ``level(t)``
==================  ========================================================  =============
``none``            plain SVI / batch VI                                       0
``svi+``            seed 000, Algorithm 1: SVI+ weights with effective batch   M_t
                    size M_t (constant, linear or geometric in t)
``deterministic``   detAVI (Katahira et al. 2008; seed 002 §3.2): local        T_t ≥ 1
                    factors q(z) ∝ exp(log-potential / T_t), and the target
                    tempered, λ̂ ← λ̂ / T_t in natural parameters (eq. 8)
``stochastic``      stochAVI (seed 002 §3.3, eq. 12, Algorithm 1): the target  ρ_t ∈ [0, 1]
                    is (1 − ρ_t) λ̂ + ρ_t η_t, η_t a fresh random
                    initialisation of λ (``model.random_init``)
==================  ========================================================  =============

Schedules (``n`` = ``n_steps``; after it the annealer is plain SVI/VI, bit for bit):

* ``SVIPlus``: constant M_t = M0; linear M_t = min(|S_t|, M0 + m·t) (the growing M
  of seed 000's PMF experiment); geometric M_t = min(|S_t|, M0·g^t).
* ``Deterministic``: geometric T_t = 1 + (T0 − 1)·r^(t−1), linear
  T_t = 1 + (T0 − 1)·max(0, 1 − t/n), inverse T_t = 1/(1 − (1 − 1/T0)·r^(t−1));
  T_t = 1 for t > n. Seed 002 §4 writes T_t = 5(1 − ρ_t)^(−1) with ρ_t = 0.9^t,
  which tends to 5, not 1, so its final objective would still be tempered. Two
  readings are offered: the default, geometric, "start at 5, cool at rate 0.9"
  (T0 = 5, r = 0.9, n = 100; T_100 − 1 = 1.2e-4), and seed 002 §3.3's
  T_t = (1 − ρ_t)^(−1) with ρ_t = 0.9^t, i.e. T_t = (1 − 0.9^t)^(−1) (T_1 = 10,
  T_2 = 5.26, T_3 = 3.69, …): ``Deterministic(T0=10, schedule="inverse")``
  (the inverse schedule with T0 = 1/(1 − r)). Dirichlet blocks are tempered as
  ``dirichlet="natural"`` (default: the natural parameter α − 1 divided by T,
  α_T = 1 + (α − 1)/T, Katahira et al.'s eq. 8 read on α − 1) or
  ``dirichlet="concentration"`` (α_T = α/T, seed 002 eq. 8 read on the
  concentrations); the two differ by 1 − 1/T pseudo-counts on every entry.
  ``jitter`` ε > 0 multiplies every entry of the target's Dirichlet blocks by
  exp(ε z), z ~ N(0, 1) from the state's random stream, on every cooling step
  (``jitter_at="cooling"``: each t with T_t > 1 and the first with T_t = 1) or
  only when T reaches 1 (``"crossing"``): a symmetry-breaking perturbation,
  off by default (ε = 0: nothing is drawn, bit-identical to no jitter).
* ``Stochastic``: geometric ρ_t = ρ0·d^(t−1) (ρ0 = d = 0.9 is the paper's 0.9^t),
  linear ρ_t = ρ0·max(0, 1 − t/n) (ρ0 = 0.25, n = 50 is the paper's HMM
  setting); ρ_t = 0 for t > n (default n = 100 for geometric). ``local_restart=True``
  (LDA) also mixes each document's q(π_d) with a fresh draw, seed 002 §4.1.

Examples
--------
>>> a = Deterministic(T0=5.0, rate=0.9, n_steps=3)
>>> [round(a.level(t), 3) for t in (1, 2, 3, 4)]
[5.0, 4.6, 4.24, 1.0]
>>> annealer_from_dict(a.to_dict()) == a
True
>>> p = Deterministic(T0=10.0, schedule="inverse")      # seed 002 §3.3: T_t = (1 − 0.9^t)^−1
>>> [round(p.level(t), 3) for t in (1, 2, 3)]
[10.0, 5.263, 3.69]
>>> Stochastic(rho0=0.25, schedule="linear", n_steps=50).level(25)
0.125
>>> SVIPlus(20, schedule="linear", increment=5).effective_size(3, batch_size=100)
35.0
>>> annealer_from_dict({"kind": "annealing"})
Traceback (most recent call last):
...
ValueError: annealing kind must be one of none, svi+, deterministic, stochastic; got 'annealing'
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..models.base import Model, NatParams, RandomRestart, Tempered
from ..models.blocks import DenseBlock, Dirichlet, blocks_temper

KINDS = ("none", "svi+", "deterministic", "stochastic")


def supported_kinds(model) -> tuple:
    """The annealing kinds ``model`` supports: its ``annealing_kinds`` declaration.

    Without one, a model on the engine's dense path supports all four kinds
    (the engine tempers its target block by block and restarts it); a model of
    row blocks (``row_blocks``, whose rows are its only latent variables)
    supports only ``none`` and ``svi+`` unless it declares more (PMF declares ``("none", "svi+")``). LDA declares all
    four: its step is the engine's own, on the scaled-columns storage, which takes
    T_t, ρ_t and η_t from the same random stream as the dense path.
    """
    if isinstance(model, Model):
        return tuple(model.annealing_kinds)
    return ("none", "svi+") if model.row_blocks else KINDS


def _number(name, v, lo=None, hi=None, lo_open=False, allow_none=False, integer=False):
    if v is None and allow_none:
        return None
    ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    if ok and integer:
        ok = float(v).is_integer()
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v <= hi
    if not ok:
        rng = ("(" if lo_open else "[") + f"{lo:g}, " + (f"{hi:g}]" if hi is not None else "inf)") \
            if lo is not None else "a finite number"
        what = "an integer in " if integer else "a number in "
        raise ValueError(f"{name} must be {what if lo is not None else ''}{rng}, got {v!r}")
    return v


def _choice(name, v, choices):
    if v not in choices:
        raise ValueError(f"{name} must be one of {', '.join(repr(c) for c in choices)}, got {v!r}")


class Annealer:
    """Base class: ``level(t)`` (a pure function of the 1-based step t) and ``to_dict()``.

    The engine asks three questions, each answered from ``t`` alone:
    ``temperature(t)`` (T_t, 1 unless deterministic), ``restart_weight(t)``
    (ρ_t of the random restart, 0 unless stochastic) and
    ``effective_size(t, batch_size)`` (M_t, |S_t| unless SVI+).
    """

    kind = "none"

    def level(self, t: int) -> float:
        return 0.0

    def temperature(self, t: int) -> float:
        return 1.0

    def restart_weight(self, t: int) -> float:
        return 0.0

    def effective_size(self, t: int, batch_size: int) -> float:
        return float(batch_size)

    def to_dict(self) -> dict:
        return {"kind": self.kind, **asdict(self)}

    def temper_target(self, model, target: NatParams, T: float) -> NatParams:
        """λ̂ tempered at T, block by block (each family's ``temper``; the engine's dense path)."""
        return blocks_temper(model.param_blocks, target, T)

    def perturb_target(self, model, target: NatParams, t: int, rng_state):
        """``(target, rng_state)`` after this annealer's perturbation at step t (none here)."""
        return target, rng_state

    def restart_local(self, model, local, t: int, rng_state):
        """``(local, rng_state)`` after this annealer's restart of the local factors (none here)."""
        return local, rng_state

    def dirichlet_shift(self, T: float) -> float:
        """What is subtracted from a Dirichlet block tempered as 1 + (α − 1)/T (0 here)."""
        return 0.0

    def check_model(self, model) -> None:
        """Raise ``ValueError`` if this annealer is not defined for ``model``.

        A model declares the kinds it supports in ``annealing_kinds`` (see
        :func:`supported_kinds`); deterministic and stochastic annealing also need
        ``model.temper`` and ``model.random_init``.
        """
        kinds = supported_kinds(model)
        if self.kind not in kinds:
            why = ""
            if self.kind in ("deterministic", "stochastic") and model.row_blocks:
                why = (" (this kind tempers or restarts local latent assignments q(z) and their "
                       "global counts; a row-wise model applies its own step, and this one's step "
                       "does not temper or restart)")
            raise ValueError(
                f"annealing kind {self.kind!r} is not defined for model {model.name!r}: it declares "
                f"annealing_kinds {list(kinds)}{why}; use kind {' or '.join(repr(k) for k in kinds)}")
        if self.kind == "stochastic" and not isinstance(model, RandomRestart):
            raise ValueError(f"annealing kind 'stochastic' needs model.random_init; "
                             f"model {model.name!r} has none")
        if self.kind == "deterministic" and not isinstance(model, Tempered):
            raise ValueError(f"annealing kind 'deterministic' needs the model's param_blocks "
                             f"(each family tempers its block) or model.temper; "
                             f"model {model.name!r} has none")

    def _check_t(self, t):
        if t < 1:
            raise ValueError(f"step t is 1-based, got {t}")


@dataclass(frozen=True)
class NoAnnealing(Annealer):
    """Plain SVI / batch VI. ``level(t) = 0``."""

    kind = "none"

    def to_dict(self) -> dict:
        return {"kind": "none"}


@dataclass(frozen=True)
class SVIPlus(Annealer):
    """SVI+ (seed 000, Algorithm 1) with effective batch size M_t.

    Parameters
    ----------
    M0 : float or None
        M at the start (> 0). Exactly one of ``M0`` and ``fraction`` is set.
    schedule : {"constant", "linear", "geometric"}
        M_t = M0; min(|S_t|, M0 + increment·t); min(|S_t|, M0·growth^t).
    increment : float
        m > 0 of the linear schedule (records per step).
    growth : float
        g > 1 of the geometric schedule.
    fraction : float or None
        Constant M = fraction·|S_t|, fraction in (0, 1] (for batches of varying size).

    A constant M larger than |S_t| is an error (or plain SVI for that batch,
    with the engine's ``short_batches="svi"``); a scheduled M_t is capped at
    |S_t|, where it is plain SVI bit for bit.
    """

    M0: float | None = None
    schedule: str = "constant"
    increment: float = 1.0
    growth: float = 1.1
    fraction: float | None = None

    kind = "svi+"

    def __post_init__(self):
        _choice("svi+ schedule", self.schedule, ("constant", "linear", "geometric"))
        if (self.M0 is None) == (self.fraction is None):
            raise ValueError("svi+ needs exactly one of M0 (the effective batch size M) and fraction")
        _number("svi+ M0 (effective batch size)", self.M0, 0, lo_open=True, allow_none=True)
        _number("svi+ fraction", self.fraction, 0, 1, lo_open=True, allow_none=True)
        if self.fraction is not None and self.schedule != "constant":
            raise ValueError("svi+ fraction is a constant M = fraction·|S|; a linear or geometric "
                             "schedule needs M0")
        _number("svi+ increment", self.increment, 0, lo_open=True)
        _number("svi+ growth", self.growth, 1, lo_open=True)

    def level(self, t: int) -> float:
        """M_t before the cap at |S_t| (for ``fraction``: the fraction)."""
        self._check_t(t)
        if self.fraction is not None:
            return float(self.fraction)
        if self.schedule == "linear":
            return float(self.M0 + self.increment * t)
        if self.schedule == "geometric":
            return float(self.M0 * self.growth ** t)
        return float(self.M0)

    def effective_size(self, t: int, batch_size: int) -> float:
        if self.fraction is not None:
            return self.fraction * batch_size
        if self.schedule == "constant":
            return float(self.M0)           # the engine checks M ≤ |S| (short_batches)
        return min(float(batch_size), self.level(t))


@dataclass(frozen=True)
class Deterministic(Annealer):
    """detAVI: temperature T_t ≥ 1 on the entropy, T_t → 1 (seed 002 §3.2, eq. 7–8).

    Parameters
    ----------
    T0 : float
        T_1 ≥ 1 (default 5, seed 002 §4).
    schedule : {"geometric", "linear", "inverse"}
        T_t = 1 + (T0 − 1)·rate^(t−1); 1 + (T0 − 1)·max(0, 1 − t/n_steps); or
        1/(1 − (1 − 1/T0)·rate^(t−1)), which with T0 = 1/(1 − rate) is seed 002
        §3.3's T_t = (1 − ρ_t)^(−1), ρ_t = rate^t (T0 = 10 for rate 0.9).
    rate : float
        r in (0, 1) of the geometric and inverse schedules (default 0.9).
    n_steps : int
        T_t = 1 exactly for t > n_steps (default 100).
    dirichlet : {"natural", "concentration"}
        How a Dirichlet block of the target is tempered: α_T = 1 + (α − 1)/T
        (default: its natural parameter α − 1 divided by T) or α_T = α/T.
    jitter : float
        ε ≥ 0 of the symmetry-breaking perturbation: every entry α of the
        target's Dirichlet blocks becomes α·exp(ε z), z ~ N(0, 1) drawn from the
        state's random stream (other families are left as they are). Default 0:
        off, nothing drawn.
    jitter_at : {"cooling", "crossing"}
        The steps that jitter: every t ≤ n_steps + 1 with a cooling phase (each
        step with T_t > 1 and the first with T_t = 1), or only the first step
        with T_t = 1.

    ``dirichlet="concentration"`` tempers the global Dirichlet blocks (the
    GMM's weights, every HMM block, LDA's topics through its scaled-columns
    storage); a local Dirichlet in a model's own tempered local step (LDA's
    q(π_d)) keeps 1 + (α − 1)/T. The jitter is defined on the engine's dense
    path only (``model.param_blocks`` of dense blocks: GMM, HMM, Poisson
    mixture, …); LDA's storage refuses it.
    """

    T0: float = 5.0
    schedule: str = "geometric"
    rate: float = 0.9
    n_steps: int = 100
    dirichlet: str = "natural"
    jitter: float = 0.0
    jitter_at: str = "cooling"

    kind = "deterministic"

    def __post_init__(self):
        _choice("deterministic schedule", self.schedule, ("geometric", "linear", "inverse"))
        _number("deterministic T0 (initial temperature)", self.T0, 1)
        _number("deterministic rate", self.rate, 0, 1, lo_open=True)
        if self.rate == 1:
            raise ValueError("deterministic rate must be in (0, 1), got 1")
        _number("deterministic n_steps", self.n_steps, 1, integer=True)
        _choice("deterministic dirichlet (tempering of Dirichlet blocks)", self.dirichlet,
                ("natural", "concentration"))
        _number("deterministic jitter (symmetry-breaking ε)", self.jitter, 0)
        _choice("deterministic jitter_at", self.jitter_at, ("cooling", "crossing"))

    def to_dict(self) -> dict:
        d = super().to_dict()
        # settings at their defaults are left out, so older configs and checkpoints compare equal
        for k, v in (("dirichlet", "natural"), ("jitter", 0.0), ("jitter_at", "cooling")):
            if d[k] == v:
                del d[k]
        return d

    def level(self, t: int) -> float:
        self._check_t(t)
        if t > self.n_steps or self.T0 == 1:
            return 1.0
        if self.schedule == "linear":
            return 1.0 + (self.T0 - 1.0) * max(0.0, 1.0 - t / self.n_steps)
        if self.schedule == "inverse":
            return 1.0 / (1.0 - (1.0 - 1.0 / self.T0) * self.rate ** (t - 1))
        return 1.0 + (self.T0 - 1.0) * self.rate ** (t - 1)

    temperature = level

    def check_model(self, model) -> None:
        super().check_model(model)
        storage = model.global_storage
        if self.jitter > 0 and (storage != "dense" or model.row_blocks):
            raise ValueError(
                f"deterministic jitter={self.jitter!r} is defined on the engine's dense path only; model "
                f"{model.name!r} keeps its parameters in its own storage "
                f"({storage if storage != 'dense' else 'row blocks'}); use jitter=0")
        if self.jitter > 0 and not _dirichlet_blocks(model):
            raise ValueError(f"deterministic jitter perturbs Dirichlet blocks; model {model.name!r} has none")

    def dirichlet_shift(self, T: float) -> float:
        """1 − 1/T for ``dirichlet="concentration"`` (α/T = [1 + (α − 1)/T] − (1 − 1/T)), else 0."""
        return 1.0 - 1.0 / T if self.dirichlet == "concentration" and T != 1.0 else 0.0

    def temper_target(self, model, target: NatParams, T: float) -> NatParams:
        """λ̂ tempered at T; Dirichlet blocks as ``self.dirichlet`` says (class docs)."""
        out = blocks_temper(model.param_blocks, target, T)
        shift = self.dirichlet_shift(T)
        if shift:
            out = out.copy() if out is target else out
            for name in _dirichlet_blocks(model):
                out[name][...] -= shift
        return out

    def jitters(self, t: int) -> bool:
        """Whether step t is perturbed (``jitter`` > 0 and t a cooling or the crossing step)."""
        if self.jitter == 0 or self.T0 == 1:
            return False
        was_hot = t >= 2 and self.level(t - 1) > 1.0
        if self.jitter_at == "cooling":
            return self.level(t) > 1.0 or was_hot
        return self.level(t) == 1.0 and was_hot

    def perturb_target(self, model, target: NatParams, t: int, rng_state):
        """α ← α·exp(ε z) on every Dirichlet entry of ``target`` at a jittered step (class docs).

        z is drawn from the random stream ``rng_state`` (a PCG64 state), whose advanced state
        is returned; on any other step the target and the stream are returned unchanged.
        """
        if not self.jitters(t):
            return target, rng_state
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = rng_state
        out = target.copy()
        for name in _dirichlet_blocks(model):
            a = out[name]
            a *= np.exp(self.jitter * rng.standard_normal(a.shape))
        return out, rng.bit_generator.state


def _dirichlet_blocks(model) -> list:
    """Names of the arrays of ``model``'s dense Dirichlet blocks."""
    return [n for b in model.param_blocks if isinstance(b, DenseBlock)
            and isinstance(b.family, Dirichlet) for n in b.names]


@dataclass(frozen=True)
class Stochastic(Annealer):
    """stochAVI: λ̂ ← (1 − ρ_t) λ̂ + ρ_t η_t, η_t a fresh random initialisation (seed 002 eq. 12).

    Parameters
    ----------
    rho0 : float
        ρ_1 scale in [0, 1] (0: plain SVI/VI). Default 0.9.
    schedule : {"geometric", "linear"}
        ρ_t = rho0·decay^(t−1), or rho0·max(0, 1 − t/n_steps).
    decay : float
        d in (0, 1) of the geometric schedule (default 0.9: the paper's 0.9^t).
    n_steps : int
        ρ_t = 0 for t > n_steps: plain updates after (default 100).
    local_restart : bool
        Also restart each document's q(π_d) (seed 002 §4.1, LDA only):
        γ_d ← (1 − ρ_t) γ_d + ρ_t η_d, η_d = (c/K)·Dirichlet(1, …, 1) from the state's
        random stream, φ recomputed at the mixed γ (``LDA.restart_documents``). Default
        False: only the global λ is restarted.
    """

    rho0: float = 0.9
    schedule: str = "geometric"
    decay: float = 0.9
    n_steps: int = 100
    local_restart: bool = False

    kind = "stochastic"

    def __post_init__(self):
        _choice("stochastic schedule", self.schedule, ("geometric", "linear"))
        _number("stochastic rho0", self.rho0, 0, 1)
        _number("stochastic decay", self.decay, 0, 1, lo_open=True)
        if self.decay == 1:
            raise ValueError("stochastic decay must be in (0, 1), got 1")
        _number("stochastic n_steps", self.n_steps, 1, integer=True)
        if not isinstance(self.local_restart, bool):
            raise ValueError(f"stochastic local_restart must be true or false, got {self.local_restart!r}")

    def to_dict(self) -> dict:
        d = super().to_dict()
        if not d["local_restart"]:          # the default stays out (older configs compare equal)
            del d["local_restart"]
        return d

    def check_model(self, model) -> None:
        super().check_model(model)
        if self.local_restart and model.global_storage != "scaled_columns":
            raise ValueError(f"stochastic local_restart restarts LDA's document proportions q(π_d) "
                             f"(seed 002 §4.1); model {model.name!r} has none: use local_restart=false")

    def restart_local(self, model, local, t: int, rng_state):
        """The document-level restart at step t (class docs), drawn from ``rng_state``."""
        rho = self.level(t)
        if not self.local_restart or rho == 0:
            return local, rng_state
        rng = np.random.Generator(np.random.PCG64())
        rng.bit_generator.state = rng_state
        local = model.restart_documents(local, rng, rho)
        return local, rng.bit_generator.state

    def level(self, t: int) -> float:
        self._check_t(t)
        if t > self.n_steps or self.rho0 == 0:
            return 0.0
        if self.schedule == "linear":
            return self.rho0 * max(0.0, 1.0 - t / self.n_steps)
        return self.rho0 * self.decay ** (t - 1)

    restart_weight = level


_CLASSES = {"none": NoAnnealing, "svi+": SVIPlus, "deterministic": Deterministic,
            "stochastic": Stochastic}


def annealer_from_dict(d: dict) -> Annealer:
    """Inverse of ``Annealer.to_dict`` (checkpoints, configs, the river faces).

    Raises ``ValueError`` naming an unknown kind or setting.
    """
    if isinstance(d, Annealer):
        return d
    if not isinstance(d, dict):
        raise ValueError(f"annealing must be a dict with a 'kind' or an Annealer, got {type(d).__name__}")
    d = dict(d)
    kind = d.pop("kind", None)
    cls = _CLASSES.get(kind)
    if cls is None:
        raise ValueError(f"annealing kind must be one of {', '.join(KINDS)}; got {kind!r}")
    known = set(cls.__dataclass_fields__)
    extra = sorted(set(d) - known)
    if extra:
        raise ValueError(f"annealing kind {kind!r}: unknown setting(s) {extra}; "
                         f"known: {sorted(known) or 'none'}")
    return cls(**d)
