"""The "dense" record kind: fixed-length numeric records (the Gaussian mixtures).

A decoded part is a float64 array of shape ``(n, D)``. Everything about these
records is here: the codecs, the validator and :class:`DenseKind`, which
registers itself as ``"dense"`` in :data:`streamsvi.io.records.KINDS` (the
default kind of a model without a ``record_kind`` attribute).

Codecs (bytes of one message, or one file line, <-> float64 rows):

* :class:`JsonCodec` (``"json"``) — one record per message, a JSON array of D
  numbers or a JSON object.
* :class:`BinaryBatchCodec` (``"binary"``) — one message carries a whole
  minibatch as a typed little-endian array behind a fixed 16-byte header (no
  pickle).
* :class:`CsvCodec` — one CSV line; :class:`~streamsvi.io.sources.FileSource`
  uses it for ``fmt="csv"``.

They raise :class:`~streamsvi.io.codecs.DecodeError` with the reason codes
listed in :mod:`streamsvi.io.codecs`. Sources decode a whole fetch at once
with :meth:`~streamsvi.io.codecs.Codec.decode_many` (for JSON: one parse of
all messages, with orjson when it is installed) and fall back to decoding
message by message only when that fails, to find the bad messages and their
reasons.

Validation (:class:`RecordValidator`): a record that fails a check never
reaches the model; the source turns it into a dead letter with the reason
code (docs/design.md, "Record kinds"). Checks and their reason codes:

``too_large``     the raw message is longer than ``max_message_bytes``
``wrong_shape``   a row does not have n_features values
``non_finite``    a value is NaN or ±inf
``out_of_range``  |value| > ``max_abs``

Rows are judged one by one: in a binary minibatch message a bad row rejects
only that row.

Examples
--------
>>> codec = JsonCodec(2)
>>> codec.decode(b"[1.5, -2]").tolist()
[1.5, -2.0]
>>> JsonCodec(2, fields=["a", "b"]).decode(b'{"b": 2, "a": 1, "id": "x"}').tolist()
[1.0, 2.0]
>>> binary = BinaryBatchCodec(2)
>>> X = np.arange(6.0).reshape(3, 2)
>>> np.array_equal(binary.decode(binary.encode(X)), X)
True
>>> try:
...     codec.decode(b"[1, 2, 3]")
... except DecodeError as exc:
...     print(exc.reason)
wrong_shape
>>> v = RecordValidator(2, max_abs=100.0)
>>> good, bad = v.validate(np.array([[1.0, 2.0], [np.nan, 0.0], [5.0, 1e3]]))
>>> good.tolist()
[[1.0, 2.0]]
>>> [(i, reason) for i, reason, _ in bad]
[(1, 'non_finite'), (2, 'out_of_range')]
"""
from __future__ import annotations

import csv
import json
import math
import struct
from typing import Sequence

import numpy as np

from .codecs import (Codec, DecodeError, check_binary_length, check_binary_rows,
                     check_encodable_rows, join_json_arrays, load_json_message,
                     parse_json_rows, short_json, unpack_binary_header)
from .records import RecordKind, register_kind
from .validate import Rejection, check_message_size

try:  # optional: parses a fetch of JSON records several times faster than the stdlib
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["JsonCodec", "BinaryBatchCodec", "CsvCodec", "codec_from_config", "CODECS",
           "RecordValidator", "DenseKind"]


def _as_float(value, where: str) -> float:
    # bool is an int subclass; a JSON true/false is not a measurement.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DecodeError("not_numeric", f"{where} must be a number, got {type(value).__name__} "
                                         f"{short_json(value)}")
    try:
        return float(value)
    except OverflowError:
        raise DecodeError("out_of_range", f"{where} = {short_json(value)} does not fit in a float64") from None


