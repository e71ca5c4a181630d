"""``kill -9`` at arbitrary instants, then restart: every record counts exactly once.

The delivery contract (docs/design.md) promises that a crash at any instant
neither loses a record's contribution nor counts it twice. These tests run
the real CLI (``streamsvi run --config cfg.toml --until-drained``) as a
subprocess, SIGKILL it after random (seeded) delays, restart it, and compare
with an uninterrupted run. On one partition the minibatches are
deterministic (full batches of 25 from the checkpointed offset on), so the
final λ must be the uninterrupted run's bit for bit.
"""
import json
import random
import signal
import subprocess
import sys
import time

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec, produce_rows

from .conftest import (blob_rows, committed_offsets, gmm_config, highwater_marks,
                       snapshot_number, snapshot_offsets, write_config)

H = 30   # held-out reservoir: the first H records (a whole first batch and part of the second)


def _latest_or_none(directory):
    try:
        return load_snapshot(directory)
    except FileNotFoundError:
        return None


def _kill_plan(rng: random.Random, kills: int):
    """One kill during start-up, the others a random number of checkpoints into the run
    plus a random delay (so they land anywhere in the batch/checkpoint/commit cycle)."""
    plan = [("startup", round(rng.uniform(0.3, 1.5), 3))]
    plan += [("progress", rng.randint(3, 25), round(rng.uniform(0.0, 0.08), 3))
             for _ in range(kills - 1)]
    rng.shuffle(plan)
    return plan


def _kill_and_restart(daemons, config, ck_dir, group, topic, partitions, bootstrap, plan):
    """Run ``plan`` (one run and one SIGKILL per step), then a last run to the end.

    After every kill the group's committed offsets must not be ahead of the
    latest checkpoint (commit only after the checkpoint is durable). Returns
    ``[(step, records_seen of the latest snapshot right after the kill), ...]``.
    """
    history = []
    for i, step in enumerate(plan):
        d = daemons(config, "--until-drained", tag=f"try{i}")
        if step[0] == "startup":
            time.sleep(step[1])
        else:
            target = snapshot_number(ck_dir) + step[1]
            deadline = time.monotonic() + 60
            while (snapshot_number(ck_dir) < target and d.proc.poll() is None
                   and time.monotonic() < deadline):
                time.sleep(0.002)
            time.sleep(step[2])
        assert d.proc.poll() is None, f"run {i} ended before its kill {step}:\n{d.stderr()[-3000:]}"
        d.signal(signal.SIGKILL)
        assert d.wait(10) == -signal.SIGKILL
        snap = _latest_or_none(ck_dir)
        history.append((step, None if snap is None else snap.state.records_seen))
        committed = committed_offsets(bootstrap, group, topic, partitions)
        stored = {} if snap is None else snapshot_offsets(snap)
        ahead = {k: (v, stored.get(k, 0)) for k, v in committed.items() if v > stored.get(k, 0)}
        assert not ahead, f"committed offsets ahead of the durable checkpoint after kill {step}: {ahead}"
    d = daemons(config, "--until-drained", tag="final")
    assert d.wait(120) == 0, d.stderr()[-3000:]
    assert "stopped (drained)" in d.stderr(), d.stderr()[-3000:]
    return history


def _config(tmp_path, bootstrap, topic, group, name):
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group, name=f"ck-{name}",
                     inference={"batch_size": 25, "max_wait_seconds": 3.0, "n_total": 3000,
                                "effective_batch_size": 10},
                     checkpoint={"every_batches": 1, "every_seconds": 3600.0, "keep": 2},
                     metrics={"enabled": False, "heldout_size": H})
    return write_config(tmp_path / f"{name}.toml", raw), tmp_path / f"ck-{name}"


