"""What the ``streamsvi`` commands log on stderr: one logging set-up, quiet by default.

By default streamsvi's own log is shown from INFO up (``demo``: WARNING) and
kafka-python's from WARNING up, so a clean run prints streamsvi's lines only;
``--log-level LEVEL`` shows both from LEVEL up (``--log-level INFO`` brings
kafka-python's INFO lines back).

Two kinds of kafka-python records are logged below the level kafka-python
gives them, because nothing went wrong or because streamsvi reports the same
event itself:

* **a client closing.** kafka-python 3.0.x closes a client's sockets from the
  caller's thread while its IO thread may still be reading or awaiting a
  metadata answer; the IO thread then logs ``Metadata refresh: failed
  Cancelled`` or ``<...Transport [...] (closed)>: Error receiving network
  data`` at ERROR. A ``Cancelled`` error is what a connection closed *without*
  an error gives its requests, and the transport says it was closed: these
  are logged at DEBUG.
* **connection attempts streamsvi makes itself** (inside :func:`quiet_kafka`,
  e.g. the daemon's start-up attempts): kafka-python's warnings and errors
  about them go to INFO; streamsvi logs one warning per failed attempt and
  one error at the end, naming the last of kafka-python's messages.

Standard library only (kafka-python's error classes are matched by name).
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading

#: Accepted ``--log-level`` values.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: kafka-python's loggers (``kafka.net.manager``, ``kafka.cluster``, ...) hang under this one.
KAFKA_LOGGER = "kafka"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_quiet = 0
_quiet_lock = threading.Lock()


def _is_kafka(record) -> bool:
    return record.name == KAFKA_LOGGER or record.name.startswith(KAFKA_LOGGER + ".")


def _is_cancelled(obj) -> bool:
    return any(c.__name__ == "Cancelled" and c.__module__.startswith("kafka")
               for c in type(obj).__mro__)


def is_close_race(record: logging.LogRecord) -> bool:
    """A kafka-python record of a client being closed, not of a failure (see the module doc)."""
    if not _is_kafka(record):
        return False
    args = record.args if isinstance(record.args, tuple) else (record.args,)
    exc = record.exc_info[1] if record.exc_info else None
    if any(_is_cancelled(a) for a in args) or (exc is not None and _is_cancelled(exc)):
        return True
    # an exception on a transport that had been closed already (its is_closing() says so)
    return exc is not None and any(callable(getattr(a, "is_closing", None)) and a.is_closing()
                                   for a in args)


class KafkaNoiseFilter(logging.Filter):
    """Handler filter: lowers the records the module doc names, then applies ``kafka_level``."""

    def __init__(self, kafka_level: int):
        super().__init__()
        self.kafka_level = kafka_level

    def filter(self, record):
        if not _is_kafka(record):
            return True
        level = record.levelno
        if is_close_race(record):
            level = logging.DEBUG
        elif _quiet and level >= logging.WARNING:
            level = logging.INFO
        if level != record.levelno:
            record.levelno, record.levelname = level, logging.getLevelName(level)
        return level >= self.kafka_level


def setup_logging(level: str | None = None, *, default_own: str = "INFO", stream=None) -> logging.Handler:
    """Log to ``stream`` (stderr): streamsvi at ``level`` or ``default_own``, kafka-python at
    ``level`` or WARNING. Replaces any handler on the root logger; returns the new one."""
    if level is not None and level not in LEVELS:
        raise ValueError(f"--log-level must be one of {', '.join(LEVELS)}, got {level!r}")
    own = getattr(logging, level or default_own)
    kafka_level = getattr(logging, level or "WARNING")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(KafkaNoiseFilter(kafka_level))
    logging.basicConfig(level=own, handlers=[handler], force=True)
    logging.getLogger(KAFKA_LOGGER).setLevel(kafka_level)
    return handler


class _LastProblem(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.message = None

    def emit(self, record):
        if not is_close_race(record):
            try:
                self.message = record.getMessage()
            except Exception:       # a record that cannot format itself is not worth a crash
                pass


@contextlib.contextmanager
def quiet_kafka():
    """While streamsvi connects by itself: kafka-python's warnings and errors go to INFO.

    Yields an object whose ``message`` is kafka-python's last warning or
    error inside the block (e.g. ``Connection failed: KafkaConnectionError:
    111 ECONNREFUSED``), for streamsvi's own message; None if there was none.
    """
    global _quiet
    seen = _LastProblem()
    kafka = logging.getLogger(KAFKA_LOGGER)
    kafka.addHandler(seen)
    with _quiet_lock:
        _quiet += 1
    try:
        yield seen
    finally:
        with _quiet_lock:
            _quiet -= 1
        kafka.removeHandler(seen)
