"""λ on the lambda topic (issue 25 item 3): workers need only the bootstrap servers.

Real broker, no mocks: the in-process :class:`Applier` writes full λs and steps
on the lambda topic, :class:`LambdaLog` readers (a worker's view) replay them,
and the result is compared bit for bit with the applier's checkpoint. The last
test runs the real CLI roles with a separate directory per process. Every wait
is on a condition (a reader's version, a process's exit), never a sleep.
"""
import signal
import threading
import time

import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.io import JsonCodec, produce_rows
from streamsvi.service.roles import lambda_log
from streamsvi.service.roles.lambda_log import LambdaLog, LambdaLogWriter, full_records
from streamsvi.service.roles.transport import encode_bundle, init_delta

from .conftest import blob_rows, gmm_config, highwater_marks, read_topic, write_config
from .test_scaleout import _applier_setup, _apply, _check_exactly_once, _delta, _metric, _produce_deltas, _wait


def _reader(bootstrap, lam_topic, deltas):
    return LambdaLog(bootstrap, lam_topic, deltas, client_id="test-lambda-reader")


def _until_version(reader, version, timeout_s=60.0):
    """Refresh ``reader`` until it holds ``version`` (a condition, polled)."""
    return _wait(lambda: (reader.refresh(timeout_s=0.2) or True) and reader.version == version,
                 f"the reader at λ version {version} (has {reader.version})", timeout_s)


def _same_state(a, b):
    assert (a.step, a.records_seen) == (b.step, b.records_seen)
    assert list(a.lam) == list(b.lam)
    assert a.lam.array_equal(b.lam), "λ differs"          # bit for bit (array_equal, no tolerance)
    for k in a.lam:
        assert a.lam[k].tobytes() == b.lam[k].tobytes(), k


def _own_directories(kafka_broker, new_topic, new_group, tmp_path, n, partitions, seed, names):
    """``n`` records produced on a new topic, and a config per process ``names`` (appliers and
    workers "w…") in a directory of its own: no storage shared. Returns (topic, deltas topic, highwater
    marks, {name: config path}, {name: directory})."""
    bootstrap = kafka_broker.bootstrap
    topic, deltas, group = new_topic(partitions), new_topic(1, prefix="deltas"), new_group()
    produce_rows(bootstrap, topic, blob_rows(n, seed=seed), JsonCodec(2), partitions=partitions)
    hw = highwater_marks(bootstrap, topic, partitions)
    cfgs, dirs = {}, {}
    for name in names:
        dirs[name] = tmp_path / name
        dirs[name].mkdir()
        raw = gmm_config(dirs[name], bootstrap=bootstrap, topic=topic, group=group, name="ck",
                         inference={"batch_size": 50, "max_wait_seconds": 1.0, "n_total": n,
                                    "effective_batch_size": 20},
                         checkpoint={"every_batches": 5, "every_seconds": 3600.0, "keep": 3},
                         metrics={"enabled": False, "heldout_size": 0})
        raw["scaleout"] = {"deltas_topic": deltas, "max_staleness": 1000, "lambda_full_every": 10}
        if name.startswith("w"):
            raw["scaleout"]["worker_id"] = f"{name}-{group}"
        cfgs[name] = write_config(dirs[name] / f"{name}.toml", raw)
    return topic, deltas, hw, cfgs, dirs


def _finish_after_takeover(reader, standby, ws, first_lineage, ck, topic, hw, n, partitions):
    """After an active applier was killed: the workers drain, λ on the topic holds every record
    in the standby's own lineage, the standby stops cleanly, and its checkpoint ``ck`` has
    every record exactly once, bit for bit the reader's λ. Returns that snapshot."""
    for w in ws:
        assert w.wait(180) == 0, w.stderr()[-3000:]
    _wait(lambda: (reader.refresh(timeout_s=0.2) or True) and reader.state.records_seen >= n,
          "every record in λ", 120, procs=[standby])
    assert reader.lineage != first_lineage                    # the standby's own lineage
    standby.signal(signal.SIGTERM)
    assert standby.wait(60) == 0, standby.stderr()[-3000:]
    snap = _check_exactly_once(ck, topic, hw, n, partitions=partitions)
    _same_state(reader.state, snap.state)
    return snap


