"""The RecordKind seam: sources batch, reject and slice records of a non-dense kind."""
import json

import numpy as np
import pytest

from streamsvi.io.codecs import DecodeError
from streamsvi.io.dense import DenseKind
from streamsvi.io.records import KINDS, RecordKind, record_kind
from streamsvi.io.sources import FileSource, MemorySource


def _obj_array(items):
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


class _Ragged(RecordKind):
    """Test kind: records are non-empty lists of ints < 10, a 1-D object array per part."""

    name = "ragged-test"
    codec_names = ("json",)

    class Codec:
        rows_per_message = 1

        def decode_rows(self, payload):
            try:
                v = json.loads(payload)
            except ValueError:
                raise DecodeError("bad_json", "not JSON") from None
            if not isinstance(v, list) or not all(isinstance(i, int) for i in v):
                raise DecodeError("wrong_type", "expected a list of ints")
            return _obj_array([v])

        def decode_many(self, payloads):
            return None

        def encode_rows(self, part):
            (v,) = part
            return json.dumps(v).encode()

        def empty(self):
            return _obj_array([])

        def get_params(self):
            return {}

    class Validator:
        max_message_bytes = 100

        def check_size(self, payload):
            return ("too_large", "too long") if len(payload) > self.max_message_bytes else None

        def validate(self, part):
            bad = [(i, "empty", "no symbols") if not v else (i, "out_of_range", "id >= 10")
                   for i, v in enumerate(part) if not v or max(v) >= 10]
            keep = np.ones(len(part), bool)
            keep[[i for i, _, _ in bad]] = False
            return part[keep], bad

        def all_valid(self, part):
            return not self.validate(part)[1]

    def make_codec(self, name, model, options):
        return self.Codec()

    def make_validator(self, model, options):
        return self.Validator()

    def concat(self, parts):
        return _obj_array([v for p in parts for v in p])

    def to_json(self, part):
        return [list(v) for v in part]

    def from_json(self, values, model):
        return _obj_array(values)


def test_file_source_batches_and_dead_letters_a_non_dense_kind(tmp_path):
    kind = _Ragged()
    lines = ["[1, 2, 3]", "[]", "nope", "[4]", "[12, 1]", "[5, 6]", "[7]"]
    path = tmp_path / "seq.jsonl"
    path.write_text("\n".join(lines) + "\n")
    src = FileSource(path, codec=kind.Codec(), validator=kind.Validator(), kind=kind)
    b1 = src.poll_batch(2)
    assert kind.to_json(b1.x) == [[1, 2, 3], [4]]
    assert [(d.position.offset, d.reason) for d in b1.dead] == [(1, "empty"), (2, "bad_json")]
    b2 = src.poll_batch(10)
    assert kind.to_json(b2.x) == [[5, 6], [7]]
    assert [(d.position.offset, d.reason, d.payload) for d in b2.dead] == [(4, "out_of_range", b"[12, 1]")]
    assert b2.next_offsets == {(str(path), 0): 7}
    assert src.poll_batch(10) is None


def test_all_rejected_batch_is_an_empty_part_of_the_kind(tmp_path):
    kind = _Ragged()
    path = tmp_path / "bad.jsonl"
    path.write_text("[]\n[99]\n")
    b = FileSource(path, codec=kind.Codec(), validator=kind.Validator(), kind=kind).poll_batch(5)
    assert b.n_rows == 0 and b.x.dtype == object and len(b.dead) == 2


def test_memory_source_with_a_kind_writes_json_payloads():
    kind = _Ragged()
    src = MemorySource(_obj_array([[1], [], [2, 3]]), validator=kind.Validator(), kind=kind)
    b = src.poll_batch(10)
    assert kind.to_json(b.x) == [[1], [2, 3]]
    assert [(d.position.offset, d.payload) for d in b.dead] == [(1, b"[]")]


def test_non_dense_sources_need_a_validator(tmp_path):
    kind = _Ragged()
    with pytest.raises(ValueError, match="needs a validator"):
        MemorySource(_obj_array([[1]]), kind=kind)
    (tmp_path / "a.jsonl").write_text("[1]\n")
    with pytest.raises(ValueError, match="needs a codec and a validator"):
        FileSource(tmp_path / "a.jsonl", codec=kind.Codec(), kind=kind)


def test_record_kind_of_a_model_defaults_to_dense_and_rejects_unknown_names():
    from streamsvi.models import BayesianGMM

    assert isinstance(record_kind(BayesianGMM(n_components=2, n_features=3)), DenseKind)

    class Odd:
        name, record_kind = "odd", "no-such-kind"

    with pytest.raises(ValueError, match="unknown record kind 'no-such-kind'"):
        record_kind(Odd())
    assert "dense" in KINDS


def test_dense_kind_json_round_trip():
    from streamsvi.models import BayesianGMM

    kind, model = KINDS["dense"], BayesianGMM(n_components=2, n_features=3)
    x = np.arange(12.0).reshape(4, 3)
    back = kind.from_json(kind.to_json(x), model)
    assert np.array_equal(back, x) and kind.n_records(kind.empty(model)) == 0
