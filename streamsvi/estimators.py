"""river-compatible estimators built on the same engine.

Every face turns river's input into records and learns them through one
:class:`streamsvi.learner.StreamLearner`: minibatches of ``batch_size``
records, the daemon's streaming start, then one engine update per minibatch.

:class:`TopicModel` is a ``river.base.MiniBatchTransformer`` for LDA:
documents ``{word: count}`` in, topic proportions out.
:class:`MatrixFactorization` is a river ranker for PMF,
:class:`LogisticRegression` and :class:`SoftmaxRegression` river classifiers.

:class:`GaussianMixture` is a ``river.base.Clusterer``: ``learn_one`` buffers
records and applies an SVI / SVI+ update each time ``batch_size`` of them are
in; ``learn_many`` takes a pandas DataFrame (same batching, same result);
``predict_one`` / ``predict_many`` give the MAP component.

Feature handling: the feature names are fixed by the ``features`` setting,
or else by the keys of the first record (sorted, so key order never
matters). A missing feature is imputed with its running mean (river
``stats.Mean``; 0 before any value is seen); a feature not in the list is
ignored.

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
from functools import partial

import numpy as np
from river import base, stats

from .inference import SVI, EngineState, RobbinsMonro
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


class _Face:
    """What the faces share: a :class:`~streamsvi.learner.StreamLearner` (``_learner``; None
    until the engine is built), which owns the engine, its state, the minibatch buffer, the
    streaming start and the updates. ``_engine``, ``_state`` and ``last_info_`` read it."""

    _learner: StreamLearner | None = None

    def _make_learner(self, engine, make_batch) -> None:
        self._learner = StreamLearner(engine, self.batch_size, make_batch, seed=self.seed)

    @property
    def _engine(self):
        return None if self._learner is None else self._learner.engine

    @_engine.setter
    def _engine(self, engine):
        self._learner.engine = engine

    @property
    def _state(self):
        return None if self._learner is None else self._learner.state

    @_state.setter
    def _state(self, state):
        self._learner.state = state

    @property
    def last_info_(self):
        """``UpdateInfo`` of the last update (no attribute before the first)."""
        info = None if self._learner is None else self._learner.last_info
        if info is None:
            raise AttributeError("last_info_: no update yet")
        return info


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


class GaussianMixture(_Face, base.Clusterer):
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
        _check_batch_sizes(batch_size, effective_batch_size)
        self._annealer = _annealer_of(annealing, batch_size, effective_batch_size)
        self._features = list(features) if features is not None else None
        self._learner = None
        self._means: dict = {}
        if self._features is not None:
            self._build()

    @classmethod
    def _unit_test_params(cls):
        yield {"n_components": 2, "batch_size": 8, "n_total": 200.0, "seed": 0}
        yield {"n_components": 3, "batch_size": 16, "effective_batch_size": 4, "seed": 1}
        yield {"n_components": 2, "batch_size": 8, "seed": 2,
               "annealing": {"kind": "deterministic", "T0": 3.0, "n_steps": 5}}
        yield {"n_components": 2, "batch_size": 8, "seed": 3, "annealing": {"kind": "stochastic", "rho0": 0.5}}
        yield {"n_components": 2, "batch_size": 8, "seed": 4, "init_batches": 1}

    # -------------------------------------------------------------- set-up
    def _build(self):
        D = len(self._features)
        model = BayesianGMM(self.n_components, D, weight_concentration=self.weight_concentration,
                            mean_precision=self.mean_precision,
                            degrees_of_freedom=self.degrees_of_freedom, scale=self.scale,
                            init=self.init, init_batches=self.init_batches)
        self._make_learner(SVI(model, n_total=self.n_total,
                               schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa),
                               effective_batch_size=self.effective_batch_size, short_batches="svi",
                               annealer=self._annealer), _dense)
        self._means = {f: stats.Mean() for f in self._features}

    @classmethod
    def from_snapshot(cls, path, features=None, batch_size: int | None = None) -> "GaussianMixture":
        """A clusterer that starts from a daemon snapshot (``streamsvi.load(path)``).

        ``features`` names the D columns in order (default ``("x0", …)``).
        ``batch_size`` is |S| of the clusterer's updates; by default the
        daemon's own ``inference.batch_size``, stored with the snapshot (32
        for a snapshot written without a daemon config, or M rounded up if
        that is larger). The snapshot's SVI+ setting is kept: M itself, or
        M = ``effective_fraction`` · ``batch_size``; ``batch_size`` must be
        at least M.
        """
        from .scoring import load

        fitted = load(path)
        model = fitted.model
        if not isinstance(model, BayesianGMM):
            raise ValueError(f"snapshot {fitted.path} holds a {model.name!r} model, not a Gaussian mixture")
        p, eng = model.get_params(), fitted.engine_settings
        features = tuple(features) if features is not None else tuple(f"x{i}" for i in range(p["n_features"]))
        if len(features) != p["n_features"]:
            raise ValueError(f"features has {len(features)} names, the snapshot's model has "
                             f"{p['n_features']} features")
        if np.ndim(p["weight_concentration"]) or np.ndim(p["mean"]) or np.ndim(p["scale"] or 1.0):
            raise ValueError("from_snapshot supports models with scalar priors (as the daemon's configs make)")
        M = eng["effective_batch_size"]
        annealing = eng.get("annealer")
        if annealing is not None and annealing.get("kind") == "svi+" and annealing.get("M0") is not None:
            M = annealing["M0"]      # for the default batch_size and its check below
        daemon_S = (fitted.config.get("inference") or {}).get("batch_size")
        if batch_size is None:
            batch_size = daemon_S if daemon_S is not None else max(32, int(np.ceil(M or 0)))
        if eng.get("effective_fraction") is not None:
            M = eng["effective_fraction"] * batch_size
        if M is not None and M > batch_size:
            raise ValueError(
                f"batch_size={batch_size} is smaller than the snapshot's SVI+ effective batch size "
                f"M={M:g}; pass batch_size >= {int(np.ceil(M))}"
                + (f" (the daemon used batch_size={daemon_S})" if daemon_S is not None else "")
                + " or leave it out to use the daemon's")
        sched = eng["schedule"]
        est = cls(n_components=p["n_components"], batch_size=batch_size,
                  effective_batch_size=M if annealing is None else None, n_total=eng["n_total"],
                  annealing=annealing,
                  tau0=sched.get("tau0", 1.0), kappa=sched.get("kappa", 0.7),
                  weight_concentration=p["weight_concentration"], mean_precision=p["mean_precision"],
                  degrees_of_freedom=p["degrees_of_freedom"], scale=p["scale"] if p["scale"] is not None else 1.0,
                  init=p["init"], init_batches=p.get("init_batches", 4), features=features)
        fresh = est._engine.state_from_params(fitted.lam, seed=0)
        est._state = EngineState(fitted.step, fitted.lam, fresh.rng_state, fitted.records_seen)
        return est

    # ------------------------------------------------------------ features
    def _row(self, x: dict, learn: bool) -> np.ndarray:
        if self._features is None:
            self._features = sorted(x)
            self._build()
        row = np.empty(len(self._features))
        for i, f in enumerate(self._features):
            v = x.get(f)
            if v is None:
                row[i] = self._means[f].get()
            else:
                row[i] = float(v)
                if learn:
                    self._means[f].update(row[i])
        return row

    # ------------------------------------------------------------- learning
    def learn_one(self, x: dict) -> None:
        row = self._row(x, learn=True)          # builds the learner on the first record
        self._learner.learn(row)

    def learn_many(self, X) -> None:
        """Learn from a pandas DataFrame (columns = features); same batching as learn_one."""
        for x in X.to_dict(orient="records"):
            self.learn_one(x)

    # ------------------------------------------------------------ predicting
    def predict_one(self, x: dict) -> int:
        if self._state is None:
            return 0
        return int(self._engine.model.predict(self._state.lam, self._row(x, learn=False)[None, :])[0])

    def predict_many(self, X):
        """MAP components of a DataFrame's rows, as a pandas Series."""
        import pandas as pd

        if self._state is None:
            return pd.Series(np.zeros(len(X), dtype=int), index=X.index)
        rows = np.vstack([self._row(x, learn=False) for x in X.to_dict(orient="records")])
        return pd.Series(self._engine.model.predict(self._state.lam, rows), index=X.index)

    def predict_proba_one(self, x: dict) -> dict[int, float]:
        """Responsibilities of each component."""
        if self._state is None:
            return {k: 1.0 / self.n_components for k in range(self.n_components)}
        r = self._engine.model.responsibilities(self._state.lam, self._row(x, learn=False)[None, :])[0]
        return {k: float(v) for k, v in enumerate(r)}

    def score_one(self, x: dict) -> float:
        """Posterior predictive log density of a record."""
        if self._state is None:
            return float("nan")
        return float(self._engine.model.predictive_logpdf(self._state.lam,
                                                          self._row(x, learn=False)[None, :])[0])


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

    def learn_many(self, X) -> None:
        """Learn from a DataFrame of counts (columns = words); same batching as learn_one."""
        for x in X.to_dict(orient="records"):
            self.learn_one(x)

    def _proportions(self, rows):
        K = self.n_components
        out = np.full((len(rows), K), 1.0 / K)
        if self._state is None:
            return out
        keep = [i for i, r in enumerate(rows) if r[0].size]
        if keep:
            out[keep] = self._engine.model.topic_proportions(self._state.lam,
                                                             _docs([rows[i] for i in keep], self.n_features))
        return out

    def transform_one(self, x: dict) -> dict:
        p = self._proportions([self._row(x)])[0]
        return {f"topic_{k}": float(v) for k, v in enumerate(p)}

    def transform_many(self, X):
        """Topic proportions of a DataFrame's rows (columns topic_0 … topic_{K-1})."""
        import pandas as pd

        rows = [self._row(x) for x in X.to_dict(orient="records")]
        return pd.DataFrame(self._proportions(rows), index=X.index,
                            columns=[f"topic_{k}" for k in range(self.n_components)])

    def topics(self) -> np.ndarray | None:
        """E_q[β] (K, V), or None before the first update."""
        return None if self._state is None else self._engine.model.topics(self._state.lam)


