"""Atomic, versioned, numbered snapshots of the engine state (the checkpoint store).

docs/design.md, "Delivery contract": a batch's offsets are committed
only after a checkpoint that includes that batch's update is durable. This
module is that checkpoint. :meth:`CheckpointStore.save` returns only once the
snapshot and the ``latest`` pointer are on disk (every file, directory and
rename fsynced), so the daemon may commit the offsets stored in it as soon as
``save`` returns, and never before.

Layout of a checkpoint directory::

    <directory>/
        snap-00000041/          an older snapshot, kept for fallback (``keep``)
        snap-00000042/
            state.npz           λ, random stream, step, ... (state_to_arrays; no pickle)
            snapshot.json       everything else, with checksums (see below)
        latest                  text file naming the newest snapshot: "snap-00000042"
        promoted                text file naming the snapshot scorers load (promotion; optional)
        promotion.json          the promotion's decision record, checksummed (read_promotion)
        .lock                   serialises writers (held only while saving/cleaning)
        quarantine/             snapshots found corrupt when the daemon resumed, moved
            snap-00000043-<utc time>/   aside whole (never deleted by retention)

A save writes into ``.tmp-snap-<n>-<pid>-<random>/``, fsyncs both files and
that directory, renames it to ``snap-<n>`` and fsyncs the checkpoint
directory; then writes ``latest.tmp``, fsyncs it, ``os.replace``-s it onto
``latest`` and fsyncs the directory again. Only after that are snapshots
beyond the newest ``keep`` deleted, each first renamed to ``.del-…`` so that
a snapshot directory is either complete or absent. A crash at any instant
therefore leaves the previous snapshot (or the new one) as the valid latest,
never a partial one; leftover ``.tmp-*``/``.del-*`` directories are removed
when a :class:`CheckpointStore` is opened.

The ``promoted`` pointer (:data:`PROMOTED`) is written the same way by
:meth:`CheckpointStore.write_promotion`, after the decision record; retention
never deletes the snapshot it names, and :func:`load_snapshot` with
``follow="promoted"`` reads it, falling back to ``latest`` where it is absent
or unusable. ``latest`` is never changed by promotion.

``snapshot.json`` holds the format, the format version, the snapshot number,
the library version,
the UTC time (ISO 8601 and unix seconds), the model (``model_to_dict``), the
engine settings (``SVI.to_dict``), step, records seen, the source offsets the
state includes, the daemon config, free-form extras, the SHA-256 and size of
``state.npz``, and ``checksum``: the SHA-256 of the canonical JSON (sorted
keys, no whitespace) of the document without the ``checksum`` field. Loading
verifies both checksums, cross-checks the JSON against the metadata inside
``state.npz``, reads the arrays with ``allow_pickle=False`` and rebuilds the
model from its registered name: nothing in a snapshot is ever executed.

The format version (``format_version``, an integer: :data:`FORMAT_VERSION`)
numbers the layout of a snapshot, both files together; it goes up with any
change that an older streamsvi could misread. A snapshot without the field was
written before it existed (streamsvi 0.1.0 and earlier): format version 1,
which loads as before. A snapshot with a format version above
:data:`FORMAT_VERSION` (a newer streamsvi wrote it) or below
:data:`OLDEST_FORMAT_VERSION` is refused with
:class:`IncompatibleSnapshotError`, naming both versions.

Examples
--------
>>> import tempfile
>>> import numpy as np
>>> from streamsvi.inference import SVI
>>> from streamsvi.models import BayesianGMM
>>> X = np.random.default_rng(0).normal(size=(100, 2))
>>> engine = SVI(BayesianGMM(3, 2), n_total=100)
>>> state, _ = engine.update(engine.init(X, seed=0), X[:20])
>>> with tempfile.TemporaryDirectory() as d:
...     store = CheckpointStore(d, keep=2)
...     snap = store.save(engine, state, offsets=[{"source": "points", "partition": 0, "offset": 20}])
...     loaded = load_snapshot(d)
...     (loaded.number, loaded.state.step, loaded.offsets[0]["offset"], store.list())
(1, 1, 20, [1])
>>> loaded.state.lam.array_equal(state.lam)
True
>>> check_compatible(loaded, engine)
[]
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ._version import __version__
from .inference.engine import SVI, EngineState
from .inference.gradients import GradientVI
from .inference.state import state_from_arrays, state_to_arrays
from .models import MODELS, model_to_dict
from .models.base import ChecksState, Model

try:  # POSIX advisory locks; on other systems writers are not serialised across processes
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

logger = logging.getLogger("streamsvi.checkpoint")

#: What ``snapshot.json`` is (a streamsvi checkpoint); its ``format_version`` says which layout.
FORMAT = "streamsvi.checkpoint/1"
#: The snapshot format version this streamsvi writes; bump on a change older versions could misread.
#: 1: streamsvi 0.1.0 and earlier (no ``format_version`` field); 2: the field (0.2.0).
FORMAT_VERSION = 2
#: The oldest snapshot format version this streamsvi still reads.
OLDEST_FORMAT_VERSION = 1
STATE_FILE = "state.npz"
META_FILE = "snapshot.json"
LATEST = "latest"
_LATEST_TMP = "latest.tmp"
#: The pointer to the snapshot scorers use (``streamsvi.load``, ``SnapshotWatcher``): written by
#: :meth:`CheckpointStore.promote` once a snapshot's held-out evidence is good enough
#: (``[promotion]``; docs/running.md, "Promotion"); absent when promotion is off or in
#: directories written before it existed (readers then follow ``latest``).
PROMOTED = "promoted"
_PROMOTED_TMP = "promoted.tmp"
#: The decision record next to the pointers: the promoted snapshot, its figure, the candidate
#: pending and the latest decisions with their reasons (checksummed; :func:`read_promotion`).
PROMOTION_FILE = "promotion.json"
_PROMOTION_TMP = "promotion.json.tmp"
PROMOTION_FORMAT = "streamsvi.promotion/1"
#: Decisions kept in the decision record (the oldest are dropped).
PROMOTION_DECISIONS_KEPT = 50
_LOCK = ".lock"
_SNAP_RE = re.compile(r"^snap-(\d{8,})$")
_TMP_PREFIX = ".tmp-"
_DEL_PREFIX = ".del-"
#: Where :meth:`CheckpointStore.resume` moves the snapshots it found corrupt.
QUARANTINE = "quarantine"
_CHUNK = 1 << 20
#: How often a reader re-resolves ``latest`` when a writer deleted the snapshot it was reading.
_RACE_RETRIES = 50
#: Bounds on what a reader takes from a checkpoint directory, so that a crafted one cannot
#: exhaust memory or CPU (docs/design.md, "Reading a snapshot safely"): the JSON metadata,
#: the ``latest`` pointer, and the members of ``state.npz``.
MAX_META_BYTES = 256 << 20
MAX_POINTER_BYTES = 4096
MAX_STATE_MEMBERS = 100_000
#: Settings may imply at most max(this, twice the state file) bytes of λ (``_check_param_size``).
MIN_PARAM_CEILING = 64 << 20


class CorruptSnapshotError(ValueError):
    """A snapshot is partial, damaged or fails its checksums."""


class IncompatibleSnapshotError(ValueError):
    """A valid snapshot that cannot be used here (other model, a format version not read here)."""


class _Vanished(Exception):
    """The snapshot directory disappeared while it was read (deleted by a writer's retention)."""


def snapshot_name(number: int) -> str:
    """The directory name of snapshot ``number``: ``snap-00000042``."""
    return f"snap-{int(number):08d}"


@dataclass(frozen=True)
class Snapshot:
    """One loaded (or just saved) snapshot.

    Attributes
    ----------
    path : Path
        The snapshot directory, ``<checkpoint dir>/snap-00000042``.
    number : int
        The snapshot number (increases by one per save).
    engine : SVI
        The engine, rebuilt from the saved model and engine settings.
    state : EngineState
        Step, λ, random stream and records seen, exactly as saved.
    offsets : object
        The source offsets the state includes, as given to :meth:`CheckpointStore.save`
        (after a JSON round trip), e.g. ``[{"source": topic, "partition": p, "offset": next}]``.
    config : dict
        The daemon config stored with the snapshot (``{}`` if none was given).
    created : datetime
        When the snapshot was written (timezone-aware, UTC).
    version : str
        The streamsvi version that wrote it.
    extra : dict
        Free-form extras (e.g. an ELBO history); ``{}`` if none.
    meta : dict
        The full ``snapshot.json`` document.
    """

    path: Path
    number: int
    engine: SVI
    state: EngineState
    offsets: object
    config: dict
    created: datetime
    version: str
    extra: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict, repr=False)

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def records_seen(self) -> int:
        return self.state.records_seen