def _start_applier(cfg, max_deltas):
    from prometheus_client import CollectorRegistry

    from streamsvi.service.roles.applier import Applier

    applier = Applier(cfg, registry=CollectorRegistry(), out=open("/dev/null", "w"))
    out = {}
    t = threading.Thread(target=lambda: out.update(res=applier.run(max_deltas=max_deltas, timeout=120)),
                         daemon=True)
    t.start()
    return t, out


def test_readers_replay_the_appliers_lambda_bit_for_bit(kafka_broker, new_topic, new_group, tmp_path):
    """A reader started before the first λ follows every step (and the new lineage of a
    second applier run, which resumes from the checkpoint); one started late (after several
    full λs) loads the latest full λ. Both hold the checkpointed λ, bit for bit."""
    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    lam_topic = f"{deltas}-lambda"
    cfg, engine, state0, _ = _applier_setup(tmp_path, bootstrap, deltas, new_group(), lambda_full_every=3,
                                          max_staleness=4)   # (later deltas are down-weighted: rho_scale < 1)
    X = blob_rows(1000, seed=9)
    ds = [_delta(engine, state0, X, 50 * i, 50 * (i + 1), worker=f"w{i % 3}") for i in range(15)]

    early = _reader(bootstrap, lam_topic, deltas)
    assert not early.refresh() and early.state is None          # nothing published yet
    t, out = _start_applier(cfg, max_deltas=12)
    _produce_deltas(bootstrap, deltas, [init_delta("w0", engine, state0).encode()] + [d.encode() for d in ds[:4]])
    _until_version(early, 4)
    # following the steps, its fetches wait long at the broker (cheap for it, answered when
    # records come); finding the full λ, short
    assert early._lc._fetcher.config["fetch_max_wait_ms"] == lambda_log.FOLLOW_WAIT_MS
    for part in (ds[4:8], ds[8:12]):
        _produce_deltas(bootstrap, deltas, [d.encode() for d in part])
        _until_version(early, early.version + len(part))
    t.join(60)
    assert out["res"].deltas == 12
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.step == 12
    _same_state(early.state, snap.state)
    # it followed the log: steps replayed, or skipped for a later full λ in the same read (the
    # replay itself: the late reader below and the bundled deltas' test)
    assert early.stats["steps_applied"] + early.stats["steps_skipped"] >= 4, early.stats

    # a second applier run: a takeover from the checkpoint, a new lineage (its own full λ)
    first_lineage = early.lineage
    cfg["scaleout"]["lambda_full_every"] = 4           # (so the last three steps follow the takeover's full λ)
    t, out = _start_applier(cfg, max_deltas=3)
    _produce_deltas(bootstrap, deltas, [d.encode() for d in ds[12:]])
    _until_version(early, 15)
    t.join(60)
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    _same_state(early.state, snap.state)
    assert early.lineage != first_lineage

    late = _reader(bootstrap, lam_topic, deltas)      # after several full λs: the takeover's, then 3 steps
    t0 = time.perf_counter()
    assert late.refresh()
    print(f"late reader caught up in {time.perf_counter() - t0:.2f} s: {late.stats}")
    _same_state(late.state, snap.state)
    assert (late.stats["fulls_loaded"], late.stats["steps_applied"]) == (1, 3), late.stats
    assert late.lineage == early.lineage
    early.close()
    late.close()


