"""The fast decode paths of the JSON codecs (issue 27, item 3) against fixed expectations.

``decode_many`` of every JSON kind has a fast path (bag of words and
sequences: :func:`~streamsvi.io.codecs.parse_int_arrays`, no JSON parser;
labelled: one parse of all features; ratings: checks on whole columns). Each
must give exactly what decoding message by message gives, or None; and the
source's batch builder must dead-letter every bad message with the reason
(and message) of the one-by-one path, in read order. Here, on a fixed corpus
of good and bad payloads of each kind:

* the decoded values of good payloads, written out;
* that the fast path is what produced them (so a slower fallback cannot hide);
* ``decode_many`` of any good/bad pair: None, or the one-by-one result;
* the dead letters of a mixed run through ``_BatchBuilder``: offsets and
  reasons written out, messages those of ``decode_rows``.
"""
import json
import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamsvi.io.bow import BowJsonCodec, BowKind, BowValidator
from streamsvi.io.codecs import DecodeError, parse_int_arrays
from streamsvi.io.dense import DenseKind, JsonCodec, RecordValidator
from streamsvi.io.labelled import LabelledJsonCodec, LabelledKind, LabelledValidator
from streamsvi.io.ratings import RatingsJsonCodec, RatingsKind, RatingsValidator
from streamsvi.io.sequences import SequenceJsonCodec, SequencesKind, SequenceValidator
from streamsvi.io.sources.base import _BatchBuilder


# ------------------------------------------------------------ parse_int_arrays
def test_parse_int_arrays_reads_plain_integer_arrays():
    values, lengths = parse_int_arrays(b"[0, 7, 10];[];[123456789012, 5,6];", 3)
    assert values.dtype == np.int64
    assert values.tolist() == [0, 7, 10, 123456789012, 5, 6] and lengths.tolist() == [3, 0, 3]
    values, _ = parse_int_arrays(b"[9999999999999999, 12345678, 123456789];", 1)
    assert values.tolist() == [9999999999999999, 12345678, 123456789]


def test_parse_int_arrays_converts_every_length_of_number_exactly():
    rng = np.random.default_rng(0)
    for n_digits in range(1, 17):
        v = rng.integers(10 ** (n_digits - 1) if n_digits > 1 else 0, 10 ** n_digits, 2000, dtype=np.int64)
        values, _ = parse_int_arrays(("[" + ", ".join(map(str, v.tolist())) + "];").encode(), 1)
        assert np.array_equal(values, v), n_digits
    mixed = rng.integers(0, 10 ** rng.integers(1, 17, 5000), dtype=np.int64)
    values, _ = parse_int_arrays(("[" + ",".join(map(str, mixed.tolist())) + "];").encode(), 1)
    assert np.array_equal(values, mixed)


@pytest.mark.parametrize("blob", [
    b"[1, 2.5];", b"[01];", b"[-1];", b"[1 ,2];", b"[1,  2];", b"[ 1];", b"[1,];", b"[,1];",
    b"[1,,2];", b"[1 2];", b"[[1]];", b"[1]];", b"[1]", b"1;", b"[1];;", b"[1e3];", b'["1"];',
    b"[true];", b"[12345678901234567];", b"[1]\n;", b"[1,\n2];",
])
def test_parse_int_arrays_leaves_everything_else_to_the_json_parser(blob):
    assert parse_int_arrays(blob, 1) is None


def test_parse_int_arrays_counts_the_messages():
    assert parse_int_arrays(b"[1];[2];", 1) is None          # a ";" inside a message
    assert parse_int_arrays(b"[1];", 2) is None


def test_parse_int_arrays_agrees_with_json_on_random_texts():
    """Whatever it accepts, json.loads reads as the same integers (fixed seed, 20 000 texts)."""
    rng = random.Random(7)
    alphabet = "0123456789, ;[]-.\n"
    accepted = 0
    for _ in range(20_000):
        msgs = ["[" + "".join(rng.choice(alphabet[:12] if rng.random() < 0.93 else alphabet)
                              for _ in range(rng.randint(0, rng.choice([6, 12, 40])))) + "]"
                for _ in range(rng.randint(1, 3))]
        got = parse_int_arrays((";".join(msgs) + ";").encode(), len(msgs))
        if got is None:
            continue
        accepted += 1
        parsed = [json.loads(m) for m in msgs]
        assert all(type(v) is int for p in parsed for v in p)
        assert got[0].tolist() == [v for p in parsed for v in p]
        assert got[1].tolist() == [len(p) for p in parsed]
    assert accepted > 2_000


