"""Scoring from snapshots: what a scoring job loads, and a watcher that follows the daemon.

Scoring jobs load what the daemon wrote and never train::

    import streamsvi
    fitted = streamsvi.load("var/checkpoints/gmm")          # follows `latest`
    fitted.predict(X); fitted.responsibilities(X); fitted.predictive_logpdf(X)

    fitted = streamsvi.load("var/checkpoints/pmf")          # a rating model (PMF)
    mean, var = fitted.predict_rating(["u1"], ["m7"]); fitted.recommend("u1", k=10)

Loading goes through :func:`streamsvi.checkpoint.load_snapshot`: both
checksums are verified, arrays are read with ``allow_pickle=False`` and the
model is rebuilt from its registered name, so nothing in the file is ever
executed. A damaged newest snapshot is skipped (with a logged warning) in
favour of the previous one.

:class:`SnapshotWatcher` is for long-running scorers: ``watcher.current()``
returns the newest :class:`FittedModel`; when the daemon moves ``latest``,
the next :meth:`~SnapshotWatcher.refresh` (called by the background thread,
or by hand) loads the new snapshot completely and then swaps one reference,
so readers on other threads see either the old or the new model, never a
half-loaded one.

:class:`LineScorer` (and :func:`score_lines`) score text lines, one record
each, the way ``streamsvi score`` does: every line is decoded and validated by
the same codec and validator the daemon uses for the model's record kind (with
the ``validation`` settings stored in the snapshot), so a line the daemon would
dead-letter gets an error with the daemon's reason code and its line number.
"""
from __future__ import annotations

import functools
import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from .checkpoint import Snapshot, followed_pointer_text, load_snapshot
from .io.codecs import _orjson
from .io.validate import ModelChecked
from .models.base import ScoresRecords, StoredScaled, column_length, records_of_columns

log = logging.getLogger("streamsvi.scoring")

#: The scoring methods of a model that does not list its own ``scoring_methods``.
SCORING_METHODS = ("responsibilities", "predict", "predictive_logpdf")


