"""What the ``streamsvi`` commands say on the console: one logging set-up, quiet by default.

Each event is said once. An event the console prints itself (a resume, the
last checkpoint of a run) is logged at DEBUG, not INFO (:func:`said_on_console`),
and counts are printed in the right number (:func:`plural`).

By default streamsvi's own log is shown from INFO up (``demo``: WARNING) and
kafka-python's from WARNING up, so a clean run prints streamsvi's lines only;
``--log-level LEVEL`` shows both from LEVEL up (``--log-level INFO`` brings
kafka-python's INFO lines back).

Three kinds of kafka-python records are logged below the level kafka-python
gives them, because nothing went wrong or because streamsvi reports the same
event itself:

* **a client closing.** kafka-python 3.0.x closes a client's sockets from the
  caller's thread while its IO thread may still be reading or awaiting a
  metadata answer; the IO thread then logs ``Metadata refresh: failed
  Cancelled`` (or ``... Transport closed for writes``), ``<...Transport [...]
  (closed)>: Error receiving network data`` (or ``socket disconnected``),
  ``Unhandled exception in task`` (the transport's read task on the closed
  socket, or ``RuntimeError: Task is already done!`` for a task the closing
  thread finished first) or ``Error closing coroutine for cancelled task`` at
  ERROR. A
  ``Cancelled`` error is what a connection closed *without* an error gives
  its requests, and the transport says it was closed: these are logged at
  DEBUG.
* **a slow IO step that was waiting for the GIL.** kafka-python warns
  ``Task ... ran for 0.241s (>0.100s threshold). It is blocking the event
  loop`` by wall-clock time, which includes the time its IO thread waits for
  the GIL while the model updates: logged at INFO.
* **the same complaint again.** While brokers are away kafka-python repeats
  the same warning or error (``Metadata refresh: failed KafkaConnectionError:
  socket disconnected``, about 70 times in a 25 s outage) while streamsvi
  itself says once that the brokers are away and once that they are back:
  a kafka-python message at WARNING or above that was shown in the last
  :data:`REPEAT_WINDOW_S` seconds (same logger, same text) goes to DEBUG.
* **connection attempts streamsvi makes itself** (inside :func:`quiet_kafka`,
  e.g. the daemon's start-up attempts): kafka-python's warnings and errors
  about them go to INFO; streamsvi logs one warning per failed attempt and
  one error at the end, naming the last of kafka-python's messages.

Standard library only (kafka-python's error classes are matched by name).
"""
from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time

#: Accepted ``--log-level`` values.
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: kafka-python's loggers (``kafka.net.manager``, ``kafka.cluster``, ...) hang under this one.
KAFKA_LOGGER = "kafka"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: kafka-python 3.0.x's texts of two close races (``kafka/net/transport.py``, ``selector.py``).
_CLOSED_FOR_WRITES = "Transport closed for writes"
_CANCELLED_TASK = "Error closing coroutine for cancelled task"
#: ... a task the closing thread finished while the IO thread was about to run it
#: (``selector.py``: ``Task.__call__`` on a done task, logged as an unhandled exception) ...
_TASK_DONE = "Task is already done!"
#: ... and of its slow-task warning (``selector.py``).
_SLOW_TASK = "It is blocking the event loop"

_quiet = 0
_quiet_lock = threading.Lock()
#: A kafka-python warning or error shown is not shown again for this long (module doc).
REPEAT_WINDOW_S = 60.0


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
    errors = [a for a in args if isinstance(a, BaseException)] + ([exc] if exc is not None else [])
    if any(_is_cancelled(e) for e in errors):
        return True
    # a write the IO thread still tried on a transport the caller had just closed
    if any(isinstance(e, RuntimeError) and str(e) in (_CLOSED_FOR_WRITES, _TASK_DONE) for e in errors):
        return True
    # a coroutine of a task cancelled by the close that did not end quietly
    if record.msg == _CANCELLED_TASK:
        return True
    # about a transport that had been closed before the message (its is_closing() says so):
    # an exception on it, "socket disconnected" from a read on the closed socket, or an
    # exception raised inside one of its methods (its read task registering the closed socket)
    if any(_closed_transport(a) for a in args):
        return True
    tb = record.exc_info[2] if record.exc_info else None
    while tb is not None:
        if _closed_transport(tb.tb_frame.f_locals.get("self")):
            return True
        tb = tb.tb_next
    return False


def _closed_transport(obj) -> bool:
    is_closing = getattr(obj, "is_closing", None)
    try:
        return callable(is_closing) and is_closing() is True
    except Exception:
        return False


