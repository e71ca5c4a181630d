"""LDA: the vectorised local step against a per-document loop, batch VI against
scikit-learn's batch LDA, and the held-out bound against independent
computations (plain numpy per document, scipy's Dirichlet entropy,
scikit-learn's ``perplexity``)."""
import numpy as np
import pytest
import scipy.sparse as sp
from scipy import stats
from scipy.special import digamma, gammaln, logsumexp

from streamsvi.datasets import make_lda_corpus
from streamsvi.inference import SVI, Constant, RobbinsMonro, batch_vi
from streamsvi.models import LDA, NatParams, model_from_dict, model_to_dict
from streamsvi.models import lda as lda_module
from streamsvi.inference import storage_columns
from streamsvi.inference.storage_columns import ScaledColumns

sklearn_lda = pytest.importorskip("sklearn.decomposition")


def _corpus(n=60, K=4, V=120, length=50, seed=0):
    X, _, _ = make_lda_corpus(n, n_topics=K, n_words=V, doc_length=length, alpha=0.4, eta=0.1, seed=seed)
    X = X.tolil()
    X[3, :] = 0
    X[3, 7] = 2.0                       # a one-word document
    return X.tocsr()


def _brute_local(lam, X, alpha, tol, max_it):
    """Hoffman's E step one document at a time, unshifted, as in scikit-learn's loop."""
    Elb = digamma(lam) - digamma(lam.sum(1))[:, None]
    Eb = np.exp(Elb)
    K = lam.shape[0]
    gammas, iters, bounds, stats_ = [], [], [], np.zeros_like(lam)
    for d in range(X.shape[0]):
        ids = X.indices[X.indptr[d]:X.indptr[d + 1]]
        c = X.data[X.indptr[d]:X.indptr[d + 1]]
        g = np.ones(K)
        th = np.exp(digamma(g) - digamma(g.sum()))
        for it in range(1, max_it + 1):
            Z = th @ Eb[:, ids]
            gn = alpha + th * ((c / Z) @ Eb[:, ids].T)
            change = np.abs(gn - g).mean()
            g = gn
            th = np.exp(digamma(g) - digamma(g.sum()))
            if change < tol:
                break
        Elt = digamma(g) - digamma(g.sum())
        # φ_wk ∝ exp(E log θ_k + E log β_kw), explicitly
        logphi = Elt[:, None] + Elb[:, ids]
        lse = logsumexp(logphi, axis=0)
        phi = np.exp(logphi - lse)
        stats_[:, ids] += phi * c
        bound = (c @ lse + gammaln(alpha * K) - K * gammaln(alpha) - gammaln(g.sum())
                 + gammaln(g).sum() + ((alpha - g) * Elt).sum())
        gammas.append(g)
        iters.append(it)
        bounds.append(bound)
    return np.array(gammas), np.array(iters), np.array(bounds), stats_


compiled = pytest.mark.skipif(not lda_module.COMPILED, reason="the compiled local step is not built")
PATHS = ["blocked", "dense", pytest.param("compiled", marks=compiled)]


@pytest.mark.parametrize("path", PATHS)
def test_local_step_matches_a_per_document_loop(path):
    X = _corpus()
    K, V = 4, X.shape[1]
    model = LDA(K, V, doc_topic_prior=0.3, topic_word_prior=0.1, mean_change_tol=1e-6,
                max_doc_update_iter=300)
    model._local_path = path
    rng = np.random.default_rng(1)
    lam = NatParams(topic_word=rng.gamma(2.0, 5.0, (K, V)))
    local = model.local_step(lam, X)
    g, it, bound, S = _brute_local(lam["topic_word"], X, 0.3, 1e-6, 300)
    np.testing.assert_array_equal(local.n_iter, it)
    np.testing.assert_allclose(local.gamma, g, rtol=1e-9)
    np.testing.assert_allclose(model.local_elbo(local), bound, rtol=1e-10)
    np.testing.assert_allclose(model.suffstats(local, X)["topic_word"], S, rtol=1e-9, atol=1e-12)
    # the statistics sum to the words, and the squared norms are Σ (n φ)²
    assert model.suffstats(local, X)["topic_word"].sum() == pytest.approx(X.sum(), rel=1e-12)
    w = np.eye(X.shape[0])[5]
    one = model.suffstats(local, X, weights=w)["topic_word"]
    assert model.suffstats_sqnorm(local, X)[5] == pytest.approx((one ** 2).sum(), rel=1e-10)


def _topic_sparse_problem(alpha, K=30, V=600, n=120, seed=5):
    """Documents about 2-3 of K distinct topics, and λ near those topics."""
    X, _, _ = make_lda_corpus(n, n_topics=K, n_words=V, doc_length=150, alpha=0.05, eta=0.02,
                              seed=seed)
    rng = np.random.default_rng(seed)
    lam = NatParams(topic_word=rng.gamma(0.3, 30.0, (K, V)) + 0.02)
    return LDA(K, V, doc_topic_prior=alpha, topic_word_prior=0.02), lam, X.tocsr()


