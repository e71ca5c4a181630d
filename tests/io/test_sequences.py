"""The "sequences" record kind: codecs, validator and kind, tested directly."""
import json
import struct

import numpy as np
import pytest

from streamsvi.io.codecs import DecodeError
from streamsvi.io.records import KINDS, record_kind
from streamsvi.io.sequences import (SequenceBinaryCodec, SequenceJsonCodec, SequencesKind,
                                    SequenceValidator)
from streamsvi.models import DiscreteHMM
from streamsvi.sequence_batch import Sequences


def _reason(fn, payload):
    with pytest.raises(DecodeError) as exc:
        fn(payload)
    return exc.value.reason


# ------------------------------------------------------------------ Sequences
def test_sequences_indexing_matches_python_lists():
    rng = np.random.default_rng(0)
    lists = [rng.integers(0, 5, size=rng.integers(0, 7)).tolist() for _ in range(40)]
    s = Sequences.from_list(lists)
    assert s.shape == (40,) and len(s) == 40 and s.to_list() == lists
    idx = rng.integers(0, 40, size=25)                       # with repeats, unsorted
    assert s[idx].to_list() == [lists[i] for i in idx]
    assert s[-3:].to_list() == lists[-3:] and s[::3].to_list() == lists[::3]
    assert s[5:2].to_list() == []
    mask = rng.uniform(size=40) < 0.5
    assert s[mask].to_list() == [lst for lst, m in zip(lists, mask) if m]
    assert s[-1].tolist() == lists[-1]
    assert Sequences.concat([s[:10], s[10:]]).equals(s)
    with pytest.raises(IndexError, match="out of range"):
        s[np.array([40])]
    with pytest.raises(ValueError, match="offsets must start at 0"):
        Sequences([1, 2], [0, 1])


# ------------------------------------------------------------------ JSON codec
def test_json_codec_decodes_arrays_and_objects():
    c = SequenceJsonCodec()
    assert c.decode_rows(b"[0, 3, 1]").to_list() == [[0, 3, 1]]
    assert c.decode_rows(b'{"symbols": [2, 2], "id": "a"}').to_list() == [[2, 2]]
    assert SequenceJsonCodec("seq").decode_rows(b'{"seq": [1]}').to_list() == [[1]]
    assert c.decode_rows(b"[]").to_list() == [[]]            # empty: the validator rejects it
    assert c.decode_rows(c.encode_rows(Sequences.from_list([[4, 0, 1]]))).to_list() == [[4, 0, 1]]


@pytest.mark.parametrize("payload,reason", [
    (b"[0, 1", "json_invalid"), (b"\xff\xfe", "json_invalid"),
    (b"3", "wrong_shape"), (b'"abc"', "wrong_shape"), (b"[[0, 1]]", "wrong_shape"),
    (b'{"x": [1]}', "missing_field"),
    (b"[0, 1.5]", "not_integer"), (b"[0, NaN]", "not_integer"), (b"[true]", "not_integer"),
    (b'[0, "a"]', "not_integer"), (b"[null]", "not_integer"),
    (b"[99999999999999999999999]", "out_of_range"),
])
def test_json_codec_reason_codes(payload, reason):
    assert _reason(SequenceJsonCodec().decode_rows, payload) == reason


def test_json_decode_many_equals_one_by_one():
    c = SequenceJsonCodec()
    rng = np.random.default_rng(1)
    msgs = [json.dumps(rng.integers(-2, 9, size=rng.integers(0, 6)).tolist()).encode() for _ in range(50)]
    fast = c.decode_many(msgs)
    slow = Sequences.concat([c.decode_rows(m) for m in msgs])
    assert fast is not None and fast.equals(slow)
    # anything the fast path cannot prove falls back (None), never a wrong answer
    for bad in ([b"[1]", b'{"symbols": [1]}'], [b"[1]", b"[1.5]"], [b"[1]", b"[[1]]"],
                [b"[1", b"2]"], [b"[1]", b"[1],[2]"], [b"[1]", b"[1] "], [b"[1]", None]):
        assert c.decode_many(bad) is None
    assert len(c.decode_many([])) == 0


