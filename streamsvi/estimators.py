"""river-compatible estimators built on the same engine.

Every face turns river's input into records and learns them through one
:class:`streamsvi.learner.StreamLearner`: minibatches of ``batch_size``
records, the daemon's streaming start, then one engine update per minibatch.

:class:`TopicModel` is a ``river.base.MiniBatchTransformer`` for LDA:
documents ``{word: count}`` in, topic proportions out.
:class:`MatrixFactorization` is a river ranker for PMF,
:class:`PoissonFactorization` one for the Poisson factorisation (HPF) of
counts, :class:`LogisticRegression` and :class:`SoftmaxRegression` river
classifiers.

:class:`GaussianMixture` is a ``river.base.Clusterer``: ``learn_one`` buffers
records and applies an SVI / SVI+ update each time ``batch_size`` of them are
in; ``learn_many`` takes a pandas DataFrame (same batching, same result);
``predict_one`` / ``predict_many`` give the MAP component.
:class:`PoissonMixture` is the same clusterer for dicts of counts.
:class:`GaussianMixture1D` the same for one numeric feature (the 1-D mixture with
known variance, ``gauss1d``).
:class:`HiddenMarkovModel` learns a discrete HMM from symbol sequences (river
has no sequence base class: its docstring states the interface).

Snapshots: every face has ``from_snapshot(path, ...)``, which loads a
snapshot the daemon wrote (or one the face's ``to_snapshot(directory)``
wrote) and adopts its engine and state: the face then predicts exactly what
``streamsvi.load(path)`` predicts for the same input (the ``_many`` methods;
a ``_one`` method on one record gives what the library gives on that one
record, except for the per-record fast paths noted at the classifiers' and
``MatrixFactorization.predict_one``, which agree to rounding), and learning
goes on from the snapshot's step, λ, random stream and records count, bit
for bit as the snapshot's engine would go on. A snapshot of another model is
refused with ``ValueError`` naming the face that loads it. ``repr`` shows the
class name and the settings that differ from the defaults (river's
convention), long values shortened.

Feature handling: the feature names are fixed by the ``features`` setting,
or else by the keys of the first record (sorted, so key order never
matters). A missing, NaN or infinite value is imputed with its feature's
running mean (river ``stats.Mean`` to rounding; 0 before any value is seen);
a feature not in the list is ignored; a value that is not a number is refused
(``ValueError``) by the call that brings it.

Speed: the mixture and the classifiers write each record into a
preallocated array and hand the rows to the learner a block at a time
(when an update is due, and before any prediction or read of the state),
with the running feature moments of the whole block in a few array
operations (:class:`_RunningMoments`); ``learn_many`` takes a DataFrame
as one array. What is learned does not depend on the blocks: ``learn_one``
record by record, ``learn_many`` in chunks of any size and ``learn_one``
with predictions in between give the same λ. The classifiers'
``predict_proba_one`` reads weights cached per state (plain floats for the
binary model), and ``MatrixFactorization.predict_one`` a per-state table of
the rows' moments once enough predictions are asked under one state.

Examples
--------
>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> model = GaussianMixture(n_components=2, batch_size=50, n_total=1000, seed=1)
>>> for c in rng.choice([-4.0, 4.0], size=1000):
...     model.learn_one({"a": c + rng.normal(), "b": c + rng.normal()})
>>> model.predict_one({"a": -4.0, "b": -4.0}) != model.predict_one({"a": 4.0, "b": 4.0})
True
"""
from __future__ import annotations

import copy
import math
import operator
from functools import partial

import numpy as np
from river import base

from .inference import SVI, RobbinsMonro
from .inference.annealing import SVIPlus, annealer_from_dict
from .learner import StreamLearner
from .models import BayesianGMM


def _check_batch_sizes(batch_size, effective_batch_size) -> None:
    """|S| an integer >= 1 and M (SVI+; None for SVI) in (0, |S|], else ValueError."""
    if int(batch_size) != batch_size or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size}")
    if effective_batch_size is not None and not 0 < effective_batch_size <= batch_size:
        raise ValueError(f"effective_batch_size must be in (0, batch_size={batch_size}], "
                         f"got {effective_batch_size}")

def _annealer_of(annealing, batch_size, effective_batch_size):
    """The ``annealing`` setting (None, a dict with ``kind`` or an Annealer) as an Annealer or None.

    ``ValueError`` for a bad setting, for both ``annealing`` and
    ``effective_batch_size``, and for a constant SVI+ M0 above ``batch_size``.
    """
    if annealing is None:
        return None
    if effective_batch_size is not None:
        raise ValueError("set annealing or effective_batch_size, not both "
                         "(effective_batch_size=M is annealing={'kind': 'svi+', 'M0': M})")
    ann = annealer_from_dict(annealing)
    if isinstance(ann, SVIPlus) and ann.schedule == "constant" and ann.M0 is not None:
        _check_batch_sizes(batch_size, ann.M0)
    return ann


def _same_setting(value, default) -> bool:
    """A setting equal to its default (numbers compared by value, never raising)."""
    if value is default:
        return True
    try:
        return bool(type(value) is type(default) and value == default) or (
            isinstance(value, (int, float)) and isinstance(default, (int, float))
            and not isinstance(value, bool) and not isinstance(default, bool) and float(value) == float(default))
    except (TypeError, ValueError):
        return False


def _short_repr(value, limit: int = 60) -> str:
    """``repr(value)``, a long sequence as its length and first items, anything else cut at ``limit``."""
    if isinstance(value, (tuple, list)) and len(value) > 6:
        head = ", ".join(_short_repr(v, 20) for v in value[:3])
        return f"<{len(value)} items: {head}, …>"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


#: the face that loads each model of a snapshot (model name -> face)
_FACE_OF = {"gmm": "GaussianMixture", "lda": "TopicModel", "pmf": "MatrixFactorization",
            "logistic": "LogisticRegression", "softmax": "SoftmaxRegression", "hmm": "HiddenMarkovModel",
            "hpf": "PoissonFactorization", "poisson_mixture": "PoissonMixture",
            "gauss1d": "GaussianMixture1D"}


def _face_snapshot(cls, path, models: tuple, what: str):
    """Load the snapshot at ``path`` for the face ``cls``: ``(snapshot, face state or None)``.

    ``ValueError`` naming the model it holds (and the face that loads it) unless its model is
    one of ``models`` (exact types). The face state is ``extra["face"]`` of a snapshot that a
    face of this class wrote (:meth:`_Face.to_snapshot`), else None (a daemon's snapshot).
    """
    from .checkpoint import load_snapshot

    snap = load_snapshot(path)
    model = snap.engine.model
    if type(model) not in models:
        face = _FACE_OF.get(model.name)
        hint = (f"; load it with streamsvi.estimators.{face}.from_snapshot" if face
                else "; no river face loads it: score it with streamsvi.load(path)")
        raise ValueError(f"snapshot {snap.path} holds a {model.name!r} model, not {what}{hint}")
    face = (snap.extra or {}).get("face")
    if not isinstance(face, dict) or face.get("class") != cls.__name__:
        face = None
    return snap, face


def _snapshot_batching(snap, face, batch_size, default: int):
    """|S|, M and the annealing setting of a face started from ``snap``.

    |S|: ``batch_size`` if given, else the one stored with the snapshot (the daemon's
    ``inference.batch_size``, or the writing face's), else ``default`` (or M rounded up if
    that is larger). The snapshot's SVI+ setting is kept: M itself, or M =
    ``effective_fraction`` · |S|; |S| must be at least M (``ValueError`` saying what to pass).
    """
    eng = snap.engine.to_dict()
    M = eng.get("effective_batch_size")
    annealing = eng.get("annealer")
    if annealing is not None and annealing.get("kind") == "svi+" and annealing.get("M0") is not None:
        M = annealing["M0"]      # for the default batch_size and its check below
    daemon_S = ((snap.config or {}).get("inference") or {}).get("batch_size")
    if batch_size is None:
        batch_size = daemon_S if daemon_S is not None else max(default, int(np.ceil(M or 0)))
    if eng.get("effective_fraction") is not None:
        M = eng["effective_fraction"] * batch_size
    if M is not None and M > batch_size:
        raise ValueError(
            f"batch_size={batch_size} is smaller than the snapshot's SVI+ effective batch size "
            f"M={M:g}; pass batch_size >= {int(np.ceil(M))}"
            + (f" (the daemon used batch_size={daemon_S})" if daemon_S is not None else "")
            + " or leave it out to use the daemon's")
    return batch_size, (M if annealing is None else None), annealing


def _schedule_settings(eng: dict) -> dict:
    """``tau0`` and ``kappa`` of the engine's schedule (a Robbins–Monro one; the face keeps the
    snapshot's engine, so another schedule still steps as it did)."""
    s = eng.get("schedule") or {}
    return {k: s[k] for k in ("tau0", "kappa") if k in s}


def _engine_of_spec(spec):
    """An engine rebuilt from ``(engine class name, model dict, engine dict)`` (``_Face._spec``),
    as :func:`streamsvi.inference.state.state_from_arrays` rebuilds a snapshot's."""
    from .inference.schedules import schedule_from_dict
    from .inference.state import ENGINES
    from .models import model_from_dict

    cls_name, model, eng = spec
    eng = dict(eng)
    eng["schedule"] = schedule_from_dict(eng["schedule"])
    return ENGINES[cls_name](model_from_dict(model), **eng)


def _json_id(v):
    """A user or item id as a JSON value (numpy integers as ints)."""
    return v.item() if isinstance(v, np.generic) else v


class _Face:
    """What the faces share: a :class:`~streamsvi.learner.StreamLearner` (``_learner``; None
    until the engine is built), which owns the engine, its state, the minibatch buffer, the
    streaming start and the updates. ``_engine``, ``_state`` and ``last_info_`` read it.

    A face may hold records back from the learner (the classifiers and the mixture keep
    raw rows in a preallocated array and turn them into the learner's records a block at
    a time): :meth:`_sync` hands them over, and every read of the learned state
    (``_state``, ``last_info_``, the predictions) calls it first, so what a caller sees
    is what it would be had each record gone to the learner on arrival."""

    _learner: StreamLearner | None = None

    def _make_learner(self, engine, make_batch) -> None:
        self._learner = StreamLearner(engine, self.batch_size, make_batch, seed=self.seed)

    def _sync(self) -> None:
        """Hand the records held back to the learner (none here)."""

    @property
    def _engine(self):
        return None if self._learner is None else self._learner.engine

    @_engine.setter
    def _engine(self, engine):
        self._learner.engine = engine

    @property
    def _state(self):
        if self._learner is None:
            return None
        self._sync()
        return self._learner.state

    @_state.setter
    def _state(self, state):
        self._learner.state = state

    @property
    def state(self):
        """The engine state (step, λ, random stream, records seen); None before the first update."""
        return self._state

    @property
    def last_info_(self):
        """``UpdateInfo`` of the last update (no attribute before the first)."""
        if self._learner is not None:
            self._sync()
        info = None if self._learner is None else self._learner.last_info
        if info is None:
            raise AttributeError("last_info_: no update yet")
        return info

    # ------------------------------------------------------------ snapshots
    #: (engine class, model dict, engine dict) of the engine adopted from a snapshot, so that a
    #: face that rebuilds its engine (MatrixFactorization after pickling) rebuilds that one
    _spec = None

    @staticmethod
    def _record_to_json(record):
        """One learner record (of the minibatch being filled) as a JSON value: a dense row."""
        return np.asarray(record, dtype=float).tolist()

    @staticmethod
    def _record_from_json(value):
        return np.asarray(value, dtype=float)

    def _face_state(self) -> dict:
        """What the face keeps beside the engine state (features, running moments, classes, ...)."""
        return {}

    def to_snapshot(self, directory, keep: int = 3):
        """Write what the face has learned as a snapshot in the checkpoint directory ``directory``.

        The snapshot is the daemon's format (:class:`~streamsvi.checkpoint.CheckpointStore`:
        checksummed, no pickle), so ``streamsvi.load``, ``streamsvi score``, ``streamsvi
        inspect`` and this face's ``from_snapshot`` read it. It holds the engine state (step,
        λ, the random stream, records seen), the face's ``batch_size`` as
        ``config["inference"]["batch_size"]``, and in ``extra["face"]`` what the face keeps
        besides: its feature names, running feature moments, classes, vocabulary, and the
        records of the minibatch being filled, so that ``from_snapshot`` then learning goes
        on exactly as this face would. Returns the snapshot's path.

        Raises ``ValueError`` before the first update (nothing learned yet; ``flush()``
        starts from fewer records) and ``TypeError`` for values JSON cannot hold (labels).
        """
        from .checkpoint import CheckpointStore

        state = self._state
        if state is None:
            raise ValueError(f"{type(self).__name__} has learned nothing yet: its first update has not "
                             f"run (it waits for batch_size records, or the streaming start's); "
                             f"nothing to write")
        face = {"class": type(self).__name__, **self._face_state(),
                "buffer": [self._record_to_json(r) for r in self._learner.buffer]}
        snap = CheckpointStore(directory, keep=keep).save(
            self._engine, state, offsets=[], config={"inference": {"batch_size": int(self.batch_size)}},
            extra={"face": face})
        return snap.path

    def _adopt(self, snap, face: dict | None) -> None:
        """Take the snapshot's engine (its model and engine settings exactly) and state (step, λ,
        random stream, records seen), then the records of a face's unfinished minibatch."""
        from .models import model_to_dict

        self._spec = (type(snap.engine).__name__, model_to_dict(snap.engine.model), snap.engine.to_dict())
        self._learner.engine = snap.engine
        self._learner.state = snap.state
        if face:
            self._learner.learn_many([self._record_from_json(r) for r in face.get("buffer", ())])

    # ---------------------------------------------------------------- repr
    def __repr__(self) -> str:
        """Class name and the settings that differ from the defaults (river's convention), long
        values shortened: a few lines whatever the face has learned or loaded."""
        import inspect
        import textwrap

        parts = []
        for name, p in inspect.signature(type(self).__init__).parameters.items():
            if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            value = getattr(self, name, p.default)
            if _same_setting(value, p.default):
                continue
            parts.append(f"{name}={_short_repr(value)}")
        line = f"{type(self).__name__}({', '.join(parts)})"
        if len(line) <= 100:
            return line
        body = textwrap.fill(", ".join(parts), width=96, initial_indent="    ", subsequent_indent="    ",
                             break_long_words=False, break_on_hyphens=False)
        return f"{type(self).__name__}(\n{body}\n)"


