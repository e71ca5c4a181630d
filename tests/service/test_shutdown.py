"""Signals: SIGTERM is a clean stop (checkpoint, commit, exit 0); a second one leaves at once.

STYLE.md §9: signal handlers only set a stop flag; a clean shutdown forces a
checkpoint and a commit; a second signal exits immediately without
committing (nothing is lost: the next start resumes from the last durable
checkpoint).
"""
import io
import re
import signal
import threading
import time

from kafka import KafkaProducer

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec, produce_rows
from streamsvi.service.config import load_config
from streamsvi.service.daemon import Daemon

from .conftest import (blob_rows, committed_offsets, gmm_config, snapshot_number, snapshot_offsets,
                       write_config)

H = 20


class _KeepProducing(threading.Thread):
    """Writes good rows to ``topic`` (round-robin over partitions) until stopped."""

    def __init__(self, bootstrap, topic, partitions):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.halt, self.sent, self.error = threading.Event(), 0, None

    def run(self):
        codec, rows = JsonCodec(2), blob_rows(20_000, seed=11)
        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks=1, linger_ms=5)
        try:
            while not self.halt.is_set():
                for _ in range(25):
                    row = rows[self.sent % len(rows)]
                    producer.send(self.topic, codec.encode(row), partition=self.sent % self.partitions)
                    self.sent += 1
                producer.flush(10)
                time.sleep(0.02)
        except Exception as exc:    # reported by the test
            self.error = exc
        finally:
            producer.close()


def test_sigterm_mid_run_checkpoints_commits_and_exits_0(kafka_broker, new_topic, new_group,
                                                         tmp_path, daemons):
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(3), new_group()
    config = write_config(tmp_path / "run.toml", gmm_config(
        tmp_path, bootstrap=bootstrap, topic=topic, group=group,
        inference={"max_wait_seconds": 0.5},
        checkpoint={"every_batches": 5, "every_seconds": 3600.0},
        metrics={"heldout_size": H}))
    ck_dir = tmp_path / "ck"
    producer = _KeepProducing(bootstrap, topic, 3)
    producer.start()
    try:
        d = daemons(config)                      # no stop condition: runs until told
        deadline = time.monotonic() + 60
        while snapshot_number(ck_dir) < 2 and time.monotonic() < deadline:
            assert d.proc.poll() is None, d.stderr()[-3000:]
            time.sleep(0.05)
        before = snapshot_number(ck_dir)
        assert before >= 2, "the daemon made no progress"
        t0 = time.monotonic()
        d.signal(signal.SIGTERM)
        rc = d.wait(30)
        took = time.monotonic() - t0
        assert rc == 0, d.stderr()[-3000:]
        assert took < 5, f"SIGTERM took {took:.1f} s to stop the daemon"
        assert producer.is_alive() and producer.error is None, producer.error
    finally:
        producer.halt.set()
        producer.join(15)

    err = d.stderr()
    m = re.search(r"^checkpoint: (\S+) \(step (\d+), (\d+) records\)$", err, re.M)
    assert m, err[-3000:]
    assert "stopped (SIGTERM)" in err
    final = load_snapshot(ck_dir)
    assert str(final.path) == m.group(1) and final.number > before      # written at shutdown
    assert final.state.step == int(m.group(2)) and final.state.records_seen == int(m.group(3))
    offsets = snapshot_offsets(final)
    assert committed_offsets(bootstrap, group, topic, 3) == offsets
    # every consumed message is a good row: each was applied or held out, exactly once
    assert sum(offsets.values()) == final.state.records_seen + H
    assert sum(offsets.values()) < producer.sent                        # stopped mid-stream


