"""LDA scaled out on the real broker: sparse column deltas, kill -9 a worker and the applier.

The same contract and the same moves as ``test_scaleout.py``'s GMM kill test, for the
model whose λ is kept in scaled columns (``streamsvi/inference/split_columns.py``): real
``streamsvi run --role worker|applier`` subprocesses, a worker and the active applier killed
-9 at seeded random instants, the standby resuming LDA's λ (scaled form and aux) from the
snapshot; then every produced document was applied exactly once and λ is finite.
"""
import json
import random
import re
import signal
import time

import numpy as np

from streamsvi.datasets import make_lda_corpus
from streamsvi.models import LDA

from .conftest import highwater_marks, produce_raw
from .test_scaleout import P, _check_exactly_once, _configs, _lambda, _wait

K, V = 3, 300


def _documents(n, seed):
    """``n`` bag-of-words JSON records ({"ids", "counts"}) from LDA's generative process."""
    X = make_lda_corpus(n, n_topics=K, n_words=V, doc_length=12, alpha=0.3, seed=seed)[0]
    return [json.dumps({"ids": X.indices[a:b].tolist(), "counts": X.data[a:b].astype(int).tolist()}).encode()
            for a, b in zip(X.indptr[:-1], X.indptr[1:])]


def test_two_lda_workers_kill_9_worker_and_active_applier(kafka_broker, new_topic, new_group, tmp_path,
                                                          daemons):
    bootstrap, n = kafka_broker.bootstrap, 6000
    topic, deltas = new_topic(P), new_topic(1, prefix="deltas")
    produce_raw(bootstrap, topic, _documents(n, seed=4), partitions=P)
    hw = highwater_marks(bootstrap, topic, P)
    assert sum(hw.values()) == n
    model = {"kind": "lda", "n_components": K, "n_features": V, "doc_topic_prior": 0.3,
             "topic_word_prior": 0.05, "max_doc_update_iter": 30,
             "weight_concentration": None, "mean_precision": None, "scale": None}   # (gmm's: unset)
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 2, n, model=model,
                        batch_size=25, effective_batch_size=10)
    rng = random.Random(20261127)

    a1 = daemons(cfgs["applier"], "--role", "applier", tag="a1")
    a2 = daemons(cfgs["applier"], "--role", "applier", tag="a2")
    first = _wait(lambda: next((a for a in (a1, a2) if "applier: active" in a.stderr()), None),
                  "an active applier", 60, procs=(a1, a2))
    standby = a2 if first is a1 else a1
    ws = {f"w{i}": daemons(cfgs[f"w{i}"], "--role", "worker", "--until-drained", tag=f"w{i}")
          for i in range(2)}
    procs = [a1, a2, *ws.values()]

    # kill -9 a worker at a random instant: after a random number of applied documents
    at = rng.randint(n // 10, n // 3)
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= at, f"{at} records", procs=procs)
    time.sleep(rng.uniform(0, 0.05))      # anywhere in the batch/transaction cycle
    victim = rng.choice(sorted(ws))
    others = [w for k, w in ws.items() if k != victim]
    joins = sum(w.stderr().count("partitions assigned") for w in others)
    ws[victim].signal(signal.SIGKILL)
    assert ws[victim].wait(10) == -signal.SIGKILL
    _wait(lambda: sum(w.stderr().count("partitions assigned") for w in others) > joins,
          "the group to rebalance without the killed worker", 60, procs=others)
    ws[victim] = daemons(cfgs[victim], "--role", "worker", "--until-drained", tag=f"{victim}-again")
    procs = [a1, a2, *ws.values()]

    # kill -9 the active applier at a random instant; the standby resumes LDA's λ and takes over
    at = rng.randint(n // 2, 3 * n // 4)
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= at, f"{at} records", procs=procs)
    time.sleep(rng.uniform(0, 0.05))
    first.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    assert first.wait(10) == -signal.SIGKILL
    procs = [standby, *ws.values()]
    _wait(lambda: "applier: active" in standby.stderr(), "the standby to take over", 60, procs=procs)
    print(f"standby applier took over {time.monotonic() - killed_at:.2f} s after the kill -9")

    for w in ws.values():
        assert w.wait(150) == 0, w.stderr()[-3000:]
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= n, "every record applied",
          procs=[standby])
    standby.signal(signal.SIGTERM)
    assert standby.wait(60) == 0, standby.stderr()[-3000:]
    snap = _check_exactly_once(ck, topic, hw, n)
    lda = LDA(n_components=K, n_features=V)
    assert lda.is_scaled(snap.state.lam) and snap.state.aux["stored_sqsum"].shape == (K,)
    lam = lda.lam_matrix(snap.state.lam)
    assert np.isfinite(lam).all() and (lam > 0).all()
    assert snap.state.step >= n // 50
    # the standby resumed LDA's λ from a snapshot and applied deltas from there on
    done = re.search(r"stopped \(SIGTERM\): (\d+) deltas", standby.stderr())
    assert done and int(done.group(1)) > 0, standby.stderr()[-3000:]
    for a in (a1, a2):                  # every delta fitted the model: none skipped as bad
        assert "Traceback" not in a.stderr() and "ERROR" not in a.stderr(), a.stderr()[-3000:]
