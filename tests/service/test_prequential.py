"""Prequential evaluation (metrics.evaluation = "prequential", the default): every minibatch is
scored at the parameters before it is learned, no record is withheld, and the daemon's λ is the
in-memory engine's fed the same minibatches, bit for bit."""
import io
import json

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.datasets import make_lda_corpus
from streamsvi.io.records import record_kind
from streamsvi.service.config import build_engine, build_model, validate
from streamsvi.service.daemon import Daemon
from streamsvi.service.history import read_history

from .conftest import blob_rows

K, V, B, N_DOCS = 3, 40, 40, 400


def _lda_file(tmp_path, n=N_DOCS, seed=4):
    X = make_lda_corpus(n, n_topics=K, n_words=V, doc_length=15, alpha=0.3, seed=seed)[0]
    model = build_model({"kind": "lda", "n_components": K, "n_features": V})
    values = record_kind(model).to_json(X)
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    return path, values


def _lda_config(tmp_path, path, **metrics):
    return validate({
        "model": {"kind": "lda", "n_components": K, "n_features": V, "doc_topic_prior": 0.3},
        "inference": {"n_total": N_DOCS, "batch_size": B, "tau0": 1.0, "kappa": 0.7, "seed": 11},
        "source": {"kind": "file", "path": str(path), "dead_letter_path": str(tmp_path / "dead.jsonl")},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 3, "keep": 2},
        "metrics": {"enabled": False, "progress_seconds": 0.0, "history_every": 1,
                    "prequential_sample": 16, **metrics},
    })


def _in_memory(cfg, values, sample):
    """The engine fed the file's minibatches in order, each scored (its evenly spaced sample) before
    it is learned: ``(final state, [prequential figure per update])``."""
    engine = build_engine(cfg, float(cfg["inference"]["n_total"]))
    kind = record_kind(engine.model)
    batches = [kind.from_json(values[i:i + B], engine.model) for i in range(0, len(values), B)]
    state = engine.init(batches[0], seed=cfg["inference"]["seed"])
    figures = []
    for i, x in enumerate(batches):
        n = kind.n_records(x)
        idx = np.unique(np.linspace(0, n - 1, sample).astype(np.int64)) if n > sample else slice(None)
        lp = float(np.mean(engine.predictive_logpdf(state, kind.take(x, idx))))
        figures.append(None if i == 0 else lp)     # the first batch made λ_0: not scored
        state, _ = engine.update(state, x)
    return state, figures


def test_prequential_is_the_default_withholds_nothing_and_equals_the_in_memory_engine(tmp_path):
    path, values = _lda_file(tmp_path)
    cfg = _lda_config(tmp_path, path)
    assert cfg["metrics"]["evaluation"] == "prequential"
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained"
    assert (res.records, res.heldout, res.heldout_total) == (N_DOCS, 0, 0)   # no record withheld
    snap = load_snapshot(tmp_path / "ck", follow="latest")
    assert "heldout" not in snap.extra and snap.state.records_seen == N_DOCS
    state, figures = _in_memory(cfg, values, 16)
    assert snap.state.step == state.step == N_DOCS // B
    for k in state.lam:                                              # λ bit for bit
        assert np.array_equal(np.asarray(snap.state.lam[k]), np.asarray(state.lam[k])), k
    rows = read_history(tmp_path / "ck")
    assert [r["step"] for r in rows] == list(range(1, N_DOCS // B + 1))
    # each row's figure is predictive_logpdf at the λ before that update, computed by hand
    assert [r.get("prequential_loglik") for r in rows] == figures
    assert all(r["heldout_loglik"] is None for r in rows)
    assert registry.get_sample_value("streamsvi_prequential_loglik_per_record") == figures[-1]
    assert registry.get_sample_value("streamsvi_prequential_records_total") == 16 * (len(figures) - 1)
    smoothed = registry.get_sample_value("streamsvi_prequential_loglik_smoothed")
    assert min(figures[1:]) <= smoothed <= max(figures[1:])
    assert registry.get_sample_value("streamsvi_heldout_records") == 0


def test_a_config_that_sets_heldout_size_keeps_its_reservoir(tmp_path):
    path, _ = _lda_file(tmp_path)
    cfg = _lda_config(tmp_path, path, heldout_size=40)
    assert cfg["metrics"]["evaluation"] == "reservoir"
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert (res.records, res.heldout_total) == (N_DOCS - 40, 40)
    rows = read_history(tmp_path / "ck")
    assert all("prequential_loglik" not in r for r in rows)
    explicit = _lda_config(tmp_path, path, heldout_size=40, evaluation="prequential")
    assert explicit["metrics"]["evaluation"] == "prequential"


def test_whole_batch_when_sample_is_zero_and_the_progress_line_shows_lpd(tmp_path):
    rows = blob_rows(600, seed=2)
    path = tmp_path / "points.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows.tolist()))
    cfg = validate({
        "model": {"kind": "gmm", "n_components": 3, "n_features": 2, "weight_concentration": 1.0,
                  "mean_precision": 0.1, "scale": 1.0},
        "inference": {"n_total": 600, "batch_size": 50, "effective_batch_size": 20, "seed": 3},
        "source": {"kind": "file", "path": str(path)},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 100},
        "metrics": {"enabled": False, "progress_seconds": 1e-9, "prequential_sample": 0},
    })
    out, registry = io.StringIO(), CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=out).run(until_drained=True, timeout=120)
    assert res.records == 600
    # every record but those of the first 4 batches, which the GMM's start (k-means, CAVI) saw
    assert registry.get_sample_value("streamsvi_prequential_records_total") == 600 - 4 * 50
    lines = [ln for ln in out.getvalue().splitlines() if ln.startswith("step")]
    assert "lpd" not in lines[0] and lines[0].startswith("step       4 ")    # the start's batches
    assert len(lines) > 1 and all("  lpd " in ln for ln in lines[1:])
    assert float(lines[-1].rsplit("lpd ", 1)[1]) == pytest.approx(
        registry.get_sample_value("streamsvi_prequential_loglik_smoothed"), abs=1e-4)


def test_classifiers_get_prequential_log_loss_and_accuracy(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 3))
    y = (X @ np.array([1.5, -2.0, 0.5]) + 0.3 * rng.normal(size=600) > 0).astype(int)
    path = tmp_path / "labelled.jsonl"
    path.write_text("".join(json.dumps({"x": xi, "y": int(yi)}) + "\n" for xi, yi in zip(X.tolist(), y)))
    cfg = validate({
        "model": {"kind": "logistic", "n_features": 3},
        "inference": {"n_total": 600, "batch_size": 100, "seed": 1},
        "source": {"kind": "file", "path": str(path)},
        "checkpoint": {"directory": str(tmp_path / "ck")},
        "metrics": {"enabled": False, "progress_seconds": 0.0, "history_every": 1},
    })
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.records == 600
    rows = read_history(tmp_path / "ck")
    assert "prequential_log_loss" not in rows[0]                   # λ_0 was made from batch 1
    assert all(r["prequential_log_loss"] > 0 and 0 <= r["prequential_accuracy"] <= 1 for r in rows[1:])
    assert rows[-1]["prequential_accuracy"] > 0.8                  # learned before the last batch
    assert registry.get_sample_value("streamsvi_prequential_accuracy") == rows[-1]["prequential_accuracy"]
