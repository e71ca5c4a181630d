"""Engine settings, error handling and the batch-SVI+ special case."""
import numpy as np
import pytest

from streamsvi.datasets import make_blobs
from streamsvi.inference import SVI, Constant, RobbinsMonro, load_state
from streamsvi.models import BayesianGMM


@pytest.fixture
def setup():
    X, _ = make_blobs(200, seed=1)
    return BayesianGMM(4, 2), X


@pytest.mark.parametrize("kw,msg", [
    (dict(n_total=0), "n_total must be a finite number > 0"),
    (dict(n_total=10, effective_batch_size=0), r"effective_batch_size \(M\) must be a finite number > 0"),
    (dict(n_total=10, effective_batch_size=-3), r"effective_batch_size \(M\)"),
    (dict(n_total=10, effective_fraction=1.5), r"effective_fraction must be in \(0, 1\]"),
    (dict(n_total=10, effective_fraction=0.5, effective_batch_size=3), "not both"),
    (dict(n_total=10, boundary_fraction=1.0), "boundary_fraction"),
    (dict(n_total=10, schedule=0.1), "schedule must be a Schedule"),
])
def test_bad_engine_settings(setup, kw, msg):
    model, _ = setup
    with pytest.raises(ValueError, match=msg):
        SVI(model, **kw)


def test_m_larger_than_batch_is_an_error(setup):
    model, X = setup
    engine = SVI(model, n_total=len(X), effective_batch_size=51)
    state = engine.init(X, seed=0)
    with pytest.raises(ValueError, match=r"M=51 must be <= the batch size \|S\|=50"):
        engine.update(state, X[:50])


def test_bad_batch_leaves_state_unchanged(setup):
    model, X = setup
    engine = SVI(model, n_total=len(X))
    state = engine.init(X, seed=0)
    before = state.lam.copy()
    bad = X[:10].copy()
    bad[3, 1] = np.inf
    with pytest.raises(ValueError, match=r"non-finite values in records \[3\]"):
        engine.update(state, bad)
    assert state.lam.array_equal(before) and state.step == 0


def test_effective_fraction_gives_the_noise_level(setup):
    model, X = setup
    engine = SVI(model, n_total=len(X), effective_fraction=0.25)
    _, info = engine.update(engine.init(X, seed=0), X[:40])
    assert info.effective_batch_size == 10
    assert info.noise_std == pytest.approx(np.sqrt(3.0))


def test_batch_svi_plus_is_stochastic_and_batch_vi_is_not(setup):
    model, X = setup
    results = {}
    for M in (None, 50):
        engine = SVI(model, n_total=len(X), effective_batch_size=M, schedule=Constant(1.0))
        finals = [engine.fit(engine.init(X, seed=0).__class__(0, engine.init(X, seed=0).lam,
                                                               np.random.Generator(np.random.PCG64(s)).bit_generator.state, 0),
                             X, n_steps=3)[0].lam["alpha"] for s in range(3)]
        results[M] = finals
    assert all(np.array_equal(results[None][0], f) for f in results[None])
    assert not np.array_equal(results[50][0], results[50][1])


def test_info_fields(setup):
    model, X = setup
    engine = SVI(model, n_total=1000.0, schedule=RobbinsMonro(tau0=1.0, kappa=1.0))
    state = engine.init(X, seed=0)
    new, info = engine.update(state, X[:40])
    assert info.step == 1 and info.rho == 0.5 and info.batch_size == 40
    assert info.elbo_per_record == pytest.approx(info.elbo / 1000.0)
    assert info.grad_norm == pytest.approx(np.sqrt((new.lam - state.lam).sqnorm()) / 0.5)
    assert new.records_seen == 40 and state.records_seen == 0


def test_load_refuses_non_state_files(tmp_path, setup):
    p = tmp_path / "x.npz"
    np.savez(p, a=np.zeros(3))
    with pytest.raises(ValueError, match="no meta.json"):
        load_state(p)
    # an object array would need pickle: refused
    np.savez(p, **{"meta.json": np.array([{"a": 1}], dtype=object)})
    with pytest.raises(ValueError, match="pickle"):
        load_state(p)


def test_short_batches_policy(setup):
    model, X = setup
    engine = SVI(model, n_total=len(X), effective_batch_size=50, short_batches="svi")
    state = engine.init(X, seed=0)
    _, info = engine.update(state, X[:20])          # shorter than M: a plain SVI step
    assert info.effective_batch_size == 20 and info.noise_std == 0.0
    _, info = engine.update(state, X[:100])
    assert info.effective_batch_size == 50
    with pytest.raises(ValueError, match="short_batches"):
        SVI(model, n_total=10, short_batches="drop")


def test_fraction_to_boundary_keeps_a_margin():
    """Helper-found case: ρ just below s_max used to take the step almost to α = 0.

    With ρ_b = min(ρ, τ s_max) a Dirichlet count moving towards 0 keeps at
    least a fraction 1 − τ of its value, and the reported clipping matches.
    """
    X, _ = make_blobs(1000, seed=0)
    model = BayesianGMM.dp_approximation(2, 1.0, 50)
    engine = SVI(model, len(X), RobbinsMonro(tau0=1, kappa=0.51), effective_fraction=0.2)
    state = engine.init(X, seed=0)
    rng = np.random.default_rng(123)
    tau = engine.boundary_fraction
    clipped = 0
    for _ in range(200):
        x = X[np.sort(rng.choice(len(X), 50, replace=False))]
        target = engine.stochastic_target(state, x).target
        limits = dict((names[0], lim) for names, lim in model.max_step(state.lam, target))
        new, info = engine.update(state, x)
        a0, a1 = state.lam["alpha"], new.lam["alpha"]
        assert np.all(a1 >= (1 - tau) * a0 * (1 - 1e-12))
        expect = np.count_nonzero(tau * limits["alpha"] < info.rho) + \
            np.count_nonzero(tau * limits["beta"] < info.rho)
        assert info.domain_clipped == expect
        clipped += info.domain_clipped
        state = new
    assert clipped > 0
