"""Generic checks every model passes (STYLE.md §8).

Each check runs on every case of ``tests/conftest.py::MODEL_CASES``; a model
registered in ``streamsvi.models.MODELS`` without a case fails
``test_every_model_has_a_case``.

Row-wise models (PMF: row blocks keyed by id, ``streamsvi.inference.blocks``) keep an id→row
map in ``state.aux``; their primitives take it as ``aux=``. Three checks apply
to them in an adapted form, because the mathematics differs, not the code
(LDA's λ is stored by the engine as scaled columns, written only in a batch's
words, but it is one block with one N/|S|: every check applies to it unchanged):

* ρ = 1 on the full batch is one CAVI sweep: for a model whose global
  parameters are several conjugate blocks that condition on each other
  (``model.blocks``; PMF: U | V and V | U) CAVI is block coordinate ascent,
  so the sweep is built block by block from the model's own primitives
  (a simultaneous update of all blocks is not CAVI and need not raise the
  ELBO). With one block this is the check as written for every other model.
* the gradient-variance and SVI+-variance checks assume one global scale
  N/|S|; a row-wise model scales each row by N_i/|S_i|, so its variance
  formula is different and is checked against brute force and the closed
  form in the model's own tests (``tests/models/test_pmf.py``).
"""
import math

import numpy as np
import pytest

from streamsvi.inference import SVI, Constant, RobbinsMonro, batch_vi, load_state, save_state
from streamsvi.inference.engine import owns_its_step
from tests.conftest import MODEL_CASES, registered_model_names


def _rowwise(model) -> bool:
    return bool(getattr(model, "row_blocks", None))


def _per_row(model) -> bool:
    """Row-wise models whose rows are conditionally conjugate blocks with their own N_i/|S_i|
    (PMF). LDA's step goes through the engine's scaled-columns storage, but its λ is one
    block with one scale, so every check applies to it as written."""
    return bool(getattr(model, "row_blocks", None))


def _aux_equal(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return set(a) == set(b) and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)


def test_every_model_has_a_case():
    covered = {f()[0].name for _, f in MODEL_CASES}
    assert registered_model_names() <= covered


def test_batch_vi_elbo_never_decreases(model_case):
    model, X = model_case
    for seed in range(3):
        engine = batch_vi(model, len(X))
        state = engine.init(X, seed=seed)
        state, infos = engine.fit(state, X, n_steps=40)
        elbo = np.array([i.elbo for i in infos])
        # info.elbo is L(λ_{t-1}, φ*(λ_{t-1})): monotone under CAVI up to round-off
        assert np.all(np.diff(elbo) >= -1e-9 * np.abs(elbo[1:])), np.diff(elbo).min()
        assert elbo[-1] > elbo[0]


def test_rho_one_on_full_batch_is_one_cavi_sweep(model_case):
    model, X = model_case
    engine = SVI(model, n_total=len(X), schedule=Constant(1.0))
    state = engine.init(X, seed=4)
    new_state, info = engine.update(state, X)
    if _per_row(model):
        lam, aux = state.lam, state.aux
        for block in model.blocks:         # block coordinate ascent (module docs)
            swept = model.prior_like(lam) + model.suffstats(model.local_step(lam, X, aux=aux), X)
            lam = type(lam)({k: (swept[k] if k in block else lam[k]) for k in lam})
        assert new_state.lam.array_equal(lam)
        assert info.elbo == pytest.approx(model.elbo(state.lam, state.aux, X), rel=1e-12)
        return
    cavi = model.prior() + model.suffstats(model.local_step(state.lam, X), X)
    assert new_state.lam.array_equal(cavi)
    # and the reported ELBO is the full-data ELBO at the old λ
    assert info.elbo == pytest.approx(engine.elbo(state.lam, X), rel=1e-12)


def test_svi_plus_with_m_equal_batch_is_svi(model_case):
    model, X = model_case
    kw = dict(n_total=10 * len(X), schedule=RobbinsMonro(tau0=2.0, kappa=0.6))
    runs = []
    for M in (None, 40):
        engine = SVI(model, effective_batch_size=M, **kw)
        state = engine.init(X, seed=9)
        state, infos = engine.fit(state, X, n_steps=15, batch_size=40)
        runs.append((state, infos))
    (s1, i1), (s2, i2) = runs
    assert s1.lam.array_equal(s2.lam)
    assert s1.rng_state == s2.rng_state
    assert [a.elbo for a in i1] == [b.elbo for b in i2]


