import json
import struct
import time

import numpy as np
import pytest

from streamsvi.io.codecs import DecodeError
from streamsvi.io.dense import BinaryBatchCodec, CsvCodec, JsonCodec, codec_from_config


def reason_of(codec, payload):
    with pytest.raises(DecodeError) as info:
        codec.decode(payload)
    assert info.value.message and info.value.reason in str(info.value)
    return info.value.reason


# ------------------------------------------------------------------ json
def test_json_round_trip_array_exact():
    codec = JsonCodec(3)
    row = np.array([0.1, -2.5e-300, 1e12 / 3])
    out = codec.decode(codec.encode(row))
    assert out.dtype == np.float64 and out.shape == (3,)
    assert np.array_equal(out, row)  # repr of a float round-trips bit for bit


def test_json_round_trip_fields_and_order():
    codec = JsonCodec(2, fields=["b", "a"])
    msg = codec.encode([1.0, 2.0])
    assert json.loads(msg) == {"b": 1.0, "a": 2.0}
    assert codec.decode(b'{"a": 7, "b": -1, "extra": "ignored"}').tolist() == [-1.0, 7.0]


def test_json_object_without_fields_reads_x():
    assert JsonCodec(2).decode(b'{"x": [3, 4], "id": 9}').tolist() == [3.0, 4.0]


def test_json_decode_rows_shape_and_ints():
    x = JsonCodec(2).decode_rows(b"[1, 2]")
    assert x.shape == (1, 2) and x.dtype == np.float64


def test_json_nan_decodes_for_the_validator():
    x = JsonCodec(2).decode(b"[NaN, Infinity]")
    assert np.isnan(x[0]) and np.isinf(x[1])


@pytest.mark.parametrize("payload, reason", [
    (b"{not json", "json_invalid"),
    (b"", "json_invalid"),
    (b"\xff\xfe\x00garbage", "json_invalid"),
    (b"[1, 2, 3]", "wrong_shape"),
    (b"[1]", "wrong_shape"),
    (b"5", "wrong_shape"),
    (b'"text"', "wrong_shape"),
    (b"null", "wrong_shape"),
    (b'["1", 2]', "not_numeric"),
    (b"[true, 2]", "not_numeric"),
    (b"[null, 2]", "not_numeric"),
    (b"[[1], 2]", "not_numeric"),
    (b'{"y": [1, 2]}', "missing_field"),
    (b"[1" + b"0" * 400 + b", 2]", "out_of_range"),
])
def test_json_reasons(payload, reason):
    assert reason_of(JsonCodec(2), payload) == reason


def test_json_fields_reasons():
    codec = JsonCodec(2, fields=["a", "b"])
    assert reason_of(codec, b'{"a": 1}') == "missing_field"
    assert reason_of(codec, b'{"a": 1, "b": "x"}') == "not_numeric"
    with pytest.raises(DecodeError, match="'b'"):
        codec.decode(b'{"a": 1}')


def test_json_array_accepted_with_fields():
    # An array of D numbers is always a valid record, fields or not.
    assert JsonCodec(2, fields=["a", "b"]).decode(b"[1, 2]").tolist() == [1.0, 2.0]


def test_json_encode_refuses_bad_rows():
    with pytest.raises(ValueError, match="non-finite"):
        JsonCodec(2).encode([np.nan, 1.0])
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        JsonCodec(2).encode([1.0, 2.0, 3.0])


@pytest.mark.parametrize("kwargs, match", [
    ({"n_features": 0}, "n_features"),
    ({"n_features": 2.0}, "n_features"),
    ({"n_features": 2, "fields": ["a"]}, "2 fields"),
    ({"n_features": 2, "fields": "ab"}, "list of field names"),
    ({"n_features": 2, "fields": ["a", "a"]}, "distinct"),
])
def test_json_settings_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        JsonCodec(**kwargs)


