"""Promotion: which snapshot scorers load, decided on held-out evidence (``[promotion]``).

The daemon writes a snapshot at every checkpoint and moves ``latest``; scorers
(``streamsvi.load``, :class:`~streamsvi.scoring.SnapshotWatcher`) follow the ``promoted``
pointer (:data:`streamsvi.checkpoint.PROMOTED`), which moves only when a snapshot's held-out
log predictive density is not worse than the promoted one's by more than
``promotion.tolerance`` nats per record. What is compared (docs/running.md, "Promotion"):

* ``metrics.evaluation = "prequential"`` (the default): after snapshot k (the candidate) is
  written, the sample of each next minibatch that the prequential figure scores is also
  scored under the candidate's λ and under the promoted snapshot's λ (both kept in memory),
  before the minibatch is learned: the same records, learned by neither. Once at least
  ``promotion.window`` records are scored, the two means decide.
* ``metrics.evaluation = "reservoir"``: both are scored on the held-out reservoir when the
  candidate is written, and the decision is immediate.

The first snapshot is promoted (there is nothing to compare with). A snapshot written while a
candidate is still being evaluated supersedes it (decision ``superseded``): the candidate is
always the newest snapshot, which retention keeps; retention never deletes the promoted one.
Every decision (``promoted``, ``rejected``, ``superseded``) goes into the decision record
:data:`streamsvi.checkpoint.PROMOTION_FILE` with both figures and its reason, and into the
metrics.

On resume, the ``promoted`` pointer is read back and the promoted snapshot's λ loaded; a
resumed snapshot newer than it is a pending candidate again, evaluated from the restart on
(its window starts over: the batches scored before the stop were not kept). A directory with
no ``promoted`` pointer (written before promotion existed) promotes the resumed snapshot.
"""
from __future__ import annotations

import logging
import math
import time

import numpy as np

from ..checkpoint import PROMOTED, load_snapshot, pointer_number, read_promotion, snapshot_name

log = logging.getLogger("streamsvi.promotion")


