"""The two Poisson faces (issue 26, item 1): ``PoissonFactorization`` (HPF, a river ranker) and
``PoissonMixture`` (a river clusterer). river's own checks, pickling and deepcopy, learning in
any chunks, bad counts refused before anything is learned, predictions before the first update.
Their snapshots (daemon's and face's, equal to ``streamsvi.load``) are tested with the other
faces in tests/test_estimators_snapshot.py."""
import copy
import math
import pickle

import numpy as np
import pandas as pd
import pytest
from river import checks
from river.checks import common

from streamsvi.estimators import PoissonFactorization, PoissonMixture
from streamsvi.models.poisson_mixture import sample_mixture

NAMES = ("a", "b", "c", "d", "e")


def _count_stream(n, seed):
    """(record, None) pairs of a 3-component Poisson mixture in 5 named counts, as river's checks take."""
    X, _, _ = sample_mixture(n, seed=seed)
    return [(dict(zip(NAMES, r)), None) for r in X.tolist()]


def _feed(est, n, seed):
    rng = np.random.default_rng(seed)
    if isinstance(est, PoissonFactorization):
        for _ in range(n):
            u, i = int(rng.integers(12)), int(rng.integers(9))
            est.learn_one(f"u{u}", i, int(rng.poisson(3.0 if (u + i) % 2 else 0.3)))
    else:
        for x, _ in _count_stream(n, seed):
            est.learn_one(x)


def _outputs(est):
    if isinstance(est, PoissonFactorization):
        return ([est.predict_one(f"u{u}", i) for u in range(12) for i in range(9)]
                + [est.predict_sd_one("u1", 2), est.score_one("u1", 2, 3)] + est.rank("u3", range(9))
                + est.recommend("u3", k=3))
    return [est.predict_proba_one(x) for x, _ in _count_stream(30, seed=7)]


_FACES = [pytest.param(cls, params, id=f"{cls.__name__}-{i}")
          for cls in (PoissonFactorization, PoissonMixture) for i, params in enumerate(cls._unit_test_params())]


@pytest.mark.parametrize("cls,params", _FACES)
def test_river_check_estimator(cls, params):
    """river's generic suite (repr, clone, pickling round trip, ... and check_reco_routine for the ranker,
    which learns river's clicks True/False as counts 1/0)."""
    checks.check_estimator(cls(**params))


@pytest.mark.parametrize("check", [common.check_learn_one, common.check_pickling,
                                   common.check_shuffle_features_no_impact,
                                   common.check_emerging_features, common.check_disappearing_features,
                                   common.check_radically_disappearing_features,
                                   common.check_predict_one_pure,
                                   common.check_predict_one_before_any_learn,
                                   common.check_no_state_aliasing_with_input,
                                   common.check_clone_is_independent])
def test_river_dataset_checks_of_the_mixture(check):
    """river runs these only for kinds it has data sets for; we give the clusterer one of counts."""
    check(PoissonMixture(n_components=3, batch_size=16, seed=0), dataset=_count_stream(300, seed=0))


@pytest.mark.parametrize("cls,params", _FACES)
def test_pickles_and_deepcopies_after_learning(cls, params):
    """A copy of a trained face predicts the same and keeps learning the same as the original."""
    est = cls(**params)
    _feed(est, 5 * params["batch_size"] + 3, seed=0)       # a partial batch stays buffered
    assert est.state is not None
    for copied in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        assert type(copied) is cls and copied.state.step == est.state.step
        assert _outputs(copied) == _outputs(est)
        _feed(copied, 2 * params["batch_size"], seed=1)
        twin = copy.deepcopy(est)
        _feed(twin, 2 * params["batch_size"], seed=1)
        assert copied.state.step == twin.state.step > est.state.step
        assert _outputs(copied) == _outputs(twin)


def test_the_mixture_learns_the_same_in_any_chunks_and_counts_a_missing_feature_as_zero():
    data = [x for x, _ in _count_stream(300, seed=2)]
    a, b, c = (PoissonMixture(n_components=3, batch_size=25, seed=3) for _ in range(3))
    for x in data:
        a.learn_one(x)
    b.learn_many(pd.DataFrame(data))
    for k in range(0, 300, 70):
        c.learn_many(pd.DataFrame(data[k:k + 70]))
    assert a.state.lam.array_equal(b.state.lam) and a.state.lam.array_equal(c.state.lam)
    assert a.state.step == 12
    assert a.predict_proba_one({"a": 0, "b": 4, "c": 0, "d": 0, "e": 0}) == \
        a.predict_proba_one({"b": 4, "c": None, "d": float("nan")})
    frame = pd.DataFrame(data[:40])
    assert b.predict_many(frame).tolist() == [a.predict_one(x) for x in data[:40]]
    np.testing.assert_array_equal(b.score_many(frame).to_numpy(), [a.score_one(x) for x in data[:40]])


def test_the_mixture_refuses_what_is_not_a_count_before_learning_it():
    est = PoissonMixture(n_components=2, batch_size=4, features=NAMES, seed=0)
    for bad, why in (({"a": -1}, r"feature 'a' must be a count \(an integer >= 0; a missing one is 0\), got -1\.0"),
                     ({"b": 1.5}, "feature 'b' must be a count .*got 1.5"),
                     ({"c": math.inf}, "feature 'c' must be a count .*got inf"),
                     ({"d": "x"}, "feature 'd' must be a number, got 'x'")):
        with pytest.raises(ValueError, match=why):
            est.learn_one(bad)
    assert est._pending.n == 0
    with pytest.raises(ValueError, match="feature 'e' must be a count"):
        est.learn_many(pd.DataFrame([{"e": 2}, {"e": -3}]))    # checked before any is learned
    assert est._pending.n == 0 and est._learner.unlearned() == []
    assert est.predict_one({"a": 1}) == 0 and math.isnan(est.score_one({"a": 1}))          # before the start
    assert est.predict_proba_one({"a": 1}) == {0: 0.5, 1: 0.5}


def test_the_factorization_refuses_a_bad_count_and_predicts_from_the_prior_before_its_first_update():
    est = PoissonFactorization(n_factors=2, batch_size=4, seed=0)
    for bad in (-1, math.nan, math.inf, "many", None):
        with pytest.raises(ValueError, match="a count must be a"):
            est.learn_one("u", "i", bad)
    assert est._learner.unlearned() == []
    # the prior rows: E[θ_k] = a/b' = 0.3, E[β_k] = c/d' = 0.3, so the mean count is K·0.09
    assert est.predict_one("u", "i") == pytest.approx(0.18, rel=1e-15)
    m2 = 0.3 * 1.3                                             # E[θ_k²] = a(a+1)/b'²
    assert est.predict_sd_one("u", "i") == pytest.approx(math.sqrt(0.18 + 2 * (m2 * m2 - 0.09 ** 2)), rel=1e-15)
    assert est.score_one("u", "i", 2) == pytest.approx(2 * math.log(0.18) - 0.18 - math.log(2), rel=1e-15)
    assert est.recommend("u") == [] and est.rank("u", ["x", "y"]) == ["x", "y"]
    for k in range(4):
        est.learn_one("u", f"i{k}", k)                        # a count of 0 is a record too
    assert est.state.step == 1 and est.state.records_seen == 4
    assert {i for i, _ in est.recommend("u", k=10)} == set()  # the user has every item known
    with pytest.raises(ValueError, match=r"counts must be finite numbers >= 0"):
        est.score_one("u", "i0", -1)
