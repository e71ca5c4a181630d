"""Load a data set into a Kafka topic (for the demo, benchmarks and tests), or into the file a
file source reads.

Example (needs a broker, so not run as a doctest)::

    import numpy as np
    from streamsvi.io import BinaryBatchCodec, LocalBroker, create_topic, produce_rows

    with LocalBroker() as broker:
        create_topic(broker.bootstrap, "points", partitions=3)
        n = produce_rows(broker.bootstrap, "points", np.zeros((1000, 2)),
                         BinaryBatchCodec(2), batch_rows=100, partitions=3)   # n == 10
"""
from __future__ import annotations

import numpy as np

from ._kafka import client_config, connect_with_retry
from .codecs import Codec

__all__ = ["produce_rows", "write_records", "ProduceError"]


class ProduceError(RuntimeError):
    """Some messages could not be written."""


def produce_rows(bootstrap_servers, topic: str, X, codec: Codec, batch_rows: int | None = None,
                 partitions: int | None = None, client_id: str = "streamsvi-producer",
                 connect_attempts: int = 5, connect_backoff_s: float = 0.5,
                 timeout_s: float = 60.0, producer_config: dict | None = None,
                 kind=None, security: dict | None = None) -> int:
    """Write the rows of ``X`` to ``topic`` and wait until all are acknowledged.

    Parameters
    ----------
    bootstrap_servers : str or list of str
        Where the cluster is.
    topic : str
        The topic (must exist, or the broker must auto-create it).
    X : array_like, shape (N, D), or a batch of ``kind``
        The records.
    codec : Codec
        A one-record codec (:class:`~streamsvi.io.dense.JsonCodec`) writes one
        message per row; :class:`~streamsvi.io.dense.BinaryBatchCodec` writes
        one message per ``batch_rows`` rows.
    batch_rows : int, optional
        Rows per binary message (default 256). Only for multi-row codecs.
    partitions : int, optional
        Spread messages round-robin over partitions ``0 .. partitions-1``
        (message i goes to partition ``i % partitions``, key ``str(i)``).
        Default: let the producer choose (no key).
    client_id : str
        Shown in broker logs.
    connect_attempts, connect_backoff_s
        Start-up retry.
    timeout_s : float
        Bound on the final flush.
    producer_config : dict, optional
        Further ``kafka.KafkaProducer`` settings.
    kind : RecordKind, optional
        The record kind of ``X`` and ``codec`` (default dense rows; see
        :mod:`streamsvi.io.records`).
    security : dict, optional
        kafka-python security settings (``security_protocol``, ``ssl_*``,
        ``sasl_*``), as ``streamsvi.service.config.client_security`` makes them.

    Returns
    -------
    int
        The number of messages written.

    Raises
    ------
    ProduceError
        If a message was not acknowledged, or ``partitions`` exceeds the
        topic's partition count.
    """
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    from .dense import DenseKind
    from .records import KINDS

    kind = kind or KINDS["dense"]
    if isinstance(kind, DenseKind):
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != codec.n_features:
            raise ValueError(f"X must have shape (N, {codec.n_features}) for {codec!r}, got {X.shape}")
    n_rows = kind.n_records(X)
    if codec.rows_per_message == 1:
        if batch_rows not in (None, 1):
            raise ValueError(f"batch_rows={batch_rows} needs a multi-row codec such as "
                             f"BinaryBatchCodec; {codec!r} carries one record per message")
        step = 1
    else:
        step = 256 if batch_rows is None else batch_rows
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
            raise ValueError(f"batch_rows must be an integer >= 1, got {batch_rows!r}")
    if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
        raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
    messages = [codec.encode_rows(kind.take(X, slice(i, i + step))) for i in range(0, n_rows, step)]
    largest = max((len(m) for m in messages), default=0)
    config = {"bootstrap_servers": bootstrap_servers, "client_id": client_id, "acks": "all",
              "linger_ms": 5, "max_request_size": max(1 << 20, 2 * largest + 4096),
              "bootstrap_timeout_ms": 10_000}
    config.update(producer_config or {})
    config.update(security or {})
    config = client_config(KafkaProducer, config)
    producer = connect_with_retry(lambda: KafkaProducer(**config), what="produce_rows",
                                  bootstrap_servers=bootstrap_servers, attempts=connect_attempts,
                                  backoff_s=connect_backoff_s, security=security)
    errors = []
    try:
        if partitions is not None:
            available = producer.partitions_for(topic) or set()
            if partitions > len(available):
                raise ProduceError(f"topic {topic!r} has {len(available)} partition(s), cannot "
                                   f"spread over {partitions}; create it with "
                                   f"create_topic(bootstrap, {topic!r}, partitions={partitions})")
        for i, msg in enumerate(messages):
            if partitions is None:
                future = producer.send(topic, value=msg)
            else:
                future = producer.send(topic, value=msg, key=str(i).encode(),
                                       partition=i % partitions)
            future.add_errback(errors.append)
        try:
            producer.flush(timeout=timeout_s)
        except KafkaError as exc:
            raise ProduceError(f"messages to {topic!r} not acknowledged within {timeout_s} s: "
                               f"{exc}") from exc
    finally:
        producer.close()
    if errors:
        raise ProduceError(f"{len(errors)} of {len(messages)} messages to {topic!r} failed: "
                           f"{errors[0]}")
    return len(messages)


def write_records(path, part, codec: Codec, kind, fmt: str = "jsonl") -> int:
    """Write the records ``part`` to ``path`` as a file source reads them (the file is replaced).

    Parameters
    ----------
    path : str or path-like
        The file; its directory is created.
    part
        Records of ``kind``.
    codec : Codec
        A one-record codec: ``fmt = "jsonl"`` writes ``codec.encode_rows`` of
        each record as one line.
    kind : RecordKind
        The record kind of ``part``.
    fmt : {"jsonl", "csv"}
        ``"csv"``: dense rows only, comma-separated numbers.

    Returns
    -------
    int
        The number of records written.
    """
    from pathlib import Path

    from .dense import DenseKind

    path = Path(path)
    n = kind.n_records(part)
    if fmt == "csv":
        if not isinstance(kind, DenseKind):
            raise ValueError(f"a CSV file source holds dense rows; {kind.name!r} records are written as jsonl")
        lines = [",".join(repr(float(v)) for v in row) for row in np.asarray(part, dtype=np.float64)]
    elif fmt == "jsonl":
        if codec.rows_per_message != 1:
            raise ValueError(f"a jsonl file holds one record per line; {codec!r} writes whole batches: "
                             f"use the json codec")
        lines = [codec.encode_rows(kind.take(part, slice(i, i + 1))).decode() for i in range(n)]
    else:
        raise ValueError(f"fmt must be 'jsonl' or 'csv', got {fmt!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return n
