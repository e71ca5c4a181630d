"""Prequential evaluation: its cost per minibatch against the update, and the daemon's λ on NYT
against the in-memory engine's (issue 26, item 4).

(a) Cost. For GMM (K = 5, D = 14, |S| = 200, M = 50: the demo's settings on data of its shape)
    and LDA on NYT (K = 50, |S| = 256, the settings of bench/lda_nyt.py), one minibatch's
    ``engine.update`` against ``engine.predictive_logpdf`` of an evenly spaced sample of s records
    of that minibatch at the λ before it (what ``Daemon._prequential`` does), s in
    ``--samples`` (0 = the whole minibatch). The methods alternate within each round, on the same
    minibatches from the same λ; each figure is the median over ``--rounds`` rounds of the time
    per minibatch, and the ratio is scoring time / update time of the same round (median of the
    per-round ratios).

(b) NYT, daemon against the in-memory engine. The 7,603 training documents of
    bench/lda_nyt.py's split, written as JSON lines, learnt by the daemon (file source, one
    pass, |S| = 256, K = 50, N = 7,603) with ``metrics.evaluation = "prequential"`` (nothing
    withheld) and with ``"reservoir"`` (``heldout_size = 500``, the old default), and by the
    in-memory engine fed the same minibatches in the same order. Printed: whether the
    prequential daemon's λ equals the in-memory λ bit for bit, and the held-out perplexity of
    each on the 844 test documents (bench/lda_nyt.py's evaluator).

Run::

    python bench/prequential.py                 # (a) and (b), about 3 min on 2 cores
    python bench/prequential.py --skip-nyt      # (a) only
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import blas_build, cpu_model, fmt_table  # noqa: E402  (bench/ sibling)

T0 = time.time()


def log(msg):
    print(f"[prequential {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _sample(kind, x, s):
    n = kind.n_records(x)
    if not s or n <= s:
        return x
    return kind.take(x, np.unique(np.linspace(0, n - 1, s).astype(np.int64)))


def cost(name, engine, state, batches, samples, rounds):
    """Median seconds per minibatch of the update and of each sample size's scoring, alternated."""
    from streamsvi.io.records import record_kind

    kind = record_kind(engine.model)
    per = {"update": [], **{s: [] for s in samples}}
    ratios = {s: [] for s in samples}
    for r in range(rounds):
        st = state
        t_up, t_sc = 0.0, {s: 0.0 for s in samples}
        order = list(samples) if r % 2 == 0 else list(reversed(samples))
        for x in batches:
            if r % 2:                       # alternate: scoring first on odd rounds
                for s in order:
                    t = time.perf_counter()
                    engine.predictive_logpdf(st, _sample(kind, x, s))
                    t_sc[s] += time.perf_counter() - t
            t = time.perf_counter()
            nxt, _ = engine.update(st, x)
            t_up += time.perf_counter() - t
            if r % 2 == 0:
                for s in order:
                    t = time.perf_counter()
                    engine.predictive_logpdf(st, _sample(kind, x, s))
                    t_sc[s] += time.perf_counter() - t
            st = nxt
        nb = len(batches)
        per["update"].append(t_up / nb)
        for s in samples:
            per[s].append(t_sc[s] / nb)
            ratios[s].append(t_sc[s] / t_up)
        log(f"{name} round {r + 1}: update {t_up / nb * 1e3:.2f} ms/batch; " + ", ".join(
            f"s={s or 'all'} {t_sc[s] / nb * 1e3:.2f} ms" for s in samples))
    rows = [[name, "update", f"{np.median(per['update']) * 1e3:.2f}", "1"]]
    for s in samples:
        rows.append([name, f"score {s or 'all'} records", f"{np.median(per[s]) * 1e3:.2f}",
                     f"{np.median(ratios[s]):.3f}"])
    return rows


def gmm_case(rounds, samples):
    from streamsvi import SVI, BayesianGMM

    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(5, 14))
    X = centres[rng.integers(0, 5, 200 * 30)] + rng.normal(size=(200 * 30, 14))
    engine = SVI(BayesianGMM(5, 14), n_total=len(X), effective_batch_size=50)
    state = engine.init(X[:800], seed=0)
    batches = [X[a:a + 200] for a in range(800, len(X), 200)]
    return cost("gmm K=5 D=14 |S|=200", engine, state, batches, samples, rounds)


def nyt_split():
    from streamsvi.datasets import load_nyt

    X = load_nyt()[0]
    perm = np.random.default_rng(0).permutation(X.shape[0])
    n_test = X.shape[0] // 10
    return X[np.sort(perm[n_test:])], X[np.sort(perm[:n_test])]


def lda_model(V, K=50):
    from streamsvi.models import LDA

    return LDA(K, V, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K, mean_change_tol=1e-3,
               max_doc_update_iter=100)


