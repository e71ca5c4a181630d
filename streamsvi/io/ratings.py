"""Record kind ``"ratings"``: (user, item, rating) triples for matrix factorisation.

A decoded part is a :class:`streamsvi.ratings_batch.Ratings` (ids canonicalised to
strings: the integer 42 and the string "42" are the same id). Two message
layouts:

* :class:`RatingsJsonCodec` (``json``) — one rating per message,
  ``{"user": 42, "item": "m-1", "rating": 4.5}`` (other keys ignored).
* :class:`RatingsBinaryCodec` (``binary``) — a whole minibatch per message
  (layout in the class docs; no pickle).

Reason codes (codecs raise :class:`~streamsvi.io.codecs.DecodeError`; the
validator returns them per row):

``json_invalid``   not UTF-8 or not JSON
``wrong_shape``    not a JSON object
``missing_field``  no ``user``, ``item`` or ``rating``
``bad_id``         an id that is not a non-empty printable string (≤ 256
                   characters) or an integer (bools, floats, null are refused);
                   in a binary message a bad id rejects the whole message
``not_numeric``    the rating is not a number
``bad_header``, ``bad_version``, ``truncated``, ``trailing_data``   binary layout errors
``empty_batch``    a binary message of no ratings
``too_large``      (validator) the raw message is over ``max_message_bytes``
``non_finite``     (validator) the rating is NaN or ±inf
``out_of_range``   (validator) the rating is outside [``min_rating``, ``max_rating``]
                   or |rating| > ``max_abs``

Scoring (``streamsvi score``, :meth:`RatingsKind.scoring_codec_validator`) reads
the same JSON with the rating optional (a pair to predict: NaN rating) and the
item optional too (``{"user": 42}``: a top-k request, item ``None``); a rating
that is given is checked as the daemon checks it.

Examples
--------
>>> codec = RatingsJsonCodec()
>>> x = codec.decode_rows(b'{"user": 7, "item": "m1", "rating": 4}')
>>> x.user.tolist(), x.item.tolist(), x.rating.tolist()
(['7'], ['m1'], [4.0])
>>> good, bad = RatingsValidator(min_rating=1, max_rating=5).validate(
...     codec.decode_many([b'{"user": 1, "item": 2, "rating": 9}', b'{"user": 1, "item": 2, "rating": 3}']))
>>> len(good), [(i, r) for i, r, _ in bad]
(1, [(0, 'out_of_range')])
>>> binary = RatingsBinaryCodec()
>>> binary.decode_rows(binary.encode_rows(x)).user.tolist()
['7']
"""
from __future__ import annotations

import json
import math
import struct
from typing import Sequence

import numpy as np

from ..ratings_batch import MAX_ID_LENGTH, Ratings, canonical_id
from .codecs import (DecodeError, check_binary_length, check_binary_rows, check_encodable_rows,
                     load_json_message, unpack_binary_header)
from .records import RecordKind, register_kind
from .validate import check_message_size

try:  # as in codecs.py: load_json_message reads with orjson first, so the fast path does too
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["RatingsJsonCodec", "RatingsBinaryCodec", "RatingsValidator", "RatingsKind"]


