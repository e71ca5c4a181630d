import json

import numpy as np
import pytest

from streamsvi.io.deadletter import FileDeadLetterSink, MemoryDeadLetterSink
from streamsvi.io.dense import JsonCodec, RecordValidator
from streamsvi.io.sources import Batch, DeadLetter, FileSource, MemorySource, Position, SourceError


def write_lines(path, lines):
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


@pytest.fixture
def jsonl(tmp_path):
    """25 lines: rows [i, -i] for good lines, 5 bad lines, 1 blank line."""
    lines, expected_good, expected_bad = [], [], {}
    for i in range(25):
        if i == 3:
            lines.append(b"{oops"); expected_bad[i] = "json_invalid"
        elif i == 7:
            lines.append(b"[1, 2, 3]"); expected_bad[i] = "wrong_shape"
        elif i == 11:
            lines.append(b"[NaN, 1]"); expected_bad[i] = "non_finite"
        elif i == 12:
            lines.append(b"")  # blank: skipped, not a dead letter
        elif i == 15:
            lines.append(b"[1e300, 1]"); expected_bad[i] = "out_of_range"
        elif i == 20:
            lines.append(b'["a", 1]'); expected_bad[i] = "not_numeric"
        else:
            lines.append(json.dumps([float(i), float(-i)]).encode()); expected_good.append(i)
    return write_lines(tmp_path / "data.jsonl", lines), expected_good, expected_bad


def test_file_batches_offsets_and_dead_letters(jsonl, tmp_path):
    path, good, bad = jsonl
    src = FileSource(path, n_features=2, validator=RecordValidator(2, max_abs=1e6))
    sink = FileDeadLetterSink(tmp_path / "dlq" / "dead.jsonl")
    seen, batches = [], []
    while (batch := src.poll_batch(max_records=6)) is not None:
        assert isinstance(batch, Batch) and batch.x.dtype == np.float64
        batches.append(batch)
        seen.extend(batch.x[:, 0].astype(int).tolist())
        sink.send_many(batch.dead)
    sink.flush()
    assert seen == good  # every good line once, in order, nothing bad
    assert len(good) == 19 and [b.n_rows for b in batches] == [6, 6, 6, 1]
    # next_offsets: line number after the last line consumed; contiguous batches.
    ends = [b.next_offsets[(str(path), 0)] for b in batches]
    assert ends[-1] == 25 and ends == sorted(ends)
    assert sum(b.n_messages for b in batches) == 24  # the blank line is not a message
    first = batches[0]
    assert first.next_offsets == {(str(path), 0): 7}  # lines 0..6 hold 6 good rows (line 3 is bad)
    dead = [d for b in batches for d in b.dead]
    assert {d.position.offset: d.reason for d in dead} == bad
    assert all(d.position == Position(str(path), 0, d.position.offset) for d in dead)
    assert src.exhausted() and src.lag() == {(str(path), 0): 0}
    # The sink wrote one JSON line per dead letter with the raw payload.
    records = [json.loads(line) for line in (tmp_path / "dlq" / "dead.jsonl").read_text().splitlines()]
    assert [(r["offset"], r["reason"]) for r in records] == sorted(bad.items())
    assert DeadLetter.from_json(records[0]).payload == b"{oops"
    assert records[0]["source"] == str(path) and records[0]["partition"] == 0
    assert sink.counts == {"json_invalid": 1, "wrong_shape": 1, "non_finite": 1,
                           "out_of_range": 1, "not_numeric": 1}
    sink.close()
    src.close()


def test_file_sink_appends_and_is_durable_after_flush(tmp_path):
    path = tmp_path / "dead.jsonl"
    d = DeadLetter(Position("t", 1, 5), "json_invalid", "bad", b"\x00\xff")
    with FileDeadLetterSink(path) as sink:
        sink.send(d)
        sink.flush()
        assert DeadLetter.from_json(path.read_text().splitlines()[0]) == d
    with FileDeadLetterSink(path) as sink:
        sink.send(d)
    assert len(path.read_text().splitlines()) == 2


