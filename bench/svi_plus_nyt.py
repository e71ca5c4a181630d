"""Seed 000 §IV-B on the real NYT corpus at K = 50: SVI |S| = M vs SVI |S| vs SVI+ (issue 29, item 3).

Seed 000's LDA experiment: K = 50 topics, 250,000 NYT articles, SVI at |S| ∈ {500, 1000} and
SVI+ at |S| = 1000, M = 500, 20 random initialisations, the variational objective against
batches seen (one pass; Fig. 2). The paper gives neither κ, τ, α nor η. Here:

* data: the NYT bag of words of seed 002 Table 1 (``streamsvi.datasets.load_nyt``: 8,447
  documents, 3,012 words; the paper's 250,000-article corpus is not obtainable here), 10 % held
  out (seeded permutation, seed 0: 845 documents), N = 7,602 training documents;
* the paper's number of documents *seen* (``--docs``, default 250,000) is reached by passes over
  the 7,602 training documents (about 33 passes), each pass a fresh seeded permutation; SVI |S|
  and SVI+ see the same minibatches for a given initialisation (paired);
* K = 50, α = 1/K, η = 100/V (seed 002 §4.1, the project's other LDA benches), ρ_t = (1 + t)^−0.7
  (τ0 = 1, κ = 0.7: the engine's default, as bench/annealing.py's lda-regime study);
* every method of an initialisation starts from the same λ0 = ``LDA.random_init`` (seed 002 §4);
* measured at the end: the training ELBO per document (exact: global term + Σ_d L_d over all
  7,602 training documents at the final λ), the held-out per-word bound (``perword_bound``,
  topics' KL excluded), and for SVI+ the fraction of updates whose step the fraction-to-boundary
  rule shortened (``UpdateInfo.domain_clipped``);
* paired against SVI |S| = 1000 (and SVI |S| = M): wins/ties/losses (tie: |Δ| ≤ 1e-5·|L| for the
  ELBO, 1e-4 nats per word held out), mean Δ ± standard error, two-sided sign test p (ties
  dropped).

Uses the engine directly (``streamsvi.SVI`` with ``LDA``), not the daemon. Run::

    python bench/svi_plus_nyt.py --inits 10                  # the paper's regime, 10 inits
    python bench/svi_plus_nyt.py --quick                     # smoke run (seconds)

Writes ``bench/results/svi_plus_nyt.{md,json}`` (not with ``--quick`` unless ``--out`` is given).
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from _common import paired  # noqa: E402

from streamsvi import SVI  # noqa: E402
from streamsvi.datasets import load_nyt  # noqa: E402
from streamsvi.inference.annealing import NoAnnealing, SVIPlus  # noqa: E402
from streamsvi.inference.schedules import RobbinsMonro  # noqa: E402
from streamsvi.models import LDA  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ELBO_TIE, HELD_TIE = 1e-5, 1e-4


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def split_docs(X, frac=0.1, seed=0):
    """(train, held out): a seeded permutation, ``frac`` held out (bench/annealing.py's split)."""
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    n = int(round(frac * X.shape[0]))
    return X[np.sort(perm[n:])], X[np.sort(perm[:n])]




def methods(S_big, M):
    """name -> (|S|, M or None)."""
    return {f"SVI |S|={S_big}": (S_big, None), f"SVI+ |S|={S_big} M={M}": (S_big, M),
            f"SVI |S|={M}": (M, None)}


_DATA = {}


def data(n_train=None):
    if n_train not in _DATA:
        tr, te = split_docs(load_nyt()[0])
        _DATA[n_train] = (tr if n_train is None else tr[:n_train], te)
    return _DATA[n_train]


def _cache_path():
    from streamsvi.datasets import cache_dir
    return cache_dir() / "svi_plus_nyt" / "runs.jsonl"


def cached_runs():
    """Finished runs of earlier invocations (``--resume``): {task key: result}."""
    p = _cache_path()
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            out[r["key"]] = r
    return out


def run_one(task):
    """One (method, init): SVI / SVI+ through ``docs`` documents seen; final train ELBO, held-out bound."""
    name, S, M, seed, K, docs, n_train, n_held = task
    Xtr, Xte = data(n_train)
    Xte = Xte if n_held is None else Xte[:n_held]
    N, V = Xtr.shape
    model = LDA(K, V, topic_word_prior=100.0 / V)
    lam0 = model.random_init(np.random.default_rng(seed), Xtr, N)
    eng = SVI(model, N, schedule=RobbinsMonro(1.0, 0.7), annealer=SVIPlus(M) if M else NoAnnealing())
    st = eng.state_from_params(lam0, seed=seed)
    # the minibatch sequence depends on the seed and |S| only: SVI |S| and SVI+ |S| see the same batches
    rng = np.random.default_rng(10_000 + seed)
    steps = max(1, docs // S)
    per_pass = N // S
    clipped = 0
    t0 = time.perf_counter()
    perm = None
    for t in range(steps):
        j = t % per_pass
        if j == 0:
            perm = rng.permutation(N)
        st, info = eng.update(st, Xtr[np.sort(perm[j * S:(j + 1) * S])])
        clipped += int(info.domain_clipped > 0)
    secs = time.perf_counter() - t0
    loc = model.local_step(st.lam, Xtr)
    elbo = (model.global_elbo(st.lam) + float(np.sum(model.local_elbo(loc)))) / N
    held = float(model.perword_bound(st.lam, Xte))
    log(f"  {name} seed={seed}: elbo/doc {elbo:.4f} held {held:.4f} ({steps} steps, {secs:.0f} s)")
    res = dict(method=name, seed=seed, elbo=elbo, held=held, steps=steps,
               clipped_fraction=clipped / steps, seconds=secs, key=repr(task))
    if n_train is None:                       # full-data runs are kept for --resume
        p = _cache_path()
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as f:
            f.write(json.dumps(res) + "\n")
    return res


def table(res, names, base):
    seeds = sorted({r["seed"] for r in res})
    by = {(r["method"], r["seed"]): r for r in res}
    lines = [f"| method | steps | train ELBO/doc mean (sd) | W/T/L vs {base} | Δ ± se (sign p) | "
             f"held-out bound/word mean (sd) | W/T/L vs {base} | Δ ± se (sign p) | steps clipped |",
             "|---|---|---|---|---|---|---|---|---|"]
    summary = {}
    for nm in names:
        e = np.array([by[nm, s]["elbo"] for s in seeds])
        h = np.array([by[nm, s]["held"] for s in seeds])
        row = dict(elbo_mean=float(e.mean()), held_mean=float(h.mean()))
        cells = []
        if nm == base:
            cells = ["—", "—", "—", "—"]
        else:
            pe = paired(e, [by[base, s]["elbo"] for s in seeds], lambda b: ELBO_TIE * np.abs(b))
            ph = paired(h, [by[base, s]["held"] for s in seeds], lambda b: HELD_TIE)
            row.update(elbo_vs=pe, held_vs=ph)
            for p in (pe, ph):
                cells += [f"{p['wins']}/{p['ties']}/{p['losses']}",
                          f"{p['mean_diff']:+.4f} ± {p['se']:.4f} ({p['sign_p']:.2g})"]
        clip = np.mean([by[nm, s]["clipped_fraction"] for s in seeds])
        sd = (lambda v: v.std(ddof=1) if len(v) > 1 else 0.0)
        lines.append(f"| {nm} | {by[nm, seeds[0]]['steps']} | {e.mean():.4f} ({sd(e):.4f}) | {cells[0]} | "
                     f"{cells[1]} | {h.mean():.4f} ({sd(h):.4f}) | {cells[2]} | {cells[3]} | {clip:.3f} |")
        summary[nm] = row
    return lines, summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inits", type=int, default=10)
    ap.add_argument("--K", type=int, default=50)
    ap.add_argument("--S", type=int, default=1000, help="the big batch |S| (default 1000)")
    ap.add_argument("--M", type=int, default=500, help="SVI+'s effective batch M (default 500)")
    ap.add_argument("--docs", type=int, default=250_000, help="documents seen per run (default 250,000)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="smoke run: K=5, 2 inits, 400 docs, |S|=100, M=50")
    ap.add_argument("--out", default=None, help="write the .md/.json here (default bench/results/svi_plus_nyt)")
    ap.add_argument("--first-seed", type=int, default=0,
                    help="run initialisations first-seed .. inits-1 only (to split a run; see --resume)")
    ap.add_argument("--resume", action="store_true",
                    help="reuse finished runs of earlier invocations (~/.cache/streamsvi/svi_plus_nyt/runs.jsonl)")
    a = ap.parse_args(argv)
    n_train = n_held = None
    if a.quick:
        a.inits, a.K, a.S, a.M, a.docs, n_train, n_held = 2, 5, 100, 50, 400, 400, 100
    ms = methods(a.S, a.M)
    tasks = [(nm, S, M, s, a.K, a.docs, n_train, n_held) for s in range(a.first_seed, a.inits)
             for nm, (S, M) in ms.items()]
    t0 = time.perf_counter()
    done = cached_runs() if a.resume else {}
    todo = [t for t in tasks if repr(t) not in done]
    if a.jobs > 1:
        with get_context("spawn").Pool(a.jobs) as pool:
            new = pool.map(run_one, todo, chunksize=1)
    else:
        new = [run_one(t) for t in todo]
    res = [done[repr(t)] for t in tasks if repr(t) in done] + new
    secs = time.perf_counter() - t0
    names = list(ms)
    Xtr, Xte = data(n_train)
    base = names[0]
    lines, summary = table(res, names, base)
    lines_m, summary_m = table(res, [names[2], names[1]], names[2])
    cmd = "python bench/svi_plus_nyt.py " + " ".join(argv if argv is not None else sys.argv[1:])
    md = ["## SVI+ on real NYT, K = 50 (seed 000 §IV-B)", "",
          f"NYT (`load_nyt`): {Xtr.shape[0]:,} training / {(Xte.shape[0] if n_held is None else n_held):,} "
          f"held-out documents, V = {Xtr.shape[1]:,}; K = {a.K}, α = 1/K, η = 100/V, ρ_t = (1 + t)^-0.7; "
          f"{a.docs:,} documents seen per run (passes over the training set; the paper: one pass over "
          f"250,000 articles); {a.inits - a.first_seed} initialisations, each method from the same λ0; SVI |S| and SVI+ "
          "see the same minibatches. Train ELBO per document is exact over the whole training set; "
          "held-out bound per word excludes the topics' KL. 'steps clipped': fraction of updates the "
          "fraction-to-boundary rule shortened.", "", f"Against SVI |S| = {a.S}:", "", *lines, "",
          f"SVI+ against SVI |S| = M = {a.M} (the paper's second claim):", "", *lines_m, "",
          f"command: `{cmd}`; wall time {secs:.0f} s on a shared 2-core machine (timings are not results)"
          + (f"; {len(tasks) - len(todo)} of {len(tasks)} runs reused from earlier invocations" if a.resume else "")]
    text = "\n".join(md)
    print(text)
    if not a.quick or a.out:
        out = Path(a.out) if a.out else RESULTS / "svi_plus_nyt"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text + "\n")
        out.with_suffix(".json").write_text(json.dumps(
            dict(settings=vars(a), runs=res, summary=summary, summary_vs_small=summary_m,
                 wall_seconds=secs), indent=1))
    return res, summary, summary_m


if __name__ == "__main__":
    main()
