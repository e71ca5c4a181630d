"""The daemon in-process against the real broker: drain, checkpoint, resume, commit.

Delivery contract (docs/design.md): a batch's offsets are committed only after a
checkpoint holding its update is durable, and a restarted daemon seeks to the
offsets of its last checkpoint. Here both are checked from the outside: the
group's committed offsets (read by a separate consumer) must equal the
offsets stored in the checkpoint, which must equal the topic's highwater marks
once the daemon has drained it.
"""
import io
import logging
import re
import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec, LocalBroker, create_topic, produce_rows
from streamsvi.io.broker import free_port
from streamsvi.service import daemon as daemon_module
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import (blob_rows, committed_offsets, gmm_config, highwater_marks,
                       snapshot_offsets)


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _scrape_while_running(daemon, found: list, stop: threading.Event):
    """Fetch /metrics from the running daemon once it serves (a real HTTP scrape)."""
    while not stop.is_set():
        srv = daemon.metrics_server
        if srv is not None:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{srv.server_port}/metrics",
                                              timeout=2).read().decode()
            except OSError:
                body = ""
            if "streamsvi_step " in body:     # after the first update
                found.append(body)
                return
        time.sleep(0.05)


def test_drain_checkpoint_resume_and_commit_on_three_partitions(kafka_broker, new_topic, new_group,
                                                                 tmp_path):
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(3), new_group()
    n1, n2, H = 900, 300, 20
    assert produce_rows(bootstrap, topic, blob_rows(n1, seed=1), JsonCodec(2), partitions=3) == n1
    cfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                              inference={"max_wait_seconds": 0.5},
                              metrics={"enabled": True, "port": 0, "heldout_size": H}))
    ck_dir = cfg["checkpoint"]["directory"]

    # ---- first daemon: drains the topic
    reg1, out1 = CollectorRegistry(), io.StringIO()
    d1 = Daemon(cfg, registry=reg1, out=out1)
    scraped, stop = [], threading.Event()
    scraper = threading.Thread(target=_scrape_while_running, args=(d1, scraped, stop), daemon=True)
    scraper.start()
    try:
        res1 = d1.run(until_drained=True, timeout=60)
    finally:
        stop.set()
        scraper.join(5)
    assert res1.stopped_by == "drained", out1.getvalue()
    assert (res1.records, res1.heldout, res1.dead) == (n1 - H, H, 0)
    assert res1.checkpoints >= 2            # every 5 batches, and at shutdown

    m = re.search(r"metrics: http://127\.0\.0\.1:(\d+)/metrics", out1.getvalue())
    assert m and int(m.group(1)) == d1.metrics_server.server_port != 0
    assert scraped and "streamsvi_records_seen" in scraped[0], "no scrape succeeded while running"
    assert not _listening(int(m.group(1))), "metrics port still accepts connections after run()"

    snap1 = load_snapshot(ck_dir)
    assert snap1.state.records_seen == n1 - H
    assert snap1.state.step == res1.batches
    assert len(snap1.extra["heldout"]) == H
    assert reg1.get_sample_value("streamsvi_records_seen") == n1 - H
    assert reg1.get_sample_value("streamsvi_records_consumed_total") == n1 - H
    assert reg1.get_sample_value("streamsvi_step") == snap1.state.step
    assert reg1.get_sample_value("streamsvi_checkpoints_total") == res1.checkpoints
    assert reg1.get_sample_value("streamsvi_heldout_records") == H

    hw1 = highwater_marks(bootstrap, topic, 3)
    assert hw1 == {(topic, p): n1 // 3 for p in range(3)}
    assert snapshot_offsets(snap1) == hw1
    assert committed_offsets(bootstrap, group, topic, 3) == hw1

    # ---- more data, then a new daemon with the same config resumes
    assert produce_rows(bootstrap, topic, blob_rows(n2, seed=2), JsonCodec(2), partitions=3) == n2
    reg2, out2 = CollectorRegistry(), io.StringIO()
    res2 = Daemon(cfg, registry=reg2, out=out2).run(until_drained=True, timeout=60)
    assert res2.stopped_by == "drained", out2.getvalue()
    assert (f"resumed from snapshot {snap1.number} (step {snap1.state.step}, {n1 - H} records)"
            in out2.getvalue())
    assert (res2.records, res2.heldout, res2.dead) == (n2, 0, 0)   # nothing re-read, nothing held out

    snap2 = load_snapshot(ck_dir)
    assert snap2.number > snap1.number
    assert snap2.state.step == snap1.state.step + res2.batches      # the step count continues
    assert snap2.state.records_seen == snap1.state.records_seen + n2
    assert snap2.extra["heldout"] == snap1.extra["heldout"]         # the reservoir was kept
    assert reg2.get_sample_value("streamsvi_records_seen") == n1 + n2 - H
    assert reg2.get_sample_value("streamsvi_step") == snap2.state.step
    assert not snap2.state.lam.array_equal(snap1.state.lam)

    hw2 = highwater_marks(bootstrap, topic, 3)
    assert hw2 == {(topic, p): (n1 + n2) // 3 for p in range(3)}
    assert snapshot_offsets(snap2) == hw2
    assert committed_offsets(bootstrap, group, topic, 3) == hw2


def test_broker_unavailable_at_start_is_retried_then_everything_processed(tmp_path, new_group,
                                                                          monkeypatch, caplog):
    """Start the daemon before its broker exists; the broker comes up 2 s later."""
    # One connection attempt waits at most this long before the daemon counts a retry
    # (kafka-python itself reconnects within an attempt); short here so the test is quick.
    monkeypatch.setattr(daemon_module, "CONNECT_TIMEOUT_S", 0.5)
    caplog.set_level(logging.WARNING, logger="streamsvi.daemon")
    port, topic, n = free_port(), "late-topic", 200
    bootstrap = f"127.0.0.1:{port}"
    cfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=new_group(),
                              source={"connect_attempts": 40, "connect_backoff_seconds": 0.1},
                              inference={"max_wait_seconds": 0.5},
                              metrics={"heldout_size": 0}))
    registry = CollectorRegistry()
    daemon = Daemon(cfg, registry=registry, out=io.StringIO())
    brokers, errors = [], []

    def broker_comes_up():
        try:
            time.sleep(2.0)
            brokers.append(LocalBroker(port=port).start())
            create_topic(bootstrap, topic, partitions=1)
            produce_rows(bootstrap, topic, blob_rows(n, seed=5), JsonCodec(2))
            # stop once every record is in (a bounded stream that keeps running otherwise)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if registry.get_sample_value("streamsvi_records_seen") == n:
                    break
                time.sleep(0.05)
        except Exception as exc:    # surfaced by the assertions below
            errors.append(exc)
        finally:
            daemon.request_stop("test")

    helper = threading.Thread(target=broker_comes_up, daemon=True)
    t0 = time.monotonic()
    helper.start()
    try:
        res = daemon.run(timeout=90)
        helper.join(30)
        assert not errors, errors
        assert res.stopped_by == "test"
        assert time.monotonic() - t0 > 2.0
        retries = registry.get_sample_value("streamsvi_broker_retries_total")
        assert retries is not None and retries >= 1, "no retry was counted while the broker was down"
        warned = [r for r in caplog.records
                  if r.name == "streamsvi.daemon" and "unavailable (attempt" in r.getMessage()]
        assert len(warned) == retries
        assert registry.get_sample_value("streamsvi_broker_up") == 1
        assert res.records == n and res.dead == 0
        snap = load_snapshot(cfg["checkpoint"]["directory"])
        assert snap.state.records_seen == n
        assert snapshot_offsets(snap) == {(topic, 0): n}
        assert committed_offsets(bootstrap, cfg["source"]["group_id"], topic, 1) == {(topic, 0): n}
    finally:
        helper.join(5)
        for b in brokers:
            b.stop()


