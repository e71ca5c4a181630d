"""Broker health: one object per role that knows whether the brokers answer.

:class:`BrokerHealth` owns everything a role (the daemon, a scale-out worker,
the applier) used to keep about the brokers at a dozen places:

* the state: up, or down since when and after how many failed calls;
* the gauge ``streamsvi_broker_up`` (1 after a call that was answered, 0 while
  failing) and the counter ``streamsvi_broker_retries_total`` (one per failed
  call that is retried);
* the log lines: one WARNING when the brokers stop answering ("brokers B do
  not answer (...)") and one when they answer again ("brokers B answer again
  after S s (N failed calls)"), whatever call noticed it; the failures in
  between are logged at DEBUG;
* the waits: mid-run, ``source.connect_backoff_seconds`` doubling with each
  consecutive failure up to :data:`MAX_POLL_BACKOFF_S`; at start-up, each
  failed connection attempt is logged ("brokers B unavailable (attempt i/n
  failed: ...)") and the wait doubles up to :data:`MAX_CONNECT_BACKOFF_S`;
* the probe cadence: an idle daemon asks for metadata at most every
  :data:`BROKER_PROBE_S` (:meth:`BrokerHealth.due_probe`), since kafka-python's
  polls return empty rather than raise while the brokers are gone.

The callers catch the broker's exceptions (``daemon._transient_errors``) and
report them with :meth:`BrokerHealth.failed`; what answered with
:meth:`BrokerHealth.answered`. Standard library only (the metrics are passed in).
"""
from __future__ import annotations

import logging
import threading
import time

#: How long one attempt to reach the brokers at start may take (kafka-python reconnects by
#: itself within an attempt); after it the daemon counts a retry, logs a warning and backs off
#: (:meth:`BrokerHealth.attempt_failed`). The daemon's and the worker's sources use it, and so
#: does ``streamsvi run``'s early group join, whose consumer the daemon's source takes over
#: only if their settings agree (``streamsvi.service.daemon.CONNECT_TIMEOUT_S`` is this).
CONNECT_TIMEOUT_S = 10.0
#: Largest wait between connection attempts at start (``source.connect_backoff_seconds``
#: doubles up to it).
MAX_CONNECT_BACKOFF_S = 30.0
#: Largest wait between polls while the brokers are away mid-run. A poll is cheap and
#: kafka-python reconnects by itself (``reconnect_backoff_max_ms`` 1 s), so a short cap brings
#: consumption back within about a second of the brokers' return (it doubled up to 30 s).
MAX_POLL_BACKOFF_S = 1.0
#: While no records arrive, the daemon asks the brokers for metadata at most this often
#: (``KafkaSource.check_brokers``), so ``streamsvi_broker_up`` goes to 0 within
#: ``inference.max_wait_seconds`` + this + one probe request (refused at once, or at most
#: ``KafkaSource.PROBE_TIMEOUT_MS`` when the brokers are silent) after they disappear.
BROKER_PROBE_S = 2.0


