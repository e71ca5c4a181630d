"""Speed of the engine's step before and after the block API (issue 24), alternated in one run.

Each round runs one fresh interpreter per code version, in turn (old, new, old, new, ...):
``--old-python`` (a checkout of the code before the change, with its own venv) and
``--new-python`` (this checkout). Each interpreter times only the learning pass of:

* ``pmf``: streaming PMF on MovieLens 100K (the first 80 % of a fixed shuffle, seed 0,
  |S| = 1000, ρ_i = (0 + t_i)^(−1), configs/pmf.toml's settings as in
  bench/pmf_movielens.py ``DEFAULTS``), plain SVI;
* ``pmf+``: the same with SVI+ (M = 500);
* ``gmm``: the dense path, BayesianGMM(K = 5, D = 2) on 100 000 synthetic records,
  |S| = 100, SVI+ (M = 50).

``--reps`` times per process and prints records per second of the fastest run, in process CPU
time by default (``--clock cpu``: the machine is shared, and CPU time and the fastest run are the
least disturbed by other processes; BLAS runs on one thread) and a hash of the final λ (equal hashes: the
same result bit for bit). Reported: the median over the rounds per version and their ratio.

Run::

    python bench/step_speed.py --old-python /work/wt-base/.venv/bin/python \\
        --new-python .venv/bin/python --rounds 7
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import hashlib, json, sys, time
import numpy as np
from streamsvi.datasets import load_movielens100k
from streamsvi.inference import SVI, RobbinsMonro
from streamsvi.models import PMF, BayesianGMM

def lam_hash(lam):
    h = hashlib.sha256()
    for k in sorted(lam):
        h.update(k.encode()); h.update(np.ascontiguousarray(np.asarray(lam[k], dtype=np.float64)).tobytes())
    return h.hexdigest()[:16]

out = {}
x = load_movielens100k()
p = np.random.default_rng(0).permutation(len(x))
train = x[p[:80000]]
settings = dict(n_factors=5, sigma2=0.8, prior_var=0.3, bias_var=0.3, biases=True, offset="auto",
                init_scale=0.1, row_counts="seen", row_clock="ratings", sweep="items_first")
batches = [train[np.arange(s, min(s + 1000, len(train)))] for s in range(0, len(train), 1000)]
REPS = int(sys.argv[1])
CLOCK = time.process_time if sys.argv[2] == "cpu" else time.perf_counter
for name, M in (("pmf", None), ("pmf+", 500)):
    best = float("inf")
    for _ in range(REPS):
        engine = SVI(PMF(**settings), n_total=len(train), schedule=RobbinsMonro(tau0=0.0, kappa=1.0),
                     short_batches="svi", effective_batch_size=M)
        t0 = CLOCK()
        state = engine.init(batches[0], seed=0)
        for b in batches:
            state, _ = engine.update(state, b)
        best = min(best, CLOCK() - t0)
    out[name] = (len(train) / best, lam_hash(state.lam))
rng = np.random.default_rng(1)
X = np.concatenate([rng.normal(c, 1.0, (20000, 2)) for c in (-6, -3, 0, 3, 6)])[rng.permutation(100000)]
best = float("inf")
for _ in range(REPS):
    engine = SVI(BayesianGMM(5, 2), n_total=len(X), effective_batch_size=50)
    t0 = CLOCK()
    state = engine.init(X[:500], seed=0)
    for s in range(0, len(X), 100):
        state, _ = engine.update(state, X[s:s + 100])
    best = min(best, CLOCK() - t0)
out["gmm"] = (len(X) / best, lam_hash(state.lam))
print(json.dumps(out))
'''


def run(python, reps, clock):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    # run outside any checkout, so that each interpreter imports its own (editable) install
    r = subprocess.run([python, "-c", CHILD, str(reps), clock], capture_output=True, text=True, env=env, check=True,
                       cwd=tempfile.gettempdir())
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old-python", required=True)
    ap.add_argument("--new-python", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=3, help="runs of each case per process (the fastest counts)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="process CPU time (default: robust on a shared machine) or wall time")
    a = ap.parse_args(argv)
    res = {"old": [], "new": []}
    for k in range(a.rounds):
        for which, py in (("old", a.old_python), ("new", a.new_python)):
            r = run(py, a.reps, a.clock)
            res[which].append(r)
            print(f"round {k + 1} {which}: " + ", ".join(f"{n} {v[0]:,.0f}/s" for n, v in r.items()),
                  file=sys.stderr, flush=True)
    print("| case | before (records/s, median) | after | after/before | paired ratio (median of rounds) "
          "| λ bit for bit |")
    print("|---|---:|---:|---:|---:|---|")
    for case in res["old"][0]:
        o = statistics.median(r[case][0] for r in res["old"])
        n = statistics.median(r[case][0] for r in res["new"])
        paired = statistics.median(rn[case][0] / ro[case][0] for ro, rn in zip(res["old"], res["new"]))
        same = all(r[case][1] == res["old"][0][case][1] for r in res["old"] + res["new"])
        print(f"| {case} | {o:,.0f} | {n:,.0f} | {n / o:.3f} | {paired:.3f} | {'yes' if same else 'NO'} |")
    print(f"\n{a.rounds} rounds, alternated old/new, fastest of {a.reps} runs per process, {a.clock} time; medians. Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs visible, BLAS threads 1.")


if __name__ == "__main__":
    main()
