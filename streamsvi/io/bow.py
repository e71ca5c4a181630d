"""Bag-of-words records (record kind ``"bow"``) for topic models such as LDA.

A decoded *part* is a scipy CSR matrix (documents × vocabulary) of float64
word counts. Codecs only turn bytes into such a matrix; word ids at or above
the model's vocabulary size V survive decoding (the matrix is then wider than
V) so that :class:`BowValidator` can reject exactly those documents, one by
one, even inside a binary minibatch message.

Codecs (the config's ``source.codec``)
--------------------------------------
``json``    one document per message: ``{"ids": [3, 17, 17, 40], "counts": [2, 1, 1, 5]}``.
            ``counts`` may be left out (each id then counts once); repeated ids
            are summed. A bare JSON array is read as ``ids``.
``binary``  a whole minibatch per message, CSR arrays behind a 16-byte header
            (:class:`BowBinaryCodec`; no pickle).
``text``    one document per message as raw UTF-8 text, tokenised as
            scikit-learn's ``CountVectorizer`` does by default (lower case,
            runs of ≥ 2 word characters), mapped to ids by a fixed vocabulary
            file (one word per line, line i is id i; unknown words are
            dropped) or, without one, by the hashing trick
            (``crc32(word) mod V``, stable across processes and machines).

Reason codes
------------
Raised by the codecs (:class:`~streamsvi.io.codecs.DecodeError`):
``json_invalid``, ``missing_field`` (no ``ids``), ``wrong_shape`` (``ids`` and
``counts`` differ in length, or are not arrays), ``not_numeric`` (a count is
not a number), ``not_integer`` (an id is not an integer), ``id_out_of_range``
(a negative id, or one at or above 2**32, :data:`MAX_WORD_ID`), ``not_text`` (text codec: not UTF-8), and for binary
messages ``truncated``, ``trailing_data``, ``bad_header``, ``bad_version``,
``bad_dtype``, ``bad_indptr``, ``empty_batch`` (no documents).

Raised by the validator, per document: ``too_large`` (message over
``max_message_bytes``), ``id_out_of_range`` (an id ≥ V), ``non_finite``,
``bad_count`` (a negative count), ``out_of_range`` (a count above
``max_count``), ``empty_document`` (no word with a positive count).

Examples
--------
>>> codec = BowJsonCodec(n_features=50)
>>> x = codec.decode_rows(b'{"ids": [3, 7, 3], "counts": [1, 2, 4]}')
>>> x.toarray()[0, [3, 7]].tolist()
[5.0, 2.0]
>>> good, bad = BowValidator(50).validate(codec.decode_rows(b'{"ids": [60]}'))
>>> good.shape[0], bad[0][1]
(0, 'id_out_of_range')
"""
from __future__ import annotations

import json
import math
import re
import struct
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp

from .codecs import (DecodeError, check_binary_length, check_binary_rows, check_encodable_rows,
                     json_integer, load_json_message, parse_int_arrays, unpack_binary_header)
from ..settings import Setting
from .records import RecordKind, register_kind
from .validate import check_message_size

__all__ = ["BowJsonCodec", "BowBinaryCodec", "TextCodec", "BowValidator", "BowKind",
           "concat_csr", "tokenize", "load_vocabulary"]


def _check_v(n_features) -> int:
    if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 1:
        raise ValueError(f"n_features (the vocabulary size) must be an integer >= 1, got {n_features!r}")
    return int(n_features)


def _csr(ids, counts, indptr, V) -> sp.csr_matrix:
    """CSR (n, max(V, max id + 1)) with duplicates summed."""
    ids = np.asarray(ids, dtype=np.int64)
    width = max(V, int(ids.max()) + 1) if ids.size else V
    X = sp.csr_matrix((np.asarray(counts, dtype=np.float64), ids, np.asarray(indptr, dtype=np.int64)),
                      shape=(len(indptr) - 1, width))
    if ids.size:
        X.sum_duplicates()
    return X


