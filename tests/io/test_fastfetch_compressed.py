"""The lean reader (streamsvi.io._fastfetch) on compressed batches, transactions and
read_committed, against kafka-python's own reader; the kafka-python internals it needs;
its slow-path counter and metric.

Unit cases build batches with kafka-python's batch builder; broker cases produce with
kafka-python's producer (every ``compression_type`` whose library is installed) to a
real local broker and read the topic twice, with the stock reader and the lean one.
"""
import collections
import struct
import time

import pytest
from kafka import TopicPartition
from kafka import codec as kafka_codec
from kafka.consumer.fetcher import Fetcher
from kafka.errors import CorruptRecordError
from kafka.record.memory_records import MemoryRecords
from kafka.record.util import calc_crc32c

from streamsvi.io import _fastfetch

from tests.io.test_fastfetch import TP, Lean, read, same  # noqa: E402,F401  (one reader harness)
from tests.io.test_fastfetch import batch as _batch  # noqa: E402
READ_COMMITTED = 1

#: codec id in the batch attributes, kafka-python's compression_type name, its library check
CODECS = [(1, "gzip", kafka_codec.has_gzip), (2, "snappy", kafka_codec.has_snappy),
          (3, "lz4", kafka_codec.has_lz4), (4, "zstd", kafka_codec.has_zstd)]
AVAILABLE = [(cid, name) for cid, name, has in CODECS if has()]
# what this kafka-python + codec libraries can test; the others are skipped, never passed silently
CODEC_PARAMS = [pytest.param(cid, name, id=name,
                             marks=[] if has() else pytest.mark.skip(f"{name} library not installed"))
                for cid, name, has in CODECS]

AbortedTransaction = collections.namedtuple("AbortedTransaction", "producer_id first_offset")


class Upper:
    """A value deserializer (kafka-python 3's interface)."""

    def deserialize(self, topic, headers, data):
        return data.upper()


def batch(base_offset, records, compression=0, producer_id=-1, transactional=False, control=False):
    """One v2 batch: ``records`` is a list of (offset_delta, key, value, headers)."""
    return _batch(base_offset, records, compression, transactional, attrs_or=0x20 if control else 0,
                  producer_id=producer_id)


def marker(offset, producer_id, commit):
    """A control batch holding one transaction marker (key: version 0, type 1 commit / 0 abort)."""
    return batch(offset, [(0, struct.pack(">hh", 0, int(commit)), struct.pack(">hi", 0, 0), [])],
                 producer_id=producer_id, transactional=True, control=True)


def records(n, seed=0):
    """Values of every length-varint width, null values, keys and headers."""
    sizes = [0, 1, 63, 64, 100, 8000, 8300]
    return [(d, None if d % 3 else b"k%d" % d,
             None if d % 11 == 5 else bytes([65 + (d + seed) % 26]) * sizes[d % len(sizes)],
             [("h", b"v")] if d % 5 == 0 else []) for d in range(n)]


# --- the kafka-python internals the lean reader needs ---------------------------------------

def test_this_kafka_python_has_every_internal_the_lean_reader_needs():
    """Fails when a kafka-python release moves what the lean reader hooks into: then every
    consumer would silently read at kafka-python's speed. Pin kafka-python below that release
    or port the reader."""
    assert hasattr(Fetcher, "PartitionRecords")
    assert hasattr(Fetcher.PartitionRecords, "_unpack_records")
    assert "_buffer" in MemoryRecords.__slots__
    assert MemoryRecords(b"abc")._buffer == b"abc"
    for name in ("gzip_decode", "snappy_decode", "lz4_decode", "zstd_decode",
                 "has_gzip", "has_snappy", "has_lz4", "has_zstd"):
        assert hasattr(kafka_codec, name), name
    assert _fastfetch._has_internals(Fetcher.PartitionRecords)

    class FakeFetcher:
        PartitionRecords = Fetcher.PartitionRecords

    class FakeConsumer:
        _fetcher = FakeFetcher()

    assert _fastfetch.install(FakeConsumer())


def test_a_kafka_python_without_the_internals_is_left_alone_and_counted():
    class Moved(Fetcher.PartitionRecords):         # as if a release renamed the abort state
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            del self.aborted_producer_ids

    class FakeFetcher:
        PartitionRecords = Moved

    class FakeConsumer:
        _fetcher = FakeFetcher()

    c = FakeConsumer()
    before = _fastfetch.slow_path_counts()["no_hook"]
    assert not _fastfetch.install(c)
    assert c._fetcher.PartitionRecords is Moved
    assert _fastfetch.slow_path_counts()["no_hook"] == before + 1