# ---------------------------------------------------------------- JSON helpers
def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"object of type {type(obj).__name__} is not JSON-serialisable")


def _canonical_json(doc) -> bytes:
    """The bytes the ``snapshot.json`` checksum is taken over: sorted keys, no whitespace."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=_json_default).encode("utf-8")


def _to_json_value(name: str, value):
    """``value`` after a JSON round trip; a clear error if it cannot be stored."""
    try:
        return json.loads(_canonical_json(value))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be JSON-serialisable (dicts with string keys, lists, "
                        f"str, numbers, bool, None; numpy scalars/arrays are converted): {e}") from None


def _json_checksum(doc: dict) -> str:
    return hashlib.sha256(_canonical_json({k: v for k, v in doc.items() if k != "checksum"})).hexdigest()


# ------------------------------------------------------------ durable writes
def _fsync_dir(path) -> None:
    if os.name == "nt":  # pragma: no cover - directories cannot be fsynced on Windows
        return
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class _Refused(OSError):
    """A path in a snapshot directory that a reader does not follow (a link, a device, a FIFO)."""


def _open_plain(path: Path):
    """``(file, size)``: ``path`` opened for reading if it is a regular file and not a symbolic link.

    Snapshots hold only regular files that streamsvi wrote; a link (to
    ``/dev/zero``, or out of the directory), a FIFO or a device is refused with
    :class:`_Refused` before anything is read (``O_NOFOLLOW``, then ``fstat``;
    ``O_NONBLOCK`` so a FIFO cannot block the open). ``FileNotFoundError`` passes.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _Refused(f"{path.name} is a symbolic link; a snapshot holds only regular files") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _Refused(f"{path.name} is not a regular file (mode {stat.filemode(st.st_mode)})")
    return os.fdopen(fd, "rb"), st.st_size


def _check_npz_layout(f, size: int) -> None:
    """Refuse a ``state.npz`` whose members could make reading it costlier than its size.

    Before any array is read: every member is a stored (uncompressed) ``.npy``,
    as :func:`numpy.savez` writes them; the members together declare no more
    bytes than the file has; each header (read with numpy's bounded header
    reader) names a plain numeric dtype and a shape whose bytes fit its member.
    So reading the arrays costs at most the file's size, which the checksummed
    metadata declares. Raises ``ValueError`` saying what is wrong.
    """
    f.seek(0)
    try:
        zf = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError) as e:
        raise ValueError(f"not a zip archive ({e})") from None
    infos = zf.infolist()
    if len(infos) > MAX_STATE_MEMBERS:
        raise ValueError(f"{len(infos)} members, more than {MAX_STATE_MEMBERS}")
    total, names = 0, set()
    for info in infos:
        name = info.filename
        if name in names or not name.endswith(".npy"):
            raise ValueError(f"member {name[:80]!r} is not one .npy array")
        names.add(name)
        if info.compress_type != zipfile.ZIP_STORED:
            raise ValueError(f"member {name[:80]!r} is compressed; streamsvi writes stored members only "
                             f"(a compressed member can expand far beyond the file's size)")
        total += info.file_size
        if total > size:
            raise ValueError(f"its members declare {total} bytes, more than the file's {size}")
        with zf.open(info) as m:
            try:
                version = np.lib.format.read_magic(m)
                read = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                    else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(m)
            except (ValueError, OSError, SyntaxError, TypeError) as e:
                raise ValueError(f"member {name[:80]!r} has no valid .npy header ({e})") from None
        if dtype.hasobject or dtype.kind not in "biuf":
            raise ValueError(f"member {name[:80]!r} has dtype {dtype}; only numeric arrays are read")
        n_bytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if n_bytes > info.file_size:
            raise ValueError(f"member {name[:80]!r} declares shape {shape} ({n_bytes} bytes) in "
                             f"{info.file_size} bytes")
    f.seek(0)