def test_a_reader_that_fell_behind_loads_the_latest_full_lambda_instead_of_replaying(
        kafka_broker, new_topic, new_group, tmp_path):
    """A worker that fell behind by several versions (many workers, a large delta) meets,
    in what it reads, full λs written after its version: it loads the latest one instead
    of replaying the steps before it (their deltas neither read nor applied), and holds
    the applier's λ bit for bit."""
    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    lam_topic = f"{deltas}-lambda"
    cfg, engine, state0, _ = _applier_setup(tmp_path, bootstrap, deltas, new_group(), lambda_full_every=3,
                                          max_staleness=16)
    X = blob_rows(1000, seed=12)
    ds = [_delta(engine, state0, X, 50 * i, 50 * (i + 1), worker=f"w{i % 2}") for i in range(13)]
    reader = _reader(bootstrap, lam_topic, deltas)
    t, out = _start_applier(cfg, max_deltas=13)
    _produce_deltas(bootstrap, deltas, [init_delta("w0", engine, state0).encode()])
    _until_version(reader, 0)                                    # λ_0; then it reads nothing
    _produce_deltas(bootstrap, deltas, [d.encode() for d in ds])
    t.join(60)
    assert out["res"].deltas == 13
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.step == 13
    _until_version(reader, 13)
    _same_state(reader.state, snap.state)
    st = reader.stats
    # full λs at versions 3, 6, 9, 12: at most the steps after the last full λ of each poll are
    # replayed (one poll: step 13 only), the others skipped
    assert st["fulls_loaded"] >= 2 and st["steps_skipped"] >= 9, st
    assert st["steps_applied"] + st["steps_skipped"] <= 13 and st["steps_applied"] <= 4, st
    reader.close()


def test_bundled_deltas_are_applied_in_order_and_replayed_part_by_part(kafka_broker, new_topic, new_group,
                                                                        tmp_path):
    """A worker's transaction of several batches is one message, a bundle of its deltas. The
    applier applies each part in order, as if they came one message each (checked against
    the engine's steps, bit for bit); a part that does not decode is set aside alone; the
    lambda topic's steps name (offset, part), and a reader replays them to the applier's λ
    bit for bit."""
    from prometheus_client import CollectorRegistry

    from streamsvi.service.roles.applier import Applier

    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    cfg, engine, state0, _ = _applier_setup(tmp_path, bootstrap, deltas, new_group(), lambda_full_every=1000,
                                          max_staleness=1000)     # (one full λ, at λ_0: then steps only)
    X = blob_rows(1000, seed=11)
    ds = [_delta(engine, state0, X, 50 * i, 50 * (i + 1), worker="w0") for i in range(9)]
    msgs = [encode_bundle([d.encode() for d in ds[:3]]), ds[3].encode(), encode_bundle([d.encode() for d in ds[4:5]]),
            encode_bundle([ds[5].encode(), b"SSVD1\n garbage", ds[6].encode(), ds[7].encode(), ds[8].encode()])]
    reader = _reader(bootstrap, f"{deltas}-lambda", deltas)
    registry, out = CollectorRegistry(), {}
    applier = Applier(cfg, registry=registry, out=open("/dev/null", "w"))
    t = threading.Thread(target=lambda: out.update(res=applier.run(max_deltas=9, timeout=60)), daemon=True)
    t.start()
    _produce_deltas(bootstrap, deltas, [init_delta("w0", engine, state0).encode()])
    _until_version(reader, 0)                   # the full λ_0; the steps after it are replayed
    _produce_deltas(bootstrap, deltas, msgs)
    t.join(60)
    res = out["res"]
    assert (res.deltas, res.records, res.skipped) == (9, 450, 1), res   # (a part that does not decode: skipped, not a delta)
    assert _metric(registry, "streamsvi_deltas_skipped_total", reason="bad") == 1.0
    expected = state0
    for d in ds:
        expected, _ = _apply(engine, expected, d)
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.step == 9 and snap.extra["scaleout"]["applied"] == {"data/0": [[0, 450]]}
    assert snap.state.lam.array_equal(expected.lam)
    _until_version(reader, 9)
    _same_state(reader.state, snap.state)
    assert (reader.stats["fulls_loaded"], reader.stats["steps_applied"]) == (1, 9), reader.stats
    late = _reader(bootstrap, f"{deltas}-lambda", deltas)          # a reader that starts after it all
    assert late.refresh()
    _same_state(late.state, snap.state)
    assert (late.stats["fulls_loaded"], late.stats["steps_applied"]) == (1, 9), late.stats
    # a worker replays the bundles it committed itself from the bytes it sent (LambdaLog.remember),
    # not from the broker: the same λ, bit for bit; a remembered bundle is what is applied (one
    # that differs from the broker's copy gives another λ)
    sent = {offset: value for _, offset, value in read_topic(bootstrap, deltas) if value in msgs}
    assert sorted(sent.values(), key=msgs.index) == msgs
    own, other = _reader(bootstrap, f"{deltas}-lambda", deltas), _reader(bootstrap, f"{deltas}-lambda", deltas)
    for offset, value in sent.items():
        own.remember(offset, value)
        other.remember(offset, ds[0].encode() if value == ds[3].encode() else value)
    assert own.refresh() and other.refresh()
    _same_state(own.state, snap.state)
    assert own.stats["own_deltas_reused"] == 4 and own.stats["steps_applied"] == 9, own.stats
    assert other.state.step == 9 and not other.state.lam.array_equal(snap.state.lam)
    for r in (reader, late, own, other):
        r.close()


