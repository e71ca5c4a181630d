"""DiscreteHMM against oracles that do not share its code.

* forward–backward marginals (single and pairwise), the local bound, the
  plug-in likelihood, filtering, Viterbi and the exact variational predictive
  by brute-force enumeration of all K^T state paths on tiny models;
* the Dirichlet KL terms by Monte Carlo with scipy's Dirichlet density;
* one batch-VI (CAVI) sweep and its ELBO against hmmlearn's
  ``VariationalCategoricalHMM``.
"""
import itertools

import numpy as np
import pytest
from scipy import stats
from scipy.special import digamma, gammaln, logsumexp

from streamsvi.inference import SVI, Constant, RobbinsMonro, batch_vi
from streamsvi.models import DiscreteHMM
from streamsvi.models.hmm import sample_hmm
from streamsvi.sequence_batch import Sequences


def _random_lam(model, rng, scale=3.0):
    K, V = model.n_states, model.n_symbols
    from streamsvi.models import NatParams
    return NatParams(init=rng.gamma(2.0, scale, K), trans=rng.gamma(2.0, scale, (K, K)),
                     emit=rng.gamma(2.0, scale, (K, V)))


def _elog(a):
    return digamma(a) - digamma(a.sum(-1, keepdims=True))


def _paths(K, T):
    return np.array(list(itertools.product(range(K), repeat=T)), dtype=int)


def _path_logweights(log_pi, log_A, log_B, x):
    """log of π_{z1} B_{z1 x1} ∏ A_{z_{t-1} z_t} B_{z_t x_t} for every path z (rows)."""
    Z = _paths(len(log_pi), len(x))
    lw = log_pi[Z[:, 0]] + log_B[Z[:, 0], x[0]]
    for t in range(1, len(x)):
        lw = lw + log_A[Z[:, t - 1], Z[:, t]] + log_B[Z[:, t], x[t]]
    return Z, lw


def _brute_stats(lpi, lA, lB, x, K, V):
    """Expected counts and log Σ_z exp(weights) of one sequence by enumeration."""
    Z, lw = _path_logweights(lpi, lA, lB, x)
    logZ = logsumexp(lw)
    q = np.exp(lw - logZ)
    init = np.bincount(Z[:, 0], weights=q, minlength=K)
    trans = np.zeros((K, K))
    emit = np.zeros((K, V))
    for t in range(len(x)):
        emit[:, x[t]] += np.bincount(Z[:, t], weights=q, minlength=K)
        if t:
            np.add.at(trans, (Z[:, t - 1], Z[:, t]), q)
    return init, trans, emit, logZ, Z, lw, q


@pytest.fixture(params=[(2, 3), (3, 2)], ids=["K2V3", "K3V2"])
def tiny(request):
    K, V = request.param
    model = DiscreteHMM(K, V, init_concentration=0.7, transition_concentration=0.4,
                        emission_concentration=1.3)
    rng = np.random.default_rng(K * 10 + V)
    lam = _random_lam(model, rng)
    lengths = [1, 2, 6, 3, 5, 6, 4]
    x = Sequences.from_list([rng.integers(0, V, size=L) for L in lengths])
    return model, lam, x


def test_forward_backward_equals_enumeration(tiny):
    model, lam, x = tiny
    K, V = model.n_states, model.n_symbols
    lpi, lA, lB = _elog(lam["init"]), _elog(lam["trans"]), _elog(lam["emit"])
    local = model.local_step(lam, x)
    w = np.random.default_rng(0).normal(1.0, 1.0, len(x))
    tot = [np.zeros(K), np.zeros((K, K)), np.zeros((K, V))]
    for n, seq in enumerate(x):
        init, trans, emit, logZ, Z, lw, q = _brute_stats(lpi, lA, lB, seq, K, V)
        # the local bound: log Z̃ and, by definition, E_q[log p(x, z)] − E_q[log q(z)]
        assert local.log_norm[n] == pytest.approx(logZ, rel=1e-12, abs=1e-12)
        assert local.log_norm[n] == pytest.approx(q @ lw - q @ np.log(q), rel=1e-10)
        # per-sequence statistics: single and pairwise marginals, emissions
        one = model.suffstats(local, x, weights=np.eye(len(x))[n])
        np.testing.assert_allclose(one["init"], init, atol=1e-12)
        np.testing.assert_allclose(one["trans"], trans, atol=1e-12)
        np.testing.assert_allclose(one["emit"], emit, atol=1e-12)
        # pairwise marginals of each step sum over j to the single marginal
        for t in range(len(seq)):
            g = np.bincount(Z[:, t], weights=q, minlength=K)
            j = int(np.flatnonzero(local.layout.order == n)[0])
            np.testing.assert_allclose(local.gamma[t, j], g, atol=1e-12)
        for a, b in zip(tot, (init, trans, emit)):
            a += w[n] * b
    weighted = model.suffstats(local, x, weights=w)
    for name, ref in zip(("init", "trans", "emit"), tot):
        np.testing.assert_allclose(weighted[name], ref, atol=1e-10)
    # ‖t_n‖² per sequence
    sq = []
    for n, seq in enumerate(x):
        init, trans, emit = _brute_stats(lpi, lA, lB, seq, K, V)[:3]
        sq.append((init ** 2).sum() + (trans ** 2).sum() + (emit ** 2).sum())
    np.testing.assert_allclose(model.suffstats_sqnorm(local, x), sq, rtol=1e-10)