def test_second_signal_exits_at_once_without_committing(kafka_broker, new_topic, new_group, tmp_path,
                                                         daemons):
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(1), new_group()
    fast = dict(bootstrap=bootstrap, topic=topic, group=group, metrics={"heldout_size": H})
    quick_cfg = write_config(tmp_path / "quick.toml", gmm_config(
        tmp_path, inference={"max_wait_seconds": 0.5}, **fast))
    # a slow phase: a poll that waits up to 30 s for a batch of 1000, and no checkpoint on the way
    slow_cfg = write_config(tmp_path / "slow.toml", gmm_config(
        tmp_path, inference={"batch_size": 1000, "max_wait_seconds": 30.0},
        checkpoint={"every_batches": 1000, "every_seconds": 3600.0}, **fast))
    ck_dir = tmp_path / "ck"

    produce_rows(bootstrap, topic, blob_rows(300, seed=12), JsonCodec(2))
    Daemon(load_config(quick_cfg), out=io.StringIO()).run(until_drained=True, timeout=60)
    first = load_snapshot(ck_dir)
    assert snapshot_offsets(first) == {(topic, 0): 300}
    assert committed_offsets(bootstrap, group, topic, 1) == {(topic, 0): 300}

    produce_rows(bootstrap, topic, blob_rows(100, seed=13), JsonCodec(2))
    d = daemons(slow_cfg, tag="slow")
    d.wait_for("partitions assigned", timeout_s=30)
    time.sleep(1.0)                     # the 100 new rows are read; the poll waits for more
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    time.sleep(0.3)
    assert d.proc.poll() is None, "one SIGTERM must not stop the daemon in the middle of a poll"
    d.signal(signal.SIGTERM)
    rc = d.wait(10)
    took = time.monotonic() - t0
    err = d.stderr()
    assert rc != 0 and took < 3, (rc, took, err[-3000:])
    assert "second signal (SIGTERM), exiting without commit" in err
    assert "stopped (" not in err and "checkpoint:" not in err
    assert snapshot_number(ck_dir) == first.number                     # no new checkpoint
    assert committed_offsets(bootstrap, group, topic, 1) == {(topic, 0): 300}

    # nothing is lost: the next start resumes from the last durable checkpoint
    res = Daemon(load_config(quick_cfg), out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.records == 100
    final = load_snapshot(ck_dir)
    assert final.state.records_seen + H == 400
    assert committed_offsets(bootstrap, group, topic, 1) == {(topic, 0): 400} == snapshot_offsets(final)


def test_sigterm_while_waiting_for_partitions_exits_0_promptly(kafka_broker, new_group, tmp_path,
                                                               daemons):
    """A daemon that has not been assigned a partition yet (here: a pattern no topic
    matches) must still honour SIGTERM at once, not after its assignment timeout."""
    config = write_config(tmp_path / "idle.toml", gmm_config(
        tmp_path, bootstrap=kafka_broker.bootstrap, group=new_group(),
        source={"pattern": r"no-such-topic-\d+"}))
    d = daemons(config)
    d.wait_for("no checkpoint in", timeout_s=30)
    time.sleep(1.5)                             # inside the wait for an assignment
    assert d.proc.poll() is None, d.stderr()[-3000:]
    t0 = time.monotonic()
    d.signal(signal.SIGTERM)
    rc = d.wait(90)
    took = time.monotonic() - t0
    assert rc == 0 and took < 5, (rc, round(took, 1), d.stderr()[-3000:])
    assert "stopped (SIGTERM)" in d.stderr()
    assert not (tmp_path / "ck" / "latest").exists()          # nothing applied, nothing to save


def test_sigterm_during_the_group_join_leaves_the_group_usable(kafka_broker, new_topic, new_group,
                                                                tmp_path, daemons):
    """A SIGTERM while the first daemon's group join is in flight used to wedge the group on
    the local broker (tansu 0.6.0 keeps naming a member that left mid-rebalance as the
    group's leader): every later daemon of the group waited 60 s and exited 1 (8 of 8
    trials). The daemon now completes the join it started (bounded) and leaves from a stable
    membership, so the next daemon of the group is assigned and drains the topic."""
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(1), new_group()
    produce_rows(bootstrap, topic, blob_rows(400, seed=2), JsonCodec(2), partitions=1)
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                     inference={"batch_size": 50, "max_wait_seconds": 0.5, "n_total": 400},
                     metrics={"heldout_size": 0})
    config = write_config(tmp_path / "wedge.toml", raw)
    for delay in (0.2, 0.6, 1.0):
        first = daemons(config, tag=f"first-{delay}")
        deadline = time.monotonic() + 30
        while not re.search("no checkpoint in|resumed from", first.stderr()):
            assert time.monotonic() < deadline and first.proc.poll() is None, first.stderr()[-3000:]
            time.sleep(0.02)
        time.sleep(delay)                        # inside the first join (about 1 s on tansu)
        first.signal(signal.SIGTERM)
        assert first.wait(60) == 0, first.stderr()[-3000:]
    after = daemons(config, "--until-drained", tag="after")
    rc = after.wait(90)
    assert rc == 0, after.stderr()[-3000:]
    assert "partitions assigned" in after.stderr()
    assert load_snapshot(tmp_path / "ck").state.records_seen == 400


def test_no_assignment_exits_6_with_one_line_saying_why(kafka_broker, new_group, tmp_path, monkeypatch,
                                                      capsys):
    """It exited 1 with a traceback, saying "check that the topics exist and that the group has
    no more members than partitions" whatever the cause. Now: exit 6, one line, the cause this
    member saw (here: no topic matches its pattern)."""
    from streamsvi import cli
    from streamsvi.service import daemon as daemon_mod

    config = write_config(tmp_path / "none.toml", gmm_config(
        tmp_path, bootstrap=kafka_broker.bootstrap, group=new_group(),
        source={"pattern": r"no-such-topic-\d+"}))
    monkeypatch.setattr(daemon_mod, "ASSIGNMENT_TIMEOUT_S", 5.0)
    rc = cli.main(["run", "--config", str(config)])
    err = capsys.readouterr().err
    assert rc == 6, err
    lines = [ln for ln in err.splitlines() if ln.startswith("streamsvi: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "within 5 s" in lines[0] and "no topic matches the subscription" in lines[0], lines[0]


def test_a_member_given_no_partition_is_told_the_group_has_more_members_than_partitions(
        kafka_broker, new_topic, new_group):
    """Two members of one group on a topic of one partition: the one the group gives nothing
    says so (it joined: the rebalance completed), not that the rebalance never did."""
    from streamsvi.io.sources import KafkaSource, NotAssigned

    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(1), new_group()
    a, b = (KafkaSource(bootstrap, topics=[topic], group_id=group, codec=JsonCodec(2)) for _ in range(2))
    try:
        deadline = time.monotonic() + 60
        while True:                     # both poll until the group is stable with both in it
            for s in (a, b):
                s._consumer.poll(timeout_ms=500, max_records=1)
            owners = [s for s in (a, b) if s.assignment()]
            idle = [s for s in (a, b) if not s.assignment() and s.membership() is not None]
            if len(owners) == 1 and len(idle) == 1:
                break
            assert time.monotonic() < deadline, "the group never settled"
        try:
            idle[0].wait_for_assignment(timeout_s=1.0)
            raise AssertionError("the member without a partition was assigned one")
        except NotAssigned as exc:
            assert "joined the group but was given none of the 1 partitions" in str(exc), str(exc)
            assert "more members than partitions" in str(exc)
    finally:
        a.close()
        b.close()