class KafkaNoiseFilter(logging.Filter):
    """Handler filter: lowers the records the module doc names, then applies ``kafka_level``."""

    def __init__(self, kafka_level: int, clock=time.monotonic):
        super().__init__()
        self.kafka_level = kafka_level
        self._clock = clock
        self._shown: dict[tuple[str, str], float] = {}    # (logger, text) -> when shown
        self.repeats = 0                                   # messages lowered as repeats

    def _repeat(self, record) -> bool:
        """True if the same kafka-python message was shown within :data:`REPEAT_WINDOW_S`."""
        try:
            key = (record.name, re.sub(r"^<[^>]*>: ", "", record.getMessage()))
        except Exception:          # a record that cannot format itself: judge it by its template
            key = (record.name, str(record.msg))
        now = self._clock()
        last = self._shown.get(key)
        if last is not None and now - last < REPEAT_WINDOW_S:
            self.repeats += 1
            return True
        if len(self._shown) > 1000:
            self._shown.clear()
        self._shown[key] = now
        return False

    def filter(self, record):
        if not _is_kafka(record):
            return True
        level = record.levelno
        if is_close_race(record):
            level = logging.DEBUG
        elif level == logging.WARNING and _SLOW_TASK in str(record.msg):
            level = logging.INFO
        elif _quiet and level >= logging.WARNING:
            level = logging.INFO
        elif level >= logging.WARNING and level >= self.kafka_level and self._repeat(record):
            level = logging.DEBUG
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


class _Problems(logging.Handler):
    """kafka-python's distinct warning / error messages, oldest first (at most ``keep``)."""

    def __init__(self, keep: int = 20):
        super().__init__(logging.WARNING)
        self.messages: list[tuple[int, str]] = []
        self.keep = keep

    def emit(self, record):
        if is_close_race(record):
            return
        try:
            msg = re.sub(r"^<[^>]*>: ", "", record.getMessage())   # "<KafkaConnection ...>: " prefix
        except Exception:           # a record that cannot format itself is not worth a crash
            return
        item = (record.levelno, msg)
        if item in self.messages:
            self.messages.remove(item)
        self.messages = (self.messages + [item])[-self.keep:]

    def last(self, besides: str = "") -> str | None:
        """The latest error (else warning) that says something ``besides`` does not."""
        for want in (logging.ERROR, logging.WARNING):
            for level, msg in reversed(self.messages):
                if level >= want and not (besides and (msg in besides or besides in msg)):
                    return msg
        return None


def plural(n: int, word: str, many: str | None = None) -> str:
    """``n`` and ``word`` in the number ``n`` asks for: "1 checkpoint", "0 checkpoints".

    Parameters
    ----------
    n : int
        The count.
    word : str
        The singular form.
    many : str, optional
        The plural form, where it is not ``word + "s"`` ("batches", "had errors").

    Examples
    --------
    >>> plural(1, "checkpoint"), plural(3, "checkpoint"), plural(0, "batch", "batches")
    ('1 checkpoint', '3 checkpoints', '0 batches')
    """
    return f"{n} {word if n == 1 else (many if many is not None else word + 's')}"


class _SaidOnConsole(logging.Filter):
    """Logger filter: an INFO record becomes DEBUG (dropped unless the logger shows DEBUG)."""

    def filter(self, record):
        if record.levelno != logging.INFO:
            return True
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


@contextlib.contextmanager
def said_on_console(logger: str):
    """Inside the block, ``logger``'s INFO records are logged at DEBUG: the console prints
    the same event itself (e.g. ``checkpoint: PATH (step S, N records)`` at the end of a run,
    which ``streamsvi.checkpoint`` also logs), and an event is said once.

    Only records logged on ``logger`` itself are lowered (a logger filter), from any
    thread while the block runs; warnings and errors are untouched.
    """
    lg = logging.getLogger(logger)
    f = _SaidOnConsole()
    lg.addFilter(f)
    try:
        yield
    finally:
        lg.removeFilter(f)


@contextlib.contextmanager
def quiet_kafka():
    """While streamsvi connects by itself: kafka-python's warnings and errors go to INFO.

    Yields an object whose ``last(besides)`` is kafka-python's latest warning
    or error inside the block that ``besides`` does not already say (e.g.
    ``Connection failed: KafkaConnectionError: 111 ECONNREFUSED``), for
    streamsvi's own message; None if there was none.
    """
    global _quiet
    seen = _Problems()
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
