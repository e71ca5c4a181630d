"""Record sources: Kafka, files and in-memory arrays behind one small interface.

One module each: :mod:`.base` (the interface, batches, dead letters), :mod:`.memory`,
:mod:`.file` and :mod:`.kafka`.

A :class:`Source` hands out minibatches (:class:`Batch`) assembled across
partitions by record count and by a maximum wait. Decoding and validation
happen inside the source, so a record that cannot be decoded or fails a
check never reaches a batch's ``x``: it is in ``Batch.dead`` with its
position and reason, and its offset still counts as consumed in
``Batch.next_offsets`` so it is not read again.

Positions are ``(source, partition) -> offset`` mappings (:data:`Offsets`);
``offset`` is the *next* record to read (last consumed + 1), the Kafka
convention. The delivery contract (docs/design.md) is the caller's loop:

1. ``batch = source.poll_batch(max_records, max_wait_s)``
2. send ``batch.dead`` to a dead-letter sink; update the model with ``batch.x``
3. write a checkpoint holding the merged ``next_offsets``; flush the sink
4. ``source.commit(offsets)`` — only after the checkpoint is durable
5. on restart: ``source.seek(checkpoint_offsets)`` before the first poll

Examples
--------
>>> import numpy as np
>>> src = MemorySource(np.array([[0.0, 1.0], [np.nan, 2.0], [3.0, 4.0]]))
>>> batch = src.poll_batch(max_records=10)
>>> batch.x.tolist(), batch.next_offsets
([[0.0, 1.0], [3.0, 4.0]], {('memory', 0): 3})
>>> [(d.position.offset, d.reason) for d in batch.dead]
[(1, 'non_finite')]
>>> src.exhausted(), src.poll_batch(10) is None
(True, True)
"""
from .._kafka import KafkaUnavailableError
from .base import Batch, DeadLetter, NotAssigned, Offsets, Position, Source, SourceError
from .file import FileSource
from .kafka import KafkaSource
from .memory import MemorySource

__all__ = ["Position", "DeadLetter", "Batch", "Offsets", "Source", "SourceError", "NotAssigned",
           "KafkaUnavailableError", "MemorySource", "FileSource", "KafkaSource"]