def lda_case(rounds, samples, Xtr):
    from streamsvi import SVI, RobbinsMonro

    engine = SVI(lda_model(Xtr.shape[1]), n_total=Xtr.shape[0], schedule=RobbinsMonro(tau0=10.0, kappa=0.7))
    state = engine.init(Xtr[:256], seed=0)
    for a in range(0, 256 * 10, 256):                 # past the first steps
        state, _ = engine.update(state, Xtr[a:a + 256])
    batches = [Xtr[a:a + 256] for a in range(256 * 10, 256 * 29, 256)]
    return cost("lda NYT K=50 |S|=256", engine, state, batches, samples, rounds)


def nyt_daemon(Xtr, Xte):
    from streamsvi.checkpoint import load_snapshot
    from streamsvi.io.records import record_kind
    from streamsvi.models import LDA, NatParams
    from streamsvi.service.config import build_engine, validate
    from streamsvi.service.daemon import Daemon

    K, V, B = 50, Xtr.shape[1], 256
    kind = record_kind(lda_model(V))
    work = Path(tempfile.mkdtemp(prefix="prequential-nyt-"))
    values = kind.to_json(Xtr)
    path = work / "nyt.jsonl"
    path.write_text("".join(json.dumps(v) + "\n" for v in values))
    evaluator = LDA(K, V, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K, mean_change_tol=1e-4,
                    max_doc_update_iter=500)

    def config(name, metrics):
        return validate({
            "model": {"kind": "lda", "n_components": K, "n_features": V, "doc_topic_prior": 1.0 / K,
                      "topic_word_prior": 1.0 / K, "mean_change_tol": 1e-3, "max_doc_update_iter": 100},
            "inference": {"n_total": Xtr.shape[0], "batch_size": B, "tau0": 10.0, "kappa": 0.7, "seed": 0},
            "source": {"kind": "file", "path": str(path)},
            "checkpoint": {"directory": str(work / name), "every_batches": 1000},
            "metrics": {"enabled": False, "progress_seconds": 0.0, **metrics}})

    rows, lams = [], {}
    for name, metrics in (("daemon, prequential (default)", {"evaluation": "prequential"}),
                          ("daemon, reservoir of 500", {"evaluation": "reservoir", "heldout_size": 500})):
        cfg = config(name.split(",")[1].split()[0], metrics)
        t = time.perf_counter()
        res = Daemon(cfg, out=io.StringIO()).run(until_drained=True)
        secs = time.perf_counter() - t
        snap = load_snapshot(cfg["checkpoint"]["directory"], follow="latest")
        lams[name] = snap.engine.model.lam_matrix(snap.state.lam)
        rows.append([name, str(res.records), f"{secs:.1f}", f"{evaluator.perplexity(NatParams(topic_word=lams[name]), Xte):.1f}"])
        log(f"{name}: {res.records} records learnt in {secs:.1f} s, perplexity {rows[-1][-1]}")
    cfg = config("memory", {"evaluation": "prequential"})
    engine = build_engine(cfg, float(Xtr.shape[0]))
    batches = [kind.from_json(values[a:a + B], engine.model) for a in range(0, len(values), B)]
    t = time.perf_counter()
    state = engine.init(batches[0], seed=0)
    for x in batches:
        state, _ = engine.update(state, x)
    secs = time.perf_counter() - t
    lam = engine.model.lam_matrix(state.lam)
    rows.append(["in-memory engine, same minibatches", str(Xtr.shape[0]), f"{secs:.1f}",
                 f"{evaluator.perplexity(NatParams(topic_word=lam), Xte):.1f}"])
    same = np.array_equal(lam, lams["daemon, prequential (default)"])
    return rows, same


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", default="32,64,128,256,0", help="sample sizes, 0 = the whole minibatch")
    ap.add_argument("--skip-nyt", action="store_true", help="(a) on GMM only")
    args = ap.parse_args(argv)
    samples = [int(s) for s in args.samples.split(",")]
    print(f"# prequential evaluation: cost per minibatch, and NYT daemon vs in-memory\n"
          f"CPU: {cpu_model()}; BLAS {blas_build()}; single-threaded BLAS\n")
    rows = gmm_case(args.rounds, samples)
    if not args.skip_nyt:
        Xtr, Xte = nyt_split()
        rows += lda_case(args.rounds, samples, Xtr)
    print(f"(a) median ms per minibatch over {args.rounds} rounds (methods alternated); ratio = scoring "
          f"time / update time of the same round, median\n")
    print(fmt_table(["case", "what", "ms/batch", "ratio to update"], rows))
    if args.skip_nyt:
        return 0
    rows, same = nyt_daemon(Xtr, Xte)
    print("\n(b) NYT, K = 50, |S| = 256, one pass over the 7,603 training documents; perplexity on "
          "the 844 test documents (lower is better)\n")
    print(fmt_table(["learner", "records learnt", "seconds", "held-out perplexity"], rows))
    print(f"\nprequential daemon's λ == in-memory engine's λ, bit for bit: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