class JsonCodec(Codec):
    """One record per message, as JSON.

    The value is a JSON array of D numbers, ``[x_1, ..., x_D]``, or a JSON
    object. With ``fields`` the object's named fields are taken in that order
    (other keys are ignored); without ``fields`` an object must hold the array
    under the key ``"x"``: ``{"x": [x_1, ..., x_D], ...}``. A bare array of D
    numbers is accepted in either case. Python's ``json``
    reads the non-standard tokens ``NaN`` and ``Infinity``; they decode to
    non-finite floats and are rejected by the validator, not here.

    Parameters
    ----------
    n_features : int
        D, the number of values per record.
    fields : sequence of str, optional
        Names of the object fields that make up a record, in order. Must have
        length D.

    Examples
    --------
    >>> codec = JsonCodec(3)
    >>> codec.encode([1.0, 2.5, -3.0])
    b'[1.0, 2.5, -3.0]'
    >>> codec.decode(b'{"x": [1, 2, 3]}').tolist()
    [1.0, 2.0, 3.0]
    """

    name = "json"
    rows_per_message = 1

    def __init__(self, n_features: int, fields: Sequence[str] | None = None):
        super().__init__(n_features)
        if fields is not None:
            if isinstance(fields, str) or not all(isinstance(f, str) for f in fields):
                raise ValueError(f"fields must be a list of field names, got {fields!r}")
            fields = list(fields)
            if len(fields) != self.n_features:
                raise ValueError(f"fields must name n_features={self.n_features} fields, "
                                 f"got {len(fields)}: {fields}")
            if len(set(fields)) != len(fields):
                raise ValueError(f"fields must be distinct, got {fields}")
        self.fields = fields

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "fields": self.fields}

    def decode(self, payload: bytes) -> np.ndarray:
        """Decode one message into a float64 array of shape (D,).

        Raises
        ------
        DecodeError
            ``json_invalid``, ``wrong_shape``, ``not_numeric``, ``missing_field``
            or ``out_of_range``.
        """
        obj = load_json_message(payload, fast=False)
        D = self.n_features
        if isinstance(obj, dict):
            if self.fields is not None:
                missing = [f for f in self.fields if f not in obj]
                if missing:
                    raise DecodeError("missing_field", f"JSON object lacks field(s) {missing}; "
                                                       f"expected fields {self.fields}")
                return np.array([_as_float(obj[f], f"field {f!r}") for f in self.fields])
            if "x" not in obj:
                raise DecodeError("missing_field",
                                  f"JSON object has no 'x' array (keys: {sorted(obj)[:10]}); "
                                  f"send an array of {D} numbers, or configure fields=[...] "
                                  f"to read named fields")
            obj = obj["x"]
        if not isinstance(obj, list):
            raise DecodeError("wrong_shape", f"expected a JSON array of {D} numbers or an object, "
                                             f"got {type(obj).__name__} {short_json(obj)}")
        if len(obj) != D:
            raise DecodeError("wrong_shape", f"expected {D} values per record, got {len(obj)}")
        if all(type(v) is float for v in obj):  # the common case, fast
            return np.array(obj, dtype=np.float64)
        return np.array([_as_float(v, f"value {i}") for i, v in enumerate(obj)])

    def decode_rows(self, payload: bytes) -> np.ndarray:
        return self.decode(payload)[None, :]

    #: Bytes a message of plain JSON number arrays can hold: digits, sign,
    #: point, exponent, the letters of NaN and Infinity, brackets, commas and
    #: JSON whitespace. Not ``"`` (strings), ``{`` (objects) or the ``l``,
    #: ``r``, ``s`` and ``u`` of true, false and null.
    _ARRAY_BYTES = b"0123456789+-.eE[], \t\n\rNaIinfty"

    def decode_many(self, payloads: Sequence[bytes]) -> np.ndarray | None:
        """All records of many messages with one JSON parse, or None.

        Messages that are each exactly ``[x_1, ..., x_D]`` are read as one flat array
        (:func:`~streamsvi.io.codecs.parse_json_rows`, with orjson). Otherwise the
        messages are parsed together as ``b"[" + b",".join(payloads) +
        b"]"`` (with orjson when it is installed, else the stdlib). The result
        is used only if it is provably what decoding each message alone gives:
        the text holds nothing but numbers and arrays (:attr:`_ARRAY_BYTES`),
        it parses to exactly n flat arrays of D numbers, and every message
        ends with ``]``. Then each joining comma follows the end of an array,
        so it is one of the n − 1 commas between the arrays, and message i is
        array i. Anything else (objects, ``fields``, a bad message, blank
        space after the ``]``, NaN with orjson) returns None.
        """
        n = len(payloads)
        if n == 0:
            return np.empty((0, self.n_features))
        if self.fields is not None:
            return None
        try:                                    # plain arrays: one flat parse (parse_json_rows)
            x = parse_json_rows(b"\n".join(payloads) + b"\n", n, self.n_features)
        except TypeError:                       # a None (tombstone) or str payload
            return None
        if x is not None:
            return x
        blob = join_json_arrays(payloads, self._ARRAY_BYTES)
        if blob is None:
            return None
        obj = None
        if _orjson is not None:
            try:
                obj = _orjson.loads(blob)
            except _orjson.JSONDecodeError:     # e.g. NaN, which only the stdlib reads
                obj = None
        if obj is None:
            try:
                obj = json.loads(blob)
            except (ValueError, RecursionError):
                return None
        if len(obj) != n:
            return None
        try:
            x = np.array(obj, dtype=np.float64)
        except (ValueError, TypeError, OverflowError):  # ragged, or an int beyond float64
            return None
        if x.shape != (n, self.n_features):
            return None
        return x

    def encode(self, row) -> bytes:
        """Encode one record (D values) as standard JSON.

        Raises
        ------
        ValueError
            If ``row`` does not hold D finite numbers (standard JSON has no NaN).
        """
        row = np.asarray(row, dtype=np.float64)
        if row.shape != (self.n_features,):
            raise ValueError(f"row must have shape ({self.n_features},), got {row.shape}")
        values = row.tolist()
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"row has non-finite values {values}; JSON cannot carry them")
        if self.fields is not None:
            return json.dumps(dict(zip(self.fields, values))).encode()
        return json.dumps(values).encode()

    def encode_rows(self, x) -> bytes:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != 1:
            raise ValueError(f"JsonCodec carries one record per message, got shape {x.shape}")
        return self.encode(x[0])