def _check_param_size(path: Path, cls, params, state_bytes: int) -> None:
    """Refuse settings that imply a λ far larger than the state file holds, before any model is
    built (a forged ``n_features`` made the loader allocate gigabytes). λ is stored in the
    state file, so its float64s fit in it; the slack allows for the storage's own layout."""
    if not isinstance(params, dict):
        return                                   # model_from_dict reports it
    try:
        settings = cls.check_settings(params)
    except (ValueError, TypeError):
        return                                   # invalid settings: the constructor refuses them
    n = cls.param_size(settings)
    if n is not None and 8 * n > max(MIN_PARAM_CEILING, 2 * state_bytes):
        shown = {k: v for k, v in settings.items() if isinstance(v, int) and not isinstance(v, bool)}
        raise _corrupt(path, f"the model's settings {shown} imply a λ of {8 * n} bytes, but "
                             f"{STATE_FILE} holds {state_bytes}: the settings do not belong to this state")


def _sha256_of_file(f) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    f.seek(0)
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


class _DirLock:
    """An exclusive advisory lock on ``<directory>/.lock`` (no-op without fcntl)."""

    def __init__(self, directory: Path):
        self.path = directory / _LOCK
        self.fd = None

    def __enter__(self):
        if fcntl is not None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


# ------------------------------------------------------------------- reading
def _numbers(directory: Path) -> list[int]:
    """Numbers of the ``snap-*`` directories present, ascending."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        m = _SNAP_RE.match(name)
        if m and (directory / name).is_dir():
            out.append(int(m.group(1)))
    return sorted(out)


def pointer_text(directory, name: str = None) -> str | None:
    """The ``latest`` pointer's text (what a watcher compares), read with the bounds of the loader;
    ``name`` = :data:`PROMOTED` reads the ``promoted`` pointer instead."""
    return _read_pointer(Path(directory), name or LATEST)[0]


def pointer_number(directory, name: str = None) -> int | None:
    """The snapshot number the ``latest`` pointer (or ``name``, e.g. :data:`PROMOTED`) names, or
    None (none, or damaged)."""
    return _read_pointer(Path(directory), name or LATEST)[1]


def _read_pointer(directory: Path, name: str = None) -> tuple[str | None, int | None, str | None]:
    """``(raw text, number, problem)`` of the ``latest`` pointer (or of ``name``); text None if
    there is none."""
    name = name or LATEST
    try:
        f, size = _open_plain(directory / name)
    except FileNotFoundError:
        return None, None, None
    except _Refused as e:
        return f"<refused: {e}>", None, f"the {name!r} pointer is refused: {e}"
    except OSError as e:
        return f"<unreadable: {e}>", None, f"the {name!r} pointer could not be read: {e}"
    with f:
        if size > MAX_POINTER_BYTES:
            return f"<{size} bytes>", None, (f"the {name!r} pointer has {size} bytes, more than a "
                                             f"snapshot name (damaged)")
        raw = f.read(MAX_POINTER_BYTES)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return repr(raw), None, f"the {name!r} pointer is not UTF-8 text (damaged)"
    m = _SNAP_RE.match(text)
    if not m:
        return text, None, (f"the {name!r} pointer contains {text[:60]!r}, expected a snapshot "
                            f"name like 'snap-00000042' (damaged)")
    return text, int(m.group(1)), None


def _corrupt(path: Path, what: str) -> CorruptSnapshotError:
    return CorruptSnapshotError(
        f"snapshot {path} is unusable: {what}. It is skipped when loading a checkpoint "
        f"directory (an older snapshot is used); delete it or restore it from a backup.")


def _require(meta: dict, key: str, kind: type, path: Path):
    if key not in meta:
        raise _corrupt(path, f"{META_FILE} has no {key!r} field")
    v = meta[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise _corrupt(path, f"{META_FILE} field {key!r} is a {type(v).__name__}, expected {kind.__name__}")
    return v


def _check_format_version(path: Path, meta: dict) -> int:
    """The snapshot's format version (1 when absent), or :class:`IncompatibleSnapshotError`
    if this streamsvi does not read it."""
    version = meta.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise _corrupt(path, f"{META_FILE} field 'format_version' is {version!r}, expected an integer")
    wrote = f"written by streamsvi {meta.get('library_version', '?')}"
    reads = (f"this streamsvi {__version__} reads format versions {OLDEST_FORMAT_VERSION} to "
             f"{FORMAT_VERSION}")
    if version > FORMAT_VERSION:
        raise IncompatibleSnapshotError(
            f"snapshot {path} has format version {version} ({wrote}), newer than {reads}. "
            f"Upgrade streamsvi to at least the version that wrote it, or start from an empty "
            f"checkpoint directory.")
    if version < OLDEST_FORMAT_VERSION:
        raise IncompatibleSnapshotError(
            f"snapshot {path} has format version {version} ({wrote}), older than {reads}. "
            f"Resume or score it with the streamsvi that wrote it, or start from an empty "
            f"checkpoint directory.")
    return version


def _read_snapshot_dir(path: Path) -> Snapshot:
    """Load and verify one snapshot directory.

    Raises :class:`_Vanished` if the directory does not exist (any more),
    :class:`CorruptSnapshotError` if it is partial or damaged and
    :class:`IncompatibleSnapshotError` if it is valid but unreadable here.
    """
    if path.is_symlink():
        raise _corrupt(path, "the snapshot directory is a symbolic link; snapshots are never links")
    try:
        mf, msize = _open_plain(path / META_FILE)
    except FileNotFoundError:
        if not path.is_dir():
            raise _Vanished(str(path)) from None
        raise _corrupt(path, f"{META_FILE} is missing (partial snapshot)") from None
    except _Refused as e:
        raise _corrupt(path, str(e)) from None
    with mf:
        if msize > MAX_META_BYTES:
            raise _corrupt(path, f"{META_FILE} has {msize} bytes, more than the {MAX_META_BYTES} a "
                                 f"snapshot's metadata may have")
        raw = mf.read(MAX_META_BYTES + 1)
    if not raw:
        raise _corrupt(path, f"{META_FILE} is empty (truncated)")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _corrupt(path, f"{META_FILE} is not valid JSON, probably truncated or damaged ({e})") from None
    if not isinstance(meta, dict):
        raise _corrupt(path, f"{META_FILE} is not a JSON object")
    fmt = meta.get("format")
    if fmt != FORMAT:
        if isinstance(fmt, str) and fmt.startswith("streamsvi.checkpoint/"):
            raise IncompatibleSnapshotError(
                f"snapshot {path} has format {fmt!r} (written by streamsvi "
                f"{meta.get('library_version', '?')}); this streamsvi {__version__} reads {FORMAT!r}. "
                f"Upgrade streamsvi, or start from an empty checkpoint directory.")
        raise _corrupt(path, f"{META_FILE} has format {fmt!r}, expected {FORMAT!r}")
    _check_format_version(path, meta)
    checksum = meta.get("checksum")
    if not isinstance(checksum, dict) or checksum.get("algorithm") != "sha256":
        raise _corrupt(path, f"{META_FILE} has no sha256 'checksum' field")
    actual = _json_checksum(meta)
    if checksum.get("value") != actual:
        raise _corrupt(path, f"{META_FILE} checksum mismatch (expected {checksum.get('value')}, "
                             f"the content hashes to {actual}): the file was modified or damaged")

    sf = _require(meta, "state_file", dict, path)
    declared = sf.get("size")
    if isinstance(declared, bool) or not isinstance(declared, int) or declared < 0:
        raise _corrupt(path, f"{META_FILE} 'state_file' has no byte size")
    try:
        f, fsize = _open_plain(path / STATE_FILE)
    except FileNotFoundError:
        if not path.is_dir():
            raise _Vanished(str(path)) from None
        raise _corrupt(path, f"{STATE_FILE} is missing (partial snapshot)") from None
    except _Refused as e:
        raise _corrupt(path, str(e)) from None
    with f:  # one open file: verified bytes are the bytes parsed, even if the dir is deleted meanwhile
        if fsize != declared:                # hashing and parsing are bounded by the declared size
            raise _corrupt(path, f"{STATE_FILE} checksum mismatch ({fsize} bytes, {META_FILE} declares "
                                 f"{declared}; not hashed): the file is truncated or damaged")
        digest, size = _sha256_of_file(f)
        if digest != sf.get("sha256"):
            raise _corrupt(path, f"{STATE_FILE} checksum mismatch ({size} bytes, expected {sf.get('size')}; "
                                 f"sha256 {digest[:16]}…, expected {str(sf.get('sha256'))[:16]}…): "
                                 f"the file is truncated or damaged")
        f.seek(0)
        model_name = _require(meta, "model", dict, path).get("name")
        if model_name not in MODELS:
            raise IncompatibleSnapshotError(
                f"snapshot {path} holds model {model_name!r}, which this streamsvi {__version__} does "
                f"not know (known: {sorted(MODELS)}). Upgrade streamsvi or use another checkpoint directory.")
        _check_param_size(path, MODELS[model_name], meta["model"].get("params"), size)
        try:
            _check_npz_layout(f, size)
            with np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
            engine, state = state_from_arrays(arrays)
        except Exception as e:  # numpy/zip/JSON errors of a damaged file, or refused pickles
            raise _corrupt(path, f"{STATE_FILE} cannot be read ({type(e).__name__}: {e})") from None

    # The JSON must describe the state it was written with.
    number = _require(meta, "number", int, path)
    m = _SNAP_RE.match(path.name)
    if m and int(m.group(1)) != number:
        raise _corrupt(path, f"{META_FILE} says snapshot {number}, the directory is {path.name}")
    for key, have in (("step", state.step), ("records_seen", state.records_seen),
                      ("model", model_to_dict(engine.model)), ("engine", engine.to_dict())):
        if _to_json_value(key, have) != meta.get(key):
            raise _corrupt(path, f"{META_FILE} field {key!r} ({meta.get(key)!r}) does not match "
                                 f"{STATE_FILE} ({have!r})")
    try:
        created = datetime.fromisoformat(_require(meta, "created", str, path))
    except ValueError:
        raise _corrupt(path, f"{META_FILE} field 'created' is not an ISO 8601 time") from None
    if created.tzinfo is None:
        created = created.replace(tzinfo=timezone.utc)
    return Snapshot(path=path, number=number, engine=engine, state=state,
                    offsets=meta.get("offsets"), config=meta.get("config") or {},
                    created=created, version=str(meta.get("library_version")),
                    extra=meta.get("extra") or {}, meta=meta)


def _resolve(directory: Path) -> tuple[Snapshot | None, list[tuple[str, str]]]:
    """The newest valid snapshot of a checkpoint directory and what was wrong with the ones skipped.

    Follows ``latest``; if it is missing, unreadable or names a bad snapshot,
    tries the numbered snapshots older than it, newest first (all of them if
    there is no usable pointer). Snapshots newer than the pointer were never
    published (a crash between their rename and the pointer switch) and are
    not used. If a snapshot disappears while it is read and the pointer has
    moved meanwhile, a writer deleted it after publishing a newer one: start over.
    """
    for attempt in range(_RACE_RETRIES + 1):
        last_try = attempt == _RACE_RETRIES
        text, pointed, problem = _read_pointer(directory)
        problems: list[tuple[str, str]] = []
        if problem:
            problems.append((LATEST, problem))
        numbers = sorted(_numbers(directory), reverse=True)
        if pointed is not None:
            candidates = [pointed] + [n for n in numbers if n < pointed]
        else:
            candidates = numbers
        raced = False
        for n in candidates:
            path = directory / snapshot_name(n)
            try:
                return _read_snapshot_dir(path), problems
            except _Vanished:
                if not last_try and _read_pointer(directory)[0] != text:
                    raced = True
                    break
                what = "the 'latest' pointer names it but the directory is missing" if n == pointed \
                    else "the directory disappeared while it was read"
                problems.append((snapshot_name(n), what))
            except CorruptSnapshotError as e:
                problems.append((snapshot_name(n), str(e)))
        if not raced:
            return None, problems
    raise AssertionError("unreachable")  # pragma: no cover


def _warn_skipped(directory: Path, problems, found: Snapshot | None) -> None:
    then = f"using {found.path.name}" if found is not None else "no valid snapshot left"
    for name, what in problems:
        logger.warning("checkpoint %s: skipped %s: %s (%s)", directory, name, what, then)


def load_snapshot(path, follow: str = "latest") -> Snapshot:
    """Load a snapshot for resuming or scoring.

    Parameters
    ----------
    path : str or Path
        A snapshot directory (``.../snap-00000042``) or a checkpoint directory;
        for the latter the ``latest`` pointer is followed, falling back to
        older snapshots (with a logged warning for each one skipped) if it is
        damaged.
    follow : {"latest", "promoted"}
        Which pointer of a checkpoint directory to follow. ``"promoted"``: the
        snapshot promoted on held-out evidence (:data:`PROMOTED`); where there is
        no ``promoted`` pointer (promotion off, a directory older than it) or it is
        damaged or names an unusable snapshot (a warning says so), ``latest`` as
        above. Ignored for a snapshot directory.

    Returns
    -------
    Snapshot

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist, or the checkpoint directory holds no snapshot.
    CorruptSnapshotError
        The snapshot directory (or every snapshot of the checkpoint directory)
        is partial or fails its checksums; the message says what was wrong.
    IncompatibleSnapshotError
        The snapshot has a format version this streamsvi does not read
        (newer, or older than :data:`OLDEST_FORMAT_VERSION`) or an unknown model.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no snapshot at {path}: expected a checkpoint directory or a "
                                f"snapshot directory (snap-00000042)")
    if _SNAP_RE.match(path.name) or (path / META_FILE).exists() or (path / STATE_FILE).exists():
        try:
            return _read_snapshot_dir(path)
        except _Vanished:
            raise FileNotFoundError(f"snapshot {path} was deleted while it was read (retention "
                                    f"of a running writer?); load the checkpoint directory instead") from None
    if follow not in ("latest", "promoted"):
        raise ValueError(f"follow must be 'latest' or 'promoted', got {follow!r}")
    if follow == "promoted" and (promoted := _promoted_snapshot(path)) is not None:
        return promoted
    snap, problems = _resolve(path)
    _warn_skipped(path, problems, snap)
    if snap is not None:
        return snap
    if problems:
        details = "; ".join(f"{name}: {what}" for name, what in problems)
        raise CorruptSnapshotError(f"checkpoint directory {path} has no valid snapshot: {details}")
    raise FileNotFoundError(f"checkpoint directory {path} holds no snapshot yet (no 'latest' and no "
                            f"snap-* directories); is this the daemon's checkpoint directory?")