def _assert_same_local_step(model, a, b):
    """Same sweeps; γ, φ's ratios and the statistics to 1e-9; the bound to 1e-12."""
    np.testing.assert_array_equal(a.n_iter, b.n_iter)
    np.testing.assert_allclose(a.gamma, b.gamma, rtol=1e-9)
    np.testing.assert_allclose(a.log_norm, b.log_norm, rtol=1e-12)
    np.testing.assert_allclose(a.ratio, b.ratio, rtol=1e-9)
    np.testing.assert_allclose(model.suffstats(a)["topic_word"], model.suffstats(b)["topic_word"],
                               rtol=1e-9, atol=1e-12)


def _counting(monkeypatch, name):
    calls = []
    orig = getattr(LDA, name)

    def wrapped(*a, **k):
        calls.append(a)
        return orig(*a, **k)
    monkeypatch.setattr(LDA, name, staticmethod(wrapped) if name == "_hold" else wrapped)
    return calls


@pytest.mark.parametrize("alpha", [0.05, 0.001])      # θ̃ unshifted / shifted by ψ(max γ)
def test_held_topics_do_not_change_the_local_step(alpha, monkeypatch):
    """Holding negligible topics (_hold) gives the local step of the plain iteration: same
    sweeps, γ and bound to 1e-9, statistics to 1e-9, and it does hold topics here."""
    model, lam, X = _topic_sparse_problem(alpha)
    model._local_path = "blocked"
    calls = _counting(monkeypatch, "_hold")
    held = model.local_step(lam, X)
    assert calls, "no sweep reached a hold point"
    assert model._theta_unshifted() == (alpha > 0.01)
    monkeypatch.setattr("streamsvi.models.lda._HOLD_AT", ())
    plain = model.local_step(lam, X)
    assert plain.n_iter.mean() > 20                       # the holds had sweeps to save
    _assert_same_local_step(model, held, plain)


def test_a_held_topic_that_would_come_back_is_refitted(monkeypatch):
    """With a reckless threshold (ε = 1) topics are held while they still matter; the final
    check finds the documents where a held topic is no longer negligible and fits them
    again without holding, so those come out exactly as the plain iteration."""
    model, lam, X = _topic_sparse_problem(0.05)
    model._local_path = "blocked"
    monkeypatch.setattr("streamsvi.models.lda._HOLD_EPS", 1.0)
    refits = _counting(monkeypatch, "_refit")
    reckless = model.local_step(lam, X)
    assert refits, "the final check found nothing to refit"
    docs = np.concatenate([c[2] for c in refits])
    monkeypatch.setattr("streamsvi.models.lda._HOLD_AT", ())
    plain = model.local_step(lam, X)
    np.testing.assert_allclose(reckless.gamma[docs], plain.gamma[docs], rtol=1e-12)
    np.testing.assert_array_equal(reckless.n_iter[docs], plain.n_iter[docs])
    np.testing.assert_allclose(reckless.log_norm[docs], plain.log_norm[docs], rtol=1e-12)


@compiled
@pytest.mark.parametrize("alpha", [0.05, 0.001])
def test_compiled_local_step_equals_the_numpy_kernel(alpha):
    """The C kernel (one document at a time) and the blocked numpy kernel: same sweeps,
    γ, bound and statistics to 1e-9 (only the order of the sums differs)."""
    model, lam, X = _topic_sparse_problem(alpha)
    model._local_path = "compiled"
    c = model.local_step(lam, X)
    model._local_path = "blocked"
    b = model.local_step(lam, X)
    _assert_same_local_step(model, c, b)


@compiled
@pytest.mark.parametrize("eps, hold_at", [(1.0, None), (1e-2, tuple(range(1, 400)))])
def test_compiled_kernel_holds_and_refits_as_the_numpy_kernel(eps, hold_at, monkeypatch):
    """With reckless thresholds (the refit test's; and a hold check after every sweep, so
    that the change owed by held topics decides when documents stop), the C kernel holds
    the same topics, refits the same documents without holding, and so agrees with the
    numpy kernel document by document (while both differ from the plain iteration)."""
    model, lam, X = _topic_sparse_problem(0.05)
    monkeypatch.setattr("streamsvi.models.lda._HOLD_EPS", eps)
    if hold_at is not None:
        monkeypatch.setattr("streamsvi.models.lda._HOLD_AT", hold_at)
    model._local_path = "compiled"
    c = model.local_step(lam, X)
    model._local_path = "blocked"
    b = model.local_step(lam, X)
    np.testing.assert_array_equal(c.n_iter, b.n_iter)
    np.testing.assert_allclose(c.gamma, b.gamma, rtol=1e-9)
    monkeypatch.setattr("streamsvi.models.lda._HOLD_AT", ())
    plain = model.local_step(lam, X)
    assert np.abs(c.gamma - plain.gamma).max() > 1e-6      # the thresholds did change results