@dataclass(frozen=True)
class FittedModel:
    """A model and its learned λ, loaded from a snapshot (read-only).

    Attributes
    ----------
    model : the model object (its settings are ``model.get_params()``)
    lam : NatParams, the learned natural parameters (LDA: λ itself, ``topic_word``,
        whatever form the snapshot stores it in)
    step, records_seen : int
    created : datetime (UTC)
    offsets : the source offsets the snapshot includes
    path : Path of the snapshot directory; number : its snapshot number
    version : the streamsvi version that wrote it
    extra : dict (e.g. ``elbo_history``)
    aux : the engine state's model-owned extras (PMF: id→row maps), None for other models
    config : the daemon config stored with the snapshot (``{}`` if none): scoring validates
        records with its ``validation`` section, as the daemon did

    Every scoring method the model lists in its ``scoring_methods`` (each a
    method ``f(lam, x, ...)``) is also a method of the fitted model with λ
    filled in: ``fitted.predict(x)`` is ``model.predict(lam, x)``. For a
    row-wise model (``aux`` not None) the state's ``aux`` is passed too, as
    the keyword ``aux``.
    """

    model: object
    lam: object
    step: int
    records_seen: int
    created: datetime
    offsets: object
    path: Path
    number: int
    version: str
    extra: dict
    engine_settings: dict
    aux: dict | None = None
    config: dict = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snap: Snapshot) -> "FittedModel":
        model, lam = snap.engine.model, snap.state.lam
        if isinstance(model, StoredScaled):            # λ stored scaled: present λ itself
            lam = model.dense_params(lam)
        return cls(model=model, lam=lam, step=snap.state.step,
                   records_seen=snap.state.records_seen, created=snap.created, offsets=snap.offsets,
                   path=snap.path, number=snap.number, version=snap.version, extra=dict(snap.extra),
                   engine_settings=snap.engine.to_dict(), aux=snap.state.aux,
                   config=dict(snap.config or {}))

    @property
    def settings(self) -> dict:
        """The model's settings as given to its constructor."""
        return {"name": self.model.name, **self.model.get_params()}

    @property
    def n_features(self) -> int:
        return self.model.n_features

    @property
    def scoring_methods(self) -> tuple[str, ...]:
        """The names of the scoring methods this fitted model offers."""
        names = self.model.scoring_methods or SCORING_METHODS
        return tuple(n for n in names if callable(getattr(self.model, n, None)))

    def __getattr__(self, name):
        # only called for names that are not attributes: the model's scoring methods
        if name.startswith("_") or name in ("model", "lam") or name not in self.scoring_methods:
            raise AttributeError(f"{type(self).__name__} of a {self.model.name!r} model has no "
                                 f"attribute {name!r}; its scoring methods are "
                                 f"{list(self.scoring_methods)}")
        method = getattr(self.model, name)
        lam = self.lam
        extra = {} if self.aux is None else {"aux": self.aux}

        def bound(*args, **kwargs):
            return method(lam, *args, **extra, **kwargs)

        bound.__name__ = name
        bound.__doc__ = method.__doc__
        return bound

    def check(self, x) -> np.ndarray:
        """Validate records the way the model does (raises ``ValueError`` naming the problem)."""
        return self.model.check_batch(x)

    def responsibilities(self, x) -> np.ndarray:
        """Posterior responsibilities E_q[c_n] of new records, shape (n, K)."""
        return self.model.responsibilities(self.lam, x)

    def predict(self, x) -> np.ndarray:
        """MAP component of each record."""
        return self.model.predict(self.lam, x)

    def predictive_logpdf(self, x) -> np.ndarray:
        """log p(x* | data): the posterior predictive log density of each record."""
        if self.aux is not None:
            return self.model.predictive_logpdf(self.lam, x, aux=self.aux)
        return self.model.predictive_logpdf(self.lam, x)

    def _model_method(self, name):
        fn = getattr(self.model, name, None)
        if fn is None:
            raise AttributeError(f"a {self.model.name!r} model has no {name}()")
        return fn

    def topic_proportions(self, x) -> np.ndarray:
        """Topic models: E_q[θ_d] of new documents, shape (n, K)."""
        return self._model_method("topic_proportions")(self.lam, x)

    def perword_bound(self, x, topic_kl: str = "none", n_docs=None) -> float:
        """Topic models: held-out bound per word of the documents ``x`` (see ``LDA``)."""
        return self._model_method("perword_bound")(self.lam, x, topic_kl, n_docs)

    def perplexity(self, x, topic_kl: str = "none", n_docs=None) -> float:
        """Topic models: exp(−perword_bound)."""
        return self._model_method("perplexity")(self.lam, x, topic_kl, n_docs)

    def __repr__(self) -> str:
        s = self.settings
        shown = ", ".join(f"{k}={v!r}" for k, v in list(s.items())[1:7]) + (", ..." if len(s) > 7 else "")
        return (f"FittedModel({s['name']}: {shown})\n"
                f"  snapshot {self.number} at {self.path}, written {self.created:%Y-%m-%d %H:%M:%S} UTC "
                f"by streamsvi {self.version}\n"
                f"  step {self.step}, {self.records_seen} records; scores: {', '.join(self.scoring_methods)}")

    def score_block(self, x, top_k: int = 10, columns=None) -> dict:
        """The scores of the records ``x`` (a decoded batch) as columns, ``{name: column}``.

        The column layout of :class:`streamsvi.models.ScoresRecords` (1-D arrays, 2-D
        arrays of probabilities, lists of JSON values): what :meth:`score` turns into
        dicts and what ``streamsvi score`` writes straight to JSON lines; the fast way
        to score many records. Mixtures: ``assignment`` (MAP component),
        ``responsibilities`` and ``log_density`` (the predictive log density). Other
        models say what theirs are (``score_columns``); ``top_k`` is used by the
        ratings models (PMF, HPF) for a record of a user alone. ``columns`` keeps only
        those columns, in that order (a mixture then computes only what they need:
        ``("log_density",)`` is its predictive density alone); ``ValueError`` names the
        model's columns for one it does not have.
        """
        model = self.model
        if not isinstance(model, ScoresRecords) and columns is not None and set(columns) <= {"log_density"}:
            return {"log_density": np.asarray(self.predictive_logpdf(self.check(x)), dtype=np.float64)}
        if isinstance(model, ScoresRecords):
            kw = {} if self.aux is None else {"aux": self.aux}
            if "top_k" in model.score_options:
                kw["top_k"] = top_k
            out = model.score_columns(self.lam, x, **kw)
        else:
            x = self.check(x)
            R = np.asarray(self.responsibilities(x))
            out = {"assignment": R.argmax(axis=1), "responsibilities": R,
                   "log_density": np.asarray(self.predictive_logpdf(x), dtype=np.float64)}
        if columns is None:
            return out
        return {name: out[name] for name in columns if name in out}

    def score_columns_of(self, columns) -> tuple:
        """``columns`` checked against the scores this model gives (``ValueError`` naming
        them): what ``streamsvi score --scores`` and :class:`LineScorer` keep."""
        columns, known = tuple(columns), self.score_column_names
        bad = [c for c in columns if c not in known]
        if bad or not columns:
            raise ValueError(f"{self.model.name!r} scores have no column(s) {bad}; choose from {list(known)}"
                             if bad else f"no score column named; choose from {list(known)}")
        return columns

    @property
    def score_column_names(self) -> tuple:
        """The names of the score columns this model gives (:meth:`score_block`)."""
        if isinstance(self.model, ScoresRecords):
            return tuple(self.model.score_column_names)
        return ("assignment", "responsibilities", "log_density")

    def score(self, x, top_k: int = 10) -> list[dict]:
        """Every scoring output for each record of ``x``, as JSON-ready dicts.

        ``x`` is a decoded batch (an array, a CSR matrix, :class:`~streamsvi.models.Ratings`,
        sequences) or a list of JSON records as the daemon reads them (dicts: ``{"user":
        "u1", "item": 3}``, ``{"ids": [...], "counts": [...]}``, ``{"x": [...]}``); JSON
        records are decoded and validated as ``streamsvi score`` does, and a record that
        cannot be scored gets ``{"reason": r, "error": "r: ..."}`` in its place. The dicts
        are :meth:`score_block`'s columns, one per record; a ratings model gives
        ``top_k`` items to a record of a user alone (PMF, HPF).
        """
        if isinstance(x, (list, tuple)) and x and all(isinstance(v, dict) for v in x):
            lines = [(i, json.dumps(v)) for i, v in enumerate(x)]
            fields = (self.config.get("source") or {}).get("fields")    # the daemon's, for dense objects
            out = LineScorer(self, "jsonl", fields, top_k=top_k)(lines)
            for rec in out:
                del rec["line"]
            return out
        return records_of_columns(self.score_block(x, top_k=top_k))


