"""The "ratings" record kind: JSON and binary codecs, the validator, the kind's helpers."""
import json
import struct

import numpy as np
import pytest

from streamsvi.io.codecs import DecodeError
from streamsvi.io.ratings import RatingsBinaryCodec, RatingsJsonCodec, RatingsKind, RatingsValidator
from streamsvi.io.records import record_kind
from streamsvi.models import PMF, Ratings


def _reason(fn, payload):
    with pytest.raises(DecodeError) as exc:
        fn(payload)
    return exc.value.reason


def test_json_decodes_string_and_integer_ids():
    codec = RatingsJsonCodec()
    x = codec.decode_rows(b'{"user": 42, "item": "tt0111161", "rating": 4.5, "ts": 1}')
    assert (x.user.tolist(), x.item.tolist(), x.rating.tolist()) == (["42"], ["tt0111161"], [4.5])
    many = codec.decode_many([b'{"user": "42", "item": 1, "rating": 3}',
                              b'{"user": "\\u00e9l\\u00e8ve", "item": 2, "rating": 1}'])
    assert many.user.tolist() == ["42", "élève"] and many.item.tolist() == ["1", "2"]
    assert codec.decode_many([b'{"user": 1, "item": 2, "rating": 3}', b"[1]"]) is None
    assert len(codec.decode_many([])) == 0


@pytest.mark.parametrize("payload, reason", [
    (b"{not json", "json_invalid"),
    (b"\xff\xfe", "json_invalid"),
    (b"[1, 2, 3]", "wrong_shape"),
    (b'{"user": 1, "rating": 3}', "missing_field"),
    (b'{"user": 1.5, "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": true, "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": null, "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": "", "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": 1, "item": [2], "rating": 3}', "bad_id"),
    (b'{"user": 1, "item": 2, "rating": "5"}', "not_numeric"),
    (b'{"user": 1, "item": 2, "rating": 1e999999}', None),      # parses to inf: the validator's job
])
def test_json_reason_codes(payload, reason):
    codec = RatingsJsonCodec()
    if reason is None:
        x = codec.decode_rows(payload)
        assert RatingsValidator().validate(x)[1][0][1] == "non_finite"
        return
    assert _reason(codec.decode_rows, payload) == reason


def test_json_round_trip_and_long_ids():
    codec = RatingsJsonCodec()
    x = Ratings(["u 1"], [7], [2.5])
    assert json.loads(codec.encode_rows(x)) == {"user": "u 1", "item": "7", "rating": 2.5}
    assert codec.decode_rows(codec.encode_rows(x)).to_records() == x.to_records()
    long_id = json.dumps({"user": "x" * 257, "item": 1, "rating": 3}).encode()
    assert _reason(codec.decode_rows, long_id) == "bad_id"
    with pytest.raises(ValueError, match="one rating per message"):
        codec.encode_rows(Ratings([1, 2], [1, 2], [1.0, 2.0]))


def test_binary_round_trip():
    codec = RatingsBinaryCodec()
    x = Ratings(["alice", 17, "ß-ü"], ["m1", "m2", 3], [4.0, 1.5, 5.0])
    msg = codec.encode_rows(x)
    assert msg[:4] == b"SSVR" and len(msg) == 20 + 12 * 3 + len("alice17ß-ü".encode()) + len("m1m23")
    y = codec.decode_rows(msg)
    assert y.to_records() == x.to_records()
    both = codec.decode_many([msg, codec.encode_rows(x[np.array([0])])])
    assert len(both) == 4 and both.user.tolist()[-1] == "alice"
    with pytest.raises(ValueError, match="binary batch of 0 ratings"):    # issue 16: empty_batch
        codec.encode_rows(Ratings.empty())


