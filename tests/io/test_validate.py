import numpy as np
import pytest

from streamsvi.io.dense import RecordValidator


def test_all_good_rows_pass_unchanged():
    x = np.arange(6.0).reshape(3, 2)
    good, bad = RecordValidator(2).validate(x)
    assert bad == [] and np.array_equal(good, x)


def test_each_reason_row_by_row():
    v = RecordValidator(3, max_abs=10.0)
    x = np.array([[1, 2, 3],
                  [np.nan, 0, 0],
                  [0, -np.inf, 0],
                  [0, 0, 10.5],
                  [-10, 10, 0],   # the limit itself is allowed
                  [np.nan, 0, 99]])  # first failing check wins
    good, bad = v.validate(x)
    assert good.tolist() == [[1, 2, 3], [-10, 10, 0]]
    assert [(i, r) for i, r, _ in bad] == [(1, "non_finite"), (2, "non_finite"),
                                           (3, "out_of_range"), (5, "non_finite")]
    msgs = {i: m for i, _, m in bad}
    assert "column 0" in msgs[1] and "nan" in msgs[1]
    assert "column 1" in msgs[2] and "-inf" in msgs[2]
    assert "column 2" in msgs[3] and "10.5" in msgs[3] and "max_abs=10.0" in msgs[3]
    # plain numbers for a person to read, not numpy reprs ("np.float64(nan)")
    assert msgs[1] == "value in column 0 is nan, expected a finite number"
    assert not any("np." in m for m in msgs.values()), msgs


def test_wrong_shape_rejects_every_row():
    good, bad = RecordValidator(2).validate(np.ones((3, 4)))
    assert good.shape == (0, 2)
    assert [(i, r) for i, r, _ in bad] == [(0, "wrong_shape"), (1, "wrong_shape"), (2, "wrong_shape")]
    assert "expected n_features=2" in bad[0][2]


def test_one_dimensional_input_is_one_record():
    good, bad = RecordValidator(2).validate([1.0, 2.0])
    assert good.tolist() == [[1.0, 2.0]] and bad == []
    good, bad = RecordValidator(2).validate([1.0, 2.0, 3.0])
    assert [(i, r) for i, r, _ in bad] == [(0, "wrong_shape")]


def test_size_limit():
    v = RecordValidator(2, max_message_bytes=10)
    assert v.check_size(b"x" * 10) is None
    reason, message = v.check_size(b"x" * 11)
    assert reason == "too_large" and "11 bytes" in message and "max_message_bytes=10" in message


@pytest.mark.parametrize("kwargs, match", [
    ({"n_features": 0}, "n_features must be"),
    ({"n_features": 2, "max_abs": 0}, "max_abs must be a positive number"),
    ({"n_features": 2, "max_abs": float("nan")}, "max_abs must be a positive number"),
    ({"n_features": 2, "max_abs": "big"}, "max_abs must be a positive number"),
    ({"n_features": 2, "max_message_bytes": 0}, "max_message_bytes must be"),
])
def test_settings_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RecordValidator(**kwargs)


def test_all_valid_agrees_with_validate():
    v = RecordValidator(2, max_abs=100.0)
    for x in (np.zeros((0, 2)), np.array([[1.0, -100.0]]), np.array([[1.0, np.nan]]),
              np.array([[np.inf, 0.0]]), np.array([[0.0, -100.5]]), np.ones((3, 3))):
        good, bad = v.validate(x)
        assert v.all_valid(x) == (not bad)
    assert not RecordValidator(1, max_abs=float("inf")).all_valid(np.array([[np.inf]]))
