"""Small kafka-python helpers shared by the source, the dead-letter sink and the producer.

Kept private: the public surface is in :mod:`streamsvi.io.sources`,
:mod:`streamsvi.io.deadletter` and :mod:`streamsvi.io.produce`.
"""
from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
from typing import Callable, TypeVar

log = logging.getLogger("streamsvi.io")

T = TypeVar("T")


class KafkaUnavailableError(ConnectionError):
    """Kafka could not be reached after every configured attempt."""


class KafkaSecurityError(ValueError):
    """A security setting that cannot work (a CA that did not sign the brokers' certificates,
    a certificate for another host, TLS against a plain listener, ...). Not retried."""


#: kafka-python's names of the security settings (``client_security`` of the service config).
SECURITY_SETTINGS = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
                     "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname")


def tls_context(security: dict) -> ssl.SSLContext:
    """The client TLS context kafka-python 3.0 builds from ``security`` (``ssl_*`` settings)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = security.get("ssl_check_hostname", True)
    if security.get("ssl_cafile"):
        ctx.load_verify_locations(security["ssl_cafile"])
    else:
        ctx.load_default_certs()
    if security.get("ssl_certfile"):
        password = security.get("ssl_password")
        ctx.load_cert_chain(security["ssl_certfile"], security.get("ssl_keyfile"),
                            password=password if password is not None else lambda: b"")  # never prompt
    return ctx


def _servers(bootstrap_servers) -> list[tuple[str, int]]:
    items = bootstrap_servers.split(",") if isinstance(bootstrap_servers, str) else list(bootstrap_servers)
    out = []
    for item in items:
        host, _, port = item.strip().rpartition(":")
        if host and port.isdigit():
            out.append((host.strip("[]"), int(port)))
    return out


def _read(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed by the server")
        out += chunk
    return out


def _call(sock, request, response_class, version: int):
    """Send ``request`` (kafka-python message class, at ``version``) on ``sock``; its decoded answer."""
    request.with_header(correlation_id=1, client_id="streamsvi-diagnosis")
    sock.sendall(request.encode(header=True, framed=True))
    (size,) = struct.unpack(">i", _read(sock, 4))
    if not 0 < size <= 1 << 20:
        raise ValueError(f"not a Kafka answer (frame of {size} bytes)")
    return response_class.decode(_read(sock, size), version=version, header=True)


def _kafka_answers_in_plaintext(host: str, port: int, timeout_s: float) -> bool:
    """True if ``host:port`` answers an ApiVersions request sent in plaintext as a Kafka broker does."""
    from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            _call(sock, ApiVersionsRequest[0](), ApiVersionsResponse, 0)
            return True
    except Exception:                        # refused, closed, timed out, not Kafka: no
        return False


#: What OpenSSL says when the answer to a ClientHello is not TLS at all.
_NOT_TLS_ANSWERS = ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG",
                    "UNKNOWN_PROTOCOL", "HTTP_REQUEST", "RECORD_TOO_LONG")


def _answer_to_client_hello(exc: BaseException, timeout_s: float) -> str | None:
    """How a handshake that ended in ``exc`` (before it completed) looks from a plaintext listener,
    or None if ``exc`` is a TLS refusal (certificate, version, ...)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return None
    if isinstance(exc, TimeoutError):       # a plain Kafka listener waits for the rest of a "frame"
        return f"did not answer a TLS ClientHello within {timeout_s:g} s"
    if isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ConnectionError)):
        return "closed the connection on a TLS ClientHello"   # Apache Kafka: frame size too large
    if isinstance(exc, ssl.SSLError) and any(k in str(exc).upper() for k in _NOT_TLS_ANSWERS):
        return "answered a TLS ClientHello with plaintext"
    return None


