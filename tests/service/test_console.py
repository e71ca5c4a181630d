"""A quiet, true console (issue 16 item 5) and the early-SIGTERM race (item 6).

Everything runs for real: ``streamsvi`` as a subprocess, the shared tansu
broker, a port nobody listens on, files and directories on disk.
"""
import logging
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec, produce_rows
from streamsvi.io.broker import free_port
from streamsvi.service import exitcodes
from streamsvi.service.console import KafkaNoiseFilter, quiet_kafka

from .conftest import STREAMSVI, blob_rows, gmm_config, write_config

ROOT = Path(__file__).resolve().parents[2]
#: A line logged by kafka-python ("... INFO kafka.net.manager: ...").
KAFKA_LINE = re.compile(r"^\S+ \S+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) kafka[.:]", re.M)


def _run(*args, timeout=120, cwd=None):
    return subprocess.run([STREAMSVI, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


# ------------------------------------------------------------ quiet by default
def test_run_is_quiet_by_default_and_log_level_info_brings_kafka_back(kafka_broker, new_topic,
                                                                      new_group, tmp_path):
    topic = new_topic(1)
    produce_rows(kafka_broker.bootstrap, topic, blob_rows(400, seed=1), JsonCodec(2))
    out = {}
    for tag, extra in (("default", []), ("info", ["--log-level", "INFO"])):
        config = write_config(tmp_path / f"{tag}.toml", gmm_config(
            tmp_path, bootstrap=kafka_broker.bootstrap, topic=topic, group=new_group(), name=tag,
            inference={"max_wait_seconds": 0.5}))
        proc = _run("run", "--config", config, "--until-drained", *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "stopped (drained)" in proc.stderr
        out[tag] = proc.stderr
    quiet = out["default"]
    assert not KAFKA_LINE.search(quiet), quiet
    assert "ERROR" not in quiet and "Traceback" not in quiet, quiet
    assert "INFO streamsvi.daemon: no checkpoint in" in quiet        # streamsvi's own INFO stays
    assert re.search(r"^\S+ \S+ INFO kafka\.", out["info"], re.M), out["info"][-3000:]
    assert "ERROR" not in out["info"], out["info"][-3000:]


def test_closing_kafka_clients_logs_no_error_at_the_cli_level(kafka_broker, new_topic, tmp_path):
    """kafka-python 3.0.x may log ERROR from its IO thread while a client is closed from
    the caller's thread (a read on the just-closed transport, a metadata request
    cancelled); with the CLI's logging set-up a clean close prints nothing.

    The race shows when the IO thread waits for the GIL, as it does in the daemon
    while the model updates: a thread of pure-Python work stands for that here.
    With ``logging.basicConfig(level=WARNING)`` (the demo's set-up before) the
    same 100 closes printed 5-25 ERROR lines."""
    topic = new_topic(1)
    produce_rows(kafka_broker.bootstrap, topic, blob_rows(15000, seed=2), JsonCodec(2))
    script = tmp_path / "close_many.py"
    script.write_text(
        "import sys, threading\n"
        "from streamsvi.service.console import setup_logging\n"
        "from kafka import KafkaConsumer, TopicPartition\n"
        "setup_logging(None)\n"
        "def highwater(bootstrap, topic):\n"
        "    # a short-lived group-less consumer: one fetch for the mark, then close (the race)\n"
        "    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,\n"
        "                      fetch_max_wait_ms=100, max_partition_fetch_bytes=1 << 16)\n"
        "    try:\n"
        "        tp = TopicPartition(topic, 0)\n"
        "        c.assign([tp])\n"
        "        c.seek_to_beginning(tp)\n"
        "        while c.highwater(tp) is None:\n"
        "            c.poll(timeout_ms=200, max_records=1)\n"
        "        return c.highwater(tp)\n"
        "    finally:\n"
        "        c.close()\n"
        "stop = threading.Event()\n"
        "def busy():\n"
        "    while not stop.is_set():\n"
        "        sum(i * i for i in range(20000))\n"
        "threading.Thread(target=busy, daemon=True).start()\n"
        "for _ in range(100):\n"
        f"    assert highwater({kafka_broker.bootstrap!r}, {topic!r}) == 15000\n"
        "stop.set()\n"
        "print('closed 100 clients', file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "closed 100 clients" in proc.stderr, proc.stderr[-3000:]
    assert "ERROR" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _record(name, level, msg, *args, exc=None):
    return logging.LogRecord(name, level, __file__, 1, msg, args,
                             (type(exc), exc, None) if exc is not None else None)


def test_noise_filter_lowers_close_races_and_start_up_attempts_only():
    from kafka.errors import Cancelled, KafkaConnectionError

    f = KafkaNoiseFilter(logging.WARNING)
    cancelled = _record("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s", Cancelled())
    assert not f.filter(cancelled) and cancelled.levelname == "DEBUG"
    lost = _record("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s",
                   KafkaConnectionError("111 ECONNREFUSED"))
    assert f.filter(lost) and lost.levelname == "ERROR"               # a real failure stays
    done = _record("kafka.net.selector", logging.ERROR, "Unhandled exception in task %s:", "<Task>",
                   exc=RuntimeError("Task is already done!"))          # finished by the closing thread
    assert not f.filter(done) and done.levelname == "DEBUG"
    other = _record("kafka.net.selector", logging.ERROR, "Unhandled exception in task %s:", "<Task>",
                    exc=RuntimeError("something else"))
    assert f.filter(other) and other.levelname == "ERROR"
    refused = _record("kafka.net.manager", logging.ERROR, "Connection failed: %s", "ECONNREFUSED")
    with quiet_kafka() as seen:                                       # streamsvi connecting
        logging.getLogger("kafka.net.manager").handle(
            _record("kafka.net.manager", logging.ERROR, "Connection failed: %s", "ECONNREFUSED"))
        assert not f.filter(refused) and refused.levelname == "INFO"
    assert seen.last() == "Connection failed: ECONNREFUSED"
    again = _record("kafka.net.manager", logging.ERROR, "Connection failed: %s", "ECONNREFUSED")
    assert f.filter(again) and again.levelname == "ERROR"              # outside the block: shown
    own = _record("streamsvi.daemon", logging.INFO, "no checkpoint")
    assert f.filter(own)


def test_noise_filter_shows_a_repeated_kafka_complaint_once_a_minute():
    """Issue 30: a 25 s outage printed 71-74 kafka-python ERROR lines, most of them the same."""
    from kafka.errors import KafkaConnectionError

    now = [0.0]
    f = KafkaNoiseFilter(logging.WARNING, clock=lambda: now[0])
    shown = []
    for i in range(72):                                     # one every 0.35 s: a 25 s outage
        now[0] = 0.35 * i
        conn = f"<KafkaConnection node_id=bootstrap-{i % 3} host=127.0.0.1:9092>: "
        for rec in (_record("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s",
                            KafkaConnectionError("socket disconnected")),
                    _record("kafka.net.manager", logging.ERROR, conn + "Connection failed: %s", "ECONNREFUSED")):
            if f.filter(rec):
                shown.append(rec.getMessage())
    assert shown == ["Metadata refresh: failed KafkaConnectionError: socket disconnected",
                     "<KafkaConnection node_id=bootstrap-0 host=127.0.0.1:9092>: Connection failed: ECONNREFUSED"]
    assert f.repeats == 2 * 72 - 2
    now[0] = 0.35 * 71 + 61                                 # a minute later: shown again
    again = _record("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s",
                    KafkaConnectionError("socket disconnected"))
    assert f.filter(again) and again.levelname == "ERROR"
    other = _record("kafka.cluster", logging.ERROR, "Metadata refresh: failed %s",
                    KafkaConnectionError("111 ECONNREFUSED"))       # a different complaint: shown
    assert f.filter(other)


# ------------------------------------------------------------------ the demo
def _demo(workdir, *extra):
    proc = _run("demo", "--workdir", workdir, *extra, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_demo_default_seed_gives_the_same_result_twice(tmp_path):
    runs = [_demo(tmp_path / f"d{i}", "--passes", "6") for i in range(2)]
    snaps = [load_snapshot(tmp_path / f"d{i}" / "checkpoints") for i in range(2)]
    assert snaps[0].state.step == snaps[1].state.step
    lam0, lam1 = snaps[0].state.lam, snaps[1].state.lam
    assert sorted(lam0) == sorted(lam1)
    for k in lam0:
        assert np.array_equal(lam0[k], lam1[k]), k                     # bit-identical
    heldout = [re.search(r"^  streamsvi_prequential_loglik_per_record (\S+)$", p.stdout, re.M).group(1)
               for p in runs]
    assert heldout[0] == heldout[1], heldout
    for p in runs:                                                     # and a quiet console
        assert p.stderr == "", p.stderr[-3000:]
        assert re.search(r"^step +\d+  records +\d+ +\d+ rec/s  ELBO/rec +-?\d+\.\d+  rho \d\.\d+  "
                         r"lag 0  lpd -?\d+\.\d+$", p.stdout, re.M), p.stdout


def _readme_demo_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## What the demo prints"):]
    return section.split("```", 2)[1].strip("\n").splitlines()


def _shape(line: str) -> str:
    """A printed line with what varies between runs and machines masked."""
    line = re.sub(r"\S*/checkpoints(/snap-\d+)?", "CKPT", line)      # where the snapshots are
    line = re.sub(r"127\.0\.0\.1:\d+", "HOST:PORT", line)
    line = re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "N", line)
    return re.sub(r"\s+", " ", line).strip()


def test_readme_shows_what_the_demo_prints(tmp_path):
    out = _demo(tmp_path / "demo").stdout.splitlines()
    progress = [i for i, ln in enumerate(out) if ln.startswith("step ")]
    assert progress, "the demo printed no progress line"
    # a progress line every metrics.progress_seconds: how many depends on the machine's
    # speed; the README shows the last one, printed at the clean stop
    out = [ln for i, ln in enumerate(out) if i not in progress[:-1]]
    assert [_shape(ln) for ln in _readme_demo_block()] == [_shape(ln) for ln in out], "\n".join(out)


# ---------------------------------------------------------- start-up failures
def _one_error_line(stderr: str, starts: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    assert not KAFKA_LINE.search(stderr), stderr[-3000:]
    errors = [ln for ln in stderr.splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and errors[0].startswith(starts), stderr[-3000:]
    return errors[0]


def test_unreachable_broker_is_one_line_and_exit_3(tmp_path):
    port = free_port()                                   # free a moment ago: nobody listens
    config = write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap=f"127.0.0.1:{port}", topic="t", group="g",
        source={"connect_attempts": 1, "connect_backoff_seconds": 0.1}))
    proc = _run("run", "--config", config, "--until-drained")
    assert proc.returncode == exitcodes.BROKER_UNREACHABLE == 3, proc.stderr[-3000:]
    line = _one_error_line(proc.stderr, f"streamsvi: error: cannot reach Kafka at 127.0.0.1:{port} "
                                        f"after 1 attempt over ")
    assert "check source.bootstrap_servers" in line and "ECONNREFUSED" in line, line


def _file_config(tmp_path, **source):
    data = tmp_path / "data.jsonl"
    data.write_text("[1.0, 2.0]\n" * 30)
    return gmm_config(tmp_path, source={"kind": "file", "path": str(data), "bootstrap_servers": None,
                                        "codec": "json", "connect_attempts": None,
                                        "connect_backoff_seconds": None, **source})


BAD_PATHS = {
    "checkpoint dir under a file": (
        lambda tmp: _file_config(tmp) | {"checkpoint": {"directory": str(tmp / "afile" / "ck")}},
        "streamsvi: error: checkpoint.directory: cannot write snapshots in "),
    "missing source file": (
        lambda tmp: _file_config(tmp, path=str(tmp / "nope.jsonl")),
        "streamsvi: error: source.path: "),
    "source path a directory": (
        lambda tmp: _file_config(tmp, path=str(tmp)),
        "streamsvi: error: source.path: "),
}


@pytest.mark.parametrize("case", sorted(BAD_PATHS))
def test_bad_path_is_one_line_and_exit_2(tmp_path, case):
    make, starts = BAD_PATHS[case]
    (tmp_path / "afile").write_text("not a directory\n")
    config = write_config(tmp_path / "run.toml", make(tmp_path))
    proc = _run("run", "--config", config, "--until-drained")
    assert proc.returncode == exitcodes.USAGE == 2, proc.stderr[-3000:]
    _one_error_line(proc.stderr, starts)
    assert proc.stderr.count("\n") == 1, proc.stderr          # nothing started before it


def test_config_path_a_directory_is_one_line_and_exit_2(tmp_path):
    proc = _run("run", "--config", tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr == f"streamsvi: error: config {tmp_path} is a directory; give a TOML file\n"


def test_exit_codes_are_documented_once():
    text = (ROOT / "README.md").read_text()
    table = dict(re.findall(r"^\| `(\d+)` \| (.+?) \|$", text, re.M))
    assert sorted(map(int, table)) == [code for code, _ in exitcodes.TABLE], table
    helptext = _run("run", "--help").stdout
    for code, meaning in exitcodes.TABLE:
        assert re.search(rf"^  {code} +{re.escape(meaning)}$", helptext, re.M), helptext


# --------------------------------------------------------------- early SIGTERM
def _wait_until(proc, condition, what, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"streamsvi exited ({proc.returncode}) before {what}")
        try:
            if condition():
                return
        except FileNotFoundError:          # /proc entry gone: the process just ended
            continue
    raise AssertionError(f"not {what} within {timeout_s} s")


def _maps(pid) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def _sigterm_run_when(tmp_path, ready, what):
    """Start ``streamsvi run`` (brokers unreachable), SIGTERM it once ``ready(pid)``;
    returns its exit code and stderr."""
    config = write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap="127.0.0.1:9", topic="t", group="g", source={"connect_attempts": 1}))
    proc = subprocess.Popen([STREAMSVI, "run", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_until(proc, lambda: ready(proc.pid), what)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    return proc.returncode, err


#: Points of the start-up, each seen from outside: the shared objects numpy,
#: kafka-python (crc32c) and scipy load, in the order ``streamsvi run`` imports them.
START_POINTS = {"numpy loaded": "_multiarray_umath", "kafka-python loaded": "crc32c",
                "scipy loaded": "scipy/special"}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("point", list(START_POINTS))
def test_sigterm_while_starting_is_a_clean_stop_not_minus_15(tmp_path, point):
    """Before the fix the handlers came with the daemon, after every import and the
    config: a SIGTERM while numpy or kafka-python was loading killed the process (-15)."""
    returncode, err = _sigterm_run_when(tmp_path, lambda pid: START_POINTS[point] in _maps(pid), point)
    assert returncode == exitcodes.OK, (returncode, err[-3000:])
    assert "stopped (SIGTERM)" in err and "Traceback" not in err, err[-3000:]
    assert "cannot reach Kafka" not in err                  # stopped before connecting


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigterm_the_moment_the_handler_is_in_place(tmp_path):
    """The first instant streamsvi's code can catch SIGTERM (its bit in SigCgt): still exit 0."""
    returncode, err = _sigterm_run_when(tmp_path, _sigterm_caught, "SIGTERM caught")
    assert returncode == 0, (returncode, err[-3000:])
    assert "stopped (SIGTERM)" in err and "Traceback" not in err, err[-3000:]


def _sigterm_caught(pid) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_other_commands_still_end_at_once_on_sigterm(tmp_path):
    """Only run and demo defer signals: ``compare`` (no daemon) is ended by SIGTERM as usual."""
    proc = subprocess.Popen([STREAMSVI, "compare", "--epochs", "100000", "--inits", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # numpy is loaded after the early handler is in place, so numpy loaded and SIGTERM
        # not caught means the command gave SIGTERM back to its default
        _wait_until(proc, lambda: "_multiarray_umath" in _maps(proc.pid)
                    and not _sigterm_caught(proc.pid), "SIGTERM back to its default")
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == -signal.SIGTERM
