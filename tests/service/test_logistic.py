"""Logistic regression through the daemon (the gradient path) on the real local broker.

Good labelled records mixed with bad ones (a label that is not a class, NaN
features, the wrong dimension, ...): the bad ones are dead-lettered with their
reason, the model learns from the good ones, the snapshot holds a GradientVI
state that a scorer loads, and a second daemon resumes from it.
"""
import base64
import io
import json
import math
from collections import Counter

import numpy as np
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.inference.gradients import GradientVI
from streamsvi.io import BinaryBatchCodec
from streamsvi.scoring import load
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import gmm_config, highwater_marks, produce_raw, read_topic, snapshot_offsets

W_TRUE = np.array([2.0, -1.5, 1.0])

#: (payload, reason): every way a labelled JSON record can be refused.
BAD = [
    (b'{"x": [0.1, 0.2, 0.3], "y": 2}', "bad_label"),         # not a class of a binary model
    (b'{"x": [0.1, 0.2, 0.3], "y": -1}', "bad_label"),
    (b'{"x": [0.1, 0.2, 0.3], "y": "1"}', "bad_label"),       # a string
    (b'{"x": [0.1, 0.2, 0.3], "y": true}', "bad_label"),      # a bool
    (b'{"x": [0.1, 0.2, 0.3], "y": 0.5}', "bad_label"),
    (b'{"x": [0.1, 0.2, 0.3]}', "bad_label"),                 # no label
    (b'{"x": [NaN, 0.2, 0.3], "y": 1}', "non_finite"),
    (b'{"x": [0.1, Infinity, 0.3], "y": 0}', "non_finite"),
    (b'{"x": [0.1, 0.2], "y": 1}', "wrong_shape"),            # D = 2, expected 3
    (b'{"x": [0.1, 0.2, 0.3, 0.4], "y": 1}', "wrong_shape"),
    (b'[0.1, 0.2, 0.3, 1]', "wrong_shape"),                   # not an object
    (b'{"x": [0.1, null, 0.3], "y": 1}', "not_numeric"),
    (b'{"y": 1}', "missing_field"),
    (b'{"x": [0.1, 2e9, 0.3], "y": 1}', "out_of_range"),
    (b'{"x": [0.1, 0.2', "json_invalid"),
]


def labelled_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ W_TRUE + 0.5)))).astype(float)
    return np.column_stack([X, y])


def logistic_config(tmp_path, **kw):
    cfg = gmm_config(tmp_path, **kw)
    cfg["model"] = {"kind": "logistic", "n_features": 3, "prior_var": 4.0}
    inf = cfg["inference"]
    for k in ("effective_batch_size",):
        inf.pop(k, None)
    inf.update({"n_total": 4000, "batch_size": 100, "max_wait_seconds": 0.5})
    cfg["validation"] = {"max_abs": 1e6, **cfg.get("validation", {})}
    return cfg


def _json(row):
    return json.dumps({"x": row[:-1].tolist(), "y": int(row[-1])}).encode()


def test_labelled_stream_learns_dead_letters_bad_records_and_scores(kafka_broker, new_topic, new_group,
                                                                      tmp_path):
    bootstrap, topic, dead, group = kafka_broker.bootstrap, new_topic(2), new_topic(1), new_group()
    rows = labelled_rows(2000, seed=1)
    payloads, reasons = [_json(r) for r in rows], [None] * len(rows)
    for k, (p, reason) in enumerate(BAD):              # spread the bad ones through the stream
        at = 100 * (k + 1) + k
        payloads.insert(at, p)
        reasons.insert(at, reason)
    positions = produce_raw(bootstrap, topic, payloads, partitions=2)
    H = 200
    cfg = validate(logistic_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                                   source={"dead_letter_topic": dead},
                                   metrics={"heldout_size": H, "heldout_every": 1}))
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=90)
    assert res.stopped_by == "drained"
    assert res.dead == len(BAD) and res.records == len(rows) - H

    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert isinstance(snap.engine, GradientVI) and snap.engine.estimator == "legrad"
    assert snap.state.records_seen == len(rows) - H
    assert snapshot_offsets(snap) == highwater_marks(bootstrap, topic, 2)

    letters = [json.loads(v) for _, _, v in read_topic(bootstrap, dead)]
    got = sorted((d["reason"], d["partition"], d["offset"], base64.b64decode(d["payload_b64"]))
                 for d in letters)
    expected = sorted((r, p, o, pl) for (p, o), pl, r in zip(positions, payloads, reasons) if r)
    assert got == expected
    for reason, count in Counter(r for _, r in BAD).items():
        assert registry.get_sample_value("streamsvi_records_dead_lettered_total", {"reason": reason}) == count

    # it learned: the held-out metrics of a classifier, the weights' signs, the estimator's variance gauge
    acc = registry.get_sample_value("streamsvi_heldout_accuracy")
    loss = registry.get_sample_value("streamsvi_heldout_log_loss")
    ll = registry.get_sample_value("streamsvi_heldout_loglik_per_record")
    assert acc > 0.75 and loss < 0.55 and math.isclose(loss, -ll, rel_tol=1e-6)
    assert np.array_equal(np.sign(snap.state.lam["mean"][:3]), np.sign(W_TRUE))
    assert registry.get_sample_value("streamsvi_gradient_variance_by_estimator", {"estimator": "legrad"}) > 0

    # the scorer: posterior predictive probabilities (probit), not the plug-in σ(xᵀμ)
    fitted = load(cfg["checkpoint"]["directory"])
    X = rows[:5, :-1]
    p = fitted.predict_proba(X)
    Z = np.column_stack([X, np.ones(5)])
    mu, s2 = Z @ snap.state.lam["mean"], (Z * Z) @ np.exp(2 * snap.state.lam["log_std"])
    np.testing.assert_allclose(p, 1 / (1 + np.exp(-mu / np.sqrt(1 + np.pi * s2 / 8))))
    assert not np.allclose(p, 1 / (1 + np.exp(-mu)))
    scored = fitted.score(rows[:2])
    assert scored[0]["prediction"] in (0, 1) and math.isclose(sum(scored[0]["proba"]), 1.0)

    # a second daemon resumes from the snapshot and continues the same state
    more = labelled_rows(300, seed=2)
    produce_raw(bootstrap, topic, [_json(r) for r in more], partitions=2)
    res2 = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=90)
    snap2 = load_snapshot(cfg["checkpoint"]["directory"])
    assert res2.records == 300 and snap2.state.records_seen == len(rows) - H + 300
    assert snap2.state.step > snap.state.step


