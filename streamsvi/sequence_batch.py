"""A batch of variable-length symbol sequences (the records of the discrete HMM).

:class:`Sequences` is to sequence data what a CSR matrix is to bags of words:
all symbols of all sequences in one integer array, plus offsets. It is the
batch type of :class:`streamsvi.models.hmm.DiscreteHMM` and the *part* of the
``"sequences"`` record kind (:mod:`streamsvi.io.sequences`), so it lives here,
outside both the math and the I/O packages, and depends on numpy only.

The inference engine needs from a batch only ``batch.shape[0]`` and
``batch[int_array]``; :class:`Sequences` has both (and slices, ``len`` and
iteration).

Examples
--------
>>> s = Sequences.from_list([[0, 3, 1], [2], [1, 1]])
>>> s.shape, s.lengths.tolist(), s.n_symbols_total
((3,), [3, 1, 2], 6)
>>> s[[2, 0]].to_list()
[[1, 1], [0, 3, 1]]
>>> s[1:].to_list(), s[0].tolist()
([[2], [1, 1]], [0, 3, 1])
>>> Sequences.concat([s[:1], s[2:]]).to_list()
[[0, 3, 1], [1, 1]]
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

__all__ = ["Sequences"]


class Sequences:
    """``n`` integer sequences stored as concatenated symbols and offsets.

    Parameters
    ----------
    symbols : array_like of int, shape (m,)
        All symbols, sequence after sequence.
    offsets : array_like of int, shape (n + 1,)
        Sequence ``i`` is ``symbols[offsets[i]:offsets[i + 1]]``; ``offsets[0]
        = 0``, non-decreasing, ``offsets[-1] = m``. Empty sequences are
        representable (the validator of the record kind rejects them).

    Attributes
    ----------
    symbols : ndarray of int64, shape (m,)
    offsets : ndarray of int64, shape (n + 1,)
    """

    __slots__ = ("symbols", "offsets")

    def __init__(self, symbols, offsets):
        sym = np.asarray(symbols)
        off = np.asarray(offsets)
        if sym.ndim != 1 or (sym.size and sym.dtype.kind not in "iu"):
            raise ValueError(f"symbols must be a 1-D integer array, got dtype {sym.dtype} "
                             f"and shape {sym.shape}")
        if off.ndim != 1 or off.size < 1 or (off.dtype.kind not in "iu"):
            raise ValueError(f"offsets must be a 1-D integer array of n + 1 >= 1 values, got "
                             f"dtype {off.dtype} and shape {off.shape}")
        off = off.astype(np.int64, copy=False)
        if off[0] != 0 or off[-1] != sym.size or np.any(np.diff(off) < 0):
            raise ValueError(f"offsets must start at 0, be non-decreasing and end at "
                             f"len(symbols)={sym.size}; got {off[:5].tolist()}... ending at {off[-1]}")
        self.symbols = sym.astype(np.int64, copy=False)
        self.offsets = off

    # ------------------------------------------------------------ building
    @classmethod
    def from_list(cls, seqs: Iterable[Sequence[int]]) -> "Sequences":
        """From an iterable of integer sequences (lists, arrays)."""
        arrs = [np.asarray(s) for s in seqs]
        for i, a in enumerate(arrs):
            if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
                if a.ndim == 1 and a.dtype.kind == "f" and np.all(a == np.round(a)):
                    continue
                raise ValueError(f"sequence {i} must be a flat list of integer symbols, got "
                                 f"dtype {a.dtype} and shape {a.shape}")
        lens = np.fromiter((a.size for a in arrs), dtype=np.int64, count=len(arrs))
        offsets = np.zeros(len(arrs) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        sym = (np.concatenate(arrs).astype(np.int64) if arrs and offsets[-1]
               else np.empty(0, dtype=np.int64))
        return cls(sym, offsets)

    @classmethod
    def from_lengths(cls, symbols, lengths) -> "Sequences":
        """From concatenated symbols and the length of each sequence."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.ndim != 1 or np.any(lengths < 0):
            raise ValueError(f"lengths must be a 1-D array of integers >= 0, got {lengths[:5]}")
        offsets = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(symbols, offsets)

    @classmethod
    def concat(cls, parts: Sequence["Sequences"]) -> "Sequences":
        """The sequences of ``parts``, in order."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls(np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64))
        lens = np.concatenate([p.lengths for p in parts])
        return cls.from_lengths(np.concatenate([p.symbols for p in parts]), lens)

    # ------------------------------------------------------------- reading
    @property
    def shape(self) -> tuple[int]:
        """``(n_sequences,)``."""
        return (self.offsets.size - 1,)

    def __len__(self) -> int:
        return self.offsets.size - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def n_symbols_total(self) -> int:
        """m, the number of symbols over all sequences."""
        return int(self.symbols.size)

    def __getitem__(self, index):
        """An int gives one sequence (an array); a slice, int array or bool mask a ``Sequences``."""
        n = len(self)
        if isinstance(index, (int, np.integer)):
            i = int(index)
            if not -n <= i < n:
                raise IndexError(f"sequence index {i} out of range for {n} sequences")
            i %= n
            return self.symbols[self.offsets[i]:self.offsets[i + 1]]
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step == 1:
                stop = max(start, stop)
                lo, hi = self.offsets[start], self.offsets[stop]
                return Sequences(self.symbols[lo:hi], self.offsets[start:stop + 1] - lo)
            index = np.arange(start, stop, step)
        idx = np.asarray(index)
        if idx.dtype == bool:
            if idx.shape != (n,):
                raise IndexError(f"boolean index must have shape ({n},), got {idx.shape}")
            idx = np.flatnonzero(idx)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise IndexError(f"index must be an int, a slice or a 1-D integer array, got {index!r}")
        idx = idx.astype(np.int64, copy=False)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise IndexError(f"sequence index out of range for {n} sequences")
        idx = np.where(idx < 0, idx + n, idx)
        starts = self.offsets[idx]
        lens = self.offsets[idx + 1] - starts
        offsets = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        pos = np.arange(offsets[-1], dtype=np.int64) + np.repeat(starts - offsets[:-1], lens)
        return Sequences(self.symbols[pos], offsets)

    def __iter__(self):
        for i in range(len(self)):
            yield self.symbols[self.offsets[i]:self.offsets[i + 1]]

    def copy(self) -> "Sequences":
        """A copy that shares no memory with this one."""
        return Sequences(self.symbols.copy(), self.offsets.copy())

    def to_list(self) -> list[list[int]]:
        """Plain Python lists (JSON-ready)."""
        return [s.tolist() for s in self]

    def equals(self, other) -> bool:
        return (isinstance(other, Sequences) and np.array_equal(self.offsets, other.offsets)
                and np.array_equal(self.symbols, other.symbols))

    def __repr__(self):
        return f"Sequences(n={len(self)}, symbols={self.n_symbols_total})"
