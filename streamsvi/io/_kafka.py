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


def diagnose_tls(bootstrap_servers, security: dict, timeout_s: float = 3.0) -> str | None:
    """Why clients with ``security`` cannot talk to ``bootstrap_servers``, if TLS is the reason.

    With an SSL / SASL_SSL protocol: a TLS handshake, made as kafka-python
    makes it, with each server that accepts a TCP connection; the first
    refusal (certificate not signed by ``ssl_cafile``, certificate for
    another host, client certificate required, not a TLS listener) is
    returned as a sentence saying what to change. With PLAINTEXT /
    SASL_PLAINTEXT: whether a server speaks TLS. With SASL_*, then
    :func:`diagnose_sasl`. None if no such cause was found (for instance when
    no server accepts connections at all).
    """
    protocol = security.get("security_protocol", "PLAINTEXT")
    tls = protocol in ("SSL", "SASL_SSL")
    if tls:
        try:
            ctx = tls_context(security)
        except (ssl.SSLError, OSError) as exc:
            return f"cannot load the TLS files (ssl_cafile, ssl_certfile, ssl_keyfile): {exc}"
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        timeout_s = min(timeout_s, 1.0)     # a plain broker just waits for the rest of a "request"
    for host, port in _servers(bootstrap_servers):
        try:
            raw = socket.create_connection((host, port), timeout=timeout_s)
        except OSError:
            continue                         # not up: a reason for retrying, not a setting
        where = f"{host}:{port}"
        try:
            with ctx.wrap_socket(raw, server_hostname=host) as sock:
                if not tls:
                    return (f"{where} speaks TLS but security_protocol is {protocol!r}: set "
                            f"source.security_protocol = "
                            f"{'SASL_SSL' if protocol == 'SASL_PLAINTEXT' else 'SSL'}")
                sock.settimeout(min(timeout_s, 1.0))
                try:
                    sock.recv(1)             # TLS 1.3 reports a refused client certificate here
                except (TimeoutError, socket.timeout):
                    pass
        except ssl.SSLCertVerificationError as exc:
            reason = exc.verify_message or str(exc)
            if "hostname" in reason.lower() or "ip address mismatch" in reason.lower():
                return (f"the TLS certificate of {where} is not valid for {host!r} ({reason}): "
                        f"connect by a name the certificate holds (bootstrap_servers and the "
                        f"brokers' advertised listeners), or set source.ssl_check_hostname = false "
                        f"if you must")
            return (f"the TLS certificate of {where} was not accepted ({reason}): set "
                    f"source.ssl_cafile to the CA that signed the brokers' certificates"
                    + (f" (now {security['ssl_cafile']})" if security.get("ssl_cafile") else ""))
        except ssl.SSLError as exc:
            text = str(exc)
            if not tls:
                continue                     # a plain listener: not a TLS endpoint, as configured
            if "CERTIFICATE_REQUIRED" in text.upper() or "CERTIFICATE REQUIRED" in text.upper():
                return (f"{where} requires a client certificate ({text}): set source.ssl_certfile "
                        f"and source.ssl_keyfile")
            if "UNKNOWN_CA" in text.upper() or "BAD_CERTIFICATE" in text.upper():
                return (f"{where} refused the client certificate ({text}): it must be signed by a "
                        f"CA the brokers trust")
            return (f"TLS handshake with {where} failed ({text}); is it a TLS listener? "
                    f"(security_protocol is {protocol!r})")
        except OSError:
            continue                         # reset or timed out: no verdict
    return diagnose_sasl(bootstrap_servers, security, timeout_s) if protocol.startswith("SASL_") else None


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

    def read(sock, n):
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed by the server")
            out += chunk
        return out

    def call(sock, request, response_class):
        request.with_header(correlation_id=1, client_id="streamsvi-diagnosis")
        sock.sendall(request.encode(header=True, framed=True))
        (size,) = struct.unpack(">i", read(sock, 4))
        if not 0 < size <= 1 << 20:
            raise ConnectionError(f"not a Kafka answer (frame of {size} bytes)")
        return response_class.decode(read(sock, size), version=1, header=True)

    for host, port in _servers(bootstrap_servers):
        where = f"{host}:{port}"
        try:
            with socket.create_connection((host, port), timeout=timeout_s) as raw:
                sock = (tls_context(security).wrap_socket(raw, server_hostname=host)
                        if security.get("security_protocol") == "SASL_SSL" else raw)
                hello = call(sock, SaslHandshakeRequest[1](mechanism=mechanism), SaslHandshakeResponse)
                if hello.error_code == 33 or mechanism not in hello.mechanisms:   # UNSUPPORTED_SASL_MECHANISM
                    return (f"{where} does not offer the SASL mechanism {mechanism!r} (it offers "
                            f"{', '.join(hello.mechanisms) or 'none'}): set source.sasl_mechanism")
                if hello.error_code:
                    continue
                client = get_sasl_mechanism(mechanism)(host=host, **security)
                while not client.is_done():
                    answer = call(sock, SaslAuthenticateRequest[1](auth_bytes=client.auth_bytes()),
                                  SaslAuthenticateResponse)
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
    between attempts and logs each retry at WARNING. After a failure,
    :func:`diagnose_tls` looks for a TLS cause (kafka-python itself only
    says "Unable to bootstrap") or a refused SASL login; one ends the retries.

    Raises
    ------
    KafkaUnavailableError
        After ``attempts`` failures, naming the servers and the last error.
    KafkaSecurityError
        At the first failure that a TLS or SASL setting explains, saying which.
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
            return factory()
        except errors as exc:
            cause = diagnose_tls(bootstrap_servers, security)
            if cause is not None:
                raise KafkaSecurityError(f"{what}: {cause}") from exc
            if attempt == attempts:
                sasl = security.get("sasl_mechanism")
                raise KafkaUnavailableError(
                    f"{what}: cannot reach Kafka at {bootstrap_servers} after {attempts} "
                    f"attempt(s) over {time.monotonic() - t0:.1f} s (last error: {exc}); check "
                    f"bootstrap_servers and that the brokers are running"
                    + (f"; if they are, check that they listen for "
                       f"{security['security_protocol']} there" if security.get("security_protocol")
                       else "")
                    + (f", and the SASL settings ({sasl}, user "
                       f"{security.get('sasl_plain_username')!r}) and password" if sasl else "")) from exc
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
