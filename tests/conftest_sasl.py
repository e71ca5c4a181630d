"""A real SASL Kafka endpoint for tests: a SASL-terminating proxy in front of a local tansu broker.

tansu 0.6.0 cannot complete a SASL login (``--authentication`` offers only
SCRAM, and its memory storage has no way to store a SCRAM user), and no other
broker can be installed here (no Java Kafka, no Docker). So SASL is
terminated by :class:`SaslProxy`, the SASL counterpart of the stunnel of
tests/conftest_tls.py: a TCP proxy on loopback that speaks the broker side of
Kafka's SASL protocol and, once a client has logged in, relays its bytes to a
plain tansu listener untouched. The broker *advertises* the proxy's port (or
stunnel's, for SASL_SSL), so every connection a client opens after the
bootstrap logs in too.

Per client connection the proxy reads Kafka request frames (4-byte big-endian
size, then request header: api_key int16, api_version int16, correlation_id
int32, client_id nullable string, then tagged fields in flexible versions):

* ApiVersions (18): relayed to tansu; its answer must list SaslHandshake (17)
  and SaslAuthenticate (36). tansu 0.6.0's does (0-1 and 0-2); if one were
  missing the proxy adds it, so clients take the KIP-152 path.
* SaslHandshake (17), v1: answered by the proxy (error 0 and its mechanisms,
  or UNSUPPORTED_SASL_MECHANISM (33) and the connection closed).
* SaslAuthenticate (36), v0-v2: answered by the proxy, the server side of
  PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677).
  Wrong credentials: SASL_AUTHENTICATION_FAILED (58) with a message, then the
  connection is closed, as Kafka does.
* Anything else before a successful login: the connection is closed (a
  broker that requires SASL refuses it).

Responses are encoded with kafka-python's message classes at the version the
client asked for (flexible versions: compact types, tagged fields, response
header v1). Successful logins are counted per (mechanism, user, client_id), so
a test can tell that each kind of client really logged in.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import struct
import subprocess
import threading
from collections import Counter
from pathlib import Path

from streamsvi.io.broker import BrokerError, LocalBroker, free_port, stop_process

from tests.conftest import require_tool
from tests.conftest_tls import start_stunnel

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, SASL_AUTHENTICATION_FAILED = 33, 34, 58

#: hashlib names of the SCRAM mechanisms (RFC 5802 with SHA-256, RFC 7677; SHA-512 as Kafka has it).
SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = ("PLAIN", *SCRAM_HASHES)


class SaslFailure(Exception):
    """A login that must be refused; the message goes to the client (SaslAuthenticate error_message)."""


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(sock: socket.socket) -> bytes | None:
    """One Kafka frame's payload (without its 4-byte size), or None at end of stream."""
    head = _recv_exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    if not 0 <= size <= 100 << 20:
        raise ConnectionError(f"bad Kafka frame size {size}")
    return _recv_exactly(sock, size)


def request_header(payload: bytes) -> tuple[int, int, int, str | None]:
    """(api_key, api_version, correlation_id, client_id) of a request frame's payload.

    client_id is a nullable int16-length string in request header v1 and v2
    alike (Kafka never made it compact), so it is read the same way for every API.
    """
    api_key, api_version, correlation_id, n = struct.unpack_from(">hhih", payload)
    client_id = None if n < 0 else payload[10:10 + n].decode("utf-8", "replace")
    return api_key, api_version, correlation_id, client_id


# ------------------------------------------------------------------ SASL servers
class PlainServer:
    """RFC 4616: one message ``[authzid] NUL authcid NUL passwd``; an empty answer on success."""

    def __init__(self, users: dict[str, str]):
        self.users, self.user, self.done = users, None, False

    def step(self, message: bytes) -> bytes:
        parts = message.split(b"\0")
        if len(parts) != 3:
            raise SaslFailure("PLAIN: malformed message (expected authzid NUL user NUL password)")
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        self.user = user
        expected = self.users.get(user)
        if expected is None or not hmac.compare_digest(password.encode(), expected.encode()):
            raise SaslFailure(f"Authentication failed: Invalid username or password (PLAIN, user {user!r})")
        if authzid and authzid != user:
            raise SaslFailure(f"Authentication failed: user {user!r} may not act as {authzid!r}")
        self.done = True
        return b""