@compiled
def test_compiled_kernel_refuses_bad_buffers():
    model, lam, X = _topic_sparse_problem(0.05)
    ex = model._expectations(lam)
    bad = X.copy()
    bad.indices = bad.indices.copy()
    bad.indices[3] = X.shape[1] + 5                  # past the vocabulary
    with pytest.raises(ValueError, match="word index out of range"):
        model._fit_gamma_compiled(ex, bad)


def test_compiled_kernel_is_built_where_a_compiler_is():
    """CI has gcc: the optional extension must have been built, not silently skipped."""
    import shutil
    import sysconfig
    if not shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc"):
        pytest.skip("no C compiler here: the numpy kernels run")
    assert lda_module.COMPILED, "pip install -e . did not build streamsvi/models/_ldakernel.c"


@pytest.mark.parametrize("path", ["blocked", pytest.param("compiled", marks=compiled)])
def test_local_step_does_not_depend_on_batching(path):
    X = _corpus(n=90, V=400, length=80, seed=2)      # long enough for several blocks
    model = LDA(4, X.shape[1], mean_change_tol=1e-5)
    model._local_path = path
    lam = model.init_params(np.random.default_rng(0), X, X.shape[0])
    whole = model.local_step(lam, X)
    order = np.random.default_rng(3).permutation(X.shape[0])
    parts = [model.local_step(lam, X[order[i::3]]) for i in range(3)]
    for i, p in enumerate(parts):
        np.testing.assert_allclose(p.gamma, whole.gamma[order[i::3]], rtol=1e-12)
        np.testing.assert_array_equal(p.n_iter, whole.n_iter[order[i::3]])


def test_dense_and_sparse_input_agree():
    X = _corpus(n=20)
    model = LDA(4, X.shape[1])
    lam = model.init_params(np.random.default_rng(0), X, 20)
    a = model.local_step(lam, X)
    b = model.local_step(lam, X.toarray())
    np.testing.assert_array_equal(a.gamma, b.gamma)


def test_batch_vi_matches_sklearn_batch_lda():
    """Same λ0 (scikit-learn draws Gamma(100, 1/100) from RandomState(seed)), same priors,
    local steps run to convergence on both sides: λ agrees to 1e-6 (relative) after 15
    sweeps, and so do the topic proportions of the documents."""
    K, seed = 3, 4
    topics = np.full((K, 36), 0.01)
    for k in range(K):
        topics[k, 12 * k:12 * k + 12] = 1.0
    X, _, _ = make_lda_corpus(80, n_topics=K, n_words=36, doc_length=30, alpha=0.5, seed=5,
                              topics=topics / topics.sum(1, keepdims=True))
    alpha, eta, T = 0.5, 0.2, 15
    sk = sklearn_lda.LatentDirichletAllocation(
        n_components=K, doc_topic_prior=alpha, topic_word_prior=eta, learning_method="batch",
        max_iter=T, evaluate_every=-1, mean_change_tol=1e-12, max_doc_update_iter=5000,
        random_state=seed).fit(X)
    lam0 = np.random.RandomState(seed).gamma(100.0, 0.01, (K, X.shape[1]))
    model = LDA(K, X.shape[1], doc_topic_prior=alpha, topic_word_prior=eta,
                mean_change_tol=1e-12, max_doc_update_iter=5000)
    engine = batch_vi(model, X.shape[0])
    state, _ = engine.fit(engine.state_from_params(NatParams(topic_word=lam0)), X, n_steps=T)
    np.testing.assert_allclose(state.lam["topic_word"], sk.components_, rtol=1e-6)
    np.testing.assert_allclose(model.topic_proportions(state.lam, X), sk.transform(X), atol=1e-6)


def _dirichlet_kl_by_entropy(lam, eta):
    """Σ_k KL(Dir(λ_k) ‖ Dir(η)) = Σ_k (−H(q_k) − E_q[log p(β_k)]) with scipy's entropy."""
    V = lam.shape[1]
    total = 0.0
    for row in lam:
        elog = digamma(row) - digamma(row.sum())
        e_log_p = gammaln(V * eta) - V * gammaln(eta) + (eta - 1.0) * elog.sum()
        total += -stats.dirichlet(row).entropy() - e_log_p
    return total