# --- compressed batches ---------------------------------------------------------------------

@pytest.mark.parametrize("cid,name", CODEC_PARAMS)
def test_compressed_batches_match_kafka_python(cid, name):
    raw = (batch(0, records(40), compression=cid)
           + batch(40, [(d, None, b"[%d, 1.5]" % d, []) for d in range(3000)], compression=cid)
           + batch(3040, records(7, seed=3))                       # uncompressed between
           + batch(3047, records(23, seed=5), compression=cid))
    lean = Lean(0, TP, MemoryRecords(raw))
    assert all(isinstance(r, _fastfetch.LeanRun) for r in lean.take(None))
    out, end = same(raw)
    assert len(out) == 3070 and end == 3070
    assert out[41] == (41, b"[1, 1.5]") and out[5] == (5, None)
    # a fetch that starts inside a compressed batch, and one handed out two runs at a time
    assert same(raw, fetch_offset=1000)[0] == out[1000:]
    assert same(raw, take=2)[0] == out
    # compressed only: no uncompressed batch in the fetch
    only = batch(10, records(30), compression=cid) + batch(40, records(5), compression=cid)
    assert len(same(only)[0]) == 35


@pytest.mark.parametrize("cid,name", CODEC_PARAMS)
def test_a_corrupt_compressed_batch_is_a_corrupt_record_error(cid, name):
    good = batch(0, [(0, None, b"ok", [])], compression=cid)
    bad = bytearray(batch(1, records(20), compression=cid))
    bad[-3] ^= 0xFF                                     # the CRC no longer holds
    for cls in (Fetcher.PartitionRecords, Lean):
        part = cls(0, TP, MemoryRecords(good + bytes(bad)))
        first = part.take(None)
        assert [getattr(r, "offsets", [r.offset]) for r in first] == [[0]]
        with pytest.raises(CorruptRecordError, match="crc"):
            part.take(None)
    # the CRC holds, but the compressed bytes do not decompress (a broken producer)
    header = bytearray(bad[:61])
    garbage = bytes(header) + b"\x00\x01not a compressed stream" * 3
    garbage = bytearray(garbage)
    struct.pack_into(">i", garbage, 8, len(garbage) - 12)
    struct.pack_into(">I", garbage, 17, calc_crc32c(memoryview(garbage)[21:]))
    part = Lean(0, TP, MemoryRecords(good + bytes(garbage)))
    assert [r.offsets for r in part.take(None)] == [[0]]
    with pytest.raises(CorruptRecordError, match="does not decompress"):
        part.take(None)


def test_a_compressed_batch_whose_records_do_not_fill_it_is_corrupt():
    raw = bytearray(batch(0, records(10), compression=1))
    struct.pack_into(">i", raw, 57, 11)                 # claims one record more than it holds
    struct.pack_into(">I", raw, 17, calc_crc32c(memoryview(raw)[21:]))
    with pytest.raises(CorruptRecordError, match="Invalid record structure"):
        Lean(0, TP, MemoryRecords(bytes(raw))).take(None)


def test_a_missing_codec_library_sends_the_fetch_to_kafka_python_and_counts_it(monkeypatch):
    raw = batch(0, [(0, None, b"a", [])]) + batch(1, [(0, None, b"b" * 300, [])], compression=1)
    monkeypatch.setattr(kafka_codec, "has_gzip", lambda: False)
    before = _fastfetch.slow_path_counts()["codec_unavailable"]
    part = Lean(0, TP, MemoryRecords(raw))
    got = part.take(1)
    assert not isinstance(got[0], _fastfetch.LeanRun) and got[0].value == b"a"
    assert _fastfetch.slow_path_counts()["codec_unavailable"] == before + 1


def test_a_deserializer_sends_the_fetch_to_kafka_python_and_counts_it():
    raw = batch(0, [(0, None, b"a", [])])
    before = _fastfetch.slow_path_counts()["deserializer"]
    out, _ = read(Lean, raw, value_deserializer=Upper())
    assert out == [(0, b"A")]
    assert _fastfetch.slow_path_counts()["deserializer"] == before + 1


# --- transactions ---------------------------------------------------------------------------

def transactions(compression=0):
    """The batches of: producer 7 commits 0-1, producer 8 aborts 3-4 (interleaved with
    producer 7's 5-6, aborted too), producer 9 commits 9-10, then a plain record at 12."""
    return [batch(0, [(0, None, b"c1", []), (1, None, b"c2", [])], compression, 7, True),
            marker(2, 7, commit=True),
            batch(3, [(0, None, b"a1", []), (1, None, b"a2", [])], compression, 8, True),
            batch(5, [(0, None, b"a3", []), (1, None, b"a4", [])], compression, 7, True),
            marker(7, 8, commit=False),
            marker(8, 7, commit=False),
            batch(9, [(0, None, b"c3", []), (1, None, b"c4", [])], compression, 9, True),
            marker(11, 9, commit=True),
            batch(12, [(0, None, b"plain", [])], compression)]


