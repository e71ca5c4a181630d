"""Bayesian GMM: scikit-learn oracle, ELBO and predictive density against
independent Monte-Carlo computations, exact conjugate posterior for K = 1."""
import numpy as np
import pytest
from scipy import stats
from scipy.special import multigammaln

from streamsvi.datasets import make_blobs
from streamsvi.models import BayesianGMM
from tests.conftest import mc_predictive_density

sklearn_mixture = pytest.importorskip("sklearn.mixture")


def _sklearn_twin(model, X):
    bgm = sklearn_mixture.BayesianGaussianMixture(
        n_components=model.n_components, covariance_type="full",
        weight_concentration_prior_type="dirichlet_distribution",
        weight_concentration_prior=float(np.asarray(model.weight_concentration).ravel()[0]),
        mean_precision_prior=model.mean_precision, mean_prior=model._m0,
        degrees_of_freedom_prior=model._nu0, covariance_prior=np.linalg.inv(model._W0),
        reg_covar=0.0)
    bgm._check_parameters(X)
    return bgm


def _compare(model, lam, bgm, rtol):
    alpha, beta, m, Winv, nu = model.standard(lam)
    np.testing.assert_allclose(alpha, bgm.weight_concentration_, rtol=rtol)
    np.testing.assert_allclose(beta, bgm.mean_precision_, rtol=rtol)
    np.testing.assert_allclose(nu, bgm.degrees_of_freedom_, rtol=rtol)
    np.testing.assert_allclose(m, bgm.means_, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(model.covariances(lam), bgm.covariances_, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("D,K,seed", [(2, 4, 0), (5, 3, 1)])
def test_batch_vi_matches_sklearn_from_same_responsibilities(D, K, seed):
    rng = np.random.default_rng(seed)
    if D == 2:
        X, _ = make_blobs(300, seed=seed)
    else:
        X = np.concatenate([rng.normal(c, 1.0, (120, D)) for c in (-2.0, 0.0, 2.5)])
    model = BayesianGMM(K, D, weight_concentration=0.3, mean_precision=0.5, mean=0.1,
                        degrees_of_freedom=D + 0.5, scale=np.diag(np.linspace(0.5, 1.5, D)))
    resp = rng.uniform(size=(len(X), K))
    resp /= resp.sum(axis=1, keepdims=True)
    bgm = _sklearn_twin(model, X)
    bgm._initialize(X, resp)
    lam = model.init_from_responsibilities(resp, X)
    _compare(model, lam, bgm, 1e-10)
    for _ in range(25):
        _, log_resp = bgm._e_step(X)
        bgm._m_step(X, log_resp)
        lam = model.prior() + model.suffstats(model.local_step(lam, X), X)
    _compare(model, lam, bgm, 1e-6)
    # and the E-steps agree
    _, log_resp = bgm._e_step(X)
    np.testing.assert_allclose(model.responsibilities(lam, X), np.exp(log_resp), atol=1e-8)


def _sample_q(model, lam, S, rng):
    alpha, beta, m, Winv, nu = model.standard(lam)
    K = model.n_components
    pis = stats.dirichlet(alpha).rvs(S, random_state=rng)
    Lams = np.stack([stats.wishart(df=nu[k], scale=np.linalg.inv(Winv[k])).rvs(S, random_state=rng)
                     for k in range(K)], axis=1)                      # (S, K, D, D)
    covs = np.linalg.inv(beta[None, :, None, None] * Lams)
    mus = np.stack([[rng.multivariate_normal(m[k], covs[s, k]) for k in range(K)] for s in range(S)])
    return pis, mus, Lams


def test_global_elbo_matches_monte_carlo():
    """E_q[log p(β) − log q(β)] by 3,000 draws from q, scipy densities; tolerance 5 SE."""
    X, _ = make_blobs(200, seed=2)
    model = BayesianGMM(3, 2, weight_concentration=0.7, mean_precision=0.4, mean=[0.5, -0.2],
                        degrees_of_freedom=2.5, scale=[0.8, 1.3])
    lam = model.init_params(np.random.default_rng(0), X, len(X))
    rng = np.random.default_rng(7)
    S = 3000
    pis, mus, Lams = _sample_q(model, lam, S, rng)
    alpha, beta, m, Winv, nu = model.standard(lam)
    vals = stats.dirichlet(model._alpha0).logpdf(pis.T) - stats.dirichlet(alpha).logpdf(pis.T)
    for k in range(3):
        pw = stats.wishart(df=model._nu0, scale=model._W0)
        qw = stats.wishart(df=nu[k], scale=np.linalg.inv(Winv[k]))
        for s in range(S):
            L = Lams[s, k]
            vals[s] += (pw.logpdf(L) - qw.logpdf(L)
                        + stats.multivariate_normal(model._m0, np.linalg.inv(model.mean_precision * L)).logpdf(mus[s, k])
                        - stats.multivariate_normal(m[k], np.linalg.inv(beta[k] * L)).logpdf(mus[s, k]))
    se = vals.std(ddof=1) / np.sqrt(S)
    assert abs(vals.mean() - model.global_elbo(lam)) < 5 * se, (vals.mean(), model.global_elbo(lam), se)


def test_local_elbo_matches_monte_carlo():
    """Per-record E_q[log p(x, c | β)] − E_q[log q(c)] by 20,000 draws of β; tolerance 5 SE."""
    X, _ = make_blobs(100, seed=4)
    model = BayesianGMM(3, 2, weight_concentration=1.2, mean_precision=0.3, degrees_of_freedom=3.0)
    lam = model.init_params(np.random.default_rng(1), X, len(X))
    x = X[:3]
    local = model.local_step(lam, x)
    r = local.resp
    rng = np.random.default_rng(3)
    pis, mus, Lams = _sample_q(model, lam, 4000, rng)
    vals = np.zeros((len(pis), len(x)))
    for s in range(len(pis)):
        for k in range(3):
            lp = stats.multivariate_normal(mus[s, k], np.linalg.inv(Lams[s, k])).logpdf(x)
            vals[s] += r[:, k] * (np.log(pis[s, k]) + lp - np.log(r[:, k]))
    est, se = vals.mean(0), vals.std(0, ddof=1) / np.sqrt(len(vals))
    assert np.all(np.abs(est - model.local_elbo(local)) < 5 * se), (est, model.local_elbo(local), se)


def test_predictive_density_matches_monte_carlo():
    """Student-t mixture vs E_q[Σ_k π_k N(x | μ_k, Λ_k⁻¹)] by 20,000 draws; 3% relative."""
    X, _ = make_blobs(150, seed=5)
    model = BayesianGMM(2, 2, weight_concentration=1.0, mean_precision=0.5, degrees_of_freedom=3.0)
    lam = model.init_params(np.random.default_rng(0), X, 20.0)   # small N: a wide posterior
    x = np.array([[0.0, 0.0], [-4.0, -3.0], [2.0, 2.5]])
    mc, se = mc_predictive_density(model, lam, x, 20000, np.random.default_rng(11))
    exact = np.exp(model.predictive_logpdf(lam, x))
    assert np.all(np.abs(mc - exact) < np.maximum(5 * se, 0.03 * exact)), (mc, exact, se)


def test_single_component_is_the_exact_normal_wishart_posterior():
    rng = np.random.default_rng(0)
    X = rng.multivariate_normal([1.0, -2.0], [[2.0, 0.6], [0.6, 1.0]], size=500)
    b0, m0, nu0, W0 = 0.3, np.array([0.5, 0.5]), 4.0, np.array([[0.5, 0.1], [0.1, 0.8]])
    model = BayesianGMM(1, 2, weight_concentration=2.0, mean_precision=b0, mean=m0,
                        degrees_of_freedom=nu0, scale=W0)
    lam = model.init_params(rng, X, len(X))
    lam = model.prior() + model.suffstats(model.local_step(lam, X), X)   # r_n1 = 1: one sweep is exact
    n, xbar = len(X), X.mean(0)
    Sx = (X - xbar).T @ (X - xbar)
    beta_n = b0 + n
    m_n = (b0 * m0 + n * xbar) / beta_n
    Winv_n = np.linalg.inv(W0) + Sx + b0 * n / beta_n * np.outer(xbar - m0, xbar - m0)
    alpha, beta, m, Winv, nu = model.standard(lam)
    np.testing.assert_allclose([alpha[0], beta[0], nu[0]], [2.0 + n, beta_n, nu0 + n], rtol=1e-12)
    np.testing.assert_allclose(m[0], m_n, rtol=1e-10)
    np.testing.assert_allclose(Winv[0], Winv_n, rtol=1e-10)
    # ELBO at the exact posterior equals the log marginal likelihood (K = 1: nothing is
    # approximated), Bishop 2006 eq. 2.155 / Murphy 2007 eq. 266 for D = 2
    logml = (-n * np.log(np.pi) + multigammaln(nu[0] / 2, 2) - multigammaln(nu0 / 2, 2)
             + nu0 / 2 * np.linalg.slogdet(np.linalg.inv(W0))[1] - nu[0] / 2 * np.linalg.slogdet(Winv_n)[1]
             + np.log(b0 / beta_n))
    elbo = model.global_elbo(lam) + model.local_elbo(model.local_step(lam, X)).sum()
    assert elbo == pytest.approx(logml, rel=1e-9)


def test_scoring_functions():
    X, labels = make_blobs(400, seed=8)
    model = BayesianGMM(4, 2)
    lam = model.init_params(np.random.default_rng(2), X, len(X))
    for _ in range(50):
        lam = model.prior() + model.suffstats(model.local_step(lam, X), X)
    R = model.responsibilities(lam, X)
    np.testing.assert_allclose(R.sum(1), 1.0)
    assert np.array_equal(model.predict(lam, X), R.argmax(1))
    # the clustering recovers the generating labels (up to relabelling) on 90% of records
    pred = model.predict(lam, X)
    agree = sum(np.bincount(pred[labels == k]).max() for k in range(4)) / len(X)
    assert agree > 0.9
    # the predictive density integrates to ≈ 1 on a grid
    g = np.linspace(-12, 12, 241)
    G = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    assert np.exp(model.predictive_logpdf(lam, G)).sum() * (g[1] - g[0]) ** 2 == pytest.approx(1.0, abs=2e-3)


def test_dp_approximation_and_paper_prior_settings():
    dp = BayesianGMM.dp_approximation(n_features=3, concentration=2.0)
    assert dp.n_components == 50
    np.testing.assert_allclose(dp.prior()["alpha"], 2.0 / 50)
    pp = BayesianGMM.paper_prior(5, 8)
    eta = pp.prior()
    np.testing.assert_allclose(eta["nu"], 8.0)              # a = D
    np.testing.assert_allclose(eta["Psi"][0], np.eye(8))     # B = I, m0 = 0
    np.testing.assert_allclose(eta["beta"], 0.1)             # c = 10
    np.testing.assert_allclose(eta["alpha"], 0.5)


@pytest.mark.parametrize("kw,msg", [
    (dict(n_components=0), "n_components"),
    (dict(degrees_of_freedom=0.5), "degrees_of_freedom must be > n_features - 1"),
    (dict(mean_precision=-1), "mean_precision"),
    (dict(scale=[[1, 2], [2, 1]]), "scale"),
    (dict(weight_concentration=[1, 2]), "weight_concentration"),
    (dict(init="kmedoids"), "init must be one of 'kmeans', 'kmeans\\+\\+', 'random_from_data', "
                            "'random_resp', got 'kmedoids'"),
    (dict(n_init=0), "n_init must be an integer >= 1, got 0"),
    (dict(n_init=1.5), "n_init must be an integer >= 1, got 1.5"),
    (dict(init_sweeps=-1), "init_sweeps must be an integer >= 0, got -1"),
    (dict(init_batches=0), "init_batches must be an integer >= 1, got 0"),
    (dict(prior_from="empirical"), "prior_from must be one of 'auto', 'settings', 'data', got 'empirical'"),
])
def test_bad_settings_are_refused_with_the_field_named(kw, msg):
    args = dict(n_components=3, n_features=2) | kw
    with pytest.raises(ValueError, match=msg):
        BayesianGMM(**args)


def test_bad_batches_are_refused():
    model = BayesianGMM(2, 3)
    with pytest.raises(ValueError, match="3 features"):
        model.check_batch(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="non-finite values in records \\[1\\]"):
        model.check_batch([[0, 0, 0], [0, np.nan, 0]])
    with pytest.raises(ValueError, match="numeric"):
        model.check_batch([["a", "b", "c"]])


# ------------------------------------------------------------ initialisation
def _grid_blobs(n_per, seed, sd=0.3):
    """Nine tight blobs on a 3 x 3 grid (spacing 10), shuffled: (X, labels)."""
    rng = np.random.default_rng(seed)
    centres = np.array([(i, j) for i in range(3) for j in range(3)], float) * 10.0
    X = np.concatenate([rng.normal(c, sd, (n_per, 2)) for c in centres])
    y = np.repeat(np.arange(9), n_per)
    p = rng.permutation(len(X))
    return X[p], y[p]


def test_kmeans_plusplus_picks_distinct_centres_deterministic_per_seed():
    from streamsvi.models.gmm import kmeans_plusplus

    # 6 distinct points, each repeated 20 times: uniform draws of 6 records repeat
    # a point with probability 1 - 6!/6^6 = 98 %; D² sampling never draws a point
    # already chosen (its distance is 0)
    pts = np.random.default_rng(5).normal(size=(6, 3))
    X = np.repeat(pts, 20, axis=0)
    draws = set()
    for seed in range(20):
        idx = kmeans_plusplus(np.random.default_rng(seed), X, 6)
        assert len(set(idx.tolist())) == 6
        assert len({tuple(r) for r in X[idx]}) == 6, f"seed {seed}: a point was seeded twice"
        np.testing.assert_array_equal(idx, kmeans_plusplus(np.random.default_rng(seed), X, 6))
        draws.add(tuple(idx.tolist()))
    assert len(draws) > 1                                   # the seed matters
    # more components than distinct points: distinct records, every point used
    idx = kmeans_plusplus(np.random.default_rng(0), X, 8)
    assert len(set(idx.tolist())) == 8 and len({tuple(r) for r in X[idx]}) == 6
    # more components than records (a small first minibatch): no error
    assert kmeans_plusplus(np.random.default_rng(0), X[:3], 5).shape == (5,)


@pytest.mark.parametrize("init", ["kmeans", "kmeans++", "random_from_data", "random_resp"])
def test_every_init_is_deterministic_per_seed_through_the_engine(init):
    from streamsvi.inference import batch_vi

    X, _ = _grid_blobs(30, seed=1)
    eng = batch_vi(BayesianGMM(9, 2, init=init), len(X))
    a, b, c = (eng.init(X, seed=s) for s in (3, 3, 4))
    for k in a.lam.keys():
        np.testing.assert_array_equal(a.lam[k], b.lam[k])
    assert not np.array_equal(a.lam["beta_m"], c.lam["beta_m"])
    assert a.rng_state == b.rng_state


def test_kmeans_init_recovers_separated_blobs_and_beats_random_init():
    """Nine blobs, K = 9, batch VI (40 sweeps) from 10 fixed seeds.

    kmeans: every seed recovers the nine clusters (each cluster is one
    component, purity 1) and its held-out log-likelihood is never below
    random_from_data's on the same seed by more than 1e-3 nats per record, and
    above it by at least 0.2 nats per record on average (random draws of 9
    records from 9 equal clusters miss a cluster with probability 1 - 9!/9^9 =
    99.9 %, and CAVI then often keeps two clusters merged).
    """
    from streamsvi.inference import batch_vi

    X, y = _grid_blobs(60, seed=0)
    Xte, _ = _grid_blobs(30, seed=1)
    ll = {}
    for init in ("kmeans", "random_from_data"):
        model = BayesianGMM(9, 2, init=init, n_init=1, init_sweeps=0)   # one start each, as it is
        eng = batch_vi(model, len(X))
        ll[init] = []
        for seed in range(10):
            state, _ = eng.fit(eng.init(X, seed=seed), X, 40)
            ll[init].append(model.predictive_logpdf(state.lam, Xte).mean())
            if init == "kmeans":
                pred = model.predict(state.lam, X)
                pairs = set(zip(y.tolist(), pred.tolist()))
                assert len(pairs) == 9 and len({p for _, p in pairs}) == 9, f"seed {seed}: {sorted(pairs)}"
    km, rnd = np.array(ll["kmeans"]), np.array(ll["random_from_data"])
    assert np.all(km >= rnd - 1e-3), (km - rnd).round(4)
    assert (km - rnd).mean() >= 0.2, (km - rnd).round(4)


def test_init_settings_in_the_config():
    from streamsvi.models.gmm import INITS
    from streamsvi.service.config import ConfigError, build_model, model_schema, validate

    assert model_schema("gmm")["init"].choices == model_schema("gmm_dp")["init"].choices == INITS
    base = {"inference": {"n_total": 100.0}, "source": {"kind": "file", "path": "x.jsonl"},
            "checkpoint": {"directory": "c"}}
    for kind in ("gmm", "gmm_dp"):
        for init in INITS:
            cfg = validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2, "init": init}})
            assert build_model(cfg["model"]).init == init
        assert build_model(validate({**base, "model": {"kind": kind, "n_components": 3,
                                                       "n_features": 2}})["model"]).init == "kmeans"
        m = build_model(validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2,
                                                    "n_init": 2, "init_sweeps": 0, "init_batches": 2}})["model"])
        assert (m.n_init, m.init_sweeps, m.init_batches) == (2, 0, 2)
        with pytest.raises(ConfigError, match="model.n_init: must be an integer >= 1, got 0"):
            validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2, "n_init": 0}})
        with pytest.raises(ConfigError, match="model.init: must be one of 'kmeans', 'kmeans\\+\\+', "
                                              "'random_from_data', 'random_resp', got 'gamma'"):
            validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2, "init": "gamma"}})
        with pytest.raises(ConfigError, match="model.init: must be one of .*got 'k-means'; did you mean 'kmeans'"):
            validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2, "init": "k-means"}})
    with pytest.raises(ConfigError, match="model.init: must be one of 'gamma', 'documents', got 'kmeans'"):
        validate({**base, "model": {"kind": "lda", "n_components": 3, "n_features": 20, "init": "kmeans"}})


