"""Kafka SASL end to end: every client logs in to a real SASL endpoint, and a refused login is explained.

tansu 0.6.0 cannot complete a SASL login (README, "Secured clusters"), so the
server side of SASL is the SASL-terminating proxy of tests/conftest_sasl.py in
front of tansu (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; stunnel in front of it for
SASL_SSL). The proxy counts logins by mechanism, user and client id, so each
test checks that every kind of client really logged in.
"""
import base64
import io
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tests.conftest_broker import kafka_broker  # noqa: F401  (imports kafka-python quietly first)
from tests.conftest_sasl import PlainServer, SaslBroker, SaslFailure, ScramServer
from tests.conftest_tls import make_pki

from streamsvi.io import JsonCodec
from streamsvi.io._kafka import SECURITY_SETTINGS, KafkaSecurityError, KafkaUnavailableError
from streamsvi.io.broker import create_topic, free_port
from streamsvi.io.deadletter import KafkaDeadLetterSink
from streamsvi.io.produce import produce_rows
from streamsvi.io.sources import KafkaSource
from streamsvi.service import exitcodes
from streamsvi.service.config import client_security, validate
from streamsvi.service.tomlw import dump_toml
from streamsvi.service.daemon import Daemon

STREAMSVI = os.path.join(os.path.dirname(sys.executable), "streamsvi")

#: client_id of each kind of client streamsvi opens: topic creation, ``produce_rows``, the daemon's
#: group consumer, its probe consumer (highwater marks, drained) and its dead-letter producer.
EVERY_CLIENT = {"streamsvi-admin", "streamsvi-producer", "streamsvi", "streamsvi-probe", "streamsvi-deadletter"}


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory):
    """SASL_PLAINTEXT: the proxy's port is what tansu advertises."""
    with SaslBroker(tmp_path_factory.mktemp("sasl"), users={}) as sb:
        yield sb


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def sasl_ssl_broker(pki, tmp_path_factory):
    """SASL_SSL: stunnel (TLS) → the SASL proxy → tansu; stunnel's port is advertised."""
    with SaslBroker(tmp_path_factory.mktemp("sasl-ssl"), users={}, cert=pki["server_cert"],
                    key=pki["server_key"]) as sb:
        yield sb


def _user(broker) -> tuple[str, str]:
    """A new user (name, password) of ``broker``'s proxy: each test counts its own logins."""
    user, password = f"u-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    broker.proxy.users[user] = password
    return user, password


def _config(tmp_path, bootstrap, topic, **source):
    return {"model": {"kind": "gmm", "n_components": 2, "n_features": 2},
            "inference": {"n_total": "auto", "batch_size": 50},
            "source": {"bootstrap_servers": bootstrap, "topics": [topic], "group_id": f"g-{topic}",
                       "connect_attempts": 2, "connect_backoff_seconds": 0.1,
                       "dead_letter_topic": f"{topic}-dead", **source},
            "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 1},
            "metrics": {"enabled": False, "progress_seconds": 0.0}}


def _password_file(tmp_path, password) -> str:
    path = tmp_path / "sasl.pw"
    path.write_text(password + "\n")
    os.chmod(path, 0o600)
    return str(path)