def test_binary_batches_dead_letter_only_the_bad_rows(kafka_broker, new_topic, new_group, tmp_path):
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(1), new_group()
    rows = labelled_rows(400, seed=3)
    bad = rows[:3].copy()
    bad[0, -1] = 3.0                 # not a class
    bad[1, 0] = np.nan               # NaN feature
    bad[2, -1] = np.nan              # NaN label
    codec = BinaryBatchCodec(4)
    payloads = [codec.encode(rows[i:i + 50]) for i in range(0, 400, 50)] + [codec.encode(bad),
                                                                            BinaryBatchCodec(3).encode(rows[:2, :3])]
    produce_raw(bootstrap, topic, payloads, partitions=1)
    cfg = validate(logistic_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                                   source={"codec": "binary"}, metrics={"heldout_size": 0}))
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=90)
    assert res.stopped_by == "drained" and res.records == 400 and res.dead == 4
    letters = [json.loads(line) for line in (tmp_path / "ck" / "dead-letters.jsonl").read_text().splitlines()]
    assert sorted((d["reason"], d["row"]) for d in letters) == [
        ("bad_label", 0), ("bad_label", 2), ("non_finite", 1), ("wrong_shape", None)]
    assert load_snapshot(cfg["checkpoint"]["directory"]).state.records_seen == 400


def test_streamsvi_score_gives_posterior_probabilities_with_or_without_a_label(tmp_path):
    """``streamsvi score``'s scorer on a logistic snapshot: JSON lines with or without ``y``,
    bad ones answered with the daemon's reason codes."""
    from streamsvi.checkpoint import CheckpointStore
    from streamsvi.models.logistic import BayesianLogisticRegression
    from streamsvi.scoring import LineScorer

    rows = labelled_rows(500, seed=5)
    eng = GradientVI(BayesianLogisticRegression(n_features=3), n_total=500.0)
    state, _ = eng.fit(eng.init(rows, seed=0), rows, n_steps=100, batch_size=50)
    CheckpointStore(tmp_path / "ck").save(eng, state, offsets=[])
    out = LineScorer(load(tmp_path / "ck"), "jsonl")([
        (1, '{"x": [1, -1, 0.5]}'), (2, '{"x": [1, -1, 0.5], "y": 1}'), (3, '{"x": [1, -1, 0.5], "y": 7}'),
        (4, '{"x": [NaN, 0, 0]}'), (5, '{"x": [1, 2]}')])
    assert [o.get("reason") for o in out] == [None, None, "bad_label", "non_finite", "wrong_shape"]
    assert out[0]["proba"] == out[1]["proba"] and out[0]["proba"][1] > 0.9
    assert "log_density" not in out[0] and math.isclose(out[1]["log_density"], math.log(out[1]["proba"][1]),
                                                         rel_tol=1e-9)


def test_streamsvi_inspect_describes_a_gradient_path_snapshot(tmp_path, capsys):
    """``streamsvi inspect`` on a logistic snapshot names the estimator (it raised KeyError on M)."""
    from streamsvi.checkpoint import CheckpointStore
    from streamsvi.cli import main
    from streamsvi.models.logistic import BayesianLogisticRegression

    rows = labelled_rows(100, seed=6)
    eng = GradientVI(BayesianLogisticRegression(n_features=3), n_total=100.0, estimator="regrad")
    state, _ = eng.fit(eng.init(rows, seed=0), rows, n_steps=3, batch_size=50)
    CheckpointStore(tmp_path / "ck").save(eng, state, offsets=[])
    assert main(["inspect", str(tmp_path / "ck")]) == 0
    out = capsys.readouterr().out
    assert "estimator=regrad" in out and "step 3" in out