def test_river_face_passes_init_through():
    from streamsvi.estimators import GaussianMixture

    X, _ = _grid_blobs(10, seed=2)
    est = GaussianMixture(n_components=9, batch_size=90, n_total=90.0, init="kmeans++",
                          features=("a", "b"), seed=0)
    assert est._engine.model.init == "kmeans++"
    for row in X:
        est.learn_one({"a": row[0], "b": row[1]})
    with pytest.raises(ValueError, match="init must be one of"):
        GaussianMixture(init="kmedoids", features=("a", "b"))


def test_n_init_keeps_the_start_with_the_best_elbo_on_the_init_data():
    """n_init = 4: the four starts are the ones four one-start inits draw in turn from the
    same stream, and the kept one has the highest ELBO on x; over seeds it beats the first
    start (what n_init = 1 returns) at least once and never loses to it."""
    X, _ = _grid_blobs(20, seed=3)
    N = 10.0 * len(X)                        # x is a first minibatch of a larger stream
    gains = []
    for seed in range(6):
        model = BayesianGMM(9, 2, init="random_from_data", n_init=4, init_sweeps=2, refine_sweeps=0)
        one = BayesianGMM(9, 2, init="random_from_data", n_init=1, init_sweeps=2, refine_sweeps=0)
        lam = model.init_params(np.random.default_rng(seed), X, N)
        rng = np.random.default_rng(seed)
        starts = [one.init_params(rng, X, N) for _ in range(4)]
        elbos = [model.init_elbo(s, X, N) for s in starts]
        best = starts[int(np.argmax(elbos))]
        for k in lam.keys():
            np.testing.assert_array_equal(lam[k], best[k])
        gains.append(max(elbos) - elbos[0])
    assert min(gains) >= 0.0 and max(gains) > 0.0, gains