def test_kill_9_at_random_points_single_partition_bit_for_bit(kafka_broker, new_topic, new_group,
                                                              tmp_path, daemons):
    bootstrap, topic, n = kafka_broker.bootstrap, new_topic(1), 3000
    produce_rows(bootstrap, topic, blob_rows(n, seed=7), JsonCodec(2))

    ref_cfg, ref_dir = _config(tmp_path, bootstrap, topic, new_group(), "reference")
    ref = daemons(ref_cfg, "--until-drained", tag="reference")
    assert ref.wait(120) == 0, ref.stderr()[-3000:]
    reference = load_snapshot(ref_dir)
    assert reference.state.records_seen + H == n

    group = new_group()
    cfg, ck_dir = _config(tmp_path, bootstrap, topic, group, "killed")
    plan = _kill_plan(random.Random(20240607), kills=5)
    history = _kill_and_restart(daemons, cfg, ck_dir, group, topic, 1, bootstrap, plan)
    print(f"kills (plan step, records in the latest checkpoint after it): {history}")
    mid = [r for _, r in history if r is not None and 0 < r < n - H]
    assert len(mid) >= 3, f"too few kills landed mid-stream: {history}"

    final = load_snapshot(ck_dir)
    assert final.state.records_seen + H == n                 # each record folded in exactly once
    assert final.extra["heldout"] == reference.extra["heldout"]
    assert final.state.step == reference.state.step
    assert final.state.lam.array_equal(reference.state.lam), "λ differs from the uninterrupted run"
    hw = highwater_marks(bootstrap, topic, 1)
    assert hw == {(topic, 0): n}
    assert snapshot_offsets(final) == hw
    assert committed_offsets(bootstrap, group, topic, 1) == hw


def test_kill_9_three_partitions_counts_every_record_once(kafka_broker, new_topic, new_group,
                                                          tmp_path, daemons):
    bootstrap, topic, n = kafka_broker.bootstrap, new_topic(3), 2400
    produce_rows(bootstrap, topic, blob_rows(n, seed=8), JsonCodec(2), partitions=3)
    group = new_group()
    cfg, ck_dir = _config(tmp_path, bootstrap, topic, group, "killed")
    plan = _kill_plan(random.Random(7), kills=4)
    history = _kill_and_restart(daemons, cfg, ck_dir, group, topic, 3, bootstrap, plan)
    print(f"kills (plan step, records in the latest checkpoint after it): {history}")
    mid = [r for _, r in history if r is not None and 0 < r < n - H]
    assert len(mid) >= 2, f"too few kills landed mid-stream: {history}"

    final = load_snapshot(ck_dir)
    assert final.state.records_seen + H == n
    hw = highwater_marks(bootstrap, topic, 3)
    assert hw == {(topic, p): n // 3 for p in range(3)}
    assert snapshot_offsets(final) == hw
    assert committed_offsets(bootstrap, group, topic, 3) == hw


_CRASH_AFTER_FIRST_SNAPSHOT = """
import os, sys
from streamsvi.checkpoint import CheckpointStore
from streamsvi.service.config import load_config
from streamsvi.service.daemon import Daemon

save = CheckpointStore.save

def save_then_power_cut(self, *args, **kwargs):
    snap = save(self, *args, **kwargs)      # the snapshot is durable now
    os._exit(9)                             # ... and the process dies on the spot

CheckpointStore.save = save_then_power_cut
Daemon(load_config(sys.argv[1])).run(until_drained=True)
"""


def test_crash_right_after_a_checkpoint_loses_no_dead_letter(tmp_path, daemons):
    """Dead letters of the records a checkpoint covers must be durable with it.

    A restart seeks past every record the snapshot covers, bad ones included,
    so a dead letter still in a buffer when the process dies is lost for good.
    """
    lines, bad = [], {}
    rows = blob_rows(400, seed=9)
    for i, row in enumerate(rows):
        if i % 41 == 5:                              # offsets 5, 46, 87, ...: in the first batch too
            lines.append(b"[1.0, oops]")
            bad[len(lines) - 1] = "json_invalid"
        lines.append(JsonCodec(2).encode(row))
    data = tmp_path / "records.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n")
    dead_path = tmp_path / "dead.jsonl"
    raw = gmm_config(tmp_path, inference={"batch_size": 50, "n_total": 400},
                     source={"kind": "file", "path": str(data), "format": "jsonl",
                             "dead_letter_path": str(dead_path)},
                     checkpoint={"every_batches": 1})
    config = write_config(tmp_path / "file.toml", raw)

    crash = subprocess.run([sys.executable, "-c", _CRASH_AFTER_FIRST_SNAPSHOT, str(config)],
                           capture_output=True, timeout=60)
    assert crash.returncode == 9, crash.stderr.decode()[-3000:]
    first = load_snapshot(tmp_path / "ck")
    assert first.number == 1 and first.state.records_seen > 0

    d = daemons(config, "--until-drained", tag="restart")
    assert d.wait(60) == 0, d.stderr()[-3000:]
    final = load_snapshot(tmp_path / "ck")
    assert final.state.records_seen + 20 == len(rows)   # heldout_size 20 (gmm_config)
    letters = [json.loads(line) for line in dead_path.read_text().splitlines()]
    got = sorted((dl["offset"], dl["reason"]) for dl in letters)
    assert got == sorted(bad.items()), "dead letters lost or duplicated across the crash"
