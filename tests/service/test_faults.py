"""Broker faults injected between the daemon and the broker (issue 30, item 4).

A :class:`tests.faultproxy.FaultProxy` on 127.0.0.1 sits between every client
and a private broker, which advertises the proxy's address. The daemon runs
in-process against a real broker; faults are a 25 s outage (connections
dropped and refused) while it is busy, and a 25 s silent broker (connections
held, nothing forwarded) while it is idle. Afterwards every record is applied
exactly once (records seen = records produced, snapshot offsets = highwater
marks, nothing dead-lettered), and consumption resumes within 3 s of the
broker's return (before the fix the poll backoff doubled up to 30 s and
kafka-python's reconnect backoff too: it came back 7–24 s late).
"""
import io
import os
import signal
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec
from streamsvi.io.broker import LocalBroker, create_topic
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon
from streamsvi.service.roles.transport import init_delta
from tests.faultproxy import FaultProxy, free_port

from .conftest import blob_rows, gmm_config, highwater_marks, produce_raw, snapshot_offsets

OUTAGE_S = 25.0
RECOVERY_S = 3.0


@pytest.fixture
def proxied():
    """(proxy, broker): a private broker reached only through the proxy."""
    proxy = FaultProxy(port=free_port())
    broker = LocalBroker(advertised_url=f"tcp://127.0.0.1:{proxy.port}").start()
    proxy.upstream_port = broker.port
    proxy.start()
    try:
        yield proxy, broker
    finally:
        proxy.stop()
        broker.stop()


def _wait(cond, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def _start(cfg, registry, **run):
    daemon = Daemon(cfg, registry=registry, out=io.StringIO())
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("res", daemon.run(**run)), daemon=True)
    t.start()
    return daemon, t, out


def _consumed(registry):
    return registry.get_sample_value("streamsvi_records_consumed_total") or 0.0


def _config(tmp_path, bootstrap, topic):
    return validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group="g-faults",
                               inference={"batch_size": 100, "max_wait_seconds": 0.2},
                               source={"connect_attempts": 100},
                               checkpoint={"every_batches": 10}, metrics={"heldout_size": 0}))


class _Producer(threading.Thread):
    """Writes 100 rows every 50 ms through the proxy until stopped (kafka-python retries
    what the outage holds up); ``sent`` counts the acknowledged messages."""

    def __init__(self, bootstrap, topic):
        super().__init__(daemon=True)
        from kafka import KafkaProducer

        self.topic, self.stop_event, self.sent, self.failed = topic, threading.Event(), 0, 0
        self.producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                      reconnect_backoff_max_ms=1000, retries=1_000_000,
                                      delivery_timeout_ms=120_000, request_timeout_ms=5_000)
        self.codec, self.seed = JsonCodec(2), 10

    def _ok(self, _):
        self.sent += 1

    def _err(self, _):
        self.failed += 1

    def run(self):
        while not self.stop_event.is_set():
            self.seed += 1
            for row in blob_rows(100, seed=self.seed):
                self.producer.send(self.topic, self.codec.encode(row), partition=0) \
                    .add_callback(self._ok).add_errback(self._err)
            time.sleep(0.05)
        self.producer.flush(120)
        self.producer.close(10)


def test_a_25s_outage_while_busy_loses_and_doubles_nothing_and_recovers_within_3s(proxied, tmp_path):
    proxy, broker = proxied
    bootstrap, topic = f"127.0.0.1:{proxy.port}", "busy"
    assert create_topic(bootstrap, topic, partitions=1)
    cfg = _config(tmp_path, bootstrap, topic)
    registry = CollectorRegistry()
    producer = _Producer(bootstrap, topic)
    producer.start()
    daemon, thread, out = _start(cfg, registry, timeout=300)
    _wait(lambda: _consumed(registry) >= 3_000, 60, "the daemon to be busy")
    proxy.drop()
    time.sleep(OUTAGE_S)
    at_return = _consumed(registry)
    proxy.heal()
    t0 = time.monotonic()
    t1 = _wait(lambda: _consumed(registry) > at_return, 60, "consumption to resume")
    time.sleep(3)
    producer.stop_event.set()
    producer.join(180)
    assert producer.failed == 0
    hw = highwater_marks(bootstrap, topic, 1)[(topic, 0)]
    assert hw >= producer.sent > at_return
    _wait(lambda: _consumed(registry) >= hw, 120, "the daemon to read the whole log")
    daemon.request_stop("test")
    thread.join(120)
    res = out["res"]
    assert res.dead == 0
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.records_seen == hw == _consumed(registry)   # every record in the log, once
    assert snapshot_offsets(snap) == {(topic, 0): hw}
    assert registry.get_sample_value("streamsvi_broker_retries_total") >= 1
    print(f"busy outage: consumption resumed {t1 - t0:.2f} s after the return")
    assert t1 - t0 <= RECOVERY_S, f"consumption resumed {t1 - t0:.1f} s after the broker returned"


