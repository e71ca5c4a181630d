"""A lean reader of Kafka record batches for kafka-python's fetcher (private).

kafka-python turns every fetched record into a ``ConsumerRecord`` of 13
fields, decoding every varint, timestamp and header on the way: about 12 µs
of CPU per record on a 2-core EPYC, which caps a consumer at 60–80k
records/s whatever the application does. A :class:`~streamsvi.io.KafkaSource`
needs only each record's offset and value. :func:`install` makes one
consumer's fetcher parse record batches with :class:`LeanPartitionRecords`,
which reads the two fields straight from the fetched bytes (Kafka message
format v2, see the protocol's "Record Batch" layout) and hands out one
:data:`LeanRun` per record batch (its records' offsets and values) instead of
one object per record. Only the walk from record to record is a Python loop;
the fields of every record of a fetch are read at once with numpy.

Every v2 fetch takes the lean path:

* **compressed batches** (gzip, snappy, lz4, zstd): the batch's records
  section is decompressed with kafka-python's own codec functions
  (``kafka.codec``), then read the lean way (the records inside are framed as
  in an uncompressed batch). A codec whose library is not installed sends the
  fetch to kafka-python's reader, which then fails as it always did.
* **control batches** (transaction markers) are never handed out; the
  position moves past them.
* **read_committed**: transactional batches of aborted transactions are
  dropped with the fetch response's list of aborted transactions exactly as
  kafka-python's ``PartitionRecords`` does (an aborted producer id is active
  from its transaction's first offset up to its abort marker). A broker that
  lists no aborted transactions (tansu 0.6, see :mod:`streamsvi.io.committed`)
  gets the same records from both readers. Committed transactions, and every
  transactional batch under read_uncommitted, are read lean.

A fetch goes to kafka-python's own reader (the *slow path*) only when a key
or value deserializer is set, the fetched bytes are not reachable, a batch is
in a legacy format (magic 0 or 1), a codec's library is missing, or a control
batch that must be read is malformed. Each such fetch is counted by reason
(:func:`slow_path_counts`, exported as ``streamsvi_slow_path_fetches_total``
by :mod:`streamsvi.service.metrics`); so is each consumer :func:`install`
could not hook (reason ``no_hook``: all its fetches are slow).

The lean reader checks the batch CRC over the bytes as fetched (compressed,
when ``check_crcs``, the default) and each record's framing, and raises
kafka-python's ``CorruptRecordError`` (also for a batch whose CRC holds but
that does not decompress, where kafka-python raises the codec's own error).
Batches before a bad one are handed out first, as kafka-python does. A run
is a batch's records from the fetch offset on (a fetch that starts inside a
batch drops the records before it, as kafka-python does);
``next_fetch_offset`` moves to the batch's last offset + 1 when its run is
handed out or the batch is skipped, so positions, lag and commits are what
they would be with the stock reader. kafka-python counts a run as one record
in ``max_records``.

This relies on kafka-python internals (``tests/io/test_fastfetch_compressed.py``
fails when one is gone): the fetcher builds its per-partition record
iterators through its ``PartitionRecords`` attribute, whose instances keep
``fetch_offset``, ``next_fetch_offset``, ``check_crcs``, ``isolation_level``,
``aborted_transactions``, ``aborted_producer_ids`` and the read counters;
``MemoryRecords`` keeps the fetched bytes in ``_buffer``; ``kafka.codec``
has the ``*_decode`` and ``has_*`` functions. :func:`install` checks them
and returns False (nothing changed) when one is missing.
"""
from __future__ import annotations

import struct
import threading
from collections import namedtuple

import numpy as np

__all__ = ["LeanRun", "SLOW_PATH_REASONS", "install", "lean_partition_records_class",
           "slow_path_counts"]

#: What the lean reader hands out instead of ``ConsumerRecord`` objects: the
#: records of one record batch, ``offset`` being the first one's (kafka-python
#: reads only that attribute), then every record's offset and value.
LeanRun = namedtuple("LeanRun", "offset offsets values")

