"""Start-up failures a user can fix: one line on stderr, never a traceback, the documented
exit code (issue 28, item 4); and the warning about a topic that yields nothing.

Everything runs for real: ``streamsvi`` as a subprocess, the shared tansu broker, a port
that something else listens on, a matplotlib that cannot be imported.
"""
import io
import logging
import os
import socket
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from streamsvi.io import JsonCodec, produce_rows
from streamsvi.io.broker import free_port
from streamsvi.service import exitcodes
from tests.conftest_broker import kafka_broker, new_group, new_topic  # noqa: F401
from tests.service.conftest import STREAMSVI, blob_rows, gmm_config, write_config

ROOT = Path(__file__).resolve().parents[1]
LINE_END = "(a misspelt source.topics, or nothing produced to it yet)"


def _run(*args, timeout=120, env=None):
    return subprocess.run([STREAMSVI, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _only_line(proc, code: int) -> str:
    """The one line ``proc`` printed on stderr, after checking there is no traceback and the
    exit code is ``code``."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == code, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("streamsvi: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    return errors[0]


# ------------------------------------------------------------------ busy metrics port
@pytest.fixture
def busy_port():
    """A port of 127.0.0.1 that another process's socket listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _metrics_config(tmp_path, port, host="127.0.0.1", **sections):
    return write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap=f"127.0.0.1:{free_port()}", topic="t", group="g",
        metrics={"enabled": True, "host": host, "port": port}, **sections))


@pytest.mark.parametrize("role", ["single", "worker", "applier"])
def test_a_busy_metrics_port_is_one_line_and_exit_2(tmp_path, busy_port, role):
    """It was a traceback ending in ``OSError: [Errno 98] Address already in use``, exit 1.
    Every role serves metrics first, before it looks for the brokers (none listens here)."""
    config = _metrics_config(tmp_path, busy_port, scaleout={"deltas_topic": "deltas"})
    extra = ["--until-drained"] if role != "applier" else ["--timeout", "30"]
    proc = _run("run", "--config", config, "--role", role, *extra)
    assert proc.stderr == (
        f"streamsvi: error: metrics.port: cannot serve metrics on 127.0.0.1:{busy_port}: the port is in "
        f"use (another process listens there, such as another streamsvi daemon); set metrics.port to a "
        f"free port, or to 0 for any free port\n"), proc.stderr[-3000:]
    assert proc.returncode == exitcodes.USAGE == 2


def test_a_metrics_host_not_of_this_machine_is_one_line_and_exit_2(tmp_path):
    config = _metrics_config(tmp_path, 9464, host="192.0.2.1")      # TEST-NET-1: nobody's address
    proc = _run("run", "--config", config, "--until-drained")
    line = _only_line(proc, exitcodes.USAGE)
    assert line.startswith("streamsvi: error: metrics.host: cannot serve metrics on 192.0.2.1:9464: "), line
    assert line.endswith("('192.0.2.1' is not an address of this machine); set metrics.host to one of "
                         "its addresses, such as 127.0.0.1 (this machine only) or 0.0.0.0 (every "
                         "interface)"), line


# ------------------------------------------------------------- a topic that does not exist
def _pattern_config(tmp_path, kafka_broker, pattern, group, wait_s):
    return write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap=kafka_broker.bootstrap, group=group,
        source={"pattern": pattern, "assignment_timeout_seconds": wait_s},
        inference={"max_wait_seconds": 0.5}))


def test_a_topic_that_never_appears_is_said_at_once_then_one_line_and_exit_6(tmp_path, kafka_broker,
                                                                             new_group):
    """It waited 60 s in silence (the wait was not a setting), then printed the error."""
    pattern, group, bootstrap = rf"^nothing-{uuid.uuid4().hex[:8]}-\d+", new_group(), kafka_broker.bootstrap
    proc = _run("run", "--config", _pattern_config(tmp_path, kafka_broker, pattern, group, 2),
                "--until-drained")
    assert f"\nwaiting up to 2 s for a topic matching {pattern!r} to appear at {bootstrap} " \
           f"(source.assignment_timeout_seconds)\n" in proc.stderr, proc.stderr[-3000:]
    assert _only_line(proc, exitcodes.NOT_ASSIGNED) == (
        f"streamsvi: error: no partitions of topics matching {pattern!r} were assigned to group "
        f"{group!r} at {bootstrap} within 2 s: no topic matches the subscription yet; create one or "
        f"produce to one (streamsvi produce --config FILE), check source.pattern for a misspelt name, "
        f"or wait longer (source.assignment_timeout_seconds)")
    assert proc.stderr.index("waiting up to") < proc.stderr.index("streamsvi: error:")