def test_a_chunked_full_lambda_round_trips_and_a_torn_one_is_ignored(kafka_broker, new_topic, new_group,
                                                                   tmp_path):
    from kafka import KafkaProducer

    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    lam_topic = new_topic(1, prefix="lambda")
    cfg, engine, state0, X = _applier_setup(tmp_path, bootstrap, deltas, new_group())
    size = len(lambda_log.state_bytes(engine, state0))
    chunk = 500
    assert size > 3 * chunk                                  # several messages

    w = LambdaLogWriter(bootstrap, lam_topic, "test-lambda-writer-a", chunk)
    w.publish([], (engine, state0, 0))
    reader = _reader(bootstrap, lam_topic, deltas)
    assert reader.refresh()
    _same_state(reader.state, state0)

    # a torn full λ (chunk 1 missing, committed all the same) of a later state: ignored
    torn_state = engine.init(X[50:150], seed=11)
    recs = list(full_records(w.lineage, engine, torn_state, 0, w.full_offset, chunk))
    assert len(recs) > 2 and max(len(r) for r in recs) < chunk + 600
    w.producer.begin_transaction()
    for i, r in enumerate(recs):
        if i != 1:
            w.producer.send(lam_topic, r, partition=0)
    w.producer.commit_transaction()
    reader.refresh(timeout_s=1.0)
    _same_state(reader.state, state0)                        # still the complete one
    late = _reader(bootstrap, lam_topic, deltas)             # starts at the torn one: goes back
    assert late.refresh()
    _same_state(late.state, state0)

    # a complete full λ of another applier (a new lineage) replaces it
    w2 = LambdaLogWriter(bootstrap, lam_topic, "test-lambda-writer-b", chunk)
    w2.publish([], (engine, torn_state, 0))
    _wait(lambda: reader.refresh(timeout_s=0.2) or reader.lineage == w2.lineage, "the new lineage", 30)
    _same_state(reader.state, torn_state)
    # a newer writer with the same transactional id (a takeover) fences the old one: its
    # write fails and none of it reaches a reader
    from kafka.errors import ProducerFencedError

    w3 = LambdaLogWriter(bootstrap, lam_topic, "test-lambda-writer-b", chunk)
    with pytest.raises(ProducerFencedError):
        w2.publish([], (engine, state0, 0))
    assert not reader.refresh(timeout_s=1.0) and reader.lineage == w2.lineage
    _same_state(reader.state, torn_state)
    w3.close()
    # a raw message that is not a lambda record is refused with a one-line error
    p = KafkaProducer(bootstrap_servers=bootstrap)
    p.send(lam_topic, b"PK\x03\x04", partition=0).get(timeout=10)
    p.close()
    with pytest.raises(lambda_log.LambdaLogError, match="magic SSVL1 missing"):
        lambda_log.decode(b"PK\x03\x04")
    for x in (reader, late):
        x.close()
    w.close()
    w2.close()


