"""The codec interface and what every record kind's codecs share.

A codec turns the bytes of one message (or one file line) into decoded
records and back; whether the records are acceptable is the kind's
validator's job (:mod:`streamsvi.io.validate`). Every failure raises
:class:`DecodeError` with a short, stable ``reason`` code that ends up in the
dead-letter record and in the per-reason counters (docs/design.md, "Dead
letters"). Each kind's codecs live in its own module: :mod:`streamsvi.io.dense`
(:class:`~streamsvi.io.dense.JsonCodec`, :class:`~streamsvi.io.dense.BinaryBatchCodec`,
:class:`~streamsvi.io.dense.CsvCodec`), :mod:`streamsvi.io.bow`,
:mod:`streamsvi.io.sequences`, :mod:`streamsvi.io.ratings`.

Here: :class:`Codec` (the interface the dense codecs implement),
:class:`DecodeError`, and the helpers every kind uses: :func:`load_json_message`,
:func:`join_json_arrays` (the one-parse fast path of ``decode_many``),
:func:`parse_json_rows` (the flat one-parse fast path of dense JSON rows, the
fastest: ``streamsvi score`` and the dense ``decode_many``),
:func:`parse_int_arrays` (the vectorised fast path of the integer kinds: bag of
words and sequences), :func:`unpack_binary_header`, :func:`check_binary_length`,
:func:`check_binary_rows`, :func:`check_encodable_rows`.

Reason codes shared by the kinds
--------------------------------
``json_invalid``   not UTF-8 or not JSON
``wrong_shape``    wrong number of values / columns, or not an array/object
``not_numeric``    a value is not a number (string, bool, null, nested list)
``missing_field``  a named field is absent from a JSON object
``out_of_range``   a number too large for float64
``bad_header``     binary: wrong magic or reserved bytes
``bad_version``    binary: unknown format version
``bad_dtype``      binary: unknown dtype code
``truncated``      binary: fewer bytes than the header announces
``trailing_data``  binary: more bytes than the header announces
``empty_batch``    binary: the message holds no records (dead-lettered and counted
                   like any bad message, so nothing is dropped silently)
``codec_error``    a codec raised something other than :class:`DecodeError`: a
                   defect in a decoder, met by an input nobody foresaw. The
                   record is dead-lettered with the exception named
                   (:func:`decode_rows_safely`), so one record never stops a
                   reader; report it as a bug.

Examples
--------
>>> try:
...     load_json_message(b"[1, 2")
... except DecodeError as exc:
...     print(exc.reason)
json_invalid
"""
from __future__ import annotations

import json
import math
from typing import Sequence

import numpy as np

try:  # optional: parses a fetch of JSON records several times faster than the stdlib
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["DecodeError", "Codec", "decode_rows_safely", "decode_many_safely", "json_integer",
           "load_json_message", "join_json_arrays", "parse_int_arrays", "parse_json_rows",
           "unpack_binary_header", "check_binary_length", "check_binary_rows",
           "check_encodable_rows"]


class DecodeError(ValueError):
    """A message could not be turned into records.

    Parameters
    ----------
    reason : str
        Short stable code (see the module docstring), used as the dead-letter
        reason and as a metric label.
    message : str
        What exactly was wrong, for a person.
    """

    def __init__(self, reason: str, message: str):
        super().__init__(f"[{reason}] {message}")
        self.reason = reason
        self.message = message


def _check_n_features(n_features) -> int:
    if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 1:
        raise ValueError(f"n_features must be an integer >= 1, got {n_features!r}")
    return int(n_features)


