"""Fixtures for the I/O tests: the shared local broker (tests/conftest_broker.py)."""
from tests.conftest_broker import kafka_broker, new_group, new_topic  # noqa: F401