def test_a_killed_appliers_unfinished_write_never_reaches_a_reader(kafka_broker, new_topic, new_group,
                                                                  tmp_path):
    """An applier killed between sending a full λ (and steps) and committing leaves an open
    transaction, aborted when its successor's writer starts (same transactional id). The
    local broker hands read_committed readers the aborted records all the same; a worker
    loaded that full λ, a state no applier holds. Readers drop them (streamsvi.io.committed)."""
    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    lam_topic = new_topic(1, prefix="lambda")
    cfg, engine, state0, X = _applier_setup(tmp_path, bootstrap, deltas, new_group())
    killed = LambdaLogWriter(bootstrap, lam_topic, "test-lambda-writer-k", 500)
    killed.publish([], (engine, state0, 0))
    reader = _reader(bootstrap, lam_topic, deltas)
    assert reader.refresh()
    _same_state(reader.state, state0)
    never = engine.init(X[50:150], seed=12)
    killed.producer.begin_transaction()      # its next takeover's full λ: a new lineage
    for r in full_records("0123456789abcdef", engine, never, 0, -1, 500):
        killed.producer.send(lam_topic, r, partition=0)
    killed.producer.flush()              # sent, not committed: the applier is killed here
    successor = LambdaLogWriter(bootstrap, lam_topic, "test-lambda-writer-k", 500)   # fences it
    assert not reader.refresh(timeout_s=1.0) and reader.lineage == killed.lineage
    _same_state(reader.state, state0)
    late = _reader(bootstrap, lam_topic, deltas)         # starts from the topic's tail
    assert late.refresh() and late.lineage == killed.lineage
    _same_state(late.state, state0)
    successor.publish([], (engine, state0, 0))
    _wait(lambda: reader.refresh(timeout_s=0.2) or reader.lineage == successor.lineage,
          "the successor's lineage", 30)
    _same_state(reader.state, state0)
    for x in (reader, late, successor):
        x.close()
    killed.producer.close(timeout=0)