def test_file_sink_fsyncs_only_what_was_written(tmp_path, monkeypatch):
    """Issue 25: a scale-out worker flushes its sink before every commit; an fsync of a file
    with nothing new was 11.7 % of its time. A flush with nothing written syncs nothing; one
    after a write syncs once (counted at ``os.fsync``, on the real file)."""
    import os

    from streamsvi.io import deadletter

    synced = []
    real = os.fsync
    monkeypatch.setattr(deadletter.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    path = tmp_path / "dead.jsonl"
    with FileDeadLetterSink(path) as sink:
        for _ in range(3):
            sink.flush()
        assert synced == []
        sink.send(DeadLetter(Position("t", 0, 1), "json_invalid", "bad", b"x"))
        sink.flush()
        sink.flush()
        assert len(synced) == 1
    assert len(synced) == 1 and len(path.read_text().splitlines()) == 1


def test_file_seek_forward_backward_and_lag(jsonl):
    path, good, _ = jsonl
    key = (str(path), 0)
    src = FileSource(path, n_features=2)
    assert src.lag() == {key: 25}
    src.seek({key: 16})
    assert src.lag() == {key: 9}
    b = src.poll_batch(3)
    assert b.x[:, 0].tolist() == [16, 17, 18] and b.next_offsets == {key: 19}
    src.seek({key: 2})  # backwards: reopen and skip
    b = src.poll_batch(2)
    assert b.x[:, 0].tolist() == [2, 4] and [d.position.offset for d in b.dead] == [3]
    assert b.next_offsets == {key: 5}
    src.seek({key: 1000})  # past the end: drained
    assert src.poll_batch(5) is None and src.exhausted()
    with pytest.raises(SourceError, match="only partition"):
        src.seek({("other", 0): 1})
    with pytest.raises(ValueError, match="integer >= 0"):
        src.seek({key: -1})
    src.close()


def test_file_blank_lines_at_the_end_are_covered(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [b"[1, 2]", b"", b"[3, 4]", b""])
    src = FileSource(path, n_features=2)
    b = src.poll_batch(10)
    assert b.n_rows == 2 and b.next_offsets == {(str(path), 0): 4} and b.n_messages == 2


def test_file_reads_lines_appended_later(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [b"[1, 2]"])
    src = FileSource(path, n_features=2)
    assert src.poll_batch(10).n_rows == 1 and src.poll_batch(10) is None and src.exhausted()
    with open(path, "ab") as f:
        f.write(b"[3, 4]\n")
    assert not src.exhausted()
    b = src.poll_batch(10)
    assert b.x.tolist() == [[3.0, 4.0]] and b.next_offsets == {(str(path), 0): 2}


def test_file_too_large_line(tmp_path):
    path = write_lines(tmp_path / "d.jsonl", [b"[1, 2]", b"[1," + b" " * 100 + b"2]"])
    b = FileSource(path, n_features=2, validator=RecordValidator(2, max_message_bytes=50)).poll_batch(10)
    assert b.n_rows == 1 and [(d.position.offset, d.reason) for d in b.dead] == [(1, "too_large")]


def test_csv_with_header_and_fields(tmp_path):
    path = write_lines(tmp_path / "d.csv", [b"id,b,a", b"r0,1.5,2", b"r1,x,3", b"r2,4,5,extra", b"r3,6,7"])
    src = FileSource(path, n_features=2, fmt="csv", has_header=True, fields=["a", "b"])
    b = src.poll_batch(10)
    assert b.x.tolist() == [[2.0, 1.5], [5.0, 4.0], [7.0, 6.0]]
    assert [(d.position.offset, d.reason) for d in b.dead] == [(2, "not_numeric")]
    assert b.next_offsets == {(str(path), 0): 5}
    src.seek({(str(path), 0): 0})  # before the first data line: clamps to line 1
    assert src.poll_batch(1).x.tolist() == [[2.0, 1.5]]


def test_csv_without_header(tmp_path):
    path = write_lines(tmp_path / "d.csv", [b"1,2", b"3", b"4,5"])
    b = FileSource(path, n_features=2, fmt="csv").poll_batch(10)
    assert b.x.tolist() == [[1.0, 2.0], [4.0, 5.0]]
    assert [(d.position.offset, d.reason) for d in b.dead] == [(1, "wrong_shape")]


@pytest.mark.parametrize("kwargs, match", [
    ({"fmt": "parquet", "n_features": 2}, "fmt must be one of"),
    ({"fmt": "jsonl", "n_features": 2, "has_header": True}, "has_header applies only"),
    ({"fmt": "csv", "n_features": 2, "fields": ["a", "b"]}, "set has_header=True"),
    ({"fmt": "csv", "n_features": 2, "has_header": True, "fields": ["a", "z"]}, r"no column\(s\) \['z'\]"),
    ({}, "needs n_features"),
    ({"n_features": 3, "codec": JsonCodec(2)}, "codec has n_features=2"),
    ({"n_features": 2, "validator": RecordValidator(3)}, "validator expects n_features=3"),
])
def test_file_settings_errors(tmp_path, kwargs, match):
    path = write_lines(tmp_path / "d.csv", [b"a,b", b"1,2"])
    with pytest.raises(ValueError, match=match):
        FileSource(path, **kwargs)


def test_file_missing_path_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        FileSource(tmp_path / "nope.jsonl", n_features=2)


# ---------------------------------------------------------------- memory
def test_memory_source_batches_seek_lag():
    X = np.arange(20.0).reshape(10, 2)
    X[4, 1] = np.inf
    src = MemorySource(X, name="m")
    b = src.poll_batch(4)
    assert b.x[:, 0].tolist() == [0, 2, 4, 6] and b.next_offsets == {("m", 0): 4}
    b = src.poll_batch(4)  # row 4 rejected, so the batch reads one row more to fill up
    assert b.x[:, 0].tolist() == [10, 12, 14, 16] and b.next_offsets == {("m", 0): 9}
    assert [(d.position.offset, d.reason, json.loads(d.payload)[0]) for d in b.dead] == [(4, "non_finite", 8.0)]
    assert b.n_messages == 5 and src.lag() == {("m", 0): 1} and not src.exhausted()
    b.x[0, 0] = -1.0
    assert X[5, 0] == 10.0  # the batch owns its array
    assert src.poll_batch(4).n_rows == 1 and src.exhausted() and src.poll_batch(4) is None
    src.seek({("m", 0): 8})
    assert src.poll_batch(100).x[:, 0].tolist() == [16, 18]


def test_batch_of_only_dead_letters_still_advances():
    src = MemorySource(np.full((3, 2), np.nan))
    b = src.poll_batch(10)
    assert b.x.shape == (0, 2) and len(b.dead) == 3 and b.next_offsets == {("memory", 0): 3}
    sink = MemoryDeadLetterSink()
    sink.send_many(b.dead)
    assert sink.counts == {"non_finite": 3} and sink.total == 3


@pytest.mark.parametrize("args, match", [((0, 1.0), "max_records"), ((5, -1), "max_wait_s"),
                                         ((5, float("inf")), "max_wait_s")])
def test_poll_argument_errors(args, match):
    with pytest.raises(ValueError, match=match):
        MemorySource(np.ones((2, 2))).poll_batch(*args)