def _promoted_snapshot(directory: Path) -> Snapshot | None:
    """The snapshot the ``promoted`` pointer names, or None (no pointer; a damaged pointer or an
    unusable snapshot is logged: the caller falls back to ``latest``)."""
    for _ in range(_RACE_RETRIES + 1):
        text, number, problem = _read_pointer(directory, PROMOTED)
        if problem:
            logger.warning("checkpoint %s: %s; following 'latest' instead", directory, problem)
            return None
        if number is None:
            return None
        try:
            return _read_snapshot_dir(directory / snapshot_name(number))
        except _Vanished:
            if _read_pointer(directory, PROMOTED)[0] != text:
                continue                 # promoted anew meanwhile: read the new one
            logger.warning("checkpoint %s: the 'promoted' pointer names %s, which is missing; "
                           "following 'latest' instead", directory, snapshot_name(number))
            return None
        except CorruptSnapshotError as e:
            logger.warning("checkpoint %s: the promoted %s is unusable (%s); following 'latest' "
                           "instead", directory, snapshot_name(number), e)
            return None
    return None


def followed_pointer_text(directory, follow: str = "promoted") -> str | None:
    """The text of the pointer a reader following ``follow`` reads (what a watcher compares):
    the ``promoted`` pointer's where it exists and ``follow`` is ``"promoted"``, else ``latest``'s."""
    if follow == "promoted":
        text = _read_pointer(Path(directory), PROMOTED)[0]
        if text is not None:
            return f"{PROMOTED}:{text}"
    return _read_pointer(Path(directory), LATEST)[0]