def test_heldout_bound_matches_an_independent_computation():
    X = _corpus(n=40, V=60, seed=6)
    K, eta, alpha = 4, 0.15, 0.25
    model = LDA(K, X.shape[1], doc_topic_prior=alpha, topic_word_prior=eta,
                mean_change_tol=1e-8, max_doc_update_iter=2000)
    lam = NatParams(topic_word=np.random.default_rng(7).gamma(1.5, 3.0, (K, X.shape[1])))
    _, _, bound, _ = _brute_local(lam["topic_word"], X, alpha, 1e-8, 2000)
    kl = _dirichlet_kl_by_entropy(lam["topic_word"], eta)
    W = X.sum()
    assert model.global_elbo(lam) == pytest.approx(-kl, rel=1e-10)
    assert model.perword_bound(lam, X) == pytest.approx(bound.sum() / W, rel=1e-9)
    assert model.perword_bound(lam, X, "full") == pytest.approx((bound.sum() - kl) / W, rel=1e-9)
    n_docs = 400
    assert model.perword_bound(lam, X, "apportioned", n_docs=n_docs) == pytest.approx(
        (bound.sum() - kl * X.shape[0] / n_docs) / W, rel=1e-9)
    assert model.perplexity(lam, X) == pytest.approx(np.exp(-bound.sum() / W), rel=1e-9)
    np.testing.assert_allclose(model.predictive_logpdf(lam, X), bound, rtol=1e-9)
    with pytest.raises(ValueError, match="topic_kl must be"):
        model.perword_bound(lam, X, "half")
    with pytest.raises(ValueError, match="needs n_docs"):
        model.perword_bound(lam, X, "apportioned")


def test_full_perplexity_matches_sklearn():
    """topic_kl="full" is scikit-learn's perplexity(X) for the same λ and priors."""
    X = _corpus(n=50, V=80, seed=8)
    K = 4
    sk = sklearn_lda.LatentDirichletAllocation(n_components=K, doc_topic_prior=0.2,
                                               topic_word_prior=0.3, max_iter=1,
                                               mean_change_tol=1e-10, max_doc_update_iter=5000,
                                               random_state=0).fit(X)
    model = LDA(K, X.shape[1], doc_topic_prior=0.2, topic_word_prior=0.3, mean_change_tol=1e-10,
                max_doc_update_iter=5000)
    lam = NatParams(topic_word=sk.components_)
    assert model.perplexity(lam, X, topic_kl="full") == pytest.approx(sk.perplexity(X), rel=1e-7)


def test_svi_runs_on_csr_batches_and_learns_the_topics():
    K = 3
    topics = np.full((K, 45), 0.005)
    for k in range(K):
        topics[k, 15 * k:15 * k + 15] = 1.0
    topics /= topics.sum(1, keepdims=True)
    X, theta, _ = make_lda_corpus(600, n_topics=K, n_words=45, doc_length=50, alpha=0.2, seed=9,
                                  topics=topics)
    model = LDA(K, 45, doc_topic_prior=0.2, topic_word_prior=0.05)
    engine = SVI(model, n_total=600, schedule=RobbinsMonro(tau0=1.0, kappa=0.7),
                 effective_batch_size=25)
    state = engine.init(X, seed=0)
    state, infos = engine.fit(state, X, n_steps=60, batch_size=50)
    assert state.records_seen == 3000 and all(np.isfinite(i.elbo) for i in infos)
    learned = model.topics(state.lam)
    # each true topic is matched by a learned one (total variation < 0.1)
    tv = 0.5 * np.abs(learned[:, None, :] - topics[None, :, :]).sum(-1)
    assert tv.min(axis=0).max() < 0.1, tv
    # and the held-out documents' bound improved over the start
    fresh = engine.init(X, seed=0).lam
    assert model.perword_bound(state.lam, X[:100]) > model.perword_bound(fresh, X[:100]) + 0.1


def test_domain_and_max_step():
    model = LDA(2, 3, topic_word_prior=0.5)
    lam = NatParams(topic_word=[[1.0, 2.0, 3.0], [1.0, 1.0, 1.0]])
    target = NatParams(topic_word=[[-1.0, 2.0, 5.0], [2.0, 2.0, 2.0]])
    (names, lim), = model.max_step(lam, target)
    assert names == ("topic_word",)
    assert lim[0] == pytest.approx(0.5) and lim[1] == np.inf     # 1 + s(−2) > 0 ⇔ s < 1/2
    assert model.in_domain(lam) and not model.in_domain(target)


def test_settings_validation_and_round_trip():
    for bad, match in [(dict(n_components=0), "n_components"), (dict(n_features=1.5), "n_features"),
                       (dict(doc_topic_prior=-1), "doc_topic_prior"),
                       (dict(doc_topic_prior=[1, 2]), "doc_topic_prior"),
                       (dict(topic_word_prior=0), "topic_word_prior"),
                       (dict(max_doc_update_iter=0), "max_doc_update_iter"),
                       (dict(mean_change_tol=-1), "mean_change_tol"), (dict(init="kmeans"), "init"),
                       (dict(accelerate="yes"), "accelerate")]:
        with pytest.raises(ValueError, match=match):
            LDA(**{"n_components": 3, "n_features": 10, **bad})
    m = LDA(3, 10, doc_topic_prior=[0.1, 0.2, 0.3], init="documents")
    m2 = model_from_dict(model_to_dict(m))
    assert m2.get_params() == m.get_params() and m2.name == "lda" and m2.record_kind == "bow"
    assert LDA(4, 10).get_params()["doc_topic_prior"] is None       # 1/K, as given