# ---------------------------------------------------------------- binary
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_binary_round_trip(dtype):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(37, 4))
    codec = BinaryBatchCodec(4, dtype=dtype)
    msg = codec.encode(X)
    itemsize = 8 if dtype == "float64" else 4
    assert len(msg) == 16 + 37 * 4 * itemsize
    assert msg[:4] == b"SSVB" and msg[4] == 1 and msg[5] == (2 if dtype == "float64" else 1)
    assert struct.unpack_from("<II", msg, 8) == (37, 4)
    out = codec.decode(msg)
    assert out.dtype == np.float64 and out.shape == (37, 4)
    if dtype == "float64":
        assert np.array_equal(out, X)
    else:
        assert np.array_equal(out, X.astype(np.float32).astype(np.float64))


def test_binary_reads_either_dtype():
    msg32 = BinaryBatchCodec(2, dtype="float32").encode(np.ones((3, 2)))
    assert BinaryBatchCodec(2).decode(msg32).tolist() == [[1.0, 1.0]] * 3


def test_binary_header_is_little_endian_regardless_of_platform():
    msg = BinaryBatchCodec(1).encode([[1.0]])
    assert msg[16:] == struct.pack("<d", 1.0)


def _header(magic=b"SSVB", version=1, code=2, reserved=0, rows=2, cols=3):
    return struct.pack("<4sBBHII", magic, version, code, reserved, rows, cols)


@pytest.mark.parametrize("payload, reason", [
    (b"SSVB\x01", "truncated"),
    (b"", "truncated"),
    (_header(magic=b"PKL\x80") + bytes(48), "bad_header"),
    (_header(reserved=7) + bytes(48), "bad_header"),
    (_header(version=2) + bytes(48), "bad_version"),
    (_header(code=9) + bytes(48), "bad_dtype"),
    (_header(cols=4) + bytes(64), "wrong_shape"),
    (_header() + bytes(47), "truncated"),
    (_header() + bytes(49), "trailing_data"),
    (_header(code=1) + bytes(48), "trailing_data"),  # float32 needs 24 bytes
])
def test_binary_reasons(payload, reason):
    assert reason_of(BinaryBatchCodec(3), payload) == reason


def test_binary_valid_hand_made_message():
    payload = _header(code=1, rows=2, cols=3) + np.arange(6, dtype="<f4").tobytes()
    assert BinaryBatchCodec(3).decode(payload).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_binary_settings_and_encode_errors():
    with pytest.raises(ValueError, match="dtype must be one of"):
        BinaryBatchCodec(2, dtype="int8")
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        BinaryBatchCodec(2).encode(np.ones((3, 3)))


# ------------------------------------------------------------------- csv
def test_csv_codec():
    assert CsvCodec(2).decode(b"1.5, -2").tolist() == [1.5, -2.0]
    assert CsvCodec(2, columns=[2, 0]).decode(b'1,"x,y",3').tolist() == [3.0, 1.0]
    assert CsvCodec(2).decode(CsvCodec(2).encode([0.1, 2.0])).tolist() == [0.1, 2.0]
    assert reason_of(CsvCodec(2), b"1,2,3") == "wrong_shape"
    assert reason_of(CsvCodec(2, columns=[0, 5]), b"1,2") == "wrong_shape"
    assert reason_of(CsvCodec(2), b"1,abc") == "not_numeric"


# ---------------------------------------------------------------- config
def test_codec_from_config():
    assert isinstance(codec_from_config("json", 3), JsonCodec)
    assert codec_from_config("json", 2, fields=["a", "b"]).fields == ["a", "b"]
    assert isinstance(codec_from_config("binary", 3), BinaryBatchCodec)
    with pytest.raises(ValueError, match="codec must be one of"):
        codec_from_config("pickle", 3)
    with pytest.raises(ValueError, match="only applies to the 'json' codec"):
        codec_from_config("binary", 2, fields=["a", "b"])


def test_json_decode_many_is_decode_message_by_message():
    rng = np.random.default_rng(3)
    codec = JsonCodec(3)
    X = rng.normal(size=(200, 3)) * 10.0 ** rng.integers(-300, 300, (200, 3))
    msgs = [codec.encode(r) for r in X] + [b"[1, 2, 3]", b"[12345678901234567890123, -0, 7]",
                                          b"[5e-324, -0.0, 1.7976931348623157e308]"]
    x = codec.decode_many(msgs)
    ref = np.array([codec.decode(m) for m in msgs])
    assert x.shape == ref.shape and np.array_equal(x.view(np.int64), ref.view(np.int64))
    assert codec.decode_many([]).shape == (0, 3)