ABORTED = [AbortedTransaction(8, 3), AbortedTransaction(7, 5)]


@pytest.mark.parametrize("cid", [0] + [cid for cid, _ in AVAILABLE])
def test_read_committed_drops_aborted_transactions_as_kafka_python_does(cid):
    parts = transactions(cid)
    raw = b"".join(parts)
    out, end = same(raw, isolation_level=READ_COMMITTED, aborted_transactions=ABORTED)
    assert [v for _, v in out] == [b"c1", b"c2", b"c3", b"c4", b"plain"]
    assert [o for o, _ in out] == [0, 1, 9, 10, 12] and end == 13
    # every fetch offset, every take size: the same records and the same end
    for start in range(13):
        for take in (1, 2, None):
            same(raw, fetch_offset=start, take=take, isolation_level=READ_COMMITTED,
                 aborted_transactions=ABORTED)
    # a fetch that ends right after the abort markers: positioned past them, nothing handed out
    assert same(b"".join(parts[:6]), fetch_offset=3, isolation_level=READ_COMMITTED,
                aborted_transactions=ABORTED) == ([], 9)


def test_read_uncommitted_and_unlisted_aborts_see_every_data_record():
    raw = b"".join(transactions())
    every = [b"c1", b"c2", b"a1", b"a2", b"a3", b"a4", b"c3", b"c4", b"plain"]
    assert [v for _, v in same(raw)[0]] == every                        # read_uncommitted
    # a broker that lists no aborted transactions (tansu): both readers return them all
    assert [v for _, v in same(raw, isolation_level=READ_COMMITTED)[0]] == every
    lean = Lean(0, TP, MemoryRecords(raw), isolation_level=READ_COMMITTED,
                aborted_transactions=ABORTED)
    assert all(isinstance(r, _fastfetch.LeanRun) for r in lean.take(None))


def test_a_malformed_marker_under_read_committed_goes_to_kafka_python():
    bad = batch(2, [(0, b"xy", b"", [])], producer_id=7, transactional=True, control=True)
    raw = batch(0, [(0, None, b"c1", [])], producer_id=7, transactional=True) + bad
    before = _fastfetch.slow_path_counts()["malformed_batch"]
    lean = Lean(0, TP, MemoryRecords(raw), isolation_level=READ_COMMITTED)
    with pytest.raises(Exception):          # kafka-python cannot read that key either
        while lean:
            if not lean.take(None):
                break
    assert _fastfetch.slow_path_counts()["malformed_batch"] == before + 1
    assert same(raw)[0] == [(0, b"c1")]     # read_uncommitted never reads a marker


# --- the metric -----------------------------------------------------------------------------

def test_the_slow_path_metric_reads_the_counter():
    from prometheus_client import CollectorRegistry

    from streamsvi.service.metrics import DaemonMetrics

    m = DaemonMetrics(CollectorRegistry())
    read(Lean, batch(0, [(0, None, b"a", [])]), value_deserializer=Upper())
    counts = _fastfetch.slow_path_counts()
    for reason in _fastfetch.SLOW_PATH_REASONS:
        got = m.registry.get_sample_value("streamsvi_slow_path_fetches_total", {"reason": reason})
        assert got == counts[reason], reason
    assert counts["deserializer"] >= 1


# --- on the real broker ---------------------------------------------------------------------

