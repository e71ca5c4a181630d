"""The "bow" record kind: JSON, binary CSR and text codecs, the per-document
validator, and the kind's slicing/joining/JSON round trips."""
import binascii
import json
import struct

import numpy as np
import pytest
import scipy.sparse as sp

from streamsvi.io import DecodeError
from streamsvi.io.bow import (BowBinaryCodec, BowJsonCodec, BowKind, BowValidator, TextCodec,
                              concat_csr, load_vocabulary, tokenize)
from streamsvi.io.records import KINDS, record_kind
from streamsvi.models import LDA

V = 20


def _reason(fn, payload):
    with pytest.raises(DecodeError) as ei:
        fn(payload)
    return ei.value.reason


def _random_part(rng, n=30, width=V):
    X = sp.random(n, width, density=0.2, random_state=np.random.RandomState(rng.integers(1 << 30)),
                  data_rvs=lambda k: rng.integers(1, 6, size=k).astype(float), format="csr")
    X.sum_duplicates()
    return X


# ------------------------------------------------------------------ JSON
def test_json_decodes_ids_and_counts():
    c = BowJsonCodec(V)
    x = c.decode_rows(b'{"ids": [3, 7, 3], "counts": [1, 2, 4.5], "doc": "a"}')
    assert x.shape == (1, V) and x[0, 3] == 5.5 and x[0, 7] == 2 and x.nnz == 2
    assert c.decode_rows(b'{"ids": [1, 1, 2]}').toarray()[0, :3].tolist() == [0, 2, 1]
    assert c.decode_rows(b"[4, 4]").toarray()[0, 4] == 2
    assert c.decode_rows(b'{"ids": [25]}').shape == (1, 26)    # out of range: the validator's job
    doc = c.decode_rows(b'{"ids": [5, 2], "counts": [1, 3]}')
    assert json.loads(c.encode_rows(doc)) == {"ids": [2, 5], "counts": [3, 1]}
    assert (c.decode_rows(c.encode_rows(doc)) != doc).nnz == 0


@pytest.mark.parametrize("payload,reason", [
    (b"{not json", "json_invalid"), (b"\xff\xfe", "json_invalid"), (b'{"counts": [1]}', "missing_field"),
    (b'{"ids": [1, 2], "counts": [1]}', "wrong_shape"), (b'{"ids": 3}', "wrong_shape"), (b'"text"', "wrong_shape"),
    (b'{"ids": [1.5]}', "not_integer"), (b'{"ids": ["a"]}', "not_integer"), (b'{"ids": [true]}', "not_integer"),
    (b'{"ids": [1], "counts": ["2"]}', "not_numeric"), (b'{"ids": [1], "counts": [null]}', "not_numeric"),
    (b'{"ids": [-1]}', "id_out_of_range"), (b'{"ids": [-2.0]}', "id_out_of_range")])
def test_json_decode_errors_have_reasons(payload, reason):
    assert _reason(BowJsonCodec(V).decode_rows, payload) == reason


def test_json_decode_many_is_decode_one_by_one():
    c = BowJsonCodec(V)
    msgs = [b'{"ids": [1, 2], "counts": [1, 1]}', b'{"ids": [19]}', b'{"ids": [3, 3, 4]}']
    many = c.decode_many(msgs)
    one = concat_csr([c.decode_rows(m) for m in msgs], V)
    assert (many != one).nnz == 0 and many.shape == (3, V)
    assert c.decode_many(msgs + [b"{oops"]) is None


# ---------------------------------------------------------------- binary
@pytest.mark.parametrize("dtype", ["float64", "float32", "uint32"])
def test_binary_round_trip(dtype):
    X = _random_part(np.random.default_rng(0))
    c = BowBinaryCodec(V, dtype=dtype)
    msg = c.encode_rows(X)
    assert msg[:4] == b"SSVW" and len(msg) == 16 + 4 * (X.shape[0] + 1) + 4 * X.nnz + \
        {"float64": 8, "float32": 4, "uint32": 4}[dtype] * X.nnz
    Y = c.decode_rows(msg)
    assert Y.shape == X.shape and (Y != X).nnz == 0 and Y.dtype == np.float64
    both = c.decode_many([msg, msg])
    assert both.shape == (2 * X.shape[0], V)