def test_same_seed_same_data_is_bit_identical(model_case):
    model, X = model_case
    out = []
    for _ in range(2):
        engine = SVI(model, n_total=len(X), effective_batch_size=10,
                     schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
        state = engine.init(X, seed=123)
        state, infos = engine.fit(state, X, n_steps=10, batch_size=50)
        out.append((state, [i.to_dict() for i in infos]))
    assert out[0][0].lam.array_equal(out[1][0].lam)
    assert out[0][1] == out[1][1]
    engine2 = SVI(model, n_total=len(X), effective_batch_size=10)
    other, _ = engine2.fit(engine2.init(X, seed=124), X, n_steps=10, batch_size=50)
    assert not other.lam.array_equal(out[0][0].lam)  # the seed matters


def test_a_split_update_is_the_update(model_case):
    """Issue 25: a worker's contribution, sent through the deltas codec and applied by the
    applier's step at the same state, is the engine's update with the same draws (SVI+
    weights): bit for bit, or to rounding where the storage's splitter says so. This is what
    makes N workers and one process run the same step."""
    import copy
    from dataclasses import replace

    from streamsvi.inference import split
    from streamsvi.service.roles.transport import Delta

    model, X = model_case
    engine = SVI(model, n_total=len(X), effective_batch_size=10, schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
    why = split.why_not(engine)
    if why is not None:
        pytest.skip(why)
    sp = split.splitter_for(engine)
    state = engine.init(X, seed=5)
    applied, single = copy.deepcopy(state), copy.deepcopy(state)   # (LDA steps its storage in place)
    B = max(len(X) // 6, 2)
    for i in range(6):
        x = X[B * i:B * (i + 1)]
        draws = split.batch_rng_state(7, "t", 0, B * i)
        c = split.contribution(engine, applied, x, draws)
        wire = Delta.decode(Delta(worker="w", version=applied.step, ranges=[("t", 0, B * i, B * (i + 1))],
                                  records=c.records, stats=c.arrays, min_weight=c.min_weight,
                                  extra=c.meta).encode())
        c = split.Contribution(arrays=wire.stats, records=wire.records, min_weight=wire.min_weight,
                               meta=wire.extra)
        applied, done = split.apply(engine, applied, c)
        single, _ = engine.update(replace(single, rng_state=draws), x)
        assert applied.step == single.step == i + 1 and done.step == i + 1
        assert applied.records_seen == single.records_seen and done.records == c.records
        if sp.agreement == "exact":
            assert applied.lam.array_equal(single.lam), f"update {i + 1}"
        else:
            assert applied.lam.allclose(single.lam, rtol=1e-9, atol=1e-9), f"update {i + 1}"


def test_merging_half_batch_statistics_equals_one_batch(model_case):
    model, X = model_case
    kw = {}
    if _per_row(model):
        st = SVI(model, len(X)).init(X, seed=0)
        lam, kw = st.lam, {"aux": st.aux}
    else:
        lam = model.init_params(np.random.default_rng(0), X, len(X))
    w = np.random.default_rng(1).normal(1.0, 1.0, size=len(X))
    h = len(X) // 2
    whole = model.suffstats(model.local_step(lam, X, **kw), X, w)
    halves = (model.suffstats(model.local_step(lam, X[:h], **kw), X[:h], w[:h])
              + model.suffstats(model.local_step(lam, X[h:], **kw), X[h:], w[h:]))
    assert whole.allclose(halves, rtol=1e-10, atol=1e-10)


def test_save_load_round_trip(model_case, tmp_path):
    model, X = model_case
    engine = SVI(model, n_total=len(X), effective_batch_size=20,
                 schedule=RobbinsMonro(tau0=3.0, kappa=0.9, rho_min=0.01))
    state, _ = engine.fit(engine.init(X, seed=5), X, n_steps=5, batch_size=40)
    save_state(tmp_path / "s.npz", engine, state)
    engine2, state2 = load_state(tmp_path / "s.npz")
    assert state2.lam.array_equal(state.lam)
    assert (state2.step, state2.records_seen, state2.rng_state) == \
        (state.step, state.records_seen, state.rng_state)
    assert _aux_equal(state2.aux, state.aux)
    assert engine2.to_dict() == engine.to_dict()
    assert engine2.model.get_params() == model.get_params()
    # continuing from the loaded state is bit-identical to continuing the original
    a, _ = engine.fit(state, X, n_steps=3, batch_size=40)
    b, _ = engine2.fit(state2, X, n_steps=3, batch_size=40)
    assert a.lam.array_equal(b.lam)


def test_lambda_stays_in_domain_under_strong_annealing(model_case):
    model, X = model_case
    # M = 2 of |S| = 100: ε_n has variance 49, many weights are negative
    engine = SVI(model, n_total=len(X), effective_batch_size=2, schedule=Constant(0.9))
    state = engine.init(X, seed=0)
    clipped = 0
    for _ in range(30):
        state, info = engine.update(state, X[np.random.default_rng(state.step).choice(len(X), 100, replace=False)])
        assert model.in_domain(state.lam)
        assert info.min_weight < 0
        clipped += info.domain_clipped
    assert clipped > 0  # the safeguard was exercised, and counted


def test_gradient_variance_matches_brute_force(model_case):
    model, X = model_case
    if _per_row(model):
        pytest.skip("per-row scaling N_i/|S_i|: checked in the model's tests (module docs)")
    N, M = 5000.0, 25
    engine = SVI(model, n_total=N, effective_batch_size=M)
    state = engine.init(X, seed=1)
    xb = X[:100]
    _, info = engine.update(state, xb)
    local = model.local_step(state.lam, xb)
    per_record = [model.suffstats(local, xb, weights=np.eye(len(xb))[n]) for n in range(len(xb))]
    flat = np.array([np.concatenate([v.ravel() for v in p.values()]) for p in per_record])
    tr_cov = np.var(flat, axis=0, ddof=1).sum()
    assert info.grad_variance == pytest.approx(N * N * tr_cov / M, rel=1e-8)
    assert info.noise_std == pytest.approx(np.sqrt(100 / M - 1))


def _lambda_prime_samples(model, X, lam, batch, M, trials, seed):
    """λ'_t = (1/|S|) Σ w_n E[t(θ_n)] from the engine (N = 1), batches drawn with replacement."""
    engine = SVI(model, n_total=1.0, effective_batch_size=M, schedule=Constant(1.0))
    base = engine.state_from_params(lam)
    rng = np.random.default_rng(seed)
    eta = model.prior()
    out = []
    for _ in range(trials):
        st = type(base)(0, lam, np.random.Generator(np.random.PCG64(rng.integers(2**63))).bit_generator.state, 0)
        d = engine.stochastic_target(st, X[rng.integers(0, len(X), size=batch)]).target - eta
        out.append(np.concatenate([v.ravel() for v in d.values()]))
    return np.array(out)


def test_svi_plus_variance_property(model_case):
    """Cov(λ'_t) under SVI+ (batch |S|, M) ≈ Cov(λ'_t) under SVI with batch M.

    2,000 trials each. For a Gaussian-like statistic the relative standard
    error of a variance estimate is √(2/2000) ≈ 3%; we allow 15% on the trace
    and on the variance of each of the 5 highest-variance coordinates, and
    check the test has power: plain SVI with batch |S| is 4x smaller and must
    be rejected.
    """
    model, X = model_case
    if _per_row(model):
        pytest.skip("per-row scaling N_i/|S_i|: the closed form is checked in the model's tests")
    lam = model.init_params(np.random.default_rng(0), X, len(X))
    S, M, T = 200, 50, 2000
    plus = _lambda_prime_samples(model, X, lam, S, M, T, seed=1)
    svi_m = _lambda_prime_samples(model, X, lam, M, None, T, seed=2)
    svi_s = _lambda_prime_samples(model, X, lam, S, None, T, seed=3)
    v_plus, v_m, v_s = (np.var(a, axis=0, ddof=1) for a in (plus, svi_m, svi_s))
    assert v_plus.sum() / v_m.sum() == pytest.approx(1.0, abs=0.15)
    top = np.argsort(v_m)[-5:]
    np.testing.assert_allclose(v_plus[top] / v_m[top], 1.0, atol=0.15)
    # both unbiased for the same mean
    se = np.sqrt(v_m / T + v_plus / T)
    assert np.all(np.abs(plus.mean(0) - svi_m.mean(0)) <= 5 * se + 1e-12)
    # power: SVI at |S| has ≈ M/|S| = 1/4 of the variance
    assert v_s.sum() / v_m.sum() == pytest.approx(M / S, abs=0.06)


def test_suffstats_pair_matches_two_calls(model_case):
    model, X = model_case
    pair = getattr(model, "suffstats_pair", None)
    if pair is None:
        pytest.skip("model has no suffstats_pair")
    lam = model.init_params(np.random.default_rng(0), X, len(X))
    local = model.local_step(lam, X)
    w = np.random.default_rng(2).normal(1.0, 2.0, size=len(X))
    sw, s = pair(local, X, w)
    assert sw.allclose(model.suffstats(local, X, w), rtol=1e-12, atol=1e-9)
    assert s.allclose(model.suffstats(local, X), rtol=1e-12, atol=1e-9)


def test_global_elbo_is_minus_the_blocks_kl_to_the_prior(model_case):
    """Each block's family owns its KL to the prior (issue 24): a dense model's global ELBO
    term, however it is computed (the GMM regroups it for speed), is −Σ_blocks KL."""
    model, X = model_case
    if model.row_blocks or model.global_storage != "dense" or not model.param_blocks:
        pytest.skip("not a dense model of parameter blocks")
    engine = SVI(model, n_total=len(X))
    state, _ = engine.update(engine.init(X, seed=0), X[: max(2, len(X) // 3)])
    lam, prior = state.lam, model.prior()
    kl = sum(float(np.sum(b.family.kl(tuple(lam[k] for k in b.names), tuple(prior[k] for k in b.names))))
             for b in model.param_blocks)
    assert math.isclose(model.global_elbo(lam), -kl, rel_tol=1e-10, abs_tol=1e-9), (model.global_elbo(lam), -kl)


# ----------------------------------------------------------- annealing (issue 13)
from streamsvi.datasets import make_lda_corpus  # noqa: E402
from streamsvi.inference.annealing import (Deterministic, NoAnnealing, Stochastic, SVIPlus,  # noqa: E402
                                           supported_kinds)
from streamsvi.models import LDA  # noqa: E402


def _lda_wide_case():
    """LDA with a vocabulary wider than a minibatch's (V = 1200; a 40-document batch holds
    about 2/3 of the words), so the annealing checks run its sparse step on part of the columns
    (the generic ``lda`` case's batches hold all 30 of its words)."""
    K, V = 3, 1200
    topics = np.full((K, V), 1e-4)
    for k in range(K):
        topics[k, 400 * k:400 * k + 400] = 1.0
    X, _, _ = make_lda_corpus(200, n_topics=K, n_words=V, doc_length=30, alpha=0.3, seed=5,
                              topics=topics / topics.sum(axis=1, keepdims=True))
    return LDA(n_components=K, n_features=V, doc_topic_prior=0.3, topic_word_prior=0.05,
               mean_change_tol=1e-4, max_doc_update_iter=30, init="documents"), X.toarray()


_ANNEAL_CASES = list(MODEL_CASES) + [("lda_wide", _lda_wide_case)]


@pytest.fixture(params=[f for _, f in _ANNEAL_CASES], ids=[i for i, _ in _ANNEAL_CASES])
def anneal_case(request):
    return request.param()


def _refuses(model, kind) -> bool:
    """True when ``model`` does not declare annealing ``kind`` (PMF: deterministic, stochastic)."""
    return kind not in supported_kinds(model)


def _run(model, X, annealer=None, n_steps=8, batch_size=40, seed=9, **kw):
    engine = SVI(model, n_total=10 * len(X), schedule=RobbinsMonro(tau0=2.0, kappa=0.6),
                 annealer=annealer, **kw)
    state = engine.init(X, seed=seed)
    return engine.fit(state, X, n_steps=n_steps, batch_size=batch_size)


def _same_run(a, b):
    (s1, i1), (s2, i2) = a, b
    assert s1.lam.array_equal(s2.lam)
    assert s1.rng_state == s2.rng_state
    assert [x.elbo for x in i1] == [y.elbo for y in i2]


def test_lda_wide_batches_leave_words_out():
    """The lda_wide case does what it is for: a 40-document batch misses words, and its
    state is LDA's scaled (sparse) form."""
    model, X = _lda_wide_case()
    assert (np.asarray(X[:40]).sum(axis=0) > 0).sum() < 0.8 * model.n_features
    engine = SVI(model, n_total=len(X), annealer=Deterministic(T0=3.0))
    state, _ = engine.fit(engine.init(X, seed=1), X, n_steps=2, batch_size=40)
    assert model.is_scaled(state.lam)


def test_declared_annealing_kinds():
    """Row-wise models declare their kinds; PMF's refusal names what to use instead."""
    pmf = next(f for i, f in MODEL_CASES if i == "pmf")()[0]
    lda = next(f for i, f in MODEL_CASES if i == "lda")()[0]
    assert supported_kinds(pmf) == ("none", "svi+")
    assert supported_kinds(lda) == ("none", "svi+", "deterministic", "stochastic")
    for ann in (Deterministic(), Stochastic()):
        with pytest.raises(ValueError, match=r"not defined for model 'pmf'.*local latent "
                                             r"assignments.*use kind 'none' or 'svi\+'"):
            SVI(pmf, n_total=10, annealer=ann)
        SVI(lda, n_total=10, annealer=ann)


def test_temperature_one_is_vi_bit_for_bit(anneal_case):
    """Deterministic annealing with T ≡ 1 equals VI (and SVI) exactly, and every
    model's tempered primitives at T = 1 return exactly the untempered values."""
    model, X = anneal_case
    if _refuses(model, "deterministic"):
        with pytest.raises(ValueError, match=f"not defined for model '{model.name}'"):
            SVI(model, n_total=len(X), annealer=Deterministic())
        return
    for schedule in (Constant(1.0), RobbinsMonro(tau0=2.0, kappa=0.6)):
        runs = []
        for ann in (None, Deterministic(T0=1.0)):
            engine = SVI(model, n_total=len(X), schedule=schedule, annealer=ann)
            runs.append(engine.fit(engine.init(X, seed=3), X, n_steps=6,
                                   batch_size=None if isinstance(schedule, Constant) else 40))
        _same_run(*runs)
    lam = model.init_params(np.random.default_rng(0), X, len(X))
    plain, at_one = model.local_step(lam, X), model.local_step(lam, X, temperature=1.0)
    assert model.suffstats(plain, X).array_equal(model.suffstats(at_one, X))
    assert np.array_equal(model.local_elbo(plain), model.local_elbo(at_one))
    assert model.temper(lam, 1.0).array_equal(lam)


def test_stochastic_annealing_with_rho_zero_is_vi(anneal_case):
    model, X = anneal_case
    if _refuses(model, "stochastic"):
        with pytest.raises(ValueError, match="use kind 'none' or 'svi\\+'"):
            SVI(model, n_total=len(X), annealer=Stochastic())
        return
    engine_vi = batch_vi(model, len(X))
    vi = engine_vi.fit(engine_vi.init(X, seed=2), X, n_steps=5)
    engine = SVI(model, n_total=len(X), schedule=Constant(1.0), annealer=Stochastic(rho0=0.0))
    _same_run(vi, engine.fit(engine.init(X, seed=2), X, n_steps=5))
    # and on minibatches with a decaying step
    _same_run(_run(model, X), _run(model, X, Stochastic(rho0=0.0)))


def test_svi_plus_schedule_at_batch_size_is_svi(anneal_case):
    """SVI+ with M_t = |S| equals SVI, for every M schedule (a scheduled M_t is capped at |S|)."""
    model, X = anneal_case
    svi = _run(model, X)
    for ann in (SVIPlus(40), SVIPlus(40, schedule="linear", increment=2.0),
                SVIPlus(40, schedule="geometric", growth=1.5), SVIPlus(fraction=1.0), NoAnnealing()):
        _same_run(svi, _run(model, X, ann))
    # the old spelling effective_batch_size=M is SVIPlus(M), bit for bit (M < |S| too)
    _same_run(_run(model, X, effective_batch_size=10), _run(model, X, SVIPlus(10)))


def test_scheduled_svi_plus_uses_m_t(model_case):
    model, X = model_case
    _, infos = _run(model, X, SVIPlus(4, schedule="linear", increment=4.0), n_steps=12)
    assert [i.effective_batch_size for i in infos] == [min(40.0, 4 + 4.0 * t) for t in range(1, 13)]
    assert infos[0].annealing_level == pytest.approx(np.sqrt(40 / 8 - 1))
    assert infos[-1].annealing_level == 0.0


def test_annealer_checkpoint_resume_is_exact(anneal_case, tmp_path):
    """k steps, save, load, continue == the uninterrupted run, bit for bit, for every annealer.

    Each run starts from its own ``engine.init`` (same seed, same state): LDA writes its
    stored topics in place, so a state passed to an update is not used again (engine docs).
    """
    model, X = anneal_case
    annealers = [SVIPlus(8, schedule="geometric", growth=1.3)]
    if not _refuses(model, "deterministic"):
        annealers.append(Deterministic(T0=3.0, n_steps=6))
    if not _refuses(model, "stochastic"):
        annealers.append(Stochastic(rho0=0.5, n_steps=6))
    for ann in annealers:
        engine = SVI(model, n_total=5 * len(X), annealer=ann)
        whole, w_infos = engine.fit(engine.init(X, seed=11), X, n_steps=8, batch_size=40)
        half, _ = engine.fit(engine.init(X, seed=11), X, n_steps=4, batch_size=40)
        save_state(tmp_path / f"{ann.kind}.npz", engine, half)
        engine2, half2 = load_state(tmp_path / f"{ann.kind}.npz")
        assert engine2.annealer == ann
        rest, r_infos = engine2.fit(half2, X, n_steps=4, batch_size=40)
        assert rest.lam.array_equal(whole.lam), ann.kind
        assert rest.rng_state == whole.rng_state
        assert [i.to_dict() for i in r_infos] == [i.to_dict() for i in w_infos[4:]]


def test_reported_elbo_is_untempered(anneal_case):
    """Under detAVI the reported ELBO is L(λ) of the untempered objective: the ELBO
    a plain engine reports at the same λ (with ρ = 1, and on minibatches with ρ < 1)."""
    model, X = anneal_case
    if _refuses(model, "deterministic"):
        return
    engine = SVI(model, n_total=len(X), schedule=Constant(1.0), annealer=Deterministic(T0=4.0))
    state = engine.init(X, seed=1)
    for _ in range(3):
        before = engine.elbo(state.lam, X)          # before the update (LDA writes λ in place)
        new, info = engine.update(state, X)
        assert info.temperature > 1 and info.annealing_level == info.temperature
        assert info.elbo == pytest.approx(before, rel=1e-12)
        state = new
    assert model.in_domain(state.lam)
    if not owns_its_step(model):
        return
    # a row-wise model's own step on minibatches: the batch's documents' untempered bound
    # (LDA: the global term refreshed each step here, K·V small)
    engine = SVI(model, n_total=10 * len(X), schedule=RobbinsMonro(tau0=2.0, kappa=0.6),
                 annealer=Deterministic(T0=4.0))
    state = engine.init(X, seed=1)
    for b in range(3):
        xb = X[40 * b:40 * b + 40]
        lam = model.dense_params(state.lam) if hasattr(model, "dense_params") else state.lam
        want = model.global_elbo(lam) + 10 * len(X) / 40 * float(np.sum(model.local_elbo(
            model.local_step(lam, xb))))
        state, info = engine.update(state, xb)
        assert info.temperature > 1
        assert info.elbo == pytest.approx(want, rel=1e-12)


def test_stochastic_rho_one_returns_the_random_init(anneal_case):
    """ρ_t = 1 with ρ_RM = 1: λ is exactly η_t, the model's random_init drawn from the state's stream."""
    model, X = anneal_case
    if _refuses(model, "stochastic"):
        return
    engine = SVI(model, n_total=len(X), schedule=Constant(1.0), annealer=Stochastic(rho0=1.0))
    state = engine.init(X, seed=6)
    eta = model.random_init(state.rng(), model.check_batch(X), float(len(X)))
    new, info = engine.update(state, X)
    assert info.restart_weight == 1.0
    assert new.lam.allclose(eta, rtol=1e-12, atol=1e-9)
    assert model.in_domain(eta)
    assert new.rng_state != state.rng_state
