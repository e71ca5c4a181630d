"""Scale-out of row-wise models (PMF, Poisson factorisation) on the real broker: kill -9.

The workers send row deltas (:mod:`streamsvi.inference.split_rows`: the touched
rows' ids and statistics) and the applier steps its own rows with its own
per-row clocks. The contract is the dense models' (tests/service/test_scaleout.py,
docs/design.md "Scale-out"): every produced rating is folded into λ exactly once
whatever process is killed when, and for rows that means more than the applied
ranges: each rating counted once in its user's and its item's n_i, each id one
row, each rating once in the pair log.
"""
import random
import signal
import time

import numpy as np
import pytest

from streamsvi.io import produce_rows
from streamsvi.io.ratings import RatingsJsonCodec
from streamsvi.io.records import KINDS
from streamsvi.models import Ratings

from .conftest import gmm_config, highwater_marks, write_config
from .test_scaleout import P, _check_exactly_once, _lambda, _wait

MODELS = {"pmf": {"kind": "pmf", "n_factors": 2, "biases": True, "offset": "auto", "remember_rated": True},
          "hpf": {"kind": "hpf", "n_factors": 2, "remember_rated": True}}


def _ratings(n, seed, n_users=80, n_items=50):
    """``n`` ratings 1..5 (valid PMF ratings and HPF counts); user ids strings, item ids integers."""
    rng = np.random.default_rng(seed)
    u, i = rng.integers(0, n_users, n), rng.integers(0, n_items, n)
    r = np.clip(np.rint(3.0 + np.sin(u) + np.cos(i) + 0.5 * rng.normal(size=n)), 1, 5)
    return Ratings([f"u{a}" for a in u], i.tolist(), r)


def _configs(tmp_path, bootstrap, topic, deltas, group, workers, n, model):
    ck = tmp_path / "ck"
    cfgs = {}
    for name in ["applier"] + [f"w{i}" for i in range(workers)]:
        raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group, name="ck",
                         inference={"batch_size": 50, "max_wait_seconds": 1.0, "n_total": n,
                                    "effective_batch_size": 20},
                         checkpoint={"every_batches": 5, "every_seconds": 3600.0, "keep": 3},
                         metrics={"enabled": False, "heldout_size": 0})
        raw["model"] = dict(model)
        raw["checkpoint"]["directory"] = str(ck)
        raw["scaleout"] = {"deltas_topic": deltas, "max_staleness": 1000}
        if name != "applier":
            raw["scaleout"]["worker_id"] = name
        cfgs[name] = write_config(tmp_path / f"{name}.toml", raw)
    return cfgs, ck


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_row_models_survive_kill_9_of_a_worker_and_the_active_applier(kafka_broker, new_topic, new_group,
                                                                       tmp_path, daemons, kind):
    bootstrap, n = kafka_broker.bootstrap, 3000
    topic, deltas = new_topic(P), new_topic(1, prefix="deltas")
    x = _ratings(n, seed=25)
    produce_rows(bootstrap, topic, x, RatingsJsonCodec(), partitions=P, kind=KINDS["ratings"])
    hw = highwater_marks(bootstrap, topic, P)
    assert sum(hw.values()) == n
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 3, n, MODELS[kind])
    rng = random.Random(2026112500 + len(kind))

    a1 = daemons(cfgs["applier"], "--role", "applier", tag="a1")
    a2 = daemons(cfgs["applier"], "--role", "applier", tag="a2")
    first = _wait(lambda: next((a for a in (a1, a2) if "applier: active" in a.stderr()), None),
                  "an active applier", 60, procs=(a1, a2))
    standby = a2 if first is a1 else a1
    ws = {f"w{i}": daemons(cfgs[f"w{i}"], "--role", "worker", "--until-drained", tag=f"w{i}")
          for i in range(3)}
    procs = [a1, a2, *ws.values()]

    # kill -9 a worker after a random number of applied records, anywhere in its cycle
    at = rng.randint(n // 10, n // 3)
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= at, f"{at} records", procs=procs)
    time.sleep(rng.uniform(0, 0.05))
    victim = rng.choice(sorted(ws))
    others = [w for k, w in ws.items() if k != victim]
    joins = sum(w.stderr().count("partitions assigned") for w in others)
    ws[victim].signal(signal.SIGKILL)
    assert ws[victim].wait(10) == -signal.SIGKILL
    _wait(lambda: sum(w.stderr().count("partitions assigned") for w in others) > joins,
          "the group to rebalance without the killed worker", 60, procs=others)
    ws[victim] = daemons(cfgs[victim], "--role", "worker", "--until-drained", tag=f"{victim}-again")
    procs = [a1, a2, *ws.values()]

    # kill -9 the active applier after a random number of applied records; the standby takes over
    at = rng.randint(n // 2, 3 * n // 4)
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= at, f"{at} records", procs=procs)
    time.sleep(rng.uniform(0, 0.05))
    first.signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    procs = [standby, *ws.values()]
    _wait(lambda: "applier: active" in standby.stderr(), "the standby to take over", 60, procs=procs)

    for w in ws.values():
        assert w.wait(150) == 0, w.stderr()[-3000:]
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= n, "every record applied",
          procs=[standby])
    standby.signal(signal.SIGTERM)
    assert standby.wait(60) == 0, standby.stderr()[-3000:]
    snap = _check_exactly_once(ck, topic, hw, n)
    st = snap.state
    aux = st.aux
    # rows: one per id, each rating counted once in its user's and its item's n_i and pair log
    for side, ids in (("user", x.user), ("item", x.item)):
        known = list(aux[f"{side}s"])
        assert len(known) == len(set(known)) == len(set(ids)), side
        assert int(np.sum(aux[f"{side}_n"])) == n, side
        counts = dict(zip(*np.unique(np.asarray(ids), return_counts=True)))
        assert {k: int(v) for k, v in zip(known, aux[f"{side}_n"])} == {k: int(v) for k, v in counts.items()}
    assert len(aux["rated"]) == n
    assert st.step >= n // 50
    assert all(np.isfinite(np.asarray(v)).all() for v in st.lam.values())
