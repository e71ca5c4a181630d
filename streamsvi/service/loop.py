"""One loop of named stages: the single daemon, the worker and the applier configure it.

:class:`StagedLoop` runs the loop; a role is a subclass that fills in its stages and
plugs in its commit strategy (quix-streams' ``Application`` the same way: one loop,
the guarantee a setting). The strategy (:mod:`streamsvi.service.commit`) is the
role's ``commit``, bound in its ``__init__`` from ``commit_strategy``; the stages
``_advance``, ``_maybe_checkpoint``, ``_idle`` and ``_finish`` call it. The stages,
in order:

* ``_start(stack, loop)``: open what the run needs (metrics server, source or
  consumer, sinks), registering their closing on ``stack`` (an ``ExitStack``);
  returns ``(source, dead_sink)``, or None when a stop came first;
* per turn: ``_stop_condition(loop)`` (shared: a signal, the count limit, the
  timeout), then ``_poll(source, loop)``, the next batch or None;
* a turn with no batch: ``_idle(source, loop)``, True to end the run (the
  strategy's ``on_idle`` when the poll did not fail);
* a turn with a batch: ``_set_aside(batch, dead_sink, loop)`` (rejected
  records), ``_hold_out(batch.x, loop)`` (what is kept back from learning),
  ``_learn(x, source, loop)``, ``_advance(batch, source)`` (the strategy's
  ``after_batch``: positions, or the batch's delta), ``_maybe_checkpoint(source,
  dead_sink, loop)`` (the strategy's ``maybe_commit``), ``_maybe_progress(source,
  loop)``; with ``until_drained``, ``_drained(source)`` ends the run;
* at the end ``_finish(source, dead_sink, loop)`` (the strategy's ``finish``, the
  last commit), then ``_result(loop)``, what ``run()`` returns.

The configurations: :class:`~streamsvi.service.daemon.Daemon` fills in every
stage (minibatches → SVI+) and commits with
:class:`~streamsvi.service.commit.SnapshotCommit` (a snapshot, then the offset
commit); :class:`~streamsvi.service.roles.worker.Worker` is a daemon whose
``_learn`` computes a delta instead of an update, committed with
:class:`~streamsvi.service.commit.TransactionCommit` (the deltas and the offsets
in one Kafka transaction); :class:`~streamsvi.service.roles.applier.Applier`
polls the deltas topic (``_poll``: the released deltas, or None while it stands
by), applies them in ``_learn`` and commits with
:class:`~streamsvi.service.commit.PublishCommit` (λ published, then a
checkpoint), whose ``maybe_commit`` runs on turns with an empty poll too (its
``_poll`` returns an empty batch while active); the stages it leaves alone do
nothing.

The loop the quix-streams way: signal handlers only set a flag
(:class:`~streamsvi.service.signals.StopOnSignals`); resources live in an
``ExitStack``; ``run()`` takes stop conditions so tests can drive it.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

from .commit import CommitStrategy
from .signals import StopOnSignals


@dataclass
class _Loop:
    """What one run keeps between its stages."""

    res: object                   # the run's result (RunResult, ApplierResult): stages count into it
    limit: int | None = None      # the count limit of run() (StagedLoop.count_limit names it)
    timeout: float | None = None  # seconds from the start of run()
    until_drained: bool = False
    t_start: float = field(default_factory=time.monotonic)
    failed_poll: bool = False     # the last poll raised (and was backed off)
    last_info: object = None      # the latest update's UpdateInfo, for the progress line
    last_ck: float = 0.0
    batches_since_ck: int = 0
    last_progress: float = 0.0
    progress_records: int = 0


class StagedLoop(StopOnSignals):
    """The loop of named stages (module docs); subclasses fill the stages in.

    A subclass calls :meth:`_init_stop` in ``__init__``, binds its commit strategy
    (``self.commit = self.commit_strategy(self)``), and its ``run()`` builds a
    :class:`_Loop` and hands it to :meth:`_run`.
    """

    #: The class of the role's commit strategy (:mod:`streamsvi.service.commit`).
    commit_strategy = CommitStrategy
    #: The role's commit strategy, bound in ``__init__``; this default commits nothing.
    commit: CommitStrategy = CommitStrategy()

    #: The count limit of ``run()``: its keyword (``stopped_by`` when it is reached)
    #: and the field of the result it counts.
    count_limit = ("max_batches", "batches")
    #: Whether ``_finish`` also runs when a stage raised (the applier: its state is whole
    #: after every delta); the daemon's does not (a failed checkpoint is not tried again).
    finish_on_error = False

    def _run(self, loop: _Loop):
        """The loop: :meth:`_start`, turns until a stop condition, :meth:`_finish`."""
        if not self._stop.is_set():      # keep the reason of a stop requested before run()
            self._stop_reason = ""
        with contextlib.ExitStack() as stack:
            opened = self._start(stack, loop)
            if opened is None:
                return loop.res
            source, dead_sink = opened
            try:
                self._turns(source, dead_sink, loop)
            except BaseException:
                if self.finish_on_error:
                    self._finish(source, dead_sink, loop)
                raise
            self._finish(source, dead_sink, loop)
        return self._result(loop)

    def _turns(self, source, dead_sink, loop: _Loop) -> None:
        """Turns until a stop condition, an idle turn or a drained source ends the run
        (``loop.res.stopped_by`` says which)."""
        while (reason := self._stop_condition(loop)) is None:
            batch = self._poll(source, loop)
            if batch is None:
                if self._idle(source, loop):
                    return
                continue
            self._set_aside(batch, dead_sink, loop)
            self._learn(self._hold_out(batch.x, loop), source, loop)
            self._advance(batch, source)
            self._maybe_checkpoint(source, dead_sink, loop)
            self._maybe_progress(source, loop)
            if loop.until_drained and self._drained(source):   # no need to wait out another empty poll
                loop.res.stopped_by = "drained"
                return
        loop.res.stopped_by = reason

    def _stop_condition(self, loop: _Loop) -> str | None:
        """Why the loop should stop now (a signal, the count limit, ``timeout``), or None."""
        if self._stop.is_set():
            return self._stop_reason
        name, counted = self.count_limit
        if loop.limit is not None and getattr(loop.res, counted) >= loop.limit:
            return name
        if loop.timeout is not None and time.monotonic() - loop.t_start > loop.timeout:
            return "timeout"
        return None

    # ------------------------------------------------------------ stages
    def _start(self, stack, loop: _Loop):
        """Open what the run needs; ``(source, dead_sink)``, or None when a stop came first."""
        raise NotImplementedError

    def _poll(self, source, loop: _Loop):
        """The next batch (with the records to learn as ``.x``), or None."""
        raise NotImplementedError

    def _idle(self, source, loop: _Loop) -> bool:
        """A turn without a batch; True to end the run. By default the commit strategy's
        ``on_idle`` (unless the poll failed), and the run goes on."""
        if not loop.failed_poll:
            self.commit.on_idle(source, loop)
        return False

    def _set_aside(self, batch, dead_sink, loop: _Loop) -> None:
        """The batch's rejected records. Nothing by default."""

    def _hold_out(self, x, loop: _Loop):
        """What of ``x`` is kept back from learning; returns the rest (all of it by default)."""
        return x

    def _learn(self, x, source, loop: _Loop) -> None:
        """Learn from ``x``."""
        raise NotImplementedError

    def _advance(self, batch, source) -> None:
        """The batch is consumed: the commit strategy's ``after_batch``."""
        self.commit.after_batch(batch, source)

    def _maybe_checkpoint(self, source, dead_sink, loop: _Loop) -> None:
        """Once a turn with a batch: the commit strategy's ``maybe_commit``."""
        self.commit.maybe_commit(source, dead_sink, loop)

    def _maybe_progress(self, source, loop: _Loop) -> None:
        """Progress output. Nothing by default."""

    def _drained(self, source) -> bool:
        """Whether every record of the source is accounted for (``until_drained``)."""
        return False

    def _finish(self, source, dead_sink, loop: _Loop) -> None:
        """The last commit of a run that ends: the commit strategy's ``finish``."""
        self.commit.finish(source, dead_sink, loop)

    def _result(self, loop: _Loop):
        """What ``run()`` returns after :meth:`_finish`: the loop's result."""
        return loop.res
