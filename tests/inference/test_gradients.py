"""The gradient path (seed 001): unbiased estimators, LeGrad ≤ ReGrad variance, exact resume."""
from __future__ import annotations

import numpy as np
import pytest

from streamsvi.inference import Constant, RobbinsMonro, load_state, save_state
from streamsvi.inference.gradients import ESTIMATORS, GradientVI
from streamsvi.models.logistic import BayesianLogisticRegression, CorrelatedGaussianTarget
from streamsvi.models.nonconjugate import gaussian_params


def _q(P, seed):
    rng = np.random.default_rng(seed)
    return gaussian_params(rng.normal(1.0, 1.0, P), rng.normal(-1.0, 0.3, P))


def _labelled(n=40, D=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ np.arange(1.0, D + 1) - 0.5)))).astype(float)
    return np.column_stack([X, y])


def _draws(engine, lam, x, M, seed):
    """M independent gradient estimates, flattened (mean then log_std), shape (M, 2P)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(M):
        g, _, _ = engine.gradient(lam, x, rng)
        out.append(np.concatenate([g["mean"], g["log_std"]]))
    return np.array(out)


CASES = {
    "gaussian_target": (lambda: CorrelatedGaussianTarget(n_dims=20), None, 1.0),
    "logistic": (lambda: BayesianLogisticRegression(n_features=3, prior_var=2.0), _labelled(), 1000.0),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_estimator_is_unbiased(case, estimator):
    """Mean of many gradients = the closed-form ELBO gradient, within 5 standard errors per
    coordinate (plus 1e-9 relative for round-off). The references: the Gaussian target's
    ELBO is quadratic; logistic regression's expected log-likelihood is a 1-D Gaussian
    integral per record, computed with 80 Gauss–Hermite nodes (exact to round-off)."""
    make, x, N = CASES[case]
    model = make()
    engine = GradientVI(model, n_total=N, estimator=estimator,
                        n_samples=50 if estimator == "ldgrad" else None)
    lam = _q(model.n_params, seed=3)
    exact = engine.exact_gradient(lam, x)
    exact = np.concatenate([exact["mean"], exact["log_std"]])
    G = _draws(engine, lam, x, M=2000 if estimator != "ldgrad" else 600, seed=11)
    mean, se = G.mean(axis=0), G.std(axis=0, ddof=1) / np.sqrt(G.shape[0])
    assert np.all(np.abs(mean - exact) <= 5 * se + 1e-9 * np.abs(exact) + 1e-12), \
        (estimator, np.max(np.abs(mean - exact) / (se + 1e-300)))


def test_a_biased_estimate_fails_the_unbiasedness_check():
    """The check above can fail: the plug-in gradient at the mean (no sampling) is biased
    for logistic regression's σ-gradient, and the same tolerance catches it."""
    model = BayesianLogisticRegression(n_features=3, prior_var=2.0)
    x = _labelled()
    engine = GradientVI(model, n_total=1000.0, estimator="regrad")
    lam = _q(model.n_params, seed=3)
    exact = engine.exact_gradient(lam, x)
    G = _draws(engine, lam, x, M=2000, seed=11)
    se = G.std(axis=0, ddof=1) / np.sqrt(G.shape[0])
    # the plug-in: ∇ log p(y | w = μ), with no dependence on σ except through the KL
    mu = np.asarray(lam["mean"])
    plug = 1000.0 / x.shape[0] * model.grad_loglik(mu[None, :], x)[0].sum(axis=0) - mu / 2.0
    assert np.any(np.abs(plug - exact["mean"]) > 5 * se[:model.n_params])


@pytest.mark.parametrize("coordinate", [0, 9])
def test_legrad_variance_at_most_regrad_on_gaussian_target(coordinate):
    """Seed 001 §3.2 (Rao–Blackwellisation): Var(LeGrad) ≤ Var(ReGrad) for every parameter;
    on the target LeGrad's ∂log σ is even exact (5-node quadrature of a quadratic)."""
    model = CorrelatedGaussianTarget(n_dims=20)
    lam = _q(20, seed=5)
    var = {}
    for est in ("legrad", "regrad"):
        G = _draws(GradientVI(model, n_total=1, estimator=est), lam, None, M=3000, seed=7)
        var[est] = G.var(axis=0, ddof=1)
    assert var["legrad"][coordinate] <= var["regrad"][coordinate]
    assert np.all(var["legrad"] <= var["regrad"] * 1.05)         # every parameter, 5% sampling slack
    assert np.max(var["legrad"][20:]) < 1e-20                     # ∂log σ exact for a Gaussian f