class Codec:
    """Interface of a record codec.

    Attributes
    ----------
    name : str
        The name used by :func:`streamsvi.io.dense.codec_from_config`.
    n_features : int
        D, the number of values per record.
    rows_per_message : int or None
        1 when every message holds exactly one record, None when it varies.
    """

    name = "codec"
    rows_per_message: int | None = 1

    def __init__(self, n_features: int):
        self.n_features = _check_n_features(n_features)

    def decode_rows(self, payload: bytes) -> np.ndarray:
        """Decode one message into a float64 array of shape (n, D)."""
        raise NotImplementedError

    def decode_many(self, payloads: Sequence[bytes]) -> np.ndarray | None:
        """The rows of several messages at once, or None if any of them fails.

        The fast path of a source: all rows of ``payloads`` in order, as one
        float64 array of shape (n, D), exactly what :meth:`decode_rows` gives
        message by message. None means at least one message may not decode
        (or a fast check could not tell); the caller then decodes the
        messages one by one with :meth:`decode_rows` to find which and why.
        """
        try:
            parts = [self.decode_rows(p) for p in payloads]
        except (DecodeError, TypeError):
            return None
        return np.concatenate(parts) if parts else np.empty((0, self.n_features))

    def encode_rows(self, x) -> bytes:
        """Encode a (n, D) array into one message."""
        raise NotImplementedError

    def empty(self) -> np.ndarray:
        """A part holding no records: a float64 array of shape (0, D)."""
        return np.empty((0, self.n_features))

    def get_params(self) -> dict:
        """The constructor settings as JSON-serialisable values."""
        return {"n_features": self.n_features}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


def decode_rows_safely(codec, payload):
    """``codec.decode_rows(payload)``; whatever else it raises becomes ``DecodeError("codec_error")``.

    Every reader (the sources' batch builder, ``streamsvi score``) decodes a
    message through this, so an exception a codec did not foresee dead-letters
    that one record, named, instead of stopping the reader on it again and
    again (a poison pill).
    """
    try:
        return codec.decode_rows(payload)
    except DecodeError:
        raise
    except RecursionError:
        raise DecodeError("json_invalid", "message is nested too deeply") from None
    except Exception as exc:  # noqa: BLE001 - the point: nothing a record holds may escape
        raise DecodeError("codec_error", f"{type(codec).__name__} raised {type(exc).__name__}: "
                                         f"{str(exc)[:200]}") from None


def decode_many_safely(codec, payloads):
    """``codec.decode_many(payloads)``, or None (decode one by one) if it raises anything."""
    try:
        return codec.decode_many(payloads)
    except Exception:  # noqa: BLE001 - the slow path finds and names the culprit
        return None


