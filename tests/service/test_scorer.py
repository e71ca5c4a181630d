"""The scorer role on the real broker: one scored record per input, exactly once.

The daemon writes snapshots (to its checkpoint directory, or on a snapshot topic);
the scorer (in-process here, ``streamsvi run --role scorer`` in the kill test of
``test_scorer_kill.py``) scores a records topic into an output topic. The output is
read back with ``read_committed`` and aborted records dropped on the client
(:mod:`streamsvi.io.committed`), as any consumer of the output would read it, and
checked against ``FittedModel.score`` of the snapshot each record names.
"""
import io
import json
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import CheckpointStore, load_snapshot, pointer_number
from streamsvi.io import JsonCodec, produce_rows
from streamsvi.io import committed
from streamsvi.scoring import FittedModel, load
from streamsvi.service.config import ConfigError, validate
from streamsvi.service.daemon import Daemon
from streamsvi.service.roles.scorer import Scorer, check_scorer_config
from streamsvi.service.roles.snapshot_topic import SnapshotTopicReader, _snapshot

from .conftest import blob_rows, committed_offsets, gmm_config, highwater_marks, produce_raw


def read_committed(bootstrap, topic, partitions=1, timeout_s=30.0, expect=None):
    """Every committed record of ``topic`` (JSON values), read as a read_committed consumer
    whose aborted records are dropped on the client; waits until ``expect`` records are in
    (if given) and the reader is at the end of every partition."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      isolation_level="read_committed", auto_offset_reset="earliest")
    assert committed.install(c)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        filters = {tp: committed.CommittedFilter() for tp in tps}
        out, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for tp, msgs in c.poll(timeout_ms=200).items():
                out += [json.loads(m.value) for m in filters[tp].feed(sorted(msgs, key=lambda m: m.offset))]
            hw = [c.highwater(tp) for tp in tps]
            at_end = None not in hw and all(c.position(tp) >= h for tp, h in zip(tps, hw))
            if at_end and (expect is None or len(out) >= expect):
                return out
        raise AssertionError(f"read {len(out)} committed records of {topic} (expected {expect}) "
                             f"within {timeout_s} s")
    finally:
        c.close()


def _scorer_cfg(tmp_path, bootstrap, topic, group, output, **scorer):
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                     inference={"max_wait_seconds": 0.3})
    raw["scorer"] = {"output_topic": output, "scorer_id": "s1", "snapshot_poll_seconds": 0.05, **scorer}
    return validate(raw)


def _train(tmp_path, bootstrap, topic, group, n, **checkpoint):
    """A daemon drains ``topic`` and writes snapshots; returns the checkpoint directory."""
    cfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                              inference={"max_wait_seconds": 0.3}, checkpoint=checkpoint))
    d = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO())
    res = d.run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained"
    return cfg["checkpoint"]["directory"]


def _by_position(out):
    keyed = {}
    for r in out:
        k = (r["topic"], r["partition"], r["offset"])
        assert k not in keyed, f"{k} scored twice"
        keyed[k] = r
    return keyed


def _check_scores(out, X_at, fitted_of):
    """Each output record's scores equal the model's ``score`` of its input with the
    snapshot it names (``X_at``: input row of a (topic, partition, offset))."""
    by_snap = {}
    for r in out:
        if "reason" not in r:
            by_snap.setdefault(r["snapshot"]["number"], []).append(r)
    for number, recs in by_snap.items():
        fitted = fitted_of(number)
        want = fitted.score(np.array([X_at[(r["topic"], r["partition"], r["offset"])] for r in recs]))
        for r, w in zip(recs, want):
            assert r["snapshot"]["step"] == fitted.step
            assert r["scores"] == w


def _positions(bootstrap, topic, rows, partitions):
    """Produce ``rows`` as JSON, round robin; ``{(topic, p, offset): row}``."""
    payloads = [json.dumps(list(map(float, x))).encode() for x in rows]
    where = produce_raw(bootstrap, topic, payloads, partitions=partitions)
    return {(topic, p, o): x for (p, o), x in zip(where, rows)}


def test_scorer_scores_every_record_once_stamped_with_its_snapshot(kafka_broker, new_topic, new_group, tmp_path):
    bootstrap = kafka_broker.bootstrap
    train, records, output = new_topic(1), new_topic(3), new_topic(1)
    assert produce_rows(bootstrap, train, blob_rows(600, seed=1), JsonCodec(2), partitions=1) == 600
    ck = _train(tmp_path, bootstrap, train, new_group(), 600)
    X = blob_rows(500, seed=7)
    X_at = _positions(bootstrap, records, X, 3)
    cfg = _scorer_cfg(tmp_path, bootstrap, records, new_group(), output)
    cfg["checkpoint"]["directory"] = ck
    reg, out = CollectorRegistry(), io.StringIO()
    s = Scorer(cfg, registry=reg, out=out)
    res = s.run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained", out.getvalue()
    assert res.records == 500 and res.dead == 0
    got = _by_position(read_committed(bootstrap, output, expect=500))
    assert set(got) == set(X_at)
    fitted = load(ck)
    assert {r["snapshot"]["number"] for r in got.values()} == {fitted.number}
    assert next(iter(got.values()))["snapshot"]["watermark"] == {f"{train}/0": 600}
    _check_scores(got.values(), X_at, lambda n: fitted)
    # the input offsets are committed with the output, on the scorer's own group
    hw = highwater_marks(bootstrap, records, 3)
    assert committed_offsets(bootstrap, f"{cfg['source']['group_id']}-scorer", records, 3) == hw
    assert reg.get_sample_value("streamsvi_records_scored_total") == 500
    assert reg.get_sample_value("streamsvi_scoring_duration_seconds_count") >= 1
    assert reg.get_sample_value("streamsvi_scorer_snapshot_number") == fitted.number
    assert reg.get_sample_value("streamsvi_scorer_snapshot_age_seconds") >= 0
    assert "scoring with snapshot" in out.getvalue()


def test_bad_records_get_one_error_record_each_and_never_stop_the_scorer(kafka_broker, new_topic, new_group,
                                                                         tmp_path):
    bootstrap = kafka_broker.bootstrap
    train, records, output = new_topic(1), new_topic(1), new_topic(1)
    produce_rows(bootstrap, train, blob_rows(600, seed=1), JsonCodec(2), partitions=1)
    ck = _train(tmp_path, bootstrap, train, new_group(), 600)
    payloads = [b"[0.5, 1.0]", b"not json", b"[1, 2, 3]", b"[NaN, 1]", b"[2.0, -1.0]", b'{"a": 1}']
    where = produce_raw(bootstrap, records, payloads, partitions=1)
    cfg = _scorer_cfg(tmp_path, bootstrap, records, new_group(), output)
    cfg["checkpoint"]["directory"] = ck
    reg = CollectorRegistry()
    res = Scorer(cfg, registry=reg, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained" and res.records == 2 and res.dead == 4
    got = _by_position(read_committed(bootstrap, output, expect=6))
    assert set(got) == {(records, p, o) for p, o in where}
    reasons = [got[(records, p, o)].get("reason") for p, o in where]
    assert reasons == [None, "json_invalid", "wrong_shape", "non_finite", None, reasons[5]]
    assert reasons[5] is not None
    assert got[(records, 0, where[1][1])]["error"].startswith("json_invalid: ")
    assert reg.get_sample_value("streamsvi_scorer_errors_total", {"reason": "non_finite"}) == 1
    fitted = load(ck)
    _check_scores(got.values(), {(records, 0, where[0][1]): [0.5, 1.0], (records, 0, where[4][1]): [2.0, -1.0]},
                  lambda n: fitted)


def test_a_restarted_scorer_scores_on_with_the_newest_snapshot(kafka_broker, new_topic, new_group, tmp_path):
    """Records scored before a new snapshot name the old one, after it the new one; every input
    offset is answered once. The new snapshot is written by hand while the scorer is stopped,
    between two halves of the stream (a swap while it runs: the next test)."""
    bootstrap = kafka_broker.bootstrap
    train, records, output = new_topic(1), new_topic(2), new_topic(1)
    produce_rows(bootstrap, train, blob_rows(600, seed=1), JsonCodec(2), partitions=1)
    ck = _train(tmp_path, bootstrap, train, new_group(), 600)
    X1, X2 = blob_rows(300, seed=8), blob_rows(300, seed=9)
    X_at = _positions(bootstrap, records, X1, 2)
    cfg = _scorer_cfg(tmp_path, bootstrap, records, new_group(), output, commit_every_batches=2,
                      follow="latest")   # the hand-written snapshot moves latest, not promoted
    cfg["checkpoint"]["directory"] = ck
    reg = CollectorRegistry()
    s = Scorer(cfg, registry=reg, out=io.StringIO())
    first = load(ck).number
    res = s.run(until_drained=True, timeout=60)
    assert res.records == 300
    # a new snapshot (one more update on fresh data) while the scorer is down is taken at start;
    # one written while it runs is swapped in between transactions
    snap = load_snapshot(ck)
    state, _ = snap.engine.update(snap.state, blob_rows(200, seed=10))
    CheckpointStore(ck).save(snap.engine, state, snap.offsets, config=snap.config)
    X_at.update(_positions(bootstrap, records, X2, 2))
    s2 = Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO())
    res2 = s2.run(until_drained=True, timeout=60)
    assert res2.records == 300
    got = _by_position(read_committed(bootstrap, output, expect=600))
    assert set(got) == set(X_at)
    half = {p: sum(1 for k in X_at if k[1] == p) // 2 for p in (0, 1)}     # X1: the first half of each
    for (t, p, o), r in got.items():
        assert r["snapshot"]["number"] == (first if o < half[p] else first + 1), (p, o)
    _check_scores(got.values(), X_at, lambda n: FittedModel.from_snapshot(load_snapshot(f"{ck}/snap-{n:08d}")))


def test_a_scorer_serves_the_promoted_snapshot_not_a_newer_rejected_one(kafka_broker, new_topic, new_group,
                                                                      tmp_path):
    """By default (``scorer.follow = "promoted"``) a snapshot that moved ``latest`` without being
    promoted is not served; ``follow = "latest"`` serves it."""
    bootstrap = kafka_broker.bootstrap
    train, records = new_topic(1), new_topic(1)
    produce_rows(bootstrap, train, blob_rows(600, seed=1), JsonCodec(2), partitions=1)
    ck = _train(tmp_path, bootstrap, train, new_group(), 600)
    promoted = load(ck).number
    snap = load_snapshot(ck, follow="latest")
    state, _ = snap.engine.update(snap.state, blob_rows(200, seed=10) + 30.0)     # far from the data
    newer = CheckpointStore(ck).save(snap.engine, state, snap.offsets, config=snap.config).number
    assert newer > promoted
    _positions(bootstrap, records, blob_rows(50, seed=8), 1)
    for follow, expect in (("promoted", promoted), ("latest", newer)):
        output = new_topic(1)
        cfg = _scorer_cfg(tmp_path, bootstrap, records, new_group(), output, follow=follow)
        cfg["checkpoint"]["directory"] = ck
        assert Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(
            until_drained=True, timeout=60).records == 50
        got = read_committed(bootstrap, output, expect=50)
        assert {r["snapshot"]["number"] for r in got} == {expect}, follow


def test_swap_while_running_happens_between_transactions(kafka_broker, new_topic, new_group, tmp_path):
    """A snapshot written while the scorer runs is swapped in without a stop; within one
    partition the snapshot numbers never go back, and each input is answered once."""
    import threading

    bootstrap = kafka_broker.bootstrap
    train, records, output = new_topic(1), new_topic(1), new_topic(1)
    produce_rows(bootstrap, train, blob_rows(600, seed=1), JsonCodec(2), partitions=1)
    ck = _train(tmp_path, bootstrap, train, new_group(), 600)
    X = blob_rows(2000, seed=11)
    X_at = _positions(bootstrap, records, X[:1000], 1)
    cfg = _scorer_cfg(tmp_path, bootstrap, records, new_group(), output, commit_every_batches=1,
                      follow="latest")   # the hand-written snapshots move latest, not promoted
    cfg["checkpoint"]["directory"] = ck
    cfg["inference"]["batch_size"] = 20
    s = Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO())
    first = load(ck).number

    def write_snapshot_then_more_records():
        deadline = time.monotonic() + 60
        while s.scored < 200 and time.monotonic() < deadline:     # mid-stream
            time.sleep(0.01)
        snap = load_snapshot(ck)
        state, _ = snap.engine.update(snap.state, blob_rows(200, seed=12))
        CheckpointStore(ck).save(snap.engine, state, snap.offsets, config=snap.config)
        while s.snapshots.newest().number != first + 1 and time.monotonic() < deadline:
            time.sleep(0.01)                    # loaded by the watcher: the records below see it
        X_at.update(_positions(bootstrap, records, X[1000:], 1))
        while s.scored < 2000 and time.monotonic() < deadline:
            time.sleep(0.01)
        s.request_stop("done")

    t = threading.Thread(target=write_snapshot_then_more_records, daemon=True)
    t.start()
    res = s.run(timeout=90)
    t.join(10)
    assert res.records == 2000 and res.stopped_by == "done", res
    got = read_committed(bootstrap, output, expect=2000)
    keyed = _by_position(got)
    assert set(keyed) == set(X_at)
    seq = [keyed[k]["snapshot"]["number"] for k in sorted(keyed, key=lambda k: k[2])]
    assert seq[0] == first and seq[-1] == first + 1
    assert seq == sorted(seq)                   # one swap, never back
    _check_scores(keyed.values(), X_at, lambda n: FittedModel.from_snapshot(load_snapshot(f"{ck}/snap-{n:08d}")))


def test_scores_from_the_snapshot_topic_without_a_shared_directory(kafka_broker, new_topic, new_group, tmp_path):
    bootstrap = kafka_broker.bootstrap
    train, records, output, snaps = new_topic(1), new_topic(2), new_topic(1), new_topic(1)
    produce_rows(bootstrap, train, blob_rows(600, seed=1), JsonCodec(2), partitions=1)
    ck = _train(tmp_path / "daemon", bootstrap, train, new_group(), 600, snapshot_topic=snaps)
    reader = SnapshotTopicReader(bootstrap, snaps)
    try:
        from_topic = reader.latest(timeout_s=5)
    finally:
        reader.close()
    on_disk = load_snapshot(ck)
    assert from_topic.number == on_disk.number and from_topic.step == on_disk.step
    assert from_topic.offsets == on_disk.offsets
    X = blob_rows(400, seed=13)
    X_at = _positions(bootstrap, records, X, 2)
    cfg = _scorer_cfg(tmp_path / "scorer", bootstrap, records, new_group(), output, snapshot_topic=snaps)
    assert cfg["checkpoint"]["directory"] != ck
    res = Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.records == 400
    got = _by_position(read_committed(bootstrap, output, expect=400))
    assert set(got) == set(X_at)
    assert {r["snapshot"]["number"] for r in got.values()} == {on_disk.number}
    _check_scores(got.values(), X_at, lambda n: FittedModel.from_snapshot(on_disk))


def test_scorer_config_is_checked(tmp_path):
    raw = gmm_config(tmp_path, bootstrap="127.0.0.1:9", topic="t", group="g")
    cfg = validate(raw)
    try:
        check_scorer_config(cfg)
    except ConfigError as exc:
        assert "scorer.output_topic" in str(exc)
    else:
        raise AssertionError("no output topic accepted")
    raw["scorer"] = {"output_topic": "t"}
    try:
        check_scorer_config(validate(raw))
    except ConfigError as exc:
        assert "also in source.topics" in str(exc)
    else:
        raise AssertionError("output topic = input topic accepted")


def test_batches_say_where_each_accepted_record_came_from():
    """``Batch.positions`` (what the scorer stamps on its output): one per accepted record, in
    ``x``'s order, rejected records left out; the row of a multi-row message."""
    from streamsvi.io.dense import BinaryBatchCodec, JsonCodec, RecordValidator
    from streamsvi.io.sources import MemorySource
    from streamsvi.io.sources.base import _BatchBuilder

    X = np.array([[0.0, 1.0], [np.nan, 1.0], [2.0, 3.0]])
    src = MemorySource(X, name="m")
    src.track_positions = True
    b = src.poll_batch(10)
    assert b.positions == [("m", 0, 0, None), ("m", 0, 2, None)] and b.x.shape == (2, 2)
    assert MemorySource(X).poll_batch(10).positions is None          # not asked for: none kept

    json_b = _BatchBuilder(JsonCodec(2), RecordValidator(2), 2, track_positions=True)
    json_b.add_messages([("t", 1, 5, b"[1, 2]"), ("t", 1, 6, b"[1]"), ("t", 1, 7, b"[3, 4]")])
    assert json_b.batch().positions == [("t", 1, 5, None), ("t", 1, 7, None)]

    codec = BinaryBatchCodec(2)
    binary = _BatchBuilder(codec, RecordValidator(2), 2, track_positions=True)
    binary.add_messages([("t", 0, 10, codec.encode(np.array([[1.0, 2.0], [np.inf, 0.0], [5.0, 6.0]]))),
                         ("t", 0, 11, codec.encode(np.array([[7.0, 8.0]])))])
    batch = binary.batch()
    assert batch.positions == [("t", 0, 10, 0), ("t", 0, 10, 2), ("t", 0, 11, 0)]
    assert batch.x.tolist() == [[1.0, 2.0], [5.0, 6.0], [7.0, 8.0]]
    assert [(d.position.offset, d.row) for d in batch.dead] == [(10, 1)]