class BrokerHealth:
    """Whether the brokers answer, the waits while they do not, and the metrics and log lines
    that say so (module docs).

    Parameters
    ----------
    metrics : DaemonMetrics
        Its ``broker_up`` gauge and ``broker_retries`` counter are set here and nowhere else.
    bootstrap : str
        The brokers, as the log lines name them (``source.bootstrap_servers``).
    backoff_s : float
        The first wait after a failure (``source.connect_backoff_seconds``); it doubles with
        each consecutive failure up to ``max_backoff_s``.
    role : str
        Who is waiting, for the log line ("the daemon", "the applier", "worker w1").
    log : logging.Logger
        The role's logger (tests look for the lines on it).
    max_backoff_s, probe_s : float
        :data:`MAX_POLL_BACKOFF_S` and :data:`BROKER_PROBE_S` by default.
    errors : tuple
        What :meth:`probe` counts as the brokers not answering (the roles pass
        ``daemon._transient_errors()``; kafka-python is not imported here).
    clock : callable
        Monotonic seconds (``time.monotonic``).
    """

    def __init__(self, metrics, bootstrap: str, backoff_s: float, *, role: str = "the daemon",
                 log: logging.Logger | None = None, max_backoff_s: float = MAX_POLL_BACKOFF_S,
                 probe_s: float = BROKER_PROBE_S, errors: tuple = (ConnectionError, TimeoutError),
                 clock=time.monotonic):
        if backoff_s < 0:
            raise ValueError(f"backoff_s must be >= 0, got {backoff_s!r}")
        self.metrics = metrics
        self.bootstrap = bootstrap
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.probe_s = float(probe_s)
        self.role = role
        self.log = log if log is not None else logging.getLogger("streamsvi.health")
        self.errors = tuple(errors)
        self.clock = clock
        self.down_since: float | None = None    # clock time of the first failure of this outage
        self.failures = 0                       # consecutive failed calls (0 while up)
        self._last_probe: float | None = None   # clock time of the last probe (due_probe)

    # ----------------------------------------------------------- state
    @property
    def up(self) -> bool:
        """False from the first failed call until something answers."""
        return self.down_since is None

    def backoff(self, cap: float | None = None) -> float:
        """The wait after the current run of failures: ``backoff_s · 2^(failures−1)``, at most
        ``cap`` (``max_backoff_s``); 0 while up."""
        if not self.failures:
            return 0.0
        cap = self.max_backoff_s if cap is None else cap
        return min(self.backoff_s * 2.0 ** min(self.failures - 1, 64), cap)

    # --------------------------------------------------------- reports
    def failed(self, exc: BaseException, what: str = "a call") -> float:
        """A broker call (``what``: "poll", "metadata probe", ...) raised ``exc``: the gauge goes
        to 0, a retry is counted, the first failure of an outage is logged as a WARNING (later
        ones at DEBUG). Returns the wait before the next try (:meth:`backoff`); waiting is the
        caller's choice (:meth:`wait`)."""
        self._fail()
        self.metrics.broker_retries.inc()
        delay = self.backoff()
        if self.failures == 1:
            self.log.warning("brokers %s do not answer (%s failed: %s); streamsvi_broker_up is 0 "
                             "until they do, %s keeps trying", self.bootstrap, what, _describe(exc),
                             self.role)
        else:
            self.log.debug("brokers %s still do not answer (%s failed, %d in a row: %s)", self.bootstrap,
                           what, self.failures, _describe(exc))
        return delay

    def attempt_failed(self, attempt: int, attempts: int, why: str) -> float | None:
        """Connection attempt ``attempt`` of ``attempts`` at start failed (``why``: the error as
        one line). The gauge goes to 0; unless it was the last attempt a retry is counted, the
        attempt is logged ("brokers B unavailable (attempt i/n failed: ...); retrying in d s",
        every attempt: nothing was ever up) and the wait returned (doubling up to
        :data:`MAX_CONNECT_BACKOFF_S`). None after the last attempt (the caller raises)."""
        self._fail()
        if attempt >= attempts:
            return None
        self.metrics.broker_retries.inc()
        delay = self.backoff(MAX_CONNECT_BACKOFF_S)
        self.log.warning("brokers %s unavailable (attempt %d/%d failed: %s); retrying in %.1f s",
                         self.bootstrap, attempt, attempts, why, delay)
        return delay

    def answered(self) -> None:
        """A broker call succeeded (records, metadata, a commit, a new connection): the gauge
        goes to 1; after an outage, logs how long it lasted."""
        if self.down_since is not None:
            self.log.warning("brokers %s answer again after %.1f s (%d failed call%s)", self.bootstrap,
                             self.clock() - self.down_since, self.failures, "s" * (self.failures != 1))
        self.down_since, self.failures = None, 0
        self.metrics.broker_up.set(1)

    def _fail(self) -> None:
        if self.down_since is None:
            self.down_since = self.clock()
        self.failures += 1
        self.metrics.broker_up.set(0)

    # ----------------------------------------------------- waits, probes
    def wait(self, stop: threading.Event, delay: float | None = None) -> bool:
        """Wait ``delay`` (the current :meth:`backoff` by default) or until ``stop`` is set;
        True if it was."""
        return stop.wait(self.backoff() if delay is None else delay)

    def due_probe(self) -> bool:
        """True (and the probe counted as made now) if none was made in the last ``probe_s``."""
        now = self.clock()
        if self._last_probe is not None and now - self._last_probe < self.probe_s:
            return False
        self._last_probe = now
        return True

    def probe(self, check) -> bool | None:
        """Call ``check()`` (a metadata request) if a probe is due and report the outcome: True
        if it answered, False if it raised one of ``errors``, None if no probe was due. Other
        exceptions propagate."""
        if not self.due_probe():
            return None
        try:
            check()
        except self.errors as exc:
            self.failed(exc, "metadata probe")
            return False
        self.answered()
        return True


def _describe(exc: BaseException) -> str:
    """``Type: message``, without the type twice (kafka-python's messages start with it)."""
    text, name = str(exc), type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name
