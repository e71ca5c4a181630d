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

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

from .checkpoint import Snapshot, followed_pointer_text, load_snapshot
from .io.validate import ModelChecked
from .models.base import ScoresRecords, StoredScaled

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

    def score(self, x) -> list[dict]:
        """Every scoring output for each record of ``x``, as JSON-ready dicts.

        A model with a ``score_records(lam, x)`` method decides what that is;
        otherwise (the mixtures) the MAP assignment, the responsibilities and
        the predictive log density.
        """
        if isinstance(self.model, ScoresRecords):
            own = self.model.score_records
            return own(self.lam, x) if self.aux is None else own(self.lam, x, aux=self.aux)
        x = self.check(x)
        R = self.responsibilities(x)
        lp = self.predictive_logpdf(x)
        return [{"assignment": int(r.argmax()), "responsibilities": [round(float(v), 12) for v in r],
                 "log_density": float(d)} for r, d in zip(R, lp)]


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

    def __init__(self, fitted: FittedModel, fmt: str = "jsonl", fields=None):
        from .io.dense import CsvCodec, DenseKind
        from .io.records import record_kind

        if fmt not in ("jsonl", "csv"):
            raise ValueError(f"format must be 'jsonl' or 'csv', got {fmt!r}")
        self.fitted = fitted
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

    def __call__(self, lines) -> list[dict]:
        from .io.codecs import DecodeError, decode_many_safely, decode_rows_safely
        from .io.validate import all_valid_safely, validate_safely

        numbers, payloads = [], []
        for n, text in lines:
            text = text.strip()
            if text:
                numbers.append(n)
                payloads.append(text.encode("utf-8", "replace"))
        if not payloads:
            return []
        kind = self.kind
        fast = None
        if max(map(len, payloads)) <= self.validator.max_message_bytes:
            fast = decode_many_safely(self.codec, payloads)
        if fast is not None and kind.n_records(fast) == len(payloads) and all_valid_safely(self.validator, fast):
            return [{"line": n, **sc} for n, sc in zip(numbers, self._score(fast))]
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
        if parts:
            good, rejected = validate_safely(self.validator, kind, kind.concat(parts))
            bad = {i for i, _, _ in rejected}
            for i, reason, message in rejected:
                out[where[i]] = _error(where[i], reason, message)
            kept = [n for i, n in enumerate(where) if i not in bad]
            if kept:
                for n, sc in zip(kept, self._score(good)):
                    out[n] = {"line": n, **sc}
        return [out[n] for n in sorted(out)]

    def _score(self, batch) -> list[dict]:
        """The scores of valid records; a record the model still refuses gets ``invalid``."""
        try:
            return self.fitted.score(batch)
        except ValueError:
            pass
        out = []
        for i in range(self.kind.n_records(batch)):
            try:
                out.extend(self.fitted.score(self.kind.take(batch, slice(i, i + 1))))
            except ValueError as exc:
                out.append({"reason": "invalid", "error": f"invalid: {exc}"})
        return out


def _error(line: int, reason: str, message: str) -> dict:
    return {"line": line, "reason": reason, "error": f"{reason}: {message}"}


def score_lines(fitted: FittedModel, lines, fmt: str = "jsonl", fields=None) -> list[dict]:
    """``LineScorer(fitted, fmt, fields)(lines)``: see :class:`LineScorer`."""
    return LineScorer(fitted, fmt, fields)(lines)
