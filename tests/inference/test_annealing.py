"""Annealers (streamsvi.inference.annealing): schedules, settings, refusals, tempering."""
import math

import numpy as np
import pytest

from streamsvi.inference import SVI, Constant
from streamsvi.inference.annealing import (Deterministic, NoAnnealing, Stochastic, SVIPlus,
                                           annealer_from_dict)
from tests.conftest import MODEL_CASES

CASES = dict(MODEL_CASES)


def test_deterministic_schedules():
    a = Deterministic(T0=5.0, rate=0.9, n_steps=100)
    assert a.level(1) == 5.0
    assert a.level(11) == pytest.approx(1 + 4 * 0.9 ** 10)
    assert a.level(100) > 1.0 and a.level(101) == 1.0
    lin = Deterministic(T0=3.0, schedule="linear", n_steps=10)
    assert [lin.level(t) for t in (5, 10, 11)] == [pytest.approx(2.0), 1.0, 1.0]
    assert all(a.level(t) >= a.level(t + 1) >= 1 for t in range(1, 120))


def test_stochastic_schedules_are_the_papers():
    geo = Stochastic()                                   # seed 002 §4: ρ_t = 0.9^t
    assert [geo.level(t) for t in (1, 2, 3)] == [pytest.approx(0.9 ** t) for t in (1, 2, 3)]
    assert geo.level(101) == 0.0
    hmm = Stochastic(rho0=0.25, schedule="linear", n_steps=50)   # seed 002 §4.2
    assert [hmm.level(t) for t in (1, 25, 50, 60)] == [pytest.approx(0.25 * (1 - t / 50)) for t in (1, 25)] + [0.0, 0.0]


def test_svi_plus_schedules():
    assert SVIPlus(10).effective_size(7, 100) == 10.0
    assert SVIPlus(10, schedule="linear", increment=5).effective_size(4, 100) == 30.0
    assert SVIPlus(10, schedule="linear", increment=5).effective_size(40, 100) == 100.0
    assert SVIPlus(10, schedule="geometric", growth=2.0).effective_size(3, 100) == 80.0
    assert SVIPlus(fraction=0.25).effective_size(1, 80) == 20.0


@pytest.mark.parametrize("ann", [NoAnnealing(), SVIPlus(5.0), SVIPlus(3.0, "linear", increment=2.5),
                                 SVIPlus(fraction=0.5), Deterministic(T0=2.0, schedule="linear", n_steps=7),
                                 Stochastic(rho0=0.3, decay=0.8, n_steps=9)])
def test_round_trip(ann):
    assert annealer_from_dict(ann.to_dict()) == ann


@pytest.mark.parametrize("d, msg", [
    ({"kind": "simulated"}, "annealing kind must be one of none, svi\\+, deterministic, stochastic"),
    ({"kind": "deterministic", "T": 5}, "unknown setting\\(s\\) \\['T'\\]"),
    ({"kind": "deterministic", "T0": 0.5}, "T0 \\(initial temperature\\) must be a number in \\[1, inf\\)"),
    ({"kind": "stochastic", "rho0": 1.5}, "rho0 must be a number in \\[0, 1\\]"),
    ({"kind": "stochastic", "schedule": "cosine"}, "schedule must be one of"),
    ({"kind": "svi+"}, "exactly one of M0"),
    ({"kind": "svi+", "M0": 5, "growth": 0.5, "schedule": "geometric"}, "growth must be"),
    ({"kind": "deterministic", "n_steps": 2.5}, "n_steps must be an integer"),
])
def test_bad_settings_say_what_is_wrong(d, msg):
    with pytest.raises(ValueError, match=msg):
        annealer_from_dict(d)


def test_annealer_and_effective_batch_size_are_refused_together():
    model, X = CASES["gmm"]()
    with pytest.raises(ValueError, match="not both"):
        SVI(model, n_total=100, effective_batch_size=5, annealer=SVIPlus(5))


def _entropy(p):
    p = np.clip(p, 1e-300, 1)
    return float(-(p * np.log(p)).sum())


@pytest.mark.parametrize("name", ["gmm", "gauss1d", "hmm", "lda"])
def test_temperature_raises_the_entropy_of_q_z(name):
    """detAVI: the local factors at T > 1 have more entropy than at T = 1, and T → ∞
    tends to the uniform q(z)."""
    model, X = CASES[name]()
    lam = model.init_params(np.random.default_rng(0), X, len(X))
    ents = []
    for T in (1.0, 2.0, 5.0):
        loc = model.local_step(lam, X, temperature=T)
        if name == "hmm":
            q = loc.gamma[loc.layout.valid]
        elif name == "lda":   # φ_dw of every (document, word) occurrence
            Xc = loc.x
            rows = np.repeat(np.arange(Xc.shape[0]), np.diff(Xc.indptr))
            q = loc.exp_theta[rows] * loc.exp_beta[:, Xc.indices].T
            q /= q.sum(axis=1, keepdims=True)
        else:
            q = loc.resp
        assert np.allclose(q.sum(axis=-1), 1.0)
        ents.append(_entropy(q))
    assert ents[0] < ents[1] < ents[2], ents


def test_temper_keeps_lambda_in_the_domain():
    for name in ("gmm", "gmm_dp", "gauss1d", "hmm", "lda"):
        model, X = CASES[name]()
        lam = model.init_params(np.random.default_rng(1), X, len(X))
        for T in (1.5, 10.0, 1e6):
            assert model.in_domain(model.temper(lam, T)), (name, T)


def test_deterministic_batch_vi_is_eq_8():
    """ρ = 1 on the full batch: λ = temper(η + Σ_n E_q_T[t], T_1) (seed 002 eq. 8 for
    the global factor, the local factors at T_1)."""
    model, X = CASES["gauss1d"]()
    engine = SVI(model, n_total=len(X), schedule=Constant(1.0), annealer=Deterministic(T0=3.0))
    state = engine.init(X, seed=0)
    new, info = engine.update(state, X)
    loc = model.local_step(state.lam, X, temperature=3.0)
    expect = (model.prior() + model.suffstats(loc, X)) * (1 / 3.0)
    assert new.lam.allclose(expect, rtol=1e-13)
    assert info.temperature == 3.0 and math.isfinite(info.elbo)


@pytest.mark.parametrize("T", [1.5, 4.0])
def test_lda_compiled_tempered_kernel_matches_numpy(T):
    """The C kernel's tempered local step (inv_t = 1/T, held topics) and the numpy sweep
    reach the same γ and statistics, with the same sweeps."""
    from streamsvi.models import LDA
    from streamsvi.models.lda import COMPILED

    if not COMPILED:
        pytest.skip("the compiled LDA kernel is not built here")
    rng = np.random.default_rng(3)
    K, V = 20, 300
    topics = rng.dirichlet(np.full(V, 0.05), size=K)
    docs = np.stack([rng.multinomial(80, rng.dirichlet(np.full(K, 0.1)) @ topics) for _ in range(120)])
    model = LDA(K, V, doc_topic_prior=0.05, topic_word_prior=0.05)
    lam = model.init_params(np.random.default_rng(0), docs, 120)
    a = model.local_step(lam, docs, temperature=T)
    model._local_path = "blocked"
    try:
        b = model.local_step(lam, docs, temperature=T)
    finally:
        model._local_path = None
    assert np.allclose(a.gamma, b.gamma, rtol=1e-9, atol=1e-9)
    assert model.suffstats(a).allclose(model.suffstats(b), rtol=1e-9, atol=1e-9)
    assert np.array_equal(a.n_iter, b.n_iter)
