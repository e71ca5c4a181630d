"""The worker role (``streamsvi run --role worker``): local steps and statistics, no λ updates.

A worker is a :class:`~streamsvi.service.daemon.Daemon` (the loop of named
stages of :mod:`streamsvi.service.loop`, which the applier runs too) whose
stages ``_learn`` and ``_advance`` do the scale-out work and which keeps no
checkpoint of its own:

* source → batch → (no hold-out) as in one process (the same ``_poll``,
  ``_set_aside`` stages, the same consumer group settings);
* ``_learn``: the local step and the weighted sufficient statistics at the
  freshest published λ (``self.lam``: a :class:`~.lambda_log.LambdaLog` that
  replays the applier's lambda topic, so a worker needs only the bootstrap
  servers; or the :class:`~.transport.LambdaFile` of ``scaleout.lambda_file``
  on shared storage) (:func:`streamsvi.inference.split.contribution`), giving
  the delta: (N/|S|) Σ_n w_n E_q[t(θ_n)] = λ̂ − η for a dense λ, the batch's
  column ids and K × |cols| statistics for LDA's scaled columns, the touched rows'
  ids and statistics for row blocks (PMF, Poisson factorisation), the minibatch's
  ELBO gradient ĝ for the gradient path (logistic, softmax);
* ``_advance``: one Kafka transaction holds the delta (on the deltas topic)
  and the batch's data offsets (``send_offsets_to_transaction`` with the
  consumer's group metadata). Either both are committed or neither: a record
  is consumed by the group exactly when its contribution is on the deltas
  topic for read_committed readers. A transaction of several batches
  (``scaleout.commit_every_batches``) sends their deltas as one message, a
  bundle (:func:`~.transport.encode_bundle`), when it commits: one record and
  one produce request per transaction, not one per batch (each ``send`` woke
  kafka-python's sender thread, which then competed with the model for the GIL).

The group's committed offsets are the worker's whole state: a restarted
worker (or the member the group hands its partitions to) starts where the last
committed transaction ended. Restart a killed worker with the same worker id:
its ``init_transactions`` (run at start, before it waits for partitions)
aborts the transaction it left open (a real Kafka cluster also aborts it after
``transaction.timeout.ms``; tansu 0.6.0 does not, and read_committed readers of
the deltas topic wait until then).

Broker health is the daemon's (:attr:`Daemon.health`, :mod:`streamsvi.service.health`),
named after the worker in its log lines; a producer that cannot be started while a
transaction is settled (:meth:`Worker._settle`) is one more failed call there.

SVI+ weights are drawn from a stream seeded by (seed, topic, partition, first
offset) of the batch, so a batch processed again after a crash gets the
same weights.

The start. While no λ is published, a worker holds its batches back until it
has the records the model's start wants, by the daemon's rule
(``Daemon._take_start``: ``model.start_size(batch_size)``, e.g. the GMM's
``init_batches`` minibatches and at least 5·K·D records, else one minibatch; at
most N; an empty poll starts from what is held). It then proposes λ_0
(``engine.init`` on all of them, as one process starts) in an "init" message,
waits for the applier to publish version 0, and seeks back to the first offsets
of the held batches, so that every held record is read again and turned into a
delta at the published λ exactly once. Nothing is committed (and no dead letter
written) for a held batch.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass, field

from ...inference.engine import EngineState
from ..config import ConfigError, client_security
from ..daemon import Daemon
from ..metrics import ScaleoutMetrics
from .lambda_log import LambdaLog
from .transport import (MAX_DELTA_BYTES, Delta, LambdaFile, bundle_size, check_delta_size, encode_bundle,
                        init_messages)

log = logging.getLogger("streamsvi.worker")

#: A worker looks for a newer λ before a batch at most this often: each look is a poll of the
#: lambda topic's consumers (a fetch round trip), which per batch of 200 records cost more than
#: the batch's local step (profiled: 8.7 % of a worker's samples against 2.5 %). λ moves when
#: other workers' transactions commit (every ``scaleout.commit_seconds`` at most), so looking
#: ten times a second loses little freshness.
LAMBDA_REFRESH_S = 0.1

#: How often a worker waiting for the first λ looks for it (the λ file, or the lambda topic).
LAMBDA_WAIT_S = 0.1


def worker_id(cfg) -> str:
    """``scaleout.worker_id``, else ``$STREAMSVI_WORKER_ID``, else the host name."""
    return cfg["scaleout"]["worker_id"] or os.environ.get("STREAMSVI_WORKER_ID") or socket.gethostname()


def claim_worker_id(group: str, wid: str):
    """Hold this host's lock on (group, worker id) for the process's life, or refuse (exit 2).

    The worker id names the Kafka transactional id, so two workers with one id fence each
    other (``ProducerFencedError``); on one host the default id (the host name) is the same
    for every worker. A second worker with the id of a running one says so at start instead.
    The lock is a ``flock`` on a file in the temporary directory; the OS drops it when the
    process ends, however it ends. Without ``fcntl`` (Windows) nothing is held, as for the
    checkpoint store's lock.
    """
    import hashlib
    import tempfile

    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return None

    key = hashlib.sha256(f"{group}\0{wid}".encode()).hexdigest()[:16]
    path = os.path.join(tempfile.gettempdir(), f"streamsvi-worker-{key}.lock")
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise ConfigError(f"scaleout.worker_id: worker id {wid!r} of group {group!r} is in use by "
                          f"another worker on this host (pid {holder}); give each worker its own id "
                          f"(STREAMSVI_WORKER_ID or scaleout.worker_id)") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f


def check_scaleout_config(cfg) -> None:
    """Refuse configs the roles cannot run, naming the setting."""
    from ...inference import split
    from ..config import build_engine

    if cfg["source"]["kind"] != "kafka":
        raise ConfigError("source.kind: the worker and applier roles need a Kafka source")
    why = split.why_not(build_engine(cfg, 1.0))
    if why is not None:
        raise ConfigError(f"model.kind: {why}")
    if not cfg["scaleout"]["deltas_topic"]:
        raise ConfigError("scaleout.deltas_topic: required for --role worker/applier (a topic with "
                          "one partition that carries the workers' statistic deltas)")
    if cfg["scaleout"]["lambda_file"] and cfg["scaleout"]["lambda_topic"]:
        raise ConfigError("scaleout.lambda_file, scaleout.lambda_topic: set one (lambda travels as a file "
                          "on shared storage, or on a topic)")


def lambda_channel(cfg) -> tuple[str, str]:
    """``("file", path)`` if ``scaleout.lambda_file`` is set, else ``("topic", name)``:
    ``scaleout.lambda_topic``, default ``<deltas_topic>-lambda``."""
    sc = cfg["scaleout"]
    if sc["lambda_file"]:
        return "file", sc["lambda_file"]
    return "topic", sc["lambda_topic"] or f"{sc['deltas_topic']}-lambda"


#: Longest a worker waits for one transactional request (the offsets, the commit) before it
#: settles the transaction with a new producer (:meth:`Worker._settle`). kafka-python 3.0.12
#: waits for them without a bound: a worker hung in ``send_offsets_to_transaction`` for good
#: after a 25 s broker outage (seen 1 run in 2 with two workers behind the fault proxy).
TRANSACTION_WAIT_S = 30.0


def _bounded(producer, method: str, *args) -> None:
    """``producer.<method>(*args)`` for a transactional request, waiting at most
    :data:`TRANSACTION_WAIT_S` (``KafkaTimeoutError`` after that)."""
    from kafka.errors import KafkaTimeoutError

    tm, sender = getattr(producer, "_transaction_manager", None), getattr(producer, "_sender", None)
    start = {"send_offsets_to_transaction": getattr(tm, "send_offsets_to_transaction", None),
             "commit_transaction": getattr(tm, "begin_commit", None)}[method]
    if start is None or sender is None:     # another kafka-python: its own (unbounded) call
        getattr(producer, method)(*args)
        return
    result = start(*args)
    sender.wakeup()
    if not result.wait(timeout_ms=TRANSACTION_WAIT_S * 1000):
        raise KafkaTimeoutError(f"{method}: no answer within {TRANSACTION_WAIT_S:g} s")


def batch_delta(engine, lam_state: EngineState, x, seed: int, topic: str, partition: int, first: int):
    """The :class:`~streamsvi.inference.split.Contribution` of the minibatch ``x`` at the λ
    version ``lam_state`` (:func:`streamsvi.inference.split.contribution`: the engine's own
    update up to the step, so that the applier's step from it is the engine's update). Its
    random draws are seeded by (seed, topic, partition, first offset): a replayed batch gets
    the same contribution.
    """
    from ...inference import split

    return split.contribution(engine, lam_state, x, split.batch_rng_state(seed, topic, partition, first))


#: Longest gap between two consumer polls of a worker (one batch's local step and
#: transaction, or a bounded wait for the first λ). kafka-python times a group join
#: out after this + 5 s and joins again: on tansu 0.6.0 a member that missed a rebalance
#: can otherwise wait in its JoinGroup for the default 300 s while the group goes on.
MAX_POLL_INTERVAL_MS = 10000
#: How long a worker must have owned no partitions before its drain check (``--until-drained``)
#: reads the group's committed offsets with the probe consumer, and how often it does so.
UNASSIGNED_DRAIN_CHECK_S = 5.0
#: A worker in the group without partitions says once, after this long, that it is a spare.
SPARE_NOTICE_S = 10.0
#: How long a worker with a batch in hand waits for the first λ before it gives the
#: batch back (seeks to its first offsets) and polls again, so it keeps its group place.
LAMBDA_WAIT_MAX_S = 2.0
#: While no applier publishes λ, a worker proposes λ_0 again after 2 s, 4 s, ... at most this
#: long (it proposed every 2 s, at INFO, for as long as no applier ran).
REPROPOSE_MAX_S = 60.0


def worker_source(cfg, metrics):
    """The daemon's Kafka source with a bounded poll interval (:data:`MAX_POLL_INTERVAL_MS`)."""
    from ...io.sources import KafkaSource
    from ..daemon import CONNECT_TIMEOUT_S, default_source

    plain = default_source(cfg, metrics)          # validates the codec; builds codec and validator
    plain.close()
    src = cfg["source"]
    return KafkaSource(src["bootstrap_servers"], topics=src["topics"], pattern=src["pattern"],
                       group_id=src["group_id"], codec=plain.codec, validator=plain.validator,
                       kind=plain.kind, session_timeout_ms=src["session_timeout_ms"],
                       heartbeat_interval_ms=src["heartbeat_interval_ms"], connect_attempts=1,
                       connect_timeout_s=CONNECT_TIMEOUT_S, security=client_security(cfg),
                       on_offset_reset=plain.on_offset_reset,
                       consumer_config={"max_poll_interval_ms": MAX_POLL_INTERVAL_MS,
                                        "request_timeout_ms": MAX_POLL_INTERVAL_MS})