def test_plugin_likelihood_filtering_viterbi_equal_enumeration(tiny):
    model, lam, x = tiny
    K = model.n_states
    pi, A, B = model.mean_params(lam)
    ll = model.log_likelihood(lam, x)
    filt = model.filtering(lam, x)
    paths = model.viterbi(lam, x)
    for n, seq in enumerate(x):
        Z, lw = _path_logweights(np.log(pi), np.log(A), np.log(B), seq)
        assert ll[n] == pytest.approx(logsumexp(lw), rel=1e-12)
        np.testing.assert_array_equal(paths[n], Z[np.argmax(lw)])
        for t in range(len(seq)):   # p(z_t | x_1..t): enumerate the prefix
            Zt, lwt = _path_logweights(np.log(pi), np.log(A), np.log(B), seq[:t + 1])
            f = np.bincount(Zt[:, t], weights=np.exp(lwt - logsumexp(lwt)), minlength=K)
            np.testing.assert_allclose(filt[n][t], f, atol=1e-12)


def test_variational_predictive_equals_exact_dirichlet_moments():
    """log E_q[p(x|β)] = log Σ_z ∏_factors E_q[∏ θ^counts] (Dirichlet moments), exactly."""
    model = DiscreteHMM(2, 3, predictive_draws=20000)
    rng = np.random.default_rng(3)
    lam = _random_lam(model, rng, scale=1.5)
    x = Sequences.from_list([[0, 2, 1, 1], [2], [1, 0, 0, 2, 2]])

    def log_moment(a, c):   # log E_{Dir(a)}[∏ θ_j^{c_j}], rows along the last axis
        return (gammaln(a.sum(-1)) - gammaln((a + c).sum(-1)) + (gammaln(a + c) - gammaln(a)).sum(-1)).sum()

    exact = []
    for seq in x:
        tot = []
        for z in itertools.product(range(2), repeat=len(seq)):
            ci, ct, ce = np.zeros(2), np.zeros((2, 2)), np.zeros((2, 3))
            ci[z[0]] += 1
            for t in range(len(seq)):
                ce[z[t], seq[t]] += 1
                if t:
                    ct[z[t - 1], z[t]] += 1
            tot.append(log_moment(lam["init"], ci) + log_moment(lam["trans"], ct)
                       + log_moment(lam["emit"], ce))
        exact.append(logsumexp(tot))
    exact = np.array(exact)
    est = model.predictive_logpdf(lam, x)
    # MC relative error of the mean with 20,000 draws is < 2% here; allow 0.05 nats
    np.testing.assert_allclose(est, exact, atol=0.05)
    # the local bound is below it (Jensen twice), and deterministic given the seed
    assert np.all(model.elbo_bound(lam, x) <= exact + 1e-12)
    np.testing.assert_array_equal(est, model.predictive_logpdf(lam, x))


def test_global_elbo_matches_monte_carlo_kl():
    model = DiscreteHMM(2, 3, init_concentration=[0.5, 2.0], transition_concentration=0.8,
                        emission_concentration=[[1.0, 0.3, 2.0], [0.6, 0.6, 0.6]])
    lam = _random_lam(model, np.random.default_rng(4))
    rng = np.random.default_rng(5)
    eta = model.prior()
    S, total, var = 40000, 0.0, 0.0
    for name in ("init", "trans", "emit"):
        a, b = np.atleast_2d(lam[name]), np.atleast_2d(eta[name])
        for k in range(a.shape[0]):
            th = rng.dirichlet(a[k], size=S)
            d = stats.dirichlet(a[k]).logpdf(th.T) - stats.dirichlet(b[k]).logpdf(th.T)
            total += d.mean()
            var += d.var() / S
    assert -model.global_elbo(lam) == pytest.approx(total, abs=5 * np.sqrt(var))