def _short(value, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _ids_columns(users: list, items: list, longest_payload: int) -> tuple | None:
    """``canonical_id`` of every user and item id, as two object arrays; None if any is invalid.

    The rule of :func:`~streamsvi.ratings_batch.canonical_id`, checked on the
    columns at once: ints become their decimal strings; strings must be
    non-empty, printable (``str.isprintable`` of them all joined is the same
    test) and at most MAX_ID_LENGTH characters, which needs no look when no
    message is longer than that (a character takes at least one byte).
    """
    ids = users + items
    try:
        joined, kinds = "".join(ids), {str}         # the common case: every id a string
    except TypeError:
        kinds = set(map(type, ids))
        if not kinds <= {str, int}:
            return None
        ids = [v for v in ids if type(v) is str]
        joined = "".join(ids)
    if ids and ("" in ids or not joined.isprintable()
                or (longest_payload > MAX_ID_LENGTH and max(map(len, ids)) > MAX_ID_LENGTH)):
        return None
    if int in kinds:
        users = [v if type(v) is str else str(v) for v in users]
        items = [v if type(v) is str else str(v) for v in items]
    return np.array(users, dtype=object), np.array(items, dtype=object)


class RatingsJsonCodec:
    """One rating per message: a JSON object with ``user``, ``item`` and ``rating``."""

    name = "json"
    rows_per_message = 1

    #: scoring (``RatingsJsonCodec(scoring=True)``): the rating (NaN) and the item (None) may be left out
    scoring = False

    def __init__(self, scoring: bool = False):
        self.scoring = bool(scoring)

    def decode(self, payload: bytes) -> tuple[str, str, float]:
        obj = load_json_message(payload)
        if not isinstance(obj, dict):
            raise DecodeError("wrong_shape", f"expected a JSON object with user, item and rating, "
                                             f"got {type(obj).__name__} {_short(obj)}")
        needed = ("user",) if self.scoring else ("user", "item", "rating")
        missing = [k for k in needed if k not in obj]
        if missing:
            raise DecodeError("missing_field", f"JSON object lacks field(s) {missing} "
                                               f"(keys: {sorted(obj)[:10]})")
        try:
            u = canonical_id(obj["user"], "user")
            i = canonical_id(obj["item"], "item") if "item" in obj else None
        except ValueError as exc:
            raise DecodeError("bad_id", str(exc)) from None
        if "rating" not in obj:
            return u, i, math.nan
        if i is None:
            raise DecodeError("missing_field", "a rating needs its item (a record of a user alone "
                                               "asks for the user's top-k items)")
        y = obj["rating"]
        if isinstance(y, bool) or not isinstance(y, (int, float)):
            raise DecodeError("not_numeric", f"rating must be a number, got {type(y).__name__} {_short(y)}")
        try:
            y = float(y)
            if self.scoring and y != y:                # NaN given (not "no rating"): as the validator says
                raise DecodeError("non_finite", "rating is nan, expected a finite number")
            return u, i, y
        except OverflowError:
            raise DecodeError("out_of_range", f"rating {_short(y)} does not fit in a float64") from None

    def decode_rows(self, payload: bytes) -> Ratings:
        u, i, y = self.decode(payload)
        return Ratings(np.array([u], dtype=object), np.array([i], dtype=object), [y], _canonical=True)

    def decode_many(self, payloads: Sequence[bytes]) -> Ratings | None:
        """Every message's rating, or None if any message fails (decode them one by one then).

        The fast path (:meth:`_decode_many_fast`) checks the columns at once;
        otherwise each message is decoded as :meth:`decode` does.
        """
        fast = self._decode_many_fast(payloads)
        if fast is not None:
            return fast
        try:
            rows = [self.decode(p) for p in payloads]
        except DecodeError:
            return None
        if not rows:
            return Ratings.empty()
        u, i, y = zip(*rows)
        return Ratings(np.array(u, dtype=object), np.array(i, dtype=object), y, _canonical=True)

    def _decode_many_fast(self, payloads: Sequence[bytes]) -> Ratings | None:
        """What :meth:`decode_many` gives, with the checks of :meth:`decode` done per column; or None.

        Each message is parsed by orjson, as :func:`~streamsvi.io.codecs.load_json_message`
        does first (so the values are the ones :meth:`decode` sees), and the three
        fields are taken out with a list comprehension each; then the checks run on
        whole columns (:func:`_ids_columns`): the types (ids str or int, ratings int
        or float, never bool), empty and overlong string ids and, on all of them
        joined, ``str.isprintable``. Any message that is not such an object (or that
        orjson refuses: NaN, invalid text) gives None, and :meth:`decode_many`
        decodes message by message to be exact.
        """
        if _orjson is None or not payloads:
            return None
        try:
            objs = list(map(_orjson.loads, payloads))
            users = [o["user"] for o in objs]
            if self.scoring:                           # pairs with or without their rating
                items = [o["item"] for o in objs]
                ys = [o.get("rating", math.nan) for o in objs]
            else:
                items = [o["item"] for o in objs]
                ys = [o["rating"] for o in objs]
        except (ValueError, TypeError, KeyError, AttributeError):  # not JSON, not an object, a field missing
            return None
        ids = _ids_columns(users, items, max(map(len, payloads)))
        if ids is None or not set(map(type, ys)) <= {int, float}:
            return None
        users, items = ids
        try:
            y = np.array(ys, dtype=np.float64)
        except (OverflowError, ValueError, TypeError):   # pragma: no cover - orjson's numbers fit
            return None
        return Ratings(users, items, y, _canonical=True)

    def encode_rows(self, x: Ratings) -> bytes:
        if len(x) != 1:
            raise ValueError(f"the JSON codec carries one rating per message, got {len(x)}")
        y = float(x.rating[0])
        if not math.isfinite(y):
            raise ValueError(f"rating {y} is not finite; JSON cannot carry it")
        return json.dumps({"user": x.user[0], "item": x.item[0], "rating": y}).encode()

    def get_params(self) -> dict:
        return {"scoring": True} if self.scoring else {}

    def empty(self) -> Ratings:
        return Ratings.empty()

    def __repr__(self):
        return "RatingsJsonCodec(scoring=True)" if self.scoring else "RatingsJsonCodec()"


class RatingsBinaryCodec:
    """A minibatch of ratings per message (little-endian, no pickle).

    Layout::

        offset  size   field
        0       4      magic b"SSVR"
        4       1      format version (1)
        5       3      reserved, must be 0
        8       4      n, the number of ratings (uint32)
        12      4      U, total bytes of the user ids (uint32)
        16      4      I, total bytes of the item ids (uint32)
        20      8n     ratings, float64
        ..      2n     byte length of each user id (uint16)
        ..      2n     byte length of each item id (uint16)
        ..      U      user ids, UTF-8, concatenated
        ..      I      item ids, UTF-8, concatenated

    The message is exactly ``20 + 12 n + U + I`` bytes. Ids travel as their
    canonical strings.
    """

    name = "binary"
    rows_per_message = None
    MAGIC = b"SSVR"
    VERSION = 1
    HEADER = struct.Struct("<4sB3sIII")

    def decode_rows(self, payload: bytes) -> Ratings:
        H = self.HEADER.size
        _, _, reserved, n, nu, ni = unpack_binary_header(payload, self.HEADER, self.MAGIC, self.VERSION)
        if reserved != b"\0\0\0":
            raise DecodeError("bad_header", "binary header reserved bytes must be 0")
        expected = H + 12 * n + nu + ni
        check_binary_length(payload, expected, f"{n} ratings")
        check_binary_rows(n, "ratings")
        y = np.frombuffer(payload, "<f8", n, H).astype(np.float64)
        lu = np.frombuffer(payload, "<u2", n, H + 8 * n).astype(np.int64)
        li = np.frombuffer(payload, "<u2", n, H + 10 * n).astype(np.int64)
        if int(lu.sum()) != nu or int(li.sum()) != ni:
            raise DecodeError("bad_header", f"id lengths add up to {int(lu.sum())} and {int(li.sum())} "
                                            f"bytes, the header says {nu} and {ni}")
        start = H + 12 * n
        users = self._ids(payload, start, lu, "user")
        items = self._ids(payload, start + nu, li, "item")
        return Ratings(users, items, y, _canonical=True)

    @staticmethod
    def _ids(payload, start, lengths, what) -> np.ndarray:
        ends = start + np.cumsum(lengths)
        out = np.empty(len(lengths), dtype=object)
        mv = bytes(payload[start:int(ends[-1]) if len(ends) else start])
        pos = 0
        for k, ln in enumerate(lengths.tolist()):
            raw = mv[pos:pos + ln]
            pos += ln
            try:
                s = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DecodeError("bad_id", f"{what} id of rating {k} is not UTF-8") from None
            if not s or len(s) > MAX_ID_LENGTH or not s.isprintable():
                raise DecodeError("bad_id", f"{what} id of rating {k} is {s[:40]!r}: ids must be non-empty "
                                            f"printable strings of at most {MAX_ID_LENGTH} characters")
            out[k] = s
        return out

    def decode_many(self, payloads: Sequence[bytes]) -> Ratings | None:
        try:
            return Ratings.concat([self.decode_rows(p) for p in payloads])
        except DecodeError:
            return None

    def encode_rows(self, x: Ratings) -> bytes:
        n = len(x)
        check_encodable_rows(n, "ratings")
        ub = [u.encode() for u in x.user]
        ib = [i.encode() for i in x.item]
        if any(len(b) > 65535 for b in ub + ib):
            raise ValueError("an id is longer than 65535 bytes")
        U, I = sum(map(len, ub)), sum(map(len, ib))
        head = self.HEADER.pack(self.MAGIC, self.VERSION, b"\0\0\0", n, U, I)
        return b"".join([head, np.asarray(x.rating, "<f8").tobytes(),
                         np.array([len(b) for b in ub], "<u2").tobytes(),
                         np.array([len(b) for b in ib], "<u2").tobytes(), *ub, *ib])

    def get_params(self) -> dict:
        return {}

    def empty(self) -> Ratings:
        return Ratings.empty()

    def __repr__(self):
        return "RatingsBinaryCodec()"


class RatingsValidator:
    """Row checks on decoded ratings: finite, within [min_rating, max_rating] and |y| ≤ max_abs.

    Parameters
    ----------
    min_rating, max_rating : float or None
        The accepted rating scale (e.g. 1 and 5 for MovieLens); None: unbounded.
    max_abs : float
        Largest accepted |rating| in any case.
    max_message_bytes : int
        Largest accepted raw message.
    """

    def __init__(self, min_rating=None, max_rating=None, max_abs: float = 1e12,
                 max_message_bytes: int = 1_048_576, optional_rating: bool = False):
        for nm, v in (("min_rating", min_rating), ("max_rating", max_rating)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise ValueError(f"{nm} must be a finite number or None, got {v!r}")
        if min_rating is not None and max_rating is not None and min_rating > max_rating:
            raise ValueError(f"min_rating={min_rating} must be <= max_rating={max_rating}")
        if not (isinstance(max_abs, (int, float)) and max_abs > 0):
            raise ValueError(f"max_abs must be a positive number, got {max_abs!r}")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int) or max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be an integer >= 1, got {max_message_bytes!r}")
        self.min_rating = None if min_rating is None else float(min_rating)
        self.max_rating = None if max_rating is None else float(max_rating)
        self.max_abs = float(max_abs)
        self.max_message_bytes = int(max_message_bytes)
        lo = -self.max_abs if self.min_rating is None else max(-self.max_abs, self.min_rating)
        hi = self.max_abs if self.max_rating is None else min(self.max_abs, self.max_rating)
        self._lo, self._hi = lo, hi
        #: scoring: a NaN rating is a rating not given (the scoring codec refuses a given NaN)
        self.optional_rating = bool(optional_rating)

    def get_params(self) -> dict:
        return {"min_rating": self.min_rating, "max_rating": self.max_rating, "max_abs": self.max_abs,
                "max_message_bytes": self.max_message_bytes}

    def check_size(self, payload: bytes):
        return check_message_size(payload, self.max_message_bytes)

    def all_valid(self, x: Ratings) -> bool:
        if len(x) == 0:
            return True
        if self.optional_rating:
            y = x.rating[~np.isnan(x.rating)]
            if len(y) == 0:
                return True
            lo, hi = float(y.min()), float(y.max())
            return self._lo <= lo and hi <= self._hi and math.isfinite(lo) and math.isfinite(hi)
        lo, hi = float(x.rating.min()), float(x.rating.max())
        return self._lo <= lo and hi <= self._hi and math.isfinite(lo) and math.isfinite(hi)

    def validate(self, x: Ratings):
        """(accepted ratings, [(row, reason, message), ...]) — ids are checked by the codecs."""
        y = x.rating
        finite = np.isfinite(y)
        with np.errstate(invalid="ignore"):
            inside = (y >= self._lo) & (y <= self._hi)
        ok = finite & inside
        if self.optional_rating:
            ok |= np.isnan(y)
        if ok.all():
            return x, []
        rejected = []
        for r in np.flatnonzero(~ok).tolist():
            if not finite[r]:
                rejected.append((r, "non_finite", f"rating is {float(y[r])!r}, expected a finite number"))
            else:
                rejected.append((r, "out_of_range", f"rating {float(y[r])!r} is outside "
                                                     f"[{self._lo!r}, {self._hi!r}]"))
        return x[np.flatnonzero(ok)], rejected

    def __repr__(self):
        return "RatingsValidator(" + ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()) + ")"