@dataclass
class _Transaction:
    """The worker's open transaction: its batches' offset ranges and next offsets."""

    started: float
    batches: int = 0
    ranges: list = field(default_factory=list)      # [(topic, partition, first, end)]
    offsets: dict = field(default_factory=dict)     # (topic, partition) -> next offset
    payloads: list = field(default_factory=list)    # encoded deltas not sent yet (one bundle)


class Worker(Daemon):
    """One scale-out worker (module docs). Same constructor as :class:`Daemon`."""

    def __init__(self, cfg, registry=None, source_factory=None, dead_sink_factory=None, out=None,
                 allow_fresh_start: bool = False):
        check_scaleout_config(cfg)
        super().__init__(cfg, registry=registry, source_factory=source_factory or worker_source,
                         dead_sink_factory=dead_sink_factory, out=out, allow_fresh_start=allow_fresh_start)
        self.sc = cfg["scaleout"]
        self.worker_id = worker_id(cfg)
        self.health.role = f"worker {self.worker_id}"
        self._id_lock = claim_worker_id(cfg["source"]["group_id"], self.worker_id)
        self.scaleout_metrics = ScaleoutMetrics(self.metrics.registry)
        how, where = lambda_channel(cfg)
        if how == "file":
            self.lam = LambdaFile(where)
        else:
            self.lam = LambdaLog(cfg["source"]["bootstrap_servers"], where, self.sc["deltas_topic"],
                                 security=client_security(cfg), client_id=f"streamsvi-worker-{self.worker_id}")
        self.producer = None
        self._proposals = 0                 # λ_0 proposals sent while no λ was published
        self._next_proposal = 0.0           # monotonic time of the next one (backoff)
        self._warned_no_applier = False
        self._pending = None        # (contribution or None, λ version) of the batch in hand
        self._txn = None            # the open transaction (_Transaction), if any
        self._refreshed = 0.0       # monotonic time of the last λ refresh in _learn
        self._holding = False       # the batch in hand is held for the start (_gather)
        self._held_ranges: list = []    # offset ranges of every batch held for the start
        self._unassigned_since = None   # monotonic time this worker was first seen without partitions
        self._last_commit_check = 0.0   # monotonic time of the last _committed_drained while unassigned
        self._until_drained = False     # run(until_drained=...) of the current run
        self.deltas_sent = 0

    # ------------------------------------------------------- start / stop
    def run(self, max_batches: int | None = None, timeout: float | None = None,
            until_drained: bool = False):
        """As :meth:`Daemon.run`; with ``until_drained`` the worker also stops when the group's
        committed offsets cover every record, whether or not the group gives it partitions."""
        self._until_drained = until_drained
        return super().run(max_batches=max_batches, timeout=timeout, until_drained=until_drained)

    def _await_assignment(self, source, timeout_s: float | None = None) -> bool:
        """Start the transactional producer first, then wait for partitions.

        ``init_transactions`` aborts the transaction a killed predecessor with this worker
        id left open, so read_committed readers of the deltas topic (the applier) go on
        even if this worker never gets a partition. With ``--until-drained``, a worker
        that finds every record committed by the group (:meth:`_committed_drained`) while it
        waits stops cleanly (False, ``stopped_by`` "drained") instead of timing out. A worker
        in the group that the group gives no partition (more workers than partitions) is a
        spare: it says so once (after :data:`SPARE_NOTICE_S`) and waits for a rebalance to
        give it partitions; the timeout is for the other causes (no topic, no rebalance).
        """
        from ...io.sources import NotAssigned, SourceError
        from ..daemon import ASSIGNMENT_TIMEOUT_S

        self._producer()
        # the first λ before the first group poll: loading a large full λ from the lambda topic
        # takes longer than a member may go without polling (MAX_POLL_INTERVAL_MS); later
        # refreshes read at most one fetch each
        self.lam.refresh()
        deadline = time.monotonic() + (ASSIGNMENT_TIMEOUT_S if timeout_s is None else timeout_s)
        spare, spare_after = False, time.monotonic() + SPARE_NOTICE_S
        while not self._stop.is_set():
            try:
                source.wait_for_assignment(timeout_s=max(min(1.0, deadline - time.monotonic()), 0.001))
                self._unassigned_since = None
                if spare:
                    log.info("worker %s: partitions assigned; no longer a spare", self.worker_id)
                return True
            except SourceError as exc:
                if self._until_drained and self._unassigned_and_drained(source):
                    self._close_producer()
                    self.request_stop("drained")
                    return False
                if isinstance(exc, NotAssigned) and exc.joined:
                    # in the group, which gave every partition to others: a spare, not an error
                    # (it exited 6, and a supervisor restarted it again and again); it takes
                    # partitions over at the next rebalance (a member leaves, partitions are added)
                    if not spare and time.monotonic() >= spare_after:
                        spare = True
                        log.warning("worker %s: %s; standing by as a spare worker until the group "
                                    "gives it partitions", self.worker_id, exc.why)
                    continue
                if time.monotonic() >= deadline:
                    waited = ASSIGNMENT_TIMEOUT_S if timeout_s is None else timeout_s
                    if isinstance(exc, NotAssigned):
                        exc.waited_s = waited           # the whole wait, not its last step
                        raise
                    raise SourceError(f"after {waited:g} s: {exc}") from exc
        return False

    def _committed_drained(self, source) -> bool:
        """True when the group's committed offset is at the highwater mark of every partition.

        Read by the source's probe consumer only (metadata, fetch, offset fetch), never by
        the group consumer, so it is safe while a join is in flight. Every record below a
        committed offset is in a committed transaction with its delta, so nothing is left
        for any worker. This is what lets a worker that the group never (or no longer)
        assigns partitions finish ``--until-drained``: on tansu 0.6.0, when the group's
        leader leaves while a rebalance is in progress, the broker keeps naming the departed
        member as leader, and every later join of that group ends in SyncGroup
        REBALANCE_IN_PROGRESS (README, "Scaling out", known limits).
        """
        from ..daemon import _transient_errors

        try:
            parts = source.partitions()
            hw = source.highwater_marks(parts)
            committed = source.committed([k for k in parts if hw[k] > 0])
        except _transient_errors() as exc:
            log.info("worker %s: cannot read the group's committed offsets (%s: %s)",
                     self.worker_id, type(exc).__name__, exc)
            return False
        return all(committed.get(k, 0) >= hw[k] for k in parts)

    def _unassigned_and_drained(self, source) -> bool:
        """:meth:`_committed_drained`, asked only once this worker has owned no partitions for
        :data:`UNASSIGNED_DRAIN_CHECK_S` and at most that often.

        The probe's round trips happen outside a consumer poll, and a group join whose
        response arrives outside a poll is started over by kafka-python 3.0.12: checking
        at every idle turn kept three starting workers from ever completing their first
        join (measured). A healthy join takes one to two seconds on tansu, so it is over
        before the first check.
        """
        now = time.monotonic()
        if self._unassigned_since is None:
            self._unassigned_since = now
        if now - self._unassigned_since < UNASSIGNED_DRAIN_CHECK_S or \
                now - self._last_commit_check < UNASSIGNED_DRAIN_CHECK_S:
            return False
        self._last_commit_check = now
        return self._committed_drained(source)

    def _drained(self, source) -> bool:
        """As one process; while this worker owns no partitions, by the group's commits alone.
        Never while batches are held for the start: the source has handed them out, but
        they are read again (:meth:`_gather`) before anything of them is committed."""
        if self._held_ranges:
            return False
        if self._txn is not None:           # read to the end? then commit what is open, and see
            ahead = dict(self.offsets)
            ahead.update(self._txn.offsets)
            from ..daemon import _transient_errors

            try:
                read_all = source.drained(ahead)
            except _transient_errors():      # not known yet (brokers away): read on
                read_all = False
            if not read_all:
                return False
            self._commit(source)
        if super()._drained(source):
            return True
        if source.assignment():
            self._unassigned_since = None
            return False
        return self._unassigned_and_drained(source)

    def _close_producer(self):
        if self.producer is not None:
            self.producer.close(timeout=5)
            self.producer = None

    def _resume(self):
        """A worker holds no state: the group's committed offsets say where to start."""

    def _refuse_fresh_start(self, source):
        """Nothing to refuse: the applier owns the checkpoint."""

    def _producer(self):
        if self.producer is None:
            from kafka import KafkaProducer

            from ..config import client_security

            src = self.cfg["source"]
            self.producer = KafkaProducer(
                bootstrap_servers=src["bootstrap_servers"],
                transactional_id=f"streamsvi-{src['group_id']}-{self.worker_id}",
                transaction_timeout_ms=self.sc["transaction_timeout_ms"],
                max_request_size=MAX_DELTA_BYTES + (1 << 20),    # (a delta and the batch's framing)
                # a transaction's deltas go out together when it commits (the commit flushes),
                # not one produce request each
                linger_ms=int(self.sc["commit_seconds"] * 1000), batch_size=1 << 20,
                client_id=f"streamsvi-worker-{self.worker_id}", **client_security(self.cfg))
            self.producer.init_transactions()   # fences an older instance, aborts its open transaction
        return self.producer

    def _finish(self, source, dead_sink, loop):
        """Commit the open transaction (if this worker still owns its partitions); nothing to
        checkpoint: the transactions are the worker's commits."""
        if self._txn is not None:
            try:
                self._commit(source)
            except Exception as exc:  # noqa: BLE001 - uncommitted batches are read again by the group
                log.warning("worker %s: the last transaction was not committed (%s: %s); its batches "
                            "will be read again", self.worker_id, type(exc).__name__, exc)
        dead_sink.flush()
        self._close_producer()
        if isinstance(self.lam, LambdaLog):
            self.lam.close()
        if self._id_lock is not None:
            self._id_lock.close()               # the id is free for the next worker on this host

    def _maybe_checkpoint(self, source, dead_sink, loop):
        """No snapshots: the transaction in :meth:`_advance` is the worker's commit."""

    def _hold_out(self, x, loop):
        """No held-out reservoir in a worker (records_seen must count every record)."""
        return x

    # ------------------------------------------------------------- batches
    @staticmethod
    def _ranges(batch) -> list:
        """(topic, partition, first, end) of every partition the batch read (dead letters included)."""
        return [(t, int(p), int(batch.first_offsets[(t, p)]), int(end))
                for (t, p), end in sorted(batch.next_offsets.items())]

    def _wait_for_lambda(self) -> bool:
        """True once a λ is published; False after :data:`LAMBDA_WAIT_MAX_S` or a stop."""
        deadline = time.monotonic() + LAMBDA_WAIT_MAX_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            if self.lam.refresh() or self.lam.state is not None:
                return True
            self._stop.wait(LAMBDA_WAIT_S)
        return False

    def _learn(self, x, source, loop) -> None:
        """The delta of ``x`` at the freshest λ (kept for :meth:`_advance`); before any λ,
        ``x`` goes to the start (:meth:`_gather`) and nothing is kept."""
        self._pending = None
        if self._holding:
            self._gather(x, source)
            return
        n_x = self.kind.n_records(x)
        if not n_x:
            self._pending = (None, self.lam.version or 0)
            return
        now = time.monotonic()
        if now - self._refreshed >= LAMBDA_REFRESH_S:    # (a batch with records is held until λ is published)
            self.lam.refresh()
            self._refreshed = now
        engine, lam_state = self.lam.engine, self.lam.state
        self.engine, self.state = engine, lam_state
        self.scaleout_metrics.lambda_version.set(lam_state.step)
        t0 = time.perf_counter()
        t, p, first, _ = self._batch_ranges[0]
        c = batch_delta(engine, lam_state, x, self.cfg["inference"]["seed"], t, p, first)
        self._pending = (c, lam_state.step)
        self.metrics.update_seconds.observe(time.perf_counter() - t0)
        self.metrics.records.inc(n_x)
        self.metrics.batches.inc()
        loop.res.records += n_x
        loop.res.batches += 1
        loop.progress_records += n_x
        loop.last_info = True

    # ------------------------------------------------------------ the start
    def _gather(self, x, source, flush: bool = False) -> None:
        """Hold ``x`` for the start; once the start has its records, propose λ_0 and give back.

        The rule is the daemon's (:meth:`Daemon._take_start`): the model's start size,
        at most N; ``flush`` (an empty poll: :meth:`_idle`) starts from what is held.
        λ_0 comes from all held records (:meth:`_propose_init`); then, whether this
        worker's proposal, another's, or none (no applier yet) was published, every
        held batch is given back (:meth:`_give_back`) and read again: at a published λ
        as deltas, else into a new start. ``x`` None: nothing new (``flush``).
        """
        if x is not None:
            self._held_ranges += self._batch_ranges
            if self.kind.n_records(x):
                self._start_batches.append(x)
        if not self._held_ranges:
            return
        if self.engine is None:
            from ..config import build_engine
            self.engine = build_engine(self.cfg, self._n_total(source))
        self.lam.refresh()
        if self.lam.state is None:
            batches = self._take_start(self.engine.n_total, flush)
            if not batches:
                return                      # still gathering
            if time.monotonic() >= self._next_proposal:
                self._propose_init(batches)
            if self._wait_for_lambda():
                log.info("worker %s: λ version %d published; reading the %d held batches again "
                         "as deltas", self.worker_id, self.lam.version, len(self._held_ranges))
                self._proposals, self._warned_no_applier = 0, False
            elif not self._warned_no_applier and not self._stop.is_set():
                self._warned_no_applier = True
                log.warning("worker %s: no λ published %.0f s after its λ_0 proposal: is an applier "
                            "running on deltas topic %r, publishing to %s? Proposing again after "
                            "%.0f s, then less and less often (at most every %.0f s)", self.worker_id,
                            LAMBDA_WAIT_MAX_S, self.sc["deltas_topic"], self.lam.path,
                            max(0.0, self._next_proposal - time.monotonic()), REPROPOSE_MAX_S)
            # else no applier yet (or a stop): read them again, and propose again later
        self._give_back(source, self._held_ranges)
        self._held_ranges, self._start_batches = [], []

    def _give_back(self, source, ranges) -> None:
        """Seek each partition of ``ranges`` (topic, partition, first, end) back to its first
        ``first``, so its records are read again (none of them was committed).

        Only partitions this worker still owns (all of them while a join is in flight: the
        consumer keeps its old ones until the join completes): a partition the group handed
        on is read by its new owner from the group's committed offsets, and a seek kept for
        a later assignment of it could read committed records again.
        """
        firsts: dict = {}
        for t, p, first, _ in ranges:
            firsts[(t, p)] = min(first, firsts.get((t, p), first))
        owned = source.assignment()
        source.seek({k: off for k, off in firsts.items() if not owned or k in owned})

    def _idle(self, source, loop) -> bool:
        """As in one process; a quiet stream or its end does not keep the start waiting: start
        from the batches held (:meth:`_gather` with ``flush``), and commit the open transaction."""
        if self._held_ranges and not loop.failed_poll:
            self._gather(None, source, flush=True)
        if self._txn is not None and not loop.failed_poll:
            self._commit(source)
        return super()._idle(source, loop)

    def _flush_start(self, loop) -> None:
        """The worker flushes its start in :meth:`_idle` (it gives the batches back to the
        source); at the end of a run, held batches are left uncommitted, to be read again."""

    def _propose_init(self, batches):
        """Send λ_0 from the held ``batches`` for the applier to adopt if it has no state (no offsets)."""
        start = self._start_records(batches)
        n = self.kind.n_records(start)
        st = self.engine.init(start, seed=self.cfg["inference"]["seed"])
        # in chunks of lambda_chunk_bytes when larger (LDA at V = 10⁶: 800 MB), one transaction
        msgs = init_messages(self.worker_id, self.engine, st, self.sc["lambda_chunk_bytes"])
        prod = self._producer()
        prod.begin_transaction()
        for m in msgs:
            prod.send(self.sc["deltas_topic"], m, partition=0)
        prod.commit_transaction()
        self._proposals += 1
        self._next_proposal = time.monotonic() + min(LAMBDA_WAIT_MAX_S * 2 ** self._proposals,
                                                      REPROPOSE_MAX_S)
        what = f"its first {len(batches)} batches" if len(batches) > 1 else "its first batch"
        log.log(logging.INFO if self._proposals == 1 else logging.DEBUG,
                "worker %s: no λ published yet; proposed λ_0 from %s (%d records; proposal %d)",
                self.worker_id, what, n, self._proposals)

    def _advance(self, batch, source) -> None:
        """The batch's delta joins the open transaction (begun if none is); the transaction is
        committed once it holds ``scaleout.commit_every_batches`` batches or is
        ``scaleout.commit_seconds`` old (:meth:`_commit`), and at every empty poll and stop."""
        if self._pending is None:           # held for the start (or given back): nothing to commit
            return
        c, version = self._pending
        self._pending = None
        ranges = self._batch_ranges
        if self._still_owner(source, ranges) is None:
            return
        delta = Delta(worker=self.worker_id, version=version, ranges=ranges,
                      records=0 if c is None else c.records, stats=None if c is None else c.arrays,
                      min_weight=1.0 if c is None else c.min_weight, extra={} if c is None else c.meta,
                      n_total=float(self.engine.n_total) if self.engine is not None else 0.0)
        payload = check_delta_size(delta.encode(), f"the delta of {delta.records} records")
        prod = self._producer()
        txn = self._txn
        if txn is None:
            prod.begin_transaction()
            txn = self._txn = _Transaction(started=time.monotonic())
        txn.ranges += ranges
        for t, p, _, end in ranges:
            txn.offsets[(t, p)] = end
        txn.batches += 1
        if txn.payloads and bundle_size(txn.payloads + [payload]) > MAX_DELTA_BYTES:
            try:                            # a full bundle goes now; the transaction stays open
                self._send_bundle(txn)
            except Exception as exc:  # noqa: BLE001 - the transaction is settled, whatever it was
                self._txn = None
                if not self._settle(source, txn.ranges, exc):
                    self._give_back(source, txn.ranges)
                return
        txn.payloads.append(payload)
        if txn.batches >= self._commit_every() or \
                time.monotonic() - txn.started >= self.sc["commit_seconds"]:
            self._commit(source)

    def _commit_every(self) -> int:
        """Batches per transaction: ``scaleout.commit_every_batches``, else the default staleness
        bound of the model's storage (16; 4 for gradients): the k-th delta of a transaction is
        computed at the λ the transaction began with, k − 1 versions behind the applier when it
        is applied, so a worker's own deltas stay within the bound. One transaction per batch
        cost a worker 4× one process's CPU per record and the broker 25× (4 ms of tansu's CPU
        per transaction: ``bench/scaleout.py``)."""
        n = self.sc["commit_every_batches"]
        if n is None:
            from ...inference import split
            from .applier import MAX_STALENESS

            n = getattr(split.splitter_for(self.engine), "max_staleness", MAX_STALENESS) \
                if self.engine is not None else 1
        return int(n)

    def _send_bundle(self, txn) -> None:
        """Send the transaction's unsent deltas as one message (a bundle)."""
        payloads, txn.payloads = txn.payloads, []
        self.producer.send(self.sc["deltas_topic"], encode_bundle(payloads), key=self.worker_id.encode(),
                           partition=0)

    def _still_owner(self, source, ranges):
        """This worker's group membership if it is a stable member owning every partition of
        ``ranges`` (what the commit sends with the offsets: the one checked); else None, the
        open transaction aborted and its batches and ``ranges`` read again (by this worker or
        the partitions' new owners)."""
        member = source.membership()
        owned = source.assignment()
        if member is not None and all((t, p) in owned for t, p, _, _ in ranges):
            return member
        # The group has moved on (the broker dropped this member during an outage, or a
        # rebalance took the partition): the partition's new owner reads these records
        # from the group's committed offsets, so committing them here would hand the
        # applier an overlapping delta (seen after a 25 s outage: a member the broker
        # no longer knew went on committing for 4 s).
        txn, self._txn = self._txn, None
        back = (txn.ranges if txn is not None else []) + list(ranges)
        log.info("worker %s: not a stable member owning %s any more; %d batch(es) read again, "
                 "not committed", self.worker_id, sorted({(t, p) for t, p, _, _ in back}),
                 1 + (txn.batches if txn is not None else 0))
        self.scaleout_metrics.withheld.inc(1 + (txn.batches if txn is not None else 0))
        if txn is not None:
            self._abort()
        self._give_back(source, back)
        return None

    def _abort(self) -> None:
        """Abort the open transaction; a producer that cannot is replaced (its successor's
        ``init_transactions`` aborts it)."""
        try:
            self.producer.abort_transaction()
        except Exception as exc:  # noqa: BLE001 - the new producer settles it
            log.info("worker %s: abort failed (%s: %s); a new producer aborts it", self.worker_id,
                     type(exc).__name__, exc)
            old, self.producer = self.producer, None
            try:
                old.close(timeout=0)
            except Exception:  # noqa: BLE001
                pass

    def _commit(self, source) -> None:
        """Commit the open transaction: its deltas, the dead letters flushed, its batches' offsets,
        all or nothing. Nothing to do without one."""
        from kafka import TopicPartition

        from ...io._kafka import offset_and_metadata

        txn = self._txn
        if txn is None:
            return
        member = self._still_owner(source, txn.ranges)
        if member is None:
            return
        self._txn = None
        offsets = {TopicPartition(t, p): offset_and_metadata(end) for (t, p), end in txn.offsets.items()}
        prod = self._producer()
        try:
            if txn.payloads:
                self._send_bundle(txn)
            self._dead_sink_flush()
            # the membership, not the bare group id: a broker with KIP-447 refuses the
            # offsets (and so the transaction) of a generation the group has left behind
            _bounded(prod, "send_offsets_to_transaction", offsets, member)
            _bounded(prod, "commit_transaction")
        except Exception as exc:  # noqa: BLE001 - settled below, whatever it was
            if not self._settle(source, txn.ranges, exc):
                self._give_back(source, txn.ranges)
                return
        self.deltas_sent += txn.batches
        self.scaleout_metrics.deltas_sent.inc(txn.batches)
        self.scaleout_metrics.transactions.inc()
        self.offsets.update(txn.offsets)
        self.metrics.set_lag(source.lag())

    def _settle(self, source, ranges, exc) -> bool:
        """After a transaction that failed or did not finish: was it committed? (True: it was.)

        The producer is dropped and a new one with the same transactional id initialised:
        its ``init_transactions`` completes the old transaction if its commit had begun and
        aborts it otherwise. Then the group's committed offsets say which it was. A batch
        not committed is read again; one committed is done (reading it again would send a
        second delta, which the applier skips only if its ranges come out the same).
        """
        log.warning("worker %s: transaction for %s did not complete (%s: %s); settling it with a new "
                    "producer", self.worker_id, ranges, type(exc).__name__, exc)
        old, self.producer = self.producer, None
        if old is not None:
            try:
                old.close(timeout=0)
            except Exception:  # noqa: BLE001 - it is being replaced
                pass
        from ..daemon import _transient_errors

        while not self._stop.is_set():
            try:
                self._producer()            # init_transactions settles the old transaction
                self.health.answered()
                break
            except _transient_errors() as e:
                log.info("worker %s: cannot start a producer yet (%s: %s)", self.worker_id,
                         type(e).__name__, e)
                self.health.wait(self._stop, self.health.failed(e, "starting a producer"))
        else:
            return False                    # a stop: the group's offsets tell the next start
        try:
            committed = source.committed({(t, p) for t, p, _, _ in ranges})
        except _transient_errors():
            return False
        done = all(committed.get((t, p), -1) >= end for t, p, _, end in ranges)
        log.warning("worker %s: the transaction for %s was %s", self.worker_id, ranges,
                    "committed after all" if done else "not committed; reading the batch again")
        return done

    def _dead_sink_flush(self):
        sink = getattr(self, "_dead_sink", None)
        if sink is not None:
            sink.flush()

    def _set_aside(self, batch, dead_sink, loop):
        """As in one process; also notes the batch's offset ranges (for the seed and the delta)
        and whether it is held for the start: while no λ is published and it has records, or
        while batches are held already (a later batch must not commit past them). A held
        batch's dead letters are set aside when it is read again, with its transaction."""
        self._dead_sink = dead_sink
        self._batch_ranges = self._ranges(batch)
        if self.lam.state is None:
            self.lam.refresh()
        self._holding = bool(self._held_ranges) or \
            (self.lam.state is None and self.kind.n_records(batch.x) > 0)
        if not self._holding:
            super()._set_aside(batch, dead_sink, loop)

    def _print_progress(self, source, info, rate):
        print(f"worker {self.worker_id}  deltas {self.deltas_sent:7d}  λ version "
              f"{self.lam.version if self.lam.version is not None else '-':>7}  {rate:10.0f} rec/s  "
              f"lag {sum(source.lag().values())}", file=self.out, flush=True)
