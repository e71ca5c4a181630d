"""Logistic regression scaled out on the real broker (issue 25): gradient deltas, Adam in the applier.

The gradient path's split (:mod:`streamsvi.inference.split_gradient`): workers
send ĝ at the λ version they hold, the active applier takes the optimiser step
with its own λ, Adam moments and ρ_t. Checked here with the real CLI
(``streamsvi run --role worker|applier``) as subprocesses, kill -9 of a worker
and of the active applier at seeded random instants (every labelled record
applied exactly once, a classifier that learnt), and with the in-process
:class:`Applier` on a real deltas topic (stale gradients take the staleness
policy, at the gradient path's default bound). Waits are on conditions, never
on sleeps.
"""
import random

import numpy as np
import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.inference import split
from streamsvi.inference.gradients import GradientVI
from streamsvi.inference.split_gradient import MAX_STALENESS
from streamsvi.service.roles.transport import Delta, init_delta

from .conftest import Feed, highwater_marks, produce_raw, write_config
from .test_logistic import _json, labelled_rows, logistic_config
from .test_scaleout import (_check_exactly_once, _metric, _produce_deltas, _run_applier,
                            kill_9_worker_and_active_applier)

P = 3          # data partitions


def _configs(tmp_path, bootstrap, topic, deltas, group, workers, n):
    ck = tmp_path / "ck"
    cfgs = {}
    for name in ["applier"] + [f"w{i}" for i in range(workers)]:
        raw = logistic_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group, name="ck",
                              checkpoint={"every_batches": 5, "every_seconds": 3600.0, "keep": 3},
                              metrics={"enabled": False, "heldout_size": 0})
        raw["inference"].update(n_total=n, batch_size=100, optimizer="adam", learning_rate=0.5)
        raw["checkpoint"]["directory"] = str(ck)
        raw["scaleout"] = {"deltas_topic": deltas,       # max_staleness unset: the gradient default
                           "lambda_file": str(ck / "lambda.npz")}      # what _lambda reads
        if name != "applier":
            raw["scaleout"]["worker_id"] = name
        cfgs[name] = write_config(tmp_path / f"{name}.toml", raw)
    return cfgs, ck


def test_logistic_three_workers_kill_9_worker_and_active_applier(kafka_broker, new_topic, new_group,
                                                                  tmp_path, daemons):
    bootstrap, n = kafka_broker.bootstrap, 12000
    topic, deltas = new_topic(P), new_topic(1, prefix="deltas")
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 3, n)
    feed = Feed(bootstrap, topic, [_json(r) for r in labelled_rows(n, seed=21)], P,
                produce=lambda part: produce_raw(bootstrap, topic, part, partitions=P), hold=0.8)
    kill_9_worker_and_active_applier(daemons, cfgs, ck, feed.begin(), random.Random(20261127))
    hw = highwater_marks(bootstrap, topic, P)
    snap = _check_exactly_once(ck, topic, hw, n)
    assert isinstance(snap.engine, GradientVI) and snap.engine.optimizer == "adam"
    assert snap.state.step >= n // 100
    assert sorted(snap.state.aux) == ["adam_m", "adam_v"] and np.any(snap.state.aux["adam_v"] > 0)
    # the classifier learnt: held-out records of the same stream, well above chance
    held = labelled_rows(2000, seed=22)
    X, y = held[:, :-1], held[:, -1].astype(int)
    acc = float(np.mean(snap.engine.model.predict(snap.state.lam, X) == y))
    chance = max(np.mean(y), 1 - np.mean(y))
    print(f"held-out accuracy {acc:.3f} (chance {chance:.3f}), {snap.state.step} steps")
    assert acc > chance + 0.1 and acc > 0.75, (acc, chance)


# ------------------------------------------------------------ in-process applier
def _gradient_setup(tmp_path, bootstrap, deltas, group, **scaleout):
    from streamsvi.service.config import build_engine, validate

    raw = logistic_config(tmp_path, bootstrap=bootstrap, topic="data", group=group, name="ck",
                          checkpoint={"every_batches": 100, "every_seconds": 3600.0})
    raw["inference"].update(n_total=1000, optimizer="adam", learning_rate=0.2)
    raw["scaleout"] = {"deltas_topic": deltas, **scaleout}
    cfg = validate(raw)
    engine = build_engine(cfg, 1000.0)
    X = labelled_rows(400, seed=5)
    return cfg, engine, engine.init(X[:50], seed=3), X


@pytest.mark.parametrize("policy", ["downweight", "drop"])
def test_stale_gradients_take_the_staleness_policy(kafka_broker, new_topic, new_group, tmp_path, policy):
    """Six gradients computed at λ version 0 from six workers, applied at versions 0..5: the
    staleness is 0..5, and only the last is past the gradient path's default bound (4, with
    ``scaleout.max_staleness`` unset); it takes ρ_t · 4/5, or is dropped."""
    from prometheus_client import CollectorRegistry

    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    cfg, engine, state0, X = _gradient_setup(tmp_path, bootstrap, deltas, new_group(), stale_policy=policy)
    assert cfg["scaleout"]["max_staleness"] is None and MAX_STALENESS == 4
    cs = [split.contribution(engine, state0, X[50 * i:50 * (i + 1)], split.batch_rng_state(3, "data", 0, 50 * i))
          for i in range(6)]
    ds = [Delta(worker=f"w{i}", version=0, ranges=[("data", 0, 50 * i, 50 * (i + 1))], records=c.records,
                stats=c.arrays, n_total=1000.0, extra=c.meta) for i, c in enumerate(cs)]
    _produce_deltas(bootstrap, deltas, [init_delta("w0", engine, state0).encode()] + [d.encode() for d in ds])
    registry = CollectorRegistry()
    _, res = _run_applier(cfg, registry, max_deltas=6)
    assert [_metric(registry, "streamsvi_delta_staleness", worker=f"w{i}") for i in range(6)] == list(range(6))

    expected = state0
    for c in cs[:5]:
        expected, _ = split.apply(engine, expected, c)
    if policy == "downweight":
        expected, done = split.apply(engine, expected, cs[5], 4 / 5)
        assert done.rho == float(engine.schedule(6)) * 0.8
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.step == (6 if policy == "downweight" else 5)
    assert snap.state.lam.array_equal(expected.lam)
    for k in ("adam_m", "adam_v"):          # Adam's moments are the applier's
        assert np.array_equal(snap.state.aux[k], expected.aux[k]), k
    assert snap.state.records_seen == (300 if policy == "downweight" else 250)
    assert snap.extra["scaleout"]["applied"] == {"data/0": [[0, 300]]}     # consumed either way
    if policy == "drop":
        assert _metric(registry, "streamsvi_deltas_skipped_total", reason="stale") == 1.0
        assert snap.extra["scaleout"]["dropped_records"] == 50
    # the gradient path's metrics come with the deltas
    assert _metric(registry, "streamsvi_gradient_variance_by_estimator", estimator="legrad") > 0
    assert np.isfinite(_metric(registry, "streamsvi_elbo"))
