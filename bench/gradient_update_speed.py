"""µs per ``GradientVI.update`` of Bayesian logistic regression, the default engine.

The default estimator (LeGrad, mean-field q, the sampled f, natural-gradient steps; the
river face ``streamsvi.estimators.LogisticRegression`` learns with it) at |S| = 16, 100
and 1000 records per update, on a Phishing-sized problem (D = 9 features, P = 10 weights)
and an MNIST-sized one (D = 784, P = 785). The records are synthetic (standard normal
features, labels from a random linear rule): the cost of an update depends on the sizes
only. Each figure is the median over ``--rounds`` rounds of the mean µs per update over a
chain of updates (each from the last state, as a stream learns) of ~``--seconds`` seconds.

With ``--against PATH`` (another checkout, e.g. ``git archive HEAD``) each round runs both
versions, each in its own process, alternating which goes first, and prints the ratio
PATH / this one (> 1: this one is faster) and whether both, after the same 10 updates from
the same seed and records, hold the same λ, random state, ELBO, gradient variance and
gradient norm to the bit (they should).

    nice -n 10 .venv/bin/python bench/gradient_update_speed.py
    nice -n 10 .venv/bin/python bench/gradient_update_speed.py --against /tmp/head --rounds 5

``OPENBLAS_NUM_THREADS=1`` (set below before numpy is imported): the matrices are small.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"phishing": 9, "mnist": 784}
BATCHES = (16, 100, 1000)


def _worker(D: int, S: int, seconds: float) -> dict:
    """Time a chain of updates in this process (the streamsvi on sys.path)."""
    import time

    import numpy as np

    from streamsvi.inference.gradients import GradientVI
    from streamsvi.models.logistic import BayesianLogisticRegression

    rng = np.random.default_rng(0)
    n_blocks = 8
    X = rng.standard_normal((S * n_blocks, D))
    y = (X @ rng.standard_normal(D) + 0.5 * rng.standard_normal(S * n_blocks) > 0).astype(float)
    rows = np.column_stack([X, y])
    blocks = [rows[i * S:(i + 1) * S] for i in range(n_blocks)]
    engine = GradientVI(BayesianLogisticRegression(n_features=D), n_total=60_000.0)
    state = engine.init(blocks[0], seed=1)
    for i in range(10):                                      # warm up; the state the digest is of
        state, info = engine.update(state, blocks[i % n_blocks])
    digest = hashlib.sha256(np.asarray(state.lam._flat).tobytes() + json.dumps(
        [state.rng_state, info.elbo, info.grad_variance, info.grad_norm], sort_keys=True).encode()).hexdigest()[:16]
    t0 = time.perf_counter()
    state, _ = engine.update(state, blocks[2])
    one = time.perf_counter() - t0
    n = max(8, int(seconds / max(one, 1e-7)))
    t0 = time.perf_counter()
    for i in range(n):
        state, info = engine.update(state, blocks[i % n_blocks])
    dt = time.perf_counter() - t0
    return {"us": dt / n * 1e6, "n": n, "digest": digest}


def _run(path: str | None, D: int, S: int, seconds: float) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(path or ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--worker", f"{D},{S},{seconds}"], env=env,
                         capture_output=True, text=True, cwd="/", check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", help="another checkout to compare with (its root folder)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.4, help="time per chain of updates")
    ap.add_argument("--sizes", default="phishing,mnist", help="comma list of phishing, mnist")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma list of |S|")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        D, S, sec = a.worker.split(",")
        print(json.dumps(_worker(int(D), int(S), float(sec))))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import cpu_model, fmt_table

    print(f"# streamsvi at {ROOT}" + (f" against {a.against}" if a.against else "") + f"; {cpu_model()}")
    rows = []
    for size in a.sizes.split(","):
        D = SIZES[size]
        for S in (int(v) for v in a.batches.split(",")):
            mine, theirs, digests = [], [], set()
            for r in range(a.rounds):
                order = [None] if not a.against else ([None, a.against] if r % 2 == 0 else [a.against, None])
                for path in order:
                    res = _run(path, D, S, a.seconds)
                    (mine if path is None else theirs).append(res["us"])
                    digests.add(res["digest"])
            row = [size, D + 1, S, f"{statistics.median(mine):.1f}"]
            if a.against:
                t = statistics.median(theirs)
                same = len(digests) == 1
                row += [f"{t:.1f}", f"{t / statistics.median(mine):.2f}", "yes" if same else "NO"]
            rows.append(row)
    head = ["problem", "P", "|S|", "µs/update"]
    if a.against:
        head += ["µs/update (against)", "against / this", "same λ, rng"]
    print(fmt_table(head, rows))


if __name__ == "__main__":
    main()