def _consume(bootstrap, topic, lean, isolation="read_uncommitted", timeout_s=30.0):
    """Every record of partition 0 as (offset, value), and the final position, read with the
    stock reader or the lean one, without a group."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level=isolation, max_partition_fetch_bytes=256 << 10)
    try:
        codecs = set()
        if lean:
            assert _fastfetch.install(c)
            hooked = c._fetcher.PartitionRecords

            class Seen(hooked):     # notes the codec of every batch fetched
                def __init__(self, fetch_offset, tp, records, *args, **kw):
                    raw, pos = bytes(records._buffer), 0
                    while pos + 61 <= len(raw):
                        codecs.add(raw[pos + 22] & 0x07)
                        pos += 12 + int.from_bytes(raw[pos + 8:pos + 12], "big")
                    super().__init__(fetch_offset, tp, records, *args, **kw)

            c._fetcher.PartitionRecords = Seen
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        out, runs = [], 0
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for r in c.poll(timeout_ms=200).get(tp, []):
                if isinstance(r, _fastfetch.LeanRun):
                    runs += 1
                    out += list(zip(r.offsets, r.values))
                else:
                    out.append((r.offset, r.value))
            hw = c.highwater(tp)
            if hw is not None and c.position(tp) >= hw:
                break
        assert not lean or runs, "the lean reader handed out nothing"
        return out, c.position(tp), c.highwater(tp), codecs
    finally:
        c.close()


@pytest.mark.parametrize("compression", [None] + [name for _, name in AVAILABLE])
def test_every_compression_on_the_broker_reads_as_kafka_python(kafka_broker, new_topic, compression):
    from kafka import KafkaProducer

    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    p = KafkaProducer(bootstrap_servers=bootstrap, compression_type=compression,
                      linger_ms=20, batch_size=64 << 10)
    sent = []
    for i in range(4000):
        value = None if i % 97 == 13 else (b"[%d, %d.25]" % (i, i % 7)) * (1 + i % 40)
        sent.append(value)
        p.send(topic, value=value, key=b"k" if value is None else None, partition=0)
    p.flush()
    p.close()
    before = _fastfetch.slow_path_counts()
    stock, stock_pos, hw, _ = _consume(bootstrap, topic, lean=False)
    lean, lean_pos, _, codecs = _consume(bootstrap, topic, lean=True)
    assert codecs == {dict((n, c) for c, n, _ in CODECS).get(compression, 0)}   # as produced
    assert lean == stock
    assert [v for _, v in lean] == sent and [o for o, _ in lean] == list(range(4000))
    assert lean_pos == stock_pos == hw == 4000
    after = _fastfetch.slow_path_counts()
    assert after["codec_unavailable"] == before["codec_unavailable"]
    assert after["legacy_format"] == before["legacy_format"]


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_transactions_on_the_broker_read_as_kafka_python(kafka_broker, new_topic, compression):
    from kafka import KafkaProducer

    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"x-{topic}",
                      compression_type=compression)
    p.init_transactions()
    for values, commit in (([b"c1", b"c2"], True), ([b"a1", b"a2"], False), ([b"c3"], True)):
        p.begin_transaction()
        for v in values:
            p.send(topic, v * 100, partition=0)     # long enough to be worth compressing
        p.flush()
        p.commit_transaction() if commit else p.abort_transaction()
    p.close()
    for isolation in ("read_committed", "read_uncommitted"):
        stock, stock_pos, hw, _ = _consume(bootstrap, topic, lean=False, isolation=isolation)
        lean, lean_pos, _, codecs = _consume(bootstrap, topic, lean=True, isolation=isolation)
        assert 1 in codecs if compression else codecs == {0}, codecs
        assert lean == stock, isolation
        assert lean_pos == stock_pos == hw, isolation     # past the last commit marker
        values = [v[:2] for _, v in lean]
        assert [v for v in values if v.startswith(b"c")] == [b"c1", b"c2", b"c3"]
        if isolation == "read_uncommitted":
            assert values == [b"c1", b"c2", b"a1", b"a2", b"c3"]
        # read_committed: a broker that lists aborted transactions (Kafka) hides a1 a2 from
        # both readers; tansu 0.6 lists none, so both return them (tests/io/test_committed.py)
        assert values in ([b"c1", b"c2", b"c3"], [b"c1", b"c2", b"a1", b"a2", b"c3"]), isolation
    # the markers take offsets: 2 records + marker, 2 + marker, 1 + marker
    assert hw == 8


def test_a_kafka_source_reads_a_compressed_topic_lean(kafka_broker, new_topic, new_group):
    import numpy as np

    from streamsvi.io import JsonCodec, KafkaSource, produce_rows

    topic = new_topic(2)
    rows = np.column_stack([np.arange(600, dtype=float), np.linspace(0, 1, 600)])
    produce_rows(kafka_broker.bootstrap, topic, rows, partitions=2, codec=JsonCodec(2),
                 producer_config={"compression_type": "gzip"})
    before = _fastfetch.slow_path_counts()
    src = KafkaSource(kafka_broker.bootstrap, topic, group_id=new_group(), codec=JsonCodec(2))
    try:
        assert src.lean_reader
        got, deadline = [], time.monotonic() + 30
        while len(got) < 600 and time.monotonic() < deadline:
            b = src.poll_batch(1000, 0.5)
            if b is not None:
                got += b.x[:, 0].astype(int).tolist()
        assert sorted(got) == list(range(600))
    finally:
        src.close()
    assert _fastfetch.slow_path_counts() == before
