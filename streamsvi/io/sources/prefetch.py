"""A bounded prefetch of the next minibatch, read while the model learns the last one.

:class:`Prefetching` wraps any :class:`~.base.Source`. After the caller has a batch it
calls :meth:`Prefetching.prefetch`; one background thread then runs the wrapped source's
``poll_batch`` (fetch, the lean reader, decoding, validation) while the caller updates
the model, and the next :meth:`Prefetching.poll_batch` hands that batch out. The model's
compiled parts release the GIL (BLAS, the compiled LDA local step), so reading and
learning can overlap there; on 2 cores they mostly took turns and it gained nothing, so
the daemon's ``source.prefetch`` is off by default (docs/running.md, "Reading ahead").

The bound is one batch: at most one poll runs in the background and at most one batch
is held, so memory stays at two minibatches. Nothing else changes for the caller:

* The wrapped source is never used by two threads at once. Every other call
  (``commit``, ``lag``, ``seek``, ``drained``, ``close``, attributes) first waits for
  the poll in flight; kafka-python's consumer is not thread-safe.
* The delivery contract is the caller's, as before: a held batch was read but not
  handed out, so it is in no ``next_offsets`` the caller checkpoints or commits. A stop
  with a batch held loses nothing: a restart reads it again from the committed offsets.
* :meth:`positions` and :meth:`lag` count a held batch as not read yet, as the wrapped
  source counts its own buffered messages; :meth:`seek` first gives a held batch back
  (every partition it read is sought back to where the batch began) and :meth:`drained`
  and :meth:`exhausted` are False while a batch with records is held.
* An error of the background poll (a broker gone, a corrupt fetch) is raised by the next
  :meth:`poll_batch`, where the caller would have met it without the prefetch.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from .base import Batch, Offsets, Source

__all__ = ["Prefetching"]


class Prefetching(Source):
    """``source`` with a prefetch of one minibatch (module docs).

    Parameters
    ----------
    source : Source
        The source to read from; only this wrapper may use it from now on.

    Examples
    --------
    >>> import numpy as np
    >>> from streamsvi.io.sources import MemorySource
    >>> src = Prefetching(MemorySource(np.arange(10.0).reshape(5, 2)))
    >>> b = src.poll_batch(2)
    >>> src.prefetch(2)            # the next batch is read while b is learned
    >>> b.next_offsets, src.poll_batch(2).next_offsets
    ({('memory', 0): 2}, {('memory', 0): 4})
    >>> src.close()
    """

    def __init__(self, source: Source):
        self.source = source
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamsvi-prefetch")
        self._pending = None      # the Future of the poll in flight or held, or None
        self._closed = False

    def __repr__(self):
        return f"Prefetching({self.source!r})"

    def __getattr__(self, name):
        # anything else of the wrapped source (its consumer, kind, partitions(), committed(),
        # check_brokers(), ...), after the poll in flight
        if name in ("source", "_pool", "_pending", "_closed"):     # not set yet: no recursion
            raise AttributeError(name)
        self._settle()
        return getattr(self.source, name)

    @property
    def n_features(self):
        return self.source.n_features

    # ------------------------------------------------------------ the prefetch
    def prefetch(self, max_records: int, max_wait_s: float = 0.0) -> None:
        """Start reading the next batch in the background (nothing if one is held or closed)."""
        if self._pending is None and not self._closed:
            self._pending = self._pool.submit(self.source.poll_batch, max_records, max_wait_s)

    def _settle(self) -> None:
        """Wait for the poll in flight, if any (its result or error stays held)."""
        pending = self._pending
        if pending is not None:
            pending.exception()           # waits; does not raise

    def _held(self) -> Batch | None:
        """The held batch (after the poll in flight), or None; an error stays held."""
        pending = self._pending
        if pending is None:
            return None
        if pending.exception() is not None:
            return None
        return pending.result()

    @staticmethod
    def _starts(batch: Batch) -> Offsets:
        """The offset each partition ``batch`` read began at."""
        return {k: batch.first_offsets.get(k, off) for k, off in batch.next_offsets.items()}

    def _give_back(self) -> Offsets:
        """Drop the held batch; the offsets each partition it read began at (to seek back to)."""
        batch, self._pending = self._held(), None
        return {} if batch is None else self._starts(batch)

    # ------------------------------------------------------------ Source
    def poll_batch(self, max_records: int, max_wait_s: float = 0.0) -> Batch | None:
        """The held batch, if a prefetch was started; else a poll of the wrapped source now."""
        pending, self._pending = self._pending, None
        if pending is not None:
            return pending.result()       # an error of the background poll is raised here
        return self.source.poll_batch(max_records, max_wait_s)

    def seek(self, offsets) -> None:
        back = self._give_back()
        self.source.seek({**back, **dict(offsets)})

    def commit(self, offsets) -> None:
        self._settle()
        self.source.commit(offsets)

    def positions(self) -> Offsets:
        held = self._held()
        out = self.source.positions()
        if held is not None:
            out.update({k: off for k, off in self._starts(held).items() if k in out})
        return out

    def lag(self) -> Offsets:
        held = self._held()
        out = self.source.lag()
        if held is not None:
            for k, start in self._starts(held).items():
                if k in out:
                    out[k] += held.next_offsets[k] - start
        return out

    def exhausted(self) -> bool:
        held = self._held()
        return (held is None or not held.n_messages) and self.source.exhausted()

    def drained(self, applied) -> bool:
        held = self._held()
        if held is not None and held.n_messages:
            return False
        return self.source.drained(applied)

    def close(self) -> None:
        """Wait for the poll in flight, drop what it read, close the wrapped source."""
        if not self._closed:
            self._closed = True
            self._settle()
            self._pending = None
            self._pool.shutdown(wait=True)
            self.source.close()
