"""Client-side read_committed (streamsvi.io.committed): on the real broker, and as a property."""
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from streamsvi.io.committed import CommittedFilter, TxnRecord, install


def _read(bootstrap, topic, until, timeout_s=30.0):
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level="read_committed")
    assert install(c)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, 0)
    f, got, items = CommittedFilter(), [], []
    deadline = time.monotonic() + timeout_s
    while until not in got and time.monotonic() < deadline:
        polled = [m for ms in c.poll(timeout_ms=200).values() for m in ms]
        items += polled
        got += [m.value for m in f.feed(sorted(polled, key=lambda m: m.offset))]
    c.close()
    return got, items, f


def _transactions(bootstrap, topic):
    """A producer that wrote c1 (committed), a1 a2 (aborted), c2 (committed) to ``topic``."""
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"a-{topic}")
    p.init_transactions()
    for values, commit in (([b"c1"], True), ([b"a1", b"a2"], False), ([b"c2"], True)):
        p.begin_transaction()
        for v in values:
            p.send(topic, v, partition=0)
        p.flush()
        p.commit_transaction() if commit else p.abort_transaction()
    return p


def test_the_local_broker_shows_aborted_transactions_to_read_committed_readers(kafka_broker, new_topic):
    """Why the applier and the lambda-topic readers filter aborted transactions themselves
    (docs/design.md §6.7): tansu 0.6.0 lists no aborted transactions in its fetch responses, so
    a read_committed consumer of kafka-python returns their records, which Kafka hides. If this
    starts to fail, the local broker filters them too."""
    from kafka import KafkaConsumer, TopicPartition

    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    _transactions(bootstrap, topic).close()
    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed", group_id=None,
                      enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, 0)
    got = []
    deadline = time.monotonic() + 30
    while b"c2" not in got and time.monotonic() < deadline:
        got += [r.value for recs in c.poll(timeout_ms=200).values() for r in recs]
    c.close()
    assert got == [b"c1", b"a1", b"a2", b"c2"], got


def test_aborted_and_fenced_transactions_are_dropped_on_the_real_broker(kafka_broker, new_topic):
    from kafka import KafkaProducer

    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    p = _transactions(bootstrap, topic)
    p.begin_transaction()
    p.send(topic, b"killed", partition=0)        # sent, then the process dies: never ended
    p.flush()
    plain = KafkaProducer(bootstrap_servers=bootstrap)
    plain.send(topic, b"plain", partition=0)     # behind the open transaction
    plain.flush()
    plain.close()
    again = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"a-{topic}")
    again.init_transactions()                    # fences the dead one: its transaction is aborted
    again.begin_transaction()
    again.send(topic, b"c3", partition=0)
    again.commit_transaction()
    again.close()
    p.close(timeout=0)
    got, items, f = _read(bootstrap, topic, b"c3")
    assert got == [b"c1", b"c2", b"plain", b"c3"]
    assert f.aborted_records == 3
    markers = [(m.marker, m.producer_id) for m in items if m.marker]
    assert [k for k, _ in markers] == ["commit", "abort", "commit", "abort", "commit"]
    assert len({pid for _, pid in markers}) == 1            # one transactional id, one producer id


@st.composite
def _logs(draw):
    """A partition's log: transactions of up to 3 producers interleaved, each ended by a commit
    or abort marker or left open, and plain records; with the expected released values."""
    n = draw(st.integers(0, 40))
    log, open_ = [], {}
    for _ in range(n):
        pid = draw(st.integers(-1, 2))
        if pid == -1:
            log.append(("plain", None))
        elif pid in open_ and draw(st.booleans()):
            log.append((draw(st.sampled_from(["commit", "abort"])), pid))
            del open_[pid]
        else:
            log.append(("data", pid))
            open_[pid] = True
    return log


def _expected(log):
    fate, pending = {}, {}
    for i, (kind, pid) in enumerate(log):
        if kind == "data":
            pending.setdefault(pid, []).append(i)
        elif kind in ("commit", "abort"):
            for j in pending.pop(pid, []):
                fate[j] = kind == "commit"
    out = []
    for i, (kind, pid) in enumerate(log):
        if kind == "plain" or (kind == "data" and fate.get(i)):
            out.append(i)
        elif kind == "data" and i not in fate:
            break                                # still open: nothing after it is released
    return out


@settings(max_examples=300, deadline=None)
@given(_logs(), st.lists(st.integers(1, 6), min_size=1, max_size=10))
def test_releases_what_a_kafka_read_committed_reader_returns(log, cuts):
    items = [TxnRecord(i, i, -1 if kind == "plain" else pid, kind != "plain",
                       kind if kind in ("commit", "abort") else None) for i, (kind, pid) in enumerate(log)]
    f, got, pos, k = CommittedFilter(), [], 0, 0
    while pos < len(items):                     # in polls of any size, some records fetched twice
        step = cuts[k % len(cuts)]
        k += 1
        got += [r.value for r in f.feed(items[max(0, pos - 1):pos + step])]
        pos += step
    assert got == _expected(log)
    assert len(got) == len(set(got))
