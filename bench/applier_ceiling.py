"""The scale-out applier's ceiling per model: records/s one applier can fold in, vs a worker's cost.

    PYTHONPATH=. python bench/applier_ceiling.py [--rounds 2] [--min-time 1.0] [--batches 20]
        [--models gmm,lda,...] [--clock cpu|wall] [--tiny]

Scale-out runs one applier and N workers (``--role``); the applier is a single
process, so its cost per delta bounds how far scale-out goes. For each model
kind, at the settings of its ``configs/<kind>.toml`` (overrides below) and a
realistic size, this builds the engine as the service does (``build_engine``),
trains a state on ``--batches`` minibatches (one worker without staleness: the
applier's warm-up, so row models have their rows and LDA real topics), copies
that λ to a worker (``state_to_arrays`` / ``state_from_arrays``: its own
engine, as a worker loads the published λ), and encodes the worker's
contributions of those ``--batches`` different minibatches as ``Delta`` messages.
Then, alternated over ``--rounds`` rounds (model order reversed, and worker and
applier swapped, every other round), each for at least ``--min-time`` seconds:

* worker: ``split.contribution`` + ``Delta(...).encode()`` per minibatch, cycling the minibatches;
* applier: ``Delta.decode`` + the finiteness check the applier makes + ``split.apply``
  (ρ scale 1), cycling the deltas onto its own evolving state: the applier's step
  alone, without Kafka, dedup, metrics, publication of λ or checkpoints
  (``bench/scaleout.py`` measures those end to end for the GMM).

Reported (median of the rounds): records per delta |S|, the mean delta size,
the worker's µs per record, the applier's deltas/s and records/s (deltas/s × |S|)
and N* = worker cost / applier cost per record: how many busy workers one
applier keeps up with (the scale-out ceiling, before Kafka and publication costs).

Times are process CPU time by default (``--clock cpu``, BLAS limited to one
thread: the machine is shared and CPU time is the least disturbed by other
jobs); ``--clock wall`` uses wall-clock time.

Minibatches are disjoint slices of a seeded permutation where the data set holds
``--batches`` + 1 of them, else random draws. Data (``streamsvi.datasets``, fetched
once into its cache; ``--tiny``: small synthetic data for every model, no download,
for the smoke test):

* gmm: Pima diabetes, standardised (768 × 8; a minibatch of |S| = 1000 is a draw with replacement);
* gauss1d: synthetic, three Gaussian components;
* hmm: DNA splice sequences (3,186 × 60 bases);
* poisson_mixture: synthetic (``sample_mixture``: K = 3, D = 5);
* lda: NYT bag of words (8,447 docs, V = 3,012), K = 100 topics;
* pmf, hpf: MovieLens 100K (ratings as PMF's ratings, as HPF's counts);
* logistic: Pima diabetes, standardised, label tested_positive;
* softmax: river's bundled image segments (2,310 × 18, 7 classes), standardised
  (as ``configs/softmax.toml``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_model, fmt_table, load_pima  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("gmm", "gauss1d", "hmm", "poisson_mixture", "lda", "pmf", "hpf", "logistic", "softmax")
SEED = 0


# ------------------------------------------------------------------ data per model
def _standardize(X):
    X = np.asarray(X, float)
    sd = X.std(0)
    return (X - X.mean(0)) / np.where(sd > 0, sd, 1.0)


def model_data(kind: str, tiny: bool):
    """(records, {model overrides}, {inference overrides}, data description, setting)."""
    from streamsvi import datasets

    rng = np.random.default_rng(SEED)
    if kind == "gmm":
        if tiny:
            X, _ = datasets.make_blobs(400, seed=11)
            return X, {"n_components": 3, "n_features": 2}, {"batch_size": 50, "effective_batch_size": 20}, \
                "synthetic blobs", "K=3 D=2"
        X, _ = load_pima()
        return _standardize(X), {}, {}, "Pima (real)", "K=10 D=8 M=250"
    if kind == "gauss1d":
        n = 300 if tiny else 30000
        z = rng.integers(0, 3, n)
        X = (np.array([-4.0, 0.5, 5.0])[z] + rng.normal(size=n))[:, None]
        return X, {}, ({"batch_size": 30} if tiny else {}), "synthetic", "K=3"
    if kind == "hmm":
        from streamsvi.models.hmm import sample_hmm
        if tiny:
            A = np.array([[0.8, 0.2], [0.3, 0.7]])
            B = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.7]])
            X, _ = sample_hmm([0.5, 0.5], A, B, rng.integers(3, 10, size=200), rng)
            return X, {"n_components": 2}, {"batch_size": 20, "effective_batch_size": 10}, "synthetic", "K=2 V=4"
        X, _ = datasets.load_dna_splice()
        return X, {}, {}, "DNA splice (real)", "K=10 V=4 M=25 (record = 60-base sequence)"
    if kind == "poisson_mixture":
        from streamsvi.models.poisson_mixture import sample_mixture
        X, _, _ = sample_mixture(300 if tiny else 30000, seed=4)
        return X, {}, ({"batch_size": 30} if tiny else {}), "synthetic", "K=3 D=5"
    if kind == "lda":
        if tiny:
            X, _, _ = datasets.make_lda_corpus(n_docs=200, n_topics=3, n_words=30, doc_length=40, seed=0)
            return X, {"n_components": 3, "n_features": 30, "max_doc_update_iter": 30}, {"batch_size": 20}, \
                "synthetic LDA corpus", "K=3 V=30"
        X, _ = datasets.load_nyt()
        return X, {"n_components": 100, "n_features": X.shape[1]}, {}, "NYT (real)", f"K=100 V={X.shape[1]}"
    if kind in ("pmf", "hpf"):
        from streamsvi.models.hpf import sample_counts
        from streamsvi.models.pmf import PMF
        if tiny:
            X = PMF.synthetic_ratings() if kind == "pmf" else sample_counts()
            return X, {"n_factors": 2}, {"batch_size": 40}, \
                "synthetic", "rank 2"
        X = datasets.load_movielens100k()
        return X, {}, {}, "MovieLens 100K (real)", "d=5, biases" if kind == "pmf" else "K=20"
    if kind == "logistic":
        if tiny:
            Z = rng.normal(size=(300, 3))
            y = (Z @ [1.0, -1.0, 0.5] + rng.normal(size=300) > 0).astype(float)
            return np.column_stack([Z, y]), {"n_features": 3}, {"batch_size": 30}, "synthetic", "D=3"
        X, y = load_pima()
        return np.column_stack([_standardize(X), y]), {}, {}, "Pima (real)", "D=8 legrad, diag, natural"
    if kind == "softmax":
        if tiny:
            Z = rng.normal(size=(300, 3))
            y = np.argmax(Z @ rng.normal(size=(3, 3)), axis=1).astype(float)
            return np.column_stack([Z, y]), {"n_features": 3, "n_classes": 3}, {"batch_size": 30}, \
                "synthetic", "D=3 C=3"
        from river import datasets as rd
        rows = list(rd.ImageSegments())
        names = sorted(rows[0][0])
        classes = sorted({c for _, c in rows})
        Z = np.array([[x[k] for k in names] for x, _ in rows], float)
        y = np.array([classes.index(c) for _, c in rows], float)
        D, C = Z.shape[1], len(classes)
        return np.column_stack([_standardize(Z), y]), {"n_features": D, "n_classes": C}, {}, \
            "river ImageSegments (real)", f"D={D} C={C} legrad, diag, natural"
    raise ValueError(f"unknown model kind {kind!r}; known: {', '.join(MODELS)}")


def build(kind: str, tiny: bool, n_batches: int):
    """The applier's engine and trained state, the worker's engine and state, the minibatches."""
    from streamsvi.inference import split
    from streamsvi.inference.state import state_from_arrays, state_to_arrays
    from streamsvi.service.config import build_engine, validate

    X, mo, io, data, setting = model_data(kind, tiny)
    raw = tomllib.loads((ROOT / "configs" / f"{kind}.toml").read_text())
    raw = {"model": {**raw["model"], **mo}, "inference": {**raw["inference"], **io},
           "source": raw["source"], "checkpoint": {"directory": "unused"}}
    n = X.shape[0]
    raw["inference"]["n_total"] = n
    cfg = validate(raw)
    S = int(cfg["inference"]["batch_size"])
    engine = build_engine(cfg, float(n))
    rng = np.random.default_rng(SEED + 1)
    perm = rng.permutation(n)
    if n >= (n_batches + 1) * S:                   # disjoint minibatches
        idx = [np.sort(perm[S * i:S * (i + 1)]) for i in range(n_batches + 1)]
    else:                                          # each a draw (with replacement if |S| > n)
        idx = [np.sort(rng.choice(n, S, replace=S > n)) for _ in range(n_batches + 1)]
    x_init, batches = X[idx[0]], [X[i] for i in idx[1:]]
    state = engine.init(x_init, seed=SEED)
    for i, x in enumerate(batches):                # the applier's warm-up: one worker, no staleness
        c = split.contribution(engine, state, x, split.batch_rng_state(SEED, "warm", 0, i * S))
        state, _ = split.apply(engine, state, c)
    wengine, wstate = state_from_arrays(state_to_arrays(engine, state))   # the worker's copy of λ
    return {"kind": kind, "setting": setting, "data": data, "S": S, "engine": engine, "state": state,
            "wengine": wengine, "wstate": wstate, "batches": batches, "next_w": 0, "next_a": 0}


def worker_delta(m, i) -> bytes:
    """Batch ``i``'s contribution at the worker's λ, encoded as the worker sends it."""
    from streamsvi.inference import split
    from streamsvi.service.roles.transport import Delta

    eng, st, S = m["wengine"], m["wstate"], m["S"]
    c = split.contribution(eng, st, m["batches"][i], split.batch_rng_state(SEED, "data", 0, i * S))
    return Delta(worker="w0", version=st.step, ranges=[("data", 0, i * S, (i + 1) * S)], records=c.records,
                 stats=c.arrays, min_weight=c.min_weight, n_total=float(eng.n_total), extra=c.meta).encode()


def apply_delta(m, raw) -> None:
    """The applier's step: decode, check, apply; the state moves on."""
    from streamsvi.inference import split
    from streamsvi.service.roles.transport import Delta

    d = Delta.decode(raw)
    c = split.Contribution(arrays=d.stats, records=d.records, min_weight=d.min_weight, meta=d.extra)
    if not all(np.isfinite(a).all() for a in c.arrays.values()):
        raise FloatingPointError("non-finite delta")
    m["state"], _ = split.apply(m["engine"], m["state"], c, 1.0)


