"""Drift that the learner answers: a change detector on the prequential log predictive
density, and a response that changes the engine's step size or annealing (issue 26, item 5).

With ρ_t → 0 the learner cannot follow a stream that changes. The monitor watches
each minibatch's mean log predictive density (lpd) at the λ *before* the minibatch
is learned (prequential evaluation, river's convention), runs a detector from
river's :mod:`river.drift` on it, and on a detected change applies the configured
response to the engine, from the next update on:

=============  =====================================================================
``response``   what happens after a detection at step s (``drift.*`` settings)
=============  =====================================================================
``floor``      ρ_t ≥ ``rho_floor`` for ``floor_steps`` updates (t = s + 1 … s + floor_steps),
               then the schedule as configured again
``restart``    the step clock restarted: ρ_t = base(t − s), i.e. ρ_{s+1} = ρ_1, ρ_{s+2} = ρ_2, …
               (the Robbins–Monro schedule from its start). Permanent: the next detection
               restarts it again. Row-wise models (PMF, HPF), whose ρ_i runs on per-row
               clocks, get ρ_i ≥ base(t − s) (:class:`~streamsvi.inference.schedules.Adjusted`)
``reanneal``   the engine's annealer (``inference.annealing``, deterministic or stochastic,
               papers/002) restarted: its level at step t is its level at t − s, so T_t
               (or the restart weight) starts again from T_0 and cools for its ``n_steps``
=============  =====================================================================

The responses act through two hooks, never through the engine's settings: the
engine's ``schedule`` is replaced by an
:class:`~streamsvi.inference.schedules.Adjusted` around the configured one, and
its ``annealer`` by a :class:`Reannealed` around the configured one. Both write
the configured settings in ``to_dict``, so a checkpoint's engine settings and
``check_compatible`` are unchanged; the response in progress is the monitor's
state (:meth:`DriftMonitor.to_dict`), which the checkpoint keeps beside λ and
:meth:`DriftMonitor.load_dict` re-applies.

What the detector sees. lpd is in nats per record of whatever the model scores
(GMM: a vector; LDA: a document; PMF: a rating), so it is put in units of its own
batch-to-batch noise first: z_t = (lpd_t − lpd_0) / σ̂, σ̂ = median |lpd_t − lpd_{t−1}| /
(0.6745 √2) over the last ``warmup`` differences (a robust standard deviation of
one batch's lpd that a trend or a single step hardly moves), σ̂ and lpd_0 taken
when the detector (re)starts and fixed for its life. Nothing is detected
during the first ``warmup`` batches. Only **drops** count by default
(``direction = "drop"``): a drop in lpd is a stream the model explains worse; a
rise (the model learning, or an easier stream) needs no faster learning.
Page–Hinkley runs in its ``mode = "down"`` (``"both"`` with ``direction =
"both"``); ADWIN sees both directions and its detection is kept only when the
mean of its last 5 values is below that of the rest of its window. After a detection
the detector starts afresh (a new instance), so one change is reported once.
river's ADWIN also empties its window after a cut it makes on a rise, so a drop
within about ``grace_period`` batches after such a cut can go unseen.

Interface (what the daemon calls; ``bench/drift.py`` drives the engine in process
with this same class and the same calls; docs/drift.md)::

    monitor = DriftMonitor.from_config(cfg, engine)  # None when drift.detector = "none"
    event = monitor.observe(state, lpd, n)           # once per batch, after the update
    metrics.observe_drift(monitor, event)            # streamsvi_drift_* (service.metrics)
    meta["drift"] = monitor.to_dict()                # in the checkpoint (JSON, no pickle)
    monitor.load_dict(meta["drift"])                 # on resume, after from_config

``observe`` reads ``state.step`` (the update just applied; the response takes
effect from update ``state.step + 1``) and never modifies the state. It returns
None or a :class:`DriftEvent`, after applying the response, and logs the event's
:meth:`DriftEvent.message` at WARNING (and the end of a floor or a re-annealing
at INFO). Metrics: ``streamsvi_drift_detected_total{detector,response}``,
``streamsvi_drift_response_active`` (1 while a floor or a re-annealing is in
force), ``streamsvi_drift_last_detection_step``.

Examples
--------
>>> from streamsvi.models import BayesianGMM
>>> from streamsvi.inference.engine import SVI
>>> engine = SVI(BayesianGMM(2, 2), n_total=1000)
>>> m = DriftMonitor(engine, detector="page_hinkley", response="floor", rho_floor=0.3,
...                  floor_steps=5)
>>> m.respond(step=40)["until"]
45
>>> [round(engine.schedule(t), 3) for t in (41, 45)], round(engine.schedule(46), 3) < 0.3
([0.3, 0.3], False)
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from ..inference.annealing import Annealer
from ..inference.schedules import Adjusted

log = logging.getLogger(__name__)

DETECTORS = ("none", "page_hinkley", "adwin")
RESPONSES = ("floor", "restart", "reanneal")
DIRECTIONS = ("drop", "both")
#: z values kept to rebuild the detector on :meth:`DriftMonitor.load_dict` (since its last reset)
REPLAY_MAX = 5000
FORMAT = "streamsvi.drift/1"
#: ADWIN's direction is read from the mean of its last RECENT values against the rest
RECENT = 5


@dataclass(frozen=True)
class DriftEvent:
    """One detected change and the response applied.

    ``step``: the engine step of the batch whose lpd made the detection (the
    response acts from ``step + 1``); ``detector``, ``response``: the settings'
    names; ``detail``: lpd, z, σ̂, the means before/after, ρ of the next update,
    the step the response ends (``until``; None for a restart).
    """

    step: int
    detector: str
    response: str
    detail: dict = field(default_factory=dict)

    def message(self) -> str:
        """The log line: ``drift detected at step 120 by page_hinkley (batch lpd -9.41 nats,
        sd 0.12): response floor, rho >= 0.1 until step 220``."""
        d = self.detail
        what = {"floor": f"rho >= {d.get('rho_floor')} until step {d.get('until')}",
                "restart": f"step clock restarted (next rho {d.get('rho_next', float('nan')):.4g})",
                "reanneal": f"annealer restarted until step {d.get('until')}"}[self.response]
        return (f"drift detected at step {self.step} by {self.detector} (batch lpd "
                f"{d.get('lpd', float('nan')):.4g} nats, sd {d.get('sigma', float('nan')):.3g}): "
                f"response {self.response}, {what}")

    def to_dict(self) -> dict:
        return {"step": self.step, "detector": self.detector, "response": self.response,
                "detail": dict(self.detail)}


class Reannealed(Annealer):
    """``base`` with its clock restarted at ``offset``: every level at step t is
    ``base``'s at ``max(1, t − offset)``. ``to_dict`` is ``base.to_dict()`` (a
    response, not a setting; module docs). Only for annealers that end (deterministic,
    stochastic): the engine treats SVI+ by its type."""

    def __init__(self, base: Annealer, offset: int):
        if base.kind not in ("deterministic", "stochastic"):
            raise ValueError(f"only a deterministic or stochastic annealer can be restarted, "
                             f"got {base.kind!r}")
        self.base, self.offset, self.kind = base, int(offset), base.kind

    def _t(self, t):
        return max(1, int(t) - self.offset)

    def level(self, t):
        return self.base.level(self._t(t))

    def temperature(self, t):
        return self.base.temperature(self._t(t))

    def restart_weight(self, t):
        return self.base.restart_weight(self._t(t))

    def effective_size(self, t, batch_size):
        return self.base.effective_size(self._t(t), batch_size)

    def perturb_target(self, model, target, t, rng_state):
        return self.base.perturb_target(model, target, self._t(t), rng_state)

    def restart_local(self, model, local, t, rng_state):
        return self.base.restart_local(model, local, self._t(t), rng_state)

    def temper_target(self, model, target, T):
        return self.base.temper_target(model, target, T)

    def dirichlet_shift(self, T):
        return self.base.dirichlet_shift(T)

    def check_model(self, model):
        self.base.check_model(model)

    def to_dict(self) -> dict:
        return self.base.to_dict()

    def __eq__(self, other):
        return isinstance(other, Reannealed) and (self.base, self.offset) == (other.base, other.offset)

    def __repr__(self):
        return f"Reannealed({self.base!r}, offset={self.offset})"


def check_config(cfg: dict) -> None:
    """The ``[drift]`` rules that span sections; raises ``ConfigError`` naming the field."""
    from .config import ConfigError
    d = cfg.get("drift")
    if not d or d["detector"] == "none":
        return
    if d["response"] == "reanneal":
        ann = (cfg.get("inference") or {}).get("annealing") or {}
        if ann.get("kind") not in ("deterministic", "stochastic"):
            raise ConfigError(f"drift.response: 'reanneal' restarts the engine's annealer, which "
                              f"must be deterministic or stochastic (inference.annealing.kind), got "
                              f"{ann.get('kind', 'none')!r}; or use response = 'floor' or 'restart'")
    if (cfg.get("metrics") or {}).get("evaluation", "prequential") != "prequential":
        raise ConfigError("drift.detector: the detector reads the prequential log predictive density; "
                          "set metrics.evaluation = 'prequential' (the default) or drift.detector = 'none'")
    if d["response"] == "floor" and d["rho_floor"] is None:
        raise ConfigError("drift.rho_floor: required for response = 'floor' (a number in (0, 1])")
    if d["rho_floor"] is not None and not 0 < d["rho_floor"] <= 1:
        raise ConfigError(f"drift.rho_floor: must be in (0, 1], got {d['rho_floor']:g}")


def _robust_sd(diffs) -> float:
    a = sorted(abs(v) for v in diffs)
    if not a:
        return float("nan")
    m = len(a) // 2
    med = a[m] if len(a) % 2 else 0.5 * (a[m - 1] + a[m])
    return med / (0.6745 * math.sqrt(2.0))


class DriftMonitor:
    """Detect drops in the prequential lpd and answer them (module docs).

    Parameters
    ----------
    engine : SVI or GradientVI
        The engine whose ``schedule`` (and ``annealer``) the response adjusts; the
        ones it has now are the configured ones the adjustments wrap.
    detector : {"page_hinkley", "adwin"}
    response : {"floor", "restart", "reanneal"}
    rho_floor, floor_steps :
        The floor response: ρ_t ≥ rho_floor for floor_steps updates.
    warmup : int
        Batches before the first detection; also the window of σ̂.
    direction : {"drop", "both"}
    threshold, delta, min_instances :
        Page–Hinkley's λ, δ (both in units of σ̂) and its minimum number of values;
        its fading factor α is 1 (the running mean forgets nothing until a reset).
    adwin_delta, adwin_clock, grace_period :
        ADWIN's confidence δ, how often it checks (values) and its grace period.
    """

    def __init__(self, engine, detector: str = "page_hinkley", response: str = "floor", *,
                 rho_floor: float | None = 0.2, floor_steps: int = 30, warmup: int = 20,
                 direction: str = "drop", threshold: float = 15.0, delta: float = 0.5,
                 min_instances: int = 10, adwin_delta: float = 0.002, adwin_clock: int = 1,
                 grace_period: int = 10):
        for name, v, choices in (("detector", detector, DETECTORS[1:]), ("response", response, RESPONSES),
                                 ("direction", direction, DIRECTIONS)):
            if v not in choices:
                raise ValueError(f"drift.{name} must be one of {', '.join(choices)}; got {v!r}")
        if response == "floor" and not (rho_floor is not None and 0 < rho_floor <= 1):
            raise ValueError(f"drift.rho_floor must be in (0, 1] for response 'floor', got {rho_floor}")
        for name, v in (("floor_steps", floor_steps), ("warmup", warmup), ("min_instances", min_instances),
                        ("adwin_clock", adwin_clock), ("grace_period", grace_period)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"drift.{name} must be an integer >= 1, got {v!r}")
        self.engine = engine
        self.detector, self.response, self.direction = detector, response, direction
        self.rho_floor, self.floor_steps, self.warmup = rho_floor, floor_steps, warmup
        self.threshold, self.delta, self.min_instances = float(threshold), float(delta), min_instances
        self.adwin_delta, self.adwin_clock, self.grace_period = float(adwin_delta), adwin_clock, grace_period
        sched, ann = engine.schedule, getattr(engine, "annealer", None)
        # the configured ones (unwrapped, should the engine carry an earlier monitor's response)
        self.base_schedule = sched.base if isinstance(sched, Adjusted) else sched
        self.base_annealer = ann.base if isinstance(ann, Reannealed) else ann
        if response == "reanneal":
            kind = getattr(self.base_annealer, "kind", "none")
            if kind not in ("deterministic", "stochastic"):
                raise ValueError(f"drift.response 'reanneal' needs the engine's annealer to be "
                                 f"deterministic or stochastic, got {kind!r}")
        # response state (saved by to_dict)
        self.offset = 0                 # clock restarted at this step (restart)
        self.floor_until = 0            # floor in force for updates t <= floor_until
        self.anneal_offset = None       # annealer restarted at this step (reanneal)
        self.detections: list[dict] = []
        self._step = 0                  # the engine step of the last batch observed
        # detector state
        self._prev = None
        self._diffs: list[float] = []
        self._seen = 0
        self._replay: list[float] = []
        self._scale = self._origin = None      # σ̂ and the lpd z is measured from, per detector life
        self._det = self._new_detector()

    # ------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, cfg: dict, engine) -> "DriftMonitor | None":
        """The monitor of ``cfg["drift"]`` (validated config) on ``engine``; None for detector none."""
        d = cfg["drift"]
        if d["detector"] == "none":
            return None
        return cls(engine, detector=d["detector"], response=d["response"], rho_floor=d["rho_floor"],
                   floor_steps=d["floor_steps"], warmup=d["warmup"], direction=d["direction"],
                   threshold=d["threshold"], delta=d["delta"], min_instances=d["min_instances"],
                   adwin_delta=d["adwin_delta"], adwin_clock=d["adwin_clock"],
                   grace_period=d["grace_period"])

    def _new_detector(self):
        from river import drift
        if self.detector == "page_hinkley":
            return drift.PageHinkley(min_instances=self.min_instances, delta=self.delta,
                                     threshold=self.threshold, alpha=1.0,
                                     mode="down" if self.direction == "drop" else "both")
        return drift.ADWIN(delta=self.adwin_delta, clock=self.adwin_clock,
                           grace_period=self.grace_period)

    # ------------------------------------------------------------------ state
    @property
    def active(self) -> bool:
        """True while a floor or a re-annealing is in force (a restart is instantaneous)."""
        return self._floor_on(self._step + 1) or self._anneal_on(self._step + 1)

    def _floor_on(self, t: int) -> bool:
        return t <= self.floor_until

    def _anneal_on(self, t: int) -> bool:
        if self.anneal_offset is None:
            return False
        n = getattr(self.base_annealer, "n_steps", None)
        return n is None or t - self.anneal_offset <= int(n)

    def _install(self, step: int) -> None:
        """Put the engine's schedule and annealer in the state of the response at update step + 1."""
        t = step + 1
        floor = self.rho_floor if self._floor_on(t) else None
        if self.offset or floor is not None:
            self.engine.schedule = Adjusted(self.base_schedule, offset=self.offset, floor=floor, now=t)
        else:
            self.engine.schedule = self.base_schedule
        if hasattr(self.engine, "annealer"):             # the gradient path has none
            self.engine.annealer = (Reannealed(self.base_annealer, self.anneal_offset)
                                    if self._anneal_on(t) else self.base_annealer)

    def respond(self, step: int) -> dict:
        """Apply the response to a change detected at ``step`` (from update step + 1 on);
        returns what the event's detail says about it. Public for tests and benches."""
        self._step = int(step)
        if self.response == "floor":
            self.floor_until = step + self.floor_steps
            out = {"rho_floor": self.rho_floor, "until": self.floor_until}
        elif self.response == "restart":
            self.offset = int(step)
            out = {"until": None}
        else:
            self.anneal_offset = int(step)
            n = getattr(self.base_annealer, "n_steps", None)
            out = {"until": None if n is None else step + int(n)}
        self._install(step)
        out["rho_next"] = float(self.engine.schedule(step + 1))
        return out

    # ---------------------------------------------------------------- observe
    def observe(self, state, lpd: float, n: int):
        """Feed one batch's prequential lpd (mean over its ``n`` scored records, at the λ
        before the update ``state.step``); returns a :class:`DriftEvent` or None.

        A batch with ``n == 0`` or a non-finite lpd is skipped (it still advances the
        response's clock). Never modifies ``state``.
        """
        step = int(state.step)
        was_active = self.active
        self._step = step
        self._install(step)                      # end a floor / re-annealing whose time is up
        if was_active and not self.active:
            log.info("drift response %s ended at step %d", self.response, step)
        if not n or lpd is None or not math.isfinite(lpd):
            return None
        lpd = float(lpd)
        if self._prev is not None:
            self._diffs.append(lpd - self._prev)
            del self._diffs[:-self.warmup]
        self._prev = lpd
        self._seen += 1
        if self._seen <= self.warmup:
            return None
        if self._scale is None:                  # fixed for the detector's life (module docs)
            sigma = _robust_sd(self._diffs)
            self._scale, self._origin = (sigma if sigma > 0 else 1e-12), lpd
        sigma = self._scale
        z = (lpd - self._origin) / sigma
        before = self._window()
        fired = self._feed(z)
        if not fired:
            return None
        after, origin = self._window(), self._origin
        before, after = self._cut_means(before, after, z)
        if self.detector == "adwin" and self.direction == "drop" and not after < before:
            return None                          # a rise: not answered (ADWIN has cut its window)
        self._reset_detector()
        detail = {"lpd": lpd, "n": int(n), "z": z, "sigma": sigma,
                  "mean_before": None if before is None else origin + before * sigma,   # ADWIN
                  "mean_after": None if after is None else origin + after * sigma}
        detail.update(self.respond(step))
        event = DriftEvent(step=step, detector=self.detector, response=self.response, detail=detail)
        self.detections.append(event.to_dict())
        del self.detections[:-100]
        log.warning(event.message())
        return event

    def _feed(self, z: float) -> bool:
        self._det.update(z)
        self._replay.append(z)
        del self._replay[:-REPLAY_MAX]
        return bool(self._det.drift_detected)

    def _window(self):
        """ADWIN's (sum, width) of its window; None for Page–Hinkley."""
        if self.detector == "adwin":
            return float(self._det.total), float(self._det.width)
        return None

    def _cut_means(self, before, after, z):
        """ADWIN's direction: (mean of its window before the last ``RECENT`` values, mean of
        those), in z units. (Its cut point can lie far before the change, so the means on
        the two sides of the cut may not show which way the stream went.)"""
        if before is None:
            return None, None
        window = self._replay[-(int(before[1]) + 1):]
        k = min(RECENT, len(window) - 1)
        if k < 1:
            return None, None
        return sum(window[:-k]) / (len(window) - k), sum(window[-k:]) / k

    def _reset_detector(self) -> None:
        self._det = self._new_detector()
        self._replay = []
        self._scale = self._origin = None

    # ------------------------------------------------------------ checkpoint
    def to_dict(self) -> dict:
        """What a checkpoint keeps (JSON values only): the response in progress, the
        σ̂ window and the detector's inputs since its last reset (at most
        :data:`REPLAY_MAX`; replayed into a fresh detector by :meth:`load_dict`)."""
        return {"format": FORMAT, "detector": self.detector, "response": self.response,
                "rho_floor": self.rho_floor, "step": self._step, "offset": self.offset,
                "floor_until": self.floor_until, "anneal_offset": self.anneal_offset,
                "prev": self._prev, "diffs": list(self._diffs), "seen": self._seen,
                "scale": self._scale, "origin": self._origin,
                "replay": list(self._replay), "detections": list(self.detections)}

    def load_dict(self, d: dict) -> "DriftMonitor":
        """Resume from :meth:`to_dict`: the response in progress is applied to the engine
        again (its floor value and ends as saved), the detector rebuilt by replay."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ValueError(f"not a drift monitor state (format {FORMAT!r}): "
                             f"{d.get('format') if isinstance(d, dict) else type(d).__name__!r}")
        if d["detector"] != self.detector:
            log.warning("drift.detector changed since the checkpoint (%s -> %s): the detector "
                        "starts afresh", d["detector"], self.detector)
        self._step = int(d["step"])
        self.offset, self.floor_until = int(d["offset"]), int(d["floor_until"])
        self.anneal_offset = None if d["anneal_offset"] is None else int(d["anneal_offset"])
        if self.floor_until and d.get("rho_floor") is not None:
            self.rho_floor = float(d["rho_floor"])
        if self.anneal_offset is not None and getattr(self.base_annealer, "kind", "none") not in (
                "deterministic", "stochastic"):
            log.warning("a re-annealing was in progress but the engine's annealer is %r now: dropped",
                        getattr(self.base_annealer, "kind", "none"))
            self.anneal_offset = None
        self._prev = d["prev"]
        self._diffs = [float(v) for v in d["diffs"]][-self.warmup:]
        self._seen = int(d["seen"])
        self.detections = list(d.get("detections", []))
        self._det = self._new_detector()
        self._replay = []
        self._scale = self._origin = None
        if d["detector"] == self.detector and d["scale"] is not None:
            self._scale, self._origin = float(d["scale"]), float(d["origin"])
            for z in d["replay"]:
                self._feed(float(z))
        self._install(self._step)
        return self