def test_init_sweeps_are_cavi_sweeps_on_the_first_minibatch():
    """init_sweeps = 3 on a minibatch x of a stream of N records: three times
    λ ← η + (N/|x|) Σ_n E_q[t(x_n)] from the start λ, and the ELBO on x does not decrease."""
    X, _ = _grid_blobs(10, seed=4)
    N = 1000.0
    model = BayesianGMM(9, 2, n_init=1, init_sweeps=3, refine_sweeps=0)
    lam = model.init_params(np.random.default_rng(7), X, N)
    ref = BayesianGMM(9, 2, n_init=1, init_sweeps=0, refine_sweeps=0).init_params(np.random.default_rng(7), X, N)
    elbos = [model.init_elbo(ref, X, N)]
    for _ in range(3):
        ref = model.prior() + model.suffstats(model.local_step(ref, X), X) * (N / len(X))
        elbos.append(model.init_elbo(ref, X, N))
    for k in lam.keys():
        np.testing.assert_allclose(lam[k], ref[k], rtol=1e-12)
    assert np.all(np.diff(elbos) >= -1e-9 * abs(elbos[0])), elbos


@pytest.mark.parametrize("cap", [100, 2])
def test_refine_sweeps_run_the_kept_start_to_convergence_on_the_init_records(cap):
    """refine_sweeps: after the kept start, CAVI sweeps on x until the ELBO per record
    changes by less than REFINE_TOL, at most ``cap`` of them; the ELBO never decreases."""
    from streamsvi.models.gmm import REFINE_TOL

    X, _ = _grid_blobs(10, seed=4)
    N = 1000.0
    lam = BayesianGMM(9, 2, init="random_from_data", init_sweeps=0, refine_sweeps=cap).init_params(
        np.random.default_rng(7), X, N)
    model = BayesianGMM(9, 2, init="random_from_data", init_sweeps=0, refine_sweeps=0)
    ref = model.init_params(np.random.default_rng(7), X, N)           # the same kept start, unrefined
    elbos = [model.init_elbo(ref, X, N)]
    for _ in range(cap):
        ref = model.prior() + model.suffstats(model.local_step(ref, X), X) * (N / len(X))
        elbos.append(model.init_elbo(ref, X, N))
        if abs(elbos[-1] - elbos[-2]) < REFINE_TOL * N:
            break
    for k in lam.keys():
        np.testing.assert_allclose(lam[k], ref[k], rtol=1e-10)
    assert np.all(np.diff(elbos) >= -1e-9 * abs(elbos[0])), elbos
    assert elbos[-1] > elbos[0]
    if cap == 100:
        assert 2 < len(elbos) - 1 < cap         # converged, after more sweeps than the capped run takes
    else:
        assert len(elbos) - 1 == cap


