"""The ``"sequences"`` record kind: variable-length symbol sequences (the discrete HMM).

A decoded part is a :class:`streamsvi.sequence_batch.Sequences` (all symbols
concatenated, plus offsets); a record is one sequence.

Message layouts
---------------
* ``json`` (:class:`SequenceJsonCodec`) — one sequence per message: a JSON
  array of integer symbol ids, ``[0, 3, 1]``, or an object holding it under
  ``"symbols"`` (or the key named by the config's ``source.fields = ["key"]``):
  ``{"symbols": [0, 3, 1], "id": "read-17"}``.
* ``binary`` (:class:`SequenceBinaryCodec`) — a whole minibatch per message,
  little-endian, no pickle::

      offset  size      field
      0       4         magic b"SSVQ"
      4       1         format version (1)
      5       1         dtype code of the symbols: 1 = int32
      6       2         reserved, must be 0
      8       4         n_sequences (uint32)
      12      4         n_symbols_total (uint32)
      16      4 n       the length of each sequence (uint32)
      16+4n   4 m       all symbols, sequence after sequence (int32)

  The lengths must sum to ``n_symbols_total`` and the message must be exactly
  ``16 + 4 (n + m)`` bytes long.

Reason codes
------------
Decoding (:class:`~streamsvi.io.codecs.DecodeError`): ``json_invalid``,
``wrong_shape`` (not an array / object, nested arrays, lengths that do not add
up), ``missing_field``, ``not_integer`` (a fractional or non-finite number, string,
bool or null symbol; ``3.0`` is 3, the rule of :func:`~streamsvi.io.codecs.json_integer`),
``out_of_range`` (an integer beyond int64), ``truncated``, ``trailing_data``,
``bad_header``, ``bad_version``, ``bad_dtype``, ``empty_batch`` (a binary
message of no sequences).

Validation (:class:`SequenceValidator`, per sequence, so one bad sequence in a
binary batch rejects only itself): ``too_large`` (message bytes),
``empty_sequence``, ``bad_symbol`` (outside 0..V−1, V = the model's
``n_symbols``), ``too_long`` (more than ``max_sequence_length`` symbols).

Examples
--------
>>> codec = SequenceJsonCodec()
>>> codec.decode_rows(b'{"symbols": [0, 3, 1]}').to_list()
[[0, 3, 1]]
>>> part = codec.decode_many([b"[1, 2]", b"[]", b"[0, 9]"])
>>> good, bad = SequenceValidator(n_symbols=4).validate(part)
>>> good.to_list(), [(i, reason) for i, reason, _ in bad]
([[1, 2]], [(1, 'empty_sequence'), (2, 'bad_symbol')])
>>> binary = SequenceBinaryCodec()
>>> binary.decode_rows(binary.encode_rows(part)).equals(part)
True
"""
from __future__ import annotations

import itertools
import json
import struct
from typing import Sequence

import numpy as np

from ..sequence_batch import Sequences
from .codecs import (DecodeError, check_binary_length, check_binary_rows, check_encodable_rows,
                     join_json_arrays, json_integer, load_json_message, parse_int_arrays, short_json,
                     unpack_binary_header)
from .records import RecordKind, register_kind
from .validate import check_message_size

try:  # optional, as in codecs.py and dense.py
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["SequenceJsonCodec", "SequenceBinaryCodec", "SequenceValidator", "SequencesKind"]

_INT64_MAX = 2 ** 63 - 1


def _empty() -> Sequences:
    return Sequences(np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64))