def concat_csr(parts: Sequence, n_features: int) -> sp.csr_matrix:
    """Stack CSR parts of possibly different widths (the widest, at least V, wins)."""
    parts = [p for p in parts]
    if not parts:
        return sp.csr_matrix((0, n_features))
    if len(parts) == 1:
        return parts[0]
    width = max([n_features] + [p.shape[1] for p in parts])
    offs = np.cumsum([0] + [p.nnz for p in parts])
    indptr = np.concatenate([[0]] + [p.indptr[1:] + o for p, o in zip(parts, offs[:-1])])
    return sp.csr_matrix((np.concatenate([p.data for p in parts]).astype(np.float64, copy=False),
                          np.concatenate([p.indices for p in parts]), indptr),
                         shape=(int(sum(p.shape[0] for p in parts)), width))


#: Word ids at or above this are refused while decoding (``id_out_of_range``): no
#: vocabulary is that large, a binary message cannot carry them (its ids are
#: uint32), and a JSON id such as ``1e300`` or ``10**30`` would not fit an int64.
MAX_WORD_ID = 2 ** 32


def _doc_from_obj(obj, where="document"):
    """(ids list, counts list) from a decoded JSON value."""
    if isinstance(obj, list):
        obj = {"ids": obj}
    if not isinstance(obj, dict):
        raise DecodeError("wrong_shape", f"{where} must be a JSON object {{\"ids\": [...], "
                                         f"\"counts\": [...]}}, got {type(obj).__name__}")
    if "ids" not in obj:
        raise DecodeError("missing_field", f"{where} has no 'ids' array (keys: {sorted(obj)[:10]})")
    ids, counts = obj["ids"], obj.get("counts")
    if not isinstance(ids, list) or (counts is not None and not isinstance(counts, list)):
        raise DecodeError("wrong_shape", f"{where}: 'ids' and 'counts' must be JSON arrays")
    if counts is None:
        counts = [1] * len(ids)
    elif len(counts) != len(ids):
        raise DecodeError("wrong_shape", f"{where} has {len(ids)} ids but {len(counts)} counts")
    for i in ids:
        if type(i) is not int and json_integer(i) is None:
            raise DecodeError("not_integer", f"{where}: word id {json.dumps(i)[:40]} is not an integer")
        if i < 0:
            raise DecodeError("id_out_of_range", f"{where}: word id {json.dumps(i)[:40]} is negative")
        if i >= MAX_WORD_ID:
            raise DecodeError("id_out_of_range", f"{where}: word id {json.dumps(i)[:40]} is beyond any "
                                                 f"vocabulary (ids must be < 2**32)")
    for c in counts:
        if isinstance(c, bool) or not isinstance(c, (int, float)):
            raise DecodeError("not_numeric", f"{where}: count {json.dumps(c)[:40]} is not a number")
        if isinstance(c, int) and abs(c) > 2 ** 53:
            raise DecodeError("out_of_range", f"{where}: count {c} is too large")
    return ids, counts


_WS = rb"[ \t\n\r]*"            # JSON whitespace (not \f or \v, which re's \s would allow)
#: A plain bag-of-words message: ``{"ids": [...], "counts": [...]}``, ``{"ids": [...]}`` or a
#: bare array of ids, with any JSON whitespace; the groups are the insides of the arrays (ids,
#: counts, bare ids). What the arrays hold is :func:`~streamsvi.io.codecs.parse_int_arrays`'s to
#: judge; anything this does not match is parsed as JSON.
_PLAIN_DOC = re.compile(_WS + rb'(?:\{' + _WS + rb'"ids"' + _WS + rb":" + _WS + rb"\[([^\]]*)\]" + _WS
                        + rb'(?:,' + _WS + rb'"counts"' + _WS + rb":" + _WS + rb"\[([^\]]*)\]" + _WS
                        + rb")?\}|\[([^\]]*)\])" + _WS)


