"""Promotion ([promotion]): the 'promoted' pointer moves only to snapshots whose held-out log
predictive density is not worse than the promoted one's by more than the tolerance; loaders and
the watcher follow it; retention keeps it; a restart keeps it and evaluates a pending candidate
again; inspect and the metrics show the decisions."""
import io
import json
import logging

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi import cli
from streamsvi.checkpoint import (PROMOTED, PROMOTION_FILE, CheckpointStore, load_snapshot,
                                  pointer_number, read_promotion)
from streamsvi.scoring import SnapshotWatcher, load
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import blob_rows

B = 50


def _stream(tmp_path, parts, name="points.jsonl"):
    path = tmp_path / name
    with open(path, "a") as f:
        for rows in parts:
            f.write("".join(json.dumps(r) + "\n" for r in rows.tolist()))
    return path


def _config(tmp_path, path, keep=1, **promotion):
    return validate({
        "model": {"kind": "gmm", "n_components": 3, "n_features": 2, "weight_concentration": 1.0,
                  "mean_precision": 0.1, "scale": 1.0},
        "inference": {"n_total": 2000, "batch_size": B, "effective_batch_size": 25, "tau0": 1.0,
                      "kappa": 0.7, "seed": 3},
        "source": {"kind": "file", "path": str(path)},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 2, "keep": keep},
        "metrics": {"enabled": False, "progress_seconds": 0.0},
        "promotion": {"window": B, "tolerance": 0.1, **promotion},
    })


def _run(cfg, registry=None):
    d = Daemon(cfg, registry=registry or CollectorRegistry(), out=io.StringIO())
    res = d.run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained"
    return d, res


def _decisions(ck):
    return {d["candidate"]: d for d in read_promotion(ck)["decisions"]}


def test_a_better_snapshot_is_promoted_a_worse_one_rejected_and_retention_keeps_the_promoted(tmp_path):
    # 8 good batches (snapshots 1-4), 2 shifted but valid batches (snapshot 5 learns them),
    # then 4 good batches: snapshot 5 is scored on the good batch after it
    good, shifted = blob_rows(600, seed=1), blob_rows(100, seed=2) + np.array([25.0, -25.0])
    path = _stream(tmp_path, [good[:400], shifted, good[400:]])
    registry = CollectorRegistry()
    d, res = _run(_config(tmp_path, path), registry)
    ck = tmp_path / "ck"
    assert res.records == 700 and res.checkpoints == 7     # 6 on cadence + the last at the stop
    dec = _decisions(ck)
    assert dec[1]["outcome"] == "promoted" and dec[1]["reason"].startswith("first snapshot")
    # snapshot 2 (4 batches) against snapshot 1 (2 batches), on batch 5, learned by neither
    assert dec[2]["outcome"] == "promoted" and dec[2]["records"] == B and dec[2]["against"] == 1
    assert dec[2]["candidate_figure"] >= dec[2]["promoted_figure"] - 0.1
    worse = dec[5]
    assert worse["outcome"] == "rejected", worse
    assert worse["candidate_figure"] < worse["promoted_figure"] - 0.1
    assert "worse by" in worse["reason"] and "more than the tolerance 0.1" in worse["reason"]
    promoted = pointer_number(ck, PROMOTED)
    assert promoted is not None and promoted < 5 and dec[promoted]["outcome"] == "promoted"
    record = read_promotion(ck)
    assert record["promoted"] == promoted and record["pending"] == 7      # the last, never scored
    assert record["promoted_figure"] == dec[promoted]["candidate_figure"]
    # retention (keep = 1) deleted older snapshots but not the promoted one
    assert sorted(p.name for p in ck.glob("snap-*")) == [f"snap-{promoted:08d}", "snap-00000007"]
    # loaders follow the promoted pointer by default; latest on request
    assert load(ck).number == promoted and load(ck, follow="latest").number == 7
    assert load_snapshot(ck).number == 7 and load_snapshot(ck, follow="promoted").number == promoted
    # metrics: the promoted snapshot, its figure, decisions by outcome
    get = registry.get_sample_value
    assert get("streamsvi_promoted_snapshot") == promoted
    assert get("streamsvi_promoted_loglik_per_record") == record["promoted_figure"]
    outcomes = [x["outcome"] for x in record["decisions"]]
    for outcome in ("promoted", "rejected"):
        assert get("streamsvi_promotion_decisions_total", {"outcome": outcome}) == outcomes.count(outcome)


def test_watcher_follows_promoted_and_latest_on_request(tmp_path):
    path = _stream(tmp_path, [blob_rows(400, seed=1)])
    _run(_config(tmp_path, path, keep=3))
    ck = tmp_path / "ck"
    promoted = pointer_number(ck, PROMOTED)
    assert promoted is not None and promoted < 4               # snapshot 4: the last, pending
    w = SnapshotWatcher(ck)
    assert w.current().number == promoted and not w.refresh()
    assert SnapshotWatcher(ck, follow="latest").current().number == 4
    # the daemon promotes anew: the watcher swaps on its next refresh
    store = CheckpointStore(ck, keep=3)
    store.write_promotion({**read_promotion(ck), "promoted": 4}, promote=4)
    assert w.refresh() and w.current().number == 4
    with pytest.raises(ValueError, match="follow must be"):
        SnapshotWatcher(ck, follow="newest")