# ------------------------------------------------------------------ ratings (PMF)
from river.reco.base import Ranker as _Ranker  # noqa: E402


class MatrixFactorization(_Face, _Ranker):
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
        if isinstance(batch_size, bool):
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size}")
        _check_batch_sizes(batch_size, effective_batch_size)
        _annealer_of(annealing, batch_size, effective_batch_size)
        self._make_learner(self._make_engine(), _ratings)

    def _make_engine(self) -> SVI:
        """The engine of these settings (a function of the constructor arguments only)."""
        from .models import PMF

        model = PMF(n_factors=self.n_factors, sigma2=self.sigma2, prior_var=self.prior_var,
                    biases=self.biases, offset=self.offset, init_scale=self.init_scale,
                    row_counts=self.row_counts, bias_var=self.bias_var, row_clock=self.row_clock,
                    sweep=self.sweep)
        return SVI(model, n_total=self.n_total, schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa),
                   effective_batch_size=self.effective_batch_size, short_batches="svi",
                   annealer=_annealer_of(self.annealing, self.batch_size, self.effective_batch_size))

    # Pickling and copy.deepcopy (river's checks need both): the engine is rebuilt from the
    # settings rather than copied. Its PMF model keeps an id -> row lookup cache that holds a
    # threading.Lock (which cannot be pickled) and is keyed by id() of the state's id lists
    # (meaningless in a copy); learned values live in the learner's state and buffer, which are copied.
    def __getstate__(self):
        learner = copy.copy(self._learner)
        learner.engine = None
        return {**self.__dict__, "_learner": learner}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._learner.engine = self._make_engine()

    @classmethod
    def _unit_test_params(cls):
        yield {"n_factors": 2, "batch_size": 8, "seed": 0}
        yield {"n_factors": 2, "batch_size": 8, "seed": 1,
               "annealing": {"kind": "svi+", "M0": 2.0, "schedule": "linear", "increment": 1.0}}

    @property
    def model(self):
        """The :class:`~streamsvi.models.PMF` being learned."""
        return self._engine.model

    @property
    def state(self):
        """The engine state (None before the first update)."""
        return self._state

    def flush(self) -> None:
        """Apply the buffered ratings as one (possibly short) update."""
        self._learner.flush()

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

    def predict_one(self, user, item, x=None) -> float:
        return float(self._predict([user], [item])[0][0])

    def predict_var_one(self, user, item) -> float:
        """Posterior predictive variance of the rating."""
        return float(self._predict([user], [item])[1][0])

    def rank(self, user, items, x=None) -> list:
        items = list(items)
        if not items:
            return []
        mean = self._predict([user] * len(items), items)[0]
        order = sorted(range(len(items)), key=lambda k: (-mean[k], k))
        return [items[k] for k in order]

    def recommend(self, user, k: int = 10, exclude=()) -> list:
        """The ``k`` best items not rated by ``user`` (in the learned stream) as ``[(item, rating)]``."""
        if self._state is None:
            return []
        return self.model.recommend(self._state.lam, user, k=k, exclude=exclude, aux=self._state.aux)


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
    running mean, an unknown one ignored. With ``standardize`` (default) each
    feature is centred and scaled by its running mean and standard deviation
    (river ``stats.Var``) as it arrives, so the defaults work on raw features.

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
        self._stats: dict = {}
        if self._features is not None:
            self._build()

    @classmethod
    def _unit_test_params(cls):
        yield {"batch_size": 8, "seed": 0}
        yield {"batch_size": 4, "estimator": "regrad", "optimizer": "adam", "learning_rate": 0.05, "seed": 1}

    @property
    def _multiclass(self):
        return False

    @property
    def _is_stochastic(self):
        return True

    def _build(self):
        from .inference.gradients import GradientVI
        from .models.logistic import BayesianLogisticRegression

        model = BayesianLogisticRegression(n_features=len(self._features), prior_var=self.prior_var)
        self._make_learner(GradientVI(model, n_total=self.n_total, estimator=self.estimator,
                                      optimizer=self.optimizer, learning_rate=self.learning_rate,
                                      schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa)), _dense)
        self._stats = {f: stats.Var() for f in self._features}

    def _row(self, x: dict, learn: bool) -> np.ndarray:
        if self._features is None:
            self._features = sorted(x)
            self._build()
        row = np.empty(len(self._features))
        for i, f in enumerate(self._features):
            v, st = x.get(f), self._stats[f]
            if v is not None:
                v = float(v)
                if learn and np.isfinite(v):
                    st.update(v)
            mean = st.mean.get()
            if v is None or not np.isfinite(v):
                v = mean
            if self.standardize:
                sd = float(np.sqrt(st.get())) if st.mean.n > 1 else 0.0
                v = (v - mean) / sd if sd > 0 else v - mean
            row[i] = v
        return row

    @staticmethod
    def _label(y) -> float:
        if isinstance(y, (bool, np.bool_)) or y in (0, 1):
            return float(bool(y))
        raise ValueError(f"LogisticRegression is binary: labels must be bools (or 0 / 1), got {y!r}")

    def learn_one(self, x: dict, y) -> None:
        label = self._label(y)
        row = self._row(x, learn=True)          # builds the learner on the first record
        self._learner.learn(np.append(row, label))

    def learn_many(self, X, y) -> None:
        """Learn from a DataFrame and a Series of labels; same batching as learn_one."""
        for x, yi in zip(X.to_dict(orient="records"), y.tolist()):
            self.learn_one(x, yi)

    def _p1(self, rows: np.ndarray) -> np.ndarray:
        if self._state is None:
            return np.full(rows.shape[0], 0.5)
        return self._engine.model.predict_proba(self._state.lam, rows)

    def predict_proba_one(self, x: dict) -> dict:
        if self._features is None:
            return {False: 0.5, True: 0.5}
        p = float(self._p1(self._row(x, learn=False)[None, :])[0])
        return {False: 1.0 - p, True: p}

    def predict_proba_many(self, X):
        """A DataFrame with columns False and True."""
        import pandas as pd

        if self._features is None:
            p = np.full(len(X), 0.5)
        else:
            p = self._p1(np.vstack([self._row(x, learn=False) for x in X.to_dict(orient="records")]))
        return pd.DataFrame({False: 1.0 - p, True: p}, index=X.index)

    def predict_many(self, X):
        import pandas as pd

        proba = self.predict_proba_many(X)
        return pd.Series(proba[True].to_numpy() > 0.5, index=X.index)

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

    def _engine_for(self, n_classes: int):
        from .inference.gradients import GradientVI
        from .models.logistic import SoftmaxRegression as _Model

        model = _Model(n_features=len(self._features), n_classes=n_classes, prior_var=self.prior_var)
        return GradientVI(model, n_total=self.n_total, estimator=self.estimator, optimizer=self.optimizer,
                          learning_rate=self.learning_rate, schedule=RobbinsMonro(tau0=self.tau0, kappa=self.kappa))

    def _build(self):
        self._make_learner(self._engine_for(max(2, len(self._classes))), _dense)
        self._stats = {f: stats.Var() for f in self._features}

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

    def _proba_rows(self, rows: np.ndarray) -> np.ndarray:
        k = len(self._classes)
        if self._state is None:
            return np.full((rows.shape[0], k), 1.0 / max(k, 1))
        p = self._engine.model.predict_proba(self._state.lam, rows)[:, :k]
        return p / p.sum(axis=1, keepdims=True)

    def predict_proba_one(self, x: dict) -> dict:
        if self._features is None or not self._classes:
            return {c: 1.0 / len(self._classes) for c in self._classes}
        p = self._proba_rows(self._row(x, learn=False)[None, :])[0]
        return {c: float(v) for c, v in zip(self._classes, p)}

    def predict_proba_many(self, X):
        """A DataFrame with one column per class seen."""
        import pandas as pd

        if self._features is None or not self._classes:
            k = len(self._classes)
            return pd.DataFrame({c: np.full(len(X), 1.0 / k) for c in self._classes}, index=X.index)
        p = self._proba_rows(np.vstack([self._row(x, learn=False) for x in X.to_dict(orient="records")]))
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
