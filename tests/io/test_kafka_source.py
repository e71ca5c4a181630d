"""KafkaSource end to end on a real (tansu) broker.

Rows carry their id in column 0; with ``produce_rows(..., partitions=3)``
message i goes to partition i % 3 at offset i // 3, so every expected offset
and row set below is computed exactly.
"""
import base64
import json
import logging
import threading
import time

import numpy as np
import pytest
from kafka import KafkaProducer

from streamsvi.io import (BinaryBatchCodec, JsonCodec, KafkaDeadLetterSink, KafkaSource,
                          KafkaUnavailableError, LocalBroker, MemoryDeadLetterSink, RecordValidator,
                          SourceError, produce_rows)
from streamsvi.io.broker import free_port
from tests.conftest_broker import read_topic



def rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([np.arange(n, dtype=float), rng.normal(size=n)])


def ids(batch):
    return batch.x[:, 0].astype(int).tolist()


def drain(src, max_records, max_wait_s=0.5):
    out = []
    while (b := src.poll_batch(max_records, max_wait_s)) is not None:
        out.append(b)
    return out


def all_ids(batches):
    return [i for b in batches for i in ids(b)]


def source(kafka_broker, topic, group, codec=None, **kw):
    return KafkaSource(kafka_broker.bootstrap, topic, group_id=group, codec=codec or JsonCodec(2), **kw)


def test_json_three_partitions_every_row_exactly_once(kafka_broker, new_topic, new_group):
    topic, N = new_topic(3), 300
    X = rows(N)
    assert produce_rows(kafka_broker.bootstrap, topic, X, JsonCodec(2), partitions=3) == N
    with source(kafka_broker, topic, new_group()) as src:
        keys = {(topic, p) for p in range(3)}
        assert src.wait_for_assignment(10) == keys
        assert src.positions() == {k: 0 for k in keys}  # the joining poll consumed nothing
        first = src.poll_batch(64, 2.0)
        assert first.n_rows == 64 and first.n_messages == 64 and first.dead == []
        lag = src.lag()
        assert lag and all(lag[k] == 100 - first.next_offsets.get(k, 0) for k in lag)
        batches = [first] + drain(src, 64)
        assert all(b.n_rows <= 64 for b in batches)
        got = all_ids(batches)
        assert len(got) == N and sorted(got) == list(range(N))
        x = np.concatenate([b.x for b in batches])
        assert np.array_equal(x, X[got])  # values survive the JSON round trip bit for bit
        # next_offsets after each batch = rows delivered so far from that partition.
        seen = np.zeros(3, int)
        for b in batches:
            for i in ids(b):
                seen[i % 3] += 1
            assert b.next_offsets == {(topic, p): int(seen[p]) for (_, p) in b.next_offsets}
            assert set(b.next_offsets) == {(topic, i % 3) for i in ids(b)}
        offsets = {}
        for b in batches:
            offsets.update(b.next_offsets)
        assert offsets == {k: 100 for k in keys}
        assert src.lag() == {k: 0 for k in keys} and src.caught_up()
        assert not src.exhausted()  # a topic is never "drained" for good


def test_binary_minibatches_over_three_partitions(kafka_broker, new_topic, new_group):
    topic, N = new_topic(3), 1000
    X = rows(N, seed=1)
    codec = BinaryBatchCodec(2)
    assert produce_rows(kafka_broker.bootstrap, topic, X, codec, batch_rows=50, partitions=3) == 20
    with source(kafka_broker, topic, new_group(), codec=codec) as src:
        src.wait_for_assignment(10)
        batches = drain(src, 200)
        got = all_ids(batches)
        assert len(got) == N and sorted(got) == list(range(N))
        assert np.array_equal(np.concatenate([b.x for b in batches]), X[got])
        # Messages are never split: batches are whole 50-row messages, at most 200 rows.
        assert all(b.n_rows % 50 == 0 and 0 < b.n_rows <= 200 for b in batches)
        assert sum(b.n_messages for b in batches) == 20
        offsets = {}
        for b in batches:
            offsets.update(b.next_offsets)
        # message m holds rows 50m..50m+49 and sits in partition m % 3 at offset m // 3
        assert offsets == {(topic, 0): 7, (topic, 1): 7, (topic, 2): 6}
        assert src.lag() == {(topic, 0): 0, (topic, 1): 0, (topic, 2): 0}