def _tls_handshake(host: str, port: int, ctx: ssl.SSLContext, security: dict, timeout_s: float,
                   wait_for_alert: bool) -> tuple[str, str | None]:
    """A TLS handshake with ``host:port`` as kafka-python makes it: ``(state, cause)``.

    ``state`` is "down" (no TCP connection), "ok" (handshake done), "stalled"
    (no answer, no verdict) or "failed"; ``cause`` says what to change, if a
    setting explains the failure. A listener that does not complete the
    handshake is asked, on a new connection, for its API versions in
    plaintext: if it answers, it is a plain Kafka listener. With
    ``wait_for_alert``, after the handshake, up to 1 s for a TLS 1.3 alert
    (a refused client certificate is reported only then).
    """
    protocol = security.get("security_protocol", "PLAINTEXT")
    where = f"{host}:{port}"
    try:
        raw = socket.create_connection((host, port), timeout=timeout_s)
    except OSError:
        return "down", None                  # not up: a reason for retrying, not a setting
    done = False
    try:
        with raw, ctx.wrap_socket(raw, server_hostname=host) as sock:
            done = True
            if wait_for_alert:
                sock.settimeout(min(timeout_s, 1.0))
                try:
                    sock.recv(1)             # TLS 1.3 reports a refused client certificate here
                except TimeoutError:
                    pass
        return "ok", None
    except ssl.SSLCertVerificationError as exc:
        reason = exc.verify_message or str(exc)
        if "hostname" in reason.lower() or "ip address mismatch" in reason.lower():
            return "failed", (f"the TLS certificate of {where} is not valid for {host!r} ({reason}): "
                              f"connect by a name the certificate holds (bootstrap_servers and the "
                              f"brokers' advertised listeners), or set source.ssl_check_hostname = false "
                              f"if you must")
        return "failed", (f"the TLS certificate of {where} was not accepted ({reason}): set "
                          f"source.ssl_cafile to the CA that signed the brokers' certificates"
                          + (f" (now {security['ssl_cafile']})" if security.get("ssl_cafile") else ""))
    except OSError as exc:                   # ssl.SSLError included
        text = str(exc)
        if isinstance(exc, ssl.SSLError):
            if "CERTIFICATE_REQUIRED" in text.upper() or "CERTIFICATE REQUIRED" in text.upper():
                return "failed", (f"{where} requires a client certificate ({text}): set "
                                  f"source.ssl_certfile and source.ssl_keyfile")
            if "UNKNOWN_CA" in text.upper() or "BAD_CERTIFICATE" in text.upper():
                return "failed", (f"{where} refused the client certificate ({text}): it must be signed "
                                  f"by a CA the brokers trust")
        answer = None if done else _answer_to_client_hello(exc, timeout_s)
        if answer is not None and _kafka_answers_in_plaintext(host, port, timeout_s):
            plain = "SASL_PLAINTEXT" if protocol == "SASL_SSL" else "PLAINTEXT"
            return "failed", (f"{where} is not a TLS listener: it {answer} and answers Kafka requests "
                              f"in plaintext; security_protocol is {protocol!r}: set "
                              f"source.security_protocol = {plain!r} or point source.bootstrap_servers "
                              f"at the TLS listener")
        if isinstance(exc, ssl.SSLError):
            return "failed", (f"TLS handshake with {where} failed ({text}); is it a TLS listener? "
                              f"(security_protocol is {protocol!r})")
        return ("stalled" if isinstance(exc, TimeoutError) and not done else "failed"), None