def test_start_settings_are_saved_and_do_not_block_a_resume(tmp_path):
    from streamsvi.checkpoint import CheckpointStore, check_compatible
    from streamsvi.inference import SVI

    model = BayesianGMM(3, 2, n_init=1, init_sweeps=0)
    assert model.get_params()["n_init"] == 1 and model.get_params()["init_sweeps"] == 0
    assert {"init", "n_init", "init_sweeps"} <= set(BayesianGMM.START_SETTINGS)
    X, _ = make_blobs(60, seed=0)
    engine = SVI(model, n_total=600.0)
    state, _ = engine.update(engine.init(X[:30], seed=0), X[30:])
    store = CheckpointStore(tmp_path, keep=2)
    store.save(engine, state, [{"source": "points", "partition": 0, "offset": 60}])
    snap = store.latest()
    assert snap.engine.model.n_init == 1 and snap.engine.model.init_sweeps == 0
    fresh = SVI(BayesianGMM(3, 2), n_total=600.0)
    fresh.model.adopt_prior(snap.engine.model)           # as the daemon does on resume
    notes = check_compatible(snap, fresh)
    assert sorted(n.split(":")[0] for n in notes) == ["model setting init_sweeps", "model setting n_init"]


def test_empirical_prior_is_sklearns_default_prior():
    """From the same responsibilities, CAVI under ``empirical_prior(K, X)`` is scikit-learn's
    BayesianGaussianMixture with its default (data-dependent) mean, covariance, ν0 and β0
    priors, on strongly correlated, unstandardised columns."""
    rng = np.random.default_rng(3)
    Z, _ = make_blobs(300, seed=3)
    X = Z @ np.array([[3.0, 2.9], [0.0, 0.2]]) + np.array([50.0, -20.0])   # correlation ~0.99
    K = 4
    model = BayesianGMM.empirical_prior(K, X, weight_concentration=0.7)
    bgm = sklearn_mixture.BayesianGaussianMixture(
        n_components=K, weight_concentration_prior_type="dirichlet_distribution",
        weight_concentration_prior=0.7, reg_covar=0.0)
    bgm._check_parameters(X)
    resp = rng.dirichlet(np.ones(K), size=len(X))
    bgm._initialize(X, resp)
    lam = model.init_from_responsibilities(resp, X)
    for _ in range(10):
        _, log_resp = bgm._e_step(X)
        bgm._m_step(X, log_resp)
        lam = model.prior() + model.suffstats(model.local_step(lam, X), X)
    _compare(model, lam, bgm, rtol=1e-8)
    assert model.get_params()["mean"] == pytest.approx(X.mean(axis=0).tolist())
    with pytest.raises(ValueError, match="covariance of x is singular"):
        BayesianGMM.empirical_prior(2, np.c_[X[:, 0], 2.0 * X[:, 0]])


