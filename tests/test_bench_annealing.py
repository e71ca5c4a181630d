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


# ------------------------------------------------ issue 29: the fair study's rows
def test_fair_methods_name_every_variant():
    from streamsvi.inference.annealing import Deterministic
    hmm = bench.fair_methods(100, "hmm", sweep=True)
    assert {"VI", "detAVI", "detAVI a/T", "detAVI inv", "detAVI+jitter(0.01)", "detAVI+jitter(0.1,crossing)",
            "stochAVI", "SVI+"} <= set(hmm)
    assert hmm["detAVI a/T"][0] == Deterministic(dirichlet="concentration")
    assert hmm["detAVI inv"][0] == Deterministic(T0=10.0, schedule="inverse")
    sweep = [k for k in hmm if k.startswith("detAVI T0=")]
    assert len(sweep) == 8                                   # 3 × 3 grid less the default (T0=5, r=0.9)
    lda = bench.fair_methods(100, "lda")
    assert "stochAVI+doc restart" in lda and lda["stochAVI+doc restart"][0].local_restart
    assert "detAVI a/T" in lda and not any("jitter" in k for k in lda)   # the jitter: refused by LDA's storage
    assert {"stochAVI d=0.8", "stochAVI d=0.95"} <= set(bench.fair_methods(100, "gmm", sweep=True))


def test_fair_unit_default_start_and_best_of_n_at_equal_sweeps():
    X, _ = make_blobs(300, seed=2)
    model = BayesianGMM(4, 2)
    N = len(X)
    lam0 = model.random_init(np.random.default_rng(0), X, N)
    res = bench.fair_unit(model, X, N, lam0, 0, 0, "gmm", 1e-6, 400)
    eng = SVI(model, N, schedule=bench.Constant(1.0))
    st = eng.init(X, seed=0)                                   # the product's start (k-means)
    assert not st.lam.array_equal(lam0)
    assert res["VI (default start)"]["elbo"] != res["VI"]["elbo"]
    for a in bench.FAIR_ANNEALERS:
        row = res[f"best-of-n VI @{a}"]
        assert row["n"] >= 1
        assert row["n"] == 1 or row["iters"] <= res[a]["iters"]    # never more sweeps than the annealer
        assert row["elbo"] >= res["VI"]["elbo"]                   # restart 0 is the VI row itself
    assert res["SVI+"]["clipped_steps"] >= 0 and res["VI"]["domain_clipped"] == 0


def test_clip_fractions_and_distinct_states():
    assert bench.clip_fractions({}) == {"domain_clipped": 0.0, "clipped_steps": 0.0}
    f = bench.clip_fractions({"clipped": 3, "steps_clipped": 2, "blocks": 5, "steps": 10})
    assert f == {"domain_clipped": pytest.approx(3 / 50), "clipped_steps": pytest.approx(0.2)}
    emit = np.array([[1.0, 3.0], [1.0, 3.0 + 1e-6], [3.0, 1.0]])
    assert bench.distinct_states({"emit": emit}) == 2

    class Prior:                                            # η_emit = 0.5 everywhere
        @staticmethod
        def prior():
            return {"emit": np.full((3, 2), 0.5)}
    lam = {"emit": np.array([[10.5, 30.5], [10.5, 30.5], [0.5, 0.5]])}   # two merged states, one empty
    assert bench.distinct_states(lam, model=Prior) == 1                 # the empty one is left out
    assert bench.used_states(Prior, lam) == pytest.approx(2.0)          # two equal shares