def diagnose_tls(bootstrap_servers, security: dict, timeout_s: float = 3.0) -> str | None:
    """Why clients with ``security`` cannot talk to ``bootstrap_servers``, if TLS is the reason.

    With an SSL / SASL_SSL protocol: a TLS handshake, made as kafka-python
    makes it, with each server that accepts a TCP connection; the first
    refusal (certificate not signed by ``ssl_cafile``, certificate for
    another host, client certificate required, not a TLS listener) is
    returned as a sentence saying what to change. With PLAINTEXT /
    SASL_PLAINTEXT: whether a server speaks TLS. Then, with SASL_*,
    :func:`diagnose_sasl`; without, :func:`diagnose_sasl_required`. None if
    no such cause was found (for instance when no server accepts connections
    at all).
    """
    protocol = security.get("security_protocol", "PLAINTEXT")
    if protocol in ("SSL", "SASL_SSL"):
        try:
            ctx = tls_context(security)
        except (ssl.SSLError, OSError) as exc:
            return f"cannot load the TLS files (ssl_cafile, ssl_certfile, ssl_keyfile): {exc}"
        for host, port in _servers(bootstrap_servers):
            _, cause = _tls_handshake(host, port, ctx, security, timeout_s, wait_for_alert=True)
            if cause is not None:
                return cause
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        for host, port in _servers(bootstrap_servers):
            try:                             # a plain broker just waits for the rest of a "request"
                raw = socket.create_connection((host, port), timeout=min(timeout_s, 1.0))
            except OSError:
                continue
            try:
                with ctx.wrap_socket(raw, server_hostname=host):
                    return (f"{host}:{port} speaks TLS but security_protocol is {protocol!r}: set "
                            f"source.security_protocol = "
                            f"{'SASL_SSL' if protocol == 'SASL_PLAINTEXT' else 'SSL'}")
            except OSError:
                continue                     # a plain listener: not a TLS endpoint, as configured
    if protocol.startswith("SASL_"):
        return diagnose_sasl(bootstrap_servers, security, timeout_s)
    return diagnose_sasl_required(bootstrap_servers, security, min(timeout_s, 1.0))


class TlsHandshakeTimeout(KafkaUnavailableError):
    """No bootstrap server completed a TLS handshake in time, and none is known to be a plain
    listener either: retried like any unreachable cluster."""


def check_tls(bootstrap_servers, security: dict, *, what: str, timeout_s: float = 3.0) -> None:
    """Before a kafka-python client with an SSL / SASL_SSL protocol is made: can it make a TLS handshake?

    kafka-python 3.0 puts no time limit on a TLS handshake, and its bootstrap
    waits for the handshake without its ``bootstrap_timeout_ms``: against a
    listener that never answers the ClientHello (a plaintext tansu listener
    waits for the rest of what it reads as a 369 MB request) the client is
    never made, and no error ever comes. So the handshake is made here first,
    with ``timeout_s``, with each bootstrap server that accepts a TCP
    connection; nothing is done for other protocols.

    Raises
    ------
    KafkaSecurityError
        A setting explains a failed handshake (not a TLS listener, certificate
        not accepted, ...), saying which to change.
    TlsHandshakeTimeout
        No server completed a handshake, and at least one accepted a
        connection but did not answer within ``timeout_s`` (without this check,
        kafka-python would have waited for ever).
    """
    if security.get("security_protocol", "PLAINTEXT") not in ("SSL", "SASL_SSL"):
        return
    try:
        ctx = tls_context(security)
    except (ssl.SSLError, OSError) as exc:
        raise KafkaSecurityError(f"{what}: cannot load the TLS files (ssl_cafile, ssl_certfile, "
                                 f"ssl_keyfile): {exc}") from exc
    stalled = []
    for host, port in _servers(bootstrap_servers):
        state, cause = _tls_handshake(host, port, ctx, security, timeout_s, wait_for_alert=False)
        if cause is not None:
            raise KafkaSecurityError(f"{what}: {cause}")
        if state == "ok":
            return
        if state == "stalled":
            stalled.append(f"{host}:{port}")
    if stalled:
        raise TlsHandshakeTimeout(f"no answer to a TLS handshake within {timeout_s:g} s from "
                                  f"{', '.join(stalled)}")


