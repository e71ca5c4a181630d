"""The interface of a model that is *not* conditionally conjugate (gradient path).

A conjugate model (:mod:`streamsvi.models.base`) gives the engine expected
sufficient statistics and the engine takes a closed-form natural-gradient step.
A non-conjugate model has no closed-form step: its ELBO is maximised by
stochastic gradients (seed 001, Titsias, "Local Expectation Gradients"), which
:class:`streamsvi.inference.gradients.GradientVI` computes. A new
non-conjugate family lands in one module of ``streamsvi/models/`` that
implements the methods below (see :mod:`streamsvi.models.logistic` for two
worked examples) and one entry in ``streamsvi.models.MODELS``.

The variational family is fixed by the engine: a mean-field Gaussian over the
P global weights w, ``q(w) = Π_i N(w_i | μ_i, σ_i²)``, stored as
λ = ``NatParams(mean=μ, log_std=log σ)`` (the names are kept from the
conjugate path; these are *not* natural parameters). The model owns the
math of p; the engine owns q, the three gradient estimators, ρ, N and the
optimiser.

Methods a model provides (pure functions; ``x`` is a minibatch or ``None`` for
a target that has no data, such as :class:`~streamsvi.models.logistic.CorrelatedGaussianTarget`):

``n_params`` (attribute)
    P, the dimension of w.
``check_batch(x) -> x``
    Validate and coerce a minibatch; raise ``ValueError`` saying what is wrong.
``prior_moments() -> (m0, v0) | None``
    The Gaussian prior p(w) = N(m0, diag v0); its KL to q is exact in the
    engine. ``None``: no separate prior, ``loglik`` is the whole log joint
    and the engine adds the exact entropy of q instead.
``loglik(W, x) -> (S, n)``
    log p(y_n | w_s) per sample w_s (rows of ``W``, shape (S, P)) and record.
``grad_loglik(W, x) -> (S, n, P)``
    ∇_w log p(y_n | w_s) (ReGrad).
``loglik_coordinate(w, nodes, x) -> (n, P, K)``  (optional)
    log p(y_n | w with coordinate i replaced by ``nodes[i, k]``): what LeGrad
    evaluates. Without it the engine builds the P·K points and calls
    ``loglik`` (correct, but P times slower for a model linear in w).
``expected_loglik_grad(mean, std, x) -> (g_mean, g_std)``  (optional)
    The exact ∇ of Σ_n E_q[log p(y_n | w)] where it has a closed form (or a
    1-D integral computed to machine precision): the tests' reference.
``predictive_logpdf(lam, x) -> (n,)``
    log p(y* | x*, data) under q (held-out metric).
``check_state(lam, aux)``
    Raise ``ValueError`` unless λ has the shapes of this model.
``get_params() -> dict``, ``name``, ``record_kind``
    As for conjugate models.
"""
from __future__ import annotations

import numpy as np

from .base import NatParams


def gauss_hermite(n_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes z_k and weights π_k (Σ π_k = 1) with Σ_k π_k g(z_k) ≈ E[g(z)], z ~ N(0, 1).

    Exact for polynomials of degree ≤ 2K − 1 (seed 001 §4.1 uses K = 5).
    """
    z, w = np.polynomial.hermite_e.hermegauss(int(n_points))
    return z, w / w.sum()


def gaussian_kl(mean, std, m0, v0) -> float:
    """KL(N(mean, diag std²) ‖ N(m0, diag v0))."""
    var = std * std
    return float(0.5 * np.sum((var + (mean - m0) ** 2) / v0 - 1.0 - np.log(var) + np.log(v0)))


def check_gaussian_state(lam, aux, n_params: int, name: str) -> None:
    """The ``check_state`` every model of this interface shares."""
    if set(lam) != {"mean", "log_std"}:
        raise ValueError(f"state parameters {sorted(lam)} do not match model {name!r} "
                         f"(expected ['log_std', 'mean'])")
    for k in ("mean", "log_std"):
        if lam[k].shape != (n_params,):
            raise ValueError(f"parameter {k} has shape {lam[k].shape}, model {name!r} expects ({n_params},)")


def gaussian_params(mean, log_std) -> NatParams:
    return NatParams(mean=np.asarray(mean, float), log_std=np.asarray(log_std, float))
