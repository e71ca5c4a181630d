"""The "labelled" record kind: D features and a class label (logistic regression).

A decoded part is a float64 array of shape ``(n, D + 1)``: the features, then
the label in the last column (what
:meth:`streamsvi.models.logistic.BayesianLogisticRegression.check_batch`
takes). Two message layouts:

* :class:`LabelledJsonCodec` (``json``) — one record per message, a JSON
  object ``{"x": [x_1, ..., x_D], "y": 1}``; with ``source.fields`` the
  features are those named fields of the object, in order, and the label is
  under ``"y"`` (``"label"`` is accepted too). Other keys are ignored.
* ``binary`` — the dense :class:`~streamsvi.io.dense.BinaryBatchCodec` with
  D + 1 columns, the label last (its 16-byte header, float64 or float32 rows,
  no pickle).

Scoring (``streamsvi score``) reads the same JSON with the label optional
(:meth:`LabelledKind.scoring_codec_validator`): an unlabelled record decodes
with a NaN label and is scored without its log-likelihood.

Labels are the classes 0, …, C − 1 of the model (0 and 1 for binary
logistic regression); JSON labels must be integers (``true``/``false`` and
strings are refused), binary labels whole numbers.

Reason codes: those of the dense codecs (``json_invalid``, ``wrong_shape``,
``not_numeric``, ``missing_field``, the binary layout errors, ``empty_batch``),
and from the validator:

``too_large``      the raw message is over ``max_message_bytes``
``wrong_shape``    not D features (JSON: the codec; binary: the header's columns)
``bad_label``      the label is missing, not an integer, or not a known class
``non_finite``     a feature is NaN or ±inf
``out_of_range``   |feature| > ``max_abs``

Examples
--------
>>> codec = LabelledJsonCodec(2)
>>> codec.decode_rows(b'{"x": [0.5, -1], "y": 1}').tolist()
[[0.5, -1.0, 1.0]]
>>> v = LabelledValidator(2, n_classes=2)
>>> good, bad = v.validate(np.array([[1.0, 2.0, 1.0], [np.nan, 0.0, 0.0], [1.0, 1.0, 3.0]]))
>>> good.tolist(), [(i, r) for i, r, _ in bad]
([[1.0, 2.0, 1.0]], [(1, 'non_finite'), (2, 'bad_label')])
"""
from __future__ import annotations

import json
import math
import re
from operator import methodcaller
from typing import Sequence

import numpy as np

from .codecs import DecodeError, json_integer, load_json_message, short_json
from .dense import BinaryBatchCodec, RecordValidator
from .records import RecordKind, register_kind
from .validate import check_message_size

try:  # as in codecs.py: the fast path parses the joined features with orjson when it is installed
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

__all__ = ["LabelledJsonCodec", "LabelledValidator", "LabelledKind"]

_LABEL_KEYS = ("y", "label")


