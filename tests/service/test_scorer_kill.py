"""kill -9 the scorer (``streamsvi run --role scorer``) while it scores: nothing dropped, nothing twice.

Records arrive paced while the scorer runs; it is killed at random instants (fixed
seed) several times and started again with the same scorer id each time (its
``init_transactions`` aborts the transaction the killed one left open). At the end
the output topic, read as a read_committed consumer reads it, holds exactly one
scored record per input offset, each equal to the snapshot's ``score`` of its input.
"""
import io
import json
import random
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.io import JsonCodec, produce_rows
from streamsvi.scoring import load
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import Feed, blob_rows, gmm_config, highwater_marks, read_topic, write_config
from .test_scorer import read_committed

P = 3


@pytest.mark.parametrize("scorers", [1, 2], ids=["one-scorer", "two-scorers"])
def test_kill_9_scorer_at_random_instants_scores_every_record_exactly_once(kafka_broker, new_topic, new_group,
                                                                           tmp_path, daemons, scorers):
    """With two scorers in the group, one is killed each time while the other keeps scoring:
    the group rebalances, the killed one's partitions move and come back."""
    bootstrap = kafka_broker.bootstrap
    train, records, output = new_topic(1), new_topic(P), new_topic(1)
    produce_rows(bootstrap, train, blob_rows(600, seed=1), JsonCodec(2), partitions=1)
    dcfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=train, group=new_group(),
                               inference={"max_wait_seconds": 0.3}))
    assert Daemon(dcfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True,
                                                                             timeout=60).stopped_by == "drained"
    ck = dcfg["checkpoint"]["directory"]
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=records, group=new_group(),
                     inference={"max_wait_seconds": 0.2, "batch_size": 50},
                     metrics={"enabled": False, "progress_seconds": 0.1})
    raw["checkpoint"]["directory"] = ck
    configs = []
    for i in range(scorers):
        raw["scorer"] = {"output_topic": output, "scorer_id": f"kill-test-{i}", "commit_every_batches": 4}
        configs.append(write_config(tmp_path / f"scorer{i}.toml", raw))

    n = 24000
    feed = Feed(bootstrap, records, blob_rows(n, seed=21), P, chunk=150, pace_s=0.05).begin()
    rng = random.Random(26)
    kills = 4
    others = [daemons(c, "--role", "scorer", tag="steady") for c in configs[1:]]    # never killed
    try:
        for i in range(kills):
            s = daemons(configs[0], "--role", "scorer", tag=f"kill{i}")
            s.wait_for("scoring with snapshot", timeout_s=60)
            if scorers == 1:
                s.wait_for("rec/s", timeout_s=60)        # scoring (with two, its partitions may be idle)
            time.sleep(rng.uniform(0.05, 1.5))            # a random instant while records arrive
            assert s.proc.poll() is None, s.stderr()[-2000:]
            s.kill()                                      # SIGKILL: no clean stop, no last commit
        feed.finish()
    finally:
        feed.cancel()
    for o in others:
        o.signal()                                        # SIGTERM: a clean stop, its last commit
        assert o.wait(timeout_s=60) == 0, o.stderr()[-3000:]
    last = daemons(configs[0], "--role", "scorer", "--until-drained", tag="last")
    assert last.wait(timeout_s=120) == 0, last.stderr()[-3000:]

    hw = highwater_marks(bootstrap, records, P)
    assert sum(hw.values()) == n
    out = read_committed(bootstrap, output, expect=n, timeout_s=60)
    keys = [(r["topic"], r["partition"], r["offset"]) for r in out]
    aborted = len(read_topic(bootstrap, output)) - len(out)    # the killed scorers' open transactions
    print(f"{n} records, {len(out)} committed output records, {aborted} aborted ones dropped by readers")
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} records scored twice"
    assert set(keys) == {(records, p, o) for (_, p), h in hw.items() for o in range(h)}, "records dropped"
    # every value is the snapshot's score of its input
    fitted = load(ck)
    rows = {(records, p, o): json.loads(v) for p, o, v in read_topic(bootstrap, records)}
    want = fitted.score(np.array([rows[k] for k in keys]))
    assert all(r["snapshot"]["number"] == fitted.number for r in out)
    assert [r["scores"]["log_density"] for r in out] == [w["log_density"] for w in want]
    assert [r["scores"]["assignment"] for r in out] == [w["assignment"] for w in want]
