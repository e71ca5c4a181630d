"""What annealing costs LDA's sparse global step: seconds and memory per update.

Corpus: ``bench/lda_vocab.py``'s Zipf corpus (V words, 100 true topics, ~120
tokens per document), batches of 256 documents in corpus order; K = 100,
α = η = 1/K, ρ_t = (10 + t)^(−0.7), N = 6,000, single-threaded BLAS. Three
engines from the same start, each kept in its annealed phase for the whole
run: ``none`` (the sparse step), ``deterministic`` (T_t = 3 throughout: the
tempered local step on the batch's columns plus an untempered one for the
ELBO, still a sparse step) and ``stochastic`` (ρ^a_t = 0.5 throughout: η_t is
a dense K × V draw, so every step is dense and λ is plain).

Per update: wall time (the mean of ``--updates`` updates after 2 warm-up
updates; methods alternate within each repeat, and the figures are ratios to
``none`` of the same repeat: the machine is shared, absolute times are noisy)
and the peak of numpy's allocations during one update beyond what was live
before it (``tracemalloc``, a separate untimed update), in topic-sized arrays
K × V × 8 bytes.

Run::

    python bench/lda_anneal.py                    # V = 100k
    python bench/lda_anneal.py --vocab 30000 --repeats 3
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402


from _common import cpu_model, fmt_table  # noqa: E402  (bench/ sibling)
from lda_vocab import make_zipf_corpus  # noqa: E402

from streamsvi.inference import SVI, RobbinsMonro  # noqa: E402
from streamsvi.inference.annealing import Deterministic, NoAnnealing, Stochastic  # noqa: E402
from streamsvi.models import LDA  # noqa: E402

K, BATCH, N = 100, 256, 6000
METHODS = {"none": NoAnnealing(),
           "deterministic": Deterministic(T0=3.0, schedule="linear", n_steps=10 ** 9),
           "stochastic": Stochastic(rho0=0.5, schedule="linear", n_steps=10 ** 9)}


def _engine(V, ann):
    model = LDA(K, V, doc_topic_prior=1.0 / K, topic_word_prior=1.0 / K)
    return SVI(model, n_total=N, schedule=RobbinsMonro(tau0=10.0, kappa=0.7), annealer=ann)


def run(X, V, name, updates):
    """(seconds per update, peak extra bytes of one update) for one method."""
    engine = _engine(V, METHODS[name])
    batches = [X[i * BATCH:(i + 1) * BATCH] for i in range(updates + 3)]
    state = engine.init(batches[0], seed=0)
    for xb in batches[:2]:
        state, _ = engine.update(state, xb)
    t0 = time.perf_counter()
    for xb in batches[2:2 + updates]:
        state, _ = engine.update(state, xb)
    per = (time.perf_counter() - t0) / updates
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    state, _ = engine.update(state, batches[-1])
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return per, peak


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=100_000, help="V (default 100000)")
    ap.add_argument("--updates", type=int, default=6, help="timed updates per method (default 6)")
    ap.add_argument("--repeats", type=int, default=2, help="alternated repeats (default 2)")
    args = ap.parse_args(argv)
    V = args.vocab
    X = make_zipf_corpus(V, BATCH * (args.updates + 3), seed=0)
    topic = K * V * 8
    rows = {m: [] for m in METHODS}
    for rep in range(args.repeats):
        order = list(METHODS) if rep % 2 == 0 else list(METHODS)[::-1]
        res = {m: run(X, V, m, args.updates) for m in order}
        for m in METHODS:
            rows[m].append((res[m][0], res[m][0] / res["none"][0], res[m][1] / topic))
    print(f"LDA K = {K}, V = {V}, batches of {BATCH}; {cpu_model()}; shared machine, "
          f"absolute times are noisy")
    table = [[m, " / ".join(f"{r[0]:.3f}" for r in rs), " / ".join(f"{r[1]:.2f}" for r in rs),
              " / ".join(f"{r[2]:.2f}" for r in rs)] for m, rs in rows.items()]
    print(fmt_table(["annealer", "s per update (each repeat)", "× none (same repeat)",
                     "peak extra memory, K×V arrays"], table))


if __name__ == "__main__":
    main()