@pytest.mark.parametrize("protocol, mechanism, secret_from", [
    ("SASL_PLAINTEXT", "PLAIN", "env"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256", "file"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512", "env"),
    ("SASL_SSL", "SCRAM-SHA-256", "file"),
])
def test_daemon_learns_over_sasl_with_every_client_logged_in(protocol, mechanism, secret_from, request,
                                                            pki, tmp_path, monkeypatch):
    """create_topic, produce_rows, the daemon's consumer, its probe consumer (n_total = auto, drain)
    and its dead-letter producer all log in through the proxy with the config's SASL settings."""
    broker = request.getfixturevalue("sasl_broker" if protocol == "SASL_PLAINTEXT" else "sasl_ssl_broker")
    user, password = _user(broker)
    if secret_from == "env":
        monkeypatch.setenv("STREAMSVI_TEST_SASL_PW", password)
        secret = {"sasl_password_env": "STREAMSVI_TEST_SASL_PW"}
    else:
        secret = {"sasl_password_file": _password_file(tmp_path, password)}
    tls = {"ssl_cafile": str(pki["ca"])} if protocol == "SASL_SSL" else {}
    topic = f"sasl-{uuid.uuid4().hex[:10]}"
    cfg = validate(_config(tmp_path, broker.bootstrap, topic, security_protocol=protocol,
                           sasl_mechanism=mechanism, sasl_username=user, **secret, **tls))
    security = client_security(cfg)
    assert {k: security[k] for k in ("security_protocol", "sasl_mechanism", "sasl_plain_username",
                                     "sasl_plain_password")} \
        == {"security_protocol": protocol, "sasl_mechanism": mechanism, "sasl_plain_username": user,
            "sasl_plain_password": password}
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    for cls in (KafkaConsumer, KafkaProducer, KafkaAdminClient):    # names every kafka-python client knows
        assert set(security) <= set(cls.DEFAULT_CONFIG) and set(security) <= set(SECURITY_SETTINGS)

    create_topic(broker.bootstrap, topic, partitions=2, security=security)
    create_topic(broker.bootstrap, f"{topic}-dead", security=security)
    rng = np.random.default_rng(0)
    rows = np.concatenate([rng.normal(-3, 0.5, (150, 2)), rng.normal(3, 0.5, (150, 2))])
    assert produce_rows(broker.bootstrap, topic, rows, JsonCodec(2), partitions=2,
                        security=security) == len(rows)
    # one bad record, so the dead-letter producer has something to write
    produce_rows(broker.bootstrap, topic, np.array([[1e300, 0.0]]), JsonCodec(2), security=security)
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained", res
    assert res.records + res.heldout == len(rows) and res.dead == 1
    with KafkaSource(broker.bootstrap, f"{topic}-dead", group_id=f"r-{topic}", codec=JsonCodec(1),
                     client_id="dead-reader", security=security) as dead:
        dead.wait_for_assignment(timeout_s=30)
        assert dead.highwater_marks(dead.partitions()) == {(f"{topic}-dead", 0): 1}

    logged_in = broker.proxy.authenticated_clients(mechanism, user)
    assert EVERY_CLIENT <= logged_in, f"no {mechanism} login from {EVERY_CLIENT - logged_in}"
    assert not [k for k in broker.proxy.failures if k[1] == user]


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_password_is_reported_as_a_refused_login(mechanism, sasl_broker, tmp_path):
    user, password = _user(sasl_broker)
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
                "sasl_plain_username": user, "sasl_plain_password": password + "-wrong"}
    with pytest.raises(KafkaSecurityError) as err:
        KafkaSource(sasl_broker.bootstrap, "t", group_id="g", codec=JsonCodec(2), connect_attempts=3,
                    connect_backoff_s=0.1, connect_timeout_s=2, security=security)
    msg = str(err.value)
    assert f"SASL authentication failed at {sasl_broker.bootstrap} ({mechanism}, user {user!r}" in msg
    assert "source.sasl_password_env or source.sasl_password_file" in msg
    with pytest.raises(KafkaSecurityError, match="SASL authentication failed"):
        KafkaDeadLetterSink(sasl_broker.bootstrap, "t-dead", connect_attempts=1, connect_timeout_s=2,
                            security=security)
    with pytest.raises(KafkaSecurityError, match="SASL authentication failed"):
        create_topic(sasl_broker.bootstrap, "t", security=security, timeout_s=2)
    assert sasl_broker.proxy.failures[(mechanism, user)] >= 3
    assert not sasl_broker.proxy.authenticated_clients(mechanism, user)


def test_streamsvi_run_with_a_wrong_password_exits_with_one_line(sasl_broker, tmp_path):
    user, password = _user(sasl_broker)
    topic = f"sasl-{uuid.uuid4().hex[:10]}"
    cfg_path = tmp_path / "wrong-pw.toml"
    cfg_path.write_text(dump_toml(_config(tmp_path, sasl_broker.bootstrap, topic, security_protocol="SASL_PLAINTEXT",
                                      sasl_mechanism="SCRAM-SHA-256", sasl_username=user,
                                      sasl_password_env="STREAMSVI_TEST_SASL_PW")))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(cfg_path), "--until-drained"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "STREAMSVI_TEST_SASL_PW": "not-" + password})
    assert proc.returncode == 2, proc.stderr[-2000:]          # exitcodes.USAGE: a setting to fix
    errors = [line for line in proc.stderr.splitlines() if line.startswith("streamsvi: error: ")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert "SASL authentication failed" in errors[0] and f"user {user!r}" in errors[0]
    assert "Traceback" not in proc.stderr
    assert sasl_broker.proxy.failures[("SCRAM-SHA-256", user)] >= 1


def test_a_mechanism_the_brokers_do_not_offer_is_named(sasl_broker):
    user, password = _user(sasl_broker)
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
                "sasl_plain_username": user, "sasl_plain_password": password}
    offered = sasl_broker.proxy.mechanisms
    sasl_broker.proxy.mechanisms = ["SCRAM-SHA-512"]
    try:
        with pytest.raises(KafkaSecurityError, match="does not offer the SASL mechanism 'PLAIN' "
                                                     r"\(it offers SCRAM-SHA-512\): set source.sasl_mechanism"):
            produce_rows(sasl_broker.bootstrap, "t", np.zeros((1, 2)), JsonCodec(2), connect_attempts=2,
                         connect_backoff_s=0.1, producer_config={"bootstrap_timeout_ms": 2000},
                         security=security)
    finally:
        sasl_broker.proxy.mechanisms = offered


