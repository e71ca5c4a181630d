""":class:`MemorySource`: rows of an in-memory array (tests, notebooks, the engine's benchmarks).
"""
from __future__ import annotations

import numpy as np

from ..dense import DenseKind, RecordValidator
from ..records import RecordKind
from .base import (Batch, Offsets, Source, SourceError, _BatchBuilder, _check_offsets, _check_poll_args,
                   _DENSE)

class MemorySource(Source):
    """Rows of an in-memory array, one "message" per row (for tests and notebooks).

    Parameters
    ----------
    x : array_like, shape (n, D)
        The records; row i has offset i.
    validator : RecordValidator, optional
        Default ``RecordValidator(D)``. Rejected rows become dead letters
        whose payload is the row as JSON.
    name : str
        The source name used in positions and offsets.
    kind : RecordKind, optional
        Default dense rows. For another kind ``x`` is a batch of that kind
        (e.g. a CSR matrix) and ``validator`` is required; dead-letter
        payloads are the kind's JSON form of the record.
    """

    def __init__(self, x, validator: RecordValidator | None = None, name: str = "memory",
                 kind: RecordKind | None = None):
        self.kind = kind or _DENSE
        if isinstance(self.kind, DenseKind):
            x = np.asarray(x, dtype=np.float64)
            if x.ndim != 2:
                raise ValueError(f"x must be 2-D (records × features), got shape {x.shape}")
            self.n_features = x.shape[1]
            self.validator = validator or RecordValidator(self.n_features)
            if self.validator.n_features != self.n_features:
                raise ValueError(f"validator expects n_features={self.validator.n_features}, "
                                 f"x has {self.n_features} columns")
        else:
            if validator is None:
                raise ValueError(f"MemorySource with {self.kind.name!r} records needs a validator")
            self.n_features, self.validator = None, validator
        self.x = x
        self._n = self.kind.n_records(x)
        self.name = name
        self._pos = 0

    def poll_batch(self, max_records: int, max_wait_s: float = 0.0) -> Batch | None:
        _check_poll_args(max_records, max_wait_s)
        b = _BatchBuilder(None, self.validator, self.n_features, self.kind, self.track_positions)
        while b.n_rows < max_records and self._pos < self._n:
            stop = min(self._pos + (max_records - b.n_rows), self._n)
            b.add_rows(self.name, self._pos, self.kind.take(self.x, slice(self._pos, stop)))
            self._pos = stop
        return b.batch()

    def seek(self, offsets):
        for key, off in _check_offsets(offsets).items():
            if key != (self.name, 0):
                raise SourceError(f"MemorySource {self.name!r} cannot seek to {key}: "
                                  f"its only partition is ({self.name!r}, 0)")
            self._pos = min(off, self._n)

    def lag(self) -> Offsets:
        return {(self.name, 0): self._n - self._pos}

    def exhausted(self) -> bool:
        return self._pos >= self._n