# --------------------------------------------------------------- the corpus
def _bow_value(part):
    X = part.tocsr()
    return [{"ids": X.indices[X.indptr[i]:X.indptr[i + 1]].tolist(),
             "counts": X.data[X.indptr[i]:X.indptr[i + 1]].tolist()} for i in range(X.shape[0])] \
        + [X.shape[1]]


def _value(part):
    """A decoded part as plain Python values, for comparing with the expectations."""
    if hasattr(part, "tocsr"):
        return _bow_value(part)
    if hasattr(part, "offsets"):
        return part.to_list()
    if hasattr(part, "user"):
        return [list(part.user), list(part.item), part.rating.tolist()]
    return np.asarray(part).tolist()


BOW_GOOD = [  # (payload, [{"ids", "counts"}, ..., width])
    (b'{"ids": [3, 17, 17, 40], "counts": [2, 1, 1, 5]}', [{"ids": [3, 17, 40], "counts": [2.0, 2.0, 5.0]}, 50]),
    (b'{"ids":[1,2],"counts":[7,0]}', [{"ids": [1, 2], "counts": [7.0, 0.0]}, 50]),
    (b'{"ids": [4, 9]}', [{"ids": [4, 9], "counts": [1.0, 1.0]}, 50]),
    (b"[5, 5, 6]", [{"ids": [5, 6], "counts": [2.0, 1.0]}, 50]),
    (b'{"ids": [], "counts": []}', [{"ids": [], "counts": []}, 50]),
    (b'{"ids": [60], "counts": [1]}', [{"ids": [60], "counts": [1.0]}, 61]),   # the validator's case
    (b' { "ids" : [ 1 ] , "counts" : [ 3 ] } \n', [{"ids": [1], "counts": [3.0]}, 50]),     # json path
    (b'{"ids": [2], "counts": [2.5]}', [{"ids": [2], "counts": [2.5]}, 50]),      # json path
    (b'{"counts": [4], "ids": [8]}', [{"ids": [8], "counts": [4.0]}, 50]),        # json path
    (b'{"ids": [3.0], "counts": [-1], "doc": "x"}', [{"ids": [3], "counts": [-1.0]}, 50]),
    # spelled as json.dumps writes it, but more cut in with the arrays: the JSON path
    (b'{"ids": [1], "counts": [2], "x": [3]}', [{"ids": [1], "counts": [2.0]}, 50]),
    (b'{"ids": [1, 2], "counts": [1], "counts": [3, 4]}', [{"ids": [1, 2], "counts": [3.0, 4.0]}, 50]),
    (b'{"ids": [7], "counts": [1], "n": "]}"}', [{"ids": [7], "counts": [1.0]}, 50]),
]
BOW_BAD = [  # (payload, reason of decode_rows)
    (b'{"ids": [1, 2], "counts": [1]}', "wrong_shape"),
    (b'{"ids": [-1]}', "id_out_of_range"),
    (b'{"ids": [4294967296]}', "id_out_of_range"),
    (b'{"ids": [1.5]}', "not_integer"),
    (b'{"ids": [1], "counts": [true]}', "not_numeric"),
    (b'{"ids": [1], "counts": [9007199254740993]}', "out_of_range"),
    (b'{"ids": [01]}', "json_invalid"),
    (b'{"counts": [1]}', "missing_field"),
    (b'"text"', "wrong_shape"),
    (b"{oops", "json_invalid"),
    (b'{"ids": [1], "counts": [2]} ]}', "json_invalid"),
    (b'{"ids": [1], "counts": [2], ]}', "json_invalid"),
]

