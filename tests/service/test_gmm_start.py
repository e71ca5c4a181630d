"""The GMM's start in the daemon: ``[model] init_batches`` minibatches are gathered, the start is
made from all of them, and then each is learned in order (README, "Gaussian mixtures: initialisation").

A file source gives the same batches every run, so the daemon's λ is compared bit for bit with
the engine driven by hand over the same batches.
"""
import io
import logging

import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec
from streamsvi.service.config import ConfigError, build_engine, validate
from streamsvi.service.daemon import Daemon

from .conftest import blob_rows, gmm_config

BATCH = 50


def _run(tmp_path, rows, **model):
    data = tmp_path / "records.jsonl"
    codec = JsonCodec(2)
    data.write_bytes(b"".join(codec.encode(r) + b"\n" for r in rows))
    cfg = validate(gmm_config(tmp_path, source={"kind": "file", "path": str(data), "format": "jsonl"},
                              model=model, inference={"batch_size": BATCH, "n_total": 1000},
                              metrics={"heldout_size": 0}))
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    return cfg, res, load_snapshot(tmp_path / "ck")


def _by_hand(cfg, rows, n_start):
    """The engine itself: start from ``rows[:n_start]``, then one update per BATCH rows."""
    engine = build_engine(cfg, 1000.0)
    state = engine.init(rows[:n_start], seed=cfg["inference"]["seed"])
    for i in range(0, len(rows), BATCH):
        state, _ = engine.update(state, rows[i:i + BATCH])
    return state


@pytest.mark.parametrize("init_batches", [1, 3])
def test_the_start_is_made_from_init_batches_minibatches(tmp_path, caplog, init_batches):
    caplog.set_level(logging.INFO, logger="streamsvi.daemon")
    rows = blob_rows(400, seed=5)
    cfg, res, snap = _run(tmp_path, rows, init_batches=init_batches)
    assert (res.records, res.batches, res.stopped_by) == (400, 8, "drained")
    assert snap.engine.model.get_params()["init_batches"] == init_batches
    expected = _by_hand(cfg, rows, init_batches * BATCH)
    assert snap.state.step == expected.step == 8
    assert snap.state.lam.array_equal(expected.lam)
    # and the start does depend on how many batches it saw
    other = _by_hand(cfg, rows, (4 - init_batches) * BATCH)
    assert not snap.state.lam.array_equal(other.lam)
    said = [r.getMessage() for r in caplog.records if "started from the first" in r.getMessage()]
    assert said == ([] if init_batches == 1 else [f"started from the first 3 batches ({3 * BATCH} records)"])


def test_a_stream_shorter_than_the_start_starts_when_drained(tmp_path):
    rows = blob_rows(120, seed=6)                 # the default init_batches = 4 wants 200 records
    cfg, res, snap = _run(tmp_path, rows)
    assert (res.records, res.batches) == (120, 3)
    expected = _by_hand(cfg, rows, 120)
    assert snap.state.records_seen == 120 and snap.state.lam.array_equal(expected.lam)


def test_init_batches_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="init_batches"):
        validate(gmm_config(tmp_path, model={"init_batches": 0}))
    raw = gmm_config(tmp_path, model={"init_batches": 2})
    raw["model"] = {"kind": "hmm", "n_components": 2, "n_symbols": 3, "init_batches": 2}
    with pytest.raises(ConfigError, match="init_batches"):
        validate(raw)