def test_legrad_generic_path_matches_model_shortcut():
    """Without ``loglik_coordinate`` the engine evaluates the P·K points itself: same numbers."""
    model = BayesianLogisticRegression(n_features=3)
    x = _labelled()
    eng = GradientVI(model, n_total=100.0)
    lam = _q(model.n_params, seed=1)
    w = np.asarray(lam["mean"]) + 0.3
    nodes = w[:, None] + np.linspace(-1, 1, 5)[None, :]
    np.testing.assert_allclose(eng._coordinate_by_loglik(w, nodes, x),
                               model.loglik_coordinate(w, nodes, x), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("optimizer", ["natural", "sgd", "adam"])
def test_save_load_resume_is_exact(tmp_path, optimizer):
    """10 updates in one go = 5 updates, save, load, 5 more: bit for bit (λ, Adam moments, rng)."""
    model = BayesianLogisticRegression(n_features=3)
    X = _labelled(n=200, seed=2)
    eng = GradientVI(model, n_total=200.0, optimizer=optimizer, learning_rate=0.1,
                     schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
    s0 = eng.init(X, seed=4)
    straight, _ = eng.fit(s0, X, n_steps=10, batch_size=20)
    half, _ = eng.fit(s0, X, n_steps=5, batch_size=20)
    save_state(tmp_path / "s.npz", eng, half)
    eng2, loaded = load_state(tmp_path / "s.npz")
    assert isinstance(eng2, GradientVI) and eng2.to_dict() == eng.to_dict()
    resumed, _ = eng2.fit(loaded, X, n_steps=5, batch_size=20)
    assert resumed.lam.array_equal(straight.lam)
    assert resumed.rng_state == straight.rng_state and resumed.step == 10
    if optimizer == "adam":
        assert np.array_equal(resumed.aux["adam_v"], straight.aux["adam_v"])


def test_logistic_fit_recovers_the_weights_and_beats_chance():
    rng = np.random.default_rng(0)
    w_true = np.array([2.0, -1.0, 0.5])
    X = rng.normal(size=(2000, 3))
    y = (rng.random(2000) < 1 / (1 + np.exp(-(X @ w_true + 0.3)))).astype(float)
    data = np.column_stack([X, y])
    model = BayesianLogisticRegression(n_features=3)
    eng = GradientVI(model, n_total=2000.0)          # defaults: LeGrad, natural-gradient RM steps
    state, infos = eng.fit(eng.init(data, seed=0), data, n_steps=300, batch_size=100)
    mean = state.lam["mean"]
    assert np.allclose(mean[:3], w_true, atol=0.3) and abs(mean[3] - 0.3) < 0.3
    assert np.mean([i.elbo for i in infos[-20:]]) > infos[0].elbo + 100
    p = model.predict_proba(state.lam, X)
    assert np.mean((p > 0.5) == y) > 0.75


def test_bad_settings_are_refused_with_their_name():
    model = CorrelatedGaussianTarget(n_dims=3)
    for kw, word in (({"estimator": "bbvi"}, "estimator"), ({"optimizer": "rmsprop"}, "optimizer"),
                     ({"n_samples": 0}, "n_samples"), ({"learning_rate": -1.0}, "learning_rate"),
                     ({"quadrature_points": 1}, "quadrature_points")):
        with pytest.raises(ValueError, match=word):
            GradientVI(model, n_total=1, **kw)


def test_target_converges_to_the_known_optimum():
    """Seed 001 §4.1: the mean-field optimum has μ = 2 and σ_i² = 1/(Σ⁻¹)_ii."""
    model = CorrelatedGaussianTarget(n_dims=20)
    eng = GradientVI(model, n_total=1, estimator="legrad", optimizer="adam", learning_rate=0.05,
                     schedule=Constant(1.0))
    state, _ = eng.fit(eng.init(None, seed=0), None, n_steps=3000)
    np.testing.assert_allclose(np.exp(2 * state.lam["log_std"]), 1 / np.diag(model.Prec), rtol=0.05)
    assert abs(float(np.mean(state.lam["mean"])) - 2.0) < 0.2


def test_every_gradient_path_model_has_a_case():
    """A model registered for the gradient path (it has ``prior_moments``) is checked above."""
    from streamsvi.models import MODELS

    gradient_models = {name for name, cls in MODELS.items() if hasattr(cls, "prior_moments")}
    covered = {make().name for make, _, _ in CASES.values()} | {"softmax"}   # softmax: tests below
    assert gradient_models and gradient_models <= covered


def _three_classes(n=60, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.normal(size=(n, 2)) + np.array([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])[y]
    return np.column_stack([X, y])


def test_softmax_estimators_agree_and_shortcut_matches():
    """E_q[log softmax] has no closed form: the three unbiased estimators must agree with each
    other (means within 5 combined standard errors), and the closed-form coordinate shortcut
    must equal the engine's generic P·K evaluations."""
    from streamsvi.models.logistic import SoftmaxRegression

    model = SoftmaxRegression(n_features=2, n_classes=3, prior_var=2.0)
    x = _three_classes()
    lam = _q(model.n_params, seed=8)
    eng = GradientVI(model, n_total=600.0)
    w = np.asarray(lam["mean"]) + 0.2
    nodes = w[:, None] + np.linspace(-1, 1, 5)[None, :]
    np.testing.assert_allclose(eng._coordinate_by_loglik(w, nodes, x), model.loglik_coordinate(w, nodes, x),
                               rtol=1e-10, atol=1e-10)
    stats = {}
    for est in ESTIMATORS:
        G = _draws(GradientVI(model, n_total=600.0, estimator=est, n_samples=40 if est == "ldgrad" else None),
                   lam, x, M=1500 if est != "ldgrad" else 600, seed=21)
        stats[est] = (G.mean(axis=0), G.var(axis=0, ddof=1) / G.shape[0])
    (ma, va), (mb, vb), (mc, vc) = stats["legrad"], stats["regrad"], stats["ldgrad"]
    assert np.all(np.abs(ma - mb) <= 5 * np.sqrt(va + vb) + 1e-9)
    assert np.all(np.abs(ma - mc) <= 5 * np.sqrt(va + vc) + 1e-9)
    assert np.all(va <= vb * 1.1)                                  # Rao–Blackwell, 10% sampling slack


def test_softmax_fit_classifies_three_clusters():
    from streamsvi.models.logistic import SoftmaxRegression

    data = _three_classes(n=900, seed=1)
    model = SoftmaxRegression(n_features=2, n_classes=3)
    eng = GradientVI(model, n_total=900.0)
    state, _ = eng.fit(eng.init(data, seed=0), data, n_steps=200, batch_size=90)
    test = _three_classes(n=300, seed=2)
    p = model.predict_proba(state.lam, test[:, :2])
    assert np.allclose(p.sum(axis=1), 1.0) and np.mean(p.argmax(axis=1) == test[:, 2]) > 0.85