class SequenceJsonCodec:
    """One sequence per message as JSON (see the module docstring).

    Parameters
    ----------
    field : str
        The key of the symbol array in a JSON object (default ``"symbols"``).
    """

    name = "json"
    rows_per_message = 1

    def __init__(self, field: str = "symbols"):
        if not isinstance(field, str) or not field:
            raise ValueError(f"field must be a non-empty string, got {field!r}")
        self.field = field

    def get_params(self) -> dict:
        return {"field": self.field}

    def empty(self) -> Sequences:
        return _empty()

    def __repr__(self):
        return f"SequenceJsonCodec(field={self.field!r})"

    def decode(self, payload: bytes) -> np.ndarray:
        """One message -> the int64 symbols of its sequence."""
        obj = load_json_message(payload, fast=False)   # huge integers stay integers: out_of_range
        if isinstance(obj, dict):
            if self.field not in obj:
                raise DecodeError("missing_field", f"JSON object has no {self.field!r} array "
                                                   f"(keys: {sorted(obj)[:10]})")
            obj = obj[self.field]
        if not isinstance(obj, list):
            raise DecodeError("wrong_shape", f"expected a JSON array of symbol ids or an object, "
                                             f"got {type(obj).__name__} {short_json(obj)}")
        for i, v in enumerate(obj):
            if type(v) is not int:
                if isinstance(v, list):
                    raise DecodeError("wrong_shape", f"symbol {i} is an array; a sequence is a "
                                                     f"flat array of integers")
                iv = json_integer(v)                        # 3.0 is 3, as for word ids and labels
                if iv is None:
                    raise DecodeError("not_integer", f"symbol {i} must be an integer id, got "
                                                     f"{type(v).__name__} {short_json(v)}")
                obj[i] = v = iv
            if not -_INT64_MAX <= v <= _INT64_MAX:
                raise DecodeError("out_of_range", f"symbol {i} = {short_json(v)} does not fit in int64")
        return np.array(obj, dtype=np.int64)

    def decode_rows(self, payload: bytes) -> Sequences:
        s = self.decode(payload)
        return Sequences(s, np.array([0, s.size], dtype=np.int64))

    #: bytes of plain JSON integer arrays: digits, minus, brackets, commas, whitespace
    _ARRAY_BYTES = b"0123456789-[], \t\n\r"

    def decode_many(self, payloads: Sequence[bytes]) -> Sequences | None:
        """All sequences of many messages at once, or None.

        First without a JSON parser: when every message is a flat array of
        non-negative integers as ``json.dumps`` or a compact writer spells it,
        :func:`~streamsvi.io.codecs.parse_int_arrays` reads them all in numpy.
        Else with one JSON parse, by the argument of
        :meth:`streamsvi.io.dense.JsonCodec.decode_many`: the joined text holds
        only integers and arrays, every message ends with ``]`` and the parse
        gives exactly n flat integer arrays, so array i is message i. Anything
        else (objects, floats, a bad message) returns None and the caller
        decodes message by message.
        """
        n = len(payloads)
        if n == 0:
            return _empty()
        try:
            fast = parse_int_arrays(b";".join(payloads) + b";", n)
        except TypeError:                       # a None (tombstone) or str payload
            return None
        if fast is not None:
            return Sequences.from_lengths(*fast)
        blob = join_json_arrays(payloads, self._ARRAY_BYTES)
        if blob is None:
            return None
        try:
            obj = _orjson.loads(blob) if _orjson is not None else json.loads(blob)
        except (ValueError, RecursionError):
            return None
        if len(obj) != n or not all(type(o) is list for o in obj):
            return None
        seq_lens = np.fromiter(map(len, obj), dtype=np.int64, count=n)
        try:
            flat = np.fromiter(itertools.chain.from_iterable(obj), dtype=np.int64,
                               count=int(seq_lens.sum()))
        except (TypeError, ValueError, OverflowError):    # nested arrays, huge integers
            return None
        return Sequences.from_lengths(flat, seq_lens)

    def encode(self, seq) -> bytes:
        """One sequence (integers) as a JSON array."""
        arr = np.asarray(seq)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise ValueError(f"a sequence must be a flat array of integers, got {arr.dtype} {arr.shape}")
        return json.dumps(arr.tolist()).encode()

    def encode_rows(self, part: Sequences) -> bytes:
        if len(part) != 1:
            raise ValueError(f"SequenceJsonCodec carries one sequence per message, got {len(part)}")
        return self.encode(part[0])


class SequenceBinaryCodec:
    """A minibatch of sequences per message (layout in the module docstring)."""

    name = "binary"
    rows_per_message = None
    MAGIC = b"SSVQ"
    VERSION = 1
    HEADER = struct.Struct("<4sBBHII")

    def get_params(self) -> dict:
        return {}

    def empty(self) -> Sequences:
        return _empty()

    def __repr__(self):
        return "SequenceBinaryCodec()"

    def decode_rows(self, payload: bytes) -> Sequences:
        """Decode one message.

        Raises
        ------
        DecodeError
            ``truncated``, ``bad_header``, ``bad_version``, ``bad_dtype``,
            ``wrong_shape``, ``trailing_data`` or ``empty_batch``.
        """
        H = self.HEADER.size
        _, _, code, reserved, n, m = unpack_binary_header(payload, self.HEADER, self.MAGIC, self.VERSION)
        if code != 1:
            raise DecodeError("bad_dtype", f"binary symbol dtype code {code} is unknown (1 = int32)")
        if reserved != 0:
            raise DecodeError("bad_header", f"binary header reserved bytes must be 0, got {reserved}")
        expected = H + 4 * (n + m)
        check_binary_length(payload, expected, f"{n} sequences and {m} symbols")
        check_binary_rows(n, "sequences")
        lens = np.frombuffer(payload, dtype="<u4", count=n, offset=H).astype(np.int64)
        if int(lens.sum()) != m:
            raise DecodeError("wrong_shape", f"binary sequence lengths sum to {int(lens.sum())}, "
                                             f"the header announces {m} symbols")
        sym = np.frombuffer(payload, dtype="<i4", count=m, offset=H + 4 * n).astype(np.int64)
        return Sequences.from_lengths(sym, lens)

    def decode_many(self, payloads: Sequence[bytes]) -> Sequences | None:
        try:
            return Sequences.concat([self.decode_rows(p) for p in payloads])
        except (DecodeError, TypeError):
            return None

    def encode_rows(self, part) -> bytes:
        """Encode a :class:`Sequences` (or a list of integer sequences) as one message."""
        part = part if isinstance(part, Sequences) else Sequences.from_list(part)
        check_encodable_rows(len(part), "sequences")
        if part.symbols.size and (part.symbols.min() < -2 ** 31 or part.symbols.max() >= 2 ** 31):
            raise ValueError("symbols must fit in int32 for the binary layout")
        if len(part) >= 2 ** 32 or part.symbols.size >= 2 ** 32:
            raise ValueError("a binary message holds fewer than 2**32 sequences and symbols")
        head = self.HEADER.pack(self.MAGIC, self.VERSION, 1, 0, len(part), part.symbols.size)
        return (head + part.lengths.astype("<u4").tobytes()
                + part.symbols.astype("<i4").tobytes())


