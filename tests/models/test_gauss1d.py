"""The 1-D known-variance mixture against the closed-form updates on the seed 003 slides."""
import math

import numpy as np
import pytest

from streamsvi.inference import SVI, Constant
from streamsvi.models import KnownVarianceGMM1D, NatParams


def _slides_update(m, s2, x, N, sigma2, mu0, tau2):
    """The slides, written out independently of the model code.

    φ_nk ∝ exp{ (m_k x_n − (m_k² + s_k²)/2) / σ² }   (uniform 1/K cancels)
    natural params: [μ0/τ² + (N/M) Σ φ_nk x_n / σ²,  −½ (1/τ² + (N/M) Σ φ_nk / σ²)]
    """
    M = len(x)
    logits = (np.outer(x, m) - 0.5 * (m ** 2 + s2)) / sigma2
    phi = np.exp(logits - logits.max(1, keepdims=True))
    phi /= phi.sum(1, keepdims=True)
    eta1 = mu0 / tau2 + N / M * (phi * x[:, None]).sum(0) / sigma2
    eta2 = -0.5 * (1 / tau2 + N / M * phi.sum(0) / sigma2)
    return phi, eta1, eta2


@pytest.mark.parametrize("N", [50, 5000])
def test_svi_target_matches_the_slides(N):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(-2, 1.5, 30), rng.normal(3, 1.5, 20)])
    model = KnownVarianceGMM1D(n_components=3, sigma2=2.25, prior_mean=0.5, prior_var=9.0)
    m, s2 = np.array([-1.0, 0.0, 2.0]), np.array([0.5, 2.0, 0.1])
    lam = NatParams(eta1=m / s2, eta2=-0.5 / s2)
    engine = SVI(model, n_total=N, schedule=Constant(1.0))
    new, _ = engine.update(engine.state_from_params(lam), x)
    phi, eta1, eta2 = _slides_update(m, s2, x, N, 2.25, 0.5, 9.0)
    np.testing.assert_allclose(model.responsibilities(lam, x), phi, rtol=1e-12)
    np.testing.assert_allclose(new.lam["eta1"], eta1, rtol=1e-12)
    np.testing.assert_allclose(new.lam["eta2"], eta2, rtol=1e-12)
    # and with ρ < 1: λ ← (1 − ρ) λ + ρ η̂
    engine = SVI(model, n_total=N, schedule=Constant(0.3))
    new, _ = engine.update(engine.state_from_params(lam), x)
    np.testing.assert_allclose(new.lam["eta1"], 0.7 * lam["eta1"] + 0.3 * eta1, rtol=1e-12)


def test_single_component_is_the_exact_normal_posterior():
    rng = np.random.default_rng(1)
    x = rng.normal(1.3, 0.7, 40)
    model = KnownVarianceGMM1D(1, sigma2=0.49, prior_mean=-1.0, prior_var=4.0)
    lam = model.prior() + model.suffstats(model.local_step(model.prior(), x[:, None]), x[:, None])
    m, s2 = model.posterior_mean_var(lam)
    post_var = 1 / (1 / 4.0 + 40 / 0.49)
    assert s2[0] == pytest.approx(post_var, rel=1e-12)
    assert m[0] == pytest.approx(post_var * (-1.0 / 4.0 + x.sum() / 0.49), rel=1e-12)
    # ELBO = log marginal likelihood: x ~ N(μ0 1, σ² I + τ² 11ᵀ)
    from scipy.stats import multivariate_normal
    cov = 0.49 * np.eye(40) + 4.0
    logml = multivariate_normal(np.full(40, -1.0), cov).logpdf(x)
    elbo = model.global_elbo(lam) + model.local_elbo(model.local_step(lam, x[:, None])).sum()
    assert elbo == pytest.approx(logml, rel=1e-10)


def test_predictive_density():
    model = KnownVarianceGMM1D(2, sigma2=1.0)
    lam = NatParams(eta1=np.array([-2.0, 6.0]), eta2=np.array([-0.5, -1.0]))   # m = (−2, 3), s² = (1, 0.5)
    x = np.array([0.3])
    expected = 0.5 * (math.exp(-(2.3 ** 2) / 4) / math.sqrt(4 * math.pi)
                      + math.exp(-(2.7 ** 2) / 3) / math.sqrt(3 * math.pi))
    assert np.exp(model.predictive_logpdf(lam, x))[0] == pytest.approx(expected, rel=1e-12)


def test_bad_settings():
    with pytest.raises(ValueError, match="sigma2"):
        KnownVarianceGMM1D(2, sigma2=0)
    with pytest.raises(ValueError, match="n_components"):
        KnownVarianceGMM1D(1.5)