def test_snapshot_topic_reader_returns_each_newer_complete_snapshot(kafka_broker, new_topic):
    """The reader starts at the newest snapshot, returns a snapshot once, then only newer ones;
    a snapshot in chunks comes back whole and equal."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from streamsvi import SVI, BayesianGMM
    from streamsvi.service.roles.snapshot_topic import SnapshotPublisher

    bootstrap, topic = kafka_broker.bootstrap, new_topic(1)
    X = blob_rows(300, seed=3)
    engine = SVI(BayesianGMM(3, 2), n_total=300)
    state = engine.init(X, seed=0)
    pub = SnapshotPublisher(bootstrap, topic, f"test-{topic}", chunk_bytes=1024)    # several chunks
    snaps = []
    try:
        for number in (1, 2):
            state, _ = engine.update(state, X)
            snaps.append((number, state))
            assert pub.publish(engine, state, SimpleNamespace(number=number, created=datetime.now(timezone.utc),
                                                              offsets=[{"source": "t", "partition": 0,
                                                                        "offset": 100 * number}],
                                                              version="test"))
        reader = SnapshotTopicReader(bootstrap, topic)
        try:
            got = reader.latest(timeout_s=2)
            assert got.number == 2 and got.step == snaps[1][1].step
            assert got.offsets == [{"source": "t", "partition": 0, "offset": 200}]
            assert _scores(got, X) == _scores(_snapshot(engine, snaps[1][1], {"number": 2, "created": "2026-01-01T00:00:00+00:00",
                                                                             "offsets": []}, "memory"), X)
            assert reader.latest(timeout_s=0.3) is None                      # nothing newer
            state, _ = engine.update(state, X)
            pub.publish(engine, state, SimpleNamespace(number=3, created=datetime.now(timezone.utc), offsets=[],
                                                       version="test"))
            got3 = reader.latest(timeout_s=5)
            assert got3.number == 3 and got3.step == state.step
            assert _scores(got3, X) == _scores(_snapshot(engine, state, {"number": 3, "created": "2026-01-01T00:00:00+00:00",
                                                                          "offsets": []}, "memory"), X)
        finally:
            reader.close()
    finally:
        pub.close()



def _scores(snap, X):
    return FittedModel.from_snapshot(snap).score(X[:20])


def test_scores_with_the_appliers_lambda_from_its_lambda_topic(kafka_broker, new_topic, new_group, tmp_path):
    """Scale-out, no shared storage: the scorer follows the applier's lambda topic; each output
    names the λ version it was scored with, and its scores are that λ's (the applier's
    checkpoint of the same version, bit for bit)."""
    from streamsvi.service.roles.transport import init_delta

    from .test_scaleout import _applier_setup, _delta, _produce_deltas, _run_applier

    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    cfg, engine, state0, X = _applier_setup(tmp_path / "applier", bootstrap, deltas, new_group(),
                                            lambda_full_every=2, max_staleness=1000)
    ds = [_delta(engine, state0, X, 50 * i, 50 * (i + 1)) for i in range(3)]
    _produce_deltas(bootstrap, deltas, [init_delta("w0", engine, state0).encode()] + [d.encode() for d in ds])
    _, res = _run_applier(cfg, CollectorRegistry(), max_deltas=3)
    assert res.deltas == 3
    applied = load_snapshot(cfg["checkpoint"]["directory"])

    records, output = new_topic(2), new_topic(1)
    X_at = _positions(bootstrap, records, blob_rows(300, seed=14), 2)
    raw = gmm_config(tmp_path / "scorer", bootstrap=bootstrap, topic=records, group=new_group(),
                     inference={"max_wait_seconds": 0.3, "n_total": 1000})
    raw["scaleout"] = {"deltas_topic": deltas}
    raw["scorer"] = {"output_topic": output, "scorer_id": "s-lambda", "from_lambda": True}
    scfg = validate(raw)
    res = Scorer(scfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.records == 300
    got = _by_position(read_committed(bootstrap, output, expect=300))
    assert set(got) == set(X_at)
    assert {r["snapshot"]["number"] for r in got.values()} == {applied.state.step}
    _check_scores(got.values(), X_at, lambda n: FittedModel.from_snapshot(applied))


def test_a_snapshot_of_another_model_is_refused_at_start(tmp_path):
    from streamsvi import SVI, BayesianGMM

    X = blob_rows(100, seed=2)
    X3 = np.column_stack([X, X[:, 0]])
    engine = SVI(BayesianGMM(3, 3), n_total=100)
    ck = tmp_path / "other"
    CheckpointStore(ck).save(engine, engine.init(X3, seed=0), offsets=[])
    cfg = _scorer_cfg(tmp_path, "127.0.0.1:9", "t", "g", "out")
    cfg["checkpoint"]["directory"] = str(ck)
    try:
        Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(timeout=10)
    except ConfigError as exc:
        assert "cannot score these records: it has 3 features, the config's model 2" in str(exc)
    else:
        raise AssertionError("a 3-feature snapshot was used for 2-feature records")


def test_serving_while_the_daemon_learns_through_the_snapshot_topic(kafka_broker, new_topic, new_group, tmp_path):
    """The daemon learns and publishes snapshots on the snapshot topic while the scorer, with a
    directory of its own, scores a stream: the scorer swaps snapshots as they come, never back,
    and every input is answered once with the scores of the snapshot it names."""
    import threading

    bootstrap = kafka_broker.bootstrap
    train, records, output, snaps = new_topic(1), new_topic(1), new_topic(1), new_topic(1)
    produce_rows(bootstrap, train, blob_rows(300, seed=1), JsonCodec(2), partitions=1)
    dcfg = validate(gmm_config(tmp_path / "daemon", bootstrap=bootstrap, topic=train, group=new_group(),
                               inference={"max_wait_seconds": 0.2},
                               checkpoint={"snapshot_topic": snaps, "every_batches": 2, "keep": 1000},
                               promotion={"enabled": False}))      # every snapshot is published
    d = Daemon(dcfg, registry=CollectorRegistry(), out=io.StringIO())
    learner = threading.Thread(target=lambda: d.run(timeout=120), daemon=True)
    learner.start()
    ck = dcfg["checkpoint"]["directory"]
    deadline = time.monotonic() + 60
    while load_first(ck) is None and time.monotonic() < deadline:
        time.sleep(0.05)

    cfg = _scorer_cfg(tmp_path / "scorer", bootstrap, records, new_group(), output, snapshot_topic=snaps,
                      commit_every_batches=1)
    cfg["inference"]["batch_size"] = 25
    s = Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO())
    X, X_at = blob_rows(5000, seed=15), {}

    def score_some():
        """25 more records, and wait until the scorer has answered them."""
        i = len(X_at)
        X_at.update(_positions(bootstrap, records, X[i:i + 25], 1))
        while s.scored < len(X_at) and time.monotonic() < deadline + 60:
            time.sleep(0.02)

    def feed():
        """Three times: more training data, a new snapshot, records until the scorer uses it."""
        score_some()
        for r in range(3):
            before = pointer_number(ck)
            produce_rows(bootstrap, train, blob_rows(150, seed=100 + r), JsonCodec(2), partitions=1)
            while pointer_number(ck) == before and time.monotonic() < deadline + 60:
                time.sleep(0.02)
            while s.fitted.number < pointer_number(ck) and len(X_at) < len(X) - 25:
                score_some()
        score_some()
        s.request_stop("done")

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    res = s.run(timeout=120)
    t.join(10)
    d.request_stop("done")
    learner.join(30)
    assert res.stopped_by == "done" and res.records == len(X_at), res
    got = _by_position(read_committed(bootstrap, output, expect=len(X_at)))
    assert set(got) == set(X_at)
    seq = [got[k]["snapshot"]["number"] for k in sorted(got, key=lambda k: k[2])]
    assert seq == sorted(seq) and len(set(seq)) >= 4, sorted(set(seq))    # swapped as it learnt, never back
    _check_scores(got.values(), X_at, lambda n: FittedModel.from_snapshot(load_snapshot(f"{ck}/snap-{n:08d}")))


def load_first(ck):
    try:
        return load(ck)
    except (FileNotFoundError, ValueError):
        return None


def test_a_pmf_scorer_predicts_unrated_pairs_and_top_k(kafka_broker, new_topic, new_group, tmp_path):
    """The scorer reads ratings records as ``streamsvi score`` does: a pair without a rating gets
    its prediction and sd, a user alone the top-k items the user has not rated, a rating its log
    density; each output equals ``fitted.score`` of that record."""
    from streamsvi.inference import SVI
    from streamsvi.models import PMF

    model = PMF(n_factors=2, sigma2=0.25, prior_var=1.0, biases=True, offset=3.0)
    x = PMF.synthetic_ratings()
    engine = SVI(model, n_total=len(x))
    state = engine.init(x, seed=0)
    for _ in range(3):
        state, _ = engine.update(state, x)
    ck = tmp_path / "pmf-ck"
    CheckpointStore(ck).save(engine, state, offsets=[])
    fitted = load(ck)
    user = x.user[0]
    asks = [{"user": user, "item": x.item[1]}, {"user": user}, {"user": "nobody", "item": "nothing"},
            {"user": user, "item": x.item[1], "rating": 2.0}, {"item": x.item[1]}]
    bootstrap = kafka_broker.bootstrap
    records, output = new_topic(1), new_topic(1)
    where = produce_raw(bootstrap, records, [json.dumps(a).encode() for a in asks], partitions=1)
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=records, group=new_group(),
                     inference={"max_wait_seconds": 0.3})
    raw["model"] = {"kind": "pmf", "n_factors": 2, "sigma2": 0.25, "prior_var": 1.0, "biases": True,
                    "offset": 3.0}
    del raw["inference"]["effective_batch_size"]
    raw["metrics"] = {"enabled": False, "progress_seconds": 0.0}
    raw["checkpoint"]["directory"] = str(ck)
    raw["scorer"] = {"output_topic": output, "scorer_id": "s1", "snapshot_poll_seconds": 0.05}
    cfg = validate(raw)
    res = Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=60)
    got = _by_position(read_committed(bootstrap, output, expect=len(asks)))
    assert (res.records, res.dead) == (len(asks) - 1, 1), [{k: v for k, v in r.items() if k not in ("snapshot", "topic")} for r in got.values()]
    expect = fitted.score(asks)
    for (p, o), want in zip(where, expect):
        r = got[(records, p, o)]
        r = r if "reason" in want else r["scores"]
        for k, v in want.items():
            if isinstance(v, float):
                assert r[k] == pytest.approx(v, rel=1e-12), k
            else:
                assert r[k] == v, k
    first = got[(records, *where[0])]["scores"]
    assert "prediction" in first and first["sd"] > 0 and "log_density" not in first
    assert len(got[(records, *where[1])]["scores"]["top_k"]) > 0
    assert "log_density" in got[(records, *where[3])]["scores"]
    assert got[(records, *where[4])]["reason"] == "missing_field"


def test_with_promotion_the_snapshot_topic_carries_the_promoted_snapshots(kafka_broker, new_topic, new_group,
                                                                         tmp_path):
    """Promotion on (the default): a snapshot is published when it is promoted, so a scorer
    without shared storage serves what one following ``promoted`` serves; a rejected snapshot
    (one that learned a burst of far-off records) never reaches the topic."""
    bootstrap = kafka_broker.bootstrap
    train, snaps = new_topic(1), new_topic(1)
    X = np.concatenate([blob_rows(300, seed=1), blob_rows(100, seed=2) + 40.0, blob_rows(200, seed=3)])
    produce_rows(bootstrap, train, X, JsonCodec(2), partitions=1)
    dcfg = validate(gmm_config(tmp_path, bootstrap=bootstrap, topic=train, group=new_group(),
                               inference={"max_wait_seconds": 0.3},
                               checkpoint={"snapshot_topic": snaps, "every_batches": 2, "keep": 1000}))
    d = Daemon(dcfg, registry=CollectorRegistry(), out=io.StringIO())
    assert d.run(until_drained=True, timeout=60).stopped_by == "drained"
    decided = {x["candidate"]: x["outcome"] for x in d.promotion.decisions}
    promoted = sorted(n for n, o in decided.items() if o == "promoted")
    assert "rejected" in decided.values(), decided
    assert d._snapshot_publisher.published == len(promoted)
    reader = SnapshotTopicReader(bootstrap, snaps)
    try:
        got = reader.latest(timeout_s=5)
    finally:
        reader.close()
    assert got.number == promoted[-1] == load(dcfg["checkpoint"]["directory"]).number
