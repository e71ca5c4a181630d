"""A lean reader of Kafka record batches for kafka-python's fetcher (private).

kafka-python turns every fetched record into a ``ConsumerRecord`` of 13
fields, decoding every varint, timestamp and header on the way: about 12 µs
of CPU per record on a 2-core EPYC, which caps a consumer at 60–80k
records/s whatever the application does. A :class:`~streamsvi.io.KafkaSource`
needs only each record's offset and value. :func:`install` makes one
consumer's fetcher parse plain record batches with :class:`LeanPartitionRecords`,
which reads the two fields straight from the fetched bytes (Kafka message
format v2, see the protocol's "Record Batch" layout) and hands out
``(offset, value)`` named tuples: about 3.5 µs per record.

Only *plain* fetches take the lean path: every batch is format v2
(magic 2), uncompressed, not transactional and not a control batch, the
isolation level is read_uncommitted, no key or value deserializer is set and
the fetched bytes are reachable. Anything else (compression, transactions,
control markers, the legacy formats) is read by kafka-python's own code, as
before. The lean reader checks the batch CRC (when ``check_crcs``, the
default) and each record's framing exactly where kafka-python does and raises
the same ``CorruptRecordError``; it moves ``next_fetch_offset`` record by
record and to the batch's last offset + 1 at its end, so positions, lag and
commits are what they would be with the stock reader.

This relies on two kafka-python internals: the fetcher builds its per-
partition record iterators through its ``PartitionRecords`` attribute, and
``MemoryRecords`` keeps the fetched bytes in ``_buffer``. :func:`install`
checks both and returns False (nothing changed) when they are missing.
"""
from __future__ import annotations

import struct
from collections import namedtuple

__all__ = ["LeanRecord", "install", "lean_partition_records_class"]

#: What the lean reader hands out instead of a ``ConsumerRecord``.
LeanRecord = namedtuple("LeanRecord", "offset value")

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
            pos, n = 0, len(raw)
            while pos + 17 <= n:
                length = int.from_bytes(raw[pos + 8:pos + 12], "big", signed=True)
                end = pos + _LOG_OVERHEAD + length
                if end > n:
                    break
                (base_offset, _, epoch, _, crc, _, last_delta, _, _, _, _, _,
                 count) = _HEADER.unpack_from(raw, pos)
                if self.check_crcs and calc_crc32c(memoryview(raw)[pos + _CRC_START:end]) != crc:
                    raise Errors.CorruptRecordError(
                        "Record batch for partition %s at offset %s failed crc check"
                        % (tp, base_offset))
                self.leader_epoch = epoch
                p = pos + _HEADER.size
                for _ in range(count):
                    # Record: length, attributes, timestamp delta, offset delta,
                    # key length, key, value length, value, headers (skipped whole)
                    try:
                        # varints of 1 or 2 bytes (zigzag) inline: every field of
                        # a record shorter than 8 KiB; longer ones via _varint
                        b = raw[p]
                        if b < 0x80:
                            rec_len, p = (b >> 1) ^ -(b & 1), p + 1
                        elif raw[p + 1] < 0x80:
                            v = (b & 0x7F) | (raw[p + 1] << 7)
                            rec_len, p = (v >> 1) ^ -(v & 1), p + 2
                        else:
                            rec_len, p = _varint(raw, p)
                        rec_end = p + rec_len
                        q = p + 1                       # attributes: one byte
                        while raw[q] & 0x80:            # timestamp delta: skipped
                            q += 1
                        q += 1
                        b = raw[q]
                        if b < 0x80:
                            delta, q = (b >> 1) ^ -(b & 1), q + 1
                        elif raw[q + 1] < 0x80:
                            v = (b & 0x7F) | (raw[q + 1] << 7)
                            delta, q = (v >> 1) ^ -(v & 1), q + 2
                        else:
                            delta, q = _varint(raw, q)
                        b = raw[q]
                        if b < 0x80:
                            key_len, q = (b >> 1) ^ -(b & 1), q + 1
                        else:
                            key_len, q = _varint(raw, q)
                        if key_len > 0:
                            q += key_len
                        b = raw[q]
                        if b < 0x80:
                            value_len, q = (b >> 1) ^ -(b & 1), q + 1
                        elif raw[q + 1] < 0x80:
                            v = (b & 0x7F) | (raw[q + 1] << 7)
                            value_len, q = (v >> 1) ^ -(v & 1), q + 2
                        else:
                            value_len, q = _varint(raw, q)
                    except IndexError as err:
                        raise Errors.CorruptRecordError(
                            "Found invalid record structure: %r" % (err,)) from None
                    if value_len >= 0:
                        value = raw[q:q + value_len]
                        q += value_len
                    else:
                        value = None
                    if rec_len < 0 or q > rec_end or rec_end > end:
                        raise Errors.CorruptRecordError(
                            "Invalid record size in partition %s at offset %s"
                            % (tp, base_offset + delta))
                    p = rec_end
                    offset = base_offset + delta
                    self.records_read += 1
                    self.next_fetch_offset = offset + 1
                    yield LeanRecord(offset, value)
                if p != end:
                    raise Errors.CorruptRecordError(
                        "%d unconsumed bytes after all records consumed" % (end - p))
                self.bytes_read += end - pos
                self.next_fetch_offset = base_offset + last_delta + 1
                pos = end
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