SEQ_GOOD = [
    (b"[1, 3, 0, 2]", [[1, 3, 0, 2]]),
    (b"[12,0,7]", [[12, 0, 7]]),
    (b"[]", [[]]),
    (b"[123456789012]", [[123456789012]]),
    (b"[ 1 , 2 ]", [[1, 2]]),                        # the one-parse path
    (b"[-2, 5]", [[-2, 5]]),
    (b'{"symbols": [4, 4], "id": "r-1"}', [[4, 4]]),
    (b"[3.0, 1]", [[3, 1]]),
]
SEQ_BAD = [
    (b"[1, 2.5]", "not_integer"),
    (b"[[1], 2]", "wrong_shape"),
    (b"[1, 99999999999999999999]", "out_of_range"),
    (b'{"id": 1}', "missing_field"),
    (b"[01]", "json_invalid"),
    (b"[1,]", "json_invalid"),
    (b'["a"]', "not_integer"),
]

LAB_GOOD = [
    (b'{"x": [0.5, -1, 2e3], "y": 1}', [[0.5, -1.0, 2000.0, 1.0]]),
    (b'{"y":0,"x":[1,2,3]}', [[1.0, 2.0, 3.0, 0.0]]),
    (b'{ "x" : [ 0.1 , 0.2 , 0.3 ] , "y" : 7 }', [[0.1, 0.2, 0.3, 7.0]]),
    (b'{"x": [1, 2, 3], "label": 1}', [[1.0, 2.0, 3.0, 1.0]]),            # decode path
    (b'{"x": [1, 2, 3], "y": 1.0, "id": "a"}', [[1.0, 2.0, 3.0, 1.0]]),   # decode path
    (b'{"x": [NaN, 2, 3], "y": 0}', [[float("nan"), 2.0, 3.0, 0.0]]),     # stdlib NaN
    (b'{"x": [1, 2, 3], "y": -4}', [[1.0, 2.0, 3.0, -4.0]]),             # the validator's case
    (b'{"x": [1, 2, 1e999], "y": 1}', [[1.0, 2.0, float("inf"), 1.0]]),  # stdlib: inf, non_finite
    # spelled as json.dumps writes it, but more cut in: the decode path
    (b'{"x": [1, 2, 3], "y": 1, "z": 2}', [[1.0, 2.0, 3.0, 1.0]]),
    (b'{"x": [1, 2], "x": [1, 2, 3], "y": 1}', [[1.0, 2.0, 3.0, 1.0]]),
    (b'{"x": [1, 2, 3], "y": 1, "y": 0}', [[1.0, 2.0, 3.0, 0.0]]),
    (b'{"x": [1, 2, 3], "y": -0}', [[1.0, 2.0, 3.0, 0.0]]),
]
LAB_BAD = [
    (b'{"x": [1, 2], "y": 1}', "wrong_shape"),
    (b'{"x": [1, 2, true], "y": 1}', "not_numeric"),
    (b'{"x": [1, 2, "3"], "y": 1}', "not_numeric"),
    (b'{"x": [1, 2, null], "y": 1}', "not_numeric"),
    (b'{"x": [1, 2, 3], "y": 0.5}', "bad_label"),
    (b'{"x": [1, 2, 3]}', "bad_label"),
    (b'{"x": [1, 2, 3], "y": "1"}', "bad_label"),
    (b'{"y": 1}', "missing_field"),
    (b'{"x": [1, 2, [3]], "y": 1}', "not_numeric"),
    (b'{"x": [1, 2, 03], "y": 1}', "json_invalid"),
    (b"[1, 2, 3]", "wrong_shape"),
    (b'{"x": [1, 2, 3], "y": 01}', "json_invalid"),
    (b'{"x": [1, 2, 3], "y": 1, 2}', "json_invalid"),
    (b'{"x": [1, 2 3], "y": 1}', "json_invalid"),
    (b'{"x": [1, 2, 3, 4], "y": 1}', "wrong_shape"),
    (b'{"x": [1, 2,, 3], "y": 1}', "json_invalid"),
]