@pytest.mark.parametrize("msgs", [
    [b"[1, 2], [3", b"4, 5, 6]"],           # invalid alone, one valid array when joined
    [b"[1],[2]", b"[[3]", b"[4]]"],         # three elements for three messages, none valid
    [b"[1, 2, 3] ", b"[4, 5, 6]"],           # valid, but blank after the ] (not proven: slow path)
    [b"[true, 1, 2]"], [b"[null, 1, 2]"], [b'["1", 2, 3]'], [b'{"x": [1, 2, 3]}'],
    [b"[1, 2]"], [b"[1, 2, 3, 4]"], [b""], [b"[1, 2, 3]", None],
    [b"[1" + b"0" * 400 + b", 2, 3]"], [b"[" * 5000 + b"]" * 5000],
])
def test_json_decode_many_leaves_anything_doubtful_to_one_by_one(msgs):
    assert JsonCodec(3).decode_many(msgs) is None


def test_json_too_deep_nesting_is_a_dead_letter_not_a_crash():
    assert reason_of(JsonCodec(2), b"[" * 100_000 + b"]" * 100_000) == "json_invalid"


def test_binary_decode_many_one_copy_or_none():
    codec = BinaryBatchCodec(2, dtype="float32")
    a, b = np.arange(6.0).reshape(3, 2), np.ones((2, 2))
    x = codec.decode_many([codec.encode(a), BinaryBatchCodec(2).encode(b)])
    assert x.dtype == np.float64 and x.flags.writeable and np.array_equal(x, np.vstack([a, b]))
    assert codec.decode_many([codec.encode(a), b"SSVBjunk"]) is None


# ------------------------------------------------- zero-record binary batches: dead-lettered, counted
def _kinds():
    """(kind name, model, a part of 3 good records, the kind's binary codec's empty message)."""
    import scipy.sparse as sp

    from streamsvi.io.bow import BowBinaryCodec
    from streamsvi.io.ratings import RatingsBinaryCodec
    from streamsvi.io.sequences import SequenceBinaryCodec
    from streamsvi.models import LDA, PMF, BayesianGMM, DiscreteHMM, Ratings
    from streamsvi.sequence_batch import Sequences

    B, W, Q, R = BinaryBatchCodec, BowBinaryCodec, SequenceBinaryCodec, RatingsBinaryCodec
    return [
        ("dense", BayesianGMM(3, 2), np.arange(6.0).reshape(3, 2), B.HEADER.pack(B.MAGIC, 1, 2, 0, 0, 2)),
        ("bow", LDA(3, 30), sp.csr_matrix(np.eye(3, 30) * 2.0),
         W.HEADER.pack(W.MAGIC, 1, 2, 0, 0, 0) + struct.pack("<I", 0)),     # indptr = [0]
        ("sequences", DiscreteHMM(2, 4), Sequences.from_list([[0, 1], [3], [2, 2, 1]]),
         Q.HEADER.pack(Q.MAGIC, 1, 1, 0, 0, 0)),
        ("ratings", PMF(n_factors=2), Ratings(["u1", "u2", "u3"], ["a", "b", "a"], [3.0, 4.0, 5.0]),
         R.HEADER.pack(R.MAGIC, 1, b"\0\0\0", 0, 0, 0)),
    ]


def _reason(codec, payload):
    with pytest.raises(DecodeError) as info:
        codec.decode_rows(payload)
    return info.value.reason


