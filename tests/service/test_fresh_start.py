"""No silent fresh start (issue 16.3).

With no valid snapshot, the daemon used to start with fresh parameters and
the group's committed offsets, silently leaving out every record before
them. Now it refuses where an earlier run left traces (the checkpoint
directory held snapshots, or the group has committed offsets), says what it
found and what to do, and starts fresh only with ``allow_fresh_start``
(``streamsvi run --allow-fresh-start``). Corrupt snapshots are moved to
``quarantine/``, never deleted.
"""
import io
import shutil

import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec, produce_rows
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon, FreshStartRefused

from .conftest import blob_rows, committed_offsets, gmm_config


def _kafka_cfg(tmp_path, bootstrap, topic, group):
    return validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                               inference={"batch_size": 100, "n_total": 3000},
                               checkpoint={"every_batches": 5}))


def test_checkpoint_directory_gone_but_the_group_committed(kafka_broker, new_topic, new_group, tmp_path):
    """The issue's case: 3,000 records, a third learned and committed, then the folder is gone."""
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(1), new_group()
    produce_rows(bootstrap, topic, blob_rows(3000, seed=4), JsonCodec(2))
    cfg = _kafka_cfg(tmp_path, bootstrap, topic, group)
    first = Daemon(cfg, out=io.StringIO()).run(max_batches=10)
    assert first.records + first.heldout == 1000
    assert committed_offsets(bootstrap, group, topic, 1) == {(topic, 0): 1000}
    shutil.rmtree(tmp_path / "ck")                        # the checkpoint folder is gone

    with pytest.raises(FreshStartRefused) as refused:
        Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=60)
    msg = str(refused.value)
    assert f"group {group!r} has committed offsets {{('{topic}', 0): 1000}}" in msg
    assert "--allow-fresh-start" in msg and "new source.group_id" in msg
    assert load_snapshot_or_none(tmp_path / "ck") is None  # nothing learned, nothing written
    assert committed_offsets(bootstrap, group, topic, 1) == {(topic, 0): 1000}

    # on purpose: fresh parameters from the committed offsets on (the 1,000 before are not re-read)
    res = Daemon(cfg, out=io.StringIO(), allow_fresh_start=True).run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained" and res.records + res.heldout == 2000
    assert load_snapshot(tmp_path / "ck").state.records_seen == 2000 - 20


def load_snapshot_or_none(path):
    try:
        return load_snapshot(path)
    except FileNotFoundError:
        return None


def _file_cfg(tmp_path, n=600):
    data = tmp_path / "records.jsonl"
    data.write_bytes(b"\n".join(JsonCodec(2).encode(r) for r in blob_rows(n, seed=5)) + b"\n")
    return validate(gmm_config(tmp_path, inference={"batch_size": 50, "n_total": n},
                               source={"kind": "file", "path": str(data), "format": "jsonl"},
                               checkpoint={"every_batches": 2, "keep": 2},
                               # exactly `keep` snapshots: no promoted one kept beside them
                               promotion={"enabled": False}))


def test_every_snapshot_corrupt_is_refused_and_quarantined(tmp_path):
    cfg = _file_cfg(tmp_path)
    Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    ck = tmp_path / "ck"
    snaps = sorted(ck.glob("snap-*"))
    assert len(snaps) == 2
    for s in snaps:                                       # damage both kept snapshots
        data = bytearray((s / "state.npz").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (s / "state.npz").write_bytes(bytes(data))

    with pytest.raises(FreshStartRefused) as refused:
        Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    msg = str(refused.value)
    assert "2 quarantined snapshot(s)" in msg and "'latest' pointer naming" in msg
    assert "Restore the checkpoint directory from a backup" in msg
    quarantined = sorted(p.name.rsplit("-", 1)[0] for p in (ck / "quarantine").iterdir())
    assert quarantined == [s.name for s in snaps] and not list(ck.glob("snap-*"))

    res = Daemon(cfg, out=io.StringIO(), allow_fresh_start=True).run(until_drained=True)
    assert res.stopped_by == "drained" and res.records + res.heldout == 600
    # many saves later, retention (keep = 2) has not touched the quarantined snapshots
    assert len(list(ck.glob("snap-*"))) == 2 and len(list((ck / "quarantine").iterdir())) == 2


def test_a_new_directory_and_a_new_group_start_fresh_without_asking(kafka_broker, new_topic,
                                                                     new_group, tmp_path):
    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    produce_rows(bootstrap, topic, blob_rows(300, seed=6), JsonCodec(2))
    res = Daemon(_kafka_cfg(tmp_path, bootstrap, topic, new_group()), out=io.StringIO()).run(
        until_drained=True, timeout=60)
    assert res.stopped_by == "drained" and res.records + res.heldout == 300


def test_streamsvi_run_refuses_with_exit_code_4_in_one_line(tmp_path):
    import subprocess

    from streamsvi.service.tomlw import dump_toml

    from .conftest import STREAMSVI
    cfg = _file_cfg(tmp_path)
    Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    for s in (tmp_path / "ck").glob("snap-*"):
        (s / "snapshot.json").write_text("{")            # truncated
    raw = {section: {k: v for k, v in fields.items() if v is not None} for section, fields in cfg.items()
           if section in ("model", "inference", "source", "validation", "checkpoint", "metrics")}
    raw["source"] = {k: raw["source"][k] for k in ("kind", "path", "format")}
    config = tmp_path / "file.toml"
    config.write_text(dump_toml(raw))
    refused = subprocess.run([STREAMSVI, "run", "--config", str(config), "--until-drained"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 4, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("streamsvi: error:")]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "--allow-fresh-start" in errors[0] and "quarantined" in errors[0]
    ok = subprocess.run([STREAMSVI, "run", "--config", str(config), "--until-drained",
                         "--allow-fresh-start"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "stopped (drained)" in ok.stderr, ok.stderr