def test_stop_while_waiting_for_the_broker_returns_cleanly(tmp_path, new_group, monkeypatch):
    monkeypatch.setattr(daemon_module, "CONNECT_TIMEOUT_S", 0.3)
    cfg = validate(gmm_config(tmp_path, bootstrap=f"127.0.0.1:{free_port()}", topic="never",
                              group=new_group(),
                              source={"connect_attempts": 100, "connect_backoff_seconds": 0.2}))
    registry = CollectorRegistry()
    daemon = Daemon(cfg, registry=registry, out=io.StringIO())
    threading.Timer(1.5, daemon.request_stop, args=("SIGTERM",)).start()
    t0 = time.monotonic()
    res = daemon.run(timeout=30)
    assert res.stopped_by == "SIGTERM" and time.monotonic() - t0 < 5
    assert res.records == res.checkpoints == 0
    assert registry.get_sample_value("streamsvi_broker_up") == 0
    assert registry.get_sample_value("streamsvi_broker_retries_total") >= 1
    with pytest.raises(FileNotFoundError):
        load_snapshot(cfg["checkpoint"]["directory"])


def test_resume_applies_retuned_engine_settings_and_says_so(tmp_path, caplog):
    """Settings live in the config, learned state in the snapshot (STYLE.md §5): a resumed
    daemon keeps λ, step and offsets but uses the config's N and schedule, and logs the change."""
    data = tmp_path / "records.jsonl"
    codec = JsonCodec(2)
    data.write_bytes(b"".join(codec.encode(r) + b"\n" for r in blob_rows(300, seed=3)))
    source = {"kind": "file", "path": str(data), "format": "jsonl"}
    first_cfg = validate(gmm_config(tmp_path, source=source, inference={"n_total": 1000}))
    Daemon(first_cfg, out=io.StringIO()).run(until_drained=True)
    first = load_snapshot(tmp_path / "ck")
    assert first.engine.n_total == 1000 and first.state.records_seen == 280

    with data.open("ab") as f:
        f.write(b"".join(codec.encode(r) + b"\n" for r in blob_rows(100, seed=4)))
    caplog.set_level(logging.WARNING, logger="streamsvi.daemon")
    cfg = validate(gmm_config(tmp_path, source=source, inference={"n_total": 2000, "kappa": 0.9}))
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    assert res.records == 100
    final = load_snapshot(tmp_path / "ck")
    assert final.state.records_seen == 380 and final.state.step == first.state.step + res.batches
    assert final.engine.n_total == 2000
    assert final.engine.to_dict()["schedule"]["kappa"] == 0.9
    warned = " | ".join(r.getMessage() for r in caplog.records if r.name == "streamsvi.daemon")
    assert "engine setting n_total: snapshot has 1000.0, config has 2000.0" in warned
    assert "engine setting schedule.kappa: snapshot has 0.7, config has 0.9" in warned


