"""Bayesian logistic regression, and the correlated Gaussian target of seed 001 §4.1.

Both are non-conjugate models of the gradient path (interface:
:mod:`streamsvi.models.nonconjugate`; engine:
:class:`streamsvi.inference.gradients.GradientVI`).

Bayesian logistic regression (seed 001 §4.2)::

    w ~ N(0, prior_var · I)                       (P = D + 1 weights with the intercept)
    y_n | x_n, w ~ Bernoulli(σ(z_nᵀ w)),  z_n = (x_n, 1)
    q(w) = Π_i N(w_i | μ_i, σ_i²)

A record is a row ``(x_1, …, x_D, y)``: D features and the label y ∈ {0, 1}
in the last column (the ``"labelled"`` record kind). With ỹ = 2y − 1 the
likelihood is log σ(ỹ a), a = zᵀw. Since a is linear in w, the LeGrad
evaluations "w with w_i replaced by u" cost one multiply-add per record and
coordinate: a + z_i (u − w_i).

Predictive probabilities use the probit approximation (MacKay 1992):
``p(y=1 | x, data) ≈ σ(m / √(1 + π s²/8))``, m = zᵀμ, s² = Σ z_i² σ_i²; not
the plug-in σ(zᵀμ).

The Gaussian target (seed 001 §4.1) has no data: p(w) = N(w | 2, Σ) in
n = 100 dimensions, Σ_ij = exp(−½ (t_i − t_j)²) + 0.1 δ_ij with t_i on a
uniform grid in [0, 10]. Its ELBO has a closed form, so it tests the
estimators: E_q[log p] = const − ½ [(μ − m)ᵀ Σ⁻¹ (μ − m) + Σ_i (Σ⁻¹)_ii σ_i²].

Examples
--------
>>> import numpy as np
>>> model = BayesianLogisticRegression(n_features=2)
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(200, 2)); y = (X[:, 0] - X[:, 1] > 0).astype(float)
>>> model.check_batch(np.column_stack([X, y])).shape
(200, 3)
>>> lam = model.init_params(rng, None, 200)
>>> model.predict_proba(lam, X[:2]).round(2).tolist()
[0.5, 0.5]
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import expit, log_expit

from ..settings import REQUIRED, ConfigKind, Setting
from .base import ChecksState, Classifier, CoordinateLoglik, GradientModel, NatParams, ScoresRecords, check_matrix
from .nonconjugate import check_gaussian_state, gauss_hermite, gaussian_params, linear_form_variance

__all__ = ["BayesianLogisticRegression", "SoftmaxRegression", "CorrelatedGaussianTarget"]


class BayesianLogisticRegression(GradientModel, Classifier, ChecksState, ScoresRecords, CoordinateLoglik):
    """Binary Bayesian logistic regression with a mean-field Gaussian posterior.

    Parameters
    ----------
    n_features : int
        D, features per record (the label is one more column).
    prior_var : float
        Variance of the zero-mean Gaussian prior of every weight (default 1).
    fit_intercept : bool
        Add a bias weight (P = D + 1; default True).
    init_std : float
        σ_i of the initial q (default 0.1 · √prior_var); the means start at 0.
    """

    name = "logistic"
    record_kind = "labelled"
    config_kinds = {"logistic": ConfigKind("Bayesian logistic regression on labelled records (the "
                                           "gradient path)")}
    settings = {
        "n_features": Setting("int", REQUIRED, "D, features per record (the label is one more column)",
                              low=1),
        "prior_var": Setting("float", 1.0, "variance of the zero-mean Gaussian prior of every weight",
                             low=0, low_open=True),
        "fit_intercept": Setting("bool", True, "add a bias weight"),
        "init_std": Setting("float", None, "sigma of every weight in the initial q; unset = "
                            "0.1*sqrt(prior_var)", low=0, low_open=True),
    }
    n_classes = 2
    score_column_names = ("proba", "prediction", "log_density")
    scoring_methods = ("predict_proba", "predict", "predictive_logpdf")

    def __init__(self, n_features: int, prior_var: float = 1.0, fit_intercept: bool = True,
                 init_std: float | None = None):
        p = BayesianLogisticRegression.check_settings(dict(n_features=n_features, prior_var=prior_var,
                                                          fit_intercept=fit_intercept, init_std=init_std))
        self.n_features = p["n_features"]
        self.prior_var = p["prior_var"]
        self.fit_intercept = p["fit_intercept"]
        self.init_std = p["init_std"]
        self.n_params = self.n_features + int(self.fit_intercept)

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "prior_var": self.prior_var,
                "fit_intercept": self.fit_intercept, "init_std": self.init_std}

    # ------------------------------------------------------------ records
    def check_batch(self, x) -> np.ndarray:
        """A (n, D + 1) array, features then a 0/1 label; ``ValueError`` otherwise."""
        arr = check_matrix(x, self.n_features + 1, "labelled batch")
        y = arr[:, -1]
        if (y * (y - 1.0)).any():                  # finite y: y (y − 1) = 0 only for 0 and 1
            bad = np.flatnonzero((y != 0) & (y != 1))
            raise ValueError(f"labels must be 0 or 1; records {bad[:10].tolist()} have "
                             f"{y[bad[:3]].tolist()}")
        return arr

    def check_features(self, X) -> np.ndarray:
        return check_matrix(X, self.n_features, "features")

    def design(self, X) -> np.ndarray:
        """z_n = (x_n, 1) (or x_n without intercept), shape (n, P)."""
        if self.fit_intercept:
            return np.column_stack([X, np.ones(X.shape[0])])
        return X

    def _split(self, x):
        """(the design Z, ỹ = 2y − 1) of labelled rows."""
        x = np.asarray(x, float)
        if not self.fit_intercept:
            return x[:, :-1], 2.0 * x[:, -1] - 1.0
        Z = np.empty(x.shape)                      # design(x[:, :-1]): the features, then 1
        Z[:, :-1] = x[:, :-1]
        Z[:, -1] = 1.0
        return Z, 2.0 * x[:, -1] - 1.0

    # --------------------------------------------------------- interface
    def prior_moments(self):
        P = self.n_params
        return np.zeros(P), np.full(P, self.prior_var)

    def init_params(self, rng, x, n_total) -> NatParams:
        s = self.init_std if self.init_std is not None else 0.1 * math.sqrt(self.prior_var)
        return gaussian_params(np.zeros(self.n_params), np.full(self.n_params, math.log(s)))

    def check_state(self, lam, aux=None) -> None:
        check_gaussian_state(lam, aux, self.n_params, self.name)

    def loglik(self, W, x) -> np.ndarray:
        """log σ(ỹ_n z_nᵀ w_s), shape (S, n)."""
        Z, yt = self._split(x)
        return log_expit(yt[None, :] * (np.atleast_2d(W) @ Z.T))

    def grad_loglik(self, W, x) -> np.ndarray:
        """∇_w log σ(ỹ zᵀw) = ỹ σ(−ỹ a) z, shape (S, n, P)."""
        Z, yt = self._split(x)
        A = np.atleast_2d(W) @ Z.T
        r = yt[None, :] * expit(-yt[None, :] * A)
        return r[:, :, None] * Z[None, :, :]

    def loglik_coordinate(self, w, nodes, x) -> np.ndarray:
        """log σ(ỹ_n (a_n + z_ni (u_ik − w_i))), shape (n, P, K)."""
        Z, yt = self._split(x)
        a = Z @ w
        shift = nodes - w[:, None]                                   # (P, K)
        A = a[:, None, None] + Z[:, :, None] * shift[None, :, :]     # (n, P, K)
        A *= yt[:, None, None]
        return log_expit(A, out=A)

    def loglik_coordinate_and_pivot(self, w, nodes, x):
        """(:meth:`loglik_coordinate`, :meth:`loglik` at the pivot w) of checked records, the same
        numbers from one pass: with labels 0 / 1, ỹ = ±1 and multiplying by it only flips signs,
        which rounding commutes with, so ỹ is folded into the design once (Ẑ = ỹ z) instead
        of multiplying the (n, P, K) array (a zero may change sign, which log σ ignores)."""
        x = np.asarray(x, float)
        yt = 2.0 * x[:, -1] - 1.0
        Zy = np.empty(x.shape if self.fit_intercept else (x.shape[0], x.shape[1] - 1))
        np.multiply(x[:, :self.n_features], yt[:, None], out=Zy[:, :self.n_features])
        if self.fit_intercept:
            Zy[:, -1] = yt
        shift = nodes - w[:, None]                                   # (P, K)
        A = Zy[:, :, None] * shift[None, :, :]
        A += (Zy @ w)[:, None, None]                                 # ỹ (a + z_i (u − w_i))
        return log_expit(A, out=A), log_expit(w[None, :] @ Zy.T)[0]

    def expected_loglik_grad(self, mean, std, x, n_points: int = 80):
        """Exact ∇_(μ, σ) Σ_n E_q[log σ(ỹ_n a_n)]: a_n ~ N(z_nᵀμ, Σ_i z_ni² σ_i²) is 1-D,
        so the expectation is a 1-D Gauss–Hermite integral with ``n_points`` nodes."""
        Z, yt = self._split(x)
        m = Z @ mean
        s = np.sqrt((Z * Z) @ (std * std))
        zk, pk = gauss_hermite(n_points)
        A = m[:, None] + s[:, None] * zk[None, :]
        sig = expit(-yt[:, None] * A)
        d1 = (yt[:, None] * sig) @ pk                      # E[g'(a)]
        d2 = (-(sig * (1 - sig))) @ pk                     # E[g''(a)], ỹ² = 1
        g_mean = Z.T @ d1
        g_std = 2.0 * std * ((Z * Z).T @ (0.5 * d2))       # ∂/∂σ_i of h(m, s²): 2 z² σ ∂h/∂s²
        return g_mean, g_std

    def expected_loglik_moment_grad(self, mean, cov, x, n_points: int = 80):
        """Exact (∂/∂μ, ∂/∂Σ) of Σ_n E_q[log σ(ỹ_n a_n)] for q = N(μ, Σ):
        a_n ~ N(z_nᵀμ, z_nᵀΣz_n),
        so ∂/∂Σ = Σ_n ½ E[g''(a_n)] z_n z_nᵀ (1-D Gauss–Hermite integrals, ``n_points`` nodes)."""
        Z, yt = self._split(x)
        m = Z @ mean
        s = np.sqrt(np.einsum("np,pq,nq->n", Z, cov, Z))
        zk, pk = gauss_hermite(n_points)
        sig = expit(-yt[:, None] * (m[:, None] + s[:, None] * zk[None, :]))
        d1 = (yt[:, None] * sig) @ pk
        d2 = (-(sig * (1 - sig))) @ pk
        return Z.T @ d1, (Z * (0.5 * d2)[:, None]).T @ Z

    # ------------------------------------------------------------ scoring
    def _moments(self, lam, X):
        Z = self.design(X)
        return Z @ np.asarray(lam["mean"]), linear_form_variance(lam, Z)

    def predict_proba(self, lam, X, aux=None) -> np.ndarray:
        """p(y = 1 | x, data) by the probit approximation, shape (n,)."""
        m, s2 = self._moments(lam, self.check_features(X))
        return expit(m / np.sqrt(1.0 + math.pi * s2 / 8.0))

    def predict(self, lam, X, aux=None) -> np.ndarray:
        return (self.predict_proba(lam, X) >= 0.5).astype(np.int64)

    def predictive_logpdf(self, lam, x, aux=None) -> np.ndarray:
        """log p(y_n | x_n, data) of labelled records (probit approximation)."""
        x = self.check_batch(x)
        m, s2 = self._moments(lam, x[:, :-1])
        kappa = m / np.sqrt(1.0 + math.pi * s2 / 8.0)
        return log_expit((2.0 * x[:, -1] - 1.0) * kappa)

    def _split_labels(self, x):
        """(features, labels) of rows given with or without their label (a NaN label = none)."""
        x = np.asarray(x, float)
        if x.ndim == 2 and x.shape[1] == self.n_features + 1:
            return x[:, :-1], x[:, -1]
        return x, np.full(np.atleast_2d(x).shape[0], np.nan)

    def score_columns(self, lam, x, aux=None) -> dict:
        """Per record (``ScoresRecords``): ``proba`` [p(y=0), p(y=1)] from the posterior (probit
        approximation), the ``prediction`` and, for a row with a label, ``log_density``
        log p(y | x, data) (NaN: absent for a row without one)."""
        X, y = self._split_labels(x)
        p = self.predict_proba(lam, X)
        labelled = np.isfinite(y)
        lp = np.full(len(p), np.nan)
        if labelled.any():
            lp[labelled] = self.predictive_logpdf(lam, np.column_stack([X, y])[labelled])
        return {"proba": np.column_stack([1.0 - p, p]), "prediction": (p >= 0.5).astype(np.int64),
                "log_density": lp}


class CorrelatedGaussianTarget(GradientModel, ChecksState, CoordinateLoglik):
    """The 100-D correlated Gaussian of seed 001 §4.1 as a data-free target.

    ``log p(w) = log N(w | m·1, Σ)``, Σ_ij = exp(−½ (t_i − t_j)²) + jitter·δ_ij,
    t uniform on [0, 10]. Use with ``x = None`` and ``n_total = 1``.

    Parameters
    ----------
    n_dims : int
        n (default 100). mean : float, m (default 2). jitter : float (default 0.1).
    """

    name = "gaussian_target"
    record_kind = "dense"
    settings = {"n_dims": Setting("int", 100, "n, the dimension", low=1),
                "mean": Setting("float", 2.0, "m, every coordinate's mean"),
                "jitter": Setting("float", 0.1, "added to the diagonal of the covariance", low=0)}

    def __init__(self, n_dims: int = 100, mean: float = 2.0, jitter: float = 0.1):
        p = self.check_settings(dict(n_dims=n_dims, mean=mean, jitter=jitter))
        self.n_dims, self.mean, self.jitter = p["n_dims"], p["mean"], p["jitter"]
        self.n_params = self.n_dims
        t = np.linspace(0.0, 10.0, self.n_dims)
        self.Sigma = np.exp(-0.5 * (t[:, None] - t[None, :]) ** 2) + self.jitter * np.eye(self.n_dims)
        self.Prec = np.linalg.inv(self.Sigma)
        self.m = np.full(self.n_dims, self.mean)
        sign, logdet = np.linalg.slogdet(self.Sigma)
        self._const = -0.5 * (self.n_dims * math.log(2 * math.pi) + logdet)

    def get_params(self) -> dict:
        return {"n_dims": self.n_dims, "mean": self.mean, "jitter": self.jitter}

    def check_batch(self, x):
        return None

    def prior_moments(self):
        return None

    def init_params(self, rng, x, n_total) -> NatParams:
        return gaussian_params(np.zeros(self.n_dims), np.zeros(self.n_dims))

    def check_state(self, lam, aux=None) -> None:
        check_gaussian_state(lam, aux, self.n_params, self.name)

    def loglik(self, W, x=None) -> np.ndarray:
        D = np.atleast_2d(W) - self.m
        return (self._const - 0.5 * np.einsum("si,ij,sj->s", D, self.Prec, D))[:, None]

    def grad_loglik(self, W, x=None) -> np.ndarray:
        D = np.atleast_2d(W) - self.m
        return (-(D @ self.Prec))[:, None, :]

    def loglik_coordinate(self, w, nodes, x=None) -> np.ndarray:
        d = w - self.m
        base = self._const - 0.5 * d @ self.Prec @ d
        r = self.Prec @ d
        delta = nodes - w[:, None]
        out = base - delta * r[:, None] - 0.5 * delta ** 2 * np.diag(self.Prec)[:, None]
        return out[None, :, :]

    def expected_loglik_grad(self, mean, std, x=None):
        return -(self.Prec @ (mean - self.m)), -np.diag(self.Prec) * std

    def expected_loglik_moment_grad(self, mean, cov, x=None):
        """(∂/∂μ, ∂/∂Σ) of E_q[log p(w)] = const − ½[(μ − m)ᵀ Σ_p⁻¹ (μ − m) + tr(Σ_p⁻¹ Σ)]
        (Σ_p the target's covariance)."""
        return -(self.Prec @ (mean - self.m)), -0.5 * self.Prec

    def exact_optimum(self) -> float:
        """log Z = 0, the ELBO of q = p (a full-covariance q reaches it)."""
        return 0.0

    def expected_loglik(self, mean, std) -> float:
        d = mean - self.m
        return float(self._const - 0.5 * (d @ self.Prec @ d + np.diag(self.Prec) @ (std * std)))

    def predictive_logpdf(self, lam, x, aux=None):
        raise ValueError("the Gaussian target has no records to predict")


class SoftmaxRegression(BayesianLogisticRegression):
    """Multiclass Bayesian logistic (softmax) regression with a mean-field Gaussian posterior.

    ``p(y = c | x, W) = softmax(W z)_c`` with C weight vectors of P = D + 1, stored
    class-major as one vector of C·P weights (w_{c,i} at ``c * P + i``). Labels are
    0, …, C − 1. Predictive probabilities use the mean-field softmax approximation
    ``softmax(m_c / √(1 + π s_c²/8))`` (m_c, s_c² the mean and variance of the logit
    of class c under q); with C = 2 this is not the binary model (it has two weight
    vectors, not one).

    >>> import numpy as np
    >>> m = SoftmaxRegression(n_features=2, n_classes=3)
    >>> lam = m.init_params(None, None, 10)
    >>> m.predict_proba(lam, np.zeros((1, 2))).round(3).tolist()
    [[0.333, 0.333, 0.333]]
    """

    name = "softmax"
    config_kinds = {"softmax": ConfigKind("multiclass (softmax) Bayesian logistic regression (the "
                                          "gradient path)")}
    settings = {"n_features": BayesianLogisticRegression.settings["n_features"],
                "n_classes": Setting("int", 3, "C, the classes 0..C-1 of the labels", low=2),
                **{k: v for k, v in BayesianLogisticRegression.settings.items() if k != "n_features"}}

    def __init__(self, n_features: int, n_classes: int = 3, prior_var: float = 1.0,
                 fit_intercept: bool = True, init_std: float | None = None):
        p = self.check_settings(dict(n_features=n_features, n_classes=n_classes, prior_var=prior_var,
                                     fit_intercept=fit_intercept, init_std=init_std))
        super().__init__(n_features, prior_var=prior_var, fit_intercept=fit_intercept, init_std=init_std)
        self.n_classes = p["n_classes"]
        self.n_inputs = self.n_params                 # P per class
        self.n_params = self.n_classes * self.n_inputs

    def get_params(self) -> dict:
        return {"n_features": self.n_features, "n_classes": self.n_classes, "prior_var": self.prior_var,
                "fit_intercept": self.fit_intercept, "init_std": self.init_std}

    def check_batch(self, x) -> np.ndarray:
        arr = check_matrix(x, self.n_features + 1, "labelled batch")
        y = arr[:, -1]
        bad = np.flatnonzero((y != np.round(y)) | (y < 0) | (y > self.n_classes - 1))
        if bad.size:
            raise ValueError(f"labels must be classes 0..{self.n_classes - 1}; records {bad[:10].tolist()} "
                             f"have {y[bad[:3]].tolist()}")
        return arr

    def _split_c(self, x):
        x = np.asarray(x, float)
        return self.design(x[:, :-1]), x[:, -1].astype(np.int64)

    def loglik(self, W, x) -> np.ndarray:
        Z, y = self._split_c(x)
        W = np.atleast_2d(W).reshape(-1, self.n_classes, self.n_inputs)
        A = np.einsum("scp,np->snc", W, Z)                                  # (S, n, C)
        lse = np.logaddexp.reduce(A, axis=2)
        return np.take_along_axis(A, y[None, :, None], axis=2)[:, :, 0] - lse

    def grad_loglik(self, W, x) -> np.ndarray:
        Z, y = self._split_c(x)
        W = np.atleast_2d(W).reshape(-1, self.n_classes, self.n_inputs)
        A = np.einsum("scp,np->snc", W, Z)
        Pr = np.exp(A - np.logaddexp.reduce(A, axis=2)[:, :, None])
        R = -Pr
        R[:, np.arange(len(y)), y] += 1.0                                   # onehot − p
        return np.einsum("snc,np->sncp", R, Z).reshape(R.shape[0], len(y), -1)

    loglik_coordinate_and_pivot = CoordinateLoglik.loglik_coordinate_and_pivot   # not the binary model's

    def loglik_coordinate(self, w, nodes, x) -> np.ndarray:
        """Changing w_{c,i} by δ moves only logit c, by z_i δ: log-sum-exp updated in closed form."""
        Z, y = self._split_c(x)
        C, P = self.n_classes, self.n_inputs
        A = Z @ w.reshape(C, P).T                                            # (n, C)
        lse = np.logaddexp.reduce(A, axis=1)
        shift = (nodes - w[:, None]).reshape(C, P, -1)                       # (C, P, K)
        Anew = A[:, :, None, None] + Z[:, None, :, None] * shift[None]      # (n, C, P, K)
        # lse' = log(exp(lse) − exp(a_c) + exp(a_c')) = lse + log1p(exp(a_c' − lse) − exp(a_c − lse))
        rest = np.log1p(-np.minimum(np.exp(A - lse[:, None]), 1 - 1e-16))   # log(1 − p_c)
        lse_new = np.logaddexp(lse[:, None, None, None] + rest[:, :, None, None], Anew)
        ay = A[np.arange(len(y)), y]
        own = np.where((np.arange(C)[None, :] == y[:, None])[:, :, None, None], Anew, ay[:, None, None, None])
        return (own - lse_new).reshape(len(y), C * P, -1)

    def expected_loglik_grad(self, mean, std, x, n_points: int = 0):
        raise NotImplementedError("E_q[log softmax] has no closed form; the tests compare estimators")

    def _class_moments(self, lam, X):
        Z = self.design(X)
        C, P = self.n_classes, self.n_inputs
        mean = np.asarray(lam["mean"]).reshape(C, P)
        var = np.column_stack([linear_form_variance(lam, Z, offset=c * P) for c in range(C)])
        return Z @ mean.T, var

    def predict_proba(self, lam, X, aux=None) -> np.ndarray:
        """p(y = c | x, data), shape (n, C) (mean-field softmax approximation)."""
        m, s2 = self._class_moments(lam, self.check_features(X))
        k = m / np.sqrt(1.0 + math.pi * s2 / 8.0)
        k -= k.max(axis=1, keepdims=True)
        e = np.exp(k)
        return e / e.sum(axis=1, keepdims=True)

    def predict(self, lam, X, aux=None) -> np.ndarray:
        return self.predict_proba(lam, X).argmax(axis=1)

    def predictive_logpdf(self, lam, x, aux=None) -> np.ndarray:
        x = self.check_batch(x)
        p = self.predict_proba(lam, x[:, :-1])
        return np.log(np.maximum(p[np.arange(x.shape[0]), x[:, -1].astype(np.int64)], 1e-300))

    def score_columns(self, lam, x, aux=None) -> dict:
        """Per record: ``proba`` p(y = c | x, data) (n, C), the ``prediction`` and, for a row
        with a label, ``log_density`` log p(y | x, data) (NaN: absent)."""
        X, y = self._split_labels(x)
        p = self.predict_proba(lam, X)
        labelled = np.isfinite(y)
        lp = np.full(len(p), np.nan)
        if labelled.any():
            rows = np.flatnonzero(labelled)
            lp[rows] = np.log(np.maximum(p[rows, y[rows].astype(np.int64)], 1e-300))
        return {"proba": p, "prediction": p.argmax(axis=1), "log_density": lp}