class RatingsKind(RecordKind):
    """Ratings records: parts are :class:`~streamsvi.ratings_batch.Ratings`.

    >>> kind = RatingsKind()
    >>> part = kind.concat([Ratings([1], ["a"], [4.0]), Ratings(["u2"], [3], [2.5])])
    >>> kind.n_records(part), kind.to_json(kind.take(part, slice(1, 2)))
    (2, [{'user': 'u2', 'item': '3', 'rating': 2.5}])
    """

    name = "ratings"
    codec_names = ("json", "binary")

    def n_fields(self, model) -> None:
        return None                        # JSON objects with user, item and rating

    def make_codec(self, name, model, options):
        if name == "json":
            if options.get("fields") is not None:
                raise ValueError("source.fields does not apply to ratings records "
                                 "(JSON objects with user, item and rating)")
            return RatingsJsonCodec()
        if name == "binary":
            return RatingsBinaryCodec()
        raise ValueError(f"codec for ratings must be one of {list(self.codec_names)}, got {name!r}")

    def make_validator(self, model, options):
        """The validator of ``[validation]``; a model's own ``min_rating`` (HPF: counts >= 0) is a
        floor no config can lower, so such records are dead-lettered rather than failing an update."""
        lo, floor = options.get("min_rating"), model.min_rating
        if floor is not None:
            lo = floor if lo is None else max(lo, floor)
        return RatingsValidator(min_rating=lo, max_rating=options.get("max_rating"),
                                max_abs=options.get("max_abs", 1e12),
                                max_message_bytes=options.get("max_message_bytes", 1_048_576))

    def scoring_codec_validator(self, model, fields, options):
        """The JSON codec and validator of ``streamsvi score``: the rating and the item are optional
        there (a pair to predict; a user alone: a top-k request)."""
        if fields is not None:
            raise ValueError("--fields does not apply to ratings records (JSON objects with user, item "
                             "and rating)")
        validator = self.make_validator(model, options)
        validator.optional_rating = True
        return RatingsJsonCodec(scoring=True), validator

    def n_records(self, part) -> int:
        return len(part)

    def take(self, part, index):
        if isinstance(index, slice):
            index = np.arange(len(part))[index]
        return part[np.asarray(index, dtype=np.int64)]

    def concat(self, parts):
        return Ratings.concat(parts)

    def empty(self, model=None):
        return Ratings.empty()

    def to_json(self, part) -> list:
        return part.to_records()

    def from_json(self, values, model=None):
        if not values:
            return Ratings.empty()
        return Ratings([v["user"] for v in values], [v["item"] for v in values],
                       [v["rating"] for v in values])


register_kind(RatingsKind())
