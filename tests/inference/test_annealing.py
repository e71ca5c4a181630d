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


# ------------------------------------------------ issue 29: detAVI's variants
def _one_tempered_step(name, ann):
    """(new λ, λ̂ before tempering) of one batch step at ρ = 1 with annealer ``ann`` at t = 1."""
    model, X = CASES[name]()
    engine = SVI(model, n_total=len(X), schedule=Constant(1.0), annealer=ann)
    state = engine.state_from_params(model.random_init(np.random.default_rng(0), X, len(X)), seed=4)
    new, _ = engine.update(state, X)
    loc = model.local_step(state.lam, X, temperature=ann.level(1))
    return model, new, model.prior() + model.suffstats(loc, X)


@pytest.mark.parametrize("T0", [2.0, 5.0])
def test_concentration_tempering_is_alpha_over_T(T0):
    """dirichlet="concentration": every Dirichlet block of the target is exactly α/T; the
    default ("natural") is 1 + (α − 1)/T; the two differ by 1 − 1/T on every entry."""
    _, conc, tgt = _one_tempered_step("hmm", Deterministic(T0=T0, dirichlet="concentration"))
    _, nat, _ = _one_tempered_step("hmm", Deterministic(T0=T0))
    for k in ("init", "trans", "emit"):                  # every HMM block is a Dirichlet
        assert np.allclose(conc.lam[k], tgt[k] / T0, rtol=1e-12, atol=0)
        assert np.allclose(nat.lam[k], 1.0 + (tgt[k] - 1.0) / T0, rtol=1e-12, atol=0)
        assert np.allclose(nat.lam[k] - conc.lam[k], 1.0 - 1.0 / T0, rtol=1e-9)


def test_concentration_tempering_leaves_other_families_alone():
    """GMM: the weights' Dirichlet is α/T; the Normal–Wishart blocks are tempered as before."""
    model, conc, tgt = _one_tempered_step("gmm", Deterministic(T0=3.0, dirichlet="concentration"))
    _, nat, _ = _one_tempered_step("gmm", Deterministic(T0=3.0))
    dirichlet = [n for b in model.param_blocks for n in b.names if type(b.family).__name__ == "Dirichlet"]
    assert dirichlet
    for k in conc.lam:
        if k in dirichlet:
            assert np.allclose(conc.lam[k], tgt[k] / 3.0, rtol=1e-12, atol=0)
        else:
            assert np.array_equal(conc.lam[k], nat.lam[k]), k


def test_inverse_schedule_is_seed_002s_one_minus_rho():
    """schedule="inverse" with T0 = 1/(1 − r): T_t = (1 − r^t)^−1 (seed 002 §3.3), then 1."""
    a = Deterministic(T0=10.0, schedule="inverse")
    assert [a.level(t) for t in range(1, 101)] == pytest.approx([1 / (1 - 0.9 ** t) for t in range(1, 101)],
                                                                rel=1e-12)
    assert a.level(1) == pytest.approx(10.0) and a.level(2) == pytest.approx(1 / 0.19)
    assert a.level(101) == 1.0
    assert all(a.level(t) > a.level(t + 1) for t in range(1, 100))
    b = Deterministic(T0=3.0, schedule="inverse", rate=0.5, n_steps=10)   # other T0: T_1 = T0 still
    assert b.level(1) == pytest.approx(3.0) and 1 < b.level(10) < b.level(9)


def test_jitter_steps():
    cool = Deterministic(T0=5.0, n_steps=10, jitter=0.1)
    cross = Deterministic(T0=5.0, n_steps=10, jitter=0.1, jitter_at="crossing")
    assert [t for t in range(1, 20) if cool.jitters(t)] == list(range(1, 12))
    assert [t for t in range(1, 20) if cross.jitters(t)] == [11]
    lin = Deterministic(T0=3.0, schedule="linear", n_steps=10, jitter=0.1, jitter_at="crossing")
    assert [t for t in range(1, 20) if lin.jitters(t)] == [10]     # linear reaches T = 1 at t = n
    assert not any(Deterministic().jitters(t) for t in range(1, 200))          # off by default
    assert not any(Deterministic(T0=1.0, jitter=0.1).jitters(t) for t in range(1, 5))