def test_one_cavi_sweep_and_elbo_match_hmmlearn():
    hmm = pytest.importorskip("hmmlearn.vhmm")
    K, V = 3, 4
    rng = np.random.default_rng(7)
    pi = np.array([0.6, 0.3, 0.1])
    A = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.2, 0.7]])
    B = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.05, 0.05, 0.45, 0.45]])
    x, _ = sample_hmm(pi, A, B, rng.integers(3, 25, size=60), rng)
    model = DiscreteHMM(K, V, init_concentration=0.5, transition_concentration=0.3,
                        emission_concentration=0.9)
    lam = model.init_params(np.random.default_rng(1), x, len(x))
    engine = batch_vi(model, len(x))
    state = engine.state_from_params(lam)
    new_state, info = engine.update(state, x)

    ref = hmm.VariationalCategoricalHMM(n_components=K, n_features=V, n_iter=1, init_params="",
                                        params="ste", implementation="log")
    ref.startprob_prior_, ref.transmat_prior_ = np.full(K, 0.5), np.full((K, K), 0.3)
    ref.emissionprob_prior_ = np.full((K, V), 0.9)
    ref.startprob_posterior_ = lam["init"].copy()
    ref.transmat_posterior_ = lam["trans"].copy()
    ref.emissionprob_posterior_ = lam["emit"].copy()
    ref.fit(x.symbols[:, None], x.lengths)
    np.testing.assert_allclose(new_state.lam["init"], ref.startprob_posterior_, rtol=1e-9)
    np.testing.assert_allclose(new_state.lam["trans"], ref.transmat_posterior_, rtol=1e-9)
    np.testing.assert_allclose(new_state.lam["emit"], ref.emissionprob_posterior_, rtol=1e-9)
    assert info.elbo == pytest.approx(ref.monitor_.history[0], rel=1e-9)


def test_batch_vi_recovers_a_well_separated_hmm():
    rng = np.random.default_rng(11)
    A = np.array([[0.9, 0.1], [0.2, 0.8]])
    B = np.array([[0.85, 0.1, 0.05], [0.05, 0.15, 0.8]])
    x, _ = sample_hmm([0.5, 0.5], A, B, [40] * 300, rng)
    model = DiscreteHMM(2, 3)
    engine = batch_vi(model, len(x))
    state, _ = engine.fit(engine.init(x, seed=0), x, n_steps=60)
    _, A_hat, B_hat = model.mean_params(state.lam)
    k = np.argsort(B_hat[:, 0])[::-1]          # state order: the one emitting 0 first
    np.testing.assert_allclose(A_hat[np.ix_(k, k)], A, atol=0.03)
    np.testing.assert_allclose(B_hat[k], B, atol=0.03)


def test_svi_plus_reaches_the_batch_vi_fit_from_two_starts():
    """SVI+ on minibatches of 100 (M = 25) ends near batch VI's held-out predictive.

    Held-out log predictive per symbol; a start from noise is 0.1-0.6 nats
    worse. Tolerance 0.01 nats/symbol (the seed-to-seed spread is ~0.002).
    """
    rng = np.random.default_rng(12)
    A = np.array([[0.9, 0.1], [0.2, 0.8]])
    B = np.array([[0.85, 0.1, 0.05], [0.05, 0.15, 0.8]])
    x, _ = sample_hmm([0.5, 0.5], A, B, rng.integers(5, 40, size=2000), rng)
    train, held = x[:1500], x[1500:]
    model = DiscreteHMM(2, 3, predictive_draws=50)

    def per_symbol(lam):
        return model.predictive_logpdf(lam, held).sum() / held.n_symbols_total

    vi = batch_vi(model, len(train))
    ref = per_symbol(vi.fit(vi.init(train, seed=0), train, n_steps=100)[0].lam)
    for seed in range(2):
        engine = SVI(model, n_total=len(train), effective_batch_size=25,
                     schedule=RobbinsMonro(tau0=10.0, kappa=0.6))
        state = engine.init(train, seed=seed)
        before = per_symbol(state.lam)
        state, infos = engine.fit(state, train, n_steps=300, batch_size=100)
        assert infos[-1].noise_std == pytest.approx(np.sqrt(3.0))
        assert per_symbol(state.lam) > before + 0.05
        assert per_symbol(state.lam) == pytest.approx(ref, abs=0.01)


