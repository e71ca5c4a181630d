"""A bound on a kafka-python call that can wait forever.

kafka-python 3.0 runs a client's network on an IO thread of its own. A call such as
``KafkaConsumer.poll(timeout_ms=500)`` hands a coroutine to that thread and waits for
it with ``threading.Event.wait()``, which has no timeout: the call returns only when
the coroutine does. Seen with 3.0.12 and the local tansu broker (2026-11), in about
2 of 13 runs of two scale-out workers behind a 25 s broker outage and once in three
runs of eight workers on two cores: a group rejoin's coroutine never finished,
although the poll had asked it to give up after 500 ms; so did a probe consumer's
coordinator lookup and an applier's fetch. The IO thread sat idle, the process
waited for good, and a SIGTERM was recorded but never acted on (the main thread
never got back to the loop that looks for it).

:class:`CallGuard` is a watchdog thread. ``with guard.watch(limit_s):`` marks a call in
progress; if the call is still in progress ``limit_s`` later, the watchdog fails
kafka-python's wait for it (``NetworkSelector._fail_pending_waiters``, the hook
kafka-python itself uses when its IO loop stops) with :class:`StuckCall`, so the call
raises that in the waiting thread. The caller then replaces the client: its IO
thread may still hold the coroutine that never finished. A kafka-python without that
hook (another version) is not guarded; :attr:`CallGuard.armed` says which.

Standard library and kafka-python only; nothing here knows what is being read.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time

log = logging.getLogger("streamsvi.io.sources")


class StuckCall(RuntimeError):
    """A kafka-python call outlived its bound and was abandoned (see the module docs).

    Not a ``KafkaError``: kafka-python's own handlers (which swallow a
    ``KafkaTimeoutError`` inside ``poll``) let it through to the caller.
    """


def _net_of(client):
    """The ``NetworkSelector`` whose IO thread ``client`` waits on (kafka-python 3.0), or None."""
    net = getattr(client, "_net", None)
    return net if callable(getattr(net, "_fail_pending_waiters", None)) else None


class CallGuard:
    """Abandons a call on ``client`` that runs past its limit (module docs).

    One watchdog thread per guard, started with the first :meth:`watch` and
    stopped by :meth:`close`. Only one call is watched at a time (the caller's
    thread is the only one that makes them).
    """

    def __init__(self, client, what: str):
        self._net = _net_of(client)
        self.what = what
        self._cv = threading.Condition()
        self._deadline: float | None = None     # monotonic instant the watched call is abandoned
        self._limit_s = 0.0
        self._fired = False
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def armed(self) -> bool:
        """True if this kafka-python lets a stuck call be abandoned."""
        return self._net is not None

    @contextlib.contextmanager
    def watch(self, limit_s: float):
        """Run the body as the watched call; :class:`StuckCall` if it outlives ``limit_s``."""
        if self._net is None:
            yield
            return
        with self._cv:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=f"streamsvi-guard-{self.what}",
                                                daemon=True)
                self._thread.start()
            self._fired, self._limit_s = False, limit_s
            self._deadline = time.monotonic() + limit_s
            self._cv.notify()
        try:
            yield
        except StuckCall:
            raise
        except BaseException as exc:
            if self._fired:      # kafka-python wrapped our exception: say what happened
                raise StuckCall(self._message()) from exc
            raise
        finally:
            with self._cv:
                self._deadline = None
        if self._fired:          # failed too late to reach the call, which then returned
            self._fired = False

    def _message(self) -> str:
        return (f"{self.what}: a kafka-python call did not return within {self._limit_s:.0f} s "
                f"(its IO thread never finished it); abandoned")

    def _run(self) -> None:
        with self._cv:
            while not self._closed:
                if self._deadline is None:
                    self._cv.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cv.wait(left)
                    continue
                self._deadline, self._fired = None, True
                log.warning("%s", self._message())
                self._net._fail_pending_waiters(StuckCall(self._message()))

    def close(self) -> None:
        """Stop the watchdog thread (a call in progress is no longer watched)."""
        with self._cv:
            self._closed, self._deadline = True, None
            self._cv.notify()

    def close_client(self, client, limit_s: float) -> None:
        """Close the guarded consumer ``client`` without committing, then stop the watchdog. A
        close that outlives ``limit_s`` is abandoned, and one that fails is ignored: the
        process leaves the client and the broker times the member out."""
        try:
            with self.watch(limit_s):
                client.close(autocommit=False)
        except Exception as exc:  # noqa: BLE001 - StuckCall or a failing close: nothing to do
            log.debug("%s: closing: %s: %s", self.what, type(exc).__name__, exc)
        finally:
            self.close()


def close_in_background(consumer, name: str) -> None:
    """Close an abandoned consumer on a daemon thread of its own (its close may wait as its
    stuck call did), ignoring what that raises: the broker times the member out."""
    def close():
        try:
            consumer.close(autocommit=False, timeout_ms=5000)
        except Exception as exc:  # noqa: BLE001 - it was abandoned
            log.debug("closing an abandoned consumer: %s: %s", type(exc).__name__, exc)

    threading.Thread(target=close, daemon=True, name=name).start()


class Guarded:
    """``client`` with every method call under ``guard.watch(limit_s)``.

    A call abandoned as stuck calls ``on_stuck(exc)``, which returns the exception
    to raise instead of :class:`StuckCall` (or None to raise that). Attributes
    that are not callable are passed through unguarded.
    """

    def __init__(self, client, guard: CallGuard, limit_s: float, on_stuck=None):
        self._client, self._guard, self._limit_s, self._on_stuck = client, guard, limit_s, on_stuck

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            try:
                with self._guard.watch(self._limit_s):
                    return attr(*args, **kwargs)
            except StuckCall as exc:
                other = self._on_stuck(exc) if self._on_stuck is not None else None
                if other is None:
                    raise
                raise other from exc

        call.__name__ = name
        return call
