"""The scale-out worker's streaming start: λ_0 from the model's start records, as one process starts.

A worker with no published λ holds its batches until it has ``model.start_size(batch_size)``
records (the GMM: ``init_batches`` minibatches, at least 5·K·D; at most N; an empty poll starts
from what is held), proposes λ_0 from all of them, and reads them again as deltas once λ is
published (docs/design.md §6.7). One data partition and one worker make the order of the records
the worker reads the order they were produced in, so the proposed λ_0 is compared bit for bit with
``engine.init`` on the first records. The real CLI on the real broker; waits on conditions.
"""
import json
import re
import signal

import pytest

from streamsvi.io import JsonCodec, produce_rows
from streamsvi.service.config import build_engine, load_config
from streamsvi.service.roles.transport import Delta, init_state, split_parts

from .conftest import blob_rows, highwater_marks, produce_raw, read_topic
from .test_scaleout import _check_exactly_once, _configs, _lambda, _wait

BATCH = 50


def _run(tmp_path, daemons, bootstrap, topic, deltas, group, n, n_total):
    """An applier and one worker (``--until-drained``, GMM ``init_batches`` = 3) until the
    ``n`` valid records are applied; returns the worker config, the checkpoint directory and
    the worker."""
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, group, 1, n_total,
                        model={"init_batches": 3}, batch_size=BATCH)
    applier = daemons(cfgs["applier"], "--role", "applier", tag="a")
    _wait(lambda: "applier: active" in applier.stderr(), "the applier to be active", 60, procs=[applier])
    worker = daemons(cfgs["w0"], "--role", "worker", "--until-drained", tag="w0")
    assert worker.wait(150) == 0, worker.stderr()[-3000:]
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= n, "every record applied",
          procs=[applier])
    applier.signal(signal.SIGTERM)
    assert applier.wait(60) == 0, applier.stderr()[-3000:]
    return load_config(cfgs["w0"]), ck, worker


def _proposals(bootstrap, deltas) -> list:
    """Every λ_0 proposal ("init" message) on the deltas topic, in order (a worker's transaction
    sends its deltas as one bundle: each of its parts is a message here)."""
    found = [Delta.decode(part) for _, _, v in read_topic(bootstrap, deltas) for part in split_parts(v)]
    return [init_state(d)[1].lam for d in found if d.kind == "init"]


@pytest.mark.parametrize("n, n_total, start, said", [
    # init_batches = 3 → start_size = max(3·50, 5·K·D = 30) = 150 records, the first three batches
    (600, 600, 150, "proposed λ_0 from its first 3 batches (150 records"),
    # a stream shorter than the start: the empty poll after its 120 records starts from them
    (120, 1000, 120, "proposed λ_0 from its first 3 batches (120 records"),
])
def test_the_worker_proposes_lambda_0_from_the_models_start_records(
        kafka_broker, new_topic, new_group, tmp_path, daemons, n, n_total, start, said):
    bootstrap = kafka_broker.bootstrap
    topic, deltas = new_topic(1), new_topic(1, prefix="deltas")
    rows = blob_rows(n, seed=17)
    produce_rows(bootstrap, topic, rows, JsonCodec(2), partitions=1)
    hw = highwater_marks(bootstrap, topic, 1)
    assert hw[(topic, 0)] == n
    cfg, ck, worker = _run(tmp_path, daemons, bootstrap, topic, deltas, new_group(), n, n_total)
    engine = build_engine(cfg, float(n_total))
    assert min(engine.model.start_size(BATCH), n_total) == (150 if n_total >= 150 else n_total)

    # every record, the held ones included, is in exactly one applied delta
    _check_exactly_once(ck, topic, hw, n, partitions=1)
    # λ_0 is the engine's start on the first `start` records, as one process would start
    seed = cfg["inference"]["seed"]
    expected = engine.init(rows[:start], seed=seed).lam
    proposed = _proposals(bootstrap, deltas)
    assert proposed, "no λ_0 proposal on the deltas topic"
    assert all(lam.array_equal(expected) for lam in proposed)   # (a retry proposes the same)
    assert not proposed[0].array_equal(engine.init(rows[:BATCH], seed=seed).lam)
    assert said in worker.stderr()


def test_dead_letters_of_held_batches_are_written_once(kafka_broker, new_topic, new_group, tmp_path,
                                                      daemons):
    """Bad records among the held ones: dead-lettered once, when their batch is read again
    (and committed), not when it is held; λ_0 is the start on the valid records held."""
    bootstrap = kafka_broker.bootstrap
    topic, deltas = new_topic(1), new_topic(1, prefix="deltas")
    n = 400
    rows = blob_rows(n, seed=23)
    codec = JsonCodec(2)
    payloads = [codec.encode(r) for r in rows]
    bad_at = [7, 60, 61, 130, 320]                      # message offsets; the first three in the start
    for i in bad_at:
        payloads.insert(i, b"not json")
    produce_raw(bootstrap, topic, payloads, partitions=1)
    hw = highwater_marks(bootstrap, topic, 1)
    assert hw[(topic, 0)] == len(payloads)
    cfg, ck, worker = _run(tmp_path, daemons, bootstrap, topic, deltas, new_group(), n, n)

    _check_exactly_once(ck, topic, hw, n, partitions=1)
    dead = [json.loads(line) for line in (ck / "dead-letters.jsonl").read_text().splitlines()]
    assert sorted(d["offset"] for d in dead) == bad_at, dead
    m = re.search(r"proposed λ_0 from its first (\d+) batches \((\d+) records[;)]", worker.stderr())
    assert m and int(m.group(2)) >= 150, worker.stderr()[-3000:]
    expected = build_engine(cfg, float(n)).init(rows[:int(m.group(2))], seed=cfg["inference"]["seed"]).lam
    proposed = _proposals(bootstrap, deltas)
    assert proposed and all(lam.array_equal(expected) for lam in proposed)


