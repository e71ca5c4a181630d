"""Kafka security: every client over a real TLS endpoint (stunnel in front of tansu).

The certificates are made here (tests/conftest_tls.py, with ``openssl``). SASL
is tested end to end in tests/io/test_sasl.py (through the SASL proxy of
tests/conftest_sasl.py, since tansu 0.6.0 cannot complete a SASL login).
"""
import io
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from tests.conftest_broker import kafka_broker  # noqa: F401  (imports kafka-python quietly first)
from tests.conftest_tls import CLIENT_KEY_PASSWORD, TlsBroker, make_pki

from streamsvi.io import JsonCodec
from streamsvi.io._kafka import KafkaSecurityError
from streamsvi.io.broker import create_topic
from streamsvi.io.deadletter import KafkaDeadLetterSink
from streamsvi.io.produce import produce_rows
from streamsvi.io.sources import DeadLetter, KafkaSource, Position
from streamsvi.service.config import ConfigError, client_security, validate
from streamsvi.service.tomlw import dump_toml
from streamsvi.service import exitcodes
from streamsvi.service.daemon import Daemon

STREAMSVI = os.path.join(os.path.dirname(sys.executable), "streamsvi")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(pki, tmp_path_factory):
    with TlsBroker(tmp_path_factory.mktemp("tls"), pki["server_cert"], pki["server_key"]) as tb:
        yield tb


@pytest.fixture(scope="module")
def mtls_broker(pki, tmp_path_factory):
    """Requires a client certificate signed by the test CA."""
    with TlsBroker(tmp_path_factory.mktemp("mtls"), pki["server_cert"], pki["server_key"],
                   client_ca=pki["ca"]) as tb:
        yield tb


def _config(tmp_path, bootstrap, topic, **source):
    return {"model": {"kind": "gmm", "n_components": 2, "n_features": 2},
            "inference": {"n_total": 1000, "batch_size": 50},
            "source": {"bootstrap_servers": bootstrap, "topics": [topic], "group_id": f"g-{topic}",
                       "connect_attempts": 2, "connect_backoff_seconds": 0.1,
                       "dead_letter_topic": f"{topic}-dead", **source},
            "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 1},
            "metrics": {"enabled": False, "progress_seconds": 0.0}}


