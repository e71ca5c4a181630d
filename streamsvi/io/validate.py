"""What every record kind's validator shares.

A kind's validator decides which decoded records may reach the model; a
record that fails a check never does: the source turns it into a dead letter
with the reason code (docs/design.md, "Record kinds"). Each kind's validator
lives in its kind's module (:class:`streamsvi.io.dense.RecordValidator`,
:mod:`streamsvi.io.bow`, :mod:`streamsvi.io.sequences`,
:mod:`streamsvi.io.ratings`). Shared here: :func:`check_message_size` (the
``too_large`` check on the raw message) and :data:`Rejection`, the type of
one rejected record.

Examples
--------
>>> check_message_size(b"[1, 2]", 100) is None
True
>>> check_message_size(b"[1, 2]", 4)[0]
'too_large'
"""
from __future__ import annotations

__all__ = ["Rejection", "check_message_size"]

#: (row index, reason code, message)
Rejection = tuple[int, str, str]


def check_message_size(payload: bytes, max_message_bytes: int) -> tuple[str, str] | None:
    """``("too_large", message)`` if ``payload`` is longer than the limit, else None
    (the size check of every record kind's validator)."""
    n = len(payload)
    if n > max_message_bytes:
        return "too_large", f"message has {n} bytes, more than max_message_bytes={max_message_bytes}"
    return None