def test_a_topic_that_appears_during_the_wait_is_read(tmp_path, kafka_broker, new_group):
    """kafka-python looks for topics matching a pattern every metadata_max_age_ms (5 min): a
    topic created during the wait was not seen before the wait ran out."""
    prefix = f"later-{uuid.uuid4().hex[:8]}"
    config = _pattern_config(tmp_path, kafka_broker, rf"^{prefix}-.*", new_group(), 120)
    proc = subprocess.Popen([STREAMSVI, "run", "--config", str(config), "--until-drained"],
                            stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in proc.stderr:                     # until it says it waits
            lines.append(line)
            if line.startswith("waiting up to 120 s for a topic matching"):
                break
        else:
            raise AssertionError("".join(lines)[-3000:])
        produce_rows(kafka_broker.bootstrap, f"{prefix}-a", blob_rows(300, seed=5), JsonCodec(2),
                     partitions=1)
        lines += proc.stderr.readlines()
        assert proc.wait(timeout=120) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert any(ln.startswith("stopped (drained): ") and "280 records applied" in ln
               for ln in lines), "".join(lines)[-3000:]                     # 20 held out


def test_assignment_timeout_seconds_is_checked(tmp_path):
    config = write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap="127.0.0.1:9092", topic="t", group="g",
        source={"assignment_timeout_seconds": 0}))
    proc = _run("run", "--config", config)
    assert _only_line(proc, exitcodes.USAGE) == \
        "streamsvi: error: source.assignment_timeout_seconds: must be >= 1, got 0.0"


# ------------------------------------------------------------------------- a missing extra
def test_report_without_matplotlib_is_one_line_and_exit_2(tmp_path):
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('No module named matplotlib (test shim)')\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.jsonl").write_text('{"step": 1, "elbo_per_record": -1.0}\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(shim.parent), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    proc = _run("report", run, "--output", tmp_path / "r.png", env=env)
    assert proc.stderr == "streamsvi: error: streamsvi report needs matplotlib: " \
                          "pip install 'streamsvi[report]'\n", proc.stderr[-3000:]
    assert proc.returncode == exitcodes.USAGE
    assert not (tmp_path / "r.png").exists()


# ------------------------------------------------------------- a topic that yields nothing
def test_a_run_that_read_nothing_from_a_topic_names_it(tmp_path, kafka_broker, new_group):
    """A misspelt topic is created by tansu when the consumer asks for it; the run printed
    ``stopped (drained): 0 batches`` and nothing else."""
    topic = f"misspelt-{uuid.uuid4().hex[:8]}"                      # never created by the test
    config = write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap=kafka_broker.bootstrap, topic=topic, group=new_group(),
        inference={"max_wait_seconds": 0.5}))
    proc = _run("run", "--config", config, "--until-drained")
    assert proc.returncode == exitcodes.OK, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    warned = [ln for ln in proc.stderr.splitlines() if " WARNING " in ln]
    assert len(warned) == 1, proc.stderr[-3000:]
    assert warned[0].endswith(f" WARNING streamsvi.daemon: read no record from topic {topic!r}: "
                              f"it is empty {LINE_END}"), warned[0]
    assert "stopped (drained): 0 batches" in proc.stderr


