"""Issue 25: the gradient path split for scale-out (:mod:`streamsvi.inference.split_gradient`).

A worker's contribution (ĝ at its λ version) sent through the deltas codec and
applied by the applier's optimiser step is :meth:`GradientVI.update` with the
same draws, bit for bit, for logistic and softmax regression, every optimiser
and every covariance the gradient path has; Adam's moments are the applier's
state. A stale gradient (its λ version more than the bound behind) takes the
applier's staleness policy (the applier on the real broker, in
``tests/service/test_scaleout_gradient.py``).
"""
import copy
from dataclasses import replace

import numpy as np
import pytest

from streamsvi.inference import split
from streamsvi.inference.gradients import GradientVI
from streamsvi.inference.schedules import RobbinsMonro
from streamsvi.inference.split_gradient import MAX_STALENESS, GradientSplitter
from streamsvi.models.logistic import BayesianLogisticRegression, SoftmaxRegression
from streamsvi.service.roles.transport import Delta

N, B = 600, 60


def _data(kind, seed=0, n=N, d=5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    if kind == "logistic":
        w = rng.normal(size=d)
        y = (rng.random(n) < 1 / (1 + np.exp(-(X @ w)))).astype(float)
        return BayesianLogisticRegression(d, prior_var=2.0), np.column_stack([X, y])
    W = rng.normal(size=(3, d))
    logits = X @ W.T
    y = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1).astype(float)
    return SoftmaxRegression(d, n_classes=3, prior_var=2.0), np.column_stack([X, y])


def _wire(c, version, first):
    """``c`` encoded as a delta message and decoded again, as the applier reads it."""
    raw = Delta(worker="w", version=version, ranges=[("t", 0, first, first + B)], records=c.records,
                stats=c.arrays, min_weight=c.min_weight, n_total=float(N), extra=c.meta).encode()
    d = Delta.decode(raw)
    return split.Contribution(arrays=d.stats, records=d.records, min_weight=d.min_weight, meta=d.extra), raw


CASES = [("natural", "diagonal", "legrad"), ("adam", "diagonal", "legrad"), ("sgd", "diagonal", "legrad"),
         ("natural", "diagonal", "regrad"), ("adam", "diagonal", "ldgrad"),
         ("adam", "full", "regrad"), ("sgd", "full", "legrad"),
         ("adam", "lowrank", "legrad"), ("sgd", "lowrank", "regrad")]


