"""The sigmoid belief net of seed 001 §4.3: the recognition-weight gradients are unbiased."""
import itertools
import math

import numpy as np
import pytest

from streamsvi.models.sbn import SigmoidBeliefNet


def _exact_grad_V(net, Y):
    """∇_V of the mean bound by enumerating the 2^K hidden configurations."""
    Yt = net._tilde(Y)
    s = 1 / (1 + np.exp(-(Yt @ net.V.T)))
    g = np.zeros_like(net.V)
    for i in range(Y.shape[0]):
        for bits in itertools.product((0.0, 1.0), repeat=net.K):
            x = np.array(bits)
            q = float(np.prod(np.where(x == 1, s[i], 1 - s[i])))
            f = net._loglik(x[None, :], Y[i:i + 1])[0] - net.K * math.log(2) - math.log(q)
            g += q * f * np.outer(x - s[i], Yt[i])
    return g / Y.shape[0]


@pytest.mark.parametrize("estimator", ["legrad", "ldgrad"])
def test_recognition_gradient_is_unbiased(estimator):
    """Mean of 4000 estimates = the enumerated gradient within 5 standard errors (+1e-12)."""
    rng = np.random.default_rng(0)
    Y = (rng.random((3, 5)) < 0.4).astype(float)
    net = SigmoidBeliefNet(5, 3, estimator=estimator, n_samples=3, seed=1)
    net.W = rng.normal(size=net.W.shape)
    net.V = rng.normal(size=net.V.shape)
    exact = _exact_grad_V(net, Y)
    G = np.array([net.gradients(Y)[1] for _ in range(4000)])
    mean, se = G.mean(axis=0), G.std(axis=0, ddof=1) / np.sqrt(len(G))
    assert np.all(np.abs(mean - exact) <= 5 * se + 1e-12)


def test_legrad_has_lower_variance_than_ldgrad_at_equal_cost():
    rng = np.random.default_rng(2)
    Y = (rng.random((3, 5)) < 0.4).astype(float)
    var = {}
    for est in ("legrad", "ldgrad"):
        net = SigmoidBeliefNet(5, 3, estimator=est, seed=3)      # LdGrad S = K = 3
        r = np.random.default_rng(4)
        net.W, net.V = r.normal(size=net.W.shape), r.normal(size=net.V.shape)
        var[est] = np.array([net.gradients(Y)[1] for _ in range(2000)]).var(axis=0).sum()
    assert var["legrad"] < var["ldgrad"]


def test_regrad_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="continuous"):
        SigmoidBeliefNet(5, 3, estimator="regrad")
