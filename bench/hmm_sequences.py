"""Discrete HMM on real sequences (seed 002 §4.2 setting): batch VI vs SVI vs SVI+.

Data: the DNA splice-junction sequences (StatLog / UCI; Debian r-cran-mlbench
``DNA.rda``, fetched once into the cache): 3,186 sequences of 60 bases,
alphabet A, C, G, T (V = 4). Fixed split: a permutation from
``default_rng(0)``; 500 sequences held out, 2,686 for training.

Model: ``DiscreteHMM(K, 4)`` with seed 002's priors (π and each row of A:
Dirichlet(1/K); each row of B: Dirichlet(10/V)) and seed 002's
initialisation (every q row = prior + a uniform Dirichlet draw scaled to the
data size), K ∈ {5, 10}. 20 initialisations (seeds 0..19); for a given seed
every method starts from the same λ.

Methods (N = 2,686):

* batch VI — CAVI, ρ = 1, the full training set every step, ``--sweeps`` (50) sweeps;
* SVI — |S| = 100, ``RobbinsMonro(tau0=1, kappa=0.7)``, ``--epochs`` (25) passes
  over the data (672 updates);
* SVI+ — the same with effective batch size M = 25 (ε_n ~ N(0, 3)).

Reported per method (mean, sd, min, median, max over the 20 inits):

* held-out log predictive per symbol, **the variational predictive**
  log E_q[p(x | π, A, B)] estimated with 100 draws from q (fixed seed; see
  ``DiscreteHMM.predictive_logpdf``), summed over the 500 held-out sequences
  and divided by their 30,000 symbols (nats/symbol; higher is better);
* held-out log-likelihood per symbol under the **posterior-mean plug-in**
  parameters (``DiscreteHMM.log_likelihood``);
* the training ELBO per symbol (full data, N = 2,686) of the final λ;
* wins / ties / losses against batch VI on the same seed (held-out
  predictive, tie = within 0.001 nats/symbol);
* sequences/s of training (updates only, evaluation excluded): records
  processed by the engine / wall time;
* extra, labelled as such: the held-out plug-in log-likelihood after
  ``--polish`` (20) further CAVI sweeps from each run's final λ, which tells
  whether a run ended in a better basin or is only less converged.

A throughput table (sequences/s) for the local step and the scoring methods,
and for hmmlearn's ``VariationalCategoricalHMM`` (C forward–backward, one
sequence at a time) running the same batch VI sweeps from the same λ as a
peer, when hmmlearn is installed. A 0-order baseline (symbol frequencies of
the training set) puts the per-symbol numbers in context: log 4 = 1.386 nats
is a uniform guess.

Run::

    python bench/hmm_sequences.py            # full
    python bench/hmm_sequences.py --quick    # 4 inits, fewer sweeps (< 1 min)
    python bench/hmm_sequences.py --study gap   # why SVI ends below batch VI (~6 min)
    python bench/hmm_sequences.py --study config   # configs/hmm.toml's schedule, before / after

``--study gap`` (issue 18): K = 5 (``--K``), 5 inits (``--inits``), every
comparison at an equal number of passes P (``--passes``, 50) from the same λ0
per seed: (a, b) SVI over a grid τ0 ∈ {1, 10, 64}, κ ∈ {0.55, 0.7, 0.9},
|S| ∈ {50, 100, 500}, with Σ_t ρ_t (how far SVI moved, in CAVI sweeps);
(c) a check that SVI and batch VI start from the same λ; (d) P/2 .. ``--long``
(400) passes for the default study's setting and the grid's best; (e) SVI's λ
polished by CAVI sweeps, hybrids (P/2 SVI passes then P/2 sweeps) and SVI+
(M = |S|/4), with the training ELBO after the long budget (same optimum or not).

Tables go to stdout, progress to stderr, the box plot to
``bench/out/hmm_sequences.png``.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _common import blas_build, cpu_model, fmt_table, rate  # noqa: E402  (bench/ sibling)
from streamsvi import SVI, RobbinsMonro, batch_vi  # noqa: E402
from streamsvi.datasets import load_dna_splice  # noqa: E402
from streamsvi.models import DiscreteHMM  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
N_HELD = 500
BATCH, M = 100, 25


def split():
    x, _ = load_dna_splice()
    perm = np.random.default_rng(0).permutation(len(x))
    return x[np.sort(perm[N_HELD:])], x[np.sort(perm[:N_HELD])]


def evaluate(model, lam, train, held):
    m = held.n_symbols_total
    engine = batch_vi(model, len(train))
    return {"pred": float(model.predictive_logpdf(lam, held).sum() / m),
            "plugin": float(model.log_likelihood(lam, held).sum() / m),
            "elbo": float(engine.elbo(lam, train) / train.n_symbols_total)}


def polished(model, lam, train, held, sweeps):
    """Held-out plug-in log-likelihood per symbol after ``sweeps`` CAVI sweeps from λ (which basin)."""
    eng = batch_vi(model, len(train))
    st, _ = eng.fit(eng.state_from_params(lam), train, n_steps=sweeps)
    return float(model.log_likelihood(st.lam, held).sum() / held.n_symbols_total)


def run_one(task):
    K, seed, sweeps, epochs, polish = task
    train, held = split()
    model = DiscreteHMM(K, 4)
    N = len(train)
    out = {}
    init = batch_vi(model, N).init(train, seed=seed)
    # batch VI
    eng = batch_vi(model, N)
    t0 = time.perf_counter()
    st, _ = eng.fit(init, train, n_steps=sweeps)
    secs = time.perf_counter() - t0
    out["batch VI"] = dict(evaluate(model, st.lam, train, held), seq_s=sweeps * N / secs,
                           polished=polished(model, st.lam, train, held, polish))
    steps = int(round(epochs * N / BATCH))
    for name, m_eff in (("SVI", None), (f"SVI+ (M={M})", M)):
        eng = SVI(model, n_total=N, schedule=RobbinsMonro(1.0, 0.7), effective_batch_size=m_eff)
        t0 = time.perf_counter()
        st, infos = eng.fit(eng.state_from_params(init.lam, seed=seed), train, n_steps=steps,
                            batch_size=BATCH)
        secs = time.perf_counter() - t0
        out[name] = dict(evaluate(model, st.lam, train, held), seq_s=steps * BATCH / secs,
                         clipped=sum(i.domain_clipped for i in infos),
                         polished=polished(model, st.lam, train, held, polish))
    print(f"  K={K} seed={seed}: " + ", ".join(f"{k} {v['pred']:.4f}" for k, v in out.items()),
          file=sys.stderr, flush=True)
    return K, seed, out


def stats_row(name, v, fmt="{:.4f}"):
    v = np.asarray(v)
    return [name] + [fmt.format(f) for f in (v.mean(), v.std(ddof=1) if v.size > 1 else 0.0,
                                              v.min(), np.median(v), v.max())]


def throughput(train, held, quick):
    rows = []
    x = train[:500]
    for K in (5, 10):
        model = DiscreteHMM(K, 4)
        lam = batch_vi(model, len(train)).init(train, seed=0).lam
        t = 0.3 if quick else 1.5
        rows.append([f"K={K} local step + stats (500 seqs)",
                     f"{rate(lambda: model.suffstats(model.local_step(lam, x), x), len(x), t):,.0f}"])
        rows.append([f"K={K} log_likelihood (plug-in)", f"{rate(lambda: model.log_likelihood(lam, x), len(x), t):,.0f}"])
        rows.append([f"K={K} predictive_logpdf (100 draws)",
                     f"{rate(lambda: model.predictive_logpdf(lam, x), len(x), t):,.0f}"])
        rows.append([f"K={K} viterbi", f"{rate(lambda: model.viterbi(lam, x), len(x), t):,.0f}"])
    return rows


def hmmlearn_peer(train, held, sweeps, seeds):
    try:
        from hmmlearn.vhmm import VariationalCategoricalHMM
    except ImportError:
        return None
    rows = []
    for K in (5, 10):
        model = DiscreteHMM(K, 4)
        N = len(train)
        res, speed, ours_speed, same = [], [], [], []
        for seed in seeds:
            lam = batch_vi(model, N).init(train, seed=seed).lam
            ref = VariationalCategoricalHMM(n_components=K, n_features=4, n_iter=sweeps, tol=-np.inf,
                                            init_params="", params="ste", implementation="scaling")
            ref.startprob_prior_, ref.transmat_prior_ = np.full(K, 1 / K), np.full((K, K), 1 / K)
            ref.emissionprob_prior_ = np.full((K, 4), 10 / 4)
            ref.startprob_posterior_ = lam["init"].copy()
            ref.transmat_posterior_ = lam["trans"].copy()
            ref.emissionprob_posterior_ = lam["emit"].copy()
            t0 = time.perf_counter()
            ref.fit(train.symbols[:, None], train.lengths)
            speed.append(sweeps * N / (time.perf_counter() - t0))
            out = type(lam)(init=ref.startprob_posterior_, trans=ref.transmat_posterior_,
                            emit=ref.emissionprob_posterior_)
            res.append(evaluate(model, out, train, held)["pred"])
            ours = batch_vi(model, N)
            t0 = time.perf_counter()
            st, _ = ours.fit(ours.state_from_params(lam), train, n_steps=sweeps)
            ours_speed.append(sweeps * N / (time.perf_counter() - t0))
            same.append(all(np.allclose(st.lam[k], out[k], rtol=1e-6) for k in out))
        rows.append([f"K={K}", f"{np.mean(res):.4f}", f"{np.mean(speed):,.0f}",
                     f"{np.mean(ours_speed):,.0f}", "yes" if all(same) else "no"])
    return rows


# ------------------------------------------------------------------ --study gap
# Why SVI ends below batch VI on held-out data (issue 18, item 3): every comparison at an equal
# number of passes over the training set (batch VI: one pass = one CAVI sweep; SVI with |S|:
# one pass = N/|S| updates), from the same initial λ per seed.
GAP_TAU0 = (1.0, 10.0, 64.0)
GAP_KAPPA = (0.55, 0.7, 0.9)        # κ must be in (0.5, 1]
GAP_BATCH = (50, 100, 500)
CURRENT = (1.0, 0.7, 100)           # the default study's schedule and |S|


def _svi_path(model, lam0, train, seed, cfg, passes, m_eff=None):
    """SVI from λ0 with cfg = (τ0, κ, |S|); λ after each pass count in ``passes`` (ascending)."""
    tau0, kappa, batch = cfg
    N = len(train)
    eng = SVI(model, n_total=N, schedule=RobbinsMonro(tau0, kappa), effective_batch_size=m_eff)
    st = eng.state_from_params(lam0, seed=seed)
    out = {}
    for p in passes:
        st, _ = eng.fit(st, train, n_steps=int(round(p * N / batch)) - st.step, batch_size=batch)
        out[p] = st.lam
    return out


def _sum_rho(cfg, passes, n):
    """Σ_t ρ_t over ``passes`` passes: how far SVI has moved, in units of CAVI sweeps (ρ = 1 each)."""
    tau0, kappa, batch = cfg
    rho = RobbinsMonro(tau0, kappa)
    return float(sum(rho(t) for t in range(1, int(round(passes * n / batch)) + 1)))


def _cavi(model, lam, train, sweeps):
    eng = batch_vi(model, len(train))
    return eng.fit(eng.state_from_params(lam), train, n_steps=sweeps)[0].lam if sweeps else lam


def gap_phase1(task):
    """Batch VI and the SVI grid at P passes (and batch VI to the long budget), one seed."""
    K, seed, P, long_p = task
    train, held = split()
    model = DiscreteHMM(K, 4)
    init = batch_vi(model, len(train)).init(train, seed=seed)
    res = {}
    lam, done = init.lam, 0
    for p in sorted({P // 2, P, 2 * P, 4 * P, long_p}):     # batch VI at every pass count (d) uses
        lam, done = _cavi(model, lam, train, p - done), p
        res[("batch", p)] = evaluate(model, lam, train, held)
    # (c) the SVI runs start from exactly batch VI's λ0
    eng = SVI(model, n_total=len(train))
    lam0 = eng.state_from_params(init.lam, seed=seed).lam
    res["same_start"] = max(float(np.max(np.abs(lam0[k] - init.lam[k]))) for k in lam0)
    for tau0 in GAP_TAU0:
        for kappa in GAP_KAPPA:
            for batch in GAP_BATCH:
                cfg = (tau0, kappa, batch)
                res[("svi", cfg, P)] = evaluate(model, _svi_path(model, init.lam, train, seed, cfg, [P])[P],
                                                train, held)
    print(f"  gap phase 1 K={K} seed={seed}: batch VI {res[('batch', P)]['pred']:.4f}, SVI "
          f"{res[('svi', CURRENT, P)]['pred']:.4f}", file=sys.stderr, flush=True)
    return seed, res


def gap_phase2(task):
    """Longer SVI runs, SVI+, polishing and hybrids for the current and the best grid setting."""
    K, seed, P, long_p, polish, cfgs = task
    train, held = split()
    model = DiscreteHMM(K, 4)
    init = batch_vi(model, len(train)).init(train, seed=seed)
    res = {}
    res[("batch", P + polish)] = evaluate(model, _cavi(model, init.lam, train, P + polish), train, held)
    for cfg in cfgs:
        mil = sorted({P // 2, P, 2 * P, 4 * P, long_p})
        path = _svi_path(model, init.lam, train, seed, cfg, mil)
        for p in mil:
            res[("svi", cfg, p)] = evaluate(model, path[p], train, held)
        # (e) polishing: SVI's λ after P passes + `polish` CAVI sweeps; and CAVI to the long budget
        res[("polish", cfg)] = evaluate(model, _cavi(model, path[P], train, polish), train, held)
        res[("svi+cavi", cfg, long_p)] = evaluate(model, _cavi(model, path[P], train, long_p - P),
                                                  train, held)
        # hybrid at the equal budget: P/2 SVI passes then P/2 CAVI sweeps
        res[("hybrid", cfg)] = evaluate(model, _cavi(model, path[P // 2], train, P - P // 2), train, held)
        # SVI+ (M = |S|/4) with this schedule
        tau0, kappa, batch = cfg
        res[("svi+", cfg)] = evaluate(model, _svi_path(model, init.lam, train, seed, cfg, [P],
                                                       m_eff=batch / 4)[P], train, held)
    print(f"  gap phase 2 K={K} seed={seed} done", file=sys.stderr, flush=True)
    return seed, res


def _pmap(fn, tasks, jobs):
    if jobs > 1:
        with get_context("fork").Pool(jobs) as pool:
            return pool.map(fn, tasks)
    return [fn(t) for t in tasks]


def gap_study(args):
    K, P, long_p, polish = args.K, args.passes, args.long, args.polish
    seeds = list(range(args.inits))
    train, held = split()
    print(f"# gap study: DNA splice, K = {K}, {len(seeds)} inits (seeds 0..{len(seeds) - 1}); equal "
          f"budget P = {P} passes (batch VI: {P} CAVI sweeps; SVI |S|: {P}·N/|S| updates), N = "
          f"{len(train)}; metric: held-out variational predictive per symbol (100 draws), mean "
          f"over inits; Δ = SVI − batch VI on the same seed")
    t0 = time.perf_counter()
    r1 = dict(_pmap(gap_phase1, [(K, s, P, long_p) for s in seeds], args.jobs))
    print(f"# (c) same start: max |λ0(SVI) − λ0(batch VI)| over seeds = "
          f"{max(r1[s]['same_start'] for s in seeds):g}")

    def col(res, key, what="pred"):
        return np.array([res[s][key][what] for s in seeds])

    base = col(r1, ("batch", P))
    print(f"\n## batch VI: held-out pred/symbol {base.mean():.4f} after {P} sweeps, "
          f"{col(r1, ('batch', long_p)).mean():.4f} after {long_p}; training ELBO/symbol "
          f"{col(r1, ('batch', P), 'elbo').mean():.4f} / {col(r1, ('batch', long_p), 'elbo').mean():.4f}")
    rows, scored = [], []
    for tau0 in GAP_TAU0:
        for kappa in GAP_KAPPA:
            for batch in GAP_BATCH:
                cfg = (tau0, kappa, batch)
                v = col(r1, ("svi", cfg, P))
                d = v - base
                scored.append((d.mean(), cfg))
                rows.append([f"{tau0:g}", f"{kappa:g}", str(batch), f"{int(round(P * len(train) / batch))}",
                             f"{(tau0 + P * len(train) / batch) ** -kappa:.4f}",
                             f"{_sum_rho(cfg, P, len(train)):.1f}", f"{v.mean():.4f}",
                             f"{d.mean():+.4f}", f"{d.min():+.4f}", f"{d.max():+.4f}",
                             f"{col(r1, ('svi', cfg, P), 'elbo').mean():.4f}",
                             f"{int(np.sum(d > 1e-3))}/{int(np.sum(abs(d) <= 1e-3))}/{int(np.sum(d < -1e-3))}"
                             + (" *" if cfg == CURRENT else "")])
    print(f"\n## (a, b) SVI at {P} passes, grid of τ0, κ, |S| (* = the default study's setting)")
    print(f"# Σρ = Σ_t ρ_t, how far SVI moved in units of CAVI sweeps (batch VI: {P})")
    print(fmt_table(["tau0", "kappa", "|S|", "updates", "last rho", "Σρ", "held-out", "mean Δ", "min Δ",
                     "max Δ", "train ELBO", "w/t/l"], rows, left=0))
    best = max(scored)[1]
    cfgs = [CURRENT] + ([best] if best != CURRENT else [])
    print(f"# best grid setting by mean Δ: τ0 = {best[0]:g}, κ = {best[1]:g}, |S| = {best[2]}")

    r2 = dict(_pmap(gap_phase2, [(K, s, P, long_p, polish, cfgs) for s in seeds], args.jobs))
    mil = sorted({P // 2, P, 2 * P, 4 * P, long_p})
    b_at = {p: col(r1, ("batch", p)) for p in mil}
    rows = []
    for p in mil:
        row = [str(p), f"{b_at[p].mean():.4f}"]
        for cfg in cfgs:
            v = col(r2, ("svi", cfg, p))
            row += [f"{_sum_rho(cfg, p, len(train)):.0f}", f"{v.mean():.4f}", f"{(v - b_at[p]).mean():+.4f}"]
        rows.append(row)
    hdr = ["passes", "batch VI"]
    for cfg in cfgs:
        name = "SVI {:g}/{:g}/{}".format(*cfg)
        hdr += ["Σρ", name, "Δ"]
    print("\n## (d) more passes: held-out pred/symbol, mean over inits (SVI τ0/κ/|S|; Δ vs batch VI "
          "at the same number of passes)")
    print(fmt_table(hdr, rows))
    rows = []
    bl = col(r1, ("batch", long_p))
    bl_elbo = col(r1, ("batch", long_p), "elbo")
    bp = col(r2, ("batch", P + polish))
    for cfg in cfgs:
        name = "{:g}/{:g}/{}".format(*cfg)
        for label, key, ref, budget in (
                (f"SVI {P} + CAVI {polish}", ("polish", cfg), bp, P + polish),
                (f"SVI {P // 2} + CAVI {P - P // 2}", ("hybrid", cfg), base, P),
                (f"SVI {P} + CAVI {long_p - P}", ("svi+cavi", cfg, long_p), bl, long_p),
                (f"SVI {long_p}", ("svi", cfg, long_p), bl, long_p),
                (f"SVI+ M=|S|/4, {P}", ("svi+", cfg), base, P)):
            v = col(r2, key)
            d = v - ref
            row = [name, label, str(budget), f"{v.mean():.4f}", f"{ref.mean():.4f}", f"{d.mean():+.4f}",
                   f"{int(np.sum(d > 1e-3))}/{int(np.sum(abs(d) <= 1e-3))}/{int(np.sum(d < -1e-3))}"]
            if budget == long_p:
                e = col(r2, key, "elbo") - bl_elbo
                row.append(f"{e.mean():+.5f}")
            else:
                row.append("")
            rows.append(row)
    print(f"\n## (e) polishing and hybrids vs batch VI at the same total passes (ELBO Δ: training ELBO "
          f"per symbol minus batch VI's after {long_p} sweeps)")
    print(fmt_table(["SVI τ0/κ/|S|", "run", "passes", "held-out", "batch VI", "mean Δ", "w/t/l",
                     "ELBO Δ"], rows, left=2))
    print(f"# {time.perf_counter() - t0:.0f} s")


CONFIG_OLD, CONFIG_NEW = (10.0, 0.6, 200), (10.0, 0.55, 100)   # configs/hmm.toml before / after issue 18


def config_one(task):
    K, seed, P = task
    train, held = split()
    model = DiscreteHMM(K, 4)
    init = batch_vi(model, len(train)).init(train, seed=seed)
    res = {"batch": evaluate(model, _cavi(model, init.lam, train, P), train, held)["pred"]}
    for cfg in (CONFIG_OLD, CONFIG_NEW):
        for m in (None, cfg[2] / 4):
            lam = _svi_path(model, init.lam, train, seed, cfg, [P], m_eff=m)[P]
            res[(cfg, m)] = evaluate(model, lam, train, held)["pred"]
    return K, seed, res


def config_study(args):
    """configs/hmm.toml's schedule and |S| (M = |S|/4) before and after, K = 5 and 10, P passes."""
    P, seeds = args.passes, list(range(args.inits))
    print(f"# configs/hmm.toml schedule: SVI and SVI+ (M = |S|/4) vs batch VI at {P} passes, "
          f"DNA, {len(seeds)} inits; held-out variational predictive per symbol, Δ = SVI − batch VI")
    out = _pmap(config_one, [(K, s, P) for K in (5, 10) for s in seeds], args.jobs)
    rows = []
    for K in (5, 10):
        res = [r for k, _, r in out if k == K]
        b = np.array([r["batch"] for r in res])
        rows.append([f"K={K}", "batch VI", "", f"{b.mean():.4f}", "", "", ""])
        for cfg in (CONFIG_OLD, CONFIG_NEW):
            for m in (None, cfg[2] / 4):
                d = np.array([r[(cfg, m)] for r in res]) - b
                rows.append([f"K={K}", "{:g}/{:g}/{}".format(*cfg) + (" (before)" if cfg == CONFIG_OLD else
                                                                       " (now)"),
                             "SVI" if m is None else f"SVI+ M={m:g}", f"{(b + d).mean():.4f}",
                             f"{d.mean():+.4f}", f"{d.min():+.4f}", f"{d.max():+.4f}"])
    print(fmt_table(["K", "τ0/κ/|S|", "method", "held-out", "mean Δ", "min Δ", "max Δ"], rows, left=3))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 inits, 10 sweeps / 5 epochs")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--inits", type=int, default=20)
    ap.add_argument("--sweeps", type=int, default=50)
    ap.add_argument("--epochs", type=float, default=25)
    ap.add_argument("--polish", type=int, default=20, help="CAVI sweeps from each final λ (extra table)")
    ap.add_argument("--study", choices=["gap", "config"], help="gap: why SVI ends below batch VI at an "
                    "equal number of passes (schedule / |S| grid, same start, more passes, polishing); "
                    "config: configs/hmm.toml's schedule before and after; both use --inits (default 5 "
                    "here) and --passes; gap also --long, --polish, --K")
    ap.add_argument("--passes", type=int, default=50, help="--study gap: the equal budget P")
    ap.add_argument("--long", type=int, default=400, help="--study gap: the long budget")
    ap.add_argument("--K", type=int, default=5, help="--study gap: number of states")
    args = ap.parse_args(argv)
    if args.study is not None:
        if "--inits" not in (argv if argv is not None else sys.argv[1:]):
            args.inits = 5
        return (gap_study if args.study == "gap" else config_study)(args)
    if args.quick:
        args.inits, args.sweeps, args.epochs, args.polish = 4, 10, 5, 5
    train, held = split()
    print(f"# DNA splice sequences: {len(train)} train / {len(held)} held out "
          f"({held.n_symbols_total} held-out symbols), V = 4")
    print(f"# machine: {cpu_model()}, {os.cpu_count()} cores, BLAS {blas_build()}, "
          f"{args.jobs} worker process(es), single-threaded BLAS")
    print(f"# batch VI {args.sweeps} sweeps; SVI / SVI+ |S| = {BATCH}, {args.epochs:g} epochs "
          f"({int(round(args.epochs * len(train) / BATCH))} updates), RobbinsMonro(1, 0.7), SVI+ M = {M}")
    freq = np.bincount(train.symbols, minlength=4) / train.n_symbols_total
    print(f"# 0-order baseline (training symbol frequencies) on held out: "
          f"{np.log(freq)[held.symbols].mean():.4f} nats/symbol; uniform: {-np.log(4):.4f}")
    tasks = [(K, s, args.sweeps, args.epochs, args.polish) for K in (5, 10) for s in range(args.inits)]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with get_context("fork").Pool(args.jobs) as pool:
            results = pool.map(run_one, tasks)
    else:
        results = [run_one(t) for t in tasks]
    print(f"# {len(tasks)} runs in {time.perf_counter() - t0:.0f} s")
    methods = list(results[0][2])
    header = ["method", "mean", "sd", "min", "median", "max"]
    boxes = {}
    for K in (5, 10):
        res = {m: [r[2][m] for r in results if r[0] == K] for m in methods}
        print(f"\n## K = {K}: held-out variational predictive log p per symbol (nats; 100 draws from q)")
        print(fmt_table(header, [stats_row(m, [d["pred"] for d in res[m]]) for m in methods]))
        print(f"\n## K = {K}: held-out posterior-mean plug-in log-likelihood per symbol (nats)")
        print(fmt_table(header, [stats_row(m, [d["plugin"] for d in res[m]]) for m in methods]))
        print(f"\n## K = {K}: training ELBO per symbol (nats, full data)")
        print(fmt_table(header, [stats_row(m, [d["elbo"] for d in res[m]]) for m in methods]))
        base = np.array([d["pred"] for d in res["batch VI"]])
        rows = []
        for m in methods:
            p = np.array([d["pred"] for d in res[m]])
            w, l = int(np.sum(p > base + 1e-3)), int(np.sum(p < base - 1e-3))
            rows.append([m, f"{w}/{len(p) - w - l}/{l}", f"{np.mean([d['seq_s'] for d in res[m]]):,.0f}",
                         str(sum(d.get("clipped", 0) for d in res[m]))])
        print(f"\n## K = {K} (extra): held-out plug-in log-likelihood per symbol after {args.polish} "
              f"more CAVI sweeps from each final λ (which basin the run ended in)")
        print(fmt_table(header, [stats_row(m, [d["polished"] for d in res[m]]) for m in methods]))
        base_p = np.array([d["polished"] for d in res["batch VI"]])
        print("win/tie/loss vs batch VI after polishing: " + ", ".join(
            f"{m} {int(np.sum(p > base_p + 1e-3))}/{int(np.sum(abs(p - base_p) <= 1e-3))}/"
            f"{int(np.sum(p < base_p - 1e-3))}" for m in methods[1:]
            for p in [np.array([d["polished"] for d in res[m]])]))
        print(f"\n## K = {K}: vs batch VI on the same seed (held-out predictive), training speed")
        print(fmt_table(["method", "win/tie/loss", "train seq/s", "domain clips"], rows))
        boxes[K] = {m: [d["pred"] for d in res[m]] for m in methods}

    print("\n## Throughput (sequences/s, 500 training sequences of 60, one core)")
    print(fmt_table(["operation", "seq/s"], throughput(train, held, args.quick)))
    peer = hmmlearn_peer(train, held, args.sweeps, range(2 if args.quick else 3))
    if peer is not None:
        print(f"\n## Peer: hmmlearn VariationalCategoricalHMM, {args.sweeps} batch VI sweeps from the "
              f"same λ (seeds 0..{2 if args.quick else 3 - 1})")
        print(fmt_table(["K", "held-out pred/symbol", "hmmlearn seq/s", "streamsvi seq/s",
                         "same final λ"], peer))

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    OUT.mkdir(exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, K in zip(axes, (5, 10)):
        ax.boxplot(list(boxes[K].values()))
        ax.set_xticks(range(1, len(boxes[K]) + 1), list(boxes[K]))
        ax.set_title(f"DNA splice, K = {K}, {args.inits} inits")
        ax.set_ylabel("held-out log predictive per symbol (nats)")
    fig.tight_layout()
    fig.savefig(OUT / "hmm_sequences.png", dpi=110)
    print(f"\n# plot: {OUT / 'hmm_sequences.png'}")


if __name__ == "__main__":
    main()