def test_only_the_empty_topic_of_a_pattern_is_named(tmp_path, kafka_broker, new_topic, new_group):
    prefix = f"some-{uuid.uuid4().hex[:8]}"
    full, empty = new_topic(1, prefix=prefix), new_topic(1, prefix=prefix)
    produce_rows(kafka_broker.bootstrap, full, blob_rows(200, seed=2), JsonCodec(2), partitions=1)
    config = write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap=kafka_broker.bootstrap, group=new_group(),
        source={"pattern": rf"^{prefix}-.*"}, inference={"max_wait_seconds": 0.5}))
    proc = _run("run", "--config", config, "--until-drained")
    assert proc.returncode == exitcodes.OK, proc.stderr[-3000:]
    warned = [ln for ln in proc.stderr.splitlines() if " WARNING " in ln]
    assert len(warned) == 1 and warned[0].endswith(
        f" WARNING streamsvi.daemon: read no record from topic {empty!r}: it is empty (a misspelt "
        f"source.pattern, or nothing produced to it yet)"), proc.stderr[-3000:]
    # a second run of the group reads nothing new from the full topic: not "empty"
    proc = _run("run", "--config", config, "--until-drained")
    assert proc.returncode == exitcodes.OK, proc.stderr[-3000:]
    warned = [ln for ln in proc.stderr.splitlines() if " WARNING " in ln]
    assert len(warned) == 1 and repr(full) not in warned[0] and repr(empty) in warned[0], warned


def test_no_record_since_the_start_is_warned_once(tmp_path, kafka_broker, new_topic, new_group,
                                                  monkeypatch, caplog):
    """While running: no record from any partition for QUIET_START_S after the start."""
    from streamsvi.service import daemon as daemon_mod
    from streamsvi.service.config import validate

    monkeypatch.setattr(daemon_mod, "QUIET_START_S", 1.0)
    topic = new_topic(2)
    cfg = validate(gmm_config(tmp_path, bootstrap=kafka_broker.bootstrap, topic=topic,
                              group=new_group(), inference={"max_wait_seconds": 0.2}))
    daemon = daemon_mod.Daemon(cfg, out=io.StringIO())
    said = threading.Event()

    class _Watch(logging.Handler):                  # stop the run once the warning is out
        def emit(self, record):
            if record.levelname == "WARNING" and "since the start" in record.getMessage():
                said.set()

    watch = _Watch()
    logging.getLogger("streamsvi.daemon").addHandler(watch)
    try:
        t = threading.Thread(target=daemon.run, kwargs={"timeout": 120})
        t.start()
        assert said.wait(60), "no warning"
        daemon.request_stop("test")
        t.join(60)
    finally:
        logging.getLogger("streamsvi.daemon").removeHandler(watch)
    msgs = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
            and r.name == "streamsvi.daemon"]
    assert msgs == [f"no record from topic {topic!r} in the 1 s since the start: it is empty "
                    f"{LINE_END}"], msgs                     # once; not again at the end


# ------------------------------------------------------------------- other start-up paths
def test_sasl_against_a_listener_without_sasl_is_one_line_that_does_not_contradict_itself(
        tmp_path, kafka_broker, new_group, monkeypatch):
    """It said "does not offer the SASL mechanism 'PLAIN' (it offers PLAIN)": tansu answers a
    SaslHandshake on its plain listener with UNSUPPORTED_SASL_MECHANISM, naming the one asked for."""
    monkeypatch.setenv("STREAMSVI_TEST_SASL_PW", "secret")
    group = new_group()
    config = write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap=kafka_broker.bootstrap, topic="t", group=group,
        source={"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN", "sasl_username": "u",
                "sasl_password_env": "STREAMSVI_TEST_SASL_PW", "connect_attempts": 1}))
    proc = _run("run", "--config", config, "--until-drained")
    assert _only_line(proc, exitcodes.USAGE) == (
        f"streamsvi: error: KafkaSource(group_id={group!r}): {kafka_broker.bootstrap} refused a SASL "
        f"login with 'PLAIN' (UNSUPPORTED_SASL_MECHANISM, naming only that mechanism): its listener "
        f"likely has no SASL; check source.security_protocol (PLAINTEXT or SSL for a listener without "
        f"SASL) and source.bootstrap_servers")


def test_a_local_broker_that_cannot_start_is_one_line_and_exit_2(tmp_path):
    """``streamsvi demo`` (and any command that starts the local broker) ended in a traceback
    when no tansu binary could be found or started."""
    env = {**os.environ, "STREAMSVI_TANSU_BIN": str(tmp_path / "no-tansu")}
    proc = _run("demo", "--workdir", tmp_path / "demo", env=env)
    assert proc.stderr == (f"streamsvi: error: $STREAMSVI_TANSU_BIN={str(tmp_path / 'no-tansu')!r} is "
                           f"not an executable file; unset it or point it at a tansu binary\n"), \
        proc.stderr[-3000:]
    assert proc.returncode == exitcodes.USAGE