def _feature(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DecodeError("not_numeric", f"{where} must be a number, got {type(value).__name__} "
                                         f"{short_json(value)}")
    try:
        return float(value)
    except OverflowError:
        raise DecodeError("out_of_range", f"{where} = {short_json(value)} does not fit in a float64") from None


_WS = rb"[ \t\n\r]*"            # JSON whitespace (not \f or \v, which re's \s would allow)
_X = rb'"x"' + _WS + rb":" + _WS + rb"\[([^\]]*)\]"
_Y = rb'"y"' + _WS + rb":" + _WS + rb"(-?[0-9]+)"
#: A plain labelled record: ``{"x": [...], "y": <integer>}`` (or ``y`` first), any JSON
#: whitespace, nothing else in the object. Groups: x's inside and y, or y and x's inside.
_PLAIN_RECORD = re.compile(_WS + rb"\{" + _WS + rb"(?:" + _X + _WS + rb"," + _WS + _Y + rb"|" + _Y + _WS
                           + rb"," + _WS + _X + rb")" + _WS + rb"\}" + _WS)
#: bytes of JSON numbers, commas and whitespace: what x's inside may hold on the fast path
#: (no NaN or Infinity: the stdlib alone reads those, message by message)
_NUMBER_BYTES = b"0123456789+-.eE, \t\n\r"
_count_commas = methodcaller("count", b",")


class LabelledJsonCodec:
    """One labelled record per message: ``{"x": [...], "y": label}`` (or named ``fields`` and ``y``)."""

    name = "json"
    rows_per_message = 1

    def __init__(self, n_features: int, fields: Sequence[str] | None = None, optional_label: bool = False):
        self.optional_label = bool(optional_label)
        if isinstance(n_features, bool) or not isinstance(n_features, (int, np.integer)) or n_features < 1:
            raise ValueError(f"n_features must be an integer >= 1, got {n_features!r}")
        if fields is not None and (isinstance(fields, str) or len(fields) != n_features
                                   or not all(isinstance(f, str) for f in fields)):
            raise ValueError(f"fields must be {n_features} names, got {fields!r}")
        self.n_inputs = int(n_features)
        #: columns of a decoded row (features + label), what the sources check codec and validator by
        self.n_features = self.n_inputs + 1
        self.fields = None if fields is None else list(fields)

    def get_params(self) -> dict:
        return {"n_features": self.n_inputs, "fields": self.fields}

    def __repr__(self):
        return f"LabelledJsonCodec(n_features={self.n_inputs}, fields={self.fields!r})"

    def decode(self, payload: bytes) -> np.ndarray:
        """One record as a (D + 1,) float64 row, label last."""
        obj = load_json_message(payload)
        if not isinstance(obj, dict):
            raise DecodeError("wrong_shape", f"expected a JSON object with \"x\" (the features) and "
                                             f"\"y\" (the label), got {type(obj).__name__} {short_json(obj)}")
        key = next((k for k in _LABEL_KEYS if k in obj), None)
        if key is None and self.optional_label:
            y = math.nan
        elif key is None:
            raise DecodeError("bad_label", f"record has no label: expected a field \"y\" (or \"label\"); "
                                           f"keys: {sorted(obj)[:10]}")
        else:
            y = obj[key]
        if key is not None and json_integer(y) is None:       # the rule of word ids and symbols
            raise DecodeError("bad_label", f"label {key!r} must be an integer class, got "
                                           f"{type(y).__name__} {short_json(y)}")
        D = self.n_inputs
        if self.fields is not None:
            missing = [f for f in self.fields if f not in obj]
            if missing:
                raise DecodeError("missing_field", f"JSON object lacks field(s) {missing[:5]}")
            row = [_feature(obj[f], f"field {f!r}") for f in self.fields]
        else:
            if "x" not in obj:
                raise DecodeError("missing_field", f"JSON object lacks \"x\" (the {D} features); "
                                                   f"keys: {sorted(obj)[:10]}")
            xs = obj["x"]
            if not isinstance(xs, list):
                raise DecodeError("wrong_shape", f"\"x\" must be an array of {D} numbers, got "
                                                 f"{type(xs).__name__} {short_json(xs)}")
            if len(xs) != D:
                raise DecodeError("wrong_shape", f"\"x\" has {len(xs)} values, expected n_features={D}")
            if all(type(v) is float or type(v) is int for v in xs):   # the common case: one conversion
                try:
                    out = np.empty(D + 1)
                    out[:D] = xs
                    out[D] = y
                    return out
                except OverflowError:
                    pass
            row = [_feature(v, f"x[{i}]") for i, v in enumerate(xs)]
        row.append(float(y))
        return np.array(row, dtype=np.float64)

    def decode_rows(self, payload: bytes) -> np.ndarray:
        return self.decode(payload)[None, :]

    def decode_many(self, payloads: Sequence[bytes]) -> np.ndarray | None:
        """The rows of many messages at once, or None if any message fails.

        The fast path (:meth:`_decode_many_fast`) parses the features of all
        plain records in one go; otherwise each message is decoded by
        :meth:`decode`.
        """
        fast = self._decode_many_fast(payloads)
        if fast is not None:
            return fast
        try:
            rows = [self.decode(p) for p in payloads]
        except DecodeError:
            return None
        if not rows:
            return np.empty((0, self.n_features))
        return np.vstack(rows)

    def _decode_many_fast(self, payloads: Sequence[bytes]) -> np.ndarray | None:
        """What :meth:`decode_many` gives when every message is a plain record; else None.

        A plain record is ``{"x": [...], "y": ...}`` spelled as ``json.dumps``
        writes it (cut at its fixed parts), or matches :data:`_PLAIN_RECORD`
        (any JSON whitespace, ``y`` first or second). The insides of all x
        arrays are then joined by commas and parsed as one JSON array, and the
        labels likewise. Row i is message i because the insides hold only
        number bytes (:data:`_NUMBER_BYTES`: no bracket, so not a nested array;
        no letter or quote, so not a bool, null, string or another key) and
        each exactly D − 1 commas, and the labels only digits and minus signs:
        the parse fails (None) unless every element is a valid number, so each
        inside is D numbers and each label an integer. None too unless there
        are n labels. With ``fields`` there is no fast path.
        """
        n = len(payloads)
        if self.fields is not None or _orjson is None or n == 0:
            return None
        match = _PLAIN_RECORD.fullmatch
        xs, ys = [], []
        try:
            for p in payloads:
                if p[:7] == b'{"x": [' and p[-1:] == b"}":    # as json.dumps writes it
                    i = p.find(b'], "y": ', 7)
                    if i > 0:
                        xs.append(p[7:i])
                        ys.append(p[i + 8:-1])
                        continue
                m = match(p)
                if m is None:
                    return None
                x1, y1, y2, x2 = m.groups()
                xs.append(x2 if x1 is None else x1)
                ys.append(y1 if y2 is None else y2)
        except (TypeError, AttributeError):      # not bytes (a tombstone's None, a str)
            return None
        D = self.n_inputs
        values = b",".join(xs)
        labels = b",".join(ys)
        if values.translate(None, _NUMBER_BYTES) or labels.translate(None, b"0123456789-,") \
                or set(map(_count_commas, xs)) != {D - 1}:
            return None
        try:
            values = _orjson.loads(b"[" + values + b"]")
            labels = _orjson.loads(b"[" + labels + b"]")
        except _orjson.JSONDecodeError:          # an invalid number, an empty element, 1e999
            return None
        if len(values) != n * D or len(labels) != n:
            return None
        out = np.empty((n, D + 1))
        try:
            out[:, :D] = np.array(values, dtype=np.float64).reshape(n, D)
            out[:, D] = labels
        except (OverflowError, ValueError, TypeError):  # pragma: no cover - orjson's numbers fit
            return None
        return out

    def encode_rows(self, x) -> bytes:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        if x.shape != (1, self.n_features):
            raise ValueError(f"the JSON codec carries one record of {self.n_inputs} features and a "
                             f"label per message, got shape {x.shape}")
        feats, y = x[0, :-1], x[0, -1]
        if not np.isfinite(feats).all() or not math.isfinite(y):
            raise ValueError("JSON cannot carry NaN or infinite values")
        label = int(y) if y == int(y) else float(y)
        if self.fields is not None:
            return json.dumps({**dict(zip(self.fields, feats.tolist())), "y": label}).encode()
        return json.dumps({"x": feats.tolist(), "y": label}).encode()

    def empty(self) -> np.ndarray:
        return np.empty((0, self.n_features))


class LabelledValidator:
    """Row checks: finite features within ``max_abs`` and a label in {0, …, n_classes − 1}.

    Parameters
    ----------
    n_features : int
        D. n_classes : int, C (2 for binary). max_abs, max_message_bytes : as
        :class:`~streamsvi.io.dense.RecordValidator`.
    """

    def __init__(self, n_features: int, n_classes: int = 2, max_abs: float = 1e12,
                 max_message_bytes: int = 1_048_576, optional_label: bool = False):
        self.optional_label = bool(optional_label)   # scoring: a NaN label means "no label"
        if isinstance(n_classes, bool) or not isinstance(n_classes, (int, np.integer)) or n_classes < 2:
            raise ValueError(f"n_classes must be an integer >= 2, got {n_classes!r}")
        self.features = RecordValidator(n_features, max_abs=max_abs, max_message_bytes=max_message_bytes)
        self.n_inputs = int(n_features)
        #: columns of a decoded row (features + label), as the codecs'
        self.n_features = self.n_inputs + 1
        self.n_classes = int(n_classes)
        self.max_abs = self.features.max_abs
        self.max_message_bytes = self.features.max_message_bytes

    def get_params(self) -> dict:
        return {"n_features": self.n_inputs, "n_classes": self.n_classes, "max_abs": self.max_abs,
                "max_message_bytes": self.max_message_bytes}

    def __repr__(self):
        return "LabelledValidator(" + ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()) + ")"

    def check_size(self, payload: bytes):
        return check_message_size(payload, self.max_message_bytes)

    def _label_ok(self, y):
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(y) & (y == np.round(y)) & (y >= 0) & (y <= self.n_classes - 1)
        return ok | np.isnan(y) if self.optional_label else ok

    def all_valid(self, x) -> bool:
        if x.ndim != 2 or x.shape[1] != self.n_features:
            return False
        return self.features.all_valid(x[:, :-1]) and bool(self._label_ok(x[:, -1]).all())

    def validate(self, x):
        """(accepted rows, [(row, reason, message), ...]); a bad label is checked first."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim == 1:
            x = x[None, :]
        D = self.n_inputs
        if x.ndim != 2 or x.shape[1] != D + 1:
            n = x.shape[0] if x.ndim == 2 else 1
            return (np.empty((0, D + 1)),
                    [(i, "wrong_shape", f"record has {x.shape[-1] - 1 if x.ndim == 2 else '?'} features, "
                                        f"expected n_features={D}") for i in range(n)])
        label_ok = self._label_ok(x[:, -1])
        _, feat_bad = self.features.validate(x[:, :-1])
        bad = {}
        for i in np.flatnonzero(~label_ok).tolist():
            bad[i] = (i, "bad_label", f"label is {float(x[i, -1])!r}, expected one of the classes "
                                      f"0..{self.n_classes - 1}")
        for i, reason, msg in feat_bad:
            bad.setdefault(i, (i, reason, msg))
        if not bad:
            return x, []
        ok = np.ones(x.shape[0], bool)
        ok[list(bad)] = False
        return x[ok], [bad[i] for i in sorted(bad)]


class LabelledKind(RecordKind):
    """Labelled records: an ``(n, D + 1)`` float64 array, label last.

    >>> kind = LabelledKind()
    >>> kind.to_json(np.array([[0.5, 2.0, 1.0]]))
    [{'x': [0.5, 2.0], 'y': 1}]
    """

    name = "labelled"
    codec_names = ("json", "binary")

    def make_codec(self, name, model, options):
        if name == "json":
            return LabelledJsonCodec(model.n_features, options.get("fields"))
        if name == "binary":
            return BinaryBatchCodec(model.n_features + 1)
        raise ValueError(f"codec for labelled records must be one of {list(self.codec_names)}, got {name!r}")

    def make_validator(self, model, options):
        return LabelledValidator(model.n_features, n_classes=model.n_classes,
                                 max_abs=options.get("max_abs", 1e12),
                                 max_message_bytes=options.get("max_message_bytes", 1_048_576))

    def scoring_codec_validator(self, model, fields, options):
        """The JSON codec and validator of ``streamsvi score``: the label is optional there."""
        return (LabelledJsonCodec(model.n_features, fields, optional_label=True),
                LabelledValidator(model.n_features, n_classes=model.n_classes,
                                  max_abs=options.get("max_abs", 1e12),
                                  max_message_bytes=options.get("max_message_bytes", 1_048_576),
                                  optional_label=True))

    def concat(self, parts):
        return np.concatenate(parts) if len(parts) != 1 else parts[0]

    def empty(self, model):
        return np.empty((0, model.n_features + 1))

    def to_json(self, part) -> list:
        part = np.asarray(part, dtype=np.float64)
        return [{"x": r[:-1].tolist(), "y": int(r[-1]) if math.isfinite(r[-1]) and r[-1] == int(r[-1])
                 else float(r[-1])} for r in part]

    def from_json(self, values, model):
        if not values:
            return self.empty(model)
        return np.array([[*v["x"], v["y"]] for v in values], dtype=np.float64)


register_kind(LabelledKind())