def test_a_first_batch_of_only_bad_records_is_accounted_before_lambda_0(kafka_broker, new_topic, new_group,
                                                                       tmp_path, daemons):
    """The stream opens with bad messages only: the worker's first batches have no valid record,
    so they are dead-lettered and committed (an all-bad stream must still drain) as deltas
    without statistics, before any λ_0. The applier records their offsets as applied (it
    skipped them as "no_state", which left a hole at the start of the partition)."""
    bootstrap = kafka_broker.bootstrap
    topic, deltas = new_topic(1), new_topic(1, prefix="deltas")
    n, n_bad = 300, 30
    produce_raw(bootstrap, topic, [b"not json"] * n_bad, partitions=1)
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 1, n,
                        model={"init_batches": 3}, batch_size=BATCH)
    applier = daemons(cfgs["applier"], "--role", "applier", tag="a")
    _wait(lambda: "applier: active" in applier.stderr(), "the applier to be active", 60, procs=[applier])
    worker = daemons(cfgs["w0"], "--role", "worker", tag="w0")
    dl = ck / "dead-letters.jsonl"
    _wait(lambda: dl.exists() and len(dl.read_text().splitlines()) == n_bad,
          "the bad messages to be dead-lettered", procs=[applier, worker])
    rows = blob_rows(n, seed=29)
    produce_rows(bootstrap, topic, rows, JsonCodec(2), partitions=1)
    hw = highwater_marks(bootstrap, topic, 1)
    _wait(lambda: (s := _lambda(ck)) is not None and s.records_seen >= n, "every record applied",
          procs=[applier, worker])
    for p in (worker, applier):
        p.signal(signal.SIGTERM)
        assert p.wait(60) == 0, p.stderr()[-3000:]

    _check_exactly_once(ck, topic, hw, n, partitions=1)
    assert "before any λ_0" not in applier.stderr()
    assert sorted(json.loads(line)["offset"] for line in dl.read_text().splitlines()) == list(range(n_bad))


def test_a_worker_without_an_applier_says_so_once_and_backs_off(kafka_broker, new_topic, new_group, tmp_path,
                                                               daemons):
    """Issue 30: with no applier, a worker re-proposed λ_0 every 2 s at INFO, forever. Now the
    first proposal is one INFO line, the first unanswered one a WARNING that names the deltas
    topic and the λ file, and the next proposals come after 4 s, 8 s, ... (at DEBUG)."""
    bootstrap = kafka_broker.bootstrap
    topic, deltas = new_topic(1), new_topic(1, prefix="deltas")
    produce_rows(bootstrap, topic, blob_rows(300, seed=3), JsonCodec(2), partitions=1)
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 1, 300,
                        model={"init_batches": 3}, batch_size=BATCH)
    worker = daemons(cfgs["w0"], "--role", "worker", tag="w0")
    _wait(lambda: len(_proposals(bootstrap, deltas)) >= 3, "three λ_0 proposals", 90, procs=[worker])
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.stderr()[-3000:]
    err = worker.stderr()
    assert err.count("proposed λ_0") == 1, err[-3000:]                       # INFO once
    assert len(re.findall(r"WARNING .*no λ published 2 s after its λ_0 proposal: is an applier running "
                          rf"on deltas topic '{deltas}'", err)) == 1, err[-3000:]
    assert len(_proposals(bootstrap, deltas)) <= 4      # 2 s, then 4 s and 8 s apart: not one every 2 s


def test_a_second_worker_with_the_same_id_on_one_host_is_refused_at_start(
        kafka_broker, new_topic, new_group, tmp_path, daemons):
    """Issue 30: two workers on one host without STREAMSVI_WORKER_ID shared a transactional id,
    and one died with a ProducerFencedError traceback. Now the second says so and exits 2."""
    bootstrap = kafka_broker.bootstrap
    topic, deltas = new_topic(1), new_topic(1, prefix="deltas")
    produce_rows(bootstrap, topic, blob_rows(100, seed=4), JsonCodec(2), partitions=1)
    cfgs, ck = _configs(tmp_path, bootstrap, topic, deltas, new_group(), 1, 100, batch_size=BATCH)
    first = daemons(cfgs["w0"], "--role", "worker", tag="first")
    _wait(lambda: "partitions assigned" in first.stderr(), "the first worker to join", 60, procs=[first])
    second = daemons(cfgs["w0"], "--role", "worker", tag="second")
    assert second.wait(60) == 2, second.stderr()[-3000:]
    err = second.stderr()
    assert "Traceback" not in err and "is in use by another worker on this host" in err, err[-3000:]
    assert f"(pid {first.pid})" in err
    assert first.proc.poll() is None                      # the first one runs on
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.stderr()[-3000:]