def test_softmax_daemon_on_a_file_dead_letters_unknown_classes(tmp_path):
    """model.kind = softmax (3 classes) from a JSONL file: label 3 is not a class (bad_label),
    the rest is learned; held-out accuracy and log-loss are the multiclass ones."""
    rng = np.random.default_rng(7)
    y = rng.integers(0, 3, 1500)
    X = rng.normal(size=(1500, 3)) + np.array([[2.5, 0, 0], [0, 2.5, 0], [0, 0, 2.5]])[y]
    lines = [json.dumps({"x": r.tolist(), "y": int(c)}) for r, c in zip(X, y)]
    lines.insert(700, json.dumps({"x": [0.0, 0.0, 0.0], "y": 3}))
    lines.insert(900, '{"x": [0.0, 0.0, 0.0], "y": 1.5}')
    data = tmp_path / "labelled.jsonl"
    data.write_text("\n".join(lines) + "\n")
    cfg = logistic_config(tmp_path, source={"kind": "file", "path": str(data), "format": "jsonl"},
                          metrics={"heldout_size": 200, "heldout_every": 1})
    cfg["model"] = {"kind": "softmax", "n_features": 3, "n_classes": 3}
    cfg["source"] = {k: v for k, v in cfg["source"].items() if k in ("kind", "path", "format", "codec")}
    cfg = validate(cfg)
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained" and res.dead == 2 and res.records == 1500 - 200
    assert registry.get_sample_value("streamsvi_records_dead_lettered_total", {"reason": "bad_label"}) == 2
    assert registry.get_sample_value("streamsvi_heldout_accuracy") > 0.85
    loss = registry.get_sample_value("streamsvi_heldout_log_loss")
    assert math.isclose(loss, -registry.get_sample_value("streamsvi_heldout_loglik_per_record"), rel_tol=1e-6)
    out = load(cfg["checkpoint"]["directory"]).score(np.array([[2.5, 0.0, 0.0]]))
    assert out[0]["prediction"] == 0 and len(out[0]["proba"]) == 3


def test_example_config_builds_the_gradient_engine():
    from pathlib import Path

    from streamsvi.service.config import build_engine, load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "logistic.toml")
    eng = build_engine(cfg, 1000.0)
    assert isinstance(eng, GradientVI) and eng.estimator == "legrad" and eng.model.n_features == 9


def test_gradient_settings_are_refused_for_conjugate_models_and_svi_plus_for_logistic(tmp_path):
    import pytest

    from streamsvi.service.config import ConfigError

    with pytest.raises(ConfigError, match="inference.estimator: only used by the gradient path"):
        validate(gmm_config(tmp_path, topic="t", inference={"estimator": "legrad"}))
    cfg = logistic_config(tmp_path, topic="t")
    cfg["inference"]["effective_batch_size"] = 10
    with pytest.raises(ConfigError, match="inference.effective_batch_size: SVI"):
        validate(cfg)


def test_structured_covariance_through_the_daemon_and_a_changed_covariance_is_refused(tmp_path):
    """inference.covariance = lowrank (rank 2) for softmax from a JSONL file: it learns, the
    snapshot holds B and scores; lowrank without a rank is a config error; a restart with
    covariance = full on that checkpoint is refused with the setting named, not a traceback later."""
    import pytest

    from streamsvi.checkpoint import IncompatibleSnapshotError
    from streamsvi.service.config import ConfigError, build_engine

    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, 900)
    X = rng.normal(size=(900, 3)) + np.array([[2.5, 0, 0], [0, 2.5, 0], [0, 0, 2.5]])[y]
    data = tmp_path / "labelled.jsonl"
    data.write_text("\n".join(json.dumps({"x": r.tolist(), "y": int(c)}) for r, c in zip(X, y)) + "\n")
    cfg = logistic_config(tmp_path, source={"kind": "file", "path": str(data), "format": "jsonl"},
                          metrics={"heldout_size": 200, "heldout_every": 1})
    cfg["model"] = {"kind": "softmax", "n_features": 3, "n_classes": 3}
    cfg["source"] = {k: v for k, v in cfg["source"].items() if k in ("kind", "path", "format", "codec")}
    cfg["inference"].update({"covariance": "lowrank", "learning_rate": 0.05})
    with pytest.raises(ConfigError, match="inference.rank: required"):
        build_engine(validate(cfg), 900.0)
    cfg["inference"]["rank"] = 2
    registry = CollectorRegistry()
    res = Daemon(validate(cfg), registry=registry, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained"
    assert registry.get_sample_value("streamsvi_heldout_accuracy") > 0.8
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.engine.covariance == "lowrank" and snap.state.lam["factor"].shape == (12, 2)
    out = load(cfg["checkpoint"]["directory"]).score(np.array([[2.5, 0.0, 0.0]]))
    assert out[0]["prediction"] == 0
    cfg["inference"]["covariance"] = "full"
    del cfg["inference"]["rank"]
    with pytest.raises(IncompatibleSnapshotError, match="inference.covariance = 'full'"):
        Daemon(validate(cfg), registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=60)
