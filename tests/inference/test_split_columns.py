"""LDA's split update (``streamsvi/inference/split_columns.py``): sparse column contributions.

The check suite (``tests/models/test_checks.py::test_a_split_update_is_the_update``) runs
the contract on LDA's small check case with SVI+; these add what that case cannot show:
a vocabulary the batches touch only partly (the sparse path), every annealer (a stochastic
restart's η_t drawn by the applier), a delta's size, and λ versions that went through the
published file and the applier's checkpoint.
"""
import copy
from dataclasses import replace

import numpy as np
import pytest

from streamsvi.checkpoint import CheckpointStore
from streamsvi.datasets import make_lda_corpus
from streamsvi.inference import SVI, split
from streamsvi.inference.schedules import RobbinsMonro
from streamsvi.models import LDA
from streamsvi.service.roles.transport import Delta, LambdaFile, publish_lambda


def _wire(c, version=0):
    """``c`` through the deltas codec, as the applier receives it."""
    d = Delta.decode(Delta(worker="w", version=version, ranges=[("t", 0, 0, 1)], records=c.records,
                           stats=c.arrays, min_weight=c.min_weight, extra=c.meta).encode())
    return split.Contribution(arrays=d.stats, records=d.records, min_weight=d.min_weight, meta=d.extra)


def _case(V=400, n=240, K=4, **engine):
    X = make_lda_corpus(n, n_topics=K, n_words=V, doc_length=12, alpha=0.3, seed=2)[0]
    model = LDA(n_components=K, n_features=V, doc_topic_prior=0.3, topic_word_prior=0.05,
                init="documents", max_doc_update_iter=30)
    return model, X, SVI(model, n_total=n, schedule=RobbinsMonro(tau0=1.0, kappa=0.7), **engine)


@pytest.mark.parametrize("annealer", [None, {"kind": "svi+", "M0": 10},
                                      {"kind": "deterministic", "T0": 4.0, "n_steps": 4},
                                      {"kind": "stochastic", "n_steps": 3}])
def test_applying_a_contribution_is_the_update_on_the_sparse_path_with_every_annealer(annealer):
    """V = 400 and batches of 40 short documents: each batch holds a part of the vocabulary,
    so the contribution is sparse and the step writes only its columns. Bit for bit, with the
    restart steps of stochastic annealing too (the applier draws η_t from the worker's stream;
    those steps are dense and leave λ plain, and the next sparse one converts it back)."""
    model, X, engine = _case(annealer=annealer)
    state = engine.init(X[:40], seed=5)
    applied, single = copy.deepcopy(state), copy.deepcopy(state)
    sparse = restarts = 0
    for i in range(6):
        x = X[40 * i:40 * (i + 1)]
        draws = split.batch_rng_state(7, "t", 0, 40 * i)
        c = _wire(split.contribution(engine, applied, x, draws), applied.step)
        sparse += c.arrays["cols"].size < model.n_features
        applied, done = split.apply(engine, applied, c)
        single, info = engine.update(replace(single, rng_state=draws), x)
        assert applied.step == single.step == done.step == i + 1
        assert applied.records_seen == single.records_seen == 40 * (i + 1)
        assert model.is_scaled(applied.lam) == model.is_scaled(single.lam)
        assert applied.lam.array_equal(single.lam), f"update {i + 1}"
        assert done.domain_clipped == info.domain_clipped
        if info.temperature == 1.0:            # the ELBO the applier reports is the engine's
            assert done.elbo == pytest.approx(info.elbo, rel=1e-12)
        if info.restart_weight > 0:            # a dense restart step: λ left plain
            restarts += 1
            assert not model.is_scaled(applied.lam)
    assert sparse == 6
    assert (restarts > 0) == (annealer is not None and annealer["kind"] == "stochastic")
    assert model.is_scaled(applied.lam)        # the last step was sparse again


@pytest.mark.parametrize("annealer", [None, {"kind": "svi+", "M0": 10}, {"kind": "stochastic", "n_steps": 3}])
def test_a_replay_without_metrics_gives_the_appliers_lambda_bit_for_bit(annealer):
    """A worker follows λ by replaying the applier's steps with ``metrics=False``: no global
    ELBO term, no gradient norm (reductions over K × V that only the applier reports), and
    the same λ bit for bit, at every step, sparse or dense (a restart); its Applied carries
    no ELBO and its aux keeps the last computed term (the applier's computes a new one)."""
    model, X, engine = _case(annealer=annealer)
    state = engine.init(X[:40], seed=5)
    applier, follower = copy.deepcopy(state), copy.deepcopy(state)
    computed = 0
    for i in range(6):
        x = X[40 * i:40 * (i + 1)]
        c = _wire(split.contribution(engine, applier, x, split.batch_rng_state(7, "t", 0, 40 * i)),
                  applier.step)
        applier, done = split.apply(engine, applier, c)
        follower, seen = split.apply(engine, follower, c, metrics=False)
        assert follower.lam.array_equal(applier.lam), f"step {i + 1}"
        assert (follower.step, follower.records_seen) == (applier.step, applier.records_seen)
        assert seen.elbo is None and seen.domain_clipped == done.domain_clipped
        computed += applier.aux["global_elbo_step"] != (follower.aux or {}).get("global_elbo_step")
    assert computed > 0          # the applier computed terms the follower did not


