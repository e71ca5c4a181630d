"""The interface a conjugate-exponential-family model implements.

A model owns the math of one family (docs/design.md, "Layers"); the inference engine
owns the update ``λ ← (1 − ρ) λ + ρ (η + N λ')``, the step size, the data-set
size N and the SVI+ weights. A model never sees ρ, N or the noise.

Global natural parameters (λ, the prior η, and sums of expected sufficient
statistics) are :class:`NatParams`: named float64 arrays that add and scale.

Methods a model provides (all pure functions of their arguments):

``prior() -> NatParams``
    η, the prior's natural parameter.
``check_batch(x) -> x``
    Validate and coerce a minibatch; raise ``ValueError`` saying what is wrong.
``init_params(rng, x, n_total) -> NatParams``
    A random initial λ built from the records ``x`` (scaled to ``n_total``).
``local_step(lam, x) -> local``
    Fit the local variational factors q(θ_n) of every record given λ.
``suffstats(local, x, weights=None) -> NatParams``
    Σ_n w_n E_q[t(θ_n)]: the (weighted) expected sufficient statistics.
``suffstats_pair(local, x, weights) -> (NatParams, NatParams)``  (optional)
    The weighted and the unweighted statistics at once, when a model can do
    both for the price of one (the engine needs both under SVI+).
``suffstats_sqnorm(local, x) -> ndarray``
    ‖E_q[t(θ_n)]‖² per record (for the gradient-variance estimate).
``local_elbo(local) -> ndarray``
    E_q[log p(x_n, θ_n | β)] − E_q[log q(θ_n)] per record.
``global_elbo(lam) -> float``
    E_q[log p(β)] − E_q[log q(β)].
``max_step(lam, target) -> list[(names, limits)]``
    For each block of parameters (rows along axis 0 of the named arrays), the
    largest s ≥ 0 such that ``lam + s (target − lam)`` is still inside the
    natural-parameter domain (``inf`` where the whole segment is inside).
``in_domain(lam) -> bool``
    Whether λ is a valid natural parameter of q(β).
``get_params() -> dict``
    The constructor settings as JSON-serialisable values.

For annealing (``streamsvi.inference.annealing``; every model but the
row-wise PMF):

``local_step(lam, x, temperature=1.0)``
    At T ≠ 1 the discrete local factors are tempered, q(z) ∝ exp(log-potential / T)
    (detAVI, seed 002 §3.2). T == 1 runs exactly the untempered code.
``temper(target, T) -> NatParams``
    The λ whose *natural* parameter is θ(target) / T (seed 002 eq. 8), in the
    model's storage convention. A Dirichlet stored as its concentration α has
    natural parameter α − 1 (base measure 1 on the simplex), so
    α_T = 1 + (α − 1)/T (:func:`temper_dirichlet`); each model's docstring says
    which of its arrays use which convention.
``random_init(rng, x, n_total) -> NatParams``
    A fresh draw of the paper's random initialisation (seed 002 §4), η_t of
    stochastic annealing.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, Iterator, Mapping

import numpy as np

from ..settings import ConfigKind, Setting, check_settings


class NatParams(Mapping):
    """Named float64 arrays with ``+``, ``-`` and scalar ``*``.

    Used for natural parameters λ and η and for sums of sufficient statistics,
    so that statistics of two half-batches merge with ``+`` (STYLE.md §6).

    Examples
    --------
    >>> a = NatParams(alpha=[1.0, 2.0])
    >>> b = NatParams(alpha=[0.5, 0.5])
    >>> (a + 2 * b)["alpha"].tolist()
    [2.0, 3.0]
    """

    __slots__ = ("_d", "_flat", "_layout")

    # All arrays live in one contiguous float64 buffer (``_flat``); the named
    # arrays are views into it, made on first access (most results of the
    # engine's arithmetic are never indexed by name). Arithmetic is then one
    # numpy operation on the buffer instead of one per name, which matters
    # because the engine does ~10 of them per update on small arrays.

    def __init__(self, mapping=None, **arrays):
        d = dict(mapping or {}, **arrays)
        arrs = {k: np.asarray(v, dtype=np.float64) for k, v in d.items()}
        layout, off = [], 0
        for k, a in arrs.items():
            layout.append((k, a.shape, off, off + a.size))
            off += a.size
        flat = np.empty(off)
        for (k, shape, lo, hi) in layout:
            flat[lo:hi] = arrs[k].ravel()
        self._set(tuple(layout), flat)

    def _set(self, layout, flat):
        self._layout, self._flat, self._d = layout, flat, None

    def _views(self) -> dict:
        d = self._d
        if d is None:
            flat = self._flat
            d = self._d = {k: flat[lo:hi].reshape(shape) for k, shape, lo, hi in self._layout}
        return d

    @classmethod
    def _wrap(cls, layout, flat) -> "NatParams":
        obj = cls.__new__(cls)
        obj._set(layout, flat)
        return obj

    def __reduce__(self):
        return (NatParams, (dict(self._views()),))

    def __getitem__(self, key):
        d = self._d
        return (self._views() if d is None else d)[key]

    def __iter__(self) -> Iterator[str]:
        return (k for k, _, _, _ in self._layout)

    def __len__(self):
        return len(self._layout)

    def __repr__(self):
        shapes = ", ".join(f"{k}{tuple(v.shape)}" for k, v in self._views().items())
        return f"NatParams({shapes})"

    def _check_keys(self, other):
        if not isinstance(other, NatParams) or (other._layout is not self._layout
                                                and other._layout != self._layout):
            raise TypeError("NatParams operands must have the same names and shapes")

    def __add__(self, other):
        self._check_keys(other)
        return NatParams._wrap(self._layout, self._flat + other._flat)

    def __sub__(self, other):
        self._check_keys(other)
        return NatParams._wrap(self._layout, self._flat - other._flat)

    def __mul__(self, s):
        return NatParams._wrap(self._layout, self._flat * float(s))

    __rmul__ = __mul__

    def copy(self):
        return NatParams._wrap(self._layout, self._flat.copy())

    def sqnorm(self) -> float:
        """Σ of squares over every coordinate."""
        return float(np.dot(self._flat, self._flat))

    def allclose(self, other, rtol=1e-10, atol=0.0) -> bool:
        self._check_keys(other)
        return bool(np.allclose(self._flat, other._flat, rtol=rtol, atol=atol))

    def array_equal(self, other) -> bool:
        self._check_keys(other)
        return bool(np.array_equal(self._flat, other._flat))

    def all_finite(self) -> bool:
        return bool(np.isfinite(self._flat).all())


def check_matrix(x, n_features: int | None, name: str = "x") -> np.ndarray:
    """Coerce ``x`` to a finite 2-D float64 array with ``n_features`` columns."""
    try:
        arr = np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be numeric, got {type(x).__name__}: {exc}") from None
    if arr.ndim == 1 and n_features is not None and arr.shape[0] == n_features:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (records × features), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise ValueError(f"{name} must hold at least one record, got 0")
    if n_features is not None and arr.shape[1] != n_features:
        raise ValueError(f"{name} must have {n_features} features per record, got {arr.shape[1]}")
    if not np.isfinite(arr).all():
        bad = np.flatnonzero(~np.all(np.isfinite(arr), axis=1))
        raise ValueError(f"{name} has non-finite values in records {bad[:10].tolist()}")
    return arr


def segment_limit_positive(cur: np.ndarray, tgt: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Largest s ≥ 0 with ``cur + s (tgt − cur) > floor`` elementwise (inf if always).

    ``cur`` must already be ``> floor``.
    """
    d = tgt - cur
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(d < 0, (floor - cur) / d, np.inf)
    return s


