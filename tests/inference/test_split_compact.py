"""Compact LDA deltas (``streamsvi.inference.split.compact``, ``scaleout.compact_below``).

A worker's columns delta travels as a bitmap of the entries kept and their float32 values,
entries below the threshold rounded at random to 0 or to the threshold. These check what
that promises: unbiased (the mean of many compactions is the exact statistic), every entry
at or above the threshold kept to float32 rounding, fewer bytes, a step replayed from the
wire that is the applier's bit for bit, and a malformed compact delta refused with a reason.
"""
import copy

import numpy as np
import pytest

from streamsvi.datasets import make_lda_corpus
from streamsvi.inference import SVI, split
from streamsvi.inference.schedules import RobbinsMonro
from streamsvi.models import LDA, BayesianGMM
from streamsvi.service.roles.transport import Delta


def _wire(c, version=0):
    d = Delta.decode(Delta(worker="w", version=version, ranges=[("t", 0, 0, 1)], records=c.records,
                           stats=c.arrays, min_weight=c.min_weight, extra=c.meta).encode())
    return split.Contribution(arrays=d.stats, records=d.records, min_weight=d.min_weight, meta=d.extra)


def _expanded(engine, c):
    return split.SPLITTERS["columns"]._expand(c.arrays, engine.model.n_components)


def _case(n=240, V=400, K=8):
    X = make_lda_corpus(n, n_topics=K, n_words=V, doc_length=20, alpha=0.1, seed=3)[0]
    model = LDA(n_components=K, n_features=V, doc_topic_prior=0.1, topic_word_prior=0.05,
                init="documents", max_doc_update_iter=30)
    engine = SVI(model, n_total=n, schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
    state = engine.init(X[:60], seed=1)
    for i in range(3):                      # topics that have formed: most entries are small
        state, _ = engine.update(state, X[60 * i:60 * (i + 1)])
    return engine, state, X


def test_compaction_is_unbiased_and_keeps_every_large_entry():
    """2,000 compactions of one contribution (fixed seeds). Entries ≥ τ are the exact ones to
    float32 rounding in every draw, small ones are 0 or τ, zeros stay zero. Unbiased: each
    small entry expected to round up at least 20 times has a mean within 5 standard errors
    (binomial: x·(τ − x) / 2000) of the exact statistic, and so has the sum of all small
    entries (against the sum of their variances)."""
    engine, state, X = _case()
    tau, R = 0.05, 2000
    c = split.contribution(engine, state, X[180:240], split.batch_rng_state(1, "t", 0, 0))
    S = c.arrays["stats"]
    small = S < tau
    assert small.mean() > 0.3 and (S >= tau).any(), "the case needs both kinds of entries"
    total, small_sums = np.zeros_like(S), []
    for r in range(R):
        e = _expanded(engine, split.compact(engine, c, tau, np.random.default_rng(r)))
        np.testing.assert_allclose(e[~small], S[~small], rtol=2 ** -23)
        assert set(np.unique(e[small])) <= {0.0, np.float32(tau)}
        assert (e[S == 0] == 0).all()
        total += e
        small_sums.append(e[small].sum())
    var = np.maximum(S * (tau - S), 0)
    often = small & (R * S / tau >= 20)
    assert often.sum() >= 50, often.sum()
    z = (total / R - S)[often] / np.sqrt(var[often] / R)
    assert np.max(np.abs(z)) < 5.0, np.max(np.abs(z))
    z_sum = (np.mean(small_sums) - S[small].sum()) / np.sqrt(var[small].sum() / R)
    assert abs(z_sum) < 5.0, z_sum


def test_a_compact_delta_is_smaller_and_its_replay_is_the_appliers_step_bit_for_bit():
    """The applier and a worker replaying the step read the same message: the same λ, bit for
    bit. The compact message is several times smaller than the exact one, and the λ it leads
    to stays near the exact step's (the rounding is small against the statistic)."""
    engine, state, X = _case()
    x = X[180:240]
    c = split.contribution(engine, state, x, split.batch_rng_state(1, "t", 0, 180))
    small = split.compact(engine, c, 0.01, split.compact_rng(1, "t", 0, 180))
    exact_bytes = len(Delta("w", 0, [("t", 0, 0, 1)], c.records, stats=c.arrays, extra=c.meta).encode())
    msg = Delta("w", state.step, [("t", 0, 0, 1)], small.records, stats=small.arrays, extra=small.meta).encode()
    assert len(msg) < exact_bytes / 2.5, (len(msg), exact_bytes)
    applier, _ = split.apply(engine, copy.deepcopy(state), _wire(small, state.step))
    worker, _ = split.apply(engine, copy.deepcopy(state), _wire(small, state.step), metrics=False)
    assert applier.lam.array_equal(worker.lam)
    exact, _ = split.apply(engine, copy.deepcopy(state), c)
    m = engine.model
    np.testing.assert_allclose(m.lam_matrix(applier.lam), m.lam_matrix(exact.lam), rtol=1e-3, atol=0.02)
    # seeded per batch: a batch read again after a crash compacts the same way
    again = split.compact(engine, c, 0.01, split.compact_rng(1, "t", 0, 180))
    assert all(np.array_equal(again.arrays[k], small.arrays[k]) for k in small.arrays)


def test_zero_threshold_and_other_storages_are_left_exact():
    engine, state, X = _case()
    c = split.contribution(engine, state, X[:60], split.batch_rng_state(1, "t", 0, 0))
    assert split.compact(engine, c, 0.0, np.random.default_rng(0)) is c
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(50, 2))
    gmm = SVI(BayesianGMM(2, 2), n_total=50)
    g = split.contribution(gmm, gmm.init(Y, seed=0), Y, split.batch_rng_state(1, "t", 0, 0))
    assert split.compact(gmm, g, 0.01, rng) is g


def test_a_malformed_compact_delta_is_refused_with_a_reason():
    engine, state, X = _case()
    c = split.compact(engine, split.contribution(engine, state, X[:60], split.batch_rng_state(1, "t", 0, 0)),
                      0.01, np.random.default_rng(0))
    short = split.Contribution(arrays={**c.arrays, "kept": c.arrays["kept"][:-1]}, records=c.records,
                               meta=c.meta)
    with pytest.raises(ValueError, match="bitmap holds"):
        split.apply(engine, copy.deepcopy(state), short)
    fewer = split.Contribution(arrays={**c.arrays, "values": c.arrays["values"][:-1]}, records=c.records,
                               meta=c.meta)
    with pytest.raises(ValueError, match="values for"):
        split.apply(engine, copy.deepcopy(state), fewer)
