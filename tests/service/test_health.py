"""BrokerHealth (streamsvi/service/health.py) on its own: backoff, once-only warnings, gauges.

No broker: the calls that fail are plain exceptions handed to the object, the clock
is a list the test moves, the metrics are the daemon's in a real CollectorRegistry.
The roles using it are exercised against real brokers by test_broker_health.py,
test_faults.py, test_end_to_end.py and test_scaleout.py.
"""
import logging
import threading
import time

import pytest
from prometheus_client import CollectorRegistry

from streamsvi.service.health import (BROKER_PROBE_S, MAX_CONNECT_BACKOFF_S, MAX_POLL_BACKOFF_S,
                                      BrokerHealth)
from streamsvi.service.metrics import DaemonMetrics

B = "127.0.0.1:9"
LOGGER = "streamsvi.test_health"


class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _health(backoff_s=0.2, **kw):
    registry = CollectorRegistry()
    clock = _Clock()
    h = BrokerHealth(DaemonMetrics(registry), B, backoff_s, role="the test", log=logging.getLogger(LOGGER),
                     clock=clock, **kw)
    value = lambda name: registry.get_sample_value(name)  # noqa: E731
    return h, clock, value


def _lines(caplog, level=logging.WARNING):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_backoff_doubles_from_connect_backoff_to_the_poll_cap_and_starts_over_after_an_answer():
    h, _, _ = _health(0.2)
    assert h.up and h.backoff() == 0.0
    waits = [h.failed(ConnectionError("refused"), "poll") for _ in range(6)]
    assert waits == pytest.approx([0.2, 0.4, 0.8, MAX_POLL_BACKOFF_S, MAX_POLL_BACKOFF_S, MAX_POLL_BACKOFF_S])
    h.answered()
    assert h.up and h.failures == 0
    assert h.failed(TimeoutError("slow")) == pytest.approx(0.2)
    # the default connect_backoff_seconds (1 s) is already at the cap: every wait is 1 s
    h1, _, _ = _health(1.0)
    assert [h1.failed(ConnectionError()) for _ in range(3)] == [MAX_POLL_BACKOFF_S] * 3
    h0, _, _ = _health(0.0)
    assert h0.failed(ConnectionError()) == 0.0
    with pytest.raises(ValueError):
        _health(-1.0)


def test_an_outage_is_one_warning_going_and_one_coming_back_and_the_gauges_follow(caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    h, clock, value = _health(0.2)
    assert value("streamsvi_broker_up") == 0 and value("streamsvi_broker_retries_total") == 0
    h.answered()
    assert value("streamsvi_broker_up") == 1 and _lines(caplog) == []       # up from the start: silent
    for i in range(5):
        h.failed(ConnectionError(f"refused {i}"), "poll")
        clock.t += 0.75
        assert value("streamsvi_broker_up") == 0 and not h.up
    assert value("streamsvi_broker_retries_total") == 5
    warned = _lines(caplog)
    assert len(warned) == 1 and warned[0].startswith(f"brokers {B} do not answer (poll failed: "
                                                     "ConnectionError: refused 0)"), warned
    assert "streamsvi_broker_up is 0" in warned[0] and "the test keeps trying" in warned[0]
    assert len(_lines(caplog, logging.DEBUG)) == 4                            # the rest, quietly
    h.answered()
    h.answered()
    warned = _lines(caplog)
    assert len(warned) == 2 and warned[1] == f"brokers {B} answer again after 3.8 s (5 failed calls)", warned
    assert value("streamsvi_broker_up") == 1 and value("streamsvi_broker_retries_total") == 5
    h.failed(OSError("again"), "offset commit")                            # a second outage: warned again
    h.answered()
    warned = _lines(caplog)
    assert len(warned) == 4 and "offset commit failed" in warned[2] and warned[3].endswith("(1 failed call)")


def test_start_up_attempts_each_warn_count_a_retry_but_the_last_and_wait_up_to_30s(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h, _, value = _health(1.0)
    attempts = 8
    waits = [h.attempt_failed(i, attempts, "KafkaConnectionError: refused") for i in range(1, attempts + 1)]
    assert waits == [1, 2, 4, 8, 16, MAX_CONNECT_BACKOFF_S, MAX_CONNECT_BACKOFF_S, None]
    warned = _lines(caplog)
    assert len(warned) == value("streamsvi_broker_retries_total") == attempts - 1   # test_end_to_end's rule
    assert warned[0] == (f"brokers {B} unavailable (attempt 1/{attempts} failed: KafkaConnectionError: "
                         f"refused); retrying in 1.0 s")
    assert value("streamsvi_broker_up") == 0 and not h.up
    h.answered()                                                            # reached in the end
    assert value("streamsvi_broker_up") == 1 and _lines(caplog)[-1].startswith(f"brokers {B} answer again")


def test_probes_are_made_at_most_every_broker_probe_s_and_report_what_they_find(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    h, clock, value = _health(0.2)
    calls = []

    def refused():
        calls.append(clock.t)
        raise ConnectionRefusedError("refused")

    assert h.probe(refused) is False and calls == [1000.0]
    clock.t += BROKER_PROBE_S - 0.1
    assert not h.due_probe() and h.probe(refused) is None and len(calls) == 1
    clock.t += 0.1
    assert h.probe(refused) is False and len(calls) == 2
    assert value("streamsvi_broker_retries_total") == 2 and value("streamsvi_broker_up") == 0
    assert len(_lines(caplog)) == 1 and "metadata probe failed" in _lines(caplog)[0]
    clock.t += BROKER_PROBE_S
    assert h.probe(lambda: None) is True and h.up and value("streamsvi_broker_up") == 1
    clock.t += BROKER_PROBE_S

    def broken():
        raise ValueError("not a broker error")

    with pytest.raises(ValueError):                 # only `errors` mean the brokers are away
        h.probe(broken)
    assert h.up


def test_wait_ends_at_a_stop_and_otherwise_waits_the_backoff():
    h, _, _ = _health(0.05)
    stop = threading.Event()
    t0 = time.monotonic()
    assert h.wait(stop) is False and time.monotonic() - t0 < 0.05          # up: no wait
    h.failed(ConnectionError())
    t0 = time.monotonic()
    assert h.wait(stop) is False and time.monotonic() - t0 >= 0.04
    stop.set()
    t0 = time.monotonic()
    assert h.wait(stop, 30.0) is True and time.monotonic() - t0 < 1.0


def test_an_error_that_names_its_type_is_not_named_twice(caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)

    class KafkaConnectionError(Exception):
        pass

    h, _, _ = _health()
    h.failed(KafkaConnectionError("KafkaConnectionError: socket disconnected"), "poll")
    h.answered()
    h.failed(TimeoutError(), "poll")
    warned = _lines(caplog)
    assert "(poll failed: KafkaConnectionError: socket disconnected)" in warned[0], warned
    assert "(poll failed: TimeoutError)" in warned[2], warned
