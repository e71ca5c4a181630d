"""Step-size schedules ρ_t for the natural-gradient update.

The update is ``λ ← (1 − ρ_t) λ + ρ_t λ̂_t``. Step ``t`` is 1-based: the first
update of a fresh state uses ``t = 1``.

* :class:`RobbinsMonro` — ``ρ_t = (τ0 + t)^(−κ)`` with ``κ ∈ (0.5, 1]`` and
  ``τ0 ≥ 0`` (Hoffman et al. 2013, eq. 26; seed 004). These satisfy
  ``Σ ρ_t = ∞, Σ ρ_t² < ∞``. An optional floor ``rho_min`` keeps the step
  from vanishing on a drifting stream; with a floor the schedule is *no
  longer Robbins–Monro* (Σ ρ_t² diverges) and the iterates track the stream
  instead of converging.
* :class:`Constant` — ``ρ_t = ρ``. ``Constant(1.0)`` on the full data set is
  batch VI (CAVI).
* :class:`Adjusted` — a schedule with its clock restarted and/or a floor, the
  hook through which a response to drift (:mod:`streamsvi.service.drift`)
  changes ρ without changing the engine's settings.

Examples
--------
>>> s = RobbinsMonro(tau0=1.0, kappa=0.5 + 0.5)
>>> round(s(1), 6), round(s(3), 6)
(0.5, 0.25)
>>> RobbinsMonro(kappa=0.3)
Traceback (most recent call last):
...
ValueError: kappa must be in (0.5, 1], got 0.3
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


class Schedule:
    """A step-size schedule: ``schedule(t) -> ρ_t`` for 1-based step ``t``."""

    def __call__(self, t: int) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError  # pragma: no cover - interface

    def many(self, t) -> np.ndarray:
        """ρ at an array of (real) clocks t ≥ 1, e.g. the per-row clocks of a row block.

        The built-in schedules evaluate their formula with numpy over the array; the
        result can differ from ``self(t)`` in the last bit (numpy's power), so a clock
        that counts whole updates uses :meth:`at_steps`.
        """
        return np.array([self(float(v)) for v in np.asarray(t, dtype=np.float64)])

    def at_steps(self, t) -> np.ndarray:
        """ρ at an array of integer clocks: ``self(t_i)`` exactly, once per distinct clock."""
        vals, idx = np.unique(np.asarray(t), return_inverse=True)
        return np.array([self(int(v)) for v in vals])[idx]


@dataclass(frozen=True)
class RobbinsMonro(Schedule):
    """``ρ_t = max(rho_min, (τ0 + t)^(−κ))``.

    Parameters
    ----------
    tau0 : float
        Delay τ0 ≥ 0; larger values down-weight the first steps.
    kappa : float
        Forgetting rate κ ∈ (0.5, 1].
    rho_min : float or None
        Optional floor in (0, 1]. Leaves Robbins–Monro (see module docs).
    """

    tau0: float = 1.0
    kappa: float = 0.7
    rho_min: float | None = None

    def __post_init__(self):
        if not (isinstance(self.kappa, (int, float)) and 0.5 < self.kappa <= 1.0):
            raise ValueError(f"kappa must be in (0.5, 1], got {self.kappa}")
        if not (isinstance(self.tau0, (int, float)) and math.isfinite(self.tau0) and self.tau0 >= 0):
            raise ValueError(f"tau0 must be a finite number >= 0, got {self.tau0}")
        if self.rho_min is not None and not (0.0 < self.rho_min <= 1.0):
            raise ValueError(f"rho_min must be in (0, 1] or None, got {self.rho_min}")

    def __call__(self, t: int) -> float:
        if t < 1:
            raise ValueError(f"step t is 1-based, got {t}")
        rho = (self.tau0 + t) ** (-self.kappa)
        rho = min(rho, 1.0)
        if self.rho_min is not None:
            rho = max(rho, self.rho_min)
        return float(rho)

    def to_dict(self) -> dict:
        return {"kind": "robbins_monro", "tau0": self.tau0, "kappa": self.kappa,
                "rho_min": self.rho_min}

    def many(self, t) -> np.ndarray:
        rho = np.minimum((self.tau0 + np.asarray(t, dtype=np.float64)) ** (-float(self.kappa)), 1.0)
        return rho if self.rho_min is None else np.maximum(rho, self.rho_min)


@dataclass(frozen=True)
class Constant(Schedule):
    """``ρ_t = rho`` for every step; ``rho`` in (0, 1]."""

    rho: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.rho, (int, float)) and 0.0 < self.rho <= 1.0):
            raise ValueError(f"rho must be in (0, 1], got {self.rho}")

    def __call__(self, t: int) -> float:
        if t < 1:
            raise ValueError(f"step t is 1-based, got {t}")
        return float(self.rho)

    def to_dict(self) -> dict:
        return {"kind": "constant", "rho": self.rho}

    def many(self, t) -> np.ndarray:
        return np.full(len(t), float(self.rho))


@dataclass(frozen=True)
class Adjusted(Schedule):
    """``base`` with its clock restarted at ``offset`` and an optional ``floor``.

    ``ρ_t = max(floor, base(max(1, t − offset)))``: with ``offset = s`` the step
    after s uses ``base(1)`` again (the Robbins–Monro clock restarted from step s);
    ``floor=None`` adds no floor. On the per-row clocks c_i of a row-wise model
    (:meth:`many`, :meth:`at_steps`; PMF's ρ_i) the restarted global clock is a
    lower bound, ``ρ_i = max(floor, base(c_i), base(max(1, now − offset)))``
    with ``now`` the global step about to be taken (the caller keeps it current;
    None: no bound), since a row's own clock does not count global steps.

    An adjustment is the state of whoever made it, not a setting: ``to_dict``
    is ``base.to_dict()``, so a checkpoint's engine settings stay the configured
    ones and the drift monitor saves and re-applies its own response.

    Examples
    --------
    >>> base = RobbinsMonro(tau0=1.0, kappa=1.0)
    >>> a = Adjusted(base, offset=10)
    >>> a(11) == base(1), a(12) == base(2)
    (True, True)
    >>> Adjusted(base, floor=0.2)(100)
    0.2
    >>> Adjusted(base, floor=0.2).to_dict() == base.to_dict()
    True
    """

    base: Schedule
    offset: int = 0
    floor: float | None = None
    now: int | None = None

    def __post_init__(self):
        if not isinstance(self.base, Schedule):
            raise ValueError(f"base must be a Schedule, got {type(self.base).__name__}")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset < 0:
            raise ValueError(f"offset must be an int >= 0, got {self.offset!r}")
        if self.floor is not None and not (0.0 < self.floor <= 1.0):
            raise ValueError(f"floor must be in (0, 1] or None, got {self.floor}")

    def __call__(self, t: int) -> float:
        if t < 1:
            raise ValueError(f"step t is 1-based, got {t}")
        rho = self.base(max(1, t - self.offset))
        return float(rho if self.floor is None else max(rho, self.floor))

    def _bound(self, rho: np.ndarray) -> np.ndarray:
        if self.offset and self.now is not None:
            rho = np.maximum(rho, self.base(max(1, int(self.now) - self.offset)))
        return rho if self.floor is None else np.maximum(rho, self.floor)

    def many(self, t) -> np.ndarray:
        return self._bound(self.base.many(t))

    def at_steps(self, t) -> np.ndarray:
        return self._bound(self.base.at_steps(t))

    def to_dict(self) -> dict:
        return self.base.to_dict()


def schedule_from_dict(d: dict) -> Schedule:
    """Inverse of ``Schedule.to_dict`` (used by checkpoints and configs)."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind == "robbins_monro":
        return RobbinsMonro(**d)
    if kind == "constant":
        return Constant(**d)
    raise ValueError(f"schedule kind must be 'robbins_monro' or 'constant', got {kind!r}")
