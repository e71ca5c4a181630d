"""λ on Kafka (``scaleout.lambda_topic``): the applier's log of full λs and applied steps.

Workers on other machines need only the bootstrap servers: the active applier
writes, on a topic with one partition, a **full λ** (the state in chunks) at its
takeover and then every so many versions, and a **step** record for every delta
it applies. A worker (:class:`LambdaLog`) loads the latest complete full λ and
replays the steps after it with :func:`streamsvi.inference.split.apply`, which
is deterministic given the state and the contribution, so its λ is the
applier's bit for bit (``tests/service/test_lambda_topic.py``).

Record (the value of one message), no pickle::

    b"SSVL1\\n"  magic and format version (6 bytes)
    uint32 LE   length H of the JSON header
    H bytes     UTF-8 JSON header
    raw         payload (chunks of a full λ only)

Header fields, every record: ``kind`` ("full" or "step"), ``lineage`` (a random
id per applier takeover: the records of one active applier), ``version`` (λ's
step), ``full`` (the offset of the first chunk of the latest complete full λ
written before this record in this lineage, -1 if none: where a reader starts).

* "full": ``index``, ``count`` (chunks), ``size`` and ``sha256`` of the whole
  payload, ``deltas_offset`` (the next deltas-topic offset the state has not
  applied). The payload, concatenated over ``index = 0 .. count-1``, is the
  ``.npz`` of :func:`~streamsvi.inference.state.state_to_arrays` (loaded with
  ``allow_pickle=False``), cut into chunks of ``scaleout.lambda_chunk_bytes``
  so that each message stays under the broker's ``message.max.bytes`` (1 MiB by
  default on Kafka). The applier adds an ``applier.json`` member (uint8 JSON, like
  ``meta.json``): its dedup bookkeeping at that state, ``applied_end``, ``applied`` and
  ``dropped_records`` (what its checkpoint's ``extra["scaleout"]`` holds), so that a
  standby with no checkpoint of its own resumes from the full λ exactly once
  (:meth:`LambdaLog.latest_full`); readers that want λ only ignore it.
* "step": ``delta`` (the deltas-topic offset of the delta applied), ``part``
  (its index in that message when the message is a worker's bundle,
  :func:`~.transport.split_parts`; 0 otherwise, and when absent) and
  ``rho_scale`` (the staleness factor the applier used). A step does not copy
  the delta: the delta is on the deltas topic already, which every worker can
  read, so the broker carries ~200 bytes per step instead of a second copy of
  every delta (what the worker reads is the same either way: every applied
  delta once).

Takeover: a new active applier starts a new lineage with a full λ of its
resumed state; a reader that meets a complete full λ of another lineage loads
it, and replays only steps of its own lineage (a zombie applier's steps are
never mixed in). The applier writes transactionally with one transactional id
per applier group, so its successor's ``init_transactions`` fences it and aborts
its open transaction (a half-written full λ); readers use ``read_committed`` and
drop aborted records on the client too (:mod:`streamsvi.io.committed`: a broker
may not list them, as tansu 0.6.0), so a killed applier's last steps never reach
a worker.
A torn full λ (chunks missing, wrong size or digest) is ignored; the reader
starts from the previous complete one (the ``full`` pointer), else reads the
topic from its beginning.

Retention: the lambda topic must keep the latest full λ and the steps after it,
the deltas topic the deltas since that full λ (it must keep those since the
applier's last checkpoint already); a standby that takes over from the full λ
re-applies them.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import struct
import time
import uuid

import numpy as np

from ...io import committed
from ...inference import split
from ...inference.state import state_from_arrays, state_to_arrays
from .transport import Delta, DeltaFormatError, read_frame, split_parts

log = logging.getLogger("streamsvi.lambda_log")

MAGIC = b"SSVL1\n"
_MAX_HEADER = 1 << 20
#: records read back from the end of the topic to find where to start (doubled until found)
TAIL = 4
#: longest a reader waits for one fetch it needs (a chunk, a delta) before it gives up on a λ
FETCH_WAIT_S = 30.0
#: How long a lambda-topic fetch that finds nothing waits at the broker while a reader finds
#: and loads a full λ, and while it follows the steps after it (``LambdaLog._wait_at_broker``).
CATCH_UP_WAIT_MS, FOLLOW_WAIT_MS = 100, 500


class LambdaLogError(ValueError):
    """A record of the lambda topic is not one this version can read, or a step cannot be replayed."""


def encode(header: dict, payload=b"") -> bytes:
    h = json.dumps(header, separators=(",", ":")).encode()
    return MAGIC + struct.pack("<I", len(h)) + h + bytes(payload)


def decode(data) -> tuple[dict, memoryview]:
    """``(header, payload)`` of one record; :class:`LambdaLogError` if it is not one."""
    data, hlen = read_frame(data, MAGIC, "lambda record", LambdaLogError, _MAX_HEADER)
    try:
        h = json.loads(bytes(data[10:10 + hlen]).decode())
        if h["kind"] not in ("full", "step"):
            raise LambdaLogError(f"unknown lambda record kind {h['kind']!r}")
        int(h["version"]), str(h["lineage"]), int(h["full"])
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, LambdaLogError):
            raise
        raise LambdaLogError(f"bad lambda record header: {type(exc).__name__}: {exc}") from None
    return h, data[10 + hlen:]


#: The npz member of a full λ that holds the applier's dedup bookkeeping (module docs).
APPLIER_MEMBER = "applier.json"
#: The keys of that member: ``extra["scaleout"]`` of the applier's checkpoint.
APPLIER_KEYS = ("applied_end", "applied", "dropped_records")


def state_bytes(engine, state, applier: dict | None = None) -> memoryview:
    """The ``.npz`` bytes of ``state`` (the file format of :mod:`streamsvi.inference.state`),
    with an ``applier.json`` member holding ``applier`` (the applier's bookkeeping) if given."""
    arrays = state_to_arrays(engine, state)
    if applier is not None:
        arrays[APPLIER_MEMBER] = np.frombuffer(
            json.dumps({k: applier[k] for k in APPLIER_KEYS}, separators=(",", ":")).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getbuffer()


def applier_of(arrays) -> dict | None:
    """The applier's bookkeeping of a full λ's npz members (``applier.json``): None without it
    (a full λ written by an applier before it carried it) or when it does not parse (logged).
    Readers that only want λ never need it (:func:`state_from_arrays` ignores the member)."""
    if APPLIER_MEMBER not in arrays:
        return None
    try:
        d = json.loads(bytes(np.asarray(arrays[APPLIER_MEMBER], dtype=np.uint8)).decode())
        return {"applied_end": {str(k): int(v) for k, v in d["applied_end"].items()},
                "applied": {str(k): [[int(a), int(b)] for a, b in v] for k, v in d["applied"].items()},
                "dropped_records": int(d["dropped_records"])}
    except (KeyError, TypeError, ValueError, AttributeError, UnicodeDecodeError) as exc:
        log.error("a full λ's %s does not parse (%s: %s); ignored", APPLIER_MEMBER, type(exc).__name__, exc)
        return None


def full_records(lineage: str, engine, state, deltas_offset: int, full: int, chunk_bytes: int,
                 applier: dict | None = None):
    """The messages of one full λ (module docs): ``count`` chunks of at most ``chunk_bytes``,
    made one at a time (the npz bytes and one message in memory besides λ). ``applier``:
    the applier's bookkeeping, in the payload (``applier.json``)."""
    data = state_bytes(engine, state, applier)
    digest = hashlib.sha256(data).hexdigest()
    count = max(1, -(-len(data) // chunk_bytes))
    head = {"kind": "full", "lineage": lineage, "version": int(state.step), "full": int(full),
            "count": count, "size": len(data), "sha256": digest, "deltas_offset": int(deltas_offset)}
    return (encode({**head, "index": i}, data[i * chunk_bytes:(i + 1) * chunk_bytes]) for i in range(count))


def step_record(lineage: str, version: int, delta: int, rho_scale: float, full: int, part: int = 0) -> bytes:
    return encode({"kind": "step", "lineage": lineage, "version": int(version), "full": int(full),
                   "delta": int(delta), "part": int(part), "rho_scale": float(rho_scale)})


def _kafka_errors():
    from kafka.errors import KafkaError

    return (KafkaError, OSError)


class LambdaLogWriter:
    """The active applier's side: one lineage, written in transactions (module docs).

    ``publish(steps, full)`` writes the pending steps (``(version, delta offset, part,
    rho_scale)``) and, if given, a full λ ``(engine, state, deltas_offset[, applier])``
    after them (``applier``: the applier's dedup bookkeeping, :func:`state_bytes`), in
    one transaction; returns the bytes of the steps and of the full λ written.
    """

    def __init__(self, bootstrap, topic: str, transactional_id: str, chunk_bytes: int,
                 security: dict | None = None, client_id: str = "streamsvi-applier-lambda"):
        from kafka import KafkaProducer

        self.topic, self.chunk_bytes = topic, int(chunk_bytes)
        self.lineage = uuid.uuid4().hex[:16]
        self.full_offset = -1
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id,
                                      client_id=client_id, max_request_size=self.chunk_bytes + (64 << 10),
                                      acks="all", max_block_ms=30000, **(security or {}))
        try:
            self.producer.init_transactions()     # fences the previous active applier, aborts its open write
        except BaseException:
            self.producer.close(timeout=0)        # (the brokers are away: not left to the garbage collector)
            raise

    def publish(self, steps, full=None) -> tuple[int, int]:
        p, n, nf = self.producer, 0, 0
        p.begin_transaction()
        for version, delta, part, scale in steps:
            rec = step_record(self.lineage, version, delta, scale, self.full_offset, part)
            p.send(self.topic, rec, partition=0)
            n += len(rec)
        first = None
        if full is not None:
            engine, state, deltas_offset, *applier = full
            for i, rec in enumerate(full_records(self.lineage, engine, state, deltas_offset,
                                                 self.full_offset, self.chunk_bytes,
                                                 applier[0] if applier else None)):
                fut = p.send(self.topic, rec, partition=0)
                first = fut if i == 0 else first
                nf += len(rec)
        from ..commit import _bounded

        _bounded(p, "commit_transaction")      # flushes; every future is done (at most 30 s)
        if first is not None:
            self.full_offset = first.get(timeout=0).offset
        return n, nf

    def close(self):
        try:
            self.producer.close(timeout=5)
        except Exception:  # noqa: BLE001 - it is being dropped
            pass


class LambdaLog:
    """A worker's view of λ from the lambda topic: the same interface as
    :class:`~streamsvi.service.roles.transport.LambdaFile` (``refresh()``,
    ``engine``, ``state``, ``version``).

    ``refresh()`` reads what is new: on the first call it finds the latest complete
    full λ (the ``full`` pointer of the last record, else the topic from its
    beginning) and loads it; then it replays each step of its lineage (the delta
    read from the deltas topic at the step's offset) and loads a complete full λ
    of a new lineage. True if λ changed.
    """

    def __init__(self, bootstrap, topic: str, deltas_topic: str, security: dict | None = None,
                 client_id: str = "streamsvi-lambda-reader"):
        self.bootstrap, self.topic, self.deltas_topic = bootstrap, topic, deltas_topic
        self.security, self.client_id = security or {}, client_id
        self.path = f"lambda topic {topic!r}"      # what the worker's messages name
        self.engine = self.state = None
        self.lineage = None
        self._lc = self._dc = None
        self._collect = None          # the full λ whose chunks are being read
        self._txn = committed.CommittedFilter()   # the lambda topic's committed records
        self._dbuf: list = []         # deltas fetched and not yet needed (offset order)
        self._parts = (-1, [])        # (offset, parts) of the latest deltas message read
        self._resync = True           # find the latest full λ before following
        self.full_info = None         # the full λ loaded last: lineage, version, deltas_offset, applier
        self._own: dict = {}          # deltas offset -> a bundle this process sent there (remember)
        self.stats = {"fulls_loaded": 0, "steps_applied": 0, "steps_skipped": 0, "full_bytes_read": 0,
                      "delta_bytes_read": 0, "own_deltas_reused": 0}

    #: bytes of bundles :meth:`remember` holds at most (the oldest are forgotten first; a
    #: bundle is dropped once the replay has passed its offset)
    OWN_KEPT_BYTES = 64 << 20

    def remember(self, offset: int, bundle: bytes) -> None:
        """A deltas message this process itself committed at ``offset`` (a worker's bundle):
        replaying its steps reads these bytes instead of fetching them back from the broker
        (the broker stores a message's bytes as sent, so the step is the same bit for bit).
        On LDA one worker's replay reads were a third of the bytes the broker served."""
        self._own[int(offset)] = bundle
        while len(self._own) > 1 and sum(map(len, self._own.values())) > self.OWN_KEPT_BYTES:
            del self._own[min(self._own)]

    # ---------------------------------------------------------- consumers
    def _consumer(self):
        from kafka import KafkaConsumer

        return KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed", auto_offset_reset="earliest",
                             client_id=self.client_id, max_partition_fetch_bytes=16 << 20,
                             fetch_max_wait_ms=CATCH_UP_WAIT_MS, request_timeout_ms=10000,
                             fetch_max_bytes=64 << 20, **self.security)

    def _open(self):
        from kafka import TopicPartition

        if self._lc is None:
            self._ltp, self._dtp = TopicPartition(self.topic, 0), TopicPartition(self.deltas_topic, 0)
            self._lc, self._dc = self._consumer(), self._consumer()
            if not committed.install(self._lc):
                self.close()
                raise RuntimeError("this kafka-python has no Fetcher.PartitionRecords hook: a worker "
                                   "cannot tell the applier's committed λ records from aborted ones "
                                   "(install kafka-python 3.0)")
            self._lc.assign([self._ltp])
            self._dc.assign([self._dtp])

    def close(self):
        for c in (self._lc, self._dc):
            if c is not None:
                c.close(autocommit=False)
        self._lc = self._dc = None

    def _poll(self, timeout_ms: int) -> list:
        """The committed records of one poll of the lambda topic, in offset order."""
        return self._txn.feed(sorted(self._lc.poll(timeout_ms=timeout_ms, max_records=1000).get(self._ltp, []),
                                     key=lambda m: m.offset))

    def _seek(self, offset: int | None) -> None:
        """Read the lambda topic from ``offset`` (None: its end) on."""
        if offset is None:
            self._lc.seek_to_end(self._ltp)
        else:
            self._lc.seek(self._ltp, offset)
        self._txn.reset()

    # ------------------------------------------------------------ reading
    @property
    def version(self) -> int | None:
        return None if self.state is None else int(self.state.step)

    def refresh(self, timeout_s: float = 0.0) -> bool:
        """Read what is new (module docs); True if λ changed. Waits at most ``timeout_s``
        for new records once it holds a λ (the first call reads until it has one, or the
        topic's end)."""
        from ..daemon import _transient_errors

        before = (self.lineage, self.version)
        try:
            self._open()
            catch_up = self._resync
            if self._resync and not self._bootstrap():
                return False
            deadline = time.monotonic() + (FETCH_WAIT_S if catch_up else timeout_s)
            empty = 0
            while True:
                msgs = self._poll(200 if catch_up else max(0, int((deadline - time.monotonic()) * 1000)))
                for m, dec in self._from_latest_full(self._decoded(msgs)):
                    self._record(m, dec)
                    if self._resync:
                        break
                if self._resync or time.monotonic() >= deadline:
                    break
                if not msgs:
                    # after loading a full λ, replay the steps after it up to the end of the topic
                    empty += 1
                    hw = self._lc.highwater(self._ltp)
                    if not catch_up or empty >= 3 or (hw is not None and self._lc.position(self._ltp) >= hw):
                        break
                else:
                    empty = 0
        except _transient_errors() as exc:
            log.info("lambda topic %r: %s: %s; read again at the next refresh", self.topic,
                     type(exc).__name__, exc)
        return (self.lineage, self.version) != before

    def _wait_at_broker(self, ms: int) -> None:
        """How long the lambda topic's fetches that find nothing wait at the broker.

        Finding and loading a full λ reads to the topic's end, where only a fetch's answer
        says it is the end: a short wait (:data:`CATCH_UP_WAIT_MS`), or each look at an empty
        topic took 0.6 s and a worker's start, which looks many times, 3 s longer. Following
        the steps, a long one (:data:`FOLLOW_WAIT_MS`): the broker answers a waiting fetch as
        soon as records come (on tansu within ~10 ms, measured), so it costs no freshness,
        and the short one cost the local broker 15 ms of CPU a second per worker (5-7 at
        500 ms). kafka-python reads the setting from its fetcher's config at each request;
        another kafka-python keeps the short wait."""
        config = getattr(getattr(self._lc, "_fetcher", None), "config", None)
        if isinstance(config, dict) and "fetch_max_wait_ms" in config:
            config["fetch_max_wait_ms"] = int(ms)

    def _bootstrap(self) -> bool:
        """Find and load the latest complete full λ; False if there is none yet."""
        self._wait_at_broker(CATCH_UP_WAIT_MS)
        begin, last = self._find_last()
        if last is None:
            return False               # nothing published yet
        h = last[1]
        cands = []
        if h["kind"] == "full":
            cands.append(last[0] - int(h["index"]))      # its own first chunk (chunks are contiguous)
        cands += [o for o in (int(h["full"]), begin) if o >= begin and o not in cands]
        for off in cands:
            if self._load_at(off):
                self._resync = False
                self._wait_at_broker(FOLLOW_WAIT_MS)
                return True
        log.warning("lambda topic %r: no complete full λ found; waiting for the applier's next one",
                    self.topic)
        return False

    def latest_full(self, beyond: int | None = None):
        """The latest complete committed full λ, without replaying the steps after it:
        ``(engine, state, info)``, ``info`` = ``{"lineage", "version", "deltas_offset",
        "applier"}`` (``applier``: the applier's bookkeeping, :func:`applier_of`; None in a
        full λ written before it carried it), or None if the topic has no complete full λ.
        What a standby applier resumes from (``Applier._take_over``); reads with consumers
        of its own, closed before it returns. Kafka errors are raised.

        ``beyond``: a deltas offset the caller holds already (its local snapshot's). If the
        newest full λ's first chunk says its deltas offset is not larger, None without
        loading it (an older complete one would not be larger either): a restart next to
        its own fresh snapshot does not read a large λ from the broker for nothing."""
        self.close()
        self._resync, self._collect = True, None
        try:
            self._open()
            if beyond is not None:
                newest = self._newest_full_offset()
                if newest is not None and newest <= beyond:
                    return None
            if not self._bootstrap():
                return None
            return self.engine, self.state, dict(self.full_info)
        finally:
            self.close()
            self._resync = True

    def _newest_full_offset(self) -> int | None:
        """The ``deltas_offset`` in the header of the newest full λ's first chunk (the last
        record's own, else its ``full`` pointer's), complete or not; None if there is none
        or it cannot be told without reading the topic from its beginning."""
        begin, last = self._find_last()
        if last is None:
            return None
        h = last[1]
        if h["kind"] == "full":
            return int(h["deltas_offset"])
        if int(h["full"]) < begin:
            return None
        self._seek(int(h["full"]))
        deadline = time.monotonic() + FETCH_WAIT_S
        while time.monotonic() < deadline:
            for m in self._poll(200):
                try:
                    h = decode(m.value)[0]
                except LambdaLogError:
                    return None
                return int(h["deltas_offset"]) if h["kind"] == "full" and int(h["index"]) == 0 else None
            hw = self._lc.highwater(self._ltp)
            if hw is not None and self._lc.position(self._ltp) >= hw:
                return None
        return None

    def _find_last(self):
        """(the topic's beginning offset, (offset, header) of its last readable record or None):
        read back from the end, twice as far each time, until a record is found."""
        lc, tp = self._lc, self._ltp
        begin = lc.beginning_offsets([tp])[tp]
        self._seek(None)
        end = lc.position(tp)          # a hint only: the fetches' highwater mark decides
        last, back = None, TAIL
        while last is None:
            start = max(begin, end - back)
            self._seek(start)
            last = self._last_record(end)
            if start == begin:
                break
            back *= 2
        return begin, last

    def _last_record(self, end_hint):
        """(offset, header) of the last readable record from the current position, or None."""
        last, empty, deadline = None, 0, time.monotonic() + FETCH_WAIT_S
        while time.monotonic() < deadline:
            msgs = self._poll(200)
            for m in msgs:
                try:
                    last = (m.offset, decode(m.value)[0])
                except LambdaLogError:
                    continue
            if msgs:
                empty = 0
                continue
            empty += 1
            hw = self._lc.highwater(self._ltp)
            if hw is not None and self._lc.position(self._ltp) >= min(hw, end_hint):
                return last
            if empty >= 3:
                return last            # (an open transaction holds the rest back)
        return last

    def _load_at(self, offset) -> bool:
        """Read forward from ``offset``: True once a complete full λ starting there is loaded."""
        self._seek(offset)
        self._collect = None
        deadline = time.monotonic() + FETCH_WAIT_S
        while time.monotonic() < deadline:
            msgs = self._poll(200)
            if not msgs:
                hw = self._lc.highwater(self._ltp)
                if hw is not None and self._lc.position(self._ltp) >= hw:
                    return False
            for m in msgs:
                try:
                    h, payload = decode(m.value)
                except LambdaLogError:
                    return False
                if h["kind"] != "full":
                    return False
                r = self._chunk(h, payload, want=True)
                if r == "loaded":
                    self._seek(m.offset + 1)
                    return True
                if r != "partial":
                    return False
        return False

    @staticmethod
    def _decoded(msgs: list) -> list:
        """``(message, (header, payload))`` of each of ``msgs``, or ``(message, LambdaLogError)``
        for one that does not decode: every record's header parsed once per read."""
        out = []
        for m in msgs:
            try:
                out.append((m, decode(m.value)))
            except LambdaLogError as exc:
                out.append((m, exc))
        return out

    def _from_latest_full(self, recs: list) -> list:
        """``recs`` (:meth:`_decoded`) from the latest complete full λ among them that is ahead
        of λ, when there is one: the steps before it are not replayed (their deltas not read,
        not applied), since loading the full λ gives the same state, bit for bit. A worker
        that fell behind by a few versions (several workers, a large delta: LDA on a small
        vocabulary, where a delta is as large as λ and the applier writes a full λ every few
        versions) loads one state instead of replaying every step. A torn full λ among them
        then leaves λ behind the next step, which sends the reader back to the latest
        complete full λ (``_resync``)."""
        if self.state is None or len(recs) < 2:
            return recs
        heads = [None if isinstance(dec, LambdaLogError) else dec[0] for _, dec in recs]
        for i in range(len(recs) - 1, 0, -1):
            h = heads[i]
            if h is None or h.get("kind") != "full" or int(h["index"]) != 0:
                continue
            ahead = h["lineage"] != self.lineage or int(h["version"]) > self.state.step
            count, key = int(h["count"]), (h["lineage"], h["version"], h["sha256"])
            chunks = heads[i:i + count]
            if ahead and len(chunks) == count and all(
                    c is not None and c.get("kind") == "full" and int(c["index"]) == j
                    and (c["lineage"], c["version"], c["sha256"]) == key for j, c in enumerate(chunks)):
                self.stats["steps_skipped"] += sum(1 for c in heads[:i] if c is not None
                                                   and c.get("kind") == "step")
                self._collect = None
                return recs[i:]
        return recs

    def _record(self, m, dec) -> None:
        """One record ``m`` of the topic, ``dec`` its :meth:`_decoded` header and payload."""
        if isinstance(dec, LambdaLogError):
            log.error("lambda topic %r offset %d: %s; skipped", self.topic, m.offset, dec)
            return
        h, payload = dec
        if h["kind"] == "full":
            want = (int(h["index"]) == 0 and (self.state is None or h["lineage"] != self.lineage
                                              or int(h["version"]) != self.state.step))
            if self._chunk(h, payload, want=want or bool(self._collect and self._collect["want"])) == "torn":
                log.warning("lambda topic %r offset %d: a torn full λ (version %s); ignored",
                            self.topic, m.offset, h["version"])
            return
        self._collect = None            # (a step between chunks: the full λ before it is torn)
        if h["lineage"] != self.lineage or int(h["version"]) <= self.state.step:
            return                      # another applier's (a zombie's), or already in λ
        if int(h["version"]) != self.state.step + 1:
            log.error("lambda topic %r offset %d: step to version %s after version %d; reading from "
                      "the latest full λ again", self.topic, m.offset, h["version"], self.state.step)
            self._resync = True
            return
        try:
            msg = self._delta_part(int(h["delta"]), int(h.get("part", 0)))
            d = Delta.decode(msg)
            c = split.Contribution(arrays=d.stats, records=d.records, min_weight=d.min_weight, meta=d.extra)
            state, done = split.apply(self.engine, self.state, c, float(h["rho_scale"]), metrics=False)
        except (LambdaLogError, DeltaFormatError, ValueError, FloatingPointError) as exc:
            log.error("lambda topic %r offset %d: step to version %s cannot be replayed (%s); reading "
                      "from the latest full λ again", self.topic, m.offset, h["version"], exc)
            self._resync = True
            return
        if done.step != int(h["version"]):
            log.error("lambda topic %r offset %d: the replayed step gave version %d, the applier's %s; "
                      "reading from the latest full λ again", self.topic, m.offset, done.step, h["version"])
            self._resync = True
            return
        self.state = state
        self.stats["steps_applied"] += 1
        self.stats["delta_bytes_read"] += len(msg)

    def _chunk(self, h, payload, want: bool) -> str:
        """One chunk of a full λ: "partial", "complete" (not wanted), "loaded" or "torn"."""
        key = (h["lineage"], int(h["version"]), int(h["count"]), h["sha256"])
        i, c = int(h["index"]), self._collect
        if i == 0:
            c = self._collect = {"key": key, "parts": [], "want": want}
        elif c is None or c["key"] != key or len(c["parts"]) != i:
            self._collect = None
            return "torn"
        c["parts"].append(bytes(payload) if c["want"] else b"")
        if i < int(h["count"]) - 1:
            return "partial"
        self._collect = None
        if not c["want"]:
            return "complete"
        data = b"".join(c["parts"])
        c["parts"] = None
        if len(data) != int(h["size"]) or hashlib.sha256(data).hexdigest() != h["sha256"]:
            return "torn"
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        self.engine, self.state = state_from_arrays(arrays)
        #: what :meth:`latest_full` returns of the full λ loaded last besides the state
        self.full_info = {"lineage": h["lineage"], "version": int(self.state.step),
                          "deltas_offset": int(h["deltas_offset"]), "applier": applier_of(arrays)}
        if h["lineage"] != self.lineage:
            log.info("lambda topic %r: full λ version %d loaded (%d bytes, lineage %s)", self.topic,
                     self.state.step, len(data), h["lineage"])
        self.lineage = h["lineage"]
        if self._dc is not None:
            self._dc.seek(self._dtp, int(h["deltas_offset"]))
        self._dbuf = []
        self.stats["fulls_loaded"] += 1
        self.stats["full_bytes_read"] += len(data)
        return "loaded"

    def _delta_part(self, offset: int, part: int):
        """Part ``part`` of the deltas topic's message at ``offset`` (a bundle's parts are
        replayed one after another: the message is read and split once)."""
        if self._parts[0] != offset:
            own = self._own.pop(offset, None)
            for earlier in [k for k in self._own if k < offset]:
                del self._own[earlier]            # replayed past, or skipped by a full λ
            if own is not None:
                self.stats["own_deltas_reused"] += 1
            self._parts = (offset, split_parts(own if own is not None else self._delta_at(offset)))
        parts = self._parts[1]
        if not 0 <= part < len(parts):
            raise LambdaLogError(f"deltas topic {self.deltas_topic!r} offset {offset} has {len(parts)} "
                                 f"part(s), not a part {part}")
        return parts[part]

    def _delta_at(self, offset: int) -> bytes:
        """The deltas topic's message at ``offset`` (read forward; earlier ones dropped)."""
        deadline = time.monotonic() + FETCH_WAIT_S
        while True:
            while self._dbuf and self._dbuf[0].offset < offset:
                self._dbuf.pop(0)
            if self._dbuf:
                if self._dbuf[0].offset == offset:
                    return self._dbuf.pop(0).value
                raise LambdaLogError(f"deltas topic {self.deltas_topic!r} has no message at offset {offset}")
            if self._dc.position(self._dtp) > offset:
                self._dc.seek(self._dtp, offset)
            if time.monotonic() > deadline:
                raise LambdaLogError(f"deltas topic {self.deltas_topic!r}: offset {offset} not readable "
                                     f"within {FETCH_WAIT_S:g} s")
            polled = self._dc.poll(timeout_ms=200, max_records=1000).get(self._dtp, [])
            self._dbuf = sorted(polled, key=lambda m: m.offset)
            hw = self._dc.highwater(self._dtp)
            if not polled and hw is not None and hw <= offset:
                raise LambdaLogError(f"deltas topic {self.deltas_topic!r} ends at offset {hw}, before the "
                                     f"delta at {offset} (a new or truncated topic?)")
