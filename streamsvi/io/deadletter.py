"""Dead-letter sinks: where rejected records go, counted by reason.

Every sink writes the same JSON record per :class:`~streamsvi.io.sources.DeadLetter`::

    {"reason": "non_finite", "message": "value in column 1 is nan, ...",
     "source": "points", "partition": 2, "offset": 1041, "row": null,
     "payload_b64": "WzEuMCwgTmFOXQ=="}

``row`` is the row index inside a multi-row (binary) message, else null.
Call :meth:`DeadLetterSink.flush` before committing the source offsets that
cover the dead letters, so that a crash cannot lose them.

Examples
--------
>>> from streamsvi.io.sources import DeadLetter, Position
>>> sink = MemoryDeadLetterSink()
>>> sink.send(DeadLetter(Position("points", 0, 7), "json_invalid", "not JSON", b"{"))
>>> sink.counts, sink.records[0]["payload_b64"]
({'json_invalid': 1}, 'ew==')
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from ._kafka import client_config, connect_with_retry
from .sources import DeadLetter

__all__ = ["DeadLetterSink", "FileDeadLetterSink", "KafkaDeadLetterSink", "MemoryDeadLetterSink",
           "DeadLetterError"]


class DeadLetterError(RuntimeError):
    """Dead letters could not be written durably."""


class DeadLetterSink:
    """Interface of a dead-letter sink.

    Attributes
    ----------
    counts : dict[str, int]
        Dead letters sent so far, by reason code.
    """

    def __init__(self):
        self.counts: dict[str, int] = {}

    def send(self, dead: DeadLetter) -> None:
        """Queue one dead letter (durable only after :meth:`flush`)."""
        self._write(dead.to_json())
        self.counts[dead.reason] = self.counts.get(dead.reason, 0) + 1

    def send_many(self, dead: Iterable[DeadLetter]) -> int:
        """Queue several dead letters; returns how many."""
        n = 0
        for d in dead:
            self.send(d)
            n += 1
        return n

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def _write(self, record: dict) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Make everything sent so far durable; raise :class:`DeadLetterError` if it is not."""

    def close(self) -> None:
        """Flush and release resources."""
        self.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class MemoryDeadLetterSink(DeadLetterSink):
    """Keeps the JSON records in ``records`` (for tests)."""

    def __init__(self):
        super().__init__()
        self.records: list[dict] = []

    def _write(self, record):
        self.records.append(record)


class FileDeadLetterSink(DeadLetterSink):
    """Appends one JSON line per dead letter to ``path``; ``flush`` fsyncs what was written
    since the last flush (nothing to do, and no ``fsync``, when nothing was: a scale-out worker
    flushes before every commit, and an fsync of an unchanged file was 11.7 % of its time).

    Parameters
    ----------
    path : str or Path
        The file (created with its parent directory if missing; appended to).
    """

    def __init__(self, path):
        super().__init__()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self._dirty = False

    def _write(self, record):
        self._f.write(json.dumps(record) + "\n")
        self._dirty = True

    def flush(self):
        if not self._f.closed and self._dirty:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._dirty = False

    def close(self):
        if not self._f.closed:
            self.flush()
            self._f.close()


class KafkaDeadLetterSink(DeadLetterSink):
    """Produces one JSON message per dead letter to a Kafka topic.

    Messages are keyed by ``"source/partition"`` so the dead letters of one
    input partition stay in order. ``flush`` waits for every acknowledgement
    (``acks="all"``) and raises if any send failed.

    Parameters
    ----------
    bootstrap_servers : str or list of str
        Where the cluster is.
    topic : str
        The dead-letter topic (created by the broker on first write if it
        auto-creates topics; else create it beforehand).
    client_id : str
        Shown in broker logs.
    max_request_size : int
        Largest message the producer sends; a dead letter carries its payload
        in base64 (4/3 of its size), so keep this above 4/3 of the largest
        input message.
    connect_attempts, connect_backoff_s, connect_timeout_s
        Start-up retry, as in :class:`~streamsvi.io.sources.KafkaSource`.
    producer_config : dict, optional
        Further ``kafka.KafkaProducer`` settings.
    security : dict, optional
        kafka-python security settings (``security_protocol``, ``ssl_*``,
        ``sasl_*``), as ``streamsvi.service.config.client_security`` makes them.
    """

    def __init__(self, bootstrap_servers, topic: str, client_id: str = "streamsvi-deadletter",
                 max_request_size: int = 16 << 20, connect_attempts: int = 5,
                 connect_backoff_s: float = 0.5, connect_timeout_s: float = 10.0,
                 producer_config: dict | None = None, security: dict | None = None):
        from kafka import KafkaProducer

        super().__init__()
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"topic must be a non-empty string, got {topic!r}")
        self.topic = topic
        config = {"bootstrap_servers": bootstrap_servers, "client_id": client_id, "acks": "all",
                  "max_request_size": max_request_size, "linger_ms": 5,
                  "bootstrap_timeout_ms": int(connect_timeout_s * 1000)}
        config.update(producer_config or {})
        config.update(security or {})
        config = client_config(KafkaProducer, config)
        self._producer = connect_with_retry(
            lambda: KafkaProducer(**config), what=f"KafkaDeadLetterSink(topic={topic!r})",
            bootstrap_servers=bootstrap_servers, attempts=connect_attempts,
            backoff_s=connect_backoff_s, security=security)
        self._pending = []
        self._closed = False

    def _write(self, record):
        key = f"{record['source']}/{record['partition']}".encode()
        self._pending.append(self._producer.send(self.topic, key=key,
                                                 value=json.dumps(record).encode()))

    def flush(self, timeout_s: float | None = 30.0):
        if self._closed:
            return
        from kafka.errors import KafkaError

        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as exc:
            raise DeadLetterError(f"dead letters for topic {self.topic!r} were not acknowledged "
                                  f"within {timeout_s} s: {exc}; do not commit the source "
                                  f"offsets that cover them") from exc
        pending, self._pending = self._pending, []
        failed = [f.exception for f in pending if f.failed() or not f.is_done]
        if failed:
            raise DeadLetterError(f"{len(failed)} of {len(pending)} dead letters were not "
                                  f"written to topic {self.topic!r}: {failed[0]}; do not commit "
                                  f"the source offsets that cover them")

    def close(self):
        if not self._closed:
            try:
                self.flush()
            finally:
                self._closed = True
                self._producer.close()
