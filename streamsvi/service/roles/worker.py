"""The worker role (``streamsvi run --role worker``): local steps and statistics, no λ updates.

A worker is a :class:`~streamsvi.service.daemon.Daemon` (the loop of named
stages of :mod:`streamsvi.service.loop`, which the applier runs too) configured
with another learner stage, ``_learn``, and another commit strategy,
:class:`~streamsvi.service.commit.TransactionCommit`, in place of the daemon's
snapshots (it keeps no checkpoint of its own):

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
* the commit (:class:`~streamsvi.service.commit.TransactionCommit`, called by
  the stages ``_advance``, ``_idle`` and ``_finish``): one Kafka transaction
  holds the delta (on the deltas topic) and the batch's data offsets
  (``send_offsets_to_transaction`` with the consumer's group metadata). Either both are committed or neither: a record
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
transaction is settled (:meth:`TransactionCommit._settle
<streamsvi.service.commit.TransactionCommit._settle>`) is one more failed call there.

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

from ...inference.engine import EngineState
from ..commit import TransactionCommit
from ..config import ConfigError, client_security
from ..daemon import Daemon
from ..metrics import ScaleoutMetrics
from .lambda_log import LambdaLog
from .transport import LambdaFile, init_messages

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


def batch_delta(engine, lam_state: EngineState, x, seed: int, topic: str, partition: int, first: int,
                compact_below: float = 0.0):
    """The :class:`~streamsvi.inference.split.Contribution` of the minibatch ``x`` at the λ
    version ``lam_state`` (:func:`streamsvi.inference.split.contribution`: the engine's own
    update up to the step, so that the applier's step from it is the engine's update),
    compacted for the wire when ``compact_below`` > 0 (:func:`~streamsvi.inference.split.compact`).
    Its random draws are seeded by (seed, topic, partition, first offset): a replayed batch
    gets the same contribution.
    """
    from ...inference import split

    c = split.contribution(engine, lam_state, x, split.batch_rng_state(seed, topic, partition, first))
    return split.compact(engine, c, compact_below, split.compact_rng(seed, topic, partition, first))


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
                       on_offset_reset=plain.on_offset_reset, on_reopen=plain.on_reopen,
                       consumer_config={"max_poll_interval_ms": MAX_POLL_INTERVAL_MS,
                                        "request_timeout_ms": MAX_POLL_INTERVAL_MS})


class Worker(Daemon):
    """One scale-out worker (module docs). Same constructor as :class:`Daemon`.

    A daemon configured with its own learner stage (``_learn``: a delta at the published λ,
    not an update) and commit strategy (:class:`~streamsvi.service.commit.TransactionCommit`:
    the deltas and the offsets in one Kafka transaction).
    """

    commit_strategy = TransactionCommit
    prefetches = False

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
        self._proposals = 0                 # λ_0 proposals sent while no λ was published
        self._next_proposal = 0.0           # monotonic time of the next one (backoff)
        self._warned_no_applier = False
        self._pending = None        # (contribution or None, λ version) of the batch in hand
        self._refreshed = 0.0       # monotonic time of the last λ refresh in _learn
        self._holding = False       # the batch in hand is held for the start (_gather)
        self._held_ranges: list = []    # offset ranges of every batch held for the start
        self._unassigned_since = None   # monotonic time this worker was first seen without partitions
        self._last_commit_check = 0.0   # monotonic time of the last _committed_drained while unassigned
        self._until_drained = False     # run(until_drained=...) of the current run

    @property
    def deltas_sent(self) -> int:
        """Batches whose deltas this worker committed (counted by its :attr:`commit`)."""
        return self.commit.deltas_sent

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

        self.commit.open_producer()
        # the first λ before the first group poll: loading a large full λ from the lambda topic
        # takes longer than a member may go without polling (MAX_POLL_INTERVAL_MS); later
        # refreshes read at most one fetch each
        self.lam.refresh()
        waited = self._assignment_timeout() if timeout_s is None else timeout_s
        deadline = time.monotonic() + waited
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
                    self.commit.close_producer()
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
                self._note_unassigned(exc, waited)      # a topic that does not exist yet: said once
                if time.monotonic() >= deadline:
                    if isinstance(exc, NotAssigned):
                        raise self._give_up_unassigned(exc, waited)
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
        txn = self.commit.txn
        if txn is not None:                 # read to the end? then commit what is open, and see
            ahead = dict(self.offsets)
            ahead.update(txn.offsets)
            from ..daemon import _transient_errors

            try:
                read_all = source.drained(ahead)
            except _transient_errors():      # not known yet (brokers away): read on
                read_all = False
            if not read_all:
                return False
            self.commit.commit_open(source)
        if super()._drained(source):
            return True
        if source.assignment():
            self._unassigned_since = None
            return False
        return self._unassigned_and_drained(source)

    def _resume(self):
        """A worker holds no state: the group's committed offsets say where to start."""

    def _refuse_fresh_start(self, source):
        """Nothing to refuse: the applier owns the checkpoint."""

    def _finish(self, source, dead_sink, loop):
        """The commit strategy's ``finish`` (the open transaction committed if this worker still
        owns its partitions, the dead letters flushed, the producer closed; nothing to
        checkpoint: the transactions are the worker's commits), then the λ reader and the
        worker id are let go. Not the daemon's: no last progress line, no start to flush."""
        self.commit.finish(source, dead_sink, loop)
        if isinstance(self.lam, LambdaLog):
            self.lam.close()
        if self._id_lock is not None:
            self._id_lock.close()               # the id is free for the next worker on this host

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
        c = batch_delta(engine, lam_state, x, self.cfg["inference"]["seed"], t, p, first,
                        self.sc["compact_below"])
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
        from the batches held (:meth:`_gather` with ``flush``); then the daemon's idle turn,
        whose commit strategy's ``on_idle`` commits the open transaction."""
        if self._held_ranges and not loop.failed_poll:
            self._gather(None, source, flush=True)
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
        prod = self.commit.open_producer()
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

    def _set_aside(self, batch, dead_sink, loop):
        """As in one process; also notes the batch's offset ranges (for the seed and the delta)
        and whether it is held for the start: while no λ is published and it has records, or
        while batches are held already (a later batch must not commit past them). A held
        batch's dead letters are set aside when it is read again, with its transaction."""
        self.commit.dead_sink = dead_sink       # flushed by each commit of a transaction
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
