""":class:`KafkaSource`: minibatches from Kafka topics through a consumer group.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from typing import Mapping, Sequence

from .. import _fastfetch
from ..callguard import CallGuard, Guarded, StuckCall, close_in_background
from .._kafka import client_config, connect_with_retry, offset_and_metadata
from ..codecs import Codec
from ..dense import DenseKind, RecordValidator
from ..records import RecordKind
from .base import (Batch, NotAssigned, Offsets, Source, SourceError, _BatchBuilder, _check_offsets,
                   _check_poll_args, _DENSE, log)

def _rebalance_listener(source: "KafkaSource", epoch: int):
    """The listener of the source's consumer number ``epoch``: a consumer the source replaced
    (:meth:`KafkaSource._reopen`) may still finish a join, or revoke as it closes; it is ignored."""
    from kafka import ConsumerRebalanceListener

    class _Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            # kafka-python calls this as a (re)join starts; under the eager protocol the old
            # partitions stay in consumer.assignment() until the join completes
            if source._epoch != epoch:
                return
            source._joining = True
            if revoked:
                log.info("partitions revoked from %s: %s", source.group_id,
                         sorted((tp.topic, tp.partition) for tp in revoked))
                source._drop_buffered(revoked)
                for tp in revoked:       # a new owner resumes where it likes: no expectation
                    key = (tp.topic, tp.partition)
                    source._expected.pop(key, None)
                    if key in source._handed:       # (unless it is this consumer's successor)
                        source._revoked_at[key] = source._handed.pop(key)

        def on_partitions_assigned(self, assigned):
            if source._epoch == epoch:
                source._on_assigned(assigned)

    return _Listener()


def consumer_settings(bootstrap_servers, *, group_id: str, client_id: str = "streamsvi",
                      session_timeout_ms: int = 2000, heartbeat_interval_ms: int = 500,
                      auto_offset_reset: str = "earliest", max_partition_fetch_bytes: int = 16 << 20,
                      fetch_max_bytes: int = 64 << 20, connect_timeout_s: float = 10.0,
                      consumer_config: dict | None = None, security: dict | None = None) -> dict:
    """The ``kafka.KafkaConsumer`` settings of a :class:`KafkaSource` with these arguments (the
    same defaults), before :func:`~streamsvi.io._kafka.client_config` drops what this
    kafka-python does not know. An :class:`EarlyJoin` is adopted by the source whose settings
    are these exactly."""
    config = {"bootstrap_servers": bootstrap_servers, "group_id": group_id,
              "client_id": client_id, "enable_auto_commit": False,
              "auto_offset_reset": auto_offset_reset,
              "session_timeout_ms": session_timeout_ms,
              "heartbeat_interval_ms": heartbeat_interval_ms,
              "max_partition_fetch_bytes": max_partition_fetch_bytes,
              "fetch_max_bytes": fetch_max_bytes,
              "bootstrap_timeout_ms": int(connect_timeout_s * 1000),
              # kafka-python doubles its reconnect wait up to 30 s by default: after an
              # outage the consumer came back up to that long after the broker did
              "reconnect_backoff_max_ms": 1000}
    config.update(consumer_config or {})
    config.update(security or {})
    return config


def _keep_join_awaited(consumer) -> None:
    """Keep a join in flight awaited by the consumer's next poll (see
    :meth:`KafkaSource._keep_join_awaited`)."""
    coordinator = getattr(consumer, "_coordinator", None)          # kafka-python 3.0
    if coordinator is not None and getattr(coordinator, "_join_task", None) is not None \
            and not getattr(coordinator, "rejoin_needed", True):
        coordinator.request_rejoin()


def _answers(bootstrap_servers, timeout_s: float = 0.2) -> bool:
    """Whether the first bootstrap server accepts a TCP connection within ``timeout_s``."""
    first = (bootstrap_servers.split(",") if isinstance(bootstrap_servers, str)
             else list(bootstrap_servers))[0].strip()
    host, _, port = first.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


class EarlyJoin:
    """A group consumer started ahead of its :class:`KafkaSource`, so that the group join
    overlaps the rest of a start.

    Brokers hold a JoinGroup before they answer it: the local tansu broker (0.6) holds every
    JoinGroup in 1 s sleeps until half the session timeout has passed since it came (so at
    least 1 s; 5 s with a 10 s session timeout; a static member, ``group_instance_id``, 3 s),
    and Kafka holds the first join of an empty group for ``group.initial.rebalance.delay.ms``
    (3 s by default). ``streamsvi run`` therefore starts one of these from the config's
    ``[source]`` table before it imports numpy and the models, and the daemon's source takes
    it over (:meth:`KafkaSource._open_consumer`) when its consumer settings and topics are
    these exactly; otherwise the source makes its own consumer, as without it.

    The caller's thread makes the consumer (only if the first bootstrap server accepts a TCP
    connection at once: an unreachable broker is the source's own attempt to report), installs
    the lean reader, subscribes and polls until the JoinGroup with a member id is out (the
    broker's hold begins then; CPU work that a thread would only take turns at under the GIL,
    while the caller imports). A background thread then polls in :attr:`POLL_S` chunks until
    the group assigns partitions, :meth:`take` or :meth:`release` is called, or :attr:`MAX_S`
    has passed. A record a poll returns is given back (the partition sought back to it):
    nothing is read before the source owns the consumer. The rebalance listener keeps what the group did and
    replays it to the source's listener at the take-over, so the source's ``_on_assigned``
    (its pending seeks: a resumed checkpoint's offsets) runs before it reads anything.
    Polling until the take-over matters: kafka-python 3.0.12 drops a join that completed
    while no poll awaited it and joins again.
    """

    #: Length of one poll of the thread (also the longest :meth:`take` waits for it).
    POLL_S = 0.1
    #: The thread stops polling after this long; the source's own wait takes over.
    MAX_S = 60.0
    #: How long the caller polls for the JoinGroup to go out before the thread polls on.
    SEND_S = 0.5

    def __init__(self, config: dict, topics: Sequence[str], lean_reader: bool = True,
                 context=None):
        self.config = dict(config)
        self.topics = list(topics)
        self.lean_wanted = bool(lean_reader)
        self.key = _early_key(self.config, self.topics, self.lean_wanted)
        self.consumer = None
        self.lean_reader = False
        self.error: BaseException | None = None
        self._context = context
        self._events: list = []          # ("revoked" | "assigned", partitions) before the take-over
        self._target = None              # the source's listener, after the take-over
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"streamsvi-early-join-{config.get('group_id')}",
                                        daemon=True)
        self._open()
        self._thread.start()

    def _listener(self):
        from kafka import ConsumerRebalanceListener

        early = self

        class _Recording(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                early._event("on_partitions_revoked", revoked)

            def on_partitions_assigned(self, assigned):
                early._event("on_partitions_assigned", assigned)

        return _Recording()

    def _event(self, name, partitions):
        with self._lock:
            target = self._target
            if target is None:
                self._events.append((name, list(partitions)))
                return
        getattr(target, name)(partitions)

    def _guarded(self):
        import contextlib

        return self._context() if self._context is not None else contextlib.nullcontext()

    def _open(self):
        """In the caller's thread (CPU work the thread would only take turns at under the GIL):
        the consumer, subscribed, polled until its JoinGroup with a member id is out (the
        broker's hold begins then), at most :attr:`SEND_S`."""
        try:
            if not _answers(self.config["bootstrap_servers"]):
                return
            from kafka import KafkaConsumer
            from kafka.structs import MemberState

            with self._guarded():
                consumer = KafkaConsumer(**client_config(KafkaConsumer, self.config))
                lean = self.lean_wanted and _fastfetch.install(consumer)
                consumer.subscribe(topics=self.topics, listener=self._listener())
                self.consumer, self.lean_reader = consumer, lean
                deadline = time.monotonic() + self.SEND_S
                while time.monotonic() < deadline and not consumer.assignment():
                    meta = consumer.group_metadata()
                    if meta.state == MemberState.REBALANCING and meta.member_id:
                        break
                    self._poll_once(consumer, 0.01)
        except Exception as exc:  # noqa: BLE001 - the source makes its own consumer instead
            self._failed(exc)

    def _poll_once(self, consumer, timeout_s: float) -> None:
        _keep_join_awaited(consumer)
        for tp, msgs in consumer.poll(timeout_ms=max(1, int(timeout_s * 1000)), max_records=1).items():
            if msgs:                             # given back: nothing is read before the take-over
                consumer.seek(tp, msgs[0].offset)

    def _failed(self, exc) -> None:
        self.error = exc
        log.debug("early group join of %s failed (%s: %s)", self.config.get("group_id"),
                  type(exc).__name__, exc)

    def _run(self):
        """The thread: polls until the group assigns partitions, a take-over or :attr:`MAX_S`."""
        consumer = self.consumer
        if consumer is None or self.error is not None:
            return
        try:
            with self._guarded():
                deadline = time.monotonic() + self.MAX_S
                while not self._stop.is_set() and not consumer.assignment() \
                        and time.monotonic() < deadline:
                    self._poll_once(consumer, self.POLL_S)
        except Exception as exc:  # noqa: BLE001 - the source makes its own consumer instead
            self._failed(exc)

    def take(self):
        """Stop the thread (after its current poll) and hand over its consumer: returns
        ``(consumer, lean_reader)``, or None if the thread made no consumer (the source then
        makes its own). No listener call comes until the next poll; :meth:`attach` the
        source's listener before it."""
        self._stop.set()
        self._thread.join(self.POLL_S + KafkaSource.STUCK_POLL_S)
        if self._thread.is_alive():              # a poll that never returned (callguard)
            log.warning("%s: the early group join's poll did not return; making a new consumer",
                        self.config.get("group_id"))
            return None
        if self.consumer is None or self.error is not None:
            self._close_quietly()
            return None
        return self.consumer, self.lean_reader

    def attach(self, listener) -> None:
        """Call ``listener`` (the source's) for what the group did before the take-over, in
        order, and for what it does from now on."""
        with self._lock:
            events, self._events, self._target = self._events, [], listener
        for name, partitions in events:
            getattr(listener, name)(partitions)

    def release(self, wait_s: float = 0.0) -> None:
        """Not taken over: stop the thread and close the consumer, completing a join in flight
        first (a member that leaves during its join can wedge the group on tansu 0.6; see
        :meth:`KafkaSource._finish_join`). A thread still connecting after ``wait_s`` is left
        to the end of the process (a daemon thread; the broker times its member out)."""
        self._stop.set()
        self._thread.join(wait_s)
        if self._thread.is_alive():
            return
        self._close_quietly()

    def _close_quietly(self):
        consumer, self.consumer = self.consumer, None
        if consumer is None:
            return
        try:
            from kafka.structs import MemberState

            session_s = self.config.get("session_timeout_ms", 2000) / 1000
            deadline = time.monotonic() + session_s + KafkaSource.JOIN_FINISH_S
            while time.monotonic() < deadline:
                meta = consumer.group_metadata()
                if not (meta.state == MemberState.REBALANCING or
                        (meta.state == MemberState.UNJOINED and bool(meta.member_id))):
                    break
                _keep_join_awaited(consumer)
                consumer.poll(timeout_ms=int(KafkaSource.JOIN_POLL_S * 1000), max_records=1)
            consumer.close(autocommit=False)
        except Exception as exc:  # noqa: BLE001 - leaving is best effort: the broker times us out
            log.debug("closing the early consumer of %s failed (%s: %s)", self.config.get("group_id"),
                      type(exc).__name__, exc)


_EARLY: dict = {}
_EARLY_LOCK = threading.Lock()


def _early_key(config: dict, topics, lean_reader: bool) -> str:
    return json.dumps({"config": config, "topics": sorted(topics), "lean": bool(lean_reader)},
                      sort_keys=True, default=repr)


def start_early_join(bootstrap_servers, topics: Sequence[str], *, lean_reader: bool = True,
                     context=None, **settings) -> EarlyJoin:
    """Start an :class:`EarlyJoin` for a :class:`KafkaSource` to be made with these
    ``bootstrap_servers``, ``topics`` and :func:`consumer_settings` ``settings``; the source
    made with the same ones takes it over. ``context``: a context-manager factory the thread
    runs in (the CLI's ``quiet_kafka``). Returns it (for :meth:`EarlyJoin.release`)."""
    early = EarlyJoin(consumer_settings(bootstrap_servers, **settings), topics, lean_reader, context)
    with _EARLY_LOCK:
        old = _EARLY.pop(early.key, None)
        _EARLY[early.key] = early
    if old is not None:
        old.release()
    return early


def _take_early(key: str) -> EarlyJoin | None:
    with _EARLY_LOCK:
        return _EARLY.pop(key, None)


def release_early_joins(wait_s: float = 0.0) -> None:
    """Release every :class:`EarlyJoin` no source took over (:meth:`EarlyJoin.release`)."""
    with _EARLY_LOCK:
        left = list(_EARLY.values())
        _EARLY.clear()
    for early in left:
        early.release(wait_s)


class _Run:
    """Polled messages of one partition, in order: their offsets and values."""

    __slots__ = ("offsets", "values")

    def __init__(self, offsets: list, values: list):
        self.offsets, self.values = offsets, values

    @classmethod
    def of(cls, records) -> "_Run":
        """From a consumer poll's list: lean runs (one per record batch) or records."""
        offsets, values = [], []
        for r in records:
            if type(r) is _fastfetch.LeanRun:
                offsets += r.offsets
                values += r.values
            else:
                offsets.append(r.offset)
                values.append(r.value)
        return cls(offsets, values)


#: How :meth:`KafkaSource._why_unassigned` begins when this member is in the group and the
#: group gave every partition to others (:attr:`NotAssigned.joined`).
JOINED_UNASSIGNED = "this member joined the group but was given"


class KafkaSource(Source):
    """Minibatches from Kafka topics via a consumer group, auto-commit off.

    Offsets are committed only by :meth:`commit`, which the daemon calls after
    a checkpoint is durable. A :meth:`seek` to a partition that is not assigned
    yet is remembered and applied the moment the group assigns it.

    Each consumer poll asks for at least ``max_poll_records`` messages (a
    ``consumer_config`` setting, kafka-python's default 500); messages beyond
    the current batch wait in the source and go into the next batches. So a
    poll is not paid per batch when messages carry many rows, and the
    consumer sends its next fetch while the model works on the buffered
    messages. The consumer is polled only when that buffer is empty, so a
    rebalance never finds buffered messages; :meth:`seek` drops the buffered
    messages of the partitions it moves, and :meth:`positions` and
    :meth:`lag` count them as not read yet.

    Parameters
    ----------
    bootstrap_servers : str or list of str
        ``"host:port"`` of one or more brokers.
    topics : str or sequence of str, optional
        Topics to subscribe to.
    pattern : str, optional
        A regex of topic names to subscribe to instead of ``topics``.
    group_id : str
        The consumer group; committed offsets are kept per group.
    codec : Codec
        How a message becomes records.
    validator : RecordValidator, optional
        Default ``RecordValidator(codec.n_features)``.
    client_id : str
        Shown in broker logs.
    session_timeout_ms, heartbeat_interval_ms : int
        Group liveness. The defaults (2000 / 500) make group joins fast on the
        local test broker; a production Kafka cluster refuses session timeouts
        below its ``group.min.session.timeout.ms`` (6000 by default), so raise
        them there.
    auto_offset_reset : {"earliest", "latest"}
        Where a partition with no committed offset starts.
    max_partition_fetch_bytes, fetch_max_bytes : int
        Fetch sizes; keep them above the largest message.
    connect_attempts : int
        How often to try to reach the brokers at start.
    connect_backoff_s : float
        Wait before the second attempt; doubles after each failure (max 10 s).
    connect_timeout_s : float
        How long one attempt waits for a broker.
    consumer_config : dict, optional
        Further ``kafka.KafkaConsumer`` settings (auto-commit cannot be enabled).
        ``max_poll_records`` (default 500) is the least number of messages one
        consumer poll asks for (see above).
    kind : RecordKind, optional
        The record kind of ``codec`` (default dense rows; see
        :mod:`streamsvi.io.records`). Other kinds need their own ``validator``.
    lean_reader : bool
        Read record batches with :mod:`streamsvi.io._fastfetch` (offset and
        value only, 4-8x less CPU per message than kafka-python's own reader),
        compressed, transactional and control batches included. Only the
        legacy formats, a codec whose library is missing or a deserializer
        leave a fetch to kafka-python, counted in
        ``streamsvi_slow_path_fetches_total``. False leaves the consumer
        exactly as kafka-python builds it.
    security : dict, optional
        kafka-python security settings (``security_protocol``, ``ssl_*``,
        ``sasl_*``), as ``streamsvi.service.config.client_security`` makes
        them; kept as ``self.security`` for the source's other clients.

    Raises
    ------
    KafkaUnavailableError
        If no broker answered after ``connect_attempts`` attempts.
    """

    #: Poll length while waiting for a group assignment (see ``_await_assignment``).
    JOIN_POLL_S = 0.5
    #: How long past a session timeout :meth:`close` waits for a join in flight to complete.
    JOIN_FINISH_S = 3.0
    #: How long one request of the probe consumer (metadata, highwater marks, committed
    #: offsets; see ``_probe_consumer``) may wait for a broker that does not answer.
    PROBE_TIMEOUT_MS = 5000
    #: How long past its own timeout a consumer poll may run before it is abandoned and the
    #: consumer replaced (:mod:`streamsvi.io.callguard`: kafka-python 3.0.12 can wait for
    #: good in a group rejoin). Nothing a poll legitimately does takes this long.
    STUCK_POLL_S = 30.0

    def __init__(self, bootstrap_servers, topics: str | Sequence[str] | None = None,
                 pattern: str | None = None, *, group_id: str, codec: Codec,
                 validator: RecordValidator | None = None, client_id: str = "streamsvi",
                 session_timeout_ms: int = 2000, heartbeat_interval_ms: int = 500,
                 auto_offset_reset: str = "earliest",
                 max_partition_fetch_bytes: int = 16 << 20, fetch_max_bytes: int = 64 << 20,
                 connect_attempts: int = 5, connect_backoff_s: float = 0.5,
                 connect_timeout_s: float = 10.0, consumer_config: dict | None = None,
                 lean_reader: bool = True, kind: RecordKind | None = None,
                 security: dict | None = None, on_offset_reset=None, on_reopen=None):
        from kafka import KafkaConsumer

        if (topics is None) == (pattern is None):
            raise ValueError("give exactly one of topics=[...] or pattern='regex'")
        if isinstance(topics, str):
            topics = [topics]
        if topics is not None and (not topics or not all(isinstance(t, str) and t for t in topics)):
            raise ValueError(f"topics must be a non-empty list of topic names, got {topics!r}")
        if not isinstance(group_id, str) or not group_id:
            raise ValueError(f"group_id must be a non-empty string, got {group_id!r}")
        self.kind = kind or _DENSE
        if not isinstance(codec, Codec) and isinstance(self.kind, DenseKind):
            raise ValueError(f"codec must be a streamsvi.io.codecs.Codec, got {type(codec).__name__}")
        if not isinstance(self.kind, DenseKind) and validator is None:
            raise ValueError(f"KafkaSource with {self.kind.name!r} records needs a validator")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', "
                             f"got {auto_offset_reset!r}")
        extra = dict(consumer_config or {})
        if extra.pop("enable_auto_commit", False):
            raise ValueError("enable_auto_commit=True would commit offsets before the checkpoint "
                             "is durable (docs/design.md, delivery contract); KafkaSource commits by hand")
        self.bootstrap_servers = bootstrap_servers
        self.topics = list(topics) if topics is not None else None
        self.pattern = pattern
        self.group_id = group_id
        self.codec = codec
        self.n_features = getattr(codec, "n_features", None)
        self.validator = validator or RecordValidator(self.n_features)
        if getattr(self.validator, "n_features", None) != self.n_features:
            raise ValueError(f"validator expects n_features={self.validator.n_features}, "
                             f"codec has {self.n_features}")
        self._pending_seeks: Offsets = {}
        self._auto_offset_reset = auto_offset_reset
        # The offset each partition should deliver next (after a seek, or the last message read);
        # a message before it means the consumer was reset (see _check_positions).
        self._expected: Offsets = {}
        self.on_offset_reset = on_offset_reset
        self._rows_per_message = float(codec.rows_per_message or 0) or None
        self._closed = False
        # Messages polled but not handed out yet: [TopicPartition, messages, index of the next].
        self._buffer: deque[list] = deque()
        self._position_cache: dict = {}     # consumer positions, valid until the next poll or seek
        self._joining = False               # a group (re)join is in flight (see _owns_partitions)
        self._handed: Offsets = {}          # per partition: the offset after the last message handed
                                            # out, or the one sought (where a successor resumes)
        self._revoked_at: Offsets = {}      # _handed of the partitions the last revoke took
        self._resume: Offsets = {}          # where a replaced consumer's partitions were (_reopen)
        self._epoch = 0                     # which consumer this is: 1, 2, ... (_reopen)
        self.reopens = 0                    # consumers replaced after a stuck poll
        self.on_reopen = on_reopen
        self.security = dict(security or {})
        config = consumer_settings(
            bootstrap_servers, group_id=group_id, client_id=client_id,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=heartbeat_interval_ms,
            auto_offset_reset=auto_offset_reset, max_partition_fetch_bytes=max_partition_fetch_bytes,
            fetch_max_bytes=fetch_max_bytes, connect_timeout_s=connect_timeout_s,
            consumer_config=extra, security=self.security)
        # an EarlyJoin started with these settings (streamsvi run) is taken over by the first consumer
        self._early_key = _early_key(config, self.topics, lean_reader) if self.topics is not None else None
        self._config = client_config(KafkaConsumer, config)
        self._probe = None                  # group-less consumer for highwater marks (drained())
        self._drain_note = None             # the last "waiting for ..." logged by drained()
        self._connect = (connect_attempts, connect_backoff_s)
        self._lean_wanted = bool(lean_reader)
        self._reopen_due = False            # the consumer was abandoned; its successor not made yet
        self._open_consumer(connect_attempts)
        if lean_reader and not self.lean_reader:
            log.info("this kafka-python has no hook for the lean record reader; using its own")

    def _open_consumer(self, attempts: int) -> None:
        """A group consumer subscribed to the topics (the next :attr:`_epoch`), guarded.

        The first one is an :class:`EarlyJoin`'s consumer if one was started with this
        source's settings and topics (``streamsvi run``), its join maybe done or in flight.
        """
        from kafka import KafkaConsumer

        early = _take_early(self._early_key) if self._epoch == 0 and self._early_key else None
        taken = early.take() if early is not None else None
        if taken is not None:
            self._epoch += 1
            self._consumer, self.lean_reader = taken
            self._guard = CallGuard(self._consumer, f"consumer of {self.group_id}")
            early.attach(_rebalance_listener(self, self._epoch))
            log.debug("%s: took over the group consumer started early", self.group_id)
            return
        config = self._config
        consumer = connect_with_retry(
            lambda: KafkaConsumer(**config), what=f"KafkaSource(group_id={self.group_id!r})",
            bootstrap_servers=self.bootstrap_servers, attempts=attempts,
            backoff_s=self._connect[1], security=self.security)
        self._epoch += 1
        self._consumer = consumer
        self._guard = CallGuard(consumer, f"consumer of {self.group_id}")
        self.lean_reader = self._lean_wanted and _fastfetch.install(consumer)
        listener = _rebalance_listener(self, self._epoch)
        if self.topics is not None:
            consumer.subscribe(topics=self.topics, listener=listener)
        else:
            consumer.subscribe(pattern=self.pattern, listener=listener)

    def _poll_consumer(self, timeout_ms: int, max_records: int) -> dict:
        """``consumer.poll``, abandoned after :attr:`STUCK_POLL_S` past ``timeout_ms``; then the
        consumer is replaced (:meth:`_reopen`) and nothing is returned."""
        try:
            with self._guard.watch(timeout_ms / 1000 + self.STUCK_POLL_S):
                return self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        except StuckCall:
            self._reopen()
            return {}

    def _reopen(self) -> None:
        """Replace a consumer whose poll never returned (:mod:`streamsvi.io.callguard`) by a
        new member of the group.

        The old one is closed in the background (its close may wait as its poll did) and
        its listener is ignored from now on. Partitions the new member is given back resume
        where this reader was (the offset after the last message handed out, or a
        :meth:`seek` made meanwhile), as when kafka-python keeps a partition across a
        rebalance; the others are their new owners' business (the group's committed offsets).
        If no broker answers, the error is raised and the next :meth:`poll_batch` tries again.
        """
        if not self._reopen_due:
            old, assigned = self._consumer, self._consumer.assignment()
            self._resume = {**self._revoked_at, **{
                (tp.topic, tp.partition): self._handed[(tp.topic, tp.partition)]
                for tp in assigned if (tp.topic, tp.partition) in self._handed}}
            self._epoch += 1                     # the old listener is deaf from here on
            self._guard.close()
            self._buffer.clear()
            self._position_cache.clear()
            self._joining, self._reopen_due = True, True
            self.reopens += 1
            if self.on_reopen is not None:
                self.on_reopen()
            log.warning("%s: replacing its group consumer (a new member of the group; %s resume "
                        "where they were)", self.group_id, sorted(self._resume) or "no partitions")
            close_in_background(old, f"streamsvi-close-{self.group_id}")
        self._open_consumer(self._connect[0])
        self._reopen_due = False

    def __repr__(self):
        what = f"topics={self.topics}" if self.topics is not None else f"pattern={self.pattern!r}"
        return f"KafkaSource({what}, group_id={self.group_id!r}, codec={self.codec!r})"

    @property
    def consumer(self):
        """The underlying ``kafka.KafkaConsumer`` (for metrics; do not poll it yourself)."""
        return self._consumer

    # ------------------------------------------------------- assignment
    def _on_assigned(self, assigned):
        keys = sorted((tp.topic, tp.partition) for tp in assigned)
        log.info("partitions assigned to %s: %s", self.group_id, keys)
        self._joining = False
        self._position_cache.clear()
        resume, self._resume, self._revoked_at = self._resume, {}, {}
        for tp in assigned:
            key = (tp.topic, tp.partition)
            off = self._pending_seeks.pop(key, None)
            if off is None and key in resume:          # a replaced consumer's (_reopen)
                off = self._expected[key] = self._handed[key] = resume[key]
            if off is not None:
                self._consumer.seek(tp, off)

    def _drop_buffered(self, partitions):
        """Forget buffered messages of ``partitions`` (TopicPartitions)."""
        gone = set(partitions)
        if any(chunk[0] in gone for chunk in self._buffer):
            self._buffer = deque(c for c in self._buffer if c[0] not in gone)
        self._position_cache.clear()

    def _rewind(self, records):
        """Give records back: seek each partition to its first returned offset."""
        self._position_cache.clear()
        for tp, msgs in records.items():
            if msgs:
                self._consumer.seek(tp, msgs[0].offset)
                self._expected[(tp.topic, tp.partition)] = msgs[0].offset

    def _owns_partitions(self) -> bool:
        """True if the group assigned partitions and no (re)join is in flight.

        During a rejoin kafka-python 3.0.12 (eager protocol) keeps the revoked
        partitions in ``consumer.assignment()`` until the join completes, so that
        alone would let the caller poll briefly and do other work while the
        JoinGroup is in flight; a join answered outside a poll starts over, and on
        tansu (which answers a JoinGroup after about half a session timeout) the
        cycle can repeat for minutes (measured with three scale-out workers).
        """
        return bool(self._consumer.assignment()) and not self._joining

    def _await_assignment(self, deadline: float) -> bool:
        # Poll in chunks of JOIN_POLL_S with no work in between. kafka-python
        # 3.0.12 can drop a finished join and start over when a poll times out
        # right after it (with a pattern subscription every poll during a join
        # first waits up to retry_backoff_ms for metadata, so 100 ms polls
        # almost never complete one). The poll that completes the join may
        # already return records; they are rewound, not dropped. A pattern that
        # matches no topic yet asks for fresh metadata every chunk: kafka-python
        # looks for new matching topics only every metadata_max_age_ms (5 min), so
        # a topic created during the wait was not seen before the wait timed out.
        while not self._owns_partitions():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.pattern is not None and not self._consumer.subscription():
                cluster = getattr(self._consumer, "_cluster", None)     # kafka-python 3.0
                if cluster is not None:
                    cluster.request_update()
            self._keep_join_awaited()
            timeout_ms = max(1, int(min(self.JOIN_POLL_S, left) * 1000))
            self._rewind(self._poll_consumer(timeout_ms, 1))
        return True

    def _keep_join_awaited(self) -> None:
        """Keep a join in flight awaited by the next poll.

        kafka-python 3.0.12 completes a join only in a poll that finds the member needing
        one, and a poll that times out leaves the join in flight. A join started because the
        subscription changed (a pattern that matched a new topic) is "needed" only until it
        is sent: a poll after that skipped the join, whose assignment was then never taken
        (seen here: a topic created during the wait, its SyncGroup answered with the
        partitions, the member unassigned until the wait ran out). Marking the rejoin as
        requested makes the next poll await the join, or send it again if it has ended.
        """
        _keep_join_awaited(self._consumer)

    def assignment(self) -> set[tuple[str, int]]:
        """The ``(topic, partition)`` pairs this consumer owns now (none while it (re)joins)."""
        if self._joining:
            return set()
        return {(tp.topic, tp.partition) for tp in self._consumer.assignment()}

    def wait_for_assignment(self, timeout_s: float = 30.0) -> set[tuple[str, int]]:
        """Poll until the group assigns partitions to this consumer.

        Returns
        -------
        set of (topic, partition)

        Raises
        ------
        NotAssigned
            If nothing is assigned within ``timeout_s`` (its message says why).
        """
        if not self._await_assignment(time.monotonic() + timeout_s):
            what = f"topics {self.topics}" if self.topics is not None else \
                f"topics matching {self.pattern!r}"
            why, absent = self._why_unassigned()
            raise NotAssigned(f"no partitions of {what} were assigned to group {self.group_id!r} at "
                              f"{self.bootstrap_servers}", timeout_s, why,
                              joined=why.startswith(JOINED_UNASSIGNED), no_topic=absent)
        return self.assignment()

    def _absent(self) -> str | None:
        """What of the subscription does not exist at the brokers: "topic 'a'", "one of the
        topics 'a', 'b'" (none of them exists) or "a topic matching 'p'"; None when the group
        has a subscribed topic to assign.

        First from the group consumer's own metadata (no round trip): a pattern that matched
        a topic, or named topics it knows, leave nothing absent. Only then one metadata request
        for every topic of the cluster, on the probe consumer: unlike a request that names the
        topics (the group consumer's), it never makes a broker that creates topics on demand
        (tansu, Kafka's ``auto.create.topics.enable``) create one. The wait for an assignment
        asks this every second, and a probe's round trip while a join is in flight can start
        the join over (kafka-python 3.0.12): probing at every step while the topic existed
        kept a pattern subscription's join from completing on a broker with a dozen topics.
        """
        import re

        if self.topics is None and self._consumer.subscription():
            return None
        cluster = getattr(self._consumer, "_cluster", None)         # kafka-python 3.0
        if self.topics is not None and cluster is not None and \
                any(cluster.partitions_for_topic(t) for t in self.topics):
            return None
        existing = self._probe_consumer().topics()
        if self.topics is None:
            rx = re.compile(self.pattern)       # as kafka-python matches a pattern subscription
            return None if any(rx.match(t) for t in existing) else f"a topic matching {self.pattern!r}"
        missing = [t for t in self.topics if t not in existing]
        if len(missing) < len(self.topics):
            return None
        return f"topic {missing[0]!r}" if len(missing) == 1 else \
            "one of the topics " + ", ".join(map(repr, missing))

    def _why_unassigned(self) -> tuple[str, str | None]:
        """What this member's own state says about a missing assignment, and what of the
        subscription does not exist yet (:meth:`_absent`; None if that is not the cause)."""
        from kafka.structs import MemberState

        try:
            absent = self._absent()
            if absent is not None:
                return ("no topic matches the subscription yet" if self.topics is None else
                        f"no topic matches the subscription yet: {absent} does not exist"), absent
            parts = self.partitions() if self.topics is not None or self._consumer.subscription() else set()
        except Exception as exc:  # noqa: BLE001 - the diagnosis must not hide the timeout
            return f"{exc}", None
        if not parts:
            return "no topic matches the subscription yet", None
        state = self._consumer.group_metadata().state
        if state == MemberState.STABLE:
            return (f"{JOINED_UNASSIGNED} none of the {len(parts)} partitions: "
                    f"the group has more members than partitions"), None
        return ("the group's rebalance never completed (this member's JoinGroup or SyncGroup was not "
                "answered). On the local tansu 0.6.0 broker, a member that left or died during a "
                "rebalance can keep the group from ever completing one (it stays the group's "
                "leader); use another group id, or restart the broker (it starts empty). Kafka's "
                "own coordinator elects a new leader instead"), None

    # ------------------------------------------------------------ batches
    def _messages_wanted(self, rows_left: int) -> int:
        if self._rows_per_message is None:
            return 1  # unknown message size: learn it from the first message
        return max(1, int(rows_left // self._rows_per_message))

    def _poll_into_buffer(self, timeout_s: float, messages_wanted: int) -> None:
        """One consumer poll for at least ``messages_wanted`` messages into the (empty) buffer."""
        max_records = max(messages_wanted, self._consumer.config["max_poll_records"])
        records = self._poll_consumer(max(0, int(timeout_s * 1000)), max_records)
        self._position_cache.clear()
        self._check_positions(records)
        self._buffer.extend([tp, _Run.of(msgs), 0] for tp, msgs in records.items() if msgs)

    def _check_positions(self, records) -> None:
        """Report a partition whose messages start before the offset it was expected to deliver.

        That is kafka-python's ``auto_offset_reset`` at work: the offset this
        reader sought (its snapshot's) or reached is past the end of the log, so
        the consumer silently went back to the earliest offset. On a real cluster
        the topic was deleted and recreated or truncated, or the broker lost its
        data (a restarted in-memory broker). The records from there on are read
        (again): say so, and call ``on_offset_reset(key, expected, got)`` (the
        daemon counts ``streamsvi_offset_resets_total``).
        """
        for tp, msgs in records.items():
            if msgs:
                key = (tp.topic, tp.partition)
                self._report_reset(key, msgs[0].offset)
                last = msgs[-1]         # a lean run (one record batch) or a record
                self._expected[key] = (last.offsets[-1] if type(last) is _fastfetch.LeanRun
                                       else last.offset) + 1
        # A broker that answers a fetch past the end of the log with nothing (tansu) instead of
        # OFFSET_OUT_OF_RANGE leaves the consumer there for good, skipping the records that
        # arrive below it: reset it as Kafka's own error would (auto_offset_reset = earliest).
        for tp in self._consumer.assignment():
            if records.get(tp):
                continue
            mark = self._consumer.highwater(tp)
            if mark is None:
                continue
            pos = self._next_offset(tp)
            if pos > mark:
                key = (tp.topic, tp.partition)
                self._expected[key] = max(self._expected.get(key, pos), pos)
                if self._auto_offset_reset == "latest":
                    self._consumer.seek_to_end(tp)
                else:
                    self._consumer.seek_to_beginning(tp)
                self._position_cache.clear()

    def _report_reset(self, key, got: int) -> None:
        """Warn and count once if partition ``key`` is at ``got``, before the offset it should be at."""
        expected = self._expected.get(key)
        if expected is None or got >= expected:
            return
        self._expected[key] = got
        log.warning("%s/%d: the consumer was reset from offset %d to %d: offset %d is past the "
                    "end of the log (the topic was recreated or truncated, or the broker lost "
                    "its data); reading on from offset %d (auto_offset_reset)",
                    key[0], key[1], expected, got, expected, got)
        if self.on_offset_reset is not None:
            self.on_offset_reset(key, expected, got)

    def _take(self, b: _BatchBuilder, n: int) -> None:
        """Hand up to ``n`` buffered messages of the first buffered partition to ``b``."""
        chunk = self._buffer[0]
        tp, run, start = chunk
        stop = min(len(run.offsets), start + n)
        if stop == len(run.offsets):
            self._buffer.popleft()
        else:
            chunk[2] = stop
        self._handed[(tp.topic, tp.partition)] = int(run.offsets[stop - 1]) + 1
        if start == 0 and stop == len(run.offsets):
            b.add_run(tp.topic, tp.partition, run.offsets, run.values)
        else:
            b.add_run(tp.topic, tp.partition, run.offsets[start:stop], run.values[start:stop])

    def poll_batch(self, max_records: int, max_wait_s: float = 1.0) -> Batch | None:
        """Collect up to ``max_records`` rows across partitions within ``max_wait_s``.

        Returns as soon as ``max_records`` rows are in, else when the wait is
        over; None if no message arrived (or no partition was assigned) in time.
        While the consumer is joining its group (no partitions assigned, or a
        rejoin in flight: see ``_owns_partitions``) the wait is at least
        ``JOIN_POLL_S`` (0.5 s): shorter polls can keep a join from ever finishing.
        """
        _check_poll_args(max_records, max_wait_s)
        if self._closed:
            raise SourceError("KafkaSource is closed")
        if self._reopen_due:                # the last try found no broker (_reopen)
            self._reopen()
        deadline = time.monotonic() + max_wait_s
        if not self._buffer and not self._owns_partitions():
            if not self._await_assignment(max(deadline, time.monotonic() + self.JOIN_POLL_S)):
                return None
        b = _BatchBuilder(self.codec, self.validator, self.n_features, self.kind, self.track_positions)
        polled = False
        while True:
            while self._buffer and b.n_rows < max_records:
                n0, r0 = b.n_messages, b.n_rows
                self._take(b, self._messages_wanted(max_records - b.n_rows))
                if self.codec.rows_per_message is None and b.n_rows > r0:
                    per = (b.n_rows - r0) / (b.n_messages - n0)
                    est = self._rows_per_message
                    self._rows_per_message = per if est is None else 0.5 * est + 0.5 * per
            if b.n_rows >= max_records:
                break
            left = deadline - time.monotonic()
            if polled and left <= 0:
                break
            if polled and not self._owns_partitions():
                # the last poll started a rejoin: wait it out in long polls, nothing else
                if not self._await_assignment(max(deadline, time.monotonic() + self.JOIN_POLL_S)):
                    break
                continue
            self._poll_into_buffer(left, self._messages_wanted(max_records - b.n_rows))
            polled = True
            if not self._buffer and time.monotonic() >= deadline:
                break
        return b.batch()

    # ------------------------------------------------------------ offsets
    def seek(self, offsets):
        """Read each ``(topic, partition)`` from ``offset`` next.

        Partitions not assigned yet are sought as soon as the group assigns
        them (e.g. right after start, before :meth:`wait_for_assignment`).
        """
        assigned = {(tp.topic, tp.partition): tp for tp in self._consumer.assignment()}
        offsets = _check_offsets(offsets)
        self._drop_buffered(assigned[key] for key in offsets if key in assigned)
        self._expected.update(offsets)
        self._handed.update(offsets)
        for key, off in offsets.items():
            if key in assigned:
                self._consumer.seek(assigned[key], off)
                self._pending_seeks.pop(key, None)
            else:
                self._pending_seeks[key] = off

    def membership(self):
        """This consumer's group membership now (kafka-python's ``ConsumerGroupMetadata``:
        group id, generation, member id, state), or None while it is not a stable member
        of a generation (a join in flight, or the broker no longer knows it).

        A transactional writer passes it to ``send_offsets_to_transaction`` so that a
        broker with KIP-447 fences the offsets of a member the group has moved on from,
        and asks for it first so that a member that knows it was dropped commits nothing.
        """
        from kafka.structs import MemberState

        meta = self._consumer.group_metadata()
        if self._joining or meta.state is not MemberState.STABLE or meta.generation_id < 0 \
                or not meta.member_id:
            return None
        return meta

    def commit(self, offsets):
        """Commit ``offsets`` (next offset to read) for this group, synchronously.

        Raises
        ------
        SourceError
            If the broker refused the commit (e.g. after a rebalance). Nothing
            is lost: the checkpoint holds the offsets.
        """
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        offsets = _check_offsets(offsets)
        if not offsets:
            return
        request = {TopicPartition(t, p): offset_and_metadata(off) for (t, p), off in offsets.items()}
        try:
            with self._guard.watch(self._config.get("request_timeout_ms", 30000) / 1000 + self.STUCK_POLL_S):
                self._consumer.commit(offsets=request)
        except StuckCall as exc:
            self._reopen()
            raise SourceError(f"committing offsets {dict(sorted(offsets.items()))} for group "
                              f"{self.group_id!r}: {exc}. The checkpoint holds these offsets; the "
                              f"next commit or a restart recovers") from exc
        except KafkaError as exc:
            raise SourceError(f"committing offsets {dict(sorted(offsets.items()))} for group "
                              f"{self.group_id!r} failed: {exc}. The checkpoint holds these "
                              f"offsets; the next commit or a restart recovers") from exc

    def committed(self, partitions=None) -> Offsets:
        """The group's committed offsets (default: for every partition of the topics).

        Partitions without a committed offset are left out, and so are topics the
        cluster's metadata does not know yet (a topic the broker creates when the
        group first asks for it has no offsets to find). Read by the probe
        consumer (see :meth:`_probe_consumer`), so it is safe during a rebalance.
        """
        from kafka import TopicPartition

        keys = self.partitions(strict=False) if partitions is None else list(partitions)
        probe = self._probe_consumer()
        out = {}
        for topic, p in sorted(keys):
            off = probe.committed(TopicPartition(topic, p))
            if off is not None:
                out[(topic, p)] = int(off)
        return out

    def _next_offset(self, tp) -> int:
        """The offset of the next message :meth:`poll_batch` hands out from ``tp``."""
        for chunk in self._buffer:
            if chunk[0] == tp:
                return int(chunk[1].offsets[chunk[2]])
        pos = self._position_cache.get(tp)
        if pos is None:
            pos = self._position_cache[tp] = int(self._consumer.position(tp))
        return pos

    def positions(self) -> Offsets:
        """The next offset :meth:`poll_batch` hands out, per assigned partition."""
        return {(tp.topic, tp.partition): self._next_offset(tp)
                for tp in self._consumer.assignment()}

    def lag(self) -> Offsets:
        """``highwater − position`` per assigned partition.

        The position is the next offset :meth:`poll_batch` hands out, so
        messages the source has fetched but not handed out count as lag. The
        highwater mark is known only after a fetch response for that
        partition (on an empty partition the broker may hold the first one for
        ``fetch_max_wait_ms``); partitions without one yet are left out.
        kafka-python updates a partition's highwater when it hands out that
        partition's buffered fetch, so while fetched records wait in its buffer
        the lag can be an underestimate. Do not use ``KafkaConsumer.end_offsets``:
        the local tansu broker answers it wrongly.
        """
        out = {}
        for tp in self._consumer.assignment():
            hw = self._consumer.highwater(tp)
            if hw is not None:
                out[(tp.topic, tp.partition)] = max(int(hw) - self._next_offset(tp), 0)
        return out

    def caught_up(self) -> bool:
        """True if partitions are assigned and every one has read up to its highwater.

        This looks only at this consumer's partitions; :meth:`drained` is the
        test for the whole topic.
        """
        assigned = self._consumer.assignment()
        lag = self.lag()
        return bool(assigned) and len(lag) == len(assigned) and not any(lag.values())

    # --------------------------------------------------------------- drain
    def _probe_consumer(self):
        """A second consumer with this source's connection settings and group id that never
        joins the group: it reads metadata, highwater marks and committed offsets for
        :meth:`drained`.

        Its fetches are for the highwater mark each response carries, not for records: at
        most 1 KiB per partition (the broker still returns one whole batch), so that a drain
        check does not fetch and parse 64 KiB per partition it does not own every second
        (profiled: 19 % of a worker's samples once its own partitions were read).

        The group consumer itself is not used for these: a request it sends while
        a group join is in flight waits behind the join on the coordinator's
        connection, and kafka-python 3.0.12 starts the join over when it
        completes outside a ``poll()``, so a rebalance could never finish.
        """
        from kafka import KafkaConsumer

        if self._probe is None:
            keep = {k: v for k, v in self._config.items()
                    if k not in ("session_timeout_ms", "heartbeat_interval_ms")}
            keep.update(enable_auto_commit=False, fetch_max_wait_ms=100,
                        request_timeout_ms=self.PROBE_TIMEOUT_MS,
                        max_partition_fetch_bytes=1024, client_id=f"{keep['client_id']}-probe")
            probe = KafkaConsumer(**keep)             # assign() only: it never joins the group
            # each call bounded (its requests wait at most PROBE_TIMEOUT_MS; kafka-python 3.0.12
            # waited for good in the probe's coordinator lookup after an outage): a stuck one
            # replaces the probe and is a SourceError, which every caller takes as "not known yet"
            self._probe = Guarded(probe, CallGuard(probe, f"probe of {self.group_id}"),
                                  self.PROBE_TIMEOUT_MS / 1000 + self.STUCK_POLL_S,
                                  on_stuck=lambda exc, probe=probe: self._drop_probe(probe, exc))
        return self._probe

    def _drop_probe(self, probe, exc) -> SourceError:
        """Forget the probe consumer after a stuck call (the next use makes a new one)."""
        if self._probe is not None and self._probe._client is probe:
            self._probe._guard.close()
            self._probe = None
            close_in_background(probe, f"streamsvi-close-probe-{self.group_id}")
        return SourceError(f"the probe consumer of {self.group_id!r}: {exc}; replaced")

    def check_brokers(self) -> None:
        """Ask the brokers for the cluster metadata; raises if none answers.

        kafka-python's ``poll`` returns empty rather than raising while the
        brokers are gone, so an idle consumer cannot tell; this can. One
        metadata round trip on the probe consumer, at most
        :attr:`PROBE_TIMEOUT_MS` when the brokers are silent.

        Raises
        ------
        kafka.errors.KafkaError
            If no broker answered.
        """
        self._probe_consumer().topics()

    def partitions(self, strict: bool = True) -> set[tuple[str, int]]:
        """Every ``(topic, partition)`` of the subscribed topics, from the cluster metadata.

        With a pattern subscription, the topics it matched so far. ``strict=False``
        leaves out a topic the metadata knows no partitions of, instead of raising.

        Raises
        ------
        SourceError
            If ``strict`` and the metadata knows no partitions of a subscribed topic.
        """
        topics = self.topics if self.topics is not None else sorted(self._consumer.subscription() or ())
        probe = self._probe_consumer()
        out = set()
        for topic in topics:
            parts = probe.partitions_for_topic(topic)
            if not parts and strict:
                raise SourceError(f"no partitions known for topic {topic!r} at "
                                  f"{self.bootstrap_servers} (metadata not loaded yet, or the "
                                  f"topic does not exist)")
            out.update((topic, int(p)) for p in parts)
        return out

    def highwater_marks(self, partitions, timeout_s: float = 10.0) -> Offsets:
        """Fresh highwater marks of ``partitions``, from fetch responses.

        Each call reads them anew (``end_offsets()`` is not used: the local
        tansu broker answers it wrongly).

        Raises
        ------
        SourceError
            If a partition's mark did not arrive within ``timeout_s``.
        """
        from kafka import TopicPartition

        tps = [TopicPartition(t, p) for t, p in sorted(partitions)]
        if not tps:
            return {}
        probe = self._probe_consumer()
        probe.assign([])            # a new assignment forgets the previous marks
        probe.assign(tps)
        probe.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while True:
            marks = {tp: probe.highwater(tp) for tp in tps}
            if None not in marks.values():
                return {(tp.topic, tp.partition): int(hw) for tp, hw in marks.items()}
            if time.monotonic() >= deadline:
                missing = sorted((tp.topic, tp.partition) for tp, hw in marks.items() if hw is None)
                raise SourceError(f"no highwater mark for {missing} from {self.bootstrap_servers} "
                                  f"within {timeout_s:g} s")
            probe.poll(timeout_ms=100, max_records=len(tps))

    def undrained(self, applied: Mapping[tuple[str, int], int]) -> dict:
        """The partitions of the subscribed topics that still hold records nobody accounted for.

        A partition is drained when ``applied`` (the next offset the caller
        has folded in, per partition) or, for a partition assigned here, the
        next offset this source hands out is at its highwater mark, or when it is
        not assigned to this consumer and the group's committed offset is at
        its highwater mark (another member owns it and has checkpointed
        everything). A partition held by a member that died has neither, so
        it counts as not drained until the group hands it to a member that
        reads it; while this consumer owns no partitions (it is joining, or
        the group is rebalancing) nothing is drained. Returns ``{(topic,
        partition): "why"}`` (partition None when the whole topic waits);
        empty when the whole topic is drained.

        Only this consumer's partitions are checked while any of them still
        has records to read (no network round trip); the others take one
        metadata, one committed-offset and one fetch round trip.
        """
        if not self._owns_partitions():
            topics = self.topics if self.topics is not None else [self.pattern]
            return {(t, None): "no partitions assigned here: the group is joining or rebalancing"
                    for t in topics}
        applied = dict(applied)
        for tp in self._consumer.assignment():
            # Records before the position were handed out (and applied by the caller
            # before it asks), or lie before where the group had committed.
            mark = self._consumer.highwater(tp)
            key = (tp.topic, tp.partition)
            if mark is not None and applied.get(key, 0) > mark:
                # The log ends before what was applied: it was recreated, truncated or lost.
                # The consumer goes back to the earliest offset; until it has, nothing is drained.
                nxt = self._next_offset(tp)
                if nxt > mark:
                    return {key: f"applied offset {applied[key]} is past the highwater mark {mark}; "
                                 f"waiting for the consumer's offset reset"}
                self._report_reset(key, nxt)          # reset done, perhaps with no message to see
                applied[key] = nxt
            if mark is None or max(applied.get(key, 0), self._next_offset(tp)) < mark:
                return {key: "assigned here, records left" if mark is not None
                        else "assigned here, highwater not known yet"}
        others = sorted(self.partitions() - self.assignment())
        hw = self.highwater_marks(others)
        behind = [key for key in others if applied.get(key, 0) < hw[key]]
        committed = self.committed(behind)
        return {key: (f"not assigned here (held by another member, or a rebalance is pending): "
                      f"applied {applied.get(key, 0)}, group committed {committed.get(key)}, "
                      f"highwater {hw[key]}")
                for key in behind if committed.get(key, -1) < hw[key]}

    def drained(self, applied: Mapping[tuple[str, int], int]) -> bool:
        """True when :meth:`undrained` finds nothing left; logs what it waits for (once)."""
        left = self.undrained(applied)
        note = sorted(k for k, why in left.items() if why.startswith("not assigned"))
        if note and note != self._drain_note:
            log.info("draining: waiting for %s", "; ".join(f"{t}[{p}] {left[(t, p)]}" for t, p in note))
        self._drain_note = note
        return not left

    def _join_in_flight(self) -> bool:
        """True while the broker may count this consumer as a member of a join not completed:
        a JoinGroup sent (REBALANCING), or a member id handed out for the retry (KIP-394)."""
        from kafka.structs import MemberState

        meta = self._consumer.group_metadata()
        return meta.state == MemberState.REBALANCING or \
            (meta.state == MemberState.UNJOINED and bool(meta.member_id))

    def _finish_join(self) -> None:
        """Complete a join in flight (at most :attr:`JOIN_FINISH_S` past a session timeout)
        before leaving.

        A member that leaves while its join is in flight can wedge the group on the local
        tansu 0.6.0 broker: it keeps naming the departed member as the group's leader, so
        every later join of the group waits for a SyncGroup that never comes (8 of 8
        trials). Kafka's own coordinator elects a new leader among the members left. The
        records the completing poll returns are dropped: nothing is committed here.
        """
        from kafka.structs import MemberState

        if not self._join_in_flight():
            return
        log.info("finishing the group join of %s before leaving it", self.group_id)
        deadline = time.monotonic() + self._config["session_timeout_ms"] / 1000 + self.JOIN_FINISH_S
        try:
            while time.monotonic() < deadline:
                with self._guard.watch(self.JOIN_POLL_S + self.STUCK_POLL_S):
                    self._consumer.poll(timeout_ms=int(self.JOIN_POLL_S * 1000), max_records=1)
                if self._consumer.group_metadata().state == MemberState.STABLE:
                    return
        except Exception as exc:  # noqa: BLE001 - leaving is best effort: the broker times us out
            log.info("could not finish the group join before leaving (%s: %s)", type(exc).__name__, exc)
            return
        log.info("the group join of %s did not finish within %.0f s; leaving anyway", self.group_id,
                 self._config["session_timeout_ms"] / 1000 + self.JOIN_FINISH_S)

    def close(self):
        """Leave the group and close connections, without committing anything.

        A group join in flight is completed first (:meth:`_finish_join`), so the member
        leaves from a stable membership. A close that does not return within
        :attr:`STUCK_POLL_S` is abandoned (:mod:`streamsvi.io.callguard`).
        """
        if not self._closed:
            self._closed = True
            self._buffer.clear()
            if not self._reopen_due:
                self._finish_join()
            if self._probe is not None:
                probe, self._probe = self._probe, None
                probe._guard.close_client(probe._client, self.PROBE_TIMEOUT_MS / 1000 + self.STUCK_POLL_S)
            self._guard.close_client(self._consumer, self.STUCK_POLL_S)