def test_binary_reason_codes():
    codec = RatingsBinaryCodec()
    msg = codec.encode_rows(Ratings(["a", "b"], ["c", "d"], [1.0, 2.0]))
    assert _reason(codec.decode_rows, msg[:10]) == "truncated"
    assert _reason(codec.decode_rows, msg[:-1]) == "truncated"
    assert _reason(codec.decode_rows, msg + b"x") == "trailing_data"
    assert _reason(codec.decode_rows, b"XXXX" + msg[4:]) == "bad_header"
    assert _reason(codec.decode_rows, msg[:4] + b"\x02" + msg[5:]) == "bad_version"
    assert _reason(codec.decode_rows, msg[:5] + b"\x01" + msg[6:]) == "bad_header"
    # id lengths that do not add up to the header's byte counts
    bad_len = bytearray(msg)
    struct.pack_into("<H", bad_len, 20 + 16, 0)          # first user id length 1 -> 0
    assert _reason(codec.decode_rows, bytes(bad_len)) == "bad_header"
    # an empty id (lengths consistent) and non-UTF-8 bytes in an id
    head = codec.HEADER.pack(b"SSVR", 1, b"\0\0\0", 1, 0, 1)
    empty = head + np.array([3.0]).tobytes() + np.array([0], "<u2").tobytes() + np.array([1], "<u2").tobytes() + b"i"
    assert _reason(codec.decode_rows, empty) == "bad_id"
    head = codec.HEADER.pack(b"SSVR", 1, b"\0\0\0", 1, 1, 1)
    latin = head + np.array([3.0]).tobytes() + np.array([1], "<u2").tobytes() + np.array([1], "<u2").tobytes() + b"\xff" + b"i"
    assert _reason(codec.decode_rows, latin) == "bad_id"
    assert codec.decode_many([msg, msg[:10]]) is None


def test_validator_rejects_out_of_range_and_non_finite_rows():
    v = RatingsValidator(min_rating=1, max_rating=5, max_message_bytes=100)
    x = Ratings([1, 2, 3, 4, 5], [1, 1, 1, 1, 1], [1.0, 0.5, np.nan, 5.0, 5.5])
    good, bad = v.validate(x)
    assert good.rating.tolist() == [1.0, 5.0] and good.user.tolist() == ["1", "4"]
    assert [(i, r) for i, r, _ in bad] == [(1, "out_of_range"), (2, "non_finite"), (4, "out_of_range")]
    assert "outside [1.0, 5.0]" in bad[0][2]
    assert not v.all_valid(x) and v.all_valid(good)
    assert v.check_size(b"x" * 101)[0] == "too_large" and v.check_size(b"x" * 100) is None
    unbounded = RatingsValidator(max_abs=10)
    assert unbounded.validate(Ratings([1, 1], [1, 2], [-9.0, 11.0]))[1][0][:2] == (1, "out_of_range")
    with pytest.raises(ValueError, match="min_rating"):
        RatingsValidator(min_rating=5, max_rating=1)


def test_kind_is_found_for_pmf_and_helpers_work():
    model = PMF()
    kind = record_kind(model)
    assert isinstance(kind, RatingsKind) and kind.name == "ratings"
    assert isinstance(kind.make_codec("json", model, {}), RatingsJsonCodec)
    assert isinstance(kind.make_codec("binary", model, {}), RatingsBinaryCodec)
    with pytest.raises(ValueError, match="fields"):
        kind.make_codec("json", model, {"fields": ["a"]})
    v = kind.make_validator(model, {"min_rating": 1.0, "max_rating": 5.0, "max_abs": 1e12,
                                    "max_message_bytes": 1000})
    assert (v.min_rating, v.max_rating, v.max_message_bytes) == (1.0, 5.0, 1000)
    part = kind.concat([Ratings([1], ["a"], [4.0]), Ratings(["u2", 3], [5, 6], [2.5, 1.0])])
    assert kind.n_records(part) == 3
    assert kind.to_json(kind.take(part, np.array([2]))) == [{"user": "3", "item": "6", "rating": 1.0}]
    assert kind.to_json(kind.take(part, slice(0, 1))) == [{"user": "1", "item": "a", "rating": 4.0}]
    back = kind.from_json(json.loads(json.dumps(kind.to_json(part))), model)
    assert back.to_records() == part.to_records()
    assert kind.n_records(kind.empty(model)) == 0
    # a decoded batch is what the model trains on
    model.check_batch(part)


