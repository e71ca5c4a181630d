"""LDA's training speed, one code version against another, alternated in one run (issue 24 gate).

Two workloads, the training updates only (``SVI.update`` per minibatch, with its
ELBO and gradient metrics), single-threaded BLAS:

* ``nyt``: ``bench/lda_nyt.py`` part (a), one pass: the NYT training split (7,603
  documents, V = 3,012), K = 50, α = η = 1/K, minibatches of 256 in corpus order,
  ρ_t = (10 + t)^(−0.7), ≤ 100 sweeps, mean |Δγ| < 1e-3.
* ``zipf``: ``bench/lda_vocab.py`` at V = 100,000, K = 100: its Zipf corpus (6,000
  training documents), the same settings, one pass.

Each run is a subprocess of the interpreter named by ``--python A B ...`` (each a
virtual environment with its own editable streamsvi checkout), so the versions never
share a process; the order of the interpreters alternates every round (A B, B A, ...),
and the table gives each one's median and min over the rounds of the wall time
and of the process's CPU time (``time.process_time``: on a shared machine it
moves less with the other processes' load than the wall time), the ratio of
medians to the first, and the median over the rounds of the paired ratio
(this round's run over the first interpreter's run of the same round). Every run also prints a checksum of its final λ (Σ λ and
Σ λ²), so a reader can see whether the versions computed the same thing.

Run::

    python bench/lda_step_ab.py --python /work/wt-base/.venv/bin/python .venv/bin/python --rounds 5
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent


def worker(workload, seed):
    import numpy as np
    import scipy.sparse as sp

    import streamsvi
    from streamsvi import SVI, RobbinsMonro
    from streamsvi.models import LDA

    if workload == "nyt":
        from streamsvi.datasets import load_nyt
        X = load_nyt()
        X = X[0] if isinstance(X, tuple) else X
        perm = np.random.default_rng(0).permutation(X.shape[0])
        Xtr = X[np.sort(perm[X.shape[0] // 10:])]
        K = 50
    else:
        sys.path.insert(0, str(HERE))
        import lda_vocab
        Xtr = sp.load_npz(lda_vocab.ensure_corpus(100_000)).tocsr()[:lda_vocab.N_TRAIN]
        K = 100
    V = Xtr.shape[1]
    batches = [Xtr[a:a + 256] for a in range(0, Xtr.shape[0], 256)]
    model = LDA(K, V, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K, mean_change_tol=1e-3,
                max_doc_update_iter=100)
    engine = SVI(model, n_total=Xtr.shape[0], schedule=RobbinsMonro(tau0=10.0, kappa=0.7))
    state = engine.init(batches[0], seed=seed)
    t, c = time.perf_counter(), time.process_time()
    for xb in batches:
        state, info = engine.update(state, xb)
    secs, cpu = time.perf_counter() - t, time.process_time() - c
    L = model.lam_matrix(state.lam)
    print(json.dumps({"workload": workload, "secs": secs, "cpu_secs": cpu, "docs_per_s": Xtr.shape[0] / secs,
                      "lam_sum": float(L.sum()), "lam_sqsum": float((L * L).sum()),
                      "last_elbo": info.elbo, "streamsvi": str(Path(streamsvi.__file__).parent)}))


def run(python, workload, seed):
    out = subprocess.run([python, __file__, "--worker", workload, str(seed)], capture_output=True,
                         text=True, cwd="/")
    if out.returncode != 0:
        raise SystemExit(f"{python} {workload} failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", nargs="+", help="interpreters to compare (the first is the base)")
    ap.add_argument("--workloads", nargs="+", default=["nyt", "zipf"], choices=["nyt", "zipf"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "SEED"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker[0], int(args.worker[1]))
        return
    if not args.python:
        ap.error("--python: name at least one interpreter")
    if "zipf" in args.workloads:
        sys.path.insert(0, str(HERE))
        import lda_vocab
        lda_vocab.ensure_corpus(100_000)
    res = {(p, w): [] for p in args.python for w in args.workloads}
    for r in range(args.rounds):
        order = args.python if r % 2 == 0 else args.python[::-1]
        for w in args.workloads:
            for p in order:
                o = run(p, w, seed=0)
                res[(p, w)].append(o)
                print(f"round {r + 1} {w:5s} {p}: {o['secs']:.2f} s (cpu {o['cpu_secs']:.2f} s)  Σλ={o['lam_sum']:.10g} "
                      f"Σλ²={o['lam_sqsum']:.10g}  ({o['streamsvi']})", file=sys.stderr, flush=True)
    print(f"{args.rounds} rounds, alternated; seconds of the training updates")
    print()
    print("| workload | streamsvi checkout | clock | median s | min s | median / base | paired ratio (median) |")
    print("|---|---|---|---:|---:|---:|---:|")
    for w in args.workloads:
        for clock in ("secs", "cpu_secs"):
            b = [o[clock] for o in res[(args.python[0], w)]]
            for p in args.python:
                s = [o[clock] for o in res[(p, w)]]
                paired = statistics.median(x / y for x, y in zip(s, b))
                print(f"| {w} | {res[(p, w)][0]['streamsvi']} | {'wall' if clock == 'secs' else 'cpu'} | "
                      f"{statistics.median(s):.2f} | {min(s):.2f} | {statistics.median(s) / statistics.median(b):.3f} "
                      f"| {paired:.3f} |")


if __name__ == "__main__":
    main()
