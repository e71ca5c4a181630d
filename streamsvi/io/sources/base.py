"""The source interface and what every source shares: positions, dead letters,
batches and the batch builder that decodes and validates records.
"""
from __future__ import annotations

import base64
import json
import logging
import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..codecs import Codec, DecodeError, decode_many_safely, decode_rows_safely
from ..dense import DenseKind, RecordValidator
from ..records import KINDS, RecordKind
from ..validate import all_valid_safely, validate_safely



log = logging.getLogger("streamsvi.io.sources")

#: ``{(source, partition): offset}`` — source is a topic name or a file path.
Offsets = dict[tuple[str, int], int]


class SourceError(RuntimeError):
    """A source could not do what was asked (no assignment, failed commit, bad seek)."""


class NotAssigned(SourceError):
    """The consumer group assigned this member no partitions in ``waited_s`` seconds; ``why``
    says what the member's own state shows (set ``waited_s`` to the whole wait when retrying
    in steps); ``joined``: the member is in the group, which gave its partitions to others
    (more members than partitions); ``no_topic``: what of the subscription does not exist at
    the brokers yet ("topic 'a'", "a topic matching 'p'"), None when a subscribed topic exists."""

    def __init__(self, what: str, waited_s: float, why: str, joined: bool = False,
                 no_topic: str | None = None):
        super().__init__(what, waited_s, why)
        self.what, self.waited_s, self.why, self.joined = what, float(waited_s), why, bool(joined)
        self.no_topic = no_topic

    def __str__(self):
        return f"{self.what} within {self.waited_s:g} s: {self.why}"


@dataclass(frozen=True)
class Position:
    """Where a record came from.

    Attributes
    ----------
    source : str
        Topic name, file path (as given to the source) or memory source name.
    partition : int
        Kafka partition; 0 for files and memory.
    offset : int
        Kafka offset, 0-based line number in a file, or row index in memory.
    """

    source: str
    partition: int
    offset: int


@dataclass
class DeadLetter:
    """A record that did not reach the model, and why.

    Attributes
    ----------
    position : Position
        Where the message is.
    reason : str
        Stable reason code (``json_invalid``, ``wrong_shape``, ``non_finite``, ...).
    message : str
        What exactly was wrong.
    payload : bytes
        The raw message; for a rejected row of a binary minibatch, that one
        row re-encoded as a one-row binary message.
    row : int or None
        Index of the rejected row inside a multi-row message, else None.
    """

    position: Position
    reason: str
    message: str
    payload: bytes
    row: int | None = None

    def to_json(self) -> dict:
        """The dead-letter record as written by the sinks."""
        return {"reason": self.reason, "message": self.message,
                "source": self.position.source, "partition": self.position.partition,
                "offset": self.position.offset, "row": self.row,
                "payload_b64": base64.b64encode(self.payload).decode("ascii")}

    @classmethod
    def from_json(cls, obj: Mapping) -> "DeadLetter":
        """Inverse of :meth:`to_json` (accepts a dict, str or bytes)."""
        if isinstance(obj, (str, bytes)):
            obj = json.loads(obj)
        return cls(Position(obj["source"], int(obj["partition"]), int(obj["offset"])),
                   obj["reason"], obj["message"], base64.b64decode(obj["payload_b64"]),
                   obj.get("row"))


@dataclass
class Batch:
    """One minibatch from a source.

    Attributes
    ----------
    x : ndarray, shape (n, D), float64, or the record kind's batch type
        The accepted records (for dense records an array; for other
        :mod:`~streamsvi.io.records` kinds whatever their codecs return, e.g.
        a CSR matrix). n can be 0 when every message was rejected; the
        offsets must still be checkpointed and committed then.
    next_offsets : dict[(source, partition), int]
        Last consumed offset + 1 for every partition that delivered a message
        (accepted or rejected) in this batch. Merge into the running offsets
        with ``offsets.update(batch.next_offsets)``.
    dead : list of DeadLetter
        Rejected records (and rows), in the order they were read.
    n_messages : int
        Messages (or lines) consumed, accepted or not.
    first_offsets : dict[(source, partition), int]
        The first consumed offset of every partition in ``next_offsets``: the
        batch read ``first <= offset < next`` of each (the scale-out worker
        sends these ranges with its delta).
    positions : list of (source, partition, offset, row) or None
        Where each accepted record of ``x`` came from, in ``x``'s order (``row``: its
        index in a multi-row message, else None); only from a source whose
        ``track_positions`` is set (the scorer role), None otherwise.
    """

    x: np.ndarray
    next_offsets: Offsets
    dead: list[DeadLetter] = field(default_factory=list)
    n_messages: int = 0
    first_offsets: Offsets = field(default_factory=dict)
    positions: list | None = None

    @property
    def n_rows(self) -> int:
        return int(self.x.shape[0])


