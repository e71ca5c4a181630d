"""bench/annealing.py's machinery on a small real-shaped problem (no data download, < 20 s).

The benchmark's tables rest on three pieces: the paired summary (wins/ties/losses,
sign test), the noise-free damped control's schedule, and the stated convergence rule.
"""
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest

from streamsvi import SVI
from streamsvi.datasets import make_blobs
from streamsvi.inference.annealing import Stochastic
from streamsvi.models import BayesianGMM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import annealing as bench  # noqa: E402  (bench/annealing.py)


def test_paired_counts_wins_ties_losses_and_sign_test():
    a = [1.0, 2.0, 3.0, 0.0, 5.0, 7.0]
    b = [0.0, 2.0, 1.0, 1.0, 5.0 + 1e-9, 6.0]
    r = bench.paired(a, b, lambda base: 1e-6)
    assert (r["wins"], r["ties"], r["losses"]) == (3, 2, 1)
    d = np.subtract(a, b)
    assert r["mean_diff"] == pytest.approx(d.mean())
    assert r["se"] == pytest.approx(d.std(ddof=1) / np.sqrt(len(d)))
    assert r["sign_p"] == pytest.approx(binomtest(3, 4, 0.5).pvalue)   # ties dropped


def test_damped_control_takes_the_stochastic_annealers_mixing_weights():
    for ann in (Stochastic(), Stochastic(rho0=0.25, schedule="linear", n_steps=50)):
        sched = bench.OneMinus(ann)
        for t in (1, 2, 10, ann.n_steps, ann.n_steps + 1, 500):
            assert sched(t) == pytest.approx(1.0 - ann.level(t))
        assert sched(ann.n_steps + 1) == 1.0            # plain CAVI once the annealer is off


def test_every_method_runs_past_its_annealing_phase_to_the_stated_convergence():
    X, _ = make_blobs(300, seed=0)
    model = BayesianGMM(4, 2)
    N = len(X)
    lam0 = model.random_init(np.random.default_rng(0), X, N)
    tol, max_iter = 1e-6, 400
    finals = {}
    for name, (ann, sched, burn) in bench.batch_methods(N, Stochastic()).items():
        eng = SVI(model, N, schedule=sched, annealer=ann)
        st, trace, iters = bench.run_to_convergence(eng, eng.state_from_params(lam0, seed=0), X, burn,
                                                    tol, max_iter)
        assert burn < iters < max_iter, name
        (_, prev), (_, last) = trace[-2], trace[-1]
        assert abs(last - prev) <= tol * abs(last), name
        finals[name] = eng.elbo(st.lam, X)
        assert np.isfinite(finals[name])
    # same start, same method, same seed: the same result (paired comparisons are meaningful)
    ann, sched, burn = bench.batch_methods(N, Stochastic())["stochAVI"]
    eng = SVI(model, N, schedule=sched, annealer=ann)
    st, _, _ = bench.run_to_convergence(eng, eng.state_from_params(lam0, seed=0), X, burn, tol, max_iter)
    assert eng.elbo(st.lam, X) == finals["stochAVI"]


def test_polish_does_not_lower_the_objective():
    X, _ = make_blobs(300, seed=1)
    model = BayesianGMM(4, 2)
    N = len(X)
    lam0 = model.random_init(np.random.default_rng(3), X, N)
    eng = SVI(model, N, schedule=bench.Constant(0.5))
    st, _, _ = bench.run_to_convergence(eng, eng.state_from_params(lam0), X, 0, 1e-3, 400)
    before = eng.elbo(st.lam, X)
    pol, pst, iters = bench.polish(model, N, st.lam, X, lambda s: eng.elbo(s.lam, X))
    assert pol >= before - 1e-9 * abs(before)
    assert iters >= 1