@pytest.mark.parametrize("name,model,part,empty", _kinds(), ids=[k[0] for k in _kinds()])
def test_every_binary_codec_refuses_a_batch_of_no_records(name, model, part, empty):
    """Issue 16: a zero-row message decoded to nothing and left no trace; now it is a
    DecodeError ``empty_batch`` (a dead letter), and the encoders refuse to write one."""
    from streamsvi.io.records import KINDS

    kind = KINDS[name]
    codec = kind.make_codec("binary", model, {})
    good = codec.encode_rows(part)
    assert kind.n_records(codec.decode_rows(good)) == 3
    assert _reason(codec, empty) == "empty_batch"
    assert codec.decode_many([good, empty, good]) is None        # the source then finds it one by one
    with pytest.raises(ValueError, match="cannot encode a binary batch of 0"):
        codec.encode_rows(kind.take(part, slice(0, 0)))
    assert _reason(codec, empty + b"\0") == "trailing_data"   # layout errors come first


@pytest.mark.parametrize("name,model,part,empty", _kinds(), ids=[k[0] for k in _kinds()])
def test_an_empty_binary_batch_from_kafka_is_a_dead_letter(name, model, part, empty,
                                                           kafka_broker, new_topic, new_group):
    """Through a real KafkaSource (the source's _BatchBuilder): the empty message is in
    ``batch.dead`` with its offset, its offset counts as consumed, the good rows all arrive."""
    from kafka import KafkaProducer

    from streamsvi.io import KafkaSource
    from streamsvi.io.records import KINDS

    kind = KINDS[name]
    codec = kind.make_codec("binary", model, {})
    topic = new_topic(1)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    try:
        for payload in (codec.encode_rows(part), empty, codec.encode_rows(part)):
            producer.send(topic, value=payload, partition=0).get(timeout=30)
    finally:
        producer.close()
    with KafkaSource(kafka_broker.bootstrap, topic, group_id=new_group(), codec=codec, kind=kind,
                     validator=kind.make_validator(model, {})) as src:
        src.wait_for_assignment(10)
        batches, deadline = [], time.monotonic() + 30
        while sum(b.n_messages for b in batches) < 3 and time.monotonic() < deadline:
            b = src.poll_batch(100, 1.0)
            if b is not None:
                batches.append(b)
    dead = [d for b in batches for d in b.dead]
    assert [(d.reason, d.position.offset, d.payload) for d in dead] == [("empty_batch", 1, empty)]
    assert "0" in dead[0].message
    assert sum(kind.n_records(b.x) for b in batches) == 6
    assert batches[-1].next_offsets == {(topic, 0): 3}


def test_the_daemon_counts_an_empty_binary_batch(kafka_broker, new_topic, new_group, tmp_path):
    """End to end: the empty message goes to the dead-letter topic and
    ``streamsvi_records_dead_lettered_total{reason="empty_batch"}`` counts it."""
    import base64
    import io

    from kafka import KafkaProducer
    from prometheus_client import CollectorRegistry

    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon
    from tests.conftest_broker import read_topic

    topic, dead_topic = new_topic(1), new_topic(1)
    codec = BinaryBatchCodec(2)
    X = np.random.default_rng(0).normal(size=(120, 2))
    empty = codec.HEADER.pack(codec.MAGIC, 1, 2, 0, 0, 2)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all")
    try:
        for payload in (codec.encode(X[:60]), empty, codec.encode(X[60:])):
            producer.send(topic, value=payload, partition=0).get(timeout=30)
    finally:
        producer.close()
    cfg = validate({
        "model": {"kind": "gmm", "n_components": 2, "n_features": 2},
        "inference": {"n_total": 120, "batch_size": 60, "max_wait_seconds": 0.5},
        "source": {"kind": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topics": [topic],
                   "group_id": new_group(), "codec": "binary", "dead_letter_topic": dead_topic},
        "checkpoint": {"directory": str(tmp_path / "ck")},
        "metrics": {"enabled": False, "heldout_size": 0, "progress_seconds": 0.0},
    })
    registry = CollectorRegistry()
    res = Daemon(cfg, registry=registry, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.stopped_by == "drained" and res.records == 120 and res.dead == 1
    assert registry.get_sample_value("streamsvi_records_dead_lettered_total", {"reason": "empty_batch"}) == 1
    letters = [json.loads(v) for _, _, v in read_topic(kafka_broker.bootstrap, dead_topic)]
    assert [(d["reason"], d["offset"], base64.b64decode(d["payload_b64"])) for d in letters] == \
        [("empty_batch", 1, empty)]