def test_a_full_lambda_carries_the_appliers_bookkeeping_and_old_readers_ignore_it(tmp_path):
    """The full λ's npz has an ``applier.json`` member with the three maps of the checkpoint's
    ``extra["scaleout"]``; the state loads as before (a worker's reader ignores the member);
    a full λ written without it (an older applier's) has none to resume from."""
    import io

    import numpy as np

    from streamsvi.inference.state import state_from_arrays
    from streamsvi.service.config import build_engine, validate

    cfg = validate(gmm_config(tmp_path, topic="data", inference={"n_total": 1000}))
    engine = build_engine(cfg, 1000.0)
    state = engine.init(blob_rows(60, seed=4), seed=3)
    book = {"applied_end": {"data/0": 150, "data/2": 7}, "applied": {"data/0": [[0, 100], [120, 150]],
            "data/2": [[0, 7]]}, "dropped_records": 20}
    for applier, expect in ((book, book), (None, None)):
        with np.load(io.BytesIO(lambda_log.state_bytes(engine, state, applier)), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        assert ("applier.json" in arrays) is (applier is not None)
        assert lambda_log.applier_of(arrays) == expect
        _, got = state_from_arrays(arrays)
        _same_state(got, state)
    bad = {"applier.json": np.frombuffer(b'{"applied_end": {}}', dtype=np.uint8)}
    assert lambda_log.applier_of(bad) is None                   # (logged): not resumed from


def test_a_standby_with_an_empty_directory_resumes_from_the_lambda_topic(kafka_broker, new_topic, new_group,
                                                                          tmp_path, caplog):
    """A second applier with a checkpoint directory of its own (empty) resumes from the lambda
    topic's latest full λ and its bookkeeping: it seeks the deltas topic to that full λ's
    offset, skips a duplicate of a delta applied before it (applied_end came with the full λ),
    applies the deltas after it again, and ends on the first applier's checkpoint bit for bit.
    A full λ without the bookkeeping (an older applier's) is refused, with one log line."""
    import io
    import logging

    from prometheus_client import CollectorRegistry

    from streamsvi.service.roles.applier import Applier

    bootstrap, deltas = kafka_broker.bootstrap, new_topic(1, prefix="deltas")
    lam_topic = f"{deltas}-lambda"
    cfg, engine, state0, X = _applier_setup(tmp_path, bootstrap, deltas, new_group(), lambda_full_every=3,
                                          lambda_full_ratio=1000.0, max_staleness=1000)
    ds = [_delta(engine, state0, X, 40 * i, 40 * (i + 1)) for i in range(5)]     # (X has 200 rows)
    reader = _reader(bootstrap, lam_topic, deltas)
    t, out = _start_applier(cfg, max_deltas=4)
    # (each transaction's commit marker takes an offset too)
    _produce_deltas(bootstrap, deltas, [init_delta("w", engine, state0).encode()])      # offset 0
    _until_version(reader, 0)                              # the full λ_0
    _produce_deltas(bootstrap, deltas, [d.encode() for d in ds[:3]])                     # offsets 2-4
    _until_version(reader, 3)                              # and, in that transaction, a full λ version 3
    _produce_deltas(bootstrap, deltas, [ds[0].encode(), ds[3].encode()])                 # 6: a duplicate, 7: d3
    t.join(60)
    assert out["res"].deltas == 4
    first = load_snapshot(cfg["checkpoint"]["directory"])
    assert first.state.step == 4 and first.extra["scaleout"]["applied"] == {"data/0": [[0, 160]]}
    engine_f, state_f, info = _reader(bootstrap, lam_topic, deltas).latest_full()
    assert (info["version"], info["deltas_offset"]) == (3, 5)
    assert info["applier"] == {"applied_end": {"data/0": 120}, "applied": {"data/0": [[0, 120]]},
                               "dropped_records": 0}

    fresh = tmp_path / "fresh"                              # another host's standby: nothing local
    cfg["checkpoint"]["directory"] = str(fresh)
    registry, said = CollectorRegistry(), io.StringIO()
    res = Applier(cfg, registry=registry, out=said).run(max_deltas=1, timeout=60)
    assert "applier: active from the lambda topic's full λ version 3" in said.getvalue(), said.getvalue()
    assert "deltas offset 5" in said.getvalue()
    assert (res.deltas, res.skipped) == (1, 1), res        # d3 again; the duplicate skipped again
    assert _metric(registry, "streamsvi_deltas_skipped_total", reason="duplicate") == 1.0
    snap = load_snapshot(fresh)
    _same_state(snap.state, first.state)
    assert snap.extra["scaleout"] == first.extra["scaleout"]
    _until_version(reader, 4)                               # the new lineage's: the same λ
    _same_state(reader.state, first.state)
    reader.close()

    # restarted next to its own snapshot (deltas offset 8, the topic's full λ 5): the snapshot,
    # and the full λ is not even loaded
    _produce_deltas(bootstrap, deltas, [ds[4].encode()])
    said = io.StringIO()
    with caplog.at_level(logging.INFO, logger="streamsvi.lambda_log"):
        res = Applier(cfg, registry=CollectorRegistry(), out=said).run(max_deltas=1, timeout=60)
    assert f"applier: active from snapshot {snap.number} (step 4) of checkpoint {fresh}, deltas offset 8" \
        in said.getvalue(), said.getvalue()
    assert not [r for r in caplog.records if r.name == "streamsvi.lambda_log" and "loaded" in r.getMessage()]
    assert res.deltas == 1 and load_snapshot(fresh).state.records_seen == 200
    caplog.clear()

    # a full λ without the bookkeeping (an older applier's), ahead of the empty directory: refused
    old_topic = new_topic(1, prefix="lambda-old")
    old = LambdaLogWriter(bootstrap, old_topic, "test-lambda-writer-old", 1 << 20)
    old.publish([], (engine, state0, 5))     # (deltas offset 5: resumed from, d0 again and d3 only)
    old.close()
    cfg["scaleout"]["lambda_topic"] = old_topic
    cfg["checkpoint"]["directory"] = str(tmp_path / "fresh2")
    said = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="streamsvi.applier"):
        res = Applier(cfg, registry=CollectorRegistry(), out=said).run(max_deltas=5, timeout=60)
    assert "has no applier bookkeeping" in caplog.text and "not resumed from" in caplog.text, caplog.text
    assert "applier: active from no snapshot, deltas offset 0" in said.getvalue(), said.getvalue()
    assert res.deltas == 5 and load_snapshot(tmp_path / "fresh2").state.records_seen == 200