def test_file_and_memory_sources_dead_letter_bad_ratings(tmp_path):
    """Through the sources: out-of-range ratings and malformed ids become dead letters with reasons."""
    from streamsvi.io.sources import FileSource, MemorySource

    kind = RatingsKind()
    model = PMF()
    validator = kind.make_validator(model, {"min_rating": 1.0, "max_rating": 5.0})
    lines = [b'{"user": 1, "item": "a", "rating": 4}', b'{"user": 2, "item": "b", "rating": 7}',
             b'{"user": 2.5, "item": "b", "rating": 3}', b'{"user": "u3", "item": 9, "rating": 1.5}']
    path = tmp_path / "ratings.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    src = FileSource(path, codec=kind.make_codec("json", model, {}), validator=validator, kind=kind)
    batch = src.poll_batch(10)
    assert batch.x.to_records() == [{"user": "1", "item": "a", "rating": 4.0},
                                    {"user": "u3", "item": "9", "rating": 1.5}]
    assert sorted(d.reason for d in batch.dead) == ["bad_id", "out_of_range"]
    x = Ratings([1, 2, 3], ["a", "b", "c"], [3.0, 0.0, 5.0])
    mem = MemorySource(x, validator=validator, kind=kind)
    b = mem.poll_batch(2)             # two good ratings: the bad one in between is dead-lettered
    assert b.x.user.tolist() == ["1", "3"] and [d.reason for d in b.dead] == ["out_of_range"]
    assert json.loads(b.dead[0].payload) == {"user": "2", "item": "b", "rating": 0.0}
    assert b.dead[0].position.offset == 1


def test_daemon_learns_pmf_from_a_file_of_ratings(tmp_path):
    """End to end: kind = "pmf", JSONL ratings with bad lines, held-out metric, snapshot, score."""
    import io

    import streamsvi
    from streamsvi.cli import main
    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon

    rng = np.random.default_rng(12)
    U, V = rng.normal(size=(40, 2)), rng.normal(size=(30, 2))
    i, j = rng.integers(0, 40, 4000), rng.integers(0, 30, 4000)
    y = np.clip((U[i] * V[j]).sum(1) + 3.0 + 0.3 * rng.normal(size=4000), 1.0, 5.0)
    lines = [json.dumps({"user": f"u{a}", "item": int(b), "rating": round(float(r), 3)})
             for a, b, r in zip(i, j, y)]
    lines[5] = json.dumps({"user": "u1", "item": 3, "rating": 9.5})       # above max_rating
    lines[6] = json.dumps({"user": "u1", "rating": 3.0})                  # no item
    lines[7] = "[1, 2, 3]"
    data = tmp_path / "ratings.jsonl"
    data.write_text("\n".join(lines) + "\n")
    dead = tmp_path / "dead.jsonl"
    cfg = validate({
        "model": {"kind": "pmf", "n_factors": 2, "sigma2": 0.1, "prior_var": 1.0, "biases": True,
                  "offset": 3.0},
        "inference": {"n_total": "auto", "batch_size": 200, "tau0": 1.0, "kappa": 0.6},
        "source": {"kind": "file", "path": str(data), "dead_letter_path": str(dead)},
        "validation": {"min_rating": 1.0, "max_rating": 5.0},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 5},
        "metrics": {"enabled": False, "heldout_size": 300, "heldout_every": 2, "progress_seconds": 0.0},
    })
    daemon = Daemon(cfg, out=io.StringIO())
    res = daemon.run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained" and res.dead == 3 and res.heldout == 300
    assert sorted(json.loads(d)["reason"] for d in dead.read_text().splitlines()) == \
        ["missing_field", "out_of_range", "wrong_shape"]
    assert np.isfinite(daemon.heldout_ll)            # the held-out metric works for a row-wise model
    fitted = streamsvi.load(tmp_path / "ck")
    assert fitted.records_seen == 4000 - 3 - 300 and fitted.aux is not None
    # the held-out ratings (first 300 valid lines) are predicted far better than by the mean
    held = [k for k in range(4000) if k not in (5, 6, 7)][:300]
    mean, var = fitted.predict_rating([f"u{a}" for a in i[held]], j[held].tolist())
    rmse, base = np.sqrt(np.mean((mean - y[held]) ** 2)), np.std(y[held])
    assert rmse < 0.75 * base, (rmse, base)        # one pass: 0.69 vs 1.03; no learning is >= 1
    assert np.all(var > 0)
    (tmp_path / "in.jsonl").write_text('{"user": "u3", "item": 4, "rating": 3}\n{"item": 4}\n{"user": "u3"}\n')
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 1      # some lines failed
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[1]["reason"] == "missing_field"                        # no user
    assert [i for i, _ in fitted.recommend("u3", k=10)] == [r["item"] for r in out[2]["top_k"]]
    m, _ = fitted.predict_rating(["u3"], [4])
    assert out[0]["prediction"] == pytest.approx(float(m[0]))
