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

import numpy as np
import pytest

from streamsvi.io import produce_rows
from streamsvi.io.ratings import RatingsJsonCodec
from streamsvi.io.records import KINDS
from streamsvi.models import Ratings

from .conftest import Feed, gmm_config, highwater_marks, write_config
from .test_scaleout import P, _check_exactly_once, kill_9_worker_and_active_applier

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
        raw["scaleout"] = {"deltas_topic": deltas, "max_staleness": 1000,
                           "lambda_file": str(ck / "lambda.npz")}      # what _lambda reads
        if name != "applier":
            raw["scaleout"]["worker_id"] = name
        cfgs[name] = write_config(tmp_path / f"{name}.toml", raw)
    return cfgs, ck


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_row_models_survive_kill_9_of_a_worker_and_the_active_applier(kafka_broker, new_topic, new_group,
                                                                       tmp_path, daemons, kind):
    bootstrap, n = kafka_broker.bootstrap, 9000
    topic, deltas = new_topic(P), new_topic(1, prefix="deltas")
    x = _ratings(n, seed=25)
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 3, n, MODELS[kind])
    feed = Feed(bootstrap, topic, x, P, chunk=300, produce=lambda part: produce_rows(
        bootstrap, topic, part, RatingsJsonCodec(), partitions=P, kind=KINDS["ratings"]), hold=0.8)
    kill_9_worker_and_active_applier(daemons, cfgs, ck, feed.begin(), random.Random(2026112500 + len(kind)))
    hw = highwater_marks(bootstrap, topic, P)
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
