"""What every record kind's validator shares.

A kind's validator decides which decoded records may reach the model; a
record that fails a check never does: the source turns it into a dead letter
with the reason code (docs/design.md, "Record kinds"). Each kind's validator
lives in its kind's module (:class:`streamsvi.io.dense.RecordValidator`,
:mod:`streamsvi.io.bow`, :mod:`streamsvi.io.sequences`,
:mod:`streamsvi.io.ratings`). Shared here: :func:`check_message_size` (the
``too_large`` check on the raw message), :data:`Rejection`, the type of
one rejected record, and :func:`validate_safely` / :func:`all_valid_safely`,
through which every reader runs a validator so that a record no check foresaw
is rejected (``validator_error``) instead of stopping the reader.

Examples
--------
>>> check_message_size(b"[1, 2]", 100) is None
True
>>> check_message_size(b"[1, 2]", 4)[0]
'too_large'
"""
from __future__ import annotations

__all__ = ["Rejection", "check_message_size", "validate_safely", "all_valid_safely", "ModelChecked"]

#: (row index, reason code, message)
Rejection = tuple[int, str, str]


def check_message_size(payload: bytes, max_message_bytes: int) -> tuple[str, str] | None:
    """``("too_large", message)`` if ``payload`` is longer than the limit, else None
    (the size check of every record kind's validator)."""
    n = len(payload)
    if n > max_message_bytes:
        return "too_large", f"message has {n} bytes, more than max_message_bytes={max_message_bytes}"
    return None


def all_valid_safely(validator, x) -> bool:
    """``validator.all_valid(x)``; False (the caller then checks one by one) if it raises."""
    try:
        return bool(validator.all_valid(x))
    except Exception:  # noqa: BLE001 - the slow path names the culprit
        return False


def validate_safely(validator, kind, x):
    """``validator.validate(x)``; if it raises, each record alone, and one that raises is rejected.

    A validator that fails on a record it did not foresee rejects that record
    as ``validator_error``, with the exception named, instead of stopping the
    reader on it (a poison pill); the other records are judged as usual.
    ``kind`` (a :class:`~streamsvi.io.records.RecordKind`) slices and joins the part.
    """
    try:
        return validator.validate(x)
    except Exception:  # noqa: BLE001 - fall through to the record-by-record path
        pass
    goods, rejected = [], []
    for i in range(kind.n_records(x)):
        one = kind.take(x, slice(i, i + 1))
        try:
            good, bad = validator.validate(one)
        except Exception as exc:  # noqa: BLE001
            rejected.append((i, "validator_error", f"{type(validator).__name__} raised "
                                                   f"{type(exc).__name__}: {str(exc)[:200]}"))
            continue
        rejected.extend((i, reason, message) for _, reason, message in bad)
        if kind.n_records(good):
            goods.append(good)
    return (kind.concat(goods) if goods else kind.take(x, slice(0, 0))), rejected


class ModelChecked:
    """A kind's validator followed by the model's own check of a batch (``model_check``).

    A model refuses a batch it cannot learn from with ``ValueError`` (its
    ``check_batch``: a Poisson count that is negative, a word id beyond its
    vocabulary). Met in the update, that stopped the daemon at every restart on
    the same record. Here, after the kind's checks, the accepted records are
    given to ``check``; if it refuses them, each record is checked alone and the
    ones it refuses are rejected as ``model_check`` with the model's message.
    The other records go on. ``check`` is the model's ``check_batch`` (io/ never
    imports a model: the caller passes the function); anything else is the
    kind's validator's (``check_size``, its settings).
    """

    def __init__(self, validator, check, kind):
        self.validator, self.check, self.kind = validator, check, kind

    def __getattr__(self, name):
        return getattr(self.validator, name)

    def __repr__(self):
        return f"ModelChecked({self.validator!r})"

    def _passes(self, part) -> bool:
        try:
            self.check(part)
            return True
        except ValueError:
            return False

    def all_valid(self, x) -> bool:
        return bool(self.validator.all_valid(x)) and self._passes(x)

    def validate(self, x):
        good, rejected = self.validator.validate(x)
        n = self.kind.n_records(good)
        if not n or self._passes(good):
            return good, rejected
        gone = {i for i, _, _ in rejected}
        index = [i for i in range(n + len(gone)) if i not in gone][:n]   # good's rows in x
        keep = []
        for j in range(n):
            one = self.kind.take(good, slice(j, j + 1))
            try:
                self.check(one)
                keep.append(one)
            except ValueError as exc:
                rejected.append((index[j], "model_check", str(exc)[:300]))
        rejected.sort(key=lambda r: r[0])
        return (self.kind.concat(keep) if keep else self.kind.take(good, slice(0, 0))), rejected