def diagnose_sasl_required(bootstrap_servers, security: dict, timeout_s: float = 1.0) -> str | None:
    """Whether the brokers require a SASL login that ``security`` (PLAINTEXT / SSL) does not make.

    A Kafka listener that requires SASL answers ApiVersions and SaslHandshake
    before a login but closes the connection at any other request; a listener
    without SASL answers them all. So each server that accepts a connection
    (over TLS with SSL) is sent ApiVersions, then Metadata, on one connection:
    if it answers the first and closes the connection at the second, and on
    a new connection answers a SaslHandshake with the mechanisms it offers,
    the returned sentence says to set a SASL protocol and the SASL settings.
    None otherwise: a server that is down, silent or answers Metadata says
    nothing about SASL.
    """
    from kafka.protocol.metadata import (ApiVersionsRequest, ApiVersionsResponse, MetadataRequest,
                                         MetadataResponse)
    from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

    protocol = security.get("security_protocol", "PLAINTEXT")
    if protocol not in ("PLAINTEXT", "SSL"):
        return None

    def connect(host, port):
        raw = socket.create_connection((host, port), timeout=timeout_s)
        if protocol != "SSL":
            return raw
        try:
            return tls_context(security).wrap_socket(raw, server_hostname=host)
        except BaseException:
            raw.close()
            raise

    for host, port in _servers(bootstrap_servers):
        try:
            with connect(host, port) as sock:
                _call(sock, ApiVersionsRequest[0](), ApiVersionsResponse, 0)
                try:
                    _call(sock, MetadataRequest[1](topics=[]), MetadataResponse, 1)
                    continue                 # answered: no login needed there
                except (ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
                    pass                     # closed at the first request that needs a login
            with connect(host, port) as sock:   # still there, and a SASL listener?
                hello = _call(sock, SaslHandshakeRequest[1](mechanism="PLAIN"), SaslHandshakeResponse, 1)
        except Exception:
            continue                         # not up, not Kafka, timed out: no verdict
        if hello.error_code not in (0, 33) or not hello.mechanisms:   # 33: UNSUPPORTED_SASL_MECHANISM
            continue
        sasl = "SASL_SSL" if protocol == "SSL" else "SASL_PLAINTEXT"
        return (f"{host}:{port} requires a SASL login: it answered ApiVersions but closed the connection "
                f"at a Metadata request, as a SASL listener does before a login; security_protocol is "
                f"{protocol!r}: set source.security_protocol = {sasl!r}, source.sasl_mechanism (it offers "
                f"{', '.join(hello.mechanisms)}), source.sasl_username and the password "
                f"(source.sasl_password_env or source.sasl_password_file)")
    return None


def diagnose_sasl(bootstrap_servers, security: dict, timeout_s: float = 3.0) -> str | None:
    """Why the brokers refuse the SASL login of ``security``, if they do.

    kafka-python only logs a refused login and then reports "Unable to
    bootstrap"; this logs in as it does (SaslHandshake v1, then SaslAuthenticate
    v1 with kafka-python's own mechanism) with each server that accepts a
    connection and returns the first refusal (mechanism not offered, user or
    password wrong) as a sentence saying what to change; None otherwise.
    """
    from kafka.net.sasl import get_sasl_mechanism
    from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                     SaslHandshakeResponse)

    mechanism, user = security.get("sasl_mechanism"), security.get("sasl_plain_username")
    for host, port in _servers(bootstrap_servers):
        where = f"{host}:{port}"
        try:
            with socket.create_connection((host, port), timeout=timeout_s) as raw:
                sock = (tls_context(security).wrap_socket(raw, server_hostname=host)
                        if security.get("security_protocol") == "SASL_SSL" else raw)
                hello = _call(sock, SaslHandshakeRequest[1](mechanism=mechanism), SaslHandshakeResponse, 1)
                if hello.error_code == 33 and list(hello.mechanisms) == [mechanism]:
                    # refused, naming only the mechanism asked for: tansu's answer on a listener
                    # without SASL ("does not offer 'PLAIN' (it offers PLAIN)" said nothing)
                    return (f"{where} refused a SASL login with {mechanism!r} (UNSUPPORTED_SASL_MECHANISM, "
                            f"naming only that mechanism): its listener likely has no SASL; check "
                            f"source.security_protocol (PLAINTEXT or SSL for a listener without SASL) "
                            f"and source.bootstrap_servers")
                if hello.error_code == 33 or mechanism not in hello.mechanisms:   # UNSUPPORTED_SASL_MECHANISM
                    return (f"{where} does not offer the SASL mechanism {mechanism!r} (it offers "
                            f"{', '.join(hello.mechanisms) or 'none'}): set source.sasl_mechanism")
                if hello.error_code:
                    continue
                client = get_sasl_mechanism(mechanism)(host=host, **security)
                while not client.is_done():
                    answer = _call(sock, SaslAuthenticateRequest[1](auth_bytes=client.auth_bytes()),
                                   SaslAuthenticateResponse, 1)
                    if answer.error_code:
                        return (f"SASL authentication failed at {where} ({mechanism}, user {user!r}: "
                                f"{answer.error_message or 'no reason given'}): check "
                                f"source.sasl_username and the password (source.sasl_password_env "
                                f"or source.sasl_password_file)")
                    client.receive(answer.auth_bytes)
        except (OSError, ValueError, KeyError, struct.error):
            continue                         # not up, not Kafka, or no verdict
    return None


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
                       attempts: int, backoff_s: float, max_backoff_s: float = 10.0,
                       security: dict | None = None) -> T:
    """Call ``factory()`` until it stops failing with a connection error.

    Waits ``backoff_s``, ``2 backoff_s``, ... (at most ``max_backoff_s``)
    between attempts and logs each retry at WARNING. With an SSL / SASL_SSL
    protocol, :func:`check_tls` first makes a TLS handshake with a time limit
    (kafka-python's has none). After a failure, :func:`diagnose_tls` looks for
    a TLS cause (kafka-python itself only says "Unable to bootstrap"), a
    refused SASL login or a SASL login the brokers require; one ends the retries.

    Raises
    ------
    KafkaUnavailableError
        After ``attempts`` failures, naming the servers and the last error.
    KafkaSecurityError
        At the first failure that a TLS or SASL setting explains, saying which
        (a TLS protocol against a plaintext listener, a plaintext one against a
        listener that requires SASL, ...).
    """
    security = security or {}
    if not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"connect_attempts must be an integer >= 1, got {attempts!r}")
    if not backoff_s >= 0:
        raise ValueError(f"connect_backoff_s must be >= 0, got {backoff_s!r}")
    errors = retriable_errors()
    t0 = time.monotonic()
    for attempt in range(1, attempts + 1):
        try:
            check_tls(bootstrap_servers, security, what=what)   # kafka-python's handshake never times out
            return factory()
        except TlsHandshakeTimeout as exc:
            failure, cause = exc, None       # just diagnosed, without a verdict
        except errors as exc:
            failure, cause = exc, diagnose_tls(bootstrap_servers, security)
        if cause is not None:
            raise KafkaSecurityError(f"{what}: {cause}") from failure
        if attempt == attempts:
            sasl = security.get("sasl_mechanism")
            raise KafkaUnavailableError(
                f"{what}: cannot reach Kafka at {bootstrap_servers} after {attempts} "
                f"attempt(s) over {time.monotonic() - t0:.1f} s (last error: {failure}); check "
                f"bootstrap_servers and that the brokers are running"
                + (f"; if they are, check that they listen for "
                   f"{security['security_protocol']} there" if security.get("security_protocol")
                   else "")
                + (f", and the SASL settings ({sasl}, user "
                   f"{security.get('sasl_plain_username')!r}) and password" if sasl else "")) from failure
        delay = min(backoff_s * 2 ** (attempt - 1), max_backoff_s)
        log.warning("%s: Kafka at %s unavailable (attempt %d/%d: %s); retrying in %.2f s",
                    what, bootstrap_servers, attempt, attempts, failure, delay)
        time.sleep(delay)
    raise AssertionError("unreachable")


def offset_and_metadata(offset: int):
    """``OffsetAndMetadata(offset, "", -1)`` (3.x) or ``(offset, "")`` (2.0.x)."""
    from kafka.structs import OffsetAndMetadata
    if len(OffsetAndMetadata._fields) >= 3:
        return OffsetAndMetadata(int(offset), "", -1)
    return OffsetAndMetadata(int(offset), "")