def test_commit_then_new_consumer_resumes(kafka_broker, new_topic, new_group):
    topic, N, group = new_topic(3), 150, new_group()
    produce_rows(kafka_broker.bootstrap, topic, rows(N), JsonCodec(2), partitions=3)
    first, offsets = [], {}
    with source(kafka_broker, topic, group) as a:
        a.wait_for_assignment(10)
        while len(first) < 70:
            b = a.poll_batch(25, 2.0)
            first += ids(b)
            offsets.update(b.next_offsets)
        assert a.committed() == {}  # auto-commit is off: nothing committed by polling
        a.commit(offsets)
        assert a.committed() == offsets
    keys = [(topic, p) for p in range(3)]
    with source(kafka_broker, topic, group) as b:
        b.wait_for_assignment(10)
        assert b.committed() == offsets
        assert b.positions() == {k: offsets.get(k, 0) for k in keys}
        second = all_ids(drain(b, 40))
    assert set(first).isdisjoint(second)
    assert sorted(first + second) == list(range(N))
    assert sorted(second) == [i for i in range(N) if i // 3 >= offsets.get((topic, i % 3), 0)]


def test_seek_after_and_before_assignment(kafka_broker, new_topic, new_group):
    topic, N = new_topic(3), 90  # 30 messages per partition
    produce_rows(kafka_broker.bootstrap, topic, rows(N), JsonCodec(2), partitions=3)
    target = {(topic, 0): 5, (topic, 1): 29, (topic, 2): 30}
    with source(kafka_broker, topic, new_group()) as src:
        src.wait_for_assignment(10)
        src.seek(target)
        got = all_ids(drain(src, 100))
        assert sorted(got) == [i for i in range(N) if i // 3 >= target[(topic, i % 3)]]
        assert len(got) == 25 + 1 + 0
        src.seek({(topic, 2): 28})  # backwards
        assert sorted(all_ids(drain(src, 100))) == [86, 89]
        with pytest.raises(ValueError, match="integer >= 0"):
            src.seek({(topic, 0): -3})
    with source(kafka_broker, topic, new_group()) as src:
        src.seek({(topic, 1): 10})  # not assigned yet: applied on assignment
        src.wait_for_assignment(10)
        assert src.positions() == {(topic, 0): 0, (topic, 1): 10, (topic, 2): 0}
        got = all_ids(drain(src, 100))
        assert sorted(got) == [i for i in range(N) if i % 3 != 1 or i // 3 >= 10]


def test_bad_records_go_to_dead_letter_topic_never_to_a_batch(kafka_broker, new_topic, new_group):
    topic, dlq = new_topic(2), new_topic(1, prefix="dlq")
    big = b"[4," + b" " * 1_200_000 + b"1]"  # valid JSON, but over the default 1 MiB limit
    messages = [  # (partition, payload, reason or None)
        (0, b"[0, 0.5]", None), (0, b"{oops", "json_invalid"), (0, b"[1, 2, 3]", "wrong_shape"),
        (0, b"[1e300, 1]", "out_of_range"), (0, b"[3, 1]", None),
        (1, b"[NaN, 1]", "non_finite"), (1, b'["a", 1]', "not_numeric"), (1, b"[2, 1.5]", None),
        (1, big, "too_large"), (1, b"[-Infinity, 0]", "non_finite"),
    ]
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, max_request_size=8 << 20)
    expected, payloads, next_off = {}, {}, [0, 0]
    for p, payload, reason in messages:
        producer.send(topic, value=payload, partition=p)
        if reason:
            expected[(p, next_off[p])] = reason
            payloads[(p, next_off[p])] = payload
        next_off[p] += 1
    producer.flush()
    producer.close()

    sink = KafkaDeadLetterSink(kafka_broker.bootstrap, dlq)
    with source(kafka_broker, topic, new_group(),
                validator=RecordValidator(2, max_abs=1e12)) as src:
        src.wait_for_assignment(10)
        batches = drain(src, 4)
        for b in batches:
            sink.send_many(b.dead)
        sink.flush()
    assert sorted(all_ids(batches)) == [0, 2, 3]
    dead = [d for b in batches for d in b.dead]
    assert {(d.position.partition, d.position.offset): d.reason for d in dead} == expected
    assert all(d.position.source == topic and d.row is None for d in dead)
    offsets = {}
    for b in batches:
        offsets.update(b.next_offsets)
    assert offsets == {(topic, 0): 5, (topic, 1): 5}  # dead letters count as consumed
    assert sink.counts == {"json_invalid": 1, "wrong_shape": 1, "out_of_range": 1,
                           "non_finite": 2, "not_numeric": 1, "too_large": 1}
    sink.close()

    records = [json.loads(v) for _, _, v in read_topic(kafka_broker.bootstrap, dlq)]
    assert {(r["partition"], r["offset"]): r["reason"] for r in records} == expected
    assert all(r["source"] == topic and r["message"] for r in records)
    for r in records:
        assert base64.b64decode(r["payload_b64"]) == payloads[(r["partition"], r["offset"])]


def test_binary_bad_row_rejects_only_that_row(kafka_broker, new_topic, new_group):
    topic = new_topic(1)
    codec = BinaryBatchCodec(2)
    five = np.array([[0, 0], [1, 0], [2, np.nan], [3, 0], [4, 1e13]])
    wrong_cols = BinaryBatchCodec(3).encode(np.ones((2, 3)))
    bad_magic = b"XXXX" + codec.encode(np.ones((1, 2)))[4:]
    truncated = codec.encode(np.ones((2, 2)))[:-3]
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    for payload in [codec.encode(five), bad_magic, truncated, wrong_cols,
                    codec.encode(np.array([[5.0, 0], [6.0, 0]]))]:
        producer.send(topic, value=payload, partition=0)
    producer.flush()
    producer.close()
    with source(kafka_broker, topic, new_group(), codec=codec) as src:
        src.wait_for_assignment(10)
        batches = drain(src, 100)
    assert all_ids(batches) == [0, 1, 3, 5, 6]
    dead = [d for b in batches for d in b.dead]
    assert [(d.position.offset, d.row, d.reason) for d in dead] == [
        (0, 2, "non_finite"), (0, 4, "out_of_range"), (1, None, "bad_header"),
        (2, None, "truncated"), (3, None, "wrong_shape")]
    row2 = codec.decode(dead[0].payload)  # a rejected row travels as a one-row message
    assert row2.shape == (1, 2) and row2[0, 0] == 2 and np.isnan(row2[0, 1])
    assert "row 2 of 5" in dead[0].message
    sink = MemoryDeadLetterSink()
    sink.send_many(dead)
    assert sink.records[0]["row"] == 2 and sink.records[2]["row"] is None


def test_pattern_subscription(kafka_broker, new_topic, new_group):
    prefix = new_topic(1, prefix="pat")  # a unique name to build a pattern from
    a, b = f"{prefix}-a", f"{prefix}-b"
    from streamsvi.io import create_topic
    create_topic(kafka_broker.bootstrap, a, 2)
    create_topic(kafka_broker.bootstrap, b, 1)
    X = rows(20)
    produce_rows(kafka_broker.bootstrap, a, X[:10], JsonCodec(2), partitions=2)
    produce_rows(kafka_broker.bootstrap, b, X[10:], JsonCodec(2))
    src = KafkaSource(kafka_broker.bootstrap, pattern=f"^{prefix}-.*", group_id=new_group(),
                      codec=JsonCodec(2))
    with src:
        assert src.wait_for_assignment(10) == {(a, 0), (a, 1), (b, 0)}
        batches = drain(src, 7)
    assert sorted(all_ids(batches)) == list(range(20))


def test_assignment_timeout_then_join_and_empty_poll(kafka_broker, new_topic, new_group):
    topic = new_topic(2)
    with source(kafka_broker, topic, new_group()) as src:
        # tansu takes ~session_timeout/2 = 1 s to complete a join.
        with pytest.raises(SourceError, match=rf"(?s)no partitions of topics \['{topic}'\].*within 0.2 s"):
            src.wait_for_assignment(0.2)
        t0 = time.monotonic()
        assert src.poll_batch(10, 0.05) is None  # still joining: nothing within the wait,
        assert 0.45 <= time.monotonic() - t0 < 1.0  # which is >= JOIN_POLL_S while joining
        assert len(src.wait_for_assignment(10)) == 2
        t0 = time.monotonic()
        assert src.poll_batch(10, 0.3) is None  # empty topic: None after the wait
        assert 0.25 <= time.monotonic() - t0 < 1.5
        # On an empty partition the highwater is known only once a fetch answers,
        # which the broker may hold for fetch_max_wait_ms (500 ms).
        for _ in range(20):
            if len(src.lag()) == 2:
                break
            src.poll_batch(10, 0.1)
        assert src.lag() == {(topic, 0): 0, (topic, 1): 0}
        produce_rows(kafka_broker.bootstrap, topic, rows(3), JsonCodec(2), partitions=2)
        batches = drain(src, 1)
        assert sorted(all_ids(batches)) == [0, 1, 2] and all(b.n_rows == 1 for b in batches)
        assert src.lag() == {(topic, 0): 0, (topic, 1): 0} and src.positions() == {(topic, 0): 2, (topic, 1): 1}
    with pytest.raises(SourceError, match="closed"):
        src.poll_batch(1, 0.0)


def test_unreachable_broker_retries_then_fails_clearly(caplog):
    port = free_port()
    caplog.set_level(logging.WARNING, logger="streamsvi.io")
    t0 = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match=rf"cannot reach Kafka at 127.0.0.1:{port} after 2 attempt"):
        KafkaSource(f"127.0.0.1:{port}", "t", group_id="g", codec=JsonCodec(2),
                    connect_attempts=2, connect_backoff_s=0.05, connect_timeout_s=0.3)
    assert time.monotonic() - t0 < 5
    retries = [r for r in caplog.records if "unavailable (attempt" in r.getMessage()]
    assert len(retries) == 1 and "attempt 1/2" in retries[0].getMessage()


def test_broker_that_comes_up_late_is_reached(caplog, new_group):
    port = free_port()
    started = []
    timer = threading.Timer(1.0, lambda: started.append(LocalBroker(port=port).start()))
    caplog.set_level(logging.WARNING, logger="streamsvi.io")
    timer.start()
    try:
        src = KafkaSource(f"127.0.0.1:{port}", "late", group_id=new_group(), codec=JsonCodec(2),
                          connect_attempts=20, connect_backoff_s=0.1, connect_timeout_s=0.3)
        with src:
            produce_rows(f"127.0.0.1:{port}", "late", rows(5), JsonCodec(2))
            src.wait_for_assignment(10)
            assert sorted(all_ids(drain(src, 10))) == list(range(5))
        assert any("unavailable (attempt" in r.getMessage() for r in caplog.records)
    finally:
        timer.join()
        for b in started:
            b.stop()


@pytest.mark.parametrize("kwargs, match", [
    ({"topics": "t", "pattern": "t.*"}, "exactly one of"),
    ({}, "exactly one of"),
    ({"topics": []}, "non-empty list"),
    ({"topics": "t", "group_id": ""}, "group_id must be"),
    ({"topics": "t", "codec": "json"}, "codec must be"),
    ({"topics": "t", "consumer_config": {"enable_auto_commit": True}}, "enable_auto_commit=True"),
    ({"topics": "t", "auto_offset_reset": "none"}, "auto_offset_reset"),
    ({"topics": "t", "validator": RecordValidator(3)}, "validator expects n_features=3"),
])
def test_settings_errors(kwargs, match):
    args = {"group_id": "g", "codec": JsonCodec(2), **kwargs}
    with pytest.raises(ValueError, match=match):
        KafkaSource("127.0.0.1:1", **args)  # fails before any connection attempt


def test_unknown_consumer_setting_is_rejected_not_ignored():
    from kafka.errors import KafkaConfigurationError
    t0 = time.monotonic()
    with pytest.raises(KafkaConfigurationError, match="max_poll_recordz"):
        KafkaSource(f"127.0.0.1:{free_port()}", "t", group_id="g", codec=JsonCodec(2),
                    consumer_config={"max_poll_recordz": 5})
    assert time.monotonic() - t0 < 1.0  # not a connection problem: no retries


# A second member of the group in its own process: it joins, keeps polling (so it takes part in
# rebalances), and either never commits ("hold") or commits every record it read ("commit").
_MEMBER = r"""
import sys, time, warnings
warnings.filterwarnings("ignore")
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
bootstrap, topic, group, mode = sys.argv[1:5]
c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                  auto_offset_reset="earliest", session_timeout_ms=2000, heartbeat_interval_ms=500)
said = None
while True:
    records = c.poll(timeout_ms=1000)   # shorter polls can keep a kafka-python join from finishing
    if mode == "commit" and records:
        c.commit({tp: OffsetAndMetadata(msgs[-1].offset + 1, "", -1) for tp, msgs in records.items()})
    mine = sorted(tp.partition for tp in c.assignment())
    if mine and mine != said:
        print("assigned", *mine, flush=True)
        said = mine
"""


def _start_member(kafka_broker, topic, group, mode):
    import subprocess
    import sys
    proc = subprocess.Popen([sys.executable, "-c", _MEMBER, kafka_broker.bootstrap, topic, group, mode],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()          # blocks until the member owns partitions
    assert line.startswith("assigned"), line
    return proc


def _read_until(src, applied, done, timeout_s=90.0):
    """Poll ``src`` into ``applied`` until ``done()``; returns the ids read."""
    got, deadline = [], time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"condition not reached; applied {applied}"
        b = src.poll_batch(50, 0.5)
        if b is not None:
            got += ids(b)
            applied.update(b.next_offsets)
    return got


@pytest.mark.parametrize("member", ["dies", "commits"])
def test_drained_means_every_partition_of_the_topic(kafka_broker, new_topic, new_group, member):
    """Issue 16.1: a consumer that owns part of the topic is not drained when its part is.

    Another member holds the rest. If it dies without committing, its partitions
    count as not drained until the group hands them over and they are read here;
    if it lives and commits everything it read, they count as drained.
    """
    topic, group, N = new_topic(3), new_group(), 90
    produce_rows(kafka_broker.bootstrap, topic, rows(N), JsonCodec(2), partitions=3)
    other = _start_member(kafka_broker, topic, group, "hold" if member == "dies" else "commit")
    try:
        with source(kafka_broker, topic, group) as src:
            applied = {}
            # the group splits the topic between the two members; read this one's share
            got = _read_until(src, applied, lambda: 0 < len(src.assignment()) < 3 and src.caught_up())
            mine = {p for _, p in src.assignment()}
            assert {i % 3 for i in got} <= mine        # all of *its* partitions are read ...
            if member == "commits":
                # ... and the other member's records are committed by it once it has read them
                _read_until(src, applied, lambda: src.drained(applied))
                assert {p for _, p in src.assignment()} == mine   # drained without taking them over
                return
            left = src.undrained(applied)               # ... but the topic is not drained
            assert set(left) == {(topic, p) for p in range(3)} - {(topic, p) for p in mine}, left
            assert all("not assigned here" in why for why in left.values())
            assert not src.drained(applied)
            other.kill()                                # kill -9: it stays in the group for a while
            other.wait(10)
            got += _read_until(src, applied, lambda: src.drained(applied))
            assert src.assignment() == {(topic, p) for p in range(3)}
            assert sorted(got) == list(range(N))        # every record read here, exactly once
            assert applied == {(topic, p): N // 3 for p in range(3)}
    finally:
        other.kill()
        other.wait(10)


def test_committed_leaves_out_a_topic_the_metadata_does_not_know_yet(kafka_broker, new_topic, new_group):
    """The daemon's fresh-start check reads the group's committed offsets right after the
    source opens. A subscribed topic the broker has not created yet (tansu creates it when the
    group's consumer first names it) has no offsets to find: committed() leaves it out, where
    partitions() says which topic it does not know (a run on a misspelt topic had ended in
    "no partitions known" instead of "read no record from topic", depending on timing)."""
    topic = new_topic(1)
    produce_rows(kafka_broker.bootstrap, topic, rows(4), JsonCodec(2), partitions=1)
    with source(kafka_broker, topic, new_group()) as src:
        assert src.wait_for_assignment(10) == {(topic, 0)}
        src.commit({(topic, 0): 3})
        missing = f"never-created-{time.monotonic_ns()}"
        src.topics = [topic, missing]              # as if subscribed before the broker made it
        assert src.committed() == {(topic, 0): 3}
        assert src.partitions(strict=False) == {(topic, 0)}
        with pytest.raises(SourceError, match=f"no partitions known for topic '{missing}'"):
            src.partitions()