def timed(fn, min_time, clock):
    """Seconds per call of ``fn(k)`` (k = 0, 1, ...), called until ``min_time`` has passed."""
    k, t0 = 0, clock()
    while True:
        fn(k)
        k += 1
        el = clock() - t0
        if el >= min_time:
            return el / k


def time_worker(m, min_time, clock):
    nb = len(m["batches"])

    def one(_):
        worker_delta(m, m["next_w"] % nb)
        m["next_w"] += 1
    return timed(one, min_time, clock)


def time_applier(m, min_time, clock):
    raws = m["raws"]

    def one(_):
        apply_delta(m, raws[m["next_a"] % len(raws)])
        m["next_a"] += 1
    return timed(one, min_time, clock)


def run(models=MODELS, rounds=2, min_time=1.0, n_batches=20, clock="cpu", tiny=False, out=print):
    """Build, time and print; returns the table's rows as dicts (the smoke test reads them)."""
    clk = time.process_time if clock == "cpu" else time.perf_counter
    built = {}
    for kind in models:
        t0 = time.perf_counter()
        m = build(kind, tiny, n_batches)
        m["raws"] = [worker_delta(m, i) for i in range(len(m["batches"]))]
        m["w"], m["a"] = [], []
        built[kind] = m
        out(f"  built {kind:<16} {m['data']:<28} |S| = {m['S']:<5} ({time.perf_counter() - t0:.1f} s)")
    for r in range(rounds):
        order = list(models) if r % 2 == 0 else list(models)[::-1]
        for kind in order:
            m = built[kind]
            if r % 2 == 0:
                m["w"].append(time_worker(m, min_time, clk))
                m["a"].append(time_applier(m, min_time, clk))
            else:
                m["a"].append(time_applier(m, min_time, clk))
                m["w"].append(time_worker(m, min_time, clk))
        out(f"  round {r + 1} done")
    rows = []
    for kind in models:
        m = built[kind]
        S = m["S"]
        w, a = statistics.median(m["w"]), statistics.median(m["a"])   # seconds per batch / per delta
        rows.append({"model": kind, "setting": m["setting"], "data": m["data"], "S": S,
                     "bytes": float(np.mean([len(b) for b in m["raws"]])),
                     "worker_us_per_record": 1e6 * w / S, "applier_deltas_s": 1.0 / a,
                     "applier_records_s": S / a, "n_star": w / a})
    return rows