class BowJsonCodec:
    """One document per message: ``{"ids": [...], "counts": [...]}`` (see module docs).

    Parameters
    ----------
    n_features : int
        V, the vocabulary size (decoded parts are at least this wide).
    """

    name = "json"
    rows_per_message = 1

    def __init__(self, n_features: int):
        self.n_features = _check_v(n_features)

    def empty(self) -> sp.csr_matrix:
        """A batch with no documents."""
        return sp.csr_matrix((0, self.n_features))

    def get_params(self) -> dict:
        return {"n_features": self.n_features}

    def __repr__(self):
        return f"BowJsonCodec(n_features={self.n_features})"

    def decode_rows(self, payload: bytes) -> sp.csr_matrix:
        ids, counts = _doc_from_obj(load_json_message(payload))
        return _csr(ids, counts, [0, len(ids)], self.n_features)

    def decode_many(self, payloads: Sequence[bytes]):
        """All documents at once, or None if any message fails.

        The fast path (:meth:`_decode_many_fast`) reads documents of integer
        ids and counts without a JSON parser; anything else is parsed message
        by message, and None means some message does not decode.
        """
        fast = self._decode_many_fast(payloads)
        if fast is not None:
            return fast
        ids, counts, indptr = [], [], [0]
        try:
            for p in payloads:
                i, c = _doc_from_obj(load_json_message(p))
                ids.extend(i)
                counts.extend(c)
                indptr.append(len(ids))
        except (DecodeError, TypeError):
            return None
        return _csr(ids, counts, indptr, self.n_features)

    def _decode_many_fast(self, payloads: Sequence[bytes]):
        """All documents at once when every message is a plain document of integers, else None.

        Each message must be ``{"ids": [...], "counts": [...]}`` spelled as
        ``json.dumps`` writes it (cut at its fixed parts), or match
        :data:`_PLAIN_DOC` (that, ``{"ids": [...]}`` or a bare array, any JSON
        whitespace, the keys spelled plainly and in that order); the text
        between the brackets is then read by
        :func:`~streamsvi.io.codecs.parse_int_arrays`, which accepts only the
        insides of flat arrays of JSON integers (so nothing else cut in with
        them: another key, a bracket, a string). The result is used only where decoding each
        message alone gives the same document: no id is negative or at least
        :data:`MAX_WORD_ID`, no count beyond 2**53 in magnitude, and every
        document has as many counts as ids. None otherwise (floats, other keys,
        a bad message): the caller parses message by message.
        """
        n = len(payloads)
        if n == 0:
            return _csr([], [], [0], self.n_features)
        match = _PLAIN_DOC.fullmatch
        id_texts, count_texts, has_counts = [], [], []
        try:
            for p in payloads:
                if p[:9] == b'{"ids": [' and p[-2:] == b"]}":      # as json.dumps writes it
                    i = p.find(b'], "counts": [', 9)
                    if i > 0:                    # anything else cut in: parse_int_arrays refuses it
                        id_texts.append(p[9:i])
                        count_texts.append(p[i + 14:-2])
                        has_counts.append(True)
                        continue
                m = match(p)
                if m is None:
                    return None
                ids_text, counts_text, bare = m.groups()
                if counts_text is None:
                    id_texts.append(bare if ids_text is None else ids_text)
                    has_counts.append(False)
                else:
                    id_texts.append(ids_text)
                    count_texts.append(counts_text)
                    has_counts.append(True)
        except (TypeError, AttributeError):      # not bytes (a tombstone's None, a str)
            return None
        ids = parse_int_arrays(b"[" + b"];[".join(id_texts) + b"];", n)
        if ids is None:
            return None
        ids, lengths = ids
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= MAX_WORD_ID):
            return None
        if count_texts:
            counted = parse_int_arrays(b"[" + b"];[".join(count_texts) + b"];", len(count_texts))
            if counted is None:
                return None
            values, count_lengths = counted
            flags = np.array(has_counts)
            if not np.array_equal(count_lengths, lengths[flags]) or \
                    (values.size and int(np.abs(values).max()) > 2 ** 53):
                return None
            if len(count_texts) == n:
                counts = values.astype(np.float64)
            else:
                counts = np.ones(ids.size)
                counts[np.repeat(flags, lengths)] = values
        else:
            counts = np.ones(ids.size)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        return _csr(ids, counts, indptr, self.n_features)

    def encode_rows(self, x) -> bytes:
        """One document (a 1-row part) as standard JSON."""
        X = _as_csr(x)
        if X.shape[0] != 1:
            raise ValueError(f"the json codec carries one document per message, got {X.shape[0]}")
        return json.dumps(_doc_json(X, 0)).encode()


