"""The daemon's consumer loop: minibatches → SVI+ → durable checkpoints → metrics.

Delivery contract (docs/design.md): auto-commit is off; the offsets of a batch are
committed only after a checkpoint that includes the batch's update is durable;
on start the daemon seeks every partition to the offsets stored in its latest
valid checkpoint. A crash at any instant therefore neither loses a record's
contribution nor counts it twice. A record that fails decoding or validation
never reaches the model: it goes to the dead-letter topic (or file) with its
reason and position, and is counted.

Whether the brokers answer is :attr:`Daemon.health`, a
:class:`~streamsvi.service.health.BrokerHealth`: the start-up retries, the poll
backoff, the idle metadata probe, ``streamsvi_broker_up`` /
``streamsvi_broker_retries_total`` and the log lines of an outage.

The loop is :class:`~streamsvi.service.loop.StagedLoop`'s, shared with the
worker and the applier (the stages are listed there); the daemon fills in every
stage, and its commit strategy is :class:`~streamsvi.service.commit.SnapshotCommit`:
a durable snapshot, then the offset commit. Signal handlers only set a flag;
resources live in an ``ExitStack``; ``run()`` takes stop conditions so tests can
drive it.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..checkpoint import CheckpointStore, check_compatible
from ..io.records import record_kind
from ..io.sources.prefetch import Prefetching
from ..learner import take_start
from ..models.base import Classifier, StartsFromData
from .commit import SnapshotCommit
from .config import build_engine, build_model, client_security
from .console import plural
from .health import BROKER_PROBE_S, BrokerHealth  # noqa: F401  (BROKER_PROBE_S: its old home)
from .health import CONNECT_TIMEOUT_S as _CONNECT_TIMEOUT_S
from .loop import StagedLoop, _Loop
from .metrics import DaemonMetrics
from .promotion import Promotion

log = logging.getLogger("streamsvi.daemon")

from .history import HISTORY_FILE  # noqa: E402  (one JSON object per line, next to the snapshots)

#: How long one attempt to reach the brokers at start may take (its home, with the backoffs
#: and the probe cadence, is :mod:`streamsvi.service.health`); read here at each start, so a
#: test can lower it on this module.
CONNECT_TIMEOUT_S = _CONNECT_TIMEOUT_S
#: How long the daemon waits at start for its consumer group to assign it partitions, unless
#: ``source.assignment_timeout_seconds`` says otherwise.
ASSIGNMENT_TIMEOUT_S = 60.0
#: Seconds after the start (partitions assigned) without a record from any partition after
#: which the daemon warns, once, naming its topics and saying which are empty (a misspelt name,
#: or nothing produced yet) (:meth:`Daemon._warn_if_quiet`).
QUIET_START_S = 60.0


class FreshStartRefused(RuntimeError):
    """No valid snapshot, but traces of an earlier run: starting fresh would lose records silently."""


@dataclass
class RunResult:
    """What one ``Daemon.run`` did.

    ``heldout`` counts the records this run diverted into the held-out reservoir;
    ``heldout_total`` is the reservoir's size at the end (a resumed run restores the
    snapshot's reservoir and usually adds none). ``seconds`` is the time from the
    opening of the first rate window (:meth:`Daemon._print_progress`) to the end of the
    run, 0 if no record was applied.
    """

    batches: int = 0
    records: int = 0
    dead: int = 0
    heldout: int = 0
    checkpoints: int = 0
    stopped_by: str = ""
    elbo_history: list = field(default_factory=list)
    heldout_total: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        """The run's last console line, e.g. ``stopped (drained): 8 batches, 7500 records
        applied in 1.8 s (4167 rec/s), 0 dead-lettered, 500 held out, 1 checkpoint``.

        The rate is over :attr:`seconds` (the group join and the wait for the first
        records left out); "held out" is the reservoir's size (:attr:`heldout_total`).
        """
        applied = plural(self.records, "record") + " applied"
        if self.records and self.seconds > 0:
            applied += f" in {self.seconds:.1f} s ({self.records / self.seconds:.0f} rec/s)"
        return (f"stopped ({self.stopped_by}): {plural(self.batches, 'batch', 'batches')}, {applied}, "
                f"{self.dead} dead-lettered, {self.heldout_total} held out, "
                f"{plural(self.checkpoints, 'checkpoint')}")


class Daemon(StagedLoop):
    """One model learning from one source, committed by a snapshot, then the offset commit
    (:class:`~streamsvi.service.commit.SnapshotCommit`).

    Parameters
    ----------
    cfg : dict
        A validated config (``streamsvi.service.config.load_config``).
    registry : prometheus_client.CollectorRegistry, optional
        Where metrics are registered (a fresh one by default).
    source_factory : callable, optional
        ``cfg -> Source``; default builds the Kafka or file source the config names.
    out : file-like
        Where console progress goes (stderr by default).
    allow_fresh_start : bool
        Start with fresh parameters even where there is no valid snapshot but
        the checkpoint directory or the consumer group shows an earlier run
        (default False: :class:`FreshStartRefused`; see :meth:`_refuse_fresh_start`).
    """

    commit_strategy = SnapshotCommit
    #: Whether the run reads each next minibatch while it learns the last one
    #: (``source.prefetch``; :mod:`streamsvi.io.sources.prefetch`). The scale-out worker
    #: reads in turn: its transaction's ranges and group checks follow each poll.
    prefetches = True

    def __init__(self, cfg: dict, registry=None, source_factory=None, dead_sink_factory=None,
                 out=None, allow_fresh_start: bool = False):
        self.cfg = cfg
        self.allow_fresh_start = bool(allow_fresh_start)
        self.metrics = DaemonMetrics(registry)
        self._source_factory = source_factory or default_source
        self._dead_sink_factory = dead_sink_factory or default_dead_sink
        self.out = out if out is not None else sys.stderr
        self._init_stop()
        self.store = CheckpointStore(cfg["checkpoint"]["directory"], keep=cfg["checkpoint"]["keep"])
        self.engine = None
        self.state = None
        self.offsets: dict = {}
        self.model = build_model(cfg["model"])
        self.kind = record_kind(self.model)   # how records are counted, sliced, joined, stored
        self.heldout = None                   # a batch of the kind, or None (metrics.evaluation = "reservoir")
        self.prequential_ll = None            # the latest minibatch's prequential figure (_prequential)
        self._unscored = 0                    # start batches left to learn: not scored (the start saw them)
        self._start_batches: list = []        # batches held back until the start (_gather_start)
        self.metrics_server = None
        src = cfg["source"]
        #: whether the brokers answer: state, backoff, probe cadence, broker_up/retries, log lines
        self.health = BrokerHealth(self.metrics, src["bootstrap_servers"], src["connect_backoff_seconds"],
                                   role="the daemon", log=log, errors=_transient_errors())
        #: the commit strategy (:mod:`streamsvi.service.commit`), called by the loop's stages
        self.commit = self.commit_strategy(self)
        #: which snapshot scorers follow (:mod:`streamsvi.service.promotion`; SnapshotCommit calls it)
        self.promotion = Promotion(self)
        #: the drift detector and its response (:mod:`streamsvi.service.drift`), made with the
        #: engine on the first update (None with ``drift.detector = "none"``)
        self.drift = None
        self._drift_saved = None              # a resumed snapshot's monitor state (extra["drift"])

    # ------------------------------------------------------------ resume
    def _resume(self):
        snap = self.store.resume()          # corrupt snapshots are moved to quarantine/
        if snap is None:
            return
        n = self.cfg["inference"]["n_total"]
        # N is a setting: a number in the config wins (retuning is logged below); "auto"
        # keeps the N resolved at the first start rather than re-reading a grown topic.
        engine = build_engine(self.cfg, snap.engine.n_total if n == "auto" else float(n))
        if isinstance(engine.model, StartsFromData):   # a prior computed from the first data
            engine.model.adopt_prior(snap.engine.model)  # is the snapshot's, never recomputed
        notes = check_compatible(snap, engine)
        for n in notes:
            log.warning("settings changed since the checkpoint: %s", n)
        self.engine, self.state = engine, snap.state
        self.offsets = {(o["source"], int(o["partition"])): int(o["offset"]) for o in snap.offsets}
        ho = (snap.extra or {}).get("heldout")
        if ho:
            self.heldout = self.kind.from_json(ho, self.model)
        self.elbo_history = collections.deque((snap.extra or {}).get("elbo_history", []), maxlen=1000)
        # the gauges describe the model: restored, not 0, until the next update
        self.metrics.step.set(snap.state.step)
        self.metrics.records_seen.set(snap.state.records_seen)
        self.metrics.checkpoint_ts.set(snap.created.timestamp())
        if self.heldout is not None:
            self.metrics.heldout_records.set(self.kind.n_records(self.heldout))
        # one line for the event: the console's (the log's details at DEBUG)
        log.debug("resumed from %s: step %d, %d records, offsets %s", snap.path, snap.state.step,
                  snap.state.records_seen, self.offsets)
        print(f"resumed from snapshot {snap.number} (step {snap.state.step}, "
              f"{plural(snap.state.records_seen, 'record')})", file=self.out, flush=True)
        self.promotion.resume(snap)
        self._drift_saved = (snap.extra or {}).get("drift")

    def _refuse_fresh_start(self, source) -> None:
        """With no valid snapshot, refuse to start fresh where an earlier run left traces.

        Fresh parameters with the group's committed offsets would leave out
        every record before them, and a checkpoint directory that held
        snapshots means a run's learning would be thrown away: both silently.
        Raises :class:`FreshStartRefused` saying what was found and what to do,
        unless ``allow_fresh_start``; otherwise logs that it starts fresh.
        """
        found = self.store.traces()
        committed = source.committed() if hasattr(source, "committed") else {}   # Kafka only
        if committed:
            found.append(f"group {self.cfg['source']['group_id']!r} has committed offsets "
                         f"{dict(sorted(committed.items()))}")
        where = self.store.directory
        if not found:
            log.info("no checkpoint in %s and no earlier run: starting fresh", where)
            return
        if self.allow_fresh_start:
            log.warning("no valid snapshot in %s, but found %s; starting fresh as "
                        "--allow-fresh-start asks", where, "; ".join(found))
            return
        raise FreshStartRefused(
            f"no valid snapshot in {where}, but found " + "; ".join(found) + ". Starting fresh "
            "would silently drop what the earlier run learned"
            + (" and every record before the committed offsets" if committed else "") +
            ". Restore the checkpoint directory from a backup (quarantined snapshots are in "
            f"{where / 'quarantine'}), or start over on purpose with --allow-fresh-start"
            + (" (and a new source.group_id to read the topics from the start)" if committed else ""))

    def _n_total(self, source) -> float:
        n = self.cfg["inference"]["n_total"]
        if n != "auto":
            return float(n)
        total = source_size(source)
        if not total:
            raise RuntimeError("inference.n_total = 'auto' but the source reports no records yet; "
                               "set a number (the population size for an unbounded stream)")
        log.info("n_total = auto: %d records", total)
        return float(total)

    def _open_source(self):
        """The source; while the brokers are unreachable, retry with backoff and count it.

        Owns the start-up retry of ``source.connect_attempts`` /
        ``connect_backoff_seconds`` (the default factory makes one attempt per
        call) so that each retry shows in ``streamsvi_broker_retries_total`` and
        ``streamsvi_broker_up``. A stop request ends the waiting: returns None.
        kafka-python's own messages about these attempts are logged at INFO
        (``streamsvi.service.console.quiet_kafka``): this method logs one warning
        per failed attempt, and the error it raises at the end names the last one.

        Raises
        ------
        KafkaUnavailableError
            After ``source.connect_attempts`` failed attempts, saying how many and
            how long they took (the CLI prints it as one line and exits 3).
        """
        from ..io.sources import KafkaUnavailableError
        from .console import quiet_kafka

        src = self.cfg["source"]
        attempts = src["connect_attempts"]
        t0 = time.monotonic()
        for attempt in range(1, attempts + 1):
            if self._stop.is_set():
                return None
            try:
                with quiet_kafka() as kafka_said:
                    source = self._source_factory(self.cfg, self.metrics)
            except KafkaUnavailableError as exc:
                cause = exc.__cause__ if exc.__cause__ is not None else exc
                last = str(cause) if str(cause).startswith(type(cause).__name__) \
                    else f"{type(cause).__name__}: {cause}"
                detail = kafka_said.last(besides=last)
                if detail:
                    last += f"; before it: {detail}"
                if self._stop.is_set():
                    self.health.attempt_failed(attempts, attempts, last)   # gauge 0, no retry
                    return None
                delay = self.health.attempt_failed(attempt, attempts, last)
                if delay is None:
                    raise KafkaUnavailableError(
                        f"cannot reach Kafka at {src['bootstrap_servers']} after {attempts} "
                        f"attempt{'s' * (attempts > 1)} over {time.monotonic() - t0:.1f} s (last error: "
                        f"{last}); check source.bootstrap_servers and that the brokers are running, "
                        f"or raise source.connect_attempts") from exc
                if self.health.wait(self._stop, delay):
                    return None
                continue
            if src["kind"] == "kafka":
                self.health.answered()
            return source
        raise AssertionError("unreachable")

    def _await_assignment(self, source, timeout_s: float | None = None) -> bool:
        """Wait until the group assigns partitions; False if a stop was requested first.

        Waits in steps of about a second so that a signal is honoured at once
        rather than after the whole timeout (:meth:`_assignment_timeout`). A
        subscription with no topic at the brokers yet is said at once, in one line
        (:meth:`_note_unassigned`).

        Raises
        ------
        NotAssigned
            After the whole wait, saying why (:meth:`_give_up_unassigned`); the CLI
            prints it as one line and exits 6.
        """
        from ..io.sources import NotAssigned, SourceError

        timeout_s = self._assignment_timeout() if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while not self._stop.is_set():
            try:
                source.wait_for_assignment(timeout_s=max(min(1.0, deadline - time.monotonic()), 0.001))
                return True
            except SourceError as exc:
                self._note_unassigned(exc, timeout_s)
                if time.monotonic() >= deadline:
                    if isinstance(exc, NotAssigned):
                        raise self._give_up_unassigned(exc, timeout_s)
                    raise SourceError(f"after {timeout_s:g} s: {exc}") from exc
        return False

    def _assignment_timeout(self) -> float:
        """``source.assignment_timeout_seconds``, or :data:`ASSIGNMENT_TIMEOUT_S` (60 s) when unset."""
        t = self.cfg["source"].get("assignment_timeout_seconds")
        return float(ASSIGNMENT_TIMEOUT_S if t is None else t)

    def _note_unassigned(self, exc, timeout_s: float) -> None:
        """Say once, on the console, that the start waits for a topic that does not exist yet
        (``exc``: a step of the wait that ended unassigned), and for how long."""
        if getattr(exc, "no_topic", None) and not self._said_waiting:
            self._said_waiting = True
            print(f"waiting up to {timeout_s:g} s for {exc.no_topic} to appear at "
                  f"{self.cfg['source']['bootstrap_servers']} (source.assignment_timeout_seconds)",
                  file=self.out, flush=True)

    def _give_up_unassigned(self, exc, timeout_s: float):
        """``exc`` (a :class:`NotAssigned`) for the whole wait of ``timeout_s``, with what to do
        when the topic never appeared."""
        exc.waited_s = timeout_s                 # the whole wait, not its last step
        if exc.no_topic:
            setting = "source.topics" if self.cfg["source"]["topics"] else "source.pattern"
            it = "one" if exc.no_topic.startswith(("a topic", "one of")) else "it"
            exc.why += (f"; create {it} or produce to {it} (streamsvi produce --config FILE), check "
                        f"{setting} for a misspelt name, or wait longer (source.assignment_timeout_seconds)")
        return exc

    def _drained(self, source) -> bool:
        """Every partition of the source accounted for (``Source.drained``); False while the
        broker cannot tell."""
        if not self.health.up:
            return False
        try:
            return source.drained(self.offsets)
        except _transient_errors() as exc:
            log.warning("cannot tell whether the source is drained (%s: %s); reading on",
                        type(exc).__name__, exc)
            return False

    def _print_progress(self, source, info, rate):
        """The console progress line (every ``metrics.progress_seconds``, and once at a clean stop).

        ``rate`` (rec/s) is a recent rate, not a lifetime average: the records applied
        since the previous progress line over the time since it. A window opens at the
        previous line, or, while it has no records yet, at the latest empty poll
        (:meth:`_idle`): the first window leaves out the group join and the wait for the
        first records (it holds the model's start: a GMM's k-means and CAVI sweeps on
        its first batches), and a window after a quiet spell leaves out the spell. The
        run's average is in its last line (:meth:`RunResult.summary`). With prequential
        evaluation the line ends with ``lpd``, the smoothed prequential log predictive density
        per record (``streamsvi_prequential_loglik_smoothed``).
        """
        smoothed = self.metrics.prequential_smoothed.value
        preq = f"  lpd {smoothed:.4f}" if smoothed is not None else ""
        print(f"step {self.state.step:7d}  records {self.state.records_seen:10d}  "
              f"{rate:10.0f} rec/s  ELBO/rec {info.elbo_per_record:10.4f}  "
              f"rho {info.rho:.4f}  lag {sum(source.lag().values())}{preq}",
              file=self.out, flush=True)

    # -------------------------------------------------------- checkpoint
    @staticmethod
    def _close_sink(dead_sink) -> None:
        """Close the dead-letter sink; a failure is logged, never chained onto the error that
        is already on its way out (a full disk failed the checkpoint, then the close)."""
        try:
            dead_sink.close()
        except Exception as exc:  # noqa: BLE001 - everything durable was flushed by the last checkpoint
            log.error("closing the dead-letter sink failed (%s: %s)", type(exc).__name__, exc)

    def _write_history(self):
        """Append the compact metric history of the checkpointed steps to history.jsonl.

        Written after the snapshot is durable; a crash before this line loses
        those rows, a replay after a crash may write a step again (readers keep
        the last row of each step: ``streamsvi.service.history.read_history``).
        """
        last = self._last_history_row
        if last is not None and (not self._history_rows or self._history_rows[-1] is not last) \
                and last["step"] > self._history_written_step:
            self._history_rows.append(last)
        if not self._history_rows:
            return
        path = Path(self.cfg["checkpoint"]["directory"]) / HISTORY_FILE
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r, allow_nan=True) + "\n" for r in self._history_rows))
            f.flush()
            os.fsync(f.fileno())
        self._history_written_step = self._history_rows[-1]["step"]
        self._history_rows = []

    def _record_history(self, info, heldout, classified=None, prequential=None):
        """Keep a row every ``history_every`` updates, on held-out updates, and (via
        ``_write_history``) the last update before each checkpoint. A classifier's held-out
        updates also keep ``classified`` = (log-loss, accuracy) as ``heldout_log_loss`` and
        ``heldout_accuracy``. With prequential evaluation every row has ``prequential_loglik``
        (the batch's figure), ``prequential_smoothed`` and, for a classifier,
        ``prequential_log_loss`` and ``prequential_accuracy`` (``prequential`` = that dict)."""
        row = {
            "time": round(time.time(), 3), "step": info.step, "records": self.state.records_seen,
            "elbo": info.elbo, "elbo_per_record": info.elbo_per_record, "heldout_loglik": heldout,
            "grad_variance": info.grad_variance,
            "grad_variance_observed": self.metrics.observed_variance,
            "grad_norm": info.grad_norm, "rho": info.rho, "noise_std": info.noise_std,
            "effective_batch_size": info.effective_batch_size, "batch_size": info.batch_size,
            "domain_clipped": info.domain_clipped, "annealing_level": info.annealing_level}
        if classified is not None:
            row["heldout_log_loss"], row["heldout_accuracy"] = classified
        if prequential:
            row.update(prequential)
        self._last_history_row = row
        every = self.cfg["metrics"]["history_every"]
        if info.step % every == 0 or info.step == 1 or heldout is not None:
            self._history_rows.append(row)

    # --------------------------------------------------------------- run
    def run(self, max_batches: int | None = None, timeout: float | None = None,
            until_drained: bool = False) -> RunResult:
        """Consume, update, checkpoint until a stop condition; returns a summary.

        The loop of named stages of :mod:`streamsvi.service.loop`, every stage filled in:
        :meth:`_start`, then per turn :meth:`_stop_condition`, :meth:`_poll`, :meth:`_idle`
        (no records) or :meth:`_set_aside`, :meth:`_hold_out`, :meth:`_learn`,
        :meth:`_advance`, :meth:`_maybe_checkpoint`, :meth:`_maybe_progress`; at the end
        :meth:`_finish`. The stages ``_advance``, ``_maybe_checkpoint`` and ``_finish`` hand
        the commit to :attr:`commit` (:class:`~streamsvi.service.commit.SnapshotCommit`).
        """
        loop = _Loop(RunResult(), limit=max_batches, timeout=timeout, until_drained=until_drained)
        self.elbo_history = collections.deque(maxlen=1000)
        self._history_rows, self._last_history_row, self._history_written_step = [], None, 0
        self._rate_since = None
        return self._run(loop)

    def _result(self, loop) -> RunResult:
        """The run's summary, with the ELBO history of the run's updates and the held-out
        reservoir's size."""
        loop.res.elbo_history = list(self.elbo_history)
        loop.res.heldout_total = 0 if self.heldout is None else int(self.kind.n_records(self.heldout))
        return loop.res

    def _start(self, stack, loop):
        """Metrics server, resume, source, dead-letter sink, seek, group assignment.

        Returns ``(source, dead_sink)``, or None when a stop came first
        (``loop.res.stopped_by`` says which).
        """
        mc = self.cfg["metrics"]
        if mc["enabled"]:
            server, _ = self.metrics.serve(mc["port"], mc["host"])
            self.metrics_server = server
            stack.callback(server.server_close)     # release the port (runs last)
            stack.callback(server.shutdown)         # stop serve_forever (runs first)
            print(f"metrics: http://{mc['host']}:{server.server_port}/metrics", file=self.out, flush=True)
        self._resume()
        source = self._open_source()
        if source is None:                          # stopped while waiting for the brokers
            loop.res.stopped_by = self._stop_reason
            return None
        if self.prefetches and self.cfg["source"].get("prefetch", False):
            source = Prefetching(source)            # _poll starts each next batch's read
        stack.callback(source.close)
        if self.state is None:
            self._refuse_fresh_start(source)
        dead_sink = self._dead_sink_factory(self.cfg)
        stack.callback(self._close_sink, dead_sink)
        if self.offsets:
            source.seek(self.offsets)
        self._said_waiting = False                  # _note_unassigned: once per start
        if hasattr(source, "wait_for_assignment") and not self._await_assignment(source):
            loop.res.stopped_by = self._stop_reason  # stopped before a partition was assigned
            return None
        loop.last_ck = loop.last_progress = self._started_at = time.monotonic()
        self._quiet_told, self._empty_told = False, set()     # _warn_if_quiet, _warn_empty_topics
        return source, dead_sink

    # ------------------------------------------------ topics that yield nothing
    def _topic_records(self, source, topics=None) -> dict | None:
        """``{topic: Σ highwater marks of its partitions}`` of a Kafka source's subscribed topics
        (or of those in ``topics``): 0 means nothing was ever produced to the topic. None for
        other sources, while the brokers are away, or when they cannot tell within 5 s."""
        if not hasattr(source, "highwater_marks") or not self.health.up:
            return None
        try:
            parts = {tp for tp in source.partitions() if topics is None or tp[0] in topics}
            marks = source.highwater_marks(parts, timeout_s=5.0)
        except _transient_errors() as exc:
            log.info("cannot tell whether the topics are empty (%s: %s)", type(exc).__name__, exc)
            return None
        out: dict = {}
        for (topic, _), hw in marks.items():
            out[topic] = out.get(topic, 0) + int(hw)
        return out

    def _empty_note(self, empty: list, named: bool = True) -> str:
        """"topic 'a' is empty (a misspelt source.topics, or nothing produced to it yet)";
        "it is empty (...)" if not ``named`` (the line named the topics already)."""
        one = len(empty) == 1
        setting = "source.topics" if self.cfg["source"]["topics"] else "source.pattern"
        subject = (f"{_topics(empty)} {'is' if one else 'are'}" if named else
                   "it is" if one else "they are")
        return f"{subject} empty (a misspelt {setting}, or nothing produced to {'it' if one else 'them'} yet)"

    def _warn_if_quiet(self, source, loop) -> None:
        """Warn once if no record came from any partition in the :data:`QUIET_START_S` seconds
        since the start, naming the topics and saying which are empty (stage ``_idle``)."""
        if self._quiet_told or time.monotonic() - self._started_at < QUIET_START_S:
            return
        self._quiet_told = True
        if loop.res.records or loop.res.dead or loop.res.heldout or self._start_batches:
            return                                   # records came
        counts = self._topic_records(source)
        if not counts:
            return
        empty = sorted(t for t, n in counts.items() if n == 0)
        read = sorted(t for t, n in counts.items() if n > 0)
        notes = [self._empty_note(empty, named=bool(read))] if empty else []
        if read:
            notes.append(f"{_topics(read)} {'holds' if len(read) == 1 else 'hold'} only records "
                         f"read before (waiting for new ones)")
        log.warning("no record from %s in the %g s since the start: %s", _topics(sorted(counts)),
                    QUIET_START_S, "; ".join(notes))
        self._empty_told.update(empty)

    def _warn_empty_topics(self, source) -> None:
        """At the end of a run: warn, in one line, about the subscribed topics that hold no
        record at all (each partition's highwater mark 0), unless :meth:`_warn_if_quiet` named
        them. Only topics with no offset beyond 0 (read or resumed) are asked about."""
        if not hasattr(source, "highwater_marks") or not self.health.up:
            return
        try:
            subscribed = {t for t, _ in source.partitions()}
        except _transient_errors():
            return
        seen = {t for (t, _), off in self.offsets.items() if off > 0}
        ask = subscribed - seen - self._empty_told
        counts = self._topic_records(source, ask) if ask else None
        empty = sorted(t for t, n in (counts or {}).items() if n == 0)
        if empty:
            log.warning("read no record from %s: %s", _topics(empty), self._empty_note(empty, named=False))

    def _poll(self, source, loop):
        """The next minibatch, or None. A poll that raises (brokers gone a while mid-run)
        applied nothing: report it to :attr:`health`, wait its backoff and return None;
        kafka-python reconnects by itself and positions are unchanged. Records are an answer;
        an empty poll is not (kafka-python polls return empty while the brokers are gone:
        the idle probe decides), except from a source that cannot be probed. A file source
        has no brokers: its gauge is left alone unless a poll of it raised."""
        inf = self.cfg["inference"]
        try:
            batch = source.poll_batch(inf["batch_size"], inf["max_wait_seconds"])
        except _transient_errors() as exc:
            self.health.wait(self._stop, self.health.failed(exc, "poll"))
            loop.failed_poll = True
            return None
        loop.failed_poll = False
        if batch is not None and isinstance(source, Prefetching) and any(source.lag().values()):
            # read the next batch while this one is learned; not when the source has nothing
            # more yet (the read would wait out max_wait_seconds, and a drained check after
            # this batch would wait for it)
            source.prefetch(inf["batch_size"], inf["max_wait_seconds"])
        if (batch is not None or getattr(source, "check_brokers", None) is None) and \
                (self.cfg["source"]["kind"] == "kafka" or not self.health.up):
            self.health.answered()
        return batch

    def _idle(self, source, loop) -> bool:
        """No records came: the commit strategy's ``on_idle``; probe the brokers; start from the
        batches held back for the start (a quiet stream does not keep it waiting); True to stop
        when ``until_drained`` and drained. A progress window with no records yet opens now
        (:meth:`_print_progress`)."""
        if not loop.progress_records:
            loop.last_progress = time.monotonic()
        if loop.failed_poll:
            return False
        self.commit.on_idle(source, loop)
        check = getattr(source, "check_brokers", None)   # Kafka sources only
        if check is not None:
            self.health.probe(check)
            self._warn_if_quiet(source, loop)
        self._flush_start(loop)
        if loop.until_drained and self._drained(source):
            loop.res.stopped_by = "drained"
            return True
        return False

    def _set_aside(self, batch, dead_sink, loop) -> None:
        """Rejected records go to the dead-letter sink, counted by reason."""
        for d in batch.dead:
            dead_sink.send(d)
            self.metrics.observe_dead(d.reason)
        loop.res.dead += len(batch.dead)

    def _hold_out(self, x, loop):
        """With ``metrics.evaluation = "reservoir"``: fill the held-out reservoir from the front of
        ``x`` until it has ``metrics.heldout_size`` records; returns the rest. With prequential
        evaluation (the default) nothing is withheld: returns ``x``."""
        if self.cfg["metrics"]["evaluation"] != "reservoir":
            return x
        H, kind = self.cfg["metrics"]["heldout_size"], self.kind
        n_x = kind.n_records(x)
        n_ho = 0 if self.heldout is None else kind.n_records(self.heldout)
        if H and n_ho < H and n_x:
            take = min(H - n_ho, n_x)
            ho, x = kind.take(x, slice(0, take)), kind.take(x, slice(take, n_x))
            self.heldout = ho if self.heldout is None else kind.concat([self.heldout, ho])
            loop.res.heldout += take
            self.metrics.heldout_records.set(n_ho + take)
        return x

    def _learn(self, x, source, loop) -> None:
        """Engine updates on ``x``: one, or, before the start, none until the start's
        records are gathered (:meth:`_gather_start`) and then one per gathered batch."""
        if not self.kind.n_records(x):
            return
        if self.engine is None:
            self.engine = build_engine(self.cfg, self._n_total(source))
        for xb in ([x] if self.state is not None else self._gather_start(x)):
            self._update(xb, loop)

    def _gather_start(self, x=None, flush: bool = False) -> list:
        """Hold batches back until the model's start has its records; then start from all
        of them and return them, to be learned in order (none while still gathering).

        A model's ``start_size(batch_size)`` says how many records its start wants (GMM:
        ``init_batches`` = 4 minibatches and at least 5·K·D records; others: one minibatch),
        at most N. ``flush`` starts from what is held (:meth:`_flush_start`). Nothing is
        checkpointed or committed before the start, so records held here and lost to a
        crash are read again on restart.
        """
        if x is not None:
            self._start_batches.append(x)
        batches = self._take_start(self.engine.n_total, flush)
        if batches:
            self.state = self.engine.init(self._start_records(batches), seed=self.cfg["inference"]["seed"])
            self._unscored = len(batches)     # λ_0 was made from them: no prequential figure
            if len(batches) > 1:
                log.info("started from the first %d batches (%d records)", len(batches),
                         sum(self.kind.n_records(b) for b in batches))
        return batches

    def _take_start(self, n_total: float, flush: bool = False) -> list:
        """The batches held for the start, taken from the hold once they have the records the
        start wants (or ``flush`` and any are held); [] while still gathering.

        The rule is :func:`streamsvi.learner.take_start`: the start wants
        ``inference.engine.start_records`` records, the model's ``start_size(batch_size)``
        if it has one (GMM: ``init_batches`` minibatches and at least 5·K·D), else one
        minibatch, at most ``n_total`` = N. Used by the daemon (:meth:`_gather_start`) and
        the scale-out worker's proposal of λ_0 (``roles.worker.Worker._gather``); the river
        faces' learner (``learner.StreamLearner``) calls the same function.
        """
        return take_start(self._start_batches, self.kind.n_records, self.model,
                          self.cfg["inference"]["batch_size"], n_total, flush)

    def _start_records(self, batches: list):
        """The records of ``batches`` as one batch of the kind (what ``engine.init`` starts from)."""
        return batches[0] if len(batches) == 1 else self.kind.concat(batches)

    def _flush_start(self, loop) -> None:
        """Start from the batches held back, if any, and learn them: a poll came back empty
        (a quiet stream does not keep the start waiting, as a short batch is applied after
        ``max_wait_seconds``) or the run is ending."""
        if self.state is None and self._start_batches:
            for xb in self._gather_start(flush=True):
                self._update(xb, loop)

    def _prequential(self, x, loop) -> tuple[float, int] | None:
        """The minibatch's prequential figure, ``(mean log predictive density, records scored)``,
        at the current λ, before ``x`` is learned (river's progressive validation); None with
        ``metrics.evaluation = "reservoir"``.

        The batches the start was made from (``engine.init``: a GMM's first ``init_batches``,
        one minibatch for the others) are not scored: λ_0 has seen them. At most
        ``metrics.prequential_sample`` records of ``x`` are scored, evenly spaced (no
        random draw: the engine's random stream is untouched, so λ is what it would be
        without the evaluation). Sets the prequential gauges (a classifier's log-loss and
        accuracy too) and feeds the sample to the promotion's comparison. Called once per
        update, by :meth:`_update`; its result is the signal a drift detector reads.
        """
        mc = self.cfg["metrics"]
        if mc["evaluation"] != "prequential" or self.state is None:
            return None
        if self._unscored:                    # a batch the start (λ_0) was made from
            self._unscored -= 1
            return None
        n_x, k = self.kind.n_records(x), mc["prequential_sample"]
        xs = x if not k or n_x <= k else self.kind.take(x, np.unique(np.linspace(0, n_x - 1, k).astype(np.int64)))
        try:
            lp = np.asarray(self.engine.predictive_logpdf(self.state, xs), dtype=float)
        except (ValueError, FloatingPointError) as exc:   # the evaluation never stops the learning
            log.warning("step %d: the prequential evaluation could not score the batch (%s: %s); "
                        "it is learned unscored", self.state.step + 1, type(exc).__name__, exc)
            return None
        mean, n = float(np.mean(lp)), int(lp.shape[0])
        self.prequential_ll = mean
        smoothed = self.metrics.observe_prequential(mean, n, mc["prequential_fading"])
        self._prequential_row = {"prequential_loglik": mean, "prequential_smoothed": smoothed}
        classified = self._classifier_metrics(xs, prequential=True)
        if classified is not None:
            self._prequential_row["prequential_log_loss"], self._prequential_row["prequential_accuracy"] = classified
        self.promotion.observe(xs, lp)
        return mean, n

    def _update(self, x, loop) -> None:
        """One engine update on ``x``, its metrics and history row (the prequential figure of
        ``x`` first: :meth:`_prequential`)."""
        n_x = self.kind.n_records(x)
        mc = self.cfg["metrics"]
        self._prequential_row = None
        preq = self._prequential(x, loop)
        drift = self._drift_monitor()         # before the update: a resumed response is in force
        t0 = time.perf_counter()
        self.state, info = self.engine.update(self.state, x)
        loop.last_info = info
        if drift is not None and preq is not None:
            self.metrics.observe_drift(drift, drift.observe(self.state, *preq))
        annealing = getattr(self.engine, "annealing", None)       # the gradient path has none
        self.metrics.observe_update(info, info.gradient, time.perf_counter() - t0,
                                    annealing_kind=None if annealing is None else annealing.kind)
        estimator = getattr(self.engine, "estimator", None)       # the gradient path
        if estimator is not None and np.isfinite(info.grad_variance):
            self.metrics.grad_var_by_estimator.labels(estimator=estimator).set(info.grad_variance)
        self.metrics.records_seen.set(self.state.records_seen)
        self.elbo_history.append([info.step, info.elbo_per_record])
        if preq is not None:
            self.elbo_history[-1].append(preq[0])
        loop.res.records += n_x
        loop.res.batches += 1
        loop.batches_since_ck += 1
        loop.progress_records += n_x
        heldout_ll, classified = None, None
        if self.heldout is not None and (info.step % mc["heldout_every"] == 0 or info.step == 1):
            lp = self.engine.predictive_logpdf(self.state, self.heldout)
            heldout_ll = self.heldout_ll = float(np.mean(lp))
            self.metrics.heldout_loglik.set(heldout_ll)
            classified = self._classifier_metrics()
            self.elbo_history[-1].append(heldout_ll)
        self._record_history(info, heldout_ll, classified, self._prequential_row)

    def _drift_monitor(self):
        """The drift monitor (:mod:`streamsvi.service.drift`), None with ``drift.detector =
        "none"``. Made on the first update, on the engine as built or resumed; it takes up a
        resumed snapshot's state then, so a response in progress (a floor, a restarted clock)
        is in force from the first update of the run. Each update's prequential figure is
        then fed to :meth:`DriftMonitor.observe <streamsvi.service.drift.DriftMonitor.observe>`,
        which logs a detection and applies the configured response."""
        if self.drift is None and self.cfg["drift"]["detector"] != "none":
            from .drift import DriftMonitor
            self.drift = DriftMonitor.from_config(self.cfg, self.engine)
            if self._drift_saved is not None:
                try:
                    self.drift.load_dict(self._drift_saved)
                except (ValueError, KeyError, TypeError) as exc:   # settings changed since the snapshot
                    log.warning("the snapshot's drift monitor state is not resumed (%s); the detector "
                                "starts afresh", exc)
                self._drift_saved = None
        return self.drift

    def _classifier_metrics(self, records=None, prequential: bool = False) -> tuple[float, float] | None:
        """Held-out log-loss and accuracy (of ``records``, the reservoir by default), for models
        that predict class probabilities (None for the others); set on their gauges (the
        prequential ones with ``prequential``) and returned for the history row."""
        if not isinstance(self.engine.model, Classifier):
            return None
        proba = self.engine.model.predict_proba
        ho = np.asarray(self.heldout if records is None else records)
        p = proba(self.state.lam, ho[:, :-1])
        y = ho[:, -1].astype(np.int64)
        if p.ndim == 1:                                  # binary: p(y = 1)
            p = np.column_stack([1.0 - p, p])
        p_y = np.clip(p[np.arange(len(y)), y], 1e-15, 1.0)
        log_loss, accuracy = float(-np.mean(np.log(p_y))), float(np.mean(p.argmax(axis=1) == y))
        m = self.metrics
        (m.prequential_log_loss if prequential else m.heldout_log_loss).set(log_loss)
        (m.prequential_accuracy if prequential else m.heldout_accuracy).set(accuracy)
        return log_loss, accuracy

    def _maybe_progress(self, source, loop) -> None:
        """The console progress line every ``metrics.progress_seconds``."""
        self._note_first_window(loop)
        every, now = self.cfg["metrics"]["progress_seconds"], time.monotonic()
        if every and now - loop.last_progress >= every and loop.last_info is not None:
            self._print_progress(source, loop.last_info, loop.progress_records / (now - loop.last_progress))
            loop.last_progress, loop.progress_records = now, 0

    def _finish(self, source, dead_sink, loop) -> None:
        """Clean shutdown: start from any batches still held back and learn them, a last
        progress line, then the commit strategy's ``finish`` (checkpoint and commit what was
        applied)."""
        self._flush_start(loop)
        self._note_first_window(loop)
        now = time.monotonic()
        if self._rate_since is not None:
            loop.res.seconds = now - self._rate_since
        if self.cfg["metrics"]["progress_seconds"] and loop.progress_records and loop.last_info is not None:
            self._print_progress(source, loop.last_info,             # where the run ended
                                 loop.progress_records / max(now - loop.last_progress, 1e-9))
        super()._finish(source, dead_sink, loop)
        self._warn_empty_topics(source)

    def _note_first_window(self, loop) -> None:
        """Keep when the run's first progress window with records opened (for
        :attr:`RunResult.seconds`)."""
        if self._rate_since is None and loop.progress_records:
            self._rate_since = loop.last_progress


def _topics(names) -> str:
    """"topic 'a'" or "topics 'a', 'b'"."""
    names = list(names)
    return ("topic " if len(names) == 1 else "topics ") + ", ".join(map(repr, names))


def _transient_errors() -> tuple:
    """Exceptions of a broker being away for a while (retried, never fatal mid-run)."""
    from kafka.errors import KafkaError

    from ..io.sources import SourceError
    return (KafkaError, SourceError, ConnectionError, TimeoutError)


def source_size(source) -> int:
    """Records in a bounded source: lines of a file, or Σ highwater of every partition of the topics."""
    if hasattr(source, "_count_lines"):
        return int(source._count_lines())
    if hasattr(source, "highwater_marks"):
        return sum(source.highwater_marks(source.partitions(), timeout_s=15.0).values())
    return 0


def default_source(cfg, metrics):
    from ..io.dense import DenseKind
    from ..io.sources import FileSource, KafkaSource
    from ..io.validate import ModelChecked

    src, val = cfg["source"], cfg["validation"]
    model = build_model(cfg["model"])
    kind = record_kind(model)
    if src["codec"] not in kind.codec_names:     # validate() refuses it already; a hand-made cfg
        raise ValueError(f"source.codec: {src['codec']!r} is not a codec for {kind.name!r} records "
                         f"(model {model.name!r}); choose one of {list(kind.codec_names)}")
    codec = kind.make_codec(src["codec"], model, {**src, **(cfg.get("records") or {})})
    validator = ModelChecked(kind.make_validator(model, val), model.check_batch, kind)
    if src["kind"] == "file":
        if isinstance(kind, DenseKind):
            D = model.n_features
            codec = None if src["format"] == "csv" else codec
            return FileSource(src["path"], n_features=D, fmt=src["format"], codec=codec,
                              validator=validator, fields=src["fields"])
        return FileSource(src["path"], fmt=src["format"], codec=codec, validator=validator, kind=kind)
    return KafkaSource(src["bootstrap_servers"], topics=src["topics"], pattern=src["pattern"],
                       group_id=src["group_id"], codec=codec, validator=validator, kind=kind,
                       session_timeout_ms=src["session_timeout_ms"],
                       heartbeat_interval_ms=src["heartbeat_interval_ms"],
                       connect_attempts=1,      # the daemon retries (Daemon._open_source)
                       connect_timeout_s=CONNECT_TIMEOUT_S, security=client_security(cfg),
                       on_offset_reset=lambda key, expected, got:
                       metrics.offset_resets.labels(key[0], str(key[1])).inc(),
                       on_reopen=lambda: metrics.consumers_replaced.inc())


def default_dead_sink(cfg):
    from ..io.deadletter import FileDeadLetterSink, KafkaDeadLetterSink

    src = cfg["source"]
    if src["kind"] == "kafka" and src["dead_letter_topic"]:
        return KafkaDeadLetterSink(src["bootstrap_servers"], src["dead_letter_topic"],
                                   security=client_security(cfg))
    path = src["dead_letter_path"] or os.path.join(cfg["checkpoint"]["directory"], "dead-letters.jsonl")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return FileDeadLetterSink(path)