def _det_run(ann, seed=4, steps=12):
    model, X = CASES["hmm"]()
    engine = SVI(model, n_total=len(X), schedule=Constant(1.0), annealer=ann)
    st = engine.state_from_params(model.random_init(np.random.default_rng(0), X, len(X)), seed=seed)
    for _ in range(steps):
        st, _ = engine.update(st, X)
    return st


def test_jitter_off_is_bit_identical_and_on_is_seeded():
    n = dict(T0=3.0, n_steps=8)
    plain = _det_run(Deterministic(**n))
    for off in (Deterministic(**n, jitter=0.0), Deterministic(**n, jitter=0.0, jitter_at="crossing")):
        st = _det_run(off)
        assert st.lam.array_equal(plain.lam) and st.rng_state == plain.rng_state
    on = Deterministic(**n, jitter=0.05)
    a, b, c = _det_run(on), _det_run(on), _det_run(on, seed=5)
    assert a.lam.array_equal(b.lam)                      # same seed, same result
    assert not a.lam.allclose(plain.lam, rtol=1e-6)      # it changes the run
    assert not a.lam.allclose(c.lam, rtol=1e-6)          # from the state's own stream


def test_jitter_is_multiplicative_of_size_eps_on_dirichlet_blocks():
    model, X = CASES["hmm"]()
    lam = model.random_init(np.random.default_rng(0), X, len(X))
    ann = Deterministic(jitter=0.05)
    rng_state = np.random.Generator(np.random.PCG64(7)).bit_generator.state
    out, new_state = ann.perturb_target(model, lam, 1, rng_state)
    logr = np.concatenate([np.log(out[k] / lam[k]).ravel() for k in lam])
    assert abs(logr.std() - 0.05) < 0.05 * 0.35          # K(1 + K + V) entries, a loose 35 % band
    assert new_state != rng_state
    assert lam.array_equal(model.random_init(np.random.default_rng(0), X, len(X)))   # input untouched
    same, st2 = ann.perturb_target(model, lam, 500, rng_state)                       # not a cooling step
    assert same is lam and st2 == rng_state


def test_jitter_is_refused_where_the_storage_steps_itself():
    model, X = CASES["lda"]()
    with pytest.raises(ValueError, match="dense path only"):
        SVI(model, n_total=len(X), annealer=Deterministic(jitter=0.01))
    SVI(model, n_total=len(X), annealer=Deterministic())          # the default still runs


@pytest.mark.parametrize("rho", [1.0, 0.4])
def test_lda_topics_tempered_to_alpha_over_T_through_the_scaled_columns(rho):
    """LDA's storage: a dense step (ρ = 1) and a sparse one on a minibatch (ρ < 1) both move the
    topics towards λ̂/T (concentration form) instead of 1 + (λ̂ − 1)/T."""
    model, X = CASES["lda"]()
    X = X[:6] if rho < 1 else X                               # a minibatch: only its columns are written
    N = 40
    T = 3.0
    lam0 = model.random_init(np.random.default_rng(0), X, N)
    out = {}
    for form in ("natural", "concentration"):
        eng = SVI(model, n_total=N, schedule=Constant(rho), annealer=Deterministic(T0=T, dirichlet=form))
        st = eng.state_from_params(lam0, seed=1)
        new, _ = eng.update(st, X)
        out[form] = model.lam_matrix(new.lam)
    loc = model.local_step(lam0, X, temperature=T)
    tgt = model.column_prior + (N / X.shape[0]) * model.suffstats(loc)["topic_word"]
    L0 = model.lam_matrix(lam0)
    assert np.allclose(out["concentration"], (1 - rho) * L0 + rho * tgt / T, rtol=1e-9)
    assert np.allclose(out["natural"], (1 - rho) * L0 + rho * (1 + (tgt - 1) / T), rtol=1e-9)


