"""A single record can never stop the daemon (issue 30, the two crash loops).

1. A bag-of-words JSON record with a word id beyond int64 (``1e300``,
   ``10**30``, ``2**63 - 1``) raised ``OverflowError`` in ``io/bow.py``;
   the LDA daemon exited 1 and died again on the same record at every
   restart, and ``streamsvi score`` wrote nothing for a file holding one.
2. Labelled binary: a poll of only undecodable messages made the batch
   builder call ``codec.empty()``, which ``BinaryBatchCodec`` lacked
   (``AttributeError``), again on every restart.

Each test here failed before the fix. The daemons run against the real local
broker; every record is accounted for: applied, or dead-lettered with its reason.
"""
import io
import json

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.cli import main
from streamsvi.io import BinaryBatchCodec
from streamsvi.io.bow import BowJsonCodec, BowKind, BowValidator
from streamsvi.io.codecs import DecodeError
from streamsvi.io.labelled import LabelledKind
from streamsvi.io.sources.base import _BatchBuilder
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

from .conftest import gmm_config, highwater_marks, produce_raw, snapshot_offsets
from .test_logistic import labelled_rows, logistic_config

V = 40

#: Word ids no int64 holds, as JSON: each raised OverflowError before.
POISON_IDS = [b'{"ids": [1e300]}', b'{"ids": [3, 100000000000000000000000000000]}',
              b'{"ids": [9223372036854775807]}', b'{"ids": [18446744073709551616], "counts": [2]}',
              b'[1e19]', b'{"ids": [4294967296]}']


@pytest.mark.parametrize("payload", POISON_IDS)
def test_bow_json_ids_beyond_any_vocabulary_are_a_named_decode_error(payload):
    with pytest.raises(DecodeError) as info:
        BowJsonCodec(3012).decode_rows(payload)
    assert info.value.reason == "id_out_of_range" and "2**32" in info.value.message
    assert BowJsonCodec(3012).decode_many([b'{"ids": [1]}', payload]) is None


def test_bow_json_ids_inside_the_bound_still_reach_the_validator():
    """The bound is 2**32: an id past V but below it decodes and the validator names it."""
    x = BowJsonCodec(V).decode_rows(b'{"ids": [4294967295]}')
    good, bad = BowValidator(V).validate(x)
    assert good.shape == (0, V) and bad[0][1] == "id_out_of_range"


def _docs(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = rng.choice(V // 2, size=5, replace=False) + (V // 2) * rng.integers(0, 2)
        out.append(json.dumps({"ids": ids.tolist(), "counts": rng.integers(1, 4, 5).tolist()}).encode())
    return out


def _lda_config(tmp_path, bootstrap, topic, group):
    cfg = gmm_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                     checkpoint={"every_batches": 1},
                     metrics={"heldout_size": 0})
    cfg["model"] = {"kind": "lda", "n_components": 2, "n_features": V}
    cfg["inference"] = {"n_total": 400, "batch_size": 20, "max_wait_seconds": 0.5, "seed": 1}
    return validate(cfg)


def test_lda_daemon_dead_letters_ids_beyond_int64_and_drains(kafka_broker, new_topic, new_group, tmp_path):
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(2), new_group()
    good = _docs(300, seed=2)
    payloads = list(good)
    for k, pill in enumerate(POISON_IDS):                  # spread over both partitions
        payloads.insert(37 * (k + 1), pill)
    produce_raw(bootstrap, topic, payloads, partitions=2)
    cfg = _lda_config(tmp_path, bootstrap, topic, group)
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=90)
    assert res.stopped_by == "drained"
    assert (res.records, res.dead) == (len(good), len(POISON_IDS))
    assert registry.get_sample_value("streamsvi_records_dead_lettered_total",
                                     {"reason": "id_out_of_range"}) == len(POISON_IDS)
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.records_seen == len(good)
    assert snapshot_offsets(snap) == highwater_marks(bootstrap, topic, 2)
    letters = [json.loads(line) for line in (tmp_path / "ck" / "dead-letters.jsonl").read_text().splitlines()]
    assert sorted(d["reason"] for d in letters) == ["id_out_of_range"] * len(POISON_IDS)