def _as_csr(x) -> sp.csr_matrix:
    X = x.tocsr() if sp.issparse(x) else sp.csr_matrix(np.atleast_2d(np.asarray(x, dtype=np.float64)))
    return X


def _num(v: float):
    return int(v) if float(v).is_integer() and abs(v) < 2 ** 53 else float(v)


def _doc_json(X: sp.csr_matrix, i: int) -> dict:
    lo, hi = X.indptr[i], X.indptr[i + 1]
    return {"ids": X.indices[lo:hi].tolist(), "counts": [_num(v) for v in X.data[lo:hi].tolist()]}


class BowBinaryCodec:
    """A minibatch of documents per message as CSR arrays (little-endian, no pickle).

    Layout::

        offset  size  field
        0       4     magic b"SSVW"
        4       1     format version (1)
        5       1     count dtype: 1 = float32, 2 = float64, 3 = uint32
        6       2     reserved, must be 0
        8       4     n_rows (uint32)
        12      4     nnz (uint32)
        16      ...   indptr: n_rows + 1 uint32 (0, …, nnz, non-decreasing)
                      indices: nnz uint32 word ids
                      counts: nnz values of the count dtype

    Parameters
    ----------
    n_features : int
        V, the vocabulary size.
    dtype : {"float64", "float32", "uint32"}
        The count type :meth:`encode_rows` writes; :meth:`decode_rows` reads any.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> codec = BowBinaryCodec(5, dtype="uint32")
    >>> X = sp.csr_matrix([[0, 2, 0, 0, 1], [3, 0, 0, 0, 0]], dtype=float)
    >>> msg = codec.encode_rows(X)
    >>> len(msg), (codec.decode_rows(msg) != X).nnz
    (52, 0)
    """

    name = "binary"
    rows_per_message = None
    MAGIC = b"SSVW"
    VERSION = 1
    HEADER = struct.Struct("<4sBBHII")
    DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<u4")}
    _CODES = {"float32": 1, "float64": 2, "uint32": 3}

    def __init__(self, n_features: int, dtype: str = "float64"):
        self.n_features = _check_v(n_features)
        if dtype not in self._CODES:
            raise ValueError(f"dtype must be one of {sorted(self._CODES)}, got {dtype!r}")
        self.dtype = dtype

    def empty(self) -> sp.csr_matrix:
        """A batch with no documents."""
        return sp.csr_matrix((0, self.n_features))

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "dtype": self.dtype}

    def __repr__(self):
        return f"BowBinaryCodec(n_features={self.n_features}, dtype={self.dtype!r})"

    def decode_rows(self, payload: bytes) -> sp.csr_matrix:
        H = self.HEADER.size
        _, _, code, reserved, n, nnz = unpack_binary_header(payload, self.HEADER, self.MAGIC, self.VERSION)
        if code not in self.DTYPES:
            raise DecodeError("bad_dtype", f"count dtype code {code} is unknown "
                                           f"(1 = float32, 2 = float64, 3 = uint32)")
        if reserved != 0:
            raise DecodeError("bad_header", f"binary header reserved bytes must be 0, got {reserved}")
        dt = self.DTYPES[code]
        expected = H + 4 * (n + 1) + 4 * nnz + dt.itemsize * nnz
        check_binary_length(payload, expected, f"{n} documents and {nnz} entries")
        check_binary_rows(n, "documents")
        indptr = np.frombuffer(payload, "<u4", n + 1, H).astype(np.int64)
        if indptr[0] != 0 or indptr[-1] != nnz or np.any(np.diff(indptr) < 0):
            raise DecodeError("bad_indptr", f"indptr must run non-decreasing from 0 to nnz={nnz}, "
                                            f"got {indptr[0]}..{indptr[-1]}")
        indices = np.frombuffer(payload, "<u4", nnz, H + 4 * (n + 1)).astype(np.int64)
        counts = np.frombuffer(payload, dt, nnz, H + 4 * (n + 1) + 4 * nnz).astype(np.float64)
        return _csr(indices, counts, indptr, self.n_features)

    def decode_many(self, payloads: Sequence[bytes]):
        try:
            parts = [self.decode_rows(p) for p in payloads]
        except (DecodeError, TypeError):
            return None
        return concat_csr(parts, self.n_features)

    def encode_rows(self, x) -> bytes:
        """A CSR (or dense) part of n documents as one message."""
        X = _as_csr(x)
        check_encodable_rows(X.shape[0], "documents")
        if X.shape[0] >= 2 ** 32 or X.nnz >= 2 ** 32:
            raise ValueError("a binary message holds fewer than 2**32 documents and entries")
        if X.nnz and (X.data.min() < 0 or not np.isfinite(X.data).all()) and self.dtype == "uint32":
            raise ValueError("uint32 counts must be finite and >= 0")
        code = self._CODES[self.dtype]
        head = self.HEADER.pack(self.MAGIC, self.VERSION, code, 0, X.shape[0], X.nnz)
        return b"".join([head, X.indptr.astype("<u4").tobytes(), X.indices.astype("<u4").tobytes(),
                         X.data.astype(self.DTYPES[code]).tobytes()])