@pytest.mark.parametrize("d, msg", [
    ({"kind": "deterministic", "dirichlet": "alpha"}, "dirichlet \\(tempering of Dirichlet blocks\\) must be one of"),
    ({"kind": "deterministic", "jitter": -0.1}, "jitter \\(symmetry-breaking ε\\) must be a number in \\[0, inf\\)"),
    ({"kind": "deterministic", "jitter_at": "start"}, "jitter_at must be one of"),
    ({"kind": "deterministic", "schedule": "exp"}, "'geometric', 'linear', 'inverse'"),
])
def test_new_settings_say_what_is_wrong(d, msg):
    with pytest.raises(ValueError, match=msg):
        annealer_from_dict(d)


def test_new_settings_round_trip_and_defaults_stay_out_of_the_dict():
    a = Deterministic(T0=10.0, schedule="inverse", dirichlet="concentration", jitter=0.01, jitter_at="crossing")
    assert annealer_from_dict(a.to_dict()) == a
    assert Deterministic().to_dict() == {"kind": "deterministic", "T0": 5.0, "schedule": "geometric",
                                         "rate": 0.9, "n_steps": 100}


# ------------------------------------------------ issue 29: stochAVI's document-level restart
def _lda_run(ann, seed=3, steps=4):
    model, X = CASES["lda"]()
    engine = SVI(model, n_total=X.shape[0], schedule=Constant(1.0), annealer=ann)
    st = engine.state_from_params(model.random_init(np.random.default_rng(0), X, X.shape[0]), seed=seed)
    infos = []
    for _ in range(steps):
        st, info = engine.update(st, X)
        infos.append(info)
    return model, engine, st, infos


def test_document_restart_changes_the_run_and_is_seeded():
    model, eng, plain, plain_info = _lda_run(Stochastic())
    _, _, a, info = _lda_run(Stochastic(local_restart=True))
    _, _, b, _ = _lda_run(Stochastic(local_restart=True))
    _, _, c, _ = _lda_run(Stochastic(local_restart=True), seed=4)
    L = lambda st: model.lam_matrix(st.lam)                          # noqa: E731
    assert np.array_equal(L(a), L(b)) and a.rng_state == b.rng_state  # same seed, same run
    assert not np.allclose(L(a), L(plain), rtol=1e-6)                 # the restart changes it
    assert not np.allclose(L(a), L(c), rtol=1e-6)                     # drawn from the state's stream
    assert all(np.isfinite(i.elbo) for i in info)                     # the untempered, unrestarted ELBO
    assert info[0].elbo == plain_info[0].elbo                         # step 1's ELBO is at the same λ0


def test_document_restart_mixes_gamma_with_a_scaled_dirichlet_draw():
    model, X = CASES["lda"]()
    lam = model.random_init(np.random.default_rng(0), X, X.shape[0])
    loc = model.local_step(lam, X)
    out = model.restart_documents(loc, np.random.default_rng(1), 0.3)
    n, K = loc.gamma.shape
    eta = (out.gamma - 0.7 * loc.gamma) / 0.3
    c = float(X.sum()) / n
    assert np.allclose(eta.sum(axis=1), c / K) and (eta > 0).all()    # η_d = (c/K)·Dirichlet(1)
    # φ at the mixed γ: each occurrence's responsibilities sum to one, statistics keep the word counts
    assert model.suffstats(out)["topic_word"].sum() == pytest.approx(X.sum(), rel=1e-10)
    assert not np.allclose(model.suffstats(out)["topic_word"], model.suffstats(loc)["topic_word"])
    same, st = Stochastic(local_restart=True).restart_local(model, loc, 500, "s")   # ρ_t = 0: nothing drawn
    assert same is loc and st == "s"


def test_document_restart_is_refused_without_documents():
    model, X = CASES["hmm"]()
    with pytest.raises(ValueError, match="local_restart restarts LDA's document proportions"):
        SVI(model, n_total=len(X), annealer=Stochastic(local_restart=True))
    with pytest.raises(ValueError, match="local_restart must be true or false"):
        Stochastic(local_restart=1)
    assert annealer_from_dict(Stochastic(local_restart=True).to_dict()) == Stochastic(local_restart=True)
    assert "local_restart" not in Stochastic().to_dict()
