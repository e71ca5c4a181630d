"""Fixtures and helpers for the daemon's end-to-end tests.

Everything here is real: the shared tansu broker (``tests/conftest_broker.py``),
TOML config files on disk, checkpoint directories, and ``streamsvi run`` as a
subprocess where a test needs signals or ``kill -9``.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

# first: it imports kafka-python quietly (its import-time DeprecationWarnings)
from tests.conftest_broker import kafka_broker, new_group, new_topic, read_topic  # noqa: F401, I001
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from streamsvi.service.tomlw import dump_toml

STREAMSVI = str(Path(sys.executable).with_name("streamsvi"))


# ------------------------------------------------------------------ data
def blob_rows(n: int, seed: int = 0) -> np.ndarray:
    """``n`` 2-D records from three well-separated Gaussian clusters."""
    rng = np.random.default_rng(seed)
    centres = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, -1.0]])
    return centres[rng.integers(0, 3, n)] + rng.normal(scale=0.7, size=(n, 2))


def produce_raw(bootstrap: str, topic: str, payloads, partitions: int | None = None):
    """Write raw message bytes; message i goes to partition ``i % partitions``.

    Returns the ``(partition, offset)`` of every message, in order.
    """
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                             max_request_size=4 << 20)
    try:
        futures = [producer.send(topic, value=p, partition=None if partitions is None else i % partitions)
                   for i, p in enumerate(payloads)]
        producer.flush(timeout=30)
        meta = [f.get(timeout=30) for f in futures]
    finally:
        producer.close()
    return [(m.partition, m.offset) for m in meta]


def highwater_marks(bootstrap: str, topic: str, partitions: int, timeout_s: float = 15.0) -> dict:
    """``{(topic, p): highwater}`` from fetch responses (``end_offsets`` is wrong on tansu)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            c.poll(timeout_ms=200, max_records=1)
            hw = {(tp.topic, tp.partition): c.highwater(tp) for tp in tps}
            if None not in hw.values():
                return hw
        raise AssertionError(f"no highwater marks for {topic} within {timeout_s} s")
    finally:
        c.close()


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict:
    """The group's committed offsets ``{(topic, p): offset}`` (absent if none), without joining it."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        out = {}
        for p in range(partitions):
            off = c.committed(TopicPartition(topic, p))
            if off is not None:
                out[(topic, p)] = int(off)
        return out
    finally:
        c.close(autocommit=False)


def snapshot_offsets(snap) -> dict:
    """The offsets a snapshot covers as ``{(topic or path, partition): next offset}``."""
    return {(o["source"], int(o["partition"])): int(o["offset"]) for o in snap.offsets}


def snapshot_number(ck_dir: Path) -> int:
    """The number the checkpoint directory's ``latest`` pointer names (0 before the first)."""
    try:
        return int((ck_dir / "latest").read_text().strip().rsplit("-", 1)[1])
    except (FileNotFoundError, ValueError, IndexError):
        return 0


# ---------------------------------------------------------------- configs
def gmm_config(tmp_path: Path, *, bootstrap=None, topic=None, group=None, name="ck", **sections) -> dict:
    """A raw (unvalidated) config for a 3-component 2-D GMM; ``sections`` override per section."""
    cfg = {
        "model": {"kind": "gmm", "n_components": 3, "n_features": 2, "weight_concentration": 1.0,
                  "mean_precision": 0.1, "scale": 1.0},
        "inference": {"n_total": 5000, "batch_size": 50, "max_wait_seconds": 1.0,
                      "effective_batch_size": 20, "tau0": 1.0, "kappa": 0.7, "seed": 3},
        "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "codec": "json",
                   "topics": [topic] if topic else None, "group_id": group,
                   "connect_attempts": 3, "connect_backoff_seconds": 0.2},
        "validation": {},
        "checkpoint": {"directory": str(tmp_path / name), "every_batches": 5, "keep": 3},
        "metrics": {"enabled": False, "port": 0, "heldout_size": 20, "heldout_every": 5,
                    "progress_seconds": 0.0},
    }
    for section, over in sections.items():
        cfg[section] = {**cfg.get(section, {}), **over}
    return {section: {k: v for k, v in fields.items() if v is not None}   # None = the default
            for section, fields in cfg.items()}


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(dump_toml(cfg))
    return path


