"""A consumer poll that never returns (kafka-python 3.0.12: a group rejoin whose coroutine
never finishes) is abandoned and the consumer replaced, losing and repeating nothing
(``streamsvi.io.callguard``). Real local broker; the fault is injected by making
the consumer's next group join a coroutine that waits on a future nobody resolves, which is
what the hung workers' IO threads showed."""
from __future__ import annotations

import threading
import time

import numpy as np

from streamsvi.io import JsonCodec, KafkaSource, produce_rows
from streamsvi.io.callguard import CallGuard


def _wedge_next_join(consumer) -> threading.Event:
    """Make ``consumer``'s next group (re)join wait for good; the event is set when it starts."""
    from kafka.future import Future

    entered = threading.Event()

    async def never(timeout_ms=None):
        entered.set()
        await Future()              # nobody resolves it, whatever timeout_ms says

    consumer._coordinator.ensure_active_group_async = never
    return entered


def _read(src, want: int, deadline_s: float) -> list[int]:
    got, end = [], time.monotonic() + deadline_s
    while len(got) < want and time.monotonic() < end:
        b = src.poll_batch(40, 1.0)
        if b is not None:
            got += b.x[:, 0].astype(int).tolist()
    return got


def test_a_poll_stuck_in_a_rejoin_is_abandoned_and_reading_goes_on_exactly_once(kafka_broker, new_topic,
                                                                             new_group):
    topic, n = new_topic(3), 300
    rng = np.random.default_rng(0)
    X = np.column_stack([np.arange(n, dtype=float), rng.normal(size=n)])
    assert produce_rows(kafka_broker.bootstrap, topic, X, JsonCodec(2), partitions=3) == n
    replaced = []
    src = KafkaSource(kafka_broker.bootstrap, topic, group_id=new_group(), codec=JsonCodec(2),
                      on_reopen=lambda: replaced.append(time.monotonic()))
    src.STUCK_POLL_S = 3.0
    assert src._guard.armed, "this kafka-python lacks the hook a stuck call is abandoned with"
    assert src.wait_for_assignment(10)
    first = _read(src, 100, 30)
    assert len(first) >= 100
    old = src.consumer
    entered = _wedge_next_join(old)
    old._coordinator.request_rejoin()
    t0, out = time.monotonic(), {}
    # without the guard the read waits forever in the rejoin: in a thread, so the test fails
    reader = threading.Thread(target=lambda: out.setdefault("rest", _read(src, n - len(first), 90)),
                              daemon=True)
    reader.start()
    reader.join(120)
    assert not reader.is_alive(), "a poll never returned and was never abandoned"
    rest = out["rest"]
    assert entered.is_set(), "the injected fault was never reached"
    assert src.consumer is not old and src.reopens == 1 and len(replaced) == 1
    # abandoned after its 1 s poll + STUCK_POLL_S, not later (a generous bound: the point is
    # that it ends)
    assert replaced[0] - t0 < 1.0 + src.STUCK_POLL_S + 10
    src.close()
    got = first + rest
    assert sorted(got) == list(range(n)), (len(got), len(set(got)))   # none lost, none twice


def test_a_stuck_probe_call_is_a_source_error_and_the_next_call_uses_a_new_probe(kafka_broker, new_topic,
                                                                                 new_group):
    """The worker's drain check hung for good in the probe's coordinator lookup after a
    broker outage (``highwater_marks`` → ``probe.poll`` → ``ensure_coordinator_ready``)."""
    from kafka.future import Future

    from streamsvi.io.sources import SourceError

    topic, group = new_topic(2), new_group()
    assert produce_rows(kafka_broker.bootstrap, topic, np.zeros((10, 2)), JsonCodec(2), partitions=2) == 10
    src = KafkaSource(kafka_broker.bootstrap, topic, group_id=group, codec=JsonCodec(2))
    src.STUCK_POLL_S = 2.0
    keys = {(topic, 0), (topic, 1)}
    assert src.highwater_marks(keys) == {(topic, 0): 5, (topic, 1): 5}
    probe = src._probe_consumer()
    entered = threading.Event()

    async def never(timeout_ms=None):
        entered.set()
        await Future()

    probe._client._coordinator.ensure_coordinator_ready_async = never
    out = {}

    def ask():
        try:
            out["got"] = src.committed(keys)
        except SourceError as exc:
            out["error"] = exc

    asker = threading.Thread(target=ask, daemon=True)
    t0 = time.monotonic()
    asker.start()
    asker.join(60)
    assert not asker.is_alive(), "a probe call never returned and was never abandoned"
    assert entered.is_set() and "probe consumer" in str(out.get("error")), out
    assert time.monotonic() - t0 < src.PROBE_TIMEOUT_MS / 1000 + src.STUCK_POLL_S + 10
    assert src._probe_consumer() is not probe          # replaced
    assert src.committed(keys) == {} and src.highwater_marks(keys) == {(topic, 0): 5, (topic, 1): 5}
    src.close()


def test_a_consumer_without_the_hook_is_not_guarded_and_calls_run_as_they_are():
    guard = CallGuard(object(), "plain")
    assert not guard.armed
    with guard.watch(0.0):           # no watchdog: a zero limit changes nothing
        time.sleep(0.01)
    guard.close()
