"""The model's own check after a kind's validator (``ModelChecked``, reason ``model_check``)."""
import numpy as np

from streamsvi.io.dense import DenseKind, RecordValidator
from streamsvi.io.validate import ModelChecked, validate_safely


def _counts_only(x):
    x = np.asarray(x, dtype=np.float64)
    if not ((x >= 0) & (x == np.floor(x))).all():
        raise ValueError("counts must be integers >= 0")
    return x


def test_records_the_model_refuses_are_rejected_one_by_one_and_the_rest_kept():
    kind = DenseKind()
    v = ModelChecked(RecordValidator(2), _counts_only, kind)
    x = np.array([[1, 2], [np.nan, 1], [3, -1], [0.5, 1], [4, 4]], dtype=float)
    assert not v.all_valid(x)
    good, rejected = validate_safely(v, kind, x)
    assert good.tolist() == [[1, 2], [4, 4]]
    assert [(i, r) for i, r, _ in rejected] == [(1, "non_finite"), (2, "model_check"), (3, "model_check")]
    assert "integers >= 0" in rejected[1][2]


def test_a_batch_the_model_accepts_passes_untouched_and_the_kind_settings_show_through():
    kind = DenseKind()
    inner = RecordValidator(2, max_message_bytes=123)
    v = ModelChecked(inner, _counts_only, kind)
    x = np.array([[1, 2], [3, 4]], dtype=float)
    assert v.all_valid(x)
    good, rejected = v.validate(x)
    assert good is x and rejected == []
    assert v.max_message_bytes == 123 and v.check_size(b"x" * 200)[0] == "too_large"