def test_binary_errors_have_reasons():
    c = BowBinaryCodec(V)
    X = sp.csr_matrix(np.array([[0, 2.0] + [0] * 18, [1.0] + [0] * 19]))
    msg = c.encode_rows(X)
    head = struct.Struct("<4sBBHII")
    assert _reason(c.decode_rows, msg[:10]) == "truncated"
    assert _reason(c.decode_rows, msg[:-1]) == "truncated"
    assert _reason(c.decode_rows, msg + b"\0") == "trailing_data"
    assert _reason(c.decode_rows, b"XXXX" + msg[4:]) == "bad_header"
    assert _reason(c.decode_rows, head.pack(b"SSVW", 9, 2, 0, 2, 2) + msg[16:]) == "bad_version"
    assert _reason(c.decode_rows, head.pack(b"SSVW", 1, 7, 0, 2, 2) + msg[16:]) == "bad_dtype"
    assert _reason(c.decode_rows, head.pack(b"SSVW", 1, 2, 1, 2, 2) + msg[16:]) == "bad_header"
    bad_ptr = msg[:16] + np.array([0, 2, 1], "<u4").tobytes() + msg[28:]
    assert _reason(c.decode_rows, bad_ptr) == "bad_indptr"
    assert c.decode_many([msg, msg[:-3]]) is None


def test_one_bad_document_in_a_binary_batch_rejects_only_that_document():
    X = sp.csr_matrix(np.array([[1.0] + [0] * 24, [0] * 24 + [3.0], [0, 0, 2.0] + [0] * 22]))
    msg = BowBinaryCodec(25).encode_rows(X)          # written with a larger vocabulary
    part = BowBinaryCodec(V).decode_rows(msg)
    good, bad = BowValidator(V).validate(part)
    assert [(i, r) for i, r, _ in bad] == [(1, "id_out_of_range")] and "24" in bad[0][2]
    assert good.shape == (2, V) and good[0, 0] == 1 and good[1, 2] == 2


# ------------------------------------------------------------------ text
def test_text_with_a_vocabulary_file(tmp_path):
    p = tmp_path / "vocab.txt"
    p.write_text("stream\ntopic\nmodel\n\n")
    assert load_vocabulary(p) == {"stream": 0, "topic": 1, "model": 2}
    c = TextCodec(5, vocabulary=p)
    x = c.decode_rows("A topic MODEL of the Topic stream; x".encode())
    assert x.toarray()[0].tolist() == [1, 2, 1, 0, 0]
    good, bad = BowValidator(5).validate(c.decode_rows(b"nothing known here"))
    assert good.shape[0] == 0 and bad[0][1] == "empty_document"
    assert _reason(c.decode_rows, b"\xff\xfe") == "not_text"
    with pytest.raises(ValueError, match="more than n_features"):
        TextCodec(2, vocabulary=p)
    (tmp_path / "dup.txt").write_text("a\nb\na\n")
    with pytest.raises(ValueError, match="twice"):
        load_vocabulary(tmp_path / "dup.txt")
    with pytest.raises(ValueError, match="only decodes"):
        c.encode_rows(x)


def test_text_hashing_is_crc32_mod_v():
    c = TextCodec(97)
    x = c.decode_rows("Hashing hashing trick".encode())
    assert tokenize("Hashing hashing trick, a!") == ["hashing", "hashing", "trick"]
    expect = np.zeros(97)
    for w in ("hashing", "hashing", "trick"):
        expect[binascii.crc32(w.encode()) % 97] += 1
    np.testing.assert_array_equal(x.toarray()[0], expect)


