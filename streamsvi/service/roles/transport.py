"""What travels between the scale-out roles: statistic deltas on a Kafka topic, λ as a file
(or on the lambda topic, :mod:`.lambda_log`, the default).

Delta message (the value of one record on ``scaleout.deltas_topic``), no pickle::

    b"SSVD1\\n"  magic and format version (6 bytes)
    uint32 LE   length H of the JSON header
    H bytes     UTF-8 JSON header (below)
    raw         the arrays named in the header, float64 little-endian, C order, concatenated

Header fields: ``kind`` ("delta", or "init": a proposed λ_0 from a worker when
the applier has no state yet), ``worker`` (id), ``version`` (the λ version the
statistics were computed at), ``ranges`` (``[[topic, partition, first, end], ...]``:
the data-topic offsets ``first <= o < end`` the delta covers, dead letters
included), ``records`` (records that reached the model), ``min_weight`` (the
smallest SVI+ weight, so the applier knows when to test the domain),
``n_total`` (the N the worker scaled by), ``extra`` (JSON values of the
contribution, :class:`~streamsvi.inference.split.Contribution` ``meta``),
``arrays`` (``[[name, shape, dtype], ...]``, dtype ``<f8``, ``<i8`` or ``|u1``;
an entry without a dtype is ``<f8``). A message is at most :data:`MAX_DELTA_BYTES`.

Bundle (a worker's transaction: the deltas of its batches in one message, so a
transaction of many batches costs one record and one produce, not one each)::

    b"SSVDN\n"  magic and format version (6 bytes)
    uint32 LE   count C of deltas
    C times     uint32 LE length L, then L bytes: one delta message as above

A delta inside a bundle is addressed by (offset of the bundle, its index, the
``part``); a plain delta message is part 0 of its offset. :func:`split_parts`
reads both.

Chunk (a λ_0 proposal larger than ``scaleout.lambda_chunk_bytes``, e.g. LDA's
K × V at V = 10⁶: 800 MB, over any broker's message limit, in one transaction)::

    b"SSVDK\n"  magic and format version (6 bytes)
    uint32 LE   length H of the JSON header: ``id`` (one per proposal),
                ``index``, ``count``, ``size`` and ``sha256`` of the whole
    H bytes     UTF-8 JSON header
    raw         bytes ``index`` of the proposal's "init" message

:class:`ChunkAssembler` joins a proposal's chunks (other messages may come
between them) and checks its size and digest.

The arrays of a "delta" are a worker's contribution (:mod:`streamsvi.inference.split`:
for a dense λ the scaled weighted statistics (N/|S|) Σ_n w_n E_q[t(θ_n)] = λ̂ − η; for
LDA's scaled columns, :mod:`streamsvi.inference.split_columns`, the batch's column ids
``cols`` (int64) and the K × |cols| statistics over them, ``stats``; for the gradient path
the ELBO gradient ĝ, its ELBO value and gradient variance in ``extra``);
of an "init", the proposed start state λ_0, as :func:`~streamsvi.inference.state.state_to_arrays`
writes it (so a model with any storage can propose one). A delta of 0 records has no
arrays: it only says its offset ranges were consumed (every record dead-lettered).

λ versions travel on the lambda topic (``scaleout.lambda_topic``,
:mod:`.lambda_log`: full λs in chunks and one record per applied delta, which
workers replay), unless ``scaleout.lambda_file`` is set: then they are published
as that file, on storage the applier and every worker share, written whole under
a temporary name and renamed, so a reader sees the old or the new file, never
half of one. It is the ``.npz`` of :mod:`streamsvi.inference.state` (engine
settings, λ, step = the version) and is loaded with ``allow_pickle=False``.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ...inference.state import state_from_arrays, state_to_arrays
from ...models.base import NatParams

MAGIC = b"SSVD1\n"
#: A bundle of delta messages (module docs).
BUNDLE_MAGIC = b"SSVDN\n"
#: One chunk of a large λ_0 proposal (module docs).
CHUNK_MAGIC = b"SSVDK\n"
#: Largest delta message (bytes): the worker's producer sends, and the applier's consumer
#: fetches, messages up to this size. A dense λ̂ − η is K·V·8 bytes for LDA's shape, a
#: columns delta K·|cols|·8, an "init" the whole λ_0; Kafka brokers refuse messages over
#: the topic's ``max.message.bytes`` (1 MB by default): create the deltas topic with it
#: raised to the largest delta (docs/design.md §6.7).
MAX_DELTA_BYTES = 64 << 20
_MAX_HEADER = 1 << 24
#: wire dtype -> the native dtype it decodes to
_DTYPES = {"<f8": np.float64, "<f4": np.float32, "<i8": np.int64, "|u1": np.uint8}


def _wire(v) -> np.ndarray:
    """``v`` as a little-endian array of one of the wire dtypes (float64, float32: a compact
    delta's values, int64, uint8)."""
    a = np.asarray(v)
    if a.dtype == np.uint8:
        return np.ascontiguousarray(a)
    if a.dtype == np.float32:
        return np.ascontiguousarray(a, dtype="<f4")
    if a.dtype.kind in "biu":
        return np.ascontiguousarray(a, dtype="<i8")
    if a.dtype.kind == "f":
        return np.ascontiguousarray(a, dtype="<f8")
    raise TypeError(f"a delta array must be numeric, not {a.dtype}")


def _mapping(arrays: dict):
    """All float64 (a dense λ's statistics): a NatParams, as before; else the plain dict."""
    if all(a.dtype == np.float64 for a in arrays.values()):
        return NatParams(arrays)
    return arrays


class DeltaFormatError(ValueError):
    """A message on the deltas topic is not a delta this version can read."""


def check_delta_size(payload: bytes, what: str) -> bytes:
    """``payload`` if it fits a delta message (:data:`MAX_DELTA_BYTES`), else ``ValueError``
    saying what to shrink (a worker stops with it instead of sending it again and again)."""
    if len(payload) > MAX_DELTA_BYTES:
        raise ValueError(f"scaleout: {what} is {len(payload) / 2**20:.1f} MiB, over the "
                         f"{MAX_DELTA_BYTES >> 20} MiB a delta message may hold; use a smaller model "
                         f"(n_components, n_features) or inference.batch_size, or run it as one process")
    return payload


def read_frame(data, magic: bytes, what: str, error, max_header: int):
    """``(memoryview, header length)`` of a message framed as ``magic`` (6 bytes), a uint32 LE
    header length and that many bytes of JSON header (the deltas and the lambda log share the
    framing); ``error(...)`` naming ``what`` if the message is not one."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or bytes(data[:6]) != magic:
        raise error(f"not a streamsvi {what} (magic {magic[:5].decode()} missing)")
    data = memoryview(data)
    if len(data) < 10:
        raise error(f"{what} truncated before its header length")
    (hlen,) = struct.unpack("<I", data[6:10])
    if hlen > max_header or 10 + hlen > len(data):
        raise error(f"{what} header length {hlen} does not fit the message ({len(data)} bytes)")
    return data, hlen


@dataclass
class Delta:
    """One worker minibatch's contribution (see the module docs for the fields)."""

    worker: str
    version: int
    ranges: list            # [(topic, partition, first, end)]
    records: int
    stats: "NatParams | dict | None" = None
    min_weight: float = 1.0
    n_total: float = 0.0
    kind: str = "delta"
    extra: dict = field(default_factory=dict)

    def encode(self) -> bytes:
        arrays = [] if self.stats is None else [(k, _wire(v)) for k, v in self.stats.items()]
        header = {"kind": self.kind, "worker": self.worker, "version": int(self.version),
                  "ranges": [[str(t), int(p), int(a), int(b)] for t, p, a, b in self.ranges],
                  "records": int(self.records), "min_weight": float(self.min_weight),
                  "n_total": float(self.n_total), "extra": self.extra,
                  "arrays": [[k, list(v.shape), v.dtype.str] for k, v in arrays]}
        h = json.dumps(header, separators=(",", ":")).encode()
        body = b"".join(v.tobytes() for _, v in arrays)
        return MAGIC + struct.pack("<I", len(h)) + h + body

    @staticmethod
    def peek_kind(data) -> str:
        """The ``kind`` of a delta message, from its header alone (its arrays not read)."""
        data, hlen = read_frame(data, MAGIC, "delta", DeltaFormatError, _MAX_HEADER)
        try:
            return str(json.loads(bytes(data[10:10 + hlen]).decode())["kind"])
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise DeltaFormatError(f"bad delta header: {type(exc).__name__}: {exc}") from None

    @classmethod
    def decode(cls, data: bytes) -> "Delta":
        data, hlen = read_frame(data, MAGIC, "delta", DeltaFormatError, _MAX_HEADER)
        try:
            h = json.loads(bytes(data[10:10 + hlen]).decode())
            stats, pos = {}, 10 + hlen
            for entry in h["arrays"]:
                name, shape = entry[0], [int(d) for d in entry[1]]
                dt = entry[2] if len(entry) > 2 else "<f8"
                if dt not in _DTYPES or any(d < 0 for d in shape):
                    raise DeltaFormatError(f"delta array {name!r}: dtype {dt!r} shape {shape} not allowed")
                n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
                if pos + n > len(data):
                    raise DeltaFormatError(f"delta array {name!r} runs past the end of the message")
                stats[str(name)] = np.frombuffer(data[pos:pos + n], dtype=dt).reshape(shape).astype(
                    _DTYPES[dt])
                pos += n
            if pos != len(data):
                raise DeltaFormatError(f"{len(data) - pos} bytes after the last delta array")
            ranges = [(str(t), int(p), int(a), int(b)) for t, p, a, b in h["ranges"]]
            if h["kind"] not in ("delta", "init"):
                raise DeltaFormatError(f"unknown delta kind {h['kind']!r}")
            return cls(worker=str(h["worker"]), version=int(h["version"]), ranges=ranges,
                       records=int(h["records"]), stats=_mapping(stats) if stats else None,
                       min_weight=float(h["min_weight"]), n_total=float(h["n_total"]),
                       kind=h["kind"], extra=dict(h.get("extra") or {}))
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            if isinstance(exc, DeltaFormatError):
                raise
            raise DeltaFormatError(f"bad delta header: {type(exc).__name__}: {exc}") from None


def encode_bundle(payloads: list) -> bytes:
    """One message holding the delta messages ``payloads`` (module docs)."""
    out = [BUNDLE_MAGIC, struct.pack("<I", len(payloads))]
    for p in payloads:
        out += [struct.pack("<I", len(p)), p]
    return b"".join(out)


def bundle_size(payloads: list) -> int:
    """Bytes of :func:`encode_bundle` of ``payloads``, without encoding it."""
    return len(BUNDLE_MAGIC) + 4 + sum(4 + len(p) for p in payloads)


def split_parts(data) -> list:
    """The delta messages of one deltas-topic message: its parts if it is a bundle, else
    ``[data]``; ``DeltaFormatError`` if a bundle's framing does not add up."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or bytes(data[:6]) != BUNDLE_MAGIC:
        return [data]
    data = memoryview(data)
    if len(data) < 10:
        raise DeltaFormatError("delta bundle truncated before its count")
    (count,) = struct.unpack("<I", data[6:10])
    parts, pos = [], 10
    for i in range(count):
        if pos + 4 > len(data):
            raise DeltaFormatError(f"delta bundle truncated at part {i} of {count}")
        (n,) = struct.unpack("<I", data[pos:pos + 4])
        if pos + 4 + n > len(data):
            raise DeltaFormatError(f"delta bundle part {i} of {count} runs past the end of the message")
        parts.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    if pos != len(data):
        raise DeltaFormatError(f"{len(data) - pos} bytes after the last part of a delta bundle")
    return parts


def is_chunk(data) -> bool:
    """Whether a deltas-topic message is a chunk of a larger one (:func:`chunk_message`)."""
    return isinstance(data, (bytes, bytearray, memoryview)) and bytes(data[:6]) == CHUNK_MAGIC


def chunk_message(payload: bytes, chunk_bytes: int) -> list:
    """``payload`` (an "init" message) as chunk messages of at most ``chunk_bytes`` payload
    bytes each (module docs); they must be sent in order, in one transaction."""
    import hashlib
    import uuid

    chunk_bytes = max(1, int(chunk_bytes))
    count = max(1, -(-len(payload) // chunk_bytes))
    head = {"id": uuid.uuid4().hex, "count": count, "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest()}
    out = []
    for i in range(count):
        h = json.dumps({**head, "index": i}, separators=(",", ":")).encode()
        out.append(CHUNK_MAGIC + struct.pack("<I", len(h)) + h + payload[i * chunk_bytes:(i + 1) * chunk_bytes])
    return out


class ChunkAssembler:
    """Joins the chunks of large messages (:func:`chunk_message`), whatever comes between them.

    ``feed(data)`` takes one chunk message and returns the whole message once its last
    chunk arrives (size and sha256 checked), else None; ``DeltaFormatError`` for a chunk
    that does not parse or a whole that does not check out (its chunks are dropped). A
    chunk that starts over (index 0 of an id in progress) restarts it; at most
    :attr:`max_open` messages are collected at once (the oldest is dropped), so chunks
    whose message never completes (a worker killed mid-write: its transaction is
    aborted, and read_committed readers never see the chunks at all) cannot pile up.
    """

    max_open = 8

    def __init__(self):
        self._open: dict = {}           # id -> {"head": header, "parts": [bytes]}

    def feed(self, data):
        import hashlib

        data, hlen = read_frame(data, CHUNK_MAGIC, "delta chunk", DeltaFormatError, _MAX_HEADER)
        try:
            h = json.loads(bytes(data[10:10 + hlen]).decode())
            cid, i, count, size = str(h["id"]), int(h["index"]), int(h["count"]), int(h["size"])
            digest = str(h["sha256"])
        except (KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise DeltaFormatError(f"bad delta chunk header: {type(exc).__name__}: {exc}") from None
        if not 0 <= i < count or size < 0:
            raise DeltaFormatError(f"delta chunk {i} of {count} ({size} bytes) does not add up")
        cur = self._open.get(cid)
        if i == 0:
            cur = self._open[cid] = {"count": count, "size": size, "sha256": digest, "parts": []}
            while len(self._open) > self.max_open:
                self._open.pop(next(iter(self._open)))
        elif cur is None or len(cur["parts"]) != i or (cur["count"], cur["size"], cur["sha256"]) != \
                (count, size, digest):
            self._open.pop(cid, None)
            raise DeltaFormatError(f"delta chunk {i} of {count} of message {cid[:8]} out of order "
                                   f"(its earlier chunks were not read)")
        cur["parts"].append(bytes(data[10 + hlen:]))
        if len(cur["parts"]) < count:
            return None
        del self._open[cid]
        whole = b"".join(cur["parts"])
        if len(whole) != size or hashlib.sha256(whole).hexdigest() != digest:
            raise DeltaFormatError(f"chunked message {cid[:8]}: {len(whole)} bytes, sha256 does not match "
                                   f"the {size} bytes announced")
        return whole


def init_delta(worker: str, engine, state) -> Delta:
    """The "init" message proposing ``state`` (λ_0 with its aux) as the start."""
    return Delta(worker=worker, version=-1, ranges=[], records=0, stats=state_to_arrays(engine, state),
                 n_total=float(engine.n_total), kind="init")


def init_messages(worker: str, engine, state, chunk_bytes: int) -> list:
    """The deltas-topic messages of a λ_0 proposal: the "init" message (:func:`init_delta`),
    in chunks of ``chunk_bytes`` (:func:`chunk_message`) when it is larger; sent in order
    in one transaction."""
    payload = init_delta(worker, engine, state).encode()
    return [payload] if len(payload) <= chunk_bytes else chunk_message(payload, chunk_bytes)


def init_state(d: Delta):
    """``(engine, state)`` proposed by the "init" message ``d`` (:func:`init_delta`)."""
    if d.kind != "init" or not d.stats:
        raise DeltaFormatError("not an init message with a start state")
    try:
        return state_from_arrays(dict(d.stats))
    except (KeyError, TypeError, ValueError) as exc:
        raise DeltaFormatError(f"bad init message: {type(exc).__name__}: {exc}") from None


# ------------------------------------------------------------------ λ versions
def publish_lambda(path, engine, state) -> None:
    """Write λ (and the engine settings) atomically to ``path``; the version is ``state.step``."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        np.savez(f, **state_to_arrays(engine, state))
    os.replace(tmp, path)


class LambdaFile:
    """A worker's view of the published λ: reloaded when the file changes (cheap ``stat``)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._sig = None
        self.engine = None
        self.state = None

    def refresh(self) -> bool:
        """Reload if the file changed since the last look; True if a new λ was loaded."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        sig = (st.st_ino, st.st_mtime_ns, st.st_size)
        if sig == self._sig:
            return False
        try:
            with np.load(self.path, allow_pickle=False) as z:
                self.engine, self.state = state_from_arrays({k: z[k] for k in z.files})
        except FileNotFoundError:
            return False
        self._sig = sig
        return True

    @property
    def version(self) -> int | None:
        return None if self.state is None else int(self.state.step)
