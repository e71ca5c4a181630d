"""One rule for integer fields in every record kind (issue 30, item 11).

Before, bag-of-words JSON accepted the word id ``3.0`` and labelled JSON the
label ``1.0``, while sequences refused the symbol ``1.0`` as ``not_integer``:
one rule, three answers. Now every integer field (word ids, symbols, labels)
follows :func:`streamsvi.io.codecs.json_integer`: a JSON integer or an
integral finite number is that integer, anything else is refused with the
kind's reason; range checks come after.
"""
import pytest

from streamsvi.io.bow import BowJsonCodec, BowValidator
from streamsvi.io.codecs import DecodeError
from streamsvi.io.labelled import LabelledJsonCodec, LabelledValidator
from streamsvi.io.sequences import SequenceJsonCodec


def _bow(v):
    return BowJsonCodec(10).decode_rows(f'{{"ids": [{v}]}}'.encode()).indices.tolist()


def _seq(v):
    return SequenceJsonCodec().decode_rows(f"[0, {v}]".encode()).symbols.tolist()[1:]


def _label(v):
    row = LabelledJsonCodec(2).decode_rows(f'{{"x": [0.5, 1.5], "y": {v}}}'.encode())
    good, bad = LabelledValidator(2, n_classes=4).validate(row)
    if bad:
        raise DecodeError(bad[0][1], bad[0][2])
    return [int(good[0, -1])]


FIELDS = {"word id": (_bow, "not_integer"), "symbol": (_seq, "not_integer"), "label": (_label, "bad_label")}


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("text", ["3", "3.0", "3e0", "30e-1"])
def test_an_integral_number_is_that_integer_in_every_kind(field, text):
    decode, _ = FIELDS[field]
    assert decode(text) == [3]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("text", ["3.5", '"3"', "true", "null", "NaN", "Infinity", "[3]", "{}"])
def test_anything_else_is_refused_with_the_kinds_reason_in_every_kind(field, text):
    decode, reason = FIELDS[field]
    with pytest.raises(DecodeError) as info:
        decode(text)
    expected = {"[3]": "wrong_shape"}.get(text, reason) if field == "symbol" else reason
    assert info.value.reason == expected, info.value


def test_the_range_checks_come_after_the_rule():
    with pytest.raises(DecodeError, match="id_out_of_range"):
        _bow("1e300")
    with pytest.raises(DecodeError, match="out_of_range"):
        _seq("1e300")
    with pytest.raises(DecodeError, match="bad_label"):
        _label("1e300")
    good, bad = BowValidator(10).validate(BowJsonCodec(10).decode_rows(b'{"ids": [12.0]}'))
    assert bad[0][1] == "id_out_of_range"