def json_integer(value):
    """``value`` as an int if it is a JSON integer or an integral finite number (``3`` or ``3.0``), else None.

    The one rule for the integer fields of every kind: bag-of-words word ids,
    sequence symbols and class labels. ``3.0`` is what JavaScript and
    numpy-to-JSON producers write for 3, so it is accepted everywhere; ``3.5``,
    ``"3"``, ``true``, ``null``, NaN and infinities are refused (each kind names
    the reason: ``not_integer``, or ``bad_label`` for labels). Range checks
    (ids beyond any vocabulary, symbols beyond int64) come after.

    >>> [json_integer(v) for v in (3, 3.0, -2, 3.5, "3", True, None, float("inf"))]
    [3, 3, -2, None, None, None, None, None]
    """
    if type(value) is int:
        return value
    if type(value) is float and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def short_json(value, limit: int = 40) -> str:
    """``value`` for an error message: JSON (a string in quotes), cut to ``limit`` characters."""
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def load_json_message(payload, fast: bool = True):
    """One message parsed as JSON, for every JSON codec.

    With ``fast``, orjson when it is installed; the stdlib otherwise, and for
    what orjson refuses (NaN, Infinity, invalid text, whose error message the
    stdlib gives). ``fast=False`` is the stdlib only, for codecs that must see
    integers beyond 64 bits as integers (orjson reads some as floats). Raises
    :class:`DecodeError` ``json_invalid``.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview, str)):
        raise DecodeError("json_invalid", f"message is {type(payload).__name__}, not bytes")
    if fast and _orjson is not None:
        try:
            return _orjson.loads(payload)
        except _orjson.JSONDecodeError:
            pass
    try:
        return json.loads(payload)
    except UnicodeDecodeError as exc:
        raise DecodeError("json_invalid", f"message is not UTF-8 text: {exc}") from None
    except RecursionError:
        raise DecodeError("json_invalid", "message is not valid JSON: arrays or objects "
                                          "nested too deeply") from None
    except (ValueError, TypeError) as exc:
        raise DecodeError("json_invalid", f"message is not valid JSON: {exc}") from None


def join_json_arrays(payloads: Sequence[bytes], allowed: bytes) -> bytes | None:
    """``b"[" + b",".join(payloads) + b"]"``, or None unless it is safe to parse at once.

    Safe means: every payload is non-empty bytes ending with ``]`` and the
    text holds only the bytes in ``allowed`` (numbers, brackets, commas,
    whitespace; no strings or objects). Then each joining comma follows the
    end of an array, so if the parse gives exactly n arrays, array i is
    message i (see :meth:`streamsvi.io.dense.JsonCodec.decode_many`).
    """
    try:
        blob = b"[" + b",".join(payloads) + b"]"
    except TypeError:                           # a None (tombstone) or str payload
        return None
    if blob.translate(None, allowed):
        return None
    # index in blob of the last byte of message i: 1 + Σ_{j<=i} len_j + i − 1
    n = len(payloads)
    lens = np.fromiter(map(len, payloads), dtype=np.int64, count=n)
    last = np.cumsum(lens) + np.arange(n)
    if lens.min() < 1 or not np.all(np.frombuffer(blob, np.uint8)[last] == ord("]")):
        return None
    return blob


#: The bytes of lines of plain JSON number arrays that :func:`parse_json_rows` reads.
_ROW_BYTES = b"0123456789+-.eE[], \n"
#: "[" and "]" become blanks and each line break a comma: the lines as one flat JSON array
_FLATTEN = bytes.maketrans(b"[]\n", b"  ,")


def parse_json_rows(text: bytes, n: int, width: int) -> np.ndarray | None:
    r"""The numbers of n lines, each a flat JSON array of ``width`` numbers, as (n, width) float64.

    ``text`` is ``b"[1.5, 2]\n[3,-4e-2]\n"``: n lines, each ending with a line break and
    holding exactly ``[``, ``width`` JSON numbers separated by commas (blanks allowed
    between them), ``]``. Returns None unless every line is such an array (a blank
    line, ``\r``, a blank before ``[`` or after ``]``, a nested array, an object, a
    string, NaN, a wrong count of numbers: the caller takes its general path, which
    reads every valid JSON text and names what is wrong), and None without orjson.

    The structure is checked on the bytes: only the bytes of numbers, commas, blanks
    and brackets; n line breaks, n ``[`` and n ``]``, every line break after a ``]`` and
    before a ``[`` (so every ``[`` opens a line and every ``]`` closes one); ``width − 1``
    commas between each pair of line breaks (numpy over the bytes). Then the brackets become blanks and the line breaks commas,
    and one orjson parse of that flat array reads every number: with each line holding
    ``width − 1`` commas, a parse into n·width numbers means that every line held
    ``width`` valid JSON numbers, the values ``json.loads`` of each line gives (both
    parsers round correctly; integers become the nearest float). About twice as fast
    as parsing the lines as nested arrays, and no list per line.

    >>> parse_json_rows(b"[1.5, 2]\n[3,-4e-2]\n", 2, 2).tolist()
    [[1.5, 2.0], [3.0, -0.04]]
    >>> [parse_json_rows(t, 1, 2) for t in (b"[1, 2, 3]\n", b"[1, [2]]\n", b" [1, 2]\n", b"[1,, 2]\n")]
    [None, None, None, None]
    """
    if _orjson is None or not isinstance(text, bytes) or n < 1 or width < 1:
        return None
    if text[:1] != b"[" or text[-2:] != b"]\n" or text.translate(None, _ROW_BYTES):
        return None
    a = np.frombuffer(text, np.uint8)
    breaks = np.flatnonzero(a == 10)
    if len(breaks) != n or not ((a[breaks - 1] == 93).all() and (a[breaks[:-1] + 1] == 91).all()):
        return None
    if np.count_nonzero(a == 91) != n or np.count_nonzero(a == 93) != n:
        return None
    commas = np.flatnonzero(a == 44)
    if len(commas) != n * (width - 1):
        return None
    if width > 1:
        c = commas.reshape(n, width - 1)
        if not ((c[:, -1] < breaks).all() and (c[1:, 0] > breaks[:-1]).all()):
            return None
    try:
        values = _orjson.loads(b"[" + text[:-1].translate(_FLATTEN) + b"]")
    except _orjson.JSONDecodeError:
        return None
    if len(values) != n * width:
        return None
    try:
        x = np.fromiter(values, dtype=np.float64, count=n * width)
    except (TypeError, ValueError, OverflowError):
        return None
    return x.reshape(n, width)


#: _KEEP[k]: the top k bytes of a uint64 (the last k bytes of an 8-byte window, little-endian)
_KEEP = np.array([0] + [(2 ** 64 - 1) ^ (2 ** (8 * (8 - k)) - 1) for k in range(1, 9)], dtype=np.uint64)
#: at most 16 digits: two 8-byte windows, and every such integer fits in an int64
_MAX_DIGITS = 16


def _eight_digits(win: np.ndarray, ends: np.ndarray, n_digits: np.ndarray) -> np.ndarray:
    """The values of numbers of at most 8 digits ending before ``ends`` (SWAR, no loop over digits).

    ``win[i]`` is the 8 bytes from ``i`` on as a little-endian uint64, so ``win[e - 8]`` holds
    the 8 bytes before ``e``, last digit in the top byte. The bytes before the number are
    zeroed, and three multiply-shift steps add pairs of digits, of 2-digit and of 4-digit
    groups (as simdjson's parse_eight_digits).
    """
    v = win[ends - 8] & _KEEP[n_digits]
    v = ((v & np.uint64(0x0F0F0F0F0F0F0F0F)) * np.uint64(2561)) >> np.uint64(8)
    v = ((v & np.uint64(0x00FF00FF00FF00FF)) * np.uint64(6553601)) >> np.uint64(16)
    v = ((v & np.uint64(0x0000FFFF0000FFFF)) * np.uint64(42949672960001)) >> np.uint64(32)
    return v.astype(np.int64)


def parse_int_arrays(blob: bytes, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The integers of n flat JSON arrays of non-negative integers, each followed by ``;``.

    ``blob`` is ``b"[1, 2];[];[3,40];"``: n messages, each a JSON array of
    non-negative integers written as ``json.dumps`` (``", "``) or a compact
    writer (``","``) separates them, each followed by ``;``. Returns
    ``(values, lengths)``: all integers in order as int64 and how many each
    array holds; or None unless every message is such an array, read exactly
    as a JSON parser reads it. None covers any other byte (a minus sign, a
    point, an exponent, a letter, a quote, a brace), whitespace other than one
    space after a comma, nested arrays, a leading zero (``01``, invalid JSON),
    a missing or doubled comma, more than 16 digits, and a ``;`` inside a
    message (then there are not n of them). The caller then takes its general
    path, which reads every valid JSON text.

    The checks look at each byte and its neighbours, and the digits are
    converted 8 at a time in uint64 lanes: numpy operations over the bytes, no
    Python object per number. The fast path of the integer kinds (bag of
    words, sequences).

    >>> values, lengths = parse_int_arrays(b"[1, 2];[];[3,40];", 3)
    >>> values.tolist(), lengths.tolist()
    ([1, 2, 3, 40], [2, 0, 2])
    >>> [parse_int_arrays(t, 1) for t in (b"[1, 2.5];", b"[01];", b"[-1];", b"[1 ,2];")]
    [None, None, None, None]
    """
    if not isinstance(blob, bytes) or blob.count(b";") != n or blob[:1] != b"[" or blob[-1:] != b";":
        return None
    # 8 bytes before (the windows of _eight_digits), and a "[" after: what may follow the last ";"
    full = np.frombuffer(b";;;;;;;;" + blob + b"[", dtype=np.uint8)
    d, cm, sp, op, cl, sc = ((full - np.uint8(48)) < 10, full == 44, full == 32, full == 91,
                             full == 93, full == 59)
    at, before, after = slice(8, -1), slice(7, -2), slice(9, None)   # a byte, its neighbours
    digit, semi = d[at], sc[at]
    bad = ~(digit | cm[at] | sp[at] | op[at] | cl[at] | semi)          # any other byte
    bad |= cm[at] & ~(d[before] & (d[after] | sp[after]))              # n,n  n, n
    bad |= sp[at] & ~(cm[before] & d[after])                          # one space, after a comma
    bad |= op[at] & ~(sc[before] & (d[after] | cl[after]))            # ;[n  ;[]
    bad |= cl[at] & ~((d[before] | op[before]) & sc[after])           # n];  [];
    bad |= semi & ~(cl[before] & op[after])                           # ];[
    bad |= (full[at] == 48) & ~d[before] & d[after]                   # a leading zero
    if bad.any():
        return None
    edges = np.flatnonzero(digit[1:] != digit[:-1]) + 1     # u[0] is "[" and u[-1] ";": pairs
    starts, ends = edges[0::2], edges[1::2]
    lengths = np.diff(np.searchsorted(starts, np.flatnonzero(semi)), prepend=0)
    if not starts.size:
        return np.empty(0, dtype=np.int64), lengths
    n_digits = ends - starts
    longest = int(n_digits.max())
    if longest > _MAX_DIGITS:
        return None
    if longest == 1:                                        # small symbols: no windows needed
        return (full[starts + 8] - np.uint8(48)).astype(np.int64), lengths
    win = np.ndarray((full.size - 7,), dtype="<u8", buffer=full, strides=(1,))
    ends8 = ends + 8                                        # positions in `full`
    if longest <= 8:
        return _eight_digits(win, ends8, n_digits), lengths
    low = _eight_digits(win, ends8, np.minimum(n_digits, 8))
    high = _eight_digits(win, ends8 - 8, np.maximum(n_digits - 8, 0))
    return high * 10 ** 8 + low, lengths


def unpack_binary_header(payload, header, magic: bytes, version: int) -> tuple:
    """The fields of a binary batch message's fixed header, after the checks every format shares.

    ``header`` is a :class:`struct.Struct` whose first two fields are the
    4-byte magic and the format version. Raises :class:`DecodeError`:
    ``bad_header`` (not bytes, or the wrong magic), ``truncated`` (shorter
    than the header) or ``bad_version``; the caller checks the rest.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise DecodeError("bad_header", f"binary message must be bytes, got {type(payload).__name__}")
    if len(payload) < header.size:
        raise DecodeError("truncated", f"binary message has {len(payload)} bytes, "
                                       f"less than the {header.size}-byte header")
    fields = header.unpack_from(payload)
    if fields[0] != magic:
        raise DecodeError("bad_header", f"binary message starts with {bytes(fields[0])!r}, "
                                        f"expected magic {magic!r}")
    if fields[1] != version:
        raise DecodeError("bad_version", f"binary format version {fields[1]} is not supported "
                                         f"(this reader knows version {version})")
    return fields


def check_binary_length(payload, expected: int, announced: str) -> None:
    """``truncated`` / ``trailing_data`` unless the message has exactly ``expected`` bytes.

    ``announced`` says what the header announced (e.g. "3 ratings"), for the message.
    """
    if len(payload) != expected:
        raise DecodeError("truncated" if len(payload) < expected else "trailing_data",
                          f"binary message announces {announced} ({expected} bytes) "
                          f"but has {len(payload)} bytes")


def check_binary_rows(n_rows: int, what: str) -> None:
    """``empty_batch`` if a binary batch message announces no records (every binary codec).

    A message with no records has nothing to apply, but it was sent and it has
    an offset: the source dead-letters it with this reason (and the daemon counts
    it), so no message is consumed without a trace. ``what`` names the records
    ("rows", "documents", ...).
    """
    if n_rows == 0:
        raise DecodeError("empty_batch", f"binary message holds 0 {what}; a batch message must "
                                         f"carry at least one (skip empty batches when producing)")


def check_encodable_rows(n_rows: int, what: str) -> None:
    """ValueError if a binary batch message would hold no records (what decoding rejects)."""
    if n_rows == 0:
        raise ValueError(f"cannot encode a binary batch of 0 {what}: a batch message must hold at "
                         f"least one (readers dead-letter empty ones as 'empty_batch'); skip it")