def read_promotion(directory) -> dict | None:
    """The decision record (:data:`PROMOTION_FILE`) of a checkpoint directory, validated, or None.

    None where there is none; a record that is damaged (too large, not JSON, a wrong format or
    checksum, fields of the wrong type) is logged and also gives None: it never stops a loader
    or a resuming daemon (the ``promoted`` pointer, not this record, says what scorers load).

    The record: ``promoted`` (snapshot number or None), ``promoted_figure`` (its held-out log
    predictive density, nats per record), ``pending`` (the candidate being evaluated, or None),
    ``evaluation``, and ``decisions``: the latest :data:`PROMOTION_DECISIONS_KEPT` decisions,
    each ``{"candidate", "outcome" (promoted, rejected, superseded), "candidate_figure",
    "promoted_figure", "against", "records", "reason", "time"}``.
    """
    path = Path(directory) / PROMOTION_FILE
    try:
        f, size = _open_plain(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("checkpoint %s: the decision record %s is unreadable (%s); ignored",
                       directory, PROMOTION_FILE, e)
        return None
    with f:
        if size > MAX_META_BYTES:
            logger.warning("checkpoint %s: %s has %d bytes (damaged); ignored", directory,
                           PROMOTION_FILE, size)
            return None
        raw = f.read(MAX_META_BYTES + 1)
    problem = None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        doc, problem = None, f"not valid JSON ({e})"
    if problem is None:
        problem = _promotion_problem(doc)
    if problem is not None:
        logger.warning("checkpoint %s: the decision record %s is damaged (%s); ignored", directory,
                       PROMOTION_FILE, problem)
        return None
    return doc


def _promotion_problem(doc) -> str | None:
    """What is wrong with a decision record, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if doc.get("format") != PROMOTION_FORMAT:
        return f"format {doc.get('format')!r}, expected {PROMOTION_FORMAT!r}"
    checksum = doc.get("checksum")
    if not isinstance(checksum, dict) or checksum.get("value") != _json_checksum(doc):
        return "checksum mismatch"
    for key in ("promoted", "pending"):
        v = doc.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            return f"{key!r} is {v!r}, expected a snapshot number or null"
    fig = doc.get("promoted_figure")
    if fig is not None and (isinstance(fig, bool) or not isinstance(fig, (int, float))):
        return f"'promoted_figure' is {fig!r}, expected a number or null"
    if not isinstance(doc.get("decisions"), list) or not all(isinstance(d, dict) for d in doc["decisions"]):
        return "'decisions' is not a list of objects"
    return None


def _flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


_MISSING = "<not set>"


def _differences(kind: str, theirs: dict, ours: dict, keys=None) -> list[str]:
    """One line per setting that differs (only ``keys``, if given)."""
    a, b = _flatten(theirs), _flatten(ours)
    return [f"{kind} setting {k}: snapshot has {a.get(k, _MISSING)!r}, config has {b.get(k, _MISSING)!r}"
            for k in sorted(set(a) | set(b))
            if a.get(k, _MISSING) != b.get(k, _MISSING) and (keys is None or k in keys)]


def check_compatible(snapshot: Snapshot, engine: SVI) -> list[str]:
    """Check that ``snapshot`` can resume ``engine``; return the engine settings that differ.

    The model (name and every setting) must be the same: λ means nothing for
    another model. The exceptions are the settings a model lists in
    ``START_SETTINGS`` (e.g. ``init``), which only shape the initial λ: a
    resumed run keeps the snapshot's λ, so they are returned as notes. Engine
    settings (N, the schedule, M, ...) may be retuned between runs; their
    differences are returned so the caller can log them.

    Parameters
    ----------
    snapshot : Snapshot
    engine : SVI
        The engine built from the current configuration.

    Returns
    -------
    list of str
        One line per differing engine setting, e.g.
        ``"engine setting schedule.kappa: snapshot has 0.7, config has 0.6"``; empty if none.

    Raises
    ------
    IncompatibleSnapshotError
        Naming each differing model setting, e.g.
        ``"model setting n_components: snapshot has 10, config has 8"``.
    """
    theirs = snapshot.meta.get("model") or model_to_dict(snapshot.engine.model)
    ours = _to_json_value("model settings", model_to_dict(engine.model))
    start_only = set(type(engine.model).START_SETTINGS) if isinstance(engine.model, Model) else set()
    notes = []
    if theirs.get("name") != ours.get("name"):
        diffs = [f"model: snapshot has {theirs.get('name')!r}, config has {ours.get('name')!r}"]
    else:
        params_a, params_b = theirs.get("params") or {}, ours.get("params") or {}
        every = set(_flatten(params_a)) | set(_flatten(params_b))
        diffs = _differences("model", params_a, params_b, keys=every - start_only)
        notes = [f"{line} (it only shapes the initial λ; the snapshot's λ is resumed)"
                 for line in _differences("model", params_a, params_b, keys=start_only)]
    if diffs:
        raise IncompatibleSnapshotError(
            f"snapshot {snapshot.path} was made with another model, so its parameters cannot be "
            f"resumed: " + "; ".join(diffs) + ". Set the model back to the snapshot's settings, or "
            "point the daemon at a new (empty) checkpoint directory to start afresh.")
    own = getattr(engine, "check_state", None)       # GradientVI: q's covariance layout must match
    if own is not None:
        try:
            own(snapshot.state.lam)
        except ValueError as exc:
            raise IncompatibleSnapshotError(
                f"snapshot {snapshot.path} cannot be resumed with inference.covariance = "
                f"{engine.covariance!r}: {exc}. Set inference.covariance (and rank) back to the snapshot's "
                f"({snapshot.engine.covariance!r}), or point the daemon at a new (empty) checkpoint "
                f"directory to start afresh.") from None
    theirs_e = snapshot.meta.get("engine") or snapshot.engine.to_dict()
    return notes + _differences("engine", theirs_e, _to_json_value("engine settings", engine.to_dict()))


# ------------------------------------------------------------------- writing
class CheckpointStore:
    """Numbered, atomic snapshots in one directory, with retention (module docs).

    One writer (the daemon) saves; any number of readers may call
    :meth:`latest` or :func:`load_snapshot` concurrently, in threads or other
    processes, and always see a complete snapshot. Writers are serialised by
    an advisory lock on ``<directory>/.lock``, held only while saving and
    while cleaning up at open. Opening a store writes (it creates the
    directory, the lock file, and removes leftovers): scorers and other
    read-only users should call :func:`load_snapshot` instead, which never writes.

    Parameters
    ----------
    directory : str or Path
        The checkpoint directory; created if missing. Leftover ``.tmp-*`` and
        ``.del-*`` directories (from a crash mid-save) are removed.
    keep : int
        How many snapshots to keep, ≥ 1. Older ones are deleted only after a
        new snapshot is published durably.
    """

    def __init__(self, directory, keep: int = 3):
        if isinstance(keep, bool) or not isinstance(keep, (int, np.integer)) or keep < 1:
            raise ValueError(f"keep must be an integer >= 1 (snapshots to retain), got {keep!r}")
        self.directory = Path(directory)
        self.keep = int(keep)
        if self.directory.exists() and not self.directory.is_dir():
            raise NotADirectoryError(f"checkpoint directory {self.directory} exists and is not a directory")
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self.directory.parent)
        with _DirLock(self.directory):
            self._clean_leftovers()

    def __repr__(self):
        return f"CheckpointStore({str(self.directory)!r}, keep={self.keep})"

    def _clean_leftovers(self) -> None:
        removed = False
        for name in os.listdir(self.directory):
            p = self.directory / name
            if name.startswith((_TMP_PREFIX, _DEL_PREFIX)) and p.is_dir():
                logger.info("checkpoint %s: removing leftover %s (interrupted save or cleanup)",
                            self.directory, name)
                shutil.rmtree(p, ignore_errors=True)
                removed = True
            elif name in (_LATEST_TMP, _PROMOTED_TMP, _PROMOTION_TMP):
                p.unlink(missing_ok=True)
                removed = True
        if removed:
            _fsync_dir(self.directory)

    # ------------------------------------------------------------- queries
    def list(self) -> list[int]:
        """Numbers of the snapshots present, ascending (not verified; see :meth:`latest`)."""
        return _numbers(self.directory)

    def latest(self) -> Snapshot | None:
        """The newest valid snapshot, or None if there is none.

        Follows the ``latest`` pointer; if that snapshot is corrupt, partial
        or missing, falls back to older numbered snapshots, newest first, and
        logs a warning naming each one skipped and what was wrong with it.
        """
        snap, problems = _resolve(self.directory)
        _warn_skipped(self.directory, problems, snap)
        return snap

    def resume(self) -> Snapshot | None:
        """The snapshot a writer resumes from (:meth:`latest`), with the corrupt ones moved aside.

        Every snapshot that :meth:`latest` skipped as partial or damaged is
        renamed into ``quarantine/`` (as ``snap-<n>-<UTC time>``), whole, and a
        warning names where it went: retention never deletes it, and its
        number is never reused. Snapshots that merely vanished are not touched.
        """
        snap, problems = _resolve(self.directory)
        _warn_skipped(self.directory, problems, snap)
        bad = [name for name, _ in problems
               if _SNAP_RE.match(name) and (self.directory / name).is_dir()]
        if bad:
            with _DirLock(self.directory):
                qdir = self.directory / QUARANTINE
                qdir.mkdir(exist_ok=True)
                stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
                for name in bad:
                    target = qdir / f"{name}-{stamp}"
                    os.rename(self.directory / name, target)
                    logger.warning("checkpoint %s: moved unusable %s to %s (kept for inspection; "
                                   "retention never deletes it)", self.directory, name, target)
                _fsync_dir(qdir)
                _fsync_dir(self.directory)
        return snap

    def quarantined(self) -> list[Path]:
        """The snapshot directories :meth:`resume` moved into ``quarantine/``, sorted."""
        qdir = self.directory / QUARANTINE
        return sorted(p for p in qdir.iterdir() if p.is_dir()) if qdir.is_dir() else []

    def traces(self) -> list[str]:
        """What in the directory shows that it held snapshots before, one phrase each.

        A ``latest`` pointer, ``snap-*`` directories, quarantined snapshots,
        and the metric history (``history.jsonl``) all count; an empty list
        means a directory that never held a snapshot.
        """
        found = []
        text, _, _ = _read_pointer(self.directory)
        if text is not None:
            found.append(f"a 'latest' pointer naming {text[:60]!r}")
        if numbers := _numbers(self.directory):
            found.append(f"{len(numbers)} unusable snapshot director{'y' if len(numbers) == 1 else 'ies'} "
                         f"({', '.join(snapshot_name(n) for n in numbers)})")
        if quarantined := self.quarantined():
            found.append(f"{len(quarantined)} quarantined snapshot(s) in {self.directory / QUARANTINE}")
        if (self.directory / "history.jsonl").is_file():
            found.append("a metric history (history.jsonl) of an earlier run")
        return found

    # ---------------------------------------------------------------- save
    def save(self, engine: SVI, state: EngineState, offsets, config: dict | None = None,
             extra: dict | None = None) -> Snapshot:
        """Write a new snapshot and make it the latest; it is durable when this returns.

        Parameters
        ----------
        engine : SVI
            The engine (model and engine settings are stored).
        state : EngineState
            The state to save; it must include every record up to ``offsets``.
        offsets : JSON-serialisable
            The source offsets the state includes, e.g.
            ``[{"source": "points", "partition": 0, "offset": 1200}]`` (next offset to read).
            Committing these to Kafka is safe once ``save`` has returned.
        config : dict, optional
            The daemon config, stored as given (after a JSON round trip).
        extra : dict, optional
            Anything else to keep with the snapshot, e.g. ``{"elbo": [...]}``.

        Returns
        -------
        Snapshot
            The new snapshot (holding ``engine`` and ``state`` themselves).

        Raises
        ------
        TypeError, ValueError
            Bad arguments; nothing was written.
        OSError
            Writing failed; the previous latest snapshot is still the latest.
            Failing to delete old snapshots is only logged: the new one is durable.
        """
        if not isinstance(engine, (SVI, GradientVI)):
            raise TypeError(f"engine must be a streamsvi SVI or GradientVI engine, got {type(engine).__name__}")
        if not isinstance(state, EngineState):
            raise TypeError(f"state must be an EngineState, got {type(state).__name__}")
        if isinstance(engine.model, ChecksState):      # λ with a layout of its own (rows that grow)
            try:
                engine.model.check_state(state.lam, state.aux)
            except ValueError as exc:
                raise ValueError(f"state does not belong to this engine's model "
                                 f"{engine.model.name!r}: {exc}") from None
        elif set(state.lam) != set(prior := engine.model.prior()) or any(
                state.lam[k].shape != v.shape for k, v in prior.items()):
            raise ValueError(
                f"state does not belong to this engine's model {engine.model.name!r}: λ has "
                f"{ {k: state.lam[k].shape for k in state.lam} }, the model expects "
                f"{ {k: v.shape for k, v in prior.items()} }")
        if config is not None and not isinstance(config, dict):
            raise TypeError(f"config must be a dict (the daemon settings) or None, "
                            f"got {type(config).__name__}")
        if extra is not None and not isinstance(extra, dict):
            raise TypeError(f"extra must be a dict or None, got {type(extra).__name__}")
        if offsets is None:
            raise ValueError("offsets must be given: the source offsets this state includes (e.g. "
                             "[{'source': topic, 'partition': p, 'offset': next_offset}]; [] without a source)")
        offsets = _to_json_value("offsets", offsets)
        config = _to_json_value("config", config or {})
        extra = _to_json_value("extra", extra or {})
        arrays = state_to_arrays(engine, state)

        with _DirLock(self.directory):
            number = max([0, *_numbers(self.directory), _read_pointer(self.directory)[1] or 0]) + 1
            name = snapshot_name(number)
            final = self.directory / name
            tmp = self.directory / f"{_TMP_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(4)}"
            created = datetime.now(timezone.utc)
            try:
                os.mkdir(tmp)
                with open(tmp / STATE_FILE, "xb") as f:
                    np.savez(f, **arrays)
                    f.flush()
                    os.fsync(f.fileno())
                with open(tmp / STATE_FILE, "rb") as f:
                    digest, size = _sha256_of_file(f)
                meta = {
                    "format": FORMAT, "format_version": FORMAT_VERSION, "number": number,
                    "library_version": __version__,
                    "created": created.isoformat(), "created_unix": created.timestamp(),
                    "model": _to_json_value("model settings", model_to_dict(engine.model)),
                    "engine": _to_json_value("engine settings", engine.to_dict()),
                    "step": int(state.step), "records_seen": int(state.records_seen),
                    "offsets": offsets, "config": config, "extra": extra,
                    "state_file": {"name": STATE_FILE, "sha256": digest, "size": size},
                }
                meta["checksum"] = {"algorithm": "sha256", "over": "canonical JSON without 'checksum'",
                                    "value": _json_checksum(meta)}
                text = json.dumps(meta, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
                _write_durably(tmp / META_FILE, text.encode("utf-8"))
                _fsync_dir(tmp)
                os.rename(tmp, final)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            _fsync_dir(self.directory)
            # Publish: switch the pointer atomically.
            pointer_tmp = self.directory / _LATEST_TMP
            with open(pointer_tmp, "wb") as f:
                f.write((name + "\n").encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(pointer_tmp, self.directory / LATEST)
            _fsync_dir(self.directory)
            logger.info("checkpoint %s: saved %s (step %d, %d records)", self.directory, name,
                        state.step, state.records_seen)
            self._apply_retention(number)
        return Snapshot(path=final, number=number, engine=engine, state=state, offsets=offsets,
                        config=config, created=created, version=__version__, extra=extra, meta=meta)

    def write_promotion(self, record: dict, promote: int | None = None) -> None:
        """Write the decision record durably and, with ``promote``, move the ``promoted`` pointer.

        ``record`` holds ``promoted``, ``promoted_figure``, ``pending``, ``evaluation`` and
        ``decisions`` (:func:`read_promotion`); the format and a checksum are added, and only the
        latest :data:`PROMOTION_DECISIONS_KEPT` decisions are kept. The record goes first, then
        the pointer, each written to a temporary file, fsynced and renamed over the old one (as
        ``latest``): a crash leaves the old pointer or the new one, and a record that says more
        than the pointer (the pointer wins: a resumed daemon evaluates the candidate again).

        Raises
        ------
        ValueError
            ``promote`` names no snapshot of the directory.
        OSError
            Writing failed (the previous pointer and record stay).
        """
        doc = _to_json_value("promotion record", dict(record))
        doc["decisions"] = list(doc.get("decisions") or [])[-PROMOTION_DECISIONS_KEPT:]
        doc["format"] = PROMOTION_FORMAT
        doc.pop("checksum", None)
        doc["checksum"] = {"algorithm": "sha256", "over": "canonical JSON without 'checksum'",
                           "value": _json_checksum(doc)}
        with _DirLock(self.directory):
            if promote is not None and not (self.directory / snapshot_name(promote)).is_dir():
                raise ValueError(f"cannot promote snapshot {promote}: no {snapshot_name(promote)} in "
                                 f"{self.directory}")
            self._replace_durably(_PROMOTION_TMP, PROMOTION_FILE,
                                  (json.dumps(doc, sort_keys=True, indent=1, allow_nan=True) + "\n").encode())
            if promote is not None:
                self._replace_durably(_PROMOTED_TMP, PROMOTED, (snapshot_name(promote) + "\n").encode())
                logger.debug("checkpoint %s: promoted %s", self.directory, snapshot_name(promote))

    def _replace_durably(self, tmp_name: str, name: str, data: bytes) -> None:
        """``name`` in the directory replaced by ``data`` atomically and durably."""
        tmp = self.directory / tmp_name
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.directory / name)
        _fsync_dir(self.directory)

    def _apply_retention(self, newest: int) -> None:
        """Delete snapshots older than the newest ``keep`` complete ones (after publishing).

        The promoted snapshot (the ``promoted`` pointer's) is never deleted, and does not
        count among the ``keep``.

        "Complete" means both files are present (cheap; contents are verified
        on load). Each is renamed to ``.del-…`` first, so a reader sees it
        whole or not at all. Failures are logged, not raised: the new
        snapshot is already durable, and the next save retries.
        """
        kept = 0
        promoted = _read_pointer(self.directory, PROMOTED)[1]
        for n in sorted(_numbers(self.directory), reverse=True):
            if n > newest or n == promoted:  # never touch a snapshot newer than the one just
                continue                     # published, nor the one scorers follow (promoted)
            p = self.directory / snapshot_name(n)
            if kept < self.keep:
                if (p / STATE_FILE).is_file() and (p / META_FILE).is_file():
                    kept += 1
            else:
                doomed = self.directory / f"{_DEL_PREFIX}{p.name}-{secrets.token_hex(4)}"
                try:
                    os.rename(p, doomed)
                    shutil.rmtree(doomed)
                except OSError as e:
                    if getattr(e, "errno", None) == errno.ENOENT:
                        continue
                    logger.warning("checkpoint %s: could not delete old snapshot %s (%s); "
                                   "will retry at the next save", self.directory, p.name, e)