def _scram_unescape(name: str) -> str:
    """RFC 5802 saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``."""
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str) -> dict[str, str]:
    out = {}
    for item in message.split(","):
        key, sep, value = item.partition("=")
        if not sep or len(key) != 1:
            raise SaslFailure(f"SCRAM: malformed attribute {item!r}")
        out[key] = value
    return out


class ScramServer:
    """The server side of RFC 5802 (SCRAM-SHA-256 per RFC 7677, SCRAM-SHA-512 alike), no channel binding.

    client-first ``n,,n=user,r=cnonce`` → server-first ``r=cnonce+snonce,s=salt,i=iterations``
    → client-final ``c=biws,r=nonce,p=proof`` → server-final ``v=ServerSignature``, where::

        SaltedPassword  = Hi(password, salt, i)            (PBKDF2 with HMAC-H)
        ClientKey       = HMAC(SaltedPassword, "Client Key")
        StoredKey       = H(ClientKey)
        AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
        ClientSignature = HMAC(StoredKey, AuthMessage)
        ClientProof     = ClientKey XOR ClientSignature    (checked: H(proof XOR signature) == StoredKey)
        ServerSignature = HMAC(HMAC(SaltedPassword, "Server Key"), AuthMessage)

    ``salt`` and ``server_nonce`` are random unless given (RFC 7677's example gives them).
    """

    def __init__(self, mechanism: str, users: dict[str, str], iterations: int = 4096,
                 salt: bytes | None = None, server_nonce: str | None = None):
        self.mechanism, self.hash = mechanism, SCRAM_HASHES[mechanism]
        self.users, self.iterations = users, iterations
        self._salt, self._server_nonce = salt, server_nonce
        self.user, self.done, self._state = None, False, "first"

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()

    def step(self, message: bytes) -> bytes:
        text = message.decode("utf-8", "replace")
        if self._state == "first":
            return self._first(text)
        if self._state == "final":
            return self._final(text)
        raise SaslFailure(f"{self.mechanism}: unexpected message after the exchange")

    def _first(self, text: str) -> bytes:
        # gs2-header: "n" (no channel binding) or "y", an optional "a=authzid", then client-first-bare
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag not in ("n", "y") or (authzid and not authzid.startswith("a=")):
            raise SaslFailure(f"{self.mechanism}: unsupported or malformed GS2 header {text[:20]!r}")
        attrs = _attributes(bare)
        if "m" in attrs or "n" not in attrs or not attrs.get("r"):
            raise SaslFailure(f"{self.mechanism}: malformed client-first message")
        self.user = _scram_unescape(attrs["n"])
        if authzid and _scram_unescape(authzid[2:]) != self.user:
            raise SaslFailure(f"Authentication failed: user {self.user!r} may not act as {authzid[2:]!r}")
        password = self.users.get(self.user)
        # an unknown user still gets a server-first message (with a made-up salt): the failure
        # shows at the proof, so a client cannot tell unknown users from wrong passwords
        salt = self._salt or os.urandom(16)
        salted = hashlib.pbkdf2_hmac(self.hash, (password or os.urandom(16).hex()).encode(), salt,
                                     self.iterations)
        self._known = password is not None
        self._stored_key = hashlib.new(self.hash, self._hmac(salted, b"Client Key")).digest()
        self._server_key = self._hmac(salted, b"Server Key")
        self._gs2_header = text[:len(text) - len(bare)]
        self._nonce = attrs["r"] + (self._server_nonce or base64.b64encode(os.urandom(18)).decode())
        server_first = f"r={self._nonce},s={base64.b64encode(salt).decode()},i={self.iterations}"
        self._auth_message = bare + "," + server_first
        self._state = "final"
        return server_first.encode()

    def _final(self, text: str) -> bytes:
        without_proof, sep, proof = text.rpartition(",p=")
        if not sep:
            raise SaslFailure(f"{self.mechanism}: client-final message without a proof")
        attrs = _attributes(without_proof)
        if attrs.get("c") != base64.b64encode(self._gs2_header.encode()).decode():
            raise SaslFailure(f"{self.mechanism}: channel binding does not match the GS2 header")
        if attrs.get("r") != self._nonce:
            raise SaslFailure(f"{self.mechanism}: nonce does not match")
        auth_message = (self._auth_message + "," + without_proof).encode()
        signature = self._hmac(self._stored_key, auth_message)
        try:
            client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof, validate=True), signature,
                                                     strict=True))
        except ValueError:
            client_key = b""
        self._state = "done"
        if not (self._known and hmac.compare_digest(hashlib.new(self.hash, client_key).digest(),
                                                    self._stored_key)):
            raise SaslFailure(f"Authentication failed during authentication due to invalid credentials "
                              f"with SASL mechanism {self.mechanism}")
        self.done = True
        return b"v=" + base64.b64encode(self._hmac(self._server_key, auth_message))


