"""The lean record reader (streamsvi.io._fastfetch) against kafka-python's own.

Record batches are built with kafka-python's batch builder, so both readers
see the bytes a broker would send; every case compares what the two readers
hand out (offset and value of each record), where the fetch ends
(``next_fetch_offset``) and which errors they raise.
"""
import struct

import pytest
from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

from streamsvi.io import _fastfetch

TP = TopicPartition("t", 0)
Lean = _fastfetch.lean_partition_records_class(Fetcher.PartitionRecords)


def batch(base_offset, records, compression=0, transactional=False, attrs_or=0, producer_id=None):
    """One v2 batch: ``records`` is a list of (offset_delta, key, value, headers); ``attrs_or``
    bits are set in the attributes afterwards (CRC recomputed); the producer id defaults to 7
    for a transactional batch, else none (-1)."""
    if producer_id is None:
        producer_id = 7 if transactional else -1
    b = DefaultRecordBatchBuilder(magic=2, compression_type=compression,
                                  is_transactional=transactional, producer_id=producer_id,
                                  producer_epoch=0 if producer_id >= 0 else -1,
                                  base_sequence=0 if producer_id >= 0 else -1, batch_size=1 << 24)
    for delta, key, value, headers in records:
        assert b.append(delta, timestamp=1_700_000_000_000 + delta, key=key, value=value,
                        headers=headers) is not None
    buf = bytearray(b.build())
    struct.pack_into(">q", buf, 0, base_offset)          # the base offset is not under the CRC
    if attrs_or:
        attrs = struct.unpack_from(">h", buf, 21)[0] | attrs_or
        struct.pack_into(">h", buf, 21, attrs)
        struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))
    return bytes(buf)


def read(cls, raw, fetch_offset=0, take=None, **kw):
    """(offset, value) pairs a reader hands out, and its next_fetch_offset."""
    part = cls(fetch_offset, TP, MemoryRecords(raw), **kw)
    out = []
    while part:
        got = part.take(take)
        if not got:
            break
        for r in got:
            if isinstance(r, _fastfetch.LeanRun):
                assert r.offset == r.offsets[0] and len(r.offsets) == len(r.values)
                out += list(zip(r.offsets, r.values))
            else:
                out.append((r.offset, r.value))
    return out, part.next_fetch_offset


def same(raw, **kw):
    stock = read(Fetcher.PartitionRecords, raw, **kw)
    lean = read(Lean, raw, **kw)
    assert lean == stock
    return lean


def test_values_offsets_and_end_match_kafka_python_on_every_varint_width():
    sizes = [0, 1, 63, 64, 100, 8000, 8300, 70_000]     # 1-, 2- and 3-byte length varints
    recs = [(i, None if i % 3 else str(i).encode(), bytes([65 + i % 26]) * sizes[i % len(sizes)],
             [("h", b"v")] if i % 5 == 0 else []) for i in range(40)]
    raw = batch(0, recs) + batch(40, [(d, b"k", b"[1.5, 2]", []) for d in range(10_000)])
    out, end = same(raw)
    assert len(out) == 10_040 and end == 10_040
    assert out[4] == (4, b"E" * 100) and out[-1] == (10_039, b"[1.5, 2]")


def test_null_values_gaps_and_a_fetch_that_starts_inside_a_batch():
    recs = [(0, None, b"a", []), (1, None, None, []), (5, b"key", b"b", []), (9, None, b"c", [])]
    raw = batch(100, recs) + batch(110, [(0, None, b"d", [])])
    out, end = same(raw)
    assert out == [(100, b"a"), (101, None), (105, b"b"), (109, b"c"), (110, b"d")]
    assert end == 111
    assert same(raw, fetch_offset=104)[0] == [(105, b"b"), (109, b"c"), (110, b"d")]
    assert same(raw, take=2)[0] == out                   # handed out two at a time