def _correlated(n, seed):
    Z, _ = make_blobs(n, seed=seed)
    return Z @ np.array([[3.0, 2.9], [0.0, 0.2]]) + np.array([50.0, -20.0])   # correlation ~0.99


def test_prior_from_data_is_the_empirical_prior_of_the_init_data_computed_once():
    """``prior_from = "data"``: init_params fills m0 and W0 from the records it is given
    (scikit-learn's prior, as ``empirical_prior``), stores them as settings, and keeps them."""
    X = _correlated(400, 0)
    model = BayesianGMM(3, 2, prior_from="data")
    assert model.prior_pending and model.get_params()["mean"] == 0.0       # the settings' η until then
    model.init_params(np.random.default_rng(0), X[:100], n_total=400)
    assert not model.prior_pending
    ref = BayesianGMM.empirical_prior(3, X[:100])
    for k in model.prior().keys():
        np.testing.assert_allclose(model.prior()[k], ref.prior()[k], rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(model.get_params()["mean"], X[:100].mean(axis=0), rtol=1e-12)
    eta = model.prior()._flat.copy()
    model.init_params(np.random.default_rng(1), X[200:] + 100.0, n_total=400)   # other data: kept
    assert np.array_equal(model.prior()._flat, eta)
    # a given value is kept as given; only the other is taken from the data
    half = BayesianGMM(3, 2, prior_from="data", mean=0.0)
    half.fit_prior(X)
    assert half.get_params()["mean"] == 0.0 and np.allclose(half._m0, 0.0)
    np.testing.assert_allclose(np.linalg.inv(half._W0), np.cov(X.T), rtol=1e-5)
    # the default is unchanged: m0 = 0, W0 = I whatever the data
    plain = BayesianGMM(3, 2)
    plain.init_params(np.random.default_rng(0), X, n_total=400)
    assert np.allclose(plain._m0, 0.0) and np.array_equal(plain._W0, np.eye(2))
    # fewer records than D + 1, or one: still a proper prior
    tiny = BayesianGMM(1, 2, prior_from="data")
    tiny.fit_prior(X[:1])
    assert np.array_equal(tiny._W0, np.eye(2)) and tiny.in_domain(tiny.prior())


def test_prior_from_data_round_trips_and_resumes_with_the_snapshots_prior(tmp_path):
    """The concrete prior is in the snapshot; a model built again from the config (prior
    still to fill) adopts it rather than recomputing it, and then resumes. Without
    ``adopt_prior`` the snapshot is refused (its mean and scale differ from None)."""
    from streamsvi.checkpoint import CheckpointStore, IncompatibleSnapshotError, check_compatible
    from streamsvi.inference import SVI
    from streamsvi.models import model_from_dict, model_to_dict

    X = _correlated(300, 1)
    engine = SVI(BayesianGMM(3, 2, prior_from="data"), n_total=300.0)
    state, _ = engine.update(engine.init(X[:50], seed=0), X[50:100])
    store = CheckpointStore(tmp_path, keep=2)
    store.save(engine, state, [{"source": "points", "partition": 0, "offset": 100}])
    snap = store.latest()
    rebuilt = model_from_dict(model_to_dict(engine.model))
    assert np.array_equal(rebuilt.prior()._flat, engine.model.prior()._flat)
    assert np.array_equal(snap.engine.model.prior()._flat, engine.model.prior()._flat)

    fresh = SVI(BayesianGMM(3, 2, prior_from="data"), n_total=300.0)
    with pytest.raises(IncompatibleSnapshotError, match="model setting mean"):
        check_compatible(snap, fresh)
    assert fresh.model.prior_pending
    fresh.model.adopt_prior(snap.engine.model)
    assert check_compatible(snap, fresh) == []
    assert np.array_equal(fresh.model.prior()._flat, engine.model.prior()._flat)
    # resumed, the next update is the uninterrupted run's bit for bit
    a, _ = engine.update(state, X[100:150])
    b, _ = fresh.update(snap.state, X[100:150])
    assert a.lam.array_equal(b.lam)
    # a prior given in the config that differs from the snapshot's is still refused
    other = SVI(BayesianGMM(3, 2, prior_from="data", mean=1.0), n_total=300.0)
    other.model.adopt_prior(snap.engine.model)
    with pytest.raises(IncompatibleSnapshotError, match="model setting mean"):
        check_compatible(snap, other)


def test_prior_from_in_the_config():
    from streamsvi.service.config import ConfigError, build_model, validate

    base = {"inference": {"n_total": 100.0}, "source": {"kind": "file", "path": "x.jsonl"},
            "checkpoint": {"directory": "c"}}
    for kind in ("gmm", "gmm_dp"):
        m = build_model(validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2,
                                                    "prior_from": "data"}})["model"])
        assert m.prior_from == "data" and m.prior_pending
        m = build_model(validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2,
                                                    "prior_from": "data", "scale": 2.0}})["model"])
        assert m.get_params()["scale"] == 2.0 and m.prior_pending
        with pytest.raises(ConfigError, match="model.prior_from: must be one of .*got 'sklearn'"):
            validate({**base, "model": {"kind": kind, "n_components": 3, "n_features": 2,
                                        "prior_from": "sklearn"}})


