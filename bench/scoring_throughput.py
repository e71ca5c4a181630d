"""Scoring throughput from a loaded snapshot (records/s).

Fits a Bayesian GMM (D = 8, K = 10) with SVI on synthetic mixture data,
writes a snapshot with the real checkpoint store, loads it back with
``streamsvi.load`` (checksums verified) and times, on 1,000-record chunks:
responsibilities, MAP assignment, posterior predictive log density, and the
full ``score`` (all three as JSON-ready dicts); plus the load time itself and
the ``streamsvi score`` CLI end to end on a JSONL file.

Run: ``python bench/scoring_throughput.py [--quick]``. BLAS is pinned to one
thread (small matrices on 2 cores are faster that way).
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import streamsvi  # noqa: E402
from streamsvi.checkpoint import CheckpointStore  # noqa: E402
from streamsvi.inference import SVI, RobbinsMonro  # noqa: E402
from streamsvi.models import BayesianGMM  # noqa: E402


def rate(fn, n, min_time):
    best = 0.0
    for _ in range(3):
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_time:
            fn()
            k += 1
        best = max(best, k * n / (time.perf_counter() - t0))
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    min_time = 0.3 if args.quick else 1.0
    rng = np.random.default_rng(0)
    D, K = 8, 10
    centers = rng.normal(0, 4, (K, D))
    X = centers[rng.integers(0, K, 50_000)] + rng.normal(size=(50_000, D))
    engine = SVI(BayesianGMM(K, D), n_total=len(X), schedule=RobbinsMonro(1.0, 0.7))
    print("fitting ...", file=sys.stderr, flush=True)
    state, _ = engine.fit(engine.init(X[:1000], seed=0), X, n_steps=100, batch_size=1000)
    with tempfile.TemporaryDirectory() as d:
        CheckpointStore(d).save(engine, state, offsets=[])
        t0 = time.perf_counter()
        for _ in range(20):
            fitted = streamsvi.load(d)
        load_ms = (time.perf_counter() - t0) / 20 * 1e3
        chunk = X[:1000]
        rows = [
            ("responsibilities", lambda: fitted.responsibilities(chunk)),
            ("predict (MAP)", lambda: fitted.predict(chunk)),
            ("predictive_logpdf", lambda: fitted.predictive_logpdf(chunk)),
            ("score (all, as dicts)", lambda: fitted.score(chunk)),
        ]
        print(f"\nscoring from a loaded snapshot: D={D}, K={K}, chunks of 1000 records; "
              f"numpy {np.__version__}")
        print(f"load (checksums verified): {load_ms:.2f} ms per load\n")
        print(f"{'call':<26} {'records/s':>12}")
        print("-" * 39)
        for name, fn in rows:
            print(f"{name:<26} {rate(fn, len(chunk), min_time):12,.0f}")
        n_cli = 20_000 if args.quick else 100_000
        inp = Path(d) / "in.jsonl"
        inp.write_text("\n".join(json.dumps(r) for r in X[:n_cli].round(6).tolist()) + "\n")
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "streamsvi", "score", "--snapshot", d, "--input",
                        str(inp), "--output", str(Path(d) / "out.jsonl")], check=True,
                       stderr=subprocess.DEVNULL)
        dt = time.perf_counter() - t0
        print(f"{'streamsvi score (CLI)':<26} {n_cli / dt:12,.0f}   ({n_cli} JSONL lines in, JSONL out, "
              f"incl. start-up)")


if __name__ == "__main__":
    main()