def _rows(n=300, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-3, 0.5, (n // 2, 2)), rng.normal(3, 0.5, (n - n // 2, 2))])


def _topic():
    return f"sec-{uuid.uuid4().hex[:10]}"


def test_daemon_learns_over_tls_with_every_client_secured(tls_broker, pki, tmp_path):
    """produce (CLI config), the daemon's consumer, highwater probes (n_total = auto) and its
    dead-letter producer all go through the TLS endpoint; the plain listener is never given."""
    topic = _topic()
    cfg = validate(_config(tmp_path, tls_broker.bootstrap, topic, security_protocol="SSL",
                           ssl_cafile=str(pki["ca"])) | {"inference": {"n_total": "auto", "batch_size": 50}})
    security = client_security(cfg)
    assert security == {"security_protocol": "SSL", "ssl_cafile": str(pki["ca"]), "ssl_check_hostname": True}
    create_topic(tls_broker.bootstrap, topic, partitions=2, security=security)
    create_topic(tls_broker.bootstrap, f"{topic}-dead", security=security)
    rows = _rows()
    assert produce_rows(tls_broker.bootstrap, topic, rows, JsonCodec(2), partitions=2,
                        security=security) == len(rows)
    # one bad record, so the dead-letter producer has something to write over TLS
    produce_rows(tls_broker.bootstrap, topic, np.array([[1e300, 0.0]]), JsonCodec(2), security=security)
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained", res
    assert res.records + res.heldout == len(rows) and res.dead == 1
    # the dead letter is on its topic (read over TLS)
    with KafkaSource(tls_broker.bootstrap, f"{topic}-dead", group_id=f"r-{topic}", codec=JsonCodec(1),
                     security=security) as dead:
        dead.wait_for_assignment(timeout_s=30)
        marks = dead.highwater_marks(dead.partitions())   # the source's probe, over TLS too
    assert marks == {(f"{topic}-dead", 0): 1}


def test_plain_clients_cannot_use_the_tls_endpoint(tls_broker):
    """The endpoint really is TLS only: a plaintext client is refused, and told why."""
    with pytest.raises(KafkaSecurityError, match="speaks TLS but security_protocol is 'PLAINTEXT'"):
        produce_rows(tls_broker.bootstrap, "x", np.zeros((1, 2)), JsonCodec(2), connect_attempts=1,
                     producer_config={"bootstrap_timeout_ms": 2000})


def test_streamsvi_run_with_ssl_against_a_plaintext_listener_names_the_mismatch(kafka_broker, pki, tmp_path):
    """security_protocol = "SSL" pointed at a plain listener: kafka-python 3.0's TLS handshake has no
    time limit and tansu waits for the rest of what it reads as a 369 MB request, so the daemon used
    to hang silently (connect_attempts never applied). Now: one line naming the mismatch, within
    seconds, and the exit code of a setting to fix."""
    topic = _topic()
    cfg_path = tmp_path / "ssl-to-plain.toml"
    cfg_path.write_text(dump_toml(_config(tmp_path, kafka_broker.bootstrap, topic, security_protocol="SSL",
                                      ssl_cafile=str(pki["ca"]))))
    t0 = time.monotonic()
    proc = subprocess.run([STREAMSVI, "run", "--config", str(cfg_path), "--until-drained"],
                          capture_output=True, text=True, timeout=90)
    elapsed = time.monotonic() - t0
    assert proc.returncode == exitcodes.USAGE, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("streamsvi: error: ")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert f"{kafka_broker.bootstrap} is not a TLS listener" in errors[0]
    assert "did not answer a TLS ClientHello" in errors[0] and "answers Kafka requests in plaintext" in errors[0]
    assert "security_protocol is 'SSL'" in errors[0]
    assert "set source.security_protocol = 'PLAINTEXT' or point source.bootstrap_servers at the TLS " \
           "listener" in errors[0]
    assert "Traceback" not in proc.stderr
    assert elapsed < 30, f"{elapsed:.1f} s to the error"     # no hang (about 5 s here)


def test_a_wrong_ca_fails_with_a_clear_error(tls_broker, pki, tmp_path):
    topic = _topic()
    cfg = validate(_config(tmp_path, tls_broker.bootstrap, topic, security_protocol="SSL",
                           ssl_cafile=str(pki["other_ca"])))
    with pytest.raises(KafkaSecurityError) as err:
        KafkaSource(tls_broker.bootstrap, topic, group_id="g", codec=JsonCodec(2), connect_attempts=1,
                    connect_timeout_s=2, security=client_security(cfg))
    msg = str(err.value)
    assert "was not accepted" in msg and "set source.ssl_cafile" in msg and str(pki["other_ca"]) in msg
    # the daemon: a one-line error and exit code 2, not a retry loop or a traceback
    cfg_path = tmp_path / "wrong-ca.toml"
    cfg_path.write_text(dump_toml(_config(tmp_path, tls_broker.bootstrap, topic, security_protocol="SSL",
                                      ssl_cafile=str(pki["other_ca"]))))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(cfg_path), "--until-drained"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "streamsvi: error: " in proc.stderr and "set source.ssl_cafile" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_certificate_for_another_host_fails_unless_hostname_checks_are_off(pki, tmp_path):
    with TlsBroker(tmp_path / "elsewhere", pki["elsewhere_cert"], pki["elsewhere_key"]) as tb:
        security = {"security_protocol": "SSL", "ssl_cafile": str(pki["ca"])}
        with pytest.raises(KafkaSecurityError, match="is not valid for '127.0.0.1'.*ssl_check_hostname"):
            create_topic(tb.bootstrap, "t", security=security, timeout_s=3)
        # the certificate is signed by the CA: only the name was wrong
        assert create_topic(tb.bootstrap, "t", security={**security, "ssl_check_hostname": False})


def test_mutual_tls_with_an_encrypted_client_key(mtls_broker, pki, tmp_path, monkeypatch):
    topic = _topic()
    monkeypatch.setenv("STREAMSVI_TEST_KEY_PW", CLIENT_KEY_PASSWORD)
    cfg = validate(_config(tmp_path, mtls_broker.bootstrap, topic, security_protocol="SSL",
                           ssl_cafile=str(pki["ca"]), ssl_certfile=str(pki["client_cert"]),
                           ssl_keyfile=str(pki["client_key"]), ssl_password_env="STREAMSVI_TEST_KEY_PW"))
    security = client_security(cfg)
    assert security["ssl_password"] == CLIENT_KEY_PASSWORD
    create_topic(mtls_broker.bootstrap, topic, security=security)
    with KafkaDeadLetterSink(mtls_broker.bootstrap, topic, security=security) as sink:
        sink.send(DeadLetter(Position("points", 0, 7), "json_invalid", "not JSON", b"{"))
        sink.flush()
    with KafkaSource(mtls_broker.bootstrap, topic, group_id=f"g-{topic}", codec=JsonCodec(1),
                     security=security) as src:
        src.wait_for_assignment(timeout_s=30)
        assert src.highwater_marks(src.partitions()) \
            == {(topic, 0): 1}
    # without the client certificate the broker refuses the connection, and the error says so
    no_cert = {k: v for k, v in security.items() if k in ("security_protocol", "ssl_cafile")}
    with pytest.raises(KafkaSecurityError, match="requires a client certificate|refused"):
        produce_rows(mtls_broker.bootstrap, topic, np.zeros((1, 2)), JsonCodec(2), connect_attempts=1,
                     producer_config={"bootstrap_timeout_ms": 2000}, security=no_cert)


def test_a_wrong_key_password_is_refused_at_load(pki, tmp_path, monkeypatch):
    monkeypatch.setenv("STREAMSVI_TEST_KEY_PW", "not-the-password")
    raw = _config(tmp_path, "127.0.0.1:9", "t", security_protocol="SSL", ssl_cafile=str(pki["ca"]),
                  ssl_certfile=str(pki["client_cert"]), ssl_keyfile=str(pki["client_key"]),
                  ssl_password_env="STREAMSVI_TEST_KEY_PW")
    with pytest.raises(ConfigError, match="source.ssl_certfile: cannot load the client certificate.*"
                                          "password .* is wrong"):
        validate(raw)
    del raw["source"]["ssl_password_env"]            # encrypted key, no password: no terminal prompt
    with pytest.raises(ConfigError, match="the key is encrypted"):
        validate(raw)
    with pytest.raises(ConfigError, match="source.ssl_cafile: .* holds no usable PEM"):
        validate(_config(tmp_path, "127.0.0.1:9", "t", security_protocol="SSL",
                         ssl_cafile=str(pki["client_key"])))


def test_cli_produce_uses_the_config_security(tls_broker, pki, tmp_path):
    """``streamsvi produce --config``: the daemon config's brokers and TLS settings."""
    topic = _topic()
    cfg = _config(tmp_path, tls_broker.bootstrap, topic, security_protocol="SSL", ssl_cafile="pki/ca.pem")
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.pem").write_bytes(pki["ca"].read_bytes())   # relative to the config file
    (tmp_path / "c.toml").write_text(dump_toml(cfg))
    proc = subprocess.run([STREAMSVI, "produce", "--config", str(tmp_path / "c.toml"), "--topic", topic,
                           "--dataset", "blobs", "--n", "40", "--partitions", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    security = client_security(validate(cfg, base_dir=tmp_path))
    assert security["ssl_cafile"] == str(tmp_path / "pki" / "ca.pem")
    with KafkaSource(tls_broker.bootstrap, topic, group_id=f"g-{topic}", codec=JsonCodec(2),
                     security=security) as src:
        src.wait_for_assignment(timeout_s=30)
        assert src.highwater_marks(src.partitions()) \
            == {(topic, 0): 40}