# ---------------------------------------------------------------- binary codec
def test_binary_round_trip_and_layout():
    c = SequenceBinaryCodec()
    s = Sequences.from_list([[0, 3, 1], [], [2], [1, 1, 1, 1]])
    msg = c.encode_rows(s)
    assert msg[:4] == b"SSVQ" and len(msg) == 16 + 4 * (4 + 8)
    assert struct.unpack_from("<II", msg, 8) == (4, 8)
    assert c.decode_rows(msg).equals(s)
    assert c.decode_many([msg, msg]).equals(Sequences.concat([s, s]))
    assert c.decode_many([msg, b"junk"]) is None


def test_binary_reason_codes():
    c = SequenceBinaryCodec()
    msg = c.encode_rows(Sequences.from_list([[0, 1], [2]]))
    assert _reason(c.decode_rows, msg[:10]) == "truncated"
    assert _reason(c.decode_rows, msg[:-1]) == "truncated"
    assert _reason(c.decode_rows, msg + b"\0") == "trailing_data"
    assert _reason(c.decode_rows, b"XXXX" + msg[4:]) == "bad_header"
    assert _reason(c.decode_rows, msg[:4] + b"\x02" + msg[5:]) == "bad_version"
    assert _reason(c.decode_rows, msg[:5] + b"\x07" + msg[6:]) == "bad_dtype"
    assert _reason(c.decode_rows, msg[:6] + b"\x01\x00" + msg[8:]) == "bad_header"
    # lengths 2 + 2 != 3 symbols announced
    bad_lens = msg[:16] + struct.pack("<II", 2, 2) + msg[24:]
    assert _reason(c.decode_rows, bad_lens) == "wrong_shape"


# ------------------------------------------------------------------- validator
def test_validator_rejects_per_sequence_with_reasons():
    v = SequenceValidator(n_symbols=4, max_sequence_length=5, max_message_bytes=100)
    part = Sequences.from_list([[0, 1], [], [3, 4], [1, -1], [0] * 6, [3, 3, 3]])
    assert not v.all_valid(part)
    good, bad = v.validate(part)
    assert good.to_list() == [[0, 1], [3, 3, 3]]
    assert [(i, r) for i, r, _ in bad] == [(1, "empty_sequence"), (2, "bad_symbol"),
                                          (3, "bad_symbol"), (4, "too_long")]
    assert "symbol 1 is 4, outside the alphabet 0..3" in bad[1][2]
    assert v.all_valid(good) and v.validate(good)[1] == []
    assert v.check_size(b"x" * 101)[0] == "too_large" and v.check_size(b"x" * 100) is None
    with pytest.raises(ValueError, match="n_symbols must be an integer >= 1, got 0"):
        SequenceValidator(0)


def test_validated_records_are_what_the_model_accepts():
    """Everything the validator lets through passes the model's check_batch, and vice versa."""
    model = DiscreteHMM(2, 3)
    kind = record_kind(model)
    v = kind.make_validator(model, {})
    rng = np.random.default_rng(2)
    part = Sequences.from_list([rng.integers(-1, 4, size=rng.integers(0, 4)) for _ in range(200)])
    good, bad = v.validate(part)
    assert len(good) + len(bad) == 200 and len(bad) > 0
    model.check_batch(good)
    for i, _, _ in bad:
        with pytest.raises(ValueError):
            model.check_batch(part[[i]])


# ------------------------------------------------------------------------ kind
def test_kind_is_registered_and_round_trips_json():
    model = DiscreteHMM(3, 5)
    kind = record_kind(model)
    assert isinstance(kind, SequencesKind) and KINDS["sequences"] is kind
    part = Sequences.from_list([[0, 4], [2], [1, 1, 3]])
    assert kind.n_records(part) == 3
    assert kind.take(part, np.array([2, 0])).to_list() == [[1, 1, 3], [0, 4]]
    back = kind.from_json(json.loads(json.dumps(kind.to_json(part))), model)
    assert back.equals(part)
    assert kind.n_records(kind.empty(model)) == 0
    assert kind.concat([kind.empty(model), part]).equals(part)
    assert isinstance(kind.make_codec("json", model, {}), SequenceJsonCodec)
    assert kind.make_codec("json", model, {"fields": ["seq"]}).field == "seq"
    assert isinstance(kind.make_codec("binary", model, {}), SequenceBinaryCodec)
    with pytest.raises(ValueError, match="codec must be one of"):
        kind.make_codec("csv", model, {})
    v = kind.make_validator(model, {"max_sequence_length": 7, "max_message_bytes": 99})
    assert (v.n_symbols, v.max_sequence_length, v.max_message_bytes) == (5, 7, 99)