#: Why a fetch went to kafka-python's own reader: a key or value deserializer
#: is set; the fetched bytes were not reachable; a batch in a legacy message
#: format (magic 0 or 1); a compressed batch whose codec's library is not
#: installed (or an unknown codec); a control batch too short to read its
#: marker; and, once per consumer, an :func:`install` that found no hook.
SLOW_PATH_REASONS = ("deserializer", "no_buffer", "legacy_format", "codec_unavailable",
                     "malformed_batch", "no_hook")

_slow_lock = threading.Lock()
_slow_counts = dict.fromkeys(SLOW_PATH_REASONS, 0)


def _count_slow(reason: str) -> None:
    with _slow_lock:
        _slow_counts[reason] += 1


def slow_path_counts() -> dict[str, int]:
    """Fetches handed to kafka-python's own reader in this process, by reason
    (:data:`SLOW_PATH_REASONS`; ``no_hook`` counts consumers)."""
    with _slow_lock:
        return dict(_slow_counts)


# base offset, batch length, leader epoch, magic, crc, attributes, last offset delta,
# first timestamp, max timestamp, producer id, producer epoch, base sequence, record count
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_START = 21                  # the CRC covers the batch from the attributes on
_LOG_OVERHEAD = 12               # base offset + batch length
_CODEC = 0x07                    # attributes: compression codec
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_CONTROL_KEY = struct.Struct(">hh")   # control record key: version, type (0 abort, 1 commit)


def _decoders() -> dict:
    """kafka-python's decompression function of each codec id whose library is installed."""
    try:
        from kafka import codec as kc
    except ImportError:  # pragma: no cover
        return {}
    table = {1: ("has_gzip", "gzip_decode"), 2: ("has_snappy", "snappy_decode"),
             3: ("has_lz4", "lz4_decode"), 4: ("has_zstd", "zstd_decode")}
    out = {}
    for codec, (has, decode) in table.items():
        has, decode = getattr(kc, has, None), getattr(kc, decode, None)
        if has is not None and decode is not None and has():
            out[codec] = decode
    return out


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


def _record_fields(raw: bytes, starts: list, shift: int = 0) -> tuple[list, list]:
    """Offset deltas and values of the records starting at ``starts`` (minus ``shift``), all at once.

    Record layout: length, attributes (1 byte), timestamp delta, offset delta,
    key length, key, value length, value, headers (skipped whole); every
    integer a zigzag varint. Raises ValueError if a value runs past its
    record's length.
    """
    if not starts:
        return [], []
    arr = np.frombuffer(raw, dtype=np.uint8)
    q = np.array(starts, dtype=np.int64)
    if shift:
        q -= shift
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


def _control_type(buf: bytes, p: int, end: int) -> int | None:
    """The type of the control record at ``buf[p:end]`` (0 abort, 1 commit), None if its
    key is not the 4 bytes of a control record key (kafka-python's reader would fail)."""
    try:
        length, q = _varint(buf, p)
        rec_end = min(q + length, end)
        _, q = _varint(buf, q + 1)                  # attributes; timestamp delta
        _, q = _varint(buf, q)                      # offset delta
        key_len, q = _varint(buf, q)
    except IndexError:
        return None
    if key_len != _CONTROL_KEY.size or q + key_len > rec_end:
        return None
    return _CONTROL_KEY.unpack_from(buf, q)[1]


class _Fallback(Exception):
    """This fetch goes to kafka-python's reader; ``args[0]`` is the reason."""


