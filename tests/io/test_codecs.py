import json
import struct

import numpy as np
import pytest

from streamsvi.io.codecs import (BinaryBatchCodec, CsvCodec, DecodeError, JsonCodec,
                                 codec_from_config)


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


def test_binary_reads_either_dtype_and_empty_batches():
    msg32 = BinaryBatchCodec(2, dtype="float32").encode(np.ones((3, 2)))
    assert BinaryBatchCodec(2).decode(msg32).tolist() == [[1.0, 1.0]] * 3
    assert BinaryBatchCodec(2).decode(BinaryBatchCodec(2).encode(np.empty((0, 2)))).shape == (0, 2)


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
