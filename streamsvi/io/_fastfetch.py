"""A lean reader of Kafka record batches for kafka-python's fetcher (private).

kafka-python turns every fetched record into a ``ConsumerRecord`` of 13
fields, decoding every varint, timestamp and header on the way: about 12 µs
of CPU per record on a 2-core EPYC, which caps a consumer at 60–80k
records/s whatever the application does. A :class:`~streamsvi.io.KafkaSource`
needs only each record's offset and value. :func:`install` makes one
consumer's fetcher parse plain record batches with :class:`LeanPartitionRecords`,
which reads the two fields straight from the fetched bytes (Kafka message
format v2, see the protocol's "Record Batch" layout) and hands out one
:data:`LeanRun` per record batch (its records' offsets and values) instead of
one object per record. Only the walk from record to record is a Python loop;
the fields of every record of a fetch are read at once with numpy.

Only *plain* fetches take the lean path: every batch is format v2
(magic 2), uncompressed, not transactional and not a control batch, the
isolation level is read_uncommitted, no key or value deserializer is set and
the fetched bytes are reachable. Anything else (compression, transactions,
control markers, the legacy formats) is read by kafka-python's own code, as
before. The lean reader checks the batch CRC (when ``check_crcs``, the
default) and each record's framing and raises kafka-python's
``CorruptRecordError``. A run is a batch's records from the fetch offset on
(a fetch that starts inside a batch drops the records before it, as
kafka-python does); ``next_fetch_offset`` moves to the batch's last offset +
1 when its run is handed out, so positions, lag and commits are what they
would be with the stock reader. kafka-python counts a run as one record in
``max_records``.

This relies on two kafka-python internals: the fetcher builds its per-
partition record iterators through its ``PartitionRecords`` attribute, and
``MemoryRecords`` keeps the fetched bytes in ``_buffer``. :func:`install`
checks both and returns False (nothing changed) when they are missing.
"""
from __future__ import annotations

import struct
from collections import namedtuple

import numpy as np

__all__ = ["LeanRun", "install", "lean_partition_records_class"]

#: What the lean reader hands out instead of ``ConsumerRecord`` objects: the
#: records of one record batch, ``offset`` being the first one's (kafka-python
#: reads only that attribute), then every record's offset and value.
LeanRun = namedtuple("LeanRun", "offset offsets values")

# base offset, batch length, leader epoch, magic, crc, attributes, last offset delta,
# first timestamp, max timestamp, producer id, producer epoch, base sequence, record count
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_START = 21                  # the CRC covers the batch from the attributes on
_LOG_OVERHEAD = 12               # base offset + batch length
_NOT_PLAIN = 0x07 | 0x10 | 0x20  # compression codec, transactional, control


