"""Writes the pre-change snapshots of tests/test_snapshot_compat.py (run once with the old code's venv).

    /work/wt-base/.venv/bin/python tests/data/make_prechange_snapshots.py

For a GMM (SVI+) and a PMF (SVI+, biases): the state after a few updates
(``*_state.npz``, the ordinary snapshot format) and the λ one more update
gives (``*_next.npz``: ``lam/<name>`` arrays), both written by the code of
that time. The test loads the state with today's code, makes the same update
and compares.
"""
import json
import os
import sys

import numpy as np

from streamsvi.inference import SVI, RobbinsMonro
from streamsvi.inference.state import save_state
from streamsvi.models import PMF, BayesianGMM, Ratings

HERE = os.path.dirname(os.path.abspath(__file__))


def gmm_data():
    rng = np.random.default_rng(5)
    return np.concatenate([rng.normal(-3, 1, (150, 2)), rng.normal(3, 1, (150, 2))])


def pmf_data():
    rng = np.random.default_rng(6)
    U, V = rng.normal(size=(40, 3)), rng.normal(size=(30, 3))
    i, j = rng.integers(0, 40, 600), rng.integers(0, 30, 600)
    return Ratings(i, j, 3.0 + (U[i] * V[j]).sum(1) + 0.3 * rng.normal(size=600))


def main():
    X = gmm_data()
    eng = SVI(BayesianGMM(3, 2), n_total=len(X), effective_batch_size=20)
    st = eng.init(X[:60], seed=2)
    for k in range(4):
        st, _ = eng.update(st, X[60 * k:60 * k + 60])
    save_state(os.path.join(HERE, "prechange_gmm_state.npz"), eng, st)
    nxt, _ = eng.update(st, X[240:300])
    np.savez(os.path.join(HERE, "prechange_gmm_next.npz"), **{f"lam/{k}": v for k, v in nxt.lam.items()})

    x = pmf_data()
    model = PMF(n_factors=3, sigma2=0.5, biases=True, offset="auto")
    eng = SVI(model, n_total=len(x), schedule=RobbinsMonro(tau0=1, kappa=0.7), effective_batch_size=60)
    st = eng.init(x[np.arange(100)], seed=3)
    for k in range(4):
        st, _ = eng.update(st, x[np.arange(100 * k, 100 * k + 100)])
    save_state(os.path.join(HERE, "prechange_pmf_state.npz"), eng, st)
    nxt, _ = eng.update(st, x[np.arange(400, 600)])
    arrs = {f"lam/{k}": np.asarray(v) for k, v in nxt.lam.items()}
    arrs.update({f"aux/{k}": np.asarray(nxt.aux[k]) for k in nxt.aux if isinstance(nxt.aux[k], np.ndarray)})
    np.savez(os.path.join(HERE, "prechange_pmf_next.npz"), **arrs)
    print("written", file=sys.stderr)


if __name__ == "__main__":
    main()