_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def tokenize(text: str) -> list[str]:
    """Lower-cased runs of two or more word characters (CountVectorizer's default)."""
    return _TOKEN.findall(text.lower())


def load_vocabulary(path) -> dict[str, int]:
    """word -> id from a file with one word per line (line i is id i; blank lines skipped)."""
    vocab: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for w in (ln.strip() for ln in f):
            if w:
                if w in vocab:
                    raise ValueError(f"vocabulary file {path} lists {w!r} twice")
                vocab[w] = len(vocab)
    if not vocab:
        raise ValueError(f"vocabulary file {path} is empty")
    return vocab


class TextCodec:
    """One document per message as raw text (see module docs).

    Parameters
    ----------
    n_features : int
        V. With a vocabulary it must be at least the vocabulary's size; with
        hashing it is the number of buckets.
    vocabulary : str, Path, dict or None
        A vocabulary file, a word -> id dict, or None for the hashing trick.

    Examples
    --------
    >>> codec = TextCodec(4, vocabulary={"stream": 0, "topic": 1, "model": 2})
    >>> codec.decode_rows("Topic model, topic model: a stream!".encode()).toarray().tolist()
    [[1.0, 2.0, 2.0, 0.0]]
    >>> TextCodec(1024).decode_rows(b"hash me hash").sum()
    np.float64(3.0)
    """

    name = "text"
    rows_per_message = 1

    def __init__(self, n_features: int, vocabulary=None):
        self.n_features = _check_v(n_features)
        self.vocabulary_path = None
        if vocabulary is None:
            self.vocab = None
        elif isinstance(vocabulary, dict):
            self.vocab = dict(vocabulary)
        else:
            self.vocabulary_path = str(vocabulary)
            self.vocab = load_vocabulary(Path(vocabulary))
        if self.vocab is not None and len(self.vocab) > self.n_features:
            raise ValueError(f"vocabulary has {len(self.vocab)} words, more than "
                             f"n_features={self.n_features}")

    def empty(self) -> sp.csr_matrix:
        """A batch with no documents."""
        return sp.csr_matrix((0, self.n_features))

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "vocabulary": self.vocabulary_path,
                "hashing": self.vocab is None}

    def __repr__(self):
        return (f"TextCodec(n_features={self.n_features}, "
                f"vocabulary={self.vocabulary_path if self.vocab is not None else 'hashing'!r})")

    def ids(self, text: str) -> list[int]:
        toks = tokenize(text)
        if self.vocab is None:
            V = self.n_features
            return [zlib.crc32(t.encode("utf-8")) % V for t in toks]
        get = self.vocab.get
        return [i for i in (get(t) for t in toks) if i is not None]

    def decode_rows(self, payload: bytes) -> sp.csr_matrix:
        try:
            text = bytes(payload).decode("utf-8")
        except (UnicodeDecodeError, TypeError) as exc:
            raise DecodeError("not_text", f"message is not UTF-8 text: {exc}") from None
        ids = self.ids(text)
        return _csr(ids, np.ones(len(ids)), [0, len(ids)], self.n_features)

    def decode_many(self, payloads):
        try:
            parts = [self.decode_rows(p) for p in payloads]
        except DecodeError:
            return None
        return concat_csr(parts, self.n_features)

    def encode_rows(self, x) -> bytes:
        raise ValueError("the text codec only decodes (a bag of words has lost its text); "
                         "use the json or binary codec to write documents")


