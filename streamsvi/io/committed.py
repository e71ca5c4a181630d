"""Read only committed transactions, on the client (private to the scale-out roles).

A ``read_committed`` Kafka consumer must never see the records of an aborted
transaction. Kafka does its part twice over: the broker returns nothing past
the *last stable offset* (the first offset of a transaction still open), and
each fetch response lists the aborted transactions in the fetched range,
which the client uses to drop their records. A broker may do only the first:
tansu 0.6.0 holds reads at the last stable offset and writes the commit and
abort markers into the log, but its fetch responses list no aborted
transactions, so kafka-python hands its ``read_committed`` consumer the
records of aborted transactions as if they were committed
(``tests/io/test_committed.py::test_the_local_broker_shows_aborted_transactions_to_read_committed_readers``).
For the applier that means folding in the delta of a worker killed between
sending it and committing, whose records the worker's successor reads and
sends again: counted twice, or, where the successor's batches straddle the
aborted one, refused as overlapping and lost.

The markers are enough to decide on the client. :func:`install` makes one
consumer's fetcher hand out, in offset order, one :data:`TxnRecord` per
record (its offset, value, producer id and whether it is transactional) and
one per control marker (``marker`` is ``"commit"`` or ``"abort"``), instead
of ``ConsumerRecord`` objects that drop the producer and the markers.
:class:`CommittedFilter` holds each transactional record until its
producer's marker, drops it at an abort, and releases records in offset
order up to the first one still held: what a ``read_committed`` consumer of
Kafka returns. A reader that checkpoints "the offset after the last record
released" therefore restarts at or before every record it holds.

It works the same on a broker that does list aborted transactions (Kafka):
kafka-python's own filter is bypassed, and the abort markers it would have
used are read here instead.
"""
from __future__ import annotations

from collections import deque, namedtuple

__all__ = ["CommittedFilter", "TxnRecord", "install"]

#: One record, or one control marker, of a fetch: ``marker`` is None for a data
#: record, ``"commit"`` or ``"abort"`` for a marker (``value`` None then).
TxnRecord = namedtuple("TxnRecord", "offset value producer_id transactional marker")


def _partition_records_class(base):
    """A subclass of kafka-python's ``Fetcher.PartitionRecords`` that hands out :data:`TxnRecord`."""
    from kafka import errors as Errors

    class TxnPartitionRecords(base):
        def _unpack_records(self, tp, records, key_deserializer, value_deserializer):
            batch = records.next_batch()
            last = None
            while batch is not None:
                last = batch
                if self.check_crcs and not batch.validate_crc():
                    raise Errors.CorruptRecordError(
                        f"Record batch for partition {tp} at offset {batch.base_offset} failed crc check")
                if batch.magic != 2:
                    # the legacy formats have no producers or markers: plain records
                    for r in batch:
                        self.records_read += 1
                        self.next_fetch_offset = r.offset + 1
                        yield TxnRecord(r.offset, r.value, -1, False, None)
                    batch = records.next_batch()
                    continue
                self.leader_epoch = batch.leader_epoch
                pid, txn = batch.producer_id, bool(batch.is_transactional)
                if batch.is_control_batch:
                    for r in batch:
                        if r.offset >= self.fetch_offset:
                            yield TxnRecord(r.offset, None, pid, True, "abort" if r.abort else "commit")
                else:
                    for r in batch:
                        if r.offset < self.fetch_offset:
                            continue
                        self.records_read += 1
                        self.bytes_read += r.size_in_bytes
                        yield TxnRecord(r.offset, r.value, pid, txn, None)
                # the position moves past the whole batch, as kafka-python's reader leaves it
                self.next_fetch_offset = max(self.next_fetch_offset, batch.next_offset)
                batch = records.next_batch()
            if last is not None and last.magic == 2:
                self.next_fetch_offset = max(self.next_fetch_offset, last.next_offset)
            self.drain()

    return TxnPartitionRecords


def install(consumer) -> bool:
    """Make ``consumer`` (a ``kafka.KafkaConsumer`` without deserializers) hand out
    :data:`TxnRecord` objects, markers included, from its polls.

    Returns False (the consumer is left as it was) if this kafka-python lacks the
    hook point; the caller must then refuse to rely on it.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    base = getattr(type(fetcher), "PartitionRecords", None) if fetcher is not None else None
    if base is None or not hasattr(base, "_unpack_records"):
        return False
    fetcher.PartitionRecords = _partition_records_class(base)
    return True


class CommittedFilter:
    """The committed records of one partition, in offset order (module docs).

    :meth:`feed` takes the :data:`TxnRecord` objects of a poll (in offset order,
    markers included) and returns the records it releases: non-transactional
    records and records of committed transactions, each once, never one of an
    aborted transaction, and none past a record still waiting for its marker.
    Call :meth:`reset` after a seek.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self._held: deque = deque()          # [record, state]: state None (open), True (keep)
        self._open: dict = {}                # producer id -> entries of its open transaction
        self._last = -1                      # the highest offset fed
        self.aborted_records = 0

    def feed(self, items) -> list:
        out = []
        for it in items:
            if it.offset <= self._last:      # fetched twice (a seek raced a fetch)
                continue
            self._last = it.offset
            if it.marker is not None:
                entries = self._open.pop(it.producer_id, ())
                keep = it.marker == "commit"
                for e in entries:
                    e[1] = keep
                if not keep:
                    self.aborted_records += len(entries)
            elif it.transactional:
                e = [it, None]
                self._open.setdefault(it.producer_id, []).append(e)
                self._held.append(e)
            else:
                self._held.append([it, True])
            while self._held and self._held[0][1] is not None:
                rec, keep = self._held.popleft()
                if keep:
                    out.append(rec)
        return out