def test_check_batch_errors_name_the_problem():
    model = LDA(2, 5)
    with pytest.raises(ValueError, match="n_features=5 columns"):
        model.check_batch(np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"documents \[1\]"):
        model.check_batch(np.array([[1, 0, 0, 0, 0], [0, -1, 0, 0, 0.0]]))
    with pytest.raises(ValueError, match="finite"):
        model.check_batch(sp.csr_matrix(np.array([[np.nan, 0, 0, 0, 1.0]])))
    with pytest.raises(ValueError, match="at least one document"):
        model.check_batch(sp.csr_matrix((0, 5)))
    assert model.check_batch(np.array([0, 1, 2, 0, 1])).shape == (1, 5)


def test_documents_init_seeds_distinct_topics():
    X = _corpus(n=30)
    model = LDA(4, X.shape[1], topic_word_prior=0.1, init="documents")
    lam = model.init_params(np.random.default_rng(0), X, n_total=300)["topic_word"]
    assert lam.min() == pytest.approx(0.1)
    # each topic carries a 1/K share of the corpus' (scaled) words on top of η
    np.testing.assert_allclose(lam.sum(1) - 0.1 * X.shape[1], 300 / 30 * X.sum() / 4)


def test_snapshot_scores_topic_proportions_and_perplexity(tmp_path):
    import streamsvi
    from streamsvi.checkpoint import CheckpointStore

    X = _corpus(n=40, V=50, seed=10)
    model = LDA(4, X.shape[1])
    engine = SVI(model, n_total=40)
    state, _ = engine.fit(engine.init(X, seed=0), X, n_steps=5, batch_size=20)
    CheckpointStore(tmp_path).save(engine, state, offsets=[])
    fitted = streamsvi.load(tmp_path)
    np.testing.assert_allclose(fitted.topic_proportions(X[:5]), model.topic_proportions(state.lam, X[:5]))
    assert fitted.perplexity(X) == pytest.approx(model.perplexity(state.lam, X))
    assert fitted.perword_bound(X, "full") == pytest.approx(model.perword_bound(state.lam, X, "full"))
    scored = fitted.score(X[:3])
    theta = model.topic_proportions(state.lam, X[:3])
    assert len(scored) == 3 and [s["topic"] for s in scored] == theta.argmax(axis=1).tolist()
    np.testing.assert_allclose([s["topic_proportions"] for s in scored], theta, atol=1e-11)
    assert scored[0]["log_bound"] == pytest.approx(model.predictive_logpdf(state.lam, X[:1])[0])


def test_accelerated_local_step_reaches_the_same_fixed_point():
    """SQUAREM: same fixed point (tight tolerance: γ agree), and at the default tolerance a
    final γ at least as close to it as plain sweeps, with fewer evaluations; results do
    not depend on batching."""
    X = _corpus(n=80, V=300, length=120, seed=11)
    K = 4
    lam = NatParams(topic_word=np.random.default_rng(12).gamma(0.5, 4.0, (K, X.shape[1])) + 0.05)
    tight = LDA(K, X.shape[1], mean_change_tol=1e-10, max_doc_update_iter=20000)
    tight_acc = LDA(K, X.shape[1], mean_change_tol=1e-10, max_doc_update_iter=20000, accelerate=True)
    ref = tight.local_step(lam, X)
    np.testing.assert_allclose(tight_acc.local_step(lam, X).gamma, ref.gamma, rtol=1e-6, atol=1e-6)
    plain = LDA(K, X.shape[1]).local_step(lam, X)
    acc_model = LDA(K, X.shape[1], accelerate=True)
    acc = acc_model.local_step(lam, X)
    assert acc.n_iter.sum() < plain.n_iter.sum()
    gap_plain = (ref.log_norm - plain.log_norm).sum()
    gap_acc = (ref.log_norm - acc.log_norm).sum()
    assert gap_acc <= gap_plain + 1e-9, (gap_acc, gap_plain)
    half = acc_model.local_step(lam, X[1::2])
    np.testing.assert_allclose(half.gamma, acc.gamma[1::2], rtol=1e-12)
    np.testing.assert_array_equal(half.n_iter, acc.n_iter[1::2])


# ------------------------------------------------------------ the sparse global step
class _DenseLDAClass(LDA):
    """LDA declaring the default storage: the engine's own dense step on
    ``NatParams(topic_word=λ)``, the reference of the scaled-columns step."""

    global_storage = "dense"


def _DenseLDA(model):
    """The same LDA (same settings) on the dense path."""
    return _DenseLDAClass(**model.get_params())


