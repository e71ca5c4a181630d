"""SIGTERM / SIGINT from the first instant of the ``streamsvi`` process on.

The launcher (:func:`streamsvi.__main__.main`) calls :func:`install_early`
before importing numpy, kafka-python or the daemon, so a signal that comes
while the process is still starting is *recorded* instead of killing it with
-15. The daemon takes the recorded signals over when it installs its own
handlers (:meth:`streamsvi.service.daemon.Daemon.install_signal_handlers`)
and honours them as if they had come a moment later: a clean stop, exit 0.
A second signal before the daemon exists leaves at once (exit 130), as a
second signal to a running daemon does.

Commands other than ``run`` and ``demo`` call :func:`restore_default`: their
signals behave as in any Python program again, and one recorded meanwhile is
re-raised. Standard library only.
"""
from __future__ import annotations

import os
import signal
import threading

from .exitcodes import SECOND_SIGNAL

_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending: list[int] = []
_installed = False


def _record(signum, frame):
    _pending.append(signum)
    if len(_pending) >= 2:
        os.write(2, f"streamsvi: second signal ({signal.Signals(signum).name}) while starting, "
                    "exiting\n".encode())
        os._exit(SECOND_SIGNAL)


def install_early() -> None:
    """Record SIGTERM / SIGINT from now on (call first thing in the process)."""
    global _installed
    for s in _SIGNALS:
        signal.signal(s, _record)
    _installed = True


def stop_requested() -> bool:
    """True if a signal was recorded before anyone took it over."""
    return bool(_pending)


def take_pending() -> list[int]:
    """The recorded signals, forgotten here: the caller now owns them."""
    out = list(_pending)
    _pending.clear()
    return out


def restore_default() -> None:
    """Default SIGTERM / SIGINT behaviour again; a signal recorded meanwhile is re-raised."""
    global _installed
    if not _installed:
        return
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _installed = False
    got = take_pending()
    if got:
        signal.raise_signal(got[0])


class StopOnSignals:
    """A stop flag that SIGTERM / SIGINT set: the daemon's and the applier's.

    Call :meth:`_init_stop` in ``__init__``. The first signal requests a clean
    stop (``stop_reason`` names it); a second one leaves at once, without
    checkpoint or commit (exit 130).
    """

    def _init_stop(self) -> None:
        self._stop = threading.Event()
        self._stop_reason = ""
        self._signals = 0

    @property
    def stop_reason(self) -> str:
        """Why a stop was requested (``"SIGTERM"``, ...); empty while none was."""
        return self._stop_reason if self._stop.is_set() else ""

    def request_stop(self, reason="requested"):
        self._stop_reason = reason
        self._stop.set()

    def _on_signal(self, signum, frame):
        self._signals += 1
        if self._signals >= 2:
            # second signal: leave at once, without checkpoint or commit
            os.write(2, f"streamsvi: second signal ({signal.Signals(signum).name}), exiting without commit\n".encode())
            os._exit(SECOND_SIGNAL)
        self.request_stop(signal.Signals(signum).name)

    def install_signal_handlers(self):
        """SIGTERM / SIGINT set the stop flag from now on; a signal the process recorded
        before this object existed (:func:`install_early`) is honoured the same way."""
        for s in _SIGNALS:
            signal.signal(s, self._on_signal)
        for signum in take_pending():
            self._on_signal(signum, None)