def load(path, follow: str = "promoted") -> FittedModel:
    """Open a snapshot directory, or a checkpoint directory (following its ``promoted`` pointer).

    ``follow="promoted"`` (the default) loads the snapshot the daemon promoted on held-out
    evidence (``[promotion]``), or ``latest`` where there is no ``promoted`` pointer (promotion
    off, a directory written before it); ``follow="latest"`` loads the newest snapshot.
    Verifies the checksums and never executes code from the files.

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> from streamsvi import SVI, BayesianGMM
    >>> from streamsvi.checkpoint import CheckpointStore
    >>> X = np.random.default_rng(0).normal(size=(200, 2))
    >>> engine = SVI(BayesianGMM(2, 2), n_total=200)
    >>> state, _ = engine.update(engine.init(X, seed=0), X)
    >>> d = tempfile.mkdtemp()
    >>> _ = CheckpointStore(d).save(engine, state, offsets=[])
    >>> fitted = load(d)
    >>> fitted.step, fitted.predict(X[:3]).shape
    (1, (3,))
    """
    return FittedModel.from_snapshot(load_snapshot(path, follow=follow))


class SnapshotWatcher:
    """The promoted (or newest) snapshot of a checkpoint directory, swapped in as the daemon writes.

    Parameters
    ----------
    directory : str or Path
        The daemon's checkpoint directory.
    poll_seconds : float
        How often the background thread (:meth:`start`) looks at the pointer it follows.
    follow : {"promoted", "latest"}
        ``"promoted"`` (default): the snapshot the daemon promoted on held-out evidence, or
        ``latest`` while the directory has no ``promoted`` pointer; ``"latest"``: every new
        snapshot.
    on_swap : callable, optional
        ``on_swap(fitted)`` after each swap (on the refreshing thread).

    ``current()`` is safe from any number of threads: it returns one
    immutable :class:`FittedModel` reference, replaced whole by ``refresh``.
    """

    def __init__(self, directory, poll_seconds: float = 1.0, on_swap=None, follow: str = "promoted"):
        if follow not in ("promoted", "latest"):
            raise ValueError(f"follow must be 'promoted' or 'latest', got {follow!r}")
        self.follow = follow
        self.directory = Path(directory)
        self.poll_seconds = float(poll_seconds)
        self.on_swap = on_swap
        self._lock = threading.Lock()         # serialises refreshes, not readers
        self._current = load(self.directory, follow=follow)
        self._pointer = self._read_pointer()
        self._stop = threading.Event()
        self._thread = None
        self.swaps = 0

    def _read_pointer(self):
        return followed_pointer_text(self.directory, self.follow)   # bounded, never follows a link

    def current(self) -> FittedModel:
        """The newest fully loaded model."""
        return self._current

    def refresh(self) -> bool:
        """Load and swap in the snapshot the followed pointer names if it moved; True if it swapped."""
        with self._lock:
            pointer = self._read_pointer()
            if pointer == self._pointer:
                return False
            try:
                fitted = load(self.directory, follow=self.follow)
            except (OSError, ValueError) as exc:   # keep serving the old model
                log.warning("could not load the new snapshot in %s (%s); keeping snapshot %d",
                            self.directory, exc, self._current.number)
                return False
            self._pointer = pointer
            if fitted.number == self._current.number:
                return False
            self._current = fitted                # one reference assignment: atomic for readers
            self.swaps += 1
        if self.on_swap is not None:
            self.on_swap(fitted)
        return True

    def start(self) -> "SnapshotWatcher":
        """Refresh in a daemon thread every ``poll_seconds``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="streamsvi-watcher", daemon=True)
            self._thread.start()
        return self

    def _loop(self):
        while not self._stop.wait(self.poll_seconds):
            self.refresh()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class LineScorer:
    """Scores numbered text lines, one record per line, as the daemon would read them.

    Parameters
    ----------
    fitted : FittedModel
    fmt : {"jsonl", "csv"}
        JSON lines (any model: the record kind's JSON codec), or CSV rows of
        numbers (models with dense records only).
    fields : sequence of str, optional
        JSON object field names (the config's ``source.fields``).
    top_k : int
        Ratings models (PMF, HPF): how many items a record of a user alone gets.
    columns : sequence of str, optional
        Only these score columns, in this order (``streamsvi score --scores``); a mixture
        asked for ``("log_density",)`` computes its predictive density alone.

    Raises
    ------
    ValueError
        A format or ``fields`` the model's records do not have.

    Calling the scorer with ``[(line_number, text), ...]`` returns one dict
    per non-blank line, in line order: ``{"line": n, **scores}`` (the
    snapshot's :meth:`FittedModel.score` of that record), or ``{"line": n,
    "reason": r, "error": "r: what was wrong"}``. ``r`` is the reason code
    the daemon dead-letters such a record with: the codec's decode errors
    (``json_invalid``, ``wrong_shape``, ``not_numeric``, …), the kind's
    validator (``non_finite``, ``out_of_range``, ``too_large``, …, with the
    snapshot's stored ``validation`` settings). Lines are decoded together
    when they all parse and validate (one vectorised score), one by one
    otherwise.

    :meth:`score_bytes` does the same for raw lines and returns the JSON lines
    themselves, written from the score columns without a dict per record (what
    ``streamsvi score`` and a scorer should call for speed): compact JSON with the
    same values as the dicts (floats exact, probabilities ``rint(p·10¹²)/10¹²``).
    :meth:`score_text` takes a whole block of raw lines, and reads a block of plain
    dense JSON rows in one pass.

    Examples
    --------
    >>> import numpy as np, tempfile
    >>> from streamsvi import SVI, BayesianGMM
    >>> from streamsvi.checkpoint import CheckpointStore
    >>> X = np.random.default_rng(0).normal(size=(200, 2))
    >>> engine = SVI(BayesianGMM(2, 2), n_total=200)
    >>> state, _ = engine.update(engine.init(X, seed=0), X)
    >>> d = tempfile.mkdtemp()
    >>> _ = CheckpointStore(d).save(engine, state, offsets=[])
    >>> out = LineScorer(load(d), "jsonl")([(1, "[0.5, 1.0]"), (2, "[NaN, 1]"), (4, "[1, 2, 3]")])
    >>> [(r["line"], r.get("reason")) for r in out]
    [(1, None), (2, 'non_finite'), (4, 'wrong_shape')]
    """

    def __init__(self, fitted: FittedModel, fmt: str = "jsonl", fields=None, top_k: int = 10, columns=None):
        from .io.dense import CsvCodec, DenseKind, JsonCodec
        from .io.records import record_kind

        if fmt not in ("jsonl", "csv"):
            raise ValueError(f"format must be 'jsonl' or 'csv', got {fmt!r}")
        self.fitted = fitted
        self.top_k = top_k
        self.columns = None if columns is None else fitted.score_columns_of(columns)
        self.kind = record_kind(fitted.model)
        if fmt == "csv":
            if not isinstance(self.kind, DenseKind):
                raise ValueError(f"{self.kind.name!r} records (model {fitted.model.name!r}) are scored "
                                 f"from JSON lines, not CSV; use --format jsonl")
            if fields is not None:
                raise ValueError("--fields names JSON object fields; CSV rows are read in column order")
            self.codec = CsvCodec(fitted.n_features)
        else:
            self.codec = self.kind.make_codec("json", fitted.model, {"fields": fields} if fields else {})
        checks = self.kind.make_validator(fitted.model, dict(fitted.config.get("validation") or {}))
        self.validator = ModelChecked(checks, fitted.model.check_batch, self.kind)
        own = getattr(self.kind, "scoring_codec_validator", None)   # a kind that scores differently
        if own is not None and fmt == "jsonl":                      # (labelled: the label is optional)
            self.codec, self.validator = own(fitted.model, fields,
                                             dict(fitted.config.get("validation") or {}))
        # plain JSON rows of D numbers: score_text's one-pass block path applies
        self._dense_rows = type(self.codec) is JsonCodec and self.codec.fields is None

    def __call__(self, lines) -> list[dict]:
        numbers, payloads = [], []
        for n, text in lines:
            text = text.strip()
            if text:
                numbers.append(n)
                payloads.append(text.encode("utf-8", "replace"))
        if not payloads:
            return []
        kept, columns, errors = self._run(numbers, payloads)
        if columns is not None:
            for n, sc in zip(kept, records_of_columns(columns)):
                errors[n] = {"line": n, **sc}
        return [errors[n] for n in sorted(errors)]

    def score_bytes(self, numbers, payloads, key: str = "line") -> tuple[bytes, int, int]:
        """JSON lines (bytes) for the stripped, non-blank lines ``payloads`` (bytes) numbered
        ``numbers`` (ascending, unique), with the number of lines scored and of lines with an error.

        The same records as :meth:`__call__` (``json.loads`` of each line equals its dict),
        in line order; the scores are written from the columns in one vectorised pass
        (:func:`jsonl_of_columns`). ``key`` names the number in the output (a scorer of
        Kafka messages: the payloads of one partition, ``numbers`` their offsets,
        ``key="offset"``).
        """
        if not payloads:
            return b"", 0, 0
        kept, columns, errors = self._run(numbers, payloads)
        text = jsonl_of_columns(columns, kept, key) if columns is not None else b""
        if not errors:
            return text, len(kept), 0
        if key != "line":
            errors = {n: {key: rec.pop("line"), **rec} for n, rec in errors.items()}
        lines = dict(zip(kept, text.splitlines(keepends=True))) if kept else {}
        lines.update((n, json.dumps(rec, separators=_COMPACT).encode() + b"\n") for n, rec in errors.items())
        return b"".join(lines[n] for n in sorted(lines)), len(kept), len(errors)

    def score_text(self, text: bytes, first: int = 1, n_lines: int | None = None) -> tuple[bytes, int, int]:
        """:meth:`score_bytes` of a block of raw input lines (bytes, split at ``\\n``),
        numbered from ``first``: blank lines get no output line. ``n_lines``, if the
        caller knows it, is the number of lines (of ``\\n``, plus one for a last line
        without one).

        Dense records in JSON lines that are all plain ``[x_1, ..., x_D]`` arrays and all
        valid take one pass over the whole block: one flat parse
        (:func:`~streamsvi.io.codecs.parse_json_rows`), one validation, one score, one
        write, and no Python object per line. Anything else (a bad or blank line,
        objects, CSV, other record kinds) goes line by line through :meth:`score_bytes`,
        with the same output.
        """
        if not text:
            return b"", 0, 0
        if not text.endswith(b"\n"):
            text += b"\n"
        n = text.count(b"\n") if n_lines is None else n_lines
        limit = self.validator.max_message_bytes                 # every line within the size limit
        if self._dense_rows and len(text) > limit:
            breaks = np.flatnonzero(np.frombuffer(text, np.uint8) == 10)
            fits = int(np.diff(breaks, prepend=-1).max()) - 1 <= limit
        else:
            fits = self._dense_rows
        if fits:
            from .io.codecs import parse_json_rows
            from .io.validate import all_valid_safely

            x = parse_json_rows(text, n, self.fitted.n_features)
            if x is not None and all_valid_safely(self.validator, x):
                try:
                    columns = self.fitted.score_block(x, top_k=self.top_k, columns=self.columns)
                except ValueError:              # the model refuses one: found line by line below
                    columns = None
                if columns is not None:
                    return jsonl_of_columns(columns, np.arange(first, first + n)), n, 0
        lines = text.split(b"\n")[:-1]
        numbers, payloads = [], []
        for i, line in enumerate(lines, first):
            line = line.strip()
            if line:
                numbers.append(i)
                payloads.append(line)
        return self.score_bytes(numbers, payloads)

    def _run(self, numbers, payloads):
        """Decode, validate and score: (line numbers scored, their score columns or None,
        {line number: error dict})."""
        from .io.codecs import DecodeError, decode_many_safely, decode_rows_safely
        from .io.validate import all_valid_safely, validate_safely

        kind = self.kind
        fast = None
        if max(map(len, payloads)) <= self.validator.max_message_bytes:
            fast = decode_many_safely(self.codec, payloads)
        if fast is not None and kind.n_records(fast) == len(payloads) and all_valid_safely(self.validator, fast):
            return self._score(numbers, fast, {})
        out, parts, where = {}, [], []
        for n, payload in zip(numbers, payloads):
            problem = self.validator.check_size(payload)
            if problem is not None:
                out[n] = _error(n, *problem)
                continue
            try:
                part = decode_rows_safely(self.codec, payload)
            except DecodeError as exc:
                out[n] = _error(n, exc.reason, exc.message)
                continue
            if kind.n_records(part) != 1:
                out[n] = _error(n, "wrong_shape", f"a line must hold one record, got {kind.n_records(part)}")
                continue
            parts.append(part)
            where.append(n)
        if not parts:
            return [], None, out
        good, rejected = validate_safely(self.validator, kind, kind.concat(parts))
        bad = {i for i, _, _ in rejected}
        for i, reason, message in rejected:
            out[where[i]] = _error(where[i], reason, message)
        kept = [n for i, n in enumerate(where) if i not in bad]
        if not kept:
            return [], None, out
        return self._score(kept, good, out)

    def _score(self, numbers, batch, errors):
        """Score valid records; a record the model still refuses gets ``invalid`` (found one by one)."""
        fitted, kind, top_k = self.fitted, self.kind, self.top_k
        try:
            return numbers, fitted.score_block(batch, top_k=top_k, columns=self.columns), errors
        except ValueError:
            pass
        ok = []
        for i, n in enumerate(numbers):
            try:
                fitted.score_block(kind.take(batch, slice(i, i + 1)), top_k=top_k, columns=self.columns)
                ok.append(i)
            except ValueError as exc:
                errors[n] = {"line": n, "reason": "invalid", "error": f"invalid: {exc}"}
        if not ok:
            return [], None, errors
        columns = fitted.score_block(kind.take(batch, np.asarray(ok, dtype=np.int64)), top_k=top_k,
                                     columns=self.columns)
        return [numbers[i] for i in ok], columns, errors


def _error(line: int, reason: str, message: str) -> dict:
    return {"line": line, "reason": reason, "error": f"{reason}: {message}"}


def score_lines(fitted: FittedModel, lines, fmt: str = "jsonl", fields=None, top_k: int = 10) -> list[dict]:
    """``LineScorer(fitted, fmt, fields, top_k)(lines)``: see :class:`LineScorer`."""
    return LineScorer(fitted, fmt, fields, top_k)(lines)

# ------------------------------------------------------------ JSON lines from score columns
#
# Every column becomes a block of text rows padded with NUL bytes (JSON text never holds
# a NUL: json.dumps escapes it), the blocks and the constant pieces are laid side by
# side in one byte matrix, and the lines are the matrix's non-NUL bytes in order. The
# lines are compact JSON (no blank after "," and ":"), as orjson writes them.


def _digit_groups() -> np.ndarray:
    """Three decimal digits per uint32 (bytes "ddd", NULs where a digit is left out), in five
    tables of 1000: all digits; trailing zeros as NUL (the last group of a fraction); the same
    keeping the first digit (the first decimal: "0.0"); leading zeros as NUL, 0 as nothing
    (the first groups of an integer); leading zeros as NUL, 0 as "0" (an integer below 1000)."""
    table = np.zeros((5, 1000, 4), dtype=np.uint8)
    for i in range(1000):
        d = f"{i:03d}".encode()
        table[0, i, :3] = list(d)
        short = d.rstrip(b"0")
        table[1, i, :len(short)] = list(short)
        short = short or b"0"
        table[2, i, :len(short)] = list(short)
        lead = d.lstrip(b"0")
        table[3, i, :len(lead)] = list(lead)
        lead = lead or b"0"
        table[4, i, :len(lead)] = list(lead)
    return table.reshape(5000, 4).view("<u4").reshape(5000)


_GROUPS = _digit_groups()
#: the most bytes a padded column may take in one block before the writer goes record by record
_MAX_BLOCK_BYTES = 64 << 20
#: compact JSON separators, the writer's (and the error lines')
_COMPACT = (",", ":")


class _Fallback(Exception):
    """A column the vectorised writer does not write (e.g. ±inf): write the block record by record."""


def _bytes_rows(a: np.ndarray) -> np.ndarray:
    """A fixed-width bytes array ``a`` (n,) as (n, w) uint8 rows, NUL-padded."""
    if a.dtype.itemsize == 0:
        a = a.astype("S1")
    if len(a) * a.dtype.itemsize > _MAX_BLOCK_BYTES:
        raise _Fallback
    return np.ascontiguousarray(a).view(np.uint8).reshape(len(a), a.dtype.itemsize)


@functools.lru_cache(maxsize=64)
def _prefix_masks(w: int) -> np.ndarray:
    """(w + 1, w) uint8: row l keeps the first l bytes of a row of w (ones), the rest zeros."""
    return (np.arange(w)[None, :] < np.arange(w + 1)[:, None]).astype(np.uint8)


def _cut(text: bytes, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The pieces ``text[starts[i]:ends[i]]`` as rows of an (n, w) uint8 matrix, NUL-padded.

    One gather of w-byte windows (a sliding-window view of the text) and one mask: no
    Python object per piece."""
    lens = ends - starts
    w = max(int(lens.max()), 1) if len(lens) else 1
    if len(lens) * w > _MAX_BLOCK_BYTES:
        raise _Fallback
    padded = np.concatenate([np.frombuffer(text, np.uint8), np.zeros(w, np.uint8)])
    rows = np.lib.stride_tricks.sliding_window_view(padded, w)[starts]
    rows *= _prefix_masks(w)[lens]
    return rows


def _int_text(v: np.ndarray) -> np.ndarray:
    """Integers as decimal text rows: digit tables for 0 <= v < 10¹², numpy's text otherwise."""
    v = np.asarray(v).astype(np.int64, copy=False)
    if not len(v):
        return np.zeros((0, 1), np.uint8)
    lo, hi = int(v.min()), int(v.max())
    if lo < 0 or hi >= 10 ** 12:
        widest = max(abs(lo), abs(hi))
        return _bytes_rows(v.astype(f"S{len(str(widest)) + 1}"))
    n_groups = (len(str(hi)) + 2) // 3                   # groups of three digits, last first
    out = np.empty((len(v), n_groups), "<u4")
    rest = v
    for j in range(n_groups - 1, -1, -1):
        if j:
            rest, g = np.divmod(rest, 1000)
        else:
            g = rest
        if j == n_groups - 1:                             # the last group: "0" for the number 0
            table = np.where(v < 1000, 4000, 0) if n_groups > 1 else 4000
        else:                                             # a leading group: its zeros left out
            table = np.where(v < 1000 ** (n_groups - j), 3000, 0) if j else 3000
        out[:, j] = _GROUPS[g + table]
    return out.view(np.uint8).reshape(len(v), 4 * n_groups)


def _float_text(v: np.ndarray) -> np.ndarray:
    """Shortest round-trip text of finite floats (each reads back as exactly that float).

    With orjson: its writer over the whole array (Ryu), cut at the commas; without: numpy's
    Dragon4 (the digits of Python's ``repr``), about 30 times slower."""
    if not np.isfinite(v).all():
        raise _Fallback
    if _orjson is None:
        return _bytes_rows(v.astype("S24"))            # the longest: -2.2250738585072014e-308
    text = _orjson.dumps(np.ascontiguousarray(v, dtype=np.float64), option=_orjson.OPT_SERIALIZE_NUMPY)
    commas = np.flatnonzero(np.frombuffer(text, np.uint8) == 44)     # "[a,b,...]"
    if len(commas) != len(v) - 1:
        raise _Fallback
    starts = np.empty(len(v), np.int64)
    starts[0], starts[1:] = 1, commas + 1
    ends = np.empty(len(v), np.int64)
    ends[:-1], ends[-1] = commas, len(text) - 1
    return _cut(text, starts, ends)


def _probability_text(P: np.ndarray) -> np.ndarray:
    """``[p1,p2,...]`` per row: each p = rint(p·10¹²)/10¹² in [0, 1] (``rounded_probabilities``).

    With orjson: that float's shortest round-trip text ("0.25", "1.87046e-7"); without: its
    fixed-point text with the trailing zeros dropped ("0.000000187046"). Both read back as
    exactly rint(p·10¹²)/10¹² (the division is correctly rounded)."""
    n, K = P.shape
    m = np.multiply(np.asarray(P, dtype=np.float64), 1e12, order="C")   # C order: orjson's
    np.rint(m, out=m)
    if not ((m >= 0) & (m <= 1e12)).all():             # also NaN
        raise _Fallback
    if _orjson is not None and K:
        m /= 1e12
        text = _orjson.dumps(m, option=_orjson.OPT_SERIALIZE_NUMPY)   # "[[a,b],[c,d]]"
        a = np.frombuffer(text, np.uint8)
        opens, closes = np.flatnonzero(a == 91)[1:], np.flatnonzero(a == 93)[:-1] + 1
        if len(opens) != n or len(closes) != n:
            raise _Fallback
        return _cut(text, opens, closes)
    hi, lo = np.divmod(m.astype(np.int64), 10 ** 6)         # 32-bit arithmetic from here
    whole, hi = np.divmod(hi.astype(np.int32), 10 ** 6)
    g0, g1 = np.divmod(hi, 1000)
    g2, g3 = np.divmod(lo.astype(np.int32), 1000)
    el = np.empty((n, K, 6), dtype="<u4")              # "w." | ddd | ddd | ddd | ddd | ","
    el[:, :, 0] = ((48 + whole) << 16) | (46 << 24)
    rest0 = lo == 0
    el[:, :, 1] = _GROUPS[g0 + np.where(rest0 & (g1 == 0), 2000, 0)]
    el[:, :, 2] = _GROUPS[g1 + np.where(rest0, 1000, 0)]
    el[:, :, 3] = _GROUPS[g2 + np.where(g3 == 0, 1000, 0)]
    el[:, :, 4] = _GROUPS[1000 + g3]
    el[:, :, 5] = 44
    if K:
        el[:, K - 1, 5] = 0
    body = el.view(np.uint8).reshape(n, K * 24)
    edge = np.ones((n, 1), np.uint8)
    return np.concatenate([edge * 91, body, edge * 93], axis=1)      # [ ... ]


def _json_text(values: list) -> tuple[np.ndarray, np.ndarray | None]:
    """``json.dumps`` of each value (``None``: absent) as rows; and the presence mask or None."""
    present = None
    if any(v is None for v in values):
        present = np.array([v is not None for v in values], dtype=bool)
    elif set(map(type, values)) == {str}:
        joined = "".join(values)                      # plain printable ASCII ids: quote them at once
        if joined.isascii() and joined.isprintable() and '"' not in joined and "\\" not in joined:
            quote = np.full((len(values), 1), 34, np.uint8)
            return np.concatenate([quote, _bytes_rows(np.array(values, dtype=bytes)), quote], axis=1), None
    dumps = json.dumps
    encoded = [b"" if v is None else dumps(v, separators=_COMPACT).encode() for v in values]
    return _bytes_rows(np.array(encoded, dtype=bytes)), present


def jsonl_of_columns(columns: dict, lines, key: str = "line") -> bytes:
    """One compact JSON line per record of score columns, ``{"line":n,"name":value,...}``, as bytes.

    ``lines`` are the integers of the first key, ``key`` (e.g. a scorer's input offsets).

    Every column is turned into text at once (orjson's writer over the whole column for
    floats and probabilities, numpy's float text without orjson; digit tables for
    integers; ``json.dumps`` only for the values of list columns) and the lines are the
    non-NUL bytes of one padded byte matrix. Floats are written in shortest round-trip
    form, so ``json.loads`` of each line equals ``{"line": n, **records_of_columns(columns)[i]}``
    exactly (probabilities: :func:`~streamsvi.models.base.rounded_probabilities`); a block
    holding something the vectorised writer does not write (±inf) is written record by
    record with ``json.dumps``.
    """
    n = column_length(columns)
    numbers = np.asarray(lines, dtype=np.int64)
    if len(numbers) != n:
        raise ValueError(f"{len(numbers)} line numbers for {n} scored records")
    if n == 0:
        return b""
    try:
        first = np.frombuffer(b"{" + json.dumps(key).encode() + b":", np.uint8)
        blocks = [np.broadcast_to(first, (n, len(first))), _int_text(numbers)]
        for name, v in columns.items():
            present = None
            if isinstance(v, np.ndarray) and v.ndim == 2:
                d = _probability_text(v)
            elif isinstance(v, np.ndarray) and v.dtype.kind == "f":
                nan = np.isnan(v)
                if nan.any():
                    present = ~nan
                    v = np.where(nan, 0.0, v)
                d = _float_text(v)
            elif isinstance(v, np.ndarray) and v.dtype.kind == "b":
                d = _bytes_rows(np.where(v, b"true", b"false"))
            elif isinstance(v, np.ndarray) and v.dtype.kind in "iu":
                d = _int_text(v)
            else:
                d, present = _json_text(list(v))
            label = np.frombuffer(b"," + json.dumps(name).encode() + b":", np.uint8)
            if present is None:
                blocks += [np.broadcast_to(label, (n, len(label))), d]
            else:                                       # absent: the key and the value are NULs
                keep = present[:, None].astype(np.uint8)
                blocks += [label * keep, d * keep]
        blocks.append(np.broadcast_to(np.frombuffer(b"}\n", np.uint8), (n, 2)))
        buf = np.concatenate(blocks, axis=1)
        return buf[buf != 0].tobytes()
    except _Fallback:
        return b"".join(json.dumps({key: int(ln), **rec}, separators=_COMPACT).encode() + b"\n"
                        for ln, rec in zip(numbers.tolist(), records_of_columns(columns)))
