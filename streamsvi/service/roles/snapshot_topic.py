"""Snapshots on Kafka (``checkpoint.snapshot_topic``): a scorer without shared storage.

The single daemon writes its snapshots to a checkpoint directory; a scorer on another
machine may not see that directory. With ``checkpoint.snapshot_topic`` set, the daemon
also publishes each snapshot, once it is durable on disk, on that topic (one
partition), and a scorer with ``scorer.snapshot_topic`` reads the latest complete one
from there (:class:`SnapshotTopicReader`).

The record format is the lambda topic's full λ (:mod:`.lambda_log`: ``b"SSVL1\\n"``, a
JSON header, a chunk of the ``.npz`` of :func:`~streamsvi.inference.state.state_to_arrays`,
``allow_pickle=False`` on load), with ``lineage`` ``"snapshot"``, ``deltas_offset`` -1
and one more header field, ``snapshot``: the snapshot's ``number``, ``created`` (ISO
8601, UTC), ``offsets`` (its source offsets: the watermark a scorer stamps on what it
scores) and ``version`` (the streamsvi version that wrote it). The chunks of one
snapshot go out in one Kafka transaction (:class:`SnapshotPublisher`, one
transactional id per daemon group, so a restarted daemon fences the one before it);
readers use ``read_committed`` and drop aborted records on the client too
(:mod:`streamsvi.io.committed`), so they never see a torn snapshot.

What it costs: every snapshot is the whole λ on the wire and in the topic (the npz
bytes, uncompressed: a GMM of K = 10, D = 20 about 40 kB; LDA with K = 100 topics over
V = 10⁵ words 80 MB, at V = 10⁶ 800 MB), and a scorer reads it whole at every swap.
Publish snapshots as often as scorers need them (``checkpoint.every_*``), give the
topic a short retention (only the newest complete snapshot is read) and keep
``checkpoint.snapshot_chunk_bytes`` under the broker's ``message.max.bytes``. A
scale-out applier's λ topic is the cheaper channel there: it carries steps, not whole λs.
"""
from __future__ import annotations

import hashlib
import io
import logging
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ...io import committed
from ...inference.state import state_from_arrays
from .lambda_log import LambdaLogError, decode, encode, state_bytes

log = logging.getLogger("streamsvi.snapshot_topic")

#: The ``lineage`` of every snapshot record (the lambda topic's header field).
LINEAGE = "snapshot"
#: Longest a reader waits for the records it needs while it loads a snapshot.
FETCH_WAIT_S = 30.0