def _varint(buf, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos


def _varints(arr: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints starting at positions ``q`` of ``arr``: (values, byte lengths)."""
    b = arr[q].astype(np.int64)
    val = b & 0x7F
    width = np.ones(len(q), dtype=np.int64)
    more = np.flatnonzero(b & 0x80)
    shift = 7
    while more.size:
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")
        b = arr[q[more] + width[more]].astype(np.int64)
        val[more] |= (b & 0x7F) << shift
        width[more] += 1
        more = more[(b & 0x80) != 0]
        shift += 7
    return (val >> 1) ^ -(val & 1), width


def _record_starts(raw: bytes, p: int, end: int, count: int, starts: list) -> None:
    """Append where each of the ``count`` records of a batch at ``raw[p:end]`` starts.

    Each start depends on the previous record's length, so this walk is a
    loop; it reads only the length varint (1 or 2 bytes inline). Raises
    IndexError or ValueError unless the records end exactly at ``end``.
    """
    for _ in range(count):
        starts.append(p)
        b = raw[p]
        if b < 0x80:
            length, p = (b >> 1) ^ -(b & 1), p + 1
        elif raw[p + 1] < 0x80:
            v = (b & 0x7F) | (raw[p + 1] << 7)
            length, p = (v >> 1) ^ -(v & 1), p + 2
        else:
            length, p = _varint(raw, p)
        if length < 0:
            raise ValueError(f"negative record length {length}")
        p += length
    if p != end:
        raise ValueError(f"records end at byte {p}, the batch at {end}")


def _record_fields(raw: bytes, starts: list) -> tuple[list, list]:
    """Offset deltas and values of the records starting at ``starts``, all at once.

    Record layout: length, attributes (1 byte), timestamp delta, offset delta,
    key length, key, value length, value, headers (skipped whole); every
    integer a zigzag varint. Raises ValueError if a value runs past its
    record's length.
    """
    if not starts:
        return [], []
    arr = np.frombuffer(raw, dtype=np.uint8)
    q = np.array(starts, dtype=np.int64)
    rec_len, w = _varints(arr, q)
    rec_end = q + w + rec_len
    q += w + 1                                      # past the attributes
    q += _varints(arr, q)[1]                        # timestamp delta: skipped
    delta, w = _varints(arr, q)
    q += w
    key_len, w = _varints(arr, q)
    q += w + np.maximum(key_len, 0)
    value_len, w = _varints(arr, q)
    q += w
    vend = q + np.maximum(value_len, 0)
    if (vend > rec_end).any():
        raise ValueError("a record's fields run past its length")
    values = list(map(raw.__getitem__, map(slice, q.tolist(), vend.tolist())))
    if (value_len < 0).any():
        for i in np.flatnonzero(value_len < 0).tolist():
            values[i] = None
    return delta.tolist(), values


def _plain(raw: bytes) -> bool:
    """True if every complete batch in ``raw`` is an uncompressed, non-transactional,
    non-control v2 batch (a partial batch at the end of a fetch is ignored, as by
    kafka-python)."""
    pos, n = 0, len(raw)
    while pos + 17 <= n:
        length = int.from_bytes(raw[pos + 8:pos + 12], "big", signed=True)
        end = pos + _LOG_OVERHEAD + length
        if end > n:
            break
        if raw[pos + 16] != 2 or end - pos < _HEADER.size:
            return False
        if int.from_bytes(raw[pos + 21:pos + 23], "big") & _NOT_PLAIN:
            return False
        pos = end
    return True


def lean_partition_records_class(base):
    """A subclass of kafka-python's ``Fetcher.PartitionRecords`` with the lean reader."""
    from kafka import errors as Errors
    from kafka.record.util import calc_crc32c

    try:
        from kafka.consumer.fetcher import IsolationLevel
        read_uncommitted = IsolationLevel.READ_UNCOMMITTED
    except ImportError:  # pragma: no cover - older layouts
        read_uncommitted = 0

    class LeanPartitionRecords(base):
        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            raw = getattr(records, "_buffer", None)
            if isinstance(raw, (bytearray, memoryview)):
                raw = bytes(raw)
            if (not isinstance(raw, bytes) or key_deserializer is not None
                    or value_deserializer is not None
                    or getattr(self, "isolation_level", read_uncommitted) != read_uncommitted
                    or getattr(self, "aborted_transactions", None) or not _plain(raw)):
                yield from super()._unpack_records(tp, records, key_deserializer,
                                                   value_deserializer)
                return
            # Pass 1, batch by batch: header, CRC, where each record starts.
            batches, starts, error = [], [], None
            pos, n = 0, len(raw)
            while pos + 17 <= n:
                length = int.from_bytes(raw[pos + 8:pos + 12], "big", signed=True)
                end = pos + _LOG_OVERHEAD + length
                if end > n:
                    break                       # a partial batch: the next fetch reads it
                (base_offset, _, epoch, _, crc, _, last_delta, _, _, _, _, _,
                 count) = _HEADER.unpack_from(raw, pos)
                if self.check_crcs and calc_crc32c(memoryview(raw)[pos + _CRC_START:end]) != crc:
                    error = Errors.CorruptRecordError(
                        "Record batch for partition %s at offset %s failed crc check"
                        % (tp, base_offset))
                    break
                first = len(starts)
                try:
                    _record_starts(raw, pos + _HEADER.size, end, count, starts)
                except (IndexError, ValueError) as err:
                    del starts[first:]
                    error = Errors.CorruptRecordError(
                        "Invalid record structure in partition %s at offset %s: %s"
                        % (tp, base_offset, err))
                    break
                batches.append((base_offset, last_delta, epoch, end - pos, first, len(starts)))
                pos = end
            # Pass 2, every record of the fetch at once: offset deltas and values.
            try:
                deltas, values = _record_fields(raw, starts)
            except (IndexError, ValueError) as err:
                # find the bad batch: hand out the good ones before it, as kafka-python would
                deltas, values, k = [], [], 0
                for b in batches:
                    try:
                        d, v = _record_fields(raw, starts[b[4]:b[5]])
                    except (IndexError, ValueError):
                        error = Errors.CorruptRecordError(
                            "Invalid record structure in partition %s at offset %s: %s"
                            % (tp, b[0], err))
                        break
                    deltas += d
                    values += v
                    k += 1
                batches = batches[:k]
            for base_offset, last_delta, epoch, size, lo, hi in batches:
                self.leader_epoch = epoch
                self.bytes_read += size
                offsets = [base_offset + d for d in deltas[lo:hi]]
                vals = values[lo:hi]
                if offsets and offsets[0] < self.fetch_offset:   # a fetch that starts inside a batch
                    keep = next((i for i, o in enumerate(offsets) if o >= self.fetch_offset),
                                len(offsets))
                    offsets, vals = offsets[keep:], vals[keep:]
                if offsets:
                    self.records_read += len(offsets)
                    # kafka-python's reader leaves the position at the batch's last offset + 1
                    self.next_fetch_offset = base_offset + last_delta + 1
                    yield LeanRun(offsets[0], offsets, vals)
                else:
                    self.next_fetch_offset = max(self.next_fetch_offset,
                                                 base_offset + last_delta + 1)
            if error is not None:
                raise error
            self.drain()

    return LeanPartitionRecords


def install(consumer) -> bool:
    """Make ``consumer`` (a ``kafka.KafkaConsumer``) read plain fetches with the lean reader.

    Returns True if installed, False if this kafka-python lacks the hook
    points (the consumer is then left as it was).
    """
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(type(fetcher), "PartitionRecords", None) if fetcher is not None else None
    if base is None or not hasattr(base, "_unpack_records"):
        return False
    try:
        from kafka.record.memory_records import MemoryRecords
    except ImportError:  # pragma: no cover
        return False
    if "_buffer" not in getattr(MemoryRecords, "__slots__", ()):
        return False
    fetcher.PartitionRecords = lean_partition_records_class(base)
    return True
