"""The river clusterer: river's own checks, dataset checks, learn_many == learn_one, snapshots."""
import numpy as np
import pandas as pd
import pytest
from river import checks
from river.checks import common

from streamsvi.checkpoint import CheckpointStore
from streamsvi.datasets import make_blobs
from streamsvi.estimators import GaussianMixture
from streamsvi.inference import SVI
from streamsvi.models import BayesianGMM
from streamsvi.scoring import load


def _stream(n=300, seed=0):
    X, _ = make_blobs(n, seed=seed)
    return [({"u": float(a), "v": float(b), "w": float(a - b), "z": float(a + b)}, None) for a, b in X]


@pytest.mark.parametrize("params", list(GaussianMixture._unit_test_params()))
def test_river_check_estimator(params):
    checks.check_estimator(GaussianMixture(**params))


@pytest.mark.parametrize("check", [common.check_learn_one, common.check_pickling,
                                   common.check_shuffle_features_no_impact,
                                   common.check_emerging_features, common.check_disappearing_features,
                                   common.check_radically_disappearing_features,
                                   common.check_predict_one_pure,
                                   common.check_predict_one_before_any_learn,
                                   common.check_no_state_aliasing_with_input,
                                   common.check_clone_is_independent])
def test_river_dataset_checks(check):
    """river runs these only for estimator kinds it has data sets for; we give it one."""
    check(GaussianMixture(n_components=3, batch_size=16, seed=0), dataset=_stream())


def test_learn_many_matches_learn_one():
    data = _stream(200)
    a = GaussianMixture(n_components=3, batch_size=25, effective_batch_size=10, seed=3)
    b = GaussianMixture(n_components=3, batch_size=25, effective_batch_size=10, seed=3)
    for x, _ in data:
        a.learn_one(x)
    b.learn_many(pd.DataFrame([x for x, _ in data]))
    assert a._state.lam.array_equal(b._state.lam)
    df = pd.DataFrame([x for x, _ in data[:50]])
    assert b.predict_many(df).tolist() == [a.predict_one(x) for x, _ in data[:50]]


def test_clusters_are_found():
    X, labels = make_blobs(2000, seed=4)
    est = GaussianMixture(n_components=4, batch_size=100, n_total=2000, seed=0)
    for _ in range(3):
        for a, b in X:
            est.learn_one({"a": a, "b": b})
    pred = np.array([est.predict_one({"a": a, "b": b}) for a, b in X])
    agree = sum(np.bincount(pred[labels == k]).max() for k in range(4)) / len(X)
    assert agree > 0.9
    p = est.predict_proba_one({"a": 0.0, "b": 4.0})
    assert sum(p.values()) == pytest.approx(1.0) and np.isfinite(est.score_one({"a": 0.0, "b": 4.0}))


def test_from_snapshot_predicts_like_the_snapshot(tmp_path):
    X, _ = make_blobs(400, seed=1)
    engine = SVI(BayesianGMM(4, 2, weight_concentration=0.5, mean_precision=0.2, scale=1.0),
                 n_total=400, effective_batch_size=20)
    state, _ = engine.fit(engine.init(X, seed=0), X, n_steps=30, batch_size=50)
    CheckpointStore(tmp_path).save(engine, state, offsets=[])
    est = GaussianMixture.from_snapshot(tmp_path, features=("a", "b"))
    fitted = load(tmp_path)
    assert [est.predict_one({"a": a, "b": b}) for a, b in X[:100]] == fitted.predict(X[:100]).tolist()
    assert est._state.step == 30
    est.learn_many(pd.DataFrame(X[:64], columns=["a", "b"]))    # and it keeps learning
    assert est._state.step == 32
    with pytest.raises(ValueError, match="features has 3 names"):
        GaussianMixture.from_snapshot(tmp_path, features=("a", "b", "c"))


# ------------------------------------------------------------ TopicModel (LDA)
def test_topic_model_river_checks_and_batching():
    import pandas as pd

    from streamsvi.estimators import TopicModel

    for params in TopicModel._unit_test_params():
        checks.check_estimator(TopicModel(**params))
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(12)]
    docs = [{w: int(rng.integers(1, 4)) for w in rng.choice(words[:6] if i % 2 else words[6:], 4,
                                                               replace=False)} for i in range(60)]
    a, b = (TopicModel(n_components=2, n_features=32, vocabulary=tuple(words), batch_size=10,
                       n_total=60, seed=3) for _ in range(2))
    for d in docs:
        a.learn_one(d)
    b.learn_many(pd.DataFrame(docs).fillna(0))
    np.testing.assert_array_equal(a.topics(), b.topics())     # same batches, same result
    out = a.transform_many(pd.DataFrame(docs[:5]).fillna(0))
    assert list(out.columns) == ["topic_0", "topic_1"] and np.allclose(out.sum(axis=1), 1.0)
    assert a.transform_one({"unknown": 3}) == {"topic_0": 0.5, "topic_1": 0.5}   # no known word
    with pytest.raises(ValueError, match="finite and > 0"):
        a.learn_one({"w1": -2})
    with pytest.raises(ValueError, match="more than n_features"):
        TopicModel(n_features=2, vocabulary=("a", "b", "c"))