def _check_poll_args(max_records, max_wait_s):
    if isinstance(max_records, bool) or not isinstance(max_records, (int, np.integer)) \
            or max_records < 1:
        raise ValueError(f"max_records must be an integer >= 1, got {max_records!r}")
    if not (isinstance(max_wait_s, (int, float)) and max_wait_s >= 0 and math.isfinite(max_wait_s)):
        raise ValueError(f"max_wait_s must be a finite number >= 0, got {max_wait_s!r}")


def _check_offsets(offsets) -> Offsets:
    out = {}
    for key, off in dict(offsets).items():
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], str)
                and isinstance(key[1], (int, np.integer))):
            raise ValueError(f"offset keys must be (source, partition) tuples, got {key!r}")
        if isinstance(off, bool) or not isinstance(off, (int, np.integer)) or off < 0:
            raise ValueError(f"offset for {key} must be an integer >= 0, got {off!r}")
        out[(key[0], int(key[1]))] = int(off)
    return out


_DENSE = KINDS["dense"]


class _BatchBuilder:
    """Decodes, validates and collects messages into one :class:`Batch`.

    Messages arrive in runs: consecutive messages of one partition. A run is
    first tried whole (the fast path, no per-message Python work): one
    :meth:`Codec.decode_many` and one :meth:`RecordValidator.all_valid`.
    Only if that fails is the run decoded and validated message by message,
    which finds the bad messages and their reasons; the result is the same
    either way, the fast path only skips work when nothing is wrong.

    ``kind`` (:class:`~streamsvi.io.records.RecordKind`, default dense) says
    how decoded parts are counted, sliced and joined.
    """

    def __init__(self, codec: Codec | None, validator: RecordValidator, n_features: int | None,
                 kind: RecordKind | None = None, track_positions: bool = False):
        self.codec, self.validator, self.n_features = codec, validator, n_features
        #: each accepted record's (source, partition, offset, row), when tracked (Batch.positions)
        self.positions: list | None = [] if track_positions else None
        self.kind = kind or _DENSE
        self._empty = None
        self.parts: list[np.ndarray] = []
        self._fresh: list[bool] = []     # parts[i] is a new array nobody else holds
        self.dead: list[DeadLetter] = []
        self.next_offsets: Offsets = {}
        self.first_offsets: Offsets = {}
        self.n_rows = 0
        self.n_messages = 0

    def add_messages(self, messages) -> None:
        """Decode and validate ``(source, partition, offset, payload)`` messages, in read order."""
        key, offsets, payloads = None, [], []
        for source, partition, offset, payload in messages:
            if (source, partition) != key:
                if offsets:
                    self.add_run(key[0], key[1], offsets, payloads)
                key, offsets, payloads = (source, partition), [], []
            offsets.append(offset)
            payloads.append(payload)
        if offsets:
            self.add_run(key[0], key[1], offsets, payloads)

    def add_run(self, source: str, partition: int, offsets: Sequence[int],
                payloads: Sequence[bytes]) -> None:
        """Messages of one partition in read order: ``payloads[i]`` is at ``offsets[i]``."""
        n = len(payloads)
        if n == 0:
            return
        self.first_offsets.setdefault((source, partition), int(offsets[0]))
        x = None
        try:
            if max(map(len, payloads)) <= self.validator.max_message_bytes:
                x = decode_many_safely(self.codec, payloads)
        except TypeError:                       # a None payload: one by one
            x = None
        if x is not None and self.positions is not None and self.kind.n_records(x) != n:
            x = None                            # multi-row messages: positions come one by one
        if x is not None and all_valid_safely(self.validator, x):
            if self.positions is not None:
                self.positions += [(source, partition, int(o), None) for o in offsets]
            self.n_messages += n
            self.next_offsets[(source, partition)] = offsets[-1] + 1
            self._append(x, fresh=True)
            return
        self._add_one_by_one([(source, partition, o, p) for o, p in zip(offsets, payloads)])

    def _add_one_by_one(self, messages) -> None:
        """The slow path: each message decoded and checked on its own.

        Rows of one-record codecs are validated together (one vectorised
        call); dead letters keep the order the messages were read.
        """
        single = self.codec.rows_per_message == 1
        kind = self.kind
        rows, row_meta = [], []          # one-record codecs: decoded rows, (seq, pos, payload)
        dead: list[tuple[int, DeadLetter]] = []
        for seq, (source, partition, offset, payload) in enumerate(messages):
            self.n_messages += 1
            self.next_offsets[(source, partition)] = offset + 1
            pos = Position(source, partition, offset)
            payload = b"" if payload is None else bytes(payload)
            too_large = self.validator.check_size(payload)
            if too_large is not None:
                dead.append((seq, DeadLetter(pos, too_large[0], too_large[1], payload)))
                continue
            try:
                x = decode_rows_safely(self.codec, payload)
            except DecodeError as exc:
                dead.append((seq, DeadLetter(pos, exc.reason, exc.message, payload)))
                continue
            if single:
                rows.append(x)
                row_meta.append((seq, pos, payload))
                continue
            good, rejected = validate_safely(self.validator, kind, x)
            n_x = kind.n_records(x)
            for i, reason, message in rejected:
                dead.append((seq, DeadLetter(pos, reason, f"row {i} of {n_x}: {message}",
                                             self.codec.encode_rows(kind.take(x, slice(i, i + 1))), i)))
            self._track(pos, n_x, rejected, rows=True)
            self._append(good, fresh=True)
        if rows:
            good, rejected = validate_safely(self.validator, kind, kind.concat(rows))
            for i, reason, message in rejected:
                seq, pos, payload = row_meta[i]
                dead.append((seq, DeadLetter(pos, reason, message, payload)))
            self._track([m[1] for m in row_meta], len(row_meta), rejected)
            self._append(good, fresh=True)
        dead.sort(key=lambda item: item[0])  # stable: rows of one message stay in order
        self.dead.extend(d for _, d in dead)

    def add_rows(self, source: str, offset0: int, x: np.ndarray):
        """Rows already decoded (memory source): row i is message ``offset0 + i``."""
        n = self.kind.n_records(x)
        self.n_messages += n
        self.first_offsets.setdefault((source, 0), int(offset0))
        self.next_offsets[(source, 0)] = offset0 + n
        good, rejected = self.validator.validate(x)
        for i, reason, message in rejected:
            payload = json.dumps(self.kind.to_json(self.kind.take(x, slice(i, i + 1)))[0]).encode()
            self.dead.append(DeadLetter(Position(source, 0, offset0 + i), reason, message, payload))
        self._track([Position(source, 0, offset0 + i) for i in range(n)], n, rejected)
        self._append(good, fresh=False)  # can be a view of the caller's array

    def _track(self, where, n: int, rejected, rows: bool = False) -> None:
        """Note the positions of the accepted records among ``n`` validated ones (when tracked):
        ``where`` the Position of each, or (``rows``) one Position of a message and ``n`` its rows."""
        if self.positions is None:
            return
        bad = {i for i, _, _ in rejected}
        for i in range(n):
            if i not in bad:
                pos = where if rows else where[i]
                self.positions.append((pos.source, pos.partition, pos.offset, i if rows else None))

    def _append(self, good, fresh: bool):
        n = self.kind.n_records(good)
        if n:
            self.parts.append(good)
            self._fresh.append(fresh)
            self.n_rows += n
        else:
            self._empty = good        # an empty part of the right type, for batch()

    def batch(self) -> Batch | None:
        if self.n_messages == 0:
            return None
        if len(self.parts) == 1:
            # Always an array of its own: a part can be a view of the caller's data.
            x = self.parts[0] if self._fresh[0] else self.parts[0].copy()
        elif self.parts:
            x = self.kind.concat(self.parts)
        elif isinstance(self.kind, DenseKind):
            x = np.empty((0, self.n_features))
        elif self._empty is not None:
            x = self._empty
        else:
            x = self.codec.empty()
        return Batch(x, dict(self.next_offsets), self.dead, self.n_messages, dict(self.first_offsets),
                     self.positions)