# ------------------------------------------------------------------ the proxy
class SaslProxy:
    """A SASL-terminating Kafka proxy on 127.0.0.1 (see the module docstring).

    Parameters
    ----------
    users : dict
        user name → password, for every mechanism.
    mechanisms : sequence of str
        The mechanisms SaslHandshake offers (default: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).

    Attributes
    ----------
    port : int
        The listening port (bound at construction, so it can be advertised before tansu starts).
    logins : Counter
        Successful logins by ``(mechanism, user, client_id)``.
    failures : Counter
        Refused logins by ``(mechanism, user)`` (user None when the message had none).
    refused : int
        Connections closed because a request other than ApiVersions / SASL came before a login.
    """

    def __init__(self, users: dict[str, str], mechanisms=MECHANISMS):
        self.users, self.mechanisms = dict(users), list(mechanisms)
        self.logins: Counter = Counter()
        self.failures: Counter = Counter()
        self.refused = 0
        self.upstream: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def authenticated_clients(self, mechanism: str, user: str) -> set[str]:
        """The client ids that logged in with ``mechanism`` as ``user``."""
        with self._lock:
            return {c for (m, u, c) in self.logins if (m, u) == (mechanism, user)}

    # -- lifecycle
    def start(self, upstream: str) -> "SaslProxy":
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self._spawn(self._accept_loop)
        return self

    def stop(self) -> None:
        self._stopping = True
        self._close(self._listener)
        with self._lock:
            socks, threads = list(self._socks), list(self._threads)
        for s in socks:
            self._close(s)
        for t in threads:
            t.join(timeout=5)

    def _spawn(self, target, *args) -> None:
        t = threading.Thread(target=target, args=args, daemon=True, name=f"sasl-proxy-{self.port}")
        with self._lock:
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._socks.add(sock)
        if self._stopping:
            self._close(sock)
        return sock

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.discard(sock)
        try:
            sock.shutdown(socket.SHUT_RDWR)      # wakes a thread blocked in recv on it
        except OSError:
            pass
        sock.close()

    def _accept_loop(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return                            # closed by stop()
            self._spawn(self._serve, self._track(client))

    # -- one client connection
    def _serve(self, client: socket.socket) -> None:
        upstream = None
        try:
            upstream = self._track(socket.create_connection(self.upstream, timeout=10))
            upstream.settimeout(None)
            if self._authenticate(client, upstream):
                self._spawn(self._pump, upstream, client)
                self._pump(client, upstream)
        except OSError:
            pass
        finally:
            self._close(client)
            if upstream is not None:
                self._close(upstream)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy bytes until either side closes, then close both."""
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src)
            self._close(dst)

    def _authenticate(self, client: socket.socket, upstream: socket.socket) -> bool:
        """Serve ApiVersions / SaslHandshake / SaslAuthenticate until a login succeeds (True) or the
        connection must close (False)."""
        server, mechanism = None, None
        while (payload := read_frame(client)) is not None:
            api_key, version, correlation_id, client_id = request_header(payload)
            if api_key == API_VERSIONS:
                upstream.sendall(struct.pack(">i", len(payload)) + payload)
                answer = read_frame(upstream)
                if answer is None:
                    return False
                client.sendall(self._with_sasl_apis(answer, version))
            elif api_key == SASL_HANDSHAKE and server is None:
                from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

                if version < 1:                  # v0 would carry raw SASL frames next: not served here
                    return False
                mechanism = SaslHandshakeRequest.decode(payload, version=version, header=True).mechanism
                ok = mechanism in self.mechanisms
                self._reply(client, SaslHandshakeResponse(
                    version=version, error_code=0 if ok else UNSUPPORTED_SASL_MECHANISM,
                    mechanisms=self.mechanisms), correlation_id)
                if not ok:
                    with self._lock:
                        self.failures[(mechanism, None)] += 1
                    return False
                server = PlainServer(self.users) if mechanism == "PLAIN" else ScramServer(mechanism, self.users)
            elif api_key == SASL_AUTHENTICATE and server is not None:
                from kafka.protocol.sasl import SaslAuthenticateRequest, SaslAuthenticateResponse

                token = SaslAuthenticateRequest.decode(payload, version=version, header=True).auth_bytes
                try:
                    answer, error, message = server.step(token), 0, None
                except SaslFailure as exc:
                    answer, error, message = b"", SASL_AUTHENTICATION_FAILED, str(exc)
                self._reply(client, SaslAuthenticateResponse(
                    version=version, error_code=error, error_message=message, auth_bytes=answer,
                    **({"session_lifetime_ms": 0} if version >= 1 else {})), correlation_id)
                if error:
                    with self._lock:
                        self.failures[(mechanism, server.user)] += 1
                    return False
                if server.done:
                    with self._lock:
                        self.logins[(mechanism, server.user, client_id)] += 1
                    return True
            else:
                with self._lock:
                    self.refused += 1
                return False
        return False

    @staticmethod
    def _reply(client: socket.socket, response, correlation_id: int) -> None:
        response.with_header(correlation_id=correlation_id)
        client.sendall(response.encode(header=True, framed=True))

    @staticmethod
    def _with_sasl_apis(answer: bytes, version: int) -> bytes:
        """tansu's ApiVersions answer (a frame payload), framed; SaslHandshake v0-1 and
        SaslAuthenticate v0-2 added if it lacks them."""
        from kafka.protocol.metadata import ApiVersionsResponse

        framed = struct.pack(">i", len(answer)) + answer
        response = ApiVersionsResponse.decode(answer, version=version, header=True)
        present = {k.api_key for k in response.api_keys}
        missing = [(k, hi) for k, hi in ((SASL_HANDSHAKE, 1), (SASL_AUTHENTICATE, 2)) if k not in present]
        if response.error_code != 0 or not missing:
            return framed
        for api_key, max_version in missing:
            response.api_keys.append(ApiVersionsResponse.ApiVersion(
                version=response.API_VERSION, api_key=api_key, min_version=0, max_version=max_version))
        response.with_header(correlation_id=response.header.correlation_id)
        return response.encode(header=True, framed=True)


# ------------------------------------------------------------------ proxy + tansu (+ stunnel)
class SaslBroker:
    """A tansu broker reachable only through the SASL proxy, as a context manager.

    With ``cert`` and ``key``, stunnel terminates TLS in front of the proxy
    (SASL_SSL); otherwise clients talk to the proxy directly (SASL_PLAINTEXT).
    Either way the broker advertises the front port.

    Attributes
    ----------
    bootstrap : str
        ``"127.0.0.1:PORT"`` of the front (what the broker advertises).
    proxy : SaslProxy
        Its ``logins`` / ``failures`` / ``refused`` counters.
    """

    def __init__(self, workdir: Path, users: dict[str, str], cert: Path | None = None,
                 key: Path | None = None):
        self.workdir, self.users, self.cert, self.key = Path(workdir), users, cert, key
        self.proxy: SaslProxy | None = None
        self.broker: LocalBroker | None = None
        self.stunnel: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "SaslBroker":
        if self.cert is not None:
            require_tool("stunnel4")        # skipped (or failed under CI) before anything starts
        self.workdir.mkdir(parents=True, exist_ok=True)
        last = None
        for _ in range(3):      # a port picked for stunnel can be taken before it binds it
            self.proxy = SaslProxy(self.users)
            self.port = self.proxy.port if self.cert is None else free_port()
            self.broker = LocalBroker(log_dir=self.workdir, advertised_url=f"tcp://{self.bootstrap}").start()
            self.proxy.start(self.broker.bootstrap)
            if self.cert is None:
                return self
            self.stunnel, last = start_stunnel(self.workdir, self.port, self.proxy.bootstrap,
                                               self.cert, self.key)
            if self.stunnel is not None:
                return self
            self.__exit__()
        raise BrokerError(last)

    def __exit__(self, *exc):
        proc, self.stunnel = self.stunnel, None
        stop_process(proc)
        if self.proxy is not None:
            self.proxy.stop()
        if self.broker is not None:
            self.broker.stop()
            self.broker = None