class Feed(threading.Thread):
    """Produce ``rows`` to ``topic`` a chunk at a time while a test runs (started by :meth:`begin`).

    A kill test must kill processes mid-stream. With everything produced up front, a scale-out
    run drains 30,000 records in about two seconds, and on a loaded machine the test's own
    process may notice "λ has N records" only after the end: the kill then lands on an idle
    worker, and workers run with ``--until-drained`` have stopped. A feed keeps records
    arriving, paced, until it has produced them all (:meth:`finish` waits for that); with
    ``hold`` < 1 it stops at that fraction until :meth:`release`, so that a process killed
    before the release has work left for its successor however fast the others are.
    ``produce(part)`` writes one chunk (default: JSON rows, round-robin over ``partitions``);
    ``rows`` is anything ``len`` and slices work on (an array, a list of payloads, Ratings).
    """

    def __init__(self, bootstrap, topic, rows, partitions, chunk=600, pace_s=0.1, produce=None,
                 hold=1.0):
        super().__init__(daemon=True)
        from streamsvi.io import JsonCodec, produce_rows

        self.rows, self.chunk, self.pace_s = rows, int(chunk), float(pace_s)
        self.n = len(rows)
        self.hold_at = int(hold * self.n)    # produce no further until release()
        self._released = threading.Event()
        self.produce = produce or (lambda part: produce_rows(bootstrap, topic, part,
                                                             JsonCodec(np.shape(part)[1]),
                                                             partitions=partitions))
        self.produced = 0
        self.error = None
        self._stop_feed = threading.Event()

    def begin(self):
        """Produce the first chunk now, then the rest in the background."""
        self.produce(self.rows[:self.chunk])
        self.produced = min(self.chunk, self.n)
        self.start()
        return self

    def run(self):
        try:
            for i in range(self.chunk, self.n, self.chunk):
                if self._stop_feed.wait(self.pace_s):
                    return
                if i >= self.hold_at:
                    while not self._released.wait(0.1):
                        if self._stop_feed.is_set():
                            return
                self.produce(self.rows[i:i + self.chunk])
                self.produced += min(self.chunk, self.n - i)
        except Exception as exc:  # noqa: BLE001 - reported by finish()
            self.error = exc

    def finish(self, timeout_s=300.0) -> int:
        """Wait until every row is produced; the number produced."""
        self.join(timeout_s)
        assert not self.is_alive(), "the feed did not finish"
        if self.error is not None:
            raise self.error
        return self.produced

    def release(self):
        """Produce the rows past ``hold`` (a fraction of them) too."""
        self._released.set()

    def cancel(self):
        self._stop_feed.set()


# ------------------------------------------------------------ subprocesses
class DaemonProcess:
    """``streamsvi run --config FILE ...`` as a subprocess, output in files next to the config."""

    def __init__(self, config: Path, *args, tag: str = "run"):
        self.stdout_path = config.with_name(f"{config.stem}.{tag}.out")
        self.stderr_path = config.with_name(f"{config.stem}.{tag}.err")
        self._out = open(self.stdout_path, "wb")
        self._err = open(self.stderr_path, "wb")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([STREAMSVI, "run", "--config", str(config), *args],
                                     stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                                     env=env)
        self.started = time.monotonic()

    @property
    def pid(self):
        return self.proc.pid

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout_s: float = 30.0) -> float:
        """Wait until ``text`` shows up in stderr; returns the seconds since start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.stderr():
                return time.monotonic() - self.started
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited ({self.proc.returncode}) before printing "
                                     f"{text!r}:\n{self.stderr()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError(f"daemon did not print {text!r} within {timeout_s} s:\n{self.stderr()[-3000:]}")

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        finally:
            self._out.close()
            self._err.close()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def daemons():
    """Start ``DaemonProcess``es; any still running at the end of the test is killed (by pid)."""
    started = []

    def start(config, *args, tag="run"):
        d = DaemonProcess(config, *args, tag=tag)
        started.append(d)
        return d

    yield start
    for d in started:
        d.kill()
        for f in (d._out, d._err):
            f.close()
