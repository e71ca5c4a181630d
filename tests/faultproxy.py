"""A TCP proxy between Kafka clients and a broker that injects faults (issue 30, item 4).

It listens on 127.0.0.1 only and forwards every connection to the broker. The
broker advertises the proxy's address (``LocalBroker(advertised_url=...)``),
so every client, bootstrap and metadata alike, goes through it. Faults:

* ``drop()``: close every connection and refuse new ones (the broker is gone);
* ``pause()``: keep connections open and accept new ones, but forward nothing
  (a silent broker: a process pause, a network partition that drops packets);
* ``delay(seconds)``: forward every chunk ``seconds`` late;
* ``heal()``: forward again.

``with FaultProxy(upstream_port) as proxy:`` starts and stops it; its threads
are daemons and everything is closed on exit.
"""
from __future__ import annotations

import select
import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultProxy:
    def __init__(self, upstream_port: int | None = None, port: int | None = None):
        self.upstream_port = upstream_port
        self.port = port or free_port()
        self.mode = "forward"
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._server = None
        self.dropped = 0

    # ------------------------------------------------------------ control
    def drop(self):
        with self._lock:
            self.mode = "drop"
            conns, self._conns = self._conns, []
        for c in conns:
            _close(c)
        self.dropped += len(conns)

    def pause(self):
        self.mode = "pause"

    def delay(self, seconds: float):
        self.delay_s = float(seconds)
        self.mode = "forward"

    def heal(self):
        self.delay_s = 0.0
        self.mode = "forward"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "FaultProxy":
        self._server = socket.socket()
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", self.port))
        self._server.listen(64)
        threading.Thread(target=self._accept, daemon=True, name="faultproxy-accept").start()
        return self

    def stop(self):
        self._stop.set()
        _close(self._server)
        self.drop()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------ plumbing
    def _accept(self):
        while not self._stop.is_set():
            try:
                r, _, _ = select.select([self._server], [], [], 0.1)
                if not r:
                    continue
                client, _ = self._server.accept()
            except OSError:
                return
            if self.mode == "drop" or self.upstream_port is None:
                _close(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket):
        pending = b""
        try:
            while not self._stop.is_set():
                if self.mode == "pause":       # hold what came; read nothing more
                    time.sleep(0.05)
                    continue
                if pending:
                    if self.delay_s:
                        time.sleep(self.delay_s)
                    dst.sendall(pending)
                    pending = b""
                r, _, _ = select.select([src], [], [], 0.1)
                if not r:
                    continue
                data = src.recv(65536)
                if not data:
                    break
                pending = data
        except (OSError, ValueError):   # (ValueError: the other pump closed src, its fd is -1)
            pass
        finally:
            _close(src)
            _close(dst)


def _close(s):
    if s is None:
        return
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