# ------------------------------------------------------------- validator
def test_validator_reasons_per_document():
    rows = [([1, 2], [1.0, 2.0]), ([30], [1.0]), ([], []), ([4], [0.0]), ([5], [-1.0]),
            ([6], [np.nan]), ([7], [1e13]), ([8, 9], [1.0, 1.0])]
    indptr = np.cumsum([0] + [len(r[0]) for r in rows])
    X = sp.csr_matrix((np.concatenate([r[1] for r in rows]), np.concatenate([r[0] for r in rows]).astype(int),
                       indptr), shape=(len(rows), 31))
    v = BowValidator(V, max_count=1e12)
    good, bad = v.validate(X)
    assert [(i, r) for i, r, _ in bad] == [(1, "id_out_of_range"), (2, "empty_document"),
                                         (3, "empty_document"), (4, "bad_count"),
                                         (5, "non_finite"), (6, "out_of_range")]
    assert good.shape == (2, V) and good.toarray()[1, 8] == 1 and good.toarray()[0, 2] == 2
    assert not v.all_valid(X) and v.all_valid(good)
    assert v.check_size(b"x" * 10) is None
    assert BowValidator(V, max_message_bytes=5).check_size(b"x" * 10)[0] == "too_large"
    for bad_arg in (dict(max_count=0), dict(max_message_bytes=0), dict(max_count="a")):
        with pytest.raises(ValueError):
            BowValidator(V, **bad_arg)


def test_all_valid_agrees_with_validate():
    rng = np.random.default_rng(4)
    v = BowValidator(V, max_count=4.5)
    for _ in range(40):
        X = _random_part(rng, n=8, width=V + int(rng.integers(0, 3))).tolil()
        if rng.random() < 0.3:
            X[int(rng.integers(8)), :] = 0
        if rng.random() < 0.3:
            X[int(rng.integers(8)), int(rng.integers(V))] = -1
        X = X.tocsr()
        assert v.all_valid(X) == (len(v.validate(X)[1]) == 0)


# ------------------------------------------------------------------ kind
def test_the_kind_is_registered_and_round_trips():
    model = LDA(n_components=2, n_features=V)
    kind = record_kind(model)
    assert isinstance(kind, BowKind) and KINDS["bow"] is kind
    assert set(kind.codec_names) == {"json", "binary", "text"}
    assert isinstance(kind.make_codec("json", model, {}), BowJsonCodec)
    assert kind.make_codec("binary", model, {"count_dtype": "uint32"}).dtype == "uint32"
    assert isinstance(kind.make_codec("text", model, {}), TextCodec)
    with pytest.raises(ValueError, match="codec must be one of"):
        kind.make_codec("csv", model, {})
    val = kind.make_validator(model, {"max_abs": 7.0, "max_message_bytes": 99})
    assert (val.n_features, val.max_count, val.max_message_bytes) == (V, 7.0, 99)
    X = _random_part(np.random.default_rng(1), n=6)
    values = kind.to_json(X)
    assert all(set(d) == {"ids", "counts"} for d in values)
    back = kind.from_json(json.loads(json.dumps(values)), model)
    assert (back != X).nnz == 0 and back.shape == X.shape
    joined = kind.concat([X, kind.take(X, slice(1, 3)), kind.take(X, np.array([0, 0]))])
    assert kind.n_records(joined) == 10 and (joined[6:8] != X[1:3]).nnz == 0
    wide = kind.concat([X, BowJsonCodec(V).decode_rows(b'{"ids": [23]}')])
    assert wide.shape == (7, 24)
    assert kind.n_records(kind.empty(model)) == 0 and kind.empty(model).shape[1] == V


# ------------------------------------------------------------------ the daemon
def _lda_truth():
    """3 well-separated topics over 30 words and a corpus drawn from them."""
    from streamsvi.datasets import make_lda_corpus

    topics = np.full((3, 30), 0.02 / 20)
    for k in range(3):
        topics[k, 10 * k:10 * k + 10] = 0.098
    topics /= topics.sum(axis=1, keepdims=True)
    X, _, _ = make_lda_corpus(600, n_topics=3, n_words=30, doc_length=60, alpha=0.3, seed=4,
                              topics=topics)
    return topics, X


def _topics_recovered(fitted, truth):
    """Every learned topic's mean word distribution within 0.15 (L1/2) of a distinct true topic."""
    lam = fitted.lam["topic_word"]
    beta = lam / lam.sum(axis=1, keepdims=True)
    tv = 0.5 * np.abs(beta[:, None, :] - truth[None, :, :]).sum(axis=2)   # (K learned, K true)
    match = tv.argmin(axis=1)
    return sorted(match.tolist()) == [0, 1, 2] and float(tv.min(axis=1).max()) < 0.15, tv