RAT_GOOD = [
    (b'{"user": "196", "item": "242", "rating": 3.0}', [["196"], ["242"], [3.0]]),
    (b'{"user": 7, "item": "m1", "rating": 4}', [["7"], ["m1"], [4.0]]),
    (b'{"rating": 2.5, "item": 12, "user": "u-\\u00e9", "ts": 1}', [["u-\u00e9"], ["12"], [2.5]]),
    (b'{"user": 1, "item": 2, "rating": 9}', [["1"], ["2"], [9.0]]),           # the validator's case
    (b'{"user": 1, "item": 2, "rating": NaN}', [["1"], ["2"], [float("nan")]]),  # stdlib NaN
]
RAT_BAD = [
    (b'{"user": "", "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": "a\\nb", "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": "' + b"u" * 257 + b'", "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": 1.5, "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": true, "item": 2, "rating": 3}', "bad_id"),
    (b'{"user": 1, "item": null, "rating": 3}', "bad_id"),
    (b'{"user": 1, "item": 2, "rating": "3"}', "not_numeric"),
    (b'{"user": 1, "item": 2, "rating": false}', "not_numeric"),
    (b'{"user": 1, "item": 2}', "missing_field"),
    (b"[1, 2, 3]", "wrong_shape"),
    (b"not json", "json_invalid"),
]

DENSE_GOOD = [
    (b"[0.1, -2.5, 3]", [[0.1, -2.5, 3.0]]),
    (b"[1e-300,2E2,-0.0]", [[1e-300, 200.0, -0.0]]),
    (b'{"x": [1, 2, 3], "id": 4}', [[1.0, 2.0, 3.0]]),
    (b"[Infinity, 0, 1]", [[float("inf"), 0.0, 1.0]]),                   # the validator's case
]
DENSE_BAD = [
    (b"[1, 2]", "wrong_shape"),
    (b"[1, 2, true]", "not_numeric"),
    (b'{"y": [1, 2, 3]}', "missing_field"),
    (b"[1, 2, 3", "json_invalid"),
]

KINDS = {  # name: (codec, validator, kind, good, bad, payloads the fast path must take alone)
    "bow": (BowJsonCodec(50), BowValidator(50), BowKind(), BOW_GOOD, BOW_BAD, 6),
    "sequences": (SequenceJsonCodec(), SequenceValidator(8), SequencesKind(), SEQ_GOOD, SEQ_BAD, 4),
    "labelled": (LabelledJsonCodec(3), LabelledValidator(3), LabelledKind(), LAB_GOOD, LAB_BAD, 3),
    "ratings": (RatingsJsonCodec(), RatingsValidator(min_rating=1, max_rating=5), RatingsKind(),
                RAT_GOOD, RAT_BAD, 4),
    "dense": (JsonCodec(3), RecordValidator(3), DenseKind(), DENSE_GOOD, DENSE_BAD, 2),
}
NAMES = list(KINDS)


def _same(a, b):
    return json.dumps(_value(a)) == json.dumps(_value(b))       # NaN == NaN, -0.0 != 0.0


@pytest.mark.parametrize("name", NAMES)
def test_each_good_payload_decodes_to_its_written_value(name):
    codec, _, _, good, _, _ = KINDS[name]
    for payload, expected in good:
        assert json.dumps(_value(codec.decode_rows(payload))) == json.dumps(expected), payload
        many = codec.decode_many([payload])          # None: not proven, the source decodes it alone
        assert many is None or json.dumps(_value(many)) == json.dumps(expected), payload


@pytest.mark.parametrize("name", NAMES)
def test_decode_many_of_all_good_payloads_is_one_by_one(name):
    codec, _, kind, good, _, n_fast = KINDS[name]
    payloads = [p for p, _ in good]
    for part in (payloads[:k] for k in range(1, len(payloads) + 1)):
        for msgs in (part, part[::-1]):
            many = codec.decode_many(msgs)
            assert many is None or _same(many, kind.concat([codec.decode_rows(p) for p in msgs]))
    if name in ("bow", "labelled", "ratings"):            # these decode every valid run at once
        assert _same(codec.decode_many(payloads), kind.concat([codec.decode_rows(p) for p in payloads]))
    assert kind.n_records(codec.decode_many([])) == 0


