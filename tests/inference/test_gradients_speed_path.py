"""The fast update of the gradient path equals the plain computation, to the bit.

``GradientVI.update`` on the mean field shares work between steps (the LeGrad per-record
gradients in one (n, 2P) array, the step on λ's flat buffer, the random generator kept
between updates, the logistic model's coordinate and pivot log-likelihoods from one pass,
the ELBO and gradient variance computed when read). :func:`_reference_update` below is the
update written out the plain way, as the module docs state it (seed 001 Algorithm 1, the
natural / sgd / Adam steps, N² tr Σ̂ / |S|): every number must agree bit for bit.
"""
from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
from scipy.special import log_expit

from streamsvi.inference.engine import UpdateInfo
from streamsvi.inference.gradients import MAX_LOG_STD_STEP, MAX_MEAN_STEP, GradientVI
from streamsvi.inference.schedules import RobbinsMonro
from streamsvi.models.base import CoordinateLoglik
from streamsvi.models.logistic import BayesianLogisticRegression, SoftmaxRegression
from streamsvi.models.nonconjugate import gauss_hermite, gaussian_kl


def _rows(n, D, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = (X @ rng.normal(size=D) + 0.5 * rng.normal(size=n) > 0).astype(float)
    return np.column_stack([X, y])


def _bits(a) -> bytes:
    return np.ascontiguousarray(np.asarray(a, dtype=np.float64)).tobytes()


def _reference_gradient(engine, lam, x, rng):
    """(ĝ_μ, ĝ_log σ, per-record (n, 2P) contributions, N/|S|, the ELBO) of logistic regression,
    written out: LeGrad by the loops of seed 001, or the engine's own ReGrad / LdGrad estimate."""
    model = engine.model
    P = model.n_params
    mu, std = np.asarray(lam["mean"]), np.exp(np.asarray(lam["log_std"]))
    m0, v0 = np.zeros(P), np.full(P, model.prior_var)
    sampled = engine.kl == "sampled"
    if engine.estimator == "legrad":
        z, pi = gauss_hermite(engine.quadrature_points)
        X = x[:, :-1]
        Z = np.column_stack([X, np.ones(x.shape[0])]) if model.fit_intercept else X
        yt = 2.0 * x[:, -1] - 1.0
        S = engine.samples
        g_mean = g_ls = f0 = None
        rm = rl = 0.0
        for s in range(S):
            w = mu + std * rng.standard_normal(P)
            nodes = mu[:, None] + std[:, None] * z[None, :]
            A = (Z @ w)[:, None, None] + Z[:, :, None] * (nodes - w[:, None])[None, :, :]
            F = log_expit(A * yt[:, None, None])                          # log σ(ỹ a) at the nodes
            f = log_expit(yt[None, :] * (w[None, :] @ Z.T))[0]            # ... at the pivot
            F = F - f[:, None, None]
            gm = (F @ (pi * z)) / std[None, :]
            gl = F @ (pi * (z * z - 1.0))
            if sampled:
                H = -0.5 * ((nodes - m0[:, None]) ** 2 - ((w - m0) ** 2)[:, None]) / v0[:, None] \
                    + 0.5 * z[None, :] ** 2
                rm = rm + (H @ (pi * z)) / std
                rl = rl + H @ (pi * (z * z - 1.0))
            if s == 0:
                g_mean, g_ls, f0 = gm, gl, f
            else:
                g_mean, g_ls = g_mean + gm, g_ls + gl
        g_mean, g_ls = g_mean / S, g_ls / S
        rest = (rm / S, rl / S) if sampled else None
        loglik = f0
    else:                                                 # not rewritten: the estimator itself
        est = engine.estimate(lam, x, rng)
        g_mean, g_ls, loglik = est.g_mean, est.g_log_std, est.loglik
        rest = (est.g_rest["mean"], est.g_rest["log_std"]) if sampled else None
    scale = float(engine.n_total) / x.shape[0]
    kl = gaussian_kl(mu, std, m0, v0)
    if rest is None:
        dkl = ((mu - m0) / v0, std * std / v0 - 1.0)
    else:
        dkl = (-np.asarray(rest[0]), -np.asarray(rest[1]))
    gm_tot = scale * g_mean.sum(axis=0) - dkl[0]
    gl_tot = scale * g_ls.sum(axis=0) - dkl[1]
    elbo = scale * float(np.sum(loglik)) - kl
    return gm_tot, gl_tot, np.concatenate([g_mean, g_ls], axis=1), scale, elbo


def _reference_update(engine, state, x):
    """(λ', Adam moments, the rng state, elbo, grad_variance, grad_norm, ĝ) of one update."""
    lam = state.lam
    rng = state.rng()
    gm, gl, C, scale, elbo = _reference_gradient(engine, lam, x, rng)
    t = state.step + 1
    step = engine.learning_rate * engine.schedule(t)
    gflat = np.concatenate([gm, gl]) / float(engine.n_total)
    aux = state.aux
    if engine.optimizer == "natural":
        sd = np.exp(np.asarray(lam["log_std"]))
        delta = np.concatenate([np.clip(step * sd * sd * gm, -MAX_MEAN_STEP * sd, MAX_MEAN_STEP * sd),
                                np.clip(step * 0.5 * gl, -MAX_LOG_STD_STEP, MAX_LOG_STD_STEP)])
    elif engine.optimizer == "adam":
        m = 0.9 * aux["adam_m"] + (1 - 0.9) * gflat
        v = 0.999 * aux["adam_v"] + (1 - 0.999) * gflat * gflat
        mhat, vhat = m / (1 - 0.9 ** t), v / (1 - 0.999 ** t)
        delta = step * mhat / (np.sqrt(vhat) + 1e-8)
        aux = {"adam_m": m, "adam_v": v}
    else:
        delta = step * gflat
    P = gm.shape[0]
    new = np.concatenate([np.asarray(lam["mean"]) + delta[:P], np.asarray(lam["log_std"]) + delta[P:]])
    n = x.shape[0]
    gv = float("nan") if n < 2 else scale * scale * n * float(np.sum(C.var(axis=0, ddof=1)))
    g = np.concatenate([gm, gl])
    return new, aux, rng.bit_generator.state, elbo, gv, math.sqrt(float(np.dot(g, g))), g


def _same_update(engine, state, x):
    """One engine update against the reference; returns the engine's new state."""
    want = _reference_update(engine, state, x)
    new_state, info = engine.update(state, x)
    lam = new_state.lam
    assert _bits(np.concatenate([lam["mean"], lam["log_std"]])) == _bits(want[0])
    if want[1] is not None:
        assert _bits(new_state.aux["adam_m"]) == _bits(want[1]["adam_m"])
        assert _bits(new_state.aux["adam_v"]) == _bits(want[1]["adam_v"])
    assert new_state.rng_state == want[2]
    assert _bits(info.elbo) == _bits(want[3])
    assert _bits(info.elbo_per_record) == _bits(want[3] / float(engine.n_total))
    assert _bits(info.grad_variance) == _bits(want[4])
    assert _bits(info.grad_norm) == _bits(want[5])
    assert _bits(np.concatenate([info.gradient["mean"], info.gradient["log_std"]])) == _bits(want[6])
    return new_state


CONFIGS = {
    "default": ({}, {}, 16),
    "one record": ({}, {}, 1),
    "two records": ({}, {}, 2),
    "three pivots": ({"n_samples": 3}, {}, 16),
    "kl exact": ({"kl": "exact"}, {}, 16),
    "sgd": ({"optimizer": "sgd", "learning_rate": 0.3}, {}, 16),
    "adam": ({"optimizer": "adam", "learning_rate": 0.05}, {}, 16),
    "no intercept": ({}, {"fit_intercept": False}, 16),
    "prior_var 2.5": ({}, {"prior_var": 2.5}, 16),
    "K = 7": ({"quadrature_points": 7}, {}, 16),
    "regrad sampled": ({"estimator": "regrad", "kl": "sampled"}, {}, 16),
    "ldgrad": ({"estimator": "ldgrad"}, {}, 16),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_update_equals_the_plain_computation_to_the_bit(name):
    engine_kw, model_kw, S = CONFIGS[name]
    D = 6
    engine = GradientVI(BayesianLogisticRegression(n_features=D, **model_kw), n_total=5000.0,
                        schedule=RobbinsMonro(tau0=1.0, kappa=0.7), **engine_kw)
    x = _rows(S * 12, D, seed=3)
    state = engine.init(x[:S], seed=11)
    for i in range(12):                                   # a chain: the kept generator is used
        state = _same_update(engine, state, x[i * S:(i + 1) * S])


def test_mnist_sized_update_equals_the_plain_computation():
    engine = GradientVI(BayesianLogisticRegression(n_features=784), n_total=60_000.0)
    x = _rows(100 * 3, 784, seed=4)
    state = engine.init(x[:100], seed=2)
    for i in range(3):
        state = _same_update(engine, state, x[i * 100:(i + 1) * 100])


def test_the_kept_generator_is_used_only_from_its_own_state():
    """Two updates from one state draw the same numbers; a state rebuilt from a copy of the
    random state draws them too; a failed update leaves nothing behind."""
    engine = GradientVI(BayesianLogisticRegression(n_features=4), n_total=1000.0)
    x = _rows(32, 4, seed=5)
    s0 = engine.init(x[:16], seed=0)
    s1, _ = engine.update(s0, x[:16])
    a, _ = engine.update(s1, x[16:])
    b, _ = engine.update(s1, x[16:])                      # s1's generator was taken by the first
    c, _ = engine.update(copy.deepcopy(s1), x[16:])
    fresh = GradientVI(BayesianLogisticRegression(n_features=4), n_total=1000.0)
    d, _ = fresh.update(s1, x[16:])
    for other in (b, c, d):
        assert other.lam.array_equal(a.lam) and other.rng_state == a.rng_state
    # an update that fails after drawing leaves no generator behind at its state's numbers
    bad = GradientVI(BayesianLogisticRegression(n_features=4), n_total=1000.0, optimizer="sgd",
                     learning_rate=1e300)
    t = bad.init(x[:16], seed=0)
    with pytest.raises(FloatingPointError), np.errstate(over="ignore", invalid="ignore"):
        for _ in range(5):
            t, _ = bad.update(t, x[16:])
    assert t.step == 1                                    # the failing update's state came from update
    assert _bits(bad._take_rng(t).standard_normal(4)) == _bits(t.rng().standard_normal(4))


def test_metrics_read_late_or_copied_are_the_update_s():
    """The ELBO and gradient variance computed when read equal the plain computation's even
    when read after later updates; pickling and copies give a plain UpdateInfo with them."""
    engine = GradientVI(BayesianLogisticRegression(n_features=5), n_total=2000.0)
    x = _rows(16 * 4, 5, seed=6)
    state = engine.init(x[:16], seed=4)
    want = _reference_update(engine, state, x[:16])
    state, first = engine.update(state, x[:16])
    for i in range(1, 4):
        state, _ = engine.update(state, x[i * 16:(i + 1) * 16])
    assert (first.elbo, first.grad_variance, first.grad_norm) == (want[3], want[4], want[5])
    for clone in (pickle.loads(pickle.dumps(first)), copy.copy(first), copy.deepcopy(first)):
        assert type(clone) is UpdateInfo
        assert clone.to_dict() == first.to_dict()
        assert clone == first and first == clone and hash(clone) == hash(first)
    assert isinstance(first, UpdateInfo)
    with pytest.raises(AttributeError):
        first.no_such_field


def test_fused_coordinate_and_pivot_equal_the_two_calls():
    rng = np.random.default_rng(7)
    for model in (BayesianLogisticRegression(n_features=5), BayesianLogisticRegression(5, fit_intercept=False),
                  SoftmaxRegression(n_features=4, n_classes=3)):
        P = model.n_params
        n_classes = getattr(model, "n_classes", 2)
        X = rng.normal(size=(9, model.n_features))
        x = np.column_stack([X, rng.integers(0, n_classes, 9).astype(float)])
        w = rng.normal(size=P)
        nodes = w[:, None] + rng.normal(size=(P, 5))
        F, f = model.loglik_coordinate_and_pivot(w, nodes, x)
        assert _bits(F) == _bits(model.loglik_coordinate(w, nodes, x))
        assert _bits(f) == _bits(model.loglik(w[None, :], x)[0])
    assert SoftmaxRegression.loglik_coordinate_and_pivot is CoordinateLoglik.loglik_coordinate_and_pivot


def test_labels_are_still_checked():
    model = BayesianLogisticRegression(n_features=2)
    with pytest.raises(ValueError, match=r"labels must be 0 or 1; records \[1, 2\] have \[0.5, 2.0\]"):
        model.check_batch([[0.0, 1.0, 1.0], [1.0, 2.0, 0.5], [0.0, 0.0, 2.0]])
    with pytest.raises(ValueError, match="non-finite"):
        model.check_batch([[0.0, 1.0, np.nan]])
    assert model.check_batch([[0.0, 1.0, 1.0], [1.0, 2.0, 0.0]]).shape == (2, 3)
