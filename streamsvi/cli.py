"""Command line: ``streamsvi demo`` (and, later, ``run``, ``score``, ``inspect``).

``streamsvi demo`` is the embedded default: batch VI vs SVI vs SVI+ for the
Bayesian GMM on the Pima Indians diabetes data (seed 000 §IV-D), from several
random initialisations, printing a table of final ELBO and held-out predictive
log-likelihood. It needs nothing but Python (the data set is fetched once
from the weka Debian package, see :mod:`streamsvi.datasets`).
"""
from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from . import __version__
from .datasets import load_pima, standardize
from .inference import SVI, RobbinsMonro, batch_vi
from .models import BayesianGMM


def _progress(msg):
    print(msg, file=sys.stderr, flush=True)


def demo(args) -> int:
    X, _ = load_pima(args.data)
    X = standardize(X)
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(X))
    n_test = len(X) // 10
    Xte, Xtr = X[perm[:n_test]], X[perm[n_test:]]
    N = len(Xtr)
    model = BayesianGMM.paper_prior(args.components, X.shape[1], alpha=0.5, c=10.0)
    S = args.batch_size
    steps = int(round(args.epochs * N / S))
    sched = RobbinsMonro(tau0=args.tau0, kappa=args.kappa)
    methods = [("batch VI (CAVI)", batch_vi(model, N), None, args.epochs)]
    methods.append((f"SVI |S|={S}", SVI(model, N, sched), S, steps))
    for M in args.m:
        methods.append((f"SVI+ |S|={S} M={M}", SVI(model, N, sched, effective_batch_size=M), S, steps))
    print(f"streamsvi {__version__} demo: Bayesian GMM (K={args.components}, seed-000 prior a=D, B=I, "
          f"c=10, alpha=0.5) on Pima Indians diabetes, {N} train / {n_test} held-out records, "
          f"{args.inits} random initialisations, {args.epochs} epochs each; "
          f"SVI schedule rho_t=({args.tau0:g}+t)^-{args.kappa:g}")
    rows = []
    for name, engine, batch, n_steps in methods:
        finals, heldout, secs = [], [], 0.0
        for i in range(args.inits):
            state = engine.init(Xtr, seed=args.seed + 1000 * i + 1)
            t0 = time.perf_counter()
            state, _ = engine.fit(state, Xtr, n_steps=n_steps, batch_size=batch)
            secs += time.perf_counter() - t0
            finals.append(engine.elbo(state.lam, Xtr) / N)
            heldout.append(float(np.mean(model.predictive_logpdf(state.lam, Xte))))
            _progress(f"  {name:<24} init {i + 1}/{args.inits}: ELBO/record {finals[-1]:9.4f}  "
                      f"held-out log p/record {heldout[-1]:8.4f}")
        rows.append((name, np.mean(finals), np.std(finals), np.max(finals), np.mean(heldout),
                     args.inits * n_steps * (batch or N) / secs))
    print()
    head = f"{'method':<24} {'ELBO/rec mean':>13} {'± sd':>7} {'best':>9} {'held-out lp/rec':>16} {'records/s':>11}"
    print(head)
    print("-" * len(head))
    for name, mean, sd, best, ho, rate in rows:
        print(f"{name:<24} {mean:13.4f} {sd:7.4f} {best:9.4f} {ho:16.4f} {rate:11.0f}")
    print("\nELBO/rec: full-data ELBO of the final q divided by N (higher is better); "
          "held-out lp/rec: mean log posterior-predictive density of held-out records.")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="streamsvi", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"streamsvi {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="batch VI vs SVI vs SVI+ on the Pima data (embedded default)")
    d.add_argument("--data", help="path to diabetes.arff or pima-indians-diabetes.csv "
                                  "(default: fetched into the cache)")
    d.add_argument("--components", type=int, default=5, help="K (default 5)")
    d.add_argument("--inits", type=int, default=5, help="random initialisations per method (default 5)")
    d.add_argument("--epochs", type=int, default=40, help="passes over the data (default 40)")
    d.add_argument("--batch-size", type=int, default=200, help="|S| for SVI and SVI+ (default 200)")
    d.add_argument("--m", type=int, nargs="+", default=[50, 100], help="SVI+ effective batch sizes M")
    d.add_argument("--tau0", type=float, default=1.0, help="Robbins-Monro delay tau0 (default 1)")
    d.add_argument("--kappa", type=float, default=0.6, help="Robbins-Monro rate kappa (default 0.6)")
    d.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        if args.command == "demo":
            for m in args.m:
                if not 0 < m <= args.batch_size:
                    p.error(f"--m values must be in (0, --batch-size={args.batch_size}], got {m}")
            return demo(args)
    except (FileNotFoundError, ValueError) as exc:
        print(f"streamsvi: error: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
