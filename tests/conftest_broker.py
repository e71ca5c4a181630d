"""Reusable Kafka fixtures: one local tansu broker per test session.

Use from any test package's ``conftest.py``::

    from tests.conftest_broker import kafka_broker, new_topic, new_group  # noqa: F401

``kafka_broker`` is session-scoped and stopped at the end of the session;
``new_topic(partitions)`` creates a topic with a unique name; ``new_group()``
gives a unique consumer-group id. Tests are skipped (with the reason) only if
no tansu binary is installed; a broker that is installed but fails to start
fails the tests.
"""
import uuid
import warnings

import pytest

# kafka-python 3.0.12 loads its protocol schemas at import with deprecated
# importlib.resources calls (~200 DeprecationWarnings); import it once quietly.
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="(read_text|open_text) is deprecated",
                            category=DeprecationWarning)
    import kafka  # noqa: F401

from streamsvi.io.broker import BrokerError, LocalBroker, create_topic, find_tansu


@pytest.fixture(scope="session")
def kafka_broker():
    try:
        find_tansu()
    except BrokerError as exc:
        pytest.skip(f"no local Kafka broker: {exc}")
    with LocalBroker() as broker:
        yield broker


@pytest.fixture
def new_topic(kafka_broker):
    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        assert create_topic(kafka_broker.bootstrap, name, partitions=partitions)
        return name
    return make


@pytest.fixture
def new_group():
    return lambda: f"g-{uuid.uuid4().hex[:10]}"


def read_topic(bootstrap: str, topic: str, timeout_s: float = 15.0):
    """Every message of ``topic`` as ``(partition, offset, value)``, read without a group."""
    import time

    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest", max_partition_fetch_bytes=32 << 20)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
        c.assign(tps)
        out, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for tp, msgs in c.poll(timeout_ms=200).items():
                out += [(tp.partition, m.offset, m.value) for m in msgs]
            hw = [c.highwater(tp) for tp in tps]
            if None not in hw and all(c.position(tp) >= h for tp, h in zip(tps, hw)):
                return out
        raise AssertionError(f"could not read {topic} to its end within {timeout_s} s")
    finally:
        c.close()
