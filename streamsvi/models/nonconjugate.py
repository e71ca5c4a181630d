"""The interface of a model that is *not* conditionally conjugate (gradient path).

A conjugate model (:mod:`streamsvi.models.base`) gives the engine expected
sufficient statistics and the engine takes a closed-form natural-gradient step.
A non-conjugate model has no closed-form step: its ELBO is maximised by
stochastic gradients (seed 001, Titsias, "Local Expectation Gradients"), which
:class:`streamsvi.inference.gradients.GradientVI` computes. A new
non-conjugate family lands in one module of ``streamsvi/models/`` that
implements the methods below (see :mod:`streamsvi.models.logistic` for two
worked examples) and one entry in ``streamsvi.models.MODELS``.

The variational family is fixed by the engine: a Gaussian over the P global
weights w, with one of three covariance structures (the engine's
``covariance`` setting; the λ layout below is all a model needs to read):

``"diagonal"`` (default)  mean field, ``q(w) = Π_i N(w_i | μ_i, σ_i²)``, stored as
    λ = ``NatParams(mean=μ, log_std=log σ)`` (the names are kept from the
    conjugate path; these are *not* natural parameters).
``"full"``  a full covariance in autoregressive (Cholesky-of-the-precision) form,
    ``q(w) = Π_i N(w_i | μ_i + Σ_{j<i} A_ij (w_j − μ_j), s_i²)``, i.e.
    ``(I − A)(w − μ) = s ⊙ ε``: the Cholesky factor of Σ is ``L = (I − A)⁻¹ diag(s)``
    (its diagonal is s) and the precision is ``Λ = (I − A)ᵀ diag(s⁻²) (I − A)``.
    λ = ``NatParams(mean=μ, log_std=log s, coupling=A)``, A a (P, P) array that
    is zero on and above the diagonal. s_i is the *conditional* std of w_i
    given w_1..w_{i−1}, not the marginal one.
``"lowrank"``  ``Σ = diag(σ²) + B Bᵀ`` with B of shape (P, r):
    λ = ``NatParams(mean=μ, log_std=log σ, factor=B)``.

Use :func:`linear_form_variance` for the variance of a linear form zᵀw under
q (predictive probabilities); it reads any of the three layouts. The model
owns the math of p; the engine owns q, the three gradient estimators, ρ, N
and the optimiser.

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
``expected_loglik_moment_grad(mean, cov, x) -> (g_mean, g_cov)``  (optional)
    The same for a q with a full covariance: ∇ with respect to μ and to Σ (a
    symmetric (P, P) array); the engine chains it to its covariance parameters.
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


#: covariance structure of q -> the extra λ entry that holds it (none for the mean field)
COVARIANCE_KEYS = {"diagonal": None, "full": "coupling", "lowrank": "factor"}


def covariance_of(lam) -> str:
    """``"diagonal"``, ``"full"`` or ``"lowrank"``: the covariance structure λ stores."""
    if "coupling" in lam:
        return "full"
    if "factor" in lam:
        return "lowrank"
    return "diagonal"


def check_gaussian_state(lam, aux, n_params: int, name: str) -> None:
    """The ``check_state`` every model of this interface shares (any covariance layout)."""
    keys = set(lam)
    if keys not in ({"mean", "log_std"}, {"mean", "log_std", "coupling"}, {"mean", "log_std", "factor"}):
        raise ValueError(f"state parameters {sorted(lam)} do not match model {name!r} (expected "
                         f"['log_std', 'mean'], plus 'coupling' (full) or 'factor' (lowrank))")
    for k in ("mean", "log_std"):
        if lam[k].shape != (n_params,):
            raise ValueError(f"parameter {k} has shape {lam[k].shape}, model {name!r} expects ({n_params},)")
    if "coupling" in lam:
        A = np.asarray(lam["coupling"])
        if A.shape != (n_params, n_params):
            raise ValueError(f"parameter coupling has shape {A.shape}, model {name!r} expects "
                             f"({n_params}, {n_params})")
        if np.any(np.triu(A) != 0):
            raise ValueError("parameter coupling must be zero on and above the diagonal (strictly lower A)")
    if "factor" in lam:
        B = np.asarray(lam["factor"])
        if B.ndim != 2 or B.shape[0] != n_params or B.shape[1] < 1:
            raise ValueError(f"parameter factor has shape {B.shape}, model {name!r} expects ({n_params}, rank)")


def unit_lower_inverse(A) -> np.ndarray:
    """M = (I − A)⁻¹ for a strictly lower-triangular A (unit lower triangular)."""
    from scipy.linalg import lapack

    M, info = lapack.dtrtri(np.eye(A.shape[0]) - A, lower=1, unitdiag=1)
    if info != 0:
        raise FloatingPointError(f"(I - A) could not be inverted (LAPACK dtrtri info {info})")
    return M


def linear_form_variance(lam, E, offset: int = 0) -> np.ndarray:
    """Var_q(e_nᵀ w[offset:offset + m]) for the rows e_n of ``E`` (n, m), any covariance layout.

    Diagonal: Σ_i e_i² σ_i². Full: ‖Lᵀ e‖² with L = (I − A)⁻¹ diag(s) (a triangular
    solve). Low rank: Σ_i e_i² σ_i² + ‖Bᵀ e‖².
    """
    E = np.atleast_2d(np.asarray(E, float))
    m = E.shape[1]
    sl = slice(offset, offset + m)
    var = np.exp(2.0 * np.asarray(lam["log_std"]))
    if "coupling" in lam:
        from scipy.linalg import solve_triangular

        P = var.shape[0]
        Ef = np.zeros((E.shape[0], P))
        Ef[:, sl] = E
        IA = np.eye(P) - np.asarray(lam["coupling"])
        V = solve_triangular(IA.T, Ef.T, lower=False, unit_diagonal=True)   # Mᵀ e, (P, n)
        return (V * V).T @ var
    out = (E * E) @ var[sl]
    if "factor" in lam:
        EB = E @ np.asarray(lam["factor"])[sl]
        out = out + np.sum(EB * EB, axis=1)
    return out


def gaussian_params(mean, log_std) -> NatParams:
    return NatParams(mean=np.asarray(mean, float), log_std=np.asarray(log_std, float))