def test_batches_of_every_size_and_mixed_nulls_keys_headers():
    for n in (1, 2, 23, 24, 300):
        recs = [(d, None if d % 4 else b"key", None if d % 7 == 3 else b"v" * (d * 37 % 300),
                 [("h", b"x")] if d % 6 == 0 else []) for d in range(n)]
        out, end = same(batch(1000, recs))
        assert len(out) == n and end == 1000 + n
        assert same(batch(1000, recs), fetch_offset=1000 + n // 2)[0] == out[n // 2:]


def test_a_long_batch_with_broken_framing_is_corrupt_not_misread():
    recs = [(d, None, b"[%d, 1.5]" % d, []) for d in range(100)]
    raw = bytearray(batch(0, recs))
    i = raw.index(b"[50, 1.5]")
    raw[i - 1] = 0x7E                                   # value length 63: past the record's end
    struct.pack_into(">I", raw, 17, calc_crc32c(memoryview(raw)[21:]))
    with pytest.raises(CorruptRecordError):
        Lean(0, TP, MemoryRecords(bytes(raw))).take(None)
    # the good batches before a bad one are handed out first, as kafka-python does
    good = batch(200, [(0, None, b"ok", [])] * 1)
    part = Lean(0, TP, MemoryRecords(good + bytes(raw)))
    first = part.take(None)
    assert [(r.offsets, r.values) for r in first] == [([200], [b"ok"])]
    with pytest.raises(CorruptRecordError):
        part.take(None)


def test_partial_batch_at_the_end_of_a_fetch_is_left_for_the_next_fetch():
    raw = batch(0, [(0, None, b"x", [])]) + batch(1, [(0, None, b"y", []), (1, None, b"z", [])])
    out, end = same(raw[:-5])
    assert out == [(0, b"x")] and end == 1


def test_compressed_transactional_and_control_batches_are_read_lean():
    plain = batch(0, [(0, None, b"p", [])])
    for other in (batch(1, [(0, None, b"g" * 500, []), (1, None, b"h", [])], compression=1),
                  batch(1, [(0, None, b"t", [])], transactional=True)):
        out, _ = same(plain + other)
        assert [o for o, _ in out][:2] == [0, 1]
        lean = Lean(0, TP, MemoryRecords(plain + other))
        assert all(isinstance(r, _fastfetch.LeanRun) for r in lean.take(None))
    control = batch(1, [(0, None, b"\x00\x00\x00\x00\x00\x00", [])], attrs_or=0x20)
    out, end = same(plain + control + batch(2, [(0, None, b"after", [])]))
    assert out == [(0, b"p"), (2, b"after")] and end == 3


def test_legacy_format_batches_are_read_by_kafka_python_and_counted():
    from kafka.record.legacy_records import LegacyRecordBatchBuilder

    b = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    for i in range(3):
        b.append(i + 1, timestamp=1_700_000_000_000, key=None, value=b"old%d" % i)
    raw = batch(0, [(0, None, b"new", [])]) + bytes(b.build())
    before = _fastfetch.slow_path_counts()["legacy_format"]
    lean = Lean(0, TP, MemoryRecords(raw))
    got = lean.take(None)
    assert not any(isinstance(r, _fastfetch.LeanRun) for r in got)        # the stock reader
    assert _fastfetch.slow_path_counts()["legacy_format"] == before + 1


def test_a_corrupt_batch_raises_the_same_error():
    raw = bytearray(batch(0, [(0, None, b"[1, 2]", []), (1, None, b"[3, 4]", [])]))
    raw[-3] ^= 0xFF
    for cls in (Fetcher.PartitionRecords, Lean):
        with pytest.raises(CorruptRecordError, match="crc"):
            cls(0, TP, MemoryRecords(bytes(raw))).take(None)


def test_install_hooks_only_that_consumer():
    class FakeFetcher:
        PartitionRecords = Fetcher.PartitionRecords

    class FakeConsumer:
        _fetcher = FakeFetcher()

    c = FakeConsumer()
    assert _fastfetch.install(c)
    assert issubclass(c._fetcher.PartitionRecords, Fetcher.PartitionRecords)
    assert FakeFetcher.PartitionRecords is Fetcher.PartitionRecords
    assert not _fastfetch.install(object())                 # nothing to hook: left alone
