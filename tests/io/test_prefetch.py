"""The bounded prefetch (streamsvi.io.sources.prefetch.Prefetching): the same batches in
the same order as the wrapped source, a held batch counted as unread, given back by a
seek, never two threads in the wrapped source, errors raised where the caller polls."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from streamsvi.io.sources import Batch, MemorySource, Source
from streamsvi.io.sources.prefetch import Prefetching


def _rows(n=23, d=3, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    x[[4, n - 2]] = np.nan                    # two rejected records: dead letters in their batches
    return x


def _drain(src, size, prefetch):
    out = []
    while (b := src.poll_batch(size)) is not None:
        if prefetch:
            src.prefetch(size)
        out.append(b)
    return out


def test_same_batches_in_the_same_order_as_the_wrapped_source():
    plain = _drain(MemorySource(_rows()), 5, prefetch=False)
    ahead = _drain(Prefetching(MemorySource(_rows())), 5, prefetch=True)
    assert len(plain) == len(ahead) == 5
    for a, b in zip(plain, ahead):
        assert np.array_equal(a.x, b.x)
        assert a.next_offsets == b.next_offsets and a.first_offsets == b.first_offsets
        assert [(d.position.offset, d.reason) for d in a.dead] == \
            [(d.position.offset, d.reason) for d in b.dead]


def test_a_held_batch_counts_as_unread_and_keeps_the_source_undrained():
    src = Prefetching(MemorySource(_rows(10)))
    first = src.poll_batch(6)
    src.prefetch(6)                            # reads the rest (records 7..9, one rejected)
    assert src.lag() == {("memory", 0): 10 - first.next_offsets[("memory", 0)]}   # waits for it
    assert src.source.exhausted()              # the wrapped source has handed everything out
    assert not src.exhausted() and not src.drained(first.next_offsets)
    last = src.poll_batch(6)
    assert last.first_offsets == first.next_offsets and last.next_offsets == {("memory", 0): 10}
    assert src.exhausted() and src.drained(last.next_offsets) and src.lag() == {("memory", 0): 0}


def test_a_seek_gives_the_held_batch_back():
    x = _rows(20)
    src = Prefetching(MemorySource(x))
    src.poll_batch(5)
    src.prefetch(5)                            # rows 5..9 held
    src.seek({("memory", 0): 2})
    again = src.poll_batch(5)
    assert again.first_offsets == {("memory", 0): 2}
    src.prefetch(5)
    src.seek({})                               # nothing sought: the held batch is read again
    assert src.poll_batch(5).first_offsets == again.next_offsets


class _Gated(Source):
    """A source whose poll waits for ``release`` and that records whether any other call
    came while a poll was running (the wrapped source must never see two threads)."""

    n_features = 1

    def __init__(self, fail_on=None):
        self.release = threading.Event()
        self.in_poll = False
        self.overlaps = []
        self.polls = 0
        self.fail_on = fail_on

    def poll_batch(self, max_records, max_wait_s=0.0):
        self.in_poll = True
        try:
            self.release.wait(30)
            self.polls += 1
            if self.polls == self.fail_on:
                raise ConnectionError("the brokers went away")
            return Batch(np.zeros((max_records, 1)), {("g", 0): self.polls * max_records},
                         n_messages=max_records, first_offsets={("g", 0): (self.polls - 1) * max_records})
        finally:
            self.in_poll = False

    def _other(self, name):
        self.overlaps.append((name, self.in_poll))

    def lag(self):
        self._other("lag")
        return {("g", 0): 100}

    def commit(self, offsets):
        self._other("commit")

    def seek(self, offsets):
        self._other("seek")

    def close(self):
        self._other("close")


def test_no_call_reaches_the_wrapped_source_while_a_poll_is_in_flight():
    g = _Gated()
    src = Prefetching(g)
    g.release.set()
    src.poll_batch(4)
    g.release.clear()
    src.prefetch(4)                            # waits for release in the background
    threading.Timer(0.2, g.release.set).start()
    assert src.lag() == {("g", 0): 100 + 4}    # waited for the poll; its batch counts as lag
    src.commit({("g", 0): 4})
    src.close()
    assert [name for name, _ in g.overlaps] == ["lag", "commit", "close"]
    assert not any(during for _, during in g.overlaps)


def test_an_error_of_the_background_poll_is_raised_by_the_next_poll():
    g = _Gated(fail_on=2)
    g.release.set()
    src = Prefetching(g)
    src.poll_batch(3)
    src.prefetch(3)
    assert src.lag() == {("g", 0): 100}        # the failed poll holds no batch
    with pytest.raises(ConnectionError, match="went away"):
        src.poll_batch(3)
    assert src.poll_batch(3).next_offsets == {("g", 0): 9}      # and the next poll reads on
    src.close()


def test_close_drops_the_held_batch_and_closes_once():
    g = _Gated()
    g.release.set()
    src = Prefetching(g)
    src.poll_batch(2)
    src.prefetch(2)
    src.close()
    src.close()
    src.prefetch(2)                            # after close: nothing starts
    assert g.polls == 2 and [n for n, _ in g.overlaps] == ["close"]