# ---------------------------------------------------------- through the sources
def test_file_source_batches_sequences_and_dead_letters_bad_ones(tmp_path):
    model = DiscreteHMM(2, 4)
    kind = record_kind(model)
    lines = ["[0, 1, 2]", "[]", "[0, 4]", '{"symbols": [3, 3]}', "[1.5]", "nope", "[2]"]
    path = tmp_path / "seq.jsonl"
    path.write_text("\n".join(lines) + "\n")
    from streamsvi.io.sources import FileSource, MemorySource

    src = FileSource(path, codec=kind.make_codec("json", model, {}),
                     validator=kind.make_validator(model, {}), kind=kind)
    b = src.poll_batch(10)
    assert isinstance(b.x, Sequences) and b.x.to_list() == [[0, 1, 2], [3, 3], [2]]
    assert [(d.position.offset, d.reason) for d in b.dead] == [
        (1, "empty_sequence"), (2, "bad_symbol"), (4, "not_integer"), (5, "json_invalid")]
    model.check_batch(b.x)
    assert src.poll_batch(10) is None
    mem = MemorySource(Sequences.from_list([[1], [], [3, 9]]), validator=kind.make_validator(model, {}),
                       kind=kind)
    b = mem.poll_batch(10)
    assert b.x.to_list() == [[1]] and [(d.position.offset, d.payload) for d in b.dead] == [
        (1, b"[]"), (2, b"[3, 9]")]


def test_daemon_learns_an_hmm_from_a_file_of_sequences(tmp_path):
    """End to end: config kind = "hmm", a JSONL file source, dead letters, snapshot, streamsvi.load."""
    import io

    import streamsvi
    from streamsvi.models.hmm import sample_hmm
    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon

    rng = np.random.default_rng(3)
    x, _ = sample_hmm([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]],
                      rng.integers(3, 20, size=400), rng)
    lines = [json.dumps(s) for s in x.to_list()]
    lines[10], lines[20] = "[0, 7]", "[]"                        # two bad records
    data = tmp_path / "seqs.jsonl"
    data.write_text("\n".join(lines) + "\n")
    dead = tmp_path / "dead.jsonl"
    cfg = validate({
        "model": {"kind": "hmm", "n_components": 2, "n_symbols": 3, "predictive_draws": 20},
        "inference": {"n_total": "auto", "batch_size": 50, "effective_batch_size": 20,
                      "tau0": 10.0, "kappa": 0.6},
        "source": {"kind": "file", "path": str(data), "dead_letter_path": str(dead)},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 3},
        "metrics": {"enabled": False, "heldout_size": 20, "heldout_every": 2, "progress_seconds": 0.0},
    })
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained"
    assert sorted(json.loads(d)["reason"] for d in dead.read_text().splitlines()) == \
        ["bad_symbol", "empty_sequence"]
    fitted = streamsvi.load(tmp_path / "ck")
    assert fitted.records_seen == 400 - 2 - 20
    _, A, B = fitted.mean_params()
    # one pass of 8 updates: the two states have separated (truth: B rows 0.8 on symbol 0 / 2)
    k = np.argsort(B[:, 0])
    assert B[k[1], 0] > 0.6 and B[k[0], 2] > 0.6 and np.all(np.diag(A) > 0.6), (A, B)
    assert len(fitted.viterbi(x[:3])) == 3
    # `streamsvi score` on JSON lines of sequences: one output line per input line
    from streamsvi.cli import main

    (tmp_path / "in.jsonl").write_text("[0, 0, 2]\n[5]\n[2, 2]\n")
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 1      # some lines failed
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert out[1]["error"].startswith("bad_symbol") and len(out[0]["viterbi"]) == 3
    assert out[2]["log_likelihood"] == pytest.approx(fitted.log_likelihood([[2, 2]])[0])
