"""An applier whose consumer poll never returns (kafka-python 3.0.12: seen in a fetch and in a
group rejoin after a broker outage) replaces its consumer and goes on applying every delta
once (``streamsvi.io.callguard``). In process, on the real broker; the fault is injected by
making the consumer's next group rejoin a coroutine that waits on a future nobody resolves.
The source's own recovery is tested in ``tests/io/test_stuck_poll.py``."""
import threading
import time

from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.service.roles.transport import init_delta
from tests.io.test_stuck_poll import _wedge_next_join

from .test_scaleout import _apply, _applier_setup, _delta, _metric, _produce_deltas, _wait


def test_an_applier_whose_poll_never_returns_replaces_its_consumer_and_applies_each_delta_once(
        kafka_broker, new_topic, new_group, tmp_path, monkeypatch):
    from streamsvi.service.roles import applier as applier_mod

    monkeypatch.setattr(applier_mod, "STUCK_POLL_S", 3.0)
    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    cfg, engine, state0, X = _applier_setup(tmp_path, bootstrap, deltas, new_group())
    d1, d2, d3 = (_delta(engine, state0, X, a, a + 50) for a in (0, 50, 100))
    _produce_deltas(bootstrap, deltas, [init_delta("w", engine, state0).encode(), d1.encode(), d2.encode()])
    registry = CollectorRegistry()
    applier = applier_mod.Applier(cfg, registry=registry, out=open("/dev/null", "w"))
    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("res", applier.run(max_deltas=3, timeout=120)),
                              daemon=True)      # (were it stuck for good, the test fails, not hangs)
    thread.start()
    applied = lambda: _metric(registry, "streamsvi_deltas_applied_total", worker="w") or 0.0  # noqa: E731
    _wait(lambda: applied() >= 2, "the first two deltas applied", 60)
    old = applier._consumer
    entered = _wedge_next_join(old)
    old._coordinator.request_rejoin()
    _wait(entered.is_set, "the applier's poll to reach the injected fault", 30)
    _produce_deltas(bootstrap, deltas, [d1.encode(), d3.encode()])     # d1 again: a duplicate
    thread.join(90)
    assert not thread.is_alive(), "the applier never got past the poll that did not return"
    res = out["res"]
    assert applier._consumer is not old
    assert _metric(registry, "streamsvi_consumers_replaced_total") == 1.0
    assert res.takeovers == 2                # handed over and taken back with the new consumer
    assert (res.deltas, res.records) == (3, 150), res
    assert _metric(registry, "streamsvi_deltas_skipped_total", reason="duplicate") == 1.0
    expected = state0
    for d in (d1, d2, d3):                   # each once, in order: bit for bit
        expected, _ = _apply(engine, expected, d)
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.records_seen == 150 and snap.state.lam.array_equal(expected.lam)