def test_a_silent_broker_while_idle_recovers_within_3s_and_applies_everything_once(proxied, tmp_path):
    proxy, broker = proxied
    bootstrap, topic = f"127.0.0.1:{proxy.port}", "idle"
    assert create_topic(bootstrap, topic, partitions=1)
    codec = JsonCodec(2)
    produce_raw(bootstrap, topic, [codec.encode(r) for r in blob_rows(500, seed=2)], partitions=1)
    cfg = _config(tmp_path, bootstrap, topic)
    registry = CollectorRegistry()
    daemon, thread, out = _start(cfg, registry, timeout=240)
    _wait(lambda: _consumed(registry) >= 500, 60, "the first 500 records")
    proxy.pause()
    time.sleep(OUTAGE_S)
    proxy.heal()
    t0 = time.monotonic()
    produce_raw(bootstrap, topic, [codec.encode(r) for r in blob_rows(500, seed=3)], partitions=1)
    t_produced = time.monotonic()
    t1 = _wait(lambda: _consumed(registry) >= 1000, 60, "the 500 records produced after the return")
    daemon.request_stop("test")
    thread.join(60)
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert out["res"].dead == 0 and snap.state.records_seen == 1000
    assert snapshot_offsets(snap) == {(topic, 0): 1000}
    print(f"silent broker: consumed {t1 - t_produced:.2f} s after producing ({t_produced - t0:.2f} s after the return)")
    assert t1 - t_produced <= RECOVERY_S, (f"records produced {t_produced - t0:.1f} s after the return "
                                          f"were consumed {t1 - t_produced:.1f} s later")


def test_the_applier_rides_out_an_outage_and_applies_what_comes_after(proxied, tmp_path):
    """The applier ended with a KafkaConnectionError traceback when the brokers went away
    (found by the scale-out outage run): now it waits, says so once, and goes on."""
    from .test_scaleout import _applier_setup, _delta, _metric, _produce_deltas

    proxy, broker = proxied
    bootstrap = f"127.0.0.1:{proxy.port}"
    assert create_topic(bootstrap, "deltas", partitions=1)
    cfg, engine, state0, X = _applier_setup(tmp_path, bootstrap, "deltas", "g-applier-faults")
    init = init_delta("w", engine, state0)
    _produce_deltas(bootstrap, "deltas", [init.encode(), _delta(engine, state0, X, 0, 50).encode()])
    registry = CollectorRegistry()
    from streamsvi.service.roles.applier import Applier

    applier = Applier(cfg, registry=registry, out=open("/dev/null", "w"))
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("res", applier.run(timeout=240)), daemon=True)
    t.start()
    _wait(lambda: (_metric(registry, "streamsvi_records_consumed_total") or 0) >= 50, 60, "the first delta")
    proxy.drop()
    _wait(lambda: _metric(registry, "streamsvi_broker_up") == 0, 60, "the applier to notice the outage")
    time.sleep(5)
    proxy.heal()
    _produce_deltas(bootstrap, "deltas", [_delta(engine, state0, X, 50, 100).encode()])
    _wait(lambda: (_metric(registry, "streamsvi_records_consumed_total") or 0) >= 100, 60, "the delta after")
    assert t.is_alive(), "the applier stopped"
    applier.request_stop("test")
    t.join(60)
    assert out["res"].deltas == 2 and _metric(registry, "streamsvi_broker_up") == 1
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.records_seen == 100 and snap.extra["scaleout"]["applied"] == {"data/0": [[0, 100]]}