class Source:
    """Interface of a record source.

    Subclasses implement :meth:`poll_batch`, :meth:`seek` and :meth:`lag`;
    :meth:`commit` is a no-op except for Kafka, :meth:`exhausted` is False
    for an unbounded stream.

    Attributes
    ----------
    n_features : int
        D, the number of values per record.
    """

    n_features: int
    #: Whether batches say where each accepted record came from (``Batch.positions``);
    #: the scorer role sets it on its source (Kafka and memory sources honour it).
    track_positions: bool = False

    def poll_batch(self, max_records: int, max_wait_s: float = 0.0) -> Batch | None:
        """The next minibatch, or None if nothing arrived within ``max_wait_s``.

        Reads until the batch holds ``max_records`` accepted rows, the wait
        runs out, or the source drains. Rejected records do not count towards
        ``max_records``. Messages are never split: with one-record codecs a
        full batch has exactly ``max_records`` rows; a multi-row (binary)
        message can take it past.
        """
        raise NotImplementedError

    def seek(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Read each ``(source, partition)`` from ``offset`` on next."""
        raise NotImplementedError

    def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Record ``offsets`` as processed where the source keeps them (Kafka only)."""

    def lag(self) -> Offsets:
        """Records not yet read per ``(source, partition)`` (highwater − position)."""
        raise NotImplementedError

    def exhausted(self) -> bool:
        """Whether a bounded source has nothing left to read."""
        return False

    def drained(self, applied: Mapping[tuple[str, int], int]) -> bool:
        """Whether every record of the source is accounted for.

        ``applied`` holds the next offset per ``(source, partition)`` that
        the caller has folded in (or set aside). A file or memory source is
        drained when it is exhausted; :class:`KafkaSource` checks every
        partition of its topics, not only the ones assigned to it.
        """
        return self.exhausted()

    def close(self) -> None:
        """Release files, sockets and group membership."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