def segment_limit_pd(cur: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """Largest s ≥ 0 with ``cur + s (tgt − cur)`` positive definite, per matrix.

    ``cur`` is a stack (..., p, p) of positive definite matrices. With
    ``cur = L Lᵀ`` the matrix ``cur + s Δ`` is PD iff ``I + s L⁻¹ Δ L⁻ᵀ`` is,
    i.e. iff ``1 + s μ_min > 0`` for the smallest eigenvalue μ_min of
    ``L⁻¹ Δ L⁻ᵀ``. Returns ``−1/μ_min`` (or inf when μ_min ≥ 0).
    """
    L = np.linalg.cholesky(cur)
    Linv = np.linalg.inv(L)
    delta = tgt - cur
    Msym = Linv @ delta @ np.swapaxes(Linv, -1, -2)
    Msym = 0.5 * (Msym + np.swapaxes(Msym, -1, -2))
    mu_min = np.linalg.eigvalsh(Msym)[..., 0]
    with np.errstate(divide="ignore"):
        return np.where(mu_min < 0, -1.0 / mu_min, np.inf)


def temper_dirichlet(conc: np.ndarray, T: float) -> np.ndarray:
    """Concentrations of the Dirichlet whose natural parameter (α − 1) is divided by T.

    ``1 + (α − 1)/T``: inside the domain (> 0) for every α > 0 and T ≥ 1.

    >>> temper_dirichlet(np.array([0.5, 1.0, 5.0]), 2.0).tolist()
    [0.75, 1.0, 3.0]
    """
    return 1.0 + (conc - 1.0) / T


# ---------------------------------------------------------------- the model interface
#
# Code outside ``models/`` asks ``isinstance(model, Tempered)``, not ``hasattr(model,
# "temper")`` (river's ``base/``): a capability is a base class, and a model says what it
# can do by the classes it derives from.

class Tempered:
    """Deterministic annealing: ``local_step(lam, x, temperature=T)`` and :meth:`temper` (module docs)."""

    @abstractmethod
    def temper(self, target: NatParams, T: float) -> NatParams:
        """The λ whose natural parameter is θ(target) / T."""


class RandomRestart:
    """Stochastic annealing: :meth:`random_init`, η_t of the random restart (module docs)."""

    @abstractmethod
    def random_init(self, rng, x, n_total) -> NatParams:
        """A fresh draw of the random initialisation."""


class StartsFromData:
    """A model whose streaming start gathers records first and may fit its prior to them.

    ``start_size(batch_size)`` records are gathered before ``init_params``;
    ``adopt_prior(other)`` takes the prior a snapshot's model decided
    (``prior_pending``, ``fit_prior``).
    """

    @abstractmethod
    def start_size(self, batch_size: int) -> int:
        """How many records the streaming start gathers."""

    @abstractmethod
    def adopt_prior(self, other) -> None:
        """Use the data-decided prior of ``other`` (a snapshot's model)."""


class Classifier:
    """Labelled records: ``predict_proba(lam, X)`` over ``n_classes`` classes."""

    n_classes: int = 2

    @abstractmethod
    def predict_proba(self, lam, X, aux=None):
        """Class probabilities, shape (n, C)."""


class ScoresRecords:
    """A model that says what scoring a record gives: ``score_columns(lam, x[, aux=])``.

    ``score_columns`` returns the scores of a block of records as columns,
    ``{name: column}`` in output order, one entry per record in each column:

    * a 1-D integer or bool array: a JSON integer (boolean) per record;
    * a 1-D float array: a JSON number; NaN means the record has no such key
      (e.g. ``log_density`` of a record given without its label or rating);
    * a 2-D float array: a list of probabilities per record, rounded to 12
      decimals (``rint(v·10¹²)/10¹²``);
    * a list: any JSON value per record (``None``: no such key).

    ``streamsvi.scoring`` writes JSON lines straight from these columns
    (vectorised) and :meth:`score_records` makes the same dicts from them.
    """

    #: keyword options ``score_columns`` takes besides ``aux`` (ratings models: ``("top_k",)``)
    score_options: ClassVar[tuple[str, ...]] = ()
    #: the names of the columns ``score_columns`` can return (``streamsvi score --scores`` picks among them)
    score_column_names: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def score_columns(self, lam, x, *args, **kw) -> dict:
        """The scores of the records ``x`` as columns (see the class docs)."""

    def score_records(self, lam, x, *args, **kw) -> list[dict]:
        """One JSON-ready dict per record: :func:`records_of_columns` of :meth:`score_columns`."""
        return records_of_columns(self.score_columns(lam, x, *args, **kw))


def column_length(columns: Mapping) -> int:
    """The number of records of score columns (0 for no columns)."""
    for v in columns.values():
        return len(v)
    return 0


def rounded_probabilities(P) -> np.ndarray:
    """``rint(P·10¹²)/10¹²``: probabilities as written by scoring (12 decimals, correctly
    rounded division, so the written decimal text reads back as exactly this value)."""
    return np.rint(np.asarray(P, dtype=np.float64) * 1e12) / 1e12


def records_of_columns(columns: Mapping) -> list[dict]:
    """The JSON-ready dict of each record of score columns (:class:`ScoresRecords`).

    >>> records_of_columns({"k": np.array([1, 0]), "p": np.array([[0.25, 0.75], [1.0, 0.0]]),
    ...                     "log_density": np.array([-1.5, np.nan]), "path": [[0, 1], None]})
    [{'k': 1, 'p': [0.25, 0.75], 'log_density': -1.5, 'path': [0, 1]}, {'k': 0, 'p': [1.0, 0.0]}]
    """
    n = column_length(columns)
    names, values, optional = [], [], []
    for name, v in columns.items():
        if isinstance(v, np.ndarray):
            if v.ndim == 2:
                vals, opt = rounded_probabilities(v).tolist(), False
            elif v.dtype.kind == "f":
                vals, opt = v.tolist(), bool(np.isnan(v).any())
                if opt:
                    vals = [None if x != x else x for x in vals]
            else:
                vals, opt = v.tolist(), False
        else:
            vals = list(v)
            opt = any(x is None for x in vals)
        if len(vals) != n:
            raise ValueError(f"score column {name!r} has {len(vals)} values, expected {n}")
        names.append(name)
        values.append(vals)
        optional.append(opt)
    if not any(optional):
        return [dict(zip(names, row)) for row in zip(*values)] if names else [{} for _ in range(n)]
    return [{k: x for k, x in zip(names, row) if x is not None} for row in zip(*values)]


class Mixture:
    """A mixture of components with ``weights``, ``means`` and ``covariances`` of λ (``streamsvi info``)."""

    @abstractmethod
    def weights(self, lam) -> np.ndarray:
        """E_q[π]."""

    @abstractmethod
    def means(self, lam) -> np.ndarray:
        """E_q[μ_k]."""

    @abstractmethod
    def covariances(self, lam) -> np.ndarray:
        """E_q[Σ_k]."""


class StoredScaled:
    """λ stored in another form than the natural parameter: ``dense_params(lam)`` gives λ itself."""

    @abstractmethod
    def dense_params(self, lam) -> NatParams:
        """λ in the dense form."""


class PairedStats:
    """``suffstats_pair(local, x, weights)``: the weighted and the unweighted statistics for the
    price of one (the engine needs both under SVI+)."""

    @abstractmethod
    def suffstats_pair(self, local, x, weights):
        """``(weighted, unweighted)`` sums of statistics."""


class CoordinateLoglik:
    """The gradient path's local expectation gradients use the model's own
    ``loglik_coordinate(w, nodes, x)`` (``streamsvi.models.nonconjugate``)."""

    @abstractmethod
    def loglik_coordinate(self, w, nodes, x):
        """log p(x | w) with one coordinate of w moved to each node."""

    def loglik_coordinate_and_pivot(self, w, nodes, x):
        """``(loglik_coordinate(w, nodes, x), loglik(w[None, :], x)[0])``: LeGrad's work per pivot
        in one call, so that a model can share its pass over the batch between the two. The first
        is a new array the caller may overwrite."""
        return self.loglik_coordinate(w, nodes, x), self.loglik(w[None, :], x)[0]


class RowWise:
    """λ (and ``aux``) grow with the data or are written only where a batch touches them
    (``row_blocks``, or a declared ``global_storage``); the engine steps the touched rows or
    columns only, so its statistics cannot travel as dense deltas yet (scale-out refuses it)."""

    def global_loglik(self, ctx, caches) -> float:
        """The part of E_q[log p(data)] no record of the batch carries, at the old λ (added to the
        ELBO unscaled): 0 unless the model says otherwise (Poisson factorisation: −Σ_u Σ_i
        E[θ_u]ᵀE[β_i] over every pair, from ``caches.totals``)."""
        return 0.0


class ChecksState:
    """A model whose state (λ, aux) has a layout of its own: ``check_state(lam, aux)``
    raises ``ValueError`` when a snapshot's state does not fit the model."""

    @abstractmethod
    def check_state(self, lam, aux) -> None:
        """``ValueError`` naming what does not fit."""


class Model(ABC):
    """What every model declares, next to its code (docs/design.md §3.1).

    Class attributes:

    ``name``
        The model's name in snapshots (``streamsvi.models.MODELS``).
    ``settings``
        Its settings table, ``{argument: Setting}`` (:mod:`streamsvi.settings`):
        type, range or choices, default and a one-line doc of every
        constructor argument. The constructor checks its arguments with
        :meth:`check_settings`; ``service/config.py`` checks the TOML's
        ``[model]`` table with the same table and makes ``--print-config``
        from it.
    ``config_kinds``
        ``{model.kind: ConfigKind}``: the names the TOML's ``model.kind``
        gives this class, each with its preset (``gmm_dp``: the truncated DP
        mixture's defaults, built by :meth:`BayesianGMM.dp_approximation`).
        Empty: not reachable from a config (Python only).
    ``record_kind``
        The name of its record kind (``streamsvi.io.records.KINDS``).
    ``scoring_methods``
        What ``streamsvi.load(...)`` offers with λ filled in.
    ``START_SETTINGS``
        Settings that only shape the initial λ: a snapshot made with other
        values still resumes (``streamsvi.checkpoint.check_compatible``).

    And :meth:`check_cases`, its cases for the shared check suite
    (``tests/models/test_checks.py``; river's ``_unit_test_params``).
    """

    name: ClassVar[str] = "abstract"
    #: How the engine stores and steps λ (``streamsvi.inference``): "dense" (one NatParams,
    #: the blocks of ``param_blocks``), or a storage the model declares ("scaled_columns": LDA).
    global_storage: ClassVar[str] = "dense"
    #: Growing row blocks keyed by id (``streamsvi.models.blocks.RowBlock``): PMF, HPF.
    row_blocks: ClassVar[tuple] = ()
    #: λ's dense blocks (``streamsvi.models.blocks.DenseBlock``: names and family); none for a
    #: model of row blocks or of the gradient path.
    param_blocks: ClassVar[tuple] = ()
    settings: ClassVar[dict[str, Setting]] = {}
    config_kinds: ClassVar[dict[str, ConfigKind]] = {}
    record_kind: ClassVar[str] = "dense"
    scoring_methods: ClassVar[tuple[str, ...]] = ()
    START_SETTINGS: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def get_params(self) -> dict:
        """The constructor settings as JSON-serialisable values."""

    def __repr__(self):
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in self.get_params().items()) + ")"

    @abstractmethod
    def check_batch(self, x):
        """Validate and coerce a minibatch; ``ValueError`` saying what is wrong."""

    @classmethod
    def check_settings(cls, given: Mapping) -> dict:
        """The constructor's arguments ``given``, checked against :attr:`settings`."""
        return check_settings(cls.settings, given)

    @classmethod
    def from_config(cls, kind: str, settings: dict):
        """The model of ``model.kind = kind`` with ``settings`` (checked, keyed by argument name)."""
        build = cls.config_kinds[kind].build
        return (getattr(cls, build) if build else cls)(**settings)

    @classmethod
    def param_size(cls, settings: Mapping) -> int | None:
        """How many float64 values λ holds under the checked ``settings``, known before anything
        is built; None when the settings alone do not fix it (row blocks grow with the data, the
        gradient path's covariance is the engine's setting). A reader refuses a snapshot whose
        settings imply far more than its state file holds (``streamsvi.checkpoint``), so forged
        settings cannot make it allocate."""
        return None

    @classmethod
    def check_cases(cls) -> dict:
        """``{case id: factory}``, each factory returning ``(model, records)`` (the check suite)."""
        return {}

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "annealing_kinds" not in cls.__dict__:
            cls.annealing_kinds = annealing_kinds(cls)


def annealing_kinds(cls) -> tuple:
    """The annealing kinds ``cls`` supports, from its capability types.

    ``none`` and ``svi+`` always (SVI+ reweights the statistics the engine
    blends); ``deterministic`` with :class:`Tempered`, ``stochastic`` with
    :class:`RandomRestart`. ``streamsvi.inference.annealing.supported_kinds``
    reads the result as the class's ``annealing_kinds``.
    """
    kinds = ["none", "svi+"]
    if issubclass(cls, Tempered):
        kinds.append("deterministic")
    if issubclass(cls, RandomRestart):
        kinds.append("stochastic")
    return tuple(kinds)


class ConjugateModel(Model):
    """A conditionally conjugate model, learned by the natural-gradient engine (module docs)."""

    @abstractmethod
    def prior(self) -> NatParams:
        """η."""

    @abstractmethod
    def init_params(self, rng, x, n_total) -> NatParams:
        """A random initial λ."""


class GradientModel(Model):
    """A non-conjugate model, learned by the gradient path (``streamsvi.models.nonconjugate``)."""

    @abstractmethod
    def prior_moments(self):
        """``(m0, v0)`` of the Gaussian prior, or None."""