def test_daemon_learns_lda_from_a_file_of_documents_and_dead_letters_bad_ones(tmp_path):
    """End to end: kind = "lda", JSONL bag-of-words file, dead letters, snapshot, load, score."""
    import io

    import streamsvi
    from streamsvi.cli import main
    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon

    truth, X = _lda_truth()
    kind = KINDS["bow"]
    lines = [json.dumps(d) for d in kind.to_json(X)]
    lines[7] = json.dumps({"ids": [3, 30], "counts": [1, 2]})      # id 30 >= V
    lines[8] = json.dumps({"ids": [], "counts": []})               # empty document
    lines[9] = "{not json"
    data = tmp_path / "docs.jsonl"
    data.write_text("\n".join(lines) + "\n")
    dead = tmp_path / "dead.jsonl"
    cfg = validate({
        "model": {"kind": "lda", "n_components": 3, "n_features": 30, "doc_topic_prior": 0.3,
                  "topic_word_prior": 0.05},
        "inference": {"n_total": "auto", "batch_size": 50, "tau0": 1.0, "kappa": 0.6},
        "source": {"kind": "file", "path": str(data), "dead_letter_path": str(dead)},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 4},
        "metrics": {"enabled": False, "heldout_size": 30, "heldout_every": 2, "progress_seconds": 0.0},
    })
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained" and res.dead == 3 and res.heldout == 30
    reasons = sorted(json.loads(d)["reason"] for d in dead.read_text().splitlines())
    assert reasons == ['empty_document', 'id_out_of_range', 'json_invalid'], reasons
    fitted = streamsvi.load(tmp_path / "ck")
    assert fitted.records_seen == 600 - 3 - 30
    ok, tv = _topics_recovered(fitted, truth)
    assert ok, tv
    # the held-out reservoir is stored in the snapshot as the kind's JSON and reads back
    held = kind.from_json(fitted.extra["heldout"], fitted.model)
    first_valid = X[np.r_[0:7, 10:33]]                           # lines 7-9 were dead-lettered
    assert held.shape == (30, 30) and (held != first_valid).nnz == 0
    (tmp_path / "in.jsonl").write_text('{"ids": [0, 1, 2], "counts": [3, 2, 4]}\n{"ids": [99]}\n'
                                       '{"ids": [25, 27], "counts": [5, 5]}\n')
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 1      # some lines failed
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert "error" in out[1] and "error" not in out[0] and "error" not in out[2]
    assert out[0]["topic"] != out[2]["topic"] and abs(sum(out[0]["topic_proportions"]) - 1) < 1e-9


def test_daemon_learns_lda_from_binary_csr_batches_on_kafka(tmp_path, kafka_broker, new_topic):
    """The same model from a real broker, binary CSR minibatches produced with produce_rows."""
    import io

    import streamsvi
    from streamsvi.io import produce_rows
    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon

    truth, X = _lda_truth()
    kind, model = KINDS["bow"], LDA(n_components=3, n_features=30)
    topic = new_topic(partitions=1)
    codec = kind.make_codec("binary", model, {})
    assert produce_rows(kafka_broker.bootstrap, topic, X, codec, batch_rows=50, kind=kind) == 12
    cfg = validate({
        "model": {"kind": "lda", "n_components": 3, "n_features": 30, "doc_topic_prior": 0.3,
                  "topic_word_prior": 0.05},
        "inference": {"n_total": 600, "batch_size": 50, "tau0": 1.0, "kappa": 0.6},
        "source": {"kind": "kafka", "bootstrap_servers": kafka_broker.bootstrap, "topics": [topic],
                   "group_id": f"g-{topic}", "codec": "binary", "dead_letter_topic": f"{topic}-dead"},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 4},
        "metrics": {"enabled": False, "heldout_size": 0, "progress_seconds": 0.0},
    })
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained" and res.records == 600 and res.dead == 0
    fitted = streamsvi.load(tmp_path / "ck")
    assert fitted.records_seen == 600 and fitted.engine_settings["n_total"] == 600
    ok, tv = _topics_recovered(fitted, truth)
    assert ok, tv