@pytest.mark.parametrize("name", ["bow", "labelled", "ratings"])
def test_the_fast_path_takes_plain_payloads(name):
    """The first payloads of each corpus are what producers write: the fast path decodes them."""
    codec, _, kind, good, _, n_fast = KINDS[name]
    payloads = [p for p, _ in good[:n_fast]] * 3
    fast = codec._decode_many_fast(payloads)
    assert fast is not None
    assert _same(fast, kind.concat([codec.decode_rows(p) for p in payloads]))
    assert codec._decode_many_fast(payloads + [good[n_fast][0]]) is None


@pytest.mark.parametrize("name", NAMES)
def test_decode_many_takes_bytearrays_and_memoryviews(name):
    codec, _, kind, good, _, _ = KINDS[name]
    payloads = [p for p, _ in good]
    expected = kind.concat([codec.decode_rows(p) for p in payloads])
    for wrap in (bytearray, memoryview):
        many = codec.decode_many([wrap(p) for p in payloads])
        assert many is None or _same(many, expected)


def test_the_integer_fast_path_takes_plain_sequences():
    payloads = [p for p, _ in SEQ_GOOD[:4]]
    blob = b";".join(payloads) + b";"
    assert parse_int_arrays(blob, len(payloads)) is not None


@pytest.mark.parametrize("name", NAMES)
def test_decode_many_of_any_good_and_bad_pair_is_none_or_exact(name):
    codec, _, kind, good, bad, _ = KINDS[name]
    for g, _ in good:
        for b, reason in bad:
            with pytest.raises(DecodeError) as info:
                codec.decode_rows(b)
            assert info.value.reason == reason, b
            for pair in ([g, b], [b, g], [g, b, g]):
                assert codec.decode_many(pair) is None, pair


@pytest.mark.parametrize("name", NAMES)
def test_the_batch_builder_dead_letters_each_bad_payload_with_its_reason_in_order(name):
    codec, validator, kind, good, bad, _ = KINDS[name]
    rng = random.Random(3)
    msgs = [p for p, _ in good] * 2 + [p for p, _ in bad]
    rng.shuffle(msgs)
    b = _BatchBuilder(codec, validator, getattr(codec, "n_features", None), kind=kind)
    b.add_messages([("t", 0, i, p) for i, p in enumerate(msgs)])
    batch = b.batch()
    expected_dead = []
    kept = []
    for i, p in enumerate(msgs):
        try:
            part = codec.decode_rows(p)
        except DecodeError as exc:
            expected_dead.append((i, exc.reason, exc.message))
            continue
        good_part, rejected = validator.validate(part)
        expected_dead.extend((i, r, m) for _, r, m in rejected)
        if kind.n_records(good_part):
            kept.append(good_part)
    assert [(d.position.offset, d.reason, d.message) for d in batch.dead] == expected_dead
    assert [d.payload for d in batch.dead] == [msgs[i] for i, _, _ in expected_dead]
    bad_reasons = dict(bad)
    assert [r for i, r, _ in expected_dead if msgs[i] in bad_reasons] == [bad_reasons[msgs[i]] for i, _, _ in
                                                                         expected_dead if msgs[i] in bad_reasons]
    assert _same(batch.x, kind.concat(kept))
    assert batch.n_messages == len(msgs)


def test_the_written_dead_letter_reasons_of_a_mixed_bow_run():
    """One run, offsets and reasons written out (the validator's among the decoder's)."""
    codec, validator = BowJsonCodec(50), BowValidator(50)
    msgs = [b'{"ids": [1, 2], "counts": [1, 1]}', b'{"ids": [-1]}', b'{"ids": [60]}', b"[3, 4]",
            b'{"ids": [1], "counts": [0]}', b'{"ids": [1.5]}', b'{"ids": [2], "counts": [2.5]}']
    b = _BatchBuilder(codec, validator, 50, kind=BowKind())
    b.add_messages([("t", 0, i, p) for i, p in enumerate(msgs)])
    batch = b.batch()
    assert [(d.position.offset, d.reason) for d in batch.dead] == [
        (1, "id_out_of_range"), (2, "id_out_of_range"), (4, "empty_document"), (5, "not_integer")]
    assert batch.x.shape == (3, 50) and batch.x.sum() == 6.5


