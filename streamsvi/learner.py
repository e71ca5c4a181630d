"""One streaming learner: minibatch buffer, streaming start, engine update.

:class:`StreamLearner` is what the river faces (:mod:`streamsvi.estimators`)
learn with. It owns an engine (:class:`~streamsvi.inference.SVI` or
:class:`~streamsvi.inference.GradientVI`) and its state, and takes records
one at a time:

* the records go to a buffer until ``batch_size`` of them are in, and the
  buffer then becomes one minibatch (``make_batch(records)``: the face says
  what a record is and how records make a batch the engine takes: dense
  rows, documents, ratings, labelled rows);
* before the start, the minibatches are held until the start has its records
  (:func:`take_start`: the daemon's rule). The engine then starts from all of
  them (``engine.init``) and takes one step per held minibatch, in order;
* after the start, each minibatch is one ``engine.update``;
* :meth:`StreamLearner.flush` learns the buffer as one short minibatch (and,
  before the start, starts from what is held).

:func:`take_start` is the streaming start rule itself, shared with the daemon
and the scale-out worker (``service.daemon.Daemon._take_start``). This module
imports ``inference`` only.

Examples
--------
>>> import numpy as np
>>> from streamsvi import SVI, BayesianGMM
>>> engine = SVI(BayesianGMM(2, 1, init_batches=2), n_total=100)
>>> learner = StreamLearner(engine, batch_size=10, make_batch=np.vstack, seed=0)
>>> for v in np.linspace(-3, 3, 25):
...     learner.learn(np.array([v]))
>>> learner.state.step, len(learner.buffer)  # the start (2 minibatches = 20 records), 2 steps
(2, 5)
>>> learner.flush(); learner.state.step, learner.state.records_seen
(3, 25)
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from .inference.engine import start_records


def take_start(held: list, n_records: Callable, model, batch_size: int, n_total: float,
               flush: bool = False) -> list:
    """The batches held for a streaming start, once they have the records the start wants.

    The start wants :func:`~streamsvi.inference.engine.start_records` records: the
    model's ``start_size(batch_size)`` if it has one (GMM: ``init_batches``
    minibatches and at least 5·K·D), else one minibatch, at most ``n_total`` = N.
    Once ``held`` (batches, ``n_records(batch)`` records each) has them, or ``flush``
    and any are held, the batches are taken out of ``held`` (emptied in place) and
    returned in order; otherwise ``[]`` and ``held`` is left as it is.

    The one rule of the daemon (``Daemon._take_start``), the scale-out worker's
    proposal of λ_0 and the river faces (:class:`StreamLearner`).
    """
    n = sum(n_records(b) for b in held)
    if not n or (n < start_records(model, batch_size, n_total) and not flush):
        return []
    batches = list(held)
    held.clear()
    return batches


def random_seed() -> int:
    """A fresh seed for an engine's random stream (a face made with ``seed=None``)."""
    return int(np.random.SeedSequence().entropy % (2**63))


class StreamLearner:
    """An engine and its state, learned from a stream of records in minibatches.

    Parameters
    ----------
    engine
        The engine (``init``, ``update``, ``model``, ``n_total``). It may be
        replaced between records (``SoftmaxRegression`` grows its model), as may
        ``state`` (a face that starts from a snapshot).
    batch_size
        |S|: records per minibatch.
    make_batch
        ``make_batch(records)``: a list of records as one batch of the engine's
        model. Keep it picklable (a module-level function or a partial of one)
        for faces that are pickled.
    seed
        Seed of the engine's random stream at the start; None draws a fresh one then.

    Attributes
    ----------
    state
        The engine state; None until the start.
    last_info
        ``UpdateInfo`` of the last update; None before the first.
    buffer
        The records of the minibatch being filled.
    held
        Full minibatches (lists of records) held for the start; empty after it.
    """

    def __init__(self, engine, batch_size: int, make_batch: Callable, seed: int | None = None):
        self.engine = engine
        self.batch_size = int(batch_size)
        self.make_batch = make_batch
        self.seed = seed
        self.state = None
        self.last_info = None
        self.buffer: list = []
        self.held: list[list] = []

    def __repr__(self) -> str:
        return (f"StreamLearner({type(self.engine).__name__}, batch_size={self.batch_size}, "
                f"started={self.state is not None}, buffered={len(self.buffer)}, "
                f"held={sum(len(b) for b in self.held)})")

    def learn(self, record) -> None:
        """Buffer one record; a full buffer is learned as a minibatch (:meth:`flush`)."""
        self.buffer.append(record)
        if len(self.buffer) >= self.batch_size:
            self._learn_buffer(flush=False)

    def learn_many(self, records) -> None:
        """:meth:`learn` of each record in order (the same minibatches, the same result)."""
        for record in records:
            self.learn(record)

    def flush(self) -> None:
        """Learn the buffered records as one (possibly short) minibatch. Before the start,
        start from the minibatches held and this one, however few records they have."""
        if self.buffer or (self.state is None and self.held):
            self._learn_buffer(flush=True)

    def unlearned(self) -> list:
        """The records taken but not yet learned (held for the start, then buffered), in order."""
        return [r for b in self.held for r in b] + self.buffer

    # ------------------------------------------------------------ internals
    def _learn_buffer(self, flush: bool) -> None:
        records, self.buffer = self.buffer, []
        if self.state is not None:
            self._update(self.make_batch(records))
            return
        if records:
            self.held.append(records)
        minibatches = take_start(self.held, len, self.engine.model, self.batch_size,
                                 self.engine.n_total, flush)
        if not minibatches:
            return                                   # still gathering the start's records
        if len(minibatches) == 1:
            batches = [self.make_batch(minibatches[0])]
            start = batches[0]
        else:
            start = self.make_batch([r for b in minibatches for r in b])
            batches = [self.make_batch(b) for b in minibatches]
        self.state = self.engine.init(start, seed=self.seed if self.seed is not None else random_seed())
        for batch in batches:
            self._update(batch)

    def _update(self, batch) -> None:
        self.state, self.last_info = self.engine.update(self.state, batch)
