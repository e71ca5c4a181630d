"""The applier role (``streamsvi run --role applier``): the one writer of λ.

Appliers form a consumer group (``scaleout.applier_group_id``) on the deltas
topic, which has one partition: the member the group assigns partition 0 is
active, the others stand by with no state. :meth:`Applier.run` is the loop of
named stages of :mod:`streamsvi.service.loop` (the daemon's and the worker's),
configured: ``_start`` (metrics, consumer), then per turn ``_stop_condition``
(a signal, ``max_deltas``, ``timeout``), ``_poll`` (read_committed, filtered on
the client by :mod:`streamsvi.io.committed` as well: deltas of aborted or open
worker transactions are never applied, on a broker that lists aborted
transactions in its fetches or one that only writes the markers, as tansu
0.6.0; None while standing by, the released deltas, maybe none, while active),
``_learn`` (``_apply`` to each delta: dedup, staleness, the storage's step:
:mod:`streamsvi.inference.split`), ``_maybe_checkpoint`` (its commit strategy,
:class:`~streamsvi.service.commit.PublishCommit`: ``_publish``, λ for the
workers, then a checkpoint every ``checkpoint.every_batches`` deltas or
``every_seconds``; on every turn while active, an empty poll's too);
``_take_over`` when partition 0 is assigned, ``_hand_over`` when it is revoked,
``_finish`` at the end (also when a stage raised: the strategy's last
publication and checkpoint). The other stages do nothing.

Publishing λ. On the lambda topic (``scaleout.lambda_topic``, the default;
:mod:`.lambda_log`): each takeover starts a new lineage with a full λ of the
resumed state (after λ_0 is adopted, if there was no snapshot); every applied
delta adds a step record (its deltas-topic offset and ρ scale), written at the
end of the poll that applied it, in one transaction with a full λ when one is
due (``lambda_full_every`` versions, or deltas of ``lambda_full_ratio`` times
the last full λ's bytes). A failed write is logged and followed by a new
lineage. With ``scaleout.lambda_file`` set, λ is written to that file instead
(at most every ``publish_seconds``).

Exactly once. The checkpoint (``CheckpointStore``) holds λ, the next offset
of the deltas topic, and per data partition the offset up to which deltas were
applied (``applied_end``) with the merged applied ranges; so does every full λ
on the lambda topic (:mod:`.lambda_log`). On takeover the active applier opens
its λ writer (fencing its predecessor), resumes from the newer of its latest
snapshot and the lambda topic's latest full λ (a standby on another host, with
an empty directory, needs nothing else), and seeks the deltas topic to its
offset, so the deltas after it are applied again to the state before them:
once. A delta whose data ranges all end at or before ``applied_end`` (a zombie
worker's late transaction, the same delta twice) is skipped as a duplicate; one
that overlaps partly is skipped as an overlap and logged as an error (it cannot
be split). One that starts past the applied end of a partition
is applied, and the gap logged as an error and counted
(``streamsvi_delta_gaps_total``). Workers keep both from happening: a worker that
is no longer a stable member owning a batch's partitions reads the batch again
instead of committing it, and its transactions carry its group membership, so a
broker with KIP-447 fences a member the group has moved on from.

Broker health. One :class:`~streamsvi.service.health.BrokerHealth` (``self.health``,
kept across takeovers) takes the failed polls and λ writes and the answers: it sets
``streamsvi_broker_up`` and ``streamsvi_broker_retries_total``, logs an outage once
when it starts and once when it ends, and gives the poll's backoff, as in the daemon.

Takeover bound: a killed active applier's partition goes to a standby after
the group notices (``source.session_timeout_ms``) plus one rebalance (about
half a session timeout on tansu), plus the resume and the replay of the
deltas since the last checkpoint (or full λ, at most ``lambda_full_every`` versions).
"""
from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ...checkpoint import CheckpointStore, check_compatible
from ...inference.engine import EngineState
from ...io import committed
from ...io.callguard import CallGuard, StuckCall, close_in_background
from ..commit import PublishCommit
from ..config import build_engine, client_security
from ..daemon import _transient_errors
from ..health import BrokerHealth
from ..loop import StagedLoop, _Loop
from ..metrics import DaemonMetrics, ScaleoutMetrics
from ...inference import split
from .lambda_log import LambdaLogWriter
from .transport import (MAX_DELTA_BYTES, ChunkAssembler, Delta, DeltaFormatError, init_state, is_chunk,
                        publish_lambda, split_parts)
