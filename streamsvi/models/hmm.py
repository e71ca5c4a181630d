"""Discrete-emission hidden Markov model with Dirichlet priors (seed 002 §4.2).

Generative model for each sequence x_1..x_L (symbols in 0..V−1)::

    π ~ Dirichlet(a0)                      a0: ``init_concentration`` (K,)
    A_k ~ Dirichlet(b0_k)   k = 1..K       b0: ``transition_concentration`` (K, K)
    B_k ~ Dirichlet(e0_k)   k = 1..K       e0: ``emission_concentration`` (K, V)
    z_1 ~ Categorical(π),  z_t | z_{t−1} ~ Categorical(A_{z_{t−1}})
    x_t | z_t ~ Categorical(B_{z_t})

Mean-field family (seed 002): q(π) ∏_k q(A_k) q(B_k), all Dirichlet, and
q(z_{1:L}) a Markov chain per sequence (no further factorisation). The local
step is forward–backward with the sub-normalised parameters
π̃ = exp E_q[log π], Ã = exp E_q[log A], B̃ = exp E_q[log B] (Beal 2003 ch. 3;
MacKay 1997), which gives the optimal q(z) and its marginals.

Natural parameters (the names of the arrays in λ; Dirichlet concentrations)::

    init  (K,)     α^π_k   = a0_k    + Σ_n E_q[z_{n,1} = k]
    trans (K, K)   α^A_kj  = b0_kj   + Σ_n Σ_t E_q[z_{n,t} = k, z_{n,t+1} = j]
    emit  (K, V)   α^B_kv  = e0_kv   + Σ_n Σ_t E_q[z_{n,t} = k] [x_{n,t} = v]

so CAVI is ``λ = η + Σ_n E_q[t(z_n, x_n)]`` (seed 002 eq. 15). The domain is
every concentration > 0.

Local ELBO. For one sequence, the log normaliser of the forward pass with the
sub-normalised parameters, log Z̃_n = log Σ_z exp E_q[log p(x_n, z | β)],
equals E_q[log p(x_n, z_n | β)] − E_q[log q(z_n)] at the optimal q(z_n).
The global term is −KL(q(π)‖p(π)) − Σ_k KL(q(A_k)‖p(A_k)) − Σ_k KL(q(B_k)‖p(B_k)).

Vectorisation. The sequences of a minibatch are sorted by decreasing length
and laid out time-major in a padded (T, n) array; at time t the sequences
still running are a prefix of that order, so the loops run over time only and
each step is one (n_t, K) × (K, K) product on exactly the live sequences.
The forward pass is scaled (Rabiner 1989): α̂_t sums to one, c_t is its
normaliser and log Z̃ = Σ_t log c_t (plus the constants taken out of the
exponentiated parameters to avoid underflow).

Scoring (posterior mean = plug-in E_q[π], E_q[A], E_q[B]):
:meth:`DiscreteHMM.log_likelihood` (log p(x | E_q[β])),
:meth:`DiscreteHMM.predictive_logpdf` (the variational predictive
log E_q[p(x | β)], a Monte-Carlo estimate), :meth:`DiscreteHMM.elbo_bound`
(log Z̃, a lower bound on both), :meth:`DiscreteHMM.filtering`
(p(z_t | x_1..x_t)) and :meth:`DiscreteHMM.viterbi` (the most probable path).

Examples
--------
>>> import numpy as np
>>> from streamsvi.sequence_batch import Sequences
>>> rng = np.random.default_rng(0)
>>> A = np.array([[0.9, 0.1], [0.1, 0.9]]); B = np.array([[0.8, 0.2, 0.0], [0.0, 0.2, 0.8]])
>>> x = sample_hmm(np.array([0.5, 0.5]), A, B, lengths=[30] * 100, rng=rng)[0]
>>> model = DiscreteHMM(n_states=2, n_symbols=3)
>>> lam = model.init_params(rng, x, n_total=len(x))
>>> for _ in range(50):   # batch VI (CAVI)
...     lam = model.prior() + model.suffstats(model.local_step(lam, x), x)
>>> pi, A_hat, B_hat = model.mean_params(lam)
>>> np.round(np.sort(np.diag(A_hat)), 1).tolist()
[0.9, 0.9]
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import digamma, gammaln, logsumexp

from ..sequence_batch import Sequences
from ..settings import ConfigKind, Setting
from .base import (ConjugateModel, NatParams, PairedStats, RandomRestart, ScoresRecords, Tempered,
                   segment_limit_positive, temper_dirichlet)
from functools import cached_property

from .base import NatParams
from .blocks import DenseBlock, Dirichlet, blocks_in_domain, blocks_max_step, blocks_temper

__all__ = ["DiscreteHMM", "HMMLocal", "sample_hmm"]


def sample_hmm(pi, A, B, lengths, rng) -> tuple[Sequences, Sequences]:
    """Draw sequences of the given lengths from an HMM; returns (symbols, states).

    Examples
    --------
    >>> x, z = sample_hmm([1.0, 0.0], [[0.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]],
    ...                   [4, 2], np.random.default_rng(0))
    >>> x.to_list(), z.to_list()
    ([[0, 1, 0, 1], [0, 1]], [[0, 1, 0, 1], [0, 1]])
    """
    pi, A, B = (np.asarray(v, float) for v in (pi, A, B))
    lengths = np.asarray(lengths, dtype=np.int64)
    n, T = lengths.size, int(lengths.max())
    K, V = B.shape
    z = np.empty((n, T), dtype=np.int64)
    xs = np.empty((n, T), dtype=np.int64)
    cA, cB = np.cumsum(A, axis=1), np.cumsum(B, axis=1)
    z[:, 0] = np.minimum(np.searchsorted(np.cumsum(pi), rng.uniform(size=n), side="right"), K - 1)
    for t in range(1, T):
        u = rng.uniform(size=n)
        z[:, t] = np.minimum((cA[z[:, t - 1]] <= u[:, None]).sum(axis=1), K - 1)
    u = rng.uniform(size=(n, T))
    xs[:] = np.minimum((cB[z] <= u[..., None]).sum(axis=2), V - 1)
    keep = np.arange(T)[None, :] < lengths[:, None]
    return (Sequences.from_lengths(xs[keep], lengths), Sequences.from_lengths(z[keep], lengths))


@dataclass(frozen=True)
class _Layout:
    """A minibatch sorted by decreasing length, time-major and padded.

    ``order`` maps sorted position → original index; ``lens`` (n,) sorted
    lengths; ``sym`` (T, n) symbols (0 where padded); ``n_act`` (T,) how many
    sequences are still running at each t (a prefix); ``valid`` (T, n).
    """

    order: np.ndarray
    lens: np.ndarray
    sym: np.ndarray
    n_act: np.ndarray
    valid: np.ndarray

    @classmethod
    def of(cls, x: Sequences) -> "_Layout":
        lens = x.lengths
        order = np.argsort(-lens, kind="stable")
        xs = x[order]
        lens_s = lens[order]
        n, T = lens_s.size, int(lens_s[0])
        sym = np.zeros((T, n), dtype=np.int64)
        col = np.repeat(np.arange(n), lens_s)
        t_idx = np.arange(xs.symbols.size) - np.repeat(xs.offsets[:-1], lens_s)
        sym[t_idx, col] = xs.symbols
        n_act = np.searchsorted(-lens_s, -np.arange(T), side="left")
        valid = np.arange(T)[:, None] < lens_s[None, :]
        return cls(order, lens_s, sym, n_act, valid)

    def unsort(self, v: np.ndarray) -> np.ndarray:
        out = np.empty_like(v)
        out[self.order] = v
        return out


@dataclass(frozen=True)
class HMMLocal:
    """Local factors q(z_n) of a minibatch, as scaled forward–backward quantities.

    All arrays are in the layout's sorted, time-major order (T, n, ...).
    ``alpha`` α̂_t (zero where padded), ``beta`` β̂_t (one where padded),
    ``u`` the messages u_t = B̃(x_t) ⊙ β̂_t / c_t (zero where padded) so that
    E[z_t = i, z_{t+1} = j] = α̂_t(i) Ã_ij u_{t+1}(j); ``A_tilde`` Ã (as
    exponentiated); ``log_norm`` log Z̃_n per sequence in the original order.
    """

    layout: _Layout
    alpha: np.ndarray
    beta: np.ndarray
    u: np.ndarray
    A_tilde: np.ndarray
    log_norm: np.ndarray

    @property
    def gamma(self) -> np.ndarray:
        """E_q[z_t = k], (T, n, K), zero where padded."""
        return self.alpha * self.beta


def _as_conc(value, shape, name):
    a = np.asarray(value, float)
    a = np.full(shape, float(a)) if a.ndim == 0 else np.broadcast_to(a, shape).copy() \
        if a.ndim < len(shape) and a.shape == shape[-a.ndim:] else a
    if a.shape != shape or not np.all(np.isfinite(a)) or not np.all(a > 0):
        raise ValueError(f"{name} must be > 0 (a number or an array of shape {shape}), got {value}")
    return a


def _dirichlet_kl(a, b):
    """KL(Dir(a) ‖ Dir(b)) along the last axis."""
    a0 = a.sum(axis=-1)
    return (gammaln(a0) - gammaln(a).sum(axis=-1) - gammaln(b.sum(axis=-1)) + gammaln(b).sum(axis=-1)
            + ((a - b) * (digamma(a) - digamma(a0)[..., None])).sum(axis=-1))


def _e_log(a):
    """E[log θ] under Dir(a), along the last axis."""
    return digamma(a) - digamma(a.sum(axis=-1, keepdims=True))


class DiscreteHMM(ConjugateModel, Tempered, RandomRestart, ScoresRecords, PairedStats):
    """K-state hidden Markov model with categorical emissions over V symbols.

    Parameters
    ----------
    n_states : int
        K.
    n_symbols : int
        V, the alphabet size; symbols are the integers 0..V−1.
    init_concentration : float or (K,) array, optional
        a0, Dirichlet prior of the initial distribution π. Default 1/K (seed 002).
    transition_concentration : float, (K,) or (K, K) array, optional
        b0, Dirichlet prior of each transition row A_k (a (K,) array is used
        for every row). Default 1/K (seed 002).
    emission_concentration : float, (V,) or (K, V) array, optional
        e0, Dirichlet prior of each emission row B_k. Default 10/V (seed 002).
    init : {"dirichlet", "random_resp"}
        How :meth:`init_params` starts: seed 002's "uniform Dirichlet random
        vector scaled up to the data size" for every q factor, or the
        statistics of random soft state assignments of the given records.
    predictive_draws : int
        S, the number of draws from q(β) in :meth:`predictive_logpdf`.
    """

    name = "hmm"
    record_kind = "sequences"
    config_kinds = {"hmm": ConfigKind("discrete hidden Markov model on symbol sequences")}
    settings = {
        "n_states": Setting("int", 5, "K, the hidden states", low=1, config_name="n_components",
                            required=True),
        "n_symbols": Setting("int", 4, "V, the alphabet size: symbols are 0..V-1", low=1, required=True),
        "init_concentration": Setting("numbers", None, "Dirichlet prior of the initial state "
                                      "distribution; unset = 1/K", low=0, low_open=True),
        "transition_concentration": Setting("numbers", None, "Dirichlet prior of each transition row; "
                                            "unset = 1/K", low=0, low_open=True),
        "emission_concentration": Setting("numbers", None, "Dirichlet prior of each emission row; "
                                          "unset = 10/V", low=0, low_open=True),
        "init": Setting("str", "dirichlet", "the start: dirichlet (seed 002's scaled random Dirichlet "
                        "vectors) or random_resp (random soft state assignments of the records)",
                        choices=("dirichlet", "random_resp")),
        "predictive_draws": Setting("int", 100, "draws from q for the held-out variational predictive",
                                    low=1),
    }
    #: what ``streamsvi.load(...)`` offers with λ filled in (``fitted.viterbi(x)``, ...)
    score_column_names = ("log_likelihood", "log_predictive", "viterbi")
    scoring_methods = ("log_likelihood", "predictive_logpdf", "elbo_bound", "filtering", "viterbi",
                       "mean_params")

    #: Settings that only shape the initial λ (``init_params``): a snapshot made with
    #: other values still resumes (``streamsvi.checkpoint.check_compatible``).
    START_SETTINGS = ("init",)

    @classmethod
    def param_size(cls, settings) -> int:
        """λ's size from the settings (``Model.param_size``)."""
        K, V = int(settings["n_states"]), int(settings["n_symbols"])
        return K + K * K + K * V                    # init, trans, emit

    @classmethod
    def check_cases(cls) -> dict:
        """The check suite's case: a synthetic 3-state HMM over 4 symbols, 300 sequences of 3..9."""
        def hmm():
            rng = np.random.default_rng(8)
            A = np.array([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.2, 0.1, 0.7]])
            B = np.array([[0.7, 0.2, 0.05, 0.05], [0.05, 0.7, 0.2, 0.05], [0.05, 0.05, 0.3, 0.6]])
            X, _ = sample_hmm([0.5, 0.3, 0.2], A, B, rng.integers(3, 10, size=300), rng)
            return cls(n_states=3, n_symbols=4, emission_concentration=0.5), X
        return {"hmm": hmm}

    def __init__(self, n_states=5, n_symbols=4, init_concentration=None,
                 transition_concentration=None, emission_concentration=None, init="dirichlet",
                 predictive_draws=100):
        p = self.check_settings({k: v for k, v in locals().items() if k in self.settings})
        K, V = p["n_states"], p["n_symbols"]
        self.n_states, self.n_symbols = K, V
        self.init_concentration = init_concentration
        self.transition_concentration = transition_concentration
        self.emission_concentration = emission_concentration
        self.init = init
        self.predictive_draws = int(predictive_draws)
        self._a0 = _as_conc(1.0 / K if init_concentration is None else init_concentration,
                            (K,), "init_concentration")
        self._b0 = _as_conc(1.0 / K if transition_concentration is None else transition_concentration,
                            (K, K), "transition_concentration")
        self._e0 = _as_conc(10.0 / V if emission_concentration is None else emission_concentration,
                            (K, V), "emission_concentration")
        self._prior = NatParams(init=self._a0, trans=self._b0, emit=self._e0)
        self._cache = None

    # ------------------------------------------------------------ settings
    def get_params(self) -> dict:
        def j(v):
            return np.asarray(v).tolist() if v is not None and not np.isscalar(v) else v
        return {"n_states": self.n_states, "n_symbols": self.n_symbols,
                "init_concentration": j(self.init_concentration),
                "transition_concentration": j(self.transition_concentration),
                "emission_concentration": j(self.emission_concentration),
                "init": self.init, "predictive_draws": self.predictive_draws}

    def prior(self) -> NatParams:
        """η (shared object: treat as read-only)."""
        return self._prior

    def check_batch(self, x) -> Sequences:
        """A :class:`Sequences` of ≥ 1 non-empty sequences with symbols in 0..V−1.

        Accepts a :class:`Sequences` or a list of integer sequences.
        """
        if not isinstance(x, Sequences):
            try:
                x = Sequences.from_list(x)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"x must be a Sequences or a list of integer sequences: {exc}") from None
        if len(x) == 0:
            raise ValueError("x must hold at least one sequence, got 0")
        lens = x.lengths
        if np.any(lens == 0):
            raise ValueError(f"x has empty sequences at {np.flatnonzero(lens == 0)[:10].tolist()}")
        s = x.symbols
        if s.min() < 0 or s.max() >= self.n_symbols:
            bad = np.flatnonzero((s < 0) | (s >= self.n_symbols))
            seq = np.searchsorted(x.offsets, bad[:10], side="right") - 1
            raise ValueError(f"x has symbols outside 0..{self.n_symbols - 1} (n_symbols="
                             f"{self.n_symbols}): {s[bad[:10]].tolist()} in sequences {seq.tolist()}")
        return x

    # ---------------------------------------------------------------- init
    def init_params(self, rng: np.random.Generator, x, n_total) -> NatParams:
        """A random initial λ scaled to ``n_total`` sequences like ``x``.

        ``init="dirichlet"``: every q row is η + s·u, u ~ Dirichlet(1, …, 1),
        with s the expected number of counts of that row in a data set of
        ``n_total`` sequences of the mean length of ``x`` (seed 002 §4.2).
        ``init="random_resp"``: λ = η + (n_total/|x|) Σ_n t(x_n, r_n) for
        random soft state assignments r_{n,t} (pair counts r_t r_{t+1}ᵀ).
        """
        x = self.check_batch(x)
        K, V = self.n_states, self.n_symbols
        n = len(x)
        if self.init == "dirichlet":
            return self.random_init(rng, x, n_total)
        r = rng.uniform(size=(x.n_symbols_total, K))
        r /= r.sum(axis=1, keepdims=True)
        starts = x.offsets[:-1]
        nxt = np.ones(x.n_symbols_total, dtype=bool)
        nxt[x.offsets[1:] - 1] = False                    # positions with a successor
        pos = np.flatnonzero(nxt)
        emit = np.zeros((K, V))
        for k in range(K):
            emit[k] = np.bincount(x.symbols, weights=r[:, k], minlength=V)
        stats = NatParams(init=r[starts].sum(axis=0), trans=r[pos].T @ r[pos + 1], emit=emit)
        return self.prior() + stats * (n_total / n)

    def random_init(self, rng: np.random.Generator, x, n_total) -> NatParams:
        """Seed 002 §4.2: every q row η + s·u, u ~ Dirichlet(1, …, 1) (``init="dirichlet"``).

        s is the expected number of counts of that row in a data set of
        ``n_total`` sequences of the mean length of ``x``. Also η_t of
        stochastic annealing, whatever ``init`` is.
        """
        x = self.check_batch(x)
        K, V = self.n_states, self.n_symbols
        mean_len = x.n_symbols_total / len(x)
        return NatParams(
            init=self._a0 + n_total * rng.dirichlet(np.ones(K)),
            trans=self._b0 + n_total * max(mean_len - 1.0, 1.0) / K * rng.dirichlet(np.ones(K), size=K),
            emit=self._e0 + n_total * mean_len / K * rng.dirichlet(np.ones(V), size=K))

    @cached_property
    def param_blocks(self) -> tuple:
        """λ's blocks (``streamsvi.models.blocks``): q(π), each row of q(A) and of q(B), Dirichlets."""
        return tuple(DenseBlock((k,), Dirichlet(per="row")) for k in ("init", "trans", "emit"))

    def temper(self, target: NatParams, T: float) -> NatParams:
        """Natural parameter ÷ T (seed 002 eq. 8): all three arrays are Dirichlet
        concentrations α (natural parameter α − 1), so α_T = 1 + (α − 1)/T."""
        return blocks_temper(self.param_blocks, target, T)

    # ---------------------------------------------------------- local step
    def _expectations(self, lam: NatParams) -> dict:
        """E_q[log π], E_q[log A], E_q[log B] for λ (cached for the last λ seen)."""
        cache = self._cache
        if cache is not None and cache[0] is lam:
            return cache[1]
        ex = {"log_pi": _e_log(lam["init"]), "log_A": _e_log(lam["trans"]), "log_B": _e_log(lam["emit"])}
        self._cache = (lam, ex)
        return ex

    @staticmethod
    def _forward_backward(log_pi, log_A, log_B, lay: _Layout, backward=True):
        """Scaled forward(–backward) on the layout with (possibly sub-normalised) log parameters.

        Returns (alpha, beta, u, A_tilde, log_norm_sorted); beta and u are
        None without ``backward``.
        """
        T, n = lay.sym.shape
        K = log_pi.size
        s0, sA = log_pi.max(), log_A.max()
        sB = log_B.max(axis=0)                            # (V,) per-symbol shift
        pi_t = np.exp(log_pi - s0)
        A_t = np.exp(log_A - sA)
        Bt = np.exp(log_B - sB).T                        # (V, K)
        Bx = Bt[lay.sym]                                  # (T, n, K)
        # in-place numpy calls on contiguous row blocks: the loop is overhead-bound for small n
        ones = np.ones(K)
        alpha = np.zeros((T, n, K))
        c = np.ones((T, n))
        np.multiply(pi_t, Bx[0], out=alpha[0])
        np.dot(alpha[0], ones, out=c[0])
        alpha[0] /= c[0][:, None]
        n_act = lay.n_act
        for t in range(1, T):
            m = n_act[t]
            at = alpha[t, :m]
            np.dot(alpha[t - 1, :m], A_t, out=at)
            at *= Bx[t, :m]
            ct = c[t, :m]
            np.dot(at, ones, out=ct)
            at /= ct[:, None]
        log_norm = (np.log(c).sum(axis=0) + s0 + (lay.lens - 1) * sA
                    + (sB[lay.sym] * lay.valid).sum(axis=0))
        if not backward:
            return alpha, None, None, A_t, log_norm
        beta = np.ones((T, n, K))
        u = np.zeros((T, n, K))
        A_tT = np.ascontiguousarray(A_t.T)
        inv_c = 1.0 / c
        for t in range(T - 1, 0, -1):
            m = n_act[t]
            ut = u[t, :m]
            np.multiply(Bx[t, :m], beta[t, :m], out=ut)
            ut *= inv_c[t, :m, None]
            np.dot(ut, A_tT, out=beta[t - 1, :m])
        return alpha, beta, u, A_t, log_norm

    def local_step(self, lam: NatParams, x, temperature=1.0) -> HMMLocal:
        """Forward–backward with exp E_q[log π], exp E_q[log A], exp E_q[log B].

        At ``temperature`` T ≠ 1 the potentials are raised to 1/T (detAVI:
        q(z) ∝ exp(E_q[log p(x, z | β)] / T)), and ``log_norm`` is T log Z̃_T,
        the tempered local objective at its optimum (the ELBO term only at T = 1).
        """
        x = x if isinstance(x, Sequences) else self.check_batch(x)
        ex = self._expectations(lam)
        lay = _Layout.of(x)
        if temperature != 1.0:
            inv = 1.0 / temperature
            alpha, beta, u, A_t, log_norm = self._forward_backward(
                ex["log_pi"] * inv, ex["log_A"] * inv, ex["log_B"] * inv, lay)
            log_norm = log_norm * temperature
        else:
            alpha, beta, u, A_t, log_norm = self._forward_backward(ex["log_pi"], ex["log_A"],
                                                                   ex["log_B"], lay)
        return HMMLocal(lay, alpha, beta, u, A_t, lay.unsort(log_norm))

    # ------------------------------------------------- sufficient statistics
    def _stats(self, local: HMMLocal, W: np.ndarray) -> list[NatParams]:
        """Σ_n w_n E_q[t(z_n, x_n)] for each row of weights W (J, n) (sorted order)."""
        lay = local.layout
        K, V = self.n_states, self.n_symbols
        T, n = lay.sym.shape
        J = W.shape[0]
        gamma = local.gamma
        init = W @ gamma[0]                               # (J, K)
        if T > 1:
            a = local.alpha[:-1].reshape(-1, K)
            uu = local.u[1:].reshape(-1, K)
            Wr = np.tile(W, (1, T - 1))                  # weight of each (t, n) row
            pair = np.stack([(a * Wr[j][:, None]).T @ uu for j in range(J)]) * local.A_tilde
        else:
            pair = np.zeros((J, K, K))
        idx = (lay.sym[..., None] * K + np.arange(K)).ravel()
        idx = (idx[None, :] + (V * K) * np.arange(J)[:, None]).ravel()
        gw = (gamma[None] * W[:, None, :, None]).ravel()
        emit = np.bincount(idx, weights=gw, minlength=J * V * K).reshape(J, V, K)
        return [NatParams(init=init[j], trans=pair[j], emit=emit[j].T) for j in range(J)]

    def _sorted_weights(self, local, weights):
        return np.asarray(weights, float)[local.layout.order]

    def suffstats(self, local: HMMLocal, x, weights=None) -> NatParams:
        n = local.layout.order.size
        w = np.ones(n) if weights is None else self._sorted_weights(local, weights)
        return self._stats(local, w[None, :])[0]

    def suffstats_pair(self, local: HMMLocal, x, weights):
        """(weighted, unweighted) statistics in one pass."""
        w = self._sorted_weights(local, weights)
        sw, s = self._stats(local, np.stack([w, np.ones_like(w)]))
        return sw, s

    def suffstats_sqnorm(self, local: HMMLocal, x) -> np.ndarray:
        """‖E_q[t(z_n, x_n)]‖² per sequence (original order)."""
        lay = local.layout
        K, V = self.n_states, self.n_symbols
        T, n = lay.sym.shape
        gamma = local.gamma
        sq = (gamma[0] ** 2).sum(axis=1)
        if T > 1:
            P = np.matmul(local.alpha[:-1].transpose(1, 2, 0), local.u[1:].transpose(1, 0, 2))
            P *= local.A_tilde
            sq += (P * P).sum(axis=(1, 2))
        idx = ((np.arange(n)[None, :, None] * V + lay.sym[..., None]) * K + np.arange(K)).ravel()
        E = np.bincount(idx, weights=gamma.ravel(), minlength=n * V * K)
        sq += (E.reshape(n, V * K) ** 2).sum(axis=1)
        return lay.unsort(sq)

    # ---------------------------------------------------------------- ELBO
    def local_elbo(self, local: HMMLocal) -> np.ndarray:
        """log Z̃_n = E_q[log p(x_n, z_n | β)] − E_q[log q(z_n)] per sequence."""
        return local.log_norm

    def global_elbo(self, lam: NatParams) -> float:
        """−KL(q(π)‖p(π)) − Σ_k KL(q(A_k)‖p(A_k)) − Σ_k KL(q(B_k)‖p(B_k))."""
        return float(-_dirichlet_kl(lam["init"], self._a0)
                     - _dirichlet_kl(lam["trans"], self._b0).sum()
                     - _dirichlet_kl(lam["emit"], self._e0).sum())

    # -------------------------------------------------------------- domain
    def in_domain(self, lam: NatParams) -> bool:
        """True when every Dirichlet concentration is finite and > 0."""
        return blocks_in_domain(self.param_blocks, lam)

    def max_step(self, lam: NatParams, target: NatParams):
        """One block per Dirichlet factor: q(π) (a scalar limit), each q(A_k), each q(B_k)."""
        return blocks_max_step(self.param_blocks, lam, target)

    # ------------------------------------------------------------- scoring
    def mean_params(self, lam: NatParams):
        """(E_q[π], E_q[A], E_q[B]): the posterior mean parameters."""
        return (lam["init"] / lam["init"].sum(), lam["trans"] / lam["trans"].sum(axis=1, keepdims=True),
                lam["emit"] / lam["emit"].sum(axis=1, keepdims=True))

    def _plugin(self, lam, x, backward=False):
        x = self.check_batch(x)
        pi, A, B = self.mean_params(lam)
        lay = _Layout.of(x)
        return lay, self._forward_backward(np.log(pi), np.log(A), np.log(B), lay, backward=backward)

    def log_likelihood(self, lam: NatParams, x) -> np.ndarray:
        """log p(x_n | E_q[π], E_q[A], E_q[B]) per sequence (posterior-mean plug-in)."""
        lay, fb = self._plugin(lam, x)
        return lay.unsort(fb[4])

    def elbo_bound(self, lam: NatParams, x) -> np.ndarray:
        """log Z̃_n, the local ELBO: a lower bound on E_q[log p(x_n | β)] ≤ log E_q[p(x_n | β)]."""
        return self.local_step(lam, self.check_batch(x)).log_norm

    def predictive_logpdf(self, lam: NatParams, x, n_draws: int | None = None, seed: int = 0) -> np.ndarray:
        """The variational predictive log E_q[p(x_n | π, A, B)] per sequence (Monte Carlo).

        log (1/S) Σ_s p(x_n | β_s) with S = ``n_draws`` (default
        ``predictive_draws``) draws β_s ~ q from a fixed ``seed``, so the value
        is deterministic. It is a consistent estimate whose bias is downward
        (Jensen) and shrinks as q concentrates; its exact value is a sum over
        all K^L state paths of products of Dirichlet moments, which only tiny
        cases can afford (the tests do).
        """
        x = self.check_batch(x)
        S = self.predictive_draws if n_draws is None else int(n_draws)
        rng = np.random.default_rng(seed)
        K = self.n_states

        def draw(conc):                                   # Dirichlet rows via Gamma draws
            g = rng.standard_gamma(np.broadcast_to(conc, (S,) + conc.shape))
            return np.maximum(g, 1e-300) / np.maximum(g.sum(axis=-1, keepdims=True), 1e-300)

        pi, A, B = draw(lam["init"]), draw(lam["trans"]), draw(lam["emit"])
        AT = np.ascontiguousarray(np.swapaxes(A, 1, 2))   # (S, K, K): new_j = Σ_k A_kj a_k
        lay = _Layout.of(x)
        T, n = lay.sym.shape
        out = np.empty(n)
        chunk = max(1, int(2_000_000 // (S * K)))
        for lo in range(0, n, chunk):                     # state-major (S, K, m): sums over K are fast
            hi = min(n, lo + chunk)
            sym = lay.sym[:, lo:hi]
            n_act = np.clip(lay.n_act - lo, 0, hi - lo)
            a = pi[:, :, None] * np.take(B, sym[0], axis=2)
            c = a.sum(axis=1)
            a /= c[:, None, :]
            logc = np.log(c)
            for t in range(1, T):
                m = n_act[t]
                if m == 0:
                    break
                at = np.matmul(AT, a[:, :, :m]) * np.take(B, sym[t, :m], axis=2)
                ct = at.sum(axis=1)
                a[:, :, :m] = at / ct[:, None, :]
                logc[:, :m] += np.log(ct)
            out[lo:hi] = logsumexp(logc, axis=0) - np.log(S)
        return lay.unsort(out)

    def filtering(self, lam: NatParams, x) -> list[np.ndarray]:
        """p(z_t | x_1..x_t) under the posterior mean parameters: one (L_n, K) array per sequence."""
        lay, fb = self._plugin(lam, x)
        alpha = fb[0]
        out = [None] * lay.order.size
        for j, (i, L) in enumerate(zip(lay.order, lay.lens)):
            out[i] = alpha[:L, j].copy()
        return out

    def viterbi(self, lam: NatParams, x) -> list[np.ndarray]:
        """The most probable state path of each sequence under the posterior mean parameters."""
        x = self.check_batch(x)
        pi, A, B = self.mean_params(lam)
        lpi, lA, lB = np.log(pi), np.log(A), np.log(B).T          # lB: (V, K)
        lay = _Layout.of(x)
        T, n = lay.sym.shape
        K = self.n_states
        delta = lpi + lB[lay.sym[0]]                                # (n, K)
        back = np.zeros((T, n, K), dtype=np.int64)
        for t in range(1, T):
            m = lay.n_act[t]
            cand = delta[:m, :, None] + lA                          # (m, from, to)
            back[t, :m] = cand.argmax(axis=1)
            delta[:m] = np.take_along_axis(cand, back[t, :m][:, None, :], axis=1)[:, 0] + lB[lay.sym[t, :m]]
        path = np.zeros((T, n), dtype=np.int64)
        cur = delta.argmax(axis=1)                                  # each sequence's last state
        for t in range(T - 1, -1, -1):
            m = lay.n_act[t]
            path[t, :m] = cur[:m]
            if t > 0:
                cur[:m] = back[t, np.arange(m), cur[:m]]
        out = [None] * n
        for j, (i, L) in enumerate(zip(lay.order, lay.lens)):
            out[i] = path[:L, j].copy()
        return out

    def score_columns(self, lam: NatParams, x) -> dict:
        """Scores per sequence (``ScoresRecords``): ``log_likelihood`` (:meth:`log_likelihood`),
        ``log_predictive`` (:meth:`predictive_logpdf`) and ``viterbi``, the most likely state
        path (:meth:`viterbi`), a list of state numbers."""
        x = self.check_batch(x)
        return {"log_likelihood": self.log_likelihood(lam, x), "log_predictive": self.predictive_logpdf(lam, x),
                "viterbi": [p.tolist() for p in self.viterbi(lam, x)]}
