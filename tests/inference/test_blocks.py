"""The block API (streamsvi.models.blocks, streamsvi.inference.blocks): families, statistics that
add, the vectorised schedule, and the row storage driven by a model written only against the hooks.

Oracles are closed forms written out here (conjugate posteriors, KL by numerical integration),
not the module's code.
"""
import math

import numpy as np
import pytest
from scipy import integrate, stats

from streamsvi.inference import SVI, Constant, RobbinsMonro, batch_vi
from streamsvi.inference.blocks import dense_step, is_rowwise
from streamsvi.models import BayesianGMM, NatParams
from streamsvi.models.blocks import Dirichlet, GammaRows, GaussianRows, RowBlock, RowStats


# ------------------------------------------------------------------ families
def test_gamma_rows_kl_matches_numerical_integration():
    fam = GammaRows(2, prior_shape=0.7, prior_rate=1.3)
    a, b = np.array([[2.5, 0.9]]), np.array([[0.8, 3.0]])
    want = 0.0
    for k in range(2):
        q, p = stats.gamma(a[0, k], scale=1 / b[0, k]), stats.gamma(0.7, scale=1 / 1.3)
        want += integrate.quad(lambda x: q.pdf(x) * (q.logpdf(x) - p.logpdf(x)), 0, np.inf, limit=200)[0]
    assert fam.kl((a, b))[0] == pytest.approx(want, rel=1e-7)


def test_dirichlet_kl_matches_numerical_integration_for_a_beta():
    a, a0 = np.array([[3.0, 1.5]]), np.array([0.5, 0.5])
    q, p = stats.beta(3.0, 1.5), stats.beta(0.5, 0.5)
    want = integrate.quad(lambda x: q.pdf(x) * (q.logpdf(x) - p.logpdf(x)), 0, 1, limit=200)[0]
    assert Dirichlet().kl((a,), (a0,))[0] == pytest.approx(want, rel=1e-7)


@pytest.mark.parametrize("fam, cur, tgt", [
    (GammaRows(2), (np.array([[1.0, 2.0]]), np.array([[1.0, 1.0]])),
     (np.array([[-1.0, 2.0]]), np.array([[1.0, -3.0]]))),
    (Dirichlet(), (np.array([[1.0, 2.0, 0.5]]),), (np.array([[-2.0, 2.0, 0.1]]),)),
])
def test_max_step_is_the_boundary_of_the_segment(fam, cur, tgt):
    s = float(np.asarray(fam.max_step(cur, tgt)).reshape(-1)[0])
    at = lambda u: tuple(c + u * (t - c) for c, t in zip(cur, tgt))   # noqa: E731
    assert fam.in_domain(at(0.999 * s)) and not fam.in_domain(at(1.001 * s))


def test_gamma_rows_temper_divides_the_natural_parameter():
    a, b = np.array([[3.0]]), np.array([[2.0]])
    aT, bT = GammaRows(1).temper((a, b), 4.0)
    assert (aT - 1.0)[0, 0] == pytest.approx((3.0 - 1.0) / 4.0) and bT[0, 0] == pytest.approx(0.5)


def test_gaussian_rows_prior_rows_are_the_moments_at_the_prior():
    fam = GaussianRows([0.5, 2.0])
    h = np.array([[1.0, -0.5]])
    lam, cache, kl = fam.prior_rows(h)
    m, S, E, kl2 = fam.moments_kl(h, fam.eta_P[None])
    np.testing.assert_allclose(cache.reshape(E.shape), E, rtol=1e-14)
    np.testing.assert_allclose(kl, kl2, atol=1e-14)


# ------------------------------------------------------------------ statistics and schedule
def test_row_stats_of_two_halves_add_to_the_whole():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 6, 40)
    t = rng.normal(size=(40, 3))
    w = rng.normal(1.0, 1.0, 40)

    def stats_of(sel):
        u = np.unique(rows[sel])
        pick = [sel[rows[sel] == r] for r in u]
        return RowStats(u, np.array([(w[p, None] * t[p]).sum(0) for p in pick]),
                        np.array([t[p].sum(0) for p in pick]), np.array([len(p) for p in pick]),
                        np.array([(t[p] ** 2).sum() for p in pick]))
    whole = stats_of(np.arange(40))
    half = stats_of(np.arange(17)) + stats_of(np.arange(17, 40))
    np.testing.assert_array_equal(half.rows, whole.rows)
    np.testing.assert_array_equal(half.counts, whole.counts)
    for k in ("sums_w", "sums", "sqsum"):
        np.testing.assert_allclose(getattr(half, k), getattr(whole, k), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("schedule", [RobbinsMonro(1.0, 0.7), RobbinsMonro(0.0, 1.0, rho_min=0.05),
                                      Constant(0.3)])
def test_vectorised_schedule_equals_the_scalar_one(schedule):
    t = np.array([1, 2, 3, 7, 7, 50, 10_000])
    np.testing.assert_array_equal(schedule.at_steps(t), [schedule(int(v)) for v in t])
    np.testing.assert_allclose(schedule.many(t.astype(float)), [schedule(int(v)) for v in t], rtol=1e-15)


def test_dense_step_without_negative_weights_is_the_convex_combination():
    model = BayesianGMM(2, 2)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 2))
    lam = model.init_params(rng, X, 50)
    tgt = model.prior() + model.suffstats(model.local_step(lam, X), X) * 1.0
    new, clipped, nb = dense_step(model.param_blocks, lam, tgt, 0.3, 0.9)
    assert new.allclose(lam * 0.7 + tgt * 0.3, rtol=1e-15) and clipped == nb == 0


