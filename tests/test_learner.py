"""The streaming learner the river faces share (streamsvi.learner): the start at the model's
start size (the daemon's rule, one function), flush, learn_one × n == learn_many, copies."""
import copy
import pickle

import numpy as np
import pandas as pd
import pytest

from streamsvi import learner as learner_mod
from streamsvi.datasets import make_blobs
from streamsvi.estimators import (GaussianMixture, LogisticRegression, MatrixFactorization,
                                  SoftmaxRegression, TopicModel)
from streamsvi.inference import SVI, RobbinsMonro
from streamsvi.inference.engine import start_records
from streamsvi.learner import StreamLearner, take_start
from streamsvi.models import LDA, PMF, BayesianGMM, Ratings


def _gmm_engine(init_batches=3, n_total=400.0):
    return SVI(BayesianGMM(3, 2, init_batches=init_batches), n_total=n_total,
               schedule=RobbinsMonro(tau0=1.0, kappa=0.7), short_batches="svi")


def _rows(n=400, seed=7):
    X, _ = make_blobs(n, seed=seed)
    return list(X)


def test_take_start_is_the_start_rule():
    model = BayesianGMM(3, 2, init_batches=3)          # start_size(20) = max(60, 5·3·2) = 60
    held = [[0] * 20, [0] * 20]
    assert take_start(held, len, model, 20, 1e4) == [] and len(held) == 2
    assert take_start(held, len, model, 20, 30.0) == [[0] * 20, [0] * 20] and held == []   # at most N
    held = [[0] * 20]
    assert take_start(held, len, model, 20, 1e4, flush=True) == [[0] * 20] and held == []
    assert take_start([], len, model, 20, 1e4, flush=True) == []
    lda = LDA(2, 8)                                       # no start_size: one minibatch
    assert take_start([[0] * 5], len, lda, 5, 1e4) == [[0] * 5]


def test_daemon_and_worker_use_the_same_start_rule():
    from streamsvi.service import daemon
    from streamsvi.service.roles import worker

    assert daemon.take_start is learner_mod.take_start
    assert worker.Worker._take_start is daemon.Daemon._take_start


@pytest.mark.parametrize("init_batches", [1, 2, 3, 5])
def test_start_happens_at_the_models_start_size(init_batches):
    """Nothing is learned until start_records records are in, in whole minibatches; then
    the engine starts from all of them and takes one step per held minibatch."""
    eng = _gmm_engine(init_batches)
    S = 20
    want = start_records(eng.model, S, eng.n_total)
    n_start = int(np.ceil(want / S)) * S
    rows = _rows()
    lrn = StreamLearner(eng, S, np.vstack, seed=9)
    for r in rows[:n_start - 1]:
        lrn.learn(r)
    assert lrn.state is None and lrn.last_info is None
    assert len(lrn.held) == n_start // S - 1 and len(lrn.unlearned()) == n_start - 1
    lrn.learn(rows[n_start - 1])
    assert lrn.state.step == n_start // S and lrn.held == [] and lrn.buffer == []
    ref = eng.init(np.vstack(rows[:n_start]), seed=9)
    for i in range(0, n_start, S):
        ref, _ = eng.update(ref, np.vstack(rows[i:i + S]))
    assert lrn.state.lam.array_equal(ref.lam)


def test_flush_learns_the_remainder():
    eng = _gmm_engine(init_batches=4)                    # the start wants 80 records
    rows = _rows(150)
    lrn = StreamLearner(eng, 20, np.vstack, seed=1)
    lrn.learn_many(rows[:45])
    assert lrn.state is None
    lrn.flush()                                          # starts from what is held: 45 records
    assert lrn.state.step == 3 and lrn.state.records_seen == 45 and lrn.unlearned() == []
    lrn.learn_many(rows[45:150])
    assert lrn.state.step == 8 and len(lrn.buffer) == 5
    lrn.flush()
    assert lrn.state.step == 9 and lrn.state.records_seen == 150 and lrn.buffer == []
    lrn.flush()                                          # nothing buffered: nothing to do
    assert lrn.state.step == 9


def test_learn_one_times_n_is_learn_many_and_copies_go_on_alike():
    rows = _rows(330)
    a = StreamLearner(_gmm_engine(), 25, np.vstack, seed=3)
    b = StreamLearner(_gmm_engine(), 25, np.vstack, seed=3)
    for r in rows[:200]:
        a.learn(r)
    b.learn_many(rows[:200])
    assert a.state.lam.array_equal(b.state.lam) and a.state.step == b.state.step == 8
    c, d = pickle.loads(pickle.dumps(a)), copy.deepcopy(a)
    for lrn in (a, b, c, d):
        lrn.learn_many(rows[200:])
        lrn.flush()
    for lrn in (b, c, d):
        assert lrn.state.lam.array_equal(a.state.lam) and lrn.state.rng_state == a.state.rng_state


def test_ratings_and_documents_start_at_the_first_minibatch():
    pmf = SVI(PMF(n_factors=2), n_total=1000.0)
    lrn = StreamLearner(pmf, 4, lambda recs: Ratings(*zip(*recs)), seed=0)
    for k in range(3):
        lrn.learn((k, k + 1, 3.0))
    assert lrn.state is None and [y for _, _, y in lrn.unlearned()] == [3.0] * 3
    lrn.learn((3, 4, 5.0))
    assert lrn.state.step == 1 and lrn.state.records_seen == 4
    assert "batch_size=4" in repr(lrn) and "started=True" in repr(lrn)


def _face_streams():
    X = _rows(120)
    dense = [{"a": float(a), "b": float(b)} for a, b in X]
    rng = np.random.default_rng(0)
    docs = [{f"w{int(w)}": 1 + int(w) % 3 for w in rng.integers(0, 12, 4)} for _ in range(120)]
    labels = [bool(a > 0) for a, _ in X]
    return [
        (GaussianMixture(n_components=3, batch_size=10, seed=0), [(x,) for x in dense]),
        (TopicModel(n_components=2, n_features=16, batch_size=10, seed=0), [(d,) for d in docs]),
        (MatrixFactorization(n_factors=2, batch_size=10, seed=0),
         [(int(u), int(i), float(u % 3)) for u, i in rng.integers(0, 8, (120, 2))]),
        (LogisticRegression(batch_size=10, seed=0), list(zip(dense, labels))),
        (SoftmaxRegression(batch_size=10, seed=0), [(x, int(3 * (x["a"] > 0) + (x["b"] > 0))) for x in dense]),
    ]


@pytest.mark.parametrize("k", range(5))
def test_every_face_learns_through_the_learner(k):
    """Each face hands its records to one StreamLearner: its state is the learner's, and a
    face's records are learned in minibatches of batch_size."""
    est, stream = _face_streams()[k]
    for rec in stream[:95]:
        est.learn_one(*rec)
    lrn = est._learner
    assert isinstance(lrn, StreamLearner) and est._state is lrn.state and est._engine is lrn.engine
    assert len(lrn.buffer) == 95 - lrn.state.records_seen <= 5 and est.last_info_ is lrn.last_info
    assert len(repr(est)) < 400


def test_a_face_with_no_update_has_no_last_info():
    est = GaussianMixture(n_components=2, batch_size=8, seed=0)
    assert not hasattr(est, "last_info_")
    est.learn_many(pd.DataFrame({"a": np.arange(3.0)}))
    assert not hasattr(est, "last_info_") and est._state is None