def _sparse_and_dense(model, X, steps, batch, **engine_kw):
    """Run the sparse (scaled columns) and the dense engine path side by side on the same batches."""
    sparse, dense = SVI(model, **engine_kw), SVI(_DenseLDA(model), **engine_kw)
    a, b = sparse.init(X, seed=7), dense.init(X, seed=7)
    assert model.is_scaled(a.lam) and not model.is_scaled(b.lam)
    np.testing.assert_array_equal(model.lam_matrix(a.lam), b.lam["topic_word"])
    rng = np.random.default_rng(11)
    out = []
    for _ in range(steps):
        xb = X[np.sort(rng.choice(X.shape[0], batch, replace=False))]
        a, ia = sparse.update(a, xb)
        b, ib = dense.update(b, xb)
        # (the sparse states share one stored matrix: read what is needed now)
        out.append((model.lam_matrix(a.lam), b.lam["topic_word"], ia, ib, xb,
                    (model._rowsums(a.lam).copy(), float(a.lam["topic_scale"].min()))))
    return out


@pytest.mark.parametrize("case", ["svi", "svi+", "svi+ clipped", "svi+ clipped, rho > tau"])
def test_sparse_step_equals_the_dense_update(case):
    """λ after each of 12 updates equals the engine's dense update to 1e-10 (relative), and
    so do the metrics; the batch of 15 short documents touches a fraction of the 600 words."""
    X = _corpus(n=200, K=4, V=600, length=12, seed=4)
    model = LDA(4, 600, doc_topic_prior=0.3, topic_word_prior=0.05)
    kw = {"svi": dict(schedule=RobbinsMonro(tau0=1.0, kappa=0.7)),
          "svi+": dict(schedule=RobbinsMonro(tau0=1.0, kappa=0.7), effective_batch_size=10),
          "svi+ clipped": dict(schedule=Constant(0.9), effective_batch_size=2),
          "svi+ clipped, rho > tau": dict(schedule=Constant(0.95), effective_batch_size=2,
                                          boundary_fraction=0.5)}[case]
    runs = _sparse_and_dense(model, X, 12, 15, n_total=200, **kw)
    clipped = 0
    for step, (ls, ld, ia, ib, xb, (rowsums, _)) in enumerate(runs, 1):
        touched = np.unique(xb.indices)
        assert touched.size < 600 // 2
        np.testing.assert_allclose(ls, ld, rtol=1e-10, err_msg=f"step {step}")
        assert ls.min() > 0
        assert ia.elbo == pytest.approx(ib.elbo, rel=1e-10)
        assert ia.grad_norm == pytest.approx(ib.grad_norm, rel=1e-8)
        assert ia.grad_variance == pytest.approx(ib.grad_variance, rel=1e-8)
        assert (ia.domain_clipped, ia.domain_blocks) == (ib.domain_clipped, ib.domain_blocks)
        clipped += ia.domain_clipped
        # the stored row sums kept incrementally equal the sums of λ
        np.testing.assert_allclose(rowsums, ld.sum(axis=1), rtol=1e-10)
    if "clipped" in case:
        assert clipped > 0


def test_sparse_step_writes_only_the_batch_words():
    X = _corpus(n=100, K=4, V=500, length=10, seed=5)
    model = LDA(4, 500)
    engine = SVI(model, n_total=100)
    state = engine.init(X, seed=0)
    before = state.lam["word_topic"].T.copy()
    xb = X[:8]
    new, _ = engine.update(state, xb)
    touched = np.zeros(500, dtype=bool)
    touched[np.unique(xb.indices)] = True
    mu = new.lam["word_topic"].T
    np.testing.assert_array_equal(mu[:, ~touched], before[:, ~touched])   # untouched: only s, c moved
    assert not np.array_equal(mu[:, touched], before[:, touched])
    assert (new.lam["topic_scale"] < 1).all() and (new.lam["topic_offset"] > 0).all()


def test_rescaling_the_stored_rows_keeps_the_update_exact(monkeypatch):
    """With ρ = 0.6 the scale falls below the (raised) threshold every few updates; the fold
    into the stored rows changes nothing beyond rounding."""
    monkeypatch.setattr(storage_columns, "_RESCALE_BELOW", 1e-2)
    X = _corpus(n=120, K=3, V=300, length=10, seed=6)
    model = LDA(3, 300)
    runs = _sparse_and_dense(model, X, 15, 10, n_total=120, schedule=Constant(0.6))
    scales = [r[5][1] for r in runs]
    assert min(scales) >= 1e-2 and any(s == 1.0 for s in scales)      # it did fold
    for ls, ld, *_ in runs:
        np.testing.assert_allclose(ls, ld, rtol=1e-10)