class BowValidator:
    """Per-document checks on decoded bags of words (reason codes in the module docs).

    Parameters
    ----------
    n_features : int
        V: ids must be < V.
    max_count : float
        Largest accepted count of one word in one document.
    max_message_bytes : int
        Largest accepted raw message.
    """

    def __init__(self, n_features: int, max_count: float = 1e12, max_message_bytes: int = 1_048_576):
        self.n_features = _check_v(n_features)
        try:
            max_count = float(max_count)
        except (TypeError, ValueError):
            raise ValueError(f"max_count must be a positive number, got {max_count!r}") from None
        if not max_count > 0 or math.isnan(max_count):
            raise ValueError(f"max_count must be a positive number, got {max_count!r}")
        if isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, (int, np.integer)) \
                or max_message_bytes < 1:
            raise ValueError(f"max_message_bytes must be an integer >= 1, got {max_message_bytes!r}")
        self.max_count = max_count
        self.max_message_bytes = int(max_message_bytes)

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "max_count": self.max_count,
                "max_message_bytes": self.max_message_bytes}

    def check_size(self, payload: bytes):
        return check_message_size(payload, self.max_message_bytes)

    def _row_flags(self, X):
        n = X.shape[0]
        rows = np.repeat(np.arange(n), np.diff(X.indptr))
        d = X.data
        fin = np.isfinite(d)
        flags = {
            "id_out_of_range": X.indices >= self.n_features,
            "non_finite": ~fin,
            "bad_count": fin & (d < 0),
            "out_of_range": fin & (d > self.max_count),
        }
        out = {k: np.bincount(rows[v], minlength=n) > 0 for k, v in flags.items()}
        pos = np.bincount(rows[fin & (d > 0)], minlength=n) > 0
        out["empty_document"] = ~pos
        return out

    def all_valid(self, X) -> bool:
        """True if every document passes :meth:`validate`."""
        if not sp.issparse(X) or X.shape[1] < self.n_features:
            return False
        if X.shape[0] == 0:
            return True
        d = X.data
        if X.shape[1] > self.n_features and X.nnz and X.indices.max() >= self.n_features:
            return False
        if d.size and not (np.isfinite(d).all() and d.min() >= 0 and d.max() <= self.max_count):
            return False
        return bool(np.all(np.diff(X.indptr) > 0)) and bool(
            (np.bincount(np.repeat(np.arange(X.shape[0]), np.diff(X.indptr))[d > 0],
                         minlength=X.shape[0]) > 0).all())

    def validate(self, X):
        """(good documents as CSR (m, V), [(row, reason, message), ...])."""
        X = _as_csr(X)
        V = self.n_features
        if X.shape[1] < V:
            X = sp.csr_matrix((X.data, X.indices, X.indptr), shape=(X.shape[0], V))
        flags = self._row_flags(X)
        bad_any = np.zeros(X.shape[0], dtype=bool)
        for v in flags.values():
            bad_any |= v
        rejected = []
        for i in np.flatnonzero(bad_any):
            i = int(i)
            lo, hi = X.indptr[i], X.indptr[i + 1]
            ids, d = X.indices[lo:hi], X.data[lo:hi]
            if flags["id_out_of_range"][i]:
                w = int(ids[ids >= V].max())
                rejected.append((i, "id_out_of_range", f"word id {w} is outside the vocabulary "
                                                       f"(ids must be < n_features={V})"))
            elif flags["non_finite"][i]:
                rejected.append((i, "non_finite", f"a count is {d[~np.isfinite(d)][0]!r}"))
            elif flags["bad_count"][i]:
                rejected.append((i, "bad_count", f"count {d[d < 0][0]!r} of word {int(ids[d < 0][0])} "
                                                 f"is negative"))
            elif flags["out_of_range"][i]:
                rejected.append((i, "out_of_range", f"count {d[d > self.max_count][0]!r} is above "
                                                    f"max_count={self.max_count!r}"))
            else:
                rejected.append((i, "empty_document", "the document has no word with a positive "
                                                      "count (after the vocabulary)"))
        good = X[~bad_any] if rejected else X
        if good.shape[1] != V:
            good = sp.csr_matrix((good.data, good.indices, good.indptr), shape=(good.shape[0], V))
        return good, rejected