class _RunningMoments:
    """Running mean and variance (ddof = 1) of each feature's finite values, a block of rows at a time.

    What river's ``stats.Mean`` / ``stats.Var`` give value by value (Welford), for D
    features at once and a block of records in a few array operations: shifted sums
    since an anchor, ``mean = c + Σ(x − c) / n`` and ``S = S_c + Σ(x − c)² − (Σ(x − c))² / n``
    with c the mean at the anchor (the first value before any), equal to Welford's to
    rounding. The sums run record by record (``cumsum`` with the carry in front), and the
    anchor moves every ``ANCHOR`` records counted from the first, so the values a record
    gets do not depend on how the stream was cut into blocks: ``learn_one`` over a
    stream and ``learn_many`` over the same stream agree to the bit.

    A missing (NaN) or infinite value is skipped: it changes neither the mean nor the
    variance. Before a feature's first value its mean and variance are 0.
    """

    ANCHOR = 4096

    def __init__(self, n_features: int):
        D = n_features
        self.n_rows = 0                      # rows learned, for the anchors
        self.c = np.zeros(D)                 # the shift: the mean at the anchor (or the first value)
        self.pinned = np.zeros(D, bool)      # c is set (a value has been seen)
        self.n0 = np.zeros(D)                # values before the anchor, and their S
        self.S0 = np.zeros(D)
        self.cnt = np.zeros(D)               # since the anchor: values, Σ(x − c), Σ(x − c)²
        self.sy = np.zeros(D)
        self.syy = np.zeros(D)
        self._now = None                     # (n_rows, what current() returns) at n_rows

    def learn(self, X: np.ndarray):
        """Learn the rows of ``X`` (B, D) in order; the mean, S and n after each row, (B, D) each."""
        if not X.shape[0]:
            return X.copy(), X.copy(), X.copy()
        out, start = [], 0
        while start < X.shape[0]:
            stop = min(X.shape[0], start + self.ANCHOR - self.n_rows % self.ANCHOR)
            out.append(self._learn_piece(X[start:stop]))
            start = stop
        if len(out) == 1:
            return out[0]
        return tuple(np.concatenate(parts) for parts in zip(*out))

    def _learn_piece(self, X):
        M = np.isfinite(X)
        new = ~self.pinned & M.any(axis=0)
        if new.any():                                   # a feature's first value is its shift
            first = M.argmax(axis=0)
            self.c[new] = X[first[new], np.flatnonzero(new)]
            self.pinned |= new
        Y = X - self.c
        Y[~M] = 0.0
        sy = np.cumsum(np.vstack([self.sy, Y]), axis=0)[1:]
        syy = np.cumsum(np.vstack([self.syy, Y * Y]), axis=0)[1:]
        cnt = np.cumsum(np.vstack([self.cnt, M]), axis=0)[1:]
        n = self.n0 + cnt
        n1 = np.maximum(n, 1.0)
        mean = self.c + sy / n1
        mean[n == 0] = 0.0                              # no value yet (c may be a later first value)
        S = np.maximum(self.S0 + syy - sy * sy / n1, 0.0)
        self.sy, self.syy, self.cnt = sy[-1], syy[-1], cnt[-1]
        self.n_rows += X.shape[0]
        if self.n_rows % self.ANCHOR == 0:              # a new anchor: the sums restart from the mean
            self.n0, self.c, self.S0 = n[-1].copy(), mean[-1].copy(), S[-1].copy()
            self.sy, self.syy, self.cnt = np.zeros_like(self.sy), np.zeros_like(self.sy), np.zeros_like(self.sy)
        return mean, S, n

    def current(self):
        """The mean, S and n now, (D,) each (computed once per block learned; do not modify)."""
        now = self._now
        if now is None or now[0] != self.n_rows:
            n = self.n0 + self.cnt
            n1 = np.maximum(n, 1.0)
            mean = self.c + self.sy / n1
            mean[n == 0] = 0.0
            now = self._now = (self.n_rows, mean, np.maximum(self.S0 + self.syy - self.sy * self.sy / n1, 0.0), n)
        return now[1:]

    _FIELDS = ("c", "pinned", "n0", "S0", "cnt", "sy", "syy")

    def to_json(self) -> dict:
        """The moments as JSON values (floats round-trip exactly), for a face's snapshot."""
        return {"n_rows": int(self.n_rows), **{k: getattr(self, k).tolist() for k in self._FIELDS}}

    @classmethod
    def from_json(cls, d: dict, n_features: int) -> "_RunningMoments":
        """Inverse of :meth:`to_json`; ``ValueError`` unless it has ``n_features`` features."""
        out = cls(n_features)
        try:
            out.n_rows = int(d["n_rows"])
            for k in cls._FIELDS:
                v = np.asarray(d[k], dtype=bool if k == "pinned" else float)
                if v.shape != (n_features,):
                    raise ValueError(f"{k} has shape {v.shape}, expected ({n_features},)")
                setattr(out, k, v)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"the snapshot's running feature moments are malformed: {exc}") from None
        return out


