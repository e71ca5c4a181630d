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

import numpy as np
import pytest

from streamsvi.datasets import make_lda_corpus
from streamsvi.models import LDA

from streamsvi.service.roles.transport import (MAX_DELTA_BYTES, ChunkAssembler, Delta, check_delta_size, is_chunk,
                                               split_parts)

from .conftest import Feed, highwater_marks, produce_raw, read_topic
from .test_scaleout import P, _check_exactly_once, _configs, _lambda, _wait, kill_9_worker_and_active_applier

K, V = 3, 300


def _documents(n, seed):
    """``n`` bag-of-words JSON records ({"ids", "counts"}) from LDA's generative process."""
    X = make_lda_corpus(n, n_topics=K, n_words=V, doc_length=12, alpha=0.3, seed=seed)[0]
    return [json.dumps({"ids": X.indices[a:b].tolist(), "counts": X.data[a:b].astype(int).tolist()}).encode()
            for a, b in zip(X.indptr[:-1], X.indptr[1:])]


def test_two_lda_workers_kill_9_worker_and_active_applier(kafka_broker, new_topic, new_group, tmp_path,
                                                          daemons):
    bootstrap, n = kafka_broker.bootstrap, 9000
    topic, deltas = new_topic(P), new_topic(1, prefix="deltas")
    model = {"kind": "lda", "n_components": K, "n_features": V, "doc_topic_prior": 0.3,
             "topic_word_prior": 0.05, "max_doc_update_iter": 30,
             "weight_concentration": None, "mean_precision": None, "scale": None}   # (gmm's: unset)
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 2, n, model=model,
                        batch_size=25, effective_batch_size=10)
    feed = Feed(bootstrap, topic, _documents(n, seed=4), P, chunk=300,
                produce=lambda part: produce_raw(bootstrap, topic, part, partitions=P), hold=0.8)
    a1, a2, standby = kill_9_worker_and_active_applier(daemons, cfgs, ck, feed.begin(),
                                                       random.Random(20261127), workers=2)
    hw = highwater_marks(bootstrap, topic, P)
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


def test_lda_deltas_over_a_megabyte_travel(kafka_broker, new_topic, new_group, tmp_path, daemons):
    """K = 64 topics over V = 20,000 words and batches of 100 documents that hold ~6,000
    distinct words: each columns delta is ~3 MB and the λ_0 proposal ~10 MB, over the 1 MiB
    a Kafka producer sends by default (before: the worker's λ_0 proposal ended it with
    ``MessageSizeTooLargeError``, refused by its own producer); the worker's producer and the
    applier's fetches take messages up to ``MAX_DELTA_BYTES``, and the proposal travels in
    chunks of ``scaleout.lambda_chunk_bytes``."""
    bootstrap, n, V2, K2 = kafka_broker.bootstrap, 300, 20000, 64
    topic, deltas = new_topic(1), new_topic(1, prefix="deltas")
    rng = np.random.default_rng(6)
    docs = [json.dumps({"ids": sorted(rng.choice(V2, size=80, replace=False).tolist())}).encode()
            for _ in range(n)]
    produce_raw(bootstrap, topic, docs, partitions=1)
    hw = highwater_marks(bootstrap, topic, 1)
    model = {"kind": "lda", "n_components": K2, "n_features": V2, "max_doc_update_iter": 10,
             "weight_concentration": None, "mean_precision": None, "scale": None}
    # exact deltas (compact ones are several times smaller: tests/inference/test_split_compact.py)
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 1, n, model=model,
                        scaleout={"compact_below": 0.0}, batch_size=100, effective_batch_size=None)
    applier = daemons(cfgs["applier"], "--role", "applier", tag="a")
    applier.wait_for("applier: active", 60)
    worker = daemons(cfgs["w0"], "--role", "worker", "--until-drained", tag="w0")
    assert worker.wait(120) == 0, worker.stderr()[-3000:]
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= n, "every record applied",
          procs=[applier])
    applier.signal(signal.SIGTERM)
    assert applier.wait(60) == 0, applier.stderr()[-3000:]
    _check_exactly_once(ck, topic, hw, n, partitions=1)
    sizes, chunks, asm = {}, 0, ChunkAssembler()
    for _, _, value in read_topic(bootstrap, deltas):
        if is_chunk(value):                       # the λ_0 proposal, in chunks of lambda_chunk_bytes
            chunks += 1
            value = asm.feed(value)
            if value is None:
                continue
        for part in split_parts(value):           # a transaction's deltas: one bundle
            d = Delta.decode(part)
            sizes.setdefault(d.kind, []).append(len(part))
    assert min(sizes["delta"]) > 2 << 20 and min(sizes["init"]) > 8 << 20, sizes
    assert chunks >= 8, chunks


def test_a_delta_over_the_limit_stops_the_worker_with_what_to_shrink():
    """A message the applier could not fetch is not sent (a worker would otherwise read the
    batch again and fail again): one line that names the sizes and the settings to shrink."""
    assert check_delta_size(b"x" * MAX_DELTA_BYTES, "the delta") == b"x" * MAX_DELTA_BYTES
    with pytest.raises(ValueError, match=r"scaleout: the delta of 9 records is 64\.0 MiB, over the 64 MiB "
                                         r".*n_components, n_features.*batch_size"):
        check_delta_size(b"x" * (MAX_DELTA_BYTES + 1), "the delta of 9 records")
