"""Shared fixtures: one case per model, found by the check suite (STYLE.md §8)."""
import numpy as np
import pytest

from streamsvi.models import MODELS, PMF, GradientModel


def pmf_ratings(n_users=25, n_items=18, n=400, d=2, seed=6, noise=0.3):
    """A small synthetic rating set: y = u_iᵀv_j + 3 + noise, ids mixing strings and integers."""
    return PMF.synthetic_ratings(n_users, n_items, n, d, seed, noise)


#: (id, factory): each model class names its own cases (``Model.check_cases``, river's
#: ``_unit_test_params``); a registered model without one fails ``test_every_model_has_a_case``.
MODEL_CASES = [(case, factory) for cls in MODELS.values() for case, factory in cls.check_cases().items()]


@pytest.fixture(params=[f for _, f in MODEL_CASES], ids=[i for i, _ in MODEL_CASES])
def model_case(request):
    return request.param()


def registered_model_names():
    """The conjugate models (the gradient path's models, which have ``prior_moments``, are
    checked in tests/inference/test_gradients.py instead)."""
    return {name for name, cls in MODELS.items() if not issubclass(cls, GradientModel)}


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