@pytest.mark.parametrize("kind", ["logistic", "softmax"])
@pytest.mark.parametrize("optimizer, covariance, estimator", CASES)
def test_a_split_gradient_update_is_the_update(kind, optimizer, covariance, estimator):
    model, X = _data(kind)
    engine = GradientVI(model, n_total=N, estimator=estimator, optimizer=optimizer, covariance=covariance,
                        rank=2 if covariance == "lowrank" else None, learning_rate=0.5,
                        schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
    assert split.storage_kind(engine) == "gradient" and split.why_not(engine) is None
    assert isinstance(split.splitter_for(engine), GradientSplitter)
    state = engine.init(X[:B], seed=5)
    applied, single = copy.deepcopy(state), copy.deepcopy(state)
    for i in range(N // B):
        x = X[B * i:B * (i + 1)]
        draws = split.batch_rng_state(7, "t", 0, B * i)
        c, raw = _wire(split.contribution(engine, applied, x, draws), applied.step, B * i)
        assert all(a.dtype == np.float64 for a in c.arrays.values())
        applied, done = split.apply(engine, applied, c)
        single, info = engine.update(replace(single, rng_state=draws), x)
        assert applied.step == single.step == done.step == i + 1
        assert applied.records_seen == single.records_seen == B * (i + 1) and done.records == B
        assert applied.lam.array_equal(single.lam), f"update {i + 1}"
        if optimizer == "adam":       # the moments are the applier's state, stepped identically
            assert sorted(applied.aux) == ["adam_m", "adam_v"]
            for k in applied.aux:
                assert np.array_equal(applied.aux[k], single.aux[k]), (k, i)
        else:
            assert applied.aux is None and single.aux is None
        # what the metrics need travels in the delta: the same values one process reports
        assert (done.rho, done.elbo) == (info.rho, info.elbo)
        assert c.meta["grad_variance"] == info.grad_variance and c.meta["grad_norm"] == info.grad_norm
    assert not applied.lam.array_equal(state.lam)
    # the applier's random stream is its own (the worker's draws were the batch's)
    assert applied.rng_state == state.rng_state


def test_delta_size_is_the_gradient_and_a_small_header():
    """Bytes per delta: 8 bytes per λ coordinate (2P for the mean field) plus the JSON header."""
    sizes = {}
    for name, model in (("logistic", BayesianLogisticRegression(50)),
                        ("softmax", SoftmaxRegression(50, n_classes=10))):
        rng = np.random.default_rng(1)
        y = rng.integers(0, model.n_classes, 200)
        X = np.column_stack([rng.normal(size=(200, 50)), y])
        engine = GradientVI(model, n_total=1e5)
        state = engine.init(X, seed=0)
        c = split.contribution(engine, state, X, split.batch_rng_state(0, "t", 0, 0))
        _, raw = _wire(c, 0, 0)
        body = 2 * model.n_params * 8
        assert body < len(raw) < body + 600, (name, len(raw))
        sizes[name] = len(raw)
    print(f"bytes per delta: {sizes}")      # logistic D = 50: P = 51; softmax C = 10: P = 510


def test_apply_refuses_a_gradient_that_does_not_fit():
    model, X = _data("logistic")
    engine = GradientVI(model, n_total=N, optimizer="adam")
    state = engine.init(X[:B], seed=0)
    c = split.contribution(engine, state, X[:B], split.batch_rng_state(0, "t", 0, 0))
    full = GradientVI(model, n_total=N, optimizer="adam", covariance="full", estimator="regrad")
    with pytest.raises(ValueError, match="do not match the state's"):
        split.apply(full, full.init(X[:B], seed=0), c)
    short = split.Contribution(arrays={**c.arrays, "mean": c.arrays["mean"][:-1]}, records=B)
    with pytest.raises(ValueError, match="'mean'"):
        split.apply(engine, state, short)
    with pytest.raises(ValueError, match="no Adam moments"):
        split.apply(engine, replace(state, aux=None), c)
    bad = split.Contribution(arrays={k: np.full_like(v, np.inf) for k, v in c.arrays.items()}, records=B)
    nat = GradientVI(model, n_total=N, optimizer="sgd")
    with pytest.raises(FloatingPointError, match="state left unchanged"):
        split.apply(nat, nat.init(X[:B], seed=0), bad)


def test_a_stale_gradient_takes_a_shorter_step():
    """``rho_scale`` (the applier's downweight factor bound/staleness) multiplies ρ_t, for every
    optimiser: the natural and sgd steps scale with it, Adam's step shrinks while its moments
    take the gradient as they would at full weight."""
    model, X = _data("softmax")
    for optimizer in ("natural", "sgd", "adam"):
        engine = GradientVI(model, n_total=N, optimizer=optimizer, learning_rate=0.1)
        state = engine.init(X[:B], seed=0)
        c = split.contribution(engine, state, X[:B], split.batch_rng_state(0, "t", 0, 0))
        full, a = split.apply(engine, state, c)
        half, b = split.apply(engine, state, c, 0.5)
        assert b.rho == 0.5 * a.rho
        d_full = full.lam["mean"] - state.lam["mean"]
        d_half = half.lam["mean"] - state.lam["mean"]
        np.testing.assert_allclose(d_half, 0.5 * d_full, rtol=1e-9, atol=1e-15)
        if optimizer == "adam":
            for k in full.aux:
                assert np.array_equal(full.aux[k], half.aux[k])
    assert GradientSplitter.max_staleness == MAX_STALENESS == 4