def table(rows) -> str:
    def size(b):
        return f"{b / 2**20:.2f} MiB" if b >= 2**20 else f"{b / 2**10:.1f} KiB"
    return fmt_table(
        ["model", "setting", "data", "|S|", "delta", "worker µs/rec", "applier deltas/s",
         "applier rec/s", "N* (worker/applier)"],
        [[r["model"], r["setting"], r["data"], str(r["S"]), size(r["bytes"]), f"{r['worker_us_per_record']:.1f}",
          f"{r['applier_deltas_s']:.0f}", f"{r['applier_records_s']:.0f}", f"{r['n_star']:.1f}"] for r in rows],
        left=3)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per timing (each side, each round)")
    ap.add_argument("--batches", type=int, default=20, help="different minibatches (and deltas) per model")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    ap.add_argument("--tiny", action="store_true", help="small synthetic data for every model (smoke test)")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    from threadpoolctl import threadpool_limits

    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores (shared with other jobs); clock: {args.clock}"
          f"{' (process CPU time, BLAS on 1 thread)' if args.clock == 'cpu' else ''}; "
          f"{args.batches} minibatches per model, {args.rounds} rounds of >= {args.min_time:g} s per side")
    with threadpool_limits(1 if args.clock == "cpu" else None):
        rows = run(models, args.rounds, args.min_time, args.batches, args.clock, args.tiny)
    print("\napplier step alone (decode + check + split.apply) vs worker (split.contribution + encode); "
          "median of rounds:")
    print(table(rows))
    print("\nN* = worker µs per record / applier µs per record: how many busy workers one applier keeps "
          "up with (before Kafka, publication of λ and checkpoints).")
    return rows


if __name__ == "__main__":
    main()