def lean_partition_records_class(base):
    """A subclass of kafka-python's ``Fetcher.PartitionRecords`` with the lean reader."""
    from kafka import errors as Errors
    from kafka.record.util import calc_crc32c

    class LeanPartitionRecords(base):
        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            raw = getattr(records, "_buffer", None)
            if isinstance(raw, (bytearray, memoryview)):
                raw = bytes(raw)
            try:
                if key_deserializer is not None or value_deserializer is not None:
                    raise _Fallback("deserializer")
                if not isinstance(raw, bytes):
                    raise _Fallback("no_buffer")
                plan = self._lean_scan(tp, raw)
            except _Fallback as why:
                _count_slow(why.args[0])
                yield from super()._unpack_records(tp, records, key_deserializer,
                                                   value_deserializer)
                return
            yield from self._lean_runs(tp, *plan)

        def _lean_scan(self, tp, raw: bytes):
            """Pass 1, batch by batch, before anything is handed out: header, CRC,
            decompression, where each record starts. Raises :class:`_Fallback`."""
            committed = int(getattr(self, "isolation_level", 0)) == 1   # READ_COMMITTED
            batches, starts, blobs, error = [], [], [], None
            decoders = None
            blob_at = n = len(raw)     # decompressed sections go after ``raw`` (see _lean_runs)
            uncompressed = False       # any uncompressed data batch (needs ``raw`` itself)
            pos = 0
            while pos + 17 <= n:
                length = int.from_bytes(raw[pos + 8:pos + 12], "big", signed=True)
                end = pos + _LOG_OVERHEAD + length
                if end > n:
                    break                       # a partial batch: the next fetch reads it
                if raw[pos + 16] != 2:
                    raise _Fallback("legacy_format")
                if end - pos < _HEADER.size:
                    raise _Fallback("malformed_batch")
                (base_offset, _, epoch, _, crc, attrs, last_delta, _, _, pid, _, _,
                 count) = _HEADER.unpack_from(raw, pos)
                if self.check_crcs and calc_crc32c(memoryview(raw)[pos + _CRC_START:end]) != crc:
                    error = Errors.CorruptRecordError(
                        "Record batch for partition %s at offset %s failed crc check"
                        % (tp, base_offset))
                    break
                codec = attrs & _CODEC
                buf, p, e = raw, pos + _HEADER.size, end
                if codec:
                    if decoders is None:
                        decoders = _decoders()
                    decode = decoders.get(codec)
                    if decode is None:
                        raise _Fallback("codec_unavailable")
                    try:
                        buf = decode(raw[p:end])
                    except Exception as err:  # noqa: BLE001 - each codec raises its own errors
                        error = Errors.CorruptRecordError(
                            "Record batch for partition %s at offset %s does not decompress "
                            "(codec %d): %s: %s" % (tp, base_offset, codec, type(err).__name__, err))
                        break
                    if not isinstance(buf, bytes):
                        buf = bytes(buf)
                    p, e = 0, len(buf)
                abort = False
                first = len(starts)
                if attrs & _CONTROL:
                    if committed and pid > -1:  # kafka-python reads the marker only then
                        kind = _control_type(buf, p, e) if count > 0 else None
                        if kind is None:
                            raise _Fallback("malformed_batch")
                        abort = kind == 0
                else:
                    try:
                        _record_starts(buf, p, e, count, starts)
                    except (IndexError, ValueError) as err:
                        del starts[first:]
                        error = Errors.CorruptRecordError(
                            "Invalid record structure in partition %s at offset %s: %s"
                            % (tp, base_offset, err))
                        break
                    if codec:
                        if blob_at:
                            starts[first:] = [s + blob_at for s in starts[first:]]
                        blobs.append(buf)
                        blob_at += len(buf)
                    else:
                        uncompressed = True
                batches.append((base_offset, last_delta, epoch, end - pos, first, len(starts),
                                attrs, pid, abort))
                pos = end
            # one buffer holds every record: ``raw``, then the decompressed sections
            if not blobs:
                buffer, shift = raw, 0
            elif uncompressed:
                buffer, shift = b"".join([raw, *blobs]), 0
            else:
                buffer, shift = b"".join(blobs), n
            return committed, batches, buffer, starts, shift, error

        def _lean_runs(self, tp, committed, batches, buffer, starts, shift, error):
            """Pass 2, every record of the fetch at once: offset deltas and values; then
            the runs, batch by batch, skipping control batches and aborted transactions."""
            try:
                deltas, values = _record_fields(buffer, starts, shift)
            except (IndexError, ValueError) as err:
                # find the bad batch: hand out the good ones before it, as kafka-python would
                deltas, values = [None] * len(starts), [None] * len(starts)
                for k, b in enumerate(batches):
                    try:
                        d, v = _record_fields(buffer, starts[b[4]:b[5]], shift)
                    except (IndexError, ValueError):
                        error = Errors.CorruptRecordError(
                            "Invalid record structure in partition %s at offset %s: %s"
                            % (tp, b[0], err))
                        batches = batches[:k]
                        break
                    deltas[b[4]:b[5]], values[b[4]:b[5]] = d, v
            aborted_ids = self.aborted_producer_ids
            aborted_txns = self.aborted_transactions
            for base_offset, last_delta, epoch, size, lo, hi, attrs, pid, abort in batches:
                self.leader_epoch = epoch
                next_offset = base_offset + last_delta + 1
                if committed and pid > -1:
                    # kafka-python's PartitionRecords: a producer's transaction is aborted from
                    # its first offset (the response's list) up to its abort marker
                    while aborted_txns and aborted_txns[0].first_offset < next_offset:
                        aborted_ids.add(aborted_txns.popleft().producer_id)
                    if attrs & _CONTROL:
                        if abort:
                            aborted_ids.discard(pid)
                    elif attrs & _TRANSACTIONAL and pid in aborted_ids:
                        self.next_fetch_offset = next_offset
                        continue
                if attrs & _CONTROL:
                    self.next_fetch_offset = next_offset
                    continue
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
                    self.next_fetch_offset = next_offset
                    yield LeanRun(offsets[0], offsets, vals)
                else:
                    self.next_fetch_offset = max(self.next_fetch_offset, next_offset)
            if error is not None:
                raise error
            if batches:
                b = batches[-1]
                self.next_fetch_offset = b[0] + b[1] + 1
            self.drain()

    return LeanPartitionRecords