def test_no_partition_assigned_fails_clearly_after_the_timeout(kafka_broker, new_group, tmp_path,
                                                               monkeypatch):
    from streamsvi.io import SourceError

    monkeypatch.setattr(daemon_module, "ASSIGNMENT_TIMEOUT_S", 2.0)
    cfg = validate(gmm_config(tmp_path, bootstrap=kafka_broker.bootstrap, group=new_group(),
                              source={"pattern": r"no-such-topic-\d+"}))
    t0 = time.monotonic()
    with pytest.raises(SourceError, match=r"no partitions of topics matching .* within 2 s: no topic matches"):
        Daemon(cfg, out=io.StringIO()).run(timeout=30)
    assert time.monotonic() - t0 < 6


def test_n_total_auto_counts_every_partition(kafka_broker, new_topic, new_group, tmp_path):
    bootstrap, topic, n = kafka_broker.bootstrap, new_topic(3), 1500
    produce_rows(bootstrap, topic, blob_rows(n, seed=21), JsonCodec(2), partitions=3)
    cfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=new_group(),
                              # first batch (10 records) from one partition: deterministic
                              inference={"n_total": "auto", "max_wait_seconds": 0.5,
                                         "batch_size": 10, "effective_batch_size": 5}))
    Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert load_snapshot(cfg["checkpoint"]["directory"]).engine.n_total == n