def snapshot_records(engine, state, number: int, created: datetime, offsets, version: str,
                     chunk_bytes: int):
    """The messages of one snapshot (module docs), made one at a time."""
    data = state_bytes(engine, state)
    digest = hashlib.sha256(data).hexdigest()
    count = max(1, -(-len(data) // chunk_bytes))
    head = {"kind": "full", "lineage": LINEAGE, "version": int(state.step), "full": -1, "count": count,
            "size": len(data), "sha256": digest, "deltas_offset": -1,
            "snapshot": {"number": int(number), "created": created.isoformat(), "offsets": offsets,
                         "version": version}}
    return (encode({**head, "index": i}, data[i * chunk_bytes:(i + 1) * chunk_bytes]) for i in range(count))


class SnapshotPublisher:
    """The daemon's side: each durable snapshot in one transaction on the snapshot topic.

    ``publish(snap)`` never raises: the snapshot is durable on disk already, and a
    failed publication is logged and counted; the next snapshot is published whole.
    """

    def __init__(self, bootstrap, topic: str, transactional_id: str, chunk_bytes: int,
                 security: dict | None = None):
        self.bootstrap, self.topic, self.transactional_id = bootstrap, topic, transactional_id
        self.chunk_bytes, self.security = int(chunk_bytes), security or {}
        self.producer = None
        self.published = self.failed = 0

    @classmethod
    def from_config(cls, cfg: dict) -> "SnapshotPublisher":
        """The daemon's: ``checkpoint.snapshot_topic`` and ``snapshot_chunk_bytes``, the source's
        brokers and security, one transactional id per daemon group."""
        from ..config import client_security

        ck, src = cfg["checkpoint"], cfg["source"]
        return cls(src["bootstrap_servers"], ck["snapshot_topic"], f"streamsvi-snapshots-{src['group_id']}",
                   ck["snapshot_chunk_bytes"], client_security(cfg))

    def _open(self):
        if self.producer is None:
            from kafka import KafkaProducer

            p = KafkaProducer(bootstrap_servers=self.bootstrap, transactional_id=self.transactional_id,
                              client_id="streamsvi-snapshot-publisher", acks="all", max_block_ms=30000,
                              max_request_size=self.chunk_bytes + (64 << 10), **self.security)
            try:
                p.init_transactions()      # fences an earlier daemon of this group, aborts its write
            except BaseException:
                p.close(timeout=0)
                raise
            self.producer = p
        return self.producer

    def publish(self, engine, state, snap) -> bool:
        """Publish ``snap`` (a :class:`~streamsvi.checkpoint.Snapshot` just saved, of ``engine``
        and ``state``: its ``number``, ``created``, ``offsets`` and ``version`` go in the header);
        True if its transaction committed."""
        from ..commit import _bounded

        t0 = time.monotonic()
        try:
            p = self._open()
            p.begin_transaction()
            n = 0
            for rec in snapshot_records(engine, state, snap.number, snap.created, snap.offsets, snap.version,
                                        self.chunk_bytes):
                p.send(self.topic, rec, partition=0)
                n += len(rec)
            _bounded(p, "commit_transaction")
        except Exception as exc:  # noqa: BLE001 - the snapshot is durable on disk; the next one goes whole
            self.failed += 1
            log.warning("snapshot %d not published on topic %r (%s: %s); the next snapshot is", snap.number,
                        self.topic, type(exc).__name__, exc)
            self.close()
            return False
        self.published += 1
        log.debug("snapshot %d published on topic %r: %d bytes in %.3f s", snap.number, self.topic, n,
                  time.monotonic() - t0)
        return True

    def close(self) -> None:
        p, self.producer = self.producer, None
        if p is not None:
            try:
                p.close(timeout=5)
            except Exception:  # noqa: BLE001 - it is being dropped
                pass


def publish_snapshot(daemon, snap) -> None:
    """Publish the durable snapshot ``snap`` on ``checkpoint.snapshot_topic`` when that is set
    (the publisher is made at the first call and kept on the daemon); nothing otherwise.
    :class:`~streamsvi.service.commit.SnapshotCommit` calls it for every snapshot when promotion
    is off; with promotion on, :class:`~streamsvi.service.promotion.Promotion` calls it for each
    snapshot it promotes, so the topic carries what scorers should serve."""
    if not daemon.cfg["checkpoint"].get("snapshot_topic"):
        return
    pub = getattr(daemon, "_snapshot_publisher", None)
    if pub is None:
        import weakref

        pub = daemon._snapshot_publisher = SnapshotPublisher.from_config(daemon.cfg)
        weakref.finalize(daemon, pub.close)      # the producer goes with the daemon
    pub.publish(daemon.engine, snap.state, snap)


class SnapshotTopicReader:
    """A scorer's side: the latest complete snapshot of the snapshot topic.

    ``latest()`` reads what is new and returns a :class:`~streamsvi.checkpoint.Snapshot`
    (``path`` names the topic and offset, ``config`` is empty) newer than the last one it
    returned, or None. The first call starts from the newest snapshot's first chunk
    (found by reading back from the end), not the beginning of the topic.
    """

    def __init__(self, bootstrap, topic: str, security: dict | None = None,
                 client_id: str = "streamsvi-snapshot-reader"):
        self.bootstrap, self.topic, self.security, self.client_id = bootstrap, topic, security or {}, client_id
        self._c = None
        self._txn = committed.CommittedFilter()
        self._collect = None
        self.number = None            # the number of the snapshot returned last

    def _open(self):
        from kafka import KafkaConsumer, TopicPartition

        if self._c is None:
            self._tp = TopicPartition(self.topic, 0)
            c = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                              isolation_level="read_committed", auto_offset_reset="earliest",
                              client_id=self.client_id, max_partition_fetch_bytes=16 << 20,
                              fetch_max_bytes=64 << 20, fetch_max_wait_ms=100, request_timeout_ms=10000,
                              **self.security)
            if not committed.install(c):
                c.close()
                raise RuntimeError("this kafka-python has no Fetcher.PartitionRecords hook: the scorer cannot "
                                   "tell committed snapshot records from aborted ones (install kafka-python 3.0)")
            c.assign([self._tp])
            self._c = c
            self._seek(self._start_offset())

    def close(self) -> None:
        if self._c is not None:
            self._c.close(autocommit=False)
            self._c = None

    def _seek(self, offset: int) -> None:
        self._c.seek(self._tp, offset)
        self._txn.reset()
        self._collect = None

    def _poll(self, timeout_ms: int) -> list:
        return self._txn.feed(sorted(self._c.poll(timeout_ms=timeout_ms, max_records=1000).get(self._tp, []),
                                     key=lambda m: m.offset))

    def _at_end(self) -> bool:
        hw = self._c.highwater(self._tp)
        return hw is not None and self._c.position(self._tp) >= hw

    def _start_offset(self) -> int:
        """The first chunk of the newest committed snapshot (read back from the end, twice as
        far each time), or the topic's beginning."""
        c, tp = self._c, self._tp
        begin = c.beginning_offsets([tp])[tp]
        c.seek_to_end(tp)
        end, back = c.position(tp), 4
        while True:
            start = max(begin, end - back)
            self._seek(start)
            last, deadline, empty = None, time.monotonic() + FETCH_WAIT_S, 0
            while time.monotonic() < deadline:
                msgs = self._poll(200)
                for m in msgs:
                    try:
                        last = (m.offset, decode(m.value)[0])
                    except LambdaLogError:
                        continue
                empty = 0 if msgs else empty + 1
                if not msgs and (self._at_end() or empty >= 3):
                    break
            if last is not None:
                return max(begin, last[0] - int(last[1].get("index", 0)))
            if start == begin:
                return begin
            back *= 2

    def latest(self, timeout_s: float = 0.0) -> "object | None":
        """The newest complete snapshot read since the last call, if newer than the last one
        returned (a :class:`~streamsvi.checkpoint.Snapshot`), else None. Reads to the end of
        the topic (waiting at most ``timeout_s`` when nothing is new); Kafka errors are raised."""
        self._open()
        found, deadline = None, time.monotonic() + timeout_s
        while True:
            msgs = self._poll(100)
            for m in msgs:
                snap = self._record(m)
                if snap is not None:
                    found = snap
            if not msgs and (self._at_end() or time.monotonic() >= deadline) and \
                    (self._collect is None or time.monotonic() >= deadline + FETCH_WAIT_S):
                break
        if found is not None:
            self.number = found.number
        return found

    def _record(self, m):
        try:
            h, payload = decode(m.value)
        except LambdaLogError as exc:
            log.error("snapshot topic %r offset %d: %s; skipped", self.topic, m.offset, exc)
            return None
        if h["kind"] != "full" or h["lineage"] != LINEAGE or "snapshot" not in h:
            return None
        i, c = int(h["index"]), self._collect
        key = (h["sha256"], int(h["count"]))
        if i == 0:
            number = int(h["snapshot"]["number"])
            want = self.number is None or number > self.number
            c = self._collect = {"key": key, "parts": [], "want": want, "first": m.offset}
        elif c is None or c["key"] != key or len(c["parts"]) != i:
            self._collect = None
            return None
        c["parts"].append(bytes(payload) if c["want"] else b"")
        if i < int(h["count"]) - 1:
            return None
        self._collect = None
        if not c["want"]:
            return None
        data = b"".join(c["parts"])
        if len(data) != int(h["size"]) or hashlib.sha256(data).hexdigest() != h["sha256"]:
            log.warning("snapshot topic %r offset %d: a torn snapshot; ignored", self.topic, c["first"])
            return None
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            engine, state = state_from_arrays({k: z[k] for k in z.files})
        return _snapshot(engine, state, h["snapshot"], f"kafka:{self.topic}@{c['first']}")


def _snapshot(engine, state, meta: dict, where: str):
    from ...checkpoint import Snapshot

    created = datetime.fromisoformat(meta["created"])
    if created.tzinfo is None:
        created = created.replace(tzinfo=timezone.utc)
    return Snapshot(path=Path(where), number=int(meta["number"]), engine=engine, state=state,
                    offsets=meta["offsets"], config={}, created=created, version=str(meta.get("version", "")),
                    extra={})
