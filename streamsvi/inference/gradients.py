"""Stochastic-gradient VI for models that are not conjugate (seed 001, Titsias).

q(w) = Π_i N(w_i | μ_i, σ_i²) over the model's P global weights, stored as
λ = ``NatParams(mean=μ, log_std=log σ)``. The ELBO is

    L(μ, σ) = (N/|S|) Σ_{n∈S} E_q[log p(y_n | w)] − KL(q ‖ p)

(a model without a separate prior, like the Gaussian target, has
L = E_q[log p(w)] + H[q] instead). Three estimators, all unbiased for the same
gradient, each of the expectation E_q[f(w)] with one of two functions f
(``kl``, below):

``legrad``  local expectation gradients (seed 001 eq. 10, Algorithm 1). Draw
            one pivot w ~ q; for each coordinate i take the exact 1-D
            expectation over w_i ~ N(μ_i, σ_i²) with the other coordinates at the
            pivot, by Gauss–Hermite quadrature with K nodes (K = 5, as in the
            paper): with w_i = μ_i + σ_i z_k, ``∂μ_i ≈ Σ_k π_k f_ik z_k / σ_i`` and
            ``∂log σ_i ≈ Σ_k π_k f_ik (z_k² − 1)``. Cost P·K evaluations of f.
``regrad``  reparameterisation (seed 001 eq. 6): w = μ + σ ε, ∇ f(w) chained
            through; one sample by default (as in the paper).
``ldgrad``  the score function / log-derivative trick (seed 001 eq. 5), no
            control variate, S samples; by default S = P·K, the paper's rule
            that matches LeGrad's cost (S = 500 for the 100-D target, 3925 for
            MNIST's 785 weights).

A step (``step_t = learning_rate · ρ_t``, ρ_t the Robbins–Monro schedule):

``natural`` (default)  the natural gradient of q's Gaussian family, whose Fisher
            information is diag(1/σ²) for μ and 2 for log σ:
            ``μ ← μ + step_t σ² ĝ_μ``, ``log σ ← log σ + step_t ĝ_log σ / 2``,
            clipped to a trust region (|Δμ_i| ≤ 3 σ_i, |Δ log σ_i| ≤ 0.5). At the mean-field
            fixed point σ_i² = 1/(1/v0_i + N E_q[−∂²_i log p]), so σ² ĝ_μ is a Newton
            step and ρ_t ∈ (0, 1] has the same meaning as on the conjugate path:
            no rate to tune for the data-set size.
``sgd``     plain Robbins–Monro: ``v ← v + step_t ĝ / N`` for v = (μ, log σ).
``adam``    Adam (Kingma & Ba 2015) on ĝ / N with step size ``step_t``, its
            moments kept in ``state.aux`` so a checkpoint resumes it exactly
            (an adaptive step, named as such; ``schedule = Constant(1)`` gives
            plain Adam).

The function f (``kl``; default ``"sampled"`` for LeGrad, ``"exact"`` for ReGrad and LdGrad):

``"sampled"``  seed 001's Algorithm 1: f(w) = log p(y, w) − log q(w) =
            (N/|S|) Σ_n log p(y_n | w) + log p0(w) − log q(w), sampled as a whole
            (for a target, log p(w) − log q(w)). LeGrad integrates all of it over
            w_i; LdGrad weights all of it by the score; ReGrad follows
            ∇_w f along the path (the paper's eq. 6, with q's parameters held
            fixed inside log q: that term's expectation is 0).
``"exact"``  the KL (or −entropy) and its gradient in closed form, only the
            log-likelihood sampled: the analytic-KL form Pyro and TFP offer.

Measured (``python bench/gradient_f.py``; tables in docs/models/logistic.md),
the trace of the gradient's variance, sampled ÷ exact form:

* LeGrad: never higher. The same numbers under the mean field (the 1-D
  Gauss–Hermite integral of log p0 − log q, a quadratic in w_i, is exact), the
  same on MNIST 2-vs-7 with a low-rank q, and 330× lower under "full" on seed
  001's correlated target at a fitted q (∂μ 1.2e5 → 368): log q varies with
  w_i through w_i's children, which the exact-KL form leaves out of the
  integral. Default "sampled".
* ReGrad and LdGrad: lower on the Gaussian target, whose p a q can match (at
  q = p the sampled f is the constant log Z and both have zero variance), but
  higher on MNIST 2-vs-7 logistic regression, mean field and low rank:
  ReGrad 1.1–2.5×, LdGrad 10–73× (sampling the prior and −log q adds
  noise that the data term does not cancel). Default "exact" for both.

Covariance (``covariance``, default ``"diagonal"``; λ layouts in
:mod:`streamsvi.models.nonconjugate`). What each estimator does beyond the
mean field, with u = w − μ:

``"full"``  q(w) = Π_i N(w_i | μ_i + Σ_{j<i} A_ij u_j, s_i²): a directed
            factorisation with one factor per coordinate (seed 001 eq. 7 with
            pa_i = w_<i), L = (I − A)⁻¹ diag(s), Λ = (I − A)ᵀ diag(s⁻²)(I − A).
            *legrad*: eq. (9) term by term. For each i the term
            E_q[f ∇ log q_i(w_i | w_<i)] is integrated exactly (K Gauss–Hermite
            nodes) over w_i under the *full conditional* q(w_i | w_−i) =
            N(w_i − (Λu)_i / Λ_ii, 1 / Λ_ii) at the pivot, the others held at
            the pivot. With r_i = u_i − Σ_{j<i} A_ij u_j and
            t_i = E[(f − b_i) r_i] / s_i²: ∂μ = (I − A)ᵀ t, ∂A_ij = t_i u_j (j < i),
            ∂log s_i = E[(f − b_i)(r_i²/s_i² − 1)]. The baseline
            b_i = f(E_q[w | w_<i]) depends on w_i's parents only, so
            E_q[b_i ∇ log q_i] = 0 and the estimate stays unbiased (the
            full-conditional mean of ∇ log q_i is not 0, so a baseline at the
            pivot would bias it). Cost: P·K + P evaluations of f plus O(P²).
            With ``kl = "sampled"`` f includes −log q(w), whose change with
            w_i (through r_i and the children's r_j) is −δ (Λu)_i − ½ δ² Λ_ii in
            closed form. With ``kl = "exact"`` LeGrad's variance here is far
            above ReGrad's (that f leaves out how w_i moves its children's
            factors); with the sampled f it is 330× lower (module docs above).
            *regrad*: w = μ + L ε; with h = Lᵀ-chain Mᵀ∇f (M = (I − A)⁻¹):
            ∂μ = ∇f, ∂A = h uᵀ (strictly lower), ∂log s = s ⊙ h ⊙ ε.
            *ldgrad*: the score of the full Gaussian: ∂μ = (I − A)ᵀ ε/s,
            ∂A_ij = (ε_i/s_i) u_j, ∂log s = ε² − 1.
            Refused above ``MAX_FULL_PARAMS`` weights (the (P, P) factor and
            O(P³) per update; use "lowrank").
``"lowrank"`` Σ = diag(σ²) + B Bᵀ. Written as the directed model
            z ~ N(0, I_r), w_i | z ~ N(μ_i + B_i z, σ_i²), whose factors have
            separate parameters (μ_i, σ_i, B_i·) and w_i's Markov blanket is z.
            *legrad*: pivot (z, w); per coordinate the exact expectation over
            w_i ~ N(μ_i + B_i z, σ_i²) as in the mean field, and ∂B_i· = ∂μ_i · zᵀ.
            *regrad*: w = μ + σ ⊙ ε₁ + B ε₂. *ldgrad*: the score of N(μ, Σ)
            (Σ⁻¹ by Woodbury). ``rank`` r is required.

With ``kl = "exact"`` the KL (or entropy) of the marginal q(w) and its gradient
are exact in both; with ``"sampled"`` log p0(w) − log q(w) (q's marginal) is
part of f as above. ``grad_variance`` covers the μ and log σ (log s)
coordinates only (the factor's per-record contributions are not kept), and
only the records' log-likelihood terms. The ``natural`` optimiser
is for the mean field only: with "full" or "lowrank" use ``adam`` (the
config's default there) or ``sgd``.

An update is :meth:`GradientVI.gradient` (ĝ from the minibatch) then
:meth:`GradientVI.step_with` (the optimiser's step, the one place it is
written), which is where scale-out splits it (:mod:`.split_gradient`: workers
send ĝ, the applier steps with its own λ, Adam moments and ρ_t).

The cost of an update on a small problem is mostly numpy's per-call overhead (a river
face takes one update per 16 records), so under the mean field an update does the fewest
calls that give the same numbers: LeGrad's per-record (∂μ, ∂log σ) sit side by side in
one (n, 2P) array (``GradientEstimate.g_both``), the gradient and the step work on λ's
flat buffer, the constants (Gauss–Hermite weights, prior moments, log v0) are made once,
the generator an update leaves is kept for the update from its state (the same draws
as ``state.rng()``), a model may give LeGrad's coordinate and pivot log-likelihoods from
one pass (``loglik_coordinate_and_pivot``), and ``UpdateInfo.elbo``,
``elbo_per_record`` and ``grad_variance`` are computed when first read (|S| · 2P ≤ 4096;
the daemon's metrics read them). Every number is the plain computation's, to the bit
(tests/inference/test_gradients_speed_path.py); ``python bench/gradient_update_speed.py``
measures µs per update.

The engine has the public surface of :class:`~streamsvi.inference.engine.SVI`
that the daemon, the checkpoints and the scorers use: ``init``, ``update``,
``fit``, ``predictive_logpdf``, ``to_dict``, ``n_total``, ``model``; states
are :class:`~streamsvi.inference.engine.EngineState` and updates report an
:class:`~streamsvi.inference.engine.UpdateInfo` (``grad_variance`` there is
N² tr(Σ̂)/|S|, Σ̂ the sample covariance of the records' gradient
contributions, as on the conjugate path; ``gradient`` is ĝ_t itself).

Examples
--------
>>> import numpy as np
>>> from streamsvi.inference.schedules import Constant
>>> from streamsvi.models.logistic import CorrelatedGaussianTarget
>>> engine = GradientVI(CorrelatedGaussianTarget(), n_total=1, estimator="legrad",
...                     optimizer="adam", learning_rate=0.05, schedule=Constant(1.0))
>>> state, infos = engine.fit(engine.init(None, seed=0), None, n_steps=3000)
>>> bool(abs(np.mean(state.lam["mean"]) - 2.0) < 0.2)   # the optimum: μ = 2
True
>>> full = GradientVI(CorrelatedGaussianTarget(n_dims=5), n_total=1, estimator="regrad",
...                   optimizer="adam", covariance="full")
>>> sorted(full.init(None, seed=0).lam)                    # A: zero on and above the diagonal
['coupling', 'log_std', 'mean']
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..models.base import CoordinateLoglik, NatParams
from ..models.nonconjugate import COVARIANCE_KEYS, gauss_hermite, gaussian_kl, unit_lower_inverse
from .engine import EngineState, UpdateInfo
from .schedules import RobbinsMonro, Schedule, schedule_from_dict

__all__ = ["GradientVI", "ESTIMATORS", "OPTIMIZERS", "COVARIANCES", "KLS", "MAX_FULL_PARAMS", "GradientEstimate"]

ESTIMATORS = ("legrad", "regrad", "ldgrad")
OPTIMIZERS = ("natural", "sgd", "adam")
COVARIANCES = ("diagonal", "full", "lowrank")
#: how f treats log p0(w) − log q(w): "sampled" (seed 001's Algorithm 1, f = log p(y, w) − log q(w)
#: sampled as a whole) or "exact" (the KL, or entropy, and its gradient in closed form; only the
#: log-likelihood sampled: the analytic-KL form of Pyro's TraceMeanField_ELBO and TFP)
KLS = ("sampled", "exact")
#: the most weights ``covariance = "full"`` accepts: its factor is (P, P) and an update costs O(P³)
MAX_FULL_PARAMS = 1000
#: natural-gradient steps are clipped to a trust region: |Δμ_i| ≤ MAX_MEAN_STEP · σ_i
#: and |Δ log σ_i| ≤ MAX_LOG_STD_STEP (a noisy gradient cannot throw q far in one step)
MAX_MEAN_STEP = 3.0
MAX_LOG_STD_STEP = 0.5
_ADAM_B1, _ADAM_B2, _ADAM_EPS = 0.9, 0.999, 1e-8
_LOG_2PI = math.log(2 * math.pi)


@dataclass(frozen=True)
class GradientEstimate:
    """One estimate: per-record contributions of Σ_n E_q[log p(y_n|w)] to ∂μ and ∂log σ.

    ``g_mean`` and ``g_log_std`` have shape (n, P); ``loglik`` (n,) is f_n at
    the first sample (for the stochastic ELBO value); ``g_factor`` is the
    batch's summed gradient for the covariance factor (A or B), None for the mean field.
    ``g_rest`` (``kl = "sampled"`` only) is the estimate of ∇ E_q[log p0(w) − log q(w)] from the
    same draws, keyed like λ (the prior's and q's part of seed 001's f; None: taken exactly).
    ``g_both`` (mean-field LeGrad): one (n, 2P) array of which ``g_mean`` and ``g_log_std`` are
    the halves (the gradient's sums and its variance then take one pass over it); else None.
    """

    g_mean: np.ndarray
    g_log_std: np.ndarray
    loglik: np.ndarray
    g_factor: np.ndarray | None = None
    g_rest: dict | None = None
    g_both: np.ndarray | None = None


#: the most per-record gradient numbers (|S| · 2P) an UpdateInfo keeps to compute its variance
#: when it is read (_LazyInfo); above it the metrics are computed in the update (a list of
#: unread infos then holds at most 32 KiB of gradients each)
_LAZY_MAX = 4096
_LAZY_FIELDS = frozenset(("elbo", "elbo_per_record", "grad_variance"))


class _LazyInfo(UpdateInfo):
    """An :class:`UpdateInfo` whose ``elbo``, ``elbo_per_record`` and ``grad_variance`` are
    computed when first read, from what the update kept (the estimate, N/|S|, the λ it started
    from): the numbers :meth:`GradientVI.update` would have put there. A caller that reads none
    of them (a river face learning record by record) saves their cost; the daemon's metrics
    read them, and get the same values. Pickled and copied as a plain UpdateInfo."""

    @classmethod
    def _make(cls, engine, est, scale, lam, parts, n_total, **eager):
        info = cls.__new__(cls)
        info.__dict__.update(eager, _lazy=(engine, est, scale, lam, parts, n_total))
        return info

    def __getattr__(self, name):                  # only for what is not in __dict__ yet
        d = self.__dict__
        lazy = d.get("_lazy")
        if lazy is None or name not in _LAZY_FIELDS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        engine, est, scale, lam, parts, n_total = lazy
        std = np.exp(np.asarray(lam["log_std"]))
        elbo = scale * float(np.sum(est.loglik)) - engine._kl_diagonal(np.asarray(lam["mean"]), std, parts)
        d.update(elbo=elbo, elbo_per_record=elbo / n_total,
                 grad_variance=GradientVI._grad_variance(est, scale))
        d.pop("_lazy", None)
        return d[name]

    def _values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(UpdateInfo))

    def __reduce__(self):
        return UpdateInfo, self._values()

    def __eq__(self, other):                      # equal to a plain UpdateInfo of the same values
        if not isinstance(other, UpdateInfo):
            return NotImplemented
        cmp = [f.name for f in fields(UpdateInfo) if f.compare]     # as the dataclass compares
        return tuple(getattr(self, k) for k in cmp) == tuple(getattr(other, k) for k in cmp)

    __hash__ = UpdateInfo.__hash__


def _check_choice(name, v, choices):
    if v not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}, got {v!r}")
    return v


def _adam_step(aux: dict, gflat: np.ndarray, t: int, step: float) -> tuple[np.ndarray, dict]:
    """Adam's move of the flat parameters at step ``t`` and its new moments (``aux``)."""
    m = _ADAM_B1 * aux["adam_m"] + (1 - _ADAM_B1) * gflat
    v = _ADAM_B2 * aux["adam_v"] + (1 - _ADAM_B2) * gflat * gflat
    mhat, vhat = m / (1 - _ADAM_B1 ** t), v / (1 - _ADAM_B2 ** t)
    return step * mhat / (np.sqrt(vhat) + _ADAM_EPS), {"adam_m": m, "adam_v": v}


@dataclass
class GradientVI:
    """Mean-field Gaussian VI by stochastic gradients (LeGrad, ReGrad or LdGrad).

    Parameters
    ----------
    model :
        A non-conjugate model (:mod:`streamsvi.models.nonconjugate`).
    n_total : float
        N, the data-set (or population) size; 1 for a data-free target.
    estimator : {"legrad", "regrad", "ldgrad"}
        The gradient estimator (module docs). Default "legrad".
    n_samples : int or None
        Pivots (legrad), samples (regrad) or samples (ldgrad) per update.
        None: 1, 1 and P·K.
    quadrature_points : int
        K, Gauss–Hermite nodes of LeGrad (default 5, seed 001).
    schedule : Schedule
        ρ_t; default ``RobbinsMonro(tau0=1, kappa=0.7)``.
    learning_rate : float
        Step size multiplier (module docs). Default 1.
    optimizer : {"natural", "sgd", "adam"}
        Robbins–Monro natural-gradient steps (default), plain Robbins–Monro
        steps, or Adam (module docs).
    covariance : {"diagonal", "full", "lowrank"}
        The covariance of q (module docs). Default "diagonal" (mean field).
    rank : int or None
        r, the columns of B for ``covariance = "lowrank"`` (required there, else None).
    kl : {"sampled", "exact"} or None
        What the estimator samples (module docs, "The function f"): seed 001's
        f = log p(y, w) − log q(w) as a whole ("sampled"), or only the log-likelihood with the
        KL (entropy) and its gradient exact ("exact"). None (default): "sampled" for LeGrad,
        "exact" for ReGrad and LdGrad, the forms with the lower variance measured on real data.
    """

    model: object
    n_total: float
    estimator: str = "legrad"
    n_samples: int | None = None
    quadrature_points: int = 5
    schedule: Schedule = field(default_factory=RobbinsMonro)
    learning_rate: float = 1.0
    optimizer: str = "natural"
    covariance: str = "diagonal"
    rank: int | None = None
    kl: str | None = None

    def __post_init__(self):
        if isinstance(self.n_total, bool) or not isinstance(self.n_total, (int, float, np.integer, np.floating)) \
                or not math.isfinite(self.n_total) or self.n_total <= 0:
            raise ValueError(f"n_total must be a finite number > 0, got {self.n_total!r}")
        _check_choice("estimator", self.estimator, ESTIMATORS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.n_samples is not None and (isinstance(self.n_samples, bool) or not isinstance(
                self.n_samples, (int, np.integer)) or self.n_samples < 1):
            raise ValueError(f"n_samples must be an integer >= 1 or None, got {self.n_samples!r}")
        if isinstance(self.quadrature_points, bool) or not isinstance(self.quadrature_points, (int, np.integer)) \
                or self.quadrature_points < 2:
            raise ValueError(f"quadrature_points must be an integer >= 2, got {self.quadrature_points!r}")
        if not isinstance(self.schedule, Schedule):
            raise ValueError(f"schedule must be a Schedule, got {type(self.schedule).__name__}")
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float)) \
                or not math.isfinite(self.learning_rate) or self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be a finite number > 0, got {self.learning_rate!r}")
        _check_choice("covariance", self.covariance, COVARIANCES)
        if self.kl is None:                      # chosen by measurement (module docs, "The function f")
            self.kl = "sampled" if self.estimator == "legrad" else "exact"
        _check_choice("kl", self.kl, KLS)
        P = self.model.n_params
        if self.covariance == "lowrank":
            if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) \
                    or not 1 <= self.rank <= P:
                raise ValueError(f"rank must be an integer in [1, {P}] (the number of weights) for "
                                 f"covariance = 'lowrank', got {self.rank!r}")
        elif self.rank is not None:
            raise ValueError(f"rank is only used with covariance = 'lowrank', got rank = {self.rank!r} "
                             f"with covariance = {self.covariance!r}; remove it")
        if self.covariance != "diagonal" and self.optimizer == "natural":
            raise ValueError(f"optimizer = 'natural' is implemented for covariance = 'diagonal' only; use "
                             f"optimizer = 'adam' (or 'sgd') with covariance = {self.covariance!r}")
        if self.covariance == "full" and P > MAX_FULL_PARAMS:
            raise ValueError(f"covariance = 'full' is limited to {MAX_FULL_PARAMS} weights (a (P, P) factor and "
                             f"O(P^3) work per update); this model has P = {P}: use covariance = 'lowrank' "
                             f"with a rank such as 10")
        self._nodes, self._weights = gauss_hermite(self.quadrature_points)
        z, pi = self._nodes, self._weights
        # LeGrad's per-update constants: the node weights of ∂μ and ∂log σ and q's part of the
        # sampled f at the nodes (½ z_k²), the same arrays the expressions below would make anew
        self._piz, self._piz2, self._half_z2 = pi * z, pi * (z * z - 1.0), 0.5 * z[None, :] ** 2
        self._prior_cache = None                 # (model, P, _prior_parts()) of model.prior_moments()
        self._plain_layout = None                # the last λ layout _plain found plain
        # generators left by update(), keyed by id of the rng_state dict they stand at (_take_rng)
        self._rngs = {}

    def __getstate__(self):                       # pickles and copies keep no generators
        return {**self.__dict__, "_rngs": {}}

    # ------------------------------------------------------------ settings
    @property
    def samples(self) -> int:
        """The number of samples (pivots) an update draws."""
        if self.n_samples is not None:
            return int(self.n_samples)
        return self.model.n_params * self.quadrature_points if self.estimator == "ldgrad" else 1

    def to_dict(self) -> dict:
        d = {"n_total": float(self.n_total), "estimator": self.estimator, "n_samples": self.n_samples,
             "quadrature_points": int(self.quadrature_points), "schedule": self.schedule.to_dict(),
             "learning_rate": float(self.learning_rate), "optimizer": self.optimizer, "kl": self.kl}
        if self.covariance != "diagonal":       # mean-field files stay as they were
            d["covariance"] = self.covariance
            d["rank"] = None if self.rank is None else int(self.rank)
        return d

    @property
    def factor_key(self) -> str | None:
        """The λ entry of the covariance factor: "coupling" (full), "factor" (lowrank) or None."""
        return COVARIANCE_KEYS[self.covariance]

    def check_state(self, lam) -> None:
        """Raise ``ValueError`` unless λ has this engine's covariance layout."""
        key = self.factor_key
        extra = sorted(set(lam) - {"mean", "log_std"})
        if extra != ([] if key is None else [key]):
            raise ValueError(f"state parameters {sorted(lam)} do not match covariance = {self.covariance!r} "
                             f"(expected mean, log_std{'' if key is None else ', ' + key})")
        if key == "factor" and lam["factor"].shape[1] != self.rank:
            raise ValueError(f"factor has rank {lam['factor'].shape[1]}, the engine has rank = {self.rank}")

    @classmethod
    def from_dict(cls, model, d: dict) -> "GradientVI":
        d = dict(d)
        d["schedule"] = schedule_from_dict(d["schedule"])
        return cls(model, **d)

    # ---------------------------------------------------------------- init
    def init(self, x_init=None, seed: int = 0) -> EngineState:
        """A fresh state: q from ``model.init_params``, step 0 (Adam moments at 0)."""
        rng = np.random.Generator(np.random.PCG64(seed))
        lam = self.model.init_params(rng, None if x_init is None else self.model.check_batch(x_init),
                                     self.n_total)
        P = self.model.n_params
        if self.covariance == "full":
            lam = NatParams(mean=lam["mean"], log_std=lam["log_std"], coupling=np.zeros((P, P)))
        elif self.covariance == "lowrank":
            # B = 0 is a stationary point of the ELBO (B enters Σ quadratically): start off it
            B = 0.1 * np.exp(np.asarray(lam["log_std"]))[:, None] * rng.standard_normal((P, self.rank))
            lam = NatParams(mean=lam["mean"], log_std=lam["log_std"], factor=B)
        aux = None
        if self.optimizer == "adam":
            size = sum(np.asarray(v).size for v in lam.values())
            aux = {"adam_m": np.zeros(size), "adam_v": np.zeros(size)}
        return EngineState(step=0, lam=lam, rng_state=rng.bit_generator.state, records_seen=0, aux=aux)

    # ----------------------------------------------------------- estimators
    def estimate(self, lam: NatParams, x, rng: np.random.Generator) -> GradientEstimate:
        """Per-record estimates of ∇ Σ_n E_q[log p(y_n | w)] with this engine's estimator."""
        if self.covariance == "full":
            return self._estimate_full(lam, x, rng)
        if self.covariance == "lowrank":
            return self._estimate_lowrank(lam, x, rng)
        if self._plain(lam):                                     # (μ, log σ) as views of λ's buffer
            flat = lam._flat
            mu, std = flat[:flat.shape[0] // 2], np.exp(flat[flat.shape[0] // 2:])
        else:
            mu = np.asarray(lam["mean"])
            std = np.exp(np.asarray(lam["log_std"]))
        S = self.samples
        P = mu.shape[0]
        model = self.model
        if self.estimator == "regrad":
            eps = rng.standard_normal((S, P))
            W = mu + std * eps
            G = model.grad_loglik(W, x)                          # (S, n, P)
            g_mean = G.mean(axis=0)
            g_ls = np.einsum("snp,sp->np", G, std * eps) / S
            f = model.loglik(W[:1], x)[0]
            rest = None
            if self.kl == "sampled":                             # −∇_w log q(w) = ε / σ
                Gx = self._grad_log_prior(W) + eps / std
                rest = {"mean": Gx.mean(axis=0), "log_std": np.mean(Gx * std * eps, axis=0)}
            return GradientEstimate(g_mean, g_ls, f, g_rest=rest)
        if self.estimator == "ldgrad":
            eps = rng.standard_normal((S, P))
            W = mu + std * eps
            F = model.loglik(W, x)                               # (S, n)
            g_mean = (F.T @ eps) / (S * std)
            g_ls = (F.T @ (eps * eps - 1.0)) / S
            rest = None
            if self.kl == "sampled":                             # h = log p0(w) − log q(w) per sample
                h = self._log_prior(W) + float(np.sum(np.log(std))) + 0.5 * np.sum(eps * eps, axis=1) \
                    + 0.5 * P * _LOG_2PI
                rest = {"mean": (h @ eps) / (S * std), "log_std": (h @ (eps * eps - 1.0)) / S}
            return GradientEstimate(g_mean, g_ls, F[0], g_rest=rest)
        return self._estimate_legrad(mu, std, x, rng)

    def _estimate_legrad(self, mu, std, x, rng) -> GradientEstimate:
        """LeGrad under the mean field (seed 001 Algorithm 1), S pivots.

        ``g_both`` holds (∂μ, ∂log σ) per record side by side, shape (n, 2P); ``g_mean`` and
        ``g_log_std`` are its halves. The arithmetic is the plain loop's, op for op
        (tests/inference/test_gradients_speed_path.py holds it to a reference to the bit)."""
        model = self.model
        S, P = self.samples, mu.shape[0]
        z, piz, piz2 = self._nodes, self._piz, self._piz2
        sampled = self.kl == "sampled"
        nodes = mu[:, None] + std[:, None] * z[None, :]          # (P, K), the same for every pivot
        coordinate = isinstance(model, CoordinateLoglik)
        g_mean = g_ls = f0 = None
        rm = rl = 0.0
        for s in range(S):
            w = mu + std * rng.standard_normal(P)
            if coordinate:                                       # F (n, P, K), f (n,) from one pass
                F, f = model.loglik_coordinate_and_pivot(w, nodes, x)
            else:
                F, f = self._coordinate_by_loglik(w, nodes, x), model.loglik(w[None, :], x)[0]
            if F.flags.c_contiguous:                             # Σ π z = Σ π (z²−1) = 0: exact shift
                F -= f[:, None, None]
            else:
                F = F - f[:, None, None]
            gm = (F @ piz) / std[None, :]
            gl = F @ piz2
            if sampled:                                          # log p0 − log q with w_i at the nodes
                H = self._log_prior_coordinate(w, nodes) + self._half_z2
                rm = rm + (H @ piz) / std
                rl = rl + H @ piz2
            if s == 0:
                g_mean, g_ls, f0 = gm, gl, f
            else:
                g_mean, g_ls = g_mean + gm, g_ls + gl
        if S == 1:                                               # x / 1 is x: the division is left out
            both = np.concatenate([g_mean, g_ls], axis=1)
            rest = {"mean": rm, "log_std": rl} if sampled else None
        else:
            both = np.empty((g_mean.shape[0], 2 * P))
            np.divide(g_mean, S, out=both[:, :P])
            np.divide(g_ls, S, out=both[:, P:])
            rest = {"mean": rm / S, "log_std": rl / S} if sampled else None
        return GradientEstimate(both[:, :P], both[:, P:], f0, g_rest=rest, g_both=both)

    def _coordinate(self, w, nodes, x) -> np.ndarray:
        if isinstance(self.model, CoordinateLoglik):
            return self.model.loglik_coordinate(w, nodes, x)
        return self._coordinate_by_loglik(w, nodes, x)

    def _full_parts(self, lam):
        """(μ, s, A, I − A, M = (I − A)⁻¹, L = M diag(s)) of a full-covariance q."""
        mu, s = np.asarray(lam["mean"]), np.exp(np.asarray(lam["log_std"]))
        A = np.tril(np.asarray(lam["coupling"]), -1)
        IA = np.eye(mu.shape[0]) - A
        M = unit_lower_inverse(A)
        return mu, s, A, IA, M, M * s[None, :]

    def _estimate_full(self, lam, x, rng) -> GradientEstimate:
        mu, s, A, IA, M, L = self._full_parts(lam)
        S, P, model = self.samples, mu.shape[0], self.model
        if self.estimator in ("regrad", "ldgrad"):
            E = rng.standard_normal((S, P))
            U = (E * s) @ M.T                                    # u = L ε, (S, P)
            W = mu + U
            sampled = self.kl == "sampled"
            Es = E / s
            if self.estimator == "regrad":
                G = model.grad_loglik(W, x)                      # (S, n, P)
                H = G @ M                                        # h = Mᵀ ∇f
                g_ls = np.einsum("snp,sp->np", H, s * E) / S
                g_A = np.tril(H.sum(axis=1).T @ U / S, -1)
                f = model.loglik(W[:1], x)[0]
                rest = None
                if sampled:                                      # −∇_w log q(w) = Λu = (I − A)ᵀ ε / s
                    Gx = self._grad_log_prior(W) + Es @ IA
                    Hx = Gx @ M
                    rest = {"mean": Gx.mean(axis=0), "log_std": np.mean(Hx * s * E, axis=0),
                            "coupling": np.tril(Hx.T @ U / S, -1)}
                return GradientEstimate(G.mean(axis=0), g_ls, f, g_A, rest)
            F = model.loglik(W, x)                               # (S, n)
            g_mean = (F.T @ (Es @ IA)) / S
            g_ls = (F.T @ (E * E - 1.0)) / S
            g_A = np.tril((Es * F.sum(axis=1)[:, None]).T @ U / S, -1)
            rest = None
            if sampled:                                          # log q(w) = −Σ log s − ½ ε·ε − P/2 log 2π
                h = self._log_prior(W) + float(np.sum(np.log(s))) + 0.5 * np.sum(E * E, axis=1) \
                    + 0.5 * P * _LOG_2PI
                rest = {"mean": (h @ (Es @ IA)) / S, "log_std": (h @ (E * E - 1.0)) / S,
                        "coupling": np.tril((Es * h[:, None]).T @ U / S, -1)}
            return GradientEstimate(g_mean, g_ls, F[0], g_A, rest)
        # legrad: eq. (9) per factor, w_i integrated under the full conditional q(w_i | w_-i)
        z, pi = self._nodes, self._weights
        s2 = s * s
        lam_diag = (IA * IA).T @ (1.0 / s2)                      # Λ_ii
        tau = 1.0 / np.sqrt(lam_diag)
        above = np.triu(np.ones((P, P)), 1)                      # [j < i]
        sampled = self.kl == "sampled"
        log_q0 = -float(np.sum(np.log(s))) - 0.5 * P * _LOG_2PI  # log q(w) = log_q0 − ½ Σ r_j² / s_j²
        g_mean = g_ls = g_A = f0 = None
        rest = {"mean": 0.0, "log_std": 0.0, "coupling": 0.0}
        for k in range(S):
            eps = rng.standard_normal(P)
            r = s * eps                                          # (I − A) u
            u = M @ r
            w = mu + u
            lam_u = (r / s2) @ IA                                # Λ u
            cmean = w - lam_u / lam_diag
            nodes = cmean[:, None] + tau[:, None] * z[None, :]   # (P, K)
            # b_i = f(E_q[w | w_<i]): a function of w_i's parents only, so E_q[b_i ∇ log q_i] = 0
            Ub = (M * r[None, :]) @ above                        # column i: E[u | u_<i]
            points = mu[None, :] + Ub.T                          # row i: E_q[w | w_<i]
            base = model.loglik(points, x).T                     # (n, P)
            F = self._coordinate(w, nodes, x) - base[:, :, None]
            R = r[:, None] + (nodes - w[:, None])                # r_i at the nodes
            wt_m, wt_s = pi * R / s2[:, None], pi * (R * R / s2[:, None] - 1.0)
            t = np.einsum("npk,pk->np", F, wt_m)
            gl = np.einsum("npk,pk->np", F, wt_s)
            gm = t @ IA
            gA = np.tril(np.outer(t.sum(axis=0), u), -1)
            if sampled:
                # h = log p0 − log q at the nodes (moving w_i by δ changes log q by −δ (Λu)_i − ½ δ² Λ_ii,
                # since it moves r_j by δ (I − A)_ji), less h at the same baseline points: there
                # r = r masked to j < i, so log q = log_q0 − ½ Σ_{j<i} ε_j²
                delta = nodes - w[:, None]
                h_w = float(self._log_prior(w[None, :])[0]) - (log_q0 - 0.5 * float(eps @ eps))
                h_nodes = h_w + self._log_prior_coordinate(w, nodes) \
                    + delta * lam_u[:, None] + 0.5 * delta * delta * lam_diag[:, None]
                b = self._log_prior(points) - (log_q0 - 0.5 * (np.cumsum(eps * eps) - eps * eps))
                Hx = h_nodes - b[:, None]
                tx = np.sum(Hx * wt_m, axis=1)
                rest["mean"] = rest["mean"] + tx @ IA
                rest["log_std"] = rest["log_std"] + np.sum(Hx * wt_s, axis=1)
                rest["coupling"] = rest["coupling"] + np.tril(np.outer(tx, u), -1)
            if k == 0:
                g_mean, g_ls, g_A, f0 = gm, gl, gA, model.loglik(w[None, :], x)[0]
            else:
                g_mean, g_ls, g_A = g_mean + gm, g_ls + gl, g_A + gA
        rest = {key: v / S for key, v in rest.items()} if sampled else None
        return GradientEstimate(g_mean / S, g_ls / S, f0, g_A / S, rest)

    def _lowrank_parts(self, lam):
        """(μ, σ, d = σ², B, Σ⁻¹B, diag Σ⁻¹, log det Σ, D⁻¹B K⁻¹ pieces) by Woodbury."""
        mu, sd = np.asarray(lam["mean"]), np.exp(np.asarray(lam["log_std"]))
        d = sd * sd
        B = np.asarray(lam["factor"])
        DB = B / d[:, None]                                      # D⁻¹ B
        K = np.eye(B.shape[1]) + B.T @ DB
        Kinv = np.linalg.inv(K)
        SinvB = DB @ Kinv                                        # Σ⁻¹ B = D⁻¹ B K⁻¹
        diag_sinv = 1.0 / d - np.sum((DB @ Kinv) * DB, axis=1)
        logdet = float(np.sum(np.log(d)) + np.linalg.slogdet(K)[1])
        return mu, sd, d, B, DB, Kinv, SinvB, diag_sinv, logdet

    def _estimate_lowrank(self, lam, x, rng) -> GradientEstimate:
        mu, sd, d, B, DB, Kinv, SinvB, diag_sinv, logdet = self._lowrank_parts(lam)
        S, P, r, model = self.samples, mu.shape[0], B.shape[1], self.model
        if self.estimator in ("regrad", "ldgrad"):
            E1 = rng.standard_normal((S, P))
            E2 = rng.standard_normal((S, r))
            U = E1 * sd + E2 @ B.T
            W = mu + U
            V = U / d - ((U @ DB) @ Kinv) @ DB.T                 # Σ⁻¹ u = −∇_w log q(w)
            sampled = self.kl == "sampled"
            if self.estimator == "regrad":
                G = model.grad_loglik(W, x)
                g_ls = np.einsum("snp,sp->np", G, sd * E1) / S
                g_B = G.sum(axis=1).T @ E2 / S
                rest = None
                if sampled:
                    Gx = self._grad_log_prior(W) + V
                    rest = {"mean": Gx.mean(axis=0), "log_std": np.mean(Gx * sd * E1, axis=0),
                            "factor": Gx.T @ E2 / S}
                return GradientEstimate(G.mean(axis=0), g_ls, model.loglik(W[:1], x)[0], g_B, rest)
            F = model.loglik(W, x)                               # (S, n)

            def score(h):                                        # E[h ∇ log q] from the draws, by parameter
                return {"mean": (h @ V) / S, "log_std": (h @ (d * (V * V - diag_sinv))) / S,
                        "factor": (V * h[:, None]).T @ (V @ B) / S - h.mean() * SinvB}

            g_mean = (F.T @ V) / S
            g_ls = (F.T @ (d * (V * V - diag_sinv))) / S
            rest = None
            if sampled:                                # log q = −½ log det Σ − ½ uᵀΣ⁻¹u − P/2 log 2π
                h = self._log_prior(W) + 0.5 * logdet + 0.5 * np.sum(U * V, axis=1) + 0.5 * P * _LOG_2PI
                rest = score(h)
            return GradientEstimate(g_mean, g_ls, F[0], score(F.sum(axis=1))["factor"], rest)
        z, pi = self._nodes, self._weights
        sampled = self.kl == "sampled"
        g_mean = g_ls = g_B = f0 = None
        rest = {"mean": 0.0, "log_std": 0.0, "factor": 0.0}
        for k in range(S):
            zr = rng.standard_normal(r)
            c = mu + B @ zr                                      # E[w | z]
            w = c + sd * rng.standard_normal(P)
            nodes = c[:, None] + sd[:, None] * z[None, :]
            f = model.loglik(w[None, :], x)[0]
            F = self._coordinate(w, nodes, x) - f[:, None, None]  # Σ π z = Σ π (z²−1) = 0: exact shift
            gm = (F @ (pi * z)) / sd[None, :]
            gl = F @ (pi * (z * z - 1.0))
            gB = np.outer(gm.sum(axis=0), zr)
            if sampled:
                # h = log p0 − log q(w) (q's marginal), w_i moved by δ: log q changes by
                # −δ (Σ⁻¹u)_i − ½ δ² (Σ⁻¹)_ii; the shift by h(w) is exact as above
                u = w - mu
                v = u / d - ((u @ DB) @ Kinv) @ DB.T
                delta = nodes - w[:, None]
                Hx = self._log_prior_coordinate(w, nodes) + delta * v[:, None] \
                    + 0.5 * delta * delta * diag_sinv[:, None]
                rm = (Hx @ (pi * z)) / sd
                rest["mean"] = rest["mean"] + rm
                rest["log_std"] = rest["log_std"] + Hx @ (pi * (z * z - 1.0))
                rest["factor"] = rest["factor"] + np.outer(rm, zr)
            if k == 0:
                g_mean, g_ls, g_B, f0 = gm, gl, gB, f
            else:
                g_mean, g_ls, g_B = g_mean + gm, g_ls + gl, g_B + gB
        rest = {key: v / S for key, v in rest.items()} if sampled else None
        return GradientEstimate(g_mean / S, g_ls / S, f0, g_B / S, rest)

    # --------------------------------------- f's prior and q part (kl = "sampled")
    def _prior_moments(self):
        """``model.prior_moments()``, kept while the engine has the same model (of the same size):
        (m0, v0) depend on the model's settings only. Read only."""
        return self._prior_parts()[0]

    def _prior_parts(self):
        """(prior_moments(), m0 is all 0, v0's one value or None, log v0): kept as
        :meth:`_prior_moments` says. Subtracting a zero mean and dividing by a constant array are
        then skipped or done with the scalar: the same numbers."""
        model, c = self.model, self._prior_cache
        if c is None or c[0] is not model or c[1] != model.n_params:
            pm = model.prior_moments()
            if pm is None:
                parts = (None, False, None, None)
            else:
                m0, v0 = pm
                c0 = float(v0[0]) if v0.size and np.all(v0 == v0[0]) else None
                parts = (pm, not np.any(m0), c0, np.log(v0))
            c = self._prior_cache = (model, model.n_params, parts)
        return c[2]

    def _kl_diagonal(self, mu, std, parts=None) -> float:
        """KL(q ‖ p0) of the mean field: :func:`gaussian_kl`'s arithmetic with its constant parts kept
        (``parts``: :meth:`_prior_parts`, taken now if None)."""
        pm, zero_mean, v0c, log_v0 = self._prior_parts() if parts is None else parts
        m0, v0 = pm
        var = std * std
        d2 = mu * mu if zero_mean else (mu - m0) ** 2
        t = (var + d2) / (v0 if v0c is None else v0c)
        t -= 1.0
        t -= np.log(var)
        t += log_v0
        return float(0.5 * t.sum())

    def _log_prior(self, W) -> np.ndarray:
        """log p0(w) for the rows of ``W``, shape (S,); 0 for a target without a separate prior
        (its log-likelihood is log p(w))."""
        W = np.atleast_2d(W)
        pm = self._prior_moments()
        if pm is None:
            return np.zeros(W.shape[0])
        m0, v0 = pm
        return -0.5 * np.sum((W - m0) ** 2 / v0 + np.log(v0) + _LOG_2PI, axis=1)

    def _grad_log_prior(self, W) -> np.ndarray:
        """∇_w log p0(w) for the rows of ``W``, shape (S, P)."""
        pm = self._prior_moments()
        if pm is None:
            return np.zeros_like(W)
        m0, v0 = pm
        return -(W - m0) / v0

    def _log_prior_coordinate(self, w, nodes) -> np.ndarray:
        """log p0(w with w_i at nodes[i, k]) − log p0(w), shape (P, K)."""
        pm, zero_mean, v0c, _ = self._prior_parts()
        if pm is None:
            return np.zeros_like(nodes)
        m0, v0 = pm
        if zero_mean and v0c is not None:
            return -0.5 * (nodes * nodes - (w * w)[:, None]) / v0c
        return -0.5 * ((nodes - m0[:, None]) ** 2 - ((w - m0) ** 2)[:, None]) / v0[:, None]

    def _coordinate_by_loglik(self, w, nodes, x) -> np.ndarray:
        P, K = nodes.shape
        W = np.repeat(w[None, :], P * K, axis=0).reshape(P, K, P)
        idx = np.arange(P)
        W[idx, :, idx] = nodes
        F = self.model.loglik(W.reshape(P * K, P), x)            # (P·K, n)
        return F.T.reshape(-1, P, K)

    def _prior_terms(self, lam, grad: bool = True):
        """(KL or −entropy, its gradient as a NatParams like λ): the exact part, to be subtracted.

        ``grad=False`` (``kl = "sampled"``: the gradient is estimated) skips the gradient and returns
        (KL, None) for a model with a prior (the full covariance's gradient is O(P³))."""
        mu = np.asarray(lam["mean"])
        P = mu.shape[0]
        pm = self._prior_moments()
        c = 0.5 * P * math.log(2 * math.pi * math.e)
        if self.covariance == "diagonal":
            std = np.exp(np.asarray(lam["log_std"]))
            if pm is not None and not grad:
                return self._kl_diagonal(mu, std), None
            if pm is None:
                H = float(np.sum(np.log(std))) + c
                return -H, NatParams(mean=np.zeros_like(mu), log_std=-np.ones_like(mu))
            m0, v0 = pm
            return gaussian_kl(mu, std, m0, v0), NatParams(mean=(mu - m0) / v0, log_std=std * std / v0 - 1.0)
        if self.covariance == "full":
            mu, s, A, IA, M, L = self._full_parts(lam)
            logdet = 2.0 * float(np.sum(np.log(s)))
            if pm is None:
                return -(0.5 * logdet + c), NatParams(mean=np.zeros(P), log_std=-np.ones(P),
                                                      coupling=np.zeros((P, P)))
            m0, v0 = pm
            kl = 0.5 * float(np.sum(L * L / v0[:, None]) + np.sum((mu - m0) ** 2 / v0) - P
                             + np.sum(np.log(v0)) - logdet)
            if not grad:
                return kl, None
            GL = L / v0[:, None]                                  # ∂ ½tr(V0⁻¹ L Lᵀ) / ∂L
            MtG = M.T @ GL
            return kl, NatParams(mean=(mu - m0) / v0, log_std=s * np.diag(MtG) - 1.0,
                                 coupling=np.tril(MtG @ L.T, -1))
        mu, sd, d, B, DB, Kinv, SinvB, diag_sinv, logdet = self._lowrank_parts(lam)
        if pm is None:
            return -(0.5 * logdet + c), NatParams(mean=np.zeros(P), log_std=-d * diag_sinv, factor=-SinvB)
        m0, v0 = pm
        kl = 0.5 * float(np.sum((d + np.sum(B * B, axis=1)) / v0) + np.sum((mu - m0) ** 2 / v0) - P
                         + np.sum(np.log(v0)) - logdet)
        return kl, NatParams(mean=(mu - m0) / v0, log_std=d / v0 - d * diag_sinv,
                             factor=B / v0[:, None] - SinvB)

    def covariance_matrix(self, lam) -> np.ndarray:
        """Σ of q as a (P, P) array (tests, benchmarks)."""
        if self.covariance == "full":
            L = self._full_parts(lam)[5]
            return L @ L.T
        var = np.exp(2.0 * np.asarray(lam["log_std"]))
        if self.covariance == "lowrank":
            B = np.asarray(lam["factor"])
            return np.diag(var) + B @ B.T
        return np.diag(var)

    def _chain_sigma(self, lam, g_cov) -> dict:
        """∂/∂(log σ, factor) from a symmetric ∂/∂Σ."""
        if self.covariance == "full":
            mu, s, A, IA, M, L = self._full_parts(lam)
            MtG = M.T @ (2.0 * g_cov @ L)
            return {"log_std": s * np.diag(MtG), "coupling": np.tril(MtG @ L.T, -1)}
        var = np.exp(2.0 * np.asarray(lam["log_std"]))
        out = {"log_std": 2.0 * var * np.diag(g_cov)}
        if self.covariance == "lowrank":
            out["factor"] = 2.0 * g_cov @ np.asarray(lam["factor"])
        return out

    def _scale(self, x, n_records):
        return 1.0 if x is None else float(self.n_total) / n_records

    def gradient(self, lam: NatParams, x, rng) -> tuple[NatParams, GradientEstimate, float]:
        """(ĝ of the ELBO, the estimate behind it, the stochastic ELBO value)."""
        g, est, scale, kl = self._gradient(lam, x, rng)
        if kl is None:
            kl = self._prior_terms(lam, grad=False)[0]
        return g, est, scale * float(np.sum(est.loglik)) - kl

    def _gradient(self, lam, x, rng):
        """(ĝ, the estimate, N/|S|, the KL term of the ELBO or None where ĝ did not need it)."""
        est = self.estimate(lam, x, rng)
        scale = self._scale(x, est.g_mean.shape[0])
        if est.g_rest is None:
            kl, dkl = self._prior_terms(lam)
        else:                                                    # kl = "sampled": + ∇E[log p0 − log q], sampled
            kl = dkl = None
        if est.g_both is not None and self._plain(lam):
            # the mean field's (mean, log σ) side by side: the same sums and differences on one array
            g = scale * est.g_both.sum(axis=0)
            if dkl is None:                                      # − (−rest) is + rest, to the bit
                P = est.g_mean.shape[1]
                g[:P] += est.g_rest["mean"]
                g[P:] += est.g_rest["log_std"]
            else:
                g -= dkl._flat
            return NatParams._wrap(lam._layout, g), est, scale, kl
        if dkl is None:
            dkl = NatParams({k: -np.asarray(v) for k, v in est.g_rest.items()})
        parts = {"mean": scale * est.g_mean.sum(axis=0) - dkl["mean"],
                 "log_std": scale * est.g_log_std.sum(axis=0) - dkl["log_std"]}
        if self.factor_key is not None:
            parts[self.factor_key] = scale * est.g_factor - dkl[self.factor_key]
        return NatParams(parts), est, scale, kl

    def _plain(self, lam) -> bool:
        """λ is a mean field's ``NatParams(mean, log_std)`` of two (P,) vectors in that order: its flat
        buffer is (μ, log σ) and the gradient and the step may be written on it directly."""
        if type(lam) is not NatParams:
            return False
        layout = lam._layout
        if layout is self._plain_layout:                         # seen before (states share it)
            return True
        if self.covariance != "diagonal" or not (
                len(layout) == 2 and layout[0][0] == "mean" and layout[1][0] == "log_std"
                and len(layout[0][1]) == 1 and len(layout[1][1]) == 1):
            return False
        self._plain_layout = layout
        return True

    def exact_gradient(self, lam: NatParams, x=None) -> NatParams:
        """∇ of the ELBO in closed form, for models with ``expected_loglik_grad`` (tests)."""
        x = self.model.check_batch(x) if x is not None else None
        mu, std = np.asarray(lam["mean"]), np.exp(np.asarray(lam["log_std"]))
        n = 1 if x is None else x.shape[0]
        scale = self._scale(x, n)
        _, dkl = self._prior_terms(lam)
        if self.covariance == "diagonal":
            gm, gs = self.model.expected_loglik_grad(mu, std, x)
            return NatParams(mean=scale * gm - dkl["mean"], log_std=scale * gs * std - dkl["log_std"])
        gm, gcov = self.model.expected_loglik_moment_grad(mu, self.covariance_matrix(lam), x)
        parts = {"mean": scale * gm - dkl["mean"]}
        for k, v in self._chain_sigma(lam, gcov).items():
            parts[k] = scale * v - dkl[k]
        return NatParams(parts)

    # --------------------------------------------------------------- update
    def update(self, state: EngineState, x) -> tuple[EngineState, UpdateInfo]:
        """One stochastic-gradient step on the minibatch ``x`` (None for a target):
        :meth:`gradient` at λ with the state's random stream, then :meth:`step_with`.

        Scale-out splits exactly here (:mod:`streamsvi.inference.split_gradient`): a worker
        sends ĝ, the applier takes the step with its own λ, moments and ρ_t.
        """
        if x is not None:
            x = self.model.check_batch(x)
        rng = self._take_rng(state)
        lam = state.lam
        g, est, scale, kl = self._gradient(lam, x, rng)
        S = 0 if x is None else x.shape[0]
        t = state.step + 1
        rho = self.schedule(t)
        new_lam, aux = self.step_with(lam, state.aux, g, t, rho)
        N = float(self.n_total)
        if est.g_both is not None and est.g_both.size <= _LAZY_MAX and kl is None and self._plain(lam):
            # the ELBO and the gradient's variance when first read (_LazyInfo): the same numbers
            parts = self._prior_parts()
            if parts[0] is not None:
                info = _LazyInfo._make(self, est, scale, lam, parts, N, step=t, rho=rho, batch_size=S,
                                       effective_batch_size=float(S), noise_std=0.0,
                                       grad_norm=math.sqrt(g.sqnorm()), gradient=g)
                return EngineState(step=t, lam=new_lam, rng_state=self._keep_rng(rng),
                                   records_seen=state.records_seen + S, aux=aux), info
        if kl is None:
            kl = self._prior_terms(lam, grad=False)[0]
        elbo = scale * float(np.sum(est.loglik)) - kl
        info = UpdateInfo(step=t, rho=rho, batch_size=S, effective_batch_size=float(S), noise_std=0.0,
                          elbo=elbo, elbo_per_record=elbo / N,
                          grad_variance=self.gradient_variance(est, x),
                          grad_norm=math.sqrt(g.sqnorm()), gradient=g)
        return EngineState(step=t, lam=new_lam, rng_state=self._keep_rng(rng),
                           records_seen=state.records_seen + S, aux=aux), info

    def _take_rng(self, state: EngineState) -> np.random.Generator:
        """The generator of ``state.rng_state``: the one :meth:`update` left at exactly that state
        (then taken out, so no other update draws from it), else a new one (``state.rng()``).
        Either draws the same numbers; the first saves building a generator per update."""
        d = state.rng_state
        kept = self._rngs.pop(id(d), None)
        if kept is not None and kept[0] is d:
            return kept[1]
        return state.rng()

    def _keep_rng(self, rng: np.random.Generator) -> dict:
        """``rng``'s state for the new EngineState, with ``rng`` kept for the update from it."""
        d = rng.bit_generator.state
        if len(self._rngs) > 8:
            self._rngs.clear()
        self._rngs[id(d)] = (d, rng)
        return d

    def step_with(self, lam: NatParams, aux: dict | None, g: NatParams, t: int,
                  rho: float) -> tuple[NatParams, dict | None]:
        """``(λ', aux')``: the optimiser's step t from λ along the ELBO gradient ``g``.

        ``rho`` is ρ_t (times a staleness factor on the applier); the step size is
        ``learning_rate · rho`` (module docs: natural, sgd, adam). ``aux`` holds Adam's
        moments (``adam_m``, ``adam_v``, updated with ĝ/N and bias-corrected by step t);
        the other optimisers return it as given. The one place the step is written:
        :meth:`update` and the scale-out applier (:mod:`.split_gradient`) both call it.
        Raises ``FloatingPointError`` if λ' would not be finite (nothing is changed).
        """
        step = self.learning_rate * rho
        if self._plain(lam) and type(g) is NatParams and g._layout == lam._layout:
            return self._step_plain(lam, aux, g, t, step)
        keys = list(lam)                                         # mean, log_std[, coupling | factor]
        gflat = np.concatenate([np.ravel(g[k]) for k in keys]) / float(self.n_total)
        if self.optimizer == "adam":
            delta, aux = _adam_step(aux, gflat, t, step)
        elif self.optimizer == "natural":
            sd = np.exp(np.asarray(lam["log_std"]))
            delta = np.concatenate([np.clip(step * sd * sd * g["mean"], -MAX_MEAN_STEP * sd, MAX_MEAN_STEP * sd),
                                    np.clip(step * 0.5 * g["log_std"], -MAX_LOG_STD_STEP, MAX_LOG_STD_STEP)])
        else:
            delta = step * gflat
        new, off = {}, 0
        for k in keys:
            v = np.asarray(lam[k])
            new[k] = v + delta[off:off + v.size].reshape(v.shape)
            off += v.size
        if "coupling" in new:
            new["coupling"] = np.tril(new["coupling"], -1)
        new_lam = NatParams(new)
        if not new_lam.all_finite():
            raise FloatingPointError(f"update {t} would make q non-finite; state left unchanged "
                                     f"(lower learning_rate)")
        return new_lam, aux

    def _step_plain(self, lam: NatParams, aux, g: NatParams, t: int, step: float):
        """:meth:`step_with` for the mean field's flat (μ, log σ): the same arithmetic on the
        flat buffers (clip as max then min: the same numbers for any ordered bounds)."""
        lf, gf = lam._flat, g._flat
        P = lf.shape[0] // 2
        if self.optimizer == "natural":
            sd = np.exp(lf[P:])
            delta = np.empty(2 * P)
            dm = step * sd
            dm *= sd
            dm *= gf[:P]
            lim = MAX_MEAN_STEP * sd
            np.maximum(dm, -lim, out=dm)
            np.minimum(dm, lim, out=delta[:P])
            dl = step * 0.5 * gf[P:]
            np.maximum(dl, -MAX_LOG_STD_STEP, out=dl)
            np.minimum(dl, MAX_LOG_STD_STEP, out=delta[P:])
        else:
            gflat = gf / float(self.n_total)
            if self.optimizer == "adam":
                delta, aux = _adam_step(aux, gflat, t, step)
            else:
                delta = step * gflat
        new = lf + delta
        if not np.isfinite(new).all():
            raise FloatingPointError(f"update {t} would make q non-finite; state left unchanged "
                                     f"(lower learning_rate)")
        return NatParams._wrap(lam._layout, new), aux

    def gradient_variance(self, est: GradientEstimate, x) -> float:
        """N² tr(Σ̂)/|S| from the records' gradient contributions (μ and log σ coordinates);
        NaN with fewer than two records."""
        return self._grad_variance(est, self._scale(x, est.g_mean.shape[0]))

    @staticmethod
    def _grad_variance(est: GradientEstimate, scale: float) -> float:
        n = est.g_mean.shape[0]
        if n < 2:
            return float("nan")
        C = est.g_both if est.g_both is not None else np.concatenate([est.g_mean, est.g_log_std], axis=1)
        # C.var(axis=0, ddof=1), written out as numpy's _var computes it (the same numbers)
        m = np.add.reduce(C, axis=0, keepdims=True)
        m /= n
        d = C - m
        d *= d
        v = np.add.reduce(d, axis=0)
        v /= n - 1
        tr = float(v.sum())
        return scale * scale * n * tr       # = N² tr Σ̂ / |S|

    def predictive_logpdf(self, state: EngineState, x) -> np.ndarray:
        return self.model.predictive_logpdf(state.lam, x)

    def fit(self, state: EngineState, X, n_steps: int, batch_size: int | None = None,
            callback=None) -> tuple[EngineState, list[UpdateInfo]]:
        """``n_steps`` updates on minibatches drawn without replacement from ``X`` (None: a target)."""
        if X is not None:
            X = self.model.check_batch(X)
            n = X.shape[0]
            if batch_size is not None and not (1 <= batch_size <= n):
                raise ValueError(f"batch_size must be in [1, {n}] or None, got {batch_size}")
        infos = []
        for _ in range(int(n_steps)):
            if X is None or batch_size is None or batch_size == X.shape[0]:
                xb = X
            else:
                rng = state.rng()
                idx = rng.choice(X.shape[0], size=batch_size, replace=False)
                state = replace(state, rng_state=rng.bit_generator.state)
                xb = X[np.sort(idx)]
            state, info = self.update(state, xb)
            infos.append(info)
            if callback is not None:
                callback(state, info)
        return state, infos