def test_labelled_binary_poll_of_only_bad_messages_is_an_empty_batch():
    from streamsvi.models.logistic import BayesianLogisticRegression

    model, kind = BayesianLogisticRegression(n_features=3), LabelledKind()
    b = _BatchBuilder(kind.make_codec("binary", model, {}), kind.make_validator(model, {}), 4, kind=kind)
    b.add_messages([("t", 0, 0, b"not a binary batch message"), ("t", 0, 1, b"SSVB" + b"\x00" * 4)])
    batch = b.batch()
    assert batch.x.shape == (0, 4) and [d.reason for d in batch.dead] == ["bad_header", "truncated"]
    assert batch.next_offsets == {("t", 0): 2}


def test_labelled_binary_daemon_survives_polls_of_only_bad_messages(kafka_broker, new_topic, new_group,
                                                                    tmp_path):
    """Before: AttributeError ('BinaryBatchCodec' has no 'empty') on 3 of 3 restarts."""
    bootstrap, topic, group = kafka_broker.bootstrap, new_topic(1), new_group()
    bad = [b"not binary", b"SSVB\x01\x02\x00\x00", BinaryBatchCodec(3).encode(np.ones((2, 3)))]
    produce_raw(bootstrap, topic, bad, partitions=1)
    cfg = validate(logistic_config(tmp_path, bootstrap=bootstrap, topic=topic, group=group,
                                   source={"codec": "binary"}, metrics={"heldout_size": 0},
                                   checkpoint={"every_batches": 1}))
    res = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=90)
    assert res.stopped_by == "drained" and (res.records, res.dead) == (0, 3)

    rows = labelled_rows(200, seed=5)                       # then good batches, and bad ones again
    codec = BinaryBatchCodec(4)
    produce_raw(bootstrap, topic, [codec.encode(rows[i:i + 50]) for i in range(0, 200, 50)] + bad,
                partitions=1)
    res = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=90)
    assert res.stopped_by == "drained" and res.records == 200
    # Every bad message is dead-lettered; the first three may be twice: with no λ yet, the
    # first run could write no snapshot, so the second reads them again (at least once).
    letters = [json.loads(ln) for ln in (tmp_path / "ck" / "dead-letters.jsonl").read_text().splitlines()]
    assert {d["offset"] for d in letters} == {0, 1, 2, 7, 8, 9} and len(letters) in (6, 9)
    snap = load_snapshot(cfg["checkpoint"]["directory"])
    assert snap.state.records_seen == 200
    assert snapshot_offsets(snap) == highwater_marks(bootstrap, topic, 1)


class _BrokenCodec(BowJsonCodec):
    """A decoder with a defect only some record meets: what ``codec_error`` is for."""

    def decode_rows(self, payload):
        if b"boom" in payload:
            raise ZeroDivisionError("a defect")
        return super().decode_rows(payload)

    def decode_many(self, payloads):
        return [self.decode_rows(p) for p in payloads] and None


def test_any_exception_a_codec_raises_dead_letters_that_record_only():
    b = _BatchBuilder(_BrokenCodec(V), BowValidator(V), V, kind=BowKind())
    b.add_messages([("t", 0, 0, b'{"ids": [1]}'), ("t", 0, 1, b'{"ids": [2], "boom": 1}'),
                    ("t", 0, 2, b'{"ids": [3]}')])
    batch = b.batch()
    assert batch.x.shape == (2, V)
    assert [(d.position.offset, d.reason) for d in batch.dead] == [(1, "codec_error")]
    assert "ZeroDivisionError" in batch.dead[0].message


def test_score_scores_the_valid_lines_of_a_file_holding_a_poison_pill(tmp_path):
    """Before: OverflowError, and no output at all, not even for the valid lines."""
    from streamsvi import SVI
    from streamsvi.models import LDA
    from streamsvi.checkpoint import CheckpointStore
    from streamsvi.io.bow import BowKind as Kind

    model = LDA(n_components=2, n_features=V)
    docs = Kind().from_json([json.loads(d) for d in _docs(60, seed=3)], model)
    engine = SVI(model, n_total=60)
    state, _ = engine.update(engine.init(docs, seed=0), docs)
    CheckpointStore(tmp_path / "ck").save(engine, state, [])
    lines = [d.decode() for d in _docs(3, seed=4)]
    lines.insert(1, POISON_IDS[0].decode())
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("\n".join(lines) + "\n")
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(inp), "--output", str(out)]) == 1
    recs = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r["line"] for r in recs] == [1, 2, 3, 4]
    assert recs[1]["reason"] == "id_out_of_range"
    assert all("error" not in recs[i] for i in (0, 2, 3))
