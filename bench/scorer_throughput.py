"""The scorer role's throughput through Kafka against in-memory scoring (records/s), and
what a snapshot on the snapshot topic costs for a large λ.

Fits a Bayesian GMM (D = 8, K = 10) in memory, saves it with the real checkpoint store,
produces N JSON records to a 3-partition topic of a local broker (tansu, 127.0.0.1),
then, in alternated rounds:

* ``in-memory``: ``FittedModel.score`` on the same records, decoded already, in blocks
  of ``batch_size`` (what the scorer calls, nothing else);
* ``scorer``: :class:`~streamsvi.service.roles.scorer.Scorer` in-process on a fresh
  group and output topic until drained: read, decode, validate, score, one JSON output
  record each, the input offsets and output committed in Kafka transactions. Timed from
  its first scored batch to the end of its run (the group join left out).

Prints each round, then medians and the ratio scorer / in-memory measured in this run.
With ``--lambda-mb M``, also times publishing one snapshot of an LDA λ of about M MB on
a snapshot topic (``SnapshotPublisher.publish``) and reading it back
(``SnapshotTopicReader.latest``).

Run: ``python bench/scorer_throughput.py [--records 50000] [--rounds 3] [--lambda-mb 80]``.
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import io  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import uuid  # noqa: E402

import numpy as np  # noqa: E402


def fit(tmp, n):
    from streamsvi.checkpoint import CheckpointStore
    from streamsvi.inference import SVI, RobbinsMonro
    from streamsvi.models import BayesianGMM

    rng = np.random.default_rng(0)
    D, K = 8, 10
    centers = rng.normal(0, 4, (K, D))
    X = centers[rng.integers(0, K, n)] + rng.normal(size=(n, D))
    engine = SVI(BayesianGMM(K, D), n_total=len(X), schedule=RobbinsMonro(1.0, 0.7))
    state, _ = engine.fit(engine.init(X[:1000], seed=0), X, n_steps=50, batch_size=1000)
    CheckpointStore(tmp).save(engine, state, offsets=[])
    return X


def in_memory(fitted, X, batch):
    t0 = time.perf_counter()
    for i in range(0, len(X), batch):
        fitted.score(X[i:i + batch])
    return len(X) / (time.perf_counter() - t0)


def through_kafka(bootstrap, topic, ck, n, batch):
    from prometheus_client import CollectorRegistry

    from streamsvi.io import create_topic
    from streamsvi.service.config import validate
    from streamsvi.service.roles.scorer import Scorer

    class Timed(Scorer):
        first = None

        def _learn(self, x, source, loop):
            if self.first is None:
                self.first = (time.perf_counter(), self.kind.n_records(x))
            super()._learn(x, source, loop)

    out = f"scored-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, out, partitions=1)
    cfg = validate({
        "model": {"kind": "gmm", "n_components": 10, "n_features": 8},
        "inference": {"n_total": n, "batch_size": batch, "max_wait_seconds": 0.5},
        "source": {"bootstrap_servers": bootstrap, "topics": [topic], "group_id": f"g-{uuid.uuid4().hex[:8]}"},
        "checkpoint": {"directory": ck},
        "metrics": {"enabled": False, "progress_seconds": 0.0},
        "scorer": {"output_topic": out, "scorer_id": "bench", "commit_every_batches": 8}})
    s = Timed(cfg, registry=CollectorRegistry(), out=io.StringIO())
    res = s.run(until_drained=True, timeout=600)
    t_end = time.perf_counter()
    assert res.records == n, res
    t0, n0 = s.first
    return (n - n0) / (t_end - t0)


def snapshot_topic_cost(bootstrap, mb):
    from datetime import datetime, timezone
    from types import SimpleNamespace

    import scipy.sparse as sp

    from streamsvi.inference import SVI
    from streamsvi.io import create_topic
    from streamsvi.models import LDA
    from streamsvi.service.roles.lambda_log import state_bytes
    from streamsvi.service.roles.snapshot_topic import SnapshotPublisher, SnapshotTopicReader

    K = 100
    V = max(1000, int(mb * 1e6 / 8 / K))
    engine = SVI(LDA(K, V), n_total=1000)

    rng = np.random.default_rng(0)
    docs = sp.random(50, V, density=20 / V, format="csr", random_state=1, data_rvs=lambda k: rng.integers(1, 4, k))
    state = engine.init(docs, seed=0)
    topic = f"snapshots-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=1)
    pub = SnapshotPublisher(bootstrap, topic, f"bench-{topic}", 1_000_000)

    snap = SimpleNamespace(number=1, created=datetime.now(timezone.utc), offsets=[], version="bench")
    pub._open()
    t0 = time.perf_counter()
    assert pub.publish(engine, state, snap)
    t_pub = time.perf_counter() - t0
    pub.close()

    size = len(state_bytes(engine, state))
    reader = SnapshotTopicReader(bootstrap, topic)
    t0 = time.perf_counter()
    got = reader.latest(timeout_s=30)
    t_read = time.perf_counter() - t0
    reader.close()
    assert got is not None and got.number == 1
    print(f"snapshot topic, LDA K = {K}, V = {V}: {size / 1e6:.1f} MB per snapshot; publish {t_pub:.2f} s "
          f"({size / 1e6 / t_pub:.0f} MB/s), a scorer's read {t_read:.2f} s ({size / 1e6 / t_read:.0f} MB/s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lambda-mb", type=float, default=0.0)
    args = ap.parse_args()
    from streamsvi.io import JsonCodec, LocalBroker, create_topic, produce_rows
    from streamsvi.scoring import load

    with LocalBroker() as broker, tempfile.TemporaryDirectory() as ck:
        print("fitting ...", file=sys.stderr, flush=True)
        X = fit(ck, args.records)
        fitted = load(ck)
        topic = f"records-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, partitions=3)
        produce_rows(broker.bootstrap, topic, X, JsonCodec(8), partitions=3)
        rates = {"in-memory": [], "scorer": []}
        for r in range(args.rounds):
            order = ["in-memory", "scorer"] if r % 2 == 0 else ["scorer", "in-memory"]
            for how in order:
                v = in_memory(fitted, X, args.batch_size) if how == "in-memory" else \
                    through_kafka(broker.bootstrap, topic, ck, args.records, args.batch_size)
                rates[how].append(v)
                print(f"round {r + 1}: {how:9s} {v:12,.0f} records/s", flush=True)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"\nmedians over {args.rounds} rounds, {args.records:,} records, GMM K = 10, D = 8, "
              f"batch {args.batch_size}:")
        print(f"| path | records/s |\n|---|---|\n| in-memory FittedModel.score | {med['in-memory']:,.0f} |\n"
              f"| scorer through Kafka (exactly once) | {med['scorer']:,.0f} |")
        print(f"scorer / in-memory: {med['scorer'] / med['in-memory']:.3f}")
        if args.lambda_mb:
            snapshot_topic_cost(broker.bootstrap, args.lambda_mb)


if __name__ == "__main__":
    main()