def _impute(X: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """X with each missing or infinite value replaced by its feature's mean (rows of ``mean``
    or one row for all)."""
    bad = ~np.isfinite(X)
    if bad.any():
        X = X.copy()
        X[bad] = np.broadcast_to(mean, X.shape)[bad]
    return X


def _scale(S: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Standard deviations from S and n (river ``Var``: √(S / (n − 1)) once n > 1), with 1
    where that is 0 (a feature that is only centred)."""
    sd = np.sqrt(np.where(n > 1, S / np.maximum(n - 1.0, 1.0), 0.0))
    sd[sd == 0] = 1.0
    return sd


class _DictRows:
    """Dict records as rows of a preallocated float array, in the order of ``features``.

    ``put(x)`` writes one record into the next row (a missing feature is NaN, a value
    that is not a number raises ``ValueError`` at once); ``take()`` returns the rows
    written and empties the buffer; ``matrix(xs)`` converts many records in one go.
    """

    def __init__(self, features: list, capacity: int):
        self.features = list(features)
        self.get = operator.itemgetter(*self.features) if len(self.features) > 1 else None
        self.rows = np.empty((max(int(capacity), 1), len(self.features)))
        self.n = 0
        self._takes: dict = {}                      # DataFrame columns -> positions of the features

    def values(self, x: dict):
        """The record's values in feature order (None for a missing one)."""
        if self.get is not None:
            try:
                return self.get(x)
            except KeyError:
                pass
        return [x.get(f) for f in self.features]

    def put(self, x: dict) -> None:
        if self.n == self.rows.shape[0]:
            self.rows = np.concatenate([self.rows, np.empty_like(self.rows)])
        vals = self.values(x)
        try:
            self.rows[self.n] = vals
        except (TypeError, ValueError):
            bad = next((f, v) for f, v in zip(self.features, vals)
                       if v is not None and not _is_number(v))
            raise ValueError(f"feature {bad[0]!r} must be a number, got {bad[1]!r}") from None
        self.n += 1

    def take(self) -> np.ndarray:
        out = self.rows[:self.n].copy()
        self.n = 0
        return out

    def matrix(self, xs) -> np.ndarray:
        """Records (dicts) as one (n, D) float array, NaN where a feature is missing."""
        try:
            return np.array([self.values(x) for x in xs], dtype=float).reshape(-1, len(self.features))
        except (TypeError, ValueError):
            out = _DictRows(self.features, len(xs))
            for x in xs:
                out.put(x)
            return out.take()

    def frame(self, X) -> np.ndarray:
        """A DataFrame's columns ``features`` (NaN for a missing column) as a float array."""
        cols = tuple(X.columns.tolist())
        take = self._takes.get(cols)
        if take is None:                                # where each feature is among the columns
            pos = {c: j for j, c in enumerate(cols)}
            take = np.array([pos.get(f, len(cols)) for f in self.features], dtype=np.intp)
            if len(self._takes) > 64:
                self._takes.clear()
            self._takes[cols] = take
        try:
            V = X.to_numpy(dtype=float, na_value=np.nan)
        except (TypeError, ValueError):
            return self.matrix(X.to_dict(orient="records"))
        if take.size and take.max() == len(cols):        # a feature with no column: NaN
            V = np.column_stack([V, np.full(len(V), np.nan)])
        return V.take(take, axis=1)


_sub, _mul = operator.sub, operator.mul


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _dense(rows: list) -> np.ndarray:
    """Rows (1-D arrays) as one (n, D) batch: the GMM's records, the classifiers' (label last)."""
    return np.vstack(rows)


def _docs(rows: list, n_features: int):
    """Documents ``(word ids, counts)`` as one CSR batch (n, V), duplicate words summed."""
    import scipy.sparse as sp

    indptr = np.cumsum([0] + [len(r[0]) for r in rows])
    X = sp.csr_matrix((np.concatenate([r[1] for r in rows]) if rows else np.empty(0),
                       np.concatenate([r[0] for r in rows]) if rows else np.empty(0, np.int64),
                       indptr), shape=(len(rows), n_features))
    X.sum_duplicates()
    return X


def _ratings(rows: list):
    """Ratings ``(user, item, y)`` as one :class:`~streamsvi.models.Ratings` batch."""
    from .models import Ratings

    return Ratings(*zip(*rows))


class _MixtureFace(_Face, base.Clusterer):
    """What the mixture clusterers share (:class:`GaussianMixture`, :class:`PoissonMixture`,
    :class:`GaussianMixture1D`): the engine (``_model()`` under SVI / SVI+ with the
    Robbins–Monro schedule), the start on the first record's keys (``_start``), the
    batching of ``learn_one`` / ``learn_many``, and the predictions from the model's
    ``predict``, ``responsibilities`` and ``predictive_logpdf`` on rows that ``_rows_now``
    makes from raw rows. Records are held in ``_pending`` (a :class:`_DictRows`) until an
    update is due. A face says how raw rows are checked (``_checked``), turned into the
    learner's rows (``_learned``) and into rows to predict on (``_predicted``).
    Before the start: component 0, uniform responsibilities, NaN scores."""

    _pending: _DictRows | None = None      # raw rows not yet handed to the learner (None until built)

    def _init_learning(self, features: list | None) -> None:
        """The end of every mixture's ``__init__``: check the batching, make the annealer, and
        build the engine now if the features are known."""
        _check_batch_sizes(self.batch_size, self.effective_batch_size)
        self._annealer = _annealer_of(self.annealing, self.batch_size, self.effective_batch_size)
        self._features = features
        self._learner = None
        if self._features is not None:
            self._build()

    @staticmethod
    def _mixture_test_params(**extra):
        """The cases every mixture's ``_unit_test_params`` runs: plain SVI, SVI+ (with ``extra``
        settings) and deterministic annealing."""
        yield {"n_components": 2, "batch_size": 8, "n_total": 200.0, "seed": 0}
        yield {"n_components": 3, "batch_size": 16, "effective_batch_size": 4, **extra, "seed": 1}
        yield {"n_components": 2, "batch_size": 8, "seed": 2,
               "annealing": {"kind": "deterministic", "T0": 3.0, "n_steps": 5}}

    # -------------------------------------------------------------- set-up
    def _model(self):
        """The face's model, for ``len(self._features)`` features."""
        raise NotImplementedError

    def _build(self):
        self._make_learner(SVI(self._model(), n_total=self.n_total,
                               schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa),
                               effective_batch_size=self.effective_batch_size, short_batches="svi",
                               annealer=self._annealer), _dense)
        self._pending = _DictRows(self._features, self.batch_size)

    def _start(self, keys) -> bool:
        """Take the features from the first record's keys (sorted) and build; False if it cannot start."""
        self._features = sorted(keys)
        self._build()
        return True

    @classmethod
    def _from_snapshot(cls, path, models: tuple, what: str, batch_size, settings):
        """The face of a snapshot of one of ``models``: ``settings(p, face)`` gives the face's own
        settings from the model's ``get_params()`` (and checks them), the shared ones come
        from the engine; then the face's state and the snapshot's are adopted."""
        snap, face = _face_snapshot(cls, path, models, what)
        p, eng = snap.engine.model.get_params(), snap.engine.to_dict()
        own = settings(p, face)
        batch_size, M, annealing = _snapshot_batching(snap, face, batch_size, 32)
        est = cls(n_components=p["n_components"], batch_size=batch_size, effective_batch_size=M,
                  n_total=eng["n_total"], annealing=annealing, **_schedule_settings(eng), **own)
        est._adopt_face(face)
        est._adopt(snap, face)
        return est

    def _adopt_face(self, face: dict | None) -> None:
        """Take what the face stored beside the snapshot (nothing here)."""

    def _face_state(self) -> dict:
        return {"features": list(self._features)}

    # ------------------------------------------------------------- raw rows
    def _checked(self, X: np.ndarray) -> np.ndarray:
        """Raw rows as the model takes them, or ``ValueError`` (as they are, here)."""
        return X

    def _learned(self, X: np.ndarray) -> np.ndarray:
        """Checked rows as the learner gets them (as they are, here)."""
        return X

    def _predicted(self, X: np.ndarray) -> np.ndarray:
        """Checked rows as the predictions get them (as they are, here)."""
        return X

    def _sync(self) -> None:
        """Hand the records held back to the learner."""
        if self._pending is None or not self._pending.n:
            return
        self._learner.learn_many(self._learned(self._checked(self._pending.take())))

    def _rows_now(self, X: np.ndarray) -> np.ndarray:
        """Raw rows as the predictions take them, after the held records are learned."""
        self._sync()
        return self._predicted(self._checked(X))

    def _row(self, x: dict) -> np.ndarray:
        """One record as a (1, D) row for the model's predictions."""
        return self._rows_now(self._pending.matrix([x]))

    # ------------------------------------------------------------ predicting
    def predict_one(self, x: dict) -> int:
        if self._state is None:
            return 0
        return int(self._engine.model.predict(self._state.lam, self._row(x))[0])

    def predict_many(self, X):
        """MAP components of a DataFrame's rows, as a pandas Series."""
        import pandas as pd

        if self._state is None:
            return pd.Series(np.zeros(len(X), dtype=int), index=X.index)
        rows = self._rows_now(self._pending.frame(X))
        return pd.Series(self._engine.model.predict(self._state.lam, rows), index=X.index)

    def predict_proba_one(self, x: dict) -> dict[int, float]:
        """Responsibilities of each component."""
        if self._state is None:
            return {k: 1.0 / self.n_components for k in range(self.n_components)}
        r = self._engine.model.responsibilities(self._state.lam, self._row(x))[0]
        return dict(enumerate(r.tolist()))

    def score_one(self, x: dict) -> float:
        """Posterior predictive log density of a record."""
        if self._state is None:
            return float("nan")
        return float(self._engine.model.predictive_logpdf(self._state.lam, self._row(x))[0])

    def predict_proba_many(self, X):
        """Responsibilities of a DataFrame's rows (columns 0 … K−1), as
        ``streamsvi.load(path).responsibilities`` gives them."""
        import pandas as pd

        if self._state is None:
            return pd.DataFrame(np.full((len(X), self.n_components), 1.0 / self.n_components), index=X.index)
        rows = self._rows_now(self._pending.frame(X))
        return pd.DataFrame(self._engine.model.responsibilities(self._state.lam, rows), index=X.index)

    def score_many(self, X):
        """Posterior predictive log densities of a DataFrame's rows, as a pandas Series (NaN before the start)."""
        import pandas as pd

        if self._state is None:
            return pd.Series(np.full(len(X), np.nan), index=X.index)
        rows = self._rows_now(self._pending.frame(X))
        return pd.Series(self._engine.model.predictive_logpdf(self._state.lam, rows), index=X.index)

    # ------------------------------------------------------------- learning
    def _put(self, x: dict) -> None:
        """Hold one record back (``ValueError``, and nothing held, for a value that is not a number)."""
        self._pending.put(x)

    def learn_one(self, x: dict) -> None:
        if self._features is None and not self._start(x):
            return
        pending = self._pending
        self._put(x)
        if pending.n + len(self._learner.buffer) >= self.batch_size:     # an update is due
            self._sync()

    def learn_many(self, X) -> None:
        """Learn from a pandas DataFrame (columns = features); same batching, same result as
        learn_one. The rows are checked before any is learned."""
        if self._features is None and (not len(X) or not self._start(X.columns)):
            return
        rows = self._checked(self._pending.frame(X))
        self._sync()
        self._learner.learn_many(self._learned(rows))


class _ImputingMixture(_MixtureFace):
    """A mixture of real values (:class:`GaussianMixture`, :class:`GaussianMixture1D`): a missing,
    NaN or infinite value is imputed with the feature's running mean (``_moments``, a
    :class:`_RunningMoments` stored with the face): as learned so far for the learner's rows,
    as it is now for predictions."""

    def _build(self):
        super()._build()
        self._moments = _RunningMoments(len(self._features))

    def _adopt_face(self, face: dict | None) -> None:
        if face is not None and face.get("moments") is not None:
            self._moments = _RunningMoments.from_json(face["moments"], len(self._features))

    def _learned(self, X: np.ndarray) -> np.ndarray:
        """Learn the running means of the rows, then impute the rows with them."""
        return _impute(X, self._moments.learn(X)[0])

    def _predicted(self, X: np.ndarray) -> np.ndarray:
        """Rows imputed with the running means as they are now."""
        return _impute(X, self._moments.current()[0])


def _snapshot_features(features, face: dict | None, n_features: int) -> tuple:
    """The names of a snapshot's ``n_features`` features: those given, else the writing face's,
    else ``("x0", …)``; ``ValueError`` for the wrong number of names."""
    if features is None and face is not None:
        features = face.get("features")
    features = tuple(features) if features is not None else tuple(f"x{i}" for i in range(n_features))
    if len(features) != n_features:
        raise ValueError(f"features has {len(features)} names, the snapshot's model has "
                         f"{n_features} features")
    return features


class GaussianMixture(_ImputingMixture):
    """Bayesian Gaussian mixture clusterer learned online with SVI / SVI+.

    Parameters
    ----------
    n_components
        K.
    batch_size
        |S|: records per update.
    effective_batch_size
        M for SVI+ (≤ batch_size); None is plain SVI.
    n_total
        N, or the population size for an unbounded stream.
    tau0, kappa
        Robbins–Monro schedule ρ_t = (τ0 + t)^(−κ).
    weight_concentration, mean_precision, degrees_of_freedom, scale
        Priors of :class:`streamsvi.models.BayesianGMM` (scale: W0 = scale·I).
    init
        How the start's records start the model: ``"kmeans"`` (k-means++
        seeding then Lloyd iterations), ``"kmeans++"``, ``"random_from_data"``
        or ``"random_resp"`` (:class:`streamsvi.models.BayesianGMM`).
    init_batches
        The streaming start, as the daemon makes it: the first updates wait
        until ``init_batches`` minibatches and at least 5·K·D records (at
        most ``n_total``) have been learned (``BayesianGMM.start_size``);
        the model starts from all of them, then takes one step per held
        minibatch in order. Until then predictions are those of no model
        (component 0, uniform responsibilities, NaN scores). 1 starts from
        the first minibatch alone.
    features
        Feature names in order (a tuple); None takes the sorted keys of the
        first record.
    seed
        Seed of the engine's random stream (None: a random seed).
    annealing
        An annealer (:mod:`streamsvi.inference.annealing`) or its dict form,
        e.g. ``{"kind": "deterministic", "T0": 5.0}``, ``{"kind": "stochastic"}``
        or ``{"kind": "svi+", "M0": 8, "schedule": "linear", "increment": 1}``.
        None: SVI, or SVI+ with ``effective_batch_size`` (not both).
    """

    def __init__(self, n_components: int = 3, batch_size: int = 32,
                 effective_batch_size: float | None = None, n_total: float = 10_000.0,
                 tau0: float = 1.0, kappa: float = 0.7, weight_concentration: float = 1.0,
                 mean_precision: float = 1.0, degrees_of_freedom: float | None = None,
                 scale: float = 1.0, init: str = "kmeans", features: tuple | None = None,
                 seed: int | None = None, annealing=None, init_batches: int = 4):
        self.n_components = n_components
        self.batch_size = batch_size
        self.effective_batch_size = effective_batch_size
        self.n_total = n_total
        self.tau0 = tau0
        self.kappa = kappa
        self.weight_concentration = weight_concentration
        self.mean_precision = mean_precision
        self.degrees_of_freedom = degrees_of_freedom
        self.scale = scale
        self.init = init
        self.features = features
        self.seed = seed
        self.annealing = annealing
        self.init_batches = init_batches
        self._init_learning(list(features) if features is not None else None)

    @classmethod
    def _unit_test_params(cls):
        yield from cls._mixture_test_params()
        yield {"n_components": 2, "batch_size": 8, "seed": 3, "annealing": {"kind": "stochastic", "rho0": 0.5}}
        yield {"n_components": 2, "batch_size": 8, "seed": 4, "init_batches": 1}

    # -------------------------------------------------------------- set-up
    def _model(self):
        return BayesianGMM(self.n_components, len(self._features), weight_concentration=self.weight_concentration,
                           mean_precision=self.mean_precision,
                           degrees_of_freedom=self.degrees_of_freedom, scale=self.scale,
                           init=self.init, init_batches=self.init_batches)

    @classmethod
    def from_snapshot(cls, path, features=None, batch_size: int | None = None) -> "GaussianMixture":
        """A clusterer that starts from a snapshot: the daemon's, or one :meth:`to_snapshot` wrote.

        It predicts what ``streamsvi.load(path)`` predicts, and learning goes on from the
        snapshot's state: its engine (model and engine settings as stored), step, λ,
        random stream and records seen, so ``learn_one`` / ``learn_many`` then take the
        steps the daemon's engine would take on the same minibatches.
        ``features`` names the D columns in order (default: the writing face's names,
        else ``("x0", …)``). ``batch_size`` is |S| of the clusterer's updates; by default
        the daemon's own ``inference.batch_size``, stored with the snapshot (32 for a
        snapshot written without a daemon config, or M rounded up if that is larger). The
        snapshot's SVI+ setting is kept: M itself, or M = ``effective_fraction`` ·
        ``batch_size``; ``batch_size`` must be at least M. ``ValueError`` for a snapshot of
        another model, or ``features`` of the wrong length.
        """
        def settings(p, face):
            names = _snapshot_features(features, face, p["n_features"])
            if np.ndim(p["weight_concentration"]) or np.ndim(p["mean"]) or np.ndim(p["scale"] or 1.0):
                raise ValueError("from_snapshot supports models with scalar priors (as the daemon's configs make)")
            return dict(features=names, weight_concentration=p["weight_concentration"], mean_precision=p["mean_precision"],
                        degrees_of_freedom=p["degrees_of_freedom"],
                        scale=p["scale"] if p["scale"] is not None else 1.0,
                        init=p["init"], init_batches=p.get("init_batches", 4))

        return cls._from_snapshot(path, (BayesianGMM,), "a Gaussian mixture", batch_size, settings)

    def _face_state(self) -> dict:
        return {"features": list(self._features), "moments": self._moments.to_json()}

# ----------------------------------------------------------------- Poisson mixture
def _tuple_of(v):
    """A setting of a number or a list of numbers, with lists as tuples (immutable, as river wants)."""
    return tuple(v) if isinstance(v, (list, tuple, np.ndarray)) else v


class PoissonMixture(_MixtureFace):
    """Bayesian mixture of Poisson count vectors learned online with SVI / SVI+ (a ``river.base.Clusterer``).

    A record is a dict of counts ``{feature: count}``, each an integer ≥ 0 (river's
    ``feature_extraction.BagOfWords`` makes such dicts); a feature the record does not
    have (an absent key, None, or NaN, pandas' missing value) counts 0. A count that is
    negative, not an integer or infinite, or a value that is not a number, is refused
    with ``ValueError`` naming the feature, by the call that brings it, before anything
    of it is learned. The model is :class:`streamsvi.models.PoissonMixture`: K components,
    each with its own rate for every feature. ``learn_one`` buffers records and applies an
    SVI / SVI+ update per ``batch_size`` of them (``learn_many`` takes a DataFrame: same
    batching, same result); ``predict_one`` / ``predict_many`` give the MAP component,
    ``predict_proba_one`` / ``predict_proba_many`` the component posterior E_q[z],
    ``score_one`` / ``score_many`` the posterior predictive log density (a mixture of
    negative binomials, ``PoissonMixture.predictive_logpdf``).

    Parameters
    ----------
    n_components
        K.
    batch_size
        |S|: records per update.
    effective_batch_size
        M for SVI+ (≤ batch_size); None is plain SVI.
    n_total
        N, or the population size for an unbounded stream.
    tau0, kappa
        Robbins–Monro schedule ρ_t = (τ0 + t)^(−κ).
    weight_concentration, prior_shape, prior_rate
        α0 of the Dirichlet on the weights (a number or K numbers), and a0, b0 of the Gamma
        prior of every rate (numbers or D numbers; prior mean a0/b0).
    init, n_init, init_sweeps
        The start on the start's records (:class:`streamsvi.models.PoissonMixture`):
        ``"kmeans"`` on √x, ``"random_from_data"`` or ``"random_resp"``; the best of
        ``n_init`` starts after ``init_sweeps`` CAVI sweeps.
    features
        Feature names in order (a tuple); None takes the sorted keys of the first record
        (give them for sparse records, whose first may lack some).
    seed
        Seed of the engine's random stream (None: a random seed).
    annealing
        An annealer (:mod:`streamsvi.inference.annealing`) or its dict form; None: SVI, or
        SVI+ with ``effective_batch_size`` (not both).
    init_batches
        The streaming start, as the daemon makes it: the first update waits for
        ``init_batches`` minibatches and at least 20·K records (``start_size``). Until
        then predictions are those of no model (component 0, uniform, NaN scores).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> model = PoissonMixture(n_components=2, batch_size=50, seed=1)
    >>> for _ in range(1000):
    ...     rate = rng.choice([1.0, 12.0])
    ...     model.learn_one({"clicks": int(rng.poisson(rate)), "views": int(rng.poisson(2 * rate))})
    >>> model.predict_one({"clicks": 0, "views": 1}) != model.predict_one({"clicks": 12, "views": 25})
    True
    """

    def __init__(self, n_components: int = 3, batch_size: int = 32,
                 effective_batch_size: float | None = None, n_total: float = 10_000.0,
                 tau0: float = 1.0, kappa: float = 0.7, weight_concentration=1.0, prior_shape=1.0,
                 prior_rate=0.1, init: str = "kmeans", n_init: int = 3, init_sweeps: int = 5,
                 features: tuple | None = None, seed: int | None = None, annealing=None,
                 init_batches: int = 4):
        self.n_components = n_components
        self.batch_size = batch_size
        self.effective_batch_size = effective_batch_size
        self.n_total = n_total
        self.tau0 = tau0
        self.kappa = kappa
        self.weight_concentration = weight_concentration
        self.prior_shape = prior_shape
        self.prior_rate = prior_rate
        self.init = init
        self.n_init = n_init
        self.init_sweeps = init_sweeps
        self.features = features
        self.seed = seed
        self.annealing = annealing
        self.init_batches = init_batches
        self._init_learning(list(features) if features is not None else None)

    @classmethod
    def _unit_test_params(cls):
        yield from cls._mixture_test_params()

    def _model(self):
        from .models import PoissonMixture as Model

        return Model(self.n_components, len(self._features), weight_concentration=self.weight_concentration,
                     prior_shape=self.prior_shape, prior_rate=self.prior_rate, init=self.init,
                     n_init=self.n_init, init_sweeps=self.init_sweeps, init_batches=self.init_batches)

    @classmethod
    def from_snapshot(cls, path, features=None, batch_size: int | None = None) -> "PoissonMixture":
        """A clusterer that starts from a ``poisson_mixture`` snapshot: the daemon's, or one
        :meth:`to_snapshot` wrote.

        It predicts what ``streamsvi.load(path)`` predicts (``predict``, ``responsibilities``,
        ``predictive_logpdf``), and learning goes on from the snapshot's engine and state
        (step, λ, random stream, records seen), bit for bit as that engine would go on.
        ``features`` names the D counts in order (default: the writing face's names, else
        ``("x0", …)``, the order of the daemon's arrays). ``batch_size`` defaults to the
        daemon's ``inference.batch_size`` stored with the snapshot (32 without one, or M
        rounded up if larger); the snapshot's SVI+ setting is kept. ``ValueError`` for a
        snapshot of another model, or ``features`` of the wrong length.
        """
        from .models import PoissonMixture as Model

        def settings(p, face):
            return dict(features=_snapshot_features(features, face, p["n_features"]),
                        weight_concentration=_tuple_of(p["weight_concentration"]),
                        prior_shape=_tuple_of(p["prior_shape"]), prior_rate=_tuple_of(p["prior_rate"]),
                        init=p["init"], n_init=p["n_init"], init_sweeps=p["init_sweeps"],
                        init_batches=p["init_batches"])

        return cls._from_snapshot(path, (Model,), "a Poisson mixture", batch_size, settings)

    # ------------------------------------------------------------ counts
    def _checked(self, X: np.ndarray) -> np.ndarray:
        """Raw rows as counts: a missing value (NaN) is 0; ``ValueError`` naming the first feature
        whose value is negative, not an integer or infinite."""
        X = np.where(np.isnan(X), 0.0, X)
        bad = ~((X >= 0) & (X < np.inf) & (X == np.floor(X)))
        if bad.any():
            r, c = np.argwhere(bad)[0]
            raise ValueError(f"feature {self._features[c]!r} must be a count (an integer >= 0; a missing "
                             f"one is 0), got {float(X[r, c])!r}")
        return X

    def _put(self, x: dict) -> None:
        """Hold one record back once its counts are checked (nothing held on ``ValueError``)."""
        pending = self._pending
        pending.put(x)
        try:
            self._checked(pending.rows[pending.n - 1:pending.n])
        except ValueError:
            pending.n -= 1                          # not learned
            raise


# ------------------------------------------------------- 1-D Gaussian mixture
class GaussianMixture1D(_ImputingMixture):
    """Mixture of K 1-D Gaussians with known variance learned online with SVI / SVI+ (a
    ``river.base.Clusterer``).

    The model is :class:`streamsvi.models.KnownVarianceGMM1D` (the daemon's ``gauss1d``):
    component means μ_k ~ N(μ0, τ²), uniform weights, a known observation variance σ². A
    record is a dict with one numeric feature, ``feature`` (other keys are ignored); a
    missing, NaN or infinite value is imputed with the feature's running mean (0 before
    any value is seen), a value that is not a number is refused with ``ValueError``.
    ``learn_one`` buffers records and applies an SVI / SVI+ update per ``batch_size`` of
    them (``learn_many`` takes a DataFrame: same batching, same result); the first update
    starts the model from its first minibatch (``KnownVarianceGMM1D.init_params``).
    ``predict_one`` / ``predict_many`` give the MAP component, ``predict_proba_one`` /
    ``predict_proba_many`` the component posterior E_q[z], ``score_one`` / ``score_many``
    the posterior predictive log density log (1/K) Σ_k N(x | m_k, σ² + s_k²). Before the
    first update: component 0, uniform responsibilities, NaN scores.

    Parameters
    ----------
    n_components
        K.
    sigma2
        σ² > 0, the known observation variance.
    prior_mean, prior_var
        μ0 and τ² > 0 of the prior N(μ0, τ²) of every component mean.
    batch_size
        |S|: records per update.
    effective_batch_size
        M for SVI+ (≤ batch_size); None is plain SVI.
    n_total
        N, or the population size for an unbounded stream.
    tau0, kappa
        Robbins–Monro schedule ρ_t = (τ0 + t)^(−κ).
    feature
        The name of the record's feature; None takes the first of the sorted keys of the
        first record.
    seed
        Seed of the engine's random stream (None: a random seed).
    annealing
        An annealer (:mod:`streamsvi.inference.annealing`) or its dict form; None: SVI, or
        SVI+ with ``effective_batch_size`` (not both).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> model = GaussianMixture1D(n_components=2, batch_size=50, seed=1)
    >>> for c in rng.choice([-4.0, 4.0], size=1000):
    ...     model.learn_one({"x": c + rng.normal()})
    >>> model.predict_one({"x": -4.0}) != model.predict_one({"x": 4.0})
    True
    """

    def __init__(self, n_components: int = 3, sigma2: float = 1.0, prior_mean: float = 0.0,
                 prior_var: float = 10.0, batch_size: int = 32, effective_batch_size: float | None = None,
                 n_total: float = 10_000.0, tau0: float = 1.0, kappa: float = 0.7,
                 feature: str | None = None, seed: int | None = None, annealing=None):
        from .models import KnownVarianceGMM1D

        self.n_components = n_components
        self.sigma2 = sigma2
        self.prior_mean = prior_mean
        self.prior_var = prior_var
        self.batch_size = batch_size
        self.effective_batch_size = effective_batch_size
        self.n_total = n_total
        self.tau0 = tau0
        self.kappa = kappa
        self.feature = feature
        self.seed = seed
        self.annealing = annealing
        KnownVarianceGMM1D(n_components, sigma2=sigma2, prior_mean=prior_mean, prior_var=prior_var)  # checks
        self._init_learning([feature] if feature is not None else None)

    @classmethod
    def _unit_test_params(cls):
        yield from cls._mixture_test_params(sigma2=0.5)

    def _model(self):
        from .models import KnownVarianceGMM1D

        return KnownVarianceGMM1D(self.n_components, sigma2=self.sigma2, prior_mean=self.prior_mean,
                                  prior_var=self.prior_var)

    @classmethod
    def from_snapshot(cls, path, feature: str | None = None,
                      batch_size: int | None = None) -> "GaussianMixture1D":
        """A clusterer that starts from a ``gauss1d`` snapshot: the daemon's, or one
        :meth:`to_snapshot` wrote.

        It predicts what ``streamsvi.load(path)`` predicts (``predict``, ``responsibilities``,
        ``predictive_logpdf``), and learning goes on from the snapshot's engine and state
        (step, λ, random stream, records seen), bit for bit as that engine would go on.
        ``feature`` names the record's feature (default: the writing face's name, else
        ``"x0"``). ``batch_size`` defaults to the daemon's ``inference.batch_size`` stored
        with the snapshot (32 without one, or M rounded up if larger); the snapshot's SVI+
        setting is kept. ``ValueError`` for a snapshot of another model.
        """
        from .models import KnownVarianceGMM1D

        def settings(p, face):
            name = face.get("feature") if feature is None and face is not None else feature
            return dict(sigma2=p["sigma2"], prior_mean=p["prior_mean"], prior_var=p["prior_var"],
                        feature="x0" if name is None else name)

        return cls._from_snapshot(path, (KnownVarianceGMM1D,), "a 1-D Gaussian mixture", batch_size, settings)

    def _face_state(self) -> dict:
        return {"feature": self._features[0], "moments": self._moments.to_json()}

    # ------------------------------------------------------------- learning
    def _start(self, keys) -> bool:
        """The feature is the first of the sorted keys; no start from a record without any."""
        if not len(keys):
            return False
        self._features = [sorted(keys)[0]]
        self._build()
        return True


# ---------------------------------------------------------------- topic model
def _word_id(key, vocab, n_features):
    """Word id of a feature name: an int is the id, a vocabulary word its line, else crc32 mod V."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return int(key) if 0 <= key < n_features else None
    if vocab is not None:
        return vocab.get(key)
    import zlib

    return zlib.crc32(str(key).encode("utf-8")) % n_features


class TopicModel(_Face, base.MiniBatchTransformer):
    """LDA learned online with SVI / SVI+: documents in, topic proportions out.

    A document is a dict ``{word: count}`` (what river's
    ``feature_extraction.BagOfWords`` produces) or a DataFrame row of counts.
    Words map to ids by ``vocabulary`` (a sequence of words; unknown words are
    dropped), else by the hashing trick ``crc32(word) mod n_features`` (the
    same ids as the daemon's ``text`` codec); integer keys are ids already.
    ``learn_one`` buffers documents and applies one update per ``batch_size``
    of them (empty documents are skipped); ``transform_one`` returns
    ``{"topic_k": E_q[θ_k]}``, uniform before the first update.

    Parameters
    ----------
    n_components
        K, topics.
    n_features
        V: vocabulary size, or hash buckets.
    vocabulary
        Words in id order (a tuple), or None for hashing.
    batch_size, effective_batch_size, n_total, tau0, kappa
        |S|, M (SVI+; None = SVI), N and the Robbins–Monro schedule.
    doc_topic_prior, topic_word_prior, max_doc_update_iter, mean_change_tol
        As :class:`streamsvi.models.LDA`.
    seed
        Seed of the engine's random stream (None: a random seed).
    annealing
        An annealer or its dict form (as :class:`GaussianMixture`); None: SVI,
        or SVI+ with ``effective_batch_size`` (not both).

    Examples
    --------
    >>> import numpy as np
    >>> from streamsvi.estimators import TopicModel
    >>> sport = ["ball", "goal", "team", "match", "score", "coach"]
    >>> politics = ["vote", "poll", "party", "law", "senate", "mayor"]
    >>> rng = np.random.default_rng(0)
    >>> tm = TopicModel(n_components=2, n_features=64, batch_size=20, n_total=600,
    ...                 doc_topic_prior=0.5, topic_word_prior=0.1, seed=0)
    >>> for i in range(600):
    ...     words = rng.choice(sport if i % 2 else politics, size=4, replace=False)
    ...     tm.learn_one({w: 2 for w in words})
    >>> a = tm.transform_one({"ball": 2, "goal": 1})
    >>> b = tm.transform_one({"vote": 2, "party": 1})
    >>> max(a, key=a.get) != max(b, key=b.get)
    True
    """

    def __init__(self, n_components: int = 10, n_features: int = 2 ** 12, vocabulary: tuple | None = None,
                 batch_size: int = 64, effective_batch_size: float | None = None,
                 n_total: float = 10_000.0, tau0: float = 10.0, kappa: float = 0.7,
                 doc_topic_prior: float | None = None, topic_word_prior: float | None = None,
                 max_doc_update_iter: int = 100, mean_change_tol: float = 1e-3,
                 seed: int | None = None, annealing=None):
        from .models import LDA

        self.n_components = n_components
        self.n_features = n_features
        self.vocabulary = vocabulary
        self.batch_size = batch_size
        self.effective_batch_size = effective_batch_size
        self.n_total = n_total
        self.tau0 = tau0
        self.kappa = kappa
        self.doc_topic_prior = doc_topic_prior
        self.topic_word_prior = topic_word_prior
        self.max_doc_update_iter = max_doc_update_iter
        self.mean_change_tol = mean_change_tol
        self.seed = seed
        self.annealing = annealing
        _check_batch_sizes(batch_size, effective_batch_size)
        annealer = _annealer_of(annealing, batch_size, effective_batch_size)
        if vocabulary is not None and len(vocabulary) > n_features:
            raise ValueError(f"vocabulary has {len(vocabulary)} words, more than n_features={n_features}")
        self._vocab = {w: i for i, w in enumerate(vocabulary)} if vocabulary is not None else None
        model = LDA(n_components, n_features, doc_topic_prior=doc_topic_prior,
                    topic_word_prior=topic_word_prior, max_doc_update_iter=max_doc_update_iter,
                    mean_change_tol=mean_change_tol)
        self._make_learner(SVI(model, n_total=n_total, schedule=RobbinsMonro(tau0=tau0, kappa=kappa),
                               effective_batch_size=effective_batch_size, short_batches="svi",
                               annealer=annealer), partial(_docs, n_features=n_features))

    @classmethod
    def _unit_test_params(cls):
        yield {"n_components": 3, "n_features": 32, "batch_size": 8, "n_total": 200.0, "seed": 0}
        yield {"n_components": 2, "n_features": 16, "batch_size": 8, "n_total": 200.0, "seed": 1,
               "annealing": {"kind": "deterministic", "T0": 2.0, "n_steps": 4}}

    @classmethod
    def from_snapshot(cls, path, vocabulary=None, batch_size: int | None = None) -> "TopicModel":
        """A topic model that starts from an LDA snapshot: the daemon's, or one :meth:`to_snapshot` wrote.

        Its ``transform_one`` / ``transform_many`` give what ``streamsvi.load(path).topic_proportions``
        gives for the same documents, ``score_one`` the document's bound per word, and
        learning goes on from the snapshot's engine and state (step, λ, random stream,
        records seen). Words map to ids as the daemon's codecs map them: integer keys are
        ids, other words go through ``vocabulary`` (default: the writing face's) or else
        ``crc32(word) mod V`` (the ``text`` codec's hashing). ``batch_size`` defaults to
        the daemon's ``inference.batch_size`` stored with the snapshot (64 without one);
        SVI+ is kept as for :meth:`GaussianMixture.from_snapshot`. ``ValueError`` for a
        snapshot of another model.
        """
        from .models import LDA

        snap, face = _face_snapshot(cls, path, (LDA,), "an LDA topic model")
        p, eng = snap.engine.model.get_params(), snap.engine.to_dict()
        if vocabulary is None and face is not None and face.get("vocabulary") is not None:
            vocabulary = face["vocabulary"]
        batch_size, M, annealing = _snapshot_batching(snap, face, batch_size, 64)
        a = p["doc_topic_prior"]
        est = cls(n_components=p["n_components"], n_features=p["n_features"],
                  vocabulary=tuple(vocabulary) if vocabulary is not None else None, batch_size=batch_size,
                  effective_batch_size=M, n_total=eng["n_total"], annealing=annealing, **_schedule_settings(eng),
                  doc_topic_prior=tuple(a) if isinstance(a, list) else a,
                  topic_word_prior=p["topic_word_prior"], max_doc_update_iter=p["max_doc_update_iter"],
                  mean_change_tol=p["mean_change_tol"])
        est._adopt(snap, face)
        return est

    def _face_state(self) -> dict:
        return {"vocabulary": list(self.vocabulary) if self.vocabulary is not None else None}

    @staticmethod
    def _record_to_json(record):
        return [np.asarray(record[0]).tolist(), np.asarray(record[1]).tolist()]

    @staticmethod
    def _record_from_json(value):
        return np.asarray(value[0], dtype=np.int64), np.asarray(value[1], dtype=np.float64)

    def _row(self, x: dict):
        ids, counts = [], []
        for k, v in x.items():
            if v is None or v == 0:
                continue
            v = float(v)
            if not v > 0 or v != v or v == float("inf"):
                raise ValueError(f"word counts must be finite and > 0, got {k!r}: {v!r}")
            i = _word_id(k, self._vocab, self.n_features)
            if i is not None:
                ids.append(i)
                counts.append(v)
        return np.asarray(ids, dtype=np.int64), np.asarray(counts, dtype=np.float64)

    def learn_one(self, x: dict) -> None:
        row = self._row(x)
        if row[0].size:
            self._learner.learn(row)

    def _frame_rows(self, X) -> list:
        """A DataFrame of counts (columns = words) as documents ``(word ids, counts)``, as
        :meth:`_row` makes them row by row (columns of unknown words dropped; 0 and NaN…: see there)."""
        import scipy.sparse as sp

        cols = list(X.columns)
        ids = [_word_id(c, self._vocab, self.n_features) for c in cols]
        keep = [j for j, i in enumerate(ids) if i is not None]
        try:
            V = X.to_numpy(dtype=float, na_value=np.nan)
        except (TypeError, ValueError):
            return [self._row(x) for x in X.to_dict(orient="records")]
        V = V[:, keep] if len(keep) != len(cols) else V
        bad = ~(np.isfinite(V) & (V >= 0))
        if bad.any():                                  # the first bad count, as learn_one says it
            r, j = np.argwhere(bad)[0]
            raise ValueError(f"word counts must be finite and > 0, got {cols[keep[j]]!r}: {float(V[r, j])!r}")
        ids = np.asarray([ids[j] for j in keep], dtype=np.int64)
        C = sp.csr_matrix(V)
        C.eliminate_zeros()
        cut = C.indptr
        return [(ids[C.indices[a:b]], C.data[a:b].copy()) for a, b in zip(cut[:-1], cut[1:])]

    def learn_many(self, X) -> None:
        """Learn from a DataFrame of counts (columns = words); same batching, same result as learn_one."""
        self._learner.learn_many([r for r in self._frame_rows(X) if r[0].size])

    _dense_lam = None       # (state, λ in the dense form) that the predictions use

    def __getstate__(self):
        return {**self.__dict__, "_dense_lam": None}

    def _scoring_lam(self):
        """λ in the dense form, as ``streamsvi.load`` presents it (``LDA.dense_params``), made once per
        state: the engine steps λ stored as scaled columns, and the local step on that form can
        differ from the dense one in the last bit."""
        state = self._state
        d = self._dense_lam
        if d is None or d[0] is not state:
            d = self._dense_lam = (state, self._engine.model.dense_params(state.lam))
        return d[1]

    def _proportions(self, rows):
        K = self.n_components
        out = np.full((len(rows), K), 1.0 / K)
        if self._state is None:
            return out
        keep = [i for i, r in enumerate(rows) if r[0].size]
        if keep:
            out[keep] = self._engine.model.topic_proportions(self._scoring_lam(),
                                                             _docs([rows[i] for i in keep], self.n_features))
        return out

    def transform_one(self, x: dict) -> dict:
        p = self._proportions([self._row(x)])[0]
        return {f"topic_{k}": float(v) for k, v in enumerate(p)}

    def transform_many(self, X):
        """Topic proportions of a DataFrame's rows (columns topic_0 … topic_{K-1})."""
        import pandas as pd

        rows = self._frame_rows(X)
        return pd.DataFrame(self._proportions(rows), index=X.index,
                            columns=[f"topic_{k}" for k in range(self.n_components)])

    def _bounds(self, rows) -> np.ndarray:
        """L_d / N_d of each document: its local-step bound on log p(w_d | α, data) per word
        (``LDA.predictive_logpdf`` / its word count); NaN for an empty document or before the start."""
        out = np.full(len(rows), np.nan)
        if self._state is None:
            return out
        keep = [i for i, r in enumerate(rows) if r[0].size]
        if keep:
            X = _docs([rows[i] for i in keep], self.n_features)
            out[keep] = self._engine.model.predictive_logpdf(self._scoring_lam(), X) / np.asarray(X.sum(axis=1)).ravel()
        return out

    def score_one(self, x: dict) -> float:
        """The document's bound per word, L_d / N_d in nats (higher is better; ``streamsvi.load(path)``'s
        ``predictive_logpdf`` of the document divided by its word count); NaN for an empty document
        or before the first update."""
        return float(self._bounds([self._row(x)])[0])

    def score_many(self, X):
        """:meth:`score_one` of a DataFrame's rows, as a pandas Series."""
        import pandas as pd

        return pd.Series(self._bounds(self._frame_rows(X)), index=X.index)

    def topics(self) -> np.ndarray | None:
        """E_q[β] (K, V), or None before the first update."""
        return None if self._state is None else self._engine.model.topics(self._state.lam)


# ------------------------------------------------------------------ ratings (PMF)
from river.reco.base import Ranker as _Ranker  # noqa: E402


class _RatingsFace(_Face, _Ranker):
    """What the two ratings faces share (:class:`MatrixFactorization`, :class:`PoissonFactorization`):
    records ``(user, item, y)`` learned through a :class:`~streamsvi.learner.StreamLearner`,
    pickling that rebuilds the engine, ``flush``, ``rank`` (by ``_predict``'s means) and
    ``recommend`` (the model's top k, leaving out rated items)."""

    def _init_learning(self) -> None:
        """The end of both faces' ``__init__``: check the batching and the annealing, and make the learner."""
        if isinstance(self.batch_size, bool):
            raise ValueError(f"batch_size must be an integer >= 1, got {self.batch_size}")
        _check_batch_sizes(self.batch_size, self.effective_batch_size)
        _annealer_of(self.annealing, self.batch_size, self.effective_batch_size)
        self._make_learner(self._make_engine(), _ratings)

    def _model(self):
        """The face's model, from its settings."""
        raise NotImplementedError

    def _make_engine(self) -> SVI:
        """The engine of these settings (a function of the constructor arguments only), or the
        engine of the snapshot the face started from (:meth:`from_snapshot`), rebuilt from its dicts."""
        if self._spec is not None:
            return _engine_of_spec(self._spec)
        return SVI(self._model(), n_total=self.n_total, schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa),
                   effective_batch_size=self.effective_batch_size, short_batches="svi",
                   annealer=_annealer_of(self.annealing, self.batch_size, self.effective_batch_size))

    @classmethod
    def _from_snapshot(cls, path, models: tuple, what: str, batch_size, settings):
        """The face of a snapshot of one of ``models``: ``settings(model)`` gives the model's own
        settings, the shared ones come from the engine; then the snapshot's state is adopted."""
        snap, face = _face_snapshot(cls, path, models, what)
        eng = snap.engine.to_dict()
        batch_size, M, annealing = _snapshot_batching(snap, face, batch_size, 1000)
        est = cls(**settings(snap.engine.model), batch_size=batch_size, effective_batch_size=M,
                  n_total=eng["n_total"], annealing=annealing, **_schedule_settings(eng))
        est._adopt(snap, face)
        return est

    def _predict(self, users, items):
        """(predictive means, a second moment) of the pairs; the face's own."""
        raise NotImplementedError

    # Pickling and copy.deepcopy (river's checks need both): the engine is rebuilt from the
    # settings rather than copied. Its PMF (HPF) model keeps an id -> row lookup cache that holds a
    # threading.Lock (which cannot be pickled) and is keyed by id() of the state's id lists
    # (meaningless in a copy); learned values live in the learner's state and buffer, which are copied.
    _table = None       # [state, predictions under it, the rows' moments or None] (_predict_pair)

    def __getstate__(self):
        learner = copy.copy(self._learner)
        learner.engine = None
        return {**self.__dict__, "_learner": learner, "_table": None}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._learner.engine = self._make_engine()

    @staticmethod
    def _record_to_json(record):
        user, item, y = record
        return [_json_id(user), _json_id(item), float(y)]

    @staticmethod
    def _record_from_json(value):
        return tuple(value[:2]) + (float(value[2]),)

    @property
    def model(self):
        """The model being learned (:class:`~streamsvi.models.PMF`, :class:`~streamsvi.models.HPF`)."""
        return self._engine.model

    @property
    def state(self):
        """The engine state (None before the first update)."""
        return self._state

    def flush(self) -> None:
        """Apply the buffered ratings (counts) as one (possibly short) update."""
        self._learner.flush()

    def rank(self, user, items, x=None) -> list:
        """``items`` ordered by predicted rating (count), best first (ties in the given order)."""
        items = list(items)
        if not items:
            return []
        mean = self._predict([user] * len(items), items)[0]
        order = sorted(range(len(items)), key=lambda k: (-mean[k], k))
        return [items[k] for k in order]

    def recommend(self, user, k: int = 10, exclude=()) -> list:
        """The ``k`` best items not rated by ``user`` (in the learned stream) as ``[(item, prediction)]``,
        best first: the model's ``recommend``, as ``streamsvi.load(path).recommend`` gives it
        (leaving out what the user rated when the model has ``remember_rated``); [] before the
        first update."""
        if self._state is None:
            return []
        return self.model.recommend(self._state.lam, user, k=k, exclude=exclude, aux=self._state.aux)


class MatrixFactorization(_RatingsFace):
    """Probabilistic matrix factorisation learned online with SVI / SVI+ (a ``river`` Ranker).

    ``learn_one(user, item, y)`` buffers ratings and applies one SVI / SVI+
    update of :class:`streamsvi.models.PMF` each time ``batch_size`` of them
    are in (a rating is learned when its batch is applied; call
    :meth:`flush` to apply a partial batch). ``predict_one`` is the posterior
    predictive mean, :meth:`predict_var_one` its variance; unknown users and
    items fall back to the prior (and the biases of the known side). ``rank``
    (from river's ``Ranker``) orders items by predicted rating;
    :meth:`recommend` gives the top k items not yet rated by the user.

    Parameters
    ----------
    n_factors, sigma2, prior_var, bias_var, biases, offset, init_scale, row_clock, sweep
        The :class:`~streamsvi.models.PMF` settings; the defaults are ``configs/pmf.toml``'s
        (``offset="auto"``: μ0 is the running mean of the ratings learned so far).
    batch_size
        |S|: ratings per update.
    effective_batch_size
        M for SVI+ (≤ batch_size); None is plain SVI.
    n_total
        N, used with ``row_counts = "scaled"``; with the default ``"seen"``
        each row's N_i is its number of ratings so far (one pass over a stream).
    row_counts
        ``"seen"`` or ``"scaled"`` (see the model).
    tau0, kappa
        ρ_i = (τ0 + t_i)^(−κ), t_i the updates of row i so far.
    seed
        Seed of the engine's random stream (initial means, SVI+ noise).
    annealing
        None, ``{"kind": "none"}`` or SVI+ (``{"kind": "svi+", "M0": M, ...}``
        or an ``SVIPlus``); PMF has no local latent assignments, so
        ``deterministic`` and ``stochastic`` are refused (``ValueError``).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> model = MatrixFactorization(n_factors=2, batch_size=100, seed=1)
    >>> for _ in range(3000):
    ...     u, i = int(rng.integers(20)), int(rng.integers(10))
    ...     model.learn_one(u, i, 4.0 if (u + i) % 2 else 2.0)
    >>> model.predict_one(3, 4) > model.predict_one(3, 5)
    True
    >>> model.recommend(3, k=2)            # user 3 has rated all 10 items
    []
    """

    def __init__(self, n_factors: int = 5, sigma2: float = 0.8, prior_var: float = 0.3,
                 biases: bool = True, offset: float | str = "auto", init_scale: float = 0.1,
                 batch_size: int = 1000, effective_batch_size: float | None = None,
                 n_total: float = 100_000.0, row_counts: str = "seen", tau0: float = 0.0,
                 kappa: float = 1.0, seed: int | None = None, bias_var: float | None = 0.3,
                 row_clock: str = "ratings", sweep: str = "items_first", annealing=None):
        super().__init__(seed=seed)
        self.n_factors = n_factors
        self.sigma2 = sigma2
        self.prior_var = prior_var
        self.bias_var = bias_var
        self.row_clock = row_clock
        self.sweep = sweep
        self.biases = biases
        self.offset = offset
        self.init_scale = init_scale
        self.batch_size = batch_size
        self.effective_batch_size = effective_batch_size
        self.n_total = n_total
        self.row_counts = row_counts
        self.tau0 = tau0
        self.kappa = kappa
        self.annealing = annealing
        self._init_learning()

    def _model(self):
        from .models import PMF

        return PMF(n_factors=self.n_factors, sigma2=self.sigma2, prior_var=self.prior_var,
                   biases=self.biases, offset=self.offset, init_scale=self.init_scale,
                   row_counts=self.row_counts, bias_var=self.bias_var, row_clock=self.row_clock,
                   sweep=self.sweep)

    @classmethod
    def _unit_test_params(cls):
        yield {"n_factors": 2, "batch_size": 8, "seed": 0}
        yield {"n_factors": 2, "batch_size": 8, "seed": 1,
               "annealing": {"kind": "svi+", "M0": 2.0, "schedule": "linear", "increment": 1.0}}

    @classmethod
    def from_snapshot(cls, path, batch_size: int | None = None) -> "MatrixFactorization":
        """A ranker that starts from a PMF snapshot: the daemon's, or one :meth:`to_snapshot` wrote.

        ``predict_one`` / :meth:`predict_var_one` give what ``streamsvi.load(path).predict_rating``
        gives, :meth:`score_one` its ``predictive_logpdf``, :meth:`recommend` its ``recommend``
        (leaving out what each user rated, when the model has ``remember_rated``), and
        learning goes on from the snapshot's engine and state (step, λ, the id→row maps,
        random stream, records seen). ``batch_size`` defaults to the daemon's
        ``inference.batch_size`` stored with the snapshot (1000 without one). ``ValueError``
        for a snapshot of another model (a Poisson factorisation, ``hpf``, loads with
        :meth:`PoissonFactorization.from_snapshot`).
        """
        from .models import PMF

        def settings(m):
            return dict(n_factors=m.n_factors, sigma2=m.sigma2, prior_var=m.prior_var, biases=m.biases,
                        offset=m.offset, init_scale=m.init_scale, row_counts=m.row_counts,
                        bias_var=m.bias_var, row_clock=m.row_clock, sweep=m.sweep)

        return cls._from_snapshot(path, (PMF,), "a probabilistic matrix factorisation (PMF)", batch_size,
                                  settings)

    def learn_one(self, user, item, y, x=None) -> None:
        self._learner.learn((user, item, float(y)))

    def _predict(self, users, items):
        if self._state is None:
            n = len(users)
            if self.offset == "auto":        # the running mean of what is buffered so far (0 before any)
                pending = self._learner.unlearned()
                mu0 = float(np.mean([y for _, _, y in pending])) if pending else 0.0
            else:
                mu0 = float(self.offset)
            bv = self.prior_var if self.bias_var is None else self.bias_var
            return (np.full(n, mu0),
                    np.full(n, self.sigma2 + self.prior_var ** 2 * self.n_factors
                            + (2 * bv if self.biases else 0.0)))
        return self.model.predict_rating(self._state.lam, users, items, aux=self._state.aux)

    def _predict_pair(self, user, item, var: bool = True) -> tuple[float, float | None]:
        """Predictive mean and (with ``var``) variance of one rating.

        Under one state, the first predictions go through the model's ``predict_rating``
        (~50 µs each); once they are as many as 1/32 of the known rows (at least 8: a row's
        moments in the table cost ~1/40 of such a prediction), the moments of every known
        row are computed in one call and kept for the state, and each further pair
        of known str or int ids is a dot product or two: E[f] = E[x̃]·a and
        E[f²] = Σ E[x̃x̃ᵀ]∘Q (``PMF.predict_rating``'s arithmetic, the sums in another order).
        """
        state = self._learner.state
        t = self._table
        if state is not None and (t is None or t[0] is not state):
            t = self._table = [state, 0, None]
        if t is not None:
            table = t[2]
            if table is None:
                t[1] += 1
                aux = state.aux
                if t[1] >= max(8, (len(aux["users"]) + len(aux["items"])) // 32):
                    table = t[2] = self._moments_table(state)
            if table is not None:
                urow, irow, Eu, Eul, Q, a, mu0 = table
                cu, ci = user.__class__, item.__class__          # bool, float, numpy: the model's path
                u = urow.get(user) if cu is str or cu is int else None
                i = irow.get(item) if ci is str or ci is int else None
                if u is not None and i is not None:
                    Ef = sum(map(_mul, Eul[u], a[i]))
                    if not var:
                        return mu0 + Ef, None
                    return mu0 + Ef, self.sigma2 + max(float(Eu[u] @ Q[i]) - Ef * Ef, 0.0)
        mean, variance = self._predict([user], [item])
        return float(mean[0]), float(variance[0])

    def _moments_table(self, state):
        """Every known row's moments under ``state``: id → row maps (canonical ids, and the int
        of a decimal one: 42 is "42"), E[X̃X̃ᵀ] of the users (flat) and E[x̃] (their last column,
        as tuples), the items' Q (flat) and a (``PMF._design_moments``; tuples), and μ0."""
        model, aux, lam = self.model, state.aux, state.lam
        users, items = list(aux["users"]), list(aux["items"])
        Eu = model._row_moments(lam, "user", np.arange(len(users)))
        Q, a = model._design_moments(model._row_moments(lam, "item", np.arange(len(items))), "user")

        def rows(ids):
            out = {v: k for k, v in enumerate(ids)}
            for k, v in enumerate(ids):
                if v.lstrip("-").isdigit() and str(int(v)) == v:
                    out[int(v)] = k
            return out

        return (rows(users), rows(items), Eu.reshape(len(users), -1),
                [tuple(r) for r in Eu[:, :, -1].tolist()],
                np.ascontiguousarray(Q).reshape(len(items), -1), [tuple(r) for r in a.tolist()], model.mu0(aux))

    def predict_one(self, user, item, x=None) -> float:
        t = self._table
        if t is not None and t[2] is not None and t[0] is self._learner.state:     # _predict_pair's table
            urow, irow, _, Eul, _, a, mu0 = t[2]
            cu, ci = user.__class__, item.__class__
            u = urow.get(user) if cu is str or cu is int else None
            i = irow.get(item) if ci is str or ci is int else None
            if u is not None and i is not None:
                return mu0 + sum(map(_mul, Eul[u], a[i]))
        return self._predict_pair(user, item, var=False)[0]

    def predict_many(self, users, items) -> np.ndarray:
        """Predictive means of the pairs ``zip(users, items)`` in one call: exactly
        ``streamsvi.load(path).predict_rating(users, items)[0]`` (``predict_one`` may differ
        from it in the last bit: it sums in another order once it keeps a table of moments)."""
        return self._predict(list(users), list(items))[0]

    def predict_var_many(self, users, items) -> np.ndarray:
        """Predictive variances of the pairs ``zip(users, items)`` (σ² + Var_q[f]) in one call."""
        return self._predict(list(users), list(items))[1]

    def predict_var_one(self, user, item) -> float:
        """Posterior predictive variance of the rating."""
        return self._predict_pair(user, item)[1]

    def predict_sd_one(self, user, item) -> float:
        """Posterior predictive standard deviation of the rating (√ :meth:`predict_var_one`)."""
        return math.sqrt(self._predict_pair(user, item)[1])

    def score_one(self, user, item, y) -> float:
        """log p(y | data) of the rating ``y`` of (user, item): the moment-matched Gaussian
        N(y | predictive mean, predictive variance), ``PMF.predictive_logpdf`` (the prior's
        predictive before the first update)."""
        y = float(y)
        if self._state is None:
            mean, var = (float(v[0]) for v in self._predict([user], [item]))
            return -0.5 * math.log(2 * math.pi * var) - (y - mean) ** 2 / (2 * var)
        from .models import Ratings

        return float(self.model.predictive_logpdf(self._state.lam, Ratings([user], [item], [y]),
                                                  aux=self._state.aux)[0])



# ------------------------------------------------------- counts (Poisson factorisation)
class PoissonFactorization(_RatingsFace):
    """Hierarchical Poisson factorisation of counts learned online with SVI / SVI+ (a ``river`` Ranker).

    The ranker of implicit feedback: ``learn_one(user, item, y)`` takes a count y ≥ 0
    (plays, clicks, purchases; a click stream sends 1 per event, and river's
    ``True``/``False`` are 1/0) and applies one update of
    :class:`streamsvi.models.HPF` per ``batch_size`` records (:meth:`flush` applies a
    partial batch). ``predict_one(user, item)`` is the posterior predictive mean count
    E[θ_u]ᵀE[β_i] of a pair, rated or not, :meth:`predict_sd_one` its predictive
    standard deviation √(mean + Var_q[θ_uᵀβ_i]) (``HPF.predict_count``), :meth:`score_one`
    the log Poisson density of a given count at that mean, :meth:`recommend` the top k
    items the user has not yet counted. Unknown users and items use the prior's rows
    (Gamma(a, b′), Gamma(c, d′)), as ``streamsvi.load(path)`` does.

    A separate face rather than ``MatrixFactorization(model="hpf")``: the two models
    share no setting beyond K (PMF's σ², biases and offset against HPF's Gamma
    hierarchy), a count is checked as one (≥ 0) where a rating is not, and the
    predictive is a Poisson one (sd, log density) where PMF's is Gaussian. What they
    share (records, pickling, ``flush``, ``rank``, ``recommend``) is :class:`_RatingsFace`.

    Parameters
    ----------
    n_factors, theta_shape, activity_shape, activity_mean, beta_shape, popularity_shape
        The :class:`~streamsvi.models.HPF` settings and defaults (the paper's a = a′ = c = c′ = 0.3,
        b′ = d′ = 1), except ``row_counts = "seen"``: each row's N_u is its records so far (one
        pass over a stream, as ``MatrixFactorization``), where the model's ``"scaled"`` (N_u =
        N n_u / R) suits epochs over a fixed set of N = ``n_total`` records. Repeated records
        of a pair add up: the predicted count of a pair is its total.
    popularity_mean, init_scale, row_counts, remember_rated
        The other :class:`~streamsvi.models.HPF` settings, as above.
    batch_size
        |S|: counts per update (``configs/hpf.toml``'s 1000).
    effective_batch_size
        M for SVI+ (≤ batch_size); None is plain SVI.
    n_total
        N: with ``row_counts = "scaled"`` each row's N_u = N n_u / R (R the records seen).
    tau0, kappa
        ρ_u = (τ0 + t_u)^(−κ), t_u the updates of row u so far.
    seed
        Seed of the engine's random stream (SVI+ noise) and of the rows' hashed random start.
    annealing
        None, ``{"kind": "none"}`` or SVI+ (``{"kind": "svi+", "M0": M, ...}`` or an ``SVIPlus``);
        ``deterministic`` and ``stochastic`` are refused (``ValueError``), as for the daemon.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> model = PoissonFactorization(n_factors=2, batch_size=100, seed=1)
    >>> for _ in range(3000):
    ...     u, i = int(rng.integers(20)), int(rng.integers(10))
    ...     model.learn_one(u, i, int(rng.poisson(4.0 if (u + i) % 2 else 0.5)))
    >>> model.predict_one(3, 4) > model.predict_one(3, 5)
    True
    >>> model.predict_sd_one(3, 4) > 0
    True
    """

    def __init__(self, n_factors: int = 10, theta_shape: float = 0.3, activity_shape: float = 0.3,
                 activity_mean: float = 1.0, beta_shape: float = 0.3, popularity_shape: float = 0.3,
                 popularity_mean: float = 1.0, init_scale: float = 0.3, row_counts: str = "seen",
                 remember_rated: bool = True, batch_size: int = 1000,
                 effective_batch_size: float | None = None, n_total: float = 100_000.0,
                 tau0: float = 1.0, kappa: float = 0.7, seed: int | None = None, annealing=None):
        super().__init__(seed=seed)
        self.n_factors = n_factors
        self.theta_shape = theta_shape
        self.activity_shape = activity_shape
        self.activity_mean = activity_mean
        self.beta_shape = beta_shape
        self.popularity_shape = popularity_shape
        self.popularity_mean = popularity_mean
        self.init_scale = init_scale
        self.row_counts = row_counts
        self.remember_rated = remember_rated
        self.batch_size = batch_size
        self.effective_batch_size = effective_batch_size
        self.n_total = n_total
        self.tau0 = tau0
        self.kappa = kappa
        self.annealing = annealing
        self._init_learning()

    _MODEL_SETTINGS = ("n_factors", "theta_shape", "activity_shape", "activity_mean", "beta_shape",
                       "popularity_shape", "popularity_mean", "init_scale", "row_counts", "remember_rated")

    def _model(self):
        from .models import HPF

        return HPF(**{k: getattr(self, k) for k in self._MODEL_SETTINGS})

    @classmethod
    def _unit_test_params(cls):
        yield {"n_factors": 2, "batch_size": 8, "seed": 0}
        yield {"n_factors": 2, "batch_size": 8, "seed": 1, "row_counts": "seen",
               "annealing": {"kind": "svi+", "M0": 2.0, "schedule": "linear", "increment": 1.0}}

    @classmethod
    def from_snapshot(cls, path, batch_size: int | None = None) -> "PoissonFactorization":
        """A ranker that starts from an HPF snapshot: the daemon's, or one :meth:`to_snapshot` wrote.

        ``predict_many`` / :meth:`predict_sd_many` give what ``streamsvi.load(path).predict_count``
        gives, :meth:`score_one` its ``predictive_logpdf``, :meth:`recommend` its ``recommend``
        (leaving out what each user has, when the model has ``remember_rated``), and learning
        goes on from the snapshot's engine and state (step, λ, the id→row maps and row totals,
        random stream, records seen), bit for bit as that engine would. ``batch_size``
        defaults to the daemon's ``inference.batch_size`` stored with the snapshot (1000
        without one). ``ValueError`` for a snapshot of another model (PMF loads with
        :meth:`MatrixFactorization.from_snapshot`).
        """
        from .models import HPF

        def settings(m):
            p = m.get_params()
            return {k: p[k] for k in cls._MODEL_SETTINGS}

        return cls._from_snapshot(path, (HPF,), "a Poisson factorisation (HPF)", batch_size, settings)

    def learn_one(self, user, item, y, x=None) -> None:
        """Learn the count ``y`` (a finite number ≥ 0) of ``(user, item)``; ``ValueError`` otherwise,
        before anything is learned."""
        try:
            c = float(y)
        except (TypeError, ValueError):
            raise ValueError(f"a count must be a number >= 0, got {y!r} for ({user!r}, {item!r})") from None
        if not 0.0 <= c < math.inf:
            raise ValueError(f"a count must be a finite number >= 0, got {y!r} for ({user!r}, {item!r})")
        self._learner.learn((user, item, c))

    def _predict(self, users, items):
        """Predictive means and standard deviations of the counts of the pairs: ``HPF.predict_count``
        (the prior's rows for every pair before the first update)."""
        if self._state is None:
            model, rows = self.model, np.full(len(users), -1)
            mu, mu2 = model._moments2(None, "user", rows)
            mi, mi2 = model._moments2(None, "item", rows)
            mean = np.einsum("nk,nk->n", mu, mi)
            var = mean + np.maximum(np.einsum("nk,nk->n", mu2, mi2)
                                    - np.einsum("nk,nk->n", mu * mu, mi * mi), 0.0)
            return mean, np.sqrt(var)
        return self.model.predict_count(self._state.lam, users, items, aux=self._state.aux)

    def predict_one(self, user, item, x=None) -> float:
        """Posterior predictive mean count of the pair (rated or not)."""
        return float(self._predict([user], [item])[0][0])

    def predict_sd_one(self, user, item) -> float:
        """Posterior predictive standard deviation of the count √(mean + Var_q[θ_uᵀβ_i])."""
        return float(self._predict([user], [item])[1][0])

    def predict_many(self, users, items) -> np.ndarray:
        """Predictive mean counts of the pairs ``zip(users, items)`` in one call: exactly
        ``streamsvi.load(path).predict_count(users, items)[0]``."""
        return self._predict(list(users), list(items))[0]

    def predict_sd_many(self, users, items) -> np.ndarray:
        """Predictive standard deviations of the pairs ``zip(users, items)`` (``predict_count``'s sd)."""
        return self._predict(list(users), list(items))[1]

    def score_one(self, user, item, y) -> float:
        """log Poisson(y | μ) of the count ``y`` of (user, item), μ the predictive mean: the library's
        ``predictive_logpdf`` (the prior's mean before the first update). ``ValueError`` for a
        count that is negative or not finite."""
        from .models import Ratings

        y = float(y)
        if self._state is None:
            if not 0.0 <= y < math.inf:
                raise ValueError(f"a count must be a finite number >= 0, got {y!r}")
            mean = float(self._predict([user], [item])[0][0])
            return y * math.log(mean) - mean - math.lgamma(y + 1.0)
        return float(self.model.predictive_logpdf(self._state.lam, Ratings([user], [item], [y]),
                                                  aux=self._state.aux)[0])


# ----------------------------------------------------------- logistic regression
class LogisticRegression(_Face, base.MiniBatchClassifier):
    """Bayesian logistic regression learned online by stochastic ELBO gradients (a river classifier).

    The model is :class:`streamsvi.models.BayesianLogisticRegression` (q(w)
    mean-field Gaussian), the engine :class:`streamsvi.inference.GradientVI`
    with local expectation gradients (seed 001) by default. ``learn_one``
    buffers records and applies one update each time ``batch_size`` of them
    are in (``learn_many``: same batching, same result);
    ``predict_proba_one`` / ``predict_proba_many`` give the posterior
    predictive p(y | x, data) by the probit approximation, not the plug-in
    σ(xᵀμ).

    Binary: labels are bools (or 0 / 1); ``predict_proba_one`` returns
    ``{False: 1 − p, True: p}``. Features are fixed by ``features`` or the
    sorted keys of the first record; a missing feature is imputed with its
    running mean (as are NaN and infinite values), an unknown one ignored. With
    ``standardize`` (default) each feature is centred and scaled by its running
    mean and standard deviation (river ``stats.Var`` to rounding) as it arrives,
    so the defaults work on raw features.

    Parameters
    ----------
    batch_size
        |S|: records per update.
    n_total
        N, or the population size α of an unbounded stream: how many records
        the posterior stands for.
    prior_var
        Variance of the Gaussian prior of each weight.
    estimator
        ``"legrad"``, ``"regrad"`` or ``"ldgrad"``.
    optimizer, learning_rate, tau0, kappa
        The step (:class:`streamsvi.inference.GradientVI`): natural-gradient
        Robbins–Monro steps ρ_t = (τ0 + t)^(−κ) by default.
    standardize
        Scale features by their running statistics.
    features
        Feature names in order (a tuple); None takes the sorted keys of the first record.
    seed
        Seed of the engine's random stream (None: a random seed).

    Examples
    --------
    >>> from river import datasets, metrics
    >>> model = LogisticRegression(seed=0)
    >>> acc = metrics.Accuracy()
    >>> for x, y in datasets.Phishing():
    ...     acc.update(y, model.predict_one(x))
    ...     model.learn_one(x, y)
    >>> acc.get() > 0.85
    True
    """

    def __init__(self, batch_size: int = 16, n_total: float = 10_000.0, prior_var: float = 1.0,
                 estimator: str = "legrad", optimizer: str = "natural", learning_rate: float = 1.0,
                 tau0: float = 1.0, kappa: float = 0.7, standardize: bool = True,
                 features: tuple | None = None, seed: int | None = None):
        self.batch_size = batch_size
        self.n_total = n_total
        self.prior_var = prior_var
        self.estimator = estimator
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.tau0 = tau0
        self.kappa = kappa
        self.standardize = standardize
        self.features = features
        self.seed = seed
        _check_batch_sizes(batch_size, None)
        from .inference.gradients import ESTIMATORS, OPTIMIZERS

        if estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        self._features = list(features) if features is not None else None
        self._learner = None
        if self._features is not None:
            self._build()

    @classmethod
    def _unit_test_params(cls):
        yield {"batch_size": 8, "seed": 0}
        yield {"batch_size": 4, "estimator": "regrad", "optimizer": "adam", "learning_rate": 0.05, "seed": 1}

    @classmethod
    def from_snapshot(cls, path, features=None, batch_size: int | None = None):
        """A classifier that starts from a snapshot: the daemon's, or one :meth:`to_snapshot` wrote.

        ``predict_proba_many`` gives what ``streamsvi.load(path).predict_proba`` gives for the
        same rows (``predict_proba_one`` the same to rounding: it sums in plain floats), and
        learning goes on from the snapshot's engine (model and engine settings as stored)
        and state (step, λ, Adam's moments, random stream, records seen).

        The daemon learns from the records as they come, so a face loaded from a daemon's
        snapshot has ``standardize=False``; one loaded from a face's snapshot keeps that
        face's ``standardize`` and its running feature moments, and predicts on raw
        features as it did. ``features`` names the D columns in order (default: the
        writing face's names, else ``("x0", …)``, the positions of the daemon's ``x``);
        ``batch_size`` defaults to the ``inference.batch_size`` stored with the snapshot
        (16 without one). ``ValueError`` for a snapshot of another model (a softmax
        snapshot: :class:`SoftmaxRegression`) or ``features`` of the wrong length.
        """
        from .models.logistic import BayesianLogisticRegression, SoftmaxRegression as _Softmax

        model_cls, what = ((_Softmax, "a softmax regression") if cls._multiclass_face
                           else (BayesianLogisticRegression, "a binary logistic regression"))
        snap, face = _face_snapshot(cls, path, (model_cls,), what)
        model, eng = snap.engine.model, snap.engine.to_dict()
        D = model.n_features
        if features is None and face is not None:
            features = face.get("features")
        features = tuple(features) if features is not None else tuple(f"x{i}" for i in range(D))
        if len(features) != D:
            raise ValueError(f"features has {len(features)} names, the snapshot's model has {D} features")
        batch_size, _, _ = _snapshot_batching(snap, face, batch_size, 16)
        settings = dict(batch_size=batch_size, n_total=eng["n_total"], prior_var=model.prior_var,
                        estimator=eng["estimator"], optimizer=eng["optimizer"],
                        learning_rate=eng["learning_rate"], **_schedule_settings(eng),
                        standardize=bool(face.get("standardize")) if face is not None else False,
                        features=features)
        if cls._multiclass_face:
            if face is not None:
                given = face.get("classes_setting")
                settings["classes"] = tuple(given) if given is not None else None
            else:
                settings["classes"] = tuple(range(model.n_classes))     # the daemon's labels 0 … C−1
        est = cls(**settings)
        if cls._multiclass_face and face is not None:
            est._classes = list(face.get("classes") or [])
        if face is not None and face.get("moments") is not None:
            est._moments = _RunningMoments.from_json(face["moments"], D)
        est._adopt(snap, face)
        est._pred = None
        return est

    _multiclass_face = False      # SoftmaxRegression: True (which model its snapshots hold)

    def _face_state(self) -> dict:
        return {"features": list(self._features), "standardize": bool(self.standardize),
                "moments": self._moments.to_json()}

    @property
    def _multiclass(self):
        return False

    @property
    def _is_stochastic(self):
        return True

    _pending: _DictRows | None = None      # raw rows not yet handed to the learner (None until built)

    def _build(self):
        from .inference.gradients import GradientVI
        from .models.logistic import BayesianLogisticRegression

        model = BayesianLogisticRegression(n_features=len(self._features), prior_var=self.prior_var)
        self._make_learner(GradientVI(model, n_total=self.n_total, estimator=self.estimator,
                                      optimizer=self.optimizer, learning_rate=self.learning_rate,
                                      schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa)), _dense)
        self._start_features()

    def _start_features(self):
        """The running moments, the buffer of raw rows and their labels, no cached predictor."""
        self._moments = _RunningMoments(len(self._features))
        self._pending = _DictRows(self._features, self.batch_size)
        self._pending_y: list = []
        self._pred = None

    # ------------------------------------------------------------ features
    def _transform(self, X, mean, S, n) -> np.ndarray:
        """Raw rows (NaN: missing) as the model's features: imputed, then standardised."""
        X = _impute(X, mean)
        if self.standardize:
            return (X - mean) / _scale(S, n)
        return X

    def _sync(self) -> None:
        """Learn the running moments of the rows held back, then hand them (standardised,
        label last) to the learner."""
        if self._pending is None or not self._pending.n:
            return
        X = self._pending.take()
        y, self._pending_y = self._pending_y, []
        self._pred = None
        self._learner.learn_many(np.column_stack([self._transform(X, *self._moments.learn(X)), y]))

    def _rows_now(self, X: np.ndarray) -> np.ndarray:
        """Raw rows as features with the moments as they are now (for predictions)."""
        self._sync()
        return self._transform(X, *self._moments.current())

    @staticmethod
    def _label(y) -> float:
        if isinstance(y, (bool, np.bool_)) or y in (0, 1):
            return float(bool(y))
        raise ValueError(f"LogisticRegression is binary: labels must be bools (or 0 / 1), got {y!r}")

    # ------------------------------------------------------------- learning
    def learn_one(self, x: dict, y) -> None:
        label = self._label(y)
        if self._features is None:
            self._features = sorted(x)
            self._build()
        pending = self._pending
        pending.put(x)
        self._pending_y.append(label)
        if pending.n + len(self._learner.buffer) >= self.batch_size:     # an update is due
            self._sync()

    def learn_many(self, X, y) -> None:
        """Learn from a DataFrame and a Series of labels; same batching, same result as learn_one."""
        labels = [self._label(v) for v in y.tolist()]
        rows = self._frame_rows(X)
        if rows is not None:
            self._learner.learn_many(np.column_stack([rows, labels]))

    def _frame_rows(self, X):
        """A DataFrame's rows as the model sees them (imputed, standardised, the moments learnt
        from them), after what is held back; None for an empty frame before any feature is known."""
        if self._features is None:
            if not len(X):
                return None
            self._features = sorted(X.columns)
            self._build()
        self._sync()
        Xr = self._pending.frame(X)
        self._pred = None
        return self._transform(Xr, *self._moments.learn(Xr))

    # ------------------------------------------------------------ predicting
    def _centre_scale(self):
        """The running means and standard deviations the features are standardised with
        (0 and 1 without ``standardize``)."""
        mean, S, n = self._moments.current()
        return (mean, _scale(S, n)) if self.standardize else (np.zeros_like(mean), np.ones_like(mean))

    def _predictor(self, state):
        """What predict_proba_one needs of the state and the moments, as plain floats."""
        model = self._engine.model
        lam = state.lam
        if set(lam.keys()) != {"mean", "log_std"}:
            return (state, self._moments.n_rows, None)
        mu, sd = self._centre_scale()
        w, v = np.asarray(lam["mean"], float), np.exp(2.0 * np.asarray(lam["log_std"], float))
        D = len(self._features)
        b, bv = (float(w[D]), float(v[D])) if model.fit_intercept else (0.0, 0.0)
        get = self._pending.get or self._pending.values
        # z_i = (x_i − μ_i)/sd_i folded in: w_i z_i = (x_i − μ_i)(w_i/sd_i), v_i z_i² = (x_i − μ_i)²(v_i/sd_i²)
        return (state, self._moments.n_rows, get, tuple(mu.tolist()), tuple((w[:D] / sd).tolist()),
                tuple((v[:D] / (sd * sd)).tolist()), b, bv)

    def _p_one(self, x: dict) -> float:
        """p(y = 1 | x, data) of one record: plain float arithmetic with the cached weights."""
        pending = self._pending
        if pending is None:
            return 0.5
        if pending.n:
            self._sync()
        state = self._learner.state
        if state is None:
            return 0.5
        P = self._pred                      # None after the moments moved (_sync, learn_many)
        if P is None or P[0] is not state:
            P = self._pred = self._predictor(state)
        if P[2] is not None:
            _, _, get, mu, a, vv, b, bv = P
            try:
                d = list(map(_sub, get(x), mu))
                m = sum(map(_mul, d, a)) + b
                s2 = sum(map(_mul, map(_mul, d, d), vv)) + bv
                fast = m - m == 0.0 and s2 - s2 == 0.0          # finite: no NaN, inf
            except (KeyError, TypeError, ValueError):            # missing or odd values
                fast = False
            if fast:
                k = m / math.sqrt(1.0 + math.pi * s2 / 8.0)
                if k >= 0:
                    return 1.0 / (1.0 + math.exp(-k))
                e = math.exp(k)
                return e / (1.0 + e)
        return float(self._p1(self._rows_now(pending.matrix([x])))[0])      # imputes, or says what is wrong

    def _p1(self, rows: np.ndarray) -> np.ndarray:
        if self._state is None:
            return np.full(rows.shape[0], 0.5)
        return self._engine.model.predict_proba(self._state.lam, rows)

    def predict_proba_one(self, x: dict) -> dict:
        p = self._p_one(x)
        return {False: 1.0 - p, True: p}

    def predict_one(self, x: dict) -> bool:
        return self._p_one(x) > 0.5

    def _p_many(self, X) -> np.ndarray:
        """p(y = 1 | x, data) of a DataFrame's rows."""
        if self._features is None:
            return np.full(len(X), 0.5)
        return self._p1(self._rows_now(self._pending.frame(X)))

    def predict_proba_many(self, X):
        """A DataFrame with columns False and True."""
        import pandas as pd

        p = self._p_many(X)
        return pd.DataFrame({False: 1.0 - p, True: p}, index=X.index)

    def predict_many(self, X):
        import pandas as pd

        return pd.Series(self._p_many(X) > 0.5, index=X.index)

    @property
    def weights(self) -> dict | None:
        """Posterior mean and standard deviation of each feature's weight (standardised units)."""
        if self._state is None:
            return None
        m, s = self._state.lam["mean"], np.exp(self._state.lam["log_std"])
        names = [*self._features, "intercept"]
        return {f: (float(a), float(b)) for f, a, b in zip(names, m, s)}


class SoftmaxRegression(LogisticRegression):
    """Multiclass Bayesian logistic (softmax) regression learned online (a river classifier).

    The model is :class:`streamsvi.models.logistic.SoftmaxRegression` (one
    weight vector per class, q mean-field Gaussian), the engine
    :class:`streamsvi.inference.GradientVI`, with the batching, feature
    handling and steps of :class:`LogisticRegression`. Labels are any hashable
    values; classes are numbered in the order they first appear, and a new
    class grows the model by one weight vector (mean 0, the prior's initial
    deviation; Adam's moments 0), so the stream need not announce its classes.
    Until two classes have been seen the model has one extra, never-seen
    class, which ``predict_proba_one`` leaves out (the probabilities are
    renormalised over the classes seen). ``predict_proba_one`` gives the
    posterior predictive p(y | x, data) (the mean-field softmax approximation of
    the model), not the plug-in softmax(Wμ).

    Parameters
    ----------
    classes
        The labels in order (a tuple), or None (default) to learn them from the stream.
    Others
        As for :class:`LogisticRegression`.

    Examples
    --------
    >>> from river import datasets, metrics
    >>> model = SoftmaxRegression(seed=0)
    >>> acc = metrics.Accuracy()
    >>> for x, y in datasets.ImageSegments().take(1000):
    ...     acc.update(y, model.predict_one(x))
    ...     model.learn_one(x, y)
    >>> acc.get() > 0.7
    True
    """

    def __init__(self, batch_size: int = 16, n_total: float = 10_000.0, prior_var: float = 1.0,
                 estimator: str = "legrad", optimizer: str = "natural", learning_rate: float = 1.0,
                 tau0: float = 1.0, kappa: float = 0.7, standardize: bool = True,
                 features: tuple | None = None, classes: tuple | None = None, seed: int | None = None):
        self.classes = classes
        self._classes = list(classes) if classes is not None else []
        if len(set(self._classes)) != len(self._classes):
            raise ValueError(f"classes must be distinct, got {classes!r}")
        super().__init__(batch_size=batch_size, n_total=n_total, prior_var=prior_var, estimator=estimator,
                         optimizer=optimizer, learning_rate=learning_rate, tau0=tau0, kappa=kappa,
                         standardize=standardize, features=features, seed=seed)

    @classmethod
    def _unit_test_params(cls):
        yield {"batch_size": 8, "seed": 0}
        yield {"batch_size": 4, "estimator": "regrad", "optimizer": "adam", "learning_rate": 0.05, "seed": 1}

    @property
    def _multiclass(self):
        return True

    _multiclass_face = True

    def _face_state(self) -> dict:
        return {**super()._face_state(), "classes": list(self._classes),
                "classes_setting": list(self.classes) if self.classes is not None else None}

    def _engine_for(self, n_classes: int):
        from .inference.gradients import GradientVI
        from .models.logistic import SoftmaxRegression as _Model

        model = _Model(n_features=len(self._features), n_classes=n_classes, prior_var=self.prior_var)
        return GradientVI(model, n_total=self.n_total, estimator=self.estimator, optimizer=self.optimizer,
                          learning_rate=self.learning_rate, schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa))

    def _build(self):
        self._make_learner(self._engine_for(max(2, len(self._classes))), _dense)
        self._start_features()

    def _grow(self):
        """One more class: the engine is rebuilt and λ (and Adam's moments) get a new block."""
        old = self._engine
        new = self._engine_for(len(self._classes))
        if self._state is not None:
            from dataclasses import replace

            P = old.model.n_inputs
            fresh = new.model.init_params(None, None, self.n_total)
            extra = slice(old.model.n_params, new.model.n_params)
            lam = type(self._state.lam)(
                mean=np.concatenate([self._state.lam["mean"], fresh["mean"][extra]]),
                log_std=np.concatenate([self._state.lam["log_std"], fresh["log_std"][extra]]))
            aux = self._state.aux
            if aux is not None:
                half = old.model.n_params
                aux = {k: np.concatenate([v[:half], np.zeros(P), v[half:], np.zeros(P)]) for k, v in aux.items()}
            self._state = replace(self._state, lam=lam, aux=aux)
        self._engine = new

    def _label(self, y) -> float:
        if y is None:
            raise ValueError("SoftmaxRegression needs a label, got None")
        if y not in self._classes:
            self._classes.append(y)
            if self._engine is not None and len(self._classes) > self._engine.model.n_classes:
                self._grow()
        return float(self._classes.index(y))

    def learn_one(self, x: dict, y) -> None:
        if self._features is None:
            self._features = sorted(x)
            self._build()
        super().learn_one(x, y)

    def learn_many(self, X, y) -> None:
        """Learn from a DataFrame and a Series of labels; same batching, same result as learn_one
        (a new class grows the model between the same records)."""
        ys = y.tolist()
        if any(v is None for v in ys):
            raise ValueError("SoftmaxRegression needs a label, got None")
        rows = self._frame_rows(X)
        if rows is None:
            return
        rows = np.column_stack([rows, np.zeros(len(ys))])
        start = 0
        for k, v in enumerate(ys):
            if v not in self._classes and len(self._classes) + 1 > self._engine.model.n_classes:
                self._learner.learn_many(rows[start:k])      # the records before the new class
                start = k
            rows[k, -1] = self._label(v)
        self._learner.learn_many(rows[start:])

    def _proba_rows(self, rows: np.ndarray) -> np.ndarray:
        k = len(self._classes)
        if self._state is None:
            return np.full((rows.shape[0], k), 1.0 / max(k, 1))
        p = self._engine.model.predict_proba(self._state.lam, rows)
        if k == p.shape[1]:                 # every class seen: the model's probabilities as they are
            return p
        p = p[:, :k]
        return p / p.sum(axis=1, keepdims=True)

    def _predictor(self, state):
        """The weights' means and variances as (C, D) matrices and (C,) intercepts, and the moments."""
        model = self._engine.model
        lam = state.lam
        if set(lam.keys()) != {"mean", "log_std"}:
            return (state, self._moments.n_rows, None)
        mu, sd = self._centre_scale()
        C, P, D = model.n_classes, model.n_inputs, len(self._features)
        W = np.asarray(lam["mean"], float).reshape(C, P)
        V = np.exp(2.0 * np.asarray(lam["log_std"], float)).reshape(C, P)
        if model.fit_intercept:
            b, bv = W[:, D].copy(), V[:, D].copy()
        else:
            b, bv = np.zeros(C), np.zeros(C)
        get = self._pending.get or self._pending.values
        # z = (x − μ)/sd folded in: W z = (W/sd)(x − μ), V z² = (V/sd²)(x − μ)²
        return (state, self._moments.n_rows, get, mu, np.ascontiguousarray(W[:, :D] / sd),
                np.ascontiguousarray(V[:, :D] / (sd * sd)), b, bv)

    def _proba_one(self, x: dict) -> np.ndarray | None:
        """p(y = c | x, data) over the classes seen (None when none is): one record with the
        cached weights, the same arithmetic as the model's mean-field softmax approximation."""
        k = len(self._classes)
        pending = self._pending
        if pending is None or not k:
            return None if not k else np.full(k, 1.0 / k)
        if pending.n:
            self._sync()
        state = self._learner.state
        if state is None:
            return np.full(k, 1.0 / k)
        P = self._pred                      # None after the moments moved (_sync, learn_many)
        if P is None or P[0] is not state:
            P = self._pred = self._predictor(state)
        if P[2] is not None:
            _, _, get, mu, W, V, b, bv = P
            try:
                d = np.array(get(x), dtype=float) - mu
            except (KeyError, TypeError, ValueError):
                d = None
            if d is not None:
                dd = d * d
                if math.isfinite(dd.sum()):                     # NaN, inf: the array path below
                    a = (W @ d + b) / np.sqrt(1.0 + (V @ dd + bv) * (math.pi / 8.0))
                    e = np.exp(a - a.max())[:k]                 # softmax over the classes seen
                    return e / e.sum()
        return self._proba_rows(self._rows_now(pending.matrix([x])))[0]

    def predict_proba_one(self, x: dict) -> dict:
        p = self._proba_one(x)
        if p is None:
            return {}
        return dict(zip(self._classes, p.tolist()))

    def predict_one(self, x: dict):
        p = self._proba_one(x)
        if p is None:
            return None
        return self._classes[int(p.argmax())]

    def predict_proba_many(self, X):
        """A DataFrame with one column per class seen."""
        import pandas as pd

        if self._features is None or not self._classes:
            k = len(self._classes)
            return pd.DataFrame({c: np.full(len(X), 1.0 / k) for c in self._classes}, index=X.index)
        p = self._proba_rows(self._rows_now(self._pending.frame(X)))
        return pd.DataFrame(p, columns=list(self._classes), index=X.index)

    def predict_many(self, X):
        import pandas as pd

        proba = self.predict_proba_many(X)
        if proba.shape[1] == 0:
            return pd.Series([None] * len(X), index=X.index)
        return proba.idxmax(axis=1)

    @property
    def weights(self) -> dict | None:
        """Per class: the posterior mean and deviation of each feature's weight (standardised units)."""
        if self._state is None:
            return None
        C, P = self._engine.model.n_classes, self._engine.model.n_inputs
        m = self._state.lam["mean"].reshape(C, P)
        s = np.exp(self._state.lam["log_std"]).reshape(C, P)
        names = [*self._features, "intercept"]
        return {c: {f: (float(a), float(b)) for f, a, b in zip(names, m[i], s[i])}
                for i, c in enumerate(self._classes)}


# ------------------------------------------------------------- sequences (HMM)
def _sequences(rows: list):
    """Sequences (int64 arrays) as one :class:`~streamsvi.sequence_batch.Sequences` batch."""
    from .sequence_batch import Sequences

    return Sequences.from_list(rows)


class HiddenMarkovModel(_Face, base.Estimator):
    """A discrete hidden Markov model learned online with SVI / SVI+: symbol sequences in.

    river has no base class for sequence models, so this face keeps river's
    names with one sequence where river has one record. The interface:

    * ``learn_one(sequence)``: one sequence (a list of ints in 0 … V−1) is one
      record; sequences are buffered and one update of
      :class:`streamsvi.models.DiscreteHMM` is applied per ``batch_size`` of
      them (the daemon's streaming start first); an empty sequence is skipped.
      ``learn_many(sequences)``: the same for an iterable of sequences (same
      batching, same result).
    * ``score_one(sequence)``: log p(x | E_q[π], E_q[A], E_q[B]), the
      sequence's log-likelihood under the posterior-mean parameters
      (``streamsvi.load(path).log_likelihood``); 0.0 for an empty sequence, NaN
      before the first update. ``score_many(sequences)``: an array.
    * ``predict_one(sequence)``: the most likely state path (Viterbi, under the
      posterior-mean parameters; ``streamsvi.load(path).viterbi``) as a list of
      ints; all 0 before the first update. ``predict_many(sequences)``: a list.
    * ``predict_proba_one(sequence)``: the filtering distributions p(z_t | x_1..x_t),
      an (L, K) array (``streamsvi.load(path).filtering``).

    A symbol outside 0 … V−1 or not an integer is refused (``ValueError``) by the
    call that brings it.

    Parameters
    ----------
    n_states, n_symbols
        K hidden states, V symbols.
    init_concentration, transition_concentration, emission_concentration, init
        As :class:`streamsvi.models.DiscreteHMM` (None: 1/K, 1/K and 10/V).
    batch_size, effective_batch_size, n_total, tau0, kappa
        |S| sequences per update, M (SVI+; None = SVI), N and the Robbins–Monro schedule.
    seed
        Seed of the engine's random stream (None: a random seed).
    annealing
        An annealer or its dict form (as :class:`GaussianMixture`).

    Examples
    --------
    >>> import numpy as np
    >>> from streamsvi.models.hmm import sample_hmm
    >>> A = np.array([[0.9, 0.1], [0.1, 0.9]]); B = np.array([[0.8, 0.2, 0.0], [0.0, 0.2, 0.8]])
    >>> X, _ = sample_hmm(np.array([0.5, 0.5]), A, B, lengths=[30] * 400, rng=np.random.default_rng(0))
    >>> model = HiddenMarkovModel(n_states=2, n_symbols=3, batch_size=50, n_total=400, seed=0)
    >>> model.learn_many(X.to_list())
    >>> path = model.predict_one([0, 0, 0, 2, 2, 2])
    >>> path[0] == path[1] == path[2] != path[3] == path[4] == path[5]
    True
    """

    def __init__(self, n_states: int = 5, n_symbols: int = 4, init_concentration=None,
                 transition_concentration=None, emission_concentration=None, init: str = "dirichlet",
                 batch_size: int = 32, effective_batch_size: float | None = None, n_total: float = 10_000.0,
                 tau0: float = 1.0, kappa: float = 0.7, seed: int | None = None, annealing=None):
        from .models import DiscreteHMM

        self.n_states = n_states
        self.n_symbols = n_symbols
        self.init_concentration = init_concentration
        self.transition_concentration = transition_concentration
        self.emission_concentration = emission_concentration
        self.init = init
        self.batch_size = batch_size
        self.effective_batch_size = effective_batch_size
        self.n_total = n_total
        self.tau0 = tau0
        self.kappa = kappa
        self.seed = seed
        self.annealing = annealing
        _check_batch_sizes(batch_size, effective_batch_size)
        annealer = _annealer_of(annealing, batch_size, effective_batch_size)
        model = DiscreteHMM(n_states=n_states, n_symbols=n_symbols, init_concentration=init_concentration,
                            transition_concentration=transition_concentration,
                            emission_concentration=emission_concentration, init=init)
        self._make_learner(SVI(model, n_total=n_total, schedule=RobbinsMonro(tau0=tau0, kappa=kappa),
                               effective_batch_size=effective_batch_size, short_batches="svi",
                               annealer=annealer), _sequences)

    @classmethod
    def _unit_test_params(cls):
        yield {"n_states": 2, "n_symbols": 3, "batch_size": 8, "n_total": 200.0, "seed": 0}

    @classmethod
    def from_snapshot(cls, path, batch_size: int | None = None) -> "HiddenMarkovModel":
        """A sequence model that starts from an HMM snapshot: the daemon's, or one :meth:`to_snapshot` wrote.

        It scores what ``streamsvi.load(path)`` scores (``log_likelihood``, ``viterbi``,
        ``filtering``), and learning goes on from the snapshot's engine and state (step,
        λ, random stream, records seen). ``batch_size`` defaults to the daemon's
        ``inference.batch_size`` stored with the snapshot (32 without one); SVI+ is kept
        as for :meth:`GaussianMixture.from_snapshot`. ``ValueError`` for a snapshot of
        another model.
        """
        from .models import DiscreteHMM

        snap, face = _face_snapshot(cls, path, (DiscreteHMM,), "a discrete hidden Markov model")
        p, eng = snap.engine.model.get_params(), snap.engine.to_dict()
        batch_size, M, annealing = _snapshot_batching(snap, face, batch_size, 32)
        est = cls(n_states=p["n_states"], n_symbols=p["n_symbols"], init_concentration=p["init_concentration"],
                  transition_concentration=p["transition_concentration"],
                  emission_concentration=p["emission_concentration"], init=p["init"], batch_size=batch_size,
                  effective_batch_size=M, n_total=eng["n_total"], annealing=annealing, **_schedule_settings(eng))
        est._adopt(snap, face)
        return est

    @staticmethod
    def _record_to_json(record):
        return np.asarray(record).tolist()

    @staticmethod
    def _record_from_json(value):
        return np.asarray(value, dtype=np.int64)

    def _seq(self, x) -> np.ndarray:
        """One sequence as an int64 array; ``ValueError`` for a symbol that is not an int in 0 … V−1."""
        try:
            a = np.asarray(x)
        except (TypeError, ValueError):
            raise ValueError(f"a sequence must be a flat list of integer symbols, got {_short_repr(x)}") from None
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iuf"):
            raise ValueError(f"a sequence must be a flat list of integer symbols, got {_short_repr(x)}")
        if a.size and (a.dtype.kind == "f" and not np.all(a == np.round(a))):
            raise ValueError(f"symbols must be integers, got {_short_repr(x)}")
        a = a.astype(np.int64)
        if a.size and (a.min() < 0 or a.max() >= self.n_symbols):
            bad = int(a[(a < 0) | (a >= self.n_symbols)][0])
            raise ValueError(f"symbols must be in 0..{self.n_symbols - 1} (n_symbols={self.n_symbols}), got {bad}")
        return a

    def learn_one(self, x) -> None:
        a = self._seq(x)
        if a.size:
            self._learner.learn(a)

    def learn_many(self, X) -> None:
        """Learn from an iterable of sequences; same batching, same result as learn_one."""
        rows = [self._seq(x) for x in X]             # every sequence checked before any is learned
        self._learner.learn_many([a for a in rows if a.size])

    def _apply(self, method: str, seqs: list, empty, before):
        """``model.<method>(λ, non-empty sequences)`` placed back among the empty ones."""
        out = [empty(0) if not a.size else None for a in seqs]
        keep = [i for i, a in enumerate(seqs) if a.size]
        if keep:
            if self._state is None:
                for i in keep:
                    out[i] = before(seqs[i].size)
            else:
                got = getattr(self._engine.model, method)(self._state.lam, _sequences([seqs[i] for i in keep]))
                for i, v in zip(keep, got):
                    out[i] = v
        return out

    def score_many(self, X) -> np.ndarray:
        """log p(x | E_q[β]) of each sequence (0.0 for an empty one, NaN before the first update)."""
        seqs = [self._seq(x) for x in X]
        return np.array(self._apply("log_likelihood", seqs, lambda L: 0.0, lambda L: np.nan), dtype=float)

    def score_one(self, x) -> float:
        return float(self.score_many([x])[0])

    def predict_many(self, X) -> list:
        """The most likely state path of each sequence (lists of ints)."""
        seqs = [self._seq(x) for x in X]
        return [np.asarray(p).tolist() for p in
                self._apply("viterbi", seqs, lambda L: [], lambda L: [0] * L)]

    def predict_one(self, x) -> list:
        return self.predict_many([x])[0]

    def predict_proba_one(self, x) -> np.ndarray:
        """p(z_t | x_1..x_t) for t = 1 … L, an (L, K) array (uniform rows before the first update)."""
        K = self.n_states
        return self._apply("filtering", [self._seq(x)], lambda L: np.empty((0, K)),
                           lambda L: np.full((L, K), 1.0 / K))[0]

    def mean_params(self):
        """(E_q[π], E_q[A], E_q[B]), or None before the first update."""
        return None if self._state is None else self._engine.model.mean_params(self._state.lam)