def test_prior_from_auto_takes_the_data_prior_only_for_nearly_collinear_columns():
    """The default ``"auto"``: W0⁻¹ = the data covariance when its condition number exceeds
    AUTO_CONDITION (as on the breast-cancer set), else m0 = 0, W0 = I exactly as before."""
    from streamsvi.models.gmm import AUTO_CONDITION

    rng = np.random.default_rng(4)
    well = rng.normal(size=(300, 3)) @ np.diag([1.0, 2.0, 3.0])
    model = BayesianGMM(2, 3)
    assert model.prior_from == "auto" and model.prior_pending
    model.init_params(np.random.default_rng(0), well, n_total=300)
    assert not model.prior_pending
    assert model.get_params()["mean"] == 0.0 and model.get_params()["scale"] is None
    assert np.array_equal(model.prior()._flat, BayesianGMM(2, 3, prior_from="settings").prior()._flat)

    z = rng.normal(size=(300, 2))
    collinear = np.column_stack([z[:, 0], z[:, 1], z[:, 0] + 0.01 * z[:, 1]])
    ev = np.linalg.eigvalsh(np.cov(collinear.T))
    assert ev[-1] > AUTO_CONDITION * ev[0]
    model = BayesianGMM(2, 3)
    model.init_params(np.random.default_rng(0), collinear, n_total=300)
    ref = BayesianGMM(2, 3, prior_from="data")
    ref.fit_prior(collinear)
    assert model.get_params() | {"prior_from": "data"} == ref.get_params()
    assert np.array_equal(model.prior()._flat, ref.prior()._flat)
    # a handful of records (2D or fewer, e.g. a short first minibatch) never decides it
    few = BayesianGMM(2, 3)
    few.init_params(np.random.default_rng(0), collinear[:6], n_total=300)
    assert few.get_params()["scale"] is None and few.get_params()["mean"] == 0.0
    # a value given makes "auto" keep the settings
    given = BayesianGMM(2, 3, mean=0.0)
    given.init_params(np.random.default_rng(0), collinear, n_total=300)
    assert given.get_params()["scale"] is None