# ------------------------------------------------- property: None or exact

_numbers = st.one_of(st.integers(0, 70), st.integers(-3, 3), st.sampled_from(
    [0.5, 1.0, 3.0, -0.0, 1e300, 2 ** 53 + 1, 2 ** 32, 2 ** 63, 10 ** 20, float("nan"), float("inf")]),
    st.booleans(), st.none(), st.text(max_size=2))
_lists = st.lists(st.one_of(st.integers(0, 70), st.integers(0, 70), _numbers), max_size=5)
_records = {
    "bow": st.one_of(st.fixed_dictionaries({"ids": _lists}, optional={"counts": _lists}), _lists,
                     st.fixed_dictionaries({"ids": _lists, "counts": _lists, "n": st.text(max_size=3)})),
    "sequences": st.one_of(_lists, st.fixed_dictionaries({"symbols": _lists})),
    "labelled": st.fixed_dictionaries({"x": st.lists(st.one_of(st.floats(-1e3, 1e3), _numbers),
                                                     min_size=2, max_size=4)},
                                      optional={"y": _numbers, "z": _numbers}),
    "ratings": st.fixed_dictionaries({"user": _numbers, "item": st.one_of(_numbers, st.text(max_size=3)),
                                      "rating": _numbers}, optional={"ts": _numbers}),
    "dense": st.one_of(st.lists(st.one_of(st.floats(), _numbers), min_size=2, max_size=4),
                       st.fixed_dictionaries({"x": _lists})),
}
#: examples per kind; more on demand, as tests/io/test_fuzz_decoders.py
EXAMPLES = int(os.environ.get("STREAMSVI_FUZZ_EXAMPLES", "300"))
_spellings = st.sampled_from([(", ", ": "), (",", ":"), (" , ", " : ")])


@st.composite
def _payloads(draw, name):
    value = draw(_records[name])
    item, key = draw(_spellings)
    text = json.dumps(value, separators=(item, key), allow_nan=True).encode()
    return text + draw(st.sampled_from([b"", b"", b" ", b"]", b"}", b","]))


@pytest.mark.parametrize("name", NAMES)
def test_decode_many_is_none_or_exactly_one_by_one(name):
    codec, _, kind, good, _, _ = KINDS[name]
    plain = [p for p, _ in good[:3]]

    @settings(max_examples=EXAMPLES, derandomize=EXAMPLES <= 1000, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(msgs=st.lists(_payloads(name), min_size=1, max_size=5), at=st.integers(0, 3))
    def check(msgs, at):
        msgs = plain[:at] + msgs + plain[at:]
        many = codec.decode_many(msgs)
        parts = []
        for p in msgs:
            try:
                parts.append(codec.decode_rows(p))
            except DecodeError:
                assert many is None, p
                return
        assert many is None or _same(many, kind.concat(parts))

    check()


def test_the_fast_paths_convert_integers_beyond_2_53_as_float_does():
    lab = [b'{"x": [9007199254740993, 18446744073709551615, -9223372036854775808], "y": 1}',
           b'{"x": [1, 2, 3], "y": 18446744073709551615}']
    fast = LabelledJsonCodec(3)._decode_many_fast(lab)
    assert fast.tolist() == [[9007199254740992.0, 1.8446744073709552e19, -9.223372036854776e18, 1.0],
                             [1.0, 2.0, 3.0, 1.8446744073709552e19]]
    rat = [b'{"user": 18446744073709551615, "item": -5, "rating": 9007199254740993}']
    fast = RatingsJsonCodec()._decode_many_fast(rat)
    assert (fast.user.tolist(), fast.item.tolist(), fast.rating.tolist()) == \
        (["18446744073709551615"], ["-5"], [9007199254740992.0])
    # beyond 2**64 orjson reads an integer as a float: not an id (the one-by-one path says bad_id)
    assert RatingsJsonCodec()._decode_many_fast([b'{"user": 18446744073709551616, "item": 1, "rating": 1}']) is None
    with pytest.raises(DecodeError, match="bad_id"):
        RatingsJsonCodec().decode_rows(b'{"user": 18446744073709551616, "item": 1, "rating": 1}')