class BowKind(RecordKind):
    """Bags of words as CSR matrices (see the module docs).

    Examples
    --------
    >>> from streamsvi.models import LDA
    >>> kind = BowKind()
    >>> model = LDA(n_components=2, n_features=10)
    >>> part = kind.from_json([{"ids": [1, 4], "counts": [2, 1]}, {"ids": [9]}], model)
    >>> kind.n_records(part), kind.to_json(kind.take(part, slice(1, 2)))
    (2, [{'ids': [9], 'counts': [1]}])
    """

    name = "bow"
    codec_names = ("json", "binary", "text")
    settings = {
        "count_dtype": Setting("str", "float64", "type of the counts in a binary message: float64, "
                               "float32 or uint32 (what the producer wrote)",
                               choices=("float64", "float32", "uint32")),
    }

    def make_codec(self, name, model, options):
        V = model.n_features
        if name == "json":
            return BowJsonCodec(V)
        if name == "binary":
            return BowBinaryCodec(V, dtype=options.get("count_dtype") or self.settings["count_dtype"].default)
        if name == "text":
            return TextCodec(V, vocabulary=options.get("vocabulary"))
        raise ValueError(f"codec must be one of {list(self.codec_names)} for bag-of-words "
                         f"records, got {name!r}")

    def make_validator(self, model, options):
        return BowValidator(model.n_features, max_count=options.get("max_abs", 1e12),
                            max_message_bytes=options.get("max_message_bytes", 1_048_576))

    def concat(self, parts):
        if not parts:
            raise ValueError("concat needs at least one part")
        return concat_csr(parts, max(p.shape[1] for p in parts))

    def empty(self, model):
        return sp.csr_matrix((0, model.n_features))

    def to_json(self, part) -> list:
        X = _as_csr(part)
        return [_doc_json(X, i) for i in range(X.shape[0])]

    def from_json(self, values, model):
        ids, counts, indptr = [], [], [0]
        for k, v in enumerate(values):
            i, c = _doc_from_obj(v, where=f"document {k}")
            ids.extend(i)
            counts.extend(c)
            indptr.append(len(ids))
        return _csr(ids, counts, indptr, model.n_features)


register_kind(BowKind())
