""":class:`FileSource`: JSONL or CSV records from a file, one line per record.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..codecs import Codec
from ..dense import CsvCodec, DenseKind, JsonCodec, RecordValidator
from ..records import RecordKind
from .base import (Batch, Offsets, Source, SourceError, _BatchBuilder, _check_offsets, _check_poll_args,
                   _DENSE)

class FileSource(Source):
    """Replay a JSON-lines or CSV file with the same batching as Kafka.

    The offset of a record is its 0-based line number (a CSV header is line
    0), so ``seek`` and checkpoints work as with Kafka. Blank lines are
    skipped. Reading stops at the end of the file (:meth:`poll_batch`
    returns None); lines appended later are read by later polls.

    Parameters
    ----------
    path : str or Path
        The file.
    n_features : int, optional
        D. Needed unless ``codec`` is given.
    fmt : {"jsonl", "csv"}
        ``"jsonl"``: one JSON record per line, decoded by ``codec`` (default
        ``JsonCodec(n_features, fields)``). ``"csv"``: one record per line.
    codec : Codec, optional
        The line codec (a :class:`JsonCodec` for jsonl, :class:`CsvCodec` for csv).
    validator : RecordValidator, optional
        Default ``RecordValidator(D)``; ``max_message_bytes`` limits the line length.
    has_header : bool
        CSV only: line 0 is a header.
    fields : sequence of str, optional
        JSON object fields, or CSV header columns (needs ``has_header``), that
        make up a record, in order.
    name : str, optional
        The source name in positions and offsets. Default: ``str(path)``.
    kind : RecordKind, optional
        The record kind of ``codec`` (default dense rows); other kinds need
        their own ``codec`` and ``validator``, one record per line.
    """

    FORMATS = ("jsonl", "csv")

    def __init__(self, path, n_features: int | None = None, fmt: str = "jsonl",
                 codec: Codec | None = None, validator: RecordValidator | None = None,
                 has_header: bool = False, fields: Sequence[str] | None = None,
                 name: str | None = None, kind: RecordKind | None = None):
        self.kind = kind or _DENSE
        if not isinstance(self.kind, DenseKind):
            if codec is None or validator is None:
                raise ValueError(f"FileSource with {self.kind.name!r} records needs a codec "
                                 f"and a validator")
            if fmt != "jsonl":
                raise ValueError(f"{self.kind.name!r} records are read from jsonl files, not {fmt!r}")
        if fmt not in self.FORMATS:
            raise ValueError(f"fmt must be one of {self.FORMATS}, got {fmt!r}")
        if fmt == "jsonl" and has_header:
            raise ValueError("has_header applies only to fmt='csv'")
        if codec is None and n_features is None:
            raise ValueError("FileSource needs n_features (or a codec)")
        if codec is not None and n_features is not None \
                and getattr(codec, "n_features", n_features) != n_features:
            raise ValueError(f"codec has n_features={codec.n_features}, but n_features={n_features}")
        if codec is not None and fields is not None:
            raise ValueError("give fields to the codec or to FileSource, not both")
        self.path = Path(path)
        self.name = os.fspath(path) if name is None else name
        self.fmt, self.has_header = fmt, bool(has_header)
        self._f = open(self.path, "rb")
        self._line = 0
        self._header: list[str] | None = None
        self._line_count: tuple[int, int] | None = None  # (file size, lines) cache for lag()
        try:
            if fmt == "csv":
                if has_header:
                    self._header = CsvCodec(1).split(self._f.readline().rstrip(b"\r\n"))
                    self._line = 1
                if codec is None:
                    codec = CsvCodec(n_features, columns=self._columns(fields, n_features))
                elif not isinstance(codec, CsvCodec):
                    raise ValueError(f"fmt='csv' needs a CsvCodec, got {type(codec).__name__}")
            elif codec is None:
                codec = JsonCodec(n_features, fields=fields)
        except Exception:
            self._f.close()
            raise
        self.codec = codec
        self.n_features = getattr(codec, "n_features", None)
        self.validator = validator or RecordValidator(self.n_features)
        if getattr(self.validator, "n_features", None) != self.n_features:
            self._f.close()
            raise ValueError(f"validator expects n_features={self.validator.n_features}, "
                             f"codec has {self.n_features}")
        self._first_line = self._line

    def _columns(self, fields, n_features):
        if fields is None:
            return None
        if self._header is None:
            raise ValueError("fields for fmt='csv' name header columns; set has_header=True")
        missing = [f for f in fields if f not in self._header]
        if missing:
            raise ValueError(f"CSV header of {self.name} has no column(s) {missing}; "
                             f"header is {self._header}")
        return [self._header.index(f) for f in fields]

    def poll_batch(self, max_records: int, max_wait_s: float = 0.0) -> Batch | None:
        """Up to ``max_records`` rows from the next lines (``max_wait_s`` is not used)."""
        _check_poll_args(max_records, max_wait_s)
        b = _BatchBuilder(self.codec, self.validator, self.n_features, self.kind)
        at_end = False
        while b.n_rows < max_records and not at_end:
            chunk = []
            while len(chunk) < max_records - b.n_rows:
                raw = self._f.readline()
                if not raw:
                    at_end = True
                    break
                self._line += 1
                line = raw.rstrip(b"\r\n")
                if line.strip():
                    chunk.append((self.name, 0, self._line - 1, line))
            b.add_messages(chunk)
        batch = b.batch()
        if batch is not None:
            batch.next_offsets[(self.name, 0)] = self._line  # also past skipped blank lines
        return batch

    def seek(self, offsets):
        for key, off in _check_offsets(offsets).items():
            if key != (self.name, 0):
                raise SourceError(f"FileSource {self.name!r} cannot seek to {key}: "
                                  f"its only partition is ({self.name!r}, 0)")
            off = max(off, self._first_line)
            if off < self._line:
                self._f.seek(0)
                self._line = 0
                for _ in range(self._first_line):
                    self._f.readline()
                    self._line += 1
            while self._line < off and self._f.readline():
                self._line += 1

    def _count_lines(self) -> int:
        size = os.fstat(self._f.fileno()).st_size
        if self._line_count is None or self._line_count[0] != size:
            n, last = 0, b"\n"
            with open(self.path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    n += chunk.count(b"\n")
                    last = chunk[-1:]
            self._line_count = (size, n + (last != b"\n"))
        return self._line_count[1]

    def lag(self) -> Offsets:
        """Lines left to read (blank lines included)."""
        return {(self.name, 0): max(self._count_lines() - self._line, 0)}

    def exhausted(self) -> bool:
        return self._f.closed or self._f.peek(1) == b""

    def close(self):
        self._f.close()