_INTERNALS = ("fetch_offset", "next_fetch_offset", "check_crcs", "isolation_level",
              "aborted_transactions", "aborted_producer_ids", "bytes_read", "records_read",
              "leader_epoch", "drain")
_CODEC_NAMES = ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode",
                "has_gzip", "has_snappy", "has_lz4", "has_zstd")
_hookable: dict = {}


def _has_internals(base) -> bool:
    """Whether kafka-python's ``PartitionRecords`` class ``base`` has what the lean reader uses."""
    if base in _hookable:
        return _hookable[base]
    ok = False
    try:
        from kafka import TopicPartition
        from kafka import codec as kc
        from kafka.record.memory_records import MemoryRecords

        if ("_buffer" in getattr(MemoryRecords, "__slots__", ()) and hasattr(base, "_unpack_records")
                and all(hasattr(kc, name) for name in _CODEC_NAMES)):
            probe = base(0, TopicPartition("probe", 0), MemoryRecords(b""), check_crcs=True,
                         isolation_level=1, aborted_transactions=[])
            ok = (all(hasattr(probe, name) for name in _INTERNALS)
                  and hasattr(probe.aborted_transactions, "popleft")
                  and isinstance(probe.aborted_producer_ids, set)
                  and int(probe.isolation_level) == 1)
    except Exception:  # noqa: BLE001 - any change of these internals means "not hookable"
        ok = False
    _hookable[base] = ok
    return ok


def install(consumer) -> bool:
    """Make ``consumer`` (a ``kafka.KafkaConsumer``) read its fetches with the lean reader.

    Returns True if installed, False if this kafka-python lacks the hook
    points (the consumer is then left as it was, and ``no_hook`` is counted
    in :func:`slow_path_counts`).
    """
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(type(fetcher), "PartitionRecords", None) if fetcher is not None else None
    if base is None or not _has_internals(base):
        _count_slow("no_hook")
        return False
    fetcher.PartitionRecords = lean_partition_records_class(base)
    return True