class BinaryBatchCodec(Codec):
    """A whole minibatch per message as a typed little-endian array (no pickle).

    Layout (all little-endian)::

        offset  size  field
        0       4     magic b"SSVB"
        4       1     format version (1)
        5       1     dtype code: 1 = float32, 2 = float64
        6       2     reserved, must be 0
        8       4     n_rows (uint32)
        12      4     n_cols (uint32), must equal D
        16      ...   n_rows * n_cols values, row-major

    The message length must be exactly ``16 + n_rows * n_cols * itemsize``,
    and ``n_rows`` at least 1 (a message of no rows is ``empty_batch``).

    Parameters
    ----------
    n_features : int
        D, the number of columns.
    dtype : {"float64", "float32"}
        The element type :meth:`encode` writes. :meth:`decode` reads either
        and always returns float64.

    Examples
    --------
    >>> import numpy as np
    >>> codec = BinaryBatchCodec(3, dtype="float32")
    >>> msg = codec.encode(np.ones((2, 3)))
    >>> len(msg), msg[:4]
    (40, b'SSVB')
    >>> codec.decode(msg).shape
    (2, 3)
    """

    name = "binary"
    rows_per_message = None
    MAGIC = b"SSVB"
    VERSION = 1
    HEADER = struct.Struct("<4sBBHII")
    DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<f8")}
    _CODES = {"float32": 1, "float64": 2}

    def __init__(self, n_features: int, dtype: str = "float64"):
        super().__init__(n_features)
        if dtype not in self._CODES:
            raise ValueError(f"dtype must be one of {sorted(self._CODES)}, got {dtype!r}")
        self.dtype = dtype

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "dtype": self.dtype}

    def decode(self, payload: bytes) -> np.ndarray:
        """Decode one message into a float64 array of shape (n, D).

        Raises
        ------
        DecodeError
            ``truncated``, ``bad_header``, ``bad_version``, ``bad_dtype``,
            ``wrong_shape``, ``trailing_data`` or ``empty_batch``.
        """
        return self._view(payload).astype(np.float64)

    decode_rows = decode

    def decode_many(self, payloads: Sequence[bytes]) -> np.ndarray | None:
        """All rows of many messages as one fresh float64 array (one copy), or None."""
        try:
            parts = [self._view(p) for p in payloads]
        except (DecodeError, TypeError):
            return None
        if not parts:
            return np.empty((0, self.n_features))
        return np.concatenate(parts, dtype=np.float64)

    def _view(self, payload: bytes) -> np.ndarray:
        """The rows of one message as a (read-only) view of its bytes, after every check."""
        H = self.HEADER.size
        _, _, code, reserved, n_rows, n_cols = unpack_binary_header(payload, self.HEADER, self.MAGIC,
                                                                    self.VERSION)
        if code not in self.DTYPES:
            raise DecodeError("bad_dtype", f"binary dtype code {code} is unknown "
                                           f"(1 = float32, 2 = float64)")
        if reserved != 0:
            raise DecodeError("bad_header", f"binary header reserved bytes must be 0, got {reserved}")
        if n_cols != self.n_features:
            raise DecodeError("wrong_shape", f"binary message has {n_cols} columns, "
                                             f"expected n_features={self.n_features}")
        dt = self.DTYPES[code]
        expected = H + n_rows * n_cols * dt.itemsize
        check_binary_length(payload, expected, f"{n_rows}x{n_cols} {dt.name}")
        check_binary_rows(n_rows, "rows")
        return np.frombuffer(payload, dtype=dt, count=n_rows * n_cols, offset=H).reshape(n_rows, n_cols)

    def encode(self, x) -> bytes:
        """Encode a (n, D) array (a (D,) row counts as n = 1) into one message."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"x must have shape (n, {self.n_features}), got {x.shape}")
        check_encodable_rows(x.shape[0], "rows")
        if x.shape[0] >= 2 ** 32:
            raise ValueError(f"a binary message holds fewer than 2**32 rows, got {x.shape[0]}")
        code = self._CODES[self.dtype]
        header = self.HEADER.pack(self.MAGIC, self.VERSION, code, 0, x.shape[0], x.shape[1])
        return header + np.ascontiguousarray(x, dtype=self.DTYPES[code]).tobytes()

    encode_rows = encode


class CsvCodec(Codec):
    """One record per CSV line.

    Parameters
    ----------
    n_features : int
        D, the number of values per record.
    columns : sequence of int, optional
        0-based column indices that make up a record, in order (default: the
        line must have exactly D columns, all used).
    delimiter : str
        The field separator.

    Examples
    --------
    >>> CsvCodec(2).decode(b"1.5,2").tolist()
    [1.5, 2.0]
    >>> CsvCodec(2, columns=[2, 0]).decode(b"1,id7,3").tolist()
    [3.0, 1.0]
    """

    name = "csv"
    rows_per_message = 1

    def __init__(self, n_features: int, columns: Sequence[int] | None = None, delimiter: str = ","):
        super().__init__(n_features)
        if columns is not None:
            columns = [int(c) for c in columns]
            if len(columns) != self.n_features or min(columns) < 0:
                raise ValueError(f"columns must be {self.n_features} non-negative indices, "
                                 f"got {columns}")
        self.columns = columns
        self.delimiter = delimiter

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "columns": self.columns, "delimiter": self.delimiter}

    def split(self, payload: bytes) -> list[str]:
        """The cells of one CSV line."""
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError("not_numeric", f"CSV line is not UTF-8 text: {exc}") from None
        try:
            rows = list(csv.reader([text], delimiter=self.delimiter, strict=True))
        except csv.Error as exc:
            raise DecodeError("wrong_shape", f"CSV line cannot be parsed: {exc}") from None
        return rows[0] if rows else []

    def decode(self, payload: bytes) -> np.ndarray:
        """Decode one line into a float64 array of shape (D,)."""
        cells = self.split(payload)
        D = self.n_features
        if self.columns is None:
            if len(cells) != D:
                raise DecodeError("wrong_shape", f"expected {D} CSV columns, got {len(cells)}")
            picked = list(enumerate(cells))
        else:
            if len(cells) <= max(self.columns):
                raise DecodeError("wrong_shape", f"CSV line has {len(cells)} columns, column "
                                                 f"{max(self.columns)} is needed")
            picked = [(c, cells[c]) for c in self.columns]
        out = np.empty(D)
        for j, (c, cell) in enumerate(picked):
            try:
                out[j] = float(cell)
            except ValueError:
                raise DecodeError("not_numeric", f"CSV column {c} is not a number: "
                                                 f"{short_json(cell)}") from None
        return out

    def decode_rows(self, payload: bytes) -> np.ndarray:
        return self.decode(payload)[None, :]

    def encode(self, row) -> bytes:
        row = np.asarray(row, dtype=np.float64)
        if row.shape != (self.n_features,) or self.columns is not None:
            raise ValueError(f"CsvCodec.encode needs a row of shape ({self.n_features},) and "
                             f"columns=None, got shape {row.shape}, columns={self.columns}")
        return self.delimiter.join(repr(float(v)) for v in row).encode()

    def encode_rows(self, x) -> bytes:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[0] != 1:
            raise ValueError(f"CsvCodec carries one record per line, got shape {x.shape}")
        return self.encode(x[0])


#: Codec classes by configuration name.
CODECS = {"json": JsonCodec, "binary": BinaryBatchCodec}


def codec_from_config(name: str, n_features: int, fields: Sequence[str] | None = None) -> Codec:
    """Build the codec named in a configuration.

    Parameters
    ----------
    name : {"json", "binary"}
        The message layout.
    n_features : int
        D, the number of values per record.
    fields : sequence of str, optional
        JSON object field names (only for ``"json"``).

    Examples
    --------
    >>> codec_from_config("binary", 4)
    BinaryBatchCodec(n_features=4, dtype='float64')
    """
    if name not in CODECS:
        raise ValueError(f"codec must be one of {sorted(CODECS)}, got {name!r}")
    if name == "json":
        return JsonCodec(n_features, fields=fields)
    if fields is not None:
        raise ValueError(f"fields={list(fields)} only applies to the 'json' codec, not {name!r}")
    return BinaryBatchCodec(n_features)


class RecordValidator:
    """Row-wise checks on decoded records.

    Parameters
    ----------
    n_features : int
        D, the number of values a record must have.
    max_abs : float
        Largest accepted absolute value of any feature (> 0). Guards the
        model's sufficient statistics (which hold squares) against overflow
        and against unit mistakes upstream.
    max_message_bytes : int
        Largest accepted raw message (or file line) in bytes. A binary
        minibatch message takes ``16 + 8 * rows * D`` bytes (float64): raise
        the limit for large batches.
    """

    def __init__(self, n_features: int, max_abs: float = 1e12, max_message_bytes: int = 1_048_576):
        if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) \
                or n_features < 1:
            raise ValueError(f"n_features must be an integer >= 1, got {n_features!r}")
        try:
            max_abs = float(max_abs)
        except (TypeError, ValueError):
            raise ValueError(f"max_abs must be a positive number, got {max_abs!r}") from None
        if not max_abs > 0 or math.isnan(max_abs):
            raise ValueError(f"max_abs must be a positive number, got {max_abs!r}")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, (int, np.integer)) \
                or max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be an integer >= 1, got {max_message_bytes!r}")
        self.n_features = int(n_features)
        self.max_abs = max_abs
        self.max_message_bytes = int(max_message_bytes)

    def get_params(self) -> dict:
        """The constructor settings as JSON-serialisable values."""
        return {"n_features": self.n_features, "max_abs": self.max_abs,
                "max_message_bytes": self.max_message_bytes}

    def __repr__(self):
        return (f"RecordValidator(n_features={self.n_features}, max_abs={self.max_abs!r}, "
                f"max_message_bytes={self.max_message_bytes})")

    def check_size(self, payload: bytes) -> tuple[str, str] | None:
        """``("too_large", message)`` if the raw message is over the limit, else None."""
        return check_message_size(payload, self.max_message_bytes)

    def all_valid(self, x: np.ndarray) -> bool:
        """True if every row of the float64 array ``x`` (n, D) passes :meth:`validate`.

        Two reductions and no temporary array: NaN propagates through min and
        max, so one NaN, ±inf or |value| > ``max_abs`` makes this False. A
        source checks a whole fetch with it and calls :meth:`validate` only
        when it is False.
        """
        if x.ndim != 2 or x.shape[1] != self.n_features:
            return False
        if x.size == 0:
            return True
        lo, hi = float(x.min()), float(x.max())
        return -self.max_abs <= lo and hi <= self.max_abs and math.isfinite(lo) and math.isfinite(hi)

    def validate(self, x) -> tuple[np.ndarray, list[Rejection]]:
        """Split decoded rows into accepted rows and rejections.

        Parameters
        ----------
        x : array_like, shape (n, D) or (D,)
            Decoded records. A 1-D array is one record.

        Returns
        -------
        good : ndarray, shape (m, D), float64
            The accepted rows, in their original order.
        rejected : list of (row_index, reason, message)
            One entry per rejected row; ``row_index`` indexes ``x``. Each row
            gets the first failing check in the order wrong_shape,
            non_finite, out_of_range.
        """
        x = np.asarray(x, dtype=np.float64)
        D = self.n_features
        if x.ndim == 1:
            x = x[None, :]
        if x.ndim != 2 or x.shape[1] != D:
            n = x.shape[0] if x.ndim == 2 else 1
            got = x.shape[1] if x.ndim == 2 else x.shape
            return (np.empty((0, D)),
                    [(i, "wrong_shape", f"record has {got} values, expected n_features={D}")
                     for i in range(n)])
        finite = np.isfinite(x)
        row_finite = finite.all(axis=1)
        with np.errstate(invalid="ignore"):
            too_big = np.abs(np.where(finite, x, 0.0)) > self.max_abs
        row_big = too_big.any(axis=1)
        ok = row_finite & ~row_big
        if ok.all():
            return x, []
        rejected: list[Rejection] = []
        for i in np.flatnonzero(~ok):
            i = int(i)
            if not row_finite[i]:
                j = int(np.flatnonzero(~finite[i])[0])
                rejected.append((i, "non_finite", f"value in column {j} is {float(x[i, j])!r}, "
                                                  f"expected a finite number"))
            else:
                j = int(np.flatnonzero(too_big[i])[0])
                rejected.append((i, "out_of_range", f"value in column {j} is {float(x[i, j])!r}, "
                                                    f"|value| must be <= max_abs={self.max_abs!r}"))
        return x[ok], rejected


class DenseKind(RecordKind):
    """Fixed-length numeric records: an ``(n, D)`` float64 array (the mixtures).

    Examples
    --------
    >>> kind = DenseKind()
    >>> part = kind.concat([np.ones((2, 3)), np.zeros((1, 3))])
    >>> kind.n_records(part), kind.to_json(kind.take(part, slice(2, 3)))
    (3, [[0.0, 0.0, 0.0]])
    """

    name = "dense"
    codec_names = ("json", "binary", "csv")

    def make_codec(self, name, model, options):
        return codec_from_config(name, model.n_features, options.get("fields"))

    def make_validator(self, model, options):
        return RecordValidator(model.n_features, max_abs=options.get("max_abs", 1e12),
                               max_message_bytes=options.get("max_message_bytes", 1_048_576))

    def concat(self, parts):
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def empty(self, model):
        return np.empty((0, model.n_features))

    def to_json(self, part):
        return np.asarray(part, dtype=np.float64).tolist()

    def from_json(self, values, model):
        arr = np.asarray(values, dtype=np.float64)
        return arr.reshape(-1, model.n_features)


register_kind(DenseKind())
