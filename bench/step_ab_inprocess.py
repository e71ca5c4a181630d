"""Old and new step in one process, interleaved: a paired speed comparison robust to a busy machine.

The code before the change is imported as a second package (a copy of its ``streamsvi``
directory renamed ``streamsvi_old``; every import inside the package is relative), and each
round times the old and then the new code on the same workload, in process CPU time.
Workloads as bench/step_speed.py: streaming PMF on MovieLens 100K (SVI and SVI+ M = 500,
|S| = 1000, configs/pmf.toml's settings) and a GMM on the dense path.

Run::

    cp -r /path/to/old/checkout/streamsvi /tmp/abpkg/streamsvi_old
    python bench/step_ab_inprocess.py /tmp/abpkg 15
"""
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, sys.argv[1])
import streamsvi_old as old  # noqa: E402
import streamsvi_old.inference  # noqa: E402,F401
import streamsvi_old.models  # noqa: E402,F401

import streamsvi as new  # noqa: E402
import streamsvi.inference  # noqa: E402,F401
from streamsvi.datasets import load_movielens100k  # noqa: E402

ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 15
SETTINGS = dict(n_factors=5, sigma2=0.8, prior_var=0.3, bias_var=0.3, biases=True, offset="auto",
                init_scale=0.1, row_counts="seen", row_clock="ratings", sweep="items_first")
x = load_movielens100k()
p = np.random.default_rng(0).permutation(len(x))
idx = [p[s:s + 1000] for s in range(0, 80000, 1000)]
rng = np.random.default_rng(1)
X = np.concatenate([rng.normal(c, 1.0, (20000, 2)) for c in (-6, -3, 0, 3, 6)])[rng.permutation(100000)]


def pmf(pkg, M):
    R = pkg.models.Ratings
    batches = [R(x.user[i], x.item[i], x.rating[i]) for i in idx]
    eng = pkg.inference.SVI(pkg.models.PMF(**SETTINGS), n_total=80000,
                            schedule=pkg.inference.RobbinsMonro(tau0=0.0, kappa=1.0), short_batches="svi",
                            effective_batch_size=M)
    t0 = time.process_time()
    st = eng.init(batches[0], seed=0)
    for b in batches:
        st, _ = eng.update(st, b)
    return time.process_time() - t0, st


def gmm(pkg):
    eng = pkg.inference.SVI(pkg.models.BayesianGMM(5, 2), n_total=len(X), effective_batch_size=50)
    t0 = time.process_time()
    st = eng.init(X[:500], seed=0)
    for s in range(0, len(X), 100):
        st, _ = eng.update(st, X[s:s + 100])
    return time.process_time() - t0, st


CASES = {"pmf (SVI)": lambda pkg: pmf(pkg, None), "pmf (SVI+, M=500)": lambda pkg: pmf(pkg, 500),
         "gmm (SVI+, dense)": gmm}
res = {c: {"old": [], "new": []} for c in CASES}
for r in range(ROUNDS):
    for c, f in CASES.items():
        a, sa = f(old)
        b, sb = f(new)
        res[c]["old"].append(a)
        res[c]["new"].append(b)
        if r == 0:
            same = all(np.array_equal(np.asarray(sa.lam[k]), np.asarray(sb.lam[k])) for k in sa.lam)
            res[c]["same"] = same
    print(f"round {r + 1}: " + ", ".join(f"{c} {res[c]['new'][-1] / res[c]['old'][-1]:.3f}" for c in CASES),
          file=sys.stderr, flush=True)
print("| case | before (s CPU, median) | after | after/before (time) | paired (median of rounds) | λ bit for bit |")
print("|---|---:|---:|---:|---:|---|")
for c in CASES:
    o, n = statistics.median(res[c]["old"]), statistics.median(res[c]["new"])
    paired = statistics.median(b / a for a, b in zip(res[c]["old"], res[c]["new"]))
    print(f"| {c} | {o:.3f} | {n:.3f} | {n / o:.3f} | {paired:.3f} | {'yes' if res[c]['same'] else 'NO'} |")
print(f"\n{ROUNDS} rounds in one process, old then new per case and round; process CPU time "
      f"(records/s = 80,000 or 100,000 / time).")