def test_a_contribution_grows_with_the_batch_columns_not_the_vocabulary():
    """V = 5000, K = 20, a batch of 30 documents over ~100 distinct words: the encoded delta
    is |cols|·(8 + 8K) bytes and a header, ~2 % of a dense K·V·8 one; a batch over twice the
    words is about twice as large, and V does not enter."""
    K, V = 20, 5000
    rng = np.random.default_rng(0)

    def batch(words, n=30):
        import scipy.sparse as sp
        vocab = rng.choice(V, size=words, replace=False)
        rows = [rng.choice(vocab, size=12) for _ in range(n)]
        X = sp.csr_matrix((np.ones(12 * n), np.concatenate(rows), np.arange(0, 12 * n + 1, 12)),
                          shape=(n, V))
        X.sum_duplicates()
        return X

    model = LDA(n_components=K, n_features=V)
    engine = SVI(model, n_total=1000)
    state = engine.init(batch(100), seed=1)
    sizes = []
    for words in (100, 200):
        x = batch(words)
        u = np.unique(x.indices).size
        c = split.contribution(engine, state, x, split.batch_rng_state(1, "t", 0, 0))
        assert c.arrays["cols"].tolist() == np.unique(x.indices).tolist()
        assert c.arrays["stats"].shape == (K, u)
        body = u * (8 + 8 * K)
        wire = len(Delta(worker="w", version=0, ranges=[("t", 0, 0, 30)], records=c.records,
                         stats=c.arrays, extra=c.meta).encode())
        assert body <= wire < body + 1024, (wire, body)
        sizes.append(wire)
    assert sizes[0] < 0.03 * K * V * 8
    assert 1.6 < sizes[1] / sizes[0] < 2.4


def test_lda_lambda_round_trips_the_published_file_and_the_applier_checkpoint(tmp_path):
    """λ in scaled columns with its aux (stored μ² sums, the last global ELBO term) is what a
    worker loads from the λ file and an applier resumes from its snapshot: the same arrays,
    the same contribution at the loaded λ, and the same λ after applying it there."""
    model, X, engine = _case()
    state = engine.init(X[:40], seed=5)
    for i in range(3):
        state, _ = engine.update(state, X[40 * i:40 * (i + 1)])
    assert model.is_scaled(state.lam) and state.aux["global_elbo"] is not None
    publish_lambda(tmp_path / "lambda.npz", engine, state)
    f = LambdaFile(tmp_path / "lambda.npz")
    assert f.refresh() and f.version == 3
    store = CheckpointStore(tmp_path / "ck", keep=2)
    store.save(engine, state, [{"source": "d", "partition": 0, "offset": 9}],
               extra={"scaleout": {"applied_end": {"t/0": 120}}})
    resumed = store.resume()
    for loaded_engine, loaded in ((f.engine, f.state), (engine, resumed.state)):
        assert loaded.lam.array_equal(state.lam) and set(loaded.aux) == set(state.aux)
        np.testing.assert_array_equal(loaded.aux["stored_sqsum"], state.aux["stored_sqsum"])
        assert loaded.aux["global_elbo"] == state.aux["global_elbo"]
        assert loaded.aux["global_elbo_step"] == state.aux["global_elbo_step"]
        x, draws = X[120:160], split.batch_rng_state(3, "t", 1, 120)
        here = split.contribution(engine, state, x, draws)
        there = split.contribution(loaded_engine, loaded, x, draws)
        for k in here.arrays:
            np.testing.assert_array_equal(there.arrays[k], here.arrays[k])
        assert there.meta == here.meta and there.min_weight == here.min_weight
        a, _ = split.apply(engine, copy.deepcopy(state), _wire(there, 3))
        b, _ = split.apply(engine, copy.deepcopy(loaded), _wire(here, 3))
        assert a.lam.array_equal(b.lam) and a.aux["stored_sqsum"].tolist() == b.aux["stored_sqsum"].tolist()


def test_a_stale_contribution_is_stepped_at_the_appliers_lambda():
    """A contribution made at version 0 and applied at version 3 (staleness 3, ρ halved)
    steps the applier's λ: columns outside the batch move by the per-topic scale only, and
    the step's number and ρ are the applier's."""
    model, X, engine = _case()
    v0 = engine.init(X[:40], seed=5)
    c = _wire(split.contribution(engine, v0, X[200:240], split.batch_rng_state(1, "t", 0, 200)))
    state = copy.deepcopy(v0)
    for i in range(3):
        state, _ = engine.update(state, X[40 * i:40 * (i + 1)])
    before = model.lam_matrix(state.lam)
    new, done = split.apply(engine, state, c, rho_scale=0.5)
    after = model.lam_matrix(new.lam)
    assert done.step == new.step == 4 and done.rho == pytest.approx(0.5 * engine.schedule(4))
    assert np.isfinite(after).all() and (after > 0).all()
    out = np.setdiff1d(np.arange(model.n_features), c.arrays["cols"])
    eta = model.column_prior
    np.testing.assert_allclose(after[:, out] - eta, (1 - done.rho) * (before[:, out] - eta),
                               rtol=1e-9, atol=1e-12)


def test_a_delta_that_does_not_fit_the_model_is_refused_with_a_reason():
    model, X, engine = _case()
    state = engine.init(X[:40], seed=5)
    c = _wire(split.contribution(engine, state, X[:40], split.batch_rng_state(1, "t", 0, 0)))
    bad = [(dict(c.arrays, stats=c.arrays["stats"][:2]), c.meta, "do not fit K = 4"),
           (dict(c.arrays, cols=c.arrays["cols"][::-1].copy()), c.meta, "sorted distinct ids"),
           ({"stats": c.arrays["stats"]}, c.meta, "not a columns delta"),
           (c.arrays, {k: v for k, v in c.meta.items() if k != "scale"}, "not a columns delta")]
    for arrays, meta, why in bad:
        with pytest.raises(ValueError, match=why):
            split.apply(engine, state, replace(c, arrays=arrays, meta=meta))
    assert state.step == 0