def test_an_unreachable_sasl_cluster_names_the_sasl_settings():
    """No broker at all: retried, then KafkaUnavailableError, whose advice includes the SASL settings."""
    security = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                "sasl_plain_username": "alice", "sasl_plain_password": "pw"}
    nowhere = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaUnavailableError, match=r"listen for SASL_PLAINTEXT there, and the SASL settings "
                                                    r"\(SCRAM-SHA-512, user 'alice'\) and password"):
        KafkaSource(nowhere, "t", group_id="g", codec=JsonCodec(2), connect_attempts=2,
                    connect_backoff_s=0.1, connect_timeout_s=1, security=security)


def test_the_sasl_endpoint_refuses_clients_that_do_not_log_in(sasl_broker):
    """A client without SASL gets nowhere: the proxy closes the connection at its first request
    other than ApiVersions (the broker behind it is never reached), and the error says to log in
    (it used to be "cannot reach Kafka")."""
    refused = sasl_broker.proxy.refused
    with pytest.raises(KafkaSecurityError) as err:
        produce_rows(sasl_broker.bootstrap, "t", np.zeros((1, 2)), JsonCodec(2), connect_attempts=1,
                     producer_config={"bootstrap_timeout_ms": 1500})
    msg = str(err.value)
    assert f"{sasl_broker.bootstrap} requires a SASL login" in msg and "security_protocol is 'PLAINTEXT'" in msg
    assert "set source.security_protocol = 'SASL_PLAINTEXT', source.sasl_mechanism (it offers PLAIN, " \
           "SCRAM-SHA-256, SCRAM-SHA-512), source.sasl_username and the password" in msg
    assert sasl_broker.proxy.refused > refused


