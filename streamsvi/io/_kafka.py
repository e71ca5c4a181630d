"""Small kafka-python helpers shared by the source, the dead-letter sink and the producer.

Kept private: the public surface is in :mod:`streamsvi.io.sources`,
:mod:`streamsvi.io.deadletter` and :mod:`streamsvi.io.produce`.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

log = logging.getLogger("streamsvi.io")

T = TypeVar("T")


class KafkaUnavailableError(ConnectionError):
    """Kafka could not be reached after every configured attempt."""


#: Settings streamsvi adds that older kafka-python versions lack (2.x has no
#: ``bootstrap_timeout_ms``); dropped there. Anything else unknown, e.g. a typo
#: in a user's ``consumer_config``, is left for kafka-python to reject.
OPTIONAL_SETTINGS = ("bootstrap_timeout_ms",)


def client_config(cls, config: dict) -> dict:
    """``config`` minus the :data:`OPTIONAL_SETTINGS` this kafka-python version does not know."""
    known = getattr(cls, "DEFAULT_CONFIG", None) or {}
    return {k: v for k, v in config.items() if k not in OPTIONAL_SETTINGS or k in known}


def retriable_errors() -> tuple[type[BaseException], ...]:
    from kafka import errors as E
    return tuple(c for c in (getattr(E, "NoBrokersAvailable", None),
                             getattr(E, "KafkaTimeoutError", None),
                             getattr(E, "KafkaConnectionError", None)) if c is not None)


def connect_with_retry(factory: Callable[[], T], *, what: str, bootstrap_servers,
                       attempts: int, backoff_s: float, max_backoff_s: float = 10.0) -> T:
    """Call ``factory()`` until it stops failing with a connection error.

    Waits ``backoff_s``, ``2 backoff_s``, ... (at most ``max_backoff_s``)
    between attempts and logs each retry at WARNING.

    Raises
    ------
    KafkaUnavailableError
        After ``attempts`` failures, naming the servers and the last error.
    """
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"connect_attempts must be an integer >= 1, got {attempts!r}")
    if not backoff_s >= 0:
        raise ValueError(f"connect_backoff_s must be >= 0, got {backoff_s!r}")
    errors = retriable_errors()
    t0 = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            return factory()
        except errors as exc:
            if attempt == attempts:
                raise KafkaUnavailableError(
                    f"{what}: cannot reach Kafka at {bootstrap_servers} after {attempts} "
                    f"attempt(s) over {time.monotonic() - t0:.1f} s (last error: {exc}); check "
                    f"bootstrap_servers and that the brokers are running") from exc
            delay = min(backoff_s * 2 ** (attempt - 1), max_backoff_s)
            log.warning("%s: Kafka at %s unavailable (attempt %d/%d: %s); retrying in %.2f s",
                        what, bootstrap_servers, attempt, attempts, exc, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


def offset_and_metadata(offset: int):
    """``OffsetAndMetadata(offset, "", -1)`` (3.x) or ``(offset, "")`` (2.0.x)."""
    from kafka.structs import OffsetAndMetadata
    if len(OffsetAndMetadata._fields) >= 3:
        return OffsetAndMetadata(int(offset), "", -1)
    return OffsetAndMetadata(int(offset), "")