def test_scaleout_workers_and_applier_ride_out_a_25s_outage_exactly_once(proxied, tmp_path, daemons):
    """Two workers and an applier (subprocesses) behind the proxy; a 25 s outage while busy.
    Every record is applied once (the applier's ranges are the highwater marks, records_seen
    the count produced, no overlapping or gapped delta) and the workers finish
    ``--until-drained``. ``STREAMSVI_FAULT_RECORDS`` and ``STREAMSVI_FAULT_DELAY_S`` (when,
    after a fifth is applied, the outage starts) vary the run."""
    from streamsvi.io import produce_rows

    from .test_scaleout import _check_exactly_once, _configs, _lambda
    from .test_scaleout import _wait as _wait_procs

    proxy, broker = proxied
    bootstrap, n, parts = f"127.0.0.1:{proxy.port}", int(os.environ.get("STREAMSVI_FAULT_RECORDS", 20000)), 2
    assert create_topic(bootstrap, "data", partitions=parts)
    assert create_topic(bootstrap, "deltas", partitions=1)
    produce_rows(bootstrap, "data", blob_rows(n, seed=3), JsonCodec(2), partitions=parts)
    hw = highwater_marks(bootstrap, "data", parts)
    cfgs, ck = _configs(tmp_path, bootstrap, "data", "deltas", "g-scaleout-faults", 2, n)
    a = daemons(cfgs["applier"], "--role", "applier", tag="a")
    _wait_procs(lambda: "applier: active" in a.stderr(), "the applier", 60, procs=[a])
    ws = [daemons(cfgs[f"w{i}"], "--role", "worker", "--until-drained", tag=f"w{i}") for i in range(2)]
    procs = [a, *ws]
    _wait_procs(lambda: (s := _lambda(ck)) is not None and s.records_seen >= n // 5, "n/5 records", procs=procs)
    time.sleep(float(os.environ.get("STREAMSVI_FAULT_DELAY_S", 0)))    # where in the cycle it hits
    proxy.drop()
    time.sleep(OUTAGE_S)
    proxy.heal()
    for w in ws:
        assert w.wait(300) == 0, w.stderr()[-4000:]
    _wait_procs(lambda: (s := _lambda(ck)) is not None and s.records_seen >= n, "every record applied",
                120, procs=[a])
    a.signal(signal.SIGTERM)
    assert a.wait(60) == 0, a.stderr()[-3000:]
    assert "overlaps ranges already applied" not in a.stderr() and "starts past" not in a.stderr()
    _check_exactly_once(ck, "data", hw, n, partitions=parts)


def test_a_worker_transaction_held_up_by_a_silent_broker_is_settled_consistently(proxied, tmp_path,
                                                                                monkeypatch, caplog):
    """kafka-python waits for ``send_offsets_to_transaction`` / ``commit_transaction`` without a
    bound: after a 25 s outage a worker hung there for good (py-spy: the main thread in
    ``TransactionalRequestResult.wait``). Now a request held up longer than
    ``TRANSACTION_WAIT_S`` is settled: a new producer under the same transactional id
    (``init_transactions`` completes or aborts the old transaction), then the group's committed
    offsets decide, and the delta and the offsets agree: both committed, or neither and the
    batch read again."""
    from prometheus_client import CollectorRegistry

    from streamsvi.io import produce_rows
    from streamsvi.service import commit as commit_mod
    from streamsvi.service.roles.worker import Worker, worker_source

    from .conftest import committed_offsets
    from .test_scaleout import _wait as _wait_for

    proxy, broker = proxied
    bootstrap = f"127.0.0.1:{proxy.port}"
    assert create_topic(bootstrap, "data", partitions=1) and create_topic(bootstrap, "deltas", partitions=1)
    produce_rows(bootstrap, "data", blob_rows(100, seed=1), JsonCodec(2), partitions=1)
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic="data", group="g-txn", name="ck",
                     inference={"n_total": 100, "batch_size": 50, "max_wait_seconds": 1.0})
    raw["scaleout"] = {"deltas_topic": "deltas", "worker_id": "w-silent"}
    cfg = validate(raw)
    monkeypatch.setattr(commit_mod, "TRANSACTION_WAIT_S", 2.0)
    worker = Worker(cfg, registry=CollectorRegistry(), out=open("/dev/null", "w"))
    source = worker_source(cfg, worker.metrics)
    try:
        worker.commit.open_producer()
        source.wait_for_assignment(timeout_s=30)
        batch = _wait_for(lambda: (b := source.poll_batch(50, max_wait_s=1.0)) is not None and
                          b.next_offsets and b, "a batch", 30)
        worker._batch_ranges = worker._ranges(batch)
        worker._pending = (None, 0)
        proxy.pause()                                       # the broker goes silent mid-transaction
        done = threading.Event()
        with caplog.at_level("WARNING", logger="streamsvi.worker"):
            t = threading.Thread(target=lambda: (worker._advance(batch, source), worker.commit.commit_open(source),
                                                 done.set()), daemon=True)
            t.start()
            _wait(lambda: "did not complete" in caplog.text, 30, "the worker to give up waiting")
            proxy.heal()
            assert done.wait(90), "the worker's transaction was never settled"
        settled = "committed after all" in caplog.text
        assert settled or "not committed; reading the batch again" in caplog.text, caplog.text
        committed = committed_offsets(bootstrap, "g-txn", "data", 1)
        first, end = batch.first_offsets[("data", 0)], batch.next_offsets[("data", 0)]
        if settled:
            assert committed == {("data", 0): end} and worker.deltas_sent == 1
        else:
            assert committed.get(("data", 0), first) == first and worker.deltas_sent == 0
            again = _wait_for(lambda: (b := source.poll_batch(50, max_wait_s=1.0)) is not None and
                              b.next_offsets and b, "the batch again", 60)
            assert again.first_offsets == batch.first_offsets
    finally:
        proxy.heal()
        source.close()
        worker.commit.close_producer()