class SequenceValidator:
    """Per-sequence checks: non-empty, symbols in 0..V−1, at most ``max_sequence_length`` long.

    Parameters
    ----------
    n_symbols : int
        V, the alphabet size of the model.
    max_sequence_length : int
        Longest accepted sequence (guards the padded (T, n, K) work arrays of
        a minibatch against one runaway record).
    max_message_bytes : int
        Largest accepted raw message.
    """

    def __init__(self, n_symbols: int, max_sequence_length: int = 100_000,
                 max_message_bytes: int = 1_048_576):
        for name, v in (("n_symbols", n_symbols), ("max_sequence_length", max_sequence_length),
                        ("max_message_bytes", max_message_bytes)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.n_symbols = int(n_symbols)
        self.max_sequence_length = int(max_sequence_length)
        self.max_message_bytes = int(max_message_bytes)

    def get_params(self) -> dict:
        return {"n_symbols": self.n_symbols, "max_sequence_length": self.max_sequence_length,
                "max_message_bytes": self.max_message_bytes}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"SequenceValidator({args})"

    def check_size(self, payload: bytes) -> tuple[str, str] | None:
        return check_message_size(payload, self.max_message_bytes)

    def all_valid(self, part: Sequences) -> bool:
        """True if every sequence of ``part`` passes :meth:`validate` (a few reductions)."""
        if len(part) == 0:
            return True
        lens = part.lengths
        if lens.min() < 1 or lens.max() > self.max_sequence_length:
            return False
        s = part.symbols
        return bool(s.min() >= 0 and s.max() < self.n_symbols)

    def validate(self, part: Sequences):
        """(accepted sequences, [(index, reason, message), ...]), in the original order."""
        if self.all_valid(part):
            return part, []
        lens = part.lengths
        s = part.symbols
        bad_pos = (s < 0) | (s >= self.n_symbols)
        seq_of = np.repeat(np.arange(len(part)), lens)
        bad_seq = np.zeros(len(part), dtype=bool)
        bad_seq[seq_of[bad_pos]] = True
        rejected = []
        for i in range(len(part)):
            if lens[i] == 0:
                rejected.append((i, "empty_sequence", "sequence is empty; a sequence needs >= 1 symbol"))
            elif lens[i] > self.max_sequence_length:
                rejected.append((i, "too_long", f"sequence has {int(lens[i])} symbols, more than "
                                                f"max_sequence_length={self.max_sequence_length}"))
            elif bad_seq[i]:
                seq = part[i]
                j = int(np.flatnonzero((seq < 0) | (seq >= self.n_symbols))[0])
                rejected.append((i, "bad_symbol", f"symbol {j} is {int(seq[j])}, outside the "
                                                  f"alphabet 0..{self.n_symbols - 1} "
                                                  f"(n_symbols={self.n_symbols})"))
        ok = np.ones(len(part), dtype=bool)
        ok[[i for i, _, _ in rejected]] = False
        return part[ok], rejected


class SequencesKind(RecordKind):
    """Records that are symbol sequences (:class:`~streamsvi.sequence_batch.Sequences` parts).

    Examples
    --------
    >>> kind = SequencesKind()
    >>> part = kind.concat([Sequences.from_list([[0, 1]]), Sequences.from_list([[2], [3, 3]])])
    >>> kind.n_records(part), kind.to_json(kind.take(part, slice(1, 3)))
    (3, [[2], [3, 3]])
    """

    name = "sequences"
    codec_names = ("json", "binary")

    def n_fields(self, model) -> int:
        return 1                           # the key of the symbol array

    def make_codec(self, name, model, options):
        fields = options.get("fields")
        if name == "json":
            if fields is not None and len(fields) != 1:
                raise ValueError(f"sequence records take one field name (the symbol array's key), "
                                 f"got {list(fields)}")
            return SequenceJsonCodec(fields[0] if fields else "symbols")
        if name == "binary":
            if fields is not None:
                raise ValueError(f"fields={list(fields)} only applies to the 'json' codec")
            return SequenceBinaryCodec()
        raise ValueError(f"codec must be one of {list(self.codec_names)} for sequence records, got {name!r}")

    def make_validator(self, model, options):
        return SequenceValidator(model.n_symbols,
                                 max_sequence_length=options.get("max_sequence_length", 100_000),
                                 max_message_bytes=options.get("max_message_bytes", 1_048_576))

    def concat(self, parts):
        return Sequences.concat(list(parts))

    def empty(self, model):
        return _empty()

    def to_json(self, part):
        return part.to_list()

    def from_json(self, values, model):
        return Sequences.from_list(values) if len(values) else _empty()


register_kind(SequencesKind())
