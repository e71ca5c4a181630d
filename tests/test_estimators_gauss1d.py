"""The 1-D Gaussian mixture face (issue 26, item 1): ``GaussianMixture1D``, a river clusterer for the
daemon's ``gauss1d`` model. river's own checks (generic, and the data-set checks on a 1-D stream),
pickling and deepcopy, learning in any chunks, the feature chosen and imputed, bad input refused,
predictions before the first update. Its snapshots (daemon's and face's, equal to ``streamsvi.load``)
are tested with the other faces in tests/test_estimators_snapshot.py."""
import copy
import math
import pickle

import numpy as np
import pandas as pd
import pytest
from river import checks
from river.checks import common

from streamsvi.estimators import GaussianMixture1D


def _values(n, seed):
    """n values of three well-separated 1-D clusters (-6, 0, 6; sd 1)."""
    rng = np.random.default_rng(seed)
    return rng.choice([-6.0, 0.0, 6.0], size=n) + rng.normal(size=n)


def _stream(n, seed):
    """(record, None) pairs with the one feature "v", as river's checks take."""
    return [({"v": float(v)}, None) for v in _values(n, seed)]


def _outputs(est):
    return [(est.predict_one(x), est.predict_proba_one(x), est.score_one(x)) for x, _ in _stream(30, seed=7)]


_PARAMS = [pytest.param(p, id=str(i)) for i, p in enumerate(GaussianMixture1D._unit_test_params())]


@pytest.mark.parametrize("params", _PARAMS)
def test_river_check_estimator(params):
    checks.check_estimator(GaussianMixture1D(**params))


@pytest.mark.parametrize("check", [common.check_learn_one, common.check_pickling,
                                   common.check_shuffle_features_no_impact,
                                   common.check_emerging_features, common.check_disappearing_features,
                                   common.check_radically_disappearing_features,
                                   common.check_predict_one_pure,
                                   common.check_predict_one_before_any_learn,
                                   common.check_no_state_aliasing_with_input,
                                   common.check_clone_is_independent])
def test_river_dataset_checks(check):
    """river runs these only for kinds it has data sets for; we give the clusterer a 1-D one."""
    check(GaussianMixture1D(n_components=3, batch_size=16, seed=0), dataset=_stream(300, seed=0))


@pytest.mark.parametrize("params", _PARAMS)
def test_pickles_and_deepcopies_after_learning(params):
    """A copy of a trained face predicts the same and keeps learning the same as the original."""
    est = GaussianMixture1D(**params)
    for x, _ in _stream(5 * params["batch_size"] + 3, seed=0):   # a partial batch stays buffered
        est.learn_one(x)
    assert est.state is not None
    for copied in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        assert copied.state.step == est.state.step
        assert _outputs(copied) == _outputs(est)
        twin = copy.deepcopy(est)
        for f in (copied, twin):
            for x, _ in _stream(2 * params["batch_size"], seed=1):
                f.learn_one(x)
        assert copied.state.step == twin.state.step > est.state.step
        assert _outputs(copied) == _outputs(twin)


def test_learns_the_same_in_any_chunks_and_finds_the_three_clusters():
    data = [x for x, _ in _stream(600, seed=2)]
    a, b, c = (GaussianMixture1D(n_components=3, batch_size=25, n_total=600.0, prior_var=25.0, seed=3)
               for _ in range(3))
    for x in data:
        a.learn_one(x)
    b.learn_many(pd.DataFrame(data))
    for k in range(0, 600, 70):
        c.learn_many(pd.DataFrame(data[k:k + 70]))
    assert a.state.lam.array_equal(b.state.lam) and a.state.lam.array_equal(c.state.lam)
    assert a.state.step == 24 and a.feature is None and a._features == ["v"]
    frame = pd.DataFrame(data[:40])
    assert b.predict_many(frame).tolist() == [a.predict_one(x) for x in data[:40]]
    np.testing.assert_array_equal(b.score_many(frame).to_numpy(), [a.score_one(x) for x in data[:40]])
    assert sum(a.predict_proba_one({"v": 6.0}).values()) == pytest.approx(1.0, abs=1e-12)
    v = np.array([x["v"] for x in data])
    for _ in range(2):                                          # three passes in all
        a.learn_many(pd.DataFrame(data))
    m, _ = a._engine.model.posterior_mean_var(a.state.lam)
    clusters = [v[np.round(v / 6) == k].mean() for k in (-1, 0, 1)]   # the values nearest -6, 0 and 6
    np.testing.assert_allclose(np.sort(m), clusters, atol=0.05)       # (5.854 against 5.867 at this seed)


def test_takes_one_feature_imputes_a_missing_value_and_refuses_a_non_number():
    est = GaussianMixture1D(n_components=2, batch_size=4, seed=0)
    assert est.predict_one({"v": 1.0}) == 0 and math.isnan(est.score_one({"v": 1.0}))   # before the start
    assert est.predict_proba_one({"v": 1.0}) == {0: 0.5, 1: 0.5}
    est.learn_one({"b": 1.0, "a": 3.0})                          # the first sorted key: "a"; "b" is ignored
    assert est._features == ["a"]
    with pytest.raises(ValueError, match="feature 'a' must be a number, got 'x'"):
        est.learn_one({"a": "x"})
    for v in (5.0, None, math.nan):                               # missing: the running mean, 4.0
        est.learn_one({"a": v})
    assert est.state.step == 1 and est.state.records_seen == 4
    assert est._moments.current()[0].tolist() == [4.0]
    assert est.predict_proba_one({}) == est.predict_proba_one({"a": 4.0})
    with pytest.raises(ValueError, match="sigma2"):
        GaussianMixture1D(sigma2=0.0)
    with pytest.raises(ValueError, match="effective_batch_size must be in"):
        GaussianMixture1D(batch_size=4, effective_batch_size=8)
