"""Hierarchical Poisson factorisation (streamsvi/models/hpf.py).

The shared checks (tests/models/test_checks.py, case ``hpf``) cover: ρ = 1 on
the full batch is one CAVI sweep bit for bit, SVI+ with M = |S| is SVI bit
for bit, same seed → same bits, additive statistics, snapshots round-trip
and resume exactly, λ stays in its domain under strong SVI+ noise, refusal
of the annealing kinds it does not declare. Here: what is HPF's own.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from scipy.special import gammaln

from streamsvi.inference import SVI, Constant, RobbinsMonro, batch_vi, load_state, save_state
from streamsvi.models import HPF, MODELS, Ratings
from streamsvi.models.hpf import sample_counts as hpf_counts

ROOT = Path(__file__).resolve().parents[2]


def planted(n_users=90, n_items=60, K=3, seed=0, strength=3.0):
    """Users and items in K groups; a user consumes items of its own group at rate ``strength``,
    others at rate 0.05. Every (user, item) pair is a Poisson draw; the non-zero counts are the data."""
    rng = np.random.default_rng(seed)
    gu, gi = np.arange(n_users) % K, np.arange(n_items) % K
    rate = np.where(gu[:, None] == gi[None, :], strength, 0.05)
    y = rng.poisson(rate)
    u, i = np.nonzero(y)
    return Ratings(u, i, y[u, i]), gu, gi, rate


def test_registered_with_its_record_kind():
    assert MODELS["hpf"] is HPF
    assert HPF.record_kind == "ratings"


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_cavi_elbo_is_monotone(seed):
    x, *_ = planted(seed=seed)
    engine = batch_vi(HPF(n_factors=3), len(x))
    state, infos = engine.fit(engine.init(x, seed=seed), x, n_steps=60)
    elbo = np.array([i.elbo for i in infos])
    assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:])), np.diff(elbo).min()
    assert elbo[-1] > elbo[0] + 100


def test_recovers_planted_groups():
    """After 150 CAVI sweeps on 3 planted groups: every user's and item's largest factor names its
    group (a permutation of the factors), and the posterior mean rates are within 25 % of the
    true rate on average over the within-group pairs (the Poisson noise of one pair's count)."""
    x, gu, gi, rate = planted(seed=3)
    model = HPF(n_factors=3)
    engine = batch_vi(model, len(x))
    state, _ = engine.fit(engine.init(x, seed=0), x, n_steps=150)
    lam, aux = state.lam, state.aux
    ur = model.rows_of(aux, "user", np.arange(len(gu)))
    ir = model.rows_of(aux, "item", np.arange(len(gi)))
    Eu = (lam["user_shape"] / lam["user_rate"])[ur]
    Ei = (lam["item_shape"] / lam["item_rate"])[ir]
    cu, ci = Eu.argmax(1), Ei.argmax(1)
    perm = {g: np.bincount(cu[gu == g], minlength=3).argmax() for g in range(3)}
    assert sorted(perm.values()) == [0, 1, 2]
    assert np.mean([perm[g] == c for g, c in zip(gu, cu)]) == 1.0
    assert np.mean([perm[g] == c for g, c in zip(gi, ci)]) == 1.0
    mu = Eu @ Ei.T
    same = gu[:, None] == gi[None, :]
    assert np.mean(np.abs(mu[same] - rate[same]) / rate[same]) < 0.25
    assert np.mean(mu[~same]) < 0.2


def test_elbo_matches_monte_carlo():
    """model.elbo against an independent Monte-Carlo estimate of the same bound: (ξ, θ, η, β) drawn
    from q, log densities from scipy.stats, the Poisson term over every pair (zeros too) through the
    auxiliary z (φ from local_step). 20,000 draws; tolerance 5 standard errors."""
    x = Ratings(["a", "a", "b", "c"], ["m", "n", "n", "m"], [2.0, 1.0, 3.0, 1.0])
    model = HPF(n_factors=2, theta_shape=0.7, activity_shape=0.5, activity_mean=2.0, beta_shape=0.4,
                popularity_shape=0.9, popularity_mean=0.5)
    engine = batch_vi(model, len(x))
    state, _ = engine.fit(engine.init(x, seed=1), x, n_steps=3)
    lam, aux = state.lam, state.aux
    exact = model.elbo(lam, aux, x)
    loc = model.local_step(lam, x, aux)
    rng = np.random.default_rng(0)
    n = 20_000
    total = np.zeros(n)
    draws = {}
    for side, act, a, a0, m0 in (("user", "user_hyper", 0.7, 0.5, 2.0), ("item", "item_hyper", 0.4, 0.9, 0.5)):
        shp, rte, arate = lam[f"{side}_shape"], lam[f"{side}_rate"], lam[act]
        A = a0 + 2 * a
        xi = rng.gamma(A, 1.0 / arate, size=(n,) + arate.shape)
        th = rng.gamma(shp, 1.0 / rte, size=(n,) + shp.shape)
        total += stats.gamma.logpdf(xi, a0, scale=m0 / a0).sum(1)
        total += stats.gamma.logpdf(th, a, scale=1.0 / xi[:, :, None]).sum((1, 2))
        total -= stats.gamma.logpdf(xi, A, scale=1.0 / arate).sum(1)
        total -= stats.gamma.logpdf(th, shp, scale=1.0 / rte).sum((1, 2))
        draws[side] = th
    total -= np.einsum("nuk,nik->n", draws["user"], draws["item"])        # every pair's −θᵀβ
    u, i, y, phi = loc["urows"], loc["irows"], x.rating, loc["phi"]
    lt = np.log(draws["user"][:, u, :]) + np.log(draws["item"][:, i, :]) - np.log(phi)[None]
    total += np.einsum("r,rk,nrk->n", y, phi, lt) - gammaln(y + 1).sum()
    se = total.std(ddof=1) / np.sqrt(n)
    assert abs(total.mean() - exact) < 5 * se, (total.mean(), exact, se)


def test_running_totals_match_the_rows():
    """Σ_u E[θ_u] and Σ_i E[β_i], kept by the engine's row storage by differences over 60
    minibatch steps (new ids arriving), equal the sums over the rows to 1e-10 relative."""
    x = hpf_counts(n_users=60, n_items=40, seed=2)
    model = HPF(n_factors=3)
    engine = SVI(model, n_total=len(x), schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
    state = engine.init(x[np.arange(30)], seed=0)
    rng = np.random.default_rng(0)
    for _ in range(60):
        state, _ = engine.update(state, x[np.sort(rng.choice(len(x), 50, replace=False))])
    lam, aux = state.lam, state.aux
    assert len(aux["users"]) == 60
    K = model.n_factors
    np.testing.assert_allclose(aux["user_total"][:K], (lam["user_shape"] / lam["user_rate"]).sum(0), rtol=1e-10)
    np.testing.assert_allclose(aux["item_total"][:K], (lam["item_shape"] / lam["item_rate"]).sum(0), rtol=1e-10)
    # and they are what the step uses: with ρ = 1 a one-record batch sets the user's rate to
    # E[ξ_u] + Σ_i E[β_i] over every item row
    one = x[np.array([5])]
    new, _ = SVI(model, n_total=len(x), schedule=Constant(1.0)).update(state, one)
    r = model.rows_of(aux, "user", one.user)[0]
    expected = (model.activity_shape + K * model.theta_shape) / lam["user_hyper"][r] \
        + (lam["item_shape"] / lam["item_rate"]).sum(0)
    np.testing.assert_allclose(new.lam["user_rate"][r], expected, rtol=1e-10)


def test_rate_target_counts_every_item_not_only_the_batch():
    """A user's rate target is E[ξ_u] + Σ over every item row (the zeros), not over the batch's items:
    with ρ = 1 a one-record batch sets the user's rate to exactly that."""
    x = hpf_counts()
    model = HPF(n_factors=2)
    engine = SVI(model, n_total=len(x), schedule=Constant(1.0))
    state = engine.init(x, seed=0)
    one = x[np.array([0])]
    new, _ = engine.update(state, one)
    r = model.rows_of(state.aux, "user", one.user)[0]
    lam = state.lam
    B = (lam["item_shape"] / lam["item_rate"]).sum(0)
    expected = (model.activity_shape + 2 * model.theta_shape) / lam["user_hyper"][r] + B
    np.testing.assert_allclose(new.lam["user_rate"][r], expected, rtol=1e-14)
    # untouched users keep their λ
    others = np.setdiff1d(np.arange(len(state.aux["users"])), [r])
    np.testing.assert_array_equal(new.lam["user_shape"][others], lam["user_shape"][others])


def test_new_rows_do_not_depend_on_arrival_order():
    x = hpf_counts()
    model = HPF(n_factors=2)
    a = SVI(model, n_total=len(x)).init(x, seed=3)
    rev = x[np.arange(len(x))[::-1]]
    b = SVI(model, n_total=len(x)).init(rev, seed=3)
    ra = model.rows_of(a.aux, "user", ["u1", 4, "u7"])
    rb = model.rows_of(b.aux, "user", ["u1", 4, "u7"])
    np.testing.assert_array_equal(a.lam["user_shape"][ra], b.lam["user_shape"][rb])


def test_gradient_variance_matches_brute_force():
    """grad_variance = Σ_rows N_i² tr Σ̂_i / M_i over both sides (per-record statistics y φ)."""
    x = hpf_counts()
    model = HPF(n_factors=2)
    N, M = 3000.0, 20
    engine = SVI(model, n_total=N, effective_batch_size=M)
    state = engine.init(x, seed=1)
    xb = x[np.arange(80)]
    new_state, info = engine.update(state, xb)
    # the step's φ: users at the old λ, items at the step's new users
    S = len(xb)
    R = S                                     # records_before = 0
    total = 0.0
    lam1 = state.lam
    loc = model.local_step(lam1, xb, state.aux)
    t_u = xb.rating[:, None] * loc["phi"]
    lam_mid = type(lam1)({k: (new_state.lam[k] if k.startswith("user") else lam1[k]) for k in lam1})
    t_i = xb.rating[:, None] * model.local_step(lam_mid, xb, state.aux)["phi"]
    for rows, t in ((loc["urows"], t_u), (loc["irows"], t_i)):
        for r in np.unique(rows):
            sel = rows == r
            c = sel.sum()
            if c < 2:
                continue
            Ni = N * c / R
            total += Ni ** 2 * np.var(t[sel], axis=0, ddof=1).sum() / (c * M / S)
    assert info.grad_variance == pytest.approx(total, rel=1e-9)


def test_recommend_leaves_out_what_the_user_has():
    x = hpf_counts()
    model = HPF(n_factors=2)
    engine = SVI(model, n_total=len(x))
    state, _ = engine.fit(engine.init(x, seed=0), x, n_steps=5)
    user = x.user[0]
    seen = set(x.item[x.user == user].tolist())
    n_items = len(state.aux["items"])
    recs = model.recommend(state.lam, user, k=n_items, aux=state.aux)
    got = [i for i, _ in recs]
    assert len(got) == n_items - len(seen) and not seen & set(got)
    scores = [s for _, s in recs]
    assert scores == sorted(scores, reverse=True)
    # the scores are the posterior mean rates, and exclude= leaves out more
    assert recs[0][1] == pytest.approx(model.predict_rate(state.lam, [user], [got[0]], aux=state.aux)[0])
    fewer = model.recommend(state.lam, user, k=3, exclude=[got[0]], aux=state.aux)
    assert got[0] not in [i for i, _ in fewer] and len(fewer) == 3
    # an unknown user: the items by Σ_k E[β_ik], nothing left out
    cold = model.recommend(state.lam, "nobody", k=n_items, aux=state.aux)
    assert len(cold) == n_items


def test_predictive_logpdf_is_poisson_at_the_mean_rate():
    x = hpf_counts()
    model = HPF(n_factors=2)
    engine = batch_vi(model, len(x))
    state, _ = engine.fit(engine.init(x, seed=0), x, n_steps=5)
    held = Ratings([x.user[0], "new-user"], [x.item[3], x.item[0]], [0.0, 2.0])
    mu = model.predict_rate(state.lam, held.user, held.item, aux=state.aux)
    np.testing.assert_allclose(model.predictive_logpdf(state.lam, held, aux=state.aux),
                               stats.poisson.logpmf([0, 2], mu), rtol=1e-12)
    assert mu[1] == pytest.approx((model.theta_shape / model.activity_mean * np.asarray(
        state.lam["item_shape"][model.rows_of(state.aux, "item", [x.item[0]])[0]]
        / state.lam["item_rate"][model.rows_of(state.aux, "item", [x.item[0]])[0]])).sum())


@pytest.mark.parametrize("bad, what", [(-1.0, "-1.0"), (float("nan"), "nan")])
def test_refuses_bad_counts(bad, what):
    with pytest.raises(ValueError, match=f"counts must be finite numbers >= 0; got \\[{what}\\] at records \\[1\\]"):
        HPF().check_batch(Ratings(["a", "b"], ["m", "m"], [1.0, bad]))


@pytest.mark.parametrize("kw, msg", [({"n_factors": 0}, "n_factors must be an integer >= 1, got 0"),
                                     ({"theta_shape": -1}, "theta_shape must be > 0, got -1"),
                                     ({"row_counts": "all"}, "row_counts must be one of 'scaled', 'seen', got 'all'")])
def test_refuses_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        HPF(**kw)


def test_snapshot_refuses_a_state_of_another_rank(tmp_path):
    x = hpf_counts()
    engine = SVI(HPF(n_factors=2), n_total=len(x))
    state, _ = engine.fit(engine.init(x, seed=0), x, n_steps=2, batch_size=50)
    save_state(tmp_path / "s.npz", engine, state)
    _, back = load_state(tmp_path / "s.npz")
    with pytest.raises(ValueError, match=r"user_shape has shape \(\d+, 2\), expected \(\d+, 3\)"):
        HPF(n_factors=3).check_state(back.lam, back.aux)


def test_example_config_validates():
    out = subprocess.run([sys.executable, "-m", "streamsvi", "run", "--config", str(ROOT / "configs" / "hpf.toml"),
                          "--print-config"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    assert cfg["model"]["kind"] == "hpf" and cfg["model"]["n_factors"] == 20


def test_negative_counts_are_dead_lettered_whatever_the_config_says():
    """The class's min_rating = 0 is a floor for the ratings kind's validator: a config without
    [validation] min_rating (or with a lower one) still dead-letters a negative count, so no record
    can make an update raise (a crash loop)."""
    from streamsvi.io.records import record_kind

    x = Ratings(["a", "b", "c"], ["m", "m", "n"], [2.0, -1.0, 0.0])
    for options in ({}, {"min_rating": -5.0}, {"min_rating": 1.0}):
        v = record_kind(HPF()).make_validator(HPF(), options)
        good, bad = v.validate(x)
        assert (1, "out_of_range") in [(i, r) for i, r, _ in bad]
    assert len(record_kind(HPF()).make_validator(HPF(), {}).validate(x)[0]) == 2