def test_the_global_elbo_term_is_refreshed_every_few_updates(monkeypatch):
    """K·V / _ELBO_ELEMENTS = 4: the global term is exact at steps 1, 4, 8, …, and between
    them it is the one last computed (its step is in aux)."""
    monkeypatch.setattr(storage_columns, "_ELBO_ELEMENTS", 300)
    X = _corpus(n=100, K=4, V=300, length=10, seed=8)
    model = LDA(4, 300)
    engine = SVI(model, n_total=100)
    state = engine.init(X, seed=1)
    for step in range(1, 10):
        old = model.lam_matrix(state.lam)
        xb = X[(step * 10) % 90:(step * 10) % 90 + 10]
        local = model.local_step(NatParams(topic_word=old), xb)
        state, info = engine.update(state, xb)
        exact_global = model.global_elbo(NatParams(topic_word=old))
        reported_global = info.elbo - 10.0 * float(np.sum(local.log_norm))
        if step == 1 or step % 4 == 0:
            assert reported_global == pytest.approx(exact_global, rel=1e-10)
            assert state.aux["global_elbo_step"] == step - 1
        else:
            assert state.aux["global_elbo_step"] == (4 * (step // 4) - 1 if step > 4 else 0)
            assert reported_global == pytest.approx(state.aux["global_elbo"], rel=1e-12)
            assert reported_global != pytest.approx(exact_global, rel=1e-10)


def test_a_plain_lambda_resumes_in_the_scaled_form():
    """A state whose λ is plain (a snapshot of an earlier release, or after ρ = 1) continues
    with the sparse step, from exactly that λ."""
    X = _corpus(n=100, K=4, V=300, length=10, seed=9)
    model = LDA(4, 300)
    lam = model.init_params(np.random.default_rng(0), X, 100)
    engine = SVI(model, n_total=100)
    dense = SVI(_DenseLDA(model), n_total=100)
    a, ia = engine.update(engine.state_from_params(lam), X[:10])
    b, ib = dense.update(dense.state_from_params(lam), X[:10])
    assert model.is_scaled(a.lam)
    np.testing.assert_allclose(model.lam_matrix(a.lam), b.lam["topic_word"], rtol=1e-12)
    assert ia.elbo == pytest.approx(ib.elbo, rel=1e-12)
    np.testing.assert_array_equal(lam["topic_word"], model.init_params(np.random.default_rng(0), X, 100)["topic_word"])


def test_a_snapshot_presents_lambda_itself(tmp_path):
    """The snapshot stores λ scaled (μ, s, c); a loaded model's ``lam`` is λ, its scores equal
    the training state's, and resuming continues bit for bit."""
    import streamsvi
    from streamsvi.checkpoint import CheckpointStore

    X = _corpus(n=60, V=200, length=10, seed=12)
    model = LDA(4, 200)
    engine = SVI(model, n_total=60, effective_batch_size=10)
    state, _ = engine.fit(engine.init(X, seed=0), X, n_steps=6, batch_size=20)
    assert model.is_scaled(state.lam) and (state.lam["topic_scale"] < 1).all()
    CheckpointStore(tmp_path).save(engine, state, offsets=[])
    fitted = streamsvi.load(tmp_path)
    assert set(fitted.lam) == {"topic_word"}
    np.testing.assert_array_equal(fitted.lam["topic_word"], model.lam_matrix(state.lam))
    assert fitted.perplexity(X) == pytest.approx(model.perplexity(state.lam, X), rel=1e-12)
    resumed = CheckpointStore(tmp_path).latest()
    a, _ = engine.fit(state, X, n_steps=3, batch_size=20)
    b, _ = resumed.engine.fit(resumed.state, X, n_steps=3, batch_size=20)
    assert a.lam.array_equal(b.lam)


# ------------------------------------------------- annealing with the sparse global step
from streamsvi.inference.annealing import Deterministic, Stochastic  # noqa: E402
from streamsvi.models.base import temper_dirichlet  # noqa: E402


@pytest.mark.parametrize("annealer", [Deterministic(T0=4.0, rate=0.7, n_steps=6),
                                      Deterministic(T0=3.0, schedule="linear", n_steps=6),
                                      Stochastic(rho0=0.6, decay=0.8, n_steps=6),
                                      Stochastic(rho0=0.3, schedule="linear", n_steps=6)],
                         ids=["det-geometric", "det-linear", "stoch-geometric", "stoch-linear"])
def test_annealed_sparse_step_equals_the_dense_annealed_update(annealer):
    """Under deterministic and stochastic annealing, 12 updates (6 annealed, then plain)
    of the sparse path equal the engine's dense annealed update (the update before the
    sparse form) to 1e-10 relative, with the same metrics and the same random stream;
    each 15-document batch holds under half of the 600 words."""
    X = _corpus(n=200, K=4, V=600, length=12, seed=4)
    model = LDA(4, 600, doc_topic_prior=0.3, topic_word_prior=0.05)
    kw = dict(n_total=200, schedule=RobbinsMonro(tau0=1.0, kappa=0.7), annealer=annealer)
    sparse, dense = SVI(model, **kw), SVI(_DenseLDA(model), **kw)
    a, b = sparse.init(X, seed=7), dense.init(X, seed=7)
    rng = np.random.default_rng(11)
    scaled = []
    for step in range(1, 13):
        xb = X[np.sort(rng.choice(X.shape[0], 15, replace=False))]
        assert np.unique(xb.indices).size < 300
        a, ia = sparse.update(a, xb)
        b, ib = dense.update(b, xb)
        np.testing.assert_allclose(model.lam_matrix(a.lam), b.lam["topic_word"], rtol=1e-10,
                                   err_msg=f"step {step}")
        assert a.rng_state == b.rng_state
        assert (ia.temperature, ia.restart_weight, ia.annealing_level) == \
            (ib.temperature, ib.restart_weight, ib.annealing_level)
        assert ia.elbo == pytest.approx(ib.elbo, rel=1e-10)
        assert ia.grad_norm == pytest.approx(ib.grad_norm, rel=1e-8)
        assert ia.grad_variance == pytest.approx(ib.grad_variance, rel=1e-8)
        scaled.append(model.is_scaled(a.lam))
    annealed = [annealer.temperature(t) != 1.0 or annealer.restart_weight(t) > 0 for t in range(1, 13)]
    assert annealed[:5] == [True] * 5 and annealed[6:] == [False] * 6
    # deterministic stays sparse throughout; a restart step is dense (plain λ), and the
    # sparse form comes back with the first plain step after the annealer is off
    if annealer.kind == "deterministic":
        assert all(scaled)
    else:
        assert scaled == [not x for x in annealed]


@pytest.mark.parametrize("kind", ["deterministic", "stochastic"])
def test_annealed_sparse_step_follows_the_annealing_formulas(kind):
    """The same, against the formulas written out here: λ̂ = η + (N/|S|) Σ_d E_q_T[t(θ_d)]
    from the local step at T_t, tempered 1 + (λ̂ − 1)/T_t, or mixed (1 − ρ^a_t) λ̂ + ρ^a_t η_t
    with η_t = random_init drawn from the state's stream; λ ← (1 − ρ_t) λ + ρ_t λ̂."""
    X = _corpus(n=150, K=3, V=500, length=10, seed=12)
    model = LDA(3, 500, doc_topic_prior=0.4, topic_word_prior=0.05)
    ann = Deterministic(T0=5.0, rate=0.8, n_steps=4) if kind == "deterministic" else \
        Stochastic(rho0=0.7, decay=0.8, n_steps=4)
    schedule, N = RobbinsMonro(tau0=1.0, kappa=0.6), 150.0
    engine = SVI(model, n_total=N, schedule=schedule, annealer=ann)
    state = engine.init(X, seed=3)
    L = model.lam_matrix(state.lam)
    for t in range(1, 7):
        xb = X[(t * 20) % 130:(t * 20) % 130 + 20]
        T, rho_a = ann.temperature(t), ann.restart_weight(t)
        lam = NatParams(topic_word=L)
        local = model.local_step(lam, xb, temperature=T)
        tgt = model._eta + (N / 20) * model.suffstats(local, xb)["topic_word"]
        if T != 1.0:
            tgt = temper_dirichlet(tgt, T)
        if rho_a > 0:
            eta_t = model.random_init(state.rng(), xb, N)["topic_word"]
            tgt = (1 - rho_a) * tgt + rho_a * eta_t
        L = (1 - schedule(t)) * L + schedule(t) * tgt
        want_elbo = model.global_elbo(lam) + (N / 20) * float(np.sum(model.local_step(lam, xb).log_norm))
        state, info = engine.update(state, xb)
        np.testing.assert_allclose(model.lam_matrix(state.lam), L, rtol=1e-10, err_msg=f"step {t}")
        assert info.elbo == pytest.approx(want_elbo, rel=1e-10)      # untempered
    assert model.is_scaled(state.lam)


def test_tempered_local_step_on_the_batch_columns_equals_the_full_one():
    """The tempered local step reading only the batch's columns (scaled λ; each kernel)
    gives the same γ, statistics and φ as the one reading all V columns of the plain λ."""
    X = _corpus(n=40, K=4, V=400, length=10, seed=13)
    model = LDA(4, 400, doc_topic_prior=0.2)
    lam = model.init_params(np.random.default_rng(1), X, 40)
    scaled, _ = ScaledColumns(model).init(np.random.default_rng(1), X, 40)
    np.testing.assert_array_equal(model.lam_matrix(scaled), lam["topic_word"])
    full = {}
    model._local_path = "dense"                          # every column: the reference
    try:
        for T in (1.5, 4.0):
            full[T] = model.local_step(lam, X, temperature=T)
            assert full[T].cols is None
    finally:
        model._local_path = None
    for path in ("compiled", "blocked") if lda_module.COMPILED else ("blocked",):
        model._local_path = path
        try:
            for T in (1.5, 4.0):
                a = model.local_step(scaled, X, temperature=T)
                b = full[T]
                assert a.cols is not None and a.cols.size < 400
                np.testing.assert_allclose(a.gamma, b.gamma, rtol=1e-10)
                np.testing.assert_allclose(model.suffstats(a, X)["topic_word"],
                                           model.suffstats(b, X)["topic_word"], rtol=1e-10, atol=1e-300)
                np.testing.assert_allclose(model.suffstats_sqnorm(a), model.suffstats_sqnorm(b), rtol=1e-10)
        finally:
            model._local_path = None