def test_streamsvi_run_without_sasl_against_a_sasl_listener_says_so(sasl_broker, tmp_path):
    """The daemon with the default PLAINTEXT protocol at a listener that requires SASL: one line saying
    so and which settings to set, exit code 2 (a setting to fix), after the first attempt; it used to
    be "cannot reach Kafka ... check that the brokers are running", exit code 3."""
    topic = f"sasl-{uuid.uuid4().hex[:10]}"
    cfg_path = tmp_path / "no-sasl.toml"
    cfg_path.write_text(dump_toml(_config(tmp_path, sasl_broker.bootstrap, topic)))
    t0 = time.monotonic()
    proc = subprocess.run([STREAMSVI, "run", "--config", str(cfg_path), "--until-drained"],
                          capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == exitcodes.USAGE, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("streamsvi: error: ")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert f"{sasl_broker.bootstrap} requires a SASL login" in errors[0]
    assert "set source.security_protocol = 'SASL_PLAINTEXT', source.sasl_mechanism" in errors[0]
    assert "cannot reach Kafka" not in proc.stderr and "Traceback" not in proc.stderr
    assert "attempt 1/2 failed" not in proc.stderr                   # not retried: a setting, not an outage
    assert elapsed < 30, f"{elapsed:.1f} s to the error"             # one bootstrap timeout (10 s)


def test_an_ssl_client_of_a_sasl_ssl_listener_is_told_to_log_in(sasl_ssl_broker, pki):
    """security_protocol = "SSL" at a SASL_SSL listener: the TLS handshake succeeds, then the proxy
    behind stunnel closes the connection at Metadata; the error says SASL_SSL."""
    security = {"security_protocol": "SSL", "ssl_cafile": str(pki["ca"])}
    with pytest.raises(KafkaSecurityError) as err:
        produce_rows(sasl_ssl_broker.bootstrap, "t", np.zeros((1, 2)), JsonCodec(2), connect_attempts=1,
                     producer_config={"bootstrap_timeout_ms": 1500}, security=security)
    msg = str(err.value)
    assert f"{sasl_ssl_broker.bootstrap} requires a SASL login" in msg and "security_protocol is 'SSL'" in msg
    assert "set source.security_protocol = 'SASL_SSL'" in msg


def test_a_sasl_ssl_client_of_a_sasl_plaintext_listener_is_told_it_is_not_tls(sasl_broker, pki):
    """SASL_SSL at a SASL_PLAINTEXT listener that, like Apache Kafka, closes the connection on a TLS
    ClientHello (a 369 MB "request"): named as not a TLS listener, with the plaintext protocol to use."""
    user, password = _user(sasl_broker)
    security = {"security_protocol": "SASL_SSL", "ssl_cafile": str(pki["ca"]), "sasl_mechanism": "PLAIN",
                "sasl_plain_username": user, "sasl_plain_password": password}
    t0 = time.monotonic()
    with pytest.raises(KafkaSecurityError) as err:
        KafkaSource(sasl_broker.bootstrap, "t", group_id="g", codec=JsonCodec(2), connect_attempts=2,
                    connect_backoff_s=0.1, connect_timeout_s=2, security=security)
    msg = str(err.value)
    assert f"{sasl_broker.bootstrap} is not a TLS listener: it closed the connection on a TLS ClientHello " \
           f"and answers Kafka requests in plaintext" in msg
    assert "set source.security_protocol = 'SASL_PLAINTEXT'" in msg
    assert time.monotonic() - t0 < 30


def test_neither_a_healthy_plaintext_broker_nor_a_missing_one_is_taken_for_sasl(kafka_broker, sasl_broker):
    """The probe behind "requires a SASL login" blames SASL only when a listener answers ApiVersions and
    SaslHandshake but closes the connection at Metadata: a plain broker (tansu answers SaslHandshake
    too) and a closed port get no verdict, and an unreachable cluster is still "cannot reach Kafka"."""
    from streamsvi.io._kafka import diagnose_sasl_required, diagnose_tls

    plain = {"security_protocol": "PLAINTEXT"}
    nowhere = f"127.0.0.1:{free_port()}"
    assert diagnose_sasl_required(kafka_broker.bootstrap, plain) is None
    assert diagnose_sasl_required(nowhere, plain) is None
    assert diagnose_tls(kafka_broker.bootstrap, plain) is None and diagnose_tls(nowhere, plain) is None
    assert "requires a SASL login" in diagnose_sasl_required(sasl_broker.bootstrap, plain)
    with pytest.raises(KafkaUnavailableError, match=f"cannot reach Kafka at {nowhere} after 1 attempt"):
        KafkaSource(nowhere, "t", group_id="g", codec=JsonCodec(2), connect_attempts=1, connect_timeout_s=1)


def test_the_proxy_scram_server_reproduces_rfc_7677s_example():
    """RFC 7677 section 3: user "user", password "pencil"; the proxy's SCRAM-SHA-256 server, given the
    example's salt and server nonce, sends its server-first message, accepts its proof and answers
    with its server signature, and refuses the proof made for another password."""
    client_first = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    kw = {"iterations": 4096, "salt": base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="),
          "server_nonce": "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"}
    server = ScramServer("SCRAM-SHA-256", {"user": "pencil"}, **kw)
    assert server.step(client_first) == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                         b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    client_final = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert server.step(client_final) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.done and server.user == "user"
    other = ScramServer("SCRAM-SHA-256", {"user": "not-pencil"}, **kw)
    other.step(client_first)
    with pytest.raises(SaslFailure, match="invalid credentials"):
        other.step(client_final)
    assert not other.done


def test_the_proxy_plain_server_follows_rfc_4616():
    assert PlainServer({"alice": "pw"}).step(b"\0alice\0pw") == b""
    assert PlainServer({"alice": "pw"}).step(b"alice\0alice\0pw") == b""
    for message in (b"\0alice\0nope", b"\0bob\0pw", b"bob\0alice\0pw", b"alice\0pw"):
        with pytest.raises(SaslFailure):
            PlainServer({"alice": "pw"}).step(message)