def test_scaleout_with_no_shared_directory(kafka_broker, new_topic, new_group, tmp_path, daemons):
    """Applier and workers each with their own directory: λ reaches the workers on the
    lambda topic only; the active applier is killed -9 mid-run and its standby (on the
    appliers' directory) takes over with a new lineage; every record is drained and
    applied exactly once, and a reader of the topic ends on the final checkpoint's λ."""
    bootstrap, n, P = kafka_broker.bootstrap, 3000, 3
    topic, deltas, hw, cfgs, dirs = _own_directories(kafka_broker, new_topic, new_group, tmp_path, n, P, 11,
                                             ("applier", "w0", "w1"))
    a1 = daemons(cfgs["applier"], "--role", "applier", tag="a1")
    a2 = daemons(cfgs["applier"], "--role", "applier", tag="a2")
    active = _wait(lambda: next((a for a in (a1, a2) if "applier: active" in a.stderr()), None),
                   "an active applier", 60, procs=(a1, a2))
    standby = a2 if active is a1 else a1
    ws = [daemons(cfgs[w], "--role", "worker", "--until-drained", tag=w) for w in ("w0", "w1")]
    reader = _reader(bootstrap, f"{deltas}-lambda", deltas)
    _wait(lambda: (reader.refresh(timeout_s=0.2) or True) and reader.state is not None
          and reader.state.records_seen >= n // 3, f"{n // 3} records in λ", 120, procs=[a1, a2, *ws])
    first_lineage = reader.lineage
    active.signal(signal.SIGKILL)
    assert active.wait(10) == -signal.SIGKILL
    _wait(lambda: "applier: active" in standby.stderr(), "the standby to take over", 60, procs=[standby, *ws])
    _finish_after_takeover(reader, standby, ws, first_lineage, dirs["applier"] / "ck", topic, hw, n, P)
    assert not list(tmp_path.rglob("lambda.npz"))             # no λ file anywhere
    for name in ("w0", "w1"):        # a worker's directory: its lock and dead-letter file only
        assert {p.name for p in (dirs[name] / "ck").iterdir()} <= {".lock", "dead-letters.jsonl"}
    reader.close()


def test_a_standby_on_another_host_resumes_from_kafka_alone(kafka_broker, new_topic, new_group, tmp_path,
                                                            daemons):
    """Issue 25: the standby applier has a checkpoint directory of its own, empty (another
    host). The active applier is killed -9 mid-run; the standby resumes from the lambda
    topic's latest full λ (state, deltas offset and the dedup bookkeeping), replays the deltas
    after it, and every record is applied exactly once: its own checkpoint ends holding each
    data offset once, and a reader of the topic ends on that checkpoint's λ."""
    import re

    bootstrap, n, P = kafka_broker.bootstrap, 3000, 3
    topic, deltas, hw, cfgs, dirs = _own_directories(kafka_broker, new_topic, new_group, tmp_path, n, P, 12,
                                             ("a1", "a2", "w0", "w1"))
    active = daemons(cfgs["a1"], "--role", "applier", tag="a1")
    _wait(lambda: "applier: active" in active.stderr(), "the active applier", 60, procs=[active])
    standby = daemons(cfgs["a2"], "--role", "applier", tag="a2")
    _wait(lambda: "applier: joined group" in standby.stderr(), "the standby to join", 60, procs=[standby])
    ws = [daemons(cfgs[w], "--role", "worker", "--until-drained", tag=w) for w in ("w0", "w1")]
    reader = _reader(bootstrap, f"{deltas}-lambda", deltas)
    _wait(lambda: (reader.refresh(timeout_s=0.2) or True) and reader.state is not None
          and reader.state.records_seen >= n // 3, f"{n // 3} records in λ", 120, procs=[active, standby, *ws])
    first_lineage = reader.lineage
    assert "applier: active" not in standby.stderr()
    assert not list((dirs["a2"] / "ck").glob("snap-*"))        # the standby has nothing local
    active.signal(signal.SIGKILL)
    assert active.wait(10) == -signal.SIGKILL
    line = _wait(lambda: re.search(r"applier: active from the lambda topic's full λ version (\d+) "
                                   r"\(lineage \w+\), deltas offset (\d+)", standby.stderr()),
                 "the standby to take over from the lambda topic", 60, procs=[standby, *ws])
    version, offset = int(line.group(1)), int(line.group(2))
    print(line.group(0))
    assert version > 0 and offset > 0, line.group(0)
    snap = _finish_after_takeover(reader, standby, ws, first_lineage, dirs["a2"] / "ck", topic, hw, n, P)
    assert snap.state.step > version
    reader.close()


def test_lambda_travels_on_the_topic_unless_a_file_is_set_and_not_both():
    from streamsvi.service.config import ConfigError, validate
    from streamsvi.service.roles.worker import check_scaleout_config, lambda_channel

    def cfg(**sc):
        return validate({"model": {"kind": "gmm", "n_components": 2, "n_features": 2},
                         "inference": {"n_total": 100}, "source": {"kind": "kafka", "topics": ["t"]},
                         "checkpoint": {"directory": "ck"}, "scaleout": {"deltas_topic": "d", **sc}})

    assert lambda_channel(cfg()) == ("topic", "d-lambda")
    assert lambda_channel(cfg(lambda_topic="lam")) == ("topic", "lam")
    assert lambda_channel(cfg(lambda_file="/shared/l.npz")) == ("file", "/shared/l.npz")
    with pytest.raises(ConfigError, match=r"^scaleout.lambda_file, scaleout.lambda_topic: set one"):
        check_scaleout_config(cfg(lambda_file="/shared/l.npz", lambda_topic="lam"))


def test_a_fenced_writer_is_told_from_a_failed_write_raised_or_wrapped():
    """The applier stands by when its λ writer was fenced, and retries a write that failed:
    kafka-python raises ProducerFencedError itself, or (at send time, under load) a plain
    KafkaError naming it, or chains it as a cause; a connection error is a failed write."""
    from kafka.errors import KafkaConnectionError, KafkaError, ProducerFencedError

    from streamsvi.service.roles.applier import fenced

    assert fenced(ProducerFencedError())
    assert fenced(KafkaError("ProducerFencedError: There is a newer producer with the same transactionalId"))
    try:
        try:
            raise ProducerFencedError()
        except ProducerFencedError as inner:
            raise KafkaError("the send failed") from inner
    except KafkaError as outer:
        assert fenced(outer)
    assert not fenced(KafkaConnectionError("socket disconnected"))
    assert not fenced(KafkaError("NotEnoughReplicasError"))
