"""Shared fixtures: one case per model, found by the check suite (STYLE.md §8)."""
import numpy as np
import pytest

from streamsvi.datasets import make_blobs, make_lda_corpus
from streamsvi.models import HPF, LDA, MODELS, PMF, BayesianGMM, DiscreteHMM, KnownVarianceGMM1D, Ratings
from streamsvi.models.hmm import sample_hmm


def _gmm_case():
    X, _ = make_blobs(400, seed=11)
    return BayesianGMM(n_components=4, n_features=2, weight_concentration=0.8,
                       mean_precision=0.2, degrees_of_freedom=3.0, scale=0.7), X


def _gmm3d_case():
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(-2, 1.0, (150, 3)), rng.normal(2, 0.6, (150, 3)),
                        rng.normal([0, 3, -3], 0.8, (100, 3))])
    return BayesianGMM.paper_prior(3, 3), X


def _dp_case():
    X, _ = make_blobs(300, seed=3)
    return BayesianGMM.dp_approximation(n_features=2, concentration=1.0, n_components=12), X


def _gauss1d_case():
    rng = np.random.default_rng(2)
    X = np.concatenate([rng.normal(-3, 1, 150), rng.normal(0.5, 1, 100), rng.normal(4, 1, 150)])[:, None]
    return KnownVarianceGMM1D(n_components=3, sigma2=1.0, prior_mean=0.0, prior_var=25.0), X


def _hmm_case():
    """A small synthetic 3-state HMM over 4 symbols: 300 sequences of lengths 3..9."""
    rng = np.random.default_rng(8)
    A = np.array([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.2, 0.1, 0.7]])
    B = np.array([[0.7, 0.2, 0.05, 0.05], [0.05, 0.7, 0.2, 0.05], [0.05, 0.05, 0.3, 0.6]])
    X, _ = sample_hmm([0.5, 0.3, 0.2], A, B, rng.integers(3, 10, size=300), rng)
    return DiscreteHMM(n_states=3, n_symbols=4, emission_concentration=0.5), X


def _lda_case():
    # 3 topics over 30 words (10 words mostly each topic's own), 300 documents of
    # ~40 words, as dense counts (len() and row indexing work; the model converts
    # to CSR). Topics seeded from documents (init="documents") and a cap of 30
    # sweeps keep the 6,000 local steps of the variance check affordable (from
    # near-uniform random topics some documents need hundreds of sweeps). LDA's
    # per-document objective is not concave in γ: from its fixed start the local
    # step can land in a slightly worse optimum than the previous sweep's, and
    # CAVI's ELBO can then dip (~1e-6 relative); with these clear documents it
    # does not (checked for the three seeds of the monotone check).
    topics = np.full((3, 30), 0.02 / 20)
    for k in range(3):
        topics[k, 10 * k:10 * k + 10] = 0.098
    X, _, _ = make_lda_corpus(300, n_topics=3, n_words=30, doc_length=40, alpha=0.3, seed=3,
                              topics=topics / topics.sum(axis=1, keepdims=True))
    return LDA(n_components=3, n_features=30, doc_topic_prior=0.3, topic_word_prior=0.05,
               mean_change_tol=1e-4, max_doc_update_iter=30, init="documents"), X.toarray()


def pmf_ratings(n_users=25, n_items=18, n=400, d=2, seed=6, noise=0.3):
    """A small synthetic rating set: y = u_iᵀv_j + 3 + noise, ids mixing strings and integers."""
    rng = np.random.default_rng(seed)
    U, V = rng.normal(size=(n_users, d)), rng.normal(size=(n_items, d))
    i, j = rng.integers(0, n_users, n), rng.integers(0, n_items, n)
    y = (U[i] * V[j]).sum(1) + 3.0 + noise * rng.normal(size=n)
    return Ratings([f"u{k}" for k in i], j.tolist(), y)


def _pmf_case():
    return PMF(n_factors=2, sigma2=0.25, prior_var=1.0, biases=True, offset=3.0), pmf_ratings()


def hpf_counts(**kw):
    """HPF's own small count set (``streamsvi.models.hpf.sample_counts``)."""
    from streamsvi.models.hpf import sample_counts

    return sample_counts(**kw)


def _hpf_case():
    return HPF.check_cases()["hpf"]()


#: (id, factory) — every registered model must appear here (checked below).
MODEL_CASES = [("gmm", _gmm_case), ("gmm_paper_prior_3d", _gmm3d_case), ("gmm_dp", _dp_case),
               ("gauss1d", _gauss1d_case), ("hmm", _hmm_case), ("lda", _lda_case), ("pmf", _pmf_case), ("hpf", _hpf_case)]


@pytest.fixture(params=[f for _, f in MODEL_CASES], ids=[i for i, _ in MODEL_CASES])
def model_case(request):
    return request.param()


def registered_model_names():
    """The conjugate models (the gradient path's models, which have ``prior_moments``, are
    checked in tests/inference/test_gradients.py instead)."""
    return {name for name, cls in MODELS.items() if not hasattr(cls, "prior_moments")}


def require_tool(name: str) -> str:
    """Path of a command-line tool the test needs (a Debian package .ci/run installs).

    Missing on a developer machine: the test is skipped. Missing under CI: it fails,
    because then .ci/run did not install what it should have.
    """
    import os
    import shutil

    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run installs it from Debian's packages")
        pytest.skip(f"{name} not installed (a Debian package; see .ci/run)")
    return path


def mc_predictive_density(model, lam, x, n_draws, rng):
    """Monte-Carlo E_q[Σ_k π_k N(x | μ_k, Λ_k⁻¹)] for a BayesianGMM, with its standard error.

    Draws (π, μ_k, Λ_k) from q with scipy/numpy samplers, independently of the
    model's Student-t formula. Returns (mean density, standard error) per record.
    """
    from scipy import stats

    alpha, beta, m, Winv, nu = model.standard(lam)
    K, D = m.shape
    pis = rng.dirichlet(alpha, size=n_draws)
    dens = np.zeros((n_draws, len(x)))
    for k in range(K):
        L = stats.wishart(df=nu[k], scale=np.linalg.inv(Winv[k])).rvs(n_draws, random_state=rng)
        cov = np.linalg.inv(L)
        mu = m[k] + np.einsum("sij,sj->si", np.linalg.cholesky(cov / beta[k]), rng.normal(size=(n_draws, D)))
        d = x[None] - mu[:, None]
        q = np.einsum("sni,sij,snj->sn", d, L, d)
        log_n = 0.5 * np.linalg.slogdet(L)[1][:, None] - 0.5 * D * np.log(2 * np.pi) - 0.5 * q
        dens += pis[:, k:k + 1] * np.exp(log_n)
    return dens.mean(0), dens.std(0, ddof=1) / np.sqrt(n_draws)