from .worker import check_scaleout_config, lambda_channel

log = logging.getLogger("streamsvi.applier")

#: The staleness bound of statistic deltas when ``scaleout.max_staleness`` is unset (a splitter
#: may name its own: ``max_staleness``; the gradient path's is 4).
MAX_STALENESS = 16
#: Poll length of the applier's consumer (≥ 0.5 s: shorter polls can keep a tansu group join from finishing).
POLL_S = 0.5
#: How long past :data:`POLL_S` a poll of the applier's consumer may run before it is abandoned
#: and the consumer replaced (:mod:`streamsvi.io.callguard`; the source's ``STUCK_POLL_S``).
STUCK_POLL_S = 30.0


@dataclass
class ApplierResult:
    """What one ``Applier.run`` did."""

    deltas: int = 0
    records: int = 0
    skipped: int = 0
    checkpoints: int = 0
    takeovers: int = 0
    stopped_by: str = ""
    took_over_at: list = field(default_factory=list)    # monotonic times partition 0 was assigned


@dataclass
class _Deltas:
    """The batch of one applier turn: the released deltas of a poll, in offset order."""

    x: list


def _key(t, p) -> str:
    return f"{t}/{int(p)}"


def fenced(exc) -> bool:
    """Whether a write failed because another producer took the transactional id over:
    ``ProducerFencedError`` raised, or wrapped (kafka-python 3.0 can raise a plain
    ``KafkaError`` naming it at send time, or chain it as the cause). Counting a fenced
    writer's error as a failed write would open a new writer at the next turn, whose
    ``init_transactions`` fences the active applier in turn."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if type(exc).__name__ == "ProducerFencedError" or "ProducerFencedError" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Applier(StagedLoop):
    """The applier (module docs). ``cfg`` is a validated config with a ``[scaleout]`` table.

    The loop configured with its own stages and commit strategy
    (:class:`~streamsvi.service.commit.PublishCommit`: λ published, then a checkpoint).
    """

    count_limit = ("max_deltas", "deltas")
    finish_on_error = True      # publish and checkpoint what was applied, whatever ended the run
    commit_strategy = PublishCommit

    def __init__(self, cfg: dict, registry=None, out=None):
        check_scaleout_config(cfg)
        self.cfg, self.sc = cfg, cfg["scaleout"]
        self.metrics = DaemonMetrics(registry)
        self.sm = ScaleoutMetrics(self.metrics.registry)
        self.out = out if out is not None else sys.stderr
        #: whether the brokers answer (:mod:`streamsvi.service.health`); kept across takeovers
        self.health = BrokerHealth(self.metrics, cfg["source"]["bootstrap_servers"],
                                   cfg["source"]["connect_backoff_seconds"], role="the applier", log=log,
                                   errors=_transient_errors())
        self.store = CheckpointStore(cfg["checkpoint"]["directory"], keep=cfg["checkpoint"]["keep"])
        how, where = lambda_channel(cfg)
        self.lambda_file = where if how == "file" else None
        self.lambda_topic = where if how == "topic" else None
        self._writer = None                  # LambdaLogWriter of this takeover (lambda_topic)
        self.group = self.sc["applier_group_id"] or f"{cfg['source']['group_id']}-applier"
        self._init_stop()
        self.active = False
        self._txn = committed.CommittedFilter()   # the deltas of committed transactions only
        self._chunks = ChunkAssembler()           # a large λ_0 proposal's chunks, until its last
        #: the commit strategy (:mod:`streamsvi.service.commit`), called by the loop's stages
        self.commit = self.commit_strategy(self)
        self._reset()

    def _reset(self):
        self.engine = self.state = None
        self.next_offset = 0                 # next offset of the deltas topic to apply
        self.applied_end: dict = {}          # "topic/partition" -> end of the applied ranges
        self.applied: dict = {}              # "topic/partition" -> merged [[first, end], ...]
        self.dropped_records = 0
        self._since_ck = 0
        self._dirty = False                  # λ changed since the last publication
        self._steps: list = []               # (version, deltas offset, part, rho_scale) not yet on lambda_topic
        self._need_full = False              # a full λ is due on lambda_topic (takeover, λ_0, a failed write)
        self._since_full = [0, 0]            # versions and delta bytes since the last full λ
        self._full_bytes = 0                 # bytes of the last full λ written
        self._fenced = False                 # another applier's writer took the lambda topic over

    # -------------------------------------------------------------- run
    def run(self, max_deltas: int | None = None, timeout: float | None = None) -> ApplierResult:
        """Apply deltas until a stop (signal, ``max_deltas`` applied, ``timeout`` seconds)."""
        return self._run(_Loop(ApplierResult(), limit=max_deltas, timeout=timeout))

    def _start(self, stack, loop):
        """Metrics server and the consumer of the deltas topic, its rebalance listener
        taking partition 0 over and handing it over. Returns ``(consumer, None)``: the
        consumer as the stages see it, whichever is current (:meth:`_replace_consumer`)."""

        mc, res = self.cfg["metrics"], loop.res
        if mc["enabled"]:
            server, _ = self.metrics.serve(mc["port"], mc["host"])
            stack.callback(server.server_close)     # release the port (runs last)
            stack.callback(server.shutdown)         # stop serve_forever
            print(f"metrics: http://{mc['host']}:{server.server_port}/metrics", file=self.out, flush=True)
        stack.callback(self._close_consumer)    # after _finish (runs first)
        consumer = self._open_consumer(res)
        topic, src = self.sc["deltas_topic"], self.cfg["source"]
        parts = consumer.partitions_for_topic(topic)
        if not parts or len(parts) != 1:
            raise ValueError(f"scaleout.deltas_topic: topic {topic!r} has "
                             f"{len(parts) if parts else 'no'} partitions at {src['bootstrap_servers']}; "
                             f"create it with exactly one (deltas are applied in order)")
        print(f"applier: joined group {self.group!r} on {topic!r} (active once it holds the partition)",
              file=self.out, flush=True)
        return _Current(self), None

    def _open_consumer(self, res):
        """A consumer of the deltas topic in the appliers' group (``self._consumer``), guarded
        (:attr:`_guard`), its rebalance listener taking partition 0 over and handing it over
        while it is the current one (:meth:`_replace_consumer`)."""
        from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
        from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor

        src, topic = self.cfg["source"], self.sc["deltas_topic"]
        consumer = KafkaConsumer(bootstrap_servers=src["bootstrap_servers"], group_id=self.group,
                                 enable_auto_commit=False, isolation_level="read_committed",
                                 auto_offset_reset="earliest", client_id="streamsvi-applier",
                                 session_timeout_ms=src["session_timeout_ms"],
                                 heartbeat_interval_ms=src["heartbeat_interval_ms"],
                                 max_partition_fetch_bytes=MAX_DELTA_BYTES + (1 << 20),
                                 fetch_max_bytes=MAX_DELTA_BYTES + (1 << 20),
                                 # a standby joining must not take partition 0 from the active
                                 # applier and hand it back (eager rebalancing did: a checkpoint,
                                 # a resume and a full λ on the lambda topic every time)
                                 partition_assignment_strategy=(CooperativeStickyAssignor,),
                                 **client_security(self.cfg))
        if not committed.install(consumer):
            consumer.close(autocommit=False)
            raise RuntimeError("this kafka-python has no Fetcher.PartitionRecords hook: the applier "
                               "cannot tell committed deltas from aborted ones (install kafka-python 3.0)")
        self._consumer, self._guard = consumer, CallGuard(consumer, f"applier of {self.group}")
        applier = self

        class _Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                if applier._consumer is consumer and applier.active \
                        and any(tp.partition == 0 for tp in revoked):
                    applier._hand_over(consumer, res)

            def on_partitions_assigned(self, assigned):
                if applier._consumer is consumer and \
                        any(tp.topic == topic and tp.partition == 0 for tp in assigned):
                    applier._take_over(consumer, TopicPartition(topic, 0), res)

        consumer.subscribe([topic], listener=_Listener())
        return consumer

    def _replace_consumer(self, res) -> None:
        """The consumer's poll never returned (:mod:`streamsvi.io.callguard`): hand partition 0
        over as a rebalance would (checkpoint, stand by), close that consumer in the
        background and join the group with a new one. Whichever applier the group gives
        partition 0 resumes from the newer of the checkpoint and the lambda topic's full λ."""
        old, guard = self._consumer, self._guard
        log.warning("applier: replacing its consumer of %r (a new member of the group %r)",
                    self.sc["deltas_topic"], self.group)
        self._consumer = None                # the old listener is deaf from here on
        if self.active:
            try:
                with guard.watch(STUCK_POLL_S):  # the checkpoint commits its offset on ``old``
                    self._hand_over(old, res)
            except StuckCall:
                pass                             # the snapshot was durable before the commit
            except _transient_errors() as exc:
                log.warning("applier: handing over before the replacement: %s: %s", type(exc).__name__, exc)
        guard.close()
        self.metrics.consumers_replaced.inc()
        close_in_background(old, "streamsvi-applier-close")
        self._open_consumer(res)

    def _close_consumer(self) -> None:
        consumer, guard = getattr(self, "_consumer", None), getattr(self, "_guard", None)
        if consumer is None:
            return
        guard.close_client(consumer, STUCK_POLL_S)

    def in_group(self) -> bool:
        """Whether this applier is a stable member of the appliers' group (active or standing by)."""
        from kafka.structs import MemberState

        consumer = getattr(self, "_consumer", None)
        if consumer is None:
            return False
        meta = consumer.group_metadata()
        return meta.state is MemberState.STABLE and meta.generation_id >= 0 and bool(meta.member_id)

    def _take_over(self, consumer, tp, res):
        """Partition 0 is ours: resume from the newer of the local snapshot and, with the lambda
        topic, its latest full λ (:meth:`_topic_full`), and seek the deltas topic there."""
        self._drop_writer()                  # a new lineage on the lambda topic
        self._reset()
        snap, topic = self.store.resume(), None
        if self.lambda_topic is not None:
            self._open_writer_to_resume()      # (fences a zombie before the topic is read)
            topic = self._topic_full(None if snap is None else self._snap_offset(snap))
        if topic is not None and (snap is None or self._snap_offset(topic) > self._snap_offset(snap)):
            snap, where = topic, (f"the lambda topic's full λ version {topic.state.step} "
                                  f"(lineage {topic.meta['lineage']})")
        elif snap is not None:
            where = f"snapshot {snap.number} (step {snap.state.step}) of checkpoint {self.store.directory}"
        else:
            where = "no snapshot"
        if snap is not None:
            n = self.cfg["inference"]["n_total"]
            engine = build_engine(self.cfg, snap.engine.n_total if n == "auto" else float(n))
            for note in check_compatible(snap, engine):
                log.warning("settings changed since the checkpoint: %s", note)
            self.engine, self.state = engine, snap.state
            self.next_offset = self._snap_offset(snap)
            sc = (snap.extra or {}).get("scaleout", {})
            self.applied_end = {k: int(v) for k, v in sc.get("applied_end", {}).items()}
            self.applied = {k: [list(r) for r in v] for k, v in sc.get("applied", {}).items()}
            self.dropped_records = int(sc.get("dropped_records", 0))
            self.metrics.step.set(self.state.step)
            self.metrics.records_seen.set(self.state.records_seen)
            self._dirty = self._need_full = True
            self._publish()
        consumer.seek(tp, self.next_offset)
        self._txn.reset()
        self.active = True
        self.sm.active.set(1)
        res.takeovers += 1
        res.took_over_at.append(time.monotonic())
        log.info("applier active: resumed from %s, deltas from offset %d", where, self.next_offset)
        print(f"applier: active from {where}, deltas offset {self.next_offset}", file=self.out, flush=True)

    def _snap_offset(self, snap) -> int:
        """The next deltas offset a snapshot (or :meth:`_topic_full`'s) has not applied."""
        return next((int(o["offset"]) for o in snap.offsets if o["source"] == self.sc["deltas_topic"]), 0)

    def _open_writer_to_resume(self):
        """Open the λ writer before reading the lambda topic to resume: its
        ``init_transactions`` fences a zombie predecessor and aborts its open transaction, so
        nothing commits on the topic after the read. A broker that does not answer: logged,
        and the writer is opened at the first publication (as before)."""
        try:
            self._open_writer()
        except _transient_errors() as exc:
            self._drop_writer()
            log.warning("lambda topic %r: the λ writer could not be opened (%s: %s)", self.lambda_topic,
                        type(exc).__name__, exc)

    def _topic_full(self, beyond):
        """The lambda topic's latest complete full λ as a :class:`~streamsvi.checkpoint.Snapshot`
        (``extra["scaleout"]``: its bookkeeping, ``offsets``: its deltas offset), or None; also
        None without loading it when its deltas offset is not beyond ``beyond`` (the local
        snapshot's: :meth:`~.lambda_log.LambdaLog.latest_full`).

        Read only once the writer is open (:meth:`_open_writer_to_resume`; if it could not be,
        the topic is not read). A full λ without the applier's bookkeeping (an older
        applier's) is not resumed from: its duplicates would be applied again. A broker that
        does not answer, or a full λ that does not load: None (logged), the local snapshot is
        resumed."""
        from datetime import datetime, timezone
        from pathlib import Path

        from ...checkpoint import Snapshot
        from .lambda_log import LambdaLog

        if self._writer is None:
            return None
        reader = LambdaLog(self.cfg["source"]["bootstrap_servers"], self.lambda_topic, self.sc["deltas_topic"],
                           security=client_security(self.cfg), client_id="streamsvi-applier-resume")
        try:
            got = reader.latest_full(beyond)
        except (*_transient_errors(), ValueError) as exc:
            log.warning("lambda topic %r: its latest full λ could not be read (%s: %s); resuming from the "
                        "local checkpoint", self.lambda_topic, type(exc).__name__, exc)
            return None
        if got is None:
            return None
        engine, state, info = got
        if info["applier"] is None:
            log.warning("lambda topic %r: the latest full λ (version %d, deltas offset %d) has no applier "
                        "bookkeeping (an older applier wrote it): not resumed from, it cannot tell "
                        "duplicates; resuming from the local checkpoint", self.lambda_topic, state.step,
                        info["deltas_offset"])
            return None
        return Snapshot(path=Path(f"lambda topic {self.lambda_topic}"), number=-1, engine=engine, state=state,
                        offsets=[{"source": self.sc["deltas_topic"], "partition": 0,
                                  "offset": info["deltas_offset"]}],
                        config={}, created=datetime.now(timezone.utc), version="",
                        extra={"scaleout": info["applier"]}, meta={"lineage": info["lineage"]})

    def scaleout_extra(self) -> dict:
        """The applier's dedup bookkeeping (a copy): ``applied_end``, ``applied`` and
        ``dropped_records``, as the checkpoint's ``extra["scaleout"]`` and a full λ's
        ``applier.json`` hold it."""
        return {"applied_end": dict(self.applied_end), "applied": {k: [list(r) for r in v]
                                                                 for k, v in self.applied.items()},
                "dropped_records": int(self.dropped_records)}

    def _hand_over(self, consumer, res):
        """Partition 0 is revoked (a clean rebalance): checkpoint, then stand by without state."""
        if self.state is not None and self._since_ck:
            self.commit.checkpoint(consumer)
            res.checkpoints += 1
        self._publish(force=True)
        self._drop_writer()
        self.active = False
        self.sm.active.set(0)
        self._reset()
        log.info("applier standing by: the deltas partition went to another applier")

    def _poll(self, consumer, loop):
        """The deltas of one poll, in offset order (:class:`_Deltas`; none while the brokers
        are away), or None while this applier stands by (the poll may take partition 0 over
        or hand it over: :meth:`_take_over`, :meth:`_hand_over`).

        A poll that raises because the brokers went away applied nothing: report it to
        :attr:`health`, wait its backoff (as the daemon's poll: ``source.connect_backoff_seconds``
        doubling up to :data:`~streamsvi.service.health.MAX_POLL_BACKOFF_S`) and poll again
        (kafka-python reconnects by itself). It used to end the applier with a traceback.
        A poll that returns is an answer (the applier has no idle probe).
        """
        try:
            if self._consumer is None:           # a replacement found no broker: try again
                self._open_consumer(loop.res)
            with self._guard.watch(POLL_S + STUCK_POLL_S):
                polled = self._consumer.poll(timeout_ms=int(POLL_S * 1000), max_records=10000)
        except StuckCall:
            try:
                self._replace_consumer(loop.res)
            except _transient_errors() as exc:   # no broker for the new consumer: next poll
                self.health.wait(self._stop, self.health.failed(exc, "replacing the consumer"))
            return _Deltas([]) if self.active else None
        except _transient_errors() as exc:
            self.health.wait(self._stop, self.health.failed(exc, "poll"))
            return _Deltas([]) if self.active else None
        self.health.answered()
        out = []
        for msgs in polled.values():
            out += msgs
        aborted = self._txn.aborted_records
        released = self._txn.feed(sorted(out, key=lambda m: m.offset))
        if self._txn.aborted_records > aborted:
            # a worker's transaction that did not commit (killed, or it lost its partitions):
            # its successor reads those records again
            self.sm.skipped.labels(reason="aborted").inc(self._txn.aborted_records - aborted)
        return _Deltas(released) if self.active else None

    def _learn(self, x, consumer, loop):
        """Apply the deltas of the turn, in offset order (:meth:`_apply`)."""
        for msg in x:
            self._apply(msg, loop.res)

    # ------------------------------------------------------------- apply
    def _apply(self, msg, res):
        """One message of the deltas topic: a delta, or a worker transaction's bundle of them
        (:func:`~.transport.split_parts`), each applied in order (:meth:`_apply_part`)."""
        if msg.offset < self.next_offset:          # already in the state (a seek raced a fetch)
            return
        self.next_offset = msg.offset + 1
        try:
            if is_chunk(msg.value):
                parts = self._join(msg)
            else:
                parts = split_parts(msg.value)
        except DeltaFormatError as exc:
            log.error("deltas topic offset %d: %s; skipped", msg.offset, exc)
            self._skip("bad", res)
            return
        for i, data in enumerate(parts):
            self._apply_part(msg.offset, i, data, res)

    def _join(self, msg) -> list:
        """A chunk of a λ_0 proposal too large for one message (:class:`~.transport.ChunkAssembler`):
        ``[the proposal]`` once its last chunk is read, else ``[]``. Once λ_0 is adopted,
        chunks are skipped unread: later proposals are ignored anyway, and joining them would
        hold whole λs in memory (800 MB each for LDA at V = 10⁶). Before λ_0 the applier
        writes no checkpoint, so a restart reads every chunk again."""
        if self.state is not None:
            return []
        whole = self._chunks.feed(msg.value)
        if whole is None:
            return []
        if Delta.peek_kind(whole) != "init":
            raise DeltaFormatError("a chunked message that is not a λ_0 proposal (only those are chunked)")
        return [whole]

    def _apply_part(self, offset, part, data, res):
        """One delta: decode, deduplicate, weigh staleness, step."""
        try:
            d = Delta.decode(data)
        except DeltaFormatError as exc:
            log.error("deltas topic offset %d part %d: %s; skipped", offset, part, exc)
            self._skip("bad", res)
            return
        if d.kind == "init":
            if self.state is None:
                n = self.cfg["inference"]["n_total"]
                try:
                    _, proposed = init_state(d)
                except DeltaFormatError as exc:
                    log.error("deltas topic offset %d part %d: %s; skipped", offset, part, exc)
                    self._skip("bad", res)
                    return
                self.engine = build_engine(self.cfg, d.n_total if n == "auto" else float(n))
                rng = np.random.Generator(np.random.PCG64(self.cfg["inference"]["seed"]))
                self.state = EngineState(step=0, lam=proposed.lam, rng_state=rng.bit_generator.state,
                                         records_seen=0, aux=proposed.aux)
                self._dirty = self._need_full = True
                self._since_ck += 1
                log.info("applier: λ_0 proposed by worker %s adopted (N = %g)", d.worker, self.engine.n_total)
            return
        if self.state is None and d.stats is not None:
            log.error("deltas topic offset %d: a delta from worker %s before any λ_0 (the checkpoint "
                      "directory was lost?); skipped", offset, d.worker)
            self._skip("no_state", res)
            return
        # (a delta without statistics, a batch whose records were all set aside, may come
        # before λ_0: its offset ranges are recorded as applied, nothing else happens)
        ends = [self.applied_end.get(_key(t, p), -1) for t, p, _, _ in d.ranges]
        if d.ranges and all(e >= end for e, (_, _, _, end) in zip(ends, d.ranges)):
            self._skip("duplicate", res)
            return
        if any(first < e for e, (_, _, first, _) in zip(ends, d.ranges)):
            log.error("delta from worker %s covers %s, which overlaps ranges already applied (up to "
                      "%s); skipped, its records may be lost", d.worker, d.ranges, ends)
            self._skip("overlap", res)
            return
        gaps = [(t, p, e, first) for e, (t, p, first, _) in zip(ends, d.ranges) if 0 <= e < first]
        if gaps:
            # applied, but no delta carried the records in between: a lost commit (never expected)
            log.error("delta from worker %s starts past the applied ranges: %s; those records were "
                      "never applied", d.worker, ", ".join(f"{t}[{p}] {e}..{first}" for t, p, e, first in gaps))
            self.sm.gaps.inc(len(gaps))
        staleness = 0 if self.state is None else max(self.state.step - d.version, 0)
        self.sm.staleness.labels(worker=d.worker).set(staleness)
        bound = self.max_staleness()
        records = d.records
        if d.stats is not None and staleness > bound and self.sc["stale_policy"] == "drop":
            self._skip("stale", res)
            self.dropped_records += d.records
            records = 0
        elif d.stats is not None:
            scale = 1.0 if staleness <= bound else bound / staleness
            c = split.Contribution(arrays=d.stats, records=d.records, min_weight=d.min_weight, meta=d.extra)
            try:
                if not all(np.isfinite(a).all() for a in c.arrays.values()):
                    raise FloatingPointError("its statistics are not all finite")
                self.state, done = split.apply(self.engine, self.state, c, scale)
            except (ValueError, FloatingPointError) as exc:
                # A delta that does not fit the model (another model's worker, a corrupt one)
                # or would make λ non-finite: set aside, never applied, its records counted as
                # dropped and its ranges as consumed. It used to end the active applier, and
                # the standby on the same delta after it, for ever.
                why = "non_finite" if isinstance(exc, FloatingPointError) else "bad"
                log.error("deltas topic offset %d: the delta of worker %s (%s) cannot be applied (%s); "
                          "set aside, its %d records not learnt", offset, d.worker, d.ranges, exc,
                          d.records)
                self._skip(why, res)
                self.dropped_records += d.records
                records, done = 0, None
            if done is not None:
                self._after_step(done, c, (offset, part, len(data)), scale)
        self._account(d, records, res)

    def _after_step(self, done, c, where, scale):
        """Metrics and the lambda log's step record of one applied delta (``where``: its offset,
        part and bytes)."""
        offset, part, nbytes = where
        self._observe(done, c)
        self._steps.append((done.step, offset, part, scale))
        self._since_full[0] += 1
        self._since_full[1] += nbytes
        self.metrics.rho.set(done.rho)
        self.metrics.step.set(done.step)
        if done.domain_clipped:
            self.metrics.domain_clipped.inc(done.domain_clipped)
            self.metrics.domain_updates.inc()
        self._dirty = True

    def _account(self, d, records, res):
        """The delta's offset ranges are consumed (applied, dropped or set aside), its records counted."""
        for t, p, first, end in d.ranges:
            k = _key(t, p)
            self.applied_end[k] = end
            runs = self.applied.setdefault(k, [])
            if runs and runs[-1][1] == first:
                runs[-1][1] = end
            else:
                runs.append([first, end])
        if records:
            self.metrics.records.inc(records)
            self.metrics.batches.inc()
            self.metrics.records_seen.set(self.state.records_seen)
            self.sm.delta_records.labels(worker=d.worker).inc(records)
        self.sm.applied.labels(worker=d.worker).inc()
        # Only what changes the state (λ, the applied ranges) calls for a checkpoint: skipped
        # messages (a worker's repeated λ_0 proposals, duplicates) only move the offset, and
        # reading them again after a restart skips them again, so an idle applier writes none.
        self._since_ck += 1
        res.deltas += 1
        res.records += records

    def max_staleness(self) -> int:
        """``scaleout.max_staleness``, else the default of the engine's storage: the splitter's
        ``max_staleness`` (gradients: 4, :mod:`streamsvi.inference.split_gradient`), else
        :data:`MAX_STALENESS`."""
        bound = self.sc["max_staleness"]
        if bound is None:
            bound = MAX_STALENESS if self.engine is None else \
                getattr(split.splitter_for(self.engine), "max_staleness", MAX_STALENESS)
        return int(bound)

    def _observe(self, done, c):
        """The metrics a contribution carries (the gradient path's ELBO, gradient variance and norm)."""
        if done.elbo is not None:
            self.metrics.elbo.set(done.elbo)
            self.metrics.elbo_per_record.set(done.elbo / float(self.engine.n_total))
        gv, norm = c.meta.get("grad_variance"), c.meta.get("grad_norm")
        if gv is not None:
            self.metrics.grad_var_est.set(gv)
            estimator = getattr(self.engine, "estimator", None)
            if estimator is not None:
                self.metrics.grad_var_by_estimator.labels(estimator=estimator).set(gv)
        if norm is not None:
            self.metrics.grad_norm.set(norm)

    def _skip(self, reason, res):
        self.sm.skipped.labels(reason=reason).inc()
        res.skipped += 1

    def _publish(self, force=False):
        """Publish λ for the workers: the λ file (at most every ``scaleout.publish_seconds``),
        or on the lambda topic the steps applied since the last turn and a full λ when one
        is due (:meth:`_full_due`), in one transaction (:mod:`.lambda_log`)."""
        if self.state is None:
            return
        if self.lambda_topic is not None:
            self._publish_topic(force)
            return
        if not self._dirty:
            return
        now = time.monotonic()
        if not force and now - getattr(self, "_last_publish", 0.0) < self.sc["publish_seconds"]:
            return
        publish_lambda(self.lambda_file, self.engine, self.state)
        self._last_publish, self._dirty = now, False
        self.sm.lambda_version.set(self.state.step)

    def _full_due(self) -> bool:
        versions, nbytes = self._since_full
        return self._need_full or versions >= self.sc["lambda_full_every"] or (
            versions and nbytes >= self.sc["lambda_full_ratio"] * self._full_bytes)

    def _publish_topic(self, force):
        full = self._full_due()
        if self._fenced or (not self._steps and not full):
            return
        now = time.monotonic()
        if not (force or full) and now - getattr(self, "_last_publish", 0.0) < self.sc["publish_seconds"]:
            return
        try:
            if self._writer is None:
                self._open_writer()
                self._need_full = full = True      # a new lineage starts with a full λ
            n_steps, n_full = self._writer.publish(
                self._steps, (self.engine, self.state, self.next_offset, self.scaleout_extra()) if full else None)
        except _transient_errors() as exc:
            self._drop_writer()
            if fenced(exc):
                # a newer active applier's writer has the transactional id: writing again would
                # fence it in turn; this one stands by once the group revokes its partition
                log.warning("lambda topic %r: another applier writes λ now (this writer was fenced); "
                            "this applier publishes nothing until it is active again", self.lambda_topic)
                self._fenced, self._steps = True, []
                return
            log.warning("lambda topic %r: writing λ version %d failed (%s: %s); a full λ is written "
                        "at the next turn", self.lambda_topic, self.state.step, type(exc).__name__, exc)
            self.health.failed(exc, "writing λ")
            self._steps, self._need_full = [], True
            return
        self.health.answered()
        if full:
            self._full_bytes = n_full
            self._since_full, self._need_full = [0, 0], False
            log.info("lambda topic %r: full λ version %d written (%d bytes, lineage %s)", self.lambda_topic,
                     self.state.step, n_full, self._writer.lineage)
        self._steps = []
        self._last_publish, self._dirty = now, False
        self.sm.lambda_version.set(self.state.step)

    def _open_writer(self):
        """The λ writer of a new lineage (its ``init_transactions`` fences the previous one)."""
        src = self.cfg["source"]
        self._writer = LambdaLogWriter(
            src["bootstrap_servers"], self.lambda_topic, f"streamsvi-{self.group}-lambda",
            self.sc["lambda_chunk_bytes"], security=client_security(self.cfg),
            client_id="streamsvi-applier-lambda")

    def _drop_writer(self):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # ------------------------------------------------------------- finish
    def _finish(self, consumer, dead_sink, loop):
        """The commit strategy's last publication and checkpoint of an active applier, then
        the λ writer is closed; the consumer and the metrics server are closed after it
        (``_start``'s stack)."""
        super()._finish(self._consumer, dead_sink, loop)
        self._drop_writer()
        self.active = False


class _Current:
    """The applier's consumer as the loop's stages hold it: the current one, also after a
    :meth:`Applier._replace_consumer` (``ConnectionError`` while a replacement is pending)."""

    def __init__(self, applier):
        self._applier = applier

    def __getattr__(self, name):
        consumer = self._applier._consumer
        if consumer is None:
            raise ConnectionError("the applier's consumer is being replaced (no broker answered)")
        return getattr(consumer, name)

