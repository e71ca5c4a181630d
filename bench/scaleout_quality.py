"""What N workers' staleness costs in held-out quality, in process, over several stream orders.

    PYTHONPATH=. python bench/scaleout_quality.py [--records 100000] [--workers 1,2,4,8]
        [--seeds 4] [--batch-size 1024] [--commit-every K] [--partitions 8] [--tiny]

``bench/scaleout.py`` measures N workers end to end, once per run: its held-out
figure moves with the order in which the broker's partitions interleave the
documents, so one run cannot tell staleness from that. This bench runs the same
updates without Kafka, with the scale-out contract's own functions
(:func:`streamsvi.inference.split.contribution` and :func:`~streamsvi.inference.split.apply`,
which the worker and the applier call), on LDA at the settings of ``bench/scaleout.py --model lda``
(NYT, K = 100, V = 3,012, |S| = 1024, plain SVI; 447 documents held out), for
``--seeds`` stream orders (passes over the 8,000 training documents, each pass in a
new seeded order), and for each order:

* **single**: one process, every batch's contribution at the latest λ (what
  ``streamsvi run`` computes, bit for bit);
* **N workers**: the records are on ``--partitions`` partitions (record i on i mod P, as
  ``bench/scaleout.py`` produces them) and worker w reads those with p mod N = w, cut into
  batches of its own, so each worker's last batch is partial, as in a real run
  (``--partitions 0``: batch j of the whole stream goes to worker j mod N); the workers run in lockstep
  (one batch each per tick, in worker order), each computing its batch at the λ the
  applier holds at that moment (a worker follows λ before each batch); a worker's
  deltas reach the applier together, k batches per transaction, and the applier
  steps each with the product's staleness rule: ρ_t × min(1, 16 / staleness).
  A worker's transaction closes at 16 batches or once it is 0.5 s old
  (``scaleout.commit_every_batches`` and ``commit_seconds``' defaults), so k is
  min(16, ⌊0.5 s / t⌋ + 1) for t the time of one batch's local step, measured in
  the first single run (``--commit-every`` sets k).

Reported: the held-out per-word bound (Σ_d L_d / Σ_d N_d over the held-out
documents) of each run, and per N the paired difference against single over
the orders: mean, standard error and the worst.
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_model, fmt_table  # noqa: E402

#: the product's staleness bound for statistic deltas (``scaleout.max_staleness`` unset), also
#: ``scaleout.commit_every_batches``' default
BOUND = 16
#: ``scaleout.commit_seconds``' default: a worker's transaction closes once it is this old
COMMIT_SECONDS = 0.5


def setting(tiny: bool, n: int, batch: int):
    """(engine, training stream maker, held-out documents, description)."""
    from streamsvi import datasets
    from streamsvi.service.config import build_engine, validate

    if tiny:
        X, _, _ = datasets.make_lda_corpus(n_docs=900, n_topics=4, n_words=60, doc_length=30, seed=3)
        train, held = X[:800], X[800:]
        model = {"kind": "lda", "n_components": 4, "n_features": 60, "max_doc_update_iter": 30}
        what = "synthetic LDA corpus (K = 4, V = 60)"
    else:
        from scaleout import nyt_split

        train, held = nyt_split()
        X = train
        model = {"kind": "lda", "n_components": 100, "n_features": X.shape[1], "doc_topic_prior": 0.02,
                 "topic_word_prior": 0.02}
        what = f"NYT ({train.shape[0]} training documents in passes, V = {X.shape[1]}), K = 100"
    cfg = validate({"model": model, "inference": {"n_total": n, "batch_size": batch, "seed": 1},
                    "source": {"topics": ["docs"], "group_id": "g"},
                    "checkpoint": {"directory": "unused"}})
    return build_engine(cfg, float(n)), train, held, what


def stream(train, n, seed):
    """``n`` documents: passes over ``train``, each in a new order drawn from ``seed``
    (``bench/scaleout.py``'s)."""
    from scaleout import lda_records

    return lda_records(n, train, seed=seed)


def heldout(engine, state, H) -> float:
    return float(np.sum(engine.predictive_logpdf(state, H)) / H.sum())


def run(engine, X, batch, workers, commit_every, seed, partitions=0):
    """The final state of ``workers`` workers (0: the single process) on the stream ``X``.

    ``partitions`` > 0: record i is on partition i mod ``partitions`` (as ``bench/scaleout.py``
    produces them) and worker w reads the partitions p with p mod ``workers`` = w, in offset
    order, cut into batches of its own: each worker's last batch is partial, as in a real run
    (8 workers on 8 partitions of 12,500 documents: 12 full batches and one of 212 each). 0:
    batch j of the whole stream goes to worker j mod ``workers`` (one partial batch in all).
    """
    from streamsvi.inference import split

    n = X.shape[0]
    batches = [X[i:i + batch] for i in range(0, n, batch)]
    state = engine.init(batches[0], seed=seed)
    draws = [split.batch_rng_state(seed, "docs", 0, i * batch) for i in range(len(batches))]
    if workers == 0:
        for x, d in zip(batches, draws):
            state, _ = split.apply(engine, state, split.contribution(engine, state, x, d))
        return state
    if partitions:
        idx = np.arange(n)
        batches, draws, mine = [], [], []
        for w in range(workers):
            rows = idx[(idx % partitions) % workers == w]
            mine.append(list(range(len(batches), len(batches) + -(-len(rows) // batch))))
            for i in range(0, len(rows), batch):
                batches.append(X[rows[i:i + batch]])
                draws.append(split.batch_rng_state(seed, "docs", w, i))
    else:
        mine = [list(range(w, len(batches), workers)) for w in range(workers)]
    pending = [[] for _ in range(workers)]           # (contribution, version computed at)
    view = None                                       # (version, a copy of λ at it): the workers' λ
    for tick in range(max(len(m) for m in mine)):
        for w in range(workers):
            if tick >= len(mine[w]):
                continue
            j = mine[w][tick]
            if view is None or view[0] != state.step:  # λ is stepped in place: the workers' copy
                view = (state.step, copy.deepcopy(state))
            pending[w].append((split.contribution(engine, view[1], batches[j], draws[j]), state.step))
            if len(pending[w]) == commit_every or tick == len(mine[w]) - 1:
                for c, version in pending[w]:          # the transaction lands: the applier's steps
                    stale = state.step - version
                    state, _ = split.apply(engine, state, c, 1.0 if stale <= BOUND else BOUND / stale)
                pending[w] = []
    return state


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100000)
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--commit-every", type=int, default=None,
                    help="batches per worker transaction (default: what the product's 16 batches or "
                         "0.5 s give at this machine's batch time)")
    ap.add_argument("--partitions", type=int, default=8,
                    help="records on this many partitions, each worker reading its own (its last batch "
                         "partial); 0: the workers share the whole stream's batches (default 8, as "
                         "bench/scaleout.py's 16-core run)")
    ap.add_argument("--tiny", action="store_true", help="a small synthetic corpus (the smoke test)")
    args = ap.parse_args()
    if args.tiny:
        args.records, args.batch_size = min(args.records, 2000), min(args.batch_size, 100)
    counts = [int(w) for w in args.workers.split(",")]
    engine, train, H, what = setting(args.tiny, args.records, args.batch_size)
    print(f"cpu: {cpu_model()}; {what}; {args.records} documents, |S| = {args.batch_size}, "
          f"{args.seeds} stream orders, "
          f"{f'{args.partitions} partitions' if args.partitions else 'batches shared round robin'}", flush=True)
    scores = {w: [] for w in [0] + counts}
    k = args.commit_every
    for s in range(args.seeds):
        X = stream(train, args.records, seed=100 + s)
        order = [0] + counts if s % 2 == 0 else counts[::-1] + [0]
        for w in order:
            t0 = time.perf_counter()
            st = run(engine, X, args.batch_size, w, k, seed=s, partitions=args.partitions)
            if w == 0 and k is None:
                t = (time.perf_counter() - t0) / st.step
                k = min(BOUND, int(COMMIT_SECONDS // t) + 1)
                print(f"  one batch's step: {t:.3f} s, so {k} batch(es) per worker transaction "
                      f"(16 batches or {COMMIT_SECONDS} s)", flush=True)
            scores[w].append(heldout(engine, st, H))
            print(f"  order {s + 1}: {'single' if w == 0 else f'{w} worker(s)':>12}  held-out "
                  f"{scores[w][-1]:.4f} nats/word  ({st.step} steps, {time.perf_counter() - t0:.0f} s)",
                  flush=True)
    rows = [["single", f"{np.mean(scores[0]):.4f}", f"{np.std(scores[0], ddof=1) if args.seeds > 1 else 0:.4f}",
             "", "", ""]]
    for w in counts:
        d = np.array(scores[w]) - np.array(scores[0])
        se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
        rows.append([f"{w} worker(s)", f"{np.mean(scores[w]):.4f}", f"{np.std(scores[w], ddof=1) if args.seeds > 1 else 0:.4f}",
                     f"{d.mean():+.4f}", f"{se:.4f}", f"{d.min():+.4f}"])
    print("\nheld-out per-word bound (nats/word) over the stream orders; difference = workers − single, "
          "paired by order:")
    print(fmt_table(["run", "mean", "sd", "mean difference", "its s.e.", "worst difference"], rows))


if __name__ == "__main__":
    main()
