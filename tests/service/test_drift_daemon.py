"""The daemon answers drift: its prequential figure feeds the ``[drift]`` monitor, a detection
is counted and logged and its response applied, and the monitor's state rides in the snapshot
so that a restart goes on as an uninterrupted run would (λ bit for bit)."""
import io
import json
import logging

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.service.config import ConfigError, validate
from streamsvi.service.daemon import Daemon
from streamsvi.service.history import read_history

from .conftest import blob_rows, gmm_config


N, B, CHANGE = 6000, 50, 3000      # records, |S|, the record at which the clusters move


def _stream(tmp_path):
    x = blob_rows(N, seed=7)
    x[CHANGE:] += np.array([9.0, -7.0])          # every component moves: a drop in lpd
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in x.tolist()))
    return path


def _config(tmp_path, path, name="ck", **drift):
    raw = gmm_config(tmp_path, name=name,
                     inference={"n_total": N, "batch_size": B, "effective_batch_size": None},
                     source={"kind": "file", "path": str(path), "topics": None, "group_id": None,
                             "bootstrap_servers": None, "connect_attempts": None,
                             "connect_backoff_seconds": None,
                             "dead_letter_path": str(tmp_path / f"{name}-dead.jsonl")},
                     metrics={"enabled": False, "progress_seconds": 0.0, "heldout_size": None,
                              "heldout_every": None},
                     drift={"detector": "page_hinkley", "response": "floor", "rho_floor": 0.3,
                            "floor_steps": 10, **drift})
    raw["checkpoint"]["every_batches"] = 4
    raw["metrics"]["history_every"] = 1
    return validate(raw)


def test_a_change_is_detected_once_counted_and_answered(tmp_path, caplog):
    path = _stream(tmp_path)
    cfg = _config(tmp_path, path)
    registry = CollectorRegistry()
    d = Daemon(cfg, registry=registry, out=io.StringIO())
    with caplog.at_level(logging.WARNING, logger="streamsvi"):
        res = d.run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained" and res.records == N
    change_step = CHANGE // B                       # the first update that learns moved records is 61
    steps = [e["step"] for e in d.drift.detections]
    assert len(steps) == 1, steps                   # one change, one detection, no false alarm before it
    assert change_step < steps[0] <= change_step + 4, steps
    assert registry.get_sample_value("streamsvi_drift_detected_total",
                                     {"detector": "page_hinkley", "response": "floor"}) == 1.0
    assert registry.get_sample_value("streamsvi_drift_last_detection_step") == steps[0]
    assert any("drift detected at step" in r.getMessage() for r in caplog.records)
    # the floor was in force for the 10 updates after the detection: ρ at those steps >= 0.3
    rho = {r["step"]: r["rho"] for r in read_history(tmp_path / "ck")}
    assert all(rho[t] >= 0.3 for t in range(steps[0] + 1, steps[0] + 11))
    assert rho[steps[0]] < 0.3 and rho[steps[0] + 11] < 0.3
    snap = load_snapshot(tmp_path / "ck", follow="latest")
    assert snap.extra["drift"]["detector"] == "page_hinkley"


def test_a_restart_goes_on_as_an_uninterrupted_run(tmp_path):
    path = _stream(tmp_path)
    whole = Daemon(_config(tmp_path, path, name="whole"), registry=CollectorRegistry(), out=io.StringIO())
    assert whole.run(until_drained=True, timeout=120).stopped_by == "drained"
    detected = whole.drift.detections[0]["step"]
    cfg = _config(tmp_path, path, name="cut")
    first = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO())
    first.run(max_batches=detected + 3)              # stops with the floor in force
    assert first.drift.active
    saved = load_snapshot(tmp_path / "cut", follow="latest").extra["drift"]
    assert saved["floor_until"] > first.state.step   # the snapshot holds the response in progress
    second = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO())
    assert second.run(until_drained=True, timeout=120).stopped_by == "drained"
    a, b = whole.state, second.state
    assert (a.step, a.records_seen) == (b.step, b.records_seen)
    for k in a.lam:
        assert np.array_equal(np.asarray(a.lam[k]), np.asarray(b.lam[k])), k


def test_the_detector_needs_the_prequential_signal(tmp_path):
    raw = gmm_config(tmp_path, metrics={"evaluation": "reservoir"}, drift={"detector": "page_hinkley",
                                                                          "response": "restart"})
    raw["source"] = {"kind": "file", "path": str(tmp_path / "x.jsonl")}
    with pytest.raises(ConfigError, match="metrics.evaluation"):
        validate(raw)