class Promotion:
    """The daemon's promotion state: the promoted snapshot and the candidate being evaluated.

    Parameters
    ----------
    daemon : Daemon
        Reads its ``cfg``, ``store``, ``engine``, ``metrics``, ``heldout`` and ``out``.
    """

    def __init__(self, daemon):
        self.d = daemon
        cfg = daemon.cfg
        pc, mc = cfg["promotion"], cfg["metrics"]
        self.evaluation = mc["evaluation"]
        self.tolerance = float(pc["tolerance"])
        self.window = int(pc["window"])
        #: whether there is evidence to decide on: the prequential figure, or a reservoir
        self.active = bool(pc["enabled"]) and (self.evaluation == "prequential" or mc["heldout_size"] > 0)
        self.promoted = None       # (number, state, figure or None)
        self.candidate = None      # (number, state)
        self._sums = [0.0, 0.0, 0]  # candidate's Σ log p, promoted's Σ log p, records
        self.decisions: list = []

    # ------------------------------------------------------------ resume
    def resume(self, snap) -> None:
        """After the daemon resumed from ``snap``: the promoted snapshot back in memory; ``snap``
        a pending candidate if it is newer (module docs)."""
        directory = self.d.store.directory
        if not self.active:
            left = pointer_number(directory, PROMOTED)
            if left is not None:
                log.warning("promotion is off (promotion.enabled = false, or no held-out evidence), but "
                            "%s holds a 'promoted' pointer to snapshot %d from an earlier run: scorers "
                            "keep loading it; delete %s to have them follow 'latest'", directory, left,
                            directory / PROMOTED)
            return
        record = read_promotion(directory) or {}
        self.decisions = list(record.get("decisions") or [])
        number = pointer_number(directory, PROMOTED)
        if number == snap.number:
            self.promoted = (number, snap.state, self._figure_of(record, number))
            self._set_promoted_gauges()
            return
        if number is not None and number < snap.number:
            try:
                old = load_snapshot(directory / snapshot_name(number))
            except (OSError, ValueError) as exc:
                log.warning("promotion: the promoted snapshot %d cannot be loaded (%s); promoting "
                            "snapshot %d", number, exc, snap.number)
            else:
                self.promoted = (number, old.state, self._figure_of(record, number))
                self._set_promoted_gauges()
                self._start_candidate(snap.number, snap.state, resumed=True)
                return
        why = ("no snapshot was promoted before" if number is None else
               f"the promoted snapshot {number} is not older than the resumed one")
        self._decide(snap.number, snap.state, "promoted", None, None, 0, f"first snapshot: {why}")

    @staticmethod
    def _figure_of(record: dict, number: int):
        fig = record.get("promoted_figure") if record.get("promoted") == number else None
        return None if fig is None else float(fig)

    # ------------------------------------------------------------ hooks
    def on_snapshot(self, snap) -> None:
        """A snapshot is durable: the first is promoted; later ones become the candidate (the
        reservoir: decided now)."""
        if not self.active:
            return
        self._newest = snap         # what _decide publishes on checkpoint.snapshot_topic when promoted
        if self.promoted is None:
            self._decide(snap.number, snap.state, "promoted", None, None, 0,
                         "first snapshot: nothing promoted to compare with")
            return
        if snap.state is self.promoted[1]:
            return                  # nothing learned since the promoted snapshot: no new evidence
        if self.candidate is not None and snap.state is self.candidate[1]:
            # nothing learned since the candidate (a stop right after a checkpoint): the same λ,
            # its candidacy and the records scored so far move to the newer copy
            self.candidate = (snap.number, snap.state)
            self._write(pending=snap.number)
            return
        if self.candidate is not None:
            number, _ = self.candidate
            self._record(number, "superseded", *self._means(), self._sums[2],
                         f"snapshot {snap.number} was written before {self.window} records were "
                         f"scored ({self._sums[2]} were): a window longer than the records between "
                         f"checkpoints never decides (promotion.window)")
        self._start_candidate(snap.number, snap.state)

    def observe(self, xs, lp_current: np.ndarray) -> None:
        """A minibatch's scored sample ``xs`` before it is learned (prequential evaluation), with
        its log densities at the current λ: scored under the candidate and the promoted λ."""
        if self.candidate is None or self.promoted is None:
            return
        engine, state = self.d.engine, self.d.state
        cand_state, prom_state = self.candidate[1], self.promoted[1]
        lp_c = lp_current if cand_state is state else engine.predictive_logpdf(cand_state, xs)
        lp_p = lp_current if prom_state is state else engine.predictive_logpdf(prom_state, xs)
        self._sums[0] += float(np.sum(lp_c))
        self._sums[1] += float(np.sum(lp_p))
        self._sums[2] += len(lp_c)
        if self._sums[2] >= self.window:
            self._judge()

    # ------------------------------------------------------------ decisions
    def _start_candidate(self, number: int, state, resumed: bool = False) -> None:
        self.candidate, self._sums = (number, state), [0.0, 0.0, 0]
        if self.evaluation == "reservoir":
            ho = self.d.heldout
            if ho is None:          # no reservoir yet: nothing to decide on
                self._decide(number, state, "promoted", None, None, 0,
                             "no held-out reservoir yet to compare on")
                return
            engine = self.d.engine
            lp_c = engine.predictive_logpdf(state, ho)
            lp_p = engine.predictive_logpdf(self.promoted[1], ho)
            self._sums = [float(np.sum(lp_c)), float(np.sum(lp_p)), len(lp_c)]
            self._judge()
            return
        self._write(pending=number)
        if resumed:
            log.info("promotion: snapshot %d is evaluated again from the restart on (the window "
                     "starts over)", number)

    def _means(self):
        s_c, s_p, n = self._sums
        return (s_c / n, s_p / n) if n else (None, None)

    def _judge(self) -> None:
        number, state = self.candidate
        c, p = self._means()
        n = self._sums[2]
        what = ("the held-out reservoir" if self.evaluation == "reservoir" else
                "the next minibatches' prequential samples, learned by neither")
        head = (f"candidate {c:.4f} vs promoted snapshot {self.promoted[0]} {p:.4f} nats per record "
                f"on the same {n} records ({what})")
        if not math.isfinite(c):
            outcome, why = "rejected", f"{head}: the candidate's figure is not finite"
        elif not math.isfinite(p) or c >= p - self.tolerance:
            outcome, why = "promoted", f"{head}: not worse by more than the tolerance {self.tolerance:g}"
        else:
            outcome, why = "rejected", f"{head}: worse by {p - c:.4f}, more than the tolerance {self.tolerance:g}"
        self._decide(number, state, outcome, c, p, n, why)

    def _decide(self, number, state, outcome, c, p, n, reason) -> None:
        against = None if self.promoted is None else self.promoted[0]
        if outcome == "promoted":
            self.promoted = (number, state, c)
            snap = getattr(self, "_newest", None)
            if snap is not None and snap.number == number:      # scorers without shared storage
                from .roles.snapshot_topic import publish_snapshot
                publish_snapshot(self.d, snap)
        self.candidate, self._sums = None, [0.0, 0.0, 0]
        self._record(number, outcome, c, p, n, reason, against=against,
                     promote=number if outcome == "promoted" else None)
        self._set_promoted_gauges()

    def _record(self, number, outcome, c, p, n, reason, against=None, promote=None) -> None:
        if against is None and self.promoted is not None and outcome != "promoted":
            against = self.promoted[0]
        self.decisions.append({"candidate": number, "outcome": outcome, "candidate_figure": c,
                               "promoted_figure": p, "against": against, "records": int(n),
                               "evaluation": self.evaluation, "tolerance": self.tolerance,
                               "reason": reason, "time": round(time.time(), 3)})
        self.d.metrics.promotion_decisions.labels(outcome=outcome).inc()
        log.info("promotion: snapshot %d %s: %s", number, outcome, reason)
        self._write(promote=promote, pending=None if self.candidate is None else self.candidate[0])

    def _write(self, promote=None, pending=None) -> None:
        pn = None if self.promoted is None else self.promoted[0]
        fig = None if self.promoted is None else self.promoted[2]
        try:
            self.d.store.write_promotion({"promoted": pn, "promoted_figure": fig, "pending": pending,
                                          "evaluation": self.evaluation, "tolerance": self.tolerance,
                                          "decisions": self.decisions}, promote=promote)
        except (OSError, ValueError) as exc:   # the storage failed: the old pointer stays
            log.error("promotion: the decision record in %s was not written (%s: %s); scorers keep "
                      "the snapshot the 'promoted' pointer names", self.d.store.directory,
                      type(exc).__name__, exc)

    def _set_promoted_gauges(self) -> None:
        if self.promoted is None:
            return
        m = self.d.metrics
        m.promoted_snapshot.set(self.promoted[0])
        if self.promoted[2] is not None:
            m.promoted_loglik.set(self.promoted[2])
