"""Record validation: which decoded rows may reach the model.

A record that fails a check never reaches the model; the source turns it into
a dead letter with the reason code (docs/design.md, "Record kinds").
Checks and their reason codes:

``too_large``     the raw message is longer than ``max_message_bytes``
``wrong_shape``   a row does not have n_features values
``non_finite``    a value is NaN or ±inf
``out_of_range``  |value| > ``max_abs``

Rows are judged one by one: in a binary minibatch message a bad row rejects
only that row.

Examples
--------
>>> import numpy as np
>>> v = RecordValidator(2, max_abs=100.0)
>>> good, bad = v.validate(np.array([[1.0, 2.0], [np.nan, 0.0], [5.0, 1e3]]))
>>> good.tolist()
[[1.0, 2.0]]
>>> [(i, reason) for i, reason, _ in bad]
[(1, 'non_finite'), (2, 'out_of_range')]
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["RecordValidator", "Rejection", "check_message_size"]

#: (row index, reason code, message)
Rejection = tuple[int, str, str]


def check_message_size(payload: bytes, max_message_bytes: int) -> tuple[str, str] | None:
    """``("too_large", message)`` if ``payload`` is longer than the limit, else None
    (the size check of every record kind's validator)."""
    n = len(payload)
    if n > max_message_bytes:
        return "too_large", f"message has {n} bytes, more than max_message_bytes={max_message_bytes}"
    return None


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
                rejected.append((i, "non_finite", f"value in column {j} is {x[i, j]!r}, "
                                                  f"expected a finite number"))
            else:
                j = int(np.flatnonzero(too_big[i])[0])
                rejected.append((i, "out_of_range", f"value in column {j} is {x[i, j]!r}, "
                                                    f"|value| must be <= max_abs={self.max_abs!r}"))
        return x[ok], rejected