# ------------------------------------------------------------------ a row model on the hooks only
class GammaPoisson:
    """Counts x_r ~ Poisson(θ_u) per user u, θ_u ~ Gamma(a0, b0): one Gamma row per user.

    Written against the row hooks only (streamsvi.models.blocks docs): the statistic of a record
    for its user is (x_r, 1), the conjugate posterior Gamma(a0 + Σ x, b0 + n_u).
    """

    name = "gamma_poisson_test"
    annealing_kinds = ("none", "svi+")
    pair_log = None
    pair_blocks = ()

    def __init__(self, a0=0.5, b0=0.2, counts="scaled", clock="updates"):
        self.family = GammaRows(1, a0, b0)
        self.row_blocks = (RowBlock("user", self.family, counts=counts, clock=clock),)
        self.sweep_order = ("user",)

    def check_batch(self, x):
        return x

    def get_params(self):
        return {}

    def init_row_values(self):
        return {}

    def row_keys(self, x):
        return {"user": x["user"]}

    def new_rows(self, seed, block, ids):
        return np.column_stack([np.full(len(ids), self.family.a0[0]), np.full(len(ids), self.family.b0[0])])

    def begin_batch(self, x, plain, rows):
        return {"rows": rows["user"], "x": x["count"]}

    def batch_loglik(self, ctx, caches):
        E, Elog = caches["user"][:, 0], caches["user"][:, 1]
        r, x = ctx["rows"], ctx["x"]
        return float(np.sum(x * Elog[r] - E[r] - np.array([math.lgamma(v + 1) for v in x])))

    def block_stats(self, block, ctx, caches, weights):
        r, x = ctx["rows"], ctx["x"]
        w = np.ones(len(x)) if weights is None else weights
        u = np.unique(r)
        t = np.column_stack([x, np.ones(len(x))])
        sums = np.zeros((len(u), 2))
        sums_w = np.zeros((len(u), 2))
        np.add.at(sums, np.searchsorted(u, r), t)
        np.add.at(sums_w, np.searchsorted(u, r), w[:, None] * t)
        counts = np.bincount(np.searchsorted(u, r), minlength=len(u))
        sq = np.zeros(len(u))
        np.add.at(sq, np.searchsorted(u, r), (t ** 2).sum(1))
        return RowStats(u, sums_w if weights is not None else sums, sums, counts, sq)

    def check_state(self, lam, aux):
        pass


class _Batch(dict):
    shape = property(lambda self: (len(self["count"]),))

    def __len__(self):
        return len(self["count"])

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict.__getitem__(self, k)
        return _Batch(user=np.asarray(self["user"], dtype=object)[k], count=self["count"][k])


def _data(seed=0, n=600):
    rng = np.random.default_rng(seed)
    users = rng.integers(0, 15, n)
    return _Batch(user=np.array([f"u{u}" for u in users], dtype=object),
                  count=rng.poisson(0.5 + users / 3.0).astype(float))


def _exact(model, x, ids):
    a = np.array([model.family.a0[0] + x["count"][x["user"] == u].sum() for u in ids])
    b = np.array([model.family.b0[0] + np.count_nonzero(x["user"] == u) for u in ids])
    return a, b


def test_row_model_batch_vi_is_the_conjugate_posterior():
    x = _data()
    model = GammaPoisson()
    assert is_rowwise(model)
    engine = batch_vi(model, len(x))
    state, infos = engine.fit(engine.init(x, seed=0), x, n_steps=1)
    a, b = _exact(model, x, state.aux["users"])
    np.testing.assert_allclose(state.lam["user_shape"][:, 0], a, rtol=1e-13)
    np.testing.assert_allclose(state.lam["user_rate"][:, 0], b, rtol=1e-13)
    np.testing.assert_array_equal(state.aux["user_n"], [np.count_nonzero(x["user"] == u)
                                                        for u in state.aux["users"]])


def test_row_model_streaming_bayes_with_the_ratings_clock_is_exact_after_every_batch():
    """counts="seen", clock="ratings", ρ = 1/t: λ_i − η is the sum of the row's statistics so far."""
    x = _data(1)
    model = GammaPoisson(counts="seen", clock="ratings")
    engine = SVI(model, n_total=len(x), schedule=RobbinsMonro(0.0, 1.0))
    state = engine.init(x[np.arange(50)], seed=0)
    for s in range(0, len(x), 50):
        state, _ = engine.update(state, x[np.arange(s, s + 50)])
        seen = x[np.arange(0, s + 50)]
        a, b = _exact(model, seen, state.aux["users"])
        np.testing.assert_allclose(state.lam["user_shape"][:, 0], a, rtol=1e-12)
        np.testing.assert_allclose(state.lam["user_rate"][:, 0], b, rtol=1e-12)


def test_row_model_svi_plus_stays_in_the_domain_and_resumes_exactly():
    x = _data(2)
    model = GammaPoisson()
    engine = SVI(model, n_total=len(x), schedule=Constant(0.9), effective_batch_size=3.0)
    state = engine.init(x, seed=0)
    clipped = 0
    for s in range(0, 300, 100):
        state, info = engine.update(state, x[np.arange(s, s + 100)])
        clipped += info.domain_clipped
    assert clipped > 0
    assert (state.lam["user_shape"] > 0).all() and (state.lam["user_rate"] > 0).all()
    # a plain-array copy of the state (what a snapshot holds) continues bit for bit
    from streamsvi.inference import EngineState
    plain = EngineState(state.step, NatParams(dict(state.lam)), state.rng_state, state.records_seen,
                        aux={k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in state.aux.items()})
    a, _ = engine.update(state, x[np.arange(300, 400)])
    b, _ = engine.update(plain, x[np.arange(300, 400)])
    for k in a.lam:
        np.testing.assert_array_equal(a.lam[k], b.lam[k])
