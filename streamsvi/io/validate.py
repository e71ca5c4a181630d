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

__all__ = ["Rejection", "check_message_size", "validate_safely", "all_valid_safely"]

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
