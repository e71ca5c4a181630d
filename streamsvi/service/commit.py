"""Commit strategies: what "commit" means for a role of the loop, plugged in, not inherited.

The loop of :mod:`streamsvi.service.loop` is one; how a role makes what it learnt
durable, and when it tells Kafka a record is consumed, is its commit strategy
(quix-streams' ``processing_guarantee`` the same way: one loop, the guarantee a
setting). A role names its strategy's class in ``commit_strategy`` and binds one in
``__init__`` (``self.commit = self.commit_strategy(self)``); the loop's stages call
it. The interface, :class:`CommitStrategy`, in the order the loop calls it:

* ``after_batch(batch, source)``, from the stage ``_advance``, once per turn with a
  batch, after ``_learn``: the batch is learnt; note its positions (or send its delta);
* ``maybe_commit(source, dead_sink, loop)``, from ``_maybe_checkpoint``, right after:
  commit if one is due (every ``checkpoint.every_batches`` / ``every_seconds``);
* ``on_idle(source, loop)``, from ``_idle``, on a turn without a batch whose poll did
  not fail: what a quiet stream must not keep open;
* ``finish(source, dead_sink, loop)``, from ``_finish``: the last commit of a run that
  ends (a clean stop; the applier's also after a failed stage).

A strategy is bound to its role (``self.role``) and reads the role's learnt state
(λ, the offsets, the engine); it owns what only committing needs (the worker's
producer and open transaction, the applier's checkpoint clock). Each logs under its
role's logger, as when it was the role's code.

The strategies:

* :class:`SnapshotCommit`, the single process (:class:`~streamsvi.service.daemon.Daemon`):
  a durable snapshot, then the offset commit (docs/design.md §6.2);
* :class:`TransactionCommit`, a scale-out worker
  (:class:`~streamsvi.service.roles.worker.Worker`): its deltas and their batches'
  offsets in one Kafka transaction (§6.7);
* :class:`PublishCommit`, the applier (:class:`~streamsvi.service.roles.applier.Applier`):
  publish λ for the workers, then checkpoint λ with the deltas offset and the
  applied ranges.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from ..checkpoint import pointer_number
from .config import client_security
from .console import plural, said_on_console
from .roles.snapshot_topic import publish_snapshot
from .roles.transport import MAX_DELTA_BYTES, Delta, bundle_size, check_delta_size, encode_bundle

daemon_log = logging.getLogger("streamsvi.daemon")
worker_log = logging.getLogger("streamsvi.worker")
applier_log = logging.getLogger("streamsvi.applier")


class CommitStrategy:
    """The interface the loop's stages call (module docs); every hook does nothing here.

    A role without a commit of its own (a toy loop in the tests) gets this one.
    """

    def __init__(self, role=None):
        self.role = role

    def after_batch(self, batch, source) -> None:
        """The batch is learnt (stage ``_advance``)."""

    def maybe_commit(self, source, dead_sink, loop) -> None:
        """Commit if one is due, once a turn with a batch (stage ``_maybe_checkpoint``)."""

    def on_idle(self, source, loop) -> None:
        """A turn without a batch whose poll did not fail (stage ``_idle``)."""

    def finish(self, source, dead_sink, loop) -> None:
        """The last commit of a run that ends (stage ``_finish``)."""


# ------------------------------------------------------------------ one process
class CheckpointFailed(RuntimeError):
    """The checkpoint storage failed mid-run (disk full, directory removed, unwritable).

    Nothing after the last durable snapshot was committed, so a restart once the
    storage is fixed reads those records again: nothing is lost. The CLI prints
    the message on one line and exits with ``exitcodes.STORAGE``.
    """


class SnapshotCommit(CommitStrategy):
    """The daemon's: a durable snapshot, then the offset commit.

    Offsets are committed only after a snapshot that includes the batches' updates
    is durable, so a crash at any instant neither loses a record nor counts it twice
    (the restart seeks to the snapshot's offsets). The positions advance at every
    batch (:meth:`after_batch`); a snapshot is taken every ``checkpoint.every_batches``
    updates or ``every_seconds`` and at a clean stop, never after a failure.
    """

    def after_batch(self, batch, source) -> None:
        """The batch's records (applied, held out or dead-lettered) are consumed."""
        d = self.role
        d.offsets.update(batch.next_offsets)
        d.metrics.set_lag(source.lag())

    def maybe_commit(self, source, dead_sink, loop) -> None:
        """Checkpoint (then commit) every ``checkpoint.every_batches`` updates or ``every_seconds``."""
        d = self.role
        ck, now = d.cfg["checkpoint"], time.monotonic()
        if loop.batches_since_ck >= ck["every_batches"] or now - loop.last_ck >= ck["every_seconds"]:
            if d.state is not None:
                self.checkpoint(source, dead_sink)
                loop.res.checkpoints += 1
            loop.last_ck, loop.batches_since_ck = now, 0

    def finish(self, source, dead_sink, loop) -> None:
        """Clean shutdown: checkpoint and commit what was applied."""
        d = self.role
        if d.state is not None:
            with said_on_console("streamsvi.checkpoint"):     # the line below says it
                snap = self.checkpoint(source, dead_sink)
            loop.res.checkpoints += 1
            print(f"checkpoint: {snap.path} (step {d.state.step}, "
                  f"{plural(d.state.records_seen, 'record')})", file=d.out, flush=True)

    def checkpoint(self, source, dead_sink):
        """Flush dead letters, snapshot (durable when it returns), then commit offsets.

        Dead letters go first: a restart seeks past every record the snapshot
        covers, bad ones included, so a dead letter still buffered when the
        snapshot is durable would be lost by a crash. (A crash between the
        flush and the snapshot writes those dead letters again on restart:
        at least once, never lost.)
        """
        from .daemon import _transient_errors

        d = self.role
        if d.state is None:
            return None
        offsets = [{"source": s, "partition": p, "offset": o} for (s, p), o in sorted(d.offsets.items())]
        extra = {"elbo_history": list(d.elbo_history)}
        if d.heldout is not None:
            extra["heldout"] = d.kind.to_json(d.heldout)
        if d.drift is not None:
            extra["drift"] = d.drift.to_dict()
        elif d._drift_saved is not None:     # resumed, not yet updated: keep what the snapshot had
            extra["drift"] = d._drift_saved
        try:
            dead_sink.flush()
            snap = d.store.save(d.engine, d.state, offsets, config=d.cfg, extra=extra)
            d._write_history()
        except OSError as exc:
            raise self._checkpoint_failed(exc) from None
        d.promotion.on_snapshot(snap)      # the first is promoted; later ones are candidates
        d.metrics.checkpoint_ts.set(time.time())
        d.metrics.checkpoints.inc()
        if not d.promotion.active:           # with promotion, the promoted ones (Promotion._decide)
            publish_snapshot(d, snap)        # checkpoint.snapshot_topic, when set (roles/snapshot_topic.py)
        try:
            source.commit(dict(d.offsets))   # only after the snapshot is durable
            d.health.answered()
        except _transient_errors() as exc:
            # not fatal: a restart seeks to the snapshot's offsets, not the committed ones,
            # and the next checkpoint commits newer offsets
            d.health.failed(exc, "offset commit")
            daemon_log.warning("offset commit failed (%s: %s); snapshot %s is durable, the next checkpoint "
                               "commits again", type(exc).__name__, exc, snap.path.name)
        return snap

    def _checkpoint_failed(self, exc: OSError) -> CheckpointFailed:
        """One line for a storage failure: what failed, where, and that nothing is lost."""
        d = self.role
        directory = d.cfg["checkpoint"]["directory"]
        gone = not os.path.isdir(directory)
        what = f"{exc.strerror or type(exc).__name__}" + (f" ({exc.filename})" if exc.filename else "")
        last = None if gone else pointer_number(directory)
        where = "the checkpoint directory was removed" if gone else f"writing to it failed: {what}"
        kept = f"snapshot {last} is the last durable one" if last else "no snapshot is durable"
        return CheckpointFailed(
            f"checkpoint in {directory} failed at step {d.state.step}: {where}. Nothing after the "
            f"last durable checkpoint was committed ({kept}), so a restart reads those records again "
            f"and nothing is lost: fix the storage, then restart")


# ------------------------------------------------------------------ a worker
#: Longest a worker waits for one transactional request (the offsets, the commit) before it
#: settles the transaction with a new producer (:meth:`TransactionCommit._settle`). kafka-python
#: 3.0.12 waits for them without a bound: a worker hung in ``send_offsets_to_transaction`` for
#: good after a 25 s broker outage (seen 1 run in 2 with two workers behind the fault proxy).
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


def abort_or_drop(strategy, logger, who: str) -> None:
    """Abort ``strategy.producer``'s open transaction; a producer that cannot is closed and
    dropped (``strategy.producer = None``): its successor's ``init_transactions`` aborts it."""
    try:
        strategy.producer.abort_transaction()
    except Exception as exc:  # noqa: BLE001 - the new producer settles it
        logger.info("%s: abort failed (%s: %s); a new producer aborts it", who, type(exc).__name__, exc)
        old, strategy.producer = strategy.producer, None
        try:
            old.close(timeout=0)
        except Exception:  # noqa: BLE001
            pass


@dataclass
class _Transaction:
    """The worker's open transaction: its batches' offset ranges and next offsets."""

    started: float
    batches: int = 0
    ranges: list = field(default_factory=list)      # [(topic, partition, first, end)]
    offsets: dict = field(default_factory=dict)     # (topic, partition) -> next offset
    payloads: list = field(default_factory=list)    # encoded deltas not sent yet (one bundle)
    sent: list = field(default_factory=list)        # (send future, bundle) of the bundles sent


class TransactionCommit(CommitStrategy):
    """A worker's: its deltas and their batches' offsets in one Kafka transaction.

    Either both are committed or neither: a record is consumed by the group exactly when
    its contribution is on the deltas topic for read_committed readers. A transaction of
    several batches (``scaleout.commit_every_batches``, or ``scaleout.commit_seconds`` old)
    sends their deltas as one message, a bundle (:func:`~.roles.transport.encode_bundle`),
    when it commits. It commits only as a stable member of the group owning the batches'
    partitions (:meth:`_still_owner`), and a transaction that fails or does not finish is
    settled by a new producer under the same transactional id (:meth:`_settle`). It owns
    the transactional producer (:meth:`open_producer`), which the worker's λ_0 proposals use too.

    Reads of the worker: ``_pending`` (the contribution of the batch in hand and its λ
    version, set by ``_learn``), ``_batch_ranges``, ``_give_back``, ``worker_id``, ``sc``,
    ``engine``, ``offsets`` (updated at each commit), ``health``, the metrics.
    """

    def __init__(self, role=None):
        super().__init__(role)
        self.producer = None        # the transactional producer (open_producer()), or None
        self.txn = None             # the open transaction (_Transaction), if any
        self.dead_sink = None       # the run's dead-letter sink, flushed in each commit (set by _set_aside)
        self.deltas_sent = 0        # batches whose deltas this worker committed

    def open_producer(self):
        """The transactional producer, started (``init_transactions``) if there is none."""
        w = self.role
        if self.producer is None:
            from kafka import KafkaProducer

            src = w.cfg["source"]
            self.producer = KafkaProducer(
                bootstrap_servers=src["bootstrap_servers"],
                transactional_id=f"streamsvi-{src['group_id']}-{w.worker_id}",
                transaction_timeout_ms=w.sc["transaction_timeout_ms"],
                max_request_size=MAX_DELTA_BYTES + (1 << 20),    # (a delta and the batch's framing)
                # a transaction's deltas go out together when it commits (the commit flushes),
                # not one produce request each
                linger_ms=int(w.sc["commit_seconds"] * 1000), batch_size=1 << 20,
                client_id=f"streamsvi-worker-{w.worker_id}", **client_security(w.cfg))
            self.producer.init_transactions()   # fences an older instance, aborts its open transaction
        return self.producer

    def close_producer(self) -> None:
        if self.producer is not None:
            self.producer.close(timeout=5)
            self.producer = None

    # ------------------------------------------------------------ the hooks
    def after_batch(self, batch, source) -> None:
        """The batch's delta joins the open transaction (begun if none is); the transaction is
        committed once it holds ``scaleout.commit_every_batches`` batches or is
        ``scaleout.commit_seconds`` old (:meth:`commit_open`), and at every empty poll and stop."""
        w = self.role
        if w._pending is None:              # held for the start (or given back): nothing to commit
            return
        c, version = w._pending
        w._pending = None
        ranges = w._batch_ranges
        if self._still_owner(source, ranges) is None:
            return
        delta = Delta(worker=w.worker_id, version=version, ranges=ranges,
                      records=0 if c is None else c.records, stats=None if c is None else c.arrays,
                      min_weight=1.0 if c is None else c.min_weight, extra={} if c is None else c.meta,
                      n_total=float(w.engine.n_total) if w.engine is not None else 0.0)
        payload = check_delta_size(delta.encode(), f"the delta of {delta.records} records")
        prod = self.open_producer()
        txn = self.txn
        if txn is None:
            prod.begin_transaction()
            txn = self.txn = _Transaction(started=time.monotonic())
        txn.ranges += ranges
        for t, p, _, end in ranges:
            txn.offsets[(t, p)] = end
        txn.batches += 1
        if txn.payloads and bundle_size(txn.payloads + [payload]) > MAX_DELTA_BYTES:
            try:                            # a full bundle goes now; the transaction stays open
                self._send_bundle(txn)
            except Exception as exc:  # noqa: BLE001 - the transaction is settled, whatever it was
                self.txn = None
                if not self._settle(source, txn.ranges, exc):
                    w._give_back(source, txn.ranges)
                return
        txn.payloads.append(payload)
        if txn.batches >= self.commit_every() or \
                time.monotonic() - txn.started >= w.sc["commit_seconds"]:
            self.commit_open(source)

    def commit_every(self) -> int:
        """Batches per transaction: ``scaleout.commit_every_batches``, else the default staleness
        bound of the model's storage (16; 4 for gradients): the k-th delta of a transaction is
        computed at the λ the transaction began with, k − 1 versions behind the applier when it
        is applied, so a worker's own deltas stay within the bound. One transaction per batch
        cost a worker 3× one process's CPU per record and the broker 19× (3.5 ms of tansu's CPU
        per transaction: ``bench/scaleout.py``)."""
        w = self.role
        n = w.sc["commit_every_batches"]
        if n is None:
            from ..inference import split
            from .roles.applier import MAX_STALENESS

            n = getattr(split.splitter_for(w.engine), "max_staleness", MAX_STALENESS) \
                if w.engine is not None else 1
        return int(n)

    def on_idle(self, source, loop) -> None:
        """A quiet stream (or its end) does not keep the open transaction open: commit it."""
        if self.txn is not None and not loop.failed_poll:
            self.commit_open(source)

    def finish(self, source, dead_sink, loop) -> None:
        """Commit the open transaction (if this worker still owns its partitions), flush the dead
        letters, close the producer; nothing to checkpoint: the transactions are the worker's
        commits."""
        w = self.role
        if self.txn is not None:
            try:
                self.commit_open(source)
            except Exception as exc:  # noqa: BLE001 - uncommitted batches are read again by the group
                worker_log.warning("worker %s: the last transaction was not committed (%s: %s); its "
                                   "batches will be read again", w.worker_id, type(exc).__name__, exc)
        dead_sink.flush()
        self.close_producer()

    # ------------------------------------------------------- the transaction
    def _send_bundle(self, txn) -> None:
        """Send the transaction's unsent deltas as one message (a bundle)."""
        w = self.role
        payloads, txn.payloads = txn.payloads, []
        bundle = encode_bundle(payloads)
        txn.sent.append((self.producer.send(w.sc["deltas_topic"], bundle, key=w.worker_id.encode(),
                                            partition=0), bundle))

    def _still_owner(self, source, ranges):
        """This worker's group membership if it is a stable member owning every partition of
        ``ranges`` (what the commit sends with the offsets: the one checked); else None, the
        open transaction aborted and its batches and ``ranges`` read again (by this worker or
        the partitions' new owners)."""
        w = self.role
        member = source.membership()
        owned = source.assignment()
        if member is not None and all((t, p) in owned for t, p, _, _ in ranges):
            return member
        # The group has moved on (the broker dropped this member during an outage, or a
        # rebalance took the partition): the partition's new owner reads these records
        # from the group's committed offsets, so committing them here would hand the
        # applier an overlapping delta (seen after a 25 s outage: a member the broker
        # no longer knew went on committing for 4 s).
        txn, self.txn = self.txn, None
        back = (txn.ranges if txn is not None else []) + list(ranges)
        worker_log.info("worker %s: not a stable member owning %s any more; %s read again, "
                        "not committed", w.worker_id, sorted({(t, p) for t, p, _, _ in back}),
                        plural(1 + (txn.batches if txn is not None else 0), "batch", "batches"))
        w.scaleout_metrics.withheld.inc(1 + (txn.batches if txn is not None else 0))
        if txn is not None:
            self._abort()
        w._give_back(source, back)
        return None

    def _abort(self) -> None:
        abort_or_drop(self, worker_log, f"worker {self.role.worker_id}")

    def commit_open(self, source) -> None:
        """Commit the open transaction: its deltas, the dead letters flushed, its batches' offsets,
        all or nothing. Nothing to do without one."""
        from kafka import TopicPartition

        from ..io._kafka import offset_and_metadata

        w = self.role
        txn = self.txn
        if txn is None:
            return
        member = self._still_owner(source, txn.ranges)
        if member is None:
            return
        self.txn = None
        offsets = {TopicPartition(t, p): offset_and_metadata(end) for (t, p), end in txn.offsets.items()}
        prod = self.open_producer()
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
                w._give_back(source, txn.ranges)
                return
        self._remember_sent(txn)
        self.deltas_sent += txn.batches
        w.scaleout_metrics.deltas_sent.inc(txn.batches)
        w.scaleout_metrics.transactions.inc()
        w.offsets.update(txn.offsets)
        w.metrics.set_lag(source.lag())

    def _remember_sent(self, txn) -> None:
        """Hand the committed bundles to the worker's λ reader, which replays their steps from
        these bytes instead of reading them back (:meth:`.roles.lambda_log.LambdaLog.remember`)."""
        remember = getattr(self.role.lam, "remember", None)
        if remember is None:
            return                                   # λ as a shared file: no replay
        for future, bundle in txn.sent:
            if future.is_done and future.succeeded():
                remember(future.value.offset, bundle)

    def _settle(self, source, ranges, exc) -> bool:
        """After a transaction that failed or did not finish: was it committed? (True: it was.)

        The producer is dropped and a new one with the same transactional id initialised:
        its ``init_transactions`` completes the old transaction if its commit had begun and
        aborts it otherwise. Then the group's committed offsets say which it was. A batch
        not committed is read again; one committed is done (reading it again would send a
        second delta, which the applier skips only if its ranges come out the same).
        """
        w = self.role
        worker_log.warning("worker %s: transaction for %s did not complete (%s: %s); settling it with a "
                           "new producer", w.worker_id, ranges, type(exc).__name__, exc)
        old, self.producer = self.producer, None
        if old is not None:
            try:
                old.close(timeout=0)
            except Exception:  # noqa: BLE001 - it is being replaced
                pass
        from .daemon import _transient_errors

        while not w._stop.is_set():
            try:
                self.open_producer()        # init_transactions settles the old transaction
                w.health.answered()
                break
            except _transient_errors() as e:
                worker_log.info("worker %s: cannot start a producer yet (%s: %s)", w.worker_id,
                                type(e).__name__, e)
                w.health.wait(w._stop, w.health.failed(e, "starting a producer"))
        else:
            return False                    # a stop: the group's offsets tell the next start
        try:
            committed = source.committed({(t, p) for t, p, _, _ in ranges})
        except _transient_errors():
            return False
        done = all(committed.get((t, p), -1) >= end for t, p, _, end in ranges)
        worker_log.warning("worker %s: the transaction for %s was %s", w.worker_id, ranges,
                           "committed after all" if done else "not committed; reading the batch again")
        return done

    def _dead_sink_flush(self):
        sink = self.dead_sink
        if sink is not None:
            sink.flush()


# ------------------------------------------------------------------ the applier
class PublishCommit(CommitStrategy):
    """The applier's: publish λ for the workers, then checkpoint λ, the deltas offset and the
    applied ranges; every turn while active (an empty poll's too: the applier's ``_poll``
    returns an empty batch then), and at the end, also after a failed stage (its state is
    whole after every delta). The deltas offset is committed after the snapshot for lag
    monitoring only: a takeover seeks to the snapshot's offset. λ publication itself is the
    applier's (``Applier._publish``: the lambda topic or the λ file).
    """

    def __init__(self, role=None):
        super().__init__(role)
        self.last_ck = None         # monotonic time of the last checkpoint (or of the first turn)

    def maybe_commit(self, consumer, dead_sink, loop) -> None:
        """Publish λ (``Applier._publish``), then checkpoint every ``checkpoint.every_batches``
        state changes or ``every_seconds``."""
        a = self.role
        a._publish()
        ck, now, res = a.cfg["checkpoint"], time.monotonic(), loop.res
        last = self.last_ck
        if last is None:
            self.last_ck = last = now
        if a.state is not None and a._since_ck and (
                a._since_ck >= ck["every_batches"] or now - last >= ck["every_seconds"]):
            self.checkpoint(consumer)
            res.checkpoints += 1

    def finish(self, consumer, dead_sink, loop) -> None:
        """The last publication and checkpoint of an active applier."""
        a, res = self.role, loop.res
        if a.active and a.state is not None:
            a._publish(force=True)
            if a._since_ck:
                with said_on_console("streamsvi.checkpoint"):     # the line below says it
                    snap = self.checkpoint(consumer)
                res.checkpoints += 1
                print(f"checkpoint: {snap.path} (step {a.state.step}, "
                      f"{plural(a.state.records_seen, 'record')})", file=a.out, flush=True)

    def checkpoint(self, consumer):
        """Snapshot λ, the deltas offset and the applied ranges (durable), then commit the offset."""
        from kafka import TopicPartition

        from ..io._kafka import offset_and_metadata

        a = self.role
        topic = a.sc["deltas_topic"]
        extra = {"scaleout": a.scaleout_extra()}
        snap = a.store.save(a.engine, a.state,
                            [{"source": topic, "partition": 0, "offset": a.next_offset}],
                            config=a.cfg, extra=extra)
        a.metrics.checkpoints.inc()
        a.metrics.checkpoint_ts.set(time.time())
        a._since_ck, self.last_ck = 0, time.monotonic()
        try:      # for lag monitoring only: a takeover seeks to the snapshot's offset
            consumer.commit({TopicPartition(topic, 0): offset_and_metadata(a.next_offset)})
        except Exception as exc:     # noqa: BLE001 - the snapshot is what counts
            applier_log.warning("committing deltas offset %d failed (%s); the snapshot holds it",
                                a.next_offset, exc)
        return snap