@pytest.mark.parametrize("scale", [None, 1.0])
def test_a_snapshot_from_before_prior_from_resumes_under_the_auto_default(scale):
    """Settings saved before ``prior_from`` existed (m0 = 0, W0 = I or scale 1): a config on
    the new default adopts them, so nothing but the start setting prior_from differs."""
    from streamsvi.models import model_from_dict

    legacy = BayesianGMM(3, 2, prior_from="settings", scale=scale).get_params()
    del legacy["prior_from"]
    old = model_from_dict({"name": "gmm", "params": legacy})
    new = BayesianGMM(3, 2)
    assert new.prior_pending
    new.adopt_prior(old)
    assert not new.prior_pending
    assert {k: v for k, v in new.get_params().items() if k != "prior_from"} == legacy
    assert np.array_equal(new.prior()._flat, BayesianGMM(3, 2, prior_from="settings").prior()._flat)


def test_a_streaming_start_gathers_init_batches_and_five_records_per_component_and_dimension():
    assert BayesianGMM(10, 30).start_size(1000) == 4000                  # 4 batches > 5·K·D = 1,500
    assert BayesianGMM(50, 30).start_size(1000) == 7500                  # the DP default K = 50
    assert BayesianGMM.dp_approximation(30).start_size(1000) == 7500
    assert BayesianGMM(3, 2, init_batches=1).start_size(100) == 100
    assert BayesianGMM(3, 2, init_batches=2).start_size(100) == 200