def test_without_promotion_loaders_follow_latest(tmp_path):
    path = _stream(tmp_path, [blob_rows(300, seed=1)])
    _run(_config(tmp_path, path, keep=3, enabled=False))
    ck = tmp_path / "ck"
    assert not (ck / PROMOTED).exists() and not (ck / PROMOTION_FILE).exists()
    assert load(ck).number == 3 and SnapshotWatcher(ck).current().number == 3


def test_a_restart_keeps_the_pointer_and_evaluates_the_pending_candidate_again(tmp_path, caplog):
    path = _stream(tmp_path, [blob_rows(400, seed=1)])
    cfg = _config(tmp_path, path, keep=2)
    _run(cfg)
    ck = tmp_path / "ck"
    before = pointer_number(ck, PROMOTED)
    assert read_promotion(ck)["pending"] == 4 and before < 4
    _stream(tmp_path, [blob_rows(200, seed=5)])                 # more records for the restart
    caplog.set_level(logging.INFO, logger="streamsvi.promotion")
    d, res = _run(cfg)
    assert res.records == 200
    assert "snapshot 4 is evaluated again from the restart on" in caplog.text
    dec = _decisions(ck)
    assert dec[4]["against"] == before and dec[4]["records"] == B     # decided in the second run
    assert dec[4]["outcome"] in ("promoted", "rejected")
    assert pointer_number(ck, PROMOTED) >= before


def test_a_damaged_decision_record_or_pointer_never_stops_a_loader(tmp_path, caplog):
    path = _stream(tmp_path, [blob_rows(300, seed=1)])
    _run(_config(tmp_path, path, keep=3))
    ck = tmp_path / "ck"
    promoted = pointer_number(ck, PROMOTED)
    text = (ck / PROMOTION_FILE).read_text()
    (ck / PROMOTION_FILE).write_text(text.replace('"outcome": "promoted"', '"outcome": "rejected"', 1))
    with caplog.at_level(logging.WARNING):
        assert read_promotion(ck) is None
    assert "checksum mismatch" in caplog.text
    assert load(ck).number == promoted                           # the pointer, not the record, decides
    (ck / PROMOTION_FILE).write_text("{not json")
    assert read_promotion(ck) is None
    (ck / PROMOTED).write_text("garbage\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert load(ck).number == 3                              # falls back to latest
    assert "following 'latest' instead" in caplog.text
    (ck / PROMOTED).write_text("snap-00000099\n")                # names a missing snapshot
    assert load(ck).number == 3
    # a restarted daemon copes as well: it promotes its resumed snapshot anew
    _stream(tmp_path, [blob_rows(100, seed=5)])
    _run(_config(tmp_path, path, keep=3))
    assert read_promotion(ck) is not None


def test_inspect_shows_the_promotion_and_its_decisions(tmp_path, capsys):
    good, shifted = blob_rows(600, seed=1), blob_rows(100, seed=2) + np.array([25.0, -25.0])
    path = _stream(tmp_path, [good[:400], shifted, good[400:]])
    _run(_config(tmp_path, path, keep=3))
    ck = tmp_path / "ck"
    assert cli.main(["inspect", str(ck)]) == 0
    out = capsys.readouterr().out
    promoted = pointer_number(ck, PROMOTED)
    assert f"promoted   snap-{promoted:08d}" in out
    assert "pending    snap-00000007" in out
    assert "snap-00000005 rejected" in out and "worse by" in out


def test_with_the_reservoir_both_are_scored_on_it_at_once(tmp_path):
    good, shifted = blob_rows(600, seed=1), blob_rows(100, seed=2) + np.array([25.0, -25.0])
    path = _stream(tmp_path, [good[:400], shifted, good[400:]])
    cfg = _config(tmp_path, path, keep=3)
    cfg["metrics"].update(evaluation="reservoir", heldout_size=100)
    _run(cfg)
    record = read_promotion(tmp_path / "ck")
    dec = {d["candidate"]: d for d in record["decisions"]}
    assert record["pending"] is None                       # every candidate decided when written
    assert all(d["evaluation"] == "reservoir" for d in dec.values())
    assert all(d["records"] == 100 for n, d in dec.items() if n > 1)
    assert any(d["outcome"] == "rejected" for d in dec.values())      # the one that learned the shift
    assert "the held-out reservoir" in dec[max(dec)]["reason"]


def test_turning_promotion_off_warns_about_a_pointer_left_behind(tmp_path, caplog):
    path = _stream(tmp_path, [blob_rows(200, seed=1)])
    _run(_config(tmp_path, path, keep=3))
    _stream(tmp_path, [blob_rows(100, seed=5)])
    with caplog.at_level(logging.WARNING, logger="streamsvi.promotion"):
        _run(_config(tmp_path, path, keep=3, enabled=False))
    assert "holds a 'promoted' pointer to snapshot" in caplog.text