def test_resumed_daemon_reports_the_restored_state_before_any_update(tmp_path):
    """Gauges describe the model, not the process: after a restart with nothing new to
    read, step and records seen must not drop to 0 on the dashboard."""
    data = tmp_path / "records.jsonl"
    data.write_bytes(b"".join(JsonCodec(2).encode(r) + b"\n" for r in blob_rows(200, seed=8)))
    cfg = validate(gmm_config(tmp_path, source={"kind": "file", "path": str(data)}))
    Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    snap = load_snapshot(tmp_path / "ck")
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True)
    assert res.records == 0 and res.stopped_by == "drained"
    assert registry.get_sample_value("streamsvi_records_seen") == snap.state.records_seen == 180
    assert registry.get_sample_value("streamsvi_step") == snap.state.step
    assert registry.get_sample_value("streamsvi_heldout_records") == 20


def test_default_source_applies_every_source_setting(kafka_broker, new_topic, new_group, tmp_path):
    """Settings of ``[source]`` reach the consumer (a real cluster refuses session timeouts
    below its group.min.session.timeout.ms, so these must be settable)."""
    from streamsvi.service.daemon import default_source

    topic, group = new_topic(1), new_group()
    cfg = validate(gmm_config(tmp_path, bootstrap=kafka_broker.bootstrap, topic=topic, group=group,
                              source={"session_timeout_ms": 6000, "heartbeat_interval_ms": 1500},
                              validation={"max_abs": 7.0, "max_message_bytes": 321}))
    source = default_source(cfg, None)
    try:
        config = source.consumer.config
        assert (config["session_timeout_ms"], config["heartbeat_interval_ms"]) == (6000, 1500)
        assert config["group_id"] == group and config["enable_auto_commit"] is False
        assert source.topics == [topic]
        assert (source.validator.max_abs, source.validator.max_message_bytes) == (7.0, 321)
    finally:
        source.close()


def test_broker_gone_mid_run_then_back(tmp_path, new_group, caplog):
    """The broker dies mid-run and a new one comes up on the same port.

    The daemon must not crash: no update is applied while the broker is away,
    the offsets it already checkpointed stay durable, and when the broker is
    back it consumes what is produced there. (The local broker keeps topics in
    memory, so the new broker starts empty; the consumer falls back to the
    earliest offset of the recreated topic.)
    """
    caplog.set_level(logging.WARNING)
    port, topic = free_port(), "flaky-topic"
    bootstrap = f"127.0.0.1:{port}"
    cfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=new_group(),
                              inference={"max_wait_seconds": 0.3},
                              source={"connect_backoff_seconds": 0.1},
                              checkpoint={"every_batches": 2},
                              metrics={"heldout_size": 0}))
    registry = CollectorRegistry()
    daemon = Daemon(cfg, registry=registry, out=io.StringIO())
    first = LocalBroker(port=port).start()
    create_topic(bootstrap, topic, partitions=1)
    produce_rows(bootstrap, topic, blob_rows(400, seed=6), JsonCodec(2))
    errors, result = [], {}

    def run():
        try:
            result["res"] = daemon.run(timeout=90)
        except Exception as exc:  # noqa: BLE001 - the assertion below reports it
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    second = None
    try:
        deadline = time.monotonic() + 30
        while registry.get_sample_value("streamsvi_records_seen") != 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert registry.get_sample_value("streamsvi_records_seen") == 400
        first.stop()                                # the broker goes away
        time.sleep(3.0)
        assert runner.is_alive() and not errors, errors
        assert registry.get_sample_value("streamsvi_records_seen") == 400   # nothing applied meanwhile
        second = LocalBroker(port=port).start()     # and comes back (empty: memory storage)
        create_topic(bootstrap, topic, partitions=1)
        produce_rows(bootstrap, topic, blob_rows(300, seed=7), JsonCodec(2))
        deadline = time.monotonic() + 40
        while registry.get_sample_value("streamsvi_records_seen") != 700 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert registry.get_sample_value("streamsvi_records_seen") == 700
    finally:
        daemon.request_stop("test")
        runner.join(60)
        if second is not None:
            second.stop()
    assert not errors, errors
    assert result["res"].stopped_by == "test"
    assert load_snapshot(cfg["checkpoint"]["directory"]).state.records_seen == 700