def test_check_batch_rejects_bad_sequences():
    model = DiscreteHMM(2, 3)
    with pytest.raises(ValueError, match=r"symbols outside 0..2 .*\[3\] in sequences \[1\]"):
        model.check_batch([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="empty sequences at \\[0\\]"):
        model.check_batch([[], [1]])
    with pytest.raises(ValueError, match="at least one sequence"):
        model.check_batch([])
    with pytest.raises(ValueError, match="integer symbols"):
        model.check_batch([[0.5, 1]])
    with pytest.raises(ValueError, match="n_states must be an integer >= 1, got 0"):
        DiscreteHMM(0, 3)
    with pytest.raises(ValueError, match="emission_concentration must be a finite number > 0"):
        DiscreteHMM(2, 3, emission_concentration=-1.0)


def test_domain_and_max_step_blocks():
    model = DiscreteHMM(2, 2)
    lam = _random_lam(model, np.random.default_rng(0))
    tgt = lam.copy()
    tgt["trans"][1, 0] = -lam["trans"][1, 0]        # row 1 of A leaves the domain at s = 1/2
    blocks = model.max_step(lam, tgt)
    assert [b[0] for b in blocks] == [("init",), ("trans",), ("emit",)]
    assert np.isinf(blocks[0][1]) and np.all(np.isinf(blocks[2][1]))
    np.testing.assert_allclose(blocks[1][1], [np.inf, 0.5])
    assert model.in_domain(lam) and not model.in_domain(tgt)


def test_constant_step_engine_round_trip_with_lists():
    """A plain list of lists is a valid batch for the engine (coerced by check_batch)."""
    model = DiscreteHMM(2, 3)
    data = [[0, 1, 2, 2], [1, 1], [2, 0, 0]]
    engine = SVI(model, n_total=3, schedule=Constant(1.0))
    state = engine.init(data, seed=0)
    s1, _ = engine.update(state, data)
    s2, _ = engine.update(state, Sequences.from_list(data))
    assert s1.lam.array_equal(s2.lam)


def test_scoring_through_streamsvi_load(tmp_path):
    import streamsvi
    from streamsvi.checkpoint import CheckpointStore

    rng = np.random.default_rng(21)
    x, _ = sample_hmm([0.5, 0.5], [[0.9, 0.1], [0.2, 0.8]], [[0.85, 0.1, 0.05], [0.05, 0.15, 0.8]],
                      rng.integers(2, 15, size=200), rng)
    model = DiscreteHMM(2, 3, predictive_draws=30)
    engine = SVI(model, n_total=len(x), effective_batch_size=10)
    state, _ = engine.fit(engine.init(x, seed=0), x, n_steps=20, batch_size=50)
    CheckpointStore(tmp_path).save(engine, state, offsets=[])
    fitted = streamsvi.load(tmp_path)
    assert fitted.model.get_params() == model.get_params() and fitted.lam.array_equal(state.lam)
    new = x[:5]
    np.testing.assert_array_equal(fitted.log_likelihood(new), model.log_likelihood(state.lam, new))
    np.testing.assert_array_equal(fitted.predictive_logpdf(new), model.predictive_logpdf(state.lam, new))
    assert [p.tolist() for p in fitted.viterbi(new)] == [p.tolist() for p in model.viterbi(state.lam, new)]
    filt = fitted.filtering(new)
    assert [f.shape for f in filt] == [(L, 2) for L in new.lengths]
    np.testing.assert_allclose([f.sum(axis=1) for f in filt][0], 1.0)
    rows = fitted.score(new.to_list())
    assert len(rows) == 5 and set(rows[0]) == {"log_likelihood", "log_predictive", "viterbi"}
    assert rows[0]["viterbi"] == fitted.viterbi(new)[0].tolist()
    np.testing.assert_array_equal(fitted.elbo_bound(new), model.elbo_bound(state.lam, new))
    assert set(fitted.scoring_methods) == set(DiscreteHMM.scoring_methods)
    with pytest.raises(AttributeError, match="its scoring methods are"):
        fitted.transform(new)


def test_example_config_builds_the_model():
    from pathlib import Path

    from streamsvi.service.config import ConfigError, build_model, load_config, validate

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "hmm.toml")
    model = build_model(cfg["model"])
    assert isinstance(model, DiscreteHMM) and (model.n_states, model.n_symbols) == (10, 4)
    assert cfg["validation"]["max_sequence_length"] == 10000
    raw = {"model": {"kind": "hmm", "n_components": 3}, "inference": {"n_total": 10},
           "source": {"kind": "file", "path": "x.jsonl"}, "checkpoint": {"directory": "ck"}}
    with pytest.raises(ConfigError, match="model.n_symbols: required for kind = 'hmm'"):
        validate(raw)
    raw["model"]["n_symbols"] = 4
    assert build_model(validate(raw)["model"]).get_params()["emission_concentration"] is None
    raw["model"]["scale"] = 1.0
    with pytest.raises(ConfigError, match=r"setting\(s\) \['scale'\] do not apply to kind = 'hmm'"):
        build_model(validate(raw)["model"])
